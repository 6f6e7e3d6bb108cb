//! The broker's resource bounds on the request path, in one place: the
//! broker-wide memory budget of request bodies ([`RequestBudget`]), the
//! connections per IP address ([`ConnectionsPerIp`]), and the caps on element
//! counts in one request ([`check_counts`]).
//!
//! Invariants:
//! - A request body is read only after its declared length is charged to the
//!   [`RequestBudget`] (`max_inflight_request_bytes`); nothing is allocated from
//!   a declared length before then. The charge is released when the request's
//!   reply is written (the [`BudgetPermit`] lives that long), so the bytes of
//!   request bodies held by the broker (read, being handled or answered) never
//!   exceed the budget. A stream waiting for the budget is not read, so QUIC
//!   flow control stops its sender.
//! - Requests of at most [`SMALL_REQUEST_BYTES_MAX`] bytes have a lane of their
//!   own inside the budget (1/8 of it, at most [`SMALL_LANE_BYTES_MAX`]), so
//!   metadata, heartbeats and fetches are answered while large requests wait
//!   for the rest; the budget's total is still the bound.
//! - An IP address holds at most `max_connections_per_ip` connections,
//!   handshakes in progress included; a slot is released when its
//!   [`IpSlot`] drops (when the connection's task ends).
//! - Every api's request is checked against the caps of [`check_counts`]
//!   before its handler runs (the router calls it right after decoding); the
//!   match over [`ApiKey`] is exhaustive, so a new api must say what it counts.
//!
//! Not here: quotas (bytes or requests per second per client), per-connection
//! fairness inside the budget, the memory of responses (a Fetch answer's bytes
//! are bounded by its own `max_bytes`), and what quinn buffers for streams the
//! broker has not read yet (bounded per connection by the QUIC receive window).

use rill_proto::wire::*;
use std::any::Any;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Requests whose body is at most this many bytes may use the small lane.
pub const SMALL_REQUEST_BYTES_MAX: u32 = 64 * 1024;
/// Upper bound of the small lane (1/8 of the budget below it).
pub const SMALL_LANE_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// The part of a budget of `total` bytes kept for small requests.
pub fn small_lane_bytes(total: u64) -> u64 {
    (total / 8).min(SMALL_LANE_BYTES_MAX)
}

/// The most one request may hold of a budget of `total` bytes (the budget
/// without the small lane). Config validation keeps it at least
/// `max_request_bytes`.
pub fn large_lane_bytes(total: u64) -> u64 {
    total - small_lane_bytes(total)
}

/// The broker-wide budget of request body bytes held at once.
#[derive(Debug)]
pub struct RequestBudget {
    total: u64,
    large: Arc<Semaphore>,
    large_bytes: u64,
    small: Arc<Semaphore>,
    /// Bodies up to this size may use the small lane.
    small_max: u32,
}

/// A request's charge against the [`RequestBudget`]; released on drop.
#[derive(Debug)]
pub struct BudgetPermit {
    _permit: Option<OwnedSemaphorePermit>,
}

/// Why a request was not charged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetRefusal {
    /// The body alone is larger than what one request may hold of the budget.
    TooLarge {
        body_len: u32,
        lane_bytes: u64,
        total: u64,
    },
}

impl BudgetRefusal {
    /// The error a refused request is answered with.
    pub fn error_info(&self) -> ErrorInfo {
        match self {
            BudgetRefusal::TooLarge {
                body_len,
                lane_bytes,
                total,
            } => ErrorInfo::new(
                ErrorCode::RequestTooLarge,
                format!(
                    "a request body of {body_len} bytes is more than one request may hold of the \
                     broker's request memory budget ({lane_bytes} of max_inflight_request_bytes={total}): \
                     send smaller requests or raise the broker's max_inflight_request_bytes"
                ),
            ),
        }
    }
}

