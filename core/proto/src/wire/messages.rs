//! Request and response messages, version 0 of each api (postcard-encoded in a
//! frame's meta; record batches ride in the frame's payload, never in the meta).
//!
//! Versioning: postcard is not self-describing, so a message's layout is fixed per
//! (api key, version). A change to a message adds a new version; a broker answers a
//! version it does not support with `UNSUPPORTED_VERSION`, and `ApiVersions`
//! (always version 0, never changed) tells a client what the broker speaks.
//!
//! Payload layout: a produce request lists its partitions with the byte length of
//! each one's batches; the payload is those batches concatenated in list order.
//! A fetch response does the same. This keeps batches as the producer encoded them.

use super::codes::ErrorInfo;
use crate::types::{LeaderEpoch, Offset, TimestampMs};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Which request a frame carries. Numbers are stable and never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ApiKey {
    ApiVersions = 0,
    Metadata = 1,
    CreateTopics = 2,
    DeleteTopics = 3,
    DescribeConfigs = 4,
    AlterConfigs = 5,
    Produce = 6,
    Fetch = 7,
    ListOffsets = 8,
    // Consumer groups (9..=19), messages in `groups.rs`.
    FindCoordinator = 9,
    ConsumerGroupHeartbeat = 10,
    OffsetCommit = 11,
    OffsetFetch = 12,
    ListGroups = 13,
    DescribeGroups = 14,
    DeleteGroups = 15,
    /// Kafka's classic group protocol (issue 19).
    JoinGroup = 16,
    SyncGroup = 17,
    GroupHeartbeat = 18,
    LeaveGroup = 19,
    /// Tiered storage (issue 7): per-partition local and remote log extents.
    DescribeStorage = 35,
    /// Idempotent producer (issue 4): a cluster-unique producer id.
    InitProducerId = 36,
    // Cluster (issue 4): 20..=29, messages in `wire::cluster`.
    RaftRpc = 20,
    JoinCluster = 21,
    BrokerHeartbeat = 22,
    MetadataWrite = 23,
    OffsetForLeaderEpoch = 24,
    AlterPartition = 25,
    ElectLeaders = 26,
    // Access control (issue 18): 27..=31, messages in `wire::security`.
    CreateAcls = 27,
    DescribeAcls = 28,
    DeleteAcls = 29,
    AlterQuotas = 30,
    DescribeQuotas = 31,
    // Transform deployments (issue 18): 32..=33, messages in `wire::security`.
    TransformWrite = 32,
    CheckAccess = 33,
    // SCRAM users of the Kafka listener's SASL (issue 19), in `wire::security`.
    AlterUser = 34,
    DescribeUsers = 37,
    /// More partitions for a topic (issue 19: Kafka's CreatePartitions).
    CreatePartitions = 38,
    /// Idempotent producers per partition (issue 19: Kafka's DescribeProducers).
    DescribeProducers = 39,
    // Transactions (issue 20), messages in `wire::txn`.
    AddPartitionsToTxn = 40,
    EndTxn = 41,
    /// Between brokers: a partition leader appends a transaction marker.
    WriteTxnMarkers = 42,
    TxnOffsetCommit = 43,
    /// Between brokers: a group coordinator stores a committed transaction's offsets.
    CommitTxnOffsets = 44,
    /// One broker's own traffic and request latencies (the console's charts).
    DescribeBrokerStats = 45,
    /// Admin: transactional ids' state, from their coordinator (Kafka's DescribeTransactions).
    DescribeTransactions = 46,
    /// Admin: the transactional ids one broker coordinates (Kafka's ListTransactions).
    ListTransactions = 47,
}

