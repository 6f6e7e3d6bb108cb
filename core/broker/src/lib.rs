//! rill-broker: the Rill broker daemon as a library — a QUIC server that owns
//! partition logs on local disk, replicates them among the brokers of a
//! cluster, and answers the wire protocol of `rill_proto::wire`.
//!
//! Every broker is a member of a cluster, a single broker included (a
//! one-voter metadata quorum): [`cluster`] runs the Raft quorum (openraft) that
//! holds the metadata image (brokers, topics, assignments, leaders, ISR,
//! configs), the controller's fencing and leader election, and the reconcile
//! loop that brings local partitions in line with each committed image;
//! followers fetch from leaders ([`cluster::replication`]). [`partition`] is one
//! hosted partition (its log and its [`replica::ReplicaState`]). Consumer groups:
//! [`group`] (coordinator state machine, assignors, the `__consumer_offsets`
//! records). Tiered storage: [`tier`]. What it is not: a client library
//! (rill-client) or the `rill` binary (rill-cli, which wraps this).
//!
//! Invariants:
//! - The metadata image is the only record of topics, partitions, assignments
//!   and configs; local partition directories (`<data_dir>/<topic>-<partition>/`)
//!   follow it, opened and deleted by reconcile only ([`topics`]). A change is
//!   committed to the quorum before any broker applies it.
//! - A bad request never panics a task or drops a connection; it is answered with
//!   an error on its own stream.
//! - Every task belongs to the broker's shutdown scope; `shutdown` stops
//!   accepting, lets in-flight requests finish (bounded by
//!   `shutdown_timeout_ms`), then flushes and closes every log.
//!
//! Modules: [`config`] (BrokerConfig, TOML), [`error`], [`metadata`] (the legacy
//! topics.toml, migrated once), [`partition`] (Partition, Topic), [`replica`]
//! (ReplicaState), [`topic_configs`] (the table of topic configs), [`topics`]
//! (TopicRegistry: the local partitions), `router` (every api registered once:
//! decode, version, authorize, metrics, encode), [`handlers`] (the data and admin
//! apis), `server` (QUIC accept / stream loop), [`front_door`] (typed calls
//! through the router for another protocol's listener: rill-kafka), [`limits`] (the request memory
//! budget, connections per IP, element caps per request), [`metrics`], [`tier`] (tiered
//! storage: uploads, manifests,
//! remote reads).

pub mod auth;
pub mod cluster;
pub mod config;
pub mod disk;
pub mod error;
pub mod fence;
pub mod front_door;
pub mod group;
pub mod handlers;
pub mod internal_topics;
pub mod limits;
pub mod metadata;
pub mod metrics;
pub mod open_files;
pub mod partition;
pub mod quota;
pub mod replica;
mod router;
mod server;
mod state;
#[cfg(test)]
mod test_broker;
pub mod tier;
pub mod topic_configs;
pub mod topics;
pub mod txn;

pub use config::{BrokerConfig, KafkaConfig, ObjectStoreConfig, TlsConfig, TransformsConfig};
pub use error::BrokerError;
pub use server::{CLOSE_SHUTDOWN, CLOSE_TOO_MANY_CONNECTIONS, REQUEST_READ_TIMEOUT};

use crate::metadata::{META_DIR, write_atomic};
use crate::state::BrokerState;
use crate::topics::TopicRegistry;
use rill_net::{ServerTls, TransportLimits};
use rill_proto::types::now_ms;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// File (in the metadata directory) holding the cluster id.
pub const CLUSTER_ID_FILE: &str = "cluster_id";
/// Longest wait for connections to drain after they are closed at shutdown.
pub const ENDPOINT_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The broker. Start one with [`Broker::start`].
#[derive(Debug)]
pub struct Broker;

/// A running broker: its address, and the way to stop it.
#[derive(Debug)]
pub struct BrokerHandle {
    local_addr: SocketAddr,
    state: Arc<BrokerState>,
    endpoint: quinn::Endpoint,
    tracker: TaskTracker,
}

