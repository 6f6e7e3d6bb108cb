//! Recovery from damage: torn tails are truncated, mid-log damage is an error that
//! names the file and byte, missing or damaged indexes are rebuilt.

mod common;
use common::*;
use rill_log::{Log, LogError};
use std::io::Write;
use std::path::{Path, PathBuf};

fn segment_files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

/// A log of 40 batches of 3 records; returns the dir and the batch size.
fn written_log(segment_bytes: u64) -> (tempfile::TempDir, usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_config();
    cfg.segment_bytes = segment_bytes;
    let mut log = Log::open(dir.path(), cfg, NOW).unwrap();
    let mut size = 0;
    for i in 0..40 {
        let mut b = batch(&format!("c{i:02}"), 3, NOW + i);
        size = b.len();
        log.append(&mut b, E1, NOW).unwrap();
    }
    log.close().unwrap();
    (dir, size)
}

fn config_with(segment_bytes: u64) -> rill_log::LogConfig {
    let mut cfg = small_config();
    cfg.segment_bytes = segment_bytes;
    cfg
}

#[test]
fn flipped_byte_mid_active_segment_is_corrupt_with_file_and_position() {
    let (dir, size) = written_log(1 << 20);
    let log_file = &segment_files(dir.path(), "log")[0];
    let mut bytes = std::fs::read(log_file).unwrap();
    let at = 10 * size + 70; // inside the records of batch 10
    bytes[at] ^= 0x40;
    std::fs::write(log_file, &bytes).unwrap();
    let err = Log::open(dir.path(), config_with(1 << 20), NOW).unwrap_err();
    match &err {
        LogError::Corrupt { path, position, .. } => {
            assert_eq!(path, log_file);
            assert_eq!(*position, (10 * size) as u64);
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("00000000000000000000.log") && msg.contains(&format!("byte {}", 10 * size)),
        "{msg}"
    );
    // The file was not truncated.
    assert_eq!(
        std::fs::metadata(log_file).unwrap().len() as usize,
        bytes.len()
    );
}

#[test]
fn flipped_byte_in_older_segment_with_missing_index_is_corrupt() {
    let (dir, size) = written_log(1024);
    let logs = segment_files(dir.path(), "log");
    assert!(logs.len() > 2);
    let victim = &logs[1];
    let mut bytes = std::fs::read(victim).unwrap();
    // Last batch of a non-active segment: not a torn tail either.
    let at = bytes.len() - size + 65;
    bytes[at] ^= 1;
    std::fs::write(victim, &bytes).unwrap();
    std::fs::remove_file(victim.with_extension("index")).unwrap();
    let err = Log::open(dir.path(), config_with(1024), NOW).unwrap_err();
    match err {
        LogError::Corrupt { path, position, .. } => {
            assert_eq!(&path, victim);
            assert_eq!(position as usize, bytes.len() - size);
        }
        other => panic!("expected Corrupt, got {other}"),
    }
}

#[test]
fn junk_after_the_tail_is_truncated_and_recovery_is_idempotent() {
    let (dir, _) = written_log(1 << 20);
    let log_file = &segment_files(dir.path(), "log")[0];
    let clean_len = std::fs::metadata(log_file).unwrap().len();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(log_file)
        .unwrap();
    f.write_all(&[0xAB; 37]).unwrap();
    drop(f);
    let log = Log::open(dir.path(), config_with(1 << 20), NOW).unwrap();
    assert_eq!(log.log_end_offset(), o(120));
    assert_eq!(std::fs::metadata(log_file).unwrap().len(), clean_len);
    assert_eq!(offsets(&read_all(&log)), (0..120).collect::<Vec<_>>());
    drop(log);
    let log = Log::open(dir.path(), config_with(1 << 20), NOW).unwrap();
    assert_eq!(log.log_end_offset(), o(120));
    assert_eq!(std::fs::metadata(log_file).unwrap().len(), clean_len);
}

#[test]
fn torn_last_batch_is_truncated() {
    for cut in [5usize, 30, 61, 80] {
        let (dir, size) = written_log(1 << 20);
        let log_file = &segment_files(dir.path(), "log")[0];
        let len = std::fs::metadata(log_file).unwrap().len();
        // Keep only `cut` bytes of the last batch: partial header or partial body.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(log_file)
            .unwrap();
        f.set_len(len - size as u64 + cut as u64).unwrap();
        drop(f);
        let log = Log::open(dir.path(), config_with(1 << 20), NOW).unwrap();
        assert_eq!(log.log_end_offset(), o(117), "cut {cut}");
        assert_eq!(
            std::fs::metadata(log_file).unwrap().len(),
            len - size as u64
        );
    }
    // A whole last batch with a bad CRC is a torn write too.
    let (dir, size) = written_log(1 << 20);
    let log_file = &segment_files(dir.path(), "log")[0];
    let mut bytes = std::fs::read(log_file).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0xFF;
    std::fs::write(log_file, &bytes).unwrap();
    let log = Log::open(dir.path(), config_with(1 << 20), NOW).unwrap();
    assert_eq!(log.log_end_offset(), o(117));
    assert_eq!(
        std::fs::metadata(log_file).unwrap().len() as usize,
        n - size
    );
}

#[test]
fn deleted_and_damaged_indexes_are_rebuilt() {
    let (dir, _) = written_log(1024);
    let indexes = segment_files(dir.path(), "index");
    let times = segment_files(dir.path(), "timeindex");
    let before = std::fs::read(&indexes[0]).unwrap();
    assert!(!before.is_empty(), "index interval 128 gives entries");
    std::fs::remove_file(&indexes[0]).unwrap();
    std::fs::write(&indexes[1], [1u8, 2, 3]).unwrap(); // torn entry
    std::fs::remove_file(&times[2]).unwrap();
    let log = Log::open(dir.path(), config_with(1024), NOW).unwrap();
    assert_eq!(
        std::fs::read(&indexes[0]).unwrap(),
        before,
        "rebuilt index equals the original"
    );
    assert_eq!(offsets(&read_all(&log)), (0..120).collect::<Vec<_>>());
    for target in [0, 5, 31, 64, 119] {
        let s = log.read(o(target), 1, o(120)).unwrap().unwrap();
        let b = s.read().unwrap();
        let v = rill_proto::BatchView::new(&b).unwrap();
        assert!(v.header.base_offset <= o(target) && v.header.last_offset() >= o(target));
    }
    assert_eq!(
        log.offset_for_timestamp(NOW + 20).unwrap(),
        Some((o(60), NOW + 20))
    );
}

#[test]
fn leftovers_of_interrupted_writes_are_deleted() {
    let (dir, _) = written_log(1024);
    for name in [
        "00000000000000000000.log.cleaned",
        "leader-epoch-checkpoint.tmp",
        "00000000000000000003.log.deleted",
        "00000000000000999999.index",
    ] {
        std::fs::write(dir.path().join(name), b"junk").unwrap();
    }
    let log = Log::open(dir.path(), config_with(1024), NOW).unwrap();
    for name in [
        "00000000000000000000.log.cleaned",
        "leader-epoch-checkpoint.tmp",
        "00000000000000000003.log.deleted",
        "00000000000000999999.index",
    ] {
        assert!(!dir.path().join(name).exists(), "{name} should be gone");
    }
    assert_eq!(log.log_end_offset(), o(120));
}

#[test]
fn verify_finds_damage_in_a_trusted_older_segment() {
    let (dir, size) = written_log(1024);
    let logs = segment_files(dir.path(), "log");
    let victim = &logs[0];
    let mut bytes = std::fs::read(victim).unwrap();
    bytes[size + 70] ^= 4; // second batch of the first segment; its index is intact
    std::fs::write(victim, &bytes).unwrap();
    // Open trusts fsynced older segments (as Kafka does) ...
    let log = Log::open(dir.path(), config_with(1024), NOW).unwrap();
    // ... and verify() reads them all.
    match log.verify().unwrap_err() {
        LogError::Corrupt { path, position, .. } => {
            assert_eq!(&path, victim);
            assert_eq!(position as usize, size);
        }
        other => panic!("expected Corrupt, got {other}"),
    }
}
