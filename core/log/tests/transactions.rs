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
fn retention_drops_aborts_below_the_start() {
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
}

/// Compaction as Kafka's cleaner does it with transactions: aborted records
/// go and never hide a committed record of their key, committed ones are
/// compacted by key (a partly kept batch stays transactional), a marker stays
/// while its transaction has records and then until `delete.retention.ms`.
#[test]
fn compaction_drops_aborted_records_compacts_committed_ones_and_markers_last() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        cleanup_policy: CleanupPolicy::COMPACT,
        min_cleanable_dirty_ratio: 0.0,
        ..small_config()
    };
    let mut log = Log::open(dir.path(), cfg.clone(), NOW).unwrap();
    log.append(&mut txn_batch(1, 0, 2, "c"), E1, NOW).unwrap(); // 0..=1: c0 c1
    assert_eq!(end(&mut log, 1, MarkerKind::Commit), 2);
    log.append(&mut txn_batch(2, 0, 2, "c"), E1, NOW).unwrap(); // 3..=4: c0 c1
    assert_eq!(end(&mut log, 2, MarkerKind::Abort), 5);
    log.append(&mut txn_batch(3, 0, 2, "d"), E1, NOW).unwrap(); // 6..=7: d0 d1
    assert_eq!(end(&mut log, 3, MarkerKind::Commit), 8);
    log.append(&mut txn_batch(4, 0, 2, "e"), E1, NOW).unwrap(); // 9..=10: e0 e1
    assert_eq!(end(&mut log, 4, MarkerKind::Commit), 11);
    let fill = |log: &mut Log| {
        for _ in 0..30 {
            log.append(
                &mut keyed_batch(&[("d0", Some("later"), NOW), ("d1", Some("later"), NOW)]),
                E1,
                NOW,
            )
            .unwrap();
        }
        log.append(&mut keyed_batch(&[("e1", Some("later"), NOW)]), E1, NOW)
            .unwrap();
    };
    fill(&mut log);
    assert!(log.compact(NOW).unwrap());
    let left = read_all(&log);
    let value = |off: i64| {
        left.iter()
            .find(|r| r.offset.0 == off)
            .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
    };
    assert_eq!(
        &offsets(&left)[..6],
        &[0, 1, 2, 5, 8, 9],
        "committed c0 c1 and their marker; the aborted records gone, their \
         marker kept (young); d0 d1 compacted away, their marker kept (young); \
         e0 kept, e1 compacted"
    );
    assert_eq!(
        value(0).as_deref(),
        Some("p1-0"),
        "an aborted c0 hid nothing"
    );
    assert_eq!(value(1).as_deref(), Some("p1-1"));
    let e_batch = read_batch_header(&log, o(9));
    assert!(
        e_batch.is_transactional() && e_batch.base_offset == o(9) && e_batch.last_offset() == o(10),
        "a partly kept batch keeps its range and stays transactional: {e_batch:?}"
    );
    assert_eq!(log.first_unstable_offset(), None);

    // Past delete.retention.ms the markers of transactions with nothing left go.
    fill(&mut log);
    assert!(log.compact(NOW + 2 * 24 * 3600 * 1000).unwrap());
    let left = offsets(&read_all(&log));
    assert_eq!(
        &left[..5],
        &[0, 1, 2, 9, 11],
        "only the markers of transactions with records left stay"
    );
    drop(log);
    let log = Log::open(dir.path(), cfg.clone(), NOW).unwrap();
    assert_eq!(log.first_unstable_offset(), None, "no transaction reopens");
    assert_eq!(log.open_transactions(), vec![]);
    assert_eq!(&offsets(&read_all(&log))[..5], &[0, 1, 2, 9, 11]);

    // An open transaction holds the cleaner back: nothing from its first
    // record on is cleaned until its marker is written.
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), cfg, NOW).unwrap();
    log.append(&mut txn_batch(7, 0, 1, "d"), E1, NOW).unwrap(); // 0: d0, open
    fill(&mut log);
    assert!(
        !log.compact(NOW).unwrap(),
        "nothing below the first unstable offset"
    );
    let before = read_all(&log).len();
    assert_eq!(end(&mut log, 7, MarkerKind::Abort), before as i64);
    assert!(log.compact(NOW).unwrap());
    let left = read_all(&log);
    assert!(
        left.iter().all(|r| r.offset.0 != 0),
        "the aborted d0 is gone once its marker is written"
    );
    let later = left
        .iter()
        .filter(|r| r.value.as_deref() == Some(&b"later"[..]))
        .count();
    assert!(
        later < 61,
        "the filler below the active segment was compacted ({later} left)"
    );
}

/// The header of the batch holding `offset`.
fn read_batch_header(log: &Log, offset: rill_proto::Offset) -> rill_proto::batch::BatchHeader {
    let slice = log
        .read(offset, 1, log.log_end_offset())
        .unwrap()
        .expect("a batch");
    let bytes = slice.read().unwrap();
    rill_proto::batch::BatchHeader::parse(&bytes).unwrap()
}
