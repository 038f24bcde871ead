//! `kvm`: KubeVirt-style shared virtualisation devices.
//!
//! For each of `/dev/kvm`, `/dev/net/tun`, `/dev/vhost-net` and `/dev/fuse` that exists as a
//! character device (checked through devfs), the tree has a device type (`kvm`, `tun`,
//! `vhost-net`, `fuse`) with `SLOTS` shareable devices `<type>-0` .. `<type>-<SLOTS-1>`, each
//! giving the container the node at the same path with permissions "rw". A missing node leaves
//! its type out of the tree.
//!
//! * `SLOTS` (default 110, 1 ..= 10000): devices per type, i.e. how many containers may share it.
//! * `RESCAN_INTERVAL_MS` (default 30000): longest wait between scans.

use wdp_guest::{DeviceInfo, DeviceTree, TreeBuilder, config, devfs};

/// The environment variable with the number of shareable devices per type.
pub const SLOTS_ENV: &str = "SLOTS";
/// KubeVirt's default for its shared devices.
pub const DEFAULT_SLOTS: u32 = 110;
/// Largest accepted `SLOTS`.
pub const MAX_SLOTS: u32 = 10_000;

/// (device type, node path) of every device this scanner knows.
pub const DEVICES: [(&str, &str); 4] = [
    ("kvm", "/dev/kvm"),
    ("tun", "/dev/net/tun"),
    ("vhost-net", "/dev/vhost-net"),
    ("fuse", "/dev/fuse"),
];

/// Reads `SLOTS` (None: unset).
pub fn parse_slots(value: Option<&str>) -> Result<u32, String> {
    config::parse_u32(SLOTS_ENV, value, DEFAULT_SLOTS, 1..=MAX_SLOTS)
}

/// The tree for the nodes for which `present(path)` holds.
pub fn tree(slots: u32, present: impl Fn(&str) -> bool) -> DeviceTree {
    let mut t = TreeBuilder::new();
    for (dev_type, path) in DEVICES {
        if present(path) {
            t.add_shared(
                dev_type,
                dev_type,
                slots,
                DeviceInfo::new().node(path, path, "rw"),
            );
        }
    }
    t.build()
}

struct Kvm;

impl wdp_guest::Scanner for Kvm {
    fn scan() -> Result<(), String> {
        let slots = parse_slots(config::env_var(SLOTS_ENV).as_deref())?;
        wdp_guest::run(|| Ok(tree(slots, devfs::exists_char_device)))
    }
}

wdp_guest::export_scanner!(Kvm);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots() {
        assert_eq!(parse_slots(None), Ok(110));
        assert_eq!(parse_slots(Some("3")), Ok(3));
        for bad in ["0", "x", "-1", "10001", ""] {
            let e = parse_slots(Some(bad)).unwrap_err();
            assert!(e.starts_with(&format!("SLOTS={bad:?} is not valid")), "{e}");
        }
    }

    #[test]
    fn present_nodes_only() {
        let t = tree(110, |p| p != "/dev/vhost-net");
        let types: Vec<&str> = t.iter().map(|g| g.dev_type.as_str()).collect();
        assert_eq!(types, ["kvm", "tun", "fuse"]);
        assert_eq!(t[0].devices.len(), 110);
        assert_eq!(t[0].devices[0].id, "kvm-0");
        assert_eq!(t[0].devices[109].id, "kvm-109");
        let n = &t[1].devices[5].info.nodes[0];
        assert_eq!(
            (
                n.host_path.as_str(),
                n.container_path.as_str(),
                n.permissions.as_str()
            ),
            ("/dev/net/tun", "/dev/net/tun", "rw")
        );
        assert!(tree(3, |_| false).is_empty());
        assert_eq!(tree(2, |_| true)[2].devices[1].id, "vhost-net-1");
    }
}
