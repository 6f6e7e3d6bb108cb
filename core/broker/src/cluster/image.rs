//! The cluster metadata image and the commands that change it: the state
//! machine replicated by the Raft quorum.
//!
//! Plain data and a pure `apply(command) -> outcome`: no clock, no I/O, no
//! randomness, so every broker that applies the same committed commands in the
//! same order holds the same image, and the rules are unit-tested without a
//! runtime.
//!
//! Every command is checked before it changes anything
//! ([`super::command_checks::check`]): a malformed one is `Outcome::Refused`,
//! naming what is wrong, and leaves the image as it was; no command's content
//! can make `apply` panic.
//!
//! Invariants, established by those checks and by `apply` (asserted after each
//! command in debug builds):
//! - every partition has at least one replica, none twice;
//! - a partition's leader, when it has one, is in its ISR, and the ISR is a
//!   subset of its replicas;
//! - a partition's leader epoch only grows, by one on every leader change;
//! - unclean leader election (a leader from outside the ISR) happens only when the
//!   topic sets `unclean.leader.election.enable=true`.

use rill_proto::LeaderEpoch;
use rill_proto::scram::ScramCredential;
use rill_proto::wire::ErrorCode;
use rill_proto::wire::{AclResource, AclRule, Quota};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::topic_configs::UNCLEAN_ELECTION_CONFIG;

/// One broker as the quorum knows it.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct BrokerRecord {
    pub id: i32,
    pub addr: String,
    /// Set by the controller when the broker's session lapsed; cleared when it
    /// heartbeats again.
    pub fenced: bool,
    /// The broker's other listeners by name ([`KAFKA_LISTENER`]: the Kafka
    /// protocol's advertised `host:port`), as it registered them.
    #[serde(default)]
    pub listeners: BTreeMap<String, String>,
}

/// The name under which a broker registers its Kafka-protocol listener.
pub const KAFKA_LISTENER: &str = "kafka";

/// One partition's assignment and leadership.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct PartitionState {
    /// Assigned replicas; the first is the preferred leader.
    pub replicas: Vec<i32>,
    /// `None`: offline (no eligible leader).
    pub leader: Option<i32>,
    #[rkyv(with = super::raft_format::LeaderEpochV1)]
    pub leader_epoch: LeaderEpoch,
    pub isr: Vec<i32>,
}

impl PartitionState {
    #[cfg(debug_assertions)]
    fn check(&self) {
        assert!(!self.replicas.is_empty(), "a partition without replicas");
        let distinct: std::collections::BTreeSet<&i32> = self.replicas.iter().collect();
        assert_eq!(
            distinct.len(),
            self.replicas.len(),
            "replicas {:?} name a broker twice",
            self.replicas
        );
        if let Some(l) = self.leader {
            assert!(
                self.isr.contains(&l),
                "leader {l} not in ISR {:?}",
                self.isr
            );
        }
        assert!(
            self.isr.iter().all(|b| self.replicas.contains(b)),
            "ISR {:?} not within replicas {:?}",
            self.isr,
            self.replicas
        );
    }
}

/// One topic in the image.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct TopicState {
    pub name: String,
    pub id: String,
    pub internal: bool,
    pub configs: BTreeMap<String, String>,
    pub partitions: Vec<PartitionState>,
}

impl TopicState {
    fn unclean_allowed(&self) -> bool {
        self.configs
            .get(UNCLEAN_ELECTION_CONFIG)
            .is_some_and(|v| v == "true")
    }
}

/// Everything the quorum agrees on.
#[derive(
    Debug,
    Clone,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct MetadataImage {
    pub cluster_id: String,
    pub brokers: BTreeMap<i32, BrokerRecord>,
    pub topics: BTreeMap<String, TopicState>,
    /// The next idempotent-producer id to hand out (older snapshots lack it).
    #[serde(default)]
    pub next_producer_id: i64,
    /// The ACL allow rules every broker enforces (with `--auth mtls`), sorted,
    /// each once.
    #[serde(default)]
    pub acls: Vec<AclRule>,
    /// Byte-rate quotas by principal.
    #[serde(default)]
    pub quotas: BTreeMap<String, Quota>,
    /// SCRAM users of the Kafka listener's SASL: their credentials, one per
    /// mechanism.
    #[serde(default)]
    pub users: BTreeMap<String, Vec<ScramCredential>>,
}

