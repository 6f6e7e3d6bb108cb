//! rill-kafka: the Kafka-protocol TCP listener, a second front door to a Rill
//! broker that Kafka clients (librdkafka, kafka-python, the Java client) use
//! unchanged. QUIC stays Rill's own protocol; this translates.
//!
//! A connection reads Kafka frames (4-byte big-endian size, request header,
//! body), decodes them with the `kafka-protocol` crate (generated from Kafka's
//! schemas) at the version the header names, translates each request into
//! Rill's typed request and serves it through the broker's router
//! ([`rill_broker::front_door::FrontDoor::call`]), so authorization, element
//! caps, quotas and metrics are the QUIC path's. Record batches pass through:
//! a Produce's records bytes are the partition's produce payload, a Fetch
//! answers the batches as they lie on disk.
//!
//! What it is not: a second broker. It holds no state beyond a connection; it
//! never calls a broker handler directly. The binary (rill-cli) starts it
//! beside the broker; rill-broker does not know this crate.
//!
//! Invariants:
//! - A frame is bounded by the broker's `max_request_bytes` before its body is
//!   read, and its body is charged to a request budget of
//!   `max_inflight_request_bytes` before it is read.
//! - A request is answered in order, one at a time per connection (Kafka's
//!   ordering guarantee), except Produce with acks=0, which gets no answer.
//! - An api or version this listener does not serve: ApiVersions answers
//!   UNSUPPORTED_VERSION at version 0 with the supported ranges (as Kafka
//!   does); an api it does not serve is answered UNSUPPORTED_VERSION in its
//!   own response (`unsupported.rs`) where the response has an error field;
//!   any other (a served api at a version outside the advertised range, a
//!   broker-to-broker api) is logged with the client's address and api and
//!   the connection closed. Real clients negotiate through ApiVersions and
//!   never get there.
//! - A malformed or oversized frame closes its connection with a log line
//!   naming the client; it never panics, and other connections carry on.
//! - With `[kafka] tls` every connection is TLS (the broker's certificate and
//!   client-certificate policy, as on QUIC); the principal is who a verified
//!   client certificate names ([`Principal::of`]), else anonymous. With
//!   `[kafka] sasl_mechanisms` every connection authenticates first
//!   (`sasl.rs`) and the SASL user is the principal (a client certificate is
//!   then optional). With neither, every client is anonymous (the config then
//!   refuses `--auth mtls`).

mod apis;
pub mod codes;
mod configs;
mod groups;
mod kip848;
mod sasl;
mod txn;
mod unsupported;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};
use rill_broker::front_door::{Caller, FrontDoor, Principal};
use rill_broker::limits::{ConnectionsPerIp, RequestBudget};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

pub use apis::SUPPORTED;

/// A connection with no request for this long is closed (Kafka's
/// `connections.max.idle.ms` default).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest time to receive one frame's body once its size has arrived.
pub const FRAME_READ_TIMEOUT: Duration = rill_broker::REQUEST_READ_TIMEOUT;
/// Longest time to write one response.
pub const RESPONSE_WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest TLS handshake (with `[kafka] tls`).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    #[error("cannot listen for Kafka clients on {addr} (kafka_listen): {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "kafka_advertised_addr {addr:?} is not host:port with a port number; set it to the address Kafka clients should connect to, e.g. broker1.example.com:9093"
    )]
    Advertised { addr: String },
    #[error("cannot set up TLS for the Kafka listener ([kafka] tls): {0}")]
    Tls(#[from] rill_net::NetError),
}

/// A running Kafka-protocol listener.
#[derive(Debug)]
pub struct KafkaListener {
    local_addr: SocketAddr,
}

