//! `rill bench produce|consume|e2e`: load generators that measure a running broker.
//!
//! Owns: the three workloads, their latency histograms (hdrhistogram, microseconds),
//! the progress bar (indicatif, stderr, only on a terminal), the summary, and the
//! optional latency chart (`--plot FILE`, SVG).
//!
//! Output contract: human-readable lines first, then ONE last line of `key=value`
//! pairs for scripts: `records= records_per_s= mb_per_s= p50_ms= p99_ms= p999_ms= max_ms=`.
//!
//! What each latency means:
//! - produce: from just before `send` to the record's acknowledgement, for one record in
//!   `PRODUCE_LATENCY_SAMPLE_EVERY` (awaited in send order per producer, so a sample is
//!   never counted as acknowledged before an earlier one: an upper bound when
//!   partitions answer out of order). Every other record's acknowledgement is still
//!   checked (a failed record fails the bench), just not timed, and through one
//!   future per batch (a batch's records resolve together): timing or polling
//!   every record cost the bench process more than the producer itself at
//!   100-byte records. `--send-batch N` hands records to the producer N at a
//!   time (`Producer::send_all`).
//!   With `--rate N` the producers send on a schedule (N records/s in all) and
//!   a sample is timed from when it was due, so falling behind shows as latency
//!   (no coordinated omission); run it below the saturated rate to see the
//!   broker's and the network's latency rather than the producer's queue.
//!   `--warmup-records N` sends N records first and waits for them, outside
//!   every figure, so the producers' start (producer id, metadata, the
//!   first batches) does not count as the steady state's latency.
//! - consume: the duration of each `poll` call that returned records.
//! - e2e: from the moment the producer handed the record to `send` to the moment the
//!   consumer received it (both in this process, one monotonic clock; the send time
//!   travels in the record's first 8 bytes).

use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{self, Poll, Waker};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Args, Subcommand};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rill_client::{
    Acks, Client, ClientError, Compression, ConsumerConfig, DeliveryFuture, NewTopic, OffsetReset,
    ProducerConfig, ProducerRecord, TopicPartition,
};
use tokio::sync::{Notify, mpsc};

use crate::client_args::{ClientArgs, client_error};

/// Bound on acknowledgements waiting to be timed, per producer (the producer's own
/// buffer_memory bounds them first in practice).
const PENDING_ACKS_MAX: usize = 1 << 20;
/// Produce latency is timed on one record in this many (see the module docs).
const PRODUCE_LATENCY_SAMPLE_EVERY: u64 = 8;
/// Bound on one consume bench's wait for data that is not coming.
pub(crate) const CONSUME_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Highest latency the histograms track (one hour, in microseconds).
const LATENCY_MAX_US: u64 = 3_600_000_000;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Produce records as fast as the broker takes them.
    Produce(ProduceBench),
    /// Consume records from the beginning of a topic as fast as possible.
    Consume(ConsumeBench),
    /// Produce at a fixed rate while consuming; measures produce-to-consume latency.
    E2e(E2eBench),
    /// Time a consumer group's rebalances: one member leaves, one joins.
    Rebalance(super::bench_group::RebalanceBench),
    /// Records/s through a WebAssembly transform vs plain consume-and-produce.
    Transform(super::bench_transform::TransformBench),
}

#[derive(Debug, Clone, Args)]
pub struct Common {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The topic to use; created (with --partitions) if it does not exist.
    #[arg(long, default_value = "rill-bench")]
    pub topic: String,
    /// Partitions for the topic when the bench creates it.
    #[arg(long, default_value_t = 2)]
    pub partitions: u32,
    /// How many records in all.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Write a latency chart (SVG) to this file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct ProducerArgs {
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 100)]
    pub record_size: usize,
    /// 0, 1 or all.
    #[arg(long, default_value = "1")]
    pub acks: Acks,
    /// Batch compression: none, gzip, snappy, lz4 or zstd.
    #[arg(long, default_value = "none")]
    pub compression: Compression,
    /// Target batch size in bytes.
    #[arg(long, default_value_t = 64 * 1024)]
    pub batch_size: usize,
    /// How long a batch waits for more records, in milliseconds.
    #[arg(long)]
    pub linger_ms: Option<u64>,
}

