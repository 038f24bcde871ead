//! The validation stage of the data path: what a notified tree goes through before anything
//! serves it.
//!
//! A guest's tree leaves the sandbox as the guest wrote it. [`Validator::check`] applies the
//! scanner's policy (structure rules, caps, nodes that exist, allowed mounts), fills in NUMA
//! affinity the guest did not give, counts accepted and refused trees, and logs refusals at most
//! once a second. The supervisor ([`crate::scanner`]) calls it from the sink it gives the sandbox.
//!
//! A guest notifies its whole tree on every change, so the work on the dev root is kept
//! proportional to what changed: what the last trees established about each node (it exists, its
//! NUMA answer) is remembered while an inotify watch on the node's directory and every directory
//! above it, up to the dev root, reports no change of its entry. One node added among 10,000
//! costs one lookup, not 10,000. What sysfs says about a node is taken to change only with the
//! node: the kernel removes and recreates a device's node (devtmpfs) whenever it removes or adds
//! the device, and a node recreated under the same name is a new entry the watch reports.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
use rustc_hash::FxHashMap;

use crate::bindings::types as wit;
use crate::hostfs::DevFs;
use crate::metrics::ScannerMetrics;
use crate::policy::Policy;
use crate::topology::{NumaMemo, Topology};
use crate::tree::charge::Budget;
use crate::tree::{DeviceTree, Health, OutputError};

/// One scanner's validation: its rules, its counters and its refusal log.
pub struct Validator {
    name: Arc<str>,
    policy: Arc<Policy>,
    metrics: Arc<ScannerMetrics>,
    devfs: Arc<DevFs>,
    topology: Arc<Topology>,
    /// What is known about nodes since the last trees; `None` until a tree is large enough to
    /// need it (an inotify instance per small scanner would be spent for nothing: the system
    /// allows few per user), and where the dev root cannot be watched (then every tree is
    /// looked up whole).
    memo: Option<NodeMemo>,
    /// Whether a memo was tried (and not to be tried again).
    memo_tried: bool,
    /// When a refused tree was last logged, and how many were not logged since.
    refusals_logged: Option<Instant>,
    refusals_unlogged: u64,
    /// The guest's memory limit, which a tree's host form may not exceed ([`crate::footprint`]).
    memory: usize,
}

impl Validator {
    /// Validation of scanner `name`'s trees by `policy` against the nodes of `devfs`, NUMA
    /// affinity from `topology`, counted in `metrics`.
    pub fn new(
        name: Arc<str>,
        policy: Arc<Policy>,
        metrics: Arc<ScannerMetrics>,
        devfs: Arc<DevFs>,
        topology: Arc<Topology>,
    ) -> Self {
        Validator {
            name,
            policy,
            metrics,
            devfs,
            topology,
            memo: None,
            memo_tried: false,
            refusals_logged: None,
            refusals_unlogged: 0,
            memory: usize::MAX,
        }
    }

    /// Charges each form of a tree the host keeps against `memory`, the guest's memory limit: a
    /// tree whose lifted form (as the sandbox charged it while lifting it) is larger is refused
    /// before anything is made of it, and one whose validated form would be larger is refused
    /// as that is built, so no form the host keeps of a guest's tree is larger than the memory
    /// the guest was given ([`crate::footprint`]).
    pub fn charging(mut self, memory: usize) -> Self {
        self.memory = memory;
        self
    }

    /// One notified tree: the tree to serve, or why it is refused as a whole (the last good tree
    /// stays served).
    pub fn check(&mut self, tree: wit::DeviceTree) -> Result<DeviceTree, OutputError> {
        self.check_with_attributes(tree, Vec::new())
    }

    /// [`Validator::check`] of a tree notified with typed attributes for its devices: they are
    /// validated with it and kept on its devices.
    pub fn check_with_attributes(
        &mut self,
        tree: wit::DeviceTree,
        attributes: Vec<wit::DeviceAttributes>,
    ) -> Result<DeviceTree, OutputError> {
        let bytes = crate::footprint::lifted_bytes(&tree, &attributes);
        self.check_lifted(tree, attributes, bytes)
    }

