//! The async shell around the [`GroupCoordinator`]: the typed handlers of the
//! group apis (the router calls them), the session timer, and the link to
//! `__consumer_offsets`.
//!
//! `__consumer_offsets` is a topic of the cluster like any other: created through
//! the metadata quorum (compacted, replication factor
//! `offsets_topic_replication_factor` capped at the live brokers), replicated
//! leader/follower. The coordinator of a group is the leader of the partition
//! the group id hashes to ([`offsets_partition_for`]).
//!
//! Loading: when this broker becomes the leader of a partition of
//! `__consumer_offsets` (in a leader epoch), it replays the partition's log up
//! to its log end and serves that partition's groups from then on; when it stops
//! leading it, it forgets them. The timer does this within
//! [`GROUP_TICK_INTERVAL`] of a leadership change, and a request that arrives
//! first does it itself. So committed offsets and group epochs survive a restart
//! and a failover. Members do not: they rejoin the new coordinator (their
//! heartbeats get UNKNOWN_MEMBER_ID).
//!
//! Locking: one mutex (`inner`) guards the in-memory state (the coordinator,
//! what is loaded, the write order) and is never held across I/O or an await.
//! - A step runs under it. If the step produced records, it takes a *ticket*
//!   there, so tickets follow step order; the records are appended outside the
//!   lock when the ticket's turn comes (every earlier ticket's records are then
//!   appended and replayed), and replayed under the lock again before the turn
//!   passes on. So records are appended and replayed in step order, and the
//!   coordinator's durable state is what the leader's log holds, in log order.
//!   A step without records (most heartbeats, every read) never waits for a turn.
//! - A load takes a turn only to unmark the partition (no append to it is in
//!   flight then, and none starts after: appends need the partition loaded),
//!   then replays the log outside the lock into a coordinator of its own, and
//!   hands its groups over under the lock, unless the partition's generation or
//!   leader epoch changed meanwhile (then the load is dropped, and the next sync
//!   starts again). So heartbeats of other partitions' groups are answered while
//!   a partition loads. Loads of one partition are serialized (`loads`).
//!
//! A commit is answered only after its records reached every in-sync replica
//! (acks=all, bounded by [`REPLICATION_WAIT`]); if the append or the replication
//! fails, the commit fails (a failed replication may still commit, as with a
//! produce).
//!
//! Coordinator check: a group request is served only if this broker leads the
//! group's `__consumer_offsets` partition and has loaded it in the current
//! leader epoch (else NOT_COORDINATOR, and the client asks FindCoordinator,
//! which any broker answers from the metadata it holds).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rill_proto::Rope;
use rill_proto::types::now_ms;
use rill_proto::wire::*;
use rill_proto::{BatchBuilder, Compression, LeaderEpoch, Offset, Record};

use super::coordinator::{
    CoordinatorConfig, GroupCoordinator, Input, Millis, Pending, heartbeat_error, input,
};
use super::records::GroupRecord;
use super::{OFFSETS_TOPIC, offsets_partition_for};
use crate::cluster::api as cluster_api;
use crate::config::BrokerConfig;
use crate::partition::{Partition, Topic};
use crate::state::BrokerState;
use crate::topics::TopicRegistry;

/// How often sessions are checked for expiry and leadership of
/// `__consumer_offsets` for changes.
pub const GROUP_TICK_INTERVAL: Duration = Duration::from_millis(100);
/// Longest a commit waits for its records to reach every in-sync replica.
pub const REPLICATION_WAIT: Duration = Duration::from_secs(5);
/// How long a classic member's JoinGroup or SyncGroup waits for the other
/// members beyond its rebalance timeout (the coordinator ends a rebalance by
/// then; this only bounds a wait that something else went wrong in).
const CLASSIC_WAIT_SLACK: Duration = Duration::from_secs(5);
/// Longest wait of one JoinGroup or SyncGroup, whatever the member asks.
const CLASSIC_WAIT_MAX: Duration = Duration::from_secs(30 * 60);

/// The in-memory state, under one lock that is never held across I/O.
#[derive(Debug)]
struct Inner {
    coordinator: GroupCoordinator,
    /// `__consumer_offsets` partitions whose groups are loaded, with the leader
    /// epoch they were loaded in.
    loaded: BTreeMap<u32, LeaderEpoch>,
    /// Per partition, bumped whenever its groups are dropped (a load starts, or
    /// leadership went elsewhere): a load, or the replay of an append, applies
    /// only if the generation it started in is still current.
    generations: BTreeMap<u32, u64>,
    /// The next write ticket to hand out.
    next_ticket: u64,
    /// The ticket whose turn it is to write.
    serving: u64,
    /// Tickets given up before their turn (skipped when it comes).
    abandoned: BTreeSet<u64>,
}

impl Inner {
    fn generation(&self, index: u32) -> u64 {
        self.generations.get(&index).copied().unwrap_or(0)
    }

    /// Drops the groups of partition `index` (of `count`) and starts a new
    /// generation of it.
    fn forget(&mut self, index: u32, count: u32) -> u64 {
        self.loaded.remove(&index);
        self.coordinator
            .retain_groups(|g| offsets_partition_for(g, count) != index);
        let generation = self.generations.entry(index).or_insert(0);
        *generation += 1;
        *generation
    }

    fn take_ticket(&mut self) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        ticket
    }

    /// Ends ticket `ticket`'s turn, or gives it up if its turn has not come.
    fn release(&mut self, ticket: u64) {
        if self.serving == ticket {
            let mut next = ticket + 1;
            while self.abandoned.remove(&next) {
                next += 1;
            }
            self.serving = next;
        } else {
            debug_assert!(self.serving < ticket, "a ticket is released once");
            self.abandoned.insert(ticket);
        }
    }
}

/// A place in the write order. Dropping it ends its turn (or gives it up), so
/// a request that goes away never stalls the writes after it. Never dropped
/// while `inner` is locked.
struct Turn<'a> {
    service: &'a GroupService,
    ticket: u64,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.service.inner.lock().release(self.ticket);
        self.service.turn_moved.notify_waiters();
    }
}

/// Called with the partition index before a load replays it (tests hold a
/// load there).
#[cfg(test)]
type LoadHook = Arc<dyn Fn(u32) + Send + Sync>;

/// The group coordinator of this broker and what it needs around it.
pub struct GroupService {
    inner: Mutex<Inner>,
    /// Woken whenever a write turn passes on.
    turn_moved: tokio::sync::Notify,
    /// Woken after every step: JoinGroup and SyncGroup waiters look again.
    changed: tokio::sync::Notify,
    /// Makes the ids given to new classic members unique: this broker, its
    /// start time, a counter.
    member_id_base: String,
    member_ids: std::sync::atomic::AtomicU64,
    /// One load at a time per `__consumer_offsets` partition.
    loads: Mutex<BTreeMap<u32, Arc<tokio::sync::Mutex<()>>>>,
    config: CoordinatorConfig,
    clock_base: Instant,
    /// One creation of `__consumer_offsets` at a time from this broker.
    creating: tokio::sync::Mutex<()>,
    #[cfg(test)]
    load_hook: Mutex<Option<LoadHook>>,
}

