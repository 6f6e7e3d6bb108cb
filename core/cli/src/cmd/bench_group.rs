//! Consumer-group benchmarks: `rill bench consume --group G` (the consume
//! bench's members join a group instead of being assigned partitions) and
//! `rill bench rebalance` (how long the group takes to consume every partition
//! again after one member leaves or joins).
//!
//! Rebalance time, as measured here: from the event (a member's `close()` is
//! called, or a new member's `group_consumer()` is called) to the first moment
//! when every partition is assigned to exactly one member, every member has at
//! least one partition, and every partition's current owner has received a
//! record produced after the event. A producer in the same process offers
//! `--rate` records/s round-robin over the partitions; each record carries its
//! send time (nanoseconds on the bench's monotonic clock) in its first 8 bytes,
//! so produce-to-consume latency (a few ms on loopback) is part of the figure.
//! One task polls all members in turn (`POLL_SLICE` each), which bounds the
//! time resolution.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use hdrhistogram::Histogram;
use rill_client::{
    Client, ConsumerConfig, GroupConfig, GroupConsumer, OffsetReset, ProducerConfig, ProducerRecord,
};

use super::bench::{
    CONSUME_IDLE_TIMEOUT, Common, FinishLine, count_consumed, ensure_topic, new_histogram,
    record_latency,
};
use crate::client_args::{ClientArgs, client_error};

/// How long the rebalance driver polls one member before the next.
const POLL_SLICE: Duration = Duration::from_millis(5);
/// Bound on one rebalance (beyond it the round fails).
const REBALANCE_MAX: Duration = Duration::from_secs(120);

/// One member of the consume bench's group: reads until the total reaches
/// `target` or nothing arrives for `CONSUME_IDLE_TIMEOUT`, then leaves.
pub(crate) async fn consume_member(
    client: Client,
    config: ConsumerConfig,
    group: String,
    topic: String,
    finish: Arc<FinishLine>,
    done: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
) -> anyhow::Result<Histogram<u64>> {
    let mut gc = GroupConfig::new(group.clone(), vec![topic]);
    gc.auto_offset_reset = OffsetReset::Earliest;
    gc.consumer = config;
    let mut member = client
        .group_consumer(gc)
        .await
        .map_err(|e| client_error(format!("cannot join group {group}"), e))?;
    let mut h = new_histogram();
    let mut idle_since = Instant::now();
    // A group member's poll may be mid-way through a heartbeat or a commit:
    // it is not cut short, the line is looked at between polls.
    while finish.at().is_none() {
        let t = Instant::now();
        let records = member
            .poll(Duration::from_millis(500))
            .await
            .map_err(|e| client_error("cannot poll", e))?;
        if records.is_empty() {
            if idle_since.elapsed() > CONSUME_IDLE_TIMEOUT {
                break;
            }
            continue;
        }
        record_latency(&mut h, t.elapsed());
        idle_since = Instant::now();
        count_consumed(&records, &done, &bytes, &finish);
    }
    member
        .close()
        .await
        .map_err(|e| client_error(format!("cannot leave group {group}"), e))?;
    Ok(h)
}

#[derive(Debug, Clone, Args)]
pub struct RebalanceBench {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The topic to use; created (with --partitions) if it does not exist.
    #[arg(long, default_value = "rill-bench-rebalance")]
    pub topic: String,
    /// Partitions for the topic when the bench creates it.
    #[arg(long, default_value_t = 6)]
    pub partitions: u32,
    /// Members in the group between events (one leaves, then one joins).
    #[arg(long, default_value_t = 3)]
    pub members: usize,
    /// Leave-then-join rounds.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Records per second the producer offers (spread over the partitions).
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    /// The members' session timeout.
    #[arg(long, default_value_t = rill_client::DEFAULT_SESSION_TIMEOUT_MS)]
    pub session_timeout_ms: u32,
    /// The members' heartbeat interval.
    #[arg(long, default_value_t = rill_client::DEFAULT_HEARTBEAT_INTERVAL_MS)]
    pub heartbeat_interval_ms: u32,
    /// uniform or range.
    #[arg(long, default_value = "uniform")]
    pub assignor: String,
}

/// What the driver knows: per (member slot, partition) the newest send time
/// (ns since `epoch`) received.
struct Watch {
    epoch: Instant,
    newest: HashMap<(u64, u32), u64>,
}

impl Watch {
    async fn poll_all(&mut self, members: &mut [(u64, GroupConsumer)]) -> anyhow::Result<()> {
        for (slot, m) in members.iter_mut() {
            for r in m
                .poll(POLL_SLICE)
                .await
                .map_err(|e| client_error("cannot poll", e))?
            {
                let Some(v) = r.value.as_deref() else {
                    continue;
                };
                if v.len() < 8 {
                    continue;
                }
                let sent = u64::from_be_bytes(v[..8].try_into().expect("8 bytes"));
                let e = self.newest.entry((*slot, r.partition)).or_insert(0);
                *e = (*e).max(sent);
            }
        }
        Ok(())
    }

    /// Whether every partition is owned once, every member owns one, and each
    /// owner got a record sent after `since_ns`.
    fn consuming_again(
        &self,
        members: &[(u64, GroupConsumer)],
        partitions: u32,
        since_ns: u64,
    ) -> bool {
        let mut owner: HashMap<u32, u64> = HashMap::new();
        for (slot, m) in members {
            let tps = m.assignment();
            if tps.is_empty() && partitions as usize >= members.len() {
                return false;
            }
            for tp in tps {
                if owner.insert(tp.partition, *slot).is_some() {
                    return false;
                }
            }
        }
        (0..partitions).all(|p| {
            owner.get(&p).is_some_and(|slot| {
                self.newest
                    .get(&(*slot, p))
                    .is_some_and(|sent| *sent >= since_ns)
            })
        })
    }

