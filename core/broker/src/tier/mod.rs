//! Tiered storage: closed segments of topics with `remote.storage.enable=true` are
//! uploaded to an object store (S3, GCS, Azure Blob, or a local directory, through
//! the `object_store` crate), recorded in a per-partition manifest, deleted locally
//! once uploaded and past local retention, and read back for fetches below the
//! local log start offset.
//!
//! Parts: [`manifest`] (the per-partition manifest and its format), [`upload`] (the
//! background task that uploads, applies total retention to the remote copy and
//! publishes the manifest to the partition), [`reader`] (ranged remote reads through
//! a bounded cache). This module opens the store from its URL and owns the object
//! names and the tier's metrics.
//!
//! Object names, under the URL's path prefix:
//!
//! ```text
//! <prefix>/<topic>-<topic id>/<partition>/manifest.json
//! <prefix>/<topic>-<topic id>/<partition>/<20-digit base offset>-<leader epoch>.log
//!                                                               ... .index, .timeindex
//! ```
//!
//! The topic id keeps a re-created topic of the same name apart. A segment's name
//! holds its base offset and the leader epoch of the broker that uploaded it, so a
//! retry after a crash overwrites its own half-done upload (idempotent), and a new
//! leader never overwrites objects an old leader may still be writing; only the
//! manifest says which objects are part of the log.
//!
//! Invariants: the tier never deletes a local segment itself (the log's local
//! retention does, given the manifest's end offset, so unuploaded data stays);
//! a segment enters the manifest only after its three objects are stored; an
//! unreachable store is logged and counted, and retried with backoff, never lost.

pub mod manifest;
pub mod reader;
pub mod upload;

use crate::config::ObjectStoreConfig;
use crate::error::BrokerError;
use metrics::{Counter, Gauge};
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use rill_proto::{LeaderEpoch, Offset};
use std::sync::Arc;

pub use manifest::{Manifest, RemoteSegment};
pub use reader::RemoteCache;

pub const TIER_UPLOAD_BYTES_TOTAL: &str = "rill_tier_upload_bytes_total";
pub const TIER_DOWNLOAD_BYTES_TOTAL: &str = "rill_tier_download_bytes_total";
pub const TIER_SEGMENTS_UPLOADED_TOTAL: &str = "rill_tier_segments_uploaded_total";
pub const TIER_SEGMENTS_DELETED_TOTAL: &str = "rill_tier_remote_segments_deleted_total";
pub const TIER_ERRORS_TOTAL: &str = "rill_tier_errors_total";
pub const TIER_CACHE_HITS_TOTAL: &str = "rill_tier_cache_hits_total";
pub const TIER_CACHE_MISSES_TOTAL: &str = "rill_tier_cache_misses_total";
/// Bytes of closed segments below the high watermark not yet in a manifest.
pub const TIER_UPLOAD_BACKLOG_BYTES: &str = "rill_tier_upload_backlog_bytes";
pub const TIER_REMOTE_SIZE_BYTES: &str = "rill_partition_remote_size_bytes";

/// A partition's remote copy as last stored: its object prefix and manifest.
#[derive(Debug, Clone)]
pub struct RemoteLog {
    pub prefix: ObjectPath,
    pub manifest: Manifest,
}

/// Name of the manifest object in a partition's prefix.
pub const MANIFEST_NAME: &str = "manifest.json";

/// Handles of the tier's metrics, registered once.
#[derive(Debug, Clone)]
pub struct TierMetrics {
    pub upload_bytes: Counter,
    pub download_bytes: Counter,
    pub segments_uploaded: Counter,
    pub segments_deleted: Counter,
    pub cache_hits: Counter,
    pub cache_misses: Counter,
    pub upload_backlog_bytes: Gauge,
}

