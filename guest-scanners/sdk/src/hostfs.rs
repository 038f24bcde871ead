//! The host's filesystem as a guest sees it: one trait ([`HostFs`]) for every read a scanner
//! makes, the guest's implementation ([`Host`]: /dev through devfs, the rest through `std::fs`)
//! and an in-memory one for unit tests ([`FakeFs`]).
//!
//! Why: host imports are unreachable off wasm, so a scanner's logic can only be tested when it
//! reads the machine through something a test can replace. Written against [`HostFs`], a
//! scanner's `scan` takes `&Host` in the guest and a [`FakeFs`] built in a few lines in its tests,
//! and the derived reads (trimmed attributes, sorted names, globs, `realpath`) are the same code
//! in both. [`realpath`] is the one symlink walk of the SDK: [`crate::sysfs::resolve`] is it over
//! `std::fs`, a /dev link is resolved by it over devfs.

use std::collections::BTreeMap;

use crate::bindings::scanner::wdp::device_plugin::hostfs as raw_hostfs;
use crate::devfs::{Devfs, DirChanges, Node, NodeKind};
use crate::pathglob::{self, DirSource};
use crate::sysfs::StdFs;

pub use crate::reads::{HostFs, ReadError, realpath};

/// True for `/dev` and the paths below it: what the guest reaches through devfs.
fn in_dev(path: &str) -> bool {
    path.strip_prefix("/dev")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// True for `/sys` and the paths below it: what the host's `hostfs.read-files` reads.
fn in_sys(path: &str) -> bool {
    path.strip_prefix("/sys")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The guest's view of the host: /dev through the host's devfs (metadata and link targets only,
/// never contents), /sys through the host's `hostfs` (a listing in one call, many files in one
/// call) and the /sys preopen (`std::fs`) for single stats, links and reads.
pub struct Host;

/// One entry of a `hostfs` listing as a [`Node`] and its link target.
fn from_entry(e: raw_hostfs::Entry) -> (Node, Option<String>) {
    (
        Node {
            name: e.name,
            kind: e.kind,
            major: e.major,
            minor: e.minor,
            mode: e.mode,
        },
        e.link_target,
    )
}

impl Host {
    /// `hostfs.list-dir` for /dev and /sys; `std::fs` elsewhere (which reaches nothing: only /sys
    /// is preopened).
    fn listing(dir: &str) -> Result<Vec<(Node, Option<String>)>, String> {
        if in_dev(dir) || in_sys(dir) {
            Ok(raw_hostfs::list_dir(dir)?
                .into_iter()
                .map(from_entry)
                .collect())
        } else {
            StdFs.list_with_targets(dir)
        }
    }
}

impl DirSource for Host {
    fn list(&self, dir: &str) -> Result<Vec<Node>, String> {
        // A /dev listing without link targets is devfs's own: the host reads no link per
        // entry and lowers no target field, where a glob over /dev would drop them unread.
        if in_dev(dir) {
            return Devfs.list(dir);
        }
        Ok(Host::listing(dir)?.into_iter().map(|(n, _)| n).collect())
    }
    fn stat(&self, path: &str) -> Result<Node, String> {
        if in_dev(path) {
            Devfs.stat(path)
        } else {
            StdFs.stat(path)
        }
    }
    fn list_changes(&self, dir: &str, since: u64) -> Result<DirChanges, String> {
        if in_dev(dir) {
            return Devfs.list_changes(dir, since);
        }
        pathglob::whole_listing(self, dir)
    }
}

impl HostFs for Host {
    fn read_link(&self, path: &str) -> Result<String, String> {
        if in_dev(path) {
            Devfs.read_link(path)
        } else {
            StdFs.read_link(path)
        }
    }
    fn read(&self, path: &str) -> Result<String, ReadError> {
        if in_dev(path) {
            Devfs.read(path)
        } else {
            StdFs.read(path)
        }
    }
    fn read_many(&self, paths: &[String]) -> Vec<Result<String, ReadError>> {
        // The /sys paths go to the host in batches of what one call takes, the rest one by one.
        let sys: Vec<String> = paths.iter().filter(|p| in_sys(p)).cloned().collect();
        let mut answers = Vec::with_capacity(sys.len());
        for chunk in sys.chunks(MAX_BATCH) {
            match raw_hostfs::read_files(chunk) {
                Ok(results) => answers.extend(results.into_iter().map(|r| r.map_err(from_wit))),
                Err(why) => answers.extend(
                    chunk
                        .iter()
                        .map(|_| Err(ReadError::Unreadable(why.clone()))),
                ),
            }
        }
        let mut answers = answers.into_iter();
        paths
            .iter()
            .map(|p| {
                if in_sys(p) {
                    answers
                        .next()
                        .unwrap_or_else(|| Err(ReadError::Unreadable(format!("{p}: no answer"))))
                } else {
                    self.read(p)
                }
            })
            .collect()
    }
    fn list_with_targets(&self, dir: &str) -> Result<Vec<(Node, Option<String>)>, String> {
        Host::listing(dir)
    }
}

/// Most paths the host's `read-files` takes in one call.
const MAX_BATCH: usize = 4096;

/// A batched read's error as the SDK's [`ReadError`].
fn from_wit(e: raw_hostfs::ReadError) -> ReadError {
    match e {
        raw_hostfs::ReadError::Missing => ReadError::Missing,
        raw_hostfs::ReadError::Refused => {
            ReadError::Unreadable("refused: not a plain path under /sys".into())
        }
        raw_hostfs::ReadError::NotAFile => ReadError::Unreadable("not a regular file".into()),
        raw_hostfs::ReadError::TooLargeOrBinary => {
            ReadError::Unreadable("larger than 64 KiB or not UTF-8".into())
        }
        raw_hostfs::ReadError::Unreadable => ReadError::Unreadable("unreadable".into()),
    }
}

/// One entry of a [`FakeFs`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Dir,
    File(Result<String, ReadError>),
    Link(String),
    Node {
        kind: NodeKind,
        major: u32,
        minor: u32,
    },
}

/// An in-memory filesystem for unit tests: directories, files (or files that fail to read),
/// symlinks and device nodes by absolute path. Every entry's parent directories exist.
///
/// Why: a scanner's unit tests describe the machine it should see (sysfs attributes and links,
/// /dev nodes) and run the scanner's own logic over it; links are followed by the same
/// [`realpath`] as in the guest, so a test's sysfs layout must be as consistent as the kernel's.
///
/// ```
/// use wdp_guest::hostfs::{FakeFs, HostFs};
///
/// let mut fs = FakeFs::new();
/// fs.file("/sys/devices/pci0000:00/0000:00:02.0/vendor", "0x8086\n")
///     .link("/sys/bus/pci/devices/0000:00:02.0", "../../../devices/pci0000:00/0000:00:02.0")
///     .char_dev("/dev/dri/card0", 226, 0);
/// assert_eq!(fs.read_attr("/sys/bus/pci/devices/0000:00:02.0/vendor").as_deref(), Some("0x8086"));
/// assert!(fs.is_char_device("/dev/dri/card0"));
/// assert_eq!(fs.glob("/dev/dri/*"), ["/dev/dri/card0"]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct FakeFs {
    entries: BTreeMap<String, Entry>,
}

impl FakeFs {
    /// An empty filesystem (only `/`).
    pub fn new() -> Self {
        Self::default()
    }

    fn insert(&mut self, path: &str, entry: Entry) -> &mut Self {
        let mut parent = String::new();
        let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        if let Some((_, dirs)) = comps.split_last() {
            for c in dirs {
                parent = format!("{parent}/{c}");
                self.entries.entry(parent.clone()).or_insert(Entry::Dir);
            }
        }
        self.entries.insert(path.to_string(), entry);
        self
    }

    /// A directory at `path`.
    pub fn dir(&mut self, path: &str) -> &mut Self {
        self.insert(path, Entry::Dir)
    }

    /// A file at `path` with `contents`.
    pub fn file(&mut self, path: &str, contents: &str) -> &mut Self {
        self.insert(path, Entry::File(Ok(contents.to_string())))
    }

    /// A file at `path` whose reading fails with `why`.
    pub fn unreadable(&mut self, path: &str, why: &str) -> &mut Self {
        self.insert(
            path,
            Entry::File(Err(ReadError::Unreadable(why.to_string()))),
        )
    }

    /// A symlink at `path` whose stored target is `target` (relative or absolute).
    pub fn link(&mut self, path: &str, target: &str) -> &mut Self {
        self.insert(path, Entry::Link(target.to_string()))
    }

    /// A character device `major:minor` at `path`.
    pub fn char_dev(&mut self, path: &str, major: u32, minor: u32) -> &mut Self {
        self.insert(
            path,
            Entry::Node {
                kind: NodeKind::CharDevice,
                major,
                minor,
            },
        )
    }

    /// An entry of `kind` at `path` with no device numbers: a directory or an empty file for
    /// those kinds, a node of that kind otherwise (a symlink needs [`FakeFs::link`]).
    pub fn node(&mut self, path: &str, kind: NodeKind) -> &mut Self {
        match kind {
            NodeKind::Directory => self.dir(path),
            NodeKind::File => self.file(path, ""),
            kind => self.insert(
                path,
                Entry::Node {
                    kind,
                    major: 0,
                    minor: 0,
                },
            ),
        }
    }

    /// Removes the entry at `path` and everything below it.
    pub fn remove(&mut self, path: &str) -> &mut Self {
        let below = format!("{path}/");
        self.entries
            .retain(|p, _| p != path && !p.starts_with(&below));
        self
    }

    /// The entry at `path` itself, `/` being a directory.
    fn entry(&self, path: &str) -> Option<&Entry> {
        if path == "/" {
            return Some(&Entry::Dir);
        }
        self.entries.get(path)
    }

    /// The entry `path` names with its parent directories' links followed, and its own path.
    fn lookup(&self, path: &str) -> Option<(String, &Entry)> {
        if let Some(e) = self.entry(path) {
            return Some((path.to_string(), e));
        }
        let (parent, name) = path.rsplit_once('/')?;
        let parent = realpath(self, if parent.is_empty() { "/" } else { parent })?;
        let real = format!("{}/{name}", parent.trim_end_matches('/'));
        self.entry(&real).map(|e| (real, e))
    }
}

fn node_of(name: &str, entry: &Entry) -> Node {
    let (kind, major, minor) = match entry {
        Entry::Dir => (NodeKind::Directory, 0, 0),
        Entry::File(_) => (NodeKind::File, 0, 0),
        Entry::Link(_) => (NodeKind::Symlink, 0, 0),
        Entry::Node { kind, major, minor } => (*kind, *major, *minor),
    };
    Node {
        name: name.to_string(),
        kind,
        major,
        minor,
        mode: 0,
    }
}

impl DirSource for FakeFs {
    fn list(&self, dir: &str) -> Result<Vec<Node>, String> {
        let real = realpath(self, dir).ok_or_else(|| format!("{dir}: not found"))?;
        if self.entry(&real) != Some(&Entry::Dir) {
            return Err(format!("{dir}: not a directory"));
        }
        let prefix = format!("{}/", real.trim_end_matches('/'));
        Ok(self
            .entries
            .iter()
            .filter_map(|(p, e)| {
                let rest = p.strip_prefix(&prefix)?;
                (!rest.contains('/')).then(|| node_of(rest, e))
            })
            .collect())
    }
    fn stat(&self, path: &str) -> Result<Node, String> {
        let name = path.rsplit('/').next().unwrap_or_default();
        self.lookup(path)
            .map(|(_, e)| node_of(name, e))
            .ok_or_else(|| format!("{path}: not found"))
    }
}

impl HostFs for FakeFs {
    fn read_link(&self, path: &str) -> Result<String, String> {
        match self.lookup(path) {
            Some((_, Entry::Link(target))) => Ok(target.clone()),
            Some(_) => Err(format!("{path}: not a symlink")),
            None => Err(format!("{path}: not found")),
        }
    }
    fn read(&self, path: &str) -> Result<String, ReadError> {
        let real = realpath(self, path).ok_or(ReadError::Missing)?;
        match self.entry(&real) {
            Some(Entry::File(contents)) => contents.clone(),
            Some(_) => Err(ReadError::Unreadable(format!("{path}: not a file"))),
            None => Err(ReadError::Missing),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DRM card as sysfs lays it out: class links into the device tree, relative hops up.
    fn sysfs() -> FakeFs {
        let mut fs = FakeFs::new();
        let dev = "/sys/devices/pci0000:00/0000:00:02.0";
        fs.dir(&format!("{dev}/drm/card0"))
            .file(&format!("{dev}/vendor"), " 0x8086\n")
            .link(
                "/sys/class/drm/card0",
                "../../devices/pci0000:00/0000:00:02.0/drm/card0",
            )
            .link(&format!("{dev}/drm/card0/device"), "../../../0000:00:02.0")
            .link(
                &format!("{dev}/iommu_group"),
                "../../../kernel/iommu_groups/7",
            )
            .dir("/sys/kernel/iommu_groups/7")
            .link(&format!("{dev}/driver"), "../../../bus/pci/drivers/i915")
            .link("/sys/out", "/dev/null")
            .char_dev("/dev/null", 1, 3)
            .link("/sys/loop", "loop");
        fs
    }

    #[test]
    fn realpath_follows_relative_and_absolute_links() {
        let fs = sysfs();
        assert_eq!(
            fs.realpath("/sys/class/drm/card0/.."),
            Some("/sys/devices/pci0000:00/0000:00:02.0/drm".into())
        );
        assert_eq!(
            fs.realpath("/sys/class/drm/card0/device/iommu_group"),
            Some("/sys/kernel/iommu_groups/7".into())
        );
        assert_eq!(
            fs.resolve_name("/sys/class/drm/card0/device/iommu_group")
                .as_deref(),
            Some("7")
        );
        assert_eq!(
            fs.realpath("/sys/class/drm/card1"),
            None,
            "a missing component"
        );
        assert_eq!(fs.realpath("/sys/loop"), None, "a link loop ends");
        assert_eq!(fs.realpath("/sys/out"), Some("/dev/null".into()));
        assert_eq!(fs.resolve_sys("/sys/out"), None, "it leaves /sys");
        assert_eq!(
            fs.resolve_sys("/sys/class/drm/card0/device/driver"),
            None,
            "a dangling link does not resolve"
        );
        assert_eq!(
            fs.link_name("/sys/class/drm/card0/device/driver")
                .as_deref(),
            Some("i915")
        );
        assert_eq!(fs.link_name("/sys/class/drm/card0/device/vendor"), None);
    }

    #[test]
    fn reads_follow_links_and_say_why_they_fail() {
        let mut fs = sysfs();
        fs.unreadable("/sys/kernel/debug/x", "permission denied");
        let attr = "/sys/class/drm/card0/device/vendor";
        assert_eq!(fs.read(attr), Ok(" 0x8086\n".into()));
        assert_eq!(fs.read_attr(attr).as_deref(), Some("0x8086"));
        assert_eq!(fs.read("/sys/nope"), Err(ReadError::Missing));
        assert_eq!(
            fs.read("/sys/kernel/debug/x"),
            Err(ReadError::Unreadable("permission denied".into()))
        );
        assert!(matches!(
            fs.read("/sys/kernel"),
            Err(ReadError::Unreadable(_))
        ));
        assert_eq!(fs.read_attr("/sys/kernel/debug/x"), None);
    }

    #[test]
    fn listing_stat_and_globs_see_through_parent_links() {
        let mut fs = sysfs();
        assert_eq!(
            fs.names("/sys/class/drm/card0/device"),
            ["driver", "drm", "iommu_group", "vendor"]
        );
        assert!(fs.names("/sys/nope").is_empty());
        assert!(fs.names("/sys/class/drm/card0/device/vendor").is_empty());
        assert_eq!(
            fs.stat("/sys/class/drm/card0").map(|n| n.kind),
            Ok(NodeKind::Symlink),
            "a final link is not followed"
        );
        assert_eq!(
            fs.stat("/sys/class/drm/card0/device/vendor")
                .map(|n| n.kind),
            Ok(NodeKind::File)
        );
        assert_eq!(
            fs.glob("/sys/class/drm/*/device/v*"),
            ["/sys/class/drm/card0/device/vendor"]
        );
        assert!(fs.is_char_device("/dev/null") && !fs.is_char_device("/sys/out"));
        assert!(fs.exists("/sys/out") && !fs.exists("/dev/zero"));
        fs.remove("/sys/devices");
        assert!(fs.glob("/sys/class/drm/*/device/v*").is_empty());
        assert!(fs.exists("/sys/class/drm/card0"), "the link itself stays");
        assert!(!fs.exists("/sys/devices/pci0000:00"));
    }

    #[test]
    fn batched_reads_and_listings_answer_as_single_ones() {
        let mut fs = sysfs();
        fs.unreadable("/sys/kernel/debug/x", "permission denied");
        let paths = [
            "/sys/class/drm/card0/device/vendor",
            "/sys/nope",
            "/sys/kernel/debug/x",
        ]
        .map(String::from);
        let one: Vec<_> = paths.iter().map(|p| fs.read(p)).collect();
        assert_eq!(fs.read_many(&paths), one);
        assert_eq!(
            fs.read_attrs(&paths),
            [Some("0x8086".to_string()), None, None]
        );
        let listed = fs.list_with_targets("/sys/class/drm").unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].0.kind, NodeKind::Symlink);
        assert_eq!(
            listed[0].1,
            fs.read_link("/sys/class/drm/card0").ok(),
            "the target read_link gives"
        );
    }

    #[test]
    fn host_sends_dev_to_devfs_and_the_rest_to_std_fs() {
        assert!(in_dev("/dev") && in_dev("/dev/") && in_dev("/dev/dri/card0"));
        assert!(!in_dev("/devices") && !in_dev("/sys/dev") && !in_dev("/"));
        assert!(in_sys("/sys") && in_sys("/sys/class") && !in_sys("/system") && !in_sys("/"));
    }
}
