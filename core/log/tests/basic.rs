//! Append, read, offsets, timestamps, truncation, epochs, reopen.

mod common;
use common::*;
use rill_log::{Log, LogError};
use rill_proto::LeaderEpoch;

#[test]
fn append_read_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    assert_eq!(log.log_end_offset(), o(0));
    assert!(log.read(o(0), 1000, o(100)).unwrap().is_none());
    let mut total = 0;
    for i in 0..50 {
        let mut b = batch(&format!("b{i}"), 3, NOW + i);
        let info = log.append(&mut b, E1, NOW).unwrap();
        assert_eq!(info.first_offset, o(total));
        assert_eq!(info.last_offset, o(total + 2));
        assert_eq!(info.record_count, 3);
        total += 3;
    }
    assert!(log.segment_count() > 3, "small segment.bytes rolls");
    assert_eq!(log.log_end_offset(), o(150));
    let recs = read_all(&log);
    assert_eq!(offsets(&recs), (0..150).collect::<Vec<_>>());
    assert_eq!(recs[4].value.as_deref(), Some(&b"b1-1"[..]));
    // Read from the middle of a batch starts at that batch.
    let s = log.read(o(7), 1, o(150)).unwrap().unwrap();
    let bytes = s.read().unwrap();
    let v = rill_proto::BatchView::new(&bytes).unwrap();
    assert_eq!(v.header.base_offset, o(6));
    assert_eq!(
        bytes.len(),
        v.header.total_size(),
        "at least one batch, whole"
    );
    // Upper bound excludes batches reaching it.
    assert!(log.read(o(6), 10_000, o(8)).unwrap().is_none());
    let s = log.read(o(0), 100_000, o(9)).unwrap().unwrap();
    let bytes = s.read().unwrap();
    let n: usize = rill_proto::batch::batches(&bytes)
        .map(|b| b.unwrap().header.record_count as usize)
        .sum();
    assert_eq!(n, 9);
    assert!(matches!(
        log.read(o(151), 10, o(200)),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    assert_eq!(
        log.offset_for_timestamp(NOW + 10).unwrap(),
        Some((o(30), NOW + 10))
    );
    assert_eq!(log.offset_for_timestamp(0).unwrap(), Some((o(0), NOW)));
    assert_eq!(log.offset_for_timestamp(NOW + 100).unwrap(), None);
    log.close().unwrap();

    let log = Log::open(dir.path(), small_config(), NOW).unwrap();
    assert_eq!(log.log_end_offset(), o(150));
    assert_eq!(offsets(&read_all(&log)), (0..150).collect::<Vec<_>>());
    assert_eq!(
        log.offset_for_timestamp(NOW + 10).unwrap(),
        Some((o(30), NOW + 10))
    );
    assert_eq!(log.epoch_entries(), vec![(E1, o(0))]);
}

#[test]
fn validation_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config();
    cfg.max_message_bytes = 200;
    let mut log = Log::open(dir.path(), cfg, NOW).unwrap();
    let mut big = batch("x", 20, NOW);
    assert!(matches!(
        log.append(&mut big, E1, NOW),
        Err(LogError::RecordTooLarge { .. })
    ));
    let mut b = batch("x", 1, NOW);
    let last = b.len() - 1;
    b[last] ^= 1;
    assert!(matches!(
        log.append(&mut b, E1, NOW),
        Err(LogError::InvalidBatch(_))
    ));
    let mut two = batch("x", 1, NOW);
    two.extend_from_slice(&batch("y", 1, NOW)[..30]);
    assert!(matches!(
        log.append(&mut two, E1, NOW),
        Err(LogError::InvalidBatch(_))
    ));
    assert!(matches!(
        log.append(&mut [], E1, NOW),
        Err(LogError::InvalidBatch(_))
    ));
    assert_eq!(log.log_end_offset(), o(0));
    let mut ok = batch("x", 2, NOW);
    log.append(&mut ok, LeaderEpoch(3), NOW).unwrap();
    let mut stale = batch("x", 2, NOW);
    assert!(matches!(
        log.append(&mut stale, LeaderEpoch(2), NOW),
        Err(LogError::StaleLeaderEpoch { .. })
    ));
}

