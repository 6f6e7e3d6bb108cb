//! Request handlers of the data and admin apis: one function per api, from a
//! typed request to a typed response (the router, `crate::router`, decodes,
//! checks, authorizes and encodes around them; the group apis are in
//! `group::service`, the quorum's in `cluster::api`).
//!
//! Transport-agnostic and never panicking on input: whatever is wrong with a
//! request becomes an `ErrorInfo`, for the whole request (`Err`) or per topic /
//! partition (counted here in `rill_request_errors_total`).
//!
//! Invariants:
//! - Record batches are never re-encoded: produce copies each partition's slice
//!   once into a buffer the log stamps in place; fetch answers with file bytes.
//! - A produced batch is appended only after the leader's checks of its records
//!   (`rill_proto::validation`, Kafka's `LogValidator`: framing, counts, codec,
//!   timestamps within the topic's bounds), read in place before the copy; a
//!   refused batch fails its partition only, naming the batch and the field.
//! - Blocking work (metadata fsync, log creation, large file reads) runs on the
//!   blocking pool, never on the async workers.
//! - A fetch response holds at most `max_bytes` (capped at
//!   [`FETCH_RESPONSE_BYTES_MAX`]) of record bytes, except that the first
//!   partition with data always gets one whole batch.
//! - Every wait is bounded: fetch by `max_wait_ms` (capped at [`FETCH_WAIT_MAX`])
//!   and shutdown, produce's wait for in-flight budget by its `timeout_ms`
//!   (capped at [`PRODUCE_BUDGET_WAIT_MAX`]).

use crate::auth::{Caller, Principal, Resource};
use crate::cluster::api as cluster_api;
use crate::partition::{Partition, ReadPlan};
use crate::router::Answer;
use crate::state::BrokerState;
use crate::topic_configs::RecordSettings;
use crate::topics::TopicSpec;
use bytes::Bytes;
use rill_proto::Rope;
use rill_proto::types::now_ms;
use rill_proto::wire::AclOperation;
use rill_proto::wire::*;
use rill_proto::{BatchBuilder, Compression, Header, Offset, Record, TimestampMs};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

/// Longest a fetch may wait for data, whatever it asks.
pub const FETCH_WAIT_MAX: Duration = Duration::from_secs(60);
/// Longest a produce waits for in-flight budget before RESOURCE_EXHAUSTED.
pub const PRODUCE_BUDGET_WAIT_MAX: Duration = Duration::from_secs(30);
/// Upper bound on the record bytes of one fetch response, whatever it asks
/// (the first batch may exceed it, so a consumer always makes progress).
pub const FETCH_RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Produce payloads (per partition) larger than this are appended on the
/// blocking pool, as are appends to logs that fsync on append.
pub const APPEND_INLINE_MAX: usize = 1024 * 1024;
/// Fetch responses larger than this are read on the blocking pool.
pub const FETCH_INLINE_READ_MAX: usize = 64 * 1024;
/// Longest a topic deletion spends removing the topic's objects from the object
/// store (what is left stays as orphans no manifest names).
pub const TOPIC_REMOTE_DELETE_TIMEOUT: Duration = Duration::from_secs(30);
/// Software name sent in ApiVersions.
pub const SOFTWARE: &str = concat!("rill-broker/", env!("CARGO_PKG_VERSION"));

/// Runs blocking registry work on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ErrorInfo> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        tracing::error!(error = %e, "blocking task failed");
        ErrorInfo::new(
            ErrorCode::InternalError,
            format!("the broker failed while handling the request: {e}; see its log"),
        )
    })
}

// ---------------------------------------------------------------- api versions

pub(crate) fn api_versions(state: &BrokerState) -> ApiVersionsResponse {
    ApiVersionsResponse {
        broker_id: state.config.id,
        cluster_id: state.cluster_id.clone(),
        software: SOFTWARE.to_string(),
        apis: ApiKey::ALL
            .iter()
            .map(|k| ApiVersionRange {
                api_key: *k as u16,
                min_version: 0,
                max_version: 0,
            })
            .collect(),
        max_request_bytes: state.config.max_request_bytes,
    }
}

// ---------------------------------------------------------------- metadata

/// One partition as Metadata shows it: leadership, replicas and ISR from the
/// committed image (the only record of them), offsets from the local log when
/// this broker hosts it yet (-1 while it does not).
///
/// A broker that fenced itself (cut off from the controller, see
/// [`crate::fence`]) names no leader for the partitions its stale image says it
/// leads, with BROKER_NOT_AVAILABLE, so clients ask another broker.
fn partition_metadata(
    index: usize,
    ps: &crate::cluster::image::PartitionState,
    local: Option<&Arc<Partition>>,
    fenced: Option<&ErrorInfo>,
) -> PartitionMetadata {
    let (log_start_offset, high_watermark, log_end_offset) = match local {
        Some(p) => (p.log_start_offset(), p.high_watermark(), p.log_end_offset()),
        None => (Offset(-1), Offset(-1), Offset(-1)),
    };
    PartitionMetadata {
        partition: index as u32,
        error: fenced.cloned(),
        leader: if fenced.is_some() { None } else { ps.leader },
        leader_epoch: ps.leader_epoch,
        replicas: ps.replicas.clone(),
        isr: ps.isr.clone(),
        log_start_offset,
        high_watermark,
        log_end_offset,
    }
}

