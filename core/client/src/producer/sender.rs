//! The producer's sender: a background task that drains ready batches into
//! produce requests, and one short task per request in flight.
//!
//! Bounds: requests in flight per broker (`max_in_flight_per_broker`, a semaphore
//! per broker), bytes per request (`request_payload_max`), attempts per batch
//! (`retries`) and time per record (`delivery_timeout`).
//!
//! A request's outcome is judged per partition: success completes the
//! partition's batches (offsets `base`, `base + count(b0)`, ...); a retriable error
//! puts them back at the front of the partition's queue after `retry_backoff`
//! (refreshing metadata first when leadership moved); any other error fails only
//! that partition's records, with a message naming the topic-partition.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rill_proto::wire::{
    Acks, ErrorCode, ErrorInfo, ProducePartition, ProducePartitionResponse, ProduceRequest,
};
use rill_proto::{Offset, ProducerId};
use tokio::sync::OwnedSemaphorePermit;

use super::ProducerShared;
use super::accumulator::{Backoff, ClosedBatch};
use super::delivery::BatchAck;
use crate::error::{ClientError, needs_metadata_refresh};

/// The sender loop; returns once the producer is closing and nothing is left.
pub(crate) async fn run(shared: Arc<ProducerShared>) {
    let mut last_refresh: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let closing = shared.closing.load(Ordering::SeqCst);
        let drained = {
            let mut acc = shared.acc.lock();
            if closing {
                // Everything still queued goes out now.
                acc.flushing += 1;
            }
            let d = acc.drain(
                now,
                shared.request_payload_max,
                |t, p| shared.client.leader(t, p),
                |b| shared.broker_permits(b).available_permits(),
            );
            if closing {
                acc.flushing -= 1;
            }
            d
        };
        for batch in drained.expired {
            let what = format!(
                "delivery of {} records to {}-{} (delivery_timeout {:?})",
                batch.record_count, batch.topic, batch.partition, shared.config.delivery_timeout
            );
            fail(&shared, batch, Arc::new(ClientError::Timeout { what }));
        }
        let mut next_wake = drained.next_wake;
        if drained.leader_unknown || drained.backing_off {
            // Refresh at most once per backoff; never hold up sending elsewhere.
            // (A retry waiting out its backoff goes at once when the refresh
            // names a new leader.)
            let due = last_refresh.is_none_or(|t| t.elapsed() >= shared.config.retry_backoff);
            if due {
                last_refresh = Some(now);
                let client = shared.client.clone();
                let wake_shared = shared.clone();
                tokio::spawn(async move {
                    if let Err(e) = client.refresh_metadata(now).await {
                        tracing::debug!(error = %e, "metadata refresh for the producer failed");
                    }
                    wake_shared.wake.notify_one();
                });
            }
            let at = now + shared.config.retry_backoff;
            next_wake = Some(next_wake.map_or(at, |w| w.min(at)));
        }
        for (broker, batches) in drained.requests {
            match shared.broker_permits(broker).try_acquire_owned() {
                Ok(permit) => {
                    tokio::spawn(send_request(shared.clone(), broker, batches, permit));
                }
                Err(_) => requeue_all(&shared, batches),
            }
        }
        if closing && shared.acc.lock().is_empty() {
            return;
        }
        match next_wake {
            Some(at) => {
                tokio::select! {
                    _ = shared.wake.notified() => {}
                    _ = tokio::time::sleep_until(at.into()) => {}
                }
            }
            None => shared.wake.notified().await,
        }
    }
}

/// Puts every batch back (in order, per partition) and unmutes their partitions.
fn requeue_all(shared: &ProducerShared, batches: Vec<ClosedBatch>) {
    let mut acc = shared.acc.lock();
    for group in group_by_partition(batches) {
        let (topic, partition) = (group[0].topic.clone(), group[0].partition);
        acc.finish_in_flight(&topic, partition, group, None);
    }
    drop(acc);
    shared.wake.notify_one();
}

