//! CRC-32C (Castagnoli): the checksum of Kafka's record batch v2 and of Rill's
//! own files (metadata log entries and snapshots).
//!
//! Computed by whichever of two crates is faster on this CPU
//! ([`wide_clmul`]): crc-fast folds with AVX-512 VPCLMULQDQ where the CPU has
//! it (1.5-2.5x the crc32c crate on 1 KiB-256 KiB buffers there), but without
//! AVX-512 it falls back to 128-bit PCLMULQDQ code that the crc32c crate's
//! three-stream SSE4.2 `crc32` loop beats by 1.3-1.45x (docs/BENCHMARKS.md has
//! both machines). The broker checksums every produced batch and every
//! replicated one, the consumer every fetched one.

use crc_fast::{CrcAlgorithm, Digest};

/// CRC-32C's final XOR (and initial value).
const XOROUT: u32 = 0xffff_ffff;

/// CRC-32C of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    if wide_clmul() {
        by_crc_fast(data)
    } else {
        crc32c::crc32c(data)
    }
}

/// CRC-32C of the bytes whose CRC-32C is `crc` followed by `data`: how a
/// checksum continues across pieces (`crc32c_append(crc32c(a), b)` is
/// `crc32c(a ++ b)`, and `crc32c_append(0, b)` is `crc32c(b)`).
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    if wide_clmul() {
        append_by_crc_fast(crc, data)
    } else {
        crc32c::crc32c_append(crc, data)
    }
}

/// Whether crc-fast has its wide path here: AVX-512 VL with VPCLMULQDQ on
/// x86-64 (the detection is cached by std, so this is a load and a test), and
/// its NEON folding on other targets.
#[inline]
fn wide_clmul() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}

fn by_crc_fast(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

fn append_by_crc_fast(crc: u32, data: &[u8]) -> u32 {
    let mut digest = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(crc ^ XOROUT));
    digest.update(data);
    digest.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // The check value of CRC-32C (Castagnoli) in the CRC catalogue.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        // RFC 3720 (iSCSI), B.4: 32 bytes of zeros, of 0xff, ascending.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        let ascending: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&ascending), 0x46dd_794e);
    }

    /// Only one of the two crates runs on a given CPU, so both are checked
    /// against each other here, whichever this machine uses.
    #[test]
    fn both_crates_agree() {
        let whole: Vec<u8> = (0..70_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for len in [
            0, 1, 7, 8, 15, 16, 63, 64, 255, 256, 257, 1024, 4097, 65_536, 70_000,
        ] {
            let data = &whole[..len];
            assert_eq!(by_crc_fast(data), crc32c::crc32c(data), "length {len}");
            let head = crc32c::crc32c(&whole[..len / 3]);
            assert_eq!(
                append_by_crc_fast(head, &data[len / 3..]),
                crc32c::crc32c_append(head, &data[len / 3..]),
                "length {len}"
            );
        }
    }

    #[test]
    fn appending_equals_the_whole() {
        // Lengths around the vector widths (16, 64, 256 bytes) and beyond.
        let whole: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for split in [0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 1000, 4097, 5000] {
            let head = crc32c(&whole[..split]);
            assert_eq!(
                crc32c_append(head, &whole[split..]),
                crc32c(&whole),
                "split at {split}"
            );
        }
        assert_eq!(crc32c_append(0, b"123456789"), 0xe306_9283);
        // Byte by byte.
        let by_byte = whole[..300]
            .iter()
            .fold(0, |crc, b| crc32c_append(crc, &[*b]));
        assert_eq!(by_byte, crc32c(&whole[..300]));
    }
}
