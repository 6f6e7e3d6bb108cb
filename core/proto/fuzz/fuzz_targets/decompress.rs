//! Fuzz target: decompressing arbitrary bytes with each of Kafka's codecs (and
//! both lz4 forms, both snappy forms) never panics and never yields more than the
//! bound; what decompresses recompresses and decompresses back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rill_proto::Compression;
use rill_proto::compression::{compress, decompress};

const BOUND: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, data)) = data.split_first() else {
        return;
    };
    let codec = Compression::ALL[pick as usize % Compression::ALL.len()];
    if let Ok(out) = decompress(codec, data, BOUND) {
        if codec != Compression::None {
            assert!(out.len() <= BOUND);
        }
        let again = decompress(codec, &compress(codec, &out), BOUND).expect("own output");
        assert_eq!(again, out);
    }
});
