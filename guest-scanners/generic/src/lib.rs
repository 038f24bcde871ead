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

use discover::Machine;
use wdp_guest::usb::{self, UsbDevice};
use wdp_guest::{DeviceTree, devfs, sysfs};

/// The guest's view of the machine: /dev through devfs, /sys through std::fs.
struct Guest;

impl Machine for Guest {
    fn glob(&self, pattern: &str) -> Vec<String> {
        let found = if pattern.starts_with("/sys") {
            sysfs::glob_sys(pattern)
        } else {
            devfs::glob_dev(pattern)
        };
        // patterns were validated with the configuration
        found
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.path)
            .collect()
    }

    fn usb_devices(&self) -> Vec<UsbDevice> {
        usb::list()
    }

    fn exists(&self, path: &str) -> bool {
        devfs::stat(path).is_ok()
    }
}

struct Generic;

impl wdp_guest::Scanner for Generic {
    fn scan() -> Result<(), String> {
        let types =
            config::parse_devices(wdp_guest::config::env_var(config::DEVICES_ENV).as_deref())?;
        wdp_guest::run(|| -> Result<DeviceTree, String> { Ok(discover::discover(&types, &Guest)) })
    }
}

wdp_guest::export_scanner!(Generic);
