//! `Segment`: one `<base>.log` file of whole batches plus its two sparse indexes.
//!
//! File naming: the base offset as 20 zero-padded decimal digits, e.g.
//! `00000000000000000000.log`, `.index`, `.timeindex` (formats in [`crate::index`]).
//! The `.log` file is the batches exactly as appended (record batch magic 2, see
//! `rill_proto::batch`), back to back, no file header.
//!
//! Writes are plain positional writes (`pwrite`) with no user-space buffer, so a
//! reader's `pread` sees appended data at once; durability comes from `flush`.
//!
//! Invariants, asserted where a batch is noted: batch offsets strictly increase (gaps
//! are allowed after compaction), every batch lies wholly inside the file, and no
//! index entry points past the end of the segment or goes backwards.

use crate::error::{LogError, io_context};
use crate::index::{OffsetEntry, OffsetIndex, TimeEntry, TimeIndex, relative};
use crate::tail::Tail;
use rill_proto::batch::{BATCH_HEADER_LEN, BatchHeader, BatchView};
use rill_proto::{Offset, TimestampMs};
use std::fs::{File, OpenOptions};
use std::io::IoSlice;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const LOG_SUFFIX: &str = ".log";
pub const INDEX_SUFFIX: &str = ".index";
pub const TIME_INDEX_SUFFIX: &str = ".timeindex";
/// Suffix of a compacted segment being written; deleted by recovery if left over.
pub const CLEANED_SUFFIX: &str = ".cleaned";
/// Suffix of a segment file on its way out; deleted by recovery if left over.
pub const DELETED_SUFFIX: &str = ".deleted";
/// Relative offsets must fit an index entry; roll before a batch would pass this.
pub const RELATIVE_OFFSET_MAX: i64 = i32::MAX as i64;
/// Read size of the sequential scans of recovery, rebuild and compaction.
pub const SCAN_CHUNK_BYTES: usize = 1 << 20;
/// Read size of the short scans that find the tail of a segment from its last index entry.
pub const TAIL_SCAN_CHUNK_BYTES: usize = 64 << 10;

/// `<dir>/<20-digit base><suffix>`.
pub fn segment_path(dir: &Path, base: Offset, suffix: &str) -> PathBuf {
    dir.join(format!("{:020}{suffix}", base.0))
}

