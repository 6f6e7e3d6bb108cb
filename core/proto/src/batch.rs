//! The record batch: Rill's unit of storage and transfer (Kafka's v2 layout, magic 2).
//!
//! A batch is encoded once, by the producer, and then travels and lies on disk as
//! those exact bytes. The broker only stamps the fields *outside* the CRC (base
//! offset and partition leader epoch), so it never re-encodes a batch on the hot path.
//!
//! ```text
//! offset  size  field
//!      0     8  base_offset            i64   (stamped by the leader)
//!      8     4  batch_length           i32   bytes after this field
//!     12     4  partition_leader_epoch i32   (stamped by the leader)
//!     16     1  magic                  i8    = 2
//!     17     4  crc                    u32   CRC32C of bytes [21, end)
//!     21     2  attributes             i16   bits 0-2 compression, 3 timestamp type,
//!                                            4 transactional, 5 control
//!     23     4  last_offset_delta      i32
//!     27     8  base_timestamp         i64   ms
//!     35     8  max_timestamp          i64   ms
//!     43     8  producer_id            i64
//!     51     2  producer_epoch         i16
//!     53     4  base_sequence          i32
//!     57     4  record_count           i32
//!     61     -  records (compressed as a whole when compression != none)
//! ```
//!
//! Each record is varint-framed: length (zigzag varint), attributes (i8),
//! timestamp delta (zigzag varlong), offset delta (zigzag varint), key length + key
//! (-1 = null), value length + value (-1 = null, a tombstone), header count, then
//! per header: key length + UTF-8 key, value length + value.
//!
//! Invariants: decoding never panics and never allocates more than the input (or a
//! stated bound) justifies; every error names the field that did not fit.

use crate::compression::{self, Compression};
use crate::error::DecodeError;
use crate::rope::{Rope, RopeReader};
use crate::types::{LeaderEpoch, Offset, ProducerId, TimestampMs};
use crate::varint;
use bytes::Bytes;

/// Bytes before `batch_length` counts: base offset (8) + batch length (4).
pub const LOG_OVERHEAD: usize = 12;
/// Size of the fixed batch header, up to and including the record count.
pub const BATCH_HEADER_LEN: usize = 61;
/// The only batch format version Rill reads and writes.
pub const MAGIC: i8 = 2;
/// Upper bound on a batch's decompressed records section, whatever the batch claims.
pub const MAX_UNCOMPRESSED_RECORDS_BYTES: usize = 64 * 1024 * 1024;

const CRC_OFFSET: usize = 17;
const ATTRIBUTES_OFFSET: usize = 21;
const LEADER_EPOCH_OFFSET: usize = 12;

const ATTR_COMPRESSION_MASK: i16 = 0x07;
const ATTR_LOG_APPEND_TIME: i16 = 0x08;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;

/// A record header: a UTF-8 key and an opaque value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub key: String,
    pub value: Bytes,
}

/// A record as a producer hands it over. A `None` value is a tombstone.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<Header>,
    pub timestamp_ms: TimestampMs,
}

impl Record {
    /// A record with a value and the given timestamp, no key and no headers.
    pub fn from_value(value: impl Into<Bytes>, timestamp_ms: TimestampMs) -> Record {
        Record {
            key: None,
            value: Some(value.into()),
            headers: Vec::new(),
            timestamp_ms,
        }
    }
}

/// A record read back out of a batch, with its assigned offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub offset: Offset,
    pub timestamp_ms: TimestampMs,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<Header>,
}

impl StoredRecord {
    pub fn is_tombstone(&self) -> bool {
        self.value.is_none()
    }
}

/// The fixed header of a batch, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: Offset,
    pub batch_length: i32,
    pub leader_epoch: LeaderEpoch,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: TimestampMs,
    pub max_timestamp: TimestampMs,
    pub producer_id: ProducerId,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

impl BatchHeader {
    /// Parses the fixed header at the start of `buf`. Checks only what the header
    /// alone can tell: enough bytes for it, magic, and a plausible length and count.
    pub fn parse(buf: &[u8]) -> Result<BatchHeader, DecodeError> {
        if buf.len() < BATCH_HEADER_LEN {
            return Err(DecodeError::Truncated {
                field: "batch header",
                needed: BATCH_HEADER_LEN,
                available: buf.len(),
            });
        }
        let header = BatchHeader {
            base_offset: Offset(be_i64(buf, 0)),
            batch_length: be_i32(buf, 8),
            leader_epoch: LeaderEpoch(be_i32(buf, 12)),
            magic: buf[16] as i8,
            crc: u32::from_be_bytes(buf[17..21].try_into().expect("4 bytes")),
            attributes: be_i16(buf, 21),
            last_offset_delta: be_i32(buf, 23),
            base_timestamp: be_i64(buf, 27),
            max_timestamp: be_i64(buf, 35),
            producer_id: ProducerId(be_i64(buf, 43)),
            producer_epoch: be_i16(buf, 51),
            base_sequence: be_i32(buf, 53),
            record_count: be_i32(buf, 57),
        };
        if header.magic != MAGIC {
            return Err(DecodeError::UnsupportedMagic(header.magic));
        }
        if (header.batch_length as i64) < (BATCH_HEADER_LEN - LOG_OVERHEAD) as i64 {
            return Err(DecodeError::InvalidValue {
                field: "batch_length",
                value: header.batch_length as i64,
            });
        }
        if header.record_count < 0 {
            return Err(DecodeError::InvalidValue {
                field: "record_count",
                value: header.record_count as i64,
            });
        }
        if header.last_offset_delta < 0 {
            return Err(DecodeError::InvalidValue {
                field: "last_offset_delta",
                value: header.last_offset_delta as i64,
            });
        }
        Ok(header)
    }

