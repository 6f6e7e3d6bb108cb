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
use std::sync::Mutex;

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
    pub bytes_in: Counter,
    pub bytes_out: Counter,
    pub connections: Gauge,
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
