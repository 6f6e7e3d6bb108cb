//! Compaction ("log cleaning"): keep at least the latest record of every key in the
//! non-active segments, keep offsets, drop expired tombstones.
//!
//! When: `cleanup.policy` includes `compact` and dirty bytes / non-active bytes >=
//! `min.cleanable.dirty.ratio`, where the dirty part is the segments holding
//! offsets at or after the cleaner checkpoint.
//!
//! How: pass 1 decodes the dirty segments and maps each key to its latest offset
//! (bounded by [`OFFSET_MAP_BYTES_MAX`]; when reached, this run cleans only up to that
//! segment). Pass 2 rewrites every non-active segment up to the end of the mapped
//! part, one output segment per input segment with the same base offset:
//!
//! * a keyed record is kept if no later record of its key is in the map;
//! * a tombstone that is the latest of its key is dropped once its record timestamp
//!   is older than `now - delete.retention.ms` (choice: measured from the record
//!   timestamp, not from when the segment was cleaned — deterministic and survives
//!   restarts with no extra state; a producer-set old timestamp shortens the grace);
//! * records without a key are kept (Kafka rejects them at produce time for
//!   compacted topics; the log does not police that);
//! * transactions, as Kafka's cleaner treats them: only segments wholly below
//!   the first unstable offset are cleaned (an open transaction's records wait
//!   for its marker); a batch of an aborted transaction (the aborted index) is
//!   dropped and its keys never enter the map, so an aborted write never hides
//!   a committed one; a committed transaction's records are compacted like any
//!   others (a partly kept batch stays transactional); a marker is kept while
//!   any record of its transaction is, then until its timestamp is older than
//!   `delete.retention.ms` (so a reader that saw the records also sees the
//!   marker), then dropped. A dropped marker takes nothing a reader needs: its
//!   transaction's records are gone, and a reopen finds no open transaction;
//! * a segment from which nothing is dropped keeps its files (the copy is discarded);
//! * a batch whose records all stay is copied byte for byte; a partly kept batch is
//!   re-encoded with `BatchBuilder::push_with_offset_delta` + `build_spanning`, so
//!   its base and last offsets, epoch, producer fields and compression stay; an
//!   emptied batch is dropped. An emptied segment other than the first is deleted.
//!
//! The active segment is never touched, so the log end offset does not move.
//!
//! Locking (the caller's): a run is planned ([`Log::plan_compaction`], cheap),
//! cleaned ([`CompactionRun::clean`]: both passes, all the reading and writing,
//! without the log) and swapped in ([`Log::finish_compaction`]), so a caller
//! that serializes access to the log need hold it only for the first and the
//! last step. The swap happens only if the cleaned segments are still the
//! log's first ones, unchanged; otherwise the copies are deleted.
//!
//! Crash safety: the output is written to `<base>.log.<run>.cleaned` (+
//! `.index.<run>.cleaned`, `.timeindex.<run>.cleaned`; `<run>` numbers the runs
//! of the process) and fsynced; then the old indexes are deleted (dir fsync),
//! the `.log.cleaned` is renamed over the `.log` (atomic; dir fsync) and the indexes
//! renamed into place. A crash at any point leaves the old or the new segment whole;
//! recovery deletes `*.cleaned` leftovers and rebuilds missing indexes.
//!
//! The cleaner checkpoint `cleaner-offset-checkpoint` (checkpoint format version 0,
//! one entry `0 <first dirty offset>`) records progress.

use crate::checkpoint::{self, fsync_dir};
use crate::error::{LogError, io_context};
use crate::log::Log;
use crate::segment::{
    CLEANED_SUFFIX, ChunkReader, INDEX_SUFFIX, LOG_SUFFIX, SCAN_CHUNK_BYTES, ScanStop, Segment,
    TIME_INDEX_SUFFIX, scan_batches, segment_path,
};
use crate::txn::AbortedTxn;
use bytes::Bytes;
use rill_proto::batch::{BatchHeader, BatchView};
use rill_proto::{BatchBuilder, Offset, Record, StoredRecord, TimestampMs};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tracing::info;

