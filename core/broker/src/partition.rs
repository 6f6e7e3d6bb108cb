//! `Partition` and `Topic`: the broker's live view of one partition it hosts,
//! as leader or follower.
//!
//! A `Partition` owns one partition's `Log` behind a short-held mutex (appends,
//! index lookups) and its replication state — leader, leader epoch, replicas,
//! ISR, follower progress and high watermark — as one [`ReplicaState`] behind
//! another, changed only through that type's pure transitions. The quorum's
//! assignment sets the role (`set_role`); a broker alone in the ISR moves the
//! high watermark to the log end offset at every append.
//!
//! Invariants:
//! - `log_start_offset <= high_watermark <= log_end_offset`, kept by
//!   `ReplicaState`'s transitions, which take the log's offsets as arguments.
//! - Lock order: the log mutex, then the replica state; never the reverse.
//! - File reads never happen under the log mutex: `read` returns a `FileSlice`
//!   that the caller reads afterwards.
//! - Every append (and close) wakes the fetches waiting on the partition; every
//!   move of the high watermark and every role change wakes acks=all waiters.
//! - Once closed (shutdown, topic deleted) the log is gone; every operation
//!   answers `UNKNOWN_TOPIC_OR_PARTITION` (deleted) or `BROKER_NOT_AVAILABLE`.
//! - Tiered storage: the log's own start is the *local* log start offset; the
//!   partition's log start offset is the earlier of it and the remote manifest's
//!   start. Reads below the local start are planned as remote reads
//!   ([`ReadPlan::Remote`]). With `remote.storage.enable`, local retention deletes
//!   only segments the published manifest covers.

use crate::fence::SelfFence;
use crate::tier::{RemoteLog, RemoteSegment};
use parking_lot::{Mutex, RwLock};
use rill_log::{AppendInfo, FileSlice, Log, LogConfig, LogError, TierableSegment};
use rill_proto::wire::{ErrorCode, ErrorInfo};
use rill_proto::{LeaderEpoch, Offset, Rope, TimestampMs};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Instant;
use tokio::sync::Notify;

pub use crate::replica::{FollowerState, ReplicaState};

/// Which operation a log error happened in; decides how it is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogOp {
    Append,
    Read,
    Maintain,
}

/// How long an async task waits for the log's mutex at a time while a short
/// holder has it, before looking again whether a long holder came.
const SHORT_HOLD_SLICE: std::time::Duration = std::time::Duration::from_micros(100);

/// An upper bound on the bytes of a transaction marker's batch (a batch
/// header and one record of a 4-byte key and a 6-byte value), for
/// [`Log::append_may_sync`].
const MARKER_BYTES_MAX: u64 = 128;

/// The gauges of one partition, registered once (not per append).
#[derive(Debug, Clone)]
struct PartitionGauges {
    log_start_offset: metrics::Gauge,
    log_end_offset: metrics::Gauge,
    remote_size_bytes: metrics::Gauge,
}

/// Where a read at some offset is served from.
#[derive(Debug, Clone)]
pub enum ReadPlan {
    /// Bytes of a local segment file.
    Local(FileSlice),
    /// A segment in the object store (the offset is below the local log start).
    Remote {
        remote: Arc<RemoteLog>,
        segment: RemoteSegment,
        offset: Offset,
        max_bytes: usize,
    },
}

/// One partition this broker leads.
#[derive(Debug)]
pub struct Partition {
    topic: Arc<str>,
    index: u32,
    dir: PathBuf,
    log: Mutex<Option<Log>>,
    broker_id: i32,
    /// The broker's self-fence: while it is up, this broker leads nothing.
    fence: Arc<SelfFence>,
    /// Leader, epoch, replicas, ISR, follower progress and high watermark, as one.
    replica: Mutex<ReplicaState>,
    /// Woken when the high watermark moves or the role changes (acks=all waits on it).
    hw_moved: Notify,
    log_start_offset: AtomicI64,
    local_log_start_offset: AtomicI64,
    /// The manifest of the remote copy, once the tier has loaded it.
    remote: RwLock<Option<Arc<RemoteLog>>>,
    /// The broker tiers but could not load this partition's manifest yet: what
    /// lies below the local start is unknown (reads there are retriable errors,
    /// not "out of range", so no consumer resets past remote data).
    remote_pending: AtomicBool,
    log_end_offset: AtomicI64,
    /// The log's first unstable offset (-1: no open transaction), kept with
    /// the other offsets so a fetch reads the last stable offset without the
    /// log's lock.
    first_unstable_offset: AtomicI64,
    deleted: AtomicBool,
    /// The log fsyncs on appends (`flush.messages` set): append off the async workers.
    syncs_on_append: AtomicBool,
    /// Holders of the log's mutex that may keep it long (maintenance: roll,
    /// flush, retention, compaction, truncation; appends that may fsync),
    /// counted from before they lock it: an async task does not wait for
    /// those ([`Partition::with_log_if`]).
    long_holds: AtomicUsize,
    data_arrived: Notify,
    gauges: PartitionGauges,
    /// The log end when this process opened the log. What lies below it may
    /// have been acknowledged before a restart, while the high watermark
    /// restarts from the log start: a replica joins the ISR only once it holds
    /// this much (Kafka's leader-epoch start offset plays that part).
    opened_end: Offset,
}