    /// [`Validator::check_with_attributes`] of a tree whose host form was charged at `bytes` as
    /// it was lifted out of the guest (`sandbox::lift`): the tree is not walked again to count
    /// it.
    pub fn check_lifted(
        &mut self,
        tree: wit::DeviceTree,
        attributes: Vec<wit::DeviceAttributes>,
        bytes: usize,
    ) -> Result<DeviceTree, OutputError> {
        if bytes > self.memory {
            let e = OutputError::TreeHostMemory {
                bytes,
                max: self.memory,
                form: "lifted",
            };
            drop((tree, attributes));
            ScannerMetrics::bump(&self.metrics.trees_refused);
            self.log_refusal(&e);
            return Err(e);
        }
        let metrics = &self.metrics;
        if !self.memo_tried && node_count(&tree) >= MEMO_FROM {
            self.memo_tried = true;
            self.memo = NodeMemo::new(self.devfs.root_path().to_path_buf());
        }
        if let Some(memo) = &mut self.memo {
            memo.catch_up();
            memo.watch_for(&tree);
        }
        let memo = &self.memo;
        let known = |path: &str| memo.as_ref().is_some_and(|m| m.exists(path));
        let mut budget = Budget::new(self.memory);
        let checked =
            self.policy
                .check_tree_charged(tree, attributes, &self.devfs, &known, &mut budget);
        match checked {
            Ok(mut tree) => {
                match &mut self.memo {
                    Some(memo) => {
                        memo.existing(&tree);
                        self.topology.fill_remembering(&mut tree, &self.devfs, memo);
                    }
                    None => self.topology.fill(&mut tree, &self.devfs),
                }
                ScannerMetrics::bump(&metrics.trees_accepted);
                Ok(tree)
            }
            Err(e) => {
                ScannerMetrics::bump(&metrics.trees_refused);
                self.log_refusal(&e);
                Err(e)
            }
        }
    }

    /// One event per refused tree, but at most one a second: a guest that floods bad trees must
    /// not flood the log. The counter sees every one.
    fn log_refusal(&mut self, e: &OutputError) {
        let now = Instant::now();
        if self
            .refusals_logged
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            tracing::warn!(
                scanner = &*self.name,
                rule = e.rule(),
                error = %e,
                not_logged_since_last = self.refusals_unlogged,
                "device tree refused; the last good tree stays served"
            );
            self.refusals_logged = Some(now);
            self.refusals_unlogged = 0;
        } else {
            self.refusals_unlogged += 1;
        }
    }
}

/// From this many nodes in one tree on, what is known about them is kept between trees: below
/// it, looking the whole tree up costs well under a millisecond.
const MEMO_FROM: usize = 256;

/// How many device nodes `tree` names.
fn node_count(tree: &wit::DeviceTree) -> usize {
    tree.iter()
        .flat_map(|g| &g.devices)
        .map(|d| d.info.nodes.len())
        .sum()
}

/// What validation established about device nodes (by guest path), kept while inotify reports
/// no change of the node's entry or of a directory above it.
///
/// A watch is placed before the lookup whose answer is kept, so a change after the lookup is
/// always reported; a change between the watch and the lookup only costs a lookup more. Events
/// are read (without waiting) at the start of every tree. A lost event (queue overflow), a
/// directory moved, removed or replaced, or an unreadable queue forgets what it may concern.
struct NodeMemo {
    inotify: Inotify,
    /// The dev root on disk: guest path `/dev/x` is `root/x`.
    root: PathBuf,
    /// Watched directories (guest paths) by watch; `watched` the other way. `None` in `watched`:
    /// the directory could not be watched for this tree (it is tried again on the next).
    dirs: HashMap<WatchDescriptor, String>,
    watched: FxHashMap<String, Option<WatchDescriptor>>,
    /// By guest path; Fx rather than SipHash: a 10,000-node tree asks a few lookups per node,
    /// and the paths are the guest's own (a guest that collides them slows only itself).
    nodes: FxHashMap<String, Known>,
}

/// What is known of one node.
#[derive(Debug, Default)]
struct Known {
    /// The node-exists rule passed for it.
    exists: bool,
    /// Its NUMA answer, once looked up.
    numa: Option<Option<BTreeSet<u32>>>,
}

/// Entry changes that can change what a node is: not attributes (mode, owner), which neither
/// the node-exists rule nor the NUMA lookup reads.
const MEMO_MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::DONT_FOLLOW)
    .union(WatchMask::ONLYDIR);

