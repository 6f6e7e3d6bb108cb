//! Brings this broker in line with each committed metadata image: creates and
//! deletes local topics, applies config changes, hands every partition the
//! leadership and ISR the quorum chose, and runs one follower per partition this
//! broker follows.
//!
//! Every broker keeps a (possibly empty) log for every partition of every topic;
//! only a partition's assigned replicas ever write to it, and only its leader
//! answers clients.
//!
//! The ISR loop and the followers run on this task's own tracker, and `run`
//! returns only after all of them ended: they belong to the broker's shutdown
//! scope through it.

use super::image::MetadataImage;
use crate::state::BrokerState;
use crate::topics::TopicSpec;
use rill_proto::LeaderEpoch;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

type FollowerKey = (String, u32);

/// Applies images as they are committed, until shutdown.
pub async fn run(state: Arc<BrokerState>) {
    let mut rx = state.cluster.watch_image();
    let mut followers: HashMap<FollowerKey, (i32, LeaderEpoch, CancellationToken)> = HashMap::new();
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
        if let Err(e) = tokio::task::spawn_blocking(move || apply_image(&s, &im)).await {
            tracing::error!(error = %e, "applying the metadata image failed");
        }
        update_followers(&state, &image, &mut followers, &tasks);
        tokio::select! {
            _ = state.shutdown.cancelled() => break,
            changed = rx.changed() => if changed.is_err() { break },
        }
    }
    for (_, (_, _, stop)) in followers.drain() {
        stop.cancel();
    }
    // The ISR loop ends with the broker's shutdown, the followers with their tokens.
    tasks.close();
    tasks.wait().await;
}

fn apply_image(state: &BrokerState, image: &MetadataImage) {
    let registry = &state.registry;
    for t in image.topics.values() {
        let local = registry.topic(&t.name);
        let same = local.as_ref().is_some_and(|l| l.id == t.id);
        if local.is_some() && !same {
            tracing::info!(topic = %t.name, "local topic is an older incarnation; replacing it");
            let _ = registry.delete(&t.name);
        }
        if !same {
            let spec = TopicSpec {
                name: t.name.clone(),
                partitions: t.partitions.len() as u32,
                replication_factor: 1,
                configs: t
                    .configs
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                internal: t.internal,
            };
            if let Err(e) = registry.create_with_id(&spec, false, Some(&t.id)) {
                tracing::error!(topic = %t.name, error = %e, "could not create the local logs of a topic");
                continue;
            }
        }
        let Some(local) = registry.topic(&t.name) else {
            continue;
        };
        let overrides = local.overrides.lock().clone();
        if overrides != t.configs {
            let set: Vec<(String, String)> = t
                .configs
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let delete: Vec<String> = overrides
                .keys()
                .filter(|k| !t.configs.contains_key(*k))
                .cloned()
                .collect();
            if let Err(e) = registry.alter_configs(&t.name, &set, &delete, false) {
                tracing::error!(topic = %t.name, error = %e, "could not apply committed configs");
            }
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
        // Internal topics the broker made for itself (__consumer_offsets, by the
        // group coordinator) are not in the quorum yet: leave them alone.
        if !local.internal && !image.topics.contains_key(&*local.name) {
            tracing::info!(topic = %local.name, "topic deleted in the cluster; removing its logs");
            let _ = registry.delete(&local.name);
        }
    }
}

fn update_followers(
    state: &Arc<BrokerState>,
    image: &MetadataImage,
    followers: &mut HashMap<FollowerKey, (i32, LeaderEpoch, CancellationToken)>,
    tasks: &TaskTracker,
) {
    let me = state.config.id;
    let mut wanted: BTreeMap<FollowerKey, (i32, LeaderEpoch)> = BTreeMap::new();
    for t in image.topics.values() {
        for (i, p) in t.partitions.iter().enumerate() {
            if let Some(l) = p.leader
                && l != me
                && p.replicas.contains(&me)
            {
                wanted.insert((t.name.clone(), i as u32), (l, p.leader_epoch));
            }
        }
    }
    followers.retain(|k, (l, e, stop)| {
        let keep = wanted.get(k) == Some(&(*l, *e));
        if !keep {
            stop.cancel();
        }
        keep
    });
    for (k, (leader, epoch)) in wanted {
        if followers.contains_key(&k) {
            continue;
        }
        let Some(addr) = image.brokers.get(&leader).map(|b| b.addr.clone()) else {
            continue;
        };
        let Ok(p) = state.registry.partition(&k.0, k.1) else {
            continue;
        };
        let stop = state.shutdown.child_token();
        tasks.spawn(super::replication::follow(
            state.clone(),
            p,
            addr,
            epoch,
            stop.clone(),
        ));
        followers.insert(k, (leader, epoch, stop));
    }
}
