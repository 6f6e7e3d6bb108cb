//! The [`Consumer`]: reads assigned partitions from their leaders, with fetches
//! pipelined behind the application.
//!
//! Positions: each assigned partition has a *position* (the next offset `poll`
//! returns) and a *fetch offset* (the next offset to ask the broker for). The
//! fetch offset runs ahead: when a fetch response arrives, the next fetch for the
//! partition is sent at once (from the batch headers alone), so while the
//! application handles one response the next is already on its way. Each
//! partition has at most one fetch in flight and at most
//! [`BUFFERED_RESPONSES_PER_PARTITION_MAX`] undecoded responses waiting, so memory
//! is bounded by partitions x `max_partition_fetch_bytes` x that bound.
//!
//! Seeks bump the partition's *generation*; responses from an older generation
//! are dropped, so no stale record is returned after a seek.
//!
//! Fetch tasks live in a `JoinSet` owned by the consumer: dropping the consumer
//! cancels them.

mod decode;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rill_proto::types::TimestampMs;
use rill_proto::wire::{
    AbortedRange, ErrorCode, FetchPartition, FetchRequest, FetchResponse, ListOffsetsPartition,
    ListOffsetsRequest, OffsetSpec,
};
use rill_proto::{Offset, Rope};
use tokio::task::JoinSet;

use crate::TopicPartition;
use crate::client::Client;
use crate::config::{ConsumerConfig, OffsetReset, exponential_backoff};
use crate::error::{ClientError, needs_metadata_refresh};

pub use decode::ConsumerRecord;

/// Undecoded fetch responses a partition may have waiting for `poll`.
pub const BUFFERED_RESPONSES_PER_PARTITION_MAX: usize = 2;
/// The default pause before fetching again from a partition whose fetch
/// failed ([`ConsumerConfig::retry_backoff`], which doubles it per failure in
/// a row); also the least time between two metadata refreshes the consumer asks for.
pub const FETCH_RETRY_BACKOFF: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct PartitionState {
    topic: Arc<str>,
    position: Option<Offset>,
    fetch_offset: Offset,
    generation: u64,
    in_flight: bool,
    buffered: usize,
    /// The partition's backoff: fetch again no sooner than `until`, unless
    /// the leader is no longer `from`.
    backoff: Option<Backoff>,
    /// Fetches of the partition that failed in a row (0 after one that did not).
    failures: u32,
    high_watermark: Option<Offset>,
}

/// Why and how long a partition waits before its next fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Backoff {
    until: Instant,
    /// The broker whose fetch failed.
    from: i32,
}

impl PartitionState {
    /// Records a failed fetch from broker `from`: the next one waits
    /// `retry_backoff` doubled per failure in a row.
    fn fetch_failed(&mut self, from: i32, now: Instant, config: &ConsumerConfig) {
        self.failures = self.failures.saturating_add(1);
        let pause = exponential_backoff(
            config.retry_backoff,
            config.retry_backoff_max,
            self.failures,
        );
        self.backoff = Some(Backoff {
            until: now + pause,
            from,
        });
    }

    /// Whether the partition may be fetched from `leader` at `now`: no
    /// backoff, its pause is over, or the leader moved since (KIP-951: the
    /// new leader is not the broker that failed).
    fn may_fetch(&self, leader: i32, now: Instant) -> bool {
        self.backoff
            .is_none_or(|b| b.until <= now || b.from != leader)
    }
}

/// When a consumer with no fetch in flight should look again: when the
/// first pause still running ends, or when a metadata refresh it needs is
/// due (a refresh may name a new leader, which ends a pause). A pause already
/// over is no reason to wake: its partition was fetched unless it could not
/// be (no leader, which asks for a refresh; a full buffer, which `poll`
/// empties first). `None`: nothing to wait for but the caller's deadline.
fn next_wake(
    backoffs: impl Iterator<Item = Backoff>,
    refresh_due: Option<Instant>,
    now: Instant,
) -> Option<Instant> {
    backoffs
        .map(|b| b.until)
        .filter(|&until| until > now)
        .chain(refresh_due)
        .min()
}

