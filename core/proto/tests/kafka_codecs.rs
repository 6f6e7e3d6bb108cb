//! Kafka's four compression codecs, as Kafka clients write them.
//!
//! The fixtures are whole v2 record batches written by two real clients:
//! - kafka-python 3.0.12 (`DefaultRecordBatchBuilder`, its codec helpers: gzip,
//!   snappy in snappy-java framing, lz4 frames via the `lz4` package with the
//!   content size stored, zstd via `zstandard`), records
//!   `k0 = "kafka-python " + codec * 8` (header h=v), `k1` (same value), `k2`
//!   tombstone, timestamps 1700000000000 + i;
//! - librdkafka 2.16.0 (confluent-kafka 2.16.1, idempotent producer, acks=all),
//!   fetched back raw from librdkafka's mock cluster with a Fetch v4 request:
//!   gzip, raw snappy (no framing), lz4 frames via LZ4F, zstd; records as above
//!   with `"librdkafka " + codec * 10`.
//!
//! `fixtures/kafka_codecs.py` makes these batches again.
//!
//! Plus payload fixtures: Rill's legacy lz4 block form (python `lz4.block` with
//! `store_size`, the same bytes as `lz4_flex::compress_prepend_size`), an lz4
//! frame with block and content checksums, concatenated snappy-java streams and
//! concatenated gzip members.

use bytes::Bytes;
use proptest::prelude::*;
use rill_proto::batch::BATCH_HEADER_LEN;
use rill_proto::compression::{compress, decompress};
use rill_proto::validation::validate_produced;
use rill_proto::{BatchBuilder, BatchView, Compression, DecodeError, Header, Offset, Record, Rope};

/// Kafka v2 layout: the CRC at byte 17 covers everything from the attributes
/// at byte 21 on.
const CRC_OFFSET: usize = 17;
const ATTRIBUTES_OFFSET: usize = 21;
const BOUND: usize = rill_proto::batch::MAX_UNCOMPRESSED_RECORDS_BYTES;

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2));
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

const KAFKA_PYTHON: [(&str, Compression, &str); 4] = [
    (
        "gzip",
        Compression::Gzip,
        "00000000000000000000007800000000028f60b9ce0001000000020000018bcfe568000000018bcfe56802ffffffffffffffffffffffffffff000000031f8b0800177f136b02ff2b62606060c93688ca4e4ccb4ed42da82cc9c8cf5348afca2cc08799983298cab218989858b20d49d3c920c0c0c2c2926dc4c80000d94e4c7d79000000",
    ),
    (
        "snappy",
        Compression::Snappy,
        "0000000000000000000000840000000002b459ddae0002000000020000018bcfe568000000018bcfe56802ffffffffffffffffffffffffffff0000000382534e415050590000000001000000010000003f9b016c9201000000046b307a6b61666b612d707974686f6e20736e61707079a606003402026802768a01000202046b317af24b00240010000404046b320100",
    ),
    (
        "lz4",
        Compression::Lz4,
        "0000000000000000000000800000000002ce256ed70003000000020000018bcfe568000000018bcfe56802ffffffffffffffffffffffffffff0000000304224d18684069000000000000002438000000ff0962000000046b304a6b61666b612d707974686f6e206c7a34030002cf02026802765a000202046b31320013a00010000404046b32010000000000",
    ),
    (
        "zstd",
        Compression::Zstd,
        "000000000000000000000073000000000286ba1e100004000000020000018bcfe568000000018bcfe56802ffffffffffffffffffffffffffff0000000328b52ffd2079cd0100f40272000000046b305a6b61666b612d707974686f6e207a73746402026802766a000202046b310010000404046b32010002007765a666dc18",
    ),
];

