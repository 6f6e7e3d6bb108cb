//! A private network for fault tests: network namespaces, veth pairs and a
//! Linux bridge, with faults applied by nftables.
//!
//! [`NetLab::new`] makes, all named `rill-<pid>-<n>-*`:
//! - a "switch" namespace holding the bridge `br0`,
//! - one namespace per node (brokers, then the client), each with loopback up
//!   and `eth0` (a veth whose peer is a port of the bridge) at
//!   `10.<a>.<b>.<10+i>/24`, the subnet picked per lab.
//!
//! Nothing is added to the root namespace. Faults are nftables rules in a table
//! `inet rillfault` of a node's namespace (loopback always passes);
//! [`NetLab::heal`] deletes the tables. Dropping the lab kills every process
//! left in its namespaces and deletes them, also when the test panics; a new
//! lab first deletes the namespaces of labs whose test process was killed.
//!
//! [`NetCluster`] runs `rill broker` processes, one per broker namespace, bound
//! to their namespace's address, sharing one RILL_HOME (so one development CA;
//! the broker puts its listen address in its certificate).

#![allow(dead_code)]

use super::{BROKER_EXIT_TIMEOUT, BROKER_START_TIMEOUT, rill_bin, wait_bounded};
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Session timeout of the test brokers (as tests/support/cluster.rs).
pub const TEST_SESSION_TIMEOUT_MS: &str = super::cluster::TEST_SESSION_TIMEOUT_MS;
/// The port every broker listens on (each has its own address).
pub const BROKER_PORT: u16 = 9092;

static LABS: AtomicU32 = AtomicU32::new(0);

/// Why the harness cannot run here, or `Ok` when it can.
pub fn check_support() -> Result<(), String> {
    if !is_root() {
        return Err("network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)".into());
    }
    for (tool, args) in [("ip", &["-V"][..]), ("nft", &["--version"][..])] {
        match Command::new(tool).args(args).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                return Err(format!(
                    "`{tool}` failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            Err(e) => {
                return Err(format!(
                    "`{tool}` is not available ({e}); install Debian's iproute2 and nftables"
                ));
            }
        }
    }
    Ok(())
}

#[allow(unsafe_code)]
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Skips (returns `true` after printing why) when the harness cannot run,
/// unless `CI` is set: then it panics, since in CI it must run.
pub fn skip_unless_supported(test: &str) -> bool {
    let why = check_support().and_then(|()| {
        // Probe: can a namespace actually be made?
        // (Named per call: tests of one binary probe at the same time.)
        let n = LABS.fetch_add(1, Ordering::Relaxed);
        let name = format!("rill-{}-{n}-probe", std::process::id());
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .map_err(|e| format!("`ip netns add`: {e}"))?;
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`ip netns add` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    });
    match why {
        Ok(()) => false,
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!("{test}: cannot run (and CI is set, so it must): {why}")
        }
        Err(why) => {
            println!("SKIPPED {test}: {why}");
            eprintln!("SKIPPED {test}: {why}");
            true
        }
    }
}

fn run(args: &[&str]) -> Result<(), String> {
    run_input(args, None)
}

fn run_input(args: &[&str], input: Option<&str>) -> Result<(), String> {
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..])
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("`{}`: {e}", args.join(" ")))?;
    if let Some(input) = input {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            input.map_or(String::new(), |i| format!("\ninput:\n{i}"))
        ))
    }
}

/// One host of the lab: its namespace and address.
#[derive(Debug, Clone)]
pub struct Node {
    pub ns: String,
    pub ip: Ipv4Addr,
}

/// nftables rules of one namespace (beyond the loopback accepts).
#[derive(Debug, Default, Clone)]
struct Rules {
    input: Vec<String>,
    output: Vec<String>,
}

pub struct NetLab {
    pub prefix: String,
    pub switch: String,
    /// Brokers then the client.
    pub nodes: Vec<Node>,
    made: Vec<String>,
    rules: BTreeMap<usize, Rules>,
}

