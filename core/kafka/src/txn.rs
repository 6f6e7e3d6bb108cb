//! Kafka's transactional producer apis (KIP-98) on Rill's transaction
//! coordinator: InitProducerId with a transactional id, AddPartitionsToTxn
//! v0-3 (the client's form; v4+ is Kafka's broker-to-broker form), EndTxn
//! v0-3, and transactional Produce (batches with the transactional bit,
//! passed through as sent). FindCoordinator key type 1 finds the coordinator.
//!
//! A transaction's consumer offsets (`send_offsets_to_transaction`):
//! AddOffsetsToTxn v0-3 adds the group, TxnOffsetCommit v0-3 its offsets; both
//! become Rill's TxnOffsetCommit (the coordinator of the transactional id keeps
//! them until the transaction ends; a broker that is not it forwards). The
//! member id and generation a v3 TxnOffsetCommit carries (KIP-447) are not
//! checked: the producer's epoch fences a zombie, as before KIP-447.
//!
//! Admin views (`kafka-transactions.sh list / describe`): DescribeTransactions
//! v0, answered by each id's coordinator, and ListTransactions v0-1, answered
//! by each broker for the ids it coordinates (v2's id pattern is not served).

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages as km;
use rill_broker::front_door::Caller;
use rill_proto::wire as rw;
use rill_proto::wire::ErrorInfo;

use crate::Shared;
use crate::apis::{code, failed, sb};
use crate::codes::{kafka, to_kafka};

/// InitProducerId with a transactional id: the coordinator's producer id and
/// the next epoch (fencing older instances).
pub(crate) async fn init_producer_id(
    shared: &Shared,
    caller: &Arc<Caller>,
    transactional_id: String,
    transaction_timeout_ms: i32,
) -> km::InitProducerIdResponse {
    let out = km::InitProducerIdResponse::default();
    let request = rw::InitProducerIdRequest {
        transactional_id: Some(transactional_id),
        transaction_timeout_ms,
    };
    match shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("InitProducerId")))
    {
        Ok((a, _)) => out
            .with_producer_id(km::ProducerId(a.producer_id))
            .with_producer_epoch(a.producer_epoch),
        Err(e) => {
            tracing::debug!(peer = %caller.peer, error = %e, "Kafka InitProducerId (transactional) failed");
            out.with_error_code(to_kafka(e.code))
                .with_producer_id(km::ProducerId(-1))
                .with_producer_epoch(-1)
        }
    }
}

/// AddPartitionsToTxn v0-3: one transaction's partitions; every partition of
/// the request gets the request's outcome.
pub(crate) async fn add_partitions_to_txn(
    shared: &Shared,
    caller: &Arc<Caller>,
    version: i16,
    r: km::AddPartitionsToTxnRequest,
) -> km::AddPartitionsToTxnResponse {
    use km::add_partitions_to_txn_response as resp;
    let answer = |error: Option<ErrorInfo>| {
        let results = r
            .v3_and_below_topics
            .iter()
            .map(|t| {
                resp::AddPartitionsToTxnTopicResult::default()
                    .with_name(t.name.clone())
                    .with_results_by_partition(
                        t.partitions
                            .iter()
                            .map(|p| {
                                resp::AddPartitionsToTxnPartitionResult::default()
                                    .with_partition_index(*p)
                                    .with_partition_error_code(code(&error))
                            })
                            .collect(),
                    )
            })
            .collect();
        km::AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results)
    };
    if version > 3 {
        // Kafka's broker-to-broker batch form: not a client's request.
        return km::AddPartitionsToTxnResponse::default()
            .with_error_code(kafka::UNSUPPORTED_VERSION);
    }
    let mut topics = Vec::new();
    for t in &r.v3_and_below_topics {
        let mut partitions = Vec::new();
        for p in &t.partitions {
            match u32::try_from(*p) {
                Ok(p) => partitions.push(p),
                Err(_) => {
                    return answer(Some(ErrorInfo::new(
                        rw::ErrorCode::UnknownTopicOrPartition,
                        format!("partition {p} of topic {} does not exist", t.name.0),
                    )));
                }
            }
        }
        topics.push(rw::TxnTopic {
            topic: t.name.0.to_string(),
            partitions,
        });
    }
    let request = rw::AddPartitionsToTxnRequest {
        transactional_id: r.v3_and_below_transactional_id.0.to_string(),
        producer_id: r.v3_and_below_producer_id.0,
        producer_epoch: r.v3_and_below_producer_epoch,
        topics,
    };
    let error = match shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("AddPartitionsToTxn")))
    {
        Ok((a, _)) => a.error,
        Err(e) => Some(e),
    };
    if let Some(e) = &error {
        tracing::debug!(peer = %caller.peer, error = %e, "Kafka AddPartitionsToTxn refused");
    }
    answer(error)
}

