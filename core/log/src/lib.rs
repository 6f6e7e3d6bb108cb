//! rill-log: one partition's log on disk. API CONTRACT SKELETON — being implemented.
//!
//! (The log helper replaces this file's bodies; the signatures below are the contract
//! the broker codes against. Changing a signature: tell the integrator.)

#![allow(clippy::todo, unused_variables, dead_code)]

use rill_proto::{DecodeError, LeaderEpoch, Offset, TimestampMs};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

/// Per-log settings, named as Kafka's topic configs.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// `segment.bytes`: roll the active segment when it would exceed this size.
    pub segment_bytes: u64,
    /// `segment.ms`: roll the active segment when its first batch is this old.
    pub segment_ms: u64,
    /// `index.interval.bytes`: bytes between sparse index entries.
    pub index_interval_bytes: u32,
    /// `flush.messages`: fsync after this many records (None: never by count).
    pub flush_messages: Option<u64>,
    /// `flush.ms`: fsync when the oldest unflushed write is this old (None: never by time).
    pub flush_ms: Option<u64>,
    /// `retention.ms`: delete segments whose newest record is older (None: keep forever).
    pub retention_ms: Option<u64>,
    /// `retention.bytes`: delete oldest segments while the log is larger (None: no limit).
    pub retention_bytes: Option<u64>,
    /// `cleanup.policy`: delete, compact, or both.
    pub cleanup_policy: CleanupPolicy,
    /// `delete.retention.ms`: how long a tombstone survives compaction.
    pub delete_retention_ms: u64,
    /// `min.cleanable.dirty.ratio`: compact when dirty bytes / total bytes exceed this.
    pub min_cleanable_dirty_ratio: f64,
    /// `max.message.bytes`: the largest batch the log accepts.
    pub max_message_bytes: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupPolicy {
    pub delete: bool,
    pub compact: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        todo!()
    }
}

impl LogConfig {
    /// Sets one config by its Kafka name (`segment.bytes`, `retention.ms`, ...),
    /// validating the value. Unknown keys and bad values are errors that name them.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), LogError> {
        todo!()
    }

    /// Every setting as (Kafka name, value) pairs, in a stable order.
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        todo!()
    }

    /// The keys `set` understands.
    pub fn known_keys() -> &'static [&'static str] {
        todo!()
    }
}

#[derive(Debug, Error)]
pub enum LogError {
    #[error("I/O error {context}: {source}")]
    Io { context: String, #[source] source: std::io::Error },
    #[error("corrupt log segment {path} at byte {position}: {reason}")]
    Corrupt { path: PathBuf, position: u64, reason: String },
    #[error("offset {requested} is out of range: the log holds [{start}, {end})")]
    OffsetOutOfRange { requested: Offset, start: Offset, end: Offset },
    #[error("batch of {size} bytes exceeds max.message.bytes={max}")]
    RecordTooLarge { size: usize, max: u32 },
    #[error("invalid record batch: {0}")]
    InvalidBatch(#[from] DecodeError),
    #[error("invalid config {key}={value}: {reason}")]
    InvalidConfig { key: String, value: String, reason: String },
}

/// What an append wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub first_offset: Offset,
    pub last_offset: Offset,
    pub max_timestamp: TimestampMs,
    pub record_count: u64,
    pub bytes: u64,
}

/// A byte range of one segment file holding whole batches; read it outside any lock.
#[derive(Debug, Clone)]
pub struct FileSlice {
    pub file: Arc<File>,
    pub position: u64,
    pub len: u32,
}

impl FileSlice {
    pub fn read(&self) -> std::io::Result<bytes::Bytes> {
        todo!()
    }
}

/// One partition's log.
#[derive(Debug)]
pub struct Log {
    dir: PathBuf,
}

impl Log {
    /// Opens (creating if missing) the log in `dir`, recovering the active segment's
    /// tail and rebuilding missing or damaged indexes.
    pub fn open(dir: &Path, config: LogConfig, now_ms: TimestampMs) -> Result<Log, LogError> {
        todo!()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn config(&self) -> &LogConfig {
        todo!()
    }
    pub fn set_config(&mut self, config: LogConfig) {
        todo!()
    }

    /// Leader append: `batches` holds one or more whole batches as a producer sent
    /// them. Validates each (CRC, size <= max.message.bytes), stamps base offsets from
    /// the log end offset and the leader epoch into the bytes in place, appends.
    pub fn append(
        &mut self,
        batches: &mut [u8],
        epoch: LeaderEpoch,
        now_ms: TimestampMs,
    ) -> Result<AppendInfo, LogError> {
        todo!()
    }

    /// Follower append: batches already carry offsets and epochs; the first must
    /// start at the log end offset.
    pub fn append_replicated(&mut self, batches: &[u8], now_ms: TimestampMs) -> Result<AppendInfo, LogError> {
        todo!()
    }

    /// Whole batches starting with the one that holds `from`, up to `max_bytes`
    /// (at least one batch even if larger), only batches whose last offset is below
    /// `upper_bound`. `None` when there is nothing to read at `from` yet.
    pub fn read(&self, from: Offset, max_bytes: usize, upper_bound: Offset) -> Result<Option<FileSlice>, LogError> {
        todo!()
    }

    pub fn log_start_offset(&self) -> Offset {
        todo!()
    }
    pub fn log_end_offset(&self) -> Offset {
        todo!()
    }
    /// Total bytes of all segments.
    pub fn size_bytes(&self) -> u64 {
        todo!()
    }

    /// The first offset whose timestamp is >= `ts` (with that timestamp), if any.
    pub fn offset_for_timestamp(&self, ts: TimestampMs) -> Result<Option<(Offset, TimestampMs)>, LogError> {
        todo!()
    }

    /// Removes every record at or after `offset` (replication truncation).
    pub fn truncate_to(&mut self, offset: Offset) -> Result<(), LogError> {
        todo!()
    }

    /// fsyncs everything written so far.
    pub fn flush(&mut self) -> Result<(), LogError> {
        todo!()
    }

    /// Applies time-based policies: `flush.ms` and `segment.ms`.
    pub fn tick(&mut self, now_ms: TimestampMs) -> Result<(), LogError> {
        todo!()
    }

    /// Deletes whole non-active segments past retention.ms / retention.bytes.
    /// Returns the number of segments deleted.
    pub fn apply_retention(&mut self, now_ms: TimestampMs) -> Result<usize, LogError> {
        todo!()
    }

    /// Compacts the non-active segments if the dirty ratio calls for it.
    /// Returns whether it ran.
    pub fn compact(&mut self, now_ms: TimestampMs) -> Result<bool, LogError> {
        todo!()
    }

    /// (epoch, start offset) pairs of the leader-epoch checkpoint, ascending.
    pub fn epoch_entries(&self) -> Vec<(LeaderEpoch, Offset)> {
        todo!()
    }

    /// KIP-101: the end offset of `epoch` in this log (the start offset of the next
    /// higher epoch, or the log end offset), with the largest epoch <= `epoch`.
    pub fn end_offset_for_epoch(&self, epoch: LeaderEpoch) -> Option<(LeaderEpoch, Offset)> {
        todo!()
    }

    /// Flushes and closes.
    pub fn close(self) -> Result<(), LogError> {
        todo!()
    }

    /// Closes and deletes the log's directory.
    pub fn delete(self) -> Result<(), LogError> {
        todo!()
    }
}
