//! Consumer groups: the group coordinator of this broker.
//!
//! - [`coordinator`]: the `GroupCoordinator` state machine (membership,
//!   sessions, incremental assignment, offset fencing), `step(now, input)`.
//! - [`assignor`]: the `uniform` and `range` assignors (pure functions).
//! - [`records`]: the versioned key/value records of `__consumer_offsets`.
//! - `service`: the async shell — request handlers, the session timer, writing
//!   records to `__consumer_offsets` and loading them back at startup.
//!
//! Placement: the coordinator of a group is the leader of partition
//! [`offsets_partition_for`]`(group, partitions of __consumer_offsets)`. The
//! topic is internal and compacted; the broker creates it on first use with
//! `offsets_topic_num_partitions` partitions (once created, its real partition
//! count is used, never the config).

pub mod assignor;
pub mod coordinator;
#[cfg(test)]
mod coordinator_tests;
pub mod records;
pub(crate) mod service;

pub use coordinator::{
    CoordinatorConfig, GroupCoordinator, Input, Output, Pending, consumer_protocol, input,
};
pub use records::GroupRecord;
pub(crate) use service::GroupService;

/// The internal topic holding committed offsets and group metadata.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// The `__consumer_offsets` partition a group lives on: FNV-1a (32 bit) of the
/// group id's UTF-8 bytes, modulo the partition count. Stable across builds and
/// platforms (it decides where a group's records are, on disk).
pub fn offsets_partition_for(group_id: &str, partitions: u32) -> u32 {
    crate::internal_topics::coordinator_partition(group_id, partitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_placement_is_stable_and_in_range() {
        // Fixed values: changing the hash would strand existing groups' records.
        assert_eq!(offsets_partition_for("", 8), 0x811c_9dc5 % 8);
        assert_eq!(offsets_partition_for("a", 1 << 31), 0xe40c_292c % (1 << 31));
        for g in ["orders", "billing", "x"] {
            assert!(offsets_partition_for(g, 8) < 8);
        }
    }
}