#[derive(Debug, Clone, Args)]
pub struct ProduceBench {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub producer: ProducerArgs,
    /// Concurrent producers, each with its own connection.
    #[arg(long, default_value_t = 2)]
    pub producers: usize,
    /// Transactional producers (one transactional id each) that commit a
    /// transaction every this many milliseconds (needs --acks all).
    #[arg(long, value_name = "MS")]
    pub transaction_interval_ms: Option<u64>,
    /// Send at this many records per second in all (shared by the
    /// producers) instead of as fast as possible, so the latency is the
    /// broker's and the network's, not queueing in the producer's buffer.
    /// Latency is then timed from when each sampled record was due, so a
    /// producer that falls behind its schedule shows it.
    #[arg(long, value_name = "RECORDS_PER_S")]
    pub rate: Option<u64>,
    /// Hand records to each producer this many at a time (`Producer::send_all`:
    /// one topic lookup, clock read and buffer reservation per call, as Iggy's
    /// bench sends batches of 1000 messages); 1 sends each record on its own,
    /// as Kafka's producer API does. With --rate a chunk goes when its last
    /// record is due.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub send_batch: usize,
    /// Send this many records first (shared by the producers, at --rate
    /// when given, each producer waiting for its own to be acknowledged and,
    /// if transactional, committed), not timed and not counted, as Kafka's
    /// `producer-perf-test --warmup-records`: the producers' start (their
    /// producer ids, metadata, first batches) is then outside the figures,
    /// which describe the steady state. At least one per producer, or 0.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub warmup_records: u64,
}

#[derive(Debug, Clone, Args)]
pub struct ConsumeBench {
    #[command(flatten)]
    pub common: Common,
    /// Concurrent consumers, each with its own connection and a share of the partitions.
    #[arg(long, default_value_t = 2)]
    pub consumers: usize,
    /// Bytes per partition per fetch.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub max_partition_fetch_bytes: u32,
    /// Consume as members of this consumer group (use a new group per run: a
    /// group resumes from its committed offsets) instead of assigned partitions.
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct E2eBench {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub producer: ProducerArgs,
    /// Records per second the producer offers.
    #[arg(long, default_value_t = 50_000)]
    pub rate: u64,
    /// Read the records back from this topic instead (e.g. the output of a
    /// transform that copies values, such as examples/identity): the latency
    /// then includes the transform.
    #[arg(long, value_name = "TOPIC")]
    pub read_topic: Option<String>,
    /// How the reader reads: read-uncommitted (default) or read-committed
    /// (only committed transactions' records).
    #[arg(long, default_value = "read-uncommitted", value_parser = super::consume::parse_isolation)]
    pub isolation: rill_proto::wire::Isolation,
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Produce(b) => bench_produce(b).await,
        BenchCommand::Consume(b) => bench_consume(b).await,
        BenchCommand::E2e(b) => bench_e2e(b).await,
        BenchCommand::Rebalance(b) => super::bench_group::bench_rebalance(b).await,
        BenchCommand::Transform(b) => super::bench_transform::run(b).await,
    }
}

pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).expect("valid histogram bounds")
}

pub(crate) fn record_latency(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record((d.as_micros() as u64).max(1));
}

pub(crate) async fn ensure_topic(client: &Client, common: &Common) -> anyhow::Result<()> {
    let admin = client.admin();
    let topics = admin
        .list_topics()
        .await
        .map_err(|e| client_error("cannot list topics", e))?;
    if topics.iter().any(|t| t == &common.topic) {
        return Ok(());
    }
    let created = admin
        .create_topic(NewTopic {
            name: common.topic.clone(),
            partitions: Some(common.partitions),
            replication_factor: None,
            configs: Vec::new(),
        })
        .await;
    match created {
        Ok(()) => Ok(()),
        // Another bench process created it meanwhile.
        Err(ClientError::Broker { error, .. })
            if error.code == rill_client::ErrorCode::TopicAlreadyExists =>
        {
            Ok(())
        }
        Err(e) => Err(client_error(
            format!("cannot create topic {}", common.topic),
            e,
        )),
    }
}

fn producer_config(args: &ProducerArgs, default_linger: Duration) -> ProducerConfig {
    ProducerConfig {
        acks: args.acks,
        compression: args.compression,
        batch_size: args.batch_size,
        linger: args
            .linger_ms
            .map(Duration::from_millis)
            .unwrap_or(default_linger),
        ..ProducerConfig::default()
    }
}

/// A value of `size` bytes that does not compress to nothing (a fixed pseudo-random
/// pattern), shared by every record.
fn payload(size: usize) -> Bytes {
    let mut x: u32 = 0x9E37_79B9;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            b'a' + (x % 26) as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

fn progress_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{pos}}/{{len}} records  {{per_sec}}  eta {{eta}}"
        ))
        .expect("valid progress template"),
    );
    bar
}

