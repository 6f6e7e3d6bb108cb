//! `TopicRegistry`: the partitions this broker hosts on local disk — opened,
//! reconfigured, closed and deleted by reconcile only, to follow the metadata
//! image, which is the one record of which topics exist (a single broker
//! included: it is a one-voter quorum).
//!
//! Invariants:
//! - Nothing here decides whether a topic exists: the image does. Validation of
//!   create, alter and delete is a pure function of (request, image) in
//!   [`crate::cluster::topic_changes`].
//! - Partition logs live in `<data_dir>/<topic>-<partition>/`, each with a
//!   `partition.metadata` file naming the topic id (Kafka's format), so a
//!   directory left by an older incarnation of a topic (deleted and created again
//!   while this broker was down) is told apart and replaced, never adopted.
//! - A directory being deleted is renamed to `<dir>.deleted` first, then removed;
//!   the next start removes any leftover, and reconcile removes directories that
//!   belong to no topic of the image (a delete that crashed half-way).
//! - The request path only takes the map's read lock, for a lookup.
//!
//! All functions here block (fsync, log recovery); call them from blocking
//! threads, not from the async request path.

use crate::cluster::image::{MetadataImage, TopicState};
use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::fence::SelfFence;
use crate::metadata::{sync_dir, write_atomic};
use crate::partition::{Partition, Topic};
use crate::topic_configs::{self, TopicDefaults, TopicSettings};
use parking_lot::{Mutex, RwLock};
use rill_proto::LeaderEpoch;
use rill_proto::types::now_ms;
use rill_proto::wire::{ConfigEntry, ErrorCode, ErrorInfo};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Longest topic name (Kafka's limit).
pub const TOPIC_NAME_LEN_MAX: usize = 249;
/// Suffix of a partition directory being removed.
pub const DELETED_SUFFIX: &str = ".deleted";
/// The file in each partition directory that names its topic id.
pub const PARTITION_METADATA_FILE: &str = "partition.metadata";

/// A topic to create, with the broker defaults already filled in.
#[derive(Debug, Clone)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: u32,
    pub replication_factor: u16,
    pub configs: Vec<(String, String)>,
    pub internal: bool,
}

/// The partitions this broker hosts.
#[derive(Debug)]
pub struct TopicRegistry {
    data_dir: PathBuf,
    broker_id: i32,
    /// This broker's self-fence, shared with every partition it opens.
    fence: Arc<SelfFence>,
    defaults: TopicDefaults,
    topics: RwLock<HashMap<Arc<str>, Arc<Topic>>>,
    /// Serialises opening and removing topics.
    changes: Mutex<()>,
}

/// Checks a topic name against Kafka's rules.
pub fn validate_topic_name(name: &str, internal: bool) -> Result<(), ErrorInfo> {
    let invalid = |why: String| {
        ErrorInfo::new(
            ErrorCode::InvalidTopic,
            format!("topic name {name:?} is not valid: {why}"),
        )
    };
    if name.is_empty() || name.len() > TOPIC_NAME_LEN_MAX {
        return Err(invalid(format!(
            "it must be 1 to {TOPIC_NAME_LEN_MAX} characters long, not {}",
            name.len()
        )));
    }
    if name == "." || name == ".." {
        return Err(invalid("\".\" and \"..\" are reserved".into()));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(invalid(format!(
            "character {bad:?} is not allowed; use only a-z, A-Z, 0-9, '.', '_' and '-'"
        )));
    }
    if name.starts_with("__") && !internal {
        return Err(invalid(
            "names starting with \"__\" are reserved for internal topics".into(),
        ));
    }
    Ok(())
}

fn partition_dir(data_dir: &Path, topic: &str, partition: u32) -> PathBuf {
    data_dir.join(format!("{topic}-{partition}"))
}

