//! How much each scenario measures: the full run of `make bench`, or a smoke run (`--quick`)
//! that shrinks every count so the whole driver can be checked in a couple of minutes.

use std::time::Duration;

/// Run sizes. `--quick` shrinks every count for a smoke run.
pub struct Sizes {
    /// Plug/unplug cycles of the event-driven hot-plug row.
    pub hotplug_cycles: usize,
    /// Plug/unplug cycles of the 5 s poll baseline (each costs up to two periods).
    pub poll_cycles: usize,
    /// Appear/vanish cycles of the new-device-type row.
    pub newtype_cycles: usize,
    /// Measured Allocate calls per resource (after a tenth as many warm-up calls).
    pub allocate_calls: usize,
    /// kubelet restarts.
    pub restarts: usize,
    /// ListAndWatch streams cut from the stand-in's side.
    pub stream_cuts: usize,
    /// Warm starts of the host (after one cold start).
    pub starts: usize,
    /// The idle host's observation window.
    pub idle: Duration,
    /// Devices of the one-type bulk fixture.
    pub bulk_devices: usize,
    /// Add/remove cycles over the bulk fixture.
    pub bulk_cycles: usize,
    /// Devices of the wasm-vs-native fixture.
    pub wasm_devices: usize,
    /// Fresh wasm instances, each timed on its first scan.
    pub wasm_cold: usize,
    /// Rounds the wasm and native scans are taken in, alternated, so both sides see the same
    /// minutes of the machine.
    pub wasm_rounds: usize,
    /// Changes seen by one warm wasm instance.
    pub wasm_warm: usize,
    /// Timed scans of `generic-native`.
    pub native_runs: usize,
    /// Simulated nodes of the fleet row.
    pub fleet_nodes: usize,
    /// How long the fleet is watched at rest.
    pub fleet_rest: Duration,
}

impl Sizes {
    /// The sizes of `make bench`.
    pub fn full() -> Self {
        Sizes {
            hotplug_cycles: 100,
            poll_cycles: 6,
            newtype_cycles: 20,
            allocate_calls: 2000,
            restarts: 30,
            stream_cuts: 100,
            starts: 10,
            // From all listed: the start-up's 12 s, three default 30 s safety rescans (at about
            // 30, 60 and 90 s) and their hand-backs, then the steady state to ten minutes and more:
            // twenty rounds of rescans, enough for the anonymous memory's slope.
            idle: Duration::from_secs(620),
            bulk_devices: 10_000,
            bulk_cycles: 50,
            wasm_devices: 1000,
            wasm_cold: 100,
            wasm_rounds: 10,
            wasm_warm: 40,
            native_runs: 200,
            fleet_nodes: 1000,
            fleet_rest: Duration::from_secs(60),
        }
    }

    /// The sizes of `--quick`.
    pub fn quick() -> Self {
        Sizes {
            hotplug_cycles: 10,
            poll_cycles: 1,
            newtype_cycles: 3,
            allocate_calls: 200,
            restarts: 5,
            stream_cuts: 10,
            starts: 3,
            idle: Duration::from_secs(15),
            bulk_devices: 10_000,
            bulk_cycles: 3,
            wasm_devices: 1000,
            wasm_cold: 3,
            wasm_rounds: 1,
            wasm_warm: 5,
            native_runs: 20,
            fleet_nodes: 1000,
            fleet_rest: Duration::from_secs(10),
        }
    }
}