impl RequestBudget {
    /// A budget of `total` bytes (at most `Semaphore::MAX_PERMITS`).
    pub fn new(total: u64) -> RequestBudget {
        let total = total.min(Semaphore::MAX_PERMITS as u64);
        let small_bytes = small_lane_bytes(total);
        let large_bytes = total - small_bytes;
        RequestBudget {
            total,
            large: Arc::new(Semaphore::new(large_bytes as usize)),
            large_bytes,
            small: Arc::new(Semaphore::new(small_bytes as usize)),
            small_max: SMALL_REQUEST_BYTES_MAX.min(small_bytes.min(u32::MAX as u64) as u32),
        }
    }

    /// The budget's size in bytes.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes not charged to any request right now (both lanes).
    pub fn available(&self) -> u64 {
        (self.large.available_permits() + self.small.available_permits()) as u64
    }

    /// Charges a body of `body_len` bytes, waiting (first come, first served
    /// within a lane) until the budget has room. Refuses at once a body that
    /// could never fit. Cancel-safe: dropping the future gives nothing back
    /// because nothing was taken.
    pub async fn acquire(&self, body_len: u32) -> Result<BudgetPermit, BudgetRefusal> {
        if body_len == 0 {
            return Ok(BudgetPermit { _permit: None });
        }
        if body_len <= self.small_max {
            // Free room in the large lane first; otherwise wait in the small lane,
            // never behind large requests.
            if let Ok(p) = self.large.clone().try_acquire_many_owned(body_len) {
                return Ok(BudgetPermit { _permit: Some(p) });
            }
            let p = self
                .small
                .clone()
                .acquire_many_owned(body_len)
                .await
                .expect("the budget's semaphores are never closed");
            return Ok(BudgetPermit { _permit: Some(p) });
        }
        if u64::from(body_len) > self.large_bytes {
            return Err(BudgetRefusal::TooLarge {
                body_len,
                lane_bytes: self.large_bytes,
                total: self.total,
            });
        }
        let p = self
            .large
            .clone()
            .acquire_many_owned(body_len)
            .await
            .expect("the budget's semaphores are never closed");
        Ok(BudgetPermit { _permit: Some(p) })
    }
}

/// Connections per IP address (IPv4-mapped IPv6 addresses count as IPv4).
#[derive(Debug)]
pub struct ConnectionsPerIp {
    max: usize,
    open: parking_lot::Mutex<HashMap<IpAddr, usize>>,
    /// When a refusal was last logged (ms since the epoch): at most one a second.
    last_warned_ms: AtomicU64,
}

/// One connection's place in [`ConnectionsPerIp`]; released on drop.
#[derive(Debug)]
pub struct IpSlot {
    limits: Arc<ConnectionsPerIp>,
    ip: IpAddr,
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut open = self.limits.open.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

impl ConnectionsPerIp {
    pub fn new(max: usize) -> Arc<ConnectionsPerIp> {
        Arc::new(ConnectionsPerIp {
            max,
            open: parking_lot::Mutex::new(HashMap::new()),
            last_warned_ms: AtomicU64::new(0),
        })
    }

    /// A slot for one more connection from `ip`, or None when it holds `max`.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<IpSlot> {
        let ip = ip.to_canonical();
        let mut open = self.open.lock();
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            limits: self.clone(),
            ip,
        })
    }

    /// Connections `ip` holds now.
    pub fn open(&self, ip: IpAddr) -> usize {
        self.open
            .lock()
            .get(&ip.to_canonical())
            .copied()
            .unwrap_or(0)
    }

    /// Whether a refusal should be logged now (at most one a second, so a flood
    /// of refused connections does not flood the log).
    pub fn should_warn(&self) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let last = self.last_warned_ms.load(Ordering::Relaxed);
        now >= last + 1000
            && self
                .last_warned_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// Most partitions one request may name (Produce, Fetch, ListOffsets,
