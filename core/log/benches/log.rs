//! Log benchmarks: append (no fsync per batch) and sequential read, for 100-byte and
//! 1 KiB records in 16 KiB and 64 KiB batches; plus a one-shot "append 2 GiB then
//! fsync" figure comparable to `dd bs=1M count=2048 conv=fdatasync`; and the
//! leader's record checks before an append (`rill_proto::validation`), for the
//! same batches uncompressed and with each codec (gzip, snappy, lz4, zstd), to set beside the append figures.
//!
//! Run: `CARGO_TARGET_DIR=/work/targets/log cargo bench -p rill-log --bench log`.
//! Files go to `$RILL_BENCH_DIR` (default: the system temp dir) and are deleted.
//! Set `RILL_BENCH_FSYNC_TOTAL_MB=0` to skip the one-shot fsync'd run.
//!
//! Also one-shot: the swap of a compaction run (`Log::finish_compaction`, the
//! part that holds the partition's lock) over `RILL_BENCH_SWAP_SEGMENTS`
//! (default 32; 0 skips) changed segments, timed over 5 runs; its time is
//! mostly directory fsyncs, so run it with `RILL_BENCH_DIR` on a real disk.

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput};
use rill_log::{Log, LogConfig};
use rill_proto::{BatchBuilder, Compression, LeaderEpoch, Offset, Record, Rope};
use std::hint::black_box;
use std::time::{Duration, Instant};

const NOW: i64 = 1_700_000_000_000;
/// Truncate the bench log back to empty (untimed) past this size, to bound disk use.
const LOG_BYTES_RESET: u64 = 256 << 20;

fn bench_dir() -> tempfile::TempDir {
    match std::env::var_os("RILL_BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    }
}

/// The number in environment variable `name`, or `default`.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One batch of `record_bytes`-sized values filling about `batch_bytes`.
fn make_batch(record_bytes: usize, batch_bytes: usize) -> (Vec<u8>, usize) {
    make_batch_with(Compression::None, record_bytes, batch_bytes)
}

fn make_batch_with(
    codec: Compression,
    record_bytes: usize,
    batch_bytes: usize,
) -> (Vec<u8>, usize) {
    let mut b = BatchBuilder::new(codec);
    let mut n = 0;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    while b.estimated_size() + record_bytes + 16 <= batch_bytes {
        let value: Vec<u8> = (0..record_bytes)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        b.push(&Record::from_value(value, NOW));
        n += 1;
    }
    (b.build().to_vec(), n)
}

fn config() -> LogConfig {
    LogConfig {
        retention_ms: None,
        ..LogConfig::default()
    }
}

fn append_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("append");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (record_bytes, batch_bytes) in [
        (100, 16 << 10),
        (100, 64 << 10),
        (1024, 16 << 10),
        (1024, 64 << 10),
    ] {
        let (batch, records) = make_batch(record_bytes, batch_bytes);
        let batch = Rope::from(Bytes::from(batch));
        group.throughput(Throughput::Bytes(batch.len() as u64));
        let id = BenchmarkId::new(
            format!("{record_bytes}B_records"),
            format!("{}KiB_batch_{records}_records", batch_bytes >> 10),
        );
        let dir = bench_dir();
        let mut log = Log::open(dir.path(), config(), NOW).unwrap();
        group.bench_function(id, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    if log.size_bytes() > LOG_BYTES_RESET {
                        log.truncate_to(Offset(0)).unwrap();
                    }
                    let t = Instant::now();
                    black_box(log.append_rope(&batch, LeaderEpoch(1), NOW).unwrap());
                    spent += t.elapsed();
                }
                spent
            })
        });
        log.close().unwrap();
    }
    group.finish();
}

/// The produce path's record checks (framing, counts, codec, timestamps) of
/// one batch, which run before `append` on the leader.
fn validate_benches(c: &mut Criterion) {
    use rill_proto::validation::{TimestampBounds, validate_produced};
    let mut group = c.benchmark_group("validate");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let bounds = Some(TimestampBounds {
        before_max_ms: i64::MAX,
        after_max_ms: 3_600_000,
    });
    for codec in Compression::ALL {
        for (record_bytes, batch_bytes) in [(100, 64 << 10), (1024, 64 << 10)] {
            let (batch, records) = make_batch_with(codec, record_bytes, batch_bytes);
            let batch = Rope::from(Bytes::from(batch));
            // Throughput in uncompressed bytes, comparable to the append figures.
            group.throughput(Throughput::Bytes((records * (record_bytes + 12)) as u64));
            let id = BenchmarkId::new(
                format!("{codec}_{record_bytes}B_records"),
                format!("{}KiB_batch_{records}_records", batch_bytes >> 10),
            );
            group.bench_function(id, |b| {
                b.iter(|| validate_produced(black_box(&batch), bounds, NOW).unwrap())
            });
        }
    }
    group.finish();
}