/// Metadata from the committed image: every broker answers the same topics,
/// also before it opened their logs (after a restart, while it catches up).
/// Metadata: the brokers, and the topics `caller` may describe (a topic it
/// names but may not describe is answered as TOPIC_AUTHORIZATION_FAILED).
pub(crate) fn metadata(
    state: &BrokerState,
    caller: &Caller,
    req: MetadataRequest,
) -> MetadataResponse {
    let image = state.cluster.image();
    let me = state.cluster.broker_id;
    let fence = state.registry.fence();
    let fenced = fence.is_fenced().then(|| {
        ErrorInfo::new(
            ErrorCode::BrokerNotAvailable,
            format!(
                "broker {me} has not reached the cluster's controller for {} ms: it leads \
                 nothing until it does and its metadata may be stale; ask another broker",
                fence.silent_for(std::time::Instant::now()).as_millis()
            ),
        )
    });
    let may_describe = |name: &str| {
        state.auth.allowed(
            &image,
            &caller.principal,
            Resource::Topic(AclOperation::Describe, name),
        )
    };
    let topic_metadata = |t: &crate::cluster::image::TopicState| {
        let local = state.registry.topic(&t.name).filter(|l| l.id == t.id);
        TopicMetadata {
            name: t.name.clone(),
            error: None,
            internal: t.internal,
            partitions: t
                .partitions
                .iter()
                .enumerate()
                .map(|(i, ps)| {
                    partition_metadata(
                        i,
                        ps,
                        local.as_ref().and_then(|l| l.partition(i as u32)),
                        fenced.as_ref().filter(|_| ps.leader == Some(me)),
                    )
                })
                .collect(),
        }
    };
    let topics = match req.topics {
        None => image
            .topics
            .values()
            .filter(|t| may_describe(&t.name))
            .map(topic_metadata)
            .collect(),
        Some(names) => names
            .into_iter()
            .map(|name| match image.topics.get(&name) {
                Some(_) if !may_describe(&name) => TopicMetadata {
                    error: Some(ErrorInfo::new(
                        ErrorCode::TopicAuthorizationFailed,
                        format!(
                            "{} may not describe topic {name:?} (metadata): no ACL rule allows it",
                            caller.principal
                        ),
                    )),
                    name,
                    internal: false,
                    partitions: Vec::new(),
                },
                Some(t) => topic_metadata(t),
                None => TopicMetadata {
                    error: Some(ErrorInfo::new(
                        ErrorCode::UnknownTopicOrPartition,
                        format!("topic {name:?} does not exist"),
                    )),
                    name,
                    internal: false,
                    partitions: Vec::new(),
                },
            })
            .collect(),
    };
    let (brokers, controller_id) = cluster_api::brokers(state);
    MetadataResponse {
        cluster_id: state.cluster_id.clone(),
        controller_id,
        brokers,
        topics,
    }
}

/// ListGroups: only the groups `caller` may describe.
pub(crate) fn visible_groups(
    state: &BrokerState,
    caller: &Caller,
    mut response: ListGroupsResponse,
) -> ListGroupsResponse {
    let image = state.cluster.image();
    response.groups.retain(|g| {
        state.auth.allowed(
            &image,
            &caller.principal,
            Resource::Group(AclOperation::Describe, &g.group_id),
        )
    });
    response
}

// ---------------------------------------------------------------- topics

fn topic_spec(state: &BrokerState, t: NewTopic) -> TopicSpec {
    TopicSpec {
        partitions: t.partitions.unwrap_or(state.config.num_partitions),
        replication_factor: t
            .replication_factor
            .unwrap_or(state.config.default_replication_factor),
        configs: t.configs,
        internal: transform_topic(&t.name),
        name: t.name,
    }
}

/// The internal topics the transform host (a client of the cluster, see
/// rill-transforms) creates for itself: `__transforms`, `__transform_offsets`,
/// `__transform_status`, `__transform_logs` and `__transform-<name>-state`.
/// Every other name starting with `__` stays reserved to the broker.
fn transform_topic(name: &str) -> bool {
    name.starts_with("__transform")
}

pub(crate) async fn create_topics(
    state: &Arc<BrokerState>,
    req: CreateTopicsRequest,
) -> Result<CreateTopicsResponse, ErrorInfo> {
    let specs: Vec<TopicSpec> = req
        .topics
        .into_iter()
        .map(|t| topic_spec(state, t))
        .collect();
    let mut results = Vec::with_capacity(specs.len());
    for spec in specs {
        results.push(TopicResult {
            name: spec.name.clone(),
            error: cluster_api::create_topic(state, spec, req.validate_only)
                .await
                .err(),
        });
    }
    for r in &results {
        if let Some(e) = &r.error {
            state.metrics.error(ApiKey::CreateTopics.name(), e.code);
        }
    }
    Ok(CreateTopicsResponse { results })
}

pub(crate) async fn delete_topics(
    state: &Arc<BrokerState>,
    req: DeleteTopicsRequest,
) -> Result<DeleteTopicsResponse, ErrorInfo> {
    // Topic ids, for removing the remote objects of what gets deleted.
    let ids: Vec<Option<String>> = req
        .names
        .iter()
        .map(|n| state.registry.topic(n).map(|t| t.id.clone()))
        .collect();
    let mut results = Vec::with_capacity(req.names.len());
    for name in req.names {
        results.push(TopicResult {
            error: cluster_api::delete_topic(state, name.clone()).await.err(),
            name,
        });
    }
    for (r, id) in results.iter().zip(ids) {
        if let Some(e) = &r.error {
            state.metrics.error(ApiKey::DeleteTopics.name(), e.code);
        } else if let (Some(tier), Some(id)) = (&state.tier, id) {
            let removal =
                crate::tier::upload::delete_topic_objects(tier.clone(), r.name.clone(), id);
            if tokio::time::timeout(TOPIC_REMOTE_DELETE_TIMEOUT, removal)
                .await
                .is_err()
            {
                tracing::warn!(topic = %r.name, "removing the remote objects of a deleted topic took too long; the rest stay as orphans");
            }
        }
    }
    Ok(DeleteTopicsResponse { results })
}

// ---------------------------------------------------------------- configs

pub(crate) fn describe_configs(
    state: &BrokerState,
    req: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    DescribeConfigsResponse {
        topics: req
            .topics
            .into_iter()
            .map(|name| match state.registry.describe_configs(&name) {
                Ok(configs) => TopicConfigs {
                    name,
                    error: None,
                    configs,
                },
                Err(e) => {
                    state.metrics.error(ApiKey::DescribeConfigs.name(), e.code);
                    TopicConfigs {
                        name,
                        error: Some(e),
                        configs: Vec::new(),
                    }
                }
            })
            .collect(),
    }
}

