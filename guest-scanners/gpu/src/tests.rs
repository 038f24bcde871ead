//! The scan logic over a fake machine (host imports are unreachable off wasm).

use super::*;
use options::IdFilter;
use wdp_guest::hostfs::FakeFs;
use wdp_guest::tree::type_ids as ids;

/// The sysfs directory of the PCI device at `bdf`.
fn device_dir(bdf: &str) -> String {
    format!("/sys/devices/pci0000:00/{bdf}")
}

/// An Intel GPU laid out as sysfs does: `/sys/class/drm/<card>` links to the card's directory
/// in its PCI device's `drm/` (beside the other DRM nodes `drm` names), whose `device` links back
/// to the PCI device, which holds `vendor`, `device` and the `driver` link.
fn gpu(fs: &mut FakeFs, card: &str, device: &str, drm: &[&str], driver: &str, bdf: &str) {
    let dir = device_dir(bdf);
    for node in drm {
        fs.dir(&format!("{dir}/drm/{node}"));
    }
    fs.file(&format!("{dir}/vendor"), "0x8086\n")
        .file(&format!("{dir}/device"), device)
        .link(
            &format!("{DRM_CLASS}/{card}"),
            &format!("../../devices/pci0000:00/{bdf}/drm/{card}"),
        )
        .link(
            &format!("{dir}/drm/{card}/device"),
            &format!("../../../{bdf}"),
        )
        .link(
            &format!("{dir}/driver"),
            &format!("../../../bus/pci/drivers/{driver}"),
        );
}

/// Moves `card`'s sysfs directory out of its PCI device (as for a virtual card), its `device`
/// still linking to `bdf`: the card then has no PCI address in its resolved path.
fn unplace(fs: &mut FakeFs, card: &str, bdf: &str) {
    fs.link(
        &format!("{DRM_CLASS}/{card}"),
        &format!("../../devices/virtual/drm/{card}"),
    )
    .link(
        &format!("/sys/devices/virtual/drm/{card}/device"),
        &format!("../../../pci0000:00/{bdf}"),
    );
}

/// An MEI device `name` of the GPU at `bdf` (its node in /dev is the caller's business).
fn mei(fs: &mut FakeFs, bdf: &str, name: &str) {
    fs.dir(&format!(
        "{}/i915.mei-gscfi.768/mei/{name}",
        device_dir(bdf)
    ));
}

/// An integrated i915 GPU (card0), a discrete xe GPU with an MEI device (card1), and a
/// non-Intel one (card2), with their nodes and by-path links.
fn machine() -> FakeFs {
    let mut fs = FakeFs::new();
    let card0 = ["card0", "controlD64", "renderD128"];
    gpu(&mut fs, "card0", "0x4680\n", &card0, "i915", "0000:00:02.0");
    gpu(
        &mut fs,
        "card1",
        "0x56a0\n",
        &["card1", "renderD129"],
        "xe",
        "0000:03:00.0",
    );
    mei(&mut fs, "0000:03:00.0", "mei0");
    let card2 = ["card2", "renderD130"];
    gpu(
        &mut fs,
        "card2",
        "0x73bf\n",
        &card2,
        "amdgpu",
        "0000:04:00.0",
    );
    fs.file(
        &format!("{}/vendor", device_dir("0000:04:00.0")),
        "0x1002\n",
    )
    .link(
        &format!("{DRM_CLASS}/renderD128"),
        "../../devices/pci0000:00/0000:00:02.0/drm/renderD128",
    )
    .file(&format!("{DRM_CLASS}/version"), "drm 1.1.0 20060810\n");
    for (minor, node) in (0..).zip([
        "/dev/dri/card0",
        "/dev/dri/controlD64",
        "/dev/dri/renderD128",
        "/dev/dri/card1",
        "/dev/dri/renderD129",
        "/dev/dri/card2",
        "/dev/dri/renderD130",
    ]) {
        fs.char_dev(node, 226, minor);
    }
    fs.char_dev("/dev/mei0", 238, 0);
    for (link, target) in [
        ("pci-0000:00:02.0-card", "../card0"),
        ("pci-0000:00:02.0-render", "../renderD128"),
        ("pci-0000:03:00.0-card", "../card1"),
        ("pci-0000:03:00.0-render", "../renderD129"),
    ] {
        fs.link(&format!("{BYPATH_DIR}/{link}"), target);
    }
    fs
}

