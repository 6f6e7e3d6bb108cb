//! The JSON API under `/api/...`: each handler reads the cluster through
//! rill-client as the matching CLI command does (`rill cluster info`, `rill topic
//! describe`, `rill consume`, `rill group describe|reset-offsets`, `rill transform
//! describe/logs/pause/resume`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::StatusCode;
use rill_client::{
    ClientError, ConsumerConfig, ErrorCode, NewTopic, Offset, OffsetReset, OffsetSpec, ResetSpec,
    TopicPartition,
};
use rill_transforms::deployment::{ErrorPolicy, RunState};
use rill_transforms::error::TransformError;
use rill_transforms::registry::{self, InstanceStatus};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::State;
use crate::http::{ApiError, ApiResult};
use crate::render;
use crate::session::{Who, allowed_each, require, visible};
use rill_client::{AclOperation, AclResource};

/// Topics per page unless `per_page` says otherwise (and at most [`PER_PAGE_MAX`]).
pub(crate) const PER_PAGE: usize = 100;
const PER_PAGE_MAX: usize = 1000;
/// Records per browse unless `limit` says otherwise (and at most [`LIMIT_MAX`]).
const LIMIT: usize = 50;
const LIMIT_MAX: usize = 500;
/// How long a browse waits for records it knows are there.
const BROWSE_WAIT: Duration = Duration::from_secs(5);
/// A live tail sends a comment this often when nothing comes, so a closed page
/// is noticed.
const TAIL_KEEPALIVE: Duration = Duration::from_secs(10);
/// Records a live tail may have queued for a slow page before it waits.
const TAIL_QUEUE: usize = 256;
/// How often an open live tail checks again that its user may still read the
/// topic (its token's expiry ends it at once).
const TAIL_RECHECK: Duration = Duration::from_secs(30);
/// An instance whose status is older than this is shown as gone (as the CLI does).
const STATUS_STALE_MS: i64 = 10_000;
/// Log lines of a transform shown (the newest).
const LOG_LINES_MAX: usize = 200;

/// A client error as the page shows it.
fn client_error(what: &str, e: ClientError) -> ApiError {
    match &e {
        ClientError::UnknownTopic(t) => ApiError::not_found(format!("unknown topic {t}")),
        _ if e.code() == Some(ErrorCode::UnknownTopicOrPartition) => {
            ApiError::not_found(format!("{what}: {e}"))
        }
        _ if e.code() == Some(ErrorCode::GroupIdNotFound) => {
            ApiError::not_found(format!("{what}: no such group"))
        }
        _ if e.code().is_some_and(|c| {
            matches!(
                c,
                ErrorCode::TopicAuthorizationFailed
                    | ErrorCode::GroupAuthorizationFailed
                    | ErrorCode::ClusterAuthorizationFailed
            )
        }) =>
        {
            ApiError::new(StatusCode::FORBIDDEN, format!("{what}: {e}"))
        }
        _ if e.code().is_some_and(|c| {
            matches!(
                c,
                ErrorCode::TopicAlreadyExists
                    | ErrorCode::InvalidTopic
                    | ErrorCode::InvalidPartitions
                    | ErrorCode::InvalidReplicationFactor
                    | ErrorCode::InvalidConfig
                    | ErrorCode::PolicyViolation
            )
        }) =>
        {
            ApiError::bad_request(format!("{what}: {e}"))
        }
        _ => ApiError::new(StatusCode::BAD_GATEWAY, format!("{what}: {e}")),
    }
}

fn transform_error(what: &str, e: TransformError) -> ApiError {
    match e {
        TransformError::Client(c) => client_error(what, c),
        TransformError::Deployment(m) if m.starts_with("no transform named") => {
            ApiError::not_found(m)
        }
        other => ApiError::new(StatusCode::BAD_GATEWAY, format!("{what}: {other}")),
    }
}

async fn client(state: &State) -> Result<rill_client::Client, ApiError> {
    state.client().await.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("cannot connect to the broker: {e}"),
        )
    })
}

fn number<T: std::str::FromStr>(
    q: &HashMap<String, String>,
    key: &str,
) -> Result<Option<T>, ApiError> {
    match q.get(key).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(s) => s
            .parse()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("{key}={s} is not a number"))),
    }
}

/// Metadata from the console's own broker (the one its client bootstrapped
/// from, alive as long as the console is): "any broker" may be one just
/// killed whose connection has not timed out yet.
pub(crate) async fn own_metadata(
    client: &rill_client::Client,
    topics: Option<Vec<String>>,
) -> Result<rill_client::MetadataResponse, ClientError> {
    let req = rill_proto::wire::MetadataRequest { topics };
    let (resp, _) = client
        .call(Some(client.bootstrap_broker_id()), &req, &[])
        .await?;
    Ok(resp)
}

