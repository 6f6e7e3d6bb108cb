//! Remote reads: serving a fetch below the local log start offset from the segment
//! objects, with ranged reads through a bounded in-memory cache.
//!
//! Objects are read in aligned blocks of [`REMOTE_BLOCK_BYTES`]; a miss fetches the
//! missing blocks of the wanted range plus one block of read-ahead in one ranged
//! request (`get_ranges`), so a consumer reading forward pays one round trip per
//! block. Blocks live in [`RemoteCache`], least recently used evicted first, bounded
//! by `object_store.cache_bytes`. A segment's offset index (small) is cached the
//! same way, whole, and turns the fetch offset into a byte position; batch headers
//! are then walked as on local disk. What is returned is whole batches as stored
//! (never re-encoded), at least one batch, at most `max_bytes` otherwise.

use super::manifest::RemoteSegment;
use super::{Tier, segment_objects};
use bytes::{Bytes, BytesMut};
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use parking_lot::Mutex;
use rill_log::index::{IndexEntry, OffsetEntry};
use rill_proto::Offset;
use rill_proto::batch::{BATCH_HEADER_LEN, BatchHeader};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

/// Size of one cached block of a remote object.
pub const REMOTE_BLOCK_BYTES: u64 = 1 << 20;
/// Blocks fetched past the wanted range on a miss (read-ahead).
pub const REMOTE_READ_AHEAD_BLOCKS: u64 = 1;
/// Default bound on the remote read cache.
pub const DEFAULT_REMOTE_CACHE_BYTES: u64 = 64 << 20;
/// Bound on batches walked per remote read (a fetch of tiny batches stops here).
const REMOTE_BATCHES_PER_READ_MAX: usize = 100_000;

/// Why a remote read failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteReadError {
    #[error("object store error reading {path}: {source}")]
    Store {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error("remote segment {path} is damaged at byte {position}: {reason}")]
    Corrupt {
        path: String,
        position: u64,
        reason: String,
    },
}

type BlockKey = (ObjectPath, u64);

/// Bytes read per step when ListOffsets scans a remote segment for a timestamp.
const REMOTE_TIMESTAMP_READ_BYTES: usize = 1 << 20;

#[derive(Debug, Default)]
struct CacheInner {
    blocks: HashMap<BlockKey, (u64, Bytes)>,
    /// Last-use tick -> key, oldest first.
    lru: BTreeMap<u64, BlockKey>,
    tick: u64,
    bytes: u64,
}

/// A bounded cache of remote object blocks (LRU).
#[derive(Debug)]
pub struct RemoteCache {
    inner: Mutex<CacheInner>,
    capacity_bytes: u64,
}

impl RemoteCache {
    pub fn new(capacity_bytes: u64) -> RemoteCache {
        RemoteCache {
            inner: Mutex::new(CacheInner::default()),
            capacity_bytes,
        }
    }

    fn get(&self, key: &BlockKey) -> Option<Bytes> {
        let mut g = self.inner.lock();
        g.tick += 1;
        let tick = g.tick;
        let (old, bytes) = {
            let entry = g.blocks.get_mut(key)?;
            let old = entry.0;
            entry.0 = tick;
            (old, entry.1.clone())
        };
        g.lru.remove(&old);
        g.lru.insert(tick, key.clone());
        Some(bytes)
    }

    fn insert(&self, key: BlockKey, bytes: Bytes) {
        let len = bytes.len() as u64;
        if len > self.capacity_bytes {
            return;
        }
        let mut g = self.inner.lock();
        g.tick += 1;
        let tick = g.tick;
        if let Some((old, prev)) = g.blocks.insert(key.clone(), (tick, bytes)) {
            g.lru.remove(&old);
            g.bytes -= prev.len() as u64;
        }
        g.lru.insert(tick, key);
        g.bytes += len;
        while g.bytes > self.capacity_bytes {
            let Some((_, victim)) = g.lru.pop_first() else {
                break;
            };
            if let Some((_, b)) = g.blocks.remove(&victim) {
                g.bytes -= b.len() as u64;
            }
        }
    }

