//! `qat`: QAT VFs in DPDK mode, as Intel's `cmd/qat_plugin/dpdkdrv` serves them
//! (`qat.intel.com/<services>`), over a Gen4 machine laid out as the kernel lays it out: PFs
//! bound to `4xxx` with `virtfn<i>` -> `../<VF>` links, VFs with `physfn` -> `../<PF>`, bound
//! to `vfio-pci`, each in its own IOMMU group with its `/dev/vfio/<group>` node.

use std::time::Duration;

use serde_json::{Value, json};
use wdp_kubelet::api;
use wdp_tests::fixture::{Fixture, PCI_ROOT};
use wdp_tests::guest;
use wdp_tests::host::serve;

use super::common::{self, ids, ids_of, one_scanner_config, scan, scan_once};

/// The dynamic major the kernel gave "vfio" group nodes (`/proc/devices`).
const VFIO_MAJOR: u32 = 243;

/// A QAT PF `pf` with PCI device id `pf_id`, bound to `pf_driver`, with VFs `(address,
/// driver, IOMMU group)` of id `vf_id`: the group node exists for VFs bound to vfio-pci.
fn pf(f: &Fixture, pf: &str, pf_id: &str, pf_driver: &str, vf_id: &str, vfs: &[(&str, &str, u32)]) {
    let n = vfs.len().to_string();
    let dir = f.pci_device(
        pf,
        &[
            ("vendor", "0x8086"),
            ("device", pf_id),
            ("sriov_numvfs", &n),
            ("sriov_totalvfs", "16"),
        ],
    );
    f.pci_bind(pf, pf_driver);
    for (i, (vf, driver, group)) in vfs.iter().enumerate() {
        let vf_dir = f.pci_device(vf, &[("vendor", "0x8086"), ("device", vf_id)]);
        f.sys_link(&format!("{dir}/virtfn{i}"), &format!("../{vf}"));
        f.sys_link(&format!("{vf_dir}/physfn"), &format!("../{pf}"));
        f.pci_bind(vf, driver);
        f.pci_iommu_group(vf, &group.to_string());
        if *driver == "vfio-pci" {
            f.char_dev(&format!("vfio/{group}"), VFIO_MAJOR, *group);
        }
    }
}

/// Two 4xxx PFs: `0000:6b:00.0` up with `sym;asym` (type `cy`) and three VFs on vfio-pci;
/// `0000:70:00.0` not up, `dc` only in debugfs `dev_cfg`, with one VF on vfio-pci and one
/// still on the kernel's `4xxxvf`. Heartbeats read `0`.
pub(crate) fn gen4(f: &Fixture) {
    f.char_dev("vfio/vfio", 10, 196);
    pf(
        f,
        "0000:6b:00.0",
        "0x4940",
        "4xxx",
        "0x4941",
        &[
            ("0000:6b:00.1", "vfio-pci", 41),
            ("0000:6b:00.2", "vfio-pci", 42),
            ("0000:6b:00.3", "vfio-pci", 43),
        ],
    );
    f.sys_file(&format!("{PCI_ROOT}/0000:6b:00.0/qat/state"), "up\n")
        .sys_file(
            &format!("{PCI_ROOT}/0000:6b:00.0/qat/cfg_services"),
            "sym;asym\n",
        );
    pf(
        f,
        "0000:70:00.0",
        "0x4940",
        "4xxx",
        "0x4941",
        &[
            ("0000:70:00.1", "vfio-pci", 51),
            ("0000:70:00.2", "4xxxvf", 52),
        ],
    );
    f.sys_file(&format!("{PCI_ROOT}/0000:70:00.0/qat/state"), "down\n")
        .sys_file(
            "kernel/debug/qat_4xxx_0000:70:00.0/dev_cfg",
            "[GENERAL]\nServicesEnabled = dc\nConfigVersion = 2\n\n[KERNEL]\nNumberCyInstances = 0\n",
        );
    for p in ["0000:6b:00.0", "0000:70:00.0"] {
        f.sys_file(
            &format!("kernel/debug/qat_4xxx_{p}/heartbeat/status"),
            "0\n",
        );
    }
}

