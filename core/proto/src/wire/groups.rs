//! Consumer-group messages (api keys 9..=19), version 0 of each (postcard-encoded
//! in a frame's meta, no payload).
//!
//! The protocol follows Kafka's newest consumer-group protocol (KIP-848): the
//! coordinator decides assignments; members only heartbeat.
//!
//! - `FindCoordinator`: which broker coordinates a group (the leader of the
//!   `__consumer_offsets` partition the group id hashes to).
//! - `ConsumerGroupHeartbeat`: join (member epoch 0), stay (the epoch last
//!   received), leave (epoch [`LEAVE_GROUP_EPOCH`]) or leave temporarily as a
//!   static member (epoch [`LEAVE_GROUP_STATIC_EPOCH`]). The member reports the
//!   partitions it still owns; the coordinator answers with the member's epoch and
//!   its assignment. A partition is given to a new owner only after its previous
//!   owner stopped reporting it (revocation acknowledged).
//! - `OffsetCommit`: as a member (fenced by member id and epoch), or as an admin
//!   (no member; refused while the group has members) to reset offsets.
//! - `OffsetFetch`, `ListGroups`, `DescribeGroups`, `DeleteGroups`.

use super::codes::ErrorInfo;
use super::messages::{ApiKey, ApiRequest};
use crate::types::{Offset, TimestampMs};
use serde::{Deserialize, Serialize};

/// The member epoch a member sends to join a group.
pub const JOIN_GROUP_EPOCH: i32 = 0;
/// The member epoch a member sends to leave a group for good.
pub const LEAVE_GROUP_EPOCH: i32 = -1;
/// The member epoch a static member sends to leave for a moment (it keeps its
/// assignment until its session times out, so a quick restart gets it back).
pub const LEAVE_GROUP_STATIC_EPOCH: i32 = -2;

/// A topic and a set of its partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicPartitions {
    pub topic: String,
    pub partitions: Vec<u32>,
}

