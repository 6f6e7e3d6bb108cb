//! Retention by time and size, and compaction: latest value per key, offsets kept,
//! tombstones expire, crash-safe swap, progress checkpoint. Retention is checked to
//! the segment at its boundaries, and compaction's output record by record (no
//! stale value may hide behind a newer one of its key).

mod common;
use common::*;
use rill_log::{CleanupPolicy, Log, LogConfig};
use std::collections::{BTreeMap, HashMap};

/// A log of six segments holding one two-record batch each (the last one
/// active), with the batches' timestamps `ts` (relative to NOW); and the size of
/// one batch. The config deletes by `retention_ms` / `retention_bytes`.
fn six_segments(
    dir: &std::path::Path,
    ts: [i64; 6],
    retention_ms: Option<u64>,
    retention_bytes: Option<u64>,
) -> (Log, u64) {
    let size = batch("b", 2, NOW).len() as u64;
    let cfg = LogConfig {
        segment_bytes: size,
        retention_ms,
        retention_bytes,
        ..small_config()
    };
    let mut log = Log::open(dir, cfg, NOW).unwrap();
    for t in ts {
        let mut b = batch("b", 2, NOW + t);
        assert_eq!(b.len() as u64, size);
        log.append(&mut b, E1, NOW).unwrap();
    }
    assert_eq!(log.segment_count(), 6);
    (log, size)
}

/// Retention by size deletes the oldest segments while the log minus the segment
/// stays >= retention.bytes: not one segment more or less, never the active one.
#[test]
fn retention_by_size_deletes_exactly_to_the_limit() {
    // (retention.bytes in batch sizes + extra bytes, segments deleted)
    for (limit_batches, extra, want) in [
        (3, 0, 3),
        (3, -1, 3),
        (3, 1, 2),
        (1, 0, 5),
        (0, 0, 5),
        (5, 1, 0),
        (6, 0, 0),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let size = batch("b", 2, NOW).len() as i64;
        let limit = (limit_batches * size + extra) as u64;
        let (mut log, size) = six_segments(dir.path(), [0; 6], None, Some(limit));
        assert_eq!(log.size_bytes(), 6 * size);
        let deleted = log.apply_retention(NOW).unwrap();
        assert_eq!(deleted, want, "retention.bytes={limit}, segments of {size}");
        assert_eq!(log.log_start_offset(), o(2 * want as i64));
        assert_eq!(log.size_bytes(), (6 - want as u64) * size);
        assert!(log.size_bytes() >= limit || log.segment_count() == 1);
        assert_eq!(read_all(&log).len(), 2 * (6 - want));
    }
}

/// Retention by time deletes the oldest segments while their largest timestamp is
/// older than now - retention.ms (strictly), and only a prefix: an old segment
/// after a young one stays. Never the active one.
#[test]
fn retention_by_time_deletes_the_expired_prefix() {
    let ts = [100, 300, 200, 500, 50, 10];
    // (now - NOW with retention.ms = 1000, segments deleted)
    for (now, want) in [
        (1000, 0),
        (1100, 0),
        (1101, 1),
        (1300, 1),
        (1301, 3),
        (2000, 5),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = six_segments(dir.path(), ts, Some(1000), None);
        let deleted = log.apply_retention(NOW + now).unwrap();
        assert_eq!(deleted, want, "at NOW + {now}");
        assert_eq!(log.log_start_offset(), o(2 * want as i64));
        assert_eq!(log.segment_count(), 6 - want);
    }
}

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

/// (offset, key, value) of every record appended, in order.
type Appended = Vec<(i64, String, Option<String>)>;

/// Every record of the log as (offset, key, value), keys and values as text.
fn keys_and_values(log: &Log) -> Appended {
    read_all(log)
        .iter()
        .map(|r| {
            let s = |b: &bytes::Bytes| String::from_utf8(b.to_vec()).unwrap();
            (
                r.offset.0,
                s(r.key.as_ref().unwrap()),
                r.value.as_ref().map(s),
            )
        })
        .collect()
}

/// The log's records must be exactly what compaction leaves of `appended` when
/// every non-active segment was cleaned at the tombstone `horizon` (all records
/// here carry the timestamp NOW): in the non-active segments, the last record of
/// each key there, minus tombstones older than the horizon; the active segment
/// whole. Compared record by record, so a stale value cannot hide.
fn check_exact(log: &Log, appended: &Appended, horizon: i64) {
    let active = log.segment_base_offsets().last().unwrap().0;
    check_cleaned_below(log, appended, horizon, active);
}

