//! The cluster: this broker's membership in the metadata quorum, its sessions
//! with the controller, and what it does when the committed metadata changes.
//!
//! - [`image`]: the metadata state machine (plain code, `apply(command)`).
//! - [`raft`]: openraft storage (crash-safe files under `<data>/__meta/raft/`) and
//!   the Raft RPCs over our QUIC protocol.
//! - [`peers`]: QUIC connections to the other brokers.
//!
//! The controller is the quorum's Raft leader. Every broker heartbeats to it every
//! `broker_heartbeat_interval_ms`; when a broker's session lapses
//! (`broker_session_timeout_ms`), the controller commits `FenceBroker`, which moves
//! each partition the broker led to a live ISR member with the leader epoch bumped.
//! A fenced broker that heartbeats again is unfenced.
//!
//! Forming: with no `join` and no `peers`, a broker with no quorum state forms a
//! one-broker cluster (and moves an existing `topics.toml` into it); `join` asks a
//! running broker to add this one as a voter; `peers` is a fixed voter list that
//! the lowest id initialises.

pub mod api;
pub mod command_checks;
pub mod image;
pub mod peers;
pub mod raft;
pub mod raft_format;
pub mod raft_format_v1;
pub mod raft_format_v2;
pub mod reconcile;
pub mod replication;
pub mod sessions;
pub mod topic_changes;

use self::image::{Command, MetadataImage, Outcome};
use self::peers::PeerLinks;
use self::raft::{LogStore, MetaRaft, NodeId, QuorumNetwork, StateMachine, TypeConfig};
use self::sessions::{SessionTimes, Sessions};
use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::fence::SelfFence;
use crate::metadata::TopicRecord;
use openraft::BasicNode;
use openraft::error::{ClientWriteError, RaftError};
use parking_lot::Mutex;
use rill_proto::wire::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Longest a forwarded request to the controller may take.
pub const CONTROLLER_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a proposal waits for a quorum leader to appear.
pub const LEADER_WAIT_MAX: Duration = Duration::from_secs(10);
/// How often a joining broker retries its join.
pub const JOIN_RETRY_INTERVAL: Duration = Duration::from_millis(500);
/// Longest time between two looks of the controller at the brokers' sessions.
const CONTROLLER_CHECK_MAX: Duration = Duration::from_millis(50);
/// Longest the controller spends on one join (waiting for the membership
/// lock, catching the new broker up as a learner, making it a voter); the
/// lock is never held past it.
pub const JOIN_DEADLINE: Duration = Duration::from_secs(10);
/// Longest a joining broker waits for the answer to one join request: the
/// controller's deadline plus a forwarding hop.
pub const JOIN_CALL_TIMEOUT: Duration =
    Duration::from_secs(JOIN_DEADLINE.as_secs() + 2 * CONTROLLER_CALL_TIMEOUT.as_secs());

/// Parses one `--peers` item, `ID@HOST:PORT`.
pub fn parse_peer(s: &str) -> Result<(i32, String), String> {
    let (id, addr) = s
        .split_once('@')
        .ok_or_else(|| format!("peer {s:?} is not ID@HOST:PORT (e.g. 0@127.0.0.1:9092)"))?;
    let id: i32 = id
        .parse()
        .map_err(|_| format!("peer {s:?}: id {id:?} is not a number"))?;
    if id < 0 || !addr.contains(':') {
        return Err(format!("peer {s:?} is not ID@HOST:PORT with ID >= 0"));
    }
    Ok((id, addr.to_string()))
}

fn err(code: ErrorCode, message: impl Into<String>) -> ErrorInfo {
    ErrorInfo::new(code, message)
}