/// File name of the cleaner checkpoint.
pub const CLEANER_CHECKPOINT: &str = "cleaner-offset-checkpoint";
/// Bound on the memory of the key -> latest offset map of one cleaning run.
pub const OFFSET_MAP_BYTES_MAX: usize = 64 << 20;
/// Approximate per-entry overhead of the offset map, for the bound.
const OFFSET_MAP_ENTRY_OVERHEAD: usize = 48;
/// Output is written in chunks of this size.
const CLEANER_WRITE_CHUNK_BYTES: usize = 1 << 20;
/// Numbers compaction runs within the process: each run names its copies
/// `<base>.log.<run>.cleaned`, so a run still going on a log closed meanwhile
/// never writes to or deletes the copies of a run on the log opened again
/// on the same directory.
static RUNS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn read_cleaner_checkpoint(dir: &Path) -> Result<Option<Offset>, LogError> {
    Ok(checkpoint::read_checkpoint(&dir.join(CLEANER_CHECKPOINT))?
        .and_then(|e| e.first().map(|&(_, o)| Offset(o))))
}

fn corrupt(path: &Path, position: u64, reason: impl Into<String>) -> LogError {
    LogError::Corrupt {
        path: path.to_path_buf(),
        position,
        reason: reason.into(),
    }
}

/// A sealed segment as a compaction run reads it, without the log's lock: its
/// file stays open and readable even if the log drops or replaces the segment
/// meanwhile.
#[derive(Debug, Clone)]
struct Sealed {
    base_offset: Offset,
    path: PathBuf,
    file: Arc<File>,
    size: u64,
}

impl Sealed {
    fn of(seg: &Segment) -> Sealed {
        Sealed {
            base_offset: seg.base_offset,
            path: seg.path.clone(),
            file: seg.file.clone(),
            size: seg.size,
        }
    }

    /// Whether `seg` is still this segment, as it was read: the same open
    /// file, with nothing cut from or added to it.
    fn is(&self, seg: &Segment) -> bool {
        self.base_offset == seg.base_offset
            && Arc::ptr_eq(&self.file, &seg.file)
            && self.size == seg.size
    }
}

/// Calls `f(position, header, records or None for kept-whole batches, raw bytes)`
/// for every batch of `seg`, CRC-checked. Control batches (markers) are not
/// decoded.
fn for_each_batch(
    seg: &Sealed,
    decode: bool,
    mut f: impl FnMut(&BatchHeader, Option<Vec<StoredRecord>>, &[u8]) -> Result<(), LogError>,
) -> Result<(), LogError> {
    let mut reader = ChunkReader::new(&seg.file, &seg.path, seg.size, SCAN_CHUNK_BYTES);
    let (_, stop) = scan_batches(&mut reader, 0, seg.base_offset, true, |pos, h, bytes| {
        let records = if decode && !h.is_control() {
            let view = BatchView::new(bytes).map_err(|e| corrupt(&seg.path, pos, e.to_string()))?;
            // The scan checked the CRC; records that still do not decode came so
            // from their producer. Keep such a batch whole rather than stop
            // compacting the partition for good.
            match view.records() {
                Ok(records) => Some(records),
                Err(e) => {
                    tracing::warn!(
                        segment = %seg.path.display(),
                        position = pos,
                        error = %e,
                        "compaction keeps a batch whole: its records do not decode"
                    );
                    None
                }
            }
        } else {
            None
        };
        f(h, records, bytes)
    })?;
    if let ScanStop::Bad { position, reason } = stop {
        return Err(corrupt(&seg.path, position, reason));
    }
    Ok(())
}

