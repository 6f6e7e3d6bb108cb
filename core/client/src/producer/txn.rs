//! A transactional producer's side of Kafka's transaction protocol: finding
//! its transaction coordinator, InitProducerId with the transactional id
//! (which fences older instances), AddPartitionsToTxn before the first batch
//! of a partition in a transaction, and EndTxn.
//!
//! Calls to the coordinator are retried, within the producer's
//! `delivery_timeout`, while the answer is retriable: the coordinator moved
//! (NOT_COORDINATOR: it is looked up again), is loading, or the previous
//! transaction is still completing (CONCURRENT_TRANSACTIONS).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use rill_proto::wire::{
    AddPartitionsToTxnRequest, ApiRequest, CoordinatorKind, EndTxnRequest, ErrorCode, ErrorInfo,
    FindCoordinatorRequest, InitProducerIdRequest, OffsetCommitPartition, TxnOffsetCommitRequest,
    TxnTopic,
};

use super::ProducerShared;
use crate::error::ClientError;

/// The transactional producer's state between calls.
#[derive(Debug)]
pub(crate) struct TxnState {
    pub id: String,
    /// The coordinator's broker id, once found.
    coordinator: Option<i32>,
    /// Between `begin_transaction` and its commit or abort.
    pub open: bool,
    /// Partitions added to the open transaction.
    pub added: HashSet<(Arc<str>, u32)>,
    /// Group offsets were sent in the open transaction.
    pub has_offsets: bool,
}

impl TxnState {
    pub fn new(id: String) -> TxnState {
        TxnState {
            id,
            coordinator: None,
            open: false,
            added: HashSet::new(),
            has_offsets: false,
        }
    }
}

/// Calls the transaction coordinator with `req`, retrying retriable answers.
/// `error_of` takes the error out of a response that carries one.
async fn call<R: ApiRequest>(
    shared: &ProducerShared,
    txn: &mut TxnState,
    what: &str,
    req: &R,
    error_of: impl Fn(&R::Response) -> Option<ErrorInfo>,
) -> Result<R::Response, ClientError> {
    let deadline = Instant::now() + shared.config.delivery_timeout;
    loop {
        let result: Result<R::Response, ClientError> = match coordinator(shared, txn).await {
            Ok(broker) => match shared.client.call(Some(broker), req, &[]).await {
                Ok((resp, _)) => match error_of(&resp) {
                    None => return Ok(resp),
                    Some(e) => Err(ClientError::broker(
                        format!("{what} for transactional id {:?}", txn.id),
                        e,
                    )),
                },
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        let e = result.expect_err("success returned above");
        if matches!(
            e.code(),
            Some(ErrorCode::NotCoordinator | ErrorCode::CoordinatorNotAvailable)
        ) || matches!(e, ClientError::Net(_))
        {
            txn.coordinator = None;
        }
        if !e.is_retriable() || Instant::now() + shared.config.retry_backoff >= deadline {
            return Err(e);
        }
        tracing::debug!(transactional_id = %txn.id, error = %e, "{what}: retrying");
        tokio::time::sleep(shared.config.retry_backoff).await;
    }
}

/// The coordinator's broker id (looked up if not known).
async fn coordinator(shared: &ProducerShared, txn: &mut TxnState) -> Result<i32, ClientError> {
    if let Some(c) = txn.coordinator {
        return Ok(c);
    }
    let req = FindCoordinatorRequest {
        group_id: txn.id.clone(),
        kind: CoordinatorKind::Transaction,
    };
    let (resp, _) = shared.client.call(None, &req, &[]).await?;
    if let Some(e) = resp.error {
        return Err(ClientError::broker(
            format!("finding the transaction coordinator of {:?}", txn.id),
            e,
        ));
    }
    // Make sure the client can reach it by id.
    if shared.client.broker_addr(resp.coordinator_id).is_none() {
        shared.client.metadata(Some(Vec::new())).await?;
    }
    txn.coordinator = Some(resp.coordinator_id);
    Ok(resp.coordinator_id)
}

/// InitProducerId with the transactional id: (producer id, epoch).
pub(crate) async fn init(
    shared: &ProducerShared,
    txn: &mut TxnState,
) -> Result<(i64, i16), ClientError> {
    let req = InitProducerIdRequest {
        transactional_id: Some(txn.id.clone()),
        transaction_timeout_ms: shared
            .config
            .transaction_timeout
            .as_millis()
            .min(i32::MAX as u128) as i32,
    };
    let resp = call(shared, txn, "InitProducerId", &req, |_| None).await?;
    Ok((resp.producer_id, resp.producer_epoch))
}

/// AddPartitionsToTxn for the partitions of `new` not added yet.
pub(crate) async fn add_partitions(
    shared: &ProducerShared,
    txn: &mut TxnState,
    producer: (i64, i16),
    new: &[(Arc<str>, u32)],
) -> Result<(), ClientError> {
    let mut topics: Vec<TxnTopic> = Vec::new();
    for (topic, partition) in new {
        if txn.added.contains(&(topic.clone(), *partition)) {
            continue;
        }
        match topics.iter_mut().find(|t| *t.topic == **topic) {
            Some(t) => t.partitions.push(*partition),
            None => topics.push(TxnTopic {
                topic: topic.to_string(),
                partitions: vec![*partition],
            }),
        }
    }
    if topics.is_empty() {
        return Ok(());
    }
    let req = AddPartitionsToTxnRequest {
        transactional_id: txn.id.clone(),
        producer_id: producer.0,
        producer_epoch: producer.1,
        topics,
    };
    call(shared, txn, "AddPartitionsToTxn", &req, |r| r.error.clone()).await?;
    txn.added.extend(new.iter().cloned());
    Ok(())
}

/// EndTxn: commit or abort the open transaction.
pub(crate) async fn end(
    shared: &ProducerShared,
    txn: &mut TxnState,
    producer: (i64, i16),
    commit: bool,
) -> Result<(), ClientError> {
    let req = EndTxnRequest {
        transactional_id: txn.id.clone(),
        producer_id: producer.0,
        producer_epoch: producer.1,
        commit,
    };
    call(shared, txn, "EndTxn", &req, |r| r.error.clone()).await?;
    Ok(())
}

/// TxnOffsetCommit: `group`'s offsets become committed with the transaction.
pub(crate) async fn commit_offsets(
    shared: &ProducerShared,
    txn: &mut TxnState,
    producer: (i64, i16),
    group: &str,
    partitions: Vec<OffsetCommitPartition>,
) -> Result<(), ClientError> {
    let req = TxnOffsetCommitRequest {
        transactional_id: txn.id.clone(),
        producer_id: producer.0,
        producer_epoch: producer.1,
        group_id: group.to_string(),
        partitions,
    };
    call(shared, txn, "TxnOffsetCommit", &req, |r| r.error.clone()).await?;
    // The transaction holds something to commit now.
    txn.has_offsets = true;
    Ok(())
}