const LIBRDKAFKA: [(&str, Compression, &str); 4] = [
    (
        "gzip",
        Compression::Gzip,
        "00000000000000000000007600000000028563e5230001000000020000018bcfe568000000018bcfe56802000000002d195190000000000000000000031f8b0800000000000003ab63606060c93648cbc94c2a4ac94e4ccb4e5448afca2c2006333165309595313031b1641b92a39f418081858525db8891010003422ab385000000",
    ),
    (
        "snappy",
        Compression::Snappy,
        "0000000000000000000000700000000002a00222fc0002000000020000018bcfe568000000018bcfe5680200000000055bb82800000000000000000003b10168a801000000046b308e016c696272646b61666b6120736e61707079d60600300202680276a001000202046b31fe56001556240010000404046b320100",
    ),
    (
        "lz4",
        Compression::Lz4,
        "0000000000000000000000760000000002957c3a140003000000020000018bcfe568000000018bcfe56802000000002b0969080000000000000000000304224d1860408236000000ff076a000000046b30526c696272646b61666b61206c7a34030008cf020268027662000202046b31360017a00010000404046b32010000000000",
    ),
    (
        "zstd",
        Compression::Zstd,
        "000000000000000000000071000000000269bed3fd0004000000020000018bcfe568000000018bcfe56802000000002c1353400000000000000000000328b52ffd0058bd0100d4027e000000046b30666c696272646b61666b61207a737464020268027676000202046b310010000404046b320100020019c2999e744d",
    ),
];

/// Checks a client's batch: header, CRC, the broker's produce validation, and
/// every record.
fn check_client_batch(bytes: &[u8], codec: Compression, value: &str) {
    let view = BatchView::new(bytes).unwrap();
    assert_eq!(view.header.compression().unwrap(), codec);
    view.verify_crc().unwrap();
    validate_produced(
        &Rope::from(Bytes::copy_from_slice(bytes)),
        None,
        1_700_000_000_000,
    )
    .unwrap();
    let records = view.records().unwrap();
    assert_eq!(records.len(), 3);
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.offset, Offset(i as i64));
        assert_eq!(r.timestamp_ms, 1_700_000_000_000 + i as i64);
        assert_eq!(r.key.as_deref(), Some(format!("k{i}").as_bytes()));
    }
    assert_eq!(records[0].value.as_deref(), Some(value.as_bytes()));
    assert_eq!(records[1].value.as_deref(), Some(value.as_bytes()));
    assert!(records[2].is_tombstone());
    assert_eq!(
        records[0].headers,
        vec![Header {
            key: "h".into(),
            value: Bytes::from_static(b"v")
        }]
    );
    assert!(records[1].headers.is_empty());
}

#[test]
fn reads_kafka_python_batches() {
    for (name, codec, h) in KAFKA_PYTHON {
        check_client_batch(&hex(h), codec, &format!("kafka-python {}", name.repeat(8)));
    }
}

#[test]
fn reads_librdkafka_batches() {
    for (name, codec, h) in LIBRDKAFKA {
        check_client_batch(&hex(h), codec, &format!("librdkafka {}", name.repeat(10)));
    }
}

/// The records section of a whole batch, stored (compressed) as it lies.
fn section(batch: &[u8]) -> &[u8] {
    &batch[BATCH_HEADER_LEN..]
}

