//! The end-to-end test harness: real `rill` processes on loopback.
//!
//! [`TestBroker::start`] spawns `rill broker --listen 127.0.0.1:0 --data <tmp>/data`
//! with `RILL_HOME=<tmp>/home` (so the development CA is private to the test and
//! the real `~/.rill` is never touched), and waits — bounded by
//! [`BROKER_START_TIMEOUT`] — for the `rill broker <id> listening on <addr>` line on
//! stdout. Client commands run through [`TestBroker::rill`], which points them at
//! the broker (`RILL_BOOTSTRAP`) and the same `RILL_HOME`, and kills any command
//! that outlives [`COMMAND_TIMEOUT`]. The broker's stderr (its log) goes to a file
//! in the temp dir and is printed when a test fails. Dropping a `TestBroker` kills
//! the process.
//!
//! Every wait here is bounded; nothing asserts on elapsed time except where a
//! test says why.

#![allow(dead_code)] // each test file uses a different part of the harness

pub mod cluster;
pub mod netns;

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

/// Longest wait for a broker to print its `listening on` line.
pub const BROKER_START_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a client command may run before the harness kills it and fails the test.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for a broker to exit after SIGTERM / SIGKILL.
pub const BROKER_EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Poll interval while waiting for a child process.
const POLL: Duration = Duration::from_millis(10);

/// Path of the `rill` binary under test.
pub fn rill_bin() -> &'static str {
    env!("CARGO_BIN_EXE_rill")
}

/// A `rill` command with a clean environment: no inherited RILL_* or RUST_LOG.
pub fn rill_command(home: &Path) -> Command {
    let mut cmd = Command::new(rill_bin());
    cmd.env("RILL_HOME", home)
        .env_remove("RILL_BOOTSTRAP")
        .env_remove("RILL_TLS_CA")
        .env_remove("RUST_LOG");
    cmd
}

/// One broker process and its private directories.
pub struct TestBroker {
    child: Option<Child>,
    addr: SocketAddr,
    id: i32,
    /// Holds `home/` (RILL_HOME), `data/` and the broker logs; removed on drop.
    dir: tempfile::TempDir,
    /// Extra arguments given at start, reused on restart.
    extra_args: Vec<String>,
    /// Extra environment variables of the broker process, reused on restart.
    envs: Vec<(String, String)>,
    starts: u32,
}

impl TestBroker {
    /// Starts a broker on a free loopback port with fresh directories.
    pub fn start() -> TestBroker {
        TestBroker::start_with(&[])
    }

    /// Starts a broker with extra `rill broker` arguments.
    pub fn start_with(extra_args: &[&str]) -> TestBroker {
        TestBroker::start_with_env(extra_args, &[])
    }

    /// Starts a broker with extra arguments and environment variables.
    pub fn start_with_env(extra_args: &[&str], envs: &[(&str, &str)]) -> TestBroker {
        let dir = tempfile::Builder::new()
            .prefix("rill-e2e-")
            .tempdir()
            .expect("create a temp dir");
        std::fs::create_dir_all(dir.path().join("home")).expect("create RILL_HOME");
        let mut broker = TestBroker {
            child: None,
            addr: "127.0.0.1:0".parse().unwrap(),
            id: -1,
            dir,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            envs: envs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            starts: 0,
        };
        broker.spawn("127.0.0.1:0".parse().unwrap());
        broker
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The address the broker reported it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The broker id from the `listening on` line.
    pub fn id(&self) -> i32 {
        self.id
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("broker is running").id()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("broker.log")
    }

    fn spawn(&mut self, listen: SocketAddr) {
        assert!(self.child.is_none(), "broker already running");
        self.starts += 1;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open the broker log");
        let mut log_for_marker = log.try_clone().expect("clone log handle");
        let _ = writeln!(
            log_for_marker,
            "==== harness: broker start #{} ====",
            self.starts
        );
        let mut child = rill_command(&self.home())
            .arg("broker")
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--data")
            .arg(self.data_dir())
            .args(&self.extra_args)
            .envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn rill broker");
        let stdout = child.stdout.take().expect("piped stdout");
        let rx = watch_listening_line(stdout);
        self.child = Some(child);
        match rx.recv_timeout(BROKER_START_TIMEOUT) {
            Ok(line) => {
                let (id, addr) = parse_listening_line(&line)
                    .unwrap_or_else(|| panic!("cannot parse the broker's first line {line:?}"));
                self.id = id;
                self.addr = addr;
            }
            Err(e) => {
                let status = self.child.as_mut().unwrap().try_wait().ok().flatten();
                panic!(
                    "broker did not print `listening on` within {BROKER_START_TIMEOUT:?} ({e}); exit status: {status:?}\n--- broker log ---\n{}",
                    self.log()
                );
            }
        }
    }

    /// The broker's stderr so far (all starts).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Runs `rill <args>` against this broker; bounded by [`COMMAND_TIMEOUT`].
    pub fn rill(&self, args: &[&str]) -> Output {
        self.rill_stdin(args, b"")
    }

    /// Runs `rill <args>` with `input` on stdin.
    pub fn rill_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        let mut cmd = self.client_command(args);
        run_bounded(&mut cmd, input, COMMAND_TIMEOUT)
    }

