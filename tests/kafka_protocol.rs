//! Real Kafka clients against `rill broker --kafka-listen` (issue 19):
//! confluent-kafka (librdkafka 2.x) and kafka-python, from a Python venv the
//! test creates under the target directory when missing (once, under a file
//! lock; `.ci/run` creates it up front). The clients' side is
//! tests/kafka_clients.py; this file starts the broker, runs the script and the
//! `rill` commands, and checks what crossed.
//!
//! - confluent-kafka: admin create, 10,000 keyed records with acks=all and
//!   idempotence on, read back from the beginning (assign) with keys, values,
//!   headers, timestamps and tombstones checked; kafka-python reads them too;
//!   offsets committed and read back (assign, no subscription); DescribeCluster
//!   and DescribeConfigs through the AdminClient.
//! - Cross-protocol: confluent-kafka produces, `rill consume` reads; `rill
//!   produce` writes, kafka-python reads.
//! - Consumer groups (Kafka's classic protocol on Rill's coordinator):
//!   kafka-python subscribes, commits, restarts and resumes; three
//!   confluent-kafka consumers (cooperative-sticky) share six partitions and
//!   rebalance when one leaves; `rill group describe` shows them and their
//!   commits.
//! - Three brokers, each with its own Kafka listener: the metadata names all
//!   three; a confluent-kafka producer (acks=all, idempotent) keeps producing
//!   while the partition's leader is SIGKILLed; every acknowledged record is
//!   in the log once.
//! - TLS with client certificates (`--kafka-tls`, `--auth mtls`): the
//!   certificate names the principal, ACLs decide (an allowed and two denied
//!   writes), a client without a certificate gets nothing.
//! - SASL (SCRAM-SHA-256/512, PLAIN) over TLS with users from `rill user
//!   add`: allowed and denied principals, a wrong password and a removed user
//!   refused.
//! - KIP-848 (`group.protocol=consumer`): two confluent-kafka consumers
//!   assigned by the broker, then one; commits reach the log ends.
//! - kcat (Debian's, librdkafka 2.0): metadata, keyed produce read by `rill
//!   consume`, `rill produce` read back, and a balanced consumer group whose
//!   commits `rill group describe` shows. `.ci/run` installs kcat; without it
//!   the test fails under CI and says so elsewhere.
//!
//! Loopback only; the broker is killed when its `TestBroker` drops.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::cluster::{TestCluster, partition0};
use support::*;

/// Longest a client script may run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/kafka_clients.py")
}

/// The venv's python, creating the venv (confluent-kafka, kafka-python from
/// PyPI) when missing.
fn python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kafka-venv");
    let python = root.join("bin").join("python");
    let ready = root.join(".ready");
    std::fs::create_dir_all(root.parent().unwrap()).unwrap();
    let lock = std::fs::File::create(root.with_extension("lock")).unwrap();
    lock.lock().expect("lock the venv");
    if !ready.is_file() {
        let _ = std::fs::remove_dir_all(&root);
        let out = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&root)
            .output()
            .expect("run python3 -m venv");
        assert!(
            out.status.success(),
            "python3 -m venv failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "confluent-kafka",
                "kafka-python",
            ])
            .output()
            .expect("run pip");
        assert!(
            out.status.success(),
            "pip install confluent-kafka kafka-python failed (the Kafka-protocol tests need them; \
             .ci/run installs them): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&ready, b"").unwrap();
    }
    let _ = lock.unlock();
    python
}

/// A broker with a Kafka listener on a free loopback port, that address, and
/// the broker's metrics port.
/// Group timings of the test broker: a classic group's first rebalance waits
/// 200 ms for more members (the default is Kafka's 3 s); KIP-848 members
/// heartbeat every 500 ms (Kafka's 5 s).
const GROUP_CONFIG: &str = "group_initial_rebalance_delay_ms = 200\n\
    group_consumer_session_timeout_ms = 10000\ngroup_consumer_heartbeat_interval_ms = 500\n";

