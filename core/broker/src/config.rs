//! `BrokerConfig`: everything a broker is told at startup, read from a TOML file
//! (snake_case keys, unknown keys refused) or built in code. See
//! `core/broker/rill.example.toml` for a commented sample.
//!
//! Invariant: a config that passed [`BrokerConfig::validate`] holds only values the
//! broker can run with; `Broker::start` validates before touching the disk.

use crate::error::BrokerError;
use rill_log::LogConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Upper bound on partitions per topic (CreateTopics and `num_partitions`).
pub const PARTITIONS_PER_TOPIC_MAX: u32 = 10_000;
/// Smallest `max_request_bytes` accepted: a frame must fit a useful request.
pub const MAX_REQUEST_BYTES_MIN: u32 = 1024;
/// Default bound on one request frame.
pub const DEFAULT_MAX_REQUEST_BYTES: u32 = rill_proto::wire::DEFAULT_MAX_REQUEST_BYTES;
/// Default bound on concurrent request streams per connection.
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// Default bound on produce bytes being appended at once, per broker.
pub const DEFAULT_MAX_INFLIGHT_PRODUCE_BYTES: usize = 256 * 1024 * 1024;
/// Default `tail_cache_bytes`: off. The cache's copy on append costs a
/// producer about 10% at RF 1, and with RF 3 it only breaks even with the two
/// file reads it saves (docs/BENCHMARKS.md); it pays where several readers
/// fetch the same tail (consumer groups fanning out from one topic).
pub const DEFAULT_TAIL_CACHE_BYTES: usize = 0;
/// Default broker-wide budget of request body bytes held at once.
pub const DEFAULT_MAX_INFLIGHT_REQUEST_BYTES: u64 = 256 * 1024 * 1024;
/// Largest `max_inflight_request_bytes` accepted (64 GiB).
pub const MAX_INFLIGHT_REQUEST_BYTES_MAX: u64 = 64 * 1024 * 1024 * 1024;
/// Default bound on connections from one IP address.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 256;
/// Default `transforms.memory_mb_max`.
pub const DEFAULT_TRANSFORMS_MEMORY_MB_MAX: u64 = 512;
/// Default `transforms.call_timeout_ms_max`.
pub const DEFAULT_TRANSFORMS_CALL_TIMEOUT_MS_MAX: u64 = 60_000;
/// Largest `transforms.memory_mb_max` accepted: a 32-bit guest addresses 4 GiB.
pub const TRANSFORMS_MEMORY_MB_MAX_CEILING: u64 = 4096;
/// Largest `transforms.call_timeout_ms_max` accepted (10 minutes).
pub const TRANSFORMS_CALL_TIMEOUT_MS_MAX_CEILING: u64 = 600_000;

/// TLS settings. All `None`: the broker presents a certificate issued by the
/// development CA in the Rill home (created on first use).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// `cert`: PEM certificate chain the broker presents (needs `key`).
    pub cert: Option<PathBuf>,
    /// `key`: PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// `ca`: PEM CA certificates; when set, clients must present a certificate
    /// signed by one of them (mutual TLS).
    pub ca: Option<PathBuf>,
}

/// The Kafka-protocol listener's options (`[kafka]`); its addresses are the
/// top-level `kafka_listen` and `kafka_advertised_addr`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// `tls`: the listener speaks TLS (Kafka's `security.protocol=SSL`) with
    /// the broker's certificate; a client certificate from the broker's CA
    /// names the principal, as on QUIC, and is required with `--auth mtls`.
    pub tls: bool,
    /// `sasl_mechanisms`: SASL on the listener (Kafka's SASL_PLAINTEXT, or
    /// SASL_SSL with `tls`): any of `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`,
    /// checked against the SCRAM users of the metadata quorum (`rill user`);
    /// every client must then authenticate, and the user is its principal.
    pub sasl_mechanisms: Vec<String>,
}

/// The QUIC transport's options (`[net]`), for the client listener and the
/// links to other brokers alike.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetConfig {
    /// `max_udp_payload_bytes`: the largest UDP payload path MTU discovery may
    /// reach (1200..=65527; default 65488, loopback's). Discovery only climbs
    /// as far as the path really carries, so the default finds 1452 on
    /// 1500-byte Ethernet, 8952 on jumbo frames (MTU 9000) and 64 KiB
    /// packets on loopback; a lower bound only shortens discovery. Both ends
    /// bound it (clients: `--max-udp-payload-bytes`).
    pub max_udp_payload_bytes: u16,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            max_udp_payload_bytes: rill_net::MTU_UPPER_BOUND_DEFAULT,
        }
    }
}

/// The SASL mechanisms the Kafka listener can offer.
pub const KAFKA_SASL_MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// How clients prove who they are (`[auth]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// `mode`: `"none"` (clients are anonymous and allowed everything but the
    /// cluster-internal apis) or `"mtls"` (every client presents a certificate
    /// chained to the CA; its common name is its principal; ACLs decide).
    pub mode: AuthMode,
    /// `super_users`: principals allowed everything (with `mode = "mtls"`).
    pub super_users: Vec<String>,
    /// `allow_anonymous`: let a broker with `mode = "none"` listen on a
    /// non-loopback address (it refuses to start otherwise).
    pub allow_anonymous: bool,
}

/// `[auth] mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No client authentication.
    #[default]
    None,
    /// Mutual TLS: client certificates required, principal = common name.
    Mtls,
}

