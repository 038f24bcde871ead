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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};
use rustc_hash::FxHashMap;

use crate::bindings::types as wit;
use crate::changes::ChangeSet;
use crate::hostfs::DevFs;
use crate::metrics::ScannerMetrics;
use crate::policy::Policy;
use crate::topology::{NumaMemo, Topology};
use crate::tree::charge::{self, Budget};
use crate::tree::{DeviceGroup, DeviceInfo, DeviceTree, Health, OutputError};

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
    /// The last tree accepted, kept for a guest that notifies changes ([`Validator::keep`]).
    base: Option<Base>,
}

/// The tree changes apply to, with what the caps count of it, so that changes are checked
/// against it without walking it.
struct Base {
    tree: DeviceTree,
    /// Bytes of its strings, as the policy's `max-tree-bytes` counts them.
    strings: usize,
    /// Its validated form's charge ([`crate::tree::charge`]), each group's B-tree counted at
    /// the largest size it has had ([`Base::peaks`]): removing entries does not free nodes.
    charge: usize,
    /// Each group's largest size since it was kept.
    peaks: BTreeMap<String, usize>,
}

impl Base {
    fn of(tree: DeviceTree) -> Self {
        let strings = tree
            .0
            .iter()
            .map(|(dev_type, group)| {
                group
                    .iter()
                    .map(|(id, info)| device_strings(dev_type, id, info))
                    .fold(dev_type.len(), usize::saturating_add)
            })
            .fold(0, usize::saturating_add);
        // Its groups will be patched: their leaves may thin out to a third, where validation
        // charged them as built.
        let thinned = tree
            .0
            .values()
            .map(|g| {
                charge::ordmap::<String, DeviceInfo>(g.len(), charge::PATCHED)
                    - charge::ordmap::<String, DeviceInfo>(g.len(), charge::BUILT)
            })
            .fold(0, usize::saturating_add);
        let charge = charge::validated_bytes(&tree).saturating_add(thinned);
        let peaks = tree.0.iter().map(|(t, g)| (t.clone(), g.len())).collect();
        Base {
            tree,
            strings,
            charge,
            peaks,
        }
    }
}

