//! A cluster of real `rill broker` processes on loopback, sharing one RILL_HOME
//! (so they trust each other's development-CA certificates), each with its own
//! data directory and fixed port (so a restart comes back on the same address).
//!
//! Every wait is bounded; a failing test prints every broker's log.

#![allow(dead_code)]

use super::{
    BROKER_EXIT_TIMEOUT, BROKER_START_TIMEOUT, COMMAND_TIMEOUT, rill_command, run_bounded,
    wait_bounded,
};
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Session timeout the test clusters use (short, so failover is quick).
pub const TEST_SESSION_TIMEOUT_MS: &str = "1500";
/// Longest a test waits for the cluster to reach a described state.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(40);

pub struct ClusterBroker {
    pub id: i32,
    pub addr: SocketAddr,
    child: Option<Child>,
    args: Vec<String>,
    starts: u32,
}

pub struct TestCluster {
    pub dir: tempfile::TempDir,
    pub brokers: Vec<ClusterBroker>,
    /// Environment every `rill` client command of [`TestCluster::rill`] gets
    /// (e.g. `RILL_TLS_CERT` for a cluster with `--auth mtls`).
    pub client_env: Vec<(String, String)>,
}

/// How often a broker is started on a fresh port when its port was taken.
const PORT_ATTEMPTS: usize = 5;

fn free_port() -> SocketAddr {
    super::unused_udp_addr()
}

impl TestCluster {
    /// Starts broker 0 alone, then brokers 1.. with `--join` to broker 0, as the
    /// quickstart does. `extra` is passed to every broker.
    pub fn start_joined(n: usize, extra: &[&str]) -> TestCluster {
        TestCluster::start_joined_with(n, extra, |_| Vec::new())
    }

