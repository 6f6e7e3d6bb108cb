//! Property test: the log against a simple in-memory model, over random sequences
//! of append, replicated-style reads, roll, truncate, retention, compaction and
//! reopen (clean and unclean), with tiny segments so every path crosses segments.
//!
//! The model computes retention and compaction from its own state: which segments
//! retention deletes (by time and by size), which records compaction keeps, and the
//! bytes of every batch. The only thing it takes from the log is the segmentation
//! (`segment_base_offsets`), as input; the log's outcome is only ever compared.
//! Fixed cases at the end pin the boundaries: a deleted key stays deleted, stale
//! values go, and retention deletes neither a segment too many nor one too few.

mod common;
use bytes::Bytes;
use common::*;
use proptest::prelude::*;
use rill_log::{CleanupPolicy, Log, LogConfig};
use rill_proto::batch::{BatchHeader, batches};
use rill_proto::{BatchBuilder, Compression, LeaderEpoch, Offset, Record, StoredRecord};
use std::collections::HashMap;

#[derive(Debug, Clone)]
enum Op {
    /// (records as (key index or none, tombstone, ts offset), compression, bump epoch)
    Append(Vec<(Option<u8>, bool, u16)>, u8, bool),
    Read(u16, u16),
    Roll,
    Truncate(u16),
    Retention(bool, u16),
    Compact(u32),
    Reopen(bool),
    TimeLookup(u16),
}

fn op() -> impl Strategy<Value = Op> {
    let rec = (
        proptest::option::of(0u8..12),
        proptest::bool::weighted(0.15),
        0u16..1000,
    );
    prop_oneof![
        12 => (proptest::collection::vec(rec, 1..6), 0u8..5, proptest::bool::weighted(0.1))
            .prop_map(|(r, c, e)| Op::Append(r, c, e)),
        3 => (any::<u16>(), 1u16..2000).prop_map(|(f, m)| Op::Read(f, m)),
        1 => Just(Op::Roll),
        1 => any::<u16>().prop_map(Op::Truncate),
        1 => (any::<bool>(), any::<u16>()).prop_map(|(b, v)| Op::Retention(b, v)),
        1 => (0u32..2000).prop_map(Op::Compact),
        1 => any::<bool>().prop_map(Op::Reopen),
        1 => any::<u16>().prop_map(Op::TimeLookup),
    ]
}

/// One batch: base offset, last offset, records, and its bytes as stored.
#[derive(Debug, Clone, PartialEq)]
struct MBatch {
    base: i64,
    last: i64,
    records: Vec<StoredRecord>,
    bytes: Vec<u8>,
}

impl MBatch {
    fn max_timestamp(&self) -> i64 {
        self.records.iter().map(|r| r.timestamp_ms).max().unwrap()
    }
}

#[derive(Debug, Default)]
struct Model {
    batches: Vec<MBatch>,
    start: i64,
    end: i64,
    epochs: Vec<(i32, i64)>,
    /// The first offset compaction has not cleaned (the cleaner checkpoint), by the
    /// model's own bookkeeping.
    cleaned: i64,
}

/// The segment sizes and max timestamps of the model's batches, cut by the
/// segmentation `bases` (the log's segment base offsets, taken as input). An
/// empty segment has size 0 and max timestamp `i64::MIN`.
fn segment_stats(batches: &[MBatch], bases: &[i64]) -> Vec<(u64, i64)> {
    let mut stats = vec![(0u64, i64::MIN); bases.len()];
    for b in batches {
        let i = bases.partition_point(|&x| x <= b.base) - 1;
        assert!(
            bases.get(i + 1).is_none_or(|&next| b.last < next),
            "batch {}..={} lies in one segment of {bases:?}",
            b.base,
            b.last
        );
        stats[i].0 += b.bytes.len() as u64;
        stats[i].1 = stats[i].1.max(b.max_timestamp());
    }
    stats
}

impl Model {
    fn records(&self) -> Vec<StoredRecord> {
        self.batches
            .iter()
            .flat_map(|b| b.records.clone())
            .collect()
    }

