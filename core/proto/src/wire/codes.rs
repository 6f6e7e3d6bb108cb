//! Error codes: the typed reason every failed request or partition carries on the
//! wire, beside a human message. Codes are stable numbers (never reused); a code a
//! peer does not know decodes as `Unknown` rather than failing the whole response.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! error_codes {
    ($($name:ident = $num:literal, $retriable:literal, $doc:literal;)*) => {
        /// Why a request or a partition within it failed.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(from = "u16", into = "u16")]
        pub enum ErrorCode {
            $(#[doc = $doc] $name,)*
            /// A code this build does not know (sent by a newer peer).
            Unknown(u16),
        }

        impl From<u16> for ErrorCode {
            fn from(n: u16) -> ErrorCode {
                match n {
                    $($num => ErrorCode::$name,)*
                    other => ErrorCode::Unknown(other),
                }
            }
        }

        impl From<ErrorCode> for u16 {
            fn from(c: ErrorCode) -> u16 {
                match c {
                    $(ErrorCode::$name => $num,)*
                    ErrorCode::Unknown(n) => n,
                }
            }
        }

        impl ErrorCode {
            /// Whether retrying the same request later can succeed.
            pub fn is_retriable(self) -> bool {
                match self {
                    $(ErrorCode::$name => $retriable,)*
                    ErrorCode::Unknown(_) => false,
                }
            }

            /// The code's name, as shown to users (`UNKNOWN_TOPIC_OR_PARTITION`).
            pub fn name(self) -> String {
                match self {
                    $(ErrorCode::$name => to_screaming_snake(stringify!($name)),)*
                    ErrorCode::Unknown(n) => format!("UNKNOWN_ERROR_CODE_{n}"),
                }
            }
        }
    };
}

