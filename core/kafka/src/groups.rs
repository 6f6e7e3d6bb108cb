//! Kafka's classic group apis (JoinGroup, SyncGroup, Heartbeat, LeaveGroup)
//! and the group admin apis (ListGroups, DescribeGroups, DeleteGroups),
//! translated to the broker's group coordinator, which serves Rill's own
//! consumer groups too: a group's committed offsets are the same whichever
//! protocol committed them, and `rill group describe` shows Kafka members.
//!
//! The members' protocol metadata and assignments pass through as the
//! clients wrote them; DescribeGroups answers them re-encoded from what the
//! coordinator read of them (Kafka's consumer protocol, version 0), which is
//! what admin tools decode.

use crate::Shared;
use crate::apis::{code, failed, message, sb};
use crate::codes::to_kafka;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages as km;
use kafka_protocol::messages::{GroupId, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use rill_broker::front_door::Caller;
use rill_proto::wire as rw;
use rill_proto::wire::{ApiRequest, ErrorInfo};
use std::sync::Arc;

async fn call<R: ApiRequest>(
    shared: &Shared,
    caller: &Arc<Caller>,
    request: &R,
) -> Result<R::Response, ErrorInfo> {
    shared
        .front
        .call(caller, request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed(R::KEY.name())))
        .map(|(r, _)| r)
}

fn opt(s: &Option<StrBytes>) -> Option<String> {
    s.as_ref().map(|s| s.to_string())
}

pub(crate) async fn join_group(
    shared: &Shared,
    caller: &Arc<Caller>,
    version: i16,
    client_id: &str,
    r: km::JoinGroupRequest,
) -> km::JoinGroupResponse {
    let request = rw::JoinGroupRequest {
        group_id: r.group_id.0.to_string(),
        member_id: r.member_id.to_string(),
        instance_id: opt(&r.group_instance_id),
        client_id: client_id.to_string(),
        client_host: format!("/{}", caller.peer.ip()),
        session_timeout_ms: u32::try_from(r.session_timeout_ms).unwrap_or(0),
        // v0 has none: Kafka then uses the session timeout.
        rebalance_timeout_ms: if version >= 1 {
            u32::try_from(r.rebalance_timeout_ms).unwrap_or(0)
        } else {
            0
        },
        protocol_type: r.protocol_type.to_string(),
        protocols: r
            .protocols
            .iter()
            .map(|p| rw::JoinProtocol {
                name: p.name.to_string(),
                metadata: p.metadata.to_vec(),
            })
            .collect(),
        require_known_member_id: version >= 4,
    };
    let out = km::JoinGroupResponse::default()
        .with_generation_id(-1)
        .with_protocol_name(Some(StrBytes::default()))
        .with_member_id(r.member_id.clone());
    let a = match call(shared, caller, &request).await {
        Ok(a) => a,
        Err(e) => return out.with_error_code(to_kafka(e.code)),
    };
    let members = a
        .members
        .into_iter()
        .map(|m| {
            km::join_group_response::JoinGroupResponseMember::default()
                .with_member_id(sb(m.member_id))
                .with_group_instance_id(m.instance_id.map(sb))
                .with_metadata(Bytes::from(m.metadata))
        })
        .collect();
    out.with_error_code(code(&a.error))
        .with_generation_id(a.generation)
        .with_protocol_type((version >= 7).then(|| sb(a.protocol_type)))
        .with_protocol_name(Some(sb(a.protocol_name)))
        .with_leader(sb(a.leader))
        .with_member_id(sb(a.member_id))
        .with_members(members)
}

pub(crate) async fn sync_group(
    shared: &Shared,
    caller: &Arc<Caller>,
    version: i16,
    r: km::SyncGroupRequest,
) -> km::SyncGroupResponse {
    let request = rw::SyncGroupRequest {
        group_id: r.group_id.0.to_string(),
        generation: r.generation_id,
        member_id: r.member_id.to_string(),
        instance_id: opt(&r.group_instance_id),
        protocol_type: opt(&r.protocol_type),
        protocol_name: opt(&r.protocol_name),
        assignments: r
            .assignments
            .iter()
            .map(|a| rw::SyncAssignment {
                member_id: a.member_id.to_string(),
                assignment: a.assignment.to_vec(),
            })
            .collect(),
    };
    let a = match call(shared, caller, &request).await {
        Ok(a) => a,
        Err(e) => return km::SyncGroupResponse::default().with_error_code(to_kafka(e.code)),
    };
    let out = km::SyncGroupResponse::default()
        .with_error_code(code(&a.error))
        .with_assignment(Bytes::from(a.assignment));
    if version >= 5 {
        out.with_protocol_type(Some(sb(a.protocol_type)))
            .with_protocol_name(Some(sb(a.protocol_name)))
    } else {
        out
    }
}

