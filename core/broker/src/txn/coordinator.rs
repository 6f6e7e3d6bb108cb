//! The transaction coordinator's state machine (Kafka's `TransactionCoordinator`
//! and `TransactionMetadata`, KIP-98 with KIP-890's epoch bump on timeout),
//! pure: `step(now, input)` changes state and says what must be made durable
//! and which markers must be written; the async shell ([`super::service`])
//! does the I/O and feeds the outcome back.
//!
//! Per transactional id: the producer id and epoch it owns, its timeout, and
//! the status of its current transaction with the partitions in it:
//!
//! ```text
//! Empty --AddPartitions--> Ongoing --EndTxn(commit)--> PrepareCommit --markers--> CompleteCommit
//!   ^                        |  \--EndTxn(abort) / timeout / InitProducerId--> PrepareAbort --markers--> CompleteAbort
//!   +------ InitProducerId (epoch + 1) from Empty or Complete* ------------------------+
//! ```
//!
//! Fencing: InitProducerId bumps the epoch, so an older instance's requests
//! (older epoch) get PRODUCER_FENCED here, and its writes get it on every
//! partition that saw the newer epoch (markers carry it). A transaction that
//! outlives its timeout is aborted with a bumped epoch, fencing its producer.
//! A status `Prepare*` means markers are being written: requests of that id
//! get CONCURRENT_TRANSACTIONS (retriable) until it completes; a new
//! coordinator that loads a `Prepare*` record writes the markers again (they
//! are idempotent per epoch) and completes it, so a transaction never stays
//! half-visible across a failover.

use std::collections::{BTreeMap, BTreeSet};

use rill_proto::control::MarkerKind;
use rill_proto::wire::{ErrorCode, ErrorInfo, OffsetCommitPartition};
use serde::{Deserialize, Serialize};

/// Milliseconds of the coordinator's clock.
pub type Millis = i64;

/// The longest transaction timeout a producer may ask for (Kafka's
/// `transaction.max.timeout.ms` default: 15 minutes).
pub const TXN_TIMEOUT_MAX_MS: i32 = 15 * 60 * 1000;

/// A partition in a transaction.
pub type TxnPartition = (String, u32);

/// Where a transactional id's current transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnStatus {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

impl TxnStatus {
    /// Every state (the names DescribeTransactions and ListTransactions use).
    pub const ALL: [TxnStatus; 6] = [
        TxnStatus::Empty,
        TxnStatus::Ongoing,
        TxnStatus::PrepareCommit,
        TxnStatus::PrepareAbort,
        TxnStatus::CompleteCommit,
        TxnStatus::CompleteAbort,
    ];

    /// Whether a transaction is open (or completing) in this state.
    pub fn is_open(self) -> bool {
        matches!(
            self,
            TxnStatus::Ongoing | TxnStatus::PrepareCommit | TxnStatus::PrepareAbort
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            TxnStatus::Empty => "Empty",
            TxnStatus::Ongoing => "Ongoing",
            TxnStatus::PrepareCommit => "PrepareCommit",
            TxnStatus::PrepareAbort => "PrepareAbort",
            TxnStatus::CompleteCommit => "CompleteCommit",
            TxnStatus::CompleteAbort => "CompleteAbort",
        }
    }
}

/// One transactional id's state: what `__transaction_state` holds for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnMeta {
    pub transactional_id: String,
    pub producer_id: i64,
    pub epoch: i16,
    pub timeout_ms: i32,
    pub status: TxnStatus,
    /// The partitions of the current transaction (written to, or markers due).
    pub partitions: BTreeSet<TxnPartition>,
    /// Consumer groups whose offsets the transaction commits.
    pub groups: BTreeSet<String>,
    /// Their offsets, stored as the groups' committed offsets when the
    /// transaction commits: (group, topic, partition) -> (offset, metadata).
    pub offsets: BTreeMap<(String, String, u32), (i64, String)>,
    /// When the current transaction began (its first AddPartitions).
    pub started_ms: Millis,
    pub updated_ms: Millis,
}