/// Renames `dir` to `<dir>.deleted`, then removes it. Best effort after the
/// rename: startup removes what is left.
fn remove_partition_dir(data_dir: &Path, dir: &Path) -> std::io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let mut doomed = dir.as_os_str().to_owned();
    doomed.push(DELETED_SUFFIX);
    let doomed = PathBuf::from(doomed);
    if doomed.exists() {
        std::fs::remove_dir_all(&doomed)?;
    }
    std::fs::rename(dir, &doomed)?;
    sync_dir(data_dir)?;
    std::fs::remove_dir_all(&doomed)
}

/// The topic id named in a partition directory's `partition.metadata`, if any.
fn read_partition_topic_id(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(PARTITION_METADATA_FILE)).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("topic_id:"))
        .map(|id| id.trim().to_string())
}

/// Writes `partition.metadata` (crash-safe) naming the topic id.
fn write_partition_topic_id(dir: &Path, id: &str) -> std::io::Result<()> {
    write_atomic(
        dir,
        &dir.join(PARTITION_METADATA_FILE),
        format!("version: 0\ntopic_id: {id}\n").as_bytes(),
    )
}

/// `(topic, partition)` of a directory named like a partition directory.
fn parse_partition_dir(name: &str) -> Option<(&str, u32)> {
    let (topic, p) = name.rsplit_once('-')?;
    let p = p.parse::<u32>().ok()?;
    (!topic.is_empty() && validate_topic_name(topic, true).is_ok()).then_some((topic, p))
}

