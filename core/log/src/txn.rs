//! Transactions in one partition's log: the open transactions (which hold the
//! last stable offset back) and the index of aborted transactions (what a
//! `read_committed` reader skips), as Kafka's producer state and `.txnindex`.
//!
//! A transactional producer's first batch after its last marker opens its
//! transaction at that batch's base offset; the marker (a control batch, see
//! `rill_proto::control`) closes it, and an abort marker adds
//! `(producer, first offset, marker offset)` to the aborted index. The first
//! unstable offset is the smallest first offset of the open transactions: a
//! `read_committed` reader reads below min(first unstable offset, high
//! watermark), the last stable offset.
//!
//! Durability: both are rebuilt from the local segments when the log opens and
//! after a truncation (the same header scan as the idempotent-producer table;
//! only markers' one record is read). Aborted entries are also kept in the file
//! `transaction-index` beside the segments, written (crash-safely) at every
//! abort, so the entries of segments that moved to tiered storage survive a
//! restart; retention drops the entries wholly below the log start offset,
//! compaction keeps every transactional and control batch, so the index stays
//! true after cleaning.

use crate::checkpoint::write_atomically;
use crate::error::{LogError, io_context};
use rill_proto::Offset;
use rill_proto::batch::BatchHeader;
use rill_proto::control::{Marker, MarkerKind};
use std::collections::HashMap;
use std::path::Path;

/// File of the aborted-transaction index, beside the segments.
pub const TXN_INDEX_FILE: &str = "transaction-index";
const TXN_INDEX_VERSION: u32 = 0;

/// One aborted transaction of a partition: its producer's records from
/// `first_offset` up to the abort marker at `last_offset` are not committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: Offset,
    pub last_offset: Offset,
}

/// Open transactions and aborted ones of one partition.
#[derive(Debug, Clone, Default)]
pub struct TxnIndex {
    /// Producer id -> the first offset of its open transaction.
    ongoing: HashMap<i64, Offset>,
    /// Ascending by `last_offset` (markers are appended in offset order).
    aborted: Vec<AbortedTxn>,
}

impl TxnIndex {
    /// Records a data batch now in the log (leader and follower alike).
    pub fn record_data(&mut self, h: &BatchHeader) {
        if h.is_transactional() && !h.is_control() && h.producer_id.0 >= 0 {
            self.ongoing.entry(h.producer_id.0).or_insert(h.base_offset);
        }
    }

    /// Records a marker now in the log at `h.base_offset`; returns the aborted
    /// entry it added, if it was an abort.
    pub fn record_marker(&mut self, h: &BatchHeader, marker: Marker) -> Option<AbortedTxn> {
        let first = self.ongoing.remove(&h.producer_id.0);
        if marker.kind != MarkerKind::Abort {
            return None;
        }
        let entry = AbortedTxn {
            producer_id: h.producer_id.0,
            first_offset: first.unwrap_or(h.base_offset),
            last_offset: h.base_offset,
        };
        self.insert_aborted(entry);
        Some(entry)
    }

    fn insert_aborted(&mut self, entry: AbortedTxn) {
        let at = self.aborted.partition_point(|a| {
            (a.last_offset, a.producer_id) < (entry.last_offset, entry.producer_id)
        });
        if self.aborted.get(at) != Some(&entry) {
            self.aborted.insert(at, entry);
        }
    }

    /// The smallest first offset of an open transaction: records from there on
    /// are not stable yet.
    pub fn first_unstable_offset(&self) -> Option<Offset> {
        self.ongoing.values().copied().min()
    }

    /// Open transactions: (producer id, first offset), by producer id.
    pub fn ongoing(&self) -> Vec<(i64, Offset)> {
        let mut out: Vec<(i64, Offset)> = self.ongoing.iter().map(|(p, o)| (*p, *o)).collect();
        out.sort();
        out
    }

    /// The aborted transactions a reader of `[from, to)` must know: those that
    /// end at or after `from` and begin before `to`, by first offset.
    pub fn aborted_between(&self, from: Offset, to: Offset) -> Vec<AbortedTxn> {
        let start = self.aborted.partition_point(|a| a.last_offset < from);
        let mut out: Vec<AbortedTxn> = self.aborted[start..]
            .iter()
            .filter(|a| a.first_offset < to)
            .copied()
            .collect();
        out.sort_by_key(|a| (a.first_offset, a.producer_id));
        out
    }

    /// Every aborted entry, ascending by marker offset.
    pub fn aborted(&self) -> &[AbortedTxn] {
        &self.aborted
    }

    /// Forgets aborted transactions that end before `start` (retention moved the
    /// log start past them). Returns whether any was dropped.
    pub fn retain_from(&mut self, start: Offset) -> bool {
        let before = self.aborted.len();
        self.aborted.retain(|a| a.last_offset >= start);
        self.aborted.len() != before
    }

    /// Forgets open transactions and aborted entries at or after `end`
    /// (truncation: those are rebuilt from what stays).
    pub fn truncate_from(&mut self, end: Offset) {
        self.aborted.retain(|a| a.last_offset < end);
        self.ongoing.clear();
    }

    /// Merges aborted entries read from the index file.
    pub fn load_aborted(&mut self, entries: impl IntoIterator<Item = AbortedTxn>) {
        for e in entries {
            self.insert_aborted(e);
        }
    }

    /// Writes the aborted index to `dir` (crash-safely).
    pub fn persist(&self, dir: &Path) -> Result<(), LogError> {
        let mut text = format!("{TXN_INDEX_VERSION}\n{}\n", self.aborted.len());
        for a in &self.aborted {
            text.push_str(&format!(
                "{} {} {}\n",
                a.producer_id, a.first_offset.0, a.last_offset.0
            ));
        }
        write_atomically(dir, TXN_INDEX_FILE, text.as_bytes())
    }
}

