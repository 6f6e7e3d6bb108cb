//! Per-batch compression of the records section: none, lz4 (lz4_flex), zstd.
//!
//! Attribute codes follow Kafka's (0 none, 3 lz4, 4 zstd); gzip (1) and snappy (2)
//! are recognised and refused with a clear error. LZ4 uses the block format with a
//! 4-byte little-endian uncompressed size in front; decompression checks that size
//! against a bound before allocating.

use crate::error::DecodeError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Compression {
    #[default]
    None,
    Lz4,
    Zstd,
}

impl Compression {
    pub fn attribute(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }

    pub fn from_attribute(code: u8) -> Result<Compression, DecodeError> {
        match code {
            0 => Ok(Compression::None),
            3 => Ok(Compression::Lz4),
            4 => Ok(Compression::Zstd),
            other => Err(DecodeError::UnsupportedCompression(other)),
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        })
    }
}

impl FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" | "uncompressed" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            other => Err(format!(
                "unknown compression '{other}' (expected none, lz4 or zstd)"
            )),
        }
    }
}

/// Compresses a records section. Infallible: the codecs only fail on bad input
/// when decompressing.
pub fn compress(codec: Compression, data: &[u8]) -> Vec<u8> {
    match codec {
        Compression::None => data.to_vec(),
        Compression::Lz4 => lz4_flex::compress_prepend_size(data),
        Compression::Zstd => zstd::bulk::compress(data, 1).expect("zstd compression of memory"),
    }
}

/// Decompresses a records section, refusing to produce more than `max_len` bytes.
pub fn decompress(codec: Compression, data: &[u8], max_len: usize) -> Result<Vec<u8>, DecodeError> {
    match codec {
        Compression::None => Ok(data.to_vec()),
        Compression::Lz4 => {
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
                    field: "lz4 uncompressed size",
                    value: size as u64,
                    max: max_len as u64,
                });
            }
            lz4_flex::decompress(&data[4..], size).map_err(|e| DecodeError::Decompress {
                codec: "lz4",
                reason: e.to_string(),
            })
        }
        Compression::Zstd => {
            zstd::bulk::decompress(data, max_len).map_err(|e| DecodeError::Decompress {
                codec: "zstd",
                reason: e.to_string(),
            })
        }
    }
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
        assert!(Compression::from_attribute(1).is_err());
        assert!(Compression::from_attribute(7).is_err());
    }
}
