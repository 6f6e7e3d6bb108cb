//! Retention by time and size, and compaction: latest value per key, offsets kept,
//! tombstones expire, crash-safe swap, progress checkpoint.

mod common;
use common::*;
use rill_log::{CleanupPolicy, Log, LogConfig};
use std::collections::BTreeMap;

#[test]
fn retention_by_time_and_size_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config();
    cfg.retention_ms = Some(1000);
    let mut log = Log::open(dir.path(), cfg.clone(), NOW).unwrap();
    for i in 0..60 {
        let mut b = batch("r", 2, NOW + i * 100);
        log.append(&mut b, E1, NOW).unwrap();
    }
    let segs = log.segment_count();
    assert!(segs > 4);
    // At NOW + 1000 nothing is older than 1 s.
    assert_eq!(log.apply_retention(NOW + 1000).unwrap(), 0);
    let deleted = log.apply_retention(NOW + 4000).unwrap();
    assert!(deleted > 0);
    let start = log.log_start_offset();
    assert!(start > o(0));
    // Every remaining segment but the active one has a record newer than the horizon.
    let first = read_all(&log)[0].clone();
    assert_eq!(first.offset, start);
    assert!(
        log.epoch_entries()[0].1 == start,
        "epoch cache moved to the new start"
    );
    // Never the active segment.
    let older = log.segment_count() - 1;
    assert_eq!(log.apply_retention(i64::MAX / 2).unwrap(), older);
    assert_eq!(log.segment_count(), 1);
    let start = log.log_start_offset();
    log.close().unwrap();
    let log = Log::open(dir.path(), cfg.clone(), NOW).unwrap();
    assert_eq!(log.log_start_offset(), start);
    assert_eq!(log.log_end_offset(), o(120));

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config();
    cfg.retention_ms = None;
    cfg.retention_bytes = Some(3000);
    let mut log = Log::open(dir.path(), cfg, NOW).unwrap();
    for _ in 0..60 {
        let mut b = batch("s", 2, NOW);
        log.append(&mut b, E1, NOW).unwrap();
    }
    let before = log.size_bytes();
    assert!(log.apply_retention(NOW).unwrap() > 0);
    assert!(log.size_bytes() >= 3000 && log.size_bytes() < before);
    assert!(
        log.read(o(0), 10, o(120)).is_err(),
        "below the start is out of range"
    );
    // cleanup.policy=compact does not delete by retention.
    let mut c = log.config().clone();
    c.cleanup_policy = CleanupPolicy::COMPACT;
    c.retention_bytes = Some(0);
    log.set_config(c);
    assert_eq!(log.apply_retention(NOW).unwrap(), 0);
}

fn compact_config() -> LogConfig {
    let mut cfg = small_config();
    cfg.cleanup_policy = CleanupPolicy::COMPACT;
    cfg.min_cleanable_dirty_ratio = 0.0;
    cfg.delete_retention_ms = 1000;
    cfg
}

