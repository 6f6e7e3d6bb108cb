//! The wire protocol: frames, request/response messages, error codes.
//!
//! Transport-agnostic: this module turns messages into bytes and back. rill-net
//! carries the bytes over QUIC streams (ALPN `rill/1`), one request per stream.

pub mod cluster;
pub mod codes;
pub mod frame;
pub mod groups;
pub mod messages;
pub mod security;
pub mod txn;

pub use cluster::*;
pub use codes::{ErrorCode, ErrorInfo};
pub use frame::{FRAME_HEADER_LEN, FrameHeader};
pub use groups::*;
pub use messages::*;
pub use security::*;
pub use txn::*;

use crate::error::DecodeError;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The UDP port a broker listens on by default.
pub const DEFAULT_PORT: u16 = 9092;
/// The default bound on one request frame (the broker's `max.request.bytes`).
pub const DEFAULT_MAX_REQUEST_BYTES: u32 = 64 * 1024 * 1024;
/// The bound a client puts on one response frame by default.
pub const DEFAULT_MAX_RESPONSE_BYTES: u32 = 128 * 1024 * 1024;

/// Encodes a message into the bytes of a frame's meta.
pub fn encode_meta<T: Serialize>(msg: &T) -> Vec<u8> {
    postcard::to_allocvec(msg).expect("postcard encoding into a Vec cannot fail")
}

/// Decodes a frame's meta into a message; the error names the message type.
pub fn decode_meta<T: DeserializeOwned>(meta: &[u8]) -> Result<T, DecodeError> {
    postcard::from_bytes(meta).map_err(|e| DecodeError::Malformed {
        field: std::any::type_name::<T>()
            .rsplit("::")
            .next()
            .unwrap_or("message"),
        reason: e.to_string(),
    })
}

/// Splits a payload into consecutive pieces of the given lengths (produce request
/// and fetch response partitions). Fails if the lengths do not add up to the payload.
pub fn split_payload(
    payload: &bytes::Bytes,
    lengths: impl IntoIterator<Item = u32>,
) -> Result<Vec<bytes::Bytes>, DecodeError> {
    Ok(crate::Rope::from(payload.clone())
        .split(lengths)?
        .iter()
        .map(crate::Rope::to_bytes)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Offset;

    #[test]
    fn messages_round_trip() {
        let req = FetchRequest {
            max_wait_ms: 500,
            min_bytes: 1,
            max_bytes: 1 << 20,
            replica_id: None,
            isolation: Isolation::ReadUncommitted,
            partitions: vec![FetchPartition {
                topic: "t".into(),
                partition: 3,
                offset: Offset(42),
                max_bytes: 1024,
                current_leader_epoch: None,
            }],
        };
        let back: FetchRequest = decode_meta(&encode_meta(&req)).unwrap();
        assert_eq!(back, req);
        let resp: ResponseMeta<ApiVersionsResponse> =
            Err(ErrorInfo::new(ErrorCode::UnsupportedVersion, "no"));
        let back: ResponseMeta<ApiVersionsResponse> = decode_meta(&encode_meta(&resp)).unwrap();
        assert_eq!(back, resp);
    }

    #[test]
    fn garbage_meta_is_an_error_naming_the_message() {
        let err = decode_meta::<ProduceRequest>(&[0xff, 0xff, 0xff]).unwrap_err();
        assert!(err.to_string().contains("ProduceRequest"), "{err}");
    }

    #[test]
    fn payload_split_checks_lengths() {
        let p = bytes::Bytes::from_static(b"aaabbcc");
        let parts = split_payload(&p, [3, 2, 2]).unwrap();
        assert_eq!(&parts[1][..], b"bb");
        assert!(split_payload(&p, [3, 2]).is_err());
        assert!(split_payload(&p, [3, 2, 9]).is_err());
    }
}
