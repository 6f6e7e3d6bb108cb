//! Kafka's consumer group protocol of KIP-848 (ConsumerGroupHeartbeat v0-1,
//! ConsumerGroupDescribe v0-1; a client's `group.protocol=consumer`),
//! translated to Rill's coordinator, which works that way already: the broker
//! assigns (`uniform` or `range`, Kafka's names too), members reconcile by
//! heartbeats, commits are fenced by member epoch.
//!
//! What differs, and is translated here:
//! - Kafka names topics by id in assignments; Rill by name. The ids are the
//!   topics' ids of the metadata image (Metadata answers them too).
//! - A Kafka heartbeat sends its subscription, assignor and owned partitions
//!   only when they changed (null otherwise); Rill's heartbeat carries them
//!   every time. A connection keeps each member's last ones ([`Members`]); a
//!   heartbeat with nulls for a member this connection has not seen is
//!   answered UNKNOWN_MEMBER_ID, and the client rejoins with everything.
//! - The session timeout and heartbeat interval are the broker's
//!   (`group_consumer_session_timeout_ms`, `group_consumer_heartbeat_interval_ms`;
//!   Kafka's defaults, 45 s and 5 s), not the client's.
//! - Regular-expression subscriptions are not served (INVALID_REQUEST).

use crate::Shared;
use crate::apis::{code, failed, sb};
use crate::codes::to_kafka;
use bytes::Bytes;
use kafka_protocol::messages as km;
use kafka_protocol::messages::{GroupId, TopicName};
use rand::RngCore;
use rill_broker::front_door::Caller;
use rill_proto::wire as rw;
use rill_proto::wire::{ErrorCode, ErrorInfo};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use uuid::Uuid;

/// Most members one connection remembers (a consumer has one).
const MEMBERS_PER_CONNECTION_MAX: usize = 64;

/// What one member last sent and was sent, on this connection.
#[derive(Debug, Clone)]
struct Member {
    subscribed: Vec<String>,
    assignor: String,
    owned: Vec<rw::TopicPartitions>,
    /// The assignment last answered (not sent again while unchanged).
    assignment: Vec<rw::TopicPartitions>,
    epoch: i32,
}

/// The KIP-848 members heartbeating on one connection, by (group, member id).
#[derive(Debug, Default)]
pub(crate) struct Members(HashMap<(String, String), Member>);

/// The metadata image's topic ids (UUIDs), both ways.
pub(crate) struct TopicIds {
    by_name: BTreeMap<String, Uuid>,
    pub by_id: HashMap<Uuid, String>,
}

impl TopicIds {
    pub fn load(shared: &Shared) -> TopicIds {
        let by_name: BTreeMap<String, Uuid> = shared
            .front
            .topic_ids()
            .into_iter()
            .map(|(name, id)| (name, uuid_of(&id)))
            .collect();
        let by_id = by_name.iter().map(|(n, id)| (*id, n.clone())).collect();
        TopicIds { by_name, by_id }
    }

    /// A topic's id; the nil UUID for a topic the image does not hold.
    pub fn id(&self, name: &str) -> Uuid {
        self.by_name.get(name).copied().unwrap_or(Uuid::nil())
    }
}

/// A topic id of the image (32 hex digits) as Kafka's UUID.
fn uuid_of(hex: &str) -> Uuid {
    Uuid::parse_str(hex).unwrap_or(Uuid::nil())
}

fn error_response(
    e: &ErrorInfo,
    member_id: &str,
    epoch: i32,
) -> km::ConsumerGroupHeartbeatResponse {
    km::ConsumerGroupHeartbeatResponse::default()
        .with_error_code(to_kafka(e.code))
        .with_error_message(Some(sb(e.message.clone())))
        .with_member_id(Some(sb(member_id)))
        .with_member_epoch(epoch)
}

