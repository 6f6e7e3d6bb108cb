//! The metadata quorum's Raft plumbing (openraft 0.9): the type config, the
//! crash-safe log store and state machine under `<data>/__meta/raft/`, and the
//! network that carries Raft RPCs as `RaftRpc` frames over our QUIC protocol.
//!
//! On disk:
//! - `vote.json`, `committed.json`: replaced whole (temp, fsync, rename, fsync dir);
//! - `log`: appended frames `[u32 len][u32 crc32c][json record]`, fsynced before
//!   an append is acknowledged; a torn last frame (crash mid-append) is cut off at
//!   recovery; truncation and purging rewrite the file crash-safely;
//! - `snapshot.json`: the last snapshot (its meta and the image), replaced whole.
//!
//! The state machine is the in-memory [`MetadataImage`], rebuilt at start from the
//! snapshot plus the committed log entries after it (openraft re-applies them);
//! every applied image is published on a `watch` channel for the broker.

use super::image::{Command, MetadataImage, Outcome};
use super::peers::{PeerError, PeerLinks};
use crate::metadata::write_atomic;
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

#[derive(Debug, Serialize, Deserialize)]
enum LogRecord {
    Purged(LogId<NodeId>),
    Entry(Entry<TypeConfig>),
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

fn frame(record: &LogRecord) -> std::io::Result<Vec<u8>> {
    let body = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

impl LogInner {
    fn log_path(&self) -> PathBuf {
        self.dir.join("log")
    }

    /// Rewrites the whole log file (after truncate or purge), crash-safely.
    fn rewrite(&mut self) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        if let Some(p) = self.last_purged {
            bytes.extend(frame(&LogRecord::Purged(p))?);
        }
        for e in self.entries.values() {
            bytes.extend(frame(&LogRecord::Entry(e.clone()))?);
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
        let mut entries = BTreeMap::new();
        let mut last_purged = None;
        let mut at = 0usize;
        while at + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap());
            let end = at + 8 + len as usize;
            if len > RAFT_RECORD_BYTES_MAX || end > bytes.len() {
                break;
            }
            let body = &bytes[at + 8..end];
            if crc32c::crc32c(body) != crc {
                break;
            }
            match serde_json::from_slice::<LogRecord>(body) {
                Ok(LogRecord::Purged(p)) => last_purged = Some(p),
                Ok(LogRecord::Entry(e)) => {
                    entries.insert(e.log_id.index, e);
                }
                Err(_) => break,
            }
            at = end;
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
        if at < bytes.len() {
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
        let mut inner = self.inner.lock();
        write_json(&inner.dir, "vote.json", vote).map_err(|e| StorageIOError::write_vote(&e))?;
        inner.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        Ok(self.inner.lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        let mut inner = self.inner.lock();
        write_json(&inner.dir, "committed.json", &committed).map_err(io_write)?;
        inner.committed = committed;
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
        let mut inner = self.inner.lock();
        let mut bytes = Vec::new();
        let mut new = Vec::new();
        for e in entries {
            bytes.extend(frame(&LogRecord::Entry(e.clone())).map_err(io_write)?);
            new.push(e);
        }
        let written = inner
            .file
            .write_all(&bytes)
            .and_then(|()| inner.file.sync_data());
        if let Err(e) = written {
            let err = io_write(std::io::Error::new(e.kind(), e.to_string()));
            callback.log_io_completed(Err(e));
            return Err(err);
        }
        for e in new {
            inner.entries.insert(e.log_id.index, e);
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let mut inner = self.inner.lock();
        inner.entries.retain(|i, _| *i < log_id.index);
        inner.rewrite().map_err(io_write)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let mut inner = self.inner.lock();
        inner.last_purged = Some(log_id);
        inner.entries.retain(|i, _| *i > log_id.index);
        inner.rewrite().map_err(io_write)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, BasicNode>,
    image: MetadataImage,
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
}

impl StateMachine {
    /// Opens the state machine under `dir` (from the last snapshot, if any).
    pub fn open(
        dir: &Path,
    ) -> std::io::Result<(StateMachine, watch::Receiver<Arc<MetadataImage>>)> {
        std::fs::create_dir_all(dir)?;
        let snapshot: Option<StoredSnapshot> = read_json(&dir.join("snapshot.json"))?;
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
            },
            rx,
        ))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let mut inner = self.inner.lock();
        inner.snapshot_seq += 1;
        let snapshot_id = match inner.last_applied {
            Some(l) => format!("{}-{}", l.index, inner.snapshot_seq),
            None => format!("none-{}", inner.snapshot_seq),
        };
        let stored = StoredSnapshot {
            meta: SnapshotMeta {
                last_log_id: inner.last_applied,
                last_membership: inner.membership.clone(),
                snapshot_id,
            },
            image: inner.image.clone(),
        };
        write_json(&inner.dir, "snapshot.json", &stored)
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        let data = serde_json::to_vec(&stored.image).map_err(io_write)?;
        let meta = stored.meta.clone();
        inner.snapshot = Some(stored);
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
        let mut inner = self.inner.lock();
        let stored = StoredSnapshot {
            meta: meta.clone(),
            image: image.clone(),
        };
        write_json(&inner.dir, "snapshot.json", &stored)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
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
            let b = frame(&LogRecord::Entry(e.clone())).unwrap();
            inner.file.write_all(&b).unwrap();
            inner.entries.insert(e.log_id.index, e);
        }
        inner.file.sync_data().unwrap();
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
        let torn = frame(&LogRecord::Entry(entry(1, 6))).unwrap();
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
}
