//! The metadata quorum's Raft plumbing (openraft 0.9): the type config, the
//! crash-safe log store and state machine under `<data>/__meta/raft/`, and the
//! network that carries Raft RPCs as `RaftRpc` frames over our QUIC protocol.
//!
//! On disk (format version 1; the layouts are in [`super::raft_format`]):
//! - `log`: the header `"RRLG"` + u16 version 1 + u16 zero, then appended frames
//!   `[u32 len][u32 crc32c][rkyv LogFrame]`, fsynced before an append is
//!   acknowledged; a torn last frame (short, or a crc32c that does not match: a
//!   crash mid-append) is cut off at recovery; a frame whose checksum matches but
//!   that fails rkyv validation stops the open with an error naming the file and
//!   offset. Truncation and purging rewrite the file crash-safely;
//! - `snapshot.rkyv`: the last snapshot (its meta and the image): the header
//!   `"RRSN"` + u16 version 1 + u16 zero + u32 crc32c + u32 length, then the rkyv
//!   `Snapshot`; replaced whole (temp, fsync, rename, fsync dir), validated and
//!   checksummed when read;
//! - `vote.json`, `committed.json`: small, and kept JSON so a person can read
//!   them; replaced whole.
//!
//! Before format version 1 the log frames were JSON (no header) and the snapshot
//! was `snapshot.json`. Opening such a directory reads them and rewrites them in
//! version 1 (the log in place; the new snapshot first, then the old one removed).
//! A file of an unknown version is refused, never guessed at. The Raft RPCs
//! between brokers (and the snapshot they carry) stay JSON.
//!
//! The state machine is the in-memory [`MetadataImage`], rebuilt at start from the
//! snapshot plus the committed log entries after it (openraft re-applies them);
//! every applied image is published on a `watch` channel for the broker.