    /// Retention at `now` (Kafka's rules, computed here): whole segments only,
    /// oldest first, never the active one; by time while a segment's largest
    /// timestamp is older than `now - retention.ms` (an empty segment counts as
    /// expired); then by size while the log minus the segment stays >=
    /// retention.bytes. Returns how many segments go.
    fn apply_retention(&mut self, bases: &[i64], c: &LogConfig, now: i64) -> usize {
        if !c.cleanup_policy.delete {
            return 0;
        }
        let stats = segment_stats(&self.batches, bases);
        let closed = &stats[..stats.len() - 1];
        let mut n = 0;
        if let Some(ms) = c.retention_ms {
            let horizon = now - ms as i64;
            while n < closed.len() && closed[n].1 < horizon {
                n += 1;
            }
        }
        if let Some(limit) = c.retention_bytes {
            let mut size: u64 = stats[n..].iter().map(|s| s.0).sum();
            while n < closed.len() && size - closed[n].0 >= limit {
                size -= closed[n].0;
                n += 1;
            }
        }
        if n > 0 {
            self.start = bases[n];
            let start = self.start;
            self.batches.retain(|b| b.base >= start);
            self.truncate_epochs_start(start);
            self.cleaned = self.cleaned.max(start);
        }
        n
    }

    /// Compaction at `now`, computed here from the documented rules of
    /// compaction.rs. It runs when the policy compacts, there is a segment besides
    /// the active one, and the dirty segments (those that can hold offsets at or
    /// after the cleaner checkpoint) make at least min.cleanable.dirty.ratio of
    /// the non-active bytes. It then cleans every non-active segment (the active
    /// one is never touched; the log's offset-map bound of 64 MiB is never reached
    /// here): a keyed record stays only if no later record of its key is in a dirty
    /// non-active segment, and a tombstone that stays by that rule is dropped once
    /// its timestamp is older than `now - delete.retention.ms`; keyless records
    /// stay; a partly kept batch keeps its offset range, an emptied one goes.
    fn compact(&mut self, bases: &[i64], c: &LogConfig, now: i64) -> bool {
        if !c.cleanup_policy.compact || bases.len() < 2 {
            return false;
        }
        let n = bases.len() - 1;
        let stats = segment_stats(&self.batches, bases);
        let first_dirty = (0..n).find(|&i| bases[i + 1] > self.cleaned).unwrap_or(n);
        let total: u64 = stats[..n].iter().map(|s| s.0).sum();
        let dirty: u64 = stats[first_dirty..n].iter().map(|s| s.0).sum();
        if dirty == 0 || total == 0 || (dirty as f64 / total as f64) < c.min_cleanable_dirty_ratio {
            return false;
        }
        let active = bases[n];
        let mut latest: HashMap<Bytes, i64> = HashMap::new();
        for b in &self.batches {
            if b.base >= bases[first_dirty] && b.base < active {
                for r in &b.records {
                    if let Some(k) = &r.key {
                        latest.insert(k.clone(), r.offset.0);
                    }
                }
            }
        }
        let horizon = now - c.delete_retention_ms as i64;
        let keep = |r: &StoredRecord| match &r.key {
            None => true,
            Some(k) => {
                latest.get(k).is_none_or(|&o| o <= r.offset.0)
                    && !(r.is_tombstone() && r.timestamp_ms < horizon)
            }
        };
        let mut out = Vec::with_capacity(self.batches.len());
        for b in self.batches.drain(..) {
            if b.base >= active {
                out.push(b);
                continue;
            }
            let kept: Vec<StoredRecord> = b.records.iter().filter(|r| keep(r)).cloned().collect();
            if kept.len() == b.records.len() {
                out.push(b);
            } else if !kept.is_empty() {
                out.push(reencode(&b, kept));
            }
        }
        self.batches = out;
        self.cleaned = active;
        true
    }

    fn truncate_epochs_end(&mut self, end: i64) {
        self.epochs.retain(|&(_, s)| s < end);
    }
    fn truncate_epochs_start(&mut self, start: i64) {
        let below = self.epochs.iter().take_while(|&&(_, s)| s < start).count();
        if below > 0 {
            let keep = self.epochs[below - 1].0;
            self.epochs.drain(..below);
            if self.epochs.first().is_none_or(|&(_, s)| s > start) {
                self.epochs.insert(0, (keep, start));
            }
        }
    }
}

/// `b` with only `kept` of its records, encoded as compaction encodes a partly
/// kept batch (same offset range, epoch, producer fields and compression).
fn reencode(b: &MBatch, kept: Vec<StoredRecord>) -> MBatch {
    let h = BatchHeader::parse(&b.bytes).unwrap();
    let mut builder = BatchBuilder::new(h.compression().unwrap()).producer(
        h.producer_id,
        h.producer_epoch,
        h.base_sequence,
    );
    for r in &kept {
        builder.push_with_offset_delta(
            (r.offset.0 - b.base) as i32,
            &Record {
                key: r.key.clone(),
                value: r.value.clone(),
                headers: r.headers.clone(),
                timestamp_ms: r.timestamp_ms,
            },
        );
    }
    let bytes = builder
        .build_spanning(h.base_offset, h.leader_epoch, h.last_offset_delta)
        .to_vec();
    MBatch {
        base: b.base,
        last: b.last,
        records: kept,
        bytes,
    }
}

