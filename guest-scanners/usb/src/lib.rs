//! `usb`: USB devices picked by vendor, product and serial number, one device per physical
//! device, with ids that survive a re-plug.
//!
//! Reads every device under `/sys/bus/usb/devices` (`idVendor`, `idProduct`, `serial`, `busnum`,
//! `devnum`; interfaces such as `1-1.2:1.0` have no ids and are skipped) and keeps those that
//! match a selector. Each match is one device whose node is its usbfs node
//! `/dev/bus/usb/BBB/DDD` (it must exist as a character device, checked through devfs), at the
//! same path in the container, permissions "rw" (what libusb opens).
//!
//! Device ids, stable across re-plugs (never `devnum`, which the kernel bumps on every plug):
//!
//! * `<vendor>-<product>-<serial>` (`1050-0407-12345678`, ids as four lower-case hex digits,
//!   the serial made id-safe by [`sanitize_id`]) when the device reports a serial that no other
//!   attached device with the same ids reports, and the id fits kubelet's 63 characters;
//! * otherwise `<vendor>-<product>-port-<sysfs name>` (`0403-6001-port-1-1.2`): the sysfs name is
//!   the bus and port chain, so the same device in the same port keeps its id.
//!
//! Configuration:
//!
//! * `USB_DEVICES` (required): comma-separated selectors `[type=]vendor:product[:serial]`,
//!   vendor and product as 1 to 4 hex digits (optionally `0x`), the serial matched exactly, e.g.
//!   `1050:0407,0403:6001:A12345` or `yubikey=1050:0407,ftdi=0403:6001`. A selector's `type=`
//!   names its device type (kubelet resource `<namespace>/<type>`); without it the type is
//!   `USB_TYPE`. A device matching several selectors belongs to the first one only, so one
//!   physical device is never offered under two resources.
//! * `USB_TYPE` (default `usb`): the device type of selectors without `type=`; 1 to 63
//!   characters, letters, digits, `-`, `_`, `.`, starting and ending with a letter or digit.
//! * `RESCAN_INTERVAL_MS` (default 30000): longest wait between scans (plugging a device changes
//!   /dev, which wakes the scanner at once).
//!
//! Every type named by a selector is in the tree, with zero devices when nothing matches. A
//! device that is unplugged stays listed, Unhealthy, until it comes back ([`Vanished`]).
//!
//! Replaces the `usb` groups of squat/generic-device-plugin (`deviceplugin/usb.go`) and Akri's
//! udev discovery handler for USB devices. Deliberate differences: squat bundles every match of
//! a group into ONE device with a fixed id (so two identical keys cannot go to two pods), here
//! each physical device is its own device; Akri names instances by a hash of the udev devpath and
//! matches udev rules, here ids are readable and the selector is vendor:product[:serial] only (the
//! sandbox has no udev database).

use wdp_guest::config::{self, excerpt};
use wdp_guest::health::Vanished;
use wdp_guest::tree::{is_dev_type, sanitize_id};
use wdp_guest::usb::{self, UsbDevice};
use wdp_guest::{DeviceInfo, DeviceTree, TreeBuilder, devfs};

/// The environment variable with the selectors.
pub const DEVICES_ENV: &str = "USB_DEVICES";
/// The environment variable with the default device type.
pub const TYPE_ENV: &str = "USB_TYPE";
/// The device type of selectors without `type=` when `USB_TYPE` is unset.
pub const DEFAULT_TYPE: &str = "usb";
/// kubelet's limit on device ids.
pub const MAX_ID_LEN: usize = 63;

const EXAMPLE: &str = "1050:0407,0403:6001:A12345";

/// One `[type=]vendor:product[:serial]` selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    /// The device type its matches go to.
    pub dev_type: String,
    /// `idVendor` to match.
    pub vendor: u16,
    /// `idProduct` to match.
    pub product: u16,
    /// Matched exactly when given.
    pub serial: Option<String>,
}

impl Selector {
    /// Whether `d` is a device this selector picks.
    pub fn matches(&self, d: &UsbDevice) -> bool {
        self.vendor == d.vendor
            && self.product == d.product
            && self
                .serial
                .as_ref()
                .is_none_or(|s| d.serial.as_ref() == Some(s))
    }
}

/// Reads `USB_TYPE` (None: unset).
pub fn parse_type(value: Option<&str>) -> Result<String, String> {
    let Some(raw) = value else {
        return Ok(DEFAULT_TYPE.to_string());
    };
    let t = raw.trim();
    if is_dev_type(t) {
        Ok(t.to_string())
    } else {
        Err(format!(
            "{TYPE_ENV}={:?} is not valid: expected 1 to 63 letters, digits, '-', '_' or '.', \
             starting and ending with a letter or digit (default {DEFAULT_TYPE})",
            excerpt(raw, 80)
        ))
    }
}

