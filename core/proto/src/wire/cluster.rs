//! Messages between brokers of one cluster (api keys 20..=29): the Raft RPCs of
//! the metadata quorum, joining, heartbeats to the controller, forwarded metadata
//! writes, and OffsetForLeaderEpoch (KIP-101) for follower truncation.
//!
//! The Raft RPC bodies are the Raft library's own messages, JSON-encoded by the
//! broker (`body`), so this crate does not depend on the Raft implementation; the
//! frame meta that carries them is bounded like every other frame.

use super::messages::{ApiKey, ApiRequest};
use crate::types::{LeaderEpoch, Offset};
use serde::{Deserialize, Serialize};

/// Which Raft RPC a [`RaftRpcRequest`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaftRpcKind {
    Vote,
    AppendEntries,
    InstallSnapshot,
}

/// One Raft RPC from a quorum member to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftRpcRequest {
    /// The sender's broker id.
    pub from: i32,
    /// The receiver the sender means (a broker answers only RPCs meant for it).
    pub to: i32,
    pub kind: RaftRpcKind,
    /// The Raft request, JSON.
    pub body: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftRpcResponse {
    /// The Raft response or Raft error, JSON.
    pub body: Vec<u8>,
}

impl ApiRequest for RaftRpcRequest {
    const KEY: ApiKey = ApiKey::RaftRpc;
    type Response = RaftRpcResponse;
}

/// A broker asks to become a voter of the metadata quorum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinClusterRequest {
    pub broker_id: i32,
    /// Where the broker listens (`host:port`), for peers and clients.
    pub addr: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinClusterResponse {
    pub cluster_id: String,
    /// The voters after the join.
    pub voters: Vec<i32>,
}

impl ApiRequest for JoinClusterRequest {
    const KEY: ApiKey = ApiKey::JoinCluster;
    type Response = JoinClusterResponse;
}

/// A broker's periodic liveness signal to the controller (the quorum leader).
///
/// Version 1: the answer carries the controller's applied metadata index, so a
/// broker knows whether its own image has caught up with what the controller
/// decided while it was away.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerHeartbeatRequest {
    pub broker_id: i32,
    pub addr: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerHeartbeatResponse {
    /// False while the controller still treats the broker as fenced.
    pub alive: bool,
    /// The index of the last metadata log entry the controller had applied
    /// when it answered.
    pub metadata_index: u64,
}

impl ApiRequest for BrokerHeartbeatRequest {
    const KEY: ApiKey = ApiKey::BrokerHeartbeat;
    const VERSION: u16 = 1;
    type Response = BrokerHeartbeatResponse;
}

/// A metadata command forwarded to the controller, which commits it to the quorum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataWriteRequest {
    /// The broker's metadata command, JSON.
    pub command: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataWriteResponse {
    /// The command's outcome, JSON.
    pub outcome: Vec<u8>,
}

impl ApiRequest for MetadataWriteRequest {
    const KEY: ApiKey = ApiKey::MetadataWrite;
    type Response = MetadataWriteResponse;
}

/// KIP-101: a follower asks the leader where `leader_epoch` ends in the leader's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetForLeaderEpochRequest {
    pub topic: String,
    pub partition: u32,
    /// The leader epoch the follower believes current (fencing).
    pub current_leader_epoch: LeaderEpoch,
    /// The follower's latest epoch.
    pub leader_epoch: LeaderEpoch,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetForLeaderEpochResponse {
    /// The largest epoch <= the one asked that the leader has (None: none at all).
    pub leader_epoch: Option<LeaderEpoch>,
    /// Where that epoch ends on the leader (next epoch's start, or the log end).
    pub end_offset: Offset,
}

impl ApiRequest for OffsetForLeaderEpochRequest {
    const KEY: ApiKey = ApiKey::OffsetForLeaderEpoch;
    type Response = OffsetForLeaderEpochResponse;
}

/// A leader asks the controller to change a partition's ISR (KIP-966 AlterPartition).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlterPartitionRequest {
    pub broker_id: i32,
    pub topic: String,
    pub partition: u32,
    /// The leader epoch the leader holds; a stale one is refused.
    pub leader_epoch: LeaderEpoch,
    pub new_isr: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlterPartitionResponse {
    /// The ISR now committed.
    pub isr: Vec<i32>,
}

impl ApiRequest for AlterPartitionRequest {
    const KEY: ApiKey = ApiKey::AlterPartition;
    type Response = AlterPartitionResponse;
}

/// Moves leadership of partitions back to their preferred (first) replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectLeadersRequest {
    /// Topics to elect for; `None` for all.
    pub topics: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectLeadersResponse {
    /// Partitions whose leader moved, as `topic-partition`.
    pub moved: Vec<String>,
}

impl ApiRequest for ElectLeadersRequest {
    const KEY: ApiKey = ApiKey::ElectLeaders;
    type Response = ElectLeadersResponse;
}
