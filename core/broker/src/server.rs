//! The QUIC side of the broker: accepting connections and streams, reading one
//! request frame per bidirectional stream, handing it to the [`Router`], and
//! writing its response. What a request means (decoding, version, metrics,
//! authorization, handlers) is the router's; this file owns the transport.
//!
//! Invariants:
//! - A bad request (too large, malformed, unsupported, undecodable) is answered
//!   with an error on its own stream; it never panics the task or closes the
//!   connection, and other streams carry on.
//! - Connections are counted from before their TLS handshake. One IP address
//!   holds at most `max_connections_per_ip` (more are refused before the
//!   handshake: QUIC CONNECTION_REFUSED). Connections beyond `max_connections`
//!   are closed right after the handshake with [`CLOSE_TOO_MANY_CONNECTIONS`]
//!   and a reason; beyond `max_connections` + [`EXPLAINED_REFUSALS_MAX`] they
//!   are refused before it, so the excess costs no handshakes. Concurrent
//!   streams per connection are bounded by quinn (`max_streams_per_connection`).
//! - A request body is read only after its declared length is charged to the
//!   broker's request memory budget (`max_inflight_request_bytes`, see
//!   `limits.rs`); the charge is held until the reply is written.
//! - Reading a request, the wait for the budget included, is bounded by
//!   [`REQUEST_READ_TIMEOUT`]; a wait for the budget ends at shutdown.
//! - Every task is spawned on the broker's task tracker; on shutdown no new
//!   connection or stream is accepted and in-flight requests finish.

use crate::limits::{BudgetPermit, ConnectionsPerIp, RequestBudget};
use crate::router::{Caller, Principal, Reply, Router};
use crate::state::BrokerState;
use bytes::{Bytes, BytesMut};
use quinn::VarInt;
use rill_proto::wire::{ApiKey, ErrorCode, ErrorInfo, FRAME_HEADER_LEN, FrameHeader};
use rill_proto::{DecodeError, Rope};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::task::TaskTracker;

/// Close code for a connection refused because of `max_connections`.
pub const CLOSE_TOO_MANY_CONNECTIONS: VarInt = VarInt::from_u32(1);
/// Close code when the broker shuts down.
pub const CLOSE_SHUTDOWN: VarInt = VarInt::from_u32(0);
/// Longest time to receive one request frame once its stream is open (the
/// wait for the request memory budget included).
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A request body's STREAM chunk this large is kept as it arrived rather than
/// copied (see [`read_request`]): a quarter of the largest UDP receive. A
/// follower keeps a replica fetch answer's pieces when they are this large on
/// average.
pub(crate) const KEPT_CHUNK_MIN: usize = 16 * 1024;
/// Connections beyond `max_connections` that still get a handshake, only to be
/// closed with a reason; beyond these they are refused before the handshake.
pub const EXPLAINED_REFUSALS_MAX: usize = 64;

/// What every connection's task shares: the router and the bounds.
struct Shared {
    router: Router,
    budget: RequestBudget,
}

/// Accepts connections until shutdown.
pub async fn accept_loop(state: Arc<BrokerState>, endpoint: quinn::Endpoint, tracker: TaskTracker) {
    let shared = Arc::new(Shared {
        router: Router::new(state.clone()),
        budget: RequestBudget::new(state.config.max_inflight_request_bytes),
    });
    let per_ip = ConnectionsPerIp::new(state.config.max_connections_per_ip);
    loop {
        let incoming = tokio::select! {
            _ = state.shutdown.cancelled() => break,
            incoming = endpoint.accept() => incoming,
        };
        let Some(incoming) = incoming else { break };
        let peer = incoming.remote_address();
        let Some(ip_slot) = per_ip.admit(peer.ip()) else {
            if per_ip.should_warn() {
                tracing::warn!(
                    %peer,
                    max = state.config.max_connections_per_ip,
                    "refusing connections: too many from this address (max_connections_per_ip); \
                     further refusals within a second are not logged"
                );
            }
            incoming.refuse();
            continue;
        };
        // Counted from before the handshake; this loop is the only place a
        // connection is added, so the check and the increment do not race.
        let open = state.connections.fetch_add(1, Ordering::AcqRel);
        state.metrics.connections.increment(1.0);
        let slot = ConnectionSlot(state.clone());
        if open
            >= state
                .config
                .max_connections
                .saturating_add(EXPLAINED_REFUSALS_MAX)
        {
            if per_ip.should_warn() {
                tracing::warn!(
                    %peer,
                    max = state.config.max_connections,
                    "refusing connections before the handshake: too many connections \
                     (max_connections); further refusals within a second are not logged"
                );
            }
            incoming.refuse();
            continue;
        }
        let state = state.clone();
        let shared = shared.clone();
        let t = tracker.clone();
        tracker.spawn(async move {
            let _slots = (slot, ip_slot);
            match incoming.await {
                Ok(conn) => serve_connection(state, shared, conn, open, t).await,
                Err(e) => tracing::debug!(%peer, error = %e, "handshake failed"),
            }
        });
    }
}

