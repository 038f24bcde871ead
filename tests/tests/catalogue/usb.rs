//! `usb` scanner: USB devices picked by `vendor:product[:serial]` selectors, one device per
//! physical device (squat/generic-device-plugin's usb groups, Akri's udev USB discovery), with
//! ids that survive a re-plug: `<vendor>-<product>-<serial>`, or the port when there is no
//! unique serial.

use serde_json::json;
use tonic::Code;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::serve;

use super::common::{ids, one_scanner_config, scan, scan_once};

/// The xHCI controller the fixture's USB tree hangs off.
const XHCI: &str = "devices/pci0000:00/0000:00:14.0";

/// A USB device (or root hub) at `<XHCI>/<path>` named by the last component of `path`, listed
/// in `bus/usb/devices` by the relative link real sysfs has, with `attrs` and its usbfs node
/// `/dev/bus/usb/BBB/DDD` (major 189, minor `(bus-1)*128 + dev-1`, as the kernel numbers them).
fn plug(f: &Fixture, path: &str, bus: u32, dev: u32, attrs: &[(&str, &str)]) {
    let name = path.rsplit('/').next().unwrap();
    let dir = format!("{XHCI}/{path}");
    let minor = (bus - 1) * 128 + dev - 1;
    let mut all: Vec<(String, String)> = vec![
        ("busnum".into(), bus.to_string()),
        ("devnum".into(), dev.to_string()),
        ("dev".into(), format!("189:{minor}")),
    ];
    all.extend(attrs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    for (k, v) in all {
        f.sys_file(&format!("{dir}/{k}"), &format!("{v}\n"));
    }
    f.sys_dir("bus/usb/devices");
    f.sys_link(
        &format!("bus/usb/devices/{name}"),
        &format!("../../../{dir}"),
    );
    f.char_dev(&format!("bus/usb/{bus:03}/{dev:03}"), 189, minor);
}

/// What unplugging does: the sysfs directory, its bus link and the usbfs node go away.
fn unplug(f: &Fixture, path: &str, bus: u32, dev: u32) {
    let name = path.rsplit('/').next().unwrap();
    std::fs::remove_dir_all(f.sys().join(format!("{XHCI}/{path}"))).unwrap();
    std::fs::remove_file(f.sys().join(format!("bus/usb/devices/{name}"))).unwrap();
    f.remove_dev(&format!("bus/usb/{bus:03}/{dev:03}"));
}

/// An interface directory (`1-1:1.0`): in `bus/usb/devices` too, but with no device ids.
fn interface(f: &Fixture, device_path: &str, name: &str) {
    let dir = format!("{XHCI}/{device_path}/{name}");
    f.sys_file(&format!("{dir}/bInterfaceClass"), "03\n");
    f.sys_link(
        &format!("bus/usb/devices/{name}"),
        &format!("../../../{dir}"),
    );
}

const FTDI_A: &str = "usb1/1-2/1-2.3";
const FTDI_B: &str = "usb1/1-2/1-2.4";

/// A workstation: two root hubs, a YubiKey without a serial in port 1, a hub in port 2 with two
/// FTDI serial adapters (serials A12345 and A99999) behind it.
pub(crate) fn workstation() -> Fixture {
    let f = Fixture::new();
    plug(
        &f,
        "usb1",
        1,
        1,
        &[
            ("idVendor", "1d6b"),
            ("idProduct", "0002"),
            ("serial", "0000:00:14.0"),
        ],
    );
    plug(
        &f,
        "usb2",
        2,
        1,
        &[
            ("idVendor", "1d6b"),
            ("idProduct", "0003"),
            ("serial", "0000:00:14.0"),
        ],
    );
    plug(
        &f,
        "usb1/1-1",
        1,
        4,
        &[
            ("idVendor", "1050"),
            ("idProduct", "0407"),
            ("product", "YubiKey OTP+FIDO+CCID"),
        ],
    );
    interface(&f, "usb1/1-1", "1-1:1.0");
    plug(
        &f,
        "usb1/1-2",
        1,
        5,
        &[("idVendor", "05e3"), ("idProduct", "0610")],
    );
    let ftdi = |serial: &'static str| {
        [
            ("idVendor", "0403"),
            ("idProduct", "6001"),
            ("product", "FT232R USB UART"),
            ("serial", serial),
        ]
    };
    plug(&f, FTDI_A, 1, 7, &ftdi("A12345"));
    interface(&f, FTDI_A, "1-2.3:1.0");
    plug(&f, FTDI_B, 1, 8, &ftdi("A99999"));
    f
}

fn node(path: &str) -> serde_json::Value {
    json!({"container_path": path, "host_path": path, "permissions": "rw"})
}

