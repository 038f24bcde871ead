//! `npu`: Intel NPUs as Intel's NPU plugin serves them (`npu.intel.com/accel`), over a machine
//! with a Meteor Lake NPU on intel_vpu, an accel device of another vendor, and an Intel accel
//! device whose id is not an NPU's.

use serde_json::json;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::serve;

use super::common::{ids, ids_of, one_scanner_config, scan, scan_once};

/// The accel subsystem's major (`/proc/devices`: 261 accel).
const ACCEL_MAJOR: u32 = 261;

/// `(address, vendor, device id, driver, accel minor)`.
const ACCELS: [(&str, &str, &str, &str, u32); 3] = [
    // Core Ultra (Meteor Lake) NPU.
    ("0000:00:0b.0", "0x8086", "0x7d1d", "intel_vpu", 0),
    // Habana Gaudi2.
    ("0000:4d:00.0", "0x1da3", "0x1020", "habanalabs", 1),
    // An Intel accel device upstream does not know.
    ("0000:00:0c.0", "0x8086", "0x1234", "intel_vpu", 2),
];

/// An accel device as the kernel makes it: the PCI function with its driver, `accel/accelN`
/// below it with `dev` and the `device` link back, the class link, `/sys/dev/char` and the node.
fn accel(f: &Fixture, bdf: &str, vendor: &str, id: &str, driver: &str, n: u32) {
    let dir = f.pci_device(
        bdf,
        &[
            ("vendor", vendor),
            ("device", id),
            ("class", "0x120000"),
            ("numa_node", "-1"),
        ],
    );
    f.pci_bind(bdf, driver);
    accel_node(f, &dir, bdf, n);
}

/// What the driver registers for `accel<n>` below the PCI function at `dir`.
fn accel_node(f: &Fixture, dir: &str, bdf: &str, n: u32) {
    let node_dir = format!("{dir}/accel/accel{n}");
    f.sys_file(&format!("{node_dir}/dev"), &format!("{ACCEL_MAJOR}:{n}\n"));
    f.sys_link(&format!("{node_dir}/device"), &format!("../../../{bdf}"));
    f.sys_link(
        &format!("class/accel/accel{n}"),
        &format!("../../{node_dir}"),
    );
    f.sys_link(
        &format!("dev/char/{ACCEL_MAJOR}:{n}"),
        &format!("../../{node_dir}"),
    );
    f.char_dev(&format!("accel/accel{n}"), ACCEL_MAJOR, n);
}

pub(crate) fn machine(f: &Fixture) {
    for (bdf, vendor, id, driver, n) in ACCELS {
        accel(f, bdf, vendor, id, driver, n);
    }
}

#[test]
fn intel_npus_are_served_as_accel() {
    let f = Fixture::new();
    machine(&f);
    let tree = scan_once("npu", &f, &[]);
    assert_eq!(ids(&tree), ids_of(&[("accel", &["accel0-0"])]));
    let mut dev = tree["accel"]["accel0-0"].clone();
    // The host fills NUMA nodes from sysfs; that is tested with the host, not here.
    dev.as_object_mut().unwrap().remove("numa_nodes");
    assert_eq!(
        dev,
        json!({
            "health": "Healthy",
            "nodes": [
                {"container_path": "/dev/accel/accel0", "host_path": "/dev/accel/accel0", "permissions": "rw"}
            ],
            "mounts": [],
            "envs": {},
            "annotations": {},
            "cdi_devices": []
        })
    );

    // A known NPU without its node is not advertised.
    accel(&f, "0000:00:0d.0", "0x8086", "0x643e", "intel_vpu", 3);
    f.remove_dev("accel/accel3");
    let tree = scan_once("npu", &f, &[]);
    assert_eq!(ids(&tree), ids_of(&[("accel", &["accel0-0"])]));
}

#[test]
fn shared_dev_num_shares_each_npu_and_is_checked() {
    let f = Fixture::new();
    machine(&f);
    accel(&f, "0000:00:0d.0", "0x8086", "0x643e", "intel_vpu", 3);
    let tree = scan_once("npu", &f, &["SHARED_DEV_NUM=2"]);
    assert_eq!(
        ids(&tree),
        ids_of(&[("accel", &["accel0-0", "accel0-1", "accel3-0", "accel3-1"])])
    );
    assert_eq!(
        tree["accel"]["accel3-1"]["nodes"][0]["host_path"],
        "/dev/accel/accel3"
    );
    for bad in ["0", "many", "10001"] {
        let out = scan("npu", &f, &[&format!("SHARED_DEV_NUM={bad}")]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "SHARED_DEV_NUM={bad} must fail");
        assert!(
            stderr.contains(&format!("SHARED_DEV_NUM=\"{bad}\" is not valid")),
            "{stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npu_is_allocated_and_turns_unhealthy_while_unbound() {
    let f = Fixture::new();
    machine(&f);
    let config = one_scanner_config(
        &f,
        "npu",
        "npu.intel.com",
        &["SHARED_DEV_NUM: 2", "RESCAN_INTERVAL_MS: 600000"],
        false,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let res = "npu.intel.com/accel";
    seen.devices(res, &["accel0-0", "accel0-1"]).await;

    let r = kubelet.allocate(res, &["accel0-1"]).await.unwrap();
    assert_eq!(r.container_responses.len(), 1);
    let c = &r.container_responses[0];
    assert_eq!(c.devices.len(), 1);
    assert_eq!(c.devices[0].host_path, "/dev/accel/accel0");
    assert_eq!(c.devices[0].container_path, "/dev/accel/accel0");
    assert_eq!(c.devices[0].permissions, "rw");
    assert!(c.mounts.is_empty() && c.envs.is_empty() && c.annotations.is_empty());

    // Unbinding intel_vpu removes the accel device and its node; the /dev change wakes the
    // scanner (the rescan interval is ten minutes).
    let dir = "devices/pci0000:00/0000:00:0b.0";
    f.pci_unbind("0000:00:0b.0");
    std::fs::remove_file(f.sys().join("class/accel/accel0")).unwrap();
    std::fs::remove_file(f.sys().join(format!("dev/char/{ACCEL_MAJOR}:0"))).unwrap();
    std::fs::remove_dir_all(f.sys().join(format!("{dir}/accel"))).unwrap();
    f.remove_dev("accel/accel0");
    seen.health(res, "accel0-0", "Unhealthy").await;
    seen.health(res, "accel0-1", "Unhealthy").await;

    // Bound again: the same devices, Healthy.
    f.pci_bind("0000:00:0b.0", "intel_vpu");
    accel_node(&f, dir, "0000:00:0b.0", 0);
    seen.health(res, "accel0-0", "Healthy").await;
    seen.health(res, "accel0-1", "Healthy").await;

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}