/// `GET /api/cluster`: the cluster id, the controller, the brokers.
pub(crate) async fn cluster(state: &State) -> ApiResult {
    let mut info = own_metadata(&client(state).await?, Some(Vec::new()))
        .await
        .map_err(|e| client_error("cannot read the cluster metadata", e))?;
    info.brokers.sort_by_key(|b| b.id);
    Ok(json!({
        "cluster_id": info.cluster_id,
        "controller_id": info.controller_id,
        "brokers": info.brokers.iter().map(|b| json!({
            "id": b.id,
            "addr": b.addr,
            "rack": b.rack,
            "alive": b.alive,
            "controller": info.controller_id == Some(b.id),
        })).collect::<Vec<_>>(),
    }))
}

/// `GET /api/metrics`: per broker, its version and one point per
/// [`crate::stats::SAMPLE_EVERY`] of the last [`crate::stats::WINDOW`].
pub(crate) fn metrics(state: &State) -> ApiResult {
    let history = state.history.lock().unwrap_or_else(|p| p.into_inner());
    Ok(json!({
        "interval_ms": crate::stats::SAMPLE_EVERY.as_millis() as u64,
        "window_s": crate::stats::WINDOW.as_secs(),
        "brokers": history.brokers.iter().map(|(id, h)| json!({
            "id": id,
            "version": h.version,
            "started_ms": h.started_ms,
            "points": h.points,
        })).collect::<Vec<_>>(),
    }))
}

/// `GET /api/topics?page=N&per_page=M&internal=1&q=TEXT`: one page of the
/// topics (sorted by name), internal ones only when asked.
pub(crate) async fn topics(state: &State, q: &HashMap<String, String>, who: &Who) -> ApiResult {
    let page: usize = number(q, "page")?.unwrap_or(0);
    let per_page: usize = number(q, "per_page")?
        .unwrap_or(PER_PAGE)
        .clamp(1, PER_PAGE_MAX);
    let internal = q.get("internal").is_some_and(|v| v == "1" || v == "true");
    let filter = q
        .get("q")
        .map(|s| s.trim().to_lowercase())
        .unwrap_or_default();
    let meta = own_metadata(&client(state).await?, None)
        .await
        .map_err(|e| client_error("cannot list topics", e))?;
    let topics: Vec<_> = meta
        .topics
        .into_iter()
        .filter(|t| t.error.is_none())
        .filter(|t| internal || !(t.internal || t.name.starts_with("__")))
        .filter(|t| filter.is_empty() || t.name.to_lowercase().contains(&filter))
        .collect();
    let mut topics = visible(state, who, topics, |t| AclResource::Topic(t.name.clone())).await?;
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    let total = topics.len();
    let rows: Vec<Value> = topics
        .iter()
        .skip(page.saturating_mul(per_page))
        .take(per_page)
        .map(|t| {
            let under = t
                .partitions
                .iter()
                .filter(|p| p.isr.len() < p.replicas.len())
                .count();
            let offline = t.partitions.iter().filter(|p| p.leader.is_none()).count();
            json!({
                "name": t.name,
                "internal": t.internal || t.name.starts_with("__"),
                "partitions": t.partitions.len(),
                "replication_factor": t.partitions.first().map_or(0, |p| p.replicas.len()),
                "under_replicated": under,
                "offline": offline,
            })
        })
        .collect();
    Ok(json!({ "total": total, "page": page, "per_page": per_page, "topics": rows }))
}

/// `GET /api/topics/NAME?page=N&per_page=M`: one page of its partitions
/// (leader, replicas, ISR, offsets, sizes), counts over all of them, and its
/// configs.
pub(crate) async fn topic(state: &State, name: &str, q: &HashMap<String, String>) -> ApiResult {
    let page: usize = number(q, "page")?.unwrap_or(0);
    let per_page: usize = number(q, "per_page")?
        .unwrap_or(PER_PAGE)
        .clamp(1, PER_PAGE_MAX);
    let client = client(state).await?;
    let admin = client.admin();
    let what = format!("cannot describe topic {name}");
    let t = admin
        .describe_topic(name)
        .await
        .map_err(|e| client_error(&what, e))?;
    // Sizes, local and tiered, where the broker reports them.
    let storage: BTreeMap<u32, rill_proto::wire::PartitionStorage> =
        match admin.describe_storage(name).await {
            Ok(Some(s)) => s
                .partitions
                .into_iter()
                .filter(|p| p.error.is_none() && p.topic == name)
                .map(|p| (p.partition, p))
                .collect(),
            _ => BTreeMap::new(),
        };
    let under = t
        .partitions
        .iter()
        .filter(|p| p.isr.len() < p.replicas.len())
        .count();
    let offline = t.partitions.iter().filter(|p| p.leader.is_none()).count();
    // Offsets from each partition's leader (a Metadata answer has only the
    // answering broker's own replicas' offsets).
    let led: Vec<TopicPartition> = t
        .partitions
        .iter()
        .filter(|p| p.leader.is_some())
        .map(|p| TopicPartition::new(name, p.partition))
        .collect();
    let (starts, ends) = leader_offsets(&client, &led).await;
    let records: i64 = ends
        .iter()
        .map(|(p, end)| (end - starts.get(p).copied().unwrap_or(0)).max(0))
        .sum();
    let partitions: Vec<Value> = t
        .partitions
        .iter()
        .skip(page.saturating_mul(per_page))
        .take(per_page)
        .map(|p| {
            let s = storage.get(&p.partition);
            json!({
                "partition": p.partition,
                "leader": p.leader,
                "replicas": p.replicas,
                "isr": p.isr,
                "under_replicated": p.isr.len() < p.replicas.len(),
                "log_start_offset": starts.get(&p.partition),
                "log_end_offset": ends.get(&p.partition),
                "local_bytes": s.map(|s| s.local_size_bytes),
                "remote_bytes": s.map(|s| s.remote_size_bytes),
            })
        })
        .collect();
    let mut configs: Vec<Value> = t
        .configs
        .iter()
        .map(|c| json!({ "name": c.name, "value": c.value, "default": c.is_default }))
        .collect();
    configs.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Ok(json!({
        "name": t.name,
        "internal": t.name.starts_with("__"),
        "replication_factor": t.replication_factor,
        "partition_count": t.partitions.len(),
        "under_replicated": under,
        "offline": offline,
        "records": records,
        "page": page,
        "per_page": per_page,
        "partitions": partitions,
        "configs": configs,
    }))
}