#[test]
fn epochs_and_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    for (epoch, n) in [(1, 10), (1, 10), (3, 10), (4, 10), (4, 10)] {
        let mut b = batch("e", n, NOW);
        log.append(&mut b, LeaderEpoch(epoch), NOW).unwrap();
    }
    assert_eq!(
        log.epoch_entries(),
        vec![
            (LeaderEpoch(1), o(0)),
            (LeaderEpoch(3), o(20)),
            (LeaderEpoch(4), o(30))
        ]
    );
    assert_eq!(
        log.end_offset_for_epoch(LeaderEpoch(2)),
        Some((LeaderEpoch(1), o(20)))
    );
    assert_eq!(
        log.end_offset_for_epoch(LeaderEpoch(4)),
        Some((LeaderEpoch(4), o(50)))
    );
    assert_eq!(
        log.end_offset_for_epoch(LeaderEpoch(0)),
        Some((LeaderEpoch(0), o(0)))
    );
    // Truncating inside a batch removes the whole batch.
    log.truncate_to(o(35)).unwrap();
    assert_eq!(log.log_end_offset(), o(30));
    assert_eq!(
        log.epoch_entries(),
        vec![(LeaderEpoch(1), o(0)), (LeaderEpoch(3), o(20))]
    );
    assert_eq!(offsets(&read_all(&log)), (0..30).collect::<Vec<_>>());
    let mut b = batch("f", 5, NOW);
    let info = log.append(&mut b, LeaderEpoch(5), NOW).unwrap();
    assert_eq!(info.first_offset, o(30));
    drop(log); // no close: reopen must still see everything (page cache survives)
    let log = Log::open(dir.path(), small_config(), NOW).unwrap();
    assert_eq!(log.log_end_offset(), o(35));
    assert_eq!(log.epoch_entries().last(), Some(&(LeaderEpoch(5), o(30))));
    assert_eq!(offsets(&read_all(&log)), (0..35).collect::<Vec<_>>());
}

#[test]
fn replicated_append_keeps_offsets_and_epochs() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let mut leader = Log::open(leader_dir.path(), small_config(), NOW).unwrap();
    let mut follower = Log::open(follower_dir.path(), small_config(), NOW).unwrap();
    for epoch in [1, 1, 2, 7] {
        let mut b = batch("r", 4, NOW);
        leader.append(&mut b, LeaderEpoch(epoch), NOW).unwrap();
    }
    let mut from = o(0);
    while from < leader.log_end_offset() {
        let s = leader
            .read(from, 100, leader.log_end_offset())
            .unwrap()
            .unwrap();
        let bytes = s.read().unwrap();
        let info = follower.append_replicated(&bytes, NOW).unwrap();
        from = info.last_offset.plus(1);
    }
    assert_eq!(follower.epoch_entries(), leader.epoch_entries());
    assert_eq!(follower.log_end_offset(), o(16));
    let s = leader.read(o(0), 100, o(16)).unwrap().unwrap();
    let err = follower
        .append_replicated(&s.read().unwrap(), NOW)
        .unwrap_err();
    assert!(matches!(err, LogError::NonContiguousAppend { .. }), "{err}");
}

#[test]
fn truncate_below_start_restarts_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    for _ in 0..5 {
        let mut b = batch("t", 2, NOW);
        log.append(&mut b, E1, NOW).unwrap();
    }
    log.truncate_to(o(0)).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (o(0), o(0)));
    assert!(log.epoch_entries().is_empty());
    let mut b = batch("t", 2, NOW);
    log.append(&mut b, E1, NOW).unwrap();
    assert_eq!(log.log_end_offset(), o(2));
}

