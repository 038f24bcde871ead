//! `dlb`: Intel Dynamic Load Balancer devices, in place of Intel's DLB device plugin
//! (`cmd/dlb_plugin/dlb_plugin.go` in intel/intel-device-plugins-for-kubernetes), resource
//! namespace `dlb.intel.com`.
//!
//! Reads every entry of /dev matching `/dev/dlb*` (through devfs), and for each the SR-IOV
//! state of its function, `/sys/class/dlb2/<name>/device/sriov_numvfs` (trimmed):
//!
//! * `0`: a physical function without VFs, type `pf`;
//! * unreadable (a VF has no such attribute), or `-1`: type `vf`;
//! * anything else: a PF whose VFs are enabled; it is left out, since its VFs are the devices.
//!
//! Each device gives the container its node at the same path with permissions "rw"; no mounts,
//! envs or annotations. The device id is the node's full path (`/dev/dlb0`), as upstream: the
//! same ids let a node switch between the two plugins without kubelet seeing new devices.
//!
//! Health: a device seen before whose node or sysfs entry disappears (driver unbound, VFs
//! disabled) stays listed as Unhealthy with its last description until it returns
//! ([`wdp_guest::health::Vanished`]); upstream has no health signal and simply drops it.
//!
//! Environment:
//! * `RESCAN_INTERVAL_MS` (default 30000): longest wait between scans. Upstream rescans every
//!   5 s; here a change under /dev or /sys wakes the scanner at once.
//!
//! Upstream has no options; there are none here either.

use wdp_guest::health::Vanished;
use wdp_guest::{DeviceInfo, DeviceTree, TreeBuilder, devfs, sysfs};

/// Where the DLB nodes are found (a glob under /dev).
pub const NODE_GLOB: &str = "/dev/dlb*";
/// The sysfs class of the dlb2 driver, one entry per node name.
pub const SYSFS_CLASS: &str = "/sys/class/dlb2";
/// Device type of a physical function without VFs.
pub const TYPE_PF: &str = "pf";
/// Device type of a virtual function.
pub const TYPE_VF: &str = "vf";

/// The device type of a node from its `sriov_numvfs` (None: unreadable), or None when the node
/// is a PF with VFs enabled and is not advertised.
///
/// Why a function: upstream's rule (`GetSriovNumVFs` turns "unreadable" into `-1`, and only `0`
/// and `-1` are kept) is the whole of this scanner's judgement, and it is tested off wasm.
pub fn dev_type(sriov_numvfs: Option<&str>) -> Option<&'static str> {
    match sriov_numvfs.map(str::trim).unwrap_or("-1") {
        "0" => Some(TYPE_PF),
        "-1" => Some(TYPE_VF),
        _ => None,
    }
}

/// The tree for the DLB nodes `nodes` (full /dev paths, sorted), with `numvfs(name)` giving the
/// `sriov_numvfs` of the node named `name`.
pub fn tree(nodes: &[String], numvfs: impl Fn(&str) -> Option<String>) -> DeviceTree {
    let mut t = TreeBuilder::new();
    for path in nodes {
        let name = path.rsplit('/').next().unwrap_or_default();
        if let Some(ty) = dev_type(numvfs(name).as_deref()) {
            t.add(ty, path.clone(), DeviceInfo::new().node(path, path, "rw"));
        }
    }
    t.build()
}

/// One scan of the real machine.
fn scan_once() -> Result<DeviceTree, String> {
    let nodes: Vec<String> = devfs::glob_dev(NODE_GLOB)?
        .into_iter()
        .map(|m| m.path)
        .collect();
    Ok(tree(&nodes, |name| {
        sysfs::read_attr(format!("{SYSFS_CLASS}/{name}/device/sriov_numvfs"))
    }))
}

struct Dlb;

impl wdp_guest::Scanner for Dlb {
    fn scan() -> Result<(), String> {
        let mut vanished = Vanished::new();
        wdp_guest::run(|| Ok(vanished.mark(scan_once()?)))
    }
}

wdp_guest::export_scanner!(Dlb);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_follow_upstream_sriov_rule() {
        assert_eq!(dev_type(Some("0\n")), Some("pf"));
        assert_eq!(dev_type(None), Some("vf"), "a VF has no sriov_numvfs");
        assert_eq!(dev_type(Some("-1")), Some("vf"));
        assert_eq!(dev_type(Some("4")), None, "a PF with VFs is skipped");
        assert_eq!(dev_type(Some("")), None);
    }

    #[test]
    fn ids_are_full_paths() {
        let nodes = ["/dev/dlb0", "/dev/dlb1", "/dev/dlb2"].map(String::from);
        let t = tree(&nodes, |name| match name {
            "dlb0" => Some("0".into()),
            "dlb1" => Some("2".into()),
            _ => None,
        });
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].dev_type.as_str(), t[0].devices[0].id.as_str()),
            ("pf", "/dev/dlb0")
        );
        assert_eq!(
            (t[1].dev_type.as_str(), t[1].devices[0].id.as_str()),
            ("vf", "/dev/dlb2")
        );
        let n = &t[1].devices[0].info.nodes[0];
        assert_eq!(
            (
                n.host_path.as_str(),
                n.container_path.as_str(),
                n.permissions.as_str()
            ),
            ("/dev/dlb2", "/dev/dlb2", "rw")
        );
    }
}