/// Compaction's safety, independent of how it decides: for every key, what
/// survives of `before` ends with the key's latest record, or nothing of the key
/// survives and that latest record was a tombstone. (A deleted key never comes
/// back; a stale value is never the latest.)
fn check_no_key_goes_back(before: &[StoredRecord], after: &[StoredRecord]) {
    let last_of = |recs: &[StoredRecord]| {
        let mut m: HashMap<Bytes, StoredRecord> = HashMap::new();
        for r in recs {
            if let Some(k) = &r.key {
                m.insert(k.clone(), r.clone());
            }
        }
        m
    };
    let (was, now) = (last_of(before), last_of(after));
    for (k, latest) in &was {
        match now.get(k) {
            Some(r) => assert_eq!(
                r, latest,
                "the last surviving record of {k:?} is its latest"
            ),
            None => assert!(latest.is_tombstone(), "{k:?} vanished but was not deleted"),
        }
    }
}

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 400,
        segment_ms: 1_000_000,
        index_interval_bytes: 100,
        retention_ms: None,
        cleanup_policy: CleanupPolicy::COMPACT_DELETE,
        min_cleanable_dirty_ratio: 0.3,
        delete_retention_ms: 500,
        ..LogConfig::default()
    }
}

fn batches_of(log: &Log) -> Vec<MBatch> {
    let mut out = Vec::new();
    let end = log.log_end_offset();
    let mut from = log.log_start_offset();
    while from < end {
        let Some(slice) = log.read(from, 1, end).unwrap() else {
            break;
        };
        let bytes = slice.read().unwrap();
        let (mut n, mut pos) = (0, 0);
        for v in batches(&bytes) {
            let v = v.unwrap();
            let size = v.header.total_size();
            out.push(MBatch {
                base: v.header.base_offset.0,
                last: v.header.last_offset().0,
                records: v.records().unwrap(),
                bytes: bytes[pos..pos + size].to_vec(),
            });
            pos += size;
            from = v.header.next_offset();
            n += 1;
        }
        assert_eq!(n, 1, "max_bytes 1 still returns exactly one whole batch");
    }
    out
}

fn check(log: &Log, m: &Model) {
    assert_eq!(log.log_end_offset().0, m.end, "log end offset");
    assert_eq!(log.log_start_offset().0, m.start, "log start offset");
    assert_eq!(
        log.read(Offset(m.end), 100, Offset(i64::MAX))
            .unwrap()
            .map(|s| s.len),
        None
    );
    let got = batches_of(log);
    assert_eq!(
        log.size_bytes(),
        m.batches.iter().map(|b| b.bytes.len() as u64).sum::<u64>(),
        "log size"
    );
    assert_eq!(got.len(), m.batches.len(), "batch count");
    for (g, w) in got.iter().zip(&m.batches) {
        assert_eq!(g, w);
    }
    let epochs: Vec<(i32, i64)> = log
        .epoch_entries()
        .iter()
        .map(|(e, s)| (e.0, s.0))
        .collect();
    assert_eq!(epochs, m.epochs, "epoch cache");
}

/// The model test checks logic, not durability: on tmpfs, when there is one, the
/// fsyncs of every roll cost nothing.
fn scratch_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::tempdir_in(shm)
    {
        return d;
    }
    tempfile::tempdir().unwrap()
}