fn read_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("read_sequential");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (record_bytes, batch_bytes) in [(100, 16 << 10), (1024, 64 << 10)] {
        let (batch, records) = make_batch(record_bytes, batch_bytes);
        let batch = Rope::from(Bytes::from(batch));
        let dir = bench_dir();
        let mut log = Log::open(dir.path(), config(), NOW).unwrap();
        while log.size_bytes() < 128 << 20 {
            log.append_rope(&batch, LeaderEpoch(1), NOW).unwrap();
        }
        log.flush().unwrap();
        let end = log.log_end_offset();
        const FETCH_BYTES: usize = 1 << 20;
        group.throughput(Throughput::Bytes(FETCH_BYTES as u64));
        let id = BenchmarkId::new(
            format!("{record_bytes}B_records"),
            format!(
                "{}KiB_batch_{records}_records_1MiB_fetch",
                batch_bytes >> 10
            ),
        );
        let mut from = Offset(0);
        group.bench_function(id, |b| {
            b.iter(|| {
                let slice = log.read(from, FETCH_BYTES, end).unwrap().unwrap();
                let bytes = slice.read().unwrap();
                let last = rill_proto::batch::batches(&bytes).last().unwrap().unwrap();
                from = last.header.next_offset();
                if from >= end {
                    from = Offset(0);
                }
                black_box(bytes.len())
            })
        });
        log.close().unwrap();
    }
    group.finish();
}

/// Appends `total_mb` MiB of 1 KiB records in 64 KiB batches, then fsyncs; prints MB/s
/// for the whole thing (the fair comparison with dd's conv=fdatasync).
fn fsync_total() {
    let total_mb: u64 = env_or("RILL_BENCH_FSYNC_TOTAL_MB", 2048);
    if total_mb == 0 {
        return;
    }
    let (batch, records) = make_batch(1024, 64 << 10);
    let batch = Rope::from(Bytes::from(batch));
    let dir = bench_dir();
    let mut log = Log::open(dir.path(), config(), NOW).unwrap();
    let total = total_mb << 20;
    let t = Instant::now();
    let mut batches = 0u64;
    while log.size_bytes() < total {
        log.append_rope(&batch, LeaderEpoch(1), NOW).unwrap();
        batches += 1;
    }
    let appended = t.elapsed();
    log.flush().unwrap();
    let all = t.elapsed();
    let bytes = log.size_bytes() as f64;
    let mb = |d: Duration| bytes / d.as_secs_f64() / 1e6;
    println!(
        "append_then_fsync: {:.0} MiB in {} batches ({} records): append {:.2}s = {:.0} MB/s; \
         append+fsync {:.2}s = {:.0} MB/s, {:.0} records/s",
        bytes / (1 << 20) as f64,
        batches,
        batches * records as u64,
        appended.as_secs_f64(),
        mb(appended),
        all.as_secs_f64(),
        mb(all),
        (batches * records as u64) as f64 / all.as_secs_f64()
    );
    log.delete().unwrap();
}

/// Times `finish_compaction` over `RILL_BENCH_SWAP_SEGMENTS` segments, each
/// of which loses half its records (every other record rewrites one key).
fn compaction_swap() {
    let segments: usize = env_or("RILL_BENCH_SWAP_SEGMENTS", 32);
    if segments == 0 {
        return;
    }
    let config = LogConfig {
        segment_bytes: 64 << 10,
        cleanup_policy: rill_log::CleanupPolicy::COMPACT,
        min_cleanable_dirty_ratio: 0.0,
        ..config()
    };
    let value = Bytes::from(vec![7u8; 200]);
    let mut times = Vec::new();
    for _ in 0..5 {
        let dir = bench_dir();
        let mut log = Log::open(dir.path(), config.clone(), NOW).unwrap();
        let mut i = 0u64;
        while log.segment_count() <= segments {
            let mut b = BatchBuilder::new(Compression::None);
            for _ in 0..16 {
                let key = if i % 2 == 0 {
                    "same".to_string()
                } else {
                    format!("k{i}")
                };
                b.push(&Record {
                    key: Some(Bytes::from(key)),
                    value: Some(value.clone()),
                    headers: Vec::new(),
                    timestamp_ms: NOW,
                });
                i += 1;
            }
            log.append(&b.build(), LeaderEpoch(1), NOW).unwrap();
        }
        log.flush().unwrap();
        let cleaned = log.plan_compaction(NOW).unwrap().clean().unwrap();
        let t = Instant::now();
        assert!(log.finish_compaction(cleaned).unwrap());
        times.push(t.elapsed());
        log.delete().unwrap();
    }
    times.sort();
    println!(
        "compaction_swap: {segments} changed segments swapped in {:.2?} (median of 5; {:.2?}..{:.2?})",
        times[2], times[0], times[4]
    );
}

fn main() {
    fsync_total();
    compaction_swap();
    let mut c = Criterion::default().configure_from_args();
    append_benches(&mut c);
    read_benches(&mut c);
    validate_benches(&mut c);
    c.final_summary();
}
