//! NUMA affinity of device nodes, derived from sysfs the way Intel's framework does it.
//!
//! kubelet's Topology Manager can only align a device with the CPUs and memory of a pod if the
//! plugin says which NUMA node the device hangs off. Guests rarely know (and should not have to
//! walk sysfs for it), so where a device's `numa-nodes` is none the host derives it from the
//! device's nodes: `stat` the node in the dev root for its `major:minor`, resolve
//! `<sys>/dev/{char,block}/MAJ:MIN` into `<sys>/devices/...`, and walk up from there to the first
//! directory with a `numa_node` or `local_cpulist` hint (Intel's `pkg/topology`). A VFIO group
//! node stands for the PCI functions of its IOMMU group, so those are asked instead.
//!
//! Intel's rules are kept: one node whose affinity cannot be read (missing, not a device node, a
//! virtual device with major 0) leaves the whole device without topology; `numa_node` -1 means
//! "no affinity"; a NUMA value with no CPUs here or in the parent is a socket number, not a NUMA
//! node, and is dropped. Only the first hint-bearing directory counts.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::hostfs::sys::{SysDir, SysReads};
use crate::hostfs::{DevFs, NodeKind};
use crate::tree::DeviceTree;

/// Reads NUMA affinity below one sys root.
#[derive(Debug)]
pub struct Topology {
    /// Every sysfs read goes through here (the sys root on disk, or recorded for a snapshot).
    reads: Arc<dyn SysReads>,
    /// Answers by device number, reused while `<sys>/dev/{class}/MAJ:MIN` still points where it
    /// did: a guest notifies its whole tree on every change, and walking sysfs again for every
    /// unchanged node cost 40 ms per 10,000 nodes. A number reused by another device (a hot
    /// swap) has another sysfs path, so the link check catches it.
    known: Mutex<HashMap<DeviceNumber, (PathBuf, BTreeSet<u32>)>>,
}

/// Answers about device nodes kept between calls of [`Topology::fill_remembering`] by whoever
/// knows when a node changes (the validation stage, which watches the dev root).
pub trait NumaMemo {
    /// The answer for the node at guest path `path`, if one is remembered: `Some(None)` when the
    /// node has no readable affinity.
    fn recall(&self, path: &str) -> Option<&Option<BTreeSet<u32>>>;

    /// The answer just looked up for the node at `path` (not a symlink).
    fn remember(&mut self, path: &str, numa: &Option<BTreeSet<u32>>);
}

/// Remembers nothing: every call looks every node up.
struct Forgetful;

impl NumaMemo for Forgetful {
    fn recall(&self, _: &str) -> Option<&Option<BTreeSet<u32>>> {
        None
    }

    fn remember(&mut self, _: &str, _: &Option<BTreeSet<u32>>) {}
}

/// `(class, major, minor)`: what `<sys>/dev/{class}/MAJ:MIN` is keyed by.
type DeviceNumber = (&'static str, u32, u32);

/// Beyond this many remembered device numbers the cache starts again: a bound for a guest that
/// names ever-new nodes, far above any real node's device count.
const MAX_KNOWN: usize = 1 << 16;

/// Why a node has no readable affinity; any one of these leaves the device without topology.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("{path}: {cause}")]
    /// The node could not be described.
    Node {
        /// The path concerned.
        path: String,
        /// Why, in words.
        cause: String,
    },
    #[error("{path} is not a character or block device")]
    /// Not a device node.
    NotADevice {
        /// The path concerned.
        path: String,
    },
    #[error("{path} is a virtual device node (major 0)")]
    /// A virtual device (major 0).
    Virtual {
        /// The path concerned.
        path: String,
    },
    #[error("{link}: {cause}")]
    /// The sysfs link could not be read.
    Sysfs {
        /// The sysfs link that was read.
        link: PathBuf,
        /// Why, in words.
        cause: String,
    },
    #[error("{file}: {value:?} is not a NUMA node id")]
    /// `numa_node` holds something else than a node id.
    BadNumaNode {
        /// The file that was read.
        file: PathBuf,
        /// The offending value, as given.
        value: String,
    },
}

impl Topology {
    /// Affinity read from `sys_root` (normally `/sys`).
    pub fn new(sys_root: &Path) -> Self {
        Topology::over(Arc::new(SysDir::new(sys_root)))
    }

    /// Affinity read through `reads`.
    pub fn over(reads: Arc<dyn SysReads>) -> Self {
        Topology {
            reads,
            known: Mutex::default(),
        }
    }

    /// The sys root, canonical.
    fn sys(&self) -> &Path {
        self.reads.root()
    }

