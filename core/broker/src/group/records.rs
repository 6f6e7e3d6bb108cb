//! The records of `__consumer_offsets`: what a group coordinator makes durable.
//!
//! Format (version 0 of each): a record's key is a big-endian `u16` key version
//! then a postcard body; its value is a big-endian `u16` value version then a
//! postcard body. A record without a value is a tombstone (the thing was deleted;
//! compaction drops it after `delete.retention.ms`).
//!
//! | key version | key body                    | value body                         |
//! |-------------|-----------------------------|------------------------------------|
//! | 0 offset    | (group, topic, partition)   | v0: (offset, metadata, commit ts)  |
//! | 1 group     | (group)                     | v0: (group epoch, assignor)        |
//! | 2 members   | (group)                     | v0: (member ids, longest session[, static members]) |
//! | 3 pending   | (group, transactional id)   | v0: (partitions, expiry wall ms)   |
//!
//! Compaction keeps the newest record per key, so the topic holds the latest
//! committed offset of every (group, partition) and the latest epoch of every
//! group. The members record is written with each group record (after it, in
//! the same batch): who the members were at that group epoch and their
//! longest session timeout, so a coordinator that takes the group over knows
//! whom to wait for (see "Hold after a load" in coordinator.rs); it is
//! applied only to a group a group record made. A pending record names the
//! partitions an open transaction holds offsets for (its TxnOffsetCommit),
//! tombstoned when the transaction commits or aborts; it counts only until
//! its expiry (the transaction's timeout), in case the tombstone never
//! comes. A key version this build does not know is skipped on load (a newer
//! broker wrote it), never an error; a known version that does not decode is.

use bytes::Bytes;
use rill_proto::{Offset, TimestampMs};
use serde::{Deserialize, Serialize};

/// Key version of a committed offset.
pub const OFFSET_KEY_VERSION: u16 = 0;
/// Key version of a group's metadata.
pub const GROUP_KEY_VERSION: u16 = 1;
/// Key version of a group's members.
pub const MEMBERS_KEY_VERSION: u16 = 2;
/// Key version of an open transaction's pending offsets.
pub const PENDING_KEY_VERSION: u16 = 3;
/// Value version written by this build.
pub const VALUE_VERSION: u16 = 0;

/// A committed offset as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetValue {
    pub offset: Offset,
    pub metadata: String,
    pub commit_timestamp_ms: TimestampMs,
}

/// A group's durable metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupValue {
    pub group_epoch: i32,
    pub assignor: String,
}

/// A group's members at a group epoch (consumer-protocol members), as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembersValue {
    pub member_ids: Vec<String>,
    /// The longest session timeout among them.
    pub session_timeout_ms_max: u32,
    /// (instance id, member id) of each static member among them, so that
    /// a static member that restarted (and joins under a new member id)
    /// ends the wait for its old id. Written after the fields above: a
    /// record of an older build, without it, reads as none; an older build
    /// reading this one ignores it (postcard leaves trailing bytes alone).
    pub static_members: Vec<(String, String)>,
}

impl MembersValue {
    /// Decodes a members value, with or without `static_members`.
    fn decode(body: &[u8]) -> Result<MembersValue, postcard::Error> {
        let ((member_ids, session_timeout_ms_max), rest): ((Vec<String>, u32), _) =
            postcard::take_from_bytes(body)?;
        let static_members = if rest.is_empty() {
            Vec::new()
        } else {
            postcard::from_bytes(rest)?
        };
        Ok(MembersValue {
            member_ids,
            session_timeout_ms_max,
            static_members,
        })
    }
}

/// The partitions an open transaction holds offsets for, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingValue {
    pub partitions: Vec<(String, u32)>,
    /// Wall-clock milliseconds after which the record no longer counts.
    pub expires_ms: TimestampMs,
}

/// One record of `__consumer_offsets`, decoded. `None` values are tombstones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupRecord {
    Offset {
        group: String,
        topic: String,
        partition: u32,
        value: Option<OffsetValue>,
    },
    Group {
        group: String,
        value: Option<GroupValue>,
    },
    Members {
        group: String,
        value: Option<MembersValue>,
    },
    Pending {
        group: String,
        transactional_id: String,
        value: Option<PendingValue>,
    },
}

impl GroupRecord {
    /// The group the record belongs to (decides its partition).
    pub fn group(&self) -> &str {
        match self {
            GroupRecord::Offset { group, .. }
            | GroupRecord::Group { group, .. }
            | GroupRecord::Members { group, .. }
            | GroupRecord::Pending { group, .. } => group,
        }
    }

    /// The record's key and value bytes.
    pub fn encode(&self) -> (Bytes, Option<Bytes>) {
        match self {
            GroupRecord::Offset {
                group,
                topic,
                partition,
                value,
            } => (
                versioned(OFFSET_KEY_VERSION, &(group, topic, partition)),
                value.as_ref().map(|v| versioned(VALUE_VERSION, v)),
            ),
            GroupRecord::Group { group, value } => (
                versioned(GROUP_KEY_VERSION, &(group,)),
                value.as_ref().map(|v| versioned(VALUE_VERSION, v)),
            ),
            GroupRecord::Members { group, value } => (
                versioned(MEMBERS_KEY_VERSION, &(group,)),
                value.as_ref().map(|v| versioned(VALUE_VERSION, v)),
            ),
            GroupRecord::Pending {
                group,
                transactional_id,
                value,
            } => (
                versioned(PENDING_KEY_VERSION, &(group, transactional_id)),
                value.as_ref().map(|v| versioned(VALUE_VERSION, v)),
            ),
        }
    }

