//! rill-transforms: the host that runs user WebAssembly transforms.
//!
//! What it is: a transform is a WebAssembly component implementing the world
//! `rill:transform/transform@0.2.0` (sdk/wit/transform.wit; write one with
//! rill-sdk). This crate validates and compiles such a module
//! ([`TransformModule`]), runs an instance of it per input partition with a
//! memory cap over all its memories and tables and a deadline per call
//! ([`TransformInstance`], [`limits`]), and runs a
//! deployed transform over its input topics with the client library, writing
//! its outputs, its dead letters and its state changelog ([`Runner`],
//! [`worker::run_deployment`]). The [`supervisor`] watches the deployments in
//! `__transforms`, checks each against the host's maxima ([`HostMaxima`]) and
//! runs those that are valid and should run; every `rill broker` runs one,
//! and so does `rill transform run`.
//!
//! What it is not: not part of the broker's data path (it is a client of the
//! cluster like any other), and not transactional: delivery is at least once,
//! and a restart writes no output or state write twice (`checkpoint.rs`), but a
//! worker that lost its partitions is not fenced.
//!
//! Invariants: an input offset is committed only after every output of the
//! records before it is acknowledged and their state writes are in the
//! changelog; a record that fails is handled by the deployment's policy exactly
//! once per attempt and never retried in a loop; the state writes of a failed
//! record are dropped; every queue is bounded (commit points in flight, log
//! lines, state size, module size).

pub mod batch;
pub mod checkpoint;
pub mod deployment;
pub mod engine;
pub mod error;
pub mod instance;
pub mod limits;
pub mod module;
pub mod registry;
pub mod runner;
pub mod state;
pub mod supervisor;
pub mod wit;
pub mod worker;

pub use batch::{Processed, TransformOutput};
pub use deployment::{Deployment, ErrorPolicy, RunState, StartFrom};
pub use error::TransformError;
pub use instance::{Limits, LogLine, TransformInstance};
pub use limits::{HostMaxima, InstanceLimiter};
pub use module::TransformModule;
pub use runner::{RunEnd, Runner};
pub use state::StateStore;