/// Reads `USB_DEVICES` (None: unset); selectors without `type=` get `default_type`. Every error
/// names the variable, the whole value, the offending selector and the valid form.
pub fn parse_selectors(value: Option<&str>, default_type: &str) -> Result<Vec<Selector>, String> {
    let form = format!(
        "expected comma-separated [type=]vendor:product[:serial] selectors with 1 to 4 hex digits \
         per id, e.g. {EXAMPLE}"
    );
    let Some(raw) = value else {
        return Err(format!("{DEVICES_ENV} is not set: {form}"));
    };
    let bad = |what: String| {
        format!(
            "{DEVICES_ENV}={:?} is not valid: {what}: {form}",
            excerpt(raw, 200)
        )
    };
    let mut out = Vec::new();
    for (i, item) in raw.split(',').enumerate() {
        let item = item.trim();
        if item.is_empty() {
            if raw.trim().is_empty() {
                return Err(bad("no selector".into()));
            }
            return Err(bad(format!("selector {} is empty", i + 1)));
        }
        let (dev_type, ids) = match item.split_once('=') {
            Some((t, rest)) => {
                let t = t.trim();
                if !is_dev_type(t) {
                    return Err(bad(format!(
                        "selector {} {item:?} has type {t:?}, which is not 1 to 63 letters, \
                         digits, '-', '_' or '.' starting and ending with a letter or digit",
                        i + 1
                    )));
                }
                (t.to_string(), rest)
            }
            None => (default_type.to_string(), item),
        };
        let mut parts = ids.splitn(3, ':');
        let (Some(v), Some(p)) = (parts.next(), parts.next()) else {
            return Err(bad(format!(
                "selector {} {item:?} has no vendor:product",
                i + 1
            )));
        };
        let (Some(vendor), Some(product)) = (usb::parse_id(v), usb::parse_id(p)) else {
            return Err(bad(format!(
                "selector {} {item:?} has an id that is not 1 to 4 hex digits",
                i + 1
            )));
        };
        let serial = parts.next().map(str::trim).filter(|s| !s.is_empty());
        out.push(Selector {
            dev_type,
            vendor,
            product,
            serial: serial.map(str::to_string),
        });
    }
    Ok(out)
}

/// The stable id of `d` among all `attached` devices (see the crate doc).
pub fn device_id(d: &UsbDevice, attached: &[UsbDevice]) -> String {
    let ids = format!("{:04x}-{:04x}", d.vendor, d.product);
    if let Some(serial) = &d.serial {
        let shared = attached.iter().any(|o| {
            o.name != d.name
                && o.vendor == d.vendor
                && o.product == d.product
                && o.serial == d.serial
        });
        let id = format!("{ids}-{}", sanitize_id(serial));
        if !shared && id.len() <= MAX_ID_LEN {
            return id;
        }
    }
    format!("{ids}-port-{}", sanitize_id(&d.name))
}

/// The device tree for `selectors` over the `attached` devices; `is_char_device(path)` says
/// whether a usbfs node exists (a device whose node is missing is not usable yet).
pub fn tree(
    selectors: &[Selector],
    attached: &[UsbDevice],
    is_char_device: impl Fn(&str) -> bool,
) -> DeviceTree {
    let mut t = TreeBuilder::new();
    for s in selectors {
        t.group(&s.dev_type);
    }
    for d in attached {
        let Some(s) = selectors.iter().find(|s| s.matches(d)) else {
            continue;
        };
        let node = d.bus_path();
        if !is_char_device(&node) {
            continue;
        }
        t.add(
            &s.dev_type,
            device_id(d, attached),
            DeviceInfo::new().node(&node, &node, "rw"),
        );
    }
    t.build()
}

struct Usb;

impl wdp_guest::Scanner for Usb {
    fn scan() -> Result<(), String> {
        let dev_type = parse_type(config::env_var(TYPE_ENV).as_deref())?;
        let selectors = parse_selectors(config::env_var(DEVICES_ENV).as_deref(), &dev_type)?;
        let mut vanished = Vanished::new();
        wdp_guest::run(move || {
            let now = tree(&selectors, &usb::list(), devfs::exists_char_device);
            Ok(vanished.mark(now))
        })
    }
}

