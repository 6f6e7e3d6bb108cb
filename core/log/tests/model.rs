//! Property test: the log against a simple in-memory model, over random sequences
//! of append, replicated-style reads, roll, truncate, retention, compaction and
//! reopen (clean and unclean), with tiny segments so every path crosses segments.

mod common;
use bytes::Bytes;
use common::*;
use proptest::prelude::*;
use rill_log::{CleanupPolicy, Log, LogConfig};
use rill_proto::batch::batches;
use rill_proto::{BatchBuilder, Compression, LeaderEpoch, Offset, Record, StoredRecord};

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
        12 => (proptest::collection::vec(rec, 1..6), 0u8..3, proptest::bool::weighted(0.1))
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

#[derive(Debug, Default)]
struct Model {
    /// (base offset, last offset, records) per batch.
    batches: Vec<(i64, i64, Vec<StoredRecord>)>,
    start: i64,
    end: i64,
    epochs: Vec<(i32, i64)>,
}

impl Model {
    fn records(&self) -> Vec<StoredRecord> {
        self.batches.iter().flat_map(|b| b.2.clone()).collect()
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

fn batches_of(log: &Log) -> Vec<(i64, i64, Vec<StoredRecord>)> {
    let mut out = Vec::new();
    let end = log.log_end_offset();
    let mut from = log.log_start_offset();
    while from < end {
        let Some(slice) = log.read(from, 1, end).unwrap() else {
            break;
        };
        let bytes = slice.read().unwrap();
        let mut n = 0;
        for v in batches(&bytes) {
            let v = v.unwrap();
            out.push((
                v.header.base_offset.0,
                v.header.last_offset().0,
                v.records().unwrap(),
            ));
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

fn run(ops: Vec<Op>) {
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
                let compression =
                    [Compression::None, Compression::Lz4, Compression::Zstd][comp as usize];
                let mut b = BatchBuilder::new(compression);
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
                }
                let mut bytes = b.build().to_vec();
                let info = l.append(&mut bytes, LeaderEpoch(epoch), now).unwrap();
                assert_eq!(info.first_offset.0, m.end);
                if m.epochs.last().is_none_or(|&(e, _)| epoch > e) {
                    m.epochs.push((epoch, m.end));
                }
                let n = recs.len() as i64;
                m.batches.push((m.end, m.end + n - 1, stored));
                m.end += n;
            }
            Op::Read(f, max) => {
                if m.end > m.start {
                    let from = m.start + f as i64 % (m.end - m.start);
                    let slice = l.read(Offset(from), max as usize, Offset(m.end)).unwrap();
                    let want_first = m.batches.iter().position(|b| b.1 >= from);
                    match (slice, want_first) {
                        (None, None) => {}
                        (Some(s), Some(i)) => {
                            let bytes = s.read().unwrap();
                            let views: Vec<_> = batches(&bytes).map(|v| v.unwrap()).collect();
                            assert!(!views.is_empty());
                            assert!(bytes.len() <= max as usize || views.len() == 1);
                            for (k, v) in views.iter().enumerate() {
                                assert_eq!(v.header.base_offset.0, m.batches[i + k].0);
                            }
                        }
                        (s, w) => panic!("read {from}: got {s:?}, model first batch {w:?}"),
                    }
                    // An upper bound inside the first batch yields nothing.
                    if let Some(i) = want_first {
                        let b = &m.batches[i];
                        assert!(
                            l.read(Offset(from), 1 << 20, Offset(b.1))
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
                        let cut = m.batches.iter().position(|b| b.1 >= to);
                        let new_end = cut.map_or(to, |i| m.batches[i].0.min(to));
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
                l.set_config(c.clone());
                l.apply_retention(now).unwrap();
                c.retention_ms = None;
                c.retention_bytes = None;
                l.set_config(c);
                let start = l.log_start_offset().0;
                assert!(start >= m.start && start <= m.end);
                assert!(
                    m.batches.iter().all(|b| b.0 >= start || b.1 < start),
                    "retention cuts at batch boundaries"
                );
                m.batches.retain(|b| b.0 >= start);
                m.start = start;
                m.truncate_epochs_start(start);
            }
            Op::Compact(dt) => {
                let before = m.records();
                let ran = l.compact(now + dt as i64).unwrap();
                let after = batches_of(l);
                let recs: Vec<StoredRecord> = after.iter().flat_map(|b| b.2.clone()).collect();
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
                    assert!(m.batches.iter().any(|w| w.0 == b.0 && w.1 == b.1));
                }
                m.batches = after;
            }
            Op::Reopen(clean) => {
                let l = log.take().unwrap();
                if clean {
                    l.close().unwrap();
                } else {
                    drop(l);
                }
                log = Some(Log::open(dir.path(), config(), now).unwrap());
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
        let want = m.epochs.iter().rposition(|&(x, _)| x <= e.0).map(|i| {
            (
                LeaderEpoch(m.epochs[i].0),
                Offset(m.epochs.get(i + 1).map_or(m.end, |x| x.1)),
            )
        });
        assert_eq!(log.as_ref().unwrap().end_offset_for_epoch(e), want);
    }
    log.take().unwrap().close().unwrap();
    let l = Log::open(dir.path(), config(), now).unwrap();
    check(&l, &m);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 2000, ..ProptestConfig::default() })]
    #[test]
    fn log_matches_model(ops in proptest::collection::vec(op(), 1..250)) {
        run(ops);
    }
}
