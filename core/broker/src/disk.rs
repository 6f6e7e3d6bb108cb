//! The data disk's free space, and the reserve kept on it.
//!
//! When the data directory's filesystem has less than `min_free_bytes` free,
//! appends of records to user topics are refused with `STORAGE_ERROR` naming
//! the partition and the free space, before the disk is full (Redpanda's
//! `storage_min_free_bytes` does the same). What stays writable in that reserve:
//! the metadata quorum's log under `__meta/` (so `rill topic delete`, the
//! natural way to free space, works on a full disk), the internal topics
//! (`__consumer_offsets`, `__transaction_state`: small, and a group or a
//! transaction must be able to finish), and transaction markers. Reads are
//! never refused. When space returns (a topic deleted, retention, an operator),
//! the next append passes: nothing to restart.
//!
//! Followers check too: a replica whose disk is short stops appending, falls
//! behind and leaves the ISR (after `replica.lag.time.max.ms`), and comes back
//! when it has space again.
//!
//! Free space is read with `statvfs` (space available to unprivileged users),
//! at most every [`RECHECK`]; the default reserve is 5% of the filesystem, at
//! most [`DEFAULT_MIN_FREE_BYTES_MAX`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rill_proto::wire::{ErrorCode, ErrorInfo};

/// The largest default reserve.
pub const DEFAULT_MIN_FREE_BYTES_MAX: u64 = 256 << 20;
/// The default reserve as a share of the filesystem's size.
pub const DEFAULT_MIN_FREE_SHARE: f64 = 0.05;
/// How long a reading of the free space is used.
pub const RECHECK: Duration = Duration::from_millis(100);

/// Space on a filesystem: (available to us, total), in bytes.
pub fn space(dir: &Path) -> std::io::Result<(u64, u64)> {
    let st = rustix::fs::statvfs(dir)?;
    Ok((
        st.f_bavail.saturating_mul(st.f_frsize),
        st.f_blocks.saturating_mul(st.f_frsize),
    ))
}

/// The data directory's free space against its reserve.
#[derive(Debug)]
pub struct DiskSpace {
    dir: PathBuf,
    min_free: u64,
    last: Mutex<Option<(Instant, u64)>>,
}

impl DiskSpace {
    /// The guard of `dir`: `configured` is `min_free_bytes` (0 turns the check
    /// off; `None` takes the default for the filesystem's size).
    pub fn new(dir: &Path, configured: Option<u64>) -> DiskSpace {
        let min_free = configured.unwrap_or_else(|| match space(dir) {
            Ok((_, total)) => {
                ((total as f64 * DEFAULT_MIN_FREE_SHARE) as u64).min(DEFAULT_MIN_FREE_BYTES_MAX)
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot read the data disk's size; no free-space reserve");
                0
            }
        });
        DiskSpace {
            dir: dir.to_path_buf(),
            min_free,
            last: Mutex::new(None),
        }
    }

    /// The reserve in bytes (0: off).
    pub fn min_free_bytes(&self) -> u64 {
        self.min_free
    }

    /// Takes `bytes` off the free space if that leaves the reserve whole:
    /// `Ok`, or `Err(free)`. The space is read at most every [`RECHECK`], and
    /// what passed since is taken off the reading, so a burst of appends
    /// between two readings cannot run past the reserve. Unreadable: passes.
    fn take(&self, bytes: u64) -> Result<(), u64> {
        let mut last = self.last.lock();
        let (at, free) = match *last {
            Some((at, free)) if at.elapsed() < RECHECK => (at, free),
            _ => match space(&self.dir) {
                Ok((free, _)) => (Instant::now(), free),
                Err(_) => return Ok(()),
            },
        };
        if free.saturating_sub(bytes) < self.min_free {
            *last = Some((at, free));
            return Err(free);
        }
        *last = Some((at, free - bytes));
        Ok(())
    }

    /// Whether `bytes` more may be appended to `partition`: an error naming the
    /// partition and the free space when that would eat into the reserve.
    pub fn check_append(&self, partition: &str, bytes: usize) -> Result<(), ErrorInfo> {
        if self.min_free == 0 {
            return Ok(());
        }
        let Err(free) = self.take(bytes as u64) else {
            return Ok(());
        };
        Err(ErrorInfo::new(
            ErrorCode::StorageError,
            format!(
                "partition {partition}: the data disk of this broker ({}) is full: {free} bytes \
                 free, below its reserve of {} bytes (min_free_bytes), so nothing more is \
                 appended; acknowledged records are safe and still served. Free space (delete \
                 a topic, lower retention) and writes resume",
                self.dir.display(),
                self.min_free
            ),
        ))
    }

    /// Forgets the last reading (after space was freed here).
    pub fn recheck(&self) {
        *self.last.lock() = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_append_into_the_reserve_is_refused_naming_partition_and_space() {
        let dir = tempfile::tempdir().unwrap();
        let (free, total) = space(dir.path()).unwrap();
        assert!(free > 0 && total >= free);
        // A reserve above what is free: refused.
        let full = DiskSpace::new(dir.path(), Some(free + (1 << 30)));
        let e = full.check_append("events-3", 100).unwrap_err();
        assert_eq!(e.code, ErrorCode::StorageError);
        assert!(e.message.contains("partition events-3"), "{}", e.message);
        assert!(e.message.contains("bytes free"), "{}", e.message);
        assert!(e.message.contains("min_free_bytes"), "{}", e.message);
        // Off, or a reserve well below the free space: passes.
        DiskSpace::new(dir.path(), Some(0))
            .check_append("events-3", 100)
            .unwrap();
        DiskSpace::new(dir.path(), Some(1))
            .check_append("events-3", 100)
            .unwrap();
        // The default is 5% of the filesystem, at most 256 MiB.
        let d = DiskSpace::new(dir.path(), None);
        assert_eq!(
            d.min_free_bytes(),
            ((total as f64 * DEFAULT_MIN_FREE_SHARE) as u64).min(DEFAULT_MIN_FREE_BYTES_MAX)
        );
    }
}
