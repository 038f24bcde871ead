//! Finding QAT VFs and describing them as upstream's `cmd/qat_plugin/dpdkdrv` does.
//!
//! * VFs: for each kernel VF driver (`4xxxvf`), the PFs bound to the PF driver (`4xxx`) under
//!   `/sys/bus/pci/drivers/<pf driver>/????:??:??.?`, then each PF's `virtfn*` links, in glob
//!   (string) order, all resolved. When no PF is found (a VM that sees only VFs), every
//!   `/sys/bus/pci/devices/????:??:??.?` whose `device` id is a VF id of an enabled VF driver.
//!   At most `MAX_NUM_DEVICES`, counted before any check, as upstream.
//! * Type: the PF's configured services for Gen4/Gen6 VFs (`4941 4943 4945 4947 4949`):
//!   `<PF>/qat/cfg_services` when `<PF>/qat/state` is `up`, else `ServicesEnabled` in
//!   `[GENERAL]` of debugfs `/sys/kernel/debug/qat_<pf driver>_<PF>/dev_cfg`; the first two `;`
//!   become `-`, and `sym-asym`/`asym-sym` become `cy`. `generic` for every other VF, and when
//!   the services cannot be read.
//! * Health: Unhealthy when the first line of debugfs
//!   `/sys/kernel/debug/qat_<pf driver>_<PF>/heartbeat/status` is `-1` (read once per PF).
//! * Id: the VF's PCI address; env `QAT<n>=<address>`, `n` its 1-based place in the VF list.

use std::collections::HashMap;

use wdp_guest::hostfs::{HostFs, ReadError};
use wdp_guest::notes::Scanned;
use wdp_guest::tree::is_dev_type;
use wdp_guest::{DeviceInfo, Health, TreeBuilder};

use crate::config::{Config, DpdkDriver, VF_DEVICE_DRIVERS};

/// Where PCI drivers list their devices.
pub const PCI_DRIVERS_DIR: &str = "/sys/bus/pci/drivers";
/// Where the kernel lists every PCI function.
pub const PCI_DEVICES_DIR: &str = "/sys/bus/pci/devices";
/// Where the QAT driver's debugfs directories are (`qat_<driver>_<PF address>`).
pub const DEBUGFS_DIR: &str = "/sys/kernel/debug";
/// The env prefix of each VF's address (`QAT1=0000:6b:00.1`).
pub const ENV_PREFIX: &str = "QAT";
/// The type of VFs whose services are unknown (upstream's `defaultCapabilities`).
pub const GENERIC: &str = "generic";
/// VF ids whose PF reports its configured services (Gen4 4xxx/401xx/402xx, 420xx, Gen6).
pub const VF_IDS_WITH_SERVICES: [&str; 5] = ["4941", "4943", "4945", "4947", "4949"];

/// The last component of a path.
pub fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The first `max` VF directories (resolved), in upstream's order.
pub fn vf_dirs(m: &impl HostFs, cfg: &Config) -> Vec<String> {
    let mut pfs = Vec::new();
    for vf_driver in &cfg.kernel_vf_drivers {
        let pf_driver = vf_driver.strip_suffix("vf").unwrap_or(vf_driver);
        let pattern = format!("{PCI_DRIVERS_DIR}/{pf_driver}/????:??:??.?");
        pfs.extend(m.glob(&pattern).iter().filter_map(|p| m.resolve_sys(p)));
    }
    let mut vfs: Vec<String> = Vec::new();
    if pfs.is_empty() {
        // No PF bound to a QAT driver: probably a VM given VFs only.
        for dev in m.glob(&format!("{PCI_DEVICES_DIR}/????:??:??.?")) {
            let Some(dir) = m.resolve_sys(&dev) else {
                continue;
            };
            let Some(id) = device_id(m, &dir) else {
                continue;
            };
            let enabled = VF_DEVICE_DRIVERS
                .iter()
                .any(|(i, d)| *i == id && cfg.kernel_vf_drivers.iter().any(|k| k == d));
            if enabled {
                vfs.push(dir);
            }
        }
    } else {
        for pf in &pfs {
            let pattern = format!("{pf}/virtfn*");
            vfs.extend(m.glob(&pattern).iter().filter_map(|p| m.resolve_sys(p)));
        }
    }
    vfs.truncate(cfg.max_devices);
    vfs
}

