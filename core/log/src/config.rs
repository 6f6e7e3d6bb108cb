//! `LogConfig`: one log's settings, named and valued as Kafka's topic configs.
//!
//! Owns parsing (`set`), printing (`to_pairs`) and validation. Invariants: every
//! value a `LogConfig` holds passed the same checks `set` applies (positions fit a
//! u32 index entry, ratios lie in 0..=1); `set(k, v)` for every pair of
//! `to_pairs()` gives the same config back.

use crate::error::LogError;

/// Kafka's sentinel for "never" in `flush.messages` / `flush.ms`.
const KAFKA_NEVER: i64 = i64::MAX;

/// Per-log settings, named as Kafka's topic configs.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// `segment.bytes`: roll the active segment when it would exceed this size.
    pub segment_bytes: u64,
    /// `segment.ms`: roll the active segment when its first batch is this old.
    pub segment_ms: u64,
    /// `index.interval.bytes`: bytes between sparse index entries.
    pub index_interval_bytes: u32,
    /// `flush.messages`: fsync after this many records (None: never by count).
    pub flush_messages: Option<u64>,
    /// `flush.ms`: fsync when the oldest unflushed write is this old (None: never by time).
    pub flush_ms: Option<u64>,
    /// `retention.ms`: delete segments whose newest record is older (None: keep forever).
    pub retention_ms: Option<u64>,
    /// `retention.bytes`: delete oldest segments while the log is larger (None: no limit).
    pub retention_bytes: Option<u64>,
    /// `cleanup.policy`: delete, compact, or both.
    pub cleanup_policy: CleanupPolicy,
    /// `delete.retention.ms`: how long a tombstone survives compaction.
    pub delete_retention_ms: u64,
    /// `min.cleanable.dirty.ratio`: compact when dirty bytes / total bytes exceed this.
    pub min_cleanable_dirty_ratio: f64,
    /// `max.message.bytes`: the largest batch the log accepts.
    pub max_message_bytes: u32,
    /// `remote.storage.enable`: upload closed segments to the broker's object store.
    pub remote_storage_enable: bool,
    /// `local.retention.ms`: how long a segment stays on local disk once uploaded
    /// (None: as long as `retention.ms`; Kafka's -2).
    pub local_retention_ms: Option<u64>,
    /// `local.retention.bytes`: local size kept once uploaded (None: `retention.bytes`).
    pub local_retention_bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupPolicy {
    pub delete: bool,
    pub compact: bool,
}

impl CleanupPolicy {
    pub const DELETE: CleanupPolicy = CleanupPolicy {
        delete: true,
        compact: false,
    };
    pub const COMPACT: CleanupPolicy = CleanupPolicy {
        delete: false,
        compact: true,
    };
    pub const COMPACT_DELETE: CleanupPolicy = CleanupPolicy {
        delete: true,
        compact: true,
    };
}

impl std::fmt::Display for CleanupPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match (self.compact, self.delete) {
            (true, true) => "compact,delete",
            (true, false) => "compact",
            (false, true) => "delete",
            (false, false) => "",
        })
    }
}

impl Default for LogConfig {
    /// Kafka's defaults.
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1024 * 1024 * 1024,
            segment_ms: 7 * 24 * 60 * 60 * 1000,
            index_interval_bytes: 4096,
            flush_messages: None,
            flush_ms: None,
            retention_ms: Some(7 * 24 * 60 * 60 * 1000),
            retention_bytes: None,
            cleanup_policy: CleanupPolicy::DELETE,
            delete_retention_ms: 24 * 60 * 60 * 1000,
            min_cleanable_dirty_ratio: 0.5,
            max_message_bytes: 1024 * 1024 + 12,
            remote_storage_enable: false,
            local_retention_ms: None,
            local_retention_bytes: None,
        }
    }
}

const KNOWN_KEYS: &[&str] = &[
    "segment.bytes",
    "segment.ms",
    "index.interval.bytes",
    "flush.messages",
    "flush.ms",
    "retention.ms",
    "retention.bytes",
    "cleanup.policy",
    "delete.retention.ms",
    "min.cleanable.dirty.ratio",
    "max.message.bytes",
    "remote.storage.enable",
    "local.retention.ms",
    "local.retention.bytes",
];

