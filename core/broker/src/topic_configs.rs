//! The one table of topic configs: every key a topic accepts (Kafka's names),
//! which part of the broker owns it, its default, and its validator; and the
//! typed settings each part reads, built from the table.
//!
//! A topic's record in the metadata image holds only its overrides. Everything
//! else is derived here: [`TopicSettings::resolve`] validates the overrides over
//! the broker's defaults (unknown keys and bad values are errors that name the key,
//! the value and what is allowed) and builds the log's [`LogConfig`], the
//! replication settings, the tiering switch and the leader's record checks;
//! [`describe`] lists every key with its value and whether it is a default.
//!
//! Invariants: a key is in exactly one row of [`TOPIC_CONFIGS`]; the log keys are
//! exactly those `LogConfig::set` understands (checked by a test), so rill-log
//! stays the parser of its own settings.

use rill_log::LogConfig;
use rill_proto::validation::TimestampBounds;
use rill_proto::wire::{ConfigEntry, ErrorCode, ErrorInfo};
use std::collections::BTreeMap;

pub const CLEANUP_POLICY_CONFIG: &str = "cleanup.policy";
pub const REMOTE_STORAGE_ENABLE_CONFIG: &str = "remote.storage.enable";
pub const LOCAL_RETENTION_MS_CONFIG: &str = "local.retention.ms";
pub const LOCAL_RETENTION_BYTES_CONFIG: &str = "local.retention.bytes";
/// Let an out-of-sync replica become leader (data loss) when no ISR member is left.
pub const UNCLEAN_ELECTION_CONFIG: &str = "unclean.leader.election.enable";
/// acks=all needs this many ISR members.
pub const MIN_INSYNC_REPLICAS_CONFIG: &str = "min.insync.replicas";
/// A follower not caught up for this long leaves the ISR.
pub const REPLICA_LAG_TIME_MAX_MS_CONFIG: &str = "replica.lag.time.max.ms";
/// A produced record newer than the broker's time by more than this is refused.
pub use rill_proto::validation::TIMESTAMP_AFTER_MAX_MS_CONFIG;
/// A produced record older than the broker's time by more than this is refused.
pub use rill_proto::validation::TIMESTAMP_BEFORE_MAX_MS_CONFIG;

/// The part of the broker a topic config belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigOwner {
    /// The partition log (rill-log's `LogConfig`): segments, retention, compaction, flush.
    Log,
    /// Tiered storage (also carried in `LogConfig`, which applies local retention).
    Tiering,
    /// Replication: ISR, acks=all, leader election.
    Replication,
    /// The leader's checks of produced records before they are appended.
    Records,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct TopicConfigDef {
    pub name: &'static str,
    pub owner: ConfigOwner,
}

/// Every topic config, by owner.
pub const TOPIC_CONFIGS: &[TopicConfigDef] = &[
    TopicConfigDef::log("segment.bytes"),
    TopicConfigDef::log("segment.ms"),
    TopicConfigDef::log("index.interval.bytes"),
    TopicConfigDef::log("flush.messages"),
    TopicConfigDef::log("flush.ms"),
    TopicConfigDef::log("retention.ms"),
    TopicConfigDef::log("retention.bytes"),
    TopicConfigDef::log(CLEANUP_POLICY_CONFIG),
    TopicConfigDef::log("delete.retention.ms"),
    TopicConfigDef::log("min.cleanable.dirty.ratio"),
    TopicConfigDef::log("max.message.bytes"),
    TopicConfigDef {
        name: REMOTE_STORAGE_ENABLE_CONFIG,
        owner: ConfigOwner::Tiering,
    },
    TopicConfigDef {
        name: LOCAL_RETENTION_MS_CONFIG,
        owner: ConfigOwner::Tiering,
    },
    TopicConfigDef {
        name: LOCAL_RETENTION_BYTES_CONFIG,
        owner: ConfigOwner::Tiering,
    },
    TopicConfigDef {
        name: MIN_INSYNC_REPLICAS_CONFIG,
        owner: ConfigOwner::Replication,
    },
    TopicConfigDef {
        name: UNCLEAN_ELECTION_CONFIG,
        owner: ConfigOwner::Replication,
    },
    TopicConfigDef {
        name: REPLICA_LAG_TIME_MAX_MS_CONFIG,
        owner: ConfigOwner::Replication,
    },
    TopicConfigDef {
        name: TIMESTAMP_BEFORE_MAX_MS_CONFIG,
        owner: ConfigOwner::Records,
    },
    TopicConfigDef {
        name: TIMESTAMP_AFTER_MAX_MS_CONFIG,
        owner: ConfigOwner::Records,
    },
];

