//! Transform limits end to end (issue 18, item 5): a `rill broker` whose
//! `[transforms]` maxima are lower than what a deployment asks for does not
//! run it, and `rill transform deploy` fails naming the limit and the config
//! key; a deployment within the maxima runs; one beyond what any host accepts
//! is refused by `deploy` before anything is stored.
//!
//! And transforms' principals (item 5): with `--auth mtls` a transform runs
//! with the rights of the principal that deployed it: deploy is refused for
//! outputs that principal may not write, a rule removed later halts the
//! transform before it writes again, and `__transforms` itself is written by
//! no client, super users included.

#[path = "support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};

use support::TestBroker;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

#[test]
fn deployments_beyond_the_brokers_maxima_are_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rill.toml");
    std::fs::write(
        &config,
        "[transforms]\nmemory_mb_max = 32\ncall_timeout_ms_max = 5000\n",
    )
    .unwrap();
    let broker = TestBroker::start_with(&["--config", config.to_str().unwrap()]);
    broker.rill_ok(&["topic", "create", "lim-in"]);
    let wasm = root().join("tests/guests/prebuilt/identity-contract-0.1.0.wasm");
    let wasm = wasm.to_str().unwrap();
    let deploy = |name: &str, limits: &[&str]| {
        let mut args = vec![
            "transform",
            "deploy",
            wasm,
            "--name",
            name,
            "--input",
            "lim-in",
            "--output",
            "lim-out",
        ];
        args.extend_from_slice(limits);
        broker.rill(&args)
    };

    // More memory than this broker allows: stored, refused by its supervisor,
    // and deploy says why.
    let out = deploy("big", &["--memory-mb", "64"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for part in [
        "transform big version 1 was refused",
        "64 MiB",
        "transforms.memory_mb_max = 32 MiB",
        "--memory-mb 32",
    ] {
        assert!(stderr.contains(part), "{part}: {stderr}");
    }
    let text = broker.rill_ok(&["transform", "describe", "big"]);
    assert!(text.contains("refused"), "{text}");

    // A longer call deadline than it allows: the same.
    let out = deploy("slow", &["--memory-mb", "32", "--timeout-ms", "6000"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("transforms.call_timeout_ms_max = 5000 ms"),
        "{stderr}"
    );

    // Within the maxima it runs (and the refused ones do not stop it).
    let out = deploy("fits", &["--memory-mb", "32", "--timeout-ms", "5000"]);
    support::assert_success(&out, &["transform", "deploy", "fits"], &broker);
    assert!(String::from_utf8_lossy(&out.stdout).contains("running"));

    // Beyond what any host accepts: refused before anything is stored.
    let out = deploy("huge", &["--memory-mb", "5000"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("more than any host allows"), "{stderr}");
    let list = broker.rill_ok(&["transform", "list"]);
    assert!(!list.contains("huge"), "{list}");
}

/// `rill cert issue --principal NAME` into the broker's RILL_HOME; the flags
/// that use it.
fn principal(broker: &TestBroker, name: &str) -> Vec<String> {
    broker.rill_ok(&["cert", "issue", "--principal", name]);
    let dir = broker.home().join("certs");
    vec![
        "--tls-cert".into(),
        dir.join(format!("{name}.pem")).display().to_string(),
        "--tls-key".into(),
        dir.join(format!("{name}-key.pem")).display().to_string(),
    ]
}

/// `rill ARGS` as the principal of `flags`.
fn rill_as(
    broker: &TestBroker,
    flags: &[String],
    args: &[&str],
    input: &[u8],
) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(flags.iter().map(String::as_str));
    broker.rill_stdin(&all, input)
}

fn ok(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_transform_runs_with_the_rights_of_its_deployer() {
    let broker = TestBroker::start_with(&["--auth", "mtls", "--super-user", "root"]);
    let root = principal(&broker, "root");
    let alice = principal(&broker, "alice");
    let as_root =
        |args: &[&str], input: &[u8]| ok(rill_as(&broker, &root, args, input), &args.join(" "));
    for t in ["p-in", "p-out", "p-secret"] {
        as_root(&["topic", "create", t], b"");
    }
    let acl = |verb: &str, op: &str, resource: &[&str]| {
        let mut args = vec!["acl", verb, "--principal", "alice", "--operation", op];
        args.extend_from_slice(resource);
        as_root(&args, b"");
    };
    acl("add", "read", &["--topic", "p-in"]);
    acl("add", "write", &["--topic", "p-out"]);
    acl("add", "alter", &["--transform", "copy"]);
    // She sees p-secret (so deploy goes as far as asking the broker to store
    // the deployment) but may not write it.
    acl("add", "describe", &["--topic", "p-secret"]);
    // The deployments and the instances' status, to see what runs.
    acl("add", "read", &["--topic-prefix", "__transform"]);

    let wasm = root_dir().join("tests/guests/prebuilt/identity-contract-0.1.0.wasm");
    let wasm = wasm.to_str().unwrap();
    let deploy = |output: &str| {
        let args = [
            "transform",
            "deploy",
            wasm,
            "--name",
            "copy",
            "--input",
            "p-in",
            "--output",
            output,
            "--on-error",
            "skip",
        ];
        rill_as(&broker, &alice, &args, b"")
    };
    // An output alice may not write: refused, nothing stored.
    let out = deploy("p-secret");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("TOPIC_AUTHORIZATION_FAILED") && stderr.contains("p-secret"),
        "{stderr}"
    );
    assert!(!as_root(&["transform", "list"], b"").contains("copy"));

    // Within her rights it runs, as her.
    let stdout = ok(deploy("p-out"), "deploy as alice");
    assert!(
        stdout.contains("runs as User:alice") && stdout.contains("running"),
        "{stdout}"
    );
    let text = as_root(&["transform", "describe", "copy"], b"");
    assert!(text.contains("runs as:    User:alice"), "{text}");
    as_root(&["produce", "p-in"], b"one\ntwo\n");
    let consume = [
        "consume",
        "p-out",
        "--from-beginning",
        "--max-messages",
        "2",
        "--timeout-ms",
        "30000",
    ];
    let got = as_root(&consume, b"");
    assert_eq!(got.lines().count(), 2, "{got}");

    // Her right to write the output is taken away: the transform halts before
    // it writes the next record, and says why.
    acl("remove", "write", &["--topic", "p-out"]);
    // Runners ask again at most ACCESS_RECHECK (1 s) after they last asked.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    as_root(&["produce", "p-in"], b"three\n");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let text = loop {
        let text = as_root(&["transform", "describe", "copy"], b"");
        if text.contains("halted") {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "not halted: {text}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    let state = text
        .lines()
        .find(|l| l.contains("state:"))
        .unwrap_or_default();
    assert!(
        state.contains("halted")
            && state.contains("(User:alice)")
            && state.contains("may not write topic \"p-out\""),
        "{text}"
    );
    let everything = [
        "consume",
        "p-out",
        "--from-beginning",
        "--max-messages",
        "3",
        "--timeout-ms",
        "3000",
    ];
    let got = String::from_utf8(rill_as(&broker, &root, &everything, b"").stdout).unwrap();
    assert_eq!(got.lines().collect::<Vec<_>>(), ["one", "two"], "{got}");

    // Resumed by root, it runs as root and catches up.
    let stdout = as_root(&["transform", "resume", "copy"], b"");
    assert!(stdout.contains("runs as User:root"), "{stdout}");
    let consume3 = [
        "consume",
        "p-out",
        "--from-beginning",
        "--max-messages",
        "3",
        "--timeout-ms",
        "30000",
    ];
    let got = as_root(&consume3, b"");
    assert_eq!(got.lines().count(), 3, "{got}");

    // Nobody writes the deployments directly, not even a super user.
    let out = rill_as(&broker, &root, &["produce", "__transforms"], b"x\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("internal topic"),
        "{stderr}"
    );
    let out = rill_as(&broker, &alice, &["produce", "__transforms"], b"x\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("AUTHORIZATION_FAILED"),
        "{stderr}"
    );
}

fn root_dir() -> PathBuf {
    root()
}
