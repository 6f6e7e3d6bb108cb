//! QUIC endpoints and connections: the UDP socket, quinn's transport tuning, and
//! connecting with clear errors.
//!
//! Invariants:
//! - Every bound of the transport is a field of [`TransportLimits`] with a named
//!   default; nothing else in the crate sets quinn limits.
//! - Endpoints are created inside a Tokio runtime (quinn spawns its driver there);
//!   outside one, an error is returned instead of a panic.
//! - A connect attempt is bounded by [`CONNECT_TIMEOUT`] (or the caller's timeout).
//!   Over UDP a missing server is silence, not "connection refused", so the
//!   timeout is what tells the user "no broker answering".
//! - Datagrams and unidirectional streams are disabled: Rill speaks one request
//!   per bidirectional stream (see `rill_proto::wire::frame`).

use std::io::IoSliceMut;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};

use quinn::{
    AsyncUdpSocket, EndpointConfig, IdleTimeout, MtuDiscoveryConfig, Runtime, TokioRuntime,
    TransportConfig, UdpPoller, VarInt,
};
use socket2::{Domain, Protocol, Socket, Type};

use crate::error::NetError;
use crate::tls::{AeadLibrary, ClientTls, NOT_SIGNED_MESSAGE_START, ServerTls};

/// Longest wait for a QUIC + TLS handshake in [`connect`].
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default bound on concurrent requests (bidirectional streams) a peer may open.
pub const MAX_CONCURRENT_BIDI_STREAMS_DEFAULT: u32 = 1024;
/// Default per-stream receive window (bytes in flight on one request).
pub const STREAM_RECEIVE_WINDOW_DEFAULT: u32 = 16 * 1024 * 1024;
/// Default connection receive window.
pub const RECEIVE_WINDOW_DEFAULT: u64 = 64 * 1024 * 1024;
/// Default connection send window (bytes buffered unacknowledged).
pub const SEND_WINDOW_DEFAULT: u64 = 64 * 1024 * 1024;
/// Default idle timeout; keep-alives hold an idle connection open below it.
///
/// This is also how fast a peer that died without a word (SIGKILL, a pulled
/// cable: UDP gives no reset) is noticed, and so a floor under client failover:
/// requests on the dead connection fail when it fires, and the client refreshes
/// metadata elsewhere and retries at the new leader. 3 s is six keep-alives, far
/// above any stall of a live peer on loopback or a LAN.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(3);
/// Default keep-alive interval.
pub const KEEP_ALIVE_DEFAULT: Duration = Duration::from_millis(500);
/// Default SO_RCVBUF / SO_SNDBUF asked of the kernel (it may grant less).
pub const UDP_BUFFER_BYTES_DEFAULT: usize = 8 * 1024 * 1024;
/// Default upper bound of path MTU discovery: the largest UDP payload a
/// 65,536-byte loopback MTU carries over IPv6 (and IPv4).
///
/// Discovery climbs only as far as the path carries (probes, not data, are
/// what a smaller MTU loses; quinn: "it is safe to use an arbitrarily high
/// upper bound ... the only drawback is that MTU discovery might take more
/// time to finish"), so a high bound finds 1500-byte Ethernet (1452 bytes of
/// UDP payload over IPv6), 9000-byte jumbo frames (8952) and loopback
/// (65,488) alike, with no configuration. On loopback 64 KiB packets doubled
/// QUIC's throughput over 1452-byte ones (docs/BENCHMARKS.md). A lower bound
/// (`[net] max_udp_payload_bytes`) only shortens discovery where the MTU is
/// known.
pub const MTU_UPPER_BOUND_DEFAULT: u16 = 65_488;
/// The upper bound that fits a 1500-byte Ethernet MTU over IPv6.
pub const MTU_ETHERNET: u16 = 1452;

/// The bounds and windows of the QUIC transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportLimits {
    /// Concurrent requests (bidirectional streams) a peer may have open.
    pub max_concurrent_bidi_streams: u32,
    /// Bytes a peer may send on one stream before we read them.
    pub stream_receive_window: u32,
    /// Bytes a peer may send on the whole connection before we read them.
    pub receive_window: u64,
    /// Bytes we buffer unacknowledged on the whole connection.
    pub send_window: u64,
    /// A connection with no traffic for this long is closed.
    pub idle_timeout: Duration,
    /// Interval of keep-alive packets on an otherwise idle connection.
    pub keep_alive: Duration,
    /// SO_RCVBUF and SO_SNDBUF requested for the UDP socket.
    pub udp_buffer_bytes: usize,
    /// Upper bound of path MTU discovery (UDP payload bytes).
    pub mtu_upper_bound: u16,
}

