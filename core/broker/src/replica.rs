//! `ReplicaState`: one partition's replication state on this broker — the leader,
//! the leader epoch, the replica and in-sync replica lists, what the leader knows
//! of each follower, and the high watermark — changed only through the pure
//! transitions below, which take the log end offset and the time as arguments.
//!
//! The `Partition` keeps one `ReplicaState` under one lock, so a reader never sees
//! a new epoch with the old leader, or a new ISR with the old high watermark.
//! Nothing here does I/O, reads a clock or wakes anybody: a transition that moves
//! the high watermark returns the new one, and the caller wakes its waiters.
//!
//! Invariants (asserted where they are established, and checked by a seeded
//! random test of every transition):
//! - the leader epoch never goes back;
//! - the high watermark never goes back, except by [`ReplicaState::truncate`]
//!   (a follower cutting its log to the leader's epoch boundary);
//! - the high watermark never passes this broker's log end offset, and on the
//!   leader it moves only to the lowest log end offset known in the ISR;
//! - the leader forgets its followers' progress at every leadership change.

use rill_proto::{LeaderEpoch, Offset};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What the leader knows of one follower (from its fetches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerState {
    /// The follower's log end offset: the offset it fetched from last.
    pub log_end_offset: Offset,
    /// The last time the follower had fetched up to the leader's log end offset.
    pub caught_up_at: Instant,
}

/// One partition's replication state on this broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaState {
    broker_id: i32,
    leader: Option<i32>,
    leader_epoch: LeaderEpoch,
    replicas: Vec<i32>,
    isr: Vec<i32>,
    /// On the leader: each follower's progress; empty on a follower.
    followers: BTreeMap<i32, FollowerState>,
    high_watermark: Offset,
}

impl ReplicaState {
    /// A partition this broker leads alone (a single broker, or before the
    /// quorum's assignment arrives): replicas = ISR = [this broker], the high
    /// watermark at the log end.
    pub fn sole_leader(broker_id: i32, leader_epoch: LeaderEpoch, log_end_offset: Offset) -> Self {
        ReplicaState {
            broker_id,
            leader: Some(broker_id),
            leader_epoch,
            replicas: vec![broker_id],
            isr: vec![broker_id],
            followers: BTreeMap::new(),
            high_watermark: log_end_offset,
        }
    }

    /// A partition just opened from disk, before the quorum's role arrives:
    /// as [`Self::sole_leader`], but with the high watermark at `log_start_offset`
    /// (nothing in the local log is known to be replicated; the high watermark
    /// reaches the log end at the first `set_role` only if this broker is the
    /// whole ISR).
    pub fn opened(broker_id: i32, leader_epoch: LeaderEpoch, log_start_offset: Offset) -> Self {
        ReplicaState::sole_leader(broker_id, leader_epoch, log_start_offset)
    }