impl AuthMode {
    pub fn name(self) -> &'static str {
        match self {
            AuthMode::None => "none",
            AuthMode::Mtls => "mtls",
        }
    }
}

impl std::str::FromStr for AuthMode {
    type Err = String;
    fn from_str(s: &str) -> Result<AuthMode, String> {
        match s {
            "none" => Ok(AuthMode::None),
            "mtls" => Ok(AuthMode::Mtls),
            other => Err(format!(
                "unknown auth mode {other:?}: use \"none\" or \"mtls\""
            )),
        }
    }
}

/// Tiered storage: the object store segments are uploaded to (`[object_store]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObjectStoreConfig {
    /// `url`: `file:///path`, `s3://bucket/prefix`, `gs://bucket/prefix` or
    /// `az://container/prefix`; credentials, region and endpoint come from the
    /// usual environment variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`).
    pub url: String,
    /// `cache_bytes`: bound on the in-memory cache of remote segment data.
    pub cache_bytes: u64,
    /// `upload_interval_ms`: how often the uploader looks for segments to upload.
    pub upload_interval_ms: u64,
    /// `fetch_timeout_ms`: how long a fetch waits for the object store (its own
    /// limit, longer than a fetch's `max_wait_ms`, sized for object storage).
    pub fetch_timeout_ms: u64,
}

/// Default `object_store.upload_interval_ms`.
pub const DEFAULT_UPLOAD_INTERVAL_MS: u64 = 1000;
/// Default `object_store.fetch_timeout_ms`.
pub const DEFAULT_REMOTE_FETCH_TIMEOUT_MS: u64 = 30_000;

/// Operator maxima of the WebAssembly transforms this broker process runs
/// (`[transforms]`): a deployment asking for more is not run (its record is
/// marked halted with the reason). The broker itself only carries them to the
/// transform supervisor of `rill broker`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransformsConfig {
    /// `memory_mb_max`: the most memory (MiB) one transform instance may ask
    /// for (`rill transform deploy --memory-mb`), all its memories and tables
    /// counted together.
    pub memory_mb_max: u64,
    /// `call_timeout_ms_max`: the longest deadline (ms) one call into a
    /// transform may ask for (`rill transform deploy --timeout-ms`).
    pub call_timeout_ms_max: u64,
}

impl Default for TransformsConfig {
    fn default() -> Self {
        TransformsConfig {
            memory_mb_max: DEFAULT_TRANSFORMS_MEMORY_MB_MAX,
            call_timeout_ms_max: DEFAULT_TRANSFORMS_CALL_TIMEOUT_MS_MAX,
        }
    }
}

impl Default for ObjectStoreConfig {
    fn default() -> Self {
        ObjectStoreConfig {
            url: String::new(),
            cache_bytes: crate::tier::reader::DEFAULT_REMOTE_CACHE_BYTES,
            upload_interval_ms: DEFAULT_UPLOAD_INTERVAL_MS,
            fetch_timeout_ms: DEFAULT_REMOTE_FETCH_TIMEOUT_MS,
        }
    }
}