impl ApiKey {
    pub const ALL: [ApiKey; 48] = [
        ApiKey::ApiVersions,
        ApiKey::Metadata,
        ApiKey::CreateTopics,
        ApiKey::DeleteTopics,
        ApiKey::DescribeConfigs,
        ApiKey::AlterConfigs,
        ApiKey::Produce,
        ApiKey::Fetch,
        ApiKey::ListOffsets,
        ApiKey::DescribeStorage,
        ApiKey::InitProducerId,
        ApiKey::FindCoordinator,
        ApiKey::ConsumerGroupHeartbeat,
        ApiKey::OffsetCommit,
        ApiKey::OffsetFetch,
        ApiKey::ListGroups,
        ApiKey::DescribeGroups,
        ApiKey::DeleteGroups,
        ApiKey::JoinGroup,
        ApiKey::SyncGroup,
        ApiKey::GroupHeartbeat,
        ApiKey::LeaveGroup,
        ApiKey::RaftRpc,
        ApiKey::JoinCluster,
        ApiKey::BrokerHeartbeat,
        ApiKey::MetadataWrite,
        ApiKey::OffsetForLeaderEpoch,
        ApiKey::AlterPartition,
        ApiKey::ElectLeaders,
        ApiKey::CreateAcls,
        ApiKey::DescribeAcls,
        ApiKey::DeleteAcls,
        ApiKey::AlterQuotas,
        ApiKey::DescribeQuotas,
        ApiKey::TransformWrite,
        ApiKey::CheckAccess,
        ApiKey::AlterUser,
        ApiKey::DescribeUsers,
        ApiKey::CreatePartitions,
        ApiKey::DescribeProducers,
        ApiKey::AddPartitionsToTxn,
        ApiKey::EndTxn,
        ApiKey::WriteTxnMarkers,
        ApiKey::TxnOffsetCommit,
        ApiKey::CommitTxnOffsets,
        ApiKey::DescribeBrokerStats,
        ApiKey::DescribeTransactions,
        ApiKey::ListTransactions,
    ];

    pub fn from_u16(n: u16) -> Option<ApiKey> {
        ApiKey::ALL.into_iter().find(|k| *k as u16 == n)
    }

    /// A stable lower-case name, used in logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            ApiKey::ApiVersions => "api_versions",
            ApiKey::Metadata => "metadata",
            ApiKey::CreateTopics => "create_topics",
            ApiKey::DeleteTopics => "delete_topics",
            ApiKey::DescribeConfigs => "describe_configs",
            ApiKey::AlterConfigs => "alter_configs",
            ApiKey::Produce => "produce",
            ApiKey::Fetch => "fetch",
            ApiKey::ListOffsets => "list_offsets",
            ApiKey::DescribeStorage => "describe_storage",
            ApiKey::InitProducerId => "init_producer_id",
            ApiKey::FindCoordinator => "find_coordinator",
            ApiKey::ConsumerGroupHeartbeat => "consumer_group_heartbeat",
            ApiKey::OffsetCommit => "offset_commit",
            ApiKey::OffsetFetch => "offset_fetch",
            ApiKey::ListGroups => "list_groups",
            ApiKey::DescribeGroups => "describe_groups",
            ApiKey::DeleteGroups => "delete_groups",
            ApiKey::JoinGroup => "join_group",
            ApiKey::SyncGroup => "sync_group",
            ApiKey::GroupHeartbeat => "group_heartbeat",
            ApiKey::LeaveGroup => "leave_group",
            ApiKey::RaftRpc => "raft_rpc",
            ApiKey::JoinCluster => "join_cluster",
            ApiKey::BrokerHeartbeat => "broker_heartbeat",
            ApiKey::MetadataWrite => "metadata_write",
            ApiKey::OffsetForLeaderEpoch => "offset_for_leader_epoch",
            ApiKey::AlterPartition => "alter_partition",
            ApiKey::ElectLeaders => "elect_leaders",
            ApiKey::CreateAcls => "create_acls",
            ApiKey::DescribeAcls => "describe_acls",
            ApiKey::DeleteAcls => "delete_acls",
            ApiKey::AlterQuotas => "alter_quotas",
            ApiKey::DescribeQuotas => "describe_quotas",
            ApiKey::TransformWrite => "transform_write",
            ApiKey::CheckAccess => "check_access",
            ApiKey::AlterUser => "alter_user",
            ApiKey::DescribeUsers => "describe_users",
            ApiKey::CreatePartitions => "create_partitions",
            ApiKey::DescribeProducers => "describe_producers",
            ApiKey::AddPartitionsToTxn => "add_partitions_to_txn",
            ApiKey::EndTxn => "end_txn",
            ApiKey::WriteTxnMarkers => "write_txn_markers",
            ApiKey::TxnOffsetCommit => "txn_offset_commit",
            ApiKey::CommitTxnOffsets => "commit_txn_offsets",
            ApiKey::DescribeBrokerStats => "describe_broker_stats",
            ApiKey::DescribeTransactions => "describe_transactions",
            ApiKey::ListTransactions => "list_transactions",
        }
    }
}

