//! The async shell around the [`TxnCoordinator`]: the transactional apis'
//! handlers, `__transaction_state`, the marker writes, and the timer.
//!
//! `__transaction_state` is an internal topic like `__consumer_offsets`
//! (compacted, replicated, created on first use; [`crate::internal_topics`]):
//! the coordinator of a transactional id is the leader of the partition the id
//! hashes to. Every state change of an id is one record there (key: the id,
//! value: its [`TxnMeta`]), appended and replicated to every in-sync replica
//! (acks=all) before the change is answered.
//!
//! Loading: a request for an id whose partition this broker leads, but has not
//! loaded in the partition's current leader epoch, replays the partition first
//! (and the timer does it within [`TXN_TICK_INTERVAL`] of a leadership change).
//! Transactions that were preparing (their commit or abort decided, markers
//! not all written) are finished by the new coordinator: it writes their
//! markers again (a marker is idempotent for the partition's reader: a second
//! commit of a closed transaction changes nothing) and completes them.
//!
//! Markers: for each partition of the transaction, its leader appends the
//! marker and waits until it is replicated: this broker directly when it leads
//! the partition, another broker through WriteTxnMarkers. Failures are retried
//! until they succeed, the partition is gone (a deleted topic), or this broker
//! stops coordinating the id; EndTxn answers once all markers are written
//! (or RequestTimedOut after [`END_TXN_WAIT`], the markers still being written).
//!
//! Locking: one async mutex over the coordinator, held across the append of a
//! state record (so records are appended in step order) but never across
//! marker writes. Throughput of transaction starts and ends is bounded by that
//! (one replicated append at a time per broker); data records do not pass here.
//!
//! Not yet: the group offsets of a transaction (AddOffsetsToTxn /
//! TxnOffsetCommit), KIP-890's check that a transactional batch's partition
//! was added to its transaction, and ACLs on transactional ids (the topics'
//! write ACLs and IdempotentWrite apply).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rill_proto::Rope;
use rill_proto::control::{Marker, MarkerKind};
use rill_proto::types::now_ms;
use rill_proto::wire::*;
use rill_proto::{BatchBuilder, Compression, LeaderEpoch, ProducerId, Record};

use super::coordinator::{Effect, Input, MarkerJob, Reply, TxnCoordinator, TxnMeta, TxnStatus};
use crate::cluster::api as cluster_api;
use crate::group::records::{split_version, versioned};
use crate::internal_topics;
use crate::partition::{Partition, Topic};
use crate::state::BrokerState;

/// The coordinators' state topic.
pub const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";
/// How often transactions are checked for timeouts, unfinished markers and
/// leadership changes of `__transaction_state`.
pub const TXN_TICK_INTERVAL: Duration = Duration::from_millis(500);
/// Longest EndTxn waits for its markers before answering REQUEST_TIMED_OUT
/// (they are still written after).
pub const END_TXN_WAIT: Duration = Duration::from_secs(30);
/// Longest a state record or a marker waits to reach every in-sync replica.
const REPLICATION_WAIT: Duration = Duration::from_secs(5);
/// Longest an ended transaction's drop of its pending group offsets is tried.
const DROP_PENDING_WAIT: Duration = Duration::from_secs(3);
/// Bound on one call recording or dropping pending group offsets at another
/// broker (a dead group coordinator must not hold a transaction up).
const PENDING_CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause between attempts to write a transaction's markers.
const MARKER_RETRY: Duration = Duration::from_millis(200);
/// Bound on one WriteTxnMarkers call to another broker.
const MARKER_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Key version of a transactional id's record; value version of its state.
const TXN_KEY_VERSION: u16 = 0;
const TXN_VALUE_VERSION: u16 = 0;