    /// As [`TestCluster::start_joined`], and broker `id` also gets `own(id)`
    /// (called again for a start retried on a fresh port, so ports it picks
    /// are fresh too).
    pub fn start_joined_with(
        n: usize,
        extra: &[&str],
        own: impl Fn(i32) -> Vec<String>,
    ) -> TestCluster {
        let dir = tempfile::Builder::new()
            .prefix("rill-cluster-")
            .tempdir()
            .expect("temp dir");
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        let mut c = TestCluster {
            dir,
            brokers: Vec::new(),
            client_env: Vec::new(),
        };
        for id in 0..n as i32 {
            // A port found free can be taken by another test before the broker
            // binds it: then start that broker again on another one.
            for attempt in 1..=PORT_ATTEMPTS {
                let addr = free_port();
                let mut args: Vec<String> = vec![
                    "--id".into(),
                    id.to_string(),
                    "--session-timeout-ms".into(),
                    TEST_SESSION_TIMEOUT_MS.into(),
                ];
                if id > 0 {
                    args.push("--join".into());
                    args.push(c.brokers[0].addr.to_string());
                }
                args.extend(extra.iter().map(|s| s.to_string()));
                args.extend(own(id));
                c.brokers.push(ClusterBroker {
                    id,
                    addr,
                    child: None,
                    args,
                    starts: 0,
                });
                if c.try_spawn(id as usize) {
                    break;
                }
                if attempt == PORT_ATTEMPTS || !c.last_start_lost_its_port(id as usize) {
                    panic!("broker {id} did not start\n{}", c.logs());
                }
                c.brokers.pop();
            }
        }
        c
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("data-{i}"))
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("broker-{i}.log"))
    }

    pub fn spawn(&mut self, i: usize) {
        if !self.try_spawn(i) {
            panic!("broker {i} did not start\n{}", self.logs());
        }
    }

    /// Whether broker `i`'s last start failed because its port was taken.
    fn last_start_lost_its_port(&self, i: usize) -> bool {
        let log = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
        let last = log
            .rsplit("==== harness: broker start #")
            .next()
            .unwrap_or("");
        last.contains("is already in use")
    }

    /// Starts broker `i`; whether it said it is listening (if not, it is reaped).
    fn try_spawn(&mut self, i: usize) -> bool {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .unwrap();
        let home = self.home();
        let data = self.data_dir(i);
        let b = &mut self.brokers[i];
        assert!(b.child.is_none(), "broker {i} already running");
        b.starts += 1;
        let mut marker = log.try_clone().unwrap();
        let _ = writeln!(marker, "==== harness: broker start #{} ====", b.starts);
        let mut child = rill_command(&home)
            .env("RUST_LOG", "info,openraft=warn")
            .arg("broker")
            .arg("--listen")
            .arg(b.addr.to_string())
            .arg("--data")
            .arg(&data)
            .args(&b.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn rill broker");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let mut sent = false;
            while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                if !sent && line.contains(" listening on ") {
                    sent = true;
                    let _ = tx.send(());
                }
                line.clear();
            }
        });
        b.child = Some(child);
        if rx.recv_timeout(BROKER_START_TIMEOUT).is_err() {
            if let Some(mut child) = b.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            return false;
        }
        true
    }

    /// Waits until `rill cluster info` shows every broker of the cluster alive.
    pub fn wait_all_live(&self) {
        let n = self.brokers.len();
        self.wait_for(&format!("{n} live brokers"), &["cluster", "info"], |out| {
            out.lines().filter(|l| l.contains(" yes")).count() == n
        });
    }

    /// Every broker's log, for a failure message.
    pub fn logs(&self) -> String {
        (0..self.brokers.len())
            .map(|i| {
                format!(
                    "--- broker {i} log ---\n{}\n",
                    std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
                )
            })
            .collect()
    }

    /// `host:port,host:port,...` of every broker.
    pub fn bootstrap(&self) -> String {
        self.brokers
            .iter()
            .map(|b| b.addr.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Runs `rill <args>` against the cluster (every broker as bootstrap).
    pub fn rill(&self, args: &[&str], input: &[u8]) -> Output {
        let mut cmd = rill_command(&self.home());
        cmd.env("RILL_BOOTSTRAP", self.bootstrap())
            .envs(self.client_env.iter().map(|(k, v)| (k, v)))
            .args(args);
        run_bounded(&mut cmd, input, COMMAND_TIMEOUT)
    }

    /// `rill <args>`, asserting success; stdout.
    pub fn rill_ok(&self, args: &[&str], input: &[u8]) -> String {
        let out = self.rill(args, input);
        assert!(
            out.status.success(),
            "`rill {}` failed: {}\nstdout: {}\nstderr: {}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Polls `rill <args>` until `ok(stdout)` holds (bounded by [`CONVERGE_TIMEOUT`]).
    pub fn wait_for(&self, what: &str, args: &[&str], ok: impl Fn(&str) -> bool) -> String {
        self.wait_for_within(CONVERGE_TIMEOUT, what, args, ok)
    }

    /// [`wait_for`](Self::wait_for) with its own bound.
    pub fn wait_for_within(
        &self,
        timeout: Duration,
        what: &str,
        args: &[&str],
        ok: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            let out = self.rill(args, b"");
            last = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if out.status.success() && ok(&String::from_utf8_lossy(&out.stdout)) {
                return String::from_utf8_lossy(&out.stdout).to_string();
            }
            thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "timed out waiting for {what} (`rill {}`); last output:\n{last}\n{}",
            args.join(" "),
            self.logs()
        );
    }

    #[allow(unsafe_code)]
    pub fn signal(&mut self, i: usize, signal: i32) {
        let child = self.brokers[i].child.as_ref().expect("running");
        let pid = child.id() as libc::pid_t;
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our
        // unreaped child, so it is not reused.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    /// SIGKILLs broker `i` and reaps it.
    pub fn kill(&mut self, i: usize) {
        self.signal(i, libc::SIGKILL);
        let mut child = self.brokers[i].child.take().unwrap();
        wait_bounded(&mut child, BROKER_EXIT_TIMEOUT).expect("killed broker exits");
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.brokers[i].child.is_some()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for b in &mut self.brokers {
            if let Some(mut c) = b.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

/// The `(leader, replicas, isr)` of partition 0 in `rill topic describe` output.
pub fn partition0(describe: &str) -> Option<(Option<i32>, Vec<i32>, Vec<i32>)> {
    partition_n(describe, 0)
}

/// The `(leader, replicas, isr)` of partition `n` in `rill topic describe` output.
pub fn partition_n(describe: &str, n: u32) -> Option<(Option<i32>, Vec<i32>, Vec<i32>)> {
    let tag = format!("Partition: {n}\t");
    let line = describe.lines().find(|l| l.contains(&tag))?;
    let field = |name: &str| -> Option<String> {
        line.split('\t')
            .find_map(|f| f.trim().strip_prefix(name).map(|v| v.trim().to_string()))
    };
    let list = |v: String| -> Vec<i32> {
        let mut l: Vec<i32> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
        l.sort_unstable();
        l
    };
    let leader = field("Leader:")?.parse().ok();
    Some((leader, list(field("Replicas:")?), list(field("Isr:")?)))
}
