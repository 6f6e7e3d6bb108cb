//! The async shell around the [`GroupCoordinator`]: request handlers for the
//! group apis, the session timer, and the link to `__consumer_offsets`.
//!
//! `__consumer_offsets` is a topic of the cluster like any other: created through
//! the metadata quorum (compacted, replication factor
//! `offsets_topic_replication_factor` capped at the live brokers), replicated
//! leader/follower. The coordinator of a group is the leader of the partition
//! the group id hashes to ([`offsets_partition_for`]).
//!
//! Loading: when this broker becomes the leader of a partition of
//! `__consumer_offsets` (in a leader epoch), it replays the partition's log up
//! to its log end and serves that partition's groups from then on; when it stops
//! leading it, it forgets them. The timer does this within
//! [`GROUP_TICK_INTERVAL`] of a leadership change, and a request that arrives
//! first does it itself. So committed offsets and group epochs survive a restart
//! and a failover. Members do not: they rejoin the new coordinator (their
//! heartbeats get UNKNOWN_MEMBER_ID).
//!
//! Every step runs under one mutex, together with the append of the records it
//! produced and their replay, so the coordinator's durable state is what the
//! leader's log holds, in log order. A commit is answered only after its records
//! reached every in-sync replica (acks=all, bounded by
//! [`REPLICATION_WAIT`]); if the append or the replication fails, the commit
//! fails (a failed replication may still commit, as with a produce).
//!
//! Coordinator check: a group request is served only if this broker leads the
//! group's `__consumer_offsets` partition and has loaded it in the current
//! leader epoch (else NOT_COORDINATOR, and the client asks FindCoordinator,
//! which any broker answers from the metadata it holds).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use rill_proto::types::now_ms;
use rill_proto::wire::*;
use rill_proto::{BatchBuilder, Compression, LeaderEpoch, Offset, Record};

use super::coordinator::{CoordinatorConfig, GroupCoordinator, Input, Millis, Reply as GroupReply};
use super::records::GroupRecord;
use super::{OFFSETS_TOPIC, offsets_partition_for};
use crate::cluster::api as cluster_api;
use crate::config::BrokerConfig;
use crate::handlers::Reply;
use crate::partition::{Partition, Topic};
use crate::state::BrokerState;
use crate::topic_configs::{CLEANUP_POLICY_CONFIG, REMOTE_STORAGE_ENABLE_CONFIG};
use crate::topics::{TopicRegistry, TopicSpec};

/// How often sessions are checked for expiry and leadership of
/// `__consumer_offsets` for changes.
pub const GROUP_TICK_INTERVAL: Duration = Duration::from_millis(100);
/// Longest a commit waits for its records to reach every in-sync replica.
pub const REPLICATION_WAIT: Duration = Duration::from_secs(5);
/// Bytes read per step while loading `__consumer_offsets`.
const LOAD_READ_BYTES: usize = 1024 * 1024;

/// The coordinator and the partitions it has loaded, under one lock.
#[derive(Debug)]
struct Inner {
    coordinator: GroupCoordinator,
    /// `__consumer_offsets` partitions whose groups are loaded, with the leader
    /// epoch they were loaded in.
    loaded: BTreeMap<u32, LeaderEpoch>,
}

/// The group coordinator of this broker and what it needs around it.
#[derive(Debug)]
pub struct GroupService {
    inner: Mutex<Inner>,
    clock_base: Instant,
    /// One creation of `__consumer_offsets` at a time from this broker.
    creating: tokio::sync::Mutex<()>,
}

impl GroupService {
    pub fn new(config: &BrokerConfig) -> GroupService {
        GroupService {
            inner: Mutex::new(Inner {
                coordinator: GroupCoordinator::new(CoordinatorConfig {
                    session_timeout_ms_min: config.group_min_session_timeout_ms,
                    session_timeout_ms_max: config.group_max_session_timeout_ms,
                    members_per_group_max: config.group_max_size,
                    ..CoordinatorConfig::default()
                }),
                loaded: BTreeMap::new(),
            }),
            clock_base: Instant::now(),
            creating: tokio::sync::Mutex::new(()),
        }
    }