/// `wdp scan --once` allowing mounts below `allow` (for igb_uio's `/sys/class/uio` mounts).
fn scan_allowing(f: &Fixture, env: &[&str], allow: &str) -> Value {
    common::scan_once_allowing("qat", f, env, &[allow])
}

fn without_numa(mut v: Value) -> Value {
    // The host fills NUMA nodes from sysfs; that is tested with the host, not here.
    v.as_object_mut().map(|o| o.remove("numa_nodes"));
    v
}

#[test]
fn vfs_are_typed_by_their_pfs_services() {
    let f = Fixture::new();
    gen4(&f);
    let tree = scan_once("qat", &f, &[]);
    assert_eq!(
        ids(&tree),
        ids_of(&[
            ("cy", &["0000:6b:00.1", "0000:6b:00.2", "0000:6b:00.3"]),
            // 0000:70:00.2 is still on 4xxxvf: wdp does not rebind, so it is not served.
            ("dc", &["0000:70:00.1"]),
        ])
    );
    // The VF list is 6b:00.1 6b:00.2 6b:00.3 70:00.1 70:00.2: QAT<n> is the place in it.
    assert_eq!(
        without_numa(tree["cy"]["0000:6b:00.2"].clone()),
        json!({
            "health": "Healthy",
            "nodes": [
                {"container_path": "/dev/vfio/42", "host_path": "/dev/vfio/42", "permissions": "rw"},
                {"container_path": "/dev/vfio/vfio", "host_path": "/dev/vfio/vfio", "permissions": "rw"}
            ],
            "mounts": [],
            "envs": {"QAT2": "0000:6b:00.2"},
            "annotations": {},
            "cdi_devices": []
        })
    );
    assert_eq!(
        tree["dc"]["0000:70:00.1"]["envs"],
        json!({"QAT4": "0000:70:00.1"})
    );
}

