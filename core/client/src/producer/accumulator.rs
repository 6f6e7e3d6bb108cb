//! The record accumulator: per-partition batches waiting to be sent.
//!
//! Plain synchronous state (no I/O, no runtime; `now` is passed in), shared by
//! `send` (which appends) and the sender task (which drains ready batches into
//! produce requests and hands back what must be retried).
//!
//! Per partition: at most one *open* batch (being filled), a queue of *closed*
//! batches (encoded, waiting), and an `in_flight` flag. A batch closes when the
//! next record would take it past `batch_size`, when it is `linger` old, or on
//! flush. While a partition has a request in flight it is *muted*: its next
//! batches wait. So batches of one partition reach the broker in the order they
//! were closed, retries included (they go back to the front of the queue), even
//! though requests to one broker travel concurrently on separate QUIC streams.
//!
//! A drain visits each broker's partitions from where the last one ran out
//! of that broker's in-flight requests (Kafka's per-node drain index), so
//! under saturation every partition takes its turn.
//!
//! Keyless records use a sticky partition per topic, forgotten when the batch on
//! it closes; a keyless record that would overflow the sticky partition's batch
//! goes to the next sticky partition (KIP-480), not into a batch of its own.
//!
//! Invariants: every batch id is in `incomplete` from creation until the sender
//! reports it done, so flush can wait for exactly the batches that existed when
//! it began; a request never exceeds `max_request_bytes` unless one batch alone
//! does (it is then sent alone).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rill_proto::{BatchBuilder, Compression, Header, Record};
use rustc_hash::FxHashMap;

use super::delivery::BatchCompletion;

/// Bytes a record adds to a batch beyond its key, value and header bytes (an
/// upper bound on the varint framing and the attributes byte).
pub(crate) const RECORD_OVERHEAD_BYTES: usize = 21;

/// Most of a new batch's buffer allocated up front (its batch size, up to
/// this): filling a batch then never copies it to grow.
const BATCH_PREALLOCATE_MAX: usize = 1 << 20;

/// The encoded-size estimate of a record, used for batch filling and buffer memory.
pub(crate) fn record_size(record: &Record) -> usize {
    encoded_size(
        record.key.as_deref(),
        record.value.as_deref(),
        &record.headers,
    )
}

/// [`record_size`] of a record with this key, value and headers.
pub(crate) fn encoded_size(key: Option<&[u8]>, value: Option<&[u8]>, headers: &[Header]) -> usize {
    RECORD_OVERHEAD_BYTES
        + key.map_or(0, <[u8]>::len)
        + value.map_or(0, <[u8]>::len)
        + headers
            .iter()
            .map(|h| h.key.len() + h.value.len() + 10)
            .sum::<usize>()
}

#[derive(Debug)]
struct OpenBatch {
    id: u64,
    builder: BatchBuilder,
    created: Instant,
    reserved: usize,
    count: u32,
    completion: Arc<BatchCompletion>,
}

/// A closed, encoded batch on its way to the broker.
#[derive(Debug)]
pub(crate) struct ClosedBatch {
    pub id: u64,
    pub topic: Arc<str>,
    pub partition: u32,
    pub bytes: Bytes,
    pub record_count: u32,
    /// Buffer-memory bytes to give back when the batch completes.
    pub reserved: usize,
    pub completion: Arc<BatchCompletion>,
    pub created: Instant,
    /// Produce attempts made so far.
    pub attempts: u32,
    /// Idempotent producer id and base sequence, stamped when first sent and
    /// kept across retries.
    pub stamp: Option<(i64, i32)>,
}

#[derive(Debug, Default)]
struct PartitionQueue {
    open: Option<OpenBatch>,
    ready: VecDeque<ClosedBatch>,
    in_flight: bool,
    backoff: Option<Backoff>,
}

/// A partition's pause before retrying batches a broker refused.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    /// Retry no earlier than this, unless the leader moved.
    pub until: Instant,
    /// The broker that refused the batches as not their leader, or failed
    /// (metadata is refreshed meanwhile): once metadata names another leader,
    /// they go to it at once (Kafka's KIP-951).
    pub from: Option<i32>,
}

