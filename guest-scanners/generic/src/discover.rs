//! Turning the configuration into a device tree, as squat/generic-device-plugin does:
//!
//! * **paths**: each path's glob matches are sorted and repeated `limit` times; the group yields
//!   as many devices as its largest natural match count, capped at the smallest repeated count
//!   (an `optional` path without matches is left out); device `i` gets match `i` of every path.
//! * **usb**: every attached USB device matching any spec of the group goes into ONE device
//!   (node `/dev/bus/usb/BBB/DDD`, permissions "rw").
//! * each device is offered `count` times (ids suffixed `-0` .. `-<count-1>` when count > 1).
//!
//! Ids are readable and stable, never hashes: a path device's id is its matched paths below /dev
//! with `/` as `_`, joined with `+` (`ttyUSB0`, `dri_card0+dri_renderD128`); a USB device's is
//! `usb-<vendor>-<product>[-<serial>]` per spec, joined with `+`. Every configured device type is
//! in the tree, with zero devices when nothing matches. Within a type the first device with an id
//! wins.

use crate::config::{DeviceType, Group, PathSpec, PathType, UsbSpec};
use wdp_guest::hostfs::HostFs;
use wdp_guest::tree::{id_from_path, sanitize_id};
use wdp_guest::usb::{self, UsbDevice};
use wdp_guest::{DeviceInfo, DeviceTree, TreeBuilder};

/// Whether an attached device matches a spec: same ids, and the same serial when the spec has one.
fn usb_matches(d: &UsbDevice, spec: &UsbSpec) -> bool {
    d.vendor == spec.vendor
        && d.product == spec.product
        && spec
            .serial
            .as_ref()
            .is_none_or(|s| d.serial.as_ref() == Some(s))
}

/// The device tree for `types` on the machine `fs` shows (the guest's devfs and /sys, a fixture
/// in the native bench, a fake in tests).
pub fn discover(types: &[DeviceType], fs: &impl HostFs) -> DeviceTree {
    let mut tree = TreeBuilder::new();
    let mut usb: Option<Vec<UsbDevice>> = None;
    for dt in types {
        tree.group(&dt.name);
        for group in &dt.groups {
            for (id, info) in path_devices(group, fs) {
                add(&mut tree, &dt.name, &id, group.count, info);
            }
            if !group.usb.is_empty() {
                let all = usb.get_or_insert_with(|| usb::list_in(fs));
                if let Some((id, info)) = usb_device(group, all, fs) {
                    add(&mut tree, &dt.name, &id, group.count, info);
                }
            }
        }
    }
    tree.build()
}

