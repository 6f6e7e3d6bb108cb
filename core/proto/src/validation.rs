//! The leader's checks of a produced batch before it is appended, as Kafka's
//! `LogValidator` does: record framing and counts, the compression codec, and
//! the record timestamps against the topic's bounds.
//!
//! [`validate_produced`] reads the bytes in place, in the pieces they arrived
//! in (a compressed batch is joined and decompressed once, bounded by
//! [`MAX_UNCOMPRESSED_RECORDS_BYTES`]); of an uncompressed batch it copies only
//! a record or varint that straddles two pieces. It does not
//! check the CRC on the way to success (the log checks it on append, once);
//! a batch that fails a check here is checked against its CRC first, so
//! damaged bytes are reported as a CRC mismatch, not as what the damage looks
//! like.
//!
//! What passes (magic 2 only):
//! - the header parses and the batch fits the bytes; nothing trails the last batch;
//! - the compression codec is one this build knows, and the section decompresses;
//! - `record_count >= 1` and `last_offset_delta == record_count - 1`;
//! - exactly `record_count` records, each framed exactly (lengths consistent,
//!   nothing trailing inside a record or after the last one), offset deltas
//!   `0, 1, ..., n-1`, header keys present and UTF-8;
//! - with [`TimestampBounds`] (create-time topics): every record's timestamp
//!   and the batch's `max_timestamp` within `[now - before, now + after]`
//!   (Kafka's `NO_TIMESTAMP`, -1, is exempt), and no record newer than the
//!   batch's `max_timestamp` (the time index and retention read only that).
//!
//! Invariants: never panics on any input; a batch that passes decodes with
//! [`crate::batch::decode_records`]; every error names the batch's position in
//! the request, the record where there is one, and the field.

use crate::batch::{
    BATCH_HEADER_LEN, BatchHeader, MAX_UNCOMPRESSED_RECORDS_BYTES, rope_batches, verify_crc_at,
};
use crate::compression::{self, Compression};
use crate::error::DecodeError;
use crate::rope::{Rope, RopeReader};
use crate::types::TimestampMs;
use crate::varint;
use thiserror::Error;

/// Kafka's "no timestamp": exempt from the timestamp bounds.
pub const NO_TIMESTAMP: TimestampMs = -1;

/// Kafka's topic config bounding how far a record's timestamp may lie before
/// the broker's time.
pub const TIMESTAMP_BEFORE_MAX_MS_CONFIG: &str = "message.timestamp.before.max.ms";
/// Kafka's topic config bounding how far a record's timestamp may lie after
/// the broker's time.
pub const TIMESTAMP_AFTER_MAX_MS_CONFIG: &str = "message.timestamp.after.max.ms";

/// How far from the broker's time a record's timestamp may lie, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampBounds {
    pub before_max_ms: i64,
    pub after_max_ms: i64,
}

/// Which side of the broker's time a timestamp fell out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampSide {
    Before,
    After,
}

/// What is wrong with one batch.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BatchFault {
    /// The header does not parse, the batch does not fit, or the CRC does not
    /// match: the bytes were damaged (Kafka's CORRUPT_MESSAGE).
    #[error("{0}")]
    Corrupt(DecodeError),
    /// The batch is intact but its records are not what the header says
    /// (Kafka's INVALID_RECORD).
    #[error("{0}")]
    Invalid(DecodeError),
    /// A timestamp outside the topic's bounds (Kafka's INVALID_TIMESTAMP).
    #[error("{}", timestamp_message(*.record, *.timestamp_ms, *.side, *.limit_ms, *.now_ms))]
    Timestamp {
        /// The record's index in the batch; `None`: the batch's `max_timestamp`.
        record: Option<i32>,
        timestamp_ms: TimestampMs,
        side: TimestampSide,
        limit_ms: i64,
        now_ms: TimestampMs,
    },
    /// A record newer than the batch's `max_timestamp` (the time index and
    /// retention would not see it).
    #[error(
        "record {record} timestamp {timestamp_ms} is newer than the batch's max_timestamp \
         {max_timestamp_ms}; the producer must set max_timestamp to the newest record's"
    )]
    MaxTimestampUnderstated {
        record: i32,
        timestamp_ms: TimestampMs,
        max_timestamp_ms: TimestampMs,
    },
}

