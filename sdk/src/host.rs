//! Where the SDK's log, state and config calls go.
//!
//! In WebAssembly they are the imports of the WIT world (`rill:transform/log`,
//! `rill:transform/state`), served by the host. Natively they are served by a
//! per-thread in-memory store, so a transform's unit tests run in parallel without
//! seeing each other's state; [`crate::testing`] reads and resets it.

use std::cell::RefCell;

use crate::Config;

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

thread_local! {
    static CONFIG: RefCell<Config> = RefCell::new(Config::default());
}

pub(crate) fn set_config(config: Config) {
    CONFIG.with(|c| *c.borrow_mut() = config);
}

pub(crate) fn config_get(key: &str) -> Option<String> {
    CONFIG.with(|c| c.borrow().get(key).map(str::to_string))
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::Level;
    use crate::__private::bindings::rill::transform::{log as wit_log, state as wit_state};

    pub(crate) fn log(level: Level, message: &str) {
        let level = match level {
            Level::Trace => wit_log::Level::Trace,
            Level::Debug => wit_log::Level::Debug,
            Level::Info => wit_log::Level::Info,
            Level::Warn => wit_log::Level::Warn,
            Level::Error => wit_log::Level::Error,
        };
        wit_log::log(level, message);
    }

    pub(crate) fn state_get(key: &[u8]) -> Option<Vec<u8>> {
        wit_state::get(key)
    }

    pub(crate) fn state_put(key: &[u8], value: &[u8]) {
        wit_state::put(key, value);
    }

    pub(crate) fn state_delete(key: &[u8]) {
        wit_state::delete(key);
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod imp {
    use super::Level;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    thread_local! {
        pub(crate) static STATE: RefCell<BTreeMap<Vec<u8>, Vec<u8>>> = const { RefCell::new(BTreeMap::new()) };
        pub(crate) static LOGS: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
    }

    pub(crate) fn log(level: Level, message: &str) {
        LOGS.with(|l| l.borrow_mut().push((level, message.to_string())));
    }

    pub(crate) fn state_get(key: &[u8]) -> Option<Vec<u8>> {
        STATE.with(|s| s.borrow().get(key).cloned())
    }

    pub(crate) fn state_put(key: &[u8], value: &[u8]) {
        STATE.with(|s| s.borrow_mut().insert(key.to_vec(), value.to_vec()));
    }

    pub(crate) fn state_delete(key: &[u8]) {
        STATE.with(|s| s.borrow_mut().remove(key));
    }
}

pub(crate) use imp::{log, state_delete, state_get, state_put};