impl std::fmt::Debug for GroupService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupService")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl GroupService {
    pub fn new(config: &BrokerConfig) -> GroupService {
        let broker_id = config.id;
        let config = CoordinatorConfig {
            session_timeout_ms_min: config.group_min_session_timeout_ms,
            session_timeout_ms_max: config.group_max_session_timeout_ms,
            members_per_group_max: config.group_max_size,
            initial_rebalance_delay_ms: config.group_initial_rebalance_delay_ms,
            ..CoordinatorConfig::default()
        };
        GroupService {
            inner: Mutex::new(Inner {
                coordinator: GroupCoordinator::new(config.clone()),
                loaded: BTreeMap::new(),
                generations: BTreeMap::new(),
                next_ticket: 0,
                serving: 0,
                abandoned: BTreeSet::new(),
            }),
            turn_moved: tokio::sync::Notify::new(),
            changed: tokio::sync::Notify::new(),
            member_id_base: format!(
                "{}-{:x}",
                broker_id,
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            ),
            member_ids: std::sync::atomic::AtomicU64::new(0),
            loads: Mutex::new(BTreeMap::new()),
            config,
            clock_base: Instant::now(),
            creating: tokio::sync::Mutex::new(()),
            #[cfg(test)]
            load_hook: Mutex::new(None),
        }
    }

    fn now(&self) -> Millis {
        self.clock_base.elapsed().as_millis() as Millis
    }

    /// A member id no other member of any group has had: Kafka's form,
    /// the client id and a unique suffix.
    fn new_member_id(&self, client_id: &str) -> String {
        let client: String = client_id
            .chars()
            .filter(|c| !c.is_control())
            .take(64)
            .collect();
        let client = if client.is_empty() { "member" } else { &client };
        let n = self
            .member_ids
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{client}-{}-{n}", self.member_id_base)
    }

    /// Whether partition `p` is loaded in its current leader epoch.
    fn is_loaded(&self, p: &Partition) -> bool {
        p.is_leader() && in_line(&self.inner.lock().loaded, p)
    }

    /// A place in the write order, behind every one handed out before.
    fn turn(&self, inner: &mut Inner) -> Turn<'_> {
        Turn {
            service: self,
            ticket: inner.take_ticket(),
        }
    }

    /// Waits until it is `turn`'s turn to write.
    async fn wait_turn(&self, turn: &Turn<'_>) {
        loop {
            let moved = self.turn_moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if self.inner.lock().serving == turn.ticket {
                return;
            }
            moved.await;
        }
    }

    /// The lock that serializes loads of partition `index`.
    fn load_lock(&self, index: u32) -> Arc<tokio::sync::Mutex<()>> {
        self.loads.lock().entry(index).or_default().clone()
    }

    /// Brings partition `index` of `__consumer_offsets` in line with its
    /// leadership: loads its groups if this broker leads it in an epoch it has
    /// not loaded, forgets them if it does not lead it. See the module doc for
    /// why no lock is held while the log is read.
    async fn sync_partition(&self, topic: &Arc<Topic>, index: u32) -> Result<(), ErrorInfo> {
        let count = topic.partitions.len() as u32;
        let Some(p) = topic.partition(index).cloned() else {
            // Not a replica here: never this broker's groups.
            self.inner.lock().forget(index, count);
            return Ok(());
        };
        let load_lock = self.load_lock(index);
        let _loading = load_lock.lock().await;
        if in_line(&self.inner.lock().loaded, &p) {
            return Ok(());
        }
        if !p.is_leader() {
            self.inner.lock().forget(index, count);
            tracing::info!(
                partition = index,
                leader = ?p.leader(),
                "no longer the coordinator of the groups of {OFFSETS_TOPIC}-{index}"
            );
            return Ok(());
        }
        let epoch = p.leader_epoch();
        // Unmark the partition once no append to it is in flight; none starts
        // after that (appends need it loaded).
        let generation = {
            let turn = self.turn(&mut self.inner.lock());
            self.wait_turn(&turn).await;
            let generation = self.inner.lock().forget(index, count);
            drop(turn);
            generation
        };
        #[cfg(test)]
        let hook = self.load_hook.lock().clone();
        let config = self.config.clone();
        let now = self.now();
        let reading = p.clone();
        let replayed = tokio::task::spawn_blocking(move || {
            #[cfg(test)]
            if let Some(hook) = hook {
                hook(index);
            }
            let mut loaded = GroupCoordinator::new(config);
            replay_partition(&mut loaded, &reading, now).map(|records| (loaded, records))
        })
        .await
        .map_err(|e| {
            ErrorInfo::new(
                ErrorCode::InternalError,
                format!("loading {OFFSETS_TOPIC}-{index} failed: {e}; see the broker log"),
            )
        })?;
        let (loaded, records) = replayed.inspect_err(|e| {
            tracing::error!(partition = index, error = %e, "could not load consumer groups");
        })?;
        let mut inner = self.inner.lock();
        if inner.generation(index) != generation || !p.is_leader() || p.leader_epoch() != epoch {
            tracing::info!(
                partition = index,
                leader_epoch = %epoch,
                "leadership of {OFFSETS_TOPIC}-{index} changed while loading it; loading again"
            );
            return Ok(());
        }
        let mut loaded = loaded;
        loaded.hold_after_load(self.now());
        inner
            .coordinator
            .adopt(loaded, |g| offsets_partition_for(g, count) == index);
        inner.loaded.insert(index, epoch);
        tracing::info!(
            partition = index,
            leader_epoch = %epoch,
            records,
            "this broker now coordinates the groups of {OFFSETS_TOPIC}-{index}"
        );
        Ok(())
    }

    /// Runs a step that only reads (it writes no records and wakes no
    /// waiter): a waiting JoinGroup or SyncGroup looking for its answer.
    fn look<I: Input>(&self, input: I) -> I::Reply {
        let out = self.inner.lock().coordinator.step(self.now(), input);
        debug_assert!(out.records.is_empty(), "a look writes nothing");
        out.reply
    }

    /// Runs one step and makes its records durable: appended on the leader and
    /// replayed (in step order, see the module doc), then replicated to the ISR.
    /// Err: the records were not appended (nothing was replayed), or not
    /// replicated in time.
    async fn step<I: Input>(
        &self,
        state: &BrokerState,
        input: I,
    ) -> (I::Reply, Result<(), ErrorInfo>) {
        let (out, turn) = {
            let mut inner = self.inner.lock();
            let out = inner.coordinator.step(self.now(), input);
            self.changed.notify_waiters();
            if out.records.is_empty() {
                return (out.reply, Ok(()));
            }
            let turn = self.turn(&mut inner);
            (out, turn)
        };
        self.wait_turn(&turn).await;
        // The group epochs these records write, to report as durable or not.
        let epochs: Vec<(String, i32)> = out
            .records
            .iter()
            .filter_map(|r| match r {
                GroupRecord::Group {
                    group,
                    value: Some(v),
                } => Some((group.clone(), v.group_epoch)),
                _ => None,
            })
            .collect();
        let written = match self.append(state, &out.records).await {
            Ok(written) => written,
            Err(e) => {
                drop(turn);
                self.report(epochs, None);
                return (out.reply, Err(e));
            }
        };
        {
            let mut inner = self.inner.lock();
            let now = self.now();
            for r in out.records {
                let index = offsets_partition_for(r.group(), written.partition_count);
                // A partition dropped since the append is replayed by its next load.
                if written.generations.get(&index) == Some(&inner.generation(index)) {
                    inner.coordinator.step(now, input::Replay(r));
                }
            }
        }
        drop(turn);
        for (p, end) in &written.partitions {
            if let Err(e) = cluster_api::wait_replicated(
                state,
                p,
                *end,
                tokio::time::Instant::now() + REPLICATION_WAIT,
            )
            .await
            {
                self.report(epochs, None);
                return (out.reply, Err(not_coordinator_if_moved(e)));
            }
        }
        self.report(epochs, Some(&written));
        (out.reply, Ok(()))
    }

    /// Tells the coordinator whether a step's group epochs became durable
    /// (`replicated`: what the step wrote) or not (`None`), and wakes the
    /// waiters (a classic SyncGroup waits for it). A partition loaded again
    /// since the append is left out of a durable report: its load set what
    /// is durable from the log itself.
    fn report(&self, epochs: Vec<(String, i32)>, replicated: Option<&Written>) {
        if epochs.is_empty() {
            return;
        }
        let mut inner = self.inner.lock();
        let now = self.now();
        match replicated {
            Some(written) => {
                let durable = epochs
                    .into_iter()
                    .filter(|(group, _)| {
                        let index = offsets_partition_for(group, written.partition_count);
                        written.generations.get(&index) == Some(&inner.generation(index))
                    })
                    .collect();
                inner.coordinator.step(now, input::Replicated(durable));
            }
            None => {
                inner.coordinator.step(now, input::Unwritten(epochs));
            }
        }
        self.changed.notify_waiters();
    }

    /// Appends records to their groups' partitions, one batch per partition; each
    /// partition must be led here and loaded in its current epoch. Called in its
    /// write turn; the I/O runs outside the lock.
    async fn append(
        &self,
        state: &BrokerState,
        records: &[GroupRecord],
    ) -> Result<Written, ErrorInfo> {
        let topic = state.registry.topic(OFFSETS_TOPIC).ok_or_else(|| {
            ErrorInfo::new(
                ErrorCode::CoordinatorNotAvailable,
                format!("{OFFSETS_TOPIC} does not exist yet: retry"),
            )
        })?;
        let n = topic.partitions.len() as u32;
        let now = now_ms();
        let mut by_partition: BTreeMap<u32, BatchBuilder> = BTreeMap::new();
        for r in records {
            let (key, value) = r.encode();
            by_partition
                .entry(offsets_partition_for(r.group(), n))
                .or_insert_with(|| BatchBuilder::new(Compression::None))
                .push(&Record {
                    key: Some(key),
                    value,
                    headers: Vec::new(),
                    timestamp_ms: now,
                });
        }
        let generations: BTreeMap<u32, u64> = {
            let inner = self.inner.lock();
            for p in by_partition.keys() {
                let Some(partition) = topic.partition(*p) else {
                    return Err(not_hosted(state, *p));
                };
                if inner.loaded.get(p) != Some(&partition.leader_epoch()) {
                    return Err(not_coordinator(state, partition));
                }
            }
            by_partition
                .keys()
                .map(|p| (*p, inner.generation(*p)))
                .collect()
        };
        let mut appended = Vec::new();
        for (p, builder) in by_partition {
            let partition = topic
                .partition(p)
                .cloned()
                .ok_or_else(|| not_hosted(state, p))?;
            cluster_api::check_produce(state, &partition, Acks::All)
                .map_err(not_coordinator_if_moved)?;
            let batch = Rope::from(builder.build());
            // On this task unless the append could wait on the disk or on the
            // log's mutex (a roll, retention, a compaction's plan or swap
            // hold it).
            let result = partition.append_from_task(batch, now).await;
            let info = result.inspect_err(|e| {
                tracing::error!(error = %e, partition = p, "could not write to {OFFSETS_TOPIC}");
            })?;
            // This write's end (others may have appended since).
            let end = info.last_offset.plus(1);
            appended.push((partition, end));
        }
        Ok(Written {
            partitions: appended,
            partition_count: n,
            generations,
        })
    }

    /// Expires sessions (called by the timer).
    async fn tick(&self, state: &BrokerState) {
        let ((), written) = self.step(state, input::Tick).await;
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not record expired group members");
        }
        let expire = input::ExpirePending { wall_ms: now_ms() };
        if let ((), Err(e)) = self.step(state, expire).await {
            tracing::debug!(error = %e, "could not drop expired pending transaction offsets");
        }
    }
}

