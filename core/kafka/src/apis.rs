//! The Kafka apis this listener serves, each translated into Rill's typed
//! request, served through the broker's router, and translated back.
//!
//! [`SUPPORTED`] is the one table of apis and versions: ApiVersions answers it
//! and the frame loop refuses anything outside it. The ranges are those whose
//! fields we fill: Fetch stops at v12, so a client names topics by name there
//! (Metadata answers the topics' ids, which DeleteTopics v6 accepts); Produce starts at v3 (record batch v2, the
//! layout of our log).
//!
//! What a Kafka request names that Rill has no notion of is answered as Kafka
//! answers a broker without the feature: fetch sessions are never created
//! (session id 0: every fetch is a full one). Transactions: see [`crate::txn`];
//! a `read_committed` fetch (isolation level 1) reads below the last stable
//! offset and lists the aborted transactions in range, as Kafka's does.

use crate::codes::{kafka, to_kafka};
use crate::groups;
use crate::{Closed, Shared, encode_response};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages as km;
use kafka_protocol::messages::{ApiKey, BrokerId, TopicName};
use kafka_protocol::protocol::{Decodable, StrBytes};
use rill_broker::front_door::Caller;
use rill_proto::types::{LeaderEpoch, Offset};
use rill_proto::wire as rw;
use rill_proto::wire::{ErrorCode, ErrorInfo};
use std::collections::{BTreeMap, HashMap};
use std::ops::RangeInclusive;
use std::sync::Arc;

/// Every api this listener serves, with the versions it speaks.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    // (Version 7 adds the max-timestamp spec, -3, which the log does not answer.)
    (ApiKey::ListOffsets, 1, 6),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::DescribeCluster, 0, 1),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 6),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::DescribeTransactions, 0, 0),
    // (Version 2 adds a transactional id pattern, not served.)
    (ApiKey::ListTransactions, 0, 1),
];

/// The versions of `key` this listener speaks, if any.
pub fn supported(key: ApiKey) -> Option<RangeInclusive<i16>> {
    SUPPORTED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, min, max)| *min..=*max)
}

/// Where Kafka clients reach this broker: host and port.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub host: String,
    pub port: i32,
}

impl Endpoint {
    /// Parses `host:port` (`[v6]:port` too).
    pub fn parse(addr: &str) -> Option<Endpoint> {
        let (host, port) = addr.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return None;
        }
        Some(Endpoint {
            host: host.to_string(),
            port: i32::from(port),
        })
    }
}

/// The brokers Kafka clients are told of, by id: every live broker whose
/// Kafka address is in the metadata image, and this broker itself at its own
/// endpoint (known even before its registration commits, or when its port
/// was chosen at bind and so never registered).
fn kafka_brokers(shared: &Shared) -> BTreeMap<i32, Endpoint> {
    let mut brokers: BTreeMap<i32, Endpoint> = shared
        .front
        .kafka_addresses()
        .into_iter()
        .filter_map(|(id, addr)| Some((id, Endpoint::parse(&addr)?)))
        .collect();
    brokers.insert(shared.front.config().id, shared.endpoint.clone());
    brokers
}

