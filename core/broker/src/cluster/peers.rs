//! `PeerLinks`: this broker's QUIC connections to the other brokers of the
//! cluster (Raft RPCs, joins, heartbeats, forwarded writes, replica fetches).
//!
//! One connection per peer address, made on first use and re-made after it
//! fails; every call is bounded by a timeout and a response size limit.

use parking_lot::Mutex;
use rill_net::{ClientTls, NetError, TransportLimits};
use rill_proto::Rope;
use rill_proto::wire::{ApiRequest, ErrorCode, ErrorInfo, ResponseMeta, decode_meta, encode_meta};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Longest a connect to a peer may take.
pub const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest response a peer may send (a replica fetch carries record batches).
pub const PEER_RESPONSE_BYTES_MAX: u32 = 128 * 1024 * 1024;

/// Why a call to a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("peer {addr} unreachable: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("peer {addr} answered: {info}")]
    Remote { addr: String, info: ErrorInfo },
}

impl PeerError {
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            PeerError::Remote { info, .. } => Some(info.code),
            PeerError::Unreachable { .. } => None,
        }
    }
}

/// Connections to peers.
#[derive(Debug)]
pub struct PeerLinks {
    endpoint: quinn::Endpoint,
    conns: Mutex<HashMap<String, quinn::Connection>>,
}

impl PeerLinks {
    /// Must be called inside a Tokio runtime. `max_udp_payload` bounds path MTU
    /// discovery (`[net] max_udp_payload_bytes`).
    pub fn new(tls: &ClientTls, max_udp_payload: u16) -> Result<Arc<PeerLinks>, NetError> {
        let limits = TransportLimits {
            mtu_upper_bound: max_udp_payload,
            ..TransportLimits::default()
        };
        let endpoint = rill_net::client_endpoint(tls, &limits)?;
        Ok(Arc::new(PeerLinks {
            endpoint,
            conns: Mutex::new(HashMap::new()),
        }))
    }

    async fn connection(&self, addr: &str) -> Result<quinn::Connection, PeerError> {
        if let Some(c) = self.conns.lock().get(addr)
            && c.close_reason().is_none()
        {
            return Ok(c.clone());
        }
        let unreachable = |reason: String| PeerError::Unreachable {
            addr: addr.to_string(),
            reason,
        };
        let sock = resolve(addr).await.map_err(unreachable)?;
        let conn = rill_net::connect_named(
            &self.endpoint,
            sock,
            &sock.ip().to_string(),
            PEER_CONNECT_TIMEOUT,
        )
        .await
        .map_err(|e| unreachable(e.to_string()))?;
        self.conns.lock().insert(addr.to_string(), conn.clone());
        Ok(conn)
    }

    /// Sends one request to the broker at `addr` and decodes the response; the
    /// payload of the response frame is returned beside it, in the pieces it
    /// arrived in (a replica fetch's batches are appended from them).
    pub async fn call<R: ApiRequest>(
        &self,
        addr: &str,
        request: &R,
        timeout: Duration,
    ) -> Result<(R::Response, Rope), PeerError> {
        let conn = self.connection(addr).await?;
        let meta = encode_meta(request);
        let frame = rill_net::call_timeout_rope(
            &conn,
            R::KEY as u16,
            R::VERSION,
            &meta,
            &[],
            PEER_RESPONSE_BYTES_MAX,
            timeout,
        )
        .await
        .map_err(|e| {
            // The connection may be dead (peer killed, paused): make a new one next time.
            if !matches!(e, NetError::FrameRefused { .. }) {
                self.conns.lock().remove(addr);
            }
            PeerError::Unreachable {
                addr: addr.to_string(),
                reason: e.to_string(),
            }
        })?;
        let decoded: ResponseMeta<R::Response> =
            decode_meta(&frame.meta).map_err(|e| PeerError::Unreachable {
                addr: addr.to_string(),
                reason: format!("undecodable response: {e}"),
            })?;
        match decoded {
            Ok(r) => Ok((r, frame.payload)),
            Err(info) => Err(PeerError::Remote {
                addr: addr.to_string(),
                info,
            }),
        }
    }

    /// Closes every connection (shutdown).
    pub fn close(&self) {
        for (_, c) in self.conns.lock().drain() {
            c.close(0u32.into(), b"broker shutting down");
        }
        self.endpoint.close(0u32.into(), b"broker shutting down");
    }
}

async fn resolve(addr: &str) -> Result<SocketAddr, String> {
    if let Ok(sock) = addr.parse::<SocketAddr>() {
        return Ok(sock);
    }
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("could not resolve {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr} resolved to no address"))
}