// ---------------------------------------------------------------- find coordinator

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindCoordinatorRequest {
    pub group_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindCoordinatorResponse {
    /// COORDINATOR_NOT_AVAILABLE while the partition has no leader, INVALID_GROUP_ID.
    pub error: Option<ErrorInfo>,
    /// The `__consumer_offsets` partition of the group.
    pub partition: u32,
    pub coordinator_id: i32,
    /// `host:port` of the coordinator.
    pub coordinator_addr: String,
}

impl ApiRequest for FindCoordinatorRequest {
    const KEY: ApiKey = ApiKey::FindCoordinator;
    type Response = FindCoordinatorResponse;
}

// ---------------------------------------------------------------- heartbeat

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerGroupHeartbeatRequest {
    pub group_id: String,
    /// Chosen by the member (unique per member incarnation); never empty.
    pub member_id: String,
    /// 0 to join, the last epoch received to stay, -1 / -2 to leave.
    pub member_epoch: i32,
    /// `group.instance.id`: a static member keeps its assignment across restarts.
    pub instance_id: Option<String>,
    /// Names the member in DescribeGroups (`client_id`).
    pub client_id: String,
    pub subscribed_topics: Vec<String>,
    /// `uniform` or `range`; every member of a group must name the same one.
    pub assignor: String,
    /// Proposed session timeout (bounded by the broker's min/max).
    pub session_timeout_ms: u32,
    /// Proposed heartbeat interval.
    pub heartbeat_interval_ms: u32,
    /// The partitions the member still owns (fetches / may commit).
    pub owned: Vec<TopicPartitions>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerGroupHeartbeatResponse {
    /// UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH: rejoin with epoch 0.
    pub error: Option<ErrorInfo>,
    pub member_id: String,
    pub member_epoch: i32,
    /// When to heartbeat next (shorter while an assignment change is under way).
    pub heartbeat_interval_ms: u32,
    /// The session timeout the coordinator applies.
    pub session_timeout_ms: u32,
    /// The member's whole assignment (what it may fetch from now on).
    pub assignment: Vec<TopicPartitions>,
}

impl ApiRequest for ConsumerGroupHeartbeatRequest {
    const KEY: ApiKey = ApiKey::ConsumerGroupHeartbeat;
    type Response = ConsumerGroupHeartbeatResponse;
}

// ---------------------------------------------------------------- offsets

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetCommitPartition {
    pub topic: String,
    pub partition: u32,
    /// The next offset to read.
    pub offset: Offset,
    /// Free text stored with the offset (bounded).
    pub metadata: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetCommitRequest {
    pub group_id: String,
    /// `Some((member id, member epoch))` for a member; `None` for an admin reset,
    /// which the coordinator refuses while the group has members.
    pub member: Option<(String, i32)>,
    pub partitions: Vec<OffsetCommitPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetCommitPartitionResponse {
    pub topic: String,
    pub partition: u32,
    pub error: Option<ErrorInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetCommitResponse {
    /// A whole-group error (NOT_COORDINATOR, UNKNOWN_MEMBER_ID, NON_EMPTY_GROUP...).
    pub error: Option<ErrorInfo>,
    pub partitions: Vec<OffsetCommitPartitionResponse>,
}

impl ApiRequest for OffsetCommitRequest {
    const KEY: ApiKey = ApiKey::OffsetCommit;
    type Response = OffsetCommitResponse;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetFetchRequest {
    pub group_id: String,
    /// `None`: every partition the group has committed.
    pub partitions: Option<Vec<TopicPartitions>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommittedOffset {
    pub topic: String,
    pub partition: u32,
    /// `None`: no offset committed for this partition.
    pub offset: Option<Offset>,
    pub metadata: String,
    pub commit_timestamp_ms: TimestampMs,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetFetchResponse {
    pub error: Option<ErrorInfo>,
    pub offsets: Vec<CommittedOffset>,
}

impl ApiRequest for OffsetFetchRequest {
    const KEY: ApiKey = ApiKey::OffsetFetch;
    type Response = OffsetFetchResponse;
}

// ---------------------------------------------------------------- admin

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListGroupsRequest {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupListing {
    pub group_id: String,
    /// `Empty`, `Stable`, `Reconciling`.
    pub state: String,
    pub members: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListGroupsResponse {
    pub groups: Vec<GroupListing>,
}

impl ApiRequest for ListGroupsRequest {
    const KEY: ApiKey = ApiKey::ListGroups;
    type Response = ListGroupsResponse;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeGroupsRequest {
    pub group_ids: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub member_epoch: i32,
    pub subscribed_topics: Vec<String>,
    /// What the member owns now.
    pub assignment: Vec<TopicPartitions>,
    /// Partitions the member was asked to give up and has not yet released.
    pub revoking: Vec<TopicPartitions>,
    /// Whether the member left (a static member keeps its place until its session ends).
    pub left: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupDescription {
    pub group_id: String,
    /// GROUP_ID_NOT_FOUND, NOT_COORDINATOR.
    pub error: Option<ErrorInfo>,
    pub state: String,
    pub group_epoch: i32,
    pub assignor: String,
    pub members: Vec<GroupMemberDescription>,
    pub offsets: Vec<CommittedOffset>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeGroupsResponse {
    pub groups: Vec<GroupDescription>,
}

impl ApiRequest for DescribeGroupsRequest {
    const KEY: ApiKey = ApiKey::DescribeGroups;
    type Response = DescribeGroupsResponse;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteGroupsRequest {
    pub group_ids: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupResult {
    pub group_id: String,
    pub error: Option<ErrorInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteGroupsResponse {
    pub results: Vec<GroupResult>,
}

impl ApiRequest for DeleteGroupsRequest {
    const KEY: ApiKey = ApiKey::DeleteGroups;
    type Response = DeleteGroupsResponse;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{decode_meta, encode_meta};

    #[test]
    fn group_messages_round_trip() {
        let req = ConsumerGroupHeartbeatRequest {
            group_id: "g".into(),
            member_id: "m-1".into(),
            member_epoch: 3,
            instance_id: Some("i".into()),
            client_id: "c".into(),
            subscribed_topics: vec!["t".into()],
            assignor: "uniform".into(),
            session_timeout_ms: 1000,
            heartbeat_interval_ms: 100,
            owned: vec![TopicPartitions {
                topic: "t".into(),
                partitions: vec![0, 2],
            }],
        };
        let back: ConsumerGroupHeartbeatRequest = decode_meta(&encode_meta(&req)).unwrap();
        assert_eq!(back, req);
        let commit = OffsetCommitRequest {
            group_id: "g".into(),
            member: None,
            partitions: vec![OffsetCommitPartition {
                topic: "t".into(),
                partition: 1,
                offset: Offset(7),
                metadata: String::new(),
            }],
        };
        let back: OffsetCommitRequest = decode_meta(&encode_meta(&commit)).unwrap();
        assert_eq!(back, commit);
    }
}