/// The markers that end one transaction, to be written to every partition of
/// it; then feed [`Input::MarkersWritten`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerJob {
    pub transactional_id: String,
    pub producer_id: i64,
    pub epoch: i16,
    pub kind: MarkerKind,
    pub partitions: BTreeSet<TxnPartition>,
    /// The offsets to store per group (after the markers): on abort, every
    /// group of the transaction with none (its pending offsets are dropped).
    pub offsets: BTreeMap<String, Vec<OffsetCommitPartition>>,
}

/// What the shell must do after a step, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Make this state durable (append to `__transaction_state`, acks=all).
    Persist(TxnMeta),
    /// Write these markers, then feed `MarkersWritten`.
    WriteMarkers(MarkerJob),
}

/// An answer to a producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// InitProducerId: the id and epoch to use.
    Producer { producer_id: i64, epoch: i16 },
    /// Accepted (AddPartitions, AddOffsets, EndTxn once its markers are written).
    Ok,
    /// EndTxn accepted: the reply waits for the markers (`MarkersWritten`).
    AfterMarkers,
}

/// The result of one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stepped {
    pub reply: Result<Reply, ErrorInfo>,
    pub effects: Vec<Effect>,
}

impl Stepped {
    fn err(e: ErrorInfo) -> Stepped {
        Stepped {
            reply: Err(e),
            effects: Vec::new(),
        }
    }
}

/// What a step is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// InitProducerId with a transactional id. `fresh_producer_id`: a new id
    /// from the quorum, used when the id is unknown or its epoch is exhausted.
    InitProducerId {
        transactional_id: String,
        timeout_ms: i32,
        fresh_producer_id: i64,
    },
    AddPartitions {
        transactional_id: String,
        producer_id: i64,
        epoch: i16,
        partitions: Vec<TxnPartition>,
    },
    /// A group's offsets in the transaction (none: just the group).
    AddOffsets {
        transactional_id: String,
        producer_id: i64,
        epoch: i16,
        group_id: String,
        offsets: Vec<OffsetCommitPartition>,
    },
    EndTxn {
        transactional_id: String,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    },
    /// The markers of the transaction were written (replicated).
    MarkersWritten { transactional_id: String },
    /// A record of `__transaction_state`, replayed on load.
    Replay(TxnMeta),
    /// Time passed: abort transactions past their timeout.
    Tick,
}

/// The state of the transactional ids of the partitions loaded here.
#[derive(Debug, Default)]
pub struct TxnCoordinator {
    txns: BTreeMap<String, TxnMeta>,
}

fn error(code: ErrorCode, message: String) -> ErrorInfo {
    ErrorInfo::new(code, message)
}

impl TxnCoordinator {
    pub fn get(&self, transactional_id: &str) -> Option<&TxnMeta> {
        self.txns.get(transactional_id)
    }

    pub fn all(&self) -> impl Iterator<Item = &TxnMeta> {
        self.txns.values()
    }

