//! The tail cache: reads at the end of a leader's log come from the copy the
//! append kept, and equal the file's bytes; a follower's
//! appends, a truncation and a roll leave nothing stale in it.

mod common;
use bytes::Bytes;
use common::*;
use rill_log::{FileSlice, Log, LogConfig};
use rill_proto::Rope;
use rill_proto::batch::rope_batches;
use std::os::unix::fs::FileExt;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 64 << 10,
        index_interval_bytes: 512,
        ..LogConfig::default()
    }
}

/// The slice's bytes as the file holds them, read past the cache.
fn file_bytes(s: &FileSlice) -> Vec<u8> {
    let mut buf = vec![0u8; s.len as usize];
    s.file.read_exact_at(&mut buf, s.position).unwrap();
    buf
}

/// A batch of `n` records in three pieces, as it could arrive off the network.
fn in_pieces(tag: &str, n: usize) -> Rope {
    let b = Bytes::from(batch(tag, n, NOW));
    let third = b.len() / 3;
    Rope::new([
        b.slice(..third),
        b.slice(third..2 * third),
        b.slice(2 * third..),
    ])
}

/// Leader appends of `batches` batches of `records` records each, tagged `tag`.
fn append_batches(log: &mut Log, tag: &str, batches: usize, records: usize) {
    for i in 0..batches {
        log.append_rope(&in_pieces(&format!("{tag}{i}"), records), E1, NOW)
            .unwrap();
    }
}

fn base_offsets(r: &Rope) -> Vec<i64> {
    rope_batches(r)
        .map(|b| b.unwrap().1.base_offset.0)
        .collect()
}

#[test]
fn a_leaders_newest_batches_are_read_from_memory_as_the_file_holds_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), NOW).unwrap();
    append_batches(&mut log, "b", 10, 4);
    let end = log.log_end_offset();
    let s = log.read(o(0), 1 << 20, end).unwrap().unwrap();
    let (at, kept) = s.cached.clone().expect("the newest batches are kept");
    assert_eq!(at, s.position, "all of them");
    assert_eq!(kept.pieces().len(), 10, "one copy per append");
    let read = s.read_rope().unwrap();
    assert_eq!(read.to_bytes(), file_bytes(&s), "the cache equals the file");
    // The stamped base offsets are in what the cache hands out.
    assert_eq!(
        base_offsets(&read),
        (0..10).map(|i| i * 4).collect::<Vec<_>>()
    );
    // A read from the middle, of a bounded size, is cut at batch boundaries.
    let s = log.read(o(13), 200, end).unwrap().unwrap();
    assert!(s.cached.is_some());
    assert_eq!(s.read_rope().unwrap().to_bytes(), file_bytes(&s));
    assert_eq!(base_offsets(&s.read_rope().unwrap())[0], 12);
}

#[test]
fn a_followers_appends_are_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader = Log::open(leader_dir.path(), config(), NOW).unwrap();
    let mut follower = Log::open(dir.path(), config(), NOW).unwrap();
    append_batches(&mut leader, "b", 5, 2);
    let s = leader.read(o(0), 1 << 20, o(10)).unwrap().unwrap();
    follower
        .append_replicated_rope(&s.read_rope().unwrap(), NOW)
        .unwrap();
    let f = follower.read(o(0), 1 << 20, o(10)).unwrap().unwrap();
    assert!(f.cached.is_none());
    assert_eq!(f.read().unwrap(), file_bytes(&s));
}

#[test]
fn after_a_truncation_the_cache_holds_only_what_came_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), NOW).unwrap();
    append_batches(&mut log, "old", 6, 3);
    log.truncate_to(o(9)).unwrap();
    assert_eq!(log.log_end_offset(), o(9));
    let s = log.read(o(0), 1 << 20, o(9)).unwrap().unwrap();
    assert!(s.cached.is_none(), "nothing kept across a truncation");
    // Different batches where the truncated ones were.
    append_batches(&mut log, "new-batch-", 3, 2);
    let s = log.read(o(0), 1 << 20, o(15)).unwrap().unwrap();
    let (at, _) = s.cached.clone().unwrap();
    assert!(
        at > s.position,
        "the batches before the truncation are read from the file"
    );
    let read = s.read_rope().unwrap();
    assert_eq!(read.to_bytes(), file_bytes(&s));
    assert_eq!(base_offsets(&read), vec![0, 3, 6, 9, 11, 13]);
    let recs = read_all(&log);
    assert_eq!(recs[9].value.as_deref(), Some(&b"new-batch-0-0"[..]));
}

#[test]
fn a_rolled_segment_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), small_config(), NOW).unwrap();
    append_batches(&mut log, "b", 40, 3);
    assert!(log.segment_count() > 2);
    let end = log.log_end_offset();
    let first = log.read(o(0), 1 << 20, end).unwrap().unwrap();
    assert!(first.cached.is_none(), "the first segment was rolled");
    let last = log.read(o(117), 1 << 20, end).unwrap().unwrap();
    assert!(
        last.cached.is_some(),
        "the active segment's newest batch is kept"
    );
    assert_eq!(last.read().unwrap(), file_bytes(&last));
    assert_eq!(offsets(&read_all(&log)), (0..120).collect::<Vec<_>>());
}
