//! One running instance of a transform module (one per input partition): a
//! wasmtime store with a memory cap (all the instance's memories and tables
//! together: [`InstanceLimiter`]), an epoch deadline per call, the instance's
//! state and its log lines.
//!
//! Failure handling: a batch is processed in one call (its records laid out as
//! in `batch.rs`). If every record succeeds, the state writes of the call are
//! applied. If any record fails (an error result, a trap, the deadline or the
//! memory cap), the call's state
//! writes are dropped, a trapped instance is replaced by a fresh one (same
//! state, `init` run again), and the batch is run again one record per call, so
//! each failing record is identified alone and every other record's effects
//! count exactly once. A record that fails alone is reported as failed; it is
//! never retried by this layer, so a poison record cannot loop.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rill_client::ConsumerRecord;
use wasmtime::component::ResourceTable;
use wasmtime::{Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::batch::{InputBuffer, Processed, decode, decode_v0_1};
use crate::engine::{engine, ticks};
use crate::error::TransformError;
use crate::limits::{CAP_EXCEEDED, InstanceLimiter};
use crate::module::{ContractPre, TransformModule};
use crate::state::StateStore;
use crate::wit::{Level, Transform, rill, v0_1};

/// Default memory cap of one instance.
pub const MEMORY_BYTES_MAX_DEFAULT: usize = 64 * 1024 * 1024;
/// Default deadline of one call into the guest (one batch, or one record).
pub const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);
/// Bound on the guest's stderr kept per instance (panic messages).
pub const STDERR_BYTES_MAX: usize = 64 * 1024;
/// Bound on log lines buffered between two flushes; later lines are counted, not kept.
pub const LOG_LINES_BUFFERED_MAX: usize = 1024;
/// Longer log lines are cut to this many bytes.
pub const LOG_LINE_BYTES_MAX: usize = 4096;

/// Limits of one instance.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Cap on all the instance's memories and tables together.
    pub memory_bytes_max: usize,
    pub call_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory_bytes_max: MEMORY_BYTES_MAX_DEFAULT,
            call_timeout: CALL_TIMEOUT_DEFAULT,
        }
    }
}

/// A log line written by a guest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogLine {
    pub timestamp_ms: i64,
    pub level: String,
    pub message: String,
}

/// The store's data: WASI (no files, network or environment), limits, state, logs.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: InstanceLimiter,
    pub(crate) state: StateStore,
    pub(crate) logs: Vec<LogLine>,
    pub(crate) logs_dropped: u64,
}

impl std::fmt::Debug for HostState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostState")
            .field("state_keys", &self.state.len())
            .field("logs", &self.logs.len())
            .finish_non_exhaustive()
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl rill::transform::types::Host for HostState {}
impl v0_1::rill::transform::types::Host for HostState {}

// Contract 0.1.0's imports are the same functions.
impl v0_1::rill::transform::log::Host for HostState {
    fn log(
        &mut self,
        level: v0_1::rill::transform::log::Level,
        message: String,
    ) -> wasmtime::Result<()> {
        use v0_1::rill::transform::log::Level as Old;
        let level = match level {
            Old::Trace => Level::Trace,
            Old::Debug => Level::Debug,
            Old::Info => Level::Info,
            Old::Warn => Level::Warn,
            Old::Error => Level::Error,
        };
        rill::transform::log::Host::log(self, level, message)
    }
}