pub(crate) fn sb(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

fn topic_name(s: &str) -> TopicName {
    TopicName(sb(s))
}

pub(crate) fn message(info: &ErrorInfo) -> Option<StrBytes> {
    Some(sb(info.message.clone()))
}

pub(crate) fn code(error: &Option<ErrorInfo>) -> i16 {
    error.as_ref().map_or(kafka::NONE, |e| to_kafka(e.code))
}

/// The error a call failed with, or `INTERNAL_ERROR` if a call that must
/// answer did not.
pub(crate) fn failed(api: &str) -> ErrorInfo {
    ErrorInfo::new(
        ErrorCode::InternalError,
        format!("{api}: the broker gave no answer"),
    )
}

/// The ApiVersions response body (the caller sets the error code).
pub fn api_versions_response(response: km::ApiVersionsResponse) -> km::ApiVersionsResponse {
    let keys = SUPPORTED
        .iter()
        .map(|(k, min, max)| {
            km::api_versions_response::ApiVersion::default()
                .with_api_key(*k as i16)
                .with_min_version(*min)
                .with_max_version(*max)
        })
        .collect();
    response.with_api_keys(keys)
}

fn decode<R: Decodable>(key: ApiKey, version: i16, body: &mut Bytes) -> Result<R, Closed> {
    R::decode(body, version)
        .map_err(|e| Closed::Because(format!("malformed {key:?} v{version} request: {e}")))
}

/// Serves one decoded-header request: its response frame, or `None` for no
/// response (Produce with acks=0).
pub(crate) async fn serve(
    shared: &Shared,
    caller: &Arc<Caller>,
    key: ApiKey,
    version: i16,
    header: &km::RequestHeader,
    mut body: Bytes,
) -> Result<Option<Bytes>, Closed> {
    let correlation_id = header.correlation_id;
    let client_id = header
        .client_id
        .as_ref()
        .map(|c| c.to_string())
        .unwrap_or_default();
    macro_rules! answer {
        ($response:expr) => {
            encode_response(key, version, correlation_id, &$response).map(Some)
        };
    }
    match key {
        ApiKey::ApiVersions => {
            let _: km::ApiVersionsRequest = decode(key, version, &mut body)?;
            answer!(api_versions_response(km::ApiVersionsResponse::default()))
        }
        ApiKey::Metadata => {
            let r = decode(key, version, &mut body)?;
            answer!(metadata(shared, caller, version, r).await)
        }
        ApiKey::Produce => {
            let r = decode(key, version, &mut body)?;
            match produce(shared, caller, version, r).await {
                Some(response) => answer!(response),
                None => Ok(None),
            }
        }
        ApiKey::Fetch => {
            let r = decode(key, version, &mut body)?;
            answer!(fetch(shared, caller, version, r).await)
        }
        ApiKey::ListOffsets => {
            let r = decode(key, version, &mut body)?;
            answer!(list_offsets(shared, caller, version, r).await)
        }
        ApiKey::InitProducerId => {
            let r = decode(key, version, &mut body)?;
            answer!(init_producer_id(shared, caller, r).await)
        }
        ApiKey::CreateTopics => {
            let r = decode(key, version, &mut body)?;
            answer!(create_topics(shared, caller, r).await)
        }
        ApiKey::DeleteTopics => {
            let r = decode(key, version, &mut body)?;
            answer!(delete_topics(shared, caller, version, r).await)
        }
        ApiKey::FindCoordinator => {
            let r = decode(key, version, &mut body)?;
            answer!(find_coordinator(shared, caller, version, r).await)
        }
        ApiKey::OffsetCommit => {
            let r = decode(key, version, &mut body)?;
            answer!(offset_commit(shared, caller, r).await)
        }
        ApiKey::OffsetFetch => {
            let r = decode(key, version, &mut body)?;
            answer!(offset_fetch(shared, caller, r).await)
        }
        ApiKey::DescribeConfigs => {
            let r = decode(key, version, &mut body)?;
            answer!(describe_configs(shared, caller, r).await)
        }
        ApiKey::DescribeCluster => {
            let _: km::DescribeClusterRequest = decode(key, version, &mut body)?;
            answer!(describe_cluster(shared, caller).await)
        }
        ApiKey::JoinGroup => {
            let r = decode(key, version, &mut body)?;
            answer!(groups::join_group(shared, caller, version, &client_id, r).await)
        }
        ApiKey::SyncGroup => {
            let r = decode(key, version, &mut body)?;
            answer!(groups::sync_group(shared, caller, version, r).await)
        }
        ApiKey::Heartbeat => {
            let r = decode(key, version, &mut body)?;
            answer!(groups::heartbeat(shared, caller, r).await)
        }
        ApiKey::LeaveGroup => {
            let r = decode(key, version, &mut body)?;
            answer!(groups::leave_group(shared, caller, version, r).await)
        }
        ApiKey::ListGroups => {
            let r = decode(key, version, &mut body)?;
            answer!(groups::list_groups(shared, caller, r).await)
        }
        ApiKey::DescribeGroups => {
            let r = decode(key, version, &mut body)?;
            answer!(groups::describe_groups(shared, caller, version, r).await)
        }
        ApiKey::OffsetForLeaderEpoch => {
            let r = decode(key, version, &mut body)?;
            answer!(offset_for_leader_epoch(shared, caller, r).await)
        }
        ApiKey::AlterConfigs => {
            let r = decode(key, version, &mut body)?;
            answer!(crate::configs::alter_configs(shared, caller, r).await)
        }
        ApiKey::IncrementalAlterConfigs => {
            let r = decode(key, version, &mut body)?;
            answer!(crate::configs::incremental_alter_configs(shared, caller, r).await)
        }
        ApiKey::DeleteGroups => {
            let r = decode(key, version, &mut body)?;
            answer!(groups::delete_groups(shared, caller, r).await)
        }
        ApiKey::DescribeProducers => {
            let r = decode(key, version, &mut body)?;
            answer!(crate::configs::describe_producers(shared, caller, r).await)
        }
        ApiKey::CreatePartitions => {
            let r = decode(key, version, &mut body)?;
            answer!(crate::configs::create_partitions(shared, caller, r).await)
        }
        ApiKey::ConsumerGroupDescribe => {
            let r = decode(key, version, &mut body)?;
            answer!(crate::kip848::describe(shared, caller, r).await)
        }
        ApiKey::AddPartitionsToTxn => {
            let r = decode(key, version, &mut body)?;
            answer!(crate::txn::add_partitions_to_txn(shared, caller, version, r).await)
        }
        ApiKey::EndTxn => {
            let r = decode(key, version, &mut body)?;
            answer!(crate::txn::end_txn(shared, caller, r).await)
        }
        ApiKey::DescribeTransactions => {
            let r = decode(key, version, &mut body)?;
            answer!(crate::txn::describe_transactions(shared, caller, r).await)
        }
        ApiKey::ListTransactions => {
            let r = decode(key, version, &mut body)?;
            answer!(crate::txn::list_transactions(shared, caller, r).await)
        }
        ApiKey::AddOffsetsToTxn => {
            let r = decode(key, version, &mut body)?;
            answer!(crate::txn::add_offsets_to_txn(shared, caller, r).await)
        }
        ApiKey::TxnOffsetCommit => {
            let r = decode(key, version, &mut body)?;
            answer!(crate::txn::txn_offset_commit(shared, caller, r).await)
        }
        other => Err(Closed::Because(format!(
            "{other:?} is not served by this broker's Kafka listener"
        ))),
    }
}

// ---------------------------------------------------------------- metadata

async fn metadata(
    shared: &Shared,
    caller: &Arc<Caller>,
    version: i16,
    r: km::MetadataRequest,
) -> km::MetadataResponse {
    let front = &shared.front;
    let me = front.config().id;
    // Topics named by id only (v10+: a KIP-848 consumer resolving its
    // assignment) are looked up in the image; an unknown id is answered
    // UNKNOWN_TOPIC_ID.
    let ids = crate::kip848::TopicIds::load(shared);
    let mut unknown_ids = Vec::new();
    let mut topics: Option<Vec<String>> = r.topics.as_ref().map(|ts| {
        ts.iter()
            .filter_map(|t| match &t.name {
                Some(n) => Some(n.0.to_string()),
                None => {
                    let name = ids.by_id.get(&t.topic_id).cloned();
                    if name.is_none() {
                        unknown_ids.push(t.topic_id);
                    }
                    name
                }
            })
            .collect()
    });
    // Version 0 has no null: an empty list means every topic.
    if version == 0 && topics.as_ref().is_some_and(Vec::is_empty) {
        topics = None;
    }
    let asked = topics.clone();
    let request = rw::MetadataRequest { topics };
    let answer = front.call(caller, &request, Bytes::new()).await;
    // Every live broker with a Kafka listener. The controller is named as
    // this broker, which forwards what needs the quorum.
    let brokers = kafka_brokers(shared)
        .into_iter()
        .map(|(id, e)| {
            km::metadata_response::MetadataResponseBroker::default()
                .with_node_id(BrokerId(id))
                .with_host(sb(e.host))
                .with_port(e.port)
        })
        .collect();
    let mut response = km::MetadataResponse::default()
        .with_brokers(brokers)
        .with_controller_id(BrokerId(me))
        .with_cluster_id(Some(sb(front.cluster_id())));
    match answer.and_then(|a| a.ok_or_else(|| failed("Metadata"))) {
        Ok((m, _)) => {
            // Topic ids (Metadata v10+; KIP-848 assignments name topics by id).
            response.topics = m
                .topics
                .iter()
                .map(|t| {
                    let partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            let mut error = code(&p.error);
                            // No leader, also from a broker that fenced itself
                            // (BROKER_NOT_AVAILABLE): clients retry the metadata.
                            if matches!(error, kafka::NONE | kafka::BROKER_NOT_AVAILABLE)
                                && p.leader.is_none()
                            {
                                error = kafka::LEADER_NOT_AVAILABLE;
                            }
                            km::metadata_response::MetadataResponsePartition::default()
                                .with_error_code(error)
                                .with_partition_index(p.partition as i32)
                                .with_leader_id(BrokerId(p.leader.unwrap_or(-1)))
                                .with_leader_epoch(p.leader_epoch.0)
                                .with_replica_nodes(
                                    p.replicas.iter().map(|b| BrokerId(*b)).collect(),
                                )
                                .with_isr_nodes(p.isr.iter().map(|b| BrokerId(*b)).collect())
                        })
                        .collect();
                    km::metadata_response::MetadataResponseTopic::default()
                        .with_error_code(code(&t.error))
                        .with_name(Some(topic_name(&t.name)))
                        .with_topic_id(ids.id(&t.name))
                        .with_is_internal(t.internal)
                        .with_partitions(partitions)
                })
                .collect();
            response.topics.extend(unknown_ids.iter().map(|id| {
                km::metadata_response::MetadataResponseTopic::default()
                    .with_error_code(kafka::UNKNOWN_TOPIC_ID)
                    .with_topic_id(*id)
            }));
        }
        Err(e) => {
            tracing::debug!(peer = %caller.peer, error = %e, "Kafka Metadata failed");
            response.topics = asked
                .unwrap_or_default()
                .iter()
                .map(|name| {
                    km::metadata_response::MetadataResponseTopic::default()
                        .with_error_code(to_kafka(e.code))
                        .with_name(Some(topic_name(name)))
                })
                .collect();
        }
    }
    response
}