/// Runs `ops` against the log and the model, checking after each; returns the model.
fn run(ops: Vec<Op>) -> Model {
    let dir = scratch_dir();
    let mut now = NOW;
    let mut log = Some(Log::open(dir.path(), config(), now).unwrap());
    let mut m = Model::default();
    let mut epoch = 1;
    for op in ops {
        let l = log.as_mut().unwrap();
        now += 1;
        match op {
            Op::Append(recs, comp, bump) => {
                if bump {
                    epoch += 1;
                }
                let compression = Compression::ALL[comp as usize];
                let mut b = BatchBuilder::new(compression);
                // The model encodes its own copy, at its offset and epoch.
                let mut own = BatchBuilder::new(compression);
                let mut stored = Vec::new();
                for (i, (key, tomb, ts)) in recs.iter().enumerate() {
                    let r = Record {
                        key: key.map(|k| Bytes::from(format!("key-{k}"))),
                        value: if *tomb && key.is_some() {
                            None
                        } else {
                            Some(Bytes::from(format!("v{}-{i}", m.end)))
                        },
                        headers: Vec::new(),
                        timestamp_ms: now + *ts as i64,
                    };
                    stored.push(StoredRecord {
                        offset: Offset(m.end + i as i64),
                        timestamp_ms: r.timestamp_ms,
                        key: r.key.clone(),
                        value: r.value.clone(),
                        headers: Vec::new(),
                    });
                    b.push(&r);
                    own.push(&r);
                }
                let mut bytes = b.build().to_vec();
                let info = l.append(&mut bytes, LeaderEpoch(epoch), now).unwrap();
                assert_eq!(info.first_offset.0, m.end);
                if m.epochs.last().is_none_or(|&(e, _)| epoch > e) {
                    m.epochs.push((epoch, m.end));
                }
                let n = recs.len() as i64;
                m.batches.push(MBatch {
                    base: m.end,
                    last: m.end + n - 1,
                    records: stored,
                    bytes: own.build_at(Offset(m.end), LeaderEpoch(epoch)).to_vec(),
                });
                m.end += n;
            }
            Op::Read(f, max) => {
                if m.end > m.start {
                    let from = m.start + f as i64 % (m.end - m.start);
                    let slice = l.read(Offset(from), max as usize, Offset(m.end)).unwrap();
                    let want_first = m.batches.iter().position(|b| b.last >= from);
                    match (slice, want_first) {
                        (None, None) => {}
                        (Some(s), Some(i)) => {
                            let bytes = s.read().unwrap();
                            let views: Vec<_> = batches(&bytes).map(|v| v.unwrap()).collect();
                            assert!(!views.is_empty());
                            assert!(bytes.len() <= max as usize || views.len() == 1);
                            for (k, v) in views.iter().enumerate() {
                                assert_eq!(v.header.base_offset.0, m.batches[i + k].base);
                            }
                        }
                        (s, w) => panic!("read {from}: got {s:?}, model first batch {w:?}"),
                    }
                    // An upper bound inside the first batch yields nothing.
                    if let Some(i) = want_first {
                        let b = &m.batches[i];
                        assert!(
                            l.read(Offset(from), 1 << 20, Offset(b.last))
                                .unwrap()
                                .is_none()
                        );
                    }
                }
            }
            Op::Roll => {
                now += 1_000_000;
                l.tick(now).unwrap();
            }
            Op::Truncate(f) => {
                let span = (m.end - m.start + 2).max(1);
                let to = m.start - 1 + f as i64 % span;
                let to = to.max(0);
                l.truncate_to(Offset(to)).unwrap();
                if to < m.end {
                    if to <= m.start {
                        m.batches.clear();
                        m.start = to;
                        m.end = to;
                    } else {
                        let cut = m.batches.iter().position(|b| b.last >= to);
                        let new_end = cut.map_or(to, |i| m.batches[i].base.min(to));
                        if let Some(i) = cut {
                            m.batches.truncate(i);
                        }
                        m.end = new_end;
                        if new_end <= m.start {
                            m.start = new_end;
                        }
                    }
                    m.truncate_epochs_end(m.end);
                    let s = m.start;
                    m.truncate_epochs_start(s);
                    m.cleaned = m.cleaned.clamp(m.start, m.end);
                } else {
                    // No record goes; an epoch entry from `to` on goes.
                    m.truncate_epochs_end(to);
                }
            }
            Op::Retention(by_time, v) => {
                let mut c = l.config().clone();
                if by_time {
                    c.retention_ms = Some(v as u64 % 3000);
                    c.retention_bytes = None;
                } else {
                    c.retention_ms = None;
                    c.retention_bytes = Some(v as u64 % 4000);
                }
                let bases: Vec<i64> = l.segment_base_offsets().iter().map(|o| o.0).collect();
                l.set_config(c.clone());
                let deleted = l.apply_retention(now).unwrap();
                let start = l.log_start_offset().0;
                assert!(start >= m.start && start <= m.end);
                assert!(
                    m.batches.iter().all(|b| b.base >= start || b.last < start),
                    "retention cuts at batch boundaries"
                );
                let want = m.apply_retention(&bases, &c, now);
                assert_eq!(deleted, want, "segments deleted of {bases:?} ({c:?})");
                assert_eq!(start, m.start, "log start after retention");
                c.retention_ms = None;
                c.retention_bytes = None;
                l.set_config(c);
            }
            Op::Compact(dt) => {
                let before = m.records();
                let bases: Vec<i64> = l.segment_base_offsets().iter().map(|o| o.0).collect();
                let ran = l.compact(now + dt as i64).unwrap();
                let after = batches_of(l);
                let recs: Vec<StoredRecord> =
                    after.iter().flat_map(|b| b.records.clone()).collect();
                // A subset with identical content.
                let mut j = 0;
                for r in &recs {
                    while j < before.len() && before[j].offset < r.offset {
                        j += 1;
                    }
                    assert_eq!(Some(r), before.get(j), "compaction keeps records unchanged");
                }
                // The latest record of every key, keyless records, and all live values stay.
                for (i, r) in before.iter().enumerate() {
                    let latest = r.key.is_none() || before[i + 1..].iter().all(|x| x.key != r.key);
                    if latest && !r.is_tombstone() {
                        assert!(recs.contains(r), "latest {r:?} kept (ran: {ran})");
                    }
                }
                // Batches keep their offset ranges.
                for b in &after {
                    assert!(
                        m.batches
                            .iter()
                            .any(|w| w.base == b.base && w.last == b.last)
                    );
                }
                check_no_key_goes_back(&before, &recs);
                let want = m.compact(&bases, l.config(), now + dt as i64);
                assert_eq!(ran, want, "whether compaction runs on {bases:?}");
                // `check` compares every batch with the model's.
            }
            Op::Reopen(clean) => {
                let l = log.take().unwrap();
                if clean {
                    l.close().unwrap();
                } else {
                    drop(l);
                }
                log = Some(Log::open(dir.path(), config(), now).unwrap());
                m.cleaned = m.cleaned.clamp(m.start, m.end);
            }
            Op::TimeLookup(t) => {
                let ts = NOW + t as i64 * 3;
                let want = m
                    .records()
                    .into_iter()
                    .find(|r| r.timestamp_ms >= ts)
                    .map(|r| (r.offset, r.timestamp_ms));
                assert_eq!(
                    l.offset_for_timestamp(ts).unwrap(),
                    want,
                    "offset for timestamp {ts}"
                );
            }
        }
        check(log.as_ref().unwrap(), &m);
        let e = LeaderEpoch((now % 7) as i32);
        let want = match m.epochs.iter().rposition(|&(x, _)| x <= e.0) {
            Some(i) => Some((
                LeaderEpoch(m.epochs[i].0),
                Offset(m.epochs.get(i + 1).map_or(m.end, |x| x.1)),
            )),
            None => m.epochs.first().map(|&(_, s)| (e, Offset(s))),
        };
        assert_eq!(log.as_ref().unwrap().end_offset_for_epoch(e), want);
    }
    log.take().unwrap().close().unwrap();
    let l = Log::open(dir.path(), config(), now).unwrap();
    check(&l, &m);
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 2000, ..ProptestConfig::default() })]
    #[test]
    fn log_matches_model(ops in proptest::collection::vec(op(), 1..250)) {
        run(ops);
    }
}