impl TierMetrics {
    fn register() -> TierMetrics {
        TierMetrics {
            upload_bytes: metrics::counter!(TIER_UPLOAD_BYTES_TOTAL),
            download_bytes: metrics::counter!(TIER_DOWNLOAD_BYTES_TOTAL),
            segments_uploaded: metrics::counter!(TIER_SEGMENTS_UPLOADED_TOTAL),
            segments_deleted: metrics::counter!(TIER_SEGMENTS_DELETED_TOTAL),
            cache_hits: metrics::counter!(TIER_CACHE_HITS_TOTAL),
            cache_misses: metrics::counter!(TIER_CACHE_MISSES_TOTAL),
            upload_backlog_bytes: metrics::gauge!(TIER_UPLOAD_BACKLOG_BYTES),
        }
    }

    /// Counts one failed object-store operation (`upload`, `download`, `manifest`, `delete`).
    pub fn error(&self, op: &'static str) {
        metrics::counter!(TIER_ERRORS_TOTAL, "op" => op).increment(1);
    }
}

/// The broker's object store and what the tier shares between the uploader and
/// the fetch path.
#[derive(Debug)]
pub struct Tier {
    pub store: Arc<dyn ObjectStore>,
    /// The URL's path, under which every object lives.
    pub prefix: ObjectPath,
    /// The URL as configured, for logs and `DescribeStorage` (no credentials: those
    /// come from the environment).
    pub url: String,
    pub config: ObjectStoreConfig,
    pub cache: RemoteCache,
    pub metrics: TierMetrics,
    /// Whether the store replaces objects conditionally (compare-and-swap on the
    /// ETag); cleared the first time it answers that it cannot.
    pub conditional_replace: std::sync::atomic::AtomicBool,
}

impl Tier {
    /// Opens the object store named by `config.url`: `file:///abs/path` (created if
    /// missing), `s3://bucket/prefix` (region, endpoint and credentials from the
    /// `AWS_*` environment variables, e.g. `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`),
    /// `gs://bucket/prefix` (`GOOGLE_*`), `az://container/prefix` (`AZURE_*`), or
    /// `memory://` (in-process, for tests). Opening does no network I/O.
    pub fn open(config: &ObjectStoreConfig) -> Result<Tier, BrokerError> {
        let bad = |reason: String| BrokerError::ConfigInvalid {
            key: "object_store.url".into(),
            reason: format!("{:?}: {reason}", config.url),
        };
        // Object stores speak HTTPS through rustls; use the same provider as QUIC.
        let _ = rustls::crypto::CryptoProvider::install_default(Arc::unwrap_or_clone(
            rill_net::tls::crypto_provider(),
        ));
        let url = url::Url::parse(&config.url).map_err(|e| {
            bad(format!(
                "not a URL ({e}); use file:///path, s3://bucket/prefix, gs://bucket/prefix or az://container/prefix"
            ))
        })?;
        let store_err = |e: object_store::Error| bad(e.to_string());
        let (store, prefix): (Arc<dyn ObjectStore>, ObjectPath) = match url.scheme() {
            "file" => {
                let path = url
                    .to_file_path()
                    .map_err(|()| bad("a file URL needs an absolute path: file:///path".into()))?;
                std::fs::create_dir_all(&path).map_err(|e| {
                    bad(format!(
                        "cannot create the directory {}: {e}",
                        path.display()
                    ))
                })?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&path)
                    .map_err(store_err)?;
                (Arc::new(fs) as Arc<dyn ObjectStore>, ObjectPath::default())
            }
            "memory" => (
                Arc::new(object_store::memory::InMemory::new()) as Arc<dyn ObjectStore>,
                ObjectPath::default(),
            ),
            "s3" | "s3a" => {
                let s3 = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(url.as_str())
                    .with_retry(retry_config())
                    .build()
                    .map_err(store_err)?;
                (Arc::new(s3) as Arc<dyn ObjectStore>, url_prefix(&url)?)
            }
            "gs" => {
                let gcs = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(url.as_str())
                    .with_retry(retry_config())
                    .build()
                    .map_err(store_err)?;
                (Arc::new(gcs) as Arc<dyn ObjectStore>, url_prefix(&url)?)
            }
            "az" | "azure" | "abfs" | "abfss" => {
                let az = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(url.as_str())
                    .with_retry(retry_config())
                    .build()
                    .map_err(store_err)?;
                (Arc::new(az) as Arc<dyn ObjectStore>, url_prefix(&url)?)
            }
            other => {
                return Err(bad(format!(
                    "unsupported scheme {other:?}; use file, s3, gs or az"
                )));
            }
        };
        Ok(Tier {
            store,
            prefix,
            url: config.url.clone(),
            cache: RemoteCache::new(config.cache_bytes),
            config: config.clone(),
            metrics: TierMetrics::register(),
            conditional_replace: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// The prefix of one partition's objects.
    pub fn partition_prefix(&self, topic: &str, topic_id: &str, partition: u32) -> ObjectPath {
        self.prefix
            .clone()
            .join(format!("{topic}-{topic_id}"))
            .join(partition.to_string())
    }

    /// The prefix of one topic's objects (every partition).
    pub fn topic_prefix(&self, topic: &str, topic_id: &str) -> ObjectPath {
        self.prefix.clone().join(format!("{topic}-{topic_id}"))
    }
}

/// The object names of one remote segment: its `.log`, `.index` and `.timeindex`.
pub fn segment_objects(
    partition_prefix: &ObjectPath,
    base: Offset,
    epoch: LeaderEpoch,
) -> [ObjectPath; 3] {
    let stem = format!("{:020}-{}", base.0, epoch.0);
    [
        partition_prefix.clone().join(format!("{stem}.log")),
        partition_prefix.clone().join(format!("{stem}.index")),
        partition_prefix.clone().join(format!("{stem}.timeindex")),
    ]
}

/// The HTTP client's own retries stay short: the uploader retries a failed pass
/// with its own backoff, and a fetch has its own wait limit.
fn retry_config() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: STORE_RETRIES_MAX,
        retry_timeout: STORE_RETRY_TIMEOUT,
        ..object_store::RetryConfig::default()
    }
}

