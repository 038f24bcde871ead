//! `serial` scanner: USB serial adapters named by udev's stable `/dev/serial/by-id` links, so a
//! device keeps its id when the kernel renumbers it (squat/generic-device-plugin's `/dev/ttyUSB*`
//! groups and Akri's udev serial discovery follow the kernel's numbering instead).

use serde_json::json;
use tonic::Code;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::serve;

use super::common::{ids, one_scanner_config, scan, scan_once};

const FTDI: &str = "usb-FTDI_FT232R_USB_UART_A12345-if00-port0";
const CP2102N: &str =
    "usb-Silicon_Labs_CP2102N_USB_to_UART_Bridge_Controller_0001a2b3c4d5e6f7-if00-port0";
const ARDUINO: &str = "usb-Arduino__www.arduino.cc__0043_85736323838351F0E1A0-if00";

/// 32-bit FNV-1a, written out here from its definition (offset basis 0x811c9dc5, prime
/// 0x01000193) to check the documented id rule for long names independently of the scanner.
fn fnv1a(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The id of [`CP2102N`], by the crate's documented rule: too long for kubelet (82 characters),
/// so its first 54 characters, `-`, and 8 hex digits of FNV-1a of the whole name.
fn cp2102n_id() -> String {
    assert!(CP2102N.len() > 63);
    format!("{}-{:08x}", &CP2102N[..54], fnv1a(CP2102N))
}

/// A bench: an FTDI adapter on ttyUSB0, a CP2102N on ttyUSB2, an Arduino on ttyACM0, each with
/// udev's by-id and by-path links (relative, as udev makes them); an adapter on ttyUSB3 that udev
/// has not named; the on-board UART ttyS0. Majors: ttyUSB 188, ttyACM 166, ttyS 4 (minor 64).
pub(crate) fn bench() -> Fixture {
    let f = Fixture::new();
    f.char_dev("ttyUSB0", 188, 0)
        .char_dev("ttyUSB2", 188, 2)
        .char_dev("ttyUSB3", 188, 3)
        .char_dev("ttyACM0", 166, 0)
        .char_dev("ttyS0", 4, 64)
        .dev_link(&format!("serial/by-id/{FTDI}"), "../../ttyUSB0")
        .dev_link(&format!("serial/by-id/{CP2102N}"), "../../ttyUSB2")
        .dev_link(&format!("serial/by-id/{ARDUINO}"), "../../ttyACM0")
        .dev_link(
            "serial/by-path/pci-0000:00:14.0-usb-0:2:1.0-port0",
            "../../ttyUSB0",
        );
    f
}

fn node(host: &str, container: &str) -> serde_json::Value {
    json!({"container_path": container, "host_path": host, "permissions": "rw"})
}

fn by_id(name: &str) -> String {
    format!("/dev/serial/by-id/{name}")
}

#[test]
fn serial_scan_names_devices_by_their_by_id_links() {
    let f = bench();
    let tree = scan_once("serial", &f, &[]);
    let mut want = vec![FTDI.to_string(), ARDUINO.to_string(), cp2102n_id()];
    want.sort();
    assert_eq!(ids(&tree), [("serial".to_string(), want)]);
    assert_eq!(
        tree["serial"][FTDI],
        json!({
            "health": "Healthy",
            "nodes": [
                node("/dev/ttyUSB0", "/dev/ttyUSB0"),
                node("/dev/ttyUSB0", &by_id(FTDI)),
            ],
            "mounts": [],
            "envs": {},
            "annotations": {},
            "numa_nodes": null,
            "cdi_devices": [],
        })
    );
    assert_eq!(
        tree["serial"][cp2102n_id()]["nodes"],
        json!([
            node("/dev/ttyUSB2", "/dev/ttyUSB2"),
            node("/dev/ttyUSB2", &by_id(CP2102N)),
        ])
    );
    // No /dev/serial/by-id at all (no udev): an empty type.
    let bare = Fixture::new();
    bare.char_dev("ttyUSB0", 188, 0);
    assert_eq!(scan_once("serial", &bare, &[]), json!({"serial": {}}));
}

#[test]
fn serial_filters_unnamed_devices_paths_and_bad_values() {
    let f = bench();
    let tree = scan_once(
        "serial",
        &f,
        &[
            "SERIAL_MATCH=FTDI,usb-Arduino_*-if00,ttyUSB",
            "INCLUDE_UNNAMED=true",
            "CONTAINER_PATHS=kernel",
            "SERIAL_TYPE=uart",
        ],
    );
    // ttyUSB3 has no by-id link: named by the kernel, and kept by the substring "ttyUSB".
    assert_eq!(
        ids(&tree),
        [(
            "uart".to_string(),
            vec!["ttyUSB3".to_string(), ARDUINO.to_string(), FTDI.to_string()]
        )]
    );
    assert_eq!(
        tree["uart"][FTDI]["nodes"],
        json!([node("/dev/ttyUSB0", "/dev/ttyUSB0")])
    );
    assert_eq!(
        tree["uart"]["ttyUSB3"]["nodes"],
        json!([node("/dev/ttyUSB3", "/dev/ttyUSB3")])
    );

    let tree = scan_once(
        "serial",
        &f,
        &["SERIAL_MATCH=Silicon", "CONTAINER_PATHS=by-id"],
    );
    assert_eq!(ids(&tree), [("serial".to_string(), vec![cp2102n_id()])]);
    assert_eq!(
        tree["serial"][cp2102n_id()]["nodes"],
        json!([node("/dev/ttyUSB2", &by_id(CP2102N))])
    );
    // A glob must match the whole name.
    let tree = scan_once("serial", &f, &["SERIAL_MATCH=usb-FTDI_*-if00"]);
    assert_eq!(ids(&tree), [("serial".to_string(), vec![])]);

    for (env, want) in [
        (
            "INCLUDE_UNNAMED=yes",
            "INCLUDE_UNNAMED=\"yes\" is not valid",
        ),
        (
            "CONTAINER_PATHS=host",
            "CONTAINER_PATHS=\"host\" is not valid",
        ),
        (
            "SERIAL_MATCH=FTDI,,x",
            "SERIAL_MATCH=\"FTDI,,x\" is not valid",
        ),
        ("SERIAL_MATCH=by-id/FTDI", "pattern 1 is a path"),
        ("SERIAL_TYPE=a b", "SERIAL_TYPE=\"a b\" is not valid"),
    ] {
        let out = scan("serial", &f, &[env]);
        assert!(!out.status.success(), "{env} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{env}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_reenumeration_keeps_the_id_and_moves_the_node() {
    let f = bench();
    // A long rescan interval: only the host's /dev watch can wake the scanner in time.
    let config = one_scanner_config(
        &f,
        "serial",
        "serial.example.com",
        &["RESCAN_INTERVAL_MS: 600000"],
        false,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let resource = "serial.example.com/serial";
    let cp = cp2102n_id();
    seen.devices(resource, &[FTDI, ARDUINO, &cp]).await;

    let nodes = |r: &wdp_kubelet::api::AllocateResponse| -> Vec<(String, String, String)> {
        r.container_responses[0]
            .devices
            .iter()
            .map(|d| {
                (
                    d.host_path.clone(),
                    d.container_path.clone(),
                    d.permissions.clone(),
                )
            })
            .collect()
    };
    let rw = |h: &str, c: &str| (h.to_string(), c.to_string(), "rw".to_string());
    let r = kubelet.allocate(resource, &[FTDI, ARDUINO]).await.unwrap();
    assert_eq!(
        nodes(&r),
        [
            rw("/dev/ttyUSB0", "/dev/ttyUSB0"),
            rw("/dev/ttyUSB0", &by_id(FTDI)),
            rw("/dev/ttyACM0", "/dev/ttyACM0"),
            rw("/dev/ttyACM0", &by_id(ARDUINO)),
        ]
    );
    assert!(r.container_responses[0].envs.is_empty());

    // Unplugged: udev removes the link, the kernel the node. Listed, Unhealthy.
    std::fs::remove_file(f.dev().join(format!("serial/by-id/{FTDI}"))).unwrap();
    f.remove_dev("ttyUSB0");
    seen.health(resource, FTDI, "Unhealthy").await;
    let e = kubelet.allocate(resource, &[FTDI]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    // Plugged back and enumerated as ttyUSB1: the same id, the new node.
    f.char_dev("ttyUSB1", 188, 1)
        .dev_link(&format!("serial/by-id/{FTDI}"), "../../ttyUSB1");
    seen.health(resource, FTDI, "Healthy").await;
    let r = kubelet.allocate(resource, &[FTDI]).await.unwrap();
    assert_eq!(
        nodes(&r),
        [
            rw("/dev/ttyUSB1", "/dev/ttyUSB1"),
            rw("/dev/ttyUSB1", &by_id(FTDI)),
        ]
    );
    seen.devices(resource, &[FTDI, ARDUINO, &cp]).await;
    drop(host);
    kubelet.stop().await;
}
