//! The on-disk format of the metadata quorum's Raft log records and snapshot,
//! format version 3: rkyv archives, validated with bytecheck on every read.
//! Versions 1 (before the access-control commands) and 2 (before the brokers'
//! listeners and the SCRAM users) are still read, through the frozen types of
//! [`super::raft_format_v1`] and [`super::raft_format_v2`], and rewritten as
//! version 3.
//!
//! openraft's own types (`Entry`, `LogId`, `Membership`, `SnapshotMeta`) are serde,
//! not rkyv, and may change with openraft; so what goes to disk is our own mirror of
//! what openraft needs ([`LogFrameV1`], [`SnapshotV1`]), converted at the boundary.
//! The rkyv format itself is pinned by the crate features (little-endian, aligned,
//! 32-bit sizes), so a build on another machine reads the same bytes.
//!
//! Layouts (all integers little-endian):
//! - log file `log`: header `"RRLG"` + u16 version + u16 zero (8 bytes), then frames
//!   `[u32 len][u32 crc32c(body)][body = rkyv LogFrameV1]`;
//! - snapshot file `snapshot.rkyv`: header `"RRSN"` + u16 version + u16 zero +
//!   u32 crc32c(body) + u32 body length (16 bytes), then `body = rkyv SnapshotV1`.
//!
//! Version 3 is the layout of the [`LogFrame`] and [`Snapshot`] types below,
//! including [`Command`] and [`MetadataImage`] as they derive it: a change to any
//! of them that changes the archived layout must bump [`FORMAT_VERSION`] (and keep
//! a reader for the old one, as `raft_format_v1` and `raft_format_v2` are).
//! A file with another version is refused with an error naming the file and both
//! versions; a record that fails validation names the file and its byte offset.
//! Never `access_unchecked`: the bytes are always checked before they are used.
//!
//! Before version 1 the same files held JSON (serde of openraft's types): the log
//! had no header and JSON frame bodies, the snapshot was `snapshot.json`. Those are
//! read by [`LogRecord`]'s and [`StoredSnapshot`]'s serde derives and rewritten in
//! version 1 when the store opens.

use super::image::{Command, MetadataImage};
use super::raft::{NodeId, TypeConfig};
use super::raft_format_v1 as v1;
use super::raft_format_v2 as v2;
use openraft::{
    BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership, SnapshotMeta,
    StoredMembership,
};
use rill_proto::LeaderEpoch;
use rkyv::rancor;
use rkyv::util::AlignedVec;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The version of the rkyv layout written by this build.
pub const FORMAT_VERSION: u16 = 3;
/// First bytes of a version-1+ Raft log file. (A JSON-era log starts with a frame
/// length; as a length these bytes would exceed `RAFT_RECORD_BYTES_MAX`.)
pub const LOG_MAGIC: [u8; 4] = *b"RRLG";
/// First bytes of a snapshot file.
pub const SNAPSHOT_MAGIC: [u8; 4] = *b"RRSN";
/// Log file header: magic, u16 version, u16 zero.
pub const LOG_HEADER_LEN: usize = 8;
/// Snapshot file header: magic, u16 version, u16 zero, u32 crc32c, u32 body length.
/// A multiple of rkyv's 16-byte buffer alignment, so the body stays aligned.
pub const SNAPSHOT_HEADER_LEN: usize = 16;

/// A quorum file that cannot be read as written.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(
        "{}: format version {found}, this build reads version {} (and the older JSON \
         files); open it with the Rill release that wrote it",
        .file.display(),
        FORMAT_VERSION
    )]
    Version { file: PathBuf, found: u16 },
    #[error(
        "{}: {what} at byte {offset}; the file is damaged or was not written by \
         Rill; restore it from a backup",
        .file.display()
    )]
    Damaged {
        file: PathBuf,
        offset: usize,
        what: String,
    },
}

impl From<FormatError> for std::io::Error {
    fn from(e: FormatError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

/// rkyv for [`LeaderEpoch`] (a rill-proto newtype that does not derive rkyv).
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(remote = LeaderEpoch)]
pub struct LeaderEpochV1(pub i32);

impl From<LeaderEpochV1> for LeaderEpoch {
    fn from(e: LeaderEpochV1) -> LeaderEpoch {
        LeaderEpoch(e.0)
    }
}

/// A log record in memory and in the JSON-era log (its serde shape is that format).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum LogRecord {
    Purged(LogId<NodeId>),
    Entry(Entry<TypeConfig>),
}

/// openraft's `LogId` (term and node of the leader that wrote it, index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct LogIdV1 {
    pub term: u64,
    pub node_id: u64,
    pub index: u64,
}

