//! rill-client: the async (tokio) client library of Rill — admin, producer and
//! consumer over QUIC.
//!
//! What it is: a [`Client`] holds one QUIC connection per broker and a cache of
//! the cluster metadata, and routes each partition's requests to its leader,
//! refreshing the metadata and retrying when leadership moves
//! (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION). On top of it: [`Admin`]
//! (topics, configs, cluster), [`Producer`] (batching, partitioning, pipelined
//! produce requests, back-pressure) and [`Consumer`] (assigned partitions,
//! seeks, pipelined fetches, CRC-checked zero-copy decoding).
//!
//! Consumer groups: [`GroupConsumer`] (via [`Client::group_consumer`]) joins a
//! group whose coordinator assigns it partitions, commits offsets, and reports
//! assignment changes as [`GroupEvent`]s; [`Admin`] lists, describes, resets and
//! deletes groups.
//!
//! Producers are idempotent by default (a producer id from the quorum, sequence
//! numbers per partition, so a retried batch is written once). What it is not:
//! no transactional producer yet.
//!
//! Invariants: every request is bounded in time (`request_timeout`) and size
//! (`max_request_bytes`, `max_response_bytes`); the producer's memory is bounded
//! by `buffer_memory` (`send` waits for space), the consumer's by its fetch sizes;
//! records of one partition are appended in `send` order; every error says what
//! failed, where, and what to do.
//!
//! # Example
//!
//! ```
//! use rill_client::{Client, ClientConfig, ConsumerConfig, NewTopic, ProducerConfig, ProducerRecord};
//! use std::time::Duration;
//!
//! # use rill_broker::{Broker, BrokerConfig};
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // An embedded broker on a free port, with throw-away data and Rill home.
//! # let data = tempfile::tempdir()?;
//! # let home = tempfile::tempdir()?;
//! # let broker = Broker::start(BrokerConfig {
//! #     listen: "127.0.0.1:0".parse()?,
//! #     data_dir: data.path().to_path_buf(),
//! #     rill_home: Some(home.path().to_path_buf()),
//! #     ..BrokerConfig::default()
//! # }).await?;
//! # let bootstrap = broker.local_addr().to_string();
//! // `bootstrap` is "HOST:PORT" of any broker, e.g. "127.0.0.1:9092".
//! let mut config = ClientConfig::new(bootstrap);
//! # config.tls = rill_net::ClientTls::Dev { home: home.path().to_path_buf() };
//! let client = Client::connect(config).await?;
//! client.admin().create_topic(NewTopic {
//!     name: "events".into(),
//!     partitions: Some(3),
//!     replication_factor: None,
//!     configs: vec![],
//! }).await?;
//!
//! let producer = client.producer(ProducerConfig::default())?;
//! let delivery = producer.send(ProducerRecord::new("events", "hello").key("user-1")).await?;
//! let written = delivery.await?;
//! println!("written to {}-{} at offset {}", written.topic, written.partition, written.offset);
//! producer.close().await?;
//!
//! let mut consumer = client.consumer(ConsumerConfig::default())?;
//! consumer.assign_topic("events").await?;
//! let records = consumer.poll(Duration::from_secs(5)).await?;
//! assert_eq!(records[0].value.as_deref(), Some(&b"hello"[..]));
//! assert_eq!(records[0].offset, written.offset);
//! # broker.shutdown().await?;
//! # Ok(())
//! # }
//! ```

mod admin;
mod client;
mod config;
mod consumer;
mod error;
mod group;
pub mod partitioner;
mod producer;

use std::fmt;

pub use admin::{Admin, ClusterInfo, TopicDescription};
pub use client::Client;
pub use config::{
    ClientConfig, ConsumerConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, OffsetReset,
    ProducerConfig,
};
pub use consumer::{
    BUFFERED_RESPONSES_PER_PARTITION_MAX, Consumer, ConsumerRecord, FETCH_RETRY_BACKOFF,
};
pub use error::{ClientError, TxnAction};
pub use group::{
    COORDINATOR_RETRY_BACKOFF, DEFAULT_AUTO_COMMIT_INTERVAL_MS, DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_SESSION_TIMEOUT_MS, GroupConfig, GroupConsumer, GroupDescription, GroupEvent,
    GroupMember, GroupPartition, LEAVE_ON_DROP_TIMEOUT, ResetSpec,
};
pub use producer::{DeliveryFuture, IntoTopic, Producer, ProducerRecord, RecordMetadata};

// The wire and batch types the API speaks, so users need not depend on rill-proto.
pub use rill_proto::wire::{
    Acks, BrokerInfo, ConfigEntry, ErrorCode, ErrorInfo, GroupListing, Isolation, MetadataResponse,
    NewTopic, OffsetSpec, PartitionMetadata, TopicMetadata,
};
pub use rill_proto::wire::{
    AclOperation, AclResource, DEPLOYER_HEADER, TransformWriteRequest, TransformWriteResponse,
};
pub use rill_proto::{Compression, Header, Offset};

/// A partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: u32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: u32) -> TopicPartition {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}
