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
    /// The group id, or (kind `Transaction`) the transactional id.
    pub group_id: String,
    /// Version 1 (issue 20): which coordinator.
    pub kind: CoordinatorKind,
}

/// Which coordinator FindCoordinator looks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CoordinatorKind {
    /// A consumer group's (`__consumer_offsets`).
    #[default]
    Group,
    /// A transactional id's (`__transaction_state`).
    Transaction,
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
    const VERSION: u16 = 1;
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

/// Version 1: `require_stable`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetFetchRequest {
    pub group_id: String,
    /// `None`: every partition the group has committed.
    pub partitions: Option<Vec<TopicPartitions>>,
    /// Kafka's `require_stable` (KIP-447): while an open transaction holds
    /// offsets for any of the partitions asked (a transactional producer's
    /// TxnOffsetCommit, not yet committed or aborted), answer
    /// UNSTABLE_OFFSET_COMMIT (retriable) instead of the offsets committed
    /// before it, naming those partitions in `offsets` (no offset). A
    /// read-committed consumer that takes partitions over asks so, or it would
    /// start from offsets the transaction is about to move past.
    pub require_stable: bool,
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
    const VERSION: u16 = 1;
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

// ---------------------------------------------------------------- classic groups
//
// Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup),
// for Kafka clients that assign partitions themselves (range,
// cooperative-sticky, ...): the coordinator collects the members' protocol
// metadata, hands it to the leader, and passes the leader's assignment on.
// The metadata and assignment bytes are the clients' own (opaque here). Served
// by the same coordinator and `__consumer_offsets` as the groups above; a
// group is of one kind or the other while it has members.

/// One protocol a joining member supports, with its metadata (for consumers,
/// Kafka's ConsumerProtocolSubscription).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinProtocol {
    pub name: String,
    pub metadata: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinGroupRequest {
    pub group_id: String,
    /// Empty for a new member: the coordinator gives it an id.
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    /// Where the member connects from (DescribeGroups shows it).
    pub client_host: String,
    pub session_timeout_ms: u32,
    /// How long the coordinator waits for members to rejoin in a rebalance.
    pub rebalance_timeout_ms: u32,
    /// `consumer` for Kafka consumers.
    pub protocol_type: String,
    /// In the member's order of preference.
    pub protocols: Vec<JoinProtocol>,
    /// A new member gets MEMBER_ID_REQUIRED with its id and joins again with
    /// it (Kafka's JoinGroup v4+); otherwise it joins at once.
    pub require_known_member_id: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinGroupMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub metadata: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinGroupResponse {
    /// MEMBER_ID_REQUIRED (with `member_id` set), UNKNOWN_MEMBER_ID,
    /// INCONSISTENT_GROUP_PROTOCOL, REBALANCE_IN_PROGRESS, NOT_COORDINATOR...
    pub error: Option<ErrorInfo>,
    pub generation: i32,
    pub protocol_type: String,
    /// The protocol every member supports, chosen by the members' votes.
    pub protocol_name: String,
    pub leader: String,
    pub member_id: String,
    /// Every member with its metadata, for the leader only (it assigns).
    pub members: Vec<JoinGroupMember>,
}

impl ApiRequest for JoinGroupRequest {
    const KEY: ApiKey = ApiKey::JoinGroup;
    type Response = JoinGroupResponse;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncAssignment {
    pub member_id: String,
    pub assignment: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncGroupRequest {
    pub group_id: String,
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
    /// Checked against the group's when given.
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    /// The leader's assignment of every member; empty from the others.
    pub assignments: Vec<SyncAssignment>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncGroupResponse {
    pub error: Option<ErrorInfo>,
    pub protocol_type: String,
    pub protocol_name: String,
    /// This member's assignment (for consumers, Kafka's ConsumerProtocolAssignment).
    pub assignment: Vec<u8>,
}

impl ApiRequest for SyncGroupRequest {
    const KEY: ApiKey = ApiKey::SyncGroup;
    type Response = SyncGroupResponse;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupHeartbeatRequest {
    pub group_id: String,
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupHeartbeatResponse {
    /// REBALANCE_IN_PROGRESS: rejoin; ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID.
    pub error: Option<ErrorInfo>,
}

impl ApiRequest for GroupHeartbeatRequest {
    const KEY: ApiKey = ApiKey::GroupHeartbeat;
    type Response = GroupHeartbeatResponse;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeavingMember {
    /// Empty when the member is named by its instance id.
    pub member_id: String,
    pub instance_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveGroupRequest {
    pub group_id: String,
    pub members: Vec<LeavingMember>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub error: Option<ErrorInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveGroupResponse {
    pub error: Option<ErrorInfo>,
    pub members: Vec<LeftMember>,
}

impl ApiRequest for LeaveGroupRequest {
    const KEY: ApiKey = ApiKey::LeaveGroup;
    type Response = LeaveGroupResponse;
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
