//! Transactions in the log: the first unstable offset, the aborted index, and
//! both through reopen, truncation, retention and compaction.

mod common;
use bytes::Bytes;
use common::*;
use rill_log::{AbortedTxn, CleanupPolicy, Log, LogConfig};
use rill_proto::control::{Marker, MarkerKind};
use rill_proto::{BatchBuilder, Compression, ProducerId, Record};

/// A transactional batch of `n` keyed records of producer `pid` (epoch 0),
/// sequences from `seq`.
fn txn_batch(pid: i64, seq: i32, n: usize, key: &str) -> Vec<u8> {
    let mut b = BatchBuilder::new(Compression::None)
        .producer(ProducerId(pid), 0, seq)
        .transactional();
    for i in 0..n {
        b.push(&Record {
            key: Some(Bytes::from(format!("{key}{i}"))),
            value: Some(Bytes::from(format!("p{pid}-{}", seq as usize + i))),
            headers: Vec::new(),
            timestamp_ms: NOW,
        });
    }
    b.build().to_vec()
}

fn end(log: &mut Log, pid: i64, kind: MarkerKind) -> i64 {
    let m = Marker {
        kind,
        coordinator_epoch: 0,
    };
    log.append_marker(ProducerId(pid), 0, m, E1, NOW)
        .unwrap()
        .first_offset
        .0
}

fn aborted(pid: i64, first: i64, last: i64) -> AbortedTxn {
    AbortedTxn {
        producer_id: pid,
        first_offset: o(first),
        last_offset: o(last),
    }
}

#[test]
fn open_transactions_and_aborts_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    log.append(&mut batch("plain", 2, NOW), E1, NOW).unwrap(); // 0..=1
    log.append(&mut txn_batch(5, 0, 3, "a"), E1, NOW).unwrap(); // 2..=4
    log.append(&mut txn_batch(6, 0, 2, "b"), E1, NOW).unwrap(); // 5..=6
    assert_eq!(log.first_unstable_offset(), Some(o(2)));
    assert_eq!(end(&mut log, 5, MarkerKind::Abort), 7);
    assert_eq!(log.first_unstable_offset(), Some(o(5)));
    log.append(&mut txn_batch(5, 3, 1, "a"), E1, NOW).unwrap(); // 8: a new txn of 5
    assert_eq!(log.open_transactions(), vec![(5, o(8)), (6, o(5))]);
    assert_eq!(
        log.aborted_transactions(o(0), o(100)),
        vec![aborted(5, 2, 7)]
    );
    drop(log);

    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    assert_eq!(log.first_unstable_offset(), Some(o(5)));
    assert_eq!(log.open_transactions(), vec![(5, o(8)), (6, o(5))]);
    assert_eq!(
        log.aborted_transactions(o(0), o(100)),
        vec![aborted(5, 2, 7)]
    );
    assert_eq!(end(&mut log, 6, MarkerKind::Commit), 9);
    assert_eq!(end(&mut log, 5, MarkerKind::Abort), 10);
    assert_eq!(log.first_unstable_offset(), None);
    assert_eq!(
        log.aborted_transactions(o(8), o(11)),
        vec![aborted(5, 8, 10)],
        "only the aborts overlapping the range"
    );
    // Markers are records of the log (offsets), never shown as data.
    assert_eq!(log.log_end_offset(), o(11));
}

#[test]
fn a_marker_at_a_newer_epoch_fences_the_producers_older_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    log.append(&mut txn_batch(5, 0, 1, "a"), E1, NOW).unwrap();
    // The coordinator timed the transaction out: abort at epoch 1.
    let m = Marker {
        kind: MarkerKind::Abort,
        coordinator_epoch: 0,
    };
    log.append_marker(ProducerId(5), 1, m, E1, NOW).unwrap();
    let err = log
        .append(&mut txn_batch(5, 1, 1, "a"), E1, NOW)
        .unwrap_err()
        .to_string();
    assert!(err.contains("fenced"), "{err}");
}