/// Ticks the bar from a shared counter until `done` reaches `total` or the task is dropped.
fn drive_progress(bar: ProgressBar, done: Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            let n = done.load(Ordering::Relaxed);
            bar.set_position(n);
            if bar.length().is_some_and(|len| n >= len) {
                break;
            }
        }
    })
}

struct Summary {
    label: &'static str,
    records: u64,
    bytes: u64,
    elapsed: Duration,
    latency: Histogram<u64>,
}

impl Summary {
    fn print(&self) {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let rps = self.records as f64 / secs;
        let mbps = self.bytes as f64 / secs / 1_000_000.0;
        let ms = |q: f64| self.latency.value_at_quantile(q) as f64 / 1000.0;
        let max_ms = self.latency.max() as f64 / 1000.0;
        println!(
            "{}: {} records, {:.1} MB in {:.2} s: {:.0} records/s, {:.1} MB/s",
            self.label,
            self.records,
            self.bytes as f64 / 1_000_000.0,
            secs,
            rps,
            mbps
        );
        println!(
            "latency ({} samples): p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
            self.latency.len(),
            ms(0.5),
            ms(0.99),
            ms(0.999),
            max_ms
        );
        println!(
            "records={} records_per_s={:.0} mb_per_s={:.1} p50_ms={:.3} p99_ms={:.3} p999_ms={:.3} max_ms={:.3}",
            self.records,
            rps,
            mbps,
            ms(0.5),
            ms(0.99),
            ms(0.999),
            max_ms
        );
    }
}

async fn bench_produce(b: ProduceBench) -> anyhow::Result<()> {
    if b.producers == 0 {
        bail!("--producers must be at least 1");
    }
    if b.transaction_interval_ms.is_some() && b.producer.acks != Acks::All {
        bail!("--transaction-interval-ms needs --acks all (transactions are idempotent)");
    }
    if b.rate == Some(0) {
        bail!("--rate must be above zero");
    }
    if b.send_batch == 0 {
        bail!("--send-batch must be at least 1");
    }
    if b.warmup_records > 0 && b.warmup_records < b.producers as u64 {
        // Some producers would start cold, in the measured run.
        bail!(
            "--warmup-records {} is fewer than --producers {}: give each producer at least one warm-up record (or 0 for none)",
            b.warmup_records,
            b.producers
        );
    }
    let admin_client = b.common.client.connect().await?;
    ensure_topic(&admin_client, &b.common).await?;
    let value = payload(b.producer.record_size);
    let done = Arc::new(AtomicU64::new(0));
    let bar = progress_bar(b.common.records, "produce");
    let ticker = drive_progress(bar.clone(), done.clone());

    // Connect every producer before the clock starts.
    let mut clients = Vec::with_capacity(b.producers);
    for _ in 0..b.producers {
        clients.push(b.common.client.connect().await?);
    }
    // The clock starts when every producer is through its warm-up.
    let warmed = Arc::new(Warmup {
        barrier: tokio::sync::Barrier::new(b.producers),
        start: OnceLock::new(),
    });
    let warmup_began = Instant::now();
    // A JoinSet: on the first failure the others are dropped, not awaited (one
    // could be waiting at the warm-up's barrier for the one that failed).
    let mut tasks = tokio::task::JoinSet::new();
    for (i, client) in clients.into_iter().enumerate() {
        let share = split(b.common.records, b.producers, i);
        let mut config = producer_config(&b.producer, Duration::from_millis(5));
        let topic = b.common.topic.clone();
        let transaction_interval = b.transaction_interval_ms.map(|ms| {
            config.transactional_id = Some(format!("bench-{topic}-{i}"));
            Duration::from_millis(ms)
        });
        let pacing = ShareOptions {
            transaction_interval,
            rate: b.rate.map(|r| r as f64 / b.producers as f64),
            send_batch: b.send_batch,
            warmup: split(b.warmup_records, b.producers, i),
            warmed: warmed.clone(),
        };
        let value = value.clone();
        let done = done.clone();
        tasks.spawn(async move {
            produce_share(client, config, topic, value, share, done, pacing).await
        });
    }
    let mut latency = new_histogram();
    while let Some(t) = tasks.join_next().await {
        let h = t.context("a producer task panicked")??;
        latency.add(&h).expect("histograms with equal bounds add");
    }
    let start = *warmed
        .start
        .get()
        .context("no producer reached the end of the warm-up")?;
    let elapsed = start.elapsed();
    ticker.abort();
    bar.finish_and_clear();
    if b.warmup_records > 0 {
        println!(
            "warm-up: {} records in {:.2?}, acknowledged before the clock started (not counted)",
            b.warmup_records,
            start.duration_since(warmup_began)
        );
    }
    let summary = Summary {
        label: "produce",
        records: b.common.records,
        bytes: b.common.records * b.producer.record_size as u64,
        elapsed,
        latency,
    };
    summary.print();
    if let Some(path) = &b.common.plot {
        write_plot(path, "rill bench produce: send-to-ack latency", &summary)?;
    }
    Ok(())
}

