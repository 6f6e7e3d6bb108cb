//! The Kafka quickstart's cluster walk-through on real processes: three brokers
//! (the second and third `--join` the first), a topic with replication factor 3,
//! a SIGKILLed leader, a new leader from the ISR, no acknowledged message lost,
//! and the killed broker rejoining the ISR after a restart.

mod support;

use support::cluster::{TestCluster, partition0};

const TOPIC: &str = "my-replicated-topic";

#[test]
fn quickstart_three_brokers_survive_the_leader_being_killed() {
    let mut c = TestCluster::start_joined(3, &[]);
    c.wait_for("three live brokers", &["cluster", "info"], |out| {
        out.lines().filter(|l| l.contains(" yes")).count() == 3
    });

    c.rill_ok(
        &[
            "topic",
            "create",
            TOPIC,
            "--partitions",
            "1",
            "--replication-factor",
            "3",
        ],
        b"",
    );
    let describe = c.wait_for(
        "three replicas in the ISR",
        &["topic", "describe", TOPIC],
        |out| {
            partition0(out)
                .is_some_and(|(l, r, isr)| l.is_some() && r == [0, 1, 2] && isr == [0, 1, 2])
        },
    );
    assert!(describe.contains("ReplicationFactor:3"), "{describe}");

    // Replication factor above the live brokers is a clear error.
    let out = c.rill(
        &["topic", "create", "too-wide", "--replication-factor", "4"],
        b"",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("replication factor 4"),
        "{stderr}"
    );

    c.rill_ok(
        &["produce", TOPIC],
        b"This is my first event\nThis is my second event\n",
    );

    let (leader, _, _) = partition0(&describe).unwrap();
    let leader = leader.unwrap() as usize;
    c.kill(leader);

    let after = c.wait_for(
        "a new leader without the killed broker",
        &["topic", "describe", TOPIC],
        |out| {
            partition0(out).is_some_and(|(l, _, isr)| {
                l.is_some_and(|l| l as usize != leader)
                    && !isr.contains(&(leader as i32))
                    && isr.len() == 2
            })
        },
    );
    let info = c.rill_ok(&["cluster", "info"], b"");
    assert!(
        info.lines()
            .any(|l| l.starts_with(&leader.to_string()) && l.contains(" no")),
        "the killed broker shows as not alive: {info}\n{after}"
    );

    let consumed = c.rill_ok(
        &[
            "consume",
            TOPIC,
            "--from-beginning",
            "--max-messages",
            "2",
            "--timeout-ms",
            "20000",
        ],
        b"",
    );
    assert_eq!(
        consumed,
        "This is my first event\nThis is my second event\n"
    );

    // The killed broker comes back, catches up and rejoins the ISR.
    c.spawn(leader);
    c.wait_for(
        "the restarted broker back in the ISR",
        &["topic", "describe", TOPIC],
        |out| partition0(out).is_some_and(|(_, _, isr)| isr == [0, 1, 2]),
    );
    // Writes still work with acks=all and every replica in the ISR.
    c.rill_ok(&["produce", TOPIC], b"third\n");
    let consumed = c.rill_ok(
        &[
            "consume",
            TOPIC,
            "--from-beginning",
            "--max-messages",
            "3",
            "--timeout-ms",
            "20000",
        ],
        b"",
    );
    assert_eq!(
        consumed,
        "This is my first event\nThis is my second event\nthird\n"
    );
}

/// Benchmark, not a check (run with `--ignored --nocapture`): the time from
/// SIGKILL of a partition's leader to the first acknowledged acks=all write on
/// that partition, over `RILL_FAILOVER_RUNS` (default 5) runs; prints median and max.
#[test]
#[ignore]
fn bench_failover_time() {
    use rill_client::{Client, ClientConfig, ProducerConfig, ProducerRecord};
    use std::time::{Duration, Instant};
    let runs: usize = std::env::var("RILL_FAILOVER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let mut c = TestCluster::start_joined(3, &[]);
    c.wait_for("three live brokers", &["cluster", "info"], |out| {
        out.lines().filter(|l| l.contains(" yes")).count() == 3
    });
    c.rill_ok(
        &[
            "topic",
            "create",
            "failover",
            "--replication-factor",
            "3",
            "--config",
            "min.insync.replicas=2",
        ],
        b"",
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut config = ClientConfig::new(c.bootstrap());
    config.tls = rill_net::ClientTls::Dev { home: c.home() };
    let mut times = Vec::new();
    for run in 0..runs {
        let describe = c.wait_for("full ISR", &["topic", "describe", "failover"], |out| {
            partition0(out).is_some_and(|(l, _, isr)| l.is_some() && isr.len() == 3)
        });
        let leader = partition0(&describe).unwrap().0.unwrap() as usize;
        let elapsed = rt.block_on(async {
            let client = Client::connect(config.clone()).await.unwrap();
            let producer = client
                .producer(ProducerConfig {
                    linger: Duration::ZERO,
                    retry_backoff: Duration::from_millis(20),
                    ..ProducerConfig::default()
                })
                .unwrap();
            producer
                .send_and_wait(ProducerRecord::new("failover", "warm-up").partition(0))
                .await
                .unwrap();
            c.kill(leader);
            let killed = Instant::now();
            producer
                .send_and_wait(ProducerRecord::new("failover", format!("after-{run}")).partition(0))
                .await
                .unwrap();
            killed.elapsed()
        });
        println!("run {run}: leader {leader} killed, first acks=all write after {elapsed:?}");
        times.push(elapsed);
        c.spawn(leader);
    }
    times.sort();
    println!(
        "failover over {runs} runs: median {:?}, max {:?}",
        times[times.len() / 2],
        times[times.len() - 1]
    );
}
