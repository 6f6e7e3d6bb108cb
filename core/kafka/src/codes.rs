//! Rill's error codes as Kafka's (`org.apache.kafka.common.protocol.Errors`),
//! chosen so a Kafka client retries, refreshes its metadata or gives up as it
//! would against Kafka. The match is exhaustive: a new `ErrorCode` must pick
//! its Kafka code here.

use rill_proto::wire::ErrorCode;

/// Kafka's error codes this listener answers.
pub mod kafka {
    pub const NONE: i16 = 0;
    pub const UNKNOWN_SERVER_ERROR: i16 = -1;
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub const CORRUPT_MESSAGE: i16 = 2;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const LEADER_NOT_AVAILABLE: i16 = 5;
    pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    pub const REQUEST_TIMED_OUT: i16 = 7;
    pub const BROKER_NOT_AVAILABLE: i16 = 8;
    pub const MESSAGE_TOO_LARGE: i16 = 10;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const NOT_COORDINATOR: i16 = 16;
    pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub const NOT_ENOUGH_REPLICAS: i16 = 19;
    pub const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;
    pub const INVALID_REQUIRED_ACKS: i16 = 21;
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    pub const ILLEGAL_GENERATION: i16 = 22;
    pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
    pub const INVALID_GROUP_ID: i16 = 24;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    pub const GROUP_AUTHORIZATION_FAILED: i16 = 30;
    pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
    pub const INVALID_TIMESTAMP: i16 = 32;
    pub const UNSUPPORTED_VERSION: i16 = 35;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_PARTITIONS: i16 = 37;
    pub const INVALID_REPLICATION_FACTOR: i16 = 38;
    pub const INVALID_CONFIG: i16 = 40;
    pub const NOT_CONTROLLER: i16 = 41;
    pub const INVALID_REQUEST: i16 = 42;
    pub const POLICY_VIOLATION: i16 = 44;
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    pub const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub const KAFKA_STORAGE_ERROR: i16 = 56;
    pub const NON_EMPTY_GROUP: i16 = 68;
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
    pub const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
    pub const FENCED_LEADER_EPOCH: i16 = 74;
    pub const MEMBER_ID_REQUIRED: i16 = 79;
    pub const UNKNOWN_LEADER_EPOCH: i16 = 75;
    pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
    pub const INVALID_RECORD: i16 = 87;
    pub const UNKNOWN_TOPIC_ID: i16 = 100;
    pub const FENCED_MEMBER_EPOCH: i16 = 110;
    pub const STALE_MEMBER_EPOCH: i16 = 113;
    pub const INVALID_TXN_STATE: i16 = 48;
    pub const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
    pub const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
    pub const CONCURRENT_TRANSACTIONS: i16 = 51;
    pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
    pub const PRODUCER_FENCED: i16 = 90;
    pub const UNSTABLE_OFFSET_COMMIT: i16 = 88;
    pub const OFFSET_NOT_AVAILABLE: i16 = 78;
    pub const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
}

