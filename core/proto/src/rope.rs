//! [`Rope`]: bytes held in pieces, as they arrived off the network, read without
//! joining them.
//!
//! A QUIC stream hands its data over in chunks (one per STREAM frame, each a
//! slice of the decrypted packet), so a 4 MiB fetch response arrives as dozens
//! of pieces. Joining them is a copy of every record byte; a rope keeps them and
//! is sliced and read across piece boundaries instead. Reading copies only what
//! straddles a boundary and must be contiguous (a batch header, a varint, a
//! record split by one).
//!
//! Invariants: no piece is empty; `len` is the sum of the pieces' lengths;
//! `starts[i]` is the offset of piece `i` (so finding a byte is a binary
//! search, not a walk: a 4 MiB response may arrive in thousands of pieces).

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};

use crate::error::DecodeError;

/// Bytes in pieces, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rope {
    pieces: Vec<Bytes>,
    starts: Vec<usize>,
    len: usize,
}

impl Rope {
    /// A rope of `pieces` (empty ones are dropped).
    pub fn new(pieces: impl IntoIterator<Item = Bytes>) -> Rope {
        let mut rope = Rope::default();
        for piece in pieces {
            rope.push(piece);
        }
        rope
    }

    /// Appends `piece` (nothing if it is empty).
    pub fn push(&mut self, piece: Bytes) {
        if !piece.is_empty() {
            self.starts.push(self.len);
            self.len += piece.len();
            self.pieces.push(piece);
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces, in order.
    pub fn pieces(&self) -> &[Bytes] {
        &self.pieces
    }

    /// The bytes as one `Bytes`: the piece itself if there is one, else a copy.
    pub fn to_bytes(&self) -> Bytes {
        match self.pieces.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => {
                let mut joined = BytesMut::with_capacity(self.len);
                for piece in many {
                    joined.extend_from_slice(piece);
                }
                joined.freeze()
            }
        }
    }

    /// The piece and position within it of byte `at` (`at < len`; `len` gives
    /// one past the last piece).
    fn locate(&self, at: usize) -> (usize, usize) {
        if at >= self.len {
            return (self.pieces.len(), 0);
        }
        let i = self.starts.partition_point(|start| *start <= at) - 1;
        (i, at - self.starts[i])
    }

    /// The parts of the pieces that hold bytes `start..end`, in order, as
    /// (piece, range within it); none is empty.
    ///
    /// Panics if the range is out of bounds, like slicing.
    fn parts(
        &self,
        start: usize,
        end: usize,
    ) -> impl Iterator<Item = (&Bytes, std::ops::Range<usize>)> + '_ {
        assert!(
            start <= end && end <= self.len,
            "rope range {start}..{end} out of 0..{}",
            self.len
        );
        let (first, pos) = self.locate(start);
        let mut left = end - start;
        self.pieces[first..]
            .iter()
            .enumerate()
            .map_while(move |(k, piece)| {
                if left == 0 {
                    return None;
                }
                let from = if k == 0 { pos } else { 0 };
                let take = (piece.len() - from).min(left);
                left -= take;
                Some((piece, from..from + take))
            })
    }

    /// Bytes `start..end` as a rope of slices of the pieces (no copy).
    ///
    /// Panics if the range is out of bounds, like slicing.
    pub fn slice(&self, start: usize, end: usize) -> Rope {
        Rope::new(
            self.parts(start, end)
                .map(|(piece, range)| piece.slice(range)),
        )
    }

    /// Copies `out.len()` bytes starting at `at` into `out`; `false` (and `out`
    /// untouched) if the rope is shorter.
    pub fn copy_to(&self, at: usize, out: &mut [u8]) -> bool {
        if at + out.len() > self.len {
            return false;
        }
        let mut done = 0;
        for (piece, range) in self.parts(at, at + out.len()) {
            out[done..done + range.len()].copy_from_slice(&piece[range.clone()]);
            done += range.len();
        }
        true
    }

    /// CRC32C of bytes `start..end`, across pieces.
    ///
    /// Panics if the range is out of bounds, like slicing.
    pub fn crc32c_range(&self, start: usize, end: usize) -> u32 {
        self.parts(start, end).fold(0, |crc, (piece, range)| {
            crate::crc::crc32c_append(crc, &piece[range])
        })
    }