#[test]
fn log_and_slices_can_cross_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Log>();
    assert_send_sync::<rill_log::FileSlice>();
}

#[test]
fn slice_stays_readable_after_the_segment_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    for _ in 0..30 {
        let mut b = batch("d", 3, NOW);
        log.append(&mut b, E1, NOW).unwrap();
    }
    let slice = log.read(o(0), 100, o(90)).unwrap().unwrap();
    let before = slice.read().unwrap();
    let mut c = log.config().clone();
    c.retention_bytes = Some(0);
    log.set_config(c);
    assert!(log.apply_retention(NOW).unwrap() > 0);
    assert_eq!(
        slice.read().unwrap(),
        before,
        "an open file outlives its unlink"
    );
    assert!(matches!(
        log.read(o(0), 100, o(90)),
        Err(LogError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn flush_policies_and_segment_ms() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config();
    cfg.segment_bytes = 1 << 20;
    cfg.segment_ms = 1000;
    cfg.flush_messages = Some(5);
    cfg.flush_ms = Some(100);
    let mut log = Log::open(dir.path(), cfg, NOW).unwrap();
    let mut b = batch("f", 3, NOW);
    log.append(&mut b, E1, NOW).unwrap();
    log.tick(NOW + 200).unwrap(); // flush.ms
    let mut b = batch("f", 6, NOW);
    log.append(&mut b, E1, NOW + 300).unwrap(); // flush.messages
    assert_eq!(log.segment_count(), 1);
    log.tick(NOW + 999).unwrap();
    assert_eq!(log.segment_count(), 1);
    log.tick(NOW + 1000).unwrap();
    assert_eq!(
        log.segment_count(),
        2,
        "segment.ms rolls a non-empty active segment"
    );
    log.tick(NOW + 5000).unwrap();
    assert_eq!(
        log.segment_count(),
        2,
        "an empty active segment is not rolled"
    );
    assert_eq!(log.segment_base_offsets(), vec![o(0), o(9)]);
}

#[test]
fn segment_ms_counts_from_the_first_append() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config();
    cfg.segment_bytes = 1 << 20;
    cfg.segment_ms = 1000;
    let mut log = Log::open(dir.path(), cfg, NOW).unwrap();
    let mut b = batch("m", 1, NOW);
    log.append(&mut b, E1, NOW).unwrap();
    log.tick(NOW + 1000).unwrap();
    assert_eq!(log.segment_count(), 2);
    // The new segment stays empty for a long time; its clock starts at its first append.
    let mut b = batch("m", 1, NOW);
    log.append(&mut b, E1, NOW + 50_000).unwrap();
    assert_eq!(log.segment_count(), 2);
    log.tick(NOW + 50_999).unwrap();
    assert_eq!(log.segment_count(), 2);
    log.tick(NOW + 51_000).unwrap();
    assert_eq!(log.segment_count(), 3);
}

/// A crafted batch whose last offset delta does not match its record count (valid
/// CRC) is refused on leader append; the log stays usable and reopens cleanly.
#[test]
fn sparse_producer_batch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    let mut ok = batch("a", 2, NOW);
    log.append(&mut ok, E1, NOW).unwrap();
    let mut bad = batch("b", 1, NOW);
    bad[23..27].copy_from_slice(&i32::MAX.to_be_bytes());
    let crc = rill_proto::BatchView::new(&bad).unwrap().computed_crc();
    bad[17..21].copy_from_slice(&crc.to_be_bytes());
    let err = log.append(&mut bad, E1, NOW).unwrap_err();
    assert!(err.to_string().contains("last_offset_delta"), "{err}");
    assert_eq!(log.log_end_offset(), o(2));
    let mut next = batch("c", 1, NOW);
    assert_eq!(log.append(&mut next, E1, NOW).unwrap().first_offset, o(2));
    log.close().unwrap();
    let log = Log::open(dir.path(), small_config(), NOW).unwrap();
    assert_eq!(log.log_end_offset(), o(3));
}