#[derive(Debug)]
struct TopicQueues {
    name: Arc<str>,
    partitions: Vec<PartitionQueue>,
    sticky: Option<u32>,
}

impl TopicQueues {
    fn partition_mut(&mut self, partition: u32) -> &mut PartitionQueue {
        let p = partition as usize;
        if self.partitions.len() <= p {
            self.partitions.resize_with(p + 1, PartitionQueue::default);
        }
        &mut self.partitions[p]
    }

    fn sticky_partition(&mut self, choose: impl FnOnce() -> u32) -> u32 {
        match self.sticky {
            Some(p) => p,
            None => {
                let p = choose();
                self.partition_mut(p);
                self.sticky = Some(p);
                p
            }
        }
    }

    /// Closes the partition's open batch (if any) into its ready queue; keyless
    /// records then move to another partition.
    fn close(&mut self, partition: u32) {
        if self.sticky == Some(partition) {
            self.sticky = None;
        }
        let name = self.name.clone();
        let q = self.partition_mut(partition);
        if let Some(open) = q.open.take() {
            q.ready.push_back(ClosedBatch {
                id: open.id,
                topic: name,
                partition,
                bytes: open.builder.build(),
                record_count: open.count,
                reserved: open.reserved,
                completion: open.completion,
                created: open.created,
                attempts: 0,
                stamp: None,
            });
        }
    }
}

/// The topics with queued records: each topic's queues in a `Vec`, found by
/// name through a map, or through the last name asked without hashing it.
#[derive(Debug, Default)]
struct Topics {
    queues: Vec<TopicQueues>,
    by_name: FxHashMap<Arc<str>, usize>,
    /// The name (the caller's `Arc`) the last lookup was given, and its topic:
    /// a producer sends many records with clones of one `Arc`'d name, and
    /// comparing the pointer is cheaper than hashing and comparing the name
    /// for every record. Held here, that allocation cannot be reused for
    /// another name while it is compared against.
    last: Option<(Arc<str>, usize)>,
}

impl Topics {
    /// The queues of `topic`, made on first use.
    fn get_or_insert(&mut self, topic: &Arc<str>) -> &mut TopicQueues {
        if let Some((name, i)) = &self.last
            && Arc::ptr_eq(name, topic)
        {
            return &mut self.queues[*i];
        }
        let i = self.index_of(topic, || topic.clone());
        self.last = Some((topic.clone(), i));
        &mut self.queues[i]
    }

    /// The queues of `topic` (given by name only), made on first use.
    fn get_or_insert_str(&mut self, topic: &str) -> &mut TopicQueues {
        let i = self.index_of(topic, || Arc::from(topic));
        &mut self.queues[i]
    }

    fn index_of(&mut self, topic: &str, name: impl FnOnce() -> Arc<str>) -> usize {
        if let Some(i) = self.by_name.get(topic) {
            return *i;
        }
        let name = name();
        let i = self.queues.len();
        self.queues.push(TopicQueues {
            name: name.clone(),
            partitions: Vec::new(),
            sticky: None,
        });
        self.by_name.insert(name, i);
        i
    }

    #[cfg(test)]
    fn get_mut(&mut self, topic: &str) -> Option<&mut TopicQueues> {
        let i = *self.by_name.get(topic)?;
        Some(&mut self.queues[i])
    }
}

/// Where `append` put a record.
#[derive(Debug)]
pub(crate) struct Appended {
    pub completion: Arc<BatchCompletion>,
    pub index: u32,
    /// A new batch was started (the sender must arm its linger timer).
    pub new_batch: bool,
    /// A batch became ready to send.
    pub batch_closed: bool,
}

/// The outcome of one `drain`.
#[derive(Debug, Default)]
pub(crate) struct Drained {
    /// Requests to send: broker id and batches (partitions in the batches are muted).
    pub requests: Vec<(i32, Vec<ClosedBatch>)>,
    /// Batches past the delivery timeout, to fail.
    pub expired: Vec<ClosedBatch>,
    /// Some ready partition has no known leader: refresh metadata.
    pub leader_unknown: bool,
    /// Some partition waits out a retry backoff after a leadership or network
    /// error: refresh metadata, so that a new leader ends the wait.
    pub backing_off: bool,
    /// When the next batch becomes ready by linger or backoff.
    pub next_wake: Option<Instant>,
}