pub(crate) async fn alter_configs(
    state: &Arc<BrokerState>,
    req: AlterConfigsRequest,
) -> Result<AlterConfigsResponse, ErrorInfo> {
    let error = cluster_api::alter_configs(state, req).await.err();
    if let Some(e) = &error {
        state.metrics.error(ApiKey::AlterConfigs.name(), e.code);
    }
    Ok(AlterConfigsResponse { error })
}

pub(crate) async fn create_partitions(
    state: &Arc<BrokerState>,
    req: CreatePartitionsRequest,
) -> Result<CreatePartitionsResponse, ErrorInfo> {
    let error = cluster_api::create_partitions(state, req).await.err();
    if let Some(e) = &error {
        state.metrics.error(ApiKey::CreatePartitions.name(), e.code);
    }
    Ok(CreatePartitionsResponse { error })
}

/// DescribeProducers: each partition's idempotent producers, from its
/// leader's log.
pub(crate) fn describe_producers(
    state: &BrokerState,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let mut partitions = Vec::new();
    for tp in req.partitions {
        for index in tp.partitions {
            let found = state.registry.partition(&tp.topic, index).and_then(|p| {
                if p.is_leader() {
                    p.producers()
                } else {
                    Err(p.not_leader_error())
                }
            });
            let (error, producers) = match found {
                Ok(list) => (
                    None,
                    list.into_iter()
                        .map(|p| ProducerDescription {
                            producer_id: p.producer_id,
                            epoch: p.epoch,
                            last_sequence: p.last_sequence,
                            last_timestamp: p.last_timestamp,
                        })
                        .collect(),
                ),
                Err(e) => (Some(e), Vec::new()),
            };
            partitions.push(PartitionProducers {
                topic: tp.topic.clone(),
                partition: index,
                error,
                producers,
            });
        }
    }
    DescribeProducersResponse { partitions }
}

// ---------------------------------------------------------------- produce

/// Finds the partition, creating the topic first when auto-creation is on.
async fn produce_partition(
    state: &Arc<BrokerState>,
    topic: &str,
    partition: u32,
) -> Result<Arc<Partition>, ErrorInfo> {
    match state.registry.partition(topic, partition) {
        Ok(p) => Ok(p),
        Err(e) if state.config.auto_create_topics && state.registry.topic(topic).is_none() => {
            let spec = TopicSpec {
                name: topic.to_string(),
                partitions: state.config.num_partitions,
                replication_factor: state.config.default_replication_factor,
                configs: Vec::new(),
                internal: false,
            };
            let created = cluster_api::create_topic(state, spec, false).await;
            match created {
                Ok(()) => tracing::info!(topic, "auto-created topic on produce"),
                Err(c) if c.code == ErrorCode::TopicAlreadyExists => {}
                Err(c) if c.code == ErrorCode::InvalidTopic => return Err(c),
                Err(_) => return Err(e),
            }
            state.registry.partition(topic, partition)
        }
        Err(e) => Err(e),
    }
}

/// The leader's checks of one partition's batches before they are appended
/// (framing, counts, codec, timestamps), on the bytes as received.
fn validate_records(
    p: &Partition,
    bytes: &Rope,
    records: RecordSettings,
    now: TimestampMs,
) -> Result<(), ErrorInfo> {
    use rill_proto::validation::{BatchFault, validate_produced};
    validate_produced(bytes, Some(records.timestamp_bounds()), now).map_err(|e| {
        let code = match e.fault {
            BatchFault::Corrupt(_) => ErrorCode::CorruptRecord,
            BatchFault::Invalid(_) | BatchFault::MaxTimestampUnderstated { .. } => {
                ErrorCode::InvalidRecord
            }
            BatchFault::Timestamp { .. } => ErrorCode::InvalidTimestamp,
        };
        ErrorInfo::new(
            code,
            format!(
                "batch at position {} of topic '{}' partition {}: {}; nothing of this \
                 partition's batches was written",
                e.position,
                p.topic(),
                p.index(),
                e.fault
            ),
        )
    })
}

/// Appends one partition's batches: the leader's checks, then the append from
/// the buffers the request arrived in (the log stamps offsets and the leader
/// epoch into the headers as it writes them).
fn append(
    state: &BrokerState,
    p: &Partition,
    batches: Rope,
    records: RecordSettings,
    now: TimestampMs,
) -> Result<(rill_log::AppendInfo, Offset), ErrorInfo> {
    check_append(state, p, &batches, records, now)?;
    p.append(&batches, now)
        .map(|info| (info, p.log_start_offset()))
}

/// The checks of a produce before its append: the records against the
/// topic's settings, and room on the data disk.
fn check_append(
    state: &BrokerState,
    p: &Partition,
    batches: &Rope,
    records: RecordSettings,
    now: TimestampMs,
) -> Result<(), ErrorInfo> {
    validate_records(p, batches, records, now)?;
    if !crate::auth::is_internal_topic(p.topic()) {
        state
            .disk
            .check_append(&format!("{}-{}", p.topic(), p.index()), batches.len())?;
    }
    Ok(())
}

/// A small produce's append: on this task when it cannot wait (the log's
/// mutex free, no fsync: see [`Partition::try_append`]), else on the
/// blocking pool, so that neither a roll's fsync nor a compaction holding
/// the log stalls the thread serving other connections.
async fn append_small(
    state: &Arc<BrokerState>,
    p: Arc<Partition>,
    batches: Rope,
    records: RecordSettings,
    now: TimestampMs,
) -> Result<(rill_log::AppendInfo, Offset), ErrorInfo> {
    check_append(state, &p, &batches, records, now)?;
    let info = p.append_from_task(batches, now).await?;
    Ok((info, p.log_start_offset()))
}

/// The topic's record checks (the defaults while it is not open here).
fn record_settings(state: &BrokerState, topic: &str) -> RecordSettings {
    state
        .registry
        .topic(topic)
        .map(|t| *t.records.lock())
        .unwrap_or_default()
}