    fn now(&self) -> Millis {
        self.clock_base.elapsed().as_millis() as Millis
    }

    /// Whether partition `p` is loaded in its current leader epoch.
    fn is_loaded(&self, p: &Partition) -> bool {
        p.is_leader() && in_line(&self.inner.lock().loaded, p)
    }

    /// Brings partition `p` of `__consumer_offsets` in line with its leadership
    /// (blocking): loads its groups if this broker leads it in an epoch it has
    /// not loaded, forgets them if it does not lead it.
    fn sync_partition(&self, topic: &Topic, p: &Partition) -> Result<(), ErrorInfo> {
        let mut inner = self.inner.lock();
        let index = p.index();
        let count = topic.partitions.len() as u32;
        let epoch = p.leader_epoch();
        if in_line(&inner.loaded, p) {
            return Ok(());
        }
        if p.is_leader() {
            inner.loaded.remove(&index);
            inner
                .coordinator
                .retain_groups(|g| offsets_partition_for(g, count) != index);
            let now = self.now();
            let records = replay_partition(&mut inner.coordinator, p, now).inspect_err(|e| {
                tracing::error!(partition = index, error = %e, "could not load consumer groups");
            })?;
            inner.loaded.insert(index, epoch);
            tracing::info!(
                partition = index,
                leader_epoch = %epoch,
                records,
                "this broker now coordinates the groups of {OFFSETS_TOPIC}-{index}"
            );
        } else {
            inner.loaded.remove(&index);
            inner
                .coordinator
                .retain_groups(|g| offsets_partition_for(g, count) != index);
            tracing::info!(
                partition = index,
                leader = ?p.leader(),
                "no longer the coordinator of the groups of {OFFSETS_TOPIC}-{index}"
            );
        }
        Ok(())
    }

    /// Runs one step and makes its records durable: appended on the leader and
    /// replayed, then replicated to the ISR. Err: the records were not appended
    /// (nothing was replayed), or not replicated in time.
    async fn step(&self, state: &BrokerState, input: Input) -> (GroupReply, Result<(), ErrorInfo>) {
        let (reply, written) = {
            let mut inner = self.inner.lock();
            let now = self.now();
            let out = inner.coordinator.step(now, input);
            if out.records.is_empty() {
                return (out.reply, Ok(()));
            }
            let written = self.append(state, &inner.loaded, &out.records);
            if written.is_ok() {
                for r in out.records {
                    inner.coordinator.step(now, Input::Replay(r));
                }
            }
            (out.reply, written)
        };
        let appended = match written {
            Ok(a) => a,
            Err(e) => return (reply, Err(e)),
        };
        for (p, end) in appended {
            if let Err(e) = cluster_api::wait_replicated(
                state,
                &p,
                end,
                tokio::time::Instant::now() + REPLICATION_WAIT,
            )
            .await
            {
                return (reply, Err(not_coordinator_if_moved(e)));
            }
        }
        (reply, Ok(()))
    }