// ---------------------------------------------------------------- produce

/// The response to a Produce, `None` for acks=0.
async fn produce(
    shared: &Shared,
    caller: &Arc<Caller>,
    version: i16,
    r: km::ProduceRequest,
) -> Option<km::ProduceResponse> {
    let acks = match r.acks {
        0 => Some(rw::Acks::None),
        1 => Some(rw::Acks::Leader),
        -1 => Some(rw::Acks::All),
        _ => None,
    };
    let mut local: HashMap<(String, i32), ErrorInfo> = HashMap::new();
    let mut partitions = Vec::new();
    let mut chunks: Vec<Bytes> = Vec::new();
    for t in &r.topic_data {
        let topic = t.name.0.to_string();
        for p in &t.partition_data {
            let refuse = if acks.is_none() {
                Some(ErrorInfo::new(
                    ErrorCode::InvalidRequest,
                    format!("acks={} is not valid: use 0, 1 or -1 (all)", r.acks),
                ))
            } else if p.index < 0 {
                Some(ErrorInfo::new(
                    ErrorCode::UnknownTopicOrPartition,
                    format!("partition {} of topic {topic} does not exist", p.index),
                ))
            } else if p.records.as_ref().is_none_or(|b| b.is_empty()) {
                Some(ErrorInfo::new(
                    ErrorCode::CorruptRecord,
                    format!("no records for {topic}-{}", p.index),
                ))
            } else {
                None
            };
            if let Some(e) = refuse {
                local.insert((topic.clone(), p.index), e);
                continue;
            }
            let records = p.records.clone().unwrap_or_default();
            partitions.push(rw::ProducePartition {
                topic: topic.clone(),
                partition: p.index as u32,
                bytes_len: records.len() as u32,
            });
            chunks.push(records);
        }
    }
    let acks = acks.unwrap_or(rw::Acks::All);
    let mut answers: HashMap<(String, i32), rw::ProducePartitionResponse> = HashMap::new();
    let mut whole: Option<ErrorInfo> = None;
    if !partitions.is_empty() {
        // Each partition's records as the Kafka decoder sliced them: no copy.
        let payload = rill_proto::Rope::new(chunks);
        let request = rw::ProduceRequest {
            acks,
            timeout_ms: r.timeout_ms.max(0) as u32,
            partitions,
        };
        match shared.front.call(caller, &request, payload).await {
            Ok(Some((response, _))) => {
                for p in response.partitions {
                    answers.insert((p.topic.clone(), p.partition as i32), p);
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(peer = %caller.peer, error = %e, "Kafka Produce failed");
                whole = Some(e);
            }
        }
    }
    if r.acks == 0 {
        return None;
    }
    let responses = r
        .topic_data
        .iter()
        .map(|t| {
            let topic = t.name.0.to_string();
            let partition_responses = t
                .partition_data
                .iter()
                .map(|p| {
                    let k = (topic.clone(), p.index);
                    let out = km::produce_response::PartitionProduceResponse::default()
                        .with_index(p.index);
                    let error = local.get(&k).or(whole.as_ref());
                    if let Some(e) = error {
                        return with_produce_error(out, version, e);
                    }
                    match answers.get(&k) {
                        Some(a) => match &a.error {
                            Some(e) => with_produce_error(out, version, e),
                            None => out
                                .with_base_offset(a.base_offset.0)
                                .with_log_start_offset(a.log_start_offset.0)
                                .with_log_append_time_ms(a.log_append_time_ms.unwrap_or(-1)),
                        },
                        None => with_produce_error(out, version, &failed("Produce")),
                    }
                })
                .collect();
            km::produce_response::TopicProduceResponse::default()
                .with_name(t.name.clone())
                .with_partition_responses(partition_responses)
        })
        .collect();
    Some(km::ProduceResponse::default().with_responses(responses))
}

fn with_produce_error(
    out: km::produce_response::PartitionProduceResponse,
    version: i16,
    e: &ErrorInfo,
) -> km::produce_response::PartitionProduceResponse {
    let out = out.with_error_code(to_kafka(e.code)).with_base_offset(-1);
    if version >= 8 {
        out.with_error_message(message(e))
    } else {
        out
    }
}

/// One buffer of `chunks` (no copy when there is one).
/// A partition's fetched batches as Kafka clients read them: an lz4 batch in
/// Rill's legacy block form (written before Rill wrote LZ4 frames) rewritten
/// as a frame ([`rill_proto::batch::lz4_legacy_to_frame`]); everything else,
/// and a partial batch at the end, passes through as it lies on disk (no copy
/// unless something is rewritten).
pub(crate) fn kafka_readable(records: Bytes) -> Bytes {
    let mut done = 0;
    let mut out: Option<BytesMut> = None;
    for view in rill_proto::batch::batches(&records) {
        let Ok(view) = view else { break };
        let bytes = view.as_bytes();
        match rill_proto::batch::lz4_legacy_to_frame(bytes) {
            Ok(Some(framed)) => out
                .get_or_insert_with(|| BytesMut::from(&records[..done]))
                .extend_from_slice(&framed),
            Ok(None) => {
                if let Some(o) = &mut out {
                    o.extend_from_slice(bytes);
                }
            }
            Err(e) => {
                // Served as it is: the client's CRC check says it is damaged.
                tracing::warn!(error = %e, "a legacy lz4 batch could not be rewritten for a Kafka client");
                if let Some(o) = &mut out {
                    o.extend_from_slice(bytes);
                }
            }
        }
        done += bytes.len();
    }
    match out {
        None => records,
        Some(mut o) => {
            o.extend_from_slice(&records[done..]);
            o.freeze()
        }
    }
}

fn concat(chunks: Vec<Bytes>) -> Bytes {
    if chunks.len() == 1 {
        return chunks.into_iter().next().unwrap_or_default();
    }
    let mut out = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in chunks {
        out.extend_from_slice(&c);
    }
    out.freeze()
}

// ---------------------------------------------------------------- fetch

async fn fetch(
    shared: &Shared,
    caller: &Arc<Caller>,
    version: i16,
    r: km::FetchRequest,
) -> km::FetchResponse {
    if version >= 7 && r.session_id != 0 {
        // We never create sessions (we answer session id 0), so a client
        // naming one is confused: make it start over with a full fetch.
        return km::FetchResponse::default().with_error_code(kafka::FETCH_SESSION_ID_NOT_FOUND);
    }
    let mut local: HashMap<(String, i32), ErrorInfo> = HashMap::new();
    let mut partitions = Vec::new();
    for t in &r.topics {
        let topic = t.topic.0.to_string();
        for p in &t.partitions {
            if p.partition < 0 {
                local.insert(
                    (topic.clone(), p.partition),
                    ErrorInfo::new(
                        ErrorCode::UnknownTopicOrPartition,
                        format!("partition {} of topic {topic} does not exist", p.partition),
                    ),
                );
                continue;
            }
            partitions.push(rw::FetchPartition {
                topic: topic.clone(),
                partition: p.partition as u32,
                offset: Offset(p.fetch_offset),
                max_bytes: p.partition_max_bytes.max(0) as u32,
                current_leader_epoch: (version >= 9 && p.current_leader_epoch >= 0)
                    .then_some(LeaderEpoch(p.current_leader_epoch)),
            });
        }
    }
    let mut answers: HashMap<(String, i32), (rw::FetchPartitionResponse, Bytes)> = HashMap::new();
    let mut whole: Option<ErrorInfo> = None;
    if !partitions.is_empty() {
        let request = rw::FetchRequest {
            max_wait_ms: r.max_wait_ms.max(0) as u32,
            min_bytes: r.min_bytes.max(0) as u32,
            max_bytes: if r.max_bytes > 0 {
                r.max_bytes as u32
            } else {
                shared.front.config().max_request_bytes
            },
            replica_id: None,
            // isolation_level (v4+): 1 is read_committed.
            isolation: if r.isolation_level == 1 {
                rw::Isolation::ReadCommitted
            } else {
                rw::Isolation::ReadUncommitted
            },
            partitions,
        };
        match shared.front.call(caller, &request, Bytes::new()).await {
            Ok(Some((response, payload))) => {
                let mut payload = concat(payload);
                for p in response.partitions {
                    let n = (p.bytes_len as usize).min(payload.len());
                    let records = kafka_readable(payload.split_to(n));
                    answers.insert((p.topic.clone(), p.partition as i32), (p, records));
                }
            }
            Ok(None) => whole = Some(failed("Fetch")),
            Err(e) => {
                tracing::debug!(peer = %caller.peer, error = %e, "Kafka Fetch failed");
                whole = Some(e);
            }
        }
    }
    let responses =
        r.topics
            .iter()
            .map(|t| {
                let topic = t.topic.0.to_string();
                let partitions =
                    t.partitions
                        .iter()
                        .map(|p| {
                            let k = (topic.clone(), p.partition);
                            let out = km::fetch_response::PartitionData::default()
                                .with_partition_index(p.partition)
                                .with_aborted_transactions(Some(Vec::new()));
                            let error =
                                local.get(&k).or(whole.as_ref()).cloned().or_else(|| {
                                    (!answers.contains_key(&k)).then(|| failed("Fetch"))
                                });
                            if let Some(e) = error {
                                return out
                                    .with_error_code(to_kafka(e.code))
                                    .with_high_watermark(-1)
                                    .with_last_stable_offset(-1)
                                    .with_log_start_offset(-1);
                            }
                            let Some((a, records)) = answers.remove(&k) else {
                                return out;
                            };
                            let aborted = a
                                .aborted
                                .iter()
                                .map(|t| {
                                    km::fetch_response::AbortedTransaction::default()
                                        .with_producer_id(km::ProducerId(t.producer_id))
                                        .with_first_offset(t.first_offset.0)
                                })
                                .collect();
                            out.with_error_code(code(&a.error))
                                .with_aborted_transactions(Some(aborted))
                                .with_high_watermark(a.high_watermark.0)
                                .with_last_stable_offset(a.last_stable_offset.0)
                                .with_log_start_offset(a.log_start_offset.0)
                                .with_records(Some(records))
                        })
                        .collect();
                km::fetch_response::FetchableTopicResponse::default()
                    .with_topic(t.topic.clone())
                    .with_partitions(partitions)
            })
            .collect();
    km::FetchResponse::default()
        .with_session_id(0)
        .with_responses(responses)
}

// ---------------------------------------------------------------- list offsets

async fn list_offsets(
    shared: &Shared,
    caller: &Arc<Caller>,
    version: i16,
    r: km::ListOffsetsRequest,
) -> km::ListOffsetsResponse {
    // OFFSET_NOT_AVAILABLE is known to clients from v5 on; Kafka answers
    // older ones LEADER_NOT_AVAILABLE, which they retry as well.
    let partition_code = |e: &Option<ErrorInfo>| match e {
        Some(e) if e.code == ErrorCode::OffsetNotAvailable && version < 5 => {
            kafka::LEADER_NOT_AVAILABLE
        }
        other => code(other),
    };
    let mut local: HashMap<(String, i32), ErrorInfo> = HashMap::new();
    let mut partitions = Vec::new();
    for t in &r.topics {
        let topic = t.name.0.to_string();
        for p in &t.partitions {
            let spec = match p.timestamp {
                -2 => Some(rw::OffsetSpec::Earliest),
                // A read_committed consumer's "latest" is the last stable offset.
                -1 if r.isolation_level == 1 => Some(rw::OffsetSpec::LastStable),
                -1 => Some(rw::OffsetSpec::Latest),
                ts if ts >= 0 => Some(rw::OffsetSpec::Timestamp(ts)),
                _ => None,
            };
            match spec {
                Some(spec) if p.partition_index >= 0 => partitions.push(rw::ListOffsetsPartition {
                    topic: topic.clone(),
                    partition: p.partition_index as u32,
                    spec,
                }),
                _ => {
                    local.insert(
                        (topic.clone(), p.partition_index),
                        ErrorInfo::new(
                            ErrorCode::UnsupportedVersion,
                            format!(
                                "ListOffsets of {topic}-{} at timestamp {}: only earliest (-2), \
                                 latest (-1) and times >= 0 are supported",
                                p.partition_index, p.timestamp
                            ),
                        ),
                    );
                }
            }
        }
    }
    let mut answers = HashMap::new();
    let mut whole = None;
    if !partitions.is_empty() {
        let request = rw::ListOffsetsRequest { partitions };
        match shared.front.call(caller, &request, Bytes::new()).await {
            Ok(Some((response, _))) => {
                for p in response.partitions {
                    answers.insert((p.topic.clone(), p.partition as i32), p);
                }
            }
            Ok(None) => whole = Some(failed("ListOffsets")),
            Err(e) => whole = Some(e),
        }
    }
    let topics = r
        .topics
        .iter()
        .map(|t| {
            let topic = t.name.0.to_string();
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let k = (topic.clone(), p.partition_index);
                    let out = km::list_offsets_response::ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index);
                    let error = local.get(&k).or(whole.as_ref());
                    if let Some(e) = error {
                        return out.with_error_code(to_kafka(e.code)).with_offset(-1);
                    }
                    match answers.get(&k) {
                        Some(a) => out
                            .with_error_code(partition_code(&a.error))
                            .with_offset(a.offset.0)
                            .with_timestamp(a.timestamp_ms.unwrap_or(-1)),
                        None => out
                            .with_error_code(kafka::UNKNOWN_SERVER_ERROR)
                            .with_offset(-1),
                    }
                })
                .collect();
            km::list_offsets_response::ListOffsetsTopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    km::ListOffsetsResponse::default().with_topics(topics)
}