/// What one step's append wrote to `__consumer_offsets`.
struct Written {
    /// The partitions written, with their log end after the append.
    partitions: Vec<(Arc<Partition>, Offset)>,
    /// The partition count of `__consumer_offsets`.
    partition_count: u32,
    /// The generation of each partition written, as of the append.
    generations: BTreeMap<u32, u64>,
}

/// Replays every record of partition `p` from its log start to its log end
/// (the new leader's log is the truth, committed or about to be). Returns how many.
fn replay_partition(
    coordinator: &mut GroupCoordinator,
    p: &Partition,
    now: Millis,
) -> Result<usize, ErrorInfo> {
    crate::internal_topics::replay(p, "its groups are unavailable", |_, key, value| {
        match GroupRecord::decode(key, value).map_err(|e| e.to_string())? {
            Some(record) => {
                coordinator.step(now, input::Replay(record));
                Ok(true)
            }
            None => Ok(false),
        }
    })
}

/// Runs the session timer, and follows leadership of `__consumer_offsets`,
/// until shutdown.
pub(crate) async fn timer_loop(state: Arc<BrokerState>) {
    let mut timer = tokio::time::interval(GROUP_TICK_INTERVAL);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        sync_leadership(&state).await;
        state.groups.tick(&state).await;
    }
}

/// Loads or forgets the groups of every `__consumer_offsets` partition whose
/// leadership changed since the last look.
async fn sync_leadership(state: &Arc<BrokerState>) {
    let Some(topic) = state.registry.topic(OFFSETS_TOPIC) else {
        return;
    };
    let changed: Vec<u32> = {
        let inner = state.groups.inner.lock();
        topic
            .hosted()
            .filter(|p| !in_line(&inner.loaded, p))
            .map(|p| p.index())
            .collect()
    };
    for index in changed {
        let _ = load_partition(state, &topic, index).await;
    }
}

