//! USB devices under `/sys/bus/usb/devices`: ids, serial numbers and their `/dev/bus/usb` nodes.
//!
//! Why: more than one scanner hands USB devices to containers (`generic`'s usb groups, `usb`'s
//! selectors), and each needs the same facts about every attached device: its vendor and product
//! ids, its serial number, and which `/dev/bus/usb/BBB/DDD` node usbfs gave it. Reading them in one
//! place keeps those scanners agreeing on which devices exist. The parsing is a plain function
//! ([`parse_device`]) so it can be tested off wasm.

use crate::hostfs::HostFs;
use crate::sysfs::StdFs;

/// Where the kernel lists every USB device and interface by its sysfs name.
pub const DEVICES_DIR: &str = "/sys/bus/usb/devices";

/// An attached USB device (not an interface), as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsbDevice {
    /// The sysfs name: `<bus>-<port>[.<port>...]` (e.g. `1-1.2`), or `usb<bus>` for a root hub.
    /// It names the physical port chain, so it survives a re-plug into the same port, unlike
    /// `dev`, which the kernel bumps on every plug.
    pub name: String,
    /// `idVendor`.
    pub vendor: u16,
    /// `idProduct`.
    pub product: u16,
    /// `serial`, when the device reports a non-empty one.
    pub serial: Option<String>,
    /// `busnum`.
    pub bus: u32,
    /// `devnum`: changes on every plug.
    pub dev: u32,
}

impl UsbDevice {
    /// The usbfs node libusb opens: `/dev/bus/usb/BBB/DDD` (three-digit, zero-padded).
    pub fn bus_path(&self) -> String {
        format!("/dev/bus/usb/{:03}/{:03}", self.bus, self.dev)
    }
}

/// Builds a [`UsbDevice`] from one sysfs directory's attributes (`idVendor`, `idProduct` hex;
/// `busnum`, `devnum` decimal; `serial` optional), each already trimmed. None when a required one
/// is missing or malformed: interfaces (`1-1.2:1.0`) have no `idVendor`, and a device being
/// removed may lose attributes between two reads.
pub fn parse_device(
    name: &str,
    vendor: Option<&str>,
    product: Option<&str>,
    serial: Option<&str>,
    busnum: Option<&str>,
    devnum: Option<&str>,
) -> Option<UsbDevice> {
    Some(UsbDevice {
        name: name.to_string(),
        vendor: u16::from_str_radix(vendor?, 16).ok()?,
        product: u16::from_str_radix(product?, 16).ok()?,
        serial: serial.filter(|s| !s.is_empty()).map(str::to_string),
        bus: busnum?.parse().ok()?,
        dev: devnum?.parse().ok()?,
    })
}

/// A USB vendor or product id as people write it: 1 to 4 hex digits, optionally `0x`-prefixed,
/// surrounding blanks ignored (`"1050"`, `"0x0407"`). Why: scanners that select USB devices by
/// id from their configuration (`generic`'s usb groups, `usb`'s selectors) should accept the
/// same spellings.
pub fn parse_id(s: &str) -> Option<u16> {
    let s = s.trim();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if s.is_empty() || s.len() > 4 || !s.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u16::from_str_radix(s, 16).ok()
}

/// Every attached USB device, in sysfs name order.
pub fn list() -> Vec<UsbDevice> {
    list_in(&StdFs)
}

/// Every attached USB device `fs` shows, in sysfs name order: [`list`] over any [`HostFs`], so a
/// scanner's unit tests can plug devices into a [`crate::hostfs::FakeFs`].
///
/// Every device's attributes are read in one batch ([`HostFs::read_attrs`]): one call to the host
/// for the whole bus in the guest, not five per device.
pub fn list_in(fs: &impl HostFs) -> Vec<UsbDevice> {
    const ATTRS: [&str; 5] = ["idVendor", "idProduct", "serial", "busnum", "devnum"];
    let names = fs.names(DEVICES_DIR);
    let paths: Vec<String> = names
        .iter()
        .flat_map(|name| ATTRS.map(|a| format!("{DEVICES_DIR}/{name}/{a}")))
        .collect();
    let values = fs.read_attrs(&paths);
    names
        .iter()
        .zip(values.chunks(ATTRS.len()))
        .filter_map(|(name, v)| {
            let at = |i: usize| v.get(i).and_then(|a| a.as_deref());
            parse_device(name, at(0), at(1), at(2), at(3), at(4))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_as_configured() {
        assert_eq!(parse_id("1050"), Some(0x1050));
        assert_eq!(parse_id(" 0x0407\n"), Some(0x0407));
        assert_eq!(parse_id("0XaB"), Some(0xab));
        for bad in ["", "0x", "12345", "xyz", "-1", "+1"] {
            assert_eq!(parse_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn sysfs_attributes() {
        let d = parse_device(
            "1-1.2",
            Some("1050"),
            Some("0407"),
            Some("ABC"),
            Some("1"),
            Some("12"),
        )
        .unwrap();
        assert_eq!(d.name, "1-1.2");
        assert_eq!((d.vendor, d.product), (0x1050, 0x0407));
        assert_eq!(d.bus_path(), "/dev/bus/usb/001/012");
        assert_eq!(d.serial.as_deref(), Some("ABC"));
        let hub = parse_device(
            "usb2",
            Some("1d6b"),
            Some("0002"),
            None,
            Some("2"),
            Some("1"),
        );
        assert_eq!(hub.unwrap().serial, None);
        let blank = parse_device(
            "2-3",
            Some("1d6b"),
            Some("0002"),
            Some(""),
            Some("2"),
            Some("1"),
        );
        assert_eq!(blank.unwrap().serial, None, "an empty serial is no serial");
        assert_eq!(
            parse_device("1-1:1.0", None, Some("1"), None, Some("1"), Some("1")),
            None
        );
        assert_eq!(
            parse_device("1-1", Some("zz"), Some("1"), None, Some("1"), Some("1")),
            None
        );
        assert_eq!(
            parse_device("1-1", Some("1"), Some("1"), None, Some("1"), None),
            None
        );
        assert_eq!(
            parse_device("1-1", Some("1"), Some("1"), None, Some("x"), Some("1")),
            None
        );
    }
}
