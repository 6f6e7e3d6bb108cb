//! [`GroupConfig`]: how a [`crate::GroupConsumer`] joins and commits, with
//! Kafka-like defaults.

use std::time::Duration;

use crate::config::{ConsumerConfig, OffsetReset};
use crate::error::ClientError;

/// Default session timeout (Kafka's `session.timeout.ms`).
pub const DEFAULT_SESSION_TIMEOUT_MS: u32 = 45_000;
/// Default heartbeat interval (Kafka's `heartbeat.interval.ms`).
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u32 = 3_000;
/// Default auto-commit interval (Kafka's `auto.commit.interval.ms`).
pub const DEFAULT_AUTO_COMMIT_INTERVAL_MS: u32 = 5_000;

/// How a group consumer joins its group and handles offsets.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// The group to join (`group.id`).
    pub group_id: String,
    /// The topics to consume; the coordinator splits their partitions among members.
    pub topics: Vec<String>,
    /// `group.instance.id`: a static member keeps its assignment across a restart
    /// that is quicker than the session timeout.
    pub group_instance_id: Option<String>,
    /// A member that does not heartbeat for this long is removed and its
    /// partitions go to the others.
    pub session_timeout_ms: u32,
    /// How often the member heartbeats (the coordinator may ask for sooner).
    pub heartbeat_interval_ms: u32,
    /// The server-side assignor: `uniform` (balanced, sticky) or `range`.
    pub assignor: String,
    /// Where to start in a partition the group has no committed offset for.
    pub auto_offset_reset: OffsetReset,
    /// Commit the positions every `auto_commit_interval_ms` (during `poll`),
    /// before giving up revoked partitions, and on `close`.
    pub enable_auto_commit: bool,
    pub auto_commit_interval_ms: u32,
    /// How the records are fetched.
    pub consumer: ConsumerConfig,
}

impl GroupConfig {
    /// A config with Kafka's defaults: 45 s session, 3 s heartbeat, `uniform`
    /// assignor, start at the latest offset without a commit, auto-commit every 5 s.
    pub fn new(group_id: impl Into<String>, topics: Vec<String>) -> GroupConfig {
        GroupConfig {
            group_id: group_id.into(),
            topics,
            group_instance_id: None,
            session_timeout_ms: DEFAULT_SESSION_TIMEOUT_MS,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            assignor: "uniform".to_string(),
            auto_offset_reset: OffsetReset::Latest,
            enable_auto_commit: true,
            auto_commit_interval_ms: DEFAULT_AUTO_COMMIT_INTERVAL_MS,
            consumer: ConsumerConfig::default(),
        }
    }

    pub(crate) fn auto_commit_interval(&self) -> Duration {
        Duration::from_millis(self.auto_commit_interval_ms as u64)
    }

    pub(crate) fn validate(&self) -> Result<(), ClientError> {
        let bad = |m: String| Err(ClientError::Config(m));
        if self.group_id.is_empty() {
            return bad("group_id must not be empty".into());
        }
        if self.topics.is_empty() {
            return bad(format!(
                "group {}: no topics to consume: name at least one",
                self.group_id
            ));
        }
        if self.heartbeat_interval_ms == 0 || self.heartbeat_interval_ms >= self.session_timeout_ms
        {
            return bad(format!(
                "group {}: heartbeat_interval_ms {} must be above 0 and below session_timeout_ms {}",
                self.group_id, self.heartbeat_interval_ms, self.session_timeout_ms
            ));
        }
        if self.enable_auto_commit && self.auto_commit_interval_ms == 0 {
            return bad("auto_commit_interval_ms must be above zero".into());
        }
        Ok(())
    }
}
