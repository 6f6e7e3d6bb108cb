//! Test opt-out: `RILL_TEST_SKIP=s3` sets the cfg `rill_skip_s3`, which marks the
//! S3 tiering test in tests/tiered_storage.rs `#[ignore]` with the reason;
//! without it, a missing S3 server fails that test.

include!("../../tests/support/test_skip.rs");

fn main() {
    test_skip_cfg("s3");
}
