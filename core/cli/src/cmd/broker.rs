//! `rill broker`: run one broker in the foreground.
//!
//! Config: the TOML file from `--config` (if any), then each flag given overrides
//! its key. With no arguments: listen on 127.0.0.1:9092, data in ./rill-data, TLS
//! from the development CA under $RILL_HOME (created on first start).
//!
//! Output contract (tests and scripts parse it): once the endpoint is bound, ONE
//! line on stdout, `rill broker <id> listening on <actual addr> (data: <dir>)`,
//! flushed immediately. The process then runs until SIGTERM or Ctrl-C, shuts the
//! broker down cleanly (in-flight requests answered, logs flushed and closed) and
//! exits 0.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use rill_broker::{Broker, BrokerConfig, BrokerError};

#[derive(Debug, Args)]
pub struct BrokerArgs {
    /// Broker config file (TOML); flags override its keys.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Broker id (unique in the cluster).
    #[arg(long, value_name = "N")]
    pub id: Option<i32>,
    /// Address to listen on (UDP); port 0 picks a free port.
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<SocketAddr>,
    /// Data directory (partitions, metadata).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Address clients are told to connect to (default: the listen address).
    #[arg(long, value_name = "HOST:PORT")]
    pub advertised_addr: Option<String>,
    /// Serve the Kafka protocol (TCP) on this address too, for Kafka clients
    /// and tools (off when unset).
    #[arg(long, value_name = "HOST:PORT")]
    pub kafka_listen: Option<SocketAddr>,
    /// Address Kafka clients are told to connect to (default: --kafka-listen).
    #[arg(long, value_name = "HOST:PORT", requires = "kafka_listen")]
    pub kafka_advertised_addr: Option<String>,
    /// The Kafka listener speaks TLS (clients use security.protocol=SSL and
    /// trust the broker's CA; a client certificate names the principal).
    #[arg(long, requires = "kafka_listen")]
    pub kafka_tls: bool,
    /// SASL mechanisms the Kafka listener offers (PLAIN, SCRAM-SHA-256,
    /// SCRAM-SHA-512; comma-separated or repeated); users come from
    /// `rill user add`.
    #[arg(
        long,
        value_name = "MECHANISM",
        value_delimiter = ',',
        requires = "kafka_listen"
    )]
    pub kafka_sasl: Vec<String>,
    /// Broker certificate chain (PEM); default: issued by the development CA.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Broker private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that client certificates must chain to (mutual TLS).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Client authentication: none (clients are anonymous; only loopback
    /// listeners unless --allow-anonymous) or mtls (client certificates from the
    /// CA required; the certificate's common name is the principal; ACLs decide).
    #[arg(long, value_name = "MODE")]
    pub auth: Option<rill_broker::config::AuthMode>,
    /// A principal allowed everything with --auth mtls (repeatable).
    #[arg(long = "super-user", value_name = "NAME")]
    pub super_users: Vec<String>,
    /// Let a broker with --auth none listen on a non-loopback address.
    #[arg(long)]
    pub allow_anonymous: bool,
    /// Serve Prometheus metrics over HTTP on this address.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<SocketAddr>,
    /// Serve the web console over HTTP on this address (TCP; loopback only
    /// unless --console-allow-remote). With --auth mtls its users sign in
    /// with tokens from `rill token issue` and act under the ACLs.
    #[arg(long, value_name = "HOST:PORT")]
    pub console: Option<SocketAddr>,
    /// Let the console listen on a non-loopback address (it serves plain
    /// HTTP: with --auth none anyone who reaches it acts with the broker's
    /// rights; with --auth mtls sign-in tokens cross the network unencrypted).
    #[arg(long, requires = "console")]
    pub console_allow_remote: bool,
    /// Create a topic (with broker defaults) when a client first produces to it.
    #[arg(long)]
    pub auto_create_topics: bool,
    /// Join the cluster of the broker at HOST:PORT (this broker becomes a voter).
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "peers")]
    pub join: Option<String>,
    /// Fixed voter list of the cluster, this broker included: ID@HOST:PORT,...
    #[arg(long, value_name = "ID@HOST:PORT,...", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// Fence a broker that has not heartbeated for this long (ms).
    #[arg(long, value_name = "MS")]
    pub session_timeout_ms: Option<u64>,
    /// Do not run WebAssembly transforms in this broker process (by default its
    /// transform supervisor runs deployed transforms; see `rill transform`).
    #[arg(long)]
    pub no_transforms: bool,
    /// Tiered storage: the object store that closed segments of topics with
    /// remote.storage.enable=true go to (file:///path, s3://bucket/prefix,
    /// gs://bucket/prefix, az://container/prefix; credentials, region and endpoint
    /// from AWS_* / GOOGLE_* / AZURE_* environment variables). Unset: tiering off.
    #[arg(long, value_name = "URL")]
    pub object_store: Option<String>,
    /// Free space kept on the data disk: below it records are refused with
    /// STORAGE_ERROR (the metadata quorum and internal topics keep writing, so
    /// `rill topic delete` frees space); default 5% of the disk, at most 256
    /// MiB; 0 turns it off.
    #[arg(long, value_name = "BYTES")]
    pub min_free_bytes: Option<u64>,
    /// Largest UDP payload QUIC path MTU discovery may reach, for clients and
    /// the other brokers (`[net] max_udp_payload_bytes`; default 65488,
    /// loopback's: discovery stops at what the path carries, 1452 on Ethernet,
    /// 8952 on jumbo frames).
    #[arg(long, value_name = "BYTES")]
    pub max_udp_payload_bytes: Option<u16>,
}

