//! `GroupCoordinator`: the consumer-group state machine of one broker, in the
//! `step(now, input) -> output` shape. No clock, no I/O, no randomness inside:
//! the shell (`service.rs`) passes the monotonic time in milliseconds, writes the
//! records an output asks for to `__consumer_offsets`, and feeds every record
//! written back as [`input::Replay`] (the same path as loading at startup).
//!
//! Model (Kafka's KIP-848): the group has an epoch, bumped whenever its
//! membership, the subscriptions or the subscribed topics' partition counts
//! change. For each group epoch the assignor computes a *target* assignment.
//! Each member converges to its target one heartbeat at a time:
//! - partitions it owns but should not are *revoked*: taken out of its
//!   assignment and held in `revoking` until a heartbeat no longer reports them;
//! - partitions it should own are *added* once no other member holds them
//!   (assigned or still revoking).
//!
//! So a partition never has two owners, and a member joining or leaving moves
//! only what the (sticky) assignor moves. A member's epoch becomes the group epoch
//! whenever its assignment changes; commits are fenced by member id, member epoch
//! (the current or the one before, in case a heartbeat response was lost) and
//! ownership of the partition.
//!
//! Durable state (committed offsets, group epochs) changes only through
//! [`input::Replay`]: a commit is validated, its records are written, and only
//! then is it visible to OffsetFetch. Membership is volatile: after a restart or
//! a move of the coordinator, members are unknown and rejoin (their heartbeats
//! get UNKNOWN_MEMBER_ID).
//!
//! Hold after a load: a member of the previous coordinator that has not yet
//! heard of the move still holds its partitions, until it gives them up
//! itself, a session timeout after its last answered heartbeat (the client
//! does), or rejoins (which it does only after giving them up). Its
//! assignment is not known here, so "no partition has two owners" cannot be
//! checked against it. So each group record is followed by a members record
//! (the member ids and their longest session timeout at that group epoch),
//! and a coordinator that loads a group whose last members record names
//! members ([`GroupCoordinator::hold_after_load`]) adds no partition to any
//! assignment (revocations go on) until each of those members rejoined or
//! left, or that session timeout passed since the load. The record also
//! maps each static member's instance id to its member id: a join with that
//! instance id under a new member id (the member restarted) ends the wait
//! for the old id, as the join would fence it. A group that was
//! empty, or whose log predates members records, is not held. (Kafka's
//! KIP-848 coordinator persists each member's assignment instead.) The
//! network-fault test (issue 21) caught the member that reached the new
//! coordinator first being given every partition while the others still
//! consumed theirs.
//!
//! The members record names the members of both protocols. A classic group
//! held after a load completes no generation (its leader assigns whatever it
//! is given) until each recorded member was told here that it is unknown
//! (UNKNOWN_MEMBER_ID to a heartbeat, a commit, a sync or a join with its
//! id: Kafka's clients then give their partitions up and join again) or
//! left, or the session passed. For the hold to know every member that may
//! hold partitions, nothing is handed out before the records naming its
//! member are replicated: a consumer-protocol heartbeat whose records were
//! not is answered with an error (the shell), and a classic SyncGroup waits
//! until its generation is durable ([`input::Replicated`]); a classic
//! generation that could not be made durable rebalances again
//! ([`input::Unwritten`]).
//!
//! Invariants (asserted in `check_invariants`, run by the tests after every
//! step): no partition is held (assigned or revoking) by two members; every
//! member's epoch is at most the group epoch.

use std::collections::{BTreeMap, BTreeSet};

use rill_proto::TimestampMs;
use rill_proto::wire::*;

use super::assignor::{self, ASSIGNORS, MemberSpec, Tp};
use super::records::{GroupRecord, GroupValue, MembersValue, OffsetValue, PendingValue};

mod classic;
pub use classic::{Pending, consumer_protocol};

/// Monotonic milliseconds, as the shell counts them.
pub type Millis = u64;

/// Longest group id.
pub const GROUP_ID_LEN_MAX: usize = 249;
/// Longest member id or instance id.
pub const MEMBER_ID_LEN_MAX: usize = 255;
/// Most topics one member may subscribe to.
pub const SUBSCRIBED_TOPICS_MAX: usize = 1000;
/// Most partitions in one heartbeat's owned list or one commit.
pub const PARTITIONS_PER_REQUEST_MAX: usize = 100_000;
/// Longest metadata string stored with a committed offset.
pub const OFFSET_METADATA_BYTES_MAX: usize = 4096;
/// Heartbeat interval told to a member that is waiting for partitions to be
/// released to it (so it takes them as soon as they are free).
pub const RECONCILE_HEARTBEAT_INTERVAL_MS: u32 = 50;
/// How long a group with no members and no committed offsets stays
/// describable (state Empty) before it is forgotten; Kafka keeps such a group
/// until its next offsets clean-up, so a describe right after the last member
/// left still finds it.
pub const EMPTY_GROUP_KEEP_MS: Millis = 60_000;

/// The coordinator's bounds.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    pub session_timeout_ms_min: u32,
    pub session_timeout_ms_max: u32,
    pub members_per_group_max: usize,
    pub groups_max: usize,
    /// How long a classic group's first rebalance waits for more members
    /// (Kafka's `group.initial.rebalance.delay.ms`).
    pub initial_rebalance_delay_ms: u32,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            session_timeout_ms_min: 1000,
            session_timeout_ms_max: 30 * 60 * 1000,
            members_per_group_max: 1000,
            groups_max: 10_000,
            initial_rebalance_delay_ms: 3000,
        }
    }
}

/// What the coordinator can be asked to do. Each input is its own type (see
/// [`input`]) and names the reply it gets, so [`GroupCoordinator::step`] returns
/// a typed [`Output`]: a heartbeat is answered with a heartbeat response, never
/// with "some reply" the caller has to match.
pub trait Input: std::fmt::Debug {
    /// The answer to this input.
    type Reply: std::fmt::Debug;
    /// Applies the input (called by [`GroupCoordinator::step`], which then
    /// checks the invariants).
    fn apply(self, coordinator: &mut GroupCoordinator, now: Millis) -> Output<Self::Reply>;
}

/// The inputs of the coordinator, one type each.
pub mod input {
    use super::*;

    /// A member's heartbeat, with the partition counts of the topics this broker
    /// knows (the coordinator looks up the group's subscriptions in it).
    #[derive(Debug, Clone)]
    pub struct Heartbeat {
        pub request: ConsumerGroupHeartbeatRequest,
        pub partition_counts: BTreeMap<String, u32>,
    }

    /// A commit; `wall_ms` is stored as the commit time. `transaction`: the
    /// transactional id of a transaction that ended; its offsets (none if it
    /// aborted) are stored whatever the group's members (its producer was
    /// fenced by epoch, not by group membership), and its pending offsets
    /// for the group dropped.
    #[derive(Debug, Clone)]
    pub struct CommitOffsets {
        pub request: OffsetCommitRequest,
        pub wall_ms: TimestampMs,
        pub transaction: Option<String>,
    }