fn key_of(r: &StoredRecord) -> Option<&[u8]> {
    r.key.as_deref()
}

/// Fixed case: an expired tombstone goes in the same pass as the older value of
/// its key, which sits in a segment cleaned before; the key does not come back.
#[test]
fn fixed_deleted_key_stays_deleted() {
    use Op::*;
    let m = run(vec![
        Append(vec![(Some(0), false, 0), (Some(1), false, 0)], 0, false),
        Roll,
        Compact(0), // cleans segment 0, nothing to drop
        Append(vec![(Some(0), true, 0)], 0, false),
        Roll, // the tombstone's segment closes; it is 10^6 ms old
        Append(vec![(Some(2), false, 0)], 0, false),
        Compact(0),
    ]);
    let recs = m.records();
    assert!(
        recs.iter().all(|r| key_of(r) != Some(b"key-0")),
        "key-0 stays deleted: {recs:?}"
    );
    assert_eq!(offsets(&recs), vec![1, 3]);
}

/// Fixed case: stale values go from every non-active segment; the active segment
/// is neither cleaned nor read, so a value whose newer one is active stays.
#[test]
fn fixed_stale_values_go_but_the_active_segment_is_not_compacted() {
    use Op::*;
    let m = run(vec![
        Append(vec![(Some(0), false, 0), (Some(1), false, 0)], 0, false),
        Append(vec![(Some(0), false, 0)], 1, false),
        Roll,
        Append(vec![(Some(1), false, 0), (Some(2), false, 0)], 2, false),
        Roll,
        Append(vec![(Some(3), false, 0), (Some(2), false, 0)], 0, false),
        Compact(0),
    ]);
    // key-0@0 and key-1@1 are stale; key-2@4 stays (its newer value is active).
    assert_eq!(offsets(&m.records()), vec![2, 3, 4, 5, 6]);
}
