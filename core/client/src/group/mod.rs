//! The [`GroupConsumer`]: a consumer whose partitions are decided by the group
//! coordinator (Kafka's KIP-848 protocol), with committed offsets.
//!
//! Lifecycle: `Client::group_consumer` finds the coordinator (FindCoordinator)
//! and joins (a heartbeat with member epoch 0). `poll` heartbeats when due,
//! applies assignment changes, auto-commits when due, then returns records.
//! `close` commits (with auto-commit on) and leaves the group.
//!
//! Assignment changes: a newly assigned partition starts at the group's committed
//! offset (else per `auto_offset_reset`) and is reported as
//! [`GroupEvent::Assigned`]. A revoked partition is dropped from fetching at once
//! (buffered records of it are discarded), reported as [`GroupEvent::Revoked`],
//! and `poll` returns early so the application sees the event. The member keeps
//! reporting the partition as owned until its next `poll` or `commit` call, and
//! only then acknowledges the revocation to the coordinator (which gives the
//! partition to its new owner): so an application with manual commits can commit
//! the revoked partitions' offsets first (`commit` includes them).
//!
//! Fencing: if the coordinator says the member is unknown or its epoch stale
//! (its session expired), every partition is revoked (without commit: the
//! coordinator would refuse it) and the member rejoins. If no heartbeat
//! succeeds for a whole session timeout, the member assumes the same, and it
//! does so on time (as Kafka's consumer declares its partitions lost): the
//! session is counted from when the last answered heartbeat was *sent*, no
//! later than the coordinator received it, so the member gives its partitions
//! up no later than the coordinator's session timer hands them to another
//! member. Every call a member makes to the coordinator (heartbeat, commit,
//! fetching committed offsets) and every wait in `poll` ends by then; the
//! network-fault test (tests/net_faults.rs, issue 21) caught a member that
//! kept its partitions for seconds past its session while a heartbeat or a
//! commit to an unreachable coordinator waited for its request timeout.
//!
//! Dropping a `GroupConsumer` without `close` sends a best-effort leave on the
//! current Tokio runtime, bounded by [`LEAVE_ON_DROP_TIMEOUT`]; failing that the
//! coordinator removes the member after its session timeout.

mod admin;
mod config;

pub use admin::{GroupDescription, GroupMember, GroupPartition, ResetSpec};
pub use config::{
    DEFAULT_AUTO_COMMIT_INTERVAL_MS, DEFAULT_HEARTBEAT_INTERVAL_MS, DEFAULT_SESSION_TIMEOUT_MS,
    GroupConfig,
};

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use rill_proto::Offset;
use rill_proto::wire::{
    ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, ErrorCode,
    FindCoordinatorRequest, JOIN_GROUP_EPOCH, LEAVE_GROUP_EPOCH, LEAVE_GROUP_STATIC_EPOCH,
    OffsetCommitPartition, OffsetCommitRequest, OffsetFetchRequest, TopicPartitions,
};
use tokio::time::Instant;

use crate::TopicPartition;
use crate::client::Client;
use crate::config::OffsetReset;
use crate::consumer::{Consumer, ConsumerRecord};
use crate::error::ClientError;

/// Bound on the leave a dropped consumer sends in the background.
pub const LEAVE_ON_DROP_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause before asking again after the coordinator moved or was unavailable.
pub const COORDINATOR_RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// Bound on finding the coordinator (retrying while it is not available).
pub const FIND_COORDINATOR_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a commit or an admin group request keeps retrying while the
/// coordinator moves (a failover of its `__consumer_offsets` partition takes
/// about two seconds).
pub const COORDINATOR_MOVE_WAIT: Duration = Duration::from_secs(15);

/// An assignment change, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupEvent {
    /// These partitions are now this member's (fetching starts at the committed offset).
    Assigned(Vec<TopicPartition>),
    /// These partitions are no longer this member's (no more records of them).
    Revoked(Vec<TopicPartition>),
}

pub(crate) fn to_wire(tps: impl IntoIterator<Item = TopicPartition>) -> Vec<TopicPartitions> {
    let mut sorted: Vec<TopicPartition> = tps.into_iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut out: Vec<TopicPartitions> = Vec::new();
    for tp in sorted {
        match out.last_mut() {
            Some(last) if last.topic == tp.topic => last.partitions.push(tp.partition),
            _ => out.push(TopicPartitions {
                topic: tp.topic,
                partitions: vec![tp.partition],
            }),
        }
    }
    out
}

