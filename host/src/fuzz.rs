//! Shared settings for the property tests that stand in for fuzzing (`make test` runs them
//! briefly with a fixed seed; `make fuzz` runs many more cases).
//!
//! `cargo fuzz` would need a nightly compiler and a sanitizer build of wasmtime for these targets;
//! property tests run inside the normal test build instead.

use proptest::test_runner::{Config, RngSeed};

/// Cases per property: `WDP_FUZZ_CASES`, or 256.
pub fn config() -> Config {
    let cases = std::env::var("WDP_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let seed = std::env::var("WDP_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_f5ee);
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    }
}
