//! Restarts without duplicates: checkpoints and output origins.
//!
//! At least once alone would re-send, after a crash, every output of the input
//! records processed after the last commit. Two things prevent that:
//!
//! - A *checkpoint* per input partition, written to the transform's changelog
//!   partition in the same atomic batch as the state writes of a commit point
//!   (and only after that point's outputs were acknowledged): the next input
//!   offset, and a time before which no later output was sent. So the state
//!   and the checkpoint always agree: a restart resumes exactly after the
//!   input records whose state writes it restored, and never applies a state
//!   write twice.
//! - An *origin* header on every output (`topic-partition@offset#index`: the
//!   input record and the output's place among that record's outputs), and a
//!   deterministic output partition (by key; keyless outputs go to the input
//!   partition's number modulo the output's partitions). On assignment the
//!   host reads each output partition from the checkpoint's time to its end
//!   and notes, per output partition, the last origin written from this input
//!   partition. Replaying the input records after the checkpoint, it skips the
//!   outputs at or below that origin: the crashed run wrote them already, and
//!   one producer's writes to one partition land in order, so everything below
//!   the last one landed too.
//!
//! Together: each output of each input record is written once, though the
//! transform restarts anywhere (given a transform whose outputs depend only on
//! its input and state, as the SDK's contract asks).

use std::collections::HashMap;

use bytes::Bytes;
use rill_client::{ConsumerRecord, TopicPartition};
use serde::{Deserialize, Serialize};

/// The header naming the input record an output came from.
pub const ORIGIN_HEADER: &str = "rill.origin";
/// Clock slack allowed when finding a checkpoint's outputs by timestamp.
pub const ORIGIN_SCAN_SLACK_MS: i64 = 1_000;
/// Starts a checkpoint's changelog key; no state key starts with it (those
/// start with an input topic's name, and topic names are never empty).
const CHECKPOINT_KEY_PREFIX: &[u8] = b"\0checkpoint\0";

/// Where an input partition's processing stands, as the changelog records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The next input offset to process; `None` before the first commit point
    /// (start where the group says).
    pub next: Option<i64>,
    /// Every output of an input record at or after `next` was sent after this
    /// time (milliseconds since the epoch, the sender's clock).
    pub since_ms: i64,
}

impl Checkpoint {
    pub fn key(tp: &TopicPartition) -> Vec<u8> {
        let mut k = CHECKPOINT_KEY_PREFIX.to_vec();
        k.extend_from_slice(tp.topic.as_bytes());
        k.push(0);
        k.extend_from_slice(tp.partition.to_string().as_bytes());
        k
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a checkpoint encodes")
    }

    /// The checkpoint of `tp` if `r` is one.
    pub fn decode_for(tp: &TopicPartition, r: &ConsumerRecord) -> Option<Checkpoint> {
        if r.key.as_deref()? != Checkpoint::key(tp).as_slice() {
            return None;
        }
        match serde_json::from_slice(r.value.as_deref()?) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(partition = %tp, error = %e, "ignoring an unreadable checkpoint");
                None
            }
        }
    }
}

/// An output's origin: the input offset and its index among that record's outputs.
pub type Origin = (i64, u32);

/// The origin header's value for output `index` of input `offset` of `tp`.
pub fn origin_value(tp: &TopicPartition, offset: i64, index: u32) -> Bytes {
    Origins::new(tp).value(offset, index)
}

/// Origin header values of one input partition: the `topic-partition@` prefix
/// is formatted once, each value appends an offset and an index (one allocation).
#[derive(Debug, Clone)]
pub struct Origins {
    prefix: Vec<u8>,
}

impl Origins {
    pub fn new(tp: &TopicPartition) -> Origins {
        Origins {
            prefix: format!("{}-{}@", tp.topic, tp.partition).into_bytes(),
        }
    }

    /// `topic-partition@offset#index`.
    pub fn value(&self, offset: i64, index: u32) -> Bytes {
        let mut numbers = itoa::Buffer::new();
        let mut v = Vec::with_capacity(self.prefix.len() + 32);
        v.extend_from_slice(&self.prefix);
        v.extend_from_slice(numbers.format(offset).as_bytes());
        v.push(b'#');
        v.extend_from_slice(numbers.format(index).as_bytes());
        Bytes::from(v)
    }
}

/// Parses an origin header's value: input topic, partition, offset, index.
pub fn parse_origin(value: &[u8]) -> Option<(&str, u32, i64, u32)> {
    let s = std::str::from_utf8(value).ok()?;
    let (tp, at) = s.rsplit_once('@')?;
    let (topic, partition) = tp.rsplit_once('-')?;
    let (offset, index) = at.split_once('#')?;
    Some((
        topic,
        partition.parse().ok()?,
        offset.parse().ok()?,
        index.parse().ok()?,
    ))
}

