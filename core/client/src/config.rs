//! Client, producer and consumer settings, with Kafka-like defaults.
//!
//! Every bound the client keeps (buffer memory, in-flight requests, fetch sizes,
//! timeouts) is a field here with a named default; `validate` refuses values that
//! cannot work, with a message naming the field.

use std::time::Duration;

use rill_proto::Compression;
use rill_proto::wire::{Acks, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_RESPONSE_BYTES};

use crate::consumer::FETCH_RETRY_BACKOFF;
use crate::error::ClientError;

/// Default bound on one request, waiting for the answer included.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default bound on establishing one QUIC connection (handshake included).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = rill_net::CONNECT_TIMEOUT;

/// How to reach the cluster.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Brokers to ask first, `host:port` (UDP). Any one answering is enough.
    pub bootstrap: Vec<String>,
    /// Which certificate authority to trust (and client certificate, if any).
    pub tls: rill_net::ClientTls,
    /// Names this client in the brokers' logs.
    pub client_id: String,
    /// Bound on one request, from sending to the whole answer.
    pub request_timeout: Duration,
    /// Bound on connecting to one broker.
    pub connect_timeout: Duration,
    /// The largest response frame accepted; bigger ones are refused before allocation.
    pub max_response_bytes: u32,
    /// The largest UDP payload QUIC path MTU discovery may reach (1200..=65527;
    /// default 65488, loopback's). Discovery stops at what the path carries
    /// (1452 on Ethernet, 8952 on jumbo frames); a lower bound only shortens it.
    pub max_udp_payload_bytes: u16,
}

impl ClientConfig {
    /// A config for one bootstrap address that trusts the development CA in the
    /// Rill home (`$RILL_HOME` or `~/.rill`).
    /// `bootstrap` is one `HOST:PORT` or a comma-separated list of them; the
    /// client reaches the cluster while any listed broker is up.
    pub fn new(bootstrap: impl Into<String>) -> ClientConfig {
        let bootstrap: String = bootstrap.into();
        ClientConfig {
            bootstrap: bootstrap
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            tls: rill_net::ClientTls::Dev {
                home: rill_net::rill_home(),
            },
            client_id: format!("rill-client/{}", env!("CARGO_PKG_VERSION")),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_udp_payload_bytes: rill_net::MTU_UPPER_BOUND_DEFAULT,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ClientError> {
        if self.bootstrap.is_empty() {
            return Err(ClientError::Config(
                "no bootstrap address: pass --bootstrap HOST:PORT".into(),
            ));
        }
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(ClientError::Config(
                "request_timeout and connect_timeout must be above zero".into(),
            ));
        }
        let payload = self.max_udp_payload_bytes;
        if !(rill_net::UDP_PAYLOAD_MIN..=rill_net::UDP_PAYLOAD_MAX).contains(&payload) {
            return Err(ClientError::Config(format!(
                "max_udp_payload_bytes must be in {}..={}, got {payload}",
                rill_net::UDP_PAYLOAD_MIN,
                rill_net::UDP_PAYLOAD_MAX
            )));
        }
        if self.max_response_bytes < 1024 {
            return Err(ClientError::Config(format!(
                "max_response_bytes {} is too small (at least 1024)",
                self.max_response_bytes
            )));
        }
        Ok(())
    }
}

/// How a [`crate::Producer`] batches and sends.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// How many replicas must have a batch before it counts as delivered.
    pub acks: Acks,
    /// How long a batch may wait for more records before it is sent.
    pub linger: Duration,
    /// Target size of one batch (uncompressed bytes); a batch is sent once full.
    /// A partition's open batch holds a buffer of this size (up to 1 MiB) from
    /// its first record, as Kafka's producer does, so records are encoded in
    /// place; a batch sent short of it keeps only what it holds.
    pub batch_size: usize,
    /// Compression of each batch's records.
    pub compression: Compression,
    /// Bound on bytes of records waiting to be acknowledged; `send` waits for space.
    pub buffer_memory: usize,
    /// Bound on produce requests in flight to one broker (each on its own stream).
    pub max_in_flight_per_broker: usize,
    /// How many times a batch is retried after a retriable error.
    pub retries: u32,
    /// Pause before a batch's first retry. Each further retry of the batch
    /// doubles it, up to `retry_backoff_max`, with 20% jitter either way
    /// (Kafka's `retry.backoff.ms`, exponential since KIP-580). A batch
    /// refused by a leader that the cluster has since replaced is retried
    /// with no pause (KIP-951).
    pub retry_backoff: Duration,
    /// Bound on the pause between retries (Kafka's `retry.backoff.max.ms`).
    pub retry_backoff_max: Duration,
    /// Bound on the time from `send` to the record's acknowledgement or failure.
    pub delivery_timeout: Duration,
    /// Bound on one produce request (all its batches); also caps one record.
    pub max_request_bytes: usize,
    /// Idempotent delivery (with `acks = All`; Kafka's `enable.idempotence`, on by
    /// default): the producer takes a producer id from the cluster and numbers its
    /// records per partition, so a batch retried after a timeout or a leader
    /// change is written once, never twice.
    pub idempotence: bool,
    /// Transactions (Kafka's `transactional.id`): the producer's writes are
    /// grouped into transactions ([`crate::Producer::begin_transaction`]) that
    /// readers with `read_committed` see whole or not at all; a new producer
    /// with the same id fences this one. Needs idempotence and acks=all.
    pub transactional_id: Option<String>,
    /// How long a transaction may stay open before the coordinator aborts it.
    pub transaction_timeout: Duration,
}

