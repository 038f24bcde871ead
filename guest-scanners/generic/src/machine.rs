//! The guest's view of the machine for [`crate::discover`]: /dev through devfs, /sys through
//! std::fs. Shared with the `poller` test guest (included from source), so both loops of the
//! benchmark's hot-plug comparison read the machine the same way.

use crate::discover::Machine;
use wdp_guest::usb::{self, UsbDevice};
use wdp_guest::{devfs, sysfs};

/// The guest's view of the machine: /dev through devfs, /sys through std::fs.
pub struct Guest;

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