    /// Total bytes of the batch, header included.
    pub fn total_size(&self) -> usize {
        LOG_OVERHEAD + self.batch_length as usize
    }

    /// The offset of the last record of the batch (base + last offset delta).
    pub fn last_offset(&self) -> Offset {
        self.base_offset.plus(self.last_offset_delta as i64)
    }

    /// The offset right after the batch.
    pub fn next_offset(&self) -> Offset {
        self.last_offset().plus(1)
    }

    pub fn compression(&self) -> Result<Compression, DecodeError> {
        Compression::from_attribute((self.attributes & ATTR_COMPRESSION_MASK) as u8)
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }

    pub fn is_log_append_time(&self) -> bool {
        self.attributes & ATTR_LOG_APPEND_TIME != 0
    }
}

/// A view over exactly one batch's bytes, its header parsed.
#[derive(Debug, Clone, Copy)]
pub struct BatchView<'a> {
    pub header: BatchHeader,
    bytes: &'a [u8],
}

impl<'a> BatchView<'a> {
    /// Views the batch at the start of `buf`; `buf` may continue past it.
    pub fn new(buf: &'a [u8]) -> Result<BatchView<'a>, DecodeError> {
        let header = BatchHeader::parse(buf)?;
        let size = header.total_size();
        if buf.len() < size {
            return Err(DecodeError::Truncated {
                field: "batch body",
                needed: size,
                available: buf.len(),
            });
        }
        Ok(BatchView {
            header,
            bytes: &buf[..size],
        })
    }

    /// The batch's bytes, exactly as stored.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// CRC32C of everything after the crc field, as it should be stored.
    pub fn computed_crc(&self) -> u32 {
        crate::crc::crc32c(&self.bytes[ATTRIBUTES_OFFSET..])
    }

    /// Checks the stored CRC against the bytes.
    pub fn verify_crc(&self) -> Result<(), DecodeError> {
        let actual = self.computed_crc();
        if actual != self.header.crc {
            return Err(DecodeError::CrcMismatch {
                stored: self.header.crc,
                computed: actual,
            });
        }
        Ok(())
    }

    /// The records section as stored (compressed if the batch is).
    pub fn records_section(&self) -> &'a [u8] {
        &self.bytes[BATCH_HEADER_LEN..]
    }

    /// The first record whose timestamp is at or after `ts`, as (offset,
    /// timestamp): what ListOffsets by timestamp answers. A batch with log-append
    /// time answers its first record at the batch's time. `None` when the batch
    /// holds nothing that new (its max timestamp is checked first, so a batch
    /// entirely older is not decoded).
    pub fn first_at_or_after(
        &self,
        ts: TimestampMs,
    ) -> Result<Option<(Offset, TimestampMs)>, DecodeError> {
        let h = &self.header;
        if h.max_timestamp < ts {
            return Ok(None);
        }
        let records = self.records()?;
        Ok(if h.is_log_append_time() {
            records.first().map(|r| (r.offset, h.max_timestamp))
        } else {
            records
                .iter()
                .find(|r| r.timestamp_ms >= ts)
                .map(|r| (r.offset, r.timestamp_ms))
        })
    }

    /// Decompresses and decodes every record, with absolute offsets.
    /// Checks the CRC first; checks that the record count and offset deltas agree
    /// with the header.
    pub fn records(&self) -> Result<Vec<StoredRecord>, DecodeError> {
        self.verify_crc()?;
        let batch = Bytes::copy_from_slice(self.bytes);
        let section = records_section_bytes(&self.header, &batch)?;
        let mut out =
            Vec::with_capacity((self.header.record_count as usize).min(section.len() / 7 + 1));
        decode_records(&self.header, &section, Offset(i64::MIN), |r| out.push(r))?;
        Ok(out)
    }
}

/// Iterates over the whole batches in `buf`. Yields an error (and stops) at the
/// first batch that does not parse; a trailing partial batch is an error too.
pub fn batches(buf: &[u8]) -> BatchIter<'_> {
    BatchIter { buf, failed: false }
}

#[derive(Debug)]
pub struct BatchIter<'a> {
    buf: &'a [u8],
    failed: bool,
}