pub(crate) async fn produce(
    state: &Arc<BrokerState>,
    req: ProduceRequest,
    payload: Rope,
) -> Result<Answer<ProduceResponse>, ErrorInfo> {
    // Each partition's bytes as slices of the buffers they arrived in (no copy).
    let parts = payload
        .split(req.partitions.iter().map(|p| p.bytes_len))
        .map_err(|e| {
            ErrorInfo::new(
                ErrorCode::InvalidRequest,
                format!(
                    "malformed ProduceRequest: partition byte lengths do not match the payload: {e}"
                ),
            )
        })?;
    let payload_len = payload.len();
    drop(payload);

    // Bound the bytes being appended at once, broker-wide.
    let wanted = payload_len.min(state.produce_budget_permits as usize) as u32;
    let _budget = if wanted > 0 {
        let wait = Duration::from_millis(req.timeout_ms as u64).min(PRODUCE_BUDGET_WAIT_MAX);
        match tokio::time::timeout(
            wait,
            state.produce_budget.clone().acquire_many_owned(wanted),
        )
        .await
        {
            Ok(Ok(permit)) => Some(permit),
            Ok(Err(_)) | Err(_) => {
                return Err(ErrorInfo::new(
                    ErrorCode::ResourceExhausted,
                    format!(
                        "the broker is appending {} bytes of produce requests already \
                         (max_inflight_produce_bytes); this request waited {wait:?}; retry later",
                        state.config.max_inflight_produce_bytes
                    ),
                ));
            }
        }
    } else {
        None
    };

    let now = now_ms();
    let mut responses = Vec::with_capacity(req.partitions.len());
    let mut bytes_in = 0u64;
    let mut to_replicate = Vec::new();
    for (pp, bytes) in req.partitions.into_iter().zip(parts) {
        let len = bytes.len();
        let found = produce_partition(state, &pp.topic, pp.partition)
            .await
            .and_then(|p| cluster_api::check_produce(state, &p, req.acks).map(|()| p));
        let leader = found
            .as_ref()
            .ok()
            .filter(|_| req.acks == Acks::All)
            .cloned();
        let result = match found {
            Err(e) => Err(e),
            Ok(_) if len == 0 => Err(ErrorInfo::new(
                ErrorCode::CorruptRecord,
                format!(
                    "partition {}-{}: the produce request carries no record batch for it",
                    pp.topic, pp.partition
                ),
            )),
            Ok(p) if p.syncs_on_append() || len > APPEND_INLINE_MAX => {
                let records = record_settings(state, &pp.topic);
                let st = state.clone();
                blocking(move || append(&st, &p, bytes, records, now))
                    .await
                    .and_then(|r| r)
            }
            Ok(p) => append_small(state, p, bytes, record_settings(state, &pp.topic), now).await,
        };
        let mut replicate_to = None;
        responses.push(match result {
            Ok((info, log_start_offset)) => {
                bytes_in += len as u64;
                replicate_to = Some(Offset(info.last_offset.0 + 1));
                ProducePartitionResponse {
                    topic: pp.topic,
                    partition: pp.partition,
                    error: None,
                    base_offset: info.first_offset,
                    log_start_offset,
                    log_append_time_ms: None,
                }
            }
            Err(e) => {
                state.metrics.error(ApiKey::Produce.name(), e.code);
                ProducePartitionResponse {
                    topic: pp.topic,
                    partition: pp.partition,
                    error: Some(e),
                    base_offset: Offset(-1),
                    log_start_offset: Offset(-1),
                    log_append_time_ms: None,
                }
            }
        });
        if let (Some(p), Some(end)) = (leader, replicate_to) {
            to_replicate.push((responses.len() - 1, p, end));
        }
    }
    state.metrics.add_bytes_in(bytes_in);
    // acks=all: answer once every ISR member has the batches (the high watermark
    // passed them), or REQUEST_TIMED_OUT. The partitions are waited on together,
    // under one deadline for the whole request.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(req.timeout_ms as u64);
    let waits = to_replicate
        .iter()
        .map(|(_, p, end)| cluster_api::wait_replicated(state, p, *end, deadline));
    let outcomes = futures::future::join_all(waits).await;
    for ((i, _, _), outcome) in to_replicate.iter().zip(outcomes) {
        if let Err(e) = outcome {
            state.metrics.error(ApiKey::Produce.name(), e.code);
            responses[*i].error = Some(e);
        }
    }
    if req.acks == Acks::None {
        return Ok(Answer::Nothing);
    }
    Ok(Answer::Response(ProduceResponse {
        partitions: responses,
    }))
}

// ---------------------------------------------------------------- fetch

/// What one fetch pass found for one requested partition.
struct FetchPlan {
    error: Option<ErrorInfo>,
    high_watermark: Offset,
    last_stable_offset: Offset,
    log_start_offset: Offset,
    read: Option<ReadPlan>,
}

fn check_epoch(p: &Partition, fp: &FetchPartition) -> Result<(), ErrorInfo> {
    let Some(asked) = fp.current_leader_epoch else {
        return Ok(());
    };
    let ours = p.leader_epoch();
    if asked < ours {
        Err(ErrorInfo::new(
            ErrorCode::FencedLeaderEpoch,
            format!(
                "partition {}-{}: leader epoch {asked} is older than the current {ours}: refresh metadata",
                fp.topic, fp.partition
            ),
        ))
    } else if asked > ours {
        Err(ErrorInfo::new(
            ErrorCode::UnknownLeaderEpoch,
            format!(
                "partition {}-{}: leader epoch {asked} is newer than this broker's {ours}: retry shortly",
                fp.topic, fp.partition
            ),
        ))
    } else {
        Ok(())
    }
}