/// The same batch with its records section replaced (attribute and CRC fixed).
fn with_section(batch: &[u8], codec: Compression, new_section: &[u8]) -> Vec<u8> {
    let mut out = batch[..BATCH_HEADER_LEN].to_vec();
    out.extend_from_slice(new_section);
    let len = (out.len() - 12) as i32;
    out[8..12].copy_from_slice(&len.to_be_bytes());
    let attrs = i16::from_be_bytes([out[ATTRIBUTES_OFFSET], out[ATTRIBUTES_OFFSET + 1]]);
    let attrs = (attrs & !7) | codec.attribute() as i16;
    out[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2].copy_from_slice(&attrs.to_be_bytes());
    let crc = rill_proto::crc::crc32c(&out[ATTRIBUTES_OFFSET..]);
    out[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    out
}

/// What Rill writes for a client's records reads back the same, with every codec.
#[test]
fn client_records_recompressed_by_rill_read_the_same() {
    for (_, codec, h) in KAFKA_PYTHON.iter().chain(LIBRDKAFKA.iter()) {
        let batch = hex(h);
        let plain = decompress(*codec, section(&batch), BOUND).unwrap();
        let expected = BatchView::new(&batch).unwrap().records().unwrap();
        for ours in Compression::ALL {
            let rebuilt = with_section(&batch, ours, &compress(ours, &plain));
            let view = BatchView::new(&rebuilt).unwrap();
            view.verify_crc().unwrap();
            assert_eq!(view.records().unwrap(), expected, "{codec} -> {ours}");
        }
    }
}

/// Rill writes each codec in the form Kafka's Java client writes.
#[test]
fn writes_the_forms_kafka_clients_read() {
    let data = b"some records ".repeat(20_000); // 260 KB: several blocks
    // gzip: one member.
    let gz = compress(Compression::Gzip, &data);
    assert_eq!(&gz[..3], &[0x1f, 0x8b, 8]);
    // snappy: snappy-java framing, blocks of at most 32 KiB of input.
    let sn = compress(Compression::Snappy, &data);
    assert_eq!(&sn[..16], &hex("82534e41505059000000000100000001")[..]);
    let (mut pos, mut blocks) = (16, 0);
    while pos < sn.len() {
        let len = u32::from_be_bytes(sn[pos..pos + 4].try_into().unwrap()) as usize;
        let block = &sn[pos + 4..pos + 4 + len];
        assert!(snap::raw::decompress_len(block).unwrap() <= 32 * 1024);
        pos += 4 + len;
        blocks += 1;
    }
    assert_eq!(pos, sn.len());
    assert_eq!(blocks, data.len().div_ceil(32 * 1024));
    // lz4: a frame, version 01, independent blocks, no checksums or content
    // size, 64 KiB blocks (what Kafka's Lz4BlockOutputStream writes; its reader
    // refuses linked blocks).
    let lz = compress(Compression::Lz4, &data);
    assert_eq!(&lz[..4], &[0x04, 0x22, 0x4d, 0x18]);
    assert_eq!(lz[4], 0b0110_0000, "FLG");
    assert_eq!(lz[5], 0x40, "BD: 64 KiB blocks");
    assert_eq!(&lz[lz.len() - 4..], &[0, 0, 0, 0], "end mark");
    // zstd: a frame.
    let zs = compress(Compression::Zstd, &data);
    assert_eq!(&zs[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
    for (codec, out) in [
        (Compression::Gzip, gz),
        (Compression::Snappy, sn),
        (Compression::Lz4, lz),
        (Compression::Zstd, zs),
    ] {
        assert_eq!(decompress(codec, &out, BOUND).unwrap(), data, "{codec}");
    }
}

#[test]
fn round_trips_every_codec_and_size() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    let inputs: Vec<Vec<u8>> = vec![
        vec![],
        b"x".to_vec(),
        b"abc".repeat(1000),
        noise(100),
        noise(32 * 1024),
        noise(32 * 1024 + 1),
        noise(200_000),
        vec![0; 1 << 20],
    ];
    for codec in Compression::ALL {
        for data in &inputs {
            let c = compress(codec, data);
            let d = decompress(codec, &c, BOUND).unwrap();
            assert!(d == *data, "{codec}, {} bytes", data.len());
            // Exactly at the bound is allowed.
            assert_eq!(decompress(codec, &c, data.len()).unwrap(), *data);
        }
    }
}

#[test]
fn round_trips_batches_with_every_codec() {
    for codec in Compression::ALL {
        let mut b = BatchBuilder::new(codec);
        for i in 0..100 {
            b.push(&Record {
                key: Some(Bytes::from(format!("key-{i}"))),
                value: (i % 7 != 0).then(|| Bytes::from(format!("value {i} {}", "v".repeat(i)))),
                headers: vec![],
                timestamp_ms: 1_000 + i as i64,
            });
        }
        let bytes = b.build();
        let view = BatchView::new(&bytes).unwrap();
        assert_eq!(view.header.compression().unwrap(), codec);
        view.verify_crc().unwrap();
        let recs = view.records().unwrap();
        assert_eq!(recs.len(), 100);
        assert!(recs[7].is_tombstone());
        assert_eq!(
            recs[99].value.as_deref(),
            Some(format!("value 99 {}", "v".repeat(99)).as_bytes())
        );
    }
}

/// Batches already in Rill logs hold lz4 as a block with a little-endian size
/// in front; they still read.
#[test]
fn legacy_lz4_blocks_still_read() {
    let data = b"rill legacy lz4 block ".repeat(4);
    let legacy = hex("58000000ff0772696c6c206c6567616379206c7a3420626c6f636b2016002a506c6f636b20");
    assert_eq!(decompress(Compression::Lz4, &legacy, BOUND).unwrap(), data);
    // A whole legacy batch, as the old writer built it.
    let mut b = BatchBuilder::new(Compression::None);
    for i in 0..50 {
        b.push(&Record::from_value(format!("legacy value {i}"), 5_000 + i));
    }
    let plain = b.build();
    let expected = BatchView::new(&plain).unwrap().records().unwrap();
    let old = with_section(
        &plain,
        Compression::Lz4,
        &lz4_flex::compress_prepend_size(section(&plain)),
    );
    let view = BatchView::new(&old).unwrap();
    view.verify_crc().unwrap();
    assert_eq!(view.records().unwrap(), expected);
    validate_produced(&Rope::from(Bytes::from(old)), None, 5_000).unwrap();
}

/// A legacy batch rewritten for Kafka clients: same header fields and records,
/// the section now a frame; frames and other codecs are left alone; a damaged
/// legacy batch is an error, not resealed.
#[test]
fn legacy_lz4_batches_are_rewritten_as_frames() {
    let mut b = BatchBuilder::new(Compression::None).producer(rill_proto::ProducerId(42), 3, 7);
    for i in 0..300 {
        b.push(&Record::from_value(
            format!("legacy value {i} {}", "z".repeat(i)),
            9_000 + i as i64,
        ));
    }
    let plain = b.build_at(Offset(1_000), rill_proto::LeaderEpoch(5));
    let old = with_section(
        &plain,
        Compression::Lz4,
        &lz4_flex::compress_prepend_size(section(&plain)),
    );
    let new = rill_proto::batch::lz4_legacy_to_frame(&old)
        .unwrap()
        .unwrap();
    assert!(!rill_proto::compression::is_legacy_lz4(section(&new)));
    assert_eq!(&section(&new)[..4], &[0x04, 0x22, 0x4d, 0x18]);
    let (old_view, new_view) = (BatchView::new(&old).unwrap(), BatchView::new(&new).unwrap());
    new_view.verify_crc().unwrap();
    let mut expected_header = old_view.header;
    expected_header.batch_length = new_view.header.batch_length;
    expected_header.crc = new_view.header.crc;
    assert_eq!(new_view.header, expected_header);
    assert_eq!(new_view.records().unwrap(), old_view.records().unwrap());
    // Nothing to do for frames or other codecs.
    assert_eq!(rill_proto::batch::lz4_legacy_to_frame(&new).unwrap(), None);
    for codec in Compression::ALL {
        let mut b = BatchBuilder::new(codec);
        b.push(&Record::from_value("v", 1));
        assert_eq!(
            rill_proto::batch::lz4_legacy_to_frame(&b.build()).unwrap(),
            None
        );
    }
    // A damaged legacy batch is refused.
    let mut bad = old.clone();
    let n = bad.len();
    bad[n - 1] ^= 1;
    let err = rill_proto::batch::lz4_legacy_to_frame(&bad).unwrap_err();
    assert!(matches!(err, DecodeError::CrcMismatch { .. }), "{err}");
}

#[test]
fn reads_lz4_frames_with_checksums_and_content_size() {
    let framed = hex(
        "04224d187c405800000000000000bf21000000ff0772696c6c206c6567616379206c7a3420626c6f636b2016002a506c6f636b20d6858bad000000001f6b986d",
    );
    let data = b"rill legacy lz4 block ".repeat(4);
    assert_eq!(decompress(Compression::Lz4, &framed, BOUND).unwrap(), data);
    // A wrong content checksum is caught.
    let mut bad = framed.clone();
    let n = bad.len();
    bad[n - 1] ^= 1;
    let err = decompress(Compression::Lz4, &bad, BOUND).unwrap_err();
    assert!(err.to_string().contains("lz4"), "{err}");
}

#[test]
fn reads_concatenated_snappy_java_streams_and_gzip_members() {
    let two = hex(
        "82534e415050590000000001000000010000000d0b28666972737420706172742c82534e415050590000000001000000010000000e0c2c207365636f6e642070617274",
    );
    assert_eq!(
        decompress(Compression::Snappy, &two, BOUND).unwrap(),
        b"first part, second part"
    );
    let small_blocks = hex(
        "82534e4150505900000000010000000100000012103c6162636465666768616263646566676800000012103c6162636465666768616263646566676800000012103c6162636465666768616263646566676800000012103c61626364656667686162636465666768",
    );
    assert_eq!(
        decompress(Compression::Snappy, &small_blocks, BOUND).unwrap(),
        b"abcdefgh".repeat(8)
    );
    let gz = hex(
        "1f8b0800000000000203cbcf4b5500004961ac23040000001f8b08000000000002032b29cf0700668aca1103000000",
    );
    assert_eq!(
        decompress(Compression::Gzip, &gz, BOUND).unwrap(),
        b"one two"
    );
}

fn assert_decompress_error(codec: Compression, data: &[u8], expect: &[&str]) -> DecodeError {
    let err = match decompress(codec, data, BOUND) {
        Ok(out) => panic!(
            "{codec}: {} bytes decompressed to {} bytes, expected an error",
            data.len(),
            out.len()
        ),
        Err(e) => e,
    };
    let msg = err.to_string();
    for e in expect {
        assert!(msg.contains(e), "{codec}: '{msg}' lacks '{e}'");
    }
    err
}

#[test]
fn truncated_and_corrupt_payloads_are_clear_errors() {
    let data = b"a record section that compresses well ".repeat(100);
    for codec in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let c = compress(codec, &data);
        // Cut anywhere inside the last block or trailer: an error naming the codec.
        for cut in [1, 2, 5] {
            assert_decompress_error(codec, &c[..c.len() - cut], &[&codec.to_string()]);
        }
        // Only the first few bytes.
        for keep in [1, 3] {
            assert!(
                decompress(codec, &c[..keep], BOUND).is_err(),
                "{codec} {keep}"
            );
        }
        // Flipped bytes anywhere: an error or some output, never a panic.
        for i in 0..c.len() {
            let mut bad = c.clone();
            bad[i] ^= 0x5a;
            let _ = decompress(codec, &bad, BOUND);
        }
        // Not that codec at all.
        assert_decompress_error(codec, b"this is not compressed data", &[]);
    }
    assert!(decompress(Compression::Snappy, &[], BOUND).is_err());
    // A snappy-java block longer than what follows.
    let mut sn = compress(Compression::Snappy, &data);
    sn.truncate(20);
    assert_decompress_error(Compression::Snappy, &sn, &["snappy-java block"]);
}

#[test]
fn decompression_bombs_are_refused_naming_codec_and_bound() {
    let bomb = vec![0u8; 4 << 20]; // 4 MiB of zeros compresses to little
    let bound = 64 * 1024;
    for codec in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let c = compress(codec, &bomb);
        assert!(c.len() < 256 * 1024, "{codec}: {}", c.len());
        let err = decompress(codec, &c, bound).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&codec.to_string()), "{msg}");
        assert!(msg.contains("65536"), "{msg}");
    }
    // Raw snappy claiming 4 GiB: refused on the claim, before allocating.
    let claim = [0xff, 0xff, 0xff, 0xff, 0x0f, 0x00];
    let msg = decompress(Compression::Snappy, &claim, BOUND)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("snappy") && msg.contains(&BOUND.to_string()),
        "{msg}"
    );
    // Legacy lz4 claiming more than the bound.
    let msg = decompress(Compression::Lz4, &[0, 0, 0, 0x10, 0], BOUND)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("lz4") && msg.contains(&BOUND.to_string()),
        "{msg}"
    );
    // Whole snappy-java blocks that together pass the bound.
    let sn = compress(Compression::Snappy, &vec![7u8; 100 * 1024]);
    let msg = decompress(Compression::Snappy, &sn, 50 * 1024)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("snappy") && msg.contains("51200"), "{msg}");
}

