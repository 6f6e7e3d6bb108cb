//! The QUIC side of the broker: accepting connections and streams, reading one
//! request frame per bidirectional stream, handing it to the [`Router`], and
//! writing its response. What a request means (decoding, version, metrics,
//! authorization, handlers) is the router's; this file owns the transport.
//!
//! Invariants:
//! - A bad request (too large, malformed, unsupported, undecodable) is answered
//!   with an error on its own stream; it never panics the task or closes the
//!   connection, and other streams carry on.
//! - Connections beyond `max_connections` are closed at once with
//!   [`CLOSE_TOO_MANY_CONNECTIONS`] and a reason; concurrent streams per
//!   connection are bounded by quinn (`max_streams_per_connection`).
//! - Reading a request is bounded by [`REQUEST_READ_TIMEOUT`].
//! - Every task is spawned on the broker's task tracker; on shutdown no new
//!   connection or stream is accepted and in-flight requests finish.

use crate::router::{Caller, Principal, Reply, Router};
use crate::state::BrokerState;
use bytes::{Bytes, BytesMut};
use quinn::VarInt;
use rill_proto::DecodeError;
use rill_proto::wire::{ApiKey, ErrorCode, ErrorInfo, FRAME_HEADER_LEN, FrameHeader};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::task::TaskTracker;

/// Close code for a connection refused because of `max_connections`.
pub const CLOSE_TOO_MANY_CONNECTIONS: VarInt = VarInt::from_u32(1);
/// Close code when the broker shuts down.
pub const CLOSE_SHUTDOWN: VarInt = VarInt::from_u32(0);
/// Longest time to receive one request frame once its stream is open.
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Accepts connections until shutdown.
pub async fn accept_loop(state: Arc<BrokerState>, endpoint: quinn::Endpoint, tracker: TaskTracker) {
    let router = Arc::new(Router::new(state.clone()));
    loop {
        let incoming = tokio::select! {
            _ = state.shutdown.cancelled() => break,
            incoming = endpoint.accept() => incoming,
        };
        let Some(incoming) = incoming else { break };
        let state = state.clone();
        let router = router.clone();
        let t = tracker.clone();
        tracker.spawn(async move {
            let peer = incoming.remote_address();
            match incoming.await {
                Ok(conn) => serve_connection(state, router, conn, t).await,
                Err(e) => tracing::debug!(%peer, error = %e, "handshake failed"),
            }
        });
    }
}

/// Decrements the connection count when a connection's task ends.
struct ConnectionSlot<'a>(&'a BrokerState);

impl Drop for ConnectionSlot<'_> {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
        self.0.metrics.connections.decrement(1.0);
    }
}

async fn serve_connection(
    state: Arc<BrokerState>,
    router: Arc<Router>,
    conn: quinn::Connection,
    tracker: TaskTracker,
) {
    let peer = conn.remote_address();
    let open = state.connections.fetch_add(1, Ordering::AcqRel);
    state.metrics.connections.increment(1.0);
    let _slot = ConnectionSlot(&state);
    if open >= state.config.max_connections {
        tracing::warn!(%peer, max = state.config.max_connections, "refusing connection: too many connections");
        conn.close(
            CLOSE_TOO_MANY_CONNECTIONS,
            format!(
                "too many connections: this broker accepts at most {} (max_connections); retry later",
                state.config.max_connections
            )
            .as_bytes(),
        );
        return;
    }
    tracing::debug!(%peer, "connection open");
    // Who the peer is: the certificate it presented, verified in the handshake.
    let caller = Arc::new(Caller {
        principal: Principal::of(rill_net::peer_identity(&conn)),
        peer,
    });
    loop {
        let stream = tokio::select! {
            _ = state.shutdown.cancelled() => break,
            stream = conn.accept_bi() => stream,
        };
        match stream {
            Ok((send, recv)) => {
                let state = state.clone();
                let router = router.clone();
                let caller = caller.clone();
                tracker
                    .spawn(async move { serve_stream(state, &router, &caller, send, recv).await });
            }
            Err(e) => {
                tracing::debug!(%peer, reason = %e, "connection closed");
                break;
            }
        }
    }
}

/// What reading a request produced.
enum Incoming {
    Request {
        key: u16,
        version: u16,
        meta: Bytes,
        payload: Bytes,
    },
    /// Answer this error (with this key and version) and stop reading.
    Refused {
        key: u16,
        version: u16,
        error: ErrorInfo,
    },
    /// Nothing to answer (the peer went away or sent nothing).
    Gone,
}