/// A change to the image, as committed to the quorum log.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub enum Command {
    /// The first command of a cluster: its id (kept if already set).
    SetClusterId {
        cluster_id: String,
    },
    /// A broker (re)registers its address and its other listeners; it starts
    /// unfenced.
    RegisterBroker {
        id: i32,
        addr: String,
        #[serde(default)]
        listeners: BTreeMap<String, String>,
    },
    CreateTopic {
        name: String,
        id: String,
        internal: bool,
        configs: BTreeMap<String, String>,
        /// Replicas of each partition, preferred leader first.
        assignment: Vec<Vec<i32>>,
    },
    DeleteTopic {
        name: String,
    },
    SetTopicConfigs {
        name: String,
        configs: BTreeMap<String, String>,
    },
    /// The controller saw the broker's session lapse: it leads nothing more and
    /// leaves every ISR it can leave.
    FenceBroker {
        id: i32,
    },
    /// The broker heartbeats again: it may lead offline partitions it is in the ISR of.
    UnfenceBroker {
        id: i32,
    },
    /// A leader changes its partition's ISR (shrink or expand).
    AlterIsr {
        broker_id: i32,
        topic: String,
        partition: u32,
        #[rkyv(with = super::raft_format::LeaderEpochV1)]
        leader_epoch: LeaderEpoch,
        new_isr: Vec<i32>,
    },
    /// Several `AlterIsr` of one leader in one entry, each applied (or
    /// refused) alone: a broker back from a restart rejoins thousands of ISRs,
    /// and one entry per partition cost a quorum append and an image each.
    AlterIsrBatch {
        broker_id: i32,
        changes: Vec<IsrChange>,
    },
    /// Moves leadership back to the preferred replica where it is in the ISR.
    ElectPreferred {
        topics: Option<Vec<String>>,
    },
    /// Hands out the next producer id.
    AllocateProducerId,
    /// Adds ACL allow rules (those present already are kept once).
    CreateAcls {
        rules: Vec<AclRule>,
    },
    /// Removes ACL allow rules.
    DeleteAcls {
        rules: Vec<AclRule>,
    },
    /// Sets (or, with both rates `None`, removes) a principal's quotas.
    SetQuota {
        principal: String,
        quota: Quota,
    },
    /// Sets a SCRAM user's credentials (an empty list removes the user).
    SetUser {
        name: String,
        credentials: Vec<ScramCredential>,
    },
    /// Adds partitions to a topic: the replicas of each new one, preferred
    /// leader first (the existing partitions keep theirs).
    CreatePartitions {
        name: String,
        assignment: Vec<Vec<i32>>,
    },
}

/// One partition's ISR change in an [`Command::AlterIsrBatch`].
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct IsrChange {
    pub topic: String,
    pub partition: u32,
    #[rkyv(with = super::raft_format::LeaderEpochV1)]
    pub leader_epoch: LeaderEpoch,
    pub new_isr: Vec<i32>,
}

/// What applying a command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Done,
    /// Partitions whose leader changed (`topic-partition`).
    Moved(Vec<String>),
    ProducerId(i64),
    /// How many rules a command added or removed.
    Count(u32),
    Refused {
        code: ErrorCode,
        message: String,
    },
}

/// Most ACL rules the cluster holds.
pub const ACL_RULES_MAX: usize = 100_000;

/// Checks rules before they are stored: a principal name (or `*`), and a
/// resource name that could name a topic, group or transform.
pub fn check_acl_rules(rules: &[AclRule]) -> Result<(), String> {
    for r in rules {
        if r.principal != "*" {
            rill_net::identity::check_principal_name(&r.principal).map_err(|e| e.to_string())?;
        }
        let name = match &r.resource {
            AclResource::Topic(n)
            | AclResource::TopicPrefix(n)
            | AclResource::Group(n)
            | AclResource::Transform(n) => n,
            AclResource::Cluster => continue,
        };
        if name.is_empty() || name.len() > 249 || name.chars().any(char::is_control) {
            return Err(format!(
                "the resource name {name:?} of rule \"{r}\" must be 1 to 249 characters without control characters"
            ));
        }
    }
    Ok(())
}

