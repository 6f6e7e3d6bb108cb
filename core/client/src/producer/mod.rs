//! The [`Producer`]: batches records per partition and sends them to the
//! partition leaders from a background sender task.
//!
//! Flow: `send` picks the partition (explicit, key hash, or sticky), waits for
//! buffer memory (the back-pressure bound, `buffer_memory` bytes of records not yet
//! acknowledged), and appends the record to the partition's open batch in the
//! [`accumulator`] (`send_all` does the same for many records with one topic
//! lookup, clock read, reservation and lock). The sender task drains ready batches, groups them by leader
//! broker into produce requests of at most `max_request_bytes`, and sends up to
//! `max_in_flight_per_broker` requests concurrently to each broker, each on its own
//! QUIC stream. Responses complete the batches' delivery futures; retriable
//! errors put the batches back (refreshing metadata on leadership errors) until
//! `retries` or `delivery_timeout` runs out.
//!
//! Ordering: records sent to one partition are appended in `send` order, with
//! every acks setting. A partition has at most one request in flight (it may
//! carry many batches), so a retry never lets a later batch overtake an earlier
//! one.
//!
//! acks=0: the broker sends no produce response; it ends the request stream
//! once the batches are appended, and a record's delivery future resolves then
//! (with offset `-1`). So `flush` and `close` return only when the broker has
//! appended everything sent, and the next request of a partition waits for
//! that end of stream, which keeps the order.
//!
//! Idempotence (on by default with acks=all): the sender takes a producer id
//! from the cluster before its first request and stamps each batch, when first
//! sent, with the id and the partition's next sequence. A retry resends the same
//! bytes alone, so the leader either writes it or answers with where it already
//! wrote it. A batch that fails for good leaves a gap the leader would refuse, so
//! the producer then takes a new id.
//!
//! Shutdown: `close` flushes and stops the sender. Dropping every handle without
//! `close` lets the sender finish what was sent, then stop.

pub(crate) mod accumulator;
mod delivery;
mod sender;
mod txn;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use rill_proto::types::{TimestampMs, now_ms};
use rill_proto::{Header, Record};
use tokio::sync::{Notify, Semaphore};

use crate::client::Client;
use crate::config::ProducerConfig;
use crate::error::ClientError;
use crate::partitioner::partition_for_key;
use accumulator::{Accumulator, Appended, encoded_size, record_size};

pub use delivery::{DeliveryFuture, RecordMetadata};

/// Where a checked record goes and what it holds (see `Producer::place`).
#[derive(Clone, Copy)]
struct Placement {
    /// The partition when explicit or keyed; `None`: the topic's sticky one.
    explicit: Option<u32>,
    /// The topic's partition count (the sticky choice draws from it).
    count: u32,
    /// Buffer-memory bytes held for it.
    size: usize,
}

/// The record's topic, and the record a batch holds: timestamped `now_ms`
/// unless it has its own.
fn into_record(record: ProducerRecord, now_ms: TimestampMs) -> (Arc<str>, Record) {
    let ProducerRecord {
        topic,
        partition: _,
        key,
        value,
        headers,
        timestamp_ms,
    } = record;
    let rec = Record {
        key,
        value,
        headers,
        timestamp_ms: timestamp_ms.unwrap_or(now_ms),
    };
    (topic, rec)
}

/// A record to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerRecord {
    /// Shared, so a producer of many records to one topic can pass clones of
    /// one `Arc<str>` and no record allocates its topic's name.
    pub topic: Arc<str>,
    /// `None`: by key hash, or sticky for keyless records.
    pub partition: Option<u32>,
    pub key: Option<Bytes>,
    /// `None` is a tombstone (deletes the key in a compacted topic).
    pub value: Option<Bytes>,
    pub headers: Vec<Header>,
    /// `None`: the time of `send`.
    pub timestamp_ms: Option<TimestampMs>,
}

