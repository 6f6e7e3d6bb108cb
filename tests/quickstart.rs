//! The Kafka quickstart, end to end through the `rill` binary: create a topic,
//! list and describe it, produce lines from stdin, consume them back; and a
//! consumer waiting at the end of a topic is woken by new data (fetch long-poll).

#[path = "support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use support::{TestBroker, read_to_end_on_thread, wait_bounded};

#[test]
fn quickstart() {
    let broker = TestBroker::start();
    let id = broker.id();

    assert_eq!(
        broker.rill_ok(&["topic", "create", "test"]),
        "Created topic test.\n"
    );

    let list = broker.rill_ok(&["topic", "list"]);
    assert!(list.lines().any(|l| l == "test"), "topic list: {list:?}");

    // Exactly Kafka's layout: a header line, then one tab-led line per partition.
    let describe = broker.rill_ok(&["topic", "describe", "test"]);
    let lines: Vec<&str> = describe.lines().collect();
    assert_eq!(
        lines[0], "Topic:test\tPartitionCount:1\tReplicationFactor:1\tConfigs:",
        "describe: {describe:?}"
    );
    assert_eq!(
        lines[1..],
        [
            format!("\tTopic: test\tPartition: 0\tLeader: {id}\tReplicas: {id}\tIsr: {id}")
                .as_str()
        ],
        "describe: {describe:?}"
    );
    assert!(describe.ends_with('\n'));

    broker.rill_stdin_ok(
        &["produce", "test"],
        b"This is my first event\nThis is my second event\n",
    );
    let consumed = broker.rill_ok(&[
        "consume",
        "test",
        "--from-beginning",
        "--max-messages",
        "2",
        "--timeout-ms",
        "5000",
    ]);
    assert_eq!(
        consumed,
        "This is my first event\nThis is my second event\n"
    );
}

#[test]
fn describe_lists_non_default_configs_and_alter_changes_them() {
    let broker = TestBroker::start();
    broker.rill_ok(&[
        "topic",
        "create",
        "cfg",
        "--partitions",
        "3",
        "--config",
        "retention.ms=60000",
        "--config",
        "cleanup.policy=compact",
    ]);
    let describe = broker.rill_ok(&["topic", "describe", "cfg"]);
    let lines: Vec<&str> = describe.lines().collect();
    assert_eq!(
        lines[0],
        "Topic:cfg\tPartitionCount:3\tReplicationFactor:1\tConfigs:cleanup.policy=compact,retention.ms=60000"
    );
    assert_eq!(lines.len(), 4, "{describe:?}");
    for (p, line) in lines[1..].iter().enumerate() {
        let id = broker.id();
        assert_eq!(
            *line,
            format!("\tTopic: cfg\tPartition: {p}\tLeader: {id}\tReplicas: {id}\tIsr: {id}")
        );
    }

    broker.rill_ok(&[
        "topic",
        "alter",
        "cfg",
        "--config",
        "retention.ms=120000",
        "--delete-config",
        "cleanup.policy",
    ]);
    let describe = broker.rill_ok(&["topic", "describe", "cfg"]);
    assert!(
        describe.starts_with(
            "Topic:cfg\tPartitionCount:3\tReplicationFactor:1\tConfigs:retention.ms=120000\n"
        ),
        "{describe:?}"
    );

    broker.rill_ok(&["topic", "delete", "cfg"]);
    let list = broker.rill_ok(&["topic", "list"]);
    assert!(
        !list.lines().any(|l| l == "cfg"),
        "deleted topic still listed: {list:?}"
    );
}

#[test]
fn keys_offsets_and_partitions_round_trip() {
    let broker = TestBroker::start();
    broker.rill_ok(&["topic", "create", "kv", "--partitions", "2"]);
    broker.rill_stdin_ok(
        &[
            "produce",
            "kv",
            "--key-separator",
            ":",
            "--partition",
            "1",
            "--compression",
            "lz4",
        ],
        b"a:1\nb:2:x\n",
    );
    let out = broker.rill_ok(&[
        "consume",
        "kv",
        "--partition",
        "1",
        "--from-beginning",
        "--print-key",
        "--print-offset",
        "--max-messages",
        "2",
        "--timeout-ms",
        "5000",
    ]);
    assert_eq!(out, "1:0\ta\t1\n1:1\tb\t2:x\n");
    // --offset starts mid-partition; partition 0 stayed empty.
    let out = broker.rill_ok(&[
        "consume",
        "kv",
        "--partition",
        "1",
        "--offset",
        "1",
        "--timeout-ms",
        "1000",
    ]);
    assert_eq!(out, "2:x\n");
    let out = broker.rill_ok(&[
        "consume",
        "kv",
        "--partition",
        "0",
        "--from-beginning",
        "--timeout-ms",
        "500",
    ]);
    assert_eq!(out, "");

    let info = broker.rill_ok(&["cluster", "info"]);
    assert!(
        info.contains(&broker.addr().to_string()),
        "cluster info: {info}"
    );
}