impl NetLab {
    /// A bridge and `hosts` namespaces on it (brokers 0..hosts-1 and one
    /// client, which is the last node).
    pub fn new(brokers: usize) -> Result<NetLab, String> {
        reap_stale();
        let n = LABS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let prefix = format!("rill-{pid}-{n}-");
        // A subnet per lab (they never meet: every lab has its own switch).
        let a = 200 + (pid % 50) as u8;
        let b = ((pid / 50) as u8).wrapping_add(n as u8);
        let mut lab = NetLab {
            switch: format!("{prefix}sw"),
            prefix: prefix.clone(),
            nodes: Vec::new(),
            made: Vec::new(),
            rules: BTreeMap::new(),
        };
        let sw = lab.switch.clone();
        lab.add_ns(&sw)?;
        run(&["ip", "-n", &sw, "link", "set", "lo", "up"])?;
        run(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        run(&["ip", "-n", &sw, "link", "set", "br0", "up"])?;
        for i in 0..=brokers {
            let ns = if i < brokers {
                format!("{prefix}b{i}")
            } else {
                format!("{prefix}client")
            };
            let ip = Ipv4Addr::new(10, a, b, 10 + i as u8);
            lab.add_ns(&ns)?;
            let port = format!("v{i}");
            run(&[
                "ip", "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ])?;
            run(&["ip", "-n", &sw, "link", "set", &port, "master", "br0"])?;
            run(&["ip", "-n", &sw, "link", "set", &port, "up"])?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            run(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                "eth0",
            ])?;
            run(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            lab.nodes.push(Node { ns, ip });
        }
        Ok(lab)
    }

    fn add_ns(&mut self, name: &str) -> Result<(), String> {
        run(&["ip", "netns", "add", name])?;
        self.made.push(name.to_string());
        Ok(())
    }

    pub fn client(&self) -> &Node {
        self.nodes.last().unwrap()
    }

    pub fn broker_count(&self) -> usize {
        self.nodes.len() - 1
    }

    fn set(&self, nodes: &[usize]) -> String {
        let ips: Vec<String> = nodes
            .iter()
            .map(|&i| self.nodes[i].ip.to_string())
            .collect();
        format!("{{ {} }}", ips.join(", "))
    }

    /// Node `i` loses every packet in and out (but loopback).
    pub fn isolate(&mut self, i: usize) {
        let r = self.rules.entry(i).or_default();
        r.input.push("drop".into());
        r.output.push("drop".into());
    }

    /// Node `a` and the `others` no longer reach each other (both directions;
    /// everyone else still reaches `a`).
    pub fn cut(&mut self, a: usize, others: &[usize]) {
        if others.is_empty() {
            return;
        }
        let set = self.set(others);
        let r = self.rules.entry(a).or_default();
        r.input.push(format!("ip saddr {set} drop"));
        r.output.push(format!("ip daddr {set} drop"));
    }

    /// Packets from `from` to `to` are dropped; `to` to `from` pass.
    pub fn drop_one_way(&mut self, from: usize, to: usize) {
        let ip = self.nodes[to].ip;
        self.rules
            .entry(from)
            .or_default()
            .output
            .push(format!("ip daddr {ip} drop"));
    }

    /// `percent`% of node `i`'s packets, in and out, are dropped at random.
    pub fn loss(&mut self, i: usize, percent: u32) {
        let rule = format!("numgen random mod 100 < {percent} drop");
        let r = self.rules.entry(i).or_default();
        r.input.push(rule.clone());
        r.output.push(rule);
    }

    /// Applies the rules added since the last heal (replacing each touched
    /// namespace's table as one nftables transaction).
    pub fn apply(&self) -> Result<(), String> {
        for (i, r) in &self.rules {
            let ns = &self.nodes[*i].ns;
            let script = format!(
                "table inet rillfault\n\
                 delete table inet rillfault\n\
                 table inet rillfault {{\n\
                 \tchain input {{\n\t\ttype filter hook input priority 0; policy accept;\n\
                 \t\tiifname \"lo\" accept\n{}\t}}\n\
                 \tchain output {{\n\t\ttype filter hook output priority 0; policy accept;\n\
                 \t\toifname \"lo\" accept\n{}\t}}\n\
                 }}\n",
                r.input
                    .iter()
                    .map(|l| format!("\t\t{l}\n"))
                    .collect::<String>(),
                r.output
                    .iter()
                    .map(|l| format!("\t\t{l}\n"))
                    .collect::<String>(),
            );
            run_input(
                &["ip", "netns", "exec", ns, "nft", "-f", "-"],
                Some(&script),
            )?;
        }
        Ok(())
    }

    /// Removes every fault (deletes the `rillfault` tables).
    pub fn heal(&mut self) {
        for (i, _) in std::mem::take(&mut self.rules) {
            let ns = &self.nodes[i].ns;
            let _ = run_input(
                &["ip", "netns", "exec", ns, "nft", "-f", "-"],
                Some("table inet rillfault\ndelete table inet rillfault\n"),
            );
        }
    }

    /// The faults in force, one line per namespace (for the history).
    pub fn describe(&self) -> String {
        self.rules
            .iter()
            .map(|(i, r)| {
                format!(
                    "node {i} ({}): in [{}] out [{}]",
                    self.nodes[*i].ip,
                    r.input.join("; "),
                    r.output.join("; ")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Runs `f` on a new thread whose network namespace is `ns` (threads it
    /// spawns, e.g. a tokio runtime's workers, and processes it starts inherit
    /// it); a panic in `f` is resumed here.
    pub fn run_in<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{ns}");
        let handle = thread::Builder::new()
            .name(format!("in-{ns}"))
            .spawn(move || {
                enter_netns(&path);
                f()
            })
            .unwrap();
        match handle.join() {
            Ok(v) => v,
            Err(e) => std::panic::resume_unwind(e),
        }
    }
}

/// Deletes the namespaces (and kills their processes) of labs whose test
/// process is gone: one killed by a signal never ran its `Drop`.
fn reap_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix("rill-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
            for p in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(p) = p.parse::<i32>() {
                    kill_pid(p, libc::SIGCONT);
                    kill_pid(p, libc::SIGKILL);
                }
            }
        }
        let _ = run(&["ip", "netns", "del", name]);
        eprintln!("NetLab: deleted {name}, left by process {pid} which is gone");
    }
}

/// Moves the calling thread into the network namespace at `path`.
#[allow(unsafe_code)]
pub fn enter_netns(path: &str) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: setns on a valid namespace fd; it only changes this thread's
    // network namespace.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns({path}): {}", std::io::Error::last_os_error());
}

#[allow(unsafe_code)]
fn kill_pid(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, sig);
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        let me = std::process::id().to_string();
        for ns in self.made.iter().rev() {
            // Whatever still runs in the namespace (brokers, clients) dies.
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if pid != me
                        && let Ok(pid) = pid.parse::<i32>()
                    {
                        kill_pid(pid, libc::SIGCONT);
                        kill_pid(pid, libc::SIGKILL);
                    }
                }
            }
        }
        for ns in self.made.iter().rev() {
            if let Err(e) = run(&["ip", "netns", "del", ns]) {
                eprintln!("NetLab: {e}");
            }
        }
    }
}