impl TopicConfigDef {
    const fn log(name: &'static str) -> TopicConfigDef {
        TopicConfigDef {
            name,
            owner: ConfigOwner::Log,
        }
    }
}

/// The table's row for `key`.
pub fn lookup(key: &str) -> Option<&'static TopicConfigDef> {
    TOPIC_CONFIGS.iter().find(|d| d.name == key)
}

/// Every key, comma-separated, for error messages.
pub fn known_keys() -> String {
    TOPIC_CONFIGS
        .iter()
        .map(|d| d.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the broker's own configuration sets as every topic's defaults.
#[derive(Debug, Clone)]
pub struct TopicDefaults {
    /// Kafka's log defaults with the broker's `topic_defaults` applied.
    pub log: LogConfig,
    /// `replica.lag.time.max.ms` of the broker.
    pub replica_lag_time_max_ms: u64,
    /// The broker has an object store (so `remote.storage.enable` may be set).
    pub tiering_available: bool,
}

#[cfg(test)]
impl TopicDefaults {
    /// Kafka's defaults, no object store: what unit tests start from.
    pub fn kafka() -> TopicDefaults {
        TopicDefaults {
            log: LogConfig::default(),
            replica_lag_time_max_ms: 10_000,
            tiering_available: false,
        }
    }
}

/// Replication settings of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicationSettings {
    pub min_insync_replicas: usize,
    pub unclean_leader_election: bool,
    pub replica_lag_time_max_ms: u64,
}

impl ReplicationSettings {
    const DEFAULT_MIN_INSYNC_REPLICAS: usize = 1;

    fn defaults(d: &TopicDefaults) -> ReplicationSettings {
        ReplicationSettings {
            min_insync_replicas: Self::DEFAULT_MIN_INSYNC_REPLICAS,
            unclean_leader_election: false,
            replica_lag_time_max_ms: d.replica_lag_time_max_ms,
        }
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let bad = |allowed: &str| format!("config {key}={value:?} is not valid: {allowed}");
        match key {
            MIN_INSYNC_REPLICAS_CONFIG => {
                self.min_insync_replicas = value
                    .parse::<u16>()
                    .ok()
                    .filter(|v| *v >= 1)
                    .ok_or_else(|| bad("use a whole number >= 1"))?
                    as usize
            }
            UNCLEAN_ELECTION_CONFIG => {
                self.unclean_leader_election = match value {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad("use true or false")),
                }
            }
            REPLICA_LAG_TIME_MAX_MS_CONFIG => {
                self.replica_lag_time_max_ms = value
                    .parse::<u64>()
                    .ok()
                    .filter(|v| *v >= 1)
                    .ok_or_else(|| bad("use a whole number of milliseconds >= 1"))?
            }
            _ => unreachable!("{key} is not a replication config"),
        }
        Ok(())
    }

    fn to_pairs(self) -> [(&'static str, String); 3] {
        [
            (
                MIN_INSYNC_REPLICAS_CONFIG,
                self.min_insync_replicas.to_string(),
            ),
            (
                UNCLEAN_ELECTION_CONFIG,
                self.unclean_leader_election.to_string(),
            ),
            (
                REPLICA_LAG_TIME_MAX_MS_CONFIG,
                self.replica_lag_time_max_ms.to_string(),
            ),
        ]
    }
}

/// The leader's checks of produced records (Kafka's `LogValidator` settings).
/// Every topic is create-time (Rill has no `message.timestamp.type`), so the
/// timestamp bounds always apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordSettings {
    /// `message.timestamp.before.max.ms`: how far before the broker's time a
    /// record's timestamp may lie.
    pub timestamp_before_max_ms: i64,
    /// `message.timestamp.after.max.ms`: how far after the broker's time.
    pub timestamp_after_max_ms: i64,
}

