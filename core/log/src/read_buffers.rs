//! Buffers for reading file slices, kept for reuse.
//!
//! A fetch reads up to several MiB of one segment per partition into memory
//! and hands the bytes to the network, which holds them until the peer has
//! them. A new buffer for every read costs more than the read itself: zeroing
//! it (`vec![0; n]`, 8.5% of a broker's CPU while serving 1 KB consumers), or,
//! for a buffer the allocator maps fresh, a page fault and the kernel's
//! clearing of every page (5% of three brokers' CPU replicating with RF 3).
//! So reads of [`POOLED_MIN`]..=[`POOLED_MAX`] bytes go into a buffer from a
//! pool of power-of-two sizes, zeroed once when first made; the `Bytes` handed
//! out gives it back to the pool when the last clone of it is dropped. The
//! pool keeps at most [`KEEP_BYTES`]; buffers beyond that are freed.

use bytes::Bytes;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Reads shorter than this get a buffer of their own (zeroing it costs little).
pub const POOLED_MIN: usize = 64 << 10;
/// Reads longer than this get a buffer of their own (rare: a fetch's bound).
pub const POOLED_MAX: usize = 16 << 20;
/// Bytes of idle buffers the pool keeps, all sizes together.
pub const KEEP_BYTES: usize = 64 << 20;

const CLASSES: usize = (POOLED_MAX.trailing_zeros() - POOLED_MIN.trailing_zeros() + 1) as usize;

struct Pool {
    /// Idle buffers by size class: class `c` holds buffers of `POOLED_MIN << c`
    /// bytes, each fully initialised.
    idle: [Mutex<Vec<Vec<u8>>>; CLASSES],
    /// Bytes held in `idle`.
    kept: AtomicUsize,
}

static POOL: Pool = Pool::new();

/// The size class of a read of `len` bytes (POOLED_MIN..=POOLED_MAX).
fn class_of(len: usize) -> usize {
    (len.next_power_of_two().trailing_zeros() - POOLED_MIN.trailing_zeros()) as usize
}

impl Pool {
    const fn new() -> Pool {
        Pool {
            idle: [const { Mutex::new(Vec::new()) }; CLASSES],
            kept: AtomicUsize::new(0),
        }
    }

    /// `len` bytes `fill` writes, in a buffer of this pool when `len` is in
    /// the pooled range (else in one of their own). On an error the buffer
    /// goes back to the pool as it is: it stays initialised, and nobody reads
    /// its old contents (only the `len` bytes of a successful fill are ever
    /// handed out).
    fn filled(
        &'static self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<Bytes> {
        if !(POOLED_MIN..=POOLED_MAX).contains(&len) {
            let mut buf = vec![0u8; len];
            fill(&mut buf)?;
            return Ok(Bytes::from(buf));
        }
        let mut pooled = Pooled {
            buf: self.take(class_of(len)),
            len,
            pool: self,
        };
        fill(&mut pooled.buf[..len])?;
        Ok(Bytes::from_owner(pooled))
    }

    /// Reads `len` bytes of `file` at `position` with one positional read.
    fn read_at(&'static self, file: &File, position: u64, len: usize) -> std::io::Result<Bytes> {
        self.filled(len, |buf| file.read_exact_at(buf, position))
    }