    /// Runs `rill <args>`, asserts exit 0, returns stdout as text.
    pub fn rill_ok(&self, args: &[&str]) -> String {
        let out = self.rill(args);
        assert_success(&out, args, self);
        String::from_utf8(out.stdout).expect("utf-8 stdout")
    }

    /// Like [`rill_ok`](Self::rill_ok) with stdin.
    pub fn rill_stdin_ok(&self, args: &[&str], input: &[u8]) -> String {
        let out = self.rill_stdin(args, input);
        assert_success(&out, args, self);
        String::from_utf8(out.stdout).expect("utf-8 stdout")
    }

    /// A `rill <args>` command pointed at this broker, not yet started.
    pub fn client_command(&self, args: &[&str]) -> Command {
        let mut cmd = rill_command(&self.home());
        cmd.env("RILL_BOOTSTRAP", self.addr.to_string()).args(args);
        cmd
    }

    /// Sends SIGTERM and waits (bounded) for the broker to exit; returns its status.
    pub fn sigterm(&mut self) -> ExitStatus {
        self.signal(libc::SIGTERM)
    }

    /// Sends SIGKILL and waits (bounded) for the broker to die.
    pub fn sigkill(&mut self) -> ExitStatus {
        self.signal(libc::SIGKILL)
    }

    #[allow(unsafe_code)]
    fn signal(&mut self, signal: libc::c_int) -> ExitStatus {
        let mut child = self.child.take().expect("broker is running");
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child,
        // which has not been reaped yet (we hold its Child), so the pid is not reused.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal}) failed");
        match wait_bounded(&mut child, BROKER_EXIT_TIMEOUT) {
            Some(status) => status,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "broker did not exit within {BROKER_EXIT_TIMEOUT:?} after signal {signal}\n--- broker log ---\n{}",
                    self.log()
                );
            }
        }
    }

    /// Whether the broker process is still running.
    pub fn is_alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    /// Starts the broker again on the same data dir, RILL_HOME and port.
    /// The previous process must have exited (sigterm/sigkill).
    pub fn restart(&mut self) {
        let addr = self.addr;
        self.spawn(addr);
        assert_eq!(
            self.addr, addr,
            "restarted broker should listen on the same address"
        );
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if thread::panicking() {
            let log = self.log();
            let tail: String = {
                let lines: Vec<&str> = log.lines().collect();
                let from = lines.len().saturating_sub(200);
                lines[from..].join("\n")
            };
            eprintln!(
                "--- broker log (last 200 lines, {}) ---\n{tail}\n--- end of broker log ---",
                self.log_path().display()
            );
        }
    }
}