/// One compaction run, planned under the log's lock by
/// [`Log::plan_compaction`]. [`CompactionRun::clean`] then reads the sealed
/// segments and writes their cleaned copies without the log (the bulk of the
/// work: every byte read, the kept ones written and fsynced), and
/// [`Log::finish_compaction`] swaps the copies in under the lock again, as
/// Kafka's cleaner locks the log only to replace segments. Meanwhile the log
/// takes appends and reads; the active segment is never cleaned.
#[derive(Debug)]
pub struct CompactionRun {
    dir: PathBuf,
    /// The segments that may be cleaned, then the one after the last of them.
    segments: Vec<Sealed>,
    first_dirty: usize,
    aborted: AbortedBatches,
    tombstone_horizon: TimestampMs,
    interval: u32,
    now_ms: TimestampMs,
    /// What this run's copies end with (see [`RUNS`]).
    suffix: String,
    _running: Running,
}

/// A [`CompactionRun::clean`] that failed: the error, and what the run had
/// planned, so the caller can tell whether the log changed under it
/// ([`Log::changed_since`]): a truncation can cut a segment the run is
/// reading, which then reads as damaged.
#[derive(Debug)]
pub struct CleanFailed {
    pub error: LogError,
    segments: Vec<Sealed>,
}

/// The cleaned copies of a [`CompactionRun`], to hand to
/// [`Log::finish_compaction`]. Copies not swapped in are deleted on drop.
#[derive(Debug)]
pub struct CleanedSegments {
    dir: PathBuf,
    /// The segments cleaned, then the one at `clean_end`.
    segments: Vec<Sealed>,
    /// Per cleaned segment: its copy, if anything was dropped from it.
    copies: Vec<Option<Segment>>,
    clean_end: Offset,
    keys: usize,
    _running: Running,
}

/// Marks a log as having a compaction run under way, until dropped.
#[derive(Debug)]
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Drop for CleanedSegments {
    fn drop(&mut self) {
        for copy in self.copies.iter_mut().filter_map(Option::take) {
            let mut copy = copy;
            if let Err(e) = copy.delete_files() {
                tracing::warn!(error = %e, "could not delete an unused cleaned segment (the next open deletes it)");
            }
        }
    }
}

impl Log {
    /// Compacts the non-active segments if the dirty ratio calls for it:
    /// [`Log::plan_compaction`], [`CompactionRun::clean`] and
    /// [`Log::finish_compaction`] in one call, holding the log throughout.
    /// Returns whether it ran.
    pub fn compact(&mut self, now_ms: TimestampMs) -> Result<bool, LogError> {
        match self.plan_compaction(now_ms) {
            Some(run) => {
                let cleaned = run.clean().map_err(|f| f.error)?;
                self.finish_compaction(cleaned)
            }
            None => Ok(false),
        }
    }

    /// A compaction run if the dirty ratio calls for one (and none is under
    /// way). Cheap: it reads no segment.
    pub fn plan_compaction(&self, now_ms: TimestampMs) -> Option<CompactionRun> {
        let config = self.config();
        if !config.cleanup_policy.compact || self.segments.len() < 2 {
            return None;
        }
        // Only segments wholly below the first unstable offset: an open
        // transaction's records are neither committed nor aborted yet.
        let stable = self.txns.first_unstable_offset();
        let n = (0..self.segments.len() - 1)
            .take_while(|&i| stable.is_none_or(|s| self.segments[i + 1].base_offset <= s))
            .count();
        if n == 0 {
            return None;
        }
        let checkpoint = self.cleaner_checkpoint;
        // Segment i is dirty if it can hold offsets >= the checkpoint.
        let first_dirty = (0..n)
            .find(|&i| self.segments[i + 1].base_offset > checkpoint)
            .unwrap_or(n);
        let total: u64 = self.segments[..n].iter().map(|s| s.size).sum();
        let dirty: u64 = self.segments[first_dirty..n].iter().map(|s| s.size).sum();
        if dirty == 0
            || total == 0
            || (dirty as f64 / total as f64) < config.min_cleanable_dirty_ratio
        {
            return None;
        }
        if self.compacting.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(CompactionRun {
            dir: self.dir().to_path_buf(),
            segments: self.segments[..=n].iter().map(Sealed::of).collect(),
            first_dirty,
            aborted: AbortedBatches::new(self.txns.aborted()),
            tombstone_horizon: now_ms
                .saturating_sub(config.delete_retention_ms.min(i64::MAX as u64) as i64),
            interval: config.index_interval_bytes,
            now_ms,
            suffix: format!(".{}{CLEANED_SUFFIX}", RUNS.fetch_add(1, Ordering::Relaxed)),
            _running: Running(self.compacting.clone()),
        })
    }