    /// Bytes held now.
    pub fn size_bytes(&self) -> u64 {
        self.inner.lock().bytes
    }
}

impl Tier {
    /// Bytes `range` of the object `path` (of `object_len` bytes), through the cache.
    async fn read_range(
        &self,
        path: &ObjectPath,
        object_len: u64,
        range: Range<u64>,
    ) -> Result<Bytes, RemoteReadError> {
        let range = range.start.min(object_len)..range.end.min(object_len);
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let first = range.start / REMOTE_BLOCK_BYTES;
        let last = (range.end - 1) / REMOTE_BLOCK_BYTES;
        let mut blocks: Vec<Option<Bytes>> = (first..=last)
            .map(|b| self.cache.get(&(path.clone(), b)))
            .collect();
        let missing: Vec<u64> = (first..=last)
            .zip(&blocks)
            .filter(|(_, b)| b.is_none())
            .map(|(i, _)| i)
            .collect();
        if !missing.is_empty() {
            self.metrics.cache_misses.increment(missing.len() as u64);
            let block_count = object_len.div_ceil(REMOTE_BLOCK_BYTES);
            let mut fetch: Vec<u64> = missing.clone();
            let ahead_end = (last + 1 + REMOTE_READ_AHEAD_BLOCKS).min(block_count);
            for b in last + 1..ahead_end {
                if self.cache.get(&(path.clone(), b)).is_none() {
                    fetch.push(b);
                }
            }
            let ranges: Vec<Range<u64>> = fetch
                .iter()
                .map(|b| b * REMOTE_BLOCK_BYTES..((b + 1) * REMOTE_BLOCK_BYTES).min(object_len))
                .collect();
            let got = self
                .store
                .get_ranges(path, &ranges)
                .await
                .map_err(|source| {
                    self.metrics.error("download");
                    RemoteReadError::Store {
                        path: path.to_string(),
                        source,
                    }
                })?;
            for (b, bytes) in fetch.iter().zip(got) {
                self.metrics.download_bytes.increment(bytes.len() as u64);
                if (first..=last).contains(b) {
                    blocks[(b - first) as usize] = Some(bytes.clone());
                }
                self.cache.insert((path.clone(), *b), bytes);
            }
        } else {
            self.metrics.cache_hits.increment(blocks.len() as u64);
        }
        let blocks: Vec<Bytes> = blocks.into_iter().flatten().collect();
        let start_in_first = (range.start - first * REMOTE_BLOCK_BYTES) as usize;
        let len = (range.end - range.start) as usize;
        if blocks.len() == 1 {
            return Ok(blocks[0].slice(start_in_first..start_in_first + len));
        }
        let mut out = BytesMut::with_capacity(len);
        let mut skip = start_in_first;
        for b in &blocks {
            let from = skip.min(b.len());
            skip -= from;
            let take = (len - out.len()).min(b.len() - from);
            out.extend_from_slice(&b[from..from + take]);
        }
        Ok(out.freeze())
    }

    /// The batch header at `pos` of the segment object `log` (`size` bytes).
    async fn header_at(
        &self,
        log: &ObjectPath,
        size: u64,
        pos: u64,
    ) -> Result<BatchHeader, RemoteReadError> {
        let b = self
            .read_range(log, size, pos..pos + BATCH_HEADER_LEN as u64)
            .await?;
        BatchHeader::parse(&b).map_err(|e| RemoteReadError::Corrupt {
            path: log.to_string(),
            position: pos,
            reason: e.to_string(),
        })
    }