/// `rill produce --compression` takes each of Kafka's codecs, and what it wrote
/// reads back through `rill consume`.
#[test]
fn produce_with_every_codec() {
    let broker = TestBroker::start();
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let topic = format!("codec-{codec}");
        broker.rill_ok(&["topic", "create", &topic]);
        let input: String = (0..300)
            .map(|i| format!("{codec} record {i} {}\n", "r".repeat(i % 40)))
            .collect();
        broker.rill_stdin_ok(
            &["produce", &topic, "--compression", codec],
            input.as_bytes(),
        );
        let out = broker.rill_ok(&[
            "consume",
            &topic,
            "--from-beginning",
            "--max-messages",
            "300",
            "--timeout-ms",
            "5000",
        ]);
        assert_eq!(out, input, "{codec}");
    }
}

/// acks=0 is fire-and-forget, but `rill produce` still hands every record to the
/// network before it exits (on loopback they all arrive).
#[test]
fn acks_zero_records_arrive() {
    let broker = TestBroker::start();
    broker.rill_ok(&["topic", "create", "fire"]);
    // Several short runs: the risk is records still queued when the process exits.
    let mut input = String::new();
    for run in 0..5 {
        let chunk: String = (0..400).map(|i| format!("fire-{run}-{i}\n")).collect();
        broker.rill_stdin_ok(
            &["produce", "fire", "--acks", "0", "--compression", "zstd"],
            chunk.as_bytes(),
        );
        input.push_str(&chunk);
    }
    let out = broker.rill_ok(&[
        "consume",
        "fire",
        "--from-beginning",
        "--max-messages",
        "2000",
        "--timeout-ms",
        "5000",
    ]);
    assert_eq!(out, input);
}