/// Whether what is loaded of partition `p` matches its leadership: loaded in
/// the current leader epoch where this broker leads it, not loaded elsewhere.
fn in_line(loaded: &BTreeMap<u32, LeaderEpoch>, p: &Partition) -> bool {
    let epoch = loaded.get(&p.index());
    if p.is_leader() {
        epoch == Some(&p.leader_epoch())
    } else {
        epoch.is_none()
    }
}

/// [`GroupService::sync_partition`] of partition `index`.
async fn load_partition(
    state: &Arc<BrokerState>,
    topic: &Arc<Topic>,
    index: u32,
) -> Result<(), ErrorInfo> {
    state.groups.sync_partition(topic, index).await
}

/// `__consumer_offsets`, created through the quorum on first use.
async fn offsets_topic(state: &Arc<BrokerState>) -> Result<Arc<Topic>, ErrorInfo> {
    crate::internal_topics::ensure(
        state,
        OFFSETS_TOPIC,
        state.config.offsets_topic_num_partitions,
        state.config.offsets_topic_replication_factor,
        &state.groups.creating,
    )
    .await
}

/// NOT_COORDINATOR for partition `p` of `__consumer_offsets`.
fn not_coordinator(state: &BrokerState, p: &Partition) -> ErrorInfo {
    let led_by = match p.leader() {
        Some(l) if l == state.config.id => {
            "is led here but its groups are still loading".to_string()
        }
        Some(l) => format!("is led by broker {l}"),
        None => "has no leader right now".to_string(),
    };
    ErrorInfo::new(
        ErrorCode::NotCoordinator,
        format!(
            "broker {} is not the coordinator of groups on {OFFSETS_TOPIC}-{} (it {led_by}): ask FindCoordinator again",
            state.config.id,
            p.index()
        ),
    )
}

/// NOT_COORDINATOR from a broker that is not even a replica of the groups'
/// partition of `__consumer_offsets`.
fn not_hosted(state: &BrokerState, index: u32) -> ErrorInfo {
    crate::internal_topics::not_coordinator_here(
        state.config.id,
        OFFSETS_TOPIC,
        index,
        "its groups",
    )
}

/// A partition error that means the coordinator moved becomes NOT_COORDINATOR
/// (the client then finds the new one).
fn not_coordinator_if_moved(e: ErrorInfo) -> ErrorInfo {
    if e.code == ErrorCode::NotLeaderOrFollower {
        ErrorInfo::new(ErrorCode::NotCoordinator, e.message)
    } else {
        e
    }
}

/// The group's partition of `__consumer_offsets`, if this broker coordinates
/// it: it leads the partition and has loaded it (loading it now if needed).
async fn check_coordinator(state: &Arc<BrokerState>, group_id: &str) -> Result<(), ErrorInfo> {
    super::coordinator::validate_group_id(group_id)?;
    let topic = offsets_topic(state).await?;
    let index = offsets_partition_for(group_id, topic.partitions.len() as u32);
    let p = topic
        .partition(index)
        .ok_or_else(|| not_hosted(state, index))?;
    if state.groups.is_loaded(p) {
        return Ok(());
    }
    if p.is_leader() {
        load_partition(state, &topic, index).await?;
        if state.groups.is_loaded(p) {
            return Ok(());
        }
    }
    Err(not_coordinator(state, p))
}

/// Partition counts of every non-internal topic.
fn partition_counts(registry: &TopicRegistry) -> BTreeMap<String, u32> {
    registry
        .all()
        .into_iter()
        .filter(|t| !t.internal)
        .map(|t| (t.name.to_string(), t.partitions.len() as u32))
        .collect()
}

// ---------------------------------------------------------------- the group apis
//
// One typed handler per api; the router decodes, checks and encodes around them.

/// FindCoordinator: answered by any broker, from the metadata it holds.
pub(crate) async fn find_coordinator_api(
    state: &Arc<BrokerState>,
    req: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    match req.kind {
        CoordinatorKind::Group => find_coordinator(state, &req.group_id).await,
        CoordinatorKind::Transaction => {
            let found = crate::txn::service::coordinator_of(state, &req.group_id).await;
            coordinator_answer(
                state,
                found,
                crate::txn::service::TRANSACTION_STATE_TOPIC,
                &format!("transactional id {}", req.group_id),
            )
        }
    }
}

/// ConsumerGroupHeartbeat.
pub(crate) async fn heartbeat(
    state: &Arc<BrokerState>,
    req: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    if let Err(e) = check_coordinator(state, &req.group_id).await {
        return heartbeat_error(Some(e), &req);
    }
    // What a withheld answer says: the member's own id and epoch, nothing new.
    let asked = heartbeat_error(None, &req);
    let leaving = req.member_epoch < 0;
    let input = input::Heartbeat {
        request: req,
        partition_counts: partition_counts(&state.registry),
    };
    let (resp, written) = state.groups.step(state, input).await;
    match written {
        Ok(()) => resp,
        // A leave stands: a successor that does not learn of it only waits
        // for the member longer.
        Err(e) if leaving => {
            tracing::warn!(error = %e, "could not record a member's leave");
            resp
        }
        // The member's change is withheld. A join or an assignment answered
        // before its group and members records reached the in-sync replicas
        // could be one a successor coordinator never learns of: it would give
        // the same partitions to another member while this one consumes them
        // (the network-fault test saw two members hold all of a group's
        // partitions for 29 ms). The member keeps what it had and asks again,
        // as Kafka's coordinator answers only once its records are committed.
        Err(e) => {
            tracing::warn!(error = %e, member = %asked.member_id, "a member's change did not become durable; not answered");
            ConsumerGroupHeartbeatResponse {
                error: Some(unwritten(e)),
                ..asked
            }
        }
    }
}

/// The error a member gets when its step's records were not made durable:
/// NOT_COORDINATOR if this broker no longer leads the group's partition,
/// else COORDINATOR_NOT_AVAILABLE (retriable), as Kafka's coordinator maps
/// its write errors.
fn unwritten(e: ErrorInfo) -> ErrorInfo {
    let e = not_coordinator_if_moved(e);
    let code = match e.code {
        ErrorCode::NotCoordinator => ErrorCode::NotCoordinator,
        _ => ErrorCode::CoordinatorNotAvailable,
    };
    ErrorInfo::new(
        code,
        format!(
            "the coordinator could not make this change durable ({}): retry",
            e.message
        ),
    )
}

/// OffsetCommit: answered after the records reached the ISR.
pub(crate) async fn offset_commit(
    state: &Arc<BrokerState>,
    req: OffsetCommitRequest,
) -> OffsetCommitResponse {
    commit(state, req, None).await
}

