//! Retention: deleting whole old segments by age (`retention.ms`) or total size
//! (`retention.bytes`) when `cleanup.policy` includes `delete`.
//!
//! Age is a segment's max batch timestamp (from its sealed time index); an empty
//! segment counts as expired. Only a prefix of the non-active segments is deleted,
//! oldest first, so the log stays contiguous and the log start offset (the first
//! segment's base offset, which is what survives a reopen) only moves forward.
//! The active segment is never deleted.

use crate::error::LogError;
use crate::log::Log;
use rill_proto::TimestampMs;

/// How many leading non-active segments the policy deletes.
pub(crate) fn segments_to_delete(
    sizes_and_max_ts: &[(u64, TimestampMs)],
    total_bytes: u64,
    retention_ms: Option<u64>,
    retention_bytes: Option<u64>,
    now_ms: TimestampMs,
) -> usize {
    let mut n = 0;
    if let Some(ms) = retention_ms {
        let horizon = now_ms.saturating_sub(ms.min(i64::MAX as u64) as i64);
        n = sizes_and_max_ts
            .iter()
            .take_while(|&&(_, ts)| ts < horizon)
            .count();
    }
    if let Some(limit) = retention_bytes {
        let mut remaining = total_bytes - sizes_and_max_ts[..n].iter().map(|s| s.0).sum::<u64>();
        while n < sizes_and_max_ts.len() && remaining >= limit.saturating_add(sizes_and_max_ts[n].0)
        {
            remaining -= sizes_and_max_ts[n].0;
            n += 1;
        }
    }
    n
}

impl Log {
    /// Deletes whole non-active segments past retention.ms / retention.bytes.
    /// Returns the number of segments deleted.
    pub fn apply_retention(&mut self, now_ms: TimestampMs) -> Result<usize, LogError> {
        let config = self.config().clone();
        if !config.cleanup_policy.delete {
            return Ok(0);
        }
        let candidates = self.non_active_sizes_and_max_ts();
        let n = segments_to_delete(
            &candidates,
            self.size_bytes(),
            config.retention_ms,
            config.retention_bytes,
            now_ms,
        );
        if n > 0 {
            self.delete_oldest_segments(n)?;
            self.prune_aborted()?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_time_stops_at_first_young_segment() {
        let segs = [(10, 100), (10, 500), (10, 150)];
        assert_eq!(segments_to_delete(&segs, 40, Some(100), None, 300), 1);
        assert_eq!(segments_to_delete(&segs, 40, Some(100), None, 700), 3);
        assert_eq!(segments_to_delete(&segs, 40, None, None, 700), 0);
    }

    #[test]
    fn by_size_keeps_at_least_the_limit() {
        let segs = [(10, 0), (10, 0), (10, 0)];
        // 40 bytes total (10 in the active segment), keep >= 25.
        assert_eq!(segments_to_delete(&segs, 40, None, Some(25), 0), 1);
        assert_eq!(segments_to_delete(&segs, 40, None, Some(10), 0), 3);
        assert_eq!(segments_to_delete(&segs, 40, None, Some(40), 0), 0);
        assert_eq!(segments_to_delete(&segs, 40, None, Some(0), 0), 3);
    }
}