impl KafkaListener {
    /// The address the listener is bound to (the real port when asked for 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

/// Starts the Kafka listener on `config.kafka_listen`, if set: binds it and
/// serves connections in the broker's task scope until the broker shuts down.
pub async fn start(front: Arc<FrontDoor>) -> Result<Option<KafkaListener>, KafkaError> {
    let Some(addr) = front.config().kafka_listen else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| KafkaError::Bind { addr, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| KafkaError::Bind { addr, source })?;
    let advertised = front
        .config()
        .kafka_advertised_addr
        .clone()
        .unwrap_or_else(|| local_addr.to_string());
    let endpoint = apis::Endpoint::parse(&advertised).ok_or(KafkaError::Advertised {
        addr: advertised.clone(),
    })?;
    let tls = if front.config().kafka.tls {
        Some(tokio_rustls::TlsAcceptor::from(Arc::new(
            front.tcp_tls_config(!front.config().kafka.sasl_mechanisms.is_empty())?,
        )))
    } else {
        None
    };
    let shared = Arc::new(Shared {
        tls,
        budget: RequestBudget::new(front.config().max_inflight_request_bytes),
        per_ip: ConnectionsPerIp::new(front.config().max_connections_per_ip),
        endpoint,
        front: front.clone(),
    });
    front.tracker().spawn(accept_loop(shared, listener));
    tracing::info!(listen = %local_addr, advertised = %advertised, tls = front.config().kafka.tls, sasl = ?front.config().kafka.sasl_mechanisms, "Kafka listener started");
    Ok(Some(KafkaListener { local_addr }))
}

/// What every connection shares.
pub(crate) struct Shared {
    pub front: Arc<FrontDoor>,
    /// With `[kafka] tls`: the handshake every connection starts with.
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// The bytes of Kafka request bodies held at once.
    budget: RequestBudget,
    per_ip: Arc<ConnectionsPerIp>,
    /// The address Metadata and FindCoordinator name for this broker.
    pub endpoint: apis::Endpoint,
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let shutdown = shared.front.shutdown();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::warn!(error = %e, "Kafka listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(ip_slot) = shared.per_ip.admit(peer.ip()) else {
            if shared.per_ip.should_warn() {
                tracing::warn!(%peer, "Kafka listener: refusing a connection: too many from this address (max_connections_per_ip)");
            }
            continue;
        };
        let Some(place) = shared.front.open_connection() else {
            tracing::warn!(%peer, "Kafka listener: refusing a connection: too many connections (max_connections)");
            continue;
        };
        let s = shared.clone();
        shared.front.tracker().spawn(async move {
            let _held = (ip_slot, place);
            let _ = stream.set_nodelay(true);
            let Some(acceptor) = s.tls.clone() else {
                return serve_connection(s, stream, peer, Principal::Anonymous).await;
            };
            let shutdown = s.front.shutdown();
            let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream));
            let stream = tokio::select! {
                _ = shutdown.cancelled() => return,
                h = handshake => match h {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        tracing::warn!(%peer, "Kafka listener: TLS handshake failed: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::warn!(%peer, "Kafka listener: TLS handshake did not finish within {TLS_HANDSHAKE_TIMEOUT:?}");
                        return;
                    }
                },
            };
            // rustls verified the chain against the broker's CA; who its
            // leaf names is the principal.
            let identity = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| rill_net::identity_of(chain.first()?));
            serve_connection(s, stream, peer, Principal::of(identity)).await;
        });
    }
}

/// Why a connection ended.
#[derive(Debug)]
pub(crate) enum Closed {
    /// The client closed it, or it sat idle, or the broker is shutting down.
    Quietly,
    /// Something worth a log line (malformed frame, unsupported api, I/O error).
    Because(String),
}

async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    shared: Arc<Shared>,
    mut stream: S,
    peer: SocketAddr,
    principal: Principal,
) {
    let mut conn = Conn {
        caller: Arc::new(Caller { principal, peer }),
        sasl: sasl::State::new(!shared.front.config().kafka.sasl_mechanisms.is_empty()),
        members: kip848::Members::default(),
    };
    let shutdown = shared.front.shutdown();
    tracing::debug!(%peer, principal = ?conn.caller.principal, "Kafka client connected");
    let closed = loop {
        let result = tokio::select! {
            _ = shutdown.cancelled() => break Closed::Quietly,
            r = serve_one(&shared, &mut conn, &mut stream) => r,
        };
        if let Err(closed) = result {
            break closed;
        }
    };
    match closed {
        Closed::Quietly => tracing::debug!(%peer, "Kafka client disconnected"),
        Closed::Because(reason) => {
            tracing::warn!(%peer, "closing Kafka connection: {reason}")
        }
    }
}

/// One connection's state: who it is, and where its SASL exchange is.
pub(crate) struct Conn {
    pub caller: Arc<Caller>,
    sasl: sasl::State,
    /// KIP-848 members heartbeating here, with what they last sent.
    members: kip848::Members,
}

/// Reads one frame, serves it, writes its answer.
async fn serve_one<S: AsyncRead + AsyncWrite + Unpin>(
    shared: &Shared,
    conn: &mut Conn,
    stream: &mut S,
) -> Result<(), Closed> {
    let mut size = [0u8; 4];
    match tokio::time::timeout(IDLE_TIMEOUT, stream.read_exact(&mut size)).await {
        Err(_) => return Err(Closed::Quietly),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(Closed::Quietly);
        }
        Ok(Err(e)) => return Err(Closed::Because(format!("read failed: {e}"))),
        Ok(Ok(_)) => {}
    }
    let size = i32::from_be_bytes(size);
    let max = shared.front.config().max_request_bytes;
    if size < 4 || size as u32 > max {
        return Err(Closed::Because(format!(
            "malformed frame: size {size} is outside 4..={max} (max_request_bytes)"
        )));
    }
    let permit = shared
        .budget
        .acquire(size as u32)
        .await
        .map_err(|r| Closed::Because(r.error_info().message))?;
    let mut body = BytesMut::zeroed(size as usize);
    match tokio::time::timeout(FRAME_READ_TIMEOUT, stream.read_exact(&mut body)).await {
        Err(_) => {
            return Err(Closed::Because(format!(
                "a {size}-byte frame did not arrive within {FRAME_READ_TIMEOUT:?}"
            )));
        }
        Ok(Err(e)) => return Err(Closed::Because(format!("truncated frame: {e}"))),
        Ok(Ok(_)) => {}
    }
    let (response, close_after) = handle_frame(shared, conn, body.freeze()).await?;
    drop(permit);
    if let Some(response) = response {
        // A TLS stream holds records until flushed; a TCP stream's flush is free.
        let write = async {
            stream.write_all(&response).await?;
            stream.flush().await
        };
        match tokio::time::timeout(RESPONSE_WRITE_TIMEOUT, write).await {
            Err(_) => return Err(Closed::Because("response write timed out".into())),
            Ok(Err(e)) => return Err(Closed::Because(format!("write failed: {e}"))),
            Ok(Ok(())) => {}
        }
    }
    match close_after {
        Some(reason) => Err(Closed::Because(reason)),
        None => Ok(()),
    }
}