/// One pass over the requested partitions: finds what could be returned now,
/// within the per-partition and per-response byte bounds.
/// One look at every requested partition: what each has to read, and the
/// bytes in all. With `wait` false, `None` as soon as a partition's log has
/// a long holder (a roll's fsync, retention, a compaction's swap): the
/// caller then looks again on the blocking pool, not on the thread that
/// serves other connections.
fn fetch_pass(
    req: &FetchRequest,
    partitions: &[Result<Arc<Partition>, ErrorInfo>],
    wait: bool,
) -> Option<(Vec<FetchPlan>, usize)> {
    let mut remaining = (req.max_bytes as usize).min(FETCH_RESPONSE_BYTES_MAX);
    let mut first = true;
    let mut total = 0usize;
    let mut plans = Vec::with_capacity(partitions.len());
    for (fp, p) in req.partitions.iter().zip(partitions) {
        let p = match p {
            Ok(p) => p,
            Err(e) => {
                plans.push(FetchPlan {
                    error: Some(e.clone()),
                    last_stable_offset: Offset(-1),
                    high_watermark: Offset(-1),
                    log_start_offset: Offset(-1),
                    read: None,
                });
                continue;
            }
        };
        // A follower's fetch offset is its log end; it counts towards the high
        // watermark only from a follower at this leader's epoch (so truncated
        // to its boundary) whose offset lies within this log (as Kafka updates
        // follower state only after a successful read).
        if let Some(follower) = req.replica_id
            && p.is_leader()
            && check_epoch(p, fp).is_ok()
            && fp.offset <= p.log_end_offset()
        {
            p.record_follower_fetch(follower, fp.offset, std::time::Instant::now());
        }
        let mut plan = FetchPlan {
            error: None,
            last_stable_offset: p.last_stable_offset(),
            high_watermark: p.high_watermark(),
            log_start_offset: p.log_start_offset(),
            read: None,
        };
        if !p.is_leader() {
            plan.error = Some(p.not_leader_error());
        } else if let Err(e) = check_epoch(p, fp) {
            plan.error = Some(e);
        } else if first || remaining > 0 {
            let max = (fp.max_bytes as usize).min(remaining);
            // A follower reads up to the log end, a consumer below the high watermark.
            let read = match req.replica_id {
                Some(_) => p
                    .read_up_to_if(wait, fp.offset, max, p.log_end_offset())?
                    .map(|s| s.map(ReadPlan::Local)),
                None => p.read_if(
                    wait,
                    fp.offset,
                    max,
                    req.isolation == Isolation::ReadCommitted,
                )?,
            };
            match read {
                Ok(Some(read)) => {
                    // A remote read is not measured yet: it reserves its whole share.
                    let len = match &read {
                        ReadPlan::Local(slice) => slice.len as usize,
                        ReadPlan::Remote { max_bytes, .. } => *max_bytes,
                    };
                    // Only the first partition with data may exceed the bounds
                    // (by one batch), so a consumer always makes progress.
                    if first || len <= remaining {
                        first = false;
                        remaining = remaining.saturating_sub(len);
                        total += len;
                        plan.read = Some(read);
                    }
                }
                Ok(None) => {}
                Err(e) => plan.error = Some(e),
            }
        }
        plans.push(plan);
    }
    Some((plans, total))
}