#[derive(Debug)]
struct Chunk {
    tp: TopicPartition,
    generation: u64,
    data: Result<Rope, ClientError>,
    /// Aborted transactions in `data` (read_committed fetches only).
    aborted: Vec<AbortedRange>,
}

#[derive(Debug)]
struct FetchOutcome {
    /// The broker asked.
    broker: i32,
    sent: Vec<(TopicPartition, u64, Offset)>,
    result: Result<(FetchResponse, Rope), ClientError>,
}

/// Reads records from the partitions it is assigned. Get one with
/// [`Client::consumer`].
#[derive(Debug)]
pub struct Consumer {
    client: Client,
    config: ConsumerConfig,
    partitions: HashMap<TopicPartition, PartitionState>,
    fetches: JoinSet<FetchOutcome>,
    buffered: VecDeque<Chunk>,
    refresh_needed: bool,
    last_refresh: Option<Instant>,
    next_generation: u64,
}

impl Consumer {
    pub(crate) fn new(client: Client, config: ConsumerConfig) -> Result<Consumer, ClientError> {
        config.validate(client.config().max_response_bytes)?;
        Ok(Consumer {
            client,
            config,
            partitions: HashMap::new(),
            fetches: JoinSet::new(),
            buffered: VecDeque::new(),
            refresh_needed: false,
            last_refresh: None,
            next_generation: 1,
        })
    }

    /// Reads exactly these partitions from now on (replacing the assignment).
    /// Partitions kept from the previous assignment keep their positions.
    pub fn assign(&mut self, partitions: Vec<TopicPartition>) {
        let mut next = HashMap::with_capacity(partitions.len());
        for tp in partitions {
            let state = match self.partitions.remove(&tp) {
                Some(s) => s,
                None => {
                    self.next_generation += 1;
                    PartitionState {
                        topic: Arc::from(tp.topic.as_str()),
                        position: None,
                        fetch_offset: Offset(0),
                        generation: self.next_generation,
                        in_flight: false,
                        buffered: 0,
                        backoff: None,
                        failures: 0,
                        high_watermark: None,
                    }
                }
            };
            next.insert(tp, state);
        }
        self.partitions = next;
    }

    /// Assigns every partition of `topic` (per the metadata); returns them.
    pub async fn assign_topic(&mut self, topic: &str) -> Result<Vec<TopicPartition>, ClientError> {
        let meta = self.client.topic(topic).await?;
        let mut tps: Vec<TopicPartition> = meta
            .partitions
            .iter()
            .map(|p| TopicPartition::new(topic, p.partition))
            .collect();
        tps.sort();
        self.assign(tps.clone());
        Ok(tps)
    }

