//! `generic`: squat/generic-device-plugin's model as a wdp scanner, configured only by the
//! environment.
//!
//! * `DEVICES` (required): JSON list of device types, e.g.
//!   `[{"name":"serial","groups":[{"paths":[{"path":"/dev/ttyUSB*"}]}]},
//!     {"name":"yubikey","groups":[{"usb":[{"vendor":"1050","product":"0407"}]}]}]`
//!   (see [`config`] for every field and [`discover`] for how devices and ids are formed).
//! * `RESCAN_INTERVAL_MS` (default 30000): longest wait between scans.

pub mod config;
pub mod discover;
pub mod live;

use wdp_guest::hostfs::Host;

struct Generic;

impl wdp_guest::Scanner for Generic {
    fn scan() -> Result<(), String> {
        let types =
            config::parse_devices(wdp_guest::config::env_var(config::DEVICES_ENV).as_deref())?;
        wdp_guest::scan::run_incremental(&mut live::Live::new(types, Host))
    }
}

wdp_guest::export_scanner!(Generic);