/// Completes when any of `waits` does.
async fn any_notified(waits: &mut [Pin<Box<tokio::sync::futures::Notified<'_>>>]) {
    std::future::poll_fn(|cx| {
        for w in waits.iter_mut() {
            if w.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    })
    .await
}

pub(crate) async fn fetch(
    state: &Arc<BrokerState>,
    req: FetchRequest,
) -> Result<Answer<FetchResponse>, ErrorInfo> {
    let partitions: Vec<Result<Arc<Partition>, ErrorInfo>> = req
        .partitions
        .iter()
        .map(|fp| state.registry.partition(&fp.topic, fp.partition))
        .collect();
    let wait = Duration::from_millis(req.max_wait_ms as u64).min(FETCH_WAIT_MAX);
    let deadline = tokio::time::Instant::now() + wait;
    let plans = loop {
        // Register for wake-ups before looking, so no append is missed between.
        let mut waits: Vec<_> = partitions
            .iter()
            .flatten()
            .map(|p| Box::pin(p.data_arrived()))
            .collect();
        for w in &mut waits {
            w.as_mut().enable();
        }
        let (plans, total) = match fetch_pass(&req, &partitions, false) {
            Some(found) => found,
            None => {
                let (req, partitions) = (req.clone(), partitions.clone());
                blocking(move || fetch_pass(&req, &partitions, true))
                    .await?
                    .expect("a pass that waits for the logs completes")
            }
        };
        let has_error = plans.iter().any(|p| p.error.is_some());
        if has_error
            || total >= req.min_bytes as usize
            || tokio::time::Instant::now() >= deadline
            || state.shutdown.is_cancelled()
            || waits.is_empty()
        {
            break plans;
        }
        tokio::select! {
            _ = any_notified(&mut waits) => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = state.shutdown.cancelled() => {}
        }
    };

    let datas = read_plans(state, &req, &plans).await?;

    let mut out = Vec::with_capacity(plans.len());
    let mut payload = Vec::with_capacity(plans.len());
    let mut bytes_out = 0u64;
    let committed_only = req.isolation == Isolation::ReadCommitted;
    for (((fp, plan), data), p) in req
        .partitions
        .into_iter()
        .zip(plans)
        .zip(datas)
        .zip(&partitions)
    {
        let mut error = plan.error;
        let mut bytes_len = 0u32;
        let mut aborted = Vec::new();
        match data {
            Some(Ok(bytes)) => {
                if committed_only && let Ok(p) = p {
                    // The aborted transactions overlapping what is returned.
                    let to = rill_proto::batch::rope_batches(&bytes)
                        .filter_map(Result::ok)
                        .last()
                        .map_or(fp.offset, |(_, h)| h.next_offset());
                    // Off this task while a long holder has the log.
                    let from = fp.offset;
                    let found = match p.aborted_transactions_if(false, from, to) {
                        Some(found) => found,
                        None => {
                            let p = p.clone();
                            blocking(move || p.aborted_transactions_if(true, from, to))
                                .await?
                                .unwrap_or_default()
                        }
                    };
                    aborted = found
                        .into_iter()
                        .map(|a| AbortedRange {
                            producer_id: a.producer_id,
                            first_offset: a.first_offset,
                            last_offset: a.last_offset,
                        })
                        .collect();
                }
                bytes_len = bytes.len() as u32;
                bytes_out += bytes.len() as u64;
                payload.extend(bytes.pieces().iter().cloned());
            }
            Some(Err(e)) => error = Some(e),
            None => {}
        }
        if let Some(e) = &error {
            state.metrics.error(ApiKey::Fetch.name(), e.code);
        }
        out.push(FetchPartitionResponse {
            topic: fp.topic,
            partition: fp.partition,
            error,
            high_watermark: plan.high_watermark,
            last_stable_offset: plan.last_stable_offset,
            log_start_offset: plan.log_start_offset,
            aborted,
            bytes_len,
        });
    }
    state
        .metrics
        .add_bytes_out(bytes_out, req.replica_id.is_some());
    Ok(Answer::WithPayload(
        FetchResponse { partitions: out },
        payload,
    ))
}

/// Reads what the plans found: local file bytes outside every lock (large reads
/// on the blocking pool), remote segments concurrently, each within the object
/// store's own wait limit (`object_store.fetch_timeout_ms`).
async fn read_plans(
    state: &Arc<BrokerState>,
    req: &FetchRequest,
    plans: &[FetchPlan],
) -> Result<Vec<Option<Result<Rope, ErrorInfo>>>, ErrorInfo> {
    // Bytes read from files (what the tail cache holds is not read).
    let local_total: usize = plans
        .iter()
        .filter_map(|p| match &p.read {
            Some(ReadPlan::Local(s)) => Some(s.uncached_len() as usize),
            _ => None,
        })
        .sum();
    let slices: Vec<Option<rill_log::FileSlice>> = plans
        .iter()
        .map(|p| match &p.read {
            Some(ReadPlan::Local(s)) => Some(s.clone()),
            _ => None,
        })
        .collect();
    let read_all = move || -> Vec<Option<std::io::Result<Rope>>> {
        slices
            .iter()
            .map(|s| s.as_ref().map(|s| s.read_rope()))
            .collect()
    };
    let locals = if local_total > FETCH_INLINE_READ_MAX {
        blocking(read_all).await?
    } else {
        read_all()
    };
    let remote_reads = plans.iter().zip(&req.partitions).map(|(plan, fp)| async move {
        let Some(ReadPlan::Remote {
            remote,
            segment,
            offset,
            max_bytes,
        }) = &plan.read
        else {
            return None;
        };
        let tp = format!("{}-{}", fp.topic, fp.partition);
        let Some(tier) = &state.tier else {
            return Some(Err(ErrorInfo::new(
                ErrorCode::RemoteStorageUnavailable,
                format!("partition {tp}: offset {offset} is in the object store but this broker has none configured"),
            )));
        };
        let limit = Duration::from_millis(tier.config.fetch_timeout_ms);
        let read = tier.read_segment(&remote.prefix, segment, *offset, *max_bytes);
        Some(match tokio::time::timeout(limit, read).await {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(e)) => {
                tracing::warn!(partition = %tp, %offset, error = %e, "remote read failed");
                Err(ErrorInfo::new(
                    ErrorCode::RemoteStorageUnavailable,
                    format!("partition {tp}: could not read offset {offset} from the object store {}: {e}; retry later", tier.url),
                ))
            }
            Err(_) => {
                tier.metrics.error("download_timeout");
                tracing::warn!(partition = %tp, %offset, ?limit, "remote read timed out");
                Err(ErrorInfo::new(
                    ErrorCode::RemoteStorageUnavailable,
                    format!(
                        "partition {tp}: the object store {} did not answer within {} ms reading offset {offset}; retry later",
                        tier.url,
                        limit.as_millis()
                    ),
                ))
            }
        })
    });
    let remotes = futures::future::join_all(remote_reads).await;
    Ok(locals
        .into_iter()
        .zip(remotes)
        .zip(&req.partitions)
        .map(|((local, remote), fp)| match (local, remote) {
            (Some(Ok(bytes)), _) => Some(Ok(bytes)),
            (Some(Err(e)), _) => {
                tracing::error!(partition = %format!("{}-{}", fp.topic, fp.partition), error = %e, "could not read the log");
                Some(Err(ErrorInfo::new(
                    ErrorCode::StorageError,
                    format!(
                        "partition {}-{}: could not read the log at offset {}: {e}",
                        fp.topic, fp.partition, fp.offset
                    ),
                )))
            }
            (None, Some(Ok(bytes))) if bytes.is_empty() => None,
            (None, remote) => remote.map(|r| r.map(Rope::from)),
        })
        .collect())
}

// ---------------------------------------------------------------- describe storage

/// A DescribeStorage row that holds only an error.
fn storage_error(topic: &str, partition: u32, error: ErrorInfo) -> PartitionStorage {
    PartitionStorage {
        topic: topic.to_string(),
        partition,
        error: Some(error),
        log_start_offset: Offset(-1),
        local_log_start_offset: Offset(-1),
        log_end_offset: Offset(-1),
        local_size_bytes: 0,
        remote_size_bytes: 0,
        remote_segments: 0,
        remote_end_offset: Offset(-1),
        remote_storage_enable: false,
    }
}

pub(crate) fn describe_storage(
    state: &BrokerState,
    req: DescribeStorageRequest,
) -> DescribeStorageResponse {
    let mut partitions = Vec::new();
    for name in req.topics {
        let Some(topic) = state.registry.topic(&name) else {
            partitions.push(storage_error(
                &name,
                0,
                ErrorInfo::new(
                    ErrorCode::UnknownTopicOrPartition,
                    format!("topic {name:?} does not exist"),
                ),
            ));
            continue;
        };
        for (index, p) in topic.partitions.iter().enumerate() {
            let Some(p) = p else {
                partitions.push(storage_error(
                    &name,
                    index as u32,
                    ErrorInfo::new(
                        ErrorCode::NotLeaderOrFollower,
                        format!(
                            "broker {} holds no replica of {name}-{index}: ask one of its replicas",
                            state.config.id
                        ),
                    ),
                ));
                continue;
            };
            let remote = p.remote();
            let manifest = remote.as_ref().map(|r| &r.manifest);
            let config = p.log_config();
            let (local_size_bytes, error) = match p.local_size_bytes() {
                Ok(n) => (n, None),
                Err(e) => (0, Some(e)),
            };
            partitions.push(PartitionStorage {
                topic: name.clone(),
                partition: p.index(),
                error,
                log_start_offset: p.log_start_offset(),
                local_log_start_offset: p.local_log_start_offset(),
                log_end_offset: p.log_end_offset(),
                local_size_bytes,
                remote_size_bytes: manifest.map_or(0, |m| m.size_bytes()),
                remote_segments: manifest.map_or(0, |m| m.segments.len() as u32),
                remote_end_offset: manifest
                    .and_then(|m| m.end_offset())
                    .unwrap_or(p.log_start_offset()),
                remote_storage_enable: config.is_ok_and(|c| c.remote_storage_enable),
            });
        }
    }
    DescribeStorageResponse {
        object_store: state.tier.as_ref().map(|t| t.url.clone()),
        partitions,
    }
}

// ---------------------------------------------------------------- list offsets

pub(crate) async fn list_offsets(
    state: &BrokerState,
    req: ListOffsetsRequest,
) -> ListOffsetsResponse {
    let mut partitions = Vec::with_capacity(req.partitions.len());
    for lp in req.partitions {
        let found = match state.registry.partition(&lp.topic, lp.partition) {
            Err(e) => Err(e),
            // As in Kafka, offsets come from the leader only (a follower's and
            // a fenced ex-leader's are behind).
            Ok(p) if !p.is_leader() => Err(p.not_leader_error()),
            Ok(p) => match lp.spec {
                OffsetSpec::Earliest => p
                    .check_remote_known()
                    .map(|()| (p.log_start_offset(), None)),
                OffsetSpec::Latest => p
                    .check_high_watermark_known()
                    .map(|()| (p.high_watermark(), None)),
                OffsetSpec::LastStable => p
                    .check_high_watermark_known()
                    .map(|()| (p.last_stable_offset(), None)),
                OffsetSpec::Timestamp(ts) => offset_for_timestamp(state, &p, ts).await,
            },
        };
        partitions.push(match found {
            Ok((offset, timestamp_ms)) => ListOffsetsPartitionResponse {
                topic: lp.topic,
                partition: lp.partition,
                error: None,
                offset,
                timestamp_ms,
            },
            Err(e) => {
                state.metrics.error(ApiKey::ListOffsets.name(), e.code);
                ListOffsetsPartitionResponse {
                    topic: lp.topic,
                    partition: lp.partition,
                    error: Some(e),
                    offset: Offset(-1),
                    timestamp_ms: None,
                }
            }
        });
    }
    ListOffsetsResponse { partitions }
}

/// The first offset whose record timestamp is at or after `ts`: in the remote
/// segments below the local log start first (tiered topics), then locally; the
/// log end offset when no record is that new.
async fn offset_for_timestamp(
    state: &BrokerState,
    p: &Arc<Partition>,
    ts: TimestampMs,
) -> Result<(Offset, Option<TimestampMs>), ErrorInfo> {
    if let (Some(tier), Some(remote)) = (&state.tier, p.remote()) {
        let tp = format!("{}-{}", p.topic(), p.index());
        let limit = Duration::from_millis(tier.config.fetch_timeout_ms);
        let below = p.local_log_start_offset();
        match tokio::time::timeout(limit, tier.offset_for_timestamp(&remote, below, ts)).await {
            Ok(Ok(Some((offset, ts)))) => return Ok((offset, Some(ts))),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                tracing::warn!(partition = %tp, error = %e, "remote timestamp lookup failed");
                return Err(ErrorInfo::new(
                    ErrorCode::RemoteStorageUnavailable,
                    format!(
                        "partition {tp}: could not look up timestamp {ts} in the object store {}: {e}; retry later",
                        tier.url
                    ),
                ));
            }
            Err(_) => {
                return Err(ErrorInfo::new(
                    ErrorCode::RemoteStorageUnavailable,
                    format!(
                        "partition {tp}: looking up timestamp {ts} in the object store {} took longer than {limit:?}; retry later",
                        tier.url
                    ),
                ));
            }
        }
    }
    // On the blocking pool: it reads the time index and the segment, under
    // the partition's log, which maintenance may hold for long.
    let p2 = p.clone();
    let found = blocking(move || p2.offset_for_timestamp(ts)).await??;
    Ok(match found {
        Some((offset, ts)) => (offset, Some(ts)),
        None => (p.log_end_offset(), None),
    })
}