/// A request message: its api key, the version this layout is, and its response.
pub trait ApiRequest: Serialize + DeserializeOwned + std::fmt::Debug {
    const KEY: ApiKey;
    const VERSION: u16 = 0;
    type Response: Serialize + DeserializeOwned + std::fmt::Debug;
}

/// What a response frame's meta holds: the response, or an error for the whole
/// request (malformed, unsupported version, too large, ...).
pub type ResponseMeta<T> = Result<T, ErrorInfo>;

// ---------------------------------------------------------------- init producer id

/// Asks for a producer id, unique in the cluster (allocated through the metadata
/// quorum), for an idempotent producer: it stamps the id, the epoch and a
/// per-partition sequence into every batch so the leader writes each batch once,
/// however often it is retried.
///
/// Version 1 (issue 20): with a transactional id, the transaction coordinator
/// of that id answers (FindCoordinator with `CoordinatorKind::Transaction`):
/// the id keeps its producer id and gets the next epoch, which fences every
/// older instance of it, and an open transaction of the older instance is
/// aborted first (answered CONCURRENT_TRANSACTIONS until that is done).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct InitProducerIdRequest {
    pub transactional_id: Option<String>,
    /// How long a transaction may stay open before the coordinator aborts it.
    pub transaction_timeout_ms: i32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitProducerIdResponse {
    pub producer_id: i64,
    pub producer_epoch: i16,
}

impl ApiRequest for InitProducerIdRequest {
    const KEY: ApiKey = ApiKey::InitProducerId;
    const VERSION: u16 = 1;
    type Response = InitProducerIdResponse;
}

