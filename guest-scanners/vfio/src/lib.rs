//! `vfio`: PCI functions bound to `vfio-pci`, selected by PCI device id, in place of Intel's
//! generic VFIO plugin (`pkg/vfio/plugin.go` in intel/intel-device-plugins-for-kubernetes, used
//! by `cmd/dsa_plugin` with `-driver=vfio-pci`: serve this scanner under `dsa.intel.com` with
//! `VFIO_DEVICE_IDS: "0x0b25,0x11fb,0x1212"` for the same resource).
//!
//! **Reads** every `/sys/bus/pci/devices/????:??:??.?`: its `device` id, its `driver` link
//! (resolved; must be `vfio-pci`) and its `iommu_group` link (resolved); then checks through
//! devfs that `/dev/vfio/<group>` and `/dev/vfio/vfio` are character devices.
//!
//! **Reports** one device per such function, type `vfio` (or `VFIO_TYPE`), id = its PCI
//! address (`0000:6a:01.0`), nodes `/dev/vfio/<group>` and `/dev/vfio/vfio` (rw), env
//! `VFIO_BDF<n>=<address>`, `n` counting the matching vfio-pci functions from 1 in address
//! order. A function served before and not usable now (gone, unbound, node missing) is reported
//! Unhealthy until it is usable again.
//!
//! **Post-allocate** (this component is also the scanner's post-allocator): in each
//! container's response the `VFIO_BDF<n>` envs are renamed `VFIO_BDF0`, `VFIO_BDF1`, ... in the
//! order of `n`.
//!
//! **Environment:**
//!
//! * `VFIO_DEVICE_IDS` (required): the PCI device ids to serve, separated by commas and/or
//!   blanks, each 4 hex digits with or without `0x` (e.g. `0x0b25,0x11fb,0x1212` for DSA).
//!   Upstream's library takes the set from its caller; there is no sensible default for a
//!   generic scanner, so an unset value is an error.
//! * `VFIO_TYPE` (default `vfio`, upstream's fixed type): the dev-type, so that two instances
//!   can serve different device sets in one namespace.
//! * `RESCAN_INTERVAL_MS` (default 30000; upstream scans every 15 s): longest wait between scans
//!   (the host wakes the scanner earlier when /dev changes or a driver is bound or unbound).
//!
//! **Deliberate differences from upstream:** a matching function without a driver, without an
//! IOMMU group, or with a missing device node is left out (with one line on stderr) where
//! upstream's scan fails and the plugin exits; a function bound to another driver is left out
//! as upstream does, also with one line on stderr. Device ids match case-insensitively. Envs
//! are renumbered per container and in a fixed order (upstream: random map order, and one
//! renamed map shared by all containers of a request).

use std::collections::BTreeSet;

use wdp_guest::tree::is_dev_type;

use wdp_guest::{
    ContainerAllocateRequest, ContainerAllocateResponse, DeviceInfo, TreeBuilder, config, envs,
    health::Vanished,
    hostfs::{Host, HostFs},
    notes::{Notes, Scanned},
};

/// The PCI device ids to serve.
pub const DEVICE_IDS_ENV: &str = "VFIO_DEVICE_IDS";
/// The dev-type to serve them as.
pub const TYPE_ENV: &str = "VFIO_TYPE";
/// Upstream's dev-type.
pub const DEFAULT_TYPE: &str = "vfio";
/// The env prefix of each function's address (`VFIO_BDF1=0000:6a:01.0`).
pub const ENV_PREFIX: &str = "VFIO_BDF";
/// Where the kernel lists every PCI function.
pub const PCI_DEVICES_DIR: &str = "/sys/bus/pci/devices";
/// The VFIO container node every user of a group also needs.
pub const VFIO_CONTROL: &str = "/dev/vfio/vfio";

/// The scanner's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Device ids as sysfs prints them: `0x` and 4 lower-case hex digits.
    pub device_ids: BTreeSet<String>,
    pub dev_type: String,
}

