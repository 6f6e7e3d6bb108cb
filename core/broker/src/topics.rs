//! `TopicRegistry`: the topics this broker holds — creating, deleting and
//! reconfiguring them, and recovering them at startup.
//!
//! Invariants:
//! - Metadata changes are serialised by one admin lock and made durable
//!   (`topics.toml`) before they take effect for readers; a delete is durable
//!   before any partition directory is touched.
//! - Partition logs live in `<data_dir>/<topic>-<partition>/`. A directory being
//!   deleted is renamed to `<dir>.deleted` first, then removed; startup removes any
//!   `.deleted` leftovers and any partition directory whose topic is not in the
//!   metadata (a delete that crashed half-way).
//! - The request path only takes the map's read lock, for a lookup.
//!
//! All functions here block (fsync, log recovery); call them from blocking
//! threads, not from the async request path.

use crate::config::{BrokerConfig, PARTITIONS_PER_TOPIC_MAX};
use crate::error::BrokerError;
use crate::metadata::{MetadataStore, TopicRecord, new_topic_id, sync_dir};
use crate::partition::{Partition, Topic};
use parking_lot::{Mutex, RwLock};
use rill_log::LogConfig;
use rill_proto::LeaderEpoch;
use rill_proto::types::now_ms;
use rill_proto::wire::{ConfigEntry, ErrorCode, ErrorInfo};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Longest topic name (Kafka's limit).
pub const TOPIC_NAME_LEN_MAX: usize = 249;
/// Suffix of a partition directory being removed.
pub const DELETED_SUFFIX: &str = ".deleted";

/// A topic to create, with the broker defaults already filled in.
#[derive(Debug, Clone)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: u32,
    pub replication_factor: u16,
    pub configs: Vec<(String, String)>,
    pub internal: bool,
}

