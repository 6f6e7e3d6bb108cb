//! Durability settings, observed: fsyncs happen exactly where `flush.messages` and
//! `flush.ms` say (and on every roll, and nowhere else by default), counted through
//! `Log::flush_count` and the per-segment `Log::synced_lengths`; and every record
//! acknowledged after an fsync survives a simulated power loss. The loss is
//! simulated as LazyFS-style tests do: each segment file is cut to its length at
//! its last fsync and the active segment's unsynced index files are dropped, then
//! the log is reopened. (A SIGKILL, as in `crash.rs`, keeps the page cache, so it
//! cannot tell a real flush from a no-op one; this test can.)

mod common;
use common::*;
use rill_log::segment::{INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_path};
use rill_log::{Log, LogConfig};
use rill_proto::{BatchBuilder, Compression, Offset, Record};
use std::path::Path;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 1 << 20,
        index_interval_bytes: 64,
        ..LogConfig::default()
    }
}

/// The value written at `offset`; checked for every record that must survive.
fn value_at(offset: i64) -> String {
    format!("value-{offset}-{}", "y".repeat((offset % 13) as usize))
}

/// Appends `n` records whose values are `value_at(their offset)`.
fn append(log: &mut Log, n: i64, now: i64) -> rill_log::AppendInfo {
    let base = log.log_end_offset().0;
    let mut b = BatchBuilder::new(Compression::None);
    for i in 0..n {
        b.push(&Record::from_value(value_at(base + i), NOW + base + i));
    }
    let mut bytes = b.build().to_vec();
    let info = log.append(&mut bytes, E1, now).unwrap();
    assert_eq!(info.first_offset.0, base);
    info
}

fn file_len(dir: &Path, base: Offset) -> u64 {
    std::fs::metadata(segment_path(dir, base, LOG_SUFFIX))
        .unwrap()
        .len()
}

/// Checks the synced length of every segment against its file: the segments
/// before the active one are wholly synced; the active one is wholly synced
/// exactly when `active_synced` says, and otherwise has unsynced bytes.
fn check_synced(log: &Log, active_synced: bool, what: &str) {
    let synced = log.synced_lengths();
    let (active, closed) = synced.split_last().unwrap();
    for &(base, len) in closed {
        assert_eq!(
            len,
            file_len(log.dir(), base),
            "{what}: closed segment {base} fully synced"
        );
    }
    let active_len = file_len(log.dir(), active.0);
    if active_synced {
        assert_eq!(active.1, active_len, "{what}: active segment synced");
    } else {
        assert!(
            active.1 < active_len,
            "{what}: active segment has unsynced bytes ({} of {active_len} synced)",
            active.1
        );
    }
}

/// Drops the log without closing it, then loses every byte not fsynced: each
/// segment file is cut to its synced length; the active segment's indexes (written
/// on flush but never fsynced) are deleted. Then reopens.
fn power_loss(log: Log, config: LogConfig, now: i64) -> Log {
    let dir = log.dir().to_path_buf();
    let synced = log.synced_lengths();
    drop(log);
    for &(base, len) in &synced {
        let path = segment_path(&dir, base, LOG_SUFFIX);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        assert!(f.metadata().unwrap().len() >= len);
        f.set_len(len).unwrap();
    }
    let active = synced.last().unwrap().0;
    for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
        std::fs::remove_file(segment_path(&dir, active, suffix)).unwrap();
    }
    Log::open(&dir, config, now).unwrap()
}

/// The log holds exactly offsets `0..end`, each with its value.
fn check_contents(log: &Log, end: i64) {
    assert_eq!(log.log_end_offset().0, end, "log end after the power loss");
    let recs = read_all(log);
    assert_eq!(offsets(&recs), (0..end).collect::<Vec<_>>());
    for r in recs {
        assert_eq!(
            r.value.as_deref(),
            Some(value_at(r.offset.0).as_bytes()),
            "record {} intact",
            r.offset
        );
    }
}

/// Records per append: sums cross the flush.messages threshold at every position.
const COUNTS: [i64; 16] = [1, 2, 1, 3, 1, 1, 4, 5, 1, 2, 6, 1, 1, 1, 2, 3];