impl From<&LogId<NodeId>> for LogIdV1 {
    fn from(l: &LogId<NodeId>) -> LogIdV1 {
        LogIdV1 {
            term: l.leader_id.term,
            node_id: l.leader_id.node_id,
            index: l.index,
        }
    }
}

impl From<&LogIdV1> for LogId<NodeId> {
    fn from(l: &LogIdV1) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(l.term, l.node_id), l.index)
    }
}

/// One member of the quorum (voter or learner) and its address.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct NodeV1 {
    pub id: u64,
    pub addr: String,
}

/// openraft's `Membership`: the voter configs (two during a joint change) and
/// every node; a node in no config is a learner.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct MembershipV1 {
    pub configs: Vec<Vec<u64>>,
    pub nodes: Vec<NodeV1>,
}

impl From<&Membership<NodeId, BasicNode>> for MembershipV1 {
    fn from(m: &Membership<NodeId, BasicNode>) -> MembershipV1 {
        MembershipV1 {
            configs: m
                .get_joint_config()
                .iter()
                .map(|c| c.iter().copied().collect())
                .collect(),
            nodes: m
                .nodes()
                .map(|(id, n)| NodeV1 {
                    id: *id,
                    addr: n.addr.clone(),
                })
                .collect(),
        }
    }
}

impl From<MembershipV1> for Membership<NodeId, BasicNode> {
    fn from(m: MembershipV1) -> Membership<NodeId, BasicNode> {
        let configs: Vec<BTreeSet<NodeId>> = m
            .configs
            .into_iter()
            .map(|c| c.into_iter().collect())
            .collect();
        let nodes: BTreeMap<NodeId, BasicNode> = m
            .nodes
            .into_iter()
            .map(|n| (n.id, BasicNode { addr: n.addr }))
            .collect();
        Membership::new(configs, nodes)
    }
}

/// An entry's payload.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum PayloadV3 {
    Blank,
    Normal(Command),
    Membership(MembershipV1),
}

/// One frame body of the log file (the current version).
pub type LogFrame = LogFrameV3;
/// The snapshot file's body (the current version).
pub type Snapshot = SnapshotV3;

/// One frame body of the log file, version 3.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum LogFrameV3 {
    /// Everything up to and including this log id was purged.
    Purged(LogIdV1),
    Entry {
        log_id: LogIdV1,
        payload: PayloadV3,
    },
}

impl LogFrameV3 {
    pub fn purged(log_id: &LogId<NodeId>) -> LogFrameV3 {
        LogFrameV3::Purged(log_id.into())
    }

    pub fn entry(e: &Entry<TypeConfig>) -> LogFrameV3 {
        LogFrameV3::Entry {
            log_id: (&e.log_id).into(),
            payload: match &e.payload {
                EntryPayload::Blank => PayloadV3::Blank,
                EntryPayload::Normal(c) => PayloadV3::Normal(c.clone()),
                EntryPayload::Membership(m) => PayloadV3::Membership(m.into()),
            },
        }
    }

    pub fn into_record(self) -> LogRecord {
        match self {
            LogFrameV3::Purged(l) => LogRecord::Purged((&l).into()),
            LogFrameV3::Entry { log_id, payload } => LogRecord::Entry(Entry {
                log_id: (&log_id).into(),
                payload: match payload {
                    PayloadV3::Blank => EntryPayload::Blank,
                    PayloadV3::Normal(c) => EntryPayload::Normal(c),
                    PayloadV3::Membership(m) => EntryPayload::Membership(m.into()),
                },
            }),
        }
    }
}

impl From<v2::LogFrameV2> for LogFrameV3 {
    fn from(f: v2::LogFrameV2) -> LogFrameV3 {
        match f {
            v2::LogFrameV2::Purged(l) => LogFrameV3::Purged(l),
            v2::LogFrameV2::Entry { log_id, payload } => LogFrameV3::Entry {
                log_id,
                payload: match payload {
                    v2::PayloadV2::Blank => PayloadV3::Blank,
                    v2::PayloadV2::Normal(c) => PayloadV3::Normal(c.into()),
                    v2::PayloadV2::Membership(m) => PayloadV3::Membership(m),
                },
            },
        }
    }
}

impl From<v2::SnapshotV2> for SnapshotV3 {
    fn from(s: v2::SnapshotV2) -> SnapshotV3 {
        SnapshotV3 {
            meta: s.meta,
            image: s.image.into(),
        }
    }
}

