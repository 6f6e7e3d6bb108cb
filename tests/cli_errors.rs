//! User errors, end to end: each failing command prints exactly one clear
//! `error:` line on stderr (what failed, why, what to do) and exits non-zero.

#[path = "support/mod.rs"]
mod support;

use support::{TestBroker, single_error_line};

#[test]
fn unknown_topic_is_one_clear_error() {
    let broker = TestBroker::start();

    let out = broker.rill_stdin(&["produce", "nosuch"], b"x\n");
    let line = single_error_line(&out);
    assert!(
        line.contains("nosuch") && line.contains("rill topic create"),
        "{line}"
    );

    let out = broker.rill(&["consume", "nosuch", "--timeout-ms", "1000"]);
    let line = single_error_line(&out);
    assert!(
        line.contains("nosuch") && line.contains("rill topic create"),
        "{line}"
    );

    let out = broker.rill(&["topic", "describe", "nosuch"]);
    let line = single_error_line(&out);
    assert!(line.contains("nosuch"), "{line}");
}

#[test]
fn bad_topic_config_names_the_key() {
    let broker = TestBroker::start();
    let out = broker.rill(&["topic", "create", "t", "--config", "retention.ms=abc"]);
    let line = single_error_line(&out);
    assert!(line.contains("retention.ms"), "{line}");
    let list = broker.rill_ok(&["topic", "list"]);
    assert!(
        !list.lines().any(|l| l == "t"),
        "topic created despite a bad config"
    );

    broker.rill_ok(&["topic", "create", "t"]);
    let out = broker.rill(&["topic", "create", "t"]);
    let line = single_error_line(&out);
    assert!(
        line.contains("t") && line.to_lowercase().contains("exists"),
        "{line}"
    );
}

#[test]
fn produce_line_without_separator_names_the_line() {
    let broker = TestBroker::start();
    broker.rill_ok(&["topic", "create", "kv"]);
    let out = broker.rill_stdin(
        &["produce", "kv", "--key-separator", ":"],
        b"a:1\nb:2\nnokey\nc:3\n",
    );
    let line = single_error_line(&out);
    assert!(line.contains("line 3"), "{line}");
}

#[test]
fn no_broker_running_says_so() {
    // A broker's home (so a development CA exists) but a port nothing listens on.
    let broker = TestBroker::start();
    let unused = support::unused_udp_addr().to_string();
    let mut cmd = support::rill_command(&broker.home());
    cmd.args(["topic", "list", "--bootstrap", &unused]);
    let out = support::run_bounded(&mut cmd, b"", support::COMMAND_TIMEOUT);
    let line = single_error_line(&out);
    assert!(
        line.starts_with(&format!(
            "error: cannot connect to {unused}: no broker answering (UDP)"
        )),
        "{line}"
    );
    assert!(
        line.contains("rill broker") && line.contains("--bootstrap"),
        "{line}"
    );
}

#[test]
fn bad_broker_config_key_is_named() {
    let (_dir, path) =
        support::temp_file("rill.toml", "listen = \"127.0.0.1:0\"\nnum_partitons = 3\n");
    let (home, _) = support::temp_file("unused", "");
    let mut cmd = support::rill_command(home.path());
    cmd.arg("broker").arg("--config").arg(&path);
    let out = support::run_bounded(&mut cmd, b"", support::COMMAND_TIMEOUT);
    let line = single_error_line(&out);
    assert!(
        line.contains("num_partitons") && line.contains("rill.toml"),
        "{line}"
    );
    assert!(out.stdout.is_empty(), "no listening line expected");
}

#[test]
fn rejected_record_fails_the_produce_naming_the_line() {
    let broker = TestBroker::start();
    broker.rill_ok(&[
        "topic",
        "create",
        "small",
        "--config",
        "max.message.bytes=1024",
    ]);
    let big = "x".repeat(3000);
    let out = broker.rill_stdin(&["produce", "small"], format!("{big}\n").as_bytes());
    let line = single_error_line(&out);
    assert!(
        line.contains("line 1")
            && line.contains("RECORD_TOO_LARGE")
            && line.contains("max.message.bytes"),
        "{line}"
    );
    let consumed = broker.rill_ok(&[
        "consume",
        "small",
        "--from-beginning",
        "--timeout-ms",
        "500",
    ]);
    assert_eq!(consumed, "", "a refused record must not be stored");
}