impl<'a> Iterator for BatchIter<'a> {
    type Item = Result<BatchView<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() || self.failed {
            return None;
        }
        match BatchView::new(self.buf) {
            Ok(view) => {
                self.buf = &self.buf[view.as_bytes().len()..];
                Some(Ok(view))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// [`batches`] of bytes held in pieces: each whole batch as (its position,
/// its header), read without joining the pieces (only a header that straddles
/// two is copied, onto the stack). Yields an error (and stops) at the first
/// batch that does not parse; a trailing partial batch is an error too.
pub fn rope_batches(rope: &Rope) -> RopeBatchIter<'_> {
    RopeBatchIter {
        rope,
        at: 0,
        failed: false,
    }
}

#[derive(Debug)]
pub struct RopeBatchIter<'a> {
    rope: &'a Rope,
    at: usize,
    failed: bool,
}

impl Iterator for RopeBatchIter<'_> {
    type Item = Result<(usize, BatchHeader), DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        let left = self.rope.len() - self.at;
        if left == 0 || self.failed {
            return None;
        }
        let mut head = [0u8; BATCH_HEADER_LEN];
        let n = left.min(BATCH_HEADER_LEN);
        self.rope.copy_to(self.at, &mut head[..n]);
        let parsed = BatchHeader::parse(&head[..n]).and_then(|h| {
            let size = h.total_size();
            if left < size {
                return Err(DecodeError::Truncated {
                    field: "batch body",
                    needed: size,
                    available: left,
                });
            }
            Ok(h)
        });
        match parsed {
            Ok(h) => {
                let at = self.at;
                self.at += h.total_size();
                Some(Ok((at, h)))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// Checks the CRC of the whole batch at `at` in `rope` (its header `header`);
/// a batch that runs past the rope's end is an error, not a panic.
pub fn verify_crc_at(rope: &Rope, at: usize, header: &BatchHeader) -> Result<(), DecodeError> {
    let available = rope.len().saturating_sub(at);
    if available < header.total_size() {
        return Err(DecodeError::Truncated {
            field: "batch body",
            needed: header.total_size(),
            available,
        });
    }
    let computed = rope.crc32c_range(at + ATTRIBUTES_OFFSET, at + header.total_size());
    if computed != header.crc {
        return Err(DecodeError::CrcMismatch {
            stored: header.crc,
            computed,
        });
    }
    Ok(())
}

/// Stamps the base offset into a batch's bytes (outside the CRC).
pub fn set_base_offset(batch: &mut [u8], offset: Offset) {
    batch[0..8].copy_from_slice(&offset.0.to_be_bytes());
}

/// Stamps the partition leader epoch into a batch's bytes (outside the CRC).
pub fn set_leader_epoch(batch: &mut [u8], epoch: LeaderEpoch) {
    batch[LEADER_EPOCH_OFFSET..LEADER_EPOCH_OFFSET + 4].copy_from_slice(&epoch.0.to_be_bytes());
}

/// Recomputes the CRC of one whole batch (at the start of `batch`) after a
/// field inside the checksummed part changed.
fn reseal_crc(batch: &mut [u8]) {
    let crc = crate::crc::crc32c(&batch[ATTRIBUTES_OFFSET..]);
    batch[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Stamps an idempotent producer's identity (id, epoch, base sequence) into one
/// whole batch and recomputes its CRC (the fields lie inside the checksummed
/// part). The producer does this when a batch is first sent, so a batch built
/// before the producer id was known still gets one.
pub fn set_producer(batch: &mut [u8], id: ProducerId, epoch: i16, base_sequence: i32) {
    batch[43..51].copy_from_slice(&id.0.to_be_bytes());
    batch[51..53].copy_from_slice(&epoch.to_be_bytes());
    batch[53..57].copy_from_slice(&base_sequence.to_be_bytes());
    reseal_crc(batch);
}

/// Marks one whole batch as part of its producer's transaction (attribute
/// bit 4) and recomputes its CRC; stamped with [`set_producer`] when a
/// transactional producer first sends the batch.
pub fn set_transactional(batch: &mut [u8]) {
    let attributes = i16::from_be_bytes([batch[ATTRIBUTES_OFFSET], batch[ATTRIBUTES_OFFSET + 1]])
        | ATTR_TRANSACTIONAL;
    batch[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2].copy_from_slice(&attributes.to_be_bytes());
    reseal_crc(batch);
}

/// One whole batch (at the start of `batch`) whose lz4 records section is in
/// Rill's legacy block form, rewritten as Kafka writes lz4: the same records in
/// an LZ4 frame, with the batch length and CRC recomputed (every other field
/// kept). `None` when there is nothing to rewrite: not lz4, or already a frame.
/// The stored CRC is checked first, so a damaged batch is an error rather than
/// one resealed with a fresh CRC.
pub fn lz4_legacy_to_frame(batch: &[u8]) -> Result<Option<Vec<u8>>, DecodeError> {
    let view = BatchView::new(batch)?;
    if view.header.compression()? != Compression::Lz4
        || !compression::is_legacy_lz4(view.records_section())
    {
        return Ok(None);
    }
    view.verify_crc()?;
    let plain = compression::decompress(
        Compression::Lz4,
        view.records_section(),
        MAX_UNCOMPRESSED_RECORDS_BYTES,
    )?;
    let framed = compression::compress(Compression::Lz4, &plain);
    let mut out = Vec::with_capacity(BATCH_HEADER_LEN + framed.len());
    out.extend_from_slice(&view.as_bytes()[..BATCH_HEADER_LEN]);
    out.extend_from_slice(&framed);
    let batch_length = (out.len() - LOG_OVERHEAD) as i32;
    out[8..12].copy_from_slice(&batch_length.to_be_bytes());
    reseal_crc(&mut out);
    Ok(Some(out))
}

/// The records section of one whole batch held in `batch` (whose header is
/// `header`), decompressed: a slice of `batch` when uncompressed, else one new
/// buffer, bounded by [`MAX_UNCOMPRESSED_RECORDS_BYTES`]. Does not check the CRC.
pub fn records_section_bytes(header: &BatchHeader, batch: &Bytes) -> Result<Bytes, DecodeError> {
    let stored = batch.slice(BATCH_HEADER_LEN..header.total_size().min(batch.len()));
    match header.compression()? {
        Compression::None => Ok(stored),
        codec => Ok(Bytes::from(compression::decompress(
            codec,
            &stored,
            MAX_UNCOMPRESSED_RECORDS_BYTES,
        )?)),
    }
}

/// [`records_section_bytes`] of a batch held in pieces: slices of them when
/// uncompressed, else one new (decompressed) buffer.
pub fn records_section_rope(header: &BatchHeader, batch: &Rope) -> Result<Rope, DecodeError> {
    let stored = batch.slice(
        BATCH_HEADER_LEN.min(batch.len()),
        header.total_size().min(batch.len()),
    );
    match header.compression()? {
        Compression::None => Ok(stored),
        codec => Ok(Rope::from(Bytes::from(compression::decompress(
            codec,
            &stored.to_bytes(),
            MAX_UNCOMPRESSED_RECORDS_BYTES,
        )?))),
    }
}

/// Decodes a (decompressed) records section without copying: keys, values and
/// header values are slices of `section`. Calls `f` for each record at or after
/// `from`; records below it are checked for framing and offset order only. Checks
/// that the record count and offset deltas agree with the header and that nothing
/// trails the last record.
pub fn decode_records(
    header: &BatchHeader,
    section: &Bytes,
    from: Offset,
    mut f: impl FnMut(StoredRecord),
) -> Result<(), DecodeError> {
    let mut buf: &[u8] = section;
    let mut last_delta: i64 = -1;
    for _ in 0..header.record_count {
        let len = varint::read_varint(&mut buf, "record length")?;
        if len < 0 || len as usize > buf.len() {
            return Err(DecodeError::InvalidLength {
                field: "record length",
                value: len as i64,
            });
        }
        let rec = take(&mut buf, len as usize, "record")?;
        if let Some(r) = decode_record(header, section, rec, &mut last_delta, from)? {
            f(r);
        }
    }
    if !buf.is_empty() {
        return Err(DecodeError::TrailingBytes {
            field: "records",
            count: buf.len(),
        });
    }
    Ok(())
}

/// [`decode_records`] of a records section held in pieces (as a fetch
/// response arrives): a record inside one piece is decoded in place, one split
/// across pieces from a copy of its own bytes.
pub fn decode_records_rope(
    header: &BatchHeader,
    section: &Rope,
    from: Offset,
    mut f: impl FnMut(StoredRecord),
) -> Result<(), DecodeError> {
    if let [one] = section.pieces() {
        return decode_records(header, one, from, f);
    }
    let mut reader = RopeReader::new(section);
    let mut last_delta: i64 = -1;
    for _ in 0..header.record_count {
        let len = reader.read_varint("record length")?;
        if len < 0 || len as usize > reader.remaining() {
            return Err(DecodeError::InvalidLength {
                field: "record length",
                value: len as i64,
            });
        }
        let (source, range) = reader.take(len as usize).ok_or(DecodeError::Truncated {
            field: "record",
            needed: len as usize,
            available: reader.remaining(),
        })?;
        if let Some(r) = decode_record(header, &source, &source[range], &mut last_delta, from)? {
            f(r);
        }
    }
    if reader.remaining() > 0 {
        return Err(DecodeError::TrailingBytes {
            field: "records",
            count: reader.remaining(),
        });
    }
    Ok(())
}

/// Decodes one record, `rec` (its bytes after the length), which lies inside
/// `source`: keys and values are slices of `source`. `None` for a record below
/// `from` (checked for offset order only).
fn decode_record(
    header: &BatchHeader,
    source: &Bytes,
    mut rec: &[u8],
    last_delta: &mut i64,
    from: Offset,
) -> Result<Option<StoredRecord>, DecodeError> {
    let len = rec.len();
    take(&mut rec, 1, "record attributes")?;
    let ts_delta = varint::read_varlong(&mut rec, "record timestamp delta")?;
    let offset_delta = varint::read_varint(&mut rec, "record offset delta")? as i64;
    if offset_delta <= *last_delta || offset_delta > header.last_offset_delta as i64 {
        return Err(DecodeError::InvalidValue {
            field: "record offset delta",
            value: offset_delta,
        });
    }
    *last_delta = offset_delta;
    let offset = header.base_offset.plus(offset_delta);
    if offset < from {
        return Ok(None);
    }
    let key = slice_nullable(source, &mut rec, "record key")?;
    let value = slice_nullable(source, &mut rec, "record value")?;
    let header_count = varint::read_varint(&mut rec, "record header count")?;
    if header_count < 0 || header_count as usize > rec.len() {
        return Err(DecodeError::InvalidLength {
            field: "record header count",
            value: header_count as i64,
        });
    }
    let mut headers = Vec::with_capacity(header_count as usize);
    for _ in 0..header_count {
        let key =
            slice_nullable(source, &mut rec, "header key")?.ok_or(DecodeError::InvalidLength {
                field: "header key",
                value: -1,
            })?;
        let key = std::str::from_utf8(&key)
            .map_err(|_| DecodeError::InvalidUtf8 {
                field: "header key",
            })?
            .to_string();
        let value = slice_nullable(source, &mut rec, "header value")?.unwrap_or_default();
        headers.push(Header { key, value });
    }
    if !rec.is_empty() {
        return Err(DecodeError::InvalidLength {
            field: "record length",
            value: len as i64,
        });
    }
    let timestamp_ms = if header.is_log_append_time() {
        header.max_timestamp
    } else {
        header.base_timestamp.wrapping_add(ts_delta)
    };
    Ok(Some(StoredRecord {
        offset,
        timestamp_ms,
        key,
        value,
        headers,
    }))
}

fn take<'a>(buf: &mut &'a [u8], n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
    if buf.len() < n {
        return Err(DecodeError::Truncated {
            field,
            needed: n,
            available: buf.len(),
        });
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

/// Reads a length-prefixed (-1 = null) field of `buf`, a suffix of `section`, as a
/// slice of `section`.
fn slice_nullable(
    section: &Bytes,
    buf: &mut &[u8],
    field: &'static str,
) -> Result<Option<Bytes>, DecodeError> {
    let len = varint::read_varint(buf, field)?;
    if len == -1 {
        return Ok(None);
    }
    if len < 0 {
        return Err(DecodeError::InvalidLength {
            field,
            value: len as i64,
        });
    }
    let bytes = take(buf, len as usize, field)?;
    Ok(Some(section.slice_ref(bytes)))
}

/// Builds one batch from records. Offsets start at 0 (the leader stamps the real
/// base offset); the leader epoch is -1 until stamped.
#[derive(Debug)]
pub struct BatchBuilder {
    compression: Compression,
    producer_id: ProducerId,
    producer_epoch: i16,
    base_sequence: i32,
    attributes_extra: i16,
    /// The batch as it will be sent: `BATCH_HEADER_LEN` bytes kept for the
    /// header (written by `build`), then the encoded records, so an
    /// uncompressed batch is built in place, with no copy.
    records: Vec<u8>,
    count: i32,
    last_offset_delta: i32,
    base_timestamp: Option<TimestampMs>,
    max_timestamp: TimestampMs,
}

impl BatchBuilder {
    pub fn new(compression: Compression) -> BatchBuilder {
        BatchBuilder::with_capacity(compression, 0)
    }

    /// A builder whose buffer holds `bytes` of records before it grows (a
    /// producer passes its batch size, so filling a batch never copies it).
    pub fn with_capacity(compression: Compression, bytes: usize) -> BatchBuilder {
        let mut records = Vec::with_capacity(BATCH_HEADER_LEN + bytes);
        records.resize(BATCH_HEADER_LEN, 0);
        BatchBuilder {
            compression,
            producer_id: ProducerId::NONE,
            producer_epoch: -1,
            base_sequence: -1,
            attributes_extra: 0,
            records,
            count: 0,
            last_offset_delta: -1,
            base_timestamp: None,
            max_timestamp: -1,
        }
    }

    /// Marks the batch as written by an idempotent producer.
    pub fn producer(mut self, id: ProducerId, epoch: i16, base_sequence: i32) -> BatchBuilder {
        self.producer_id = id;
        self.producer_epoch = epoch;
        self.base_sequence = base_sequence;
        self
    }

    /// Marks the batch as part of a transaction (its producer's current one).
    pub fn transactional(mut self) -> BatchBuilder {
        self.attributes_extra |= ATTR_TRANSACTIONAL;
        self
    }

    /// Marks the batch as a control batch (transaction markers and the like).
    pub fn control(mut self) -> BatchBuilder {
        self.attributes_extra |= ATTR_CONTROL;
        self
    }

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes of encoded (uncompressed) records plus the header: an upper bound on
    /// the batch size when compression is on.
    pub fn estimated_size(&self) -> usize {
        self.records.len()
    }

    /// Appends a record at the next offset delta.
    pub fn push(&mut self, record: &Record) {
        let delta = self.last_offset_delta + 1;
        self.push_with_offset_delta(delta, record);
    }

    /// Appends a record at an explicit offset delta (compaction keeps the offsets of
    /// the records it retains). Deltas must strictly increase.
    pub fn push_with_offset_delta(&mut self, offset_delta: i32, record: &Record) {
        assert!(
            offset_delta > self.last_offset_delta,
            "offset deltas must strictly increase ({offset_delta} after {})",
            self.last_offset_delta
        );
        let base_ts = *self.base_timestamp.get_or_insert(record.timestamp_ms);
        self.max_timestamp = self.max_timestamp.max(record.timestamp_ms);
        // Encode straight into `records`: the body length comes first, so compute
        // it, then write the body in place (same bytes as building it apart).
        let ts_delta = record.timestamp_ms.wrapping_sub(base_ts);
        let key = record.key.as_deref();
        let value = record.value.as_deref();
        let mut body_len = 1 // record attributes
            + varlong_len(ts_delta)
            + varint_len(offset_delta)
            + nullable_bytes_len(key)
            + nullable_bytes_len(value)
            + varint_len(record.headers.len() as i32);
        for h in &record.headers {
            body_len +=
                nullable_bytes_len(Some(h.key.as_bytes())) + nullable_bytes_len(Some(&h.value));
        }
        let out = &mut self.records;
        out.reserve(varint_len(body_len as i32) + body_len);
        varint::write_varint(out, body_len as i32);
        let body_start = out.len();
        out.push(0u8); // record attributes: unused
        varint::write_varlong(out, ts_delta);
        varint::write_varint(out, offset_delta);
        write_nullable_bytes(out, key);
        write_nullable_bytes(out, value);
        varint::write_varint(out, record.headers.len() as i32);
        for h in &record.headers {
            write_nullable_bytes(out, Some(h.key.as_bytes()));
            write_nullable_bytes(out, Some(&h.value));
        }
        debug_assert_eq!(out.len() - body_start, body_len, "record body length");
        self.count += 1;
        self.last_offset_delta = offset_delta;
    }

    /// Encodes the batch with base offset 0 and leader epoch -1.
    pub fn build(self) -> Bytes {
        self.build_at(Offset(0), LeaderEpoch(-1))
    }

    /// Encodes the batch with the given base offset and leader epoch, and a last
    /// offset delta that is at least `min_last_offset_delta` (compaction keeps the
    /// batch's original offset range even when it drops the last record).
    pub fn build_at(self, base_offset: Offset, epoch: LeaderEpoch) -> Bytes {
        self.build_spanning(base_offset, epoch, 0)
    }

    pub fn build_spanning(
        self,
        base_offset: Offset,
        epoch: LeaderEpoch,
        min_last_offset_delta: i32,
    ) -> Bytes {
        let attributes = self.compression.attribute() as i16 | self.attributes_extra;
        let last_offset_delta = self.last_offset_delta.max(min_last_offset_delta).max(0);
        let base_ts = self.base_timestamp.unwrap_or(-1);
        // Uncompressed records are already in place behind the header's room;
        // compressed ones are copied once, compressed, behind a new one.
        let mut out = match self.compression {
            // A batch closed short of its capacity (by linger) gives the rest
            // back rather than hold it until acknowledged (one copy of what it
            // holds; a batch closed full keeps its buffer).
            Compression::None if self.records.capacity() > self.records.len() / 4 * 5 => {
                let mut records = self.records;
                records.shrink_to_fit();
                records
            }
            Compression::None => self.records,
            codec => {
                let compressed = compression::compress(codec, &self.records[BATCH_HEADER_LEN..]);
                let mut out = Vec::with_capacity(BATCH_HEADER_LEN + compressed.len());
                out.resize(BATCH_HEADER_LEN, 0);
                out.extend_from_slice(&compressed);
                out
            }
        };
        let batch_length = (out.len() - LOG_OVERHEAD) as i32;
        let mut header = &mut out[..BATCH_HEADER_LEN];
        for field in [
            &base_offset.0.to_be_bytes()[..],
            &batch_length.to_be_bytes(),
            &epoch.0.to_be_bytes(),
            &[MAGIC as u8],
            &[0u8; 4], // crc, filled below
            &attributes.to_be_bytes(),
            &last_offset_delta.to_be_bytes(),
            &base_ts.to_be_bytes(),
            &self.max_timestamp.to_be_bytes(),
            &self.producer_id.0.to_be_bytes(),
            &self.producer_epoch.to_be_bytes(),
            &self.base_sequence.to_be_bytes(),
            &self.count.to_be_bytes(),
        ] {
            let (dst, rest) = header.split_at_mut(field.len());
            dst.copy_from_slice(field);
            header = rest;
        }
        debug_assert!(header.is_empty(), "the header fills BATCH_HEADER_LEN");
        reseal_crc(&mut out);
        Bytes::from(out)
    }
}

/// Bytes of an unsigned LEB128 encoding of `v`.
fn unsigned_varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Bytes of `varint::write_varint(v)`.
fn varint_len(v: i32) -> usize {
    unsigned_varint_len(((v << 1) ^ (v >> 31)) as u32 as u64)
}

/// Bytes of `varint::write_varlong(v)`.
fn varlong_len(v: i64) -> usize {
    unsigned_varint_len(((v << 1) ^ (v >> 63)) as u64)
}

/// Bytes of `write_nullable_bytes(bytes)`.
fn nullable_bytes_len(bytes: Option<&[u8]>) -> usize {
    match bytes {
        None => varint_len(-1),
        Some(b) => varint_len(b.len() as i32) + b.len(),
    }
}

fn write_nullable_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => varint::write_varint(out, -1),
        Some(b) => {
            varint::write_varint(out, b.len() as i32);
            out.extend_from_slice(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_lengths_match_the_encoder() {
        let ints = [0, 1, -1, 63, 64, -64, -65, 8191, 8192, i32::MAX, i32::MIN];
        for v in ints {
            let mut out = Vec::new();
            varint::write_varint(&mut out, v);
            assert_eq!(varint_len(v), out.len(), "varint {v}");
        }
        let longs = [0, 1, -1, 1 << 20, -(1 << 40), i64::MAX, i64::MIN];
        for v in longs {
            let mut out = Vec::new();
            varint::write_varlong(&mut out, v);
            assert_eq!(varlong_len(v), out.len(), "varlong {v}");
        }
    }
    use proptest::prelude::*;

    fn arb_bytes() -> impl Strategy<Value = Option<Bytes>> {
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from))
    }

    fn arb_record() -> impl Strategy<Value = Record> {
        (
            arb_bytes(),
            arb_bytes(),
            proptest::collection::vec(
                ("[a-z]{0,8}", proptest::collection::vec(any::<u8>(), 0..16)),
                0..3,
            ),
            0i64..2_000_000_000_000,
        )
            .prop_map(|(key, value, headers, ts)| Record {
                key,
                value,
                headers: headers
                    .into_iter()
                    .map(|(k, v)| Header {
                        key: k,
                        value: Bytes::from(v),
                    })
                    .collect(),
                timestamp_ms: ts,
            })
    }

    fn arb_compression() -> impl Strategy<Value = Compression> {
        prop_oneof![
            Just(Compression::None),
            Just(Compression::Gzip),
            Just(Compression::Snappy),
            Just(Compression::Lz4),
            Just(Compression::Zstd)
        ]
    }

    proptest! {
        #[test]
        fn encode_decode_is_identity(
            records in proptest::collection::vec(arb_record(), 1..20),
            compression in arb_compression(),
            base in 0i64..1_000_000_000,
            epoch in 0i32..1000,
            capacity in 0usize..4096,
        ) {
            let mut b = BatchBuilder::new(compression);
            // A builder with room up front builds the same bytes.
            let mut roomy = BatchBuilder::with_capacity(compression, capacity);
            for r in &records { b.push(r); roomy.push(r); }
            prop_assert_eq!(roomy.estimated_size(), b.estimated_size());
            let bytes = b.build();
            prop_assert_eq!(&roomy.build(), &bytes);
            let mut bytes = bytes.to_vec();
            set_base_offset(&mut bytes, Offset(base));
            set_leader_epoch(&mut bytes, LeaderEpoch(epoch));
            let view = BatchView::new(&bytes).unwrap();
            prop_assert_eq!(view.header.base_offset, Offset(base));
            prop_assert_eq!(view.header.leader_epoch, LeaderEpoch(epoch));
            prop_assert_eq!(view.header.record_count as usize, records.len());
            prop_assert_eq!(view.header.last_offset(), Offset(base + records.len() as i64 - 1));
            prop_assert_eq!(view.header.max_timestamp, records.iter().map(|r| r.timestamp_ms).max().unwrap());
            let decoded = view.records().unwrap();
            prop_assert_eq!(decoded.len(), records.len());
            for (i, (d, r)) in decoded.iter().zip(&records).enumerate() {
                prop_assert_eq!(d.offset, Offset(base + i as i64));
                prop_assert_eq!(&d.key, &r.key);
                prop_assert_eq!(&d.value, &r.value);
                prop_assert_eq!(&d.headers, &r.headers);
                prop_assert_eq!(d.timestamp_ms, r.timestamp_ms);
            }
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            for v in batches(&bytes).flatten() {
                let _ = v.records();
            }
        }

        #[test]
        fn decode_of_mutated_batch_never_panics(
            records in proptest::collection::vec(arb_record(), 1..5),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut b = BatchBuilder::new(Compression::None);
            for r in &records { b.push(r); }
            let mut bytes = b.build().to_vec();
            for (idx, v) in flips { let i = idx.index(bytes.len()); bytes[i] = v; }
            if let Ok(view) = BatchView::new(&bytes) {
                // Recompute the CRC so decoding goes past the CRC check into the records.
                let crc = view.computed_crc();
                bytes[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
                if let Ok(view) = BatchView::new(&bytes) { let _ = view.records(); }
            }
        }
    }

    /// `bytes` cut at `cuts` (positions, any order, out-of-range ones ignored).
    fn cut(bytes: &[u8], cuts: &[usize]) -> Rope {
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        at.extend([0, bytes.len()]);
        at.sort_unstable();
        Rope::new(
            at.windows(2)
                .map(|w| Bytes::copy_from_slice(&bytes[w[0]..w[1]])),
        )
    }

    proptest! {
        #[test]
        fn a_batch_in_pieces_decodes_as_the_joined_batch(
            records in proptest::collection::vec(arb_record(), 1..20),
            compression in arb_compression(),
            cuts in proptest::collection::vec(any::<usize>(), 0..40),
            flip in proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
            from in 0i64..25,
        ) {
            let mut b = BatchBuilder::new(compression);
            for r in &records { b.push(r); }
            let mut bytes = b.build().to_vec();
            if let Some((idx, v)) = flip {
                // Damage past the header, and re-sign it so decoding reads the damage.
                let i = BATCH_HEADER_LEN + idx.index(bytes.len() - BATCH_HEADER_LEN);
                bytes[i] = v;
                reseal_crc(&mut bytes);
            }
            let whole = Bytes::from(bytes.clone());
            let header = BatchHeader::parse(&whole).unwrap();
            let rope = cut(&bytes, &cuts);
            prop_assert!(verify_crc_at(&rope, 0, &header).is_ok());
            let mut expected = Vec::new();
            let joined = records_section_bytes(&header, &whole)
                .and_then(|s| decode_records(&header, &s, Offset(from), |r| expected.push(r)));
            let mut got = Vec::new();
            let pieces = records_section_rope(&header, &rope)
                .and_then(|s| decode_records_rope(&header, &s, Offset(from), |r| got.push(r)));
            prop_assert_eq!(
                joined.map_err(|e| e.to_string()),
                pieces.map_err(|e| e.to_string())
            );
            prop_assert_eq!(got, expected);
        }
    }

    #[test]
    fn batches_in_pieces_are_found_as_in_one_buffer() {
        let mut bytes = Vec::new();
        for n in 1..=3 {
            let mut b = BatchBuilder::new(Compression::None);
            for i in 0..n {
                b.push(&Record::from_value(format!("record {i} of {n}"), 1));
            }
            bytes.extend_from_slice(&b.build());
        }
        let expected: Vec<(usize, BatchHeader)> = {
            let mut at = 0;
            batches(&bytes)
                .map(|v| {
                    let v = v.unwrap();
                    let found = (at, v.header);
                    at += v.as_bytes().len();
                    found
                })
                .collect()
        };
        for cuts in [&[][..], &[3, 70, 71], &[61, 62, 150]] {
            let rope = cut(&bytes, cuts);
            let got: Vec<_> = rope_batches(&rope).map(Result::unwrap).collect();
            assert_eq!(got, expected, "cut at {cuts:?}");
            for (at, h) in &got {
                verify_crc_at(&rope, *at, h).unwrap();
            }
            // A trailing partial batch, or a partial header, is an error.
            for short in [bytes.len() - 1, bytes.len() - 100, 30] {
                let part = rope.slice(0, short);
                let last = rope_batches(&part).last().unwrap();
                assert!(
                    matches!(last, Err(DecodeError::Truncated { .. })),
                    "{short}: {last:?}"
                );
            }
        }
    }

    #[test]
    fn a_damaged_batch_in_pieces_fails_its_crc() {
        let mut b = BatchBuilder::new(Compression::None);
        b.push(&Record::from_value("hello, pieces", 1));
        let mut bytes = b.build().to_vec();
        let header = BatchHeader::parse(&bytes).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        let err = verify_crc_at(&cut(&bytes, &[3, 70, 71]), 0, &header).unwrap_err();
        assert!(matches!(err, DecodeError::CrcMismatch { .. }), "{err}");
        let short = cut(&bytes[..bytes.len() - 1], &[3, 70]);
        let err = verify_crc_at(&short, 0, &header).unwrap_err();
        assert!(matches!(err, DecodeError::Truncated { .. }), "{err}");
    }

    #[test]
    fn crc_mismatch_is_reported() {
        let mut b = BatchBuilder::new(Compression::None);
        b.push(&Record::from_value("hello", 1));
        let mut bytes = b.build().to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        let err = BatchView::new(&bytes).unwrap().records().unwrap_err();
        assert!(matches!(err, DecodeError::CrcMismatch { .. }), "{err}");
    }

    #[test]
    fn producer_stamp_is_read_back_and_keeps_the_crc_valid() {
        let mut b = BatchBuilder::new(Compression::None);
        b.push(&Record::from_value("a", 1));
        b.push(&Record::from_value("b", 2));
        let mut bytes = b.build().to_vec();
        set_producer(&mut bytes, ProducerId(77), 3, 1000);
        let view = BatchView::new(&bytes).unwrap();
        view.verify_crc().unwrap();
        assert_eq!(view.header.producer_id, ProducerId(77));
        assert_eq!(view.header.producer_epoch, 3);
        assert_eq!(view.header.base_sequence, 1000);
        assert_eq!(view.records().unwrap().len(), 2);
    }

    #[test]
    fn stamping_keeps_crc_valid() {
        let mut b = BatchBuilder::new(Compression::Zstd);
        b.push(&Record::from_value("a", 1));
        let mut bytes = b.build().to_vec();
        set_base_offset(&mut bytes, Offset(42));
        set_leader_epoch(&mut bytes, LeaderEpoch(7));
        BatchView::new(&bytes).unwrap().verify_crc().unwrap();
    }

    #[test]
    fn tombstone_round_trips() {
        let mut b = BatchBuilder::new(Compression::None);
        b.push(&Record {
            key: Some(Bytes::from("k")),
            value: None,
            ..Default::default()
        });
        let bytes = b.build();
        let recs = BatchView::new(&bytes).unwrap().records().unwrap();
        assert!(recs[0].is_tombstone());
    }

    #[test]
    fn huge_record_count_does_not_allocate() {
        let mut b = BatchBuilder::new(Compression::None);
        b.push(&Record::from_value("x", 1));
        let mut bytes = b.build().to_vec();
        bytes[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        reseal_crc(&mut bytes);
        let err = BatchView::new(&bytes).unwrap().records().unwrap_err();
        assert!(err.to_string().contains("record"), "{err}");
    }

    #[test]
    fn explicit_offset_deltas_are_kept() {
        let mut b = BatchBuilder::new(Compression::Lz4);
        b.push_with_offset_delta(2, &Record::from_value("a", 5));
        b.push_with_offset_delta(7, &Record::from_value("b", 6));
        let bytes = b.build_spanning(Offset(100), LeaderEpoch(1), 9);
        let view = BatchView::new(&bytes).unwrap();
        assert_eq!(view.header.last_offset(), Offset(109));
        let recs = view.records().unwrap();
        assert_eq!(recs[0].offset, Offset(102));
        assert_eq!(recs[1].offset, Offset(107));
    }
}