pub(crate) async fn heartbeat(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::HeartbeatRequest,
) -> km::HeartbeatResponse {
    let request = rw::GroupHeartbeatRequest {
        group_id: r.group_id.0.to_string(),
        generation: r.generation_id,
        member_id: r.member_id.to_string(),
        instance_id: opt(&r.group_instance_id),
    };
    let error = match call(shared, caller, &request).await {
        Ok(a) => code(&a.error),
        Err(e) => to_kafka(e.code),
    };
    km::HeartbeatResponse::default().with_error_code(error)
}

pub(crate) async fn leave_group(
    shared: &Shared,
    caller: &Arc<Caller>,
    version: i16,
    r: km::LeaveGroupRequest,
) -> km::LeaveGroupResponse {
    let members: Vec<rw::LeavingMember> = if version >= 3 {
        r.members
            .iter()
            .map(|m| rw::LeavingMember {
                member_id: m.member_id.to_string(),
                instance_id: opt(&m.group_instance_id),
            })
            .collect()
    } else {
        vec![rw::LeavingMember {
            member_id: r.member_id.to_string(),
            instance_id: None,
        }]
    };
    let request = rw::LeaveGroupRequest {
        group_id: r.group_id.0.to_string(),
        members,
    };
    let a = match call(shared, caller, &request).await {
        Ok(a) => a,
        Err(e) => return km::LeaveGroupResponse::default().with_error_code(to_kafka(e.code)),
    };
    if version < 3 {
        // One member: its error is the whole answer's.
        let error = a
            .error
            .as_ref()
            .or_else(|| a.members.first().and_then(|m| m.error.as_ref()))
            .map_or(crate::codes::kafka::NONE, |e| to_kafka(e.code));
        return km::LeaveGroupResponse::default().with_error_code(error);
    }
    let members = a
        .members
        .into_iter()
        .map(|m| {
            km::leave_group_response::MemberResponse::default()
                .with_member_id(sb(m.member_id))
                .with_group_instance_id(m.instance_id.map(sb))
                .with_error_code(code(&m.error))
        })
        .collect();
    km::LeaveGroupResponse::default()
        .with_error_code(code(&a.error))
        .with_members(members)
}

/// Kafka's group state names for Rill's (`Reconciling` is KIP-848's
/// `Reconciling`, shown to classic tools as a rebalance).
fn kafka_state(state: &str) -> &str {
    match state {
        "Reconciling" => "PreparingRebalance",
        other => other,
    }
}

pub(crate) async fn list_groups(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::ListGroupsRequest,
) -> km::ListGroupsResponse {
    let a = match call(shared, caller, &rw::ListGroupsRequest {}).await {
        Ok(a) => a,
        Err(e) => return km::ListGroupsResponse::default().with_error_code(to_kafka(e.code)),
    };
    let wanted = |state: &str| {
        r.states_filter.is_empty()
            || r.states_filter
                .iter()
                .any(|s| s.eq_ignore_ascii_case(kafka_state(state)))
    };
    let groups = a
        .groups
        .into_iter()
        .filter(|g| wanted(&g.state))
        .map(|g| {
            km::list_groups_response::ListedGroup::default()
                .with_group_state(sb(kafka_state(&g.state)))
                .with_group_id(GroupId(sb(g.group_id)))
                .with_protocol_type(sb("consumer"))
                .with_group_type(sb("classic"))
        })
        .collect();
    km::ListGroupsResponse::default().with_groups(groups)
}

/// Kafka's consumer protocol (version 0) of a subscription.
fn subscription_bytes(topics: &[String]) -> Bytes {
    let s = km::ConsumerProtocolSubscription::default()
        .with_topics(topics.iter().map(|t| sb(t.clone())).collect());
    versioned(&s)
}

/// Kafka's consumer protocol (version 0) of an assignment.
fn assignment_bytes(assigned: &[rw::TopicPartitions]) -> Bytes {
    let a = km::ConsumerProtocolAssignment::default().with_assigned_partitions(
        assigned
            .iter()
            .map(|t| {
                km::consumer_protocol_assignment::TopicPartition::default()
                    .with_topic(TopicName(sb(t.topic.clone())))
                    .with_partitions(t.partitions.iter().map(|p| *p as i32).collect())
            })
            .collect(),
    );
    versioned(&a)
}

fn versioned<M: Encodable>(m: &M) -> Bytes {
    let mut out = BytesMut::new();
    out.extend_from_slice(&0i16.to_be_bytes());
    if m.encode(&mut out, 0).is_err() {
        return Bytes::new();
    }
    out.freeze()
}