pub(crate) async fn heartbeat(
    shared: &Shared,
    caller: &Arc<Caller>,
    members: &mut Members,
    client_id: &str,
    r: km::ConsumerGroupHeartbeatRequest,
) -> km::ConsumerGroupHeartbeatResponse {
    let group_id = r.group_id.0.to_string();
    let mut member_id = r.member_id.to_string();
    if member_id.is_empty() && r.member_epoch == 0 {
        // Version 0: the coordinator names a joining member.
        let mut bytes = [0u8; 16];
        rand::rng().fill_bytes(&mut bytes);
        member_id = uuid::Builder::from_random_bytes(bytes)
            .into_uuid()
            .to_string();
    }
    let invalid = |m: String| ErrorInfo::new(ErrorCode::InvalidRequest, m);
    if r.subscribed_topic_regex
        .as_ref()
        .is_some_and(|re| !re.is_empty())
    {
        let e = invalid(format!(
            "group {group_id}: regular-expression subscriptions are not supported by this \
             broker; subscribe to topic names"
        ));
        return error_response(&e, &member_id, r.member_epoch);
    }
    let key = (group_id.clone(), member_id.clone());
    let leaving = r.member_epoch < 0;
    let known = members.0.get(&key).cloned();
    let ids = TopicIds::load(shared);
    let subscribed = match (&r.subscribed_topic_names, &known) {
        (Some(names), _) => names.iter().map(|n| n.0.to_string()).collect(),
        (None, Some(k)) => k.subscribed.clone(),
        (None, None) if leaving => Vec::new(),
        (None, None) => {
            let e = ErrorInfo::new(
                ErrorCode::UnknownMemberId,
                format!(
                    "group {group_id}: member {member_id} heartbeats without its subscription \
                     on a connection that has not seen it; rejoin"
                ),
            );
            return error_response(&e, &member_id, r.member_epoch);
        }
    };
    let assignor = match (&r.server_assignor, &known) {
        (Some(a), _) => a.to_string(),
        (None, Some(k)) => k.assignor.clone(),
        (None, None) => "uniform".to_string(),
    };
    let owned = match (&r.topic_partitions, &known) {
        (Some(tps), _) => tps
            .iter()
            .filter_map(|t| {
                Some(rw::TopicPartitions {
                    topic: ids.by_id.get(&t.topic_id)?.clone(),
                    partitions: t
                        .partitions
                        .iter()
                        .filter_map(|p| u32::try_from(*p).ok())
                        .collect(),
                })
            })
            .collect(),
        (None, Some(k)) => k.owned.clone(),
        (None, None) => Vec::new(),
    };
    let request = rw::ConsumerGroupHeartbeatRequest {
        group_id: group_id.clone(),
        member_id: member_id.clone(),
        member_epoch: r.member_epoch,
        instance_id: r.instance_id.as_ref().map(|s| s.to_string()),
        client_id: client_id.to_string(),
        subscribed_topics: subscribed.clone(),
        assignor: assignor.clone(),
        session_timeout_ms: shared.front.config().group_consumer_session_timeout_ms,
        heartbeat_interval_ms: shared.front.config().group_consumer_heartbeat_interval_ms,
        owned: owned.clone(),
    };
    let answer = shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("ConsumerGroupHeartbeat")));
    let resp = match answer {
        Ok((resp, _)) => resp,
        Err(e) => {
            members.0.remove(&key);
            return error_response(&e, &member_id, r.member_epoch);
        }
    };
    if let Some(e) = &resp.error {
        members.0.remove(&key);
        return error_response(e, &member_id, resp.member_epoch);
    }
    let mut out = km::ConsumerGroupHeartbeatResponse::default()
        .with_member_id(Some(sb(resp.member_id.clone())))
        .with_member_epoch(resp.member_epoch)
        .with_heartbeat_interval_ms(resp.heartbeat_interval_ms as i32);
    if leaving {
        members.0.remove(&key);
        return out;
    }
    let unchanged = known
        .as_ref()
        .is_some_and(|k| k.assignment == resp.assignment && k.epoch == resp.member_epoch);
    if !unchanged {
        let tps = resp
            .assignment
            .iter()
            .map(|t| {
                km::consumer_group_heartbeat_response::TopicPartitions::default()
                    .with_topic_id(ids.id(&t.topic))
                    .with_partitions(t.partitions.iter().map(|p| *p as i32).collect())
            })
            .collect();
        out = out.with_assignment(Some(
            km::consumer_group_heartbeat_response::Assignment::default().with_topic_partitions(tps),
        ));
    }
    if members.0.len() >= MEMBERS_PER_CONNECTION_MAX && known.is_none() {
        // A connection multiplexing that many members: forget one (it
        // rejoins with everything if it heartbeats here again).
        if let Some(k) = members.0.keys().next().cloned() {
            members.0.remove(&k);
        }
    }
    members.0.insert(
        key,
        Member {
            subscribed,
            assignor,
            owned,
            assignment: resp.assignment,
            epoch: resp.member_epoch,
        },
    );
    out
}

