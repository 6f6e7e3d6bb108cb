//! Domain newtypes shared by every crate: offsets, leader epochs, producer identity.
//!
//! Offsets, epochs and positions are never `usize`: they are fixed-width on disk and
//! on the wire (i64 / i32, big-endian in the batch format), and wrapping them in
//! newtypes stops an offset being passed where a byte position was meant.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The position of a record in a partition's log. Strictly increasing within a partition.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Offset(pub i64);

impl Offset {
    pub const ZERO: Offset = Offset(0);

    /// The offset `n` records after this one.
    pub fn plus(self, n: i64) -> Offset {
        Offset(self.0 + n)
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A number the controller bumps at every leadership change of a partition.
/// Batches carry the epoch of the leader that wrote them. Never goes back.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct LeaderEpoch(pub i32);

impl fmt::Display for LeaderEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Producer identity for idempotent producers (-1 means "not idempotent").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProducerId(pub i64);

impl ProducerId {
    pub const NONE: ProducerId = ProducerId(-1);
}

/// Milliseconds since the Unix epoch.
pub type TimestampMs = i64;

/// The current wall-clock time in milliseconds since the Unix epoch.
/// Only for the async shells and clients; state machines take `now` as input.
///
/// Read with one `clock_gettime(CLOCK_REALTIME)` and turned into milliseconds
/// directly: a producer calls this for every record, and `SystemTime`'s
/// checked subtraction and `Duration` conversion cost a third as much again as
/// the clock read itself. Before the epoch it is 0, as before.
pub fn now_ms() -> TimestampMs {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    (t.tv_sec * 1000 + t.tv_nsec / 1_000_000).max(0)
}

#[cfg(test)]
mod clock_tests {
    use super::now_ms;

    #[test]
    fn now_ms_is_the_wall_clock_in_milliseconds() {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let now = now_ms();
        let after = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!(
            before <= now && now <= after,
            "{before} <= {now} <= {after}"
        );
    }
}
