//! `LeaderEpochCache`: which leader epoch started at which offset (KIP-101).
//!
//! Owns the `leader-epoch-checkpoint` file (checkpoint format version 0, entries
//! `epoch start_offset`, see [`crate::checkpoint`]). Invariants, asserted where an
//! entry is added: epochs strictly increase and start offsets never decrease along
//! the list. The log keeps the file in step: it is rewritten whenever an entry is
//! added or truncated away.

use crate::checkpoint;
use crate::error::LogError;
use rill_proto::{LeaderEpoch, Offset};
use std::path::{Path, PathBuf};

/// File name of the leader-epoch checkpoint inside a log directory.
pub const LEADER_EPOCH_CHECKPOINT: &str = "leader-epoch-checkpoint";

/// A follower's cut after one OffsetForLeaderEpoch answer
/// ([`LeaderEpochCache::truncation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncation {
    /// Records at or after this offset go (the log end: none do).
    pub to: Offset,
    /// Whether this replica agrees with the leader up to `to`; when not, it
    /// cuts at `to` and asks again with the epoch its log then ends in.
    pub settled: bool,
}

#[derive(Debug)]
pub struct LeaderEpochCache {
    dir: PathBuf,
    entries: Vec<(LeaderEpoch, Offset)>,
}

impl LeaderEpochCache {
    /// Loads the checkpoint in `dir` (empty if there is none).
    pub fn load(dir: &Path) -> Result<LeaderEpochCache, LogError> {
        let path = dir.join(LEADER_EPOCH_CHECKPOINT);
        let raw = checkpoint::read_checkpoint(&path)?.unwrap_or_default();
        let mut cache = LeaderEpochCache {
            dir: dir.to_path_buf(),
            entries: Vec::with_capacity(raw.len()),
        };
        for (epoch, start) in raw {
            let (epoch, start) = (LeaderEpoch(epoch as i32), Offset(start));
            if let Some(&(last_epoch, last_start)) = cache.entries.last()
                && (epoch <= last_epoch || start < last_start)
            {
                return Err(LogError::Corrupt {
                    path,
                    position: 0,
                    reason: format!(
                        "epoch entry ({epoch}, {start}) does not follow ({last_epoch}, {last_start})"
                    ),
                });
            }
            cache.entries.push((epoch, start));
        }
        Ok(cache)
    }

    pub fn entries(&self) -> &[(LeaderEpoch, Offset)] {
        &self.entries
    }

    pub fn latest_epoch(&self) -> Option<LeaderEpoch> {
        self.entries.last().map(|e| e.0)
    }

    /// Records that `epoch` starts at `start`, if it is newer than the latest epoch.
    /// Returns whether an entry was added (the caller then persists).
    pub fn assign(&mut self, epoch: LeaderEpoch, start: Offset) -> bool {
        if epoch.0 < 0 || self.latest_epoch().is_some_and(|latest| epoch <= latest) {
            return false;
        }
        if let Some(&(_, last_start)) = self.entries.last() {
            // A later epoch starting before an earlier one: the earlier never wrote anything.
            // Kafka drops such entries; so do we, keeping start offsets monotonic.
            if start < last_start {
                self.entries.retain(|&(_, s)| s < start);
            }
        }
        if let Some(&(last_epoch, last_start)) = self.entries.last() {
            assert!(
                epoch > last_epoch && start >= last_start,
                "leader epochs go forward"
            );
        }
        self.entries.push((epoch, start));
        true
    }

    /// Drops entries that start at or after `end` (the log was truncated to `end`).
    pub fn truncate_from_end(&mut self, end: Offset) -> bool {
        let before = self.entries.len();
        self.entries.retain(|&(_, s)| s < end);
        self.entries.len() != before
    }

    /// Drops every entry (the log restarted with none of its old records).
    pub fn clear(&mut self) -> bool {
        let had = !self.entries.is_empty();
        self.entries.clear();
        had
    }

    /// The log now starts at `start`: entries wholly before it go, and the latest of
    /// those is kept with its start moved up to `start`.
    pub fn truncate_from_start(&mut self, start: Offset) -> bool {
        let below = self.entries.iter().take_while(|&&(_, s)| s < start).count();
        if below == 0 {
            return false;
        }
        let keep_epoch = self.entries[below - 1].0;
        self.entries.drain(..below);
        if self.entries.first().is_none_or(|&(_, s)| s > start) {
            self.entries.insert(0, (keep_epoch, start));
        }
        true
    }

    /// KIP-101: for the largest epoch <= `epoch` in the cache, its end offset: the start
    /// offset of the next epoch, or `log_end` if it is the latest. For an epoch
    /// older than every entry (the log's start moved past it), as Kafka: that
    /// epoch, ending where the first entry starts. `None` only when the cache
    /// is empty.
    pub fn end_offset_for(
        &self,
        epoch: LeaderEpoch,
        log_end: Offset,
    ) -> Option<(LeaderEpoch, Offset)> {
        let Some(idx) = self.entries.iter().rposition(|&(e, _)| e <= epoch) else {
            return self.entries.first().map(|&(_, start)| (epoch, start));
        };
        let found = self.entries[idx].0;
        let end = self.entries.get(idx + 1).map_or(log_end, |&(_, s)| s);
        Some((found, end))
    }

