//! Tests of the `GroupCoordinator` state machine under a simulated clock
//! (plain numbers for `now`), with invariants checked after every step.

use std::collections::{BTreeMap, BTreeSet};

use rill_proto::Offset;
use rill_proto::wire::*;

use super::coordinator::*;
use super::records::GroupRecord;

const SESSION_MS: u32 = 1000;
const INTERVAL_MS: u32 = 100;

fn counts(topic: &str, n: u32) -> BTreeMap<String, u32> {
    [(topic.to_string(), n)].into_iter().collect()
}

/// A member as a test drives it: it owns what the coordinator gave it and acks
/// revocations on its next heartbeat (like the client does).
#[derive(Debug, Clone)]
struct Sim {
    id: String,
    instance: Option<String>,
    epoch: i32,
    owned: BTreeSet<(String, u32)>,
}

impl Sim {
    fn new(id: &str) -> Sim {
        Sim {
            id: id.into(),
            instance: None,
            epoch: 0,
            owned: BTreeSet::new(),
        }
    }

    fn request(&self, group: &str, assignor: &str) -> ConsumerGroupHeartbeatRequest {
        let mut owned: Vec<TopicPartitions> = Vec::new();
        for (t, p) in &self.owned {
            match owned.last_mut() {
                Some(last) if last.topic == *t => last.partitions.push(*p),
                _ => owned.push(TopicPartitions {
                    topic: t.clone(),
                    partitions: vec![*p],
                }),
            }
        }
        ConsumerGroupHeartbeatRequest {
            group_id: group.into(),
            member_id: self.id.clone(),
            member_epoch: self.epoch,
            instance_id: self.instance.clone(),
            client_id: "test".into(),
            subscribed_topics: vec!["t".into()],
            assignor: assignor.into(),
            session_timeout_ms: SESSION_MS,
            heartbeat_interval_ms: INTERVAL_MS,
            owned,
        }
    }
}

struct World {
    c: GroupCoordinator,
    counts: BTreeMap<String, u32>,
    assignor: &'static str,
    /// Every record written, in order (what `__consumer_offsets` holds).
    log: Vec<GroupRecord>,
}

impl World {
    fn new(partitions: u32) -> World {
        World {
            c: GroupCoordinator::new(CoordinatorConfig::default()),
            counts: counts("t", partitions),
            assignor: "uniform",
            log: Vec::new(),
        }
    }

    /// Steps and replays the output's records (as the shell does after writing).
    fn step<I: Input>(&mut self, now: Millis, input: I) -> I::Reply {
        let out = self.c.step(now, input);
        for r in out.records {
            self.log.push(r.clone());
            self.c.step(now, input::Replay(r));
        }
        self.c.check_invariants();
        out.reply
    }

    fn heartbeat_raw(
        &mut self,
        now: Millis,
        req: ConsumerGroupHeartbeatRequest,
    ) -> ConsumerGroupHeartbeatResponse {
        let input = input::Heartbeat {
            request: req,
            partition_counts: self.counts.clone(),
        };
        self.step(now, input)
    }

    /// One heartbeat of `m`: applies the assignment (owned = what it was given).
    fn heartbeat(&mut self, now: Millis, m: &mut Sim) -> ConsumerGroupHeartbeatResponse {
        let resp = self.heartbeat_raw(now, m.request("g", self.assignor));
        assert!(resp.error.is_none(), "{:?}", resp.error);
        m.epoch = resp.member_epoch;
        m.owned = resp
            .assignment
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (t.topic.clone(), *p)))
            .collect();
        resp
    }

    fn commit(
        &mut self,
        member: Option<(&str, i32)>,
        partition: u32,
        offset: i64,
    ) -> OffsetCommitResponse {
        let input = input::CommitOffsets {
            request: OffsetCommitRequest {
                group_id: "g".into(),
                member: member.map(|(m, e)| (m.to_string(), e)),
                partitions: vec![OffsetCommitPartition {
                    topic: "t".into(),
                    partition,
                    offset: Offset(offset),
                    metadata: String::new(),
                }],
            },
            wall_ms: 1,
            transaction: None,
        };
        self.step(0, input)
    }

    fn committed(&mut self, partition: u32) -> Option<Offset> {
        let input = input::FetchOffsets {
            request: OffsetFetchRequest {
                group_id: "g".into(),
                partitions: Some(vec![TopicPartitions {
                    topic: "t".into(),
                    partitions: vec![partition],
                }]),
                require_stable: false,
            },
            wall_ms: 1,
        };
        self.step(0, input).offsets[0].offset
    }
}

