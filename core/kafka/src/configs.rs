//! Kafka's AlterConfigs and IncrementalAlterConfigs, for topics, translated to
//! Rill's AlterConfigs (keys to set, keys to remove). Topic configs are the
//! metadata quorum's, checked by the broker as for `rill topic alter`; broker
//! configs are the broker's file and are not altered through this listener.

use crate::Shared;
use crate::apis::{failed, message};
use crate::codes::to_kafka;
use bytes::Bytes;
use kafka_protocol::messages as km;
use rill_broker::front_door::Caller;
use rill_proto::wire as rw;
use rill_proto::wire::{ErrorCode, ErrorInfo};
use std::sync::Arc;

/// Kafka's config resource type of a topic.
pub(crate) const RESOURCE_TOPIC: i8 = 2;

/// IncrementalAlterConfigs operations.
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// Why a resource that is not a topic is refused.
fn not_a_topic(resource_type: i8, name: &str) -> ErrorInfo {
    ErrorInfo::new(
        ErrorCode::InvalidRequest,
        format!(
            "config resource {name:?} of type {resource_type}: only topic configs (type 2) are altered \
             through this broker; broker configs are its config file"
        ),
    )
}

/// A topic's configs that are set on it (not defaults), and every value.
async fn current(
    shared: &Shared,
    caller: &Arc<Caller>,
    topic: &str,
) -> Result<Vec<rw::ConfigEntry>, ErrorInfo> {
    let request = rw::DescribeConfigsRequest {
        topics: vec![topic.to_string()],
    };
    let response = shared
        .front
        .call(caller, &request, Bytes::new())
        .await?
        .ok_or_else(|| failed("DescribeConfigs"))?
        .0;
    let t = response
        .topics
        .into_iter()
        .next()
        .ok_or_else(|| failed("DescribeConfigs"))?;
    match t.error {
        Some(e) => Err(e),
        None => Ok(t.configs),
    }
}

async fn alter(
    shared: &Shared,
    caller: &Arc<Caller>,
    request: rw::AlterConfigsRequest,
) -> Result<(), ErrorInfo> {
    let response = shared
        .front
        .call(caller, &request, Bytes::new())
        .await?
        .ok_or_else(|| failed("AlterConfigs"))?
        .0;
    response.error.map_or(Ok(()), Err)
}

/// The items of a list-valued config (`cleanup.policy = "compact,delete"`).
fn items(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// One topic's IncrementalAlterConfigs as Rill's set/delete lists.
async fn incremental_request(
    shared: &Shared,
    caller: &Arc<Caller>,
    res: &km::incremental_alter_configs_request::AlterConfigsResource,
    validate_only: bool,
) -> Result<rw::AlterConfigsRequest, ErrorInfo> {
    let topic = res.resource_name.to_string();
    let mut set = Vec::new();
    let mut delete = Vec::new();
    let needs_current = res
        .configs
        .iter()
        .any(|c| c.config_operation == OP_APPEND || c.config_operation == OP_SUBTRACT);
    let now = if needs_current {
        current(shared, caller, &topic).await?
    } else {
        Vec::new()
    };
    for c in &res.configs {
        let name = c.name.to_string();
        let value = c.value.as_ref().map(|v| v.to_string());
        match c.config_operation {
            OP_SET => set.push((
                name.clone(),
                value.ok_or_else(|| {
                    ErrorInfo::new(
                        ErrorCode::InvalidConfig,
                        format!("{topic}: SET of {name} carries no value"),
                    )
                })?,
            )),
            OP_DELETE => delete.push(name),
            OP_APPEND | OP_SUBTRACT => {
                let mut list = now
                    .iter()
                    .find(|e| e.name == name)
                    .map(|e| items(&e.value))
                    .unwrap_or_default();
                let given = items(value.as_deref().unwrap_or_default());
                if c.config_operation == OP_APPEND {
                    for v in given {
                        if !list.contains(&v) {
                            list.push(v);
                        }
                    }
                } else {
                    list.retain(|v| !given.contains(v));
                }
                set.push((name, list.join(",")));
            }
            other => {
                return Err(ErrorInfo::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "{topic}: config operation {other} of {name} is not one of SET (0), DELETE (1), \
                         APPEND (2), SUBTRACT (3)"
                    ),
                ));
            }
        }
    }
    Ok(rw::AlterConfigsRequest {
        topic,
        set,
        delete,
        validate_only,
    })
}

pub(crate) async fn incremental_alter_configs(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::IncrementalAlterConfigsRequest,
) -> km::IncrementalAlterConfigsResponse {
    let mut responses = Vec::new();
    for res in &r.resources {
        let name = res.resource_name.to_string();
        let outcome = if res.resource_type != RESOURCE_TOPIC {
            Err(not_a_topic(res.resource_type, &name))
        } else {
            match incremental_request(shared, caller, res, r.validate_only).await {
                Ok(request) => alter(shared, caller, request).await,
                Err(e) => Err(e),
            }
        };
        let out = km::incremental_alter_configs_response::AlterConfigsResourceResponse::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name.clone());
        responses.push(match outcome {
            Ok(()) => out,
            Err(e) => out
                .with_error_code(to_kafka(e.code))
                .with_error_message(message(&e)),
        });
    }
    km::IncrementalAlterConfigsResponse::default().with_responses(responses)
}