#[derive(Debug)]
pub(crate) struct Accumulator {
    batch_size: usize,
    compression: Compression,
    linger: Duration,
    delivery_timeout: Duration,
    /// Looked up on every appended record.
    topics: Topics,
    next_batch_id: u64,
    incomplete: BTreeSet<u64>,
    /// While above zero, every open batch is ready regardless of linger.
    pub flushing: usize,
    /// Per broker, where the next drain starts in the order of all
    /// partitions (see `drain`).
    drain_from: HashMap<i32, usize>,
}

fn earliest(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

impl Accumulator {
    pub fn new(
        batch_size: usize,
        compression: Compression,
        linger: Duration,
        delivery_timeout: Duration,
    ) -> Accumulator {
        Accumulator {
            batch_size,
            compression,
            linger,
            delivery_timeout,
            topics: Topics::default(),
            next_batch_id: 0,
            incomplete: BTreeSet::new(),
            flushing: 0,
            drain_from: HashMap::new(),
        }
    }

    fn queue(&mut self, topic: &str, partition: u32) -> &mut PartitionQueue {
        self.topics
            .get_or_insert_str(topic)
            .partition_mut(partition)
    }

    /// The sticky partition of a topic for keyless records, choosing one with
    /// `choose` when there is none.
    #[cfg(test)]
    pub fn sticky_partition(&mut self, topic: &str, choose: impl FnOnce() -> u32) -> u32 {
        self.topics
            .get_or_insert_str(topic)
            .sticky_partition(choose)
    }

    /// Appends a record to the partition's open batch (test shorthand).
    #[cfg(test)]
    pub fn append(
        &mut self,
        topic: &str,
        partition: u32,
        record: &Record,
        reserved: usize,
        now: Instant,
    ) -> Appended {
        self.append_to(
            &Arc::from(topic),
            Some(partition),
            || partition,
            record,
            reserved,
            || now,
        )
    }

    /// Appends a record to the open batch of `partition` (`None`: the topic's
    /// sticky partition, chosen with `choose` when there is none), closing that
    /// batch first if the record would take it past `batch_size`. One map lookup
    /// per record; `now` is read only when a new batch starts.
    pub fn append_to(
        &mut self,
        topic: &Arc<str>,
        partition: Option<u32>,
        choose: impl FnOnce() -> u32,
        record: &Record,
        reserved: usize,
        now: impl FnOnce() -> Instant,
    ) -> Appended {
        let size = record_size(record);
        let batch_size = self.batch_size;
        let compression = self.compression;
        let id = self.next_batch_id;
        let t = self.topics.get_or_insert(topic);
        let would_overflow = |t: &mut TopicQueues, p: u32| {
            t.partition_mut(p).open.as_ref().is_some_and(|o| {
                !o.builder.is_empty() && o.builder.estimated_size() + size > batch_size
            })
        };
        let mut batch_closed = false;
        let keyless = partition.is_none();
        // Whether the record is known to fit the chosen partition's batch.
        let mut fits = false;
        let partition = match (partition, t.sticky) {
            (Some(p), _) => p,
            // A keyless record that would start a new batch on the sticky
            // partition starts it on the next sticky partition instead (Kafka's
            // KIP-480): left on the old one, it would sit alone in a batch
            // nothing else fills until linger closes it.
            (None, Some(p)) if would_overflow(t, p) => {
                t.close(p);
                batch_closed = true;
                t.sticky_partition(choose)
            }
            (None, Some(p)) => {
                fits = true;
                p
            }
            (None, None) => t.sticky_partition(choose),
        };
        if !fits && would_overflow(t, partition) {
            // An explicit partition's batch is full (or the new sticky
            // partition's, filled by records sent to it by number).
            t.close(partition);
            batch_closed = true;
            if keyless {
                t.sticky = Some(partition);
            }
        }
        let mut new_batch = false;
        // The partition's queue exists (`partition_mut` above made it); the
        // topic's name is cloned only for a new batch.
        let TopicQueues {
            name, partitions, ..
        } = &mut *t;
        let q = &mut partitions[partition as usize];
        let open = q.open.get_or_insert_with(|| {
            new_batch = true;
            OpenBatch {
                id,
                builder: BatchBuilder::with_capacity(
                    compression,
                    batch_size.min(BATCH_PREALLOCATE_MAX),
                ),
                created: now(),
                reserved: 0,
                count: 0,
                completion: BatchCompletion::new(name.clone(), partition),
            }
        });
        open.builder.push(record);
        open.reserved += reserved;
        let index = open.count;
        open.count += 1;
        let completion = open.completion.clone();
        let over = open.builder.estimated_size() >= batch_size;
        if over {
            t.close(partition);
            batch_closed = true;
        }
        if new_batch {
            self.next_batch_id += 1;
            self.incomplete.insert(id);
        }
        Appended {
            completion,
            index,
            new_batch,
            batch_closed,
        }
    }

    /// Appends `records` to `partition` as one batch of their own, closed at
    /// once, so the broker appends all of them or none: the partition's open
    /// batch is closed first and nothing joins this one. `reserved` is the
    /// buffer memory held for all of them. The caller bounds their size.
    pub fn append_batch(
        &mut self,
        topic: &str,
        partition: u32,
        records: &[Record],
        reserved: usize,
        now: Instant,
    ) -> Arc<BatchCompletion> {
        let id = self.next_batch_id;
        self.next_batch_id += 1;
        self.incomplete.insert(id);
        let compression = self.compression;
        let t = self.topics.get_or_insert_str(topic);
        t.close(partition);
        let completion = BatchCompletion::new(t.name.clone(), partition);
        let mut builder = BatchBuilder::new(compression);
        for r in records {
            builder.push(r);
        }
        t.partition_mut(partition).open = Some(OpenBatch {
            id,
            builder,
            created: now,
            reserved,
            count: records.len() as u32,
            completion: completion.clone(),
        });
        t.close(partition);
        completion
    }

    /// Takes ready batches into requests. `budget(broker)` says how many more
    /// requests that broker may have in flight; `leader` maps a partition to its
    /// leader.
    pub fn drain(
        &mut self,
        now: Instant,
        max_request_bytes: usize,
        mut leader: impl FnMut(&str, u32) -> Option<i32>,
        mut budget: impl FnMut(i32) -> usize,
    ) -> Drained {
        let mut out = Drained::default();
        // Per broker: requests being filled, and bytes of the last one.
        let mut building: HashMap<i32, (Vec<Vec<ClosedBatch>>, usize, usize)> = HashMap::new();
        let flush_all = self.flushing > 0;
        for t in &mut self.topics.queues {
            for p in 0..t.partitions.len() {
                let q = &mut t.partitions[p];
                if q.in_flight {
                    continue;
                }
                // Expire what waited too long.
                while q
                    .ready
                    .front()
                    .is_some_and(|b| now.duration_since(b.created) >= self.delivery_timeout)
                {
                    out.expired.extend(q.ready.pop_front());
                }
                if let Some(open) = &q.open {
                    if flush_all || now.duration_since(open.created) >= self.linger {
                        t.close(p as u32);
                    } else {
                        out.next_wake = earliest(out.next_wake, open.created + self.linger);
                    }
                }
            }
        }
        // Every partition in a fixed order (its slot); each broker's
        // partitions visited from where the last drain first ran out of that
        // broker's requests (Kafka's per-node drain index): when the requests a
        // broker may have in flight do not hold all its partitions' batches,
        // the ones left out go first next time instead of after the same ones
        // again (which could starve them until their delivery timeout).
        let n: usize = self.topics.queues.iter().map(|t| t.partitions.len()).sum();
        // (broker, place in the broker's rotated order, slot, topic, partition)
        // of each partition with batches to send now.
        let mut candidates: Vec<(i32, usize, usize, usize, usize)> = Vec::new();
        let mut slot = 0;
        for (ti, t) in self.topics.queues.iter_mut().enumerate() {
            for (p, q) in t.partitions.iter_mut().enumerate() {
                let here = slot;
                slot += 1;
                if q.in_flight || q.ready.is_empty() {
                    continue;
                }
                let leader = leader(&t.name, p as u32);
                if let Some(b) = q.backoff {
                    let moved = b.from.is_some_and(|f| leader.is_some_and(|l| l != f));
                    if b.until > now && !moved {
                        out.next_wake = earliest(out.next_wake, b.until);
                        out.backing_off |= b.from.is_some();
                        continue;
                    }
                    q.backoff = None;
                }
                let Some(broker) = leader else {
                    out.leader_unknown = true;
                    continue;
                };
                let from = self.drain_from.get(&broker).map_or(0, |f| f % n);
                candidates.push((broker, (here + n - from) % n, here, ti, p));
            }
        }
        candidates.sort_unstable();
        let mut left_out: HashMap<i32, usize> = HashMap::new();
        for &(broker, _, slot, ti, p) in &candidates {
            let q = &mut self.topics.queues[ti].partitions[p];
            let (reqs, last_bytes, allowed) = building
                .entry(broker)
                .or_insert_with(|| (Vec::new(), 0, budget(broker)));
            if reqs.is_empty() || *last_bytes + q.ready[0].bytes.len() > max_request_bytes {
                if reqs.len() >= *allowed {
                    left_out.entry(broker).or_insert(slot);
                    continue;
                }
                reqs.push(Vec::new());
                *last_bytes = 0;
            }
            let req = reqs.last_mut().expect("pushed above");
            // A retried batch goes alone: the broker may hold some batches of
            // the failed request (a follower that became leader had fetched
            // part of it), and a batch alone is either written or not, so an
            // idempotent producer's retry is answered whole.
            let retry = q.ready[0].attempts > 0;
            let mut taken = 0;
            while let Some(b) = q.ready.front() {
                if (!req.is_empty() && *last_bytes + b.bytes.len() > max_request_bytes)
                    || (taken > 0 && (retry || b.attempts > 0))
                {
                    break;
                }
                *last_bytes += b.bytes.len();
                req.push(q.ready.pop_front().expect("front exists"));
                taken += 1;
            }
            q.in_flight = true;
        }
        self.drain_from.extend(left_out);
        for (broker, (reqs, _, _)) in building {
            for req in reqs {
                if !req.is_empty() {
                    out.requests.push((broker, req));
                }
            }
        }
        out
    }

    /// The request carrying a partition's batches finished: unmute it, and put
    /// `retry` (in their original order) back at the front of its queue, to be
    /// sent after `backoff`.
    pub fn finish_in_flight(
        &mut self,
        topic: &str,
        partition: u32,
        retry: Vec<ClosedBatch>,
        backoff: Option<Backoff>,
    ) {
        let q = self.queue(topic, partition);
        q.in_flight = false;
        if !retry.is_empty() {
            q.backoff = backoff;
        }
        for b in retry.into_iter().rev() {
            q.ready.push_front(b);
        }
    }

    /// A batch is done (acknowledged or failed for good).
    pub fn batch_done(&mut self, id: u64) {
        self.incomplete.remove(&id);
    }

    /// The id of the newest batch so far (flush waits for it and all before it).
    pub fn flush_target(&self) -> Option<u64> {
        self.next_batch_id.checked_sub(1)
    }

    /// Whether every batch up to and including `target` is done.
    pub fn done_through(&self, target: u64) -> bool {
        self.incomplete.first().is_none_or(|first| *first > target)
    }

    /// Whether nothing is waiting or in flight.
    pub fn is_empty(&self) -> bool {
        self.incomplete.is_empty()
    }

    /// Closes and takes every batch still held (open or queued).
    #[cfg(test)]
    pub fn take_all(&mut self) -> Vec<ClosedBatch> {
        for t in &mut self.topics.queues {
            for p in 0..t.partitions.len() as u32 {
                t.close(p);
            }
        }
        let mut out = Vec::new();
        for t in &mut self.topics.queues {
            for q in &mut t.partitions {
                out.extend(q.ready.drain(..));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_proto::BatchView;

    fn rec(v: &str) -> Record {
        Record::from_value(v.to_string(), 1)
    }

    fn acc(batch_size: usize) -> Accumulator {
        Accumulator::new(
            batch_size,
            Compression::None,
            Duration::from_millis(5),
            Duration::from_secs(60),
        )
    }

    #[test]
    fn full_batch_closes_and_linger_closes_the_rest() {
        let mut a = acc(200);
        let t0 = Instant::now();
        let mut closed = 0;
        for i in 0..10 {
            let r = a.append("t", 0, &rec(&format!("value-{i:040}")), 10, t0);
            // A new batch starts its record indexes at zero.
            assert_eq!(r.new_batch, r.index == 0, "record {i}");
            closed += r.batch_closed as usize;
        }
        assert!(closed >= 2, "10 records of ~60 bytes in 200-byte batches");
        // Before linger: only the closed batches are drained.
        let d = a.drain(t0, 1 << 20, |_, _| Some(1), |_| 5);
        assert_eq!(d.requests.len(), 1);
        let sent: usize = d.requests[0].1.len();
        assert_eq!(sent, closed);
        assert!(d.next_wake.is_some());
        // The partition is muted while in flight, even after linger.
        let d2 = a.drain(t0 + Duration::from_secs(1), 1 << 20, |_, _| Some(1), |_| 5);
        assert!(d2.requests.is_empty());
        let (batches, _) = (d.requests.into_iter().next().unwrap().1, ());
        let mut records = 0;
        for b in &batches {
            let v = BatchView::new(&b.bytes).unwrap();
            records += v.records().unwrap().len();
            a.batch_done(b.id);
        }
        a.finish_in_flight("t", 0, Vec::new(), None);
        let d3 = a.drain(t0 + Duration::from_secs(1), 1 << 20, |_, _| Some(1), |_| 5);
        assert_eq!(d3.requests.len(), 1);
        for b in &d3.requests[0].1 {
            records += BatchView::new(&b.bytes).unwrap().records().unwrap().len();
            a.batch_done(b.id);
        }
        assert_eq!(records, 10);
        assert!(a.is_empty());
    }

    #[test]
    fn an_atomic_batch_holds_exactly_its_records_past_batch_size() {
        let mut a = acc(100);
        let t0 = Instant::now();
        a.append("t", 0, &rec("before"), 1, t0);
        let big: Vec<Record> = (0..5).map(|i| rec(&format!("{i:060}"))).collect();
        a.append_batch("t", 0, &big, 5, t0);
        let after = a.append("t", 0, &rec("after"), 1, t0);
        assert!(after.new_batch, "nothing joins the atomic batch");
        let d = a.drain(t0, 1 << 20, |_, _| Some(1), |_| 5);
        let batches = &d.requests[0].1;
        let counts: Vec<usize> = batches
            .iter()
            .map(|b| BatchView::new(&b.bytes).unwrap().records().unwrap().len())
            .collect();
        // In order: the earlier open batch, then the five records together
        // although they are three times batch_size.
        assert_eq!(counts, vec![1, 5]);
    }

    #[test]
    fn requests_respect_size_and_budget() {
        let mut a = acc(100);
        let t0 = Instant::now();
        for p in 0..6 {
            for i in 0..3 {
                a.append("t", p, &rec(&format!("{i:080}")), 1, t0);
            }
        }
        // Each batch holds one ~100-byte record; requests at most 450 bytes.
        let d = a.drain(
            t0 + Duration::from_secs(1),
            450,
            |_, p| Some((p % 2) as i32),
            |_| 2,
        );
        assert!(d.requests.len() <= 4);
        for (_, req) in &d.requests {
            let total: usize = req.iter().map(|b| b.bytes.len()).sum();
            assert!(total <= 450 || req.len() == 1, "request of {total} bytes");
        }
        // Partitions that did not fit stay queued, untouched.
        let queued: usize = a
            .topics
            .queues
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|q| q.ready.len())
            .sum();
        let sent: usize = d.requests.iter().map(|(_, r)| r.len()).sum();
        assert_eq!(queued + sent, 18);
    }

    /// A pause until `until` after broker `from` refused as not the leader.
    fn refused_by(from: i32, until: Instant) -> Option<Backoff> {
        Some(Backoff {
            until,
            from: Some(from),
        })
    }

    /// A retry waits out its backoff while the refusing broker is still
    /// named the leader, and goes at once to a new leader (KIP-951).
    #[test]
    fn a_retry_goes_to_a_new_leader_without_waiting() {
        let mut a = acc(70);
        let t0 = Instant::now();
        a.append("t", 0, &rec("x"), 1, t0);
        let mut d = a.drain(t0 + Duration::from_secs(1), 1 << 20, |_, _| Some(1), |_| 1);
        let batches = d.requests.pop().unwrap().1;
        let until = t0 + Duration::from_secs(5);
        a.finish_in_flight("t", 0, batches, refused_by(1, until));
        let now = t0 + Duration::from_secs(2);
        for leader in [Some(1), None] {
            let d = a.drain(now, 1 << 20, |_, _| leader, |_| 1);
            assert!(d.requests.is_empty(), "leader {leader:?}");
        }
        let mut d = a.drain(now, 1 << 20, |_, _| Some(2), |_| 1);
        let (broker, again) = d.requests.pop().expect("sent to the new leader");
        assert_eq!((broker, again.len()), (2, 1));
        // After an error that says nothing of leadership (not enough
        // replicas, say), the pause stands and metadata is left alone.
        a.finish_in_flight("t", 0, again, Some(Backoff { until, from: None }));
        let d = a.drain(now, 1 << 20, |_, _| Some(3), |_| 1);
        assert!(d.requests.is_empty() && !d.backing_off);
        assert_eq!(
            a.drain(until, 1 << 20, |_, _| Some(3), |_| 1)
                .requests
                .len(),
            1
        );
    }

    #[test]
    fn retried_batches_go_back_in_order_after_backoff() {
        let mut a = acc(70);
        let t0 = Instant::now();
        for i in 0..3 {
            a.append("t", 0, &rec(&format!("{i:050}")), 1, t0);
        }
        let mut d = a.drain(t0 + Duration::from_secs(1), 1 << 20, |_, _| Some(1), |_| 1);
        let batches = d.requests.pop().unwrap().1;
        let ids: Vec<u64> = batches.iter().map(|b| b.id).collect();
        let until = t0 + Duration::from_secs(2);
        a.finish_in_flight("t", 0, batches, refused_by(1, until));
        let d = a.drain(t0 + Duration::from_secs(1), 1 << 20, |_, _| Some(1), |_| 1);
        assert!(d.requests.is_empty());
        assert!(d.backing_off, "metadata is refreshed while waiting");
        assert_eq!(d.next_wake, Some(until));
        let mut d = a.drain(until, 1 << 20, |_, _| Some(1), |_| 1);
        let again = d.requests.pop().unwrap().1;
        assert_eq!(again.iter().map(|b| b.id).collect::<Vec<_>>(), ids);
        // Once sent and failed, each batch is retried alone, in order.
        let failed = again
            .into_iter()
            .map(|mut b| {
                b.attempts += 1;
                b
            })
            .collect();
        a.finish_in_flight("t", 0, failed, None);
        for &id in &ids {
            let mut d = a.drain(until, 1 << 20, |_, _| Some(1), |_| 1);
            let one = d.requests.pop().unwrap().1;
            assert_eq!(one.iter().map(|b| b.id).collect::<Vec<_>>(), vec![id]);
            a.finish_in_flight("t", 0, Vec::new(), None);
        }
    }

    #[test]
    fn partitions_left_out_of_a_full_drain_go_first_next_time() {
        let mut a = acc(1 << 20);
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(1);
        // Partitions 0-5 led by broker 1, 6-11 by broker 2.
        let partitions = 12;
        let leader = |_: &str, p: u32| Some(if p < 6 { 1 } else { 2 });
        let mut drained = vec![0; partitions];
        for round in 0..6 {
            // Every partition has a batch waiting (a producer that never lets
            // up), and each broker takes one request of one batch at a time.
            for p in 0..partitions as u32 {
                a.append("t", p, &rec(&format!("r{round}-p{p}")), 1, t0);
            }
            let d = a.drain(later, 1, leader, |_| 1);
            for (_, request) in d.requests {
                for b in request {
                    drained[b.partition as usize] += 1;
                    a.finish_in_flight("t", b.partition, Vec::new(), None);
                    a.batch_done(b.id);
                }
            }
        }
        // Each partition had its turn on its broker. Always starting from the
        // first partition, partitions 0 and 6 would have gone every time and
        // the others never; one start for both brokers, 6 every time.
        assert_eq!(drained, vec![1; partitions]);
    }

    #[test]
    fn records_find_their_topic_by_any_name_with_its_text() {
        let mut a = acc(1 << 20);
        let t0 = Instant::now();
        let (one, two): (Arc<str>, Arc<str>) = ("one".into(), "two".into());
        let append = |a: &mut Accumulator, topic: &Arc<str>, v: &str| {
            a.append_to(topic, Some(0), || 0, &rec(v), 1, || t0)
        };
        append(&mut a, &one, "1a");
        append(&mut a, &one, "1b");
        append(&mut a, &two, "2a");
        // Another allocation holding the same name is the same topic; after
        // the remembered name's `Arc` is gone, its text still finds the topic.
        let one_again: Arc<str> = String::from("one").into();
        append(&mut a, &one_again, "1c");
        drop(one);
        append(&mut a, &"two".into(), "2b");
        let mut by_topic: Vec<(String, Vec<String>)> = a
            .take_all()
            .into_iter()
            .map(|b| {
                let values = BatchView::new(&b.bytes)
                    .unwrap()
                    .records()
                    .unwrap()
                    .into_iter()
                    .map(|r| String::from_utf8(r.value.unwrap().to_vec()).unwrap())
                    .collect();
                (b.topic.to_string(), values)
            })
            .collect();
        by_topic.sort();
        assert_eq!(
            by_topic,
            vec![
                (
                    "one".to_string(),
                    vec!["1a".into(), "1b".into(), "1c".into()]
                ),
                ("two".to_string(), vec!["2a".into(), "2b".into()]),
            ]
        );
    }

    #[test]
    fn sticky_partition_moves_on_when_its_batch_closes() {
        let mut a = acc(100);
        let t0 = Instant::now();
        let mut next = 0u32;
        let p1 = a.sticky_partition("t", || {
            next += 1;
            next
        });
        assert_eq!(p1, a.sticky_partition("t", || 99));
        let r = a.append("t", p1, &rec(&"x".repeat(200)), 1, t0);
        assert!(r.batch_closed);
        assert_eq!(a.sticky_partition("t", || 7), 7);
    }

    #[test]
    fn a_keyless_record_that_overflows_the_sticky_batch_starts_the_next_partition() {
        let mut a = acc(250);
        let t0 = Instant::now();
        let keyless = |a: &mut Accumulator, v: &str, choose: u32| {
            a.append_to(&"t".into(), None, || choose, &rec(v), 1, || t0)
        };
        let first = keyless(&mut a, &"a".repeat(100), 0);
        assert!(first.new_batch && !first.batch_closed);
        assert!(!keyless(&mut a, &"b".repeat(50), 9).batch_closed);
        // The third would overflow partition 0's batch: that batch closes and
        // the record opens a batch on the next sticky partition, 1.
        let third = keyless(&mut a, &"c".repeat(100), 1);
        assert!(third.batch_closed && third.new_batch);
        assert_eq!(third.completion.partition, 1);
        assert_eq!(a.sticky_partition("t", || 9), 1);
        assert!(
            a.topics.get_mut("t").unwrap().partitions[0].open.is_none(),
            "nothing is left alone on partition 0 to wait for linger"
        );
        let closed = &a.topics.get_mut("t").unwrap().partitions[0].ready;
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].record_count, 2);
        // An explicit partition keeps its records whatever the sticky one is.
        let explicit = a.append("t", 0, &rec("d"), 1, t0);
        assert_eq!(explicit.completion.partition, 0);
        assert_eq!(a.sticky_partition("t", || 9), 1);
    }

    #[test]
    fn flush_target_tracks_incomplete_batches() {
        let mut a = acc(1000);
        let t0 = Instant::now();
        a.append("t", 0, &rec("a"), 1, t0);
        a.append("t", 1, &rec("b"), 1, t0);
        let target = a.flush_target().unwrap();
        assert!(!a.done_through(target));
        a.flushing += 1;
        let d = a.drain(t0, 1 << 20, |_, _| None, |_| 1);
        assert!(d.leader_unknown, "flush closes batches even before linger");
        let rest = a.take_all();
        assert_eq!(rest.len(), 2);
        for b in rest {
            a.batch_done(b.id);
        }
        assert!(a.done_through(target));
    }
}
