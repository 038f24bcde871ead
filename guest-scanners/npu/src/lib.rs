//! `npu`: Intel NPUs (the `intel_vpu` accel driver), in place of Intel's NPU device plugin
//! (`cmd/npu_plugin/npu_plugin.go` in intel/intel-device-plugins-for-kubernetes), resource
//! namespace `npu.intel.com`, type `accel`.
//!
//! Reads `/sys/class/accel/*`, keeping entries named `accel<N>` whose `device/vendor` is `0x8086`
//! (trimmed) and whose `device/device`, first line, is one of the known NPU ids ([`NPU_IDS`]);
//! the node `/dev/accel/accel<N>` must exist (stat through devfs). Each NPU is advertised as
//! `SHARED_DEV_NUM` devices `accel<N>-0` .. `accel<N>-<SHARED_DEV_NUM-1>` sharing one description:
//! the node at the same path, permissions "rw" (querying metrics needs write access too); no
//! mounts, envs or annotations. Allocate returns that node.
//!
//! Health: a device seen before whose node or sysfs entry disappears (driver unbound) stays listed
//! as Unhealthy with its last description until it returns ([`wdp_guest::health::Vanished`]);
//! upstream has no health signal and simply drops it.
//!
//! Environment:
//! * `SHARED_DEV_NUM` (default 1, 1 ..= 10000): containers that may share one NPU (upstream
//!   `-shared-dev-num`).
//! * `RESCAN_INTERVAL_MS` (default 30000): longest wait between scans. Upstream rescans every
//!   5 s; here a change under /dev or /sys wakes the scanner at once.
//!
//! Deliberate difference: upstream exits when `/sys/class/accel` cannot be read (a kernel without
//! the accel subsystem); here that is an empty tree, since restarting cannot make NPUs appear.

use wdp_guest::health::Vanished;
use wdp_guest::hostfs::{Host, HostFs};
use wdp_guest::{DeviceInfo, DeviceTree, TreeBuilder, config};

/// The sysfs class listing accel devices.
pub const SYSFS_CLASS: &str = "/sys/class/accel";
/// Where accel device nodes live.
pub const DEV_DIR: &str = "/dev/accel";
/// The device type (kubelet resource `npu.intel.com/accel`).
pub const DEV_TYPE: &str = "accel";
/// Intel's PCI vendor id as sysfs prints it.
pub const VENDOR_INTEL: &str = "0x8086";
/// PCI device ids of the NPUs upstream supports, as sysfs prints them.
pub const NPU_IDS: [&str; 7] = [
    "0x7e4c", // Core Ultra Series 1
    "0x643e", // Core Ultra 200V Series
    "0xad1d", // Core Ultra Series 2
    "0x7d1d", // Core Ultra Series 2 (H)
    "0xb03e", // Core Ultra Series 3
    "0xfd3e", // Wildcat Lake
    "0xd71d", // Nova Lake
];
/// The environment variable with the number of containers sharing one NPU.
pub const SHARED_DEV_NUM_ENV: &str = "SHARED_DEV_NUM";
/// Largest accepted `SHARED_DEV_NUM`.
pub const MAX_SHARED_DEV_NUM: u32 = 10_000;

/// Reads `SHARED_DEV_NUM` (None: unset).
pub fn parse_shared_dev_num(value: Option<&str>) -> Result<u32, String> {
    config::parse_u32(SHARED_DEV_NUM_ENV, value, 1, 1..=MAX_SHARED_DEV_NUM)
}

