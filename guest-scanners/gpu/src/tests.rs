//! The scan logic over a fake machine (host imports are unreachable off wasm).

use super::*;
use options::IdFilter;
use std::collections::HashMap;

#[derive(Default)]
struct Card {
    attrs: HashMap<&'static str, &'static str>,
    drm: Option<Vec<&'static str>>,
    driver: Option<&'static str>,
    bdf: Option<&'static str>,
    mei: Vec<&'static str>,
}

#[derive(Default)]
struct Fake {
    cards: Vec<(&'static str, Card)>,
    dev: Vec<&'static str>,
    bypath: Option<Vec<&'static str>>,
}

impl Fake {
    fn card(&self, name: &str) -> Option<&Card> {
        self.cards.iter().find(|(n, _)| *n == name).map(|(_, c)| c)
    }
}

impl Machine for Fake {
    fn drm_entries(&self) -> Vec<String> {
        self.cards.iter().map(|(n, _)| n.to_string()).collect()
    }
    fn attr(&self, card: &str, attr: &str) -> Option<String> {
        self.card(card)?.attrs.get(attr).map(|s| s.to_string())
    }
    fn drm_files(&self, card: &str) -> Option<Vec<String>> {
        let drm = self.card(card)?.drm.as_ref()?;
        Some(drm.iter().map(|s| s.to_string()).collect())
    }
    fn driver(&self, card: &str) -> Option<String> {
        self.card(card)?.driver.map(String::from)
    }
    fn bdf(&self, card: &str) -> Option<String> {
        self.card(card)?.bdf.map(String::from)
    }
    fn mei_names(&self, card: &str) -> Vec<String> {
        self.card(card)
            .map(|c| c.mei.iter().map(|s| s.to_string()).collect())
            .unwrap_or_default()
    }
    fn dev_exists(&self, path: &str) -> bool {
        self.dev.contains(&path)
    }
    fn bypath_entries(&self) -> Option<Vec<String>> {
        Some(
            self.bypath
                .as_ref()?
                .iter()
                .map(|s| s.to_string())
                .collect(),
        )
    }
}

fn gpu(
    device: &'static str,
    drm: &[&'static str],
    driver: &'static str,
    bdf: &'static str,
) -> Card {
    Card {
        attrs: HashMap::from([("vendor", "0x8086\n"), ("device", device)]),
        drm: Some(drm.to_vec()),
        driver: Some(driver),
        bdf: Some(bdf),
        mei: Vec::new(),
    }
}

/// An integrated i915 GPU (card0), a discrete xe GPU with an MEI device (card1), and a
/// non-Intel one (card2), with their nodes and by-path links.
fn machine() -> Fake {
    let mut card1 = gpu("0x56a0\n", &["card1", "renderD129"], "xe", "0000:03:00.0");
    card1.mei = vec!["mei0"];
    let mut card2 = gpu(
        "0x73bf\n",
        &["card2", "renderD130"],
        "amdgpu",
        "0000:04:00.0",
    );
    card2.attrs.insert("vendor", "0x1002\n");
    Fake {
        cards: vec![
            (
                "card0",
                gpu(
                    "0x4680\n",
                    &["card0", "controlD64", "renderD128"],
                    "i915",
                    "0000:00:02.0",
                ),
            ),
            ("card1", card1),
            ("card2", card2),
            ("renderD128", Card::default()),
            ("version", Card::default()),
        ],
        dev: vec![
            "/dev/dri/card0",
            "/dev/dri/controlD64",
            "/dev/dri/renderD128",
            "/dev/dri/card1",
            "/dev/dri/renderD129",
            "/dev/dri/card2",
            "/dev/dri/renderD130",
            "/dev/mei0",
        ],
        bypath: Some(vec![
            "pci-0000:00:02.0-card",
            "pci-0000:00:02.0-render",
            "pci-0000:03:00.0-card",
            "pci-0000:03:00.0-render",
        ]),
    }
}

fn ids(t: &DeviceTree) -> Vec<String> {
    t.iter()
        .flat_map(|g| {
            g.devices
                .iter()
                .map(move |d| format!("{}/{}", g.dev_type, d.id))
        })
        .collect()
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
    m.cards[0].1.attrs.insert("sriov_numvfs", "2\n");
    m.cards[1].1.driver = None;
    m.dev
        .retain(|p| !p.ends_with("card1") && !p.ends_with("renderD129"));
    assert!(
        tree(&m, &Options::default()).is_empty(),
        "PF with VFs, no nodes"
    );
    m.dev.push("/dev/dri/renderD129");
    assert_eq!(
        ids(&tree(&m, &Options::default())),
        ["i915/card1-0"],
        "no driver: upstream's default type; a render node is enough"
    );
    m.cards[1].1.drm = None;
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
    m.cards[1].1.bdf = None;
    let t = tree(&m, &with(Bypath::Single));
    assert!(
        info(&t, "xe", "card1-0").mounts.is_empty(),
        "no PCI address"
    );
    assert_eq!(info(&t, "i915", "card0-0").mounts.len(), 2);
    m.bypath = None;
    let t = tree(&m, &with(Bypath::All));
    assert!(
        info(&t, "i915", "card0-0").mounts.is_empty(),
        "unreadable by-path"
    );
}

#[test]
fn monitoring_device_holds_every_gpu() {
    let mut m = machine();
    m.cards[0].1.mei = vec!["mei9"]; // listed in sysfs, but no node in /dev
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
    m.cards[1].1.driver = Some("i915");
    let t = v.mark_moving(tree(&m, &Options::default()), identity);
    assert_eq!(
        ids(&t),
        ["i915/card0-0", "i915/card1-0"],
        "moved, no ghost under xe"
    );
    m.dev
        .retain(|p| !p.ends_with("card1") && !p.ends_with("renderD129"));
    let t = v.mark_moving(tree(&m, &Options::default()), identity);
    assert_eq!(ids(&t), ["i915/card0-0", "i915/card1-0"]);
    assert_eq!(
        info(&t, "i915", "card1-0").health,
        wdp_guest::Health::Unhealthy
    );
}