/// This broker's cluster membership.
pub struct Cluster {
    pub broker_id: i32,
    pub addr: String,
    /// The other listeners this broker registers (its Kafka address).
    listeners: BTreeMap<String, String>,
    raft: MetaRaft,
    image: watch::Receiver<Arc<MetadataImage>>,
    pub links: Arc<PeerLinks>,
    sessions: Mutex<Sessions>,
    /// This broker's self-fence: moved by its heartbeats (see [`crate::fence`]).
    fence: Arc<SelfFence>,
    session_timeout: Duration,
    heartbeat_interval: Duration,
    /// Set once this broker registered and (on a fresh cluster) moved its old topics in.
    ready: watch::Sender<bool>,
    /// Serialises membership changes on the controller: openraft refuses a second
    /// change while one is uncommitted, so brokers joining at once take turns.
    membership_lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("broker_id", &self.broker_id)
            .field("addr", &self.addr)
            .field("controller", &self.controller())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Opens the quorum state and starts the Raft node; forms, joins or rejoins
    /// the cluster in the background (tasks in `tracker`, stopped by `shutdown`).
    pub async fn start(
        config: &BrokerConfig,
        tls: &rill_net::ClientTls,
        addr: String,
        local_topics: Vec<TopicRecord>,
        cluster_id: String,
        fence: Arc<SelfFence>,
        tracker: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<Arc<Cluster>, BrokerError> {
        let dir = config
            .data_dir
            .join(crate::metadata::META_DIR)
            .join(raft::RAFT_DIR);
        let data_err = |action: &'static str| {
            let path = dir.clone();
            move |source: std::io::Error| BrokerError::DataDir {
                action,
                path,
                source,
            }
        };
        let log = LogStore::open(&dir).map_err(data_err("open the metadata quorum log"))?;
        let (sm, image) =
            StateMachine::open(&dir).map_err(data_err("open the metadata snapshot"))?;
        let links =
            PeerLinks::new(tls, config.net.max_udp_payload_bytes).map_err(BrokerError::Tls)?;
        let raft_config = openraft::Config {
            cluster_name: "rill".into(),
            heartbeat_interval: 100,
            election_timeout_min: 300,
            election_timeout_max: 600,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(500),
            max_in_snapshot_log_to_keep: 100,
            ..Default::default()
        }
        .validate()
        .map_err(|e| BrokerError::Task(format!("Raft config: {e}")))?;
        let network = QuorumNetwork {
            self_id: config.id,
            links: links.clone(),
        };
        let raft = openraft::Raft::<TypeConfig>::new(
            config.id as NodeId,
            Arc::new(raft_config),
            network,
            log,
            sm,
        )
        .await
        .map_err(|e| BrokerError::Task(format!("could not start the metadata quorum: {e}")))?;
        let (ready, _) = watch::channel(false);
        let listeners = config
            .kafka_registered_addr()
            .map(|a| (image::KAFKA_LISTENER.to_string(), a))
            .into_iter()
            .collect();
        let cluster = Arc::new(Cluster {
            broker_id: config.id,
            addr,
            listeners,
            raft,
            image,
            links,
            sessions: Mutex::new(Sessions::default()),
            fence,
            session_timeout: Duration::from_millis(config.broker_session_timeout_ms),
            heartbeat_interval: Duration::from_millis(config.broker_heartbeat_interval_ms),
            ready,
            membership_lock: tokio::sync::Mutex::new(()),
        });
        let initialized = cluster
            .raft
            .is_initialized()
            .await
            .map_err(|e| BrokerError::Task(e.to_string()))?;
        // A restart into a cluster of three or more brokers: the image is the
        // one this broker had when it stopped; it may still name this broker
        // the leader of partitions the quorum moved meanwhile. Lead nothing
        // until the controller answers a heartbeat and the image caught up
        // (found by tests/net_faults.rs: a restarted broker acknowledged, as the
        // leader of an epoch already replaced, a record the new leader lacked).
        // (With one or two voters the first heartbeat is contact, see `heartbeat`.)
        if initialized {
            cluster.fence.await_first_contact();
        }
        let mut fresh = false;
        if !initialized {
            let peers: Vec<(i32, String)> = config
                .peers
                .iter()
                .map(|p| parse_peer(p))
                .collect::<Result<_, _>>()
                .map_err(|reason| BrokerError::ConfigInvalid {
                    key: "peers".into(),
                    reason,
                })?;
            if !peers.is_empty() {
                if peers.iter().map(|p| p.0).min() == Some(config.id) {
                    let members: BTreeMap<NodeId, BasicNode> = peers
                        .iter()
                        .map(|(id, a)| (*id as NodeId, BasicNode::new(a)))
                        .collect();
                    cluster.initialize(members).await?;
                    fresh = true;
                }
            } else if config.join.is_none() {
                // Alone (a joining broker joins below, before registering).
                let mut members = BTreeMap::new();
                members.insert(config.id as NodeId, BasicNode::new(&cluster.addr));
                cluster.initialize(members).await?;
                fresh = true;
            }
        }
        let migrate = local_topics;
        let c = cluster.clone();
        let stop = shutdown.clone();
        let join = config.join.clone();
        tracker.spawn(async move {
            // A joining broker registers only once it is a voter: a broker that
            // looked alive while still a learner would leave a quorum that cannot
            // elect a leader when another voter dies.
            if let Some(join) = join
                && !c.join_loop(join, stop.clone()).await
            {
                return;
            }
            c.register(cluster_id, migrate, fresh, stop).await
        });
        let c = cluster.clone();
        let stop = shutdown.clone();
        tracker.spawn(async move { c.heartbeat_loop(stop).await });
        let c = cluster.clone();
        let stop = shutdown.clone();
        let imbalance = Duration::from_millis(config.leader_imbalance_check_interval_ms);
        tracker.spawn(async move { c.controller_loop(imbalance, stop).await });
        Ok(cluster)
    }