/// Bytes of one validated device's strings, as the policy's `max-tree-bytes` counts them in a
/// notified tree (its id, what it carries, and its attributes entry with the names it repeats).
fn device_strings(dev_type: &str, id: &str, info: &DeviceInfo) -> usize {
    let nodes = info
        .nodes
        .iter()
        .map(|n| n.container_path.len() + n.host_path.len() + n.permissions.len());
    let mounts = info
        .mounts
        .iter()
        .map(|m| m.container_path.len() + m.host_path.len());
    let pairs = info
        .envs
        .iter()
        .chain(&info.annotations)
        .map(|(k, v)| k.len() + v.len());
    let cdi = info.cdi_devices.iter().map(String::len);
    let a = &info.attributes;
    let attributes = if a.is_empty() {
        0
    } else {
        let values = a.attributes.iter().map(|(name, value)| {
            name.len()
                + match value {
                    crate::tree::AttributeValue::String(s)
                    | crate::tree::AttributeValue::Version(s) => s.len(),
                    crate::tree::AttributeValue::Bool(_) | crate::tree::AttributeValue::Int(_) => 0,
                }
        });
        let capacities = a.capacities.iter().map(|(n, q)| n.len() + q.len());
        dev_type.len() + id.len() + values.chain(capacities).sum::<usize>()
    };
    nodes
        .chain(mounts)
        .chain(pairs)
        .chain(cdi)
        .fold(id.len() + attributes, usize::saturating_add)
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
            base: None,
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
        if !self.memo_tried && node_count(&tree) >= MEMO_FROM {
            self.memo_tried = true;
            self.memo = NodeMemo::new(self.devfs.root_path().to_path_buf());
        }
        let checked = self.validated(tree, attributes);
        self.counted(checked)
    }

    /// Counts `checked` as accepted or refused, logging a refusal.
    fn counted(
        &mut self,
        checked: Result<DeviceTree, OutputError>,
    ) -> Result<DeviceTree, OutputError> {
        match &checked {
            Ok(_) => ScannerMetrics::bump(&self.metrics.trees_accepted),
            Err(e) => {
                ScannerMetrics::bump(&self.metrics.trees_refused);
                self.log_refusal(e);
            }
        }
        checked
    }

    /// The policy's checks of `tree` as notified, what is known of its nodes asked first, and
    /// NUMA affinity filled in: the tree validated, not yet counted.
    fn validated(
        &mut self,
        tree: wit::DeviceTree,
        attributes: Vec<wit::DeviceAttributes>,
    ) -> Result<DeviceTree, OutputError> {
        if let Some(memo) = &mut self.memo {
            memo.catch_up();
            memo.watch_for(&tree);
        }
        let memo = &self.memo;
        let known = |path: &str| memo.as_ref().is_some_and(|m| m.exists(path));
        let mut budget = Budget::new(self.memory);
        let mut tree =
            self.policy
                .check_tree_charged(tree, attributes, &self.devfs, &known, &mut budget)?;
        match &mut self.memo {
            Some(memo) => {
                memo.existing(&tree);
                self.topology.fill_remembering(&mut tree, &self.devfs, memo);
            }
            None => self.topology.fill(&mut tree, &self.devfs),
        }
        Ok(tree)
    }

    /// Keeps `tree`, just accepted, as the tree the guest's changes apply to: only for a guest
    /// that notifies changes, since it is one more form of the tree to hold.
    pub fn keep(&mut self, tree: &DeviceTree) {
        self.base = Some(Base::of(tree.clone()));
    }

    /// Drops the kept tree: the guest's next changes would not apply to it (a tree or changes
    /// were refused, or a new tree is coming).
    pub fn forget(&mut self) {
        self.base = None;
    }

    /// Changes a guest notified (`notify-changes`), applied to the kept tree: only the changed
    /// devices are validated, as any notified device is (structure, caps, nodes that exist,
    /// allowed mounts, attributes; NUMA affinity filled in), and the caps that count the whole
    /// tree are checked from what the kept tree's counts become. Returns the patched tree to
    /// serve, which is kept; refused, the kept tree is dropped (the guest is then told to
    /// notify its whole tree).
    pub fn check_changes(&mut self, changes: ChangeSet) -> Result<DeviceTree, OutputError> {
        let checked = self.patch(changes);
        if checked.is_err() {
            self.base = None;
        }
        self.counted(checked)
    }

    fn patch(&mut self, changes: ChangeSet) -> Result<DeviceTree, OutputError> {
        if self.base.is_none() {
            return Err(OutputError::ChangesWithoutTree);
        }
        if changes.bytes > self.memory {
            return Err(OutputError::TreeHostMemory {
                bytes: changes.bytes,
                max: self.memory,
                form: "lifted",
            });
        }
        let (tree, attributes, removed) = changes.split();
        let changed = self.validated(tree, attributes)?;
        let Some(base) = &self.base else {
            return Err(OutputError::ChangesWithoutTree);
        };
        // What the kept tree's counts become, checked before it is touched.
        let policy = &self.policy;
        let mut strings = base.strings;
        let mut charge_total = base.charge;
        let mut types = base.tree.0.len();
        let no_group = DeviceGroup::new();
        let mut peaks = Vec::with_capacity(changed.0.len());
        for (dev_type, group) in &changed.0 {
            let before = base.tree.0.get(dev_type);
            let old = before.unwrap_or(&no_group);
            if before.is_none() {
                types += 1;
                strings = strings.saturating_add(dev_type.len());
                charge_total = charge_total
                    .saturating_add(crate::footprint::heap(dev_type.len()))
                    .saturating_add(charge::btree::<String, DeviceGroup>(types))
                    .saturating_sub(charge::btree::<String, DeviceGroup>(types - 1));
            }
            let gone = removed.get(dev_type).map_or(&[][..], Vec::as_slice);
            let mut len = old.len();
            let mut peak = base.peaks.get(dev_type).copied().unwrap_or(0);
            for (id, info) in group {
                match old.get(id) {
                    Some(was) => {
                        strings = strings.saturating_sub(device_strings(dev_type, id, was));
                        charge_total =
                            charge_total.saturating_sub(charge::validated_device(id, was));
                    }
                    None => {
                        len += 1;
                        peak = peak.max(len);
                    }
                }
                strings = strings.saturating_add(device_strings(dev_type, id, info));
                charge_total = charge_total.saturating_add(charge::validated_device(id, info));
            }
            for id in gone {
                if let Some(was) = old.get(id) {
                    len -= 1;
                    strings = strings.saturating_sub(device_strings(dev_type, id, was));
                    charge_total = charge_total.saturating_sub(charge::validated_device(id, was));
                }
            }
            if len > policy.max_devices_per_type {
                return Err(OutputError::TooManyDevices {
                    dev_type: dev_type.clone(),
                    count: len,
                    max: policy.max_devices_per_type,
                });
            }
            let had = base.peaks.get(dev_type).copied().unwrap_or(0);
            charge_total = charge_total
                .saturating_add(charge::ordmap::<String, DeviceInfo>(peak, charge::PATCHED))
                .saturating_sub(charge::ordmap::<String, DeviceInfo>(had, charge::PATCHED));
            peaks.push(peak);
        }
        if types > policy.max_types {
            return Err(OutputError::TooManyTypes {
                count: types,
                max: policy.max_types,
            });
        }
        if strings > policy.max_tree_bytes {
            return Err(OutputError::TreeTooLarge {
                max: policy.max_tree_bytes,
            });
        }
        if charge_total > self.memory {
            return Err(OutputError::TreeHostMemory {
                bytes: charge_total,
                max: self.memory,
                form: "validated",
            });
        }
        let Some(base) = &mut self.base else {
            return Err(OutputError::ChangesWithoutTree);
        };
        for ((dev_type, group), peak) in changed.0.into_iter().zip(peaks) {
            let kept = base.tree.0.entry(dev_type.clone()).or_default();
            for id in removed.get(&dev_type).into_iter().flatten() {
                kept.remove(id);
            }
            kept.extend(group);
            base.peaks.insert(dev_type, peak);
        }
        base.strings = strings;
        base.charge = charge_total;
        Ok(base.tree.clone())
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

    /// Changes as a guest gives them: devices `changed` (from [`tree`]'s numbering), ids gone.
    fn changes(changed: &[u32], removed: &[&str]) -> ChangeSet {
        let mut set = ChangeSet::default();
        let mut devices = tree(changed.iter().max().map_or(0, |m| m + 1))
            .remove(0)
            .devices;
        devices.retain(|d| changed.iter().any(|i| d.id == format!("d{i}")));
        set.merge(
            vec![wit::GroupChanges {
                dev_type: "bulk".into(),
                changed: devices,
                removed: removed.iter().map(|s| s.to_string()).collect(),
            }],
            vec![],
            1,
        );
        set
    }

    /// Changes applied to the kept tree give what validating the whole new tree gives, charge
    /// included; the caps count the whole patched tree; a refusal drops the kept tree.
    #[test]
    fn changes_patch_the_kept_tree_as_a_whole_tree_would_be() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev");
        std::fs::create_dir_all(dev.join("bulk")).unwrap();
        for i in 0..8 {
            mknod(&dev.join(format!("bulk/n{i}")), i);
        }
        let policy = Policy {
            max_devices_per_type: 6,
            ..Policy::default()
        };
        let mut v = Validator::new(
            "bulk".into(),
            Arc::new(policy),
            Arc::default(),
            Arc::new(DevFs::open(&dev).unwrap()),
            Arc::new(Topology::new(&dir.path().join("sys"))),
        );
        assert_eq!(
            v.check_changes(changes(&[1], &[])),
            Err(OutputError::ChangesWithoutTree)
        );
        let first = v.check(tree(4)).unwrap();
        v.keep(&first);
        // d4 and d5 come, d0 goes, d1 is given again as it was.
        let patched = v
            .check_changes(changes(&[1, 4, 5], &["d0", "nothing"]))
            .unwrap();
        let mut whole = tree(6);
        whole[0].devices.remove(0);
        let expected = v.check(whole).unwrap();
        assert_eq!(patched, expected);
        let base = v.base.as_ref().unwrap();
        let whole_strings = Base::of(expected.clone()).strings;
        assert_eq!(base.strings, whole_strings);
        // The charge counts the B-tree at its largest (6 then 5 devices), so at least the
        // whole tree's.
        assert!(base.charge >= charge::validated_bytes(&expected));
        // Two more would make 7 devices in a type of at most 6: refused whole, nothing kept.
        let err = v.check_changes(changes(&[6, 7], &[])).unwrap_err();
        assert_eq!(err.rule(), "max-devices-per-type");
        assert!(v.base.is_none());
        // A missing node is refused as in a tree.
        let mut v2 = v;
        v2.keep(&expected);
        std::fs::remove_file(dev.join("bulk/n7")).unwrap();
        let err = v2.check_changes(changes(&[7], &[])).unwrap_err();
        assert_eq!(err.rule(), "node-exists");
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