/// Builds the broker config: file (or defaults), then flags.
pub fn build_config(args: &BrokerArgs) -> anyhow::Result<BrokerConfig> {
    let mut config = match &args.config {
        Some(path) => BrokerConfig::from_toml_file(path).map_err(|e| match e {
            BrokerError::ConfigParse { path, reason } => anyhow::anyhow!(
                "invalid broker config file {}: {}. Fix or remove the key (core/broker/rill.example.toml documents every key)",
                path.display(),
                tidy_toml_error(&reason)
            ),
            other => other.into(),
        })?,
        None => BrokerConfig::default(),
    };
    if let Some(id) = args.id {
        config.id = id;
    }
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(data) = &args.data {
        config.data_dir = data.clone();
    }
    if let Some(advertised) = &args.advertised_addr {
        config.advertised_addr = Some(advertised.clone());
    }
    if let Some(kafka) = args.kafka_listen {
        config.kafka_listen = Some(kafka);
    }
    if let Some(advertised) = &args.kafka_advertised_addr {
        config.kafka_advertised_addr = Some(advertised.clone());
    }
    if args.kafka_tls {
        config.kafka.tls = true;
    }
    if !args.kafka_sasl.is_empty() {
        config.kafka.sasl_mechanisms = args.kafka_sasl.clone();
    }
    if let Some(cert) = &args.tls_cert {
        config.tls.cert = Some(cert.clone());
    }
    if let Some(key) = &args.tls_key {
        config.tls.key = Some(key.clone());
    }
    if let Some(ca) = &args.tls_ca {
        config.tls.ca = Some(ca.clone());
    }
    if let Some(mode) = args.auth {
        config.auth.mode = mode;
    }
    config
        .auth
        .super_users
        .extend(args.super_users.iter().cloned());
    if args.allow_anonymous {
        config.auth.allow_anonymous = true;
    }
    if let Some(metrics) = args.metrics {
        config.metrics = Some(metrics);
    }
    if let Some(console) = args.console {
        config.console = Some(console);
    }
    if args.console_allow_remote {
        config.console_allow_remote = true;
    }
    if args.auto_create_topics {
        config.auto_create_topics = true;
    }
    if let Some(url) = &args.object_store {
        config.object_store = Some(rill_broker::ObjectStoreConfig {
            url: url.clone(),
            ..config.object_store.take().unwrap_or_default()
        });
    }
    if let Some(join) = &args.join {
        config.join = Some(join.clone());
    }
    if !args.peers.is_empty() {
        config.peers = args.peers.clone();
    }
    if let Some(ms) = args.session_timeout_ms {
        config.broker_session_timeout_ms = ms;
        config.broker_heartbeat_interval_ms =
            config.broker_heartbeat_interval_ms.min(ms / 4).max(1);
    }
    if let Some(bytes) = args.min_free_bytes {
        config.min_free_bytes = Some(bytes);
    }
    if let Some(bytes) = args.max_udp_payload_bytes {
        config.net.max_udp_payload_bytes = bytes;
    }
    config.validate()?;
    Ok(config)
}