impl Partition {
    /// Opens (creating or recovering) the log in `dir`.
    pub fn open(
        topic: Arc<str>,
        index: u32,
        dir: &Path,
        config: LogConfig,
        leader_epoch: LeaderEpoch,
        broker_id: i32,
        fence: Arc<SelfFence>,
        now_ms: TimestampMs,
    ) -> Result<Partition, LogError> {
        let syncs_on_append = config.flush_messages.is_some();
        let log = Log::open(dir, config, now_ms)?;
        let unstable = log.first_unstable_offset().map_or(-1, |o| o.0);
        let start = log.log_start_offset();
        let end = log.log_end_offset();
        let labels = [
            ("topic", topic.to_string()),
            ("partition", index.to_string()),
        ];
        let gauges = PartitionGauges {
            log_start_offset: metrics::gauge!(crate::metrics::PARTITION_LOG_START_OFFSET, &labels),
            log_end_offset: metrics::gauge!(crate::metrics::PARTITION_LOG_END_OFFSET, &labels),
            remote_size_bytes: metrics::gauge!(crate::tier::TIER_REMOTE_SIZE_BYTES, &labels),
        };
        gauges.log_start_offset.set(start.0 as f64);
        gauges.log_end_offset.set(end.0 as f64);
        Ok(Partition {
            topic,
            index,
            dir: dir.to_path_buf(),
            log: Mutex::new(Some(log)),
            broker_id,
            fence,
            // Nothing on disk is known to be replicated: a restarted replica's
            // log may end with batches its ISR never got. The high watermark
            // starts at the log start; `set_role` moves it to the log end at
            // once when this broker is alone in the ISR, and otherwise it moves
            // as the followers fetch (a leader) or from the leader's answers (a
            // follower). Starting it at the log end made a restarted leader
            // acknowledge a retried acks=all batch (answered as a duplicate from
            // the producer table) that only it held (issue 21, run 22).
            replica: Mutex::new(ReplicaState::opened(broker_id, leader_epoch, start)),
            hw_moved: Notify::new(),
            log_start_offset: AtomicI64::new(start.0),
            local_log_start_offset: AtomicI64::new(start.0),
            remote: RwLock::new(None),
            remote_pending: AtomicBool::new(false),
            log_end_offset: AtomicI64::new(end.0),
            first_unstable_offset: AtomicI64::new(unstable),
            deleted: AtomicBool::new(false),
            syncs_on_append: AtomicBool::new(syncs_on_append),
            long_holds: AtomicUsize::new(0),
            data_arrived: Notify::new(),
            gauges,
            opened_end: end,
        })
    }

    /// The least log end a replica must hold to join the ISR beside what the
    /// high watermark asks: the log end at open (capped at the log end now,
    /// after a truncation), so a restarted leader, whose high watermark starts
    /// low, does not take back a follower that lacks records acknowledged
    /// before the restart.
    pub fn isr_join_floor(&self) -> Offset {
        self.opened_end.min(self.log_end_offset())
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }
    pub fn index(&self) -> u32 {
        self.index
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn leader_epoch(&self) -> LeaderEpoch {
        self.replica.lock().leader_epoch()
    }
    pub fn replicas(&self) -> Vec<i32> {
        self.replica.lock().replicas().to_vec()
    }
    /// The leader's broker id, if the partition has one.
    pub fn leader(&self) -> Option<i32> {
        self.replica.lock().leader()
    }
    /// Whether this broker leads the partition: the quorum made it the leader
    /// and it has not fenced itself (cut off from the controller, see
    /// [`crate::fence`]).
    pub fn is_leader(&self) -> bool {
        !self.fence.is_fenced() && self.replica.lock().is_leader()
    }

    /// Completes when this broker's self-fence goes up or down (waiters on
    /// the high watermark re-check their leadership on it).
    pub fn fence_changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.fence.changed()
    }
    /// The whole replication state at one moment (leader, epoch, ISR and high
    /// watermark consistent with each other).
    pub fn replica_state(&self) -> ReplicaState {
        self.replica.lock().clone()
    }

    /// Takes the leadership and replica set the quorum committed. A new leader
    /// epoch on the leader forgets what it knew of followers.
    pub fn set_role(&self, leader: Option<i32>, epoch: LeaderEpoch, replicas: &[i32], isr: &[i32]) {
        let leo = self.log_end_offset();
        self.replica
            .lock()
            .set_role(leader, epoch, replicas, isr, leo);
        // Wake fetches and acks=all waiters: they re-check leadership and the watermark.
        self.data_arrived.notify_waiters();
        self.hw_moved.notify_waiters();
    }

    /// The error for a client request on a partition this broker does not lead.
    pub fn not_leader_error(&self) -> ErrorInfo {
        ErrorInfo::new(
            ErrorCode::NotLeaderOrFollower,
            match self.leader() {
                Some(l) if l == self.broker_id && self.fence.is_fenced() => format!(
                    "broker {} has not reached the cluster's controller for {} ms (more than \
                     the broker session timeout), so it no longer serves partition {}-{} as \
                     leader: the controller may have moved it; refresh metadata from another broker",
                    self.broker_id,
                    self.fence.silent_for(Instant::now()).as_millis(),
                    self.topic,
                    self.index
                ),
                Some(l) => format!(
                    "broker {} does not lead partition {}-{} (broker {l} does, epoch {}): refresh metadata",
                    self.broker_id,
                    self.topic,
                    self.index,
                    self.leader_epoch()
                ),
                None => format!(
                    "partition {}-{} has no leader (no in-sync replica is alive): retry later",
                    self.topic, self.index
                ),
            },
        )
    }

    /// On the leader: records a follower's fetch from `offset` (its log end offset).
    pub fn record_follower_fetch(&self, follower: i32, offset: Offset, now: Instant) {
        let leo = self.log_end_offset();
        let moved = self
            .replica
            .lock()
            .record_follower_fetch(follower, offset, now, leo);
        self.wake_if_moved(moved);
    }

    /// What the leader knows of its followers.
    pub fn followers(&self) -> BTreeMap<i32, FollowerState> {
        self.replica.lock().followers().clone()
    }

    /// On a follower: the high watermark the leader sent (capped at the log end).
    pub fn follow_high_watermark(&self, hw: Offset) {
        let leo = self.log_end_offset();
        let moved = self.replica.lock().follow_high_watermark(hw, leo);
        self.wake_if_moved(moved);
    }

    fn wake_if_moved(&self, moved: Option<Offset>) {
        if moved.is_some() {
            self.hw_moved.notify_waiters();
            self.data_arrived.notify_waiters();
        }
    }

