//! Per-batch compression of the records section, with Kafka's four codecs:
//! gzip (flate2), snappy (snap), lz4 (lz4_flex) and zstd.
//!
//! Attribute codes are Kafka's: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd. Every
//! codec writes what Kafka's own clients write, so a batch from the Java client,
//! librdkafka or kafka-python passes through the log unchanged and a batch from
//! Rill's producer reads in any Kafka consumer:
//!
//! - **gzip**: one gzip member (RFC 1952) at the default level, as the Java
//!   client's `GZIPOutputStream` and librdkafka write it. Reading accepts
//!   concatenated members, as `GZIPInputStream` does. Writing gzip is slow
//!   (about 20 MB/s on one core, against some 500 MB/s for lz4, snappy and
//!   zstd): it is here for Kafka compatibility, not as a choice for speed.
//! - **snappy**: written in snappy-java's (xerial) framing, as the Java client
//!   and kafka-python write it: the 16-byte header `\x82SNAPPY\0`, version 1,
//!   compatible version 1 (both big-endian i32), then blocks of at most 32 KiB
//!   of input, each a big-endian i32 length and a raw snappy block. Every Kafka
//!   consumer reads that form. librdkafka writes one raw snappy block with no
//!   framing instead, so reading accepts both: framing is recognised by its
//!   magic. The two cannot be confused: a raw block starts with the varint of its
//!   uncompressed length, and `\x82 S` as that varint is 10626, after which `N`
//!   would be a copy from before the start of the output, which no valid block
//!   holds.
//! - **lz4**: written in the LZ4 *frame* format (magic `0x184D2204`, written
//!   little-endian as `04 22 4D 18`) with independent 64 KiB blocks and no
//!   checksums, as the Java client's `Lz4BlockOutputStream` writes it (its reader
//!   refuses linked blocks). Kafka's broken frame-descriptor checksum concerns
//!   only magic-0 message sets (`Lz4Compression` passes
//!   `messageVersion == MAGIC_VALUE_V0`); Rill reads magic 2 only, so frames are
//!   checked as the LZ4 frame specification says.
//!
//!   Rill before Kafka compatibility wrote lz4 as a *block* with a 4-byte
//!   little-endian uncompressed size in front, and logs on disk still hold such
//!   batches, so reading accepts that legacy form too. The two are told apart by
//!   the first four bytes: the frame magic, read as a legacy size, is 407,708,164
//!   bytes, far past the bound on a records section
//!   ([`MAX_UNCOMPRESSED_RECORDS_BYTES`], 64 MiB), so no legacy batch ever began
//!   with it (the writer never produced a section that large). Kafka clients
//!   read only frames, so such a batch is rewritten
//!   ([`crate::batch::lz4_legacy_to_frame`]) before it goes to one.
//! - **zstd**: one zstd frame (level 1); reading accepts several frames.
//!
//! Every decompression is bounded: a caller passes the most bytes it accepts
//! (the batch code passes [`MAX_UNCOMPRESSED_RECORDS_BYTES`]) and a payload
//! that would expand past it, such as a decompression bomb, is refused with an
//! error naming the codec and the bound before the excess is allocated.

use crate::batch::MAX_UNCOMPRESSED_RECORDS_BYTES;
use crate::error::DecodeError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::{Read, Write};
use std::str::FromStr;

/// A batch's compression codec. Gzip and Snappy come last so that the serde
/// variant indices of the older codecs stay as they were.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Compression {
    #[default]
    None,
    Lz4,
    Zstd,
    Gzip,
    Snappy,
}

impl Compression {
    /// Every codec, in attribute-code order.
    pub const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    pub fn attribute(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }

    pub fn from_attribute(code: u8) -> Result<Compression, DecodeError> {
        match code {
            0 => Ok(Compression::None),
            1 => Ok(Compression::Gzip),
            2 => Ok(Compression::Snappy),
            3 => Ok(Compression::Lz4),
            4 => Ok(Compression::Zstd),
            other => Err(DecodeError::UnsupportedCompression(other)),
        }
    }

    /// The codec's name, as `compression.type` spells it in Kafka.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" | "uncompressed" => Ok(Compression::None),
            "gzip" => Ok(Compression::Gzip),
            "snappy" => Ok(Compression::Snappy),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            other => Err(format!(
                "unknown compression '{other}' (expected none, gzip, snappy, lz4 or zstd)"
            )),
        }
    }
}

/// The LZ4 frame magic number (little-endian on the wire: `04 22 4D 18`).
const LZ4_FRAME_MAGIC: u32 = 0x184D_2204;

// A legacy lz4 section's size prefix can never equal the frame magic (see the
// module documentation).
const _: () = assert!(LZ4_FRAME_MAGIC as usize > MAX_UNCOMPRESSED_RECORDS_BYTES);