/// The log file's header.
pub fn log_header() -> [u8; LOG_HEADER_LEN] {
    let mut h = [0u8; LOG_HEADER_LEN];
    h[..4].copy_from_slice(&LOG_MAGIC);
    h[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h
}

/// What a log file holds, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFileFormat {
    /// No bytes yet.
    Empty,
    /// JSON frames, no header (before format version 1).
    LegacyJson,
    /// Format version 1 (rkyv, before the access-control commands); frames
    /// start after the header.
    V1,
    /// Format version 2 (rkyv, before the brokers' listeners); frames start
    /// after the header.
    V2,
    /// The current format; frames start after the header.
    Current,
}

/// Reads the log file's header (refusing another version).
pub fn log_file_format(file: &Path, bytes: &[u8]) -> Result<LogFileFormat, FormatError> {
    if bytes.is_empty() {
        return Ok(LogFileFormat::Empty);
    }
    if bytes.len() < 4 || bytes[..4] != LOG_MAGIC {
        return Ok(LogFileFormat::LegacyJson);
    }
    if bytes.len() < LOG_HEADER_LEN {
        return Err(FormatError::Damaged {
            file: file.to_path_buf(),
            offset: 0,
            what: format!("a header cut short ({} bytes)", bytes.len()),
        });
    }
    match u16::from_le_bytes([bytes[4], bytes[5]]) {
        FORMAT_VERSION => Ok(LogFileFormat::Current),
        1 => Ok(LogFileFormat::V1),
        2 => Ok(LogFileFormat::V2),
        found => Err(FormatError::Version {
            file: file.to_path_buf(),
            found,
        }),
    }
}

/// Encodes one frame body.
pub fn encode_log_frame(frame: &LogFrame) -> std::io::Result<AlignedVec> {
    rkyv::to_bytes::<rancor::Error>(frame).map_err(std::io::Error::other)
}

/// Validates and decodes one frame body of a file in `format` (`offset`: where
/// its frame starts in `file`).
pub fn decode_log_frame(
    file: &Path,
    format: LogFileFormat,
    offset: usize,
    body: &[u8],
) -> Result<LogRecord, FormatError> {
    // Frames lie at any byte offset in the file; rkyv needs the body aligned.
    let mut aligned = AlignedVec::<16>::with_capacity(body.len());
    aligned.extend_from_slice(body);
    let frame = match format {
        LogFileFormat::V1 => rkyv::from_bytes::<v1::LogFrameV1, rancor::Error>(&aligned)
            .map(|f| LogFrame::from(v2::LogFrameV2::from(f))),
        LogFileFormat::V2 => {
            rkyv::from_bytes::<v2::LogFrameV2, rancor::Error>(&aligned).map(LogFrame::from)
        }
        _ => rkyv::from_bytes::<LogFrame, rancor::Error>(&aligned),
    };
    frame
        .map(LogFrame::into_record)
        .map_err(|e| FormatError::Damaged {
            file: file.to_path_buf(),
            offset,
            what: format!("a log frame that fails validation ({e})"),
        })
}

/// Decodes one JSON-era frame body.
pub fn decode_legacy_log_frame(body: &[u8]) -> serde_json::Result<LogRecord> {
    serde_json::from_slice(body)
}

/// A snapshot as the state machine keeps it, and as the JSON-era `snapshot.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredSnapshot {
    pub meta: SnapshotMeta<NodeId, BasicNode>,
    pub image: MetadataImage,
}

/// openraft's `SnapshotMeta`.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SnapshotMetaV1 {
    /// Last log id the snapshot includes.
    pub last_log_id: Option<LogIdV1>,
    /// The membership applied last, and the log id it was applied at.
    pub membership_log_id: Option<LogIdV1>,
    pub membership: MembershipV1,
    pub snapshot_id: String,
}

/// The snapshot file's body, version 3.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SnapshotV3 {
    pub meta: SnapshotMetaV1,
    pub image: MetadataImage,
}

impl SnapshotV3 {
    pub fn new(meta: &SnapshotMeta<NodeId, BasicNode>, image: MetadataImage) -> SnapshotV3 {
        SnapshotV3 {
            meta: SnapshotMetaV1 {
                last_log_id: meta.last_log_id.as_ref().map(LogIdV1::from),
                membership_log_id: meta.last_membership.log_id().as_ref().map(LogIdV1::from),
                membership: meta.last_membership.membership().into(),
                snapshot_id: meta.snapshot_id.clone(),
            },
            image,
        }
    }

    pub fn into_stored(self) -> StoredSnapshot {
        let m = self.meta;
        StoredSnapshot {
            meta: SnapshotMeta {
                last_log_id: m.last_log_id.as_ref().map(LogId::from),
                last_membership: StoredMembership::new(
                    m.membership_log_id.as_ref().map(LogId::from),
                    m.membership.into(),
                ),
                snapshot_id: m.snapshot_id,
            },
            image: self.image,
        }
    }
}

