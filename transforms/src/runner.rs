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
//! durable (at least once), and the changelog never runs ahead of the outputs.
//! With the state writes, in one atomic batch, goes the partition's
//! checkpoint; with the outputs, an origin header: so a restart neither
//! applies a state write twice nor writes an output twice (see
//! `checkpoint.rs`). Up to [`COMMIT_POINTS_IN_FLIGHT_MAX`] points are in
//! flight, so processing runs ahead of acknowledgements; the changelog writes
//! of one point travel while the next point's outputs are awaited.
//!
//! Partitions come and go through [`Runner::assign`] and [`Runner::revoke`]:
//! on assignment the partition's state and checkpoint are restored from the
//! changelog topic and the outputs written after the checkpoint are noted; on
//! revocation every pending commit point is resolved and committed first.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rill_client::partitioner::partition_for_key;
use rill_client::{
    Client, ClientError, ConsumerRecord, DeliveryFuture, Header, Offset, OffsetSpec, Producer,
    ProducerConfig, ProducerRecord, TopicPartition,
};
use tokio::sync::mpsc;

use crate::batch::{Processed, TransformOutput};
use crate::checkpoint::{Checkpoint, ORIGIN_HEADER, ORIGIN_SCAN_SLACK_MS, Origins, Written};
use crate::deployment::{Deployment, ErrorPolicy, RunState};
use crate::error::TransformError;
use crate::instance::{Limits, TransformInstance, now_ms};
use crate::module::TransformModule;
use crate::registry::{
    InstanceStatus, LOGS_TOPIC, LogRecord, STATUS_TOPIC, read_between, read_committed_to_end,
    read_to_end,
};
use crate::state::StateStore;

/// Commit points queued behind the committer (back-pressure beyond).
pub const COMMIT_POINTS_IN_FLIGHT_MAX: usize = 16;
/// How often an instance publishes its status and flushes its log lines.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// Headers a dead-lettered record carries.
pub const DLQ_ERROR_HEADER: &str = "rill.transform.error";
pub const DLQ_SOURCE_HEADER: &str = "rill.transform.source";
/// The failed input record's own timestamp (the dead letter's is when it failed).
pub const DLQ_TIMESTAMP_HEADER: &str = "rill.transform.source-timestamp";
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
    /// Outputs not sent again after a restart: the run before wrote them.
    pub replayed_outputs_skipped: u64,
}

/// Offsets ready to commit, or the error that stops the runner.
type Resolved = Result<Vec<(TopicPartition, Offset)>, ClientError>;

struct CommitPoint {
    /// One delivery per output batch (records of one batch resolve together).
    deliveries: Vec<DeliveryFuture>,
    parts: Vec<PointPart>,
    /// When the point was made: outputs of later input records were sent after.
    made_ms: i64,
}

/// How many of the latest deliveries a new one is compared with: outputs
/// spread over a few partitions still keep one delivery per batch.
const SAME_BATCH_LOOKBACK: usize = 8;

impl CommitPoint {
    /// Adds a delivery the point waits for, unless one of the same batch is in.
    fn wait_for(&mut self, delivery: DeliveryFuture) {
        let recent = self.deliveries.len().saturating_sub(SAME_BATCH_LOOKBACK);
        if !self.deliveries[recent..]
            .iter()
            .any(|d| d.same_batch(&delivery))
        {
            self.deliveries.push(delivery);
        }
    }
}

/// One input partition's share of a commit point.
struct PointPart {
    tp: TopicPartition,
    state_partition: u32,
    /// The state writes, in order.
    state: Vec<ProducerRecord>,
    next: Offset,
    /// The checkpoint's time if not the point's (a recovery under way).
    since_ms: Option<i64>,
}

/// A point whose outputs are acknowledged and whose changelog writes are sent.
type Stage2 = Result<(Vec<DeliveryFuture>, Vec<(TopicPartition, Offset)>), ClientError>;

