//! `Log`: one partition's log — the ordered segments of a directory, the
//! leader-epoch cache, the flush policy, and the append / read / truncate paths.
//!
//! Owns the segment list (never empty; the last segment is the active one, the only
//! one appended to) and the derived offsets: the log start offset is the first
//! segment's base offset (so retention survives a reopen with no extra file), the
//! log end offset is the active segment's next offset.
//!
//! Append validates each batch by header and CRC only (no record decoding), stamps
//! base offset and leader epoch in place, and writes with one `pwrite`; fsync
//! happens per the flush policy (default: on roll and close only). Read locates
//! the start batch by binary search in the offset index plus a short scan of
//! 61-byte headers, and returns a `FileSlice` the caller reads outside any lock.
//!
//! Truncation is batch-granular: `truncate_to(o)` removes every batch whose last
//! offset is >= o, and the log end offset becomes `min(o, base of the first removed
//! batch)`. If that leaves a gap after the last kept batch (possible only after
//! compaction), an empty segment is rolled at the new end so the end survives a
//! reopen.

use crate::checkpoint::{self, fsync_dir};
use crate::compaction::{CLEANER_CHECKPOINT, read_cleaner_checkpoint};
use crate::config::LogConfig;
use crate::epoch::LeaderEpochCache;
use crate::error::{LogError, io_context};
use crate::producer::{ProducerStates, SeqCheck};
use crate::recovery;
use crate::segment::{
    ChunkReader, RELATIVE_OFFSET_MAX, SCAN_CHUNK_BYTES, ScanStop, Segment, scan_batches,
};
use crate::txn::{AbortedTxn, TxnIndex, read_aborted};
use bytes::Bytes;
use rill_proto::batch::{
    BatchHeader, rope_batches, set_base_offset, set_leader_epoch, verify_crc_at,
};
use rill_proto::{DecodeError, LeaderEpoch, Offset, Rope, TimestampMs};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use tracing::info;

/// What an append wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub first_offset: Offset,
    pub last_offset: Offset,
    pub max_timestamp: TimestampMs,
    pub record_count: u64,
    pub bytes: u64,
    /// The batches were written before (an idempotent producer's retry): nothing
    /// was appended, and the offsets are where they were written.
    pub duplicate: bool,
}

/// A byte range of one segment file holding whole batches; read it outside any lock.
#[derive(Debug, Clone)]
pub struct FileSlice {
    pub file: Arc<File>,
    pub position: u64,
    pub len: u32,
    /// The part of the range the segment's tail cache holds ([`crate::tail`]):
    /// its position and bytes, which run to the end of the range.
    pub cached: Option<(u64, Rope)>,
}

impl FileSlice {
    /// The slice's bytes: what the tail cache holds as it is, the rest (or
    /// all) with one positional read into a reused buffer
    /// ([`crate::read_buffers`]).
    pub fn read_rope(&self) -> std::io::Result<Rope> {
        let from = self.position + self.uncached_len();
        let kept = self
            .cached
            .as_ref()
            .filter(|(at, _)| *at == from)
            .map(|(_, r)| r);
        let mut out = Rope::default();
        if from > self.position {
            out.push(crate::read_buffers::read_at(
                &self.file,
                self.position,
                (from - self.position) as usize,
            )?);
        }
        for piece in kept.into_iter().flat_map(Rope::pieces) {
            out.push(piece.clone());
        }
        Ok(out)
    }

    /// Bytes of the slice [`FileSlice::read_rope`] reads from the file (the
    /// rest the tail cache holds).
    pub fn uncached_len(&self) -> u64 {
        match &self.cached {
            Some((at, kept))
                if *at >= self.position
                    && *at + kept.len() as u64 == self.position + self.len as u64 =>
            {
                at - self.position
            }
            _ => self.len as u64,
        }
    }

    /// [`FileSlice::read_rope`] as one buffer (a copy when it is in pieces).
    pub fn read(&self) -> std::io::Result<Bytes> {
        Ok(self.read_rope()?.to_bytes())
    }
}

/// One partition's log.
#[derive(Debug)]
pub struct Log {
    dir: PathBuf,
    config: LogConfig,
    /// Ascending by base offset, never empty; the last one is active.
    pub(crate) segments: Vec<Segment>,
    pub(crate) epochs: LeaderEpochCache,
    /// Offset up to which compaction has cleaned (the first dirty offset).
    pub(crate) cleaner_checkpoint: Offset,
    unflushed_records: u64,
    first_unflushed_ms: Option<TimestampMs>,
    /// Flushes and rolls since open (each fsyncs the active segment's data).
    flush_count: u64,
    /// Idempotent producers seen in the local log (rebuilt on open and truncation).
    producers: ProducerStates,
    /// Open and aborted transactions (see [`crate::txn`]).
    pub(crate) txns: TxnIndex,
    /// Whether a compaction run is under way (see [`crate::compaction::CompactionRun`]).
    pub(crate) compacting: Arc<AtomicBool>,
}

/// A batch checked for append: its header and position within the input.
type Checked = Vec<(BatchHeader, u64)>;

