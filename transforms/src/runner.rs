//! The runner: runs one deployment over the input partitions this process is
//! given — one [`TransformInstance`] per partition — and writes the outputs.
//!
//! The loop: poll the inputs; per partition, hand the records to its instance
//! in one batch; send each record's outputs (or, on failure, apply the error
//! policy: skip, dead-letter, halt); queue a *commit point* (the delivery
//! futures of the outputs, the state writes, the next offsets). A committer
//! task resolves commit points in order: it waits until every output of the
//! point is acknowledged, then writes the point's state writes to the changelog
//! and waits for those, and only then hands the offsets back to be committed.
//! So an input offset is committed only after its outputs and state are
//! durable (at least once), and the changelog never runs ahead of the outputs
//! (a restart re-processes, it never forgets an output). Up to
//! [`COMMIT_POINTS_IN_FLIGHT_MAX`] points are in flight, so processing runs
//! ahead of acknowledgements.
//!
//! Partitions come and go through [`Runner::assign`] and [`Runner::revoke`]:
//! on assignment the partition's state is restored from the changelog topic;
//! on revocation every pending commit point is resolved and committed first.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rill_client::{
    Client, ClientError, ConsumerRecord, DeliveryFuture, Header, Offset, Producer, ProducerConfig,
    ProducerRecord, TopicPartition,
};
use tokio::sync::mpsc;

use crate::deployment::{Deployment, ErrorPolicy, RunState};
use crate::error::TransformError;
use crate::instance::{Limits, RecordOutcome, TransformInstance, now_ms};
use crate::module::TransformModule;
use crate::registry::{InstanceStatus, LOGS_TOPIC, LogRecord, STATUS_TOPIC, read_to_end};
use crate::state::StateStore;
use crate::wit::{HeaderParam, InputRecord, OutputRecord};

/// Commit points queued behind the committer (back-pressure beyond).
pub const COMMIT_POINTS_IN_FLIGHT_MAX: usize = 16;
/// How often an instance publishes its status and flushes its log lines.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// Headers a dead-lettered record carries.
pub const DLQ_ERROR_HEADER: &str = "rill.transform.error";
pub const DLQ_SOURCE_HEADER: &str = "rill.transform.source";
/// Separates the input topic from the user's key in a state changelog key.
const STATE_KEY_SEPARATOR: u8 = 0;

/// Counters of one runner, as `describe` shows them.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub processed: u64,
    pub failed: u64,
    pub dead_lettered: u64,
    pub skipped: u64,
    pub outputs: u64,
}

/// Offsets ready to commit, or the error that stops the runner.
type Resolved = Result<Vec<(TopicPartition, Offset)>, ClientError>;

struct CommitPoint {
    deliveries: Vec<DeliveryFuture>,
    changelog: Vec<ProducerRecord>,
    offsets: Vec<(TopicPartition, Offset)>,
}

/// Where committed offsets go: the group coordinator, or our own topic.
pub trait OffsetSink {
    fn commit(
        &mut self,
        offsets: Vec<(TopicPartition, Offset)>,
    ) -> impl std::future::Future<Output = Result<(), ClientError>> + Send;
}

/// How a runner ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    Stopped,
    Halted(String),
}

pub struct Runner {
    pub deployment: Deployment,
    module: Arc<TransformModule>,
    client: Client,
    producer: Producer,
    instances: HashMap<TopicPartition, TransformInstance>,
    state_partitions: u32,
    instance_id: String,
    pub counters: Counters,
    last_error: Option<String>,
    commit_tx: mpsc::Sender<CommitPoint>,
    resolved_rx: mpsc::Receiver<Resolved>,
    in_flight: usize,
    committer: tokio::task::JoinHandle<()>,
    last_status: Instant,
    pending_logs: Vec<LogRecord>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("name", &self.deployment.name)
            .field("instance_id", &self.instance_id)
            .finish_non_exhaustive()
    }
}

