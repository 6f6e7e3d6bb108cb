//! `rill transform`: write, build, deploy and operate WebAssembly transforms.
//!
//! new/build work on a transform crate on disk (cargo for wasm32-wasip2);
//! deploy validates the module locally (the same check the runners make) and
//! stores it in `__transforms`, from where every broker's supervisor (and every
//! `rill transform run` worker) runs it; list/describe/logs read the
//! deployments, the instances' status and their log lines back from the
//! cluster; pause/resume/delete change the stored deployment.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::{Args, Subcommand};
use rill_transforms::deployment::{
    Deployment, ErrorPolicy, RunState, StartFrom, dlq_topic, parse_config_entry, state_topic,
    validate_name,
};
use rill_transforms::instance::{CALL_TIMEOUT_DEFAULT, MEMORY_BYTES_MAX_DEFAULT, now_ms};
use rill_transforms::registry::{
    self, STATUS_TOPIC, ensure_internal_topic, ensure_internal_topics, ensure_topic,
    load_deployment, load_deployments, load_logs, load_status, store_deployment,
};
use rill_transforms::{TransformModule, supervisor};

use super::wasm_target;
use crate::client_args::ClientArgs;

/// An instance whose status is older than this is shown as gone.
const STATUS_STALE_MS: i64 = 10_000;
/// How long `delete` waits for the group to empty before deleting it.
const GROUP_DELETE_WAIT: Duration = Duration::from_secs(10);
/// How long `deploy` waits for an instance to report the new version.
const DEPLOY_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Subcommand)]
pub enum TransformCommand {
    /// Create a transform crate NAME (in the current directory) that builds.
    New(NewArgs),
    /// Build the transform crate in DIR for wasm32-wasip2; prints the .wasm path.
    Build(BuildArgs),
    /// Validate a .wasm transform and deploy it (it starts at once).
    Deploy(DeployArgs),
    /// List the deployed transforms.
    List(ClientOnly),
    /// Show a transform: state, instances, processed and failed counts, lag.
    Describe(NameArgs),
    /// Stop a transform, keeping its offsets and state.
    Pause(NameArgs),
    /// Start a paused or halted transform again.
    Resume(NameArgs),
    /// Remove a transform, its state topic, group (offsets) and status.
    Delete(NameArgs),
    /// Print a transform's log lines (times in UTC).
    Logs(LogsArgs),
    /// Run transforms in this process (a worker beside the brokers) until Ctrl-C.
    Run(ClientOnly),
}

#[derive(Debug, Args)]
pub struct NewArgs {
    /// The transform's name (also the crate's and the directory's).
    pub name: String,
    /// The rill-sdk crate to depend on (default: the one this rill was built with).
    #[arg(long, value_name = "DIR")]
    pub sdk: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The transform crate (default: the current directory).
    pub dir: Option<PathBuf>,
    /// Build with the crate's Cargo.lock as it is (cargo --locked).
    #[arg(long)]
    pub locked: bool,
}

