//! The errors of rill-net: one enum, [`NetError`], for TLS setup, endpoints,
//! connecting, and reading or writing frames.
//!
//! Invariant: every message says what failed (with the address or file at fault)
//! and, where the user can do something about it, what to do.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rill_proto::DecodeError;
use thiserror::Error;

/// Everything that can go wrong in the transport.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NetError {
    /// A file or directory operation failed (dev CA, certificates, keys).
    #[error("could not {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The client was told to trust the development CA, but there is none yet.
    #[error(
        "no Rill development CA at {}: start a broker on this machine first (it creates the CA), or pass --tls-ca FILE",
        path.display()
    )]
    NoDevCa { path: PathBuf },

    /// A PEM file held nothing usable, or could not be parsed.
    #[error("could not read {what} from {}: {reason}", path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },

    /// The development CA's key and certificate do not belong together.
    #[error(
        "the development CA key {} does not belong to the certificate {}: move both files away and start a broker to create a new CA (clients must then trust the new ca.pem)",
        key.display(),
        cert.display()
    )]
    DevCaMismatch { key: PathBuf, cert: PathBuf },

    /// Generating a key or signing a certificate failed.
    #[error("could not generate {what}: {source}")]
    CertGen {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },

    /// A certificate name (SAN) given for the broker certificate is not a valid
    /// DNS name or IP address.
    #[error("{name:?} is not a valid DNS name or IP address for the broker certificate")]
    InvalidCertName { name: String },

    /// A principal name that is empty, too long or has characters other than
    /// letters, digits, `.`, `_`, `-` and `@`.
    #[error(
        "{name:?} is not a valid principal name: use 1 to 64 characters of A-Z, a-z, 0-9, '.', '_', '-' and '@'"
    )]
    InvalidPrincipalName { name: String },

    /// `rill token issue --ttl` outside what a token may live
    /// ([`crate::token::TTL_MAX`]).
    #[error("a token lives 1 s to 168 h (7 days), not {secs} s")]
    TokenTtl { secs: u64 },

    /// rustls refused the configuration (bad key, unusable certificate, ...).
    #[error("invalid TLS configuration: {0}")]
    Tls(#[from] rustls::Error),

    /// The TLS configuration is not usable by QUIC (no TLS 1.3 initial suite, ...).
    #[error("invalid TLS configuration for QUIC: {0}")]
    TlsConfig(String),

    /// The listen address is taken by another socket.
    #[error("{addr} is already in use: is another broker running? pass --listen HOST:PORT")]
    AddrInUse { addr: SocketAddr },

    /// Creating, configuring or binding the UDP socket failed for another reason.
    #[error("could not {action} the UDP socket for {addr}: {source}")]
    Socket {
        action: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },

    /// quinn refused to start a connection (bad address, endpoint closing, ...).
    #[error("could not start a connection to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: quinn::ConnectError,
    },

    /// No handshake completed within the connect timeout. Over UDP an absent
    /// server usually looks like this, not like a refused connection.
    #[error(
        "no broker answering at {addr} (UDP) within {after:?}: is it running? is the address right?"
    )]
    ConnectTimeout { addr: SocketAddr, after: Duration },

    /// The TLS handshake failed: certificate not trusted, name mismatch, no
    /// common ALPN protocol, client certificate refused, ...
    #[error("TLS handshake with {addr} failed: {reason}")]
    TlsHandshake { addr: SocketAddr, reason: String },

    /// The broker refused the connection before the handshake (QUIC
    /// CONNECTION_REFUSED): a Rill broker does this when the client's address
    /// holds `max_connections_per_ip` connections already, or when it has far
    /// more than `max_connections`.
    #[error(
        "the broker at {addr} refused the connection: too many connections from this address (its max_connections_per_ip) or in all (its max_connections); close idle clients, or retry later"
    )]
    Refused { addr: SocketAddr },

    /// The connection could not be established for another reason.
    #[error("could not connect to {addr}: {source}")]
    Handshake {
        addr: SocketAddr,
        #[source]
        source: quinn::ConnectionError,
    },

    /// The broker closed the connection with a TLS alert about this client's
    /// certificate: none given where one is required, or one it does not trust.
    #[error("the broker refused this client's certificate ({alert}): {hint}")]
    ClientCertRefused { alert: String, hint: &'static str },

    /// An established connection failed (closed by the peer, timed out, reset).
    #[error("connection lost: {0}")]
    Connection(#[from] quinn::ConnectionError),

    /// Sending on a stream failed.
    #[error("could not send the frame: {0}")]
    Write(#[from] quinn::WriteError),

    /// The peer stopped the stream while we were sending a frame and sent no
    /// answer: it refused the frame (too large or malformed for it).
    #[error(
        "the peer refused the frame (it stopped the stream with code {code}): the frame may exceed its size limit"
    )]
    FrameRefused { code: quinn::VarInt },

    /// Receiving on a stream failed.
    #[error("could not receive the frame: {0}")]
    Read(#[from] quinn::ReadError),

    /// The peer finished its side of the stream before sending any frame.
    #[error("the peer finished the stream without sending a frame")]
    NoFrame,

    /// The peer finished its side of the stream in the middle of a frame.
    #[error(
        "truncated frame: the peer finished the stream after {received} of {expected} bytes of the frame {part}"
    )]
    TruncatedFrame {
        part: &'static str,
        expected: u64,
        received: u64,
    },

    /// The frame announced more bytes than the reader accepts; nothing was allocated.
    #[error(
        "frame of {size} bytes is larger than the limit of {max} bytes: send less per request or raise the limit"
    )]
    FrameTooLarge { size: u64, max: u64 },

    /// The frame header is inconsistent (e.g. meta longer than the frame).
    #[error("malformed frame: {0}")]
    MalformedFrame(DecodeError),

    /// An operation did not complete in time.
    #[error("{what} did not complete within {after:?}")]
    Timeout { what: &'static str, after: Duration },
}