/// One broker of a [`NetCluster`].
pub struct NetBroker {
    pub id: i32,
    pub node: usize,
    pub addr: SocketAddr,
    child: Option<Child>,
    starts: u32,
    pub paused: bool,
}

/// `rill broker` processes, broker `i` in the lab's namespace `i`.
pub struct NetCluster {
    pub dir: tempfile::TempDir,
    pub brokers: Vec<NetBroker>,
    ns: Vec<String>,
    extra: Vec<String>,
}

impl NetCluster {
    /// Starts broker 0, then the others with `--join` to it.
    pub fn start(lab: &NetLab, extra: &[&str]) -> NetCluster {
        let dir = tempfile::Builder::new()
            .prefix("rill-netfault-")
            .tempdir()
            .expect("temp dir");
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        let mut c = NetCluster {
            dir,
            brokers: Vec::new(),
            ns: Vec::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for i in 0..lab.broker_count() {
            c.ns.push(lab.nodes[i].ns.clone());
            c.brokers.push(NetBroker {
                id: i as i32,
                node: i,
                addr: SocketAddr::new(lab.nodes[i].ip.into(), BROKER_PORT),
                child: None,
                starts: 0,
                paused: false,
            });
            c.spawn(i);
        }
        c
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("data-{i}"))
    }

