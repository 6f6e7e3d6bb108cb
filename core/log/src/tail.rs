//! The newest bytes of a leader's active segment, kept in memory, so that
//! fetches at the end of the log (followers, and consumers keeping up) are
//! answered without reading the file.
//!
//! A leader's append copies what it wrote (the newest [`SEGMENT_TAIL_MAX`]
//! bytes of it) into one buffer of the tail's own, by its position in the
//! segment. A fetch whose range ends inside what is kept takes slices of those
//! buffers (no copy); only a part before what is kept is read from the file.
//! With RF 3, reading the file for the two followers was 9% of the brokers'
//! CPU (the page cache's copy and its bookkeeping, a buffer per read); one
//! copy on append replaces them, but measured only breaks even there, and
//! costs a producer at RF 1 about 10%: it pays where several readers fetch the
//! same tail. So the broker has it off unless `tail_cache_bytes` is set. The
//! copy goes into a pooled buffer ([`crate::read_buffers::copy_of`]); a fresh
//! one costs its page faults. The tail owns its buffers rather than
//! keeping slices of the network buffers the batches arrived in: a slice
//! would keep its whole request buffer alive (a Kafka produce frame, or a
//! QUIC body shared by many partitions), so the bytes counted would not bound
//! the memory held.
//!
//! Invariant: the pieces are contiguous and end at [`Tail::end`], and equal the
//! segment file's bytes there. Every change to the segment other than a kept
//! append resets the tail ([`Tail::reset`]): an append from one buffer
//! (compaction, tests), a truncation, a roll. A tail holds at most
//! [`SEGMENT_TAIL_MAX`] bytes, and all tails together at most the limit
//! [`set_limit`] sets (the broker's `tail_cache_bytes`, 0 by default there;
//! [`TAILS_MAX`] for a log used on its own); past that the oldest pieces of the tail being appended to go
//! first, then the new bytes are not kept. A tail not appended to for
//! [`IDLE_MS`] is emptied by [`Tail::expire`] (the log's `tick`), so idle
//! partitions do not keep the budget from busy ones.

use bytes::Bytes;
use rill_proto::{Rope, TimestampMs};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A tail not appended to for this long is emptied.
pub const IDLE_MS: i64 = 10_000;
/// Bytes one segment's tail keeps at most.
pub const SEGMENT_TAIL_MAX: usize = 8 << 20;
/// Bytes all tails of the process keep together at most, unless
/// [`set_limit`] says otherwise.
pub const TAILS_MAX: usize = 64 << 20;

static HELD: AtomicUsize = AtomicUsize::new(0);
static LIMIT: AtomicUsize = AtomicUsize::new(TAILS_MAX);

/// Sets the bytes all tails of the process keep together at most (a broker's
/// `tail_cache_bytes`; 0 keeps nothing). Tails holding more give the excess
/// back as they are appended to.
pub fn set_limit(bytes: usize) {
    LIMIT.store(bytes, Ordering::Relaxed);
}

/// Bytes all tails hold now.
pub fn held_bytes() -> usize {
    HELD.load(Ordering::Relaxed)
}

/// Takes `n` bytes of the process-wide budget; false (nothing taken) if they do
/// not fit.
fn reserve(n: usize) -> bool {
    let limit = LIMIT.load(Ordering::Relaxed);
    HELD.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
        (held + n <= limit).then_some(held + n)
    })
    .is_ok()
}

#[derive(Debug, Default)]
pub struct Tail {
    /// (position in the segment, bytes), contiguous and ascending.
    pieces: VecDeque<(u64, Bytes)>,
    /// Where the kept bytes end (the segment's size after the last kept append).
    end: u64,
    /// Sum of the pieces' lengths (counted in [`HELD`]).
    held: usize,
    /// When the newest piece was kept.
    last_ms: TimestampMs,
}

impl Tail {
    /// An empty tail of a segment whose file is `end` bytes long.
    pub fn empty_at(end: u64) -> Tail {
        Tail {
            pieces: VecDeque::new(),
            end,
            held: 0,
            last_ms: 0,
        }
    }