impl Broker {
    /// Starts a broker: validates the config, creates the data directory,
    /// recovers every partition's log, binds the QUIC endpoint, and starts the
    /// background tasks. Must be called inside a Tokio runtime.
    pub async fn start(config: BrokerConfig) -> Result<BrokerHandle, BrokerError> {
        config.validate()?;
        let open_files = open_files::raise();
        if let Some(addr) = config.metrics {
            // Before the partitions register their gauges.
            metrics::install(addr)?;
        }
        // A bad object store URL fails the start before anything touches the disk.
        let tier = match &config.object_store {
            Some(os) => Some(Arc::new(tier::Tier::open(os)?)),
            None => None,
        };
        let load_config = config.clone();
        let (registry, cluster_id, groups, local_topics) = tokio::task::spawn_blocking(move || {
            let local_topics =
                crate::metadata::MetadataStore::open(&load_config.data_dir)?.load()?;
            let registry = TopicRegistry::open(&load_config)?;
            let cluster_id = load_or_create_cluster_id(&load_config.data_dir)?;
            let groups = group::GroupService::new(&load_config);
            Ok::<_, BrokerError>((registry, cluster_id, groups, local_topics))
        })
        .await
        .map_err(|e| BrokerError::Task(e.to_string()))??;
        let registry = Arc::new(registry);

        let broker_tls = broker_tls(&config)?;
        let tls = broker_tls.server.clone();
        let limits = TransportLimits {
            max_concurrent_bidi_streams: config.max_streams_per_connection,
            mtu_upper_bound: config.net.max_udp_payload_bytes,
            ..TransportLimits::default()
        };
        let endpoint = match rill_net::server_endpoint(config.listen, &tls, &limits) {
            Ok(endpoint) => endpoint,
            Err(e) => {
                let _ = registry.close_all();
                return Err(match e {
                    e @ (rill_net::NetError::AddrInUse { .. }
                    | rill_net::NetError::Socket { .. }) => BrokerError::Bind {
                        addr: config.listen,
                        source: e,
                    },
                    other => BrokerError::Tls(other),
                });
            }
        };
        let local_addr = endpoint.local_addr().map_err(|source| BrokerError::Bind {
            addr: config.listen,
            source: rill_net::NetError::Socket {
                action: "read the bound address of",
                addr: config.listen,
                source,
            },
        })?;

        rill_log::tail::set_limit(config.tail_cache_bytes);
        let permits = config.max_inflight_produce_bytes.min(u32::MAX as usize) as u32;
        let tls_mode = match (&config.tls.cert, &tls) {
            (
                Some(_),
                ServerTls::Files {
                    client_auth: rill_net::ClientAuth::Required(_),
                    ..
                },
            ) => "certificate files, client certificates required",
            (Some(_), _) => "certificate files",
            (None, _) => "development CA",
        };
        let tracker = TaskTracker::new();
        let shutdown = CancellationToken::new();
        let advertised = config.advertised(local_addr);
        let cluster = match cluster::Cluster::start(
            &config,
            &broker_tls.peer,
            advertised.clone(),
            local_topics,
            cluster_id.clone(),
            registry.fence().clone(),
            &tracker,
            shutdown.clone(),
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                shutdown.cancel();
                endpoint.close(CLOSE_SHUTDOWN, b"broker failed to start");
                let _ = registry.close_all();
                return Err(e);
            }
        };
        let solo = cluster.is_solo();
        if solo
            && tokio::time::timeout(cluster::LEADER_WAIT_MAX, cluster.wait_ready())
                .await
                .is_err()
        {
            // A one-broker cluster elects itself and registers in well under a
            // second; wait for it so the broker answers as the controller at once.
            tracing::warn!("the one-broker metadata quorum is not ready yet; continuing");
        }
        let state = Arc::new(BrokerState {
            advertised,
            cluster,
            cluster_id,
            registry,
            metrics: crate::metrics::BrokerMetrics::register(),
            shutdown,
            produce_budget: Arc::new(Semaphore::new(permits as usize)),
            produce_budget_permits: permits,
            connections: AtomicUsize::new(0),
            tier: tier.clone(),
            groups: Arc::new(groups),
            txns: Default::default(),
            open_files,
            auth: crate::auth::Authorizer::new(&config.auth),
            quotas: crate::quota::Quotas::default(),
            peer_tls: broker_tls.peer.clone(),
            server_tls: broker_tls.server.clone(),
            disk: crate::disk::DiskSpace::new(&config.data_dir, config.min_free_bytes),
            config,
        });
        // A single broker opens its partitions before it serves (a log that cannot
        // be recovered fails the start, naming it); in a cluster, reconcile opens
        // them once this broker has caught up with the quorum.
        let applied_first = solo && state.cluster.is_ready();
        if applied_first {
            let s = state.clone();
            let image = state.cluster.image();
            let failed = tokio::task::spawn_blocking(move || {
                cluster::reconcile::apply_image(&s, &image, None, true)
            })
            .await
            .map_err(|e| BrokerError::Task(e.to_string()))?;
            if let Some(e) = failed.into_iter().next() {
                state.shutdown.cancel();
                endpoint.close(CLOSE_SHUTDOWN, b"broker failed to start");
                state.cluster.shutdown().await;
                let _ = state.registry.close_all();
                return Err(e);
            }
        }
        if let Some(tier) = &tier {
            tier::upload::load_all(&state, tier).await;
        }
        tracker.spawn(server::accept_loop(
            state.clone(),
            endpoint.clone(),
            tracker.clone(),
        ));
        tracker.spawn(maintenance_loop(state.clone(), Maintenance::Tick));
        tracker.spawn(maintenance_loop(state.clone(), Maintenance::Clean));
        if let Some(tier) = &tier {
            tracker.spawn(tier::upload::run(state.clone(), tier.clone()));
            tracing::info!(object_store = %tier.url, "tiered storage on");
        }
        tracker.spawn(group::service::timer_loop(state.clone()));
        tracker.spawn(txn::service::timer_loop(state.clone()));
        tracker.spawn(cluster::reconcile::run(state.clone(), applied_first));
        tracing::info!(
            id = state.config.id,
            listen = %local_addr,
            advertised = %state.advertised,
            data_dir = %state.config.data_dir.display(),
            tls = tls_mode,
            auth = state.config.auth.mode.name(),
            topics = state.registry.all().len(),
            "broker started"
        );
        Ok(BrokerHandle {
            local_addr,
            state,
            endpoint,
            tracker,
        })
    }
}