    /// Sets `numa_nodes` on every device that has none and at least one node whose affinity is
    /// known. Lookups are shared within one call: a node many devices share (a KubeVirt-style
    /// slot device) is resolved once.
    pub fn fill(&self, tree: &mut DeviceTree, dev: &DevFs) {
        self.fill_remembering(tree, dev, &mut Forgetful);
    }

    /// [`Topology::fill`], asking `memo` first: a node it has an answer for is not looked up, and
    /// every node looked up (that is not a symlink, whose target may change elsewhere) is handed
    /// to it. A tree that differs from the last one by one device then costs one lookup.
    pub fn fill_remembering(&self, tree: &mut DeviceTree, dev: &DevFs, memo: &mut dyn NumaMemo) {
        let wanted = tree
            .0
            .values()
            .flat_map(|g| g.values())
            .filter(|info| info.numa_nodes.is_none())
            .flat_map(|info| info.nodes.iter().map(|n| n.host_path.as_str()))
            .filter(|path| memo.recall(path).is_none());
        // Grouped by directory, so each directory is opened once for all its nodes.
        let mut by_dir: HashMap<&str, Vec<&str>> = HashMap::new();
        for path in wanted {
            let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
            by_dir.entry(dir).or_default().push(name);
        }
        let mut looked_up: HashMap<String, Option<BTreeSet<u32>>> = HashMap::new();
        for (dir, mut names) in by_dir {
            names.sort_unstable();
            names.dedup();
            for (name, node) in names.iter().zip(dev.stat_in(dir, &names)) {
                let path = format!("{dir}/{name}");
                let plain = node.as_ref().is_ok_and(|n| n.kind != NodeKind::Symlink);
                let numa = node
                    .map_err(|e| TopologyError::Node {
                        path: path.clone(),
                        cause: e.to_string(),
                    })
                    .and_then(|node| self.numa_of(&path, node, dev));
                let numa = match numa {
                    Ok(ids) => Some(ids),
                    Err(e) => {
                        tracing::debug!(node = %path, error = %e, "no NUMA affinity for this node");
                        None
                    }
                };
                if plain {
                    memo.remember(&path, &numa);
                }
                looked_up.insert(path, numa);
            }
        }
        for group in tree.0.values_mut() {
            let found: Vec<(String, BTreeSet<u32>)> = group
                .iter()
                .filter(|(_, info)| info.numa_nodes.is_none() && !info.nodes.is_empty())
                .filter_map(|(id, info)| {
                    let mut numa = BTreeSet::new();
                    for node in &info.nodes {
                        let path = node.host_path.as_str();
                        // Most nodes are remembered (what was looked up above is remembered
                        // too, when it may be): the memo first.
                        match memo.recall(path).or_else(|| looked_up.get(path)) {
                            Some(Some(ids)) => numa.extend(ids.iter().copied()),
                            _ => return None,
                        }
                    }
                    (!numa.is_empty()).then(|| (id.clone(), numa))
                })
                .collect();
            // Only the devices given an affinity are copied out of what the group shares.
            for (id, numa) in found {
                if let Some(info) = group.get_mut(&id) {
                    info.numa_nodes = Some(numa.into_iter().collect());
                }
            }
        }
    }

    /// The NUMA nodes of one device node (guest path under /dev); empty when sysfs gives no hint.
    pub fn node_numa(&self, path: &str, dev: &DevFs) -> Result<BTreeSet<u32>, TopologyError> {
        let node_error = |e: crate::hostfs::DevfsError| TopologyError::Node {
            path: path.into(),
            cause: e.to_string(),
        };
        let node = dev.stat(path).map_err(node_error)?;
        self.numa_of(path, node, dev)
    }