impl Default for TransportLimits {
    fn default() -> Self {
        TransportLimits {
            max_concurrent_bidi_streams: MAX_CONCURRENT_BIDI_STREAMS_DEFAULT,
            stream_receive_window: STREAM_RECEIVE_WINDOW_DEFAULT,
            receive_window: RECEIVE_WINDOW_DEFAULT,
            send_window: SEND_WINDOW_DEFAULT,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
            keep_alive: KEEP_ALIVE_DEFAULT,
            udp_buffer_bytes: UDP_BUFFER_BYTES_DEFAULT,
            mtu_upper_bound: MTU_UPPER_BOUND_DEFAULT,
        }
    }
}

impl TransportLimits {
    /// quinn's transport configuration for these limits.
    ///
    /// Tuning: large windows so one connection can fill a fast link; send fairness
    /// off, so the streams of concurrent requests go out in the order they were
    /// written rather than interleaved packet by packet (each request completes
    /// sooner, and frames are not fragmented across many packets); MTU discovery
    /// on, up to `mtu_upper_bound`; segmentation offload (GSO) on, quinn's default.
    pub fn transport_config(&self) -> TransportConfig {
        let mut config = TransportConfig::default();
        let mut mtu = MtuDiscoveryConfig::default();
        mtu.upper_bound(self.mtu_upper_bound.clamp(UDP_PAYLOAD_MIN, UDP_PAYLOAD_MAX));
        config
            .max_concurrent_bidi_streams(VarInt::from_u32(self.max_concurrent_bidi_streams))
            .max_concurrent_uni_streams(VarInt::from_u32(0))
            .stream_receive_window(VarInt::from_u32(self.stream_receive_window))
            .receive_window(VarInt::from_u64(self.receive_window).unwrap_or(VarInt::MAX))
            .send_window(self.send_window)
            .send_fairness(false)
            .max_idle_timeout(Some(
                IdleTimeout::try_from(self.idle_timeout).unwrap_or(IdleTimeout::from(VarInt::MAX)),
            ))
            .keep_alive_interval(Some(self.keep_alive))
            .mtu_discovery_config(Some(mtu))
            .datagram_receive_buffer_size(None)
            .enable_segmentation_offload(true);
        config
    }

    /// quinn's endpoint configuration: accepts UDP payloads up to the larger of
    /// quinn's default (1472) and `mtu_upper_bound`, so MTU discovery between two
    /// Rill endpoints can reach the bound.
    pub fn endpoint_config(&self) -> EndpointConfig {
        let mut config = EndpointConfig::default();
        let accepted = self
            .mtu_upper_bound
            .clamp(UDP_PAYLOAD_ACCEPTED_MIN, UDP_PAYLOAD_MAX);
        config
            .max_udp_payload_size(accepted)
            .expect("bound is clamped to quinn's accepted range");
        config
    }
}

/// Smallest UDP payload an endpoint accepts from peers (quinn's default).
const UDP_PAYLOAD_ACCEPTED_MIN: u16 = 1472;
/// Smallest UDP payload QUIC allows (RFC 9000 section 14): the lowest
/// `mtu_upper_bound` that means anything.
pub const UDP_PAYLOAD_MIN: u16 = 1200;
/// Largest UDP payload over IPv4 or IPv6.
pub const UDP_PAYLOAD_MAX: u16 = 65_527;