    /// The first record whose timestamp is at or after `ts` in the remote segments
    /// of `remote` that start below `below` (the local log start: what lies above
    /// it is looked up locally), as ListOffsets by timestamp wants it: the record's
    /// offset and timestamp. `None` when no remote record is that new.
    pub async fn offset_for_timestamp(
        &self,
        remote: &super::RemoteLog,
        below: Offset,
        ts: rill_proto::TimestampMs,
    ) -> Result<Option<(Offset, rill_proto::TimestampMs)>, RemoteReadError> {
        let candidates = remote.manifest.segments.iter().filter(|s| {
            s.base_offset < below
                && s.next_offset > remote.manifest.log_start_offset
                && s.max_timestamp_ms >= ts
        });
        for seg in candidates {
            let mut from = seg.base_offset.max(remote.manifest.log_start_offset);
            while from < seg.next_offset {
                let bytes = self
                    .read_segment(&remote.prefix, seg, from, REMOTE_TIMESTAMP_READ_BYTES)
                    .await?;
                if bytes.is_empty() {
                    break;
                }
                let [log, _, _] =
                    segment_objects(&remote.prefix, seg.base_offset, seg.leader_epoch);
                let read_from = from;
                let corrupt = |reason: String| RemoteReadError::Corrupt {
                    path: log.to_string(),
                    position: 0,
                    reason: format!("batch at or after offset {read_from}: {reason}"),
                };
                for view in rill_proto::batch::batches(&bytes) {
                    let view = view.map_err(|e| corrupt(e.to_string()))?;
                    from = view.header.next_offset();
                    if let Some(found) = view
                        .first_at_or_after(ts)
                        .map_err(|e| corrupt(e.to_string()))?
                    {
                        return Ok(Some(found));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Whole batches of `segment` starting with the one that holds `from` (or the
    /// first after it), up to `max_bytes` (at least one batch). Empty when the
    /// segment holds nothing at or after `from`.
    pub async fn read_segment(
        &self,
        partition_prefix: &ObjectPath,
        segment: &RemoteSegment,
        from: Offset,
        max_bytes: usize,
    ) -> Result<Bytes, RemoteReadError> {
        let [log, index, _] =
            segment_objects(partition_prefix, segment.base_offset, segment.leader_epoch);
        let corrupt = |position: u64, reason: String| RemoteReadError::Corrupt {
            path: log.to_string(),
            position,
            reason,
        };
        // The offset index: the last entry at or before `from` gives a start position.
        let mut pos = 0u64;
        if segment.offset_index_bytes >= OffsetEntry::SIZE as u64 && from > segment.base_offset {
            let idx = self
                .read_range(
                    &index,
                    segment.offset_index_bytes,
                    0..segment.offset_index_bytes,
                )
                .await?;
            let relative = (from.0 - segment.base_offset.0).min(u32::MAX as i64) as u32;
            let entries = idx.len() / OffsetEntry::SIZE;
            let entry = |i: usize| OffsetEntry::decode(&idx[i * OffsetEntry::SIZE..]);
            // Binary search: the number of entries at or before `relative`.
            let (mut lo, mut hi) = (0, entries);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if entry(mid).relative_offset <= relative {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            if lo > 0 {
                pos = entry(lo - 1).position as u64;
            }
        }
        let size = segment.size_bytes;
        // Skip to the batch holding `from`.
        let mut walked = 0usize;
        let first = loop {
            if pos >= size {
                return Ok(Bytes::new());
            }
            let h = self.header_at(&log, size, pos).await?;
            if h.total_size() == 0 || pos + h.total_size() as u64 > size {
                return Err(corrupt(
                    pos,
                    format!(
                        "batch of {} bytes runs past the segment end {size}",
                        h.total_size()
                    ),
                ));
            }
            if h.last_offset() >= from {
                break h;
            }
            pos += h.total_size() as u64;
            walked += 1;
            if walked > REMOTE_BATCHES_PER_READ_MAX {
                return Err(corrupt(
                    pos,
                    "too many batches before the fetch offset; the offset index is missing".into(),
                ));
            }
        };
        let start = pos;
        let mut end = pos + first.total_size() as u64;
        let mut batches = 1;
        while end < size && batches < REMOTE_BATCHES_PER_READ_MAX {
            let h = self.header_at(&log, size, end).await?;
            let next = end + h.total_size() as u64;
            if h.total_size() == 0 || next > size || next - start > max_bytes as u64 {
                break;
            }
            end = next;
            batches += 1;
        }
        self.read_range(&log, size, start..end).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ObjectStoreConfig;
    use crate::tier::upload::upload_segment;
    use rill_log::{Log, LogConfig};
    use rill_proto::batch::batches;
    use rill_proto::{BatchBuilder, Compression, LeaderEpoch, Record};

    /// Offsets of every batch in `bytes` (base, last).
    fn batch_offsets(bytes: &[u8]) -> Vec<(i64, i64)> {
        batches(bytes)
            .map(|b| {
                let h = b.unwrap().header;
                (h.base_offset.0, h.last_offset().0)
            })
            .collect()
    }

    #[tokio::test]
    async fn remote_reads_return_what_the_local_log_returns() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            segment_bytes: 64 * 1024,
            index_interval_bytes: 512,
            ..LogConfig::default()
        };
        let mut log = Log::open(dir.path(), config, 0).unwrap();
        for i in 0..400 {
            let mut b = BatchBuilder::new(Compression::None);
            for j in 0..(1 + i % 5) {
                b.push(&Record::from_value(
                    vec![b'a' + (j as u8); 100 + i % 300],
                    1,
                ));
            }
            log.append(&mut b.build().to_vec(), LeaderEpoch(0), 1)
                .unwrap();
        }
        let end = log.log_end_offset();
        let segs = log.tierable_segments(Offset::ZERO, end, 100).unwrap();
        assert!(segs.len() >= 2, "{}", segs.len());
        // Small blocks of cache: reads cross block boundaries.
        let tier = Tier::open(&ObjectStoreConfig {
            url: "memory://".into(),
            cache_bytes: 3 << 20,
            ..ObjectStoreConfig::default()
        })
        .unwrap();
        let prefix = tier.partition_prefix("t", "id", 0);
        let mut remote = Vec::new();
        for seg in &segs {
            remote.push(
                upload_segment(&tier, &prefix, seg, LeaderEpoch(0))
                    .await
                    .unwrap(),
            );
        }
        let remote_end = segs.last().unwrap().next_offset;
        for from in (0..remote_end.0).step_by(7) {
            let from = Offset(from);
            let seg = remote
                .iter()
                .find(|s| s.base_offset <= from && from < s.next_offset)
                .unwrap();
            for max in [1usize, 3000, 40_000] {
                let got = tier.read_segment(&prefix, seg, from, max).await.unwrap();
                let local = log
                    .read(from, max, seg.next_offset)
                    .unwrap()
                    .unwrap()
                    .read()
                    .unwrap();
                assert_eq!(
                    batch_offsets(&got),
                    batch_offsets(&local),
                    "from {from} max {max}"
                );
                assert_eq!(got, local, "byte for byte, from {from} max {max}");
            }
        }
        assert!(tier.cache.size_bytes() <= 3 << 20);
    }

    #[test]
    fn cache_evicts_least_recently_used_within_its_bound() {
        let cache = RemoteCache::new(30);
        let key = |n: u64| (ObjectPath::from("o"), n);
        cache.insert(key(0), Bytes::from(vec![0u8; 10]));
        cache.insert(key(1), Bytes::from(vec![1u8; 10]));
        cache.insert(key(2), Bytes::from(vec![2u8; 10]));
        assert!(cache.get(&key(0)).is_some(), "touch 0: 1 is now the oldest");
        cache.insert(key(3), Bytes::from(vec![3u8; 10]));
        assert_eq!(cache.size_bytes(), 30);
        assert!(cache.get(&key(1)).is_none());
        assert!(cache.get(&key(0)).is_some() && cache.get(&key(3)).is_some());
        cache.insert(key(4), Bytes::from(vec![4u8; 31]));
        assert!(
            cache.get(&key(4)).is_none(),
            "larger than the whole cache: not kept"
        );
    }
}