/// A consumer at the end of a topic is answered as soon as a record arrives, not
/// after its idle timeout: the fetch long-poll returns on new data. Told from
/// the broker's request metrics, by events: the consumer's empty fetches (it
/// asks for a 3 s wait with --fetch-max-wait-ms) are each held their whole
/// wait, not answered at once; then a record produced while a fetch is held is
/// answered before that fetch's wait runs out. The wait is long so that a
/// producer slowed by a loaded machine still lands its record well inside it.
#[test]
fn fetch_long_poll_returns_when_data_arrives() {
    let metrics_port = support::free_tcp_port();
    // Without the transform supervisor, whose own fetches (of its internal
    // topics, each held 500 ms) would count in the same metrics.
    let broker = TestBroker::start_with(&[
        "--metrics",
        &format!("127.0.0.1:{metrics_port}"),
        "--no-transforms",
    ]);
    broker.rill_ok(&["topic", "create", "test"]);
    let fetch_metric = |name: &str, labels: &str| {
        support::metric(
            &support::scrape_metrics(metrics_port),
            name,
            &format!("api=\"fetch\"{labels}"),
        )
    };
    // Fetches answered so far, and those answered within `le` seconds.
    let answered = || fetch_metric("rill_request_duration_seconds_count", "");
    let answered_within = |le: &str| {
        fetch_metric(
            "rill_request_duration_seconds_bucket",
            &format!(",le=\"{le}\""),
        )
    };
    let taken = || fetch_metric("rill_requests_total", "");

    const IDLE_TIMEOUT_MS: u64 = 30_000;
    let started = Instant::now();
    // --log-level info makes the consumer report on stderr once it has resolved its
    // start position (the end), so the record below is produced after that point.
    let mut consumer = broker
        .client_command(&[
            "consume",
            "test",
            "--timeout-ms",
            &IDLE_TIMEOUT_MS.to_string(),
            "--max-messages",
            "1",
            "--fetch-max-wait-ms",
            "3000",
            "--log-level",
            "info",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn consumer");
    let stdout = read_to_end_on_thread(consumer.stdout.take().unwrap());
    let stderr = consumer.stderr.take().unwrap();
    let (ready_tx, ready_rx) = mpsc::channel();
    let stderr = thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("consuming from") {
                let _ = ready_tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    if ready_rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = consumer.kill();
        panic!(
            "consumer never reported its start position; stderr: {}",
            stderr.join().unwrap()
        );
    }
    // The producer starts now, so that once a fetch is held the record goes
    // in after one linger, not after a process start and a TLS handshake
    // (which, on a loaded machine, could land it in the last moments of the
    // held fetch's wait: then that fetch is answered at its end).
    let mut producer = broker
        .client_command(&["produce", "test"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn producer");
    let producer_out = read_to_end_on_thread(producer.stdout.take().unwrap());
    let producer_err = read_to_end_on_thread(producer.stderr.take().unwrap());
    // Wait until the broker answered two of the consumer's fetches at the end of
    // the empty topic: each was held for its whole 3 s wait.
    let wait_for = |what: &str, ok: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ok() {
            assert!(Instant::now() < deadline, "{what}: not within 30 s");
            thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for("two empty fetches answered", &|| answered() >= 2.0);
    assert_eq!(
        answered_within("2.5"),
        0.0,
        "the broker answered empty fetches before their 3 s wait ({} of {} answered)\n{}",
        answered_within("2.5"),
        answered(),
        support::scrape_metrics(metrics_port)
    );
    // The record goes in just after the broker took a new fetch, while it holds it.
    let before = answered();
    let taken_before = taken();
    wait_for("a new fetch held", &|| {
        taken() > taken_before && taken() > answered()
    });
    {
        let mut stdin = producer.stdin.take().unwrap();
        stdin
            .write_all(b"wake up\n")
            .expect("write to the producer");
        // Dropped: end of input, so the producer flushes and exits.
    }
    let produced = wait_bounded(&mut producer, Duration::from_secs(60)).unwrap_or_else(|| {
        let _ = producer.kill();
        panic!("producer did not exit");
    });
    let producer_out = String::from_utf8_lossy(&producer_out.join().unwrap()).into_owned();
    let producer_err = String::from_utf8_lossy(&producer_err.join().unwrap()).into_owned();
    assert!(
        produced.success(),
        "producer failed: {produced}; stdout: {producer_out}; stderr: {producer_err}"
    );

    let status = wait_bounded(&mut consumer, Duration::from_secs(60)).unwrap_or_else(|| {
        let _ = consumer.kill();
        panic!("consumer did not exit");
    });
    let elapsed = started.elapsed();
    let out = String::from_utf8(stdout.join().unwrap()).unwrap();
    let err = stderr.join().unwrap();
    assert!(status.success(), "consumer failed: {status}; stderr: {err}");
    assert_eq!(out, "wake up\n", "stderr: {err}");
    // Not a speed claim: exiting well before the 30 s idle timeout shows the consumer
    // returned because the record arrived, not because it gave up waiting.
    assert!(
        elapsed < Duration::from_secs(25),
        "consumer took {elapsed:?}: it did not return on new data"
    );
    // The fetch the record woke was answered before its wait ran out: the first
    // answered under 2.5 s. (Were the record appended in the last moment of a
    // wait, the broker would answer at its end: one fetch in hundreds.)
    assert!(
        answered() > before && answered_within("2.5") >= 1.0,
        "no fetch was answered before its 3 s wait: the record did not wake the held fetch\n{}",
        support::scrape_metrics(metrics_port)
    );
}

/// Asserts the bench's machine-readable last line (`records=N ...`) counts
/// exactly `records`.
fn assert_summary_counts(out: &str, records: u64) {
    let last = out.lines().last().unwrap_or_default();
    assert!(last.starts_with(&format!("records={records} ")), "{out}");
}

/// `rill bench produce --rate N` paces its sends: 3,000 records at 6,000/s
/// cannot finish before their schedule (half a second), and the rate it
/// reports stays at the target, not above it; the records are all there.
#[test]
fn bench_produce_at_a_fixed_rate_keeps_its_schedule() {
    let broker = TestBroker::start();
    let started = std::time::Instant::now();
    let out = broker.rill_ok(&[
        "bench",
        "produce",
        "--topic",
        "paced",
        "--records",
        "3000",
        "--rate",
        "6000",
        "--acks",
        "all",
    ]);
    let took = started.elapsed();
    let last = out.lines().last().unwrap_or_default();
    let field = |name: &str| -> f64 {
        last.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {last:?}"))
    };
    assert_eq!(field("records="), 3000.0, "{out}");
    assert!(
        field("records_per_s=") <= 6000.0 * 1.05,
        "paced at the target rate, not above: {last}"
    );
    assert!(
        field("p50_ms=") >= 0.0 && field("p99_ms=") >= field("p50_ms="),
        "{last}"
    );
    assert!(
        took >= std::time::Duration::from_millis(490),
        "took {took:?}"
    );
    let records = broker.read_to_end("paced");
    assert_eq!(records.len(), 3000);
}

/// `rill bench produce --warmup-records N` sends N records (split over the
/// producers) and waits for them before the clock starts: they reach the
/// topic, but the figures count only the measured records; the run says how
/// many warm-up records it sent.
#[test]
fn bench_produce_warm_up_records_are_sent_but_not_counted() {
    let broker = TestBroker::start();
    let out = broker.rill_ok(&[
        "bench",
        "produce",
        "--topic",
        "warmed",
        "--records",
        "900",
        "--warmup-records",
        "500",
        "--producers",
        "3",
        "--rate",
        "6000",
        "--acks",
        "all",
    ]);
    assert_summary_counts(&out, 900);
    assert!(out.contains("produce: 900 records"), "{out}");
    assert!(
        out.contains("warm-up: 500 records in"),
        "no warm-up line: {out}"
    );
    assert_eq!(broker.read_to_end("warmed").len(), 1400);
}

/// The warm-up holds up where its records are large or transactional: 100
/// records of 700 kB (70 MB, more than the producer's 64 MiB buffer memory
/// takes in one call) go a few at a time; a transactional producer's warm-up
/// records all end up committed in the topic (that they commit before the
/// clock starts is not told apart here); fewer warm-up records than
/// producers is refused, naming both options.
#[test]
fn bench_produce_warm_up_with_large_records_and_transactions() {
    let broker = TestBroker::start();
    let out = broker.rill_ok(&[
        "bench",
        "produce",
        "--topic",
        "warm-large",
        "--records",
        "2",
        "--record-size",
        "700000",
        "--warmup-records",
        "100",
        "--producers",
        "1",
    ]);
    assert_summary_counts(&out, 2);
    assert_eq!(broker.read_to_end("warm-large").len(), 102);

    let out = broker.rill_ok(&[
        "bench",
        "produce",
        "--topic",
        "warm-txn",
        "--records",
        "300",
        "--warmup-records",
        "200",
        "--producers",
        "2",
        "--transaction-interval-ms",
        "100",
        "--acks",
        "all",
    ]);
    assert!(out.contains("warm-up: 200 records in"), "{out}");
    assert_summary_counts(&out, 300);
    assert_eq!(broker.read_to_end("warm-txn").len(), 500);

    let refused = broker.rill(&[
        "bench",
        "produce",
        "--topic",
        "warm-few",
        "--warmup-records",
        "1",
        "--producers",
        "2",
    ]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(
        err.contains("--warmup-records 1 is fewer than --producers 2"),
        "{err}"
    );
}

/// `rill bench consume` with a consumer whose partition holds nothing: that
/// consumer waits in long polls while the other reads every record, and the
/// run ends once the records asked for arrived (the consumers still waiting
/// are woken, not awaited to the end of their polls); it reports the records
/// read, and says nothing of a topic holding fewer.
#[test]
fn bench_consume_ends_when_the_records_asked_for_arrived() {
    let broker = TestBroker::start();
    broker.rill_ok(&["topic", "create", "lopsided", "--partitions", "2"]);
    let lines: String = (0..300).map(|i| format!("record-{i:04}\n")).collect();
    broker.rill_stdin_ok(
        &["produce", "lopsided", "--partition", "0"],
        lines.as_bytes(),
    );
    let started = std::time::Instant::now();
    let run = broker.rill(&[
        "bench",
        "consume",
        "--topic",
        "lopsided",
        "--records",
        "300",
        "--consumers",
        "2",
    ]);
    let took = started.elapsed();
    let (out, err) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(run.status.success(), "{out}{err}");
    assert_summary_counts(&out, 300);
    assert!(out.contains("consume: 300 records, 0.0 MB"), "{out}");
    assert!(!err.contains("held only"), "{err}");
    // The idle consumer's loop ends only at the line or after 10 s without
    // data: one that is not woken at the line takes those 10 s.
    assert!(took < std::time::Duration::from_secs(8), "took {took:?}");
}

/// `rill bench produce --send-batch N` hands records to the producer N at a
/// time (`Producer::send_all`), the last chunk shorter, and still keeps a
/// `--rate` schedule: 2,500 records at 5,000/s in chunks of 300 all arrive, and
/// not before the last one was due (half a second).
#[test]
fn bench_produce_in_chunks_delivers_every_record_on_schedule() {
    let broker = TestBroker::start();
    let started = std::time::Instant::now();
    let out = broker.rill_ok(&[
        "bench",
        "produce",
        "--topic",
        "chunked",
        "--records",
        "2500",
        "--send-batch",
        "300",
        "--rate",
        "5000",
        "--acks",
        "all",
    ]);
    let took = started.elapsed();
    assert_summary_counts(&out, 2500);
    assert!(
        took >= std::time::Duration::from_millis(490),
        "took {took:?}"
    );
    assert_eq!(broker.read_to_end("chunked").len(), 2500);
    let refused = broker.rill(&["bench", "produce", "--send-batch", "0"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(err.contains("--send-batch must be at least 1"), "{err}");
}