// ---------------------------------------------------------------- producer ids

async fn init_producer_id(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::InitProducerIdRequest,
) -> km::InitProducerIdResponse {
    let out = km::InitProducerIdResponse::default();
    if let Some(id) = r.transactional_id {
        return crate::txn::init_producer_id(
            shared,
            caller,
            id.0.to_string(),
            r.transaction_timeout_ms,
        )
        .await;
    }
    match shared
        .front
        .call(caller, &rw::InitProducerIdRequest::default(), Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("InitProducerId")))
    {
        Ok((a, _)) => out
            .with_producer_id(km::ProducerId(a.producer_id))
            .with_producer_epoch(a.producer_epoch),
        Err(e) => out
            .with_error_code(to_kafka(e.code))
            .with_producer_id(km::ProducerId(-1))
            .with_producer_epoch(-1),
    }
}

// ---------------------------------------------------------------- topics

async fn create_topics(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::CreateTopicsRequest,
) -> km::CreateTopicsResponse {
    let mut local: HashMap<String, ErrorInfo> = HashMap::new();
    let mut topics = Vec::new();
    for t in &r.topics {
        let name = t.name.0.to_string();
        if !t.assignments.is_empty() {
            local.insert(
                name.clone(),
                ErrorInfo::new(
                    ErrorCode::InvalidRequest,
                    format!("topic {name}: manual replica assignments are not supported; give a partition count and replication factor"),
                ),
            );
            continue;
        }
        topics.push(rw::NewTopic {
            name,
            partitions: (t.num_partitions > 0).then_some(t.num_partitions as u32),
            replication_factor: (t.replication_factor > 0).then_some(t.replication_factor as u16),
            configs: t
                .configs
                .iter()
                .filter_map(|c| Some((c.name.to_string(), c.value.as_ref()?.to_string())))
                .collect(),
        });
    }
    let mut answers = HashMap::new();
    let mut whole = None;
    if !topics.is_empty() {
        let request = rw::CreateTopicsRequest {
            topics,
            validate_only: r.validate_only,
        };
        match shared.front.call(caller, &request, Bytes::new()).await {
            Ok(Some((response, _))) => {
                for t in response.results {
                    answers.insert(t.name.clone(), t.error);
                }
            }
            Ok(None) => whole = Some(failed("CreateTopics")),
            Err(e) => whole = Some(e),
        }
    }
    let topics =
        r.topics
            .iter()
            .map(|t| {
                let name = t.name.0.to_string();
                let error =
                    local.get(&name).or(whole.as_ref()).cloned().or_else(|| {
                        match answers.get(&name) {
                            Some(e) => e.clone(),
                            None => Some(failed("CreateTopics")),
                        }
                    });
                let out = km::create_topics_response::CreatableTopicResult::default()
                    .with_name(t.name.clone())
                    .with_num_partitions(t.num_partitions)
                    .with_replication_factor(t.replication_factor);
                match error {
                    Some(e) => out
                        .with_error_code(to_kafka(e.code))
                        .with_error_message(message(&e)),
                    None => out,
                }
            })
            .collect();
    km::CreateTopicsResponse::default().with_topics(topics)
}

