//! The legacy topic metadata file, read once to migrate it, and the
//! crash-safe file helpers the broker's metadata uses.
//!
//! Before the metadata quorum held every topic, a broker kept its topics in
//! `<data_dir>/__meta/topics.toml` (format v1 below). The quorum's image is now
//! the only record: at start, a broker whose quorum is new moves the file's
//! topics into it (same ids, so the logs are kept), and once registered renames
//! the file to `topics.toml.migrated`; nothing writes it any more.
//!
//! ```toml
//! version = 1
//! [[topics]]
//! name = "orders"
//! id = "5f0c2a7e9b1d4c3a8e6f0b2d4a6c8e0f"   # 128-bit hex, fixed at creation
//! partitions = 3
//! internal = false
//! leader_epoch = 0
//! [topics.configs]                          # overrides only; defaults are not stored
//! "retention.ms" = "3600000"
//! ```
//!
//! Invariants: files written here are only ever replaced whole (temp file,
//! fsync, rename, fsync of the directory), so a crash leaves the old or the new
//! version.

use crate::error::BrokerError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

/// Directory (inside the data dir) holding broker metadata.
pub const META_DIR: &str = "__meta";
/// The topic metadata file inside [`META_DIR`].
pub const TOPICS_FILE: &str = "topics.toml";
/// The format version this build writes and reads.
pub const TOPICS_FORMAT_VERSION: u32 = 1;

/// One topic as persisted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicRecord {
    pub name: String,
    pub id: String,
    pub partitions: u32,
    #[serde(default)]
    pub internal: bool,
    #[serde(default)]
    pub leader_epoch: i32,
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopicsFile {
    version: u32,
    #[serde(default)]
    topics: Vec<TopicRecord>,
}

/// Reads and writes `topics.toml`.
#[derive(Debug)]
pub struct MetadataStore {
    dir: PathBuf,
    path: PathBuf,
}

impl MetadataStore {
    /// Opens the store under `data_dir`, creating the metadata directory.
    pub fn open(data_dir: &Path) -> Result<MetadataStore, BrokerError> {
        let dir = data_dir.join(META_DIR);
        fs::create_dir_all(&dir).map_err(|source| BrokerError::DataDir {
            action: "create the metadata directory",
            path: dir.clone(),
            source,
        })?;
        let path = dir.join(TOPICS_FILE);
        Ok(MetadataStore { dir, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a topics file has ever been written.
    pub fn exists(&self) -> bool {
        self.path.exists()
    }

    /// Loads every topic (empty when the file does not exist yet).
    pub fn load(&self) -> Result<Vec<TopicRecord>, BrokerError> {
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(BrokerError::DataDir {
                    action: "read the topic metadata",
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let file: TopicsFile = toml::from_str(&text).map_err(|e| BrokerError::MetadataCorrupt {
            path: self.path.clone(),
            reason: e.to_string().trim_end().to_string(),
        })?;
        if file.version != TOPICS_FORMAT_VERSION {
            return Err(BrokerError::MetadataCorrupt {
                path: self.path.clone(),
                reason: format!(
                    "format version {} is not supported (this broker reads version {TOPICS_FORMAT_VERSION})",
                    file.version
                ),
            });
        }
        Ok(file.topics)
    }

    /// Replaces the file with `topics`, crash-safely (what older brokers did;
    /// kept to write such files in migration tests).
    pub fn save(&self, topics: &[TopicRecord]) -> std::io::Result<()> {
        let file = TopicsFile {
            version: TOPICS_FORMAT_VERSION,
            topics: topics.to_vec(),
        };
        let text = toml::to_string(&file).map_err(std::io::Error::other)?;
        write_atomic(&self.dir, &self.path, text.as_bytes())
    }
}

/// Renames a migrated `topics.toml` to `topics.toml.migrated` (kept for a
/// person to look at; never read again). Best effort: a failure is logged and
/// the file is tried again at the next start, which migrates nothing twice
/// (topics already in the image are skipped).
pub fn retire_topics_file(data_dir: &Path) {
    let dir = data_dir.join(META_DIR);
    let path = dir.join(TOPICS_FILE);
    if !path.exists() {
        return;
    }
    let retired = dir.join(format!("{TOPICS_FILE}.migrated"));
    match fs::rename(&path, &retired).and_then(|()| sync_dir(&dir)) {
        Ok(()) => tracing::info!(
            file = %retired.display(),
            "topics.toml is in the metadata quorum now; the old file was renamed"
        ),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "could not retire topics.toml")
        }
    }
}

/// Writes `contents` to `path` so that a crash leaves either the old file or the
/// new one: temp file, fsync, rename, fsync of `dir` (the parent of `path`).
pub fn write_atomic(dir: &Path, path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp"));
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
    if let Err(e) = file.write_all(contents).and_then(|()| file.sync_all()) {
        // A full disk: the partial copy would only hold on to space.
        drop(file);
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    drop(file);
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

/// Syncs a directory (after renames or removals inside it).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A new 128-bit topic id, hex. Unique enough for naming topic incarnations
/// (time, process id and a process-wide counter, mixed).
pub fn new_topic_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut words = [0u64; 2];
    for (i, w) in words.iter_mut().enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(nanos);
        h.write_u32(std::process::id());
        h.write_u64(n);
        h.write_usize(i);
        *w = h.finish();
    }
    format!("{:016x}{:016x}", words[0], words[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        assert!(store.load().unwrap().is_empty());
        let mut configs = BTreeMap::new();
        configs.insert("retention.ms".to_string(), "1000".to_string());
        let topics = vec![
            TopicRecord {
                name: "a.b-c_d".into(),
                id: new_topic_id(),
                partitions: 3,
                internal: false,
                leader_epoch: 0,
                configs,
            },
            TopicRecord {
                name: "x".into(),
                id: new_topic_id(),
                partitions: 1,
                internal: false,
                leader_epoch: 2,
                configs: BTreeMap::new(),
            },
        ];
        store.save(&topics).unwrap();
        assert_eq!(store.load().unwrap(), topics);
        store.save(&topics[1..]).unwrap();
        assert_eq!(store.load().unwrap(), topics[1..]);
        assert_ne!(topics[0].id, topics[1].id);
    }

    #[test]
    fn corrupt_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetadataStore::open(dir.path()).unwrap();
        fs::write(store.path(), "version = 1\n[[topics]]\nname = 3\n").unwrap();
        let e = store.load().unwrap_err().to_string();
        assert!(e.contains("topics.toml") && e.contains("corrupt"), "{e}");
    }
}