// ---------------------------------------------------------------- api versions

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiVersionsRequest {
    /// Free text naming the client, for the broker's logs (`rill-cli/0.1.0`).
    pub client_software: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiVersionRange {
    pub api_key: u16,
    pub min_version: u16,
    pub max_version: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiVersionsResponse {
    pub broker_id: i32,
    pub cluster_id: String,
    pub software: String,
    pub apis: Vec<ApiVersionRange>,
    /// The largest request frame the broker accepts.
    pub max_request_bytes: u32,
}

impl ApiRequest for ApiVersionsRequest {
    const KEY: ApiKey = ApiKey::ApiVersions;
    type Response = ApiVersionsResponse;
}

// ---------------------------------------------------------------- metadata

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataRequest {
    /// Topics to describe; `None` for all topics.
    pub topics: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerInfo {
    pub id: i32,
    /// The address clients connect to, `host:port` (UDP).
    pub addr: String,
    pub rack: Option<String>,
    pub alive: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMetadata {
    pub partition: u32,
    pub error: Option<ErrorInfo>,
    pub leader: Option<i32>,
    pub leader_epoch: LeaderEpoch,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub log_start_offset: Offset,
    pub high_watermark: Offset,
    pub log_end_offset: Offset,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMetadata {
    pub name: String,
    pub error: Option<ErrorInfo>,
    pub internal: bool,
    pub partitions: Vec<PartitionMetadata>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataResponse {
    pub cluster_id: String,
    pub controller_id: Option<i32>,
    pub brokers: Vec<BrokerInfo>,
    pub topics: Vec<TopicMetadata>,
}

impl ApiRequest for MetadataRequest {
    const KEY: ApiKey = ApiKey::Metadata;
    type Response = MetadataResponse;
}

// ---------------------------------------------------------------- topics

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewTopic {
    pub name: String,
    /// `None`: the broker default (`num.partitions`).
    pub partitions: Option<u32>,
    /// `None`: the broker default (`default.replication.factor`).
    pub replication_factor: Option<u16>,
    /// Topic configs by Kafka name (`retention.ms`, `cleanup.policy`, ...).
    pub configs: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTopicsRequest {
    pub topics: Vec<NewTopic>,
    /// Check everything, create nothing.
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicResult {
    pub name: String,
    pub error: Option<ErrorInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTopicsResponse {
    pub results: Vec<TopicResult>,
}

impl ApiRequest for CreateTopicsRequest {
    const KEY: ApiKey = ApiKey::CreateTopics;
    type Response = CreateTopicsResponse;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteTopicsRequest {
    pub names: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteTopicsResponse {
    pub results: Vec<TopicResult>,
}

impl ApiRequest for DeleteTopicsRequest {
    const KEY: ApiKey = ApiKey::DeleteTopics;
    type Response = DeleteTopicsResponse;
}

// ---------------------------------------------------------------- configs

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeConfigsRequest {
    pub topics: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigEntry {
    pub name: String,
    pub value: String,
    /// True when the value is the broker default, not set on the topic.
    pub is_default: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfigs {
    pub name: String,
    pub error: Option<ErrorInfo>,
    pub configs: Vec<ConfigEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeConfigsResponse {
    pub topics: Vec<TopicConfigs>,
}

impl ApiRequest for DescribeConfigsRequest {
    const KEY: ApiKey = ApiKey::DescribeConfigs;
    type Response = DescribeConfigsResponse;
}

/// Incremental alteration of one topic's configs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlterConfigsRequest {
    pub topic: String,
    /// Keys to set (overriding the broker default).
    pub set: Vec<(String, String)>,
    /// Keys to remove from the topic (back to the broker default).
    pub delete: Vec<String>,
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlterConfigsResponse {
    pub error: Option<ErrorInfo>,
}

impl ApiRequest for AlterConfigsRequest {
    const KEY: ApiKey = ApiKey::AlterConfigs;
    type Response = AlterConfigsResponse;
}

/// Raises a topic's partition count to `count` (needs alter on the topic);
/// the new partitions get replicas like the topic's first one has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatePartitionsRequest {
    pub topic: String,
    /// The new total.
    pub count: u32,
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatePartitionsResponse {
    pub error: Option<ErrorInfo>,
}

impl ApiRequest for CreatePartitionsRequest {
    const KEY: ApiKey = ApiKey::CreatePartitions;
    type Response = CreatePartitionsResponse;
}

/// The idempotent producers the leaders of these partitions remember (needs
/// read on each topic; Kafka's DescribeProducers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeProducersRequest {
    pub partitions: Vec<super::TopicPartitions>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerDescription {
    pub producer_id: i64,
    pub epoch: i16,
    /// The sequence of its last record in the partition.
    pub last_sequence: i32,
    /// The max timestamp of its latest batch.
    pub last_timestamp: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionProducers {
    pub topic: String,
    pub partition: u32,
    /// NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION.
    pub error: Option<ErrorInfo>,
    pub producers: Vec<ProducerDescription>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeProducersResponse {
    pub partitions: Vec<PartitionProducers>,
}

impl ApiRequest for DescribeProducersRequest {
    const KEY: ApiKey = ApiKey::DescribeProducers;
    type Response = DescribeProducersResponse;
}

// ---------------------------------------------------------------- produce

/// How many replicas must have a batch before the leader answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Acks {
    /// acks=0: the broker sends no response; the client does not wait.
    None,
    /// acks=1: the leader has appended it.
    Leader,
    /// acks=all (-1): every in-sync replica has it (and min.insync.replicas holds).
    #[default]
    All,
}

impl std::str::FromStr for Acks {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "0" | "none" => Ok(Acks::None),
            "1" | "leader" => Ok(Acks::Leader),
            "all" | "-1" => Ok(Acks::All),
            other => Err(format!("invalid acks '{other}' (expected 0, 1 or all)")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducePartition {
    pub topic: String,
    pub partition: u32,
    /// Bytes of this partition's batches in the frame payload.
    pub bytes_len: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProduceRequest {
    pub acks: Acks,
    /// How long the broker may wait for replication before answering REQUEST_TIMED_OUT.
    pub timeout_ms: u32,
    pub partitions: Vec<ProducePartition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducePartitionResponse {
    pub topic: String,
    pub partition: u32,
    pub error: Option<ErrorInfo>,
    /// The offset given to the first record of the first batch.
    pub base_offset: Offset,
    pub log_start_offset: Offset,
    /// Set when the topic uses log-append time.
    pub log_append_time_ms: Option<TimestampMs>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProduceResponse {
    pub partitions: Vec<ProducePartitionResponse>,
}

impl ApiRequest for ProduceRequest {
    const KEY: ApiKey = ApiKey::Produce;
    type Response = ProduceResponse;
}

// ---------------------------------------------------------------- fetch

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchPartition {
    pub topic: String,
    pub partition: u32,
    pub offset: Offset,
    /// The most bytes to return for this partition (at least one batch is returned
    /// even if larger, so a consumer can always make progress).
    pub max_bytes: u32,
    /// The leader epoch the fetcher believes current, for fencing; `None` skips the check.
    pub current_leader_epoch: Option<LeaderEpoch>,
}

/// What a consumer may read (Kafka's isolation.level).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Isolation {
    /// Everything below the high watermark, open and aborted transactions
    /// included (the default, as in Kafka).
    #[default]
    ReadUncommitted,
    /// Only below the last stable offset; the response lists the aborted
    /// transactions in range so the reader skips their records.
    ReadCommitted,
}

/// One aborted transaction a `read_committed` reader must skip: the
/// transactional batches of `producer_id` from `first_offset` to its abort
/// marker at `last_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortedRange {
    pub producer_id: i64,
    pub first_offset: Offset,
    pub last_offset: Offset,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchRequest {
    /// Long-poll: wait up to this long for `min_bytes` to be available.
    pub max_wait_ms: u32,
    pub min_bytes: u32,
    /// The most bytes for the whole response.
    pub max_bytes: u32,
    /// Set by a follower replica (its broker id); `None` for consumers.
    pub replica_id: Option<i32>,
    /// Followers read uncommitted (up to the log end, whatever it says).
    pub isolation: Isolation,
    pub partitions: Vec<FetchPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchPartitionResponse {
    pub topic: String,
    pub partition: u32,
    pub error: Option<ErrorInfo>,
    pub high_watermark: Offset,
    /// Below it no transaction is open (the high watermark when none is).
    pub last_stable_offset: Offset,
    pub log_start_offset: Offset,
    /// `read_committed` only: the aborted transactions overlapping the data.
    pub aborted: Vec<AbortedRange>,
    /// Bytes of this partition's batches in the frame payload.
    pub bytes_len: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchResponse {
    pub partitions: Vec<FetchPartitionResponse>,
}

impl ApiRequest for FetchRequest {
    const KEY: ApiKey = ApiKey::Fetch;
    /// 1: isolation, the last stable offset and aborted transactions (issue 20).
    const VERSION: u16 = 1;
    type Response = FetchResponse;
}

// ---------------------------------------------------------------- list offsets

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OffsetSpec {
    Earliest,
    Latest,
    /// The first offset whose timestamp is at or after this time.
    Timestamp(TimestampMs),
    /// The last stable offset: the end a `read_committed` reader sees.
    LastStable,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListOffsetsPartition {
    pub topic: String,
    pub partition: u32,
    pub spec: OffsetSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListOffsetsRequest {
    pub partitions: Vec<ListOffsetsPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListOffsetsPartitionResponse {
    pub topic: String,
    pub partition: u32,
    pub error: Option<ErrorInfo>,
    /// The offset found; for a timestamp past the last record, the log end offset.
    pub offset: Offset,
    /// The timestamp of the record found, when looking up by timestamp.
    pub timestamp_ms: Option<TimestampMs>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListOffsetsResponse {
    pub partitions: Vec<ListOffsetsPartitionResponse>,
}

impl ApiRequest for ListOffsetsRequest {
    const KEY: ApiKey = ApiKey::ListOffsets;
    type Response = ListOffsetsResponse;
}

// ---------------------------------------------------------------- broker stats

/// What the answering broker itself has served since it started: its version,
/// record bytes in and out, and per class of api (`produce`, `fetch`,
/// `other`) the requests and a histogram of their latencies. Counters only
/// grow; a reader takes rates and quantiles from the difference of two
/// answers. Version 0.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DescribeBrokerStatsRequest {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeBrokerStatsResponse {
    pub broker_id: i32,
    /// The broker's release (`rill --version`).
    pub version: String,
    /// When it started, and now, by its clock (ms since the Unix epoch).
    pub started_ms: i64,
    pub now_ms: i64,
    /// Record batch bytes produced to it, and fetched from it by consumers
    /// (followers' fetches not counted).
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Upper bounds of the latency buckets, microseconds; each histogram has
    /// one more bucket, for slower requests.
    pub latency_bounds_us: Vec<u64>,
    pub apis: Vec<ApiStats>,
}

/// Requests of one class of api and their latencies (from the request's
/// arrival to its answer, a fetch's long-poll wait included).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiStats {
    /// `produce`, `fetch` or `other`.
    pub class: String,
    pub requests: u64,
    /// Requests per latency bucket (`latency_bounds_us`, then the rest).
    pub latency_buckets: Vec<u64>,
}

impl ApiRequest for DescribeBrokerStatsRequest {
    const KEY: ApiKey = ApiKey::DescribeBrokerStats;
    type Response = DescribeBrokerStatsResponse;
}

// ---------------------------------------------------------------- describe storage

/// Where each partition of some topics keeps its data: on local disk, in the
/// object store (tiered storage), or both. Version 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeStorageRequest {
    pub topics: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionStorage {
    pub topic: String,
    pub partition: u32,
    pub error: Option<ErrorInfo>,
    /// The first offset kept anywhere (the remote copy included).
    pub log_start_offset: Offset,
    /// The first offset on the broker's local disk.
    pub local_log_start_offset: Offset,
    pub log_end_offset: Offset,
    pub local_size_bytes: u64,
    /// Bytes of the segments in the object store (0 when none or tiering is off).
    pub remote_size_bytes: u64,
    pub remote_segments: u32,
    /// The offset after the last remote segment (`log_start_offset` when none).
    pub remote_end_offset: Offset,
    /// The topic's `remote.storage.enable`.
    pub remote_storage_enable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeStorageResponse {
    /// The object store the broker tiers to (its URL without credentials), if any.
    pub object_store: Option<String>,
    pub partitions: Vec<PartitionStorage>,
}

impl ApiRequest for DescribeStorageRequest {
    const KEY: ApiKey = ApiKey::DescribeStorage;
    type Response = DescribeStorageResponse;
}