/// Parses `<20 digits>.log` into its base offset.
pub fn parse_segment_name(name: &str) -> Option<Offset> {
    let digits = name.strip_suffix(LOG_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<i64>().ok().map(Offset)
}

#[derive(Debug)]
pub struct Segment {
    pub base_offset: Offset,
    pub path: PathBuf,
    pub file: Arc<File>,
    /// Bytes of whole batches in the file.
    pub size: u64,
    pub offset_index: OffsetIndex,
    pub time_index: TimeIndex,
    /// The offset after the last batch, or the base offset when empty.
    pub next_offset: Offset,
    /// The largest batch max timestamp, `i64::MIN` when empty.
    pub max_timestamp: TimestampMs,
    /// The base offset of the last batch.
    pub last_batch_base: Option<Offset>,
    /// Bytes appended since the last offset-index entry.
    pub bytes_since_index: u64,
    /// Wall-clock (or first batch) time the segment started, for `segment.ms`.
    pub created_ms: TimestampMs,
    /// Length of the `.log` file at its last fsync by this process: the bytes a
    /// power loss cannot take (0 for a file this process has not fsynced yet).
    pub synced_len: u64,
    /// A copy of the newest bytes of a leader's appends (see
    /// [`crate::tail`]); empty unless appended with
    /// [`Segment::append_pieces`].
    pub cache: Tail,
}

impl Segment {
    /// Creates a new empty segment (its files must not hold data).
    pub fn create(dir: &Path, base: Offset, now_ms: TimestampMs) -> Result<Segment, LogError> {
        Segment::create_with_suffix(dir, base, "", now_ms)
    }

    /// Creates a new empty segment whose three files carry an extra `suffix`
    /// (compaction writes `<base>.log.cleaned` and friends).
    pub fn create_with_suffix(
        dir: &Path,
        base: Offset,
        suffix: &str,
        now_ms: TimestampMs,
    ) -> Result<Segment, LogError> {
        let path = segment_path(dir, base, &format!("{LOG_SUFFIX}{suffix}"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(io_context(|| {
                format!("creating segment {}", path.display())
            }))?;
        let mut seg = Segment::with_file(dir, base, path, file, 0, now_ms);
        seg.offset_index =
            OffsetIndex::empty(segment_path(dir, base, &format!("{INDEX_SUFFIX}{suffix}")));
        seg.time_index = TimeIndex::empty(segment_path(
            dir,
            base,
            &format!("{TIME_INDEX_SUFFIX}{suffix}"),
        ));
        // Start from empty index files even if stale ones exist.
        seg.rewrite_index_files()?;
        Ok(seg)
    }

    /// Replaces both index files on disk with the in-memory entries (deleting any
    /// stale file first).
    pub(crate) fn rewrite_index_files(&mut self) -> Result<(), LogError> {
        for p in [
            self.offset_index.path().to_path_buf(),
            self.time_index.path().to_path_buf(),
        ] {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(io_context(|| {
                        format!("removing stale index {}", p.display())
                    })(e));
                }
            }
        }
        self.offset_index.write_pending()?;
        self.time_index.write_pending()?;
        Ok(())
    }

    /// Opens an existing `.log` file with empty in-memory indexes.
    pub fn open_file(dir: &Path, base: Offset, now_ms: TimestampMs) -> Result<Segment, LogError> {
        let path = segment_path(dir, base, LOG_SUFFIX);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_context(|| format!("opening segment {}", path.display())))?;
        let len = file
            .metadata()
            .map_err(io_context(|| {
                format!("reading metadata of {}", path.display())
            }))?
            .len();
        Ok(Segment::with_file(dir, base, path, file, len, now_ms))
    }

    fn with_file(
        dir: &Path,
        base: Offset,
        path: PathBuf,
        file: File,
        size: u64,
        now_ms: TimestampMs,
    ) -> Segment {
        Segment {
            base_offset: base,
            offset_index: OffsetIndex::empty(segment_path(dir, base, INDEX_SUFFIX)),
            time_index: TimeIndex::empty(segment_path(dir, base, TIME_INDEX_SUFFIX)),
            path,
            file: Arc::new(file),
            size,
            next_offset: base,
            max_timestamp: i64::MIN,
            last_batch_base: None,
            bytes_since_index: 0,
            created_ms: now_ms,
            synced_len: 0,
            cache: Tail::empty_at(size),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.last_batch_base.is_none()
    }

    /// Would a batch ending at `last_offset` still fit this segment's relative offsets?
    pub fn can_hold_offset(&self, last_offset: Offset) -> bool {
        last_offset.0 - self.base_offset.0 <= RELATIVE_OFFSET_MAX
    }

    /// Updates the in-memory state and indexes for a batch that lies at `position`.
    pub fn note_batch(&mut self, header: &BatchHeader, position: u64, index_interval_bytes: u32) {
        let size = header.total_size() as u64;
        assert!(
            position + size <= self.size,
            "batch at {position} of {size} bytes runs past the end {} of {}",
            self.size,
            self.path.display()
        );
        assert!(
            header.base_offset >= self.next_offset,
            "batch offsets must strictly increase in {}: batch at {} after next offset {}",
            self.path.display(),
            header.base_offset,
            self.next_offset
        );
        let rel = relative(self.base_offset, header.base_offset);
        let indexed = self.bytes_since_index >= index_interval_bytes as u64;
        if indexed {
            self.offset_index.push(OffsetEntry {
                relative_offset: rel,
                position: position as u32,
            });
            self.bytes_since_index = 0;
        }
        self.bytes_since_index += size;
        self.max_timestamp = self.max_timestamp.max(header.max_timestamp);
        if indexed {
            self.maybe_push_time_entry(rel);
        }
        self.last_batch_base = Some(header.base_offset);
        self.next_offset = header.next_offset();
    }

    fn maybe_push_time_entry(&mut self, rel: u32) {
        let newer = self
            .time_index
            .last()
            .is_none_or(|e| self.max_timestamp > e.timestamp_ms);
        if newer && self.max_timestamp != i64::MIN {
            self.time_index.push(TimeEntry {
                timestamp_ms: self.max_timestamp,
                relative_offset: rel,
            });
        }
    }

    /// Adds the final time-index entry so its last entry holds the segment's max
    /// timestamp (done before the segment stops being active, and on close).
    pub fn seal_time_index(&mut self) {
        if let Some(last) = self.last_batch_base {
            let rel = relative(self.base_offset, last);
            if self
                .time_index
                .last()
                .is_none_or(|e| e.relative_offset < rel)
            {
                self.maybe_push_time_entry(rel);
            }
        }
    }

    /// Appends already-validated batches (`headers` are their headers and positions
    /// within `bytes`).
    pub fn append(
        &mut self,
        bytes: &[u8],
        headers: &[(BatchHeader, u64)],
        index_interval_bytes: u32,
    ) -> Result<(), LogError> {
        self.append_vectored(&mut [IoSlice::new(bytes)], headers, index_interval_bytes)
    }

    /// [`Segment::append`] of batches held in several buffers (`parts`, in
    /// order; emptied as they are written): one `pwritev` where the kernel
    /// takes them all at once.
    pub fn append_vectored(
        &mut self,
        parts: &mut [IoSlice<'_>],
        headers: &[(BatchHeader, u64)],
        index_interval_bytes: u32,
    ) -> Result<(), LogError> {
        self.write_vectored(parts, headers, index_interval_bytes)?;
        self.cache.reset(self.size);
        Ok(())
    }

    /// [`Segment::append_vectored`] of `pieces`; with `keep` (a leader's
    /// append), the segment's [`Segment::cache`] keeps a copy of them (as many
    /// of the newest as it may).
    pub fn append_pieces(
        &mut self,
        pieces: &[&[u8]],
        headers: &[(BatchHeader, u64)],
        index_interval_bytes: u32,
        keep: bool,
        now_ms: TimestampMs,
    ) -> Result<(), LogError> {
        let at = self.size;
        let mut parts: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
        let written = self.write_vectored(&mut parts, headers, index_interval_bytes);
        if keep && written.is_ok() {
            self.cache.appended(at, pieces, now_ms);
        } else {
            self.cache.reset(self.size);
        }
        written
    }

    fn write_vectored(
        &mut self,
        parts: &mut [IoSlice<'_>],
        headers: &[(BatchHeader, u64)],
        index_interval_bytes: u32,
    ) -> Result<(), LogError> {
        let at = self.size;
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        assert!(
            at + len <= u32::MAX as u64,
            "segment positions must fit u32"
        );
        if let Err(e) = write_all_vectored_at(&self.file, parts, at) {
            // A short write (a full disk) leaves part of a batch past the end:
            // cut it, so the segment never holds it when it is rolled and
            // later trusted by recovery (the next append would overwrite it,
            // a roll would not).
            let _ = self.file.set_len(at);
            return Err(io_context(|| {
                format!("appending {len} bytes to {} at {at}", self.path.display())
            })(e));
        }
        self.size += len;
        for (h, rel_pos) in headers {
            self.note_batch(h, at + rel_pos, index_interval_bytes);
        }
        Ok(())
    }

    /// fsyncs the log file and writes pending index entries (not fsynced).
    pub fn flush(&mut self) -> Result<(), LogError> {
        self.offset_index.write_pending()?;
        self.time_index.write_pending()?;
        self.sync_data()
    }

    /// Seals and fsyncs the log file and both indexes (on roll and close).
    pub fn flush_sealed(&mut self) -> Result<(), LogError> {
        self.seal_time_index();
        self.offset_index.sync()?;
        self.time_index.sync()?;
        self.sync_data()
    }

    /// fsyncs the data of the `.log` file and notes its length as synced.
    pub fn sync_data(&mut self) -> Result<(), LogError> {
        self.file.sync_data().map_err(io_context(|| {
            format!("fsyncing segment {}", self.path.display())
        }))?;
        self.synced_len = self.size;
        Ok(())
    }

    /// Reads and parses the batch header at `position` (which must be below `limit`).
    pub fn header_at(&self, position: u64, limit: u64) -> Result<BatchHeader, LogError> {
        let mut buf = [0u8; BATCH_HEADER_LEN];
        let corrupt = |reason: String| LogError::Corrupt {
            path: self.path.clone(),
            position,
            reason,
        };
        if position + BATCH_HEADER_LEN as u64 > limit {
            return Err(corrupt(format!(
                "partial batch header: segment ends at {limit}"
            )));
        }
        self.file
            .read_exact_at(&mut buf, position)
            .map_err(io_context(|| {
                format!(
                    "reading batch header of {} at {position}",
                    self.path.display()
                )
            }))?;
        let h = BatchHeader::parse(&buf).map_err(|e| corrupt(e.to_string()))?;
        if position + h.total_size() as u64 > limit {
            return Err(corrupt(format!(
                "batch of {} bytes runs past the segment end {limit}",
                h.total_size()
            )));
        }
        Ok(h)
    }

    /// Position to start a header scan for `target`: the offset index floor entry.
    pub fn index_position(&self, target: Offset) -> u64 {
        if target <= self.base_offset {
            return 0;
        }
        let rel = (target.0 - self.base_offset.0).min(u32::MAX as i64) as u32;
        self.offset_index
            .floor_by_offset(rel)
            .map_or(0, |e| e.position as u64)
    }

    /// The first batch (position, header) whose last offset is >= `target`, scanning
    /// headers from the index floor, within `[0, limit)`.
    pub fn find_batch(
        &self,
        target: Offset,
        limit: u64,
    ) -> Result<Option<(u64, BatchHeader)>, LogError> {
        let mut pos = self.index_position(target);
        while pos < limit {
            let h = self.header_at(pos, limit)?;
            if h.last_offset() >= target {
                return Ok(Some((pos, h)));
            }
            pos += h.total_size() as u64;
        }
        Ok(None)
    }

    /// Re-derives next offset, max timestamp, last batch and bytes since the last index
    /// entry by scanning headers from the last offset-index entry to the end. Used for
    /// trusted (non-active) segments on open and after truncation.
    pub fn recompute_tail(&mut self) -> Result<(), LogError> {
        let (start_pos, start_next) = match self.offset_index.last() {
            Some(e) => (
                e.position as u64,
                self.base_offset.plus(e.relative_offset as i64),
            ),
            None => (0, self.base_offset),
        };
        self.max_timestamp = self.time_index.last().map_or(i64::MIN, |e| e.timestamp_ms);
        self.next_offset = start_next;
        self.last_batch_base = None;
        // The batch at the last index entry starts the running byte count (as when
        // it was indexed); with no entry the count starts at the segment start.
        self.bytes_since_index = 0;
        let path = self.path.clone();
        let file = Arc::clone(&self.file);
        let mut reader = ChunkReader::new(&file, &path, self.size, TAIL_SCAN_CHUNK_BYTES);
        let (end, stop) = scan_batches(&mut reader, start_pos, start_next, false, |_, h, _| {
            self.bytes_since_index += h.total_size() as u64;
            self.max_timestamp = self.max_timestamp.max(h.max_timestamp);
            self.last_batch_base = Some(h.base_offset);
            self.next_offset = h.next_offset();
            Ok(())
        })?;
        if let ScanStop::Bad { position, reason } = stop {
            return Err(LogError::Corrupt {
                path,
                position,
                reason,
            });
        }
        debug_assert_eq!(end, self.size);
        if self.last_batch_base.is_none() && start_pos > 0 {
            return Err(LogError::Corrupt {
                path: self.path.clone(),
                position: start_pos,
                reason: "offset index points at no batch".into(),
            });
        }
        Ok(())
    }

    /// Cuts the segment at `position` (a batch boundary) whose first removed batch
    /// starts at `cut_offset`, fsyncs, and re-derives the tail state.
    pub fn truncate_at(&mut self, position: u64, cut_offset: Offset) -> Result<(), LogError> {
        self.cache.reset(position);
        self.file.set_len(position).map_err(io_context(|| {
            format!("truncating {} to {position}", self.path.display())
        }))?;
        self.file
            .sync_all()
            .map_err(io_context(|| format!("fsyncing {}", self.path.display())))?;
        self.size = position;
        self.synced_len = position;
        self.offset_index
            .truncate_where(|e| e.position as u64 >= position);
        let cut_rel = (cut_offset.0 - self.base_offset.0).max(0);
        self.time_index
            .truncate_where(|e| e.relative_offset as i64 >= cut_rel);
        self.recompute_tail()
    }

    /// Deletes the segment's three files (log first, so a crash leaves at worst
    /// orphan indexes, which recovery deletes).
    pub fn delete_files(&mut self) -> Result<(), LogError> {
        self.offset_index.release();
        self.time_index.release();
        for p in [
            self.path.clone(),
            self.offset_index.path().to_path_buf(),
            self.time_index.path().to_path_buf(),
        ] {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_context(|| format!("deleting {}", p.display()))(e)),
            }
        }
        Ok(())
    }
}

/// Reads a file sequentially in large chunks, handing out byte ranges.
#[derive(Debug)]
pub struct ChunkReader<'a> {
    file: &'a File,
    path: &'a Path,
    file_len: u64,
    chunk: usize,
    buf: Vec<u8>,
    buf_start: u64,
}

