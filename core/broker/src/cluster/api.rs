//! The request handlers that go through the metadata quorum: topic creation,
//! deletion and config changes (committed, then applied by every broker), the
//! broker-to-broker apis, and the cluster's view in Metadata.

use super::image::{Command, Outcome};
use super::topic_changes;
use crate::state::BrokerState;
use crate::topics::TopicSpec;
use rill_proto::Offset;
use rill_proto::wire::*;
use std::sync::Arc;
use std::time::Duration;

/// Longest a topic change waits to be applied on the broker that asked.
pub const APPLY_WAIT_MAX: Duration = Duration::from_secs(10);

/// Waits (bounded) until this broker is registered with the quorum.
async fn ready(state: &BrokerState) -> Result<(), ErrorInfo> {
    if tokio::time::timeout(super::LEADER_WAIT_MAX, state.cluster.wait_ready())
        .await
        .is_err()
    {
        return Err(ErrorInfo::new(
            ErrorCode::ClusterNotReady,
            format!(
                "broker {} has not registered with the metadata quorum after {:?}:                  is a majority of the brokers up? (rill cluster info)",
                state.config.id,
                super::LEADER_WAIT_MAX
            ),
        ));
    }
    Ok(())
}

fn outcome_error(outcome: Outcome) -> Option<ErrorInfo> {
    match outcome {
        Outcome::Refused { code, message } => Some(ErrorInfo::new(code, message)),
        _ => None,
    }
}