/// A topic name for a [`ProducerRecord`]: `&str`, `String`, `&String`, or an
/// `Arc<str>` (whose clones cost no allocation: hold one for a topic you send
/// many records to).
pub trait IntoTopic {
    fn into_topic(self) -> Arc<str>;
}

impl IntoTopic for &str {
    fn into_topic(self) -> Arc<str> {
        Arc::from(self)
    }
}

impl IntoTopic for String {
    fn into_topic(self) -> Arc<str> {
        Arc::from(self)
    }
}

impl IntoTopic for &String {
    fn into_topic(self) -> Arc<str> {
        Arc::from(self.as_str())
    }
}

impl IntoTopic for Arc<str> {
    fn into_topic(self) -> Arc<str> {
        self
    }
}

impl IntoTopic for std::borrow::Cow<'_, str> {
    fn into_topic(self) -> Arc<str> {
        Arc::from(self)
    }
}

impl IntoTopic for Box<str> {
    fn into_topic(self) -> Arc<str> {
        Arc::from(self)
    }
}

impl IntoTopic for &Arc<str> {
    fn into_topic(self) -> Arc<str> {
        self.clone()
    }
}

impl ProducerRecord {
    /// A keyless record with a value.
    pub fn new(topic: impl IntoTopic, value: impl Into<Bytes>) -> ProducerRecord {
        ProducerRecord {
            topic: topic.into_topic(),
            partition: None,
            key: None,
            value: Some(value.into()),
            headers: Vec::new(),
            timestamp_ms: None,
        }
    }

    /// A tombstone for `key`.
    pub fn tombstone(topic: impl IntoTopic, key: impl Into<Bytes>) -> ProducerRecord {
        ProducerRecord {
            topic: topic.into_topic(),
            partition: None,
            key: Some(key.into()),
            value: None,
            headers: Vec::new(),
            timestamp_ms: None,
        }
    }

    pub fn key(mut self, key: impl Into<Bytes>) -> ProducerRecord {
        self.key = Some(key.into());
        self
    }

    pub fn partition(mut self, partition: u32) -> ProducerRecord {
        self.partition = Some(partition);
        self
    }

    pub fn header(mut self, key: impl Into<String>, value: impl Into<Bytes>) -> ProducerRecord {
        self.headers.push(Header {
            key: key.into(),
            value: value.into(),
        });
        self
    }

    pub fn timestamp(mut self, timestamp_ms: TimestampMs) -> ProducerRecord {
        self.timestamp_ms = Some(timestamp_ms);
        self
    }
}

/// State shared by the producer handles, the sender task and request tasks.
#[derive(Debug)]
pub(crate) struct ProducerShared {
    pub client: Client,
    pub config: ProducerConfig,
    pub acc: Mutex<Accumulator>,
    /// Buffer memory, one permit per byte of records not yet acknowledged.
    pub buffer: Semaphore,
    /// Wakes the sender task (new batch, batch ready, request done, flush, close).
    pub wake: Notify,
    /// Wakes flush waiters when batches complete.
    pub progress: Notify,
    /// No more sends; the sender stops once everything is done.
    pub closing: AtomicBool,
    /// Per broker: permits for requests in flight.
    pub in_flight: Mutex<HashMap<i32, Arc<Semaphore>>>,
    /// The effective bound on the payload of one request.
    pub request_payload_max: usize,
    /// The idempotent producer's id and per-partition sequences.
    pub identity: tokio::sync::Mutex<sender::Identity>,
    /// The first batch of the open transaction that failed for good (the
    /// transaction can then only abort).
    pub txn_error: Mutex<Option<Arc<ClientError>>>,
}

impl ProducerShared {
    /// The setting that bounds one batch, and its value.
    fn size_bound(&self) -> (&'static str, usize) {
        if self.config.buffer_memory < self.request_payload_max {
            ("buffer_memory", self.config.buffer_memory)
        } else {
            ("max_request_bytes", self.request_payload_max)
        }
    }

