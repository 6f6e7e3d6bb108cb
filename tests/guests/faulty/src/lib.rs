//! A transform for the tests of the host's failure handling. By value:
//! `err` returns an error, `panic` panics, `loop` never returns (the deadline),
//! `oom` allocates without end (the memory cap), `state:K` stores K in state and
//! then fails (the write must be dropped), `seen:K` says whether K is stored;
//! anything else is copied to the output, with a `state` header counting the
//! records this instance has kept in state.

use rill_sdk::{Output, Record};

#[rill_sdk::transform]
fn faulty(record: Record) -> Result<Output, String> {
    let value = record.value_str()?.unwrap_or("").to_string();
    match value.as_str() {
        "err" => Err(format!("refused record at offset {}", record.offset)),
        "panic" => panic!("boom at offset {}", record.offset),
        "loop" => {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        "oom" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        v if v.starts_with("state:") => {
            rill_sdk::state::put(&v[6..], b"1");
            Err("failed after a state write".into())
        }
        v if v.starts_with("seen:") => {
            let seen = rill_sdk::state::contains(&v[5..]);
            Ok(Output::new(format!("{v}={seen}")))
        }
        v => {
            rill_sdk::log::info(format!("copied {v}"));
            Ok(Output::new(v.to_string()).key_opt(record.key))
        }
    }
}
