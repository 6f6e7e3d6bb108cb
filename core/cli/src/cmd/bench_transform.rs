//! `rill bench transform`: records/s through a WebAssembly transform against
//! plain consume-and-produce with the client library, on the same records.
//!
//! Steps: produce `--records` records of `--record-size` bytes to a fresh input
//! topic (not timed); then (1) *plain*: one consumer reads them all and a
//! producer writes each to an output topic, until every write is acknowledged;
//! (2) *transform*: the same records through the runner deployed transforms use
//! (one instance per partition, outputs acknowledged before offsets are
//! committed, here to memory); (3) *boundary*: the module alone, batches of the
//! polled size through `process` with no network, giving the per-record cost of
//! crossing into WebAssembly and back.
//!
//! Output: a line per phase, then ONE `key=value` line:
//! `records= plain_records_per_s= transform_records_per_s= ratio= boundary_ns_per_record=`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use rill_client::{
    Client, ClientError, Consumer, ConsumerConfig, ConsumerRecord, NewTopic, Offset,
    ProducerConfig, ProducerRecord, TopicPartition,
};
use rill_transforms::deployment::{Deployment, ErrorPolicy, RunState, StartFrom};
use rill_transforms::instance::{Limits, TransformInstance};
use rill_transforms::runner::OffsetSink;
use rill_transforms::{Runner, StateStore, TransformModule};

use crate::client_args::ClientArgs;

/// Bound on waiting for records that are not coming.
const IDLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Records per call in the boundary measurement.
const BOUNDARY_BATCH: usize = 500;

#[derive(Debug, Clone, Args)]
pub struct TransformBench {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The transform component (e.g. the identity example's).
    #[arg(long, value_name = "FILE.wasm")]
    pub module: PathBuf,
    /// How many records.
    #[arg(long, default_value_t = 200_000)]
    pub records: u64,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 100)]
    pub record_size: usize,
    /// Partitions of the input and output topics.
    #[arg(long, default_value_t = 2)]
    pub partitions: u32,
    /// A file of record values, one per line, used in turn instead of random bytes
    /// (e.g. JSON articles for the RSS cleaner).
    #[arg(long, value_name = "FILE")]
    pub values: Option<PathBuf>,
    /// A setting handed to the transform's init, KEY=VALUE (repeatable), as
    /// `rill transform deploy --config` does (e.g. dedup=false for the RSS cleaner).
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = rill_transforms::deployment::parse_config_entry)]
    pub config: Vec<(String, String)>,
    /// Run the transform exactly-once (each input partition's outputs, state
    /// and offset committed in transactions every this many milliseconds)
    /// instead of at-least-once.
    #[arg(long, value_name = "MS")]
    pub exactly_once_interval_ms: Option<u64>,
}

/// Commits to memory: the bench measures the data path, not the offset store.
struct MemoryOffsets(Vec<(TopicPartition, Offset)>);

impl OffsetSink for MemoryOffsets {
    async fn commit(&mut self, offsets: Vec<(TopicPartition, Offset)>) -> Result<(), ClientError> {
        self.0.extend(offsets);
        Ok(())
    }
}

async fn create(client: &Client, name: &str, partitions: u32, compact: bool) -> anyhow::Result<()> {
    let configs = if compact {
        vec![("cleanup.policy".to_string(), "compact".to_string())]
    } else {
        vec![]
    };
    client
        .admin()
        .create_topic(NewTopic {
            name: name.to_string(),
            partitions: Some(partitions),
            replication_factor: None,
            configs,
        })
        .await
        .with_context(|| format!("cannot create topic {name}"))
}