error_codes! {
    InternalError = 1, false, "The broker failed in a way it did not expect; see its log.";
    InvalidRequest = 2, false, "The request was malformed (bad frame, bad message).";
    UnsupportedVersion = 3, false, "The broker does not support this api key or version.";
    RequestTooLarge = 4, false, "The request frame exceeds the broker's limit.";
    UnknownTopicOrPartition = 5, true, "The topic or partition does not exist.";
    TopicAlreadyExists = 6, false, "A topic with that name exists already.";
    InvalidTopic = 7, false, "The topic name is not valid.";
    InvalidPartitions = 8, false, "The partition count is not valid.";
    InvalidReplicationFactor = 9, false, "The replication factor is not valid or exceeds live brokers.";
    InvalidConfig = 10, false, "A config key or value is not valid.";
    OffsetOutOfRange = 11, false, "The offset is outside the partition's log.";
    RecordTooLarge = 12, false, "A batch exceeds max.message.bytes.";
    CorruptRecord = 13, false, "A batch failed its CRC or did not parse.";
    NotLeaderOrFollower = 14, true, "This broker does not lead that partition.";
    NotEnoughReplicas = 15, true, "Fewer in-sync replicas than min.insync.replicas.";
    RequestTimedOut = 16, true, "The request did not complete within its timeout.";
    BrokerNotAvailable = 17, true, "The broker is shutting down or not ready.";
    StorageError = 18, true, "The broker could not read or write its disk.";
    FencedLeaderEpoch = 19, true, "The leader epoch in the request is older than the broker's.";
    UnknownLeaderEpoch = 20, true, "The leader epoch in the request is newer than the broker's.";
    PolicyViolation = 21, false, "The request is refused by broker policy.";
    ResourceExhausted = 22, true, "A broker bound (in-flight bytes, connections) is hit; retry later.";
    NotController = 23, true, "This broker is not the controller.";
    NotCoordinator = 24, true, "This broker is not the group's coordinator.";
    CoordinatorNotAvailable = 25, true, "The group coordinator is not available yet.";
    UnknownMemberId = 26, false, "The group does not know this member.";
    FencedMemberEpoch = 27, false, "The member's epoch is stale.";
    GroupIdNotFound = 28, false, "The group does not exist.";
    NonEmptyGroup = 29, false, "The group still has live members.";
    InvalidGroupId = 30, false, "The group id is not valid.";
    OutOfOrderSequence = 31, false, "The producer sequence number is out of order.";
    DuplicateSequence = 32, false, "The batch was written already (idempotent producer).";
    InvalidProducerEpoch = 33, false, "The producer epoch is stale.";
    RemoteStorageUnavailable = 55, true, "The object store holding tiered segments did not answer in time; retry later.";
    GroupMaxSizeReached = 34, false, "The group has as many members as the broker allows.";
    InconsistentGroupProtocol = 35, false, "The member's assignor differs from the group's, or is unknown.";
    IllegalGeneration = 43, false, "A classic group member's generation is not the group's (a rebalance ran since): rejoin.";
    RebalanceInProgress = 44, false, "The group is rebalancing: the member rejoins (JoinGroup) to get its new assignment.";
    MemberIdRequired = 45, false, "A new member of a classic group must join again with the member id the broker gave it.";
    NotEnoughReplicasAfterAppend = 40, true, "The batch was written, but the ISR shrank below min.insync.replicas before it was replicated.";
    ClusterNotReady = 41, true, "The metadata quorum has no leader yet (election in progress); retry shortly.";
    ClusterAuthorizationFailed = 60, false, "Only a broker of the cluster, or a principal allowed on the cluster, may call this api.";
    TopicAuthorizationFailed = 61, false, "The principal is not allowed this operation on the topic.";
    GroupAuthorizationFailed = 62, false, "The principal is not allowed this operation on the group.";
    TransformAuthorizationFailed = 63, false, "The principal is not allowed this operation on the transform.";
    BrokerFenced = 42, true, "The controller has fenced this broker (its session lapsed); it rejoins after its next heartbeat.";
    InvalidRecord = 56, false, "A batch's records are malformed (framing, record count, offset deltas, compression codec); it was not written.";
    InvalidTimestamp = 57, false, "A record's timestamp is outside the topic's message.timestamp.before.max.ms / message.timestamp.after.max.ms of the broker's time; it was not written.";
    ProducerFenced = 64, false, "Another instance with the same transactional id started (or its transaction timed out): this producer must stop.";
    ConcurrentTransactions = 65, true, "The transactional id's previous transaction is still completing; retry shortly.";
    InvalidTxnState = 66, false, "The request does not fit the transaction's state (e.g. commit after abort).";
    InvalidProducerIdMapping = 67, false, "The transactional id does not belong to this producer id: initialise the producer again.";
    InvalidTransactionTimeout = 68, false, "The transaction timeout is outside what the broker allows.";
    TransactionalIdAuthorizationFailed = 69, false, "The principal is not allowed this operation on the transactional id.";
    TransactionalIdNotFound = 72, false, "The transaction coordinator does not know this transactional id.";
    OffsetNotAvailable = 71, true, "The partition's leader restarted and does not know its high watermark again yet (its in-sync followers have not fetched): retry shortly.";
    UnstableOffsetCommit = 70, true, "An open transaction holds offsets for these partitions of the group (asked with require_stable): retry once it ends.";
}

fn to_screaming_snake(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 8);
    for (i, ch) in camel.chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// An error as it travels: the typed code and a message that says what failed and,
/// where it can, what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorInfo {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorInfo {
        ErrorInfo {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for ErrorInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ErrorInfo {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_survives() {
        for n in 0u16..64 {
            assert_eq!(u16::from(ErrorCode::from(n)), n);
        }
        let bytes = postcard::to_allocvec(&ErrorCode::Unknown(999)).unwrap();
        assert_eq!(
            postcard::from_bytes::<ErrorCode>(&bytes).unwrap(),
            ErrorCode::Unknown(999)
        );
        assert_eq!(
            ErrorCode::UnknownTopicOrPartition.name(),
            "UNKNOWN_TOPIC_OR_PARTITION"
        );
    }
}
