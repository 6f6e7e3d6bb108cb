//! Idempotent-producer state of one partition: per producer id, its epoch and the
//! sequence ranges of its latest appends, so that the leader appends each batch
//! once however often a producer retries it (Kafka's `ProducerStateManager`).
//!
//! A producer numbers its records per partition from 0 (`base_sequence` of a
//! batch is its first record's number). The leader accepts a batch whose first
//! sequence follows the producer's last one, answers a retried batch (one whose
//! sequences it holds already) with the offsets it was written at, and refuses a
//! gap with `OutOfOrderSequence` and an older epoch with `InvalidProducerEpoch`.
//!
//! The state is not persisted: a log rebuilds it from its batch headers when it
//! opens and after a truncation, the same way on a leader and on a follower, so a
//! follower that becomes leader knows every producer the log holds. A producer
//! whose batches all left the local log (retention, tiering) is unknown again; its
//! next batch is accepted whatever its sequence, as Kafka does since KIP-360.

use std::collections::{HashMap, VecDeque};

use rill_proto::{BatchHeader, Offset, ProducerId};

/// Appends remembered per producer. A producer keeps one request in flight per
/// partition and merges contiguous appends (below), so a retry always finds its
/// range here; five matches Kafka's `max.in.flight.requests.per.connection`.
const RANGES_PER_PRODUCER: usize = 5;

/// Producers remembered per partition; beyond it the longest idle is forgotten
/// (it is then unknown, see the module docs).
pub const PRODUCERS_PER_PARTITION_MAX: usize = 10_000;

/// A run of one producer's records written at consecutive offsets with
/// consecutive sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SeqRange {
    first_seq: i32,
    last_seq: i32,
    base_offset: Offset,
}

impl SeqRange {
    fn offset_of(&self, seq: i32) -> Offset {
        self.base_offset.plus((seq - self.first_seq) as i64)
    }
}

#[derive(Debug, Clone)]
struct ProducerEntry {
    epoch: i16,
    ranges: VecDeque<SeqRange>,
    /// Order of last use, for eviction.
    touched: u64,
    /// The max timestamp of its latest batch.
    last_timestamp: i64,
}

/// One producer as the table knows it (Kafka's DescribeProducers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerSummary {
    pub producer_id: i64,
    pub epoch: i16,
    /// The sequence of its last record written here.
    pub last_sequence: i32,
    /// The max timestamp of its latest batch.
    pub last_timestamp: i64,
}

/// What the table says about one batch a producer sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqCheck {
    /// Not written yet: append it.
    New,
    /// Written already, at these offsets.
    Duplicate { first: Offset, last: Offset },
}

/// Why a batch is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeqError {
    #[error(
        "producer {producer} sent sequence {got} but the partition expects {expected}: \
         a batch before it was lost; the producer must reinitialise"
    )]
    OutOfOrder {
        producer: i64,
        expected: i32,
        got: i32,
    },
    #[error(
        "producer {producer} sent epoch {got} but a newer epoch {current} wrote to this \
         partition: this producer was fenced"
    )]
    StaleEpoch {
        producer: i64,
        got: i16,
        current: i16,
    },
    #[error(
        "one append mixes batches producer {producer} wrote already with new ones; \
         a producer resends a retried request alone"
    )]
    Mixed { producer: i64 },
    #[error(
        "producer {producer} resent sequences {first}..={last}, older than the {kept} \
         appends the partition remembers"
    )]
    TooOld {
        producer: i64,
        first: i32,
        last: i32,
        kept: usize,
    },
}

/// The producer table of one partition.
#[derive(Debug, Clone, Default)]
pub struct ProducerStates {
    producers: HashMap<i64, ProducerEntry>,
    clock: u64,
}

impl ProducerStates {
    pub fn len(&self) -> usize {
        self.producers.len()
    }