/// Polls until records arrive, bailing when none has for [`IDLE_TIMEOUT`] since
/// `last` (which it moves to the arrival). `phase`, `seen`, `total`: for the error.
async fn poll_some(
    consumer: &mut Consumer,
    last: &mut Instant,
    phase: &str,
    seen: u64,
    total: u64,
) -> anyhow::Result<Vec<ConsumerRecord>> {
    loop {
        let records = consumer.poll(Duration::from_millis(200)).await?;
        if !records.is_empty() {
            *last = Instant::now();
            return Ok(records);
        }
        if last.elapsed() > IDLE_TIMEOUT {
            bail!("{phase} phase: only {seen} of {total} records arrived");
        }
    }
}

fn values(b: &TransformBench) -> anyhow::Result<Vec<Bytes>> {
    match &b.values {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let v: Vec<Bytes> = text
                .lines()
                .filter(|l| !l.is_empty())
                .map(|l| Bytes::from(l.to_string()))
                .collect();
            if v.is_empty() {
                bail!("{} has no values", path.display());
            }
            Ok(v)
        }
        None => {
            let mut x: u32 = 0x9E37_79B9;
            let bytes: Vec<u8> = (0..b.record_size)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    b'a' + (x % 26) as u8
                })
                .collect();
            Ok(vec![Bytes::from(bytes)])
        }
    }
}

