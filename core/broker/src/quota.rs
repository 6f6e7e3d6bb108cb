//! Byte-rate quotas per principal (Kafka's `producer_byte_rate` and
//! `consumer_byte_rate`): enforced by delaying the response, never by failing
//! it, so a client over its quota slows down to it.
//!
//! Each (principal, direction) has a token bucket holding at most
//! [`BURST`] worth of its rate: a request takes its bytes out (the bucket may
//! go negative), and when the bucket is in debt the response waits until the
//! debt would be paid back at the quota's rate (at most [`THROTTLE_MAX`]).
//! Over any stretch longer than the burst, a principal moves at most its rate
//! plus one burst.
//!
//! Invariants: a principal without a quota, brokers and anonymous callers are
//! never delayed; the rates come from the metadata image, so every broker
//! enforces the same quotas (each on the bytes it serves).

use parking_lot::Mutex;
use rill_proto::wire::Quota;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How much of its rate a quiet principal may send at once.
pub const BURST: Duration = Duration::from_millis(100);
/// The longest one response is delayed.
pub const THROTTLE_MAX: Duration = Duration::from_secs(10);

/// Which quota a request counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    Produce,
    Fetch,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// The buckets of every principal this broker has served under a quota.
#[derive(Debug, Default)]
pub struct Quotas {
    buckets: Mutex<HashMap<(String, Direction), Bucket>>,
}

impl Quotas {
    /// Charges `bytes` to `principal`'s bucket for `direction` under `quota`;
    /// returns how long to delay the response (zero: none).
    pub fn charge(
        &self,
        principal: &str,
        quota: Option<&Quota>,
        direction: Direction,
        bytes: u64,
        now: Instant,
    ) -> Duration {
        let rate = quota.and_then(|q| match direction {
            Direction::Produce => q.produce_bytes_per_s,
            Direction::Fetch => q.fetch_bytes_per_s,
        });
        let mut buckets = self.buckets.lock();
        let Some(rate) = rate.filter(|r| *r > 0).map(|r| r as f64) else {
            buckets.remove(&(principal.to_string(), direction));
            return Duration::ZERO;
        };
        let capacity = rate * BURST.as_secs_f64();
        let bucket = buckets
            .entry((principal.to_string(), direction))
            .or_insert(Bucket {
                tokens: capacity,
                last: now,
            });
        let refill = now.saturating_duration_since(bucket.last).as_secs_f64() * rate;
        bucket.tokens = (bucket.tokens + refill).min(capacity) - bytes as f64;
        bucket.last = now;
        if bucket.tokens >= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(-bucket.tokens / rate).min(THROTTLE_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(produce: u64) -> Quota {
        Quota {
            produce_bytes_per_s: Some(produce),
            fetch_bytes_per_s: None,
        }
    }

    #[test]
    fn a_principal_over_its_rate_is_delayed_to_it() {
        let q = Quotas::default();
        let start = Instant::now();
        let rate = 100_000u64;
        let mut now = start;
        let mut sent = 0u64;
        // A producer that sends 10 KB whenever its last answer arrives.
        while now < start + Duration::from_secs(10) {
            let delay = q.charge("alice", Some(&quota(rate)), Direction::Produce, 10_000, now);
            sent += 10_000;
            now += delay + Duration::from_millis(1);
        }
        let measured = sent as f64 / (now - start).as_secs_f64();
        assert!(
            (measured - rate as f64).abs() / (rate as f64) < 0.05,
            "measured {measured} bytes/s for a quota of {rate}"
        );
    }

    #[test]
    fn no_quota_or_another_direction_is_never_delayed() {
        let q = Quotas::default();
        let now = Instant::now();
        for _ in 0..100 {
            assert_eq!(
                q.charge("bob", None, Direction::Produce, 1 << 20, now),
                Duration::ZERO
            );
            assert_eq!(
                q.charge("alice", Some(&quota(10)), Direction::Fetch, 1 << 20, now),
                Duration::ZERO
            );
        }
        let d = q.charge("alice", Some(&quota(10)), Direction::Produce, 1 << 20, now);
        assert_eq!(d, THROTTLE_MAX);
    }
}
