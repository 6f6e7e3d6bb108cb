//! Test opt-outs: `RILL_TEST_SKIP` is a comma list of test groups a developer
//! chose to skip (documented in README.md). `ipv6` sets the cfg `rill_skip_ipv6`,
//! which marks the IPv6 loopback test in tests/loopback.rs `#[ignore]` with
//! the reason, so cargo reports it as ignored instead of running it; without
//! the word, a host without IPv6 loopback fails that test. `s3` belongs to rill-cli's
//! build script; any other word is an error, so a typo skips nothing silently.

/// Every word RILL_TEST_SKIP may hold (each crate acts on its own).
const KNOWN: &[&str] = &["s3", "ipv6"];

fn main() {
    println!("cargo::rerun-if-env-changed=RILL_TEST_SKIP");
    println!("cargo::rustc-check-cfg=cfg(rill_skip_ipv6)");
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
    if words.contains(&"ipv6") {
        println!("cargo::rustc-cfg=rill_skip_ipv6");
    }
}