#[test]
fn compaction_keeps_latest_per_key_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), compact_config(), NOW).unwrap();
    let mut latest: BTreeMap<String, (i64, Option<String>)> = BTreeMap::new();
    let mut offset = 0;
    for round in 0..30 {
        let recs: Vec<(String, Option<String>)> = (0..4)
            .map(|j| {
                let k = format!("k{}", (round * 7 + j * 3) % 10);
                let v = if (round + j) % 11 == 0 {
                    None
                } else {
                    Some(format!("v{round}-{j}"))
                };
                (k, v)
            })
            .collect();
        let refs: Vec<(&str, Option<&str>, i64)> = recs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref(), NOW))
            .collect();
        let mut b = keyed_batch(&refs);
        log.append(&mut b, E1, NOW).unwrap();
        for (k, v) in recs {
            latest.insert(k, (offset, v));
            offset += 1;
        }
    }
    let end = log.log_end_offset();
    let size_before = log.size_bytes();
    assert!(log.compact(NOW).unwrap());
    assert!(log.size_bytes() < size_before);
    assert_eq!(log.log_end_offset(), end);
    let check =
        |log: &Log, latest: &BTreeMap<String, (i64, Option<String>)>, tombstones_gone: bool| {
            let recs = read_all(log);
            let offs = offsets(&recs);
            assert!(offs.windows(2).all(|w| w[0] < w[1]), "offsets increase");
            let mut seen: BTreeMap<String, (i64, Option<String>)> = BTreeMap::new();
            for r in &recs {
                let k = String::from_utf8(r.key.clone().unwrap().to_vec()).unwrap();
                let v = r
                    .value
                    .as_ref()
                    .map(|v| String::from_utf8(v.to_vec()).unwrap());
                seen.insert(k, (r.offset.0, v));
            }
            for (k, (off, v)) in latest {
                if v.is_none() && tombstones_gone {
                    // An expired tombstone may be gone, unless it sits in the active segment.
                    if let Some(s) = seen.get(k) {
                        assert_eq!(s, &(*off, None));
                    }
                    continue;
                }
                assert_eq!(seen.get(k), Some(&(*off, v.clone())), "latest of {k}");
            }
        };
    check(&log, &latest, false);
    // Within delete.retention.ms tombstones stay; after it they may go.
    log.close().unwrap();
    let mut log = Log::open(dir.path(), compact_config(), NOW).unwrap();
    check(&log, &latest, false);
    let mut b = keyed_batch(&[("k0", Some("late"), NOW)]);
    log.append(&mut b, E1, NOW).unwrap();
    latest.insert(
        "k0".into(),
        (log.log_end_offset().0 - 1, Some("late".into())),
    );
    // Roll so there is something dirty, then clean with an expired horizon.
    let mut c = log.config().clone();
    c.segment_bytes = 14;
    log.set_config(c);
    let mut b = keyed_batch(&[("zz", Some("x"), NOW)]);
    log.append(&mut b, E1, NOW).unwrap();
    latest.insert("zz".into(), (log.log_end_offset().0 - 1, Some("x".into())));
    assert!(log.compact(NOW + 10_000).unwrap());
    check(&log, &latest, true);
    let recs = read_all(&log);
    let active_base = *log.segment_base_offsets().last().unwrap();
    assert!(
        recs.iter()
            .filter(|r| r.offset < active_base)
            .all(|r| r.value.is_some()),
        "expired tombstones dropped"
    );
    // Not dirty enough: does not run.
    let mut c = log.config().clone();
    c.min_cleanable_dirty_ratio = 0.9;
    log.set_config(c);
    assert!(!log.compact(NOW + 10_000).unwrap());
    drop(log);
    let log = Log::open(dir.path(), compact_config(), NOW).unwrap();
    check(&log, &latest, true);
}

/// The states a crash can leave the compaction swap in all reopen to a whole log.
#[test]
fn interrupted_compaction_swap_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), compact_config(), NOW).unwrap();
    for i in 0..40 {
        let k = format!("k{}", i % 5);
        let v = format!("v{i}");
        let mut b = keyed_batch(&[(k.as_str(), Some(v.as_str()), NOW)]);
        log.append(&mut b, E1, NOW).unwrap();
    }
    let before = read_all(&log);
    let first = dir.path().join("00000000000000000000");
    let ext = |e: &str| first.with_extension(e);
    // State 1: cleaned copy written, old indexes deleted, rename not done.
    std::fs::copy(ext("log"), ext("log.cleaned")).unwrap();
    std::fs::write(ext("index.cleaned"), b"partial").unwrap();
    std::fs::remove_file(ext("index")).unwrap();
    std::fs::remove_file(ext("timeindex")).unwrap();
    log.close().unwrap();
    let mut log = Log::open(dir.path(), compact_config(), NOW).unwrap();
    assert_eq!(read_all(&log), before);
    assert!(!ext("log.cleaned").exists() && !ext("index.cleaned").exists());
    assert!(
        ext("index").exists() && ext("timeindex").exists(),
        "indexes rebuilt"
    );
    // A real compaction, then state 2: log renamed, indexes not yet.
    assert!(log.compact(NOW).unwrap());
    let compacted = read_all(&log);
    assert!(compacted.len() < before.len());
    log.close().unwrap();
    std::fs::rename(ext("index"), ext("index.cleaned")).unwrap();
    std::fs::rename(ext("timeindex"), ext("timeindex.cleaned")).unwrap();
    let log = Log::open(dir.path(), compact_config(), NOW).unwrap();
    assert_eq!(read_all(&log), compacted);
    assert!(ext("index").exists() && !ext("index.cleaned").exists());
}