    /// Appends records to their groups' partitions, one batch per partition; each
    /// partition must be led here and loaded in its current epoch. Returns the
    /// partitions written and their log end after the append.
    fn append(
        &self,
        state: &BrokerState,
        loaded: &BTreeMap<u32, LeaderEpoch>,
        records: &[GroupRecord],
    ) -> Result<Vec<(Arc<Partition>, Offset)>, ErrorInfo> {
        let topic = state.registry.topic(OFFSETS_TOPIC).ok_or_else(|| {
            ErrorInfo::new(
                ErrorCode::CoordinatorNotAvailable,
                format!("{OFFSETS_TOPIC} does not exist yet: retry"),
            )
        })?;
        let n = topic.partitions.len() as u32;
        let now = now_ms();
        let mut by_partition: BTreeMap<u32, BatchBuilder> = BTreeMap::new();
        for r in records {
            let (key, value) = r.encode();
            by_partition
                .entry(offsets_partition_for(r.group(), n))
                .or_insert_with(|| BatchBuilder::new(Compression::None))
                .push(&Record {
                    key: Some(key),
                    value,
                    headers: Vec::new(),
                    timestamp_ms: now,
                });
        }
        let mut appended = Vec::new();
        for (p, builder) in by_partition {
            let partition = topic.partition(p).expect("index below the count").clone();
            if loaded.get(&p) != Some(&partition.leader_epoch()) {
                return Err(not_coordinator(state, &partition));
            }
            cluster_api::check_produce(state, &partition, Acks::All)
                .map_err(not_coordinator_if_moved)?;
            let bytes: Bytes = builder.build();
            let mut buf = BytesMut::from(&bytes[..]);
            partition.append(&mut buf, now).map_err(|e| {
                tracing::error!(error = %e, partition = p, "could not write to {OFFSETS_TOPIC}");
                e
            })?;
            let end = partition.log_end_offset();
            appended.push((partition, end));
        }
        Ok(appended)
    }

    /// Expires sessions (called by the timer).
    async fn tick(&self, state: &BrokerState) {
        let (_, written) = self.step(state, Input::Tick).await;
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not record expired group members");
        }
    }
}

