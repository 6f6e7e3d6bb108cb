//! Replication: followers fetch from their leader over QUIC with the ordinary
//! Fetch (`replica_id` set), truncating first by the leader's epoch boundary
//! (KIP-101 OffsetForLeaderEpoch, never to their own high watermark); leaders
//! track each follower's log end offset, move the high watermark to the lowest
//! one in the ISR, and ask the controller to shrink the ISR of a follower that
//! lagged more than `replica.lag.time.max.ms` and to expand it again once the
//! follower caught up (KIP-966 style: ISR changes go through the quorum).
//!
//! The ISR decision is a pure transition of the partition's replication state
//! ([`crate::replica::ReplicaState::isr_change`]), unit-tested without a runtime.

use crate::handlers::blocking;
use crate::partition::Partition;
use crate::state::BrokerState;
use futures::StreamExt;
use parking_lot::Mutex;
use rill_proto::types::now_ms;
use rill_proto::wire::*;
use rill_proto::{LeaderEpoch, Offset};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Longest a follower's fetch waits at the leader for new data.
pub const REPLICA_FETCH_WAIT: Duration = Duration::from_millis(500);
/// Most bytes one follower fetch asks for.
pub const REPLICA_FETCH_BYTES_MAX: u32 = 8 * 1024 * 1024;
/// Pause after a failed follower fetch before the next try.
pub const REPLICA_RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// Most OffsetForLeaderEpoch rounds for one partition before it backs off
/// (each round asks an earlier epoch, so a log with fewer epochs settles sooner).
const TRUNCATION_ROUNDS_MAX: usize = 64;
/// Most OffsetForLeaderEpoch requests one fetcher has in flight.
pub const TRUNCATIONS_IN_FLIGHT_MAX: usize = 64;
/// How often a leader checks its partitions' ISR.
pub const ISR_CHECK_INTERVAL: Duration = Duration::from_millis(200);
/// Most ISR changes one quorum entry carries ([`super::image::Command::AlterIsrBatch`]).
pub const ISR_CHANGES_PER_PROPOSAL_MAX: usize = 1024;

/// The topic's replication settings (min.insync.replicas, replica.lag.time.max.ms,
/// ...), as its committed configs give them; the broker's defaults for a topic
/// this broker does not host.
pub fn topic_replication_settings(
    state: &BrokerState,
    topic: &str,
) -> crate::topic_configs::ReplicationSettings {
    match state.registry.topic(topic) {
        Some(t) => *t.replication.lock(),
        None => {
            crate::topic_configs::TopicSettings::resolve_committed(
                topic,
                state.registry.defaults(),
                &Default::default(),
            )
            .replication
        }
    }
}

/// On a leader, every [`ISR_CHECK_INTERVAL`]: proposes ISR changes for the
/// partitions it leads, up to [`ISR_CHANGES_PER_PROPOSAL_MAX`] in one quorum
/// entry (one entry per partition, a broker back from a restart waited for
/// thousands of quorum appends in a row before it was in every ISR again).
pub async fn isr_loop(state: Arc<BrokerState>) {
    let mut leading_since: BTreeMap<(String, u32, LeaderEpoch), Instant> = BTreeMap::new();
    let mut timer = tokio::time::interval(ISR_CHECK_INTERVAL);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        let now = Instant::now();
        if state.registry.fence().is_fenced() {
            // No ISR changes while fenced (follower fetches are refused, so
            // every follower would look behind); on the lift every leadership
            // counts afresh, giving followers a whole lag time to fetch again.
            leading_since.clear();
            continue;
        }
        let mut live = BTreeMap::new();
        let mut changes = Vec::new();
        for p in state.registry.partitions() {
            // One consistent view: the epoch, ISR, followers and watermark together.
            let replica = p.replica_state();
            if !replica.is_leader() {
                continue;
            }
            let key = (p.topic().to_string(), p.index(), replica.leader_epoch());
            let since = *leading_since.entry(key.clone()).or_insert(now);
            live.insert(key, since);
            let lag_max = Duration::from_millis(
                topic_replication_settings(&state, p.topic()).replica_lag_time_max_ms,
            );
            let epoch_start = p
                .end_offset_for_epoch(LeaderEpoch(replica.leader_epoch().0 - 1))
                .ok()
                .flatten()
                .map_or(Offset(0), |(_, end)| end)
                .max(p.isr_join_floor());
            let Some(new_isr) = replica.isr_change(epoch_start, since, lag_max, now) else {
                continue;
            };
            tracing::info!(partition = %format!("{}-{}", p.topic(), p.index()), old = ?replica.isr(), new = ?new_isr, "asking the controller to change the ISR");
            changes.push(super::image::IsrChange {
                topic: p.topic().to_string(),
                partition: p.index(),
                leader_epoch: replica.leader_epoch(),
                new_isr,
            });
        }
        leading_since = live;
        for chunk in changes.chunks(ISR_CHANGES_PER_PROPOSAL_MAX) {
            let command = super::image::Command::AlterIsrBatch {
                broker_id: state.config.id,
                changes: chunk.to_vec(),
            };
            // Shutdown does not wait for the quorum (which may be gone already).
            let result = tokio::select! {
                _ = state.shutdown.cancelled() => return,
                result = state.cluster.propose(command) => result,
            };
            match result {
                Ok(super::image::Outcome::Refused { message, .. }) => {
                    tracing::debug!(%message, "ISR changes refused")
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "ISR changes not committed"),
            }
        }
    }
}