/// CommitTxnOffsets (from a transaction coordinator): an ended
/// transaction's offsets, stored whatever the group's members (none if it
/// aborted), its pending offsets dropped; or, with `pending_for_ms`, an
/// open transaction's offsets recorded as pending (see OffsetFetch's
/// `require_stable`).
pub(crate) async fn commit_txn_offsets(
    state: &Arc<BrokerState>,
    req: CommitTxnOffsetsRequest,
) -> OffsetCommitResponse {
    if let Some(pending_for_ms) = req.pending_for_ms {
        let expires_ms = now_ms().saturating_add(pending_for_ms.max(0));
        let error = match check_coordinator(state, &req.group_id).await {
            Err(e) => Some(e),
            Ok(()) => {
                let input = input::PendingOffsets {
                    group: req.group_id.clone(),
                    transactional_id: req.transactional_id,
                    partitions: req
                        .partitions
                        .iter()
                        .map(|p| (p.topic.clone(), p.partition))
                        .collect(),
                    expires_ms,
                };
                match state.groups.step(state, input).await {
                    (Err(e), _) | (Ok(()), Err(e)) => Some(e),
                    (Ok(()), Ok(_)) => None,
                }
            }
        };
        return OffsetCommitResponse {
            error,
            partitions: Vec::new(),
        };
    }
    let request = OffsetCommitRequest {
        group_id: req.group_id,
        member: None,
        partitions: req.partitions,
    };
    commit(state, request, Some(req.transactional_id)).await
}

async fn commit(
    state: &Arc<BrokerState>,
    req: OffsetCommitRequest,
    transaction: Option<String>,
) -> OffsetCommitResponse {
    if let Err(e) = check_coordinator(state, &req.group_id).await {
        return OffsetCommitResponse {
            error: Some(e),
            partitions: Vec::new(),
        };
    }
    let gid = req.group_id.clone();
    let input = input::CommitOffsets {
        request: req,
        wall_ms: now_ms(),
        transaction,
    };
    let (mut resp, written) = state.groups.step(state, input).await;
    if let Err(e) = written {
        for p in &mut resp.partitions {
            if p.error.is_none() {
                p.error = Some(ErrorInfo::new(
                    e.code,
                    format!(
                        "group {gid}: the offset of {}-{} could not be written to {OFFSETS_TOPIC}: {}",
                        p.topic, p.partition, e.message
                    ),
                ));
            }
        }
    }
    resp
}

/// OffsetFetch: answered once every committed offset it names has reached
/// the in-sync replicas. A commit is visible to the coordinator as soon as it
/// is appended on the leader (see the module doc), before it is replicated;
/// answered then, a fetch could return an offset that a leader change takes
/// back, and the group's committed offset would go back (the network-fault
/// test saw it: a leader cut from its followers answered a commit it could
/// not replicate). So the answer waits (bounded by [`REPLICATION_WAIT`]) for
/// the high watermark of the group's partition to reach the log end it had
/// when the answer was computed; failing that, the fetch fails retriably.
pub(crate) async fn offset_fetch(
    state: &Arc<BrokerState>,
    req: OffsetFetchRequest,
) -> OffsetFetchResponse {
    if let Err(e) = check_coordinator(state, &req.group_id).await {
        return OffsetFetchResponse {
            error: Some(e),
            offsets: Vec::new(),
        };
    }
    let group_id = req.group_id.clone();
    let input = input::FetchOffsets {
        request: req,
        wall_ms: now_ms(),
    };
    let resp = state.groups.step(state, input).await.0;
    if resp.error.is_some() {
        return resp;
    }
    match wait_durable(state, &group_id, &mut BTreeMap::new()).await {
        Ok(()) => resp,
        Err(e) => OffsetFetchResponse {
            error: Some(e),
            offsets: Vec::new(),
        },
    }
}

/// Waits (up to [`REPLICATION_WAIT`]) until every record of `group_id`'s
/// partition of `__consumer_offsets` appended so far is replicated, so an
/// answer made from the coordinator's memory just before holds only commits
/// that survive the leader; a retriable error naming the group otherwise.
/// `waited` holds the partitions already waited for by this request (groups
/// that share a partition wait once).
async fn wait_durable(
    state: &Arc<BrokerState>,
    group_id: &str,
    waited: &mut BTreeMap<u32, Result<(), ErrorInfo>>,
) -> Result<(), ErrorInfo> {
    let durable = match offsets_topic(state).await {
        Ok(topic) => {
            let index = offsets_partition_for(group_id, topic.partitions.len() as u32);
            match waited.get(&index) {
                Some(done) => done.clone(),
                None => {
                    // The log end now is at or past every record the answer
                    // was made from.
                    let done = match topic.partition(index).cloned() {
                        Some(p) => {
                            let end = p.log_end_offset();
                            cluster_api::wait_replicated(
                                state,
                                &p,
                                end,
                                tokio::time::Instant::now() + REPLICATION_WAIT,
                            )
                            .await
                            .map_err(not_coordinator_if_moved)
                        }
                        None => Err(not_hosted(state, index)),
                    };
                    waited.insert(index, done.clone());
                    done
                }
            }
        }
        Err(e) => Err(e),
    };
    durable.map_err(|e| {
        ErrorInfo::new(
            e.code,
            format!(
                "group {group_id}: its committed offsets are not all replicated yet, so they \
                 could still be lost: {}",
                e.message
            ),
        )
    })
}

/// ListGroups: the groups this broker coordinates.
pub(crate) async fn list_groups(
    state: &Arc<BrokerState>,
    _req: ListGroupsRequest,
) -> ListGroupsResponse {
    state.groups.step(state, input::ListGroups).await.0
}

/// DescribeGroups: the groups coordinated here, NOT_COORDINATOR for the others.
pub(crate) async fn describe_groups(
    state: &Arc<BrokerState>,
    req: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let mut mine = Vec::new();
    let mut errors = Vec::new();
    for gid in req.group_ids {
        match check_coordinator(state, &gid).await {
            Ok(()) => mine.push(gid),
            Err(e) => errors.push(GroupDescription {
                group_id: gid,
                error: Some(e),
                state: "Unknown".into(),
                group_epoch: 0,
                assignor: String::new(),
                members: Vec::new(),
                offsets: Vec::new(),
            }),
        }
    }
    let input = input::DescribeGroups(DescribeGroupsRequest { group_ids: mine });
    let (mut resp, _) = state.groups.step(state, input).await;
    // Committed offsets are shown only once replicated, as OffsetFetch
    // answers them (a commit lost with the leader would otherwise have been
    // shown).
    let mut waited = BTreeMap::new();
    for g in resp.groups.iter_mut().filter(|g| g.error.is_none()) {
        if let Err(mut e) = wait_durable(state, &g.group_id, &mut waited).await {
            // Retriable as COORDINATOR_NOT_AVAILABLE (Kafka's admin client
            // takes REQUEST_TIMED_OUT on a described group as final).
            if e.code != ErrorCode::NotCoordinator {
                e.code = ErrorCode::CoordinatorNotAvailable;
            }
            g.error = Some(e);
            g.offsets.clear();
        }
    }
    resp.groups.extend(errors);
    resp
}

