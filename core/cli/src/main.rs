//! `rill`: the command-line entry point — a thin clap dispatcher.
//!
//! Owns: argument parsing (clap derive; options read their `RILL_*` environment
//! variable where one exists), logging setup, the tokio runtime, and turning any
//! failure into ONE line on stderr (`error: <what failed>: <why>. <what to do>`)
//! with exit code 1. Each subcommand lives in its own module under `cmd/` and
//! exposes `run(args) -> anyhow::Result<()>`; adding a command (e.g. `bench`) is one
//! enum variant here plus one module there.
//!
//! Invariants: stdout carries only command output (records, listings, the broker's
//! `listening on` line); logs and errors go to stderr.

mod client_args;
mod cmd;
mod report;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Rill: a distributed commit log (Kafka model) over QUIC.
#[derive(Debug, Parser)]
#[command(name = "rill", version, propagate_version = true)]
struct Cli {
    /// Log level for stderr (error, warn, info, debug, trace, or a RUST_LOG filter);
    /// overrides RUST_LOG. Default: info for `broker`, warn for client commands.
    #[arg(long, global = true, value_name = "LEVEL")]
    log_level: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a broker until SIGTERM or Ctrl-C.
    Broker(cmd::broker::BrokerArgs),
    /// Create, list, describe, alter and delete topics.
    #[command(subcommand)]
    Topic(cmd::topic::TopicCommand),
    /// Write each line of stdin as one record.
    Produce(cmd::produce::ProduceArgs),
    /// Print records of a topic, one per line.
    Consume(cmd::consume::ConsumeArgs),
    /// List, describe, reset and delete consumer groups.
    #[command(subcommand)]
    Group(cmd::group::GroupCommand),
    /// Show the cluster: brokers and cluster id.
    #[command(subcommand)]
    Cluster(cmd::cluster::ClusterCommand),
    /// Measure a running broker: produce, consume, or end-to-end latency.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Write, build, deploy and operate WebAssembly transforms.
    #[command(subcommand)]
    Transform(cmd::transform::TransformCommand),
    /// Allow principals operations on topics, groups, transforms and the
    /// cluster (enforced with `rill broker --auth mtls`).
    #[command(subcommand)]
    Acl(cmd::acl::AclCommand),
    /// Set and list per-principal produce and fetch byte rates.
    #[command(subcommand)]
    Quota(cmd::acl::QuotaCommand),
    /// Add, list and remove the SCRAM users of the Kafka listener's SASL.
    #[command(subcommand)]
    User(cmd::user::UserCommand),
    /// List and describe transactions (transactional producers' state).
    #[command(subcommand)]
    Txn(cmd::txn::TxnCommand),
    /// Issue certificates from the development CA.
    #[command(subcommand)]
    Cert(CertCommand),
    /// Issue bearer tokens for the web console (with --auth mtls).
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// A token that signs a principal into the console, for a while.
    Issue(cmd::token::IssueArgs),
}

#[derive(Debug, Subcommand)]
enum CertCommand {
    /// Issue a client certificate for a principal (or a broker's certificate).
    Issue(cmd::cert::IssueArgs),
}

impl Command {
    /// The default log level when neither --log-level nor RUST_LOG is given.
    fn default_log_level(&self) -> &'static str {
        match self {
            // openraft's state dumps are for debugging the quorum, not for
            // reading a broker's start (RUST_LOG=openraft=info brings them back).
            Command::Broker(_) => "info,openraft=warn",
            _ => "warn",
        }
    }
}

/// jemalloc instead of glibc's malloc. glibc gives freed memory back to the
/// kernel at once (trimming the heap, unmapping large blocks), so the next
/// allocation faults fresh, zeroed pages in again: with RF 3, page faults
/// were 11% of three brokers' CPU, most of them in quinn's copy of each
/// received datagram. jemalloc keeps
/// freed pages for reuse and returns them after a delay. Measured in
/// docs/BENCHMARKS.md (issue 22).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    report::init_logging(cli.log_level.as_deref(), cli.command.default_log_level());

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("rill")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            report::print_error(&anyhow::Error::new(e).context("cannot start the async runtime"));
            return ExitCode::FAILURE;
        }
    };

    let result = runtime.block_on(async move {
        match cli.command {
            Command::Broker(args) => cmd::broker::run(args).await,
            Command::Topic(c) => cmd::topic::run(c).await,
            Command::Produce(args) => cmd::produce::run(args).await,
            Command::Consume(args) => cmd::consume::run(args).await,
            Command::Group(c) => cmd::group::run(c).await,
            Command::Cluster(c) => cmd::cluster::run(c).await,
            Command::Bench(c) => cmd::bench::run(c).await,
            Command::Transform(c) => cmd::transform::run(c).await,
            Command::Acl(c) => cmd::acl::run(c).await,
            Command::Quota(c) => cmd::acl::run_quota(c).await,
            Command::User(c) => cmd::user::run(c).await,
            Command::Txn(c) => cmd::txn::run(c).await,
            Command::Cert(CertCommand::Issue(args)) => cmd::cert::run(args),
            Command::Token(TokenCommand::Issue(args)) => cmd::token::run(args),
        }
    });
    // Do not wait for stray background tasks (e.g. a client's connection driver)
    // once the command has its answer.
    runtime.shutdown_timeout(report::RUNTIME_SHUTDOWN_WAIT);

    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report::print_error(&e);
            ExitCode::FAILURE
        }
    }
}
