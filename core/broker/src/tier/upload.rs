//! The uploader: one background task per broker that, every
//! `object_store.upload_interval_ms`, walks the partitions. On a follower it only
//! re-reads the stored manifest (local retention deletes only what it covers, and
//! a follower that becomes leader continues from it). On the leader, for each
//!
//! 1. loads the partition's manifest from the store once (absent: empty) and
//!    publishes it to the partition (reads below the local start need it);
//! 2. applies the total retention (`retention.ms` / `retention.bytes`, when
//!    `cleanup.policy` has `delete`) to the remote copy: the manifest without the
//!    expired segments is stored first, then their objects are deleted;
//! 3. when `remote.storage.enable=true`, uploads the closed segments entirely below
//!    the high watermark that end past the manifest (oldest first, one at a time:
//!    `.log`, `.index`, `.timeindex`, then the manifest naming them).
//!
//! A failure (store unreachable, conflict) is logged, counted in
//! `rill_tier_errors_total{op}`, and the partition is retried after an exponential
//! backoff ([`BACKOFF_MIN`] doubling to [`BACKOFF_MAX`]); produce never waits for
//! any of this, and local retention only deletes what a stored manifest covers, so
//! a failed upload loses nothing. A broker that restarts re-reads the manifest and
//! continues after its end: a segment half-uploaded before the crash is uploaded
//! again under the same names (base offset and leader epoch), never listed twice.
//! Memory is bounded: a segment is streamed in [`UPLOAD_PART_BYTES`] parts.

use super::manifest::{Manifest, ManifestError, RemoteSegment, check_successor};
use super::{MANIFEST_NAME, RemoteLog, Tier, segment_objects};
use crate::partition::{Partition, Topic};
use crate::state::BrokerState;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use rill_log::TierableSegment;
use rill_proto::types::now_ms;
use rill_proto::{LeaderEpoch, Offset};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

/// Segments uploaded per partition per pass (then other partitions get a turn).
pub const UPLOADS_PER_PASS_MAX: usize = 8;
/// Segments up to this size are uploaded with one PUT; larger ones in parts.
pub const SINGLE_PUT_BYTES_MAX: u64 = 8 << 20;
/// Part size of a multipart upload (S3's minimum is 5 MiB).
pub const UPLOAD_PART_BYTES: u64 = 8 << 20;
/// First retry delay after a failure.
pub const BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Longest retry delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Why one partition's tiering pass failed.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error("object store {op} of {path} failed: {source}")]
    Store {
        op: &'static str,
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error("reading {what} for upload: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{0}")]
    Partition(String),
}

impl TierError {
    fn op(&self) -> &'static str {
        match self {
            TierError::Store { op, .. } => *op,
            TierError::Io { .. } => "read_local",
            TierError::Manifest(_) => "manifest",
            TierError::Partition(_) => "partition",
        }
    }
}

/// Runs the uploader until shutdown.
pub async fn run(state: Arc<BrokerState>, tier: Arc<Tier>) {
    let every = Duration::from_millis(tier.config.upload_interval_ms);
    // partition -> (next attempt, current backoff)
    let mut backoff: HashMap<(Arc<str>, u32), (Instant, Duration)> = HashMap::new();
    // partition -> the leader epoch its orphans were last swept in
    let mut swept: HashMap<(Arc<str>, u32), LeaderEpoch> = HashMap::new();
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let mut backlog = 0u64;
        for topic in state.registry.all() {
            for p in topic.hosted() {
                let key = (topic.name.clone(), p.index());
                let now = Instant::now();
                if backoff.get(&key).is_some_and(|(next, _)| *next > now) {
                    continue;
                }
                let pass = tier_partition(&tier, &topic, p, &mut backlog);
                let result = tokio::select! {
                    _ = state.shutdown.cancelled() => return,
                    r = pass => r,
                };
                match result {
                    Ok(()) => {
                        backoff.remove(&key);
                        sweep_once_per_epoch(&tier, &topic, p, &mut swept).await;
                    }
                    Err(e) => {
                        tier.metrics.error(e.op());
                        if matches!(e, TierError::Manifest(ManifestError::Conflict { .. })) {
                            // Re-read the stored manifest next time.
                            p.clear_remote();
                        }
                        let delay = backoff
                            .get(&key)
                            .map_or(BACKOFF_MIN, |(_, d)| (*d * 2).min(BACKOFF_MAX));
                        tracing::warn!(
                            partition = %format!("{}-{}", topic.name, p.index()),
                            store = %tier.url,
                            error = %e,
                            retry_in = ?delay,
                            "tiered storage pass failed; local data is kept and the pass is retried"
                        );
                        backoff.insert(key, (Instant::now() + delay, delay));
                    }
                }
            }
        }
        tier.metrics.upload_backlog_bytes.set(backlog as f64);
    }
}