    async fn initialize(&self, members: BTreeMap<NodeId, BasicNode>) -> Result<(), BrokerError> {
        match self.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(e)) => {
                tracing::debug!(error = %e, "quorum already initialised");
                Ok(())
            }
            Err(e) => Err(BrokerError::Task(format!(
                "could not initialise the metadata quorum: {e}"
            ))),
        }
    }

    /// Stops the Raft node and the peer connections.
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
        self.links.close();
    }

    /// Whether the quorum is this broker alone (a single-broker cluster): then it
    /// leads its partitions from the start, before the image is re-applied.
    pub fn is_solo(&self) -> bool {
        self.voters() == [self.broker_id]
    }

    /// The committed metadata image.
    pub fn image(&self) -> Arc<MetadataImage> {
        self.image.borrow().clone()
    }

    /// A receiver that sees every new image.
    pub fn watch_image(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.image.clone()
    }

    /// Resolves once this broker has registered (and migrated old topics).
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// The controller (quorum leader), if one is known.
    pub fn controller(&self) -> Option<i32> {
        self.raft
            .metrics()
            .borrow()
            .current_leader
            .map(|l| l as i32)
    }

    fn is_controller(&self) -> bool {
        self.controller() == Some(self.broker_id)
    }

    /// The address of a quorum member.
    fn member_addr(&self, id: i32) -> Option<String> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.membership_config
            .membership()
            .get_node(&(id as NodeId))
            .map(|n| n.addr.clone())
    }

    async fn controller_addr(&self) -> Result<(i32, String), ErrorInfo> {
        let deadline = Instant::now() + LEADER_WAIT_MAX;
        loop {
            if let Some(l) = self.controller()
                && let Some(addr) = self.member_addr(l)
            {
                return Ok((l, addr));
            }
            if Instant::now() >= deadline {
                return Err(err(
                    ErrorCode::ClusterNotReady,
                    format!(
                        "broker {}: the metadata quorum has no leader after {LEADER_WAIT_MAX:?}: \
                         are a majority of the brokers up?",
                        self.broker_id
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Commits a metadata command (here if this broker is the controller, else
    /// through the controller) and returns its outcome once applied there.
    pub async fn propose(&self, command: Command) -> Result<Outcome, ErrorInfo> {
        let (leader, addr) = self.controller_addr().await?;
        if leader == self.broker_id {
            return self.propose_local(command).await;
        }
        let bytes = serde_json::to_vec(&command)
            .map_err(|e| err(ErrorCode::InternalError, e.to_string()))?;
        let (resp, _) = self
            .links
            .call(
                &addr,
                &MetadataWriteRequest { command: bytes },
                CONTROLLER_CALL_TIMEOUT,
            )
            .await
            .map_err(|e| match e {
                peers::PeerError::Remote { info, .. } => info,
                other => err(
                    ErrorCode::ClusterNotReady,
                    format!("controller {leader}: {other}"),
                ),
            })?;
        serde_json::from_slice(&resp.outcome).map_err(|e| {
            err(
                ErrorCode::InternalError,
                format!("undecodable outcome: {e}"),
            )
        })
    }

    /// Proposes on this broker (the controller). A command that fails
    /// [`command_checks::check_proposal`] against the committed image is
    /// refused here and never enters the quorum log.
    async fn propose_local(&self, command: Command) -> Result<Outcome, ErrorInfo> {
        if let Err(e) = command_checks::check_proposal(&self.image(), &command) {
            tracing::warn!(error = %e, "refused a malformed metadata command before proposing it");
            return Ok(Outcome::Refused {
                code: e.code,
                message: e.message,
            });
        }
        match self.raft.client_write(command).await {
            Ok(resp) => Ok(resp.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(err(
                ErrorCode::NotController,
                format!(
                    "broker {} is no longer the controller (now {:?}); retry",
                    self.broker_id, f.leader_id
                ),
            )),
            Err(e) => Err(err(
                ErrorCode::ClusterNotReady,
                format!("the metadata quorum could not commit: {e}"),
            )),
        }
    }

    /// Waits until the local image satisfies `f` (bounded).
    pub async fn wait_image(&self, within: Duration, f: impl Fn(&MetadataImage) -> bool) -> bool {
        let mut rx = self.image.clone();
        tokio::time::timeout(within, rx.wait_for(|i| f(i)))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    // ------------------------------------------------------------ request handlers

    /// `RaftRpc`: a Raft message from a peer.
    pub async fn handle_raft_rpc(&self, req: RaftRpcRequest) -> Result<RaftRpcResponse, ErrorInfo> {
        if req.to != self.broker_id {
            return Err(err(
                ErrorCode::InvalidRequest,
                format!(
                    "Raft RPC from broker {} meant for broker {} reached broker {}: check the peer addresses",
                    req.from, req.to, self.broker_id
                ),
            ));
        }
        raft::serve_rpc(&self.raft, &req)
            .await
            .map(|body| RaftRpcResponse { body })
            .map_err(|e| err(ErrorCode::InvalidRequest, e))
    }

    /// `MetadataWrite`: a command forwarded by another broker.
    pub async fn handle_metadata_write(
        &self,
        req: MetadataWriteRequest,
    ) -> Result<MetadataWriteResponse, ErrorInfo> {
        let command: Command = serde_json::from_slice(&req.command).map_err(|e| {
            err(
                ErrorCode::InvalidRequest,
                format!("undecodable command: {e}"),
            )
        })?;
        let outcome = self.propose_local(command).await?;
        Ok(MetadataWriteResponse {
            outcome: serde_json::to_vec(&outcome)
                .map_err(|e| err(ErrorCode::InternalError, e.to_string()))?,
        })
    }

    /// `JoinCluster`: adds a broker to the quorum as a voter (on the controller;
    /// other brokers forward). Bounded by [`JOIN_DEADLINE`]: a broker that
    /// cannot be reached is refused with REQUEST_TIMED_OUT, naming it and its
    /// address, and dropped from the membership again; the membership lock is
    /// released by then.
    pub async fn handle_join(
        &self,
        req: JoinClusterRequest,
    ) -> Result<JoinClusterResponse, ErrorInfo> {
        if req.broker_id < 0 {
            return Err(err(
                ErrorCode::InvalidRequest,
                format!(
                    "join: broker id {} is not valid: ids are >= 0",
                    req.broker_id
                ),
            ));
        }
        command_checks::check_broker_addr(&req.addr).map_err(|why| {
            err(
                ErrorCode::InvalidRequest,
                format!(
                    "join: broker {} address {:?}: {why}",
                    req.broker_id, req.addr
                ),
            )
        })?;
        let (leader, addr) = self.controller_addr().await?;
        if leader != self.broker_id {
            let (resp, _) = self
                .links
                .call(&addr, &req, JOIN_DEADLINE + CONTROLLER_CALL_TIMEOUT)
                .await
                .map_err(|e| match e {
                    peers::PeerError::Remote { info, .. } => info,
                    other => err(ErrorCode::ClusterNotReady, other.to_string()),
                })?;
            return Ok(resp);
        }
        let deadline = tokio::time::Instant::now() + JOIN_DEADLINE;
        self.add_voter(req.broker_id, &req.addr, deadline).await?;
        let voters = self.voters();
        Ok(JoinClusterResponse {
            cluster_id: self.image().cluster_id.clone(),
            voters,
        })
    }

    /// On the controller: makes `broker` (at `addr`) a voter by `deadline`:
    /// added as a learner, heard from (it acknowledged the log up to its own
    /// addition), then promoted. The membership lock is held at most until
    /// `deadline`.
    async fn add_voter(
        &self,
        broker: i32,
        addr: &str,
        deadline: tokio::time::Instant,
    ) -> Result<(), ErrorInfo> {
        let id = broker as NodeId;
        let late = |step: &str| {
            err(
                ErrorCode::RequestTimedOut,
                format!(
                    "broker {broker} at {addr} could not join the metadata quorum within \
                     {JOIN_DEADLINE:?}: {step}; check that it is running and that broker {} \
                     can reach {addr}",
                    self.broker_id
                ),
            )
        };
        let Ok(_turn) = tokio::time::timeout_at(deadline, self.membership_lock.lock()).await else {
            return Err(late(
                "another membership change held the controller the whole time",
            ));
        };
        let voters: BTreeSet<NodeId> = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        if voters.contains(&id) {
            return Ok(());
        }
        let change_err = |e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>| {
            err(
                ErrorCode::ClusterNotReady,
                format!("could not add broker {broker} at {addr}: {e}"),
            )
        };
        // openraft's blocking add_learner calls a learner "up to date" while
        // the log is shorter than its lag threshold, even one never heard
        // from; promoting that one would leave the quorum unable to commit.
        // So: add it, then wait until it acknowledged the entry that added it.
        let added = tokio::time::timeout_at(
            deadline,
            self.raft.add_learner(id, BasicNode::new(addr), false),
        )
        .await;
        let added_at = match added {
            Ok(r) => r.map_err(change_err)?.log_id.index,
            Err(_) => return Err(late("the quorum did not commit it as a learner")),
        };
        let mut metrics = self.raft.metrics();
        let caught_up = tokio::time::timeout_at(
            deadline,
            metrics.wait_for(|m| {
                m.replication
                    .as_ref()
                    .and_then(|r| r.get(&id))
                    .and_then(|matched| matched.as_ref())
                    .is_some_and(|l| l.index >= added_at)
            }),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        if !caught_up {
            // Leave no unreachable learner behind (the controller would keep
            // replicating to it, and a later join at another address would
            // keep the stale one). In the background: the lock is released.
            let raft = self.raft.clone();
            tokio::spawn(async move {
                let removed = raft
                    .change_membership(
                        openraft::ChangeMembers::RemoveNodes(BTreeSet::from([id])),
                        false,
                    )
                    .await;
                if let Err(e) = removed {
                    tracing::warn!(broker, error = %e, "could not remove an unreachable learner");
                }
            });
            tracing::warn!(broker, %addr, "a joining broker could not be reached; refused");
            return Err(late(
                "it never acknowledged the quorum log as a learner (unreachable?)",
            ));
        }
        let mut all = voters;
        all.insert(id);
        // The promotion is two quorum steps (joint, then uniform); it runs to
        // the end even if this request stops waiting for it.
        let raft = self.raft.clone();
        let promote = tokio::spawn(async move { raft.change_membership(all, false).await });
        match tokio::time::timeout_at(deadline, promote).await {
            Ok(Ok(r)) => {
                r.map_err(change_err)?;
            }
            Ok(Err(join)) => {
                return Err(err(
                    ErrorCode::InternalError,
                    format!("promoting broker {broker} failed: {join}"),
                ));
            }
            Err(_) => return Err(late("the quorum did not commit its promotion to voter")),
        }
        tracing::info!(broker, %addr, "broker joined the metadata quorum");
        Ok(())
    }

    /// `BrokerHeartbeat`: renews a broker's session (controller only).
    pub fn handle_heartbeat(
        &self,
        req: BrokerHeartbeatRequest,
    ) -> Result<BrokerHeartbeatResponse, ErrorInfo> {
        if !self.is_controller() {
            return Err(err(
                ErrorCode::NotController,
                format!(
                    "broker {} is not the controller (it is {:?})",
                    self.broker_id,
                    self.controller()
                ),
            ));
        }
        let now = Instant::now();
        {
            let mut sessions = self.sessions.lock();
            // A heartbeat handled right after this process stalled may have
            // waited through the stall: not contact (see `Sessions::observe`).
            sessions.observe(now, self.session_times());
            sessions.heartbeat(req.broker_id, now);
        }
        let metadata_index = self.applied_index();
        let alive = self
            .image()
            .brokers
            .get(&req.broker_id)
            .is_some_and(|b| !b.fenced);
        Ok(BrokerHeartbeatResponse {
            alive,
            metadata_index,
        })
    }

    // ------------------------------------------------------------ background tasks

    /// The index of the last metadata log entry applied to this broker's image.
    fn applied_index(&self) -> u64 {
        self.raft
            .metrics()
            .borrow()
            .last_applied
            .map_or(0, |l| l.index)
    }

    fn session_times(&self) -> SessionTimes {
        SessionTimes {
            session_timeout: self.session_timeout,
            heartbeat_interval: self.heartbeat_interval,
        }
    }

    /// The voters of the metadata quorum this broker knows.
    fn voters(&self) -> Vec<i32> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .map(|v| v as i32)
            .collect()
    }

    /// Whether this broker is a voter of the metadata quorum it knows.
    fn is_voter(&self) -> bool {
        self.voters().contains(&self.broker_id)
    }

    /// Asks `join` to add this broker as a voter until it is one; false when
    /// stopped first. A restarted broker that is already a voter returns at once
    /// (so a dead `--join` address does not keep it from serving).
    async fn join_loop(&self, join: String, stop: CancellationToken) -> bool {
        let req = JoinClusterRequest {
            broker_id: self.broker_id,
            addr: self.addr.clone(),
        };
        loop {
            if stop.is_cancelled() {
                return false;
            }
            if self.is_voter() {
                return true;
            }
            match self.links.call(&join, &req, JOIN_CALL_TIMEOUT).await {
                Ok((resp, _)) => {
                    tracing::info!(via = %join, voters = ?resp.voters, "joined the cluster");
                    return true;
                }
                Err(e) => {
                    tracing::warn!(via = %join, error = %e, "could not join the cluster yet; retrying")
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = tokio::time::sleep(JOIN_RETRY_INTERVAL) => {}
            }
        }
    }

    /// Registers this broker (address, unfenced), sets the cluster id on a new
    /// cluster and moves the topics of an old single broker into the quorum.
    async fn register(
        self: Arc<Self>,
        cluster_id: String,
        migrate: Vec<TopicRecord>,
        fresh: bool,
        stop: CancellationToken,
    ) {
        // From an old topics.toml: every topic into a new quorum; into an existing
        // one only internal topics it lacks (made locally by an older broker; a
        // client topic missing from it was deleted while this broker was down).
        let image = self.image();
        let migrate: Vec<TopicRecord> = migrate
            .into_iter()
            .filter(|t| !image.topics.contains_key(&t.name) && (fresh || t.internal))
            .collect();
        let mut commands = vec![Command::RegisterBroker {
            id: self.broker_id,
            addr: self.addr.clone(),
            listeners: self.listeners.clone(),
        }];
        if !migrate.is_empty() || self.image().cluster_id.is_empty() {
            commands.insert(0, Command::SetClusterId { cluster_id });
        }
        for t in migrate {
            tracing::info!(topic = %t.name, "moving topic from topics.toml into the metadata quorum");
            commands.push(Command::CreateTopic {
                assignment: vec![vec![self.broker_id]; t.partitions as usize],
                name: t.name,
                id: t.id,
                internal: t.internal,
                configs: t.configs,
            });
        }
        for command in commands {
            loop {
                if stop.is_cancelled() {
                    return;
                }
                match self.propose(command.clone()).await {
                    Ok(Outcome::Refused { code, message }) => {
                        tracing::warn!(%code, %message, "the metadata quorum refused a registration command");
                        break;
                    }
                    Ok(_) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "registration with the quorum not yet possible; retrying");
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(JOIN_RETRY_INTERVAL) => {}
                        }
                    }
                }
            }
        }
        tracing::info!(broker = self.broker_id, "registered with the cluster");
        self.ready.send_replace(true);
    }

    /// Heartbeats to the controller every interval (each in its own task, so a
    /// call to a controller that died does not hold back the next one to its
    /// successor), and reports the self-fence's changes (see [`crate::fence`]).
    async fn heartbeat_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut timer = tokio::time::interval(self.heartbeat_interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut beats = tokio::task::JoinSet::new();
        // (The server metrics change only with the vote, the leader or the
        // membership; the full metrics with every log entry.)
        let mut metrics = self.raft.server_metrics();
        let mut watching = true;
        let mut known = self.controller();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = timer.tick() => {}
                // A new controller: heartbeat to it at once, not up to an
                // interval later. It fences the previous controller unless that
                // one heartbeats within its grace (see `Sessions::decide`), and
                // the sooner every live broker is heard from, the shorter that
                // grace can be (it is the whole of a controller failover's wait
                // after the election).
                changed = metrics.changed(), if watching => {
                    if changed.is_err() {
                        // Raft stopped: heartbeats go on at the interval.
                        watching = false;
                        continue;
                    }
                    let now = metrics.borrow_and_update().current_leader.map(|l| l as i32);
                    if now == known || now.is_none() {
                        known = now.or(known);
                        continue;
                    }
                    known = now;
                    timer.reset();
                }
            }
            while beats.try_join_next().is_some() {}
            let me = self.clone();
            beats.spawn(async move {
                if let Some(at) = me.heartbeat().await {
                    me.fence.contact(at);
                }
            });
            let now = Instant::now();
            match self.fence.check(now) {
                Some(true) if self.fence.awaits_first_contact() => tracing::info!(
                    broker = self.broker_id,
                    "restarted into the cluster: this broker leads nothing until the controller \
                     answers its heartbeat and its metadata caught up (the quorum may have moved \
                     its leaderships while it was down)"
                ),
                Some(true) => tracing::warn!(
                    broker = self.broker_id,
                    silent_ms = self.fence.silent_for(now).as_millis() as u64,
                    timeout_ms = self.fence.timeout().as_millis() as u64,
                    "this broker has not been in contact with the cluster's controller for longer \
                     than the broker session timeout: it fences itself and serves no partition as \
                     leader until it is (the controller may move its leaderships meanwhile)"
                ),
                Some(false) => tracing::info!(
                    broker = self.broker_id,
                    "in contact with the cluster's controller again: no longer fenced"
                ),
                None => {}
            }
        }
    }

    /// One heartbeat: when, if at all, it put this broker in contact with the
    /// controller (the time it was sent, which is no later than the
    /// controller's receipt that renews the session).
    async fn heartbeat(&self) -> Option<Instant> {
        let sent = Instant::now();
        let voters = self.voters();
        // One or two voters: no leadership can move without this broker. (A
        // restarted broker whose membership is not loaded yet knows no voters:
        // not a reason to lift its first fence.)
        let unfenceable = if self.fence.awaits_first_contact() {
            (1..=2).contains(&voters.len())
        } else {
            voters.len() <= 2
        };
        let leader = self.controller();
        let req = BrokerHeartbeatRequest {
            broker_id: self.broker_id,
            addr: self.addr.clone(),
        };
        if leader == Some(self.broker_id) {
            let _ = self.handle_heartbeat(req);
            if unfenceable {
                return Some(sent);
            }
            // Controller: in contact when a majority of the voters last heartbeated.
            return self
                .sessions
                .lock()
                .quorum_contact(self.broker_id, &voters, sent);
        }
        let addr = leader.and_then(|l| self.member_addr(l));
        let Some(addr) = addr else {
            return unfenceable.then_some(sent);
        };
        let timeout = (self.heartbeat_interval * 4).min(self.session_timeout / 2);
        match self.links.call(&addr, &req, timeout).await {
            // Unfenced by the controller, and this broker's image has caught
            // up with the controller's (so it carries the leaderships the
            // quorum changed while it was away, not only a stale "unfenced"
            // from before it was fenced) and says so too.
            Ok((resp, _))
                if resp.alive
                    && self.applied_index() >= resp.metadata_index
                    && self
                        .image()
                        .brokers
                        .get(&self.broker_id)
                        .is_some_and(|b| !b.fenced) =>
            {
                Some(sent)
            }
            Ok(_) => unfenceable.then_some(sent),
            Err(e) => {
                tracing::debug!(controller = ?leader, error = %e, "heartbeat failed");
                unfenceable.then_some(sent)
            }
        }
    }

    /// On the controller: fences brokers whose session lapsed, unfences those
    /// that came back, and runs the preferred-leader election on its timer.
    /// It looks every [`CONTROLLER_CHECK_MAX`] at most (a cheap pure
    /// decision), so a takeover is noticed and a lapsed session or the old
    /// controller's grace acted on within that, not a heartbeat interval later.
    async fn controller_loop(self: Arc<Self>, imbalance_every: Duration, stop: CancellationToken) {
        let mut timer = tokio::time::interval(self.heartbeat_interval.min(CONTROLLER_CHECK_MAX));
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_election = Instant::now();
        // A session change that failed to commit, and when: not proposed again
        // for a heartbeat interval (the loop looks far more often than that).
        let mut failed: Vec<(Command, Instant)> = Vec::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = timer.tick() => {}
            }
            failed.retain(|(_, at)| at.elapsed() < self.heartbeat_interval);
            self.sessions
                .lock()
                .observe(Instant::now(), self.session_times());
            if !self.is_controller() {
                self.sessions
                    .lock()
                    .not_controller(self.controller(), Instant::now());
                continue;
            }
            let image = self.image();
            let times = self.session_times();
            let decisions = {
                let mut s = self.sessions.lock();
                if s.is_new() {
                    tracing::info!("this broker is now the controller");
                }
                s.decide(self.broker_id, Instant::now(), &image, times)
            };
            for command in decisions {
                if failed.iter().any(|(c, _)| *c == command) {
                    continue;
                }
                tracing::info!(?command, "controller: broker session change");
                if let Err(e) = self.propose_local(command.clone()).await {
                    tracing::warn!(error = %e, "controller could not commit a session change");
                    failed.push((command, Instant::now()));
                }
            }
            if !imbalance_every.is_zero() && last_election.elapsed() >= imbalance_every {
                last_election = Instant::now();
                match self
                    .propose_local(Command::ElectPreferred { topics: None })
                    .await
                {
                    Ok(Outcome::Moved(m)) if !m.is_empty() => {
                        tracing::info!(moved = ?m, "preferred leader election")
                    }
                    _ => {}
                }
            }
        }
    }
}
