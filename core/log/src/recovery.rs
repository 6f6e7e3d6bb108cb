//! Recovery on open: what the log trusts, what it checks, and what it repairs.
//!
//! * Leftovers of interrupted work (`*.tmp` checkpoints, `*.cleaned` compaction
//!   output, `*.deleted` segments, indexes with no `.log`) are deleted.
//! * The active (last) segment is always scanned in full, CRC included, and its
//!   indexes rebuilt. A bad batch there is a *torn tail* only if no valid batch
//!   starts anywhere after it: then the file is truncated to the last whole batch
//!   and fsynced. If a valid batch follows, the damage is in the middle of the log
//!   and recovery fails with `LogError::Corrupt` naming the file and byte position;
//!   it never drops acknowledged data silently.
//! * Older segments were fsynced when they were rolled (or written by compaction
//!   with fsync before the swap), so they are trusted: their indexes are loaded and
//!   sanity-checked, and the tail after the last index entry is walked by header. A
//!   missing or damaged index is rebuilt by a full scan with CRC; any bad batch in an
//!   older segment is `LogError::Corrupt`, never a truncation.
//!
//! Recovery is idempotent: running it on its own output changes nothing.

use crate::checkpoint::TEMP_SUFFIX;
use crate::epoch::LeaderEpochCache;
use crate::error::{LogError, io_context};
use crate::index::{OffsetIndex, TimeIndex};
use crate::segment::{
    CLEANED_SUFFIX, ChunkReader, DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, SCAN_CHUNK_BYTES,
    ScanStop, Segment, TIME_INDEX_SUFFIX, scan_batches, segment_path,
};
use rill_proto::Offset;
use rill_proto::batch::{BATCH_HEADER_LEN, BatchHeader, BatchView};
use std::os::unix::fs::FileExt;
use std::path::Path;
use tracing::warn;

/// Deletes leftovers of interrupted writes and returns the base offsets of the
/// segments found, ascending.
pub fn clean_directory(dir: &Path) -> Result<Vec<Offset>, LogError> {
    let mut bases = Vec::new();
    let mut indexes = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(io_context(|| {
        format!("listing log directory {}", dir.display())
    }))?;
    for entry in entries {
        let entry = entry.map_err(io_context(|| {
            format!("listing log directory {}", dir.display())
        }))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let path = entry.path();
        if name.ends_with(TEMP_SUFFIX)
            || name.ends_with(CLEANED_SUFFIX)
            || name.ends_with(DELETED_SUFFIX)
        {
            warn!(path = %path.display(), "deleting leftover of an interrupted write");
            std::fs::remove_file(&path).map_err(io_context(|| {
                format!("deleting leftover {}", path.display())
            }))?;
        } else if let Some(base) = crate::segment::parse_segment_name(name) {
            bases.push(base);
        } else if let Some(stem) = name
            .strip_suffix(INDEX_SUFFIX)
            .or_else(|| name.strip_suffix(TIME_INDEX_SUFFIX))
        {
            indexes.push((stem.to_string(), path));
        }
    }
    for (stem, path) in indexes {
        if !dir.join(format!("{stem}{LOG_SUFFIX}")).exists() {
            warn!(path = %path.display(), "deleting index without a segment");
            std::fs::remove_file(&path).map_err(io_context(|| {
                format!("deleting orphan index {}", path.display())
            }))?;
        }
    }
    bases.sort();
    Ok(bases)
}

/// Rebuilds a segment's indexes and tail state by a full scan with CRC. Returns the
/// leader epochs that start batches, in order, and why the scan stopped.
fn rebuild(
    seg: &mut Segment,
    interval: u32,
) -> Result<(ScanStop, Vec<(rill_proto::LeaderEpoch, Offset)>), LogError> {
    let dir = seg
        .path
        .parent()
        .expect("segment in a directory")
        .to_path_buf();
    seg.offset_index = OffsetIndex::empty(segment_path(&dir, seg.base_offset, INDEX_SUFFIX));
    seg.time_index = TimeIndex::empty(segment_path(&dir, seg.base_offset, TIME_INDEX_SUFFIX));
    seg.next_offset = seg.base_offset;
    seg.max_timestamp = i64::MIN;
    seg.last_batch_base = None;
    seg.bytes_since_index = 0;
    let file = std::sync::Arc::clone(&seg.file);
    let path = seg.path.clone();
    let file_len = seg.size;
    let mut reader = ChunkReader::new(&file, &path, file_len, SCAN_CHUNK_BYTES);
    let mut epochs = Vec::new();
    let mut last_epoch = None;
    let (end, stop) = scan_batches(&mut reader, 0, seg.base_offset, true, |pos, h, _| {
        if !seg.can_hold_offset(h.last_offset()) {
            return Err(LogError::Corrupt {
                path: path.clone(),
                position: pos,
                reason: format!(
                    "batch offset {} is too far from the segment base",
                    h.last_offset()
                ),
            });
        }
        if last_epoch != Some(h.leader_epoch) {
            epochs.push((h.leader_epoch, h.base_offset));
            last_epoch = Some(h.leader_epoch);
        }
        seg.note_batch(h, pos, interval);
        Ok(())
    })?;
    // note_batch checks against `size`, which stays the file length during the scan.
    seg.size = end;
    Ok((stop, epochs))
}