/// Heartbeats every member in turn until nothing changes (bounded rounds).
fn settle(w: &mut World, now: &mut Millis, members: &mut [Sim]) {
    for _ in 0..10 {
        let before: Vec<BTreeSet<(String, u32)>> =
            members.iter().map(|m| m.owned.clone()).collect();
        for m in members.iter_mut() {
            w.heartbeat(*now, m);
        }
        *now += 10;
        let after: Vec<BTreeSet<(String, u32)>> = members.iter().map(|m| m.owned.clone()).collect();
        if before == after {
            return;
        }
    }
    panic!("the group did not settle in 10 rounds");
}

#[test]
fn three_members_share_six_partitions_two_each() {
    let mut w = World::new(6);
    let mut now = 0;
    let mut ms = vec![Sim::new("a"), Sim::new("b"), Sim::new("c")];
    settle(&mut w, &mut now, &mut ms);
    let mut all = BTreeSet::new();
    for m in &ms {
        assert_eq!(m.owned.len(), 2, "{m:?}");
        assert!(m.epoch > 0);
        all.extend(m.owned.iter().cloned());
    }
    assert_eq!(all.len(), 6);
}

#[test]
fn a_joining_member_gets_partitions_only_after_they_are_released() {
    let mut w = World::new(6);
    let mut a = Sim::new("a");
    w.heartbeat(0, &mut a);
    assert_eq!(a.owned.len(), 6);
    let kept_before = a.owned.clone();

    let mut b = Sim::new("b");
    let first = w.heartbeat(10, &mut b);
    assert!(b.owned.is_empty(), "a still owns everything");
    assert_eq!(
        first.heartbeat_interval_ms, RECONCILE_HEARTBEAT_INTERVAL_MS,
        "b waits for partitions: heartbeat sooner"
    );
    // a learns of its revocation: it keeps three and stops reporting the rest
    // only on its next heartbeat.
    let revoked_owned = a.owned.clone();
    let resp = w.heartbeat_raw(20, a.request("g", "uniform"));
    let assigned: BTreeSet<(String, u32)> = resp
        .assignment
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| ("t".to_string(), *p)))
        .collect();
    assert_eq!(assigned.len(), 3);
    assert!(assigned.is_subset(&kept_before), "a keeps 3 of its own");
    a.epoch = resp.member_epoch;
    // a still reports all six (the application has not acknowledged yet).
    a.owned = revoked_owned;
    w.heartbeat_raw(25, a.request("g", "uniform"));
    w.heartbeat(30, &mut b);
    assert!(b.owned.is_empty(), "not released yet");
    // a acknowledges: owned = its assignment.
    a.owned = assigned.clone();
    w.heartbeat(40, &mut a);
    w.heartbeat(50, &mut b);
    assert_eq!(b.owned.len(), 3);
    assert!(b.owned.is_disjoint(&a.owned));
    assert_eq!(a.owned, assigned, "a's kept partitions never moved");
}

#[test]
fn a_silent_member_is_removed_after_its_session_timeout() {
    let mut w = World::new(4);
    let mut now = 0;
    let mut ms = vec![Sim::new("a"), Sim::new("b")];
    settle(&mut w, &mut now, &mut ms);
    let mut a = ms[0].clone();
    // b goes silent; a keeps heartbeating.
    let mut t = now;
    while t < now + SESSION_MS as u64 + 200 {
        w.heartbeat(t, &mut a);
        w.step(t, input::Tick);
        t += INTERVAL_MS as u64;
    }
    w.heartbeat(t, &mut a);
    assert_eq!(a.owned.len(), 4, "a took over b's partitions");
    let stale = ms[1].request("g", "uniform");
    let resp = w.heartbeat_raw(t, stale);
    assert_eq!(resp.error.unwrap().code, ErrorCode::UnknownMemberId);
    // b's commit is refused: it is no longer a member.
    let c = w.commit(Some(("b", ms[1].epoch)), 0, 5);
    assert_eq!(c.error.unwrap().code, ErrorCode::UnknownMemberId);
}

