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
use rill_broker::{Broker, BrokerConfig};

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
    /// Broker certificate chain (PEM); default: issued by the development CA.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Broker private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that client certificates must chain to (mutual TLS).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP on this address.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<SocketAddr>,
    /// Create a topic (with broker defaults) when a client first produces to it.
    #[arg(long)]
    pub auto_create_topics: bool,
}

/// Builds the broker config: file (or defaults), then flags.
pub fn build_config(args: &BrokerArgs) -> anyhow::Result<BrokerConfig> {
    let mut config = match &args.config {
        Some(path) => BrokerConfig::from_toml_file(path)?,
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
    if let Some(cert) = &args.tls_cert {
        config.tls.cert = Some(cert.clone());
    }
    if let Some(key) = &args.tls_key {
        config.tls.key = Some(key.clone());
    }
    if let Some(ca) = &args.tls_ca {
        config.tls.ca = Some(ca.clone());
    }
    if let Some(metrics) = args.metrics {
        config.metrics = Some(metrics);
    }
    if args.auto_create_topics {
        config.auto_create_topics = true;
    }
    config.validate()?;
    Ok(config)
}

pub async fn run(args: BrokerArgs) -> anyhow::Result<()> {
    let config = build_config(&args)?;
    let id = config.id;
    let data_dir = config.data_dir.clone();
    let handle = Broker::start(config)
        .await
        .with_context(|| format!("cannot start broker {id}"))?;

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

    let signal = wait_for_shutdown_signal().await?;
    tracing::info!("{signal} received: shutting down broker {id}");
    handle
        .shutdown()
        .await
        .with_context(|| format!("broker {id} did not shut down cleanly"))?;
    tracing::info!("broker {id} stopped");
    Ok(())
}

/// Waits for SIGTERM or Ctrl-C (SIGINT); returns which one came.
async fn wait_for_shutdown_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => Ok("SIGTERM"),
        r = tokio::signal::ctrl_c() => {
            r.context("cannot listen for Ctrl-C")?;
            Ok("Ctrl-C")
        }
    }
}
