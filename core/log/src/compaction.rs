//! Compaction (placeholder until the cleaner lands).

use crate::checkpoint;
use crate::error::LogError;
use crate::log::Log;
use rill_proto::{Offset, TimestampMs};
use std::path::Path;

/// File name of the cleaner checkpoint: `0\n1\n0 <first dirty offset>\n`.
pub const CLEANER_CHECKPOINT: &str = "cleaner-offset-checkpoint";

pub(crate) fn read_cleaner_checkpoint(dir: &Path) -> Result<Option<Offset>, LogError> {
    Ok(checkpoint::read_checkpoint(&dir.join(CLEANER_CHECKPOINT))?
        .and_then(|e| e.first().map(|&(_, o)| Offset(o))))
}

impl Log {
    /// Compacts the non-active segments if the dirty ratio calls for it.
    /// Returns whether it ran.
    pub fn compact(&mut self, now_ms: TimestampMs) -> Result<bool, LogError> {
        let _ = now_ms;
        Ok(false)
    }
}