    /// Whether the segments a failed run read are no longer the log's
    /// first ones as they were (the failure may come from that change).
    pub fn changed_since(&self, failed: &CleanFailed) -> bool {
        !self.still_first(&failed.segments[..failed.segments.len() - 1])
    }

    /// Whether `sealed` are still the log's first segments, unchanged, and
    /// another segment follows them.
    fn still_first(&self, sealed: &[Sealed]) -> bool {
        self.segments.len() > sealed.len()
            && sealed.iter().zip(&self.segments).all(|(s, seg)| s.is(seg))
    }

    /// Swaps in the copies of a run, if the segments it cleaned are still the
    /// log's first ones, unchanged; else drops the copies (a retention pass, a
    /// truncation or a restart changed them meanwhile; a later run cleans
    /// again). Returns whether the copies were swapped in.
    pub fn finish_compaction(&mut self, mut cleaned: CleanedSegments) -> Result<bool, LogError> {
        let end = cleaned.copies.len();
        let boundary = &cleaned.segments[end];
        let same = self.still_first(&cleaned.segments[..end])
            && boundary.base_offset == self.segments[end].base_offset
            && Arc::ptr_eq(&boundary.file, &self.segments[end].file);
        if !same {
            info!(dir = %cleaned.dir.display(), "compaction dropped: the log's segments changed while it ran");
            return Ok(false);
        }
        let dir = cleaned.dir.clone();
        let old: Vec<Segment> = self.segments.drain(..end).collect();
        let copies = std::mem::take(&mut cleaned.copies);
        let swapped = swap_in(&dir, old.into_iter().zip(copies).collect());
        // (Copies not swapped in are deleted.)
        cleaned.copies = swapped.unused;
        let mut kept = swapped.kept;
        kept.append(&mut self.segments);
        self.segments = kept;
        swapped.result?;
        let clean_end = cleaned.clean_end;
        self.cleaner_checkpoint = clean_end;
        checkpoint::write_checkpoint(&dir, CLEANER_CHECKPOINT, &[(0, clean_end.0)])?;
        info!(dir = %dir.display(), %clean_end, keys = cleaned.keys, "compacted log");
        Ok(true)
    }
}

impl CompactionRun {
    /// Maps each key of the dirty segments to its latest offset (bounded by
    /// [`OFFSET_MAP_BYTES_MAX`]), then writes a cleaned copy of every segment
    /// up to the end of the mapped part. Needs no lock of the log.
    pub fn clean(self) -> Result<CleanedSegments, CleanFailed> {
        let planned = self.segments.clone();
        self.clean_inner().map_err(|error| CleanFailed {
            error,
            segments: planned,
        })
    }