    /// Forgets the ids `keep` says no (their partition moved away).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.txns.retain(|id, _| keep(id));
    }

    /// The marker jobs a newly loaded partition must finish (transactions
    /// that were preparing when the previous coordinator stopped).
    pub fn unfinished(&self) -> Vec<MarkerJob> {
        self.txns
            .values()
            .filter_map(|m| {
                let kind = match m.status {
                    TxnStatus::PrepareCommit => MarkerKind::Commit,
                    TxnStatus::PrepareAbort => MarkerKind::Abort,
                    _ => return None,
                };
                Some(job(m, kind))
            })
            .collect()
    }

    pub fn step(&mut self, now: Millis, input: Input) -> Stepped {
        match input {
            Input::InitProducerId {
                transactional_id,
                timeout_ms,
                fresh_producer_id,
            } => self.init(now, transactional_id, timeout_ms, fresh_producer_id),
            Input::AddPartitions {
                transactional_id,
                producer_id,
                epoch,
                partitions,
            } => self.add(now, &transactional_id, producer_id, epoch, |m| {
                m.partitions.extend(partitions)
            }),
            Input::AddOffsets {
                transactional_id,
                producer_id,
                epoch,
                group_id,
                offsets,
            } => self.add(now, &transactional_id, producer_id, epoch, |m| {
                for o in offsets {
                    m.offsets.insert(
                        (group_id.clone(), o.topic, o.partition),
                        (o.offset.0, o.metadata),
                    );
                }
                m.groups.insert(group_id);
            }),
            Input::EndTxn {
                transactional_id,
                producer_id,
                epoch,
                commit,
            } => self.end(now, &transactional_id, producer_id, epoch, commit),
            Input::MarkersWritten { transactional_id } => self.complete(now, &transactional_id),
            Input::Replay(meta) => {
                self.txns.insert(meta.transactional_id.clone(), meta);
                Stepped {
                    reply: Ok(Reply::Ok),
                    effects: Vec::new(),
                }
            }
            Input::Tick => self.expire(now),
        }
    }

    fn init(&mut self, now: Millis, id: String, timeout_ms: i32, fresh: i64) -> Stepped {
        if timeout_ms <= 0 || timeout_ms > TXN_TIMEOUT_MAX_MS {
            return Stepped::err(error(
                ErrorCode::InvalidTransactionTimeout,
                format!(
                    "transaction timeout {timeout_ms} ms for {id:?} is outside 1..={TXN_TIMEOUT_MAX_MS} ms"
                ),
            ));
        }
        let Some(m) = self.txns.get_mut(&id) else {
            let meta = TxnMeta {
                transactional_id: id.clone(),
                producer_id: fresh,
                epoch: 0,
                timeout_ms,
                status: TxnStatus::Empty,
                partitions: BTreeSet::new(),
                groups: BTreeSet::new(),
                offsets: BTreeMap::new(),
                started_ms: now,
                updated_ms: now,
            };
            self.txns.insert(id, meta.clone());
            return Stepped {
                reply: Ok(Reply::Producer {
                    producer_id: fresh,
                    epoch: 0,
                }),
                effects: vec![Effect::Persist(meta)],
            };
        };
        match m.status {
            TxnStatus::PrepareCommit | TxnStatus::PrepareAbort => Stepped::err(concurrent(m)),
            TxnStatus::Ongoing => {
                // A new instance while the old one's transaction is open: abort
                // it at a bumped epoch (fencing the old instance); the new one
                // retries and gets its epoch once the abort completed.
                bump(m, fresh);
                m.status = TxnStatus::PrepareAbort;
                m.updated_ms = now;
                let meta = m.clone();
                Stepped {
                    reply: Err(concurrent(m)),
                    effects: vec![
                        Effect::Persist(meta.clone()),
                        Effect::WriteMarkers(job(&meta, MarkerKind::Abort)),
                    ],
                }
            }
            TxnStatus::Empty | TxnStatus::CompleteCommit | TxnStatus::CompleteAbort => {
                bump(m, fresh);
                m.timeout_ms = timeout_ms;
                m.status = TxnStatus::Empty;
                m.partitions.clear();
                m.groups.clear();
                m.offsets.clear();
                m.updated_ms = now;
                Stepped {
                    reply: Ok(Reply::Producer {
                        producer_id: m.producer_id,
                        epoch: m.epoch,
                    }),
                    effects: vec![Effect::Persist(m.clone())],
                }
            }
        }
    }

    /// Looks up `id` for a request of (`producer_id`, `epoch`), fencing older
    /// instances.
    fn owned(&mut self, id: &str, producer_id: i64, epoch: i16) -> Result<&mut TxnMeta, ErrorInfo> {
        let Some(m) = self.txns.get_mut(id) else {
            return Err(error(
                ErrorCode::InvalidProducerIdMapping,
                format!(
                    "transactional id {id:?} is unknown to its coordinator: call InitProducerId first"
                ),
            ));
        };
        if m.producer_id != producer_id {
            return Err(error(
                ErrorCode::InvalidProducerIdMapping,
                format!(
                    "transactional id {id:?} belongs to producer id {}, not {producer_id}: call InitProducerId again",
                    m.producer_id
                ),
            ));
        }
        if epoch != m.epoch {
            return Err(error(
                ErrorCode::ProducerFenced,
                format!(
                    "producer {producer_id} epoch {epoch} of transactional id {id:?} was fenced by epoch {}: \
                     another instance with the same transactional id started (or the transaction timed out); stop this one",
                    m.epoch
                ),
            ));
        }
        Ok(m)
    }

    fn add(
        &mut self,
        now: Millis,
        id: &str,
        producer_id: i64,
        epoch: i16,
        f: impl FnOnce(&mut TxnMeta),
    ) -> Stepped {
        let m = match self.owned(id, producer_id, epoch) {
            Ok(m) => m,
            Err(e) => return Stepped::err(e),
        };
        match m.status {
            TxnStatus::PrepareCommit | TxnStatus::PrepareAbort => Stepped::err(concurrent(m)),
            TxnStatus::Empty | TxnStatus::CompleteCommit | TxnStatus::CompleteAbort => {
                m.partitions.clear();
                m.groups.clear();
                m.offsets.clear();
                m.started_ms = now;
                m.status = TxnStatus::Ongoing;
                f(m);
                m.updated_ms = now;
                persisted(m)
            }
            TxnStatus::Ongoing => {
                let before = (m.partitions.clone(), m.groups.clone(), m.offsets.clone());
                f(m);
                if (&m.partitions, &m.groups, &m.offsets) == (&before.0, &before.1, &before.2) {
                    // Nothing new: no write.
                    return Stepped {
                        reply: Ok(Reply::Ok),
                        effects: Vec::new(),
                    };
                }
                m.updated_ms = now;
                persisted(m)
            }
        }
    }

    fn end(
        &mut self,
        now: Millis,
        id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    ) -> Stepped {
        let m = match self.owned(id, producer_id, epoch) {
            Ok(m) => m,
            Err(e) => return Stepped::err(e),
        };
        let what = if commit { "commit" } else { "abort" };
        match (m.status, commit) {
            (TxnStatus::Ongoing, _) => {
                let kind = if commit {
                    MarkerKind::Commit
                } else {
                    MarkerKind::Abort
                };
                m.status = if commit {
                    TxnStatus::PrepareCommit
                } else {
                    TxnStatus::PrepareAbort
                };
                m.updated_ms = now;
                let meta = m.clone();
                Stepped {
                    reply: Ok(Reply::AfterMarkers),
                    effects: vec![
                        Effect::Persist(meta.clone()),
                        Effect::WriteMarkers(job(&meta, kind)),
                    ],
                }
            }
            // A retried EndTxn whose first attempt completed.
            (TxnStatus::CompleteCommit, true) | (TxnStatus::CompleteAbort, false) => Stepped {
                reply: Ok(Reply::Ok),
                effects: Vec::new(),
            },
            (TxnStatus::PrepareCommit, true) | (TxnStatus::PrepareAbort, false) => {
                Stepped::err(concurrent(m))
            }
            // Abort with nothing written: nothing to do (Kafka's producers do this).
            (TxnStatus::Empty, false) => Stepped {
                reply: Ok(Reply::Ok),
                effects: Vec::new(),
            },
            (status, _) => Stepped::err(error(
                ErrorCode::InvalidTxnState,
                format!(
                    "cannot {what} the transaction of {id:?}: it is {}",
                    status.name()
                ),
            )),
        }
    }

    fn complete(&mut self, now: Millis, id: &str) -> Stepped {
        let Some(m) = self.txns.get_mut(id) else {
            return Stepped::err(error(
                ErrorCode::InvalidProducerIdMapping,
                format!("transactional id {id:?} is no longer loaded here"),
            ));
        };
        m.status = match m.status {
            TxnStatus::PrepareCommit => TxnStatus::CompleteCommit,
            TxnStatus::PrepareAbort => TxnStatus::CompleteAbort,
            _ => {
                return Stepped {
                    reply: Ok(Reply::Ok),
                    effects: Vec::new(),
                };
            }
        };
        m.partitions.clear();
        m.groups.clear();
        m.offsets.clear();
        m.updated_ms = now;
        persisted(m)
    }

    fn expire(&mut self, now: Millis) -> Stepped {
        let mut effects = Vec::new();
        for m in self.txns.values_mut() {
            if m.status == TxnStatus::Ongoing
                && now.saturating_sub(m.started_ms) > m.timeout_ms as i64
            {
                tracing::info!(
                    transactional_id = %m.transactional_id,
                    producer_id = m.producer_id,
                    epoch = m.epoch,
                    timeout_ms = m.timeout_ms,
                    "aborting a transaction past its timeout"
                );
                // Fences the producer (KIP-890): its next request is refused.
                bump(m, m.producer_id);
                m.status = TxnStatus::PrepareAbort;
                m.updated_ms = now;
                effects.push(Effect::Persist(m.clone()));
                effects.push(Effect::WriteMarkers(job(m, MarkerKind::Abort)));
            }
        }
        Stepped {
            reply: Ok(Reply::Ok),
            effects,
        }
    }
}

