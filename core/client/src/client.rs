//! The [`Client`]: connections to brokers, the cached cluster metadata, and the
//! low-level request call every higher layer (admin, producer, consumer) uses.
//!
//! Routing: a request names a broker id (a partition's leader, taken from the
//! metadata cache) or "any broker". There is at most one QUIC connection per
//! broker; requests share it, each on its own bidirectional stream, so many can be
//! in flight at once. A connection that failed is dropped and re-made on next use.
//!
//! Metadata: loaded at connect time and refreshed on demand (a leadership error,
//! an unknown topic). Concurrent refreshes are coalesced: a caller that waited
//! while another refresh ran uses that refresh's result.
//!
//! Invariants: every request is bounded by `request_timeout`, every connect by
//! `connect_timeout`; a response frame is bounded by `max_response_bytes`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use rill_net::{NetError, TransportLimits};
use rill_proto::Rope;
use rill_proto::wire::{
    ApiRequest, ApiVersionsRequest, ApiVersionsResponse, BrokerInfo, ErrorCode, MetadataRequest,
    MetadataResponse, ResponseMeta, TopicMetadata, decode_meta, encode_meta,
};

use crate::admin::Admin;
use crate::config::{ClientConfig, ConsumerConfig, ProducerConfig};
use crate::consumer::Consumer;
use crate::error::ClientError;
use crate::producer::Producer;

/// A refresh that completed this recently satisfies a caller that waited for it.
const METADATA_COALESCE_WINDOW: Duration = Duration::from_millis(50);

/// The cluster as this client last saw it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterMetadata {
    pub cluster_id: String,
    pub controller_id: Option<i32>,
    pub brokers: HashMap<i32, BrokerInfo>,
    /// FxHash: looked up on every `send`.
    pub topics: rustc_hash::FxHashMap<String, Arc<TopicMetadata>>,
}

impl ClusterMetadata {
    /// Folds a metadata response in. `all_topics`: the response lists every topic,
    /// so topics missing from it are gone.
    fn merge(&mut self, resp: &MetadataResponse, all_topics: bool) {
        self.cluster_id = resp.cluster_id.clone();
        self.controller_id = resp.controller_id;
        if !resp.brokers.is_empty() {
            self.brokers = resp.brokers.iter().map(|b| (b.id, b.clone())).collect();
        }
        if all_topics {
            self.topics.clear();
        }
        for t in &resp.topics {
            match &t.error {
                None => {
                    self.topics.insert(t.name.clone(), Arc::new(t.clone()));
                }
                Some(_) => {
                    self.topics.remove(&t.name);
                }
            }
        }
    }

    /// The leader of a partition, if the metadata knows one.
    pub fn leader(&self, topic: &str, partition: u32) -> Option<i32> {
        let t = self.topics.get(topic)?;
        // Partitions are normally listed in order: try the direct index first.
        match t.partitions.get(partition as usize) {
            Some(p) if p.partition == partition => p.leader,
            _ => t
                .partitions
                .iter()
                .find(|p| p.partition == partition)
                .and_then(|p| p.leader),
        }
    }
}

/// A slot for the connection to one broker; the async mutex makes concurrent users
/// wait for one connect instead of racing several.
#[derive(Debug)]
struct BrokerSlot {
    addr: String,
    conn: tokio::sync::Mutex<Option<(SocketAddr, quinn::Connection)>>,
}

#[derive(Debug)]
pub(crate) struct ClientInner {
    pub config: ClientConfig,
    endpoint: quinn::Endpoint,
    pub metadata: RwLock<ClusterMetadata>,
    slots: Mutex<HashMap<i32, Arc<BrokerSlot>>>,
    /// Serialises metadata refreshes; holds when the last one completed.
    refresh: tokio::sync::Mutex<Option<Instant>>,
    /// What the bootstrap broker said in the ApiVersions handshake.
    pub versions: ApiVersionsResponse,
}

/// A handle on a Rill cluster. Cheap to clone: clones share connections and
/// metadata.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

/// Splits `host:port` (or `[v6]:port`) into the host and the port.
fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host, port))
}