/// True for `accel<N>` (upstream's `^accel[0-9]+$`).
pub fn is_accel_name(name: &str) -> bool {
    name.strip_prefix("accel")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// True when `vendor` (the `vendor` attribute) and `device` (the raw `device` attribute) are an
/// Intel NPU's. Upstream trims the vendor but only cuts the device id at its first newline.
pub fn is_npu(vendor: Option<&str>, device: Option<&str>) -> bool {
    let vendor_ok = vendor.is_some_and(|v| v.trim() == VENDOR_INTEL);
    let id = device.map(|d| d.split('\n').next().unwrap_or_default());
    vendor_ok && id.is_some_and(|id| NPU_IDS.contains(&id))
}

/// The tree for the machine `fs` shows with `shared` devices per NPU.
pub fn tree(fs: &impl HostFs, shared: u32) -> DeviceTree {
    let mut t = TreeBuilder::new();
    for name in fs.names(SYSFS_CLASS) {
        if !is_accel_name(&name) {
            continue;
        }
        // raw: upstream trims the vendor but not the device id (see `is_npu`)
        let attr = |a: &str| fs.read(&format!("{SYSFS_CLASS}/{name}/device/{a}")).ok();
        let (vendor, device) = (attr("vendor"), attr("device"));
        if !is_npu(vendor.as_deref(), device.as_deref()) {
            continue;
        }
        let node = format!("{DEV_DIR}/{name}");
        if !fs.exists(&node) {
            continue;
        }
        let info = DeviceInfo::new().node(&node, &node, "rw");
        t.add_shared(DEV_TYPE, &name, shared, info);
    }
    t.build()
}

struct Npu;

impl wdp_guest::Scanner for Npu {
    fn scan() -> Result<(), String> {
        let shared = parse_shared_dev_num(config::env_var(SHARED_DEV_NUM_ENV).as_deref())?;
        let mut vanished = Vanished::new();
        wdp_guest::run(|| Ok(vanished.mark(tree(&Host, shared))))
    }
}

wdp_guest::export_scanner!(Npu);

#[cfg(test)]
mod tests {
    use super::*;
    use wdp_guest::hostfs::FakeFs;
    use wdp_guest::tree::type_ids as ids;

    /// `devs` as (name, vendor, device) under /sys/class/accel, `nodes` under /dev.
    fn fake(devs: &[(&str, &str, &str)], nodes: &[&str]) -> FakeFs {
        let mut fs = FakeFs::new();
        for (name, vendor, device) in devs {
            let dir = format!("{SYSFS_CLASS}/{name}/device");
            fs.file(&format!("{dir}/vendor"), vendor)
                .file(&format!("{dir}/device"), device);
        }
        for (minor, node) in (0..).zip(nodes) {
            fs.char_dev(node, 261, minor);
        }
        fs
    }

    #[test]
    fn names_and_ids() {
        assert!(is_accel_name("accel0") && is_accel_name("accel12"));
        assert!(!is_accel_name("accel") && !is_accel_name("accel0a") && !is_accel_name("xaccel0"));
        assert!(is_npu(Some("0x8086\n"), Some("0x7d1d\n")));
        assert!(!is_npu(Some("0x8087\n"), Some("0x7d1d\n")));
        assert!(!is_npu(Some("0x8086\n"), Some("0x1234\n")));
        assert!(
            !is_npu(Some("0x8086\n"), Some(" 0x7d1d\n")),
            "upstream does not trim it"
        );
        assert!(!is_npu(None, Some("0x7d1d\n")) && !is_npu(Some("0x8086"), None));
    }

    #[test]
    fn tree_keeps_intel_npus_with_nodes() {
        let m = fake(
            &[
                ("accel0", "0x8086\n", "0x7e4c\n"),
                ("accel1", "0x1002\n", "0x7e4c\n"),
                ("accel2", "0x8086\n", "0x643e\n"),
                ("accel3", "0x8086\n", "0xad1d\n"),
            ],
            &[
                "/dev/accel/accel0",
                "/dev/accel/accel1",
                "/dev/accel/accel2",
            ],
        );
        assert_eq!(
            ids(&tree(&m, 2)),
            [
                "accel/accel0-0",
                "accel/accel0-1",
                "accel/accel2-0",
                "accel/accel2-1"
            ]
        );
        assert!(tree(&fake(&[], &[]), 1).is_empty());
    }

    #[test]
    fn shared_dev_num() {
        assert_eq!(parse_shared_dev_num(None), Ok(1));
        assert_eq!(parse_shared_dev_num(Some("4")), Ok(4));
        let e = parse_shared_dev_num(Some("0")).unwrap_err();
        assert!(e.starts_with("SHARED_DEV_NUM=\"0\" is not valid"), "{e}");
    }
}