/// DeleteGroups: empty groups coordinated here, with their committed offsets.
pub(crate) async fn delete_groups(
    state: &Arc<BrokerState>,
    req: DeleteGroupsRequest,
) -> DeleteGroupsResponse {
    let mut mine = Vec::new();
    let mut results = Vec::new();
    for gid in req.group_ids {
        match check_coordinator(state, &gid).await {
            Ok(()) => mine.push(gid),
            Err(e) => results.push(GroupResult {
                group_id: gid,
                error: Some(e),
            }),
        }
    }
    let input = input::DeleteGroups(DeleteGroupsRequest { group_ids: mine });
    let (mut resp, written) = state.groups.step(state, input).await;
    if let Err(e) = written {
        for r in &mut resp.results {
            if r.error.is_none() {
                r.error = Some(e.clone());
            }
        }
    }
    resp.results.extend(results);
    resp
}

// ---------------------------------------------------------------- classic groups

/// Asks the coordinator `make()` until it answers, waking whenever the
/// coordinator changed (a look itself changes nothing, so it wakes nobody),
/// for at most `wait`; then `gave_up` (with why).
async fn await_answer<I, R>(
    state: &Arc<BrokerState>,
    make: impl Fn() -> I,
    wait: Duration,
    gave_up: impl FnOnce(ErrorInfo) -> R,
) -> R
where
    I: Input<Reply = Pending<R>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let changed = state.groups.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if let Pending::Done(r) = state.groups.look(make()) {
            return r;
        }
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep_until(deadline) => {
                return gave_up(ErrorInfo::new(
                    ErrorCode::RebalanceInProgress,
                    format!("the group's rebalance did not complete within {wait:?}: join again"),
                ));
            }
            _ = state.shutdown.cancelled() => {
                return gave_up(ErrorInfo::new(
                    ErrorCode::NotCoordinator,
                    format!("broker {} is shutting down: find the group's coordinator again", state.config.id),
                ));
            }
        }
    }
}

/// How long a member's JoinGroup or SyncGroup may wait for the others.
fn classic_wait(rebalance_timeout_ms: u32) -> Duration {
    (Duration::from_millis(u64::from(rebalance_timeout_ms)) + CLASSIC_WAIT_SLACK)
        .min(CLASSIC_WAIT_MAX)
}

/// JoinGroup (Kafka's classic protocol): answered when the group's
/// rebalance completes.
pub(crate) async fn join_group(
    state: &Arc<BrokerState>,
    req: JoinGroupRequest,
) -> JoinGroupResponse {
    let failed = |e: ErrorInfo, member_id: String| JoinGroupResponse {
        error: Some(e),
        generation: -1,
        protocol_type: String::new(),
        protocol_name: String::new(),
        leader: String::new(),
        member_id,
        members: Vec::new(),
    };
    if let Err(e) = check_coordinator(state, &req.group_id).await {
        return failed(e, req.member_id);
    }
    let new_member_id = state.groups.new_member_id(&req.client_id);
    let member_id = if req.member_id.is_empty() {
        new_member_id.clone()
    } else {
        req.member_id.clone()
    };
    let group_id = req.group_id.clone();
    let wait = classic_wait(req.rebalance_timeout_ms.max(req.session_timeout_ms));
    let input = input::JoinGroup {
        request: req,
        new_member_id,
    };
    let (reply, written) = state.groups.step(state, input).await;
    if let Err(e) = written {
        tracing::warn!(error = %e, "could not record a group generation");
    }
    if let Pending::Done(r) = reply {
        return r;
    }
    let make = || input::JoinResult {
        group_id: group_id.clone(),
        member_id: member_id.clone(),
    };
    await_answer(state, make, wait, |e| failed(e, member_id.clone())).await
}

/// SyncGroup: answered when the group's leader has given the assignment.
pub(crate) async fn sync_group(
    state: &Arc<BrokerState>,
    req: SyncGroupRequest,
) -> SyncGroupResponse {
    let failed = |e: ErrorInfo| SyncGroupResponse {
        error: Some(e),
        protocol_type: String::new(),
        protocol_name: String::new(),
        assignment: Vec::new(),
    };
    if let Err(e) = check_coordinator(state, &req.group_id).await {
        return failed(e);
    }
    let (group_id, member_id, generation) =
        (req.group_id.clone(), req.member_id.clone(), req.generation);
    if let Pending::Done(r) = state.groups.step(state, input::SyncGroup(req)).await.0 {
        return r;
    }
    let make = || input::SyncResult {
        group_id: group_id.clone(),
        member_id: member_id.clone(),
        generation,
    };
    // The leader syncs within its session timeout or is removed; the
    // coordinator's largest session timeout bounds that.
    let wait = classic_wait(state.groups.config.session_timeout_ms_max);
    await_answer(state, make, wait, failed).await
}

/// Heartbeat (Kafka's classic protocol).
pub(crate) async fn group_heartbeat(
    state: &Arc<BrokerState>,
    req: GroupHeartbeatRequest,
) -> GroupHeartbeatResponse {
    if let Err(e) = check_coordinator(state, &req.group_id).await {
        return GroupHeartbeatResponse { error: Some(e) };
    }
    state.groups.step(state, input::GroupHeartbeat(req)).await.0
}

/// LeaveGroup (Kafka's classic protocol): the group rebalances without them.
pub(crate) async fn leave_group(
    state: &Arc<BrokerState>,
    req: LeaveGroupRequest,
) -> LeaveGroupResponse {
    if let Err(e) = check_coordinator(state, &req.group_id).await {
        return LeaveGroupResponse {
            error: Some(e),
            members: Vec::new(),
        };
    }
    let (resp, written) = state.groups.step(state, input::LeaveGroup(req)).await;
    if let Err(e) = written {
        tracing::warn!(error = %e, "could not record a group generation");
    }
    resp
}

async fn find_coordinator(state: &Arc<BrokerState>, group_id: &str) -> FindCoordinatorResponse {
    let fail = |e: ErrorInfo| FindCoordinatorResponse {
        error: Some(e),
        partition: 0,
        coordinator_id: -1,
        coordinator_addr: String::new(),
    };
    if let Err(e) = super::coordinator::validate_group_id(group_id) {
        return fail(e);
    }
    let found = offsets_topic(state).await.map(|topic| {
        let p = offsets_partition_for(group_id, topic.partitions.len() as u32);
        (p, state.leader_of(&topic, p))
    });
    coordinator_answer(state, found, OFFSETS_TOPIC, &format!("group {group_id}"))
}

