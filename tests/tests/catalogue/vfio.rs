//! `vfio`: PCI functions bound to vfio-pci, selected by device id, as Intel's `pkg/vfio` serves
//! them (DSA's `-driver=vfio-pci` mode: `dsa.intel.com/vfio`), over a machine with DSA devices
//! (0x0b25) on vfio-pci and on idxd, an IAA device (0x0cfe) on vfio-pci and an unrelated GPU.

use serde_json::json;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::serve;

use super::common::{ids, ids_of, one_scanner_config, scan, scan_once};

/// The dynamic major the kernel gave "vfio" group nodes (`/proc/devices`).
const VFIO_MAJOR: u32 = 243;
/// DSA's ids as `cmd/dsa_plugin` passes them to `pkg/vfio`.
const DSA_IDS: &str = "VFIO_DEVICE_IDS=0x0b25,0x11fb,0x1212";

/// `(address, device id, driver, IOMMU group)`; the group node exists for vfio-pci functions.
const FUNCTIONS: [(&str, &str, &str, u32); 5] = [
    ("0000:00:02.0", "0x56c0", "i915", 0),
    ("0000:6a:01.0", "0x0b25", "vfio-pci", 60),
    ("0000:6a:02.0", "0x0cfe", "vfio-pci", 61),
    ("0000:6f:01.0", "0x0b25", "idxd", 62),
    ("0000:74:01.0", "0x0b25", "vfio-pci", 63),
];

pub(crate) fn machine(f: &Fixture) {
    f.char_dev("vfio/vfio", 10, 196);
    for (bdf, id, driver, group) in FUNCTIONS {
        f.pci_device(
            bdf,
            &[("vendor", "0x8086"), ("device", id), ("class", "0x088000")],
        );
        f.pci_bind(bdf, driver);
        f.pci_iommu_group(bdf, &group.to_string());
        if driver == "vfio-pci" {
            f.char_dev(&format!("vfio/{group}"), VFIO_MAJOR, group);
        }
    }
}

#[test]
fn dsa_functions_on_vfio_pci_are_served() {
    let f = Fixture::new();
    machine(&f);
    let tree = scan_once("vfio", &f, &[DSA_IDS]);
    // 0000:6f:01.0 is a DSA too but bound to idxd.
    assert_eq!(
        ids(&tree),
        ids_of(&[("vfio", &["0000:6a:01.0", "0000:74:01.0"])])
    );
    let mut dev = tree["vfio"]["0000:74:01.0"].clone();
    // The host fills NUMA nodes from sysfs; that is tested with the host, not here.
    dev.as_object_mut().unwrap().remove("numa_nodes");
    assert_eq!(
        dev,
        json!({
            "health": "Healthy",
            "nodes": [
                {"container_path": "/dev/vfio/63", "host_path": "/dev/vfio/63", "permissions": "rw"},
                {"container_path": "/dev/vfio/vfio", "host_path": "/dev/vfio/vfio", "permissions": "rw"}
            ],
            "mounts": [],
            "envs": {"VFIO_BDF2": "0000:74:01.0"},
            "annotations": {},
            "cdi_devices": []
        })
    );
}

#[test]
fn options_choose_ids_and_type_and_are_checked() {
    let f = Fixture::new();
    machine(&f);
    let tree = scan_once(
        "vfio",
        &f,
        &["VFIO_DEVICE_IDS=0B25 0x0cfe", "VFIO_TYPE=accel-vfio"],
    );
    assert_eq!(
        ids(&tree),
        ids_of(&[(
            "accel-vfio",
            &["0000:6a:01.0", "0000:6a:02.0", "0000:74:01.0"]
        )])
    );
    // Numbered in address order over the matching vfio-pci functions.
    assert_eq!(
        tree["accel-vfio"]["0000:6a:02.0"]["envs"],
        json!({"VFIO_BDF2": "0000:6a:02.0"})
    );
    assert_eq!(
        tree["accel-vfio"]["0000:74:01.0"]["envs"],
        json!({"VFIO_BDF3": "0000:74:01.0"})
    );
    let tree = scan_once("vfio", &f, &["VFIO_DEVICE_IDS=0x1212"]);
    assert_eq!(ids(&tree), ids_of::<&str>(&[]));

    let bad: [(&[&str], &str); 3] = [
        (&[], "VFIO_DEVICE_IDS is not set"),
        (
            &["VFIO_DEVICE_IDS=0xb25"],
            "VFIO_DEVICE_IDS=\"0xb25\" is not valid",
        ),
        (
            &[DSA_IDS, "VFIO_TYPE=dsa/vfio"],
            "VFIO_TYPE=\"dsa/vfio\" is not valid",
        ),
    ];
    for (envs, start) in bad {
        let out = scan("vfio", &f, envs);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{envs:?} must fail");
        assert!(stderr.contains(start), "{envs:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbound_function_turns_unhealthy_and_recovers() {
    let f = Fixture::new();
    machine(&f);
    let config = one_scanner_config(
        &f,
        "vfio",
        "dsa.intel.com",
        &[
            "VFIO_DEVICE_IDS: '0x0b25,0x11fb,0x1212'",
            "RESCAN_INTERVAL_MS: 600000",
        ],
        true,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let res = "dsa.intel.com/vfio";
    seen.devices(res, &["0000:6a:01.0", "0000:74:01.0"]).await;

    // Unbinding the group's last function from vfio-pci removes its node: a /dev change that
    // wakes the scanner (the rescan interval is ten minutes).
    f.pci_unbind("0000:74:01.0");
    f.remove_dev("vfio/63");
    seen.health(res, "0000:74:01.0", "Unhealthy").await;
    seen.health(res, "0000:6a:01.0", "Healthy").await;
    let e = kubelet.allocate(res, &["0000:74:01.0"]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");

    f.pci_bind("0000:74:01.0", "vfio-pci");
    f.char_dev("vfio/63", VFIO_MAJOR, 63);
    seen.health(res, "0000:74:01.0", "Healthy").await;

    // Unbinding alone (no /dev change): the host watches the driver directories.
    f.pci_unbind("0000:6a:01.0");
    seen.health(res, "0000:6a:01.0", "Unhealthy").await;
    f.pci_bind("0000:6a:01.0", "vfio-pci");
    seen.health(res, "0000:6a:01.0", "Healthy").await;

    // Allocate: the nodes of both groups (the shared control node once), and the post-allocator
    // renumbers VFIO_BDF1/VFIO_BDF2 to VFIO_BDF0/VFIO_BDF1 in the order of the original numbers.
    let r = kubelet
        .allocate(res, &["0000:74:01.0", "0000:6a:01.0"])
        .await
        .unwrap();
    let c = &r.container_responses[0];
    let mut envs: Vec<(&str, &str)> = c
        .envs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    envs.sort();
    assert_eq!(
        envs,
        [("VFIO_BDF0", "0000:6a:01.0"), ("VFIO_BDF1", "0000:74:01.0")]
    );
    let nodes: Vec<&str> = c.devices.iter().map(|d| d.host_path.as_str()).collect();
    assert_eq!(nodes, ["/dev/vfio/63", "/dev/vfio/vfio", "/dev/vfio/60"]);
    assert!(c.devices.iter().all(|d| d.permissions == "rw"));
    assert!(c.mounts.is_empty() && c.annotations.is_empty());

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}