/// A device's PCI device id, trimmed and without `0x` (`"0x4941\n"` -> `"4941"`).
pub fn device_id(m: &impl HostFs, dir: &str) -> Option<String> {
    let raw = m.read(&format!("{dir}/device")).ok()?;
    let id = raw.trim();
    Some(id.strip_prefix("0x").unwrap_or(id).to_string())
}

/// Upstream's `trimServiceName`: trimmed, with the first two `;` replaced by `-`
/// (`"sym;asym\n"` -> `"sym-asym"`).
pub fn trim_service_name(s: &str) -> String {
    s.trim().replacen(';', "-", 2)
}

/// The value of `key` in `[section]` of an INI text, as go-ini reads QAT's `dev_cfg` (with
/// inline comments kept): `key = value` or `key: value`, blanks and one pair of quotes around
/// the value removed, `#` and `;` lines ignored, the last definition winning. None when absent.
pub fn ini_value(text: &str, section: &str, key: &str) -> Option<String> {
    let mut current = String::new();
    let mut found = None;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = name.trim().to_string();
            continue;
        }
        if current != section {
            continue;
        }
        let Some(at) = line.find(['=', ':']) else {
            continue;
        };
        if line[..at].trim() != key {
            continue;
        }
        let value = line[at + 1..].trim();
        let unquoted = ["\"\"\"", "\"", "'", "`"]
            .iter()
            .find_map(|q| {
                value
                    .strip_prefix(q)
                    .and_then(|v| v.strip_suffix(q))
                    .filter(|_| value.len() >= 2 * q.len())
            })
            .unwrap_or(value);
        found = Some(unquoted.to_string());
    }
    found
}

/// Upstream's `readDeviceConfiguration`: the services the PF at `pf` (resolved) is configured
/// for, as a resource name before the `cy` mapping; [`GENERIC`] when they cannot be read.
pub fn pf_services(m: &impl HostFs, pf: &str) -> String {
    let state = match m.read(&format!("{pf}/qat/state")) {
        Ok(s) => Some(s),
        Err(ReadError::Missing) => None,
        Err(ReadError::Unreadable(_)) => return GENERIC.into(),
    };
    if state.as_deref().map(str::trim) == Some("up") {
        match m.read(&format!("{pf}/qat/cfg_services")) {
            Ok(s) if !s.is_empty() => return trim_service_name(&s),
            Ok(_) | Err(ReadError::Missing) => {}
            Err(ReadError::Unreadable(_)) => return GENERIC.into(),
        }
    }
    let driver = m.resolve_name(&format!("{pf}/driver")).unwrap_or_default();
    let path = format!("{DEBUGFS_DIR}/qat_{driver}_{}/dev_cfg", basename(pf));
    match m.read(&path) {
        Ok(text) => {
            trim_service_name(&ini_value(&text, "GENERAL", "ServicesEnabled").unwrap_or_default())
        }
        Err(_) => GENERIC.into(),
    }
}

/// The device type of the VF at `vf` (resolved) with PCI device id `id` (upstream's
/// `getDeviceCapabilities`), and a note when the PF's services were not a usable name.
pub fn vf_type(m: &impl HostFs, vf: &str, id: &str) -> (String, Option<String>) {
    if !VF_IDS_WITH_SERVICES.contains(&id) {
        return (GENERIC.into(), None);
    }
    let Some(pf) = m.resolve_sys(&format!("{vf}/physfn")) else {
        return (GENERIC.into(), None);
    };
    let services = pf_services(m, &pf);
    let services = match services.as_str() {
        "sym-asym" | "asym-sym" => "cy".to_string(),
        _ => services,
    };
    if is_dev_type(&services) {
        (services, None)
    } else {
        // Upstream would serve an empty or invalid resource name, which kubelet refuses.
        let note = format!(
            "QAT VF {}: PF {} reports services {services:?}, not a resource name; typed {GENERIC}",
            basename(vf),
            basename(&pf)
        );
        (GENERIC.into(), Some(note))
    }
}

