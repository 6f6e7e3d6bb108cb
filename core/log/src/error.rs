//! The errors of rill-log. Each one says what failed and where: the file and byte
//! position for corruption, the offsets for range errors, the key and value for
//! config errors, so an operator can act on the message alone.

use rill_proto::{DecodeError, LeaderEpoch, Offset};
use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum LogError {
    #[error("I/O error {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("corrupt log segment {path} at byte {position}: {reason}")]
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    #[error("offset {requested} is out of range: the log holds [{start}, {end})")]
    OffsetOutOfRange {
        requested: Offset,
        start: Offset,
        end: Offset,
    },
    #[error("batch of {size} bytes exceeds max.message.bytes={max}")]
    RecordTooLarge { size: usize, max: u32 },
    #[error("invalid record batch: {0}")]
    InvalidBatch(#[from] DecodeError),
    #[error("invalid config {key}={value}: {reason}")]
    InvalidConfig {
        key: String,
        value: String,
        reason: String,
    },
    /// A replicated append whose first batch does not start at the log end offset,
    /// or whose batches are not contiguous.
    #[error(
        "replicated batch starts at offset {got} but the log expects {expected}; \
         the follower must truncate or fetch from {expected}"
    )]
    NonContiguousAppend { expected: Offset, got: Offset },
    /// An append in an epoch older than one the log has already seen.
    #[error(
        "append in leader epoch {epoch} but the log already holds epoch {latest}; \
         a leader epoch never goes back"
    )]
    StaleLeaderEpoch {
        epoch: LeaderEpoch,
        latest: LeaderEpoch,
    },
    /// An idempotent producer's batch out of sequence, or from a fenced epoch.
    #[error(transparent)]
    Sequence(#[from] crate::producer::SeqError),
}

/// Wraps an `io::Error` with what was being done, for `map_err`.
pub(crate) fn io_context(
    context: impl FnOnce() -> String,
) -> impl FnOnce(std::io::Error) -> LogError {
    move |source| LogError::Io {
        context: context(),
        source,
    }
}