/// As [`check_exact`], when the segments below `active` were cleaned and
/// everything from `active` on was not.
fn check_cleaned_below(log: &Log, appended: &Appended, horizon: i64, active: i64) {
    let mut last: HashMap<&str, i64> = HashMap::new();
    for (off, k, _) in appended.iter().filter(|r| r.0 < active) {
        last.insert(k, *off);
    }
    let want: Appended = appended
        .iter()
        .filter(|(off, k, v)| {
            *off >= active || (last[k.as_str()] == *off && (v.is_some() || NOW >= horizon))
        })
        .cloned()
        .collect();
    let got = keys_and_values(log);
    assert_eq!(
        got, want,
        "records after compaction (active segment at {active})"
    );
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
    let mut appended: Appended = Vec::new();
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
            latest.insert(k.clone(), (offset, v.clone()));
            appended.push((offset, k, v));
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
    check_exact(&log, &appended, NOW - 1000);
    // Within delete.retention.ms tombstones stay; after it they may go.
    log.close().unwrap();
    let mut log = Log::open(dir.path(), compact_config(), NOW).unwrap();
    check(&log, &latest, false);
    check_exact(&log, &appended, NOW - 1000);
    let mut b = keyed_batch(&[("k0", Some("late"), NOW)]);
    log.append(&mut b, E1, NOW).unwrap();
    latest.insert(
        "k0".into(),
        (log.log_end_offset().0 - 1, Some("late".into())),
    );
    appended.push((log.log_end_offset().0 - 1, "k0".into(), Some("late".into())));
    // Roll so there is something dirty, then clean with an expired horizon.
    let mut c = log.config().clone();
    c.segment_bytes = 14;
    log.set_config(c);
    let mut b = keyed_batch(&[("zz", Some("x"), NOW)]);
    log.append(&mut b, E1, NOW).unwrap();
    latest.insert("zz".into(), (log.log_end_offset().0 - 1, Some("x".into())));
    appended.push((log.log_end_offset().0 - 1, "zz".into(), Some("x".into())));
    assert!(log.compact(NOW + 10_000).unwrap());
    check(&log, &latest, true);
    check_exact(&log, &appended, NOW + 9000);
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
    check_exact(&log, &appended, NOW + 9000);
}

/// A tombstone stays for delete.retention.ms while the older value of its key goes
/// at once; once expired it goes too, and the key stays deleted even when its
/// older value sat in a segment cleaned before the tombstone came. Rolls happen
/// by segment.ms through `tick`.
#[test]
fn tombstone_grace_and_a_deleted_key_stays_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        segment_ms: 1000,
        ..compact_config()
    };
    let mut log = Log::open(dir.path(), cfg, NOW).unwrap();
    let append = |log: &mut Log, recs: &[(&str, Option<&str>, i64)], now: i64| {
        let mut b = keyed_batch(recs);
        log.append(&mut b, E1, now).unwrap();
    };
    let t = |off: i64, k: &str, v: Option<&str>| (off, k.to_string(), v.map(String::from));
    // Segment 0: the values, cleaned once (nothing to drop).
    append(
        &mut log,
        &[("a", Some("a1"), NOW), ("b", Some("b1"), NOW)],
        NOW,
    );
    log.tick(NOW + 1000).unwrap();
    assert!(log.compact(NOW + 1000).unwrap());
    assert_eq!(log.log_start_offset(), o(0));
    // Segment 1: a young tombstone for a, an old one for b.
    append(
        &mut log,
        &[("a", None, NOW + 1000), ("b", None, NOW - 5000)],
        NOW + 1000,
    );
    log.tick(NOW + 2000).unwrap();
    append(&mut log, &[("c", Some("c1"), NOW + 2000)], NOW + 2000);
    assert!(log.compact(NOW + 2000).unwrap());
    // b's tombstone expired: b is gone whole. a's is 1000 ms old, not older than
    // delete.retention.ms: it stays, and a's older value is gone.
    assert_eq!(
        keys_and_values(&log),
        vec![t(2, "a", None), t(4, "c", Some("c1"))]
    );
    // Once a's tombstone has expired too, a is gone whole.
    log.tick(NOW + 3000).unwrap();
    append(&mut log, &[("d", Some("d1"), NOW + 3000)], NOW + 3000);
    assert!(log.compact(NOW + 3001).unwrap());
    assert_eq!(
        keys_and_values(&log),
        vec![t(4, "c", Some("c1")), t(5, "d", Some("d1"))]
    );
}