/// Reads the broker's stdout on a thread: the first `listening on` line is sent on
/// the returned channel; later output is drained so the broker never blocks.
fn watch_listening_line(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let mut sent = false;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if !sent && line.contains(" listening on ") {
                        sent = true;
                        let _ = tx.send(line.trim_end().to_string());
                    }
                }
            }
        }
    });
    rx
}

/// Parses `rill broker <id> listening on <addr> (data: <dir>)`.
pub fn parse_listening_line(line: &str) -> Option<(i32, SocketAddr)> {
    let rest = line.strip_prefix("rill broker ")?;
    let (id, rest) = rest.split_once(" listening on ")?;
    let addr = rest.split_whitespace().next()?;
    Some((id.parse().ok()?, addr.parse().ok()?))
}

/// Waits for `child` to exit, at most `timeout`; `None` if it is still running.
pub fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(POLL);
    }
}

/// Runs a command with `input` on stdin and collects its output; kills it and
/// panics (with what it printed so far) if it outlives `timeout`.
pub fn run_bounded(cmd: &mut Command, input: &[u8], timeout: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rill");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.to_vec();
    let writer = thread::spawn(move || {
        // A command may exit before reading everything (e.g. on an error): ignore EPIPE.
        let _ = stdin.write_all(&input);
    });
    let stdout = read_to_end_on_thread(child.stdout.take().expect("piped stdout"));
    let stderr = read_to_end_on_thread(child.stderr.take().expect("piped stderr"));
    let status = wait_bounded(&mut child, timeout);
    let status = match status {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            let out = stdout.join().unwrap();
            let err = stderr.join().unwrap();
            panic!(
                "command {cmd:?} did not finish within {timeout:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            );
        }
    };
    let _ = writer.join();
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Collects a pipe to its end on a thread.
pub fn read_to_end_on_thread(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        buf
    })
}

/// Collects a pipe's lines, as they arrive, on a thread.
pub fn collect_lines_on_thread(pipe: impl Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

/// Asserts a command exited 0, printing its output (and the broker log) otherwise.
pub fn assert_success(out: &Output, args: &[&str], broker: &TestBroker) {
    assert!(
        out.status.success(),
        "`rill {}` failed with {}\nstdout: {}\nstderr: {}\n--- broker log ---\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        broker.log()
    );
}

/// The stderr of a failed command, asserting it failed with exactly one `error:` line.
pub fn single_error_line(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected failure, got success; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "expected one `error:` line on stderr, got: {stderr:?}"
    );
    errors[0].to_string()
}

/// A UDP port on loopback that nothing listens on (bound then released).
pub fn unused_udp_addr() -> SocketAddr {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    sock.local_addr().unwrap()
}

/// Writes a file in a fresh temp dir and returns (dir guard, path).
pub fn temp_file(name: &str, contents: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("rill-e2e-")
        .tempdir()
        .expect("temp dir");
    let path = dir.path().join(name);
    let mut f = File::create(&path).expect("create file");
    f.write_all(contents.as_bytes()).expect("write file");
    (dir, path)
}

// ------------------------------------------------------------------ read-backs

/// Longest a read to the end of a topic may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A rill-client connected to `bootstrap`, trusting the development CA of `home`.
pub async fn connect_client(bootstrap: &str, home: &Path) -> rill_client::Client {
    let mut config = rill_client::ClientConfig::new(bootstrap.to_string());
    config.tls = rill_net::ClientTls::Dev {
        home: home.to_path_buf(),
    };
    rill_client::Client::connect(config)
        .await
        .expect("connect a client")
}

/// Every record of `topic` (all partitions) from the beginning to the log end
/// offsets ListOffsets(latest) reports at the call: everything the consumer
/// delivers on the way is returned, a duplicate included (unlike a read that
/// stops after N records, which cannot see an (N+1)th). Bounded by [`READ_TIMEOUT`].
pub async fn read_all(
    client: &rill_client::Client,
    topic: &str,
) -> Vec<rill_client::ConsumerRecord> {
    read_all_as(client, topic, rill_client::Isolation::ReadUncommitted).await
}

