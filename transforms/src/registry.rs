//! The transforms' records in the cluster, through the client library: the
//! deployments (`__transforms`, compacted), the instances' status
//! (`__transform_status`, compacted, key `<name>/<instance>`), their log lines
//! (`__transform_logs`, key `<name>`, kept [`LOGS_RETENTION_MS`]). Committed
//! input offsets are the consumer group's (`__transform-<name>`).
//!
//! Every internal topic is created on first use with one partition (they are
//! small and read whole); `__transforms` allows records up to
//! [`TRANSFORMS_MESSAGE_BYTES_MAX`] so a module fits in one record.

use std::collections::{BTreeMap, HashMap};

use std::time::{Duration, Instant};

use rill_client::{
    Client, ClientError, ConsumerConfig, ConsumerRecord, ErrorCode, NewTopic, Offset,
    ProducerConfig, ProducerRecord, TopicPartition,
};
use serde::{Deserialize, Serialize};

use crate::deployment::{Deployment, TRANSFORMS_TOPIC};
use crate::error::TransformError;
use crate::instance::LogLine;
use crate::module::MODULE_BYTES_MAX;

pub const STATUS_TOPIC: &str = "__transform_status";
pub const LOGS_TOPIC: &str = "__transform_logs";
/// `max.message.bytes` of `__transforms`: a module and its settings in one batch.
pub const TRANSFORMS_MESSAGE_BYTES_MAX: usize = MODULE_BYTES_MAX + 1024 * 1024;
/// How long log lines are kept.
pub const LOGS_RETENTION_MS: u64 = 24 * 3600 * 1000;
/// Bound on reading an internal topic to its end.
pub const READ_TO_END_TIMEOUT: Duration = Duration::from_secs(30);

/// Creates `name` unless it exists.
pub async fn ensure_topic(
    client: &Client,
    name: &str,
    partitions: u32,
    configs: Vec<(String, String)>,
) -> Result<bool, ClientError> {
    create_if_missing(client, name, partitions, false, configs).await
}

/// Most replicas of a transform's own topics (registry, status, logs, state):
/// as the broker's internal topics, three, or every live broker if fewer.
pub const INTERNAL_REPLICATION_FACTOR_MAX: u16 = 3;

/// [`ensure_topic`] for a topic transforms keep for themselves (the registry,
/// status and logs, a deployment's state): replicated on up to
/// [`INTERNAL_REPLICATION_FACTOR_MAX`] live brokers, not the broker's default
/// (1 unless configured), so a transform restoring its state after a broker
/// failed finds it on another broker.
pub async fn ensure_internal_topic(
    client: &Client,
    name: &str,
    partitions: u32,
    configs: Vec<(String, String)>,
) -> Result<bool, ClientError> {
    create_if_missing(client, name, partitions, true, configs).await
}

