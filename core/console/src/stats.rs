//! Per-broker throughput and latency over the last minutes, for the cluster
//! page's charts.
//!
//! A task asks every live broker for its own counters (DescribeBrokerStats:
//! record bytes in and out, and per class of api the requests and a latency
//! histogram) every [`SAMPLE_EVERY`], and keeps, per broker, one point per
//! interval for [`WINDOW`]: the rates and the latency quantiles of the
//! requests answered in that interval, from the difference of two answers.
//! A broker that restarted (another start time) starts a new line; one that
//! does not answer gets no point for that interval (a gap, not a zero).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rill_proto::wire::{ApiStats, DescribeBrokerStatsRequest, DescribeBrokerStatsResponse};
use serde::Serialize;
use tokio::sync::watch;

use crate::State;

/// How often brokers are asked.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// How much history is kept.
pub(crate) const WINDOW: Duration = Duration::from_secs(600);
/// Longest wait for one broker's answer.
const ASK_TIMEOUT: Duration = Duration::from_millis(1500);

/// One interval of one broker.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Point {
    /// End of the interval, by the broker's clock (ms since the epoch).
    pub t_ms: i64,
    pub produce_bytes_s: f64,
    pub fetch_bytes_s: f64,
    pub produce_rps: f64,
    pub fetch_rps: f64,
    /// Upper bounds of the latency buckets holding the quantile, ms (None: no
    /// request in the interval).
    pub produce_p50_ms: Option<f64>,
    pub produce_p99_ms: Option<f64>,
    pub fetch_p99_ms: Option<f64>,
}

#[derive(Debug, Default)]
pub(crate) struct BrokerHistory {
    pub version: String,
    pub started_ms: i64,
    last: Option<DescribeBrokerStatsResponse>,
    pub points: VecDeque<Point>,
}

/// Every broker's history, by id.
#[derive(Debug, Default)]
pub(crate) struct History {
    pub brokers: BTreeMap<i32, BrokerHistory>,
}

impl History {
    /// Adds a broker's answer: a point from the difference with its previous
    /// one (none after a restart or for the first answer).
    pub(crate) fn add(&mut self, now: DescribeBrokerStatsResponse) {
        let h = self.brokers.entry(now.broker_id).or_default();
        if h.started_ms != now.started_ms {
            h.last = None;
            h.points.clear();
        }
        h.version = now.version.clone();
        h.started_ms = now.started_ms;
        if let Some(p) = h.last.as_ref().and_then(|last| point(last, &now)) {
            h.points.push_back(p);
        }
        while h
            .points
            .front()
            .is_some_and(|p| now.now_ms - p.t_ms > WINDOW.as_millis() as i64)
        {
            h.points.pop_front();
        }
        h.last = Some(now);
    }

    /// Forgets points older than the window by `now_ms` (the console's
    /// clock), and brokers left with none that have not answered within it:
    /// a broker that went away does not stay in the charts.
    pub(crate) fn prune(&mut self, now_ms: i64) {
        let window = WINDOW.as_millis() as i64;
        for h in self.brokers.values_mut() {
            while h.points.front().is_some_and(|p| now_ms - p.t_ms > window) {
                h.points.pop_front();
            }
        }
        self.brokers.retain(|_, h| {
            !h.points.is_empty() || h.last.as_ref().is_some_and(|l| now_ms - l.now_ms <= window)
        });
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn class<'a>(s: &'a DescribeBrokerStatsResponse, name: &str) -> Option<&'a ApiStats> {
    s.apis.iter().find(|a| a.class == name)
}

/// The interval between two answers of one broker run.
fn point(a: &DescribeBrokerStatsResponse, b: &DescribeBrokerStatsResponse) -> Option<Point> {
    let secs = (b.now_ms - a.now_ms) as f64 / 1000.0;
    if secs <= 0.0 {
        return None;
    }
    let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
    let requests = |name: &str| {
        let (x, y) = (class(a, name)?, class(b, name)?);
        Some(rate(x.requests, y.requests))
    };
    let quantile = |name: &str, q: f64| {
        let (x, y) = (class(a, name)?, class(b, name)?);
        quantile_ms(
            &b.latency_bounds_us,
            &x.latency_buckets,
            &y.latency_buckets,
            q,
        )
    };
    Some(Point {
        t_ms: b.now_ms,
        produce_bytes_s: rate(a.bytes_in, b.bytes_in),
        fetch_bytes_s: rate(a.bytes_out, b.bytes_out),
        produce_rps: requests("produce").unwrap_or(0.0),
        fetch_rps: requests("fetch").unwrap_or(0.0),
        produce_p50_ms: quantile("produce", 0.5),
        produce_p99_ms: quantile("produce", 0.99),
        fetch_p99_ms: quantile("fetch", 0.99),
    })
}

