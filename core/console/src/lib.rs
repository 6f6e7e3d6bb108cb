//! rill-console: the web console `rill broker --console HOST:PORT` serves.
//!
//! What it is: an HTTP/1.1 server (hyper) with a small single-page app (hand-written
//! HTML, CSS and JavaScript embedded in the binary, hash routes) and the JSON API
//! under `/api/...` that the app reads. Every answer comes from the cluster through
//! `rill-client`, the library the CLI uses (metadata, admin, group describe, list
//! offsets, a consumer for records, the transform registry topics), so the console
//! of any broker shows the whole cluster.
//!
//! Pages: cluster (brokers, controller, alive), topics (paged), a topic
//! (partitions, offsets, configs), its records (browse from an offset; live tail
//! by Server-Sent Events), consumer groups (members, committed offsets, lag;
//! reset a topic's committed offsets to the earliest, the latest, an offset or
//! a time while the group has no members), transforms (state, instances,
//! counts, errors, logs, pause/resume). The cluster page also charts each
//! broker's produce and fetch rates and latencies over the last ten minutes
//! ([`stats`]: every broker's own counters, asked every 2 s).
//!
//! Invariants: every API request is bounded in time ([`REQUEST_TIMEOUT`]) and in
//! what it returns (topics paged, records per browse capped, record bytes shown
//! capped); errors are JSON `{"error": "..."}` with a status that says what kind
//! (404 names the unknown topic, group or transform; 409 refuses to reset a
//! group that has members); changes (create topic,
//! alter its configs, reset a group's offsets, pause/resume a transform) are
//! POSTs the app sends only after a confirmation.
//! Binding a non-loopback address is the caller's decision (the broker's config
//! checks it, see `console` in rill_broker::BrokerConfig). Other web pages open
//! in the same browser cannot act through the console: a change must be a JSON
//! POST from the console's own origin (no cross-site form or `fetch` without a
//! CORS preflight, which the console does not grant), and a console on loopback
//! answers only requests whose Host is loopback (no DNS rebinding).

mod api;
mod assets;
mod http;
mod render;
mod session;
mod stats;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rill_client::{Client, ClientConfig, ClientError};
pub use rill_net::token::TokenVerifier;
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

/// Bound on one API request (metadata, a group describe, a records browse).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on the console's shutdown (open live tails are cut).
const STOP_WAIT: Duration = Duration::from_secs(5);

/// A running console.
#[derive(Debug)]
pub struct Console {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Console {
    /// The address it serves on (the real port when started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving: the listener closes, open connections (live tails) end.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(STOP_WAIT, self.task).await.is_err() {
            tracing::warn!("the console did not stop within {STOP_WAIT:?}");
        }
    }
}

/// Binds `listen` and serves the console, reading the cluster through a client
/// made from `client` (connected on first use, again after a failure). With
/// `users`, every request must carry a token it verifies and is authorized
/// as that token's principal (see [`session`]); without, the console acts
/// with `client`'s rights for everyone. Fails only when the address cannot be
/// bound.
pub async fn start(
    listen: SocketAddr,
    client: ClientConfig,
    users: Option<TokenVerifier>,
) -> std::io::Result<Console> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let (stop, stop_rx) = watch::channel(false);
    let state = Arc::new(State {
        loopback: addr.ip().is_loopback(),
        users,
        history: std::sync::Mutex::new(stats::History::default()),
        config: client,
        client: Mutex::new(None),
        stop: stop_rx.clone(),
    });
    let sampler = tokio::spawn(stats::sample(state.clone(), stop_rx.clone()));
    let task = tokio::spawn(async move {
        http::serve(listener, state, stop_rx).await;
        let _ = sampler.await;
    });
    Ok(Console { addr, stop, task })
}

/// What every request handler shares.
pub(crate) struct State {
    /// Listening on loopback only: then the Host header must name loopback
    /// too (see [`http::request_refusal`]).
    pub(crate) loopback: bool,
    /// Checks users' tokens (authentication on), or `None` (off).
    pub(crate) users: Option<TokenVerifier>,
    /// Every broker's throughput and latency over the last minutes.
    pub(crate) history: std::sync::Mutex<stats::History>,
    config: ClientConfig,
    client: Mutex<Option<Client>>,
    /// Becomes true when the console stops (ends live tails).
    pub(crate) stop: watch::Receiver<bool>,
}

impl State {
    /// The shared client, connecting it first if need be.
    pub(crate) async fn client(&self) -> Result<Client, ClientError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = Client::connect(self.config.clone()).await?;
        *slot = Some(c.clone());
        Ok(c)
    }
}
