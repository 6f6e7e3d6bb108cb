//! One module per `rill` subcommand; each exposes its clap arguments and
//! `async fn run(args) -> anyhow::Result<()>`.

pub mod acl;
pub mod bench;
pub mod bench_group;
pub mod bench_transform;
pub mod broker;
pub mod cert;
pub mod cluster;
pub mod consume;
pub mod group;
pub mod produce;
pub mod token;
pub mod topic;
pub mod transform;
pub mod transform_host;
pub mod txn;
pub mod user;
pub mod wasm_target;