/// OffsetCommit, OffsetFetch, a heartbeat's owned partitions). A follower
/// fetches every partition it follows from one leader in one request, so this
/// is far above the partitions of one broker.
pub const PARTITIONS_PER_REQUEST_MAX: usize = 100_000;
/// Most topics one request may name (Metadata, CreateTopics, DeleteTopics,
/// DescribeConfigs, DescribeStorage, ElectLeaders, a heartbeat's subscription).
pub const TOPICS_PER_REQUEST_MAX: usize = 10_000;
/// Most config entries one topic may carry in a request (CreateTopics per
/// topic, AlterConfigs set + delete).
pub const CONFIGS_PER_TOPIC_MAX: usize = 1_000;
/// Most group ids one request may name (DescribeGroups, DeleteGroups).
pub const GROUP_IDS_PER_REQUEST_MAX: usize = 10_000;
/// Most members one request may name (SyncGroup's assignments, LeaveGroup).
pub const MEMBERS_PER_REQUEST_MAX: usize = 10_000;
/// Most protocols a member may offer in one JoinGroup (Kafka clients send
/// one per assignor they are configured with).
pub const PROTOCOLS_PER_JOIN_MAX: usize = 64;
/// Most broker ids one request may list (AlterPartition's ISR).
pub const BROKERS_PER_REQUEST_MAX: usize = 10_000;

/// What a counted field holds, with its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Elements {
    Partitions,
    Topics,
    Configs,
    GroupIds,
    Members,
    Protocols,
    Brokers,
}

impl Elements {
    fn cap(self) -> (usize, &'static str, &'static str) {
        match self {
            Elements::Partitions => (
                PARTITIONS_PER_REQUEST_MAX,
                "partitions",
                "PARTITIONS_PER_REQUEST_MAX",
            ),
            Elements::Topics => (TOPICS_PER_REQUEST_MAX, "topics", "TOPICS_PER_REQUEST_MAX"),
            Elements::Configs => (
                CONFIGS_PER_TOPIC_MAX,
                "config entries",
                "CONFIGS_PER_TOPIC_MAX",
            ),
            Elements::GroupIds => (
                GROUP_IDS_PER_REQUEST_MAX,
                "group ids",
                "GROUP_IDS_PER_REQUEST_MAX",
            ),
            Elements::Members => (
                MEMBERS_PER_REQUEST_MAX,
                "members",
                "MEMBERS_PER_REQUEST_MAX",
            ),
            Elements::Protocols => (
                PROTOCOLS_PER_JOIN_MAX,
                "protocols",
                "PROTOCOLS_PER_JOIN_MAX",
            ),
            Elements::Brokers => (
                BROKERS_PER_REQUEST_MAX,
                "broker ids",
                "BROKERS_PER_REQUEST_MAX",
            ),
        }
    }
}

/// One counted field of a request.
type Count = (&'static str, usize, Elements);

fn partitions_in(lists: &[TopicPartitions]) -> usize {
    lists.iter().map(|t| t.partitions.len()).sum()
}

/// `f` applied to `request` as an `R`; nothing counted (and a debug assertion)
/// if it is not one.
fn of<R: 'static>(request: &dyn Any, f: impl FnOnce(&R) -> Vec<Count>) -> Vec<Count> {
    match request.downcast_ref::<R>() {
        Some(r) => f(r),
        None => {
            debug_assert!(
                false,
                "check_counts got a request of another type than {}",
                std::any::type_name::<R>()
            );
            Vec::new()
        }
    }
}