fn paths(specs: &[DeviceSpec]) -> Vec<&str> {
    specs.iter().map(|s| s.host_path.as_str()).collect()
}

fn info<'a>(t: &'a DeviceTree, dev_type: &str, id: &str) -> &'a DeviceInfo {
    let g = t.iter().find(|g| g.dev_type == dev_type).expect(dev_type);
    &g.devices.iter().find(|d| d.id == id).expect(id).info
}

#[test]
fn names() {
    assert!(is_card_name("card0") && is_card_name("card12"));
    assert!(!is_card_name("card") && !is_card_name("card0-DP-1") && !is_card_name("renderD128"));
    assert!(is_control_name("controlD64") && !is_control_name("controlD"));
    assert_eq!(
        bdf_from_path("/sys/devices/pci0000:00/0000:00:02.0/drm/card0", "card0").as_deref(),
        Some("0000:00:02.0")
    );
    assert_eq!(
        bdf_from_path(
            "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:03:00.0/drm/card1",
            "card1"
        )
        .as_deref(),
        Some("0000:03:00.0"),
        "behind bridges"
    );
    assert_eq!(
        bdf_from_path("/sys/devices/platform/x/drm/card0", "card0"),
        None
    );
    assert_eq!(bdf_from_path("/sys/class/drm/card0", "card0"), None);
    assert!(!is_pf_with_vfs(None) && !is_pf_with_vfs(Some("0\n")) && !is_pf_with_vfs(Some("-1")));
    assert!(is_pf_with_vfs(Some("7\n")));
}

#[test]
fn one_type_per_driver_with_nodes_and_bypath_mounts() {
    let defaults = tree(&machine(), &Options::default());
    assert!(
        info(&defaults, "i915", "card0-0").mounts.is_empty(),
        "no mounts by default"
    );
    let single = Options {
        bypath: Bypath::Single,
        ..Options::default()
    };
    let t = tree(&machine(), &single);
    assert_eq!(ids(&t), ["i915/card0-0", "xe/card1-0"]);
    let card0 = info(&t, "i915", "card0-0");
    assert_eq!(
        paths(&card0.nodes),
        ["/dev/dri/card0", "/dev/dri/renderD128"]
    );
    assert!(
        card0
            .nodes
            .iter()
            .all(|n| n.permissions == "rw" && n.container_path == n.host_path)
    );
    let mounts: Vec<(&str, bool)> = card0
        .mounts
        .iter()
        .map(|m| (m.host_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        mounts,
        [
            ("/dev/dri/by-path/pci-0000:00:02.0-card", true),
            ("/dev/dri/by-path/pci-0000:00:02.0-render", true)
        ]
    );
    assert!(card0.envs.is_empty() && card0.annotations.is_empty() && card0.numa_nodes.is_none());
}

#[test]
fn sharing_filters_and_skips() {
    let m = machine();
    let opts = |filter| Options {
        shared_dev_num: 2,
        filter,
        ..Options::default()
    };
    assert_eq!(
        ids(&tree(&m, &opts(IdFilter::All))),
        ["i915/card0-0", "i915/card0-1", "xe/card1-0", "xe/card1-1"]
    );
    assert_eq!(
        ids(&tree(&m, &opts(IdFilter::Allow("0x56a0".into())))),
        ["xe/card1-0", "xe/card1-1"]
    );
    assert_eq!(
        ids(&tree(&m, &opts(IdFilter::Deny("0x56a0,0x1234".into())))),
        ["i915/card0-0", "i915/card0-1"]
    );

    let mut m = machine();
    m.file(
        &format!("{}/sriov_numvfs", device_dir("0000:00:02.0")),
        "2\n",
    )
    .remove(&format!("{}/driver", device_dir("0000:03:00.0")))
    .remove("/dev/dri/card1")
    .remove("/dev/dri/renderD129");
    assert!(
        tree(&m, &Options::default()).is_empty(),
        "PF with VFs, no nodes"
    );
    m.char_dev("/dev/dri/renderD129", 226, 4);
    assert_eq!(
        ids(&tree(&m, &Options::default())),
        ["i915/card1-0"],
        "no driver: upstream's default type; a render node is enough"
    );
    unplace(&mut m, "card1", "0000:03:00.0");
    m.remove(&format!("{}/drm", device_dir("0000:03:00.0")));
    assert!(tree(&m, &Options::default()).is_empty(), "no device/drm");
}

#[test]
fn bypath_modes() {
    let mut m = machine();
    let with = |bypath| Options {
        bypath,
        ..Options::default()
    };
    let t = tree(&m, &with(Bypath::All));
    let mounts = &info(&t, "xe", "card1-0").mounts;
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].host_path, "/dev/dri/by-path");
    assert!(mounts[0].read_only);
    let t = tree(&m, &with(Bypath::None));
    assert!(info(&t, "xe", "card1-0").mounts.is_empty());
    unplace(&mut m, "card1", "0000:03:00.0");
    let t = tree(&m, &with(Bypath::Single));
    assert!(
        info(&t, "xe", "card1-0").mounts.is_empty(),
        "no PCI address"
    );
    assert_eq!(info(&t, "i915", "card0-0").mounts.len(), 2);
    m.remove(BYPATH_DIR);
    let t = tree(&m, &with(Bypath::All));
    assert!(
        info(&t, "i915", "card0-0").mounts.is_empty(),
        "unreadable by-path"
    );
}