/// Creates `name` unless it exists, with the broker's default replication
/// factor or (`internal`) on up to [`INTERNAL_REPLICATION_FACTOR_MAX`] live
/// brokers, counted only when the topic is missing.
async fn create_if_missing(
    client: &Client,
    name: &str,
    partitions: u32,
    internal: bool,
    configs: Vec<(String, String)>,
) -> Result<bool, ClientError> {
    if client.partition_count(name).await.is_ok() {
        return Ok(false);
    }
    let replication_factor = if internal {
        let live = client
            .admin()
            .cluster()
            .await?
            .brokers
            .iter()
            .filter(|b| b.alive)
            .count();
        Some((live as u16).clamp(1, INTERNAL_REPLICATION_FACTOR_MAX))
    } else {
        None
    };
    let result = client
        .admin()
        .create_topic(NewTopic {
            name: name.to_string(),
            partitions: Some(partitions),
            replication_factor,
            configs,
        })
        .await;
    match result {
        Ok(()) => Ok(true),
        Err(e) if e.code() == Some(ErrorCode::TopicAlreadyExists) => Ok(false),
        // A caller who may not create it is fine when it exists (and the
        // broker refuses creation before it looks).
        Err(e)
            if matches!(
                e.code(),
                Some(ErrorCode::TopicAuthorizationFailed | ErrorCode::ClusterAuthorizationFailed)
            ) && client.partition_count(name).await.is_ok() =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

fn compacted() -> Vec<(String, String)> {
    vec![("cleanup.policy".into(), "compact".into())]
}

/// Creates the internal topics that are missing.
pub async fn ensure_internal_topics(client: &Client) -> Result<(), ClientError> {
    let mut transforms = compacted();
    transforms.push((
        "max.message.bytes".into(),
        TRANSFORMS_MESSAGE_BYTES_MAX.to_string(),
    ));
    ensure_internal_topic(client, TRANSFORMS_TOPIC, 1, transforms).await?;
    ensure_internal_topic(client, STATUS_TOPIC, 1, compacted()).await?;
    ensure_internal_topic(
        client,
        LOGS_TOPIC,
        1,
        vec![("retention.ms".into(), LOGS_RETENTION_MS.to_string())],
    )
    .await?;
    Ok(())
}

/// Every record of `tps` from their start to their end as of now.
pub async fn read_to_end(
    client: &Client,
    tps: &[TopicPartition],
) -> Result<Vec<ConsumerRecord>, ClientError> {
    read_between(client, tps, rill_client::OffsetSpec::Earliest).await
}

/// Every record of `tps` from the offset `from` names (per partition) to their
/// end as of now.
pub async fn read_between(
    client: &Client,
    tps: &[TopicPartition],
    from: rill_client::OffsetSpec,
) -> Result<Vec<ConsumerRecord>, ClientError> {
    read_between_as(client, tps, from, rill_client::Isolation::ReadUncommitted).await
}

/// Every committed record of `tps` (transactions' records only once they
/// committed) from the start to their end as of now: the read waits until the
/// transactions open now end (commit, abort or time out).
pub async fn read_committed_to_end(
    client: &Client,
    tps: &[TopicPartition],
) -> Result<Vec<ConsumerRecord>, ClientError> {
    read_between_as(
        client,
        tps,
        rill_client::OffsetSpec::Earliest,
        rill_client::Isolation::ReadCommitted,
    )
    .await
}

async fn read_between_as(
    client: &Client,
    tps: &[TopicPartition],
    from: rill_client::OffsetSpec,
    isolation: rill_client::Isolation,
) -> Result<Vec<ConsumerRecord>, ClientError> {
    let ends: HashMap<TopicPartition, Offset> = client
        .list_offsets(tps, rill_client::OffsetSpec::Latest)
        .await?
        .into_iter()
        .collect();
    let starts = client.list_offsets(tps, from).await?;
    let mut consumer = client.consumer(ConsumerConfig {
        fetch_max_wait: Duration::from_millis(50),
        isolation,
        ..ConsumerConfig::default()
    })?;
    consumer.assign(tps.to_vec());
    for (tp, start) in &starts {
        consumer.seek(tp, *start)?;
    }
    let mut out = Vec::new();
    let deadline = Instant::now() + READ_TO_END_TIMEOUT;
    loop {
        let mut done = true;
        for tp in tps {
            let end = ends.get(tp).copied().unwrap_or(Offset(0));
            if consumer.position(tp).await? < end {
                done = false;
            }
        }
        if done {
            return Ok(out);
        }
        if Instant::now() > deadline {
            return Err(ClientError::Timeout {
                what: format!(
                    "reading {} to its end (after {READ_TO_END_TIMEOUT:?})",
                    tps.first().map(|t| t.topic.as_str()).unwrap_or("?")
                ),
            });
        }
        for r in consumer.poll(Duration::from_millis(200)).await? {
            if ends
                .get(&TopicPartition::new(&*r.topic, r.partition))
                .is_some_and(|e| r.offset < *e)
            {
                out.push(r);
            }
        }
    }
}

/// The latest value per key of a one-partition compacted topic (tombstones
/// remove the key).
pub async fn read_table(
    client: &Client,
    topic: &str,
) -> Result<BTreeMap<Vec<u8>, ConsumerRecord>, ClientError> {
    let mut table = BTreeMap::new();
    for r in read_to_end(client, &[TopicPartition::new(topic, 0)]).await? {
        let Some(key) = r.key.clone() else { continue };
        if r.value.is_some() {
            table.insert(key.to_vec(), r);
        } else {
            table.remove(key.as_ref());
        }
    }
    Ok(table)
}

/// A one-off producer for control records (acks=all, no linger).
pub fn control_producer(client: &Client) -> Result<rill_client::Producer, ClientError> {
    client.producer(ProducerConfig {
        linger: Duration::ZERO,
        max_request_bytes: TRANSFORMS_MESSAGE_BYTES_MAX + 64 * 1024,
        buffer_memory: 4 * TRANSFORMS_MESSAGE_BYTES_MAX,
        delivery_timeout: Duration::from_secs(30),
        ..ProducerConfig::default()
    })
}

/// Every deployment, by name.
pub async fn load_deployments(
    client: &Client,
) -> Result<BTreeMap<String, Deployment>, TransformError> {
    ensure_internal_topics(client).await?;
    let mut out = BTreeMap::new();
    for (key, r) in read_table(client, TRANSFORMS_TOPIC).await? {
        // A record that does not decode, or holds another name than its key,
        // is skipped (the supervisors refuse to run it), not fatal to every
        // command.
        let mut d = match Deployment::decode(r.value.as_deref().unwrap_or_default()) {
            Ok(d) if d.name.as_bytes() == key.as_slice() => d,
            Ok(d) => {
                tracing::warn!(key = %String::from_utf8_lossy(&key), name = %d.name, "skipping a deployment record stored under another name");
                continue;
            }
            Err(e) => {
                tracing::warn!(key = %String::from_utf8_lossy(&key), error = %e, "skipping a deployment record");
                continue;
            }
        };
        d.owner = deployer(&r);
        out.insert(d.name.clone(), d);
    }
    Ok(out)
}

/// One deployment, or an error naming it.
pub async fn load_deployment(client: &Client, name: &str) -> Result<Deployment, TransformError> {
    load_deployments(client).await?.remove(name).ok_or_else(|| {
        TransformError::Deployment(format!(
            "no transform named {name}: `rill transform list` shows the deployed ones"
        ))
    })
}

/// The principal a record of `__transforms` runs as: the header its broker
/// stamped on it.
pub fn deployer(r: &ConsumerRecord) -> Option<String> {
    r.headers
        .iter()
        .rev()
        .find(|h| h.key == rill_client::DEPLOYER_HEADER)
        .and_then(|h| String::from_utf8(h.value.to_vec()).ok())
}

/// Writes a deployment (new, changed or with a new run state) through the
/// broker, which checks the caller may deploy it and stamps the principal it
/// runs as: the caller's, or (written by a broker) `owner`. Returns that
/// principal.
pub async fn store_deployment(
    client: &Client,
    d: &Deployment,
    owner: Option<String>,
) -> Result<String, TransformError> {
    let written = client
        .admin()
        .write_transform(&d.write_request(owner))
        .await?;
    Ok(written.principal)
}

/// Deletes a deployment (a tombstone, written by the broker for a caller
/// allowed to delete the transform).
pub async fn delete_deployment(client: &Client, name: &str) -> Result<(), TransformError> {
    let req = rill_client::TransformWriteRequest {
        name: name.to_string(),
        inputs: Vec::new(),
        outputs: Vec::new(),
        value: None,
        owner: None,
    };
    client.admin().write_transform(&req).await?;
    Ok(())
}

/// Writes tombstones for `keys` of a compacted topic.
pub async fn delete_keys(client: &Client, topic: &str, keys: &[String]) -> Result<(), ClientError> {
    let producer = control_producer(client)?;
    let mut pending = Vec::new();
    for k in keys {
        pending.push(
            producer
                .send(ProducerRecord::tombstone(topic, k.clone()))
                .await?,
        );
    }
    for p in pending {
        p.await?;
    }
    producer.close().await
}

/// What one instance reports about itself (the value in `__transform_status`, JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct InstanceStatus {
    pub name: String,
    pub instance: String,
    /// The deployment version the instance runs.
    pub version: u64,
    /// running | stopped | halted | failed | refused (the host does not run
    /// this version: `last_error` says why)
    pub state: String,
    pub partitions: Vec<String>,
    pub processed: u64,
    pub failed: u64,
    pub dead_lettered: u64,
    pub skipped: u64,
    pub outputs: u64,
    /// Records behind the input partitions' high watermarks, summed.
    pub lag: u64,
    pub last_error: Option<String>,
    pub updated_ms: i64,
    /// The contract version the module was built for (absent from instances
    /// of hosts before 0.2.0).
    #[serde(default)]
    pub contract: Option<String>,
}

impl InstanceStatus {
    pub fn key(&self) -> String {
        format!("{}/{}", self.name, self.instance)
    }
}

/// How long publishing a refusal may take (best effort).
pub const REFUSAL_PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// Reports in `__transform_status` that this instance does not run version
/// `d.version` of `d`, and why (state `refused`). Best effort: a failure is
/// logged.
pub async fn publish_refusal(client: &Client, instance_id: &str, d: &Deployment, reason: &str) {
    let status = InstanceStatus {
        name: d.name.clone(),
        instance: instance_id.to_string(),
        version: d.version,
        state: REFUSED.to_string(),
        last_error: Some(reason.to_string()),
        updated_ms: crate::instance::now_ms(),
        ..InstanceStatus::default()
    };
    let value = serde_json::to_vec(&status).expect("status encodes");
    let send = async {
        let producer = control_producer(client)?;
        producer
            .send_and_wait(ProducerRecord::new(STATUS_TOPIC, value).key(status.key()))
            .await?;
        producer.close().await
    };
    match tokio::time::timeout(REFUSAL_PUBLISH_TIMEOUT, send).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(transform = %d.name, error = %e, "cannot report the refusal"),
        Err(_) => tracing::warn!(transform = %d.name, "reporting the refusal timed out"),
    }
}

