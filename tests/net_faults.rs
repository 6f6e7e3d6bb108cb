//! Network faults (issue 21): three `rill broker` processes, each in its own
//! network namespace on a bridge the test makes (tests/support/netns.rs), and
//! the test's client in another. While producers write unique records with
//! acks=all (replication factor 3, min.insync.replicas=2) and a consumer reads
//! along, a seeded schedule applies faults one at a time, each held a few
//! seconds then healed:
//!
//! - isolate: one broker loses every packet;
//! - leader-cut: a partition leader cut from both followers, still reached by
//!   the client;
//! - controller-minority: the Raft leader (the controller) cut from the other
//!   brokers (the client still reaches it);
//! - bridge: two brokers cut from each other, both still seeing the third;
//! - one-way: a partition leader's packets to one follower dropped (or the
//!   reverse), the other direction passing;
//! - loss: 5-20% of every broker's packets dropped at random;
//! - kill: SIGKILL of a partition leader, restarted after the hold;
//! - pause: SIGSTOP of a broker, SIGCONT after the hold;
//! - client-cut: the client cut from a partition leader (the brokers still
//!   see each other).
//!
//! After one fault of each kind, a schedule runs compound steps: two faults at
//! once, the second 1-2.5 s after the first. Faults hold 2.5-5 s (in a soak
//! 2.5-12 s, longer than the producers' delivery timeout).
//!
//! Beside the producers and the consumer, during the same faults: three
//! members of one consumer group (rill-client's `GroupConsumer`, 3 s session,
//! 300 ms heartbeats, manual commits every second) consume the topic, and a
//! reader fetches the group's committed offsets every second (workload 3);
//! and topics of 1-2 partitions, RF 2-3, are created and deleted every 1.5-3 s
//! through a broker picked at random, each outcome noted as acknowledged,
//! refused (a code that says nothing was done) or indeterminate (workload 4).
//!
//! The checker then names every anomaly with its seed and the history around
//! it: (1) an acknowledged record lost, moved or read twice, or records of one
//! key out of producer order; (2) two different records read at one offset of a
//! partition (across every read, during and after the faults), or a consumer's
//! offsets going back; (3) two members holding one partition at once (each
//! member's holding runs, on the test's one monotonic clock, from the poll
//! that reported the assignment to its first call after the revocation or
//! loss was reported), a member given a record of a partition it does not
//! hold, or the group's committed offset of a partition going back (an
//! acknowledged commit or a read-back that began after another ended is not
//! below it); (4) after the last heal (waiting up to 30 s), the brokers'
//! own views (Metadata asked of each alone) differing in topics, partitions,
//! leaders, leader epochs or replicas, a view contradicting an acknowledged
//! create or delete (or a refused create), or a data dir's partition
//! directories not those of the partitions its broker's view makes it a
//! replica of (none of a partition it is no replica of, none of a deleted
//! topic, `.deleted` leftovers included); (5) replicas not
//! byte-identical up to the high watermark (the segment files' batches
//! compared by offset). A broker that does not come back (full ISRs) within a
//! bound after a heal is one too.
//!
//! Short mode (`cargo test`): two schedules (every fault kind once each, in a
//! seeded order). `RILL_FAULT_SEED=N` replays one schedule;
//! `RILL_FAULT_SOAK_S=1800` runs new schedules until that many seconds passed.
//! Without root or `ip`/`nft` the test prints why and is skipped, unless `CI`
//! is set (then it fails).

mod support;

use rill_client::{
    Client, ClientConfig, ConsumerConfig, NewTopic, OffsetSpec, ProducerConfig, ProducerRecord,
    TopicPartition,
};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::Rng;
use support::netns::{NetCluster, NetLab, skip_unless_supported};

const BROKERS: usize = 3;
const PARTITIONS: u32 = 3;
/// Schedules of the short mode (each about 80 s here).
const SHORT_SCHEDULES: u32 = 2;
/// Steps of two faults at once per schedule (after one of each kind alone).
const COMPOUND_STEPS: u64 = 3;
/// Longest wait for the cluster to heal (all brokers back in every ISR).
const RECOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// Delivery timeout of the producers (a record not acknowledged by then is
/// indeterminate: it may or may not be in the log).
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(6);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Isolate,
    LeaderCut,
    ControllerMinority,
    Bridge,
    OneWay,
    Loss,
    Kill,
    Pause,
    ClientCut,
}

const KINDS: [Kind; 9] = [
    Kind::Isolate,
    Kind::LeaderCut,
    Kind::ControllerMinority,
    Kind::Bridge,
    Kind::OneWay,
    Kind::Loss,
    Kind::Kill,
    Kind::Pause,
    Kind::ClientCut,
];

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Isolate => "isolate",
        Kind::LeaderCut => "leader-cut",
        Kind::ControllerMinority => "controller-minority",
        Kind::Bridge => "bridge",
        Kind::OneWay => "one-way",
        Kind::Loss => "loss",
        Kind::Kill => "kill",
        Kind::Pause => "pause",
        Kind::ClientCut => "client-cut",
    }
}

/// Timestamped events: faults, heals, errors, acks (sampled), reads.
struct History {
    start: Instant,
    events: Mutex<Vec<(f64, String)>>,
}

impl History {
    fn new() -> Arc<History> {
        Arc::new(History {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
        })
    }

    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn note(&self, what: impl Into<String>) -> f64 {
        let t = self.now();
        self.events.lock().unwrap().push((t, what.into()));
        t
    }

    /// The events from 6 s before `t` to 2 s after (at most 40, nearest `t`).
    fn around(&self, t: f64) -> String {
        self.around_of(t, |_| true)
    }

