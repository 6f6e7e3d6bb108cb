//! rill-log: one partition's log on disk — segments, sparse indexes, recovery,
//! retention, compaction and the leader-epoch cache. No networking, no async: every
//! call is a plain function the broker runs (and serialises) as it sees fit.
//!
//! A log directory holds segments `<20-digit base offset>.log` with `.index` and
//! `.timeindex` beside each ([`segment`], [`index`]), and the checkpoint files
//! `leader-epoch-checkpoint` ([`epoch`]) and `cleaner-offset-checkpoint`
//! ([`compaction`]), all written crash-safely by [`checkpoint::write_atomically`].
//!
//! What it is not: it does not know about replicas, the high watermark or
//! consumers (`read` takes the upper bound from the caller), and it never decodes
//! records on the append or read path — a batch is stored as the producer encoded
//! it, with only base offset and leader epoch (outside the CRC) stamped.
//!
//! Invariants: offsets strictly increase across the log; the log end offset only
//! moves back through `truncate_to`; leader epochs in the cache strictly increase;
//! an index entry never points past its segment; only the tail of the active
//! segment is ever repaired silently — damage anywhere else is `LogError::Corrupt`.

pub mod checkpoint;
pub mod compaction;
pub mod config;
pub mod epoch;
pub mod error;
pub mod index;
mod log;
pub mod producer;
pub mod read_buffers;
pub mod recovery;
pub mod retention;
pub mod segment;
pub mod tail;
pub mod tiering;
pub mod txn;

pub use compaction::{CleanFailed, CleanedSegments, CompactionRun};
pub use config::{CleanupPolicy, LogConfig};
pub use error::LogError;
pub use log::{AppendInfo, FileSlice, Log};
pub use tiering::TierableSegment;
pub use txn::{AbortedTxn, TxnIndex};