    pub fn log_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("broker-{i}.log"))
    }

    pub fn bootstrap(&self) -> String {
        self.brokers
            .iter()
            .map(|b| b.addr.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts broker `i` (in its namespace) and waits for its `listening on`.
    pub fn spawn(&mut self, i: usize) {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .unwrap();
        let home = self.home();
        let data = self.data_dir(i);
        let join = self.brokers[0].addr.to_string();
        let b = &mut self.brokers[i];
        assert!(b.child.is_none(), "broker {i} already running");
        b.starts += 1;
        let mut marker = log.try_clone().unwrap();
        let _ = writeln!(marker, "==== harness: broker start #{} ====", b.starts);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns[i], rill_bin()])
            .env("RILL_HOME", &home)
            .env_remove("RILL_BOOTSTRAP")
            .env_remove("RILL_TLS_CA")
            .env("RUST_LOG", "info,openraft=warn")
            .arg("broker")
            .args(["--id", &b.id.to_string()])
            .args(["--listen", &b.addr.to_string()])
            .arg("--data")
            .arg(&data)
            .args(["--session-timeout-ms", TEST_SESSION_TIMEOUT_MS])
            .arg("--allow-anonymous");
        if i > 0 {
            cmd.args(["--join", &join]);
        }
        cmd.args(&self.extra);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn ip netns exec rill broker");
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
        b.paused = false;
        if rx.recv_timeout(BROKER_START_TIMEOUT).is_err() {
            let log = self.log_tail(i, 60);
            panic!("broker {i} did not start within {BROKER_START_TIMEOUT:?}\n{log}");
        }
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.brokers[i].child.is_some()
    }

    fn pid(&self, i: usize) -> i32 {
        self.brokers[i].child.as_ref().expect("running").id() as i32
    }

    /// SIGKILLs broker `i` and reaps it.
    pub fn kill(&mut self, i: usize) {
        kill_pid(self.pid(i), libc::SIGKILL);
        let mut child = self.brokers[i].child.take().unwrap();
        wait_bounded(&mut child, BROKER_EXIT_TIMEOUT).expect("killed broker exits");
        self.brokers[i].paused = false;
    }

    pub fn pause(&mut self, i: usize) {
        kill_pid(self.pid(i), libc::SIGSTOP);
        self.brokers[i].paused = true;
    }

    pub fn resume(&mut self, i: usize) {
        kill_pid(self.pid(i), libc::SIGCONT);
        self.brokers[i].paused = false;
    }

    /// Whether broker `i`'s process exited by itself (it should not).
    pub fn exited(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        self.brokers[i]
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The last `n` lines of broker `i`'s log.
    pub fn log_tail(&self, i: usize, n: usize) -> String {
        let log = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let from = lines.len().saturating_sub(n);
        format!(
            "--- broker {i} log (last {n} lines of {}) ---\n{}\n",
            self.log_path(i).display(),
            lines[from..].join("\n")
        )
    }
}

impl Drop for NetCluster {
    fn drop(&mut self) {
        for b in &mut self.brokers {
            if let Some(mut c) = b.child.take() {
                kill_pid(c.id() as i32, libc::SIGCONT);
                let _ = c.kill();
                let _ = wait_bounded(&mut c, Duration::from_secs(10));
            }
        }
        if thread::panicking() {
            for i in 0..self.brokers.len() {
                eprintln!("{}", self.log_tail(i, 150));
            }
        }
        // `RILL_FAULT_LOGS=DIR` keeps every broker's whole log (to read what a
        // replayed seed did).
        if let Some(dir) = std::env::var_os("RILL_FAULT_LOGS") {
            let dir = PathBuf::from(dir);
            let _ = std::fs::create_dir_all(&dir);
            for i in 0..self.brokers.len() {
                let to = dir.join(format!("broker-{i}.log"));
                match std::fs::copy(self.log_path(i), &to) {
                    Ok(_) => eprintln!("broker {i}'s log kept in {}", to.display()),
                    Err(e) => eprintln!("could not keep broker {i}'s log in {}: {e}", to.display()),
                }
            }
        }
    }
}