/// The broker's configuration. TOML keys are the field names (snake_case):
///
/// | key | default | meaning |
/// |---|---|---|
/// | `id` | 0 | this broker's id |
/// | `listen` | `"127.0.0.1:9092"` | UDP address of the QUIC endpoint (`:0` picks a port) |
/// | `advertised_addr` | listen address | `host:port` clients are told to use |
/// | `data_dir` | `"./rill-data"` | where topic metadata and partition logs live |
/// | `[tls]` `cert`, `key`, `ca` | none | see [`TlsConfig`] |
/// | `[auth]` `mode`, `super_users`, `allow_anonymous` | `"none"` | see [`AuthConfig`] |
/// | `rill_home` | `$RILL_HOME` or `~/.rill` | where the development CA lives |
/// | `metrics` | none | `host:port` of a Prometheus endpoint (off when unset) |
/// | `console` | none | `host:port` (TCP) of the web console, rill-console (off when unset; loopback only unless `console_allow_remote`) |
/// | `console_allow_remote` | false | let the console listen on a non-loopback address (plain HTTP: without auth anyone reaching it acts with the broker's rights; with `--auth mtls` users sign in with `rill token issue` tokens, sent unencrypted) |
/// | `auto_create_topics` | false | produce/metadata to an unknown topic creates it |
/// | `num_partitions` | 1 | partitions of a topic created without a count |
/// | `default_replication_factor` | 1 | replication factor of a topic created without one |
/// | `kafka_listen` | unset (off) | `host:port` (TCP) of the Kafka-protocol listener (rill-kafka) |
/// | `kafka_advertised_addr` | `kafka_listen` | `host:port` Kafka clients are told to use |
/// | `[kafka]` `tls`, `sasl_mechanisms` | false, `[]` | see [`KafkaConfig`] |
/// | `max_request_bytes` | 64 MiB | largest request frame accepted |
/// | `max_connections` | 1024 | connections beyond this are closed with a reason (far beyond it, refused before the handshake) |
/// | `max_connections_per_ip` | 256 | connections from one IP address beyond this are refused before the TLS handshake |
/// | `max_streams_per_connection` | 256 | concurrent requests per connection |
/// | `max_inflight_produce_bytes` | 256 MiB | produce bytes being appended at once (append concurrency; their memory is in `max_inflight_request_bytes`) |
/// | `tail_cache_bytes` | 0 (off) | a copy of the newest bytes of the leaders' active segments kept in memory for fetches at the end of the log (followers, consumers keeping up), at most 8 MiB per partition, dropped after 10 s without appends; process-wide (see `rill_log::tail`; `64 MiB` = 67108864 suits a topic many consumer groups read at its end) |
/// | `max_inflight_request_bytes` | 256 MiB | request body bytes held at once, broker-wide, charged before a body is read (see `limits.rs`) |
/// | `retention_check_interval_ms` | 300000 | how often retention and compaction run |
/// | `flush_check_interval_ms` | 1000 | how often time-based flush / roll run |
/// | `[topic_defaults]` | none | Kafka topic configs for every topic (`"retention.ms" = "3600000"`) |
/// | `shutdown_timeout_ms` | 10000 | how long shutdown waits for in-flight requests |
/// | `[object_store]` `url`, ... | none (tiering off) | see [`ObjectStoreConfig`] |
/// | `offsets_topic_num_partitions` | 8 | partitions of `__consumer_offsets` when the broker creates it |
/// | `offsets_topic_replication_factor` | 3 | its replication factor (capped at the live brokers) |
/// | `transaction_state_num_partitions` | 8 | partitions of `__transaction_state` (transaction coordinators) when the broker creates it |
/// | `transaction_state_replication_factor` | 3 | its replication factor (capped at the live brokers) |
/// | `group_min_session_timeout_ms` | 1000 | shortest session timeout a group member may ask for |
/// | `group_max_session_timeout_ms` | 1800000 | longest session timeout a group member may ask for |
/// | `group_max_size` | 1000 | most members in one consumer group |
/// | `group_consumer_session_timeout_ms` | 45000 | session timeout of a Kafka client's KIP-848 group member (Kafka's `group.consumer.session.timeout.ms`) |
/// | `group_consumer_heartbeat_interval_ms` | 5000 | its heartbeat interval when nothing changes (Kafka's `group.consumer.heartbeat.interval.ms`) |
/// | `group_initial_rebalance_delay_ms` | 3000 | how long a Kafka classic group's first rebalance waits for more members (Kafka's `group.initial.rebalance.delay.ms`) |
/// | `join` | none | `host:port` of a running broker: join its cluster as a voter |
/// | `peers` | `[]` | fixed voter list, `["0@host:port", ...]` (this broker included) |
/// | `broker_session_timeout_ms` | 1500 | a broker silent this long is fenced by the controller |
/// | `broker_heartbeat_interval_ms` | 250 | how often a broker heartbeats to the controller |
/// | `replica_lag_time_max_ms` | 10000 | default `replica.lag.time.max.ms`: a follower behind this long leaves the ISR |
/// | `leader_imbalance_check_interval_ms` | 300000 | preferred-leader election timer (0: off) |
/// | `min_free_bytes` | 5% of the disk, at most 256 MiB | records are refused (STORAGE_ERROR) below this much free space on the data disk; 0: off |
/// | `[transforms]` `memory_mb_max`, `call_timeout_ms_max` | 512, 60000 | see [`TransformsConfig`] |
/// | `[net]` `max_udp_payload_bytes` | 65488 | upper bound of QUIC path MTU discovery, see [`NetConfig`] |
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    pub id: i32,
    pub listen: SocketAddr,
    pub advertised_addr: Option<String>,
    pub kafka_listen: Option<SocketAddr>,
    pub kafka_advertised_addr: Option<String>,
    pub kafka: KafkaConfig,
    pub data_dir: PathBuf,
    pub tls: TlsConfig,
    pub auth: AuthConfig,
    pub rill_home: Option<PathBuf>,
    pub metrics: Option<SocketAddr>,
    pub console: Option<SocketAddr>,
    pub console_allow_remote: bool,
    pub auto_create_topics: bool,
    pub num_partitions: u32,
    pub default_replication_factor: u16,
    pub max_request_bytes: u32,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub max_streams_per_connection: u32,
    pub max_inflight_produce_bytes: usize,
    pub tail_cache_bytes: usize,
    pub max_inflight_request_bytes: u64,
    pub retention_check_interval_ms: u64,
    pub flush_check_interval_ms: u64,
    pub topic_defaults: BTreeMap<String, String>,
    pub shutdown_timeout_ms: u64,
    pub object_store: Option<ObjectStoreConfig>,
    pub offsets_topic_num_partitions: u32,
    pub offsets_topic_replication_factor: u16,
    pub transaction_state_num_partitions: u32,
    pub transaction_state_replication_factor: u16,
    pub group_min_session_timeout_ms: u32,
    pub group_max_session_timeout_ms: u32,
    pub group_max_size: usize,
    pub group_initial_rebalance_delay_ms: u32,
    pub group_consumer_session_timeout_ms: u32,
    pub group_consumer_heartbeat_interval_ms: u32,
    pub join: Option<String>,
    pub peers: Vec<String>,
    pub broker_session_timeout_ms: u64,
    pub broker_heartbeat_interval_ms: u64,
    pub replica_lag_time_max_ms: u64,
    pub leader_imbalance_check_interval_ms: u64,
    /// Free space kept on the data disk: below it records are refused (see
    /// [`crate::disk`]); unset: 5% of the filesystem, at most 256 MiB; 0: off.
    pub min_free_bytes: Option<u64>,
    pub transforms: TransformsConfig,
    pub net: NetConfig,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            id: 0,
            listen: SocketAddr::from(([127, 0, 0, 1], rill_proto::wire::DEFAULT_PORT)),
            advertised_addr: None,
            kafka_listen: None,
            kafka_advertised_addr: None,
            kafka: KafkaConfig::default(),
            data_dir: PathBuf::from("./rill-data"),
            tls: TlsConfig::default(),
            auth: AuthConfig::default(),
            rill_home: None,
            metrics: None,
            console: None,
            console_allow_remote: false,
            auto_create_topics: false,
            num_partitions: 1,
            default_replication_factor: 1,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_connections: 1024,
            max_connections_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
            max_streams_per_connection: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            max_inflight_produce_bytes: DEFAULT_MAX_INFLIGHT_PRODUCE_BYTES,
            tail_cache_bytes: DEFAULT_TAIL_CACHE_BYTES,
            max_inflight_request_bytes: DEFAULT_MAX_INFLIGHT_REQUEST_BYTES,
            retention_check_interval_ms: 300_000,
            flush_check_interval_ms: 1000,
            topic_defaults: BTreeMap::new(),
            shutdown_timeout_ms: 10_000,
            object_store: None,
            offsets_topic_num_partitions: 8,
            offsets_topic_replication_factor: 3,
            transaction_state_num_partitions: 8,
            transaction_state_replication_factor: 3,
            group_min_session_timeout_ms: 1000,
            group_max_session_timeout_ms: 30 * 60 * 1000,
            group_max_size: 1000,
            group_initial_rebalance_delay_ms: 3000,
            group_consumer_session_timeout_ms: 45_000,
            group_consumer_heartbeat_interval_ms: 5_000,
            join: None,
            peers: Vec::new(),
            broker_session_timeout_ms: 1500,
            broker_heartbeat_interval_ms: 250,
            replica_lag_time_max_ms: 10_000,
            leader_imbalance_check_interval_ms: 300_000,
            min_free_bytes: None,
            transforms: TransformsConfig::default(),
            net: NetConfig::default(),
        }
    }
}