pub(crate) async fn describe_groups(
    shared: &Shared,
    caller: &Arc<Caller>,
    version: i16,
    r: km::DescribeGroupsRequest,
) -> km::DescribeGroupsResponse {
    let request = rw::DescribeGroupsRequest {
        group_ids: r.groups.iter().map(|g| g.0.to_string()).collect(),
    };
    let described = match call(shared, caller, &request).await {
        Ok(a) => a.groups,
        Err(e) => request
            .group_ids
            .iter()
            .map(|g| rw::GroupDescription {
                group_id: g.clone(),
                error: Some(e.clone()),
                state: "Dead".into(),
                group_epoch: 0,
                assignor: String::new(),
                members: Vec::new(),
                offsets: Vec::new(),
            })
            .collect(),
    };
    let groups = described
        .into_iter()
        .map(|g| {
            let out = km::describe_groups_response::DescribedGroup::default()
                .with_group_id(GroupId(sb(g.group_id.clone())))
                .with_error_code(code(&g.error))
                // (error_message is a field of version 6 on: an older answer
                // carrying one cannot be encoded.)
                .with_error_message(g.error.as_ref().and_then(message).filter(|_| version >= 6));
            if g.error.is_some() {
                // Kafka answers an unknown group as Dead, with no error.
                if g.error
                    .as_ref()
                    .is_some_and(|e| e.code == rill_proto::wire::ErrorCode::GroupIdNotFound)
                {
                    return out
                        .with_error_code(crate::codes::kafka::NONE)
                        .with_error_message(None)
                        .with_group_state(sb("Dead"));
                }
                return out;
            }
            let members = g
                .members
                .iter()
                .map(|m| {
                    km::describe_groups_response::DescribedGroupMember::default()
                        .with_member_id(sb(m.member_id.clone()))
                        .with_group_instance_id(m.instance_id.clone().map(sb))
                        .with_client_id(sb(m.client_id.clone()))
                        .with_member_metadata(subscription_bytes(&m.subscribed_topics))
                        .with_member_assignment(assignment_bytes(&m.assignment))
                })
                .collect();
            out.with_group_state(sb(kafka_state(&g.state)))
                .with_protocol_type(sb("consumer"))
                .with_protocol_data(sb(g.assignor))
                .with_members(members)
        })
        .collect();
    km::DescribeGroupsResponse::default().with_groups(groups)
}

pub(crate) async fn delete_groups(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::DeleteGroupsRequest,
) -> km::DeleteGroupsResponse {
    let request = rw::DeleteGroupsRequest {
        group_ids: r.groups_names.iter().map(|g| g.0.to_string()).collect(),
    };
    let results = match call(shared, caller, &request).await {
        Ok(a) => a.results,
        Err(e) => request
            .group_ids
            .iter()
            .map(|g| rw::GroupResult {
                group_id: g.clone(),
                error: Some(e.clone()),
            })
            .collect(),
    };
    let results = results
        .into_iter()
        .map(|g| {
            km::delete_groups_response::DeletableGroupResult::default()
                .with_group_id(GroupId(sb(g.group_id)))
                .with_error_code(code(&g.error))
        })
        .collect();
    km::DeleteGroupsResponse::default().with_results(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_broker::group::consumer_protocol;

    /// The broker's reader of Kafka's consumer protocol reads what the
    /// `kafka-protocol` crate (Kafka's own schemas) writes, in every version.
    #[test]
    fn the_brokers_consumer_protocol_reader_reads_kafkas_encoding() {
        for version in 0..=3i16 {
            let s = km::ConsumerProtocolSubscription::default()
                .with_topics(vec![sb("orders"), sb("payments")])
                .with_user_data(Some(Bytes::from_static(b"ud")));
            let mut buf = BytesMut::new();
            buf.extend_from_slice(&version.to_be_bytes());
            s.encode(&mut buf, version).unwrap();
            assert_eq!(
                consumer_protocol::subscription_topics(&buf),
                Some(vec!["orders".to_string(), "payments".to_string()]),
                "subscription v{version}"
            );
        }
        for version in 0..=3i16 {
            let a = km::ConsumerProtocolAssignment::default()
                .with_assigned_partitions(vec![
                    km::consumer_protocol_assignment::TopicPartition::default()
                        .with_topic(TopicName(sb("orders")))
                        .with_partitions(vec![0, 2, 4]),
                ])
                .with_user_data(None);
            let mut buf = BytesMut::new();
            buf.extend_from_slice(&version.to_be_bytes());
            a.encode(&mut buf, version).unwrap();
            assert_eq!(
                consumer_protocol::assignment(&buf),
                Some(vec![rw::TopicPartitions {
                    topic: "orders".into(),
                    partitions: vec![0, 2, 4]
                }]),
                "assignment v{version}"
            );
        }
        // What DescribeGroups answers reads back the same.
        let topics = vec!["t".to_string()];
        assert_eq!(
            consumer_protocol::subscription_topics(&subscription_bytes(&topics)),
            Some(topics)
        );
        // Garbage is nothing, never a panic.
        assert_eq!(
            consumer_protocol::subscription_topics(&[0, 0, 0x7f, 0xff, 0xff, 0xff]),
            None
        );
        assert_eq!(consumer_protocol::assignment(&[0]), None);
    }
}