async fn resolve(addr: &str) -> Result<(SocketAddr, String), ClientError> {
    let (host, port) = split_host_port(addr).ok_or_else(|| {
        ClientError::Config(format!(
            "broker address {addr:?} is not HOST:PORT (e.g. 127.0.0.1:{})",
            rill_proto::wire::DEFAULT_PORT
        ))
    })?;
    let mut addrs = tokio::net::lookup_host((host, port)).await.map_err(|e| {
        ClientError::Config(format!(
            "could not resolve broker address {addr}: {e}: check the host name"
        ))
    })?;
    let sock = addrs.next().ok_or_else(|| {
        ClientError::Config(format!("broker address {addr} resolved to no IP address"))
    })?;
    Ok((sock, host.to_string()))
}

fn timeout_error(what: String, after: Duration) -> ClientError {
    ClientError::Timeout {
        what: format!("{what} (after {after:?})"),
    }
}

impl Client {
    /// Connects to the first bootstrap broker that answers, checks it speaks this
    /// protocol (ApiVersions), and loads the cluster metadata.
    pub async fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        config.validate()?;
        let limits = TransportLimits {
            mtu_upper_bound: config.max_udp_payload_bytes,
            ..TransportLimits::default()
        };
        let endpoint = rill_net::client_endpoint(&config.tls, &limits)?;
        let mut last = None;
        for addr in &config.bootstrap {
            match Self::handshake(&endpoint, &config, addr).await {
                Ok((sock, conn, versions)) => {
                    let slot = Arc::new(BrokerSlot {
                        addr: addr.clone(),
                        conn: tokio::sync::Mutex::new(Some((sock, conn))),
                    });
                    let mut slots = HashMap::new();
                    slots.insert(versions.broker_id, slot);
                    let client = Client {
                        inner: Arc::new(ClientInner {
                            config,
                            endpoint,
                            metadata: RwLock::new(ClusterMetadata::default()),
                            slots: Mutex::new(slots),
                            refresh: tokio::sync::Mutex::new(None),
                            versions,
                        }),
                    };
                    client.metadata(None).await?;
                    return Ok(client);
                }
                Err(e) => {
                    tracing::debug!(%addr, error = %e, "bootstrap broker did not answer");
                    last = Some(e);
                }
            }
        }
        let addrs = config.bootstrap.join(", ");
        Err(match last.unwrap_or(ClientError::Closed) {
            // A bad address, a TLS problem or a broker's refusal says more on its own.
            e @ (ClientError::Config(_) | ClientError::Broker { .. }) => e,
            ClientError::Net(
                e @ (NetError::TlsHandshake { .. }
                | NetError::Refused { .. }
                | NetError::NoDevCa { .. }
                | NetError::ClientCertRefused { .. }
                | NetError::Pem { .. }),
            ) => ClientError::Net(e),
            other => ClientError::NoBroker {
                addrs,
                last: Box::new(other),
            },
        })
    }

    async fn handshake(
        endpoint: &quinn::Endpoint,
        config: &ClientConfig,
        addr: &str,
    ) -> Result<(SocketAddr, quinn::Connection, ApiVersionsResponse), ClientError> {
        let (sock, host) = resolve(addr).await?;
        let conn = rill_net::connect_named(endpoint, sock, &host, config.connect_timeout).await?;
        let req = ApiVersionsRequest {
            client_software: config.client_id.clone(),
        };
        let (versions, _) = raw_call(&conn, &req, &[], config, None, sock).await?;
        Ok((sock, conn, versions))
    }

    pub(crate) fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The largest request frame the bootstrap broker accepts.
    pub fn max_request_bytes(&self) -> u32 {
        self.inner.versions.max_request_bytes
    }

    /// The id of the broker this client bootstrapped from.
    pub fn bootstrap_broker_id(&self) -> i32 {
        self.inner.versions.broker_id
    }

    /// A connection to `broker` (connecting if needed), or to any broker.
    pub(crate) async fn connection(
        &self,
        broker: Option<i32>,
    ) -> Result<(i32, SocketAddr, quinn::Connection), ClientError> {
        match broker {
            Some(id) => self.connection_to(id).await,
            None => self.any_connection(None).await,
        }
    }

    /// A connection to any broker but `avoid`.
    async fn any_connection(
        &self,
        avoid: Option<i32>,
    ) -> Result<(i32, SocketAddr, quinn::Connection), ClientError> {
        // Prefer a broker we hold a live connection to, then the others
        // (a closed connection is often a dead broker: try it last).
        let mut candidates: Vec<i32> = {
            let slots = self.inner.slots.lock();
            let open = |slot: &BrokerSlot| {
                slot.conn
                    .try_lock()
                    .is_ok_and(|g| g.as_ref().is_some_and(|(_, c)| c.close_reason().is_none()))
            };
            let mut ids: Vec<i32> = slots
                .iter()
                .filter(|(_, s)| open(s))
                .map(|(id, _)| *id)
                .collect();
            let mut closed: Vec<i32> = slots
                .iter()
                .filter(|(_, s)| !open(s))
                .map(|(id, _)| *id)
                .collect();
            let meta = self.inner.metadata.read();
            for id in meta.brokers.keys() {
                if !ids.contains(id) && !closed.contains(id) {
                    ids.push(*id);
                }
            }
            ids.append(&mut closed);
            ids
        };
        candidates.retain(|id| Some(*id) != avoid);
        let mut last = None;
        for id in candidates {
            match self.connection_to(id).await {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            ClientError::Config("no broker known: pass --bootstrap HOST:PORT".into())
        }))
    }

    async fn connection_to(
        &self,
        id: i32,
    ) -> Result<(i32, SocketAddr, quinn::Connection), ClientError> {
        let slot = {
            let mut slots = self.inner.slots.lock();
            match slots.get(&id) {
                Some(s) => s.clone(),
                None => {
                    let addr = self
                        .inner
                        .metadata
                        .read()
                        .brokers
                        .get(&id)
                        .map(|b| b.addr.clone())
                        .ok_or_else(|| {
                            ClientError::Config(format!(
                                "broker {id} is not in the cluster metadata"
                            ))
                        })?;
                    let s = Arc::new(BrokerSlot {
                        addr,
                        conn: tokio::sync::Mutex::new(None),
                    });
                    slots.insert(id, s.clone());
                    s
                }
            }
        };
        let mut guard = slot.conn.lock().await;
        if let Some((sock, conn)) = guard.as_ref()
            && conn.close_reason().is_none()
        {
            return Ok((id, *sock, conn.clone()));
        }
        *guard = None;
        let (sock, host) = resolve(&slot.addr).await?;
        let conn = rill_net::connect_named(
            &self.inner.endpoint,
            sock,
            &host,
            self.inner.config.connect_timeout,
        )
        .await?;
        *guard = Some((sock, conn.clone()));
        Ok((id, sock, conn))
    }

    /// Forgets a connection that failed, so the next use reconnects.
    pub(crate) fn drop_connection(&self, id: i32, conn: &quinn::Connection) {
        let slot = self.inner.slots.lock().get(&id).cloned();
        if let Some(slot) = slot
            && let Ok(mut guard) = slot.conn.try_lock()
            && guard
                .as_ref()
                .is_some_and(|(_, c)| c.stable_id() == conn.stable_id())
        {
            *guard = None;
        }
    }

    /// A producer id (and epoch) for an idempotent producer, unique in the cluster.
    pub async fn init_producer_id(&self) -> Result<(i64, i16), ClientError> {
        let (resp, _) = self
            .call(
                None,
                &rill_proto::wire::InitProducerIdRequest::default(),
                &[],
            )
            .await?;
        Ok((resp.producer_id, resp.producer_epoch))
    }

    /// Sends one request to `broker` (`None`: any broker) and waits for its
    /// response. `payload` rides after the message (record batches for produce).
    ///
    /// Returns the response and the response payload (record batches for fetch).
    /// A whole-request error from the broker is [`ClientError::Broker`];
    /// per-partition errors are inside the response, for the caller to judge.
    /// Not for produce requests with acks=0 (the broker sends no response; use a
    /// [`crate::Producer`]).
    pub async fn call<R: ApiRequest>(
        &self,
        broker: Option<i32>,
        req: &R,
        payload: &[Bytes],
    ) -> Result<(R::Response, Bytes), ClientError> {
        let link = self.connection(broker).await?;
        self.call_on(link, req, payload).await
    }

    /// [`Client::call`] with the response payload left in the pieces it
    /// arrived in (a fetch response, decoded in place).
    pub(crate) async fn call_rope<R: ApiRequest>(
        &self,
        broker: i32,
        req: &R,
    ) -> Result<(R::Response, Rope), ClientError> {
        let (id, sock, conn) = self.connection(Some(broker)).await?;
        let result = raw_call_rope(&conn, req, &[], &self.inner.config, Some(id), sock).await;
        self.forget_if_closed(id, &conn, &result);
        result
    }

    /// Drops the connection to broker `id` after a call on it failed with a
    /// network error because the connection is closed.
    fn forget_if_closed<T>(
        &self,
        id: i32,
        conn: &quinn::Connection,
        result: &Result<T, ClientError>,
    ) {
        if let Err(ClientError::Net(_)) = result
            && conn.close_reason().is_some()
        {
            self.drop_connection(id, conn);
        }
    }

    /// [`Client::call`] on a connection already chosen.
    async fn call_on<R: ApiRequest>(
        &self,
        (id, sock, conn): (i32, SocketAddr, quinn::Connection),
        req: &R,
        payload: &[Bytes],
    ) -> Result<(R::Response, Bytes), ClientError> {
        let result = raw_call(&conn, req, payload, &self.inner.config, Some(id), sock).await;
        self.forget_if_closed(id, &conn, &result);
        result
    }

    /// Asks for the metadata of `topics` (`None`: every topic), and refreshes the
    /// client's cache with the answer.
    pub async fn metadata(
        &self,
        topics: Option<Vec<String>>,
    ) -> Result<MetadataResponse, ClientError> {
        let all = topics.is_none();
        let req = MetadataRequest { topics };
        let link = self.connection(None).await?;
        let answered_by = link.0;
        let (mut resp, _) = self.call_on(link, &req, &[]).await?;
        if fenced_answer(&resp) {
            // That broker is cut off from the cluster's controller and knows no
            // leader for what it led: another broker does (if one answers).
            match self.any_connection(Some(answered_by)).await {
                Ok(other) => match self.call_on(other, &req, &[]).await {
                    Ok((r, _)) => resp = r,
                    Err(e) => tracing::debug!(error = %e, "metadata from another broker failed"),
                },
                Err(e) => tracing::debug!(error = %e, "no other broker to ask for metadata"),
            }
        }
        self.inner.metadata.write().merge(&resp, all);
        Ok(resp)
    }

    /// Refreshes the metadata of `topics` from any broker but `avoid` (one that
    /// stopped answering), within `within`.
    pub(crate) async fn refresh_metadata_avoiding(
        &self,
        avoid: i32,
        topics: Vec<String>,
        within: Duration,
    ) -> Result<(), ClientError> {
        let req = MetadataRequest {
            topics: Some(topics),
        };
        let ask = async {
            let (id, sock, conn) = self.any_connection(Some(avoid)).await?;
            raw_call(&conn, &req, &[], &self.inner.config, Some(id), sock).await
        };
        let (resp, _) =
            tokio::time::timeout(within, ask)
                .await
                .map_err(|_| ClientError::Timeout {
                    what: format!("metadata from a broker other than {avoid}"),
                })??;
        self.inner.metadata.write().merge(&resp, false);
        *self.inner.refresh.lock().await = Some(Instant::now());
        Ok(())
    }

    /// Refreshes the metadata, unless another refresh finished since `since`
    /// (coalescing bursts of leadership errors into one request).
    pub(crate) async fn refresh_metadata(&self, since: Instant) -> Result<(), ClientError> {
        let mut last = self.inner.refresh.lock().await;
        if let Some(at) = *last
            && (at >= since || at.elapsed() < METADATA_COALESCE_WINDOW)
        {
            return Ok(());
        }
        self.metadata(None).await?;
        *last = Some(Instant::now());
        Ok(())
    }

    /// The cached metadata of a topic; refreshes once if the cache does not know it.
    pub(crate) async fn topic(&self, topic: &str) -> Result<Arc<TopicMetadata>, ClientError> {
        if let Some(t) = self.inner.metadata.read().topics.get(topic) {
            return Ok(t.clone());
        }
        let resp = self.metadata(Some(vec![topic.to_string()])).await?;
        if let Some(t) = resp.topics.iter().find(|t| t.name == topic) {
            match &t.error {
                None => return Ok(Arc::new(t.clone())),
                Some(e) if e.code == ErrorCode::UnknownTopicOrPartition => {}
                Some(e) => {
                    return Err(ClientError::broker(
                        format!("metadata for topic {topic}"),
                        e.clone(),
                    ));
                }
            }
        }
        Err(ClientError::UnknownTopic(topic.to_string()))
    }

    /// The number of partitions of a topic (from the cache when it knows).
    pub async fn partition_count(&self, topic: &str) -> Result<u32, ClientError> {
        Ok(self.topic(topic).await?.partitions.len() as u32)
    }

    /// The partition count of a topic the cache knows, without copying its
    /// metadata (the producer asks this for every record).
    pub(crate) fn cached_partition_count(&self, topic: &str) -> Option<u32> {
        self.inner
            .metadata
            .read()
            .topics
            .get(topic)
            .map(|t| t.partitions.len() as u32)
    }

    /// The address of broker `id`, if the cached metadata knows it.
    pub(crate) fn broker_addr(&self, id: i32) -> Option<String> {
        self.inner
            .metadata
            .read()
            .brokers
            .get(&id)
            .map(|b| b.addr.clone())
    }

    pub(crate) fn leader(&self, topic: &str, partition: u32) -> Option<i32> {
        self.inner.metadata.read().leader(topic, partition)
    }

    /// Topic administration: create, delete, list, describe, configs.
    pub fn admin(&self) -> Admin {
        Admin::new(self.clone())
    }

    /// A producer with its own background sender task (spawned on the current
    /// Tokio runtime: call this inside one).
    pub fn producer(&self, config: ProducerConfig) -> Result<Producer, ClientError> {
        Producer::new(self.clone(), config)
    }

    /// A consumer reading the partitions it is assigned.
    pub fn consumer(&self, config: ConsumerConfig) -> Result<Consumer, ClientError> {
        Consumer::new(self.clone(), config)
    }
}

