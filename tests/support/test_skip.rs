// Shared by the build scripts of rill-net and rill-cli (`include!`d): reads
// `RILL_TEST_SKIP`, a comma list of test groups a developer chose to skip
// (README.md), and sets the cfg `rill_skip_<word>` for this crate's word, which
// marks its test `#[ignore]` with the reason. Any word not in KNOWN is a build
// error, so a typo skips nothing silently.

/// Every word RILL_TEST_SKIP may hold (each crate acts on its own).
const KNOWN: &[&str] = &["s3", "ipv6"];

/// Declares `rill_skip_<word>` and sets it when `RILL_TEST_SKIP` holds `word`.
fn test_skip_cfg(word: &str) {
    println!("cargo::rerun-if-env-changed=RILL_TEST_SKIP");
    println!("cargo::rustc-check-cfg=cfg(rill_skip_{word})");
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
    if words.contains(&word) {
        println!("cargo::rustc-cfg=rill_skip_{word}");
    }
}