async fn delete_topics(
    shared: &Shared,
    caller: &Arc<Caller>,
    version: i16,
    r: km::DeleteTopicsRequest,
) -> km::DeleteTopicsResponse {
    // Version 6 names each topic by name or by id (the ids Metadata answers).
    let ids = (version >= 6).then(|| crate::kip848::TopicIds::load(shared));
    let mut unknown_ids = Vec::new();
    let names: Vec<String> = if let Some(ids) = &ids {
        let mut names = Vec::new();
        for t in &r.topics {
            match &t.name {
                Some(n) => names.push(n.0.to_string()),
                None => match ids.by_id.get(&t.topic_id) {
                    Some(n) => names.push(n.clone()),
                    None => unknown_ids.push(t.topic_id),
                },
            }
        }
        names
    } else {
        r.topic_names.iter().map(|n| n.0.to_string()).collect()
    };
    let mut answers = HashMap::new();
    let mut whole = None;
    if !names.is_empty() {
        let request = rw::DeleteTopicsRequest {
            names: names.clone(),
        };
        match shared.front.call(caller, &request, Bytes::new()).await {
            Ok(Some((response, _))) => {
                for t in response.results {
                    answers.insert(t.name.clone(), t.error);
                }
            }
            Ok(None) => whole = Some(failed("DeleteTopics")),
            Err(e) => whole = Some(e),
        }
    }
    let mut responses: Vec<_> = names
        .iter()
        .map(|name| {
            let error = whole.clone().or_else(|| match answers.get(name) {
                Some(e) => e.clone(),
                None => Some(failed("DeleteTopics")),
            });
            let mut out = km::delete_topics_response::DeletableTopicResult::default()
                .with_name(Some(topic_name(name)));
            if let Some(ids) = &ids {
                out = out.with_topic_id(ids.id(name));
            }
            match error {
                Some(e) if version >= 5 => out
                    .with_error_code(to_kafka(e.code))
                    .with_error_message(message(&e)),
                Some(e) => out.with_error_code(to_kafka(e.code)),
                None => out,
            }
        })
        .collect();
    // Ids that name no topic of the cluster.
    for id in unknown_ids {
        responses.push(
            km::delete_topics_response::DeletableTopicResult::default()
                .with_topic_id(id)
                .with_error_code(kafka::UNKNOWN_TOPIC_ID)
                .with_error_message(Some(sb(format!("no topic has id {id}")))),
        );
    }
    km::DeleteTopicsResponse::default().with_responses(responses)
}

