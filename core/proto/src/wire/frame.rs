//! The frame: how one request or one response travels on a QUIC stream.
//!
//! Wire format v1 (all integers big-endian):
//!
//! ```text
//! offset size field
//!      0    4 frame_len     bytes after this field (= 8 + meta_len + payload_len)
//!      4    2 api_key       which request (see ApiKey)
//!      6    2 api_version   version of that request's message layout
//!      8    4 meta_len      length of the postcard-encoded message that follows
//!     12    - meta          the message (request struct, or Result<response, ErrorInfo>)
//!      -    - payload       raw bytes: record batches exactly as stored (produce, fetch)
//! ```
//!
//! One request per bidirectional stream: the client writes one request frame and
//! finishes its send side; the broker answers with one response frame (same api key
//! and version) and finishes. `frame_len` is checked against a limit before any
//! allocation; a frame over the limit is refused with an error naming both sizes.

use crate::error::DecodeError;

/// Bytes of the fixed frame header.
pub const FRAME_HEADER_LEN: usize = 12;

/// The parsed fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub api_key: u16,
    pub api_version: u16,
    pub meta_len: u32,
    /// Bytes of meta + payload.
    pub body_len: u32,
}

impl FrameHeader {
    pub fn payload_len(&self) -> u32 {
        self.body_len - self.meta_len
    }

    /// Encodes the header for a frame with the given meta and payload lengths.
    pub fn encode(
        api_key: u16,
        api_version: u16,
        meta_len: usize,
        payload_len: usize,
    ) -> [u8; FRAME_HEADER_LEN] {
        let frame_len = (8 + meta_len + payload_len) as u32;
        let mut out = [0u8; FRAME_HEADER_LEN];
        out[0..4].copy_from_slice(&frame_len.to_be_bytes());
        out[4..6].copy_from_slice(&api_key.to_be_bytes());
        out[6..8].copy_from_slice(&api_version.to_be_bytes());
        out[8..12].copy_from_slice(&(meta_len as u32).to_be_bytes());
        out
    }

    /// Parses and bounds-checks a frame header. `max_frame_bytes` bounds
    /// `frame_len` (the bytes still to read after the length field).
    pub fn parse(
        buf: &[u8; FRAME_HEADER_LEN],
        max_frame_bytes: u32,
    ) -> Result<FrameHeader, DecodeError> {
        let frame_len = u32::from_be_bytes(buf[0..4].try_into().expect("4 bytes"));
        if frame_len > max_frame_bytes {
            return Err(DecodeError::TooLarge {
                field: "frame length",
                value: frame_len as u64,
                max: max_frame_bytes as u64,
            });
        }
        if frame_len < 8 {
            return Err(DecodeError::InvalidLength {
                field: "frame length",
                value: frame_len as i64,
            });
        }
        let meta_len = u32::from_be_bytes(buf[8..12].try_into().expect("4 bytes"));
        let body_len = frame_len - 8;
        if meta_len > body_len {
            return Err(DecodeError::InvalidLength {
                field: "frame meta length",
                value: meta_len as i64,
            });
        }
        Ok(FrameHeader {
            api_key: u16::from_be_bytes(buf[4..6].try_into().expect("2 bytes")),
            api_version: u16::from_be_bytes(buf[6..8].try_into().expect("2 bytes")),
            meta_len,
            body_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = FrameHeader::encode(7, 1, 30, 1000);
        let p = FrameHeader::parse(&h, 1 << 20).unwrap();
        assert_eq!(
            (p.api_key, p.api_version, p.meta_len, p.body_len),
            (7, 1, 30, 1030)
        );
        assert_eq!(p.payload_len(), 1000);
    }

    #[test]
    fn oversized_and_inconsistent_frames_are_refused() {
        let h = FrameHeader::encode(7, 1, 30, 1 << 21);
        assert!(
            FrameHeader::parse(&h, 1 << 20)
                .unwrap_err()
                .to_string()
                .contains("frame length")
        );
        let mut h = FrameHeader::encode(7, 1, 30, 10);
        h[8..12].copy_from_slice(&1000u32.to_be_bytes());
        assert!(
            FrameHeader::parse(&h, 1 << 20)
                .unwrap_err()
                .to_string()
                .contains("meta length")
        );
    }
}
