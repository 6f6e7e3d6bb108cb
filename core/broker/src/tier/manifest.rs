//! The per-partition manifest: which segments of a partition are in the object
//! store, and where the partition's log starts.
//!
//! Format (object `manifest.json`, JSON, `format_version` 1):
//!
//! ```json
//! { "format_version": 1, "manifest_version": 7, "leader_epoch": 0,
//!   "topic": "t", "topic_id": "…", "partition": 0, "log_start_offset": 0,
//!   "segments": [ { "base_offset": 0, "next_offset": 120, "size_bytes": 1048000,
//!                   "max_timestamp_ms": 1764000000000, "leader_epoch": 0,
//!                   "offset_index_bytes": 2048, "time_index_bytes": 3072 } ] }
//! ```
//!
//! Why JSON (serde) and not rkyv: the manifest is written once per uploaded segment
//! and read once when a broker starts leading the partition; it is never on a hot
//! path, so zero-copy buys nothing, while a text format lets an operator read and
//! repair it with any tool, and unknown fields of a newer minor writer are ignored.
//! A reader refuses a `format_version` it does not know rather than guess.
//!
//! Atomicity: an object store PUT replaces the whole object or nothing, so a
//! manifest is always one writer's complete version. `manifest_version` increases
//! by one with every write; a writer re-reads the stored manifest before replacing
//! it and refuses to if it moved on (another writer) or was written by a higher
//! leader epoch (a newer leader): see [`check_successor`].
//!
//! Invariants (checked by [`Manifest::validate`] on every load and before every
//! store): segments are ordered by base offset, each non-empty, each ends after the
//! previous one ends (segments uploaded by different leaders may overlap, never go
//! back), and `log_start_offset` is at or before the first segment's end.

use rill_proto::{LeaderEpoch, Offset, TimestampMs};
use serde::{Deserialize, Serialize};

/// The manifest format this broker writes and reads.
pub const MANIFEST_FORMAT_VERSION: u32 = 1;
/// Bound on a manifest object's size when read (a million segments at ~200 bytes).
pub const MANIFEST_BYTES_MAX: u64 = 256 << 20;

/// One segment in the object store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSegment {
    pub base_offset: Offset,
    /// The offset after the segment's last batch.
    pub next_offset: Offset,
    pub size_bytes: u64,
    pub max_timestamp_ms: TimestampMs,
    /// The leader epoch of the broker that uploaded it (part of its object names).
    pub leader_epoch: LeaderEpoch,
    pub offset_index_bytes: u64,
    pub time_index_bytes: u64,
}

/// A partition's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    /// Increases by one with every write.
    pub manifest_version: u64,
    /// The leader epoch of the last writer.
    pub leader_epoch: LeaderEpoch,
    pub topic: String,
    pub topic_id: String,
    pub partition: u32,
    /// The partition's first offset still kept in the object store.
    pub log_start_offset: Offset,
    pub segments: Vec<RemoteSegment>,
}

/// A manifest that cannot be used, with the reason.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest of {topic}-{partition} does not parse: {reason}")]
    Parse {
        topic: String,
        partition: u32,
        reason: String,
    },
    #[error(
        "manifest of {topic}-{partition} has format version {found}; this broker reads version {}: upgrade the broker",
        MANIFEST_FORMAT_VERSION
    )]
    FormatVersion {
        topic: String,
        partition: u32,
        found: u32,
    },
    #[error("manifest of {topic}-{partition} is inconsistent: {reason}")]
    Invalid {
        topic: String,
        partition: u32,
        reason: String,
    },
    #[error(
        "manifest of {topic}-{partition} was replaced by another writer (stored version {stored}, \
         leader epoch {stored_epoch}; ours {ours}, epoch {our_epoch}): this broker re-reads it and stops uploading if it is no longer the leader"
    )]
    Conflict {
        topic: String,
        partition: u32,
        stored: u64,
        stored_epoch: LeaderEpoch,
        ours: u64,
        our_epoch: LeaderEpoch,
    },
    #[error(
        "manifest of {topic}-{partition} was replaced by another writer after this broker read version {read} \
         (the object store refused the conditional write of version {ours}): this broker re-reads it and stops \
         uploading if it is no longer the leader"
    )]
    Replaced {
        topic: String,
        partition: u32,
        read: u64,
        ours: u64,
    },
}