#[derive(Debug, Args)]
pub struct DeployArgs {
    /// The component built by `rill transform build`.
    pub file: PathBuf,
    /// The transform's name: letters, digits, '.', '_', '-'.
    #[arg(long)]
    pub name: String,
    /// An input topic (repeat for several).
    #[arg(long = "input", value_name = "TOPIC", required = true)]
    pub inputs: Vec<String>,
    /// An output topic (repeat for several; the first is the default). Default: NAME.
    #[arg(long = "output", value_name = "TOPIC")]
    pub outputs: Vec<String>,
    /// What to do with a record the module fails on.
    #[arg(
        long,
        default_value = "dead-letter",
        value_name = "skip|dead-letter|halt"
    )]
    pub on_error: ErrorPolicy,
    /// Configuration handed to the module's init (repeat).
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_config_entry)]
    pub config: Vec<(String, String)>,
    /// Where to start in partitions without committed progress.
    #[arg(long, default_value = "earliest", value_name = "earliest|latest")]
    pub from: StartFrom,
    /// Memory cap of one instance, in MiB.
    #[arg(long, value_name = "MIB")]
    pub memory_mb: Option<u64>,
    /// Deadline of one call into the module, in milliseconds.
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// exactly-once (the default): each input partition's outputs, state
    /// and input offsets commit together in transactions, a new owner of a
    /// partition fences the old one, and read-committed readers see every
    /// output once, whatever fails; at-least-once: outputs, then state and
    /// input offsets are committed (no transaction, lower latency; restarts
    /// write no output twice, a paused zombie can).
    #[arg(
        long,
        default_value = "exactly-once",
        value_name = "exactly-once|at-least-once"
    )]
    pub delivery: String,
    /// With exactly-once delivery: how often each input partition's
    /// transaction commits (the outputs' latency to read-committed readers).
    #[arg(long, value_name = "MS", default_value_t = rill_transforms::deployment::DEFAULT_COMMIT_INTERVAL_MS)]
    pub commit_interval_ms: u64,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct NameArgs {
    /// The transform's name.
    pub name: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The transform's name.
    pub name: String,
    /// Keep printing new lines as they come, until Ctrl-C.
    #[arg(long, short = 'f')]
    pub follow: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct ClientOnly {
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(cmd: TransformCommand) -> anyhow::Result<()> {
    match cmd {
        TransformCommand::New(a) => new(a),
        TransformCommand::Build(a) => {
            let wasm = build(a.dir.as_deref().unwrap_or(Path::new(".")), a.locked)?;
            println!("{}", wasm.display());
            Ok(())
        }
        TransformCommand::Deploy(a) => deploy(a).await,
        TransformCommand::List(a) => list(a).await,
        TransformCommand::Describe(a) => describe(a).await,
        TransformCommand::Pause(a) => set_state(a, RunState::Paused).await,
        TransformCommand::Resume(a) => set_state(a, RunState::Running).await,
        TransformCommand::Delete(a) => delete(a).await,
        TransformCommand::Logs(a) => logs(a).await,
        TransformCommand::Run(a) => worker(a).await,
    }
}

/// The SDK this binary was built beside (the repository's sdk/).
fn default_sdk() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk");
    p.canonicalize()
        .ok()
        .filter(|p| p.join("Cargo.toml").exists())
}

fn new(a: NewArgs) -> anyhow::Result<()> {
    validate_name(&a.name)?;
    if !a
        .name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        || a.name.contains('.')
    {
        bail!(
            "transform crate name {:?} must start with a letter and use only letters, digits, '-' or '_'",
            a.name
        );
    }
    let sdk = match a.sdk.or_else(default_sdk) {
        Some(p) => p
            .canonicalize()
            .with_context(|| format!("no rill-sdk at {}", p.display()))?,
        None => {
            bail!("cannot find rill-sdk: pass --sdk DIR (the sdk/ folder of the Rill repository)")
        }
    };
    let dir = PathBuf::from(&a.name);
    if dir.exists() {
        bail!(
            "{} exists already: pick another name or remove it",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir.join("src"))
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let crate_name = a.name.replace('-', "_");
    std::fs::write(dir.join("Cargo.toml"), scaffold_manifest(&a.name, &sdk))?;
    std::fs::write(dir.join("src/lib.rs"), scaffold_lib(&crate_name))?;
    std::fs::write(dir.join(".gitignore"), "/target\n")?;
    println!("created transform crate {}", dir.display());
    println!("  test it:   cd {} && cargo test", a.name);
    println!("  build it:  rill transform build {}", a.name);
    Ok(())
}

fn scaffold_manifest(name: &str, sdk: &Path) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
rill-sdk = {{ path = "{}" }}

[profile.release]
lto = true
strip = true
codegen-units = 1

# A transform crate builds for wasm32-wasip2 on its own (not in another workspace).
[workspace]
"#,
        sdk.display()
    )
}

