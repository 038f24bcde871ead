//! `dlb`: Intel DLB 2.5 (Sapphire Rapids) devices as Intel's DLB plugin serves them
//! (`dlb.intel.com/pf` and `dlb.intel.com/vf`), over a machine with two DLB PFs on the dlb2
//! driver, one of which gets SR-IOV VFs; the device ids are the nodes' full paths, as upstream.
//!
//! Ignored for now: the host refuses `/` in device ids, so these trees are refused (and `wdp scan
//! --once` waits for a tree that never comes). Both tests pass with that rule relaxed.

use serde_json::json;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::serve;

use super::common::{ids, ids_of, one_scanner_config, scan_once};

/// The dynamic major the kernel gave "dlb".
const DLB_MAJOR: u32 = 236;
/// DLB 2.5's PCI ids.
const PF_ID: &str = "0x2714";
const VF_ID: &str = "0x2715";

/// A DLB function at `bdf` whose dlb2 device is `dlb<n>`: the PCI function on dlb2, the
/// `dlb2/dlb<n>` directory below it with `dev` and the `device` link back, the class link, the
/// `/sys/dev/char` link and the node.
fn dlb(f: &Fixture, bdf: &str, id: &str, n: u32, sriov_numvfs: Option<&str>) {
    let mut attrs = vec![("vendor", "0x8086"), ("device", id), ("class", "0x0b4000")];
    if let Some(v) = sriov_numvfs {
        attrs.push(("sriov_numvfs", v));
    }
    let dir = f.pci_device(bdf, &attrs);
    f.pci_bind(bdf, "dlb2");
    dlb_node(f, &dir, bdf, n);
}

/// What dlb2 registers for `dlb<n>` below the PCI function at `dir`.
fn dlb_node(f: &Fixture, dir: &str, bdf: &str, n: u32) {
    let node_dir = format!("{dir}/dlb2/dlb{n}");
    f.sys_file(&format!("{node_dir}/dev"), &format!("{DLB_MAJOR}:{n}\n"));
    f.sys_link(&format!("{node_dir}/device"), &format!("../../../{bdf}"));
    f.sys_link(&format!("class/dlb2/dlb{n}"), &format!("../../{node_dir}"));
    f.sys_link(
        &format!("dev/char/{DLB_MAJOR}:{n}"),
        &format!("../../{node_dir}"),
    );
    f.char_dev(&format!("dlb{n}"), DLB_MAJOR, n);
}

/// Two PFs without VFs.
pub(crate) fn machine(f: &Fixture) {
    dlb(f, "0000:6d:00.0", PF_ID, 0, Some("0"));
    dlb(f, "0000:f5:00.0", PF_ID, 1, Some("0"));
}

/// Enables two VFs on the first PF: its `sriov_numvfs` says 2 and the VFs come up as dlb2 and
/// dlb3 (a VF has no `sriov_numvfs`).
fn enable_vfs(f: &Fixture) {
    f.sys_file("devices/pci0000:00/0000:6d:00.0/sriov_numvfs", "2\n");
    dlb(f, "0000:6d:00.1", VF_ID, 2, None);
    dlb(f, "0000:6d:00.2", VF_ID, 3, None);
}

#[test]
fn pfs_then_vfs_with_their_paths_as_ids() {
    let f = Fixture::new();
    machine(&f);
    let tree = scan_once("dlb", &f, &[]);
    assert_eq!(ids(&tree), ids_of(&[("pf", &["/dev/dlb0", "/dev/dlb1"])]));
    let mut dev = tree["pf"]["/dev/dlb1"].clone();
    // The host fills NUMA nodes from sysfs; that is tested with the host, not here.
    dev.as_object_mut().unwrap().remove("numa_nodes");
    assert_eq!(
        dev,
        json!({
            "health": "Healthy",
            "nodes": [{"container_path": "/dev/dlb1", "host_path": "/dev/dlb1", "permissions": "rw"}],
            "mounts": [],
            "envs": {},
            "annotations": {},
            "cdi_devices": []
        })
    );

    // With VFs enabled the PF is left out; its VFs are served.
    enable_vfs(&f);
    let tree = scan_once("dlb", &f, &[]);
    assert_eq!(
        ids(&tree),
        ids_of(&[("pf", &["/dev/dlb1"]), ("vf", &["/dev/dlb2", "/dev/dlb3"])])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vfs_are_allocated_and_a_pf_turns_unhealthy_when_its_vfs_take_over() {
    let f = Fixture::new();
    machine(&f);
    let config = one_scanner_config(
        &f,
        "dlb",
        "dlb.intel.com",
        &["RESCAN_INTERVAL_MS: 600000"],
        false,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let (pf, vf) = ("dlb.intel.com/pf", "dlb.intel.com/vf");
    seen.devices(pf, &["/dev/dlb0", "/dev/dlb1"]).await;

    // Enabling VFs on dlb0 (new nodes wake the scanner; the rescan interval is ten minutes):
    // the VFs are served, and dlb0, now a PF with VFs, is no longer allocatable.
    enable_vfs(&f);
    seen.devices(vf, &["/dev/dlb2", "/dev/dlb3"]).await;
    seen.health(pf, "/dev/dlb0", "Unhealthy").await;
    seen.health(pf, "/dev/dlb1", "Healthy").await;

    let r = kubelet.allocate(vf, &["/dev/dlb3"]).await.unwrap();
    let c = &r.container_responses[0];
    let nodes = wdp_tests::node_specs(c);
    assert_eq!(nodes, [("/dev/dlb3", "/dev/dlb3", "rw")]);
    assert!(c.mounts.is_empty() && c.envs.is_empty() && c.annotations.is_empty());

    // Unbinding the other PF from dlb2 removes its device and node: Unhealthy until it is back.
    let dir = "devices/pci0000:00/0000:f5:00.0";
    f.pci_unbind("0000:f5:00.0");
    std::fs::remove_file(f.sys().join("class/dlb2/dlb1")).unwrap();
    std::fs::remove_file(f.sys().join(format!("dev/char/{DLB_MAJOR}:1"))).unwrap();
    std::fs::remove_dir_all(f.sys().join(format!("{dir}/dlb2"))).unwrap();
    f.remove_dev("dlb1");
    seen.health(pf, "/dev/dlb1", "Unhealthy").await;
    f.pci_bind("0000:f5:00.0", "dlb2");
    dlb_node(&f, dir, "0000:f5:00.0", 1);
    seen.health(pf, "/dev/dlb1", "Healthy").await;

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}