impl v0_1::rill::transform::state::Host for HostState {
    fn get(&mut self, key: Vec<u8>) -> wasmtime::Result<Option<Vec<u8>>> {
        rill::transform::state::Host::get(self, key)
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> wasmtime::Result<()> {
        rill::transform::state::Host::put(self, key, value)
    }

    fn delete(&mut self, key: Vec<u8>) -> wasmtime::Result<()> {
        rill::transform::state::Host::delete(self, key)
    }
}

impl rill::transform::log::Host for HostState {
    fn log(&mut self, level: Level, mut message: String) -> wasmtime::Result<()> {
        if self.logs.len() >= LOG_LINES_BUFFERED_MAX {
            self.logs_dropped += 1;
            return Ok(());
        }
        if message.len() > LOG_LINE_BYTES_MAX {
            let mut cut = LOG_LINE_BYTES_MAX;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str("...");
        }
        let level = match level {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        };
        self.logs.push(LogLine {
            timestamp_ms: now_ms(),
            level: level.into(),
            message,
        });
        Ok(())
    }
}

impl rill::transform::state::Host for HostState {
    fn get(&mut self, key: Vec<u8>) -> wasmtime::Result<Option<Vec<u8>>> {
        Ok(self.state.get(&key))
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> wasmtime::Result<()> {
        self.state
            .write(key, Some(value))
            .map_err(wasmtime::Error::msg)
    }

    fn delete(&mut self, key: Vec<u8>) -> wasmtime::Result<()> {
        self.state.write(key, None).map_err(wasmtime::Error::msg)
    }
}

/// An instantiated module, by the contract version it was built for.
enum Bindings {
    Current(Transform),
    V0_1(v0_1::Transform),
}

/// A running instance.
pub struct TransformInstance {
    module: Arc<TransformModule>,
    name: String,
    config: Vec<(String, String)>,
    limits: Limits,
    store: Store<HostState>,
    bindings: Bindings,
    stderr: MemoryOutputPipe,
    /// The input side of a call, kept between calls.
    input: InputBuffer,
    /// Instances created so far (1 + replacements after traps).
    pub generation: u64,
}

impl std::fmt::Debug for TransformInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransformInstance")
            .field("name", &self.name)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl TransformInstance {
    /// Instantiates `module` with `state` and runs its `init` with `config`.
    pub fn new(
        module: Arc<TransformModule>,
        name: &str,
        config: Vec<(String, String)>,
        limits: Limits,
        state: StateStore,
    ) -> Result<TransformInstance, TransformError> {
        let (store, bindings, stderr) = instantiate(&module, name, &config, limits, state)?;
        Ok(TransformInstance {
            module,
            name: name.to_string(),
            config,
            limits,
            store,
            bindings,
            stderr,
            input: InputBuffer::default(),
            generation: 1,
        })
    }

    /// Processes records of one partition (`topic`, `partition`), in order:
    /// one result per record, or, with `stop_at_failure`, results up to and
    /// including the first failure (the records after it are not run, so they
    /// leave no state behind). Err only when a fresh instance cannot be made
    /// (init fails).
    pub fn process(
        &mut self,
        topic: &str,
        partition: u32,
        records: &[ConsumerRecord],
        stop_at_failure: bool,
    ) -> Result<Processed, TransformError> {
        if records.is_empty() {
            return Ok(Processed::default());
        }
        match self.attempt(topic, partition, records)? {
            Ok(p) if p.all_ok() || records.len() == 1 => return Ok(p),
            Err(trap) if records.len() == 1 => return Ok(Processed::all_failed(1, &trap)),
            _ => {}
        }
        // Something failed in the batch: one record per call.
        let mut out = Processed::default();
        for one in records.chunks(1) {
            let p = self
                .attempt(topic, partition, one)?
                .unwrap_or_else(|trap| Processed::all_failed(1, &trap));
            let failed = !p.all_ok();
            out.append(p);
            if failed && stop_at_failure {
                break;
            }
        }
        Ok(out)
    }

    /// One call whose state writes are kept only if every record succeeded; a
    /// trapped instance is replaced by a fresh one. The inner Err describes
    /// the trap; the outer one is a replacement that could not be made.
    fn attempt(
        &mut self,
        topic: &str,
        partition: u32,
        records: &[ConsumerRecord],
    ) -> Result<Result<Processed, String>, TransformError> {
        match self.call(topic, partition, records) {
            Ok(p) => {
                let state = &mut self.store.data_mut().state;
                if p.all_ok() {
                    state.commit_call();
                } else {
                    state.rollback_call();
                }
                Ok(Ok(p))
            }
            Err(trap) => {
                self.store.data_mut().state.rollback_call();
                self.replace()?;
                Ok(Err(trap))
            }
        }
    }

    /// One call into the guest under the deadline; Err describes a trap. An
    /// answer that breaks the contract fails every record of the call.
    fn call(
        &mut self,
        topic: &str,
        partition: u32,
        records: &[ConsumerRecord],
    ) -> Result<Processed, String> {
        self.store
            .set_epoch_deadline(ticks(self.limits.call_timeout));
        let answer = match &self.bindings {
            Bindings::Current(b) => {
                self.input.fill(records);
                b.call_process(&mut self.store, self.input.batch(topic, partition))
                    .map(|out| decode(out, records.len()))
            }
            Bindings::V0_1(b) => call_v0_1(b, &mut self.store, topic, partition, records),
        }
        .map_err(|e| describe_trap(&e, &self.stderr, self.limits))?;
        Ok(answer.unwrap_or_else(|e| {
            Processed::all_failed(
                records.len(),
                &format!("the module's answer breaks its contract: {e}"),
            )
        }))
    }

    /// Replaces a trapped instance by a fresh one with the same state.
    fn replace(&mut self) -> Result<(), TransformError> {
        let data = self.store.data_mut();
        let state = std::mem::take(&mut data.state);
        let logs = std::mem::take(&mut data.logs);
        let dropped = data.logs_dropped;
        let (store, bindings, stderr) =
            instantiate(&self.module, &self.name, &self.config, self.limits, state)?;
        self.store = store;
        self.bindings = bindings;
        self.stderr = stderr;
        self.generation += 1;
        let data = self.store.data_mut();
        data.logs = logs;
        data.logs_dropped = dropped;
        Ok(())
    }

    /// The instance's state (to restore into, and to take changelog writes from).
    pub fn state_mut(&mut self) -> &mut StateStore {
        &mut self.store.data_mut().state
    }

    /// Log lines written since the last take, and how many were dropped.
    pub fn take_logs(&mut self) -> (Vec<LogLine>, u64) {
        let data = self.store.data_mut();
        (
            std::mem::take(&mut data.logs),
            std::mem::take(&mut data.logs_dropped),
        )
    }
}

/// A 0.1.0 module's `process`: each record's fields lent as lists of their own.
fn call_v0_1(
    bindings: &v0_1::Transform,
    store: &mut Store<HostState>,
    topic: &str,
    partition: u32,
    records: &[ConsumerRecord],
) -> wasmtime::Result<Result<Processed, String>> {
    let headers: Vec<Vec<v0_1::HeaderParam<'_>>> = records
        .iter()
        .map(|r| {
            r.headers
                .iter()
                .map(|h| v0_1::HeaderParam {
                    key: &h.key,
                    value: &h.value,
                })
                .collect()
        })
        .collect();
    let inputs: Vec<v0_1::InputRecord<'_>> = records
        .iter()
        .zip(&headers)
        .map(|(r, headers)| v0_1::InputRecord {
            topic,
            partition,
            offset: r.offset.0,
            timestamp_ms: r.timestamp_ms,
            key: r.key.as_deref(),
            value: r.value.as_deref(),
            headers,
        })
        .collect();
    let results = bindings.call_process(store, &inputs)?;
    Ok(decode_v0_1(results, records.len()))
}

fn instantiate(
    module: &TransformModule,
    name: &str,
    config: &[(String, String)],
    limits: Limits,
    state: StateStore,
) -> Result<(Store<HostState>, Bindings, MemoryOutputPipe), TransformError> {
    let stderr = MemoryOutputPipe::new(STDERR_BYTES_MAX);
    let wasi = WasiCtx::builder().stderr(stderr.clone()).build();
    let host = HostState {
        wasi,
        table: ResourceTable::new(),
        limits: InstanceLimiter::new(limits.memory_bytes_max),
        state,
        logs: Vec::new(),
        logs_dropped: 0,
    };
    let mut store = Store::new(engine(), host);
    store.limiter(|s| &mut s.limits);
    store.epoch_deadline_trap();
    store.set_epoch_deadline(ticks(limits.call_timeout));
    let fail = |message: String| TransformError::Instance {
        name: name.to_string(),
        message,
    };
    let bindings = match &module.pre {
        ContractPre::Current(pre) => pre.instantiate(&mut store).map(Bindings::Current),
        ContractPre::V0_1(pre) => pre.instantiate(&mut store).map(Bindings::V0_1),
    }
    .map_err(|e| {
        fail(format!(
            "instantiating the module failed: {}",
            describe_trap(&e, &stderr, limits)
        ))
    })?;
    store.set_epoch_deadline(ticks(limits.call_timeout));
    let config: Vec<(&str, &str)> = config
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let init = match &bindings {
        Bindings::Current(b) => b.call_init(&mut store, &config),
        Bindings::V0_1(b) => b.call_init(&mut store, &config),
    };
    match init {
        Ok(Ok(())) => {}
        Ok(Err(msg)) => return Err(fail(format!("init refused the configuration: {msg}"))),
        Err(e) => {
            return Err(fail(format!(
                "init trapped: {}",
                describe_trap(&e, &stderr, limits)
            )));
        }
    }
    // init may not write state: it runs again after every trap.
    store.data_mut().state.rollback_call();
    Ok((store, bindings, stderr))
}

/// A trap as a user reads it: which limit, or the guest's panic message.
fn describe_trap(e: &wasmtime::Error, stderr: &MemoryOutputPipe, limits: Limits) -> String {
    let panic = last_panic(&stderr.contents());
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => format!(
            "the call exceeded its deadline of {} ms (a loop that does not end, or too much work per record)",
            limits.call_timeout.as_millis()
        ),
        _ => {
            let text = format!("{e:#}");
            if text.contains(CAP_EXCEEDED)
                || text.contains("growing memory")
                || text.contains("memory growth failure")
            {
                format!(
                    "the module exceeded its memory cap of {} bytes (all its memories and tables together)",
                    limits.memory_bytes_max
                )
            } else if text.contains("resource limit exceeded") {
                format!(
                    "the module creates more core instances, memories or tables than a transform may \
                     (at most {}, {} and {}): {}",
                    crate::limits::CORE_INSTANCES_MAX,
                    crate::limits::MEMORIES_MAX,
                    crate::limits::TABLES_MAX,
                    first_line(&text)
                )
            } else if let Some(panic) = panic {
                format!("the module panicked: {panic}")
            } else {
                format!("the module trapped: {}", first_line(&text))
            }
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// The last `panicked at ...` message the guest wrote to stderr, on one line.
fn last_panic(stderr: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stderr);
    let at = text.rfind("panicked at ")?;
    let msg: Vec<&str> = text[at..]
        .lines()
        .take_while(|l| !l.starts_with("note:"))
        .take(4)
        .collect();
    Some(msg.join(" ").trim().to_string())
}
