//! A bounded fault test in the spirit of Jepsen's Kafka workload: producers with
//! acks=all write unique values to several partitions (replication factor 3,
//! min.insync.replicas=2) while brokers are SIGKILLed and restarted, or paused
//! with SIGSTOP and resumed, at random. Afterwards every partition is read from
//! the beginning and the test checks that every acknowledged value is there, that
//! no value appears twice, that each partition's order is the producer's, and that
//! all replicas of a partition hold identical logs.
//!
//! The seed is printed; rerun one with `RILL_FAULT_SEED=<seed>`. The CI run lasts
//! `RILL_FAULT_SECS` (default 25) seconds of faults; set it higher for a soak.

mod support;

use rill_client::{
    Client, ClientConfig, ConsumerConfig, ProducerConfig, ProducerRecord, TopicPartition,
};
use rill_proto::Offset;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::Rng;
use support::cluster::TestCluster;

const TOPIC: &str = "jepsen";
const PARTITIONS: u32 = 3;

/// Every partition of the topic has all three replicas in its ISR.
fn full_isrs(describe: &str) -> bool {
    let isrs: Vec<&str> = describe
        .lines()
        .filter_map(|l| l.split("Isr:").nth(1))
        .collect();
    isrs.len() == PARTITIONS as usize && isrs.iter().all(|isr| isr.trim().split(',').count() == 3)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn acknowledged_writes_survive_kills_and_pauses() {
    let seed = Rng::seed_from_env();
    let fault_secs = env_u64("RILL_FAULT_SECS").unwrap_or(25);
    println!(
        "fault test seed: {seed} (RILL_FAULT_SEED={seed} replays it), {fault_secs}s of faults"
    );
    let mut rng = Rng(seed);

    let mut c = TestCluster::start_joined(3, &[]);

    c.wait_all_live();
    c.rill_ok(
        &[
            "topic",
            "create",
            TOPIC,
            "--partitions",
            &PARTITIONS.to_string(),
            "--replication-factor",
            "3",
            "--config",
            "min.insync.replicas=2",
            "--config",
            "replica.lag.time.max.ms=3000",
            "--config",
            "segment.bytes=65536",
        ],
        b"",
    );
    c.wait_for("full ISRs", &["topic", "describe", TOPIC], full_isrs);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut config = ClientConfig::new(c.bootstrap());
    config.tls = rill_net::ClientTls::Dev { home: c.home() };
    let stop = Arc::new(AtomicBool::new(false));
    // Producers: one per partition, one record at a time, each a long-lived
    // producer with the defaults a user gets: idempotent, retrying until its
    // delivery timeout. A retry after a timeout or a leader change resends a
    // batch the old leader may have written and replicated, so a value twice in
    // the log would mean idempotence failed.
    let producers = {
        let stop = stop.clone();
        let config = config.clone();
        rt.spawn(async move {
            let mut tasks = Vec::new();
            for p in 0..PARTITIONS {
                let stop = stop.clone();
                let config = config.clone();
                tasks.push(tokio::spawn(async move {
                    let mut acked: Vec<(u64, Offset)> = Vec::new();
                    let mut n = 0u64;
                    let mut producer = None;
                    while !stop.load(Ordering::Relaxed) {
                        if producer.is_none() {
                            match Client::connect(config.clone()).await {
                                Ok(c) => {
                                    producer = Some(
                                        c.producer(ProducerConfig {
                                            linger: Duration::ZERO,
                                            delivery_timeout: Duration::from_secs(8),
                                            ..ProducerConfig::default()
                                        })
                                        .unwrap(),
                                    )
                                }
                                Err(_) => {
                                    tokio::time::sleep(Duration::from_millis(200)).await;
                                    continue;
                                }
                            }
                        }
                        let producer = producer.as_ref().unwrap();
                        let value = format!("p{p}-{n:08}");
                        n += 1;
                        match producer
                            .send_and_wait(
                                ProducerRecord::new(TOPIC, value.into_bytes()).partition(p),
                            )
                            .await
                        {
                            Ok(md) => acked.push((n - 1, md.offset)),
                            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                        }
                    }
                    (p, acked, n)
                }));
            }
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        })
    };

    // Faults: one at a time, a random broker killed (then restarted) or paused
    // (then resumed).
    let deadline = Instant::now() + Duration::from_secs(fault_secs);
    let mut faults = 0;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1000 + rng.below(1500)));
        let victim = rng.below(3) as usize;
        let kill = rng.below(2) == 0;
        let down = Duration::from_millis(1000 + rng.below(2500));
        if kill {
            println!("fault {faults}: SIGKILL broker {victim} for {down:?}");
            c.kill(victim);
            std::thread::sleep(down);
            c.spawn(victim);
        } else {
            println!("fault {faults}: SIGSTOP broker {victim} for {down:?}");
            c.signal(victim, libc::SIGSTOP);
            std::thread::sleep(down);
            c.signal(victim, libc::SIGCONT);
        }
        faults += 1;
    }
    // Let the cluster heal while writes continue, then stop writing.
    c.wait_for(
        "full ISRs after the faults",
        &["topic", "describe", TOPIC],
        full_isrs,
    );
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let results = rt.block_on(producers).unwrap();

    // Read every partition from the beginning.
    let read = rt.block_on(async {
        let client = Client::connect(config.clone()).await.unwrap();
        let mut out = BTreeMap::new();
        for p in 0..PARTITIONS {
            let mut consumer = client.consumer(ConsumerConfig::default()).unwrap();
            let tp = TopicPartition {
                topic: TOPIC.to_string(),
                partition: p,
            };
            consumer.assign(vec![tp.clone()]);
            consumer.seek_to_beginning(&[tp.clone()]).await.unwrap();
            let mut values: Vec<(Offset, String)> = Vec::new();
            // Read until three quiet seconds in a row (no more writes are coming).
            let give_up = Instant::now() + Duration::from_secs(60);
            let mut quiet_since = Instant::now();
            while quiet_since.elapsed() < Duration::from_secs(3) && Instant::now() < give_up {
                let got = consumer
                    .poll(Duration::from_millis(500))
                    .await
                    .unwrap_or_default();
                if !got.is_empty() {
                    quiet_since = Instant::now();
                }
                for r in got {
                    values.push((
                        r.offset,
                        String::from_utf8(r.value.unwrap().to_vec()).unwrap(),
                    ));
                }
            }
            out.insert(p, values);
        }
        out
    });

    let mut total_acked = 0;
    for (p, acked, attempted) in &results {
        let values = &read[p];
        let mut seen: HashMap<&str, Offset> = HashMap::new();
        for (o, v) in values {
            assert!(
                seen.insert(v.as_str(), *o).is_none(),
                "partition {p}: value {v} appears twice (seed {seed})"
            );
            assert!(
                v.starts_with(&format!("p{p}-")),
                "partition {p}: foreign value {v}"
            );
        }
        // The producer's order: values (by sequence number) increase with offsets.
        let seqs: Vec<u64> = values
            .iter()
            .map(|(_, v)| v[v.find('-').unwrap() + 1..].parse().unwrap())
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "partition {p}: order differs from the producer's (seed {seed})"
        );
        for (n, offset) in acked {
            let v = format!("p{p}-{n:08}");
            assert_eq!(
                seen.get(v.as_str()),
                Some(offset),
                "partition {p}: acknowledged value {v} at offset {offset} is missing or moved (seed {seed})"
            );
        }
        println!(
            "partition {p}: {} attempted, {} acknowledged, {} in the log",
            attempted,
            acked.len(),
            values.len()
        );
        total_acked += acked.len();
    }
    assert!(
        total_acked > 0,
        "no write was acknowledged at all (seed {seed})"
    );

    // Every replica of a partition holds the same bytes.
    for p in 0..PARTITIONS {
        let dump = |i: usize| -> Vec<u8> {
            let dir = c.data_dir(i).join(format!("{TOPIC}-{p}"));
            let mut logs: Vec<_> = std::fs::read_dir(&dir)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "log"))
                        .collect()
                })
                .unwrap_or_default();
            logs.sort();
            logs.iter()
                .flat_map(|l| std::fs::read(l).unwrap())
                .collect()
        };
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            let dumps: Vec<Vec<u8>> = (0..3).map(dump).collect();
            if dumps.windows(2).all(|w| w[0] == w[1]) {
                break;
            }
            assert!(
                Instant::now() < give_up,
                "partition {p}: replicas differ: sizes {:?} (seed {seed})",
                dumps.iter().map(Vec::len).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
