//! Replication: followers fetch from their leader over QUIC with the ordinary
//! Fetch (`replica_id` set), truncating first by the leader's epoch boundary
//! (KIP-101 OffsetForLeaderEpoch, never to their own high watermark); leaders
//! track each follower's log end offset, move the high watermark to the lowest
//! one in the ISR, and ask the controller to shrink the ISR of a follower that
//! lagged more than `replica.lag.time.max.ms` and to expand it again once the
//! follower caught up (KIP-966 style: ISR changes go through the quorum).
//!
//! The ISR decision is a pure transition of the partition's replication state
//! ([`crate::replica::ReplicaState::isr_change`]), unit-tested without a runtime.

use crate::partition::Partition;
use crate::state::BrokerState;
use rill_proto::types::now_ms;
use rill_proto::wire::*;
use rill_proto::{LeaderEpoch, Offset};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Longest a follower's fetch waits at the leader for new data.
pub const REPLICA_FETCH_WAIT: Duration = Duration::from_millis(500);
/// Most bytes one follower fetch asks for.
pub const REPLICA_FETCH_BYTES_MAX: u32 = 8 * 1024 * 1024;
/// Pause after a failed follower fetch before the next try.
pub const REPLICA_RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// How often a leader checks its partitions' ISR.
pub const ISR_CHECK_INTERVAL: Duration = Duration::from_millis(200);

/// The topic's replication settings (min.insync.replicas, replica.lag.time.max.ms,
/// ...), as its committed configs give them; the broker's defaults for a topic
/// this broker does not host.
pub fn topic_replication_settings(
    state: &BrokerState,
    topic: &str,
) -> crate::topic_configs::ReplicationSettings {
    match state.registry.topic(topic) {
        Some(t) => *t.replication.lock(),
        None => {
            crate::topic_configs::TopicSettings::resolve_committed(
                topic,
                state.registry.defaults(),
                &Default::default(),
            )
            .replication
        }
    }
}

/// On a leader, every [`ISR_CHECK_INTERVAL`]: proposes ISR changes for the
/// partitions it leads.
pub async fn isr_loop(state: Arc<BrokerState>) {
    let mut leading_since: BTreeMap<(String, u32, LeaderEpoch), Instant> = BTreeMap::new();
    let mut timer = tokio::time::interval(ISR_CHECK_INTERVAL);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        let now = Instant::now();
        let mut live = BTreeMap::new();
        for p in state.registry.partitions() {
            // One consistent view: the epoch, ISR, followers and watermark together.
            let replica = p.replica_state();
            if !replica.is_leader() {
                continue;
            }
            let key = (p.topic().to_string(), p.index(), replica.leader_epoch());
            let since = *leading_since.entry(key.clone()).or_insert(now);
            live.insert(key, since);
            let lag_max = Duration::from_millis(
                topic_replication_settings(&state, p.topic()).replica_lag_time_max_ms,
            );
            let epoch_start = p
                .end_offset_for_epoch(LeaderEpoch(replica.leader_epoch().0 - 1))
                .ok()
                .flatten()
                .map_or(Offset(0), |(_, end)| end);
            let Some(new_isr) = replica.isr_change(epoch_start, since, lag_max, now) else {
                continue;
            };
            tracing::info!(partition = %format!("{}-{}", p.topic(), p.index()), old = ?replica.isr(), new = ?new_isr, "asking the controller to change the ISR");
            let command = super::image::Command::AlterIsr {
                broker_id: state.config.id,
                topic: p.topic().to_string(),
                partition: p.index(),
                leader_epoch: replica.leader_epoch(),
                new_isr,
            };
            if let Err(e) = state.cluster.propose(command).await {
                tracing::debug!(error = %e, "ISR change not committed");
            }
        }
        leading_since = live;
    }
}

/// Follows one partition's leader until `stop`: truncates by the leader's epoch
/// boundary, then fetches and appends, keeping the high watermark the leader sends.
pub async fn follow(
    state: Arc<BrokerState>,
    p: Arc<Partition>,
    leader_addr: String,
    epoch: LeaderEpoch,
    stop: CancellationToken,
) {
    let tp = format!("{}-{}", p.topic(), p.index());
    let timeout = REPLICA_FETCH_WAIT + Duration::from_secs(2);
    // KIP-101: ask where our latest epoch ends on the leader; cut what is past it.
    loop {
        if stop.is_cancelled() {
            return;
        }
        let ours = p.latest_epoch();
        let Some(ours) = ours else { break };
        let req = OffsetForLeaderEpochRequest {
            topic: p.topic().to_string(),
            partition: p.index(),
            current_leader_epoch: epoch,
            leader_epoch: ours,
        };
        match state.cluster.links.call(&leader_addr, &req, timeout).await {
            Ok((resp, _)) => {
                let end = match resp.leader_epoch {
                    // Our epoch (or an earlier one the leader has) ends at end_offset;
                    // when the leader only has an earlier epoch, that epoch's end is
                    // also where ours diverges.
                    Some(_) => resp.end_offset,
                    None => Offset(0),
                };
                if end < p.log_end_offset() {
                    tracing::info!(partition = %tp, from = %p.log_end_offset(), to = %end, leader_epoch = %epoch, "truncating to the leader's epoch boundary");
                    if let Err(e) = p.truncate_to(end) {
                        tracing::error!(partition = %tp, error = %e, "truncation failed");
                    }
                }
                break;
            }
            Err(e) => {
                tracing::debug!(partition = %tp, error = %e, "OffsetForLeaderEpoch failed; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(REPLICA_RETRY_BACKOFF) => {}
                }
            }
        }
    }
    loop {
        if stop.is_cancelled() {
            return;
        }
        let req = FetchRequest {
            max_wait_ms: REPLICA_FETCH_WAIT.as_millis() as u32,
            min_bytes: 1,
            max_bytes: REPLICA_FETCH_BYTES_MAX,
            replica_id: Some(state.config.id),
            partitions: vec![FetchPartition {
                topic: p.topic().to_string(),
                partition: p.index(),
                offset: p.log_end_offset(),
                max_bytes: REPLICA_FETCH_BYTES_MAX,
                current_leader_epoch: Some(epoch),
            }],
        };
        let fetched = tokio::select! {
            _ = stop.cancelled() => return,
            r = state.cluster.links.call(&leader_addr, &req, timeout) => r,
        };
        let failed = match fetched {
            Ok((resp, payload)) => match resp.partitions.first() {
                Some(fp) if fp.error.is_none() => {
                    if fp.bytes_len > 0 {
                        let bytes = payload.slice(..(fp.bytes_len as usize).min(payload.len()));
                        let p2 = p.clone();
                        let appended = tokio::task::spawn_blocking(move || {
                            p2.append_replicated(&bytes, now_ms())
                        })
                        .await;
                        match appended {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => {
                                tracing::warn!(partition = %tp, error = %e, "could not append replicated batches");
                            }
                            Err(e) => {
                                tracing::error!(partition = %tp, error = %e, "append task failed")
                            }
                        }
                    }
                    p.follow_high_watermark(fp.high_watermark);
                    false
                }
                Some(fp) => {
                    tracing::debug!(partition = %tp, error = ?fp.error, "replica fetch refused");
                    true
                }
                None => true,
            },
            Err(e) => {
                tracing::debug!(partition = %tp, error = %e, "replica fetch failed");
                true
            }
        };
        if failed {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(REPLICA_RETRY_BACKOFF) => {}
            }
        }
    }
}