/// The topics of this broker.
#[derive(Debug)]
pub struct TopicRegistry {
    data_dir: PathBuf,
    broker_id: i32,
    /// Number of live brokers (1 until the cluster lands).
    live_brokers: usize,
    defaults: LogConfig,
    /// The broker has an object store (`remote.storage.enable` may be set).
    tiering_available: bool,
    store: MetadataStore,
    topics: RwLock<HashMap<Arc<str>, Arc<Topic>>>,
    /// Serialises metadata changes; guards the persisted records.
    admin: Mutex<BTreeMap<String, TopicRecord>>,
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

fn storage_error(what: String, e: std::io::Error) -> ErrorInfo {
    tracing::error!(error = %e, "{what}");
    ErrorInfo::new(
        ErrorCode::StorageError,
        format!("{what}: {e}; check the broker's disk"),
    )
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

impl TopicRegistry {
    /// Loads the topic metadata and recovers every partition's log.
    pub fn load(config: &BrokerConfig) -> Result<TopicRegistry, BrokerError> {
        let data_dir = config.data_dir.clone();
        std::fs::create_dir_all(&data_dir).map_err(|source| BrokerError::DataDir {
            action: "create the data directory",
            path: data_dir.clone(),
            source,
        })?;
        let defaults = config.topic_log_defaults()?;
        let store = MetadataStore::open(&data_dir)?;
        let had_metadata = store.exists();
        let records = store.load()?;

        let mut expected = std::collections::HashSet::new();
        for r in &records {
            for p in 0..r.partitions {
                expected.insert(format!("{}-{p}", r.name));
            }
        }
        Self::clean_data_dir(&data_dir, &expected, had_metadata)?;

        let now = now_ms();
        let mut topics = HashMap::new();
        let mut admin = BTreeMap::new();
        for r in records {
            let mut log_config = defaults.clone();
            for (k, v) in &r.configs {
                log_config
                    .set(k, v)
                    .map_err(|e| BrokerError::MetadataCorrupt {
                        path: store.path().to_path_buf(),
                        reason: format!("topic {}: {e}", r.name),
                    })?;
            }
            if log_config.remote_storage_enable && config.object_store.is_none() {
                tracing::warn!(
                    topic = %r.name,
                    "remote.storage.enable=true but the broker has no object store: nothing is \
                     uploaded and local retention keeps every segment; start with --object-store URL"
                );
            }
            let name: Arc<str> = Arc::from(r.name.as_str());
            let mut partitions = Vec::with_capacity(r.partitions as usize);
            for p in 0..r.partitions {
                let dir = partition_dir(&data_dir, &r.name, p);
                let partition = Partition::open(
                    name.clone(),
                    p,
                    &dir,
                    log_config.clone(),
                    LeaderEpoch(r.leader_epoch),
                    config.id,
                    now,
                )
                .map_err(|source| BrokerError::LogRecovery {
                    topic: r.name.clone(),
                    partition: p,
                    dir: dir.clone(),
                    source,
                })?;
                partitions.push(Arc::new(partition));
            }
            tracing::info!(topic = %r.name, partitions = r.partitions, "recovered topic");
            topics.insert(
                name.clone(),
                Arc::new(Topic {
                    name,
                    id: r.id.clone(),
                    internal: r.internal,
                    partitions,
                    overrides: Mutex::new(r.configs.clone()),
                }),
            );
            admin.insert(r.name.clone(), r);
        }
        Ok(TopicRegistry {
            data_dir,
            broker_id: config.id,
            live_brokers: 1,
            defaults,
            tiering_available: config.object_store.is_some(),
            store,
            topics: RwLock::new(topics),
            admin: Mutex::new(admin),
        })
    }

    /// Removes `.deleted` leftovers and orphaned partition directories.
    fn clean_data_dir(
        data_dir: &Path,
        expected: &std::collections::HashSet<String>,
        had_metadata: bool,
    ) -> Result<(), BrokerError> {
        let entries = std::fs::read_dir(data_dir).map_err(|source| BrokerError::DataDir {
            action: "list the data directory",
            path: data_dir.to_path_buf(),
            source,
        })?;
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let path = entry.path();
            if !path.is_dir() || name == crate::metadata::META_DIR {
                continue;
            }
            let remove = if name.ends_with(DELETED_SUFFIX) {
                true
            } else if let Some((topic, p)) = name.rsplit_once('-') {
                let looks_like_partition = !topic.is_empty()
                    && p.parse::<u32>().is_ok()
                    && validate_topic_name(topic, true).is_ok();
                if looks_like_partition && !expected.contains(&name) {
                    if had_metadata {
                        tracing::warn!(dir = %path.display(), "removing partition directory of a deleted topic");
                        true
                    } else {
                        tracing::warn!(
                            dir = %path.display(),
                            "partition directory without topic metadata; leaving it alone"
                        );
                        false
                    }
                } else {
                    false
                }
            } else {
                false
            };
            if remove {
                std::fs::remove_dir_all(&path).map_err(|source| BrokerError::DataDir {
                    action: "remove a deleted partition directory",
                    path: path.clone(),
                    source,
                })?;
            }
        }
        Ok(())
    }

    pub fn broker_id(&self) -> i32 {
        self.broker_id
    }

    pub fn live_brokers(&self) -> usize {
        self.live_brokers
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
        t.partition(partition).cloned().ok_or_else(|| {
            ErrorInfo::new(
                ErrorCode::UnknownTopicOrPartition,
                format!(
                    "topic {topic:?} has no partition {partition}: it has partitions 0..{}",
                    t.partitions.len()
                ),
            )
        })
    }

    /// Every topic, sorted by name.
    pub fn all(&self) -> Vec<Arc<Topic>> {
        let mut all: Vec<_> = self.topics.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// The effective config of a topic: broker defaults, then its overrides.
    fn effective_config(
        &self,
        overrides: &BTreeMap<String, String>,
    ) -> Result<LogConfig, ErrorInfo> {
        let mut config = self.defaults.clone();
        for (k, v) in overrides {
            config
                .set(k, v)
                .map_err(|e| ErrorInfo::new(ErrorCode::InvalidConfig, e.to_string()))?;
        }
        config
            .validate()
            .map_err(|e| ErrorInfo::new(ErrorCode::InvalidConfig, e.to_string()))?;
        if config.remote_storage_enable && !self.tiering_available {
            return Err(ErrorInfo::new(
                ErrorCode::InvalidConfig,
                "remote.storage.enable=true needs an object store: start the broker with \
                 --object-store URL (or [object_store] url in its config file)",
            ));
        }
        Ok(config)
    }

    /// Creates a topic (or only checks that it could be created).
    pub fn create(&self, spec: &TopicSpec, validate_only: bool) -> Result<(), ErrorInfo> {
        validate_topic_name(&spec.name, spec.internal)?;
        if spec.partitions == 0 || spec.partitions > PARTITIONS_PER_TOPIC_MAX {
            return Err(ErrorInfo::new(
                ErrorCode::InvalidPartitions,
                format!(
                    "topic {}: partition count {} is not valid; use 1 to {PARTITIONS_PER_TOPIC_MAX}",
                    spec.name, spec.partitions
                ),
            ));
        }
        if spec.replication_factor == 0 {
            return Err(ErrorInfo::new(
                ErrorCode::InvalidReplicationFactor,
                format!("topic {}: replication factor must be at least 1", spec.name),
            ));
        }
        if spec.replication_factor as usize > self.live_brokers {
            return Err(ErrorInfo::new(
                ErrorCode::InvalidReplicationFactor,
                format!(
                    "topic {}: replication factor {} is larger than the {} live broker(s)",
                    spec.name, spec.replication_factor, self.live_brokers
                ),
            ));
        }
        let mut overrides = BTreeMap::new();
        for (k, v) in &spec.configs {
            overrides.insert(k.clone(), v.clone());
        }
        let log_config = self
            .effective_config(&overrides)
            .map_err(|e| ErrorInfo::new(e.code, format!("topic {}: {}", spec.name, e.message)))?;

        let mut admin = self.admin.lock();
        if admin.contains_key(&spec.name) {
            return Err(ErrorInfo::new(
                ErrorCode::TopicAlreadyExists,
                format!("topic {:?} already exists", spec.name),
            ));
        }
        if validate_only {
            return Ok(());
        }
        let record = TopicRecord {
            name: spec.name.clone(),
            id: new_topic_id(),
            partitions: spec.partitions,
            internal: spec.internal,
            leader_epoch: 0,
            configs: overrides.clone(),
        };
        // Open the logs first (a stale directory of an earlier incarnation is
        // removed), then make the topic durable, then visible.
        let name: Arc<str> = Arc::from(spec.name.as_str());
        let now = now_ms();
        let mut partitions = Vec::with_capacity(spec.partitions as usize);
        for p in 0..spec.partitions {
            let dir = partition_dir(&self.data_dir, &spec.name, p);
            let opened = remove_partition_dir(&self.data_dir, &dir)
                .map_err(|e| storage_error(format!("partition {}-{p}: could not clear {}", spec.name, dir.display()), e))
                .and_then(|()| {
                    Partition::open(
                        name.clone(),
                        p,
                        &dir,
                        log_config.clone(),
                        LeaderEpoch(0),
                        self.broker_id,
                        now,
                    )
                    .map_err(|e| {
                        tracing::error!(partition = %format!("{}-{p}", spec.name), error = %e, "could not create the partition log");
                        ErrorInfo::new(
                            ErrorCode::StorageError,
                            format!("partition {}-{p}: could not create the log in {}: {e}", spec.name, dir.display()),
                        )
                    })
                });
            match opened {
                Ok(partition) => partitions.push(Arc::new(partition)),
                Err(e) => {
                    self.discard(&partitions);
                    return Err(e);
                }
            }
        }
        admin.insert(spec.name.clone(), record);
        if let Err(e) = self.persist(&admin) {
            admin.remove(&spec.name);
            self.discard(&partitions);
            return Err(storage_error(
                format!("topic {}: could not write the topic metadata", spec.name),
                e,
            ));
        }
        let id = admin[&spec.name].id.clone();
        self.topics.write().insert(
            name.clone(),
            Arc::new(Topic {
                name,
                id,
                internal: spec.internal,
                partitions,
                overrides: Mutex::new(overrides),
            }),
        );
        tracing::info!(topic = %spec.name, partitions = spec.partitions, "created topic");
        Ok(())
    }

    /// Closes and removes the logs of a topic that is not (or no longer) live.
    fn discard(&self, partitions: &[Arc<Partition>]) {
        for p in partitions {
            if let Err(e) = p.close_deleted() {
                tracing::warn!(partition = %format!("{}-{}", p.topic(), p.index()), error = %e, "closing a discarded log");
            }
            if let Err(e) = remove_partition_dir(&self.data_dir, p.dir()) {
                tracing::warn!(dir = %p.dir().display(), error = %e, "could not remove a partition directory; the next startup removes it");
            }
        }
    }

    fn persist(&self, admin: &BTreeMap<String, TopicRecord>) -> std::io::Result<()> {
        let records: Vec<TopicRecord> = admin.values().cloned().collect();
        self.store.save(&records)
    }

    /// Deletes a topic: durably from the metadata first, then its directories.
    pub fn delete(&self, name: &str) -> Result<(), ErrorInfo> {
        let mut admin = self.admin.lock();
        let Some(record) = admin.remove(name) else {
            return Err(ErrorInfo::new(
                ErrorCode::UnknownTopicOrPartition,
                format!("topic {name:?} does not exist"),
            ));
        };
        if let Err(e) = self.persist(&admin) {
            admin.insert(name.to_string(), record);
            return Err(storage_error(
                format!("topic {name}: could not write the topic metadata"),
                e,
            ));
        }
        let topic = self.topics.write().remove(name);
        if let Some(topic) = topic {
            self.discard(&topic.partitions);
        }
        tracing::info!(topic = %name, "deleted topic");
        Ok(())
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
        let config = self.effective_config(&overrides)?;
        Ok(config
            .to_pairs()
            .into_iter()
            .map(|(name, value)| ConfigEntry {
                is_default: !overrides.contains_key(&name),
                name,
                value,
            })
            .collect())
    }

    /// Sets and removes overrides of one topic: validated, persisted, applied.
    pub fn alter_configs(
        &self,
        name: &str,
        set: &[(String, String)],
        delete: &[String],
        validate_only: bool,
    ) -> Result<(), ErrorInfo> {
        let mut admin = self.admin.lock();
        let Some(record) = admin.get(name) else {
            return Err(ErrorInfo::new(
                ErrorCode::UnknownTopicOrPartition,
                format!("topic {name:?} does not exist"),
            ));
        };
        let mut overrides = record.configs.clone();
        for key in delete {
            if !LogConfig::known_keys().contains(&key.as_str()) {
                return Err(ErrorInfo::new(
                    ErrorCode::InvalidConfig,
                    format!(
                        "topic {name}: cannot delete unknown config {key:?}; known keys are {}",
                        LogConfig::known_keys().join(", ")
                    ),
                ));
            }
            overrides.remove(key);
        }
        for (k, v) in set {
            overrides.insert(k.clone(), v.clone());
        }
        let config = self
            .effective_config(&overrides)
            .map_err(|e| ErrorInfo::new(e.code, format!("topic {name}: {}", e.message)))?;
        if validate_only {
            return Ok(());
        }
        let old = std::mem::replace(
            &mut admin.get_mut(name).expect("checked above").configs,
            overrides.clone(),
        );
        if let Err(e) = self.persist(&admin) {
            admin.get_mut(name).expect("checked above").configs = old;
            return Err(storage_error(
                format!("topic {name}: could not write the topic metadata"),
                e,
            ));
        }
        if let Some(topic) = self.topic(name) {
            *topic.overrides.lock() = overrides;
            for p in &topic.partitions {
                p.set_config(config.clone());
            }
        }
        tracing::info!(topic = %name, set = ?set, delete = ?delete, "altered topic configs");
        Ok(())
    }

    /// Every partition of every topic.
    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        self.topics
            .read()
            .values()
            .flat_map(|t| t.partitions.iter().cloned())
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