    /// Bytes `start..end` as slices of the pieces, in order (no copy, no
    /// allocation): what a vectored write of that range takes.
    ///
    /// Panics if the range is out of bounds, like slicing.
    pub fn slices(&self, start: usize, end: usize) -> impl Iterator<Item = &[u8]> + '_ {
        self.parts(start, end).map(|(piece, range)| &piece[range])
    }

    /// Splits the rope into consecutive parts of `lengths` bytes (a fetch
    /// response's per-partition data), without copying; an error names the
    /// shortfall or the bytes left over.
    pub fn split(&self, lengths: impl IntoIterator<Item = u32>) -> Result<Vec<Rope>, DecodeError> {
        let mut out = Vec::new();
        let mut at = 0usize;
        for len in lengths {
            let end = at
                .checked_add(len as usize)
                .filter(|e| *e <= self.len)
                .ok_or(DecodeError::Truncated {
                    field: "partition bytes in payload",
                    needed: at.saturating_add(len as usize),
                    available: self.len,
                })?;
            out.push(self.slice(at, end));
            at = end;
        }
        if at != self.len {
            return Err(DecodeError::TrailingBytes {
                field: "payload",
                count: self.len - at,
            });
        }
        Ok(out)
    }
}

impl From<Bytes> for Rope {
    fn from(bytes: Bytes) -> Rope {
        Rope::new([bytes])
    }
}

/// Reads a rope front to back, handing out what lies inside one piece as a
/// slice of it and copying only what straddles pieces.
///
/// The rest of the current piece is kept as a slice, so reading inside a
/// piece (almost every record) costs what reading a `&[u8]` does.
#[derive(Debug)]
pub struct RopeReader<'a> {
    rope: &'a Rope,
    /// Current piece, and what is left of it (empty only at the end).
    piece: usize,
    cur: &'a [u8],
    /// Bytes after the current piece.
    after: usize,
}

impl<'a> RopeReader<'a> {
    pub fn new(rope: &'a Rope) -> RopeReader<'a> {
        let cur = rope.pieces.first().map_or(&[][..], |p| &p[..]);
        RopeReader {
            rope,
            piece: 0,
            cur,
            after: rope.len - cur.len(),
        }
    }

    /// Bytes not yet read.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.cur.len() + self.after
    }