    /// Every producer remembered, by id.
    pub fn summaries(&self) -> Vec<ProducerSummary> {
        let mut out: Vec<ProducerSummary> = self
            .producers
            .iter()
            .map(|(id, e)| ProducerSummary {
                producer_id: *id,
                epoch: e.epoch,
                last_sequence: e.ranges.back().map_or(-1, |r| r.last_seq),
                last_timestamp: e.last_timestamp,
            })
            .collect();
        out.sort_by_key(|p| p.producer_id);
        out
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// Judges a batch of an idempotent producer (leader side). Batches without a
    /// producer id are always new.
    pub fn check(&self, h: &BatchHeader) -> Result<SeqCheck, SeqError> {
        if h.producer_id == ProducerId::NONE || h.producer_id.0 < 0 || h.is_control() {
            // Markers carry no sequence: the broker writes them once.
            return Ok(SeqCheck::New);
        }
        let producer = h.producer_id.0;
        let Some(entry) = self.producers.get(&producer) else {
            return Ok(SeqCheck::New);
        };
        if h.producer_epoch < entry.epoch {
            return Err(SeqError::StaleEpoch {
                producer,
                got: h.producer_epoch,
                current: entry.epoch,
            });
        }
        let first = h.base_sequence;
        let last = first.saturating_add(h.last_offset_delta);
        if h.producer_epoch > entry.epoch {
            // A new epoch numbers from 0 again.
            return if first == 0 {
                Ok(SeqCheck::New)
            } else {
                Err(SeqError::OutOfOrder {
                    producer,
                    expected: 0,
                    got: first,
                })
            };
        }
        if let Some(r) = entry
            .ranges
            .iter()
            .find(|r| r.first_seq <= first && last <= r.last_seq)
        {
            return Ok(SeqCheck::Duplicate {
                first: r.offset_of(first),
                last: r.offset_of(last),
            });
        }
        let Some(newest) = entry.ranges.back() else {
            return Ok(SeqCheck::New);
        };
        let expected = newest.last_seq.wrapping_add(1);
        if first == expected {
            return Ok(SeqCheck::New);
        }
        let oldest = entry.ranges.front().expect("non-empty");
        if last < oldest.first_seq {
            return Err(SeqError::TooOld {
                producer,
                first,
                last,
                kept: entry.ranges.len(),
            });
        }
        Err(SeqError::OutOfOrder {
            producer,
            expected,
            got: first,
        })
    }

    /// Judges every batch of one append in order: all new, or all written
    /// already (a retried request, answered with where it was written).
    pub fn check_append<'a>(
        &self,
        headers: impl IntoIterator<Item = &'a BatchHeader>,
    ) -> Result<SeqCheck, SeqError> {
        // Producers with a batch earlier in this append: (epoch, last sequence).
        let mut pending: HashMap<i64, (i16, i32)> = HashMap::new();
        let mut dup: Option<(i64, Offset, Offset)> = None;
        let mut new = None;
        for h in headers {
            let producer = h.producer_id.0;
            if h.is_control() {
                new = Some(producer);
                continue;
            }
            let verdict = match pending.get(&producer) {
                Some(&(epoch, last)) if producer >= 0 => {
                    if h.producer_epoch != epoch || h.base_sequence != last.wrapping_add(1) {
                        return Err(SeqError::OutOfOrder {
                            producer,
                            expected: last.wrapping_add(1),
                            got: h.base_sequence,
                        });
                    }
                    SeqCheck::New
                }
                _ => self.check(h)?,
            };
            if producer >= 0 {
                pending.insert(
                    producer,
                    (
                        h.producer_epoch,
                        h.base_sequence.saturating_add(h.last_offset_delta),
                    ),
                );
            }
            match verdict {
                SeqCheck::New => new = Some(producer),
                SeqCheck::Duplicate { first, last } => {
                    dup = Some(match dup {
                        None => (producer, first, last),
                        Some((p, f, _)) => (p, f, last),
                    })
                }
            }
        }
        match (dup, new) {
            (None, _) => Ok(SeqCheck::New),
            (Some((_, first, last)), None) => Ok(SeqCheck::Duplicate { first, last }),
            (Some((producer, _, _)), Some(_)) => Err(SeqError::Mixed { producer }),
        }
    }

    /// Records a batch that is now in the log (leader and follower alike; its
    /// header carries its final base offset).
    pub fn record(&mut self, h: &BatchHeader) {
        if h.producer_id.0 < 0 {
            return;
        }
        self.clock += 1;
        let clock = self.clock;
        let entry = self
            .producers
            .entry(h.producer_id.0)
            .or_insert_with(|| ProducerEntry {
                epoch: h.producer_epoch,
                ranges: VecDeque::new(),
                touched: clock,
                last_timestamp: h.max_timestamp,
            });
        entry.touched = clock;
        if h.is_control() {
            // A marker written at a newer epoch (the coordinator fenced the
            // producer) makes every older epoch stale here too, also for a
            // producer that has not written here yet: a fenced instance's
            // batch arriving after the marker would otherwise open a
            // transaction nobody ends.
            if h.producer_epoch > entry.epoch {
                entry.epoch = h.producer_epoch;
                entry.ranges.clear();
            }
            if self.producers.len() > PRODUCERS_PER_PARTITION_MAX {
                self.evict_idlest();
            }
            return;
        }
        let range = SeqRange {
            first_seq: h.base_sequence,
            last_seq: h.base_sequence.saturating_add(h.last_offset_delta),
            base_offset: h.base_offset,
        };
        entry.last_timestamp = h.max_timestamp;
        if h.producer_epoch != entry.epoch {
            entry.epoch = h.producer_epoch;
            entry.ranges.clear();
        }
        match entry.ranges.back_mut() {
            // Sequences and offsets both continue: one range (a producer's
            // request of many batches stays findable as a whole).
            Some(last)
                if last.last_seq.wrapping_add(1) == range.first_seq
                    && last.offset_of(range.first_seq) == range.base_offset =>
            {
                last.last_seq = range.last_seq;
            }
            _ => {
                entry.ranges.push_back(range);
                if entry.ranges.len() > RANGES_PER_PRODUCER {
                    entry.ranges.pop_front();
                }
            }
        }
        if self.producers.len() > PRODUCERS_PER_PARTITION_MAX {
            self.evict_idlest();
        }
    }