/// The states a crash can leave the compaction swap in all reopen to a whole log.
#[test]
fn interrupted_compaction_swap_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = keyed_log(dir.path());
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

/// Appends `n` single-record batches of keys k0..k4 with values v{from}..,
/// noting them in `appended`.
fn append_keyed(log: &mut Log, appended: &mut Appended, from: usize, n: usize) {
    for i in from..from + n {
        let (k, v) = (format!("k{}", i % 5), format!("v{i}"));
        let mut b = keyed_batch(&[(k.as_str(), Some(v.as_str()), NOW)]);
        let offset = log.log_end_offset().0;
        log.append(&mut b, E1, NOW).unwrap();
        appended.push((offset, k, Some(v)));
    }
}

/// A compacted log in `dir` with 40 single-record batches of keys k0..k4
/// (several segments), and what was appended.
fn keyed_log(dir: &std::path::Path) -> (Log, Appended) {
    let mut log = Log::open(dir, compact_config(), NOW).unwrap();
    let mut appended = Appended::new();
    append_keyed(&mut log, &mut appended, 0, 40);
    (log, appended)
}

/// Whether a `.cleaned` file is left in `dir`.
fn cleaned_files(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cleaned"))
        .collect()
}

/// A compaction run reads the segments and writes their copies without the
/// log (the broker holds the log's lock only to plan and to swap): appends
/// and rolls between the plan and the swap all stay, and below the plan's
/// boundary the log holds exactly what compaction leaves. One run at a time.
#[test]
fn appends_between_a_compaction_plan_and_its_swap_stay() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut appended) = keyed_log(dir.path());
    assert!(log.segment_count() > 2, "{}", log.segment_count());
    let boundary = log.segment_base_offsets().last().unwrap().0;
    let run = log.plan_compaction(NOW).expect("dirty enough to run");
    assert!(log.plan_compaction(NOW).is_none(), "one run at a time");
    let segments = log.segment_count();
    append_keyed(&mut log, &mut appended, 40, 30);
    let cleaned = run.clean().unwrap();
    append_keyed(&mut log, &mut appended, 70, 30);
    assert!(log.segment_count() > segments, "the appends rolled");
    let end = log.log_end_offset();
    assert!(log.finish_compaction(cleaned).unwrap(), "swapped in");
    assert_eq!(log.log_end_offset(), end);
    check_cleaned_below(&log, &appended, NOW - 1000, boundary);
    assert!(cleaned_files(dir.path()).is_empty());
    // The run is over: the next one runs, and cleans up to the active segment.
    assert!(log.plan_compaction(NOW).is_some());
    assert!(log.compact(NOW).unwrap());
    check_exact(&log, &appended, NOW - 1000);
    drop(log);
    let log = Log::open(dir.path(), compact_config(), NOW).unwrap();
    check_exact(&log, &appended, NOW - 1000);
}

/// A run whose segments changed under it (retention deleted one, or a
/// truncation cut into one) swaps nothing in: every record stays, no cleaned
/// copy is left behind, and the next run cleans.
#[test]
fn a_compaction_run_is_dropped_when_its_segments_changed() {
    for truncate in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, mut appended) = keyed_log(dir.path());
        let cleaned = log.plan_compaction(NOW).unwrap().clean().unwrap();
        if truncate {
            let cut = log.segment_base_offsets()[1].0 + 1;
            log.truncate_to(o(cut)).unwrap();
            appended.retain(|r| r.0 < cut);
        } else {
            let mut c = log.config().clone();
            c.cleanup_policy = CleanupPolicy::COMPACT_DELETE;
            c.retention_ms = Some(0);
            log.set_config(c);
            assert!(log.apply_retention(NOW + 1).unwrap() > 0);
            let start = log.log_start_offset().0;
            appended.retain(|r| r.0 >= start);
            let mut c = log.config().clone();
            c.cleanup_policy = CleanupPolicy::COMPACT;
            c.retention_ms = None;
            log.set_config(c);
            append_keyed(&mut log, &mut appended, 40, 40);
        }
        let before = read_all(&log);
        assert!(
            !log.finish_compaction(cleaned).unwrap(),
            "a run over changed segments was swapped in (truncate: {truncate})"
        );
        assert_eq!(read_all(&log), before);
        assert!(
            cleaned_files(dir.path()).is_empty(),
            "{:?}",
            cleaned_files(dir.path())
        );
        assert!(
            log.compact(NOW).unwrap(),
            "the next run (truncate: {truncate})"
        );
        check_exact(&log, &appended, NOW - 1000);
    }
}