/// The health of the VF at `vf` (upstream's `getDeviceHealthiness`): its PF's heartbeat,
/// read once per PF per scan (`cache`); Healthy when there is no PF or no heartbeat file.
pub fn vf_health(m: &impl HostFs, vf: &str, cache: &mut HashMap<String, Health>) -> Health {
    let Some(pf) = m.resolve_sys(&format!("{vf}/physfn")) else {
        return Health::Healthy;
    };
    if let Some(h) = cache.get(&pf) {
        return *h;
    }
    let driver = m.resolve_name(&format!("{pf}/driver")).unwrap_or_default();
    let status = format!(
        "{DEBUGFS_DIR}/qat_{driver}_{}/heartbeat/status",
        basename(&pf)
    );
    let health = match m.read(&status) {
        Ok(s) if s.split('\n').next() == Some("-1") => Health::Unhealthy,
        _ => Health::Healthy,
    };
    cache.insert(pf, health);
    health
}

/// The nodes and mounts through which a container uses the VF at `vf` (bound to the DPDK
/// driver); Err says why it cannot be used.
pub fn access(m: &impl HostFs, driver: DpdkDriver, vf: &str) -> Result<DeviceInfo, String> {
    let bdf = basename(vf);
    let info = match driver {
        DpdkDriver::VfioPci => {
            let group_link = format!("{PCI_DEVICES_DIR}/{bdf}/iommu_group");
            let group = m
                .resolve_name(&group_link)
                .ok_or_else(|| "bound to vfio-pci but has no IOMMU group".to_string())?;
            // With enable_unsafe_noiommu_mode the kernel names the group node noiommu-<n>.
            let noiommu = m
                .read(&format!("{group_link}/name"))
                .is_ok_and(|n| n.trim() == "vfio-noiommu");
            let group = if noiommu {
                format!("noiommu-{group}")
            } else {
                group
            };
            let node = format!("/dev/vfio/{group}");
            DeviceInfo::new().node(&node, &node, "rw").node(
                "/dev/vfio/vfio",
                "/dev/vfio/vfio",
                "rw",
            )
        }
        DpdkDriver::IgbUio => {
            let uio = m
                .names(&format!("{PCI_DEVICES_DIR}/{bdf}/uio"))
                .into_iter()
                .next()
                .ok_or_else(|| "bound to igb_uio but has no uio device".to_string())?;
            let node = format!("/dev/{uio}");
            let mount = format!("/sys/class/uio/{uio}/device");
            DeviceInfo::new()
                .node(&node, &node, "rw")
                .mount(&mount, &mount, false)
        }
    };
    if let Some(missing) = info.nodes.iter().find(|n| !m.is_char_device(&n.host_path)) {
        return Err(format!("{} is not a character device", missing.host_path));
    }
    Ok(info)
}