#[test]
fn a_group_whose_last_member_left_stays_empty_for_a_while_then_goes() {
    let mut w = World::new(2);
    let mut now = 0;
    let mut ms = vec![Sim::new("a")];
    settle(&mut w, &mut now, &mut ms);
    let mut leave = ms[0].request("g", "uniform");
    leave.member_epoch = -1;
    assert!(w.heartbeat_raw(now, leave).error.is_none());
    let describe = |w: &mut World, now| {
        let req = DescribeGroupsRequest {
            group_ids: vec!["g".into()],
        };
        w.step(now, input::DescribeGroups(req)).groups.remove(0)
    };
    // Ticks right after the leave keep it (a describe then sees it Empty).
    for _ in 0..3 {
        now += 100;
        w.step(now, input::Tick);
    }
    let d = describe(&mut w, now);
    assert!(d.error.is_none(), "{:?}", d.error);
    assert_eq!(d.state, "Empty");
    assert!(d.members.is_empty());
    // Past the keep time, with no offsets, it is forgotten.
    now += EMPTY_GROUP_KEEP_MS;
    w.step(now, input::Tick);
    let d = describe(&mut w, now);
    assert_eq!(d.error.unwrap().code, ErrorCode::GroupIdNotFound);
}

#[test]
fn a_static_member_gets_its_partitions_back_after_a_quick_restart() {
    let mut w = World::new(6);
    let mut now = 0;
    let mut ms = vec![Sim::new("a"), Sim::new("b"), Sim::new("c")];
    ms[1].instance = Some("worker-b".into());
    settle(&mut w, &mut now, &mut ms);
    let b_had = ms[1].owned.clone();
    // b leaves for a moment (epoch -2) ...
    let mut leave = ms[1].request("g", "uniform");
    leave.member_epoch = LEAVE_GROUP_STATIC_EPOCH;
    w.heartbeat_raw(now, leave);
    // ... the others heartbeat meanwhile and keep what they have ...
    let (a_had, c_had) = (ms[0].owned.clone(), ms[2].owned.clone());
    for m in [0, 2] {
        let mut sim = ms[m].clone();
        w.heartbeat(now + 100, &mut sim);
        ms[m] = sim;
    }
    assert_eq!(ms[0].owned, a_had);
    assert_eq!(ms[2].owned, c_had);
    // ... and a new incarnation (new member id, same instance id) takes b's place.
    let mut b2 = Sim::new("b-2");
    b2.instance = Some("worker-b".into());
    w.heartbeat(now + 200, &mut b2);
    assert_eq!(b2.owned, b_had);
    // The members record names the new incarnation, so a coordinator that
    // loads the group waits for it (the old id would never come back).
    let named = w
        .log
        .iter()
        .rev()
        .find_map(|r| match r {
            GroupRecord::Members { value: Some(m), .. } => Some(m.member_ids.clone()),
            _ => None,
        })
        .unwrap();
    assert!(
        named.contains(&b2.id) && !named.contains(&ms[1].id),
        "{named:?}"
    );
    // The old incarnation is fenced.
    let old = w.heartbeat_raw(now + 210, ms[1].request("g", "uniform"));
    assert_eq!(old.error.unwrap().code, ErrorCode::UnknownMemberId);
}

#[test]
fn a_static_member_that_does_not_come_back_loses_its_partitions() {
    let mut w = World::new(4);
    let mut now = 0;
    let mut ms = vec![Sim::new("a"), Sim::new("b")];
    ms[1].instance = Some("worker-b".into());
    settle(&mut w, &mut now, &mut ms);
    let mut leave = ms[1].request("g", "uniform");
    leave.member_epoch = LEAVE_GROUP_STATIC_EPOCH;
    w.heartbeat_raw(now, leave);
    let mut a = ms[0].clone();
    let end = now + SESSION_MS as u64 + 100;
    while now < end {
        w.heartbeat(now, &mut a);
        w.step(now, input::Tick);
        now += INTERVAL_MS as u64;
    }
    w.heartbeat(now, &mut a);
    assert_eq!(a.owned.len(), 4);
}