pub(crate) async fn describe(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::ConsumerGroupDescribeRequest,
) -> km::ConsumerGroupDescribeResponse {
    let request = rw::DescribeGroupsRequest {
        group_ids: r.group_ids.iter().map(|g| g.0.to_string()).collect(),
    };
    let answer = shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("ConsumerGroupDescribe")));
    let ids = TopicIds::load(shared);
    let groups = match answer {
        Ok((resp, _)) => resp
            .groups
            .into_iter()
            .map(|g| described(&ids, g))
            .collect(),
        Err(e) => r
            .group_ids
            .iter()
            .map(|g| {
                km::consumer_group_describe_response::DescribedGroup::default()
                    .with_group_id(g.clone())
                    .with_error_code(to_kafka(e.code))
                    .with_error_message(Some(sb(e.message.clone())))
            })
            .collect(),
    };
    km::ConsumerGroupDescribeResponse::default().with_groups(groups)
}

fn assignment(
    ids: &TopicIds,
    tps: &[rw::TopicPartitions],
) -> km::consumer_group_describe_response::Assignment {
    km::consumer_group_describe_response::Assignment::default().with_topic_partitions(
        tps.iter()
            .map(|t| {
                km::consumer_group_describe_response::TopicPartitions::default()
                    .with_topic_id(ids.id(&t.topic))
                    .with_topic_name(TopicName(sb(t.topic.clone())))
                    .with_partitions(t.partitions.iter().map(|p| *p as i32).collect())
            })
            .collect(),
    )
}

fn described(
    ids: &TopicIds,
    g: rw::GroupDescription,
) -> km::consumer_group_describe_response::DescribedGroup {
    let out = km::consumer_group_describe_response::DescribedGroup::default()
        .with_group_id(GroupId(sb(g.group_id.clone())))
        .with_error_code(code(&g.error))
        .with_error_message(g.error.as_ref().map(|e| sb(e.message.clone())));
    if g.error.is_some() {
        return out.with_group_state(sb("Dead"));
    }
    // Rill's states (Empty, Reconciling, Stable) are Kafka's consumer-group ones.
    let state = g.state.clone();
    let members = g
        .members
        .iter()
        .map(|m| {
            km::consumer_group_describe_response::Member::default()
                .with_member_id(sb(m.member_id.clone()))
                .with_instance_id(m.instance_id.as_ref().map(|i| sb(i.clone())))
                .with_member_epoch(m.member_epoch)
                .with_client_id(sb(m.client_id.clone()))
                .with_subscribed_topic_names(
                    m.subscribed_topics
                        .iter()
                        .map(|t| TopicName(sb(t.clone())))
                        .collect(),
                )
                .with_assignment(assignment(ids, &m.assignment))
                .with_target_assignment(assignment(ids, &m.assignment))
                .with_member_type(1)
        })
        .collect();
    out.with_group_state(sb(state))
        .with_group_epoch(g.group_epoch)
        .with_assignment_epoch(g.group_epoch)
        .with_assignor_name(sb(g.assignor))
        .with_members(members)
        .with_authorized_operations(i32::MIN)
}
