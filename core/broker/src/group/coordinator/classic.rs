//! Kafka's classic group protocol in the coordinator: JoinGroup, SyncGroup,
//! Heartbeat and LeaveGroup, for Kafka clients that assign partitions
//! themselves (range, round-robin, cooperative-sticky...).
//!
//! A classic group lives in the same [`Group`] as a Rill (KIP-848) group: its
//! generation is the group epoch (written to `__consumer_offsets` as the
//! group record, so it keeps rising across restarts), its chosen protocol is
//! the group's assignor, and its committed offsets are the group's offsets.
//! A group has members of one protocol or the other, never both at once; an
//! empty group takes either.
//!
//! Phases (Kafka's): `Empty` -> `PreparingRebalance` (every member must
//! rejoin; new members wait; ends when all have rejoined, or at the rebalance
//! deadline, dropping those that did not) -> `CompletingRebalance` (the leader
//! got every member's metadata and computes the assignment) -> `Stable` (the
//! leader's SyncGroup stored it; every member gets its part).
//!
//! JoinGroup and SyncGroup may have to wait for other members: their step
//! answers [`Pending::Wait`], and the shell asks again ([`input::JoinResult`],
//! [`input::SyncResult`]) whenever the coordinator changed, until the answer
//! is there. The coordinator keeps each member's join answer until it is
//! taken, so no answer depends on a waiter being present when the phase ends.
//!
//! A member's assignment goes out only once its generation's records (the
//! group epoch and its members) are replicated, and a coordinator that
//! loaded the group from the log forms no generation while a member of the
//! previous coordinator may still consume ("Hold after a load" in the
//! parent module).
//!
//! Sessions: a member's session is renewed by each of its requests; a member
//! that is silent past it is removed and the group rebalances. While the group
//! prepares a rebalance no member expires (the rebalance deadline decides).

use super::*;

/// Longest protocol name, protocol type or client host.
const NAME_LEN_MAX: usize = 255;