impl BrokerConfig {
    /// Reads and validates a TOML config file. Errors name the file and the key
    /// at fault (with its line).
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<BrokerConfig, BrokerError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| BrokerError::ConfigRead {
            path: path.to_path_buf(),
            source,
        })?;
        let config =
            BrokerConfig::from_toml_str(&text).map_err(|reason| BrokerError::ConfigParse {
                path: path.to_path_buf(),
                reason,
            })?;
        config.validate().map_err(|e| match e {
            BrokerError::ConfigInvalid { key, reason } => BrokerError::ConfigParse {
                path: path.to_path_buf(),
                reason: format!("{key}: {reason}"),
            },
            other => other,
        })?;
        Ok(config)
    }

    /// Parses TOML text (no validation beyond types and known keys).
    pub fn from_toml_str(text: &str) -> Result<BrokerConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())
    }

    /// Checks ranges and the topic defaults (each through `LogConfig::set`).
    pub fn validate(&self) -> Result<(), BrokerError> {
        let bad = |key: &str, reason: String| BrokerError::ConfigInvalid {
            key: key.to_string(),
            reason,
        };
        if self.id < 0 {
            return Err(bad("id", format!("must be >= 0, got {}", self.id)));
        }
        if self.num_partitions == 0 || self.num_partitions > PARTITIONS_PER_TOPIC_MAX {
            return Err(bad(
                "num_partitions",
                format!(
                    "must be in 1..={PARTITIONS_PER_TOPIC_MAX}, got {}",
                    self.num_partitions
                ),
            ));
        }
        if self.default_replication_factor == 0 {
            return Err(bad("default_replication_factor", "must be >= 1".into()));
        }
        let payload = self.net.max_udp_payload_bytes;
        if !(rill_net::UDP_PAYLOAD_MIN..=rill_net::UDP_PAYLOAD_MAX).contains(&payload) {
            return Err(bad(
                "net.max_udp_payload_bytes",
                format!(
                    "must be in {}..={} (UDP payload bytes; 8952 for a 9000-byte MTU), got {payload}",
                    rill_net::UDP_PAYLOAD_MIN,
                    rill_net::UDP_PAYLOAD_MAX
                ),
            ));
        }
        if self.max_request_bytes < MAX_REQUEST_BYTES_MIN {
            return Err(bad(
                "max_request_bytes",
                format!(
                    "must be >= {MAX_REQUEST_BYTES_MIN}, got {}",
                    self.max_request_bytes
                ),
            ));
        }
        if self.max_connections == 0 {
            return Err(bad("max_connections", "must be >= 1".into()));
        }
        if self.max_streams_per_connection == 0 {
            return Err(bad("max_streams_per_connection", "must be >= 1".into()));
        }
        if self.max_inflight_produce_bytes == 0 {
            return Err(bad("max_inflight_produce_bytes", "must be >= 1".into()));
        }
        if self.max_connections_per_ip == 0 {
            return Err(bad("max_connections_per_ip", "must be >= 1".into()));
        }
        self.validate_request_budget()
            .map_err(|r| bad("max_inflight_request_bytes", r))?;
        self.validate_transforms()?;
        for (key, value) in [
            (
                "retention_check_interval_ms",
                self.retention_check_interval_ms,
            ),
            ("flush_check_interval_ms", self.flush_check_interval_ms),
        ] {
            if value == 0 {
                return Err(bad(key, "must be >= 1".into()));
            }
        }
        if self.offsets_topic_num_partitions == 0
            || self.offsets_topic_num_partitions > PARTITIONS_PER_TOPIC_MAX
        {
            return Err(bad(
                "offsets_topic_num_partitions",
                format!(
                    "must be in 1..={PARTITIONS_PER_TOPIC_MAX}, got {}",
                    self.offsets_topic_num_partitions
                ),
            ));
        }
        if self.transaction_state_num_partitions == 0
            || self.transaction_state_num_partitions > PARTITIONS_PER_TOPIC_MAX
        {
            return Err(bad(
                "transaction_state_num_partitions",
                format!(
                    "must be in 1..={PARTITIONS_PER_TOPIC_MAX}, got {}",
                    self.transaction_state_num_partitions
                ),
            ));
        }
        if self.transaction_state_replication_factor == 0 {
            return Err(bad(
                "transaction_state_replication_factor",
                "must be >= 1".into(),
            ));
        }
        if self.offsets_topic_replication_factor == 0 {
            return Err(bad(
                "offsets_topic_replication_factor",
                "must be >= 1".into(),
            ));
        }
        if self.group_min_session_timeout_ms == 0
            || self.group_min_session_timeout_ms > self.group_max_session_timeout_ms
        {
            return Err(bad(
                "group_min_session_timeout_ms",
                format!(
                    "must be >= 1 and <= group_max_session_timeout_ms ({}), got {}",
                    self.group_max_session_timeout_ms, self.group_min_session_timeout_ms
                ),
            ));
        }
        if self.group_max_size == 0 {
            return Err(bad("group_max_size", "must be >= 1".into()));
        }
        if !(self.group_min_session_timeout_ms..=self.group_max_session_timeout_ms)
            .contains(&self.group_consumer_session_timeout_ms)
        {
            return Err(bad(
                "group_consumer_session_timeout_ms",
                format!(
                    "must be within group_min_session_timeout_ms..=group_max_session_timeout_ms \
                     ({}..={}), got {}",
                    self.group_min_session_timeout_ms,
                    self.group_max_session_timeout_ms,
                    self.group_consumer_session_timeout_ms
                ),
            ));
        }
        if self.group_consumer_heartbeat_interval_ms == 0
            || self.group_consumer_heartbeat_interval_ms >= self.group_consumer_session_timeout_ms
        {
            return Err(bad(
                "group_consumer_heartbeat_interval_ms",
                format!(
                    "must be >= 1 and below group_consumer_session_timeout_ms ({}), got {}",
                    self.group_consumer_session_timeout_ms,
                    self.group_consumer_heartbeat_interval_ms
                ),
            ));
        }
        if self.group_initial_rebalance_delay_ms > 300_000 {
            return Err(bad(
                "group_initial_rebalance_delay_ms",
                format!(
                    "must be at most 300000 (5 minutes), got {}",
                    self.group_initial_rebalance_delay_ms
                ),
            ));
        }
        if self.tls.cert.is_some() != self.tls.key.is_some() {
            return Err(bad(
                "tls",
                "set both `cert` and `key`, or neither (to use the development CA)".into(),
            ));
        }
        if self.tls.ca.is_some() && self.tls.cert.is_none() {
            return Err(bad(
                "tls.ca",
                "client certificate verification needs `cert` and `key` too".into(),
            ));
        }
        for name in &self.auth.super_users {
            if let Err(e) = rill_net::identity::check_principal_name(name) {
                return Err(bad("auth.super_users", e.to_string()));
            }
        }
        if self.auth.mode == AuthMode::Mtls && self.tls.cert.is_some() && self.tls.ca.is_none() {
            return Err(bad(
                "tls.ca",
                "auth mode mtls with certificate files needs `ca`: the CA that signs client certificates".into(),
            ));
        }
        if self.auth.mode == AuthMode::None
            && !self.auth.allow_anonymous
            && !self.listen.ip().is_loopback()
        {
            return Err(bad(
                "listen",
                format!(
                    "{} is not a loopback address and auth mode is none: anyone who can reach it could \
                     read, write and delete every topic; use --auth mtls (config [auth] mode = \"mtls\"), \
                     or pass --allow-anonymous ([auth] allow_anonymous = true) to accept that",
                    self.listen
                ),
            ));
        }
        if let Some(addr) = &self.kafka_advertised_addr {
            crate::cluster::command_checks::check_broker_addr(addr).map_err(|why| {
                bad(
                    "kafka_advertised_addr",
                    format!(
                        "{addr:?} is not an address Kafka clients can be told: {why}; set it to \
                         HOST:PORT, e.g. broker1.example.com:9093"
                    ),
                )
            })?;
        }
        if let Some(kafka) = self.kafka_listen {
            if let Some(m) = self
                .kafka
                .sasl_mechanisms
                .iter()
                .find(|m| !KAFKA_SASL_MECHANISMS.contains(&m.as_str()))
            {
                return Err(bad(
                    "kafka.sasl_mechanisms",
                    format!(
                        "{m:?} is not a SASL mechanism this broker offers; use any of {}",
                        KAFKA_SASL_MECHANISMS.join(", ")
                    ),
                ));
            }
            if self.auth.mode == AuthMode::Mtls
                && !self.kafka.tls
                && self.kafka.sasl_mechanisms.is_empty()
            {
                return Err(bad(
                    "kafka_listen",
                    format!(
                        "with auth mode mtls the Kafka listener ({kafka}) must tell who a client \
                         is: set [kafka] tls = true (--kafka-tls, client certificates) and/or \
                         [kafka] sasl_mechanisms (--kafka-sasl, users from `rill user add`), or \
                         unset kafka_listen"
                    ),
                ));
            }
            if self.auth.mode == AuthMode::None
                && !self.auth.allow_anonymous
                && !kafka.ip().is_loopback()
            {
                return Err(bad(
                    "kafka_listen",
                    format!(
                        "{kafka} is not a loopback address and auth mode is none: anyone who can \
                         reach it could read, write and delete every topic; pass --allow-anonymous \
                         ([auth] allow_anonymous = true) to accept that"
                    ),
                ));
            }
        }
        // Without auth the console acts with the broker's own rights for
        // whoever reaches it; with auth it signs users in with bearer tokens,
        // over plain HTTP. Off loopback either must be asked for.
        if let Some(console) = self.console
            && !self.console_allow_remote
            && !console.ip().is_loopback()
        {
            let why = if self.auth.mode == AuthMode::None {
                "auth mode is none: anyone who can reach it could read every topic and pause \
                 transforms through the console"
            } else {
                "the console serves plain HTTP, so its users' sign-in tokens would cross the \
                 network unencrypted (put a TLS proxy in front of it)"
            };
            return Err(bad(
                "console",
                format!(
                    "{console} is not a loopback address and {why}; listen on 127.0.0.1 (and \
                     tunnel to it), or pass --console-allow-remote (console_allow_remote = true) \
                     to accept that"
                ),
            ));
        }
        if let Some(os) = &self.object_store {
            if os.url.trim().is_empty() {
                return Err(bad(
                    "object_store.url",
                    "must name the object store (file:///path, s3://bucket/prefix, gs://..., az://...); \
                     remove [object_store] to run without tiered storage"
                        .into(),
                ));
            }
            for (key, value) in [
                ("object_store.cache_bytes", os.cache_bytes),
                ("object_store.upload_interval_ms", os.upload_interval_ms),
                ("object_store.fetch_timeout_ms", os.fetch_timeout_ms),
            ] {
                if value == 0 {
                    return Err(bad(key, "must be >= 1".into()));
                }
            }
        }
        for (key, value) in [
            ("broker_session_timeout_ms", self.broker_session_timeout_ms),
            (
                "broker_heartbeat_interval_ms",
                self.broker_heartbeat_interval_ms,
            ),
            ("replica_lag_time_max_ms", self.replica_lag_time_max_ms),
        ] {
            if value == 0 {
                return Err(bad(key, "must be >= 1".into()));
            }
        }
        if self.broker_heartbeat_interval_ms >= self.broker_session_timeout_ms {
            return Err(bad(
                "broker_heartbeat_interval_ms",
                "must be below broker_session_timeout_ms".into(),
            ));
        }
        if self.join.is_some() && !self.peers.is_empty() {
            return Err(bad("join", "set `join` or `peers`, not both".into()));
        }
        for p in &self.peers {
            crate::cluster::parse_peer(p).map_err(|r| bad("peers", r))?;
        }
        if !self.peers.is_empty()
            && !self
                .peers
                .iter()
                .any(|p| crate::cluster::parse_peer(p).is_ok_and(|(id, _)| id == self.id))
        {
            return Err(bad(
                "peers",
                format!("must list this broker's own id {} too", self.id),
            ));
        }
        self.topic_log_defaults()?;
        Ok(())
    }

    /// The request memory budget must hold the largest request a client may
    /// send (`max_request_bytes`) beside the lane kept for small requests.
    fn validate_request_budget(&self) -> Result<(), String> {
        let total = self.max_inflight_request_bytes;
        if total > MAX_INFLIGHT_REQUEST_BYTES_MAX {
            return Err(format!(
                "must be at most {MAX_INFLIGHT_REQUEST_BYTES_MAX} (64 GiB), got {total}"
            ));
        }
        let large = crate::limits::large_lane_bytes(total);
        if large < u64::from(self.max_request_bytes) {
            return Err(format!(
                "{total} bytes cannot hold one request of max_request_bytes={} beside the 1/8 \
                 (at most {} bytes) kept for small requests: raise max_inflight_request_bytes to at \
                 least {} or lower max_request_bytes",
                self.max_request_bytes,
                crate::limits::SMALL_LANE_BYTES_MAX,
                min_request_budget(self.max_request_bytes)
            ));
        }
        Ok(())
    }

    fn validate_transforms(&self) -> Result<(), BrokerError> {
        let t = &self.transforms;
        if t.memory_mb_max == 0 || t.memory_mb_max > TRANSFORMS_MEMORY_MB_MAX_CEILING {
            return Err(BrokerError::ConfigInvalid {
                key: "transforms.memory_mb_max".into(),
                reason: format!(
                    "must be in 1..={TRANSFORMS_MEMORY_MB_MAX_CEILING} (MiB), got {}",
                    t.memory_mb_max
                ),
            });
        }
        if t.call_timeout_ms_max == 0
            || t.call_timeout_ms_max > TRANSFORMS_CALL_TIMEOUT_MS_MAX_CEILING
        {
            return Err(BrokerError::ConfigInvalid {
                key: "transforms.call_timeout_ms_max".into(),
                reason: format!(
                    "must be in 1..={TRANSFORMS_CALL_TIMEOUT_MS_MAX_CEILING} (ms), got {}",
                    t.call_timeout_ms_max
                ),
            });
        }
        Ok(())
    }

    /// The log config every topic starts from: Kafka's defaults with
    /// `topic_defaults` applied.
    pub fn topic_log_defaults(&self) -> Result<LogConfig, BrokerError> {
        let mut config = LogConfig::default();
        for (key, value) in &self.topic_defaults {
            config
                .set(key, value)
                .map_err(|e| BrokerError::ConfigInvalid {
                    key: format!("topic_defaults.\"{key}\""),
                    reason: e.to_string(),
                })?;
        }
        Ok(config)
    }

    /// The address clients are told to use.
    pub fn advertised(&self, bound: SocketAddr) -> String {
        self.advertised_addr
            .clone()
            .unwrap_or_else(|| bound.to_string())
    }

    /// The Kafka listener's address as the broker registers it in the
    /// metadata image (so every broker's Kafka listener can name it):
    /// `kafka_advertised_addr`, else `kafka_listen` unless its port is 0 (the
    /// port is chosen at bind, after registration; such a listener names only
    /// itself).
    pub fn kafka_registered_addr(&self) -> Option<String> {
        match (&self.kafka_advertised_addr, self.kafka_listen) {
            (Some(a), _) => Some(a.clone()),
            (None, Some(l)) if l.port() != 0 => Some(l.to_string()),
            _ => None,
        }
    }
}