pub(crate) fn from_wire(list: &[TopicPartitions]) -> BTreeSet<TopicPartition> {
    list.iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| TopicPartition::new(t.topic.clone(), *p))
        })
        .collect()
}

/// A consumer in a consumer group. Get one with [`Client::group_consumer`].
#[derive(Debug)]
pub struct GroupConsumer {
    client: Client,
    config: GroupConfig,
    consumer: Consumer,
    member_id: String,
    member_epoch: i32,
    coordinator: Option<i32>,
    /// What the coordinator assigned (fetching, or waiting for committed offsets).
    assignment: BTreeSet<TopicPartition>,
    /// Assigned, but the committed offsets are not known yet (not fetching).
    awaiting_offsets: BTreeSet<TopicPartition>,
    /// No offset lookup before this (an open transaction held the offsets).
    offsets_retry_at: Option<Instant>,
    /// Revoked, reported as owned until acknowledged; with their position then.
    revoked_unacked: Vec<(TopicPartition, Option<Offset>)>,
    events: Vec<GroupEvent>,
    next_heartbeat: Instant,
    heartbeat_interval: Duration,
    last_heartbeat_ok: Instant,
    next_auto_commit: Instant,
    /// The last offset committed per partition (unchanged ones are not re-sent).
    committed: HashMap<TopicPartition, Offset>,
    closed: bool,
}

fn random_member_id() -> String {
    format!("m-{:032x}", rand::random::<u128>())
}

impl Client {
    /// Joins a consumer group: finds its coordinator and sends the first
    /// heartbeat (so a bad config, e.g. an unknown assignor or a session timeout
    /// the broker does not allow, fails here). Records come from `poll`.
    pub async fn group_consumer(&self, config: GroupConfig) -> Result<GroupConsumer, ClientError> {
        config.validate()?;
        let mut consumer_config = config.consumer.clone();
        consumer_config.auto_offset_reset = config.auto_offset_reset;
        let consumer = self.consumer(consumer_config)?;
        let now = Instant::now();
        let mut member = GroupConsumer {
            client: self.clone(),
            consumer,
            member_id: random_member_id(),
            member_epoch: JOIN_GROUP_EPOCH,
            coordinator: None,
            assignment: BTreeSet::new(),
            awaiting_offsets: BTreeSet::new(),
            offsets_retry_at: None,
            revoked_unacked: Vec::new(),
            events: Vec::new(),
            next_heartbeat: now,
            heartbeat_interval: Duration::from_millis(config.heartbeat_interval_ms as u64),
            last_heartbeat_ok: now,
            next_auto_commit: now + config.auto_commit_interval(),
            committed: HashMap::new(),
            closed: false,
            config,
        };
        member.heartbeat().await?;
        member.resolve_offsets().await?;
        Ok(member)
    }

    /// The coordinator of `group_id` (broker id), retrying while it is not
    /// available (bounded by [`FIND_COORDINATOR_TIMEOUT`]).
    pub(crate) async fn find_coordinator(&self, group_id: &str) -> Result<i32, ClientError> {
        self.find_coordinator_of(group_id, rill_proto::wire::CoordinatorKind::Group)
            .await
    }