/// snappy-java's stream header: magic, then version 1 and compatible version 1.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_HEADER_LEN: usize = 16;
/// Input bytes per xerial block, snappy-java's default (and kafka-python's).
const XERIAL_BLOCK: usize = 32 * 1024;

/// Compresses a records section. Infallible: the codecs only fail on bad input
/// when decompressing.
pub fn compress(codec: Compression, data: &[u8]) -> Vec<u8> {
    match codec {
        Compression::None => data.to_vec(),
        Compression::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(
                Vec::with_capacity(data.len() / 2 + 64),
                flate2::Compression::default(),
            );
            enc.write_all(data).expect("gzip compression into memory");
            enc.finish().expect("gzip compression into memory")
        }
        Compression::Snappy => snappy_xerial_compress(data),
        Compression::Lz4 => {
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Independent);
            let mut enc = lz4_flex::frame::FrameEncoder::with_frame_info(
                info,
                Vec::with_capacity(data.len() / 2 + 64),
            );
            enc.write_all(data).expect("lz4 compression into memory");
            enc.finish().expect("lz4 compression into memory")
        }
        Compression::Zstd => zstd::bulk::compress(data, 1).expect("zstd compression of memory"),
    }
}

/// Decompresses a records section, refusing to produce more than `max_len` bytes.
pub fn decompress(codec: Compression, data: &[u8], max_len: usize) -> Result<Vec<u8>, DecodeError> {
    match codec {
        Compression::None => Ok(data.to_vec()),
        Compression::Gzip => read_bounded("gzip", flate2::read::MultiGzDecoder::new(data), max_len),
        Compression::Snappy => {
            if data.starts_with(&XERIAL_MAGIC) {
                snappy_xerial_decompress(data, max_len)
            } else {
                let mut out = Vec::new();
                snappy_raw_append(data, max_len, &mut out)?;
                Ok(out)
            }
        }
        Compression::Lz4 => {
            if is_legacy_lz4(data) {
                lz4_legacy_block_decompress(data, max_len)
            } else {
                lz4_frames_complete(data)?;
                read_bounded("lz4", lz4_flex::frame::FrameDecoder::new(data), max_len)
            }
        }
        Compression::Zstd => {
            // Decompresses into a buffer of `max_len` capacity and fails when the
            // output would not fit.
            zstd::bulk::decompress(data, max_len).map_err(|e| DecodeError::Decompress {
                codec: "zstd",
                reason: format!("{e} (output is bounded to {max_len} bytes)"),
            })
        }
    }
}

/// Whether an lz4 records section is in Rill's legacy block form rather than
/// an LZ4 frame. Kafka clients read only frames: a batch in the legacy form
/// must be rewritten ([`crate::batch::lz4_legacy_to_frame`]) before it is
/// served to one.
pub fn is_legacy_lz4(section: &[u8]) -> bool {
    !(section.len() >= 4 && section[..4] == LZ4_FRAME_MAGIC.to_le_bytes())
}

fn bound_exceeded(codec: &'static str, max_len: usize) -> DecodeError {
    DecodeError::Decompress {
        codec,
        reason: format!("output exceeds the bound of {max_len} bytes"),
    }
}

/// Reads a streaming decoder to its end, failing once it yields more than
/// `max_len` bytes (without reading further).
fn read_bounded(
    codec: &'static str,
    reader: impl Read,
    max_len: usize,
) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::new();
    reader
        .take(max_len as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| DecodeError::Decompress {
            codec,
            reason: e.to_string(),
        })?;
    if out.len() > max_len {
        return Err(bound_exceeded(codec, max_len));
    }
    Ok(out)
}

/// Checks that `data` is whole LZ4 frames, each ending in its end mark (and
/// content checksum when the frame has one). The frame decoder takes input
/// that stops at a block boundary for a complete frame; Kafka's Java reader
/// does not, and neither does Rill. Contents are checked by the decoder.
fn lz4_frames_complete(data: &[u8]) -> Result<(), DecodeError> {
    let truncated = |needed: usize| DecodeError::Truncated {
        field: "lz4 frame",
        needed,
        available: data.len(),
    };
    let mut pos = 0;
    while pos < data.len() {
        // Magic, FLG, BD, then the optional content size and dictionary id, then HC.
        if data.len() < pos + 7 {
            return Err(truncated(pos + 7));
        }
        if data[pos..pos + 4] != LZ4_FRAME_MAGIC.to_le_bytes() {
            return Err(DecodeError::Decompress {
                codec: "lz4",
                reason: format!("bytes at {pos} after a frame are not an LZ4 frame"),
            });
        }
        let flg = data[pos + 4];
        let (block_checksum, content_size, content_checksum, dict_id) = (
            flg & 0x10 != 0,
            flg & 0x08 != 0,
            flg & 0x04 != 0,
            flg & 0x01 != 0,
        );
        pos += 7 + if content_size { 8 } else { 0 } + if dict_id { 4 } else { 0 };
        loop {
            if data.len() < pos + 4 {
                return Err(truncated(pos + 4));
            }
            let size = u32::from_le_bytes(data[pos..pos + 4].try_into().expect("4 bytes"));
            pos += 4;
            if size == 0 {
                break; // the end mark
            }
            pos += (size & 0x7fff_ffff) as usize + if block_checksum { 4 } else { 0 };
            if data.len() < pos {
                return Err(truncated(pos));
            }
        }
        if content_checksum {
            pos += 4;
            if data.len() < pos {
                return Err(truncated(pos));
            }
        }
    }
    Ok(())
}