    /// OffsetFetch; `wall_ms` decides which pending transactional offsets
    /// have expired (`require_stable`).
    #[derive(Debug, Clone)]
    pub struct FetchOffsets {
        pub request: OffsetFetchRequest,
        pub wall_ms: TimestampMs,
    }

    /// Pending transactional offsets whose expiry passed by `wall_ms` are
    /// dropped (tombstoned): their transaction's end never reached this
    /// coordinator.
    #[derive(Debug, Clone)]
    pub struct ExpirePending {
        pub wall_ms: TimestampMs,
    }

    /// An open transaction holds offsets for `partitions` of `group` until it
    /// ends or `expires_ms` (wall clock) passes.
    #[derive(Debug, Clone)]
    pub struct PendingOffsets {
        pub group: String,
        pub transactional_id: String,
        pub partitions: Vec<(String, u32)>,
        pub expires_ms: TimestampMs,
    }

    #[derive(Debug, Clone)]
    pub struct ListGroups;

    #[derive(Debug, Clone)]
    pub struct DescribeGroups(pub DescribeGroupsRequest);

    #[derive(Debug, Clone)]
    pub struct DeleteGroups(pub DeleteGroupsRequest);

    /// Time passed: expire members whose session ran out.
    #[derive(Debug, Clone)]
    pub struct Tick;

    /// A classic member's JoinGroup; `new_member_id` is the id a new member
    /// gets (the shell makes it unique).
    #[derive(Debug, Clone)]
    pub struct JoinGroup {
        pub request: JoinGroupRequest,
        pub new_member_id: String,
    }

    /// Whether a waiting JoinGroup's answer is there.
    #[derive(Debug, Clone)]
    pub struct JoinResult {
        pub group_id: String,
        pub member_id: String,
    }

    #[derive(Debug, Clone)]
    pub struct SyncGroup(pub SyncGroupRequest);

    /// Whether a waiting SyncGroup's answer is there.
    #[derive(Debug, Clone)]
    pub struct SyncResult {
        pub group_id: String,
        pub member_id: String,
        pub generation: i32,
    }

    #[derive(Debug, Clone)]
    pub struct GroupHeartbeat(pub GroupHeartbeatRequest);

    #[derive(Debug, Clone)]
    pub struct LeaveGroup(pub LeaveGroupRequest);

    /// A record that is durable in `__consumer_offsets` (written or loaded).
    #[derive(Debug, Clone)]
    pub struct Replay(pub GroupRecord);

    /// A step's group records reached the in-sync replicas: these groups'
    /// epochs are durable (a classic generation's assignment may be handed
    /// out).
    #[derive(Debug, Clone)]
    pub struct Replicated(pub Vec<(String, i32)>);

    /// A step's group records were not made durable (not appended, or not
    /// replicated): a classic generation among them rebalances again, since
    /// its assignment may not be handed out.
    #[derive(Debug, Clone)]
    pub struct Unwritten(pub Vec<(String, i32)>);
}

impl Input for input::Heartbeat {
    type Reply = ConsumerGroupHeartbeatResponse;
    fn apply(self, c: &mut GroupCoordinator, now: Millis) -> Output<Self::Reply> {
        c.heartbeat(now, self.request, &self.partition_counts)
    }
}

impl Input for input::CommitOffsets {
    type Reply = OffsetCommitResponse;
    fn apply(self, c: &mut GroupCoordinator, now: Millis) -> Output<Self::Reply> {
        c.commit(now, self.request, self.wall_ms, self.transaction)
    }
}

impl Input for input::FetchOffsets {
    type Reply = OffsetFetchResponse;
    fn apply(self, c: &mut GroupCoordinator, _now: Millis) -> Output<Self::Reply> {
        Output::reply(c.fetch(self.request, self.wall_ms))
    }
}

impl Input for input::ExpirePending {
    type Reply = ();
    fn apply(self, c: &mut GroupCoordinator, _now: Millis) -> Output<Self::Reply> {
        // A tombstone asked for is asked again only after a while (its write
        // may have failed, e.g. too few in-sync replicas; the timer runs
        // every tick).
        let wall_ms = self.wall_ms;
        let due: Vec<(String, String)> = c
            .pending
            .iter()
            .flat_map(|(group, txns)| {
                txns.iter()
                    .filter(|(_, p)| wall_ms >= p.expires_ms)
                    .map(|(txn, _)| (group.clone(), txn.clone()))
            })
            .filter(|key| {
                c.expiring
                    .get(key)
                    .is_none_or(|asked| wall_ms >= asked + EXPIRE_PENDING_AGAIN_MS)
            })
            .collect();
        let records = due
            .into_iter()
            .map(|(group, transactional_id)| {
                c.expiring
                    .insert((group.clone(), transactional_id.clone()), wall_ms);
                GroupRecord::Pending {
                    group,
                    transactional_id,
                    value: None,
                }
            })
            .collect();
        Output { reply: (), records }
    }
}

impl Input for input::PendingOffsets {
    type Reply = Result<(), ErrorInfo>;
    fn apply(self, _c: &mut GroupCoordinator, _now: Millis) -> Output<Self::Reply> {
        if let Err(e) = validate_group_id(&self.group) {
            return Output::reply(Err(e));
        }
        // Visible once durable (replayed), as a commit is.
        Output {
            reply: Ok(()),
            records: vec![GroupRecord::Pending {
                group: self.group,
                transactional_id: self.transactional_id,
                value: Some(PendingValue {
                    partitions: self.partitions,
                    expires_ms: self.expires_ms,
                }),
            }],
        }
    }
}

impl Input for input::ListGroups {
    type Reply = ListGroupsResponse;
    fn apply(self, c: &mut GroupCoordinator, _now: Millis) -> Output<Self::Reply> {
        Output::reply(c.list())
    }
}

impl Input for input::DescribeGroups {
    type Reply = DescribeGroupsResponse;
    fn apply(self, c: &mut GroupCoordinator, _now: Millis) -> Output<Self::Reply> {
        Output::reply(c.describe(self.0))
    }
}

impl Input for input::DeleteGroups {
    type Reply = DeleteGroupsResponse;
    fn apply(self, c: &mut GroupCoordinator, _now: Millis) -> Output<Self::Reply> {
        c.delete(self.0)
    }
}

impl Input for input::JoinGroup {
    type Reply = Pending<JoinGroupResponse>;
    fn apply(self, c: &mut GroupCoordinator, now: Millis) -> Output<Self::Reply> {
        c.join_group(now, self.request, self.new_member_id)
    }
}

impl Input for input::JoinResult {
    type Reply = Pending<JoinGroupResponse>;
    fn apply(self, c: &mut GroupCoordinator, _now: Millis) -> Output<Self::Reply> {
        Output::reply(c.join_result(&self.group_id, &self.member_id))
    }
}

impl Input for input::SyncGroup {
    type Reply = Pending<SyncGroupResponse>;
    fn apply(self, c: &mut GroupCoordinator, now: Millis) -> Output<Self::Reply> {
        Output::reply(c.sync_group(now, self.0))
    }
}