    pub fn broker_permits(&self, broker: i32) -> Arc<Semaphore> {
        self.in_flight
            .lock()
            .entry(broker)
            .or_insert_with(|| Arc::new(Semaphore::new(self.config.max_in_flight_per_broker)))
            .clone()
    }
}

/// Stops the sender when the last handle goes away.
#[derive(Debug)]
struct HandleGuard {
    shared: Arc<ProducerShared>,
}

impl Drop for HandleGuard {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
    }
}

/// Ends a flush's "send everything now" mode, also when the flush is cancelled.
struct FlushingGuard<'a>(&'a ProducerShared);

impl Drop for FlushingGuard<'_> {
    fn drop(&mut self) {
        self.0.acc.lock().flushing -= 1;
    }
}

/// Sends records. Cheap to clone; clones share batches and the sender task.
#[derive(Debug, Clone)]
pub struct Producer {
    shared: Arc<ProducerShared>,
    _guard: Arc<HandleGuard>,
    sender: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl Producer {
    pub(crate) fn new(client: Client, config: ProducerConfig) -> Result<Producer, ClientError> {
        config.validate()?;
        let limit = config
            .max_request_bytes
            .min(client.max_request_bytes() as usize);
        // Leave room for the request's message (the partition list) beside the batches.
        let request_payload_max = limit - limit / 16;
        let shared = Arc::new(ProducerShared {
            acc: Mutex::new(Accumulator::new(
                config.batch_size.min(request_payload_max),
                config.compression,
                config.linger,
                config.delivery_timeout,
            )),
            buffer: Semaphore::new(config.buffer_memory),
            wake: Notify::new(),
            progress: Notify::new(),
            closing: AtomicBool::new(false),
            in_flight: Mutex::new(HashMap::new()),
            request_payload_max,
            identity: tokio::sync::Mutex::new(sender::Identity::new(
                config.transactional_id.clone().map(txn::TxnState::new),
            )),
            txn_error: Mutex::new(None),
            client,
            config,
        });
        let sender = tokio::spawn(sender::run(shared.clone()));
        Ok(Producer {
            _guard: Arc::new(HandleGuard {
                shared: shared.clone(),
            }),
            shared,
            sender: Arc::new(Mutex::new(Some(sender))),
        })
    }

    /// The producer's settings.
    pub fn config(&self) -> &ProducerConfig {
        &self.shared.config
    }

    /// Queues a record for sending; waits while the buffer memory is full.
    ///
    /// Returns a future that resolves once the broker acknowledged the record (per
    /// `acks`) or it failed. Errors here mean the record was not queued: unknown
    /// topic or partition, record too large, producer closed, or no buffer space
    /// within `delivery_timeout`.
    pub async fn send(&self, record: ProducerRecord) -> Result<DeliveryFuture, ClientError> {
        let shared = &self.shared;
        self.ensure_open()?;
        // Without awaiting when the topic is known and there is buffer room
        // (as almost always): this runs for every record.
        let count = match shared.client.cached_partition_count(&record.topic) {
            Some(count) if count > 0 => count,
            _ => self.partition_count(&record.topic).await?,
        };
        // The clock only for a record without its own timestamp.
        let now = match record.timestamp_ms {
            Some(ts) => ts,
            None => now_ms(),
        };
        let place = self.place(&record, count)?;
        if !self.try_reserve(place.size)? {
            self.reserve(&record.topic, place.size).await?; // tries once more, then waits
        }
        let (topic, rec) = into_record(record, now);
        let (future, wake) = self.append(&mut shared.acc.lock(), &topic, place, &rec);
        if wake {
            shared.wake.notify_one();
        }
        Ok(future)
    }

    /// Queues many records with one call: each goes where [`Producer::send`]
    /// would put it (and batches with the records before it), but the topic
    /// lookup, the clock, the buffer-memory reservation and the accumulator's
    /// lock are taken once per call instead of once per record. For producers
    /// of many small records (as Fluvio's `send_all` and Iggy's batch sends).
    ///
    /// Either every record is queued (one delivery future each, in order) or
    /// none is: each is checked (topic, partition, size) before any is queued,
    /// and their buffer memory is taken at once, so all of them must fit in
    /// `buffer_memory` together.
    pub async fn send_all(
        &self,
        records: Vec<ProducerRecord>,
    ) -> Result<Vec<DeliveryFuture>, ClientError> {
        let shared = &self.shared;
        self.ensure_open()?;
        let Some(first) = records.first() else {
            return Ok(Vec::new());
        };
        let now = now_ms();
        // Every record is checked before any is queued.
        let mut places = Vec::with_capacity(records.len());
        let mut total = 0usize;
        // The partition count of the topic of the record before (records of one
        // topic usually come together).
        let mut known: Option<(&Arc<str>, u32)> = None;
        for record in &records {
            let count = match known {
                Some((topic, count)) if *topic == record.topic => count,
                _ => {
                    let count = self.partition_count(&record.topic).await?;
                    known = Some((&record.topic, count));
                    count
                }
            };
            let place = self.place(record, count)?;
            total += place.size;
            places.push(place);
        }
        if total > shared.config.buffer_memory {
            return Err(ClientError::Config(format!(
                "send_all of {} records needs {total} bytes of buffer memory at once, more than buffer_memory ({} bytes): send fewer records per call",
                records.len(),
                shared.config.buffer_memory
            )));
        }
        self.reserve(&first.topic, total).await?;
        let mut wake = false;
        let futures = {
            let mut acc = shared.acc.lock();
            records
                .into_iter()
                .zip(places)
                .map(|(record, place)| {
                    let (topic, rec) = into_record(record, now);
                    let (future, look) = self.append(&mut acc, &topic, place, &rec);
                    wake |= look;
                    future
                })
                .collect()
        };
        if wake {
            shared.wake.notify_one();
        }
        Ok(futures)
    }

    /// Refuses new records once `close` began.
    fn ensure_open(&self) -> Result<(), ClientError> {
        if self.shared.closing.load(Ordering::Relaxed) {
            return Err(ClientError::Closed);
        }
        Ok(())
    }

    /// The partition count of `topic`, from the client's metadata cache when it
    /// knows the topic (no copy of the topic's metadata: this runs per record).
    async fn partition_count(&self, topic: &str) -> Result<u32, ClientError> {
        let client = &self.shared.client;
        let count = match client.cached_partition_count(topic) {
            Some(count) => count,
            None => client.topic(topic).await?.partitions.len() as u32,
        };
        if count == 0 {
            return Err(ClientError::UnknownTopic(topic.to_string()));
        }
        Ok(count)
    }

    /// Checks a record against its topic's `count` partitions and the size
    /// bound, and says where it goes.
    fn place(&self, record: &ProducerRecord, count: u32) -> Result<Placement, ClientError> {
        let explicit = match (record.partition, &record.key) {
            (Some(p), _) if p >= count => {
                return Err(ClientError::Config(format!(
                    "partition {p} of topic {} does not exist: it has {count} partitions (0..={})",
                    record.topic,
                    count - 1
                )));
            }
            (Some(p), _) => Some(p),
            (None, Some(key)) => Some(partition_for_key(key, count)),
            (None, None) => None,
        };
        let size = encoded_size(
            record.key.as_deref(),
            record.value.as_deref(),
            &record.headers,
        );
        let (limit, max) = self.shared.size_bound();
        if size + rill_proto::batch::BATCH_HEADER_LEN > max {
            return Err(ClientError::RecordTooLarge {
                topic: record.topic.to_string(),
                size,
                limit,
                max,
            });
        }
        Ok(Placement {
            explicit,
            count,
            size,
        })
    }

    /// Appends a placed record (its buffer memory already held) to the
    /// accumulator; returns its delivery future and whether the sender must
    /// look (a batch started or closed).
    fn append(
        &self,
        acc: &mut Accumulator,
        topic: &Arc<str>,
        place: Placement,
        rec: &Record,
    ) -> (DeliveryFuture, bool) {
        let count = place.count;
        let Appended {
            completion,
            index,
            new_batch,
            batch_closed,
        } = acc.append_to(
            topic,
            place.explicit,
            || rand::random_range(0..count),
            rec,
            place.size,
            Instant::now,
        );
        let future =
            DeliveryFuture::new(completion, index, rec.timestamp_ms, self.shared.config.acks);
        (future, new_batch || batch_closed)
    }

    /// Holds `size` bytes of buffer memory if they are free now; false when
    /// the buffer is full (then [`Producer::reserve`] waits for them).
    fn try_reserve(&self, size: usize) -> Result<bool, ClientError> {
        match self.shared.buffer.try_acquire_many(size as u32) {
            Ok(permit) => {
                permit.forget();
                Ok(true)
            }
            Err(tokio::sync::TryAcquireError::Closed) => Err(ClientError::Closed),
            Err(tokio::sync::TryAcquireError::NoPermits) => Ok(false),
        }
    }

    /// Holds `size` bytes of buffer memory for records to `topic`; waits while
    /// the buffer is full, up to `delivery_timeout`.
    async fn reserve(&self, topic: &str, size: usize) -> Result<(), ClientError> {
        // Without a timer when there is room; else wait, bounded.
        if self.try_reserve(size)? {
            return Ok(());
        }
        let shared = &self.shared;
        match tokio::time::timeout(
            shared.config.delivery_timeout,
            shared.buffer.acquire_many(size as u32),
        )
        .await
        {
            Ok(Ok(permit)) => {
                permit.forget();
                Ok(())
            }
            Ok(Err(_)) => Err(ClientError::Closed),
            Err(_) => Err(ClientError::Timeout {
                what: format!(
                    "waiting for producer buffer space for a record to {topic} (buffer_memory {} bytes is full: is the broker slow or unreachable?)",
                    shared.config.buffer_memory
                ),
            }),
        }
    }

    /// Queues `records` as one batch that the broker appends whole or not at
    /// all (a crash never leaves a part of them in the log). They must all
    /// name the same topic and the same explicit partition, and fit in one
    /// request. Returns one delivery future per record; they resolve together.
    pub async fn send_atomic(
        &self,
        records: Vec<ProducerRecord>,
    ) -> Result<Vec<DeliveryFuture>, ClientError> {
        let shared = &self.shared;
        self.ensure_open()?;
        let Some(first) = records.first() else {
            return Ok(Vec::new());
        };
        let (topic_name, partition) = (first.topic.clone(), first.partition);
        let Some(partition) = partition else {
            return Err(ClientError::Config(format!(
                "an atomic batch to topic {topic_name} needs an explicit partition"
            )));
        };
        if let Some(r) = records
            .iter()
            .find(|r| r.topic != topic_name || r.partition != Some(partition))
        {
            return Err(ClientError::Config(format!(
                "an atomic batch goes to one partition: {topic_name}-{partition}, but a record names {}-{}",
                r.topic,
                r.partition.map_or("(none)".to_string(), |p| p.to_string())
            )));
        }
        let topic = shared.client.topic(&topic_name).await?;
        let count = topic.partitions.len() as u32;
        if partition >= count {
            return Err(ClientError::Config(format!(
                "partition {partition} of topic {topic_name} does not exist: it has {count} partitions"
            )));
        }
        let recs: Vec<(Record, TimestampMs)> = records
            .into_iter()
            .map(|r| {
                let timestamp_ms = r.timestamp_ms.unwrap_or_else(now_ms);
                let rec = Record {
                    key: r.key,
                    value: r.value,
                    headers: r.headers,
                    timestamp_ms,
                };
                (rec, timestamp_ms)
            })
            .collect();
        let size: usize = recs.iter().map(|(r, _)| record_size(r)).sum();
        let (limit, max) = shared.size_bound();
        if size + rill_proto::batch::BATCH_HEADER_LEN > max {
            // The whole batch is the unit here, so its size is what is reported.
            return Err(ClientError::RecordTooLarge {
                topic: topic_name.to_string(),
                size,
                limit,
                max,
            });
        }
        self.reserve(&topic_name, size).await?;
        let (records, stamps): (Vec<Record>, Vec<TimestampMs>) = recs.into_iter().unzip();
        let completion =
            shared
                .acc
                .lock()
                .append_batch(&topic_name, partition, &records, size, Instant::now());
        shared.wake.notify_one();
        Ok(stamps
            .into_iter()
            .enumerate()
            .map(|(i, ts)| {
                DeliveryFuture::new(completion.clone(), i as u32, ts, shared.config.acks)
            })
            .collect())
    }

    /// Sends a record and waits for its acknowledgement.
    pub async fn send_and_wait(
        &self,
        record: ProducerRecord,
    ) -> Result<RecordMetadata, ClientError> {
        let delivery = self.send(record).await?;
        self.shared.wake.notify_one();
        delivery.await
    }

    /// Sends everything queued so far without waiting for linger, and waits until
    /// all of it is acknowledged or failed.
    pub async fn flush(&self) -> Result<(), ClientError> {
        let shared = &self.shared;
        let Some(target) = shared.acc.lock().flush_target() else {
            return Ok(());
        };
        shared.acc.lock().flushing += 1;
        let _flushing = FlushingGuard(shared);
        shared.wake.notify_one();
        loop {
            let notified = shared.progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if shared.acc.lock().done_through(target) {
                break;
            }
            notified.await;
        }
        Ok(())
    }

    /// A transactional producer's first call: takes the producer id and epoch
    /// of its transactional id from the transaction coordinator, which fences
    /// every older producer with the same id (their writes and commits are
    /// refused from now on) and aborts a transaction one of them left open.
    pub async fn init_transactions(&self) -> Result<(), ClientError> {
        let mut id = self.shared.identity.lock().await;
        let txn = id.txn.as_mut().ok_or_else(not_transactional)?;
        let producer = txn::init(&self.shared, txn).await?;
        txn.open = false;
        txn.added.clear();
        txn.has_offsets = false;
        id.set_producer(producer);
        *self.shared.txn_error.lock() = None;
        tracing::debug!(
            producer_id = producer.0,
            epoch = producer.1,
            "transactional producer initialised"
        );
        Ok(())
    }

    /// Starts a transaction: the records sent until [`Producer::commit_transaction`]
    /// or [`Producer::abort_transaction`] are committed or aborted together.
    pub async fn begin_transaction(&self) -> Result<(), ClientError> {
        let mut id = self.shared.identity.lock().await;
        let has_producer = id.producer().is_some();
        let txn = id.txn.as_mut().ok_or_else(not_transactional)?;
        if !has_producer {
            return Err(ClientError::Config(format!(
                "transactional producer {:?}: call init_transactions before begin_transaction",
                txn.id
            )));
        }
        if txn.open {
            return Err(ClientError::Config(format!(
                "transactional producer {:?} has a transaction open already: commit or abort it first",
                txn.id
            )));
        }
        txn.open = true;
        txn.added.clear();
        txn.has_offsets = false;
        *self.shared.txn_error.lock() = None;
        Ok(())
    }

    /// Sends what is queued, then commits the transaction: once this returns,
    /// `read_committed` readers see all of its records. If a record of it
    /// failed, nothing is committed and the error says so (see
    /// [`ClientError::txn_action`]): abort, then start over.
    pub async fn commit_transaction(&self) -> Result<(), ClientError> {
        self.flush().await?;
        if let Some(e) = self.shared.txn_error.lock().clone() {
            return Err(ClientError::Failed {
                context:
                    "a record of the transaction was not written, so it cannot commit: abort it"
                        .into(),
                source: e,
            });
        }
        self.end_transaction(true).await
    }

    /// Aborts the transaction: `read_committed` readers never see its records.
    /// The producer then takes a new epoch (its sequences restart), so it can
    /// go on after a failed record.
    pub async fn abort_transaction(&self) -> Result<(), ClientError> {
        // Records still queued go out (and are aborted with the rest).
        let _ = self.flush().await;
        self.end_transaction(false).await?;
        self.init_transactions().await
    }

    async fn end_transaction(&self, commit: bool) -> Result<(), ClientError> {
        let mut id = self.shared.identity.lock().await;
        let producer = id.producer();
        let txn = id.txn.as_mut().ok_or_else(not_transactional)?;
        if !txn.open {
            return Err(ClientError::Config(format!(
                "transactional producer {:?} has no open transaction: call begin_transaction",
                txn.id
            )));
        }
        let Some(producer) = producer else {
            return Err(ClientError::Config(format!(
                "transactional producer {:?} lost its producer id after a failed record: abort the transaction",
                txn.id
            )));
        };
        if !txn.added.is_empty() || txn.has_offsets || !commit {
            txn::end(&self.shared, txn, producer, commit).await?;
        }
        txn.open = false;
        txn.added.clear();
        txn.has_offsets = false;
        Ok(())
    }

    /// Makes `offsets` (the next offset to read, per partition) the committed
    /// offsets of consumer group `group_id` when the open transaction commits,
    /// and never if it aborts: the consume-transform-produce loop's input
    /// progress and its outputs become visible together.
    pub async fn send_offsets_to_transaction(
        &self,
        group_id: &str,
        offsets: &[(crate::TopicPartition, rill_proto::Offset)],
    ) -> Result<(), ClientError> {
        let mut id = self.shared.identity.lock().await;
        let producer = id.producer();
        let txn = id.txn.as_mut().ok_or_else(not_transactional)?;
        if !txn.open {
            return Err(ClientError::Config(format!(
                "transactional producer {:?} has no open transaction: call begin_transaction before sending offsets",
                txn.id
            )));
        }
        let Some(producer) = producer else {
            return Err(ClientError::Config(format!(
                "transactional producer {:?} has no producer id: call init_transactions",
                txn.id
            )));
        };
        let partitions = offsets
            .iter()
            .map(|(tp, offset)| rill_proto::wire::OffsetCommitPartition {
                topic: tp.topic.clone(),
                partition: tp.partition,
                offset: *offset,
                metadata: String::new(),
            })
            .collect();
        txn::commit_offsets(&self.shared, txn, producer, group_id, partitions).await
    }

    /// Flushes, then stops the sender task. Later sends fail with `Closed`.
    pub async fn close(&self) -> Result<(), ClientError> {
        self.flush().await?;
        self.shared.closing.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
        let handle = self.sender.lock().take();
        if let Some(handle) = handle {
            let _ = handle.await;
        }
        Ok(())
    }
}

fn not_transactional() -> ClientError {
    ClientError::Config(
        "this producer has no transactional_id: set ProducerConfig::transactional_id to use transactions".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_topic_name_names_the_same_topic_and_an_arc_is_shared() {
        let owned = String::from("events");
        let shared: Arc<str> = Arc::from("events");
        let records = [
            ProducerRecord::new("events", "v"),
            ProducerRecord::new(&owned, "v"),
            ProducerRecord::new(owned.clone(), "v"),
            ProducerRecord::new(&shared, "v"),
            ProducerRecord::tombstone(shared.clone(), "k"),
        ];
        for r in &records {
            assert_eq!(&*r.topic, "events");
        }
        assert!(Arc::ptr_eq(&records[3].topic, &shared));
        assert!(Arc::ptr_eq(&records[4].topic, &shared));
        assert!(!Arc::ptr_eq(&records[0].topic, &shared));
    }
}
