//! `BrokerState`: what every request handler and background task shares.
//!
//! Invariant: immutable after start except through its own synchronised parts
//! (the topic registry, the produce budget, the connection count).

use crate::config::BrokerConfig;
use crate::group::GroupService;
use crate::metrics::BrokerMetrics;
use crate::topics::TopicRegistry;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

#[derive(Debug)]
pub struct BrokerState {
    pub config: BrokerConfig,
    pub cluster_id: String,
    /// The address clients are told to use.
    pub advertised: String,
    pub registry: Arc<TopicRegistry>,
    /// This broker's membership in the metadata quorum.
    pub cluster: Arc<crate::cluster::Cluster>,
    pub metrics: BrokerMetrics,
    /// Cancelled when the broker starts shutting down.
    pub shutdown: CancellationToken,
    /// One permit per byte of produce payload being appended.
    pub produce_budget: Arc<Semaphore>,
    /// The budget's size (permits), at most `u32::MAX`.
    pub produce_budget_permits: u32,
    /// Open connections.
    pub connections: AtomicUsize,
    /// Tiered storage, when an object store is configured.
    pub tier: Option<Arc<crate::tier::Tier>>,
    /// The group coordinator.
    pub groups: Arc<GroupService>,
    /// The transaction coordinator.
    pub txns: crate::txn::service::TxnService,
    /// The open-file limit after start raised it (it bounds the partitions).
    pub open_files: crate::open_files::OpenFileLimit,
    /// The auth mode and super users: the checks the router makes.
    pub auth: crate::auth::Authorizer,
    /// Byte-rate quota buckets by principal.
    pub quotas: crate::quota::Quotas,
    /// How this broker connects to its peers (and to itself, for the transform
    /// supervisor): the CA it trusts and its broker certificate.
    pub peer_tls: rill_net::ClientTls,
    /// The certificate (and client-certificate policy) this broker presents to
    /// clients: QUIC's, and the Kafka listener's with `[kafka] tls`.
    pub server_tls: rill_net::ServerTls,
    /// The data disk's free space and reserve (`min_free_bytes`).
    pub disk: crate::disk::DiskSpace,
}

impl BrokerState {
    /// The leader of `topic`-`index`: the local partition's view where this
    /// broker is a replica (it moves with the roles reconcile applied), the
    /// committed image's elsewhere (a broker holds no log of a partition it is
    /// not a replica of).
    pub fn leader_of(&self, topic: &crate::partition::Topic, index: u32) -> Option<i32> {
        match topic.partition(index) {
            Some(p) => p.leader(),
            None => self
                .cluster
                .image()
                .topics
                .get(&*topic.name)
                .and_then(|t| t.partitions.get(index as usize))
                .and_then(|p| p.leader),
        }
    }
}