/// Splits batches into runs of one partition (drain keeps a partition's batches
/// together and in order).
fn group_by_partition(batches: Vec<ClosedBatch>) -> Vec<Vec<ClosedBatch>> {
    let mut groups: Vec<Vec<ClosedBatch>> = Vec::new();
    for b in batches {
        match groups.last_mut() {
            Some(g) if g[0].topic == b.topic && g[0].partition == b.partition => g.push(b),
            _ => groups.push(vec![b]),
        }
    }
    groups
}

fn complete(shared: &ProducerShared, batch: ClosedBatch, ack: BatchAck) {
    batch.completion.complete(Ok(ack));
    release(shared, &batch);
}

fn fail(shared: &ProducerShared, batch: ClosedBatch, error: Arc<ClientError>) {
    if shared.config.transactional_id.is_some() {
        // The open transaction cannot commit now.
        shared.txn_error.lock().get_or_insert_with(|| error.clone());
    }
    batch.completion.complete(Err(error));
    release(shared, &batch);
}

fn release(shared: &ProducerShared, batch: &ClosedBatch) {
    shared.buffer.add_permits(batch.reserved);
    shared.acc.lock().batch_done(batch.id);
    shared.progress.notify_waiters();
}

/// What became of one partition's batches in a request.
enum Outcome {
    Acked {
        base_offset: Offset,
        log_append_time_ms: Option<i64>,
    },
    Failed(ClientError),
}

/// An idempotent producer's identity: its id and epoch (taken from the cluster
/// before the first request) and the next sequence of every partition.
#[derive(Debug, Default)]
pub(crate) struct Identity {
    producer: Option<(i64, i16)>,
    next_sequence: HashMap<(Arc<str>, u32), i32>,
    /// The broker predates InitProducerId: send without ids.
    unsupported: bool,
    /// A transactional producer's transaction state (`transactional_id` set).
    pub txn: Option<super::txn::TxnState>,
}

impl Identity {
    pub(crate) fn new(txn: Option<super::txn::TxnState>) -> Identity {
        Identity {
            txn,
            ..Identity::default()
        }
    }

    /// Forgets the id (after a batch failed for good, or sequences ran out): the
    /// next request takes a new one and numbers from 0.
    fn reset(&mut self) {
        self.producer = None;
        self.next_sequence.clear();
    }

    /// A transactional producer's new id and epoch (from InitProducerId): its
    /// sequences start again.
    pub(crate) fn set_producer(&mut self, producer: (i64, i16)) {
        self.producer = Some(producer);
        self.next_sequence.clear();
    }

    pub(crate) fn producer(&self) -> Option<(i64, i16)> {
        self.producer
    }
}

/// Stamps the batches sent for the first time with the producer id and their
/// partition's next sequences (taking an id first if the producer has none).
async fn stamp(
    shared: &ProducerShared,
    groups: &mut [Vec<ClosedBatch>],
) -> Result<(), Arc<ClientError>> {
    if groups.iter().flatten().all(|b| b.stamp.is_some()) {
        return Ok(());
    }
    let mut id = shared.identity.lock().await;
    let transactional = id.txn.is_some();
    if transactional {
        add_to_transaction(shared, &mut id, groups).await?;
    }
    loop {
        if id.unsupported {
            return Ok(());
        }
        let (pid, epoch) = match id.producer {
            Some(p) => p,
            None if transactional => {
                return Err(Arc::new(ClientError::Config(
                    "the transactional producer has no producer id: call init_transactions (after a failed batch: abort_transaction)".into(),
                )));
            }
            None => match shared.client.init_producer_id().await {
                Ok(p) => {
                    tracing::debug!(producer_id = p.0, "idempotent producer id");
                    id.producer = Some(p);
                    id.next_sequence.clear();
                    p
                }
                Err(e) if e.code() == Some(ErrorCode::UnsupportedVersion) => {
                    tracing::warn!(
                        "the broker does not hand out producer ids (InitProducerId); \
                         sending without idempotence, so a retried batch may be written twice"
                    );
                    id.unsupported = true;
                    return Ok(());
                }
                Err(e) => {
                    return Err(Arc::new(ClientError::Failed {
                        context: "taking an idempotent producer id from the cluster".into(),
                        source: e.into_shared(),
                    }));
                }
            },
        };
        // Sequences are i32 per partition; one that would run past it takes a
        // new producer id instead of wrapping.
        let overflow = groups.iter().flatten().any(|b| {
            b.stamp.is_none()
                && id
                    .next_sequence
                    .get(&(b.topic.clone(), b.partition))
                    .is_some_and(|n| n.checked_add(b.record_count as i32).is_none())
        });
        if overflow {
            id.reset();
            continue;
        }
        for b in groups.iter_mut().flatten().filter(|b| b.stamp.is_none()) {
            let next = id
                .next_sequence
                .entry((b.topic.clone(), b.partition))
                .or_insert(0);
            let seq = *next;
            *next += b.record_count as i32;
            let mut bytes = BytesMut::from(&b.bytes[..]);
            rill_proto::batch::set_producer(&mut bytes, ProducerId(pid), epoch, seq);
            if transactional {
                rill_proto::batch::set_transactional(&mut bytes);
            }
            b.bytes = bytes.freeze();
            b.stamp = Some((pid, seq));
        }
        return Ok(());
    }
}