/// The transaction coordinator of this broker.
#[derive(Debug, Default)]
pub struct TxnService {
    inner: tokio::sync::Mutex<Inner>,
    creating: tokio::sync::Mutex<()>,
    /// Woken when a marker writer finishes (or gives up): EndTxn waits on it.
    markers_done: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Inner {
    coordinator: TxnCoordinator,
    /// Partitions of `__transaction_state` loaded here, in which leader epoch.
    loaded: BTreeMap<u32, LeaderEpoch>,
    /// Transactional ids whose markers are being written.
    writing: BTreeSet<String>,
}

/// The record of one id's state.
fn encode(meta: &TxnMeta) -> (Bytes, Bytes) {
    (
        versioned(TXN_KEY_VERSION, &(&meta.transactional_id,)),
        versioned(TXN_VALUE_VERSION, meta),
    )
}

/// Decodes a record; `Ok(None)`: a key version this build does not know, or a
/// tombstone.
fn decode(key: &[u8], value: Option<&[u8]>) -> Result<Option<TxnMeta>, String> {
    let (version, _) = split_version(key, "key")?;
    if version != TXN_KEY_VERSION {
        return Ok(None);
    }
    let Some(value) = value else {
        return Ok(None);
    };
    let (version, body) = split_version(value, "value")?;
    if version != TXN_VALUE_VERSION {
        return Err(format!("unknown value version {version}"));
    }
    postcard::from_bytes(body)
        .map(Some)
        .map_err(|e| format!("transaction state does not decode: {e}"))
}

async fn state_topic(state: &Arc<BrokerState>) -> Result<Arc<Topic>, ErrorInfo> {
    internal_topics::ensure(
        state,
        TRANSACTION_STATE_TOPIC,
        state.config.transaction_state_num_partitions,
        state.config.transaction_state_replication_factor,
        &state.txns.creating,
    )
    .await
}

/// The transactional id's partition of `__transaction_state`: its index,
/// and its log here (NOT_COORDINATOR where this broker is no replica of it).
fn partition_of(
    state: &BrokerState,
    topic: &Topic,
    transactional_id: &str,
) -> Result<(u32, Arc<Partition>), ErrorInfo> {
    let index = partition_index(topic, transactional_id);
    let p = topic.partition(index).cloned().ok_or_else(|| {
        internal_topics::not_coordinator_here(
            state.config.id,
            TRANSACTION_STATE_TOPIC,
            index,
            &format!("transactional id {transactional_id:?}"),
        )
    })?;
    Ok((index, p))
}

fn partition_index(topic: &Topic, transactional_id: &str) -> u32 {
    internal_topics::coordinator_partition(transactional_id, topic.partitions.len() as u32)
}

fn validate_id(id: &str) -> Result<(), ErrorInfo> {
    if id.is_empty() || id.len() > 255 || id.chars().any(char::is_control) {
        return Err(ErrorInfo::new(
            ErrorCode::InvalidRequest,
            format!(
                "transactional id {id:?} is not valid: 1 to 255 characters, no control characters"
            ),
        ));
    }
    Ok(())
}

fn not_coordinator(state: &BrokerState, p: &Partition) -> ErrorInfo {
    let led_by = match p.leader() {
        Some(l) if l == state.config.id => "is led here but not loaded yet".to_string(),
        Some(l) => format!("is led by broker {l}"),
        None => "has no leader right now".to_string(),
    };
    ErrorInfo::new(
        ErrorCode::NotCoordinator,
        format!(
            "broker {} is not the transaction coordinator of {TRANSACTION_STATE_TOPIC}-{} (it {led_by}): ask FindCoordinator again",
            state.config.id,
            p.index()
        ),
    )
}

impl TxnService {
    /// The coordinator state for `id`'s partition, loaded in its current
    /// leader epoch (loading it now if needed); NOT_COORDINATOR if this broker
    /// does not lead it.
    async fn coordinate(
        &self,
        state: &Arc<BrokerState>,
        id: &str,
    ) -> Result<(tokio::sync::MutexGuard<'_, Inner>, Arc<Partition>), ErrorInfo> {
        validate_id(id)?;
        let topic = state_topic(state).await?;
        let (index, p) = partition_of(state, &topic, id)?;
        if !p.is_leader() {
            return Err(not_coordinator(state, &p));
        }
        let mut inner = self.inner.lock().await;
        self.load_locked(state, &topic, index, &p, &mut inner)?;
        Ok((inner, p))
    }

    /// Loads partition `index` if it is not loaded in `p`'s current epoch.
    fn load_locked(
        &self,
        state: &Arc<BrokerState>,
        topic: &Topic,
        index: u32,
        p: &Arc<Partition>,
        inner: &mut Inner,
    ) -> Result<(), ErrorInfo> {
        let epoch = p.leader_epoch();
        if inner.loaded.get(&index) == Some(&epoch) {
            return Ok(());
        }
        let n = topic.partitions.len() as u32;
        inner
            .coordinator
            .retain(|id| internal_topics::coordinator_partition(id, n) != index);
        let mut loaded = TxnCoordinator::default();
        let count = replay(&mut loaded, p)?;
        let now = now_ms();
        for meta in loaded.all().cloned().collect::<Vec<_>>() {
            inner.coordinator.step(now, Input::Replay(meta));
        }
        inner.loaded.insert(index, epoch);
        tracing::info!(
            partition = index,
            records = count,
            %epoch,
            "loaded transaction coordinator state"
        );
        // Transactions decided but not completed: finish them.
        for job in loaded.unfinished() {
            spawn_markers(state, inner, job);
        }
        Ok(())
    }