    /// The coordinator of `key` (a group id, or a transactional id with
    /// [`CoordinatorKind::Transaction`](rill_proto::wire::CoordinatorKind)),
    /// as [`find_coordinator`](Self::find_coordinator).
    pub(crate) async fn find_coordinator_of(
        &self,
        key: &str,
        kind: rill_proto::wire::CoordinatorKind,
    ) -> Result<i32, ClientError> {
        let what = match kind {
            rill_proto::wire::CoordinatorKind::Group => "group",
            rill_proto::wire::CoordinatorKind::Transaction => "transactional id",
        };
        let deadline = Instant::now() + FIND_COORDINATOR_TIMEOUT;
        loop {
            let req = FindCoordinatorRequest {
                group_id: key.to_string(),
                kind,
            };
            let resp = match self.call(None, &req, &[]).await {
                Ok((resp, _)) => resp,
                Err(e) if e.is_retriable() && Instant::now() < deadline => {
                    // That broker is down or restarting: ask another.
                    tracing::debug!(key, error = %e, "could not ask for the coordinator");
                    tokio::time::sleep(COORDINATOR_RETRY_BACKOFF).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match resp.error {
                None => {
                    let known = self
                        .inner
                        .metadata
                        .read()
                        .brokers
                        .contains_key(&resp.coordinator_id);
                    if !known {
                        self.metadata(None).await?;
                    }
                    return Ok(resp.coordinator_id);
                }
                Some(e) if e.code.is_retriable() && Instant::now() < deadline => {
                    tracing::debug!(key, error = %e, "coordinator not available yet");
                    tokio::time::sleep(COORDINATOR_RETRY_BACKOFF).await;
                }
                Some(e) => {
                    return Err(ClientError::broker(
                        format!("find the coordinator of {what} {key}"),
                        e,
                    ));
                }
            }
        }
    }
}

impl GroupConsumer {
    /// The group this member belongs to.
    pub fn group_id(&self) -> &str {
        &self.config.group_id
    }

    /// This member's id (chosen by the client, unique per incarnation).
    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    /// The member epoch the coordinator gave last (0 before joining).
    pub fn member_epoch(&self) -> i32 {
        self.member_epoch
    }

    /// The partitions assigned to this member, sorted.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.assignment.iter().cloned().collect()
    }

    /// The assignment changes since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<GroupEvent> {
        std::mem::take(&mut self.events)
    }

    /// The next offset `poll` returns for an assigned partition, if known.
    pub fn position(&self, tp: &TopicPartition) -> Option<Offset> {
        self.consumer.current_position(tp)
    }

    async fn coordinator(&mut self) -> Result<i32, ClientError> {
        if let Some(id) = self.coordinator {
            return Ok(id);
        }
        let id = self.client.find_coordinator(&self.config.group_id).await?;
        self.coordinator = Some(id);
        Ok(id)
    }

    fn owned(&self) -> Vec<TopicPartitions> {
        to_wire(
            self.assignment
                .iter()
                .cloned()
                .chain(self.revoked_unacked.iter().map(|(tp, _)| tp.clone())),
        )
    }

    fn heartbeat_request(&self, epoch: i32) -> ConsumerGroupHeartbeatRequest {
        ConsumerGroupHeartbeatRequest {
            group_id: self.config.group_id.clone(),
            member_id: self.member_id.clone(),
            member_epoch: epoch,
            instance_id: self.config.group_instance_id.clone(),
            client_id: self.client.config().client_id.clone(),
            subscribed_topics: self.config.topics.clone(),
            assignor: self.config.assignor.clone(),
            session_timeout_ms: self.config.session_timeout_ms,
            heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            owned: self.owned(),
        }
    }