/// A transactional producer adds the partitions of its unstamped batches to
/// its open transaction before it sends them.
async fn add_to_transaction(
    shared: &ProducerShared,
    id: &mut Identity,
    groups: &[Vec<ClosedBatch>],
) -> Result<(), Arc<ClientError>> {
    let producer = id.producer;
    let txn = id.txn.as_mut().expect("a transactional producer");
    let Some(producer) = producer else {
        return Err(Arc::new(ClientError::Config(format!(
            "transactional producer {:?} has no producer id: call init_transactions (after a failed batch: abort_transaction)",
            txn.id
        ))));
    };
    if !txn.open {
        return Err(Arc::new(ClientError::Config(format!(
            "transactional producer {:?} sent records outside a transaction: call begin_transaction first",
            txn.id
        ))));
    }
    let new: Vec<(Arc<str>, u32)> = groups
        .iter()
        .flatten()
        .filter(|b| b.stamp.is_none())
        .map(|b| (b.topic.clone(), b.partition))
        .collect();
    super::txn::add_partitions(shared, txn, producer, &new)
        .await
        .map_err(Arc::new)
}

async fn send_request(
    shared: Arc<ProducerShared>,
    broker: i32,
    batches: Vec<ClosedBatch>,
    permit: OwnedSemaphorePermit,
) {
    let started = Instant::now();
    let mut groups = group_by_partition(batches);
    let stamped = if shared.config.is_idempotent() {
        stamp(&shared, &mut groups).await
    } else {
        Ok(())
    };
    let mut partitions = Vec::with_capacity(groups.len());
    let mut payload: Vec<Bytes> = Vec::with_capacity(groups.iter().map(Vec::len).sum());
    for g in &groups {
        let bytes_len: usize = g.iter().map(|b| b.bytes.len()).sum();
        partitions.push(ProducePartition {
            topic: g[0].topic.to_string(),
            partition: g[0].partition,
            bytes_len: bytes_len as u32,
        });
        payload.extend(g.iter().map(|b| b.bytes.clone()));
    }
    let timeout_ms = shared
        .client
        .config()
        .request_timeout
        .as_millis()
        .min(u32::MAX as u128) as u32;
    let req = ProduceRequest {
        acks: shared.config.acks,
        timeout_ms,
        partitions,
    };

    let outcomes: Vec<Outcome> = if let Err(e) = stamped {
        groups
            .iter()
            .map(|_| Outcome::Failed(ClientError::Shared(e.clone())))
            .collect()
    } else if shared.config.acks == Acks::None {
        match send_without_ack(&shared, broker, &req, &payload).await {
            Ok(()) => groups
                .iter()
                .map(|_| Outcome::Acked {
                    base_offset: Offset(-1),
                    log_append_time_ms: None,
                })
                .collect(),
            Err(e) => {
                let e = e.into_shared();
                groups
                    .iter()
                    .map(|_| Outcome::Failed(ClientError::Shared(e.clone())))
                    .collect()
            }
        }
    } else {
        let call = shared.client.call(Some(broker), &req, &payload);
        let result = if shared.config.is_idempotent() {
            // Resending is safe (the leader dedups), so a request the leader does
            // not answer is abandoned as soon as the cluster names another leader,
            // instead of waiting out the connection's idle timeout.
            let tps: Vec<(Arc<str>, u32)> = groups
                .iter()
                .map(|g| (g[0].topic.clone(), g[0].partition))
                .collect();
            tokio::select! {
                r = call => r,
                moved = leader_moved(&shared, broker, &tps) => Err(moved),
            }
        } else {
            call.await
        };
        match result {
            Ok((resp, _)) => groups
                .iter()
                .map(|g| {
                    let found = resp
                        .partitions
                        .iter()
                        .find(|r| *r.topic == *g[0].topic && r.partition == g[0].partition);
                    judge(found, &g[0].topic, g[0].partition)
                })
                .collect(),
            Err(e) => {
                let e = e.into_shared();
                groups
                    .iter()
                    .map(|_| Outcome::Failed(ClientError::Shared(e.clone())))
                    .collect()
            }
        }
    };
    drop(permit);

    let mut refresh = false;
    // (topic, partition, batches to retry, and their pause with whether the
    // error was about leadership)
    let mut settled = Vec::with_capacity(groups.len());
    for (group, outcome) in groups.into_iter().zip(outcomes) {
        let (topic, partition) = (group[0].topic.clone(), group[0].partition);
        match outcome {
            Outcome::Acked {
                base_offset,
                log_append_time_ms,
            } => {
                let mut base = base_offset;
                for b in group {
                    let next = if base.0 >= 0 {
                        base.plus(b.record_count as i64)
                    } else {
                        base
                    };
                    complete(
                        &shared,
                        b,
                        BatchAck {
                            base_offset: base,
                            log_append_time_ms,
                        },
                    );
                    base = next;
                }
                settled.push((topic, partition, Vec::new(), None));
            }
            Outcome::Failed(error) => {
                let now = Instant::now();
                let retry = group.iter().map(|b| b.attempts).max().unwrap_or(0) + 1;
                let deadline = group.iter().map(|b| b.created).min().unwrap_or(now)
                    + shared.config.delivery_timeout;
                // A retry that cannot start before the deadline fails now, with
                // its error; a longer pause ends at the deadline, where the
                // batch expires unless a new leader was named before.
                let deadline_ok = now + shared.config.retry_backoff < deadline;
                let backoff = shared
                    .config
                    .retry_backoff_for(retry)
                    .min(deadline.saturating_duration_since(now));
                let attempts_ok = group.iter().all(|b| b.attempts < shared.config.retries);
                if error.is_retriable() && deadline_ok && attempts_ok {
                    tracing::debug!(%topic, partition, %error, "produce will be retried");
                    // Whether the leader may have moved.
                    let leadership = error.code().is_some_and(needs_metadata_refresh)
                        || matches!(error, ClientError::Shared(ref e) if matches!(**e, ClientError::Net(_)));
                    refresh |= leadership;
                    let batches = group
                        .into_iter()
                        .map(|mut b| {
                            b.attempts += 1;
                            b
                        })
                        .collect();
                    settled.push((topic, partition, batches, Some((backoff, leadership))));
                } else {
                    let error = Arc::new(ClientError::Failed {
                        context: format!("produce to {topic}-{partition} failed"),
                        source: error.into_shared(),
                    });
                    // The leader may or may not hold these sequences now: later
                    // batches of the partition could not follow them, so the
                    // producer takes a new id.
                    if let Some((pid, _)) = group.iter().find_map(|b| b.stamp) {
                        let mut id = shared.identity.lock().await;
                        // (A transactional producer keeps its id: the failed
                        // transaction aborts, and the abort takes a new epoch.)
                        if id.txn.is_none() && id.producer.is_some_and(|(p, _)| p == pid) {
                            id.reset();
                        }
                    }
                    for b in group {
                        fail(&shared, b, error.clone());
                    }
                    settled.push((topic, partition, Vec::new(), None));
                }
            }
        }
    }
    if refresh && let Err(e) = shared.client.refresh_metadata(started).await {
        tracing::debug!(error = %e, "metadata refresh after a produce error failed");
    }
    let now = Instant::now();
    {
        let mut acc = shared.acc.lock();
        for (topic, partition, retry, backoff) in settled {
            let backoff = backoff.map(|(b, leadership)| Backoff {
                until: now + b,
                from: leadership.then_some(broker),
            });
            acc.finish_in_flight(&topic, partition, retry, backoff);
        }
    }
    shared.wake.notify_one();
}