#[test]
fn commits_are_fenced_by_member_epoch_and_ownership() {
    let mut w = World::new(2);
    let mut now = 0;
    let mut ms = vec![Sim::new("a"), Sim::new("b")];
    settle(&mut w, &mut now, &mut ms);
    let a_part = ms[0].owned.iter().next().unwrap().1;
    let b_part = ms[1].owned.iter().next().unwrap().1;
    let ok = w.commit(Some(("a", ms[0].epoch)), a_part, 10);
    assert!(
        ok.error.is_none() && ok.partitions[0].error.is_none(),
        "{ok:?}"
    );
    assert_eq!(w.committed(a_part), Some(Offset(10)));
    // Not a's partition.
    let not_owned = w.commit(Some(("a", ms[0].epoch)), b_part, 10);
    assert!(not_owned.partitions[0].error.is_some());
    assert_eq!(w.committed(b_part), None);
    // A stale epoch.
    let stale = w.commit(Some(("a", ms[0].epoch + 7)), a_part, 11);
    assert_eq!(stale.error.unwrap().code, ErrorCode::FencedMemberEpoch);
    // Admin resets are refused while members are there ...
    let refused = w.commit(None, a_part, 0);
    let e = refused.error.unwrap();
    assert_eq!(e.code, ErrorCode::NonEmptyGroup);
    assert!(e.message.contains("member"), "{}", e.message);
    assert_eq!(w.committed(a_part), Some(Offset(10)));
    // ... and allowed once they left.
    for m in &ms {
        let mut leave = m.request("g", "uniform");
        leave.member_epoch = LEAVE_GROUP_EPOCH;
        w.heartbeat_raw(now, leave);
    }
    let reset = w.commit(None, a_part, 0);
    assert!(reset.error.is_none());
    assert_eq!(w.committed(a_part), Some(Offset(0)));
}

#[test]
fn durable_state_survives_a_replay_into_a_new_coordinator() {
    let mut w = World::new(2);
    let mut a = Sim::new("a");
    // Capture every record written, as the log would.
    let mut log: Vec<GroupRecord> = Vec::new();
    let out = w.c.step(
        0,
        input::Heartbeat {
            request: a.request("g", "uniform"),
            partition_counts: w.counts.clone(),
        },
    );
    let resp = out.reply;
    a.epoch = resp.member_epoch;
    log.extend(out.records.iter().cloned());
    for r in out.records {
        w.c.step(0, input::Replay(r));
    }
    let out = w.c.step(
        0,
        input::CommitOffsets {
            request: OffsetCommitRequest {
                group_id: "g".into(),
                member: Some(("a".into(), a.epoch)),
                partitions: vec![OffsetCommitPartition {
                    topic: "t".into(),
                    partition: 1,
                    offset: Offset(77),
                    metadata: "m".into(),
                }],
            },
            wall_ms: 5,
            transaction: None,
        },
    );
    // Not replayed yet: not visible.
    assert_eq!(w.committed(1), None);
    log.extend(out.records.iter().cloned());
    for r in out.records {
        w.c.step(0, input::Replay(r));
    }
    assert_eq!(w.committed(1), Some(Offset(77)));

    let mut restarted = World::new(2);
    for r in log {
        restarted.step(0, input::Replay(r));
    }
    assert_eq!(restarted.committed(1), Some(Offset(77)));
    // The member is unknown after the restart and must rejoin; its new epoch is
    // above the old one (the group epoch was durable).
    let resp = restarted.heartbeat_raw(0, a.request("g", "uniform"));
    assert_eq!(resp.error.unwrap().code, ErrorCode::UnknownMemberId);
    let mut again = Sim::new("a2");
    restarted.heartbeat(0, &mut again);
    assert!(again.epoch > a.epoch, "{} > {}", again.epoch, a.epoch);
}