fn kafka_broker() -> (TestBroker, String, u16) {
    let port = free_tcp_port();
    let addr = format!("127.0.0.1:{port}");
    let metrics_port = free_tcp_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let (_dir, config) = temp_file("broker.toml", GROUP_CONFIG);
    let broker = TestBroker::start_with(&[
        "--kafka-listen",
        &addr,
        "--metrics",
        &metrics,
        "--config",
        config.to_str().unwrap(),
    ]);
    (broker, addr, metrics_port)
}

/// Runs the client script; its stdout. Fails the test, with the broker's log,
/// when the script fails.
fn run_script(broker: &TestBroker, args: &[&str]) -> String {
    let mut cmd = Command::new(python());
    cmd.arg(script())
        .args(args)
        .env("RILL_BIN", rill_bin())
        .env("RILL_BOOTSTRAP", broker.addr().to_string())
        .env("RILL_HOME", broker.home());
    let out = run_bounded(&mut cmd, b"", SCRIPT_TIMEOUT);
    if !out.status.success() {
        panic!(
            "kafka_clients.py {args:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}\n--- broker log\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            broker.log()
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn kafka_clients_create_produce_idempotently_and_read_everything_back() {
    let (broker, kafka, metrics_port) = kafka_broker();
    let topic = "kafka-clients";
    run_script(&broker, &["create", &kafka, topic]);
    let out = run_script(&broker, &["produce", &kafka, topic, "10000"]);
    assert!(out.contains("produced 10000"), "{out}");
    let out = run_script(&broker, &["consume", &kafka, topic, "10000"]);
    assert!(out.contains("consumed 10000"), "{out}");
    let out = run_script(&broker, &["consume-committed", &kafka, topic, "10000"]);
    assert!(out.contains("consumed 10000"), "{out}");
    let out = run_script(&broker, &["consume-python", &kafka, topic, "10000"]);
    assert!(out.contains("consumed 10000"), "{out}");
    // Committed offsets (FindCoordinator, OffsetCommit, OffsetFetch) and the
    // admin apis (DescribeCluster, DescribeConfigs).
    let out = run_script(&broker, &["commit", &kafka, topic, "100"]);
    assert!(out.contains("committed 3"), "{out}");
    // The same offsets, through the QUIC path.
    let group = format!("commit-{topic}");
    let committed = committed_offsets(&broker.rill_ok(&["group", "describe", &group]), &group);
    let expected: Committed = (0..3u32)
        .map(|p| ((topic.to_string(), p), 100 + i64::from(p)))
        .collect();
    assert_eq!(committed, expected, "rill group describe {group}");
    let out = run_script(&broker, &["admin", &kafka, topic]);
    assert!(
        out.contains("admin ok") && out.contains("5 partitions"),
        "{out}"
    );
    // The partitions a Kafka admin added are Rill's: produce to the new one.
    let describe = broker.rill_ok(&["topic", "describe", topic]);
    assert!(describe.contains("PartitionCount:5"), "{describe}");
    broker.rill_stdin_ok(
        &["produce", topic, "--partition", "4"],
        b"on the new partition\n",
    );
    let out = broker.rill_ok(&["topic", "alter", topic, "--partitions", "6"]);
    assert!(out.contains("has 6 partitions"), "{out}");
    let out = broker.rill(&["topic", "alter", topic, "--partitions", "2"]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("can only grow"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Kafka requests went through the broker's router: its metrics count them.
    let text = scrape_metrics(metrics_port);
    for api in [
        "produce",
        "fetch",
        "init_producer_id",
        "create_topics",
        "offset_commit",
    ] {
        let n = metric(&text, "rill_requests_total", &format!("api=\"{api}\""));
        assert!(n >= 1.0, "rill_requests_total{{api={api}}} = {n}");
    }
    // The same records, seen through the QUIC path.
    let described = broker.rill_ok(&["topic", "describe", topic]);
    assert!(described.contains(topic), "{described}");
}

#[test]
fn kafka_transactions_commit_abort_and_fence_zombies() {
    let (broker, kafka, _) = kafka_broker();
    let topic = "kafka-txn";
    run_script(&broker, &["create", &kafka, topic]);
    let out = run_script(&broker, &["transactions", &kafka, topic, "200"]);
    assert!(out.contains("transactions ok"), "{out}");
    // (The script checks that a read_committed consumer gets no offset for
    // a partition while an open transaction holds its offset.)
    eprintln!("{out}");
    // The coordinator's view of the Kafka client's transactional id, through
    // `rill txn` (Kafka's DescribeTransactions / ListTransactions apis).
    let listed = broker.rill_ok(&["txn", "list"]);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("txn-kafka-txn ") && l.ends_with(" CompleteCommit")),
        "{listed}"
    );
    let described = broker.rill_ok(&["txn", "describe", "txn-kafka-txn"]);
    assert!(described.contains("CompleteCommit"), "{described}");
    let ongoing = broker.rill_ok(&["txn", "list", "--state", "Ongoing"]);
    assert!(!ongoing.contains("txn-kafka-txn"), "{ongoing}");
    let bogus = broker.rill(&["txn", "list", "--state", "Bogus"]);
    assert!(!bogus.status.success());
    let stderr = String::from_utf8_lossy(&bogus.stderr);
    assert!(
        stderr.contains("\"Bogus\" is not a transaction state"),
        "{stderr}"
    );
    let unknown = broker.rill(&["txn", "describe", "no-such-txn"]);
    assert!(!unknown.status.success());
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(stderr.contains("TRANSACTIONAL_ID_NOT_FOUND"), "{stderr}");
    // The same transactions through the QUIC path: a read-committed
    // `rill consume` sees the 201 committed records, not the 200 aborted.
    let committed = broker.rill_ok(&[
        "consume",
        topic,
        "--from-beginning",
        "--isolation",
        "read-committed",
        "--timeout-ms",
        "3000",
    ]);
    let lines: Vec<&str> = committed.lines().collect();
    assert_eq!(lines.len(), 201, "{committed}");
    assert!(
        lines.iter().all(|l| !l.starts_with("aborted-")),
        "{committed}"
    );
}

#[test]
fn records_cross_between_kafka_clients_and_rill_commands() {
    let (broker, kafka, _) = kafka_broker();

    // Kafka client -> rill consume.
    let topic = "from-kafka";
    run_script(&broker, &["create", &kafka, topic]);
    run_script(&broker, &["produce", &kafka, topic, "300"]);
    let out = broker.rill_ok(&[
        "consume",
        topic,
        "--from-beginning",
        "--isolation",
        "read-committed",
        "--print-key",
        "--max-messages",
        "300",
        "--timeout-ms",
        "20000",
    ]);
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    let mut expected: Vec<String> = (0..300)
        .map(|i| {
            // A tombstone's value prints as `null`.
            let value = if i % 97 == 0 {
                "null".to_string()
            } else {
                format!("value-{i}")
            };
            format!("key-{i}\t{value}")
        })
        .collect();
    expected.sort();
    assert_eq!(
        lines, expected,
        "rill consume of records a Kafka client wrote"
    );

    // rill produce -> kafka-python.
    let topic = "from-rill";
    broker.rill_ok(&["topic", "create", topic, "--partitions", "3"]);
    let input: String = (0..200).map(|i| format!("k{i}:v{i}\n")).collect();
    broker.rill_stdin_ok(
        &["produce", topic, "--key-separator", ":"],
        input.as_bytes(),
    );
    let out = run_script(&broker, &["consume-plain", &kafka, topic, "200"]);
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    let mut expected: Vec<String> = (0..200).map(|i| format!("k{i}\tv{i}")).collect();
    expected.sort();
    assert_eq!(
        lines, expected,
        "kafka-python read of records rill produce wrote"
    );
}

#[test]
fn kafka_consumer_groups_resume_and_rebalance_on_rills_coordinator() {
    let (broker, kafka, _) = kafka_broker();
    let topic = "grouped";
    broker.rill_ok(&["topic", "create", topic, "--partitions", "6"]);
    let n = 3000;
    let out = run_script(&broker, &["produce", &kafka, topic, &n.to_string()]);
    assert!(out.contains("produced 3000"), "{out}");

    // kafka-python (range): read half, commit, restart, resume.
    let out = run_script(&broker, &["group-resume", &kafka, topic, &n.to_string()]);
    assert!(out.contains("resumed"), "{out}");
    let group = format!("resume-{topic}");
    let committed = committed_offsets(&broker.rill_ok(&["group", "describe", &group]), &group);
    let first: i64 = committed.values().sum();
    assert!(
        first >= n / 2 && first < n,
        "the first consumer of {group} committed {first} of {n} records: {committed:?}"
    );

    // confluent-kafka (cooperative-sticky): 3 members, then 2.
    let out = run_script(&broker, &["group-rebalance", &kafka, topic, &n.to_string()]);
    assert!(out.contains("rebalanced: read 3000"), "{out}");
    let group = format!("rebalance-{topic}");
    let described = broker.rill_ok(&["group", "describe", &group]);
    let committed = committed_offsets(&described, &group);
    assert_eq!(committed.len(), 6, "{described}");
    assert_eq!(
        committed.values().sum::<i64>(),
        n,
        "the two members committed the end of every partition: {described}"
    );
}

#[test]
fn kip848_consumers_are_assigned_by_the_broker_and_commit() {
    let (broker, kafka, _) = kafka_broker();
    let topic = "kip848";
    broker.rill_ok(&["topic", "create", topic, "--partitions", "6"]);
    let n = 1200;
    let out = run_script(&broker, &["produce", &kafka, topic, &n.to_string()]);
    assert!(out.contains("produced 1200"), "{out}");
    let out = run_script(&broker, &["group-848", &kafka, topic, &n.to_string()]);
    assert!(out.contains("kip848: read 1200"), "{out}");
    let group = format!("kip848-{topic}");
    let described = broker.rill_ok(&["group", "describe", &group]);
    let committed = committed_offsets(&described, &group);
    assert_eq!(committed.len(), 6, "{described}");
    assert_eq!(
        committed.values().sum::<i64>(),
        n,
        "the member committed the end of every partition: {described}"
    );
}

/// Runs kcat with `args`, `input` on stdin; its stdout.
fn kcat(broker: &TestBroker, args: &[&str], input: &[u8]) -> String {
    let mut cmd = Command::new("kcat");
    cmd.args(args);
    let out = run_bounded(&mut cmd, input, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "kcat {args:?} failed ({}):\n{}\n--- broker log\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        broker.log()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn kcat_lists_produces_consumes_and_commits_in_a_group() {
    if Command::new("kcat").arg("-V").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "kcat is not installed; .ci/run installs it (apt-get install kcat)"
        );
        eprintln!("kcat is not installed (apt-get install kcat): skipping outside CI");
        return;
    }
    let (broker, kafka, _) = kafka_broker();
    let topic = "by-kcat";
    broker.rill_ok(&["topic", "create", topic, "--partitions", "2"]);
    let listed = kcat(&broker, &["-b", &kafka, "-L", "-t", topic], b"");
    assert!(
        listed.contains(&format!("topic \"{topic}\" with 2 partitions")),
        "{listed}"
    );

    // kcat produces keyed records; rill consume reads them.
    let input: String = (0..100).map(|i| format!("k{i}:v{i}\n")).collect();
    kcat(
        &broker,
        &["-b", &kafka, "-P", "-t", topic, "-K:"],
        input.as_bytes(),
    );
    let out = broker.rill_ok(&[
        "consume",
        topic,
        "--from-beginning",
        "--print-key",
        "--max-messages",
        "100",
        "--timeout-ms",
        "20000",
    ]);
    let mut got: Vec<&str> = out.lines().collect();
    got.sort();
    let mut expected: Vec<String> = (0..100).map(|i| format!("k{i}\tv{i}")).collect();
    expected.sort();
    assert_eq!(got, expected, "rill consume of what kcat produced");

    // rill produce; kcat reads everything back, then as a balanced group.
    let input: String = (100..150).map(|i| format!("k{i}:v{i}\n")).collect();
    broker.rill_stdin_ok(
        &["produce", topic, "--key-separator", ":"],
        input.as_bytes(),
    );
    let fmt = ["-f", "%k=%s\n"];
    let all = kcat(
        &broker,
        &[
            &["-b", &kafka, "-C", "-t", topic, "-o", "beginning", "-e"][..],
            &fmt,
        ]
        .concat(),
        b"",
    );
    assert_eq!(all.lines().count(), 150, "{all}");
    assert!(all.lines().any(|l| l == "k120=v120"), "{all}");
    let grouped = kcat(
        &broker,
        &[
            &[
                "-b",
                &kafka,
                "-G",
                "kcat-group",
                topic,
                "-o",
                "beginning",
                "-e",
            ][..],
            &fmt,
        ]
        .concat(),
        b"",
    );
    assert_eq!(grouped.lines().count(), 150, "{grouped}");
    let described = broker.rill_ok(&["group", "describe", "kcat-group"]);
    let committed = committed_offsets(&described, "kcat-group");
    assert_eq!(
        committed.values().sum::<i64>(),
        150,
        "kcat's group committed the end of both partitions: {described}"
    );
}

#[test]
fn a_kafka_producer_keeps_every_acknowledged_record_when_the_leader_is_killed() {
    let kafka_ports = std::sync::Mutex::new(std::collections::BTreeMap::new());
    let mut c = TestCluster::start_joined_with(3, &[], |id| {
        let port = free_tcp_port();
        kafka_ports.lock().unwrap().insert(id, port);
        vec!["--kafka-listen".into(), format!("127.0.0.1:{port}")]
    });
    let kafka_ports = kafka_ports.into_inner().unwrap();
    c.wait_all_live();
    let topic = "kafka-failover";
    c.rill_ok(
        &[
            "topic",
            "create",
            topic,
            "--partitions",
            "1",
            "--replication-factor",
            "3",
            "--config",
            "min.insync.replicas=2",
        ],
        b"",
    );
    let describe = c.wait_for(
        "three replicas in the ISR",
        &["topic", "describe", topic],
        |out| partition0(out).is_some_and(|(l, _, isr)| l.is_some() && isr == [0, 1, 2]),
    );
    let leader = partition0(&describe).unwrap().0.unwrap() as usize;
    let bootstrap: Vec<String> = kafka_ports
        .values()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let n = 3000;
    let mut script = Command::new(python())
        .arg(script())
        .args([
            "produce-failover",
            &bootstrap.join(","),
            topic,
            &n.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kafka_clients.py");
    let lines = collect_lines_on_thread(script.stdout.take().unwrap());
    let stderr = read_to_end_on_thread(script.stderr.take().unwrap());
    let acked = |lines: &[String]| {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix("acked ")?.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
    };
    let deadline = Instant::now() + SCRIPT_TIMEOUT;
    while acked(&lines.lock().unwrap()) < 1000 {
        if Instant::now() > deadline || script.try_wait().unwrap().is_some() {
            let _ = script.kill();
            panic!(
                "the producer did not reach 1000 acknowledged records: {:?}\n{}\n{}",
                lines.lock().unwrap(),
                String::from_utf8_lossy(&stderr.join().unwrap()),
                c.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c.kill(leader);
    let status = wait_bounded(&mut script, SCRIPT_TIMEOUT);
    let stderr = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
    let out = lines.lock().unwrap().clone();
    if status.is_none() {
        let _ = script.kill();
    }
    assert!(
        status.is_some_and(|s| s.success()) && out.contains(&format!("produced {n}")),
        "the producer failed across the failover ({status:?}):\n{out:?}\n{stderr}\n{}",
        c.logs()
    );
    // The clients were told of every broker at its own Kafka address.
    let expected: Vec<String> = kafka_ports
        .iter()
        .map(|(id, p)| format!("{id}=127.0.0.1:{p}"))
        .collect();
    assert_eq!(out[0], format!("brokers {}", expected.join(" ")));
    // Every acknowledged record, once, read from a surviving broker.
    let live = c.brokers[(leader + 1) % 3].addr.to_string();
    let got = values_of(&read_to_end(&live, &c.home(), topic));
    let want: Vec<String> = (0..n).map(|i| format!("fo-{i}")).collect();
    assert_each_exactly_once(&got, &want, "records produced across the leader's death");
}

/// `rill cert issue --principal NAME` in `home`: the certificate and key files.
fn issue_cert(home: &Path, name: &str) -> (String, String) {
    let out = rill_command(home)
        .args(["cert", "issue", "--principal", name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = home.join("certs");
    let file = |f: String| dir.join(f).display().to_string();
    (file(format!("{name}.pem")), file(format!("{name}-key.pem")))
}

#[test]
fn tls_client_certificates_name_principals_whose_acls_decide() {
    let port = free_tcp_port();
    let listen = format!("127.0.0.1:{port}");
    let advertised = format!("localhost:{port}");
    let broker = TestBroker::start_with(&[
        "--auth",
        "mtls",
        "--super-user",
        "root",
        "--kafka-listen",
        &listen,
        "--kafka-tls",
        "--kafka-advertised-addr",
        &advertised,
    ]);
    let home = broker.home();
    let (root_cert, root_key) = issue_cert(&home, "root");
    let (alice_cert, alice_key) = issue_cert(&home, "alice");
    let (bob_cert, bob_key) = issue_cert(&home, "bob");
    let as_root = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--tls-cert", &root_cert, "--tls-key", &root_key]);
        broker.rill_ok(&all);
    };
    let topic = "tls-orders";
    let secret = format!("{topic}-secret");
    as_root(&["topic", "create", topic, "--partitions", "3"]);
    as_root(&["topic", "create", &secret]);
    for op in ["write", "read"] {
        as_root(&[
            "acl",
            "add",
            "--principal",
            "alice",
            "--operation",
            op,
            "--topic",
            topic,
        ]);
    }
    // Her consumer's group (librdkafka looks up its coordinator even with
    // assign()).
    let group = format!("tls-{topic}");
    as_root(&[
        "acl",
        "add",
        "--principal",
        "alice",
        "--operation",
        "read",
        "--group",
        &group,
    ]);
    let mut cmd = Command::new(python());
    cmd.arg(script())
        .args(["tls-acl", &advertised, topic, "200"])
        .env("RILL_CA", home.join("ca.pem"))
        .env("ALICE_CERT", &alice_cert)
        .env("ALICE_KEY", &alice_key)
        .env("BOB_CERT", &bob_cert)
        .env("BOB_KEY", &bob_key);
    let out = run_bounded(&mut cmd, b"", SCRIPT_TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tls-acl failed ({}):\n{stdout}\n{}\n--- broker log\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        broker.log()
    );
    for line in [
        "alice produced 200".to_string(),
        format!("alice denied {secret}: TOPIC_AUTHORIZATION_FAILED"),
        format!("bob denied {topic}: TOPIC_AUTHORIZATION_FAILED"),
        "alice read 200".to_string(),
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "no {line:?} in:\n{stdout}"
        );
    }
    assert!(stdout.contains("no certificate refused"), "{stdout}");
    assert!(
        broker.log().contains("TLS handshake failed"),
        "the refused handshake is logged:\n{}",
        broker.log()
    );
    // What alice wrote over Kafka's TLS, root reads over QUIC.
    let read = broker.rill_ok(&[
        "consume",
        topic,
        "--from-beginning",
        "--max-messages",
        "200",
        "--timeout-ms",
        "20000",
        "--tls-cert",
        &root_cert,
        "--tls-key",
        &root_key,
    ]);
    assert_eq!(read.lines().count(), 200, "{read}");
}

#[test]
fn sasl_scram_and_plain_users_are_principals_under_the_acls() {
    let port = free_tcp_port();
    let listen = format!("127.0.0.1:{port}");
    let advertised = format!("localhost:{port}");
    let broker = TestBroker::start_with(&[
        "--auth",
        "mtls",
        "--super-user",
        "root",
        "--kafka-listen",
        &listen,
        "--kafka-tls",
        "--kafka-sasl",
        "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
        "--kafka-advertised-addr",
        &advertised,
    ]);
    let home = broker.home();
    let (root_cert, root_key) = issue_cert(&home, "root");
    let root = |args: &[&str], input: &[u8]| {
        let mut all = args.to_vec();
        all.extend(["--tls-cert", &root_cert, "--tls-key", &root_key]);
        let out = broker.rill_stdin(&all, input);
        assert!(
            out.status.success(),
            "rill {all:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let added = root(&["user", "add", "alice", "--password-stdin"], b"alice-pw\n");
    assert!(added.contains("Added user alice"), "{added}");
    root(&["user", "add", "bob", "--password-stdin"], b"bob-pw\n");
    let topic = "sasl-orders";
    root(&["topic", "create", topic, "--partitions", "3"], b"");
    let group = format!("sasl-{topic}");
    for (op, flag, name) in [
        ("write", "--topic", topic),
        ("read", "--topic", topic),
        ("read", "--group", group.as_str()),
    ] {
        root(
            &[
                "acl",
                "add",
                "--principal",
                "alice",
                "--operation",
                op,
                flag,
                name,
            ],
            b"",
        );
    }
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(python());
        cmd.arg(script())
            .args(args)
            .env("RILL_CA", home.join("ca.pem"))
            .envs(env.iter().copied());
        let out = run_bounded(&mut cmd, b"", SCRIPT_TIMEOUT);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?} failed ({}):\n{stdout}\n{}\n--- broker log\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            broker.log()
        );
        stdout
    };
    let out = run(
        &["sasl-acl", &advertised, topic, "100"],
        &[("ALICE_PASSWORD", "alice-pw"), ("BOB_PASSWORD", "bob-pw")],
    );
    for line in [
        "alice SCRAM-SHA-256 produced 100".to_string(),
        "alice SCRAM-SHA-512 produced 1".to_string(),
        "alice PLAIN produced 1".to_string(),
        format!("bob denied {topic}: TOPIC_AUTHORIZATION_FAILED"),
        "alice read 102".to_string(),
    ] {
        assert!(out.lines().any(|l| l == line), "no {line:?} in:\n{out}");
    }
    assert!(out.contains("wrong password refused"), "{out}");
    assert!(
        broker.log().contains("SASL SCRAM authentication failed"),
        "the failed login is logged:\n{}",
        broker.log()
    );

    let list = root(&["user", "list"], b"");
    assert!(
        list.lines()
            .any(|l| l == "alice  SCRAM-SHA-256(8192),SCRAM-SHA-512(8192)"),
        "{list}"
    );
    let login = |user: &str, password: &str| {
        run(
            &["sasl-login", &advertised, topic],
            &[("SASL_USER", user), ("SASL_PASSWORD", password)],
        )
    };
    assert_eq!(login("bob", "bob-pw").trim(), "login ok");
    root(&["user", "remove", "bob"], b"");
    assert!(!root(&["user", "list"], b"").contains("bob"));
    let out = login("bob", "bob-pw");
    assert!(out.starts_with("login failed"), "a removed user: {out}");
    // kcat (librdkafka 2.0, which looks for SaslHandshake v0 before it
    // authenticates) produces as alice with PLAIN and both SCRAMs. (Its SCRAM
    // client-final message repeats the client nonce before the server's
    // nonce; Kafka accepts a nonce that ends with the server's, and so do we.)
    if Command::new("kcat").arg("-V").output().is_ok() {
        let ca = home.join("ca.pem").display().to_string();
        for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
            let args = vec![
                "-b".to_string(),
                advertised.clone(),
                "-X".into(),
                "security.protocol=SASL_SSL".into(),
                "-X".into(),
                format!("ssl.ca.location={ca}"),
                "-X".into(),
                format!("sasl.mechanisms={mechanism}"),
                "-X".into(),
                "sasl.username=alice".into(),
                "-X".into(),
                "sasl.password=alice-pw".into(),
                "-P".into(),
                "-t".into(),
                topic.to_string(),
            ];
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            kcat(
                &broker,
                &refs,
                format!("from kcat {mechanism}\n").as_bytes(),
            );
        }
        let read = root(
            &[
                "consume",
                topic,
                "--from-beginning",
                "--max-messages",
                "105",
                "--timeout-ms",
                "20000",
            ],
            b"",
        );
        for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
            let line = format!("from kcat {mechanism}");
            assert!(read.lines().any(|l| l == line), "{line}: {read}");
        }
    }
    // Without the super user's certificate, users cannot be managed.
    let out = broker.rill_stdin(&["user", "add", "eve", "--password-stdin"], b"pw\n");
    assert!(!out.status.success());
}