/// Beyond this many remembered nodes the memo starts again: a bound for a guest that names
/// ever-new nodes.
const MAX_NODES: usize = 1 << 17;

impl NodeMemo {
    fn new(root: PathBuf) -> Option<Self> {
        let inotify = Inotify::init().ok()?;
        let mut memo = NodeMemo {
            inotify,
            root,
            dirs: HashMap::new(),
            watched: FxHashMap::default(),
            nodes: FxHashMap::default(),
        };
        // A root that cannot be watched (a snapshot's table, no inotify): no memo at all.
        memo.watch_dir("/dev")?;
        Some(memo)
    }

    /// Forgets what the events since the last tree may concern.
    fn catch_up(&mut self) {
        // Directories that failed last time are tried again.
        self.watched.retain(|_, wd| wd.is_some());
        let mut buffer = [0u8; 16 * 1024];
        loop {
            let events: Vec<(WatchDescriptor, EventMask, Option<String>)> =
                match self.inotify.read_events(&mut buffer) {
                    Ok(events) => events
                        .map(|e| {
                            let name = e.name.map(|n| n.to_string_lossy().into_owned());
                            (e.wd, e.mask, name)
                        })
                        .collect(),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                    Err(_) => {
                        self.forget_under("/dev");
                        return;
                    }
                };
            if events.is_empty() {
                return;
            }
            for (wd, mask, name) in events {
                if mask.contains(EventMask::Q_OVERFLOW) {
                    self.forget_under("/dev");
                    continue;
                }
                let Some(dir) = self.dirs.get(&wd).cloned() else {
                    continue;
                };
                match name {
                    Some(name) if !mask.contains(EventMask::ISDIR) => {
                        self.nodes.remove(&format!("{dir}/{name}"));
                    }
                    Some(name) => self.forget_under(&format!("{dir}/{name}")),
                    // The directory itself moved, went, or its watch did.
                    None => self.forget_under(&dir),
                }
            }
        }
    }

    /// Forgets the nodes at and below guest path `top` and drops the watches there.
    fn forget_under(&mut self, top: &str) {
        let under = |p: &str| {
            p.strip_prefix(top)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        };
        self.nodes.retain(|p, _| !under(p));
        let gone: Vec<String> = self.watched.keys().filter(|d| under(d)).cloned().collect();
        for dir in gone {
            if let Some(Some(wd)) = self.watched.remove(&dir) {
                self.dirs.remove(&wd);
                // Already gone when the directory is: nothing to undo then.
                let _ = self.inotify.watches().remove(wd);
            }
        }
    }

    /// Watches guest directory `dir` (once); `None` when it cannot be.
    fn watch_dir(&mut self, dir: &str) -> Option<()> {
        if let Some(wd) = self.watched.get(dir) {
            return wd.as_ref().map(|_| ());
        }
        let on_disk = match dir.strip_prefix("/dev") {
            Some("") => self.root.clone(),
            Some(rest) => self.root.join(rest.strip_prefix('/')?),
            None => return None,
        };
        let wd = self.inotify.watches().add(&on_disk, MEMO_MASK).ok();
        if let Some(wd) = &wd {
            self.dirs.insert(wd.clone(), dir.to_string());
        }
        self.watched.insert(dir.to_string(), wd.clone());
        wd.map(|_| ())
    }