pub async fn run(b: TransformBench) -> anyhow::Result<()> {
    let wasm =
        std::fs::read(&b.module).with_context(|| format!("cannot read {}", b.module.display()))?;
    let module = TransformModule::compile(&wasm)?;
    let client = b.client.connect().await?;
    let run_id = rill_transforms::instance::now_ms();
    let input = format!("bench-xf-{run_id}-in");
    let plain_out = format!("bench-xf-{run_id}-plain");
    let xf_out = format!("bench-xf-{run_id}-out");
    let name = format!("bench-xf-{run_id}");
    for t in [&input, &plain_out, &xf_out] {
        create(&client, t, b.partitions, false).await?;
    }
    create(
        &client,
        &rill_transforms::deployment::state_topic(&name),
        b.partitions,
        true,
    )
    .await?;
    let values = values(&b)?;

    // Load the input (not timed).
    let producer = client.producer(ProducerConfig::default())?;
    for i in 0..b.records {
        let v = values[(i as usize) % values.len()].clone();
        let key = Bytes::from(format!("k{}", i % 10_000));
        let _ = producer
            .send(ProducerRecord::new(input.clone(), v).key(key))
            .await?;
    }
    producer.flush().await?;
    producer.close().await?;
    let tps: Vec<TopicPartition> = (0..b.partitions)
        .map(|p| TopicPartition::new(input.clone(), p))
        .collect();
    eprintln!("loaded {} records into {input}", b.records);

    // (1) plain consume-and-produce.
    let plain = {
        let mut consumer = client.consumer(ConsumerConfig::default())?;
        consumer.assign(tps.clone());
        consumer.seek_to_beginning(&tps).await?;
        let producer = client.producer(ProducerConfig::default())?;
        let start = Instant::now();
        let mut seen = 0u64;
        let mut last = Instant::now();
        let plain_topic: std::sync::Arc<str> = plain_out.as_str().into();
        while seen < b.records {
            let records = poll_some(&mut consumer, &mut last, "plain", seen, b.records).await?;
            seen += records.len() as u64;
            for r in records {
                let out = ProducerRecord {
                    topic: plain_topic.clone(),
                    partition: None,
                    key: r.key,
                    value: r.value,
                    headers: r.headers,
                    timestamp_ms: None,
                };
                let _ = producer.send(out).await?;
            }
        }
        producer.flush().await?;
        let elapsed = start.elapsed();
        producer.close().await?;
        elapsed
    };
    let plain_rate = b.records as f64 / plain.as_secs_f64();
    println!(
        "plain consume+produce: {} records in {:.2} s = {:.0} records/s",
        b.records,
        plain.as_secs_f64(),
        plain_rate
    );

    // (2) through the transform runner.
    let deployment = Deployment {
        name: name.clone(),
        inputs: vec![input.clone()],
        outputs: vec![xf_out.clone()],
        on_error: ErrorPolicy::Skip,
        from: StartFrom::Earliest,
        config: b.config.clone(),
        state: RunState::Running,
        version: 1,
        deployed_at_ms: run_id,
        memory_bytes_max: rill_transforms::instance::MEMORY_BYTES_MAX_DEFAULT as u64,
        call_timeout_ms: rill_transforms::instance::CALL_TIMEOUT_DEFAULT.as_millis() as u64,
        delivery: match b.exactly_once_interval_ms {
            None => Default::default(),
            Some(commit_interval_ms) => {
                rill_transforms::deployment::Delivery::ExactlyOnce { commit_interval_ms }
            }
        },
        module: Vec::new(),
        owner: None,
    };
    let (transform, outputs) = {
        let mut consumer = client.consumer(ConsumerConfig::default())?;
        consumer.assign(tps.clone());
        consumer.seek_to_beginning(&tps).await?;
        let mut sink = MemoryOffsets(Vec::new());
        let mut runner = Runner::new(
            client.clone(),
            deployment.clone(),
            module.clone(),
            "bench".into(),
        )
        .await?;
        runner.assign(&tps).await?;
        let start = Instant::now();
        let mut seen = 0u64;
        let mut last = Instant::now();
        while seen < b.records {
            let records = poll_some(&mut consumer, &mut last, "transform", seen, b.records).await?;
            seen += records.len() as u64;
            runner.process(records, &mut sink).await?;
        }
        runner.drain(&mut sink).await?;
        let elapsed = start.elapsed();
        let outputs = runner.counters.outputs;
        runner
            .finish(&mut sink, &rill_transforms::RunEnd::Stopped)
            .await?;
        (elapsed, outputs)
    };
    let xf_rate = b.records as f64 / transform.as_secs_f64();
    println!(
        "through the transform:  {} records in {:.2} s = {:.0} records/s ({} outputs; {:.0}% of plain)",
        b.records,
        transform.as_secs_f64(),
        xf_rate,
        outputs,
        100.0 * xf_rate / plain_rate
    );

    // (3) the boundary alone.
    let boundary_ns = boundary(module, &values, b.config.clone())?;
    println!(
        "WebAssembly boundary alone: {boundary_ns:.0} ns per record (batches of {BOUNDARY_BATCH})"
    );
    println!(
        "records={} plain_records_per_s={plain_rate:.0} transform_records_per_s={xf_rate:.0} ratio={:.2} boundary_ns_per_record={boundary_ns:.0}",
        b.records,
        xf_rate / plain_rate
    );
    for t in [&input, &plain_out, &xf_out] {
        let _ = client.admin().delete_topic(t).await;
    }
    let _ = client.admin().delete_topic(&deployment.state_topic()).await;
    Ok(())
}

/// Nanoseconds per record through `process` on an instance, no network.
fn boundary(
    module: Arc<TransformModule>,
    values: &[Bytes],
    config: Vec<(String, String)>,
) -> anyhow::Result<f64> {
    let mut inst = TransformInstance::new(
        module,
        "bench",
        config,
        Limits::default(),
        StateStore::default(),
    )?;
    let topic: Arc<str> = "bench".into();
    let batch: Vec<ConsumerRecord> = (0..BOUNDARY_BATCH)
        .map(|i| ConsumerRecord {
            topic: topic.clone(),
            partition: 0,
            offset: Offset(i as i64),
            timestamp_ms: 0,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(values[i % values.len()].clone()),
            headers: Vec::new(),
        })
        .collect();
    let rounds = 200;
    let start = Instant::now();
    for _ in 0..rounds {
        let out = inst.process(&topic, 0, &batch, false)?;
        std::hint::black_box(&out);
        inst.state_mut().take_changelog();
    }
    Ok(start.elapsed().as_nanos() as f64 / (rounds * BOUNDARY_BATCH) as f64)
}