/// Kafka's `local.retention.*` value for "as the total retention".
const LOCAL_AS_TOTAL: i64 = -2;

/// Smallest `segment.bytes` Kafka accepts.
const SEGMENT_BYTES_MIN: i64 = 14;

fn invalid(key: &str, value: &str, reason: impl Into<String>) -> LogError {
    LogError::InvalidConfig {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn int_in(key: &str, value: &str, min: i64, max: i64) -> Result<i64, LogError> {
    let v: i64 = value
        .trim()
        .parse()
        .map_err(|_| invalid(key, value, format!("must be an integer in [{min}, {max}]")))?;
    if v < min || v > max {
        return Err(invalid(
            key,
            value,
            format!("must be an integer in [{min}, {max}]"),
        ));
    }
    Ok(v)
}

/// `-1` means "no limit"; otherwise a non-negative integer.
fn optional_limit(key: &str, value: &str) -> Result<Option<u64>, LogError> {
    let v = int_in(key, value, -1, i64::MAX)
        .map_err(|_| invalid(key, value, "must be -1 (no limit) or an integer >= 0"))?;
    Ok(if v < 0 { None } else { Some(v as u64) })
}

/// `-2` (Kafka's default) or `-1` mean "as the total retention"; otherwise >= 0.
fn local_limit(key: &str, value: &str) -> Result<Option<u64>, LogError> {
    let v = int_in(key, value, LOCAL_AS_TOTAL, i64::MAX).map_err(|_| {
        invalid(
            key,
            value,
            "must be -2 (as the total retention) or an integer >= 0",
        )
    })?;
    Ok(if v < 0 { None } else { Some(v as u64) })
}

/// Kafka's `Long.MAX_VALUE` (and, here, also `-1`) means "never".
fn optional_never(key: &str, value: &str, min: i64) -> Result<Option<u64>, LogError> {
    let v = int_in(key, value, -1, i64::MAX).map_err(|_| {
        invalid(
            key,
            value,
            format!("must be an integer >= {min}, or -1 / {KAFKA_NEVER} for never"),
        )
    })?;
    if v == -1 || v == KAFKA_NEVER {
        return Ok(None);
    }
    if v < min {
        return Err(invalid(
            key,
            value,
            format!("must be an integer >= {min}, or -1 / {KAFKA_NEVER} for never"),
        ));
    }
    Ok(Some(v as u64))
}

fn parse_policy(key: &str, value: &str) -> Result<CleanupPolicy, LogError> {
    let mut policy = CleanupPolicy {
        delete: false,
        compact: false,
    };
    let trimmed = value.trim().trim_start_matches('[').trim_end_matches(']');
    for part in trimmed.split(',') {
        match part.trim() {
            "delete" => policy.delete = true,
            "compact" => policy.compact = true,
            _ => {
                return Err(invalid(
                    key,
                    value,
                    "must be one of: delete, compact, compact,delete",
                ));
            }
        }
    }
    Ok(policy)
}

impl LogConfig {
    /// Sets one config by its Kafka name (`segment.bytes`, `retention.ms`, ...),
    /// validating the value. Unknown keys and bad values are errors that name them.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), LogError> {
        match key {
            "segment.bytes" => {
                // Positions in the offset index are u32 and Kafka's segment.bytes is an int.
                self.segment_bytes = int_in(key, value, SEGMENT_BYTES_MIN, i32::MAX as i64)? as u64
            }
            "segment.ms" => self.segment_ms = int_in(key, value, 1, i64::MAX)? as u64,
            "index.interval.bytes" => {
                self.index_interval_bytes = int_in(key, value, 0, i32::MAX as i64)? as u32
            }
            "flush.messages" => self.flush_messages = optional_never(key, value, 1)?,
            "flush.ms" => self.flush_ms = optional_never(key, value, 0)?,
            "retention.ms" => self.retention_ms = optional_limit(key, value)?,
            "retention.bytes" => self.retention_bytes = optional_limit(key, value)?,
            "cleanup.policy" => self.cleanup_policy = parse_policy(key, value)?,
            "delete.retention.ms" => {
                self.delete_retention_ms = int_in(key, value, 0, i64::MAX)? as u64
            }
            "min.cleanable.dirty.ratio" => {
                let v: f64 = value
                    .trim()
                    .parse()
                    .map_err(|_| invalid(key, value, "must be a number in [0, 1]"))?;
                if !(0.0..=1.0).contains(&v) {
                    return Err(invalid(key, value, "must be a number in [0, 1]"));
                }
                self.min_cleanable_dirty_ratio = v;
            }
            "max.message.bytes" => {
                self.max_message_bytes = int_in(key, value, 0, i32::MAX as i64)? as u32
            }
            "remote.storage.enable" => {
                self.remote_storage_enable = match value.trim() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(invalid(key, value, "must be true or false")),
                }
            }
            "local.retention.ms" => self.local_retention_ms = local_limit(key, value)?,
            "local.retention.bytes" => self.local_retention_bytes = local_limit(key, value)?,
            _ => {
                return Err(invalid(
                    key,
                    value,
                    format!("unknown config; known keys are {}", KNOWN_KEYS.join(", ")),
                ));
            }
        }
        Ok(())
    }

    /// Builds a config from Kafka-named pairs over the defaults.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<LogConfig, LogError> {
        let mut config = LogConfig::default();
        for (k, v) in pairs {
            config.set(k, v)?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks what single keys cannot: the local retention of a tiered topic must
    /// not exceed its total retention (`retention.ms` / `retention.bytes`).
    pub fn validate(&self) -> Result<(), LogError> {
        let pairs = [
            (
                "local.retention.ms",
                self.local_retention_ms,
                "retention.ms",
                self.retention_ms,
            ),
            (
                "local.retention.bytes",
                self.local_retention_bytes,
                "retention.bytes",
                self.retention_bytes,
            ),
        ];
        for (local_key, local, total_key, total) in pairs {
            if let (Some(l), Some(t)) = (local, total)
                && l > t
            {
                return Err(invalid(
                    local_key,
                    &l.to_string(),
                    format!(
                        "must not exceed {total_key}={t} (the total retention, local and remote); \
                         lower {local_key} or raise {total_key}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `local.retention.ms` in force: the local one, else the total one.
    pub fn local_retention_ms_effective(&self) -> Option<u64> {
        self.local_retention_ms.or(self.retention_ms)
    }

    /// `local.retention.bytes` in force: the local one, else the total one.
    pub fn local_retention_bytes_effective(&self) -> Option<u64> {
        self.local_retention_bytes.or(self.retention_bytes)
    }

    /// Every setting as (Kafka name, value) pairs, in a stable order.
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        let never = |v: Option<u64>| v.map_or(KAFKA_NEVER.to_string(), |v| v.to_string());
        let limit = |v: Option<u64>| v.map_or("-1".to_string(), |v| v.to_string());
        let values = [
            self.segment_bytes.to_string(),
            self.segment_ms.to_string(),
            self.index_interval_bytes.to_string(),
            never(self.flush_messages),
            never(self.flush_ms),
            limit(self.retention_ms),
            limit(self.retention_bytes),
            self.cleanup_policy.to_string(),
            self.delete_retention_ms.to_string(),
            self.min_cleanable_dirty_ratio.to_string(),
            self.max_message_bytes.to_string(),
            self.remote_storage_enable.to_string(),
            self.local_retention_ms
                .map_or(LOCAL_AS_TOTAL.to_string(), |v| v.to_string()),
            self.local_retention_bytes
                .map_or(LOCAL_AS_TOTAL.to_string(), |v| v.to_string()),
        ];
        KNOWN_KEYS
            .iter()
            .zip(values)
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    /// The keys `set` understands.
    pub fn known_keys() -> &'static [&'static str] {
        KNOWN_KEYS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kafkas() {
        let c = LogConfig::default();
        assert_eq!(c.segment_bytes, 1 << 30);
        assert_eq!(c.segment_ms, 604_800_000);
        assert_eq!(c.retention_ms, Some(604_800_000));
        assert_eq!(c.retention_bytes, None);
        assert_eq!(c.delete_retention_ms, 86_400_000);
        assert_eq!(c.max_message_bytes, 1_048_588);
        assert_eq!(c.index_interval_bytes, 4096);
        assert_eq!(c.cleanup_policy, CleanupPolicy::DELETE);
    }

    #[test]
    fn pairs_round_trip() {
        let mut c = LogConfig::default();
        c.set("cleanup.policy", "compact,delete").unwrap();
        c.set("flush.messages", "10").unwrap();
        c.set("retention.bytes", "12345").unwrap();
        c.set("min.cleanable.dirty.ratio", "0.25").unwrap();
        let pairs = c.to_pairs();
        assert_eq!(pairs.len(), LogConfig::known_keys().len());
        let back =
            LogConfig::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))).unwrap();
        assert_eq!(back, c);
        let d = LogConfig::default();
        let back =
            LogConfig::from_pairs(d.to_pairs().iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn parses_each_key() {
        let mut c = LogConfig::default();
        c.set("segment.bytes", "1024").unwrap();
        c.set("segment.ms", "60000").unwrap();
        c.set("index.interval.bytes", "100").unwrap();
        c.set("flush.ms", "-1").unwrap();
        c.set("retention.ms", "-1").unwrap();
        c.set("cleanup.policy", "compact").unwrap();
        c.set("delete.retention.ms", "0").unwrap();
        c.set("max.message.bytes", "2000").unwrap();
        assert_eq!(c.segment_bytes, 1024);
        assert_eq!(c.segment_ms, 60000);
        assert_eq!(c.index_interval_bytes, 100);
        assert_eq!(c.flush_ms, None);
        assert_eq!(c.retention_ms, None);
        assert_eq!(c.cleanup_policy, CleanupPolicy::COMPACT);
        assert_eq!(c.delete_retention_ms, 0);
        assert_eq!(c.max_message_bytes, 2000);
        c.set("cleanup.policy", "delete, compact").unwrap();
        assert_eq!(c.cleanup_policy, CleanupPolicy::COMPACT_DELETE);
        c.set("flush.messages", "9223372036854775807").unwrap();
        assert_eq!(c.flush_messages, None);
    }

    #[test]
    fn errors_name_key_value_and_allowed() {
        let mut c = LogConfig::default();
        let e = c.set("segment.bytes", "-5").unwrap_err().to_string();
        assert!(
            e.contains("segment.bytes") && e.contains("-5") && e.contains("[14,"),
            "{e}"
        );
        let e = c
            .set("min.cleanable.dirty.ratio", "1.5")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("min.cleanable.dirty.ratio=1.5") && e.contains("[0, 1]"),
            "{e}"
        );
        let e = c.set("cleanup.policy", "shred").unwrap_err().to_string();
        assert!(e.contains("shred") && e.contains("compact,delete"), "{e}");
        let e = c.set("no.such.key", "1").unwrap_err().to_string();
        assert!(
            e.contains("no.such.key") && e.contains("segment.bytes"),
            "{e}"
        );
        let e = c.set("retention.ms", "soon").unwrap_err().to_string();
        assert!(e.contains("retention.ms=soon") && e.contains("-1"), "{e}");
        let e = c.set("flush.messages", "0").unwrap_err().to_string();
        assert!(e.contains("flush.messages=0"), "{e}");
        assert_eq!(
            c,
            LogConfig::default(),
            "a failed set leaves the config unchanged"
        );
    }

    #[test]
    fn tier_keys_parse_and_local_must_not_exceed_total() {
        let c = LogConfig::from_pairs([
            ("remote.storage.enable", "true"),
            ("local.retention.ms", "1000"),
            ("local.retention.bytes", "-2"),
            ("retention.bytes", "5000"),
        ])
        .unwrap();
        assert!(c.remote_storage_enable);
        assert_eq!(c.local_retention_ms, Some(1000));
        assert_eq!(c.local_retention_bytes_effective(), Some(5000));
        let e = LogConfig::from_pairs([("retention.ms", "100"), ("local.retention.ms", "200")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("local.retention.ms=200") && e.contains("retention.ms=100"),
            "{e}"
        );
        let e = LogConfig::from_pairs([("remote.storage.enable", "yes")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("true or false"), "{e}");
        let e = LogConfig::from_pairs([("local.retention.bytes", "-3")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("-2"), "{e}");
    }
}