/// Replays every record of partition `p` from its log start to its log end
/// (the new leader's log is the truth, committed or about to be). Returns how many.
fn replay_partition(
    coordinator: &mut GroupCoordinator,
    p: &Partition,
    now: Millis,
) -> Result<usize, ErrorInfo> {
    let corrupt = |reason: String| {
        ErrorInfo::new(
            ErrorCode::CoordinatorNotAvailable,
            format!(
                "{OFFSETS_TOPIC}-{} in {} cannot be loaded: {reason}; its groups are unavailable on this broker",
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
            .read_up_to(from, LOAD_READ_BYTES, end)
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
                match GroupRecord::decode(key, r.value.as_deref()) {
                    Ok(Some(record)) => {
                        coordinator.step(now, Input::Replay(record));
                        count += 1;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        return Err(corrupt(format!("record at offset {}: {e}", r.offset)));
                    }
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

/// Runs the session timer, and follows leadership of `__consumer_offsets`,
/// until shutdown.
pub(crate) async fn timer_loop(state: Arc<BrokerState>) {
    let mut timer = tokio::time::interval(GROUP_TICK_INTERVAL);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        sync_leadership(&state).await;
        state.groups.tick(&state).await;
    }
}

/// Loads or forgets the groups of every `__consumer_offsets` partition whose
/// leadership changed since the last look.
async fn sync_leadership(state: &Arc<BrokerState>) {
    let Some(topic) = state.registry.topic(OFFSETS_TOPIC) else {
        return;
    };
    let changed: Vec<u32> = {
        let inner = state.groups.inner.lock();
        topic
            .partitions
            .iter()
            .filter(|p| !in_line(&inner.loaded, p))
            .map(|p| p.index())
            .collect()
    };
    for index in changed {
        let _ = load_partition(state, &topic, index).await;
    }
}

/// Whether what is loaded of partition `p` matches its leadership: loaded in
/// the current leader epoch where this broker leads it, not loaded elsewhere.
fn in_line(loaded: &BTreeMap<u32, LeaderEpoch>, p: &Partition) -> bool {
    let epoch = loaded.get(&p.index());
    if p.is_leader() {
        epoch == Some(&p.leader_epoch())
    } else {
        epoch.is_none()
    }
}

/// [`GroupService::sync_partition`] off the async threads.
async fn load_partition(
    state: &Arc<BrokerState>,
    topic: &Arc<Topic>,
    index: u32,
) -> Result<(), ErrorInfo> {
    let s = state.clone();
    let t = topic.clone();
    tokio::task::spawn_blocking(move || {
        let p = t.partition(index).expect("index below the count");
        s.groups.sync_partition(&t, p)
    })
    .await
    .map_err(|e| {
        ErrorInfo::new(
            ErrorCode::InternalError,
            format!("loading {OFFSETS_TOPIC}-{index} failed: {e}; see the broker log"),
        )
    })?
}

/// The spec of `__consumer_offsets` as this broker would create it.
fn offsets_topic_spec(state: &BrokerState, partitions: u32) -> TopicSpec {
    let live = state.cluster.image().live_brokers().len().max(1);
    TopicSpec {
        name: OFFSETS_TOPIC.to_string(),
        partitions,
        replication_factor: state
            .config
            .offsets_topic_replication_factor
            .min(u16::try_from(live).unwrap_or(u16::MAX)),
        // Never tiered: the coordinator replays this topic from local segments.
        configs: vec![
            (CLEANUP_POLICY_CONFIG.into(), "compact".into()),
            (REMOTE_STORAGE_ENABLE_CONFIG.into(), "false".into()),
        ],
        internal: true,
    }
}

/// `__consumer_offsets`, created through the quorum on first use.
async fn offsets_topic(state: &Arc<BrokerState>) -> Result<Arc<Topic>, ErrorInfo> {
    let in_quorum = || state.cluster.image().topics.contains_key(OFFSETS_TOPIC);
    if in_quorum()
        && let Some(t) = state.registry.topic(OFFSETS_TOPIC)
    {
        return Ok(t);
    }
    {
        let _creating = state.groups.creating.lock().await;
        if !in_quorum() {
            let partitions = state.config.offsets_topic_num_partitions;
            let spec = offsets_topic_spec(state, partitions);
            let rf = spec.replication_factor;
            match cluster_api::create_topic(state, spec, false).await {
                Ok(()) => tracing::info!(
                    partitions,
                    replication_factor = rf,
                    "created {OFFSETS_TOPIC}"
                ),
                Err(e) if e.code == ErrorCode::TopicAlreadyExists => {}
                Err(e) => {
                    return Err(ErrorInfo::new(
                        ErrorCode::CoordinatorNotAvailable,
                        format!("could not create {OFFSETS_TOPIC}: {e}"),
                    ));
                }
            }
        }
    }
    let t = state
        .registry
        .topic(OFFSETS_TOPIC)
        .filter(|_| in_quorum())
        .ok_or_else(|| {
            ErrorInfo::new(
                ErrorCode::CoordinatorNotAvailable,
                format!("{OFFSETS_TOPIC} is being created: retry"),
            )
        })?;
    Ok(t)
}

/// NOT_COORDINATOR for partition `p` of `__consumer_offsets`.
fn not_coordinator(state: &BrokerState, p: &Partition) -> ErrorInfo {
    let led_by = match p.leader() {
        Some(l) if l == state.config.id => {
            "is led here but its groups are still loading".to_string()
        }
        Some(l) => format!("is led by broker {l}"),
        None => "has no leader right now".to_string(),
    };
    ErrorInfo::new(
        ErrorCode::NotCoordinator,
        format!(
            "broker {} is not the coordinator of groups on {OFFSETS_TOPIC}-{} (it {led_by}): ask FindCoordinator again",
            state.config.id,
            p.index()
        ),
    )
}

/// A partition error that means the coordinator moved becomes NOT_COORDINATOR
/// (the client then finds the new one).
fn not_coordinator_if_moved(e: ErrorInfo) -> ErrorInfo {
    if e.code == ErrorCode::NotLeaderOrFollower {
        ErrorInfo::new(ErrorCode::NotCoordinator, e.message)
    } else {
        e
    }
}

/// The group's partition of `__consumer_offsets`, if this broker coordinates
/// it: it leads the partition and has loaded it (loading it now if needed).
async fn check_coordinator(state: &Arc<BrokerState>, group_id: &str) -> Result<(), ErrorInfo> {
    super::coordinator::validate_group_id(group_id)?;
    let topic = offsets_topic(state).await?;
    let index = offsets_partition_for(group_id, topic.partitions.len() as u32);
    let p = topic.partition(index).expect("in range");
    if state.groups.is_loaded(p) {
        return Ok(());
    }
    if p.is_leader() {
        load_partition(state, &topic, index).await?;
        if state.groups.is_loaded(p) {
            return Ok(());
        }
    }
    Err(not_coordinator(state, p))
}

/// Partition counts of every non-internal topic.
fn partition_counts(registry: &TopicRegistry) -> BTreeMap<String, u32> {
    registry
        .all()
        .into_iter()
        .filter(|t| !t.internal)
        .map(|t| (t.name.to_string(), t.partitions.len() as u32))
        .collect()
}

fn reply<T: serde::Serialize>(response: T) -> Reply {
    Reply::Frame {
        meta: encode_meta(&ResponseMeta::Ok(response)),
        payload: Vec::new(),
    }
}

fn decode<T: ApiRequest>(meta: &[u8]) -> Result<T, ErrorInfo> {
    decode_meta::<T>(meta).map_err(|e| ErrorInfo::new(ErrorCode::InvalidRequest, e.to_string()))
}

fn unexpected(api: ApiKey) -> ErrorInfo {
    ErrorInfo::new(
        ErrorCode::InternalError,
        format!(
            "the group coordinator gave no answer to a {} request; see the broker log",
            api.name()
        ),
    )
}

/// Handles a group api request (api keys 9..=19).
pub(crate) async fn dispatch(
    state: &Arc<BrokerState>,
    api: ApiKey,
    meta: &[u8],
) -> Result<Reply, ErrorInfo> {
    let groups = &state.groups;
    match api {
        ApiKey::FindCoordinator => {
            let req: FindCoordinatorRequest = decode(meta)?;
            Ok(reply(find_coordinator(state, &req.group_id).await))
        }
        ApiKey::ConsumerGroupHeartbeat => {
            let req: ConsumerGroupHeartbeatRequest = decode(meta)?;
            if let Err(e) = check_coordinator(state, &req.group_id).await {
                return Ok(reply(ConsumerGroupHeartbeatResponse {
                    error: Some(e),
                    member_id: req.member_id,
                    member_epoch: req.member_epoch,
                    heartbeat_interval_ms: 0,
                    session_timeout_ms: 0,
                    assignment: Vec::new(),
                }));
            }
            let input = Input::Heartbeat {
                request: req,
                partition_counts: partition_counts(&state.registry),
            };
            let (out, written) = groups.step(state, input).await;
            let GroupReply::Heartbeat(resp) = out else {
                return Err(unexpected(api));
            };
            if let Err(e) = written {
                // The membership change stands (membership is not durable
                // state); only the group epoch record is missing.
                tracing::warn!(error = %e, "could not record a group epoch");
            }
            Ok(reply(resp))
        }
        ApiKey::OffsetCommit => {
            let req: OffsetCommitRequest = decode(meta)?;
            if let Err(e) = check_coordinator(state, &req.group_id).await {
                return Ok(reply(OffsetCommitResponse {
                    error: Some(e),
                    partitions: Vec::new(),
                }));
            }
            let gid = req.group_id.clone();
            let (out, written) = groups
                .step(
                    state,
                    Input::CommitOffsets {
                        request: req,
                        wall_ms: now_ms(),
                    },
                )
                .await;
            let GroupReply::Commit(mut resp) = out else {
                return Err(unexpected(api));
            };
            if let Err(e) = written {
                for p in &mut resp.partitions {
                    if p.error.is_none() {
                        p.error = Some(ErrorInfo::new(
                            e.code,
                            format!(
                                "group {gid}: the offset of {}-{} could not be written to {OFFSETS_TOPIC}: {}",
                                p.topic, p.partition, e.message
                            ),
                        ));
                    }
                }
            }
            Ok(reply(resp))
        }
        ApiKey::OffsetFetch => {
            let req: OffsetFetchRequest = decode(meta)?;
            if let Err(e) = check_coordinator(state, &req.group_id).await {
                return Ok(reply(OffsetFetchResponse {
                    error: Some(e),
                    offsets: Vec::new(),
                }));
            }
            match groups.step(state, Input::FetchOffsets(req)).await.0 {
                GroupReply::Fetch(resp) => Ok(reply(resp)),
                _ => Err(unexpected(api)),
            }
        }
        ApiKey::ListGroups => {
            let _req: ListGroupsRequest = decode(meta)?;
            match groups.step(state, Input::ListGroups).await.0 {
                GroupReply::List(resp) => Ok(reply(resp)),
                _ => Err(unexpected(api)),
            }
        }
        ApiKey::DescribeGroups => {
            let req: DescribeGroupsRequest = decode(meta)?;
            let mut mine = Vec::new();
            let mut errors = Vec::new();
            for gid in req.group_ids {
                match check_coordinator(state, &gid).await {
                    Ok(()) => mine.push(gid),
                    Err(e) => errors.push(GroupDescription {
                        group_id: gid,
                        error: Some(e),
                        state: "Unknown".into(),
                        group_epoch: 0,
                        assignor: String::new(),
                        members: Vec::new(),
                        offsets: Vec::new(),
                    }),
                }
            }
            let input = Input::DescribeGroups(DescribeGroupsRequest { group_ids: mine });
            match groups.step(state, input).await.0 {
                GroupReply::Describe(mut resp) => {
                    resp.groups.extend(errors);
                    Ok(reply(resp))
                }
                _ => Err(unexpected(api)),
            }
        }
        ApiKey::DeleteGroups => {
            let req: DeleteGroupsRequest = decode(meta)?;
            let mut mine = Vec::new();
            let mut results = Vec::new();
            for gid in req.group_ids {
                match check_coordinator(state, &gid).await {
                    Ok(()) => mine.push(gid),
                    Err(e) => results.push(GroupResult {
                        group_id: gid,
                        error: Some(e),
                    }),
                }
            }
            let (out, written) = groups
                .step(
                    state,
                    Input::DeleteGroups(DeleteGroupsRequest { group_ids: mine }),
                )
                .await;
            let GroupReply::Delete(mut resp) = out else {
                return Err(unexpected(api));
            };
            if let Err(e) = written {
                for r in &mut resp.results {
                    if r.error.is_none() {
                        r.error = Some(e.clone());
                    }
                }
            }
            resp.results.extend(results);
            Ok(reply(resp))
        }
        other => Err(ErrorInfo::new(
            ErrorCode::UnsupportedVersion,
            format!("{} is not a group api", other.name()),
        )),
    }
}

async fn find_coordinator(state: &Arc<BrokerState>, group_id: &str) -> FindCoordinatorResponse {
    let fail = |e: ErrorInfo| FindCoordinatorResponse {
        error: Some(e),
        partition: 0,
        coordinator_id: -1,
        coordinator_addr: String::new(),
    };
    if let Err(e) = super::coordinator::validate_group_id(group_id) {
        return fail(e);
    }
    let topic = match offsets_topic(state).await {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let p = offsets_partition_for(group_id, topic.partitions.len() as u32);
    let Some(leader) = topic.partition(p).expect("in range").leader() else {
        return fail(ErrorInfo::new(
            ErrorCode::CoordinatorNotAvailable,
            format!("{OFFSETS_TOPIC}-{p} (group {group_id}) has no leader right now: retry"),
        ));
    };
    let addr = if leader == state.config.id {
        Some(state.advertised.clone())
    } else {
        state
            .cluster
            .image()
            .brokers
            .get(&leader)
            .map(|b| b.addr.clone())
    };
    let Some(addr) = addr else {
        return fail(ErrorInfo::new(
            ErrorCode::CoordinatorNotAvailable,
            format!(
                "{OFFSETS_TOPIC}-{p} (group {group_id}) is led by broker {leader}, which is not registered yet: retry"
            ),
        ));
    };
    FindCoordinatorResponse {
        error: None,
        partition: p,
        coordinator_id: leader,
        coordinator_addr: addr,
    }
}