pub async fn run(args: BrokerArgs) -> anyhow::Result<()> {
    let config = build_config(&args)?;
    let id = config.id;
    let data_dir = config.data_dir.clone();
    // With its own certificate files but no CA for client certificates, the
    // broker cannot tell its own supervisor from a client: the supervisor is then
    // an ordinary client (RILL_TLS_CA), or off.
    let files_without_ca = config.tls.cert.is_some() && config.tls.ca.is_none();
    let transform_maxima = crate::cmd::transform_host::maxima(&config.transforms);
    let console_addr = config.console;
    let auth_on = config.auth.mode != rill_broker::config::AuthMode::None;
    let handle = Broker::start(config)
        .await
        .with_context(|| format!("cannot start broker {id}"))?;

    // The Kafka listener: a second front door to the same broker (its tasks
    // are in the broker's shutdown scope).
    if let Err(e) = rill_kafka::start(handle.front_door()).await {
        let _ = handle.shutdown().await;
        return Err(e).with_context(|| format!("cannot start broker {id}"));
    }

    // The web console reads the cluster through a client of this broker, with
    // the broker's own certificate as the supervisor does (bound before the
    // `listening on` line, so a taken port fails the start).
    let console = match console_addr {
        None => None,
        Some(addr) => {
            let mut target = handle.local_addr();
            if target.ip().is_unspecified() {
                target.set_ip(match target {
                    SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                    SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                });
            }
            let mut client = rill_client::ClientConfig::new(target.to_string());
            client.tls = match files_without_ca {
                true => crate::cmd::transform_host::client_tls_from_env()
                    .unwrap_or_else(|| handle.self_tls()),
                false => handle.self_tls(),
            };
            client.client_id = format!("rill-broker-{id}-console");
            // With auth on, users sign in with tokens signed by the CA that
            // signs client certificates (the one this broker trusts).
            let users = match auth_on {
                false => None,
                true => {
                    let ca = handle.self_tls().ca_path();
                    match rill_console::TokenVerifier::from_ca_file(&ca) {
                        Ok(v) => Some(v),
                        Err(e) => {
                            let _ = handle.shutdown().await;
                            return Err(anyhow::anyhow!("cannot check console tokens: {e}"))
                                .with_context(|| format!("cannot start broker {id}"));
                        }
                    }
                }
            };
            match rill_console::start(addr, client, users).await {
                Ok(c) => {
                    tracing::info!("console on http://{}", c.local_addr());
                    Some(c)
                }
                Err(e) => {
                    let _ = handle.shutdown().await;
                    return Err(anyhow::anyhow!("cannot serve the console on {addr}: {e}"))
                        .with_context(|| format!("cannot start broker {id}"));
                }
            }
        }
    };

    // The handlers are in place before the line that tells a supervisor it
    // may signal us: a SIGTERM right after it still shuts down cleanly.
    let shutdown_signal = ShutdownSignal::install()?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "rill broker {id} listening on {} (data: {})",
            handle.local_addr(),
            data_dir.display()
        )
        .and_then(|()| stdout.flush())
        .context("cannot write the `listening on` line to stdout")?;
    }

    // The supervisor connects as this broker (its broker certificate), so it may
    // write the transform topics whatever the auth mode.
    let transform_tls = if files_without_ca {
        crate::cmd::transform_host::client_tls_from_env()
    } else {
        Some(handle.self_tls())
    };
    let transforms = match (args.no_transforms, transform_tls) {
        (true, _) => None,
        (false, Some(tls)) => Some(crate::cmd::transform_host::start(
            id,
            handle.local_addr(),
            tls,
            transform_maxima,
        )),
        (false, None) => {
            tracing::warn!(
                "transforms are off in this broker: with its own TLS certificate set RILL_TLS_CA (or use `rill transform run`)"
            );
            None
        }
    };

    let signal = shutdown_signal.wait().await;
    tracing::info!("{signal} received: shutting down broker {id}");
    if let Some(c) = console {
        c.stop().await;
    }
    if let Some(t) = transforms {
        t.stop().await;
    }
    handle
        .shutdown()
        .await
        .with_context(|| format!("broker {id} did not shut down cleanly"))?;
    tracing::info!("broker {id} stopped");
    Ok(())
}