impl Runner {
    /// A runner for `deployment` (its module compiled as `module`).
    pub async fn new(
        client: Client,
        deployment: Deployment,
        module: Arc<TransformModule>,
        instance_id: String,
    ) -> Result<Runner, TransformError> {
        let producer = client.producer(ProducerConfig {
            linger: Duration::from_millis(2),
            ..ProducerConfig::default()
        })?;
        let state_partitions = client.partition_count(&deployment.state_topic()).await?;
        let (commit_tx, mut commit_rx) = mpsc::channel::<CommitPoint>(COMMIT_POINTS_IN_FLIGHT_MAX);
        let (resolved_tx, resolved_rx) = mpsc::channel::<Resolved>(COMMIT_POINTS_IN_FLIGHT_MAX + 1);
        let changelog_producer = producer.clone();
        let committer = tokio::spawn(async move {
            while let Some(point) = commit_rx.recv().await {
                let result = resolve(point, &changelog_producer).await;
                let failed = result.is_err();
                if resolved_tx.send(result).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Runner {
            deployment,
            module,
            client,
            producer,
            instances: HashMap::new(),
            state_partitions,
            instance_id,
            counters: Counters::default(),
            last_error: None,
            commit_tx,
            resolved_rx,
            in_flight: 0,
            committer,
            last_status: Instant::now() - STATUS_INTERVAL,
            pending_logs: Vec::new(),
        })
    }

    fn limits(&self) -> Limits {
        Limits {
            memory_bytes_max: self.deployment.memory_bytes_max as usize,
            call_timeout: Duration::from_millis(self.deployment.call_timeout_ms),
        }
    }

    /// Starts instances for `tps`, each with its state restored.
    pub async fn assign(&mut self, tps: &[TopicPartition]) -> Result<(), TransformError> {
        for tp in tps {
            if self.instances.contains_key(tp) {
                continue;
            }
            let state =
                restore_state(&self.client, &self.deployment, self.state_partition(tp), tp).await?;
            let restored = state.len();
            let instance = TransformInstance::new(
                self.module.clone(),
                &self.deployment.name,
                self.deployment.config.clone(),
                self.limits(),
                state,
            )?;
            tracing::info!(transform = %self.deployment.name, %tp, restored, "instance started");
            self.instances.insert(tp.clone(), instance);
        }
        Ok(())
    }

    /// Resolves every pending commit point, commits, and stops the instances of `tps`.
    pub async fn revoke<S: OffsetSink>(
        &mut self,
        tps: &[TopicPartition],
        sink: &mut S,
    ) -> Result<(), TransformError> {
        self.drain(sink).await?;
        for tp in tps {
            if let Some(mut inst) = self.instances.remove(tp) {
                self.collect_logs(tp, &mut inst);
            }
        }
        Ok(())
    }

    /// The partitions with a running instance.
    pub fn assignment(&self) -> BTreeSet<TopicPartition> {
        self.instances.keys().cloned().collect()
    }

    fn state_partition(&self, tp: &TopicPartition) -> u32 {
        tp.partition % self.state_partitions.max(1)
    }

    pub(crate) fn state_key_prefix(tp: &TopicPartition) -> Vec<u8> {
        let mut k = tp.topic.as_bytes().to_vec();
        k.push(STATE_KEY_SEPARATOR);
        k
    }

    /// Processes polled records. Returns `Some(reason)` when the halt policy
    /// stopped the transform (nothing after the failing record is processed).
    pub async fn process<S: OffsetSink>(
        &mut self,
        records: Vec<ConsumerRecord>,
        sink: &mut S,
    ) -> Result<Option<String>, TransformError> {
        self.absorb_resolved(sink, false).await?;
        let mut by_tp: Vec<(TopicPartition, Vec<ConsumerRecord>)> = Vec::new();
        for r in records {
            match by_tp.last_mut() {
                Some((tp, rs)) if tp.partition == r.partition && *tp.topic == *r.topic => {
                    rs.push(r)
                }
                _ => by_tp.push((TopicPartition::new(&*r.topic, r.partition), vec![r])),
            }
        }
        let mut point = CommitPoint {
            deliveries: Vec::new(),
            changelog: Vec::new(),
            offsets: Vec::new(),
        };
        let mut halted = None;
        for (tp, records) in by_tp {
            if !self.instances.contains_key(&tp) {
                continue; // revoked while the fetch was in flight
            }
            let headers: Vec<Vec<HeaderParam<'_>>> = records.iter().map(header_params).collect();
            let inputs: Vec<InputRecord<'_>> = records
                .iter()
                .zip(&headers)
                .map(|(r, h)| to_input(r, h))
                .collect();
            let halt_policy = self.deployment.on_error == ErrorPolicy::Halt;
            let instance = self.instances.get_mut(&tp).expect("checked above");
            let outcomes = run_wasm(|| instance.process(&inputs, halt_policy))?;
            let mut next = None;
            for (record, outcome) in records.iter().zip(outcomes) {
                let outcome = match outcome {
                    RecordOutcome::Output(outs) => match self.check_outputs(&outs) {
                        Ok(()) => RecordOutcome::Output(outs),
                        Err(e) => RecordOutcome::Failed(e),
                    },
                    failed => failed,
                };
                match outcome {
                    RecordOutcome::Output(outs) => {
                        self.counters.processed += 1;
                        for o in outs {
                            point
                                .deliveries
                                .push(send_output(&self.producer, &self.deployment, o).await?);
                            self.counters.outputs += 1;
                        }
                    }
                    RecordOutcome::Failed(error) => {
                        self.counters.failed += 1;
                        let at = format!("{}-{}@{}", record.topic, record.partition, record.offset);
                        self.last_error = Some(format!("{at}: {error}"));
                        tracing::warn!(transform = %self.deployment.name, record = %at, %error, "record failed");
                        match self.deployment.on_error {
                            ErrorPolicy::Skip => self.counters.skipped += 1,
                            ErrorPolicy::DeadLetter => {
                                point.deliveries.push(
                                    dead_letter(&self.producer, &self.deployment, record, &error)
                                        .await?,
                                );
                                self.counters.dead_lettered += 1;
                            }
                            ErrorPolicy::Halt => {
                                halted = Some(format!("record {at} failed: {error}"));
                                break;
                            }
                        }
                    }
                }
                next = Some(Offset(record.offset.0 + 1));
            }
            let instance = self.instances.get_mut(&tp).expect("checked above");
            for (key, value) in instance.state_mut().take_changelog() {
                let mut k = Self::state_key_prefix(&tp);
                k.extend_from_slice(&key);
                let partition = tp.partition % self.state_partitions.max(1);
                let topic = self.deployment.state_topic();
                point.changelog.push(match value {
                    Some(v) => ProducerRecord::new(topic, v).key(k).partition(partition),
                    None => ProducerRecord::tombstone(topic, k).partition(partition),
                });
            }
            let mut inst = self.instances.remove(&tp).expect("checked above");
            self.collect_logs(&tp, &mut inst);
            self.instances.insert(tp.clone(), inst);
            if let Some(next) = next {
                point.offsets.push((tp, next));
            }
            if halted.is_some() {
                break;
            }
        }
        if !point.offsets.is_empty() || !point.deliveries.is_empty() {
            self.in_flight += 1;
            self.commit_tx
                .send(point)
                .await
                .map_err(|_| TransformError::Client(ClientError::Closed))?;
        }
        Ok(halted)
    }

    fn check_outputs(&self, outs: &[OutputRecord]) -> Result<(), String> {
        for o in outs {
            if let Some(t) = &o.topic
                && !self.deployment.outputs.contains(t)
            {
                return Err(format!(
                    "the module wrote to topic {t}, which is not one of the transform's outputs ({})",
                    self.deployment.outputs.join(", ")
                ));
            }
        }
        Ok(())
    }

    fn collect_logs(&mut self, tp: &TopicPartition, inst: &mut TransformInstance) {
        let (lines, dropped) = inst.take_logs();
        let partition = Some(tp.to_string());
        for line in lines {
            self.pending_logs.push(LogRecord {
                instance: self.instance_id.clone(),
                partition: partition.clone(),
                line,
            });
        }
        if dropped > 0 {
            self.pending_logs.push(LogRecord {
                instance: self.instance_id.clone(),
                partition,
                line: crate::instance::LogLine {
                    timestamp_ms: now_ms(),
                    level: "warn".into(),
                    message: format!(
                        "{dropped} log lines were dropped (more than {} between flushes)",
                        crate::instance::LOG_LINES_BUFFERED_MAX
                    ),
                },
            });
        }
    }

    /// Commits what the committer resolved; with `wait`, until nothing is in flight.
    async fn absorb_resolved<S: OffsetSink>(
        &mut self,
        sink: &mut S,
        wait: bool,
    ) -> Result<(), TransformError> {
        let mut ready: HashMap<TopicPartition, Offset> = HashMap::new();
        while self.in_flight > 0 {
            let next = if wait {
                match self.resolved_rx.recv().await {
                    Some(r) => r,
                    None => return Err(TransformError::Client(ClientError::Closed)),
                }
            } else {
                match self.resolved_rx.try_recv() {
                    Ok(r) => r,
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        return Err(TransformError::Client(ClientError::Closed));
                    }
                }
            };
            self.in_flight -= 1;
            for (tp, o) in next? {
                ready.insert(tp, o);
            }
        }
        if !ready.is_empty() {
            sink.commit(ready.into_iter().collect()).await?;
        }
        Ok(())
    }

    /// Resolves and commits every pending commit point.
    pub async fn drain<S: OffsetSink>(&mut self, sink: &mut S) -> Result<(), TransformError> {
        self.producer.flush().await?;
        self.absorb_resolved(sink, true).await
    }

    /// Publishes status and log lines if [`STATUS_INTERVAL`] passed (or `force`).
    pub async fn publish_status(
        &mut self,
        state: &str,
        lag: u64,
        force: bool,
    ) -> Result<(), TransformError> {
        if !force && self.last_status.elapsed() < STATUS_INTERVAL {
            return Ok(());
        }
        self.last_status = Instant::now();
        let status = InstanceStatus {
            name: self.deployment.name.clone(),
            instance: self.instance_id.clone(),
            version: self.deployment.version,
            state: state.to_string(),
            partitions: self.instances.keys().map(|tp| tp.to_string()).collect(),
            processed: self.counters.processed,
            failed: self.counters.failed,
            dead_lettered: self.counters.dead_lettered,
            skipped: self.counters.skipped,
            outputs: self.counters.outputs,
            lag,
            last_error: self.last_error.clone(),
            updated_ms: now_ms(),
        };
        let value = serde_json::to_vec(&status).expect("status encodes");
        // Status and logs are best effort: they never hold up the data path.
        let _ = self
            .producer
            .send(ProducerRecord::new(STATUS_TOPIC, value).key(status.key()))
            .await?;
        for log in std::mem::take(&mut self.pending_logs) {
            let value = serde_json::to_vec(&log).expect("log line encodes");
            let _ = self
                .producer
                .send(ProducerRecord::new(LOGS_TOPIC, value).key(self.deployment.name.clone()))
                .await?;
        }
        Ok(())
    }

    /// Stops: resolves and commits everything pending, publishes a last status.
    pub async fn finish<S: OffsetSink>(
        mut self,
        sink: &mut S,
        end: &RunEnd,
    ) -> Result<(), TransformError> {
        let drained = self.drain(sink).await;
        let state = match end {
            RunEnd::Stopped => "stopped",
            RunEnd::Halted(_) => "halted",
        };
        if let RunEnd::Halted(reason) = end {
            self.last_error = Some(reason.clone());
        }
        let tps: Vec<TopicPartition> = self.instances.keys().cloned().collect();
        for tp in tps {
            if let Some(mut inst) = self.instances.remove(&tp) {
                self.collect_logs(&tp, &mut inst);
            }
        }
        self.publish_status(state, 0, true).await?;
        self.producer.close().await?;
        self.committer.abort();
        drained
    }

    /// The deployment as it should be stored after a halt.
    pub fn halted_deployment(&self, reason: &str) -> Deployment {
        let mut d = self.deployment.clone();
        d.state = RunState::Halted {
            reason: reason.to_string(),
        };
        d
    }
}

/// The state of `tp` as its changelog partition holds it.
async fn restore_state(
    client: &Client,
    deployment: &Deployment,
    state_partition: u32,
    tp: &TopicPartition,
) -> Result<StateStore, TransformError> {
    let mut state = StateStore::default();
    let stp = TopicPartition::new(deployment.state_topic(), state_partition);
    let prefix = Runner::state_key_prefix(tp);
    for r in read_to_end(client, &[stp]).await? {
        let Some(key) = r.key else { continue };
        if let Some(user_key) = key.strip_prefix(prefix.as_slice()) {
            state.restore(user_key.to_vec(), r.value.map(|v| v.to_vec()));
        }
    }
    Ok(state)
}

async fn send_output(
    producer: &Producer,
    deployment: &Deployment,
    o: OutputRecord,
) -> Result<DeliveryFuture, TransformError> {
    let topic = o.topic.unwrap_or_else(|| deployment.outputs[0].clone());
    let record = ProducerRecord {
        topic,
        partition: None,
        key: o.key.map(Bytes::from),
        value: o.value.map(Bytes::from),
        headers: o
            .headers
            .into_iter()
            .map(|h| Header {
                key: h.key,
                value: Bytes::from(h.value),
            })
            .collect(),
        timestamp_ms: None,
    };
    Ok(producer.send(record).await?)
}

/// The input record, with the error and where it came from in headers.
async fn dead_letter(
    producer: &Producer,
    deployment: &Deployment,
    record: &ConsumerRecord,
    error: &str,
) -> Result<DeliveryFuture, TransformError> {
    let mut headers = record.headers.clone();
    headers.push(Header {
        key: DLQ_ERROR_HEADER.into(),
        value: Bytes::from(error.to_string()),
    });
    headers.push(Header {
        key: DLQ_SOURCE_HEADER.into(),
        value: Bytes::from(format!(
            "{}-{}@{}",
            record.topic, record.partition, record.offset
        )),
    });
    let dlq = ProducerRecord {
        topic: deployment.dlq_topic(),
        partition: None,
        key: record.key.clone(),
        value: record.value.clone(),
        headers,
        timestamp_ms: Some(record.timestamp_ms),
    };
    Ok(producer.send(dlq).await?)
}

async fn resolve(point: CommitPoint, producer: &Producer) -> Resolved {
    for d in point.deliveries {
        d.await?;
    }
    let mut changelog = Vec::with_capacity(point.changelog.len());
    for r in point.changelog {
        changelog.push(producer.send(r).await?);
    }
    for d in changelog {
        d.await?;
    }
    Ok(point.offsets)
}

/// Runs guest code without stalling other tasks of a multi-threaded runtime.
fn run_wasm<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// A record's headers as the guest call borrows them.
fn header_params(r: &ConsumerRecord) -> Vec<HeaderParam<'_>> {
    r.headers
        .iter()
        .map(|h| HeaderParam {
            key: &h.key,
            value: &h.value,
        })
        .collect()
}

/// The input record as the guest call borrows it (no copy on the host side).
fn to_input<'a>(r: &'a ConsumerRecord, headers: &'a [HeaderParam<'a>]) -> InputRecord<'a> {
    InputRecord {
        topic: &r.topic,
        partition: r.partition,
        offset: r.offset.0,
        timestamp_ms: r.timestamp_ms,
        key: r.key.as_deref(),
        value: r.value.as_deref(),
        headers,
    }
}