/// A broker's endpoint: binds `listen` (an unspecified IPv6 address also accepts
/// IPv4) and accepts QUIC connections with `tls`.
///
/// Must be called inside a Tokio runtime.
pub fn server_endpoint(
    listen: SocketAddr,
    tls: &ServerTls,
    limits: &TransportLimits,
) -> Result<quinn::Endpoint, NetError> {
    require_runtime(listen)?;
    let crypto = QuicServerConfig::try_from(tls.build(Some(listen.ip()))?)
        .map_err(|e| NetError::TlsConfig(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    server.transport_config(Arc::new(limits.transport_config()));
    let socket = bind_udp(listen, limits.udp_buffer_bytes)?;
    let endpoint =
        new_endpoint(limits, Some(server), socket).map_err(|source| NetError::Socket {
            action: "start the QUIC endpoint on",
            addr: listen,
            source,
        })?;
    tracing::debug!(%listen, "QUIC server endpoint ready");
    Ok(endpoint)
}

/// quinn's client configuration for `tls` and `limits`. A broker that also
/// connects out (replication) can install it on its server endpoint with
/// `Endpoint::set_default_client_config`.
pub fn client_config(
    tls: &ClientTls,
    limits: &TransportLimits,
) -> Result<quinn::ClientConfig, NetError> {
    client_config_with(tls, limits, AeadLibrary::for_this_cpu())
}

/// [`client_config`], sealing with `aead`'s cipher suites whatever this CPU
/// would choose (peers on CPUs that choose differently still talk).
pub fn client_config_with(
    tls: &ClientTls,
    limits: &TransportLimits,
    aead: AeadLibrary,
) -> Result<quinn::ClientConfig, NetError> {
    let crypto = QuicClientConfig::try_from(tls.rustls_config_with(aead)?)
        .map_err(|e| NetError::TlsConfig(e.to_string()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(limits.transport_config()));
    Ok(config)
}

/// A client endpoint that can reach IPv4 and IPv6 brokers: binds `[::]:0`
/// dual-stack, or `0.0.0.0:0` where IPv6 is unavailable.
///
/// Must be called inside a Tokio runtime.
pub fn client_endpoint(
    tls: &ClientTls,
    limits: &TransportLimits,
) -> Result<quinn::Endpoint, NetError> {
    let any_v6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0));
    match client_endpoint_bound(any_v6, tls, limits) {
        Ok(endpoint) => Ok(endpoint),
        Err(NetError::Socket { .. }) => {
            tracing::debug!("IPv6 unavailable, client endpoint falls back to IPv4");
            client_endpoint_bound(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)), tls, limits)
        }
        Err(e) => Err(e),
    }
}

/// A client endpoint bound to the unspecified address of `remote`'s family.
///
/// Must be called inside a Tokio runtime.
pub fn client_endpoint_for(
    remote: SocketAddr,
    tls: &ClientTls,
    limits: &TransportLimits,
) -> Result<quinn::Endpoint, NetError> {
    let local = match remote {
        SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    };
    client_endpoint_bound(local, tls, limits)
}

fn client_endpoint_bound(
    local: SocketAddr,
    tls: &ClientTls,
    limits: &TransportLimits,
) -> Result<quinn::Endpoint, NetError> {
    require_runtime(local)?;
    let config = client_config(tls, limits)?;
    let socket = bind_udp(local, limits.udp_buffer_bytes)?;
    let mut endpoint = new_endpoint(limits, None, socket).map_err(|source| NetError::Socket {
        action: "start the QUIC endpoint on",
        addr: local,
        source,
    })?;
    endpoint.set_default_client_config(config);
    Ok(endpoint)
}

/// A quinn endpoint on `socket`, whose sends are split as [`GsoBounded`] says.
fn new_endpoint(
    limits: &TransportLimits,
    server: Option<quinn::ServerConfig>,
    socket: std::net::UdpSocket,
) -> std::io::Result<quinn::Endpoint> {
    let runtime = Arc::new(TokioRuntime);
    let inner = runtime.wrap_udp_socket(socket)?;
    let socket = Arc::new(GsoBounded { inner });
    quinn::Endpoint::new_with_abstract_socket(limits.endpoint_config(), server, socket, runtime)
}

/// Largest UDP payload of one segmentation-offload send: the kernel builds the
/// whole batch as one IP packet first (65,535 bytes less the IPv4 and UDP
/// headers) and refuses a larger one with EMSGSIZE.
const GSO_BATCH_BYTES_MAX: usize = 65_507;