impl RecordSettings {
    /// Kafka's default: no lower bound. An old timestamp only makes retention
    /// delete the record sooner; producers legitimately send old data
    /// (mirroring, replays) and tests produce at timestamps near 0.
    pub const DEFAULT_TIMESTAMP_BEFORE_MAX_MS: i64 = i64::MAX;
    /// Kafka 4's default, one hour: a timestamp far in the future would hold
    /// back time-based retention of its segment until that time.
    pub const DEFAULT_TIMESTAMP_AFTER_MAX_MS: i64 = 3_600_000;

    /// The bounds `rill_proto::validation::validate_produced` checks.
    pub fn timestamp_bounds(self) -> TimestampBounds {
        TimestampBounds {
            before_max_ms: self.timestamp_before_max_ms,
            after_max_ms: self.timestamp_after_max_ms,
        }
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let ms = value
            .parse::<i64>()
            .ok()
            .filter(|v| *v >= 0)
            .ok_or_else(|| {
                format!(
                    "config {key}={value:?} is not valid: use a whole number of milliseconds \
                 from 0 to {}",
                    i64::MAX
                )
            })?;
        match key {
            TIMESTAMP_BEFORE_MAX_MS_CONFIG => self.timestamp_before_max_ms = ms,
            TIMESTAMP_AFTER_MAX_MS_CONFIG => self.timestamp_after_max_ms = ms,
            _ => unreachable!("{key} is not a record config"),
        }
        Ok(())
    }

    fn to_pairs(self) -> [(&'static str, String); 2] {
        [
            (
                TIMESTAMP_BEFORE_MAX_MS_CONFIG,
                self.timestamp_before_max_ms.to_string(),
            ),
            (
                TIMESTAMP_AFTER_MAX_MS_CONFIG,
                self.timestamp_after_max_ms.to_string(),
            ),
        ]
    }
}

impl Default for RecordSettings {
    fn default() -> RecordSettings {
        RecordSettings {
            timestamp_before_max_ms: Self::DEFAULT_TIMESTAMP_BEFORE_MAX_MS,
            timestamp_after_max_ms: Self::DEFAULT_TIMESTAMP_AFTER_MAX_MS,
        }
    }
}

/// Every part's typed settings of one topic.
#[derive(Debug, Clone)]
pub struct TopicSettings {
    /// The log's settings (tiering's keys included: the log applies local retention).
    pub log: LogConfig,
    pub replication: ReplicationSettings,
    pub records: RecordSettings,
}

fn invalid(message: String) -> ErrorInfo {
    ErrorInfo::new(ErrorCode::InvalidConfig, message)
}

impl TopicSettings {
    /// Validates `overrides` over `defaults` and builds each part's settings.
    /// Errors name the key and value and say what is allowed.
    pub fn resolve(
        defaults: &TopicDefaults,
        overrides: &BTreeMap<String, String>,
    ) -> Result<TopicSettings, ErrorInfo> {
        let mut log = defaults.log.clone();
        let mut replication = ReplicationSettings::defaults(defaults);
        let mut records = RecordSettings::default();
        for (key, value) in overrides {
            let Some(def) = lookup(key) else {
                return Err(invalid(format!(
                    "config {key:?} is not a topic config; known keys are {}",
                    known_keys()
                )));
            };
            match def.owner {
                ConfigOwner::Log | ConfigOwner::Tiering => {
                    log.set(key, value).map_err(|e| invalid(e.to_string()))?
                }
                ConfigOwner::Replication => replication.set(key, value).map_err(invalid)?,
                ConfigOwner::Records => records.set(key, value).map_err(invalid)?,
            }
        }
        log.validate().map_err(|e| invalid(e.to_string()))?;
        if log.remote_storage_enable && !defaults.tiering_available {
            return Err(invalid(
                "remote.storage.enable=true needs an object store: start the broker with \
                 --object-store URL (or [object_store] url in its config file)"
                    .into(),
            ));
        }
        Ok(TopicSettings {
            log,
            replication,
            records,
        })
    }