impl Config {
    /// The settings from `get(name)` (None: unset).
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let device_ids = parse_device_ids(get(DEVICE_IDS_ENV).as_deref())?;
        let dev_type = get(TYPE_ENV).unwrap_or_else(|| DEFAULT_TYPE.into());
        if !is_dev_type(&dev_type) {
            return Err(format!(
                "{TYPE_ENV}={:?} is not valid: expected a resource name of at most 63 \
                 letters, digits, '-', '_' or '.', starting and ending with a letter or digit \
                 (default {DEFAULT_TYPE})",
                config::excerpt(&dev_type, 80)
            ));
        }
        Ok(Config {
            device_ids,
            dev_type,
        })
    }
}

/// Reads `VFIO_DEVICE_IDS`: at least one id, each `[0x]hhhh`; normalized to `0xhhhh` lower case.
pub fn parse_device_ids(value: Option<&str>) -> Result<BTreeSet<String>, String> {
    let expected = "expected PCI device ids separated by commas or blanks, each 4 hex digits \
                    with or without 0x, e.g. 0x0b25,0x11fb,0x1212 (DSA)";
    let Some(raw) = value else {
        return Err(format!("{DEVICE_IDS_ENV} is not set: {expected}"));
    };
    let mut ids = BTreeSet::new();
    for entry in raw.split([',', ' ', '\t', '\n']).filter(|e| !e.is_empty()) {
        let hex = entry
            .strip_prefix("0x")
            .or_else(|| entry.strip_prefix("0X"))
            .unwrap_or(entry);
        if hex.len() != 4 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "{DEVICE_IDS_ENV}={:?} is not valid: {:?} is not a device id; {expected}",
                config::excerpt(raw, 80),
                config::excerpt(entry, 20)
            ));
        }
        ids.insert(format!("0x{}", hex.to_ascii_lowercase()));
    }
    if ids.is_empty() {
        return Err(format!(
            "{DEVICE_IDS_ENV}={:?} is not valid: no device id; {expected}",
            config::excerpt(raw, 80)
        ));
    }
    Ok(ids)
}

/// One scan of the machine `m` shows (upstream's `scan`, see the crate documentation for the
/// differences).
pub fn scan(m: &impl HostFs, cfg: &Config) -> Scanned {
    let mut tree = TreeBuilder::new();
    let mut notes = Vec::new();
    let mut n = 0;
    for dir in m.glob(&format!("{PCI_DEVICES_DIR}/????:??:??.?")) {
        let Some(id) = m.read_attr(&format!("{dir}/device")) else {
            continue;
        };
        if !cfg.device_ids.contains(&id.to_ascii_lowercase()) {
            continue;
        }
        let bdf = dir.rsplit('/').next().unwrap_or(&dir);
        match m.resolve_name(&format!("{dir}/driver")) {
            Some(d) if d == "vfio-pci" => {}
            bound => {
                let bound = bound.map_or("no driver".to_string(), |d| format!("driver {d}"));
                notes.push(format!(
                    "PCI function {bdf} ({id}) is bound to {bound}, not vfio-pci: not served"
                ));
                continue;
            }
        }
        // Counted as upstream counts: every matching function bound to vfio-pci.
        n += 1;
        let Some(group) = m.resolve_name(&format!("{dir}/iommu_group")) else {
            notes.push(format!(
                "PCI function {bdf} ({id}) has no IOMMU group: not served"
            ));
            continue;
        };
        let node = format!("/dev/vfio/{group}");
        if let Some(missing) = [node.as_str(), VFIO_CONTROL]
            .into_iter()
            .find(|p| !m.is_char_device(p))
        {
            notes.push(format!(
                "PCI function {bdf} ({id}): {missing} is not a character device: not served"
            ));
            continue;
        }
        let info = DeviceInfo::new()
            .node(&node, &node, "rw")
            .node(VFIO_CONTROL, VFIO_CONTROL, "rw")
            .env(format!("{ENV_PREFIX}{n}"), bdf);
        tree.add(&cfg.dev_type, bdf, info);
    }
    Scanned {
        tree: tree.build(),
        notes,
    }
}