/// Rill's pre-Kafka lz4 form: a 4-byte little-endian uncompressed size, then one
/// LZ4 block.
fn lz4_legacy_block_decompress(data: &[u8], max_len: usize) -> Result<Vec<u8>, DecodeError> {
    if data.len() < 4 {
        return Err(DecodeError::Truncated {
            field: "lz4 uncompressed size",
            needed: 4,
            available: data.len(),
        });
    }
    let size = u32::from_le_bytes(data[..4].try_into().expect("4 bytes")) as usize;
    if size > max_len {
        return Err(DecodeError::TooLarge {
            field: "lz4 uncompressed size of a legacy block (the data has no LZ4 frame magic)",
            value: size as u64,
            max: max_len as u64,
        });
    }
    lz4_flex::decompress(&data[4..], size).map_err(|e| DecodeError::Decompress {
        codec: "lz4",
        reason: e.to_string(),
    })
}

fn snappy_xerial_compress(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(XERIAL_HEADER_LEN + data.len() / 2 + 64);
    out.extend_from_slice(&XERIAL_MAGIC);
    out.extend_from_slice(&1i32.to_be_bytes()); // version
    out.extend_from_slice(&1i32.to_be_bytes()); // compatible version
    let mut encoder = snap::raw::Encoder::new();
    let mut block = Vec::new();
    // At least one block, even for empty input, so the stream is never a bare header.
    let mut chunks = data.chunks(XERIAL_BLOCK);
    let first = chunks.next().unwrap_or(&[]);
    for chunk in std::iter::once(first).chain(chunks) {
        block.resize(snap::raw::max_compress_len(chunk.len()), 0);
        let n = encoder
            .compress(chunk, &mut block)
            .expect("snappy compression of a block under 4 GiB");
        out.extend_from_slice(&(n as u32).to_be_bytes());
        out.extend_from_slice(&block[..n]);
    }
    out
}

/// snappy-java framing: the 16-byte header, then blocks of a big-endian length
/// and a raw snappy block. Like snappy-java, a header met again at a block
/// boundary (streams written one after another) is skipped.
fn snappy_xerial_decompress(data: &[u8], max_len: usize) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let rest = &data[pos..];
        if rest.starts_with(&XERIAL_MAGIC) {
            if rest.len() < XERIAL_HEADER_LEN {
                return Err(DecodeError::Truncated {
                    field: "snappy-java stream header",
                    needed: XERIAL_HEADER_LEN,
                    available: rest.len(),
                });
            }
            pos += XERIAL_HEADER_LEN;
            continue;
        }
        if rest.len() < 4 {
            return Err(DecodeError::Truncated {
                field: "snappy-java block length",
                needed: 4,
                available: rest.len(),
            });
        }
        let len = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let block = &rest[4..];
        if len > block.len() {
            return Err(DecodeError::Truncated {
                field: "snappy-java block",
                needed: len,
                available: block.len(),
            });
        }
        snappy_raw_append(&block[..len], max_len, &mut out)?;
        pos += 4 + len;
    }
    Ok(out)
}

/// Decompresses one raw snappy block onto the end of `out`, checking the length
/// the block claims against what is left of `max_len` before allocating.
fn snappy_raw_append(block: &[u8], max_len: usize, out: &mut Vec<u8>) -> Result<(), DecodeError> {
    let err = |e: snap::Error| DecodeError::Decompress {
        codec: "snappy",
        reason: e.to_string(),
    };
    let len = snap::raw::decompress_len(block).map_err(err)?;
    if len > max_len - out.len() {
        return Err(bound_exceeded("snappy", max_len));
    }
    let start = out.len();
    out.resize(start + len, 0);
    let n = snap::raw::Decoder::new()
        .decompress(block, &mut out[start..])
        .map_err(err)?;
    out.truncate(start + n);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lz4_refuses_oversized_claim() {
        let mut data = vec![0xff, 0xff, 0xff, 0x7f];
        data.extend_from_slice(&[0u8; 8]);
        let err = decompress(Compression::Lz4, &data, 1024).unwrap_err();
        assert!(err.to_string().contains("lz4 uncompressed size"), "{err}");
    }

    #[test]
    fn unknown_codes_are_refused() {
        assert!(Compression::from_attribute(5).is_err());
        assert!(Compression::from_attribute(7).is_err());
    }
}