    /// The settings of a topic whose overrides were validated when committed.
    /// Tiering on a broker without an object store is kept and warned about
    /// (nothing uploads; local retention keeps every segment); overrides that
    /// fail to validate here (another broker's defaults) fall back to the
    /// defaults, logged, never an error.
    pub fn resolve_committed(
        topic: &str,
        defaults: &TopicDefaults,
        overrides: &BTreeMap<String, String>,
    ) -> TopicSettings {
        let lenient = TopicDefaults {
            tiering_available: true,
            ..defaults.clone()
        };
        let settings = Self::resolve(&lenient, overrides).unwrap_or_else(|e| {
            tracing::warn!(topic, error = %e.message, "a committed topic config cannot be applied here; using the defaults");
            Self::resolve(&lenient, &BTreeMap::new()).expect("the broker's defaults are valid")
        });
        if settings.log.remote_storage_enable && !defaults.tiering_available {
            tracing::warn!(
                topic,
                "remote.storage.enable=true but the broker has no object store: nothing is \
                 uploaded and local retention keeps every segment; start with --object-store URL"
            );
        }
        settings
    }
}

/// Checks one override alone: a key of the table and a value its validator
/// takes (no cross-key rules, no broker defaults): what any broker can check
/// of a committed command, whatever its own defaults.
pub fn check_entry(key: &str, value: &str) -> Result<(), ErrorInfo> {
    let Some(def) = lookup(key) else {
        return Err(invalid(format!(
            "config {key:?} is not a topic config; known keys are {}",
            known_keys()
        )));
    };
    match def.owner {
        ConfigOwner::Log | ConfigOwner::Tiering => LogConfig::default()
            .set(key, value)
            .map_err(|e| invalid(e.to_string())),
        ConfigOwner::Replication => ReplicationSettings {
            min_insync_replicas: ReplicationSettings::DEFAULT_MIN_INSYNC_REPLICAS,
            unclean_leader_election: false,
            replica_lag_time_max_ms: 1,
        }
        .set(key, value)
        .map_err(invalid),
        ConfigOwner::Records => RecordSettings::default().set(key, value).map_err(invalid),
    }
}

/// Every config of a topic with its value, marking which are defaults.
pub fn describe(
    settings: &TopicSettings,
    overrides: &BTreeMap<String, String>,
) -> Vec<ConfigEntry> {
    let mut pairs = settings.log.to_pairs();
    pairs.extend(
        settings
            .replication
            .to_pairs()
            .into_iter()
            .chain(settings.records.to_pairs())
            .map(|(k, v)| (k.to_string(), v)),
    );
    pairs
        .into_iter()
        .map(|(name, value)| ConfigEntry {
            is_default: !overrides.contains_key(&name),
            name,
            value,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> TopicDefaults {
        TopicDefaults::kafka()
    }

    fn overrides(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_table_holds_exactly_the_logs_keys_and_the_replication_keys() {
        let mut log_keys: Vec<&str> = TOPIC_CONFIGS
            .iter()
            .filter(|d| !matches!(d.owner, ConfigOwner::Replication | ConfigOwner::Records))
            .map(|d| d.name)
            .collect();
        log_keys.sort_unstable();
        let mut known: Vec<&str> = LogConfig::known_keys().to_vec();
        known.sort_unstable();
        assert_eq!(log_keys, known);
        let mut names: Vec<&str> = TOPIC_CONFIGS.iter().map(|d| d.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TOPIC_CONFIGS.len(), "a key in two rows");
        // describe lists every row once.
        let s = TopicSettings::resolve(&defaults(), &BTreeMap::new()).unwrap();
        let mut described: Vec<String> = describe(&s, &BTreeMap::new())
            .into_iter()
            .map(|e| e.name)
            .collect();
        described.sort_unstable();
        assert_eq!(described, names);
    }

    #[test]
    fn overrides_build_each_parts_settings() {
        let s = TopicSettings::resolve(
            &defaults(),
            &overrides(&[
                ("retention.ms", "1000"),
                (MIN_INSYNC_REPLICAS_CONFIG, "2"),
                (UNCLEAN_ELECTION_CONFIG, "true"),
            ]),
        )
        .unwrap();
        assert_eq!(s.log.retention_ms, Some(1000));
        assert_eq!(s.replication.min_insync_replicas, 2);
        assert!(s.replication.unclean_leader_election);
        assert_eq!(s.replication.replica_lag_time_max_ms, 10_000);
        let entries = describe(&s, &overrides(&[("retention.ms", "1000")]));
        let retention = entries.iter().find(|e| e.name == "retention.ms").unwrap();
        assert_eq!(
            (retention.value.as_str(), retention.is_default),
            ("1000", false)
        );
        let isr = entries
            .iter()
            .find(|e| e.name == MIN_INSYNC_REPLICAS_CONFIG)
            .unwrap();
        assert!(isr.is_default, "not in the overrides given to describe");
    }

    #[test]
    fn bad_keys_and_values_name_what_is_wrong() {
        for (pairs, expected) in [
            (vec![("retention.mss", "1")], "retention.mss"),
            (vec![(MIN_INSYNC_REPLICAS_CONFIG, "0")], ">= 1"),
            (vec![(UNCLEAN_ELECTION_CONFIG, "yes")], "true or false"),
            (vec![("segment.bytes", "ten")], "segment.bytes"),
            (vec![(REMOTE_STORAGE_ENABLE_CONFIG, "true")], "object store"),
            (
                vec![("retention.ms", "10"), (LOCAL_RETENTION_MS_CONFIG, "20")],
                "must not exceed",
            ),
        ] {
            let pairs: Vec<(&str, &str)> = pairs;
            let e = TopicSettings::resolve(&defaults(), &overrides(&pairs)).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidConfig);
            assert!(e.message.contains(expected), "{pairs:?}: {}", e.message);
        }
    }

    #[test]
    fn timestamp_bounds_default_to_kafkas_and_take_whole_milliseconds() {
        let s = TopicSettings::resolve(&defaults(), &BTreeMap::new()).unwrap();
        assert_eq!(s.records.timestamp_before_max_ms, i64::MAX);
        assert_eq!(s.records.timestamp_after_max_ms, 3_600_000);
        let s = TopicSettings::resolve(
            &defaults(),
            &overrides(&[
                (TIMESTAMP_BEFORE_MAX_MS_CONFIG, "86400000"),
                (TIMESTAMP_AFTER_MAX_MS_CONFIG, "0"),
            ]),
        )
        .unwrap();
        assert_eq!(
            s.records.timestamp_bounds(),
            TimestampBounds {
                before_max_ms: 86_400_000,
                after_max_ms: 0
            }
        );
        for bad in ["-1", "soon", "9223372036854775808"] {
            let e = TopicSettings::resolve(
                &defaults(),
                &overrides(&[(TIMESTAMP_AFTER_MAX_MS_CONFIG, bad)]),
            )
            .unwrap_err();
            assert!(
                e.message.contains(TIMESTAMP_AFTER_MAX_MS_CONFIG)
                    && e.message.contains("milliseconds"),
                "{bad}: {}",
                e.message
            );
        }
    }

    #[test]
    fn one_entry_is_checked_alone_by_its_rows_validator() {
        check_entry("retention.ms", "5").unwrap();
        check_entry(MIN_INSYNC_REPLICAS_CONFIG, "2").unwrap();
        check_entry(TIMESTAMP_AFTER_MAX_MS_CONFIG, "10").unwrap();
        // Cross-key rules are not this check's: local above total passes alone.
        check_entry(LOCAL_RETENTION_MS_CONFIG, "999999999999").unwrap();
        for (k, v) in [
            ("no.such.key", "1"),
            ("segment.bytes", "ten"),
            (UNCLEAN_ELECTION_CONFIG, "yes"),
            (TIMESTAMP_BEFORE_MAX_MS_CONFIG, "-5"),
        ] {
            let e = check_entry(k, v).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidConfig);
            assert!(e.message.contains(k), "{k}: {}", e.message);
        }
    }

    #[test]
    fn a_committed_config_is_applied_leniently() {
        let s = TopicSettings::resolve_committed(
            "t",
            &defaults(),
            &overrides(&[
                (REMOTE_STORAGE_ENABLE_CONFIG, "true"),
                ("retention.ms", "5"),
            ]),
        );
        assert_eq!(s.log.retention_ms, Some(5));
        assert!(s.log.remote_storage_enable);
        let s = TopicSettings::resolve_committed(
            "t",
            &defaults(),
            &overrides(&[("retention.ms", "x")]),
        );
        assert_eq!(s.log.retention_ms, defaults().log.retention_ms);
    }
}