    /// The rest of the current piece (empty at the end).
    #[inline]
    pub fn current(&self) -> &'a [u8] {
        self.cur
    }

    /// Copies the next `out.len()` bytes into `out` without consuming them;
    /// `false` if fewer remain.
    pub fn copy_into(&self, out: &mut [u8]) -> bool {
        self.rope.copy_to(self.rope.len - self.remaining(), out)
    }

    /// Skips `n` bytes (at most what remains).
    #[inline]
    pub fn advance(&mut self, mut n: usize) {
        if n < self.cur.len() {
            self.cur = &self.cur[n..];
            return;
        }
        n = n.min(self.remaining());
        while n >= self.cur.len() && self.after > 0 {
            n -= self.cur.len();
            self.piece += 1;
            self.cur = &self.rope.pieces[self.piece][..];
            self.after -= self.cur.len();
        }
        self.cur = &self.cur[n.min(self.cur.len())..];
    }

    /// Reads a varint (zigzag, as record framing uses), copying it first if it
    /// may straddle pieces.
    #[inline]
    pub fn read_varint(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        // A varint is at most 5 bytes.
        let mut head = [0u8; 5];
        let mut peek: &[u8] = if self.cur.len() >= head.len() {
            self.cur
        } else {
            let n = self.remaining().min(head.len());
            self.copy_into(&mut head[..n]);
            &head[..n]
        };
        let before = peek.len();
        let value = crate::varint::read_varint(&mut peek, field)?;
        self.advance(before - peek.len());
        Ok(value)
    }

    /// The next `n` bytes as (`source`, range in it): the rope's own piece
    /// (borrowed, so taking costs no reference count) when they lie inside one,
    /// else a new buffer holding a copy. `None` if fewer than `n` remain.
    pub fn take(&mut self, n: usize) -> Option<(Cow<'a, Bytes>, std::ops::Range<usize>)> {
        if n > self.remaining() {
            return None;
        }
        if n == 0 {
            return Some((Cow::Owned(Bytes::new()), 0..0));
        }
        let rope: &'a Rope = self.rope;
        let taken = if self.cur.len() >= n {
            let piece = &rope.pieces[self.piece];
            let pos = piece.len() - self.cur.len();
            (Cow::Borrowed(piece), pos..pos + n)
        } else {
            let mut copy = vec![0u8; n];
            self.copy_into(&mut copy);
            (Cow::Owned(Bytes::from(copy)), 0..n)
        };
        self.advance(n);
        Some(taken)
    }

    /// Hands the next `n` bytes (`n <= remaining`) to `f` as one slice: in
    /// place inside a piece, else from a copy.
    #[inline]
    pub fn with_next<R>(&mut self, n: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        assert!(n <= self.remaining(), "{n} bytes past the rope's end");
        if self.cur.len() >= n {
            let (head, rest) = self.cur.split_at(n);
            let out = f(head);
            if rest.is_empty() {
                self.advance(n);
            } else {
                self.cur = rest;
            }
            out
        } else {
            self.with_copy(n, f)
        }
    }

    /// [`RopeReader::with_next`] of bytes that straddle pieces.
    #[cold]
    #[inline(never)]
    fn with_copy<R>(&mut self, n: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        let mut copy = vec![0u8; n];
        self.copy_into(&mut copy);
        self.advance(n);
        f(&copy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope_of(parts: &[&[u8]]) -> Rope {
        Rope::new(parts.iter().map(|p| Bytes::copy_from_slice(p)))
    }

    #[test]
    fn slices_copies_and_crcs_agree_with_the_joined_bytes() {
        let whole: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        // Cut at uneven places, with an empty piece that is dropped.
        let cuts = [0, 1, 7, 7, 300, 301, 999, 1000];
        let rope = Rope::new(
            cuts.windows(2)
                .map(|w| Bytes::copy_from_slice(&whole[w[0]..w[1]])),
        );
        assert_eq!(rope.len(), 1000);
        assert_eq!(rope.pieces().len(), 6);
        assert_eq!(&rope.to_bytes()[..], &whole[..]);
        for (s, e) in [(0, 0), (0, 1000), (5, 9), (6, 301), (300, 301), (998, 1000)] {
            assert_eq!(&rope.slice(s, e).to_bytes()[..], &whole[s..e], "{s}..{e}");
            let mut out = vec![0; e - s];
            assert!(rope.copy_to(s, &mut out));
            assert_eq!(out, &whole[s..e]);
            assert_eq!(rope.slices(s, e).collect::<Vec<_>>().concat(), &whole[s..e]);
            assert!(rope.slices(s, e).all(|piece| !piece.is_empty()));
            assert_eq!(rope.crc32c_range(s, e), crate::crc::crc32c(&whole[s..e]));
        }
        assert!(!rope.copy_to(999, &mut [0; 2]));
        for start in [0, 1, 6, 7, 500, 999, 1000] {
            assert_eq!(
                rope.crc32c_range(start, 1000),
                crate::crc::crc32c(&whole[start..])
            );
        }
    }

    #[test]
    fn a_reader_slices_inside_a_piece_and_copies_across_pieces() {
        let rope = rope_of(&[b"abc", b"defgh", b"i"]);
        let mut r = RopeReader::new(&rope);
        let (src, range) = r.take(2).unwrap();
        assert_eq!(&src[range], b"ab");
        assert_eq!(src.len(), 3, "a slice of the first piece, not a copy");
        let (src, range) = r.take(3).unwrap();
        assert_eq!(&src[range.clone()], b"cde");
        assert_eq!((src.len(), range), (3, 0..3), "a copy across pieces");
        assert_eq!(r.current(), b"fgh");
        r.advance(3);
        assert_eq!(r.remaining(), 1);
        assert!(r.take(2).is_none());
        assert_eq!(&r.take(1).map(|(s, x)| s.slice(x)).unwrap()[..], b"i");
        assert_eq!(r.remaining(), 0);
        assert!(r.current().is_empty());
    }

    #[test]
    fn split_names_a_short_or_long_payload() {
        let rope = rope_of(&[b"abcd", b"efg"]);
        let parts = rope.split([3, 2, 2]).unwrap();
        let joined: Vec<_> = parts.iter().map(|p| p.to_bytes()).collect();
        assert_eq!(joined, [&b"abc"[..], b"de", b"fg"]);
        assert!(matches!(
            rope.split([3, 2]),
            Err(DecodeError::TrailingBytes { count: 2, .. })
        ));
        assert!(matches!(
            rope.split([3, 9]),
            Err(DecodeError::Truncated { needed: 12, .. })
        ));
    }
}