    /// A future that completes when the high watermark moves or leadership changes.
    pub fn hw_moved(&self) -> tokio::sync::futures::Notified<'_> {
        self.hw_moved.notified()
    }

    /// Follower append of batches fetched from the leader (offsets and epochs kept).
    pub fn append_replicated(&self, batches: &Rope, now_ms: TimestampMs) -> Result<(), ErrorInfo> {
        self.with_log_long(LogOp::Append, |log| {
            self.follower_append(log, batches, now_ms)
        })?;
        self.data_arrived.notify_waiters();
        Ok(())
    }

    /// [`Partition::append_replicated`] now, if it cannot wait on the disk or
    /// on the log's mutex ([`Partition::try_append`]); `None`: not tried.
    pub fn try_append_replicated(
        &self,
        batches: &Rope,
        now_ms: TimestampMs,
    ) -> Option<Result<(), ErrorInfo>> {
        self.try_append_with(batches.len() as u64, now_ms, |log| {
            self.follower_append(log, batches, now_ms)
        })
    }

    fn follower_append(
        &self,
        log: &mut Log,
        batches: &Rope,
        now_ms: TimestampMs,
    ) -> Result<(), LogError> {
        log.append_replicated_rope(batches, now_ms)?;
        self.refresh_offsets(log);
        Ok(())
    }

    /// Runs the append `f` of at most `len` bytes on the caller's thread if
    /// that cannot wait: no long holder (retention, compaction, a roll, an
    /// append that may fsync) has the log's mutex or waits for it (a short
    /// holder is waited for, [`Partition::lock_for_task`]), and the append
    /// will neither fsync on append (`flush.messages`), roll a segment nor
    /// flush ([`Log::append_may_sync`]). `None`: not run; the caller appends on a
    /// blocking thread instead. For async tasks, whose thread serves other
    /// connections and must not wait on the disk. Wakes waiting fetches
    /// after an append.
    fn try_append_with<T>(
        &self,
        len: u64,
        now_ms: TimestampMs,
        f: impl FnOnce(&mut Log) -> Result<T, LogError>,
    ) -> Option<Result<T, ErrorInfo>> {
        if self.syncs_on_append() {
            return None;
        }
        let result = self
            .with_log_if(false, LogOp::Append, |log| {
                if log.append_may_sync(len, now_ms) {
                    return Ok(None);
                }
                f(log).map(Some)
            })?
            .transpose()?;
        if result.is_ok() {
            self.data_arrived.notify_waiters();
        }
        Some(result)
    }

    /// The latest leader epoch in the log's epoch checkpoint.
    pub fn latest_epoch(&self) -> Option<LeaderEpoch> {
        self.with_log(LogOp::Read, |log| Ok(log.latest_epoch()))
            .ok()
            .flatten()
    }

    /// The idempotent producers this partition's log remembers, by id.
    pub fn producers(&self) -> Result<Vec<rill_log::producer::ProducerSummary>, ErrorInfo> {
        self.with_log(LogOp::Read, |log| Ok(log.producers()))
    }

    /// KIP-101: where `epoch` ends in this log.
    pub fn end_offset_for_epoch(
        &self,
        epoch: LeaderEpoch,
    ) -> Result<Option<(LeaderEpoch, Offset)>, ErrorInfo> {
        self.with_log(LogOp::Read, |log| Ok(log.end_offset_for_epoch(epoch)))
    }

    /// Where this replica cuts after the leader's OffsetForLeaderEpoch answer
    /// for [`Partition::latest_epoch`] (KIP-101 and KIP-279).
    pub fn truncation(
        &self,
        leader: Option<(LeaderEpoch, Offset)>,
    ) -> Result<rill_log::epoch::Truncation, ErrorInfo> {
        self.with_log(LogOp::Read, |log| Ok(log.truncation(leader)))
    }

    /// Empties this replica's log and starts it at `offset` (a follower behind
    /// the leader's log start); the high watermark follows.
    pub fn restart_at(&self, offset: Offset) -> Result<(), ErrorInfo> {
        self.with_log_long(LogOp::Maintain, |log| {
            log.restart_at(offset)?;
            self.after_cut(log);
            Ok(())
        })
    }

    /// After the log lost its end (truncation, restart): the offsets, the
    /// first unstable offset and the replica state follow it.
    fn after_cut(&self, log: &Log) {
        let start = log.log_start_offset();
        let end = log.log_end_offset();
        self.log_start_offset.store(start.0, Ordering::Release);
        self.log_end_offset.store(end.0, Ordering::Release);
        self.note_first_unstable(log);
        self.replica.lock().truncate(end);
    }

    /// Removes records at or after `offset` (follower truncation); the high
    /// watermark is capped at the new log end.
    pub fn truncate_to(&self, offset: Offset) -> Result<(), ErrorInfo> {
        self.with_log_long(LogOp::Maintain, |log| {
            log.truncate_to(offset)?;
            self.after_cut(log);
            Ok(())
        })
    }

    /// Whole batches from `from` below `limit` (a follower reads up to the log
    /// end, a consumer below the high watermark).
    pub fn read_up_to(
        &self,
        from: Offset,
        max_bytes: usize,
        limit: Offset,
    ) -> Result<Option<FileSlice>, ErrorInfo> {
        self.read_up_to_if(true, from, max_bytes, limit)
            .expect("a read that waits for the log runs")
    }

    /// [`Partition::read_up_to`]; with `wait` false, `None` while a long
    /// holder has the log (see [`Partition::read_if`]).
    pub fn read_up_to_if(
        &self,
        wait: bool,
        from: Offset,
        max_bytes: usize,
        limit: Offset,
    ) -> Option<Result<Option<FileSlice>, ErrorInfo>> {
        self.with_log_if(wait, LogOp::Read, |log| {
            let start = log.log_start_offset();
            let end = log.log_end_offset();
            if from < start || from > end {
                return Err(LogError::OffsetOutOfRange {
                    requested: from,
                    start,
                    end,
                });
            }
            if from >= limit {
                return Ok(None);
            }
            log.read(from, max_bytes, limit)
        })
    }
    pub fn isr(&self) -> Vec<i32> {
        self.replica.lock().isr().to_vec()
    }
    /// The first offset kept, locally or in the object store.
    pub fn log_start_offset(&self) -> Offset {
        Offset(self.log_start_offset.load(Ordering::Acquire))
    }
    /// The first offset on local disk.
    pub fn local_log_start_offset(&self) -> Offset {
        Offset(self.local_log_start_offset.load(Ordering::Acquire))
    }
    pub fn high_watermark(&self) -> Offset {
        self.replica.lock().high_watermark()
    }
    pub fn log_end_offset(&self) -> Offset {
        Offset(self.log_end_offset.load(Ordering::Acquire))
    }

    /// The error for an operation on a closed partition.
    fn closed_error(&self) -> ErrorInfo {
        if self.deleted.load(Ordering::Acquire) {
            ErrorInfo::new(
                ErrorCode::UnknownTopicOrPartition,
                format!(
                    "partition {}-{} was deleted: refresh metadata",
                    self.topic, self.index
                ),
            )
        } else {
            ErrorInfo::new(
                ErrorCode::BrokerNotAvailable,
                format!(
                    "partition {}-{} is closed: the broker is shutting down; retry on another broker or later",
                    self.topic, self.index
                ),
            )
        }
    }

    /// Runs `f` on the open log, under the mutex. Keep `f` short.
    fn with_log<T>(
        &self,
        op: LogOp,
        f: impl FnOnce(&mut Log) -> Result<T, LogError>,
    ) -> Result<T, ErrorInfo> {
        let mut guard = self.log.lock();
        let log = guard.as_mut().ok_or_else(|| self.closed_error())?;
        f(log).map_err(|e| self.error_info(op, &e))
    }

    /// [`Partition::with_log`], or with `wait` false `None` at once while a
    /// long holder has the log's mutex or waits for it (see
    /// [`Partition::lock_for_task`]).
    fn with_log_if<T>(
        &self,
        wait: bool,
        op: LogOp,
        f: impl FnOnce(&mut Log) -> Result<T, LogError>,
    ) -> Option<Result<T, ErrorInfo>> {
        if wait {
            return Some(self.with_log(op, f));
        }
        let mut guard = self.lock_for_task()?;
        let Some(log) = guard.as_mut() else {
            return Some(Err(self.closed_error()));
        };
        Some(f(log).map_err(|e| self.error_info(op, &e)))
    }

    /// The log's mutex for an async task: short holders (an append, a read
    /// plan) are waited for, in slices so that a long holder arriving
    /// meanwhile is seen; `None` while a long holder has it or waits for it.
    fn lock_for_task(&self) -> Option<parking_lot::MutexGuard<'_, Option<Log>>> {
        loop {
            if self.long_holds.load(Ordering::Acquire) > 0 {
                return None;
            }
            if let Some(guard) = self.log.try_lock_for(SHORT_HOLD_SLICE) {
                return Some(guard);
            }
        }
    }

    /// [`Partition::with_log`] for work that may hold the log long (see
    /// `long_holds`): async tasks asking meanwhile go to the blocking pool
    /// instead of waiting.
    fn with_log_long<T>(
        &self,
        op: LogOp,
        f: impl FnOnce(&mut Log) -> Result<T, LogError>,
    ) -> Result<T, ErrorInfo> {
        struct Hold<'a>(&'a AtomicUsize);
        impl Drop for Hold<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Release);
            }
        }
        self.long_holds.fetch_add(1, Ordering::AcqRel);
        let _hold = Hold(&self.long_holds);
        self.with_log(op, f)
    }

    /// Refreshes the cached offsets from the log (caller holds the mutex).
    fn refresh_offsets(&self, log: &Log) {
        let local_start = log.log_start_offset();
        let end = log.log_end_offset();
        debug_assert!(
            local_start <= end,
            "log start {local_start} beyond log end {end}"
        );
        let remote_start = self
            .remote
            .read()
            .as_ref()
            .and_then(|r| r.manifest.start_offset());
        let start = remote_start.map_or(local_start, |r| r.min(local_start));
        self.local_log_start_offset
            .store(local_start.0, Ordering::Release);
        self.log_start_offset.store(start.0, Ordering::Release);
        self.log_end_offset.store(end.0, Ordering::Release);
        self.note_first_unstable(log);
        // Alone in the ISR, the leader's high watermark follows the log end (with
        // followers it moves as they fetch); retention may have removed records
        // below its old value.
        let moved = self.replica.lock().on_log_change(start, end);
        self.wake_if_moved(moved);
        self.gauges.log_start_offset.set(start.0 as f64);
        self.gauges.log_end_offset.set(end.0 as f64);
    }

    /// Leader append of whole batches as a producer sent them (in the pieces
    /// they arrived in); stamps offsets and the leader epoch as it writes.
    /// Wakes waiting fetches.
    pub fn append(&self, batches: &Rope, now_ms: TimestampMs) -> Result<AppendInfo, ErrorInfo> {
        let info = self.with_log_long(LogOp::Append, |log| {
            self.leader_append(log, batches, now_ms)
        })?;
        self.data_arrived.notify_waiters();
        Ok(info)
    }

    /// [`Partition::append`] now, on the caller's thread, if it cannot wait:
    /// no long holder has the log's mutex and the append will not fsync (no
    /// roll, no flush). `None`: not tried; append on a blocking thread instead (an
    /// async task's thread serves other connections meanwhile).
    pub fn try_append(
        &self,
        batches: &Rope,
        now_ms: TimestampMs,
    ) -> Option<Result<AppendInfo, ErrorInfo>> {
        self.try_append_with(batches.len() as u64, now_ms, |log| {
            self.leader_append(log, batches, now_ms)
        })
    }

    /// [`Partition::append`] from an async task: on its thread when that
    /// cannot wait ([`Partition::try_append`]), else on the blocking pool.
    pub async fn append_from_task(
        self: &Arc<Self>,
        batches: Rope,
        now_ms: TimestampMs,
    ) -> Result<AppendInfo, ErrorInfo> {
        if let Some(result) = self.try_append(&batches, now_ms) {
            return result;
        }
        let p = self.clone();
        crate::handlers::blocking(move || p.append(&batches, now_ms)).await?
    }

    fn leader_append(
        &self,
        log: &mut Log,
        batches: &Rope,
        now_ms: TimestampMs,
    ) -> Result<AppendInfo, LogError> {
        let info = log.append_rope(batches, self.leader_epoch(), now_ms)?;
        self.refresh_offsets(log);
        Ok(info)
    }

    /// The last stable offset: below it no transaction is open and everything is
    /// replicated (the lower of the high watermark and the first unstable offset).
    pub fn last_stable_offset(&self) -> Offset {
        let hw = self.high_watermark();
        match self.first_unstable_offset.load(Ordering::Acquire) {
            -1 => hw,
            u => Offset(u).min(hw),
        }
    }

    /// Notes the log's first unstable offset (caller holds the log's mutex).
    fn note_first_unstable(&self, log: &Log) {
        self.first_unstable_offset.store(
            log.first_unstable_offset().map_or(-1, |o| o.0),
            Ordering::Release,
        );
    }

    /// The aborted transactions a `read_committed` reader of `[from, to)`
    /// skips. With `wait` false, `None` at once while a long holder has the
    /// log's mutex (see [`Partition::read_if`]).
    pub fn aborted_transactions_if(
        &self,
        wait: bool,
        from: Offset,
        to: Offset,
    ) -> Option<Vec<rill_log::AbortedTxn>> {
        let guard = if wait {
            self.log.lock()
        } else {
            self.lock_for_task()?
        };
        Some(
            guard
                .as_ref()
                .map(|log| log.aborted_transactions(from, to))
                .unwrap_or_default(),
        )
    }

    /// Appends the marker ending `producer`'s transaction here (the leader, at
    /// its epoch). Returns the marker's offset.
    pub fn append_marker(
        &self,
        producer: rill_proto::ProducerId,
        producer_epoch: i16,
        marker: rill_proto::control::Marker,
        now_ms: TimestampMs,
    ) -> Result<Offset, ErrorInfo> {
        let offset = self.with_log_long(LogOp::Append, |log| {
            self.marker_append(log, producer, producer_epoch, marker, now_ms)
        })?;
        self.data_arrived.notify_waiters();
        Ok(offset)
    }

    /// [`Partition::append_marker`] now, if it cannot wait on the disk or on
    /// the log's mutex ([`Partition::try_append`]). Never an abort marker:
    /// that rewrites and fsyncs the transaction index.
    pub fn try_append_marker(
        &self,
        producer: rill_proto::ProducerId,
        producer_epoch: i16,
        marker: rill_proto::control::Marker,
        now_ms: TimestampMs,
    ) -> Option<Result<Offset, ErrorInfo>> {
        if marker.kind == rill_proto::control::MarkerKind::Abort {
            // Rewrites and fsyncs the transaction index.
            return None;
        }
        self.try_append_with(MARKER_BYTES_MAX, now_ms, |log| {
            self.marker_append(log, producer, producer_epoch, marker, now_ms)
        })
    }

    /// [`Partition::append_marker`] from an async task: on its thread when
    /// that cannot wait ([`Partition::try_append_marker`]), else on the
    /// blocking pool.
    pub async fn append_marker_from_task(
        self: &Arc<Self>,
        producer: rill_proto::ProducerId,
        producer_epoch: i16,
        marker: rill_proto::control::Marker,
        now_ms: TimestampMs,
    ) -> Result<Offset, ErrorInfo> {
        if let Some(result) = self.try_append_marker(producer, producer_epoch, marker, now_ms) {
            return result;
        }
        let p = self.clone();
        crate::handlers::blocking(move || p.append_marker(producer, producer_epoch, marker, now_ms))
            .await?
    }

    fn marker_append(
        &self,
        log: &mut Log,
        producer: rill_proto::ProducerId,
        producer_epoch: i16,
        marker: rill_proto::control::Marker,
        now_ms: TimestampMs,
    ) -> Result<Offset, LogError> {
        let info = log.append_marker(
            producer,
            producer_epoch,
            marker,
            self.leader_epoch(),
            now_ms,
        )?;
        self.refresh_offsets(log);
        Ok(info.first_offset)
    }

    /// Whole batches from `from` below `limit` (the high watermark, or for a
    /// `read_committed` reader the last stable offset), up to `max_bytes` (at
    /// least one batch), from local disk or (below the local log start) the object
    /// store. `None`: nothing to read yet at `from`.
    pub fn read(
        &self,
        from: Offset,
        max_bytes: usize,
        committed_only: bool,
    ) -> Result<Option<ReadPlan>, ErrorInfo> {
        self.read_if(true, from, max_bytes, committed_only)
            .expect("a read that waits for the log runs")
    }

    /// [`Partition::read`]; with `wait` false, `None` at once while a long
    /// holder has the log's mutex or waits for it, so an async task can take
    /// the read to the blocking pool instead of waiting (a roll's fsync,
    /// retention, a compaction's swap; short holders are waited for, see
    /// [`Partition::lock_for_task`]).
    pub fn read_if(
        &self,
        wait: bool,
        from: Offset,
        max_bytes: usize,
        committed_only: bool,
    ) -> Option<Result<Option<ReadPlan>, ErrorInfo>> {
        let remote = self.remote();
        if from < self.local_log_start_offset()
            && let Err(e) = self.check_remote_known()
        {
            return Some(Err(e));
        }
        self.with_log_if(wait, LogOp::Read, |log| {
            let local_start = log.log_start_offset();
            let end = log.log_end_offset();
            let mut at = from;
            if from < local_start
                && let Some(remote) = &remote
                && remote.manifest.start_offset().is_some_and(|s| s <= from)
            {
                if let Some(segment) = remote.manifest.segment_for(from) {
                    return Ok(Some(ReadPlan::Remote {
                        remote: remote.clone(),
                        segment: segment.clone(),
                        offset: from,
                        max_bytes,
                    }));
                }
                // Past the remote end but before the local start (tiering was
                // switched off and local retention ran): continue locally.
                at = local_start;
            }
            if at < local_start || at > end {
                return Err(LogError::OffsetOutOfRange {
                    requested: from,
                    start: self.log_start_offset().min(local_start),
                    end,
                });
            }
            let mut limit = self.high_watermark();
            if committed_only && let Some(unstable) = log.first_unstable_offset() {
                limit = limit.min(unstable);
            }
            if at >= limit {
                return Ok(None);
            }
            Ok(log.read(at, max_bytes, limit)?.map(ReadPlan::Local))
        })
    }

    /// Marks the remote copy as unknown until a manifest is published.
    pub fn set_remote_pending(&self) {
        self.remote_pending.store(true, Ordering::Release);
    }

    /// An error while this leader's high watermark is below the log end it
    /// had when it opened (a restart: it starts low and rises as the in-sync
    /// followers fetch), so records it acknowledged before may lie above it:
    /// the "latest" offset is not known yet (Kafka's OFFSET_NOT_AVAILABLE
    /// while a new leader's high watermark is below its epoch's start).
    pub fn check_high_watermark_known(&self) -> Result<(), ErrorInfo> {
        let (hw, floor) = (self.high_watermark(), self.isr_join_floor());
        if hw < floor {
            return Err(ErrorInfo::new(
                ErrorCode::OffsetNotAvailable,
                format!(
                    "partition {}-{}: the leader restarted and its high watermark ({hw}) is below \
                     the log end it reopened with ({floor}) until its in-sync followers fetch; \
                     retry shortly",
                    self.topic, self.index
                ),
            ));
        }
        Ok(())
    }

    /// An error while the remote copy is unknown (its manifest not loaded yet).
    pub fn check_remote_known(&self) -> Result<(), ErrorInfo> {
        if self.remote_pending.load(Ordering::Acquire) {
            return Err(ErrorInfo::new(
                ErrorCode::RemoteStorageUnavailable,
                format!(
                    "partition {}-{}: the object store has not answered yet, so offsets below the \
                     local log start {} are not known; retry later",
                    self.topic,
                    self.index,
                    self.local_log_start_offset()
                ),
            ));
        }
        Ok(())
    }

    /// The remote copy's manifest, once loaded.
    pub fn remote(&self) -> Option<Arc<RemoteLog>> {
        self.remote.read().clone()
    }

    /// Publishes a (newer) manifest of the remote copy; returns it.
    pub fn set_remote(&self, remote: RemoteLog) -> Arc<RemoteLog> {
        let remote = Arc::new(remote);
        self.gauges
            .remote_size_bytes
            .set(remote.manifest.size_bytes() as f64);
        *self.remote.write() = Some(remote.clone());
        self.remote_pending.store(false, Ordering::Release);
        if let Some(log) = self.log.lock().as_ref() {
            self.refresh_offsets(log);
        }
        remote
    }

    /// Forgets the published manifest (the tier re-reads the stored one); reads
    /// below the local start wait for it.
    pub fn clear_remote(&self) {
        self.remote_pending.store(true, Ordering::Release);
        *self.remote.write() = None;
    }

    /// The log's current config.
    pub fn log_config(&self) -> Result<LogConfig, ErrorInfo> {
        self.with_log(LogOp::Maintain, |log| Ok(log.config().clone()))
    }

    /// Bytes of local segments holding offsets at or after `offset`.
    pub fn local_size_from(&self, offset: Offset) -> Result<u64, ErrorInfo> {
        self.with_log(LogOp::Maintain, |log| Ok(log.size_bytes_from(offset)))
    }

    /// Bytes on local disk.
    pub fn local_size_bytes(&self) -> Result<u64, ErrorInfo> {
        self.with_log(LogOp::Maintain, |log| Ok(log.size_bytes()))
    }

    /// Closed segments below the high watermark ending after `from`, for upload.
    pub fn tierable_segments(
        &self,
        from: Offset,
        max: usize,
    ) -> Result<Vec<TierableSegment>, ErrorInfo> {
        let hw = self.high_watermark();
        self.with_log(LogOp::Maintain, |log| log.tierable_segments(from, hw, max))
    }

    /// A future that completes at the next append (or close). Create it, then
    /// check for data, then await it: no wake-up is lost in between.
    pub fn data_arrived(&self) -> tokio::sync::futures::Notified<'_> {
        self.data_arrived.notified()
    }

    pub fn offset_for_timestamp(
        &self,
        ts: TimestampMs,
    ) -> Result<Option<(Offset, TimestampMs)>, ErrorInfo> {
        self.with_log(LogOp::Read, |log| log.offset_for_timestamp(ts))
    }

    /// Whether appends may fsync (then the caller should append on a blocking thread).
    pub fn syncs_on_append(&self) -> bool {
        self.syncs_on_append.load(Ordering::Relaxed)
    }

    pub fn set_config(&self, config: LogConfig) {
        self.syncs_on_append
            .store(config.flush_messages.is_some(), Ordering::Relaxed);
        if let Some(log) = self.log.lock().as_mut() {
            log.set_config(config);
        }
    }

    /// Time-based flush and segment roll.
    pub fn tick(&self, now_ms: TimestampMs) -> Result<(), ErrorInfo> {
        self.with_log_long(LogOp::Maintain, |log| log.tick(now_ms))
    }

    /// Retention then compaction; returns (segments deleted, compacted).
    /// Compaction holds the log only to plan a run and to swap its cleaned
    /// segments in: reading the segments and writing their copies happens
    /// without it, so appends and reads of the partition go on meanwhile.
    pub fn clean(&self, now_ms: TimestampMs) -> Result<(usize, bool), ErrorInfo> {
        let uploaded_end = self
            .remote()
            .and_then(|r| r.manifest.end_offset())
            .unwrap_or(Offset::ZERO);
        let (deleted, run) = self.with_log_long(LogOp::Maintain, |log| {
            let config = log.config().clone();
            let deleted = if config.remote_storage_enable {
                let (ms, bytes) = (
                    config.local_retention_ms_effective(),
                    config.local_retention_bytes_effective(),
                );
                log.apply_local_retention(now_ms, uploaded_end, ms, bytes)?
            } else {
                log.apply_retention(now_ms)?
            };
            self.refresh_offsets(log);
            Ok((deleted, log.plan_compaction(now_ms)))
        })?;
        let Some(run) = run else {
            return Ok((deleted, false));
        };
        let cleaned = match run.clean() {
            Ok(cleaned) => cleaned,
            Err(failed) => {
                // A truncation can cut a segment the run was reading: then
                // the failure says nothing about the data.
                if self.with_log(LogOp::Maintain, |log| Ok(log.changed_since(&failed)))? {
                    tracing::info!(
                        partition = %format!("{}-{}", self.topic, self.index),
                        error = %failed.error,
                        "compaction dropped: the log changed while it ran"
                    );
                    return Ok((deleted, false));
                }
                return Err(self.error_info(LogOp::Maintain, &failed.error));
            }
        };
        let compacted = self.with_log_long(LogOp::Maintain, |log| {
            let swapped = log.finish_compaction(cleaned)?;
            self.refresh_offsets(log);
            Ok(swapped)
        })?;
        Ok((deleted, compacted))
    }

    /// Flushes and closes the log; wakes waiting fetches. Idempotent.
    pub fn close(&self) -> Result<(), LogError> {
        let log = self.log.lock().take();
        self.data_arrived.notify_waiters();
        self.hw_moved.notify_waiters();
        match log {
            Some(log) => log.close(),
            None => Ok(()),
        }
    }

    /// Closes the log of a deleted partition (its directory is removed by the caller).
    pub fn close_deleted(&self) -> Result<(), LogError> {
        self.deleted.store(true, Ordering::Release);
        self.close()
    }

    /// Maps a log error to what the client sees, naming this partition.
    pub fn error_info(&self, op: LogOp, e: &LogError) -> ErrorInfo {
        let tp = format!("{}-{}", self.topic, self.index);
        match e {
            LogError::OffsetOutOfRange {
                requested,
                start,
                end,
            } => ErrorInfo::new(
                ErrorCode::OffsetOutOfRange,
                format!(
                    "partition {tp}: offset {requested} is out of range: the log holds [{start}, {end}); \
                     seek to an offset in that range"
                ),
            ),
            LogError::RecordTooLarge { size, max } => ErrorInfo::new(
                ErrorCode::RecordTooLarge,
                format!(
                    "partition {tp}: batch of {size} bytes exceeds max.message.bytes={max}; \
                     send smaller batches or raise the topic's max.message.bytes"
                ),
            ),
            LogError::InvalidBatch(d) => ErrorInfo::new(
                ErrorCode::CorruptRecord,
                format!("partition {tp}: invalid record batch: {d}"),
            ),
            LogError::Corrupt { .. } if op == LogOp::Append => {
                ErrorInfo::new(ErrorCode::CorruptRecord, format!("partition {tp}: {e}"))
            }
            LogError::StaleLeaderEpoch { .. } => {
                ErrorInfo::new(ErrorCode::FencedLeaderEpoch, format!("partition {tp}: {e}"))
            }
            LogError::Sequence(seq) => {
                use rill_log::producer::SeqError;
                let code = match seq {
                    SeqError::OutOfOrder { .. } => ErrorCode::OutOfOrderSequence,
                    SeqError::StaleEpoch { .. } => ErrorCode::InvalidProducerEpoch,
                    SeqError::TooOld { .. } => ErrorCode::DuplicateSequence,
                    SeqError::Mixed { .. } => ErrorCode::InvalidRequest,
                };
                ErrorInfo::new(code, format!("partition {tp}: {seq}"))
            }
            LogError::InvalidConfig { .. } => ErrorInfo::new(
                ErrorCode::InvalidConfig,
                format!("topic {}: {e}", self.topic),
            ),
            other => {
                tracing::error!(partition = %tp, dir = %self.dir.display(), error = %other, "storage error");
                ErrorInfo::new(
                    ErrorCode::StorageError,
                    format!("partition {tp}: storage error on the broker: {other}"),
                )
            }
        }
    }
}