impl Manifest {
    /// An empty manifest (nothing uploaded yet), version 0 (never stored).
    pub fn empty(topic: &str, topic_id: &str, partition: u32, epoch: LeaderEpoch) -> Manifest {
        Manifest {
            format_version: MANIFEST_FORMAT_VERSION,
            manifest_version: 0,
            leader_epoch: epoch,
            topic: topic.to_string(),
            topic_id: topic_id.to_string(),
            partition,
            log_start_offset: Offset::ZERO,
            segments: Vec::new(),
        }
    }

    /// The offset after the last remote segment (None when there is none).
    pub fn end_offset(&self) -> Option<Offset> {
        self.segments.last().map(|s| s.next_offset)
    }

    /// The first offset held remotely (None when there is nothing).
    pub fn start_offset(&self) -> Option<Offset> {
        self.segments
            .first()
            .map(|s| s.base_offset.max(self.log_start_offset))
    }

    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size_bytes).sum()
    }

    /// The segment that serves a read at `offset`: the last one starting at or before
    /// it, or (past a compaction gap) the first one after it. None: nothing remote
    /// at or after `offset`.
    pub fn segment_for(&self, offset: Offset) -> Option<&RemoteSegment> {
        let i = self
            .segments
            .partition_point(|s| s.base_offset <= offset)
            .saturating_sub(1);
        self.segments[i..].iter().find(|s| s.next_offset > offset)
    }

    /// The successor of this manifest with `segment` appended, written by `epoch`.
    pub fn with_segment(&self, segment: RemoteSegment, epoch: LeaderEpoch) -> Manifest {
        let mut next = self.clone();
        if next.segments.is_empty() {
            next.log_start_offset = next.log_start_offset.max(segment.base_offset);
        }
        next.segments.push(segment);
        next.manifest_version += 1;
        next.leader_epoch = epoch;
        next
    }

    /// The successor without its first `n` segments (total retention), written by `epoch`.
    pub fn without_oldest(&self, n: usize, epoch: LeaderEpoch) -> Manifest {
        let mut next = self.clone();
        let removed: Vec<RemoteSegment> = next.segments.drain(..n).collect();
        if let Some(last) = removed.last() {
            next.log_start_offset = next.log_start_offset.max(last.next_offset);
        }
        next.manifest_version += 1;
        next.leader_epoch = epoch;
        next
    }

    pub fn validate(&self) -> Result<(), ManifestError> {
        let invalid = |reason: String| ManifestError::Invalid {
            topic: self.topic.clone(),
            partition: self.partition,
            reason,
        };
        let mut prev_base: Option<Offset> = None;
        let mut prev_end: Option<Offset> = None;
        for s in &self.segments {
            if s.next_offset <= s.base_offset || s.size_bytes == 0 {
                return Err(invalid(format!(
                    "segment at {} is empty (next offset {}, {} bytes)",
                    s.base_offset, s.next_offset, s.size_bytes
                )));
            }
            if prev_base.is_some_and(|b| s.base_offset < b)
                || prev_end.is_some_and(|e| s.next_offset <= e)
            {
                return Err(invalid(format!(
                    "segment at {} does not follow the previous one",
                    s.base_offset
                )));
            }
            prev_base = Some(s.base_offset);
            prev_end = Some(s.next_offset);
        }
        if let Some(first) = self.segments.first()
            && self.log_start_offset >= first.next_offset
        {
            return Err(invalid(format!(
                "log start offset {} is past the first segment's end {}",
                self.log_start_offset, first.next_offset
            )));
        }
        Ok(())
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a manifest always serialises")
    }

    /// Parses and validates a stored manifest of `topic`-`partition`.
    pub fn decode(bytes: &[u8], topic: &str, partition: u32) -> Result<Manifest, ManifestError> {
        #[derive(Deserialize)]
        struct Version {
            format_version: u32,
        }
        let parse = |e: serde_json::Error| ManifestError::Parse {
            topic: topic.to_string(),
            partition,
            reason: e.to_string(),
        };
        let v: Version = serde_json::from_slice(bytes).map_err(parse)?;
        if v.format_version != MANIFEST_FORMAT_VERSION {
            return Err(ManifestError::FormatVersion {
                topic: topic.to_string(),
                partition,
                found: v.format_version,
            });
        }
        let m: Manifest = serde_json::from_slice(bytes).map_err(parse)?;
        m.validate()?;
        Ok(m)
    }
}

