//! The transform supervisor inside `rill broker`: a task that connects to this
//! broker with the client library and runs the deployed transforms (see
//! rill_transforms::supervisor). It connects with the broker's own certificate,
//! so it is that broker's principal (it writes the transform topics, which no
//! client may). Only a broker with its own certificate files and no client CA
//! cannot lend it that identity; the supervisor then connects as a plain client
//! trusting `RILL_TLS_CA`, or is off.

use std::net::SocketAddr;
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

/// The TLS of a supervisor whose broker has its own certificate files but no
/// client CA: an ordinary client trusting `RILL_TLS_CA`, if set.
pub fn client_tls_from_env() -> Option<ClientTls> {
    std::env::var_os("RILL_TLS_CA").map(|ca| ClientTls::CaFile(ca.into()))
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
                // The broker's own client may do everything: act for each
                // deployment's principal, checking its rights.
                true,
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