/// The counted fields of a request of `api`.
fn counts(api: ApiKey, request: &dyn Any) -> Vec<Count> {
    use Elements::*;
    match api {
        ApiKey::ApiVersions
        | ApiKey::DescribeBrokerStats
        | ApiKey::InitProducerId
        | ApiKey::FindCoordinator
        | ApiKey::ListGroups
        | ApiKey::GroupHeartbeat
        | ApiKey::RaftRpc
        | ApiKey::JoinCluster
        | ApiKey::BrokerHeartbeat
        | ApiKey::MetadataWrite
        | ApiKey::OffsetForLeaderEpoch
        | ApiKey::DescribeAcls
        | ApiKey::AlterQuotas
        | ApiKey::DescribeQuotas
        | ApiKey::DescribeUsers
        | ApiKey::CreatePartitions => Vec::new(),
        // One credential per mechanism (two), checked before proposing
        // (cluster::command_checks).
        ApiKey::AlterUser => Vec::new(),
        // Rules per request are bounded where they are checked
        // (cluster::api::ACL_RULES_PER_REQUEST_MAX).
        ApiKey::CreateAcls | ApiKey::DeleteAcls => Vec::new(),
        ApiKey::Metadata => of::<MetadataRequest>(request, |r| {
            vec![("topics", r.topics.as_ref().map_or(0, Vec::len), Topics)]
        }),
        ApiKey::CreateTopics => of::<CreateTopicsRequest>(request, |r| {
            let configs = r.topics.iter().map(|t| t.configs.len()).max();
            vec![
                ("topics", r.topics.len(), Topics),
                ("topics[].configs", configs.unwrap_or(0), Configs),
            ]
        }),
        ApiKey::DeleteTopics => {
            of::<DeleteTopicsRequest>(request, |r| vec![("names", r.names.len(), Topics)])
        }
        ApiKey::DescribeConfigs => {
            of::<DescribeConfigsRequest>(request, |r| vec![("topics", r.topics.len(), Topics)])
        }
        ApiKey::AlterConfigs => of::<AlterConfigsRequest>(request, |r| {
            vec![("set + delete", r.set.len() + r.delete.len(), Configs)]
        }),
        ApiKey::Produce => of::<ProduceRequest>(request, |r| {
            vec![("partitions", r.partitions.len(), Partitions)]
        }),
        ApiKey::Fetch => of::<FetchRequest>(request, |r| {
            vec![("partitions", r.partitions.len(), Partitions)]
        }),
        ApiKey::DescribeProducers => of::<DescribeProducersRequest>(request, |r| {
            vec![
                ("partitions", r.partitions.len(), Topics),
                (
                    "partitions[].partitions",
                    partitions_in(&r.partitions),
                    Partitions,
                ),
            ]
        }),
        ApiKey::ListOffsets => of::<ListOffsetsRequest>(request, |r| {
            vec![("partitions", r.partitions.len(), Partitions)]
        }),
        ApiKey::DescribeStorage => {
            of::<DescribeStorageRequest>(request, |r| vec![("topics", r.topics.len(), Topics)])
        }
        ApiKey::ConsumerGroupHeartbeat => of::<ConsumerGroupHeartbeatRequest>(request, |r| {
            vec![
                ("subscribed_topics", r.subscribed_topics.len(), Topics),
                ("owned", r.owned.len(), Topics),
                ("owned[].partitions", partitions_in(&r.owned), Partitions),
            ]
        }),
        ApiKey::OffsetCommit => of::<OffsetCommitRequest>(request, |r| {
            vec![("partitions", r.partitions.len(), Partitions)]
        }),
        ApiKey::OffsetFetch => of::<OffsetFetchRequest>(request, |r| {
            let lists = r.partitions.as_deref().unwrap_or(&[]);
            vec![
                ("partitions", lists.len(), Topics),
                ("partitions[].partitions", partitions_in(lists), Partitions),
            ]
        }),
        ApiKey::DescribeGroups => of::<DescribeGroupsRequest>(request, |r| {
            vec![("group_ids", r.group_ids.len(), GroupIds)]
        }),
        ApiKey::DeleteGroups => of::<DeleteGroupsRequest>(request, |r| {
            vec![("group_ids", r.group_ids.len(), GroupIds)]
        }),
        ApiKey::JoinGroup => of::<JoinGroupRequest>(request, |r| {
            vec![("protocols", r.protocols.len(), Protocols)]
        }),
        ApiKey::SyncGroup => of::<SyncGroupRequest>(request, |r| {
            vec![("assignments", r.assignments.len(), Members)]
        }),
        ApiKey::LeaveGroup => {
            of::<LeaveGroupRequest>(request, |r| vec![("members", r.members.len(), Members)])
        }
        ApiKey::AlterPartition => {
            of::<AlterPartitionRequest>(request, |r| vec![("new_isr", r.new_isr.len(), Brokers)])
        }
        ApiKey::ElectLeaders => of::<ElectLeadersRequest>(request, |r| {
            vec![("topics", r.topics.as_ref().map_or(0, Vec::len), Topics)]
        }),
        ApiKey::TransformWrite => of::<TransformWriteRequest>(request, |r| {
            vec![("inputs + outputs", r.inputs.len() + r.outputs.len(), Topics)]
        }),
        ApiKey::CheckAccess => {
            of::<CheckAccessRequest>(request, |r| vec![("checks", r.checks.len(), Topics)])
        }
        ApiKey::EndTxn => Vec::new(),
        ApiKey::DescribeTransactions => of::<DescribeTransactionsRequest>(request, |r| {
            vec![("transactional_ids", r.transactional_ids.len(), GroupIds)]
        }),
        ApiKey::ListTransactions => of::<ListTransactionsRequest>(request, |r| {
            vec![
                ("states", r.states.len(), Configs),
                ("producer_ids", r.producer_ids.len(), GroupIds),
            ]
        }),
        ApiKey::TxnOffsetCommit => of::<TxnOffsetCommitRequest>(request, |r| {
            vec![("partitions", r.partitions.len(), Partitions)]
        }),
        ApiKey::CommitTxnOffsets => of::<CommitTxnOffsetsRequest>(request, |r| {
            vec![("partitions", r.partitions.len(), Partitions)]
        }),
        ApiKey::AddPartitionsToTxn => of::<AddPartitionsToTxnRequest>(request, |r| {
            vec![
                ("topics", r.topics.len(), Topics),
                (
                    "topics[].partitions",
                    txn_partitions_in(&r.topics),
                    Partitions,
                ),
            ]
        }),
        ApiKey::WriteTxnMarkers => of::<WriteTxnMarkersRequest>(request, |r| {
            vec![
                ("topics", r.topics.len(), Topics),
                (
                    "topics[].partitions",
                    txn_partitions_in(&r.topics),
                    Partitions,
                ),
            ]
        }),
    }
}

