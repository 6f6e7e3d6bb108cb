//! `Partition` and `Topic`: the broker's live view of what it leads.
//!
//! A `Partition` owns one partition's `Log` behind a short-held mutex (appends,
//! index lookups), plus what the cluster will later change: the leader epoch, the
//! replica and in-sync replica lists, and the high watermark. On a single broker
//! the broker leads every partition, replicas = isr = [this broker], and the high
//! watermark is the log end offset after every append.
//!
//! Invariants:
//! - `log_start_offset <= high_watermark <= log_end_offset`, checked where the
//!   watermark moves.
//! - File reads never happen under the log mutex: `read` returns a `FileSlice`
//!   that the caller reads afterwards.
//! - Every append (and close) wakes the fetches waiting on the partition.
//! - Once closed (shutdown, topic deleted) the log is gone; every operation
//!   answers `UNKNOWN_TOPIC_OR_PARTITION` (deleted) or `BROKER_NOT_AVAILABLE`.

use parking_lot::{Mutex, RwLock};
use rill_log::{AppendInfo, FileSlice, Log, LogConfig, LogError};
use rill_proto::wire::{ErrorCode, ErrorInfo};
use rill_proto::{LeaderEpoch, Offset, TimestampMs};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use tokio::sync::Notify;

/// Which operation a log error happened in; decides how it is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogOp {
    Append,
    Read,
    Maintain,
}

/// The gauges of one partition, registered once (not per append).
#[derive(Debug, Clone)]
struct PartitionGauges {
    log_start_offset: metrics::Gauge,
    log_end_offset: metrics::Gauge,
}

/// One partition this broker leads.
#[derive(Debug)]
pub struct Partition {
    topic: Arc<str>,
    index: u32,
    dir: PathBuf,
    log: Mutex<Option<Log>>,
    leader_epoch: LeaderEpoch,
    replicas: Vec<i32>,
    isr: RwLock<Vec<i32>>,
    log_start_offset: AtomicI64,
    high_watermark: AtomicI64,
    log_end_offset: AtomicI64,
    deleted: AtomicBool,
    /// The log fsyncs on appends (`flush.messages` set): append off the async workers.
    syncs_on_append: AtomicBool,
    data_arrived: Notify,
    gauges: PartitionGauges,
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
        now_ms: TimestampMs,
    ) -> Result<Partition, LogError> {
        let syncs_on_append = config.flush_messages.is_some();
        let log = Log::open(dir, config, now_ms)?;
        let start = log.log_start_offset();
        let end = log.log_end_offset();
        let labels = [
            ("topic", topic.to_string()),
            ("partition", index.to_string()),
        ];
        let gauges = PartitionGauges {
            log_start_offset: metrics::gauge!(crate::metrics::PARTITION_LOG_START_OFFSET, &labels),
            log_end_offset: metrics::gauge!(crate::metrics::PARTITION_LOG_END_OFFSET, &labels),
        };
        gauges.log_start_offset.set(start.0 as f64);
        gauges.log_end_offset.set(end.0 as f64);
        Ok(Partition {
            topic,
            index,
            dir: dir.to_path_buf(),
            log: Mutex::new(Some(log)),
            leader_epoch,
            replicas: vec![broker_id],
            isr: RwLock::new(vec![broker_id]),
            log_start_offset: AtomicI64::new(start.0),
            // One broker: everything appended is on every in-sync replica.
            high_watermark: AtomicI64::new(end.0),
            log_end_offset: AtomicI64::new(end.0),
            deleted: AtomicBool::new(false),
            syncs_on_append: AtomicBool::new(syncs_on_append),
            data_arrived: Notify::new(),
            gauges,
        })
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
        self.leader_epoch
    }
    pub fn replicas(&self) -> &[i32] {
        &self.replicas
    }
    pub fn isr(&self) -> Vec<i32> {
        self.isr.read().clone()
    }
    pub fn log_start_offset(&self) -> Offset {
        Offset(self.log_start_offset.load(Ordering::Acquire))
    }
    pub fn high_watermark(&self) -> Offset {
        Offset(self.high_watermark.load(Ordering::Acquire))
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

    /// Refreshes the cached offsets from the log (caller holds the mutex).
    fn refresh_offsets(&self, log: &Log) {
        let start = log.log_start_offset();
        let end = log.log_end_offset();
        debug_assert!(start <= end, "log start {start} beyond log end {end}");
        self.log_start_offset.store(start.0, Ordering::Release);
        self.log_end_offset.store(end.0, Ordering::Release);
        // One broker: the high watermark is the log end offset.
        self.high_watermark.store(end.0, Ordering::Release);
        self.gauges.log_start_offset.set(start.0 as f64);
        self.gauges.log_end_offset.set(end.0 as f64);
    }

    /// Leader append of whole batches as a producer sent them; stamps offsets and
    /// the leader epoch in place. Wakes waiting fetches.
    pub fn append(&self, batches: &mut [u8], now_ms: TimestampMs) -> Result<AppendInfo, ErrorInfo> {
        let info = self.with_log(LogOp::Append, |log| {
            let info = log.append(batches, self.leader_epoch, now_ms)?;
            self.refresh_offsets(log);
            Ok(info)
        })?;
        self.data_arrived.notify_waiters();
        Ok(info)
    }

    /// Whole batches from `from` below the high watermark, up to `max_bytes` (at
    /// least one batch). `None`: nothing to read yet at `from`.
    pub fn read(&self, from: Offset, max_bytes: usize) -> Result<Option<FileSlice>, ErrorInfo> {
        self.with_log(LogOp::Read, |log| {
            let start = log.log_start_offset();
            let end = log.log_end_offset();
            if from < start || from > end {
                return Err(LogError::OffsetOutOfRange {
                    requested: from,
                    start,
                    end,
                });
            }
            let hw = self.high_watermark();
            if from >= hw {
                return Ok(None);
            }
            log.read(from, max_bytes, hw)
        })
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
        self.with_log(LogOp::Maintain, |log| log.tick(now_ms))
    }

    /// Retention then compaction; returns (segments deleted, compacted).
    pub fn clean(&self, now_ms: TimestampMs) -> Result<(usize, bool), ErrorInfo> {
        self.with_log(LogOp::Maintain, |log| {
            let deleted = log.apply_retention(now_ms)?;
            let compacted = log.compact(now_ms)?;
            self.refresh_offsets(log);
            Ok((deleted, compacted))
        })
    }

    /// Flushes and closes the log; wakes waiting fetches. Idempotent.
    pub fn close(&self) -> Result<(), LogError> {
        let log = self.log.lock().take();
        self.data_arrived.notify_waiters();
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
    pub partitions: Vec<Arc<Partition>>,
    /// Config overrides (Kafka names), changed by AlterConfigs.
    pub overrides: Mutex<BTreeMap<String, String>>,
}

impl Topic {
    pub fn partition(&self, index: u32) -> Option<&Arc<Partition>> {
        self.partitions.get(index as usize)
    }
}
