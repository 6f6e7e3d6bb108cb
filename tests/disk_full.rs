//! A full data disk (issue 21), through the `rill` binary: the broker's data
//! directory on a 48 MiB tmpfs that the test mounts (root only; skipped with the
//! reason printed elsewhere, never under CI).
//!
//! Produce fills the disk until the broker refuses records with STORAGE_ERROR
//! naming the partition (its free-space reserve, `min_free_bytes`); every
//! acknowledged record is still served; the metadata quorum keeps writing (a
//! topic is created on the full disk); when something else takes the reserve
//! too, a metadata write waits for space instead of stopping the Raft core, and
//! completes once space returns; `rill topic delete` frees space, and records
//! are accepted again, all without a restart.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rill_client::{Acks, ProducerConfig, ProducerRecord};
use rill_proto::wire::ErrorCode;
use support::TestBroker;

const TMPFS_SIZE: &str = "48m";
const RECORD_BYTES: usize = 64 * 1024;

/// A tmpfs mounted at a path, lazily unmounted when dropped (also when the
/// test fails and the broker still holds files there).
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` at `at`; `Err` says why it could not.
    fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Tmpfs {
    /// [`Tmpfs::mount`], or `None` after printing why the test is skipped
    /// (outside CI; under `CI` a test that cannot mount fails).
    fn mount_or_skip(at: &Path, size: &str) -> Option<Tmpfs> {
        match Tmpfs::mount(at, size) {
            Ok(t) => Some(t),
            Err(why) if std::env::var_os("CI").is_none() => {
                println!("SKIPPED: the full-disk test needs to mount a tmpfs (root): {why}");
                None
            }
            Err(why) => {
                panic!("the full-disk test must run in CI, and cannot mount a tmpfs: {why}")
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Fills what is left of the filesystem at `dir` with one file; returns its path.
fn fill_up(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("ballast");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xabu8; 256 * 1024];
    loop {
        if f.write_all(&chunk).is_err() {
            break;
        }
    }
    // The last partial chunk may leave a few bytes: take them too.
    let mut small = vec![0u8; 4096];
    while small.len() >= 1 {
        if f.write_all(&small).is_err() {
            small.truncate(small.len() / 2);
        }
    }
    path
}

#[test]
fn a_full_disk_refuses_records_clearly_keeps_serving_and_recovers_without_a_restart() {
    let mut broker = TestBroker::start();
    // The data directory moves onto a small tmpfs: stop, mount over it (an empty
    // directory: the broker starts as a fresh one-broker cluster), start again.
    assert!(broker.sigterm().success());
    let data = broker.data_dir();
    let Some(_tmpfs) = Tmpfs::mount_or_skip(&data, TMPFS_SIZE) else {
        return;
    };
    broker.restart();
    broker.rill_ok(&[
        "topic",
        "create",
        "fill",
        "--config",
        "segment.bytes=1048576",
    ]);
    broker.rill_ok(&["topic", "create", "keep"]);
    broker.rill_stdin_ok(&["produce", "keep"], b"k1\nk2\nk3\n");

    // Fill the disk through the broker until it refuses.
    let rt = runtime();
    let client = rt.block_on(support::connect_client(
        &broker.addr().to_string(),
        &broker.home(),
    ));
    let _entered = rt.enter();
    let producer = client
        .producer(ProducerConfig {
            acks: Acks::All,
            retries: 0,
            delivery_timeout: Duration::from_secs(10),
            ..ProducerConfig::default()
        })
        .unwrap();
    let mut acked = 0usize;
    let refusal = rt.block_on(async {
        for i in 0..2_000usize {
            let mut value = format!("record-{i:05}-").into_bytes();
            value.resize(RECORD_BYTES, b'x' + (i % 3) as u8);
            let delivery = producer
                .send(ProducerRecord::new("fill", value))
                .await
                .expect("queued");
            match delivery.await {
                Ok(_) => acked += 1,
                Err(e) => return e,
            }
        }
        panic!("2,000 records of 64 KiB went onto a 48 MiB disk");
    });
    println!("{acked} records acknowledged, then: {refusal}");
    assert_eq!(refusal.code(), Some(ErrorCode::StorageError), "{refusal}");
    let text = refusal.to_string();
    assert!(
        text.contains("partition fill-0") && text.contains("full") && text.contains("bytes free"),
        "the refusal names the partition and the free space: {text}"
    );
    assert!(acked > 100, "only {acked} records fit");

    // Every acknowledged record is served, and the other topic too.
    let records = broker.read_to_end("fill");
    assert_eq!(
        records.len(),
        acked,
        "every acknowledged record is read back"
    );
    for (i, r) in records.iter().enumerate() {
        let v = r.value.as_deref().unwrap();
        assert_eq!(v.len(), RECORD_BYTES);
        assert!(
            v.starts_with(format!("record-{i:05}-").as_bytes()),
            "record {i} intact"
        );
    }
    assert_eq!(
        support::values_of(&broker.read_to_end("keep")),
        ["k1", "k2", "k3"]
    );

    // The metadata quorum writes within the reserve.
    broker.rill_ok(&["topic", "create", "made-on-a-full-disk"]);

    // Something else takes the reserve too: a metadata write now waits for
    // space (the Raft core does not stop), and completes once space returns.
    let ballast = fill_up(&data);
    let mut create = broker
        .client_command(&["topic", "create", "made-while-full"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    std::fs::remove_file(&ballast).unwrap();
    let _ = support::wait_bounded(&mut create, Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = broker.rill(&["topic", "describe", "made-while-full"]);
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the topic created while the disk was full never appeared: {}\n--- broker log ---\n{}",
            String::from_utf8_lossy(&out.stderr),
            broker.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    broker.rill_ok(&["topic", "create", "made-after"]);
    assert!(
        broker.log().contains("the metadata store writes again"),
        "the metadata store waited for space and went on:\n{}",
        broker.log()
    );

    // Deleting the topic frees the disk: records are accepted again.
    broker.rill_ok(&["topic", "delete", "fill"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = broker.rill_stdin(&["produce", "keep"], b"k4\n");
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "produce never resumed after the delete: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        support::values_of(&broker.read_to_end("keep")),
        ["k1", "k2", "k3", "k4"]
    );
    assert!(broker.is_alive(), "the broker ran throughout");
    drop(client);
    assert!(broker.sigterm().success(), "and shuts down cleanly");
}

/// Bytes available on the filesystem of `path` (`df`).
fn available(path: &Path) -> u64 {
    let out = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("df prints the available bytes")
}

/// A follower whose disk fills stops appending and leaves the ISR while the
/// others go on taking acks=all writes; when it has space again it catches up
/// and comes back into the ISR, without a restart, and holds every record.
#[test]
fn a_replica_whose_disk_fills_leaves_the_isr_and_comes_back() {
    use support::cluster::{TestCluster, partition0};
    let mut c = TestCluster::start_joined(3, &[]);
    c.wait_all_live();
    c.rill_ok(
        &[
            "topic",
            "create",
            "replicated",
            "--replication-factor",
            "3",
            "--config",
            "min.insync.replicas=2",
            "--config",
            "replica.lag.time.max.ms=2000",
            "--config",
            "segment.bytes=1048576",
        ],
        b"",
    );
    let isr = |c: &TestCluster| {
        partition0(&c.rill_ok(&["topic", "describe", "replicated"], b""))
            .expect("partition 0")
            .2
    };
    c.wait_for("a full ISR", &["topic", "describe", "replicated"], |out| {
        partition0(out).is_some_and(|p| p.2.len() == 3)
    });

    // Broker 2's data moves onto a 64 MiB tmpfs (stopped, copied over, started).
    c.kill(2);
    let data = c.data_dir(2);
    let aside = data.with_extension("aside");
    std::fs::rename(&data, &aside).unwrap();
    let Some(_tmpfs) = Tmpfs::mount_or_skip(&data, "64m") else {
        return;
    };
    let copied = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", aside.display()))
        .arg(&data)
        .status()
        .unwrap();
    assert!(copied.success(), "copying broker 2's data onto the tmpfs");
    // Leave about 3 MiB above its reserve (5% of 64 MiB).
    let reserve = 64 * 1024 * 1024 / 20;
    let ballast_bytes = available(&data).saturating_sub(reserve + 3 * 1024 * 1024);
    let ballast = data.join("ballast");
    std::fs::write(&ballast, vec![0x5au8; ballast_bytes as usize]).unwrap();
    c.spawn(2);
    c.wait_all_live();
    c.wait_for(
        "broker 2 back in the ISR",
        &["topic", "describe", "replicated"],
        |out| partition0(out).is_some_and(|p| p.2.len() == 3),
    );

    // 12 MiB of acks=all writes: broker 2 runs short after about 3 MiB.
    const N: usize = 384;
    let rt = runtime();
    let client = rt.block_on(support::connect_client(&c.bootstrap(), &c.home()));
    let _entered = rt.enter();
    let producer = client
        .producer(ProducerConfig {
            acks: Acks::All,
            ..ProducerConfig::default()
        })
        .unwrap();
    rt.block_on(async {
        let mut pending = Vec::new();
        for i in 0..N {
            let mut value = format!("r{i:04}-").into_bytes();
            value.resize(32 * 1024, b'r');
            pending.push(
                producer
                    .send(ProducerRecord::new("replicated", value))
                    .await
                    .unwrap(),
            );
        }
        for (i, d) in pending.into_iter().enumerate() {
            d.await
                .unwrap_or_else(|e| panic!("record {i} with acks=all and 2 of 3 replicas: {e}"));
        }
    });
    let shrunk = isr(&c);
    assert!(
        !shrunk.contains(&2),
        "broker 2 (disk full) left the ISR: {shrunk:?}"
    );
    assert!(
        c.logs().contains("not replicating: the data disk is full"),
        "broker 2 said why it stopped"
    );

    // Space returns: it catches up and rejoins, with no restart.
    std::fs::remove_file(&ballast).unwrap();
    c.wait_for(
        "broker 2 back in the ISR after space returned",
        &["topic", "describe", "replicated"],
        |out| partition0(out).is_some_and(|p| p.2.len() == 3),
    );
    assert!(c.is_running(2));
    // Its copy holds every record: read it alone (the others stopped).
    c.kill(0);
    c.kill(1);
    drop(producer);
    drop(client);
    let mut replica = Vec::new();
    for entry in std::fs::read_dir(data.join("replicated-0")).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "log") {
            replica.push(std::fs::read(&p).unwrap());
        }
    }
    let bytes: Vec<u8> = replica.concat();
    for i in [0, N / 2, N - 1] {
        let tag = format!("r{i:04}-");
        assert!(
            bytes.windows(tag.len()).any(|w| w == tag.as_bytes()),
            "broker 2's copy holds record {i}"
        );
    }
}

/// With no reserve (`--min-free-bytes 0`) the disk really fills mid-append:
/// the record is refused with the OS's reason, the partial batch is cut (not
/// left past the segment's end, where a roll and a restart would find it),
/// writes resume once space returns, and after a restart every acknowledged
/// record is read back intact.
#[test]
fn an_append_cut_short_by_a_full_disk_leaves_nothing_behind() {
    let mut broker = TestBroker::start_with(&["--min-free-bytes", "0"]);
    assert!(broker.sigterm().success());
    let data = broker.data_dir();
    let Some(_tmpfs) = Tmpfs::mount_or_skip(&data, "32m") else {
        return;
    };
    broker.restart();
    broker.rill_ok(&[
        "topic",
        "create",
        "cut",
        "--config",
        "segment.bytes=1048576",
    ]);
    let ballast = data.join("ballast");
    std::fs::write(&ballast, vec![1u8; 6 << 20]).unwrap();
    let rt = runtime();
    let client = rt.block_on(support::connect_client(
        &broker.addr().to_string(),
        &broker.home(),
    ));
    let _entered = rt.enter();
    let producer = client
        .producer(ProducerConfig {
            acks: Acks::All,
            retries: 0,
            ..ProducerConfig::default()
        })
        .unwrap();
    let size_of = |i: usize, big: usize| if i == big { 900_000 } else { 100_000 };
    let send = |i: usize, big: usize| {
        let mut value = format!("cut-{i:05}-").into_bytes();
        // Not a multiple of the page size, so the last write is partial; the
        // first record after space returns is too big for what is left of
        // the segment, so the segment the short write hit is rolled.
        value.resize(size_of(i, big), b'c');
        rt.block_on(async {
            producer
                .send(ProducerRecord::new("cut", value))
                .await
                .unwrap()
                .await
        })
    };
    let mut acked = 0;
    let refusal = loop {
        match send(acked, usize::MAX) {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 1_000, "32 MiB held 1,000 records of 100 kB");
    };
    println!("{acked} records acknowledged, then: {refusal}");
    assert_eq!(refusal.code(), Some(ErrorCode::StorageError), "{refusal}");
    assert!(
        refusal.to_string().contains("No space left on device"),
        "{refusal}"
    );
    // Space returns: more records, across a few segment rolls.
    std::fs::remove_file(&ballast).unwrap();
    let big = acked;
    for i in acked..acked + 30 {
        send(i, big).unwrap_or_else(|e| panic!("record {i} after space returned: {e}"));
    }
    let total = acked + 30;
    drop(producer);
    drop(client);
    assert!(broker.sigterm().success());
    broker.restart();
    let records = broker.read_to_end("cut");
    assert_eq!(records.len(), total, "every acknowledged record, once");
    for (i, r) in records.iter().enumerate() {
        let v = r.value.as_deref().unwrap();
        assert!(
            v.len() == size_of(i, big) && v.starts_with(format!("cut-{i:05}-").as_bytes()),
            "record {i} intact"
        );
    }
}