/// flush.messages=N: an append fsyncs when the records since the last fsync reach
/// N (and a roll fsyncs the segment it seals), nowhere else. With segments small
/// enough to roll, then a power loss: the log comes back to exactly the last fsync.
#[test]
fn flush_messages_fsyncs_every_n_records_and_that_data_survives() {
    const N: i64 = 5;
    for segment_bytes in [1 << 20, 700] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = LogConfig {
            flush_messages: Some(N as u64),
            segment_bytes,
            ..config()
        };
        let mut log = Log::open(dir.path(), cfg.clone(), NOW).unwrap();
        let (mut unflushed, mut flushes, mut durable_end, mut rolls) = (0i64, 0u64, 0i64, 0);
        for (i, &n) in COUNTS.iter().cycle().take(60).enumerate() {
            let segments = log.segment_count();
            let end_before = log.log_end_offset().0;
            let info = append(&mut log, n, NOW);
            // A roll (seen as a new segment: the segmentation is input) seals and
            // fsyncs the old active segment and restarts the count.
            if log.segment_count() > segments {
                rolls += 1;
                flushes += 1;
                unflushed = 0;
                durable_end = end_before;
            }
            unflushed += n;
            let flushed = unflushed >= N;
            if flushed {
                flushes += 1;
                unflushed = 0;
                durable_end = info.last_offset.0 + 1;
            }
            let what = format!("segment.bytes={segment_bytes}, append {i} of {n} records");
            assert_eq!(log.flush_count(), flushes, "{what}: fsyncs");
            check_synced(&log, flushed, &what);
        }
        assert_eq!(rolls > 0, segment_bytes < 1 << 20, "rolls happened");
        assert!(log.log_end_offset().0 > durable_end, "some data unsynced");
        let log = power_loss(log, cfg, NOW);
        check_contents(&log, durable_end);
    }
}

/// No flush.* setting: appends never fsync (only rolls and close do), so a power
/// loss takes everything appended since the last roll.
#[test]
fn default_config_fsyncs_on_roll_only() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        segment_bytes: 700,
        ..config()
    };
    let mut log = Log::open(dir.path(), cfg.clone(), NOW).unwrap();
    let mut rolls = 0;
    for &n in COUNTS.iter().cycle().take(40) {
        let segments = log.segment_count();
        append(&mut log, n, NOW);
        rolls += log.segment_count() - segments;
        assert_eq!(log.flush_count(), rolls as u64, "fsyncs are the rolls");
        check_synced(&log, false, "default config");
    }
    assert!(rolls > 1);
    let active_base = log.segment_base_offsets().last().unwrap().0;
    let log = power_loss(log, cfg, NOW);
    check_contents(&log, active_base);
}

/// flush.ms: an append or a tick fsyncs once the oldest unflushed write is
/// flush.ms old, never earlier, and a tick with nothing unflushed does not fsync.
/// `now` is an argument of the log, so no test sleeps.
#[test]
fn flush_ms_fsyncs_once_the_oldest_unflushed_write_is_old_enough() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        flush_ms: Some(100),
        ..config()
    };
    let mut log = Log::open(dir.path(), cfg.clone(), NOW).unwrap();
    enum Step {
        Append(i64),
        Tick(i64),
    }
    use Step::*;
    // (step at NOW + t, whether it fsyncs)
    let steps = [
        (Append(0), false),
        (Append(50), false),
        (Tick(99), false),
        (Tick(100), true),
        (Tick(500), false), // nothing unflushed
        (Append(600), false),
        (Tick(650), false),
        (Append(699), false),
        (Append(700), true), // 100 ms after the append at 600
        (Append(701), false),
        (Append(800), false),
        (Tick(801), true),
        (Append(2000), false),
    ];
    let (mut flushes, mut durable_end) = (0, 0);
    for (i, (step, fsyncs)) in steps.iter().enumerate() {
        match *step {
            Append(t) => {
                append(&mut log, 2, NOW + t);
            }
            Tick(t) => log.tick(NOW + t).unwrap(),
        }
        if *fsyncs {
            flushes += 1;
            durable_end = log.log_end_offset().0;
        }
        assert_eq!(log.flush_count(), flushes, "step {i}: fsyncs");
        let synced = *fsyncs || log.log_end_offset().0 == durable_end;
        check_synced(&log, synced, &format!("step {i}"));
    }
    assert_eq!(durable_end, 14);
    let log = power_loss(log, cfg, NOW + 3000);
    check_contents(&log, durable_end);
}