    /// Watches the directories of `path` from the dev root down; true when all are watched, so
    /// what is learnt about `path` may be kept. Only plain paths qualify (`/dev/a/b`: no `.`,
    /// `..` or empty components, which name an entry through another directory).
    fn watch_path(&mut self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix("/dev/") else {
            return false;
        };
        if rest
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return false;
        }
        let mut end = "/dev".len();
        loop {
            if self.watch_dir(&path[..end]).is_none() {
                return false;
            }
            match path[end + 1..].find('/') {
                Some(i) => end += 1 + i,
                None => return true,
            }
        }
    }

    /// Whether what is learnt about `path` may be kept: its directories are all watched.
    fn keeps(&self, path: &str) -> bool {
        let Some(dir) = path.rsplit_once('/').map(|(dir, _)| dir) else {
            return false;
        };
        // `watch_path` watched every ancestor before the leaf directory, so the leaf answers.
        matches!(self.watched.get(dir), Some(Some(_)))
            && path.strip_prefix("/dev/").is_some_and(|rest| {
                !rest
                    .split('/')
                    .any(|c| c.is_empty() || c == "." || c == "..")
            })
    }

    /// Watches, before anything is looked up, the directories of every node of `tree` not
    /// already known.
    fn watch_for(&mut self, tree: &wit::DeviceTree) {
        if self.nodes.len() > MAX_NODES {
            self.nodes.clear();
        }
        for group in tree {
            for device in &group.devices {
                for node in &device.info.nodes {
                    let path = node.host_path.as_str();
                    let known = self
                        .nodes
                        .get(path)
                        .is_some_and(|k| k.exists && k.numa.is_some());
                    if !known {
                        self.watch_path(path);
                    }
                }
            }
        }
    }

    /// Whether `path` passed the node-exists rule and has not changed since.
    fn exists(&self, path: &str) -> bool {
        self.nodes.get(path).is_some_and(|k| k.exists)
    }

    /// Notes the nodes that `tree` (just accepted) was checked to have.
    fn existing(&mut self, tree: &DeviceTree) {
        for info in tree.0.values().flat_map(|g| g.values()) {
            if info.health == Health::Unhealthy {
                continue;
            }
            for node in &info.nodes {
                let path = node.host_path.as_str();
                if self.exists(path) || !self.keeps(path) {
                    continue;
                }
                self.nodes.entry(path.to_string()).or_default().exists = true;
            }
        }
    }
}

impl NumaMemo for NodeMemo {
    fn recall(&self, path: &str) -> Option<&Option<BTreeSet<u32>>> {
        self.nodes.get(path).and_then(|k| k.numa.as_ref())
    }