fn scaffold_lib(crate_name: &str) -> String {
    format!(
        r#"//! The {crate_name} transform: upper-cases each record's value.
//!
//! Test it natively with `cargo test`; build it with `rill transform build`.

use rill_sdk::{{Output, Record}};

#[rill_sdk::transform]
fn {crate_name}(record: Record) -> Result<Option<Output>, String> {{
    // A tombstone (no value) is dropped.
    let Some(text) = record.value_str()? else {{
        return Ok(None);
    }};
    rill_sdk::log::debug(format!("offset {{}}", record.offset));
    Ok(Some(Output::new(text.to_uppercase()).key_opt(record.key)))
}}

#[cfg(test)]
mod tests {{
    use super::*;

    #[test]
    fn upper_cases_the_value_and_keeps_the_key() {{
        let out = {crate_name}(Record::new("hello").with_key("k")).unwrap().unwrap();
        assert_eq!(out.value.as_deref(), Some(&b"HELLO"[..]));
        assert_eq!(out.key.as_deref(), Some(&b"k"[..]));
    }}
}}
"#
    )
}

/// Runs cargo for wasm32-wasip2 in `dir` and returns the component it wrote.
pub fn build(dir: &Path, locked: bool) -> anyhow::Result<PathBuf> {
    if !dir.join("Cargo.toml").exists() {
        bail!(
            "{} has no Cargo.toml: pass the transform crate's directory (`rill transform new NAME` makes one)",
            dir.display()
        );
    }
    wasm_target::ensure_installed(dir, &wasm_target::Toolchain::from_env())?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut child = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--message-format=json-render-diagnostics",
        ])
        .args(locked.then_some("--locked"))
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot run cargo: is the Rust toolchain installed?")?;
    let mut wasm = None;
    let stdout = child.stdout.take().expect("piped");
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && let Some(files) = msg["filenames"].as_array()
        {
            for f in files.iter().filter_map(|f| f.as_str()) {
                if f.ends_with(".wasm") {
                    wasm = Some(PathBuf::from(f));
                }
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!(
            "cargo build --target wasm32-wasip2 failed in {} (its errors are above)",
            dir.display()
        );
    }
    wasm.ok_or_else(|| {
        anyhow!(
            "cargo wrote no .wasm in {}: the crate needs `crate-type = [\"cdylib\"]` under [lib]",
            dir.display()
        )
    })
}

