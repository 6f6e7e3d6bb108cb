//! The options every client command shares (`--bootstrap`, `--tls-ca`,
//! `--tls-cert`, `--tls-key`) and how
//! they become a connected `rill_client::Client`.
//!
//! Connection failures are rewritten into the CLI's guidance: an absent broker
//! (QUIC over UDP shows no "connection refused", only silence) reads
//! `cannot connect to HOST:PORT: no broker answering (UDP). Start one with
//! `rill broker` or pass --bootstrap HOST:PORT`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use rill_client::{Client, ClientConfig, ClientError};
use rill_net::{ClientTls, NetError};

/// Where the default bootstrap points: a broker on this machine.
pub const DEFAULT_BOOTSTRAP: &str = "127.0.0.1:9092";

#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Brokers to connect to first, HOST:PORT[,HOST:PORT...] (UDP); any one that answers will do.
    #[arg(long, env = "RILL_BOOTSTRAP", default_value = DEFAULT_BOOTSTRAP, value_name = "HOST:PORT")]
    pub bootstrap: String,
    /// The CA certificate (PEM) to trust; default: the development CA in $RILL_HOME (~/.rill).
    #[arg(long, env = "RILL_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// This client's certificate (PEM), for a broker with --auth mtls; its common
    /// name is the principal (issue one with `rill cert issue --principal NAME`).
    #[arg(long, env = "RILL_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "RILL_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Largest UDP payload QUIC path MTU discovery may reach (1200..=65527);
    /// discovery stops at what the path carries (1452 on Ethernet, 8952 on
    /// jumbo frames, 65488 on loopback). Brokers bound it too
    /// (`[net] max_udp_payload_bytes`).
    #[arg(long, env = "RILL_MAX_UDP_PAYLOAD_BYTES", value_name = "BYTES",
          default_value_t = rill_net::MTU_UPPER_BOUND_DEFAULT,
          value_parser = clap::value_parser!(u16).range(1200..=65527))]
    pub max_udp_payload_bytes: u16,
}

/// Bound on reaching the bootstrap broker. Over UDP an absent broker is silence,
/// so this is how long `rill` waits before saying "no broker answering".
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl ClientArgs {
    /// The client configuration these options describe.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new(self.bootstrap.clone());
        if let Some(ca) = &self.tls_ca {
            config.tls = ClientTls::CaFile(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            config.tls = ClientTls::Mutual {
                ca: config.tls.ca_path(),
                cert: cert.clone(),
                key: key.clone(),
            };
        }
        config.client_id = format!("rill-cli/{}", env!("CARGO_PKG_VERSION"));
        config.max_udp_payload_bytes = self.max_udp_payload_bytes;
        config.connect_timeout = CONNECT_TIMEOUT;
        config
    }

    /// Connects to the cluster, with the CLI's guidance on failure.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        Client::connect(self.client_config())
            .await
            .map_err(|e| explain_connect_error(&self.bootstrap, e))
    }
}

/// Turns a failed connect into `cannot connect to ADDR: <why>. <what to do>`.
pub fn explain_connect_error(bootstrap: &str, err: ClientError) -> anyhow::Error {
    let what = format!("cannot connect to {bootstrap}");
    match &err {
        ClientError::NoBroker { last, .. } if is_silence(last) => anyhow!(
            "{what}: no broker answering (UDP). Start one with `rill broker` or pass --bootstrap HOST:PORT"
        ),
        ClientError::Net(NetError::NoDevCa { path }) => anyhow!(
            "{what}: no development CA at {} to verify the broker with (no broker has run with this RILL_HOME). \
             Start one with `rill broker`, or pass --tls-ca FILE",
            path.display()
        ),
        _ => anyhow::Error::new(err).context(what),
    }
}

/// Whether the error is the broker not answering at all (as opposed to answering
/// wrongly, e.g. a TLS failure).
fn is_silence(err: &ClientError) -> bool {
    match err {
        ClientError::Net(NetError::ConnectTimeout { .. }) => true,
        ClientError::Net(NetError::Handshake { source, .. }) => {
            matches!(source, rill_net::quinn::ConnectionError::TimedOut)
        }
        ClientError::Timeout { .. } => true,
        ClientError::Shared(inner) => is_silence(inner),
        _ => false,
    }
}

/// Wraps a client error under `what` (e.g. `cannot create topic t`). A broker error
/// already carries its own context naming the same operation; that is replaced by
/// `what`, leaving `what: CODE: broker message`.
pub fn client_error(what: impl std::fmt::Display, err: ClientError) -> anyhow::Error {
    match err {
        ClientError::Broker { error, .. } => anyhow!("{what}: {error}"),
        ClientError::Shared(inner) => match std::sync::Arc::try_unwrap(inner) {
            Ok(inner) => client_error(what, inner),
            Err(shared) => anyhow!("{what}: {shared}"),
        },
        ClientError::Failed { context, source } => match source.as_ref() {
            ClientError::Broker { error, .. } => anyhow!("{what}: {context}: {error}"),
            ClientError::Shared(inner) => match inner.as_ref() {
                ClientError::Broker { error, .. } => anyhow!("{what}: {context}: {error}"),
                _ => anyhow!("{what}: {context}: {source}"),
            },
            _ => anyhow!("{what}: {context}: {source}"),
        },
        other => anyhow::Error::new(other).context(what.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_proto::wire::{ErrorCode, ErrorInfo};
    use std::sync::Arc;

    fn broker_error() -> ClientError {
        ClientError::Broker {
            context: "produce to t-0".into(),
            error: ErrorInfo::new(ErrorCode::RecordTooLarge, "batch too big"),
        }
    }

    #[test]
    fn broker_context_is_replaced_by_ours() {
        let e = client_error("cannot produce to topic t", broker_error());
        assert_eq!(
            crate::report::one_line(&e),
            "cannot produce to topic t: RECORD_TOO_LARGE: batch too big"
        );
        let e = client_error(
            "cannot produce to topic t",
            ClientError::Failed {
                context: "produce to t-0 failed".into(),
                source: Arc::new(ClientError::Shared(Arc::new(broker_error()))),
            },
        );
        assert_eq!(
            crate::report::one_line(&e),
            "cannot produce to topic t: produce to t-0 failed: RECORD_TOO_LARGE: batch too big"
        );
    }

    #[test]
    fn silence_gets_the_start_a_broker_guidance() {
        let addr: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        let err = ClientError::NoBroker {
            addrs: "127.0.0.1:1".into(),
            last: Box::new(ClientError::Net(NetError::ConnectTimeout {
                addr,
                after: CONNECT_TIMEOUT,
            })),
        };
        assert_eq!(
            crate::report::one_line(&explain_connect_error("127.0.0.1:1", err)),
            "cannot connect to 127.0.0.1:1: no broker answering (UDP). Start one with `rill broker` or pass --bootstrap HOST:PORT"
        );
    }
}