/// An idempotent producer's batch, as the client stamps it.
fn producer_batch(pid: i64, seq: i32, n: i32) -> Vec<u8> {
    let mut b = batch(&format!("p{pid}-{seq}"), n as usize, NOW);
    rill_proto::batch::set_producer(&mut b, rill_proto::ProducerId(pid), 0, seq);
    b
}

#[test]
fn idempotent_retries_are_written_once_across_reopen_and_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    let a = log.append(&mut producer_batch(5, 0, 3), E1, NOW).unwrap();
    // Another producer in between: the next range of 5 is not contiguous.
    log.append(&mut batch("other", 2, NOW), E1, NOW).unwrap();
    let b = log.append(&mut producer_batch(5, 3, 2), E1, NOW).unwrap();
    assert_eq!((a.first_offset, b.first_offset), (o(0), o(5)));
    // A retry of either batch appends nothing and reports where it was written.
    let again = log.append(&mut producer_batch(5, 0, 3), E1, NOW).unwrap();
    assert!(again.duplicate);
    assert_eq!((again.first_offset, again.last_offset), (o(0), o(2)));
    assert_eq!(log.log_end_offset(), o(7));
    // A gap is refused, naming the producer and the sequence it expected.
    let gap = log
        .append(&mut producer_batch(5, 9, 1), E1, NOW)
        .unwrap_err();
    assert!(
        gap.to_string().contains("producer 5 sent sequence 9")
            && gap.to_string().contains("expects 5"),
        "{gap}"
    );
    log.close().unwrap();

    // Reopened (as after a crash or on a new leader): rebuilt from the headers.
    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    assert_eq!(log.producer_count(), 1);
    let again = log.append(&mut producer_batch(5, 3, 2), E1, NOW).unwrap();
    assert!(again.duplicate);
    assert_eq!(again.first_offset, o(5));
    // Truncated below the second batch: it is new again (a follower that lost it).
    log.truncate_to(o(5)).unwrap();
    let redo = log.append(&mut producer_batch(5, 3, 2), E1, NOW).unwrap();
    assert!(!redo.duplicate);
    assert_eq!(redo.first_offset, o(5));
    assert_eq!(log.log_end_offset(), o(7));
}

#[test]
fn segment_bytes_is_kept_between_the_batches_of_one_append() {
    // One append of many batches (as a produce request carries) rolls between
    // batches: no segment grows past segment.bytes, and every batch is readable.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config();
    cfg.segment_bytes = 2048;
    let mut log = Log::open(dir.path(), cfg, NOW).unwrap();
    let one = batch("x", 4, NOW).len() as u64;
    assert!(one * 3 < 2048, "several batches fit one segment");
    for round in 0..3 {
        let mut many = Vec::new();
        for i in 0..40 {
            many.extend(batch(&format!("r{round}b{i}"), 4, NOW + i));
        }
        let info = log.append(&mut many, E1, NOW).unwrap();
        assert_eq!(info.record_count, 160);
    }
    assert_eq!(log.log_end_offset(), o(480));
    let mut sizes = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            sizes.push(std::fs::metadata(&path).unwrap().len());
        }
    }
    assert!(sizes.len() >= 480 * one as usize / 4 / 2048, "{sizes:?}");
    assert!(
        sizes.iter().all(|&s| s <= 2048),
        "a segment past segment.bytes: {sizes:?}"
    );
    assert_eq!(offsets(&read_all(&log)), (0..480).collect::<Vec<_>>());
    drop(log);
    let log = Log::open(dir.path(), small_config(), NOW).unwrap();
    assert_eq!(offsets(&read_all(&log)), (0..480).collect::<Vec<_>>());
}