/// `POST /api/topics/NAME/configs` `{"set": {"KEY": "VALUE"}, "delete": ["KEY"]}`:
/// sets and removes topic configs (a removed key goes back to the broker default).
pub(crate) async fn alter_configs(state: &State, name: &str, body: &Value) -> ApiResult {
    let mut set = Vec::new();
    if let Some(map) = body["set"].as_object() {
        for (k, v) in map {
            let v = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                other => {
                    return Err(ApiError::bad_request(format!(
                        "config {k}: {other} is not a value (a string or a number)"
                    )));
                }
            };
            set.push((k.trim().to_string(), v));
        }
    }
    let delete: Vec<String> = body["delete"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|k| k.as_str().map(|k| k.trim().to_string()))
                .collect()
        })
        .unwrap_or_default();
    if set.is_empty() && delete.is_empty() || set.iter().any(|(k, _)| k.is_empty()) {
        return Err(ApiError::bad_request(
            "nothing to change: give {\"set\": {\"KEY\": \"VALUE\"}} or {\"delete\": [\"KEY\"]}",
        ));
    }
    client(state)
        .await?
        .admin()
        .alter_configs(name, set.clone(), delete.clone())
        .await
        .map_err(|e| client_error(&format!("cannot alter configs of topic {name}"), e))?;
    Ok(
        json!({ "topic": name, "set": set.into_iter().collect::<BTreeMap<_, _>>(), "deleted": delete }),
    )
}

/// The first offset and the end (high watermark) of each of `tps` (one topic's),
/// by partition, from their leaders; left out where a leader did not answer.
async fn leader_offsets(
    client: &rill_client::Client,
    tps: &[TopicPartition],
) -> (BTreeMap<u32, i64>, BTreeMap<u32, i64>) {
    if tps.is_empty() {
        return (BTreeMap::new(), BTreeMap::new());
    }
    let ask = |spec| async move {
        match client.list_offsets(tps, spec).await {
            Ok(v) => v.into_iter().map(|(tp, o)| (tp.partition, o.0)).collect(),
            Err(e) => {
                tracing::debug!(error = %e, "console: offsets unavailable");
                BTreeMap::new()
            }
        }
    };
    tokio::join!(ask(OffsetSpec::Earliest), ask(OffsetSpec::Latest))
}

/// `POST /api/topics` `{"name", "partitions", "replication_factor"}`.
pub(crate) async fn create_topic(state: &State, body: &Value) -> ApiResult {
    let name = body["name"].as_str().unwrap_or("").trim().to_string();
    if name.is_empty() {
        return Err(ApiError::bad_request("a topic needs a name"));
    }
    if name.starts_with("__") {
        return Err(ApiError::bad_request(format!(
            "cannot create topic {name}: names starting with __ are Rill's internal topics"
        )));
    }
    let count = |key: &str| -> Result<Option<u64>, ApiError> {
        match &body[key] {
            Value::Null => Ok(None),
            Value::String(s) if s.trim().is_empty() => Ok(None),
            Value::String(s) => s
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("{key} {s:?} is not a number"))),
            v => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| ApiError::bad_request(format!("{key} {v} is not a number"))),
        }
    };
    let partitions = count("partitions")?
        .map(|n| u32::try_from(n).map_err(|_| ApiError::bad_request("too many partitions")))
        .transpose()?;
    let replication_factor = count("replication_factor")?
        .map(|n| u16::try_from(n).map_err(|_| ApiError::bad_request("replication factor too big")))
        .transpose()?;
    client(state)
        .await?
        .admin()
        .create_topic(NewTopic {
            name: name.clone(),
            partitions,
            replication_factor,
            configs: Vec::new(),
        })
        .await
        .map_err(|e| client_error(&format!("cannot create topic {name}"), e))?;
    Ok(json!({ "created": name }))
}

