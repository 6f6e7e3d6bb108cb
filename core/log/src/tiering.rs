//! What the log offers tiered storage: which closed segments may be uploaded, a
//! consistent handle on one segment's files, and local retention that deletes a
//! segment only once the tier has it.
//!
//! The log knows nothing about object stores. The broker's tier asks
//! [`Log::tierable_segments`] for the closed segments entirely below an upper bound
//! (the high watermark, and for compacted topics the cleaner checkpoint, so only
//! cleaned segments leave the broker), uploads them, and tells the log how far the
//! remote copy reaches through [`Log::apply_local_retention`]. The log's own start
//! offset is then the *local* log start offset; the partition's true log start is the
//! tier's business.
//!
//! Invariants: the active segment is never offered or deleted; a segment is deleted
//! by local retention only if its whole range lies below `uploaded_end`; deletion
//! is a prefix of the segments, so the local log stays contiguous.

use crate::error::{LogError, io_context};
use crate::log::Log;
use crate::retention::segments_to_delete;
use rill_proto::{Offset, TimestampMs};
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

/// One closed segment, with its three files open: the handles stay readable even
/// if retention or compaction replaces or deletes the files meanwhile, so an upload
/// reads one consistent version.
#[derive(Debug, Clone)]
pub struct TierableSegment {
    pub base_offset: Offset,
    /// The offset after the segment's last batch.
    pub next_offset: Offset,
    pub size_bytes: u64,
    pub max_timestamp: TimestampMs,
    pub log: Arc<File>,
    pub log_path: PathBuf,
    pub offset_index: Arc<File>,
    pub time_index: Arc<File>,
}

fn open_ro(path: &std::path::Path) -> Result<Arc<File>, LogError> {
    File::open(path).map(Arc::new).map_err(io_context(|| {
        format!("opening {} for upload", path.display())
    }))
}

impl Log {
    /// Closed, non-empty segments whose every offset is below `upper_bound` and at
    /// or after `from`, oldest first, at most `max` of them. For a compacted topic
    /// only segments below the cleaner checkpoint (already cleaned) qualify.
    pub fn tierable_segments(
        &self,
        from: Offset,
        upper_bound: Offset,
        max: usize,
    ) -> Result<Vec<TierableSegment>, LogError> {
        let bound = if self.config().cleanup_policy.compact {
            upper_bound.min(self.cleaner_checkpoint)
        } else {
            upper_bound
        };
        let n = self.segments.len() - 1;
        let mut out = Vec::new();
        for seg in &self.segments[..n] {
            if out.len() >= max || seg.next_offset > bound {
                break;
            }
            // A segment ending at or before `from` is remote already; one that only
            // overlaps (rolled elsewhere by another leader) still brings new offsets.
            if seg.next_offset <= from || seg.is_empty() {
                continue;
            }
            out.push(TierableSegment {
                base_offset: seg.base_offset,
                next_offset: seg.next_offset,
                size_bytes: seg.size,
                max_timestamp: seg.max_timestamp,
                log: Arc::clone(&seg.file),
                log_path: seg.path.clone(),
                offset_index: open_ro(seg.offset_index.path())?,
                time_index: open_ro(seg.time_index.path())?,
            });
        }
        Ok(out)
    }

    /// Bytes of the segments holding offsets at or after `offset` (the active one
    /// included): what the log holds beyond a remote copy ending at `offset`.
    pub fn size_bytes_from(&self, offset: Offset) -> u64 {
        self.segments
            .iter()
            .filter(|s| s.next_offset > offset || s.is_empty())
            .map(|s| s.size)
            .sum()
    }