/// The bytes of a batch's header an append may stamp: base offset, batch
/// length and partition leader epoch (before the CRC's range).
const STAMPED_LEN: usize = 16;

/// The first [`STAMPED_LEN`] bytes of the batch at `at` in `bytes`, with the
/// base offset and leader epoch of `h` stamped in.
fn stamped(bytes: &Rope, at: usize, h: &BatchHeader) -> [u8; STAMPED_LEN] {
    let mut out = [0u8; STAMPED_LEN];
    bytes.copy_to(at, &mut out);
    set_base_offset(&mut out, h.base_offset);
    set_leader_epoch(&mut out, h.leader_epoch);
    out
}

/// Upper bound on the bytes of one append call (segment positions are u32, and
/// Kafka's request sizes are i32).
pub const APPEND_BYTES_MAX: usize = i32::MAX as usize;

impl Log {
    /// Opens (creating if missing) the log in `dir`, recovering the active segment's
    /// tail and rebuilding missing or damaged indexes.
    pub fn open(dir: &Path, config: LogConfig, now_ms: TimestampMs) -> Result<Log, LogError> {
        std::fs::create_dir_all(dir).map_err(io_context(|| {
            format!("creating log directory {}", dir.display())
        }))?;
        let bases = recovery::clean_directory(dir)?;
        let mut epochs = LeaderEpochCache::load(dir)?;
        let interval = config.index_interval_bytes;
        let mut segments = Vec::with_capacity(bases.len().max(1));
        if bases.is_empty() {
            segments.push(Segment::create(dir, Offset::ZERO, now_ms)?);
            fsync_dir(dir)?;
        } else {
            for (i, &base) in bases.iter().enumerate() {
                let mut seg = Segment::open_file(dir, base, now_ms)?;
                match bases.get(i + 1) {
                    Some(&next) => {
                        recovery::load_trusted(&mut seg, interval, next)?;
                        // Fsynced before it stopped being active (as recovery trusts).
                        seg.synced_len = seg.size;
                        seg.offset_index.release();
                        seg.time_index.release();
                    }
                    None => {
                        recovery::recover_active(&mut seg, interval, &mut epochs)?;
                        if !seg.is_empty() {
                            // segment.ms counts from the first batch's timestamp when plausible.
                            let first = seg.header_at(0, seg.size)?;
                            if (0..=now_ms).contains(&first.max_timestamp) {
                                seg.created_ms = first.max_timestamp;
                            }
                        }
                    }
                }
                segments.push(seg);
            }
        }
        let mut log = Log {
            dir: dir.to_path_buf(),
            config,
            segments,
            epochs,
            cleaner_checkpoint: Offset::ZERO,
            unflushed_records: 0,
            first_unflushed_ms: None,
            flush_count: 0,
            producers: ProducerStates::default(),
            txns: TxnIndex::default(),
            compacting: Arc::new(AtomicBool::new(false)),
        };
        log.txns.load_aborted(read_aborted(dir)?);
        log.rebuild_producers()?;
        let (start, end) = (log.log_start_offset(), log.log_end_offset());
        // An epoch may start exactly at the end (assigned, nothing written yet): keep it.
        let mut changed = log.epochs.truncate_from_end(end.plus(1));
        changed |= log.epochs.truncate_from_start(start);
        if changed {
            log.epochs.persist()?;
        }
        let cleaned = read_cleaner_checkpoint(dir)?.unwrap_or(start);
        log.cleaner_checkpoint = cleaned.clamp(start, end);
        tracing::debug!(dir = %dir.display(), %start, %end, segments = log.segments.len(), "opened log");
        Ok(log)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    pub fn set_config(&mut self, config: LogConfig) {
        self.config = config;
    }

    pub(crate) fn active(&self) -> &Segment {
        self.segments
            .last()
            .expect("a log always has an active segment")
    }

    fn active_mut(&mut self) -> &mut Segment {
        self.segments
            .last_mut()
            .expect("a log always has an active segment")
    }

    /// Checks every batch of an append by header and CRC (no record decoding).
    fn check_batches(&self, input: &Rope, check_size: bool) -> Result<Checked, LogError> {
        if input.len() > APPEND_BYTES_MAX {
            return Err(DecodeError::TooLarge {
                field: "append",
                value: input.len() as u64,
                max: APPEND_BYTES_MAX as u64,
            }
            .into());
        }
        let mut out = Vec::new();
        for found in rope_batches(input) {
            let (pos, h) = found?;
            let size = h.total_size();
            if check_size && size > self.config.max_message_bytes as usize {
                return Err(LogError::RecordTooLarge {
                    size,
                    max: self.config.max_message_bytes,
                });
            }
            if h.record_count < 1 {
                return Err(DecodeError::InvalidValue {
                    field: "record_count",
                    value: h.record_count as i64,
                }
                .into());
            }
            // A producer's batch is dense: one offset per record. Compaction can
            // leave gaps, so only replicated batches may span more offsets than
            // records; a leader that accepted a sparse batch would hand out (and
            // waste) offsets nobody holds, up to 2^31 per batch.
            if check_size && h.last_offset_delta as i64 != h.record_count as i64 - 1 {
                return Err(DecodeError::InvalidValue {
                    field: "last_offset_delta (must be record_count - 1)",
                    value: h.last_offset_delta as i64,
                }
                .into());
            }
            if (h.last_offset_delta as i64) < h.record_count as i64 - 1 {
                return Err(DecodeError::InvalidValue {
                    field: "last_offset_delta",
                    value: h.last_offset_delta as i64,
                }
                .into());
            }
            verify_crc_at(input, pos, &h)?;
            out.push((h, pos as u64));
        }
        if out.is_empty() {
            return Err(DecodeError::Malformed {
                field: "batches",
                reason: "no batch to append".into(),
            }
            .into());
        }
        Ok(out)
    }

    /// [`Log::append_rope`] of batches in one buffer (copied first: the hot
    /// paths hand over the buffers the bytes arrived in, as a [`Rope`]).
    pub fn append(
        &mut self,
        batches: &[u8],
        epoch: LeaderEpoch,
        now_ms: TimestampMs,
    ) -> Result<AppendInfo, LogError> {
        self.append_rope(&Rope::from(Bytes::copy_from_slice(batches)), epoch, now_ms)
    }

    /// Leader append: `batches` holds one or more whole batches as a producer sent
    /// them, in the pieces they arrived in. Validates each (CRC, size <=
    /// max.message.bytes), stamps base offsets from the log end offset and the
    /// leader epoch into the headers as they are written (the pieces are not
    /// changed), appends.
    pub fn append_rope(
        &mut self,
        batches: &Rope,
        epoch: LeaderEpoch,
        now_ms: TimestampMs,
    ) -> Result<AppendInfo, LogError> {
        let mut checked = self.check_batches(batches, true)?;
        if let Some(latest) = self.epochs.latest_epoch()
            && epoch < latest
        {
            return Err(LogError::StaleLeaderEpoch { epoch, latest });
        }
        if let SeqCheck::Duplicate { first, last } = self
            .producers
            .check_append(checked.iter().map(|(h, _)| h))?
        {
            return Ok(AppendInfo {
                first_offset: first,
                last_offset: last,
                max_timestamp: -1,
                record_count: 0,
                bytes: 0,
                duplicate: true,
            });
        }
        let first = self.log_end_offset();
        let mut next = first;
        for (h, _) in &mut checked {
            h.base_offset = next;
            h.leader_epoch = epoch;
            next = h.next_offset();
        }
        if self.epochs.assign(epoch, first) {
            self.epochs.persist()?;
        }
        self.append_checked(batches, &checked, now_ms, true)
    }

    /// Follower append: batches already carry offsets and epochs; the first must
    /// start at the log end offset.
    ///
    /// As in Kafka, a later start (a gap) is accepted when it follows compaction on the
    /// leader; offsets must strictly increase. `max.message.bytes` is not enforced:
    /// the leader already accepted the batch.
    pub fn append_replicated(
        &mut self,
        batches: &[u8],
        now_ms: TimestampMs,
    ) -> Result<AppendInfo, LogError> {
        self.append_replicated_rope(&Rope::from(Bytes::copy_from_slice(batches)), now_ms)
    }

    /// [`Log::append_replicated`] of batches in the pieces they arrived in.
    pub fn append_replicated_rope(
        &mut self,
        batches: &Rope,
        now_ms: TimestampMs,
    ) -> Result<AppendInfo, LogError> {
        let checked = self.check_batches(batches, false)?;
        let mut expected = self.log_end_offset();
        for (h, _) in &checked {
            if h.base_offset < expected {
                return Err(LogError::NonContiguousAppend {
                    expected,
                    got: h.base_offset,
                });
            }
            expected = h.next_offset();
        }
        let mut changed = false;
        for (h, _) in &checked {
            changed |= self.epochs.assign(h.leader_epoch, h.base_offset);
        }
        if changed {
            self.epochs.persist()?;
        }
        self.append_checked(batches, &checked, now_ms, false)
    }

    /// Writes checked batches, each with its header as `checked` holds it
    /// (the leader's stamped offset and epoch).
    ///
    /// With `keep` (a leader's append), the active segment's tail cache keeps
    /// the pieces for fetches at the end of the log ([`crate::tail`]); a
    /// follower's bytes are not fetched from it.
    fn append_checked(
        &mut self,
        bytes: &Rope,
        checked: &Checked,
        now_ms: TimestampMs,
        keep: bool,
    ) -> Result<AppendInfo, LogError> {
        let first = checked[0].0.base_offset;
        let last = checked.last().expect("at least one batch").0.last_offset();
        // One append goes into one segment, whose index holds offsets relative to
        // its base as u32 (at most RELATIVE_OFFSET_MAX apart).
        if last.0 - first.0 > RELATIVE_OFFSET_MAX {
            return Err(DecodeError::TooLarge {
                field: "offset span of one append",
                value: (last.0 - first.0) as u64,
                max: RELATIVE_OFFSET_MAX as u64,
            }
            .into());
        }
        // segment.bytes is kept between batches: the batches of one call go into
        // the active segment while they fit, and the rest into new segments (a lone
        // batch larger than segment.bytes gets a segment of its own).
        let mut start = 0;
        while start < checked.len() {
            let end = self.place_run(bytes.len() as u64, &checked[start..], now_ms)? + start;
            let from = checked[start].1;
            let to = checked.get(end).map_or(bytes.len() as u64, |(_, pos)| *pos);
            let run: std::borrow::Cow<'_, [(BatchHeader, u64)]> = if from == 0 {
                std::borrow::Cow::Borrowed(&checked[start..end])
            } else {
                checked[start..end]
                    .iter()
                    .map(|(h, pos)| (*h, pos - from))
                    .collect()
            };
            // Each batch's first bytes (base offset, length, leader epoch) from
            // its header, then the rest of it from the pieces.
            let heads: Vec<[u8; STAMPED_LEN]> = checked[start..end]
                .iter()
                .map(|(h, pos)| stamped(bytes, *pos as usize, h))
                .collect();
            let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * heads.len() + bytes.pieces().len());
            for (head, (h, pos)) in heads.iter().zip(&checked[start..end]) {
                let pos = *pos as usize;
                parts.push(head);
                parts.extend(bytes.slices(pos + STAMPED_LEN, pos + h.total_size()));
            }
            debug_assert_eq!(parts.iter().map(|p| p.len() as u64).sum::<u64>(), to - from);
            let interval = self.config.index_interval_bytes;
            let active = self.active_mut();
            if active.is_empty() {
                // segment.ms counts from the first append, not from when the file was made.
                active.created_ms = now_ms;
            }
            active.append_pieces(&parts, &run, interval, keep, now_ms)?;
            start = end;
        }
        let mut aborted = false;
        for (h, pos) in checked {
            self.producers.record(h);
            aborted |= self.record_txn(h, bytes, *pos as usize)?;
        }
        if aborted {
            self.txns.persist(&self.dir)?;
        }
        let record_count: u64 = checked.iter().map(|(h, _)| h.record_count as u64).sum();
        let max_timestamp = checked
            .iter()
            .map(|(h, _)| h.max_timestamp)
            .max()
            .unwrap_or(-1);
        self.unflushed_records += record_count;
        let since = *self.first_unflushed_ms.get_or_insert(now_ms);
        let by_count = self
            .config
            .flush_messages
            .is_some_and(|n| self.unflushed_records >= n);
        if by_count || self.flush_ms_due(since, now_ms) {
            self.flush()?;
        }
        Ok(AppendInfo {
            first_offset: first,
            last_offset: last,
            max_timestamp,
            record_count,
            bytes: bytes.len() as u64,
            duplicate: false,
        })
    }

    /// Rolls the segment when the first of `run` (batches at their positions in
    /// the `bytes_len` bytes of an append) does not fit the active one, then
    /// returns how many of `run`, from the first, go into the active segment
    /// together.
    fn place_run(
        &mut self,
        bytes_len: u64,
        run: &[(BatchHeader, u64)],
        now_ms: TimestampMs,
    ) -> Result<usize, LogError> {
        let len_of = |i: usize| -> u64 {
            let end = run.get(i + 1).map_or(bytes_len, |(_, pos)| *pos);
            end - run[i].1
        };
        let (first, _) = &run[0];
        self.maybe_roll(len_of(0), first.base_offset, first.last_offset(), now_ms)?;
        let active = self.active();
        assert!(
            active.can_hold_offset(first.last_offset()),
            "after a roll the active segment holds the batch's offsets"
        );
        let mut size = active.size + len_of(0);
        let mut count = 1;
        while count < run.len() {
            let next = size + len_of(count);
            if next > self.config.segment_bytes
                || next > u32::MAX as u64
                || !active.can_hold_offset(run[count].0.last_offset())
            {
                break;
            }
            size = next;
            count += 1;
        }
        Ok(count)
    }

    /// Whether an append of `len` bytes at `now_ms` could wait on the disk:
    /// roll the active segment (which fsyncs it) or flush by
    /// `flush.messages` / `flush.ms`. Conservative (it may say yes where the
    /// append would not roll); `false` means the append writes to the page
    /// cache only, so a caller on an async task can run it there.
    ///
    /// `flush.messages` counts records, which it cannot know before parsing:
    /// it counts `len` instead (too early, never too late, for uncompressed
    /// records). Not covered, being rare and small: the epoch checkpoint
    /// written at the first append of a new leader epoch, the transaction
    /// index an abort marker rewrites, and a roll because a follower's batch
    /// lies more than 2^31 offsets past the segment's base (after compaction
    /// on the leader), or a compressed append of over 2^30 records.
    pub fn append_may_sync(&self, len: u64, now_ms: TimestampMs) -> bool {
        let active = self.active();
        let full = self.active_full(len, now_ms);
        // An uncompressed record takes bytes of its batch, so `len` bytes hold
        // fewer than `len` of them (a leader's append starts at the log end).
        // A compressed batch may hold more; so the span is also refused from
        // half the segment's offset range on.
        let last = Offset(self.log_end_offset().0.saturating_add(len as i64));
        let half = Offset(active.base_offset.0 + RELATIVE_OFFSET_MAX / 2);
        // An empty segment takes the first batch of an append whatever its
        // size, but rolls for the next one: so any append that does not fit.
        let roll = full || !active.can_hold_offset(last) || self.log_end_offset() > half;
        let by_count = self
            .config
            .flush_messages
            .is_some_and(|n| self.unflushed_records.saturating_add(len) >= n);
        let since = self.first_unflushed_ms.unwrap_or(now_ms);
        roll || by_count || self.flush_ms_due(since, now_ms)
    }

    /// Whether the active segment is full for `len` more bytes at `now_ms`:
    /// past `segment.bytes`, past the 4 GiB its index's positions reach, or
    /// older than `segment.ms` (counted from its first append).
    fn active_full(&self, len: u64, now_ms: TimestampMs) -> bool {
        let size = self.active().size + len;
        size > self.config.segment_bytes || size > u32::MAX as u64 || self.segment_ms_due(now_ms)
    }

    /// Whether the active segment is older than `segment.ms` at `now_ms`.
    fn segment_ms_due(&self, now_ms: TimestampMs) -> bool {
        now_ms.saturating_sub(self.active().created_ms)
            >= self.config.segment_ms.min(i64::MAX as u64) as i64
    }

    /// Whether `flush.ms` has passed at `now_ms` since the oldest unflushed
    /// append, made at `since`.
    fn flush_ms_due(&self, since: TimestampMs, now_ms: TimestampMs) -> bool {
        self.config
            .flush_ms
            .is_some_and(|ms| now_ms.saturating_sub(since) >= ms.min(i64::MAX as u64) as i64)
    }

    fn maybe_roll(
        &mut self,
        len: u64,
        first: Offset,
        last: Offset,
        now_ms: TimestampMs,
    ) -> Result<(), LogError> {
        let full = self.active_full(len, now_ms);
        let active = self.active();
        if (!active.is_empty() && full) || !active.can_hold_offset(last) {
            let base = first.max(self.log_end_offset());
            self.roll(base, now_ms)?;
        }
        Ok(())
    }

    /// Seals and fsyncs the active segment and starts a new one at `base`.
    pub(crate) fn roll(&mut self, base: Offset, now_ms: TimestampMs) -> Result<(), LogError> {
        let active = self.active_mut();
        assert!(
            base > active.base_offset,
            "a new segment starts after the active one"
        );
        assert!(
            base >= active.next_offset,
            "a new segment starts at or after the log end"
        );
        active.flush_sealed()?;
        active.cache.reset(active.size);
        active.offset_index.release();
        active.time_index.release();
        self.flush_count += 1;
        let seg = Segment::create(&self.dir, base, now_ms)?;
        fsync_dir(&self.dir)?;
        self.segments.push(seg);
        self.unflushed_records = 0;
        self.first_unflushed_ms = None;
        Ok(())
    }

    /// Whole batches starting with the one that holds `from`, up to `max_bytes`
    /// (at least one batch even if larger), only batches whose last offset is below
    /// `upper_bound`. `None` when there is nothing to read at `from` yet.
    pub fn read(
        &self,
        from: Offset,
        max_bytes: usize,
        upper_bound: Offset,
    ) -> Result<Option<FileSlice>, LogError> {
        let (start, end) = (self.log_start_offset(), self.log_end_offset());
        if from < start || from > end {
            return Err(LogError::OffsetOutOfRange {
                requested: from,
                start,
                end,
            });
        }
        if from >= end || from >= upper_bound {
            return Ok(None);
        }
        let first_seg = self
            .segments
            .partition_point(|s| s.base_offset <= from)
            .saturating_sub(1);
        for seg in &self.segments[first_seg..] {
            let limit = seg.size;
            let Some((pos, h)) = seg.find_batch(from, limit)? else {
                continue;
            };
            if h.last_offset() >= upper_bound {
                return Ok(None);
            }
            let end_limit = if upper_bound < seg.next_offset {
                seg.find_batch(upper_bound, limit)?
                    .map_or(limit, |(p, _)| p)
            } else {
                limit
            };
            let first_end = pos + h.total_size() as u64;
            let target = pos.saturating_add(max_bytes as u64);
            let end_pos = if target >= end_limit {
                end_limit
            } else if target <= first_end {
                first_end
            } else {
                // The last batch boundary <= target: start from the index entry at or
                // before target and walk headers.
                let floor = seg
                    .offset_index
                    .last_where(|e| e.position as u64 <= target)
                    .map_or(0, |e| e.position as u64);
                let mut p = floor.max(first_end);
                while p < end_limit {
                    let hh = seg.header_at(p, limit)?;
                    if p + hh.total_size() as u64 > target {
                        break;
                    }
                    p += hh.total_size() as u64;
                }
                p
            };
            debug_assert!(end_pos > pos && end_pos <= limit);
            return Ok(Some(FileSlice {
                file: Arc::clone(&seg.file),
                position: pos,
                len: (end_pos - pos) as u32,
                cached: seg.cache.covering(pos, end_pos),
            }));
        }
        Ok(None)
    }

    pub fn log_start_offset(&self) -> Offset {
        self.segments[0].base_offset
    }

    pub fn log_end_offset(&self) -> Offset {
        self.active().next_offset
    }

    /// Total bytes of all segments.
    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }

    /// Number of segments (the active one included).
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// How many times this `Log` fsynced its active segment since it was opened:
    /// each flush (by `flush.messages`, `flush.ms` or a call to `flush`) and each
    /// roll. Shows the flush policy at work, as Kafka's log flush rate does.
    pub fn flush_count(&self) -> u64 {
        self.flush_count
    }

    /// (base offset, bytes of its `.log` file known to be on stable storage) per
    /// segment, ascending: the file length at its last fsync by this process.
    /// Segments other than the active one count as synced when opened (they were
    /// fsynced before they stopped being active); the active segment found on open
    /// counts as unsynced until its first flush, as the log cannot tell whether its
    /// previous writer fsynced it. A power loss can take any byte past these lengths.
    pub fn synced_lengths(&self) -> Vec<(Offset, u64)> {
        self.segments
            .iter()
            .map(|s| (s.base_offset, s.synced_len))
            .collect()
    }

    /// Base offsets of the segments, ascending.
    pub fn segment_base_offsets(&self) -> Vec<Offset> {
        self.segments.iter().map(|s| s.base_offset).collect()
    }

    /// The first offset whose timestamp is >= `ts` (with that timestamp), if any.
    pub fn offset_for_timestamp(
        &self,
        ts: TimestampMs,
    ) -> Result<Option<(Offset, TimestampMs)>, LogError> {
        for seg in &self.segments {
            if seg.is_empty() || seg.max_timestamp < ts {
                continue;
            }
            let limit = seg.size;
            let mut pos = match seg.time_index.last_where(|e| e.timestamp_ms < ts) {
                Some(e) => seg.index_position(seg.base_offset.plus(e.relative_offset as i64)),
                None => 0,
            };
            while pos < limit {
                let h = seg.header_at(pos, limit)?;
                let size = h.total_size();
                if h.max_timestamp >= ts {
                    let mut buf = vec![0u8; size];
                    seg.file
                        .read_exact_at(&mut buf, pos)
                        .map_err(io_context(|| {
                            format!("reading {} at {pos}", seg.path.display())
                        }))?;
                    let corrupt = |e: DecodeError| LogError::Corrupt {
                        path: seg.path.clone(),
                        position: pos,
                        reason: e.to_string(),
                    };
                    let view = rill_proto::BatchView::new(&buf).map_err(corrupt)?;
                    if let Some(found) = view.first_at_or_after(ts).map_err(corrupt)? {
                        return Ok(Some(found));
                    }
                }
                pos += size as u64;
            }
        }
        Ok(None)
    }

    /// Removes every record at or after `offset` (replication truncation).
    ///
    /// Batch-granular: the batch holding `offset` goes whole, so the log end offset
    /// becomes `min(offset, base offset of the first removed batch)`.
    pub fn truncate_to(&mut self, offset: Offset) -> Result<(), LogError> {
        let end = self.log_end_offset();
        if offset >= end {
            // No record goes, but an epoch entry starting at or past `offset`
            // does (it holds no record any more, or never did).
            if self.epochs.truncate_from_end(offset) {
                self.epochs.persist()?;
            }
            return Ok(());
        }
        if offset <= self.log_start_offset() {
            return self.truncate_fully_and_start_at(offset);
        }
        // The first batch with last offset >= offset (maybe past a compaction gap).
        let mut cut = None;
        let first_seg = self
            .segments
            .partition_point(|s| s.base_offset <= offset)
            .saturating_sub(1);
        for seg in &self.segments[first_seg..] {
            if let Some((_, h)) = seg.find_batch(offset, seg.size)? {
                cut = Some(h.base_offset);
                break;
            }
        }
        let new_end = cut.map_or(offset, |b| b.min(offset));
        if new_end <= self.log_start_offset() {
            return self.truncate_fully_and_start_at(new_end);
        }
        info!(dir = %self.dir.display(), from = %end, to = %new_end, "truncating log");
        // Newest first, so a crash part-way leaves a prefix of the log.
        while self.active().base_offset > new_end {
            let mut seg = self.segments.pop().expect("segments");
            seg.delete_files()?;
        }
        let active = self.active_mut();
        if let Some((pos, h)) = active.find_batch(new_end, active.size)? {
            active.truncate_at(pos, h.base_offset)?;
        }
        if self.active().next_offset < new_end {
            // A compaction gap before the new end: keep the end across a reopen.
            self.roll(new_end, self.active().created_ms)?;
        }
        fsync_dir(&self.dir)?;
        self.after_truncation(new_end)
    }

    /// Empties the log and starts it again at `offset` (a follower whose log
    /// ends before the leader's log start: what it has is gone on the leader,
    /// and it continues from there, as Kafka's follower does).
    pub fn restart_at(&mut self, offset: Offset) -> Result<(), LogError> {
        self.truncate_fully_and_start_at(offset)?;
        // As Kafka's: no epoch of the old records applies to what comes next.
        if self.epochs.clear() {
            self.epochs.persist()?;
        }
        Ok(())
    }

    fn truncate_fully_and_start_at(&mut self, offset: Offset) -> Result<(), LogError> {
        info!(dir = %self.dir.display(), %offset, "truncating the whole log and restarting it");
        let created = self.active().created_ms;
        while let Some(mut seg) = self.segments.pop() {
            seg.delete_files()?;
        }
        self.segments
            .push(Segment::create(&self.dir, offset, created)?);
        fsync_dir(&self.dir)?;
        self.after_truncation(offset)
    }

    fn after_truncation(&mut self, new_end: Offset) -> Result<(), LogError> {
        assert_eq!(
            self.log_end_offset(),
            new_end,
            "truncation lands on the computed end"
        );
        if self.epochs.truncate_from_end(new_end) {
            self.epochs.persist()?;
        }
        let start = self.log_start_offset();
        if self.epochs.truncate_from_start(start) {
            self.epochs.persist()?;
        }
        if self.cleaner_checkpoint > new_end || self.cleaner_checkpoint < start {
            self.cleaner_checkpoint = self.cleaner_checkpoint.clamp(start, new_end);
            checkpoint::write_checkpoint(
                &self.dir,
                CLEANER_CHECKPOINT,
                &[(0, self.cleaner_checkpoint.0)],
            )?;
        }
        self.unflushed_records = 0;
        self.first_unflushed_ms = None;
        self.rebuild_producers()
    }

    /// Rebuilds the idempotent-producer table and the open transactions (and
    /// the aborted index of the local part) from the batch headers of the local
    /// log (one header read per batch; a marker's one record is read too).
    fn rebuild_producers(&mut self) -> Result<(), LogError> {
        self.producers.clear();
        let before = self.txns.aborted().to_vec();
        self.txns.truncate_from(self.log_start_offset());
        let mut txns = std::mem::take(&mut self.txns);
        for seg in &self.segments {
            let mut pos = 0;
            while pos < seg.size {
                let h = seg.header_at(pos, seg.size)?;
                self.producers.record(&h);
                if rill_proto::control::is_marker_header(&h) {
                    let marker = read_marker(seg, pos, &h)?;
                    if let Some(m) = marker {
                        txns.record_marker(&h, m);
                    }
                } else {
                    txns.record_data(&h);
                }
                pos += h.total_size() as u64;
            }
        }
        let changed = txns.aborted() != before.as_slice();
        self.txns = txns;
        if changed {
            self.txns.persist(&self.dir)?;
        }
        Ok(())
    }

    /// Updates the transaction state for a batch now in the log (`bytes` starts
    /// with it); true when it was an abort marker.
    fn record_txn(&mut self, h: &BatchHeader, bytes: &Rope, at: usize) -> Result<bool, LogError> {
        if !rill_proto::control::is_marker_header(h) {
            self.txns.record_data(h);
            return Ok(false);
        }
        // A marker is one small batch: read from a copy.
        let batch = bytes.slice(at, (at + h.total_size()).min(bytes.len()));
        let marker = rill_proto::control::parse_marker(&batch.to_bytes())?;
        Ok(marker.and_then(|m| self.txns.record_marker(h, m)).is_some())
    }

    /// Appends the marker that ends `producer`'s transaction in this partition
    /// (leader side: the transaction coordinator asked for it), at leader epoch
    /// `epoch`. Returns where it was written.
    pub fn append_marker(
        &mut self,
        producer: rill_proto::ProducerId,
        producer_epoch: i16,
        marker: rill_proto::control::Marker,
        epoch: LeaderEpoch,
        now_ms: TimestampMs,
    ) -> Result<AppendInfo, LogError> {
        let batch = rill_proto::control::marker_batch(producer, producer_epoch, marker, now_ms);
        self.append_rope(&Rope::from(batch), epoch, now_ms)
    }

    /// The first offset of the oldest open transaction: records from there on are
    /// not stable yet (the last stable offset is the lower of this and the high
    /// watermark). `None` when no transaction is open.
    pub fn first_unstable_offset(&self) -> Option<Offset> {
        self.txns.first_unstable_offset()
    }

    /// Open transactions: (producer id, first offset).
    pub fn open_transactions(&self) -> Vec<(i64, Offset)> {
        self.txns.ongoing()
    }

    /// The aborted transactions that a reader of `[from, to)` must skip.
    pub fn aborted_transactions(&self, from: Offset, to: Offset) -> Vec<AbortedTxn> {
        self.txns.aborted_between(from, to)
    }

    /// Forgets aborted transactions wholly below the log start (after retention).
    pub(crate) fn prune_aborted(&mut self) -> Result<(), LogError> {
        if self.txns.retain_from(self.log_start_offset()) {
            self.txns.persist(&self.dir)?;
        }
        Ok(())
    }

    /// The idempotent producers this partition remembers, by id.
    pub fn producers(&self) -> Vec<crate::producer::ProducerSummary> {
        self.producers.summaries()
    }

    /// Idempotent producers this partition remembers.
    pub fn producer_count(&self) -> usize {
        self.producers.len()
    }

    /// fsyncs everything written so far.
    pub fn flush(&mut self) -> Result<(), LogError> {
        self.active_mut().flush()?;
        self.flush_count += 1;
        self.unflushed_records = 0;
        self.first_unflushed_ms = None;
        Ok(())
    }

    /// Applies time-based policies: `flush.ms` and `segment.ms`.
    pub fn tick(&mut self, now_ms: TimestampMs) -> Result<(), LogError> {
        self.active_mut().cache.expire(now_ms);
        if let Some(since) = self.first_unflushed_ms
            && self.flush_ms_due(since, now_ms)
        {
            self.flush()?;
        }
        if !self.active().is_empty() && self.segment_ms_due(now_ms) {
            let end = self.log_end_offset();
            self.roll(end, now_ms)?;
        }
        Ok(())
    }

    /// (size, max timestamp) of each non-active segment, oldest first.
    pub(crate) fn non_active_sizes_and_max_ts(&self) -> Vec<(u64, TimestampMs)> {
        let n = self.segments.len() - 1;
        self.segments[..n]
            .iter()
            .map(|s| (s.size, s.max_timestamp))
            .collect()
    }

    /// Deletes the `n` oldest segments (never the active one), moving the log start.
    pub(crate) fn delete_oldest_segments(&mut self, n: usize) -> Result<(), LogError> {
        assert!(
            n < self.segments.len(),
            "the active segment is never deleted"
        );
        for mut seg in self.segments.drain(..n) {
            info!(path = %seg.path.display(), "deleting segment past retention");
            seg.delete_files()?;
        }
        fsync_dir(&self.dir)?;
        let start = self.log_start_offset();
        if self.epochs.truncate_from_start(start) {
            self.epochs.persist()?;
        }
        if self.cleaner_checkpoint < start {
            self.cleaner_checkpoint = start;
            checkpoint::write_checkpoint(&self.dir, CLEANER_CHECKPOINT, &[(0, start.0)])?;
        }
        Ok(())
    }

    /// Reads every segment in full and checks every batch (header chain, offsets,
    /// CRC). Open only does this for the active segment; older segments were fsynced
    /// before they stopped being active and are trusted, as in Kafka. An operator
    /// tool or a scrubber can call this; the first damage found is `Corrupt`.
    pub fn verify(&self) -> Result<(), LogError> {
        for seg in &self.segments {
            let mut reader = ChunkReader::new(&seg.file, &seg.path, seg.size, SCAN_CHUNK_BYTES);
            let (_, stop) = scan_batches(&mut reader, 0, seg.base_offset, true, |_, _, _| Ok(()))?;
            if let ScanStop::Bad { position, reason } = stop {
                return Err(LogError::Corrupt {
                    path: seg.path.clone(),
                    position,
                    reason,
                });
            }
        }
        Ok(())
    }

    /// (epoch, start offset) pairs of the leader-epoch checkpoint, ascending.
    pub fn epoch_entries(&self) -> Vec<(LeaderEpoch, Offset)> {
        self.epochs.entries().to_vec()
    }

    /// KIP-101: the end offset of `epoch` in this log (the start offset of the next
    /// higher epoch, or the log end offset), with the largest epoch <= `epoch`.
    pub fn end_offset_for_epoch(&self, epoch: LeaderEpoch) -> Option<(LeaderEpoch, Offset)> {
        self.epochs.end_offset_for(epoch, self.log_end_offset())
    }

    /// Where this log, as a follower, cuts after the leader's OffsetForLeaderEpoch
    /// answer for [`Log::latest_epoch`] (see [`crate::epoch::LeaderEpochCache::truncation`]).
    pub fn truncation(&self, leader: Option<(LeaderEpoch, Offset)>) -> crate::epoch::Truncation {
        self.epochs.truncation(leader, self.log_end_offset())
    }

    /// The latest leader epoch that wrote to this log.
    pub fn latest_epoch(&self) -> Option<LeaderEpoch> {
        self.epochs.latest_epoch()
    }

    /// Flushes and closes.
    pub fn close(mut self) -> Result<(), LogError> {
        self.active_mut().flush_sealed()?;
        Ok(())
    }

    /// Closes and deletes the log's directory.
    pub fn delete(self) -> Result<(), LogError> {
        let dir = self.dir.clone();
        drop(self);
        std::fs::remove_dir_all(&dir).map_err(io_context(|| {
            format!("deleting log directory {}", dir.display())
        }))
    }
}

/// The marker of the control batch at `pos` of `seg` (header `h`).
fn read_marker(
    seg: &Segment,
    pos: u64,
    h: &BatchHeader,
) -> Result<Option<rill_proto::control::Marker>, LogError> {
    let mut buf = vec![0u8; h.total_size()];
    seg.file
        .read_exact_at(&mut buf, pos)
        .map_err(io_context(|| {
            format!("reading the marker of {} at {pos}", seg.path.display())
        }))?;
    rill_proto::control::parse_marker(&buf).map_err(|e| LogError::Corrupt {
        path: seg.path.clone(),
        position: pos,
        reason: format!("a transaction marker that does not parse: {e}"),
    })
}