/// Share `i` of `total` split over `n`.
fn split(total: u64, n: usize, i: usize) -> u64 {
    total / n as u64 + u64::from((i as u64) < total % n as u64)
}

/// Where the producers wait for each other after their warm-up, and when the
/// last one arrived (the measured run's start).
struct Warmup {
    barrier: tokio::sync::Barrier,
    start: OnceLock<Instant>,
}

/// How one producer's share is sent.
#[derive(Clone)]
struct ShareOptions {
    /// Commit a transaction this often (a transactional producer).
    transaction_interval: Option<Duration>,
    /// Records per second of this producer (as fast as it can when `None`).
    rate: Option<f64>,
    /// Records handed to the producer per call (`send_all` above 1).
    send_batch: usize,
    /// Records sent and acknowledged before the measured ones.
    warmup: u64,
    warmed: Arc<Warmup>,
}

/// One producer's acknowledgements: one record in `PRODUCE_LATENCY_SAMPLE_EVERY`
/// goes to the collector to be timed; the others are kept one future per
/// batch (the records of a batch resolve together) and counted when it resolves.
struct AckTracker {
    timed: mpsc::Sender<(Instant, DeliveryFuture)>,
    /// Untimed acknowledgements, oldest first, with how many records each stands for.
    untimed: VecDeque<(DeliveryFuture, u64)>,
    done: Arc<AtomicU64>,
}

impl AckTracker {
    /// Keeps record `i`'s acknowledgement (`sent(i)`: when a sample's clock
    /// starts). False when the collector stopped (on an error it reports).
    async fn add(
        &mut self,
        i: u64,
        sent: impl Fn(u64) -> Instant,
        fut: DeliveryFuture,
    ) -> anyhow::Result<bool> {
        if i % PRODUCE_LATENCY_SAMPLE_EVERY == 0 {
            return Ok(self.timed.send((sent(i), fut)).await.is_ok());
        }
        match self.untimed.back_mut() {
            Some((back, n)) if back.same_batch(&fut) => *n += 1,
            _ => {
                self.untimed.push_back((fut, 1));
                self.reap()?;
            }
        }
        Ok(true)
    }

    /// Counts the resolved acknowledgements at the front, without waiting; a
    /// failed record fails the bench.
    fn reap(&mut self) -> anyhow::Result<()> {
        while let Some((front, n)) = self.untimed.front_mut() {
            let mut cx = task::Context::from_waker(Waker::noop());
            match Pin::new(front).poll(&mut cx) {
                Poll::Ready(r) => {
                    r.map_err(|e| client_error("a record was not delivered", e))?;
                    self.done.fetch_add(*n, Ordering::Relaxed);
                    self.untimed.pop_front();
                }
                Poll::Pending => break,
            }
        }
        Ok(())
    }