/// How long a produce request may go unanswered before the producer asks
/// another broker whether its partitions' leader moved, and how often after.
const LEADER_CHECK_AFTER: Duration = Duration::from_millis(250);
const LEADER_CHECK_EVERY: Duration = Duration::from_millis(150);

/// Resolves once a broker other than `broker` names another leader for one of
/// `tps` (never, while `broker` stays their leader).
async fn leader_moved(
    shared: &ProducerShared,
    broker: i32,
    tps: &[(Arc<str>, u32)],
) -> ClientError {
    let mut topics: Vec<String> = tps.iter().map(|(t, _)| t.to_string()).collect();
    topics.sort();
    topics.dedup();
    tokio::time::sleep(LEADER_CHECK_AFTER).await;
    loop {
        let asked = shared
            .client
            .refresh_metadata_avoiding(broker, topics.clone(), LEADER_CHECK_EVERY * 4)
            .await;
        if asked.is_ok() {
            let moved = tps.iter().find_map(|(t, p)| {
                shared
                    .client
                    .leader(t, *p)
                    .filter(|l| *l != broker)
                    .map(|l| (t, p, l))
            });
            if let Some((t, p, leader)) = moved {
                return ClientError::broker(
                    format!("produce to {t}-{p}"),
                    ErrorInfo::new(
                        ErrorCode::NotLeaderOrFollower,
                        format!(
                            "broker {broker} did not answer and the cluster now names broker \
                             {leader} leader of {t}-{p}; resending there"
                        ),
                    ),
                );
            }
        }
        tokio::time::sleep(LEADER_CHECK_EVERY).await;
    }
}