/// A run still going on a log that was closed (a restart, a topic deleted
/// and made again) does not touch the copies of a run on the log opened
/// again on the same directory: each run names its own copies.
#[test]
fn a_run_on_a_closed_log_leaves_the_reopened_logs_run_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (log, appended) = keyed_log(dir.path());
    let stale = log.plan_compaction(NOW).unwrap();
    log.close().unwrap();
    let mut log = Log::open(dir.path(), compact_config(), NOW).unwrap();
    let fresh = log.plan_compaction(NOW).unwrap();
    let fresh = fresh.clean().unwrap();
    // The stale run writes its copies after the fresh one, then its log is
    // gone: its copies are dropped.
    drop(stale.clean().unwrap());
    assert!(log.finish_compaction(fresh).unwrap());
    check_exact(&log, &appended, NOW - 1000);
    assert!(
        cleaned_files(dir.path()).is_empty(),
        "{:?}",
        cleaned_files(dir.path())
    );
}

/// A truncation that cuts a segment a run is reading makes the run fail or
/// its swap be refused, and the failure is seen as the log's change.
#[test]
fn a_truncation_under_a_run_is_told_apart_from_damage() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut appended) = keyed_log(dir.path());
    let run = log.plan_compaction(NOW).unwrap();
    let cut = log.segment_base_offsets()[1].0 + 1;
    log.truncate_to(o(cut)).unwrap();
    appended.retain(|r| r.0 < cut);
    match run.clean() {
        Err(failed) => assert!(log.changed_since(&failed), "{:?}", failed.error),
        Ok(cleaned) => assert!(!log.finish_compaction(cleaned).unwrap()),
    }
    assert!(log.compact(NOW).unwrap());
    check_exact(&log, &appended, NOW - 1000);
}

/// The swap fsyncs the directory once to delete the old indexes, once per
/// replaced segment (in offset order, so no later copy is on disk before an
/// earlier one) and once to rename the indexes, plus once for the cleaner
/// checkpoint: not three times per segment, under the log's lock.
#[test]
fn a_swap_of_many_segments_fsyncs_the_directory_once_per_segment_and_twice_more() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), compact_config(), NOW).unwrap();
    let mut appended = Appended::new();
    // Every other record overwrites key x: each segment keeps its unique keys
    // and loses its x, so every cleaned segment is replaced, none deleted.
    for i in 0..100 {
        let k = if i % 2 == 0 {
            "x".to_string()
        } else {
            format!("u{i}")
        };
        let v = format!("v{i}");
        let mut b = keyed_batch(&[(k.as_str(), Some(v.as_str()), NOW)]);
        let offset = log.log_end_offset().0;
        log.append(&mut b, E1, NOW).unwrap();
        appended.push((offset, k, Some(v)));
    }
    let sealed = log.segment_count() - 1;
    assert!(sealed >= 4, "{sealed} sealed segments");
    let boundary = log.segment_base_offsets().last().unwrap().0;
    let cleaned = log.plan_compaction(NOW).unwrap().clean().unwrap();
    let before = rill_log::checkpoint::dir_fsyncs_on_this_thread();
    assert!(log.finish_compaction(cleaned).unwrap());
    let fsyncs = rill_log::checkpoint::dir_fsyncs_on_this_thread() - before;
    assert_eq!(log.segment_count(), sealed + 1, "no segment was emptied");
    assert!(
        (4..=sealed as u64 + 3).contains(&fsyncs),
        "{fsyncs} directory fsyncs to swap {sealed} segments"
    );
    check_cleaned_below(&log, &appended, NOW - 1000, boundary);
    assert!(cleaned_files(dir.path()).is_empty());
    // And reopened, the same.
    log.close().unwrap();
    let log = Log::open(dir.path(), compact_config(), NOW).unwrap();
    check_cleaned_below(&log, &appended, NOW - 1000, boundary);
}