/// FindCoordinator's answer for a key on partition `p` of internal topic
/// `topic` led by `leader` (`what` names the key in errors).
fn coordinator_answer(
    state: &BrokerState,
    found: Result<(u32, Option<i32>), ErrorInfo>,
    topic: &str,
    what: &str,
) -> FindCoordinatorResponse {
    let fail = |e: ErrorInfo| FindCoordinatorResponse {
        error: Some(e),
        partition: 0,
        coordinator_id: -1,
        coordinator_addr: String::new(),
    };
    let (p, leader) = match found {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let Some(leader) = leader else {
        return fail(ErrorInfo::new(
            ErrorCode::CoordinatorNotAvailable,
            format!("{topic}-{p} ({what}) has no leader right now: retry"),
        ));
    };
    if leader == state.config.id && state.registry.fence().is_fenced() {
        return fail(ErrorInfo::new(
            ErrorCode::CoordinatorNotAvailable,
            format!(
                "{topic}-{p} ({what}) is led by broker {leader}, which has fenced itself (not in \
                 contact with the cluster's controller): retry, or ask another broker"
            ),
        ));
    }
    let addr = if leader == state.config.id {
        Some(state.advertised.clone())
    } else {
        state
            .cluster
            .image()
            .brokers
            .get(&leader)
            .map(|b| b.addr.clone())
    };
    let Some(addr) = addr else {
        return fail(ErrorInfo::new(
            ErrorCode::CoordinatorNotAvailable,
            format!(
                "{topic}-{p} ({what}) is led by broker {leader}, which is not registered yet: retry"
            ),
        ));
    };
    FindCoordinatorResponse {
        error: None,
        partition: p,
        coordinator_id: leader,
        coordinator_addr: addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_broker::TestBroker;

    /// Bound on each step, so a hang (a heartbeat stuck behind a load) fails
    /// the test instead of blocking it; nothing here measures time.
    const STEP: Duration = Duration::from_secs(30);

    fn join_request(group: &str) -> ConsumerGroupHeartbeatRequest {
        ConsumerGroupHeartbeatRequest {
            group_id: group.into(),
            member_id: format!("{group}-member"),
            member_epoch: 0,
            instance_id: None,
            client_id: "test".into(),
            subscribed_topics: vec!["t".into()],
            assignor: "uniform".into(),
            session_timeout_ms: 30_000,
            heartbeat_interval_ms: 1000,
            owned: Vec::new(),
        }
    }

    /// Joins `group`, retrying while `__consumer_offsets` is being created and
    /// its partitions loaded.
    async fn join(state: &Arc<BrokerState>, group: &str) -> ConsumerGroupHeartbeatResponse {
        for _ in 0..600 {
            let resp = tokio::time::timeout(STEP, heartbeat(state, join_request(group)))
                .await
                .expect("heartbeat answered");
            match &resp.error {
                Some(e)
                    if matches!(
                        e.code,
                        ErrorCode::NotCoordinator | ErrorCode::CoordinatorNotAvailable
                    ) =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => return resp,
            }
        }
        panic!("group {group} never found its coordinator");
    }

    /// The `nth` group id (g0, g1, ...) that lives on `partition` of 2.
    fn group_on(partition: u32, nth: usize) -> String {
        (0..)
            .map(|i| format!("g{i}"))
            .filter(|g| offsets_partition_for(g, 2) == partition)
            .nth(nth)
            .expect("some group id hashes there")
    }

    /// OffsetFetch answers a committed offset only once it reached the
    /// in-sync replicas. The network-fault test (issue 21) saw a group's
    /// committed offset go back: a coordinator cut from its followers
    /// answered OffsetFetch with a commit it had appended but could not
    /// replicate, and the new coordinator did not have it. Here a follower
    /// (broker 99) in the ISR never fetches, so the high watermark stops.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn offset_fetch_answers_only_replicated_commits() {
        let broker = TestBroker::start(|c| c.offsets_topic_num_partitions = 1).await;
        let state = broker.state();
        let me = state.config.id;
        let commit = |offset: i64| OffsetCommitRequest {
            group_id: "g".into(),
            member: None,
            partitions: vec![OffsetCommitPartition {
                topic: "t".into(),
                partition: 0,
                offset: Offset(offset),
                metadata: String::new(),
            }],
        };
        let fetch = || OffsetFetchRequest {
            group_id: "g".into(),
            partitions: None,
            require_stable: false,
        };
        // A commit of 5, replicated (the leader is the whole ISR).
        let mut done = None;
        for _ in 0..600 {
            let r = tokio::time::timeout(STEP, offset_commit(&state, commit(5)))
                .await
                .unwrap();
            match &r.error {
                Some(e)
                    if matches!(
                        e.code,
                        ErrorCode::NotCoordinator | ErrorCode::CoordinatorNotAvailable
                    ) =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => {
                    done = Some(r);
                    break;
                }
            }
        }
        let done = done.expect("the coordinator came up");
        assert!(done.error.is_none(), "{done:?}");
        assert!(
            done.partitions.iter().all(|p| p.error.is_none()),
            "{done:?}"
        );

        let topic = state.registry.topic(OFFSETS_TOPIC).unwrap();
        let p = topic.partition(0).unwrap().clone();
        p.set_role(Some(me), p.leader_epoch(), &[me, 99], &[me, 99]);
        let hw = p.high_watermark();
        // A commit of 7: appended on the leader, never replicated.
        let committing = {
            let state = state.clone();
            tokio::spawn(async move { offset_commit(&state, commit(7)).await })
        };
        let deadline = std::time::Instant::now() + STEP;
        while p.log_end_offset() <= hw {
            assert!(
                std::time::Instant::now() < deadline,
                "the commit was appended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let fetched = tokio::time::timeout(STEP, offset_fetch(&state, fetch()))
            .await
            .unwrap();
        assert!(
            fetched.offsets.iter().all(|o| o.offset != Some(Offset(7))),
            "OffsetFetch answered a commit that is not replicated: {fetched:?}"
        );
        let e = fetched.error.expect("the fetch fails");
        assert!(e.code.is_retriable(), "{e:?}");
        assert!(e.message.contains("not all replicated yet"), "{e:?}");
        // DescribeGroups does not show it either.
        let described = tokio::time::timeout(
            STEP,
            describe_groups(
                &state,
                DescribeGroupsRequest {
                    group_ids: vec!["g".into()],
                },
            ),
        )
        .await
        .unwrap();
        let g = &described.groups[0];
        assert!(
            g.offsets.iter().all(|o| o.offset != Some(Offset(7))),
            "DescribeGroups showed a commit that is not replicated: {g:?}"
        );
        assert!(
            g.error.as_ref().is_some_and(|e| e.code.is_retriable()),
            "{g:?}"
        );
        let failed = tokio::time::timeout(STEP, committing)
            .await
            .unwrap()
            .unwrap();
        assert!(failed.partitions[0].error.is_some(), "{failed:?}");

        // The ISR shrinks to the leader: the high watermark passes the
        // commit of 7, which is answered now.
        p.set_role(Some(me), p.leader_epoch(), &[me], &[me]);
        let fetched = tokio::time::timeout(STEP, offset_fetch(&state, fetch()))
            .await
            .unwrap();
        assert!(fetched.error.is_none(), "{fetched:?}");
        assert_eq!(fetched.offsets.len(), 1, "{fetched:?}");
        assert_eq!(fetched.offsets[0].offset, Some(Offset(7)));
        broker.shutdown().await;
    }

    /// A member gets an assignment only once the records of its join reached
    /// the in-sync replicas. The network-fault test saw two members each
    /// hold all 3 partitions of a group for 29 ms after a heal: a deposed
    /// coordinator answered a join whose records it could no longer
    /// replicate, and its successor, which never got them, gave the
    /// partitions to another member. Here the ISR holds a follower (broker
    /// 99) that never fetches, and the coordinator loses its leadership while
    /// the join waits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_join_is_answered_only_once_its_records_are_replicated() {
        let broker = TestBroker::start(|c| c.offsets_topic_num_partitions = 1).await;
        let state = broker.state();
        broker.create_topic("t", 3).await;
        // Another group's member joins: the coordinator is up and loaded,
        // and a lone member gets every partition of t.
        let warm = join(&state, "warm").await;
        assert!(warm.error.is_none(), "{:?}", warm.error);
        assert_eq!(
            warm.assignment
                .iter()
                .map(|t| t.partitions.len())
                .sum::<usize>(),
            3
        );

        let me = state.config.id;
        let topic = state.registry.topic(OFFSETS_TOPIC).unwrap();
        let p = topic.partition(0).unwrap().clone();
        p.set_role(Some(me), p.leader_epoch(), &[me, 99], &[me, 99]);
        let hw = p.high_watermark();
        let joining = {
            let state = state.clone();
            tokio::spawn(async move { heartbeat(&state, join_request("g")).await })
        };
        let deadline = std::time::Instant::now() + STEP;
        while p.log_end_offset() <= hw {
            assert!(
                std::time::Instant::now() < deadline,
                "the join was appended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Broker 99 takes the partition over before it fetched the join.
        p.set_role(
            Some(99),
            LeaderEpoch(p.leader_epoch().0 + 1),
            &[me, 99],
            &[me, 99],
        );
        let resp = tokio::time::timeout(STEP, joining).await.unwrap().unwrap();
        assert!(
            resp.assignment.is_empty(),
            "a join whose records were not replicated was given partitions: {resp:?}"
        );
        let e = resp.error.clone().expect("the join is refused");
        assert_eq!(e.code, ErrorCode::NotCoordinator, "{e:?}");
        assert_eq!(resp.member_epoch, 0, "{resp:?}");
        broker.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heartbeats_are_answered_while_a_partition_loads() {
        let broker = TestBroker::start(|c| c.offsets_topic_num_partitions = 2).await;
        let state = broker.state();
        let (a, c, b) = (group_on(0, 0), group_on(0, 1), group_on(1, 0));
        let first_a = join(&state, &a).await;
        assert!(first_a.error.is_none(), "{:?}", first_a.error);
        let first_b = join(&state, &b).await;
        assert!(first_b.error.is_none(), "{:?}", first_b.error);

        // Hold the next load of partition 1 inside its replay.
        let (entered_tx, mut entered) = tokio::sync::mpsc::channel::<()>(1);
        let (release, release_rx) = std::sync::mpsc::sync_channel::<()>(1);
        let release_rx = Mutex::new(release_rx);
        *state.groups.load_hook.lock() = Some(Arc::new(move |index| {
            if index == 1 {
                entered_tx.blocking_send(()).unwrap();
                release_rx.lock().recv().unwrap();
            }
        }));
        // As if leadership of partition 1 had moved away and back: it must be
        // loaded again (the timer or the next request does it).
        state.groups.inner.lock().forget(1, 2);
        let topic = state.registry.topic(OFFSETS_TOPIC).unwrap();
        let loading = {
            let (state, topic) = (state.clone(), topic.clone());
            tokio::spawn(async move { load_partition(&state, &topic, 1).await })
        };
        tokio::time::timeout(STEP, entered.recv())
            .await
            .expect("the load reached its replay")
            .unwrap();

        // While partition 1 replays, group a (partition 0) is served: a
        // heartbeat, and a commit (an append to partition 0).
        let mut again = join_request(&a);
        again.member_epoch = first_a.member_epoch;
        // (On its own task: a heartbeat stuck behind the load makes the
        // timeout below fail the test rather than stall this task.)
        let served = {
            let state = state.clone();
            tokio::spawn(async move { heartbeat(&state, again).await })
        };
        let resp = tokio::time::timeout(STEP, served)
            .await
            .expect("a heartbeat is answered while another partition loads")
            .unwrap();
        assert!(resp.error.is_none(), "{:?}", resp.error);
        assert_eq!(resp.member_epoch, first_a.member_epoch);
        // An admin commit to a group without members (c, also on partition
        // 0) is appended, replayed and visible.
        let commit = OffsetCommitRequest {
            group_id: c.clone(),
            member: None,
            partitions: vec![OffsetCommitPartition {
                topic: "t".into(),
                partition: 0,
                offset: Offset(5),
                metadata: String::new(),
            }],
        };
        let committed = tokio::time::timeout(STEP, offset_commit(&state, commit))
            .await
            .expect("a commit is answered while another partition loads");
        assert!(committed.error.is_none(), "{:?}", committed.error);
        assert!(
            committed.partitions.iter().all(|p| p.error.is_none()),
            "{committed:?}"
        );
        let fetch = OffsetFetchRequest {
            group_id: c.clone(),
            partitions: None,
            require_stable: false,
        };
        let fetched = tokio::time::timeout(STEP, offset_fetch(&state, fetch))
            .await
            .unwrap();
        assert_eq!(fetched.offsets.len(), 1, "{fetched:?}");
        assert_eq!(fetched.offsets[0].offset, Some(Offset(5)));
        assert!(
            !loading.is_finished(),
            "the load is still held in its replay"
        );
        assert!(!state.groups.is_loaded(topic.partition(1).unwrap()));

        // Let the load finish: group b's durable epoch came back from the log,
        // so a new member joins at a later epoch.
        release.send(()).unwrap();
        tokio::time::timeout(STEP, loading)
            .await
            .expect("the load finishes")
            .unwrap()
            .unwrap();
        assert!(state.groups.is_loaded(topic.partition(1).unwrap()));
        let mut newcomer = join_request(&b);
        newcomer.member_id = "newcomer".into();
        let resp = tokio::time::timeout(STEP, heartbeat(&state, newcomer))
            .await
            .unwrap();
        assert!(resp.error.is_none(), "{:?}", resp.error);
        assert!(
            resp.member_epoch > first_b.member_epoch,
            "{} > {}",
            resp.member_epoch,
            first_b.member_epoch
        );
        *state.groups.load_hook.lock() = None;
        broker.shutdown().await;
    }
}