    fn clean_inner(self) -> Result<CleanedSegments, LogError> {
        let CompactionRun {
            dir,
            mut segments,
            first_dirty,
            aborted,
            tombstone_horizon,
            interval,
            now_ms,
            suffix,
            _running,
        } = self;
        let n = segments.len() - 1;
        // Pass 1: key -> latest offset over the dirty segments, bounded.
        let mut map: HashMap<Bytes, Offset> = HashMap::new();
        let mut map_bytes = 0usize;
        let mut end = first_dirty;
        while end < n {
            for_each_batch(&segments[end], true, |h, records, _| {
                if aborted.contains(h) {
                    return Ok(());
                }
                for r in records.into_iter().flatten() {
                    if let Some(k) = r.key {
                        let len = k.len();
                        if map.insert(k, r.offset).is_none() {
                            map_bytes += len + OFFSET_MAP_ENTRY_OVERHEAD;
                        }
                    }
                }
                Ok(())
            })?;
            end += 1;
            if map_bytes >= OFFSET_MAP_BYTES_MAX {
                break;
            }
        }
        segments.truncate(end + 1);
        let clean_end = segments[end].base_offset;

        // Pass 2: a cleaned copy of segments [0, end).
        let mut cleaned = CleanedSegments {
            dir,
            segments,
            copies: Vec::with_capacity(end),
            clean_end,
            keys: map.len(),
            _running,
        };
        let mut txns = TxnCleaning {
            aborted: &aborted,
            kept_data: HashMap::new(),
        };
        let cleaning = Cleaning {
            map: &map,
            tombstone_horizon,
            interval,
            now_ms,
        };
        for i in 0..end {
            let (mut copy, changed) = clean_segment(
                &cleaned.dir,
                &cleaned.segments[i],
                &suffix,
                &cleaning,
                &mut txns,
            )?;
            if changed {
                cleaned.copies.push(Some(copy));
            } else {
                // Nothing to drop: the old files stay, the copy goes.
                copy.delete_files()?;
                cleaned.copies.push(None);
            }
        }
        Ok(cleaned)
    }
}

/// The batches of aborted transactions: producer id -> (first offset, marker
/// offset) of each of its aborted transactions.
#[derive(Debug)]
struct AbortedBatches(HashMap<i64, Vec<(Offset, Offset)>>);

impl AbortedBatches {
    fn new(aborted: &[AbortedTxn]) -> AbortedBatches {
        let mut map: HashMap<i64, Vec<(Offset, Offset)>> = HashMap::new();
        for a in aborted {
            map.entry(a.producer_id)
                .or_default()
                .push((a.first_offset, a.last_offset));
        }
        AbortedBatches(map)
    }

    /// Whether `h` is a data batch of an aborted transaction.
    fn contains(&self, h: &BatchHeader) -> bool {
        h.is_transactional()
            && !h.is_control()
            && self.0.get(&h.producer_id.0).is_some_and(|ranges| {
                ranges
                    .iter()
                    .any(|&(first, last)| first <= h.base_offset && h.base_offset <= last)
            })
    }
}

/// What one cleaning run keeps: the latest offset of each key, and the bounds.
struct Cleaning<'a> {
    map: &'a HashMap<Bytes, Offset>,
    tombstone_horizon: TimestampMs,
    interval: u32,
    now_ms: TimestampMs,
}

/// Transactions across the segments of one run, in offset order.
struct TxnCleaning<'a> {
    aborted: &'a AbortedBatches,
    /// Producer id -> whether a record of its current transaction is kept.
    kept_data: HashMap<i64, bool>,
}

impl TxnCleaning<'_> {
    /// Whether the marker `h` is kept: while a record of its transaction is,
    /// and until it is older than the tombstone horizon.
    fn keep_marker(&mut self, h: &BatchHeader, tombstone_horizon: TimestampMs) -> bool {
        let kept_data = self.kept_data.remove(&h.producer_id.0).unwrap_or(false);
        kept_data || h.max_timestamp >= tombstone_horizon
    }

    fn kept(&mut self, h: &BatchHeader) {
        if h.is_transactional() && !h.is_control() {
            self.kept_data.insert(h.producer_id.0, true);
        }
    }
}

/// Writes the cleaned copy of `seg` as `<base>.*<suffix>`, fsynced; also says
/// whether anything was dropped.
fn clean_segment(
    dir: &Path,
    seg: &Sealed,
    suffix: &str,
    c: &Cleaning<'_>,
    txns: &mut TxnCleaning<'_>,
) -> Result<(Segment, bool), LogError> {
    let mut out = Segment::create_with_suffix(dir, seg.base_offset, suffix, c.now_ms)?;
    match write_cleaned(seg, c, txns, &mut out) {
        Ok(changed) => Ok((out, changed)),
        Err(e) => {
            if let Err(d) = out.delete_files() {
                tracing::warn!(error = %d, "could not delete a partly written cleaned segment (the next open deletes it)");
            }
            Err(e)
        }
    }
}

