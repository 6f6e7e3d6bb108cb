//! The open-file limit (RLIMIT_NOFILE) and the partitions it allows.
//!
//! A broker keeps a log for each partition it is a replica of (see
//! `cluster/reconcile.rs`), and each log holds one descriptor per segment file
//! (its `.log`; the indexes are opened only to be written, see rill-log's
//! `index.rs`). So the open-file limit caps the partition replicas one broker
//! holds. At start the broker raises its soft limit to the hard limit
//! (logged); the controller refuses a topic that would give any broker more
//! than [`partitions_max`] of its own limit, naming the limit and the broker,
//! instead of letting a broker fail to open logs (and then to accept
//! connections) later.
//!
//! The bound is a floor, not a guarantee: a partition with several segments
//! holds one descriptor per segment.

/// Descriptors kept for everything but partition logs: connections (one UDP
/// socket serves QUIC, but the metadata quorum, tiering and the metrics
/// listener open more), the Raft log, checkpoints being written.
pub const DESCRIPTORS_RESERVED: u64 = 1024;
/// Descriptors a partition log holds at least (its active segment's `.log`).
pub const DESCRIPTORS_PER_PARTITION: u64 = 1;

/// The process's open-file limit after [`raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// The soft limit in force (`None`: unlimited).
    pub soft: Option<u64>,
    /// The soft limit before it was raised, when it was.
    pub raised_from: Option<Option<u64>>,
}

impl OpenFileLimit {
    /// Partitions the cluster may hold under this limit, or `None` when unlimited.
    pub fn partitions_max(&self) -> Option<u64> {
        self.soft.map(partitions_max)
    }
}

/// Partitions a broker with `limit` open files can keep a log for.
pub fn partitions_max(limit: u64) -> u64 {
    limit.saturating_sub(DESCRIPTORS_RESERVED) / DESCRIPTORS_PER_PARTITION
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (a process may always do
/// that) and logs both. A failure is logged and the old limit kept.
pub fn raise() -> OpenFileLimit {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let show = |l: Option<u64>| l.map_or_else(|| "unlimited".to_string(), |l| l.to_string());
    if limit.current == limit.maximum {
        tracing::info!(
            soft = %show(limit.current),
            hard = %show(limit.maximum),
            partitions_max = %show(limit.current.map(partitions_max)),
            "open-file limit (RLIMIT_NOFILE) already at its hard limit"
        );
        return OpenFileLimit {
            soft: limit.current,
            raised_from: None,
        };
    }
    let raised = rustix::process::Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            tracing::info!(
                from = %show(limit.current),
                to = %show(limit.maximum),
                partitions_max = %show(limit.maximum.map(partitions_max)),
                "raised the open-file limit (RLIMIT_NOFILE) to its hard limit: every hosted partition's log holds a file open"
            );
            OpenFileLimit {
                soft: limit.maximum,
                raised_from: Some(limit.current),
            }
        }
        Err(e) => {
            tracing::warn!(
                soft = %show(limit.current),
                hard = %show(limit.maximum),
                error = %e,
                "could not raise the open-file limit (RLIMIT_NOFILE); keeping it"
            );
            OpenFileLimit {
                soft: limit.current,
                raised_from: None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_max_keeps_the_reserve() {
        assert_eq!(partitions_max(20_000), 20_000 - DESCRIPTORS_RESERVED);
        assert_eq!(partitions_max(1024), 0);
        assert_eq!(partitions_max(10), 0);
    }

    #[test]
    fn raise_leaves_soft_at_hard() {
        let after = raise();
        let now = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        assert_eq!(after.soft, now.current);
        assert_eq!(
            now.current, now.maximum,
            "the soft limit is raised to the hard one"
        );
    }
}
