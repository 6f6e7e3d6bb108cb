//! The controller's view of broker sessions (in memory, as in KRaft), and its
//! fencing decisions as a pure function of that view, the image and a time.
//!
//! Brokers heartbeat to the controller every `broker_heartbeat_interval_ms`.
//! [`Sessions::decide`] (called each interval on the controller) fences a broker
//! whose session lapsed (`broker_session_timeout_ms` without a heartbeat) and
//! unfences a fenced broker that heartbeats again. No clock is read here: every
//! method takes `now`.
//!
//! Invariants:
//! - A new controller counts every session from the moment it took over (the
//!   heartbeats went to the old one), except the old controller itself: it lost
//!   the quorum after an election timeout of silence, so it is fenced after a
//!   short grace (one heartbeat interval; every broker heartbeats to a new
//!   controller as soon as it learns of it) unless it heartbeats first.
//! - Only a broker heard from since this controller took over is unfenced.
//! - The controller never fences itself.
//! - A heartbeat is contact only if this process was running when it came:
//!   after a stall (the process paused, or starved, for longer than
//!   [`STALL`], seen as a gap between two looks at the clock, see
//!   [`Sessions::observe`]) heartbeats handled within a quarantine (one
//!   heartbeat interval) do not count, because they may have waited in the
//!   socket through the stall. Otherwise a controller resumed after a pause
//!   would take heartbeats its peers sent before they elected another
//!   controller as fresh contact with a majority, lift its self-fence and
//!   serve from its stale image (the network-fault soak saw it answer a
//!   group's committed offsets from before the pause).

use super::image::{Command, MetadataImage};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Session timing, from the broker config.
#[derive(Debug, Clone, Copy)]
pub struct SessionTimes {
    pub session_timeout: Duration,
    pub heartbeat_interval: Duration,
}

/// A gap longer than this between two looks at the clock (the controller
/// loop looks every 50 ms; heartbeats come every interval) means the process
/// did not run in between.
pub const STALL: Duration = Duration::from_millis(500);

/// The controller's view of broker sessions.
#[derive(Debug, Default)]
pub struct Sessions {
    /// The last time this process was seen running ([`Self::observe`]).
    last_alive: Option<Instant>,
    /// Heartbeats handled before this do not count (after a stall).
    quarantine_until: Option<Instant>,
    /// When this broker became controller (every session counts from then).
    since: Option<Instant>,
    /// Heartbeats received since `since`.
    last_seen: HashMap<i32, Instant>,
    /// The controller this broker last knew of while it was not the controller.
    previous_controller: Option<i32>,
    /// The last time this broker was seen not to be the controller.
    not_controller_at: Option<Instant>,
    /// The previous controller, fenced at this instant unless it heartbeats first.
    suspect: Option<(i32, Instant)>,
}

impl Sessions {
    /// A heartbeat from `broker` reached this controller (not counted in a
    /// quarantine after a stall: call [`Self::observe`] first).
    pub fn heartbeat(&mut self, broker: i32, now: Instant) {
        if !self.quarantine_until.is_some_and(|q| now < q) {
            self.last_seen.insert(broker, now);
        }
    }

    /// The process is running at `now` (the controller loop calls this on
    /// every look, and every heartbeat does): a gap of more than [`STALL`]
    /// since the last call starts a quarantine of one heartbeat interval.
    /// Whether `now` is outside any quarantine.
    pub fn observe(&mut self, now: Instant, times: SessionTimes) -> bool {
        if self
            .last_alive
            .is_some_and(|last| now.saturating_duration_since(last) > STALL)
        {
            self.quarantine_until = Some(now + times.heartbeat_interval);
        }
        self.last_alive = Some(self.last_alive.map_or(now, |l| l.max(now)));
        !self.quarantine_until.is_some_and(|q| now < q)
    }

    /// This broker is not the controller at `now`; `controller` is the one it
    /// knows of. Its view is dropped, to start afresh if it becomes the
    /// controller.
    pub fn not_controller(&mut self, controller: Option<i32>, now: Instant) {
        self.since = None;
        self.not_controller_at = Some(now);
        if controller.is_some() {
            self.previous_controller = controller;
        }
    }