/// Reads the aborted index of `dir` (empty when the file does not exist).
pub fn read_aborted(dir: &Path) -> Result<Vec<AbortedTxn>, LogError> {
    let path = dir.join(TXN_INDEX_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(io_context(|| format!("reading {}", path.display()))(e));
        }
    };
    let corrupt = |line: usize, why: &str| LogError::Corrupt {
        path: path.clone(),
        position: line as u64,
        reason: format!("line {}: {why}", line + 1),
    };
    let mut lines = text.lines();
    match lines.next().map(str::trim) {
        Some(v) if v == TXN_INDEX_VERSION.to_string() => {}
        other => {
            return Err(corrupt(
                0,
                &format!("version {other:?}, this build reads {TXN_INDEX_VERSION}"),
            ));
        }
    }
    let count: usize = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| corrupt(1, "no entry count"))?;
    let mut out = Vec::with_capacity(count.min(1 << 16));
    for (i, line) in lines.enumerate() {
        let n: Vec<i64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| corrupt(i + 2, "not three integers"))?;
        let [producer_id, first, last] = n[..] else {
            return Err(corrupt(i + 2, "not three integers"));
        };
        out.push(AbortedTxn {
            producer_id,
            first_offset: Offset(first),
            last_offset: Offset(last),
        });
    }
    if out.len() != count {
        return Err(corrupt(
            1,
            &format!("{count} entries announced, {} found", out.len()),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_proto::{BatchBuilder, BatchView, Compression, LeaderEpoch, ProducerId, Record};

    fn data(pid: i64, base: i64, transactional: bool) -> BatchHeader {
        let mut b = BatchBuilder::new(Compression::None).producer(ProducerId(pid), 0, 0);
        if transactional {
            b = b.transactional();
        }
        b.push(&Record::from_value("v", 1));
        let mut bytes = b.build().to_vec();
        rill_proto::batch::set_base_offset(&mut bytes, Offset(base));
        rill_proto::batch::set_leader_epoch(&mut bytes, LeaderEpoch(0));
        BatchView::new(&bytes).unwrap().header
    }

    fn marker(pid: i64, base: i64, kind: MarkerKind) -> (BatchHeader, Marker) {
        let m = Marker {
            kind,
            coordinator_epoch: 0,
        };
        let mut bytes = rill_proto::control::marker_batch(ProducerId(pid), 0, m, 1).to_vec();
        rill_proto::batch::set_base_offset(&mut bytes, Offset(base));
        (BatchView::new(&bytes).unwrap().header, m)
    }

    #[test]
    fn open_transactions_hold_the_stable_offset_until_their_marker() {
        let mut t = TxnIndex::default();
        t.record_data(&data(1, 0, false));
        assert_eq!(t.first_unstable_offset(), None, "plain batches are stable");
        t.record_data(&data(7, 1, true));
        t.record_data(&data(8, 2, true));
        t.record_data(&data(7, 3, true));
        assert_eq!(t.first_unstable_offset(), Some(Offset(1)));
        let (h, m) = marker(7, 4, MarkerKind::Commit);
        assert_eq!(t.record_marker(&h, m), None);
        assert_eq!(t.first_unstable_offset(), Some(Offset(2)));
        let (h, m) = marker(8, 5, MarkerKind::Abort);
        let aborted = t.record_marker(&h, m).unwrap();
        assert_eq!(
            aborted,
            AbortedTxn {
                producer_id: 8,
                first_offset: Offset(2),
                last_offset: Offset(5)
            }
        );
        assert_eq!(t.first_unstable_offset(), None);
        assert_eq!(t.ongoing(), vec![]);
    }

    #[test]
    fn readers_get_the_aborted_transactions_that_overlap_their_range() {
        let mut t = TxnIndex::default();
        for (pid, first, last) in [(1, 0, 3), (2, 5, 9), (3, 10, 12)] {
            t.record_data(&data(pid, first, true));
            let (h, m) = marker(pid, last, MarkerKind::Abort);
            t.record_marker(&h, m);
        }
        let pids = |v: Vec<AbortedTxn>| v.iter().map(|a| a.producer_id).collect::<Vec<_>>();
        assert_eq!(
            pids(t.aborted_between(Offset(0), Offset(100))),
            vec![1, 2, 3]
        );
        assert_eq!(pids(t.aborted_between(Offset(4), Offset(10))), vec![2]);
        assert_eq!(pids(t.aborted_between(Offset(3), Offset(5))), vec![1]);
        assert!(t.retain_from(Offset(4)));
        assert_eq!(pids(t.aborted_between(Offset(0), Offset(100))), vec![2, 3]);
        t.truncate_from(Offset(12));
        assert_eq!(pids(t.aborted_between(Offset(0), Offset(100))), vec![2]);
    }

    #[test]
    fn the_index_file_round_trips_and_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_aborted(dir.path()).unwrap(), vec![]);
        let mut t = TxnIndex::default();
        t.load_aborted([
            AbortedTxn {
                producer_id: 4,
                first_offset: Offset(10),
                last_offset: Offset(20),
            },
            AbortedTxn {
                producer_id: 2,
                first_offset: Offset(1),
                last_offset: Offset(3),
            },
        ]);
        t.persist(dir.path()).unwrap();
        let back = read_aborted(dir.path()).unwrap();
        assert_eq!(back, t.aborted().to_vec());
        assert_eq!(back[0].producer_id, 2, "ascending by marker offset");
        std::fs::write(dir.path().join(TXN_INDEX_FILE), "0\n2\n1 2 3\n").unwrap();
        let err = read_aborted(dir.path()).unwrap_err().to_string();
        assert!(err.contains("2 entries announced, 1 found"), "{err}");
    }
}
