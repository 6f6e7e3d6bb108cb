//! The async shell around the [`GroupCoordinator`]: request handlers for the
//! group apis, the session timer, and the link to `__consumer_offsets`.
//!
//! Every step runs under one mutex, together with the append of the records it
//! produced and their replay, so the coordinator's durable state is exactly what
//! the log holds, in log order. A commit is answered only after its records are
//! appended to the group's partition (on one broker the ISR is this broker, so
//! that is acks=all); if the append fails, the commit fails and nothing changes.
//!
//! Startup: [`GroupService::load`] reads every partition of `__consumer_offsets`
//! from its log start and replays each record, so committed offsets and group
//! epochs survive a restart. Members do not: they rejoin.
//!
//! Coordinator check: a group request is served only if this broker leads the
//! group's `__consumer_offsets` partition (else NOT_COORDINATOR, and the client
//! asks FindCoordinator again).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use rill_proto::types::now_ms;
use rill_proto::wire::*;
use rill_proto::{BatchBuilder, Compression, Record};

use super::coordinator::{CoordinatorConfig, GroupCoordinator, Input, Millis, Reply as GroupReply};
use super::records::GroupRecord;
use super::{OFFSETS_TOPIC, offsets_partition_for};
use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::handlers::Reply;
use crate::partition::Partition;
use crate::state::BrokerState;
use crate::topics::{TopicRegistry, TopicSpec};

/// How often sessions are checked for expiry.
pub const GROUP_TICK_INTERVAL: Duration = Duration::from_millis(100);
/// Bytes read per step while loading `__consumer_offsets`.
const LOAD_READ_BYTES: usize = 1024 * 1024;

/// The group coordinator of this broker and what it needs around it.
#[derive(Debug)]
pub struct GroupService {
    coordinator: Mutex<GroupCoordinator>,
    clock_base: Instant,
    /// Partitions of `__consumer_offsets`: the real count once it exists.
    offsets_partitions: AtomicU32,
}

impl GroupService {
    pub fn new(config: &BrokerConfig) -> GroupService {
        GroupService {
            coordinator: Mutex::new(GroupCoordinator::new(CoordinatorConfig {
                session_timeout_ms_min: config.group_min_session_timeout_ms,
                session_timeout_ms_max: config.group_max_session_timeout_ms,
                members_per_group_max: config.group_max_size,
                ..CoordinatorConfig::default()
            })),
            clock_base: Instant::now(),
            offsets_partitions: AtomicU32::new(config.offsets_topic_num_partitions),
        }
    }

    fn now(&self) -> Millis {
        self.clock_base.elapsed().as_millis() as Millis
    }

    /// Replays every record of `__consumer_offsets` (blocking). Returns how many.
    pub fn load(&self, registry: &TopicRegistry) -> Result<usize, BrokerError> {
        let Some(topic) = registry.topic(OFFSETS_TOPIC) else {
            return Ok(0);
        };
        self.offsets_partitions
            .store(topic.partitions.len() as u32, Ordering::Release);
        let mut coordinator = self.coordinator.lock();
        let now = self.now();
        let mut count = 0usize;
        for p in &topic.partitions {
            let corrupt = |reason: String| BrokerError::LogRecovery {
                topic: OFFSETS_TOPIC.to_string(),
                partition: p.index(),
                dir: p.dir().to_path_buf(),
                source: rill_log::LogError::Corrupt {
                    path: p.dir().to_path_buf(),
                    position: 0,
                    reason,
                },
            };
            let mut from = p.log_start_offset();
            while from < p.high_watermark() {
                let Some(slice) = p
                    .read(from, LOAD_READ_BYTES)
                    .map_err(|e| corrupt(e.message))?
                else {
                    break;
                };
                let crate::partition::ReadPlan::Local(slice) = slice else {
                    return Err(corrupt(format!(
                        "offset {from} lies in the object store; {OFFSETS_TOPIC} is never tiered"
                    )));
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
        }
        tracing::info!(
            records = count,
            "loaded consumer groups from {OFFSETS_TOPIC}"
        );
        Ok(count)
    }

    /// Runs one step and makes its records durable (appended, then replayed).
    /// Err: the records could not be appended (nothing was replayed).
    fn step(&self, state: &BrokerState, input: Input) -> (GroupReply, Result<(), ErrorInfo>) {
        let mut coordinator = self.coordinator.lock();
        let now = self.now();
        let out = coordinator.step(now, input);
        if out.records.is_empty() {
            return (out.reply, Ok(()));
        }
        let written = self.append(state, &out.records);
        if written.is_ok() {
            for r in out.records {
                coordinator.step(now, Input::Replay(r));
            }
        }
        (out.reply, written)
    }

    /// Appends records to their groups' partitions, one batch per partition.
    fn append(&self, state: &BrokerState, records: &[GroupRecord]) -> Result<(), ErrorInfo> {
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
        for (p, builder) in by_partition {
            let partition = topic.partition(p).expect("index below the count");
            let bytes: Bytes = builder.build();
            let mut buf = BytesMut::from(&bytes[..]);
            partition.append(&mut buf, now).map_err(|e| {
                tracing::error!(error = %e, partition = p, "could not write to {OFFSETS_TOPIC}");
                e
            })?;
        }
        Ok(())
    }

    /// Expires sessions (called by the timer).
    fn tick(&self, state: &BrokerState) {
        let (_, written) = self.step(state, Input::Tick);
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not record expired group members");
        }
    }
}

/// Runs the session timer until shutdown.
pub(crate) async fn timer_loop(state: Arc<BrokerState>) {
    let mut timer = tokio::time::interval(GROUP_TICK_INTERVAL);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        state.groups.tick(&state);
    }
}

