//! The process-wide wasmtime [`Engine`] and its epoch ticker.
//!
//! Deadlines: the engine uses epoch interruption; one thread bumps the epoch
//! every [`EPOCH_TICK`], and each call into a guest sets its deadline in ticks
//! (see `instance.rs`), so a guest that runs too long traps within one tick of
//! its deadline, at a cost of a load and compare per loop back-edge (cheaper
//! than fuel).

use std::sync::OnceLock;
use std::time::Duration;

use wasmtime::{Config, Engine};

/// How often the epoch advances: the resolution of call deadlines.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

static ENGINE: OnceLock<Engine> = OnceLock::new();

/// The shared engine (created, with its ticker thread, on first use).
pub fn engine() -> &'static Engine {
    ENGINE.get_or_init(|| {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        let engine = Engine::new(&config).expect("the wasmtime configuration is valid");
        let ticker = engine.clone();
        std::thread::Builder::new()
            .name("rill-wasm-epoch".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(EPOCH_TICK);
                    ticker.increment_epoch();
                }
            })
            .expect("spawning the epoch ticker thread");
        engine
    })
}

/// A deadline in epoch ticks, at least one.
pub(crate) fn ticks(deadline: Duration) -> u64 {
    (deadline.as_micros() / EPOCH_TICK.as_micros()).max(1) as u64
}