/// SIGTERM and Ctrl-C (SIGINT), caught from when it is installed.
struct ShutdownSignal {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignal {
    fn install() -> anyhow::Result<ShutdownSignal> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(ShutdownSignal {
            term: signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("cannot install the Ctrl-C handler")?,
        })
    }

    /// Waits for either; returns which one came.
    async fn wait(mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "Ctrl-C",
        }
    }
}

/// Folds a multi-line `toml` error (location, source snippet with carets,
/// message) into `line L, column C: message`, dropping the snippet.
pub fn tidy_toml_error(reason: &str) -> String {
    let Some(first) = reason.lines().next() else {
        return reason.to_string();
    };
    let Some(location) = first.strip_prefix("TOML parse error at ") else {
        return reason.to_string();
    };
    let is_snippet = |line: &str| {
        let t = line.trim_start();
        t.starts_with('|')
            || t.split_once(" |")
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let message: Vec<&str> = reason
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty() && !is_snippet(l))
        .map(str::trim)
        .collect();
    format!("{location}: {}", message.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_errors_fold_to_location_and_message() {
        let reason = "TOML parse error at line 2, column 1\n  |\n2 | lisen = \"x\"\n  | ^^^^^\nunknown field `lisen`, expected one of `id`, `listen`";
        assert_eq!(
            tidy_toml_error(reason),
            "line 2, column 1: unknown field `lisen`, expected one of `id`, `listen`"
        );
        assert_eq!(tidy_toml_error("plain reason"), "plain reason");
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rill.toml");
        std::fs::write(
            &path,
            "id = 3\nlisten = \"127.0.0.1:9999\"\nnum_partitions = 4\n",
        )
        .unwrap();
        let args = BrokerArgs {
            config: Some(path),
            id: None,
            listen: Some("127.0.0.1:0".parse().unwrap()),
            data: Some("/tmp/x".into()),
            advertised_addr: None,
            kafka_listen: None,
            kafka_advertised_addr: None,
            kafka_tls: false,
            kafka_sasl: Vec::new(),
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            auth: None,
            super_users: Vec::new(),
            allow_anonymous: false,
            metrics: None,
            console: None,
            console_allow_remote: false,
            auto_create_topics: true,
            join: None,
            peers: Vec::new(),
            session_timeout_ms: None,
            no_transforms: false,
            object_store: None,
            min_free_bytes: None,
            max_udp_payload_bytes: None,
        };
        let config = build_config(&args).unwrap();
        assert_eq!(config.id, 3, "from the file");
        assert_eq!(config.num_partitions, 4, "from the file");
        assert_eq!(config.listen.port(), 0, "flag wins");
        assert!(config.auto_create_topics);
        assert_eq!(config.data_dir, std::path::PathBuf::from("/tmp/x"));
    }
}