    pub fn broker_id(&self) -> i32 {
        self.broker_id
    }
    pub fn leader(&self) -> Option<i32> {
        self.leader
    }
    pub fn is_leader(&self) -> bool {
        self.leader == Some(self.broker_id)
    }
    pub fn leader_epoch(&self) -> LeaderEpoch {
        self.leader_epoch
    }
    pub fn replicas(&self) -> &[i32] {
        &self.replicas
    }
    pub fn isr(&self) -> &[i32] {
        &self.isr
    }
    pub fn followers(&self) -> &BTreeMap<i32, FollowerState> {
        &self.followers
    }
    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }

    /// Takes the leadership and replica set the quorum committed: dispatches to
    /// [`Self::become_leader`] or [`Self::become_follower`].
    pub fn set_role(
        &mut self,
        leader: Option<i32>,
        epoch: LeaderEpoch,
        replicas: &[i32],
        isr: &[i32],
        log_end_offset: Offset,
    ) -> Option<Offset> {
        if leader == Some(self.broker_id) {
            self.become_leader(epoch, replicas, isr, log_end_offset)
        } else {
            self.become_follower(leader, epoch, replicas, isr);
            None
        }
    }

    /// This broker leads at `epoch` (a new leadership, or the same one with a
    /// new ISR): followers are forgotten when the epoch changes; the high
    /// watermark moves to the lowest log end offset known in the ISR.
    pub fn become_leader(
        &mut self,
        epoch: LeaderEpoch,
        replicas: &[i32],
        isr: &[i32],
        log_end_offset: Offset,
    ) -> Option<Offset> {
        self.take_epoch(Some(self.broker_id), epoch);
        self.replicas = replicas.to_vec();
        self.isr = isr.to_vec();
        self.followers.retain(|b, _| replicas.contains(b));
        self.advance(log_end_offset)
    }

    /// Another broker leads (or nobody does, `None`): this broker keeps no
    /// follower progress and takes the high watermark from the leader's answers.
    pub fn become_follower(
        &mut self,
        leader: Option<i32>,
        epoch: LeaderEpoch,
        replicas: &[i32],
        isr: &[i32],
    ) {
        self.take_epoch(leader, epoch);
        self.replicas = replicas.to_vec();
        self.isr = isr.to_vec();
        self.followers.clear();
    }

    fn take_epoch(&mut self, leader: Option<i32>, epoch: LeaderEpoch) {
        assert!(
            epoch >= self.leader_epoch,
            "leader epoch went back from {} to {epoch}",
            self.leader_epoch
        );
        if epoch != self.leader_epoch || leader != self.leader {
            self.followers.clear();
        }
        self.leader_epoch = epoch;
        self.leader = leader;
    }

    /// On the leader: a follower fetched from `offset` (so its log holds every
    /// offset below it). Returns the new high watermark if it moved. Fetches
    /// from a broker that is not a replica are not counted.
    pub fn record_follower_fetch(
        &mut self,
        follower: i32,
        offset: Offset,
        now: Instant,
        log_end_offset: Offset,
    ) -> Option<Offset> {
        if !self.is_leader() || follower == self.broker_id || !self.replicas.contains(&follower) {
            return None;
        }
        let entry = self.followers.entry(follower).or_insert(FollowerState {
            log_end_offset: offset,
            caught_up_at: now,
        });
        entry.log_end_offset = offset;
        if offset >= log_end_offset {
            entry.caught_up_at = now;
        }
        self.advance(log_end_offset)
    }

    /// The log changed (an append, retention, a new remote start): on the
    /// leader the high watermark follows the ISR's lowest log end offset; on any
    /// replica it is at least the log start offset (records below it are gone).
    pub fn on_log_change(
        &mut self,
        log_start_offset: Offset,
        log_end_offset: Offset,
    ) -> Option<Offset> {
        let advanced = if self.is_leader() {
            self.advance(log_end_offset)
        } else {
            None
        };
        self.raise(log_start_offset, log_end_offset).or(advanced)
    }

    /// On a follower: the leader's high watermark, capped at this log's end.
    pub fn follow_high_watermark(
        &mut self,
        leader_hw: Offset,
        log_end_offset: Offset,
    ) -> Option<Offset> {
        self.raise(leader_hw, log_end_offset)
    }

    /// A follower cut its log at `log_end_offset`: the high watermark is capped there.
    pub fn truncate(&mut self, log_end_offset: Offset) {
        self.high_watermark = self.high_watermark.min(log_end_offset);
    }

    /// The ISR the leader should ask the quorum for, or `None` to keep it:
    /// followers in the ISR that have not caught up within `lag_max` leave;
    /// replicas out of it whose log end reached the high watermark (and the
    /// leader epoch's start, `epoch_start`) join if they caught up within
    /// `lag_max` (a dead follower of an idle partition stays at the high
    /// watermark: without that bound its leader asked, every check, for every
    /// such partition, to take it back, and the controller refused each). `became_leader_at` is when this
    /// broker took the current epoch (a follower is not dropped for lag it
    /// could not make up yet).
    pub fn isr_change(
        &self,
        epoch_start: Offset,
        became_leader_at: Instant,
        lag_max: Duration,
        now: Instant,
    ) -> Option<Vec<i32>> {
        if !self.is_leader() {
            return None;
        }
        let mut new: Vec<i32> = Vec::new();
        for &r in &self.replicas {
            let f = self.followers.get(&r);
            let keep = if r == self.broker_id {
                true
            } else if self.isr.contains(&r) {
                let since = f.map_or(became_leader_at, |f| f.caught_up_at.max(became_leader_at));
                now.saturating_duration_since(since) <= lag_max
            } else {
                f.is_some_and(|f| {
                    f.log_end_offset >= self.high_watermark
                        && f.log_end_offset >= epoch_start
                        && now.saturating_duration_since(f.caught_up_at) <= lag_max
                })
            };
            if keep {
                new.push(r);
            }
        }
        new.sort_unstable();
        let mut old = self.isr.clone();
        old.sort_unstable();
        (new != old).then_some(new)
    }

    /// On the leader: the high watermark becomes the lowest log end offset in
    /// the ISR (a follower not heard from in this epoch counts as 0: nothing
    /// moves until every ISR member has fetched).
    fn advance(&mut self, log_end_offset: Offset) -> Option<Offset> {
        debug_assert!(self.is_leader());
        let mut lowest = log_end_offset;
        for b in &self.isr {
            if *b != self.broker_id {
                lowest = lowest.min(
                    self.followers
                        .get(b)
                        .map_or(Offset(0), |f| f.log_end_offset),
                );
            }
        }
        self.raise(lowest, log_end_offset)
    }

    /// Raises the high watermark to `hw` capped at `log_end_offset`; never lowers it.
    fn raise(&mut self, hw: Offset, log_end_offset: Offset) -> Option<Offset> {
        let hw = hw.min(log_end_offset);
        (hw > self.high_watermark).then(|| {
            self.high_watermark = hw;
            hw
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn f(leo: i64, at: Instant) -> FollowerState {
        FollowerState {
            log_end_offset: Offset(leo),
            caught_up_at: at,
        }
    }

    /// Broker 0 leading replicas `replicas` with ISR `isr`, followers as given.
    fn leading(
        replicas: &[i32],
        isr: &[i32],
        followers: &[(i32, FollowerState)],
        hw: i64,
    ) -> ReplicaState {
        let mut s = ReplicaState::sole_leader(0, LeaderEpoch(1), Offset(hw));
        s.replicas = replicas.to_vec();
        s.isr = isr.to_vec();
        s.followers = followers.iter().copied().collect();
        s
    }

    #[test]
    fn lagging_follower_leaves_and_caught_up_follower_rejoins() {
        let t0 = Instant::now();
        let lag = Duration::from_millis(1000);
        let ms = Duration::from_millis;
        let s = leading(&[0, 1, 2], &[0, 1, 2], &[(1, f(10, t0)), (2, f(4, t0))], 4);
        // Within the lag: no change.
        assert_eq!(s.isr_change(Offset(0), t0, lag, t0 + ms(500)), None);
        // Broker 2 has not caught up for longer than the lag: it leaves.
        let s = leading(
            &[0, 1, 2],
            &[0, 1, 2],
            &[(1, f(10, t0 + ms(1400))), (2, f(4, t0))],
            10,
        );
        assert_eq!(
            s.isr_change(Offset(0), t0, lag, t0 + ms(1500)),
            Some(vec![0, 1])
        );
        // It reaches the high watermark: it rejoins.
        let at = t0 + ms(1500);
        let s = leading(&[0, 1, 2], &[0, 1], &[(1, f(10, at)), (2, f(10, at))], 10);
        assert_eq!(s.isr_change(Offset(0), t0, lag, at), Some(vec![0, 1, 2]));
        // ... but not before the leader's epoch start.
        assert_eq!(s.isr_change(Offset(12), t0, lag, at), None);
        // ... and not once it has not caught up for longer than the lag (it
        // stopped fetching: an idle partition's dead follower stays at the
        // high watermark).
        let later = at + ms(1001);
        let s = leading(
            &[0, 1, 2],
            &[0, 1],
            &[(1, f(10, later)), (2, f(10, at))],
            10,
        );
        assert_eq!(s.isr_change(Offset(0), t0, lag, later), None);
        // A follower never heard from in this epoch is given the lag from the
        // moment of the election.
        let s = leading(&[0, 1], &[0, 1], &[], 0);
        assert_eq!(s.isr_change(Offset(0), t0, lag, t0 + ms(900)), None);
        assert_eq!(
            s.isr_change(Offset(0), t0, lag, t0 + ms(1100)),
            Some(vec![0])
        );
        // A follower does not decide ISR changes.
        let mut s = leading(&[0, 1], &[0, 1], &[], 0);
        s.become_follower(Some(1), LeaderEpoch(2), &[0, 1], &[0, 1]);
        assert_eq!(s.isr_change(Offset(0), t0, lag, t0 + ms(5000)), None);
    }

    #[test]
    fn the_high_watermark_waits_for_every_isr_member() {
        let t = Instant::now();
        let mut s = ReplicaState::sole_leader(0, LeaderEpoch(0), Offset(0));
        assert_eq!(
            s.become_leader(LeaderEpoch(1), &[0, 1, 2], &[0, 1, 2], Offset(10)),
            None
        );
        assert_eq!(s.record_follower_fetch(1, Offset(10), t, Offset(10)), None);
        assert_eq!(
            s.record_follower_fetch(2, Offset(7), t, Offset(10)),
            Some(Offset(7))
        );
        assert_eq!(
            s.record_follower_fetch(2, Offset(10), t, Offset(10)),
            Some(Offset(10))
        );
        // An append on the leader alone does not move it.
        assert_eq!(s.on_log_change(Offset(0), Offset(15)), None);
        // A broker that is not a replica is not counted, nor is the leader itself.
        assert_eq!(s.record_follower_fetch(9, Offset(15), t, Offset(15)), None);
        assert_eq!(s.record_follower_fetch(0, Offset(15), t, Offset(15)), None);
        assert!(!s.followers().contains_key(&9));
        // The lagging member leaves the ISR: the watermark moves to the others'.
        assert_eq!(s.record_follower_fetch(1, Offset(15), t, Offset(15)), None);
        assert_eq!(
            s.become_leader(LeaderEpoch(1), &[0, 1, 2], &[0, 1], Offset(15)),
            Some(Offset(15))
        );
        // Alone in the ISR, an append moves it at once.
        assert_eq!(
            s.become_leader(LeaderEpoch(1), &[0, 1, 2], &[0], Offset(15)),
            None
        );
        assert_eq!(s.on_log_change(Offset(0), Offset(20)), Some(Offset(20)));
    }

    #[test]
    fn a_new_epoch_forgets_the_followers_and_a_follower_follows_the_leader() {
        let t = Instant::now();
        let mut s = ReplicaState::sole_leader(0, LeaderEpoch(1), Offset(0));
        s.become_leader(LeaderEpoch(1), &[0, 1], &[0, 1], Offset(5));
        s.record_follower_fetch(1, Offset(5), t, Offset(5));
        assert_eq!(s.high_watermark(), Offset(5));
        s.become_follower(Some(1), LeaderEpoch(2), &[0, 1], &[0, 1]);
        assert!(s.followers().is_empty());
        assert!(!s.is_leader());
        assert_eq!(s.leader(), Some(1));
        // Follower: the leader's watermark, capped at the local log end.
        assert_eq!(
            s.follow_high_watermark(Offset(9), Offset(8)),
            Some(Offset(8))
        );
        assert_eq!(s.follow_high_watermark(Offset(7), Offset(8)), None);
        assert_eq!(s.high_watermark(), Offset(8));
        // Truncation (to the new leader's epoch boundary) caps it.
        s.truncate(Offset(6));
        assert_eq!(s.high_watermark(), Offset(6));
        // Leading again, in a later epoch: nothing is known of broker 1 yet.
        assert_eq!(
            s.become_leader(LeaderEpoch(3), &[0, 1], &[0, 1], Offset(6)),
            None
        );
        assert!(s.followers().is_empty());
    }

    #[test]
    #[should_panic(expected = "leader epoch went back")]
    fn the_leader_epoch_never_goes_back() {
        let mut s = ReplicaState::sole_leader(0, LeaderEpoch(4), Offset(0));
        s.become_follower(Some(1), LeaderEpoch(3), &[0, 1], &[0, 1]);
    }

    /// Random runs of every transition against the replicas' true log end
    /// offsets: the high watermark never goes back, never passes this broker's
    /// log end, and on the leader never passes the lowest true log end offset in
    /// the ISR. Seeds from `RILL_REPLICA_SEED` (one) or 0..300.
    #[test]
    fn seeded_random_transitions_keep_the_high_watermark_safe() {
        let seeds: Vec<u64> = match std::env::var("RILL_REPLICA_SEED") {
            Ok(s) => vec![s.parse().expect("RILL_REPLICA_SEED is a number")],
            Err(_) => (0..300).collect(),
        };
        for seed in seeds {
            random_run(seed);
        }
    }

    fn random_run(seed: u64) {
        const BROKERS: i32 = 4;
        let mut rng = StdRng::seed_from_u64(seed);
        let t0 = Instant::now();
        let mut now = t0;
        let mut became_leader_at = t0;
        // The true log end offset of each broker; broker 0 is `s`.
        let mut leo = [0i64; BROKERS as usize];
        let mut s = ReplicaState::sole_leader(0, LeaderEpoch(0), Offset(0));
        let all: Vec<i32> = (0..BROKERS).collect();
        s.become_leader(LeaderEpoch(0), &all, &all, Offset(0));
        let mut epoch = 0;
        let mut counts = [0usize; 3];
        let mut history: Vec<String> = Vec::new();
        for step in 0..400 {
            let before = s.high_watermark();
            let op = rng.random_range(0..100);
            counts[0] += s.is_leader() as usize;
            counts[1] += !s.is_leader() as usize;
            counts[2] += (s.is_leader() && s.isr().len() > 1) as usize;
            let desc;
            if s.is_leader() {
                match op {
                    0..30 => {
                        leo[0] += rng.random_range(1..5);
                        desc = format!("append -> leo {}", leo[0]);
                        s.on_log_change(Offset(0), Offset(leo[0]));
                    }
                    30..70 => {
                        let b = rng.random_range(1..BROKERS);
                        // A follower copies some of what the leader has.
                        leo[b as usize] =
                            rng.random_range(leo[b as usize]..=leo[0].max(leo[b as usize]));
                        desc = format!("fetch by {b} from {}", leo[b as usize]);
                        s.record_follower_fetch(b, Offset(leo[b as usize]), now, Offset(leo[0]));
                    }
                    70..80 => {
                        now += Duration::from_millis(rng.random_range(0..400));
                        let lag = Duration::from_millis(500);
                        let start = Offset(rng.random_range(0..=leo[0]));
                        match s.isr_change(start, became_leader_at, lag, now) {
                            Some(isr) => {
                                desc = format!("isr change to {isr:?}");
                                let replicas = s.replicas().to_vec();
                                s.set_role(
                                    Some(0),
                                    LeaderEpoch(epoch),
                                    &replicas,
                                    &isr,
                                    Offset(leo[0]),
                                );
                            }
                            None => desc = "isr unchanged".into(),
                        }
                    }
                    80..90 => {
                        // The controller drops ISR members (never the leader).
                        let replicas = s.replicas().to_vec();
                        let isr: Vec<i32> = s
                            .isr()
                            .iter()
                            .copied()
                            .filter(|b| *b == 0 || rng.random_bool(0.7))
                            .collect();
                        desc = format!("controller shrinks isr to {isr:?}");
                        s.set_role(Some(0), LeaderEpoch(epoch), &replicas, &isr, Offset(leo[0]));
                    }
                    _ => {
                        // Leadership moves to an ISR member.
                        let others: Vec<i32> =
                            s.isr().iter().copied().filter(|b| *b != 0).collect();
                        if others.is_empty() {
                            desc = "no other isr member".into();
                        } else {
                            let new = others[rng.random_range(0..others.len())];
                            epoch += 1;
                            let replicas = s.replicas().to_vec();
                            let isr = s.isr().to_vec();
                            desc = format!("leadership to {new} at epoch {epoch}");
                            s.set_role(
                                Some(new),
                                LeaderEpoch(epoch),
                                &replicas,
                                &isr,
                                Offset(leo[0]),
                            );
                        }
                    }
                }
            } else {
                match op {
                    0..50 => {
                        // Copy from the leader, then take its watermark, which is at
                        // most the lowest log end in the ISR.
                        let leader = s.leader().unwrap() as usize;
                        leo[leader] += rng.random_range(0..4);
                        leo[0] = rng.random_range(leo[0]..=leo[leader].max(leo[0]));
                        let lowest = s.isr().iter().map(|b| leo[*b as usize]).min().unwrap();
                        let hw = rng.random_range(0..=lowest);
                        desc = format!("follower fetch: leo {}, leader hw {hw}", leo[0]);
                        s.follow_high_watermark(Offset(hw), Offset(leo[0]));
                    }
                    _ => {
                        // This broker (in the ISR, so holding everything below the
                        // watermark) is elected; the others cut to its log end.
                        epoch += 1;
                        became_leader_at = now;
                        let mut isr: Vec<i32> = vec![0];
                        for b in 1..BROKERS {
                            leo[b as usize] = leo[b as usize].min(leo[0]).max(s.high_watermark().0);
                            if rng.random_bool(0.6) {
                                isr.push(b);
                            }
                        }
                        let replicas: Vec<i32> = (0..BROKERS).collect();
                        desc = format!("elected at epoch {epoch}, isr {isr:?}");
                        s.set_role(Some(0), LeaderEpoch(epoch), &replicas, &isr, Offset(leo[0]));
                    }
                }
            }
            history.push(format!("{step}: {desc} => hw {}", s.high_watermark()));
            let fail = |what: &str| -> ! {
                let tail = history
                    .iter()
                    .rev()
                    .take(12)
                    .rev()
                    .cloned()
                    .collect::<Vec<_>>();
                panic!("seed {seed}: {what}\nlast steps:\n{}", tail.join("\n"))
            };
            let hw = s.high_watermark();
            if hw < before {
                fail(&format!(
                    "the high watermark went back from {before} to {hw}"
                ));
            }
            if hw.0 > leo[0] {
                fail(&format!(
                    "the high watermark {hw} passed this broker's log end {}",
                    leo[0]
                ));
            }
            if s.is_leader() {
                // Were the broker restarted now (SIGKILL: its log stays, nothing
                // in memory does), its watermark must not pass what the ISR
                // holds either (a restarted leader once counted its whole log,
                // unreplicated tail included, as committed).
                let mut restarted = ReplicaState::opened(0, LeaderEpoch(epoch), Offset(0));
                restarted.set_role(
                    Some(0),
                    LeaderEpoch(epoch),
                    s.replicas(),
                    s.isr(),
                    Offset(leo[0]),
                );
                let lowest = s.isr().iter().map(|b| leo[*b as usize]).min().unwrap();
                if restarted.high_watermark().0 > lowest {
                    fail(&format!(
                        "restarted now, the high watermark would be {} past the lowest log end \
                         {lowest} in the ISR {:?}",
                        restarted.high_watermark(),
                        s.isr()
                    ));
                }
            }
            if s.is_leader() && hw > before {
                let lowest = s.isr().iter().map(|b| leo[*b as usize]).min().unwrap();
                if hw.0 > lowest {
                    fail(&format!(
                        "the high watermark {hw} passed the lowest log end {lowest} in the ISR {:?}",
                        s.isr()
                    ));
                }
            }
        }
        // The run went through both roles, and led with followers in the ISR.
        assert!(
            counts.iter().all(|c| *c > 0),
            "seed {seed}: steps {counts:?}"
        );
    }
}