/// Every byte of a log, start to end (for comparing replicas).
fn all_bytes(log: &Log) -> Vec<u8> {
    let mut out = Vec::new();
    let mut from = log.log_start_offset();
    let end = log.log_end_offset();
    while from < end {
        let bytes = log
            .read(from, 1 << 20, end)
            .unwrap()
            .unwrap()
            .read()
            .unwrap();
        from = rill_proto::batch::batches(&bytes)
            .map(|b| b.unwrap().header.next_offset())
            .last()
            .unwrap();
        out.extend_from_slice(&bytes);
    }
    out
}

/// A follower truncates as the broker's replica fetcher does (ask the leader
/// where the follower's latest epoch ends, cut, repeat until settled), then
/// fetches the rest. Returns how many questions it asked.
fn follow(leader: &Log, follower: &mut Log) -> usize {
    let mut asked = 0;
    loop {
        asked += 1;
        assert!(asked < 10, "truncation settles");
        let Some(ours) = follower.latest_epoch() else {
            break;
        };
        let t = follower.truncation(leader.end_offset_for_epoch(ours));
        follower.truncate_to(t.to).unwrap();
        if t.settled {
            break;
        }
    }
    while follower.log_end_offset() < leader.log_end_offset() {
        let from = follower.log_end_offset();
        let bytes = leader
            .read(from, 1 << 20, leader.log_end_offset())
            .unwrap()
            .unwrap()
            .read()
            .unwrap();
        follower.append_replicated(&bytes, NOW).unwrap();
    }
    asked
}

#[test]
fn a_follower_cuts_back_through_an_epoch_the_leader_never_saw() {
    // KIP-279: A and B share offsets 0..4 (epoch 1). A leads at epoch 5 and
    // writes offset 4, which B never gets; B leads at epoch 6 and writes its
    // own offset 4, the same size (a producer's retry); A leads again at 7
    // and writes offset 5. B asks where its epoch 6 ends: A answers with
    // epoch 5, ending at 5, past B's 4 — one cut there would keep B's 4 (epoch
    // 6) beside A's 4 (epoch 5): the same offset, two different batches.
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut a = Log::open(dirs[0].path(), small_config(), NOW).unwrap();
    let mut b = Log::open(dirs[1].path(), small_config(), NOW).unwrap();
    for _ in 0..2 {
        a.append(&mut batch("shared", 2, NOW), E1, NOW).unwrap();
    }
    follow(&a, &mut b);
    assert_eq!(all_bytes(&a), all_bytes(&b));
    a.append(&mut batch("x", 1, NOW), LeaderEpoch(5), NOW)
        .unwrap();
    b.append(&mut batch("x", 1, NOW), LeaderEpoch(6), NOW)
        .unwrap();
    a.append(&mut batch("y", 1, NOW), LeaderEpoch(7), NOW)
        .unwrap();
    assert_eq!(
        b.truncation(a.end_offset_for_epoch(LeaderEpoch(6))),
        rill_log::epoch::Truncation {
            to: o(4),
            settled: false
        },
        "B's epoch 1 ends at 4: cut there and ask again"
    );

    let asked = follow(&a, &mut b);
    assert_eq!(asked, 2, "epoch 6, then epoch 1");
    assert_eq!(b.log_end_offset(), o(6));
    assert_eq!(b.epoch_entries(), a.epoch_entries());
    assert!(
        all_bytes(&a) == all_bytes(&b),
        "the replicas hold the same bytes"
    );

    // The ordinary case: the follower's latest epoch is the leader's; one
    // question, nothing cut.
    a.append(&mut batch("z", 3, NOW), LeaderEpoch(7), NOW)
        .unwrap();
    assert_eq!(follow(&a, &mut b), 1);
    assert_eq!(b.log_end_offset(), o(9));
    assert!(all_bytes(&a) == all_bytes(&b));
}

