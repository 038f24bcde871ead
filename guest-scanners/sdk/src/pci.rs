//! PCI devices under `/sys/bus/pci/devices`: addresses, ids, drivers and IOMMU groups.
//!
//! Why: most accelerator scanners (GPU, QAT, VFIO, NVIDIA, NPU) start from a PCI function and
//! ask the same three questions of it: which ids it has, which driver is bound, which IOMMU
//! group it is in. Each answer is a sysfs idiom (a hex attribute, the name a symlink points
//! to); getting them the same way everywhere keeps device ids identical across scanners.

use crate::sysfs;

/// Where the kernel lists every PCI function by address.
pub const DEVICES_DIR: &str = "/sys/bus/pci/devices";

/// True for a full PCI address (`dddd:bb:dd.f`, lower-case hex), the form sysfs uses and the
/// form Intel's plugins use as device ids.
pub fn is_bdf(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && (b'0'..=b'7').contains(&b[11])
}

/// The sysfs directory of the PCI function `bdf`.
pub fn device_dir(bdf: &str) -> String {
    format!("{DEVICES_DIR}/{bdf}")
}

/// Every PCI function's address, sorted.
pub fn list() -> Vec<String> {
    sysfs::list_dir(DEVICES_DIR)
        .into_iter()
        .filter(|n| is_bdf(n))
        .collect()
}

/// A hex id attribute (`vendor`, `device`, `class`, ...) of a device directory, lower-cased and
/// without its `0x` prefix: `"0x8086\n"` gives `"8086"`.
pub fn id_attr(dev_dir: &str, attr: &str) -> Option<String> {
    let v = sysfs::read_attr(format!("{dev_dir}/{attr}"))?;
    let v = v
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    Some(v.strip_prefix("0x").unwrap_or(&v).to_string())
}

/// The name of the driver bound to a device directory (`<dev>/driver` -> `.../drivers/<name>`);
/// None when no driver is bound.
pub fn driver(dev_dir: &str) -> Option<String> {
    sysfs::read_link_name(format!("{dev_dir}/driver"))
}

/// The IOMMU group of a device directory (`<dev>/iommu_group` -> `.../iommu_groups/<n>`).
pub fn iommu_group(dev_dir: &str) -> Option<String> {
    sysfs::read_link_name(format!("{dev_dir}/iommu_group"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf() {
        for ok in ["0000:00:02.0", "0000:3d:01.7", "ffff:ff:1f.0"] {
            assert!(is_bdf(ok), "{ok}");
        }
        for bad in [
            "0000:00:02",
            "0000:00:02.8",
            "0000:0G:02.0",
            "0000-00:02.0",
            "0000:3D:01.0",
            "",
        ] {
            assert!(!is_bdf(bad), "{bad}");
        }
    }
}