// ---------------------------------------------------------------- leader epochs

/// KIP-320: a consumer that saw the leader epoch change asks where its
/// epoch ends, to detect a truncated log. One Rill call per partition.
async fn offset_for_leader_epoch(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::OffsetForLeaderEpochRequest,
) -> km::OffsetForLeaderEpochResponse {
    let replica = r.replica_id.0;
    let mut topics = Vec::new();
    for t in &r.topics {
        let mut partitions = Vec::new();
        for p in &t.partitions {
            let out = km::offset_for_leader_epoch_response::EpochEndOffset::default()
                .with_partition(p.partition)
                .with_leader_epoch(-1)
                .with_end_offset(-1);
            let answer = if replica >= 0 {
                // Followers are brokers and speak QUIC.
                Err(ErrorInfo::new(
                    ErrorCode::ClusterAuthorizationFailed,
                    "OffsetForLeaderEpoch with a replica id: replicas use the brokers' own protocol",
                ))
            } else if p.partition < 0 {
                Err(ErrorInfo::new(
                    ErrorCode::UnknownTopicOrPartition,
                    format!("partition {} of {} does not exist", p.partition, t.topic.0),
                ))
            } else {
                let request = rw::OffsetForLeaderEpochRequest {
                    topic: t.topic.0.to_string(),
                    partition: p.partition as u32,
                    current_leader_epoch: LeaderEpoch(p.current_leader_epoch),
                    leader_epoch: LeaderEpoch(p.leader_epoch),
                };
                shared
                    .front
                    .call(caller, &request, Bytes::new())
                    .await
                    .and_then(|a| a.ok_or_else(|| failed("OffsetForLeaderEpoch")))
                    .map(|(a, _)| a)
            };
            partitions.push(match answer {
                Ok(a) => match a.leader_epoch {
                    Some(epoch) => out
                        .with_leader_epoch(epoch.0)
                        .with_end_offset(a.end_offset.0),
                    None => out,
                },
                Err(e) => out.with_error_code(to_kafka(e.code)),
            });
        }
        topics.push(
            km::offset_for_leader_epoch_response::OffsetForLeaderTopicResult::default()
                .with_topic(t.topic.clone())
                .with_partitions(partitions),
        );
    }
    km::OffsetForLeaderEpochResponse::default().with_topics(topics)
}

// ---------------------------------------------------------------- groups

