//! Decoding fetched batches into [`ConsumerRecord`]s without copying.
//!
//! Keys, values and header values are `Bytes` slices of the fetch response (or,
//! for a compressed batch, of its one decompressed buffer): one allocation per
//! batch at most, none per record. Batches wholly below the wanted offset are
//! skipped on their header alone (no CRC pass, no decompression). Every other
//! batch has its CRC checked before any record is read.
//!
//! Record layout and the record decoder itself: `rill_proto::batch::decode_records`.

use std::sync::Arc;

use bytes::Bytes;
use rill_proto::batch::{
    BATCH_HEADER_LEN, BatchHeader, decode_records_rope, records_section_rope, verify_crc_at,
};
use rill_proto::types::TimestampMs;
use rill_proto::wire::AbortedRange;
use rill_proto::{DecodeError, Header, Offset, Rope};

/// A record read from a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerRecord {
    /// Shared by the records of one partition (cheap to clone).
    pub topic: Arc<str>,
    pub partition: u32,
    pub offset: Offset,
    pub timestamp_ms: TimestampMs,
    pub key: Option<Bytes>,
    /// `None` for a tombstone.
    pub value: Option<Bytes>,
    pub headers: Vec<Header>,
}

/// Why a chunk of fetched data did not decode.
#[derive(Debug)]
pub(crate) struct BatchError {
    /// Base offset of the batch at fault.
    pub offset: Offset,
    pub error: DecodeError,
}

/// What decoding a partition's fetched bytes gave.
#[derive(Debug, Default)]
pub(crate) struct Decoded {
    /// The offset after the last whole batch seen (the next position), if any.
    pub next_offset: Option<Offset>,
}

/// The header of the batch at byte `at` of `data` (copied out: it may straddle
/// pieces), or `None` if fewer than a header's bytes remain.
fn header_at(
    data: &Rope,
    at: usize,
) -> Option<([u8; BATCH_HEADER_LEN], Result<BatchHeader, DecodeError>)> {
    let mut head = [0u8; BATCH_HEADER_LEN];
    if !data.copy_to(at, &mut head) {
        return None;
    }
    let parsed = BatchHeader::parse(&head);
    Some((head, parsed))
}

/// The whole batches of `data` in order, as (start, header), up to the first
/// partial batch or unreadable header.
fn whole_batches(data: &Rope) -> impl Iterator<Item = (usize, BatchHeader)> + '_ {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let (_, Ok(h)) = header_at(data, at)? else {
            return None;
        };
        let start = at;
        at = at
            .checked_add(h.total_size())
            .filter(|end| *end <= data.len())?;
        Some((start, h))
    })
}

/// The offset after the last whole batch in `data` (header parse only), used to
/// send the next fetch before this data is decoded. `None` if no whole batch.
pub(crate) fn next_fetch_offset(data: &Rope) -> Option<Offset> {
    whole_batches(data).last().map(|(_, h)| h.next_offset())
}

/// Decodes the records at or after `from` in `data` (whole batches, as a fetch
/// returns them; a trailing partial batch is ignored) and appends them to `out`.
///
/// `data` stays in the pieces it arrived in: records are sliced from them in
/// place, and only a record split across two pieces is copied.
pub(crate) fn decode_batches(
    topic: &Arc<str>,
    partition: u32,
    data: &Rope,
    from: Offset,
    aborted: &[AbortedRange],
    out: &mut Vec<ConsumerRecord>,
) -> Result<Decoded, BatchError> {
    let mut decoded = Decoded::default();
    out.reserve(records_after(data, from));
    let mut at = 0usize;
    while let Some((head, parsed)) = header_at(data, at) {
        let header = parsed.map_err(|error| BatchError {
            offset: Offset(i64::from_be_bytes(head[0..8].try_into().expect("8 bytes"))),
            error,
        })?;
        let size = header.total_size();
        if data.len() - at < size {
            break; // partial batch at the end of the fetch
        }
        let batch = data.slice(at, at + size);
        at += size;
        decoded.next_offset = Some(header.next_offset());
        if header.next_offset() <= from || header.is_control() || is_aborted(&header, aborted) {
            continue;
        }
        let err = |error| BatchError {
            offset: header.base_offset,
            error,
        };
        verify_crc_at(&batch, 0, &header).map_err(err)?;
        let section = records_section_rope(&header, &batch).map_err(err)?;
        decode_records_rope(&header, &section, from, |r| {
            out.push(ConsumerRecord {
                topic: topic.clone(),
                partition,
                offset: r.offset,
                timestamp_ms: r.timestamp_ms,
                key: r.key,
                value: r.value,
                headers: r.headers,
            })
        })
        .map_err(err)?;
    }
    Ok(decoded)
}

/// Whether a batch belongs to an aborted transaction (a `read_committed`
/// reader skips it; the fetch response listed the aborted ranges).
fn is_aborted(h: &BatchHeader, aborted: &[AbortedRange]) -> bool {
    h.is_transactional()
        && aborted.iter().any(|a| {
            a.producer_id == h.producer_id.0
                && a.first_offset <= h.base_offset
                && h.base_offset <= a.last_offset
        })
}