/// One topic: its partitions and config overrides.
#[derive(Debug)]
pub struct Topic {
    pub name: Arc<str>,
    pub id: String,
    pub internal: bool,
    /// Every partition of the topic, by index: `Some` where this broker is
    /// one of its replicas (and holds its log), `None` elsewhere. The length
    /// is the topic's partition count.
    pub partitions: Vec<Option<Arc<Partition>>>,
    /// Config overrides (Kafka names), as committed in the metadata image.
    pub overrides: Mutex<BTreeMap<String, String>>,
    /// The replication settings those overrides give.
    pub replication: Mutex<crate::topic_configs::ReplicationSettings>,
    /// The leader's checks of produced records those overrides give.
    pub records: Mutex<crate::topic_configs::RecordSettings>,
}

impl Topic {
    /// Partition `index`, if this broker hosts it.
    pub fn partition(&self, index: u32) -> Option<&Arc<Partition>> {
        self.partitions.get(index as usize).and_then(Option::as_ref)
    }

    /// The partitions this broker hosts.
    pub fn hosted(&self) -> impl Iterator<Item = &Arc<Partition>> {
        self.partitions.iter().flatten()
    }

    /// The topic's partition count (hosted here or not).
    pub fn count(&self) -> u32 {
        self.partitions.len() as u32
    }
}

