//! The broker's metrics: names, the per-api handles the request path uses, and
//! installing the Prometheus exporter.
//!
//! Metrics (Prometheus names):
//! - `rill_requests_total{api}` counter
//! - `rill_request_errors_total{api,code}` counter (whole-request and per-partition errors)
//! - `rill_request_duration_seconds{api}` histogram
//! - `rill_bytes_in_total`, `rill_bytes_out_total` counters (record batch bytes)
//! - `rill_partition_log_start_offset{topic,partition}`, `rill_partition_log_end_offset{topic,partition}` gauges
//! - `rill_connections` gauge
//!
//! Invariant: the hot path only touches handles registered up front (no label
//! formatting per request); only errors build labels on the fly. Without an
//! installed recorder every handle is a no-op.

use crate::error::BrokerError;
use metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};
use rill_proto::wire::{ApiKey, ErrorCode};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const REQUESTS_TOTAL: &str = "rill_requests_total";
pub const REQUEST_ERRORS_TOTAL: &str = "rill_request_errors_total";
/// Microseconds responses were delayed by byte-rate quotas, by api.
pub const THROTTLE_TIME_US_TOTAL: &str = "rill_throttle_time_us_total";
pub const REQUEST_DURATION_SECONDS: &str = "rill_request_duration_seconds";
pub const BYTES_IN_TOTAL: &str = "rill_bytes_in_total";
pub const BYTES_OUT_TOTAL: &str = "rill_bytes_out_total";
pub const PARTITION_LOG_START_OFFSET: &str = "rill_partition_log_start_offset";
pub const PARTITION_LOG_END_OFFSET: &str = "rill_partition_log_end_offset";
pub const CONNECTIONS: &str = "rill_connections";
/// Bytes the tail caches of this process hold (`rill_log::tail`), set every
/// `flush_check_interval_ms`.
pub const TAIL_CACHE_BYTES: &str = "rill_tail_cache_bytes";

/// Histogram buckets of request durations, seconds.
const DURATION_BUCKETS_SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// The metrics endpoint installed in this process, if any (a process has one
/// global recorder; a second broker in the same process shares it).
static INSTALLED: Mutex<Option<SocketAddr>> = Mutex::new(None);

/// Installs the Prometheus recorder and its HTTP endpoint on `addr`. A second
/// call in the same process logs a warning and keeps the first endpoint.
pub fn install(addr: SocketAddr) -> Result<(), BrokerError> {
    let mut installed = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(existing) = *installed {
        tracing::warn!(
            requested = %addr,
            %existing,
            "a metrics endpoint is already installed in this process; not starting another"
        );
        return Ok(());
    }
    let builder = PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            Matcher::Full(REQUEST_DURATION_SECONDS.to_string()),
            DURATION_BUCKETS_SECONDS,
        )
        .map_err(|e| BrokerError::Metrics {
            addr,
            reason: e.to_string(),
        })?;
    match builder.install() {
        Ok(()) => {
            *installed = Some(addr);
            tracing::info!(%addr, "metrics endpoint listening (Prometheus, GET /metrics)");
            Ok(())
        }
        Err(BuildError::FailedToSetGlobalRecorder(_)) => {
            tracing::warn!(%addr, "another metrics recorder is installed in this process; not starting the endpoint");
            Ok(())
        }
        Err(e) => Err(BrokerError::Metrics {
            addr,
            reason: e.to_string(),
        }),
    }
}

/// Handles of one api's metrics.
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    pub requests: Counter,
    pub duration: Histogram,
}

/// Handles the request path uses, registered at startup.
#[derive(Debug)]
pub struct BrokerMetrics {
    apis: Vec<ApiMetrics>,
    bytes_in: Counter,
    bytes_out: Counter,
    pub connections: Gauge,
    /// The same traffic counted in the broker itself, whether or not a
    /// Prometheus recorder is installed (DescribeBrokerStats).
    pub local: Arc<LocalStats>,
}

impl BrokerMetrics {
    pub fn register() -> BrokerMetrics {
        BrokerMetrics {
            apis: ApiKey::ALL
                .iter()
                .map(|k| ApiMetrics {
                    requests: metrics::counter!(REQUESTS_TOTAL, "api" => k.name()),
                    duration: metrics::histogram!(REQUEST_DURATION_SECONDS, "api" => k.name()),
                })
                .collect(),
            bytes_in: metrics::counter!(BYTES_IN_TOTAL),
            bytes_out: metrics::counter!(BYTES_OUT_TOTAL),
            connections: metrics::gauge!(CONNECTIONS),
            local: Arc::new(LocalStats::new()),
        }
    }