/// Writes the batches of `seg` that stay into `out`, fsynced; returns
/// whether anything was dropped.
fn write_cleaned(
    seg: &Sealed,
    c: &Cleaning<'_>,
    txns: &mut TxnCleaning<'_>,
    out: &mut Segment,
) -> Result<bool, LogError> {
    let (map, tombstone_horizon, interval) = (c.map, c.tombstone_horizon, c.interval);
    let mut changed = false;
    let mut buf: Vec<u8> = Vec::with_capacity(CLEANER_WRITE_CHUNK_BYTES);
    let mut headers: Vec<(BatchHeader, u64)> = Vec::new();
    let mut push =
        |out: &mut Segment, bytes: &[u8], h: BatchHeader, force: bool| -> Result<(), LogError> {
            if !bytes.is_empty() {
                headers.push((h, buf.len() as u64));
                buf.extend_from_slice(bytes);
            }
            if (force || buf.len() >= CLEANER_WRITE_CHUNK_BYTES) && !buf.is_empty() {
                out.append(&buf, &headers, interval)?;
                buf.clear();
                headers.clear();
            }
            Ok(())
        };
    let mut last_header = None;
    for_each_batch(seg, true, |h, records, bytes| {
        last_header = Some(*h);
        if h.is_control() {
            if h.is_transactional() && !txns.keep_marker(h, tombstone_horizon) {
                changed = true;
                return Ok(());
            }
            return push(out, bytes, *h, false);
        }
        if txns.aborted.contains(h) {
            changed = true;
            return Ok(());
        }
        let Some(records) = records else {
            txns.kept(h);
            return push(out, bytes, *h, false);
        };
        let keep = |r: &StoredRecord| match &r.key {
            None => true,
            Some(k) => {
                let latest = map.get(k).is_none_or(|&o| o <= r.offset);
                latest && !(r.is_tombstone() && r.timestamp_ms < tombstone_horizon)
            }
        };
        let kept: Vec<&StoredRecord> = records.iter().filter(|r| keep(r)).collect();
        if kept.len() == records.len() {
            txns.kept(h);
            return push(out, bytes, *h, false);
        }
        changed = true;
        if kept.is_empty() {
            return Ok(());
        }
        txns.kept(h);
        let compression = h
            .compression()
            .map_err(|e| corrupt(&seg.path, 0, e.to_string()))?;
        let mut b = BatchBuilder::new(compression).producer(
            h.producer_id,
            h.producer_epoch,
            h.base_sequence,
        );
        if h.is_transactional() {
            b = b.transactional();
        }
        for r in kept {
            let delta = (r.offset.0 - h.base_offset.0) as i32;
            b.push_with_offset_delta(
                delta,
                &Record {
                    key: r.key.clone(),
                    value: r.value.clone(),
                    headers: r.headers.clone(),
                    timestamp_ms: r.timestamp_ms,
                },
            );
        }
        let rebuilt = b.build_spanning(h.base_offset, h.leader_epoch, h.last_offset_delta);
        let nh = BatchHeader::parse(&rebuilt)?;
        assert_eq!(
            (nh.base_offset, nh.last_offset()),
            (h.base_offset, h.last_offset()),
            "a cleaned batch keeps its offset range"
        );
        push(out, &rebuilt, nh, false)
    })?;
    if let Some(h) = last_header {
        push(out, &[], h, true)?;
    }
    out.flush_sealed()?;
    Ok(changed)
}

fn remove_if_exists(p: &Path) -> Result<(), LogError> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_context(|| format!("deleting {}", p.display()))(e)),
    }
}

fn rename(from: &Path, to: &Path) -> Result<(), LogError> {
    std::fs::rename(from, to).map_err(io_context(|| {
        format!("renaming {} to {}", from.display(), to.display())
    }))
}