fn timestamp_message(
    record: Option<i32>,
    timestamp_ms: TimestampMs,
    side: TimestampSide,
    limit_ms: i64,
    now_ms: TimestampMs,
) -> String {
    let what = match record {
        Some(i) => format!("record {i} timestamp {timestamp_ms}"),
        None => format!("max_timestamp {timestamp_ms}"),
    };
    let (config, word) = match side {
        TimestampSide::Before => (TIMESTAMP_BEFORE_MAX_MS_CONFIG, "before"),
        TimestampSide::After => (TIMESTAMP_AFTER_MAX_MS_CONFIG, "after"),
    };
    format!(
        "{what} is more than {config}={limit_ms} ms {word} the broker's time {now_ms}; \
         send records with current timestamps (or raise the topic's {config})"
    )
}

/// A refused batch: its position among the partition's batches and why.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("batch at position {position}: {fault}")]
pub struct InvalidBatch {
    /// 0-based index of the batch within the partition's bytes.
    pub position: usize,
    pub fault: BatchFault,
}

/// Checks every batch in `batches` (one partition's bytes of a produce
/// request, in the pieces they arrived in) as the leader must before appending
/// them. `timestamps`: the topic's bounds (`None`: no bound, only the
/// `max_timestamp` consistency check).
pub fn validate_produced(
    batches: &Rope,
    timestamps: Option<TimestampBounds>,
    now_ms: TimestampMs,
) -> Result<(), InvalidBatch> {
    for (position, found) in rope_batches(batches).enumerate() {
        let fail = |fault| InvalidBatch { position, fault };
        let (at, header) = found.map_err(|e| fail(BatchFault::Corrupt(e)))?;
        if let Err(fault) = validate_batch(&header, batches, at, timestamps, now_ms) {
            // Damaged bytes can look like anything: say so rather than what.
            return Err(fail(match verify_crc_at(batches, at, &header) {
                Err(crc) => BatchFault::Corrupt(crc),
                Ok(()) => fault,
            }));
        }
    }
    Ok(())
}

fn invalid(field: &'static str, value: i64) -> BatchFault {
    BatchFault::Invalid(DecodeError::InvalidValue { field, value })
}

/// The whole batch at `at` in `batches`, whose header is `h` (without its CRC).
fn validate_batch(
    h: &BatchHeader,
    batches: &Rope,
    at: usize,
    timestamps: Option<TimestampBounds>,
    now_ms: TimestampMs,
) -> Result<(), BatchFault> {
    if h.is_control() {
        // Transaction markers and the like are the brokers' own (Kafka's
        // LogValidator refuses them from clients too).
        return Err(invalid(
            "attributes (a control batch: only brokers write those)",
            h.attributes as i64,
        ));
    }
    let codec = h.compression().map_err(BatchFault::Invalid)?;
    if h.record_count < 1 {
        return Err(invalid(
            "record_count (a batch holds at least one record)",
            h.record_count as i64,
        ));
    }
    if h.last_offset_delta as i64 != h.record_count as i64 - 1 {
        return Err(invalid(
            "last_offset_delta (must be record_count - 1)",
            h.last_offset_delta as i64,
        ));
    }
    let bounds = timestamps.map(|b| {
        (
            now_ms.saturating_sub(b.before_max_ms.max(0)),
            now_ms.saturating_add(b.after_max_ms.max(0)),
            b,
        )
    });
    let check_ts = |record: Option<i32>, ts: TimestampMs| -> Result<(), BatchFault> {
        let Some((lowest, highest, b)) = bounds else {
            return Ok(());
        };
        if ts == NO_TIMESTAMP {
            return Ok(());
        }
        let out = |side, limit_ms| BatchFault::Timestamp {
            record,
            timestamp_ms: ts,
            side,
            limit_ms,
            now_ms,
        };
        if ts < lowest {
            Err(out(TimestampSide::Before, b.before_max_ms))
        } else if ts > highest {
            Err(out(TimestampSide::After, b.after_max_ms))
        } else {
            Ok(())
        }
    };
    check_ts(None, h.max_timestamp)?;
    let check_record = |index, ts| {
        if h.is_log_append_time() {
            // Every record reads as the batch's time, checked above.
            return Ok(());
        }
        check_ts(Some(index), ts)?;
        if ts > h.max_timestamp {
            return Err(BatchFault::MaxTimestampUnderstated {
                record: index,
                timestamp_ms: ts,
                max_timestamp_ms: h.max_timestamp,
            });
        }
        Ok(())
    };
    let stored = batches.slice(at + BATCH_HEADER_LEN, at + h.total_size());
    match (codec, stored.pieces()) {
        (Compression::None, [one]) => walk_records(h, &mut &one[..], check_record),
        (Compression::None, _) => walk_records(h, &mut RopeReader::new(&stored), check_record),
        (codec, _) => {
            let section =
                compression::decompress(codec, &stored.to_bytes(), MAX_UNCOMPRESSED_RECORDS_BYTES)
                    .map_err(BatchFault::Invalid)?;
            walk_records(h, &mut &section[..], check_record)
        }
    }
}

