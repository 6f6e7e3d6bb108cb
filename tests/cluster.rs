//! The Kafka quickstart's cluster walk-through on real processes: three brokers
//! (the second and third `--join` the first), a topic with replication factor 3,
//! a SIGKILLed leader, a new leader from the ISR, no acknowledged message lost,
//! and the killed broker rejoining the ISR after a restart.

mod support;

use std::collections::BTreeMap;
use std::process::Stdio;

use support::cluster::{TestCluster, partition_n, partition0};
use support::{CommitWatcher, collect_lines_on_thread, rill_command};

const TOPIC: &str = "my-replicated-topic";

#[test]
fn quickstart_three_brokers_survive_the_leader_being_killed() {
    let mut c = TestCluster::start_joined(3, &[]);
    c.wait_all_live();

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
    c.wait_all_live();
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

/// `rill group describe` parsed: the coordinator and, per partition, the
/// committed offset.
fn group_describe(out: &str) -> (i32, BTreeMap<u32, i64>) {
    let coordinator = out
        .lines()
        .next()
        .and_then(|l| l.split("Coordinator: ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no coordinator in {out:?}"));
    let mut committed = BTreeMap::new();
    for line in out.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() == 7
            && cols[1] == "events"
            && let (Ok(p), Ok(c)) = (cols[2].parse(), cols[3].parse())
        {
            committed.insert(p, c);
        }
    }
    (coordinator, committed)
}