async fn deploy(a: DeployArgs) -> anyhow::Result<()> {
    validate_name(&a.name)?;
    let module = std::fs::read(&a.file)
        .with_context(|| format!("cannot read the module {}", a.file.display()))?;
    let compiled = TransformModule::compile(&module)
        .with_context(|| format!("cannot deploy {}", a.file.display()))?;
    if compiled.contract_version() != rill_transforms::wit::CONTRACT_VERSION {
        eprintln!(
            "note: {} was built for contract {}; it runs, but rebuilt with this rill-sdk ({}) it passes records in batches, faster: `rill transform build DIR`",
            a.file.display(),
            compiled.contract_version(),
            rill_transforms::wit::CONTRACT_VERSION
        );
    }
    let outputs = if a.outputs.is_empty() {
        vec![a.name.clone()]
    } else {
        a.outputs.clone()
    };
    let client = a.client.connect().await?;
    ensure_internal_topics(&client).await?;
    let previous = load_deployments(&client).await?.remove(&a.name);
    let mut d = Deployment {
        name: a.name.clone(),
        inputs: a.inputs.clone(),
        outputs,
        on_error: a.on_error,
        from: a.from,
        config: a.config.clone(),
        state: RunState::Running,
        version: previous.as_ref().map_or(1, |p| p.version + 1),
        deployed_at_ms: now_ms(),
        memory_bytes_max: a
            .memory_mb
            .map_or(MEMORY_BYTES_MAX_DEFAULT as u64, |m| m * 1024 * 1024),
        call_timeout_ms: a
            .timeout_ms
            .unwrap_or(CALL_TIMEOUT_DEFAULT.as_millis() as u64),
        delivery: match a.delivery.as_str() {
            "at-least-once" => rill_transforms::deployment::Delivery::AtLeastOnce,
            "exactly-once" => {
                if a.commit_interval_ms == 0 || a.commit_interval_ms > 60_000 {
                    bail!(
                        "--commit-interval-ms {} must be in 1..=60000",
                        a.commit_interval_ms
                    );
                }
                rill_transforms::deployment::Delivery::ExactlyOnce {
                    commit_interval_ms: a.commit_interval_ms,
                }
            }
            other => bail!("--delivery {other:?}: use at-least-once or exactly-once"),
        },
        module,
        owner: None,
    };
    d.validate()?;
    let mut partitions_max = 1;
    for input in &d.inputs {
        let n = client.partition_count(input).await.map_err(|e| match e {
            rill_client::ClientError::UnknownTopic(t) => {
                anyhow!("input topic {t} does not exist: create it with `rill topic create {t}`")
            }
            other => other.into(),
        })?;
        partitions_max = partitions_max.max(n);
    }
    let mut created = Vec::new();
    for out in &d.outputs {
        if ensure_topic(&client, out, partitions_max, vec![]).await? {
            created.push(out.clone());
        }
    }
    if d.on_error == ErrorPolicy::DeadLetter
        && ensure_topic(&client, &dlq_topic(&d.name), 1, vec![]).await?
    {
        created.push(dlq_topic(&d.name));
    }
    let compact = vec![("cleanup.policy".to_string(), "compact".to_string())];
    ensure_internal_topic(&client, &state_topic(&d.name), partitions_max, compact).await?;
    d.module.shrink_to_fit();
    let runs_as = store_deployment(&client, &d, None).await?;
    println!(
        "deployed transform {} version {} ({} bytes): {} -> {} (on error: {}; group {}; runs as {runs_as})",
        d.name,
        d.version,
        d.module.len(),
        d.inputs.join(", "),
        d.outputs.join(", "),
        d.on_error,
        d.group_id()
    );
    if !created.is_empty() {
        println!("created topics: {}", created.join(", "));
    }
    let deadline = tokio::time::Instant::now() + DEPLOY_WAIT;
    while tokio::time::Instant::now() < deadline {
        let status = load_status(&client, &d.name).await?;
        if status
            .iter()
            .any(|s| s.version == d.version && s.state == "running")
        {
            println!("running");
            return Ok(());
        }
        if let Some(refused) = status
            .iter()
            .find(|s| s.version == d.version && s.state == rill_transforms::registry::REFUSED)
        {
            bail!(
                "transform {} version {} was refused by {}: {}. The deployment is stored but not run there; deploy it again within the limits",
                d.name,
                d.version,
                refused.instance,
                refused.last_error.as_deref().unwrap_or("no reason given")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "warning: no instance reported version {} within {DEPLOY_WAIT:?}: is a `rill broker` (or `rill transform run`) running? `rill transform describe {}` shows its state",
        d.version, d.name
    );
    Ok(())
}

async fn list(a: ClientOnly) -> anyhow::Result<()> {
    let client = a.client.connect().await?;
    let all = load_deployments(&client).await?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<24} {:<8} {:<10} {:<12} {:<24} OUTPUTS",
        "NAME", "VERSION", "STATE", "ON-ERROR", "INPUTS"
    )?;
    for d in all.values() {
        let state = match &d.state {
            RunState::Halted { .. } => "halted".to_string(),
            s => s.to_string(),
        };
        writeln!(
            out,
            "{:<24} {:<8} {:<10} {:<12} {:<24} {}",
            d.name,
            d.version,
            state,
            d.on_error.to_string(),
            d.inputs.join(","),
            d.outputs.join(",")
        )?;
    }
    Ok(())
}