    async fn wait(
        &mut self,
        members: &mut [(u64, GroupConsumer)],
        partitions: u32,
        event: Instant,
    ) -> anyhow::Result<Duration> {
        let since_ns = event.duration_since(self.epoch).as_nanos() as u64;
        loop {
            self.poll_all(members).await?;
            if self.consuming_again(members, partitions, since_ns) {
                return Ok(event.elapsed());
            }
            if event.elapsed() > REBALANCE_MAX {
                bail!("the group did not consume every partition again within {REBALANCE_MAX:?}");
            }
        }
    }
}

pub async fn bench_rebalance(b: RebalanceBench) -> anyhow::Result<()> {
    if b.members < 2 || b.rate == 0 || b.rounds == 0 {
        bail!("--members must be at least 2, --rate and --rounds above zero");
    }
    let client = b.client.connect().await?;
    let common = Common {
        client: b.client.clone(),
        topic: b.topic.clone(),
        partitions: b.partitions,
        records: 0,
        plot: None,
    };
    ensure_topic(&client, &common).await?;
    let partitions = client
        .partition_count(&b.topic)
        .await
        .map_err(|e| client_error(format!("cannot read topic {}", b.topic), e))?;
    let group = format!("rill-bench-rebalance-{}", std::process::id());
    let epoch = Instant::now();

    // The producer: `rate` records/s, round-robin over the partitions.
    let producer = client
        .producer(ProducerConfig {
            linger: Duration::from_millis(1),
            ..ProducerConfig::default()
        })
        .map_err(|e| client_error("cannot start a producer", e))?;
    let stop = Arc::new(AtomicU64::new(0));
    let sender = {
        let (topic, stop, rate) = (b.topic.clone(), stop.clone(), b.rate);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let start = Instant::now();
            let mut sent: u64 = 0;
            while stop.load(Ordering::Relaxed) == 0 {
                tick.tick().await;
                let due = start.elapsed().as_micros() as u64 * rate / 1_000_000;
                while sent < due {
                    let v = (epoch.elapsed().as_nanos() as u64).to_be_bytes().to_vec();
                    let record = ProducerRecord::new(topic.as_str(), v)
                        .partition((sent % partitions as u64) as u32);
                    // Acknowledgements are not awaited one by one; the producer's
                    // buffer bounds what is in flight.
                    drop(
                        producer
                            .send(record)
                            .await
                            .map_err(|e| client_error(format!("cannot send to {topic}"), e))?,
                    );
                    sent += 1;
                }
            }
            producer
                .close()
                .await
                .map_err(|e| client_error("cannot close the producer", e))
        })
    };

    let mut config = GroupConfig::new(group.clone(), vec![b.topic.clone()]);
    config.session_timeout_ms = b.session_timeout_ms;
    config.heartbeat_interval_ms = b.heartbeat_interval_ms;
    config.assignor = b.assignor.clone();
    config.auto_offset_reset = OffsetReset::Latest;
    config.consumer.fetch_max_wait = Duration::from_millis(50);
    let join = |slot: u64| {
        let (client, config) = (client.clone(), config.clone());
        async move {
            client
                .group_consumer(config)
                .await
                .map(|m| (slot, m))
                .map_err(|e| client_error("cannot join the group", e))
        }
    };
    let mut watch = Watch {
        epoch,
        newest: HashMap::new(),
    };
    let mut members = Vec::new();
    let mut next_slot = 0u64;
    let start = Instant::now();
    for _ in 0..b.members {
        members.push(join(next_slot).await?);
        next_slot += 1;
    }
    let settled = watch.wait(&mut members, partitions, start).await?;
    println!(
        "group {group}: {} members over {partitions} partitions consuming after {:.0} ms",
        b.members,
        settled.as_secs_f64() * 1000.0
    );
    let (mut leaves, mut joins) = (Vec::new(), Vec::new());
    for round in 1..=b.rounds {
        let (_, leaver) = members.remove(0);
        let event = Instant::now();
        leaver
            .close()
            .await
            .map_err(|e| client_error("cannot leave the group", e))?;
        let t = watch.wait(&mut members, partitions, event).await?;
        leaves.push(t);
        let event = Instant::now();
        members.push(join(next_slot).await?);
        next_slot += 1;
        let j = watch.wait(&mut members, partitions, event).await?;
        joins.push(j);
        println!(
            "round {round}: leave {:.0} ms, join {:.0} ms",
            t.as_secs_f64() * 1000.0,
            j.as_secs_f64() * 1000.0
        );
    }
    for (_, m) in members {
        let _ = m.close().await;
    }
    stop.store(1, Ordering::Relaxed);
    sender.await??;
    let _ = client.admin().delete_group(&group).await;
    let stats = |v: &[Duration]| {
        let ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        let mean = ms.iter().sum::<f64>() / ms.len() as f64;
        let max = ms.iter().cloned().fold(0.0, f64::max);
        (mean, max)
    };
    let (leave_mean, leave_max) = stats(&leaves);
    let (join_mean, join_max) = stats(&joins);
    println!(
        "rounds={} leave_mean_ms={leave_mean:.0} leave_max_ms={leave_max:.0} join_mean_ms={join_mean:.0} join_max_ms={join_max:.0}",
        b.rounds
    );
    Ok(())
}
