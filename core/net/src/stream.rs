//! Frames on QUIC streams: reading and writing one frame, and a request/response
//! call on a fresh bidirectional stream.
//!
//! The frame format (v1) is defined in `rill_proto::wire::frame`: a 12-byte header
//! (frame_len u32, api_key u16, api_version u16, meta_len u32, big-endian), the
//! meta (a postcard message), then the payload (raw record batches).
//!
//! Invariants:
//! - A frame header is validated against the reader's limit before anything is
//!   allocated. The body is kept in the chunks quinn hands over (slices of the
//!   decrypted packets); [`read_frame`] joins the payload into one allocation
//!   of exactly its size (none if it came as one chunk), [`read_frame_rope`]
//!   leaves it in pieces for a reader that parses it in place.
//! - A refused frame (too large, malformed) stops the receive side with
//!   [`STREAM_FRAME_REFUSED`], so the peer stops sending; the connection and its
//!   other streams are unaffected.
//! - Payload chunks are handed to quinn as `Bytes` without copying.
//! - [`write_frame`] never finishes the stream; [`call`] does, after the request.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quinn::{ReadExactError, VarInt};
use rill_proto::DecodeError;
use rill_proto::Rope;
use rill_proto::wire::{FRAME_HEADER_LEN, FrameHeader};

use crate::error::NetError;

/// Application error code with which a reader stops a stream whose frame it
/// refused (too large or malformed).
pub const STREAM_FRAME_REFUSED: VarInt = VarInt::from_u32(1);
/// Application error code with which a requester abandons a stream (timeout).
pub const STREAM_CANCELLED: VarInt = VarInt::from_u32(2);

/// One request or response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub api_key: u16,
    pub api_version: u16,
    /// The postcard-encoded message.
    pub meta: Bytes,
    /// Raw record batches (possibly empty).
    pub payload: Bytes,
}

/// Reads one frame of at most `max_frame_bytes` (the frame length field: bytes
/// after it) from `recv`.
///
/// Errors: [`NetError::NoFrame`] if the stream ends before any byte,
/// [`NetError::TruncatedFrame`] if it ends inside the frame,
/// [`NetError::FrameTooLarge`] or [`NetError::MalformedFrame`] if the header is
/// refused (the stream is then stopped), [`NetError::Read`] if the stream or
/// connection fails.
pub async fn read_frame(
    recv: &mut quinn::RecvStream,
    max_frame_bytes: u32,
) -> Result<Frame, NetError> {
    Ok(read_frame_rope(recv, max_frame_bytes).await?.into_frame())
}

/// Reads the 12 raw header bytes of a frame (first step of [`read_frame`], for a
/// reader that wants the api key and version of a frame it then refuses: they
/// are bytes 4..6 and 6..8, big-endian).
pub async fn read_frame_header_bytes(
    recv: &mut quinn::RecvStream,
) -> Result<[u8; FRAME_HEADER_LEN], NetError> {
    let mut head = [0u8; FRAME_HEADER_LEN];
    match recv.read_exact(&mut head).await {
        Ok(()) => Ok(head),
        Err(ReadExactError::FinishedEarly(0)) => Err(NetError::NoFrame),
        Err(ReadExactError::FinishedEarly(received)) => Err(NetError::TruncatedFrame {
            part: "header",
            expected: FRAME_HEADER_LEN as u64,
            received: received as u64,
        }),
        Err(ReadExactError::ReadError(e)) => Err(NetError::Read(e)),
    }
}

/// Validates header bytes against `max_frame_bytes` (second step of
/// [`read_frame`]). On refusal the receive side is stopped with
/// [`STREAM_FRAME_REFUSED`] so the peer stops sending.
pub fn parse_frame_header(
    recv: &mut quinn::RecvStream,
    head: &[u8; FRAME_HEADER_LEN],
    max_frame_bytes: u32,
) -> Result<FrameHeader, NetError> {
    FrameHeader::parse(head, max_frame_bytes).map_err(|e| {
        // Ignore "already closed".
        let _ = recv.stop(STREAM_FRAME_REFUSED);
        match e {
            DecodeError::TooLarge { value, max, .. } => {
                NetError::FrameTooLarge { size: value, max }
            }
            other => NetError::MalformedFrame(other),
        }
    })
}

/// Reads the body of a frame whose header was validated (last step of
/// [`read_frame`]): the payload in one allocation of exactly its size (none if
/// it arrives as one chunk).
pub async fn read_frame_body(
    recv: &mut quinn::RecvStream,
    header: &FrameHeader,
) -> Result<Frame, NetError> {
    Ok(read_frame_body_rope(recv, header).await?.into_frame())
}

/// One frame whose payload is kept in the pieces it arrived in (QUIC stream
/// chunks, slices of the decrypted packets): a fetch response's record bytes
/// are never joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RopeFrame {
    pub api_key: u16,
    pub api_version: u16,
    /// The postcard-encoded message (joined if it arrived in pieces).
    pub meta: Bytes,
    /// Raw record batches (possibly empty), in pieces.
    pub payload: Rope,
}

impl RopeFrame {
    /// The frame with its payload joined (a copy only if it is in pieces).
    pub fn into_frame(self) -> Frame {
        Frame {
            api_key: self.api_key,
            api_version: self.api_version,
            meta: self.meta,
            payload: self.payload.to_bytes(),
        }
    }
}

/// [`read_frame`] keeping the payload in pieces.
pub async fn read_frame_rope(
    recv: &mut quinn::RecvStream,
    max_frame_bytes: u32,
) -> Result<RopeFrame, NetError> {
    let head = read_frame_header_bytes(recv).await?;
    let header = parse_frame_header(recv, &head, max_frame_bytes)?;
    read_frame_body_rope(recv, &header).await
}