/// One connection's place in the broker's count (`state.connections`, the
/// `rill_connections` gauge); released when the connection's task ends.
struct ConnectionSlot(Arc<BrokerState>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
        self.0.metrics.connections.decrement(1.0);
    }
}

/// Serves one connection; `open` is how many connections the broker had
/// before this one.
async fn serve_connection(
    state: Arc<BrokerState>,
    shared: Arc<Shared>,
    conn: quinn::Connection,
    open: usize,
    tracker: TaskTracker,
) {
    let peer = conn.remote_address();
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
                let shared = shared.clone();
                let caller = caller.clone();
                tracker
                    .spawn(async move { serve_stream(state, &shared, &caller, send, recv).await });
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
        /// The body after the meta: large STREAM chunks as they arrived, small
        /// ones copied together (see [`read_request`]).
        payload: Rope,
        /// The body's charge to the request memory budget.
        budget: BudgetPermit,
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
    state: &BrokerState,
    budget: &RequestBudget,
    peer: SocketAddr,
) -> Incoming {
    let max_request_bytes = state.config.max_request_bytes;
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
    // Nothing is read or allocated for the body before its declared length is
    // charged; meanwhile the stream is not read, so flow control stops the sender.
    let charge = tokio::select! {
        _ = state.shutdown.cancelled() => {
            return Incoming::Refused {
                key,
                version,
                error: ErrorInfo::new(
                    ErrorCode::BrokerNotAvailable,
                    "the broker is shutting down: retry on another broker or after it restarts",
                ),
            };
        }
        charge = budget.acquire(header.body_len) => charge,
    };
    let budget = match charge {
        Ok(permit) => permit,
        Err(refusal) => {
            return Incoming::Refused {
                key,
                version,
                error: refusal.error_info(),
            };
        }
    };
    let body_len = header.body_len as usize;
    // The meta is copied out (it is small). Of the payload, a chunk of at
    // least KEPT_CHUNK_MIN bytes is kept as it arrived (a slice of quinn's
    // receive buffer: a produce's batches are appended from it with no copy),
    // and smaller ones are copied together into one buffer of at most the
    // payload's size. A kept chunk pins the buffer it came in: one UDP
    // receive of at most 64 KiB (4x the chunk at most), or a buffer quinn's
    // reassembly made of this stream's own data. So a client that sends tiny
    // STREAM frames (each pinning its packet) holds at most about 5x the
    // request budget's charge (the copy buffer plus 4x), not hundreds of
    // times it.
    let meta_len = (header.meta_len as usize).min(body_len);
    let mut meta = BytesMut::with_capacity(meta_len);
    let mut payload = Rope::default();
    let mut copied = BytesMut::new();
    let mut received = 0usize;
    while received < body_len {
        let chunk = match recv.read_chunk(body_len - received, true).await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                return Incoming::Refused {
                    key,
                    version,
                    error: ErrorInfo::new(
                        ErrorCode::InvalidRequest,
                        format!(
                            "truncated frame: the stream ended after {received} of the {body_len} body bytes",
                        ),
                    ),
                };
            }
            Err(e) => {
                tracing::debug!(%peer, error = %e, "stream read failed");
                return Incoming::Gone;
            }
        };
        received += chunk.bytes.len();
        let mut bytes = chunk.bytes;
        if meta.len() < meta_len {
            let take = (meta_len - meta.len()).min(bytes.len());
            meta.extend_from_slice(&bytes.split_to(take));
        }
        if bytes.len() >= KEPT_CHUNK_MIN {
            if !copied.is_empty() {
                payload.push(copied.split().freeze());
            }
            payload.push(bytes);
        } else if !bytes.is_empty() {
            if copied.capacity() - copied.len() < bytes.len() {
                // Room for the rest of the body: where every chunk is small
                // (packets of a 1,500-byte MTU) the payload is one buffer.
                copied.reserve(body_len - received + bytes.len());
            }
            copied.extend_from_slice(&bytes);
        }
    }
    if !copied.is_empty() {
        payload.push(copied.freeze());
    }
    Incoming::Request {
        key,
        version,
        meta: meta.freeze(),
        payload,
        budget,
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
    shared: &Shared,
    caller: &Arc<Caller>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let peer = caller.peer;
    let started = Instant::now();
    let incoming = match tokio::time::timeout(
        REQUEST_READ_TIMEOUT,
        read_request(&mut recv, &state, &shared.budget, peer),
    )
    .await
    {
        Ok(incoming) => incoming,
        Err(_) => Incoming::Refused {
            key: 0,
            version: 0,
            error: ErrorInfo::new(
                ErrorCode::RequestTimedOut,
                format!(
                    "the request frame did not arrive within {REQUEST_READ_TIMEOUT:?} (a large \
                     request may also have waited that long for the broker's request memory \
                     budget, max_inflight_request_bytes)"
                ),
            ),
        },
    };
    let (key, version, meta, payload, budget) = match incoming {
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
            budget,
        } => (key, version, meta, payload, budget),
    };
    let served = shared
        .router
        .route(caller, key, version, meta, payload, started)
        .await;
    write_reply(&mut send, key, version, served.reply, peer).await;
    drop(served.timer);
    // The body's memory counts until its reply is written.
    drop(budget);
}