/// Consumer groups on a cluster: `__consumer_offsets` is a replicated topic of
/// the quorum, and when the group's coordinator is SIGKILLed the leader of its
/// `__consumer_offsets` partition moves, the new coordinator loads the group's
/// committed offsets, and a member that stays up keeps consuming and committing
/// (no committed offset ever goes backwards, no record is skipped).
#[test]
fn group_offsets_survive_the_coordinator_being_killed() {
    let mut c = TestCluster::start_joined(3, &[]);
    c.wait_all_live();
    c.rill_ok(
        &[
            "topic",
            "create",
            "events",
            "--partitions",
            "3",
            "--replication-factor",
            "3",
        ],
        b"",
    );
    let first: String = (0..150).map(|i| format!("e{i:03}\n")).collect();
    c.rill_ok(&["produce", "events"], first.as_bytes());

    let mut member = rill_command(&c.home())
        .env("RILL_BOOTSTRAP", c.bootstrap())
        .args([
            "consume",
            "events",
            "--group",
            "g",
            "--from-beginning",
            "--session-timeout-ms",
            "3000",
            "--heartbeat-interval-ms",
            "100",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn rill consume --group");
    let lines = collect_lines_on_thread(member.stdout.take().unwrap());

    // Offsets never go backwards: watched from now until the member left.
    let watcher = CommitWatcher::start(&c.home(), &c.bootstrap(), "g");
    let out = c.wait_for(
        "150 records committed",
        &["group", "describe", "g"],
        |out| group_describe(out).1.values().sum::<i64>() == 150,
    );
    let (coordinator, _) = group_describe(&out);

    // __consumer_offsets is a cluster topic, replicated on every broker.
    let offsets = c.rill_ok(&["topic", "describe", "__consumer_offsets"], b"");
    assert!(offsets.contains("ReplicationFactor:3"), "{offsets}");

    c.kill(coordinator as usize);
    let rest: String = (150..300).map(|i| format!("e{i:03}\n")).collect();
    c.rill_ok(&["produce", "events"], rest.as_bytes());
    c.wait_for(
        "a new coordinator with all 300 records committed",
        &["group", "describe", "g"],
        |out| {
            let (now, committed) = group_describe(out);
            now != coordinator && committed.values().sum::<i64>() == 300
        },
    );

    let mut seen: Vec<String> = lines.lock().unwrap().clone();
    seen.sort();
    seen.dedup();
    let want: Vec<String> = (0..300).map(|i| format!("e{i:03}")).collect();
    assert_eq!(seen, want, "the member printed every record\n{}", c.logs());

    // SIGTERM: the member commits and leaves the new coordinator's group cleanly.
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on our own unreaped child; no memory-safety preconditions.
    let rc = unsafe { libc::kill(member.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = support::wait_bounded(&mut member, std::time::Duration::from_secs(20))
        .expect("the member exits after SIGTERM");
    assert!(status.success(), "member exit status {status}");
    let out = c.wait_for("an empty group", &["group", "describe", "g"], |out| {
        out.contains("Members: 0")
    });
    assert_eq!(group_describe(&out).1.values().sum::<i64>(), 300, "{out}");
    let seen = watcher.finish();
    assert!(!seen.is_empty(), "the watcher saw commits");
}

/// The partition of `__transaction_state` (of `partitions`) that coordinates
/// `transactional_id`: the broker's FNV-1a (`internal_topics::coordinator_partition`).
fn txn_partition(transactional_id: &str, partitions: u32) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in transactional_id.as_bytes() {
        hash ^= u32::from(*b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash % partitions
}

#[test]
fn transactions_span_brokers_and_survive_their_coordinator_being_killed() {
    let mut c = TestCluster::start_joined(3, &[]);
    c.wait_all_live();
    c.rill_ok(
        &[
            "topic",
            "create",
            "paid",
            "--partitions",
            "3",
            "--replication-factor",
            "3",
        ],
        b"",
    );
    // One transaction over three partitions led by different brokers: the
    // coordinator has the other leaders write their markers.
    let first: String = (0..60).map(|i| format!("k{i}:p{i:03}\n")).collect();
    let produce = [
        "produce",
        "paid",
        "--key-separator",
        ":",
        "--transactional-id",
        "payments",
    ];
    c.rill_ok(&produce, first.as_bytes());

    // Kill the coordinator of "payments"; the next transaction goes to the
    // broker that takes its __transaction_state partition over.
    let state = c.rill_ok(&["topic", "describe", "__transaction_state"], b"");
    let count = state.lines().filter(|l| l.contains("Partition: ")).count() as u32;
    assert!(count > 0, "{state}");
    let (leader, replicas, _) = partition_n(&state, txn_partition("payments", count))
        .unwrap_or_else(|| panic!("no partition line\n{state}"));
    assert_eq!(
        replicas.len(),
        3,
        "__transaction_state is replicated: {state}"
    );
    let coordinator = leader.expect("the coordinator partition has a leader");
    c.kill(coordinator as usize);
    let second: String = (60..100).map(|i| format!("k{i}:p{i:03}\n")).collect();
    c.rill_ok(&produce, second.as_bytes());

    // A transaction that fails part-way (a line without the separator) is
    // aborted: its records are in the log, invisible to read-committed readers.
    let bad = "k100:aborted-1\nk101:aborted-2\nno separator here\n";
    let out = c.rill(&produce, bad.as_bytes());
    assert!(!out.status.success(), "a bad line fails the command");

    let read = |isolation: &str, n: usize| -> Vec<String> {
        let out = c.rill_ok(
            &[
                "consume",
                "paid",
                "--from-beginning",
                "--isolation",
                isolation,
                "--timeout-ms",
                "5000",
                "--max-messages",
                &n.to_string(),
            ],
            b"",
        );
        let mut lines: Vec<String> = out.lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    let want: Vec<String> = (0..100).map(|i| format!("p{i:03}")).collect();
    assert_eq!(read("read-committed", 102), want, "committed records only");
    let all = read("read-uncommitted", 102);
    assert_eq!(
        all.len(),
        102,
        "the aborted records are in the log: {all:?}"
    );
}

/// A broker keeps a log only for the partitions it is a replica of: with
/// replication factors below the broker count, each data dir holds exactly
/// its replicas' directories, records produced through any broker are all
/// read back (through any broker, and by a group), and a directory a broker
/// holds for a partition it is no replica of (left by an older version) is
/// removed when it starts.
#[test]
fn a_broker_keeps_logs_only_for_the_partitions_it_is_a_replica_of() {
    let mut c = TestCluster::start_joined(3, &[]);
    c.wait_all_live();
    for (topic, partitions, rf) in [("solo", "6", "1"), ("pair", "3", "2")] {
        c.rill_ok(
            &[
                "topic",
                "create",
                topic,
                "--partitions",
                partitions,
                "--replication-factor",
                rf,
            ],
            b"",
        );
    }
    let replicas = |topic: &str, n: u32| -> BTreeMap<u32, Vec<i32>> {
        let out = c.wait_for("leaders", &["topic", "describe", topic], |out| {
            (0..n).all(|p| partition_n(out, p).is_some_and(|(l, _, _)| l.is_some()))
        });
        (0..n)
            .map(|p| (p, partition_n(&out, p).unwrap().1))
            .collect()
    };
    let solo = replicas("solo", 6);
    let pair = replicas("pair", 3);
    let dirs = |c: &TestCluster, b: usize| -> Vec<String> {
        let mut d: Vec<String> = std::fs::read_dir(c.data_dir(b))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("solo-") || n.starts_with("pair-"))
            .collect();
        d.sort();
        d
    };
    let expected = |b: i32| -> Vec<String> {
        let mut d: Vec<String> = [("solo", &solo), ("pair", &pair)]
            .iter()
            .flat_map(|(t, m)| {
                m.iter()
                    .filter(|(_, r)| r.contains(&b))
                    .map(move |(p, _)| format!("{t}-{p}"))
            })
            .collect();
        d.sort();
        d
    };
    for b in 0..3 {
        assert_eq!(dirs(&c, b), expected(b as i32), "broker {b}'s data dir");
        assert_eq!(dirs(&c, b).len(), 2 + 2, "broker {b}: {:?}", dirs(&c, b));
    }
    let input: String = (0..60).map(|i| format!("k{i}:v{i}\n")).collect();
    c.rill_ok(
        &["produce", "solo", "--key-separator", ":"],
        input.as_bytes(),
    );
    let out = c.rill_ok(
        &[
            "consume",
            "solo",
            "--from-beginning",
            "--group",
            "solo-readers",
            "--timeout-ms",
            "5000",
        ],
        b"",
    );
    let mut got: Vec<&str> = out.lines().collect();
    got.sort();
    let mut want: Vec<String> = (0..60).map(|i| format!("v{i}")).collect();
    want.sort();
    assert_eq!(got, want);
    let described = c.rill_ok(&["group", "describe", "solo-readers"], b"");
    // The group's commits (on the coordinator, whichever broker) add up to
    // every record.
    let committed: i64 = described
        .lines()
        .filter(|l| l.starts_with("solo-readers"))
        .filter_map(|l| l.split_whitespace().nth(3)?.parse::<i64>().ok())
        .sum();
    assert_eq!(committed, 60, "{described}");

    // A stray directory of a partition broker 2 is no replica of goes at start.
    let (stray, _) = solo.iter().find(|(_, r)| !r.contains(&2)).unwrap();
    c.kill(2);
    let stray_dir = c.data_dir(2).join(format!("solo-{stray}"));
    std::fs::create_dir_all(&stray_dir).unwrap();
    c.spawn(2);
    c.wait_all_live();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while stray_dir.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(!stray_dir.exists(), "{} was kept", stray_dir.display());
    assert_eq!(dirs(&c, 2), expected(2));
}

/// The base offset of the oldest segment file in a partition directory.
fn first_segment_base(dir: &std::path::Path) -> Option<i64> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".log")?.parse::<i64>().ok()
        })
        .min()
}

/// A follower that was down while the leader's retention deleted every
/// record it held comes back with a log that ends before the leader's log
/// start. Its fetch is refused as out of range; it starts its log again at
/// the leader's log start and rejoins the ISR (before, it retried the refused
/// fetch forever and never rejoined).
#[test]
fn a_follower_behind_the_leaders_log_start_restarts_there_and_rejoins() {
    let (_cfg_dir, cfg) = support::temp_file("rill.toml", "retention_check_interval_ms = 200\n");
    // Three brokers so the metadata quorum keeps a majority with one down.
    let mut c = TestCluster::start_joined(3, &["--config", cfg.to_str().unwrap()]);
    c.wait_all_live();
    // Small segments, and retention keeps only about the last two of them.
    c.rill_ok(
        &[
            "topic",
            "create",
            "behind",
            "--partitions",
            "1",
            "--replication-factor",
            "2",
            "--config",
            "segment.bytes=1024",
            "--config",
            "retention.bytes=2048",
            "--config",
            "min.insync.replicas=1",
            // The ISR drops the dead follower soon, so the high watermark
            // (below which retention deletes) moves on without it.
            "--config",
            "replica.lag.time.max.ms=1000",
        ],
        b"",
    );
    let lines = |from: usize, to: usize| -> String {
        (from..to)
            .map(|i| format!("record-{i:05}-{}\n", "x".repeat(40)))
            .collect()
    };
    c.rill_ok(&["produce", "behind"], lines(0, 50).as_bytes());
    let in_sync = |d: &str| partition0(d).is_some_and(|(_, _, isr)| isr.len() == 2);
    let describe = c.wait_for(
        "both replicas in sync",
        &["topic", "describe", "behind"],
        in_sync,
    );
    let (leader, replicas, _) = partition0(&describe).unwrap();
    let leader = leader.expect("a leader");
    let follower = *replicas.iter().find(|r| **r != leader).unwrap() as usize;
    let follower_end = 50;
    c.kill(follower);
    // The leader takes more while the follower is away, and its retention
    // deletes every record the follower has.
    // (One `rill produce` sends its lines as one batch, and a segment rolls
    // only between batches: several calls make several segments.)
    for from in (50..400).step_by(50) {
        c.rill_ok(
            &["produce", "behind", "--acks", "1"],
            lines(from, from + 50).as_bytes(),
        );
    }
    let leader_dir = c.data_dir(leader as usize).join("behind-0");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while first_segment_base(&leader_dir).is_none_or(|b| b <= follower_end) {
        assert!(
            std::time::Instant::now() < deadline,
            "the leader's retention did not move its log start past {follower_end}\n{}",
            c.logs()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    c.wait_for(
        "the ISR without the follower",
        &["topic", "describe", "behind"],
        |d| partition0(d).is_some_and(|(_, _, isr)| isr == vec![leader]),
    );
    c.spawn(follower);
    c.wait_for(
        "the follower back in the ISR",
        &["topic", "describe", "behind"],
        in_sync,
    );
    let start = first_segment_base(&c.data_dir(follower).join("behind-0")).unwrap();
    assert!(
        start > follower_end,
        "the follower starts at the leader's log start, not {start}"
    );
    assert!(
        c.logs().contains("restarting the replica there"),
        "{}",
        c.logs()
    );
}