fn refused(code: ErrorCode, message: String) -> Outcome {
    Outcome::Refused { code, message }
}

/// Spreads `partitions` x `replication_factor` replicas over `live` brokers
/// (sorted), round-robin from `start` as Kafka does: partition p gets brokers
/// `start+p, start+p+1, ...`, so leaders (the first replica) spread too.
pub fn assign_replicas(
    live: &[i32],
    partitions: u32,
    replication_factor: u16,
    start: usize,
) -> Result<Vec<Vec<i32>>, String> {
    let rf = replication_factor as usize;
    if rf == 0 {
        return Err("replication factor must be at least 1".into());
    }
    if rf > live.len() {
        return Err(format!(
            "replication factor {rf} is larger than the {} live broker(s) {live:?}; \
             start more brokers or lower --replication-factor",
            live.len()
        ));
    }
    Ok((0..partitions as usize)
        .map(|p| {
            (0..rf)
                .map(|j| live[(start + p + j) % live.len()])
                .collect()
        })
        .collect())
}

impl MetadataImage {
    /// Brokers not fenced, ascending.
    pub fn live_brokers(&self) -> Vec<i32> {
        self.brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| b.id)
            .collect()
    }

    fn alive(&self, id: i32) -> bool {
        self.brokers.get(&id).is_some_and(|b| !b.fenced)
    }

    /// New partitions with these replicas: led by the first live one, the
    /// live ones in the ISR (all of them when none is live), epoch 0.
    fn new_partitions(&self, assignment: &[Vec<i32>]) -> Vec<PartitionState> {
        assignment
            .iter()
            .map(|replicas| {
                let isr: Vec<i32> = replicas
                    .iter()
                    .copied()
                    .filter(|b| self.alive(*b))
                    .collect();
                PartitionState {
                    replicas: replicas.clone(),
                    leader: isr.first().copied(),
                    leader_epoch: LeaderEpoch(0),
                    isr: if isr.is_empty() {
                        replicas.clone()
                    } else {
                        isr
                    },
                }
            })
            .collect()
    }

    /// Applies one committed command. Deterministic. A command that fails
    /// [`super::command_checks::check`] is refused and changes nothing.
    pub fn apply(&mut self, command: &Command) -> Outcome {
        let outcome = self.apply_checked(command);
        // The checks make these unreachable from any command; a debug build
        // (every test) proves it after each one.
        #[cfg(debug_assertions)]
        for t in self.topics.values() {
            for p in &t.partitions {
                p.check();
            }
        }
        outcome
    }

    fn apply_checked(&mut self, command: &Command) -> Outcome {
        if let Err(e) = super::command_checks::check(self, command) {
            return refused(e.code, e.message);
        }
        self.apply_inner(command)
    }

    fn apply_inner(&mut self, command: &Command) -> Outcome {
        match command {
            // The rules' and the quota's contents were checked by
            // command_checks::check at the start of apply.
            Command::CreateAcls { rules } => {
                if self.acls.len() + rules.len() > ACL_RULES_MAX {
                    return refused(
                        ErrorCode::PolicyViolation,
                        format!(
                            "the cluster holds {} ACL rules; adding {} would pass the limit of {ACL_RULES_MAX}",
                            self.acls.len(),
                            rules.len()
                        ),
                    );
                }
                let mut created = 0;
                for r in rules {
                    if let Err(at) = self.acls.binary_search(r) {
                        self.acls.insert(at, r.clone());
                        created += 1;
                    }
                }
                Outcome::Count(created)
            }
            Command::DeleteAcls { rules } => {
                let mut deleted = 0;
                for r in rules {
                    if let Ok(at) = self.acls.binary_search(r) {
                        self.acls.remove(at);
                        deleted += 1;
                    }
                }
                Outcome::Count(deleted)
            }
            Command::SetQuota { principal, quota } => {
                if quota.produce_bytes_per_s.is_none() && quota.fetch_bytes_per_s.is_none() {
                    self.quotas.remove(principal);
                } else {
                    self.quotas.insert(principal.clone(), quota.clone());
                }
                Outcome::Done
            }
            Command::SetUser { name, credentials } => {
                let existed = if credentials.is_empty() {
                    self.users.remove(name).is_some()
                } else {
                    self.users
                        .insert(name.clone(), credentials.clone())
                        .is_some()
                };
                Outcome::Count(u32::from(existed))
            }
            Command::AllocateProducerId => {
                let id = self.next_producer_id;
                let Some(next) = id.checked_add(1) else {
                    return refused(
                        ErrorCode::PolicyViolation,
                        format!("producer ids are exhausted (next would pass {id})"),
                    );
                };
                self.next_producer_id = next;
                Outcome::ProducerId(id)
            }
            Command::SetClusterId { cluster_id } => {
                if self.cluster_id.is_empty() {
                    self.cluster_id = cluster_id.clone();
                }
                Outcome::Done
            }
            Command::RegisterBroker {
                id,
                addr,
                listeners,
            } => {
                self.brokers.insert(
                    *id,
                    BrokerRecord {
                        id: *id,
                        addr: addr.clone(),
                        fenced: false,
                        listeners: listeners.clone(),
                    },
                );
                Outcome::Moved(self.elect_offline(*id))
            }
            Command::CreateTopic {
                name,
                id,
                internal,
                configs,
                assignment,
            } => {
                if self.topics.contains_key(name) {
                    return refused(
                        ErrorCode::TopicAlreadyExists,
                        format!("topic {name:?} already exists"),
                    );
                }
                if let Some(b) = assignment
                    .iter()
                    .flatten()
                    .find(|b| !self.brokers.contains_key(b))
                {
                    return refused(
                        ErrorCode::InvalidReplicationFactor,
                        format!("topic {name}: replica {b} is not a registered broker"),
                    );
                }
                let partitions = self.new_partitions(assignment);
                self.topics.insert(
                    name.clone(),
                    TopicState {
                        name: name.clone(),
                        id: id.clone(),
                        internal: *internal,
                        configs: configs.clone(),
                        partitions,
                    },
                );
                Outcome::Done
            }
            Command::CreatePartitions { name, assignment } => {
                if let Some(b) = assignment
                    .iter()
                    .flatten()
                    .find(|b| !self.brokers.contains_key(b))
                {
                    return refused(
                        ErrorCode::InvalidReplicationFactor,
                        format!("topic {name}: replica {b} is not a registered broker"),
                    );
                }
                let partitions = self.new_partitions(assignment);
                match self.topics.get_mut(name) {
                    Some(t) => {
                        t.partitions.extend(partitions);
                        Outcome::Done
                    }
                    None => refused(
                        ErrorCode::UnknownTopicOrPartition,
                        format!("topic {name:?} does not exist"),
                    ),
                }
            }
            Command::DeleteTopic { name } => match self.topics.remove(name) {
                Some(_) => Outcome::Done,
                None => refused(
                    ErrorCode::UnknownTopicOrPartition,
                    format!("topic {name:?} does not exist"),
                ),
            },
            Command::SetTopicConfigs { name, configs } => match self.topics.get_mut(name) {
                Some(t) => {
                    t.configs = configs.clone();
                    Outcome::Done
                }
                None => refused(
                    ErrorCode::UnknownTopicOrPartition,
                    format!("topic {name:?} does not exist"),
                ),
            },
            Command::FenceBroker { id } => {
                let Some(b) = self.brokers.get_mut(id) else {
                    return Outcome::Done;
                };
                b.fenced = true;
                let mut moved = Vec::new();
                let alive: Vec<i32> = self.live_brokers();
                for t in self.topics.values_mut() {
                    let unclean = t.unclean_allowed();
                    for (i, p) in t.partitions.iter_mut().enumerate() {
                        if !p.replicas.contains(id) {
                            continue;
                        }
                        let was_leader = p.leader == Some(*id);
                        // Leave the ISR unless it is the last member (then it
                        // stays: it alone holds every committed record).
                        if p.isr.len() > 1 {
                            p.isr.retain(|b| b != id);
                        }
                        if was_leader {
                            let next = p.isr.iter().copied().find(|b| b != id && alive.contains(b));
                            let next = match next {
                                Some(n) => Some(n),
                                None if unclean => {
                                    p.replicas.iter().copied().find(|b| alive.contains(b))
                                }
                                None => None,
                            };
                            if let Some(n) = next
                                && !p.isr.contains(&n)
                            {
                                // Unclean: the new leader's log becomes the truth.
                                p.isr = vec![n];
                            }
                            p.leader = next;
                            p.leader_epoch = LeaderEpoch(p.leader_epoch.0 + 1);
                            moved.push(format!("{}-{i}", t.name));
                        }
                    }
                }
                Outcome::Moved(moved)
            }
            Command::UnfenceBroker { id } => {
                let Some(b) = self.brokers.get_mut(id) else {
                    return Outcome::Done;
                };
                b.fenced = false;
                Outcome::Moved(self.elect_offline(*id))
            }
            Command::AlterIsr {
                broker_id,
                topic,
                partition,
                leader_epoch,
                new_isr,
            } => {
                let alive: Vec<i32> = self.live_brokers();
                let Some(p) = self
                    .topics
                    .get_mut(topic)
                    .and_then(|t| t.partitions.get_mut(*partition as usize))
                else {
                    return refused(
                        ErrorCode::UnknownTopicOrPartition,
                        format!("partition {topic}-{partition} does not exist"),
                    );
                };
                if p.leader != Some(*broker_id) || p.leader_epoch != *leader_epoch {
                    return refused(
                        ErrorCode::FencedLeaderEpoch,
                        format!(
                            "partition {topic}-{partition}: broker {broker_id} at epoch {leader_epoch} \
                             is not the leader (leader {:?}, epoch {})",
                            p.leader, p.leader_epoch
                        ),
                    );
                }
                if !new_isr.contains(broker_id)
                    || new_isr.iter().any(|b| !p.replicas.contains(b))
                    || new_isr
                        .iter()
                        .any(|b| !p.isr.contains(b) && !alive.contains(b))
                {
                    return refused(
                        ErrorCode::InvalidRequest,
                        format!(
                            "partition {topic}-{partition}: ISR {new_isr:?} must hold the leader and only live replicas of {:?}",
                            p.replicas
                        ),
                    );
                }
                let mut isr = new_isr.clone();
                isr.sort_unstable();
                isr.dedup();
                p.isr = isr;
                Outcome::Done
            }
            Command::AlterIsrBatch { broker_id, changes } => {
                let mut refusals = 0;
                let mut first = None;
                for c in changes {
                    let outcome = self.apply_checked(&Command::AlterIsr {
                        broker_id: *broker_id,
                        topic: c.topic.clone(),
                        partition: c.partition,
                        leader_epoch: c.leader_epoch,
                        new_isr: c.new_isr.clone(),
                    });
                    if let Outcome::Refused { code, message } = outcome {
                        refusals += 1;
                        first.get_or_insert((code, message));
                    }
                }
                match first {
                    None => Outcome::Done,
                    Some((code, message)) => refused(
                        code,
                        format!(
                            "{refusals} of {} ISR changes refused (the others applied); the first: {message}",
                            changes.len()
                        ),
                    ),
                }
            }
            Command::ElectPreferred { topics } => {
                let alive: Vec<i32> = self.live_brokers();
                let mut moved = Vec::new();
                for t in self.topics.values_mut() {
                    if topics.as_ref().is_some_and(|ts| !ts.contains(&t.name)) {
                        continue;
                    }
                    for (i, p) in t.partitions.iter_mut().enumerate() {
                        let Some(&preferred) = p.replicas.first() else {
                            continue;
                        };
                        if p.leader != Some(preferred)
                            && p.isr.contains(&preferred)
                            && alive.contains(&preferred)
                        {
                            p.leader = Some(preferred);
                            p.leader_epoch = LeaderEpoch(p.leader_epoch.0 + 1);
                            moved.push(format!("{}-{i}", t.name));
                        }
                    }
                }
                Outcome::Moved(moved)
            }
        }
    }

    /// Gives `id` the leadership of offline partitions whose ISR holds it.
    fn elect_offline(&mut self, id: i32) -> Vec<String> {
        let mut moved = Vec::new();
        for t in self.topics.values_mut() {
            for (i, p) in t.partitions.iter_mut().enumerate() {
                if p.leader.is_none() && p.isr.contains(&id) {
                    p.leader = Some(id);
                    p.leader_epoch = LeaderEpoch(p.leader_epoch.0 + 1);
                    moved.push(format!("{}-{i}", t.name));
                }
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> MetadataImage {
        let mut m = MetadataImage::default();
        for id in 0..3 {
            m.apply(&Command::RegisterBroker {
                id,
                addr: format!("127.0.0.1:{}", 9092 + id),
                listeners: Default::default(),
            });
        }
        m
    }

    fn create(m: &mut MetadataImage, name: &str, rf: u16, configs: &[(&str, &str)]) -> Outcome {
        let assignment = assign_replicas(&m.live_brokers(), 1, rf, 0).unwrap();
        m.apply(&Command::CreateTopic {
            name: name.into(),
            id: format!("id-{name}"),
            internal: false,
            configs: configs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            assignment,
        })
    }

    #[test]
    fn assignment_spreads_leaders_and_replicas() {
        let a = assign_replicas(&[0, 1, 2], 3, 2, 0).unwrap();
        assert_eq!(a, vec![vec![0, 1], vec![1, 2], vec![2, 0]]);
        let e = assign_replicas(&[0, 1], 1, 3, 0).unwrap_err();
        assert!(
            e.contains("replication factor 3") && e.contains("2 live"),
            "{e}"
        );
    }

    #[test]
    fn fencing_the_leader_moves_leadership_within_the_isr_and_bumps_the_epoch() {
        let mut m = three();
        assert_eq!(create(&mut m, "t", 3, &[]), Outcome::Done);
        let p = &m.topics["t"].partitions[0];
        assert_eq!((p.leader, p.isr.clone()), (Some(0), vec![0, 1, 2]));
        let out = m.apply(&Command::FenceBroker { id: 0 });
        assert_eq!(out, Outcome::Moved(vec!["t-0".into()]));
        let p = &m.topics["t"].partitions[0];
        assert_eq!(p.leader, Some(1));
        assert_eq!(p.leader_epoch, LeaderEpoch(1));
        assert_eq!(p.isr, vec![1, 2]);
        // The old leader comes back: it is not in the ISR, so it does not lead.
        m.apply(&Command::UnfenceBroker { id: 0 });
        assert_eq!(m.topics["t"].partitions[0].leader, Some(1));
        // Its leader adds it back once it caught up; then the preferred election.
        let out = m.apply(&Command::AlterIsr {
            broker_id: 1,
            topic: "t".into(),
            partition: 0,
            leader_epoch: LeaderEpoch(1),
            new_isr: vec![0, 1, 2],
        });
        assert_eq!(out, Outcome::Done);
        let out = m.apply(&Command::ElectPreferred { topics: None });
        assert_eq!(out, Outcome::Moved(vec!["t-0".into()]));
        let p = &m.topics["t"].partitions[0];
        assert_eq!((p.leader, p.leader_epoch), (Some(0), LeaderEpoch(2)));
    }

    #[test]
    fn last_isr_member_stays_and_partition_goes_offline_without_unclean_election() {
        let mut m = three();
        create(&mut m, "t", 2, &[]);
        // ISR [0, 1]: fence 1 (follower) then 0 (leader).
        m.apply(&Command::FenceBroker { id: 1 });
        assert_eq!(m.topics["t"].partitions[0].isr, vec![0]);
        m.apply(&Command::FenceBroker { id: 0 });
        let p = &m.topics["t"].partitions[0];
        assert_eq!((p.leader, p.isr.clone()), (None, vec![0]));
        // Broker 1 returns: not in the ISR, so the partition stays offline.
        m.apply(&Command::UnfenceBroker { id: 1 });
        assert_eq!(m.topics["t"].partitions[0].leader, None);
        // Broker 0 returns: it leads again, with a higher epoch.
        m.apply(&Command::UnfenceBroker { id: 0 });
        let p = &m.topics["t"].partitions[0];
        assert_eq!((p.leader, p.leader_epoch), (Some(0), LeaderEpoch(2)));
    }

    #[test]
    fn unclean_election_only_when_the_topic_asks() {
        let mut m = three();
        create(&mut m, "u", 2, &[(UNCLEAN_ELECTION_CONFIG, "true")]);
        m.apply(&Command::FenceBroker { id: 1 });
        m.apply(&Command::UnfenceBroker { id: 1 });
        // ISR is [0]; 0 dies: 1 (out of sync) may lead because the topic allows it.
        m.apply(&Command::FenceBroker { id: 0 });
        let p = &m.topics["u"].partitions[0];
        assert_eq!((p.leader, p.isr.clone()), (Some(1), vec![1]));
    }

    #[test]
    fn an_isr_batch_applies_each_change_alone() {
        let mut m = three();
        create(&mut m, "t", 3, &[]);
        create(&mut m, "u", 3, &[]);
        let change = |topic: &str, epoch: i32, new_isr: Vec<i32>| IsrChange {
            topic: topic.into(),
            partition: 0,
            leader_epoch: LeaderEpoch(epoch),
            new_isr,
        };
        let leader_u = m.topics["u"].partitions[0].leader.unwrap();
        let leader_t = m.topics["t"].partitions[0].leader.unwrap();
        let out = m.apply(&Command::AlterIsrBatch {
            broker_id: leader_t,
            changes: vec![
                change("t", 7, vec![leader_t]),
                change("t", 0, vec![leader_t]),
            ],
        });
        match out {
            Outcome::Refused { code, message } => {
                assert_eq!(code, ErrorCode::FencedLeaderEpoch);
                assert!(message.starts_with("1 of 2"), "{message}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        // The valid change applied; the other topic is untouched.
        assert_eq!(m.topics["t"].partitions[0].isr, vec![leader_t]);
        assert_eq!(m.topics["u"].partitions[0].isr.len(), 3);
        let all_ok = m.apply(&Command::AlterIsrBatch {
            broker_id: leader_u,
            changes: vec![change("u", 0, vec![leader_u])],
        });
        assert_eq!(all_ok, Outcome::Done);
    }

    #[test]
    fn alter_isr_is_fenced_by_leader_epoch_and_liveness() {
        let mut m = three();
        create(&mut m, "t", 3, &[]);
        let stale = m.apply(&Command::AlterIsr {
            broker_id: 0,
            topic: "t".into(),
            partition: 0,
            leader_epoch: LeaderEpoch(7),
            new_isr: vec![0],
        });
        assert!(matches!(
            stale,
            Outcome::Refused {
                code: ErrorCode::FencedLeaderEpoch,
                ..
            }
        ));
        let shrink = m.apply(&Command::AlterIsr {
            broker_id: 0,
            topic: "t".into(),
            partition: 0,
            leader_epoch: LeaderEpoch(0),
            new_isr: vec![0, 1],
        });
        assert_eq!(shrink, Outcome::Done);
        m.apply(&Command::FenceBroker { id: 2 });
        let expand_dead = m.apply(&Command::AlterIsr {
            broker_id: 0,
            topic: "t".into(),
            partition: 0,
            leader_epoch: LeaderEpoch(0),
            new_isr: vec![0, 1, 2],
        });
        assert!(matches!(expand_dead, Outcome::Refused { .. }));
        assert_eq!(m.topics["t"].partitions[0].isr, vec![0, 1]);
    }

    #[test]
    fn create_refuses_duplicates_and_unknown_brokers() {
        let mut m = three();
        create(&mut m, "t", 1, &[]);
        assert!(matches!(
            create(&mut m, "t", 1, &[]),
            Outcome::Refused {
                code: ErrorCode::TopicAlreadyExists,
                ..
            }
        ));
        let out = m.apply(&Command::CreateTopic {
            name: "x".into(),
            id: "i".into(),
            internal: false,
            configs: BTreeMap::new(),
            assignment: vec![vec![9]],
        });
        assert!(matches!(out, Outcome::Refused { .. }));
    }
}
