//! Choosing a partition for a record that does not name one.
//!
//! Keyed records: Kafka's default partitioner, `to_positive(murmur2(key)) % partitions`,
//! so a key maps to the same partition as it would in Kafka (for the same partition
//! count). Keyless records: a sticky partitioner — stay on one partition until the
//! batch being filled for it is closed, then move on, so keyless traffic forms full
//! batches instead of many tiny ones.
//!
//! Invariant: the result is always `< partitions` (callers never pass 0).

/// Kafka's 32-bit murmur2 hash (seed `0x9747b28c`), bit-for-bit.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= (tail[2] as u32) << 16;
    }
    if tail.len() >= 2 {
        h ^= (tail[1] as u32) << 8;
    }
    if !tail.is_empty() {
        h ^= tail[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// Kafka's `Utils.toPositive`: clears the sign bit (not `abs`, which overflows).
pub fn to_positive(n: i32) -> u32 {
    (n & 0x7fff_ffff) as u32
}

/// The partition Kafka's default partitioner gives a keyed record.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    to_positive(murmur2(key)) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors from Kafka's `UtilsTest.testMurmur2`.
    #[test]
    fn murmur2_matches_kafka() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (input, expected) in cases {
            assert_eq!(
                murmur2(input),
                expected,
                "murmur2({:?})",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn to_positive_clears_sign_bit() {
        assert_eq!(to_positive(-1), 0x7fff_ffff);
        assert_eq!(to_positive(i32::MIN), 0);
        assert_eq!(to_positive(5), 5);
    }

    #[test]
    fn keys_spread_over_partitions_and_are_stable() {
        let partitions = 8u32;
        let mut counts = [0u32; 8];
        for i in 0..8000 {
            let key = format!("key-{i}");
            let p = partition_for_key(key.as_bytes(), partitions);
            assert_eq!(p, partition_for_key(key.as_bytes(), partitions));
            counts[p as usize] += 1;
        }
        // Each partition gets a fair share: 1000 expected, allow wide slack.
        for (p, c) in counts.iter().enumerate() {
            assert!(
                (700..1300).contains(c),
                "partition {p} got {c} of 8000 keys"
            );
        }
    }
}