#[test]
fn a_follower_behind_the_leaders_log_start_restarts_there() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut leader = Log::open(dirs[0].path(), small_config(), NOW).unwrap();
    let mut follower = Log::open(dirs[1].path(), small_config(), NOW).unwrap();
    follower
        .append(&mut batch("old", 10, NOW), LeaderEpoch(9), NOW)
        .unwrap();
    // The leader's log starts at 50 (what came before went to retention).
    leader.restart_at(o(50)).unwrap();
    leader
        .append(&mut batch("new", 5, NOW), LeaderEpoch(3), NOW)
        .unwrap();
    follower.restart_at(o(50)).unwrap();
    assert_eq!(
        (follower.log_start_offset(), follower.log_end_offset()),
        (o(50), o(50))
    );
    assert!(
        follower.epoch_entries().is_empty(),
        "no epoch of the old records"
    );
    assert_eq!(follow(&leader, &mut follower), 1);
    assert_eq!(follower.epoch_entries(), vec![(LeaderEpoch(3), o(50))]);
    assert!(all_bytes(&leader) == all_bytes(&follower));
    // Reopened, it still starts at 50.
    drop(follower);
    let follower = Log::open(dirs[1].path(), small_config(), NOW).unwrap();
    assert_eq!(follower.log_start_offset(), o(50));
    assert_eq!(follower.log_end_offset(), o(55));
}

#[test]
fn batches_in_pieces_are_stored_as_stamped_in_one_buffer() {
    // A produce request's batches arrive in network buffers cut anywhere
    // (inside headers, inside records). Appended from those pieces, the log
    // holds exactly the batches with their offsets and the leader's epoch
    // stamped, across segment rolls inside one append and with more pieces
    // than one pwritev takes.
    use bytes::Bytes;
    use rill_proto::Rope;
    use rill_proto::batch::{set_base_offset, set_leader_epoch};
    let cut =
        |bytes: &[u8], every: usize| Rope::new(bytes.chunks(every).map(Bytes::copy_from_slice));
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config();
    cfg.segment_bytes = 2048;
    let mut leader = Log::open(dir.path().join("leader").as_path(), cfg.clone(), NOW).unwrap();
    let mut expected = Vec::new();
    let mut next = 0i64;
    for (round, every) in [(0, 3), (1, 7), (2, 64), (3, 1000)] {
        let mut many = Vec::new();
        for i in 0..30 {
            let mut b = batch(&format!("r{round}b{i}"), 1 + i % 4, NOW + i as i64);
            many.extend_from_slice(&b);
            set_base_offset(&mut b, o(next));
            set_leader_epoch(&mut b, E1);
            next += (1 + i % 4) as i64;
            expected.extend_from_slice(&b);
        }
        let info = leader.append_rope(&cut(&many, every), E1, NOW).unwrap();
        assert_eq!(info.last_offset, o(next - 1));
        assert_eq!(info.bytes, many.len() as u64);
    }
    assert!(leader.segment_count() > 3, "appends rolled segments");
    assert_eq!(all_bytes(&leader), expected);
    // A follower appending the leader's bytes in pieces holds the same bytes.
    let mut follower = Log::open(dir.path().join("follower").as_path(), cfg.clone(), NOW).unwrap();
    for every in [5, 4096] {
        let from = follower.log_end_offset();
        let end = if from == o(0) {
            o(next / 2)
        } else {
            leader.log_end_offset()
        };
        while follower.log_end_offset() < end {
            let bytes = leader
                .read(follower.log_end_offset(), 1 << 20, end)
                .unwrap()
                .unwrap()
                .read()
                .unwrap();
            follower
                .append_replicated_rope(&cut(&bytes, every), NOW)
                .unwrap();
        }
    }
    assert_eq!(all_bytes(&follower), expected);
    drop(leader);
    let reopened = Log::open(dir.path().join("leader").as_path(), cfg, NOW).unwrap();
    assert_eq!(all_bytes(&reopened), expected);
}