async fn describe(a: NameArgs) -> anyhow::Result<()> {
    let client = a.client.connect().await?;
    let d = load_deployment(&client, &a.name).await?;
    let status = load_status(&client, &a.name).await?;
    let now = now_ms();
    let mut out = std::io::stdout().lock();
    writeln!(out, "transform {} (version {})", d.name, d.version)?;
    writeln!(out, "  state:      {}", d.state)?;
    writeln!(
        out,
        "  runs as:    {}",
        d.owner
            .as_deref()
            .unwrap_or("(no principal recorded: deployed by an older Rill; deploy it again)")
    )?;
    writeln!(out, "  inputs:     {}", d.inputs.join(", "))?;
    writeln!(out, "  outputs:    {}", d.outputs.join(", "))?;
    writeln!(
        out,
        "  on error:   {}{}",
        d.on_error,
        if d.on_error == ErrorPolicy::DeadLetter {
            format!(" (to {})", d.dlq_topic())
        } else {
            String::new()
        }
    )?;
    writeln!(out, "  delivery:   {}", d.delivery)?;
    writeln!(out, "  group:      {}", d.group_id())?;
    writeln!(out, "  state topic: {}", d.state_topic())?;
    writeln!(
        out,
        "  limits:     {} MiB memory, {} ms per call",
        d.memory_bytes_max / (1024 * 1024),
        d.call_timeout_ms
    )?;
    // The contract the module was built for, as its instances report it.
    let contract = status
        .iter()
        .filter(|s| s.version == d.version)
        .find_map(|s| s.contract.as_deref());
    match contract {
        Some(c) if c != rill_transforms::wit::CONTRACT_VERSION => writeln!(
            out,
            "  module:     {} bytes, contract {c} (rebuilt with this rill-sdk it runs faster: contract {})",
            d.module.len(),
            rill_transforms::wit::CONTRACT_VERSION
        )?,
        Some(c) => writeln!(out, "  module:     {} bytes, contract {c}", d.module.len())?,
        None => writeln!(out, "  module:     {} bytes", d.module.len())?,
    }
    if !d.config.is_empty() {
        let cfg: Vec<String> = d.config.iter().map(|(k, v)| format!("{k}={v}")).collect();
        writeln!(out, "  config:     {}", cfg.join(" "))?;
    }
    let (mut processed, mut failed, mut lag) = (0, 0, 0);
    for s in &status {
        processed += s.processed;
        failed += s.failed;
        if now - s.updated_ms <= STATUS_STALE_MS && s.state == "running" {
            lag += s.lag;
        }
    }
    writeln!(out, "  processed:  {processed}")?;
    writeln!(out, "  failed:     {failed}")?;
    writeln!(out, "  lag:        {lag}")?;
    writeln!(out, "  instances:")?;
    if status.is_empty() {
        writeln!(out, "    (none has reported yet)")?;
    }
    for s in &status {
        let live = now - s.updated_ms <= STATUS_STALE_MS;
        let state = if live || s.state != "running" {
            s.state.clone()
        } else {
            "gone".into()
        };
        writeln!(
            out,
            "    {} v{} {}: partitions [{}] processed={} failed={} dead_lettered={} skipped={} outputs={} lag={}",
            s.instance,
            s.version,
            state,
            s.partitions.join(","),
            s.processed,
            s.failed,
            s.dead_lettered,
            s.skipped,
            s.outputs,
            s.lag
        )?;
        if let Some(e) = &s.last_error {
            writeln!(out, "      last error: {e}")?;
        }
    }
    Ok(())
}

async fn set_state(a: NameArgs, state: RunState) -> anyhow::Result<()> {
    let client = a.client.connect().await?;
    let mut d = load_deployment(&client, &a.name).await?;
    if d.state == state {
        println!("transform {} is {} already", d.name, d.state);
        return Ok(());
    }
    d.state = state;
    // Written again as the caller: it runs with the caller's rights from now.
    let runs_as = store_deployment(&client, &d, None).await?;
    println!("transform {} is {} (runs as {runs_as})", d.name, d.state);
    if let Some(before) = d.owner.as_deref().filter(|b| *b != runs_as) {
        eprintln!(
            "note: transform {} ran as {before}; it runs as {runs_as} from now, with {runs_as}'s rights",
            d.name
        );
    }
    Ok(())
}