/// The state of an instance status that refused a deployment version.
pub const REFUSED: &str = "refused";

/// The latest status of every instance of `name`.
pub async fn load_status(
    client: &Client,
    name: &str,
) -> Result<Vec<InstanceStatus>, TransformError> {
    ensure_internal_topics(client).await?;
    let prefix = format!("{name}/");
    let mut out = Vec::new();
    for (key, r) in read_table(client, STATUS_TOPIC).await? {
        if !key.starts_with(prefix.as_bytes()) {
            continue;
        }
        let s: InstanceStatus = serde_json::from_slice(r.value.as_deref().unwrap_or_default())
            .map_err(|e| {
                TransformError::Decode(format!("a status record of {name} does not decode: {e}"))
            })?;
        out.push(s);
    }
    Ok(out)
}

/// A log line as kept in `__transform_logs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    pub instance: String,
    pub partition: Option<String>,
    #[serde(flatten)]
    pub line: LogLine,
}

/// Every kept log line of `name`, oldest first.
pub async fn load_logs(client: &Client, name: &str) -> Result<Vec<LogRecord>, TransformError> {
    ensure_internal_topics(client).await?;
    let mut out = Vec::new();
    for r in read_to_end(client, &[TopicPartition::new(LOGS_TOPIC, 0)]).await? {
        if r.key.as_deref() != Some(name.as_bytes()) {
            continue;
        }
        if let Ok(l) = serde_json::from_slice::<LogRecord>(r.value.as_deref().unwrap_or_default()) {
            out.push(l);
        }
    }
    Ok(out)
}