/// Where [`walk_records`] reads records from: one section in place, or one in
/// pieces.
trait Section {
    fn remaining(&self) -> usize;
    /// Reads a record's length.
    fn record_len(&mut self) -> Result<i32, DecodeError>;
    /// Hands the next `n` bytes (`n <= remaining`) to `f`, as one slice.
    fn with_next<R>(&mut self, n: usize, f: impl FnOnce(&[u8]) -> R) -> R;
}

impl Section for &[u8] {
    #[inline]
    fn remaining(&self) -> usize {
        self.len()
    }

    #[inline]
    fn record_len(&mut self) -> Result<i32, DecodeError> {
        varint::read_varint(self, "record length")
    }

    #[inline]
    fn with_next<R>(&mut self, n: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        let (head, rest) = self.split_at(n);
        *self = rest;
        f(head)
    }
}

impl Section for RopeReader<'_> {
    #[inline]
    fn remaining(&self) -> usize {
        RopeReader::remaining(self)
    }

    #[inline]
    fn record_len(&mut self) -> Result<i32, DecodeError> {
        self.read_varint("record length")
    }

    #[inline]
    fn with_next<R>(&mut self, n: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        RopeReader::with_next(self, n, f)
    }
}

/// Walks the records of a decompressed section, checking exact framing and
/// sequential offset deltas; calls `f(index, timestamp)` for each record.
fn walk_records(
    h: &BatchHeader,
    section: &mut impl Section,
    mut f: impl FnMut(i32, TimestampMs) -> Result<(), BatchFault>,
) -> Result<(), BatchFault> {
    for index in 0..h.record_count {
        let len = section.record_len().map_err(BatchFault::Invalid)?;
        if len < 0 || len as usize > section.remaining() {
            return Err(BatchFault::Invalid(DecodeError::InvalidLength {
                field: "record length",
                value: len as i64,
            }));
        }
        let ts_delta = section.with_next(len as usize, |rec| check_record(index, rec))?;
        f(index, h.base_timestamp.wrapping_add(ts_delta))?;
    }
    if section.remaining() > 0 {
        return Err(BatchFault::Invalid(DecodeError::TrailingBytes {
            field: "records (more bytes than record_count records)",
            count: section.remaining(),
        }));
    }
    Ok(())
}

/// Checks the framing of one record (`rec`: its bytes after the length) whose
/// index in the batch is `index`; returns its timestamp delta.
#[inline]
fn check_record(index: i32, mut rec: &[u8]) -> Result<i64, BatchFault> {
    let bad = BatchFault::Invalid;
    let rec = &mut rec;
    take(rec, 1, "record attributes")?;
    let ts_delta = varint::read_varlong(rec, "record timestamp delta").map_err(bad)?;
    let offset_delta = varint::read_varint(rec, "record offset delta").map_err(bad)?;
    if offset_delta != index {
        return Err(invalid(
            "record offset delta (must be the record's index: 0, 1, 2, ...)",
            offset_delta as i64,
        ));
    }
    skip_nullable(rec, "record key")?;
    skip_nullable(rec, "record value")?;
    let header_count = varint::read_varint(rec, "record header count").map_err(bad)?;
    if header_count < 0 || header_count as usize > rec.len() {
        return Err(BatchFault::Invalid(DecodeError::InvalidLength {
            field: "record header count",
            value: header_count as i64,
        }));
    }
    for _ in 0..header_count {
        let key = skip_nullable(rec, "header key")?.ok_or(BatchFault::Invalid(
            DecodeError::InvalidLength {
                field: "header key",
                value: -1,
            },
        ))?;
        std::str::from_utf8(key).map_err(|_| {
            BatchFault::Invalid(DecodeError::InvalidUtf8 {
                field: "header key",
            })
        })?;
        skip_nullable(rec, "header value")?;
    }
    if !rec.is_empty() {
        return Err(BatchFault::Invalid(DecodeError::TrailingBytes {
            field: "record (its length says more than its fields hold)",
            count: rec.len(),
        }));
    }
    Ok(ts_delta)
}