#[test]
fn a_fenced_producers_late_batch_is_refused_where_it_never_wrote_before() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    // The coordinator aborted producer 5's transaction at epoch 1 before its
    // first batch (epoch 0) reached this partition.
    let m = Marker {
        kind: MarkerKind::Abort,
        coordinator_epoch: 0,
    };
    log.append_marker(ProducerId(5), 1, m, E1, NOW).unwrap();
    let err = log
        .append(&mut txn_batch(5, 0, 1, "a"), E1, NOW)
        .unwrap_err()
        .to_string();
    assert!(err.contains("fenced"), "{err}");
    assert_eq!(
        log.first_unstable_offset(),
        None,
        "no transaction left open"
    );
}

#[test]
fn truncation_forgets_what_it_removed_and_rebuilds_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    log.append(&mut txn_batch(1, 0, 2, "a"), E1, NOW).unwrap(); // 0..=1
    end(&mut log, 1, MarkerKind::Abort); // 2
    log.append(&mut txn_batch(2, 0, 2, "b"), E1, NOW).unwrap(); // 3..=4
    end(&mut log, 2, MarkerKind::Abort); // 5
    log.truncate_to(o(5)).unwrap();
    // The second abort's marker is gone: its transaction is open again.
    assert_eq!(
        log.aborted_transactions(o(0), o(100)),
        vec![aborted(1, 0, 2)]
    );
    assert_eq!(log.first_unstable_offset(), Some(o(3)));
    drop(log);
    let log = Log::open(dir.path(), small_config(), NOW).unwrap();
    assert_eq!(
        log.aborted_transactions(o(0), o(100)),
        vec![aborted(1, 0, 2)]
    );
}

#[test]
fn retention_drops_aborts_below_the_start_and_compaction_keeps_markers() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config();
    cfg.retention_ms = Some(1000);
    let mut log = Log::open(dir.path(), cfg.clone(), NOW).unwrap();
    log.append(&mut txn_batch(1, 0, 1, "a"), E1, NOW).unwrap();
    end(&mut log, 1, MarkerKind::Abort);
    // Fill past a few segments with later data, then age the first out.
    for i in 0..40 {
        log.append(&mut batch(&format!("x{i}"), 3, NOW), E1, NOW)
            .unwrap();
    }
    assert_eq!(log.aborted_transactions(o(0), o(1000)).len(), 1);
    assert!(log.apply_retention(NOW + 5_000).unwrap() > 0);
    assert!(log.log_start_offset() > o(1));
    assert_eq!(log.aborted_transactions(o(0), o(1000)), vec![]);
    drop(log);
    let log = Log::open(dir.path(), cfg, NOW).unwrap();
    assert_eq!(log.aborted_transactions(o(0), o(1000)), vec![], "persisted");

    // Compaction: the aborted transaction's records and its marker stay.
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        cleanup_policy: CleanupPolicy::COMPACT,
        min_cleanable_dirty_ratio: 0.0,
        ..small_config()
    };
    let mut log = Log::open(dir.path(), cfg.clone(), NOW).unwrap();
    log.append(&mut txn_batch(1, 0, 3, "k"), E1, NOW).unwrap(); // 0..=2
    end(&mut log, 1, MarkerKind::Abort); // 3
    for _ in 0..30 {
        log.append(
            &mut keyed_batch(&[("k0", Some("later"), NOW), ("k1", Some("later"), NOW)]),
            E1,
            NOW,
        )
        .unwrap();
    }
    log.compact(NOW).unwrap();
    let offsets_left = offsets(&read_all(&log));
    assert_eq!(&offsets_left[..4], &[0, 1, 2, 3], "{offsets_left:?}");
    drop(log);
    let log = Log::open(dir.path(), cfg, NOW).unwrap();
    assert_eq!(
        log.aborted_transactions(o(0), o(1000)),
        vec![aborted(1, 0, 3)]
    );
}
