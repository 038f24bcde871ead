//! /sys through `std::fs`: attributes, symlink names, class directories and globs.
//!
//! Why: the host preopens the whole of /sys read-only (sysfs relies on relative symlinks that
//! must stay inside the preopen), so plain `std::fs` works there; these helpers fold the usual
//! sysfs idioms (trimmed one-line attributes, "which driver is bound" symlinks, listing
//! `/sys/class/<c>`) into one call each and turn "missing" into `None`/empty instead of errors,
//! since devices come and go between scans.

use crate::bindings::scanner::wdp::device_plugin::devfs::{Node, NodeKind};
use crate::pathglob::{self, DirSource, Match};
use crate::reads::{HostFs, ReadError};
use std::fs;
use std::path::Path;

/// The contents of a sysfs attribute file, trimmed of surrounding whitespace (sysfs values end
/// in a newline); None when it is missing or unreadable.
pub fn read_attr(path: impl AsRef<Path>) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// The last component of a symlink's target, e.g. the driver name for
/// `/sys/bus/pci/devices/0000:00:02.0/driver` -> `../../../bus/pci/drivers/i915` gives `i915`.
/// None when `path` is not a readable symlink.
pub fn read_link_name(path: impl AsRef<Path>) -> Option<String> {
    let target = fs::read_link(path).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

/// The canonical path of `path` under /sys, following every symlink on the way (`realpath`);
/// None when a component is missing or a link leaves /sys.
///
/// Why: Intel's plugins identify devices by resolved sysfs paths (the PCI address of a DRM
/// card, a VF's physical function, an IOMMU group's number), and `std::fs::canonicalize` is not
/// available to a WASI guest: this is [`crate::hostfs::realpath`] over `std::fs`.
pub fn resolve(path: impl AsRef<Path>) -> Option<String> {
    StdFs.resolve_sys(path.as_ref().to_str()?)
}

/// The last component of [`resolve`]`(path)`: e.g. the IOMMU group number behind
/// `<pci device>/iommu_group`, or the BDF of a VF's physical function behind `<vf>/physfn`.
pub fn resolve_name(path: impl AsRef<Path>) -> Option<String> {
    resolve(path)?.rsplit('/').next().map(str::to_string)
}

/// The names in a directory, sorted; empty when it is missing or unreadable.
pub fn list_dir(path: impl AsRef<Path>) -> Vec<String> {
    let Ok(rd) = fs::read_dir(path) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The entries of `/sys/class/<class>` (e.g. `list_class("net")` gives interface names), sorted.
pub fn list_class(class: &str) -> Vec<String> {
    list_dir(format!("/sys/class/{class}"))
}

fn kind_of(ft: fs::FileType) -> NodeKind {
    if ft.is_symlink() {
        NodeKind::Symlink
    } else if ft.is_dir() {
        NodeKind::Directory
    } else if ft.is_file() {
        NodeKind::File
    } else {
        NodeKind::Other
    }
}

/// The [`DirSource`] of `std::fs` (for /sys), for [`pathglob::glob_with`]. Major, minor and mode
/// are reported as 0.
pub struct StdFs;

impl DirSource for StdFs {
    fn list(&self, dir: &str) -> Result<Vec<Node>, String> {
        let rd = fs::read_dir(dir).map_err(|e| format!("{dir}: {e}"))?;
        Ok(rd
            .filter_map(|e| e.ok())
            .map(|e| {
                let kind = e.file_type().map(kind_of).unwrap_or(NodeKind::Other);
                pathglob::node(&e.file_name().to_string_lossy(), kind)
            })
            .collect())
    }
    fn stat(&self, path: &str) -> Result<Node, String> {
        let md = fs::symlink_metadata(path).map_err(|e| format!("{path}: {e}"))?;
        let name = path.rsplit('/').next().unwrap_or("");
        Ok(pathglob::node(name, kind_of(md.file_type())))
    }
}

impl HostFs for StdFs {
    fn read_link(&self, path: &str) -> Result<String, String> {
        let target = fs::read_link(path).map_err(|e| format!("{path}: {e}"))?;
        target
            .to_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{path}: the link's target is not UTF-8"))
    }
    fn read(&self, path: &str) -> Result<String, ReadError> {
        fs::read_to_string(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ReadError::Missing,
            _ => ReadError::Unreadable(e.to_string()),
        })
    }
}

/// The paths matching `pattern` under /sys, sorted, for patterns that are constants or were
/// validated with the configuration: an invalid one matches nothing.
pub fn glob_paths(pattern: &str) -> Vec<String> {
    glob_sys(pattern)
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.path)
        .collect()
}