/// Per output partition, the last origin from one input partition found
/// there on assignment: outputs at or below it are already written.
#[derive(Debug, Default)]
pub struct Written {
    last: HashMap<TopicPartition, Origin>,
}

impl Written {
    /// Per input partition, the origins that `records` (outputs) carry.
    pub fn scan(records: &[ConsumerRecord]) -> HashMap<TopicPartition, Written> {
        let mut by_input: HashMap<TopicPartition, Written> = HashMap::new();
        for r in records {
            let Some(h) = r.headers.iter().find(|h| h.key == ORIGIN_HEADER) else {
                continue;
            };
            let Some((topic, partition, offset, index)) = parse_origin(&h.value) else {
                continue;
            };
            let last = &mut by_input
                .entry(TopicPartition::new(topic, partition))
                .or_default()
                .last;
            let e = last
                .entry(TopicPartition::new(&*r.topic, r.partition))
                .or_insert((offset, index));
            *e = (*e).max((offset, index));
        }
        by_input
    }

    /// Whether output `origin` to `to` was written before.
    pub fn contains(&self, to: &TopicPartition, origin: Origin) -> bool {
        self.last.get(to).is_some_and(|last| origin <= *last)
    }

    /// Whether input offsets at or after `next` can still be in it.
    pub fn reaches(&self, next: i64) -> bool {
        self.last.values().any(|(offset, _)| *offset >= next)
    }

    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_client::{Header, Offset};

    fn output(topic: &str, partition: u32, origin: Option<Bytes>) -> ConsumerRecord {
        ConsumerRecord {
            topic: topic.into(),
            partition,
            offset: Offset(0),
            timestamp_ms: 0,
            key: None,
            value: None,
            headers: origin
                .map(|v| {
                    vec![Header {
                        key: ORIGIN_HEADER.into(),
                        value: v,
                    }]
                })
                .unwrap_or_default(),
        }
    }

    #[test]
    fn origins_round_trip_with_dashes_in_topic_names() {
        let tp = TopicPartition::new("web-logs-2026", 7);
        let v = origin_value(&tp, 123, 4);
        assert_eq!(&v[..], b"web-logs-2026-7@123#4");
        assert_eq!(parse_origin(&v), Some(("web-logs-2026", 7, 123, 4)));
        let big = Origins::new(&tp).value(i64::MAX, u32::MAX);
        assert_eq!(
            parse_origin(&big),
            Some(("web-logs-2026", 7, i64::MAX, u32::MAX))
        );
        assert_eq!(parse_origin(b"no-origin"), None);
        assert_eq!(parse_origin(b"t-x@1#2"), None);
    }

    #[test]
    fn written_keeps_the_last_origin_per_output_partition_for_one_input() {
        let mine = TopicPartition::new("in", 1);
        let other = TopicPartition::new("in", 2);
        let records = vec![
            output("out", 0, Some(origin_value(&mine, 10, 0))),
            output("out", 0, Some(origin_value(&mine, 10, 2))),
            output("out", 0, Some(origin_value(&other, 99, 0))),
            output("out", 1, Some(origin_value(&mine, 11, 0))),
            output("out", 1, None),
        ];
        let mut by_input = Written::scan(&records);
        let w = by_input.remove(&mine).unwrap();
        assert!(by_input[&other].contains(&TopicPartition::new("out", 0), (99, 0)));
        let p0 = TopicPartition::new("out", 0);
        let p1 = TopicPartition::new("out", 1);
        assert!(w.contains(&p0, (10, 2)));
        assert!(w.contains(&p0, (9, 5)));
        assert!(!w.contains(&p0, (10, 3)));
        assert!(
            !w.contains(&p0, (11, 0)),
            "another input's origin does not count"
        );
        assert!(w.contains(&p1, (11, 0)));
        assert!(!w.contains(&TopicPartition::new("out", 2), (0, 0)));
        assert!(w.reaches(11) && !w.reaches(12));
    }

    #[test]
    fn checkpoint_keys_never_look_like_state_keys() {
        let tp = TopicPartition::new("in", 3);
        let k = Checkpoint::key(&tp);
        assert_eq!(k[0], 0, "state keys start with a topic name's first byte");
        let c = Checkpoint {
            next: Some(42),
            since_ms: 1_700_000_000_000,
        };
        let r = ConsumerRecord {
            key: Some(Bytes::from(k)),
            value: Some(Bytes::from(c.encode())),
            ..output("__transform-x-state", 0, None)
        };
        assert_eq!(Checkpoint::decode_for(&tp, &r), Some(c));
        assert_eq!(
            Checkpoint::decode_for(&TopicPartition::new("in", 4), &r),
            None
        );
    }
}