/// Whether the copy of the `i`th cleaned segment takes the old one's place;
/// else both are deleted (the copy is empty, and the log keeps its first
/// segment even so).
fn replaces(i: usize, copy: &Segment) -> bool {
    i == 0 || !copy.is_empty()
}

/// What [`swap_in`] did.
struct Swapped {
    /// The log's new first segments, in order.
    kept: Vec<Segment>,
    /// Copies that were not swapped in (to be deleted).
    unused: Vec<Option<Segment>>,
    result: Result<(), LogError>,
}

/// Replaces each old segment that has a copy by the copy on disk, in three
/// steps with one directory fsync each, but the second step's one per segment
/// (see the module doc for why that order). A copy that is empty and not the
/// first is not swapped in: both it and the old segment are deleted. On an
/// error, the segments not yet replaced stay as they were.
fn swap_in(dir: &Path, mut pairs: Vec<(Segment, Option<Segment>)>) -> Swapped {
    let mut kept = Vec::with_capacity(pairs.len());
    let mut unused = Vec::new();
    // Step 1: the indexes of every segment to be replaced go (a missing index
    // is rebuilt on open).
    let step1 = (|| {
        let mut removed = false;
        for (i, (old, copy)) in pairs.iter_mut().enumerate() {
            if copy.as_ref().is_some_and(|c| replaces(i, c)) {
                old.offset_index.release();
                old.time_index.release();
                remove_if_exists(old.offset_index.path())?;
                remove_if_exists(old.time_index.path())?;
                removed = true;
            }
        }
        if removed { fsync_dir(dir) } else { Ok(()) }
    })();
    if let Err(e) = step1 {
        for (old, copy) in pairs {
            kept.push(old);
            unused.push(copy);
        }
        return Swapped {
            kept,
            unused,
            result: Err(e),
        };
    }
    // Step 2, in order, each durable before the next: a later copy may have
    // dropped a tombstone or a marker whose older records an earlier copy
    // dropped, so it must never be on disk before that earlier copy.
    let mut result = Ok(());
    let mut renamed = Vec::new();
    let mut pairs = pairs.into_iter().enumerate();
    for (i, (mut old, copy)) in pairs.by_ref() {
        let Some(mut copy) = copy else {
            kept.push(old);
            continue;
        };
        if !replaces(i, &copy) {
            let deleted = copy
                .delete_files()
                .and_then(|()| old.delete_files())
                .and_then(|()| fsync_dir(dir));
            if let Err(e) = deleted {
                kept.push(old);
                result = Err(e);
                break;
            }
            continue;
        }
        let final_log = segment_path(dir, old.base_offset, LOG_SUFFIX);
        if let Err(e) = rename(&copy.path, &final_log) {
            kept.push(old);
            unused.push(Some(copy));
            result = Err(e);
            break;
        }
        copy.path = final_log;
        copy.created_ms = old.created_ms;
        renamed.push(kept.len());
        kept.push(copy);
        if let Err(e) = fsync_dir(dir) {
            result = Err(e);
            break;
        }
    }
    for (_, (old, copy)) in pairs {
        kept.push(old);
        unused.push(copy);
    }
    // Step 3: the copies' indexes into place (after a crash before this, the
    // `.cleaned` indexes are deleted and the indexes rebuilt).
    let step3 = (|| {
        for &k in &renamed {
            let seg = &mut kept[k];
            let final_index = segment_path(dir, seg.base_offset, INDEX_SUFFIX);
            let final_time = segment_path(dir, seg.base_offset, TIME_INDEX_SUFFIX);
            seg.offset_index.release();
            seg.time_index.release();
            rename(seg.offset_index.path(), &final_index)?;
            seg.offset_index.set_path(final_index);
            rename(seg.time_index.path(), &final_time)?;
            seg.time_index.set_path(final_time);
        }
        if renamed.is_empty() {
            Ok(())
        } else {
            fsync_dir(dir)
        }
    })();
    Swapped {
        kept,
        unused,
        result: result.and(step3),
    }
}