#[test]
fn options_select_drivers_counts_and_dpdk_modes() {
    let f = Fixture::new();
    gen4(&f);
    // MAX_NUM_DEVICES counts VFs in list order, before any check.
    let tree = scan_once("qat", &f, &["MAX_NUM_DEVICES=2"]);
    assert_eq!(
        ids(&tree),
        ids_of(&[("cy", &["0000:6b:00.1", "0000:6b:00.2"])])
    );
    // No 420xx PF and no 420xx VF (id 4947): nothing.
    let tree = scan_once("qat", &f, &["KERNEL_VF_DRIVERS=420xxvf"]);
    assert_eq!(ids(&tree), ids_of::<&str>(&[]));

    // igb_uio: only the VF bound to it is served, with its uio node and a writable mount.
    f.pci_bind("0000:6b:00.3", "igb_uio");
    f.sys_dir(&format!("{PCI_ROOT}/0000:6b:00.3/uio/uio0"));
    f.sys_link(
        "class/uio/uio0",
        &format!("../../{PCI_ROOT}/0000:6b:00.3/uio/uio0"),
    );
    f.char_dev("uio0", 239, 0);
    let tree = scan_allowing(&f, &["DPDK_DRIVER=igb_uio"], "/sys/class/uio");
    assert_eq!(ids(&tree), ids_of(&[("cy", &["0000:6b:00.3"])]));
    assert_eq!(
        without_numa(tree["cy"]["0000:6b:00.3"].clone()),
        json!({
            "health": "Healthy",
            "nodes": [{"container_path": "/dev/uio0", "host_path": "/dev/uio0", "permissions": "rw"}],
            "mounts": [{"container_path": "/sys/class/uio/uio0/device",
                        "host_path": "/sys/class/uio/uio0/device", "read_only": false}],
            "envs": {"QAT3": "0000:6b:00.3"},
            "annotations": {},
            "cdi_devices": []
        })
    );

    for (env, start) in [
        ("DPDK_DRIVER=uio", "DPDK_DRIVER=\"uio\" is not valid"),
        (
            "KERNEL_VF_DRIVERS=c6xxxvf",
            "KERNEL_VF_DRIVERS=\"c6xxxvf\" is not valid",
        ),
        ("MAX_NUM_DEVICES=0", "MAX_NUM_DEVICES=\"0\" is not valid"),
    ] {
        let out = scan("qat", &f, &[env]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{env} must fail");
        assert!(stderr.contains(start), "{env}: {stderr}");
    }
}

#[test]
fn vm_without_pfs_finds_vfs_by_device_id() {
    let f = Fixture::new();
    f.char_dev("vfio/vfio", 10, 196);
    // A guest given a Gen4 VF and a C62x VF; no PF, so no services: type generic.
    for (bdf, id, group) in [("0000:00:05.0", "0x4941", 5), ("0000:00:06.0", "0x37c9", 6)] {
        f.pci_device(bdf, &[("vendor", "0x8086"), ("device", id)]);
        f.pci_bind(bdf, "vfio-pci");
        f.pci_iommu_group(bdf, &group.to_string());
        f.char_dev(&format!("vfio/{group}"), VFIO_MAJOR, group);
    }
    // unsafe no-IOMMU mode: the group node is noiommu-<n>.
    f.sys_file("kernel/iommu_groups/6/name", "vfio-noiommu\n");
    f.remove_dev("vfio/6");
    f.char_dev("vfio/noiommu-6", VFIO_MAJOR, 6);
    let tree = scan_once("qat", &f, &[]);
    assert_eq!(ids(&tree), ids_of(&[("generic", &["0000:00:05.0"])]));
    let tree = scan_once("qat", &f, &["KERNEL_VF_DRIVERS=4xxxvf,c6xxvf"]);
    assert_eq!(
        ids(&tree),
        ids_of(&[("generic", &["0000:00:05.0", "0000:00:06.0"])])
    );
    assert_eq!(
        tree["generic"]["0000:00:06.0"]["nodes"][0]["host_path"],
        "/dev/vfio/noiommu-6"
    );
    assert_eq!(
        tree["generic"]["0000:00:06.0"]["envs"],
        json!({"QAT2": "0000:00:06.0"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbound_vf_turns_unhealthy_and_recovers() {
    let f = Fixture::new();
    gen4(&f);
    let config = one_scanner_config(
        &f,
        "qat",
        "qat.intel.com",
        &["RESCAN_INTERVAL_MS: 600000"],
        true,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let cy = "qat.intel.com/cy";
    seen.devices(cy, &["0000:6b:00.1", "0000:6b:00.2", "0000:6b:00.3"])
        .await;
    seen.devices("qat.intel.com/dc", &["0000:70:00.1"]).await;

    // Unbinding from vfio-pci: the kernel removes the group's node too; that /dev change wakes
    // the scanner (the rescan interval is ten minutes).
    f.pci_unbind("0000:6b:00.1");
    f.remove_dev("vfio/41");
    seen.health(cy, "0000:6b:00.1", "Unhealthy").await;
    seen.health(cy, "0000:6b:00.2", "Healthy").await;
    let e = kubelet.allocate(cy, &["0000:6b:00.1"]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");

    f.pci_bind("0000:6b:00.1", "vfio-pci");
    f.char_dev("vfio/41", VFIO_MAJOR, 41);
    seen.health(cy, "0000:6b:00.1", "Healthy").await;
    kubelet.allocate(cy, &["0000:6b:00.1"]).await.unwrap();

    // A sysfs-only unbind (another function still holds the group open, say): the host
    // watches the driver directories, so this wakes the scanner too.
    let dc = "qat.intel.com/dc";
    f.pci_unbind("0000:70:00.1");
    seen.health(dc, "0000:70:00.1", "Unhealthy").await;
    f.pci_bind("0000:70:00.1", "vfio-pci");
    seen.health(dc, "0000:70:00.1", "Healthy").await;

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_and_services_are_seen_at_the_rescan() {
    let f = Fixture::new();
    gen4(&f);
    // The host does not watch debugfs or the PF's qat/ attributes (real sysfs sends no events
    // for them either): these changes are picked up by the periodic rescan, kept short here.
    let config = one_scanner_config(
        &f,
        "qat",
        "qat.intel.com",
        &["RESCAN_INTERVAL_MS: 200"],
        false,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let (cy, dc) = ("qat.intel.com/cy", "qat.intel.com/dc");
    seen.devices(cy, &["0000:6b:00.1", "0000:6b:00.2", "0000:6b:00.3"])
        .await;
    seen.health(dc, "0000:70:00.1", "Healthy").await;

    f.sys_file(
        "kernel/debug/qat_4xxx_0000:6b:00.0/heartbeat/status",
        "-1\n",
    );
    for vf in ["0000:6b:00.1", "0000:6b:00.2", "0000:6b:00.3"] {
        seen.health(cy, vf, "Unhealthy").await;
    }
    seen.health(dc, "0000:70:00.1", "Healthy").await;
    f.sys_file("kernel/debug/qat_4xxx_0000:6b:00.0/heartbeat/status", "0\n");
    for vf in ["0000:6b:00.1", "0000:6b:00.2", "0000:6b:00.3"] {
        seen.health(cy, vf, "Healthy").await;
    }

    // Reconfiguring the PF moves its VFs to the new type; the old one is not left behind.
    f.sys_file(
        &format!("{PCI_ROOT}/0000:70:00.0/qat/cfg_services"),
        "asym\n",
    )
    .sys_file(&format!("{PCI_ROOT}/0000:70:00.0/qat/state"), "up\n");
    seen.devices("qat.intel.com/asym", &["0000:70:00.1"]).await;
    seen.ended(dc).await;

    // Many scans later, the VF left on the kernel driver was reported once, on stderr.
    let log = host.log();
    let note = "QAT VF 0000:70:00.2 is bound to driver 4xxxvf, not vfio-pci: not served";
    assert_eq!(log.matches(note).count(), 1, "{log}");

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// A debugfs or sysfs attribute change sends no inotify event; on a real node the kernel's
/// uevent for what caused it (a heartbeat failure comes with a device reset) is what wakes the
/// scanner. Here any uevent does: the scanner rescans at once, not after its 10 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_uevent_wakes_the_scanner() {
    let f = Fixture::new();
    gen4(&f);
    let config = one_scanner_config(
        &f,
        "qat",
        "qat.intel.com",
        &["RESCAN_INTERVAL_MS: 600000"],
        false,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let cy = "qat.intel.com/cy";
    seen.health(cy, "0000:6b:00.1", "Healthy").await;
    f.sys_file(
        "kernel/debug/qat_4xxx_0000:6b:00.0/heartbeat/status",
        "-1\n",
    );
    wdp_tests::kernel_uevent();
    seen.health(cy, "0000:6b:00.1", "Unhealthy").await;
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_renumbers_envs_per_container() {
    let f = Fixture::new();
    gen4(&f);
    let config = one_scanner_config(
        &f,
        "qat",
        "qat.intel.com",
        &["RESCAN_INTERVAL_MS: 600000"],
        true,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let cy = "qat.intel.com/cy";
    seen.devices(cy, &["0000:6b:00.1", "0000:6b:00.2", "0000:6b:00.3"])
        .await;
    seen.devices("qat.intel.com/dc", &["0000:70:00.1"]).await;

    let r = kubelet
        .allocate(cy, &["0000:6b:00.3", "0000:6b:00.1"])
        .await
        .unwrap();
    let c = &r.container_responses[0];
    let mut envs: Vec<(&str, &str)> = c
        .envs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    envs.sort();
    assert_eq!(envs, [("QAT0", "0000:6b:00.1"), ("QAT1", "0000:6b:00.3")]);
    let nodes = wdp_tests::node_specs(c);
    assert_eq!(
        nodes,
        [
            ("/dev/vfio/43", "/dev/vfio/43", "rw"),
            ("/dev/vfio/vfio", "/dev/vfio/vfio", "rw"),
            ("/dev/vfio/41", "/dev/vfio/41", "rw"),
        ]
    );
    assert!(c.mounts.is_empty() && c.annotations.is_empty() && c.cdi_devices.is_empty());

    // Two containers in one request: each counts from QAT0 and sees only its own VFs
    // (upstream's hook shares one map, so the second container would also get the first's).
    let mut client = kubelet.client(cy).unwrap();
    let request = api::AllocateRequest {
        container_requests: vec![
            api::ContainerAllocateRequest {
                devices_ids: vec!["0000:6b:00.2".into()],
            },
            api::ContainerAllocateRequest {
                devices_ids: vec!["0000:6b:00.3".into(), "0000:6b:00.1".into()],
            },
        ],
    };
    let r = tokio::time::timeout(Duration::from_secs(20), client.allocate(request))
        .await
        .expect("allocate in time")
        .unwrap()
        .into_inner();
    let envs = |i: usize| {
        let mut e: Vec<(String, String)> =
            r.container_responses[i].envs.clone().into_iter().collect();
        e.sort();
        e
    };
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert_eq!(envs(0), [pair("QAT0", "0000:6b:00.2")]);
    assert_eq!(
        envs(1),
        [pair("QAT0", "0000:6b:00.1"), pair("QAT1", "0000:6b:00.3")]
    );

    let r = kubelet
        .allocate("qat.intel.com/dc", &["0000:70:00.1"])
        .await
        .unwrap();
    let envs: Vec<_> = r.container_responses[0].envs.iter().collect();
    assert_eq!(envs, [(&"QAT0".to_string(), &"0000:70:00.1".to_string())]);

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn igb_uio_mounts_reach_the_container_when_allowed() {
    let f = Fixture::new();
    gen4(&f);
    f.pci_bind("0000:6b:00.2", "igb_uio");
    f.sys_dir(&format!("{PCI_ROOT}/0000:6b:00.2/uio/uio1"));
    f.sys_link(
        "class/uio/uio1",
        &format!("../../{PCI_ROOT}/0000:6b:00.2/uio/uio1"),
    );
    f.char_dev("uio1", 239, 1);
    let component = guest("qat").display().to_string();
    let config = f.write_config(&format!(
            "scanners:\n  - name: qat\n    component: {component}\n    post-allocator: {component}\n    namespace: qat.intel.com\n    env: {{ DPDK_DRIVER: igb_uio, RESCAN_INTERVAL_MS: 600000 }}\n    policy: {{ allowed-mounts: [/sys/class/uio] }}\n"
        ),
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("qat.intel.com/cy", &["0000:6b:00.2"]).await;
    let r = kubelet
        .allocate("qat.intel.com/cy", &["0000:6b:00.2"])
        .await
        .unwrap();
    let c = &r.container_responses[0];
    assert_eq!(c.envs.get("QAT0").map(String::as_str), Some("0000:6b:00.2"));
    assert_eq!(c.devices.len(), 1);
    assert_eq!(c.devices[0].host_path, "/dev/uio1");
    assert_eq!(c.mounts.len(), 1);
    assert_eq!(c.mounts[0].host_path, "/sys/class/uio/uio1/device");
    assert_eq!(c.mounts[0].container_path, "/sys/class/uio/uio1/device");
    assert!(!c.mounts[0].read_only);
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}
