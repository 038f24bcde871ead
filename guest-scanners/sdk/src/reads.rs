//! The reads a scanner makes of the host's filesystem, behind one trait ([`HostFs`]), and the one
//! symlink walk over it ([`realpath`]); the SDK's public face of them is [`crate::hostfs`].
//!
//! Why a module of its own: the sources that implement the trait (devfs for /dev, `std::fs` for
//! /sys) and the guest's [`crate::hostfs::Host`] that combines them all build on it, so it sits
//! below all of them and none of them imports another to reach it.

use std::fmt;

use crate::bindings::scanner::wdp::device_plugin::devfs::{Node, NodeKind};
use crate::pathglob::{self, DirSource};

/// Why a file could not be read: a file that is not there (a device went away between two
/// reads) often means something else to a scanner than one that is there but cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// No such file.
    Missing,
    /// The file exists but reading it failed; the text says why.
    Unreadable(String),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Missing => f.write_str("no such file"),
            ReadError::Unreadable(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ReadError {}

/// A filesystem a scanner reads: listing and stat from [`DirSource`] (so [`pathglob::glob_with`]
/// walks it), plus symlink targets and file contents. Paths are absolute guest paths.
///
/// The provided methods are the reads scanners repeat (a trimmed attribute, sorted names, "is
/// this a character device", `realpath`), written once over the four required ones so that a
/// fake answers them exactly as the guest does.
pub trait HostFs: DirSource {
    /// The stored target of the symlink at `path` (it may be relative).
    fn read_link(&self, path: &str) -> Result<String, String>;

    /// The whole contents of the file at `path`, following symlinks.
    fn read(&self, path: &str) -> Result<String, ReadError>;

    /// `realpath(path)`: see [`realpath`].
    fn realpath(&self, path: &str) -> Option<String> {
        realpath(self, path)
    }

    /// [`HostFs::realpath`] of a path under /sys when the answer stays under /sys; None
    /// otherwise. Why: a sysfs link that leads out of /sys is not a device's sysfs directory.
    fn resolve_sys(&self, path: &str) -> Option<String> {
        let resolved = self.realpath(path)?;
        (resolved == "/sys" || resolved.starts_with("/sys/")).then_some(resolved)
    }

    /// The last component of [`HostFs::resolve_sys`]: e.g. the IOMMU group number behind
    /// `<pci device>/iommu_group`, or the driver bound to a device behind `<device>/driver`.
    fn resolve_name(&self, path: &str) -> Option<String> {
        self.resolve_sys(path)?
            .rsplit('/')
            .next()
            .map(str::to_string)
    }

    /// A sysfs attribute trimmed of surrounding whitespace (sysfs values end in a newline); None
    /// when it is missing or unreadable, since devices come and go between scans.
    fn read_attr(&self, path: &str) -> Option<String> {
        self.read(path).ok().map(|s| s.trim().to_string())
    }

    /// [`HostFs::read`] of each of `paths`, in order. Why: the guest
    /// ([`Host`](crate::hostfs::Host)) answers a whole batch of /sys files in one call to the
    /// host, where reading them one by one costs several boundary crossings each (open, read,
    /// close); a scanner that reads the same attributes of every device asks for all of them at
    /// once.
    fn read_many(&self, paths: &[String]) -> Vec<Result<String, ReadError>> {
        paths.iter().map(|p| self.read(p)).collect()
    }

    /// [`HostFs::read_attr`] of each of `paths`, in order, through [`HostFs::read_many`].
    fn read_attrs(&self, paths: &[String]) -> Vec<Option<String>> {
        self.read_many(paths)
            .into_iter()
            .map(|r| r.ok().map(|s| s.trim().to_string()))
            .collect()
    }

    /// The entries of directory `dir` with each symlink's stored target (None for other
    /// kinds). Why: a walk that resolves the links it lists (a class directory's entries, a
    /// device's `driver` and `iommu_group`) needs no `read_link` per entry: the guest gets the
    /// whole listing, targets included, in one call to the host.
    fn list_with_targets(&self, dir: &str) -> Result<Vec<(Node, Option<String>)>, String> {
        let base = dir.trim_end_matches('/');
        Ok(self
            .list(dir)?
            .into_iter()
            .map(|n| {
                let target = (n.kind == NodeKind::Symlink)
                    .then(|| self.read_link(&format!("{base}/{}", n.name)).ok())
                    .flatten();
                (n, target)
            })
            .collect())
    }

    /// The last component of a symlink's stored target (the driver name behind
    /// `<device>/driver`); None when `path` is not a readable symlink.
    fn link_name(&self, path: &str) -> Option<String> {
        let target = self.read_link(path).ok()?;
        let name = std::path::Path::new(&target).file_name()?;
        Some(name.to_string_lossy().into_owned())
    }

    /// The names in directory `dir`, sorted; empty when it is missing or unreadable.
    fn names(&self, dir: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .list(dir)
            .unwrap_or_default()
            .into_iter()
            .map(|n| n.name)
            .collect();
        names.sort();
        names
    }

    /// The paths matching the glob `pattern`, sorted; empty for an invalid pattern (patterns are
    /// constants or were checked with the configuration, see [`crate::devfs::check_dev_pattern`]
    /// and [`crate::sysfs::check_sys_pattern`]).
    fn glob(&self, pattern: &str) -> Vec<String>
    where
        Self: Sized,
    {
        pathglob::glob_with(self, pattern)
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.path)
            .collect()
    }

    /// True when an entry exists at `path` (a dangling symlink counts: it is not followed).
    fn exists(&self, path: &str) -> bool {
        self.stat(path).is_ok()
    }

    /// True when `path` exists and is a character device (a symlink does not count). Why: a
    /// scanner should advertise a device only when its node is really there.
    fn is_char_device(&self, path: &str) -> bool {
        matches!(self.stat(path), Ok(n) if n.kind == NodeKind::CharDevice)
    }
}

/// The most symlinks [`realpath`] follows before giving up (Linux's own limit).
const MAX_LINK_HOPS: usize = 40;

/// The canonical form of the absolute `path` in `fs`, following every symlink on the way, as
/// `realpath(3)` and Go's `filepath.EvalSymlinks` do; None for a missing component or a link loop.
///
/// Why: device plugins identify devices by resolved paths (the PCI address of a DRM card, a VF's
/// physical function, an IOMMU group's number, the node behind `/dev/char/<major>:<minor>`), and
/// `std::fs::canonicalize` is not available to a WASI guest nor devfs able to follow links. Links
/// in /sys and /dev are relative, so resolving them one component at a time with `stat` and
/// `read_link` gives the kernel's answer.
pub fn realpath<F: HostFs + ?Sized>(fs: &F, path: &str) -> Option<String> {
    let mut pending: Vec<String> = path.split('/').rev().map(str::to_string).collect();
    let mut done: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        match part.as_str() {
            "" | "." => continue,
            ".." => {
                done.pop();
                continue;
            }
            _ => {}
        }
        let here = if done.is_empty() {
            format!("/{part}")
        } else {
            format!("/{}/{part}", done.join("/"))
        };
        if fs.stat(&here).ok()?.kind != NodeKind::Symlink {
            done.push(part);
            continue;
        }
        hops += 1;
        if hops > MAX_LINK_HOPS {
            return None;
        }
        let target = fs.read_link(&here).ok()?;
        if target.starts_with('/') {
            done.clear();
        }
        pending.extend(target.split('/').rev().map(str::to_string));
    }
    Some(format!("/{}", done.join("/")))
}