#[test]
fn attribute_codes_and_names_are_kafkas() {
    for (code, name) in [
        (0, "none"),
        (1, "gzip"),
        (2, "snappy"),
        (3, "lz4"),
        (4, "zstd"),
    ] {
        let c = Compression::from_attribute(code).unwrap();
        assert_eq!(c.attribute(), code);
        assert_eq!(c.to_string(), name);
        assert_eq!(name.parse::<Compression>().unwrap(), c);
        assert_eq!(name.to_uppercase().parse::<Compression>().unwrap(), c);
    }
    for code in 5..8 {
        let err = Compression::from_attribute(code).unwrap_err().to_string();
        assert!(err.contains("gzip=1, snappy=2"), "{err}");
    }
    assert!("brotli".parse::<Compression>().is_err());
}

/// Prints a Rill-written batch per codec as hex, for
/// `fixtures/rill_batches_in_kafka_clients.py`, which checks that librdkafka's
/// consumer and kafka-python read them:
/// `cargo test -p rill-proto --test kafka_codecs -- --ignored --nocapture print_rill_batches`
#[test]
#[ignore = "prints fixtures for a script; asserts nothing"]
fn print_rill_batches() {
    for codec in Compression::ALL {
        let mut b = BatchBuilder::new(codec);
        for i in 0..200 {
            b.push(&Record {
                key: Some(Bytes::from(format!("k{i}"))),
                value: (i % 50 != 49)
                    .then(|| Bytes::from(format!("rill {codec} value {i} {}", "x".repeat(i * 3)))),
                headers: if i == 0 {
                    vec![Header {
                        key: "h".into(),
                        value: Bytes::from_static(b"v"),
                    }]
                } else {
                    vec![]
                },
                timestamp_ms: 1_700_000_000_000 + i as i64,
            });
        }
        let hex: String = b.build().iter().map(|b| format!("{b:02x}")).collect();
        println!("BATCH {codec} {hex}");
    }
}