/// One partition a fetcher follows.
#[derive(Debug)]
struct Followed {
    partition: Arc<Partition>,
    /// The leader epoch the quorum gave when this broker started following.
    epoch: LeaderEpoch,
    /// Truncated to the leader's epoch boundary (KIP-101) and fetching.
    truncated: bool,
    /// After a failure: not asked for again before this.
    retry_at: Option<Instant>,
}

/// Follows every partition this broker replicates from one leader, with one
/// multi-partition Fetch at a time (as Kafka's replica fetcher thread per source
/// broker), so a broker following thousands of partitions runs one task and one
/// long poll per leader, not one per partition. Reconcile adds and removes
/// partitions (`follow`, `unfollow`); the fetcher picks the change up at once.
///
/// Each partition first truncates to the leader's epoch boundary
/// (OffsetForLeaderEpoch), then is fetched from its log end offset; the leader's
/// high watermark is taken after every answer. A partition the leader refuses
/// (it moved, the epoch is fenced) backs off for [`REPLICA_RETRY_BACKOFF`] while
/// the others go on. The order of partitions in a request rotates, so a busy
/// partition cannot starve the others of the response's byte budget.
#[derive(Debug)]
pub struct ReplicaFetcher {
    leader: i32,
    addr: String,
    followed: Mutex<BTreeMap<(String, u32), Followed>>,
    changed: Notify,
    /// When "the data disk is full" was last logged, and how many refusals
    /// went unlogged since (one line per [`DISK_FULL_LOG_EVERY`], not per fetch).
    disk_full_logged: Mutex<(Option<Instant>, u64)>,
}

/// How often a follower whose disk is full says so.
const DISK_FULL_LOG_EVERY: Duration = Duration::from_secs(10);

impl ReplicaFetcher {
    pub fn new(leader: i32, addr: String) -> ReplicaFetcher {
        ReplicaFetcher {
            leader,
            addr,
            followed: Mutex::new(BTreeMap::new()),
            disk_full_logged: Mutex::new((None, 0)),
            changed: Notify::new(),
        }
    }