/// Checks that `pattern` is a valid glob under /sys (no `..`).
pub fn check_sys_pattern(pattern: &str) -> Result<(), String> {
    if pattern != "/sys" && !pattern.starts_with("/sys/") {
        return Err("must be a path under /sys/".into());
    }
    pathglob::validate(pattern)
}

/// All entries under /sys matching the glob `pattern`, sorted by path (e.g.
/// `glob_sys("/sys/class/drm/card*")`). Only an invalid pattern is an error.
pub fn glob_sys(pattern: &str) -> Result<Vec<Match>, String> {
    check_sys_pattern(pattern).map_err(|e| format!("glob {pattern:?}: {e}"))?;
    pathglob::glob_with(&StdFs, pattern)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_links_and_dirs_on_a_real_tree() {
        let dir = std::env::temp_dir().join(format!("wdp-sysfs-test-{}", std::process::id()));
        let class = dir.join("class/net");
        fs::create_dir_all(&class).unwrap();
        fs::write(class.join("eth0"), "  0x1050\n").unwrap();
        fs::write(class.join("eth1"), "").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("../../bus/pci/drivers/i915", dir.join("driver")).unwrap();

        assert_eq!(read_attr(class.join("eth0")).as_deref(), Some("0x1050"));
        assert_eq!(read_attr(class.join("missing")), None);
        assert_eq!(list_dir(&class), ["eth0", "eth1"]);
        assert!(list_dir(dir.join("nope")).is_empty());
        #[cfg(unix)]
        assert_eq!(read_link_name(dir.join("driver")).as_deref(), Some("i915"));
        assert_eq!(read_link_name(class.join("eth0")), None);

        let pattern = format!("{}/class/*/eth*", dir.display());
        let m = pathglob::glob_with(&StdFs, &pattern).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].node.kind, NodeKind::File);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn resolve_follows_relative_links_like_realpath() {
        let dir = std::env::temp_dir().join(format!("wdp-resolve-test-{}", std::process::id()));
        let dev = dir.join("devices/pci0000:00/0000:00:02.0");
        fs::create_dir_all(dev.join("drm/card0")).unwrap();
        fs::create_dir_all(dir.join("class/drm")).unwrap();
        fs::create_dir_all(dir.join("kernel/iommu_groups/7")).unwrap();
        std::os::unix::fs::symlink(
            "../../devices/pci0000:00/0000:00:02.0/drm/card0",
            dir.join("class/drm/card0"),
        )
        .unwrap();
        std::os::unix::fs::symlink("../../../kernel/iommu_groups/7", dev.join("iommu_group"))
            .unwrap();
        std::os::unix::fs::symlink("loop", dir.join("loop")).unwrap();
        let base = dir.display().to_string();
        let walk = |rel: &str| StdFs.realpath(&format!("{base}/{rel}"));
        assert_eq!(
            walk("class/drm/card0/.."),
            Some(format!("{base}/devices/pci0000:00/0000:00:02.0/drm"))
        );
        assert_eq!(
            walk("class/drm/card0/../../iommu_group"),
            Some(format!("{base}/kernel/iommu_groups/7"))
        );
        assert_eq!(walk("class/drm/card1"), None, "a missing component");
        assert_eq!(walk("loop"), None, "a link loop ends");
        // The same walk, with the rule that the answer must be under /sys.
        assert_eq!(resolve(format!("{base}/class/drm/card0")), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sys_patterns() {
        assert!(check_sys_pattern("/sys/class/*").is_ok());
        assert!(check_sys_pattern("/system").is_err());
        assert!(check_sys_pattern("/sys/../etc").is_err());
    }
}