impl Default for ProducerConfig {
    fn default() -> ProducerConfig {
        ProducerConfig {
            acks: Acks::All,
            linger: Duration::from_millis(5),
            batch_size: 64 * 1024,
            compression: Compression::None,
            buffer_memory: 64 * 1024 * 1024,
            max_in_flight_per_broker: 5,
            retries: u32::MAX,
            retry_backoff: Duration::from_millis(100),
            retry_backoff_max: Duration::from_secs(1),
            delivery_timeout: Duration::from_secs(120),
            max_request_bytes: 8 * 1024 * 1024,
            idempotence: true,
            transactional_id: None,
            transaction_timeout: Duration::from_secs(60),
        }
    }
}

impl ProducerConfig {
    /// The pause before a batch's retry number `retry` (1 for the first):
    /// `retry_backoff * 2^(retry - 1)`, times a random factor in [0.8, 1.2],
    /// at most `retry_backoff_max` (as Kafka's `ExponentialBackoff`).
    pub fn retry_backoff_for(&self, retry: u32) -> Duration {
        exponential_backoff(self.retry_backoff, self.retry_backoff_max, retry)
    }

    /// Whether batches carry a producer id and sequences (idempotence needs
    /// acks=all: with fewer acks a batch can be lost on failover without the
    /// producer knowing, which a sequence would then report as a gap).
    pub fn is_idempotent(&self) -> bool {
        self.idempotence && self.acks == Acks::All
    }

    pub(crate) fn validate(&self) -> Result<(), ClientError> {
        let err = |m: String| Err(ClientError::Config(m));
        if self.batch_size == 0 {
            return err("batch_size must be above zero".into());
        }
        if self.max_in_flight_per_broker == 0 {
            return err("max_in_flight_per_broker must be at least 1".into());
        }
        if self.max_request_bytes < 1024
            || self.max_request_bytes > DEFAULT_MAX_REQUEST_BYTES as usize
        {
            return err(format!(
                "max_request_bytes {} must be between 1024 and {DEFAULT_MAX_REQUEST_BYTES}",
                self.max_request_bytes
            ));
        }
        if self.buffer_memory < 1024 {
            return err(format!(
                "buffer_memory {} is too small (at least 1024 bytes)",
                self.buffer_memory
            ));
        }
        if self.buffer_memory > (u32::MAX as usize) {
            return err(format!(
                "buffer_memory {} is too large (at most {} bytes)",
                self.buffer_memory,
                u32::MAX
            ));
        }
        if self.delivery_timeout.is_zero() {
            return err("delivery_timeout must be above zero".into());
        }
        if let Some(id) = &self.transactional_id {
            if id.is_empty() {
                return err("transactional_id must not be empty".into());
            }
            if !self.is_idempotent() {
                return err(format!(
                    "transactional_id {id:?} needs idempotence on and acks=all"
                ));
            }
            if self.transaction_timeout.is_zero()
                || self.transaction_timeout > Duration::from_secs(15 * 60)
            {
                return err(format!(
                    "transaction_timeout {:?} must be above zero and at most 15 minutes",
                    self.transaction_timeout
                ));
            }
        }
        Ok(())
    }
}

/// Where a consumer starts when it has no valid position for a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffsetReset {
    /// The first offset still kept.
    #[default]
    Earliest,
    /// The log end offset: only records produced from now on.
    Latest,
    /// Fail with an error naming the partition and offset.
    None,
}

impl std::str::FromStr for OffsetReset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "earliest" => Ok(OffsetReset::Earliest),
            "latest" => Ok(OffsetReset::Latest),
            "none" => Ok(OffsetReset::None),
            other => Err(format!(
                "invalid offset reset '{other}' (expected earliest, latest or none)"
            )),
        }
    }
}