/// Partitions of every topic of a transactional request.
fn txn_partitions_in(topics: &[TxnTopic]) -> usize {
    topics.iter().map(|t| t.partitions.len()).sum()
}

/// Checks a decoded request of `api` against the element caps; the error
/// (POLICY_VIOLATION) names the api, the field, the count and the cap.
/// `request` is the decoded request of `api`'s type.
pub fn check_counts(api: ApiKey, request: &dyn Any) -> Result<(), ErrorInfo> {
    for (field, n, elements) in counts(api, request) {
        let (cap, what, name) = elements.cap();
        if n > cap {
            return Err(ErrorInfo::new(
                ErrorCode::PolicyViolation,
                format!(
                    "{} request lists {n} {what} in `{field}`, more than the {cap} one request may \
                     carry (rill_broker::limits::{name}): split it into several requests",
                    api.name()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn budget_charges_declared_bytes_and_releases_on_drop() {
        let budget = RequestBudget::new(8 << 20);
        assert_eq!(budget.total(), 8 << 20);
        assert_eq!(large_lane_bytes(8 << 20), 7 << 20);
        let a = budget.acquire(4 << 20).await.unwrap();
        assert_eq!(budget.available(), 4 << 20);
        // The large lane has 3 MiB left: a second 4 MiB body waits.
        let waiting = tokio::time::timeout(Duration::from_millis(100), budget.acquire(4 << 20));
        assert!(waiting.await.is_err());
        // A small request still gets in while large ones wait.
        let small = budget.acquire(1000).await.unwrap();
        drop(a);
        let b = tokio::time::timeout(Duration::from_secs(5), budget.acquire(4 << 20))
            .await
            .unwrap()
            .unwrap();
        drop((b, small));
        assert_eq!(budget.available(), 8 << 20);
    }

    #[tokio::test]
    async fn small_requests_use_their_lane_when_large_ones_hold_the_rest() {
        let budget = RequestBudget::new(8 << 20);
        let large = budget.acquire(7 << 20).await.unwrap();
        let mut small = Vec::new();
        // 1 MiB of small lane: 16 requests of 64 KiB.
        for _ in 0..16 {
            let p = tokio::time::timeout(
                Duration::from_secs(1),
                budget.acquire(SMALL_REQUEST_BYTES_MAX),
            );
            small.push(p.await.unwrap().unwrap());
        }
        assert_eq!(budget.available(), 0);
        let waiting = tokio::time::timeout(Duration::from_millis(50), budget.acquire(1)).await;
        assert!(waiting.is_err(), "the budget is used up");
        drop((large, small));
        assert_eq!(budget.available(), 8 << 20);
    }

    #[tokio::test]
    async fn a_body_larger_than_the_budget_is_refused_naming_the_key() {
        let budget = RequestBudget::new(8 << 20);
        let e = budget.acquire(7 << 20 | 1).await.unwrap_err().error_info();
        assert_eq!(e.code, ErrorCode::RequestTooLarge);
        assert!(e.message.contains("max_inflight_request_bytes"), "{e}");
        assert!(budget.acquire(0).await.is_ok());
    }

    #[test]
    fn connections_per_ip_are_counted_and_released() {
        let limits = ConnectionsPerIp::new(2);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let a = limits.admit(ip).unwrap();
        let b = limits.admit(mapped).unwrap();
        assert!(limits.admit(ip).is_none(), "a third from the same address");
        assert!(limits.admit("10.0.0.2".parse().unwrap()).is_some());
        assert_eq!(limits.open(ip), 2);
        drop(a);
        assert_eq!(limits.open(mapped), 1);
        let c = limits.admit(ip).unwrap();
        drop((b, c));
        assert_eq!(limits.open(ip), 0);
        assert!(limits.open.lock().is_empty(), "no entry left behind");
    }

    #[test]
    fn element_caps_name_api_field_and_cap() {
        let partition = |i: u32| FetchPartition {
            topic: "t".into(),
            partition: i,
            offset: rill_proto::Offset(0),
            max_bytes: 1,
            current_leader_epoch: None,
        };
        let mut fetch = FetchRequest {
            max_wait_ms: 0,
            min_bytes: 1,
            max_bytes: 1,
            replica_id: None,
            isolation: rill_proto::wire::Isolation::ReadUncommitted,
            partitions: (0..PARTITIONS_PER_REQUEST_MAX as u32)
                .map(partition)
                .collect(),
        };
        check_counts(ApiKey::Fetch, &fetch).unwrap();
        fetch.partitions.push(partition(0));
        let e = check_counts(ApiKey::Fetch, &fetch).unwrap_err();
        assert_eq!(e.code, ErrorCode::PolicyViolation);
        for part in ["fetch request", "`partitions`", "100001", "100000"] {
            assert!(e.message.contains(part), "{part}: {e}");
        }
        let groups = DeleteGroupsRequest {
            group_ids: vec!["g".into(); GROUP_IDS_PER_REQUEST_MAX + 1],
        };
        let e = check_counts(ApiKey::DeleteGroups, &groups).unwrap_err();
        assert!(e.message.contains("group_ids"), "{e}");
        let fetch_offsets = OffsetFetchRequest {
            group_id: "g".into(),
            partitions: Some(vec![TopicPartitions {
                topic: "t".into(),
                partitions: vec![0; PARTITIONS_PER_REQUEST_MAX + 1],
            }]),
            require_stable: false,
        };
        let e = check_counts(ApiKey::OffsetFetch, &fetch_offsets).unwrap_err();
        assert!(e.message.contains("partitions[].partitions"), "{e}");
        check_counts(ApiKey::Metadata, &MetadataRequest { topics: None }).unwrap();
    }
}
