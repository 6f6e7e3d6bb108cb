//! The one error type of rill-client, [`ClientError`].
//!
//! Invariant: every message says what failed (topic, partition, offset, broker
//! address where known) and, when the user can act, what to do. Errors shared by
//! many records (a failed produce batch) travel as [`ClientError::Shared`], which
//! displays exactly like the error it wraps.

use std::sync::Arc;

use rill_proto::DecodeError;
use rill_proto::wire::{ErrorCode, ErrorInfo};
use thiserror::Error;

/// Everything a client call can fail with.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The broker answered with an error code.
    #[error("{context}: {error}")]
    Broker { context: String, error: ErrorInfo },

    /// The transport failed (TLS setup, connecting, a stream or connection broke).
    #[error(transparent)]
    Net(#[from] rill_net::NetError),

    /// No bootstrap broker could be reached.
    #[error(
        "no broker answering at {addrs}: start one with `rill broker` or pass --bootstrap HOST:PORT (last error: {last})"
    )]
    NoBroker {
        addrs: String,
        last: Box<ClientError>,
    },

    /// Bytes from the broker did not decode.
    #[error("could not decode {what}: {source}")]
    Decode {
        what: String,
        #[source]
        source: DecodeError,
    },

    /// An operation did not complete in time.
    #[error("{what} timed out")]
    Timeout { what: String },

    /// The topic does not exist (after a metadata refresh).
    #[error("topic {0:?} does not exist: create it with `rill topic create {0}`")]
    UnknownTopic(String),

    /// The producer or consumer was closed.
    #[error("the client was closed")]
    Closed,

    /// A configuration or argument is not usable.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A fetched batch failed its CRC or did not parse.
    #[error(
        "corrupt batch in {topic}-{partition} at offset {offset}: {source}: the data was damaged on the broker or in transit; seek past it to skip it"
    )]
    CorruptBatch {
        topic: String,
        partition: u32,
        offset: rill_proto::Offset,
        #[source]
        source: DecodeError,
    },

    /// A record is larger than a bound allows.
    #[error(
        "record of {size} bytes for topic {topic} is larger than {limit} ({max} bytes): send smaller records or raise {limit}"
    )]
    RecordTooLarge {
        topic: String,
        size: usize,
        limit: &'static str,
        max: usize,
    },

    /// An operation on one partition failed for the reason in `source`.
    #[error("{context}: {source}")]
    Failed {
        context: String,
        source: Arc<ClientError>,
    },

    /// The same failure, shared by every record of a batch.
    #[error(transparent)]
    Shared(Arc<ClientError>),
}

impl ClientError {
    /// The broker error code, if the broker answered with one (looking through
    /// [`ClientError::Shared`]).
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Broker { error, .. } => Some(error.code),
            ClientError::Shared(inner) => inner.code(),
            ClientError::Failed { source, .. } => source.code(),
            _ => None,
        }
    }

    /// Whether a group coordinator refused this member as no longer in the group
    /// (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH): it has lost its partitions and
    /// rejoins; records since its last commit will be delivered again.
    pub fn is_fenced(&self) -> bool {
        matches!(
            self.code(),
            Some(ErrorCode::UnknownMemberId | ErrorCode::FencedMemberEpoch)
        )
    }

    /// What a transactional producer does after this error: retry the same
    /// call, abort the transaction and start it again, or stop (another
    /// instance with its transactional id took over).
    pub fn txn_action(&self) -> TxnAction {
        match self.code() {
            Some(
                ErrorCode::ProducerFenced
                | ErrorCode::InvalidProducerEpoch
                | ErrorCode::InvalidProducerIdMapping
                | ErrorCode::TransactionalIdAuthorizationFailed,
            ) => TxnAction::Fenced,
            _ if self.is_retriable() => TxnAction::Retry,
            _ => TxnAction::Abort,
        }
    }

    /// Whether retrying the same operation later can succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            ClientError::Broker { error, .. } => error.code.is_retriable(),
            // A refused certificate stays refused.
            ClientError::Net(rill_net::NetError::ClientCertRefused { .. }) => false,
            ClientError::Net(_) | ClientError::Timeout { .. } => true,
            ClientError::Shared(inner) => inner.is_retriable(),
            ClientError::Failed { source, .. } => source.is_retriable(),
            _ => false,
        }
    }

    pub(crate) fn broker(context: impl Into<String>, error: ErrorInfo) -> ClientError {
        ClientError::Broker {
            context: context.into(),
            error,
        }
    }

    pub(crate) fn decode(what: impl Into<String>, source: DecodeError) -> ClientError {
        ClientError::Decode {
            what: what.into(),
            source,
        }
    }

    /// A copy of this error to hand to several waiters.
    pub(crate) fn into_shared(self) -> Arc<ClientError> {
        match self {
            ClientError::Shared(inner) => inner,
            other => Arc::new(other),
        }
    }
}

/// What to do after a transactional producer's error ([`ClientError::txn_action`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnAction {
    /// Transient: the same call may succeed later.
    Retry,
    /// The transaction cannot commit: abort it, then start over.
    Abort,
    /// Fenced: a newer instance owns the transactional id; stop this producer.
    Fenced,
}

/// Whether a broker error means the client's view of leadership is stale and a
/// metadata refresh is due before retrying.
pub(crate) fn needs_metadata_refresh(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::NotLeaderOrFollower
            | ErrorCode::UnknownTopicOrPartition
            | ErrorCode::FencedLeaderEpoch
            | ErrorCode::UnknownLeaderEpoch
            | ErrorCode::BrokerNotAvailable
    )
}