/// Longest a broker start waits for the manifests; a partition whose manifest did
/// not load by then answers reads below its local start with a retriable error
/// until the uploader loads it.
pub const STARTUP_MANIFEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Manifests loaded at once at startup.
pub const STARTUP_MANIFEST_LOADS_CONCURRENT: usize = 16;

/// Loads every partition's manifest before the broker serves requests, so the log
/// start offset (ListOffsets earliest) includes the remote copy from the start.
pub async fn load_all(state: &BrokerState, tier: &Tier) {
    use futures::StreamExt;
    let partitions: Vec<(Arc<Topic>, Arc<Partition>)> = state
        .registry
        .all()
        .into_iter()
        .flat_map(|t| {
            t.hosted()
                .map(|p| (t.clone(), p.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    // Pending until loaded; a load that does not finish in time stays pending.
    for (_, p) in &partitions {
        p.set_remote_pending();
    }
    let loads = futures::stream::iter(partitions)
        .map(|(topic, p)| async move {
            let prefix = tier.partition_prefix(&topic.name, &topic.id, p.index());
            match load_manifest(tier, &prefix, &topic.name, p.index()).await {
                Ok(manifest) => {
                    let manifest = manifest.unwrap_or_else(|| {
                        Manifest::empty(&topic.name, &topic.id, p.index(), p.leader_epoch())
                    });
                    p.set_remote(RemoteLog { prefix, manifest });
                }
                Err(e) => {
                    tier.metrics.error(e.op());
                    tracing::warn!(partition = %format!("{}-{}", topic.name, p.index()), error = %e, "could not load the tiered-storage manifest; retrying in the background");
                }
            }
        })
        .buffer_unordered(STARTUP_MANIFEST_LOADS_CONCURRENT)
        .collect::<Vec<()>>();
    if tokio::time::timeout(STARTUP_MANIFEST_TIMEOUT, loads)
        .await
        .is_err()
    {
        tier.metrics.error("manifest_read");
        tracing::warn!(timeout = ?STARTUP_MANIFEST_TIMEOUT, store = %tier.url, "the object store did not answer in time; the remaining manifests load in the background");
    }
}

/// One pass over one partition: load the manifest, remote retention, uploads.
async fn tier_partition(
    tier: &Tier,
    topic: &Topic,
    p: &Partition,
    backlog: &mut u64,
) -> Result<(), TierError> {
    let prefix = tier.partition_prefix(&topic.name, &topic.id, p.index());
    let epoch = p.leader_epoch();
    if !p.is_leader() {
        // Only the leader writes the remote copy. A follower re-reads the stored
        // manifest, so its local retention can delete what the leader uploaded
        // (and, once it leads, it continues from there).
        let manifest = load_manifest(tier, &prefix, &topic.name, p.index())
            .await?
            .unwrap_or_else(|| Manifest::empty(&topic.name, &topic.id, p.index(), epoch));
        p.set_remote(RemoteLog { prefix, manifest });
        return Ok(());
    }
    let remote = match p.remote() {
        Some(r) => r,
        None => {
            let manifest = load_manifest(tier, &prefix, &topic.name, p.index())
                .await?
                .unwrap_or_else(|| Manifest::empty(&topic.name, &topic.id, p.index(), epoch));
            if !manifest.segments.is_empty() {
                tracing::info!(
                    partition = %format!("{}-{}", topic.name, p.index()),
                    segments = manifest.segments.len(),
                    manifest_version = manifest.manifest_version,
                    end_offset = ?manifest.end_offset(),
                    "loaded the tiered-storage manifest"
                );
            }
            p.set_remote(RemoteLog {
                prefix: prefix.clone(),
                manifest,
            })
        }
    };
    let config = p
        .log_config()
        .map_err(|e| TierError::Partition(e.message))?;
    let mut manifest = remote.manifest.clone();

    // Total retention on the remote copy.
    if config.cleanup_policy.delete && !manifest.segments.is_empty() {
        let now = now_ms();
        let mut n = 0;
        if let Some(ms) = config.retention_ms {
            let horizon = now.saturating_sub(ms.min(i64::MAX as u64) as i64);
            n = manifest
                .segments
                .iter()
                .take_while(|s| s.max_timestamp_ms < horizon)
                .count();
        }
        if let Some(limit) = config.retention_bytes {
            let end = manifest.end_offset().unwrap_or(Offset::ZERO);
            let local = p
                .local_size_from(end)
                .map_err(|e| TierError::Partition(e.message))?;
            let mut total = manifest.size_bytes() + local
                - manifest.segments[..n]
                    .iter()
                    .map(|s| s.size_bytes)
                    .sum::<u64>();
            while n < manifest.segments.len()
                && total >= limit.saturating_add(manifest.segments[n].size_bytes)
            {
                total -= manifest.segments[n].size_bytes;
                n += 1;
            }
        }
        if n > 0 {
            if !still_leads(p, epoch) {
                return Ok(());
            }
            let next = manifest.without_oldest(n, epoch);
            store_manifest(tier, &prefix, &next).await?;
            let removed: Vec<RemoteSegment> = manifest.segments[..n].to_vec();
            manifest = next;
            p.set_remote(RemoteLog {
                prefix: prefix.clone(),
                manifest: manifest.clone(),
            });
            tracing::info!(
                partition = %format!("{}-{}", topic.name, p.index()),
                segments = n,
                log_start_offset = %manifest.log_start_offset,
                "deleted remote segments past retention"
            );
            for s in removed {
                for path in segment_objects(&prefix, s.base_offset, s.leader_epoch) {
                    match tier.store.delete(&path).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => {
                            // The manifest no longer names it: an orphan, not a loss.
                            tier.metrics.error("delete");
                            tracing::warn!(object = %path, error = %e, "could not delete a remote segment object past retention");
                        }
                    }
                }
                tier.metrics.segments_deleted.increment(1);
            }
        }
    }

    if !config.remote_storage_enable {
        return Ok(());
    }
    let from = manifest.end_offset().unwrap_or(Offset::ZERO);
    let segments = p
        .tierable_segments(from, UPLOADS_PER_PASS_MAX)
        .map_err(|e| TierError::Partition(e.message))?;
    *backlog += segments.iter().map(|s| s.size_bytes).sum::<u64>();
    for seg in segments {
        let uploaded = upload_segment(tier, &prefix, &seg, epoch).await?;
        if !still_leads(p, epoch) {
            // A new leader continues from the stored manifest; the objects just
            // written are named by our epoch, so they clash with nothing.
            return Ok(());
        }
        let next = manifest.with_segment(uploaded, epoch);
        store_manifest(tier, &prefix, &next).await?;
        manifest = next;
        p.set_remote(RemoteLog {
            prefix: prefix.clone(),
            manifest: manifest.clone(),
        });
        *backlog = backlog.saturating_sub(seg.size_bytes);
        tier.metrics.segments_uploaded.increment(1);
        tracing::debug!(
            partition = %format!("{}-{}", topic.name, p.index()),
            base_offset = %seg.base_offset,
            next_offset = %seg.next_offset,
            bytes = seg.size_bytes,
            "uploaded segment"
        );
    }
    Ok(())
}

/// Whether this broker still leads `p` in `epoch` (checked before every manifest
/// write, so a broker that lost leadership during a pass stops writing; the
/// stored manifest's epoch check refuses what slips past this).
fn still_leads(p: &Partition, epoch: LeaderEpoch) -> bool {
    let leads = p.is_leader() && p.leader_epoch() == epoch;
    if !leads {
        tracing::info!(
            partition = %format!("{}-{}", p.topic(), p.index()),
            "leadership moved during a tiering pass; the new leader continues it"
        );
    }
    leads
}

/// The stored manifest of a partition, if any.
pub async fn load_manifest(
    tier: &Tier,
    prefix: &ObjectPath,
    topic: &str,
    partition: u32,
) -> Result<Option<Manifest>, TierError> {
    Ok(load_manifest_versioned(tier, prefix, topic, partition)
        .await?
        .map(|(m, _)| m))
}

/// The stored manifest and the store's version of the object (its ETag and,
/// where the store versions objects, the version), for a conditional replace.
async fn load_manifest_versioned(
    tier: &Tier,
    prefix: &ObjectPath,
    topic: &str,
    partition: u32,
) -> Result<Option<(Manifest, UpdateVersion)>, TierError> {
    let path = prefix.clone().join(MANIFEST_NAME);
    let got = match tier.store.get(&path).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(source) => {
            return Err(TierError::Store {
                op: "manifest_read",
                path: path.to_string(),
                source,
            });
        }
    };
    if got.meta.size > super::manifest::MANIFEST_BYTES_MAX {
        return Err(TierError::Manifest(ManifestError::Invalid {
            topic: topic.to_string(),
            partition,
            reason: format!(
                "{} bytes, more than the {} a broker reads",
                got.meta.size,
                super::manifest::MANIFEST_BYTES_MAX
            ),
        }));
    }
    let version = UpdateVersion {
        e_tag: got.meta.e_tag.clone(),
        version: got.meta.version.clone(),
    };
    let bytes = got.bytes().await.map_err(|source| TierError::Store {
        op: "manifest_read",
        path: path.to_string(),
        source,
    })?;
    Ok(Some((Manifest::decode(&bytes, topic, partition)?, version)))
}

/// Replaces the stored manifest with `next`, after checking that the store still
/// holds its predecessor (see [`check_successor`]); the write itself is
/// conditional on the object being the one read (see [`put_manifest`]).
async fn store_manifest(
    tier: &Tier,
    prefix: &ObjectPath,
    next: &Manifest,
) -> Result<(), TierError> {
    next.validate()?;
    let stored = load_manifest_versioned(tier, prefix, &next.topic, next.partition).await?;
    check_successor(stored.as_ref().map(|(m, _)| m), next)?;
    put_manifest(tier, prefix, next, stored.map(|(_, v)| v)).await
}

/// Writes `next` only if the store still holds the object version `read`
/// (`None`: only if there is no manifest yet): a compare-and-swap, so a paused
/// old leader that resumes between its read and its write cannot overwrite a
/// newer manifest. Stores that cannot write conditionally (object_store's local
/// file system cannot replace conditionally) get a plain write; the leader-epoch
/// check of [`check_successor`] just before it is then the only guard, which
/// leaves a window of one round trip. That is logged once per broker.
pub(super) async fn put_manifest(
    tier: &Tier,
    prefix: &ObjectPath,
    next: &Manifest,
    read: Option<UpdateVersion>,
) -> Result<(), TierError> {
    let path = prefix.clone().join(MANIFEST_NAME);
    let payload = PutPayload::from(next.encode());
    let write_err = |source| TierError::Store {
        op: "manifest_write",
        path: path.to_string(),
        source,
    };
    let mode = match read {
        None => PutMode::Create,
        Some(_) if !tier.conditional_replace.load(Ordering::Relaxed) => PutMode::Overwrite,
        Some(v) => PutMode::Update(v),
    };
    let conditional = !matches!(mode, PutMode::Overwrite);
    match tier
        .store
        .put_opts(&path, payload.clone(), PutOptions::from(mode))
        .await
    {
        Ok(_) => Ok(()),
        Err(
            object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. },
        ) if conditional => Err(TierError::Manifest(ManifestError::Replaced {
            topic: next.topic.clone(),
            partition: next.partition,
            read: next.manifest_version.saturating_sub(1),
            ours: next.manifest_version,
        })),
        Err(object_store::Error::NotImplemented { .. }) if conditional => {
            if tier.conditional_replace.swap(false, Ordering::Relaxed) {
                tracing::warn!(
                    store = %tier.url,
                    "this object store cannot replace an object conditionally; manifest writes rely on the \
                     leader-epoch check alone (use S3, GCS or Azure for compare-and-swap)"
                );
            }
            tier.store.put(&path, payload).await.map_err(write_err)?;
            Ok(())
        }
        Err(source) => Err(write_err(source)),
    }
}

fn read_at(file: &File, position: u64, len: u64, what: &str) -> Result<Vec<u8>, TierError> {
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, position)
        .map_err(|source| TierError::Io {
            what: what.to_string(),
            source,
        })?;
    Ok(buf)
}