/// [`read_frame_body`] keeping the payload in the chunks it arrived in.
pub async fn read_frame_body_rope(
    recv: &mut quinn::RecvStream,
    header: &FrameHeader,
) -> Result<RopeFrame, NetError> {
    let body_len = header.body_len as usize;
    let mut body = Rope::default();
    while body.len() < body_len {
        let Some(chunk) = recv.read_chunk(body_len - body.len(), true).await? else {
            return Err(NetError::TruncatedFrame {
                part: "body",
                expected: body_len as u64,
                received: body.len() as u64,
            });
        };
        body.push(chunk.bytes);
    }
    let meta_len = (header.meta_len as usize).min(body_len);
    Ok(RopeFrame {
        api_key: header.api_key,
        api_version: header.api_version,
        meta: body.slice(0, meta_len).to_bytes(),
        payload: body.slice(meta_len, body_len),
    })
}

/// Writes one frame (header, `meta`, then the `payload` chunks in order) to
/// `send`. The payload is not copied. The stream is not finished: the caller
/// calls `send.finish()` when the frame is the last thing it sends.
pub async fn write_frame(
    send: &mut quinn::SendStream,
    api_key: u16,
    api_version: u16,
    meta: &[u8],
    payload: &[Bytes],
) -> Result<(), NetError> {
    let payload_len: u64 = payload.iter().map(|b| b.len() as u64).sum();
    let frame_len = 8 + meta.len() as u64 + payload_len;
    if frame_len > u64::from(u32::MAX) {
        return Err(NetError::FrameTooLarge {
            size: frame_len,
            max: u64::from(u32::MAX),
        });
    }
    let mut head = BytesMut::with_capacity(FRAME_HEADER_LEN + meta.len());
    head.extend_from_slice(&FrameHeader::encode(
        api_key,
        api_version,
        meta.len(),
        payload_len as usize,
    ));
    head.extend_from_slice(meta);
    let mut chunks = Vec::with_capacity(1 + payload.len());
    chunks.push(head.freeze());
    chunks.extend(payload.iter().filter(|b| !b.is_empty()).cloned());
    send.write_all_chunks(&mut chunks).await?;
    Ok(())
}

/// Sends one request on a new bidirectional stream of `conn`, finishes the
/// stream, and reads the response (at most `max_response_bytes`).
///
/// If the peer stops the stream while the request is being written (it refused
/// the request, e.g. as too large), the response it sent is returned if there is
/// one, else [`NetError::FrameRefused`].
pub async fn call(
    conn: &quinn::Connection,
    api_key: u16,
    api_version: u16,
    meta: &[u8],
    payload: &[Bytes],
    max_response_bytes: u32,
) -> Result<Frame, NetError> {
    let (mut send, mut recv) = conn
        .open_bi()
        .await
        .map_err(|e| NetError::from(e).refine())?;
    exchange(
        &mut send,
        &mut recv,
        api_key,
        api_version,
        meta,
        payload,
        max_response_bytes,
    )
    .await
    .map(RopeFrame::into_frame)
    .map_err(NetError::refine)
}

/// [`call`], bounded by `timeout` (opening the stream included). On timeout the
/// request stream is reset with [`STREAM_CANCELLED`], so the peer sees a
/// cancelled request rather than a truncated frame.
pub async fn call_timeout(
    conn: &quinn::Connection,
    api_key: u16,
    api_version: u16,
    meta: &[u8],
    payload: &[Bytes],
    max_response_bytes: u32,
    timeout: Duration,
) -> Result<Frame, NetError> {
    call_timeout_rope(
        conn,
        api_key,
        api_version,
        meta,
        payload,
        max_response_bytes,
        timeout,
    )
    .await
    .map(RopeFrame::into_frame)
}

/// [`call_timeout`] keeping the response payload in the pieces it arrived in
/// (for fetch responses, read in place).
pub async fn call_timeout_rope(
    conn: &quinn::Connection,
    api_key: u16,
    api_version: u16,
    meta: &[u8],
    payload: &[Bytes],
    max_response_bytes: u32,
    timeout: Duration,
) -> Result<RopeFrame, NetError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let timed_out = || NetError::Timeout {
        what: "the request",
        after: timeout,
    };
    let (mut send, mut recv) = tokio::time::timeout_at(deadline, conn.open_bi())
        .await
        .map_err(|_| timed_out())?
        .map_err(|e| NetError::from(e).refine())?;
    let exchanged = tokio::time::timeout_at(
        deadline,
        exchange(
            &mut send,
            &mut recv,
            api_key,
            api_version,
            meta,
            payload,
            max_response_bytes,
        ),
    )
    .await;
    match exchanged {
        Ok(result) => result.map_err(NetError::refine),
        Err(_) => {
            let _ = send.reset(STREAM_CANCELLED);
            let _ = recv.stop(STREAM_CANCELLED);
            Err(timed_out())
        }
    }
}

async fn exchange(
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
    api_key: u16,
    api_version: u16,
    meta: &[u8],
    payload: &[Bytes],
    max_response_bytes: u32,
) -> Result<RopeFrame, NetError> {
    match write_frame(send, api_key, api_version, meta, payload).await {
        Ok(()) => {
            // Fails only if the stream was already finished or reset: then the
            // response read below reports what happened.
            let _ = send.finish();
        }
        Err(NetError::Write(quinn::WriteError::Stopped(code))) => {
            return read_frame_rope(recv, max_response_bytes)
                .await
                .map_err(|_| NetError::FrameRefused { code });
        }
        Err(e) => return Err(e),
    }
    read_frame_rope(recv, max_response_bytes).await
}
