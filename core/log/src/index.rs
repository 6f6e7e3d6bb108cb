//! Sparse indexes beside each segment: the offset index and the time index.
//!
//! Both keep every entry in memory (a `Vec`, binary-searched) and append new entries
//! to their file on `write_pending` (called on flush, roll and close); they are
//! rebuildable from the segment, so they are not fsynced per write.
//!
//! On-disk format, version 0 (Kafka's layout, no file header), big-endian:
//!
//! ```text
//! <base>.index      8-byte entries: relative offset u32 | byte position u32
//! <base>.timeindex 12-byte entries: timestamp ms i64   | relative offset u32
//! ```
//!
//! Relative offsets are offsets minus the segment's base offset. An offset-index
//! entry points at the first byte of the batch whose base offset it names. A
//! time-index entry (T, o) says: every batch of the segment with base offset <= o
//! has a max timestamp <= T; the last entry's T is the segment's max timestamp once
//! the segment is sealed (rolled or closed).
//!
//! Invariants, asserted on append and checked on load: offsets strictly increase,
//! positions and timestamps strictly increase, and (checked by the segment) no
//! entry points past the end of its segment.

use crate::error::{LogError, io_context};
use rill_proto::Offset;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// One fixed-size index entry.
pub trait IndexEntry: Copy + std::fmt::Debug {
    const SIZE: usize;
    fn encode(&self, out: &mut Vec<u8>);
    fn decode(b: &[u8]) -> Self;
    /// The relative offset the entry names.
    fn relative_offset(&self) -> u32;
    /// The other key, which must also strictly increase (position or timestamp).
    fn ordering_key(&self) -> i64;
}

/// An offset-index entry: (relative offset, byte position of that batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetEntry {
    pub relative_offset: u32,
    pub position: u32,
}

impl IndexEntry for OffsetEntry {
    const SIZE: usize = 8;
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.relative_offset.to_be_bytes());
        out.extend_from_slice(&self.position.to_be_bytes());
    }
    fn decode(b: &[u8]) -> Self {
        OffsetEntry {
            relative_offset: u32::from_be_bytes(b[0..4].try_into().expect("4 bytes")),
            position: u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")),
        }
    }
    fn relative_offset(&self) -> u32 {
        self.relative_offset
    }
    fn ordering_key(&self) -> i64 {
        self.position as i64
    }
}

/// A time-index entry: (max timestamp so far, relative offset of the batch reaching it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeEntry {
    pub timestamp_ms: i64,
    pub relative_offset: u32,
}

impl IndexEntry for TimeEntry {
    const SIZE: usize = 12;
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.timestamp_ms.to_be_bytes());
        out.extend_from_slice(&self.relative_offset.to_be_bytes());
    }
    fn decode(b: &[u8]) -> Self {
        TimeEntry {
            timestamp_ms: i64::from_be_bytes(b[0..8].try_into().expect("8 bytes")),
            relative_offset: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
        }
    }
    fn relative_offset(&self) -> u32 {
        self.relative_offset
    }
    fn ordering_key(&self) -> i64 {
        self.timestamp_ms
    }
}

/// Upper bound on one index file (bounds memory on load): 2^24 entries.
pub const INDEX_ENTRIES_MAX: usize = 1 << 24;

/// A sparse index held in memory and mirrored to a file.
pub struct SparseIndex<E: IndexEntry> {
    path: PathBuf,
    entries: Vec<E>,
    /// Entries already in the file.
    written: usize,
    file: Option<File>,
}

// Debug shows the size, not every entry (a segment may hold millions).
impl<E: IndexEntry> std::fmt::Debug for SparseIndex<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SparseIndex")
            .field("path", &self.path)
            .field("entries", &self.entries.len())
            .field("written", &self.written)
            .field("last", &self.entries.last())
            .finish()
    }
}

pub type OffsetIndex = SparseIndex<OffsetEntry>;
pub type TimeIndex = SparseIndex<TimeEntry>;

impl<E: IndexEntry> SparseIndex<E> {
    /// An empty index whose file will be (re)written from scratch.
    pub fn empty(path: PathBuf) -> Self {
        SparseIndex {
            path,
            entries: Vec::new(),
            written: 0,
            file: None,
        }
    }

