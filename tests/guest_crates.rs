//! The guest crates' own unit tests, run natively as part of the workspace's tests.
//!
//! Each transform guest (examples/ and tests/guests/) is a cargo workspace of its
//! own, so `cargo test --workspace` does not reach the tests inside it: the RSS
//! cleaner's HTML and de-duplication logic, the activity counter's windows, and so
//! on. This runs `cargo test --locked` natively in each of them and checks that
//! every `#[test]` in the crate's sources ran and passed, so a test that stopped
//! being compiled (a lost `mod`, a cfg) fails here rather than vanishing.

#[path = "support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::run_bounded;

/// Bound on one guest crate's native build and test run (the first compiles serde).
const GUEST_TEST_TIMEOUT: Duration = Duration::from_secs(600);

/// Every guest crate of the repository (the workspace's `exclude` list).
const GUEST_CRATES: &[&str] = &[
    "examples/identity",
    "examples/rss-cleaner/transform",
    "examples/profiles/transform",
    "examples/activity/transform",
    "tests/guests/faulty",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// How many `#[test]` functions the crate's sources declare.
fn declared_tests(dir: &Path) -> usize {
    let mut count = 0;
    let mut pending = vec![dir.join("src")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                count += text.lines().filter(|l| l.trim() == "#[test]").count();
            }
        }
    }
    count
}

/// Sums "N passed; M failed" over every `test result:` line of cargo's output.
fn passed_and_failed(stdout: &str) -> (usize, usize) {
    let mut passed = 0;
    let mut failed = 0;
    for line in stdout.lines().filter(|l| l.starts_with("test result:")) {
        let number_before = |word: &str| -> usize {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words
                .iter()
                .position(|w| w.trim_end_matches([';', ',']) == word)
                .unwrap_or_else(|| panic!("no {word:?} in {line:?}"));
            words[at - 1].parse().unwrap()
        };
        passed += number_before("passed");
        failed += number_before("failed");
    }
    (passed, failed)
}

#[test]
fn the_result_line_parser_counts_every_result_line() {
    let out = "running 2 tests\n\
               test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n\
               test result: FAILED. 1 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out\n";
    assert_eq!(passed_and_failed(out), (3, 3));
}

#[test]
fn every_guest_crates_unit_tests_pass_natively() {
    let root = root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut total = 0;
    for guest in GUEST_CRATES {
        let dir = root.join(guest);
        let declared = declared_tests(&dir);
        let mut cmd = Command::new(&cargo);
        cmd.args(["test", "--locked"])
            .current_dir(&dir)
            // One target dir for all guests: their dependencies build once.
            .env("CARGO_TARGET_DIR", root.join("target/guest-native"))
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS");
        let out = run_bounded(&mut cmd, b"", GUEST_TEST_TIMEOUT);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "cargo test in {guest} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (passed, failed) = passed_and_failed(&stdout);
        assert_eq!(failed, 0, "{guest}:\n{stdout}");
        assert_eq!(
            passed, declared,
            "{guest} declares {declared} #[test] functions but {passed} ran and passed:\n{stdout}"
        );
        total += passed;
    }
    // The guests hold about ten tests; none of them may silently disappear.
    assert!(total >= 10, "only {total} guest tests ran");
}