impl NetError {
    /// The same error, as [`NetError::ClientCertRefused`] when the connection
    /// was closed by a TLS alert about the client's certificate. (In TLS 1.3 the
    /// server checks the client's certificate after the client considers the
    /// handshake done, so the refusal arrives on the first request.)
    pub fn refine(self) -> NetError {
        let conn = match &self {
            NetError::Connection(c)
            | NetError::Handshake { source: c, .. }
            | NetError::Read(quinn::ReadError::ConnectionLost(c))
            | NetError::Write(quinn::WriteError::ConnectionLost(c)) => c,
            _ => return self,
        };
        let quinn::ConnectionError::ConnectionClosed(close) = conn else {
            return self;
        };
        let code = u64::from(close.error_code);
        if !(0x100..0x200).contains(&code) {
            return self;
        }
        // TLS alert numbers (RFC 8446, 6.2).
        let (alert, hint) = match code - 0x100 {
            116 => (
                "certificate_required",
                "this broker requires client certificates (--auth mtls): pass --tls-cert FILE --tls-key FILE \
                 (issue them with `rill cert issue --principal NAME`)",
            ),
            42 | 43 | 44 | 45 | 46 | 48 => (
                "bad or untrusted certificate",
                "the certificate given with --tls-cert is not signed by the CA the broker trusts, \
                 has expired, or is not a client certificate",
            ),
            _ => return self,
        };
        let reason = String::from_utf8_lossy(&close.reason);
        NetError::ClientCertRefused {
            alert: if reason.is_empty() {
                alert.to_string()
            } else {
                format!("{alert}: {reason}")
            },
            hint,
        }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        NetError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn pem(what: &'static str, path: impl Into<PathBuf>, reason: impl ToString) -> Self {
        NetError::Pem {
            what,
            path: path.into(),
            reason: reason.to_string(),
        }
    }
}