/// The whole snapshot file: header and body.
pub fn encode_snapshot(snapshot: &Snapshot) -> std::io::Result<Vec<u8>> {
    let body = rkyv::to_bytes::<rancor::Error>(snapshot).map_err(std::io::Error::other)?;
    let len = u32::try_from(body.len())
        .map_err(|_| std::io::Error::other("metadata snapshot larger than 4 GiB"))?;
    let mut out = Vec::with_capacity(SNAPSHOT_HEADER_LEN + body.len());
    out.extend_from_slice(&SNAPSHOT_MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&rill_proto::crc::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Checks the snapshot file's header and checksum; returns its version and body.
fn snapshot_body<'a>(file: &Path, bytes: &'a [u8]) -> Result<(u16, &'a [u8]), FormatError> {
    let damaged = |offset: usize, what: String| FormatError::Damaged {
        file: file.to_path_buf(),
        offset,
        what,
    };
    if bytes.len() < SNAPSHOT_HEADER_LEN || bytes[..4] != SNAPSHOT_MAGIC {
        return Err(damaged(0, "no snapshot header".into()));
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let found = u16::from_le_bytes([bytes[4], bytes[5]]);
    if found != FORMAT_VERSION && found != 1 && found != 2 {
        return Err(FormatError::Version {
            file: file.to_path_buf(),
            found,
        });
    }
    let (crc, len) = (u32_at(8), u32_at(12) as usize);
    let body = &bytes[SNAPSHOT_HEADER_LEN..];
    if body.len() != len {
        return Err(damaged(
            SNAPSHOT_HEADER_LEN,
            format!("a body of {} bytes where the header says {len}", body.len()),
        ));
    }
    if rill_proto::crc::crc32c(body) != crc {
        return Err(damaged(
            SNAPSHOT_HEADER_LEN,
            "a body whose crc32c does not match".into(),
        ));
    }
    Ok((found, body))
}

fn snapshot_invalid(file: &Path, e: impl std::fmt::Display) -> FormatError {
    FormatError::Damaged {
        file: file.to_path_buf(),
        offset: SNAPSHOT_HEADER_LEN,
        what: format!("a snapshot that fails validation ({e})"),
    }
}

/// Checks the snapshot file's header and checksum and validates its body; the
/// archived snapshot borrows from `bytes` (which must be 16-byte aligned, as an
/// [`AlignedVec`] is: see [`read_aligned`]). The current version only (an older
/// file is read by [`decode_snapshot`]).
pub fn access_snapshot<'a>(
    file: &Path,
    bytes: &'a [u8],
) -> Result<&'a ArchivedSnapshotV3, FormatError> {
    match snapshot_body(file, bytes)? {
        (FORMAT_VERSION, body) => rkyv::access::<ArchivedSnapshotV3, rancor::Error>(body)
            .map_err(|e| snapshot_invalid(file, e)),
        (found, _) => Err(FormatError::Version {
            file: file.to_path_buf(),
            found,
        }),
    }
}

/// Validates and deserializes the owned snapshot (of this version, 1 or 2).
pub fn decode_snapshot(file: &Path, bytes: &[u8]) -> Result<Snapshot, FormatError> {
    let not_deserialized = |e: rancor::Error| FormatError::Damaged {
        file: file.to_path_buf(),
        offset: SNAPSHOT_HEADER_LEN,
        what: format!("a snapshot that does not deserialize ({e})"),
    };
    match snapshot_body(file, bytes)? {
        (1, body) => {
            let old = rkyv::from_bytes::<v1::SnapshotV1, rancor::Error>(body)
                .map_err(|e| snapshot_invalid(file, e))?;
            Ok(v2::SnapshotV2::from(old).into())
        }
        (2, body) => {
            let old = rkyv::from_bytes::<v2::SnapshotV2, rancor::Error>(body)
                .map_err(|e| snapshot_invalid(file, e))?;
            Ok(old.into())
        }
        _ => {
            let archived = access_snapshot(file, bytes)?;
            rkyv::deserialize::<Snapshot, rancor::Error>(archived).map_err(not_deserialized)
        }
    }
}

/// Reads a whole file into a 16-byte aligned buffer (`None` if it does not exist).
pub fn read_aligned(path: &Path) -> std::io::Result<Option<AlignedVec>> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len() as usize;
    let mut bytes = AlignedVec::<16>::with_capacity(len);
    bytes.extend_from_reader(&mut f)?;
    Ok(Some(bytes))
}