impl<'a> ChunkReader<'a> {
    pub fn new(file: &'a File, path: &'a Path, file_len: u64, chunk: usize) -> Self {
        ChunkReader {
            file,
            path,
            file_len,
            chunk,
            buf: Vec::new(),
            buf_start: 0,
        }
    }

    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    pub fn path(&self) -> &Path {
        self.path
    }

    /// The bytes `[pos, pos + len)`; the range must lie within the file.
    pub fn get(&mut self, pos: u64, len: usize) -> Result<&[u8], LogError> {
        debug_assert!(pos + len as u64 <= self.file_len);
        let have =
            pos >= self.buf_start && pos + len as u64 <= self.buf_start + self.buf.len() as u64;
        if !have {
            let want = (len.max(self.chunk) as u64).min(self.file_len - pos) as usize;
            self.buf.resize(want, 0);
            self.file
                .read_exact_at(&mut self.buf, pos)
                .map_err(io_context(|| {
                    format!("reading {} at {pos}", self.path.display())
                }))?;
            self.buf_start = pos;
        }
        let from = (pos - self.buf_start) as usize;
        Ok(&self.buf[from..from + len])
    }
}

/// Why a scan stopped before the end of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanStop {
    End,
    Bad { position: u64, reason: String },
}

/// Walks the batches from `start` to the end of the file, checking each header,
/// that offsets increase (from `min_next`), and with `verify_crc` each CRC, calling
/// `f(position, header, batch bytes)` (the bytes are only the header when not
/// verifying). Returns the end of the last good batch and why it stopped.
pub fn scan_batches(
    reader: &mut ChunkReader<'_>,
    start: u64,
    min_next: Offset,
    verify_crc: bool,
    mut f: impl FnMut(u64, &BatchHeader, &[u8]) -> Result<(), LogError>,
) -> Result<(u64, ScanStop), LogError> {
    let len = reader.file_len();
    let mut pos = start;
    let mut next = min_next;
    while pos < len {
        let bad = |reason: String| {
            Ok((
                pos,
                ScanStop::Bad {
                    position: pos,
                    reason,
                },
            ))
        };
        if len - pos < BATCH_HEADER_LEN as u64 {
            return bad(format!(
                "partial batch header: only {} bytes before the end of the file",
                len - pos
            ));
        }
        let header = match BatchHeader::parse(reader.get(pos, BATCH_HEADER_LEN)?) {
            Ok(h) => h,
            Err(e) => return bad(format!("unreadable batch header: {e}")),
        };
        let size = header.total_size() as u64;
        if pos + size > len {
            return bad(format!(
                "batch of {size} bytes runs past the end of the file at {len}"
            ));
        }
        if header.base_offset < next {
            return bad(format!(
                "batch base offset {} is below the expected {next}",
                header.base_offset
            ));
        }
        let bytes = if verify_crc {
            let bytes = reader.get(pos, size as usize)?;
            let view = match BatchView::new(bytes) {
                Ok(v) => v,
                Err(e) => return bad(format!("unreadable batch: {e}")),
            };
            if let Err(e) = view.verify_crc() {
                return bad(format!("batch at offset {}: {e}", header.base_offset));
            }
            bytes
        } else {
            reader.get(pos, BATCH_HEADER_LEN)?
        };
        f(pos, &header, bytes)?;
        next = header.next_offset();
        pos += size;
    }
    Ok((pos, ScanStop::End))
}

/// Most buffers one `pwritev` takes (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// Writes all of `parts`, in order, at `at` in `file` (`pwritev`, repeated
/// after a short write or for more than [`IOV_MAX`] buffers).
fn write_all_vectored_at(
    file: &File,
    mut parts: &mut [IoSlice<'_>],
    mut at: u64,
) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut parts, 0);
    while !parts.is_empty() {
        let n = parts.len().min(IOV_MAX);
        match rustix::io::pwritev(file, &parts[..n], at) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    "failed to write whole buffer",
                ));
            }
            Ok(written) => {
                at += written as u64;
                IoSlice::advance_slices(&mut parts, written);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let d = Path::new("/x");
        let p = segment_path(d, Offset(42), LOG_SUFFIX);
        assert_eq!(p, Path::new("/x/00000000000000000042.log"));
        assert_eq!(
            parse_segment_name("00000000000000000042.log"),
            Some(Offset(42))
        );
        assert_eq!(parse_segment_name("42.log"), None);
        assert_eq!(parse_segment_name("00000000000000000042.index"), None);
        assert_eq!(parse_segment_name("0000000000000000004x.log"), None);
    }
}