    /// Decodes a record. `Ok(None)`: a key version this build does not know.
    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<Option<GroupRecord>, String> {
        let (key_version, key_body) = split_version(key, "key")?;
        let value = match value {
            None => None,
            Some(v) => {
                let (version, body) = split_version(v, "value")?;
                if version != VALUE_VERSION {
                    return Err(format!("unknown value version {version}"));
                }
                Some(body)
            }
        };
        let bad = |what: &str, e: postcard::Error| format!("{what} does not decode: {e}");
        Ok(Some(match key_version {
            OFFSET_KEY_VERSION => {
                let (group, topic, partition): (String, String, u32) =
                    postcard::from_bytes(key_body).map_err(|e| bad("offset key", e))?;
                let value = value
                    .map(|v| postcard::from_bytes(v).map_err(|e| bad("offset value", e)))
                    .transpose()?;
                GroupRecord::Offset {
                    group,
                    topic,
                    partition,
                    value,
                }
            }
            GROUP_KEY_VERSION => {
                let (group,): (String,) =
                    postcard::from_bytes(key_body).map_err(|e| bad("group key", e))?;
                let value = value
                    .map(|v| postcard::from_bytes(v).map_err(|e| bad("group value", e)))
                    .transpose()?;
                GroupRecord::Group { group, value }
            }
            MEMBERS_KEY_VERSION => {
                let (group,): (String,) =
                    postcard::from_bytes(key_body).map_err(|e| bad("members key", e))?;
                let value = value
                    .map(|v| MembersValue::decode(v).map_err(|e| bad("members value", e)))
                    .transpose()?;
                GroupRecord::Members { group, value }
            }
            PENDING_KEY_VERSION => {
                let (group, transactional_id): (String, String) =
                    postcard::from_bytes(key_body).map_err(|e| bad("pending key", e))?;
                let value = value
                    .map(|v| postcard::from_bytes(v).map_err(|e| bad("pending value", e)))
                    .transpose()?;
                GroupRecord::Pending {
                    group,
                    transactional_id,
                    value,
                }
            }
            _ => return Ok(None),
        }))
    }
}

pub(crate) fn versioned<T: Serialize>(version: u16, body: &T) -> Bytes {
    let mut out = version.to_be_bytes().to_vec();
    out.extend_from_slice(&postcard::to_allocvec(body).expect("encoding into a Vec cannot fail"));
    Bytes::from(out)
}

pub(crate) fn split_version<'a>(bytes: &'a [u8], what: &str) -> Result<(u16, &'a [u8]), String> {
    if bytes.len() < 2 {
        return Err(format!(
            "{what} of {} bytes is shorter than its version",
            bytes.len()
        ));
    }
    Ok((u16::from_be_bytes([bytes[0], bytes[1]]), &bytes[2..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_unknown_keys_are_skipped() {
        let records = [
            GroupRecord::Offset {
                group: "g".into(),
                topic: "t".into(),
                partition: 3,
                value: Some(OffsetValue {
                    offset: Offset(42),
                    metadata: "m".into(),
                    commit_timestamp_ms: 7,
                }),
            },
            GroupRecord::Offset {
                group: "g".into(),
                topic: "t".into(),
                partition: 3,
                value: None,
            },
            GroupRecord::Group {
                group: "g".into(),
                value: Some(GroupValue {
                    group_epoch: 9,
                    assignor: "uniform".into(),
                }),
            },
            GroupRecord::Members {
                group: "g".into(),
                value: Some(MembersValue {
                    member_ids: vec!["a".into(), "b".into()],
                    session_timeout_ms_max: 45_000,
                    static_members: vec![("host-1".into(), "b".into())],
                }),
            },
            GroupRecord::Members {
                group: "g".into(),
                value: None,
            },
            GroupRecord::Pending {
                group: "g".into(),
                transactional_id: "tx".into(),
                value: Some(PendingValue {
                    partitions: vec![("t".into(), 0), ("u".into(), 5)],
                    expires_ms: 60_000,
                }),
            },
            GroupRecord::Pending {
                group: "g".into(),
                transactional_id: "tx".into(),
                value: None,
            },
        ];
        for r in records {
            let (k, v) = r.encode();
            assert_eq!(GroupRecord::decode(&k, v.as_deref()).unwrap(), Some(r));
        }
        assert_eq!(GroupRecord::decode(&[0, 99, 1], None).unwrap(), None);
        assert!(GroupRecord::decode(&[0], None).is_err());
        assert!(GroupRecord::decode(&[0, 0, 0xff], None).is_err());
    }

    /// A members value of an earlier build (no static members) still reads,
    /// and an earlier build's reading of today's value gets its two fields.
    #[test]
    fn members_values_read_across_builds() {
        let key = versioned(MEMBERS_KEY_VERSION, &("g",));
        let old = versioned(VALUE_VERSION, &(vec!["a".to_string()], 30_000u32));
        assert_eq!(
            GroupRecord::decode(&key, Some(&old)).unwrap(),
            Some(GroupRecord::Members {
                group: "g".into(),
                value: Some(MembersValue {
                    member_ids: vec!["a".into()],
                    session_timeout_ms_max: 30_000,
                    static_members: Vec::new(),
                }),
            })
        );
        let new = MembersValue {
            member_ids: vec!["a".into()],
            session_timeout_ms_max: 30_000,
            static_members: vec![("host-1".into(), "a".into())],
        };
        let bytes = postcard::to_allocvec(&new).unwrap();
        let as_before: (Vec<String>, u32) = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(as_before, (vec!["a".to_string()], 30_000));
        let mut cut = versioned(VALUE_VERSION, &new).to_vec();
        cut.pop();
        assert!(
            GroupRecord::decode(&key, Some(&cut)).is_err(),
            "a cut static member list is an error"
        );
    }
}