    /// Waits for every untimed acknowledgement; ends the collector's input.
    async fn finish(self) -> anyhow::Result<()> {
        drop(self.timed);
        for (fut, n) in self.untimed {
            fut.await
                .map_err(|e| client_error("a record was not delivered", e))?;
            self.done.fetch_add(n, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Of `count` records sent at `rate` records/s from `start`, how many are due
/// by now, looking the timer's grain (1 ms) ahead.
fn due_by_now(start: Instant, rate: f64, count: u64) -> u64 {
    let horizon = start.elapsed() + Duration::from_millis(1);
    ((horizon.as_secs_f64() * rate) as u64 + 1).min(count)
}

/// Sends `count` records (at `rate` records/s when given, in chunks the
/// producer's buffer memory holds) and waits until each is acknowledged; a
/// failed one fails the bench. Nothing is timed or counted.
async fn warm_up(
    producer: &rill_client::Producer,
    topic: &Arc<str>,
    value: &Bytes,
    count: u64,
    rate: Option<f64>,
) -> anyhow::Result<()> {
    // `send_all` takes a chunk's buffer memory at once: a chunk fills at most
    // half of it, so large records go a few (or one) at a time. (64 bytes is
    // above what the producer counts for a keyless record's framing.)
    let record_bytes = (value.len() + 64) as u64;
    let chunk_max = (producer.config().buffer_memory as u64 / 2 / record_bytes).clamp(1, 1000);
    let started = Instant::now();
    // One future per batch: a batch's records resolve together.
    let mut acks: Vec<DeliveryFuture> = Vec::new();
    let mut sent = 0;
    while sent < count {
        // Paced as the measured run is.
        let due = match rate {
            Some(r) => due_by_now(started, r, count),
            None => count,
        };
        if due <= sent {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        let n = chunk_max.min(due - sent);
        let records = (0..n)
            .map(|_| ProducerRecord::new(topic, value.clone()))
            .collect();
        let futs = producer
            .send_all(records)
            .await
            .map_err(|e| client_error(format!("cannot send the warm-up records to {topic}"), e))?;
        for fut in futs {
            if !acks.last().is_some_and(|last| last.same_batch(&fut)) {
                acks.push(fut);
            }
        }
        sent += n;
    }
    for fut in acks {
        fut.await
            .map_err(|e| client_error("a warm-up record was not delivered", e))?;
    }
    Ok(())
}

/// One producer's share: sends `count` records and times each acknowledgement.
async fn produce_share(
    client: Client,
    config: ProducerConfig,
    topic: String,
    value: Bytes,
    count: u64,
    done: Arc<AtomicU64>,
    options: ShareOptions,
) -> anyhow::Result<Histogram<u64>> {
    let ShareOptions {
        transaction_interval,
        rate,
        send_batch,
        warmup,
        warmed,
    } = options;
    let acks_none = config.acks == Acks::None;
    let producer = client
        .producer(config)
        .map_err(|e| client_error("cannot start a producer", e))?;
    let txn_error = |e| client_error("a transaction failed", e);
    if transaction_interval.is_some() {
        producer.init_transactions().await.map_err(txn_error)?;
        producer.begin_transaction().await.map_err(txn_error)?;
    }
    let topic_name: Arc<str> = topic.as_str().into();
    if warmup > 0 {
        warm_up(&producer, &topic_name, &value, warmup, rate).await?;
        if transaction_interval.is_some() {
            // The warm-up's records are committed before the clock, and the
            // first commit is part of the warm-up, not of the measured run.
            producer.commit_transaction().await.map_err(txn_error)?;
            producer.begin_transaction().await.map_err(txn_error)?;
        }
    }
    warmed.barrier.wait().await;
    // The same start for every producer: the first through the barrier sets it.
    let schedule_start = *warmed.start.get_or_init(Instant::now);
    let mut txn_started = schedule_start;
    let (tx, mut rx) = mpsc::channel::<(Instant, DeliveryFuture)>(PENDING_ACKS_MAX);
    let done_c = done.clone();
    let collector = tokio::spawn(async move {
        let mut h = new_histogram();
        while let Some((sent, fut)) = rx.recv().await {
            fut.await
                .map_err(|e| client_error("a record was not delivered", e))?;
            record_latency(&mut h, sent.elapsed());
            done_c.fetch_add(1, Ordering::Relaxed);
        }
        Ok::<_, anyhow::Error>(h)
    });
    let mut acks = AckTracker {
        timed: tx,
        untimed: VecDeque::new(),
        done: done.clone(),
    };
    // At a fixed rate, record i is due at start + i / rate.
    let due_at = |i: u64| rate.map(|r| schedule_start + Duration::from_secs_f64(i as f64 / r));
    // Records due at the last look at the clock (all of them without a rate):
    // the clock is read once per wait, not once per record.
    let mut due_count = if rate.is_some() { 0 } else { count };
    let mut i = 0;
    'send: while i < count {
        let n = (send_batch as u64).min(count - i);
        // A chunk goes when its last record is due, or at most the timer's
        // grain (1 ms) before: sleeping to the exact instant would wake late.
        while due_count < i + n {
            let r = rate.expect("without a rate every record is due");
            due_count = due_by_now(schedule_start, r, count);
            if due_count < i + n
                && let Some(due) = due_at(i + n - 1)
            {
                let early = due.checked_sub(Duration::from_millis(1)).unwrap_or(due);
                tokio::time::sleep_until(early.into()).await;
            }
        }
        if let Some(every) = transaction_interval
            && txn_started.elapsed() >= every
        {
            producer.commit_transaction().await.map_err(txn_error)?;
            producer.begin_transaction().await.map_err(txn_error)?;
            txn_started = Instant::now();
        }
        let send_error = |e| client_error(format!("cannot send to {topic}"), e);
        // A sample is timed from before the send (so waiting for buffer memory
        // counts), or from when it was due if that was earlier (a producer
        // behind its schedule shows it); the clock is read only for a chunk
        // holding a sample.
        let before = (i.next_multiple_of(PRODUCE_LATENCY_SAMPLE_EVERY) < i + n).then(Instant::now);
        let sent = |k: u64| {
            let before = before.expect("a chunk with a sample read the clock");
            due_at(k).map_or(before, |due| due.min(before))
        };
        if n == 1 {
            let record = ProducerRecord::new(&topic_name, value.clone());
            let fut = producer.send(record).await.map_err(send_error)?;
            if !acks.add(i, sent, fut).await? {
                break 'send; // the collector stopped on an error; it reports it below
            }
        } else {
            let records = (0..n)
                .map(|_| ProducerRecord::new(&topic_name, value.clone()))
                .collect();
            let futs = producer.send_all(records).await.map_err(send_error)?;
            for (k, fut) in (i..).zip(futs) {
                if !acks.add(k, sent, fut).await? {
                    break 'send;
                }
            }
        }
        i += n;
    }
    acks.finish().await?;
    if transaction_interval.is_some() {
        producer.commit_transaction().await.map_err(txn_error)?;
    }
    producer
        .flush()
        .await
        .map_err(|e| client_error("cannot flush the producer", e))?;
    let h = collector
        .await
        .context("the acknowledgement collector panicked")??;
    producer
        .close()
        .await
        .map_err(|e| client_error("cannot close the producer", e))?;
    if acks_none {
        tracing::info!("acks=0: latencies are send-to-handoff, not acknowledgements");
    }
    Ok(h)
}

async fn bench_consume(b: ConsumeBench) -> anyhow::Result<()> {
    if b.consumers == 0 {
        bail!("--consumers must be at least 1");
    }
    let client = b.common.client.connect().await?;
    let partitions = client
        .partition_count(&b.common.topic)
        .await
        .map_err(|e| client_error(format!("cannot read topic {}", b.common.topic), e))?;
    // Split the partitions round-robin over the consumers.
    let mut shares: Vec<Vec<TopicPartition>> = vec![Vec::new(); b.consumers];
    for p in 0..partitions {
        shares[p as usize % b.consumers].push(TopicPartition::new(b.common.topic.clone(), p));
    }
    let shares: Vec<_> = match &b.group {
        // Group members get their partitions from the coordinator.
        Some(_) => vec![Vec::new(); b.consumers],
        None => shares.into_iter().filter(|s| !s.is_empty()).collect(),
    };
    let done = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let bar = progress_bar(b.common.records, "consume");
    let ticker = drive_progress(bar.clone(), done.clone());
    let mut clients = Vec::new();
    for _ in &shares {
        clients.push(b.common.client.connect().await?);
    }
    let finish = Arc::new(FinishLine::new(b.common.records));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (client, share) in clients.into_iter().zip(shares) {
        let config = ConsumerConfig {
            max_partition_fetch_bytes: b.max_partition_fetch_bytes,
            auto_offset_reset: OffsetReset::Earliest,
            ..ConsumerConfig::default()
        };
        let (done, bytes, finish) = (done.clone(), bytes.clone(), finish.clone());
        let (group, topic) = (b.group.clone(), b.common.topic.clone());
        tasks.push(tokio::spawn(async move {
            match group {
                Some(group) => {
                    super::bench_group::consume_member(
                        client, config, group, topic, finish, done, bytes,
                    )
                    .await
                }
                None => consume_share(client, config, share, finish, done, bytes).await,
            }
        }));
    }
    let mut latency = new_histogram();
    for t in tasks {
        let h = t.await.context("a consumer task panicked")??;
        latency.add(&h).expect("histograms with equal bounds add");
    }
    // The run ends when the last record needed arrived (a member leaving its
    // group afterwards is not consuming).
    let elapsed = finish.at().unwrap_or_else(Instant::now) - start;
    ticker.abort();
    bar.finish_and_clear();
    let records = done.load(Ordering::Relaxed);
    if records < b.common.records {
        eprintln!(
            "note: the topic held only {records} of the {} records asked for",
            b.common.records
        );
    }
    let summary = Summary {
        label: "consume",
        records,
        bytes: bytes.load(Ordering::Relaxed),
        elapsed,
        latency,
    };
    summary.print();
    if let Some(path) = &b.common.plot {
        write_plot(path, "rill bench consume: poll latency", &summary)?;
    }
    Ok(())
}

/// One consumer's share: reads its partitions from the beginning until the total
/// reaches `target`, or until its partitions are drained.
async fn consume_share(
    client: Client,
    config: ConsumerConfig,
    share: Vec<TopicPartition>,
    finish: Arc<FinishLine>,
    done: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
) -> anyhow::Result<Histogram<u64>> {
    let mut consumer = client
        .consumer(config)
        .map_err(|e| client_error("cannot start a consumer", e))?;
    consumer.assign(share.clone());
    consumer
        .seek_to_beginning(&share)
        .await
        .map_err(|e| client_error("cannot seek to the beginning", e))?;
    let mut h = new_histogram();
    let mut idle_since = Instant::now();
    loop {
        let t = Instant::now();
        let Some(polled) = finish
            .unless_crossed(consumer.poll(Duration::from_millis(500)))
            .await
        else {
            break;
        };
        let records = polled.map_err(|e| client_error("cannot poll", e))?;
        if records.is_empty() {
            if idle_since.elapsed() > CONSUME_IDLE_TIMEOUT {
                break;
            }
            continue;
        }
        record_latency(&mut h, t.elapsed());
        idle_since = Instant::now();
        count_consumed(&records, &done, &bytes, &finish);
    }
    Ok(h)
}

async fn bench_e2e(b: E2eBench) -> anyhow::Result<()> {
    if b.rate == 0 {
        bail!("--rate must be above zero");
    }
    if b.producer.record_size < 8 {
        bail!("--record-size must be at least 8 for e2e (the send time travels in the record)");
    }
    let client = b.common.client.connect().await?;
    ensure_topic(&client, &b.common).await?;
    let read_topic = b
        .read_topic
        .clone()
        .unwrap_or_else(|| b.common.topic.clone());
    let partitions = client
        .partition_count(&read_topic)
        .await
        .map_err(|e| client_error(format!("cannot read topic {read_topic}"), e))?;
    let tps: Vec<_> = (0..partitions)
        .map(|p| TopicPartition::new(read_topic.clone(), p))
        .collect();

    let consumer_client = b.common.client.connect().await?;
    let mut consumer = consumer_client
        .consumer(ConsumerConfig {
            fetch_max_wait: Duration::from_millis(100),
            isolation: b.isolation,
            ..Default::default()
        })
        .map_err(|e| client_error("cannot start a consumer", e))?;
    consumer.assign(tps.clone());
    consumer
        .seek_to_end(&tps)
        .await
        .map_err(|e| client_error("cannot seek to the end", e))?;

    let producer = client
        .producer(producer_config(&b.producer, Duration::ZERO))
        .map_err(|e| client_error("cannot start a producer", e))?;
    let epoch = Instant::now();
    let total = b.common.records;
    let done = Arc::new(AtomicU64::new(0));
    let bar = progress_bar(total, "e2e");
    let ticker = drive_progress(bar.clone(), done.clone());

    let record_size = b.producer.record_size;
    let topic = b.common.topic.clone();
    let rate = b.rate;
    let sender = tokio::spawn(async move {
        let filler = payload(record_size);
        // Pace in 1 ms slots: by slot k, k * rate / 1000 records have been offered.
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut sent: u64 = 0;
        let mut pending = Vec::new();
        let start = Instant::now();
        while sent < total {
            tick.tick().await;
            let due = ((start.elapsed().as_micros() as u64 * rate) / 1_000_000 + 1).min(total);
            while sent < due {
                let mut v = Vec::with_capacity(record_size);
                v.extend_from_slice(&(epoch.elapsed().as_nanos() as u64).to_be_bytes());
                v.extend_from_slice(&filler[8..]);
                let fut = producer
                    .send(ProducerRecord::new(topic.as_str(), v))
                    .await
                    .map_err(|e| client_error(format!("cannot send to {topic}"), e))?;
                pending.push(fut);
                sent += 1;
            }
            // Check acknowledgements now and then so failures surface early.
            if pending.len() >= 10_000 {
                for f in pending.drain(..) {
                    f.await
                        .map_err(|e| client_error("a record was not delivered", e))?;
                }
            }
        }
        for f in pending {
            f.await
                .map_err(|e| client_error("a record was not delivered", e))?;
        }
        producer
            .close()
            .await
            .map_err(|e| client_error("cannot close the producer", e))?;
        Ok::<_, anyhow::Error>(())
    });

    let mut latency = new_histogram();
    let mut received: u64 = 0;
    let mut idle_since = Instant::now();
    while received < total {
        let records = consumer
            .poll(Duration::from_millis(200))
            .await
            .map_err(|e| client_error("cannot poll", e))?;
        let now = epoch.elapsed().as_nanos() as u64;
        if records.is_empty() {
            if sender.is_finished() && idle_since.elapsed() > CONSUME_IDLE_TIMEOUT {
                break;
            }
            continue;
        }
        idle_since = Instant::now();
        for r in &records {
            let Some(v) = r.value.as_ref().filter(|v| v.len() >= 8) else {
                continue;
            };
            let sent_ns = u64::from_be_bytes(v[..8].try_into().expect("8 bytes"));
            record_latency(
                &mut latency,
                Duration::from_nanos(now.saturating_sub(sent_ns)),
            );
        }
        received += records.len() as u64;
        done.store(received, Ordering::Relaxed);
    }
    let elapsed = epoch.elapsed();
    sender.await.context("the producer task panicked")??;
    ticker.abort();
    bar.finish_and_clear();
    if received < total {
        bail!("the consumer received {received} of {total} records within the idle timeout");
    }
    println!("offered rate: {rate} records/s");
    let summary = Summary {
        label: "e2e",
        records: received,
        bytes: received * record_size as u64,
        elapsed,
        latency,
    };
    summary.print();
    if let Some(path) = &b.common.plot {
        write_plot(path, "rill bench e2e: produce-to-consume latency", &summary)?;
    }
    Ok(())
}

/// Writes the latency distribution as an SVG line chart: latency (ms) against
/// percentile, the percentile axis spread by "nines" (90, 99, 99.9, ...).
fn write_plot(path: &std::path::Path, title: &str, summary: &Summary) -> anyhow::Result<()> {
    use plotters::prelude::*;
    if path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        != Some("svg".into())
    {
        bail!(
            "--plot {}: only SVG charts are supported; name the file *.svg",
            path.display()
        );
    }
    let h = &summary.latency;
    if h.is_empty() {
        bail!("--plot {}: no latency samples to plot", path.display());
    }
    // x = number of nines: 0 -> p0, 1 -> p90, 2 -> p99, 3 -> p99.9 ...
    let max_nines = ((h.len() as f64).log10()).clamp(1.0, 5.0);
    let steps = 200;
    let points: Vec<(f64, f64)> = (0..=steps)
        .map(|i| {
            let nines = max_nines * i as f64 / steps as f64;
            let q = 1.0 - 10f64.powf(-nines);
            (nines, h.value_at_quantile(q) as f64 / 1000.0)
        })
        .collect();
    let y_max = (h.max() as f64 / 1000.0 * 1.1).max(0.01);
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).context("cannot draw the chart")?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..max_nines, 0f64..y_max)
        .context("cannot lay out the chart")?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .x_label_formatter(&|n| format!("p{}", format_percentile(1.0 - 10f64.powf(-*n))))
        .draw()
        .context("cannot draw the chart axes")?;
    chart
        .draw_series(LineSeries::new(points, &BLUE))
        .context("cannot draw the latency line")?;
    root.present()
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("latency chart written to {}", path.display());
    Ok(())
}

fn format_percentile(q: f64) -> String {
    let p = q * 100.0;
    let s = format!("{p:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Adds one poll's records to a consume run's counters: records, and key plus
/// value bytes (shared by plain-assignment and group consume benchmarks).
pub(super) fn count_consumed(
    records: &[rill_client::ConsumerRecord],
    done: &AtomicU64,
    bytes: &AtomicU64,
    finish: &FinishLine,
) {
    let n: u64 = records
        .iter()
        .map(|r| {
            (r.value.as_ref().map_or(0, |v| v.len()) + r.key.as_ref().map_or(0, |k| k.len())) as u64
        })
        .sum();
    bytes.fetch_add(n, Ordering::Relaxed);
    let count = records.len() as u64;
    if done.fetch_add(count, Ordering::Relaxed) + count >= finish.target {
        finish.cross();
    }
}

/// The consume bench's finish line, shared by its consumers: the moment the
/// records counted reached the target ends the run, and wakes the consumers
/// still waiting in a long poll on partitions they drained (which would
/// otherwise stretch the run by up to a fetch's wait).
#[derive(Debug)]
pub(crate) struct FinishLine {
    target: u64,
    at: OnceLock<Instant>,
    crossed: Notify,
}

impl FinishLine {
    pub(super) fn new(target: u64) -> FinishLine {
        let line = FinishLine {
            target,
            at: OnceLock::new(),
            crossed: Notify::new(),
        };
        if target == 0 {
            line.cross();
        }
        line
    }

    fn cross(&self) {
        self.at.get_or_init(Instant::now);
        self.crossed.notify_waiters();
    }

    /// When the target was reached, if it was.
    pub(super) fn at(&self) -> Option<Instant> {
        self.at.get().copied()
    }

    /// `work`'s output, or `None` once the line is crossed (before or while
    /// `work` waits).
    pub(super) async fn unless_crossed<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        let crossed = self.crossed.notified();
        tokio::pin!(crossed);
        crossed.as_mut().enable();
        if self.at().is_some() {
            return None;
        }
        tokio::select! {
            out = work => Some(out),
            _ = crossed => None,
        }
    }
}