/// AlterConfigs (the older api) replaces a topic's configs: what it names is
/// set, every other key set on the topic goes back to its default.
pub(crate) async fn alter_configs(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::AlterConfigsRequest,
) -> km::AlterConfigsResponse {
    let mut responses = Vec::new();
    for res in &r.resources {
        let name = res.resource_name.to_string();
        let outcome = if res.resource_type != RESOURCE_TOPIC {
            Err(not_a_topic(res.resource_type, &name))
        } else {
            let set: Vec<(String, String)> = res
                .configs
                .iter()
                .filter_map(|c| {
                    c.value
                        .as_ref()
                        .map(|v| (c.name.to_string(), v.to_string()))
                })
                .collect();
            match current(shared, caller, &name).await {
                Ok(now) => {
                    let delete = now
                        .iter()
                        .filter(|e| !e.is_default && !set.iter().any(|(k, _)| *k == e.name))
                        .map(|e| e.name.clone())
                        .collect();
                    let request = rw::AlterConfigsRequest {
                        topic: name.clone(),
                        set,
                        delete,
                        validate_only: r.validate_only,
                    };
                    alter(shared, caller, request).await
                }
                Err(e) => Err(e),
            }
        };
        let out = km::alter_configs_response::AlterConfigsResourceResponse::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name.clone());
        responses.push(match outcome {
            Ok(()) => out,
            Err(e) => out
                .with_error_code(to_kafka(e.code))
                .with_error_message(message(&e)),
        });
    }
    km::AlterConfigsResponse::default().with_responses(responses)
}

/// CreatePartitions (v0-3): each topic's count raised through Rill's
/// CreatePartitions (alter on the topic). Replica assignments given by the
/// client are refused (the broker spreads replicas itself); a topic named
/// twice is INVALID_REQUEST, as in Kafka.
pub(crate) async fn create_partitions(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::CreatePartitionsRequest,
) -> km::CreatePartitionsResponse {
    let mut results = Vec::new();
    for t in &r.topics {
        let name = t.name.0.to_string();
        let twice = r.topics.iter().filter(|o| o.name == t.name).count() > 1;
        let error = if twice {
            Some(ErrorInfo::new(
                ErrorCode::InvalidRequest,
                format!("topic {name} is named twice in one CreatePartitions"),
            ))
        } else if t.assignments.as_ref().is_some_and(|a| !a.is_empty()) {
            Some(ErrorInfo::new(
                ErrorCode::InvalidRequest,
                format!(
                    "topic {name}: replica assignments are not accepted; the broker spreads the \
                     new partitions' replicas itself (leave assignments out)"
                ),
            ))
        } else {
            let request = rw::CreatePartitionsRequest {
                topic: name.clone(),
                count: u32::try_from(t.count).unwrap_or(0),
                validate_only: r.validate_only,
            };
            match shared
                .front
                .call(caller, &request, Bytes::new())
                .await
                .and_then(|a| a.ok_or_else(|| failed("CreatePartitions")))
            {
                Ok((resp, _)) => resp.error,
                Err(e) => Some(e),
            }
        };
        let mut result = km::create_partitions_response::CreatePartitionsTopicResult::default()
            .with_name(t.name.clone());
        if let Some(e) = error {
            result = result
                .with_error_code(to_kafka(e.code))
                .with_error_message(message(&e));
        }
        results.push(result);
    }
    km::CreatePartitionsResponse::default().with_results(results)
}

/// DescribeProducers (v0): the idempotent producers each partition's leader
/// remembers, through Rill's DescribeProducers (read on the topic). Rill has
/// no transactions yet: coordinator epoch -1, no open transaction (-1).
pub(crate) async fn describe_producers(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::DescribeProducersRequest,
) -> km::DescribeProducersResponse {
    let request = rw::DescribeProducersRequest {
        partitions: r
            .topics
            .iter()
            .map(|t| rw::TopicPartitions {
                topic: t.name.0.to_string(),
                partitions: t
                    .partition_indexes
                    .iter()
                    .filter_map(|p| u32::try_from(*p).ok())
                    .collect(),
            })
            .collect(),
    };
    let answer = shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("DescribeProducers")));
    let mut found: std::collections::HashMap<(String, i32), rw::PartitionProducers> =
        std::collections::HashMap::new();
    let whole = match answer {
        Ok((resp, _)) => {
            for p in resp.partitions {
                found.insert((p.topic.clone(), p.partition as i32), p);
            }
            None
        }
        Err(e) => Some(e),
    };
    let topics = r
        .topics
        .iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let partitions = t
                .partition_indexes
                .iter()
                .map(|index| {
                    let out = km::describe_producers_response::PartitionResponse::default()
                        .with_partition_index(*index);
                    let error = match (&whole, found.get(&(name.clone(), *index))) {
                        (Some(e), _) => Some(e.clone()),
                        (None, Some(p)) => p.error.clone(),
                        (None, None) => Some(ErrorInfo::new(
                            ErrorCode::UnknownTopicOrPartition,
                            format!("partition {index} of topic {name} does not exist"),
                        )),
                    };
                    if let Some(e) = error {
                        return out
                            .with_error_code(to_kafka(e.code))
                            .with_error_message(message(&e));
                    }
                    let producers = found[&(name.clone(), *index)]
                        .producers
                        .iter()
                        .map(|p| {
                            km::describe_producers_response::ProducerState::default()
                                .with_producer_id(kafka_protocol::messages::ProducerId(
                                    p.producer_id,
                                ))
                                .with_producer_epoch(i32::from(p.epoch))
                                .with_last_sequence(p.last_sequence)
                                .with_last_timestamp(p.last_timestamp)
                                .with_coordinator_epoch(-1)
                                .with_current_txn_start_offset(-1)
                        })
                        .collect();
                    out.with_active_producers(producers)
                })
                .collect();
            km::describe_producers_response::TopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    km::DescribeProducersResponse::default().with_topics(topics)
}

#[cfg(test)]
mod tests {
    use super::items;

    #[test]
    fn list_values_split_on_commas() {
        assert_eq!(items("compact, delete"), vec!["compact", "delete"]);
        assert!(items("").is_empty());
    }
}