    /// Record batch bytes produced to this broker.
    pub fn add_bytes_in(&self, n: u64) {
        self.bytes_in.increment(n);
        self.local.bytes_in.fetch_add(n, Ordering::Relaxed);
    }

    /// Record batch bytes fetched from this broker, by a follower or not
    /// (Prometheus counts both; the local count, consumers only).
    pub fn add_bytes_out(&self, n: u64, follower: bool) {
        self.bytes_out.increment(n);
        if !follower {
            self.local.bytes_out.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn api(&self, key: ApiKey) -> &ApiMetrics {
        let i = ApiKey::ALL
            .iter()
            .position(|k| *k == key)
            .expect("ApiKey::ALL lists every key");
        &self.apis[i]
    }

    /// Counts one error of an api (or `"unknown"` when the key did not parse).
    pub fn error(&self, api: &'static str, code: ErrorCode) {
        metrics::counter!(REQUEST_ERRORS_TOTAL, "api" => api, "code" => code.name()).increment(1);
    }

    /// A response delayed by a byte-rate quota.
    pub fn throttled(&self, api: &'static str, delay: std::time::Duration) {
        metrics::counter!(THROTTLE_TIME_US_TOTAL, "api" => api).increment(delay.as_micros() as u64);
    }
}

/// Upper bounds of [`LocalStats`]' latency buckets, microseconds.
pub const LATENCY_BOUNDS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Requests and latencies of one class of api.
#[derive(Debug, Default)]
struct ClassStats {
    requests: AtomicU64,
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
}

/// The broker's own count of its traffic: what DescribeBrokerStats answers
/// (the console's charts), kept with relaxed atomics on the request path.
#[derive(Debug)]
pub struct LocalStats {
    started: SystemTime,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    /// produce, fetch, other.
    classes: [ClassStats; 3],
}

const CLASSES: [&str; 3] = ["produce", "fetch", "other"];

impl LocalStats {
    fn new() -> LocalStats {
        LocalStats {
            started: SystemTime::now(),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            classes: Default::default(),
        }
    }

    /// One request of `api` answered after `took`.
    pub fn record(&self, api: ApiKey, took: Duration) {
        let class = match api {
            ApiKey::Produce => &self.classes[0],
            ApiKey::Fetch => &self.classes[1],
            _ => &self.classes[2],
        };
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        let i = LATENCY_BOUNDS_US.partition_point(|b| *b < us);
        class.requests.fetch_add(1, Ordering::Relaxed);
        class.buckets[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now, as DescribeBrokerStats answers them.
    pub fn snapshot(&self, broker_id: i32) -> rill_proto::wire::DescribeBrokerStatsResponse {
        let ms = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64)
        };
        rill_proto::wire::DescribeBrokerStatsResponse {
            broker_id,
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_ms: ms(self.started),
            now_ms: ms(SystemTime::now()),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            latency_bounds_us: LATENCY_BOUNDS_US.to_vec(),
            apis: CLASSES
                .iter()
                .zip(&self.classes)
                .map(|(name, c)| rill_proto::wire::ApiStats {
                    class: name.to_string(),
                    requests: c.requests.load(Ordering::Relaxed),
                    latency_buckets: c
                        .buckets
                        .iter()
                        .map(|b| b.load(Ordering::Relaxed))
                        .collect(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_land_in_their_class_and_latency_bucket() {
        let s = LocalStats::new();
        s.record(ApiKey::Produce, Duration::from_micros(90));
        s.record(ApiKey::Produce, Duration::from_micros(100));
        s.record(ApiKey::Produce, Duration::from_millis(3));
        s.record(ApiKey::Fetch, Duration::from_secs(60));
        s.record(ApiKey::Metadata, Duration::from_micros(300));
        let snap = s.snapshot(7);
        assert_eq!(snap.broker_id, 7);
        let produce = &snap.apis[0];
        assert_eq!(produce.requests, 3);
        assert_eq!(produce.latency_buckets[0], 2, "<= 100 us");
        assert_eq!(produce.latency_buckets[5], 1, "<= 5 ms");
        let fetch = &snap.apis[1];
        assert_eq!(
            fetch.latency_buckets[LATENCY_BOUNDS_US.len()],
            1,
            "slower than all"
        );
        assert_eq!(snap.apis[2].latency_buckets[2], 1, "<= 500 us");
    }
}
