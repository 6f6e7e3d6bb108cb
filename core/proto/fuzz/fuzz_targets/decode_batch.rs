//! Fuzz target: decoding arbitrary bytes as record batches never panics, never
//! over-allocates, and agrees with itself: every batch `batches()` yields has a
//! parsable header whose size matches its bytes, and `records()` on it either fails
//! cleanly or returns exactly `record_count` records with increasing offsets inside
//! the batch's offset range.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rill_proto::batch::{BatchHeader, batches};

fuzz_target!(|data: &[u8]| {
    for view in batches(data) {
        let Ok(view) = view else { break };
        let header = BatchHeader::parse(view.as_bytes()).expect("a yielded batch has a header");
        assert_eq!(header, view.header);
        assert_eq!(view.as_bytes().len(), header.total_size());
        let _ = view.verify_crc();
        if let Ok(records) = view.records() {
            assert_eq!(records.len(), header.record_count as usize);
            let mut last = None;
            for r in &records {
                assert!(r.offset >= header.base_offset && r.offset <= header.last_offset());
                assert!(last.is_none_or(|l| r.offset > l), "record offsets strictly increase");
                last = Some(r.offset);
            }
        }
    }
});