/// Each codec's magic, so random tails get past the form detection.
const PREFIXES: [&[u8]; 5] = [
    b"",
    &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff],
    &[
        0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1,
    ],
    &[0x04, 0x22, 0x4d, 0x18, 0x60, 0x40, 0x82],
    &[0x28, 0xb5, 0x2f, 0xfd],
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decompress_of_random_bytes_never_panics(
        prefix in 0usize..PREFIXES.len(),
        tail in proptest::collection::vec(any::<u8>(), 0..300),
        max_len in 0usize..100_000,
    ) {
        let mut data = PREFIXES[prefix].to_vec();
        data.extend_from_slice(&tail);
        for codec in Compression::ALL {
            let result = decompress(codec, &data, max_len);
            if let (Ok(out), true) = (result, codec != Compression::None) {
                prop_assert!(out.len() <= max_len);
            }
        }
    }

    #[test]
    fn round_trip_of_random_bytes(
        data in proptest::collection::vec(any::<u8>(), 0..5_000),
        repeat in 1usize..20,
    ) {
        let data = data.repeat(repeat);
        for codec in Compression::ALL {
            let c = compress(codec, &data);
            prop_assert_eq!(&decompress(codec, &c, data.len()).unwrap(), &data);
        }
    }

    /// Damaged real output: never a panic.
    #[test]
    fn decompress_of_damaged_output_never_panics(
        codec in 1u8..5,
        data in proptest::collection::vec(any::<u8>(), 0..2_000),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in any::<usize>(),
    ) {
        let codec = Compression::from_attribute(codec).unwrap();
        let mut c = compress(codec, &data);
        for (i, b) in edits {
            let i = i % c.len();
            c[i] = b;
        }
        c.truncate(cut % (c.len() + 1));
        let _ = decompress(codec, &c, 10_000);
    }
}