/// The next epoch of `m`, or epoch 0 of a fresh producer id when the epoch is
/// exhausted.
fn bump(m: &mut TxnMeta, fresh: i64) {
    if m.epoch >= i16::MAX - 1 && fresh != m.producer_id {
        m.producer_id = fresh;
        m.epoch = 0;
    } else {
        m.epoch = m.epoch.saturating_add(1);
    }
}

fn job(m: &TxnMeta, kind: MarkerKind) -> MarkerJob {
    let mut offsets: BTreeMap<String, Vec<OffsetCommitPartition>> = m
        .groups
        .iter()
        .chain(m.offsets.keys().map(|(g, _, _)| g))
        .map(|g| (g.clone(), Vec::new()))
        .collect();
    if kind == MarkerKind::Commit {
        for ((group, topic, partition), (offset, metadata)) in &m.offsets {
            offsets
                .entry(group.clone())
                .or_default()
                .push(OffsetCommitPartition {
                    topic: topic.clone(),
                    partition: *partition,
                    offset: rill_proto::Offset(*offset),
                    metadata: metadata.clone(),
                });
        }
    }
    MarkerJob {
        transactional_id: m.transactional_id.clone(),
        producer_id: m.producer_id,
        epoch: m.epoch,
        kind,
        partitions: m.partitions.clone(),
        offsets,
    }
}