impl Input for input::SyncResult {
    type Reply = Pending<SyncGroupResponse>;
    fn apply(self, c: &mut GroupCoordinator, _now: Millis) -> Output<Self::Reply> {
        Output::reply(c.sync_answer(&self.group_id, &self.member_id, self.generation))
    }
}

impl Input for input::GroupHeartbeat {
    type Reply = GroupHeartbeatResponse;
    fn apply(self, c: &mut GroupCoordinator, now: Millis) -> Output<Self::Reply> {
        Output::reply(c.group_heartbeat(now, self.0))
    }
}

impl Input for input::LeaveGroup {
    type Reply = LeaveGroupResponse;
    fn apply(self, c: &mut GroupCoordinator, now: Millis) -> Output<Self::Reply> {
        c.leave_group(now, self.0)
    }
}

impl Input for input::Tick {
    type Reply = ();
    fn apply(self, c: &mut GroupCoordinator, now: Millis) -> Output<Self::Reply> {
        c.tick(now)
    }
}

impl Input for input::Replay {
    type Reply = ();
    fn apply(self, c: &mut GroupCoordinator, _now: Millis) -> Output<Self::Reply> {
        c.replay(self.0);
        Output::reply(())
    }
}

impl Input for input::Replicated {
    type Reply = ();
    fn apply(self, c: &mut GroupCoordinator, _now: Millis) -> Output<Self::Reply> {
        for (gid, epoch) in self.0 {
            // (Not for a group deleted and made again meanwhile, whose
            // epochs started over.)
            if let Some(g) = c.groups.get_mut(&gid).filter(|g| epoch <= g.epoch) {
                g.durable_epoch = g.durable_epoch.max(epoch);
            }
        }
        Output::reply(())
    }
}

impl Input for input::Unwritten {
    type Reply = ();
    fn apply(self, c: &mut GroupCoordinator, now: Millis) -> Output<Self::Reply> {
        for (gid, epoch) in self.0 {
            c.classic_unwritten(&gid, epoch, now);
        }
        Output::reply(())
    }
}

/// What a step produced: the reply, and records to make durable (then replay)
/// before the reply is sent.
#[derive(Debug, Clone)]
pub struct Output<R> {
    pub reply: R,
    pub records: Vec<GroupRecord>,
}

impl<R> Output<R> {
    fn reply(reply: R) -> Output<R> {
        Output {
            reply,
            records: Vec::new(),
        }
    }
}

#[derive(Debug, Clone)]
struct Member {
    instance_id: Option<String>,
    client_id: String,
    epoch: i32,
    prev_epoch: i32,
    subscribed: Vec<String>,
    session_timeout_ms: u32,
    heartbeat_interval_ms: u32,
    deadline: Millis,
    assigned: BTreeSet<Tp>,
    revoking: BTreeSet<Tp>,
    /// A static member that left with epoch -2 (keeps its place until `deadline`).
    left: bool,
}

#[derive(Debug, Clone, Default)]
struct Group {
    epoch: i32,
    /// The epoch last sent out to be written.
    persisted_epoch: i32,
    /// The newest epoch known to be in the in-sync replicas' logs (written
    /// and replicated here, or loaded from the log as its new leader). A
    /// classic member gets its generation's assignment only once that
    /// generation is durable, so a successor coordinator knows its members.
    durable_epoch: i32,
    assignor: String,
    members: BTreeMap<String, Member>,
    target: BTreeMap<String, BTreeSet<Tp>>,
    target_epoch: i32,
    /// Partition counts of the subscribed topics as of the last heartbeat.
    topics: BTreeMap<String, u32>,
    offsets: BTreeMap<Tp, OffsetValue>,
    /// Members of Kafka's classic protocol (none while `members` has any).
    classic: classic::Classic,
    /// When a tick first found the group with no members and no offsets.
    empty_since: Option<Millis>,
    /// The members as the log's last members record names them.
    recorded_members: Option<MembersValue>,
    /// After a load: see "Hold after a load" in the module doc.
    hold: Option<Hold>,
}

/// A group loaded from the log waits for the previous coordinator's members.
#[derive(Debug, Clone)]
struct Hold {
    /// Members of the previous coordinator that have not rejoined or left.
    awaited: BTreeSet<String>,
    /// Instance id -> member id of the static ones among them: a join with
    /// that instance id is the member restarted (its old incarnation holds
    /// nothing, or is fenced by the join).
    statics: BTreeMap<String, String>,
    /// Until when at most (the load plus their longest session timeout).
    until: Millis,
}

impl Hold {
    /// A static member joined with `instance_id` under a new member id: if
    /// the previous coordinator knew that instance under another id, that
    /// incarnation restarted (or is fenced now), and is no longer awaited.
    fn instance_rejoined(&mut self, instance_id: Option<&str>) {
        if let Some(old) = instance_id.and_then(|iid| self.statics.remove(iid)) {
            self.awaited.remove(&old);
        }
    }
}

impl Group {
    fn bump(&mut self) {
        self.epoch += 1;
    }

    /// Whether the group has members of either protocol.
    fn has_members(&self) -> bool {
        !self.members.is_empty() || !self.classic.members.is_empty()
    }

    fn member_count(&self) -> usize {
        self.members.len() + self.classic.members.len()
    }

    fn state(&self) -> &'static str {
        if !self.classic.members.is_empty() || self.classic.phase != classic::Phase::Empty {
            self.classic.phase.name()
        } else if self.members.is_empty() {
            "Empty"
        } else if self.members.iter().any(|(id, m)| {
            !m.revoking.is_empty() || self.target.get(id).is_none_or(|t| *t != m.assigned)
        }) || self.target_epoch != self.epoch
        {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    fn subscribed_counts(&self, counts: &BTreeMap<String, u32>) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        for m in self.members.values() {
            for t in &m.subscribed {
                out.insert(t.clone(), counts.get(t).copied().unwrap_or(0));
            }
        }
        out
    }

    fn compute_target(&mut self) {
        let specs: Vec<MemberSpec<'_>> = self
            .members
            .iter()
            .map(|(id, m)| MemberSpec {
                member_id: id,
                topics: &m.subscribed,
                current: self.target.get(id).unwrap_or(&m.assigned),
            })
            .collect();
        let target = assignor::assign(&self.assignor, &specs, &self.topics);
        self.target = target;
        self.target_epoch = self.epoch;
    }

    /// Until when no partition may be added to an assignment (see "Hold after
    /// a load" in the module doc), if that is after `now`.
    fn held_until(&self, now: Millis) -> Option<Millis> {
        self.hold
            .as_ref()
            .filter(|h| !h.awaited.is_empty() && now < h.until)
            .map(|h| h.until)
    }

    /// A member of the previous coordinator rejoined or left: it holds nothing.
    fn no_longer_awaited(&mut self, member_id: &str) {
        if let Some(h) = &mut self.hold {
            h.awaited.remove(member_id);
        }
    }

    /// See [`Hold::instance_rejoined`].
    fn instance_rejoined(&mut self, instance_id: Option<&str>) {
        if let Some(h) = &mut self.hold {
            h.instance_rejoined(instance_id);
        }
    }

