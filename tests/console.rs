//! The web console (`rill broker --console`) in a real browser: headless
//! Chromium from Debian driven over WebDriver (chromedriver), against three real
//! brokers. One browser for every scenario:
//!
//! - the cluster page lists the three brokers, alive;
//! - the topics and topic pages show a topic and its partitions; an unknown
//!   topic is a 404 naming it; a wide topic's partitions are paged; records
//!   are browsed from a time; creating a topic and setting a config ask for a
//!   confirmation first;
//! - a record produced while the records page is open appears in the live tail;
//! - a group that consumed 4 of 10 records shows lag 6, 16 after 10 more, 0
//!   once it read them all;
//! - that group's committed offsets reset from its page to an offset, the
//!   latest, the earliest and a time, each confirmed first: the page and `rill
//!   group describe` show the new offset; bad requests are refused naming the
//!   field, the unknown topic or group; a group with a live member is refused
//!   (409) and the page shows why, naming the group;
//! - a transform (tests/guests/faulty) with a failing record shows its counts,
//!   its error, its dead-letter topic and its logs; pause and resume, each
//!   confirmed first;
//! - the cluster page shows every broker's version and charts the produce
//!   traffic of the records above (each broker's own counters);
//! - a SIGKILLed broker is shown down within a few seconds, and its topic's
//!   partitions led by the others and marked under-replicated;
//! - a broker with `--auth mtls`: its console asks for a token (`rill token
//!   issue`), refuses a malformed or foreign one, lists only the topics the
//!   user may describe, refuses a topic creation the ACLs do not allow with
//!   the broker's reason on the page, and signs out.
//!
//! Chromium and chromedriver come from Debian (`apt-get install -y chromium
//! chromium-driver` when /usr/bin/chromium or /usr/bin/chromedriver is missing).
//! Without them (and no way to install them) the test prints `SKIPPED: <reason>`
//! and passes, unless `CI` is set, where it fails. `RILL_CONSOLE_SCREENSHOTS=1`
//! writes a screenshot of each page to docs/console/.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::TestBroker;
use support::cluster::TestCluster;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// Longest wait for a page to show what a scenario expects.
const PAGE_WAIT: Duration = Duration::from_secs(20);
/// A killed broker must be shown down within this (its session timeout is 1.5 s,
/// the cluster page refreshes every 2 s).
const DOWN_WITHIN: Duration = Duration::from_secs(10);