/// Recovers the active segment: full CRC scan, torn-tail truncation, index rebuild.
/// Epochs found in its batches are added to `epochs` (the checkpoint may lag).
pub fn recover_active(
    seg: &mut Segment,
    interval: u32,
    epochs: &mut LeaderEpochCache,
) -> Result<(), LogError> {
    let file_len = seg.size;
    let (stop, found) = rebuild(seg, interval)?;
    if let ScanStop::Bad { position, reason } = stop {
        if let Some(valid_at) = find_valid_batch_after(seg, position + 1, file_len)? {
            return Err(LogError::Corrupt {
                path: seg.path.clone(),
                position,
                reason: format!(
                    "{reason}; a valid batch follows at byte {valid_at}, so this is damage in the middle \
                     of the log, not a torn write (restore the replica from another one)"
                ),
            });
        }
        warn!(
            path = %seg.path.display(), position, file_len, %reason,
            "truncating the torn tail of the active segment"
        );
        seg.file.set_len(position).map_err(io_context(|| {
            format!(
                "truncating torn tail of {} at {position}",
                seg.path.display()
            )
        }))?;
        seg.file
            .sync_all()
            .map_err(io_context(|| format!("fsyncing {}", seg.path.display())))?;
        seg.size = position;
        seg.synced_len = position;
    }
    let mut changed = false;
    for (epoch, start) in found {
        changed |= epochs.assign(epoch, start);
    }
    if changed {
        epochs.persist()?;
    }
    // Rewrite the index files from the rebuilt entries.
    seg.rewrite_index_files()
}

/// Opens an older (non-active) segment: load and check its indexes, walk its tail;
/// rebuild the indexes on any doubt. `next_base` is the next segment's base offset.
pub fn load_trusted(seg: &mut Segment, interval: u32, next_base: Offset) -> Result<(), LogError> {
    let rel_max = (next_base.0 - seg.base_offset.0 - 1).max(0) as u64;
    let offset_index = OffsetIndex::load(
        seg.offset_index.path().to_path_buf(),
        rel_max,
        Some(seg.size as i64),
    )?;
    let time_index = TimeIndex::load(seg.time_index.path().to_path_buf(), rel_max, None)?;
    let problem = match (offset_index, time_index) {
        (Ok(oi), Ok(ti)) => {
            seg.offset_index = oi;
            seg.time_index = ti;
            if seg.size > 0 && seg.time_index.entries().is_empty() {
                Some("time index is empty for a non-empty segment".to_string())
            } else {
                match seg.recompute_tail() {
                    Ok(()) if seg.next_offset <= next_base => None,
                    Ok(()) => Some(format!(
                        "segment runs to offset {} past the next segment",
                        seg.next_offset
                    )),
                    Err(e) => Some(e.to_string()),
                }
            }
        }
        (Err(reason), _) => Some(format!("offset index: {reason}")),
        (_, Err(reason)) => Some(format!("time index: {reason}")),
    };
    let Some(problem) = problem else {
        return Ok(());
    };
    warn!(path = %seg.path.display(), %problem, "rebuilding the indexes of a segment");
    let (stop, _) = rebuild(seg, interval)?;
    if let ScanStop::Bad { position, reason } = stop {
        return Err(LogError::Corrupt {
            path: seg.path.clone(),
            position,
            reason: format!(
                "{reason} (in a segment that is not the active one, so it cannot be a torn write)"
            ),
        });
    }
    if seg.next_offset > next_base {
        return Err(LogError::Corrupt {
            path: seg.path.clone(),
            position: seg.size,
            reason: format!(
                "segment holds offsets up to {} past the next segment's base {next_base}",
                seg.next_offset
            ),
        });
    }
    seg.seal_time_index();
    for p in [
        seg.offset_index.path().to_path_buf(),
        seg.time_index.path().to_path_buf(),
    ] {
        let _ = std::fs::remove_file(&p);
    }
    seg.offset_index.sync()?;
    seg.time_index.sync()?;
    Ok(())
}

/// The first position in `[from, file_len)` where a whole batch with a valid CRC
/// starts, if any (the error path only: tells a torn tail from mid-log damage).
pub fn find_valid_batch_after(
    seg: &Segment,
    from: u64,
    file_len: u64,
) -> Result<Option<u64>, LogError> {
    let mut reader = ChunkReader::new(&seg.file, &seg.path, file_len, SCAN_CHUNK_BYTES);
    let mut pos = from;
    while pos + BATCH_HEADER_LEN as u64 <= file_len {
        let window = (SCAN_CHUNK_BYTES as u64).min(file_len - pos) as usize;
        let chunk = reader.get(pos, window)?.to_vec();
        let last_start = chunk.len().saturating_sub(BATCH_HEADER_LEN);
        for i in 0..=last_start {
            if chunk[i + 16] != rill_proto::batch::MAGIC as u8 {
                continue;
            }
            let Ok(h) = BatchHeader::parse(&chunk[i..i + BATCH_HEADER_LEN]) else {
                continue;
            };
            let at = pos + i as u64;
            let size = h.total_size() as u64;
            if at + size > file_len || h.record_count < 1 {
                continue;
            }
            let mut bytes = vec![0u8; size as usize];
            seg.file
                .read_exact_at(&mut bytes, at)
                .map_err(io_context(|| {
                    format!("reading {} at {at}", seg.path.display())
                }))?;
            if BatchView::new(&bytes).is_ok_and(|v| v.verify_crc().is_ok()) {
                return Ok(Some(at));
            }
        }
        pos += (last_start + 1) as u64;
    }
    Ok(None)
}
