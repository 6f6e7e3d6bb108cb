//! The archived types of quorum format version 1, frozen: read when a data
//! directory written by an older Rill is opened, converted to version 2's
//! types ([`super::raft_format_v2`]) and from those to the current ones, and
//! rewritten in the current version.
//!
//! Invariant: nothing here changes, ever; these are the layouts version-1 files
//! hold. Version 2 added the access-control commands and the image's ACLs and
//! quotas; the types version 1 shares with version 2 (brokers, topics,
//! partitions, ISR changes, log ids, membership) are unchanged, so they are
//! reused rather than copied.

use super::image::{IsrChange, TopicState};
use super::raft_format::{LeaderEpochV1, LogIdV1, MembershipV1, SnapshotMetaV1};
use super::raft_format_v2::{
    BrokerRecordV2, CommandV2 as Command, LogFrameV2, MetadataImageV2, PayloadV2, SnapshotV2,
};
use rill_proto::LeaderEpoch;
use std::collections::BTreeMap;

/// The command as version 1 archived it.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum CommandV1 {
    SetClusterId {
        cluster_id: String,
    },
    RegisterBroker {
        id: i32,
        addr: String,
    },
    CreateTopic {
        name: String,
        id: String,
        internal: bool,
        configs: BTreeMap<String, String>,
        assignment: Vec<Vec<i32>>,
    },
    DeleteTopic {
        name: String,
    },
    SetTopicConfigs {
        name: String,
        configs: BTreeMap<String, String>,
    },
    FenceBroker {
        id: i32,
    },
    UnfenceBroker {
        id: i32,
    },
    AlterIsr {
        broker_id: i32,
        topic: String,
        partition: u32,
        #[rkyv(with = LeaderEpochV1)]
        leader_epoch: LeaderEpoch,
        new_isr: Vec<i32>,
    },
    AlterIsrBatch {
        broker_id: i32,
        changes: Vec<IsrChange>,
    },
    ElectPreferred {
        topics: Option<Vec<String>>,
    },
    AllocateProducerId,
}

impl From<CommandV1> for Command {
    fn from(c: CommandV1) -> Command {
        match c {
            CommandV1::SetClusterId { cluster_id } => Command::SetClusterId { cluster_id },
            CommandV1::RegisterBroker { id, addr } => Command::RegisterBroker { id, addr },
            CommandV1::CreateTopic {
                name,
                id,
                internal,
                configs,
                assignment,
            } => Command::CreateTopic {
                name,
                id,
                internal,
                configs,
                assignment,
            },
            CommandV1::DeleteTopic { name } => Command::DeleteTopic { name },
            CommandV1::SetTopicConfigs { name, configs } => {
                Command::SetTopicConfigs { name, configs }
            }
            CommandV1::FenceBroker { id } => Command::FenceBroker { id },
            CommandV1::UnfenceBroker { id } => Command::UnfenceBroker { id },
            CommandV1::AlterIsr {
                broker_id,
                topic,
                partition,
                leader_epoch,
                new_isr,
            } => Command::AlterIsr {
                broker_id,
                topic,
                partition,
                leader_epoch,
                new_isr,
            },
            CommandV1::AlterIsrBatch { broker_id, changes } => {
                Command::AlterIsrBatch { broker_id, changes }
            }
            CommandV1::ElectPreferred { topics } => Command::ElectPreferred { topics },
            CommandV1::AllocateProducerId => Command::AllocateProducerId,
        }
    }
}

/// The image as version 1 archived it (no ACLs, no quotas).
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct MetadataImageV1 {
    pub cluster_id: String,
    pub brokers: BTreeMap<i32, BrokerRecordV2>,
    pub topics: BTreeMap<String, TopicState>,
    pub next_producer_id: i64,
}

impl From<MetadataImageV1> for MetadataImageV2 {
    fn from(i: MetadataImageV1) -> MetadataImageV2 {
        MetadataImageV2 {
            cluster_id: i.cluster_id,
            brokers: i.brokers,
            topics: i.topics,
            next_producer_id: i.next_producer_id,
            acls: Vec::new(),
            quotas: BTreeMap::new(),
        }
    }
}

/// An entry's payload, version 1.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum PayloadV1 {
    Blank,
    Normal(CommandV1),
    Membership(MembershipV1),
}

/// One frame body of a version-1 log file.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum LogFrameV1 {
    Purged(LogIdV1),
    Entry { log_id: LogIdV1, payload: PayloadV1 },
}

/// A version-1 snapshot body.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SnapshotV1 {
    pub meta: SnapshotMetaV1,
    pub image: MetadataImageV1,
}

impl From<LogFrameV1> for LogFrameV2 {
    fn from(f: LogFrameV1) -> LogFrameV2 {
        match f {
            LogFrameV1::Purged(l) => LogFrameV2::Purged(l),
            LogFrameV1::Entry { log_id, payload } => LogFrameV2::Entry {
                log_id,
                payload: match payload {
                    PayloadV1::Blank => PayloadV2::Blank,
                    PayloadV1::Normal(c) => PayloadV2::Normal(c.into()),
                    PayloadV1::Membership(m) => PayloadV2::Membership(m),
                },
            },
        }
    }
}

impl From<SnapshotV1> for SnapshotV2 {
    fn from(s: SnapshotV1) -> SnapshotV2 {
        SnapshotV2 {
            meta: s.meta,
            image: s.image.into(),
        }
    }
}