async fn delete(a: NameArgs) -> anyhow::Result<()> {
    let client = a.client.connect().await?;
    let d = load_deployment(&client, &a.name).await?;
    registry::delete_deployment(&client, &d.name).await?;
    let status: Vec<String> = load_status(&client, &d.name)
        .await?
        .iter()
        .map(|s| s.key())
        .collect();
    if let Err(e) = registry::delete_keys(&client, STATUS_TOPIC, &status).await {
        // Needs alter on the cluster with --auth mtls; the records are only
        // what the instances last reported.
        eprintln!("note: the instances' last status records stay in {STATUS_TOPIC} ({e})");
    }
    // The runners leave the group once they see the tombstone; then it can go.
    let deadline = tokio::time::Instant::now() + GROUP_DELETE_WAIT;
    loop {
        match client.admin().delete_group(&d.group_id()).await {
            Ok(()) => break,
            Err(e) if e.code() == Some(rill_client::ErrorCode::GroupIdNotFound) => break,
            Err(e) if tokio::time::Instant::now() >= deadline => {
                eprintln!(
                    "warning: could not delete group {} ({e}); `rill group delete {}` removes its offsets",
                    d.group_id(),
                    d.group_id()
                );
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
    match client.admin().delete_topic(&d.state_topic()).await {
        Ok(()) => {}
        Err(rill_client::ClientError::UnknownTopic(_)) => {}
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!("cannot delete {}", d.state_topic())));
        }
    }
    println!(
        "deleted transform {} (its outputs{} are kept)",
        d.name,
        if d.on_error == ErrorPolicy::DeadLetter {
            format!(" and {}", d.dlq_topic())
        } else {
            String::new()
        }
    );
    Ok(())
}

async fn logs(a: LogsArgs) -> anyhow::Result<()> {
    let client = a.client.connect().await?;
    load_deployment(&client, &a.name).await?;
    if !a.follow {
        let mut out = std::io::stdout().lock();
        for l in load_logs(&client, &a.name).await? {
            writeln!(out, "{}", log_line(&l))?;
        }
        return Ok(());
    }
    // Follow: read the log topic from its start and keep polling it.
    rill_transforms::registry::ensure_internal_topics(&client).await?;
    let tp = rill_client::TopicPartition::new(rill_transforms::registry::LOGS_TOPIC, 0);
    let start = client
        .list_offsets(std::slice::from_ref(&tp), rill_client::OffsetSpec::Earliest)
        .await?;
    let mut consumer = client.consumer(rill_client::ConsumerConfig {
        fetch_max_wait: Duration::from_millis(500),
        ..rill_client::ConsumerConfig::default()
    })?;
    consumer.assign(vec![tp.clone()]);
    for (tp, offset) in start {
        consumer.seek(&tp, offset)?;
    }
    loop {
        let records = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            r = consumer.poll(Duration::from_secs(1)) => r?,
        };
        let mut out = std::io::stdout().lock();
        for r in records {
            if r.key.as_deref() != Some(a.name.as_bytes()) {
                continue;
            }
            if let Ok(l) = serde_json::from_slice::<rill_transforms::registry::LogRecord>(
                r.value.as_deref().unwrap_or_default(),
            ) {
                writeln!(out, "{}", log_line(&l))?;
            }
        }
        out.flush()?;
    }
}

/// One log line as `rill transform logs` prints it: UTC time, level,
/// instance and partition, message.
fn log_line(l: &rill_transforms::registry::LogRecord) -> String {
    format!(
        "{} {:<5} [{} {}] {}",
        utc_millis(l.line.timestamp_ms),
        l.line.level,
        l.instance,
        l.partition.as_deref().unwrap_or("-"),
        l.line.message
    )
}

/// `2026-12-05T21:55:03.264Z` for a time in milliseconds since the epoch.
fn utc_millis(ms: i64) -> String {
    let t = if ms >= 0 {
        std::time::UNIX_EPOCH + Duration::from_millis(ms as u64)
    } else {
        std::time::UNIX_EPOCH
    };
    humantime::format_rfc3339_millis(t).to_string()
}

/// A name for this process in status records.
pub fn instance_id(role: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!("{role}@{host}:{}", std::process::id())
}

async fn worker(a: ClientOnly) -> anyhow::Result<()> {
    let client = a.client.connect().await?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    let id = instance_id("worker");
    eprintln!(
        "rill transform worker {id} running transforms of {}; Ctrl-C stops it",
        a.client.bootstrap
    );
    // A standalone worker has no broker config: it runs with the default maxima.
    let task = tokio::spawn(supervisor::supervise(
        client,
        id,
        rill_transforms::HostMaxima::default(),
        // The brokers check this worker's own principal on what it does.
        false,
        rx,
    ));
    tokio::signal::ctrl_c()
        .await
        .context("cannot listen for Ctrl-C")?;
    let _ = tx.send(true);
    task.await.context("the supervisor panicked")??;
    Ok(())
}