/// An answer now, or later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pending<R> {
    Done(R),
    /// The member must wait for others; ask again when the coordinator changed.
    Wait,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Phase {
    #[default]
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl Phase {
    pub(super) fn name(self) -> &'static str {
        match self {
            Phase::Empty => "Empty",
            Phase::PreparingRebalance => "PreparingRebalance",
            Phase::CompletingRebalance => "CompletingRebalance",
            Phase::Stable => "Stable",
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct ClassicMember {
    pub(super) instance_id: Option<String>,
    pub(super) client_id: String,
    pub(super) client_host: String,
    pub(super) session_timeout_ms: u32,
    pub(super) rebalance_timeout_ms: u32,
    pub(super) protocols: Vec<JoinProtocol>,
    /// Rejoined in the current rebalance.
    pub(super) joined: bool,
    /// The answer to its last join, until it is taken.
    pub(super) answer: Option<JoinGroupResponse>,
    /// Its part of the leader's assignment (this generation's).
    pub(super) assignment: Vec<u8>,
    pub(super) deadline: Millis,
    /// When it joined the group (the first member is the first leader).
    pub(super) order: u64,
}

impl ClassicMember {
    fn metadata(&self, protocol: &str) -> Vec<u8> {
        self.protocols
            .iter()
            .find(|p| p.name == protocol)
            .map(|p| p.metadata.clone())
            .unwrap_or_default()
    }

    fn supports(&self, protocol: &str) -> bool {
        self.protocols.iter().any(|p| p.name == protocol)
    }
}

/// The classic-protocol side of a group.
#[derive(Debug, Clone, Default)]
pub(super) struct Classic {
    pub(super) phase: Phase,
    pub(super) protocol_type: String,
    pub(super) leader: Option<String>,
    pub(super) members: BTreeMap<String, ClassicMember>,
    /// Ids handed out with MEMBER_ID_REQUIRED, until their deadline.
    pub(super) pending: BTreeMap<String, Millis>,
    /// PreparingRebalance ends by then, whoever has rejoined.
    pub(super) join_deadline: Millis,
    /// A first rebalance (from Empty) does not end before this (Kafka's
    /// `group.initial.rebalance.delay.ms`), so members starting together land
    /// in one generation.
    pub(super) initial_until: Millis,
    /// Join order counter.
    pub(super) joins: u64,
}

impl Classic {
    pub(super) fn is_empty(&self) -> bool {
        self.members.is_empty() && self.pending.is_empty()
    }

    /// The protocols every member supports.
    fn common_protocols(&self) -> Vec<String> {
        let mut members = self.members.values();
        let Some(first) = members.next() else {
            return Vec::new();
        };
        let rest: Vec<&ClassicMember> = members.collect();
        first
            .protocols
            .iter()
            .map(|p| p.name.clone())
            .filter(|name| rest.iter().all(|m| m.supports(name)))
            .collect()
    }

    /// Kafka's choice: among the protocols every member supports, each member
    /// votes for the one it prefers most; most votes wins (ties: the first
    /// member's preference order).
    fn choose_protocol(&self) -> String {
        let candidates = self.common_protocols();
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(p) = m.protocols.iter().find(|p| candidates.contains(&p.name)) {
                *votes.entry(p.name.as_str()).or_default() += 1;
            }
        }
        let best = votes.values().copied().max().unwrap_or(0);
        candidates
            .iter()
            .find(|c| votes.get(c.as_str()) == Some(&best))
            .cloned()
            .unwrap_or_default()
    }

    fn max_rebalance_timeout(&self) -> Millis {
        self.members
            .values()
            .map(|m| m.rebalance_timeout_ms as Millis)
            .max()
            .unwrap_or(0)
    }
}

fn join_error(error: Option<ErrorInfo>, member_id: String) -> JoinGroupResponse {
    JoinGroupResponse {
        error,
        generation: -1,
        protocol_type: String::new(),
        protocol_name: String::new(),
        leader: String::new(),
        member_id,
        members: Vec::new(),
    }
}

fn sync_error(error: Option<ErrorInfo>) -> SyncGroupResponse {
    SyncGroupResponse {
        error,
        protocol_type: String::new(),
        protocol_name: String::new(),
        assignment: Vec::new(),
    }
}

impl GroupCoordinator {
    fn validate_join(&self, req: &JoinGroupRequest) -> Result<(), ErrorInfo> {
        validate_group_id(&req.group_id)?;
        let gid = &req.group_id;
        let invalid = |m: String| Err(ErrorInfo::new(ErrorCode::InvalidRequest, m));
        if req.member_id.len() > MEMBER_ID_LEN_MAX {
            return invalid(format!(
                "group {gid}: member id is {} bytes; at most {MEMBER_ID_LEN_MAX}",
                req.member_id.len()
            ));
        }
        if req
            .instance_id
            .as_ref()
            .is_some_and(|i| i.is_empty() || i.len() > MEMBER_ID_LEN_MAX)
        {
            return invalid(format!(
                "group {gid}: instance id must be 1 to {MEMBER_ID_LEN_MAX} bytes long"
            ));
        }
        if req.protocol_type.is_empty() || req.protocol_type.len() > NAME_LEN_MAX {
            return Err(ErrorInfo::new(
                ErrorCode::InconsistentGroupProtocol,
                format!("group {gid}: the protocol type must be 1 to {NAME_LEN_MAX} bytes long"),
            ));
        }
        if req.protocols.is_empty() {
            return Err(ErrorInfo::new(
                ErrorCode::InconsistentGroupProtocol,
                format!("group {gid}: the member offers no protocol (partition assignor)"),
            ));
        }
        if req
            .protocols
            .iter()
            .any(|p| p.name.is_empty() || p.name.len() > NAME_LEN_MAX)
        {
            return invalid(format!(
                "group {gid}: every protocol name must be 1 to {NAME_LEN_MAX} bytes long"
            ));
        }
        if req.client_host.len() > NAME_LEN_MAX || req.client_id.len() > MEMBER_ID_LEN_MAX {
            return invalid(format!("group {gid}: client id or host too long"));
        }
        let (min, max) = (
            self.config.session_timeout_ms_min,
            self.config.session_timeout_ms_max,
        );
        if req.session_timeout_ms < min || req.session_timeout_ms > max {
            return Err(ErrorInfo::new(
                ErrorCode::InvalidConfig,
                format!(
                    "group {gid}: session timeout {} ms is outside the broker's range [{min}, {max}] ms \
                     (group_min_session_timeout_ms, group_max_session_timeout_ms)",
                    req.session_timeout_ms
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn join_group(
        &mut self,
        now: Millis,
        req: JoinGroupRequest,
        new_member_id: String,
    ) -> Output<Pending<JoinGroupResponse>> {
        let done =
            |e: ErrorInfo, mid: String| Output::reply(Pending::Done(join_error(Some(e), mid)));
        if let Err(e) = self.validate_join(&req) {
            return done(e, req.member_id);
        }
        let gid = req.group_id.clone();
        if let Some(g) = self.groups.get(&gid)
            && !g.members.is_empty()
        {
            return done(
                ErrorInfo::new(
                    ErrorCode::InconsistentGroupProtocol,
                    format!(
                        "group {gid} has {} member(s) using Rill's consumer-group protocol; a Kafka \
                         classic-protocol member cannot join it (use another group id)",
                        g.members.len()
                    ),
                ),
                req.member_id,
            );
        }
        if !self.groups.contains_key(&gid) {
            if self.groups.len() >= self.config.groups_max {
                return done(
                    ErrorInfo::new(
                        ErrorCode::GroupMaxSizeReached,
                        format!(
                            "this broker coordinates {} groups already, its maximum; delete unused groups (rill group delete)",
                            self.config.groups_max
                        ),
                    ),
                    req.member_id,
                );
            }
            self.groups.insert(gid.clone(), Group::default());
        }
        let members_max = self.config.members_per_group_max;
        let initial_delay = self.config.initial_rebalance_delay_ms as Millis;
        let g = self.groups.get_mut(&gid).expect("present");
        let c = &mut g.classic;
        if !c.members.is_empty() {
            if c.protocol_type != req.protocol_type {
                return done(
                    ErrorInfo::new(
                        ErrorCode::InconsistentGroupProtocol,
                        format!(
                            "group {gid} has protocol type {:?}, this member {:?}",
                            c.protocol_type, req.protocol_type
                        ),
                    ),
                    req.member_id,
                );
            }
            let others: Vec<&ClassicMember> = c
                .members
                .iter()
                .filter(|(id, _)| **id != req.member_id)
                .map(|(_, m)| m)
                .collect();
            let shared = req
                .protocols
                .iter()
                .any(|p| others.iter().all(|m| m.supports(&p.name)));
            if !others.is_empty() && !shared {
                let theirs = c.common_protocols().join(", ");
                let mine: Vec<&str> = req.protocols.iter().map(|p| p.name.as_str()).collect();
                return done(
                    ErrorInfo::new(
                        ErrorCode::InconsistentGroupProtocol,
                        format!(
                            "group {gid}: this member's assignors ({}) share none with the group's members ({theirs}): \
                             configure the same partition.assignment.strategy in every member",
                            mine.join(", ")
                        ),
                    ),
                    req.member_id,
                );
            }
        }

        // Who is joining.
        if req.member_id.is_empty()
            && let Some(h) = &mut g.hold
        {
            // A static member of the previous coordinator that restarted.
            h.instance_rejoined(req.instance_id.as_deref());
        }
        let mid = if req.member_id.is_empty() {
            let static_old = req.instance_id.as_ref().and_then(|iid| {
                c.members
                    .iter()
                    .find(|(_, m)| m.instance_id.as_ref() == Some(iid))
                    .map(|(id, _)| id.clone())
            });
            if let Some(old) = static_old {
                // A static member's new incarnation takes its place; the old id
                // is fenced.
                let m = c.members.remove(&old).expect("found");
                c.members.insert(new_member_id.clone(), m);
                if c.leader.as_deref() == Some(old.as_str()) {
                    c.leader = Some(new_member_id.clone());
                }
                new_member_id
            } else if req.require_known_member_id && req.instance_id.is_none() {
                // KIP-394, for dynamic members only: a static member is
                // known by its instance id.
                c.pending.insert(
                    new_member_id.clone(),
                    now + req.session_timeout_ms as Millis,
                );
                return done(
                    ErrorInfo::new(
                        ErrorCode::MemberIdRequired,
                        format!("group {gid}: join again with member id {new_member_id}"),
                    ),
                    new_member_id,
                );
            } else {
                new_member_id
            }
        } else if c.members.contains_key(&req.member_id)
            || c.pending.remove(&req.member_id).is_some()
        {
            req.member_id.clone()
        } else {
            // A member of the previous coordinator learns here that it is
            // gone, and gives its partitions up (Kafka's clients do).
            g.no_longer_awaited(&req.member_id);
            return done(
                ErrorInfo::new(
                    ErrorCode::UnknownMemberId,
                    format!(
                        "group {gid} has no member {} (removed after its session timed out, or the coordinator \
                         restarted or moved): join again with an empty member id",
                        req.member_id
                    ),
                ),
                req.member_id,
            );
        };
        if !c.members.contains_key(&mid) {
            if c.members.len() >= members_max {
                return done(
                    ErrorInfo::new(
                        ErrorCode::GroupMaxSizeReached,
                        format!(
                            "group {gid} has {members_max} members, the broker's maximum (group_max_size)"
                        ),
                    ),
                    mid,
                );
            }
            c.joins += 1;
            c.members.insert(
                mid.clone(),
                ClassicMember {
                    instance_id: None,
                    client_id: String::new(),
                    client_host: String::new(),
                    session_timeout_ms: 0,
                    rebalance_timeout_ms: 0,
                    protocols: Vec::new(),
                    joined: false,
                    answer: None,
                    assignment: Vec::new(),
                    deadline: 0,
                    order: c.joins,
                },
            );
        }
        c.protocol_type = req.protocol_type.clone();
        let m = c.members.get_mut(&mid).expect("inserted above");
        m.instance_id = req.instance_id.clone();
        m.client_id = req.client_id.clone();
        m.client_host = req.client_host.clone();
        m.session_timeout_ms = req.session_timeout_ms;
        m.rebalance_timeout_ms = if req.rebalance_timeout_ms == 0 {
            req.session_timeout_ms
        } else {
            req.rebalance_timeout_ms
                .min(self.config.session_timeout_ms_max)
        };
        m.protocols = req.protocols;
        m.deadline = now + m.session_timeout_ms as Millis;
        m.answer = None;

        match c.phase {
            Phase::Empty => {
                c.phase = Phase::PreparingRebalance;
                for m in c.members.values_mut() {
                    m.joined = false;
                }
                c.initial_until = now + initial_delay;
                c.join_deadline = now + c.max_rebalance_timeout().max(initial_delay);
            }
            Phase::Stable | Phase::CompletingRebalance => Self::prepare(c, now),
            Phase::PreparingRebalance => {}
        }
        c.members.get_mut(&mid).expect("present").joined = true;
        let mut records = Vec::new();
        self.complete_if_ready(&gid, now, &mut records);
        let reply = self.join_answer(&gid, &mid);
        Output { reply, records }
    }

    /// Starts a rebalance: every member must rejoin by the deadline.
    fn prepare(c: &mut Classic, now: Millis) {
        c.phase = Phase::PreparingRebalance;
        for m in c.members.values_mut() {
            m.joined = false;
        }
        c.initial_until = 0;
        c.join_deadline = now + c.max_rebalance_timeout();
    }

    /// Ends PreparingRebalance when every member rejoined (and the initial
    /// delay passed) or the deadline passed.
    fn complete_if_ready(&mut self, gid: &str, now: Millis, records: &mut Vec<GroupRecord>) {
        let Some(g) = self.groups.get_mut(gid) else {
            return;
        };
        // After a load, no generation while a member of the previous
        // coordinator may still consume (see "Hold after a load").
        if g.held_until(now).is_some() {
            return;
        }
        let c = &mut g.classic;
        if c.phase != Phase::PreparingRebalance {
            return;
        }
        let all_joined = c.members.values().all(|m| m.joined);
        if !(now >= c.join_deadline || (all_joined && now >= c.initial_until)) {
            return;
        }
        c.members.retain(|_, m| m.joined);
        g.bump();
        let generation = g.epoch;
        let c = &mut g.classic;
        if c.members.is_empty() {
            c.phase = Phase::Empty;
            c.leader = None;
        } else {
            let protocol = c.choose_protocol();
            if c.leader.as_ref().is_none_or(|l| !c.members.contains_key(l)) {
                c.leader = c
                    .members
                    .iter()
                    .min_by_key(|(_, m)| m.order)
                    .map(|(id, _)| id.clone());
            }
            let leader = c.leader.clone().expect("members exist");
            let all: Vec<JoinGroupMember> = c
                .members
                .iter()
                .map(|(id, m)| JoinGroupMember {
                    member_id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    metadata: m.metadata(&protocol),
                })
                .collect();
            let protocol_type = c.protocol_type.clone();
            for (id, m) in c.members.iter_mut() {
                m.assignment.clear();
                m.deadline = now + m.session_timeout_ms as Millis;
                m.answer = Some(JoinGroupResponse {
                    error: None,
                    generation,
                    protocol_type: protocol_type.clone(),
                    protocol_name: protocol.clone(),
                    leader: leader.clone(),
                    member_id: id.clone(),
                    members: if *id == leader {
                        all.clone()
                    } else {
                        Vec::new()
                    },
                });
            }
            c.phase = Phase::CompletingRebalance;
            g.assignor = protocol;
        }
        records.extend(self.epoch_record(gid));
    }

    /// The join answer of `mid`, if it is there (taken: asked once).
    fn join_answer(&mut self, gid: &str, mid: &str) -> Pending<JoinGroupResponse> {
        let Some(c) = self.groups.get_mut(gid).map(|g| &mut g.classic) else {
            return Pending::Done(join_error(
                err(
                    ErrorCode::UnknownMemberId,
                    format!("group {gid} is gone (deleted, or the coordinator moved): join again"),
                ),
                mid.to_string(),
            ));
        };
        match c.members.get_mut(mid) {
            None => Pending::Done(join_error(
                err(
                    ErrorCode::UnknownMemberId,
                    format!(
                        "group {gid}: member {mid} was removed while the group rebalanced: join again"
                    ),
                ),
                mid.to_string(),
            )),
            Some(m) => match m.answer.take() {
                Some(answer) => Pending::Done(answer),
                None if c.phase == Phase::PreparingRebalance && m.joined => Pending::Wait,
                None => Pending::Done(join_error(
                    err(
                        ErrorCode::RebalanceInProgress,
                        format!("group {gid} is rebalancing again: join again"),
                    ),
                    mid.to_string(),
                )),
            },
        }
    }

    pub(super) fn join_result(&mut self, gid: &str, mid: &str) -> Pending<JoinGroupResponse> {
        self.join_answer(gid, mid)
    }

    /// Checks member and generation; renews the session.
    fn classic_member(
        &mut self,
        now: Millis,
        gid: &str,
        mid: &str,
        generation: i32,
    ) -> Result<&mut Group, ErrorInfo> {
        let Some(g) = self.groups.get_mut(gid) else {
            return Err(ErrorInfo::new(
                ErrorCode::UnknownMemberId,
                format!(
                    "group {gid} has no member {mid} (the coordinator restarted or moved?): join again"
                ),
            ));
        };
        let epoch = g.epoch;
        if !g.classic.members.contains_key(mid) {
            // (As in join_group: told it is gone, it gives its partitions up.)
            g.no_longer_awaited(mid);
        }
        let Some(m) = g.classic.members.get_mut(mid) else {
            return Err(ErrorInfo::new(
                ErrorCode::UnknownMemberId,
                format!(
                    "group {gid} has no member {mid} (removed after its session timed out, or replaced by a newer instance): join again"
                ),
            ));
        };
        m.deadline = m.deadline.max(now + m.session_timeout_ms as Millis);
        if generation != epoch && g.classic.phase != Phase::PreparingRebalance {
            return Err(ErrorInfo::new(
                ErrorCode::IllegalGeneration,
                format!(
                    "group {gid}: member {mid} is at generation {generation}, the group at {epoch}: join again"
                ),
            ));
        }
        Ok(g)
    }

    pub(super) fn sync_group(
        &mut self,
        now: Millis,
        req: SyncGroupRequest,
    ) -> Pending<SyncGroupResponse> {
        let gid = req.group_id.clone();
        let mid = req.member_id.clone();
        let g = match self.classic_member(now, &gid, &mid, req.generation) {
            Ok(g) => g,
            Err(e) => return Pending::Done(sync_error(Some(e))),
        };
        let c = &mut g.classic;
        let mismatch = |what: &str, theirs: &Option<String>, ours: &str| {
            theirs
                .as_ref()
                .filter(|t| !t.is_empty() && t.as_str() != ours)
                .map(|t| {
                    format!("group {gid}: the member names {what} {t:?}, the group's is {ours:?}")
                })
        };
        if let Some(m) = mismatch("protocol type", &req.protocol_type, &c.protocol_type)
            .or_else(|| mismatch("protocol", &req.protocol_name, &g.assignor))
        {
            return Pending::Done(sync_error(err(ErrorCode::InconsistentGroupProtocol, m)));
        }
        let c = &mut g.classic;
        match c.phase {
            Phase::PreparingRebalance | Phase::Empty => Pending::Done(sync_error(err(
                ErrorCode::RebalanceInProgress,
                format!("group {gid} is rebalancing: join again"),
            ))),
            Phase::CompletingRebalance if c.leader.as_deref() == Some(mid.as_str()) => {
                let mut given: BTreeMap<String, Vec<u8>> = req
                    .assignments
                    .into_iter()
                    .map(|a| (a.member_id, a.assignment))
                    .collect();
                for (id, m) in c.members.iter_mut() {
                    m.assignment = given.remove(id).unwrap_or_default();
                    m.deadline = now + m.session_timeout_ms as Millis;
                }
                c.phase = Phase::Stable;
                self.sync_answer(&gid, &mid, req.generation)
            }
            Phase::CompletingRebalance => Pending::Wait,
            Phase::Stable => self.sync_answer(&gid, &mid, req.generation),
        }
    }

    /// The member's assignment once the leader gave it.
    pub(super) fn sync_answer(
        &self,
        gid: &str,
        mid: &str,
        generation: i32,
    ) -> Pending<SyncGroupResponse> {
        let Some(g) = self.groups.get(gid) else {
            return Pending::Done(sync_error(err(
                ErrorCode::UnknownMemberId,
                format!("group {gid} is gone (deleted, or the coordinator moved): join again"),
            )));
        };
        let c = &g.classic;
        let Some(m) = c.members.get(mid) else {
            return Pending::Done(sync_error(err(
                ErrorCode::UnknownMemberId,
                format!(
                    "group {gid}: member {mid} was removed while the group rebalanced: join again"
                ),
            )));
        };
        if generation != g.epoch || matches!(c.phase, Phase::PreparingRebalance | Phase::Empty) {
            return Pending::Done(sync_error(err(
                ErrorCode::RebalanceInProgress,
                format!("group {gid} is rebalancing again: join again"),
            )));
        }
        // Not before the generation's records (its members) are durable: a
        // successor coordinator must know whom to wait for.
        if c.phase == Phase::CompletingRebalance || g.durable_epoch < generation {
            return Pending::Wait;
        }
        Pending::Done(SyncGroupResponse {
            error: None,
            protocol_type: c.protocol_type.clone(),
            protocol_name: g.assignor.clone(),
            assignment: m.assignment.clone(),
        })
    }

    pub(super) fn group_heartbeat(
        &mut self,
        now: Millis,
        req: GroupHeartbeatRequest,
    ) -> GroupHeartbeatResponse {
        let gid = req.group_id.clone();
        let error = match self.classic_member(now, &gid, &req.member_id, req.generation) {
            Err(e) => Some(e),
            Ok(g) if g.classic.phase == Phase::PreparingRebalance => err(
                ErrorCode::RebalanceInProgress,
                format!("group {gid} is rebalancing: join again"),
            ),
            Ok(_) => None,
        };
        GroupHeartbeatResponse { error }
    }

    pub(super) fn leave_group(
        &mut self,
        now: Millis,
        req: LeaveGroupRequest,
    ) -> Output<LeaveGroupResponse> {
        let gid = req.group_id.clone();
        let Some(g) = self.groups.get_mut(&gid) else {
            return Output::reply(LeaveGroupResponse {
                error: err(
                    ErrorCode::UnknownMemberId,
                    format!(
                        "group {gid} has no members here (the coordinator restarted or moved?)"
                    ),
                ),
                members: Vec::new(),
            });
        };
        for l in &req.members {
            g.no_longer_awaited(&l.member_id);
        }
        let c = &mut g.classic;
        let mut removed = false;
        let members = req
            .members
            .into_iter()
            .map(|l| {
                let id = if l.member_id.is_empty() {
                    l.instance_id.as_ref().and_then(|iid| {
                        c.members
                            .iter()
                            .find(|(_, m)| m.instance_id.as_ref() == Some(iid))
                            .map(|(id, _)| id.clone())
                    })
                } else {
                    Some(l.member_id.clone()).filter(|id| c.members.contains_key(id))
                };
                let error = match id {
                    Some(id) => {
                        c.members.remove(&id);
                        removed = true;
                        None
                    }
                    None => err(
                        ErrorCode::UnknownMemberId,
                        format!(
                            "group {gid} has no member {:?} (instance {:?})",
                            l.member_id, l.instance_id
                        ),
                    ),
                };
                LeftMember {
                    member_id: l.member_id,
                    instance_id: l.instance_id,
                    error,
                }
            })
            .collect();
        let mut records = Vec::new();
        if removed {
            Self::prepare(c, now);
            self.complete_if_ready(&gid, now, &mut records);
        }
        Output {
            reply: LeaveGroupResponse {
                error: None,
                members,
            },
            records,
        }
    }

    /// The records of `gid`'s `epoch` were not made durable: if that is the
    /// classic generation in force and its assignment may not go out yet, the
    /// group rebalances again (waiting syncs get REBALANCE_IN_PROGRESS, and
    /// the next generation is written again), as Kafka's coordinator does
    /// when it cannot store a group's assignment.
    pub(super) fn classic_unwritten(&mut self, gid: &str, epoch: i32, now: Millis) {
        let Some(g) = self.groups.get_mut(gid) else {
            return;
        };
        let c = &mut g.classic;
        if g.epoch == epoch
            && g.durable_epoch < epoch
            && matches!(c.phase, Phase::CompletingRebalance | Phase::Stable)
        {
            Self::prepare(c, now);
        }
    }

    /// Expires sessions and pending ids; ends rebalances whose time came.
    pub(super) fn classic_tick(&mut self, gid: &str, now: Millis, records: &mut Vec<GroupRecord>) {
        let Some(g) = self.groups.get_mut(gid) else {
            return;
        };
        let c = &mut g.classic;
        c.pending.retain(|_, deadline| *deadline > now);
        if c.phase != Phase::PreparingRebalance {
            let before = c.members.len();
            c.members.retain(|_, m| m.deadline > now);
            if c.members.len() != before {
                Self::prepare(c, now);
            }
        }
        self.complete_if_ready(gid, now, records);
    }

    /// A commit by a classic member: its generation must be the group's, and
    /// not while the leader is still assigning (Kafka allows commits while
    /// preparing a rebalance, so eager members commit before rejoining).
    pub(super) fn check_classic_commit(
        &mut self,
        now: Millis,
        gid: &str,
        mid: &str,
        generation: i32,
    ) -> Result<(), ErrorInfo> {
        let g = self.classic_member(now, gid, mid, generation)?;
        if generation != g.epoch {
            return Err(ErrorInfo::new(
                ErrorCode::IllegalGeneration,
                format!(
                    "group {gid}: member {mid} committed at generation {generation}, the group is at {}: \
                     the commit is refused; join again",
                    g.epoch
                ),
            ));
        }
        if g.classic.phase == Phase::CompletingRebalance {
            return Err(ErrorInfo::new(
                ErrorCode::RebalanceInProgress,
                format!("group {gid} is completing a rebalance: the commit is refused; join again"),
            ));
        }
        Ok(())
    }

    /// A classic group's members as DescribeGroups shows them.
    pub(super) fn describe_classic(g: &Group) -> Vec<GroupMemberDescription> {
        let consumer = g.classic.protocol_type == "consumer";
        g.classic
            .members
            .iter()
            .map(|(id, m)| GroupMemberDescription {
                member_id: id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                member_epoch: g.epoch,
                subscribed_topics: if consumer {
                    consumer_protocol::subscription_topics(&m.metadata(&g.assignor))
                        .or_else(|| {
                            m.protocols
                                .first()
                                .and_then(|p| consumer_protocol::subscription_topics(&p.metadata))
                        })
                        .unwrap_or_default()
                } else {
                    Vec::new()
                },
                assignment: if consumer {
                    consumer_protocol::assignment(&m.assignment).unwrap_or_default()
                } else {
                    Vec::new()
                },
                revoking: Vec::new(),
                left: false,
            })
            .collect()
    }
}

/// Reading Kafka's embedded consumer protocol (ConsumerProtocolSubscription
/// and ConsumerProtocolAssignment, every version: a version, then the fields
/// this reads first, later versions only append), for DescribeGroups. What
/// does not parse is shown as nothing; the coordinator never needs it.
pub mod consumer_protocol {
    use super::TopicPartitions;

    struct Reader<'a>(&'a [u8]);

    impl Reader<'_> {
        fn take(&mut self, n: usize) -> Option<&[u8]> {
            if self.0.len() < n {
                return None;
            }
            let (head, rest) = self.0.split_at(n);
            self.0 = rest;
            Some(head)
        }
        fn i16(&mut self) -> Option<i16> {
            self.take(2).map(|b| i16::from_be_bytes([b[0], b[1]]))
        }
        fn i32(&mut self) -> Option<i32> {
            self.take(4)
                .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        }
        fn string(&mut self) -> Option<String> {
            let n = usize::try_from(self.i16()?).ok()?;
            String::from_utf8(self.take(n)?.to_vec()).ok()
        }
        /// An array's length, bounded by the bytes left (each element takes
        /// at least `min_size` bytes).
        fn len(&mut self, min_size: usize) -> Option<usize> {
            let n = usize::try_from(self.i32()?).ok()?;
            (n * min_size <= self.0.len()).then_some(n)
        }
    }

    /// The topics a subscription names.
    pub fn subscription_topics(bytes: &[u8]) -> Option<Vec<String>> {
        let mut r = Reader(bytes);
        r.i16()?;
        let n = r.len(2)?;
        (0..n).map(|_| r.string()).collect()
    }

    /// The partitions an assignment gives.
    pub fn assignment(bytes: &[u8]) -> Option<Vec<TopicPartitions>> {
        if bytes.is_empty() {
            return Some(Vec::new());
        }
        let mut r = Reader(bytes);
        r.i16()?;
        let n = r.len(6)?;
        (0..n)
            .map(|_| {
                let topic = r.string()?;
                let k = r.len(4)?;
                let partitions = (0..k)
                    .map(|_| r.i32().and_then(|p| u32::try_from(p).ok()))
                    .collect::<Option<Vec<u32>>>()?;
                Some(TopicPartitions { topic, partitions })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: &str = "g";
    const DELAY: Millis = 100;
    /// The ids the "shell" gives new members.
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    fn coordinator() -> GroupCoordinator {
        GroupCoordinator::new(CoordinatorConfig {
            initial_rebalance_delay_ms: DELAY as u32,
            ..CoordinatorConfig::default()
        })
    }

    fn join_req(member_id: &str, protocols: &[&str]) -> JoinGroupRequest {
        JoinGroupRequest {
            group_id: G.into(),
            member_id: member_id.into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 1000,
            rebalance_timeout_ms: 2000,
            protocol_type: "consumer".into(),
            protocols: protocols
                .iter()
                .map(|p| JoinProtocol {
                    name: p.to_string(),
                    metadata: p.as_bytes().to_vec(),
                })
                .collect(),
            require_known_member_id: true,
        }
    }

    fn join(
        c: &mut GroupCoordinator,
        now: Millis,
        id: &str,
        protocols: &[&str],
    ) -> Pending<JoinGroupResponse> {
        c.step(
            now,
            input::JoinGroup {
                request: join_req(id, protocols),
                new_member_id: format!(
                    "m{}",
                    NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                ),
            },
        )
        .reply
    }

    /// A new member: MEMBER_ID_REQUIRED, then joins with that id.
    fn join_new(
        c: &mut GroupCoordinator,
        now: Millis,
        protocols: &[&str],
    ) -> (String, Pending<JoinGroupResponse>) {
        let Pending::Done(first) = join(c, now, "", protocols) else {
            panic!("a new member is answered at once")
        };
        assert_eq!(
            first.error.as_ref().map(|e| e.code),
            Some(ErrorCode::MemberIdRequired)
        );
        let id = first.member_id;
        let answer = join(c, now, &id, protocols);
        (id, answer)
    }

    fn result(c: &mut GroupCoordinator, now: Millis, id: &str) -> Pending<JoinGroupResponse> {
        c.step(
            now,
            input::JoinResult {
                group_id: G.into(),
                member_id: id.into(),
            },
        )
        .reply
    }

    fn done<R: std::fmt::Debug>(p: Pending<R>) -> R {
        match p {
            Pending::Done(r) => r,
            Pending::Wait => panic!("expected an answer, got Wait"),
        }
    }

    /// A member's SyncGroup, once the generation's records were written and
    /// replicated (the shell reports that; see
    /// `an_assignment_goes_out_only_once_its_generation_is_replicated`).
    fn sync(
        c: &mut GroupCoordinator,
        now: Millis,
        id: &str,
        generation: i32,
        assignments: &[(&str, &[u8])],
    ) -> Pending<SyncGroupResponse> {
        c.step(now, input::Replicated(vec![(G.into(), generation)]));
        sync_unreplicated(c, now, id, generation, assignments)
    }

    /// A SyncGroup as it arrives, whether or not the generation is durable.
    fn sync_unreplicated(
        c: &mut GroupCoordinator,
        now: Millis,
        id: &str,
        generation: i32,
        assignments: &[(&str, &[u8])],
    ) -> Pending<SyncGroupResponse> {
        c.step(
            now,
            input::SyncGroup(SyncGroupRequest {
                group_id: G.into(),
                generation,
                member_id: id.into(),
                instance_id: None,
                protocol_type: Some("consumer".into()),
                protocol_name: None,
                assignments: assignments
                    .iter()
                    .map(|(m, a)| SyncAssignment {
                        member_id: m.to_string(),
                        assignment: a.to_vec(),
                    })
                    .collect(),
            }),
        )
        .reply
    }

    /// Whether a waiting SyncGroup of generation 1 is answered.
    fn sync_result(c: &mut GroupCoordinator, now: Millis, id: &str) -> Pending<SyncGroupResponse> {
        c.step(
            now,
            input::SyncResult {
                group_id: G.into(),
                member_id: id.into(),
                generation: 1,
            },
        )
        .reply
    }

    fn heartbeat(
        c: &mut GroupCoordinator,
        now: Millis,
        id: &str,
        generation: i32,
    ) -> Option<ErrorCode> {
        c.step(
            now,
            input::GroupHeartbeat(GroupHeartbeatRequest {
                group_id: G.into(),
                generation,
                member_id: id.into(),
                instance_id: None,
            }),
        )
        .reply
        .error
        .map(|e| e.code)
    }

    #[test]
    fn two_members_join_one_generation_and_the_leaders_assignment_reaches_both() {
        let mut c = coordinator();
        let (a, first) = join_new(&mut c, 0, &["cooperative-sticky", "range"]);
        assert_eq!(
            first,
            Pending::Wait,
            "the initial delay holds the first join"
        );
        let (b, second) = join_new(&mut c, 10, &["range", "cooperative-sticky"]);
        assert_eq!(second, Pending::Wait);
        // The delay ends: one generation with both.
        let out = c.step(DELAY, input::Tick);
        // The generation is written, with its members (a successor
        // coordinator waits for them).
        let mut named = vec![a.clone(), b.clone()];
        named.sort();
        assert!(
            matches!(
                &out.records[..],
                [
                    GroupRecord::Group { value: Some(g), .. },
                    GroupRecord::Members { value: Some(m), .. },
                ] if g.group_epoch == 1 && m.member_ids == named && m.session_timeout_ms_max == 1000
            ),
            "{:?}",
            out.records
        );
        let ra = done(result(&mut c, DELAY, &a));
        let rb = done(result(&mut c, DELAY, &b));
        assert_eq!((ra.error.clone(), rb.error.clone()), (None, None));
        assert_eq!(ra.generation, 1);
        assert_eq!(ra.generation, rb.generation);
        assert_eq!(ra.leader, a, "the first member leads");
        assert_eq!(
            ra.members.len(),
            2,
            "the leader gets every member's metadata"
        );
        assert!(rb.members.is_empty());
        // A tie of votes: the first member's preference order decides.
        assert_eq!(ra.protocol_name, "cooperative-sticky");
        assert_eq!(
            ra.members
                .iter()
                .find(|m| m.member_id == b)
                .unwrap()
                .metadata,
            b"cooperative-sticky"
        );
        // The follower waits for the leader.
        assert_eq!(sync(&mut c, DELAY + 1, &b, 1, &[]), Pending::Wait);
        let sa = done(sync(&mut c, DELAY + 2, &a, 1, &[(&a, b"A"), (&b, b"B")]));
        assert_eq!(sa.assignment, b"A");
        let sb = done(sync_result(&mut c, DELAY + 3, &b));
        assert_eq!(
            (sb.assignment, sb.protocol_name),
            (b"B".to_vec(), "cooperative-sticky".to_string())
        );
        assert_eq!(heartbeat(&mut c, DELAY + 4, &b, 1), None);
        assert_eq!(
            heartbeat(&mut c, DELAY + 4, &b, 0),
            Some(ErrorCode::IllegalGeneration)
        );
        assert_eq!(
            heartbeat(&mut c, DELAY + 4, "nobody", 1),
            Some(ErrorCode::UnknownMemberId)
        );
    }

    /// Two members join a new group (range) and the leader syncs generation 1.
    fn two_members_in_generation_1(c: &mut GroupCoordinator) -> (String, String) {
        let (a, _) = join_new(c, 0, &["range"]);
        let (b, _) = join_new(c, 0, &["range"]);
        c.step(DELAY, input::Tick);
        done(result(c, DELAY, &a));
        done(result(c, DELAY, &b));
        done(sync(c, DELAY, &a, 1, &[]));
        (a, b)
    }

    /// A member gets its generation's assignment only once the generation's
    /// records (its members) reached the in-sync replicas; if they did not,
    /// the group rebalances again. Else a deposed coordinator could hand out
    /// an assignment its successor never heard of (the consumer protocol's
    /// like case: `a_join_is_answered_only_once_its_records_are_replicated`).
    #[test]
    fn an_assignment_goes_out_only_once_its_generation_is_replicated() {
        for replicated in [true, false] {
            let mut c = coordinator();
            let (a, _) = join_new(&mut c, 0, &["range"]);
            let out = c.step(DELAY, input::Tick);
            assert!(!out.records.is_empty());
            assert_eq!(done(result(&mut c, DELAY, &a)).generation, 1);
            // The leader's assignment arrives before the records are durable.
            assert_eq!(
                sync_unreplicated(&mut c, DELAY + 1, &a, 1, &[(&a, b"A")]),
                Pending::Wait,
                "an assignment went out before its generation was replicated"
            );
            if replicated {
                c.step(DELAY + 2, input::Replicated(vec![(G.into(), 1)]));
                assert_eq!(done(sync_result(&mut c, DELAY + 2, &a)).assignment, b"A");
                assert_eq!(heartbeat(&mut c, DELAY + 3, &a, 1), None);
            } else {
                c.step(DELAY + 2, input::Unwritten(vec![(G.into(), 1)]));
                let e = done(sync_result(&mut c, DELAY + 2, &a)).error.unwrap();
                assert_eq!(e.code, ErrorCode::RebalanceInProgress, "{e:?}");
                // It joins again: generation 2, written again.
                let out = c.step(
                    DELAY + 3,
                    input::JoinGroup {
                        request: join_req(&a, &["range"]),
                        new_member_id: "unused".into(),
                    },
                );
                assert_eq!(done(out.reply).generation, 2);
                assert!(
                    out.records.iter().any(|r| matches!(
                        r,
                        GroupRecord::Group { value: Some(g), .. } if g.group_epoch == 2
                    )),
                    "generation 2 is written: {:?}",
                    out.records
                );
            }
        }
    }

    /// A durability report for an epoch above the group's own (its writer
    /// was a group of the same id, deleted since, whose epochs went higher)
    /// makes no generation of this group durable.
    #[test]
    fn a_report_of_an_epoch_the_group_never_reached_hands_out_nothing() {
        let mut c = coordinator();
        let (a, _) = join_new(&mut c, 0, &["range"]);
        c.step(DELAY, input::Tick);
        assert_eq!(done(result(&mut c, DELAY, &a)).generation, 1);
        assert_eq!(
            sync_unreplicated(&mut c, DELAY + 1, &a, 1, &[(&a, b"A")]),
            Pending::Wait
        );
        c.step(DELAY + 2, input::Replicated(vec![(G.into(), 7)]));
        assert_eq!(
            sync_result(&mut c, DELAY + 2, &a),
            Pending::Wait,
            "a report of epoch 7 made generation 1 durable"
        );
        c.step(DELAY + 3, input::Replicated(vec![(G.into(), 1)]));
        assert_eq!(done(sync_result(&mut c, DELAY + 3, &a)).assignment, b"A");
    }

    /// After the coordinator moved, a classic member that reaches the new one
    /// first forms no generation while a member of the old one may still
    /// consume: not until each old member was told it is unknown here (Kafka's
    /// clients then give their partitions up) or left, or the old members'
    /// longest session passed since the load.
    #[test]
    fn a_moved_coordinator_forms_no_classic_generation_until_the_old_members_are_told() {
        let mut old = coordinator();
        let (a, _) = join_new(&mut old, 0, &["range"]);
        let (b, _) = join_new(&mut old, 0, &["range"]);
        let log = old.step(DELAY, input::Tick).records;
        done(result(&mut old, DELAY, &a));
        done(result(&mut old, DELAY, &b));
        done(sync(&mut old, DELAY, &a, 1, &[(&a, b"A"), (&b, b"B")]));
        let loaded: Millis = 500;
        for b_is_told in [true, false] {
            let mut c = coordinator();
            for r in &log {
                c.step(loaded, input::Replay(r.clone()));
            }
            c.hold_after_load(loaded);
            let (x, first) = join_new(&mut c, loaded, &["range"]);
            assert_eq!(first, Pending::Wait);
            let t = loaded + DELAY + 10;
            assert!(c.step(t, input::Tick).records.is_empty());
            assert_eq!(
                result(&mut c, t, &x),
                Pending::Wait,
                "a generation formed while a and b may still consume"
            );
            // a learns of the move: unknown here.
            assert_eq!(
                heartbeat(&mut c, t, &a, 1),
                Some(ErrorCode::UnknownMemberId)
            );
            c.step(t + 1, input::Tick);
            assert_eq!(
                result(&mut c, t + 1, &x),
                Pending::Wait,
                "b may still consume"
            );
            let t = if b_is_told {
                let e = done(sync_unreplicated(&mut c, t + 2, &b, 1, &[]))
                    .error
                    .unwrap();
                assert_eq!(e.code, ErrorCode::UnknownMemberId);
                t + 2
            } else {
                // b is silent: its session (1,000 ms) after the load, it has
                // given its partitions up.
                c.step(loaded + 999, input::Tick);
                assert_eq!(result(&mut c, loaded + 999, &x), Pending::Wait);
                loaded + 1000
            };
            c.step(t, input::Tick);
            let rx = done(result(&mut c, t, &x));
            assert_eq!(rx.error, None);
            assert_eq!(rx.generation, 2);
            assert_eq!(rx.members.len(), 1, "{rx:?}");
        }
    }

    #[test]
    fn a_leave_or_an_expired_session_rebalances_and_fences_the_old_generation() {
        let mut c = coordinator();
        let (a, b) = two_members_in_generation_1(&mut c);
        let commit = |c: &mut GroupCoordinator, now, id: &str, generation| {
            c.step(
                now,
                input::CommitOffsets {
                    request: OffsetCommitRequest {
                        group_id: G.into(),
                        member: Some((id.to_string(), generation)),
                        partitions: vec![OffsetCommitPartition {
                            topic: "t".into(),
                            partition: 0,
                            offset: rill_proto::Offset(5),
                            metadata: String::new(),
                        }],
                    },
                    wall_ms: 0,
                    transaction: None,
                },
            )
            .reply
            .error
            .map(|e| e.code)
        };
        assert_eq!(commit(&mut c, DELAY, &b, 1), None);
        // b leaves: a is told to rejoin, may still commit (eager members
        // commit before rejoining), and rejoins alone into generation 2.
        let left = c.step(
            DELAY + 1,
            input::LeaveGroup(LeaveGroupRequest {
                group_id: G.into(),
                members: vec![LeavingMember {
                    member_id: b.clone(),
                    instance_id: None,
                }],
            }),
        );
        assert_eq!(left.reply.members[0].error, None);
        assert_eq!(
            heartbeat(&mut c, DELAY + 2, &a, 1),
            Some(ErrorCode::RebalanceInProgress)
        );
        assert_eq!(commit(&mut c, DELAY + 2, &a, 1), None);
        let r = done(join(&mut c, DELAY + 3, &a, &["range"]));
        assert_eq!(
            (r.generation, r.leader.as_str(), r.members.len()),
            (2, a.as_str(), 1)
        );
        assert_eq!(
            commit(&mut c, DELAY + 3, &a, 1),
            Some(ErrorCode::IllegalGeneration)
        );
        assert_eq!(
            commit(&mut c, DELAY + 3, &b, 2),
            Some(ErrorCode::UnknownMemberId)
        );
        done(sync(&mut c, DELAY + 4, &a, 2, &[(&a, b"all")]));
        // a goes silent past its session: removed; the group is empty at
        // generation 3 (written), and a's commits are refused.
        let mut records = c.step(DELAY + 4 + 1001, input::Tick).records;
        records.extend(c.step(DELAY + 4 + 1002, input::Tick).records);
        assert!(!c.has_members(G));
        assert!(
            records.iter().any(|r| matches!(
                r,
                GroupRecord::Group { value: Some(v), .. } if v.group_epoch == 3
            )),
            "{records:?}"
        );
        assert_eq!(
            commit(&mut c, 3000, &a, 2),
            Some(ErrorCode::UnknownMemberId)
        );
    }

    #[test]
    fn a_member_that_does_not_rejoin_in_time_is_dropped_from_the_generation() {
        let mut c = coordinator();
        let (a, b) = two_members_in_generation_1(&mut c);
        // A third member joins: a rejoins, b never does.
        let (d, waiting) = join_new(&mut c, 200, &["range"]);
        assert_eq!(waiting, Pending::Wait);
        assert_eq!(
            join(&mut c, 300, &a, &["range"]),
            Pending::Wait,
            "b has not rejoined"
        );
        // b keeps heartbeating but is told to rejoin; the rebalance deadline
        // (the largest rebalance timeout, 2 s) drops it.
        assert_eq!(
            heartbeat(&mut c, 1000, &b, 1),
            Some(ErrorCode::RebalanceInProgress)
        );
        c.step(200 + 2000, input::Tick);
        let ra = done(result(&mut c, 2200, &a));
        let rd = done(result(&mut c, 2200, &d));
        assert_eq!(ra.generation, 2);
        assert_eq!(rd.generation, 2);
        let ids: Vec<&str> = ra.members.iter().map(|m| m.member_id.as_str()).collect();
        assert_eq!(ids.len(), 2);
        assert!(!ids.contains(&b.as_str()));
        assert_eq!(
            heartbeat(&mut c, 2201, &b, 1),
            Some(ErrorCode::UnknownMemberId)
        );
    }

    #[test]
    fn the_two_protocols_do_not_share_a_group_with_members() {
        let mut c = coordinator();
        let (_a, _) = join_new(&mut c, 0, &["range"]);
        let hb = c.step(
            1,
            input::Heartbeat {
                request: ConsumerGroupHeartbeatRequest {
                    group_id: G.into(),
                    member_id: "rill-member".into(),
                    member_epoch: 0,
                    instance_id: None,
                    client_id: "c".into(),
                    subscribed_topics: vec!["t".into()],
                    assignor: "uniform".into(),
                    session_timeout_ms: 1000,
                    heartbeat_interval_ms: 100,
                    owned: Vec::new(),
                },
                partition_counts: BTreeMap::new(),
            },
        );
        assert_eq!(
            hb.reply.error.map(|e| e.code),
            Some(ErrorCode::InconsistentGroupProtocol)
        );
        // And members that share no assignor cannot be one group.
        let Pending::Done(r) = join(&mut c, 2, "", &["roundrobin"]) else {
            panic!("answered at once")
        };
        assert_eq!(
            r.error.map(|e| e.code),
            Some(ErrorCode::InconsistentGroupProtocol)
        );
    }

    /// A static member that restarted while the coordinator moved joins the
    /// new one with its instance id and no member id: the wait for its old
    /// id ends there, and its generation forms without waiting a session.
    #[test]
    fn a_static_member_restarted_across_a_coordinator_move_is_not_waited_for() {
        let static_join = |c: &mut GroupCoordinator, now, new_id: &str| {
            let mut req = join_req("", &["range"]);
            req.instance_id = Some("host-1".into());
            c.step(
                now,
                input::JoinGroup {
                    request: req,
                    new_member_id: new_id.into(),
                },
            )
            .reply
        };
        let mut old = coordinator();
        assert_eq!(static_join(&mut old, 0, "s-old"), Pending::Wait);
        let log = old.step(DELAY, input::Tick).records;
        assert_eq!(done(result(&mut old, DELAY, "s-old")).generation, 1);
        let loaded: Millis = 500;
        let mut c = coordinator();
        for r in &log {
            c.step(loaded, input::Replay(r.clone()));
        }
        c.hold_after_load(loaded);
        assert_eq!(static_join(&mut c, loaded, "s-new"), Pending::Wait);
        let t = loaded + DELAY + 10;
        assert!(t < loaded + 1000, "within the old member's session");
        c.step(t, input::Tick);
        let r = done(result(&mut c, t, "s-new"));
        assert_eq!((r.error, r.generation), (None, 2));
    }

    #[test]
    fn a_static_members_new_incarnation_takes_its_place_and_fences_the_old_id() {
        let mut c = coordinator();
        let mut req = join_req("", &["range"]);
        req.instance_id = Some("host-1".into());
        let join_static = |c: &mut GroupCoordinator, now, req: &JoinGroupRequest| {
            c.step(
                now,
                input::JoinGroup {
                    request: req.clone(),
                    new_member_id: format!(
                        "m{}",
                        NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    ),
                },
            )
            .reply
        };
        // A static member joins at once (no MEMBER_ID_REQUIRED round).
        assert_eq!(join_static(&mut c, 0, &req), Pending::Wait);
        c.step(DELAY, input::Tick);
        let Some(old) = c
            .groups
            .get(G)
            .and_then(|g| g.classic.members.keys().next().cloned())
        else {
            panic!("the static member is in the group")
        };
        let first = done(result(&mut c, DELAY, &old));
        assert_eq!(first.generation, 1);
        done(sync(&mut c, DELAY, &old, 1, &[(&old, b"p0")]));
        // It restarts: same instance id, no member id. It is the only
        // member, so the rebalance completes at once.
        let answer = done(join_static(&mut c, 200, &req));
        let new = answer.member_id.clone();
        assert_ne!(new, old);
        assert_eq!(
            (answer.generation, answer.leader.as_str()),
            (2, new.as_str())
        );
        let g = &c.groups[G];
        assert_eq!(g.classic.members.len(), 1, "replaced, not added");
        assert_eq!(
            g.classic.members[&new].instance_id.as_deref(),
            Some("host-1")
        );
        assert_eq!(
            heartbeat(&mut c, 202, &old, 2),
            Some(ErrorCode::UnknownMemberId)
        );
    }

    #[test]
    fn the_consumer_protocol_reader_never_panics_on_garbage() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for len in 0..200usize {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            let _ = consumer_protocol::subscription_topics(&bytes);
            let _ = consumer_protocol::assignment(&bytes);
        }
    }
}