struct Vfio;

impl wdp_guest::Scanner for Vfio {
    fn scan() -> Result<(), String> {
        let cfg = Config::parse(config::env_var)?;
        let mut vanished = Vanished::new();
        let mut notes = Notes::new();
        wdp_guest::run(|| {
            let scan = scan(&Host, &cfg);
            notes.print(scan.notes);
            Ok(vanished.mark(scan.tree))
        })
    }
}

impl wdp_guest::PostAllocator for Vfio {
    fn post_allocate(
        _dev_type: String,
        _requests: Vec<ContainerAllocateRequest>,
        responses: Vec<ContainerAllocateResponse>,
    ) -> Result<Vec<ContainerAllocateResponse>, String> {
        Ok(envs::renumber_responses(responses, ENV_PREFIX))
    }
}

wdp_guest::export_device_plugin!(Vfio);

#[cfg(test)]
mod tests {
    use super::*;
    use wdp_guest::hostfs::FakeFs;

    /// Adds PCI function `bdf` with device id `id`, bound to `driver`, in IOMMU group `group`
    /// (whose /dev/vfio node exists), laid out as sysfs does: `/sys/bus/pci/devices/<bdf>` links
    /// into `/sys/devices`, whose `driver` and `iommu_group` link back up relatively.
    fn function(fs: &mut FakeFs, bdf: &str, id: &str, driver: Option<&str>, group: Option<&str>) {
        let dir = format!("/sys/devices/pci0000:00/{bdf}");
        fs.file(&format!("{dir}/device"), &format!("{id}\n")).link(
            &format!("/sys/bus/pci/devices/{bdf}"),
            &format!("../../../devices/pci0000:00/{bdf}"),
        );
        if let Some(d) = driver {
            fs.dir(&format!("/sys/bus/pci/drivers/{d}")).link(
                &format!("{dir}/driver"),
                &format!("../../../bus/pci/drivers/{d}"),
            );
        }
        if let Some(g) = group {
            fs.dir(&format!("/sys/kernel/iommu_groups/{g}"))
                .link(
                    &format!("{dir}/iommu_group"),
                    &format!("../../../kernel/iommu_groups/{g}"),
                )
                .char_dev(&format!("/dev/vfio/{g}"), 240, 0);
        }
    }

    fn with_control() -> FakeFs {
        let mut fs = FakeFs::new();
        fs.char_dev(VFIO_CONTROL, 10, 196);
        fs
    }

    fn dsa() -> Config {
        Config::parse(|k| (k == DEVICE_IDS_ENV).then(|| "0x0b25 0x11fb,0x1212".to_string()))
            .unwrap()
    }

    fn summary(s: &Scanned) -> Vec<String> {
        s.tree
            .iter()
            .flat_map(|g| {
                g.devices.iter().map(|d| {
                    let nodes: Vec<&str> =
                        d.info.nodes.iter().map(|n| n.host_path.as_str()).collect();
                    format!(
                        "{} {} {}={} {}",
                        g.dev_type,
                        d.id,
                        d.info.envs[0].0,
                        d.info.envs[0].1,
                        nodes.join(",")
                    )
                })
            })
            .collect()
    }

    #[test]
    fn device_ids() {
        let ids = parse_device_ids(Some("0x0B25, 11fb\t0X1212")).unwrap();
        assert_eq!(
            ids.into_iter().collect::<Vec<_>>(),
            ["0x0b25", "0x11fb", "0x1212"]
        );
        let e = parse_device_ids(None).unwrap_err();
        assert!(e.starts_with("VFIO_DEVICE_IDS is not set"), "{e}");
        for bad in ["", " , ", "0x0b2", "0x0b255", "0xzz25", "8086:0b25"] {
            let e = parse_device_ids(Some(bad)).unwrap_err();
            assert!(
                e.starts_with(&format!("VFIO_DEVICE_IDS={bad:?} is not valid")),
                "{e}"
            );
        }
    }

