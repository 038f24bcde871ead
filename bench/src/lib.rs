//! `wdp-bench`: the benchmarks behind `make bench`.
//!
//! * `benches/micro.rs`: criterion micro-benchmarks of the host's hot paths (tree validation and
//!   diffing of 10,000 devices, ListAndWatch and Allocate messages, devfs calls).
//! * `src/main.rs` and `src/scenarios/`: the end-to-end driver. It runs `wdp run` as a child
//!   process against the kubelet stand-in over real Unix sockets, on fixture trees with real
//!   device nodes (mknod: run as root), measures every row of the results table (each against its
//!   target) and writes `bench/RESULTS.md`.
//!
//! This library holds what both share: statistics, fixtures and `/proc` readings. The fixture
//! trees, the process handle of `wdp run` and the observer of the kubelet stand-in are the
//! integration tests' own (`wdp_tests`), so the benchmarks run what the tests check. The native half
//! of the wasm-vs-native row is `guest-scanners/test-guests/generic-native` (the `generic`
//! scanner's own source compiled for the build machine), run as a process by the driver.

pub mod fixtures;
pub mod procfs;
pub mod stats;