/// The `q` quantile of the requests counted between histograms `before` and
/// `after`: the upper bound (ms) of the bucket it falls in; past the last
/// bound, the last bound.
fn quantile_ms(bounds_us: &[u64], before: &[u64], after: &[u64], q: f64) -> Option<f64> {
    let delta: Vec<u64> = after
        .iter()
        .zip(before.iter().chain(std::iter::repeat(&0)))
        .map(|(y, x)| y.saturating_sub(*x))
        .collect();
    let total: u64 = delta.iter().sum();
    if total == 0 {
        return None;
    }
    let want = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in delta.iter().enumerate() {
        seen += n;
        if seen >= want {
            let us = bounds_us.get(i).or(bounds_us.last())?;
            return Some(*us as f64 / 1000.0);
        }
    }
    None
}

/// Asks the brokers every [`SAMPLE_EVERY`] until `stop` turns true.
pub(crate) async fn sample(state: Arc<State>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        // Bounded: a connect that hangs must not hold the client's lock (and
        // the user's requests behind it) for long.
        let Ok(Ok(client)) = tokio::time::timeout(ASK_TIMEOUT, state.client()).await else {
            continue;
        };
        let Ok(meta) = tokio::time::timeout(
            ASK_TIMEOUT,
            crate::api::own_metadata(&client, Some(Vec::new())),
        )
        .await
        else {
            continue;
        };
        let Ok(meta) = meta else { continue };
        let mut asks = tokio::task::JoinSet::new();
        for b in meta.brokers.iter().filter(|b| b.alive) {
            let (client, id) = (client.clone(), b.id);
            asks.spawn(async move {
                let ask = client.call(Some(id), &DescribeBrokerStatsRequest {}, &[]);
                match tokio::time::timeout(ASK_TIMEOUT, ask).await {
                    Ok(Ok((stats, _))) => Some(stats),
                    Ok(Err(e)) => {
                        tracing::debug!(broker = id, error = %e, "console: no stats from broker");
                        None
                    }
                    Err(_) => None,
                }
            });
        }
        while let Some(answer) = asks.join_next().await {
            if let Ok(Some(stats)) = answer {
                state
                    .history
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .add(stats);
            }
        }
        state
            .history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .prune(now_ms());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(now_ms: i64, bytes_in: u64, produce: (u64, Vec<u64>)) -> DescribeBrokerStatsResponse {
        DescribeBrokerStatsResponse {
            broker_id: 1,
            version: "0.1.0".into(),
            started_ms: 1_000,
            now_ms,
            bytes_in,
            bytes_out: 0,
            latency_bounds_us: vec![1_000, 10_000, 100_000],
            apis: vec![ApiStats {
                class: "produce".into(),
                requests: produce.0,
                latency_buckets: produce.1,
            }],
        }
    }

    #[test]
    fn points_are_rates_and_quantiles_of_each_interval() {
        let mut h = History::default();
        h.add(answer(10_000, 0, (0, vec![0, 0, 0, 0])));
        assert!(h.brokers[&1].points.is_empty(), "one answer is no interval");
        // 2 s later: 4 MB in, 100 requests, 98 under 1 ms and 2 under 100 ms.
        h.add(answer(12_000, 4_000_000, (100, vec![98, 0, 2, 0])));
        let p = &h.brokers[&1].points[0];
        assert_eq!(p.produce_bytes_s, 2_000_000.0);
        assert_eq!(p.produce_rps, 50.0);
        assert_eq!(p.produce_p50_ms, Some(1.0));
        assert_eq!(p.produce_p99_ms, Some(100.0));
        assert_eq!(p.fetch_p99_ms, None);
        // Only the new requests count: one slower than every bound.
        h.add(answer(14_000, 4_000_000, (101, vec![98, 0, 2, 1])));
        let p = &h.brokers[&1].points[1];
        assert_eq!(p.produce_bytes_s, 0.0);
        assert_eq!(
            p.produce_p99_ms,
            Some(100.0),
            "past the last bound: the last bound"
        );
        // A restart starts over.
        let mut restarted = answer(16_000, 10, (1, vec![1, 0, 0, 0]));
        restarted.started_ms = 15_000;
        h.add(restarted);
        assert!(h.brokers[&1].points.is_empty());
        // Points older than the window go.
        let mut h = History::default();
        for i in 0..400 {
            h.add(answer(10_000 + i * 2_000, 0, (0, vec![0, 0, 0, 0])));
        }
        let n = h.brokers[&1].points.len() as u64;
        assert_eq!(n, WINDOW.as_secs() / 2 + 1);
        // A broker that stopped answering leaves once its points are old.
        let last = 10_000 + 399 * 2_000;
        h.prune(last);
        assert_eq!(h.brokers[&1].points.len() as u64, n);
        h.prune(last + WINDOW.as_millis() as i64 + 1);
        assert!(h.brokers.is_empty());
    }
}