/// After an assignment: what the checkpoint covers and what was written past it.
#[derive(Debug)]
struct Recovery {
    /// Input records below this offset are in the restored state and outputs.
    resume: Option<i64>,
    written: Written,
    /// The restored checkpoint's time: while the run before's outputs lie
    /// ahead, a new checkpoint keeps it, so a second restart finds them too.
    since_ms: i64,
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
    recovery: HashMap<TopicPartition, Recovery>,
    /// Partition counts of the topics outputs go to.
    partition_counts: HashMap<String, u32>,
    state_partitions: u32,
    instance_id: String,
    pub counters: Counters,
    last_error: Option<String>,
    commit_tx: mpsc::Sender<CommitPoint>,
    resolved_rx: mpsc::Receiver<Resolved>,
    in_flight: usize,
    committer: [tokio::task::JoinHandle<()>; 2],
    last_status: Instant,
    pending_logs: Vec<LogRecord>,
    /// With exactly-once delivery: the input partitions' transactions.
    eos: Option<ExactlyOnce>,
}

/// Exactly-once delivery: one transactional producer per input partition
/// (transactional id `__transform-<name>-<topic>-<partition>`), whose
/// transaction holds the partition's outputs, state writes, checkpoint and
/// input offset until it commits (every `interval`). A new owner of the
/// partition initialises the same transactional id, which aborts the old
/// owner's open transaction and fences it.
struct ExactlyOnce {
    interval: Duration,
    producers: HashMap<TopicPartition, Producer>,
    /// Input partitions with an open transaction, and the offset it commits.
    open: HashMap<TopicPartition, Offset>,
    last_commit: Instant,
}