    /// Moves one member towards its target: revoke what it should not own, add
    /// what it should own and nobody else holds (not while held after a load).
    fn reconcile(&mut self, member_id: &str, now: Millis) {
        let held_after_load = self.held_until(now).is_some();
        let target = self.target.get(member_id).cloned().unwrap_or_default();
        let held: BTreeSet<Tp> = self
            .members
            .iter()
            .filter(|(id, _)| id.as_str() != member_id)
            .flat_map(|(_, m)| m.assigned.iter().chain(m.revoking.iter()).cloned())
            .collect();
        let group_epoch = self.epoch;
        let m = self.members.get_mut(member_id).expect("member exists");
        let before = m.assigned.clone();
        let revoke: Vec<Tp> = m.assigned.difference(&target).cloned().collect();
        for tp in revoke {
            m.assigned.remove(&tp);
            m.revoking.insert(tp);
        }
        for tp in target.into_iter().filter(|_| !held_after_load) {
            if !held.contains(&tp) && !m.assigned.contains(&tp) {
                m.revoking.remove(&tp);
                m.assigned.insert(tp);
            }
        }
        if m.assigned != before || m.epoch == 0 {
            m.prev_epoch = m.epoch;
            m.epoch = group_epoch;
        }
    }

    fn remove_member(&mut self, member_id: &str) -> bool {
        if self.members.remove(member_id).is_some() {
            self.target.remove(member_id);
            self.bump();
            true
        } else {
            false
        }
    }
}

/// The consumer groups this broker coordinates.
#[derive(Debug)]
pub struct GroupCoordinator {
    config: CoordinatorConfig,
    groups: BTreeMap<String, Group>,
    /// Open transactions' offsets: group -> transactional id -> what it
    /// holds (kept apart from the groups: a group with only pending offsets
    /// has nothing to describe yet).
    pending: BTreeMap<String, BTreeMap<String, PendingValue>>,
    /// Expired pending records whose tombstone was asked for, and when.
    expiring: BTreeMap<(String, String), TimestampMs>,
}

/// How long after asking for an expired pending record's tombstone the
/// timer asks again (if it did not replay).
pub const EXPIRE_PENDING_AGAIN_MS: TimestampMs = 5_000;

fn err(code: ErrorCode, message: impl Into<String>) -> Option<ErrorInfo> {
    Some(ErrorInfo::new(code, message))
}

fn to_topic_partitions(set: &BTreeSet<Tp>) -> Vec<TopicPartitions> {
    let mut out: Vec<TopicPartitions> = Vec::new();
    for (topic, p) in set {
        match out.last_mut() {
            Some(last) if last.topic == *topic => last.partitions.push(*p),
            _ => out.push(TopicPartitions {
                topic: topic.clone(),
                partitions: vec![*p],
            }),
        }
    }
    out
}

fn from_topic_partitions(list: &[TopicPartitions]) -> BTreeSet<Tp> {
    list.iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.topic.clone(), *p)))
        .collect()
}

/// Checks a group id: non-empty, bounded, printable.
pub fn validate_group_id(group_id: &str) -> Result<(), ErrorInfo> {
    if group_id.is_empty() || group_id.len() > GROUP_ID_LEN_MAX {
        return Err(ErrorInfo::new(
            ErrorCode::InvalidGroupId,
            format!(
                "group id {group_id:?} is not valid: it must be 1 to {GROUP_ID_LEN_MAX} bytes long"
            ),
        ));
    }
    if group_id.chars().any(char::is_control) {
        return Err(ErrorInfo::new(
            ErrorCode::InvalidGroupId,
            format!("group id {group_id:?} is not valid: it contains control characters"),
        ));
    }
    Ok(())
}

pub(super) fn heartbeat_error(
    error: Option<ErrorInfo>,
    req: &ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    ConsumerGroupHeartbeatResponse {
        error,
        member_id: req.member_id.clone(),
        member_epoch: req.member_epoch,
        heartbeat_interval_ms: 0,
        session_timeout_ms: 0,
        assignment: Vec::new(),
    }
}

impl GroupCoordinator {
    pub fn new(config: CoordinatorConfig) -> GroupCoordinator {
        GroupCoordinator {
            config,
            groups: BTreeMap::new(),
            pending: BTreeMap::new(),
            expiring: BTreeMap::new(),
        }
    }

    /// Forgets every group `keep` refuses: the shell drops the groups of a
    /// `__consumer_offsets` partition this broker stopped leading, or is about
    /// to load again from the log.
    pub fn retain_groups(&mut self, keep: impl Fn(&str) -> bool) {
        self.groups.retain(|gid, _| keep(gid));
        self.pending.retain(|gid, _| keep(gid));
        self.expiring.retain(|(gid, _), _| keep(gid));
    }

    /// The groups were loaded from the log at `now`: each whose last members
    /// record names members waits for them (see "Hold after a load" in the
    /// module doc).
    pub fn hold_after_load(&mut self, now: Millis) {
        for g in self.groups.values_mut() {
            // The new leader's log is the truth: what it holds is durable.
            g.durable_epoch = g.persisted_epoch;
            g.hold = g
                .recorded_members
                .as_ref()
                .filter(|m| !m.member_ids.is_empty())
                .map(|m| Hold {
                    awaited: m.member_ids.iter().cloned().collect(),
                    statics: m.static_members.iter().cloned().collect(),
                    until: now + m.session_timeout_ms_max as Millis,
                });
        }
    }

    /// Takes over the groups of `loaded` (a coordinator that replayed one
    /// `__consumer_offsets` partition on its own), replacing every group of
    /// that partition held here (`of_partition` says which).
    pub fn adopt(&mut self, loaded: GroupCoordinator, of_partition: impl Fn(&str) -> bool) {
        self.groups.retain(|gid, _| !of_partition(gid));
        self.groups.extend(loaded.groups);
        self.pending.retain(|gid, _| !of_partition(gid));
        self.pending.extend(loaded.pending);
        self.expiring.retain(|(gid, _), _| !of_partition(gid));
        #[cfg(debug_assertions)]
        self.check_invariants();
    }

    /// Applies one input at time `now`.
    pub fn step<I: Input>(&mut self, now: Millis, input: I) -> Output<I::Reply> {
        let out = input.apply(self, now);
        #[cfg(debug_assertions)]
        self.check_invariants();
        out
    }

    /// Panics if an invariant is broken (see the module doc).
    pub fn check_invariants(&self) {
        for (gid, g) in &self.groups {
            assert!(
                g.members.is_empty() || g.classic.members.is_empty(),
                "group {gid} has members of both protocols"
            );
            if matches!(
                g.classic.phase,
                classic::Phase::CompletingRebalance | classic::Phase::Stable
            ) {
                let leader = g.classic.leader.as_ref();
                assert!(
                    leader.is_some_and(|l| g.classic.members.contains_key(l)),
                    "group {gid}: classic leader {leader:?} is not a member"
                );
            }
            let mut holders: BTreeMap<&Tp, &str> = BTreeMap::new();
            for (mid, m) in &g.members {
                assert!(
                    m.epoch <= g.epoch,
                    "group {gid}: member {mid} epoch {} above group epoch {}",
                    m.epoch,
                    g.epoch
                );
                for tp in m.assigned.iter().chain(m.revoking.iter()) {
                    if let Some(other) = holders.insert(tp, mid) {
                        panic!("group {gid}: {tp:?} held by both {other} and {mid}");
                    }
                }
            }
        }
    }