/// One request/response on `conn`, bounded by the request timeout.
async fn raw_call<R: ApiRequest>(
    conn: &quinn::Connection,
    req: &R,
    payload: &[Bytes],
    config: &ClientConfig,
    broker: Option<i32>,
    sock: SocketAddr,
) -> Result<(R::Response, Bytes), ClientError> {
    let (resp, payload) = raw_call_rope(conn, req, payload, config, broker, sock).await?;
    Ok((resp, payload.to_bytes()))
}

/// [`raw_call`] with the response payload left in the pieces it arrived in.
async fn raw_call_rope<R: ApiRequest>(
    conn: &quinn::Connection,
    req: &R,
    payload: &[Bytes],
    config: &ClientConfig,
    broker: Option<i32>,
    sock: SocketAddr,
) -> Result<(R::Response, Rope), ClientError> {
    let meta = encode_meta(req);
    let who = match broker {
        Some(id) => format!("broker {id} at {sock}"),
        None => format!("the broker at {sock}"),
    };
    let frame = rill_net::call_timeout_rope(
        conn,
        R::KEY as u16,
        R::VERSION,
        &meta,
        payload,
        config.max_response_bytes,
        config.request_timeout,
    )
    .await
    .map_err(|e| match e {
        NetError::Timeout { after, .. } => {
            timeout_error(format!("{} request to {who}", R::KEY.name()), after)
        }
        other => ClientError::Net(other),
    })?;
    if frame.api_key != R::KEY as u16 {
        return Err(ClientError::Config(format!(
            "{who} answered a {} request with api key {}: is it a Rill broker of a compatible version?",
            R::KEY.name(),
            frame.api_key
        )));
    }
    let resp: ResponseMeta<R::Response> = decode_meta(&frame.meta)
        .map_err(|e| ClientError::decode(format!("{} response from {who}", R::KEY.name()), e))?;
    match resp {
        Ok(r) => Ok((r, frame.payload)),
        Err(error) => Err(ClientError::broker(
            format!("{} request to {who}", R::KEY.name()),
            error,
        )),
    }
}

/// Whether a Metadata answer comes from a broker that fenced itself: it names
/// no leader, with BROKER_NOT_AVAILABLE, for the partitions it led.
fn fenced_answer(resp: &MetadataResponse) -> bool {
    resp.topics.iter().flat_map(|t| &t.partitions).any(|p| {
        p.error
            .as_ref()
            .is_some_and(|e| e.code == ErrorCode::BrokerNotAvailable)
    })
}