/// flush.messages=1: every acknowledged record is on stable storage, across rolls
/// and across repeated power losses with appends in between.
#[test]
fn acknowledged_records_survive_repeated_power_losses() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        flush_messages: Some(1),
        segment_bytes: 900,
        ..config()
    };
    let mut log = Log::open(dir.path(), cfg.clone(), NOW).unwrap();
    let mut acked = 0;
    for round in 0..4 {
        for &n in COUNTS.iter().skip(round) {
            let info = append(&mut log, n, NOW);
            acked = info.last_offset.0 + 1;
        }
        log = power_loss(log, cfg.clone(), NOW);
        check_contents(&log, acked);
    }
    assert!(log.segment_count() > 3, "the losses crossed rolls");
}

/// `Log::append_may_sync` (what lets a broker append on an async task) says
/// "no" only for appends that then neither roll nor flush: checked against
/// what each of 600 appends of varied sizes did, with `segment.bytes` small
/// enough that rolls happen often and a `flush.messages` that flushes twice
/// (the check counts an append's bytes as its records: it cannot know how
/// many records they hold, so with `flush.messages` it says yes early).
#[test]
fn an_append_said_not_to_sync_neither_rolls_nor_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 2 << 10,
        flush_messages: Some(2_000),
        ..config()
    };
    let mut log = Log::open(dir.path(), config, NOW).unwrap();
    let (mut quiet, mut synced) = (0, 0);
    for i in 0..600 {
        let b = batch(&format!("r{i}"), 1 + (i * 7) % 13, NOW);
        let may = log.append_may_sync(b.len() as u64, NOW);
        let before = (log.segment_count(), log.flush_count());
        log.append(&b, E1, NOW).unwrap();
        let did = (log.segment_count(), log.flush_count()) != before;
        assert!(
            may || !did,
            "append {i} ({} bytes) was said not to sync, but it rolled or flushed",
            b.len()
        );
        quiet += usize::from(!may);
        synced += usize::from(did);
    }
    // Both kinds occurred, and most appends were left to the caller's task.
    assert!(synced >= 20, "{synced} appends synced");
    assert!(quiet >= 300, "{quiet} appends were said not to sync");
}

/// The clock's part: `segment.ms` and `flush.ms` are due at their bound, not
/// a millisecond before, for `append_may_sync` as for the append itself.
#[test]
fn append_may_sync_follows_segment_ms_and_flush_ms() {
    for (segment_ms, flush_ms) in [(1_000, None), (u64::MAX, Some(1_000))] {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            segment_ms,
            flush_ms,
            ..config()
        };
        let mut log = Log::open(dir.path(), config, NOW).unwrap();
        log.append(&batch("a", 2, NOW), E1, NOW).unwrap();
        let b = batch("b", 2, NOW);
        let len = b.len() as u64;
        assert!(!log.append_may_sync(len, NOW + 999));
        assert!(log.append_may_sync(len, NOW + 1_000));
        let before = (log.segment_count(), log.flush_count());
        log.append(&b, E1, NOW + 1_000).unwrap();
        assert_ne!((log.segment_count(), log.flush_count()), before);
    }
}

/// An empty segment takes the first batch of an append whatever its size,
/// then rolls for the next: so an append of several batches that do not fit
/// together in a new segment syncs, and `append_may_sync` must say so.
#[test]
fn append_may_sync_counts_an_append_overflowing_an_empty_segment() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 1 << 10,
        ..config()
    };
    let mut log = Log::open(dir.path(), config, NOW).unwrap();
    let bytes: Vec<u8> = (0..8)
        .flat_map(|i| batch(&format!("m{i}"), 10, NOW))
        .collect();
    assert!(bytes.len() > 1 << 10, "{} bytes", bytes.len());
    assert!(log.append_may_sync(bytes.len() as u64, NOW));
    let before = (log.segment_count(), log.flush_count());
    log.append(&bytes, E1, NOW).unwrap();
    assert_ne!((log.segment_count(), log.flush_count()), before);
}
