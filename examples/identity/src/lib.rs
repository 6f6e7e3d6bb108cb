//! The identity transform: writes each input record (key, value, headers)
//! unchanged to the deployment's first output topic. Used by the benchmarks (the
//! cost of the WebAssembly boundary alone) and the end-to-end tests.

use rill_sdk::{Output, Record};

#[rill_sdk::transform]
fn identity(record: Record) -> Result<Output, String> {
    Ok(Output {
        topic: None,
        key: record.key,
        value: record.value,
        headers: record.headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_key_value_and_headers_through() {
        let rec = Record::new("v").with_key("k").with_header("h", "1");
        let out = identity(rec).unwrap();
        assert_eq!(out.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(out.value.as_deref(), Some(&b"v"[..]));
        assert_eq!(out.headers[0].key, "h");
    }
}