/// One scan of the machine `m` shows.
///
/// Where upstream changes the machine or stops, this scan leaves a VF out and says why in
/// [`Scanned::notes`]: a VF not bound to the DPDK driver (upstream rebinds it), a VF whose id,
/// IOMMU group, uio device or device nodes cannot be found (upstream exits).
pub fn scan(m: &impl HostFs, cfg: &Config) -> Scanned {
    let mut tree = TreeBuilder::new();
    let mut notes = Vec::new();
    let mut health_cache = HashMap::new();
    let want = cfg.dpdk_driver.name();
    for (i, vf) in vf_dirs(m, cfg).iter().enumerate() {
        let bdf = basename(vf);
        let driver = m.resolve_name(&format!("{vf}/driver"));
        if driver.as_deref() != Some(want) {
            let bound = driver.map_or("no driver".to_string(), |d| format!("driver {d}"));
            notes.push(format!(
                "QAT VF {bdf} is bound to {bound}, not {want}: not served (wdp cannot rebind \
                 drivers; bind it to {want}, e.g. with qat-init.sh or driverctl)"
            ));
            continue;
        }
        let Some(id) = device_id(m, vf) else {
            notes.push(format!("QAT VF {bdf}: no readable device id: not served"));
            continue;
        };
        let info = match access(m, cfg.dpdk_driver, vf) {
            Ok(info) => info,
            Err(why) => {
                notes.push(format!("QAT VF {bdf} {why}: not served"));
                continue;
            }
        };
        let (dev_type, note) = vf_type(m, vf, &id);
        notes.extend(note);
        let info = info
            .env(format!("{ENV_PREFIX}{}", i + 1), bdf)
            .health(vf_health(m, vf, &mut health_cache));
        tree.add(&dev_type, bdf, info);
    }
    Scanned {
        tree: tree.build(),
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wdp_guest::hostfs::FakeFs;

    const PF: &str = "/sys/devices/pci0000:6b/0000:6b:00.0";
    const VF1: &str = "/sys/devices/pci0000:6b/0000:6b:00.1";
    const VF2: &str = "/sys/devices/pci0000:6b/0000:6b:00.2";

    /// A 4xxx PF with two VFs bound to vfio-pci in IOMMU groups 21 and 22.
    fn gen4() -> FakeFs {
        let mut f = FakeFs::new();
        f.file(&format!("{PF}/device"), "0x4940\n")
            .link(&format!("{PF}/driver"), "/sys/bus/pci/drivers/4xxx")
            .file("/sys/bus/pci/drivers/4xxx/bind", "")
            .link("/sys/bus/pci/drivers/4xxx/0000:6b:00.0", PF)
            .link(&format!("{PF}/virtfn0"), VF1)
            .link(&format!("{PF}/virtfn1"), VF2)
            .file("/sys/bus/pci/drivers/vfio-pci/bind", "")
            .file("/sys/kernel/iommu_groups/21/type", "DMA\n")
            .file("/sys/kernel/iommu_groups/22/type", "DMA\n");
        for (vf, bdf, group) in [(VF1, "0000:6b:00.1", "21"), (VF2, "0000:6b:00.2", "22")] {
            f.file(&format!("{vf}/device"), "0x4941\n")
                .link(&format!("{vf}/physfn"), PF)
                .link(&format!("{vf}/driver"), "/sys/bus/pci/drivers/vfio-pci")
                .link(&format!("/sys/bus/pci/devices/{bdf}"), vf)
                .link(
                    &format!("{vf}/iommu_group"),
                    &format!("/sys/kernel/iommu_groups/{group}"),
                );
            f.char_dev(&format!("/dev/vfio/{group}"), 240, 0);
        }
        f.char_dev("/dev/vfio/vfio", 10, 196);
        f
    }

    fn cfg() -> Config {
        Config::parse(|_| None).unwrap()
    }

    fn summary(scan: &Scanned) -> Vec<String> {
        scan.tree
            .iter()
            .flat_map(|g| {
                g.devices.iter().map(|d| {
                    let envs: Vec<String> = d
                        .info
                        .envs
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    let nodes: Vec<&str> =
                        d.info.nodes.iter().map(|n| n.host_path.as_str()).collect();
                    format!(
                        "{} {} {:?} {} {}",
                        g.dev_type,
                        d.id,
                        d.info.health,
                        envs.join(","),
                        nodes.join(",")
                    )
                })
            })
            .collect()
    }

    #[test]
    fn service_names() {
        assert_eq!(trim_service_name(" sym;asym\n"), "sym-asym");
        assert_eq!(trim_service_name("sym;asym;dc;x"), "sym-asym-dc;x");
        assert_eq!(trim_service_name("dc"), "dc");
        assert!(is_dev_type("asym-dc"));
        for bad in ["", "-dc", "sym-asym-dc;x", "a b"] {
            assert!(!is_dev_type(bad), "{bad}");
        }
    }

    #[test]
    fn ini_values_as_go_ini_reads_them() {
        let cfg = "# comment\n[GENERAL]\nServicesEnabled = sym;asym\nConfigVersion = 2\n\
                   [KERNEL]\nServicesEnabled = dc\n";
        assert_eq!(
            ini_value(cfg, "GENERAL", "ServicesEnabled").as_deref(),
            Some("sym;asym")
        );
        assert_eq!(
            ini_value(cfg, "KERNEL", "ServicesEnabled").as_deref(),
            Some("dc")
        );
        assert_eq!(ini_value(cfg, "GENERAL", "Missing"), None);
        assert_eq!(
            ini_value(
                "[GENERAL]\nServicesEnabled: \"dc\"",
                "GENERAL",
                "ServicesEnabled"
            )
            .as_deref(),
            Some("dc")
        );
        assert_eq!(
            ini_value("ServicesEnabled = dc", "GENERAL", "ServicesEnabled"),
            None
        );
    }

    #[test]
    fn gen4_vfs_typed_by_sysfs_services() {
        let mut m = gen4();
        m.file(&format!("{PF}/qat/state"), "up\n")
            .file(&format!("{PF}/qat/cfg_services"), "sym;asym\n");
        let s = scan(&m, &cfg());
        assert_eq!(
            summary(&s),
            [
                "cy 0000:6b:00.1 Health::Healthy QAT1=0000:6b:00.1 /dev/vfio/21,/dev/vfio/vfio",
                "cy 0000:6b:00.2 Health::Healthy QAT2=0000:6b:00.2 /dev/vfio/22,/dev/vfio/vfio",
            ]
        );
        assert!(s.notes.is_empty(), "{:?}", s.notes);

        m.file(&format!("{PF}/qat/cfg_services"), "asym;dc\n");
        assert_eq!(
            summary(&scan(&m, &cfg()))[0].split(' ').next(),
            Some("asym-dc")
        );
    }

    #[test]
    fn services_fall_back_to_debugfs_then_generic() {
        let mut m = gen4();
        // Not up: debugfs dev_cfg decides (upstream's own test data).
        m.file(&format!("{PF}/qat/state"), "down\n")
            .file(&format!("{PF}/qat/cfg_services"), "sym\n")
            .file(
                "/sys/kernel/debug/qat_4xxx_0000:6b:00.0/dev_cfg",
                "[GENERAL]\nServicesEnabled = dc",
            );
        assert_eq!(pf_services(&m, PF), "dc");
        // Up but empty: debugfs too.
        m.file(&format!("{PF}/qat/state"), "up\n")
            .file(&format!("{PF}/qat/cfg_services"), "");
        assert_eq!(pf_services(&m, PF), "dc");
        // Unreadable state: generic at once.
        m.unreadable(&format!("{PF}/qat/state"), "EACCES");
        assert_eq!(pf_services(&m, PF), GENERIC);
        // Nothing readable at all: generic.
        let mut bare = gen4();
        assert_eq!(pf_services(&bare, PF), GENERIC);
        // A dev_cfg without the key: an empty name, which the type check turns into generic.
        bare.file(
            "/sys/kernel/debug/qat_4xxx_0000:6b:00.0/dev_cfg",
            "[GENERAL]\n",
        );
        let (t, note) = vf_type(&bare, VF1, "4941");
        assert_eq!(t, GENERIC);
        assert!(note.unwrap().contains("not a resource name"));
        // Not a Gen4 VF id: generic without looking at the PF.
        assert_eq!(vf_type(&bare, VF1, "37c9"), (GENERIC.into(), None));
    }

    #[test]
    fn heartbeat_failure_is_unhealthy_for_every_vf_of_the_pf() {
        let mut m = gen4();
        m.file(
            "/sys/kernel/debug/qat_4xxx_0000:6b:00.0/heartbeat/status",
            "-1\n",
        );
        let s = summary(&scan(&m, &cfg()));
        assert_eq!(s.len(), 2);
        assert!(s.iter().all(|l| l.contains("Health::Unhealthy")), "{s:?}");
        m.file(
            "/sys/kernel/debug/qat_4xxx_0000:6b:00.0/heartbeat/status",
            "0\n",
        );
        let s = summary(&scan(&m, &cfg()));
        assert_eq!(s.len(), 2);
        assert!(s.iter().all(|l| l.contains("Health::Healthy")), "{s:?}");
    }

    #[test]
    fn vfs_not_bound_to_the_dpdk_driver_are_left_out_with_a_note() {
        let mut m = gen4();
        m.link(&format!("{VF1}/driver"), "/sys/bus/pci/drivers/4xxxvf")
            .file("/sys/bus/pci/drivers/4xxxvf/bind", "");
        let s = scan(&m, &cfg());
        // VF2 keeps its number: numbers are places in the VF list.
        assert_eq!(
            summary(&s),
            ["generic 0000:6b:00.2 Health::Healthy QAT2=0000:6b:00.2 /dev/vfio/22,/dev/vfio/vfio"]
        );
        assert_eq!(s.notes.len(), 1);
        assert!(
            s.notes[0].contains("0000:6b:00.1 is bound to driver 4xxxvf, not vfio-pci"),
            "{:?}",
            s.notes
        );
    }

    #[test]
    fn missing_nodes_and_groups_leave_the_vf_out() {
        let mut m = gen4();
        m.remove("/dev/vfio/22")
            .remove(&format!("{VF1}/iommu_group"));
        let s = scan(&m, &cfg());
        assert!(s.tree.iter().all(|g| g.devices.is_empty()));
        assert_eq!(s.notes.len(), 2, "{:?}", s.notes);
        assert!(s.notes[0].contains("no IOMMU group"));
        assert!(s.notes[1].contains("/dev/vfio/22 is not a character device"));
    }

    #[test]
    fn noiommu_groups_and_max_devices() {
        let mut m = gen4();
        m.file("/sys/kernel/iommu_groups/21/name", "vfio-noiommu\n");
        m.char_dev("/dev/vfio/noiommu-21", 240, 1);
        let c = Config {
            max_devices: 1,
            ..cfg()
        };
        assert_eq!(
            summary(&scan(&m, &c)),
            [
                "generic 0000:6b:00.1 Health::Healthy QAT1=0000:6b:00.1 /dev/vfio/noiommu-21,/dev/vfio/vfio"
            ]
        );
    }

    #[test]
    fn vm_fallback_by_device_id_and_enabled_driver() {
        let mut m = FakeFs::new();
        let (a, b) = (
            "/sys/devices/pci0000:00/0000:00:05.0",
            "/sys/devices/pci0000:00/0000:00:06.0",
        );
        m.link("/sys/bus/pci/devices/0000:00:05.0", a)
            .link("/sys/bus/pci/devices/0000:00:06.0", b)
            .file(&format!("{a}/device"), "0x4941\n")
            .file(&format!("{b}/device"), "0x37c9\n");
        let c = cfg();
        assert_eq!(vf_dirs(&m, &c), [a]);
        let c = Config {
            kernel_vf_drivers: vec!["c6xxvf".into(), "4xxxvf".into()],
            ..cfg()
        };
        assert_eq!(vf_dirs(&m, &c), [a, b]);
    }

    #[test]
    fn igb_uio_gives_the_uio_node_and_a_writable_mount() {
        let mut m = gen4();
        m.link(&format!("{VF1}/driver"), "/sys/bus/pci/drivers/igb_uio")
            .file("/sys/bus/pci/drivers/igb_uio/bind", "");
        m.dir(&format!("{VF1}/uio/uio3"))
            .char_dev("/dev/uio3", 239, 3);
        let c = Config {
            dpdk_driver: DpdkDriver::IgbUio,
            ..cfg()
        };
        let s = scan(&m, &c);
        assert_eq!(
            summary(&s),
            ["generic 0000:6b:00.1 Health::Healthy QAT1=0000:6b:00.1 /dev/uio3"]
        );
        let mount = &s.tree[0].devices[0].info.mounts[0];
        assert_eq!(mount.host_path, "/sys/class/uio/uio3/device");
        assert_eq!(mount.container_path, "/sys/class/uio/uio3/device");
        assert!(!mount.read_only);
        assert!(s.notes[0].contains("0000:6b:00.2 is bound to driver vfio-pci, not igb_uio"));
    }
}