    /// Loads the index file and checks it. `Ok(Err(reason))` when it is missing or
    /// fails a sanity check (the caller rebuilds it); `ordering_key_max` bounds the
    /// second key (the segment size for positions), `relative_offset_max` the offsets.
    pub fn load(
        path: PathBuf,
        relative_offset_max: u64,
        ordering_key_max: Option<i64>,
    ) -> Result<Result<Self, String>, LogError> {
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Err("missing".into())),
            Err(e) => {
                return Err(io_context(|| format!("reading index {}", path.display()))(
                    e,
                ));
            }
        };
        if bytes.len() % E::SIZE != 0 {
            return Ok(Err(format!(
                "size {} is not a multiple of {}",
                bytes.len(),
                E::SIZE
            )));
        }
        if bytes.len() / E::SIZE > INDEX_ENTRIES_MAX {
            return Ok(Err(format!(
                "{} entries exceed the bound {INDEX_ENTRIES_MAX}",
                bytes.len() / E::SIZE
            )));
        }
        let entries: Vec<E> = bytes.chunks_exact(E::SIZE).map(E::decode).collect();
        for (i, e) in entries.iter().enumerate() {
            if e.relative_offset() as u64 > relative_offset_max {
                return Ok(Err(format!(
                    "entry {i} names relative offset {} past the segment",
                    e.relative_offset()
                )));
            }
            if ordering_key_max.is_some_and(|max| e.ordering_key() >= max) {
                return Ok(Err(format!("entry {i} points past the end of the segment")));
            }
            if i > 0 {
                let p = &entries[i - 1];
                if e.relative_offset() <= p.relative_offset()
                    || e.ordering_key() <= p.ordering_key()
                {
                    return Ok(Err(format!("entry {i} does not increase")));
                }
            }
        }
        let written = entries.len();
        Ok(Ok(SparseIndex {
            path,
            entries,
            written,
            file: None,
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entries(&self) -> &[E] {
        &self.entries
    }

    pub fn last(&self) -> Option<&E> {
        self.entries.last()
    }

    /// Appends an entry in memory; asserts the ordering invariant.
    pub fn push(&mut self, entry: E) {
        if let Some(last) = self.entries.last() {
            assert!(
                entry.relative_offset() > last.relative_offset()
                    && entry.ordering_key() > last.ordering_key(),
                "index {} entries must strictly increase: {entry:?} after {last:?}",
                self.path.display()
            );
        }
        self.entries.push(entry);
    }

    /// The last entry whose relative offset is <= `relative`.
    pub fn floor_by_offset(&self, relative: u32) -> Option<&E> {
        let n = self
            .entries
            .partition_point(|e| e.relative_offset() <= relative);
        n.checked_sub(1).map(|i| &self.entries[i])
    }

    /// The last entry whose ordering key (position / timestamp) is `pred`-true, for a
    /// predicate that is true on a prefix.
    pub fn last_where(&self, pred: impl Fn(&E) -> bool) -> Option<&E> {
        let n = self.entries.partition_point(pred);
        n.checked_sub(1).map(|i| &self.entries[i])
    }

    /// Drops entries from the first one `pred` is true for (a suffix).
    pub fn truncate_where(&mut self, pred: impl Fn(&E) -> bool) {
        let keep = self
            .entries
            .iter()
            .position(pred)
            .unwrap_or(self.entries.len());
        self.entries.truncate(keep);
        if self.written > keep {
            self.written = keep;
            if let Some(f) = &self.file {
                // Best effort: the index is rebuilt on open if this does not stick.
                let _ = f.set_len((keep * E::SIZE) as u64);
            }
        }
    }

    fn file(&mut self) -> Result<&File, LogError> {
        if self.file.is_none() {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path)
                .map_err(io_context(|| {
                    format!("opening index {}", self.path.display())
                }))?;
            self.file = Some(f);
        }
        Ok(self.file.as_ref().expect("just opened"))
    }

    /// Appends the entries not yet in the file.
    pub fn write_pending(&mut self) -> Result<(), LogError> {
        if self.written == self.entries.len() && self.file.is_some() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity((self.entries.len() - self.written) * E::SIZE);
        for e in &self.entries[self.written..] {
            e.encode(&mut buf);
        }
        let at = (self.written * E::SIZE) as u64;
        let path = self.path.clone();
        let f = self.file()?;
        f.set_len(at).map_err(io_context(|| {
            format!("truncating index {}", path.display())
        }))?;
        f.write_all_at(&buf, at)
            .map_err(io_context(|| format!("writing index {}", path.display())))?;
        self.written = self.entries.len();
        Ok(())
    }

    /// Writes pending entries and fsyncs the file.
    pub fn sync(&mut self) -> Result<(), LogError> {
        self.write_pending()?;
        let path = self.path.clone();
        self.file()?
            .sync_data()
            .map_err(io_context(|| format!("fsyncing index {}", path.display())))
    }

    /// Renames the file (used when a cleaned segment replaces the old one).
    pub fn set_path(&mut self, path: PathBuf) {
        self.path = path;
        self.file = None;
    }

    /// Closes the file handle (a later write reopens it).
    pub fn release(&mut self) {
        self.file = None;
    }
}

/// Converts an absolute offset to one relative to `base`, asserting it fits.
pub fn relative(base: Offset, offset: Offset) -> u32 {
    let rel = offset.0 - base.0;
    assert!(
        (0..=u32::MAX as i64).contains(&rel),
        "offset {offset} is not within u32 of segment base {base}"
    );
    rel as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(dir: &Path) -> OffsetIndex {
        let mut i = OffsetIndex::empty(dir.join("0.index"));
        for k in 0..10u32 {
            i.push(OffsetEntry {
                relative_offset: k * 10,
                position: k * 1000,
            });
        }
        i
    }

    #[test]
    fn lookup_finds_floor_entry() {
        let d = tempfile::tempdir().unwrap();
        let i = idx(d.path());
        assert_eq!(i.floor_by_offset(0).unwrap().position, 0);
        assert_eq!(i.floor_by_offset(9).unwrap().position, 0);
        assert_eq!(i.floor_by_offset(10).unwrap().position, 1000);
        assert_eq!(i.floor_by_offset(55).unwrap().position, 5000);
        assert_eq!(i.floor_by_offset(u32::MAX).unwrap().position, 9000);
        assert_eq!(
            i.last_where(|e| e.position <= 4500)
                .unwrap()
                .relative_offset,
            40
        );
        let empty = OffsetIndex::empty(d.path().join("x"));
        assert!(empty.floor_by_offset(3).is_none());
    }

    #[test]
    #[should_panic(expected = "strictly increase")]
    fn decreasing_entry_panics() {
        let d = tempfile::tempdir().unwrap();
        let mut i = idx(d.path());
        i.push(OffsetEntry {
            relative_offset: 95,
            position: 100,
        });
    }

    #[test]
    fn file_round_trip_and_sanity_checks() {
        let d = tempfile::tempdir().unwrap();
        let mut i = idx(d.path());
        i.write_pending().unwrap();
        i.push(OffsetEntry {
            relative_offset: 100,
            position: 10_000,
        });
        i.write_pending().unwrap();
        let back = OffsetIndex::load(i.path().to_path_buf(), 1000, Some(20_000))
            .unwrap()
            .unwrap();
        assert_eq!(back.entries(), i.entries());
        // An entry past the end of the segment fails the check.
        assert!(
            OffsetIndex::load(i.path().to_path_buf(), 1000, Some(10_000))
                .unwrap()
                .is_err()
        );
        // A torn entry fails the check.
        let mut bytes = std::fs::read(i.path()).unwrap();
        bytes.pop();
        std::fs::write(i.path(), &bytes).unwrap();
        assert!(
            OffsetIndex::load(i.path().to_path_buf(), 1000, None)
                .unwrap()
                .is_err()
        );
        // Missing is reported, not an error.
        assert!(
            OffsetIndex::load(d.path().join("none"), 1000, None)
                .unwrap()
                .is_err()
        );
        // Truncation cuts the file as well.
        let mut i = idx(d.path());
        i.write_pending().unwrap();
        i.truncate_where(|e| e.position >= 5000);
        assert_eq!(i.entries().len(), 5);
        let back = OffsetIndex::load(i.path().to_path_buf(), 1000, None)
            .unwrap()
            .unwrap();
        assert_eq!(back.entries().len(), 5);
    }
}