/// Whether `ours` may replace `stored` (what the store holds now): only if the store
/// still holds the version `ours` was derived from, and no higher leader epoch wrote it.
pub fn check_successor(stored: Option<&Manifest>, ours: &Manifest) -> Result<(), ManifestError> {
    let (stored_version, stored_epoch) = stored.map_or((0, LeaderEpoch(-1)), |m| {
        (m.manifest_version, m.leader_epoch)
    });
    if stored_version + 1 != ours.manifest_version || stored_epoch > ours.leader_epoch {
        return Err(ManifestError::Conflict {
            topic: ours.topic.clone(),
            partition: ours.partition,
            stored: stored_version,
            stored_epoch,
            ours: ours.manifest_version,
            our_epoch: ours.leader_epoch,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(base: i64, next: i64) -> RemoteSegment {
        RemoteSegment {
            base_offset: Offset(base),
            next_offset: Offset(next),
            size_bytes: 100,
            max_timestamp_ms: 5,
            leader_epoch: LeaderEpoch(0),
            offset_index_bytes: 8,
            time_index_bytes: 12,
        }
    }

    #[test]
    fn round_trip_and_lookup() {
        let m = Manifest::empty("t", "id", 0, LeaderEpoch(0))
            .with_segment(seg(0, 10), LeaderEpoch(0))
            .with_segment(seg(10, 20), LeaderEpoch(0))
            // a compaction gap, then an overlap from a segment another leader rolled
            .with_segment(seg(25, 40), LeaderEpoch(1))
            .with_segment(seg(30, 50), LeaderEpoch(1));
        assert_eq!(m.manifest_version, 4);
        let back = Manifest::decode(&m.encode(), "t", 0).unwrap();
        assert_eq!(back, m);
        assert_eq!(m.segment_for(Offset(0)).unwrap().base_offset, Offset(0));
        assert_eq!(m.segment_for(Offset(19)).unwrap().base_offset, Offset(10));
        assert_eq!(m.segment_for(Offset(21)).unwrap().base_offset, Offset(25));
        assert_eq!(m.segment_for(Offset(45)).unwrap().base_offset, Offset(30));
        assert!(m.segment_for(Offset(50)).is_none());
        assert_eq!(m.end_offset(), Some(Offset(50)));
        let trimmed = m.without_oldest(2, LeaderEpoch(1));
        assert_eq!(trimmed.log_start_offset, Offset(20));
        assert_eq!(trimmed.start_offset(), Some(Offset(25)));
        trimmed.validate().unwrap();
    }

    #[test]
    fn refuses_unknown_format_bad_order_and_stale_writers() {
        let mut m =
            Manifest::empty("t", "id", 0, LeaderEpoch(0)).with_segment(seg(0, 10), LeaderEpoch(0));
        m.format_version = 9;
        let e = Manifest::decode(&m.encode(), "t", 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("format version 9"), "{e}");
        let mut m = Manifest::empty("t", "id", 0, LeaderEpoch(0));
        m.segments = vec![seg(10, 20), seg(0, 10)];
        assert!(Manifest::decode(&m.encode(), "t", 0).is_err());
        assert!(Manifest::decode(b"{nope", "t", 0).is_err());

        let base =
            Manifest::empty("t", "id", 0, LeaderEpoch(2)).with_segment(seg(0, 10), LeaderEpoch(2));
        let next = base.with_segment(seg(10, 20), LeaderEpoch(2));
        check_successor(Some(&base), &next).unwrap();
        check_successor(None, &base).unwrap();
        // Someone else wrote meanwhile.
        assert!(check_successor(Some(&next), &next).is_err());
        // A newer leader wrote version 1: an old leader's version 2 must not replace it.
        let mut newer = base.clone();
        newer.leader_epoch = LeaderEpoch(3);
        assert!(check_successor(Some(&newer), &next).is_err());
    }
}
