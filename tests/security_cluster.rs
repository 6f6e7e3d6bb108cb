//! ACLs in a three-broker cluster with `--auth mtls`: rules added through one
//! broker are enforced by every broker and survive the controller being
//! killed (they live in the metadata quorum).

mod support;

use std::path::PathBuf;
use support::cluster::TestCluster;
use support::rill_command;

/// The id of the broker `rill cluster info` marks as the controller.
fn controller(info: &str) -> Option<usize> {
    info.lines()
        .skip(1)
        .find(|l| l.trim_end().ends_with('*'))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|id| id.parse().ok())
}

fn issue(home: &std::path::Path, name: &str) -> (PathBuf, PathBuf) {
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
    (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
    )
}

#[test]
fn acls_are_enforced_by_every_broker_and_survive_a_controller_failover() {
    let mut c = TestCluster::start_joined(3, &["--auth", "mtls", "--super-user", "root"]);
    let (root_cert, root_key) = issue(&c.home(), "root");
    let (alice_cert, alice_key) = issue(&c.home(), "alice");
    // Every `rill` this test runs is root unless it says otherwise.
    c.client_env = vec![
        ("RILL_TLS_CERT".into(), root_cert.display().to_string()),
        ("RILL_TLS_KEY".into(), root_key.display().to_string()),
    ];
    c.wait_all_live();
    c.rill_ok(
        &["topic", "create", "orders", "--replication-factor", "3"],
        b"",
    );
    c.rill_ok(&["topic", "create", "secret"], b"");
    allow_alice_to_write(&c, "orders");
    // `rill ARGS` as alice: her certificate instead of root's.
    let alice = |args: &[&str]| -> Vec<String> {
        let cert = alice_cert.display().to_string();
        let key = alice_key.display().to_string();
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend(["--tls-cert".into(), cert, "--tls-key".into(), key]);
        all
    };
    let run_alice = |c: &TestCluster, args: &[&str], input: &[u8]| {
        let all = alice(args);
        c.rill(&refs(&all), input)
    };
    assert_success(&run_alice(&c, &["produce", "orders"], b"one\n"));
    let out = run_alice(&c, &["produce", "secret"], b"no\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("TOPIC_AUTHORIZATION_FAILED"),
        "{stderr}"
    );

    // Kill the controller; a new one is elected and the rules are still there,
    // on every broker left.
    let info = c.rill_ok(&["cluster", "info"], b"");
    let old = controller(&info).expect("a controller");
    c.kill(old);
    c.wait_for("a new controller", &["cluster", "info"], |out| {
        controller(out).is_some_and(|id| id != old)
    });
    let list = c.rill_ok(&["acl", "list"], b"");
    assert!(
        list.contains("alice") && list.contains("topic orders"),
        "{list}"
    );
    assert_success(&run_alice(&c, &["produce", "orders"], b"two\n"));
    let out = run_alice(&c, &["produce", "secret"], b"no\n");
    assert!(!out.status.success());
    // A rule added after the failover is enforced too.
    allow_alice_to_write(&c, "secret");
    let list_as_alice = alice(&["topic", "list"]);
    c.wait_for("alice may write secret", &refs(&list_as_alice), |out| {
        out.contains("secret")
    });
    assert_success(&run_alice(&c, &["produce", "secret"], b"now\n"));
}

/// `rill acl add`: alice may write `topic`.
fn allow_alice_to_write(c: &TestCluster, topic: &str) {
    let args = [
        "acl",
        "add",
        "--principal",
        "alice",
        "--operation",
        "write",
        "--topic",
        topic,
    ];
    c.rill_ok(&args, b"");
}

fn assert_success(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}
