//! Control records: the transaction markers a partition leader writes when a
//! transaction ends (Kafka's `EndTransactionMarker`, KIP-98).
//!
//! A marker is a control batch (attributes: transactional and control) of the
//! producer whose transaction it ends, with base sequence -1 and one record:
//!
//! ```text
//! key   = version i16 (0), type i16 (0 abort, 1 commit)
//! value = version i16 (0), coordinator epoch i32
//! ```
//!
//! Only brokers write markers ([`crate::validation`] refuses control batches from
//! clients); readers never hand them to applications.

use crate::batch::{BatchBuilder, BatchHeader, BatchView, Record};
use crate::compression::Compression;
use crate::error::DecodeError;
use crate::types::{ProducerId, TimestampMs};
use bytes::Bytes;

/// How a transaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum MarkerKind {
    Abort,
    Commit,
}

impl MarkerKind {
    fn code(self) -> i16 {
        match self {
            MarkerKind::Abort => 0,
            MarkerKind::Commit => 1,
        }
    }
}

/// One transaction marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    pub kind: MarkerKind,
    /// The epoch of the transaction coordinator that wrote it (fences a stale
    /// coordinator's late markers).
    pub coordinator_epoch: i32,
}

/// The control batch ending `producer`'s transaction (base offset 0, stamped on
/// append like any batch).
pub fn marker_batch(
    producer: ProducerId,
    producer_epoch: i16,
    marker: Marker,
    now_ms: TimestampMs,
) -> Bytes {
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&0i16.to_be_bytes());
    key.extend_from_slice(&marker.kind.code().to_be_bytes());
    let mut value = Vec::with_capacity(6);
    value.extend_from_slice(&0i16.to_be_bytes());
    value.extend_from_slice(&marker.coordinator_epoch.to_be_bytes());
    let mut b = BatchBuilder::new(Compression::None)
        .producer(producer, producer_epoch, -1)
        .transactional()
        .control();
    b.push(&Record {
        key: Some(Bytes::from(key)),
        value: Some(Bytes::from(value)),
        headers: Vec::new(),
        timestamp_ms: now_ms,
    });
    b.build()
}

/// The marker a control batch holds; `Ok(None)` for a control batch of another
/// kind (Kafka has others, e.g. KRaft's; readers skip them).
pub fn parse_marker(batch: &[u8]) -> Result<Option<Marker>, DecodeError> {
    let view = BatchView::new(batch)?;
    if !view.header.is_control() {
        return Err(DecodeError::Malformed {
            field: "control batch",
            reason: "the batch is not a control batch".into(),
        });
    }
    let records = view.records()?;
    let Some(record) = records.first() else {
        return Ok(None);
    };
    let key = record.key.as_deref().unwrap_or_default();
    if key.len() < 4 {
        return Err(DecodeError::Malformed {
            field: "control record key",
            reason: format!("{} bytes, a marker's key has 4", key.len()),
        });
    }
    let kind = match i16::from_be_bytes([key[2], key[3]]) {
        0 => MarkerKind::Abort,
        1 => MarkerKind::Commit,
        _ => return Ok(None),
    };
    let value = record.value.as_deref().unwrap_or_default();
    let coordinator_epoch = if value.len() >= 6 {
        i32::from_be_bytes([value[2], value[3], value[4], value[5]])
    } else {
        -1
    };
    Ok(Some(Marker {
        kind,
        coordinator_epoch,
    }))
}

/// Whether a batch is a transaction marker's (by header only).
pub fn is_marker_header(h: &BatchHeader) -> bool {
    h.is_control() && h.is_transactional()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_round_trips_and_is_a_transactional_control_batch() {
        for kind in [MarkerKind::Abort, MarkerKind::Commit] {
            let m = Marker {
                kind,
                coordinator_epoch: 7,
            };
            let b = marker_batch(ProducerId(42), 3, m, 1_000);
            let view = BatchView::new(&b).unwrap();
            assert!(is_marker_header(&view.header));
            assert_eq!(view.header.producer_id, ProducerId(42));
            assert_eq!(view.header.producer_epoch, 3);
            assert_eq!(view.header.base_sequence, -1);
            assert_eq!(parse_marker(&b).unwrap(), Some(m));
        }
    }

    #[test]
    fn a_data_batch_is_not_a_marker() {
        let mut b = BatchBuilder::new(Compression::None);
        b.push(&Record::from_value("x", 1));
        assert!(parse_marker(&b.build()).is_err());
    }
}