/// Reads `len` bytes of `file` from `position` on the blocking pool.
async fn read_blocking(
    file: Arc<File>,
    position: u64,
    len: u64,
    what: String,
) -> Result<Vec<u8>, TierError> {
    tokio::task::spawn_blocking(move || read_at(&file, position, len, &what))
        .await
        .map_err(|e| TierError::Partition(format!("read task failed: {e}")))?
}

async fn put(tier: &Tier, path: &ObjectPath, bytes: Vec<u8>) -> Result<(), TierError> {
    let len = bytes.len() as u64;
    tier.store
        .put(path, PutPayload::from(bytes))
        .await
        .map_err(|source| TierError::Store {
            op: "upload",
            path: path.to_string(),
            source,
        })?;
    tier.metrics.upload_bytes.increment(len);
    Ok(())
}

/// Uploads one segment's three objects; returns its manifest entry.
pub(crate) async fn upload_segment(
    tier: &Tier,
    prefix: &ObjectPath,
    seg: &TierableSegment,
    epoch: LeaderEpoch,
) -> Result<RemoteSegment, TierError> {
    let [log, index, time_index] = segment_objects(prefix, seg.base_offset, epoch);
    let what = seg.log_path.display().to_string();
    if seg.size_bytes <= SINGLE_PUT_BYTES_MAX {
        let bytes = read_blocking(seg.log.clone(), 0, seg.size_bytes, what).await?;
        put(tier, &log, bytes).await?;
    } else {
        let store_err = |source| TierError::Store {
            op: "upload",
            path: log.to_string(),
            source,
        };
        let mut upload = tier.store.put_multipart(&log).await.map_err(store_err)?;
        let mut pos = 0;
        while pos < seg.size_bytes {
            let len = UPLOAD_PART_BYTES.min(seg.size_bytes - pos);
            let part = match read_blocking(seg.log.clone(), pos, len, what.clone()).await {
                Ok(part) => part,
                Err(e) => {
                    let _ = upload.abort().await;
                    return Err(e);
                }
            };
            if let Err(e) = upload.put_part(PutPayload::from(part)).await {
                let _ = upload.abort().await;
                return Err(store_err(e));
            }
            tier.metrics.upload_bytes.increment(len);
            pos += len;
        }
        upload.complete().await.map_err(store_err)?;
    }
    let mut sizes = [0u64; 2];
    for (i, (file, path)) in [(&seg.offset_index, &index), (&seg.time_index, &time_index)]
        .into_iter()
        .enumerate()
    {
        let len = file
            .metadata()
            .map_err(|source| TierError::Io {
                what: format!("the index of {}", seg.log_path.display()),
                source,
            })?
            .len();
        let bytes = read_blocking(
            file.clone(),
            0,
            len,
            format!("the index of {}", seg.log_path.display()),
        )
        .await?;
        put(tier, path, bytes).await?;
        sizes[i] = len;
    }
    Ok(RemoteSegment {
        base_offset: seg.base_offset,
        next_offset: seg.next_offset,
        size_bytes: seg.size_bytes,
        max_timestamp_ms: seg.max_timestamp,
        leader_epoch: epoch,
        offset_index_bytes: sizes[0],
        time_index_bytes: sizes[1],
    })
}