#[test]
fn usb_scan_picks_selected_devices_with_stable_ids() {
    let f = workstation();
    let tree = scan_once("usb", &f, &["USB_DEVICES=1050:0407,0403:6001:A12345"]);
    assert_eq!(
        ids(&tree),
        [(
            "usb".to_string(),
            vec![
                "0403-6001-A12345".to_string(),
                "1050-0407-port-1-1".to_string()
            ]
        )]
    );
    assert_eq!(
        tree["usb"]["0403-6001-A12345"],
        json!({
            "health": "Healthy",
            "nodes": [node("/dev/bus/usb/001/007")],
            "mounts": [],
            "envs": {},
            "annotations": {},
            "numa_nodes": null,
            "cdi_devices": [],
        })
    );
    assert_eq!(
        tree["usb"]["1050-0407-port-1-1"]["nodes"],
        json!([node("/dev/bus/usb/001/004")])
    );
}

#[test]
fn usb_selectors_types_and_bad_values() {
    let f = workstation();
    // Named selectors give their own types; the first matching selector wins a device.
    let tree = scan_once(
        "usb",
        &f,
        &[
            "USB_DEVICES=key=1050:0407, ftdi=0x0403:6001:A99999, 0403:6001, none=dead:beef",
            "USB_TYPE=serial-adapters",
        ],
    );
    assert_eq!(
        ids(&tree),
        [
            ("ftdi".to_string(), vec!["0403-6001-A99999".to_string()]),
            ("key".to_string(), vec!["1050-0407-port-1-1".to_string()]),
            ("none".to_string(), vec![]),
            (
                "serial-adapters".to_string(),
                vec!["0403-6001-A12345".to_string()]
            ),
        ]
    );

    // Two adapters reporting the same serial (cheap clones do): the ports tell them apart.
    std::fs::write(f.sys().join(format!("{XHCI}/{FTDI_B}/serial")), "A12345\n").unwrap();
    let tree = scan_once("usb", &f, &["USB_DEVICES=0403:6001"]);
    assert_eq!(
        ids(&tree),
        [(
            "usb".to_string(),
            vec![
                "0403-6001-port-1-2.3".to_string(),
                "0403-6001-port-1-2.4".to_string()
            ]
        )]
    );
    // A device whose usbfs node is not there (yet) is not offered.
    f.remove_dev("bus/usb/001/008");
    let tree = scan_once("usb", &f, &["USB_DEVICES=0403:6001"]);
    assert_eq!(
        ids(&tree),
        [("usb".to_string(), vec!["0403-6001-port-1-2.3".to_string()])]
    );

    for (env, want) in [
        (None, "USB_DEVICES is not set"),
        (
            Some("USB_DEVICES=1050"),
            "USB_DEVICES=\"1050\" is not valid",
        ),
        (
            Some("USB_DEVICES=1050:0407x"),
            "USB_DEVICES=\"1050:0407x\" is not valid",
        ),
        (
            Some("USB_DEVICES=a b=1:2"),
            "USB_DEVICES=\"a b=1:2\" is not valid",
        ),
    ] {
        let env: Vec<&str> = env.into_iter().collect();
        let out = scan("usb", &f, &env);
        assert!(!out.status.success(), "{env:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(want) && err.contains("[type=]vendor:product[:serial]"),
            "{env:?}: {err}"
        );
    }
    let out = scan("usb", &f, &["USB_DEVICES=1:2", "USB_TYPE=a/b"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("USB_TYPE=\"a/b\" is not valid"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usb_replug_keeps_the_id_and_allocates_the_new_node() {
    let f = workstation();
    // A long rescan interval: only the host's /dev and /sys watches can wake the scanner in time.
    let config = one_scanner_config(
        &f,
        "usb",
        "usb.example.com",
        &[
            "RESCAN_INTERVAL_MS: 600000",
            "USB_DEVICES: '1050:0407,0403:6001:A12345'",
        ],
        false,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let resource = "usb.example.com/usb";
    let ftdi = "0403-6001-A12345";
    let key = "1050-0407-port-1-1";
    seen.devices(resource, &[ftdi, key]).await;

    let r = kubelet.allocate(resource, &[ftdi, key]).await.unwrap();
    let c = &r.container_responses[0];
    let nodes = wdp_tests::node_specs(c);
    assert_eq!(
        nodes,
        [
            ("/dev/bus/usb/001/007", "/dev/bus/usb/001/007", "rw"),
            ("/dev/bus/usb/001/004", "/dev/bus/usb/001/004", "rw"),
        ]
    );
    assert!(c.envs.is_empty() && c.mounts.is_empty());

    // Unplugged: still listed, Unhealthy, not allocatable.
    unplug(&f, FTDI_A, 1, 7);
    seen.health(resource, ftdi, "Unhealthy").await;
    seen.health(resource, key, "Healthy").await;
    let e = kubelet.allocate(resource, &[ftdi]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    // Plugged back (the kernel gives it a new device number): same id, new node.
    plug(
        &f,
        FTDI_A,
        1,
        9,
        &[
            ("idVendor", "0403"),
            ("idProduct", "6001"),
            ("serial", "A12345"),
        ],
    );
    seen.health(resource, ftdi, "Healthy").await;
    let r = kubelet.allocate(resource, &[ftdi]).await.unwrap();
    let hosts: Vec<&str> = r.container_responses[0]
        .devices
        .iter()
        .map(|d| d.host_path.as_str())
        .collect();
    assert_eq!(hosts, ["/dev/bus/usb/001/009"]);
    drop(host);
    kubelet.stop().await;
}