/// The smallest `max_inflight_request_bytes` that holds a request of
/// `max_request_bytes` beside the small-request lane.
pub fn min_request_budget(max_request_bytes: u32) -> u64 {
    let m = u64::from(max_request_bytes);
    // large_lane_bytes is nondecreasing: the smallest total whose large lane holds m.
    let (mut lo, mut hi) = (m, m + m / 7 + crate::limits::SMALL_LANE_BYTES_MAX + 8);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if crate::limits::large_lane_bytes(mid) >= m {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_full_file_parse() {
        let c = BrokerConfig::from_toml_str("").unwrap();
        assert_eq!(c, BrokerConfig::default());
        let text = include_str!("../rill.example.toml");
        let c = BrokerConfig::from_toml_str(text).unwrap();
        c.validate().unwrap();
        assert_eq!(
            c.topic_defaults.get("retention.ms").map(String::as_str),
            Some("604800000")
        );
    }

    #[test]
    fn console_needs_loopback_or_allow_remote() {
        let c = BrokerConfig::from_toml_str("console = \"127.0.0.1:9644\"\n").unwrap();
        c.validate().unwrap();
        let c = BrokerConfig::from_toml_str("console = \"0.0.0.0:9644\"\n").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("console") && e.contains("--console-allow-remote"),
            "{e}"
        );
        let c = BrokerConfig::from_toml_str(
            "console = \"0.0.0.0:9644\"\nconsole_allow_remote = true\n",
        )
        .unwrap();
        c.validate().unwrap();
        // Auth on: users sign in with tokens, which plain HTTP would expose.
        let c =
            BrokerConfig::from_toml_str("console = \"0.0.0.0:9644\"\n[auth]\nmode = \"mtls\"\n")
                .unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("unencrypted"), "{e}");
        let c = BrokerConfig::from_toml_str(
            "console = \"0.0.0.0:9644\"\nconsole_allow_remote = true\n[auth]\nmode = \"mtls\"\n",
        )
        .unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn kafka_listener_needs_loopback_or_allow_anonymous_and_no_mtls() {
        let c = BrokerConfig::from_toml_str("kafka_listen = \"127.0.0.1:9093\"\n").unwrap();
        c.validate().unwrap();
        let c = BrokerConfig::from_toml_str("kafka_listen = \"0.0.0.0:9093\"\n").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("kafka_listen") && e.contains("allow-anonymous"),
            "{e}"
        );
        let c = BrokerConfig::from_toml_str(
            "kafka_listen = \"127.0.0.1:9093\"\n[auth]\nmode = \"mtls\"\n",
        )
        .unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("kafka_listen") && e.contains("tls = true"),
            "{e}"
        );
        let c = BrokerConfig::from_toml_str(
            "kafka_listen = \"127.0.0.1:9093\"\n[auth]\nmode = \"mtls\"\n[kafka]\ntls = true\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert!(c.kafka.tls);
    }

    #[test]
    fn kip848_member_timeouts_are_checked_against_the_group_bounds() {
        let c = BrokerConfig::default();
        assert_eq!(
            (
                c.group_consumer_session_timeout_ms,
                c.group_consumer_heartbeat_interval_ms
            ),
            (45_000, 5_000)
        );
        let c = BrokerConfig::from_toml_str("group_consumer_session_timeout_ms = 500\n").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("group_consumer_session_timeout_ms") && e.contains("500"),
            "{e}"
        );
        let c = BrokerConfig::from_toml_str(
            "group_consumer_session_timeout_ms = 6000\ngroup_consumer_heartbeat_interval_ms = 6000\n",
        )
        .unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("group_consumer_heartbeat_interval_ms"), "{e}");
        let c = BrokerConfig::from_toml_str(
            "group_consumer_session_timeout_ms = 6000\ngroup_consumer_heartbeat_interval_ms = 500\n",
        )
        .unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn the_kafka_address_a_broker_registers_is_checked_and_never_port_0() {
        let c = BrokerConfig::from_toml_str("kafka_listen = \"127.0.0.1:9093\"\n").unwrap();
        assert_eq!(c.kafka_registered_addr().as_deref(), Some("127.0.0.1:9093"));
        let c = BrokerConfig::from_toml_str("kafka_listen = \"127.0.0.1:0\"\n").unwrap();
        assert_eq!(c.kafka_registered_addr(), None);
        let c = BrokerConfig::from_toml_str(
            "kafka_listen = \"127.0.0.1:0\"\nkafka_advertised_addr = \"b1.example.com:9093\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(
            c.kafka_registered_addr().as_deref(),
            Some("b1.example.com:9093")
        );
        let c = BrokerConfig::from_toml_str(
            "kafka_listen = \"127.0.0.1:9093\"\nkafka_advertised_addr = \"b1 example:9093\"\n",
        )
        .unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("kafka_advertised_addr") && e.contains("b1 example"),
            "{e}"
        );
        assert_eq!(BrokerConfig::default().kafka_registered_addr(), None);
    }

    #[test]
    fn object_store_section() {
        let c = BrokerConfig::from_toml_str(
            "[object_store]\nurl = \"s3://b/p\"\nfetch_timeout_ms = 5000\n",
        )
        .unwrap();
        let os = c.object_store.clone().unwrap();
        assert_eq!(os.url, "s3://b/p");
        assert_eq!(os.fetch_timeout_ms, 5000);
        assert_eq!(os.upload_interval_ms, DEFAULT_UPLOAD_INTERVAL_MS);
        c.validate().unwrap();
        let c =
            BrokerConfig::from_toml_str("[object_store]\ncache_bytes = 0\nurl = \"x\"\n").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("object_store.cache_bytes"), "{e}");
        let e = BrokerConfig::from_toml_str("[object_store]\nulr = \"x\"\n").unwrap_err();
        assert!(e.contains("ulr"), "{e}");
    }

    #[test]
    fn request_budget_and_connection_keys_are_validated() {
        let c = BrokerConfig::from_toml_str(
            "max_inflight_request_bytes = 1048576\nmax_request_bytes = 917504\nmax_connections_per_ip = 2\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.max_connections_per_ip, 2);
        let c = BrokerConfig {
            max_inflight_request_bytes: 64 << 20,
            ..BrokerConfig::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("max_inflight_request_bytes"), "{e}");
        assert!(e.contains("max_request_bytes=67108864"), "{e}");
        let min = min_request_budget(DEFAULT_MAX_REQUEST_BYTES);
        let ok = BrokerConfig {
            max_inflight_request_bytes: min,
            ..BrokerConfig::default()
        };
        ok.validate().unwrap();
        let below = BrokerConfig {
            max_inflight_request_bytes: min - 1,
            ..BrokerConfig::default()
        };
        assert!(below.validate().is_err());
        for max in [1024u32, 1 << 20, u32::MAX] {
            let min = min_request_budget(max);
            assert!(
                crate::limits::large_lane_bytes(min) >= u64::from(max),
                "{max}"
            );
            assert!(
                crate::limits::large_lane_bytes(min - 1) < u64::from(max),
                "{max}"
            );
        }
        let e = BrokerConfig {
            max_connections_per_ip: 0,
            ..BrokerConfig::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("max_connections_per_ip"), "{e}");
    }

    #[test]
    fn the_tail_cache_is_sized_or_switched_off_by_config() {
        assert_eq!(
            BrokerConfig::default().tail_cache_bytes,
            DEFAULT_TAIL_CACHE_BYTES
        );
        let c = BrokerConfig::from_toml_str("tail_cache_bytes = 67108864\n").unwrap();
        c.validate().unwrap();
        assert_eq!(c.tail_cache_bytes, 64 << 20);
        let e = BrokerConfig::from_toml_str("tail_cache_bytes = -1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tail_cache_bytes"), "{e}");
    }

    #[test]
    fn transform_maxima_are_read_and_bounded() {
        let c = BrokerConfig::from_toml_str(
            "[transforms]\nmemory_mb_max = 128\ncall_timeout_ms_max = 5000\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.transforms.memory_mb_max, 128);
        assert_eq!(c.transforms.call_timeout_ms_max, 5000);
        let c = BrokerConfig::from_toml_str("[transforms]\nmemory_mb_max = 5000\n").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("transforms.memory_mb_max"), "{e}");
        let c = BrokerConfig::from_toml_str("[transforms]\ncall_timeout_ms_max = 0\n").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("transforms.call_timeout_ms_max"), "{e}");
    }

    #[test]
    fn unknown_key_and_bad_type_are_named() {
        let e = BrokerConfig::from_toml_str("lisen = \"127.0.0.1:1\"").unwrap_err();
        assert!(e.contains("lisen"), "{e}");
        let e = BrokerConfig::from_toml_str("num_partitions = \"three\"").unwrap_err();
        assert!(e.contains("num_partitions"), "{e}");
    }

    #[test]
    fn file_errors_name_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rill.toml");
        std::fs::write(&path, "[topic_defaults]\n\"retention.ms\" = \"soon\"\n").unwrap();
        let e = BrokerConfig::from_toml_file(&path).unwrap_err().to_string();
        assert!(e.contains("rill.toml") && e.contains("retention.ms"), "{e}");
        std::fs::write(&path, "max_conections = 3\n").unwrap();
        let e = BrokerConfig::from_toml_file(&path).unwrap_err().to_string();
        assert!(
            e.contains("rill.toml") && e.contains("max_conections"),
            "{e}"
        );
        let e = BrokerConfig::from_toml_file(dir.path().join("missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.toml"), "{e}");
    }
}