/// Once per leadership, deletes the partition's orphan objects: segment objects
/// no manifest entry names (a leader killed between uploading a segment and
/// writing the manifest leaves them; so does a failed delete past retention).
///
/// Only after this leader has written the manifest in its own epoch: from then
/// on an older leader's manifest write is refused, so an object it may still be
/// uploading can never become listed. Objects at or past the manifest's end are
/// kept (an upload of this broker's runs in this same task, never concurrently).
async fn sweep_once_per_epoch(
    tier: &Tier,
    topic: &Topic,
    p: &Partition,
    swept: &mut HashMap<(Arc<str>, u32), LeaderEpoch>,
) {
    let epoch = p.leader_epoch();
    let key = (topic.name.clone(), p.index());
    let Some(remote) = p.remote() else { return };
    if !p.is_leader() || remote.manifest.leader_epoch != epoch || swept.get(&key) == Some(&epoch) {
        return;
    }
    match sweep_orphans(tier, &remote).await {
        Ok(0) => {
            swept.insert(key, epoch);
        }
        Ok(n) => {
            swept.insert(key, epoch);
            tracing::info!(
                partition = %format!("{}-{}", topic.name, p.index()),
                objects = n,
                "deleted orphan remote objects no manifest names"
            );
        }
        Err(e) => {
            tier.metrics.error("sweep");
            tracing::warn!(
                partition = %format!("{}-{}", topic.name, p.index()),
                error = %e,
                "could not sweep orphan remote objects; retrying on a later pass"
            );
        }
    }
}