/// The pause before retry number `retry` (1 for the first): `base *
/// 2^(retry - 1)`, times a random factor in [0.8, 1.2], at most `max` (or
/// `base`, if larger), as Kafka's `ExponentialBackoff` (KIP-580).
pub(crate) fn exponential_backoff(base: Duration, max: Duration, retry: u32) -> Duration {
    let doubled = base.saturating_mul(1u32 << retry.saturating_sub(1).min(20));
    // Not `mul_f64`, which panics past `Duration::MAX` (a "never" setting).
    let jittered =
        Duration::try_from_secs_f64(doubled.as_secs_f64() * rand::random_range(0.8..=1.2))
            .unwrap_or(Duration::MAX);
    jittered.min(max.max(base))
}

/// How a [`crate::Consumer`] fetches.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The broker answers a fetch once it has this many bytes (or `fetch_max_wait` passed).
    pub fetch_min_bytes: u32,
    /// Long-poll bound the broker may wait for `fetch_min_bytes`.
    pub fetch_max_wait: Duration,
    /// Bound on bytes per partition in one fetch (at least one batch is returned).
    pub max_partition_fetch_bytes: u32,
    /// Bound on bytes of one fetch response.
    pub fetch_max_bytes: u32,
    /// What to do without a valid position.
    pub auto_offset_reset: OffsetReset,
    /// Read everything below the high watermark (the default), or only
    /// committed transactions, below the last stable offset.
    pub isolation: rill_proto::wire::Isolation,
    /// Pause before fetching again from a partition whose fetch failed. Each
    /// further failure in a row doubles it, up to `retry_backoff_max`, with
    /// 20% jitter either way (Kafka's `retry.backoff.ms`, exponential since
    /// KIP-580). A partition whose leader the refreshed metadata has moved
    /// to another broker is fetched from there at once (KIP-951).
    pub retry_backoff: Duration,
    /// Bound on that pause (Kafka's `retry.backoff.max.ms`).
    pub retry_backoff_max: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> ConsumerConfig {
        ConsumerConfig {
            fetch_min_bytes: 1,
            fetch_max_wait: Duration::from_millis(500),
            max_partition_fetch_bytes: 1024 * 1024,
            fetch_max_bytes: 50 * 1024 * 1024,
            auto_offset_reset: OffsetReset::Earliest,
            isolation: rill_proto::wire::Isolation::ReadUncommitted,
            retry_backoff: FETCH_RETRY_BACKOFF,
            retry_backoff_max: Duration::from_secs(1),
        }
    }
}

impl ConsumerConfig {
    pub(crate) fn validate(&self, max_response_bytes: u32) -> Result<(), ClientError> {
        if self.max_partition_fetch_bytes == 0 || self.fetch_max_bytes == 0 {
            return Err(ClientError::Config(
                "max_partition_fetch_bytes and fetch_max_bytes must be above zero".into(),
            ));
        }
        if self.fetch_max_bytes >= max_response_bytes {
            return Err(ClientError::Config(format!(
                "fetch_max_bytes {} must be below the client's max_response_bytes {}",
                self.fetch_max_bytes, max_response_bytes
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each retry doubles the pause, within 20% jitter, up to the bound.
    #[test]
    fn retry_backoff_doubles_with_jitter_up_to_its_bound() {
        let c = ProducerConfig::default();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        for (retry, mid) in [(1, 100.0), (2, 200.0), (3, 400.0), (4, 800.0)] {
            let pauses: Vec<f64> = (0..200).map(|_| ms(c.retry_backoff_for(retry))).collect();
            let (lo, hi) = pauses
                .iter()
                .fold((f64::MAX, 0.0f64), |(lo, hi), &p| (lo.min(p), hi.max(p)));
            assert!(
                lo >= mid * 0.8 - 1e-6 && hi <= mid * 1.2 + 1e-6,
                "retry {retry}: {lo}..{hi}"
            );
            assert!(
                hi - lo > mid * 0.05,
                "retry {retry} is jittered: {lo}..{hi}"
            );
        }
        for retry in [5, 6, 30, u32::MAX] {
            assert!(
                c.retry_backoff_for(retry) <= c.retry_backoff_max,
                "retry {retry}"
            );
        }
        assert!(ms(c.retry_backoff_for(30)) >= 800.0);
        // A bound below the first pause does not shorten it.
        let flat = ProducerConfig {
            retry_backoff: Duration::from_millis(500),
            retry_backoff_max: Duration::from_millis(100),
            ..ProducerConfig::default()
        };
        assert!(flat.retry_backoff_for(3) <= Duration::from_millis(500));
    }
}