/// How a transmit of `len` bytes in datagrams of `segment` bytes is sent: the
/// byte ranges of its sends, each a whole number of datagrams and at most
/// [`GSO_BATCH_BYTES_MAX`] bytes (one send if the batch fits).
fn gso_sends(len: usize, segment: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let per_send = if len <= GSO_BATCH_BYTES_MAX {
        len.max(1)
    } else {
        (GSO_BATCH_BYTES_MAX / segment.max(1)).max(1) * segment.max(1)
    };
    (0..len)
        .step_by(per_send)
        .map(move |start| start..(start + per_send).min(len))
}

/// quinn's UDP socket, with segmentation-offload batches split to what the
/// kernel sends.
///
/// quinn 0.11 hands the socket up to 10 datagrams of the path MTU in one GSO
/// send, whatever the MTU. Above 6,550 bytes per datagram such a batch exceeds
/// 64 KiB; the kernel refuses it with EMSGSIZE, which quinn-udp takes for a
/// failed MTU probe and drops without a word. Every bulk batch was lost, the
/// connection's black-hole detection set the path MTU back to 1,200 bytes, and
/// a `max_udp_payload_bytes` of 8952 made QUIC slower than 1452 (measured: path
/// MTU 1200 and about 50 lost packets per GiB on loopback). A batch too large
/// for one send goes out in several, each within the limit; a batch that fits
/// is passed through untouched.
#[derive(Debug)]
struct GsoBounded {
    inner: Arc<dyn AsyncUdpSocket>,
}

impl AsyncUdpSocket for GsoBounded {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &quinn::udp::Transmit<'_>) -> std::io::Result<()> {
        let segment = match transmit.segment_size {
            Some(segment) if transmit.contents.len() > GSO_BATCH_BYTES_MAX => segment,
            _ => return self.inner.try_send(transmit),
        };
        for range in gso_sends(transmit.contents.len(), segment) {
            let contents = &transmit.contents[range];
            let part = quinn::udp::Transmit {
                contents,
                segment_size: (contents.len() > segment).then_some(segment),
                ..*transmit
            };
            // quinn-udp reports only WouldBlock (a full socket buffer) or a
            // fatal error; it swallows the rest. Either way quinn keeps the
            // whole batch and retries it on WouldBlock: the parts already out
            // arrive twice and the receiver drops the duplicates, which is
            // cheaper than letting them count as lost (repeated losses of
            // large packets make quinn fall back to 1,200-byte ones).
            self.inner.try_send(&part)?;
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> Poll<std::io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

fn require_runtime(addr: SocketAddr) -> Result<(), NetError> {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => Ok(()),
        Err(e) => Err(NetError::Socket {
            action: "start the QUIC endpoint (needs a Tokio runtime) on",
            addr,
            source: std::io::Error::other(e),
        }),
    }
}

/// Creates, sizes and binds the UDP socket of an endpoint.
fn bind_udp(addr: SocketAddr, buffer_bytes: usize) -> Result<std::net::UdpSocket, NetError> {
    let socket_err = |action| {
        move |source| NetError::Socket {
            action,
            addr,
            source,
        }
    };
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .map_err(socket_err("create"))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        // Dual stack: one socket for IPv4 and IPv6 peers.
        if let Err(e) = socket.set_only_v6(false) {
            tracing::debug!(%addr, error = %e, "could not make the socket dual-stack");
        }
    }
    if let Err(e) = socket.set_recv_buffer_size(buffer_bytes) {
        tracing::debug!(%addr, error = %e, "could not set SO_RCVBUF");
    }
    if let Err(e) = socket.set_send_buffer_size(buffer_bytes) {
        tracing::debug!(%addr, error = %e, "could not set SO_SNDBUF");
    }
    tracing::debug!(
        %addr,
        requested = buffer_bytes,
        recv_granted = socket.recv_buffer_size().ok(),
        send_granted = socket.send_buffer_size().ok(),
        "UDP socket buffers (raise net.core.rmem_max / wmem_max if granted is much lower)"
    );
    socket
        .set_nonblocking(true)
        .map_err(socket_err("configure"))?;
    socket.bind(&addr.into()).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AddrInUse {
            NetError::AddrInUse { addr }
        } else {
            NetError::Socket {
                action: "bind",
                addr,
                source,
            }
        }
    })?;
    Ok(socket.into())
}

