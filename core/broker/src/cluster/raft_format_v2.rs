//! The archived types of quorum format version 2, frozen: read when a data
//! directory written by an older Rill is opened, converted to the current types
//! ([`super::raft_format`]), and rewritten in the current version.
//!
//! Invariant: nothing here changes, ever; these are the layouts version-2 files
//! hold. Version 3 added the brokers' listeners (a broker's Kafka address) to
//! `RegisterBroker` and to the image's broker records, and the SCRAM users
//! (`SetUser`, the image's users); the types version 2
//! shares with version 3 (topics, partitions, ISR changes, ACL rules, quotas,
//! log ids, membership) are unchanged, so they are reused rather than copied.
//! Version 1 converts into these types first ([`super::raft_format_v1`]).

use super::image::{BrokerRecord, Command, IsrChange, MetadataImage, TopicState};
use super::raft_format::{LeaderEpochV1, LogIdV1, MembershipV1, SnapshotMetaV1};
use rill_proto::LeaderEpoch;
use rill_proto::wire::{AclRule, Quota};
use std::collections::BTreeMap;

/// [`BrokerRecord`] as versions 1 and 2 archived it (no listeners).
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct BrokerRecordV2 {
    pub id: i32,
    pub addr: String,
    pub fenced: bool,
}

impl From<BrokerRecordV2> for BrokerRecord {
    fn from(b: BrokerRecordV2) -> BrokerRecord {
        BrokerRecord {
            id: b.id,
            addr: b.addr,
            fenced: b.fenced,
            listeners: BTreeMap::new(),
        }
    }
}

/// [`Command`] as version 2 archived it.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum CommandV2 {
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
    CreateAcls {
        rules: Vec<AclRule>,
    },
    DeleteAcls {
        rules: Vec<AclRule>,
    },
    SetQuota {
        principal: String,
        quota: Quota,
    },
}

impl From<CommandV2> for Command {
    fn from(c: CommandV2) -> Command {
        match c {
            CommandV2::SetClusterId { cluster_id } => Command::SetClusterId { cluster_id },
            CommandV2::RegisterBroker { id, addr } => Command::RegisterBroker {
                id,
                addr,
                listeners: BTreeMap::new(),
            },
            CommandV2::CreateTopic {
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
            CommandV2::DeleteTopic { name } => Command::DeleteTopic { name },
            CommandV2::SetTopicConfigs { name, configs } => {
                Command::SetTopicConfigs { name, configs }
            }
            CommandV2::FenceBroker { id } => Command::FenceBroker { id },
            CommandV2::UnfenceBroker { id } => Command::UnfenceBroker { id },
            CommandV2::AlterIsr {
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
            CommandV2::AlterIsrBatch { broker_id, changes } => {
                Command::AlterIsrBatch { broker_id, changes }
            }
            CommandV2::ElectPreferred { topics } => Command::ElectPreferred { topics },
            CommandV2::AllocateProducerId => Command::AllocateProducerId,
            CommandV2::CreateAcls { rules } => Command::CreateAcls { rules },
            CommandV2::DeleteAcls { rules } => Command::DeleteAcls { rules },
            CommandV2::SetQuota { principal, quota } => Command::SetQuota { principal, quota },
        }
    }
}

/// [`MetadataImage`] as version 2 archived it.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct MetadataImageV2 {
    pub cluster_id: String,
    pub brokers: BTreeMap<i32, BrokerRecordV2>,
    pub topics: BTreeMap<String, TopicState>,
    pub next_producer_id: i64,
    pub acls: Vec<AclRule>,
    pub quotas: BTreeMap<String, Quota>,
}

impl From<MetadataImageV2> for MetadataImage {
    fn from(i: MetadataImageV2) -> MetadataImage {
        MetadataImage {
            cluster_id: i.cluster_id,
            brokers: i
                .brokers
                .into_iter()
                .map(|(id, b)| (id, b.into()))
                .collect(),
            topics: i.topics,
            next_producer_id: i.next_producer_id,
            acls: i.acls,
            quotas: i.quotas,
            users: BTreeMap::new(),
        }
    }
}

/// An entry's payload, version 2.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum PayloadV2 {
    Blank,
    Normal(CommandV2),
    Membership(MembershipV1),
}

/// One frame body of a version-2 log file.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum LogFrameV2 {
    Purged(LogIdV1),
    Entry { log_id: LogIdV1, payload: PayloadV2 },
}

/// A version-2 snapshot body.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SnapshotV2 {
    pub meta: SnapshotMetaV1,
    pub image: MetadataImageV2,
}