impl TopicRegistry {
    /// Opens the data directory (created if missing) with no partition open yet;
    /// removes `.deleted` leftovers of interrupted deletes.
    pub fn open(config: &BrokerConfig) -> Result<TopicRegistry, BrokerError> {
        let data_dir = config.data_dir.clone();
        std::fs::create_dir_all(&data_dir).map_err(|source| BrokerError::DataDir {
            action: "create the data directory",
            path: data_dir.clone(),
            source,
        })?;
        let entries = std::fs::read_dir(&data_dir).map_err(|source| BrokerError::DataDir {
            action: "list the data directory",
            path: data_dir.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() && path.to_string_lossy().ends_with(DELETED_SUFFIX) {
                std::fs::remove_dir_all(&path).map_err(|source| BrokerError::DataDir {
                    action: "remove a deleted partition directory",
                    path: path.clone(),
                    source,
                })?;
            }
        }
        Ok(TopicRegistry {
            data_dir,
            broker_id: config.id,
            fence: Arc::new(SelfFence::new(Duration::from_millis(
                config.broker_session_timeout_ms,
            ))),
            defaults: TopicDefaults {
                log: config.topic_log_defaults()?,
                replica_lag_time_max_ms: config.replica_lag_time_max_ms,
                tiering_available: config.object_store.is_some(),
            },
            topics: RwLock::new(HashMap::new()),
            changes: Mutex::new(()),
        })
    }

    pub fn broker_id(&self) -> i32 {
        self.broker_id
    }

    /// What every topic starts from (the broker's config).
    pub fn defaults(&self) -> &TopicDefaults {
        &self.defaults
    }

    pub fn topic(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics.read().get(name).cloned()
    }

    /// The partition, or UNKNOWN_TOPIC_OR_PARTITION naming what is missing.
    pub fn partition(&self, topic: &str, partition: u32) -> Result<Arc<Partition>, ErrorInfo> {
        let topics = self.topics.read();
        let Some(t) = topics.get(topic) else {
            return Err(ErrorInfo::new(
                ErrorCode::UnknownTopicOrPartition,
                format!(
                    "topic {topic:?} does not exist: create it first (rill topic create {topic})"
                ),
            ));
        };
        if partition as usize >= t.partitions.len() {
            return Err(ErrorInfo::new(
                ErrorCode::UnknownTopicOrPartition,
                format!(
                    "topic {topic:?} has no partition {partition}: it has partitions 0..{}",
                    t.partitions.len()
                ),
            ));
        }
        t.partition(partition).cloned().ok_or_else(|| {
            ErrorInfo::new(
                ErrorCode::NotLeaderOrFollower,
                format!(
                    "broker {} holds no replica of {topic}-{partition}: ask its leader \
                     (refresh the metadata)",
                    self.broker_id
                ),
            )
        })
    }

    /// UNKNOWN_TOPIC_OR_PARTITION unless the topic has partition `partition`
    /// (hosted here or not).
    pub fn check_exists(&self, topic: &str, partition: u32) -> Result<(), ErrorInfo> {
        match self.partition(topic, partition) {
            Err(e) if e.code == ErrorCode::UnknownTopicOrPartition => Err(e),
            _ => Ok(()),
        }
    }

    /// Every topic, sorted by name.
    pub fn all(&self) -> Vec<Arc<Topic>> {
        let mut all: Vec<_> = self.topics.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Opens (creating or recovering) the local logs of a topic of the image.
    /// A local topic of the same name with another id (an older incarnation) is
    /// removed first; a partition directory whose `partition.metadata` names
    /// another id is replaced. Returns the first log that could not be opened.
    pub fn open_topic(&self, t: &TopicState) -> Result<Arc<Topic>, BrokerError> {
        let _changes = self.changes.lock();
        let hosts = |i: usize| t.partitions[i].replicas.contains(&self.broker_id);
        if let Some(local) = self.topic(&t.name) {
            if local.id == t.id {
                let same = local.partitions.len() >= t.partitions.len()
                    && (0..t.partitions.len()).all(|i| local.partitions[i].is_some() == hosts(i));
                if same {
                    return Ok(local);
                }
                // Partitions were added (CreatePartitions), or this broker's
                // replicas changed: open the new ones beside the open ones,
                // close and remove those no longer hosted, under the same topic.
                let settings =
                    TopicSettings::resolve_committed(&t.name, &self.defaults, &t.configs);
                let wanted: Vec<usize> = (0..t.partitions.len())
                    .filter(|&i| hosts(i) && local.partitions.get(i).is_none_or(Option::is_none))
                    .collect();
                let mut opened = self.open_partitions(t, &wanted, &settings)?.into_iter();
                let mut partitions = Vec::with_capacity(t.partitions.len());
                for i in 0..t.partitions.len() {
                    let kept = local.partitions.get(i).cloned().flatten();
                    partitions.push(match kept {
                        Some(p) if hosts(i) => Some(p),
                        Some(p) => {
                            tracing::info!(partition = %format!("{}-{i}", t.name), "no longer a replica here; removing its log");
                            self.close_and_remove(&p);
                            None
                        }
                        None if hosts(i) => opened.next(),
                        None => None,
                    });
                }
                let topic = Arc::new(Topic {
                    name: local.name.clone(),
                    id: local.id.clone(),
                    internal: local.internal,
                    partitions,
                    overrides: Mutex::new(local.overrides.lock().clone()),
                    replication: Mutex::new(*local.replication.lock()),
                    records: Mutex::new(*local.records.lock()),
                });
                self.topics
                    .write()
                    .insert(local.name.clone(), topic.clone());
                tracing::info!(topic = %t.name, from = local.partitions.len(), to = t.partitions.len(), opened = wanted.len(), "changed the topic's local partitions");
                return Ok(topic);
            }
            tracing::info!(topic = %t.name, "local topic is an older incarnation; replacing it");
            self.remove_locked(&t.name);
        }
        let settings = TopicSettings::resolve_committed(&t.name, &self.defaults, &t.configs);
        let name: Arc<str> = Arc::from(t.name.as_str());
        let wanted: Vec<usize> = (0..t.partitions.len()).filter(|&i| hosts(i)).collect();
        let mut opened = self.open_partitions(t, &wanted, &settings)?.into_iter();
        let partitions = (0..t.partitions.len())
            .map(|i| if hosts(i) { opened.next() } else { None })
            .collect();
        let topic = Arc::new(Topic {
            name: name.clone(),
            id: t.id.clone(),
            internal: t.internal,
            partitions,
            overrides: Mutex::new(t.configs.clone()),
            replication: Mutex::new(settings.replication),
            records: Mutex::new(settings.records),
        });
        self.topics.write().insert(name, topic.clone());
        tracing::info!(topic = %t.name, partitions = t.partitions.len(), replicas_here = wanted.len(), "opened topic");
        Ok(topic)
    }

    /// Opens the logs of `t`'s partitions `indices` (in that order), each with
    /// its committed role; on a failure closes those it opened.
    fn open_partitions(
        &self,
        t: &TopicState,
        indices: &[usize],
        settings: &TopicSettings,
    ) -> Result<Vec<Arc<Partition>>, BrokerError> {
        let name: Arc<str> = Arc::from(t.name.as_str());
        let now = now_ms();
        let mut partitions = Vec::with_capacity(indices.len());
        for &i in indices {
            let state = &t.partitions[i];
            let p = i as u32;
            let dir = partition_dir(&self.data_dir, &t.name, p);
            let opened = self.open_partition_dir(&dir, &t.id).and_then(|()| {
                Partition::open(
                    name.clone(),
                    p,
                    &dir,
                    settings.log.clone(),
                    LeaderEpoch(0),
                    self.broker_id,
                    self.fence.clone(),
                    now,
                )
            });
            match opened {
                Ok(partition) => {
                    // The committed role before anybody can see the partition.
                    partition.set_role(
                        state.leader,
                        state.leader_epoch,
                        &state.replicas,
                        &state.isr,
                    );
                    partitions.push(Arc::new(partition));
                }
                Err(source) => {
                    for opened in &partitions {
                        let _ = opened.close();
                    }
                    return Err(BrokerError::LogRecovery {
                        topic: t.name.clone(),
                        partition: p,
                        dir,
                        source,
                    });
                }
            }
        }
        Ok(partitions)
    }

    /// Prepares a partition directory for topic `id`: one of another id is
    /// removed; the id is written when missing.
    fn open_partition_dir(&self, dir: &Path, id: &str) -> Result<(), rill_log::LogError> {
        let io = |what: &str, e: std::io::Error| rill_log::LogError::Io {
            context: format!("{what} {}", dir.display()),
            source: e,
        };
        match read_partition_topic_id(dir) {
            Some(found) if found == id => return Ok(()),
            Some(found) => {
                tracing::warn!(dir = %dir.display(), found, expected = id, "partition directory of an older incarnation of the topic; removing it");
                remove_partition_dir(&self.data_dir, dir).map_err(|e| io("removing", e))?;
            }
            None => {}
        }
        std::fs::create_dir_all(dir).map_err(|e| io("creating", e))?;
        write_partition_topic_id(dir, id).map_err(|e| io("writing the topic id into", e))
    }

    /// Closes a topic's logs and deletes its directories.
    pub fn remove_topic(&self, name: &str) {
        let _changes = self.changes.lock();
        self.remove_locked(name);
    }

    /// Closes the logs (requests then see the topic as deleted), removes the
    /// directories, and only then forgets the topic: once it is gone from the
    /// map, its files are gone too.
    fn remove_locked(&self, name: &str) {
        let Some(topic) = self.topic(name) else {
            return;
        };
        for p in topic.hosted() {
            self.close_and_remove(p);
        }
        self.topics.write().remove(name);
        tracing::info!(topic = %name, "deleted topic's local logs");
    }

    /// Closes a partition's log as deleted and removes its directory.
    fn close_and_remove(&self, p: &Partition) {
        if let Err(e) = p.close_deleted() {
            tracing::warn!(partition = %format!("{}-{}", p.topic(), p.index()), error = %e, "closing a deleted log");
        }
        if let Err(e) = remove_partition_dir(&self.data_dir, p.dir()) {
            tracing::warn!(dir = %p.dir().display(), error = %e, "could not remove a partition directory; the next start removes it");
        }
    }

    /// Applies committed config overrides to a local topic.
    pub fn apply_configs(&self, name: &str, overrides: &BTreeMap<String, String>) {
        let Some(topic) = self.topic(name) else {
            return;
        };
        let settings = TopicSettings::resolve_committed(name, &self.defaults, overrides);
        for p in topic.hosted() {
            p.set_config(settings.log.clone());
        }
        *topic.replication.lock() = settings.replication;
        *topic.records.lock() = settings.records;
        *topic.overrides.lock() = overrides.clone();
        tracing::info!(topic = %name, configs = ?overrides, "applied topic configs");
    }

    /// Removes partition directories that belong to no topic of `image` (a
    /// delete that crashed half-way, or a topic deleted while this broker was
    /// down): unknown name, partition index past the topic's count, or a
    /// `partition.metadata` naming another topic id; and those of partitions
    /// this broker is not a replica of (kept by brokers before 2026-12-06,
    /// which opened a log for every partition).
    pub fn remove_orphans(&self, image: &MetadataImage) {
        let _changes = self.changes.lock();
        let Ok(entries) = std::fs::read_dir(&self.data_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if !path.is_dir() || name == crate::metadata::META_DIR {
                continue;
            }
            let Some((topic, p)) = parse_partition_dir(&name) else {
                continue;
            };
            let owner = image.topics.get(topic);
            let belongs = owner.is_some_and(|t| {
                t.partitions
                    .get(p as usize)
                    .is_some_and(|ps| ps.replicas.contains(&self.broker_id))
                    && read_partition_topic_id(&path).is_none_or(|id| id == t.id)
            });
            if !belongs {
                tracing::warn!(dir = %path.display(), "removing a partition directory that belongs to no topic of the cluster");
                if let Err(e) = remove_partition_dir(&self.data_dir, &path) {
                    tracing::warn!(dir = %path.display(), error = %e, "could not remove it");
                }
            }
        }
    }

    /// Every config of a topic, marking which are broker defaults.
    pub fn describe_configs(&self, name: &str) -> Result<Vec<ConfigEntry>, ErrorInfo> {
        let topic = self.topic(name).ok_or_else(|| {
            ErrorInfo::new(
                ErrorCode::UnknownTopicOrPartition,
                format!("topic {name:?} does not exist"),
            )
        })?;
        let overrides = topic.overrides.lock().clone();
        let settings = TopicSettings::resolve_committed(name, &self.defaults, &overrides);
        Ok(topic_configs::describe(&settings, &overrides))
    }

    /// This broker's self-fence (the cluster's heartbeat loop moves it).
    pub fn fence(&self) -> &Arc<SelfFence> {
        &self.fence
    }

    /// Every partition this broker hosts (is a replica of), of every topic.
    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        self.topics
            .read()
            .values()
            .flat_map(|t| t.hosted().cloned().collect::<Vec<_>>())
            .collect()
    }

    /// Flushes and closes every log; reports the first failure, closes all.
    pub fn close_all(&self) -> Result<(), BrokerError> {
        let mut first = None;
        for p in self.partitions() {
            if let Err(source) = p.close() {
                tracing::error!(partition = %format!("{}-{}", p.topic(), p.index()), error = %source, "could not close the log");
                if first.is_none() {
                    first = Some(BrokerError::LogClose {
                        topic: p.topic().to_string(),
                        partition: p.index(),
                        source,
                    });
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka_rules() {
        let longest = "x".repeat(249);
        let too_long = "x".repeat(250);
        for ok in ["a", "orders", "a.b_c-D9", longest.as_str()] {
            validate_topic_name(ok, false).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            "a b",
            "a/b",
            "ü",
            "__internal",
            too_long.as_str(),
        ] {
            let e = validate_topic_name(bad, false).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidTopic, "{bad:?}");
        }
        validate_topic_name("__consumer_offsets", true).unwrap();
    }
}