    /// The NUMA nodes of the node at `path`, described (unfollowed) by `node`.
    fn numa_of(
        &self,
        path: &str,
        mut node: crate::hostfs::Node,
        dev: &DevFs,
    ) -> Result<BTreeSet<u32>, TopologyError> {
        // Most nodes are not links: the plain stat answered without the confined open that
        // following a link beneath the dev root costs.
        if node.kind == NodeKind::Symlink {
            node = dev.stat_following(path).map_err(|e| TopologyError::Node {
                path: path.into(),
                cause: e.to_string(),
            })?;
        }
        let class = match node.kind {
            NodeKind::CharDevice => "char",
            NodeKind::BlockDevice => "block",
            _ => return Err(TopologyError::NotADevice { path: path.into() }),
        };
        if node.major == 0 {
            return Err(TopologyError::Virtual { path: path.into() });
        }
        let name = format!("{}:{}", node.major, node.minor);
        let link = self.sys().join("dev").join(class).join(&name);
        let sysfs_error = |e: &std::io::Error| TopologyError::Sysfs {
            link: link.clone(),
            cause: e.to_string(),
        };
        let target = self.reads.read_link(&link).map_err(|e| sysfs_error(&e))?;
        let number = (class, node.major, node.minor);
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, numa)) = known.get(&number)
            && *seen == target
        {
            return Ok(numa.clone());
        }
        drop(known);
        let device = self
            .reads
            .canonicalize(&link)
            .map_err(|e| sysfs_error(&e))?;
        // A VFIO group node is a virtual device; its affinity is that of the group's functions.
        let vfio = self.sys().join("devices/virtual/vfio");
        if device.parent() == Some(vfio.as_path()) {
            let group = device.file_name().unwrap_or_default();
            let members = self
                .sys()
                .join("kernel/iommu_groups")
                .join(group)
                .join("devices");
            let mut numa = BTreeSet::new();
            for entry in self.reads.read_dir(&members).into_iter().flatten() {
                if let Ok(function) = self.reads.canonicalize(&entry) {
                    numa.extend(self.walk_up(&function)?);
                }
            }
            // Not remembered: a group's members change without its node changing.
            return Ok(numa);
        }
        let numa = self.walk_up(&device)?;
        known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= MAX_KNOWN {
            known.clear();
        }
        known.insert(number, (target, numa.clone()));
        Ok(numa)
    }

    /// The first hint from `dir` upwards, staying inside `<sys>/devices`.
    fn walk_up(&self, dir: &Path) -> Result<BTreeSet<u32>, TopologyError> {
        let top = self.sys().join("devices");
        let mut here = Some(dir);
        while let Some(d) = here.filter(|d| d.starts_with(&top) && *d != top) {
            let numa = self.read_numa(&d.join("numa_node"))?;
            let cpus = self.read_trimmed(&d.join("local_cpulist"));
            if numa.is_none() && cpus.is_empty() {
                here = d.parent();
                continue;
            }
            let Some(numa) = numa else {
                // CPUs without a NUMA node: a hint kubelet cannot use, and the first one wins.
                return Ok(BTreeSet::new());
            };
            let cpus_nearby = !cpus.is_empty()
                || d.parent()
                    .is_some_and(|p| !self.read_trimmed(&p.join("local_cpulist")).is_empty());
            // A NUMA value with no CPUs near it is a socket id, not a NUMA node.
            return Ok(if cpus_nearby {
                BTreeSet::from([numa])
            } else {
                BTreeSet::new()
            });
        }
        Ok(BTreeSet::new())
    }

    /// `numa_node`: None when missing, empty or -1 ("no affinity"); an error for anything else
    /// that is not a node id.
    fn read_numa(&self, file: &Path) -> Result<Option<u32>, TopologyError> {
        let value = self.read_trimmed(file);
        if value.is_empty() || value == "-1" {
            return Ok(None);
        }
        value
            .parse::<u32>()
            .map(Some)
            .map_err(|_| TopologyError::BadNumaNode {
                file: file.to_path_buf(),
                value,
            })
    }

    fn read_trimmed(&self, file: &Path) -> String {
        self.reads
            .read_to_string(file)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{DeviceInfo, DeviceSpec};
    use std::os::unix::fs::symlink;

    struct Roots {
        _dir: tempfile::TempDir,
        sys: PathBuf,
        dev: DevFs,
    }

    /// A sys root with a two-socket PCI layout and a dev root with nodes of the given numbers
    /// (regular files stand in for devices here; the fixture tests use real `mknod` nodes).
    fn roots() -> Roots {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        let dev = dir.path().join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        let write = |rel: &str, v: &str| {
            let p = sys.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        };
        write("devices/pci0000:00/0000:00:02.0/numa_node", "0\n");
        write("devices/pci0000:00/0000:00:02.0/local_cpulist", "0-3\n");
        std::fs::create_dir_all(sys.join("devices/pci0000:00/0000:00:02.0/drm/card0")).unwrap();
        write("devices/pci0000:80/0000:80:01.0/numa_node", "1\n");
        write("devices/pci0000:80/0000:80:01.0/local_cpulist", "4-7\n");
        write("devices/pci0000:80/0000:80:01.1/numa_node", "-1\n");
        std::fs::create_dir_all(sys.join("devices/virtual/vfio/12")).unwrap();
        std::fs::create_dir_all(sys.join("kernel/iommu_groups/12/devices")).unwrap();
        symlink(
            "../../../../devices/pci0000:80/0000:80:01.0",
            sys.join("kernel/iommu_groups/12/devices/0000:80:01.0"),
        )
        .unwrap();
        std::fs::create_dir_all(sys.join("dev/char")).unwrap();
        for (numbers, target) in [
            ("226:0", "../../devices/pci0000:00/0000:00:02.0/drm/card0"),
            ("243:12", "../../devices/virtual/vfio/12"),
            ("10:1", "../../devices/pci0000:80/0000:80:01.1"),
        ] {
            symlink(target, sys.join("dev/char").join(numbers)).unwrap();
        }
        let dev = DevFs::open(&dev).unwrap();
        Roots {
            _dir: dir,
            sys,
            dev,
        }
    }

    #[test]
    fn regular_files_have_no_affinity() {
        let r = roots();
        std::fs::write(r.dev.root_path().join("plain"), "").unwrap();
        let t = Topology::new(&r.sys);
        assert!(matches!(
            t.node_numa("/dev/plain", &r.dev),
            Err(TopologyError::NotADevice { .. })
        ));
        assert!(matches!(
            t.node_numa("/dev/missing", &r.dev),
            Err(TopologyError::Node { .. })
        ));
    }

    #[test]
    fn walk_stops_at_first_hint_and_drops_sockets() {
        let r = roots();
        let t = Topology::new(&r.sys);
        let card = r.sys.join("devices/pci0000:00/0000:00:02.0/drm/card0");
        let card = std::fs::canonicalize(card).unwrap();
        assert_eq!(t.walk_up(&card).unwrap(), BTreeSet::from([0]));
        let minus_one = std::fs::canonicalize(r.sys.join("devices/pci0000:80/0000:80:01.1"));
        assert!(t.walk_up(&minus_one.unwrap()).unwrap().is_empty());
        // A NUMA value with no CPUs here or above is a socket.
        let socket = r.sys.join("devices/platform/x");
        std::fs::create_dir_all(&socket).unwrap();
        std::fs::write(socket.join("numa_node"), "3").unwrap();
        let socket = std::fs::canonicalize(socket).unwrap();
        assert!(t.walk_up(&socket).unwrap().is_empty());
        std::fs::write(r.sys.join("devices/platform/x/numa_node"), "x").unwrap();
        assert!(matches!(
            t.walk_up(&socket),
            Err(TopologyError::BadNumaNode { .. })
        ));
    }

    #[test]
    fn devices_without_numa_get_it_and_others_are_kept() {
        let r = roots();
        let t = Topology::new(&r.sys);
        let spec = |p: &str| DeviceSpec {
            container_path: p.into(),
            host_path: p.into(),
            permissions: "rw".into(),
        };
        let info = |paths: &[&str], numa: Option<Vec<u32>>| DeviceInfo {
            nodes: paths.iter().map(|p| spec(p)).collect(),
            numa_nodes: numa,
            ..DeviceInfo::default()
        };
        let mut tree = DeviceTree::default();
        let group = tree.0.entry("t".into()).or_default();
        group.insert("none".into(), info(&[], None));
        group.insert("given".into(), info(&["/dev/missing"], Some(vec![5])));
        group.insert("missing".into(), info(&["/dev/missing"], None));
        t.fill(&mut tree, &r.dev);
        let g = &tree.0["t"];
        assert_eq!(g["none"].numa_nodes, None);
        assert_eq!(
            g["given"].numa_nodes,
            Some(vec![5]),
            "a guest's answer is kept"
        );
        assert_eq!(g["missing"].numa_nodes, None);
    }

    #[test]
    fn remembered_answers_follow_a_reused_device_number() {
        let r = roots();
        let node = r.dev.root_path().join("card0");
        crate::testing::char_device(&node, 226, 0, 0o600).expect("mknod (tests run as root)");
        let t = Topology::new(&r.sys);
        assert_eq!(t.node_numa("/dev/card0", &r.dev), Ok(BTreeSet::from([0])));
        // Another device now owns 226:0: the link moved, so the answer must too.
        let link = r.sys.join("dev/char/226:0");
        std::fs::remove_file(&link).unwrap();
        symlink("../../devices/pci0000:80/0000:80:01.0", &link).unwrap();
        assert_eq!(t.node_numa("/dev/card0", &r.dev), Ok(BTreeSet::from([1])));
        std::fs::remove_file(&link).unwrap();
        assert!(matches!(
            t.node_numa("/dev/card0", &r.dev),
            Err(TopologyError::Sysfs { .. })
        ));
    }
}