async fn read_request(
    recv: &mut quinn::RecvStream,
    max_request_bytes: u32,
    peer: SocketAddr,
) -> Incoming {
    let mut head = [0u8; FRAME_HEADER_LEN];
    match recv.read_exact(&mut head).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Incoming::Gone,
        Err(quinn::ReadExactError::FinishedEarly(n)) => {
            return Incoming::Refused {
                key: 0,
                version: 0,
                error: ErrorInfo::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "truncated frame: the stream ended after {n} of the {FRAME_HEADER_LEN} header bytes"
                    ),
                ),
            };
        }
        Err(quinn::ReadExactError::ReadError(e)) => {
            tracing::debug!(%peer, error = %e, "stream read failed");
            return Incoming::Gone;
        }
    }
    let key = u16::from_be_bytes([head[4], head[5]]);
    let version = u16::from_be_bytes([head[6], head[7]]);
    let header = match FrameHeader::parse(&head, max_request_bytes) {
        Ok(h) => h,
        Err(DecodeError::TooLarge { value, max, .. }) => {
            return Incoming::Refused {
                key,
                version,
                error: ErrorInfo::new(
                    ErrorCode::RequestTooLarge,
                    format!(
                        "request of {value} bytes exceeds max_request_bytes={max}: send smaller requests \
                         (fewer or smaller batches) or raise the broker's max_request_bytes"
                    ),
                ),
            };
        }
        Err(e) => {
            return Incoming::Refused {
                key,
                version,
                error: ErrorInfo::new(
                    ErrorCode::InvalidRequest,
                    format!("malformed frame header: {e}"),
                ),
            };
        }
    };
    let body_len = header.body_len as usize;
    let mut body = BytesMut::new();
    let mut whole = None;
    while body.len() < body_len {
        let chunk = match recv.read_chunk(body_len - body.len(), true).await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                return Incoming::Refused {
                    key,
                    version,
                    error: ErrorInfo::new(
                        ErrorCode::InvalidRequest,
                        format!(
                            "truncated frame: the stream ended after {} of the {body_len} body bytes",
                            body.len()
                        ),
                    ),
                };
            }
            Err(e) => {
                tracing::debug!(%peer, error = %e, "stream read failed");
                return Incoming::Gone;
            }
        };
        if body.is_empty() && chunk.bytes.len() == body_len {
            whole = Some(chunk.bytes);
            break;
        }
        if body.capacity() == 0 {
            body.reserve(body_len);
        }
        body.extend_from_slice(&chunk.bytes);
    }
    let mut body = whole.unwrap_or_else(|| body.freeze());
    let meta = body.split_to(header.meta_len as usize);
    Incoming::Request {
        key,
        version,
        meta,
        payload: body,
    }
}

async fn write_reply(
    send: &mut quinn::SendStream,
    key: u16,
    version: u16,
    reply: Reply,
    peer: SocketAddr,
) {
    if let Reply::Frame { meta, payload } = reply
        && let Err(e) = rill_net::write_frame(send, key, version, &meta, &payload).await
    {
        tracing::debug!(%peer, error = %e, "could not write the response");
        return;
    }
    let _ = send.finish();
}

async fn serve_stream(
    state: Arc<BrokerState>,
    router: &Router,
    caller: &Arc<Caller>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let peer = caller.peer;
    let started = Instant::now();
    let incoming = match tokio::time::timeout(
        REQUEST_READ_TIMEOUT,
        read_request(&mut recv, state.config.max_request_bytes, peer),
    )
    .await
    {
        Ok(incoming) => incoming,
        Err(_) => Incoming::Refused {
            key: 0,
            version: 0,
            error: ErrorInfo::new(
                ErrorCode::RequestTimedOut,
                format!("the request frame did not arrive within {REQUEST_READ_TIMEOUT:?}"),
            ),
        },
    };
    let (key, version, meta, payload) = match incoming {
        Incoming::Gone => return,
        Incoming::Refused {
            key,
            version,
            error,
        } => {
            let _ = recv.stop(rill_net::STREAM_FRAME_REFUSED);
            let api = ApiKey::from_u16(key).map_or("unknown", |k| k.name());
            tracing::warn!(%peer, api, error = %error, "refused request");
            state.metrics.error(api, error.code);
            write_reply(&mut send, key, version, Reply::error(error), peer).await;
            return;
        }
        Incoming::Request {
            key,
            version,
            meta,
            payload,
        } => (key, version, meta, payload),
    };
    let served = router
        .route(caller, key, version, meta, payload, started)
        .await;
    write_reply(&mut send, key, version, served.reply, peer).await;
    drop(served.timer);
}