// ---------------------------------------------------------------- transforms

/// The topic of transform deployments (rill-transforms' `TRANSFORMS_TOPIC`).
const TRANSFORMS_TOPIC: &str = "__transforms";
/// How long a deployment write waits for its replicas
/// (below the client's request timeout, so the caller gets REQUEST_TIMED_OUT).
const TRANSFORM_WRITE_TIMEOUT_MS: u32 = 20_000;

/// Writes one deployment record (or tombstone) of `__transforms`-0 for a
/// caller the router found allowed to deploy what it names, stamped with the
/// principal the deployment runs as. Through the produce path (acks=all), so
/// a broker that does not lead the partition answers NOT_LEADER_OR_FOLLOWER.
pub(crate) async fn transform_write(
    state: &Arc<BrokerState>,
    caller: &Caller,
    req: TransformWriteRequest,
) -> Result<TransformWriteResponse, ErrorInfo> {
    if req.name.is_empty() {
        return Err(ErrorInfo::new(
            ErrorCode::InvalidRequest,
            "TransformWrite names no transform",
        ));
    }
    let principal = match (&caller.principal, req.owner.clone()) {
        (p, None) => p.stamp(),
        (Principal::Broker(_), Some(owner)) => {
            if Principal::parse_stamp(&owner).is_none() {
                return Err(ErrorInfo::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "TransformWrite owner {owner:?} is not a principal \
                         (User:NAME, Anonymous or Broker:ID)"
                    ),
                ));
            }
            owner
        }
        (p, Some(owner)) if owner == p.stamp() => owner,
        (p, Some(owner)) => {
            return Err(ErrorInfo::new(
                ErrorCode::ClusterAuthorizationFailed,
                format!(
                    "{p} may not write transform {:?} to run as {owner}: only brokers write \
                     a deployment on behalf of another principal",
                    req.name
                ),
            ));
        }
    };
    if let Some(value) = &req.value {
        check_deployment_record(&req, value)?;
    }
    if state.registry.topic(TRANSFORMS_TOPIC).is_none() {
        return Err(ErrorInfo::new(
            ErrorCode::UnknownTopicOrPartition,
            format!(
                "{TRANSFORMS_TOPIC} does not exist yet: a broker's transform host creates it \
                 at start (and `rill transform deploy` before it writes)"
            ),
        ));
    }
    let deleted = req.value.is_none();
    let mut batch = BatchBuilder::new(Compression::None);
    batch.push(&Record {
        key: Some(Bytes::from(req.name.clone().into_bytes())),
        value: req.value.map(Bytes::from),
        headers: vec![Header {
            key: DEPLOYER_HEADER.to_string(),
            value: Bytes::from(principal.clone().into_bytes()),
        }],
        timestamp_ms: now_ms(),
    });
    let payload = batch.build();
    let request = ProduceRequest {
        acks: Acks::All,
        timeout_ms: TRANSFORM_WRITE_TIMEOUT_MS,
        partitions: vec![ProducePartition {
            topic: TRANSFORMS_TOPIC.to_string(),
            partition: 0,
            bytes_len: payload.len() as u32,
        }],
    };
    let response = match produce(state, request, Rope::from(payload)).await? {
        Answer::Response(r) | Answer::WithPayload(r, _) => r,
        Answer::Nothing => unreachable!("acks=all always answers"),
    };
    let written = response.partitions.into_iter().next().ok_or_else(|| {
        ErrorInfo::new(
            ErrorCode::InternalError,
            format!("the append to {TRANSFORMS_TOPIC}-0 gave no result"),
        )
    })?;
    if let Some(e) = written.error {
        return Err(e);
    }
    tracing::info!(
        transform = %req.name,
        deleted,
        runs_as = %principal,
        by = %caller.principal,
        "transform deployment written"
    );
    Ok(TransformWriteResponse {
        offset: written.base_offset.0,
        principal,
    })
}

