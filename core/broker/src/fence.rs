//! Self-fencing: a broker that has not been in contact with the cluster's
//! controller for a broker session timeout stops acting as the leader of its
//! partitions.
//!
//! The controller fences a broker whose heartbeats stop for
//! `broker_session_timeout_ms` and elects other leaders for its partitions. A
//! broker cut off from the controller cannot learn of that, so without this it
//! went on answering Produce, Fetch and ListOffsets as the leader it was: a
//! consumer whose metadata came from it waited on it for the length of the cut
//! (its high watermark frozen), and an acks=1 producer wrote records the new
//! leader never had. The broker counts the same timeout from when it *sent*
//! its last answered heartbeat, which is no later than when the controller
//! received it, so it fences itself no later than the controller fences it.
//! Fenced, its partitions answer NOT_LEADER_OR_FOLLOWER, its Metadata names no
//! leader for them (BROKER_NOT_AVAILABLE, so clients ask another broker),
//! FindCoordinator does not name it, and the group and transaction
//! coordinators it hosts stop serving.
//!
//! Contact is a heartbeat answered with "alive" while this broker's own image
//! shows it unfenced: after a cut the controller unfences it only once it
//! heartbeats again, and the image that says so carries the leaders the quorum
//! chose meanwhile, so the fence lifts no earlier than the broker knows them.
//! The controller itself is in contact while a majority of the voters (itself
//! included) heartbeat to it, or since it took over (its election was a
//! majority's vote). With one or two voters nothing is fenced: no leadership
//! can move without this broker, so refusing would only take partitions away.
//!
//! Invariants: [`SelfFence::is_fenced`] is computed from the last contact and
//! the clock on every call (a broker paused and resumed is fenced at once,
//! before any timer runs); [`SelfFence::check`] reports each change once (one
//! log line per fence and per lift) and wakes what waits on
//! [`SelfFence::changed`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Whether a broker last in contact at `last_contact` is fenced at `now`.
pub fn decide(last_contact: Instant, now: Instant, timeout: Duration) -> bool {
    now.saturating_duration_since(last_contact) > timeout
}

/// The broker-wide self-fence, shared by every partition it hosts.
#[derive(Debug)]
pub struct SelfFence {
    /// The state [`SelfFence::check`] last reported.
    reported: AtomicBool,
    /// The last contact, in milliseconds after `origin`.
    last_contact_ms: AtomicU64,
    /// Fenced until the first contact (set by [`SelfFence::await_first_contact`]).
    awaiting_contact: AtomicBool,
    origin: Instant,
    timeout: Duration,
    changed: Notify,
}

impl SelfFence {
    /// A fence with the controller's session timeout, in contact as of now.
    pub fn new(timeout: Duration) -> SelfFence {
        SelfFence {
            reported: AtomicBool::new(false),
            last_contact_ms: AtomicU64::new(0),
            awaiting_contact: AtomicBool::new(false),
            origin: Instant::now(),
            timeout,
            changed: Notify::new(),
        }
    }

    /// Whether this broker is fenced now (one clock read, two atomic loads).
    pub fn is_fenced(&self) -> bool {
        self.awaiting_contact.load(Ordering::Acquire)
            || decide(self.last_contact(), Instant::now(), self.timeout)
    }

    /// A broker restarting into a quorum of three or more voters: its image is
    /// from before it stopped (the quorum may have moved its leaderships
    /// meanwhile), so it leads nothing until its first contact (a heartbeat
    /// answered "alive" once its image caught up with the controller's).
    pub fn await_first_contact(&self) {
        self.awaiting_contact.store(true, Ordering::Release);
    }

    /// Whether the first contact since [`Self::await_first_contact`] is still due.
    pub fn awaits_first_contact(&self) -> bool {
        self.awaiting_contact.load(Ordering::Acquire)
    }

    /// This broker was in contact with the controller at `at`.
    pub fn contact(&self, at: Instant) {
        let ms = at.saturating_duration_since(self.origin).as_millis() as u64;
        self.last_contact_ms.fetch_max(ms, Ordering::AcqRel);
        self.awaiting_contact.store(false, Ordering::Release);
    }

    /// How long before `now` the last contact was.
    pub fn silent_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_contact())
    }

    fn last_contact(&self) -> Instant {
        self.origin + Duration::from_millis(self.last_contact_ms.load(Ordering::Acquire))
    }

    /// Re-decides at `now`; `Some(fenced)` when that differs from the last
    /// report (and then wakes the waiters of [`SelfFence::changed`]).
    pub fn check(&self, now: Instant) -> Option<bool> {
        let fenced = self.awaiting_contact.load(Ordering::Acquire)
            || decide(self.last_contact(), now, self.timeout);
        if self.reported.swap(fenced, Ordering::AcqRel) == fenced {
            return None;
        }
        self.changed.notify_waiters();
        Some(fenced)
    }

    /// Completes at the next reported change (acks=all waiters re-check
    /// their leadership on it).
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    /// The session timeout it counts.
    pub fn timeout(&self) -> Duration {
        self.timeout
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
    fn a_restarted_broker_is_fenced_until_its_first_contact() {
        let f = SelfFence::new(ms(1000));
        let t0 = f.origin;
        f.await_first_contact();
        assert!(f.is_fenced(), "fenced at once, within the session timeout");
        assert_eq!(f.check(t0 + ms(10)), Some(true));
        assert!(f.awaits_first_contact());
        f.contact(t0 + ms(20));
        assert!(!f.awaits_first_contact());
        assert_eq!(f.check(t0 + ms(30)), Some(false));
        assert!(!f.is_fenced());
    }

    #[test]
    fn check_reports_each_change_once_and_contact_lifts_the_fence() {
        let f = SelfFence::new(ms(1000));
        let t0 = f.origin;
        assert_eq!(f.check(t0 + ms(500)), None);
        assert!(!f.is_fenced());
        assert_eq!(f.check(t0 + ms(1200)), Some(true));
        assert_eq!(f.check(t0 + ms(1300)), None, "reported once");
        assert_eq!(f.silent_for(t0 + ms(1300)), ms(1300));
        f.contact(t0 + ms(1400));
        assert_eq!(f.check(t0 + ms(1450)), Some(false));
        // An older contact reported late does not move the last contact back.
        f.contact(t0 + ms(100));
        assert_eq!(f.silent_for(t0 + ms(1450)), ms(50));
    }

    #[test]
    fn is_fenced_reads_the_clock_without_waiting_for_a_check() {
        // A broker resumed after a pause longer than the timeout is fenced at
        // once, before its heartbeat loop runs a check.
        let f = SelfFence::new(ms(20));
        assert!(!f.is_fenced());
        std::thread::sleep(ms(40));
        assert!(f.is_fenced());
        f.contact(Instant::now());
        assert!(!f.is_fenced());
    }

    #[tokio::test]
    async fn a_reported_change_wakes_the_waiters() {
        let f = std::sync::Arc::new(SelfFence::new(ms(10)));
        let waiter = {
            let f = f.clone();
            tokio::spawn(async move { f.changed().await })
        };
        tokio::task::yield_now().await;
        assert_eq!(f.check(Instant::now() + ms(50)), Some(true));
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
    }
}