/// `GET /api/topics/NAME/records?partition=P&offset=O&timestamp=MS&limit=N`:
/// up to N records of one partition from offset O (default: the first kept) or
/// from the first at or after MS.
pub(crate) async fn records(state: &State, name: &str, q: &HashMap<String, String>) -> ApiResult {
    let partition: u32 = number(q, "partition")?.unwrap_or(0);
    let from: Option<i64> = number(q, "offset")?;
    let at: Option<i64> = number(q, "timestamp")?;
    let limit: usize = number(q, "limit")?.unwrap_or(LIMIT).clamp(1, LIMIT_MAX);
    let client = client(state).await?;
    let what = format!("cannot read topic {name}");
    let meta = client
        .metadata(Some(vec![name.to_string()]))
        .await
        .map_err(|e| client_error(&what, e))?;
    let t = meta
        .topics
        .into_iter()
        .find(|t| t.name == name)
        .ok_or_else(|| ApiError::not_found(format!("unknown topic {name}")))?;
    if t.error
        .as_ref()
        .is_some_and(|e| e.code == ErrorCode::UnknownTopicOrPartition)
    {
        return Err(ApiError::not_found(format!("unknown topic {name}")));
    }
    let p = t
        .partitions
        .iter()
        .find(|p| p.partition == partition)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "topic {name} has no partition {partition} (it has {})",
                t.partitions.len()
            ))
        })?;
    let tp = TopicPartition::new(name, partition);
    if p.leader.is_none() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{what}: partition {partition} has no leader (its replicas are down)"),
        ));
    }
    let (starts, ends) = leader_offsets(&client, std::slice::from_ref(&tp)).await;
    let (Some(&start), Some(&end)) = (starts.get(&partition), ends.get(&partition)) else {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!("{what}: the leader of partition {partition} did not tell its offsets"),
        ));
    };
    let mut consumer = client
        .consumer(ConsumerConfig {
            fetch_max_wait: Duration::from_millis(200),
            auto_offset_reset: OffsetReset::Earliest,
            ..ConsumerConfig::default()
        })
        .map_err(|e| client_error(&what, e))?;
    consumer.assign(vec![tp.clone()]);
    if let Some(ms) = at {
        consumer
            .seek_to_timestamp(ms)
            .await
            .map_err(|e| client_error(&what, e))?;
    } else {
        let offset = from.unwrap_or(start).clamp(start, end.max(start));
        consumer
            .seek(&tp, Offset(offset))
            .map_err(|e| client_error(&what, e))?;
    }
    let first = consumer
        .position(&tp)
        .await
        .map_err(|e| client_error(&what, e))?
        .0;
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + BROWSE_WAIT;
    let mut next = first;
    while out.len() < limit && next < end && tokio::time::Instant::now() < deadline {
        let batch = consumer
            .poll(Duration::from_millis(500))
            .await
            .map_err(|e| client_error(&what, e))?;
        let mut cut = false;
        for r in batch {
            if out.len() == limit {
                cut = true;
                break;
            }
            next = r.offset.0 + 1;
            out.push(render::record(&r));
        }
        // Past what the poll skipped (transaction markers, compacted gaps),
        // unless the page is full before the batch's end.
        if !cut && let Some(pos) = consumer.current_position(&tp) {
            next = next.max(pos.0);
        }
    }
    Ok(json!({
        "topic": name,
        "partition": partition,
        "partitions": t.partitions.len(),
        "log_start_offset": start,
        "log_end_offset": end,
        "from": first,
        "next": next,
        "records": out,
    }))
}