/// One group's coordinator, as Kafka names it: (error, node, host, port).
async fn coordinator_of(
    shared: &Shared,
    caller: &Arc<Caller>,
    key: &str,
    key_type: i8,
) -> (Option<ErrorInfo>, i32, String, i32) {
    let none = |e: ErrorInfo| (Some(e), -1, String::new(), -1);
    let kind = match key_type {
        0 => rw::CoordinatorKind::Group,
        1 => rw::CoordinatorKind::Transaction,
        other => {
            return none(ErrorInfo::new(
                ErrorCode::InvalidRequest,
                format!(
                    "FindCoordinator key type {other}: this broker knows 0 (group) and 1 (transaction)"
                ),
            ));
        }
    };
    let request = rw::FindCoordinatorRequest {
        group_id: key.to_string(),
        kind,
    };
    match shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("FindCoordinator")))
    {
        Ok((a, _)) => {
            if let Some(e) = a.error {
                return none(e);
            }
            let Some(e) = kafka_brokers(shared).remove(&a.coordinator_id) else {
                // Fenced, or registered without a Kafka listener: retriable,
                // the client asks again.
                return none(ErrorInfo::new(
                    ErrorCode::CoordinatorNotAvailable,
                    format!(
                        "group {key}'s coordinator is broker {}, which has no live Kafka listener",
                        a.coordinator_id
                    ),
                ));
            };
            (None, a.coordinator_id, e.host, e.port)
        }
        Err(e) => none(e),
    }
}

async fn find_coordinator(
    shared: &Shared,
    caller: &Arc<Caller>,
    version: i16,
    r: km::FindCoordinatorRequest,
) -> km::FindCoordinatorResponse {
    if version >= 4 {
        let mut coordinators = Vec::new();
        for key in &r.coordinator_keys {
            let (error, node, host, port) = coordinator_of(shared, caller, key, r.key_type).await;
            coordinators.push(
                km::find_coordinator_response::Coordinator::default()
                    .with_key(key.clone())
                    .with_node_id(BrokerId(node))
                    .with_host(sb(host))
                    .with_port(port)
                    .with_error_code(code(&error))
                    .with_error_message(error.as_ref().and_then(message)),
            );
        }
        return km::FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let (error, node, host, port) = coordinator_of(shared, caller, &r.key, r.key_type).await;
    let out = km::FindCoordinatorResponse::default()
        .with_error_code(code(&error))
        .with_node_id(BrokerId(node))
        .with_host(sb(host))
        .with_port(port);
    if version >= 1 {
        out.with_error_message(error.as_ref().and_then(message))
    } else {
        out
    }
}

async fn offset_commit(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::OffsetCommitRequest,
) -> km::OffsetCommitResponse {
    let group_id = r.group_id.0.to_string();
    let member = (!r.member_id.is_empty() || r.generation_id_or_member_epoch >= 0)
        .then(|| (r.member_id.to_string(), r.generation_id_or_member_epoch));
    let mut partitions = Vec::new();
    for t in &r.topics {
        for p in t.partitions.iter().filter(|p| p.partition_index >= 0) {
            partitions.push(rw::OffsetCommitPartition {
                topic: t.name.0.to_string(),
                partition: p.partition_index as u32,
                offset: Offset(p.committed_offset),
                metadata: p
                    .committed_metadata
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            });
        }
    }
    let request = rw::OffsetCommitRequest {
        group_id,
        member,
        partitions,
    };
    let (whole, answers) = match shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("OffsetCommit")))
    {
        Ok((a, _)) => (
            a.error,
            a.partitions
                .into_iter()
                .map(|p| ((p.topic, p.partition as i32), p.error))
                .collect::<HashMap<_, _>>(),
        ),
        Err(e) => (Some(e), HashMap::new()),
    };
    let topics = r
        .topics
        .iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let k = (t.name.0.to_string(), p.partition_index);
                    let error = whole.as_ref().map(|e| to_kafka(e.code)).unwrap_or_else(|| {
                        match answers.get(&k) {
                            Some(e) => code(e),
                            None => kafka::UNKNOWN_TOPIC_OR_PARTITION,
                        }
                    });
                    // A KIP-848 member's commit with an epoch the coordinator no
                    // longer holds is, for Kafka's consumers, STALE_MEMBER_EPOCH:
                    // they retry it with the epoch of their next heartbeat (the
                    // Java consumer takes FENCED_MEMBER_EPOCH here as fatal).
                    let error = if error == kafka::FENCED_MEMBER_EPOCH {
                        kafka::STALE_MEMBER_EPOCH
                    } else {
                        error
                    };
                    km::offset_commit_response::OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(error)
                })
                .collect();
            km::offset_commit_response::OffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    km::OffsetCommitResponse::default().with_topics(topics)
}

async fn offset_fetch(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::OffsetFetchRequest,
) -> km::OffsetFetchResponse {
    let partitions = r.topics.as_ref().map(|ts| {
        ts.iter()
            .map(|t| rw::TopicPartitions {
                topic: t.name.0.to_string(),
                partitions: t
                    .partition_indexes
                    .iter()
                    .filter(|p| **p >= 0)
                    .map(|p| *p as u32)
                    .collect(),
            })
            .collect()
    });
    let request = rw::OffsetFetchRequest {
        group_id: r.group_id.0.to_string(),
        partitions,
        // v7+: a read-committed consumer asks for offsets no open
        // transaction is about to move.
        require_stable: r.require_stable,
    };
    let out = km::OffsetFetchResponse::default();
    let (whole, offsets) = match shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("OffsetFetch")))
    {
        Ok((a, _)) => (a.error, a.offsets),
        Err(e) => (Some(e), Vec::new()),
    };
    // Kafka answers UNSTABLE_OFFSET_COMMIT per partition (clients retry
    // the whole fetch); Rill names the unstable partitions with the error.
    let unstable = match whole {
        Some(e) if e.code == ErrorCode::UnstableOffsetCommit => Some(to_kafka(e.code)),
        Some(e) => return out.with_error_code(to_kafka(e.code)),
        None => None,
    };
    let mut by_topic: Vec<km::offset_fetch_response::OffsetFetchResponseTopic> = Vec::new();
    for o in offsets {
        let partition = km::offset_fetch_response::OffsetFetchResponsePartition::default()
            .with_partition_index(o.partition as i32)
            .with_committed_offset(o.offset.map_or(-1, |o| o.0))
            .with_metadata(Some(sb(o.metadata)))
            .with_error_code(unstable.unwrap_or(0));
        match by_topic.iter_mut().find(|t| t.name.0.as_str() == o.topic) {
            Some(t) => t.partitions.push(partition),
            None => by_topic.push(
                km::offset_fetch_response::OffsetFetchResponseTopic::default()
                    .with_name(topic_name(&o.topic))
                    .with_partitions(vec![partition]),
            ),
        }
    }
    out.with_topics(by_topic)
}