    /// Sends one heartbeat and applies the answer. Err only for errors retrying
    /// cannot fix (bad config, refused by the coordinator).
    async fn heartbeat(&mut self) -> Result<(), ClientError> {
        let req = self.heartbeat_request(self.member_epoch);
        let sent_at = Instant::now();
        let session_deadline = self.session_deadline();
        let call = async {
            match self.coordinator().await {
                Ok(id) => self.client.call(Some(id), &req, &[]).await.map(|(r, _)| r),
                Err(e) => Err(e),
            }
        };
        let result = match session_deadline {
            // A member waits for its answer no longer than its session lasts.
            Some(d) => tokio::time::timeout_at(d, call).await.unwrap_or_else(|_| {
                Err(ClientError::Timeout {
                    what: format!(
                        "heartbeat of member {} in group {} (no answer before its session ran out)",
                        self.member_id, self.config.group_id
                    ),
                })
            }),
            None => call.await,
        };
        let session = Duration::from_millis(self.config.session_timeout_ms as u64);
        match result {
            Ok(resp) => match resp.error.clone() {
                None => {
                    self.last_heartbeat_ok = sent_at;
                    self.apply(resp);
                    Ok(())
                }
                Some(e)
                    if matches!(
                        e.code,
                        ErrorCode::NotCoordinator | ErrorCode::CoordinatorNotAvailable
                    ) =>
                {
                    tracing::debug!(group = %self.config.group_id, error = %e, "coordinator moved");
                    self.coordinator = None;
                    self.next_heartbeat = Instant::now() + COORDINATOR_RETRY_BACKOFF;
                    Ok(())
                }
                Some(e)
                    if matches!(
                        e.code,
                        ErrorCode::UnknownMemberId | ErrorCode::FencedMemberEpoch
                    ) =>
                {
                    tracing::info!(group = %self.config.group_id, member = %self.member_id, error = %e, "fenced; rejoining");
                    self.lose_all();
                    Ok(())
                }
                Some(e) => Err(ClientError::broker(
                    format!(
                        "heartbeat of member {} in group {}",
                        self.member_id, self.config.group_id
                    ),
                    e,
                )),
            },
            Err(e) if e.is_retriable() => {
                tracing::debug!(group = %self.config.group_id, error = %e, "heartbeat failed; retrying");
                self.coordinator = None;
                self.next_heartbeat = Instant::now() + COORDINATOR_RETRY_BACKOFF;
                if self.member_epoch > 0 && self.last_heartbeat_ok.elapsed() >= session {
                    // The coordinator has removed us by now.
                    self.lose_all();
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// When this member's session runs out unless a heartbeat is answered
    /// first (`None` while it is not a member).
    fn session_deadline(&self) -> Option<Instant> {
        (self.member_epoch > 0).then(|| {
            self.last_heartbeat_ok + Duration::from_millis(self.config.session_timeout_ms as u64)
        })
    }

    /// Whether the session ran out: the coordinator may have given this
    /// member's partitions to another by now.
    fn session_lapsed(&self) -> bool {
        self.session_deadline().is_some_and(|d| Instant::now() >= d)
    }

    /// The member was removed: every partition is gone (no commit), rejoin.
    fn lose_all(&mut self) {
        // Revoked partitions were reported already; report only the rest.
        let lost: Vec<TopicPartition> = self.assignment.iter().cloned().collect();
        self.revoked_unacked.clear();
        self.assignment.clear();
        self.awaiting_offsets.clear();
        self.committed.clear();
        self.consumer.assign(Vec::new());
        if !lost.is_empty() {
            self.events.push(GroupEvent::Revoked(lost));
        }
        self.member_epoch = JOIN_GROUP_EPOCH;
        self.next_heartbeat = Instant::now();
    }

    /// Applies a successful heartbeat response.
    fn apply(&mut self, resp: ConsumerGroupHeartbeatResponse) {
        self.member_epoch = resp.member_epoch;
        self.heartbeat_interval = Duration::from_millis(resp.heartbeat_interval_ms.max(1) as u64);
        self.next_heartbeat = Instant::now() + self.heartbeat_interval;
        let new = from_wire(&resp.assignment);
        let revoked: Vec<TopicPartition> = self.assignment.difference(&new).cloned().collect();
        let added: Vec<TopicPartition> = new.difference(&self.assignment).cloned().collect();
        if revoked.is_empty() && added.is_empty() {
            return;
        }
        for tp in &revoked {
            let position = self.consumer.current_position(tp);
            self.awaiting_offsets.remove(tp);
            self.revoked_unacked.push((tp.clone(), position));
        }
        // A partition re-assigned before its revocation was acknowledged is
        // simply kept.
        self.revoked_unacked.retain(|(tp, _)| !new.contains(tp));
        for tp in &added {
            if !self.consumer.assignment().contains(tp) {
                self.awaiting_offsets.insert(tp.clone());
            }
        }
        self.assignment = new;
        self.reassign_consumer();
        if !revoked.is_empty() {
            tracing::debug!(group = %self.config.group_id, ?revoked, "partitions revoked");
            self.events.push(GroupEvent::Revoked(revoked));
        }
    }

    /// Points the inner consumer at the assigned partitions whose start is known.
    fn reassign_consumer(&mut self) {
        let fetching: Vec<TopicPartition> = self
            .assignment
            .iter()
            .filter(|tp| !self.awaiting_offsets.contains(*tp))
            .cloned()
            .collect();
        self.consumer.assign(fetching);
    }

    /// Looks up the committed offsets of newly assigned partitions and starts
    /// fetching them (at the commit, else per `auto_offset_reset`).
    async fn resolve_offsets(&mut self) -> Result<(), ClientError> {
        if self.awaiting_offsets.is_empty()
            || self.offsets_retry_at.is_some_and(|t| Instant::now() < t)
        {
            return Ok(());
        }
        self.offsets_retry_at = None;
        let wanted: Vec<TopicPartition> = self.awaiting_offsets.iter().cloned().collect();
        // A read-committed member does not start from offsets an open
        // transaction is about to replace (KIP-447): it waits until that
        // transaction ends (UNSTABLE_OFFSET_COMMIT, retried below).
        let req = OffsetFetchRequest {
            group_id: self.config.group_id.clone(),
            partitions: Some(to_wire(wanted.iter().cloned())),
            require_stable: self.config.consumer.isolation
                == rill_proto::wire::Isolation::ReadCommitted,
        };
        let session_deadline = self.session_deadline();
        let call = async {
            let coordinator = self.coordinator().await?;
            self.client.call(Some(coordinator), &req, &[]).await
        };
        let result = match session_deadline {
            Some(d) => tokio::time::timeout_at(d, call).await.unwrap_or_else(|_| {
                Err(ClientError::Timeout {
                    what: "the committed offsets (before the session ran out)".into(),
                })
            }),
            None => call.await,
        };
        let resp = match result {
            Ok((resp, _)) => resp,
            Err(e) if e.is_retriable() => {
                self.coordinator = None;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if let Some(e) = resp.error {
            if e.code == ErrorCode::UnstableOffsetCommit {
                // Asked again after a pause, not at every poll of a member
                // whose other partitions keep returning records.
                tracing::debug!(group = %self.config.group_id, error = %e, "waiting for an open transaction's offsets");
                self.offsets_retry_at = Some(Instant::now() + COORDINATOR_RETRY_BACKOFF);
                return Ok(());
            }
            if e.code.is_retriable() {
                self.coordinator = None;
                return Ok(());
            }
            return Err(ClientError::broker(
                format!(
                    "fetch the committed offsets of group {}",
                    self.config.group_id
                ),
                e,
            ));
        }
        let mut committed: HashMap<TopicPartition, Offset> = HashMap::new();
        for o in resp.offsets {
            if let Some(offset) = o.offset {
                committed.insert(TopicPartition::new(o.topic, o.partition), offset);
            }
        }
        let without: Vec<TopicPartition> = wanted
            .iter()
            .filter(|tp| !committed.contains_key(*tp))
            .cloned()
            .collect();
        if !without.is_empty() && self.config.auto_offset_reset == OffsetReset::None {
            return Err(ClientError::Config(format!(
                "group {} has no committed offset for {} and auto_offset_reset is none: \
                 reset the group's offsets (rill group reset-offsets) or use earliest/latest",
                self.config.group_id, without[0]
            )));
        }
        self.awaiting_offsets.clear();
        self.reassign_consumer();
        for (tp, offset) in &committed {
            self.consumer.seek(tp, *offset)?;
            self.committed.insert(tp.clone(), *offset);
        }
        if !without.is_empty() {
            match self.config.auto_offset_reset {
                OffsetReset::Earliest => self.consumer.seek_to_beginning(&without).await?,
                _ => self.consumer.seek_to_end(&without).await?,
            }
        }
        tracing::debug!(group = %self.config.group_id, ?wanted, "partitions assigned");
        self.events.push(GroupEvent::Assigned(wanted));
        Ok(())
    }

    /// Acknowledges revocations surfaced by an earlier call: auto-commits their
    /// positions first (when on), then tells the coordinator.
    async fn ack_revocations(&mut self) -> Result<(), ClientError> {
        if self.revoked_unacked.is_empty() {
            return Ok(());
        }
        if self.config.enable_auto_commit {
            let offsets = self.revoked_positions();
            if let Err(e) = self.commit_inner(&offsets).await {
                tracing::warn!(group = %self.config.group_id, error = %e, "could not commit revoked partitions");
            }
        }
        self.revoked_unacked.clear();
        self.heartbeat().await
    }

    fn revoked_positions(&self) -> Vec<(TopicPartition, Offset)> {
        self.revoked_unacked
            .iter()
            .filter_map(|(tp, o)| o.map(|o| (tp.clone(), o)))
            .collect()
    }

    /// Returns the next records of the assigned partitions, waiting up to
    /// `timeout`. Also heartbeats, applies assignment changes (returning early,
    /// perhaps with no records, when partitions were revoked: see
    /// [`take_events`](Self::take_events)) and auto-commits.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>, ClientError> {
        self.check_open()?;
        let deadline = Instant::now() + timeout;
        self.ack_revocations().await?;
        loop {
            if self.session_lapsed() {
                // No heartbeat answered for a session: the partitions are
                // lost; return so the application sees it at once.
                self.lose_all();
                return Ok(Vec::new());
            }
            if Instant::now() >= self.next_heartbeat {
                let lost = self.member_epoch > 0;
                self.heartbeat().await?;
                if !self.revoked_unacked.is_empty() || (lost && self.member_epoch <= 0) {
                    return Ok(Vec::new());
                }
            }
            self.resolve_offsets().await?;
            if self.config.enable_auto_commit && Instant::now() >= self.next_auto_commit {
                self.next_auto_commit = Instant::now() + self.config.auto_commit_interval();
                let offsets = self.positions();
                if let Err(e) = self.commit_inner(&offsets).await {
                    tracing::warn!(group = %self.config.group_id, error = %e, "auto-commit failed");
                }
            }
            let mut wake = deadline.min(self.next_heartbeat);
            if !self.awaiting_offsets.is_empty() {
                wake = wake.min(Instant::now() + COORDINATOR_RETRY_BACKOFF);
            }
            let session_deadline = self.session_deadline();
            if let Some(d) = session_deadline {
                wake = wake.min(d);
            }
            let wait = wake.saturating_duration_since(Instant::now());
            let records = match session_deadline {
                // (A fetch's metadata refresh or offset lookup may take
                // longer than `wait`; the session does not wait for it.)
                Some(d) => match tokio::time::timeout_at(d, self.consumer.poll(wait)).await {
                    Ok(r) => r?,
                    Err(_) => continue,
                },
                None => self.consumer.poll(wait).await?,
            };
            if !records.is_empty() {
                return Ok(records);
            }
            if Instant::now() >= deadline {
                return Ok(Vec::new());
            }
        }
    }

    /// The position of every fetching partition.
    fn positions(&self) -> Vec<(TopicPartition, Offset)> {
        self.assignment
            .iter()
            .filter_map(|tp| self.consumer.current_position(tp).map(|o| (tp.clone(), o)))
            .collect()
    }

    /// Commits the position after everything `poll` returned, for every assigned
    /// partition and every revoked one not yet acknowledged; then acknowledges
    /// those revocations.
    pub async fn commit(&mut self) -> Result<(), ClientError> {
        self.check_open()?;
        let mut offsets = self.positions();
        offsets.extend(self.revoked_positions());
        self.commit_inner(&offsets).await?;
        self.ack_revocations().await
    }

    /// Commits explicit offsets (the next offset to read, per partition); then
    /// acknowledges pending revocations.
    pub async fn commit_offsets(
        &mut self,
        offsets: &[(TopicPartition, Offset)],
    ) -> Result<(), ClientError> {
        self.check_open()?;
        self.commit_inner(offsets).await?;
        self.ack_revocations().await
    }

    async fn commit_inner(
        &mut self,
        offsets: &[(TopicPartition, Offset)],
    ) -> Result<(), ClientError> {
        let changed: Vec<&(TopicPartition, Offset)> = offsets
            .iter()
            .filter(|(tp, o)| self.committed.get(tp) != Some(o))
            .collect();
        if changed.is_empty() || self.member_epoch <= 0 {
            return Ok(());
        }
        let req = OffsetCommitRequest {
            group_id: self.config.group_id.clone(),
            member: Some((self.member_id.clone(), self.member_epoch)),
            partitions: changed
                .iter()
                .map(|(tp, o)| OffsetCommitPartition {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    offset: *o,
                    metadata: String::new(),
                })
                .collect(),
        };
        let what = format!(
            "commit offsets of group {} (member {})",
            self.config.group_id, self.member_id
        );
        // The coordinator may be moving (its broker died, a new leader of its
        // `__consumer_offsets` partition is loading): retry within the bound,
        // and within the member's session (past it, the partitions are lost).
        // The same offsets again are harmless, so a commit that may or may not
        // have been written is simply sent again.
        let session_deadline = self.session_deadline();
        let deadline = match session_deadline {
            Some(d) => d.min(Instant::now() + COORDINATOR_MOVE_WAIT),
            None => Instant::now() + COORDINATOR_MOVE_WAIT,
        };
        let resp = loop {
            let call = async {
                let coordinator = self.coordinator().await?;
                self.client.call(Some(coordinator), &req, &[]).await
            };
            let answered = tokio::time::timeout_at(deadline, call)
                .await
                .unwrap_or_else(|_| {
                    Err(ClientError::Timeout {
                        what: format!("{what} (no answer in time)"),
                    })
                });
            if self.session_lapsed() {
                // Whatever the answer, the partitions may be another
                // member's now.
                self.lose_all();
                return Err(ClientError::Timeout {
                    what: format!(
                        "{what} (no heartbeat was answered for a session timeout, {} ms: this \
                         member's partitions are lost and it rejoins at the next poll)",
                        self.config.session_timeout_ms
                    ),
                });
            }
            let failed = match answered {
                Err(e) => e,
                Ok((resp, _)) => {
                    let retriable = resp
                        .partitions
                        .iter()
                        .find_map(|p| p.error.clone().filter(|e| e.code.is_retriable()));
                    match resp.error.clone().or(retriable) {
                        Some(e) => ClientError::broker(what.clone(), e),
                        None => break resp,
                    }
                }
            };
            if !failed.is_retriable() || Instant::now() >= deadline {
                if failed.is_fenced() {
                    // The coordinator no longer counts this member as the owner (its
                    // session ended, or the coordinator moved and has not seen it
                    // yet): the partitions are gone, the next heartbeat rejoins.
                    self.lose_all();
                }
                return Err(failed);
            }
            tracing::debug!(group = %self.config.group_id, error = %failed, "commit failed; retrying");
            self.coordinator = None;
            tokio::time::sleep_until((Instant::now() + COORDINATOR_RETRY_BACKOFF).min(deadline))
                .await;
        };
        let mut first_error = None;
        for p in resp.partitions {
            let tp = TopicPartition::new(p.topic, p.partition);
            match p.error {
                None => {
                    if let Some((_, o)) = changed.iter().find(|(t, _)| *t == tp) {
                        self.committed.insert(tp, *o);
                    }
                }
                Some(e) => {
                    first_error.get_or_insert(ClientError::broker(format!("{what}: {tp}"), e));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn check_open(&self) -> Result<(), ClientError> {
        if self.closed {
            Err(ClientError::Closed)
        } else {
            Ok(())
        }
    }

    fn leave_request(&self) -> ConsumerGroupHeartbeatRequest {
        let epoch = if self.config.group_instance_id.is_some() {
            LEAVE_GROUP_STATIC_EPOCH
        } else {
            LEAVE_GROUP_EPOCH
        };
        self.heartbeat_request(epoch)
    }

    /// Commits (with auto-commit on), then leaves the group: the partitions go
    /// to the other members at once. A static member (`group_instance_id`) keeps
    /// its assignment until its session times out, so a restart gets it back.
    pub async fn close(mut self) -> Result<(), ClientError> {
        self.check_open()?;
        let committed = if self.config.enable_auto_commit {
            let mut offsets = self.positions();
            offsets.extend(self.revoked_positions());
            self.commit_inner(&offsets).await
        } else {
            Ok(())
        };
        self.closed = true;
        if self.member_epoch > 0 {
            let req = self.leave_request();
            let coordinator = self.coordinator().await?;
            let (resp, _) = self.client.call(Some(coordinator), &req, &[]).await?;
            if let Some(e) = resp.error {
                return Err(ClientError::broker(
                    format!(
                        "leave group {} (member {})",
                        self.config.group_id, self.member_id
                    ),
                    e,
                ));
            }
        }
        committed
    }
}

impl Drop for GroupConsumer {
    fn drop(&mut self) {
        if self.closed || self.member_epoch <= 0 {
            return;
        }
        let (Ok(runtime), Some(coordinator)) =
            (tokio::runtime::Handle::try_current(), self.coordinator)
        else {
            return;
        };
        let client = self.client.clone();
        let req = self.leave_request();
        runtime.spawn(async move {
            let _ = tokio::time::timeout(
                LEAVE_ON_DROP_TIMEOUT,
                client.call(Some(coordinator), &req, &[]),
            )
            .await;
        });
    }
}