    #[test]
    fn dev_type_setting() {
        assert_eq!(dsa().dev_type, "vfio");
        let get = |t: &'static str| {
            move |k: &str| match k {
                DEVICE_IDS_ENV => Some("0b25".to_string()),
                TYPE_ENV => Some(t.to_string()),
                _ => None,
            }
        };
        assert_eq!(Config::parse(get("dsa-vfio")).unwrap().dev_type, "dsa-vfio");
        let e = Config::parse(get("dsa/vfio")).unwrap_err();
        assert!(e.starts_with("VFIO_TYPE=\"dsa/vfio\" is not valid"), "{e}");
    }

    #[test]
    fn matching_vfio_functions_numbered_from_one() {
        let mut m = with_control();
        function(
            &mut m,
            "0000:6a:01.0",
            "0x0b25",
            Some("vfio-pci"),
            Some("12"),
        );
        function(
            &mut m,
            "0000:6a:02.0",
            "0x0b26",
            Some("vfio-pci"),
            Some("13"),
        );
        function(&mut m, "0000:6f:01.0", "0x0b25", Some("idxd"), Some("14"));
        function(
            &mut m,
            "0000:74:01.0",
            "0x0B25",
            Some("vfio-pci"),
            Some("15"),
        );
        function(&mut m, "0000:79:01.0", "0x0b25", None, None);
        let s = scan(&m, &dsa());
        assert_eq!(
            summary(&s),
            [
                "vfio 0000:6a:01.0 VFIO_BDF1=0000:6a:01.0 /dev/vfio/12,/dev/vfio/vfio",
                "vfio 0000:74:01.0 VFIO_BDF2=0000:74:01.0 /dev/vfio/15,/dev/vfio/vfio",
            ]
        );
        assert_eq!(
            s.notes,
            [
                "PCI function 0000:6f:01.0 (0x0b25) is bound to driver idxd, not vfio-pci: not served",
                "PCI function 0000:79:01.0 (0x0b25) is bound to no driver, not vfio-pci: not served",
            ]
        );
    }

    #[test]
    fn missing_group_or_node_leaves_the_function_out_but_keeps_numbers() {
        let mut m = with_control();
        function(&mut m, "0000:6a:01.0", "0x0b25", Some("vfio-pci"), None);
        function(
            &mut m,
            "0000:6f:01.0",
            "0x0b25",
            Some("vfio-pci"),
            Some("14"),
        );
        function(
            &mut m,
            "0000:74:01.0",
            "0x0b25",
            Some("vfio-pci"),
            Some("15"),
        );
        m.remove("/dev/vfio/14");
        let s = scan(&m, &dsa());
        assert_eq!(
            summary(&s),
            ["vfio 0000:74:01.0 VFIO_BDF3=0000:74:01.0 /dev/vfio/15,/dev/vfio/vfio"]
        );
        assert_eq!(s.notes.len(), 2);
        assert!(s.notes[0].contains("no IOMMU group"));
        assert!(s.notes[1].contains("/dev/vfio/14 is not a character device"));
        m.remove("/dev/vfio");
        let s = scan(&m, &dsa());
        assert!(s.tree.iter().all(|g| g.devices.is_empty()));
        assert!(s.notes[2].contains("/dev/vfio/15 is not a character device"));
    }

    #[test]
    fn post_allocate_renumbers() {
        let r = ContainerAllocateResponse {
            envs: vec![
                ("VFIO_BDF10".into(), "b".into()),
                ("VFIO_BDF9".into(), "a".into()),
            ],
            mounts: Vec::new(),
            devices: Vec::new(),
            annotations: Vec::new(),
            cdi_devices: Vec::new(),
        };
        let out =
            <Vfio as wdp_guest::PostAllocator>::post_allocate("vfio".into(), Vec::new(), vec![r])
                .unwrap();
        let mut e = out[0].envs.clone();
        e.sort();
        assert_eq!(
            e,
            [
                ("VFIO_BDF0".to_string(), "a".to_string()),
                ("VFIO_BDF1".to_string(), "b".to_string())
            ]
        );
    }
}