/// An upper bound on the records at or after `from` in the whole data batches of
/// `data` (header parse only), so the output grows once, not by doubling: a
/// `ConsumerRecord` is larger than a small record's bytes.
fn records_after(data: &Rope, from: Offset) -> usize {
    let count: usize = whole_batches(data)
        .filter(|(_, h)| h.next_offset() > from && !h.is_control())
        .map(|(_, h)| h.record_count.max(0) as usize)
        .sum();
    // A record takes at least 7 bytes: a corrupt count cannot reserve much.
    count.min(data.len() / 7 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_proto::batch::set_base_offset;
    use rill_proto::{BatchBuilder, Compression, Record};

    fn batch(base: i64, n: usize, codec: Compression) -> Vec<u8> {
        let mut b = BatchBuilder::new(codec);
        for i in 0..n {
            b.push(&Record {
                key: Some(Bytes::from(format!("k{}", base + i as i64))),
                value: if i % 5 == 4 {
                    None
                } else {
                    Some(Bytes::from(format!("v{}", base + i as i64)))
                },
                headers: vec![Header {
                    key: "h".into(),
                    value: Bytes::from_static(b"x"),
                }],
                timestamp_ms: 1000 + i as i64,
            });
        }
        let mut bytes = b.build().to_vec();
        set_base_offset(&mut bytes, Offset(base));
        bytes
    }

    /// `bytes` in pieces of `size` bytes, as a fetch response arrives in QUIC
    /// stream chunks (0: one piece).
    fn pieces(bytes: &[u8], size: usize) -> Rope {
        if size == 0 {
            return Rope::from(Bytes::copy_from_slice(bytes));
        }
        Rope::new(bytes.chunks(size).map(Bytes::copy_from_slice))
    }

    #[test]
    fn decodes_and_skips_below_from_across_codecs_and_pieces() {
        for (codec, piece) in Compression::ALL
            .into_iter()
            .flat_map(|c| [0, 1, 5, 13, 64].map(|p| (c, p)))
        {
            let mut data = batch(10, 10, codec);
            data.extend(batch(20, 5, codec));
            let data = pieces(&data, piece);
            let topic: Arc<str> = Arc::from("t");
            let mut out = Vec::new();
            let d = decode_batches(&topic, 3, &data, Offset(13), &[], &mut out).unwrap();
            assert_eq!(d.next_offset, Some(Offset(25)));
            assert_eq!(next_fetch_offset(&data), Some(Offset(25)));
            let offsets: Vec<i64> = out.iter().map(|r| r.offset.0).collect();
            assert_eq!(offsets, (13..25).collect::<Vec<_>>());
            for r in &out {
                assert_eq!(r.key.as_deref(), Some(format!("k{}", r.offset).as_bytes()));
                if (r.offset.0 - if r.offset.0 >= 20 { 20 } else { 10 }) % 5 == 4 {
                    assert!(r.value.is_none());
                } else {
                    assert_eq!(
                        r.value.as_deref(),
                        Some(format!("v{}", r.offset).as_bytes())
                    );
                }
                assert_eq!(r.headers[0].key, "h");
                assert_eq!(r.partition, 3);
            }
        }
    }

    /// A transactional batch of producer `pid` at `base` (one record).
    fn txn_batch(pid: i64, base: i64) -> Vec<u8> {
        let mut b = BatchBuilder::new(Compression::None)
            .producer(rill_proto::ProducerId(pid), 0, 0)
            .transactional();
        b.push(&Record::from_value(format!("p{pid}"), 1));
        let mut bytes = b.build().to_vec();
        set_base_offset(&mut bytes, Offset(base));
        bytes
    }

    #[test]
    fn aborted_transactions_and_markers_are_skipped() {
        let marker = |pid: i64, base: i64, kind| {
            let m = rill_proto::control::Marker {
                kind,
                coordinator_epoch: 0,
            };
            let mut b =
                rill_proto::control::marker_batch(rill_proto::ProducerId(pid), 0, m, 1).to_vec();
            set_base_offset(&mut b, Offset(base));
            b
        };
        use rill_proto::control::MarkerKind::{Abort, Commit};
        let mut data = txn_batch(1, 0); // aborted below
        data.extend(txn_batch(2, 1)); // committed
        data.extend(marker(1, 2, Abort));
        data.extend(txn_batch(1, 3)); // producer 1's next transaction: committed
        data.extend(marker(2, 4, Commit));
        data.extend(marker(1, 5, Commit));
        let data = pieces(&data, 11);
        let topic: Arc<str> = Arc::from("t");
        let aborted = [AbortedRange {
            producer_id: 1,
            first_offset: Offset(0),
            last_offset: Offset(2),
        }];
        let mut out = Vec::new();
        let d = decode_batches(&topic, 0, &data, Offset(0), &aborted, &mut out).unwrap();
        let offsets: Vec<i64> = out.iter().map(|r| r.offset.0).collect();
        assert_eq!(offsets, vec![1, 3], "no aborted record, no marker");
        assert_eq!(
            d.next_offset,
            Some(Offset(6)),
            "the position passes the markers"
        );
        // Without the aborted list (read_uncommitted) the data is all there.
        let mut out = Vec::new();
        decode_batches(&topic, 0, &data, Offset(0), &[], &mut out).unwrap();
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn partial_trailing_batch_is_ignored_and_corruption_reported() {
        let mut data = batch(0, 3, Compression::None);
        let second = batch(3, 3, Compression::None);
        data.extend_from_slice(&second[..second.len() - 4]);
        let data = pieces(&data, 17);
        let topic: Arc<str> = Arc::from("t");
        let mut out = Vec::new();
        let d = decode_batches(&topic, 0, &data, Offset(0), &[], &mut out).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(d.next_offset, Some(Offset(3)));

        let mut bad = batch(7, 2, Compression::None);
        let last = bad.len() - 1;
        bad[last] ^= 0x55;
        let err = decode_batches(&topic, 0, &pieces(&bad, 9), Offset(0), &[], &mut Vec::new())
            .unwrap_err();
        assert_eq!(err.offset, Offset(7));
        assert!(matches!(err.error, DecodeError::CrcMismatch { .. }));
    }
}
