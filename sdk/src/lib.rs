//! rill-sdk: write a Rill transform as a plain Rust function.
//!
//! What it is: the guest side of the contract in `sdk/wit/transform.wit`
//! (package `rill:transform@0.2.0`). A transform is a function from one input
//! [`Record`] to zero or more [`Output`]s (or an error), marked with
//! [`transform`]; built for `wasm32-wasip2` it becomes a WebAssembly component
//! that `rill transform deploy` accepts. Built natively, the same function is an
//! ordinary Rust function: unit-test it with `cargo test`, no broker needed, with
//! an in-memory [`state`] and [`log`] (see [`testing`]).
//!
//! What it is not: it depends on nothing of the host (no rill-client, no
//! wasmtime); it does no I/O of its own. The host batches records, writes outputs,
//! keeps state in a changelog topic and commits offsets.
//!
//! Invariants: one call sees one record of one input partition; the records of a
//! partition arrive in offset order; state is per input partition; state writes
//! made while handling a record that fails (an error or a panic) are discarded.
//!
//! ```
//! use rill_sdk::{Output, Record};
//!
//! /// Upper-cases each value; drops records without one.
//! #[rill_sdk::transform]
//! fn shout(record: Record) -> Result<Option<Output>, String> {
//!     let Some(text) = record.value_str()? else { return Ok(None) };
//!     Ok(Some(Output::new(text.to_uppercase()).key_opt(record.key)))
//! }
//!
//! let out = shout(Record::new("hello")).unwrap().unwrap();
//! assert_eq!(out.value.as_deref(), Some(&b"HELLO"[..]));
//! ```
//!
//! With an init hook (`--config KEY=VALUE` of the deployment):
//!
//! ```
//! use rill_sdk::{Config, Output, Record};
//!
//! fn setup(config: &Config) -> Result<(), String> {
//!     config.get("prefix").map(|_| ()).ok_or_else(|| "set --config prefix=...".to_string())
//! }
//!
//! #[rill_sdk::transform(init = setup)]
//! fn prefix(record: Record) -> Result<Output, String> {
//!     let prefix = rill_sdk::config::get("prefix").unwrap_or_default();
//!     let value = record.value.unwrap_or_default();
//!     Ok(Output::new([prefix.as_bytes(), &value].concat()))
//! }
//! # rill_sdk::testing::init(&[("prefix", "> ")], setup).unwrap();
//! # assert_eq!(prefix(Record::new("x")).unwrap().value.as_deref(), Some(&b"> x"[..]));
//! ```

mod host;
mod record;
pub mod testing;

pub use record::{Config, Header, IntoOutputs, Output, Record};
pub use rill_sdk_macros::transform;

/// The contract version this SDK speaks (the WIT package version).
pub const CONTRACT_VERSION: &str = "0.2.0";

/// Log lines the host keeps per transform (`rill transform logs NAME`). Natively
/// they are kept in memory for [`testing::logs`].
pub mod log {
    pub use crate::host::Level;

    /// Logs `message` at `level`.
    pub fn log(level: Level, message: impl AsRef<str>) {
        crate::host::log(level, message.as_ref());
    }
    pub fn debug(message: impl AsRef<str>) {
        log(Level::Debug, message);
    }
    pub fn info(message: impl AsRef<str>) {
        log(Level::Info, message);
    }
    pub fn warn(message: impl AsRef<str>) {
        log(Level::Warn, message);
    }
    pub fn error(message: impl AsRef<str>) {
        log(Level::Error, message);
    }
}

/// Key-value state of this instance (one per input partition), kept by the host
/// in a compacted changelog topic and restored after a restart or a move.
/// Natively: an in-memory map per thread (see [`testing`]).
pub mod state {
    /// The value stored under `key`, if any.
    pub fn get(key: impl AsRef<[u8]>) -> Option<Vec<u8>> {
        crate::host::state_get(key.as_ref())
    }
    /// Stores `value` under `key`.
    pub fn put(key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        crate::host::state_put(key.as_ref(), value.as_ref());
    }
    /// Removes `key`.
    pub fn delete(key: impl AsRef<[u8]>) {
        crate::host::state_delete(key.as_ref());
    }
    /// Whether `key` is stored.
    pub fn contains(key: impl AsRef<[u8]>) -> bool {
        get(key).is_some()
    }
}