    fn remember(&mut self, path: &str, numa: &Option<BTreeSet<u32>>) {
        if self.keeps(path) {
            self.nodes.entry(path.to_string()).or_default().numa = Some(numa.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    fn mknod(path: &Path, minor: u32) {
        crate::testing::char_device(path, 226, minor, 0o600).expect("mknod (tests run as root)");
    }

    /// `n` devices `d<i>`, each with node `/dev/bulk/n<i>`.
    fn tree(n: u32) -> wit::DeviceTree {
        let devices = (0..n)
            .map(|i| wit::Device {
                id: format!("d{i}"),
                info: wit::DeviceInfo {
                    health: wit::Health::Healthy,
                    nodes: vec![wit::DeviceSpec {
                        container_path: format!("/dev/n{i}"),
                        host_path: format!("/dev/bulk/n{i}"),
                        permissions: "rw".into(),
                    }],
                    mounts: vec![],
                    envs: vec![],
                    annotations: vec![],
                    numa_nodes: None,
                    cdi_devices: vec![],
                },
            })
            .collect();
        vec![wit::DeviceGroup {
            dev_type: "bulk".into(),
            devices,
        }]
    }

    fn numa_of_first(tree: &DeviceTree) -> Option<Vec<u32>> {
        tree.0["bulk"]["d0"].numa_nodes.clone()
    }

    /// Answers are kept for unchanged nodes (a sysfs change alone is not looked at again) and
    /// dropped for a node whose entry changed: recreated, it is looked up again; removed, the
    /// node-exists rule refuses the tree, as without the memo.
    #[test]
    fn kept_answers_follow_changes_of_the_dev_root() {
        let dir = tempfile::tempdir().unwrap();
        let (dev, sys) = (dir.path().join("dev"), dir.path().join("sys"));
        std::fs::create_dir_all(dev.join("bulk")).unwrap();
        let n = MEMO_FROM as u32 + 10;
        for i in 0..n {
            mknod(&dev.join(format!("bulk/n{i}")), i);
        }
        for (node, numa) in [
            ("pci0000:00/0000:00:02.0", "0"),
            ("pci0000:80/0000:80:01.0", "1"),
        ] {
            let d = sys.join("devices").join(node);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("numa_node"), numa).unwrap();
            std::fs::write(d.join("local_cpulist"), "0-3").unwrap();
        }
        std::fs::create_dir_all(sys.join("dev/char")).unwrap();
        let link = sys.join("dev/char/226:0");
        symlink("../../devices/pci0000:00/0000:00:02.0", &link).unwrap();
        let devfs = Arc::new(DevFs::open(&dev).unwrap());
        let mut v = Validator::new(
            "bulk".into(),
            Arc::new(Policy::default()),
            Arc::default(),
            devfs,
            Arc::new(Topology::new(&sys)),
        );
        assert_eq!(numa_of_first(&v.check(tree(n)).unwrap()), Some(vec![0]));
        assert!(v.memo.is_some(), "a tree this large is remembered");

        // The link moves, the node stays: the kept answer stands.
        std::fs::remove_file(&link).unwrap();
        symlink("../../devices/pci0000:80/0000:80:01.0", &link).unwrap();
        assert_eq!(numa_of_first(&v.check(tree(n)).unwrap()), Some(vec![0]));

        // The node is recreated (as devtmpfs does for a new device): looked up again.
        std::fs::remove_file(dev.join("bulk/n0")).unwrap();
        mknod(&dev.join("bulk/n0"), 0);
        assert_eq!(numa_of_first(&v.check(tree(n)).unwrap()), Some(vec![1]));

        // A node the guest still names is gone: refused.
        std::fs::remove_file(dev.join("bulk/n7")).unwrap();
        let err = v.check(tree(n)).unwrap_err();
        assert_eq!(err.rule(), "node-exists", "{err}");

        // Its directory replaced by another holding the same names: everything is asked again.
        std::fs::rename(dev.join("bulk"), dir.path().join("old")).unwrap();
        std::fs::create_dir(dev.join("bulk")).unwrap();
        for i in 1..n {
            mknod(&dev.join(format!("bulk/n{i}")), i);
        }
        let err = v.check(tree(n)).unwrap_err();
        assert_eq!(err.rule(), "node-exists", "{err}");
        mknod(&dev.join("bulk/n0"), 0);
        assert_eq!(numa_of_first(&v.check(tree(n)).unwrap()), Some(vec![1]));
    }

    /// A small tree is looked up whole every time: no inotify instance is spent on it.
    #[test]
    fn small_trees_are_not_remembered() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("bulk")).unwrap();
        mknod(&dir.path().join("bulk/n0"), 0);
        let mut v = Validator::new(
            "small".into(),
            Arc::new(Policy::default()),
            Arc::default(),
            Arc::new(DevFs::open(dir.path()).unwrap()),
            Arc::new(Topology::new(&dir.path().join("sys"))),
        );
        v.check(tree(1)).unwrap();
        assert!(v.memo.is_none());
        std::fs::remove_file(dir.path().join("bulk/n0")).unwrap();
        assert_eq!(v.check(tree(1)).unwrap_err().rule(), "node-exists");
    }

    /// A tree whose host form exceeds the guest's memory limit is refused by its rule: the
    /// lifted form before anything is made of it, the validated form as it is built; with room
    /// for both it passes.
    #[test]
    fn a_tree_larger_on_the_host_than_its_guests_memory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("bulk")).unwrap();
        for i in 0..40 {
            mknod(&dir.path().join(format!("bulk/n{i}")), i);
        }
        let lifted = crate::footprint::lifted_bytes(&tree(40), &[]);
        let validated = crate::tree::charge::validated_bytes(
            &Policy::default()
                .check_tree(tree(40), &DevFs::open(dir.path()).unwrap())
                .unwrap(),
        );
        let at = |memory| {
            Validator::new(
                "charged".into(),
                Arc::new(Policy::default()),
                Arc::default(),
                Arc::new(DevFs::open(dir.path()).unwrap()),
                Arc::new(Topology::new(&dir.path().join("sys"))),
            )
            .charging(memory)
            .check(tree(40))
        };
        // A map of 40 devices in nodes of eleven slots, their specs' arrays: larger validated.
        assert!(validated > lifted, "{validated} <= {lifted}");
        at(validated).unwrap();
        let err = at(validated - 1).unwrap_err();
        assert_eq!(err.rule(), "tree-host-memory", "{err}");
        assert!(err.to_string().contains("as validated"), "{err}");
        let err = at(lifted - 1).unwrap_err();
        assert!(err.to_string().contains("as lifted"), "{err}");
    }
}