    /// The assigned partitions, sorted.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        let mut tps: Vec<TopicPartition> = self.partitions.keys().cloned().collect();
        tps.sort();
        tps
    }

    fn state(&mut self, tp: &TopicPartition) -> Result<&mut PartitionState, ClientError> {
        self.partitions.get_mut(tp).ok_or_else(|| {
            ClientError::Config(format!(
                "{tp} is not assigned to this consumer: assign it first"
            ))
        })
    }

    /// The next `poll` returns records from `offset` on (for `tp`).
    pub fn seek(&mut self, tp: &TopicPartition, offset: Offset) -> Result<(), ClientError> {
        self.next_generation += 1;
        let generation = self.next_generation;
        let st = self.state(tp)?;
        st.position = Some(offset);
        st.fetch_offset = offset;
        st.generation = generation;
        st.in_flight = false;
        st.buffered = 0;
        st.backoff = None;
        st.failures = 0;
        Ok(())
    }

    async fn seek_to_spec(
        &mut self,
        tps: &[TopicPartition],
        spec: OffsetSpec,
    ) -> Result<(), ClientError> {
        for tp in tps {
            self.state(tp)?;
        }
        let found = self.client.list_offsets(tps, spec).await?;
        for (tp, offset) in found {
            self.seek(&tp, offset)?;
        }
        Ok(())
    }

    /// Seeks to the first offset still kept.
    pub async fn seek_to_beginning(&mut self, tps: &[TopicPartition]) -> Result<(), ClientError> {
        self.seek_to_spec(tps, OffsetSpec::Earliest).await
    }

    /// Seeks to the log end: only records produced from now on.
    pub async fn seek_to_end(&mut self, tps: &[TopicPartition]) -> Result<(), ClientError> {
        let end = self.end_spec();
        self.seek_to_spec(tps, end).await
    }

    /// "The end" as this consumer sees it: the high watermark, or for a
    /// `read_committed` consumer the last stable offset.
    fn end_spec(&self) -> OffsetSpec {
        match self.config.isolation {
            rill_proto::wire::Isolation::ReadCommitted => OffsetSpec::LastStable,
            rill_proto::wire::Isolation::ReadUncommitted => OffsetSpec::Latest,
        }
    }

    /// Seeks every assigned partition to its first record at or after
    /// `timestamp_ms` (to the log end where there is none).
    pub async fn seek_to_timestamp(
        &mut self,
        timestamp_ms: TimestampMs,
    ) -> Result<(), ClientError> {
        let tps = self.assignment();
        self.seek_to_spec(&tps, OffsetSpec::Timestamp(timestamp_ms))
            .await
    }

    /// The next offset `poll` will return for `tp` (resolving the reset policy if
    /// the partition has no position yet).
    pub async fn position(&mut self, tp: &TopicPartition) -> Result<Offset, ClientError> {
        if let Some(p) = self.state(tp)?.position {
            return Ok(p);
        }
        self.resolve_positions().await?;
        self.state(tp)?
            .position
            .ok_or_else(|| ClientError::Config(format!("no position for {tp} yet: seek first")))
    }

    /// The next offset `poll` returns for `tp`, if it has one (no lookup).
    pub fn current_position(&self, tp: &TopicPartition) -> Option<Offset> {
        self.partitions.get(tp).and_then(|s| s.position)
    }

    /// The high watermark of `tp` as of the last fetch (`None` before one).
    pub fn high_watermark(&self, tp: &TopicPartition) -> Option<Offset> {
        self.partitions.get(tp).and_then(|s| s.high_watermark)
    }

    /// Gives positions to partitions without one, per `auto_offset_reset`.
    async fn resolve_positions(&mut self) -> Result<(), ClientError> {
        let missing: Vec<TopicPartition> = self
            .partitions
            .iter()
            .filter(|(_, s)| s.position.is_none())
            .map(|(tp, _)| tp.clone())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let spec = match self.config.auto_offset_reset {
            OffsetReset::Earliest => OffsetSpec::Earliest,
            OffsetReset::Latest => self.end_spec(),
            OffsetReset::None => {
                return Err(ClientError::Config(format!(
                    "no position for {}: seek first, or set auto_offset_reset to earliest or latest",
                    missing[0]
                )));
            }
        };
        let found = self.client.list_offsets(&missing, spec).await?;
        for (tp, offset) in found {
            self.seek(&tp, offset)?;
        }
        Ok(())
    }

    /// Sends a fetch to each leader for its partitions that have room for one.
    fn start_fetches(&mut self) {
        let now = Instant::now();
        let mut by_broker: HashMap<i32, Vec<FetchPartition>> = HashMap::new();
        let mut sent: HashMap<i32, Vec<(TopicPartition, u64, Offset)>> = HashMap::new();
        for (tp, st) in &mut self.partitions {
            if st.in_flight
                || st.position.is_none()
                || st.buffered >= BUFFERED_RESPONSES_PER_PARTITION_MAX
            {
                continue;
            }
            let Some(leader) = self.client.leader(&tp.topic, tp.partition) else {
                self.refresh_needed = true;
                continue;
            };
            if !st.may_fetch(leader, now) {
                continue;
            }
            st.in_flight = true;
            st.backoff = None;
            by_broker.entry(leader).or_default().push(FetchPartition {
                topic: tp.topic.clone(),
                partition: tp.partition,
                offset: st.fetch_offset,
                max_bytes: self.config.max_partition_fetch_bytes,
                current_leader_epoch: None,
            });
            sent.entry(leader)
                .or_default()
                .push((tp.clone(), st.generation, st.fetch_offset));
        }
        for (broker, partitions) in by_broker {
            let req = FetchRequest {
                max_wait_ms: self.config.fetch_max_wait.as_millis().min(u32::MAX as u128) as u32,
                min_bytes: self.config.fetch_min_bytes,
                max_bytes: self.config.fetch_max_bytes,
                replica_id: None,
                isolation: self.config.isolation,
                partitions,
            };
            let sent = sent.remove(&broker).unwrap_or_default();
            let client = self.client.clone();
            self.fetches.spawn(async move {
                let result = client.call_rope(broker, &req).await;
                FetchOutcome {
                    broker,
                    sent,
                    result,
                }
            });
        }
    }

    /// Folds a finished fetch into the partitions' state and the buffer.
    fn absorb(&mut self, outcome: FetchOutcome) {
        let now = Instant::now();
        let (resp, payload) = match outcome.result {
            Ok(r) => r,
            Err(e) => {
                let retriable = e.is_retriable();
                if retriable {
                    tracing::debug!(error = %e, "fetch failed; will retry");
                    self.refresh_needed = true;
                }
                let shared = e.into_shared();
                for (tp, generation, _) in outcome.sent {
                    if let Some(st) = self.partitions.get_mut(&tp) {
                        if st.generation != generation {
                            continue;
                        }
                        st.in_flight = false;
                        st.fetch_failed(outcome.broker, now, &self.config);
                        if !retriable {
                            st.buffered += 1;
                            self.buffered.push_back(Chunk {
                                tp,
                                generation,
                                data: Err(ClientError::Shared(shared.clone())),
                                aborted: Vec::new(),
                            });
                        }
                    }
                }
                return;
            }
        };
        let pieces = match payload.split(resp.partitions.iter().map(|p| p.bytes_len)) {
            Ok(p) => p,
            Err(e) => {
                let shared = ClientError::decode("fetch response payload", e).into_shared();
                for (tp, generation, _) in outcome.sent {
                    if let Some(st) = self.partitions.get_mut(&tp)
                        && st.generation == generation
                    {
                        st.in_flight = false;
                        st.fetch_failed(outcome.broker, now, &self.config);
                        st.buffered += 1;
                        self.buffered.push_back(Chunk {
                            tp,
                            generation,
                            data: Err(ClientError::Shared(shared.clone())),
                            aborted: Vec::new(),
                        });
                    }
                }
                return;
            }
        };
        let mut answered = vec![false; outcome.sent.len()];
        for (part, data) in resp.partitions.into_iter().zip(pieces) {
            let Some(idx) = outcome
                .sent
                .iter()
                .position(|(tp, _, _)| tp.topic == part.topic && tp.partition == part.partition)
            else {
                continue;
            };
            answered[idx] = true;
            let (tp, generation, fetched_at) = outcome.sent[idx].clone();
            let reset = self.config.auto_offset_reset;
            let Some(st) = self.partitions.get_mut(&tp) else {
                continue;
            };
            if st.generation != generation {
                continue;
            }
            st.in_flight = false;
            st.high_watermark = Some(part.high_watermark);
            let mut part_aborted = part.aborted;
            match part.error {
                None => {
                    if data.is_empty() {
                        st.failures = 0;
                        continue;
                    }
                    match decode::next_fetch_offset(&data) {
                        Some(next) => {
                            st.failures = 0;
                            st.fetch_offset = st.fetch_offset.max(next);
                        }
                        None => {
                            // Nothing whole in the data: the batch at the fetch
                            // offset is larger than the partition fetch bound.
                            st.fetch_failed(outcome.broker, now, &self.config);
                            st.buffered += 1;
                            self.buffered.push_back(Chunk {
                                tp: tp.clone(),
                                generation,
                                data: Err(ClientError::Config(format!(
                                    "the batch at offset {fetched_at} of {tp} is larger than max_partition_fetch_bytes ({} bytes): raise it",
                                    self.config.max_partition_fetch_bytes
                                ))),
                                aborted: Vec::new(),
                            });
                            continue;
                        }
                    }
                    st.buffered += 1;
                    self.buffered.push_back(Chunk {
                        tp,
                        generation,
                        data: Ok(data),
                        aborted: std::mem::take(&mut part_aborted),
                    });
                }
                Some(e) if e.code == ErrorCode::OffsetOutOfRange && reset != OffsetReset::None => {
                    tracing::info!(%tp, offset = %fetched_at, ?reset, "fetch offset out of range; resetting");
                    st.position = None;
                }
                Some(e) if e.code.is_retriable() => {
                    if needs_metadata_refresh(e.code) {
                        self.refresh_needed = true;
                    }
                    st.fetch_failed(outcome.broker, now, &self.config);
                }
                Some(e) => {
                    st.fetch_failed(outcome.broker, now, &self.config);
                    st.buffered += 1;
                    self.buffered.push_back(Chunk {
                        tp: tp.clone(),
                        generation,
                        data: Err(ClientError::broker(
                            format!("fetch {tp} at offset {fetched_at}"),
                            e,
                        )),
                        aborted: Vec::new(),
                    });
                }
            }
        }
        // Partitions the broker did not answer for: try again after a pause.
        for (i, (tp, generation, _)) in outcome.sent.into_iter().enumerate() {
            if answered[i] {
                continue;
            }
            if let Some(st) = self.partitions.get_mut(&tp)
                && st.generation == generation
            {
                st.in_flight = false;
                st.fetch_failed(outcome.broker, now, &self.config);
            }
        }
    }

    async fn refresh_if_needed(&mut self) {
        if !self.refresh_needed {
            return;
        }
        if self
            .last_refresh
            .is_some_and(|t| t.elapsed() < FETCH_RETRY_BACKOFF)
        {
            return;
        }
        let since = Instant::now();
        self.last_refresh = Some(since);
        self.refresh_needed = false;
        if let Err(e) = self.client.refresh_metadata(since).await {
            tracing::debug!(error = %e, "consumer metadata refresh failed");
            self.refresh_needed = true;
        }
    }

    /// Returns the next records (from one partition's fetched batches), waiting
    /// up to `timeout` for some to arrive. An empty result means none arrived in
    /// time.
    ///
    /// Cancel-safe: dropping the future (e.g. in `tokio::select!`) loses no
    /// records; fetches in flight carry on and the next `poll` picks them up.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>, ClientError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            while let Some(done) = self.fetches.try_join_next() {
                self.absorb(done.map_err(|_| ClientError::Closed)?);
            }
            self.refresh_if_needed().await;
            self.resolve_positions().await?;
            self.start_fetches();

            while let Some(chunk) = self.buffered.pop_front() {
                let Some(st) = self.partitions.get_mut(&chunk.tp) else {
                    continue;
                };
                if st.generation != chunk.generation {
                    continue;
                }
                st.buffered -= 1;
                let data = chunk.data?;
                let Some(position) = st.position else {
                    continue;
                };
                let mut out = Vec::new();
                let decoded = decode::decode_batches(
                    &st.topic,
                    chunk.tp.partition,
                    &data,
                    position,
                    &chunk.aborted,
                    &mut out,
                )
                .map_err(|e| ClientError::CorruptBatch {
                    topic: chunk.tp.topic.clone(),
                    partition: chunk.tp.partition,
                    offset: e.offset,
                    source: e.error,
                })?;
                if let Some(next) = decoded.next_offset {
                    st.position = Some(position.max(next));
                }
                // Room freed: keep the next fetch in flight while the caller works.
                self.start_fetches();
                if !out.is_empty() {
                    return Ok(out);
                }
            }

            if self.fetches.is_empty() {
                // Nothing in flight: partitions are backing off (or none
                // assigned, or without a leader).
                let now = Instant::now();
                let refresh_due = self
                    .refresh_needed
                    .then(|| self.last_refresh.map_or(now, |t| t + FETCH_RETRY_BACKOFF));
                let wake = next_wake(
                    self.partitions.values().filter_map(|s| s.backoff),
                    refresh_due,
                    now,
                )
                .map(tokio::time::Instant::from_std)
                .unwrap_or(deadline)
                .min(deadline)
                .max(tokio::time::Instant::now() + Duration::from_millis(1));
                tokio::time::sleep_until(wake).await;
                if tokio::time::Instant::now() >= deadline {
                    return Ok(Vec::new());
                }
                continue;
            }
            match tokio::time::timeout_at(deadline, self.fetches.join_next()).await {
                Err(_) => return Ok(Vec::new()),
                Ok(None) => {}
                Ok(Some(done)) => self.absorb(done.map_err(|_| ClientError::Closed)?),
            }
        }
    }
}

