//! Test opt-outs: `RILL_TEST_SKIP` is a comma list of test groups a developer
//! chose to skip (documented in README.md). `s3` sets the cfg `rill_skip_s3`,
//! which marks the S3 tiering test in tests/tiered_storage.rs `#[ignore]` with
//! the reason, so cargo reports it as ignored instead of running it; without
//! the word, a missing S3 server fails that test. `ipv6` belongs to rill-net's
//! build script; any other word is an error, so a typo skips nothing silently.

/// Every word RILL_TEST_SKIP may hold (each crate acts on its own).
const KNOWN: &[&str] = &["s3", "ipv6"];

fn main() {
    println!("cargo::rerun-if-env-changed=RILL_TEST_SKIP");
    println!("cargo::rustc-check-cfg=cfg(rill_skip_s3)");
    let skip = std::env::var("RILL_TEST_SKIP").unwrap_or_default();
    let words: Vec<&str> = skip
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .collect();
    for w in &words {
        assert!(
            KNOWN.contains(w),
            "RILL_TEST_SKIP={skip:?}: unknown word {w:?}; the known ones are {KNOWN:?}"
        );
    }
    if words.contains(&"s3") {
        println!("cargo::rustc-cfg=rill_skip_s3");
    }
}