fn persisted(m: &TxnMeta) -> Stepped {
    Stepped {
        reply: Ok(Reply::Ok),
        effects: vec![Effect::Persist(m.clone())],
    }
}

fn concurrent(m: &TxnMeta) -> ErrorInfo {
    error(
        ErrorCode::ConcurrentTransactions,
        format!(
            "the previous transaction of {:?} is still completing ({}): retry shortly",
            m.transactional_id,
            m.status.name()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init(c: &mut TxnCoordinator, now: Millis, id: &str, fresh: i64) -> Stepped {
        c.step(
            now,
            Input::InitProducerId {
                transactional_id: id.into(),
                timeout_ms: 1000,
                fresh_producer_id: fresh,
            },
        )
    }

    fn add(c: &mut TxnCoordinator, id: &str, pid: i64, epoch: i16, p: u32) -> Stepped {
        c.step(
            10,
            Input::AddPartitions {
                transactional_id: id.into(),
                producer_id: pid,
                epoch,
                partitions: vec![("t".into(), p)],
            },
        )
    }

    fn end(c: &mut TxnCoordinator, id: &str, pid: i64, epoch: i16, commit: bool) -> Stepped {
        c.step(
            20,
            Input::EndTxn {
                transactional_id: id.into(),
                producer_id: pid,
                epoch,
                commit,
            },
        )
    }

    fn code(s: &Stepped) -> Option<ErrorCode> {
        s.reply.as_ref().err().map(|e| e.code)
    }

    #[test]
    fn a_transaction_commits_through_markers_and_every_change_is_persisted() {
        let mut c = TxnCoordinator::default();
        let s = init(&mut c, 0, "tx", 7);
        assert_eq!(
            s.reply,
            Ok(Reply::Producer {
                producer_id: 7,
                epoch: 0
            })
        );
        assert!(matches!(&s.effects[..], [Effect::Persist(m)] if m.status == TxnStatus::Empty));
        let s = add(&mut c, "tx", 7, 0, 1);
        assert!(matches!(&s.effects[..], [Effect::Persist(m)] if m.status == TxnStatus::Ongoing));
        // The same partition again: nothing to persist.
        assert!(add(&mut c, "tx", 7, 0, 1).effects.is_empty());
        add(&mut c, "tx", 7, 0, 2);
        let s = end(&mut c, "tx", 7, 0, true);
        assert_eq!(s.reply, Ok(Reply::AfterMarkers));
        let [Effect::Persist(m), Effect::WriteMarkers(job)] = &s.effects[..] else {
            panic!("{:?}", s.effects);
        };
        assert_eq!(m.status, TxnStatus::PrepareCommit);
        assert_eq!(job.kind, MarkerKind::Commit);
        assert_eq!(job.partitions.len(), 2);
        // Requests while the markers are written are retriable.
        assert_eq!(
            code(&add(&mut c, "tx", 7, 0, 3)),
            Some(ErrorCode::ConcurrentTransactions)
        );
        let s = c.step(
            30,
            Input::MarkersWritten {
                transactional_id: "tx".into(),
            },
        );
        assert!(
            matches!(&s.effects[..], [Effect::Persist(m)] if m.status == TxnStatus::CompleteCommit && m.partitions.is_empty())
        );
        // A retried EndTxn is answered OK; the wrong kind is an invalid state.
        assert_eq!(end(&mut c, "tx", 7, 0, true).reply, Ok(Reply::Ok));
        assert_eq!(
            code(&end(&mut c, "tx", 7, 0, false)),
            Some(ErrorCode::InvalidTxnState)
        );
        // The next transaction starts on AddPartitions.
        assert!(add(&mut c, "tx", 7, 0, 5).reply.is_ok());
        assert_eq!(c.get("tx").unwrap().status, TxnStatus::Ongoing);
    }

    #[test]
    fn group_offsets_are_committed_with_the_transaction_and_dropped_on_abort() {
        let mut c = TxnCoordinator::default();
        init(&mut c, 0, "tx", 7);
        let offsets = |at: i64| Input::AddOffsets {
            transactional_id: "tx".into(),
            producer_id: 7,
            epoch: 0,
            group_id: "g".into(),
            offsets: vec![OffsetCommitPartition {
                topic: "in".into(),
                partition: 0,
                offset: rill_proto::Offset(at),
                metadata: String::new(),
            }],
        };
        // Offsets alone start a transaction; a later commit of the same
        // partition replaces the earlier.
        assert!(c.step(1, offsets(10)).reply.is_ok());
        assert_eq!(c.get("tx").unwrap().status, TxnStatus::Ongoing);
        c.step(2, offsets(20));
        add(&mut c, "tx", 7, 0, 1);
        let s = end(&mut c, "tx", 7, 0, true);
        let Effect::WriteMarkers(job) = &s.effects[1] else {
            panic!("{:?}", s.effects)
        };
        assert_eq!(job.offsets["g"].len(), 1);
        assert_eq!(job.offsets["g"][0].offset, rill_proto::Offset(20));
        c.step(
            3,
            Input::MarkersWritten {
                transactional_id: "tx".into(),
            },
        );
        // An aborted transaction's offsets are never stored; its groups are
        // named with none (so their pending offsets are dropped).
        c.step(4, offsets(30));
        let s = end(&mut c, "tx", 7, 0, false);
        let Effect::WriteMarkers(job) = &s.effects[1] else {
            panic!("{:?}", s.effects)
        };
        assert_eq!(job.offsets.keys().collect::<Vec<_>>(), ["g"]);
        assert!(job.offsets["g"].is_empty());
        // A fenced instance cannot add offsets.
        let fenced = c.step(
            5,
            Input::AddOffsets {
                transactional_id: "tx".into(),
                producer_id: 7,
                epoch: 9,
                group_id: "g".into(),
                offsets: Vec::new(),
            },
        );
        assert_eq!(code(&fenced), Some(ErrorCode::ProducerFenced));
    }

    #[test]
    fn a_second_instance_fences_the_first_and_aborts_its_open_transaction() {
        let mut c = TxnCoordinator::default();
        init(&mut c, 0, "tx", 7);
        add(&mut c, "tx", 7, 0, 1);
        // The second instance: the open transaction is aborted at epoch 1.
        let s = init(&mut c, 5, "tx", 99);
        assert_eq!(code(&s), Some(ErrorCode::ConcurrentTransactions));
        let [Effect::Persist(m), Effect::WriteMarkers(job)] = &s.effects[..] else {
            panic!("{:?}", s.effects);
        };
        assert_eq!((m.epoch, m.status), (1, TxnStatus::PrepareAbort));
        assert_eq!((job.epoch, job.kind), (1, MarkerKind::Abort));
        c.step(
            6,
            Input::MarkersWritten {
                transactional_id: "tx".into(),
            },
        );
        // Its retry gets epoch 2; the first instance is fenced everywhere.
        assert_eq!(
            init(&mut c, 7, "tx", 99).reply,
            Ok(Reply::Producer {
                producer_id: 7,
                epoch: 2
            })
        );
        assert_eq!(
            code(&add(&mut c, "tx", 7, 0, 1)),
            Some(ErrorCode::ProducerFenced)
        );
        assert_eq!(
            code(&end(&mut c, "tx", 7, 0, true)),
            Some(ErrorCode::ProducerFenced)
        );
        assert_eq!(
            code(&add(&mut c, "tx", 8, 2, 1)),
            Some(ErrorCode::InvalidProducerIdMapping)
        );
        assert!(add(&mut c, "tx", 7, 2, 1).reply.is_ok());
    }

    #[test]
    fn a_transaction_past_its_timeout_is_aborted_at_a_new_epoch() {
        let mut c = TxnCoordinator::default();
        init(&mut c, 0, "tx", 7);
        add(&mut c, "tx", 7, 0, 1); // started at 10, timeout 1000
        assert!(c.step(1000, Input::Tick).effects.is_empty());
        let s = c.step(1011, Input::Tick);
        let [Effect::Persist(m), Effect::WriteMarkers(job)] = &s.effects[..] else {
            panic!("{:?}", s.effects);
        };
        assert_eq!((m.epoch, m.status), (1, TxnStatus::PrepareAbort));
        assert_eq!(job.kind, MarkerKind::Abort);
        assert_eq!(
            code(&end(&mut c, "tx", 7, 0, true)),
            Some(ErrorCode::ProducerFenced)
        );
    }

    #[test]
    fn a_loaded_prepare_record_is_finished_by_the_new_coordinator() {
        let mut old = TxnCoordinator::default();
        init(&mut old, 0, "tx", 7);
        add(&mut old, "tx", 7, 0, 1);
        let s = end(&mut old, "tx", 7, 0, false);
        let Effect::Persist(record) = &s.effects[0] else {
            panic!()
        };
        // The old coordinator died after persisting PrepareAbort.
        let mut new = TxnCoordinator::default();
        new.step(0, Input::Replay(record.clone()));
        let jobs = new.unfinished();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].kind, MarkerKind::Abort);
        assert_eq!(jobs[0].partitions.len(), 1);
    }

    #[test]
    fn bad_timeouts_and_unknown_ids_are_named() {
        let mut c = TxnCoordinator::default();
        let s = c.step(
            0,
            Input::InitProducerId {
                transactional_id: "tx".into(),
                timeout_ms: 0,
                fresh_producer_id: 1,
            },
        );
        assert_eq!(code(&s), Some(ErrorCode::InvalidTransactionTimeout));
        let s = add(&mut c, "nope", 1, 0, 0);
        let e = s.reply.unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidProducerIdMapping);
        assert!(e.message.contains("\"nope\""), "{e}");
    }
}
