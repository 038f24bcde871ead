//! `poller`: the poll-mode baseline of `make bench` (bench/): the `generic` scanner's own logic
//! (its `config.rs` and `discover.rs`, included from source), but looping the way upstream device
//! plugins do (Intel's scan every 5 s, squat/generic-device-plugin's periodic rescans): scan,
//! notify when the tree changed, `std::thread::sleep`, again. It never calls `wait-for-change`, so
//! a hot-plug is seen only at the next tick: the bench measures both loops on the same fixture to
//! give the event-driven loop's latency gain.
//!
//! * `DEVICES` (required): as for `generic`.
//! * `POLL_INTERVAL_MS` (default 5000): the sleep between two scans.

#[path = "../../../generic/src/config.rs"]
pub mod config;
#[path = "../../../generic/src/discover.rs"]
pub mod discover;

use std::time::Duration;

use wdp_guest::DeviceTree;
use wdp_guest::hostfs::Host;

/// The environment variable with the sleep between scans, in milliseconds.
pub const POLL_INTERVAL_ENV: &str = "POLL_INTERVAL_MS";
/// Intel's device plugins scan every 5 s.
pub const DEFAULT_POLL_INTERVAL_MS: u32 = 5_000;

struct Poller;

impl wdp_guest::Scanner for Poller {
    fn scan() -> Result<(), String> {
        let types =
            config::parse_devices(wdp_guest::config::env_var(config::DEVICES_ENV).as_deref())?;
        let interval =
            wdp_guest::config::env_u32(POLL_INTERVAL_ENV, DEFAULT_POLL_INTERVAL_MS, 1..=u32::MAX)?;
        let sleep = Duration::from_millis(interval.into());
        wdp_guest::scan::run_with(
            || -> Result<DeviceTree, String> { Ok(discover::discover(&types, &Host)) },
            wdp_guest::notify,
            || {
                std::thread::sleep(sleep);
                true
            },
        )
    }
}

wdp_guest::export_scanner!(Poller);