#[test]
fn delete_is_refused_with_members_and_removes_offsets_after() {
    let mut w = World::new(1);
    let mut a = Sim::new("a");
    w.heartbeat(0, &mut a);
    w.commit(Some(("a", a.epoch)), 0, 3);
    let del = |w: &mut World| {
        w.step(
            0,
            input::DeleteGroups(DeleteGroupsRequest {
                group_ids: vec!["g".into()],
            }),
        )
        .results[0]
            .error
            .clone()
    };
    assert_eq!(del(&mut w).unwrap().code, ErrorCode::NonEmptyGroup);
    let mut leave = a.request("g", "uniform");
    leave.member_epoch = LEAVE_GROUP_EPOCH;
    w.heartbeat_raw(0, leave);
    assert!(del(&mut w).is_none());
    assert_eq!(w.committed(0), None);
    assert_eq!(del(&mut w).unwrap().code, ErrorCode::GroupIdNotFound);
}

#[test]
fn bad_heartbeats_get_clear_errors() {
    let mut w = World::new(1);
    let mut req = Sim::new("a").request("g", "roundrobin");
    let e = w.heartbeat_raw(0, req.clone()).error.unwrap();
    assert_eq!(e.code, ErrorCode::InconsistentGroupProtocol);
    assert!(e.message.contains("uniform, range"), "{}", e.message);
    req.assignor = "uniform".into();
    req.session_timeout_ms = 10;
    let e = w.heartbeat_raw(0, req.clone()).error.unwrap();
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    assert!(e.message.contains("session timeout 10 ms"), "{}", e.message);
    req.session_timeout_ms = SESSION_MS;
    req.group_id = String::new();
    assert_eq!(
        w.heartbeat_raw(0, req).error.unwrap().code,
        ErrorCode::InvalidGroupId
    );
    // A second member with another assignor is refused.
    let mut a = Sim::new("a");
    w.heartbeat(0, &mut a);
    let other = Sim::new("b").request("g", "range");
    let e = w.heartbeat_raw(0, other).error.unwrap();
    assert_eq!(e.code, ErrorCode::InconsistentGroupProtocol);
}

#[test]
fn range_assignor_through_the_coordinator() {
    let mut w = World::new(5);
    w.assignor = "range";
    let mut now = 0;
    let mut ms = vec![Sim::new("a"), Sim::new("b")];
    settle(&mut w, &mut now, &mut ms);
    let a: Vec<u32> = ms[0].owned.iter().map(|(_, p)| *p).collect();
    let b: Vec<u32> = ms[1].owned.iter().map(|(_, p)| *p).collect();
    assert_eq!(a, vec![0, 1, 2]);
    assert_eq!(b, vec![3, 4]);
}

/// A small seeded generator (no randomness inside the state machine; the test
/// picks its own inputs reproducibly).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

#[test]
fn seeded_random_membership_keeps_invariants_and_converges() {
    for seed in 1..=20u64 {
        let mut rng = XorShift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut w = World::new(7);
        let mut members: Vec<Option<Sim>> = (0..5).map(|_| None).collect();
        let mut now: Millis = 0;
        for _ in 0..300 {
            let i = (rng.next() % members.len() as u64) as usize;
            match (rng.next() % 10, members[i].take()) {
                (0, None) => {
                    let mut m = Sim::new(&format!("m{i}-{now}"));
                    w.heartbeat(now, &mut m);
                    members[i] = Some(m);
                }
                (1, Some(m)) => {
                    let mut leave = m.request("g", "uniform");
                    leave.member_epoch = LEAVE_GROUP_EPOCH;
                    w.heartbeat_raw(now, leave);
                }
                (2, Some(m)) => {
                    // Crash: silent until the session expires.
                    let _ = m;
                }
                (_, Some(mut m)) => {
                    let resp = w.heartbeat_raw(now, m.request("g", "uniform"));
                    if resp.error.is_none() {
                        m.epoch = resp.member_epoch;
                        m.owned = resp
                            .assignment
                            .iter()
                            .flat_map(|t| t.partitions.iter().map(|p| (t.topic.clone(), *p)))
                            .collect();
                        members[i] = Some(m);
                    }
                }
                (_, None) => {}
            }
            now += rng.next() % 150;
            w.step(now, input::Tick);
        }
        // Crashed members expire; the rest converge to a full, balanced split.
        now += SESSION_MS as u64 + 1;
        w.step(now, input::Tick);
        let live: Vec<Sim> = members.into_iter().flatten().collect();
        let mut alive = Vec::new();
        for mut m in live {
            let resp = w.heartbeat_raw(now, m.request("g", "uniform"));
            if resp.error.is_none() {
                m.epoch = resp.member_epoch;
                alive.push(m);
            }
        }
        if alive.is_empty() {
            continue;
        }
        settle(&mut w, &mut now, &mut alive);
        let total: usize = alive.iter().map(|m| m.owned.len()).sum();
        assert_eq!(total, 7, "seed {seed}: every partition owned");
        let (min, max) = (
            alive.iter().map(|m| m.owned.len()).min().unwrap(),
            alive.iter().map(|m| m.owned.len()).max().unwrap(),
        );
        assert!(max - min <= 1, "seed {seed}: balanced ({min}..{max})");
    }
}

