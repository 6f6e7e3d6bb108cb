//! Self-fencing: a broker that has not reached the cluster's controller for a
//! broker session timeout stops acting as the leader of its partitions.
//!
//! The controller fences a broker whose heartbeats stop for
//! `broker_session_timeout_ms` and elects other leaders for its partitions. A
//! broker cut off from the controller cannot learn of that, so without this it
//! went on answering Produce, Fetch and ListOffsets as the leader it was: a
//! consumer whose metadata came from it waited on it for the length of the cut
//! (its high watermark frozen), and an acks=1 producer wrote records the new
//! leader never had. Counting the same timeout from its last answered
//! heartbeat, the broker fences itself at about the moment the controller
//! fences it: its partitions answer NOT_LEADER_OR_FOLLOWER, its Metadata names
//! no leader for them (BROKER_NOT_AVAILABLE, so clients ask another broker),
//! and the group and transaction coordinators it hosts stop serving. The first
//! heartbeat answered again lifts it; the image it then receives carries the
//! leaders the quorum chose meanwhile.
//!
//! The controller itself counts as in contact while a majority of the voters
//! (itself included) heartbeat to it; cut off from them, it is deposed by them.
//! A broker alone in its cluster (the only voter) never fences itself.
//!
//! Invariants: the decision is a pure function of the last contact, the time
//! and the timeout ([`decide`]); [`SelfFence::check`] reports each change once,
//! so the broker logs one line per fence and per lift.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Whether a broker last in contact at `last_contact` is fenced at `now`.
pub fn decide(last_contact: Instant, now: Instant, timeout: Duration) -> bool {
    now.saturating_duration_since(last_contact) > timeout
}

/// The broker-wide self-fence, shared by every partition it hosts.
#[derive(Debug)]
pub struct SelfFence {
    fenced: AtomicBool,
    /// The last contact, in milliseconds after `origin`.
    last_contact_ms: AtomicU64,
    origin: Instant,
    timeout: Duration,
}

impl SelfFence {
    /// A fence with the controller's session timeout, in contact as of now.
    pub fn new(timeout: Duration) -> SelfFence {
        SelfFence {
            fenced: AtomicBool::new(false),
            last_contact_ms: AtomicU64::new(0),
            origin: Instant::now(),
            timeout,
        }
    }

    /// Whether this broker has fenced itself (cheap: one atomic load).
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// The controller answered (or, on the controller, a quorum acknowledged
    /// its leadership) at `now`.
    pub fn contact(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.origin).as_millis() as u64;
        self.last_contact_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// How long before `now` the last contact was.
    pub fn silent_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_contact())
    }

    fn last_contact(&self) -> Instant {
        self.origin + Duration::from_millis(self.last_contact_ms.load(Ordering::Acquire))
    }

    /// Re-decides at `now`; `Some(fenced)` when that changed the state.
    pub fn check(&self, now: Instant) -> Option<bool> {
        let fenced = decide(self.last_contact(), now, self.timeout);
        (self.fenced.swap(fenced, Ordering::AcqRel) != fenced).then_some(fenced)
    }

    /// The session timeout it counts.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl Default for SelfFence {
    /// Never fences on its own (a broker outside any cluster, tests).
    fn default() -> SelfFence {
        SelfFence::new(Duration::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn fenced_only_after_the_timeout_without_contact() {
        let t0 = Instant::now();
        assert!(!decide(t0, t0, ms(1500)));
        assert!(!decide(t0, t0 + ms(1500), ms(1500)));
        assert!(decide(t0, t0 + ms(1501), ms(1500)));
        // A clock that went backwards does not fence.
        assert!(!decide(t0 + ms(10), t0, ms(1500)));
    }

    #[test]
    fn check_reports_each_change_once_and_contact_lifts_the_fence() {
        let f = SelfFence::new(ms(1000));
        let t0 = f.origin;
        assert_eq!(f.check(t0 + ms(500)), None);
        assert!(!f.is_fenced());
        assert_eq!(f.check(t0 + ms(1200)), Some(true));
        assert!(f.is_fenced());
        assert_eq!(f.check(t0 + ms(1300)), None, "reported once");
        assert_eq!(f.silent_for(t0 + ms(1300)), ms(1300));
        f.contact(t0 + ms(1400));
        assert_eq!(f.check(t0 + ms(1450)), Some(false));
        assert!(!f.is_fenced());
        // An older contact reported late does not move the last contact back.
        f.contact(t0 + ms(100));
        assert_eq!(f.silent_for(t0 + ms(1450)), ms(50));
    }

    #[test]
    fn the_default_never_fences() {
        let f = SelfFence::default();
        assert_eq!(f.check(Instant::now() + Duration::from_secs(86_400)), None);
        assert!(!f.is_fenced());
    }
}