    /// The next time a session can expire (for the shell's timer), if any member.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.groups
            .values()
            .flat_map(|g| {
                let c = &g.classic;
                // A rebalance ends by time at its deadline, or when the
                // initial delay is over (if everyone has joined by then).
                let rebalance = (c.phase == classic::Phase::PreparingRebalance).then(|| {
                    match c.initial_until {
                        0 => c.join_deadline,
                        t => t.min(c.join_deadline),
                    }
                });
                g.members
                    .values()
                    .map(|m| m.deadline)
                    .chain(c.members.values().map(|m| m.deadline))
                    .chain(c.pending.values().copied())
                    .chain(rebalance)
            })
            .min()
    }

    /// Whether the group has members (live, or static ones that left for a moment).
    pub fn has_members(&self, group_id: &str) -> bool {
        self.groups.get(group_id).is_some_and(Group::has_members)
    }

    fn validate_heartbeat(&self, req: &ConsumerGroupHeartbeatRequest) -> Result<(), ErrorInfo> {
        validate_group_id(&req.group_id)?;
        let invalid = |m: String| Err(ErrorInfo::new(ErrorCode::InvalidRequest, m));
        if req.member_id.is_empty() || req.member_id.len() > MEMBER_ID_LEN_MAX {
            return invalid(format!(
                "group {}: member id must be 1 to {MEMBER_ID_LEN_MAX} bytes long",
                req.group_id
            ));
        }
        if req
            .instance_id
            .as_ref()
            .is_some_and(|i| i.is_empty() || i.len() > MEMBER_ID_LEN_MAX)
        {
            return invalid(format!(
                "group {}: instance id must be 1 to {MEMBER_ID_LEN_MAX} bytes long",
                req.group_id
            ));
        }
        if req.member_epoch < 0 {
            return Ok(());
        }
        if req.subscribed_topics.len() > SUBSCRIBED_TOPICS_MAX {
            return invalid(format!(
                "group {}: member subscribes to {} topics; at most {SUBSCRIBED_TOPICS_MAX}",
                req.group_id,
                req.subscribed_topics.len()
            ));
        }
        let owned: usize = req.owned.iter().map(|t| t.partitions.len()).sum();
        if owned > PARTITIONS_PER_REQUEST_MAX {
            return invalid(format!(
                "group {}: heartbeat reports {owned} owned partitions; at most {PARTITIONS_PER_REQUEST_MAX}",
                req.group_id
            ));
        }
        if !ASSIGNORS.contains(&req.assignor.as_str()) {
            return Err(ErrorInfo::new(
                ErrorCode::InconsistentGroupProtocol,
                format!(
                    "group {}: unknown assignor {:?}; use one of {}",
                    req.group_id,
                    req.assignor,
                    ASSIGNORS.join(", ")
                ),
            ));
        }
        let (min, max) = (
            self.config.session_timeout_ms_min,
            self.config.session_timeout_ms_max,
        );
        if req.session_timeout_ms < min || req.session_timeout_ms > max {
            return Err(ErrorInfo::new(
                ErrorCode::InvalidConfig,
                format!(
                    "group {}: session timeout {} ms is outside the broker's range [{min}, {max}] ms \
                     (group_min_session_timeout_ms, group_max_session_timeout_ms)",
                    req.group_id, req.session_timeout_ms
                ),
            ));
        }
        if req.heartbeat_interval_ms == 0 || req.heartbeat_interval_ms >= req.session_timeout_ms {
            return Err(ErrorInfo::new(
                ErrorCode::InvalidConfig,
                format!(
                    "group {}: heartbeat interval {} ms must be above 0 and below the session timeout {} ms",
                    req.group_id, req.heartbeat_interval_ms, req.session_timeout_ms
                ),
            ));
        }
        Ok(())
    }

    fn heartbeat(
        &mut self,
        now: Millis,
        req: ConsumerGroupHeartbeatRequest,
        counts: &BTreeMap<String, u32>,
    ) -> Output<ConsumerGroupHeartbeatResponse> {
        if let Err(e) = self.validate_heartbeat(&req) {
            return Output::reply(heartbeat_error(Some(e), &req));
        }
        let gid = req.group_id.clone();
        let mid = req.member_id.clone();

        // Leaving.
        if req.member_epoch == LEAVE_GROUP_EPOCH || req.member_epoch == LEAVE_GROUP_STATIC_EPOCH {
            let mut records = Vec::new();
            if let Some(g) = self.groups.get_mut(&gid) {
                if req.member_epoch == LEAVE_GROUP_EPOCH {
                    g.no_longer_awaited(&mid);
                }
                let is_static = g.members.get(&mid).is_some_and(|m| m.instance_id.is_some());
                if req.member_epoch == LEAVE_GROUP_STATIC_EPOCH && is_static {
                    let m = g.members.get_mut(&mid).expect("checked");
                    m.left = true;
                    m.deadline = now + m.session_timeout_ms as u64;
                } else if g.remove_member(&mid) {
                    records.extend(self.epoch_record(&gid));
                }
            }
            return Output {
                reply: ConsumerGroupHeartbeatResponse {
                    error: None,
                    member_id: mid,
                    member_epoch: req.member_epoch,
                    heartbeat_interval_ms: 0,
                    session_timeout_ms: 0,
                    assignment: Vec::new(),
                },
                records,
            };
        }
        if req.member_epoch < 0 {
            return Output::reply(heartbeat_error(
                err(
                    ErrorCode::InvalidRequest,
                    format!(
                        "group {gid}: member epoch {} is not valid (0 joins, -1 leaves, -2 leaves for a moment)",
                        req.member_epoch
                    ),
                ),
                &req,
            ));
        }

        if !self.groups.contains_key(&gid) {
            if req.member_epoch != JOIN_GROUP_EPOCH {
                return Output::reply(heartbeat_error(
                    err(
                        ErrorCode::UnknownMemberId,
                        format!(
                            "group {gid} has no member {mid} (the coordinator restarted or moved?): rejoin"
                        ),
                    ),
                    &req,
                ));
            }
            if self.groups.len() >= self.config.groups_max {
                return Output::reply(heartbeat_error(
                    err(
                        ErrorCode::GroupMaxSizeReached,
                        format!(
                            "this broker coordinates {} groups already, its maximum; delete unused groups (rill group delete)",
                            self.config.groups_max
                        ),
                    ),
                    &req,
                ));
            }
            self.groups.insert(gid.clone(), Group::default());
        }
        let members_max = self.config.members_per_group_max;
        let g = self.groups.get_mut(&gid).expect("present");
        if !g.classic.members.is_empty() {
            let n = g.classic.members.len();
            return Output::reply(heartbeat_error(
                err(
                    ErrorCode::InconsistentGroupProtocol,
                    format!(
                        "group {gid} has {n} member(s) using Kafka's classic group protocol; a member of \
                         Rill's consumer-group protocol cannot join it (use another group id)"
                    ),
                ),
                &req,
            ));
        }
        let others_assignor = g.members.keys().any(|k| *k != mid);
        if others_assignor && g.assignor != req.assignor {
            let assignor = g.assignor.clone();
            return Output::reply(heartbeat_error(
                err(
                    ErrorCode::InconsistentGroupProtocol,
                    format!(
                        "group {gid} uses assignor {assignor:?} but this member asks for {:?}: use the same assignor in every member",
                        req.assignor
                    ),
                ),
                &req,
            ));
        }
        g.assignor = req.assignor.clone();

        if req.member_epoch == JOIN_GROUP_EPOCH {
            // A member of the previous coordinator rejoins only after giving
            // up its partitions; a static one may have restarted instead.
            g.no_longer_awaited(&mid);
            g.instance_rejoined(req.instance_id.as_deref());
            if g.members.contains_key(&mid) {
                // Rejoining under the same id: start over.
                g.remove_member(&mid);
            }
            let replaced = req.instance_id.as_ref().and_then(|iid| {
                g.members
                    .iter()
                    .find(|(_, m)| m.instance_id.as_ref() == Some(iid))
                    .map(|(id, _)| id.clone())
            });
            let member = match replaced {
                Some(old_id) => {
                    // Static membership: the new incarnation takes over the old
                    // one's place, epoch and assignment; the old id is fenced.
                    let mut old = g.members.remove(&old_id).expect("found");
                    if let Some(t) = g.target.remove(&old_id) {
                        g.target.insert(mid.clone(), t);
                    }
                    old.revoking.clear();
                    old.left = false;
                    // A new epoch, so the members record names the new id
                    // (a successor coordinator waits for it, not the old).
                    g.bump();
                    old
                }
                None => {
                    if g.members.len() >= members_max {
                        return Output::reply(heartbeat_error(
                            err(
                                ErrorCode::GroupMaxSizeReached,
                                format!(
                                    "group {gid} has {members_max} members, the broker's maximum (group_max_size)"
                                ),
                            ),
                            &req,
                        ));
                    }
                    g.bump();
                    Member {
                        instance_id: req.instance_id.clone(),
                        client_id: String::new(),
                        epoch: 0,
                        prev_epoch: 0,
                        subscribed: req.subscribed_topics.clone(),
                        session_timeout_ms: req.session_timeout_ms,
                        heartbeat_interval_ms: req.heartbeat_interval_ms,
                        deadline: 0,
                        assigned: BTreeSet::new(),
                        revoking: BTreeSet::new(),
                        left: false,
                    }
                }
            };
            g.members.insert(mid.clone(), member);
        } else {
            let Some(m) = g.members.get(&mid) else {
                return Output::reply(heartbeat_error(
                    err(
                        ErrorCode::UnknownMemberId,
                        format!(
                            "group {gid} has no member {mid} (removed after its session timed out, or replaced by a newer instance): rejoin"
                        ),
                    ),
                    &req,
                ));
            };
            if req.member_epoch != m.epoch && req.member_epoch != m.prev_epoch {
                let current = m.epoch;
                return Output::reply(heartbeat_error(
                    err(
                        ErrorCode::FencedMemberEpoch,
                        format!(
                            "group {gid}: member {mid} sent epoch {} but its epoch is {current}: rejoin",
                            req.member_epoch
                        ),
                    ),
                    &req,
                ));
            }
        }

        // Refresh the member from its heartbeat.
        let owned = from_topic_partitions(&req.owned);
        let m = g.members.get_mut(&mid).expect("inserted above");
        m.deadline = now + req.session_timeout_ms as u64;
        m.session_timeout_ms = req.session_timeout_ms;
        m.heartbeat_interval_ms = req.heartbeat_interval_ms;
        m.client_id = req.client_id.clone();
        m.instance_id = req.instance_id.clone();
        m.left = false;
        m.revoking.retain(|tp| owned.contains(tp));
        let resubscribed = m.subscribed != req.subscribed_topics;
        if resubscribed {
            m.subscribed = req.subscribed_topics.clone();
            g.bump();
        }
        let topics = g.subscribed_counts(counts);
        if topics != g.topics {
            g.topics = topics;
            if g.target_epoch == g.epoch {
                g.bump();
            }
        }
        if g.target_epoch != g.epoch {
            g.compute_target();
        }
        g.reconcile(&mid, now);

        let m = &g.members[&mid];
        let waiting = g.target.get(&mid).is_some_and(|t| *t != m.assigned);
        let interval = match g.held_until(now) {
            // Back when the hold ends (or at the usual interval).
            Some(until) if waiting => m.heartbeat_interval_ms.min((until - now).max(1) as u32),
            _ if waiting => m.heartbeat_interval_ms.min(RECONCILE_HEARTBEAT_INTERVAL_MS),
            _ => m.heartbeat_interval_ms,
        };
        let reply = ConsumerGroupHeartbeatResponse {
            error: None,
            member_id: mid,
            member_epoch: m.epoch,
            heartbeat_interval_ms: interval,
            session_timeout_ms: m.session_timeout_ms,
            assignment: to_topic_partitions(&m.assigned),
        };
        Output {
            reply,
            records: self.epoch_record(&gid),
        }
    }

    /// The group record, then the members record, to write when the epoch
    /// moved past what was written.
    fn epoch_record(&mut self, gid: &str) -> Vec<GroupRecord> {
        let Some(g) = self.groups.get_mut(gid) else {
            return Vec::new();
        };
        if g.epoch <= g.persisted_epoch {
            return Vec::new();
        }
        g.persisted_epoch = g.epoch;
        let mut records = vec![GroupRecord::Group {
            group: gid.to_string(),
            value: Some(GroupValue {
                group_epoch: g.epoch,
                assignor: g.assignor.clone(),
            }),
        }];
        // (Not for a group that had and has no members.) Members of either
        // protocol: a successor waits for classic members too.
        let had_members = g
            .recorded_members
            .as_ref()
            .is_some_and(|m| !m.member_ids.is_empty());
        if !g.has_members() && !had_members {
            return records;
        }
        let sessions = g
            .members
            .values()
            .map(|m| m.session_timeout_ms)
            .chain(g.classic.members.values().map(|m| m.session_timeout_ms));
        records.push(GroupRecord::Members {
            group: gid.to_string(),
            value: Some(MembersValue {
                member_ids: g
                    .members
                    .keys()
                    .chain(g.classic.members.keys())
                    .cloned()
                    .collect(),
                session_timeout_ms_max: sessions.max().unwrap_or(0),
                static_members: g
                    .members
                    .iter()
                    .filter_map(|(id, m)| Some((m.instance_id.clone()?, id.clone())))
                    .chain(
                        g.classic
                            .members
                            .iter()
                            .filter_map(|(id, m)| Some((m.instance_id.clone()?, id.clone()))),
                    )
                    .collect(),
            }),
        });
        records
    }

    fn commit(
        &mut self,
        now: Millis,
        req: OffsetCommitRequest,
        wall_ms: TimestampMs,
        transaction: Option<String>,
    ) -> Output<OffsetCommitResponse> {
        let transactional = transaction.is_some();
        let whole = |e: ErrorInfo| {
            Output::reply(OffsetCommitResponse {
                error: Some(e),
                partitions: Vec::new(),
            })
        };
        if let Err(e) = validate_group_id(&req.group_id) {
            return whole(e);
        }
        if req.partitions.len() > PARTITIONS_PER_REQUEST_MAX {
            return whole(ErrorInfo::new(
                ErrorCode::InvalidRequest,
                format!(
                    "group {}: a commit carries at most {PARTITIONS_PER_REQUEST_MAX} partitions, this one {}",
                    req.group_id,
                    req.partitions.len()
                ),
            ));
        }
        let gid = &req.group_id;
        // A classic member is fenced by its generation; it owns what its
        // leader gave it, which the coordinator does not read.
        let classic = match &req.member {
            Some((mid, generation))
                if !transactional
                    && self
                        .groups
                        .get(gid)
                        .is_some_and(|g| !g.classic.members.is_empty()) =>
            {
                if let Err(e) = self.check_classic_commit(now, gid, mid, *generation) {
                    return whole(e);
                }
                true
            }
            _ => false,
        };
        let group = self.groups.get(gid);
        let owner: Option<&Member> = match &req.member {
            _ if transactional => None,
            Some(_) if classic => None,
            Some((mid, epoch)) => {
                let Some(m) = group.and_then(|g| g.members.get(mid)) else {
                    return whole(ErrorInfo::new(
                        ErrorCode::UnknownMemberId,
                        format!(
                            "group {gid} has no member {mid} (removed after its session timed out?): \
                             the commit is refused; rejoin and consume again from the last committed offsets"
                        ),
                    ));
                };
                if *epoch != m.epoch && *epoch != m.prev_epoch {
                    return whole(ErrorInfo::new(
                        ErrorCode::FencedMemberEpoch,
                        format!(
                            "group {gid}: member {mid} committed with epoch {epoch} but its epoch is {}: \
                             the commit is refused",
                            m.epoch
                        ),
                    ));
                }
                Some(m)
            }
            None => {
                if let Some(g) = group
                    && g.has_members()
                {
                    let ids: Vec<&str> = g
                        .members
                        .keys()
                        .chain(g.classic.members.keys())
                        .map(String::as_str)
                        .take(5)
                        .collect();
                    return whole(ErrorInfo::new(
                        ErrorCode::NonEmptyGroup,
                        format!(
                            "group {gid} has {} member(s) ({}): stop them, or wait for their session timeout, \
                             before resetting its offsets (see `rill group describe {gid}`)",
                            g.member_count(),
                            ids.join(", ")
                        ),
                    ));
                }
                None
            }
        };
        let mut partitions = Vec::with_capacity(req.partitions.len());
        let mut records = Vec::with_capacity(req.partitions.len());
        for p in req.partitions {
            let tp = (p.topic.clone(), p.partition);
            let error = if p.offset.0 < 0 {
                err(
                    ErrorCode::InvalidRequest,
                    format!(
                        "group {gid}: offset {} for {}-{} is negative",
                        p.offset, p.topic, p.partition
                    ),
                )
            } else if p.metadata.len() > OFFSET_METADATA_BYTES_MAX {
                err(
                    ErrorCode::InvalidRequest,
                    format!(
                        "group {gid}: commit metadata for {}-{} is {} bytes; at most {OFFSET_METADATA_BYTES_MAX}",
                        p.topic,
                        p.partition,
                        p.metadata.len()
                    ),
                )
            } else if let Some(m) = owner
                && !m.assigned.contains(&tp)
                && !m.revoking.contains(&tp)
            {
                err(
                    ErrorCode::UnknownMemberId,
                    format!(
                        "group {gid}: {}-{} is not assigned to this member (it moved to another): the commit is refused",
                        p.topic, p.partition
                    ),
                )
            } else {
                records.push(GroupRecord::Offset {
                    group: gid.clone(),
                    topic: p.topic.clone(),
                    partition: p.partition,
                    value: Some(OffsetValue {
                        offset: p.offset,
                        metadata: p.metadata,
                        commit_timestamp_ms: wall_ms,
                    }),
                });
                None
            };
            partitions.push(OffsetCommitPartitionResponse {
                topic: p.topic,
                partition: p.partition,
                error,
            });
        }
        // The transaction ended: its offsets are no longer pending (in the
        // same batch as the offsets it stored).
        if let Some(txn) = transaction
            && self.pending.get(gid).is_some_and(|p| p.contains_key(&txn))
        {
            records.push(GroupRecord::Pending {
                group: gid.clone(),
                transactional_id: txn,
                value: None,
            });
        }
        Output {
            reply: OffsetCommitResponse {
                error: None,
                partitions,
            },
            records,
        }
    }

    /// The partitions of `gid` among `asked` (all if `None`) that an open
    /// transaction holds offsets for at wall time `wall_ms`.
    fn unstable(
        &self,
        gid: &str,
        asked: Option<&BTreeSet<Tp>>,
        wall_ms: TimestampMs,
    ) -> BTreeSet<Tp> {
        self.pending
            .get(gid)
            .into_iter()
            .flat_map(|txns| txns.values())
            .filter(|p| wall_ms < p.expires_ms)
            .flat_map(|p| p.partitions.iter().cloned())
            .filter(|tp| asked.is_none_or(|a| a.contains(tp)))
            .collect()
    }

    fn committed(gid: &str, g: Option<&Group>, tp: &Tp) -> CommittedOffset {
        let _ = gid;
        let v = g.and_then(|g| g.offsets.get(tp));
        CommittedOffset {
            topic: tp.0.clone(),
            partition: tp.1,
            offset: v.map(|v| v.offset),
            metadata: v.map(|v| v.metadata.clone()).unwrap_or_default(),
            commit_timestamp_ms: v.map_or(-1, |v| v.commit_timestamp_ms),
        }
    }

    fn fetch(&self, req: OffsetFetchRequest, wall_ms: TimestampMs) -> OffsetFetchResponse {
        if let Err(e) = validate_group_id(&req.group_id) {
            return OffsetFetchResponse {
                error: Some(e),
                offsets: Vec::new(),
            };
        }
        if req.require_stable {
            let asked = req.partitions.as_deref().map(from_topic_partitions);
            let unstable = self.unstable(&req.group_id, asked.as_ref(), wall_ms);
            if !unstable.is_empty() {
                let names: Vec<String> = unstable
                    .iter()
                    .take(5)
                    .map(|(t, p)| format!("{t}-{p}"))
                    .collect();
                return OffsetFetchResponse {
                    error: Some(ErrorInfo::new(
                        ErrorCode::UnstableOffsetCommit,
                        format!(
                            "group {}: an open transaction holds offsets for {} partition(s) ({}{}): \
                             retry once it commits or aborts",
                            req.group_id,
                            unstable.len(),
                            names.join(", "),
                            if unstable.len() > names.len() {
                                ", ..."
                            } else {
                                ""
                            }
                        ),
                    )),
                    offsets: unstable
                        .into_iter()
                        .map(|(topic, partition)| CommittedOffset {
                            topic,
                            partition,
                            offset: None,
                            metadata: String::new(),
                            commit_timestamp_ms: -1,
                        })
                        .collect(),
                };
            }
        }
        let g = self.groups.get(&req.group_id);
        let offsets = match req.partitions {
            None => g
                .map(|g| {
                    g.offsets
                        .keys()
                        .map(|tp| Self::committed(&req.group_id, Some(g), tp))
                        .collect()
                })
                .unwrap_or_default(),
            Some(list) => from_topic_partitions(&list)
                .iter()
                .map(|tp| Self::committed(&req.group_id, g, tp))
                .collect(),
        };
        OffsetFetchResponse {
            error: None,
            offsets,
        }
    }

    fn list(&self) -> ListGroupsResponse {
        ListGroupsResponse {
            groups: self
                .groups
                .iter()
                .map(|(id, g)| GroupListing {
                    group_id: id.clone(),
                    state: g.state().to_string(),
                    members: g.member_count() as u32,
                })
                .collect(),
        }
    }

    fn describe(&self, req: DescribeGroupsRequest) -> DescribeGroupsResponse {
        let groups = req
            .group_ids
            .into_iter()
            .map(|gid| match self.groups.get(&gid) {
                None => GroupDescription {
                    error: err(
                        ErrorCode::GroupIdNotFound,
                        format!("group {gid} does not exist (no members, no committed offsets)"),
                    ),
                    group_id: gid,
                    state: "Dead".into(),
                    group_epoch: 0,
                    assignor: String::new(),
                    members: Vec::new(),
                    offsets: Vec::new(),
                },
                Some(g) => GroupDescription {
                    error: None,
                    state: g.state().to_string(),
                    group_epoch: g.epoch,
                    assignor: g.assignor.clone(),
                    members: if !g.classic.members.is_empty() {
                        Self::describe_classic(g)
                    } else {
                        g.members
                            .iter()
                            .map(|(id, m)| GroupMemberDescription {
                                member_id: id.clone(),
                                instance_id: m.instance_id.clone(),
                                client_id: m.client_id.clone(),
                                member_epoch: m.epoch,
                                subscribed_topics: m.subscribed.clone(),
                                assignment: to_topic_partitions(&m.assigned),
                                revoking: to_topic_partitions(&m.revoking),
                                left: m.left,
                            })
                            .collect()
                    },
                    offsets: g
                        .offsets
                        .keys()
                        .map(|tp| Self::committed(&gid, Some(g), tp))
                        .collect(),
                    group_id: gid,
                },
            })
            .collect();
        DescribeGroupsResponse { groups }
    }

    fn delete(&mut self, req: DeleteGroupsRequest) -> Output<DeleteGroupsResponse> {
        let mut results = Vec::new();
        let mut records = Vec::new();
        for gid in req.group_ids {
            let error = match self.groups.get(&gid) {
                None => err(
                    ErrorCode::GroupIdNotFound,
                    format!("group {gid} does not exist"),
                ),
                Some(g) if g.has_members() => err(
                    ErrorCode::NonEmptyGroup,
                    format!(
                        "group {gid} has {} member(s): stop them, or wait for their session timeout, before deleting it",
                        g.member_count()
                    ),
                ),
                Some(g) => {
                    for tp in g.offsets.keys() {
                        records.push(GroupRecord::Offset {
                            group: gid.clone(),
                            topic: tp.0.clone(),
                            partition: tp.1,
                            value: None,
                        });
                    }
                    records.push(GroupRecord::Group {
                        group: gid.clone(),
                        value: None,
                    });
                    records.push(GroupRecord::Members {
                        group: gid.clone(),
                        value: None,
                    });
                    None
                }
            };
            results.push(GroupResult {
                group_id: gid,
                error,
            });
        }
        Output {
            reply: DeleteGroupsResponse { results },
            records,
        }
    }

    fn tick(&mut self, now: Millis) -> Output<()> {
        let mut records = Vec::new();
        let ids: Vec<String> = self.groups.keys().cloned().collect();
        for gid in ids {
            let g = self.groups.get_mut(&gid).expect("listed");
            let expired: Vec<String> = g
                .members
                .iter()
                .filter(|(_, m)| m.deadline <= now)
                .map(|(id, _)| id.clone())
                .collect();
            for mid in &expired {
                g.remove_member(mid);
            }
            if !expired.is_empty() {
                records.extend(self.epoch_record(&gid));
            }
            self.classic_tick(&gid, now, &mut records);
            let g = self.groups.get_mut(&gid).expect("listed");
            if g.has_members() || !g.classic.is_empty() || !g.offsets.is_empty() {
                g.empty_since = None;
                continue;
            }
            let since = *g.empty_since.get_or_insert(now);
            if now.saturating_sub(since) >= EMPTY_GROUP_KEEP_MS {
                let persisted = g.persisted_epoch > 0;
                self.groups.remove(&gid);
                if persisted {
                    records.push(GroupRecord::Group {
                        group: gid.clone(),
                        value: None,
                    });
                    records.push(GroupRecord::Members {
                        group: gid,
                        value: None,
                    });
                }
            }
        }
        Output { reply: (), records }
    }

    fn replay(&mut self, record: GroupRecord) {
        match record {
            GroupRecord::Offset {
                group,
                topic,
                partition,
                value,
            } => match value {
                Some(v) => {
                    self.groups
                        .entry(group)
                        .or_default()
                        .offsets
                        .insert((topic, partition), v);
                }
                None => {
                    if let Some(g) = self.groups.get_mut(&group) {
                        g.offsets.remove(&(topic, partition));
                    }
                }
            },
            GroupRecord::Group { group, value } => match value {
                Some(v) => {
                    let g = self.groups.entry(group).or_default();
                    g.epoch = g.epoch.max(v.group_epoch);
                    g.persisted_epoch = g.persisted_epoch.max(v.group_epoch);
                    if !g.has_members() {
                        g.assignor = v.assignor;
                    }
                }
                None => {
                    if self
                        .groups
                        .get(&group)
                        .is_some_and(|g| !g.has_members() && g.classic.is_empty())
                    {
                        self.groups.remove(&group);
                    }
                }
            },
            // Only for a group a group record made (it comes right before).
            GroupRecord::Members { group, value } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    g.recorded_members = value;
                }
            }
            GroupRecord::Pending {
                group,
                transactional_id,
                value,
            } => match value {
                Some(v) => {
                    self.pending
                        .entry(group)
                        .or_default()
                        .insert(transactional_id, v);
                }
                None => {
                    if let Some(p) = self.pending.get_mut(&group) {
                        p.remove(&transactional_id);
                        if p.is_empty() {
                            self.pending.remove(&group);
                        }
                    }
                    self.expiring.remove(&(group, transactional_id));
                }
            },
        }
    }
}