/// EndTxn v0-3.
pub(crate) async fn end_txn(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::EndTxnRequest,
) -> km::EndTxnResponse {
    let request = rw::EndTxnRequest {
        transactional_id: r.transactional_id.0.to_string(),
        producer_id: r.producer_id.0,
        producer_epoch: r.producer_epoch,
        commit: r.committed,
    };
    let error = match shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("EndTxn")))
    {
        Ok((a, _)) => a.error,
        Err(e) => Some(e),
    };
    if let Some(e) = &error {
        tracing::debug!(peer = %caller.peer, error = %e, "Kafka EndTxn refused");
    }
    km::EndTxnResponse::default().with_error_code(code(&error))
}

async fn txn_offsets(
    shared: &Shared,
    caller: &Arc<Caller>,
    request: rw::TxnOffsetCommitRequest,
) -> Option<ErrorInfo> {
    let error = match shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("TxnOffsetCommit")))
    {
        Ok((a, _)) => a.error,
        Err(e) => Some(e),
    };
    if let Some(e) = &error {
        tracing::debug!(peer = %caller.peer, error = %e, "Kafka transactional offsets refused");
    }
    error
}

/// AddOffsetsToTxn v0-3: the group joins the transaction.
pub(crate) async fn add_offsets_to_txn(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::AddOffsetsToTxnRequest,
) -> km::AddOffsetsToTxnResponse {
    let request = rw::TxnOffsetCommitRequest {
        transactional_id: r.transactional_id.0.to_string(),
        producer_id: r.producer_id.0,
        producer_epoch: r.producer_epoch,
        group_id: r.group_id.0.to_string(),
        partitions: Vec::new(),
    };
    let error = txn_offsets(shared, caller, request).await;
    km::AddOffsetsToTxnResponse::default().with_error_code(code(&error))
}

/// TxnOffsetCommit v0-3: the group's offsets, committed with the transaction.
pub(crate) async fn txn_offset_commit(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::TxnOffsetCommitRequest,
) -> km::TxnOffsetCommitResponse {
    use km::txn_offset_commit_response as resp;
    let mut partitions = Vec::new();
    let mut bad = None;
    for t in &r.topics {
        for p in &t.partitions {
            match u32::try_from(p.partition_index) {
                Ok(index) if p.committed_offset >= 0 => {
                    partitions.push(rw::OffsetCommitPartition {
                        topic: t.name.0.to_string(),
                        partition: index,
                        offset: rill_proto::Offset(p.committed_offset),
                        metadata: p
                            .committed_metadata
                            .as_ref()
                            .map(|m| m.to_string())
                            .unwrap_or_default(),
                    })
                }
                _ => {
                    bad = Some(ErrorInfo::new(
                        rw::ErrorCode::InvalidRequest,
                        format!(
                            "offset {} of {}-{} is not valid",
                            p.committed_offset, t.name.0, p.partition_index
                        ),
                    ))
                }
            }
        }
    }
    let error = match bad {
        Some(e) => Some(e),
        None => {
            let request = rw::TxnOffsetCommitRequest {
                transactional_id: r.transactional_id.0.to_string(),
                producer_id: r.producer_id.0,
                producer_epoch: r.producer_epoch,
                group_id: r.group_id.0.to_string(),
                partitions,
            };
            txn_offsets(shared, caller, request).await
        }
    };
    let topics = r
        .topics
        .iter()
        .map(|t| {
            resp::TxnOffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            resp::TxnOffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code(&error))
                        })
                        .collect(),
                )
        })
        .collect();
    km::TxnOffsetCommitResponse::default().with_topics(topics)
}