    /// Where a follower with this cache and log end cuts its log once the
    /// leader answered OffsetForLeaderEpoch for the follower's latest epoch
    /// with `leader`: the largest epoch it has at or before the one asked, and
    /// where that epoch ends in its log (`None`: it has none at or before).
    ///
    /// KIP-101 with KIP-279's repeat: when the leader answers with an epoch
    /// this replica does not have, this replica's records from that epoch's
    /// end on came from epochs the leader never saw, but even before that its
    /// records may have been written under an earlier epoch than the leader's
    /// (the same offsets filled twice by two leaders). So it cuts back to where
    /// its own latest epoch at or before the leader's ends, and asks again with
    /// the epoch it then ends in, until both name the same epoch.
    pub fn truncation(&self, leader: Option<(LeaderEpoch, Offset)>, log_end: Offset) -> Truncation {
        let Some((leader_epoch, leader_end)) = leader else {
            // The leader has no epochs at all (an empty log): none of ours is
            // known to match.
            return Truncation {
                to: Offset(0),
                settled: true,
            };
        };
        match self.end_offset_for(leader_epoch, log_end) {
            Some((ours, end)) if ours == leader_epoch => Truncation {
                to: end.min(leader_end).min(log_end),
                settled: true,
            },
            Some((_, end)) => Truncation {
                to: end.min(log_end),
                settled: false,
            },
            None => Truncation {
                to: leader_end.min(log_end),
                settled: true,
            },
        }
    }

    /// Writes the checkpoint file crash-safely.
    pub fn persist(&self) -> Result<(), LogError> {
        let raw: Vec<(i64, i64)> = self
            .entries
            .iter()
            .map(|&(e, s)| (e.0 as i64, s.0))
            .collect();
        checkpoint::write_checkpoint(&self.dir, LEADER_EPOCH_CHECKPOINT, &raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> (tempfile::TempDir, LeaderEpochCache) {
        let dir = tempfile::tempdir().unwrap();
        let c = LeaderEpochCache::load(dir.path()).unwrap();
        (dir, c)
    }

    #[test]
    fn assign_only_moves_forward() {
        let (_d, mut c) = cache();
        assert!(c.assign(LeaderEpoch(1), Offset(0)));
        assert!(!c.assign(LeaderEpoch(1), Offset(5)));
        assert!(!c.assign(LeaderEpoch(0), Offset(5)));
        assert!(c.assign(LeaderEpoch(3), Offset(10)));
        assert_eq!(
            c.entries(),
            &[(LeaderEpoch(1), Offset(0)), (LeaderEpoch(3), Offset(10))]
        );
    }

    #[test]
    fn end_offset_follows_kip_101() {
        let (_d, mut c) = cache();
        assert_eq!(c.end_offset_for(LeaderEpoch(5), Offset(0)), None);
        c.assign(LeaderEpoch(1), Offset(0));
        c.assign(LeaderEpoch(3), Offset(10));
        c.assign(LeaderEpoch(4), Offset(25));
        let leo = Offset(40);
        assert_eq!(
            c.end_offset_for(LeaderEpoch(0), leo),
            Some((LeaderEpoch(0), Offset(0))),
            "older than every entry: ends where the first starts"
        );
        assert_eq!(
            c.end_offset_for(LeaderEpoch(1), leo),
            Some((LeaderEpoch(1), Offset(10)))
        );
        assert_eq!(
            c.end_offset_for(LeaderEpoch(2), leo),
            Some((LeaderEpoch(1), Offset(10)))
        );
        assert_eq!(
            c.end_offset_for(LeaderEpoch(3), leo),
            Some((LeaderEpoch(3), Offset(25)))
        );
        assert_eq!(
            c.end_offset_for(LeaderEpoch(4), leo),
            Some((LeaderEpoch(4), leo))
        );
        assert_eq!(
            c.end_offset_for(LeaderEpoch(9), leo),
            Some((LeaderEpoch(4), leo))
        );
    }

    #[test]
    fn truncation_from_both_ends() {
        let (_d, mut c) = cache();
        c.assign(LeaderEpoch(1), Offset(0));
        c.assign(LeaderEpoch(3), Offset(10));
        c.assign(LeaderEpoch(4), Offset(25));
        assert!(c.truncate_from_end(Offset(25)));
        assert_eq!(c.latest_epoch(), Some(LeaderEpoch(3)));
        assert!(c.truncate_from_start(Offset(12)));
        assert_eq!(c.entries(), &[(LeaderEpoch(3), Offset(12))]);
        assert!(!c.truncate_from_start(Offset(12)));
    }

    #[test]
    fn persists_and_reloads() {
        let (d, mut c) = cache();
        c.assign(LeaderEpoch(2), Offset(7));
        c.assign(LeaderEpoch(5), Offset(9));
        c.persist().unwrap();
        let back = LeaderEpochCache::load(d.path()).unwrap();
        assert_eq!(back.entries(), c.entries());
        std::fs::write(d.path().join(LEADER_EPOCH_CHECKPOINT), "0\n2\n5 9\n2 7\n").unwrap();
        assert!(matches!(
            LeaderEpochCache::load(d.path()),
            Err(LogError::Corrupt { .. })
        ));
    }
}