    /// Forgets every piece; the segment's file is now `end` bytes long.
    pub fn reset(&mut self, end: u64) {
        self.pieces.clear();
        HELD.fetch_sub(self.held, Ordering::Relaxed);
        self.held = 0;
        self.end = end;
    }

    fn pop_front(&mut self) -> bool {
        match self.pieces.pop_front() {
            Some((_, b)) => {
                self.held -= b.len();
                HELD.fetch_sub(b.len(), Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Empties the tail if nothing was kept for [`IDLE_MS`] (its bytes stay
    /// in the file).
    pub fn expire(&mut self, now_ms: TimestampMs) {
        if !self.pieces.is_empty() && now_ms.saturating_sub(self.last_ms) >= IDLE_MS {
            self.reset(self.end);
        }
    }

    /// `pieces` were written to the segment at position `at`, in order, at
    /// `now_ms`; the tail keeps a copy of (the newest of) them.
    pub fn appended(&mut self, at: u64, pieces: &[&[u8]], now_ms: TimestampMs) {
        let mut pieces = pieces;
        let mut len: usize = pieces.iter().map(|p| p.len()).sum();
        let new_end = at + len as u64;
        if self.pieces.is_empty() {
            self.end = at;
        }
        debug_assert_eq!(at, self.end, "a kept append away from the tail's end");
        if at != self.end {
            self.reset(new_end);
            return;
        }
        if len > SEGMENT_TAIL_MAX {
            // Only the newest pieces that fit; what is kept now starts after
            // a gap, so nothing kept before stays.
            let mut first = 0;
            while len > SEGMENT_TAIL_MAX {
                len -= pieces[first].len();
                first += 1;
            }
            pieces = &pieces[first..];
            self.reset(new_end - len as u64);
        }
        while self.held + len > SEGMENT_TAIL_MAX {
            self.pop_front();
        }
        while !reserve(len) {
            if !self.pop_front() {
                // Other segments' tails hold the budget: keep nothing here.
                self.reset(new_end);
                return;
            }
        }
        if len > 0 {
            // Into a reused buffer: a fresh one would cost its page faults.
            let copy = crate::read_buffers::copy_of(pieces);
            self.pieces.push_back((new_end - len as u64, copy));
        }
        self.held += len;
        self.end = new_end;
        self.last_ms = now_ms;
    }

    /// Where the kept bytes begin (== `end` when nothing is kept).
    pub fn start(&self) -> u64 {
        self.pieces.front().map_or(self.end, |(pos, _)| *pos)
    }

    /// The kept part of the segment's bytes `from..to`: `(position, bytes)`
    /// where the kept bytes cover `position..to` (`position >= from`). `None`
    /// when they do not reach `to` or hold nothing of the range.
    pub fn covering(&self, from: u64, to: u64) -> Option<(u64, Rope)> {
        let start = self.start();
        if to > self.end || to <= start || from >= to {
            return None;
        }
        let begin = from.max(start);
        // The piece holding `begin`: the last one starting at or before it.
        let first = self.pieces.partition_point(|(pos, _)| *pos <= begin) - 1;
        let mut rope = Rope::default();
        for (pos, b) in self.pieces.range(first..) {
            if *pos >= to {
                break;
            }
            let lo = (begin.max(*pos) - pos) as usize;
            let hi = ((to - pos) as usize).min(b.len());
            rope.push(b.slice(lo..hi));
        }
        debug_assert_eq!(rope.len() as u64, to - begin);
        Some((begin, rope))
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        HELD.fetch_sub(self.held, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(from: u8, n: usize) -> Bytes {
        Bytes::from(
            (0..n)
                .map(|i| from.wrapping_add(i as u8))
                .collect::<Vec<_>>(),
        )
    }

    fn joined(r: &Rope) -> Vec<u8> {
        r.to_bytes().to_vec()
    }

    #[test]
    fn covers_the_kept_suffix_of_a_range() {
        let mut t = Tail::empty_at(100);
        t.appended(100, &[&bytes(0, 10), &bytes(10, 20)], 0);
        t.appended(130, &[&bytes(30, 5)], 0);
        assert_eq!((t.start(), t.end), (100, 135));
        let (at, r) = t.covering(100, 135).unwrap();
        assert_eq!(at, 100);
        assert_eq!(joined(&r), (0..35).collect::<Vec<u8>>());
        // Inside pieces at both ends.
        let (at, r) = t.covering(105, 132).unwrap();
        assert_eq!(at, 105);
        assert_eq!(joined(&r), (5..32).collect::<Vec<u8>>());
        // A range starting before what is kept: the kept part.
        let (at, r) = t.covering(40, 112).unwrap();
        assert_eq!(at, 100);
        assert_eq!(joined(&r), (0..12).collect::<Vec<u8>>());
        // Past the end, before the start, empty.
        assert!(t.covering(120, 136).is_none());
        assert!(t.covering(40, 100).is_none());
        assert!(t.covering(110, 110).is_none());
    }

    #[test]
    fn an_append_elsewhere_or_a_reset_forgets_everything() {
        let mut t = Tail::empty_at(0);
        t.appended(0, &[&bytes(0, 10)], 0);
        t.reset(4);
        assert!(t.covering(0, 4).is_none());
        t.appended(4, &[&bytes(4, 6)], 0);
        assert_eq!(
            joined(&t.covering(0, 10).unwrap().1),
            (4..10).collect::<Vec<u8>>()
        );
        assert_eq!(t.held, 6);
    }

    #[test]
    fn the_tail_owns_its_copy_and_forgets_it_when_idle() {
        let mut t = Tail::empty_at(0);
        let input = bytes(7, 100);
        t.appended(0, &[&input[..40], &input[40..]], 1_000);
        let (_, r) = t.covering(0, 100).unwrap();
        let kept = &r.pieces()[0];
        assert_eq!(&kept[..], &input[..]);
        let within = |p: *const u8| {
            let base = input.as_ptr() as usize;
            (base..base + input.len()).contains(&(p as usize))
        };
        assert!(!within(kept.as_ptr()), "a copy, not a slice of the input");
        t.expire(1_000 + IDLE_MS - 1);
        assert_eq!(t.held, 100);
        t.expire(1_000 + IDLE_MS);
        assert_eq!(t.held, 0);
        assert!(t.covering(0, 100).is_none());
        // Appends go on from the same end.
        t.appended(100, &[&bytes(0, 5)], 20_000);
        assert_eq!(t.covering(0, 105).unwrap().0, 100);
    }

    #[test]
    fn a_tail_keeps_at_most_its_bound_dropping_the_oldest() {
        let mut t = Tail::empty_at(0);
        let piece = SEGMENT_TAIL_MAX / 4;
        for i in 0..6u64 {
            t.appended(i * piece as u64, &[&bytes(i as u8, piece)], 0);
        }
        assert_eq!(t.held, SEGMENT_TAIL_MAX);
        assert_eq!(t.start(), 2 * piece as u64);
        assert!(t.covering(0, 6 * piece as u64).unwrap().0 == 2 * piece as u64);
        // Of one append larger than the bound, the newest pieces that fit.
        let at = 6 * piece as u64;
        let (middle, last) = (bytes(1, SEGMENT_TAIL_MAX - 10), bytes(2, 10));
        t.appended(at, &[&bytes(0, piece), &middle, &last], 0);
        assert_eq!(t.held, SEGMENT_TAIL_MAX);
        assert_eq!(t.start(), at + piece as u64);
        let (from, r) = t.covering(0, t.end).unwrap();
        assert_eq!(from, at + piece as u64);
        assert_eq!(r.pieces().len(), 1, "one buffer of the tail's own");
        assert_eq!(joined(&r), [&middle[..], &last[..]].concat());
        // A lone piece larger than the bound: nothing.
        t.appended(t.end, &[&bytes(0, SEGMENT_TAIL_MAX + 1)], 0);
        assert_eq!(t.held, 0);
        assert_eq!(t.start(), t.end);
    }
}
