//! The brokers' own topics (`__consumer_offsets`, `__transaction_state`):
//! compacted, never tiered, created through the metadata quorum on first use,
//! replicated like any topic, with the replication factor capped at the live
//! brokers. Their partitions' leaders are the coordinators of what hashes to
//! them ([`coordinator_partition`]).

use std::sync::Arc;

use rill_proto::wire::{ErrorCode, ErrorInfo};

use crate::cluster::api as cluster_api;
use crate::partition::Topic;
use crate::state::BrokerState;
use crate::topic_configs::{CLEANUP_POLICY_CONFIG, REMOTE_STORAGE_ENABLE_CONFIG};
use crate::topics::TopicSpec;

/// How much of an internal partition one read of a replay takes.
const REPLAY_READ_BYTES: usize = 1024 * 1024;

/// Replays an internal partition: `apply(offset, key, value)` for each keyed
/// record from its start to its end as of now, in order; returns how many
/// it applied (`Ok(true)`). A record `apply` refuses (`Err(reason)`), a read
/// that fails, or bytes that do not parse end the replay with an error naming
/// the partition, its directory and what is now `unavailable` on this broker.
pub fn replay(
    p: &crate::partition::Partition,
    unavailable: &str,
    mut apply: impl FnMut(i64, &[u8], Option<&[u8]>) -> Result<bool, String>,
) -> Result<usize, ErrorInfo> {
    let corrupt = |reason: String| {
        ErrorInfo::new(
            ErrorCode::CoordinatorNotAvailable,
            format!(
                "{}-{} in {} cannot be loaded: {reason}; {unavailable} on this broker",
                p.topic(),
                p.index(),
                p.dir().display()
            ),
        )
    };
    let end = p.log_end_offset();
    let mut from = p.log_start_offset();
    let mut count = 0usize;
    while from < end {
        let Some(slice) = p
            .read_up_to(from, REPLAY_READ_BYTES, end)
            .map_err(|e| corrupt(e.message))?
        else {
            break;
        };
        let bytes = slice
            .read()
            .map_err(|e| corrupt(format!("read failed: {e}")))?;
        let mut next = from;
        for batch in rill_proto::batch::batches(&bytes) {
            let batch = batch.map_err(|e| corrupt(e.to_string()))?;
            next = batch.header.next_offset();
            for r in batch.records().map_err(|e| corrupt(e.to_string()))? {
                if r.offset < from {
                    continue;
                }
                let Some(key) = r.key.as_deref() else {
                    continue;
                };
                match apply(r.offset.0, key, r.value.as_deref()) {
                    Ok(true) => count += 1,
                    Ok(false) => {}
                    Err(e) => return Err(corrupt(format!("record at offset {}: {e}", r.offset))),
                }
            }
        }
        if next <= from {
            break;
        }
        from = next;
    }
    Ok(count)
}

/// NOT_COORDINATOR from a broker that holds no replica of `topic`'s
/// partition `index`, so coordinates nothing kept there (`what`: "its groups",
/// "transactional id \"t\"").
pub fn not_coordinator_here(broker: i32, topic: &str, index: u32, what: &str) -> ErrorInfo {
    ErrorInfo::new(
        ErrorCode::NotCoordinator,
        format!(
            "broker {broker} is not a replica of {topic}-{index}, so not the coordinator of \
             {what}: ask FindCoordinator again"
        ),
    )
}

/// The partition of an internal topic of `partitions` that coordinates `key`
/// (a group id, a transactional id): FNV-1a, stable across releases.
pub fn coordinator_partition(key: &str, partitions: u32) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in key.as_bytes() {
        hash ^= u32::from(*b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash % partitions.max(1)
}

/// The spec of internal topic `name` as this broker would create it.
pub fn spec(
    state: &BrokerState,
    name: &str,
    partitions: u32,
    replication_factor: u16,
) -> TopicSpec {
    let live = state.cluster.image().live_brokers().len().max(1);
    TopicSpec {
        name: name.to_string(),
        partitions,
        replication_factor: replication_factor.min(u16::try_from(live).unwrap_or(u16::MAX)),
        // Never tiered: coordinators replay these topics from local segments.
        configs: vec![
            (CLEANUP_POLICY_CONFIG.into(), "compact".into()),
            (REMOTE_STORAGE_ENABLE_CONFIG.into(), "false".into()),
        ],
        internal: true,
    }
}

/// Internal topic `name`, created through the quorum (with `partitions` and
/// `replication_factor`) if it does not exist yet; `creating` serializes this
/// broker's attempts. COORDINATOR_NOT_AVAILABLE (retriable) while it is being
/// created.
pub async fn ensure(
    state: &Arc<BrokerState>,
    name: &str,
    partitions: u32,
    replication_factor: u16,
    creating: &tokio::sync::Mutex<()>,
) -> Result<Arc<Topic>, ErrorInfo> {
    let in_quorum = || state.cluster.image().topics.contains_key(name);
    if in_quorum()
        && let Some(t) = state.registry.topic(name)
    {
        return Ok(t);
    }
    {
        let _creating = creating.lock().await;
        if !in_quorum() {
            let spec = spec(state, name, partitions, replication_factor);
            let rf = spec.replication_factor;
            match cluster_api::create_topic(state, spec, false).await {
                Ok(()) => tracing::info!(partitions, replication_factor = rf, "created {name}"),
                Err(e) if e.code == ErrorCode::TopicAlreadyExists => {}
                Err(e) => {
                    return Err(ErrorInfo::new(
                        ErrorCode::CoordinatorNotAvailable,
                        format!("could not create {name}: {e}"),
                    ));
                }
            }
        }
    }
    state
        .registry
        .topic(name)
        .filter(|_| in_quorum())
        .ok_or_else(|| {
            ErrorInfo::new(
                ErrorCode::CoordinatorNotAvailable,
                format!("{name} is being created: retry"),
            )
        })
}
