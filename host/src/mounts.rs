//! Whether the host's sys and dev roots are read-only all the way down.
//!
//! The DaemonSet mounts the node's /sys and /dev read-only at `/host/sys` and `/host/dev`. A
//! read-only hostPath mount is a recursive bind whose sub-mounts (`/sys/fs/cgroup`,
//! `/sys/kernel/debug`, `/dev/shm`, ...) stay writable unless the runtime makes them read-only
//! too (`recursiveReadOnly`), which older runtimes cannot: `IfPossible` then quietly falls back
//! to a plain read-only mount. wdp only ever reads these trees, and its guests see them through
//! a read-only preopen, so nothing breaks; but a writable `/host/sys/fs/cgroup` is more than
//! the pod was meant to hold, and nothing else tells the operator. So at start the host reads
//! `/proc/self/mountinfo`, finds every mount at or under each root that is not read-only, warns
//! when a read-only root has writable mounts below it, and reports them in `/status` and
//! `wdp_host_writable_mounts`.

use std::path::{Path, PathBuf};

use crate::sandbox::Roots;

/// One line of `/proc/self/mountinfo`, what matters of it here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Its id, and its parent's: a mount whose parent is hidden is hidden too.
    pub id: u64,
    /// The mount it is mounted on.
    pub parent: u64,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The filesystem type (`cgroup2`, `sysfs`, `tmpfs`, ...).
    pub fs_type: String,
    /// Neither the mount nor its filesystem is read-only.
    pub writable: bool,
}

/// What is writable at or under one root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootMounts {
    /// The root as configured.
    pub root: PathBuf,
    /// The mount the root itself is on is writable.
    pub root_writable: bool,
    /// Writable mounts strictly below the root, in mount order.
    pub writable_below: Vec<Mount>,
}

impl RootMounts {
    /// Every writable mount at or under the root, as `path (fstype)`.
    pub fn writable(&self, covering: Option<&Mount>) -> Vec<String> {
        covering
            .filter(|_| self.root_writable)
            .into_iter()
            .chain(&self.writable_below)
            .map(|m| format!("{} ({})", m.mount_point.display(), m.fs_type))
            .collect()
    }
}

/// `\040`-style escapes of mountinfo's paths undone.
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(octal) = bytes.get(i + 1..i + 4)
            && octal.iter().all(|b| (b'0'..=b'7').contains(b))
        {
            out.push(
                octal
                    .iter()
                    .fold(0u8, |n, b| n.wrapping_mul(8) + (b - b'0')),
            );
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// The mounts `/proc/self/mountinfo`'s `text` lists, in its order (parents before children,
/// later mounts over earlier ones); lines of another shape are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let mount: Vec<&str> = mount.split(' ').collect();
            let fs: Vec<&str> = fs.split(' ').collect();
            let id = mount.first()?.parse().ok()?;
            let parent = mount.get(1)?.parse().ok()?;
            let (mount_point, options) = (mount.get(4)?, mount.get(5)?);
            let (fs_type, super_options) = (fs.first()?, fs.get(2)?);
            let ro = |options: &str| options.split(',').any(|o| o == "ro");
            Some(Mount {
                id,
                parent,
                mount_point: unescape(mount_point),
                fs_type: (*fs_type).to_owned(),
                writable: !ro(options) && !ro(super_options),
            })
        })
        .collect()
}

/// The mount `root` is on (the deepest mount point above or at it, the latest of those), and
/// what is writable at and below it.
pub fn under(mounts: &[Mount], root: &Path) -> (Option<Mount>, RootMounts) {
    let covering = mounts
        .iter()
        .filter(|m| root.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())
        .and_then(|deepest| {
            mounts
                .iter()
                .rev()
                .find(|m| m.mount_point == deepest.mount_point)
        })
        .cloned();
    // Only the latest mount at a path is seen there, and what is mounted on a hidden mount is
    // hidden with it.
    let covered = |i: usize| {
        mounts[i + 1..]
            .iter()
            .any(|later| later.mount_point == mounts[i].mount_point)
    };
    let visible = |mut i: usize| {
        // A mount stacked on another at the same path has it as its parent: that one is
        // covered by design, and what decides is the mount below the stack.
        let mut stacked = false;
        for _ in 0..mounts.len() {
            if !stacked && covered(i) {
                return false;
            }
            match mounts.iter().position(|p| p.id == mounts[i].parent) {
                Some(parent) if parent != i => {
                    stacked = mounts[parent].mount_point == mounts[i].mount_point;
                    i = parent;
                }
                _ => return true,
            }
        }
        true
    };
    let writable_below = mounts
        .iter()
        .enumerate()
        .filter(|(i, m)| {
            m.writable && m.mount_point.starts_with(root) && m.mount_point != root && visible(*i)
        })
        .map(|(_, m)| m.clone())
        .collect();
    let report = RootMounts {
        root: root.to_path_buf(),
        root_writable: covering.as_ref().is_some_and(|m| m.writable),
        writable_below,
    };
    (covering, report)
}

