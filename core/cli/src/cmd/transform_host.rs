//! The transform supervisor inside `rill broker`: a task that connects to this
//! broker with the client library and runs the deployed transforms (see
//! rill_transforms::supervisor). It is a client like any other, so it follows
//! the broker's TLS: the development CA by default; with the broker's own
//! certificate it needs `RILL_TLS_CA` (and, with client certificates, it is
//! off — run `rill transform run` with the right flags instead).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rill_client::{Client, ClientConfig};
use rill_net::ClientTls;
use rill_transforms::HostMaxima;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Pause between attempts to connect to this broker.
const CONNECT_RETRY: Duration = Duration::from_secs(1);
/// Bound on the supervisor's shutdown (runners drain and commit first).
const STOP_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct TransformHost {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl TransformHost {
    /// Stops every transform of this process (committing their progress).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(STOP_WAIT, self.task).await.is_err() {
            tracing::warn!("transform supervisor did not stop within {STOP_WAIT:?}");
        }
    }
}

/// Which TLS the supervisor uses to reach its own broker, if it can.
pub fn client_tls(rill_home: Option<PathBuf>, cert: bool, mutual: bool) -> Option<ClientTls> {
    match (cert, mutual, std::env::var_os("RILL_TLS_CA")) {
        (_, true, _) => None,
        (false, _, _) => Some(ClientTls::Dev {
            home: rill_home.unwrap_or_else(rill_net::rill_home),
        }),
        (true, _, Some(ca)) => Some(ClientTls::CaFile(ca.into())),
        (true, _, None) => None,
    }
}

/// The maxima of a broker's `[transforms]` config.
pub fn maxima(config: &rill_broker::TransformsConfig) -> HostMaxima {
    HostMaxima::from_config(config.memory_mb_max, config.call_timeout_ms_max)
}

/// Starts the supervisor of broker `id` listening on `addr`; it refuses
/// deployments asking for more than `maxima`.
pub fn start(id: i32, addr: SocketAddr, tls: ClientTls, maxima: HostMaxima) -> TransformHost {
    let (stop, mut stop_rx) = watch::channel(false);
    let ip = if addr.ip().is_unspecified() {
        match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        }
    } else {
        addr.ip()
    };
    let target = SocketAddr::new(ip, addr.port());
    let task = tokio::spawn(async move {
        let mut config = ClientConfig::new(target.to_string());
        config.tls = tls;
        config.client_id = format!("rill-broker-{id}-transforms");
        let client = loop {
            match Client::connect(config.clone()).await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(error = %e, "transform supervisor cannot reach its broker yet");
                    tokio::select! {
                        _ = stop_rx.changed() => return,
                        _ = tokio::time::sleep(CONNECT_RETRY) => {}
                    }
                }
            }
        };
        let instance = super::transform::instance_id(&format!("broker-{id}"));
        loop {
            match rill_transforms::supervisor::supervise(
                client.clone(),
                instance.clone(),
                maxima,
                stop_rx.clone(),
            )
            .await
            {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "transform supervisor failed; restarting");
                    tokio::select! {
                        _ = stop_rx.changed() => return,
                        _ = tokio::time::sleep(CONNECT_RETRY) => {}
                    }
                }
            }
        }
    });
    TransformHost { stop, task }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_defaults_are_the_hosts_defaults() {
        let config = rill_broker::BrokerConfig::default();
        assert_eq!(maxima(&config.transforms), HostMaxima::default());
    }
}
