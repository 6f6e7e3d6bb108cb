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
//! What it is not: no consumer groups yet (assign partitions explicitly), no
//! idempotent or transactional producer.
//!
//! Invariants: every request is bounded in time (`request_timeout`) and size
//! (`max_request_bytes`, `max_response_bytes`); the producer's memory is bounded
//! by `buffer_memory` (`send` waits for space), the consumer's by its fetch sizes;
//! records of one partition are appended in `send` order; every error says what
//! failed, where, and what to do.
//!
//! # Example
//!
//! ```no_run
//! use rill_client::{Client, ClientConfig, ConsumerConfig, NewTopic, ProducerConfig, ProducerRecord};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), rill_client::ClientError> {
//! let client = Client::connect(ClientConfig::new("127.0.0.1:9092")).await?;
//! client.admin().create_topic(NewTopic {
//!     name: "events".into(),
//!     partitions: Some(3),
//!     replication_factor: None,
//!     configs: vec![],
//! }).await?;
//!
//! let producer = client.producer(ProducerConfig::default())?;
//! let delivery = producer.send(ProducerRecord::new("events", "hello").key("user-1")).await?;
//! let meta = delivery.await?;
//! println!("written to {}-{} at offset {}", meta.topic, meta.partition, meta.offset);
//! producer.close().await?;
//!
//! let mut consumer = client.consumer(ConsumerConfig::default())?;
//! consumer.assign_topic("events").await?;
//! for record in consumer.poll(Duration::from_secs(1)).await? {
//!     println!("{}-{}@{}: {:?}", record.topic, record.partition, record.offset, record.value);
//! }
//! # Ok(())
//! # }
//! ```

mod admin;
mod client;
mod config;
mod consumer;
mod error;
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
pub use error::ClientError;
pub use producer::{DeliveryFuture, Producer, ProducerRecord, RecordMetadata};

// The wire and batch types the API speaks, so users need not depend on rill-proto.
pub use rill_proto::wire::{
    Acks, BrokerInfo, ConfigEntry, ErrorCode, ErrorInfo, MetadataResponse, NewTopic, OffsetSpec,
    PartitionMetadata, TopicMetadata,
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