/// Deletes the segment objects under `remote.prefix` that the manifest does not
/// name and that start below its end; returns how many.
async fn sweep_orphans(tier: &Tier, remote: &RemoteLog) -> Result<usize, object_store::Error> {
    use futures::StreamExt;
    let Some(end) = remote.manifest.end_offset() else {
        return Ok(0);
    };
    let listed: std::collections::HashSet<String> = remote
        .manifest
        .segments
        .iter()
        .map(|s| format!("{:020}-{}", s.base_offset.0, s.leader_epoch.0))
        .collect();
    let mut orphans = Vec::new();
    let mut listing = tier.store.list(Some(&remote.prefix));
    while let Some(meta) = listing.next().await {
        let meta = meta?;
        let Some(name) = meta.location.filename() else {
            continue;
        };
        let Some((stem, _)) = name.split_once('.') else {
            continue;
        };
        let base = stem
            .split_once('-')
            .and_then(|(b, _)| b.parse::<i64>().ok());
        if let Some(base) = base
            && base < end.0
            && !listed.contains(stem)
        {
            orphans.push(meta.location.clone());
        }
    }
    for path in &orphans {
        match tier.store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(orphans.len())
}

/// Deletes every remote object of a deleted topic (best effort: failures are
/// logged and counted; the objects are then orphans no manifest names).
pub async fn delete_topic_objects(tier: Arc<Tier>, topic: String, topic_id: String) {
    use futures::StreamExt;
    let prefix = tier.topic_prefix(&topic, &topic_id);
    let mut listing = tier.store.list(Some(&prefix));
    let mut deleted = 0u64;
    while let Some(item) = listing.next().await {
        let result = match item {
            Ok(meta) => tier.store.delete(&meta.location).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => deleted += 1,
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tier.metrics.error("delete");
                tracing::warn!(%topic, error = %e, "could not delete a remote object of a deleted topic");
            }
        }
    }
    tracing::info!(%topic, objects = deleted, "deleted the remote objects of a deleted topic");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ObjectStoreConfig;

    fn seg(base: i64, next: i64, epoch: i32) -> RemoteSegment {
        RemoteSegment {
            base_offset: Offset(base),
            next_offset: Offset(next),
            size_bytes: 100,
            max_timestamp_ms: 5,
            leader_epoch: LeaderEpoch(epoch),
            offset_index_bytes: 8,
            time_index_bytes: 12,
        }
    }

    /// Compare-and-swap: an old leader that read version 1, paused, and resumes
    /// after the new leader stored version 2 is refused, not written over it.
    #[tokio::test]
    async fn a_writer_that_read_an_old_manifest_cannot_replace_a_newer_one() {
        let tier = Tier::open(&ObjectStoreConfig {
            url: "memory://".into(),
            ..ObjectStoreConfig::default()
        })
        .unwrap();
        let prefix = ObjectPath::from("t-id/0");
        let v1 = Manifest::empty("t", "id", 0, LeaderEpoch(0))
            .with_segment(seg(0, 10, 0), LeaderEpoch(0));
        store_manifest(&tier, &prefix, &v1).await.unwrap();

        let (_, read) = load_manifest_versioned(&tier, &prefix, "t", 0)
            .await
            .unwrap()
            .expect("stored");
        let new_leader = v1.with_segment(seg(10, 20, 1), LeaderEpoch(1));
        put_manifest(&tier, &prefix, &new_leader, Some(read.clone()))
            .await
            .unwrap();
        let old_leader = v1.with_segment(seg(10, 15, 0), LeaderEpoch(0));
        let e = put_manifest(&tier, &prefix, &old_leader, Some(read))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                TierError::Manifest(ManifestError::Replaced {
                    read: 1,
                    ours: 2,
                    ..
                })
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("was replaced by another writer"),
            "{e}"
        );
        // A first manifest is created only where there is none.
        let e = put_manifest(&tier, &prefix, &v1, None).await.unwrap_err();
        assert!(
            matches!(e, TierError::Manifest(ManifestError::Replaced { .. })),
            "{e}"
        );

        let stored = load_manifest(&tier, &prefix, "t", 0)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored, new_leader);
    }
}