/// A deployment record must be what the request says it is: the router
/// checked the caller's rights on the request's name, inputs and outputs, so
/// the record may not name others.
fn check_deployment_record(req: &TransformWriteRequest, value: &[u8]) -> Result<(), ErrorInfo> {
    let invalid = |why: String| {
        Err(ErrorInfo::new(
            ErrorCode::InvalidRequest,
            format!("TransformWrite of {:?} refused: {why}", req.name),
        ))
    };
    let head = match DeploymentHead::decode(value) {
        Ok(h) => h,
        Err(e) => return invalid(e),
    };
    if head.name != req.name {
        return invalid(format!("the record is the deployment of {:?}", head.name));
    }
    let sorted = |v: &[String]| {
        let mut v = v.to_vec();
        v.sort();
        v.dedup();
        v
    };
    if sorted(&head.inputs) != sorted(&req.inputs) {
        return invalid(format!(
            "the record reads {:?}, the request says {:?}",
            head.inputs, req.inputs
        ));
    }
    let written = head.written_topics();
    if sorted(&written) != sorted(&req.outputs) {
        return invalid(format!(
            "the record writes {written:?} (outputs and dead-letter topic), the request says {:?}",
            req.outputs
        ));
    }
    Ok(())
}

/// Whether a principal (a deployment's) may do each of the checks: the same
/// rules as for its own requests, asked by a broker's transform runner.
pub(crate) fn check_access(
    state: &BrokerState,
    caller: &Caller,
    req: CheckAccessRequest,
) -> Result<CheckAccessResponse, ErrorInfo> {
    let principal = Principal::parse_stamp(&req.principal).ok_or_else(|| {
        ErrorInfo::new(
            ErrorCode::InvalidRequest,
            format!(
                "CheckAccess principal {:?} is not a principal (User:NAME, Anonymous or Broker:ID)",
                req.principal
            ),
        )
    })?;
    let asking = Caller {
        principal,
        peer: caller.peer,
    };
    let image = state.cluster.image();
    let mut denied = Vec::new();
    for (i, (op, resource)) in req.checks.iter().enumerate() {
        let (resource, api) = match resource {
            AclResource::Topic(t) => (
                Resource::Topic(*op, t),
                match op {
                    AclOperation::Write => ApiKey::Produce,
                    AclOperation::Read => ApiKey::Fetch,
                    AclOperation::Create => ApiKey::CreateTopics,
                    AclOperation::Delete => ApiKey::DeleteTopics,
                    AclOperation::Alter => ApiKey::AlterConfigs,
                    _ => ApiKey::Metadata,
                },
            ),
            AclResource::Group(g) => (Resource::Group(*op, g), ApiKey::ConsumerGroupHeartbeat),
            AclResource::Transform(n) => (Resource::Transform(*op, n), ApiKey::TransformWrite),
            AclResource::Cluster => (Resource::Cluster(*op), ApiKey::Metadata),
            AclResource::TopicPrefix(p) => {
                return Err(ErrorInfo::new(
                    ErrorCode::InvalidRequest,
                    format!("CheckAccess checks named resources, not a topic prefix ({p:?})"),
                ));
            }
        };
        if let Err(e) = state.auth.authorize(&image, &asking, api, &[resource]) {
            denied.push((i as u32, e.message));
        }
    }
    tracing::debug!(principal = %req.principal, checks = req.checks.len(), denied = denied.len(), "access checked");
    Ok(CheckAccessResponse { denied })
}
