//! `FrontDoor`: the way into a running broker for a listener that speaks
//! another protocol (rill-kafka's Kafka-protocol TCP listener). It hands out
//! what such a listener needs and nothing of the broker's insides: typed calls
//! through the broker's one [`Router`] (so version checks, element counts,
//! authorization, quotas and metrics apply as on the QUIC path), the config,
//! the shutdown scope, and a place in the broker's connection count.
//!
//! Invariants:
//! - Every request a front door serves goes through `Router::route`, the same
//!   code path as a QUIC frame; a front door never calls a handler directly.
//! - A connection holds a [`ConnectionPlace`] for as long as it is open; the
//!   broker's `max_connections` counts QUIC and front-door connections together.

use crate::config::BrokerConfig;
use crate::router::Router;
use crate::state::BrokerState;
use bytes::Bytes;
use rill_proto::Rope;
use rill_proto::wire::{ApiRequest, ErrorInfo};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::auth::{Caller, Principal};

/// A running broker, as another protocol's listener sees it.
pub struct FrontDoor {
    state: Arc<BrokerState>,
    router: Router,
    tracker: TaskTracker,
}

impl std::fmt::Debug for FrontDoor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontDoor")
            .field("broker", &self.state.config.id)
            .finish_non_exhaustive()
    }
}

impl FrontDoor {
    pub(crate) fn new(state: Arc<BrokerState>, tracker: TaskTracker) -> FrontDoor {
        FrontDoor {
            router: Router::new(state.clone()),
            state,
            tracker,
        }
    }

    /// Serves one typed request from `caller` as the QUIC path would (see
    /// `Router::call`): `Ok(None)` when the request asked for no answer.
    pub async fn call<R: ApiRequest>(
        &self,
        caller: &Arc<Caller>,
        request: &R,
        payload: impl Into<Rope>,
    ) -> Result<Option<(R::Response, Vec<Bytes>)>, ErrorInfo> {
        self.router.call(caller, request, payload.into()).await
    }

    /// The broker's config (ids, limits, auth mode, the Kafka listener's addresses).
    pub fn config(&self) -> &BrokerConfig {
        &self.state.config
    }

    /// The cluster id.
    pub fn cluster_id(&self) -> &str {
        &self.state.cluster_id
    }

    /// The Kafka listener addresses the metadata image holds, by broker id:
    /// every broker that registered one and is not fenced (this broker's own
    /// only once its registration committed).
    pub fn kafka_addresses(&self) -> BTreeMap<i32, String> {
        let image = self.state.cluster.image();
        image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .filter_map(|b| {
                let addr = b.listeners.get(crate::cluster::image::KAFKA_LISTENER)?;
                Some((b.id, addr.clone()))
            })
            .collect()
    }

    /// The TLS server configuration of a TCP listener (the Kafka protocol's):
    /// the broker's certificate and client-certificate policy, as on QUIC
    /// (TLS 1.3, client certificates verified against the broker's CA), and no
    /// ALPN (Kafka clients offer none).
    /// With `optional_client_cert` (a listener whose clients may
    /// authenticate otherwise, with SASL), a certificate is asked for but not
    /// required even with `--auth mtls`.
    pub fn tcp_tls_config(
        &self,
        optional_client_cert: bool,
    ) -> Result<rustls::ServerConfig, rill_net::NetError> {
        let mut tls = self.state.server_tls.clone();
        if optional_client_cert
            && let rill_net::ServerTls::Files { client_auth, .. } = &mut tls
            && let rill_net::ClientAuth::Required(ca) = client_auth
        {
            *client_auth = rill_net::ClientAuth::Optional(ca.clone());
        }
        let mut config = tls.rustls_config()?;
        config.alpn_protocols.clear();
        Ok(config)
    }

    /// Every topic's id (32 hex digits, a UUID) by name, from the metadata
    /// image.
    pub fn topic_ids(&self) -> BTreeMap<String, String> {
        let image = self.state.cluster.image();
        image
            .topics
            .values()
            .map(|t| (t.name.clone(), t.id.clone()))
            .collect()
    }

    /// The SCRAM credentials of `user` in the metadata image (none for an
    /// unknown user).
    pub fn scram_credentials(&self, user: &str) -> Vec<rill_proto::scram::ScramCredential> {
        let image = self.state.cluster.image();
        image.users.get(user).cloned().unwrap_or_default()
    }

    /// Cancelled when the broker starts shutting down.
    pub fn shutdown(&self) -> CancellationToken {
        self.state.shutdown.clone()
    }

    /// The broker's task scope: shutdown waits (bounded) for its tasks.
    pub fn tracker(&self) -> TaskTracker {
        self.tracker.clone()
    }

    /// A place in the broker's connection count, or `None` when the broker
    /// has `max_connections` open already.
    pub fn open_connection(&self) -> Option<ConnectionPlace> {
        let open = self.state.connections.fetch_add(1, Ordering::AcqRel);
        let place = ConnectionPlace(self.state.clone());
        self.state.metrics.connections.increment(1.0);
        (open < self.state.config.max_connections).then_some(place)
    }
}

/// One open connection in the broker's count; released on drop.
#[derive(Debug)]
pub struct ConnectionPlace(Arc<BrokerState>);

impl Drop for ConnectionPlace {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
        self.0.metrics.connections.decrement(1.0);
    }
}