#[test]
fn monitoring_device_holds_every_gpu() {
    let mut m = machine();
    mei(&mut m, "0000:00:02.0", "mei9"); // listed in sysfs, but no node in /dev
    let single = Options {
        monitoring: Some(MonitoringMode::Single),
        ..Options::default()
    };
    let t = tree(&m, &single);
    assert_eq!(ids(&t), ["i915/card0-0", "xe/card1-0", "monitoring/all"]);
    let all = info(&t, "monitoring", "all");
    assert_eq!(
        paths(&all.nodes),
        [
            "/dev/dri/card0",
            "/dev/dri/renderD128",
            "/dev/dri/card1",
            "/dev/dri/renderD129",
            "/dev/mei0"
        ]
    );
    assert!(all.mounts.is_empty());
    let split = Options {
        monitoring: Some(MonitoringMode::Split),
        ..Options::default()
    };
    let t = tree(&m, &split);
    assert_eq!(
        ids(&t),
        [
            "i915/card0-0",
            "xe/card1-0",
            "i915_monitoring/all",
            "xe_monitoring/all"
        ]
    );
    assert_eq!(
        paths(&info(&t, "xe_monitoring", "all").nodes),
        ["/dev/dri/card1", "/dev/dri/renderD129", "/dev/mei0"]
    );
}

#[test]
fn identity_follows_a_gpu_across_drivers_but_not_monitoring_types() {
    assert_eq!(identity("i915", "card1-0"), identity("xe", "card1-0"));
    assert_ne!(
        identity("i915_monitoring", "all"),
        identity("xe_monitoring", "all")
    );
    assert_eq!(identity("monitoring", "all"), "monitoring/all");
    let mut v = Vanished::new();
    let mut m = machine();
    v.mark_moving(tree(&m, &Options::default()), identity);
    m.link(
        &format!("{}/driver", device_dir("0000:03:00.0")),
        "../../../bus/pci/drivers/i915",
    );
    let t = v.mark_moving(tree(&m, &Options::default()), identity);
    assert_eq!(
        ids(&t),
        ["i915/card0-0", "i915/card1-0"],
        "moved, no ghost under xe"
    );
    m.remove("/dev/dri/card1").remove("/dev/dri/renderD129");
    let t = v.mark_moving(tree(&m, &Options::default()), identity);
    assert_eq!(ids(&t), ["i915/card0-0", "i915/card1-0"]);
    assert_eq!(
        info(&t, "i915", "card1-0").health,
        wdp_guest::Health::Unhealthy
    );
}