/// A coordinator that took over `w`'s groups at `loaded` (it replayed the
/// log into a fresh coordinator and adopted its groups, as the shell does).
fn moved(w: &World, now: Millis, loaded: Millis) -> World {
    let mut replayed = GroupCoordinator::new(CoordinatorConfig::default());
    for r in &w.log {
        replayed.step(now, input::Replay(r.clone()));
    }
    replayed.hold_after_load(loaded);
    let mut c = GroupCoordinator::new(CoordinatorConfig::default());
    c.adopt(replayed, |_| true);
    World {
        c,
        counts: w.counts.clone(),
        assignor: w.assignor,
        log: Vec::new(),
    }
}

/// After the coordinator moved, the member that reaches the new one first is
/// given nothing while a member of the old one may still hold partitions: not
/// until that member rejoined (it gives its partitions up first, as the
/// client does) or its session timeout passed since the load. The
/// network-fault test (issue 21) saw two members consume one partition when
/// the new coordinator, knowing no members, gave the first one everything.
#[test]
fn a_moved_coordinator_adds_no_partition_until_the_old_members_are_back() {
    let mut w = World::new(4);
    let (mut a, mut b) = (Sim::new("a"), Sim::new("b"));
    let mut now: Millis = 0;
    for _ in 0..10 {
        now += INTERVAL_MS as Millis;
        w.heartbeat(now, &mut a);
        w.heartbeat(now, &mut b);
    }
    assert_eq!(a.owned.len(), 2, "{a:?}");
    assert_eq!(b.owned.len(), 2, "{b:?}");
    let loaded = now + 50;

    // b reaches the new coordinator first: unknown there, it gives its
    // partitions up and rejoins; a has not heard of the move and still
    // consumes its two.
    for a_comes_back in [true, false] {
        let mut w = moved(&w, now, loaded);
        let resp = w.heartbeat_raw(loaded + 10, b.request("g", "uniform"));
        assert_eq!(resp.error.map(|e| e.code), Some(ErrorCode::UnknownMemberId));
        let mut b = Sim::new("b");
        let mut t = loaded + 10;
        while t < loaded + SESSION_MS as Millis / 2 {
            let resp = w.heartbeat(t, &mut b);
            assert!(
                b.owned.is_empty(),
                "{} ms after the load, b was given {:?} while a may still hold {:?}",
                t - loaded,
                b.owned,
                a.owned
            );
            assert!(
                resp.heartbeat_interval_ms as Millis <= loaded + SESSION_MS as Millis - t,
                "b is told to come back by the end of the hold: {resp:?}"
            );
            t += INTERVAL_MS as Millis;
        }
        if a_comes_back {
            // a learns of the move, gives its partitions up and rejoins:
            // nobody is awaited, the partitions are handed out at once.
            let resp = w.heartbeat_raw(t, a.request("g", "uniform"));
            assert_eq!(resp.error.map(|e| e.code), Some(ErrorCode::UnknownMemberId));
            let mut a = Sim::new("a");
            for _ in 0..3 {
                w.heartbeat(t, &mut a);
                w.heartbeat(t, &mut b);
                t += 10;
            }
            assert!(t < loaded + SESSION_MS as Millis);
            assert_eq!(a.owned.len() + b.owned.len(), 4, "{a:?} {b:?}");
        } else {
            // a stays silent: a session after the load it has given its
            // partitions up (the client does), and b takes all.
            while t < loaded + SESSION_MS as Millis {
                w.heartbeat(t, &mut b);
                assert!(b.owned.is_empty(), "{b:?}");
                t += INTERVAL_MS as Millis;
            }
            for _ in 0..3 {
                w.heartbeat(t, &mut b);
                t += 10;
            }
            assert_eq!(b.owned.len(), 4, "{b:?}");
        }
    }

    // A group that was empty when the coordinator moved is not held.
    let mut empty = World::new(2);
    let mut c = Sim::new("c");
    empty.heartbeat(0, &mut c);
    let resp = empty.heartbeat_raw(10, {
        let mut r = c.request("g", "uniform");
        r.member_epoch = LEAVE_GROUP_EPOCH;
        r
    });
    assert!(resp.error.is_none(), "{resp:?}");
    let mut w = moved(&empty, 20, 30);
    let mut d = Sim::new("d");
    w.heartbeat(40, &mut d);
    w.heartbeat(50, &mut d);
    assert_eq!(d.owned.len(), 2, "{d:?}");
}