use super::image::{Command, MetadataImage, Outcome};
use super::peers::{PeerError, PeerLinks};
use super::raft_format::{self, LogFileFormat, LogFrame, LogRecord, StoredSnapshot};
use crate::metadata::{sync_dir, write_atomic};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftNetwork,
    RaftNetworkFactory, RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership, Vote,
};
use parking_lot::Mutex;
use rill_proto::wire::{RaftRpcKind, RaftRpcRequest};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{Cursor, Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

openraft::declare_raft_types!(
    /// The metadata quorum's types: commands in, outcomes out.
    pub TypeConfig:
        D = Command,
        R = Outcome,
);

pub type NodeId = u64;
pub type MetaRaft = openraft::Raft<TypeConfig>;
type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// Directory under `__meta` with the Raft files.
pub const RAFT_DIR: &str = "raft";
/// The snapshot file (format version 1).
pub const SNAPSHOT_FILE: &str = "snapshot.rkyv";
/// The snapshot file older versions wrote (JSON); read once and replaced.
pub const LEGACY_SNAPSHOT_FILE: &str = "snapshot.json";
/// Largest record in the Raft log file (a corrupt length beyond it ends recovery).
pub const RAFT_RECORD_BYTES_MAX: u32 = 16 * 1024 * 1024;
/// Longest a Raft RPC to a peer may take (beyond openraft's own deadline).
pub const RAFT_RPC_TIMEOUT_MAX: Duration = Duration::from_secs(10);

fn io_write(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write(&e).into()
}
fn io_read(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read(&e).into()
}

#[derive(Debug)]
struct LogInner {
    dir: PathBuf,
    file: File,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
}

/// One log frame: `[u32 len][u32 crc32c][rkyv body]`.
fn frame(record: &LogFrame) -> std::io::Result<Vec<u8>> {
    let body = raft_format::encode_log_frame(record)?;
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&rill_proto::crc::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

impl LogInner {
    fn log_path(&self) -> PathBuf {
        self.dir.join("log")
    }

    /// Rewrites the whole log file (after truncate or purge), crash-safely.
    fn rewrite(&mut self) -> std::io::Result<()> {
        let mut bytes = raft_format::log_header().to_vec();
        if let Some(p) = &self.last_purged {
            bytes.extend(frame(&LogFrame::purged(p))?);
        }
        for e in self.entries.values() {
            bytes.extend(frame(&LogFrame::entry(e))?);
        }
        let path = self.log_path();
        write_atomic(&self.dir, &path, &bytes)?;
        self.file = OpenOptions::new().append(true).open(&path)?;
        Ok(())
    }
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> std::io::Result<Option<T>> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn write_json<T: Serialize>(dir: &Path, name: &str, value: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    write_atomic(dir, &dir.join(name), &bytes)
}

/// The Raft log and vote, on disk. Cheap to clone (the reader shares it).
#[derive(Debug, Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

impl LogStore {
    /// Opens (recovering) the log under `dir`.
    pub fn open(dir: &Path) -> std::io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("log");
        let mut bytes = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let format = raft_format::log_file_format(&path, &bytes)?;
        let mut entries = BTreeMap::new();
        let mut last_purged = None;
        let mut at = match format {
            LogFileFormat::Current | LogFileFormat::V1 | LogFileFormat::V2 => {
                raft_format::LOG_HEADER_LEN
            }
            LogFileFormat::Empty | LogFileFormat::LegacyJson => 0,
        };
        while at + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap());
            let end = at + 8 + len as usize;
            if len > RAFT_RECORD_BYTES_MAX || end > bytes.len() {
                break;
            }
            let body = &bytes[at + 8..end];
            if rill_proto::crc::crc32c(body) != crc {
                break;
            }
            let record = match format {
                // The checksum matched: bytes that fail validation are not a torn
                // write but damage (or a bug), and cutting them would lose entries.
                LogFileFormat::Current | LogFileFormat::V1 | LogFileFormat::V2 => {
                    raft_format::decode_log_frame(&path, format, at, body)?
                }
                LogFileFormat::Empty | LogFileFormat::LegacyJson => {
                    match raft_format::decode_legacy_log_frame(body) {
                        Ok(r) => r,
                        Err(_) => break,
                    }
                }
            };
            match record {
                LogRecord::Purged(p) => last_purged = Some(p),
                LogRecord::Entry(e) => {
                    entries.insert(e.log_id.index, e);
                }
            }
            at = end;
        }
        if matches!(
            format,
            LogFileFormat::LegacyJson | LogFileFormat::V1 | LogFileFormat::V2
        ) {
            tracing::info!(file = %path.display(), entries = entries.len(), from = ?format, "rewriting the Raft log in format version {}", raft_format::FORMAT_VERSION);
        }
        if at < bytes.len() {
            tracing::warn!(file = %path.display(), valid_bytes = at, total = bytes.len(), "cutting a torn tail off the Raft log");
        }
        if let Some(p) = last_purged {
            entries.retain(|i, _| *i > p.index);
        }
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let mut inner = LogInner {
            dir: dir.to_path_buf(),
            file,
            vote: read_json(&dir.join("vote.json"))?,
            committed: read_json(&dir.join("committed.json"))?,
            last_purged,
            entries,
        };
        if at < bytes.len() || format != LogFileFormat::Current {
            inner.rewrite()?;
        }
        Ok(LogStore {
            inner: Arc::new(Mutex::new(inner)),
        })
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let inner = self.inner.lock();
        Ok(inner.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let inner = self.inner.lock();
        let last = inner
            .entries
            .last_key_value()
            .map(|(_, e)| e.log_id)
            .or(inner.last_purged);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        let dir = self.inner.lock().dir.clone();
        while_disk_full("the Raft vote", || write_json(&dir, "vote.json", vote))
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        self.inner.lock().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        Ok(self.inner.lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        let dir = self.inner.lock().dir.clone();
        while_disk_full("the Raft commit index", || {
            write_json(&dir, "committed.json", &committed)
        })
        .await
        .map_err(io_write)?;
        self.inner.lock().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        Ok(self.inner.lock().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut bytes = Vec::new();
        let mut new = Vec::new();
        for e in entries {
            bytes.extend(frame(&LogFrame::entry(&e)).map_err(io_write)?);
            new.push(e);
        }
        let inner = &self.inner;
        let written = while_disk_full("the Raft log", || {
            let inner = inner.lock();
            let before = inner.file.metadata()?.len();
            let mut file = &inner.file;
            let result = file.write_all(&bytes).and_then(|()| file.sync_data());
            if result.is_err() {
                // No torn frame stays behind for the next append to follow.
                let _ = inner.file.set_len(before);
            }
            result
        })
        .await;
        if let Err(e) = written {
            let err = io_write(std::io::Error::new(e.kind(), e.to_string()));
            callback.log_io_completed(Err(e));
            return Err(err);
        }
        let mut inner = self.inner.lock();
        for e in new {
            inner.entries.insert(e.log_id.index, e);
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.inner.lock().entries.retain(|i, _| *i < log_id.index);
        let inner = &self.inner;
        while_disk_full("the Raft log", || inner.lock().rewrite())
            .await
            .map_err(io_write)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        {
            let mut inner = self.inner.lock();
            inner.last_purged = Some(log_id);
            inner.entries.retain(|i, _| *i > log_id.index);
        }
        let inner = &self.inner;
        while_disk_full("the Raft log", || inner.lock().rewrite())
            .await
            .map_err(io_write)
    }
}

/// Runs a write of the metadata store again while the disk is full (ENOSPC,
/// EDQUOT), with a growing pause (at most a second), until it succeeds or fails
/// otherwise: a full disk is transient (a topic deleted, retention, an
/// operator), and a storage error would stop the Raft core for good. Meanwhile
/// this broker's quorum work waits (the others elect around it); it logs an
/// error every [`DISK_FULL_LOG_EVERY`]. The data path keeps a reserve for these
/// writes (`min_free_bytes`, see [`crate::disk`]), so this is for a disk that
/// something else filled.
async fn while_disk_full<T>(
    what: &str,
    mut op: impl FnMut() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let started = std::time::Instant::now();
    let mut logged: Option<std::time::Instant> = None;
    let mut pause = Duration::from_millis(20);
    loop {
        match op() {
            Err(e) if is_disk_full(&e) => {
                if logged.is_none_or(|at| at.elapsed() >= DISK_FULL_LOG_EVERY) {
                    logged = Some(std::time::Instant::now());
                    tracing::error!(
                        write = what,
                        error = %e,
                        waiting_s = started.elapsed().as_secs(),
                        "the metadata store cannot write: the disk is full; retrying until there is space"
                    );
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => {
                if logged.is_some() {
                    tracing::info!(
                        write = what,
                        waited_ms = started.elapsed().as_millis() as u64,
                        "the metadata store writes again"
                    );
                }
                return other;
            }
        }
    }
}

/// How often a metadata write waiting for disk space says so.
const DISK_FULL_LOG_EVERY: Duration = Duration::from_secs(5);

fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// Writes the snapshot file (crash-safely) and returns the snapshot as kept.
fn write_snapshot(
    dir: &Path,
    meta: &SnapshotMeta<NodeId, BasicNode>,
    image: MetadataImage,
) -> std::io::Result<StoredSnapshot> {
    let snapshot = raft_format::Snapshot::new(meta, image);
    let bytes = raft_format::encode_snapshot(&snapshot)?;
    write_atomic(dir, &dir.join(SNAPSHOT_FILE), &bytes)?;
    Ok(StoredSnapshot {
        meta: meta.clone(),
        image: snapshot.image,
    })
}

/// Reads the last snapshot: `snapshot.rkyv`, else a JSON-era `snapshot.json`
/// (rewritten as `snapshot.rkyv`, then removed).
fn read_snapshot(dir: &Path) -> std::io::Result<Option<StoredSnapshot>> {
    let path = dir.join(SNAPSHOT_FILE);
    let legacy = dir.join(LEGACY_SNAPSHOT_FILE);
    if let Some(bytes) = raft_format::read_aligned(&path)? {
        let snapshot = raft_format::decode_snapshot(&path, &bytes)?.into_stored();
        if legacy.exists() {
            // A migration that stopped between writing the new file and removing
            // the old one.
            std::fs::remove_file(&legacy)?;
            sync_dir(dir)?;
        }
        return Ok(Some(snapshot));
    }
    let Some(old) = read_json::<StoredSnapshot>(&legacy)? else {
        return Ok(None);
    };
    tracing::info!(file = %legacy.display(), "rewriting the JSON metadata snapshot as {SNAPSHOT_FILE}, format version {}", raft_format::FORMAT_VERSION);
    let snapshot = write_snapshot(dir, &old.meta, old.image)?;
    std::fs::remove_file(&legacy)?;
    sync_dir(dir)?;
    Ok(Some(snapshot))
}

#[derive(Debug)]
struct SmInner {
    dir: PathBuf,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    image: MetadataImage,
    snapshot: Option<StoredSnapshot>,
    snapshot_seq: u64,
}

/// The state machine: the metadata image, published on every apply.
#[derive(Debug, Clone)]
pub struct StateMachine {
    inner: Arc<Mutex<SmInner>>,
    published: Arc<watch::Sender<Arc<MetadataImage>>>,
    /// Held while the snapshot file is written (a build and an install must
    /// not interleave; a write may wait for disk space without `inner`).
    snapshot_file: Arc<tokio::sync::Mutex<()>>,
}

impl StateMachine {
    /// Opens the state machine under `dir` (from the last snapshot, if any).
    pub fn open(
        dir: &Path,
    ) -> std::io::Result<(StateMachine, watch::Receiver<Arc<MetadataImage>>)> {
        std::fs::create_dir_all(dir)?;
        let snapshot = read_snapshot(dir)?;
        let (image, last_applied, membership) = match &snapshot {
            Some(s) => (
                s.image.clone(),
                s.meta.last_log_id,
                s.meta.last_membership.clone(),
            ),
            None => (MetadataImage::default(), None, StoredMembership::default()),
        };
        let (tx, rx) = watch::channel(Arc::new(image.clone()));
        Ok((
            StateMachine {
                inner: Arc::new(Mutex::new(SmInner {
                    dir: dir.to_path_buf(),
                    last_applied,
                    membership,
                    image,
                    snapshot,
                    snapshot_seq: 0,
                })),
                published: Arc::new(tx),
                snapshot_file: Arc::default(),
            },
            rx,
        ))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let _file = self.snapshot_file.clone().lock_owned().await;
        let (dir, image, meta) = {
            let mut inner = self.inner.lock();
            inner.snapshot_seq += 1;
            let snapshot_id = match inner.last_applied {
                Some(l) => format!("{}-{}", l.index, inner.snapshot_seq),
                None => format!("none-{}", inner.snapshot_seq),
            };
            let meta = SnapshotMeta {
                last_log_id: inner.last_applied,
                last_membership: inner.membership.clone(),
                snapshot_id,
            };
            (inner.dir.clone(), inner.image.clone(), meta)
        };
        let newer_exists = self
            .inner
            .lock()
            .snapshot
            .as_ref()
            .is_some_and(|s| s.meta.last_log_id > meta.last_log_id);
        let stored = if newer_exists {
            // An installed snapshot is ahead of what was applied here: keep
            // its file, and answer with this one.
            StoredSnapshot {
                meta: meta.clone(),
                image,
            }
        } else {
            while_disk_full("a Raft snapshot", || {
                write_snapshot(&dir, &meta, image.clone())
            })
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?
        };
        let data = serde_json::to_vec(&stored.image).map_err(io_write)?;
        let meta = stored.meta.clone();
        let mut inner = self.inner.lock();
        // A snapshot installed meanwhile (from the leader) may be newer.
        if inner
            .snapshot
            .as_ref()
            .is_none_or(|s| s.meta.last_log_id <= meta.last_log_id)
        {
            inner.snapshot = Some(stored);
        }
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>)> {
        let inner = self.inner.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Outcome>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.inner.lock();
        let mut out = Vec::new();
        for e in entries {
            inner.last_applied = Some(e.log_id);
            match e.payload {
                EntryPayload::Blank => out.push(Outcome::Done),
                EntryPayload::Normal(cmd) => {
                    let outcome = inner.image.apply(&cmd);
                    tracing::debug!(command = ?cmd, ?outcome, "metadata command applied");
                    out.push(outcome);
                }
                EntryPayload::Membership(m) => {
                    inner.membership = StoredMembership::new(Some(e.log_id), m);
                    out.push(Outcome::Done);
                }
            }
        }
        self.published.send_replace(Arc::new(inner.image.clone()));
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let image: MetadataImage = serde_json::from_slice(snapshot.get_ref())
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        let _file = self.snapshot_file.clone().lock_owned().await;
        let dir = self.inner.lock().dir.clone();
        let stored = while_disk_full("a Raft snapshot", || {
            write_snapshot(&dir, meta, image.clone())
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        let mut inner = self.inner.lock();
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        inner.image = image;
        inner.snapshot = Some(stored);
        self.published.send_replace(Arc::new(inner.image.clone()));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let inner = self.inner.lock();
        let Some(s) = &inner.snapshot else {
            return Ok(None);
        };
        let data = serde_json::to_vec(&s.image).map_err(io_read)?;
        Ok(Some(Snapshot {
            meta: s.meta.clone(),
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

// ---------------------------------------------------------------- network

/// Makes a [`QuorumPeer`] per Raft target.
#[derive(Debug, Clone)]
pub struct QuorumNetwork {
    pub self_id: i32,
    pub links: Arc<PeerLinks>,
}

/// The Raft RPC client for one peer.
#[derive(Debug)]
pub struct QuorumPeer {
    self_id: i32,
    target: NodeId,
    addr: String,
    links: Arc<PeerLinks>,
}

impl RaftNetworkFactory<TypeConfig> for QuorumNetwork {
    type Network = QuorumPeer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> QuorumPeer {
        QuorumPeer {
            self_id: self.self_id,
            target,
            addr: node.addr.clone(),
            links: self.links.clone(),
        }
    }
}

impl QuorumPeer {
    async fn rpc<Req: Serialize, Resp: for<'de> Deserialize<'de>, E>(
        &self,
        kind: RaftRpcKind,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        E: std::error::Error + for<'de> Deserialize<'de>,
    {
        let body = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let request = RaftRpcRequest {
            from: self.self_id,
            to: self.target as i32,
            kind,
            body,
        };
        let timeout = option.hard_ttl().min(RAFT_RPC_TIMEOUT_MAX);
        let (resp, _) = self
            .links
            .call(&self.addr, &request, timeout)
            .await
            .map_err(|e| match e {
                e @ PeerError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&e)),
                e @ PeerError::Remote { .. } => RPCError::Network(NetworkError::new(&e)),
            })?;
        let decoded: Result<Resp, RaftError<NodeId, E>> = serde_json::from_slice(&resp.body)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        decoded.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for QuorumPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.rpc(RaftRpcKind::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.rpc(RaftRpcKind::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.rpc(RaftRpcKind::Vote, &rpc, &option).await
    }
}

/// Serves one Raft RPC from a peer: decodes it, hands it to the local Raft node,
/// encodes its answer (or its Raft error) as JSON.
pub async fn serve_rpc(raft: &MetaRaft, req: &RaftRpcRequest) -> Result<Vec<u8>, String> {
    fn enc<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
        serde_json::to_vec(v).map_err(|e| e.to_string())
    }
    fn dec<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T, String> {
        serde_json::from_slice(b).map_err(|e| format!("undecodable Raft RPC: {e}"))
    }
    match req.kind {
        RaftRpcKind::Vote => enc(&raft.vote(dec(&req.body)?).await),
        RaftRpcKind::AppendEntries => enc(&raft.append_entries(dec(&req.body)?).await),
        RaftRpcKind::InstallSnapshot => enc(&raft.install_snapshot(dec(&req.body)?).await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 0), index),
            payload: EntryPayload::Normal(Command::SetClusterId {
                cluster_id: format!("c{index}"),
            }),
        }
    }

    fn append_now(store: &LogStore, entries: Vec<Entry<TypeConfig>>) {
        let mut inner = store.inner.lock();
        for e in entries {
            let b = frame(&LogFrame::entry(&e)).unwrap();
            inner.file.write_all(&b).unwrap();
            inner.entries.insert(e.log_id.index, e);
        }
        inner.file.sync_data().unwrap();
    }

    #[tokio::test]
    async fn a_full_disk_is_waited_out_and_other_errors_are_not() {
        let mut calls = 0;
        let got = while_disk_full("test", || {
            calls += 1;
            if calls < 4 {
                Err(std::io::Error::from(std::io::ErrorKind::StorageFull))
            } else {
                Ok(calls)
            }
        })
        .await;
        assert_eq!(got.unwrap(), 4, "retried while the disk was full");
        let mut calls = 0;
        let got: std::io::Result<()> = while_disk_full("test", || {
            calls += 1;
            Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
        })
        .await;
        assert_eq!(
            got.unwrap_err().kind(),
            std::io::ErrorKind::PermissionDenied
        );
        assert_eq!(calls, 1, "any other error is returned at once");
    }

    #[test]
    fn log_survives_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(dir.path()).unwrap();
        append_now(&store, (1..=5).map(|i| entry(1, i)).collect());
        drop(store);
        // A crash in the middle of the next append leaves half a frame.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("log"))
            .unwrap();
        let torn = frame(&LogFrame::entry(&entry(1, 6))).unwrap();
        f.write_all(&torn[..torn.len() / 2]).unwrap();
        drop(f);
        let store = LogStore::open(dir.path()).unwrap();
        let keys: Vec<u64> = store.inner.lock().entries.keys().copied().collect();
        assert_eq!(keys, vec![1, 2, 3, 4, 5]);
        // Purge then truncate survive a reopen too.
        {
            let mut inner = store.inner.lock();
            inner.last_purged = Some(entry(1, 2).log_id);
            inner.entries.retain(|i, _| *i > 2 && *i < 5);
            inner.rewrite().unwrap();
        }
        drop(store);
        let store = LogStore::open(dir.path()).unwrap();
        let inner = store.inner.lock();
        assert_eq!(
            inner.entries.keys().copied().collect::<Vec<_>>(),
            vec![3, 4]
        );
        assert_eq!(inner.last_purged.map(|l| l.index), Some(2));
    }

    /// A frame as versions before format 1 wrote it: `[len][crc32c][json]`.
    fn legacy_frame(record: &LogRecord) -> Vec<u8> {
        let body = serde_json::to_vec(record).unwrap();
        let mut out = (body.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&rill_proto::crc::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn membership_entry(index: u64) -> Entry<TypeConfig> {
        let nodes: BTreeMap<NodeId, BasicNode> = (1..=4)
            .map(|id| (id, BasicNode::new(format!("127.0.0.1:{}", 9000 + id))))
            .collect();
        // A joint config, and node 4 a learner.
        let configs = vec![
            [1, 2].into_iter().collect(),
            [1, 2, 3].into_iter().collect(),
        ];
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(2, 1), index),
            payload: EntryPayload::Membership(openraft::Membership::new(configs, nodes)),
        }
    }

    /// Entries of every payload kind (and a command with every field type).
    fn varied_entries() -> Vec<Entry<TypeConfig>> {
        let blank = Entry {
            log_id: LogId::new(CommittedLeaderId::new(2, 1), 3),
            payload: EntryPayload::Blank,
        };
        let create = Entry {
            log_id: LogId::new(CommittedLeaderId::new(2, 1), 5),
            payload: EntryPayload::Normal(Command::CreateTopic {
                name: "orders".into(),
                id: "00ff".into(),
                internal: false,
                configs: [("retention.ms".to_string(), "1000".to_string())].into(),
                assignment: vec![vec![1, 2, 3], vec![2, 3, 1]],
            }),
        };
        let alter = Entry {
            log_id: LogId::new(CommittedLeaderId::new(3, 2), 6),
            payload: EntryPayload::Normal(Command::AlterIsr {
                broker_id: 2,
                topic: "orders".into(),
                partition: 1,
                leader_epoch: rill_proto::LeaderEpoch(7),
                new_isr: vec![2, 3],
            }),
        };
        let elect = Entry {
            log_id: LogId::new(CommittedLeaderId::new(3, 2), 7),
            payload: EntryPayload::Normal(Command::ElectPreferred {
                topics: Some(vec!["orders".into()]),
            }),
        };
        vec![
            entry(1, 2),
            blank,
            membership_entry(4),
            create,
            alter,
            elect,
        ]
    }

    /// Entries compared by their serde form (openraft's `Entry` has no `PartialEq`).
    fn json_of(entries: &BTreeMap<u64, Entry<TypeConfig>>) -> Vec<String> {
        entries
            .values()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect()
    }

    #[test]
    fn every_payload_kind_survives_an_rkyv_frame() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(dir.path()).unwrap();
        append_now(&store, varied_entries());
        let before = json_of(&store.inner.lock().entries);
        drop(store);
        let store = LogStore::open(dir.path()).unwrap();
        assert_eq!(json_of(&store.inner.lock().entries), before);
        assert_eq!(before.len(), 6);
        let on_disk = std::fs::read(dir.path().join("log")).unwrap();
        assert_eq!(on_disk[..8], raft_format::log_header());
    }

    #[test]
    fn a_json_written_log_store_opens_and_is_rewritten_in_rkyv() {
        let dir = tempfile::tempdir().unwrap();
        // As the JSON-era store left it: a purge record, entries of every kind, the
        // vote and the committed id.
        let purged = LogId::new(CommittedLeaderId::new(1, 0), 1);
        let mut bytes = legacy_frame(&LogRecord::Purged(purged));
        for e in varied_entries() {
            bytes.extend(legacy_frame(&LogRecord::Entry(e)));
        }
        // One frame spelled out as the JSON-era code wrote it, so the serde shape
        // read here cannot drift with openraft unnoticed.
        let literal = br#"{"Entry":{"log_id":{"leader_id":{"term":3,"node_id":2},"index":8},"payload":{"Normal":{"SetTopicConfigs":{"name":"orders","configs":{"cleanup.policy":"compact"}}}}}}"#;
        bytes.extend((literal.len() as u32).to_le_bytes());
        bytes.extend(rill_proto::crc::crc32c(literal).to_le_bytes());
        bytes.extend_from_slice(literal);
        std::fs::write(dir.path().join("log"), &bytes).unwrap();
        std::fs::write(
            dir.path().join("vote.json"),
            serde_json::to_vec(&Vote::new(3, 2)).unwrap(),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("committed.json"),
            serde_json::to_vec(&Some(LogId::new(CommittedLeaderId::new(3, 2), 7))).unwrap(),
        )
        .unwrap();

        let store = LogStore::open(dir.path()).unwrap();
        let mut expected: BTreeMap<u64, Entry<TypeConfig>> = varied_entries()
            .into_iter()
            .map(|e| (e.log_id.index, e))
            .collect();
        expected.insert(
            8,
            Entry {
                log_id: LogId::new(CommittedLeaderId::new(3, 2), 8),
                payload: EntryPayload::Normal(Command::SetTopicConfigs {
                    name: "orders".into(),
                    configs: [("cleanup.policy".to_string(), "compact".to_string())].into(),
                }),
            },
        );
        {
            let inner = store.inner.lock();
            assert_eq!(json_of(&inner.entries), json_of(&expected));
            assert_eq!(inner.last_purged, Some(purged));
            assert_eq!(inner.vote, Some(Vote::new(3, 2)));
            assert_eq!(inner.committed.map(|l| l.index), Some(7));
        }
        // Rewritten in format version 1 at open, and read back from it.
        let on_disk = std::fs::read(dir.path().join("log")).unwrap();
        assert_eq!(on_disk[..8], raft_format::log_header());
        drop(store);
        let store = LogStore::open(dir.path()).unwrap();
        let inner = store.inner.lock();
        assert_eq!(json_of(&inner.entries), json_of(&expected));
        assert_eq!(inner.last_purged, Some(purged));
    }

    #[test]
    fn a_frame_that_fails_validation_is_an_error_naming_file_and_offset() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(dir.path()).unwrap();
        append_now(&store, vec![entry(1, 1)]);
        drop(store);
        let path = dir.path().join("log");
        let good_len = std::fs::read(&path).unwrap().len();
        // A frame whose checksum matches but whose body is no LogFrame: an enum
        // tag out of range.
        let body = [0xffu8; 16];
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&(body.len() as u32).to_le_bytes()).unwrap();
        f.write_all(&rill_proto::crc::crc32c(&body).to_le_bytes())
            .unwrap();
        f.write_all(&body).unwrap();
        drop(f);
        let err = LogStore::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains(&format!("at byte {good_len}")), "{err}");
        assert!(err.contains("fails validation"), "{err}");
        // Nothing was cut: the file is as it was.
        assert_eq!(std::fs::read(&path).unwrap().len(), good_len + 8 + 16);
    }

    #[test]
    fn a_log_of_another_format_version_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut header = raft_format::log_header();
        let newer = raft_format::FORMAT_VERSION + 1;
        header[4..6].copy_from_slice(&newer.to_le_bytes());
        std::fs::write(dir.path().join("log"), header).unwrap();
        let err = LogStore::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&format!("format version {newer}")), "{err}");
        assert!(
            err.contains(&format!("reads version {}", raft_format::FORMAT_VERSION)),
            "{err}"
        );
    }

    #[test]
    fn a_version_1_log_and_snapshot_open_and_are_rewritten_in_the_current_version() {
        use super::super::raft_format_v1 as v1;
        let dir = tempfile::tempdir().unwrap();
        // A version-1 log: header, a purge and two entries in the old layout.
        let v1_frame = |f: &v1::LogFrameV1| {
            let body = rkyv::to_bytes::<rkyv::rancor::Error>(f).unwrap();
            let mut out = (body.len() as u32).to_le_bytes().to_vec();
            out.extend_from_slice(&rill_proto::crc::crc32c(&body).to_le_bytes());
            out.extend_from_slice(&body);
            out
        };
        let id = |index| raft_format::LogIdV1 {
            term: 1,
            node_id: 0,
            index,
        };
        let mut bytes = raft_format::log_header().to_vec();
        bytes[4..6].copy_from_slice(&1u16.to_le_bytes());
        bytes.extend(v1_frame(&v1::LogFrameV1::Purged(id(1))));
        bytes.extend(v1_frame(&v1::LogFrameV1::Entry {
            log_id: id(2),
            payload: v1::PayloadV1::Normal(v1::CommandV1::SetClusterId {
                cluster_id: "c2".into(),
            }),
        }));
        bytes.extend(v1_frame(&v1::LogFrameV1::Entry {
            log_id: id(3),
            payload: v1::PayloadV1::Normal(v1::CommandV1::FenceBroker { id: 4 }),
        }));
        std::fs::write(dir.path().join("log"), &bytes).unwrap();
        let expected = vec![
            Entry::<TypeConfig> {
                log_id: LogId::new(CommittedLeaderId::new(1, 0), 2),
                payload: EntryPayload::Normal(Command::SetClusterId {
                    cluster_id: "c2".into(),
                }),
            },
            Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 0), 3),
                payload: EntryPayload::Normal(Command::FenceBroker { id: 4 }),
            },
        ];
        let expected: Vec<String> = expected
            .iter()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect();
        for _ in 0..2 {
            let store = LogStore::open(dir.path()).unwrap();
            assert_eq!(json_of(&store.inner.lock().entries), expected);
            assert_eq!(store.inner.lock().last_purged.unwrap().index, 1);
            let on_disk = std::fs::read(dir.path().join("log")).unwrap();
            assert_eq!(
                on_disk[..8],
                raft_format::log_header(),
                "rewritten in the current version"
            );
        }

        // A version-1 snapshot: read, the image carried over with no ACLs.
        let image = image_with_topics(3);
        let meta = snapshot_meta();
        let old = v1::SnapshotV1 {
            meta: raft_format::Snapshot::new(&meta, MetadataImage::default()).meta,
            image: v1::MetadataImageV1 {
                cluster_id: image.cluster_id.clone(),
                brokers: brokers_v2(&image),
                topics: image.topics.clone(),
                next_producer_id: image.next_producer_id,
            },
        };
        let body = rkyv::to_bytes::<rkyv::rancor::Error>(&old).unwrap();
        let mut file = raft_format::SNAPSHOT_MAGIC.to_vec();
        file.extend_from_slice(&1u16.to_le_bytes());
        file.extend_from_slice(&0u16.to_le_bytes());
        file.extend_from_slice(&rill_proto::crc::crc32c(&body).to_le_bytes());
        file.extend_from_slice(&(body.len() as u32).to_le_bytes());
        file.extend_from_slice(&body);
        std::fs::write(dir.path().join(SNAPSHOT_FILE), &file).unwrap();
        let (sm, _) = StateMachine::open(dir.path()).unwrap();
        let inner = sm.inner.lock();
        assert_eq!(inner.image, image);
        assert_eq!(inner.last_applied, meta.last_log_id);
    }

    /// The image's brokers as versions 1 and 2 archived them.
    fn brokers_v2(
        image: &MetadataImage,
    ) -> BTreeMap<i32, super::super::raft_format_v2::BrokerRecordV2> {
        image
            .brokers
            .values()
            .map(|b| {
                assert!(b.listeners.is_empty(), "versions 1 and 2 have no listeners");
                let old = super::super::raft_format_v2::BrokerRecordV2 {
                    id: b.id,
                    addr: b.addr.clone(),
                    fenced: b.fenced,
                };
                (b.id, old)
            })
            .collect()
    }

    /// A header of `version` followed by `frames`, each framed as the log is.
    fn old_log(version: u16, frames: &[rkyv::util::AlignedVec]) -> Vec<u8> {
        let mut bytes = raft_format::log_header().to_vec();
        bytes[4..6].copy_from_slice(&version.to_le_bytes());
        for body in frames {
            bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&rill_proto::crc::crc32c(body).to_le_bytes());
            bytes.extend_from_slice(body);
        }
        bytes
    }

    /// A snapshot file of `version` around `body`.
    fn old_snapshot(version: u16, body: &[u8]) -> Vec<u8> {
        let mut file = raft_format::SNAPSHOT_MAGIC.to_vec();
        file.extend_from_slice(&version.to_le_bytes());
        file.extend_from_slice(&0u16.to_le_bytes());
        file.extend_from_slice(&rill_proto::crc::crc32c(body).to_le_bytes());
        file.extend_from_slice(&(body.len() as u32).to_le_bytes());
        file.extend_from_slice(body);
        file
    }

    #[test]
    fn a_version_2_log_and_snapshot_open_with_no_listeners_and_are_rewritten() {
        use super::super::raft_format_v2 as v2;
        let dir = tempfile::tempdir().unwrap();
        let id = |index| raft_format::LogIdV1 {
            term: 2,
            node_id: 1,
            index,
        };
        let frame = |f: &v2::LogFrameV2| rkyv::to_bytes::<rkyv::rancor::Error>(f).unwrap();
        let rule = rill_proto::wire::AclRule {
            principal: "alice".into(),
            operation: rill_proto::wire::AclOperation::Read,
            resource: rill_proto::wire::AclResource::Topic("t".into()),
        };
        let bytes = old_log(
            2,
            &[
                frame(&v2::LogFrameV2::Entry {
                    log_id: id(5),
                    payload: v2::PayloadV2::Normal(v2::CommandV2::RegisterBroker {
                        id: 7,
                        addr: "127.0.0.1:9007".into(),
                    }),
                }),
                frame(&v2::LogFrameV2::Entry {
                    log_id: id(6),
                    payload: v2::PayloadV2::Normal(v2::CommandV2::CreateAcls {
                        rules: vec![rule.clone()],
                    }),
                }),
            ],
        );
        std::fs::write(dir.path().join("log"), &bytes).unwrap();
        let expected: Vec<String> = [
            Command::RegisterBroker {
                id: 7,
                addr: "127.0.0.1:9007".into(),
                listeners: BTreeMap::new(),
            },
            Command::CreateAcls { rules: vec![rule] },
        ]
        .into_iter()
        .zip(5..)
        .map(|(c, i)| Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(2, 1), i),
            payload: EntryPayload::Normal(c),
        })
        .map(|e| serde_json::to_string(&e).unwrap())
        .collect();
        for _ in 0..2 {
            let store = LogStore::open(dir.path()).unwrap();
            assert_eq!(json_of(&store.inner.lock().entries), expected);
            let on_disk = std::fs::read(dir.path().join("log")).unwrap();
            assert_eq!(on_disk[..8], raft_format::log_header(), "rewritten");
        }

        let mut image = image_with_topics(2);
        image.apply(&Command::SetQuota {
            principal: "bob".into(),
            quota: rill_proto::wire::Quota {
                produce_bytes_per_s: Some(1000),
                fetch_bytes_per_s: None,
            },
        });
        let meta = snapshot_meta();
        let old = v2::SnapshotV2 {
            meta: raft_format::Snapshot::new(&meta, MetadataImage::default()).meta,
            image: v2::MetadataImageV2 {
                cluster_id: image.cluster_id.clone(),
                brokers: brokers_v2(&image),
                topics: image.topics.clone(),
                next_producer_id: image.next_producer_id,
                acls: image.acls.clone(),
                quotas: image.quotas.clone(),
            },
        };
        let body = rkyv::to_bytes::<rkyv::rancor::Error>(&old).unwrap();
        std::fs::write(dir.path().join(SNAPSHOT_FILE), old_snapshot(2, &body)).unwrap();
        let (sm, _) = StateMachine::open(dir.path()).unwrap();
        let inner = sm.inner.lock();
        assert_eq!(inner.image, image);
        assert_eq!(inner.last_applied, meta.last_log_id);
    }

    fn image_with_topics(n: usize) -> MetadataImage {
        let mut image = MetadataImage::default();
        image.apply(&Command::SetClusterId {
            cluster_id: "c1".into(),
        });
        for id in 1..=3 {
            image.apply(&Command::RegisterBroker {
                id,
                addr: format!("127.0.0.1:{}", 9000 + id),
                listeners: Default::default(),
            });
        }
        for t in 0..n {
            image.apply(&Command::CreateTopic {
                name: format!("t{t}"),
                id: format!("{t:032x}"),
                internal: t == 0,
                configs: [("min.insync.replicas".to_string(), "2".to_string())].into(),
                assignment: vec![vec![1, 2, 3], vec![2, 3, 1], vec![3, 1, 2]],
            });
        }
        image.apply(&Command::FenceBroker { id: 3 });
        image.apply(&Command::AllocateProducerId);
        image
    }

    fn snapshot_meta() -> SnapshotMeta<NodeId, BasicNode> {
        let m = membership_entry(4);
        let EntryPayload::Membership(membership) = m.payload else {
            unreachable!()
        };
        SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(3, 2), 40)),
            last_membership: StoredMembership::new(Some(m.log_id), membership),
            snapshot_id: "40-1".into(),
        }
    }

    #[test]
    fn a_json_snapshot_opens_and_is_replaced_by_an_rkyv_one() {
        let dir = tempfile::tempdir().unwrap();
        let old = StoredSnapshot {
            meta: snapshot_meta(),
            image: image_with_topics(5),
        };
        std::fs::write(
            dir.path().join(LEGACY_SNAPSHOT_FILE),
            serde_json::to_vec(&old).unwrap(),
        )
        .unwrap();
        for _ in 0..2 {
            let (sm, rx) = StateMachine::open(dir.path()).unwrap();
            let inner = sm.inner.lock();
            assert_eq!(inner.image, old.image);
            assert_eq!(**rx.borrow(), old.image);
            assert_eq!(inner.last_applied, old.meta.last_log_id);
            assert_eq!(inner.membership, old.meta.last_membership);
            let kept = inner.snapshot.as_ref().unwrap();
            assert_eq!(kept.meta, old.meta);
            assert!(!dir.path().join(LEGACY_SNAPSHOT_FILE).exists());
            let bytes = std::fs::read(dir.path().join(SNAPSHOT_FILE)).unwrap();
            assert_eq!(bytes[..4], raft_format::SNAPSHOT_MAGIC);
        }
    }

    #[test]
    fn a_damaged_snapshot_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        write_snapshot(dir.path(), &snapshot_meta(), image_with_topics(3)).unwrap();
        let path = dir.path().join(SNAPSHOT_FILE);
        let good = std::fs::read(&path).unwrap();
        let open_err = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            StateMachine::open(dir.path()).unwrap_err().to_string()
        };
        // A flipped bit in the body: the checksum.
        let mut flipped = good.clone();
        let at = flipped.len() - 40;
        flipped[at] ^= 1;
        let err = open_err(&flipped);
        assert!(err.contains("crc32c does not match"), "{err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
        // A checksum that matches bytes that are no snapshot: validation.
        let mut garbage = good[..raft_format::SNAPSHOT_HEADER_LEN].to_vec();
        let body = vec![0xffu8; good.len() - raft_format::SNAPSHOT_HEADER_LEN];
        garbage[8..12].copy_from_slice(&rill_proto::crc::crc32c(&body).to_le_bytes());
        garbage.extend_from_slice(&body);
        let err = open_err(&garbage);
        assert!(err.contains("fails validation"), "{err}");
        assert!(err.contains("at byte 16"), "{err}");
        // Cut short, and another version.
        let err = open_err(&good[..good.len() - 1]);
        assert!(err.contains("where the header says"), "{err}");
        let mut newer = good.clone();
        newer[4..6].copy_from_slice(&9u16.to_le_bytes());
        let err = open_err(&newer);
        assert!(err.contains("format version 9"), "{err}");
        // And the good one still opens.
        std::fs::write(&path, &good).unwrap();
        let (sm, _) = StateMachine::open(dir.path()).unwrap();
        assert_eq!(sm.inner.lock().image, image_with_topics(3));
    }

    #[tokio::test]
    async fn a_built_snapshot_reopens_and_a_json_one_from_a_leader_installs() {
        let dir = tempfile::tempdir().unwrap();
        let (mut sm, _rx) = StateMachine::open(dir.path()).unwrap();
        let register = (1..=3).map(|id| Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 0), id as u64 - 1),
            payload: EntryPayload::Normal(Command::RegisterBroker {
                id,
                addr: format!("127.0.0.1:{}", 9000 + id),
                listeners: [("kafka".to_string(), format!("127.0.0.1:{}", 9100 + id))].into(),
            }),
        });
        let mut entries: Vec<Entry<TypeConfig>> = register.collect();
        entries.extend(varied_entries().into_iter().skip(1));
        sm.apply(entries).await.unwrap();
        let built = sm.build_snapshot().await.unwrap();
        let image = sm.inner.lock().image.clone();
        assert_eq!(image.topics["orders"].partitions.len(), 2);
        assert_eq!(image.brokers[&2].listeners["kafka"], "127.0.0.1:9102");
        // What a follower receives (the Raft RPC) is still the JSON image.
        let sent: MetadataImage = serde_json::from_slice(built.snapshot.get_ref()).unwrap();
        assert_eq!(sent, image);

        let (mut reopened, rx) = StateMachine::open(dir.path()).unwrap();
        assert_eq!(**rx.borrow(), image);
        let (applied, membership) = reopened.applied_state().await.unwrap();
        assert_eq!(applied, built.meta.last_log_id);
        assert_eq!(membership, built.meta.last_membership);

        // A follower installs the snapshot a leader sends, and keeps it as rkyv.
        let other = tempfile::tempdir().unwrap();
        let (mut follower, rx) = StateMachine::open(other.path()).unwrap();
        follower
            .install_snapshot(&built.meta, built.snapshot)
            .await
            .unwrap();
        assert_eq!(**rx.borrow(), image);
        let (_, rx) = StateMachine::open(other.path()).unwrap();
        assert_eq!(**rx.borrow(), image);
        assert!(other.path().join(SNAPSHOT_FILE).exists());
        let current = reopened.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, built.meta);
    }
}