impl BrokerHandle {
    /// The address the QUIC endpoint is bound to (the real port when `listen`
    /// asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address clients are told to use (`advertised_addr`, else `local_addr`).
    pub fn advertised_addr(&self) -> &str {
        &self.state.advertised
    }

    /// The way in for another protocol's listener (rill-kafka): typed calls
    /// through this broker's router, in its shutdown scope.
    pub fn front_door(&self) -> Arc<front_door::FrontDoor> {
        Arc::new(front_door::FrontDoor::new(
            self.state.clone(),
            self.tracker.clone(),
        ))
    }

    /// This broker's id.
    pub fn id(&self) -> i32 {
        self.state.config.id
    }

    /// The cluster id (persisted in the data directory).
    pub fn cluster_id(&self) -> &str {
        &self.state.cluster_id
    }

    /// How to connect to this broker as itself (its broker certificate and
    /// the CA it trusts): for the transform supervisor that runs beside it.
    pub fn self_tls(&self) -> rill_net::ClientTls {
        self.state.peer_tls.clone()
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.state.config.data_dir
    }

    /// Resolves once the broker has begun shutting down.
    pub async fn wait_closed(&self) {
        self.state.shutdown.cancelled().await
    }

    /// Stops the broker: no new connections or requests; in-flight requests
    /// finish (up to `shutdown_timeout_ms`); connections are closed; every log is
    /// flushed and closed.
    pub async fn shutdown(self) -> Result<(), BrokerError> {
        tracing::info!(id = self.state.config.id, "broker shutting down");
        self.state.shutdown.cancel();
        self.endpoint.set_server_config(None);
        self.tracker.close();
        let timeout = Duration::from_millis(self.state.config.shutdown_timeout_ms);
        if tokio::time::timeout(timeout, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                ?timeout,
                "in-flight requests did not finish within shutdown_timeout_ms; closing anyway"
            );
        }
        self.endpoint.close(CLOSE_SHUTDOWN, b"broker shutting down");
        let _ = tokio::time::timeout(ENDPOINT_DRAIN_TIMEOUT, self.endpoint.wait_idle()).await;
        self.state.cluster.shutdown().await;
        let registry = self.state.registry.clone();
        let closed = tokio::task::spawn_blocking(move || registry.close_all())
            .await
            .map_err(|e| BrokerError::Task(e.to_string()))?;
        tracing::info!(id = self.state.config.id, "broker stopped");
        closed
    }
}