/// Checks both roots against `/proc/self/mountinfo`, logs what it finds, and returns every
/// writable mount at or under each root, by root (`sys`, `dev`). A root that cannot be
/// resolved, or a mountinfo that cannot be read, is logged and reported as nothing writable.
pub fn check(roots: &Roots) -> Vec<(&'static str, Vec<String>)> {
    let text = match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => text,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read /proc/self/mountinfo: the sys and dev roots' mounts are not checked");
            return vec![("sys", Vec::new()), ("dev", Vec::new())];
        }
    };
    let mounts = parse_mountinfo(&text);
    [("sys", &roots.sys), ("dev", &roots.dev)]
        .into_iter()
        .map(|(name, root)| {
            let Ok(root) = std::fs::canonicalize(root) else {
                return (name, Vec::new());
            };
            let (covering, report) = under(&mounts, &root);
            let writable = report.writable(covering.as_ref());
            if report.root_writable {
                tracing::info!(
                    root = %root.display(),
                    writable = writable.join(", "),
                    "the {name} root is on a writable mount (not mounted read-only); wdp only reads it"
                );
            } else if !report.writable_below.is_empty() {
                tracing::warn!(
                    root = %root.display(),
                    writable = writable.join(", "),
                    "the {name} root is mounted read-only but mounts under it are writable: the container runtime did not make the mount recursively read-only (recursiveReadOnly needs Kubernetes 1.30+ with containerd 2.0+ or CRI-O 1.30+, and Linux 5.12+; see docs/src/operator/pod-rights.md); wdp only reads them"
                );
            }
            (name, writable)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mountinfo as containerd 1.6 leaves a pod with `/host/sys` read-only without
    /// recursiveReadOnly: the bind read-only, its sub-mounts as they were.
    const POD: &str = "\
2417 2330 0:331 / / rw,relatime master:717 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
2420 2417 0:23 / /host/sys ro,relatime - sysfs sysfs rw
2421 2420 0:6 / /host/sys/kernel/security rw,nosuid,nodev,noexec,relatime - securityfs securityfs rw
2422 2420 0:26 / /host/sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate
2423 2420 0:38 / /host/sys/fs/bpf ro,nosuid,nodev,noexec,relatime - bpf bpf rw,mode=700
2424 2420 0:12 / /host/sys/kernel/tracing rw,nosuid - tracefs tracefs ro
2425 2417 0:5 / /host/dev ro,nosuid - devtmpfs udev rw,size=4008k
2426 2425 0:24 / /host/dev/shm rw,nosuid,nodev - tmpfs tmpfs rw
2427 2417 0:40 / /var/lib/with\\040space rw - ext4 /dev/sda1 rw
";

    #[test]
    fn a_read_only_root_with_writable_mounts_below() {
        let mounts = parse_mountinfo(POD);
        assert_eq!(mounts.len(), 9);
        assert_eq!(mounts[8].mount_point, Path::new("/var/lib/with space"));
        let (covering, sys) = under(&mounts, Path::new("/host/sys"));
        assert!(!sys.root_writable);
        assert_eq!(
            sys.writable(covering.as_ref()),
            [
                "/host/sys/kernel/security (securityfs)",
                "/host/sys/fs/cgroup (cgroup2)"
            ],
            "read-only mounts, and read-only filesystems (tracefs here), are not writable"
        );
        let (covering, dev) = under(&mounts, Path::new("/host/dev"));
        assert_eq!(dev.writable(covering.as_ref()), ["/host/dev/shm (tmpfs)"]);
        // A root inside a writable mount: the mount itself counts.
        let (covering, lib) = under(&mounts, Path::new("/var/lib/with space/sys"));
        assert!(lib.root_writable);
        assert_eq!(
            lib.writable(covering.as_ref()),
            ["/var/lib/with space (ext4)"]
        );
        // `/host/system` is not under `/host/sys`.
        let (_, other) = under(&mounts, Path::new("/host/system"));
        assert!(other.writable_below.is_empty());
    }

    #[test]
    fn the_latest_mount_at_a_path_is_the_one_seen() {
        // A read-only bind over an older writable one: the cgroup mount under the old one is
        // hidden with it.
        let text = "\
1 0 0:1 / / rw - ext4 /dev/sda1 rw
2 1 0:2 / /host/sys rw - sysfs sysfs rw
3 2 0:3 / /host/sys/fs/cgroup rw - cgroup2 cgroup2 rw
4 2 0:2 / /host/sys ro - sysfs sysfs rw
";
        let (covering, sys) = under(&parse_mountinfo(text), Path::new("/host/sys"));
        assert!(!sys.root_writable);
        assert!(sys.writable(covering.as_ref()).is_empty(), "{sys:?}");
        // And the same with a writable mount on the new one.
        let text = format!("{text}5 4 0:3 / /host/sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
        let (covering, sys) = under(&parse_mountinfo(&text), Path::new("/host/sys"));
        assert_eq!(
            sys.writable(covering.as_ref()),
            ["/host/sys/fs/cgroup (cgroup2)"]
        );
    }
}