    /// Local retention for a tiered log: deletes the oldest closed segments that
    /// lie wholly below `uploaded_end` (the remote copy's end) and are past
    /// `local_ms` by age or `local_bytes` by size. Unuploaded data is never deleted,
    /// whatever the retention says. Returns the number of segments deleted.
    pub fn apply_local_retention(
        &mut self,
        now_ms: TimestampMs,
        uploaded_end: Offset,
        local_ms: Option<u64>,
        local_bytes: Option<u64>,
    ) -> Result<usize, LogError> {
        let n_closed = self.segments.len() - 1;
        let uploaded = self.segments[..n_closed]
            .iter()
            .take_while(|s| s.next_offset <= uploaded_end)
            .count();
        let candidates = self.non_active_sizes_and_max_ts();
        let mut n = segments_to_delete(
            &candidates,
            self.size_bytes(),
            local_ms,
            local_bytes,
            now_ms,
        );
        n = n.min(uploaded);
        if n > 0 {
            self.delete_oldest_segments(n)?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use crate::{CleanupPolicy, Log, LogConfig};
    use rill_proto::{BatchBuilder, Compression, LeaderEpoch, Offset, Record};

    fn batch(n: usize) -> Vec<u8> {
        let mut b = BatchBuilder::new(Compression::None);
        for i in 0..n {
            b.push(&Record::from_value(format!("v{i}").into_bytes(), 1));
        }
        b.build().to_vec()
    }

    fn log_with_segments(dir: &std::path::Path, policy: CleanupPolicy) -> Log {
        let config = LogConfig {
            segment_bytes: 200,
            cleanup_policy: policy,
            ..LogConfig::default()
        };
        let mut log = Log::open(dir, config, 0).unwrap();
        for _ in 0..10 {
            log.append(&mut batch(3), LeaderEpoch(0), 1).unwrap();
        }
        assert!(log.segment_count() > 3, "{}", log.segment_count());
        log
    }

    #[test]
    fn only_closed_segments_below_the_bound_are_tierable() {
        let dir = tempfile::tempdir().unwrap();
        let log = log_with_segments(dir.path(), CleanupPolicy::DELETE);
        let all = log
            .tierable_segments(Offset::ZERO, log.log_end_offset(), 100)
            .unwrap();
        assert_eq!(all.len(), log.segment_count() - 1, "never the active one");
        let bound = all[1].next_offset;
        let some = log.tierable_segments(Offset::ZERO, bound, 100).unwrap();
        assert_eq!(some.len(), 2);
        let later = log
            .tierable_segments(all[0].next_offset, bound, 100)
            .unwrap();
        assert_eq!(later.len(), 1);
        let overlapping = log
            .tierable_segments(all[0].next_offset.plus(-1), bound, 100)
            .unwrap();
        assert_eq!(
            overlapping.len(),
            2,
            "a segment with any new offset qualifies"
        );
        assert_eq!(
            log.size_bytes_from(all[0].next_offset),
            log.size_bytes() - all[0].size_bytes
        );
        assert_eq!(
            log.tierable_segments(Offset::ZERO, bound, 1).unwrap().len(),
            1
        );
    }

    #[test]
    fn compacted_logs_offer_only_cleaned_segments() {
        let dir = tempfile::tempdir().unwrap();
        let log = log_with_segments(dir.path(), CleanupPolicy::COMPACT);
        let none = log
            .tierable_segments(Offset::ZERO, log.log_end_offset(), 100)
            .unwrap();
        assert!(none.is_empty(), "nothing cleaned yet");
    }

    #[test]
    fn compacted_segments_become_tierable_after_cleaning() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            segment_bytes: 300,
            cleanup_policy: CleanupPolicy::COMPACT,
            min_cleanable_dirty_ratio: 0.0,
            ..LogConfig::default()
        };
        let mut log = Log::open(dir.path(), config, 0).unwrap();
        for i in 0..40 {
            let mut b = BatchBuilder::new(Compression::None);
            b.push(&Record {
                key: Some(format!("k{}", i % 4).into_bytes().into()),
                ..Record::from_value(format!("v{i}").into_bytes(), 1)
            });
            log.append(&mut b.build().to_vec(), LeaderEpoch(0), 1)
                .unwrap();
        }
        let end = log.log_end_offset();
        assert!(
            log.tierable_segments(Offset::ZERO, end, 100)
                .unwrap()
                .is_empty()
        );
        assert!(log.compact(10).unwrap(), "compaction ran");
        let cleaned = log.tierable_segments(Offset::ZERO, end, 100).unwrap();
        assert!(
            !cleaned.is_empty(),
            "cleaned segments are offered for upload"
        );
        assert!(cleaned.iter().all(|s| s.next_offset <= end));
    }

    #[test]
    fn local_retention_keeps_what_is_not_uploaded() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = log_with_segments(dir.path(), CleanupPolicy::DELETE);
        let segs = log
            .tierable_segments(Offset::ZERO, log.log_end_offset(), 100)
            .unwrap();
        // Everything is past local retention (0 ms) but nothing is uploaded.
        assert_eq!(
            log.apply_local_retention(10, Offset::ZERO, Some(0), None)
                .unwrap(),
            0
        );
        // Two segments uploaded: exactly those go.
        let uploaded_end = segs[1].next_offset;
        assert_eq!(
            log.apply_local_retention(10, uploaded_end, Some(0), None)
                .unwrap(),
            2
        );
        assert_eq!(log.log_start_offset(), uploaded_end);
        // Uploaded but young: kept.
        let end = log.log_end_offset();
        assert_eq!(
            log.apply_local_retention(10, end, Some(1000), None)
                .unwrap(),
            0
        );
    }
}
