//! Brings this broker in line with each committed metadata image: creates and
//! deletes local topics, applies config changes, hands every partition the
//! leadership and ISR the quorum chose, and hands each partition this broker
//! follows to the replica fetcher of its leader (one per leader broker).
//!
//! Every broker keeps a (possibly empty) log for every partition of every topic;
//! only a partition's assigned replicas ever write to it, and only its leader
//! answers clients.
//!
//! The ISR loop and the fetchers run on this task's own tracker, and `run`
//! returns only after all of them ended: they belong to the broker's shutdown
//! scope through it.

use super::image::MetadataImage;
use super::replication::ReplicaFetcher;
use crate::state::BrokerState;
use rill_proto::LeaderEpoch;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

type FollowerKey = (String, u32);

/// Applies images as they are committed, until shutdown. `applied_first`: the
/// broker applied one image already at start (a single broker does, before it
/// serves).
pub async fn run(state: Arc<BrokerState>, applied_first: bool) {
    let mut first = !applied_first;
    let mut rx = state.cluster.watch_image();
    let mut fetchers: Fetchers = HashMap::new();
    let tasks = TaskTracker::new();
    tasks.spawn(super::replication::isr_loop(state.clone()));
    tokio::select! {
        _ = state.shutdown.cancelled() => {}
        _ = state.cluster.wait_ready() => {}
    }
    loop {
        if state.shutdown.is_cancelled() {
            break;
        }
        let image = rx.borrow_and_update().clone();
        let s = state.clone();
        let im = image.clone();
        let first = std::mem::take(&mut first);
        if let Err(e) = tokio::task::spawn_blocking(move || apply_image(&s, &im, first)).await {
            tracing::error!(error = %e, "applying the metadata image failed");
        }
        update_followers(&state, &image, &mut fetchers, &tasks);
        tokio::select! {
            _ = state.shutdown.cancelled() => break,
            changed = rx.changed() => if changed.is_err() { break },
        }
    }
    for (_, (_, stop)) in fetchers.drain() {
        stop.cancel();
    }
    // The ISR loop ends with the broker's shutdown, the fetchers with their tokens.
    tasks.close();
    tasks.wait().await;
}

/// Brings the local partitions in line with `image`: opens the topics it has
/// (replacing older incarnations), applies changed configs and the committed
/// roles, and deletes the local logs of topics it no longer has. The first
/// time (`first`), also removes partition directories that belong to no topic
/// and retires a migrated `topics.toml`. Returns the logs that could not be
/// opened (each is logged; the others are applied).
pub fn apply_image(
    state: &BrokerState,
    image: &MetadataImage,
    first: bool,
) -> Vec<crate::error::BrokerError> {
    let registry = &state.registry;
    let mut failed = Vec::new();
    if first {
        registry.remove_orphans(image);
        crate::metadata::retire_topics_file(&state.config.data_dir);
    }
    for t in image.topics.values() {
        let local = match registry.open_topic(t) {
            Ok(local) => local,
            Err(e) => {
                tracing::error!(topic = %t.name, error = %e, "could not open the local logs of a topic");
                failed.push(e);
                continue;
            }
        };
        if *local.overrides.lock() != t.configs {
            registry.apply_configs(&t.name, &t.configs);
        }
        for (i, ps) in t.partitions.iter().enumerate() {
            if let Some(p) = local.partition(i as u32) {
                if ps.leader_epoch < p.leader_epoch() {
                    continue;
                }
                p.set_role(ps.leader, ps.leader_epoch, &ps.replicas, &ps.isr);
            }
        }
    }
    for local in registry.all() {
        if !image.topics.contains_key(&*local.name) {
            tracing::info!(topic = %local.name, "topic deleted in the cluster; removing its logs");
            registry.remove_topic(&local.name);
        }
    }
    failed
}

/// The replica fetchers, one per leader broker (and address).
type Fetchers = HashMap<i32, (Arc<ReplicaFetcher>, CancellationToken)>;

/// Hands each partition this broker follows to its leader's fetcher (starting
/// one per new leader), and takes away what it no longer follows.
fn update_followers(
    state: &Arc<BrokerState>,
    image: &MetadataImage,
    fetchers: &mut Fetchers,
    tasks: &TaskTracker,
) {
    let me = state.config.id;
    let mut wanted: BTreeMap<i32, Vec<(FollowerKey, LeaderEpoch)>> = BTreeMap::new();
    for t in image.topics.values() {
        for (i, p) in t.partitions.iter().enumerate() {
            if let Some(l) = p.leader
                && l != me
                && p.replicas.contains(&me)
            {
                wanted
                    .entry(l)
                    .or_default()
                    .push(((t.name.clone(), i as u32), p.leader_epoch));
            }
        }
    }
    // A leader that left the image, or moved to another address: its fetcher stops.
    fetchers.retain(|leader, (fetcher, stop)| {
        let addr = image.brokers.get(leader).map(|b| b.addr.as_str());
        let keep = addr == Some(fetcher.addr());
        if !keep {
            stop.cancel();
        }
        keep
    });
    for (leader, (fetcher, _)) in fetchers.iter() {
        let keep: std::collections::HashSet<&FollowerKey> = wanted
            .get(leader)
            .map(|v| v.iter().map(|(k, _)| k).collect())
            .unwrap_or_default();
        for (key, _) in fetcher.followed() {
            if !keep.contains(&key) {
                fetcher.unfollow(&key.0, key.1);
            }
        }
    }
    for (leader, partitions) in wanted {
        let Some(addr) = image.brokers.get(&leader).map(|b| b.addr.clone()) else {
            continue;
        };
        let (fetcher, _) = fetchers.entry(leader).or_insert_with(|| {
            let fetcher = Arc::new(ReplicaFetcher::new(leader, addr));
            let stop = state.shutdown.child_token();
            tasks.spawn(fetcher.clone().run(state.clone(), stop.clone()));
            (fetcher, stop)
        });
        for ((topic, index), epoch) in partitions {
            if let Ok(p) = state.registry.partition(&topic, index) {
                fetcher.follow(p, epoch);
            }
        }
    }
}