    /// [`History::around`], of the events `keep` accepts and the faults.
    fn around_of(&self, t: f64, keep: impl Fn(&str) -> bool) -> String {
        let events = self.events.lock().unwrap();
        let mut near: Vec<&(f64, String)> = events
            .iter()
            .filter(|(e, _)| *e >= t - 6.0 && *e <= t + 2.0)
            .filter(|(_, s)| {
                keep(s)
                    || s.starts_with("BEGIN")
                    || s.starts_with("HEALED")
                    || s.starts_with("recovered")
            })
            .collect();
        if near.len() > 40 {
            near.sort_by(|a, b| (a.0 - t).abs().total_cmp(&(b.0 - t).abs()));
            near.truncate(40);
            near.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        near.iter()
            .map(|(e, s)| format!("    {e:8.3}s {s}\n"))
            .collect()
    }
}

#[derive(Debug)]
struct Anomaly {
    t: f64,
    what: String,
}

type Anomalies = Arc<Mutex<Vec<Anomaly>>>;

/// (partition, offset) -> (record, when first read): every record read.
type Seen = Mutex<HashMap<(u32, i64), (String, f64)>>;

#[derive(Debug, Clone)]
struct Ack {
    value: String,
    offset: i64,
    t: f64,
}

/// What one schedule saw, for the report.
struct Outcome {
    seed: u64,
    anomalies: Vec<Anomaly>,
    faults: Vec<String>,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The tests of this binary take turns: each runs brokers on the two cores,
/// and the fault schedule's timings should not depend on what runs beside it.
static ONE_LAB_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn network_faults() {
    let _turn = ONE_LAB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if skip_unless_supported("network_faults") {
        return;
    }
    let began = Instant::now();
    let soak = env_u64("RILL_FAULT_SOAK_S").map(Duration::from_secs);
    let fixed = env_u64("RILL_FAULT_SEED");
    let base = Rng::seed_from_env();
    let lab = NetLab::new(BROKERS).unwrap_or_else(|e| panic!("cannot build the network: {e}"));
    let client_ns = lab.client().ns.clone();
    let outcomes = NetLab::run_in(&client_ns, move || {
        // Declared in this order so the brokers die before their namespaces.
        let mut lab = lab;
        let (mut cluster, rt, config) = live_cluster(&lab);
        let mut outcomes = Vec::new();
        let mut seeds = Rng(base);
        let mut i = 0u32;
        loop {
            let seed = match (fixed, i) {
                (Some(s), 0) => s,
                (Some(_), _) => break,
                (None, 0) => base,
                _ => seeds.next() | 1,
            };
            if fixed.is_none() && i > 0 {
                let more = match soak {
                    Some(s) => began.elapsed() < s,
                    None => i < SHORT_SCHEDULES,
                };
                if !more {
                    break;
                }
            }
            println!(
                "=== schedule {i}: seed {seed} (RILL_FAULT_SEED={seed} replays it), {:.0}s in",
                began.elapsed().as_secs_f64()
            );
            let o = run_schedule(seed, i, &mut lab, &mut cluster, &rt, &config);
            outcomes.push(o);
            i += 1;
        }
        drop(rt);
        drop(cluster);
        drop(lab);
        outcomes
    });
    println!(
        "network_faults: {} schedule(s) in {:.1}s",
        outcomes.len(),
        began.elapsed().as_secs_f64()
    );
    let mut total = 0;
    for o in &outcomes {
        println!("seed {}: {}", o.seed, o.faults.join("; "));
        total += o.anomalies.len();
    }
    assert_eq!(
        total,
        0,
        "{total} anomalies (seeds {:?}); each is printed above with its history",
        outcomes
            .iter()
            .filter(|o| !o.anomalies.is_empty())
            .map(|o| o.seed)
            .collect::<Vec<_>>()
    );
}

/// The lab's brokers started, a runtime and a client config for them, once
/// every broker is alive (call inside the client's namespace).
fn live_cluster(lab: &NetLab) -> (NetCluster, tokio::runtime::Runtime, ClientConfig) {
    let cluster = NetCluster::start(lab, &[]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut config = ClientConfig::new(cluster.bootstrap());
    config.tls = rill_net::ClientTls::Dev {
        home: cluster.home(),
    };
    wait_live(&rt, &config, &cluster);
    (cluster, rt, config)
}

/// Waits until every broker is alive in the cluster metadata.
fn wait_live(rt: &tokio::runtime::Runtime, config: &ClientConfig, cluster: &NetCluster) {
    let deadline = Instant::now() + RECOVER_TIMEOUT;
    let mut last = String::new();
    while Instant::now() < deadline {
        let r = rt.block_on(async {
            let c = Client::connect(config.clone()).await?;
            c.admin().cluster().await
        });
        match r {
            Ok(info) if info.brokers.iter().filter(|b| b.alive).count() == BROKERS => return,
            Ok(info) => last = format!("{info:?}"),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!(
        "the brokers did not all come up: {last}\n{}",
        (0..BROKERS)
            .map(|i| cluster.log_tail(i, 80))
            .collect::<String>()
    );
}

/// One admin call with a bound.
fn admin<T>(
    rt: &tokio::runtime::Runtime,
    config: &ClientConfig,
    f: impl AsyncFnOnce(rill_client::Admin) -> Result<T, rill_client::ClientError>,
) -> Result<T, String> {
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), async {
            let c = Client::connect(config.clone())
                .await
                .map_err(|e| e.to_string())?;
            f(c.admin()).await.map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
    })
}

/// Leaders and ISRs of the topic's partitions, as one broker tells it.
fn describe(
    rt: &tokio::runtime::Runtime,
    config: &ClientConfig,
    topic: &str,
) -> Result<Vec<rill_client::PartitionMetadata>, String> {
    let t = topic.to_string();
    admin(rt, config, async move |a| a.describe_topic(&t).await).map(|d| d.partitions)
}

fn full_isrs(parts: &[rill_client::PartitionMetadata]) -> bool {
    parts.len() == PARTITIONS as usize
        && parts
            .iter()
            .all(|p| p.isr.len() == BROKERS && p.leader.is_some())
}

/// Waits (bounded) until every broker is alive and in every ISR of `topic`;
/// how long it took, or what it last saw.
fn wait_healed(
    rt: &tokio::runtime::Runtime,
    config: &ClientConfig,
    topic: &str,
) -> Result<(Duration, Option<String>), String> {
    let began = Instant::now();
    let mut last = String::new();
    let mut stale = None;
    while began.elapsed() < RECOVER_TIMEOUT {
        match healed_view(rt, config, topic) {
            Ok(()) => return Ok((began.elapsed(), stale)),
            Err(e) => {
                if e.contains("disagree") && stale.is_none() {
                    stale = Some(e.clone());
                }
                last = e;
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Err(last)
}

/// Whether every broker, asked alone, sees every broker alive and the same
/// leaders and epochs with full ISRs (a broker whose metadata stayed behind
/// would send new clients to a deposed leader).
fn healed_view(
    rt: &tokio::runtime::Runtime,
    config: &ClientConfig,
    topic: &str,
) -> Result<(), String> {
    let mut views = Vec::new();
    for addr in &config.bootstrap {
        let mut one = config.clone();
        one.bootstrap = vec![addr.clone()];
        let live = admin(rt, &one, async |a| a.cluster().await)
            .map_err(|e| format!("{addr}: cluster: {e}"))?;
        let alive = live.brokers.iter().filter(|b| b.alive).count();
        if alive != BROKERS {
            return Err(format!("{addr} sees {alive} live brokers: {live:?}"));
        }
        let parts = describe(rt, &one, topic).map_err(|e| format!("{addr}: describe: {e}"))?;
        if !full_isrs(&parts) {
            return Err(format!("{addr}: not every ISR is full: {parts:?}"));
        }
        let leaders: Vec<(u32, Option<i32>, i32)> = parts
            .iter()
            .map(|p| (p.partition, p.leader, p.leader_epoch.0))
            .collect();
        views.push((addr.clone(), leaders));
    }
    if views.windows(2).all(|w| w[0].1 == w[1].1) {
        Ok(())
    } else {
        Err(format!(
            "the brokers disagree on (partition, leader, epoch): {views:?}"
        ))
    }
}

#[allow(clippy::too_many_arguments)]
fn run_schedule(
    seed: u64,
    idx: u32,
    lab: &mut NetLab,
    cluster: &mut NetCluster,
    rt: &tokio::runtime::Runtime,
    config: &ClientConfig,
) -> Outcome {
    let mut rng = Rng(seed);
    let max_hold_ms =
        env_u64("RILL_FAULT_MAX_HOLD_MS").unwrap_or(if env_u64("RILL_FAULT_SOAK_S").is_some() {
            12_000
        } else {
            5_000
        });
    let hist = History::new();
    let anomalies: Anomalies = Arc::new(Mutex::new(Vec::new()));
    let topic = format!("netq{idx}-{seed}");
    let mut faults_done = Vec::new();

    // The topic: RF 3, min.insync.replicas=2, small segments.
    let created = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let t = topic.clone();
            let r = admin(rt, config, async move |a| {
                a.create_topic(NewTopic {
                    name: t,
                    partitions: Some(PARTITIONS),
                    replication_factor: Some(BROKERS as u16),
                    configs: vec![
                        ("min.insync.replicas".into(), "2".into()),
                        ("replica.lag.time.max.ms".into(), "3000".into()),
                        ("segment.bytes".into(), "65536".into()),
                    ],
                })
                .await
            });
            match r {
                Ok(()) => break Ok(()),
                Err(e) if e.contains("already exists") || e.contains("ALREADY_EXISTS") => {
                    break Ok(());
                }
                Err(e) if Instant::now() > deadline => break Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(300)),
            }
        }
    };
    if let Err(e) = created {
        panic!("seed {seed}: cannot create {topic}: {e}");
    }
    if let Err(e) = wait_healed(rt, config, &topic) {
        panic!("seed {seed}: {topic} never got full ISRs: {e}");
    }
    hist.note(format!("topic {topic} created, full ISRs"));

    // Workloads.
    let stop = Arc::new(AtomicBool::new(false));
    let acks: Arc<Mutex<BTreeMap<u32, Vec<Ack>>>> = Arc::default();
    // (partition, offset) -> (value, time first read): every read, live and final.
    let seen: Arc<Seen> = Arc::default();
    let mut producers = Vec::new();
    for p in 0..PARTITIONS {
        producers.push(rt.spawn(producer(
            config.clone(),
            topic.clone(),
            p,
            stop.clone(),
            hist.clone(),
            acks.clone(),
        )));
        producers.push(rt.spawn(pipelined_producer(
            config.clone(),
            topic.clone(),
            p,
            stop.clone(),
            hist.clone(),
            acks.clone(),
        )));
    }
    let reader = rt.spawn(live_reader(
        config.clone(),
        topic.clone(),
        stop.clone(),
        hist.clone(),
        seen.clone(),
        anomalies.clone(),
        seed,
    ));
    // Workload (3): members of one consumer group, and a reader of its
    // committed offsets.
    let group = format!("g{idx}-{seed}");
    let glog: Arc<Mutex<GroupLog>> = Arc::default();
    let mut members = Vec::new();
    for m in 0..GROUP_MEMBERS {
        members.push(rt.spawn(group_member(
            m,
            config.clone(),
            topic.clone(),
            group.clone(),
            stop.clone(),
            hist.clone(),
            glog.clone(),
            anomalies.clone(),
            seed,
        )));
    }
    members.push(rt.spawn(committed_reader(
        config.clone(),
        topic.clone(),
        group.clone(),
        stop.clone(),
        hist.clone(),
        glog.clone(),
    )));
    // Workload (4): topics created and deleted through varying brokers.
    let meta_ops: Arc<Mutex<Vec<MetaOp>>> = Arc::default();
    let meta = rt.spawn(metadata_ops(
        idx,
        seed,
        config.clone(),
        stop.clone(),
        hist.clone(),
        meta_ops.clone(),
    ));
    std::thread::sleep(Duration::from_millis(1500));

    // The faults: every kind once, in a seeded order.
    let mut kinds = KINDS.to_vec();
    for i in (1..kinds.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        kinds.swap(i, j);
    }
    // RILL_FAULT_KINDS=leader-cut,kill (a debugging aid): only those kinds.
    if let Ok(only) = std::env::var("RILL_FAULT_KINDS") {
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        kinds.retain(|k| only.contains(&kind_name(*k)));
    }
    // Then compound steps: two kinds at once, the second 1-2.5 s after the
    // first (e.g. a leader cut from its followers, then the new leader killed).
    let mut steps: Vec<Vec<Kind>> = kinds.iter().map(|k| vec![*k]).collect();
    for _ in 0..COMPOUND_STEPS {
        if kinds.is_empty() {
            break;
        }
        let a = kinds[rng.below(kinds.len() as u64) as usize];
        let b = kinds[rng.below(kinds.len() as u64) as usize];
        steps.push(vec![a, b]);
    }
    let mut windows: Vec<(String, f64, f64, Duration, Option<String>)> = Vec::new();
    for (k, step) in steps.iter().enumerate() {
        let hold = Duration::from_millis(2500 + rng.below(max_hold_ms.max(2501) - 2500));
        let mut killed: Vec<usize> = Vec::new();
        let mut paused: Vec<usize> = Vec::new();
        let mut whats = Vec::new();
        let mut t0 = None;
        for (j, kind) in step.iter().enumerate() {
            if j > 0 {
                std::thread::sleep(Duration::from_millis(1000 + rng.below(1500)));
            }
            let (what, kill, pause) = choose(*kind, &mut rng, lab, rt, config, &topic);
            let already = |v: usize| killed.contains(&v) || paused.contains(&v);
            let (kill, pause) = (
                kill.filter(|&v| !already(v)),
                pause.filter(|&v| !already(v)),
            );
            let skipped = what.starts_with("kill") && kill.is_none()
                || what.starts_with("pause") && pause.is_none();
            let what = if skipped {
                format!("{what} (skipped: already down)")
            } else {
                what
            };
            let line = format!("fault {k}.{j}: {what}");
            println!("  {line}");
            let t = hist.note(format!("BEGIN {line}"));
            t0.get_or_insert(t);
            if let Err(e) = lab.apply() {
                panic!("seed {seed}: cannot apply {what}: {e}");
            }
            if let Some(v) = kill {
                cluster.kill(v);
                killed.push(v);
            }
            if let Some(v) = pause {
                cluster.pause(v);
                paused.push(v);
            }
            whats.push(what);
        }
        let what = format!("fault {k}: {} for {hold:?}", whats.join(" + "));
        let t0 = t0.unwrap();
        std::thread::sleep(hold);
        lab.heal();
        for &v in &killed {
            cluster.spawn(v);
        }
        for &v in &paused {
            cluster.resume(v);
        }
        let t1 = hist.note(format!("HEALED {what}"));
        for b in 0..BROKERS {
            if let Some(status) = cluster.exited(b) {
                let t = hist.note(format!("broker {b} exited by itself: {status}"));
                anomalies.lock().unwrap().push(Anomaly {
                    t,
                    what: format!(
                        "broker {b} exited by itself ({status})\n{}",
                        cluster.log_tail(b, 40)
                    ),
                });
            }
        }
        match wait_healed(rt, config, &topic) {
            Ok((d, stale)) => {
                hist.note(format!(
                    "recovered (full ISRs) {:.1}s after the heal{}",
                    d.as_secs_f64(),
                    stale
                        .as_ref()
                        .map_or(String::new(), |s| format!("; on the way {s}"))
                ));
                windows.push((what, t0, t1, d, stale));
            }
            Err(last) => {
                let t = hist.note("NOT RECOVERED");
                anomalies.lock().unwrap().push(Anomaly {
                    t,
                    what: format!(
                        "the cluster did not recover within {RECOVER_TIMEOUT:?} after {what}: {last}\n{}",
                        (0..BROKERS).map(|i| cluster.log_tail(i, 40)).collect::<String>()
                    ),
                });
                windows.push((what, t0, t1, RECOVER_TIMEOUT, None));
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }

    // Stop writing, then read everything back.
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let stopped_at = hist.now();
    let mut attempted = Vec::new();
    for h in producers {
        attempted.push(rt.block_on(h).unwrap());
    }
    let _ = rt.block_on(reader);
    for h in members {
        let _ = rt.block_on(h);
    }
    let _ = rt.block_on(meta);
    // The final read waits for every broker to agree on the leaders (a
    // deposed leader whose metadata is still behind would serve its old end),
    // and is repeated (bounded) while it ends below an acknowledged offset.
    let _ = wait_healed(rt, config, &topic);
    let mut final_read;
    let reread_until = Instant::now() + Duration::from_secs(30);
    loop {
        final_read = rt.block_on(read_back(config.clone(), topic.clone(), hist.clone()));
        let short: Vec<String> = acks
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(p, list)| {
                let acked = list.iter().map(|a| a.offset).max()?;
                let end = final_read
                    .get(p)
                    .and_then(|r| r.last())
                    .map_or(-1, |(o, _)| *o);
                (end < acked).then(|| format!("partition {p} read to {end}, acked up to {acked}"))
            })
            .collect();
        if short.is_empty() || Instant::now() > reread_until {
            break;
        }
        hist.note(format!(
            "final read short ({}); reading again",
            short.join(", ")
        ));
        std::thread::sleep(Duration::from_secs(1));
    }
    let mut acks = acks.lock().unwrap().clone();
    for list in acks.values_mut() {
        list.sort_by(|a, b| a.t.total_cmp(&b.t));
    }

    check_queue(seed, &hist, &anomalies, &acks, &final_read, &seen);
    check_replicas(seed, rt, config, cluster, &topic, &hist, &anomalies);
    check_groups(seed, &group, &hist, &anomalies, &glog.lock().unwrap());
    let ops = meta_ops.lock().unwrap().clone();
    check_metadata(seed, rt, config, cluster, &hist, &anomalies, &ops);

    // Failover: per fault, the longest wait between two acknowledgements of
    // one partition that began during the fault (while it held or until the
    // cluster healed), and when that wait ended, from the fault's start: the
    // time until produce with acks=all succeeded again.
    // The live reader's progress: when it first read each offset.
    let mut read_times: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for ((p, _), (_, t)) in seen.lock().unwrap().iter() {
        if *t <= stopped_at {
            read_times.entry(*p).or_default().push(*t);
        }
    }
    for list in read_times.values_mut() {
        list.sort_by(f64::total_cmp);
    }
    for (what, t0, t1, recovered, stale) in &windows {
        let end = *t1 + recovered.as_secs_f64();
        let read_gap = read_times
            .values()
            .flat_map(|ts| {
                ts.windows(2)
                    .filter(|w| w[0] >= *t0 - 0.2 && w[0] <= end)
                    .map(|w| w[1] - w[0])
            })
            .fold(0.0f64, f64::max);
        let mut worst: Option<(f64, f64, u32)> = None; // (gap, end - t0, partition)
        for (p, list) in &acks {
            for w in list.windows(2) {
                let (a, b) = (w[0].t, w[1].t);
                if a >= *t0 - 0.2 && a <= *t1 + recovered.as_secs_f64() {
                    let gap = b - a;
                    if worst.is_none_or(|(g, _, _)| gap > g) {
                        worst = Some((gap, b - t0, *p));
                    }
                }
            }
        }
        let line = match worst {
            Some((gap, back, p)) => format!(
                "{what}: longest ack gap {gap:.2}s (partition {p}, acks back {back:.2}s after the fault began), longest read gap {read_gap:.2}s, full ISRs {:.1}s after the heal",
                recovered.as_secs_f64()
            ),
            None => format!("{what}: no acks around it"),
        };
        let line = match stale {
            Some(s) => format!(
                "{line}; before that the brokers disagreed on the leaders: {}",
                s.chars().take(300).collect::<String>()
            ),
            None => line,
        };
        println!("  {line}");
        faults_done.push(line);
    }

    let total_acked: usize = acks.values().map(Vec::len).sum();
    let attempted_n: u64 = attempted.iter().sum();
    let read_n: usize = final_read.values().map(Vec::len).sum();
    println!(
        "  seed {seed}: {attempted_n} attempted, {total_acked} acknowledged, {read_n} read back"
    );
    if total_acked == 0 {
        let t = hist.now();
        anomalies.lock().unwrap().push(Anomaly {
            t,
            what: "no write was acknowledged at all".into(),
        });
    }
    let anomalies = std::mem::take(&mut *anomalies.lock().unwrap());
    // Each anomaly with its history; past 10 of one kind, only a count.
    let mut per_kind: BTreeMap<String, usize> = BTreeMap::new();
    for a in &anomalies {
        let kind: String = a.what.split(':').next().unwrap_or("").to_string();
        let n = per_kind.entry(kind).or_default();
        *n += 1;
        if *n > 10 {
            continue;
        }
        println!(
            "ANOMALY (seed {seed}, RILL_FAULT_SEED={seed} replays it) at {:.3}s: {}\n  history:\n{}",
            a.t,
            a.what,
            // Group and metadata anomalies: the history of their workload.
            if a.what.starts_with("group") || a.what.starts_with("committed offset") {
                hist.around_of(a.t, |s| {
                    s.starts_with("group") || s.starts_with("committed")
                })
            } else if a.what.starts_with("metadata") {
                hist.around_of(a.t, |s| s.starts_with("metadata"))
            } else {
                hist.around(a.t)
            }
        );
    }
    if !anomalies.is_empty() {
        println!("  seed {seed}: anomalies by kind: {per_kind:?}");
        let timeline: String = hist
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, e)| {
                e.starts_with("BEGIN")
                    || e.starts_with("HEALED")
                    || e.starts_with("recovered")
                    || e.starts_with("NOT")
            })
            .map(|(t, e)| format!("    {t:8.3}s {e}\n"))
            .collect();
        println!("  seed {seed}: the faults:\n{timeline}");
        // Keep the brokers' logs (the cluster's temp dir goes at the end).
        let keep = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("net_faults")
            .join(seed.to_string());
        let _ = std::fs::create_dir_all(&keep);
        for b in 0..BROKERS {
            let _ = std::fs::copy(cluster.log_path(b), keep.join(format!("broker-{b}.log")));
        }
        println!("  seed {seed}: broker logs kept in {}", keep.display());
    }
    // Free the disk for the next schedule.
    let t = topic.clone();
    let _ = admin(rt, config, async move |a| a.delete_topic(&t).await);
    Outcome {
        seed,
        anomalies,
        faults: faults_done,
    }
}

/// Picks the targets of one fault of `kind` from the cluster's state, adds
/// its network rules to `lab` (not applied yet); what it is, and the broker
/// to kill or to pause.
fn choose(
    kind: Kind,
    rng: &mut Rng,
    lab: &mut NetLab,
    rt: &tokio::runtime::Runtime,
    config: &ClientConfig,
    topic: &str,
) -> (String, Option<usize>, Option<usize>) {
    let parts = describe(rt, config, topic).unwrap_or_default();
    let leader_of = |rng: &mut Rng| -> usize {
        let p = rng.below(PARTITIONS as u64) as usize;
        parts
            .get(p)
            .and_then(|m| m.leader)
            .map_or_else(|| rng.below(BROKERS as u64) as usize, |l| l as usize)
    };
    let others = |x: usize| -> Vec<usize> { (0..BROKERS).filter(|&b| b != x).collect() };
    match kind {
        Kind::Isolate => {
            let v = rng.below(BROKERS as u64) as usize;
            lab.isolate(v);
            (format!("isolate broker {v}"), None, None)
        }
        Kind::LeaderCut => {
            let l = leader_of(rng);
            lab.cut(l, &others(l));
            (
                format!("leader-cut: broker {l} (a partition leader) cut from its followers"),
                None,
                None,
            )
        }
        Kind::ControllerMinority => {
            let c = admin(rt, config, async |a| a.cluster().await)
                .ok()
                .and_then(|i| i.controller_id)
                .map_or_else(|| rng.below(BROKERS as u64) as usize, |c| c as usize);
            lab.cut(c, &others(c));
            (
                format!("controller-minority: controller {c} cut from the other brokers"),
                None,
                None,
            )
        }
        Kind::Bridge => {
            let m = rng.below(BROKERS as u64) as usize;
            let o = others(m);
            lab.cut(o[0], &[o[1]]);
            (
                format!(
                    "bridge: brokers {} and {} cut apart, both see {m}",
                    o[0], o[1]
                ),
                None,
                None,
            )
        }
        Kind::OneWay => {
            let l = leader_of(rng);
            let o = others(l);
            let f = o[rng.below(o.len() as u64) as usize];
            if rng.below(2) == 0 {
                lab.drop_one_way(l, f);
                (
                    format!("one-way: leader {l} -> follower {f} dropped"),
                    None,
                    None,
                )
            } else {
                lab.drop_one_way(f, l);
                (
                    format!("one-way: follower {f} -> leader {l} dropped"),
                    None,
                    None,
                )
            }
        }
        Kind::Loss => {
            let pct = 5 + rng.below(16) as u32;
            for b in 0..BROKERS {
                lab.loss(b, pct);
            }
            (
                format!("loss: {pct}% of every broker's packets"),
                None,
                None,
            )
        }
        Kind::Kill => {
            let v = leader_of(rng);
            (
                format!("kill: SIGKILL broker {v} (a partition leader)"),
                Some(v),
                None,
            )
        }
        Kind::Pause => {
            let v = rng.below(BROKERS as u64) as usize;
            (format!("pause: SIGSTOP broker {v}"), None, Some(v))
        }
        Kind::ClientCut => {
            let l = leader_of(rng);
            let client = lab.nodes.len() - 1;
            lab.cut(client, &[l]);
            (
                format!("client-cut: the client cannot reach broker {l} (a partition leader)"),
                None,
                None,
            )
        }
    }
}

/// Writes `p<p>-<n>` with key `k<p>` to partition `p`, one at a time, acks=all,
/// idempotent, until `stop`; returns how many it attempted.
async fn producer(
    config: ClientConfig,
    topic: String,
    p: u32,
    stop: Arc<AtomicBool>,
    hist: Arc<History>,
    acks: Arc<Mutex<BTreeMap<u32, Vec<Ack>>>>,
) -> u64 {
    let mut n = 0u64;
    let mut producer = None;
    let mut last_err = String::new();
    while !stop.load(Ordering::Relaxed) {
        if producer.is_none() {
            match tokio::time::timeout(Duration::from_secs(5), Client::connect(config.clone()))
                .await
            {
                Ok(Ok(c)) => {
                    producer = Some(
                        c.producer(ProducerConfig {
                            linger: Duration::ZERO,
                            delivery_timeout: DELIVERY_TIMEOUT,
                            ..ProducerConfig::default()
                        })
                        .unwrap(),
                    )
                }
                _ => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        let value = format!("p{p}-{n:07}");
        let record = ProducerRecord::new(topic.clone(), value.clone().into_bytes())
            .key(format!("p{p}").into_bytes())
            .partition(p);
        n += 1;
        let sent = tokio::time::timeout(
            DELIVERY_TIMEOUT + Duration::from_secs(5),
            producer.as_ref().unwrap().send_and_wait(record),
        )
        .await;
        match sent {
            Ok(Ok(md)) => {
                let t = hist.now();
                if n % 50 == 1 || !last_err.is_empty() {
                    hist.note(format!("ack {value} at {p}/{}", md.offset.0));
                }
                last_err.clear();
                acks.lock().unwrap().entry(p).or_default().push(Ack {
                    value,
                    offset: md.offset.0,
                    t,
                });
            }
            Ok(Err(e)) => {
                let e = e.to_string();
                if e != last_err {
                    hist.note(format!("produce {value} failed: {e}"));
                    last_err = e;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(_) => {
                hist.note(format!(
                    "produce {value}: no answer in {:?}; new producer",
                    DELIVERY_TIMEOUT + Duration::from_secs(5)
                ));
                producer = None;
            }
        }
    }
    n
}

/// Writes `q<p>-<n>` with key `q<p>` to partition `p` without waiting for
/// each acknowledgement (up to 200 records outstanding, 2 ms linger, so
/// several batches are in flight: idempotence has to keep them in order
/// through retries); until `stop`; returns how many it attempted.
async fn pipelined_producer(
    config: ClientConfig,
    topic: String,
    p: u32,
    stop: Arc<AtomicBool>,
    hist: Arc<History>,
    acks: Arc<Mutex<BTreeMap<u32, Vec<Ack>>>>,
) -> u64 {
    let window = Arc::new(tokio::sync::Semaphore::new(200));
    let last_err = Arc::new(Mutex::new(String::new()));
    let mut n = 0u64;
    let mut producer = None;
    let mut pending = tokio::task::JoinSet::new();
    while !stop.load(Ordering::Relaxed) {
        if producer.is_none() {
            match tokio::time::timeout(Duration::from_secs(5), Client::connect(config.clone()))
                .await
            {
                Ok(Ok(c)) => {
                    producer = Some(
                        c.producer(ProducerConfig {
                            linger: Duration::from_millis(2),
                            delivery_timeout: DELIVERY_TIMEOUT,
                            ..ProducerConfig::default()
                        })
                        .unwrap(),
                    )
                }
                _ => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        let Ok(permit) =
            tokio::time::timeout(Duration::from_millis(500), window.clone().acquire_owned()).await
        else {
            continue;
        };
        let permit = permit.unwrap();
        let value = format!("q{p}-{n:07}");
        n += 1;
        let record = ProducerRecord::new(topic.clone(), value.clone().into_bytes())
            .key(format!("q{p}").into_bytes())
            .partition(p);
        let sent =
            tokio::time::timeout(DELIVERY_TIMEOUT, producer.as_ref().unwrap().send(record)).await;
        let delivery = match sent {
            Ok(Ok(d)) => d,
            other => {
                hist.note(format!(
                    "pipelined send {value} failed: {other:?}; new producer"
                ));
                producer = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (hist, acks, last_err) = (hist.clone(), acks.clone(), last_err.clone());
        pending.spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(DELIVERY_TIMEOUT + Duration::from_secs(5), delivery).await {
                Ok(Ok(md)) => {
                    let t = hist.now();
                    acks.lock().unwrap().entry(p).or_default().push(Ack {
                        value,
                        offset: md.offset.0,
                        t,
                    });
                    last_err.lock().unwrap().clear();
                }
                Ok(Err(e)) => {
                    let e = e.to_string();
                    let mut last = last_err.lock().unwrap();
                    if *last != e {
                        hist.note(format!("pipelined produce {value} failed: {e}"));
                        *last = e;
                    }
                }
                Err(_) => {
                    hist.note(format!("pipelined produce {value}: no answer"));
                }
            }
        });
        while pending.try_join_next().is_some() {}
        // At most about 1,000 records a second.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    while pending.join_next().await.is_some() {}
    n
}

/// Reads the topic from the beginning while the faults run: notes every
/// record in `seen` and flags a different record at an offset already read, or
/// an offset not above the last one read from that partition.
async fn live_reader(
    config: ClientConfig,
    topic: String,
    stop: Arc<AtomicBool>,
    hist: Arc<History>,
    seen: Arc<Seen>,
    anomalies: Anomalies,
    seed: u64,
) {
    let tps: Vec<TopicPartition> = (0..PARTITIONS)
        .map(|p| TopicPartition::new(&topic, p))
        .collect();
    let mut last: HashMap<u32, i64> = HashMap::new();
    let mut last_err = String::new();
    'connect: while !stop.load(Ordering::Relaxed) {
        let client =
            match tokio::time::timeout(Duration::from_secs(5), Client::connect(config.clone()))
                .await
            {
                Ok(Ok(c)) => c,
                _ => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
        let mut consumer = client.consumer(ConsumerConfig::default()).unwrap();
        consumer.assign(tps.clone());
        // Resume after what was read (a new consumer, same positions).
        for tp in &tps {
            let from = last.get(&tp.partition).map_or(0, |o| o + 1);
            let _ = consumer.seek(tp, rill_client::Offset(from));
        }
        while !stop.load(Ordering::Relaxed) {
            let got = tokio::time::timeout(
                Duration::from_secs(15),
                consumer.poll(Duration::from_millis(200)),
            )
            .await;
            let records = match got {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    let e = e.to_string();
                    if e != last_err {
                        hist.note(format!("live read failed: {e}"));
                        last_err = e;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(_) => {
                    hist.note("live read: poll hung 15s; new consumer");
                    continue 'connect;
                }
            };
            last_err.clear();
            for r in records {
                let p = r.partition;
                let o = r.offset.0;
                let v = r
                    .value
                    .as_deref()
                    .map_or("<null>".into(), |v| String::from_utf8_lossy(v).into_owned());
                if let Some(prev) = last.get(&p)
                    && o <= *prev
                {
                    let t = hist.note(format!("live read {v} at {p}/{o} after {p}/{prev}"));
                    anomalies.lock().unwrap().push(Anomaly {
                        t,
                        what: format!(
                            "offsets went back: the consumer read {p}/{o} ({v}) after {p}/{prev} (seed {seed})"
                        ),
                    });
                }
                last.insert(p, o);
                note_read(&seen, &hist, &anomalies, p, o, v, "live", seed);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn note_read(
    seen: &Seen,
    hist: &History,
    anomalies: &Anomalies,
    p: u32,
    o: i64,
    v: String,
    how: &str,
    seed: u64,
) {
    let t = hist.now();
    let mut seen = seen.lock().unwrap();
    match seen.get(&(p, o)) {
        Some((prev, t_prev)) if *prev != v => {
            let t = hist.note(format!(
                "{how} read {v} at {p}/{o}; {prev} was read there at {t_prev:.3}s"
            ));
            anomalies.lock().unwrap().push(Anomaly {
                t,
                what: format!(
                    "inconsistent offsets: partition {p} offset {o} held {prev} (read at {t_prev:.3}s) and now {v} ({how} read, seed {seed})"
                ),
            });
        }
        Some(_) => {}
        None => {
            seen.insert((p, o), (v, t));
        }
    }
}

/// Every record of the topic up to the high watermarks, per partition, as
/// (offset, value); retries through errors, bounded.
async fn read_back(
    config: ClientConfig,
    topic: String,
    hist: Arc<History>,
) -> BTreeMap<u32, Vec<(i64, String)>> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let attempt = async {
            let client = Client::connect(config.clone()).await?;
            let tps: Vec<TopicPartition> = (0..PARTITIONS)
                .map(|p| TopicPartition::new(&topic, p))
                .collect();
            let ends = client.list_offsets(&tps, OffsetSpec::Latest).await?;
            let mut consumer = client.consumer(ConsumerConfig::default())?;
            consumer.assign(tps.clone());
            consumer.seek_to_beginning(&tps).await?;
            let mut out: BTreeMap<u32, Vec<(i64, String)>> = BTreeMap::new();
            loop {
                let mut done = true;
                for (tp, end) in &ends {
                    if consumer.position(tp).await? < *end {
                        done = false;
                    }
                }
                if done {
                    return Ok::<_, rill_client::ClientError>(out);
                }
                for r in consumer.poll(Duration::from_millis(200)).await? {
                    let v = r
                        .value
                        .as_deref()
                        .map_or("<null>".into(), |v| String::from_utf8_lossy(v).into_owned());
                    out.entry(r.partition).or_default().push((r.offset.0, v));
                }
            }
        };
        match tokio::time::timeout(Duration::from_secs(60), attempt).await {
            Ok(Ok(out)) => return out,
            other => {
                hist.note(format!("final read failed: {other:?}"));
                assert!(
                    Instant::now() < deadline,
                    "cannot read {topic} back: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Workload (1) and the final half of (2).
fn check_queue(
    seed: u64,
    hist: &History,
    anomalies: &Anomalies,
    acks: &BTreeMap<u32, Vec<Ack>>,
    read: &BTreeMap<u32, Vec<(i64, String)>>,
    seen: &Seen,
) {
    let flag = |t: f64, what: String| {
        anomalies.lock().unwrap().push(Anomaly {
            t,
            what: format!("{what} (seed {seed})"),
        })
    };
    // A record a consumer read during the faults is still in the log, at its
    // offset (a different record there is flagged by `note_read`).
    {
        let in_log: std::collections::HashSet<(u32, i64)> = read
            .iter()
            .flat_map(|(p, rs)| rs.iter().map(move |(o, _)| (*p, *o)))
            .collect();
        let seen = seen.lock().unwrap();
        let mut gone: Vec<_> = seen.iter().filter(|(k, _)| !in_log.contains(k)).collect();
        gone.sort_by_key(|(k, _)| **k);
        for ((p, o), (v, t)) in gone.into_iter().take(20) {
            flag(
                *t,
                format!(
                    "read then gone: {v} was read at {p}/{o} but the log no longer has that offset"
                ),
            );
        }
    }
    for p in 0..PARTITIONS {
        let empty = Vec::new();
        let records = read.get(&p).unwrap_or(&empty);
        let mut at: HashMap<&str, i64> = HashMap::new();
        // Per producer (key): the last (offset, n, value) read.
        let mut prev: HashMap<char, (i64, u64, &str)> = HashMap::new();
        for (o, v) in records {
            note_read(seen, hist, anomalies, p, *o, v.clone(), "final", seed);
            if let Some(first) = at.insert(v.as_str(), *o) {
                flag(
                    hist.now(),
                    format!("duplicated: {v} in partition {p} at offsets {first} and {o}"),
                );
            }
            let kind = v.chars().next().unwrap_or('?');
            let Some(n) = v
                .get(1..)
                .and_then(|r| r.strip_prefix(&format!("{p}-")))
                .and_then(|s| s.parse::<u64>().ok())
                .filter(|_| kind == 'p' || kind == 'q')
            else {
                flag(hist.now(), format!("foreign record {v} at {p}/{o}"));
                continue;
            };
            if let Some((po, pn, pv)) = prev.get(&kind)
                && n <= *pn
            {
                flag(
                    hist.now(),
                    format!("reordered: key {kind}{p}: {v} at {p}/{o} after {pv} at {p}/{po}"),
                );
            }
            prev.insert(kind, (*o, n, v.as_str()));
        }
        for a in acks.get(&p).unwrap_or(&Vec::new()) {
            let v = &a.value;
            match at.get(v.as_str()) {
                None => flag(
                    a.t,
                    format!(
                        "lost acknowledged write: {v}, acknowledged at {p}/{}, is not in the log",
                        a.offset
                    ),
                ),
                Some(o) if *o != a.offset => flag(
                    a.t,
                    format!(
                        "moved: {v} was acknowledged at {p}/{} but is at {p}/{o}",
                        a.offset
                    ),
                ),
                Some(_) => {}
            }
        }
    }
}

/// The batches of a partition directory's segment files: base offset ->
/// (last offset, bytes), those below `hw` only.
fn batches(dir: &Path, hw: i64) -> BTreeMap<i64, (i64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "log"))
                .collect()
        })
        .unwrap_or_default();
    logs.sort();
    for l in logs {
        let Ok(bytes) = std::fs::read(&l) else {
            continue;
        };
        let mut pos = 0usize;
        while pos + 61 <= bytes.len() {
            let base = i64::from_be_bytes(bytes[pos..pos + 8].try_into().unwrap());
            let len = i32::from_be_bytes(bytes[pos + 8..pos + 12].try_into().unwrap());
            let delta = i32::from_be_bytes(bytes[pos + 23..pos + 27].try_into().unwrap());
            if len <= 0 {
                break;
            }
            let end = pos + 12 + len as usize;
            if end > bytes.len() {
                break;
            }
            let last = base + delta as i64;
            if last < hw {
                out.insert(base, (last, bytes[pos..end].to_vec()));
            }
            pos = end;
        }
    }
    out
}

/// Which header fields of two record batches differ, and whether their
/// records do, for a divergence report (" (leader epoch 4 vs 5)").
fn header_diff(x: &[u8], y: &[u8]) -> String {
    const FIELDS: [(&str, usize, usize); 12] = [
        ("length", 8, 12),
        ("leader epoch", 12, 16),
        ("magic", 16, 17),
        ("crc", 17, 21),
        ("attributes", 21, 23),
        ("last offset delta", 23, 27),
        ("base timestamp", 27, 35),
        ("max timestamp", 35, 43),
        ("producer id", 43, 51),
        ("producer epoch", 51, 53),
        ("base sequence", 53, 57),
        ("record count", 57, 61),
    ];
    // Big-endian, signed (an epoch or sequence of -1 reads -1).
    let int = |b: &[u8]| {
        let u = b.iter().fold(0u64, |a, &v| (a << 8) | v as u64);
        let shift = 64 - 8 * b.len() as u32;
        ((u << shift) as i64) >> shift
    };
    let mut out: Vec<String> = FIELDS
        .iter()
        .filter(|(_, s, e)| x.len() >= *e && y.len() >= *e && x[*s..*e] != y[*s..*e])
        .map(|(n, s, e)| format!("{n} {} vs {}", int(&x[*s..*e]), int(&y[*s..*e])))
        .collect();
    if x.get(61..) != y.get(61..) {
        out.push("records differ".into());
    }
    if out.is_empty() {
        String::new()
    } else {
        format!(" ({})", out.join(", "))
    }
}

/// Workload (5): every replica byte-identical up to the high watermark.
fn check_replicas(
    seed: u64,
    rt: &tokio::runtime::Runtime,
    config: &ClientConfig,
    cluster: &NetCluster,
    topic: &str,
    hist: &History,
    anomalies: &Anomalies,
) {
    let hws = rt.block_on(async {
        let c = Client::connect(config.clone()).await?;
        let tps: Vec<TopicPartition> = (0..PARTITIONS)
            .map(|p| TopicPartition::new(topic, p))
            .collect();
        c.list_offsets(&tps, OffsetSpec::Latest).await
    });
    let hws = match hws {
        Ok(h) => h,
        Err(e) => {
            anomalies.lock().unwrap().push(Anomaly {
                t: hist.now(),
                what: format!("cannot read the high watermarks of {topic}: {e} (seed {seed})"),
            });
            return;
        }
    };
    for (tp, hw) in hws {
        let p = tp.partition;
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            let reps: Vec<BTreeMap<i64, (i64, Vec<u8>)>> = (0..BROKERS)
                .map(|b| batches(&cluster.data_dir(b).join(format!("{topic}-{p}")), hw.0))
                .collect();
            let first_diff = (1..BROKERS).find_map(|b| {
                if reps[b] == reps[0] {
                    return None;
                }
                // The first offset where replica b and replica 0 differ.
                let keys: std::collections::BTreeSet<i64> =
                    reps[0].keys().chain(reps[b].keys()).copied().collect();
                let k = keys
                    .into_iter()
                    .find(|k| reps[0].get(k) != reps[b].get(k))
                    .unwrap();
                let show = |m: &BTreeMap<i64, (i64, Vec<u8>)>| {
                    m.get(&k)
                        .map_or("none".to_string(), |(l, b)| format!("{k}..={l}, {} bytes", b.len()))
                };
                let fields = match (reps[0].get(&k), reps[b].get(&k)) {
                    (Some((_, x)), Some((_, y))) => header_diff(x, y),
                    _ => String::new(),
                };
                Some(format!(
                    "broker 0 and broker {b} differ at offset {k}: batch {} vs {}{fields}; batches below hw {}: {} vs {}",
                    show(&reps[0]),
                    show(&reps[b]),
                    hw.0,
                    reps[0].len(),
                    reps[b].len()
                ))
            });
            let Some(diff) = first_diff else {
                break;
            };
            if Instant::now() > give_up {
                // Keep the replicas' files for a look at the bytes.
                let keep = Path::new(env!("CARGO_TARGET_TMPDIR"))
                    .join("net_faults")
                    .join(seed.to_string());
                for b in 0..BROKERS {
                    let from = cluster.data_dir(b).join(format!("{topic}-{p}"));
                    let to = keep.join(format!("broker-{b}-{topic}-{p}"));
                    let _ = std::fs::remove_dir_all(&to);
                    let _ = std::fs::create_dir_all(&to);
                    for f in std::fs::read_dir(&from).into_iter().flatten().flatten() {
                        let _ = std::fs::copy(f.path(), to.join(f.file_name()));
                    }
                }
                anomalies.lock().unwrap().push(Anomaly {
                    t: hist.now(),
                    what: format!(
                        "divergent replicas of {topic}-{p} up to hw {}: {diff} (seed {seed})",
                        hw.0
                    ),
                });
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// Session timeout and heartbeat interval of the group members (workload 3):
/// shorter than most faults, so a cut-off member loses its partitions during
/// one.
const GROUP_SESSION_MS: u32 = 3000;
const GROUP_HEARTBEAT_MS: u32 = 300;
/// Members of the workload's consumer group.
const GROUP_MEMBERS: usize = 3;
/// How often a member commits, and the committed offsets are read back.
const GROUP_COMMIT_EVERY: Duration = Duration::from_secs(1);
/// How long the metadata check waits for the brokers' views and data
/// directories to settle after the last heal.
const METADATA_SETTLE: Duration = Duration::from_secs(30);

/// A member incarnation held a partition from `start` (its poll returned the
/// assignment) to `end` (its first call after the revocation or loss was
/// reported, or its leave).
#[derive(Debug, Clone)]
struct Held {
    member: String,
    p: u32,
    start: f64,
    end: f64,
    how: String,
}

/// One observation of a group's committed offset of a partition: a commit
/// acknowledged, or the committed offsets read back; `sent` to `done`.
#[derive(Debug, Clone)]
struct CommitObs {
    who: String,
    p: u32,
    offset: i64,
    sent: f64,
    done: f64,
}

/// What workload (3) saw.
#[derive(Default)]
struct GroupLog {
    held: Vec<Held>,
    commits: Vec<CommitObs>,
    reads: Vec<CommitObs>,
}

fn group_config(group: &str, topic: &str) -> rill_client::GroupConfig {
    let mut gc = rill_client::GroupConfig::new(group, vec![topic.to_string()]);
    gc.session_timeout_ms = GROUP_SESSION_MS;
    gc.heartbeat_interval_ms = GROUP_HEARTBEAT_MS;
    gc.auto_offset_reset = rill_client::OffsetReset::Earliest;
    gc.enable_auto_commit = false;
    gc
}

/// Ends the intervals of `ps` (held since the time in `open`) at `t`.
fn end_held(
    glog: &Mutex<GroupLog>,
    open: &mut BTreeMap<u32, f64>,
    ps: &[u32],
    who: &str,
    t: f64,
    how: &str,
) {
    let mut g = glog.lock().unwrap();
    for p in ps {
        if let Some(start) = open.remove(p) {
            g.held.push(Held {
                member: who.to_string(),
                p: *p,
                start,
                end: t,
                how: how.to_string(),
            });
        }
    }
}

/// Applies a member's assignment changes, reported by a call that returned at
/// `t`: an assigned partition is held from `t`; a revoked (or lost) one until
/// the member's next call (`ending`).
#[allow(clippy::too_many_arguments)]
fn note_events(
    events: Vec<rill_client::GroupEvent>,
    t: f64,
    who: &str,
    hist: &History,
    glog: &Mutex<GroupLog>,
    open: &mut BTreeMap<u32, f64>,
    ending: &mut Vec<u32>,
    positions: &mut BTreeMap<u32, i64>,
) {
    for ev in events {
        match ev {
            rill_client::GroupEvent::Assigned(tps) => {
                hist.note(format!(
                    "group {who} assigned {:?}",
                    tps.iter().map(|tp| tp.partition).collect::<Vec<_>>()
                ));
                for tp in tps {
                    if ending.contains(&tp.partition) {
                        // Revoked, then given back before the ack.
                        end_held(glog, open, &[tp.partition], who, t, "re-assigned");
                        ending.retain(|p| *p != tp.partition);
                    }
                    if let Some(since) = open.get(&tp.partition) {
                        hist.note(format!(
                            "group {who} assigned {} again (held since {since:.3}s)",
                            tp.partition
                        ));
                    } else {
                        open.insert(tp.partition, t);
                    }
                }
            }
            rill_client::GroupEvent::Revoked(tps) => {
                hist.note(format!(
                    "group {who} revoked {:?}",
                    tps.iter().map(|tp| tp.partition).collect::<Vec<_>>()
                ));
                for tp in tps {
                    positions.remove(&tp.partition);
                    if open.contains_key(&tp.partition) && !ending.contains(&tp.partition) {
                        ending.push(tp.partition);
                    }
                }
            }
        }
    }
}

/// Workload (3): one member of the group. Joins (again after an error that
/// retrying cannot fix, or a poll that hung), polls, notes each assignment
/// change with the time of the poll that reported it, and commits what it
/// read every [`GROUP_COMMIT_EVERY`].
#[allow(clippy::too_many_arguments)]
async fn group_member(
    m: usize,
    config: ClientConfig,
    topic: String,
    group: String,
    stop: Arc<AtomicBool>,
    hist: Arc<History>,
    glog: Arc<Mutex<GroupLog>>,
    anomalies: Anomalies,
    seed: u64,
) {
    let mut incarnation = 0u32;
    let mut last_err = String::new();
    while !stop.load(Ordering::Relaxed) {
        let joined = tokio::time::timeout(Duration::from_secs(10), async {
            let c = Client::connect(config.clone()).await?;
            c.group_consumer(group_config(&group, &topic)).await
        })
        .await;
        let mut member = match joined {
            Ok(Ok(member)) => member,
            other => {
                let e = format!("{other:?}");
                if e != last_err {
                    hist.note(format!("group member {m}: join failed: {e}"));
                    last_err = e;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
        };
        incarnation += 1;
        let who = format!("member {m}.{incarnation}");
        hist.note(format!("group {who} joined"));
        // Partition -> since when held; revoked ones, held until the next call.
        let mut open: BTreeMap<u32, f64> = BTreeMap::new();
        let mut ending: Vec<u32> = Vec::new();
        // Partition -> the next offset to read (only after a record of it).
        let mut positions: BTreeMap<u32, i64> = BTreeMap::new();
        let mut flagged: std::collections::BTreeSet<u32> = std::collections::BTreeSet::new();
        let mut next_commit = Instant::now() + GROUP_COMMIT_EVERY;
        let mut rejoin = false;
        while !stop.load(Ordering::Relaxed) && !rejoin {
            if Instant::now() >= next_commit {
                next_commit = Instant::now() + GROUP_COMMIT_EVERY;
                let offsets: Vec<(TopicPartition, rill_client::Offset)> = positions
                    .iter()
                    .map(|(p, o)| (TopicPartition::new(&topic, *p), rill_client::Offset(*o)))
                    .collect();
                if !offsets.is_empty() && member.member_epoch() > 0 {
                    let sent = hist.now();
                    end_held(&glog, &mut open, &ending, &who, sent, "revoked");
                    ending.clear();
                    let r = tokio::time::timeout(
                        Duration::from_secs(20),
                        member.commit_offsets(&offsets),
                    )
                    .await;
                    let done = hist.now();
                    // A commit refused as fenced drops every partition (the
                    // client reports it as a revocation).
                    note_events(
                        member.take_events(),
                        done,
                        &who,
                        &hist,
                        &glog,
                        &mut open,
                        &mut ending,
                        &mut positions,
                    );
                    match r {
                        Ok(Ok(())) => {
                            let mut g = glog.lock().unwrap();
                            for (tp, o) in &offsets {
                                g.commits.push(CommitObs {
                                    who: who.clone(),
                                    p: tp.partition,
                                    offset: o.0,
                                    sent,
                                    done,
                                });
                            }
                            drop(g);
                            hist.note(format!(
                                "group {who} committed {}",
                                offsets
                                    .iter()
                                    .map(|(tp, o)| format!("{}@{}", tp.partition, o.0))
                                    .collect::<Vec<_>>()
                                    .join(" ")
                            ));
                        }
                        Ok(Err(e)) => {
                            hist.note(format!("group {who} commit failed: {e}"));
                        }
                        Err(_) => {
                            hist.note(format!("group {who}: commit hung 20s; rejoining"));
                            rejoin = true;
                        }
                    }
                }
            }
            let called = hist.now();
            end_held(&glog, &mut open, &ending, &who, called, "revoked");
            ending.clear();
            let got = tokio::time::timeout(
                Duration::from_secs(20),
                member.poll(Duration::from_millis(200)),
            )
            .await;
            let t = hist.now();
            note_events(
                member.take_events(),
                t,
                &who,
                &hist,
                &glog,
                &mut open,
                &mut ending,
                &mut positions,
            );
            match got {
                Ok(Ok(records)) => {
                    last_err.clear();
                    for r in records {
                        let p = r.partition;
                        // (Flagged once per partition and incarnation.)
                        if (!open.contains_key(&p) || ending.contains(&p)) && flagged.insert(p) {
                            let t = hist.note(format!(
                                "group {who} got {p}/{} but does not hold {p}",
                                r.offset.0
                            ));
                            anomalies.lock().unwrap().push(Anomaly {
                                t,
                                what: format!(
                                    "group record of an unheld partition: {who} of group {group} was given {p}/{} while not holding partition {p} (seed {seed})",
                                    r.offset.0
                                ),
                            });
                        }
                        positions.insert(p, r.offset.0 + 1);
                    }
                }
                Ok(Err(e)) => {
                    rejoin = !e.is_retriable();
                    let e = e.to_string();
                    if e != last_err {
                        hist.note(format!("group {who} poll failed: {e}"));
                        last_err = e;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(_) => {
                    hist.note(format!("group {who}: poll hung 20s; rejoining"));
                    rejoin = true;
                }
            }
        }
        // Leaving (or giving up on this incarnation): it holds nothing after.
        let t = hist.now();
        let all: Vec<u32> = open.keys().copied().collect();
        end_held(&glog, &mut open, &all, &who, t, "left");
        if stop.load(Ordering::Relaxed) {
            let _ = tokio::time::timeout(Duration::from_secs(5), member.close()).await;
        } else {
            drop(member);
        }
        hist.note(format!("group {who} left"));
    }
}

/// Workload (3): reads the group's committed offsets back every
/// [`GROUP_COMMIT_EVERY`] (OffsetFetch through the admin api).
async fn committed_reader(
    config: ClientConfig,
    topic: String,
    group: String,
    stop: Arc<AtomicBool>,
    hist: Arc<History>,
    glog: Arc<Mutex<GroupLog>>,
) {
    let mut last_err = String::new();
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(GROUP_COMMIT_EVERY).await;
        let sent = hist.now();
        let r = tokio::time::timeout(Duration::from_secs(10), async {
            let c = Client::connect(config.clone()).await?;
            c.admin().committed_offsets(&group).await
        })
        .await;
        let done = hist.now();
        match r {
            Ok(Ok(offsets)) => {
                last_err.clear();
                let mut shown: Vec<String> = offsets
                    .iter()
                    .filter(|(tp, _)| tp.topic == topic)
                    .map(|(tp, o)| format!("{}@{}", tp.partition, o.0))
                    .collect();
                shown.sort();
                hist.note(format!("committed offsets read: {}", shown.join(" ")));
                let mut g = glog.lock().unwrap();
                for (tp, o) in offsets {
                    if tp.topic == topic {
                        g.reads.push(CommitObs {
                            who: "read back".into(),
                            p: tp.partition,
                            offset: o.0,
                            sent,
                            done,
                        });
                    }
                }
            }
            other => {
                let e = format!("{other:?}");
                if e != last_err {
                    hist.note(format!("committed offsets of {group}: {e}"));
                    last_err = e;
                }
            }
        }
    }
}

/// Workload (3): no two members held a partition at once, and the group's
/// committed offset of a partition never went back (an observation that
/// began after another ended is not below it).
fn check_groups(seed: u64, group: &str, hist: &History, anomalies: &Anomalies, glog: &GroupLog) {
    let flag = |t: f64, what: String| {
        hist.note(format!("ANOMALY: {}", what.lines().next().unwrap_or("")));
        anomalies.lock().unwrap().push(Anomaly {
            t,
            what: format!("{what} (seed {seed})"),
        })
    };
    for p in 0..PARTITIONS {
        let mut held: Vec<&Held> = glog.held.iter().filter(|h| h.p == p).collect();
        held.sort_by(|a, b| a.start.total_cmp(&b.start));
        for (i, a) in held.iter().enumerate() {
            for b in &held[i + 1..] {
                if a.member != b.member && b.start < a.end {
                    flag(
                        b.start,
                        format!(
                            "group partition held twice: partition {p} of group {group} was held by {} from {:.3}s to {:.3}s ({}) and by {} from {:.3}s to {:.3}s ({}): {:.3}s together",
                            a.member,
                            a.start,
                            a.end,
                            a.how,
                            b.member,
                            b.start,
                            b.end,
                            b.how,
                            a.end.min(b.end) - b.start
                        ),
                    );
                }
            }
        }
        let obs: Vec<&CommitObs> = glog
            .commits
            .iter()
            .chain(glog.reads.iter())
            .filter(|o| o.p == p)
            .collect();
        let mut flagged = 0;
        for y in &obs {
            let before = obs
                .iter()
                .filter(|x| x.done < y.sent)
                .max_by_key(|x| x.offset);
            if let Some(x) = before
                && y.offset < x.offset
                && flagged < 5
            {
                flagged += 1;
                flag(
                    y.sent,
                    format!(
                        "committed offset went back: group {group} partition {p}: {} saw {} ({:.3}s-{:.3}s) after {} saw {} ({:.3}s-{:.3}s)",
                        y.who, y.offset, y.sent, y.done, x.who, x.offset, x.sent, x.done
                    ),
                );
            }
        }
    }
    println!(
        "  group {group}: {} holdings, {} commits acknowledged, {} committed-offset reads",
        glog.held.len(),
        glog.commits.len(),
        glog.reads.len()
    );
}

/// One topic operation of workload (4).
#[derive(Debug, Clone)]
struct MetaOp {
    topic: String,
    create: bool,
    partitions: u32,
    rf: u16,
    via: usize,
    t: f64,
    outcome: MetaOutcome,
}

#[derive(Debug, Clone, PartialEq)]
enum MetaOutcome {
    Acked,
    /// Refused with a code that says nothing was done.
    Failed(String),
    /// May or may not have happened (timed out, connection lost, ...).
    Unknown(String),
}

/// Workload (4): creates and deletes small topics (1-2 partitions, RF 2-3)
/// through a varying broker while the faults run, noting each outcome.
async fn metadata_ops(
    idx: u32,
    seed: u64,
    config: ClientConfig,
    stop: Arc<AtomicBool>,
    hist: Arc<History>,
    ops: Arc<Mutex<Vec<MetaOp>>>,
) {
    let mut rng = Rng(seed ^ 0x6d65_7461);
    let mut n = 0u32;
    // Topics created (or perhaps created) and not deleted since.
    let mut live: Vec<String> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(1500 + rng.below(1500))).await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let via = rng.below(BROKERS as u64) as usize;
        let mut one = config.clone();
        one.bootstrap = vec![config.bootstrap[via].clone()];
        let create = live.len() < 2 || rng.below(3) != 0;
        let (topic, partitions, rf) = if create {
            n += 1;
            (
                format!("md{idx}-{n}"),
                1 + rng.below(2) as u32,
                2 + rng.below(2) as u16,
            )
        } else {
            let i = rng.below(live.len() as u64) as usize;
            (live.remove(i), 0, 0)
        };
        let name = topic.clone();
        let r = tokio::time::timeout(Duration::from_secs(10), async move {
            let c = Client::connect(one).await?;
            if create {
                c.admin()
                    .create_topic(NewTopic {
                        name,
                        partitions: Some(partitions),
                        replication_factor: Some(rf),
                        configs: vec![],
                    })
                    .await
            } else {
                c.admin().delete_topic(&name).await
            }
        })
        .await;
        let outcome = match r {
            Ok(Ok(())) => MetaOutcome::Acked,
            Ok(Err(e)) => match e.code() {
                Some(
                    code @ (rill_proto::wire::ErrorCode::NotController
                    | rill_proto::wire::ErrorCode::InvalidReplicationFactor
                    | rill_proto::wire::ErrorCode::InvalidPartitions
                    | rill_proto::wire::ErrorCode::TopicAlreadyExists
                    | rill_proto::wire::ErrorCode::UnknownTopicOrPartition),
                ) => MetaOutcome::Failed(format!("{code:?}: {e}")),
                _ => MetaOutcome::Unknown(e.to_string()),
            },
            Err(_) => MetaOutcome::Unknown("timed out after 10s".into()),
        };
        // Each topic is deleted at most once: a create that may have happened
        // is a candidate, a delete whatever its outcome ends the topic's story.
        if create && !matches!(outcome, MetaOutcome::Failed(_)) {
            live.push(topic.clone());
        }
        let t = hist.note(format!(
            "metadata: {} {topic}{} via broker {via}: {outcome:?}",
            if create { "create" } else { "delete" },
            if create {
                format!(" ({partitions} partitions, RF {rf})")
            } else {
                String::new()
            }
        ));
        ops.lock().unwrap().push(MetaOp {
            topic,
            create,
            partitions,
            rf,
            via,
            t,
            outcome,
        });
    }
}

/// One broker's own view of a topic: per partition (leader, epoch, replicas).
type TopicView = Vec<(u32, Option<i32>, i32, Vec<i32>)>;

/// Every topic as broker `b` itself tells it (Metadata sent to it alone).
fn broker_view(
    rt: &tokio::runtime::Runtime,
    config: &ClientConfig,
    cluster: &NetCluster,
    b: usize,
) -> Result<BTreeMap<String, TopicView>, String> {
    let mut one = config.clone();
    one.bootstrap = vec![config.bootstrap[b].clone()];
    let id = cluster.brokers[b].id;
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), async {
            let c = Client::connect(one).await.map_err(|e| e.to_string())?;
            let (md, _) = c
                .call(
                    Some(id),
                    &rill_proto::wire::MetadataRequest { topics: None },
                    &[],
                )
                .await
                .map_err(|e| e.to_string())?;
            Ok(md
                .topics
                .into_iter()
                .map(|t| {
                    let mut parts: TopicView = t
                        .partitions
                        .into_iter()
                        .map(|p| {
                            let mut replicas = p.replicas;
                            replicas.sort();
                            (p.partition, p.leader, p.leader_epoch.0, replicas)
                        })
                        .collect();
                    parts.sort();
                    (t.name, parts)
                })
                .collect())
        })
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
    })
}

/// The partition directories in broker `b`'s data dir (`<topic>-<p>`, and
/// `<topic>-<p>.deleted` leftovers as they are).
fn partition_dirs(cluster: &NetCluster, b: usize) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(cluster.data_dir(b))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    let base = n.strip_suffix(".deleted").unwrap_or(n);
                    base.rsplit_once('-')
                        .is_some_and(|(t, p)| !t.is_empty() && p.parse::<u32>().is_ok())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What is wrong with the cluster's metadata now, for workload (4): the
/// brokers' own views differ, a view contradicts an acknowledged operation,
/// or a data dir's partition directories are not what its view assigns it.
fn metadata_problems(
    rt: &tokio::runtime::Runtime,
    config: &ClientConfig,
    cluster: &NetCluster,
    ops: &[MetaOp],
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut views = Vec::new();
    for b in 0..BROKERS {
        match broker_view(rt, config, cluster, b) {
            Ok(v) => views.push(v),
            Err(e) => {
                problems.push(format!("broker {b}: metadata: {e}"));
                return problems;
            }
        }
    }
    for b in 1..BROKERS {
        let names: std::collections::BTreeSet<&String> =
            views[0].keys().chain(views[b].keys()).collect();
        for n in names {
            if views[0].get(n) != views[b].get(n) {
                problems.push(format!(
                    "brokers 0 and {b} disagree on topic {n} (partition, leader, epoch, replicas): {:?} vs {:?}",
                    views[0].get(n),
                    views[b].get(n)
                ));
            }
        }
    }
    // Against the operations: the last one on each topic decides.
    let mut last: BTreeMap<&str, (&MetaOp, Option<&MetaOp>)> = BTreeMap::new();
    for op in ops {
        if op.create {
            last.insert(&op.topic, (op, None));
        } else if let Some(e) = last.get_mut(op.topic.as_str()) {
            e.1 = Some(op);
        }
    }
    for (topic, (create, delete)) in &last {
        for (b, view) in views.iter().enumerate() {
            let shown = view.get(*topic);
            let must_exist = create.outcome == MetaOutcome::Acked
                && delete.is_none_or(|d| {
                    matches!(&d.outcome, MetaOutcome::Failed(e) if !e.starts_with("UnknownTopicOrPartition"))
                });
            // A delete refused because the topic is unknown: it is gone.
            let must_not = matches!(create.outcome, MetaOutcome::Failed(_))
                || delete.is_some_and(|d| {
                    d.outcome == MetaOutcome::Acked
                        || matches!(&d.outcome, MetaOutcome::Failed(e) if e.starts_with("UnknownTopicOrPartition"))
                });
            match shown {
                None if must_exist => problems.push(format!(
                    "broker {b} does not list {topic}, whose create was acknowledged at {:.3}s{}",
                    create.t,
                    delete.map_or(String::new(), |d| format!(
                        " (its delete at {:.3}s: {:?})",
                        d.t, d.outcome
                    ))
                )),
                Some(parts) if must_not => problems.push(format!(
                    "broker {b} lists {topic} ({parts:?}), whose {} at {:.3}s said {:?}",
                    if delete.is_some() { "delete" } else { "create" },
                    delete.map_or(create.t, |d| d.t),
                    delete.map_or(&create.outcome, |d| &d.outcome)
                )),
                Some(parts)
                    if parts.len() != create.partitions as usize
                        || parts.iter().any(|p| p.3.len() != create.rf as usize) =>
                {
                    problems.push(format!(
                        "broker {b} lists {topic} as {parts:?}, created with {} partitions, RF {}",
                        create.partitions, create.rf
                    ))
                }
                _ => {}
            }
        }
    }
    // The data dirs follow the views. A broker keeps a log for each partition
    // it is a replica of (core/broker/src/cluster/reconcile.rs) and nothing
    // else: so a directory per partition of the view that names this broker
    // a replica, and none of a topic not in the view (internal `__` topics
    // the test's principal may not describe are not in it: left out).
    for (b, view) in views.iter().enumerate() {
        let id = cluster.brokers[b].id;
        let want: std::collections::BTreeSet<String> = view
            .iter()
            .flat_map(|(t, parts)| {
                parts
                    .iter()
                    .filter(|p| p.3.contains(&id))
                    .map(move |p| format!("{t}-{}", p.0))
            })
            .collect();
        let have = partition_dirs(cluster, b);
        let extra: Vec<&String> = have
            .difference(&want)
            .filter(|d| {
                let base = d.strip_suffix(".deleted").unwrap_or(d);
                !base.starts_with("__") || d.ends_with(".deleted")
            })
            .collect();
        let missing: Vec<&String> = want.difference(&have).collect();
        if !extra.is_empty() || !missing.is_empty() {
            problems.push(format!(
                "broker {b}'s data dir: partition directories of no topic it lists: {extra:?}; of partitions it lists, missing: {missing:?}"
            ));
        }
    }
    problems
}

/// Workload (4), after the faults: waits (up to [`METADATA_SETTLE`]) for
/// [`metadata_problems`] to be empty; flags what is left.
fn check_metadata(
    seed: u64,
    rt: &tokio::runtime::Runtime,
    config: &ClientConfig,
    cluster: &NetCluster,
    hist: &History,
    anomalies: &Anomalies,
    ops: &[MetaOp],
) {
    let began = Instant::now();
    let mut first = None;
    let problems = loop {
        let problems = metadata_problems(rt, config, cluster, ops);
        if problems.is_empty() || began.elapsed() > METADATA_SETTLE {
            break problems;
        }
        first.get_or_insert_with(|| problems.clone());
        std::thread::sleep(Duration::from_millis(500));
    };
    let count = |f: fn(&MetaOutcome) -> bool| ops.iter().filter(|o| f(&o.outcome)).count();
    println!(
        "  metadata: {} operations ({} acknowledged, {} refused, {} indeterminate); settled in {:.1}s{}",
        ops.len(),
        count(|o| *o == MetaOutcome::Acked),
        count(|o| matches!(o, MetaOutcome::Failed(_))),
        count(|o| matches!(o, MetaOutcome::Unknown(_))),
        began.elapsed().as_secs_f64(),
        first.map_or(String::new(), |f| format!(
            " (first: {})",
            f.join("; ").chars().take(300).collect::<String>()
        ))
    );
    for p in problems {
        // The operations on the topics it names, and the history around the
        // last of them.
        let named: Vec<&MetaOp> = ops
            .iter()
            .filter(|o| {
                p.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                    .any(|w| {
                        w == o.topic
                            || w.strip_prefix(o.topic.as_str())
                                .and_then(|r| r.strip_prefix('-'))
                                .is_some_and(|r| r.parse::<u32>().is_ok())
                    })
            })
            .collect();
        let t = named.last().map_or_else(|| hist.now(), |o| o.t);
        hist.note(format!("ANOMALY: metadata: {p}"));
        anomalies.lock().unwrap().push(Anomaly {
            t,
            what: format!(
                "metadata not settled {METADATA_SETTLE:?} after the last heal: {p}; operations on it: {} (seed {seed})",
                named
                    .iter()
                    .map(|o| format!(
                        "{:.3}s {} via broker {}: {:?}",
                        o.t,
                        if o.create { "create" } else { "delete" },
                        o.via,
                        o.outcome
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        });
    }
}

/// A partition leader cut off from the other brokers (so from the controller)
/// fences itself after the broker session timeout (issue 21): it answers
/// ListOffsets for its partition NOT_LEADER_OR_FOLLOWER and names no leader
/// for it in Metadata, so a consumer that bootstrapped from it alone moves to
/// the new leader and reads what was written there during the cut. Healed, it
/// is in contact again and every broker agrees on the leaders.
#[test]
fn a_cut_off_leader_fences_itself() {
    let _turn = ONE_LAB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if skip_unless_supported("a_cut_off_leader_fences_itself") {
        return;
    }
    let lab = NetLab::new(BROKERS).unwrap_or_else(|e| panic!("cannot build the network: {e}"));
    let client_ns = lab.client().ns.clone();
    NetLab::run_in(&client_ns, move || {
        let mut lab = lab;
        let (cluster, rt, config) = live_cluster(&lab);
        let topic = "fence".to_string();
        let t = topic.clone();
        admin(&rt, &config, async move |a| {
            a.create_topic(NewTopic {
                name: t,
                partitions: Some(PARTITIONS),
                replication_factor: Some(BROKERS as u16),
                configs: vec![("min.insync.replicas".into(), "2".into())],
            })
            .await
        })
        .expect("create the topic");
        wait_healed(&rt, &config, &topic).expect("full ISRs");
        let leader = describe(&rt, &config, &topic).unwrap()[0]
            .leader
            .expect("partition 0 has a leader");
        let others: Vec<usize> = (0..BROKERS).filter(|&b| b != leader as usize).collect();
        let mut via_others = config.clone();
        via_others.bootstrap = others
            .iter()
            .map(|&b| cluster.brokers[b].addr.to_string())
            .collect();
        let mut via_leader = config.clone();
        via_leader.bootstrap = vec![cluster.brokers[leader as usize].addr.to_string()];

        let produce = |config: &ClientConfig, from: u32, to: u32| {
            let (config, topic) = (config.clone(), topic.clone());
            rt.block_on(async move {
                let deadline = Instant::now() + Duration::from_secs(30);
                let client = Client::connect(config).await.unwrap();
                let producer = client.producer(ProducerConfig::default()).unwrap();
                for n in from..to {
                    let record = ProducerRecord::new(topic.clone(), format!("r{n}").into_bytes())
                        .partition(0);
                    loop {
                        match producer.send_and_wait(record.clone()).await {
                            Ok(_) => break,
                            Err(e) if Instant::now() < deadline => {
                                println!("produce r{n}: {e}; retrying");
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                            Err(e) => panic!("produce r{n}: {e}"),
                        }
                    }
                }
            })
        };
        produce(&config, 0, 10);

        // A consumer that knows only the leader's address reads the first ten.
        let client = rt.block_on(Client::connect(via_leader)).unwrap();
        let mut consumer = client.consumer(ConsumerConfig::default()).unwrap();
        let tp = TopicPartition::new(&topic, 0);
        consumer.assign(vec![tp.clone()]);
        let _ = consumer.seek(&tp, rill_client::Offset(0));
        let mut read = Vec::new();
        let mut read_until = |n: usize, within: Duration| {
            let deadline = Instant::now() + within;
            while read.len() < n && Instant::now() < deadline {
                let got = rt
                    .block_on(consumer.poll(Duration::from_millis(200)))
                    .unwrap_or_default();
                read.extend(
                    got.into_iter()
                        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap()).into_owned()),
                );
            }
            read.clone()
        };
        assert_eq!(read_until(10, Duration::from_secs(20)).len(), 10);

        // Cut the leader from the other brokers; the client still reaches it.
        let log_before_cut =
            std::fs::metadata(cluster.log_path(leader as usize)).map_or(0, |m| m.len() as usize);
        lab.cut(leader as usize, &others);
        lab.apply().unwrap();
        let cut_at = Instant::now();
        produce(&via_others, 10, 20);

        // The cut-off broker, asked directly, no longer acts as the leader.
        let fenced = rt.block_on(async {
            let req = rill_proto::wire::ListOffsetsRequest {
                partitions: vec![rill_proto::wire::ListOffsetsPartition {
                    topic: topic.clone(),
                    partition: 0,
                    spec: OffsetSpec::Latest,
                }],
            };
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let (resp, _) = client.call(Some(leader), &req, &[]).await.unwrap();
                let error = resp.partitions[0].error.clone();
                if error.is_some() || Instant::now() > deadline {
                    break error;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let fenced = fenced.unwrap_or_else(|| {
            panic!(
                "broker {leader}, cut off for {:?}, still answers ListOffsets as the leader:\n{}",
                cut_at.elapsed(),
                cluster.log_tail(leader as usize, 40)
            )
        });
        assert_eq!(
            fenced.code,
            rill_proto::wire::ErrorCode::NotLeaderOrFollower
        );
        assert!(
            fenced
                .message
                .contains("has not reached the cluster's controller"),
            "{fenced:?}"
        );
        let (md, _) = rt
            .block_on(client.call(
                Some(leader),
                &rill_proto::wire::MetadataRequest {
                    topics: Some(vec![topic.clone()]),
                },
                &[],
            ))
            .unwrap();
        let p0 = &md.topics[0].partitions[0];
        assert_eq!(p0.leader, None, "{p0:?}");
        assert_eq!(
            p0.error.as_ref().map(|e| e.code),
            Some(rill_proto::wire::ErrorCode::BrokerNotAvailable),
            "{p0:?}"
        );

        // The consumer moved to the new leader and read what was written there.
        let got = read_until(20, Duration::from_secs(30));
        let want: Vec<String> = (0..20).map(|n| format!("r{n}")).collect();
        assert_eq!(
            got, want,
            "read through a consumer bootstrapped from the cut-off leader"
        );

        lab.heal();
        wait_healed(&rt, &config, &topic).expect("every broker agrees after the heal");
        // What it logged since the cut: the fence, then (once the controller
        // has unfenced it and its image says so, which can come a little after
        // it is back in the ISRs) the lift.
        let deadline = Instant::now() + Duration::from_secs(15);
        let log = loop {
            let log = std::fs::read(cluster.log_path(leader as usize)).unwrap();
            let log = String::from_utf8_lossy(&log[log_before_cut.min(log.len())..]).into_owned();
            let fenced_at = log.find("it fences itself");
            let lifted_at = log.find("no longer fenced");
            if fenced_at.is_some() && lifted_at > fenced_at {
                break None;
            }
            if Instant::now() > deadline {
                break Some(log);
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        if let Some(log) = log {
            panic!(
                "broker {leader} did not log its fence and then its lift; its log since the cut:\n{log}"
            );
        }
        drop(consumer);
        drop(client);
        drop(rt);
        drop(cluster);
        drop(lab);
    });
}

/// A broker whose metadata is behind the quorum's (here: cut off from the
/// other brokers while a topic is created through them) does not answer a
/// delete of that topic UNKNOWN_TOPIC_OR_PARTITION from its own image: the
/// quorum decides (issue 21; workload 4 saw "topic does not exist" for a
/// topic that was there, and stayed there, in two soak schedules). Healed,
/// the delete through that broker succeeds.
#[test]
fn a_broker_behind_the_quorum_does_not_call_a_topic_unknown() {
    let _turn = ONE_LAB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if skip_unless_supported("a_broker_behind_the_quorum_does_not_call_a_topic_unknown") {
        return;
    }
    let lab = NetLab::new(BROKERS).unwrap_or_else(|e| panic!("cannot build the network: {e}"));
    let client_ns = lab.client().ns.clone();
    NetLab::run_in(&client_ns, move || {
        let mut lab = lab;
        let (cluster, rt, config) = live_cluster(&lab);
        let controller = admin(&rt, &config, async |a| a.cluster().await)
            .expect("cluster info")
            .controller_id
            .expect("a controller");
        // A broker that is not the controller, cut from the other two.
        let behind = (0..BROKERS as i32).find(|&b| b != controller).unwrap() as usize;
        let others: Vec<usize> = (0..BROKERS).filter(|&b| b != behind).collect();
        let mut via_others = config.clone();
        via_others.bootstrap = others
            .iter()
            .map(|&b| config.bootstrap[b].clone())
            .collect();
        let mut via_behind = config.clone();
        via_behind.bootstrap = vec![config.bootstrap[behind].clone()];
        lab.cut(behind, &others);
        lab.apply().unwrap();

        // The topic, created through the others (RF 2: the cut broker may
        // count as alive for a moment).
        let created = {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let r = admin(&rt, &via_others, async |a| {
                    a.create_topic(NewTopic {
                        name: "late".into(),
                        partitions: Some(1),
                        replication_factor: Some(2),
                        configs: vec![],
                    })
                    .await
                });
                match r {
                    Ok(()) => break Ok(()),
                    Err(e) if Instant::now() > deadline => break Err(e),
                    Err(_) => std::thread::sleep(Duration::from_millis(300)),
                }
            }
        };
        created.expect("create the topic through the connected brokers");

        // The cut-off broker, asked to delete it.
        let id = cluster.brokers[behind].id;
        let answer = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), async {
                let c = Client::connect(via_behind.clone()).await?;
                let req = rill_proto::wire::DeleteTopicsRequest {
                    names: vec!["late".into()],
                };
                c.call(Some(id), &req, &[]).await.map(|(r, _)| r)
            })
            .await
        });
        println!("delete through cut-off broker {behind}: {answer:?}");
        let unknown = matches!(&answer, Ok(Ok(r)) if r.results.iter().any(|t| {
            t.error
                .as_ref()
                .is_some_and(|e| e.code == rill_proto::wire::ErrorCode::UnknownTopicOrPartition)
        }));
        assert!(
            !unknown,
            "broker {behind}, cut off, called topic late unknown although the quorum has it: {answer:?}"
        );
        let deleted = matches!(&answer, Ok(Ok(r)) if r.results.iter().all(|t| t.error.is_none()));

        lab.heal();
        wait_live(&rt, &config, &cluster);
        // Still there unless that delete went through; then deleted through
        // the broker that was cut off.
        let listed = admin(&rt, &config, async |a| a.list_topics().await).expect("list topics");
        assert_eq!(
            listed.iter().any(|t| t == "late"),
            !deleted,
            "after the heal: {listed:?} (delete answer {answer:?})"
        );
        if !deleted {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let r = admin(&rt, &via_behind, async |a| a.delete_topic("late").await);
                let gone = || {
                    admin(&rt, &config, async |a| a.list_topics().await)
                        .is_ok_and(|l| !l.iter().any(|t| t == "late"))
                };
                match r {
                    Ok(()) => break,
                    // (An earlier attempt that timed out may have deleted it.)
                    Err(_) if gone() => break,
                    Err(e) if Instant::now() > deadline => {
                        panic!("delete through broker {behind} after the heal: {e}")
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(300)),
                }
            }
        }

        // The other way round: a topic the cut-off broker still lists, deleted
        // through the others, then created through it: not "already exists"
        // from its stale image (the quorum decides).
        let listed_by_behind = |name: &str| {
            admin(&rt, &via_behind, async |a| a.list_topics().await)
                .is_ok_and(|l| l.iter().any(|t| t == name))
        };
        admin(&rt, &config, async |a| {
            a.create_topic(NewTopic {
                name: "again".into(),
                partitions: Some(1),
                replication_factor: Some(2),
                configs: vec![],
            })
            .await
        })
        .expect("create again");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !listed_by_behind("again") {
            assert!(
                Instant::now() < deadline,
                "broker {behind} never listed again"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        lab.cut(behind, &others);
        lab.apply().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(e) = admin(&rt, &via_others, async |a| a.delete_topic("again").await) {
            let gone = admin(&rt, &via_others, async |a| a.list_topics().await)
                .is_ok_and(|l| !l.iter().any(|t| t == "again"));
            if gone {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "delete again through the others: {e}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        // (Its image still has the topic; asked now, a fenced broker may not
        // answer the listing, so this is only printed.)
        println!(
            "cut-off broker {behind} lists again after the delete: {}",
            listed_by_behind("again")
        );
        let answer = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), async {
                let c = Client::connect(via_behind.clone()).await?;
                let req = rill_proto::wire::CreateTopicsRequest {
                    topics: vec![NewTopic {
                        name: "again".into(),
                        partitions: Some(1),
                        replication_factor: Some(1),
                        configs: vec![],
                    }],
                    validate_only: false,
                };
                c.call(Some(id), &req, &[]).await.map(|(r, _)| r)
            })
            .await
        });
        println!("create through cut-off broker {behind}: {answer:?}");
        let exists = matches!(&answer, Ok(Ok(r)) if r.results.iter().any(|t| {
            t.error
                .as_ref()
                .is_some_and(|e| e.code == rill_proto::wire::ErrorCode::TopicAlreadyExists)
        }));
        assert!(
            !exists,
            "broker {behind}, cut off, called topic again existing although the quorum deleted it: {answer:?}"
        );
        lab.heal();
        wait_live(&rt, &config, &cluster);
        drop(rt);
        drop(cluster);
        drop(lab);
    });
}