fn judge(found: Option<&ProducePartitionResponse>, topic: &str, partition: u32) -> Outcome {
    match found {
        None => Outcome::Failed(ClientError::Config(format!(
            "the broker's produce response does not mention {topic}-{partition}: is the broker a compatible version?"
        ))),
        Some(r) => match &r.error {
            None => Outcome::Acked {
                base_offset: r.base_offset,
                log_append_time_ms: r.log_append_time_ms,
            },
            // Written long ago (older than the leader's sequence window): delivered,
            // at an offset the leader no longer knows.
            Some(e) if e.code == ErrorCode::DuplicateSequence => Outcome::Acked {
                base_offset: Offset(-1),
                log_append_time_ms: None,
            },
            Some(e) => Outcome::Failed(ClientError::Broker {
                context: format!("produce to {topic}-{partition}"),
                error: e.clone(),
            }),
        },
    }
}

/// acks=0: send the request and wait until the broker has handled it. The broker
/// sends no produce response for acks=0; it finishes the stream empty once the
/// batches are appended (or answers a frame with the error that refused them).
///
/// Waiting for that end of stream, not merely for the transport acknowledgement
/// of the bytes, is what makes acks=0 keep order and `flush`/`close` mean
/// something: the next request of a partition goes out only after the broker
/// appended the previous one (the broker handles streams concurrently, so two
/// requests both sitting in its receive buffer could be appended in either
/// order), and a client that exits after `close` has not left records in the
/// broker's receive buffer, where closing the connection would discard them.
async fn send_without_ack(
    shared: &ProducerShared,
    broker: i32,
    req: &ProduceRequest,
    payload: &[Bytes],
) -> Result<(), ClientError> {
    no_response_is_success(shared.client.call(Some(broker), req, payload).await)
}

/// Judges an acks=0 call: the stream ending without a frame means the broker
/// handled the request and had nothing to say; a frame is either an error
/// (returned) or, from a broker that answers acks=0 anyway, a response.
fn no_response_is_success<T>(result: Result<T, ClientError>) -> Result<(), ClientError> {
    match result {
        Ok(_) | Err(ClientError::Net(rill_net::NetError::NoFrame)) => Ok(()),
        Err(e) => Err(e),
    }
}