/// The deployment's configuration (`--config KEY=VALUE`), as given to init.
pub mod config {
    /// The value of `key`, if the deployment set it.
    pub fn get(key: &str) -> Option<String> {
        crate::host::config_get(key)
    }
}

/// Glue the [`transform`] attribute expands to. Not a public API.
#[doc(hidden)]
pub mod __private {
    use crate::{Config, IntoOutputs, Output, Record};
    use std::fmt::Display;

    #[cfg(target_arch = "wasm32")]
    pub mod bindings {
        wit_bindgen::generate!({
            path: "wit",
            world: "rill:transform/transform@0.2.0",
            pub_export_macro: true,
            export_macro_name: "export_transform",
            default_bindings_module: "rill_sdk::__private::bindings",
        });
    }

    /// Stores the configuration, then runs the user's init hook (if any).
    pub fn init<E: Display>(
        config: Vec<(String, String)>,
        hook: Option<fn(&Config) -> Result<(), E>>,
    ) -> Result<(), String> {
        let config = Config::from_pairs(config);
        crate::host::set_config(config.clone());
        match hook {
            Some(f) => f(&config).map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// Runs the user's function on one record; the error becomes its message.
    pub fn process_one<O: IntoOutputs, E: Display>(
        record: Record,
        f: fn(Record) -> Result<O, E>,
    ) -> Result<Vec<Output>, String> {
        f(record)
            .map(IntoOutputs::into_outputs)
            .map_err(|e| e.to_string())
    }

    /// Runs the user's function on each record of a batch (the contract's
    /// `process`): each record is handed over as an owned [`Record`], and its
    /// outputs' bytes are appended to the one byte list the host copies back.
    #[cfg(target_arch = "wasm32")]
    pub fn process_batch<O: IntoOutputs, E: Display>(
        batch: bindings::rill::transform::types::InputBatch,
        f: fn(Record) -> Result<O, E>,
    ) -> bindings::rill::transform::types::OutputBatch {
        use bindings::rill::transform::types::{
            Failure, Header as WitHeader, OutputBatch, OutputRecord,
        };
        let data = &batch.data;
        let mut out = OutputBatch {
            records: Vec::with_capacity(batch.records.len()),
            headers: Vec::new(),
            data: Vec::with_capacity(data.len()),
            failures: Vec::new(),
        };
        for (input, r) in batch.records.iter().enumerate() {
            let input = input as u32;
            let first = r.first_header as usize;
            let headers = batch.headers[first..first + r.header_count as usize]
                .iter()
                .map(|h| crate::Header {
                    key: String::from_utf8_lossy(span(data, h.key)).into_owned(),
                    value: span(data, h.value).to_vec(),
                })
                .collect();
            let record = Record {
                topic: batch.topic.clone(),
                partition: batch.partition,
                offset: r.offset,
                timestamp_ms: r.timestamp_ms,
                key: r.key.map(|s| span(data, s).to_vec()),
                value: r.value.map(|s| span(data, s).to_vec()),
                headers,
            };
            match process_one(record, f) {
                Ok(outputs) => {
                    for o in outputs {
                        let first_header = out.headers.len() as u32;
                        for h in &o.headers {
                            let key = push(&mut out.data, h.key.as_bytes());
                            let value = push(&mut out.data, &h.value);
                            out.headers.push(WitHeader { key, value });
                        }
                        out.records.push(OutputRecord {
                            input,
                            topic: o.topic,
                            key: o.key.map(|k| push(&mut out.data, &k)),
                            value: o.value.map(|v| push(&mut out.data, &v)),
                            first_header,
                            header_count: o.headers.len() as u32,
                        });
                    }
                }
                Err(message) => out.failures.push(Failure { input, message }),
            }
        }
        out
    }

    #[cfg(target_arch = "wasm32")]
    fn span(data: &[u8], s: bindings::rill::transform::types::Span) -> &[u8] {
        &data[s.start as usize..s.start as usize + s.len as usize]
    }

    #[cfg(target_arch = "wasm32")]
    fn push(data: &mut Vec<u8>, bytes: &[u8]) -> bindings::rill::transform::types::Span {
        let start = data.len() as u32;
        data.extend_from_slice(bytes);
        bindings::rill::transform::types::Span {
            start,
            len: bytes.len() as u32,
        }
    }
}