#[test]
fn console_in_a_browser() {
    let started = Instant::now();
    if let Err(reason) = ensure_chromium() {
        skip_or_fail(&reason);
        return;
    }
    let console_port = Mutex::new(0u16);
    let mut c = TestCluster::start_joined_with(3, &[], |id| {
        if id != 0 {
            return Vec::new();
        }
        let port = support::free_tcp_port();
        *console_port.lock().unwrap() = port;
        vec!["--console".into(), format!("127.0.0.1:{port}")]
    });
    let port = *console_port.lock().unwrap();
    let base = format!("http://127.0.0.1:{port}/");
    c.wait_all_live();

    let driver = match Driver::start() {
        Ok(d) => d,
        Err(reason) => {
            skip_or_fail(&format!("cannot start chromedriver/chromium: {reason}"));
            return;
        }
    };
    let shots = std::env::var("RILL_CONSOLE_SCREENSHOTS").is_ok_and(|v| v == "1");
    let shoot = |name: &str| {
        if shots {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/console");
            std::fs::create_dir_all(&dir).unwrap();
            driver.screenshot(&dir.join(format!("{name}.png")));
        }
    };

    // The cluster page: three brokers, alive, one of them the controller.
    driver.go(&format!("{base}#/cluster"));
    driver.wait_for("three live brokers on the cluster page", || {
        driver.js(
            "const rows = [...document.querySelectorAll('#brokers tr[data-broker-id]')];\
             return rows.length === 3 && rows.every(r => r.dataset.alive === 'yes');",
        ) == json!(true)
    });
    let text = driver.js("return document.getElementById('brokers').innerText;");
    assert!(text.as_str().unwrap().contains("controller"), "{text}");
    for b in &c.brokers {
        assert!(
            text.as_str().unwrap().contains(&b.addr.to_string()),
            "{text}"
        );
    }
    shoot("cluster");

    // Topics: a topic with a few JSON, text and binary-ish records.
    c.rill_ok(
        &[
            "topic",
            "create",
            "console-events",
            "--partitions",
            "3",
            "--replication-factor",
            "3",
        ],
        b"",
    );
    c.rill_ok(
        &[
            "produce",
            "console-events",
            "--partition",
            "0",
            "--key-separator",
            "|",
        ],
        b"order-1|{\"order\":1,\"items\":[\"tea\",\"milk\"],\"total\":7.5}\norder-2|plain text value\n",
    );
    driver.go(&format!("{base}#/topics"));
    driver.wait_for("console-events in the topics list", || {
        driver.js("return !!document.querySelector('#topics tr[data-topic=\"console-events\"]');")
            == json!(true)
    });
    let internal = driver.js("return !!document.querySelector('#topics tr[data-topic^=\"__\"]');");
    assert_eq!(
        internal,
        json!(false),
        "internal topics are hidden by default"
    );
    shoot("topics");
    driver.go(&format!("{base}#/topics/console-events"));
    driver.wait_for("three partitions on the topic page", || {
        driver.js("return document.querySelectorAll('#partitions tr[data-partition]').length;")
            == json!(3)
    });
    // A config set on the page, after a confirmation.
    driver.js(
        "document.getElementById('config-key').value = 'retention.ms';\
         document.getElementById('config-value').value = '3600000';\
         document.getElementById('alter-config').requestSubmit(); return null;",
    );
    driver.confirm();
    c.wait_for(
        "retention.ms=3600000 on console-events",
        &["topic", "describe", "console-events"],
        |out| out.contains("retention.ms=3600000"),
    );
    driver.go(&format!("{base}#/topics/console-events?page=0"));
    driver.wait_for("the config on the topic page", || {
        driver
            .js("const a = document.getElementById('app'); return a && a.innerText;")
            .as_str()
            .is_some_and(|t| t.contains("1 set on the topic") && t.contains("Change a config"))
    });
    shoot("topic");
    // Browsing from a time: the first record at or after it.
    let (status, body) = http_get(
        port,
        "/api/topics/console-events/records?partition=0&timestamp=0&limit=1",
    );
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["records"][0]["offset"], json!(0), "{body}");
    assert_eq!(v["records"][0]["key"]["text"], json!("order-1"), "{body}");
    assert_eq!(v["records"][0]["value"]["kind"], json!("json"), "{body}");
    assert_eq!(v["next"], json!(1), "{body}");

    // A wide topic's partitions come a page (100) at a time.
    c.rill_ok(
        &[
            "topic",
            "create",
            "wide",
            "--partitions",
            "250",
            "--replication-factor",
            "1",
        ],
        b"",
    );
    driver.go(&format!("{base}#/topics/wide?page=2"));
    driver.wait_for("partitions 200 to 249 of wide", || {
        driver.js(
            "const rows = [...document.querySelectorAll('#partitions tr[data-partition]')];\
             return rows.length ? [rows.length, rows[0].dataset.partition] : null;",
        ) == json!([50, "200"])
    });

    let (status, body) = http_get(port, "/api/topics/no-such-topic");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("unknown topic no-such-topic"), "{body}");

    // Creating a topic asks first; confirmed, the topic exists.
    driver.go(&format!("{base}#/topics"));
    driver.wait_for("the create-topic form", || {
        driver.js("return !!document.getElementById('create-topic');") == json!(true)
    });
    driver.js(
        "document.getElementById('new-topic-name').value = 'made-in-console';\
         document.getElementById('create-topic').requestSubmit(); return null;",
    );
    driver.wait_for("the confirmation dialog", || {
        driver.js("return document.getElementById('confirm').open;") == json!(true)
    });
    let (status, _) = http_get(port, "/api/topics/made-in-console");
    assert_eq!(status, 404, "nothing is created before the confirmation");
    driver.js("document.getElementById('confirm-ok').click(); return null;");
    driver.wait_for("the created topic", || {
        http_get(port, "/api/topics/made-in-console").0 == 200
    });

    // The live tail: a record produced while the page is open shows up.
    driver.go(&format!(
        "{base}#/topics/console-events/records?partition=0"
    ));
    driver.wait_for("the live tail to be live", || {
        driver.js("const s = document.getElementById('tail-status'); return s && s.dataset.state;")
            == json!("live")
    });
    c.rill_ok(
        &["produce", "console-events", "--key-separator", "|"],
        b"tail-key|{\"live\":\"tail-marker-42\"}\n",
    );
    driver.wait_for("the produced record in the live tail", || {
        driver
            .js("return document.getElementById('tail').innerText;")
            .as_str()
            .is_some_and(|t| t.contains("tail-marker-42") && t.contains("tail-key"))
    });
    shoot("records");

    // A group's lag: 10 records, 4 consumed and committed by group g-lag.
    c.rill_ok(
        &[
            "topic",
            "create",
            "console-lag",
            "--partitions",
            "1",
            "--replication-factor",
            "3",
        ],
        b"",
    );
    let ten: String = (0..10).map(|i| format!("record {i}\n")).collect();
    c.rill_ok(&["produce", "console-lag"], ten.as_bytes());
    c.rill_ok(
        &[
            "consume",
            "console-lag",
            "--group",
            "g-lag",
            "--from-beginning",
            "--max-messages",
            "4",
            "--timeout-ms",
            "20000",
        ],
        b"",
    );
    driver.go(&format!("{base}#/groups/g-lag"));
    driver.wait_for("lag 6 on the group page", || {
        let lag = driver.js("const t = document.getElementById('total-lag'); \
             const cell = document.querySelector('#group-partitions td.lag'); \
             return t && cell ? [t.innerText, cell.innerText] : null;");
        lag == json!(["6", "6"])
    });
    // The lag rises with new records and falls to 0 once the group reads them.
    let more: String = (10..20).map(|i| format!("record {i}\n")).collect();
    c.rill_ok(&["produce", "console-lag"], more.as_bytes());
    driver.wait_for("lag 16 on the group page", || {
        driver.js("const t = document.getElementById('total-lag'); return t && t.innerText;")
            == json!("16")
    });
    c.rill_ok(
        &[
            "consume",
            "console-lag",
            "--group",
            "g-lag",
            "--max-messages",
            "16",
            "--timeout-ms",
            "20000",
        ],
        b"",
    );
    driver.wait_for("lag 0 on the group page", || {
        driver.js("const t = document.getElementById('total-lag'); return t && t.innerText;")
            == json!("0")
    });
    shoot("group");
    driver.go(&format!("{base}#/groups"));
    driver.wait_for("g-lag in the groups list", || {
        driver.js("return !!document.querySelector('#groups tr[data-group=\"g-lag\"]');")
            == json!(true)
    });

    // Resetting g-lag's committed offsets (20 of 20, no members now) from its
    // page, each target confirmed first. Record 10 opened the second batch,
    // produced well after the first: the reset to its time lands on it.
    let (status, body) = http_get(
        port,
        "/api/topics/console-lag/records?partition=0&offset=9&limit=2",
    );
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let time_of = |i: usize| v["records"][i]["timestamp_ms"].as_i64().expect(&body);
    let ts10 = time_of(1);
    assert!(
        time_of(0) < ts10,
        "record 9 is older than record 10: {body}"
    );
    let committed = || {
        let out = c.rill_ok(&["group", "describe", "g-lag"], b"");
        support::committed_offsets(&out, "g-lag")
    };
    assert_eq!(committed()[&("console-lag".to_string(), 0)], 20);
    driver.go(&format!("{base}#/groups/g-lag"));
    driver.wait_for("the reset form offering console-lag", || {
        driver.js("const s = document.getElementById('reset-topic'); \
             return !!s && [...s.options].some(o => o.value === 'console-lag');")
            == json!(true)
    });
    let ts10_text = ts10.to_string();
    for (to, value, said, want) in [
        ("offset", "5", "offset 5", 5),
        ("latest", "", "latest", 20),
        ("earliest", "", "earliest", 0),
        ("timestamp", ts10_text.as_str(), ts10_text.as_str(), 10),
    ] {
        // The number field is there only for an offset or a time.
        let shown = driver.js(&format!(
            "document.getElementById('reset-topic').value = 'console-lag'; \
             const to = document.getElementById('reset-to'); to.value = '{to}'; \
             to.dispatchEvent(new Event('change')); \
             document.getElementById('reset-value').value = '{value}'; \
             return getComputedStyle(document.getElementById('reset-value-label')).display !== 'none';"
        ));
        assert_eq!(shown, json!(!value.is_empty()), "the value field for {to}");
        driver.js("document.getElementById('reset-offsets').requestSubmit(); return null;");
        driver.wait_for("the confirmation dialog", || {
            driver.js("return document.getElementById('confirm').open;") == json!(true)
        });
        let text = driver.js("return document.getElementById('confirm-text').innerText;");
        let text = text.as_str().unwrap();
        assert!(
            text.contains("group g-lag")
                && text.contains("topic console-lag")
                && text.contains(said),
            "the confirmation names the group, the topic and the target ({said}): {text}"
        );
        if to == "offset" {
            assert_eq!(
                committed()[&("console-lag".to_string(), 0)],
                20,
                "nothing moves before the confirmation"
            );
        }
        driver.js("document.getElementById('confirm-ok').click(); return null;");
        driver.wait_for(
            &format!("committed {want} and lag {} on the group page", 20 - want),
            || {
                driver.js(
                    "const r = document.querySelector('#group-partitions tr[data-tp=\"console-lag-0\"]'); \
                     const t = document.getElementById('total-lag'); \
                     const n = document.querySelector('#reset-result .notice'); \
                     return r && t && n ? [r.querySelector('td.committed').innerText, \
                         r.querySelector('td.lag').innerText, t.innerText, n.innerText] : null;",
                ) == json!([
                    want.to_string(),
                    (20 - want).to_string(),
                    (20 - want).to_string(),
                    format!("Reset group g-lag on topic console-lag: partition 0 → offset {want}.")
                ])
            },
        );
        assert_eq!(
            committed()[&("console-lag".to_string(), 0)],
            want,
            "`rill group describe g-lag` after the reset to {to}"
        );
    }
    shoot("group-reset");
    // Bad requests: the field, the unknown topic or group named.
    for (path, body, status, names) in [
        (
            "/api/groups/g-lag/reset-offsets",
            json!({ "topic": "console-lag", "to": "sideways" }),
            400,
            "to \"sideways\"",
        ),
        (
            "/api/groups/g-lag/reset-offsets",
            json!({ "topic": "console-lag", "to": "offset" }),
            400,
            "value is missing",
        ),
        (
            "/api/groups/g-lag/reset-offsets",
            json!({ "to": "earliest" }),
            400,
            "topic is missing",
        ),
        (
            "/api/groups/g-lag/reset-offsets",
            json!({ "topic": "no-such-topic", "to": "earliest" }),
            404,
            "no-such-topic",
        ),
        (
            "/api/groups/no-such-group/reset-offsets",
            json!({ "topic": "console-lag", "to": "earliest" }),
            404,
            "group no-such-group",
        ),
    ] {
        let (got, text) = http(port, "POST", path, Some(&body)).unwrap();
        assert_eq!(got, status, "{path} {body}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let error = v["error"].as_str().unwrap_or_else(|| panic!("{text}"));
        assert!(error.contains(names), "{path} {body}: {error}");
    }
    assert_eq!(committed()[&("console-lag".to_string(), 0)], 10);

    // A group with a live member: the reset is refused and the page says why.
    let mut cmd = support::rill_command(&c.home());
    cmd.env("RILL_BOOTSTRAP", c.bootstrap())
        .args([
            "consume",
            "console-lag",
            "--group",
            "g-live",
            "--from-beginning",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let member = KillOnDrop(cmd.spawn().expect("spawn rill consume --group g-live"));
    driver.go(&format!("{base}#/groups/g-live"));
    driver.wait_for("g-live with one member and its partition", || {
        driver.js(
            "const m = document.getElementById('member-count'); \
             const s = document.getElementById('reset-topic'); \
             return !!m && m.innerText === '1' && [...s.options].some(o => o.value === 'console-lag');",
        ) == json!(true)
    });
    driver.js(
        "document.getElementById('reset-topic').value = 'console-lag'; \
         const to = document.getElementById('reset-to'); to.value = 'earliest'; \
         to.dispatchEvent(new Event('change')); \
         document.getElementById('reset-offsets').requestSubmit(); return null;",
    );
    driver.confirm();
    driver.wait_for("the refusal on the group page", || {
        driver
            .js("const e = document.querySelector('#reset-result .error'); return e && e.innerText;")
            .as_str()
            .is_some_and(|t| {
                t.contains("cannot reset the offsets of group g-live on topic console-lag")
                    && t.contains("live members")
                    && t.contains("NON_EMPTY_GROUP: group g-live has 1 member(s)")
            })
    });
    shoot("group-reset-refused");
    let (got, text) = http(
        port,
        "POST",
        "/api/groups/g-live/reset-offsets",
        Some(&json!({ "topic": "console-lag", "to": "earliest" })),
    )
    .unwrap();
    assert_eq!(got, 409, "{text}");
    assert!(text.contains("group g-live"), "{text}");
    drop(member);

    // A transform with a failing record: its error, its dead letter, its logs;
    // pause and resume, each after a confirmation.
    let wasm = build_guest("tests/guests/faulty");
    c.rill_ok(
        &["topic", "create", "t-in", "--replication-factor", "3"],
        b"",
    );
    c.rill_ok(&["produce", "t-in"], b"one\nerr\ntwo\n");
    c.rill_ok(
        &[
            "transform",
            "deploy",
            wasm.to_str().unwrap(),
            "--name",
            "faulty",
            "--input",
            "t-in",
            "--output",
            "t-out",
            "--on-error",
            "dead-letter",
        ],
        b"",
    );
    driver.go(&format!("{base}#/transforms"));
    driver.wait_for("faulty with 2 processed and 1 failed", || {
        driver.js(
            "const r = document.querySelector('#transforms tr[data-transform=\"faulty\"]');\
             return r ? [r.children[4].innerText, r.children[5].innerText] : null;",
        ) == json!(["2", "1"])
    });
    shoot("transforms");
    driver.go(&format!("{base}#/transforms/faulty"));
    driver.wait_for("the error and the log lines on the transform page", || {
        driver
            .js("return document.getElementById('app').innerText;")
            .as_str()
            .is_some_and(|t| {
                t.contains("refused record at offset 1")
                    && t.contains("copied two")
                    && t.contains("faulty.dlq")
            })
    });
    shoot("transform");
    // Its dead letter, browsable: the failed record and the error in a header.
    driver.go(&format!("{base}#/topics/faulty.dlq/records?tail=0"));
    driver.wait_for("the dead letter with its error header", || {
        driver
            .js("const b = document.getElementById('browse'); return b && b.innerText;")
            .as_str()
            .is_some_and(|t| t.contains("err") && t.contains("refused record at offset 1"))
    });
    shoot("dead-letters");
    driver.go(&format!("{base}#/transforms/faulty"));
    for (button, state) in [("pause", "paused"), ("resume", "running")] {
        driver.wait_for(&format!("the {button} button"), || {
            driver.js(&format!(
                "const b = document.getElementById('transform-{button}'); \
                 if (b) b.click(); return !!b;"
            )) == json!(true)
        });
        driver.confirm();
        driver.wait_for(&format!("transform faulty {state}"), || {
            driver.js("return document.getElementById('transform-state').innerText;")
                == json!(state)
        });
    }
    let out = c.rill_ok(&["transform", "describe", "faulty"], b"");
    assert!(out.contains("state:      running"), "{out}");
    assert!(
        !out.contains("runs as:    Broker"),
        "pause/resume kept the deployer: {out}"
    );

    // Every broker's version, and the charts: the records produced above are
    // produce traffic of the last minutes.
    driver.go(&format!("{base}#/cluster"));
    let version = env!("CARGO_PKG_VERSION");
    driver.wait_for("versions and produce traffic on the cluster page", || {
        driver.js(&format!(
            "const rows = [...document.querySelectorAll('#brokers tr[data-broker-id]')];\
             const c = document.getElementById('chart-produce');\
             return rows.length === 3 \
               && rows.every(r => r.querySelector('.version').innerText === {}) \
               && !!c && Number(c.dataset.max) > 0 && c.querySelectorAll('polyline').length > 0;",
            json!(version)
        )) == json!(true)
    });
    let (status, body) = http_get(port, "/api/metrics");
    assert_eq!(status, 200, "{body}");
    let m: Value = serde_json::from_str(&body).unwrap();
    let brokers = m["brokers"].as_array().unwrap();
    assert_eq!(brokers.len(), 3, "{body}");
    let produced: f64 = brokers
        .iter()
        .flat_map(|b| b["points"].as_array().unwrap())
        .map(|p| p["produce_bytes_s"].as_f64().unwrap())
        .sum();
    assert!(produced > 0.0, "no produce traffic in {body}");
    shoot("cluster-charts");

    // A killed broker is shown down within a few seconds.
    driver.go(&format!("{base}#/cluster"));
    driver.wait_for("the cluster page", || {
        driver.js("return document.querySelectorAll('#brokers tr[data-broker-id]').length;")
            == json!(3)
    });
    c.kill(2);
    let killed = Instant::now();
    driver.wait_for("broker 2 shown down", || {
        driver.js(
            "const r = document.querySelector('#brokers tr[data-broker-id=\"2\"]'); \
             return r && r.dataset.alive;",
        ) == json!("no")
    });
    let shown = killed.elapsed();
    assert!(
        shown <= DOWN_WITHIN,
        "broker 2 was shown down {shown:?} after the kill"
    );
    shoot("cluster-broker-down");

    // Its partitions: new leaders, the ISR without it, marked under-replicated.
    driver.go(&format!("{base}#/topics/console-events"));
    driver.wait_for(
        "console-events under-replicated, led by live brokers",
        || {
            driver.js(
                "const rows = [...document.querySelectorAll('#partitions tr[data-partition]')];\
             return rows.length === 3 && rows.every(r => r.classList.contains('under') \
                 && r.children[1].innerText !== '2' && !r.children[3].innerText.includes('2'));",
            ) == json!(true)
        },
    );
    shoot("topic-broker-down");
    drop(c);

    users_sign_in_and_are_held_to_their_acls(&driver, &shoot);
    eprintln!(
        "console test: broker down shown after {shown:?}; whole test {:?}",
        started.elapsed()
    );
}

/// A broker with `--auth mtls`: its console asks for a token from `rill token
/// issue`, shows a user only what its ACLs let it describe, refuses what they
/// do not allow with the broker's reason on the page, and signs out.
fn users_sign_in_and_are_held_to_their_acls(driver: &Driver, shoot: &dyn Fn(&str)) {
    let port = support::free_tcp_port();
    let console = format!("127.0.0.1:{port}");
    let broker = TestBroker::start_with(&[
        "--auth",
        "mtls",
        "--super-user",
        "root",
        "--console",
        &console,
    ]);
    broker.rill_ok(&["cert", "issue", "--principal", "root"]);
    let certs = broker.home().join("certs");
    let cert = certs.join("root.pem").display().to_string();
    let key = certs.join("root-key.pem").display().to_string();
    let as_root_in = |args: &[&str], input: &[u8]| {
        let mut all = args.to_vec();
        all.extend(["--tls-cert", &cert, "--tls-key", &key]);
        broker.rill_stdin_ok(&all, input)
    };
    let as_root = |args: &[&str]| as_root_in(args, b"");
    as_root(&["topic", "create", "shared"]);
    as_root(&["topic", "create", "private"]);
    as_root(&[
        "acl",
        "add",
        "--principal",
        "viewer",
        "--operation",
        "read",
        "--topic",
        "shared",
    ]);
    let token = broker
        .rill_ok(&["token", "issue", "--principal", "viewer", "--ttl", "10m"])
        .trim()
        .to_string();
    let bearer = format!("Bearer {token}");

    // The API: nothing without a token; with one, only what viewer may see.
    let (status, body) = http_get(port, "/api/topics");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("rill token issue"), "{body}");
    let as_viewer = |method: &str, path: &str, body: Option<&Value>| {
        http_with(port, method, path, body, &[("Authorization", &bearer)])
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    };
    let (status, body) = as_viewer("GET", "/api/topics", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(field_of_each(&body, "topics", "name"), ["shared"], "{body}");
    let (status, body) = as_viewer("GET", "/api/topics/private", None);
    assert_eq!(status, 403, "{body}");
    let why: Value = serde_json::from_str(&body).unwrap();
    assert!(
        why["error"]
            .as_str()
            .unwrap()
            .contains("principal \"viewer\" may not describe topic \"private\""),
        "{body}"
    );
    let (status, body) = as_viewer("GET", "/api/topics/shared/records?partition=0", None);
    assert_eq!(status, 200, "{body}");
    // A group that read both topics: viewer may describe the group, and sees
    // only the offsets and lag of the topic it may describe.
    for t in ["shared", "private"] {
        as_root_in(&["produce", t], b"one\n");
    }
    as_root(&[
        "consume",
        "shared",
        "--group",
        "mixed",
        "--from-beginning",
        "--max-messages",
        "1",
    ]);
    as_root(&[
        "group",
        "reset-offsets",
        "mixed",
        "--topic",
        "private",
        "--to-latest",
    ]);
    let out = as_root(&["group", "describe", "mixed"]);
    assert!(out.contains("private"), "{out}");
    as_root(&[
        "acl",
        "add",
        "--principal",
        "viewer",
        "--operation",
        "describe",
        "--group",
        "mixed",
    ]);
    let (status, body) = as_viewer("GET", "/api/groups/mixed", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        field_of_each(&body, "partitions", "topic"),
        ["shared"],
        "{body}"
    );
    assert!(!body.contains("private"), "{body}");
    // The charts need describe on the cluster.
    let (status, body) = as_viewer("GET", "/api/metrics", None);
    assert_eq!(status, 403, "{body}");
    // A token not signed by this cluster's CA.
    let other = tempfile::tempdir().unwrap();
    let out = support::rill_command(other.path())
        .args(["token", "issue", "--principal", "root"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let foreign = format!("Bearer {}", String::from_utf8_lossy(&out.stdout).trim());
    let (status, body) = http_with(
        port,
        "GET",
        "/api/topics",
        None,
        &[("Authorization", &foreign)],
    )
    .unwrap();
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("not signed by the cluster's CA"), "{body}");

    // The browser: the sign-in form first.
    let base = format!("http://127.0.0.1:{port}/");
    driver.go(&format!("{base}#/topics"));
    driver.wait_for("the sign-in form", || {
        driver.js("return !!document.getElementById('sign-in');") == json!(true)
    });
    driver.js(&format!(
        "document.getElementById('token').value = {}; return null;",
        json!("not-a-token")
    ));
    driver.js("document.getElementById('sign-in').requestSubmit(); return null;");
    driver.wait_for("a bad token refused", || {
        driver
            .js("return document.getElementById('app').innerText;")
            .as_str()
            .is_some_and(|t| t.contains("malformed"))
    });
    driver.js(&format!(
        "document.getElementById('token').value = {}; return null;",
        json!(token)
    ));
    shoot("sign-in");
    driver.js("document.getElementById('sign-in').requestSubmit(); return null;");
    driver.wait_for("signed in as viewer, the topics it may see", || {
        driver.js("const p = document.getElementById('principal'); \
             return !!p && p.innerText === 'User:viewer' \
               && !!document.querySelector('#topics tr[data-topic=\"shared\"]') \
               && !document.querySelector('#topics tr[data-topic=\"private\"]');")
            == json!(true)
    });
    // A denied action: viewer may not create topics; the page says why.
    driver.js(
        "document.getElementById('new-topic-name').value = 'made-by-viewer';\
         document.getElementById('create-topic').requestSubmit(); return null;",
    );
    driver.confirm();
    driver.wait_for("the denial on the page", || {
        driver
            .js("const e = document.querySelector('#create-topic + div .error'); return e && e.innerText;")
            .as_str()
            .is_some_and(|t| t.contains("principal \"viewer\" may not create topic \"made-by-viewer\""))
    });
    shoot("denied");
    let list = as_root(&["topic", "list"]);
    assert!(!list.contains("made-by-viewer"), "{list}");
    // Signing out forgets the token.
    driver.js("document.getElementById('sign-out').click(); return null;");
    driver.wait_for("the sign-in form after signing out", || {
        driver.js("return !!document.getElementById('sign-in');") == json!(true)
    });
    let (status, _) = http_get(port, "/api/topics");
    assert_eq!(status, 401);
}

/// A child process killed (and reaped) when dropped, a failing test included.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `rill transform build --locked DIR` (DIR from the repository root, into the
/// guests' shared target dir target/wasm-guests); the .wasm it printed.
fn build_guest(dir: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = Command::new(support::rill_bin());
    cmd.env("CARGO_TARGET_DIR", root.join("target/wasm-guests"))
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .args(["transform", "build", "--locked"])
        .arg(root.join(dir));
    let out = support::run_bounded(&mut cmd, b"", Duration::from_secs(600));
    assert!(
        out.status.success(),
        "rill transform build {dir} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(stdout.trim().lines().last().expect("the .wasm path"))
}

/// Prints why the test does not run, or fails under CI.
fn skip_or_fail(reason: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("the console test needs Chromium and chromedriver: {reason}");
    }
    println!("SKIPPED: {reason}");
}

/// Installs Debian's chromium and chromium-driver when either is missing.
fn ensure_chromium() -> Result<(), String> {
    if Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists() {
        return Ok(());
    }
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "chromium", "chromium-driver"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run apt-get to install chromium: {e}"))
    };
    let mut out = install()?;
    if !out.status.success() {
        // Package lists never fetched (a fresh container) or stale: once more
        // after an update.
        let _ = Command::new("apt-get")
            .args(["update"])
            .stdin(Stdio::null())
            .output();
        out = install()?;
    }
    if !out.status.success() || !Path::new(CHROMEDRIVER).exists() {
        return Err(format!(
            "`apt-get install -y chromium chromium-driver` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// A chromedriver process and one browser session.
struct Driver {
    child: Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

impl Driver {
    fn start() -> Result<Driver, String> {
        let port = support::free_tcp_port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {CHROMEDRIVER}: {e}"))?;
        let profile = tempfile::Builder::new()
            .prefix("rill-console-chromium-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let mut d = Driver {
            child,
            port,
            session: String::new(),
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while http(port, "GET", "/status", None).is_err() {
            if Instant::now() > deadline {
                return Err("chromedriver did not answer within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let args = vec![
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--window-size=1280,900".into(),
            format!("--user-data-dir={}", d._profile.path().display()),
        ];
        let caps = json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
            }}
        });
        let (status, body) = http(port, "POST", "/session", Some(&caps))?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        match v["value"]["sessionId"].as_str() {
            Some(id) if status == 200 => d.session = id.to_string(),
            _ => return Err(format!("no browser session ({status}): {body}")),
        }
        Ok(d)
    }

    /// A WebDriver command of this session; its `value`.
    fn cmd(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let url = format!("/session/{}{path}", self.session);
        let (status, text) = http(self.port, method, &url, body)
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}: {text}"));
        assert_eq!(status, 200, "WebDriver {method} {path}: {text}");
        v["value"].clone()
    }

    fn go(&self, url: &str) {
        self.cmd("POST", "/url", Some(&json!({ "url": url })));
    }

    /// Runs `script` (a function body) in the page; what it returns.
    fn js(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(&json!({ "script": script, "args": [] })),
        )
    }

    /// Polls `ok` until it holds (bounded by [`PAGE_WAIT`]); on timeout fails
    /// with the page's text.
    fn wait_for(&self, what: &str, ok: impl Fn() -> bool) {
        let deadline = Instant::now() + PAGE_WAIT;
        while !ok() {
            if Instant::now() > deadline {
                let text = self.js("return document.body.innerText;");
                panic!(
                    "timed out waiting for {what}; the page shows:\n{}",
                    text.as_str().unwrap_or("")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the page's confirmation dialog and confirms.
    fn confirm(&self) {
        self.wait_for("the confirmation dialog", || {
            self.js("return document.getElementById('confirm').open;") == json!(true)
        });
        self.js("document.getElementById('confirm-ok').click(); return null;");
    }

    fn screenshot(&self, path: &PathBuf) {
        let b64 = self.cmd("GET", "/screenshot", None);
        let png = base64_decode(b64.as_str().expect("screenshot is base64"));
        std::fs::write(path, png).expect("write the screenshot");
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = http(
                self.port,
                "DELETE",
                &format!("/session/{}", self.session),
                None,
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The string `field` of each element of the array `list` of a JSON body.
fn field_of_each(body: &str, list: &str, field: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(body).unwrap();
    v[list]
        .as_array()
        .unwrap_or_else(|| panic!("no array {list} in {body}"))
        .iter()
        .map(|e| e[field].as_str().unwrap().to_string())
        .collect()
}

/// GET `path` from the console on `port`: status and body.
fn http_get(port: u16, path: &str) -> (u16, String) {
    http(port, "GET", path, None).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// One HTTP/1.1 request to 127.0.0.1:`port` (connection closed after it).
fn http(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    http_with(port, method, path, body, &[])
}

/// As [`http`], with `headers` besides.
fn http_with(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         {extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    // Read the head, then as many body bytes as it announces: chromedriver
    // keeps the connection open whatever `Connection: close` says.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!(
                "no HTTP response: {}",
                String::from_utf8_lossy(&raw)
            ));
        }
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    let mut body_bytes = raw[head_end + 4..].to_vec();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let chunked = head.contains("transfer-encoding: chunked");
    loop {
        let done = match length {
            Some(n) => body_bytes.len() >= n,
            None if chunked => body_bytes.ends_with(b"0\r\n\r\n"),
            None => false,
        };
        if done {
            break;
        }
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        body_bytes.extend_from_slice(&buf[..n]);
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status: {head}"))?;
    let rest = String::from_utf8_lossy(&body_bytes).to_string();
    let body = if chunked { dechunk(&rest) } else { rest };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Standard base64 (the screenshots WebDriver returns).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter_map(val) {
        acc = (acc << 6) | c;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}