    fn evict_idlest(&mut self) {
        if let Some((&id, _)) = self.producers.iter().min_by_key(|(_, e)| e.touched) {
            self.producers.remove(&id);
        }
    }

    pub fn clear(&mut self) {
        self.producers.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_proto::{BatchBuilder, BatchView, Compression, LeaderEpoch, Record};

    fn header(pid: i64, epoch: i16, seq: i32, count: i32, base: i64) -> BatchHeader {
        let mut b = BatchBuilder::new(Compression::None).producer(ProducerId(pid), epoch, seq);
        for i in 0..count {
            b.push(&Record::from_value(format!("r{i}"), 1));
        }
        let mut bytes = b.build().to_vec();
        rill_proto::batch::set_base_offset(&mut bytes, Offset(base));
        rill_proto::batch::set_leader_epoch(&mut bytes, LeaderEpoch(0));
        BatchView::new(&bytes).unwrap().header
    }

    #[test]
    fn summaries_name_each_producer_with_its_last_sequence_and_epoch() {
        let mut t = ProducerStates::default();
        t.record(&header(9, 0, 0, 3, 0));
        t.record(&header(9, 0, 3, 2, 3));
        t.record(&header(4, 2, 0, 1, 5));
        let s = t.summaries();
        assert_eq!(
            s.iter()
                .map(|p| (p.producer_id, p.epoch, p.last_sequence))
                .collect::<Vec<_>>(),
            vec![(4, 2, 0), (9, 0, 4)]
        );
        // The records' timestamp (1, from the header helper) is the last one.
        assert!(s.iter().all(|p| p.last_timestamp == 1), "{s:?}");
    }

    #[test]
    fn in_order_batches_are_new_and_a_retry_is_a_duplicate_at_its_offsets() {
        let mut t = ProducerStates::default();
        let a = header(7, 0, 0, 3, 10);
        assert_eq!(t.check(&a), Ok(SeqCheck::New));
        t.record(&a);
        let b = header(7, 0, 3, 2, 20);
        assert_eq!(t.check(&b), Ok(SeqCheck::New));
        t.record(&b);
        assert_eq!(
            t.check(&header(7, 0, 3, 2, 0)),
            Ok(SeqCheck::Duplicate {
                first: Offset(20),
                last: Offset(21)
            })
        );
        assert_eq!(
            t.check(&header(7, 0, 0, 3, 0)),
            Ok(SeqCheck::Duplicate {
                first: Offset(10),
                last: Offset(12)
            })
        );
    }

    #[test]
    fn contiguous_appends_merge_so_a_part_of_a_request_is_found() {
        let mut t = ProducerStates::default();
        for i in 0..20 {
            t.record(&header(1, 0, i * 2, 2, 100 + i as i64 * 2));
        }
        // Twenty batches at consecutive offsets: one range, every batch findable.
        assert_eq!(
            t.check(&header(1, 0, 4, 2, 0)),
            Ok(SeqCheck::Duplicate {
                first: Offset(104),
                last: Offset(105)
            })
        );
    }

    #[test]
    fn gaps_stale_epochs_and_forgotten_sequences_are_refused() {
        let mut t = ProducerStates::default();
        t.record(&header(1, 2, 0, 1, 0));
        assert!(matches!(
            t.check(&header(1, 2, 5, 1, 0)),
            Err(SeqError::OutOfOrder {
                expected: 1,
                got: 5,
                ..
            })
        ));
        assert!(matches!(
            t.check(&header(1, 1, 1, 1, 0)),
            Err(SeqError::StaleEpoch { current: 2, .. })
        ));
        // A new epoch starts at 0.
        assert_eq!(t.check(&header(1, 3, 0, 1, 0)), Ok(SeqCheck::New));
        assert!(t.check(&header(1, 3, 4, 1, 0)).is_err());
        // Non-contiguous offsets (other producers in between) make new ranges;
        // after five newer ones the oldest is forgotten.
        for i in 1..=6 {
            t.record(&header(1, 2, i, 1, i as i64 * 10));
        }
        assert!(matches!(
            t.check(&header(1, 2, 1, 1, 0)),
            Err(SeqError::TooOld { .. })
        ));
        // An unknown producer is accepted whatever its sequence.
        assert_eq!(t.check(&header(9, 0, 42, 1, 0)), Ok(SeqCheck::New));
        // A batch without a producer id is always new.
        assert_eq!(t.check(&header(-1, -1, -1, 1, 0)), Ok(SeqCheck::New));
    }
}