fn add(tree: &mut TreeBuilder, name: &str, id: &str, count: u32, info: DeviceInfo) {
    if count > 1 {
        tree.add_shared(name, id, count, info);
    } else {
        tree.add(name, id, info);
    }
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// The devices of a group's `paths` (before `count`), as (id, info).
fn path_devices(group: &Group, fs: &impl HostFs) -> Vec<(String, DeviceInfo)> {
    // per path: its matches (device `i` takes match `i` modulo their number, which is what
    // repeating them `limit` times gives), or None for an optional path without matches
    let mut per_path: Vec<Option<Vec<String>>> = Vec::with_capacity(group.paths.len());
    let mut length = 0usize;
    let mut limit_length = usize::MAX;
    for p in &group.paths {
        let matches = fs.glob(&p.path);
        if matches.is_empty() && p.optional {
            per_path.push(None);
            continue;
        }
        limit_length = limit_length.min(matches.len().saturating_mul(p.limit as usize));
        length = length.max(matches.len());
        per_path.push(Some(matches));
    }
    let length = length.min(limit_length);
    let mut devices = Vec::with_capacity(length);
    for i in 0..length {
        let mut info = DeviceInfo::new();
        // the matches' ids joined with `+`, built in place (one path: its id as it is)
        let mut id = String::new();
        for (spec, matches) in group.paths.iter().zip(per_path.iter_mut()) {
            let Some(matches) = matches else { continue };
            let n = matches.len();
            // i < length <= n * limit, so there are matches
            let j = i % n;
            let part = id_from_path(&matches[j]);
            if id.is_empty() {
                id = part;
            } else {
                id.push('+');
                id.push_str(&part);
            }
            // The last device to use match j takes it, the ones before copy it: with `limit` 1
            // every match goes into the tree without a copy.
            let host = if i + n >= length {
                std::mem::take(&mut matches[j])
            } else {
                matches[j].clone()
            };
            info = with_path(info, spec, host);
        }
        devices.push((id, info));
    }
    devices
}

/// `info` with the match `host` of path `spec` added: a device node, or a mount.
pub fn with_path(info: DeviceInfo, spec: &PathSpec, host: String) -> DeviceInfo {
    let mut container = spec.mount_path.clone().unwrap_or_else(|| host.clone());
    if container.ends_with('/') {
        container.push_str(basename(&host));
    }
    match spec.kind {
        PathType::Device => info.node(host, container, spec.permissions.clone()),
        PathType::Mount => info.mount(host, container, spec.read_only),
    }
}

/// The one device of a group's `usb` specs (before `count`), if any attached device matches.
fn usb_device(
    group: &Group,
    devices: &[UsbDevice],
    fs: &impl HostFs,
) -> Option<(String, DeviceInfo)> {
    let mut nodes: Vec<String> = Vec::new();
    for spec in &group.usb {
        for d in devices.iter().filter(|d| usb_matches(d, spec)) {
            let node = d.bus_path();
            if !nodes.contains(&node) && fs.exists(&node) {
                nodes.push(node);
            }
        }
    }
    if nodes.is_empty() {
        return None;
    }
    let info = nodes.iter().fold(DeviceInfo::new(), |info, n| {
        info.node(n.clone(), n.clone(), "rw")
    });
    let id = group
        .usb
        .iter()
        .map(|s| {
            let mut id = format!("usb-{:04x}-{:04x}", s.vendor, s.product);
            if let Some(serial) = &s.serial {
                id.push('-');
                id.push_str(&sanitize_id(serial));
            }
            id
        })
        .collect::<Vec<_>>()
        .join("+");
    Some((id, info))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_devices;
    use wdp_guest::types::{DeviceSpec, Mount};

    use wdp_guest::hostfs::FakeFs;

    /// Plugs USB device `bus`-`dev` into sysfs (its node in /dev is the caller's business).
    fn usb(fs: &mut FakeFs, vendor: u16, product: u16, serial: Option<&str>, bus: u32, dev: u32) {
        let dir = format!("{}/{bus}-{dev}", usb::DEVICES_DIR);
        fs.file(&format!("{dir}/idVendor"), &format!("{vendor:04x}\n"))
            .file(&format!("{dir}/idProduct"), &format!("{product:04x}\n"))
            .file(&format!("{dir}/busnum"), &format!("{bus}\n"))
            .file(&format!("{dir}/devnum"), &format!("{dev}\n"));
        if let Some(serial) = serial {
            fs.file(&format!("{dir}/serial"), &format!("{serial}\n"));
        }
    }

    fn machine() -> FakeFs {
        let mut fs = FakeFs::new();
        for (minor, node) in (0..).zip([
            "/dev/ttyUSB1",
            "/dev/ttyUSB0",
            "/dev/dri/card0",
            "/dev/dri/card1",
            "/dev/dri/renderD128",
            "/dev/dri/renderD129",
            "/dev/fuse",
            "/dev/bus/usb/001/004",
            "/dev/bus/usb/002/010",
        ]) {
            fs.char_dev(node, 1, minor);
        }
        fs.dir("/sys/class/drm/card0");
        usb(&mut fs, 0x1050, 0x0407, Some("123"), 1, 4);
        usb(&mut fs, 0x1050, 0x0407, Some("456"), 2, 10);
        usb(&mut fs, 0x1050, 0x0407, None, 3, 1); // node missing in /dev
        usb(&mut fs, 0x1d6b, 0x0002, None, 1, 1);
        fs
    }

    fn ids(tree: &DeviceTree, name: &str) -> Vec<String> {
        tree.iter()
            .find(|g| g.dev_type == name)
            .unwrap()
            .devices
            .iter()
            .map(|d| d.id.clone())
            .collect()
    }

    fn run(config: &str) -> DeviceTree {
        discover(&parse_devices(Some(config)).unwrap(), &machine())
    }

    #[test]
    fn serial_glob_gives_one_device_per_match() {
        let t = run(r#"[{"name":"serial","groups":[{"paths":[{"path":"/dev/ttyUSB*"}]}]}]"#);
        assert_eq!(ids(&t, "serial"), ["ttyUSB0", "ttyUSB1"]);
        let d = &t[0].devices[0];
        assert_eq!(
            d.info.nodes,
            [DeviceSpec {
                host_path: "/dev/ttyUSB0".into(),
                container_path: "/dev/ttyUSB0".into(),
                permissions: "rw".into()
            }]
        );
        assert!(d.info.mounts.is_empty());
    }

    #[test]
    fn count_shares_each_device() {
        let t = run(
            r#"[{"name":"fuse","groups":[{"count":3,"paths":[{"path":"/dev/fuse","permissions":"mrw"}]}]}]"#,
        );
        assert_eq!(ids(&t, "fuse"), ["fuse-0", "fuse-1", "fuse-2"]);
        assert_eq!(t[0].devices[2].info.nodes[0].permissions, "mrw");
    }

    #[test]
    fn grouped_paths_zip_and_mount_paths() {
        let t = run(r#"[{"name":"gpu","groups":[{"paths":[
                {"path":"/dev/dri/card*","mountPath":"/dev/dri/"},
                {"path":"/dev/dri/renderD*","mountPath":"/dev/render"},
                {"path":"/sys/class/drm/card0","type":"Mount","readOnly":true,"limit":5},
                {"path":"/dev/nothing*","optional":true}]}]}]"#);
        assert_eq!(
            ids(&t, "gpu"),
            [
                "dri_card0+dri_renderD128+sys_class_drm_card0",
                "dri_card1+dri_renderD129+sys_class_drm_card0"
            ]
        );
        let info = &t[0].devices[1].info;
        assert_eq!(info.nodes[0].container_path, "/dev/dri/card1");
        assert_eq!(info.nodes[1].host_path, "/dev/dri/renderD129");
        assert_eq!(info.nodes[1].container_path, "/dev/render");
        assert_eq!(
            info.mounts,
            [Mount {
                host_path: "/sys/class/drm/card0".into(),
                container_path: "/sys/class/drm/card0".into(),
                read_only: true
            }]
        );
    }

    #[test]
    fn limits_cap_the_group() {
        // one shared node (limit 1) with two serial ports: capped at one device
        let t = run(
            r#"[{"name":"x","groups":[{"paths":[{"path":"/dev/ttyUSB*"},{"path":"/dev/fuse"}]}]}]"#,
        );
        assert_eq!(ids(&t, "x"), ["ttyUSB0+fuse"]);
        // limit 2 lets /dev/fuse pair with both ports
        let t = run(
            r#"[{"name":"x","groups":[{"paths":[{"path":"/dev/ttyUSB*"},{"path":"/dev/fuse","limit":2}]}]}]"#,
        );
        assert_eq!(ids(&t, "x"), ["ttyUSB0+fuse", "ttyUSB1+fuse"]);
        // a required path without matches yields nothing; the type is still listed
        let t = run(
            r#"[{"name":"x","groups":[{"paths":[{"path":"/dev/ttyUSB*"},{"path":"/dev/none"}]}]}]"#,
        );
        assert!(ids(&t, "x").is_empty());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn usb_groups_bundle_all_matches() {
        let t = run(
            r#"[{"name":"yubikey","groups":[{"usb":[{"vendor":"1050","product":"0407"}]}]},
                {"name":"one","groups":[{"count":2,"usb":[{"vendor":"1050","product":"0407","serial":"456"}]}]},
                {"name":"none","groups":[{"usb":[{"vendor":"dead","product":"beef"}]}]}]"#,
        );
        assert_eq!(ids(&t, "yubikey"), ["usb-1050-0407"]);
        let nodes: Vec<&str> = t[0].devices[0]
            .info
            .nodes
            .iter()
            .map(|n| n.host_path.as_str())
            .collect();
        assert_eq!(nodes, ["/dev/bus/usb/001/004", "/dev/bus/usb/002/010"]);
        assert_eq!(t[0].devices[0].info.nodes[0].permissions, "rw");
        assert_eq!(
            ids(&t, "one"),
            ["usb-1050-0407-456-0", "usb-1050-0407-456-1"]
        );
        assert_eq!(t[1].devices[0].info.nodes.len(), 1);
        assert!(ids(&t, "none").is_empty());
    }

    #[test]
    fn duplicate_ids_keep_the_first() {
        let t = run(
            r#"[{"name":"s","groups":[{"paths":[{"path":"/dev/ttyUSB0"}]},{"paths":[{"path":"/dev/ttyUSB*","permissions":"r"}]}]}]"#,
        );
        assert_eq!(ids(&t, "s"), ["ttyUSB0", "ttyUSB1"]);
        assert_eq!(t[0].devices[0].info.nodes[0].permissions, "rw");
    }
}
