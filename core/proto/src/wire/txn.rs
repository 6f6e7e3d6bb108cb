//! Transactions (issue 20): the messages of the transaction coordinator and of
//! the markers it has partition leaders write. Kafka's model (KIP-98): a
//! producer with a transactional id gets its producer id and epoch from
//! InitProducerId (version 1 carries the transactional id), names the
//! partitions of its transaction (AddPartitionsToTxn) before it writes
//! transactional batches to them, and ends it (EndTxn); the coordinator then
//! has every partition's leader append a commit or abort marker
//! (WriteTxnMarkers, between brokers only).

use super::ErrorInfo;
use super::messages::ApiKey;
use super::messages::ApiRequest;
use crate::control::MarkerKind;
use serde::{Deserialize, Serialize};

/// A topic's partitions in a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnTopic {
    pub topic: String,
    pub partitions: Vec<u32>,
}

/// Adds partitions to the producer's open transaction (opening one if none
/// is open). Sent to the transaction coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddPartitionsToTxnRequest {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub topics: Vec<TxnTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddPartitionsToTxnResponse {
    /// PRODUCER_FENCED, CONCURRENT_TRANSACTIONS (retry), NOT_COORDINATOR,
    /// UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_ID_MAPPING, ...
    pub error: Option<ErrorInfo>,
}

impl ApiRequest for AddPartitionsToTxnRequest {
    const KEY: ApiKey = ApiKey::AddPartitionsToTxn;
    type Response = AddPartitionsToTxnResponse;
}

/// Commits or aborts the producer's transaction. Answered once every
/// partition of it holds its marker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndTxnRequest {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub commit: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndTxnResponse {
    pub error: Option<ErrorInfo>,
}

impl ApiRequest for EndTxnRequest {
    const KEY: ApiKey = ApiKey::EndTxn;
    type Response = EndTxnResponse;
}

/// Between brokers: the transaction coordinator asks a partition leader to
/// append the marker ending a transaction (and wait until it is replicated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteTxnMarkersRequest {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub kind: MarkerKind,
    pub coordinator_epoch: i32,
    pub topics: Vec<TxnTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkerResult {
    pub topic: String,
    pub partition: u32,
    pub error: Option<ErrorInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteTxnMarkersResponse {
    pub results: Vec<MarkerResult>,
}

impl ApiRequest for WriteTxnMarkersRequest {
    const KEY: ApiKey = ApiKey::WriteTxnMarkers;
    type Response = WriteTxnMarkersResponse;
}

/// Commits consumer offsets as part of the producer's transaction (Kafka's
/// AddOffsetsToTxn and TxnOffsetCommit in one): the group's offsets become
/// its committed offsets when the transaction commits, and are dropped if it
/// aborts. Sent to the transaction coordinator (a broker that is not forwards
/// it there). Empty `partitions` only adds the group to the transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnOffsetCommitRequest {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub group_id: String,
    pub partitions: Vec<super::OffsetCommitPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnOffsetCommitResponse {
    pub error: Option<ErrorInfo>,
}

impl ApiRequest for TxnOffsetCommitRequest {
    const KEY: ApiKey = ApiKey::TxnOffsetCommit;
    type Response = TxnOffsetCommitResponse;
}

/// Between brokers: a transaction coordinator has a group coordinator store a
/// committed transaction's offsets (whatever the group's members: the
/// transaction's producer was checked by its epoch), or drop an aborted
/// one's (`partitions` empty).
///
/// Version 1: `pending_for_ms`. With it, the offsets are not stored but
/// recorded as pending in the transaction (durably, in `__consumer_offsets`)
/// until it commits or aborts, or until that many milliseconds (counted by
/// the group's coordinator) pass: OffsetFetch with `require_stable` answers
/// UNSTABLE_OFFSET_COMMIT for them meanwhile. Without it, the transaction
/// ended: its pending offsets for the group are dropped, and `partitions`
/// stored as committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitTxnOffsetsRequest {
    pub transactional_id: String,
    pub group_id: String,
    pub partitions: Vec<super::OffsetCommitPartition>,
    pub pending_for_ms: Option<i64>,
}

impl ApiRequest for CommitTxnOffsetsRequest {
    const KEY: ApiKey = ApiKey::CommitTxnOffsets;
    const VERSION: u16 = 1;
    type Response = super::OffsetCommitResponse;
}

/// Admin: the state of each transactional id (Kafka's DescribeTransactions).
/// Answered by the id's transaction coordinator (FindCoordinator with
/// `CoordinatorKind::Transaction`); another broker answers NOT_COORDINATOR
/// for it, an id the coordinator does not know TRANSACTIONAL_ID_NOT_FOUND.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeTransactionsRequest {
    pub transactional_ids: Vec<String>,
}

/// One transactional id's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransactionDescription {
    pub transactional_id: String,
    pub error: Option<ErrorInfo>,
    /// Kafka's names: Empty, Ongoing, PrepareCommit, PrepareAbort,
    /// CompleteCommit, CompleteAbort.
    pub state: String,
    pub timeout_ms: i32,
    /// Wall-clock start of the open transaction; -1 when none is open.
    pub start_ms: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// The partitions of the open (or completing) transaction.
    pub topics: Vec<TxnTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeTransactionsResponse {
    pub transactions: Vec<TransactionDescription>,
}

impl ApiRequest for DescribeTransactionsRequest {
    const KEY: ApiKey = ApiKey::DescribeTransactions;
    type Response = DescribeTransactionsResponse;
}

/// Admin: the transactional ids this broker coordinates (Kafka's
/// ListTransactions: an admin asks every broker), filtered by state (empty:
/// any), producer id (empty: any) and how long the transaction has been open
/// (`min_duration_ms`, -1: any).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListTransactionsRequest {
    pub states: Vec<String>,
    pub producer_ids: Vec<i64>,
    pub min_duration_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransactionListing {
    pub transactional_id: String,
    pub producer_id: i64,
    pub state: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListTransactionsResponse {
    pub error: Option<ErrorInfo>,
    /// The asked states that are no state's name.
    pub unknown_states: Vec<String>,
    pub transactions: Vec<TransactionListing>,
}

impl ApiRequest for ListTransactionsRequest {
    const KEY: ApiKey = ApiKey::ListTransactions;
    type Response = ListTransactionsResponse;
}