/// Creates `__consumer_offsets` if it does not exist (compacted, internal).
async fn offsets_topic(
    state: &Arc<BrokerState>,
) -> Result<Arc<crate::partition::Topic>, ErrorInfo> {
    if let Some(t) = state.registry.topic(OFFSETS_TOPIC) {
        return Ok(t);
    }
    let spec = TopicSpec {
        name: OFFSETS_TOPIC.to_string(),
        partitions: state.config.offsets_topic_num_partitions,
        replication_factor: state
            .config
            .offsets_topic_replication_factor
            .min(state.registry.live_brokers().max(1) as u16),
        // Never tiered: the coordinator replays this topic from local segments at start.
        configs: vec![
            ("cleanup.policy".into(), "compact".into()),
            ("remote.storage.enable".into(), "false".into()),
        ],
        internal: true,
    };
    let registry = state.registry.clone();
    let created = tokio::task::spawn_blocking(move || registry.create(&spec, false))
        .await
        .map_err(|e| {
            ErrorInfo::new(
                ErrorCode::InternalError,
                format!("creating {OFFSETS_TOPIC} failed: {e}; see the broker log"),
            )
        })?;
    match created {
        Ok(()) => tracing::info!("created {OFFSETS_TOPIC}"),
        Err(e) if e.code == ErrorCode::TopicAlreadyExists => {}
        Err(e) => {
            return Err(ErrorInfo::new(
                ErrorCode::CoordinatorNotAvailable,
                format!("could not create {OFFSETS_TOPIC}: {e}"),
            ));
        }
    }
    let t = state.registry.topic(OFFSETS_TOPIC).ok_or_else(|| {
        ErrorInfo::new(
            ErrorCode::CoordinatorNotAvailable,
            format!("{OFFSETS_TOPIC} was deleted while being created: retry"),
        )
    })?;
    state
        .groups
        .offsets_partitions
        .store(t.partitions.len() as u32, Ordering::Release);
    Ok(t)
}

/// The leader of a partition as this broker sees it (the first replica; the
/// cluster's metadata replaces this when partitions get elected leaders).
fn leader_of(p: &Partition) -> i32 {
    p.replicas()[0]
}

/// The group's partition of `__consumer_offsets`, if this broker leads it.
async fn check_coordinator(state: &Arc<BrokerState>, group_id: &str) -> Result<(), ErrorInfo> {
    super::coordinator::validate_group_id(group_id)?;
    let topic = offsets_topic(state).await?;
    let p = offsets_partition_for(group_id, topic.partitions.len() as u32);
    let leader = leader_of(topic.partition(p).expect("in range"));
    if leader != state.config.id {
        return Err(ErrorInfo::new(
            ErrorCode::NotCoordinator,
            format!(
                "broker {} is not the coordinator of group {group_id} ({OFFSETS_TOPIC}-{p} is led by broker {leader}): ask FindCoordinator again",
                state.config.id
            ),
        ));
    }
    Ok(())
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
            let (out, written) = groups.step(state, input);
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
            let (out, written) = groups.step(
                state,
                Input::CommitOffsets {
                    request: req,
                    wall_ms: now_ms(),
                },
            );
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
            match groups.step(state, Input::FetchOffsets(req)).0 {
                GroupReply::Fetch(resp) => Ok(reply(resp)),
                _ => Err(unexpected(api)),
            }
        }
        ApiKey::ListGroups => {
            let _req: ListGroupsRequest = decode(meta)?;
            match groups.step(state, Input::ListGroups).0 {
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
            match groups.step(state, input).0 {
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
            let (out, written) = groups.step(
                state,
                Input::DeleteGroups(DeleteGroupsRequest { group_ids: mine }),
            );
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
    let leader = leader_of(topic.partition(p).expect("in range"));
    if leader != state.config.id {
        return fail(ErrorInfo::new(
            ErrorCode::CoordinatorNotAvailable,
            format!(
                "{OFFSETS_TOPIC}-{p} (group {group_id}) is led by broker {leader}, whose address this broker does not know: retry"
            ),
        ));
    }
    FindCoordinatorResponse {
        error: None,
        partition: p,
        coordinator_id: state.config.id,
        coordinator_addr: state.advertised.clone(),
    }
}
