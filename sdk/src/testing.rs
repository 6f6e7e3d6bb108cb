//! Native test support: run a transform's init hook, and read or reset the
//! in-memory state and log lines of the current thread (each test runs on its
//! own thread, so tests do not see each other's state).
//!
//! ```
//! use rill_sdk::{Output, Record, testing};
//!
//! #[rill_sdk::transform]
//! fn dedup(record: Record) -> Result<Option<Output>, String> {
//!     let key = record.key.clone().ok_or("no key")?;
//!     if rill_sdk::state::contains(&key) {
//!         return Ok(None);
//!     }
//!     rill_sdk::state::put(&key, b"1");
//!     Ok(Some(Output::new(record.value.unwrap_or_default()).key(key)))
//! }
//!
//! testing::reset();
//! assert!(dedup(Record::new("a").with_key("k")).unwrap().is_some());
//! assert!(dedup(Record::new("a").with_key("k")).unwrap().is_none());
//! assert_eq!(testing::state().len(), 1);
//! ```

use std::collections::BTreeMap;
use std::fmt::Display;

use crate::Config;
use crate::log::Level;

/// Clears this thread's state, log lines and configuration.
pub fn reset() {
    #[cfg(not(target_arch = "wasm32"))]
    {
        crate::host::imp::STATE.with(|s| s.borrow_mut().clear());
        crate::host::imp::LOGS.with(|l| l.borrow_mut().clear());
    }
    crate::host::set_config(Config::default());
}

/// Sets the configuration (as a deployment's `--config` would) and runs `hook`.
pub fn init<E: Display>(
    pairs: &[(&str, &str)],
    hook: fn(&Config) -> Result<(), E>,
) -> Result<(), String> {
    let pairs = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    crate::__private::init(pairs, Some(hook))
}

/// Sets the configuration without an init hook.
pub fn set_config(pairs: &[(&str, &str)]) {
    crate::host::set_config(Config::from_pairs(pairs.iter().copied()));
}

/// A copy of this thread's state.
pub fn state() -> BTreeMap<Vec<u8>, Vec<u8>> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        crate::host::imp::STATE.with(|s| s.borrow().clone())
    }
    #[cfg(target_arch = "wasm32")]
    {
        BTreeMap::new()
    }
}

/// The log lines written on this thread so far.
pub fn logs() -> Vec<(Level, String)> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        crate::host::imp::LOGS.with(|l| l.borrow().clone())
    }
    #[cfg(target_arch = "wasm32")]
    {
        Vec::new()
    }
}