/// Connects to the broker at `addr`, verifying its certificate for the IP
/// address (Rill broker certificates carry IP SANs), within [`CONNECT_TIMEOUT`].
pub async fn connect(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
) -> Result<quinn::Connection, NetError> {
    connect_named(endpoint, addr, &addr.ip().to_string(), CONNECT_TIMEOUT).await
}

/// Connects to `addr`, verifying the broker's certificate for `server_name` (a
/// DNS name or an IP address), within `timeout`.
pub async fn connect_named(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
    server_name: &str,
    timeout: Duration,
) -> Result<quinn::Connection, NetError> {
    let connecting = endpoint
        .connect(addr, server_name)
        .map_err(|source| NetError::Connect { addr, source })?;
    match tokio::time::timeout(timeout, connecting).await {
        Err(_) => Err(NetError::ConnectTimeout {
            addr,
            after: timeout,
        }),
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(handshake_error(addr, e, timeout)),
    }
}

/// TLS alerts travel as QUIC transport error codes 0x100 + alert.
const CRYPTO_ERROR_FIRST: u64 = 0x100;
const CRYPTO_ERROR_LAST: u64 = 0x1ff;

fn tls_alert(code: quinn::TransportErrorCode) -> Option<u8> {
    let code = u64::from(code);
    (CRYPTO_ERROR_FIRST..=CRYPTO_ERROR_LAST)
        .contains(&code)
        .then(|| (code - CRYPTO_ERROR_FIRST) as u8)
}

fn handshake_error(addr: SocketAddr, error: quinn::ConnectionError, timeout: Duration) -> NetError {
    use quinn::ConnectionError as E;
    match error {
        // We refused the broker (our verifier failed): the reason is ours.
        E::TransportError(ref e) if tls_alert(e.code).is_some() => {
            let reason = match e.reason.find(NOT_SIGNED_MESSAGE_START) {
                Some(start) => e.reason[start..].trim_end_matches(')').to_string(),
                None => e.reason.clone(),
            };
            NetError::TlsHandshake { addr, reason }
        }
        // The broker refused us.
        E::ConnectionClosed(ref close) if tls_alert(close.error_code).is_some() => {
            let alert = tls_alert(close.error_code).unwrap_or(0);
            let reason = match alert {
                120 => {
                    "the server does not speak Rill (no common ALPN protocol rill/1)".to_string()
                }
                116 => "the broker requires a client certificate: pass --tls-cert and --tls-key"
                    .to_string(),
                42 | 43 | 44 | 45 | 46 | 48 => {
                    format!(
                        "the broker refused this client's certificate (TLS alert {alert}): is it signed by the CA the broker trusts?"
                    )
                }
                _ => format!("the broker ended the handshake with TLS alert {alert}: {close}"),
            };
            NetError::TlsHandshake { addr, reason }
        }
        E::ConnectionClosed(ref close)
            if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED =>
        {
            NetError::Refused { addr }
        }
        E::TimedOut => NetError::ConnectTimeout {
            addr,
            after: timeout,
        },
        source => NetError::Handshake { addr, source },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gso_batch_is_split_into_sends_the_kernel_takes() {
        for segment in [1200usize, 1452, 6550, 6551, 8952, 16384, 32768, 65_488] {
            for len in [1, segment, 10 * segment - 7, 10 * segment] {
                let sends: Vec<_> = gso_sends(len, segment).collect();
                // Every byte once, in order.
                assert_eq!(sends.first().map(|r| r.start), Some(0));
                assert_eq!(sends.last().map(|r| r.end), Some(len));
                for pair in sends.windows(2) {
                    assert_eq!(pair[0].end, pair[1].start);
                    // Only the last send may end inside a datagram.
                    assert_eq!(pair[0].len() % segment, 0, "segment {segment}");
                }
                for r in &sends {
                    assert!(
                        r.len() <= GSO_BATCH_BYTES_MAX || r.len() <= segment,
                        "segment {segment}, len {len}: send of {}",
                        r.len()
                    );
                }
                if len <= GSO_BATCH_BYTES_MAX {
                    assert_eq!(sends.len(), 1, "a batch that fits is one send");
                }
            }
        }
        // 10 datagrams of 8952 bytes: 7, then 3.
        let sends: Vec<_> = gso_sends(89_520, 8952).map(|r| r.len()).collect();
        assert_eq!(sends, [7 * 8952, 3 * 8952]);
    }
}