fn take<'a>(buf: &mut &'a [u8], n: usize, field: &'static str) -> Result<&'a [u8], BatchFault> {
    if buf.len() < n {
        return Err(BatchFault::Invalid(DecodeError::Truncated {
            field,
            needed: n,
            available: buf.len(),
        }));
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

/// Skips a length-prefixed (-1 = null) field; returns its bytes.
fn skip_nullable<'a>(
    buf: &mut &'a [u8],
    field: &'static str,
) -> Result<Option<&'a [u8]>, BatchFault> {
    let len = varint::read_varint(buf, field).map_err(BatchFault::Invalid)?;
    match len {
        -1 => Ok(None),
        l if l < 0 => Err(BatchFault::Invalid(DecodeError::InvalidLength {
            field,
            value: l as i64,
        })),
        l => take(buf, l as usize, field).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{BatchBuilder, Record};
    use crate::types::Offset;
    use crate::{LeaderEpoch, batch};
    use bytes::Bytes;

    const NOW: i64 = 1_700_000_000_000;
    const HOUR: i64 = 3_600_000;
    const BOUNDS: Option<TimestampBounds> = Some(TimestampBounds {
        before_max_ms: i64::MAX,
        after_max_ms: HOUR,
    });

    fn build(codec: Compression, timestamps: &[i64]) -> Vec<u8> {
        let mut b = BatchBuilder::new(codec);
        for (i, ts) in timestamps.iter().enumerate() {
            b.push(&Record::from_value(format!("value-{i}"), *ts));
        }
        b.build().to_vec()
    }

    /// Recomputes the CRC after a test edited the bytes inside it.
    fn reseal(bytes: &mut [u8]) {
        let crc = crate::crc::crc32c(&bytes[21..]);
        bytes[17..21].copy_from_slice(&crc.to_be_bytes());
    }

    /// [`validate_produced`] of `bytes` whole, checked to agree with the same
    /// bytes cut into pieces of 1, 7 and 64 bytes (records and varints that
    /// straddle pieces).
    fn validate(
        bytes: &[u8],
        bounds: Option<TimestampBounds>,
        now: TimestampMs,
    ) -> Result<(), InvalidBatch> {
        let whole = validate_produced(&Rope::from(Bytes::copy_from_slice(bytes)), bounds, now);
        for step in [1, 7, 64] {
            let pieces = Rope::new(bytes.chunks(step).map(Bytes::copy_from_slice));
            assert_eq!(
                validate_produced(&pieces, bounds, now),
                whole,
                "cut every {step} bytes"
            );
        }
        whole
    }

    fn fault(bytes: &[u8], bounds: Option<TimestampBounds>) -> InvalidBatch {
        validate(bytes, bounds, NOW).unwrap_err()
    }

    #[test]
    fn good_batches_pass_with_every_codec_and_several_batches() {
        for codec in Compression::ALL {
            let mut two = build(codec, &[NOW, NOW - 5, NOW + 10]);
            two.extend(build(codec, &[1, NO_TIMESTAMP]));
            validate(&two, BOUNDS, NOW).unwrap();
            // And what passes decodes.
            for v in batch::batches(&two) {
                v.unwrap().records().unwrap();
            }
        }
        // Old timestamps pass under Kafka's default (no lower bound).
        validate(&build(Compression::None, &[0, 1, 1000]), BOUNDS, NOW).unwrap();
    }

    #[test]
    fn control_batches_are_refused_from_clients() {
        let mut b = BatchBuilder::new(Compression::None).control();
        b.push(&Record::from_value("marker", NOW));
        let e = fault(&b.build(), BOUNDS);
        assert!(e.fault.to_string().contains("control batch"), "{}", e.fault);
    }

    #[test]
    fn a_future_timestamp_is_refused_naming_record_and_config() {
        let mut bytes = build(Compression::None, &[NOW]);
        bytes.extend(build(Compression::None, &[NOW, NOW, i64::MAX]));
        let e = fault(&bytes, BOUNDS);
        assert_eq!(e.position, 1);
        // The header's max_timestamp is checked first: it says i64::MAX.
        assert!(
            matches!(
                e.fault,
                BatchFault::Timestamp {
                    record: None,
                    side: TimestampSide::After,
                    ..
                }
            ),
            "{e}"
        );
        let text = e.to_string();
        assert!(
            text.contains("batch at position 1")
                && text.contains("9223372036854775807")
                && text.contains("message.timestamp.after.max.ms=3600000"),
            "{text}"
        );
        // A record in the future under an honest-looking max_timestamp.
        let mut bytes = build(Compression::None, &[NOW, NOW + 2 * HOUR]);
        bytes[35..43].copy_from_slice(&NOW.to_be_bytes());
        reseal(&mut bytes);
        let e = fault(&bytes, BOUNDS);
        assert!(
            matches!(
                e.fault,
                BatchFault::Timestamp {
                    record: Some(1),
                    side: TimestampSide::After,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("record 1 timestamp"), "{e}");
        // Without bounds, it is still refused: max_timestamp understates it.
        let e = fault(&bytes, None);
        assert!(
            matches!(
                e.fault,
                BatchFault::MaxTimestampUnderstated { record: 1, .. }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_past_timestamp_is_refused_under_a_before_bound() {
        let bounds = Some(TimestampBounds {
            before_max_ms: HOUR,
            after_max_ms: HOUR,
        });
        let e = fault(&build(Compression::Lz4, &[NOW - 2 * HOUR, NOW]), bounds);
        assert!(
            matches!(
                e.fault,
                BatchFault::Timestamp {
                    record: Some(0),
                    side: TimestampSide::Before,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("message.timestamp.before.max.ms=3600000 ms before"),
            "{e}"
        );
        // Exactly at the bounds passes; NO_TIMESTAMP is exempt.
        validate(
            &build(Compression::None, &[NOW - HOUR, NOW + HOUR, NO_TIMESTAMP]),
            bounds,
            NOW,
        )
        .unwrap();
    }

    #[test]
    fn log_append_time_batches_are_bounded_by_their_max_timestamp() {
        let mut bytes = build(Compression::None, &[NOW, NOW + 10 * HOUR]);
        bytes[21..23].copy_from_slice(&0x08i16.to_be_bytes());
        bytes[35..43].copy_from_slice(&NOW.to_be_bytes());
        reseal(&mut bytes);
        // Records read as the batch's time, NOW: passes.
        validate(&bytes, BOUNDS, NOW).unwrap();
        bytes[35..43].copy_from_slice(&i64::MAX.to_be_bytes());
        reseal(&mut bytes);
        assert!(matches!(
            fault(&bytes, BOUNDS).fault,
            BatchFault::Timestamp { record: None, .. }
        ));
    }

    #[test]
    fn a_count_mismatch_is_refused() {
        // The header claims three records; the section holds two.
        let mut bytes = build(Compression::None, &[NOW, NOW]);
        bytes[57..61].copy_from_slice(&3i32.to_be_bytes());
        bytes[23..27].copy_from_slice(&2i32.to_be_bytes());
        reseal(&mut bytes);
        let e = fault(&bytes, BOUNDS);
        assert!(matches!(e.fault, BatchFault::Invalid(_)), "{e}");
        assert!(e.to_string().contains("record length"), "{e}");
        // The header claims one record; the section holds two.
        let mut bytes = build(Compression::Zstd, &[NOW, NOW]);
        bytes[57..61].copy_from_slice(&1i32.to_be_bytes());
        bytes[23..27].copy_from_slice(&0i32.to_be_bytes());
        reseal(&mut bytes);
        let e = fault(&bytes, BOUNDS);
        assert!(
            matches!(
                e.fault,
                BatchFault::Invalid(DecodeError::TrailingBytes { .. })
            ),
            "{e}"
        );
        // last_offset_delta disagrees with the count.
        let mut bytes = build(Compression::None, &[NOW, NOW]);
        bytes[23..27].copy_from_slice(&5i32.to_be_bytes());
        reseal(&mut bytes);
        assert!(
            fault(&bytes, BOUNDS)
                .to_string()
                .contains("last_offset_delta")
        );
        // No records at all.
        let mut bytes = build(Compression::None, &[NOW]);
        bytes[57..61].copy_from_slice(&0i32.to_be_bytes());
        reseal(&mut bytes);
        assert!(fault(&bytes, BOUNDS).to_string().contains("record_count"));
    }

    #[test]
    fn bad_framing_is_refused_naming_the_field() {
        // Offset deltas 0, 2: not sequential (compaction's sparse batches are
        // for replication, not for producers).
        let mut b = BatchBuilder::new(Compression::None);
        b.push_with_offset_delta(0, &Record::from_value("a", NOW));
        b.push_with_offset_delta(2, &Record::from_value("b", NOW));
        let mut bytes = b.build_spanning(Offset(0), LeaderEpoch(-1), 1).to_vec();
        assert!(
            fault(&bytes, BOUNDS)
                .to_string()
                .contains("last_offset_delta")
        );
        bytes[23..27].copy_from_slice(&1i32.to_be_bytes());
        reseal(&mut bytes);
        let e = fault(&bytes, BOUNDS);
        assert!(e.to_string().contains("record offset delta"), "{e}");
        // A record whose length claims one byte more than its fields: the
        // value length grows by one, swallowing a byte of the header count.
        bytes = build(Compression::None, &[NOW]);
        let at = bytes.len() - 1 - "value-0".len() - 1; // the value length varint
        bytes[at] += 2; // zigzag: +1 byte
        reseal(&mut bytes);
        let e = fault(&bytes, BOUNDS);
        assert!(matches!(e.fault, BatchFault::Invalid(_)), "{e}");
        // A trailing partial batch.
        let mut bytes = build(Compression::None, &[NOW]);
        bytes.extend_from_slice(&[0u8; 20]);
        let e = fault(&bytes, BOUNDS);
        assert_eq!(e.position, 1);
        assert!(matches!(e.fault, BatchFault::Corrupt(_)), "{e}");
    }

    #[test]
    fn an_unknown_codec_is_refused() {
        for code in [5i16, 6, 7] {
            let mut bytes = build(Compression::None, &[NOW]);
            bytes[21..23].copy_from_slice(&code.to_be_bytes());
            reseal(&mut bytes);
            let e = fault(&bytes, BOUNDS);
            assert_eq!(
                e.fault,
                BatchFault::Invalid(DecodeError::UnsupportedCompression(code as u8)),
                "{e}"
            );
        }
        // A compressed section that does not decompress.
        let mut bytes = build(Compression::Zstd, &[NOW])[..BATCH_HEADER_LEN].to_vec();
        bytes.extend_from_slice(b"not a zstd frame");
        let batch_length = (bytes.len() - 12) as i32;
        bytes[8..12].copy_from_slice(&batch_length.to_be_bytes());
        reseal(&mut bytes);
        assert!(matches!(
            fault(&bytes, BOUNDS).fault,
            BatchFault::Invalid(DecodeError::Decompress { .. })
        ));
    }

    #[test]
    fn damaged_bytes_are_reported_as_a_crc_mismatch() {
        let mut bytes = build(Compression::None, &[NOW]);
        bytes[57..61].copy_from_slice(&9i32.to_be_bytes()); // not resealed
        assert!(matches!(
            fault(&bytes, BOUNDS).fault,
            BatchFault::Corrupt(DecodeError::CrcMismatch { .. })
        ));
        // Damage that still frames passes here; the log's CRC check refuses it.
        let mut bytes = build(Compression::None, &[NOW]);
        let last = bytes.len() - 2;
        bytes[last] ^= 0xff;
        validate(&bytes, BOUNDS, NOW).unwrap();
    }

    #[test]
    fn whatever_passes_decodes_and_nothing_panics() {
        // A seeded walk over mutated batches: validation never panics, and
        // every batch it accepts decodes to `record_count` records.
        let mut seed: u64 = std::env::var("RILL_BATCH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_0b47);
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..3000 {
            let codec = Compression::ALL[(next() % 5) as usize];
            let n = 1 + (next() % 4) as usize;
            let ts: Vec<i64> = (0..n).map(|_| NOW + (next() % 100) as i64).collect();
            let mut bytes = build(codec, &ts);
            for _ in 0..1 + next() % 3 {
                let i = (next() % bytes.len() as u64) as usize;
                bytes[i] = next() as u8;
            }
            if next() % 2 == 0 {
                reseal(&mut bytes);
            }
            if validate(&bytes, BOUNDS, NOW).is_ok() {
                let view = batch::BatchView::new(&bytes).unwrap();
                if view.verify_crc().is_ok() {
                    let records = view.records().unwrap_or_else(|e| {
                        panic!("round {round}: validated but does not decode: {e}")
                    });
                    assert_eq!(records.len() as i32, view.header.record_count);
                }
            }
        }
    }
}