/// Retries of one object-store request inside the HTTP client.
pub const STORE_RETRIES_MAX: usize = 3;
/// Longest the HTTP client keeps retrying one request.
pub const STORE_RETRY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn url_prefix(url: &url::Url) -> Result<ObjectPath, BrokerError> {
    ObjectPath::parse(url.path().trim_matches('/')).map_err(|e| BrokerError::ConfigInvalid {
        key: "object_store.url".into(),
        reason: format!(
            "{:?}: the path is not a valid object prefix: {e}",
            url.as_str()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(url: &str) -> ObjectStoreConfig {
        ObjectStoreConfig {
            url: url.to_string(),
            ..ObjectStoreConfig::default()
        }
    }

    #[test]
    fn bad_urls_are_clear_errors() {
        let e = Tier::open(&cfg("not a url")).unwrap_err().to_string();
        assert!(e.contains("object_store.url") && e.contains("s3://"), "{e}");
        let e = Tier::open(&cfg("ftp://host/x")).unwrap_err().to_string();
        assert!(e.contains("unsupported scheme \"ftp\""), "{e}");
        let e = Tier::open(&cfg("file://relative/x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("object_store.url"), "{e}");
    }

    #[test]
    fn opens_file_and_s3_urls() {
        let dir = tempfile::tempdir().unwrap();
        let url = url::Url::from_file_path(dir.path().join("tier")).unwrap();
        let tier = Tier::open(&cfg(url.as_str())).unwrap();
        assert!(dir.path().join("tier").is_dir());
        assert_eq!(tier.partition_prefix("t", "abc", 3).as_ref(), "t-abc/3");
        let tier = Tier::open(&cfg("s3://bucket/some/prefix")).unwrap();
        assert_eq!(tier.prefix.as_ref(), "some/prefix");
        let [log, index, time] = segment_objects(&tier.prefix, Offset(42), LeaderEpoch(3));
        assert_eq!(log.as_ref(), "some/prefix/00000000000000000042-3.log");
        assert!(index.as_ref().ends_with("-3.index") && time.as_ref().ends_with(".timeindex"));
    }
}
