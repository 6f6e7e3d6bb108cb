//! rill-net: the QUIC transport of Rill — TLS setup, endpoints, connections, and
//! frames on request/response streams.
//!
//! What it is: the layer under rill-broker and rill-client that turns a socket
//! address and a TLS choice into a verified QUIC connection (quinn + rustls with
//! the *ring* provider, TLS 1.3, ALPN `rill/1`), and moves one frame per stream
//! direction (format in `rill_proto::wire::frame`). It also owns the per-machine
//! development CA that makes `rill broker` + `rill produce` work with verified TLS
//! and zero configuration.
//!
//! What it is not: it does not know what a request means (rill-proto), dispatch
//! requests (rill-broker), or retry and route (rill-client).
//!
//! Invariants: TLS is always on and the peer is always verified; every limit of
//! the transport is a named constant or a [`TransportLimits`] field; a frame is
//! bounded before anything is allocated for it; every error names the address or
//! file at fault and what to do.
//!
//! Modules: [`dev_ca`] (development CA files), [`identity`] (who a verified
//! certificate names), [`tls`] (rustls configs),
//! [`endpoint`] (UDP socket, quinn tuning, connecting), [`stream`] (frames).

pub mod dev_ca;
pub mod endpoint;
pub mod error;
pub mod identity;
pub mod stream;
pub mod tls;
pub mod token;

pub use dev_ca::{DevCa, dev_ca_cert_path, ensure_dev_ca, rill_home, write_cert_files};
pub use endpoint::{
    CONNECT_TIMEOUT, MTU_ETHERNET, MTU_UPPER_BOUND_DEFAULT, TransportLimits, UDP_PAYLOAD_MAX,
    UDP_PAYLOAD_MIN, client_config, client_config_with, client_endpoint, client_endpoint_for,
    connect, connect_named, server_endpoint,
};
pub use error::NetError;
pub use identity::{PeerIdentity, identity_of, peer_identity};
pub use stream::{
    Frame, RopeFrame, STREAM_CANCELLED, STREAM_FRAME_REFUSED, call, call_timeout,
    call_timeout_rope, parse_frame_header, read_frame, read_frame_body, read_frame_body_rope,
    read_frame_header_bytes, read_frame_rope, write_frame,
};
pub use tls::{ALPN, ClientAuth, ClientTls, ServerTls};

/// Re-exported so users name the same quinn (and its rustls) as rill-net.
pub use quinn;