impl Drop for BrokerHandle {
    /// A handle dropped without `shutdown` still stops the broker's tasks and
    /// endpoint (logs are then closed without a final flush when the last request
    /// lets go of them; prefer `shutdown`).
    fn drop(&mut self) {
        if !self.state.shutdown.is_cancelled() {
            self.state.shutdown.cancel();
            self.endpoint.close(CLOSE_SHUTDOWN, b"broker stopped");
        }
    }
}

/// Where a broker keeps the certificate the development CA issued it.
pub const BROKER_CERT_DIR: &str = "tls";

/// How this broker proves who it is: to clients and peers that connect to it
/// (`server`), and to the peers it connects to (`peer`).
#[derive(Debug, Clone)]
pub(crate) struct BrokerTls {
    pub server: ServerTls,
    pub peer: rill_net::ClientTls,
}

/// The broker's TLS: with `[tls] cert`/`key`, those files (and `ca`, which
/// clients and peers must chain to); otherwise a certificate the development CA
/// issues at every start, marked as broker `id`'s and written to
/// `<data>/__meta/tls/broker.pem` (key 0600), which the broker presents both to
/// its clients and, as a client certificate, to its peers. Clients may present
/// certificates (required with `--auth mtls`); who they name is their principal.
fn broker_tls(config: &BrokerConfig) -> Result<BrokerTls, BrokerError> {
    use rill_net::{ClientAuth, ClientTls};
    let mtls = config.auth.mode == crate::config::AuthMode::Mtls;
    if let (Some(cert), Some(key)) = (&config.tls.cert, &config.tls.key) {
        let client_auth = match &config.tls.ca {
            Some(ca) => ClientAuth::Required(ca.clone()),
            None => ClientAuth::None,
        };
        let peer = match &config.tls.ca {
            Some(ca) => ClientTls::Mutual {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            },
            None => ClientTls::Dev {
                home: config.rill_home.clone().unwrap_or_else(rill_net::rill_home),
            },
        };
        return Ok(BrokerTls {
            server: ServerTls::Files {
                cert: cert.clone(),
                key: key.clone(),
                client_auth,
            },
            peer,
        });
    }
    let home = config.rill_home.clone().unwrap_or_else(rill_net::rill_home);
    let mut names = Vec::new();
    // The host part of host:port, for the certificate's names.
    let host_of = |addr: &str| {
        addr.rsplit_once(':')
            .map_or(addr, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string()
    };
    if let Some(addr) = &config.advertised_addr {
        names.push(host_of(addr));
    }
    if !config.listen.ip().is_unspecified() {
        names.push(config.listen.ip().to_string());
    }
    // The Kafka listener (with `[kafka] tls`) presents the same certificate.
    if let Some(addr) = &config.kafka_advertised_addr {
        names.push(host_of(addr));
    }
    if let Some(kafka) = config.kafka_listen.filter(|k| !k.ip().is_unspecified()) {
        names.push(kafka.ip().to_string());
    }
    if let Some(host) = rill_net::tls::host_name() {
        names.push(host);
    }
    let ca = rill_net::ensure_dev_ca(&home).map_err(BrokerError::Tls)?;
    let (chain, key) = ca
        .issue_broker_cert(config.id, &names)
        .map_err(BrokerError::Tls)?;
    let dir = config.data_dir.join(META_DIR).join(BROKER_CERT_DIR);
    let (cert, key) =
        rill_net::write_cert_files(&dir, "broker", &chain, &key).map_err(BrokerError::Tls)?;
    let ca = ca.cert_path().to_path_buf();
    Ok(BrokerTls {
        server: ServerTls::Files {
            cert: cert.clone(),
            key: key.clone(),
            client_auth: if mtls {
                ClientAuth::Required(ca.clone())
            } else {
                ClientAuth::Optional(ca.clone())
            },
        },
        peer: ClientTls::Mutual { ca, cert, key },
    })
}

/// Reads the cluster id, creating it on first start.
fn load_or_create_cluster_id(data_dir: &Path) -> Result<String, BrokerError> {
    let dir: PathBuf = data_dir.join(META_DIR);
    let path = dir.join(CLUSTER_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(BrokerError::DataDir {
                action: "read the cluster id",
                path,
                source,
            });
        }
    }
    let id = format!("rill-{}", crate::metadata::new_topic_id());
    write_atomic(&dir, &path, format!("{id}\n").as_bytes()).map_err(|source| {
        BrokerError::DataDir {
            action: "write the cluster id",
            path: path.clone(),
            source,
        }
    })?;
    Ok(id)
}

