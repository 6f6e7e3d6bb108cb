//! Sparse indexes beside each segment: the offset index and the time index.
//!
//! Both keep every entry in memory (a `Vec`, binary-searched) and append new entries
//! to their file on `write_pending` (called on flush, roll and close); they are
//! rebuildable from the segment, so they are not fsynced per write. The file is
//! open only while it is written or fsynced, never in between: a broker hosting
//! ten thousand partitions would otherwise hold two idle descriptors for each of
//! them beside the segment's own (reads never touch the file).
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
    /// The file was written since it was loaded, released or renamed, so it
    /// holds exactly `written` entries. (No handle is kept; see the module doc.)
    file_current: bool,
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
            file_current: false,
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
            file_current: false,
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
            if self.file_current {
                // Best effort: the index is rebuilt on open if this does not stick.
                let _ = self.open().and_then(|f| {
                    f.set_len((keep * E::SIZE) as u64).map_err(io_context(|| {
                        format!("truncating index {}", self.path.display())
                    }))
                });
            }
        }
    }

    /// Opens (creating) the file; the handle is dropped by the caller.
    fn open(&self) -> Result<File, LogError> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)
            .map_err(io_context(|| {
                format!("opening index {}", self.path.display())
            }))
    }

    /// Appends the entries not yet in the file (creating it), then closes it.
    pub fn write_pending(&mut self) -> Result<(), LogError> {
        if self.written == self.entries.len() && self.file_current {
            return Ok(());
        }
        self.write_to_file()?;
        Ok(())
    }

    /// Writes the pending entries into the open file and returns it.
    fn write_to_file(&mut self) -> Result<File, LogError> {
        let mut buf = Vec::with_capacity((self.entries.len() - self.written) * E::SIZE);
        for e in &self.entries[self.written..] {
            e.encode(&mut buf);
        }
        let at = (self.written * E::SIZE) as u64;
        let f = self.open()?;
        f.set_len(at).map_err(io_context(|| {
            format!("truncating index {}", self.path.display())
        }))?;
        f.write_all_at(&buf, at).map_err(io_context(|| {
            format!("writing index {}", self.path.display())
        }))?;
        self.written = self.entries.len();
        self.file_current = true;
        Ok(f)
    }

    /// Writes pending entries and fsyncs the file, then closes it. With
    /// nothing to write the file is only fsynced (a rewrite would dirty the
    /// inode, and closing ten thousand logs would wait for as many journal
    /// commits).
    pub fn sync(&mut self) -> Result<(), LogError> {
        let f = if self.written == self.entries.len() && self.file_current {
            self.open()?
        } else {
            self.write_to_file()?
        };
        f.sync_data().map_err(io_context(|| {
            format!("fsyncing index {}", self.path.display())
        }))
    }

    /// Renames the file (used when a cleaned segment replaces the old one).
    pub fn set_path(&mut self, path: PathBuf) {
        self.path = path;
        self.file_current = false;
    }

    /// Forgets that the file is current: the next `write_pending` rewrites its
    /// tail (and creates it if it went missing). No handle is held either way.
    pub fn release(&mut self) {
        self.file_current = false;
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

    /// Descriptors of this process open on `path` (Linux: /proc/self/fd).
    fn open_fds_on(path: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == path))
            .count()
    }

    #[test]
    fn no_descriptor_is_held_between_writes() {
        let d = tempfile::tempdir().unwrap();
        let mut i = idx(d.path());
        i.write_pending().unwrap();
        let path = d.path().join("0.index").canonicalize().unwrap();
        assert_eq!(open_fds_on(&path), 0, "write_pending keeps the file open");
        i.push(OffsetEntry {
            relative_offset: 100,
            position: 10_000,
        });
        i.sync().unwrap();
        assert_eq!(open_fds_on(&path), 0, "sync keeps the file open");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 11 * 8);
        // Released (as a sealed segment's indexes are): a later write reopens
        // the file for the write only.
        i.release();
        i.push(OffsetEntry {
            relative_offset: 110,
            position: 11_000,
        });
        i.write_pending().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 12 * 8);
        assert_eq!(open_fds_on(&path), 0);
    }
}
