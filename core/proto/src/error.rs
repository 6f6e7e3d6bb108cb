//! Errors of decoding bytes (batches, records, frames). Each names the field that
//! did not fit, so a user or operator can tell what was malformed.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("truncated {field}: needed {needed} bytes, only {available} available")]
    Truncated {
        field: &'static str,
        needed: usize,
        available: usize,
    },
    #[error("invalid length for {field}: {value}")]
    InvalidLength { field: &'static str, value: i64 },
    #[error("invalid value for {field}: {value}")]
    InvalidValue { field: &'static str, value: i64 },
    #[error("{field} is larger than allowed: {value} > {max}")]
    TooLarge {
        field: &'static str,
        value: u64,
        max: u64,
    },
    #[error("varint for {field} is longer than its type allows")]
    VarintTooLong { field: &'static str },
    #[error("unsupported batch magic {0} (Rill reads magic 2 only)")]
    UnsupportedMagic(i8),
    #[error("CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error(
        "unsupported compression code {0} (Rill supports none=0, gzip=1, snappy=2, lz4=3, zstd=4)"
    )]
    UnsupportedCompression(u8),
    #[error("{codec} decompression failed: {reason}")]
    Decompress { codec: &'static str, reason: String },
    #[error("{field} is not valid UTF-8")]
    InvalidUtf8 { field: &'static str },
    #[error("{count} unexpected trailing bytes after {field}")]
    TrailingBytes { field: &'static str, count: usize },
    #[error("malformed {field}: {reason}")]
    Malformed { field: &'static str, reason: String },
}