/// Creates a topic through the quorum: validated against the committed image,
/// replicas spread over the live brokers, committed, then opened locally
/// (bounded wait) before this returns.
pub async fn create_topic(
    state: &Arc<BrokerState>,
    spec: TopicSpec,
    validate_only: bool,
) -> Result<(), ErrorInfo> {
    ready(state).await?;
    let id = crate::metadata::new_topic_id();
    let image = state.cluster.image();
    let (defaults, partitions_max) = (state.registry.defaults(), state.open_files.partitions_max());
    let command =
        match topic_changes::validate_create(&spec, id.clone(), &image, defaults, partitions_max) {
            // This broker's image may be behind a delete the quorum committed:
            // the quorum decides (applying a create of a topic that exists is
            // refused there, with the same error).
            Err(e) if e.code == ErrorCode::TopicAlreadyExists && !validate_only => {
                // (Should the create fail for another reason too, "already
                // exists" is the answer: tools treat it as success.)
                topic_changes::validate_create_if_deleted(
                    &spec,
                    id.clone(),
                    &image,
                    defaults,
                    partitions_max,
                )
                .map_err(|_| e)?
            }
            other => other?,
        };
    if validate_only {
        return Ok(());
    }
    if let Some(e) = outcome_error(state.cluster.propose(command).await?) {
        return Err(e);
    }
    let registry = state.registry.clone();
    let name = spec.name.clone();
    let applied = tokio::time::timeout(APPLY_WAIT_MAX, async {
        loop {
            if registry.topic(&name).is_some_and(|t| t.id == id) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    if applied.is_err() {
        tracing::warn!(topic = %spec.name, "topic committed but not yet created on this broker");
    }
    Ok(())
}

/// Adds partitions to a topic through the quorum; they are open on this
/// broker (bounded wait) when this returns.
pub async fn create_partitions(
    state: &Arc<BrokerState>,
    req: CreatePartitionsRequest,
) -> Result<(), ErrorInfo> {
    ready(state).await?;
    let command = super::topic_changes::validate_create_partitions(
        &req.topic,
        req.count,
        &state.cluster.image(),
        state.open_files.partitions_max(),
    )?;
    if req.validate_only {
        return Ok(());
    }
    if let Some(e) = outcome_error(state.cluster.propose(command).await?) {
        return Err(e);
    }
    let registry = state.registry.clone();
    let applied = tokio::time::timeout(APPLY_WAIT_MAX, async {
        while registry
            .topic(&req.topic)
            .is_none_or(|t| (t.partitions.len() as u32) < req.count)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    if applied.is_err() {
        tracing::warn!(topic = %req.topic, "partitions committed but not yet open on this broker");
    }
    Ok(())
}

/// Deletes a topic through the quorum.
///
/// Whether the topic exists is decided by the quorum's state machine (it
/// refuses to delete an unknown topic, in log order), not by this broker's
/// image: that may be behind (a broker cut off from the controller), and
/// answered a delete of a topic created meanwhile UNKNOWN_TOPIC_OR_PARTITION
/// although it existed (found by tests/net_faults.rs, issue 21).
pub async fn delete_topic(state: &Arc<BrokerState>, name: String) -> Result<(), ErrorInfo> {
    ready(state).await?;
    if let Some(e) = outcome_error(
        state
            .cluster
            .propose(Command::DeleteTopic { name: name.clone() })
            .await?,
    ) {
        return Err(e);
    }
    let registry = state.registry.clone();
    let _ = tokio::time::timeout(APPLY_WAIT_MAX, async {
        while registry.topic(&name).is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    Ok(())
}

/// Alters a topic's configs through the quorum (validated here first).
pub async fn alter_configs(
    state: &Arc<BrokerState>,
    req: AlterConfigsRequest,
) -> Result<(), ErrorInfo> {
    ready(state).await?;
    let configs = super::topic_changes::validate_alter(
        &req.topic,
        &req.set,
        &req.delete,
        &state.cluster.image(),
        state.registry.defaults(),
    )?;
    if req.validate_only {
        return Ok(());
    }
    let command = Command::SetTopicConfigs {
        name: req.topic.clone(),
        configs: configs.clone(),
    };
    if let Some(e) = outcome_error(state.cluster.propose(command).await?) {
        return Err(e);
    }
    let topic = req.topic.clone();
    let registry = state.registry.clone();
    let _ = tokio::time::timeout(APPLY_WAIT_MAX, async {
        while registry
            .topic(&topic)
            .is_some_and(|t| *t.overrides.lock() != configs)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    Ok(())
}

/// The brokers of the cluster as Metadata lists them, and the controller.
pub fn brokers(state: &BrokerState) -> (Vec<BrokerInfo>, Option<i32>) {
    let image = state.cluster.image();
    let mut brokers: Vec<BrokerInfo> = image
        .brokers
        .values()
        .map(|b| BrokerInfo {
            id: b.id,
            addr: b.addr.clone(),
            rack: None,
            alive: !b.fenced,
        })
        .collect();
    if !image.brokers.contains_key(&state.config.id) {
        brokers.push(BrokerInfo {
            id: state.config.id,
            addr: state.advertised.clone(),
            rack: None,
            alive: true,
        });
        brokers.sort_by_key(|b| b.id);
    }
    (brokers, state.cluster.controller())
}

/// KIP-101 on the leader: where the asked epoch ends in its log.
pub fn offset_for_leader_epoch(
    state: &BrokerState,
    req: OffsetForLeaderEpochRequest,
) -> Result<OffsetForLeaderEpochResponse, ErrorInfo> {
    let p = state.registry.partition(&req.topic, req.partition)?;
    if !p.is_leader() {
        return Err(p.not_leader_error());
    }
    // A negative current epoch (a Kafka client that knows none) is not fenced.
    if req.current_leader_epoch.0 >= 0 && req.current_leader_epoch != p.leader_epoch() {
        return Err(ErrorInfo::new(
            if req.current_leader_epoch < p.leader_epoch() {
                ErrorCode::FencedLeaderEpoch
            } else {
                ErrorCode::UnknownLeaderEpoch
            },
            format!(
                "partition {}-{}: epoch {} asked, leader is at {}",
                req.topic,
                req.partition,
                req.current_leader_epoch,
                p.leader_epoch()
            ),
        ));
    }
    Ok(match p.end_offset_for_epoch(req.leader_epoch)? {
        Some((epoch, end)) => OffsetForLeaderEpochResponse {
            leader_epoch: Some(epoch),
            end_offset: end,
        },
        None => OffsetForLeaderEpochResponse {
            leader_epoch: None,
            end_offset: Offset(0),
        },
    })
}

/// AlterPartition from a leader (forwarded to the quorum).
pub async fn alter_partition(
    state: &BrokerState,
    req: AlterPartitionRequest,
) -> Result<AlterPartitionResponse, ErrorInfo> {
    let command = Command::AlterIsr {
        broker_id: req.broker_id,
        topic: req.topic.clone(),
        partition: req.partition,
        leader_epoch: req.leader_epoch,
        new_isr: req.new_isr.clone(),
    };
    if let Some(e) = outcome_error(state.cluster.propose(command).await?) {
        return Err(e);
    }
    Ok(AlterPartitionResponse { isr: req.new_isr })
}

/// ElectLeaders: the preferred-leader election, by command.
pub async fn elect_leaders(
    state: &BrokerState,
    req: ElectLeadersRequest,
) -> Result<ElectLeadersResponse, ErrorInfo> {
    match state
        .cluster
        .propose(Command::ElectPreferred { topics: req.topics })
        .await?
    {
        Outcome::Moved(moved) => Ok(ElectLeadersResponse { moved }),
        Outcome::Done | Outcome::ProducerId(_) | Outcome::Count(_) => {
            Ok(ElectLeadersResponse { moved: Vec::new() })
        }
        Outcome::Refused { code, message } => Err(ErrorInfo::new(code, message)),
    }
}

/// InitProducerId: the next producer id, committed by the quorum (so no two
/// producers of the cluster ever share one, across controller changes).
pub async fn init_producer_id(state: &BrokerState) -> Result<InitProducerIdResponse, ErrorInfo> {
    ready(state).await?;
    match state.cluster.propose(Command::AllocateProducerId).await? {
        Outcome::ProducerId(producer_id) => Ok(InitProducerIdResponse {
            producer_id,
            producer_epoch: 0,
        }),
        Outcome::Refused { code, message } => Err(ErrorInfo::new(code, message)),
        other => Err(ErrorInfo::new(
            ErrorCode::InternalError,
            format!("the quorum answered a producer-id allocation with {other:?}"),
        )),
    }
}

/// Before a produce: this broker must lead the partition, and for acks=all the
/// ISR must hold at least `min.insync.replicas` members.
pub fn check_produce(
    state: &BrokerState,
    p: &crate::partition::Partition,
    acks: Acks,
) -> Result<(), ErrorInfo> {
    if !p.is_leader() {
        return Err(p.not_leader_error());
    }
    if acks == Acks::All {
        let min_isr =
            super::replication::topic_replication_settings(state, p.topic()).min_insync_replicas;
        let isr = p.isr();
        if isr.len() < min_isr {
            return Err(ErrorInfo::new(
                ErrorCode::NotEnoughReplicas,
                format!(
                    "partition {}-{}: the ISR {isr:?} has {} member(s), fewer than min.insync.replicas={min_isr}; \
                     the write was refused (bring replicas back, or use acks=1)",
                    p.topic(),
                    p.index(),
                    isr.len()
                ),
            ));
        }
    }
    Ok(())
}

/// acks=all: waits until the high watermark reaches `end` (every ISR member
/// has the batches below it), until `deadline`.
pub async fn wait_replicated(
    state: &BrokerState,
    p: &crate::partition::Partition,
    end: Offset,
    deadline: tokio::time::Instant,
) -> Result<(), ErrorInfo> {
    let started = tokio::time::Instant::now();
    loop {
        let moved = p.hw_moved();
        tokio::pin!(moved);
        moved.as_mut().enable();
        let fence = p.fence_changed();
        tokio::pin!(fence);
        fence.as_mut().enable();
        if p.high_watermark() >= end {
            return Ok(());
        }
        if !p.is_leader() {
            return Err(p.not_leader_error());
        }
        tokio::select! {
            _ = moved => {}
            _ = fence => {}
            _ = tokio::time::sleep_until(deadline) => {
                return Err(ErrorInfo::new(
                    ErrorCode::RequestTimedOut,
                    format!(
                        "partition {}-{}: records below offset {end} were written on the leader but not replicated to every \
                         in-sync replica {:?} within {:?}; it may still commit",
                        p.topic(), p.index(), p.isr(), deadline.saturating_duration_since(started)
                    ),
                ));
            }
            _ = state.shutdown.cancelled() => {
                return Err(ErrorInfo::new(ErrorCode::BrokerNotAvailable, "the broker is shutting down"));
            }
        }
    }
}

/// The outcome of an access-control command: how many rules it changed.
fn counted(outcome: Outcome) -> Result<u32, ErrorInfo> {
    match outcome {
        Outcome::Count(n) => Ok(n),
        Outcome::Done | Outcome::Moved(_) | Outcome::ProducerId(_) => Ok(0),
        Outcome::Refused { code, message } => Err(ErrorInfo::new(code, message)),
    }
}

/// Checks rules before they are proposed (the state machine checks again).
fn check_rules(rules: &[AclRule]) -> Result<(), ErrorInfo> {
    if rules.is_empty() {
        return Err(ErrorInfo::new(
            ErrorCode::InvalidRequest,
            "no ACL rules given",
        ));
    }
    if rules.len() > ACL_RULES_PER_REQUEST_MAX {
        return Err(ErrorInfo::new(
            ErrorCode::InvalidRequest,
            format!(
                "{} ACL rules in one request; at most {ACL_RULES_PER_REQUEST_MAX}",
                rules.len()
            ),
        ));
    }
    crate::cluster::image::check_acl_rules(rules)
        .map_err(|m| ErrorInfo::new(ErrorCode::InvalidRequest, m))
}

/// Most rules one CreateAcls or DeleteAcls request may carry.
pub const ACL_RULES_PER_REQUEST_MAX: usize = 1000;

/// CreateAcls: adds allow rules through the quorum.
pub async fn create_acls(
    state: &BrokerState,
    req: CreateAclsRequest,
) -> Result<CreateAclsResponse, ErrorInfo> {
    check_rules(&req.rules)?;
    ready(state).await?;
    let created = counted(
        state
            .cluster
            .propose(Command::CreateAcls { rules: req.rules })
            .await?,
    )?;
    Ok(CreateAclsResponse { created })
}

/// DeleteAcls: removes allow rules through the quorum.
pub async fn delete_acls(
    state: &BrokerState,
    req: DeleteAclsRequest,
) -> Result<DeleteAclsResponse, ErrorInfo> {
    check_rules(&req.rules)?;
    ready(state).await?;
    let deleted = counted(
        state
            .cluster
            .propose(Command::DeleteAcls { rules: req.rules })
            .await?,
    )?;
    Ok(DeleteAclsResponse { deleted })
}

/// DescribeAcls: the rules this broker's image holds (of one principal, or all).
pub fn describe_acls(state: &BrokerState, req: DescribeAclsRequest) -> DescribeAclsResponse {
    let image = state.cluster.image();
    DescribeAclsResponse {
        rules: image
            .acls
            .iter()
            .filter(|r| req.principal.as_ref().is_none_or(|p| *p == r.principal))
            .cloned()
            .collect(),
    }
}

/// AlterQuotas: sets a principal's byte-rate quotas through the quorum.
pub async fn alter_quotas(
    state: &BrokerState,
    req: AlterQuotasRequest,
) -> Result<AlterQuotasResponse, ErrorInfo> {
    ready(state).await?;
    counted(
        state
            .cluster
            .propose(Command::SetQuota {
                principal: req.principal,
                quota: req.quota,
            })
            .await?,
    )?;
    Ok(AlterQuotasResponse {})
}

/// DescribeQuotas: the quotas this broker's image holds.
pub fn describe_quotas(state: &BrokerState, req: DescribeQuotasRequest) -> DescribeQuotasResponse {
    let image = state.cluster.image();
    DescribeQuotasResponse {
        quotas: image
            .quotas
            .iter()
            .filter(|(p, _)| req.principal.as_ref().is_none_or(|want| want == *p))
            .map(|(p, q)| (p.clone(), q.clone()))
            .collect(),
    }
}

/// AlterUser: sets (or removes) a SCRAM user's credentials through the quorum.
pub async fn alter_user(
    state: &BrokerState,
    req: AlterUserRequest,
) -> Result<AlterUserResponse, ErrorInfo> {
    ready(state).await?;
    let existed = counted(
        state
            .cluster
            .propose(Command::SetUser {
                name: req.name,
                credentials: req.credentials,
            })
            .await?,
    )?;
    Ok(AlterUserResponse {
        existed: existed > 0,
    })
}

/// DescribeUsers: the SCRAM users this broker's image holds, with their
/// mechanisms and iteration counts (never a salt or a key).
pub fn describe_users(state: &BrokerState) -> DescribeUsersResponse {
    let image = state.cluster.image();
    DescribeUsersResponse {
        users: image
            .users
            .iter()
            .map(|(name, creds)| UserDescription {
                name: name.clone(),
                mechanisms: creds
                    .iter()
                    .map(|c| (c.mechanism.clone(), c.iterations))
                    .collect(),
            })
            .collect(),
    }
}