/// `GET /api/topics/NAME/tail`: a stream (Server-Sent Events) of the records
/// produced to every partition from now on. An `event: ready` tells the page
/// the tail reads from the end; each record is a `data:` line of JSON.
pub(crate) async fn tail(
    state: Arc<State>,
    name: &str,
    who: Who,
) -> Result<mpsc::Receiver<Bytes>, ApiError> {
    let client = client(&state).await?;
    let what = format!("cannot tail topic {name}");
    let mut consumer = client
        .consumer(ConsumerConfig {
            fetch_max_wait: Duration::from_millis(500),
            ..ConsumerConfig::default()
        })
        .map_err(|e| client_error(&what, e))?;
    let tps = tokio::time::timeout(crate::REQUEST_TIMEOUT, async {
        let tps = consumer.assign_topic(name).await?;
        consumer.seek_to_end(&tps).await?;
        for tp in &tps {
            consumer.position(tp).await?;
        }
        Ok::<_, ClientError>(tps)
    })
    .await
    .map_err(|_| ApiError::new(StatusCode::GATEWAY_TIMEOUT, format!("{what}: timed out")))?
    .map_err(|e| client_error(&what, e))?;
    let (tx, rx) = mpsc::channel(TAIL_QUEUE);
    let mut stop = state.stop.clone();
    let topic = name.to_string();
    tokio::spawn(async move {
        let ready = format!(
            "event: ready\ndata: {}\n\n",
            json!({ "topic": topic, "partitions": tps.len() })
        );
        if tx.send(Bytes::from(ready)).await.is_err() {
            return;
        }
        let mut quiet_since = tokio::time::Instant::now();
        let mut checked = tokio::time::Instant::now();
        let end = |why: String| {
            let event = format!("event: failure\ndata: {}\n\n", json!({ "error": why }));
            Bytes::from(event)
        };
        loop {
            // The user's rights hold for as long as the tail: its token's
            // expiry ends it, and the ACLs are asked again now and then.
            if who.expired() {
                let _ = tx
                    .send(end("the sign-in expired; sign in again".into()))
                    .await;
                return;
            }
            if checked.elapsed() >= TAIL_RECHECK {
                checked = tokio::time::Instant::now();
                let read = vec![(AclOperation::Read, AclResource::Topic(topic.clone()))];
                if let Err(e) = require(&state, &who, read).await {
                    let _ = tx.send(end(e.message)).await;
                    return;
                }
            }
            let polled = tokio::select! {
                _ = stop.changed() => return,
                _ = tx.closed() => return,
                r = consumer.poll(Duration::from_secs(1)) => r,
            };
            match polled {
                Ok(records) if records.is_empty() => {
                    if quiet_since.elapsed() >= TAIL_KEEPALIVE {
                        if tx.send(Bytes::from_static(b": ping\n\n")).await.is_err() {
                            return;
                        }
                        quiet_since = tokio::time::Instant::now();
                    }
                }
                Ok(records) => {
                    quiet_since = tokio::time::Instant::now();
                    for r in &records {
                        let event = format!("data: {}\n\n", render::record(r));
                        if tx.send(Bytes::from(event)).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let event = format!(
                        "event: failure\ndata: {}\n\n",
                        json!({ "error": format!("cannot tail topic {topic}: {e}") })
                    );
                    let _ = tx.send(Bytes::from(event)).await;
                    // Leadership moves and the like pass: keep reading.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    });
    Ok(rx)
}

/// `GET /api/groups`: every group (id, state, members).
pub(crate) async fn groups(state: &State, who: &Who) -> ApiResult {
    let groups = client(state)
        .await?
        .admin()
        .list_groups()
        .await
        .map_err(|e| client_error("cannot list groups", e))?;
    let mut groups = visible(state, who, groups, |g| {
        AclResource::Group(g.group_id.clone())
    })
    .await?;
    groups.sort_by(|a, b| a.group_id.cmp(&b.group_id));
    Ok(json!({
        "groups": groups.iter().map(|g| json!({
            "group_id": g.group_id,
            "state": g.state,
            "members": g.members,
        })).collect::<Vec<_>>(),
    }))
}

/// `GET /api/groups/ID`: members, their partitions, and per partition the
/// committed offset, log end offset and lag.
pub(crate) async fn group(state: &State, id: &str, who: &Who) -> ApiResult {
    let what = format!("cannot describe group {id}");
    let mut g = client(state)
        .await?
        .admin()
        .describe_group(id)
        .await
        .map_err(|e| client_error(&what, e))?;
    if g.state == "Dead" {
        return Err(ApiError::not_found(format!("{what}: no such group")));
    }
    // Offsets, lag and assignments of topics the user may not describe are
    // left out (the describe ran with the console's own rights).
    let mut topics: Vec<String> = g
        .partitions
        .iter()
        .map(|p| p.tp.topic.clone())
        .chain(
            g.members
                .iter()
                .flat_map(|m| m.assignment.iter().chain(&m.revoking))
                .map(|tp| tp.topic.clone()),
        )
        .collect();
    topics.sort();
    topics.dedup();
    let checks = topics
        .iter()
        .map(|t| (AclOperation::Describe, AclResource::Topic(t.clone())))
        .collect();
    let allowed = allowed_each(state, who, checks).await?;
    let hidden: std::collections::HashSet<&str> = topics
        .iter()
        .zip(&allowed)
        .filter_map(|(t, denied)| denied.is_some().then_some(t.as_str()))
        .collect();
    g.partitions
        .retain(|p| !hidden.contains(p.tp.topic.as_str()));
    for m in &mut g.members {
        m.assignment
            .retain(|tp| !hidden.contains(tp.topic.as_str()));
        m.revoking.retain(|tp| !hidden.contains(tp.topic.as_str()));
    }
    let list = |tps: &[TopicPartition]| tps.iter().map(|t| t.to_string()).collect::<Vec<_>>();
    let total_lag: i64 = g.partitions.iter().filter_map(|p| p.lag).sum();
    Ok(json!({
        "group_id": g.group_id,
        "state": g.state,
        "epoch": g.group_epoch,
        "assignor": g.assignor,
        "coordinator": g.coordinator,
        "total_lag": total_lag,
        "members": g.members.iter().map(|m| json!({
            "member_id": m.member_id,
            "instance_id": m.instance_id,
            "client_id": m.client_id,
            "epoch": m.member_epoch,
            "assignment": list(&m.assignment),
            "revoking": list(&m.revoking),
            "left": m.left,
        })).collect::<Vec<_>>(),
        "partitions": g.partitions.iter().map(|p| json!({
            "topic": p.tp.topic,
            "partition": p.tp.partition,
            "member_id": p.member_id,
            "committed": p.committed.map(|o| o.0),
            "log_end_offset": p.log_end_offset.map(|o| o.0),
            "lag": p.lag,
        })).collect::<Vec<_>>(),
    }))
}

/// What `POST /api/groups/ID/reset-offsets` asks for, from its body
/// `{"topic": "T", "to": "earliest"|"latest"|"offset"|"timestamp", "value": N}`:
/// the topic and where to move the group's committed offsets. `value` (a whole
/// number >= 0, or a string of one) is the offset or the time in milliseconds
/// since the Unix epoch, and is given for those two targets only.
pub(crate) fn parse_reset(body: &Value) -> Result<(String, ResetSpec), ApiError> {
    const TARGETS: &str = "\"earliest\", \"latest\", \"offset\" or \"timestamp\"";
    if !body.is_object() {
        return Err(ApiError::bad_request(format!(
            "the body must be a JSON object {{\"topic\": \"...\", \"to\": {TARGETS}, \"value\": N}}, \
             not {body}"
        )));
    }
    let topic = match &body["topic"] {
        Value::String(s) if !s.trim().is_empty() => s.trim().to_string(),
        Value::Null | Value::String(_) => {
            return Err(ApiError::bad_request(
                "topic is missing: name the topic whose committed offsets to reset",
            ));
        }
        v => {
            return Err(ApiError::bad_request(format!(
                "topic {v} is not a topic name (a string)"
            )));
        }
    };
    let to = match &body["to"] {
        Value::String(s) => s.trim().to_ascii_lowercase(),
        Value::Null => {
            return Err(ApiError::bad_request(format!(
                "to is missing: say where to reset the offsets, {TARGETS}"
            )));
        }
        v => {
            return Err(ApiError::bad_request(format!(
                "to {v} is not a target: give {TARGETS}"
            )));
        }
    };
    // The value, if one is given (null and "" are none).
    let value: Option<i64> =
        match &body["value"] {
            Value::Null => None,
            Value::String(s) if s.trim().is_empty() => None,
            Value::String(s) => Some(s.trim().parse().map_err(|_| {
                ApiError::bad_request(format!("value {s:?} is not a whole number"))
            })?),
            v => Some(v.as_i64().ok_or_else(|| {
                ApiError::bad_request(format!("value {v} is not a whole number"))
            })?),
        };
    let needed = |what: &str| -> Result<i64, ApiError> {
        match value {
            None => Err(ApiError::bad_request(format!(
                "value is missing: a reset to {to} needs the {what}"
            ))),
            Some(n) if n < 0 => Err(ApiError::bad_request(format!(
                "value {n} is negative: the {what} must be >= 0"
            ))),
            Some(n) => Ok(n),
        }
    };
    let spec = match to.as_str() {
        "earliest" | "latest" => {
            if let Some(n) = value {
                return Err(ApiError::bad_request(format!(
                    "value {n} is given for a reset to {to}: a value goes only with \"offset\" \
                     or \"timestamp\""
                )));
            }
            if to == "earliest" {
                ResetSpec::Earliest
            } else {
                ResetSpec::Latest
            }
        }
        "offset" => ResetSpec::Offset(Offset(needed("offset")?)),
        "timestamp" => ResetSpec::Timestamp(needed("time in milliseconds since the Unix epoch")?),
        other => {
            return Err(ApiError::bad_request(format!(
                "to {other:?} is not a target: give {TARGETS}"
            )));
        }
    };
    Ok((topic, spec))
}

/// The broker's own error (`CODE: message`) inside `e`, if it answered with one.
fn broker_said(e: &ClientError) -> Option<String> {
    match e {
        ClientError::Broker { error, .. } => Some(error.to_string()),
        ClientError::Shared(inner) => broker_said(inner),
        ClientError::Failed { source, .. } => broker_said(source),
        _ => None,
    }
}

/// `POST /api/groups/ID/reset-offsets` (body: see [`parse_reset`]): moves the
/// group's committed offsets of every partition of the topic, as `rill group
/// reset-offsets` does; the new offsets, by partition. The coordinator refuses
/// (409 here) while the group has members.
pub(crate) async fn reset_offsets(state: &State, id: &str, body: &Value) -> ApiResult {
    let (topic, to) = parse_reset(body)?;
    let what = format!("cannot reset the offsets of group {id} on topic {topic}");
    let admin = client(state).await?.admin();
    // Only a group that exists: a typo must not make a new group.
    let g = admin
        .describe_group(id)
        .await
        .map_err(|e| client_error(&what, e))?;
    if g.state == "Dead" {
        return Err(ApiError::not_found(format!("{what}: no such group")));
    }
    let offsets = admin.reset_offsets(id, &topic, to).await.map_err(|e| {
        if e.code() == Some(ErrorCode::NonEmptyGroup) {
            let said = broker_said(&e).unwrap_or_else(|| e.to_string());
            ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "{what}: the group has live members; stop its consumers first \
                         (or wait for their session timeout). {said}"
                ),
            )
        } else {
            client_error(&what, e)
        }
    })?;
    Ok(json!({
        "group": id,
        "topic": topic,
        "offsets": offsets.iter().map(|(tp, o)| json!({
            "partition": tp.partition,
            "offset": o.0,
        })).collect::<Vec<_>>(),
    }))
}

/// Every instance status, by transform name.
async fn all_status(
    client: &rill_client::Client,
) -> Result<BTreeMap<String, Vec<InstanceStatus>>, TransformError> {
    registry::ensure_internal_topics(client).await?;
    let mut out: BTreeMap<String, Vec<InstanceStatus>> = BTreeMap::new();
    for (_, r) in registry::read_table(client, registry::STATUS_TOPIC).await? {
        if let Ok(s) = serde_json::from_slice::<InstanceStatus>(r.value.as_deref().unwrap_or(&[])) {
            out.entry(s.name.clone()).or_default().push(s);
        }
    }
    Ok(out)
}

/// The state word of a deployment (`halted` without its reason).
fn state_word(s: &RunState) -> &'static str {
    match s {
        RunState::Running => "running",
        RunState::Paused => "paused",
        RunState::Halted { .. } => "halted",
    }
}

/// Processed, failed and lag summed over the instances (lag of live running
/// ones only, as `rill transform describe` counts it).
fn totals(status: &[InstanceStatus], now: i64) -> Value {
    let (mut processed, mut failed, mut dead, mut lag) = (0u64, 0u64, 0u64, 0u64);
    for s in status {
        processed += s.processed;
        failed += s.failed;
        dead += s.dead_lettered;
        if now - s.updated_ms <= STATUS_STALE_MS && s.state == "running" {
            lag += s.lag;
        }
    }
    json!({ "processed": processed, "failed": failed, "dead_lettered": dead, "lag": lag })
}

/// `GET /api/transforms`: every deployment with its instances' totals.
pub(crate) async fn transforms(state: &State, who: &Who) -> ApiResult {
    let client = client(state).await?;
    let what = "cannot list transforms";
    let all = registry::load_deployments(&client)
        .await
        .map_err(|e| transform_error(what, e))?;
    let all = visible(state, who, all.into_values().collect(), |d| {
        AclResource::Transform(d.name.clone())
    })
    .await?;
    let status = all_status(&client)
        .await
        .map_err(|e| transform_error(what, e))?;
    let now = rill_transforms::instance::now_ms();
    let rows: Vec<Value> = all
        .iter()
        .map(|d| {
            let st = status.get(&d.name).map(Vec::as_slice).unwrap_or(&[]);
            let live = st
                .iter()
                .filter(|s| now - s.updated_ms <= STATUS_STALE_MS && s.state == "running")
                .count();
            json!({
                "name": d.name,
                "version": d.version,
                "state": state_word(&d.state),
                "inputs": d.inputs,
                "outputs": d.outputs,
                "instances": live,
                "totals": totals(st, now),
                "last_error": st.iter().filter_map(|s| s.last_error.clone()).next_back(),
            })
        })
        .collect();
    Ok(json!({ "transforms": rows }))
}

/// `GET /api/transforms/NAME`: the deployment, its instances and its recent logs.
pub(crate) async fn transform(state: &State, name: &str) -> ApiResult {
    let client = client(state).await?;
    let what = format!("cannot describe transform {name}");
    let d = registry::load_deployment(&client, name)
        .await
        .map_err(|e| transform_error(&what, e))?;
    let status = registry::load_status(&client, name)
        .await
        .map_err(|e| transform_error(&what, e))?;
    let logs = registry::load_logs(&client, name)
        .await
        .map_err(|e| transform_error(&what, e))?;
    let now = rill_transforms::instance::now_ms();
    let skip = logs.len().saturating_sub(LOG_LINES_MAX);
    Ok(json!({
        "name": d.name,
        "version": d.version,
        "state": state_word(&d.state),
        "halted_reason": match &d.state { RunState::Halted { reason } => Some(reason.clone()), _ => None },
        "runs_as": d.owner,
        "inputs": d.inputs,
        "outputs": d.outputs,
        "on_error": d.on_error.to_string(),
        "dead_letter_topic": (d.on_error == ErrorPolicy::DeadLetter).then(|| d.dlq_topic()),
        "delivery": d.delivery.to_string(),
        "group": d.group_id(),
        "module_bytes": d.module.len(),
        "deployed_at_ms": d.deployed_at_ms,
        "totals": totals(&status, now),
        "instances": status.iter().map(|s| {
            let live = now - s.updated_ms <= STATUS_STALE_MS;
            json!({
                "instance": s.instance,
                "version": s.version,
                "state": if live || s.state != "running" { s.state.clone() } else { "gone".into() },
                "partitions": s.partitions,
                "processed": s.processed,
                "failed": s.failed,
                "dead_lettered": s.dead_lettered,
                "skipped": s.skipped,
                "outputs": s.outputs,
                "lag": s.lag,
                "last_error": s.last_error,
                "updated_ms": s.updated_ms,
            })
        }).collect::<Vec<_>>(),
        "logs": logs.iter().skip(skip).map(|l| json!({
            "timestamp_ms": l.line.timestamp_ms,
            "level": l.line.level,
            "instance": l.instance,
            "partition": l.partition,
            "message": l.line.message,
        })).collect::<Vec<_>>(),
    }))
}

/// `POST /api/transforms/NAME/pause` and `.../resume`. The deployment is
/// stored again naming the principal it ran as, so the console (which
/// connects as its broker) does not change whose rights it runs with.
pub(crate) async fn set_transform_state(
    state: &State,
    name: &str,
    pause: bool,
    who: &Who,
) -> ApiResult {
    let client = client(state).await?;
    let verb = if pause { "pause" } else { "resume" };
    let what = format!("cannot {verb} transform {name}");
    let mut d = registry::load_deployment(&client, name)
        .await
        .map_err(|e| transform_error(&what, e))?;
    // What the broker checks for the same TransformWrite: alter on the
    // transform (checked by the route), read on its inputs, write on what it
    // writes (its outputs, and its dead-letter topic when failed records go there).
    let mut checks: Vec<_> = d
        .inputs
        .iter()
        .map(|t| (AclOperation::Read, AclResource::Topic(t.clone())))
        .collect();
    let mut written = d.outputs.clone();
    if d.on_error == ErrorPolicy::DeadLetter {
        written.push(d.dlq_topic());
    }
    checks.extend(
        written
            .into_iter()
            .map(|t| (AclOperation::Write, AclResource::Topic(t))),
    );
    require(state, who, checks).await?;
    let want = if pause {
        RunState::Paused
    } else {
        RunState::Running
    };
    if d.state == want {
        return Ok(json!({ "name": d.name, "state": state_word(&d.state), "changed": false }));
    }
    let Some(owner) = d.owner.clone() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "{what}: it records no principal to run as (deployed by an older Rill); \
                 use `rill transform {verb} {name}`"
            ),
        ));
    };
    d.state = want;
    registry::store_deployment(&client, &d, Some(owner))
        .await
        .map_err(|e| transform_error(&what, e))?;
    Ok(json!({ "name": d.name, "state": state_word(&d.state), "changed": true }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(body: Value) -> (String, ResetSpec) {
        parse_reset(&body).unwrap_or_else(|e| panic!("{body}: {}", e.message))
    }

    /// The 400's message, which must start by naming the field (`start`).
    fn refused(body: Value, start: &str) -> String {
        let e = parse_reset(&body).expect_err(&body.to_string());
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}: {}", e.message);
        assert!(e.message.starts_with(start), "{body}: {}", e.message);
        e.message
    }

    #[test]
    fn a_reset_body_gives_the_topic_and_the_target() {
        let t = || "orders".to_string();
        assert_eq!(
            ok(json!({"topic": "orders", "to": "earliest"})),
            (t(), ResetSpec::Earliest)
        );
        assert_eq!(
            ok(json!({"topic": " orders ", "to": "Latest", "value": null})),
            (t(), ResetSpec::Latest)
        );
        assert_eq!(
            ok(json!({"topic": "orders", "to": "offset", "value": 42})),
            (t(), ResetSpec::Offset(Offset(42)))
        );
        assert_eq!(
            ok(json!({"topic": "orders", "to": "offset", "value": " 0 "})),
            (t(), ResetSpec::Offset(Offset(0)))
        );
        assert_eq!(
            ok(json!({"topic": "orders", "to": "timestamp", "value": 1_767_225_600_000_i64})),
            (t(), ResetSpec::Timestamp(1_767_225_600_000))
        );
        assert_eq!(
            ok(json!({"topic": "orders", "to": "earliest", "value": ""})),
            (t(), ResetSpec::Earliest)
        );
    }

    #[test]
    fn a_bad_reset_body_is_refused_naming_the_field() {
        refused(
            json!(["orders", "earliest"]),
            "the body must be a JSON object",
        );
        refused(json!({"to": "earliest"}), "topic is missing");
        refused(json!({"topic": "  ", "to": "earliest"}), "topic is missing");
        refused(json!({"topic": 7, "to": "earliest"}), "topic 7 ");
        let m = refused(json!({"topic": "orders"}), "to is missing");
        assert!(
            m.contains("\"earliest\"") && m.contains("\"timestamp\""),
            "{m}"
        );
        refused(
            json!({"topic": "orders", "to": "sideways"}),
            "to \"sideways\" ",
        );
        refused(json!({"topic": "orders", "to": 3}), "to 3 ");
        refused(
            json!({"topic": "orders", "to": "offset"}),
            "value is missing",
        );
        let m = refused(
            json!({"topic": "orders", "to": "timestamp", "value": ""}),
            "value is missing",
        );
        assert!(m.contains("milliseconds"), "{m}");
        refused(
            json!({"topic": "orders", "to": "offset", "value": -1}),
            "value -1 ",
        );
        refused(
            json!({"topic": "orders", "to": "timestamp", "value": -5}),
            "value -5 ",
        );
        refused(
            json!({"topic": "orders", "to": "offset", "value": 1.5}),
            "value 1.5 ",
        );
        refused(
            json!({"topic": "orders", "to": "offset", "value": "ten"}),
            "value \"ten\" ",
        );
        refused(
            json!({"topic": "orders", "to": "offset", "value": true}),
            "value true ",
        );
        refused(
            json!({"topic": "orders", "to": "latest", "value": 3}),
            "value 3 ",
        );
    }
}