/// As [`read_all`], as a `read_committed` reader: only committed
/// transactions' records (waiting for the transactions open now to end).
pub async fn read_all_committed(
    client: &rill_client::Client,
    topic: &str,
) -> Vec<rill_client::ConsumerRecord> {
    read_all_as(client, topic, rill_client::Isolation::ReadCommitted).await
}

async fn read_all_as(
    client: &rill_client::Client,
    topic: &str,
    isolation: rill_client::Isolation,
) -> Vec<rill_client::ConsumerRecord> {
    use rill_client::{ConsumerConfig, OffsetSpec, TopicPartition};
    let n = client.partition_count(topic).await.unwrap();
    let tps: Vec<TopicPartition> = (0..n).map(|p| TopicPartition::new(topic, p)).collect();
    let ends = client.list_offsets(&tps, OffsetSpec::Latest).await.unwrap();
    let mut consumer = client
        .consumer(ConsumerConfig {
            isolation,
            ..ConsumerConfig::default()
        })
        .unwrap();
    consumer.assign(tps.clone());
    consumer.seek_to_beginning(&tps).await.unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + READ_TIMEOUT;
    loop {
        let mut done = true;
        for (tp, end) in &ends {
            if consumer.position(tp).await.unwrap() < *end {
                done = false;
            }
        }
        if done {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "reading {topic} to its end {ends:?} took over {READ_TIMEOUT:?}"
        );
        out.extend(consumer.poll(Duration::from_millis(200)).await.unwrap());
    }
}

/// [`read_all`] from a blocking test: connects to `bootstrap` with `home`'s CA.
pub fn read_to_end(bootstrap: &str, home: &Path, topic: &str) -> Vec<rill_client::ConsumerRecord> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = connect_client(bootstrap, home).await;
        read_all(&client, topic).await
    })
}

impl TestBroker {
    /// [`read_to_end`] on this broker.
    pub fn read_to_end(&self, topic: &str) -> Vec<rill_client::ConsumerRecord> {
        read_to_end(&self.addr.to_string(), &self.home(), topic)
    }
}

/// The values of `records` as text (a null value as `<null>`).
pub fn values_of(records: &[rill_client::ConsumerRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| {
            r.value
                .as_deref()
                .map_or("<null>".into(), |v| String::from_utf8_lossy(v).into_owned())
        })
        .collect()
}

/// Asserts `got` holds each of `expected` exactly once and nothing else, naming
/// the first duplicates, missing and unexpected values when it does not.
pub fn assert_each_exactly_once(got: &[String], expected: &[String], what: &str) {
    use std::collections::BTreeMap;
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for v in expected {
        *counts.entry(v.as_str()).or_default() -= 1;
    }
    for v in got {
        *counts.entry(v.as_str()).or_default() += 1;
    }
    let expected_set: std::collections::HashSet<&str> =
        expected.iter().map(String::as_str).collect();
    let duplicated: Vec<(&str, i64)> = counts
        .iter()
        .filter(|(v, n)| **n > 0 && expected_set.contains(*v))
        .map(|(v, n)| (*v, *n + 1))
        .take(5)
        .collect();
    let missing: Vec<&str> = counts
        .iter()
        .filter(|(_, n)| **n < 0)
        .map(|(v, _)| *v)
        .take(5)
        .collect();
    let unexpected: Vec<&str> = counts
        .iter()
        .filter(|(v, n)| **n > 0 && !expected_set.contains(*v))
        .map(|(v, _)| *v)
        .take(5)
        .collect();
    assert!(
        duplicated.is_empty() && missing.is_empty() && unexpected.is_empty(),
        "{what}: {} records for {} expected; read more than once (value, times): {duplicated:?}; \
         missing: {missing:?}; unexpected: {unexpected:?}",
        got.len(),
        expected.len()
    );
    assert_eq!(got.len(), expected.len(), "{what}: record count");
}