// ---------------------------------------------------------------- configs, cluster

/// Kafka's resource types.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// Kafka's config sources.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_DEFAULT: i8 = 5;

async fn describe_configs(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::DescribeConfigsRequest,
) -> km::DescribeConfigsResponse {
    let topics: Vec<String> = r
        .resources
        .iter()
        .filter(|res| res.resource_type == RESOURCE_TOPIC)
        .map(|res| res.resource_name.to_string())
        .collect();
    let mut answers = HashMap::new();
    let mut whole = None;
    if !topics.is_empty() {
        let request = rw::DescribeConfigsRequest { topics };
        match shared.front.call(caller, &request, Bytes::new()).await {
            Ok(Some((response, _))) => {
                for t in response.topics {
                    answers.insert(t.name.clone(), t);
                }
            }
            Ok(None) => whole = Some(failed("DescribeConfigs")),
            Err(e) => whole = Some(e),
        }
    }
    let results = r
        .resources
        .iter()
        .map(|res| {
            let name = res.resource_name.to_string();
            let out = km::describe_configs_response::DescribeConfigsResult::default()
                .with_resource_type(res.resource_type)
                .with_resource_name(res.resource_name.clone());
            let error = match res.resource_type {
                RESOURCE_TOPIC => whole.clone().or_else(|| match answers.get(&name) {
                    Some(t) => t.error.clone(),
                    None => Some(failed("DescribeConfigs")),
                }),
                // Broker configs are the broker's file, not served here: none.
                RESOURCE_BROKER => None,
                other => Some(ErrorInfo::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "config resource type {other} is not supported (topics: 2, brokers: 4)"
                    ),
                )),
            };
            if let Some(e) = error {
                return out
                    .with_error_code(to_kafka(e.code))
                    .with_error_message(message(&e));
            }
            let Some(t) = answers.get(&name) else {
                return out;
            };
            let wanted = |n: &str| {
                res.configuration_keys
                    .as_ref()
                    .is_none_or(|keys| keys.iter().any(|k| k.as_str() == n))
            };
            let configs = t
                .configs
                .iter()
                .filter(|c| wanted(&c.name))
                .map(|c| {
                    km::describe_configs_response::DescribeConfigsResourceResult::default()
                        .with_name(sb(c.name.clone()))
                        .with_value(Some(sb(c.value.clone())))
                        .with_config_source(if c.is_default {
                            SOURCE_DEFAULT
                        } else {
                            SOURCE_TOPIC
                        })
                })
                .collect();
            out.with_configs(configs)
        })
        .collect();
    km::DescribeConfigsResponse::default().with_results(results)
}

async fn describe_cluster(shared: &Shared, caller: &Arc<Caller>) -> km::DescribeClusterResponse {
    // Through the router (counted, authorized as Metadata is); the brokers
    // are those Metadata names.
    let request = rw::MetadataRequest {
        topics: Some(Vec::new()),
    };
    let out = km::DescribeClusterResponse::default();
    match shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("DescribeCluster")))
    {
        Ok(_) => {
            let me = shared.front.config().id;
            out.with_cluster_id(sb(shared.front.cluster_id()))
                .with_controller_id(BrokerId(me))
                .with_brokers(
                    kafka_brokers(shared)
                        .into_iter()
                        .map(|(id, e)| {
                            km::describe_cluster_response::DescribeClusterBroker::default()
                                .with_broker_id(BrokerId(id))
                                .with_host(sb(e.host))
                                .with_port(e.port)
                        })
                        .collect(),
                )
        }
        Err(e) => out
            .with_error_code(to_kafka(e.code))
            .with_error_message(message(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_proto::batch::{BATCH_HEADER_LEN, BatchView, batches};
    use rill_proto::{BatchBuilder, Compression, Record};

    /// A batch of `n` records as Rill wrote lz4 before it wrote frames.
    fn legacy_lz4(n: usize) -> Vec<u8> {
        let mut b = BatchBuilder::new(Compression::None);
        for i in 0..n {
            b.push(&Record::from_value(format!("old {i}"), 1_000 + i as i64));
        }
        let plain = b.build();
        let mut out = plain[..BATCH_HEADER_LEN].to_vec();
        out.extend_from_slice(&lz4_flex::compress_prepend_size(&plain[BATCH_HEADER_LEN..]));
        let length = (out.len() - 12) as i32;
        out[8..12].copy_from_slice(&length.to_be_bytes());
        let attributes = i16::from_be_bytes([out[21], out[22]]) | 3;
        out[21..23].copy_from_slice(&attributes.to_be_bytes());
        let crc = rill_proto::crc::crc32c(&out[21..]);
        out[17..21].copy_from_slice(&crc.to_be_bytes());
        out
    }

    #[test]
    fn legacy_lz4_batches_reach_kafka_clients_as_frames() {
        let mut current = BatchBuilder::new(Compression::Zstd);
        current.push(&Record::from_value("new", 5));
        let current = current.build();
        let old = legacy_lz4(20);
        let mut fetched = current.to_vec();
        fetched.extend_from_slice(&old);
        fetched.extend_from_slice(&current);
        // A fetch may end inside a batch: that tail passes through.
        fetched.extend_from_slice(&old[..30]);
        let served = kafka_readable(Bytes::from(fetched.clone()));
        let views: Vec<BatchView<'_>> = batches(&served).map_while(Result::ok).collect();
        assert_eq!(views.len(), 3);
        assert_eq!(views[0].as_bytes(), &current[..]);
        assert_eq!(views[2].as_bytes(), &current[..]);
        let section = &views[1].as_bytes()[BATCH_HEADER_LEN..];
        assert_eq!(&section[..4], &[0x04, 0x22, 0x4d, 0x18], "an LZ4 frame");
        views[1].verify_crc().unwrap();
        let old_records = BatchView::new(&old).unwrap().records().unwrap();
        assert_eq!(views[1].records().unwrap(), old_records);
        assert!(served.ends_with(&old[..30]));
        // Nothing to rewrite: the same bytes, not a copy.
        let plain = Bytes::from(current.to_vec());
        let again = kafka_readable(plain.clone());
        assert_eq!(again.as_ptr(), plain.as_ptr());
    }
}
