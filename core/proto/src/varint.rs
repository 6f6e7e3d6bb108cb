//! Zigzag varints as used inside records (protobuf encoding, as in Kafka's v2 format).
//!
//! Reads are bounded: a varint longer than its type allows is an error naming the
//! field, never a panic or a silent wrap.

use crate::error::DecodeError;

pub fn write_varint(out: &mut Vec<u8>, v: i32) {
    write_unsigned(out, ((v << 1) ^ (v >> 31)) as u32 as u64);
}

pub fn write_varlong(out: &mut Vec<u8>, v: i64) {
    write_unsigned(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn write_unsigned(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads one unsigned varint of at most `max_bytes` bytes. One- and two-byte
/// varints (lengths below 16 KiB, offset and timestamp deltas, the attribute
/// and count fields: nearly every varint of a record) take a path with one
/// bounds check and no loop; the broker reads several per record it checks.
#[inline]
fn read_unsigned(
    buf: &mut &[u8],
    max_bytes: usize,
    field: &'static str,
) -> Result<u64, DecodeError> {
    match **buf {
        [b0, ref rest @ ..] if b0 < 0x80 => {
            *buf = rest;
            Ok(b0 as u64)
        }
        [b0, b1, ref rest @ ..] if b1 < 0x80 => {
            *buf = rest;
            Ok((b0 & 0x7f) as u64 | (b1 as u64) << 7)
        }
        _ => read_unsigned_long(buf, max_bytes, field),
    }
}

/// [`read_unsigned`] of a varint of three bytes or more, or of a truncated one.
#[cold]
fn read_unsigned_long(
    buf: &mut &[u8],
    max_bytes: usize,
    field: &'static str,
) -> Result<u64, DecodeError> {
    let mut result: u64 = 0;
    for i in 0..max_bytes {
        let Some((&b, rest)) = buf.split_first() else {
            return Err(DecodeError::Truncated {
                field,
                needed: i + 1,
                available: i,
            });
        };
        *buf = rest;
        result |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(result);
        }
    }
    Err(DecodeError::VarintTooLong { field })
}

#[inline]
pub fn read_varint(buf: &mut &[u8], field: &'static str) -> Result<i32, DecodeError> {
    let raw = read_unsigned(buf, 5, field)?;
    if raw > u32::MAX as u64 {
        return Err(DecodeError::VarintTooLong { field });
    }
    let raw = raw as u32;
    Ok(((raw >> 1) as i32) ^ -((raw & 1) as i32))
}

#[inline]
pub fn read_varlong(buf: &mut &[u8], field: &'static str) -> Result<i64, DecodeError> {
    let raw = read_unsigned(buf, 10, field)?;
    Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varint_round_trip(v in any::<i32>()) {
            let mut out = Vec::new();
            write_varint(&mut out, v);
            let mut s = &out[..];
            prop_assert_eq!(read_varint(&mut s, "v").unwrap(), v);
            prop_assert!(s.is_empty());
        }

        #[test]
        fn varlong_round_trip(v in any::<i64>()) {
            let mut out = Vec::new();
            write_varlong(&mut out, v);
            let mut s = &out[..];
            prop_assert_eq!(read_varlong(&mut s, "v").unwrap(), v);
            prop_assert!(s.is_empty());
        }

        /// Small values (the one- and two-byte fast paths) and their edges:
        /// a varint followed by more bytes leaves exactly those, and every
        /// strict prefix of it is an error, never a value.
        #[test]
        fn varint_in_a_buffer_and_truncated(
            v in prop_oneof![-9000i32..9000, any::<i32>()],
            tail in proptest::collection::vec(any::<u8>(), 0..3),
        ) {
            let mut out = Vec::new();
            write_varint(&mut out, v);
            let n = out.len();
            out.extend_from_slice(&tail);
            let mut s = &out[..];
            prop_assert_eq!(read_varint(&mut s, "v").unwrap(), v);
            prop_assert_eq!(s, &tail[..]);
            for cut in 0..n {
                let mut s = &out[..cut];
                let truncated = matches!(
                    read_varint(&mut s, "v"),
                    Err(DecodeError::Truncated { field: "v", .. })
                );
                prop_assert!(truncated);
            }
        }
    }

    #[test]
    fn overlong_varint_is_an_error() {
        let mut s: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert!(matches!(
            read_varint(&mut s, "x"),
            Err(DecodeError::VarintTooLong { field: "x" })
        ));
    }
}