wdp_guest::export_scanner!(Usb);

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(
        name: &str,
        vendor: u16,
        product: u16,
        serial: Option<&str>,
        bus: u32,
        dev: u32,
    ) -> UsbDevice {
        UsbDevice {
            name: name.into(),
            vendor,
            product,
            serial: serial.map(str::to_string),
            bus,
            dev,
        }
    }

    fn ids(t: &DeviceTree) -> Vec<(String, Vec<String>)> {
        t.iter()
            .map(|g| {
                (
                    g.dev_type.clone(),
                    g.devices.iter().map(|d| d.id.clone()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn selectors() {
        let s = parse_selectors(Some(" 1050:0407 , ftdi=0x0403:6001:A1:2"), "usb").unwrap();
        assert_eq!(
            s,
            [
                Selector {
                    dev_type: "usb".into(),
                    vendor: 0x1050,
                    product: 0x0407,
                    serial: None
                },
                Selector {
                    dev_type: "ftdi".into(),
                    vendor: 0x0403,
                    product: 0x6001,
                    serial: Some("A1:2".into())
                },
            ]
        );
        assert_eq!(parse_selectors(Some("1:2:"), "t").unwrap()[0].serial, None);
        for bad in [
            "",
            "1050",
            "1050:zz",
            "12345:1",
            "1050:0407,",
            "bad type=1:2",
            "-x=1:2",
            ":1",
        ] {
            let e = parse_selectors(Some(bad), "usb").unwrap_err();
            assert!(
                e.starts_with(&format!("USB_DEVICES={bad:?} is not valid")),
                "{e}"
            );
            assert!(e.contains("vendor:product"), "{e}");
        }
        let e = parse_selectors(None, "usb").unwrap_err();
        assert!(e.starts_with("USB_DEVICES is not set"), "{e}");
    }

    #[test]
    fn types() {
        assert_eq!(parse_type(None).unwrap(), "usb");
        assert_eq!(parse_type(Some("yubikey")).unwrap(), "yubikey");
        for bad in ["", "a/b", "-a", "a b", &"x".repeat(64)] {
            let e = parse_type(Some(bad)).unwrap_err();
            assert!(e.starts_with("USB_TYPE="), "{e}");
        }
    }

    #[test]
    fn ids_prefer_unique_serials_then_ports() {
        let attached = [
            dev("1-1", 0x1050, 0x0407, Some("123 45"), 1, 4),
            dev("1-2", 0x0403, 0x6001, Some("0001"), 1, 5),
            dev("2-1.4", 0x0403, 0x6001, Some("0001"), 2, 9),
            dev("2-2", 0x0403, 0x6001, None, 2, 10),
            dev("2-3", 0x0403, 0x6001, Some(&"S".repeat(60)), 2, 11),
        ];
        let got: Vec<String> = attached.iter().map(|d| device_id(d, &attached)).collect();
        assert_eq!(
            got,
            [
                "1050-0407-123_45",
                "0403-6001-port-1-2",
                "0403-6001-port-2-1.4",
                "0403-6001-port-2-2",
                "0403-6001-port-2-3",
            ]
        );
        // The same serial under other ids is no clash.
        let other = [
            dev("1-2", 0x0403, 0x6001, Some("0001"), 1, 5),
            dev("1-3", 0x0403, 0x6015, Some("0001"), 1, 6),
        ];
        assert_eq!(device_id(&other[0], &other), "0403-6001-0001");
    }

    #[test]
    fn first_selector_wins_and_nodes_must_exist() {
        let selectors =
            parse_selectors(Some("key=1050:0407:9,1050:0407,none=dead:beef"), "usb").unwrap();
        let attached = [
            dev("usb1", 0x1d6b, 0x0002, None, 1, 1),
            dev("1-1", 0x1050, 0x0407, Some("9"), 1, 4),
            dev("1-2", 0x1050, 0x0407, Some("8"), 1, 7),
            dev("1-3", 0x1050, 0x0407, None, 1, 8),
        ];
        let t = tree(&selectors, &attached, |p| p != "/dev/bus/usb/001/008");
        assert_eq!(
            ids(&t),
            [
                ("key".to_string(), vec!["1050-0407-9".to_string()]),
                ("usb".to_string(), vec!["1050-0407-8".to_string()]),
                ("none".to_string(), vec![]),
            ]
        );
        let n = &t[1].devices[0].info.nodes[0];
        assert_eq!(
            (
                n.host_path.as_str(),
                n.container_path.as_str(),
                n.permissions.as_str()
            ),
            ("/dev/bus/usb/001/007", "/dev/bus/usb/001/007", "rw")
        );
    }
}
