//! Test opt-out: `RILL_TEST_SKIP=ipv6` sets the cfg `rill_skip_ipv6`, which marks
//! the IPv6 loopback test in tests/loopback.rs `#[ignore]` with the reason;
//! without it, a host without IPv6 loopback fails that test.

include!("../../tests/support/test_skip.rs");

fn main() {
    test_skip_cfg("ipv6");
}