    /// The bytes of `pieces`, in order, in one buffer.
    fn copy_of(&'static self, pieces: &[&[u8]]) -> Bytes {
        let len = pieces.iter().map(|p| p.len()).sum();
        let copied = self.filled(len, |buf| {
            let mut at = 0;
            for p in pieces {
                buf[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
            Ok(())
        });
        copied.expect("copying never fails")
    }

    fn take(&self, class: usize) -> Vec<u8> {
        let reused = self.idle[class]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        match reused {
            Some(buf) => {
                self.kept.fetch_sub(buf.len(), Ordering::Relaxed);
                buf
            }
            None => vec![0u8; POOLED_MIN << class],
        }
    }

    fn give_back(&self, buf: Vec<u8>) {
        let size = buf.len();
        // Reserve room first, so concurrent returns never keep more than the bound.
        if self
            .kept
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |kept| {
                (kept + size <= KEEP_BYTES).then_some(kept + size)
            })
            .is_err()
        {
            return; // freed
        }
        self.idle[class_of(size)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(buf);
    }
}

/// A pooled buffer's first `len` bytes, as a `Bytes` owner; back to the pool on drop.
struct Pooled {
    buf: Vec<u8>,
    len: usize,
    pool: &'static Pool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

/// The bytes of `pieces`, in order, copied into one buffer (a pooled one when
/// their length is in the pooled range).
pub fn copy_of(pieces: &[&[u8]]) -> Bytes {
    POOL.copy_of(pieces)
}

/// Reads `len` bytes of `file` at `position` with one positional read, into a
/// pooled buffer when `len` is in the pooled range.
pub fn read_at(file: &File, position: u64, len: usize) -> std::io::Result<Bytes> {
    POOL.read_at(file, position, len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&data).unwrap();
        f.flush().unwrap();
        (f, data)
    }

    #[test]
    fn size_classes_cover_the_pooled_range() {
        assert_eq!(class_of(POOLED_MIN), 0);
        assert_eq!(class_of(POOLED_MIN + 1), 1);
        assert_eq!(class_of(2 * POOLED_MIN), 1);
        assert_eq!(class_of(POOLED_MAX), CLASSES - 1);
        assert_eq!(POOLED_MIN << (CLASSES - 1), POOLED_MAX);
    }

    /// A pool of the test's own (the global one is shared by parallel tests).
    fn pool() -> &'static Pool {
        Box::leak(Box::new(Pool::new()))
    }

    #[test]
    fn a_dropped_read_buffer_is_reused_and_never_shows_old_bytes() {
        let (f, data) = file_of(3 << 20);
        let file = f.as_file();
        let pool = pool();
        // Sizes of one class (1 MiB < len <= 2 MiB).
        let first = pool.read_at(file, 0, (3 << 19) + 5).unwrap();
        assert_eq!(&first[..], &data[..(3 << 19) + 5]);
        let at = first.as_ptr();
        drop(first);
        // A shorter read of the same class gets the same buffer and shows
        // exactly the bytes read, none of the longer read's tail.
        let second = pool.read_at(file, 1000, (1 << 20) + 1).unwrap();
        assert_eq!(second.as_ptr(), at, "the buffer was not reused");
        assert_eq!(second.len(), (1 << 20) + 1);
        assert_eq!(&second[..], &data[1000..1000 + (1 << 20) + 1]);
        // While a clone lives, the buffer is not handed out again.
        let clone = second.slice(10..20);
        drop(second);
        let third = pool.read_at(file, 0, (1 << 20) + 2).unwrap();
        assert_ne!(third.as_ptr(), at);
        assert_eq!(&clone[..], &data[1010..1020]);
        drop((clone, third));
        assert_eq!(pool.kept.load(Ordering::Relaxed), 2 * (2 << 20));
    }

    #[test]
    fn the_pool_keeps_at_most_its_bound() {
        let (f, _) = file_of(POOLED_MAX);
        let pool = pool();
        let held: Vec<Bytes> = (0..KEEP_BYTES / POOLED_MAX + 2)
            .map(|_| pool.read_at(f.as_file(), 0, POOLED_MAX).unwrap())
            .collect();
        drop(held);
        assert_eq!(pool.kept.load(Ordering::Relaxed), KEEP_BYTES);
        assert_eq!(
            pool.idle[CLASSES - 1].lock().unwrap().len(),
            KEEP_BYTES / POOLED_MAX
        );
    }

    #[test]
    fn copies_join_pieces_in_a_pooled_buffer() {
        let pool = pool();
        let a = Bytes::from(vec![1u8; POOLED_MIN]);
        let b = Bytes::from(vec![2u8; 10]);
        let joined = pool.copy_of(&[&a, &b]);
        assert_eq!(&joined[..], [&a[..], &b[..]].concat());
        let at = joined.as_ptr();
        drop(joined);
        assert_eq!(pool.copy_of(&[&b, &a]).as_ptr(), at, "reused");
        assert_eq!(&pool.copy_of(&[&b])[..], &b[..]);
    }

    #[test]
    fn short_long_and_failed_reads() {
        let (f, data) = file_of(100);
        let file = f.as_file();
        let pool = pool();
        assert_eq!(&pool.read_at(file, 10, 50).unwrap()[..], &data[10..60]);
        // Past the end: an error, and the pooled buffer is not lost for good.
        let err = pool.read_at(file, 0, POOLED_MIN).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        assert_eq!(pool.kept.load(Ordering::Relaxed), POOLED_MIN);
        assert!(pool.read_at(file, 0, POOLED_MAX + 1).is_err());
    }
}
