//! Transform limits end to end (issue 18, item 5): a `rill broker` whose
//! `[transforms]` maxima are lower than what a deployment asks for does not
//! run it, and `rill transform deploy` fails naming the limit and the config
//! key; a deployment within the maxima runs; one beyond what any host accepts
//! is refused by `deploy` before anything is stored.

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