/// A static member that restarts while the coordinator moves joins the new
/// one under a new member id with its instance id: that ends the wait for
/// its old id (the old incarnation is gone, or fenced by the join), so the
/// group is not held for a whole session.
#[test]
fn a_static_member_restarted_across_a_coordinator_move_is_not_waited_for() {
    let mut w = World::new(4);
    let mut a = Sim::new("a");
    a.instance = Some("host-a".into());
    let mut b = Sim::new("b");
    let mut now: Millis = 0;
    for _ in 0..10 {
        now += INTERVAL_MS as Millis;
        w.heartbeat(now, &mut a);
        w.heartbeat(now, &mut b);
    }
    assert_eq!(a.owned.len() + b.owned.len(), 4, "{a:?} {b:?}");
    let loaded = now + 50;
    let mut w = moved(&w, now, loaded);
    // b learns of the move and rejoins; a's process restarted: a new member
    // id, the same instance id.
    let resp = w.heartbeat_raw(loaded + 10, b.request("g", "uniform"));
    assert_eq!(resp.error.map(|e| e.code), Some(ErrorCode::UnknownMemberId));
    let mut b = Sim::new("b");
    let mut a2 = Sim::new("a-restarted");
    a2.instance = Some("host-a".into());
    let mut t = loaded + 10;
    for _ in 0..4 {
        w.heartbeat(t, &mut a2);
        w.heartbeat(t, &mut b);
        t += 10;
    }
    assert!(t < loaded + SESSION_MS as Millis / 2);
    assert_eq!(
        a2.owned.len() + b.owned.len(),
        4,
        "held for the restarted member's old id: {a2:?} {b:?}"
    );
}