/// DescribeTransactions v0: each transactional id's state at its coordinator.
pub(crate) async fn describe_transactions(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::DescribeTransactionsRequest,
) -> km::DescribeTransactionsResponse {
    use km::describe_transactions_response::{TopicData, TransactionState};
    let ids: Vec<String> = r
        .transactional_ids
        .iter()
        .map(|t| t.0.to_string())
        .collect();
    let request = rw::DescribeTransactionsRequest {
        transactional_ids: ids.clone(),
    };
    let answered = shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("DescribeTransactions")));
    let states = match answered {
        Ok((a, _)) => a
            .transactions
            .into_iter()
            .map(|t| {
                TransactionState::default()
                    .with_error_code(code(&t.error))
                    .with_transactional_id(km::TransactionalId(sb(t.transactional_id)))
                    .with_transaction_state(sb(t.state))
                    .with_transaction_timeout_ms(t.timeout_ms)
                    .with_transaction_start_time_ms(t.start_ms)
                    .with_producer_id(km::ProducerId(t.producer_id))
                    .with_producer_epoch(t.producer_epoch)
                    .with_topics(
                        t.topics
                            .into_iter()
                            .map(|tp| {
                                TopicData::default()
                                    .with_topic(km::TopicName(sb(tp.topic)))
                                    .with_partitions(
                                        tp.partitions.into_iter().map(|p| p as i32).collect(),
                                    )
                            })
                            .collect(),
                    )
            })
            .collect(),
        Err(e) => ids
            .into_iter()
            .map(|id| {
                TransactionState::default()
                    .with_error_code(to_kafka(e.code))
                    .with_transactional_id(km::TransactionalId(sb(id)))
                    .with_transaction_state(sb(""))
                    .with_producer_id(km::ProducerId(-1))
                    .with_producer_epoch(-1)
                    .with_transaction_start_time_ms(-1)
            })
            .collect(),
    };
    km::DescribeTransactionsResponse::default().with_transaction_states(states)
}

/// ListTransactions v0-1: the transactional ids this broker coordinates.
pub(crate) async fn list_transactions(
    shared: &Shared,
    caller: &Arc<Caller>,
    r: km::ListTransactionsRequest,
) -> km::ListTransactionsResponse {
    use km::list_transactions_response::TransactionState;
    let request = rw::ListTransactionsRequest {
        states: r.state_filters.iter().map(|s| s.to_string()).collect(),
        producer_ids: r.producer_id_filters.iter().map(|p| p.0).collect(),
        // v1's duration filter (v0 sends none: -1).
        min_duration_ms: r.duration_filter,
    };
    let answered = shared
        .front
        .call(caller, &request, Bytes::new())
        .await
        .and_then(|a| a.ok_or_else(|| failed("ListTransactions")));
    match answered {
        Ok((a, _)) => km::ListTransactionsResponse::default()
            .with_error_code(code(&a.error))
            .with_unknown_state_filters(a.unknown_states.into_iter().map(sb).collect())
            .with_transaction_states(
                a.transactions
                    .into_iter()
                    .map(|t| {
                        TransactionState::default()
                            .with_transactional_id(km::TransactionalId(sb(t.transactional_id)))
                            .with_producer_id(km::ProducerId(t.producer_id))
                            .with_transaction_state(sb(t.state))
                    })
                    .collect(),
            ),
        Err(e) => km::ListTransactionsResponse::default().with_error_code(to_kafka(e.code)),
    }
}