/// How long a transform's transaction may stay open before its coordinator
/// aborts it (a stalled or partitioned-away owner's).
pub const TRANSFORM_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The transactional id of a deployment's input partition.
pub fn transactional_id(deployment: &str, tp: &TopicPartition) -> String {
    format!("__transform-{deployment}-{}-{}", tp.topic, tp.partition)
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
        let (stage2_tx, mut stage2_rx) = mpsc::channel::<Stage2>(COMMIT_POINTS_IN_FLIGHT_MAX);
        let changelog_producer = producer.clone();
        let state_topic = deployment.state_topic();
        // Stage 1: outputs acknowledged, then the changelog batch sent.
        let outputs_acked = tokio::spawn(async move {
            while let Some(point) = commit_rx.recv().await {
                let result = write_changelog(point, &changelog_producer, &state_topic).await;
                let failed = result.is_err();
                if stage2_tx.send(result).await.is_err() || failed {
                    return;
                }
            }
        });
        // Stage 2: the changelog acknowledged, then the offsets are ready.
        let changelog_acked = tokio::spawn(async move {
            while let Some(sent) = stage2_rx.recv().await {
                let result = match sent {
                    Ok((acks, offsets)) => {
                        async {
                            for a in acks {
                                a.await?;
                            }
                            Ok(offsets)
                        }
                        .await
                    }
                    Err(e) => Err(e),
                };
                let failed = result.is_err();
                if resolved_tx.send(result).await.is_err() || failed {
                    return;
                }
            }
        });
        let committer = [outputs_acked, changelog_acked];
        let eos = match deployment.delivery {
            crate::deployment::Delivery::AtLeastOnce => None,
            crate::deployment::Delivery::ExactlyOnce { commit_interval_ms } => Some(ExactlyOnce {
                interval: Duration::from_millis(commit_interval_ms),
                producers: HashMap::new(),
                open: HashMap::new(),
                last_commit: Instant::now(),
            }),
        };
        Ok(Runner {
            deployment,
            module,
            client,
            producer,
            instances: HashMap::new(),
            recovery: HashMap::new(),
            partition_counts: HashMap::new(),
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
            eos,
        })
    }

    /// The producer that writes `tp`'s outputs and state (its transactional
    /// one with exactly-once delivery), its transaction begun.
    async fn producer_for(&mut self, tp: &TopicPartition) -> Result<Producer, TransformError> {
        let Some(eos) = &mut self.eos else {
            return Ok(self.producer.clone());
        };
        let producer = eos.producers.get(tp).cloned().ok_or_else(|| {
            TransformError::Deployment(format!("{tp} has no transactional producer"))
        })?;
        if !eos.open.contains_key(tp) {
            producer.begin_transaction().await?;
            eos.open.insert(tp.clone(), Offset(-1));
        }
        Ok(producer)
    }

    /// Commits every open transaction (outputs, state, checkpoint and input
    /// offset together), concurrently. If any fails (fenced by a new owner,
    /// or not committed and so aborted), the first error is returned once
    /// every commit was tried: the runner stops and starts again from the
    /// committed offsets.
    async fn commit_transactions(&mut self) -> Result<(), TransformError> {
        let Some(eos) = &mut self.eos else {
            return Ok(());
        };
        let group = self.deployment.group_id();
        let open: Vec<(TopicPartition, Offset)> = eos.open.drain().collect();
        eos.last_commit = Instant::now();
        // The partitions' transactions commit concurrently (each its own
        // transactional id and coordinator round trips).
        let mut commits = tokio::task::JoinSet::new();
        for (tp, next) in open {
            let producer = eos
                .producers
                .get(&tp)
                .expect("an open transaction has a producer")
                .clone();
            let group = group.clone();
            commits.spawn(async move {
                let result = async {
                    if next.0 >= 0 {
                        producer
                            .send_offsets_to_transaction(&group, &[(tp.clone(), next)])
                            .await?;
                    }
                    producer.commit_transaction().await
                }
                .await;
                (tp, producer, result)
            });
        }
        let mut failed: Option<TransformError> = None;
        while let Some(joined) = commits.join_next().await {
            let (tp, producer, result) = joined.map_err(|e| {
                TransformError::Deployment(format!("a transaction's commit task failed: {e}"))
            })?;
            let Err(e) = result else { continue };
            if e.txn_action() == rill_client::TxnAction::Fenced {
                // Another instance took the partition over (or the
                // coordinator timed the transaction out): this runner's
                // positions are past what committed, so it stops and
                // starts again from the committed offsets.
                tracing::warn!(transform = %self.deployment.name, %tp, error = %e, "fenced: another instance owns this partition now");
            } else {
                // Not committed: abort; the restarted runner processes
                // the records again from the committed offsets.
                let _ = producer.abort_transaction().await;
            }
            failed.get_or_insert(e.into());
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Forgets a partition: its instance, recovery, and transactional producer.
    async fn drop_partition(&mut self, tp: &TopicPartition) {
        if let Some(mut inst) = self.instances.remove(tp) {
            self.collect_logs(tp, &mut inst);
        }
        self.recovery.remove(tp);
        if let Some(eos) = &mut self.eos
            && let Some(p) = eos.producers.remove(tp)
        {
            eos.open.remove(tp);
            let _ = p.close().await;
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            memory_bytes_max: self.deployment.memory_bytes_max as usize,
            call_timeout: Duration::from_millis(self.deployment.call_timeout_ms),
        }
    }

    /// Starts instances for `tps`, each with its state restored.
    pub async fn assign(&mut self, tps: &[TopicPartition]) -> Result<(), TransformError> {
        let mut restored = Vec::new();
        for tp in tps {
            if self.instances.contains_key(tp) {
                continue;
            }
            if let Some(eos) = &mut self.eos {
                // Fences the partition's previous owner and aborts what it left
                // open, before the state is read back.
                let producer = self.client.producer(ProducerConfig {
                    linger: Duration::from_millis(2),
                    transactional_id: Some(transactional_id(&self.deployment.name, tp)),
                    transaction_timeout: TRANSFORM_TRANSACTION_TIMEOUT,
                    ..ProducerConfig::default()
                })?;
                producer.init_transactions().await?;
                eos.producers.insert(tp.clone(), producer);
            }
            let committed_only = self.eos.is_some();
            let (state, checkpoint) = restore_state(
                &self.client,
                &self.deployment,
                self.state_partition(tp),
                tp,
                committed_only,
            )
            .await?;
            let checkpoint = match checkpoint {
                Some(c) => c,
                None => self.first_checkpoint(tp).await?,
            };
            restored.push((tp.clone(), state, checkpoint));
        }
        // One read of the outputs serves every partition assigned together.
        let Some(since) = restored.iter().map(|(_, _, c)| c.since_ms).min() else {
            return Ok(());
        };
        // Exactly-once: what the previous owner wrote and did not commit was
        // aborted, so nothing is skipped on the replay.
        let mut written = if self.eos.is_some() {
            HashMap::new()
        } else {
            self.written_since(since).await?
        };
        for (tp, state, checkpoint) in restored {
            let written = written.remove(&tp).unwrap_or_default();
            if checkpoint.next.is_some() || !written.is_empty() {
                tracing::info!(
                    transform = %self.deployment.name, %tp, resume = ?checkpoint.next,
                    output_partitions = written.len(),
                    "resuming after the checkpoint; outputs written past it are not sent again"
                );
            }
            self.recovery.insert(
                tp.clone(),
                Recovery {
                    resume: checkpoint.next,
                    written,
                    since_ms: checkpoint.since_ms,
                },
            );
            let entries = state.len();
            let instance = TransformInstance::new(
                self.module.clone(),
                &self.deployment.name,
                self.deployment.config.clone(),
                self.limits(),
                state,
            )?;
            tracing::info!(transform = %self.deployment.name, %tp, restored = entries, "instance started");
            self.instances.insert(tp, instance);
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
            self.drop_partition(tp).await;
        }
        Ok(())
    }

    /// Writes the checkpoint of a partition that has none yet (its first
    /// assignment): nothing processed, no output sent before now.
    // `&mut self`: a Runner is Send but not Sync (its wasm stores are not).
    async fn first_checkpoint(
        &mut self,
        tp: &TopicPartition,
    ) -> Result<Checkpoint, TransformError> {
        let c = Checkpoint {
            next: None,
            since_ms: now_ms(),
        };
        let record = ProducerRecord::new(self.deployment.state_topic(), c.encode())
            .key(Checkpoint::key(tp))
            .partition(self.state_partition(tp));
        self.producer.send_and_wait(record).await?;
        Ok(c)
    }

    /// The topics this deployment writes outputs to.
    fn output_topics(&self) -> Vec<String> {
        let mut topics = self.deployment.outputs.clone();
        if self.deployment.on_error == ErrorPolicy::DeadLetter {
            topics.push(self.deployment.dlq_topic());
        }
        topics
    }

    /// Per input partition, what outputs from it each output partition got
    /// after `since_ms` (less the clock slack).
    async fn written_since(
        &mut self,
        since_ms: i64,
    ) -> Result<HashMap<TopicPartition, Written>, TransformError> {
        let mut tps = Vec::new();
        for topic in self.output_topics() {
            let n = self.partition_count(&topic).await?;
            tps.extend((0..n).map(|p| TopicPartition::new(&topic, p)));
        }
        let since = since_ms - ORIGIN_SCAN_SLACK_MS;
        let outputs = read_between(&self.client, &tps, OffsetSpec::Timestamp(since)).await?;
        Ok(Written::scan(&outputs))
    }

    async fn partition_count(&mut self, topic: &str) -> Result<u32, TransformError> {
        if let Some(n) = self.partition_counts.get(topic) {
            return Ok(*n);
        }
        let n = self.client.partition_count(topic).await?;
        self.partition_counts.insert(topic.to_string(), n);
        Ok(n)
    }

    /// Where an output goes: by key, or keyless to the input partition's
    /// number (so a replay sends it to the same partition).
    async fn destination(
        &mut self,
        from: &TopicPartition,
        topic: &str,
        key: Option<&[u8]>,
    ) -> Result<u32, TransformError> {
        let n = self.partition_count(topic).await?.max(1);
        Ok(match key {
            Some(k) => partition_for_key(k, n),
            None => from.partition % n,
        })
    }

    /// Whether output `index` of input `offset` of `from` to `to` was written
    /// by the run before a restart.
    fn written_before(
        &self,
        from: &TopicPartition,
        to: (&str, u32),
        offset: i64,
        index: u32,
    ) -> bool {
        // Most calls: no recovery under way, and nothing to allocate.
        !self.recovery.is_empty()
            && self.recovery.get(from).is_some_and(|r| {
                r.written
                    .contains(&TopicPartition::new(to.0, to.1), (offset, index))
            })
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
            parts: Vec::new(),
            made_ms: now_ms(),
        };
        let mut halted = None;
        for (tp, mut records) in by_tp {
            if !self.instances.contains_key(&tp) {
                continue; // revoked while the fetch was in flight
            }
            // Records the restored checkpoint covers are done already.
            let mut next = None;
            if let Some(resume) = self.recovery.get(&tp).and_then(|r| r.resume) {
                if let Some(last) = records.iter().filter(|r| r.offset.0 < resume).last() {
                    next = Some(Offset(last.offset.0 + 1));
                }
                records.retain(|r| r.offset.0 >= resume);
            }
            let halt_policy = self.deployment.on_error == ErrorPolicy::Halt;
            let origins = Origins::new(&tp);
            let producer = self.producer_for(&tp).await?;
            let Processed {
                mut outputs,
                results,
            } = if records.is_empty() {
                Processed::default()
            } else {
                let instance = self.instances.get_mut(&tp).expect("checked above");
                run_wasm(|| instance.process(&tp.topic, tp.partition, &records, halt_policy))?
            };
            let mut cursor = 0;
            for (record, result) in records.iter().zip(results) {
                let outcome = result.and_then(|n| {
                    let outs = &mut outputs[cursor..cursor + n];
                    cursor += n;
                    self.check_outputs(outs).map(|()| outs)
                });
                match outcome {
                    Ok(outs) => {
                        self.counters.processed += 1;
                        for (index, o) in outs.iter_mut().enumerate() {
                            let topic = o
                                .topic
                                .take()
                                .unwrap_or_else(|| self.deployment.outputs[0].clone());
                            let partition = self.destination(&tp, &topic, o.key.as_deref()).await?;
                            let to = TopicPartition { topic, partition };
                            if self.written_before(
                                &tp,
                                (&to.topic, partition),
                                record.offset.0,
                                index as u32,
                            ) {
                                self.counters.replayed_outputs_skipped += 1;
                                continue;
                            }
                            let origin = origins.value(record.offset.0, index as u32);
                            point.wait_for(
                                send_output(&producer, to, std::mem::take(o), origin).await?,
                            );
                            self.counters.outputs += 1;
                        }
                    }
                    Err(error) => {
                        self.counters.failed += 1;
                        let at = format!("{}-{}@{}", record.topic, record.partition, record.offset);
                        self.last_error = Some(format!("{at}: {error}"));
                        tracing::warn!(transform = %self.deployment.name, record = %at, %error, "record failed");
                        match self.deployment.on_error {
                            ErrorPolicy::Skip => self.counters.skipped += 1,
                            ErrorPolicy::DeadLetter => {
                                let dlq = self.deployment.dlq_topic();
                                let partition =
                                    self.destination(&tp, &dlq, record.key.as_deref()).await?;
                                let to = TopicPartition::new(dlq, partition);
                                if self.written_before(
                                    &tp,
                                    (&to.topic, partition),
                                    record.offset.0,
                                    0,
                                ) {
                                    self.counters.replayed_outputs_skipped += 1;
                                } else {
                                    let origin = origins.value(record.offset.0, 0);
                                    point.wait_for(
                                        dead_letter(&producer, to, record, &error, origin).await?,
                                    );
                                }
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
            let state_partition = self.state_partition(&tp);
            let topic = self.deployment.state_topic();
            let state: Vec<ProducerRecord> = self
                .instances
                .get_mut(&tp)
                .expect("checked above")
                .state_mut()
                .take_changelog()
                .into_iter()
                .map(|(key, value)| {
                    let mut k = Self::state_key_prefix(&tp);
                    k.extend_from_slice(&key);
                    match value {
                        Some(v) => ProducerRecord::new(&topic, v).key(k),
                        None => ProducerRecord::tombstone(&topic, k),
                    }
                    .partition(state_partition)
                })
                .collect();
            let mut inst = self.instances.remove(&tp).expect("checked above");
            self.collect_logs(&tp, &mut inst);
            self.instances.insert(tp.clone(), inst);
            if let Some(next) = next
                && let Some(eos) = &mut self.eos
            {
                // Into the partition's transaction: state writes, the
                // checkpoint, and (at commit) the input offset.
                let checkpoint = Checkpoint {
                    next: Some(next.0),
                    since_ms: point.made_ms,
                };
                for r in state {
                    drop(producer.send(r).await?);
                }
                let record = ProducerRecord::new(&topic, checkpoint.encode())
                    .key(Checkpoint::key(&tp))
                    .partition(state_partition);
                drop(producer.send(record).await?);
                eos.open.insert(tp.clone(), next);
                self.recovery.remove(&tp);
            } else if let Some(next) = next {
                self.end_recovery_before(&tp, next);
                let since_ms = self.recovery.get(&tp).map(|r| r.since_ms);
                point.parts.push(PointPart {
                    tp,
                    state_partition,
                    state,
                    next,
                    since_ms,
                });
            } else {
                // Only a record that failed under `halt` came: its writes are dropped.
                debug_assert!(state.is_empty(), "state writes without a processed record");
            }
            if halted.is_some() {
                break;
            }
        }
        if let Some(eos) = &self.eos {
            // The outputs' deliveries resolve with the transaction's commit.
            drop(point);
            if eos.last_commit.elapsed() >= eos.interval || halted.is_some() {
                self.commit_transactions().await?;
            }
        } else if !point.parts.is_empty() || !point.deliveries.is_empty() {
            self.in_flight += 1;
            self.commit_tx
                .send(point)
                .await
                .map_err(|_| TransformError::Client(ClientError::Closed))?;
        }
        Ok(halted)
    }

    /// Forgets the recovery of `tp` once processing reached `next` and no
    /// output written before the restart lies beyond.
    fn end_recovery_before(&mut self, tp: &TopicPartition, next: Offset) {
        let done = self.recovery.get(tp).is_some_and(|r| {
            r.resume.is_none_or(|resume| next.0 >= resume) && !r.written.reaches(next.0)
        });
        if done {
            self.recovery.remove(tp);
            if self.counters.replayed_outputs_skipped > 0 {
                tracing::info!(
                    transform = %self.deployment.name, %tp,
                    skipped = self.counters.replayed_outputs_skipped,
                    "caught up with the outputs written before the restart"
                );
            }
        }
    }

    fn check_outputs(&self, outs: &[TransformOutput]) -> Result<(), String> {
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
        self.commit_transactions().await?;
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
            contract: Some(self.module.contract_version().to_string()),
        };
        let value = serde_json::to_vec(&status).expect("status encodes");
        // Status and logs are best effort: they never hold up the data path.
        let delivery = self
            .producer
            .send(ProducerRecord::new(STATUS_TOPIC, value).key(status.key()))
            .await?;
        drop(delivery); // not awaited: best effort
        for log in std::mem::take(&mut self.pending_logs) {
            let value = serde_json::to_vec(&log).expect("log line encodes");
            let delivery = self
                .producer
                .send(ProducerRecord::new(LOGS_TOPIC, value).key(self.deployment.name.clone()))
                .await?;
            drop(delivery);
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
        if let Some(eos) = &mut self.eos {
            for (_, p) in eos.producers.drain() {
                let _ = p.close().await;
            }
        }
        self.producer.close().await?;
        for task in &self.committer {
            task.abort();
        }
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

/// The state and checkpoint of `tp` as its changelog partition holds them.
async fn restore_state(
    client: &Client,
    deployment: &Deployment,
    state_partition: u32,
    tp: &TopicPartition,
    committed_only: bool,
) -> Result<(StateStore, Option<Checkpoint>), TransformError> {
    let mut state = StateStore::default();
    let mut checkpoint = None;
    let stp = TopicPartition::new(deployment.state_topic(), state_partition);
    let prefix = Runner::state_key_prefix(tp);
    let records = if committed_only {
        read_committed_to_end(client, &[stp]).await?
    } else {
        read_to_end(client, &[stp]).await?
    };
    for r in records {
        if let Some(c) = Checkpoint::decode_for(tp, &r) {
            checkpoint = Some(c);
            continue;
        }
        let Some(key) = r.key else { continue };
        if let Some(user_key) = key.strip_prefix(prefix.as_slice()) {
            state.restore(user_key.to_vec(), r.value.map(|v| v.to_vec()));
        }
    }
    Ok((state, checkpoint))
}

async fn send_output(
    producer: &Producer,
    to: TopicPartition,
    o: TransformOutput,
    origin: Bytes,
) -> Result<DeliveryFuture, TransformError> {
    let mut headers = o.headers;
    headers.push(Header {
        key: ORIGIN_HEADER.into(),
        value: origin,
    });
    let record = ProducerRecord {
        topic: to.topic.into(),
        partition: Some(to.partition),
        key: o.key,
        value: o.value,
        headers,
        timestamp_ms: None,
    };
    Ok(producer.send(record).await?)
}

/// The input record, with the error and where it came from in headers. It is
/// stamped with the time it failed (a restart finds it by that time); its own
/// timestamp goes in a header.
async fn dead_letter(
    producer: &Producer,
    to: TopicPartition,
    record: &ConsumerRecord,
    error: &str,
    origin: Bytes,
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
    headers.push(Header {
        key: DLQ_TIMESTAMP_HEADER.into(),
        value: Bytes::from(record.timestamp_ms.to_string()),
    });
    headers.push(Header {
        key: ORIGIN_HEADER.into(),
        value: origin,
    });
    let dlq = ProducerRecord {
        topic: to.topic.into(),
        partition: Some(to.partition),
        key: record.key.clone(),
        value: record.value.clone(),
        headers,
        timestamp_ms: None,
    };
    Ok(producer.send(dlq).await?)
}

/// Waits for a point's outputs, then sends each partition's state writes and
/// checkpoint as one atomic batch; returns their delivery futures and the
/// offsets to commit once those resolve.
async fn write_changelog(point: CommitPoint, producer: &Producer, state_topic: &str) -> Stage2 {
    for d in point.deliveries {
        d.await?;
    }
    let mut acks = Vec::new();
    let mut offsets = Vec::with_capacity(point.parts.len());
    for part in point.parts {
        let checkpoint = Checkpoint {
            next: Some(part.next.0),
            since_ms: part.since_ms.unwrap_or(point.made_ms),
        };
        let mut batch = part.state;
        batch.push(
            ProducerRecord::new(state_topic, checkpoint.encode())
                .key(Checkpoint::key(&part.tp))
                .partition(part.state_partition),
        );
        match producer.send_atomic(batch.clone()).await {
            Ok(sent) => acks.extend(sent),
            Err(ClientError::RecordTooLarge { size, max, .. }) => {
                // One batch cannot hold them: write them in order, checkpoint
                // last. A crash between the two could apply part of them twice.
                tracing::warn!(
                    partition = %part.tp, size, max,
                    "the state writes of one poll are larger than a request: written \
                     without the atomic checkpoint (a crash now could repeat some of them)"
                );
                for r in batch {
                    acks.push(producer.send(r).await?);
                }
            }
            Err(e) => return Err(e),
        }
        offsets.push((part.tp, part.next));
    }
    Ok((acks, offsets))
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