/// How long `list_offsets` waits for partitions without a leader to get one.
const LIST_OFFSETS_LEADER_WAIT: Duration = Duration::from_secs(10);

impl Client {
    /// Looks up an offset of each partition at its leader: the earliest, the
    /// latest (log end), or the first at or after a timestamp.
    pub async fn list_offsets(
        &self,
        tps: &[TopicPartition],
        spec: OffsetSpec,
    ) -> Result<Vec<(TopicPartition, Offset)>, ClientError> {
        let mut pending: Vec<TopicPartition> = tps.to_vec();
        let mut out = Vec::with_capacity(tps.len());
        // A partition without a leader (an election in progress, a broker just
        // died) is retried with fresh metadata until this deadline.
        let deadline = Instant::now() + LIST_OFFSETS_LEADER_WAIT;
        let mut backoff = Duration::from_millis(50);
        loop {
            let waiting = Instant::now() < deadline;
            let mut by_broker: HashMap<i32, Vec<TopicPartition>> = HashMap::new();
            let mut leaderless = Vec::new();
            for tp in pending.drain(..) {
                match self.leader(&tp.topic, tp.partition) {
                    Some(b) => by_broker.entry(b).or_default().push(tp),
                    None => leaderless.push(tp),
                }
            }
            let mut retry = leaderless;
            let mut last_error = None;
            for (broker, group) in by_broker {
                let req = ListOffsetsRequest {
                    partitions: group
                        .iter()
                        .map(|tp| ListOffsetsPartition {
                            topic: tp.topic.clone(),
                            partition: tp.partition,
                            spec,
                        })
                        .collect(),
                };
                let resp = match self.call(Some(broker), &req, &[]).await {
                    Ok((resp, _)) => resp,
                    Err(e) if e.is_retriable() && waiting => {
                        retry.extend(group);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                for tp in group {
                    let found = resp
                        .partitions
                        .iter()
                        .find(|r| r.topic == tp.topic && r.partition == tp.partition);
                    match found {
                        Some(r) => match &r.error {
                            None => out.push((tp, r.offset)),
                            // (A restarted leader: retried; past the wait the
                            // broker's error names it.)
                            Some(e)
                                if (needs_metadata_refresh(e.code)
                                    || e.code == ErrorCode::OffsetNotAvailable)
                                    && waiting =>
                            {
                                retry.push(tp)
                            }
                            Some(e) => {
                                return Err(ClientError::broker(
                                    format!("list offsets of {tp}"),
                                    e.clone(),
                                ));
                            }
                        },
                        None => {
                            last_error = Some(ClientError::Config(format!(
                                "broker {broker} did not answer for {tp}"
                            )));
                        }
                    }
                }
            }
            if let Some(e) = last_error {
                return Err(e);
            }
            if retry.is_empty() {
                return Ok(out);
            }
            if !waiting {
                let tp = &retry[0];
                if self.inner.metadata.read().topics.contains_key(&tp.topic) {
                    return Err(ClientError::Config(format!(
                        "{tp} has no leader (or does not exist): check `rill topic describe {}`",
                        tp.topic
                    )));
                }
                return Err(ClientError::UnknownTopic(tp.topic.clone()));
            }
            tokio::time::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())))
                .await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
            if let Err(e) = self.refresh_metadata(Instant::now()).await
                && Instant::now() >= deadline
            {
                return Err(e);
            }
            // A topic the cluster does not know is not waited for.
            if let Some(tp) = retry
                .iter()
                .find(|tp| !self.inner.metadata.read().topics.contains_key(&tp.topic))
            {
                return Err(ClientError::UnknownTopic(tp.topic.clone()));
            }
            pending = retry;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition() -> PartitionState {
        PartitionState {
            topic: Arc::from("t"),
            position: Some(Offset(0)),
            fetch_offset: Offset(0),
            generation: 1,
            in_flight: false,
            buffered: 0,
            backoff: None,
            failures: 0,
            high_watermark: None,
        }
    }

    #[test]
    fn failed_fetches_back_off_exponentially_and_a_moved_leader_ends_the_wait() {
        let config = ConsumerConfig {
            retry_backoff: Duration::from_millis(100),
            retry_backoff_max: Duration::from_secs(1),
            ..ConsumerConfig::default()
        };
        let now = Instant::now();
        let mut st = partition();
        assert!(st.may_fetch(1, now));
        for failures in 1..=7u32 {
            st.fetch_failed(1, now, &config);
            let pause = st.backoff.unwrap().until - now;
            let nominal = Duration::from_millis(100 << (failures - 1));
            let (low, high) = (nominal.mul_f64(0.8), nominal.mul_f64(1.2));
            assert!(
                pause >= low.min(config.retry_backoff_max)
                    && pause <= high.min(config.retry_backoff_max),
                "failure {failures}: {pause:?}"
            );
        }
        assert_eq!(st.failures, 7);
        assert_eq!(st.backoff.unwrap().until - now, config.retry_backoff_max);
        // Still waiting on the broker that failed...
        assert!(!st.may_fetch(1, now + Duration::from_millis(900)));
        // ...but not on another one: the leader moved (KIP-951).
        assert!(st.may_fetch(2, now));
        assert!(st.may_fetch(1, now + config.retry_backoff_max));
    }

    #[test]
    fn an_idle_consumer_wakes_for_a_running_pause_or_a_refresh_never_for_a_past_one() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let pause = |until| Backoff { until, from: 1 };
        // A pause already over (its partition has no leader, say) must not
        // make the consumer wake at once, again and again.
        assert_eq!(next_wake([pause(now - ms(5))].into_iter(), None, now), None);
        assert_eq!(
            next_wake(
                [pause(now - ms(5)), pause(now + ms(300))].into_iter(),
                None,
                now
            ),
            Some(now + ms(300))
        );
        // A refresh due comes first when it is earlier.
        assert_eq!(
            next_wake([pause(now + ms(300))].into_iter(), Some(now + ms(100)), now),
            Some(now + ms(100))
        );
        assert_eq!(next_wake(std::iter::empty(), Some(now), now), Some(now));
    }
}
