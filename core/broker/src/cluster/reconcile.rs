//! Brings this broker in line with each committed metadata image: creates and
//! deletes local topics, applies config changes, hands every partition the
//! leadership and ISR the quorum chose, and hands each partition this broker
//! follows to the replica fetcher of its leader (one per leader broker).
//!
//! A broker keeps a log only for the partitions it is a replica of (every
//! topic has an entry in its registry, for configs and partition counts, but
//! no log where it is no replica); only a partition's leader answers clients.
//!
//! Each image is compared with the one applied before it: only the topics that
//! changed (or went) are applied and handed to the fetchers, so the work per
//! committed change does not grow with the number of partitions (at 10,000
//! partitions, re-applying every topic for each of a thousand topic creations
//! was quadratic). The whole image is applied at start, after a failure to
//! open a log, and (for the fetchers) when a broker or its address changes.
//!
//! The ISR loop and the fetchers run on this task's own tracker, and `run`
//! returns only after all of them ended: they belong to the broker's shutdown
//! scope through it.

use super::image::{MetadataImage, TopicState};
use super::replication::ReplicaFetcher;
use crate::state::BrokerState;
use rill_proto::LeaderEpoch;
use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    // The image applied last, when it was applied whole (no log failed to open).
    let mut applied: Option<Arc<MetadataImage>> = None;
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
        let prev = applied.take();
        let before = prev.clone();
        let result =
            tokio::task::spawn_blocking(move || apply_image(&s, &im, before.as_deref(), first))
                .await;
        let whole = match result {
            Ok(failed) => failed.is_empty(),
            Err(e) => {
                tracing::error!(error = %e, "applying the metadata image failed");
                false
            }
        };
        update_followers(&state, &image, prev.as_deref(), &mut fetchers, &tasks);
        // After a failure the next image is applied whole, so the topic is retried.
        applied = whole.then_some(image);
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

/// The topics of `image` that are not the same in `prev` (every topic when
/// there is no `prev`), in name order.
pub fn changed_topics<'a>(
    prev: Option<&MetadataImage>,
    image: &'a MetadataImage,
) -> impl Iterator<Item = &'a TopicState> {
    image
        .topics
        .values()
        .filter(move |t| prev.is_none_or(|p| p.topics.get(&t.name) != Some(*t)))
}

/// Names of the topics that changed between `prev` and `image`: created,
/// changed or deleted.
pub fn changed_topic_names<'a>(
    prev: &'a MetadataImage,
    image: &'a MetadataImage,
) -> BTreeSet<&'a str> {
    let mut names: BTreeSet<&str> = changed_topics(Some(prev), image)
        .map(|t| t.name.as_str())
        .collect();
    names.extend(
        prev.topics
            .keys()
            .filter(|n| !image.topics.contains_key(*n))
            .map(String::as_str),
    );
    names
}

/// Brings the local partitions in line with `image`: opens the topics it has
/// (replacing older incarnations), applies changed configs and the committed
/// roles, and deletes the local logs of topics it no longer has. Given `prev`,
/// the image applied before (whole), only the topics that differ from it are
/// looked at. The first time (`first`), also removes partition directories
/// that belong to no topic and retires a migrated `topics.toml`. Returns the
/// logs that could not be opened (each is logged; the others are applied).
pub fn apply_image(
    state: &BrokerState,
    image: &MetadataImage,
    prev: Option<&MetadataImage>,
    first: bool,
) -> Vec<crate::error::BrokerError> {
    let registry = &state.registry;
    let mut failed = Vec::new();
    if first {
        registry.remove_orphans(image);
        crate::metadata::retire_topics_file(&state.config.data_dir);
    }
    for t in changed_topics(prev, image) {
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
    let deleted = prev.is_none_or(|p| p.topics.keys().any(|n| !image.topics.contains_key(n)));
    for local in registry.all().into_iter().filter(|_| deleted) {
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
/// one per new leader), and takes away what it no longer follows. Given `prev`
/// (the image handled before) with the same brokers, only the partitions of
/// the topics that changed are looked at.
fn update_followers(
    state: &Arc<BrokerState>,
    image: &MetadataImage,
    prev: Option<&MetadataImage>,
    fetchers: &mut Fetchers,
    tasks: &TaskTracker,
) {
    let me = state.config.id;
    let scope: Option<BTreeSet<&str>> = match prev {
        Some(prev) if prev.brokers == image.brokers => Some(changed_topic_names(prev, image)),
        _ => None,
    };
    let in_scope = |name: &str| scope.as_ref().is_none_or(|s| s.contains(name));
    let mut wanted: BTreeMap<i32, Vec<(FollowerKey, LeaderEpoch)>> = BTreeMap::new();
    for t in image.topics.values().filter(|t| in_scope(&t.name)) {
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
        match &scope {
            None => {
                for (key, _) in fetcher.followed() {
                    if !keep.contains(&key) {
                        fetcher.unfollow(&key.0, key.1);
                    }
                }
            }
            Some(names) => {
                // Only the changed topics' partitions can have moved.
                for name in names {
                    let count = [
                        prev.and_then(|p| p.topics.get(*name)),
                        image.topics.get(*name),
                    ]
                    .iter()
                    .flatten()
                    .map(|t| t.partitions.len())
                    .max()
                    .unwrap_or(0);
                    for i in 0..count as u32 {
                        let key = (name.to_string(), i);
                        if !keep.contains(&key) {
                            fetcher.unfollow(name, i);
                        }
                    }
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::image::PartitionState;

    fn topic(name: &str, leader: i32) -> TopicState {
        TopicState {
            name: name.into(),
            id: format!("id-{name}"),
            internal: false,
            configs: BTreeMap::new(),
            partitions: vec![PartitionState {
                replicas: vec![0, 1, 2],
                leader: Some(leader),
                leader_epoch: LeaderEpoch(0),
                isr: vec![0, 1, 2],
            }],
        }
    }

    fn image(topics: &[TopicState]) -> MetadataImage {
        MetadataImage {
            topics: topics.iter().map(|t| (t.name.clone(), t.clone())).collect(),
            ..MetadataImage::default()
        }
    }

    #[test]
    fn only_changed_topics_are_applied_again() {
        let prev = image(&[topic("a", 0), topic("b", 0), topic("gone", 0)]);
        let mut moved = topic("b", 1);
        moved.partitions[0].leader_epoch = LeaderEpoch(1);
        let next = image(&[topic("a", 0), moved, topic("new", 2)]);
        let changed: Vec<&str> = changed_topics(Some(&prev), &next)
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(changed, ["b", "new"]);
        assert_eq!(
            changed_topic_names(&prev, &next)
                .into_iter()
                .collect::<Vec<_>>(),
            ["b", "gone", "new"]
        );
        // Without an image applied before, every topic is.
        assert_eq!(changed_topics(None, &next).count(), 3);
        // A config change is a change too.
        let mut configured = topic("a", 0);
        configured.configs.insert("retention.ms".into(), "1".into());
        let next = image(&[configured]);
        assert_eq!(changed_topics(Some(&prev), &next).count(), 1);
    }
}