/// The Kafka error code for a Rill error code.
pub fn to_kafka(code: ErrorCode) -> i16 {
    use kafka::*;
    match code {
        ErrorCode::InternalError => UNKNOWN_SERVER_ERROR,
        ErrorCode::InvalidRequest => INVALID_REQUEST,
        ErrorCode::UnsupportedVersion => UNSUPPORTED_VERSION,
        ErrorCode::RequestTooLarge => MESSAGE_TOO_LARGE,
        ErrorCode::UnknownTopicOrPartition => UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode::TopicAlreadyExists => TOPIC_ALREADY_EXISTS,
        ErrorCode::InvalidTopic => INVALID_TOPIC_EXCEPTION,
        ErrorCode::InvalidPartitions => INVALID_PARTITIONS,
        ErrorCode::InvalidReplicationFactor => INVALID_REPLICATION_FACTOR,
        ErrorCode::InvalidConfig => INVALID_CONFIG,
        ErrorCode::OffsetOutOfRange => OFFSET_OUT_OF_RANGE,
        ErrorCode::RecordTooLarge => MESSAGE_TOO_LARGE,
        ErrorCode::CorruptRecord => CORRUPT_MESSAGE,
        ErrorCode::NotLeaderOrFollower => NOT_LEADER_OR_FOLLOWER,
        ErrorCode::NotEnoughReplicas => NOT_ENOUGH_REPLICAS,
        ErrorCode::RequestTimedOut => REQUEST_TIMED_OUT,
        ErrorCode::BrokerNotAvailable => BROKER_NOT_AVAILABLE,
        ErrorCode::StorageError => KAFKA_STORAGE_ERROR,
        ErrorCode::FencedLeaderEpoch => FENCED_LEADER_EPOCH,
        ErrorCode::UnknownLeaderEpoch => UNKNOWN_LEADER_EPOCH,
        ErrorCode::PolicyViolation => POLICY_VIOLATION,
        // A broker bound is hit: retriable, as a timeout is.
        ErrorCode::ResourceExhausted => REQUEST_TIMED_OUT,
        ErrorCode::NotController => NOT_CONTROLLER,
        ErrorCode::NotCoordinator => NOT_COORDINATOR,
        ErrorCode::CoordinatorNotAvailable => COORDINATOR_NOT_AVAILABLE,
        ErrorCode::UnknownMemberId => UNKNOWN_MEMBER_ID,
        ErrorCode::FencedMemberEpoch => FENCED_MEMBER_EPOCH,
        ErrorCode::GroupIdNotFound => GROUP_ID_NOT_FOUND,
        ErrorCode::NonEmptyGroup => NON_EMPTY_GROUP,
        ErrorCode::InvalidGroupId => INVALID_GROUP_ID,
        ErrorCode::OutOfOrderSequence => OUT_OF_ORDER_SEQUENCE_NUMBER,
        ErrorCode::DuplicateSequence => DUPLICATE_SEQUENCE_NUMBER,
        ErrorCode::InvalidProducerEpoch => INVALID_PRODUCER_EPOCH,
        // Kafka has no tier error a client knows; its storage error is retriable.
        ErrorCode::RemoteStorageUnavailable => KAFKA_STORAGE_ERROR,
        ErrorCode::GroupMaxSizeReached => GROUP_MAX_SIZE_REACHED,
        ErrorCode::InconsistentGroupProtocol => INCONSISTENT_GROUP_PROTOCOL,
        ErrorCode::IllegalGeneration => ILLEGAL_GENERATION,
        ErrorCode::RebalanceInProgress => REBALANCE_IN_PROGRESS,
        ErrorCode::MemberIdRequired => MEMBER_ID_REQUIRED,
        ErrorCode::NotEnoughReplicasAfterAppend => NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        // The quorum is electing: the partition's leader is not known yet.
        ErrorCode::ClusterNotReady => LEADER_NOT_AVAILABLE,
        ErrorCode::ClusterAuthorizationFailed => CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode::TopicAuthorizationFailed => TOPIC_AUTHORIZATION_FAILED,
        ErrorCode::GroupAuthorizationFailed => GROUP_AUTHORIZATION_FAILED,
        // Kafka has no transforms; no Kafka api names one.
        ErrorCode::TransformAuthorizationFailed => CLUSTER_AUTHORIZATION_FAILED,
        // This broker is fenced: make the client refresh its metadata.
        ErrorCode::BrokerFenced => NOT_LEADER_OR_FOLLOWER,
        ErrorCode::InvalidRecord => INVALID_RECORD,
        ErrorCode::InvalidTimestamp => INVALID_TIMESTAMP,
        ErrorCode::ProducerFenced => PRODUCER_FENCED,
        ErrorCode::ConcurrentTransactions => CONCURRENT_TRANSACTIONS,
        ErrorCode::InvalidTxnState => INVALID_TXN_STATE,
        ErrorCode::InvalidProducerIdMapping => INVALID_PRODUCER_ID_MAPPING,
        ErrorCode::InvalidTransactionTimeout => INVALID_TRANSACTION_TIMEOUT,
        ErrorCode::TransactionalIdAuthorizationFailed => TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode::UnstableOffsetCommit => UNSTABLE_OFFSET_COMMIT,
        ErrorCode::OffsetNotAvailable => OFFSET_NOT_AVAILABLE,
        ErrorCode::TransactionalIdNotFound => TRANSACTIONAL_ID_NOT_FOUND,
        ErrorCode::Unknown(_) => UNKNOWN_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_clients_act_on_map_to_kafkas() {
        assert_eq!(to_kafka(ErrorCode::NotLeaderOrFollower), 6);
        assert_eq!(to_kafka(ErrorCode::UnknownTopicOrPartition), 3);
        assert_eq!(to_kafka(ErrorCode::TopicAuthorizationFailed), 29);
        assert_eq!(to_kafka(ErrorCode::OffsetOutOfRange), 1);
        assert_eq!(to_kafka(ErrorCode::OutOfOrderSequence), 45);
        assert_eq!(to_kafka(ErrorCode::Unknown(999)), -1);
    }
}
