//! Helpers shared by the integration tests: building batches and reading a log back.
#![allow(dead_code)]

use bytes::Bytes;
use rill_log::{Log, LogConfig};
use rill_proto::batch::{BatchView, batches};
use rill_proto::{BatchBuilder, Compression, Offset, Record, StoredRecord};

/// A batch of `n` records with values `"{tag}-{i}"`, timestamps `ts`, optional key.
pub fn batch(tag: &str, n: usize, ts: i64) -> Vec<u8> {
    let mut b = BatchBuilder::new(Compression::None);
    for i in 0..n {
        b.push(&Record::from_value(format!("{tag}-{i}"), ts));
    }
    b.build().to_vec()
}

/// A batch of keyed records (`None` value = tombstone).
pub fn keyed_batch(records: &[(&str, Option<&str>, i64)]) -> Vec<u8> {
    let mut b = BatchBuilder::new(Compression::None);
    for (k, v, ts) in records {
        b.push(&Record {
            key: Some(Bytes::copy_from_slice(k.as_bytes())),
            value: v.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            headers: Vec::new(),
            timestamp_ms: *ts,
        });
    }
    b.build().to_vec()
}

/// Every record of the log from its start, by reading with small max_bytes.
pub fn read_all(log: &Log) -> Vec<StoredRecord> {
    let mut out = Vec::new();
    let mut from = log.log_start_offset();
    let end = log.log_end_offset();
    while from < end {
        let Some(slice) = log.read(from, 300, end).unwrap() else {
            break;
        };
        let bytes = slice.read().unwrap();
        let mut last = from;
        for view in batches(&bytes) {
            let view: BatchView<'_> = view.unwrap();
            out.extend(view.records().unwrap());
            last = view.header.next_offset();
        }
        assert!(last > from, "read makes progress");
        from = last;
    }
    out
}

pub fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 1024,
        index_interval_bytes: 128,
        ..LogConfig::default()
    }
}

pub fn offsets(records: &[StoredRecord]) -> Vec<i64> {
    records.iter().map(|r| r.offset.0).collect()
}

pub const NOW: i64 = 1_700_000_000_000;
pub const E1: rill_proto::LeaderEpoch = rill_proto::LeaderEpoch(1);

pub fn o(v: i64) -> Offset {
    Offset(v)
}