    /// Forgets partitions no longer led here; aborts transactions past their
    /// timeout; restarts marker writes that stopped.
    async fn tick(&self, state: &Arc<BrokerState>) {
        let Some(topic) = state.registry.topic(TRANSACTION_STATE_TOPIC) else {
            return;
        };
        let n = topic.partitions.len() as u32;
        let mut inner = self.inner.lock().await;
        let gone: Vec<u32> = inner
            .loaded
            .iter()
            .filter(|(i, epoch)| {
                topic
                    .partition(**i)
                    .is_none_or(|p| !p.is_leader() || p.leader_epoch() != **epoch)
            })
            .map(|(i, _)| *i)
            .collect();
        for index in gone {
            inner.loaded.remove(&index);
            inner
                .coordinator
                .retain(|id| internal_topics::coordinator_partition(id, n) != index);
        }
        // Led here but not loaded (a new leadership): load it now.
        for (index, p) in topic.partitions.iter().enumerate() {
            let Some(p) = p else { continue };
            if p.is_leader()
                && inner.loaded.get(&(index as u32)) != Some(&p.leader_epoch())
                && let Err(e) = self.load_locked(state, &topic, index as u32, p, &mut inner)
            {
                tracing::warn!(partition = index, error = %e, "could not load transaction state");
            }
        }
        let stepped = inner.coordinator.step(now_ms(), Input::Tick);
        let _ = apply(state, &topic, &mut inner, stepped.effects).await;
        // Decided transactions whose marker writer stopped (it gave up when
        // this broker lost the partition, and the partition came back).
        let stalled: Vec<MarkerJob> = inner
            .coordinator
            .unfinished()
            .into_iter()
            .filter(|j| !inner.writing.contains(&j.transactional_id))
            .collect();
        for job in stalled {
            spawn_markers(state, &mut inner, job);
        }
    }
}

/// Replays every record of `p` into `coordinator`. Returns how many.
fn replay(coordinator: &mut TxnCoordinator, p: &Partition) -> Result<usize, ErrorInfo> {
    let now = now_ms();
    crate::internal_topics::replay(
        p,
        "its transactional ids are unavailable",
        |_, key, value| match decode(key, value).map_err(|e| e.to_string())? {
            Some(meta) => {
                coordinator.step(now, Input::Replay(meta));
                Ok(true)
            }
            None => Ok(false),
        },
    )
}

/// Appends `meta` to its partition of `__transaction_state` and waits until
/// every in-sync replica has it.
async fn persist(state: &BrokerState, topic: &Topic, meta: &TxnMeta) -> Result<(), ErrorInfo> {
    let (_, p) = partition_of(state, topic, &meta.transactional_id)?;
    cluster_api::check_produce(state, &p, Acks::All)?;
    let (key, value) = encode(meta);
    let now = now_ms();
    let mut b = BatchBuilder::new(Compression::None);
    b.push(&Record {
        key: Some(key),
        value: Some(value),
        headers: Vec::new(),
        timestamp_ms: now,
    });
    let batch = Rope::from(b.build());
    // On this task unless the append could wait on the disk or on the log's
    // mutex (a roll, retention, a compaction's plan or swap hold it).
    let info = p.append_from_task(batch, now).await?;
    cluster_api::wait_replicated(
        state,
        &p,
        info.last_offset.plus(1),
        tokio::time::Instant::now() + REPLICATION_WAIT,
    )
    .await
}

/// Carries out a step's effects in order: persists states, starts marker
/// writes. On a failed append the partition is unloaded (its next use
/// replays the log, the truth), and the error is returned.
async fn apply(
    state: &Arc<BrokerState>,
    topic: &Topic,
    inner: &mut Inner,
    effects: Vec<Effect>,
) -> Result<(), ErrorInfo> {
    for effect in effects {
        match effect {
            Effect::Persist(meta) => {
                if let Err(e) = persist(state, topic, &meta).await {
                    let n = topic.partitions.len() as u32;
                    let index = internal_topics::coordinator_partition(&meta.transactional_id, n);
                    tracing::warn!(transactional_id = %meta.transactional_id, error = %e, "could not persist transaction state; reloading");
                    inner.loaded.remove(&index);
                    inner
                        .coordinator
                        .retain(|id| internal_topics::coordinator_partition(id, n) != index);
                    return Err(not_coordinator_if_moved(e));
                }
            }
            Effect::WriteMarkers(job) => spawn_markers(state, inner, job),
        }
    }
    Ok(())
}

fn not_coordinator_if_moved(e: ErrorInfo) -> ErrorInfo {
    if e.code == ErrorCode::NotLeaderOrFollower {
        ErrorInfo::new(ErrorCode::NotCoordinator, e.message)
    } else {
        e
    }
}

/// Writes `job`'s markers in the background, then completes the transaction.
fn spawn_markers(state: &Arc<BrokerState>, inner: &mut Inner, job: MarkerJob) {
    if !inner.writing.insert(job.transactional_id.clone()) {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        let id = job.transactional_id.clone();
        let result = finish(&state, job).await;
        state.txns.inner.lock().await.writing.remove(&id);
        state.txns.markers_done.notify_waiters();
        if let Err(e) = result {
            tracing::warn!(transactional_id = %id, error = %e, "transaction markers not finished here");
        }
    });
}