/// Reads `topic` to its end and asserts it holds exactly `expected`, in this
/// order (one partition), each record once.
pub fn assert_topic_is(bootstrap: &str, home: &Path, topic: &str, expected: &[String]) {
    let records = read_to_end(bootstrap, home, topic);
    let got = values_of(&records);
    assert_each_exactly_once(&got, expected, topic);
    assert!(
        got == expected,
        "{topic}: the records are not in produce order"
    );
    let offsets: Vec<i64> = records.iter().map(|r| r.offset.0).collect();
    assert!(
        offsets.iter().enumerate().all(|(i, o)| *o == i as i64),
        "{topic}: offsets are not 0..{}",
        records.len()
    );
}

// ------------------------------------------------------------------ metrics

/// A TCP port on loopback that nothing listens on (bound then released).
pub fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The Prometheus text of a broker's `--metrics` endpoint on `port`.
pub fn scrape_metrics(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to /metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read /metrics");
    resp.split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_string())
}

/// The value of the sample `name{labels}` (labels as rendered, e.g.
/// `api="fetch",le="0.5"`) in Prometheus text; 0 if absent.
pub fn metric(text: &str, name: &str, labels: &str) -> f64 {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

// ------------------------------------------------------------------ group commits

/// Committed offsets per (topic, partition).
pub type Committed = std::collections::BTreeMap<(String, u32), i64>;

/// Watches a consumer group's committed offsets for as long as it lives: a
/// thread runs `rill group describe GROUP` (each run bounded) again and again,
/// every 100 ms, and notes the first time a partition's committed offset is
/// lower than one it saw before. [`finish`](Self::finish) stops it and fails
/// the test on such a step back. A describe that fails (e.g. while the
/// coordinator moves) is skipped.
pub struct CommitWatcher {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<thread::JoinHandle<(Committed, Option<String>)>>,
}

impl CommitWatcher {
    /// Starts watching `group` through `bootstrap`, trusting `home`'s CA.
    pub fn start(home: &Path, bootstrap: &str, group: &str) -> CommitWatcher {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (home, bootstrap, group) =
            (home.to_path_buf(), bootstrap.to_string(), group.to_string());
        let stopped = stop.clone();
        let thread = thread::spawn(move || {
            let mut highest = Committed::new();
            let mut went_back = None;
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let mut cmd = rill_command(&home);
                cmd.env("RILL_BOOTSTRAP", &bootstrap)
                    .args(["group", "describe", &group]);
                let out = run_bounded(&mut cmd, b"", COMMAND_TIMEOUT);
                let text = String::from_utf8_lossy(&out.stdout);
                for (tp, c) in committed_offsets(&text, &group) {
                    let h = highest.entry(tp.clone()).or_insert(c);
                    if c < *h && went_back.is_none() {
                        went_back = Some(format!(
                            "committed offset of {}-{} went back from {h} to {c}:\n{text}",
                            tp.0, tp.1
                        ));
                    }
                    *h = c;
                }
                thread::sleep(Duration::from_millis(100));
            }
            (highest, went_back)
        });
        CommitWatcher {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops watching; fails if a committed offset ever went back. Returns the
    /// last committed offsets seen.
    pub fn finish(mut self) -> Committed {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (highest, went_back) = self.thread.take().unwrap().join().expect("the watcher ran");
        if let Some(e) = went_back {
            panic!("{e}");
        }
        highest
    }
}

impl Drop for CommitWatcher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The committed offsets in `rill group describe GROUP` output: its table rows
/// `GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG MEMBER` (a partition
/// without a commit shows `-` and is left out).
pub fn committed_offsets(describe: &str, group: &str) -> Committed {
    describe
        .lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() != 7 || cols[0] != group {
                return None;
            }
            Some((
                (cols[1].to_string(), cols[2].parse().ok()?),
                cols[3].parse().ok()?,
            ))
        })
        .collect()
}

/// xorshift64*: a seeded, reproducible fault schedule.
pub struct Rng(pub u64);

impl Rng {
    /// A seed from `RILL_FAULT_SEED`, else from the clock (never zero).
    pub fn seed_from_env() -> u64 {
        std::env::var("RILL_FAULT_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            })
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