#[derive(Debug, Clone, Copy)]
enum Maintenance {
    /// `flush.ms` and `segment.ms`, every `flush_check_interval_ms`.
    Tick,
    /// Retention and compaction, every `retention_check_interval_ms`.
    Clean,
}

/// Runs one kind of log maintenance on a timer until shutdown. The work itself
/// runs on the blocking pool, one partition at a time.
async fn maintenance_loop(state: Arc<BrokerState>, kind: Maintenance) {
    let every = Duration::from_millis(match kind {
        Maintenance::Tick => state.config.flush_check_interval_ms,
        Maintenance::Clean => state.config.retention_check_interval_ms,
    });
    let mut timer = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        let partitions = state.registry.partitions();
        let shutdown = state.shutdown.clone();
        let ran = tokio::task::spawn_blocking(move || {
            for p in partitions {
                if shutdown.is_cancelled() {
                    return;
                }
                let now = now_ms();
                match kind {
                    Maintenance::Tick => {
                        let _ = p.tick(now);
                    }
                    Maintenance::Clean => match p.clean(now) {
                        Ok((deleted, compacted)) if deleted > 0 || compacted => tracing::info!(
                            partition = %format!("{}-{}", p.topic(), p.index()),
                            segments_deleted = deleted,
                            compacted,
                            log_start_offset = %p.log_start_offset(),
                            "log cleaned"
                        ),
                        Ok(_) => {}
                        Err(e) => tracing::debug!(error = %e, "log cleaning skipped"),
                    },
                }
            }
        })
        .await;
        if let Err(e) = ran {
            tracing::error!(error = %e, ?kind, "log maintenance task failed");
        }
        if let Maintenance::Tick = kind {
            ::metrics::gauge!(crate::metrics::TAIL_CACHE_BYTES)
                .set(rill_log::tail::held_bytes() as f64);
        }
    }
}