    /// Whether `decide` would treat the next call as a new controllership.
    pub fn is_new(&self) -> bool {
        self.since.is_none()
    }

    /// On the controller `me`: the latest time by which a majority of `voters`
    /// (itself included) had been heard from, `now` when it alone is one, and
    /// never before this controllership began (winning the election was a
    /// majority's vote); `None` while neither is known. A controller cut off
    /// from the other voters stops hearing from them, and this stays behind
    /// (its self-fence counts from it; Raft's own view of the quorum is not
    /// re-reported while nothing answers).
    pub fn quorum_contact(&self, me: i32, voters: &[i32], now: Instant) -> Option<Instant> {
        let majority = voters.len() / 2 + 1;
        let others_needed = majority - usize::from(voters.contains(&me));
        if others_needed == 0 {
            return Some(now);
        }
        let mut heard: Vec<Instant> = voters
            .iter()
            .filter(|v| **v != me)
            .filter_map(|v| self.last_seen.get(v).copied())
            .collect();
        heard.sort_unstable_by(|a, b| b.cmp(a));
        heard.get(others_needed - 1).copied().max(self.since)
    }

    /// On the controller `me`: the session changes to commit now.
    pub fn decide(
        &mut self,
        me: i32,
        now: Instant,
        image: &MetadataImage,
        times: SessionTimes,
    ) -> Vec<Command> {
        if self.since.is_none() {
            self.since = Some(now);
            // Heartbeats from an earlier controllership go; those that came
            // since this one began (brokers heartbeat to a new controller at
            // once, often before this first look) stay.
            let from = self.not_controller_at;
            self.last_seen.retain(|_, at| from.is_none_or(|f| *at >= f));
            // Brokers heartbeat to a new controller as soon as they learn of it
            // (a Raft heartbeat, every 100 ms), so a live old controller is
            // heard from well within one interval.
            let grace = times.heartbeat_interval;
            self.suspect = self
                .previous_controller
                .filter(|p| *p != me)
                .map(|p| (p, now + grace));
        }
        let since = self.since.expect("set above");
        self.last_seen.insert(me, now);
        image
            .brokers
            .values()
            .filter_map(|b| {
                let seen = self.last_seen.get(&b.id).copied();
                let lapsed = match (seen, self.suspect) {
                    (None, Some((id, at))) if id == b.id => now >= at,
                    (seen, _) => {
                        now.saturating_duration_since(seen.unwrap_or(since)) > times.session_timeout
                    }
                };
                match (b.fenced, lapsed) {
                    (false, true) => Some(Command::FenceBroker { id: b.id }),
                    (true, false) if self.last_seen.contains_key(&b.id) => {
                        Some(Command::UnfenceBroker { id: b.id })
                    }
                    _ => None,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::image::BrokerRecord;

    const TIMES: SessionTimes = SessionTimes {
        session_timeout: Duration::from_millis(1500),
        heartbeat_interval: Duration::from_millis(100),
    };

    fn image(brokers: &[(i32, bool)]) -> MetadataImage {
        let mut image = MetadataImage::default();
        for &(id, fenced) in brokers {
            image.brokers.insert(
                id,
                BrokerRecord {
                    id,
                    addr: format!("127.0.0.1:{}", 9092 + id),
                    fenced,
                    listeners: Default::default(),
                },
            );
        }
        image
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn a_lapsed_session_is_fenced_and_a_heartbeat_unfences_it() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        let live = image(&[(0, false), (1, false), (2, false)]);
        // A new controller gives everybody a whole session from now.
        assert!(s.decide(0, t0, &live, TIMES).is_empty());
        s.heartbeat(1, t0 + ms(1000));
        assert!(s.decide(0, t0 + ms(1500), &live, TIMES).is_empty());
        // Broker 2 never heartbeat: fenced once the session has passed; broker 1
        // heartbeat 600 ms ago: kept. The controller never fences itself.
        assert_eq!(
            s.decide(0, t0 + ms(1600), &live, TIMES),
            vec![Command::FenceBroker { id: 2 }]
        );
        // Once fenced (committed), it stays fenced until it heartbeats.
        let fenced = image(&[(0, false), (1, false), (2, true)]);
        s.heartbeat(1, t0 + ms(1600));
        assert!(s.decide(0, t0 + ms(1700), &fenced, TIMES).is_empty());
        s.heartbeat(2, t0 + ms(1750));
        assert_eq!(
            s.decide(0, t0 + ms(1800), &fenced, TIMES),
            vec![Command::UnfenceBroker { id: 2 }]
        );
        // Broker 1 stops: fenced one session after its last heartbeat.
        let unfenced = image(&[(0, false), (1, false), (2, false)]);
        s.heartbeat(2, t0 + ms(3000));
        assert!(s.decide(0, t0 + ms(3100), &unfenced, TIMES).is_empty());
        assert_eq!(
            s.decide(0, t0 + ms(3101), &unfenced, TIMES),
            vec![Command::FenceBroker { id: 1 }]
        );
    }

    #[test]
    fn the_old_controller_is_fenced_after_a_short_grace_unless_it_heartbeats() {
        let t0 = Instant::now();
        let live = image(&[(0, false), (1, false), (2, false)]);
        let mut s = Sessions::default();
        s.not_controller(Some(1), t0);
        assert!(s.is_new());
        assert!(s.decide(0, t0, &live, TIMES).is_empty());
        // Broker 2 gets a whole session; the old controller 1 only the grace.
        assert!(s.decide(0, t0 + ms(99), &live, TIMES).is_empty());
        assert_eq!(
            s.decide(0, t0 + ms(100), &live, TIMES),
            vec![Command::FenceBroker { id: 1 }]
        );

        // The same, but the old controller is alive and heartbeats in time.
        let mut s = Sessions::default();
        s.not_controller(Some(1), t0);
        assert!(s.decide(0, t0, &live, TIMES).is_empty());
        s.heartbeat(1, t0 + ms(60));
        assert!(s.decide(0, t0 + ms(100), &live, TIMES).is_empty());
        // From then on it has a whole session, counted from its heartbeat.
        assert_eq!(
            s.decide(0, t0 + ms(1560), &live, TIMES),
            vec![Command::FenceBroker { id: 2 }]
        );
        assert_eq!(
            s.decide(0, t0 + ms(1561), &live, TIMES),
            vec![
                Command::FenceBroker { id: 1 },
                Command::FenceBroker { id: 2 }
            ]
        );
    }

    #[test]
    fn quorum_contact_is_when_a_majority_was_last_heard_from() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        // Alone, or one of two voters with no heartbeat: a majority by itself only when alone.
        assert_eq!(s.quorum_contact(0, &[0], t0), Some(t0));
        assert_eq!(s.quorum_contact(0, &[0, 1, 2], t0), None);
        s.heartbeat(1, t0 + ms(100));
        s.heartbeat(2, t0 + ms(300));
        // Three voters: one other suffices, the latest counts.
        assert_eq!(
            s.quorum_contact(0, &[0, 1, 2], t0 + ms(400)),
            Some(t0 + ms(300))
        );
        // Five voters: two others are needed, so the second latest counts.
        s.heartbeat(3, t0 + ms(200));
        assert_eq!(
            s.quorum_contact(0, &[0, 1, 2, 3, 4], t0 + ms(400)),
            Some(t0 + ms(200))
        );
        // Its own heartbeat does not count towards the others.
        s.heartbeat(0, t0 + ms(500));
        assert_eq!(
            s.quorum_contact(0, &[0, 1, 2], t0 + ms(500)),
            Some(t0 + ms(300))
        );
        // From its takeover on, the controllership itself is contact.
        let image = image(&[(0, false), (1, false), (2, false)]);
        s.decide(0, t0 + ms(600), &image, TIMES);
        assert_eq!(
            s.quorum_contact(0, &[0, 1, 2], t0 + ms(700)),
            Some(t0 + ms(600))
        );
        s.heartbeat(1, t0 + ms(650));
        assert_eq!(
            s.quorum_contact(0, &[0, 1, 2], t0 + ms(700)),
            Some(t0 + ms(650))
        );
    }

    /// Brokers heartbeat to a new controller as soon as Raft tells them of
    /// it, often before the controller's first look: that heartbeat counts
    /// (the old controller's grace is one interval, so losing it would fence
    /// a live old controller).
    #[test]
    fn a_heartbeat_before_the_new_controllers_first_look_counts() {
        let t0 = Instant::now();
        let live = image(&[(0, false), (1, false), (2, false)]);
        let mut s = Sessions::default();
        // Broker 0 saw broker 1 as the controller at t0; it won the election
        // since, and broker 1 (alive) heartbeated to it at t0 + 5.
        s.not_controller(Some(1), t0);
        s.heartbeat(1, t0 + ms(5));
        assert!(s.decide(0, t0 + ms(40), &live, TIMES).is_empty());
        // Past the grace, broker 1 is not fenced: it was heard from.
        assert!(s.decide(0, t0 + ms(200), &live, TIMES).is_empty());
        // A heartbeat from before this broker last saw another controller
        // does not count: that one is fenced after the grace.
        let mut s = Sessions::default();
        s.heartbeat(1, t0);
        s.not_controller(Some(1), t0 + ms(1));
        assert!(s.decide(0, t0 + ms(40), &live, TIMES).is_empty());
        assert_eq!(
            s.decide(0, t0 + ms(140), &live, TIMES),
            vec![Command::FenceBroker { id: 1 }]
        );
    }

    #[test]
    fn losing_and_regaining_the_controllership_starts_the_sessions_afresh() {
        let t0 = Instant::now();
        let live = image(&[(0, false), (1, false)]);
        let mut s = Sessions::default();
        assert!(s.decide(0, t0, &live, TIMES).is_empty());
        s.heartbeat(1, t0 + ms(10));
        // Another broker took over for a while; then this one again, late.
        s.not_controller(Some(1), t0 + ms(20));
        // Broker 1 was the controller meanwhile: it gets the grace, counted from now.
        let back = t0 + ms(10_000);
        assert!(s.decide(0, back, &live, TIMES).is_empty());
        assert_eq!(
            s.decide(0, back + ms(100), &live, TIMES),
            vec![Command::FenceBroker { id: 1 }]
        );
        // A fenced broker not heard from since the takeover is not unfenced.
        let fenced = image(&[(0, false), (1, true)]);
        let mut s = Sessions::default();
        assert!(s.decide(0, t0, &fenced, TIMES).is_empty());
        s.heartbeat(1, t0 + ms(50));
        assert_eq!(
            s.decide(0, t0 + ms(100), &fenced, TIMES),
            vec![Command::UnfenceBroker { id: 1 }]
        );
    }

    #[test]
    fn heartbeats_handled_right_after_a_stall_are_not_contact() {
        let t0 = Instant::now();
        let ms = |n| Duration::from_millis(n);
        let mut s = Sessions::default();
        let image = image(&[(0, false), (1, false), (2, false)]);
        // Controller 0 looks every 50 ms and hears from 1 and 2.
        for k in 0..10u64 {
            assert!(s.observe(t0 + ms(50 * k), TIMES));
        }
        s.decide(0, t0, &image, TIMES);
        s.heartbeat(1, t0 + ms(400));
        s.heartbeat(2, t0 + ms(420));
        assert_eq!(
            s.quorum_contact(0, &[0, 1, 2], t0 + ms(450)),
            Some(t0 + ms(420))
        );
        // Paused for 10 s: heartbeats sent before the pause are handled on
        // resume, before or after the loop's first look: neither counts.
        let resumed = t0 + ms(10_450);
        assert!(!s.observe(resumed, TIMES));
        s.heartbeat(1, resumed + ms(1));
        s.heartbeat(2, resumed + ms(2));
        assert_eq!(
            s.quorum_contact(0, &[0, 1, 2], resumed + ms(3)),
            Some(t0 + ms(420)),
            "contact stays where it was before the pause"
        );
        // After the quarantine (one heartbeat interval), heartbeats count again.
        assert!(!s.observe(resumed + ms(50), TIMES));
        assert!(s.observe(resumed + ms(100), TIMES));
        assert!(s.observe(resumed + ms(150), TIMES));
        s.heartbeat(1, resumed + ms(150));
        assert_eq!(
            s.quorum_contact(0, &[0, 1, 2], resumed + ms(160)),
            Some(resumed + ms(150))
        );
    }
}