/// OffsetFetch with `require_stable` (KIP-447): while an open transaction
/// holds offsets for a partition, UNSTABLE_OFFSET_COMMIT naming it; the
/// committed offsets again once the transaction ends (commit or abort), or
/// once its record expired; a coordinator that took the group over knows the
/// pending offsets from the log.
#[test]
fn require_stable_waits_for_open_transactions_offsets() {
    let mut w = World::new(4);
    w.commit(None, 0, 5);
    let fetch = |w: &mut World, wall_ms, stable: bool, partitions: Option<Vec<u32>>| {
        w.step(
            0,
            input::FetchOffsets {
                request: OffsetFetchRequest {
                    group_id: "g".into(),
                    partitions: partitions.map(|partitions| {
                        vec![TopicPartitions {
                            topic: "t".into(),
                            partitions,
                        }]
                    }),
                    require_stable: stable,
                },
                wall_ms,
            },
        )
    };
    let pending = |txn: &str, partitions: &[u32], expires_ms| input::PendingOffsets {
        group: "g".into(),
        transactional_id: txn.into(),
        partitions: partitions.iter().map(|p| ("t".to_string(), *p)).collect(),
        expires_ms,
    };
    assert_eq!(w.step(0, pending("tx", &[0, 2], 10_000)), Ok(()));
    // Unstable: the asked partitions the transaction holds, and only those.
    let r = fetch(&mut w, 100, true, Some(vec![0, 1]));
    let e = r.error.clone().expect("unstable");
    assert_eq!(e.code, ErrorCode::UnstableOffsetCommit);
    assert!(e.message.contains("t-0"), "{}", e.message);
    assert_eq!(r.offsets.len(), 1, "{r:?}");
    assert_eq!((r.offsets[0].partition, r.offsets[0].offset), (0, None));
    assert_eq!(fetch(&mut w, 100, true, None).offsets.len(), 2);
    // Stable partitions, or without require_stable: the committed offsets.
    let r = fetch(&mut w, 100, true, Some(vec![1]));
    assert!(r.error.is_none(), "{r:?}");
    let r = fetch(&mut w, 100, false, Some(vec![0]));
    assert_eq!(r.offsets[0].offset, Some(Offset(5)));
    // Another coordinator loading the log knows them too.
    let mut other = moved(&w, 0, 0);
    assert!(fetch(&mut other, 100, true, Some(vec![2])).error.is_some());
    // The transaction commits: its offset stored, nothing pending.
    let commit = input::CommitOffsets {
        request: OffsetCommitRequest {
            group_id: "g".into(),
            member: None,
            partitions: vec![OffsetCommitPartition {
                topic: "t".into(),
                partition: 0,
                offset: Offset(9),
                metadata: String::new(),
            }],
        },
        wall_ms: 200,
        transaction: Some("tx".into()),
    };
    assert!(w.step(0, commit).error.is_none());
    let r = fetch(&mut w, 300, true, None);
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(r.offsets[0].offset, Some(Offset(9)));
    // An abort (no offsets) drops them as well; an expired record no longer counts.
    assert_eq!(w.step(0, pending("tx2", &[1], 10_000)), Ok(()));
    assert!(fetch(&mut w, 300, true, None).error.is_some());
    let abort = input::CommitOffsets {
        request: OffsetCommitRequest {
            group_id: "g".into(),
            member: None,
            partitions: Vec::new(),
        },
        wall_ms: 400,
        transaction: Some("tx2".into()),
    };
    w.step(0, abort);
    assert!(fetch(&mut w, 500, true, None).error.is_none());
    assert_eq!(w.step(0, pending("tx3", &[3], 1_000)), Ok(()));
    assert!(fetch(&mut w, 999, true, None).error.is_some());
    assert!(fetch(&mut w, 1_000, true, None).error.is_none());
    let tombstones = |w: &World| {
        w.log
            .iter()
            .filter(|r| matches!(r, GroupRecord::Pending { value: None, .. }))
            .count()
    };
    // Each end wrote one tombstone of its pending record (none for tx3).
    assert_eq!(tombstones(&w), 2);
    // The timer drops the expired record (only once expired).
    w.step(0, input::ExpirePending { wall_ms: 999 });
    assert_eq!(tombstones(&w), 2);
    w.step(0, input::ExpirePending { wall_ms: 1_000 });
    assert_eq!(tombstones(&w), 3);
    w.step(0, input::ExpirePending { wall_ms: 2_000 });
    assert_eq!(tombstones(&w), 3, "nothing left to expire");
    // A tombstone that did not replay (its write failed) is asked for again,
    // but not at every tick.
    assert_eq!(w.step(0, pending("tx4", &[3], 3_000)), Ok(()));
    let mut c = GroupCoordinator::new(CoordinatorConfig::default());
    for r in &w.log {
        c.step(0, input::Replay(r.clone()));
    }
    let asked = |c: &mut GroupCoordinator, wall_ms| {
        c.step(0, input::ExpirePending { wall_ms }).records.len()
    };
    assert_eq!(asked(&mut c, 3_000), 1);
    assert_eq!(asked(&mut c, 3_100), 0);
    assert_eq!(asked(&mut c, 3_000 + EXPIRE_PENDING_AGAIN_MS), 1);
}