    pub fn leader(&self) -> i32 {
        self.leader
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Starts following `partition` at leader epoch `epoch` (again from the
    /// truncation step when the epoch changed).
    pub fn follow(&self, partition: Arc<Partition>, epoch: LeaderEpoch) {
        let key = (partition.topic().to_string(), partition.index());
        let mut followed = self.followed.lock();
        if followed.get(&key).is_some_and(|f| f.epoch == epoch) {
            return;
        }
        followed.insert(
            key,
            Followed {
                partition,
                epoch,
                truncated: false,
                retry_at: None,
            },
        );
        drop(followed);
        self.changed.notify_one();
    }

    /// Stops following a partition; an answer in flight for it is dropped.
    pub fn unfollow(&self, topic: &str, partition: u32) {
        if self
            .followed
            .lock()
            .remove(&(topic.to_string(), partition))
            .is_some()
        {
            self.changed.notify_one();
        }
    }

    /// The partitions followed, with their epochs.
    pub fn followed(&self) -> Vec<((String, u32), LeaderEpoch)> {
        self.followed
            .lock()
            .iter()
            .map(|(k, f)| (k.clone(), f.epoch))
            .collect()
    }

    /// Whether `key` is still followed at `epoch` (an answer for it may be used).
    fn still(&self, key: &(String, u32), epoch: LeaderEpoch) -> bool {
        self.followed
            .lock()
            .get(key)
            .is_some_and(|f| f.epoch == epoch)
    }

    fn update(&self, key: &(String, u32), epoch: LeaderEpoch, f: impl FnOnce(&mut Followed)) {
        if let Some(followed) = self.followed.lock().get_mut(key)
            && followed.epoch == epoch
        {
            f(followed);
        }
    }

    fn back_off(&self, key: &(String, u32), epoch: LeaderEpoch) {
        self.update(key, epoch, |f| {
            f.retry_at = Some(Instant::now() + REPLICA_RETRY_BACKOFF)
        });
    }

    /// Runs until `stop`.
    pub async fn run(self: Arc<Self>, state: Arc<BrokerState>, stop: CancellationToken) {
        let mut rotation = 0usize;
        loop {
            if stop.is_cancelled() {
                return;
            }
            // Register before looking, so no change is missed in between.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = Instant::now();
            let (to_truncate, mut to_fetch, next_retry) = {
                let followed = self.followed.lock();
                let mut to_truncate = Vec::new();
                let mut to_fetch = Vec::new();
                let mut next_retry: Option<Instant> = None;
                for (key, f) in followed.iter() {
                    if let Some(at) = f.retry_at.filter(|at| *at > now) {
                        next_retry = Some(next_retry.map_or(at, |n| n.min(at)));
                        continue;
                    }
                    let entry = (key.clone(), f.partition.clone(), f.epoch);
                    if f.truncated {
                        to_fetch.push(entry);
                    } else {
                        to_truncate.push(entry);
                    }
                }
                (to_truncate, to_fetch, next_retry)
            };
            if !to_truncate.is_empty() {
                self.truncate_all(&state, to_truncate, &stop).await;
                continue;
            }
            if to_fetch.is_empty() {
                let idle = next_retry.map_or(Duration::from_secs(3600), |at| {
                    at.saturating_duration_since(now)
                });
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = changed => {}
                    _ = tokio::time::sleep(idle) => {}
                }
                continue;
            }
            rotation = rotation.wrapping_add(1);
            let len = to_fetch.len();
            to_fetch.rotate_left(rotation % len);
            tokio::select! {
                _ = stop.cancelled() => return,
                // A partition added or removed: ask again with the new set.
                _ = changed => {}
                _ = self.fetch_once(&state, &to_fetch) => {}
            }
        }
    }

    /// KIP-101 for each partition: ask where our latest epoch ends on the leader
    /// and cut what is past it. Up to [`TRUNCATIONS_IN_FLIGHT_MAX`] at once.
    async fn truncate_all(
        &self,
        state: &BrokerState,
        partitions: Vec<FetchEntry>,
        stop: &CancellationToken,
    ) {
        let timeout = REPLICA_FETCH_WAIT + Duration::from_secs(2);
        let work = futures::stream::iter(partitions)
            .map(|(key, p, epoch)| async move {
                let tp = format!("{}-{}", p.topic(), p.index());
                // KIP-279: when the leader answers with an epoch this replica
                // does not have, cut back to where this replica's own earlier
                // epoch ends and ask again; each round asks an earlier epoch.
                for _ in 0..TRUNCATION_ROUNDS_MAX {
                    let Some(ours) = p.latest_epoch() else {
                        return (key, epoch, true);
                    };
                    let req = OffsetForLeaderEpochRequest {
                        topic: p.topic().to_string(),
                        partition: p.index(),
                        current_leader_epoch: epoch,
                        leader_epoch: ours,
                    };
                    let resp = match state.cluster.links.call(&self.addr, &req, timeout).await {
                        Ok((resp, _)) => resp,
                        Err(e) => {
                            tracing::debug!(partition = %tp, error = %e, "OffsetForLeaderEpoch failed; retrying");
                            return (key, epoch, false);
                        }
                    };
                    if !self.still(&key, epoch) {
                        return (key, epoch, false);
                    }
                    let t = match p.truncation(resp.leader_epoch.map(|e| (e, resp.end_offset))) {
                        Ok(t) => t,
                        Err(e) => {
                            tracing::error!(partition = %tp, error = %e, "cannot read the log's epochs");
                            return (key, epoch, false);
                        }
                    };
                    if t.to < p.log_end_offset() || !t.settled {
                        tracing::info!(partition = %tp, from = %p.log_end_offset(), to = %t.to, our_epoch = %ours, leaders_answer = ?resp.leader_epoch, leader_epoch = %epoch, settled = t.settled, "truncating to the leader's epoch boundary");
                        let p2 = p.clone();
                        if let Err(e) = blocking(move || p2.truncate_to(t.to)).await.and_then(|r| r) {
                            tracing::error!(partition = %tp, error = %e, "truncation failed");
                            return (key, epoch, false);
                        }
                    }
                    if t.settled {
                        return (key, epoch, true);
                    }
                }
                tracing::warn!(partition = %tp, rounds = TRUNCATION_ROUNDS_MAX, "truncation did not settle with the leader; retrying");
                (key, epoch, false)
            })
            .buffer_unordered(TRUNCATIONS_IN_FLIGHT_MAX);
        tokio::pin!(work);
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                next = work.next() => next,
            };
            let Some((key, epoch, done)) = next else {
                return;
            };
            if done {
                self.update(&key, epoch, |f| {
                    f.truncated = true;
                    f.retry_at = None;
                });
            } else {
                self.back_off(&key, epoch);
            }
        }
    }

    /// One Fetch for every partition ready to fetch; appends what came and takes
    /// the leader's high watermarks.
    async fn fetch_once(&self, state: &BrokerState, partitions: &[FetchEntry]) {
        let timeout = REPLICA_FETCH_WAIT + Duration::from_secs(2);
        let req = FetchRequest {
            max_wait_ms: REPLICA_FETCH_WAIT.as_millis() as u32,
            min_bytes: 1,
            max_bytes: REPLICA_FETCH_BYTES_MAX,
            replica_id: Some(state.config.id),
            isolation: rill_proto::wire::Isolation::ReadUncommitted,
            partitions: partitions
                .iter()
                .map(|(_, p, epoch)| FetchPartition {
                    topic: p.topic().to_string(),
                    partition: p.index(),
                    offset: p.log_end_offset(),
                    max_bytes: REPLICA_FETCH_BYTES_MAX,
                    current_leader_epoch: Some(*epoch),
                })
                .collect(),
        };
        let (resp, payload) = match state.cluster.links.call(&self.addr, &req, timeout).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::debug!(leader = self.leader, error = %e, "replica fetch failed");
                for (key, _, epoch) in partitions {
                    self.back_off(key, *epoch);
                }
                return;
            }
        };
        // Appended from the pieces it arrived in where they are large (as a
        // produce body's are); pieces of an Ethernet-sized packet are joined,
        // as each would pin its receive buffer and cost an iovec.
        let pieces = payload.pieces().len();
        let payload = if pieces > 1 && payload.len() / pieces < crate::server::KEPT_CHUNK_MIN {
            rill_proto::Rope::from(payload.to_bytes())
        } else {
            payload
        };
        // The payload holds each partition's bytes in order (bytes_len each).
        let mut at = 0usize;
        let mut appends = Vec::new();
        for ((key, p, epoch), fp) in partitions.iter().zip(&resp.partitions) {
            let len = fp.bytes_len as usize;
            let bytes = payload.slice(at.min(payload.len()), (at + len).min(payload.len()));
            at += len;
            if fp.topic != p.topic() || fp.partition != p.index() {
                tracing::warn!(
                    leader = self.leader,
                    "a replica fetch answer is out of order; retrying"
                );
                self.back_off(key, *epoch);
                continue;
            }
            match &fp.error {
                None if !bytes.is_empty()
                    && !crate::auth::is_internal_topic(p.topic())
                    && let Err(e) = state
                        .disk
                        .check_append(&format!("{}-{}", p.topic(), p.index()), bytes.len()) =>
                {
                    // Out of space: stop appending (the leader drops this
                    // replica from the ISR when it lags) until there is room.
                    let mut logged = self.disk_full_logged.lock();
                    if logged
                        .0
                        .is_none_or(|at| at.elapsed() >= DISK_FULL_LOG_EVERY)
                    {
                        tracing::warn!(
                            error = %e.message,
                            refusals_since_last_line = logged.1,
                            "not replicating: the data disk is full"
                        );
                        *logged = (Some(Instant::now()), 0);
                    } else {
                        logged.1 += 1;
                    }
                    drop(logged);
                    self.back_off(key, *epoch);
                }
                None => appends.push((key.clone(), p.clone(), *epoch, bytes, fp.high_watermark)),
                Some(e)
                    if e.code == ErrorCode::OffsetOutOfRange
                        && fp.log_start_offset > p.log_end_offset() =>
                {
                    // Everything this replica has is gone on the leader
                    // (retention moved its log start past our end): start
                    // again from the leader's log start.
                    let tp = format!("{}-{}", p.topic(), p.index());
                    tracing::info!(partition = %tp, from = %p.log_end_offset(), to = %fp.log_start_offset, "behind the leader's log start: restarting the replica there");
                    let (p2, start) = (p.clone(), fp.log_start_offset);
                    if let Err(e) = blocking(move || p2.restart_at(start)).await.and_then(|r| r) {
                        tracing::error!(partition = %tp, error = %e, "cannot restart the replica");
                        self.back_off(key, *epoch);
                    }
                }
                Some(e) => {
                    tracing::debug!(partition = %format!("{}-{}", p.topic(), p.index()), error = %e, "replica fetch refused");
                    self.back_off(key, *epoch);
                }
            }
        }
        // Only what is still followed at the same epoch is appended (an answer
        // that crossed a leadership change is dropped).
        appends.retain(|(key, _, epoch, _, _)| self.still(key, *epoch));
        if appends.is_empty() {
            return;
        }
        let now = now_ms();
        let total: usize = appends.iter().map(|(_, _, _, bytes, _)| bytes.len()).sum();
        // As a produce's: small appends on this task (no hand-over to the
        // blocking pool and back for each answer) where they cannot wait on
        // the disk or on the log's mutex (`try_append_replicated`); large
        // ones, and the rest, on the blocking pool.
        // A panic in an append is logged and the fetcher goes on, here as on
        // the blocking pool (where it surfaces as a JoinError): the
        // partitions followed from this leader keep replicating.
        let rest = if total <= crate::handlers::APPEND_INLINE_MAX {
            let inline = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut rest = Vec::new();
                for entry in appends {
                    let (_, p, _, bytes, hw) = &entry;
                    if bytes.is_empty() {
                        p.follow_high_watermark(*hw);
                        continue;
                    }
                    match p.try_append_replicated(bytes, now) {
                        Some(Ok(())) => p.follow_high_watermark(*hw),
                        Some(Err(e)) => append_failed(p, &e),
                        None => rest.push(entry),
                    }
                }
                rest
            }));
            match inline {
                Ok(rest) => rest,
                Err(_) => {
                    tracing::error!(leader = self.leader, "replica append panicked");
                    return;
                }
            }
        } else {
            appends
        };
        if rest.is_empty() {
            return;
        }
        let append_all = move || {
            for (_, p, _, bytes, hw) in &rest {
                if !bytes.is_empty()
                    && let Err(e) = p.append_replicated(bytes, now)
                {
                    append_failed(p, &e);
                    continue;
                }
                p.follow_high_watermark(*hw);
            }
        };
        if let Err(e) = tokio::task::spawn_blocking(append_all).await {
            tracing::error!(leader = self.leader, error = %e, "replica append task failed");
        }
    }
}

/// Logs a follower append that failed (the partition is fetched again from
/// its log end).
fn append_failed(p: &Partition, e: &ErrorInfo) {
    tracing::warn!(partition = %format!("{}-{}", p.topic(), p.index()), error = %e, "could not append replicated batches");
}

/// (key, partition, epoch) of one partition in a fetcher's pass.
type FetchEntry = ((String, u32), Arc<Partition>, LeaderEpoch);