/// One frame's body (header + request) to its response frame (size prefix
/// included), `None` for no response (acks=0), or why to close; with a
/// reason beside the response when the connection closes after it (a failed
/// SASL authentication).
pub(crate) async fn handle_frame(
    shared: &Shared,
    conn: &mut Conn,
    mut body: Bytes,
) -> Result<(Option<Bytes>, Option<String>), Closed> {
    let raw_key = i16::from_be_bytes([body[0], body[1]]);
    let version = i16::from_be_bytes([body[2], body[3]]);
    let Ok(key) = ApiKey::try_from(raw_key) else {
        return Err(Closed::Because(format!(
            "unknown api key {raw_key} (version {version})"
        )));
    };
    let known = key.valid_versions();
    if !(known.min..=known.max).contains(&version) && key != ApiKey::ApiVersions {
        return Err(Closed::Because(format!(
            "{key:?} version {version} does not exist"
        )));
    }
    // Kafka's header layout for a version it does not know is the newest one.
    let header_version = key.request_header_version(version.min(known.max));
    let header = RequestHeader::decode(&mut body, header_version).map_err(|e| {
        Closed::Because(format!("malformed {key:?} v{version} request header: {e}"))
    })?;
    let correlation_id = header.correlation_id;
    let caller = conn.caller.clone();
    if !conn.sasl.authenticated()
        && !matches!(
            key,
            ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
        )
    {
        return Err(Closed::Because(format!(
            "{key:?} before SASL authentication (ILLEGAL_SASL_STATE): this listener requires \
             SASL ({})",
            shared.front.config().kafka.sasl_mechanisms.join(", ")
        )));
    }
    let Some(range) = apis::supported(key) else {
        tracing::debug!(peer = %caller.peer, "unsupported Kafka api {key:?} v{version}: answered UNSUPPORTED_VERSION");
        return unsupported::answer(key, version, correlation_id, body).map(|r| (Some(r), None));
    };
    if !range.contains(&version) {
        if key == ApiKey::ApiVersions {
            // As Kafka: answer at version 0, which every client can read, with
            // the versions we speak.
            let response = apis::api_versions_response(
                kafka_protocol::messages::ApiVersionsResponse::default()
                    .with_error_code(codes::kafka::UNSUPPORTED_VERSION),
            );
            return encode_response(key, 0, correlation_id, &response).map(|r| (Some(r), None));
        }
        return Err(Closed::Because(format!(
            "{key:?} version {version} is not served (this listener speaks {}..={}); the client \
             should have negotiated through ApiVersions",
            range.start(),
            range.end()
        )));
    }
    if matches!(key, ApiKey::SaslHandshake | ApiKey::SaslAuthenticate) {
        let (response, close) = sasl::serve(
            shared,
            &mut conn.sasl,
            &mut conn.caller,
            key,
            version,
            correlation_id,
            body,
        )
        .await?;
        return Ok((Some(response), close));
    }
    if key == ApiKey::ConsumerGroupHeartbeat {
        let r = kafka_protocol::messages::ConsumerGroupHeartbeatRequest::decode(&mut body, version)
            .map_err(|e| Closed::Because(format!("malformed {key:?} v{version} request: {e}")))?;
        let client_id = header
            .client_id
            .as_ref()
            .map(|c| c.to_string())
            .unwrap_or_default();
        let response = kip848::heartbeat(shared, &caller, &mut conn.members, &client_id, r).await;
        return encode_response(key, version, correlation_id, &response).map(|r| (Some(r), None));
    }
    apis::serve(shared, &caller, key, version, &header, body)
        .await
        .map(|r| (r, None))
}

/// A response frame: size, response header, body.
pub(crate) fn encode_response<M: Encodable>(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    message: &M,
) -> Result<Bytes, Closed> {
    let header_version = key.response_header_version(version);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let mut out = BytesMut::new();
    out.put_i32(0);
    header
        .encode(&mut out, header_version)
        .and_then(|()| message.encode(&mut out, version))
        .map_err(|e| {
            Closed::Because(format!(
                "cannot encode the {key:?} v{version} response: {e}"
            ))
        })?;
    let size = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&size.to_be_bytes());
    Ok(out.freeze())
}