#[cfg(test)]
mod restart_tests {
    use super::*;
    use rill_proto::{BatchBuilder, Compression, ProducerId, Record};
    use std::time::Duration;

    fn batch(seq: i32) -> Vec<u8> {
        let mut b = BatchBuilder::new(Compression::None).producer(ProducerId(7), 0, seq);
        b.push(&Record::from_value(format!("r{seq}"), 1));
        b.build().to_vec()
    }

    fn open(dir: &Path) -> Partition {
        Partition::open(
            "t".into(),
            0,
            dir,
            LogConfig::default(),
            LeaderEpoch(0),
            0,
            Arc::new(SelfFence::new(Duration::from_secs(60))),
            1,
        )
        .unwrap()
    }

    /// Holds `p`'s log as maintenance does: counted as a long holder.
    fn hold_long(p: &Partition) -> impl Drop + '_ {
        struct Held<'a>(
            &'a Partition,
            Option<parking_lot::MutexGuard<'a, Option<Log>>>,
        );
        impl Drop for Held<'_> {
            fn drop(&mut self) {
                self.1.take();
                self.0.long_holds.fetch_sub(1, Ordering::AcqRel);
            }
        }
        p.long_holds.fetch_add(1, Ordering::AcqRel);
        Held(p, Some(p.log.lock()))
    }

    /// Runs `f` while another thread holds `p`'s log as maintenance does,
    /// for 300 ms: a task that waited for a long holder instead of declining
    /// would get the log once it is released, and fail `f`'s checks rather
    /// than hang.
    fn while_held_long(p: &Partition, f: impl FnOnce()) {
        let held = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _hold = hold_long(p);
                held.wait();
                std::thread::sleep(Duration::from_millis(300));
            });
            held.wait();
            f();
        });
    }

    /// An async task appends on its own thread only when that cannot wait:
    /// not while a long holder (compaction, a roll) has the log, nor when
    /// the append would roll the segment (an fsync). `try_append` then leaves
    /// it to a blocking thread, and appends nothing itself. A short holder
    /// (another append) is waited for.
    #[test]
    fn try_append_declines_what_could_wait_on_the_disk_or_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            segment_bytes: 2 << 10,
            ..LogConfig::default()
        };
        let p = Partition::open(
            "t".into(),
            0,
            dir.path(),
            config,
            LeaderEpoch(0),
            0,
            Arc::new(SelfFence::new(Duration::from_secs(60))),
            1,
        )
        .unwrap();
        p.set_role(Some(0), LeaderEpoch(1), &[0], &[0]);
        let b = |seq| Rope::from(bytes::Bytes::from(batch(seq)));
        let segments = |p: &Partition| p.log.lock().as_ref().unwrap().segment_count();
        assert!(p.try_append(&b(0), 1).expect("appended here").is_ok());
        while_held_long(&p, || {
            assert!(p.try_append(&b(1), 1).is_none(), "the log is held long");
        });
        assert_eq!(p.log_end_offset(), Offset(1));
        // A short holder (not counted as long) is waited for.
        let held = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _guard = p.log.lock();
                held.wait();
                std::thread::sleep(Duration::from_millis(20));
            });
            held.wait();
            assert!(p.try_append(&b(1), 1).expect("waited for").is_ok());
        });
        assert_eq!(p.log_end_offset(), Offset(2));
        let mut seq = 2;
        while let Some(result) = p.try_append(&b(seq), 1) {
            result.unwrap();
            seq += 1;
        }
        assert!(seq > 5, "the segment took {seq} batches");
        assert_eq!(segments(&p), 1, "nothing rolled on the caller's thread");
        assert_eq!(p.log_end_offset(), Offset(seq as i64));
        p.append(&b(seq), 1).unwrap();
        assert_eq!(segments(&p), 2, "the declined append rolls");
        assert_eq!(p.log_end_offset(), Offset(seq as i64 + 1));
    }

    /// A fetch on an async task does not wait for a log a long holder has (a
    /// roll's fsync, retention, a compaction's swap): `read_if`,
    /// `read_up_to_if` and `aborted_transactions_if` without waiting
    /// decline, and read once it is free.
    #[test]
    fn a_read_that_must_not_wait_declines_a_held_log() {
        let dir = tempfile::tempdir().unwrap();
        let p = open(dir.path());
        p.set_role(Some(0), LeaderEpoch(1), &[0], &[0]);
        p.append(&Rope::from(bytes::Bytes::from(batch(0))), 1)
            .unwrap();
        while_held_long(&p, || {
            assert!(p.read_if(false, Offset(0), 1 << 20, false).is_none());
            assert!(
                p.read_up_to_if(false, Offset(0), 1 << 20, Offset(1))
                    .is_none()
            );
            assert!(
                p.aborted_transactions_if(false, Offset(0), Offset(1))
                    .is_none()
            );
        });
        assert_eq!(
            p.aborted_transactions_if(false, Offset(0), Offset(1)),
            Some(Vec::new())
        );
        let read = p.read_if(false, Offset(0), 1 << 20, false);
        assert!(matches!(read, Some(Ok(Some(ReadPlan::Local(_))))));
        let read = p.read_up_to_if(false, Offset(0), 1 << 20, Offset(1));
        assert!(matches!(read, Some(Ok(Some(_)))));
    }

    /// Issue 21, run 22: a leader restarted with a batch its follower never
    /// fetched must not count it as replicated, nor acknowledge its retry
    /// (answered as a duplicate from the producer table) at once.
    #[test]
    fn a_restarted_leader_does_not_count_its_unreplicated_tail_as_committed() {
        let dir = tempfile::tempdir().unwrap();
        let (replicas, isr) = ([0, 1], [0, 1]);
        {
            let p = open(dir.path());
            p.set_role(Some(0), LeaderEpoch(4), &replicas, &isr);
            p.append(&Rope::from(bytes::Bytes::from(batch(0))), 1)
                .unwrap();
            p.record_follower_fetch(1, Offset(1), Instant::now());
            assert_eq!(p.high_watermark(), Offset(1));
            // The follower never gets this one; the broker is killed.
            p.append(&Rope::from(bytes::Bytes::from(batch(1))), 1)
                .unwrap();
            assert_eq!(p.high_watermark(), Offset(1));
            p.close().unwrap();
        }
        let p = open(dir.path());
        p.set_role(Some(0), LeaderEpoch(4), &replicas, &isr);
        assert_eq!(p.log_end_offset(), Offset(2));
        assert!(
            p.high_watermark() <= Offset(1),
            "the restarted leader counts offset 1 as committed (high watermark {}) though only it holds it",
            p.high_watermark()
        );
        // The producer retries the batch: a duplicate at offset 1, which
        // acks=all may acknowledge only once the high watermark passed it.
        let info = p
            .append(&Rope::from(bytes::Bytes::from(batch(1))), 1)
            .unwrap();
        assert!(info.duplicate);
        assert!(p.high_watermark() <= info.last_offset);
        // Alone in the ISR, the log end is committed at once.
        p.set_role(Some(0), LeaderEpoch(4), &replicas, &[0]);
        assert_eq!(p.high_watermark(), Offset(2));
    }

    /// A restarted leader's high watermark starts low, but a replica out of
    /// the ISR joins only once it holds what the leader had at the restart
    /// (some of which may have been acknowledged before it).
    #[test]
    fn a_restarted_leader_takes_no_follower_back_that_lacks_its_old_log() {
        let dir = tempfile::tempdir().unwrap();
        {
            let p = open(dir.path());
            p.set_role(Some(0), LeaderEpoch(4), &[0, 1, 2], &[0, 1]);
            for seq in 0..3 {
                p.append(&Rope::from(bytes::Bytes::from(batch(seq))), 1)
                    .unwrap();
            }
            p.record_follower_fetch(1, Offset(3), Instant::now());
            assert_eq!(p.high_watermark(), Offset(3), "acknowledged up to 3");
            p.close().unwrap();
        }
        let p = open(dir.path());
        p.set_role(Some(0), LeaderEpoch(4), &[0, 1, 2], &[0, 1]);
        assert_eq!(p.isr_join_floor(), Offset(3));
        let t0 = Instant::now();
        let lag = Duration::from_secs(10);
        // Broker 2, out of the ISR, at offset 1: not taken back, though the
        // high watermark (broker 1 not heard from yet) is below it.
        p.record_follower_fetch(2, Offset(1), t0);
        assert!(p.high_watermark() <= Offset(1));
        // Meanwhile "latest" is not known (3 was acknowledged): ListOffsets
        // answers OFFSET_NOT_AVAILABLE, not a low offset.
        let e = p.check_high_watermark_known().unwrap_err();
        assert_eq!(e.code, ErrorCode::OffsetNotAvailable, "{}", e.message);
        let isr = p
            .replica_state()
            .isr_change(p.isr_join_floor(), t0, lag, t0);
        assert!(
            isr.as_ref().is_none_or(|isr| !isr.contains(&2)),
            "broker 2 taken back lacking offsets 1..3: {isr:?}"
        );
        // Once it holds the old log it joins.
        p.record_follower_fetch(2, Offset(3), t0);
        p.record_follower_fetch(1, Offset(3), t0);
        assert_eq!(p.high_watermark(), Offset(3));
        p.check_high_watermark_known().unwrap();
        let isr = p
            .replica_state()
            .isr_change(p.isr_join_floor(), t0, lag, t0);
        assert_eq!(isr, Some(vec![0, 1, 2]));
    }
}