/// Writes the markers until they are all written, then completes the
/// transaction (a state record).
async fn finish(state: &Arc<BrokerState>, job: MarkerJob) -> Result<(), ErrorInfo> {
    let topic = state_topic(state).await?;
    let (index, p) = partition_of(state, &topic, &job.transactional_id)?;
    let epoch = p.leader_epoch();
    loop {
        if !p.is_leader() || p.leader_epoch() != epoch || state.shutdown.is_cancelled() {
            return Err(not_coordinator(state, &p));
        }
        let written = match write_markers(state, &job, epoch).await {
            Ok(()) => commit_offsets(state, &job).await,
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => break,
            Err(e) => {
                tracing::debug!(transactional_id = %job.transactional_id, error = %e, "transaction markers: retrying");
                tokio::time::sleep(MARKER_RETRY).await;
            }
        }
    }
    let mut inner = state.txns.inner.lock().await;
    if inner.loaded.get(&index) != Some(&epoch) {
        return Err(not_coordinator(state, &p));
    }
    let stepped = inner.coordinator.step(
        now_ms(),
        Input::MarkersWritten {
            transactional_id: job.transactional_id.clone(),
        },
    );
    apply(state, &topic, &mut inner, stepped.effects).await
}

/// One attempt at every marker of `job`: Ok when all are written.
async fn write_markers(
    state: &Arc<BrokerState>,
    job: &MarkerJob,
    coordinator_epoch: LeaderEpoch,
) -> Result<(), ErrorInfo> {
    let marker = Marker {
        kind: job.kind,
        coordinator_epoch: coordinator_epoch.0,
    };
    let mut remote: BTreeMap<i32, Vec<(String, u32)>> = BTreeMap::new();
    for (topic, index) in &job.partitions {
        // A deleted topic holds no transaction any more.
        let Some(t) = state.registry.topic(topic).filter(|t| *index < t.count()) else {
            continue;
        };
        match (state.leader_of(&t, *index), t.partition(*index)) {
            (Some(l), Some(p)) if l == state.config.id => {
                write_local_marker(state, p, job.producer_id, job.epoch, marker).await?;
            }
            (Some(l), _) if l != state.config.id => {
                remote.entry(l).or_default().push((topic.clone(), *index))
            }
            (_, Some(p)) => return Err(p.not_leader_error()),
            (_, None) => {
                return Err(ErrorInfo::new(
                    ErrorCode::NotLeaderOrFollower,
                    format!("{topic}-{index} has no leader right now: the markers wait for one"),
                ));
            }
        }
    }
    for (broker, partitions) in remote {
        let addr = state
            .cluster
            .image()
            .brokers
            .get(&broker)
            .map(|b| b.addr.clone())
            .ok_or_else(|| {
                ErrorInfo::new(
                    ErrorCode::BrokerNotAvailable,
                    format!("broker {broker} is not registered"),
                )
            })?;
        let req = WriteTxnMarkersRequest {
            producer_id: job.producer_id,
            producer_epoch: job.epoch,
            kind: job.kind,
            coordinator_epoch: coordinator_epoch.0,
            topics: txn_topics(partitions),
        };
        let (resp, _) = state
            .cluster
            .links
            .call(&addr, &req, MARKER_CALL_TIMEOUT)
            .await
            .map_err(|e| ErrorInfo::new(ErrorCode::BrokerNotAvailable, e.to_string()))?;
        for r in resp.results {
            if let Some(e) = r.error
                && e.code != ErrorCode::UnknownTopicOrPartition
            {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// `(topic, partition)` pairs grouped by topic, topics in name order.
fn txn_topics(partitions: impl IntoIterator<Item = (String, u32)>) -> Vec<TxnTopic> {
    let mut topics: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (t, i) in partitions {
        topics.entry(t).or_default().push(i);
    }
    topics
        .into_iter()
        .map(|(topic, partitions)| TxnTopic { topic, partitions })
        .collect()
}

/// Stores a committed transaction's group offsets at each group's
/// coordinator and drops its pending offsets there; for an aborted one, only
/// the latter, and best effort (they expire with the transaction's timeout
/// anyway, and an abort must not wait for a group coordinator).
async fn commit_offsets(state: &Arc<BrokerState>, job: &MarkerJob) -> Result<(), ErrorInfo> {
    for (group, partitions) in &job.offsets {
        if job.kind == MarkerKind::Abort {
            drop_pending(state, &job.transactional_id, group).await;
            continue;
        }
        let req = CommitTxnOffsetsRequest {
            transactional_id: job.transactional_id.clone(),
            group_id: group.clone(),
            partitions: partitions.clone(),
            pending_for_ms: None,
        };
        to_group_coordinator(state, req, MARKER_CALL_TIMEOUT).await?;
    }
    Ok(())
}

/// Has `group`'s coordinator drop the pending offsets of `transactional_id`
/// (an aborted or ended transaction's): attempts for up to about
/// [`DROP_PENDING_WAIT`] (an abort waits for it), then they expire.
async fn drop_pending(state: &Arc<BrokerState>, transactional_id: &str, group: &str) {
    // (Not cancelled mid-call: a local drop is a group coordinator step.)
    let deadline = tokio::time::Instant::now() + DROP_PENDING_WAIT;
    loop {
        let req = CommitTxnOffsetsRequest {
            transactional_id: transactional_id.to_string(),
            group_id: group.to_string(),
            partitions: Vec::new(),
            pending_for_ms: None,
        };
        match to_group_coordinator(state, req, PENDING_CALL_TIMEOUT).await {
            Ok(()) => return,
            Err(e) if tokio::time::Instant::now() + MARKER_RETRY >= deadline => {
                tracing::info!(
                    transactional_id, group, error = %e,
                    "the ended transaction's pending offsets were not dropped (they expire)"
                );
                return;
            }
            Err(_) => tokio::time::sleep(MARKER_RETRY).await,
        }
    }
}

/// Sends `req` to the coordinator of its group (this broker or another).
async fn to_group_coordinator(
    state: &Arc<BrokerState>,
    req: CommitTxnOffsetsRequest,
    call_timeout: Duration,
) -> Result<(), ErrorInfo> {
    let found = crate::group::service::find_coordinator_api(
        state,
        FindCoordinatorRequest {
            group_id: req.group_id.clone(),
            kind: CoordinatorKind::Group,
        },
    )
    .await;
    if let Some(e) = found.error {
        return Err(e);
    }
    let resp = if found.coordinator_id == state.config.id {
        crate::group::service::commit_txn_offsets(state, req).await
    } else {
        state
            .cluster
            .links
            .call(&found.coordinator_addr, &req, call_timeout)
            .await
            .map_err(|e| ErrorInfo::new(ErrorCode::BrokerNotAvailable, e.to_string()))?
            .0
    };
    match resp
        .error
        .or_else(|| resp.partitions.into_iter().find_map(|p| p.error))
    {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Appends a marker to `p` (led here) and waits until it is replicated.
async fn write_local_marker(
    state: &BrokerState,
    p: &Arc<Partition>,
    producer_id: i64,
    producer_epoch: i16,
    marker: Marker,
) -> Result<(), ErrorInfo> {
    cluster_api::check_produce(state, p, Acks::All)?;
    let now = now_ms();
    let offset = p
        .append_marker_from_task(ProducerId(producer_id), producer_epoch, marker, now)
        .await?;
    cluster_api::wait_replicated(
        state,
        p,
        offset.plus(1),
        tokio::time::Instant::now() + REPLICATION_WAIT,
    )
    .await
}

/// Runs the transaction timer until shutdown.
pub(crate) async fn timer_loop(state: Arc<BrokerState>) {
    let mut interval = tokio::time::interval(TXN_TICK_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = state.shutdown.cancelled() => return,
        }
        state.txns.tick(&state).await;
    }
}

// ---------------------------------------------------------------- the apis

/// InitProducerId with a transactional id.
pub(crate) async fn init_producer_id(
    state: &Arc<BrokerState>,
    id: &str,
    timeout_ms: i32,
) -> Result<InitProducerIdResponse, ErrorInfo> {
    // A fresh id, used only if the transactional id is new (or exhausted its
    // epochs): allocated through the quorum before the coordinator is locked.
    let known = {
        let (inner, _) = state.txns.coordinate(state, id).await?;
        inner.coordinator.get(id).map(|m| m.producer_id)
    };
    let fresh = match known {
        Some(pid) => pid,
        None => cluster_api::init_producer_id(state).await?.producer_id,
    };
    let (mut inner, _) = state.txns.coordinate(state, id).await?;
    let topic = state_topic(state).await?;
    let stepped = inner.coordinator.step(
        now_ms(),
        Input::InitProducerId {
            transactional_id: id.to_string(),
            timeout_ms,
            fresh_producer_id: fresh,
        },
    );
    apply(state, &topic, &mut inner, stepped.effects).await?;
    match stepped.reply? {
        Reply::Producer { producer_id, epoch } => Ok(InitProducerIdResponse {
            producer_id,
            producer_epoch: epoch,
        }),
        other => Err(ErrorInfo::new(
            ErrorCode::InternalError,
            format!("InitProducerId answered {other:?}"),
        )),
    }
}

pub(crate) async fn add_partitions(
    state: &Arc<BrokerState>,
    req: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let result = async {
        let mut partitions = Vec::new();
        for t in &req.topics {
            for i in &t.partitions {
                // Unknown partitions are refused before they enter a transaction
                // (the coordinator need not be one of their replicas).
                state.registry.check_exists(&t.topic, *i)?;
                partitions.push((t.topic.clone(), *i));
            }
        }
        let (mut inner, _) = state.txns.coordinate(state, &req.transactional_id).await?;
        let topic = state_topic(state).await?;
        let stepped = inner.coordinator.step(
            now_ms(),
            Input::AddPartitions {
                transactional_id: req.transactional_id.clone(),
                producer_id: req.producer_id,
                epoch: req.producer_epoch,
                partitions,
            },
        );
        apply(state, &topic, &mut inner, stepped.effects).await?;
        stepped.reply.map(|_| ())
    }
    .await;
    AddPartitionsToTxnResponse {
        error: result.err(),
    }
}

pub(crate) async fn end_txn(state: &Arc<BrokerState>, req: EndTxnRequest) -> EndTxnResponse {
    let result = async {
        let (mut inner, p) = state.txns.coordinate(state, &req.transactional_id).await?;
        let epoch = p.leader_epoch();
        let topic = state_topic(state).await?;
        let stepped = inner.coordinator.step(
            now_ms(),
            Input::EndTxn {
                transactional_id: req.transactional_id.clone(),
                producer_id: req.producer_id,
                epoch: req.producer_epoch,
                commit: req.commit,
            },
        );
        apply(state, &topic, &mut inner, stepped.effects).await?;
        drop(inner);
        match stepped.reply? {
            Reply::AfterMarkers => {}
            _ => return Ok(()),
        }
        // Wait for the markers (written by the task `apply` started).
        let deadline = tokio::time::Instant::now() + END_TXN_WAIT;
        loop {
            let done = state.txns.markers_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            {
                let inner = state.txns.inner.lock().await;
                let status = inner.coordinator.get(&req.transactional_id).map(|m| m.status);
                use super::coordinator::TxnStatus::*;
                match status {
                    Some(CompleteCommit | CompleteAbort | Empty | Ongoing) => return Ok(()),
                    Some(PrepareCommit | PrepareAbort) => {}
                    None => return Err(not_coordinator(state, &p)),
                }
            }
            if p.leader_epoch() != epoch || !p.is_leader() {
                return Err(not_coordinator(state, &p));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ErrorInfo::new(
                    ErrorCode::RequestTimedOut,
                    format!(
                        "the markers of {:?}'s transaction were not all written within {END_TXN_WAIT:?}; \
                         it is decided and will complete: retry EndTxn",
                        req.transactional_id
                    ),
                ));
            }
            tokio::select! {
                _ = done => {}
                // A leadership change is seen by the next round at the latest.
                _ = tokio::time::sleep(TXN_TICK_INTERVAL) => {}
            }
        }
    }
    .await;
    EndTxnResponse {
        error: result.err(),
    }
}

/// TxnOffsetCommit: a group's offsets into the producer's transaction. A
/// broker that does not coordinate the transactional id forwards it to the
/// one that does (Kafka clients send it to the group's coordinator).
pub(crate) async fn txn_offset_commit(
    state: &Arc<BrokerState>,
    req: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let result = async {
        crate::group::coordinator::validate_group_id(&req.group_id)?;
        let local = state.txns.coordinate(state, &req.transactional_id).await;
        let (mut inner, _) = match local {
            Ok(found) => found,
            Err(e) if e.code == ErrorCode::NotCoordinator => {
                return forward(state, &req).await;
            }
            Err(e) => return Err(e),
        };
        let topic = state_topic(state).await?;
        let stepped = inner.coordinator.step(
            now_ms(),
            Input::AddOffsets {
                transactional_id: req.transactional_id.clone(),
                producer_id: req.producer_id,
                epoch: req.producer_epoch,
                group_id: req.group_id.clone(),
                offsets: req.partitions.clone(),
            },
        );
        apply(state, &topic, &mut inner, stepped.effects).await?;
        stepped.reply?;
        // The group's coordinator learns which of the group's partitions
        // have offsets pending in this open transaction (OffsetFetch with
        // require_stable answers UNSTABLE_OFFSET_COMMIT for them until it
        // ends), before the producer hears its offsets are in: so it cannot
        // commit first. All of them, not only this request's: the record
        // replaces the transaction's previous one for the group.
        let Some(m) = inner.coordinator.get(&req.transactional_id) else {
            return Ok(());
        };
        let this_transaction = (m.producer_id, m.epoch, m.started_ms);
        let partitions: Vec<OffsetCommitPartition> = m
            .offsets
            .iter()
            .filter(|((group, _, _), _)| *group == req.group_id)
            .map(
                |((_, topic, partition), (offset, metadata))| OffsetCommitPartition {
                    topic: topic.clone(),
                    partition: *partition,
                    offset: rill_proto::Offset(*offset),
                    metadata: metadata.clone(),
                },
            )
            .collect();
        // The transaction times out after its timeout (then an abort drops
        // the record); twice that leaves a commit room to write its markers.
        let pending_for_ms = 2 * i64::from(m.timeout_ms.max(0));
        drop(inner);
        if partitions.is_empty() {
            return Ok(());
        }
        let pending = CommitTxnOffsetsRequest {
            transactional_id: req.transactional_id.clone(),
            group_id: req.group_id.clone(),
            partitions,
            pending_for_ms: Some(pending_for_ms),
        };
        // (A short call: while the group's coordinator is down, the producer
        // retries; a long wait here would run its transaction out of time.)
        let registered = to_group_coordinator(state, pending, PENDING_CALL_TIMEOUT).await;
        // The transaction may have ended meanwhile, its end dropping nothing
        // yet to drop: drop it now, but only if the id still holds that very
        // transaction, ended (a new epoch, after a timeout or a new instance,
        // may have registered offsets of its own under the same key: those
        // stay, and the late record goes with that transaction's end or its
        // expiry).
        let ended = {
            let inner = state.txns.inner.lock().await;
            inner
                .coordinator
                .get(&req.transactional_id)
                .is_some_and(|m| {
                    (m.producer_id, m.epoch, m.started_ms) == this_transaction
                        && m.status != TxnStatus::Ongoing
                })
        };
        if registered.is_ok() && ended {
            drop_pending(state, &req.transactional_id, &req.group_id).await;
        }
        registered.map_err(|e| {
            ErrorInfo::new(
                if e.code.is_retriable() {
                    e.code
                } else {
                    ErrorCode::CoordinatorNotAvailable
                },
                format!(
                    "group {}: the offsets are in the transaction, but its coordinator has not \
                     recorded them as pending yet: retry ({})",
                    req.group_id, e.message
                ),
            )
        })
    }
    .await;
    TxnOffsetCommitResponse {
        error: result.err(),
    }
}

/// DescribeTransactions: the state of the ids this broker coordinates,
/// NOT_COORDINATOR for the others (an admin asks each id's coordinator).
pub(crate) async fn describe_transactions(
    state: &Arc<BrokerState>,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut transactions = Vec::with_capacity(req.transactional_ids.len());
    for id in req.transactional_ids {
        let not_found = || {
            ErrorInfo::new(
                ErrorCode::TransactionalIdNotFound,
                format!(
                    "transactional id {id:?} is not known to its coordinator (broker {})",
                    state.config.id
                ),
            )
        };
        // (No transaction ever ran: no state topic to create for a describe.)
        let found = if state.registry.topic(TRANSACTION_STATE_TOPIC).is_none() {
            validate_id(&id).and_then(|()| Err(not_found()))
        } else {
            match state.txns.coordinate(state, &id).await {
                Ok((inner, _)) => inner.coordinator.get(&id).cloned().ok_or_else(not_found),
                Err(e) => Err(e),
            }
        };
        transactions.push(match found {
            Ok(m) => {
                let topics = txn_topics(m.partitions.iter().cloned());
                TransactionDescription {
                    transactional_id: id,
                    error: None,
                    state: m.status.name().to_string(),
                    timeout_ms: m.timeout_ms,
                    start_ms: if m.status.is_open() { m.started_ms } else { -1 },
                    producer_id: m.producer_id,
                    producer_epoch: m.epoch,
                    topics,
                }
            }
            Err(e) => TransactionDescription {
                transactional_id: id,
                error: Some(e),
                state: String::new(),
                timeout_ms: 0,
                start_ms: -1,
                producer_id: -1,
                producer_epoch: -1,
                topics: Vec::new(),
            },
        });
    }
    DescribeTransactionsResponse { transactions }
}

/// ListTransactions: the transactional ids this broker coordinates (those of
/// the `__transaction_state` partitions it leads), filtered.
pub(crate) async fn list_transactions(
    state: &Arc<BrokerState>,
    req: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let unknown_states: Vec<String> = req
        .states
        .iter()
        .filter(|s| !TxnStatus::ALL.iter().any(|t| t.name() == s.as_str()))
        .cloned()
        .collect();
    let mut out = ListTransactionsResponse {
        error: None,
        unknown_states,
        transactions: Vec::new(),
    };
    let Some(topic) = state.registry.topic(TRANSACTION_STATE_TOPIC) else {
        return out;
    };
    let n = topic.count();
    let now = now_ms();
    let mut inner = state.txns.inner.lock().await;
    for index in 0..n {
        let Some(p) = topic.partition(index).filter(|p| p.is_leader()) else {
            continue;
        };
        if let Err(e) = state.txns.load_locked(state, &topic, index, p, &mut inner) {
            out.error = Some(e);
            return out;
        }
        let listed = inner.coordinator.all().filter(|m| {
            internal_topics::coordinator_partition(&m.transactional_id, n) == index
                && (req.states.is_empty() || req.states.iter().any(|s| s == m.status.name()))
                && (req.producer_ids.is_empty() || req.producer_ids.contains(&m.producer_id))
                && (req.min_duration_ms < 0
                    || (m.status.is_open()
                        && now.saturating_sub(m.started_ms) >= req.min_duration_ms))
        });
        out.transactions.extend(listed.map(|m| TransactionListing {
            transactional_id: m.transactional_id.clone(),
            producer_id: m.producer_id,
            state: m.status.name().to_string(),
        }));
    }
    out
}

/// Sends a TxnOffsetCommit to the transactional id's coordinator.
async fn forward(state: &Arc<BrokerState>, req: &TxnOffsetCommitRequest) -> Result<(), ErrorInfo> {
    let (index, leader) = coordinator_of(state, &req.transactional_id).await?;
    let unavailable = |why: String| {
        ErrorInfo::new(
            ErrorCode::CoordinatorNotAvailable,
            format!(
                "the transaction coordinator of {:?} ({TRANSACTION_STATE_TOPIC}-{index}) {why}: retry",
                req.transactional_id
            ),
        )
    };
    let leader = leader.ok_or_else(|| unavailable("has no leader right now".into()))?;
    if leader == state.config.id {
        return Err(unavailable("is loading here".into()));
    }
    let addr = state
        .cluster
        .image()
        .brokers
        .get(&leader)
        .map(|b| b.addr.clone())
        .ok_or_else(|| unavailable(format!("is broker {leader}, not registered yet")))?;
    let (resp, _) = state
        .cluster
        .links
        .call(&addr, req, MARKER_CALL_TIMEOUT)
        .await
        .map_err(|e| unavailable(format!("(broker {leader}) did not answer: {e}")))?;
    match resp.error {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// WriteTxnMarkers (from a transaction coordinator): append each marker to a
/// partition led here and wait until it is replicated.
pub(crate) async fn write_txn_markers(
    state: &Arc<BrokerState>,
    req: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    let marker = Marker {
        kind: req.kind,
        coordinator_epoch: req.coordinator_epoch,
    };
    let mut results = Vec::new();
    for t in &req.topics {
        for i in &t.partitions {
            let error = match state.registry.partition(&t.topic, *i) {
                Ok(p) => write_local_marker(state, &p, req.producer_id, req.producer_epoch, marker)
                    .await
                    .err(),
                Err(e) => Some(e),
            };
            results.push(MarkerResult {
                topic: t.topic.clone(),
                partition: *i,
                error,
            });
        }
    }
    WriteTxnMarkersResponse { results }
}

/// The transaction coordinator of `id` (FindCoordinator, kind Transaction):
/// (partition, leader) of its `__transaction_state` partition.
pub(crate) async fn coordinator_of(
    state: &Arc<BrokerState>,
    id: &str,
) -> Result<(u32, Option<i32>), ErrorInfo> {
    validate_id(id)?;
    let topic = state_topic(state).await?;
    let index = partition_index(&topic, id);
    Ok((index, state.leader_of(&topic, index)))
}

#[cfg(test)]
mod tests {
    use super::super::coordinator::TxnStatus;
    use super::*;

    #[test]
    fn state_records_round_trip_and_unknown_versions_are_skipped() {
        let meta = TxnMeta {
            transactional_id: "tx".into(),
            producer_id: 4,
            epoch: 2,
            timeout_ms: 60_000,
            status: TxnStatus::Ongoing,
            partitions: [("t".to_string(), 1)].into(),
            groups: BTreeSet::new(),
            offsets: BTreeMap::new(),
            started_ms: 5,
            updated_ms: 6,
        };
        let (k, v) = encode(&meta);
        assert_eq!(decode(&k, Some(&v)).unwrap(), Some(meta));
        assert_eq!(decode(&[0, 9, 1], Some(&v)).unwrap(), None);
        assert!(decode(&k, Some(&[0, 0, 0xff])).is_err());
        assert_eq!(decode(&k, None).unwrap(), None);
    }
}
