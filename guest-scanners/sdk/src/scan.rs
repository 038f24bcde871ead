//! The scan loop: scan, notify when the tree changed, wait for a change, forever.
//!
//! Why: the host calls `scanner.scan` once and expects it to loop (Intel's `Scanner.Scan`); every
//! scanner would otherwise re-implement the same loop, and getting it subtly wrong (notifying an
//! unchanged tree every few seconds, busy-looping, swallowing errors) costs the host work or hides
//! failures. An error from one scan is returned as is: the host restarts the guest with backoff.
//!
//! After the first tree, the loop tells the host only what changed (`notify-changes`, contract
//! 0.1.2: [`changes_between`]), so one device appearing among thousands costs the host that
//! device; when the host answers that it does not hold the last tree, the loop notifies the
//! whole tree.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use crate::config;
use crate::types::{Device, DeviceAttributes, DeviceTree, GroupChanges};

/// The environment variable that sets the longest wait between two scans, in milliseconds.
pub const RESCAN_INTERVAL_ENV: &str = "RESCAN_INTERVAL_MS";
/// The wait between scans when [`RESCAN_INTERVAL_ENV`] is unset: 30 s.
pub const DEFAULT_RESCAN_INTERVAL_MS: u32 = 30_000;

/// Reads [`RESCAN_INTERVAL_ENV`] (1 ..= u32::MAX ms, default 30000).
pub fn rescan_interval_ms() -> Result<u32, String> {
    config::env_u32(
        RESCAN_INTERVAL_ENV,
        DEFAULT_RESCAN_INTERVAL_MS,
        1..=u32::MAX,
    )
}

/// Hands a whole tree to the host (it replaces the previous one). [`run`] calls this for you.
pub fn notify(tree: &DeviceTree) {
    crate::bindings::scanner::wdp::device_plugin::notifier::notify(tree)
}

/// Hands a whole tree to the host with typed attributes and capacities for some of its devices
/// (contract 0.1.1), for front-ends that publish them (Dynamic Resource Allocation); the host
/// validates them with the tree. [`run_attributed`] calls this for you.
pub fn notify_with_attributes(tree: &DeviceTree, attributes: &[DeviceAttributes]) {
    crate::bindings::scanner::wdp::device_plugin::notifier::notify_with_attributes(tree, attributes)
}

/// Tells the host what changed since the last tree or changes notified (contract 0.1.2), with
/// the typed attributes of changed devices. False when the host does not hold that tree (none
/// notified yet, or it refused one since): notify the whole tree then. [`run`] calls this for
/// you.
pub fn notify_changes(changes: &[GroupChanges], attributes: &[DeviceAttributes]) -> bool {
    crate::bindings::scanner::wdp::device_plugin::notifier::notify_changes(changes, attributes)
}

/// [`run`] for a scanner that describes its devices with typed attributes: `scan` returns the
/// tree and the attributes (see [`crate::tree::attributes`]); what changed in either is
/// notified.
pub fn run_attributed(
    scan: impl FnMut() -> Result<(DeviceTree, Vec<DeviceAttributes>), String>,
) -> Result<(), String> {
    let interval = rescan_interval_ms()?;
    run_telling(scan, &mut Host, || {
        crate::devfs::wait_for_change(interval);
        true
    })
}

/// How the scan loop reaches the host: the whole tree, or what changed since the last one told.
/// [`run_telling`] takes it as an argument so that the loop can be tested off wasm.
pub trait Tell {
    /// Replaces the host's tree (`notify`, or `notify-with-attributes` when there are any).
    fn tree(&mut self, tree: &DeviceTree, attributes: &[DeviceAttributes]);
    /// Changes the host's tree (`notify-changes`); false when the host does not hold the tree
    /// they apply to.
    fn changes(&mut self, changes: &[GroupChanges], attributes: &[DeviceAttributes]) -> bool;
}

/// The host, through the contract's `notifier`.
pub struct Host;

impl Tell for Host {
    fn tree(&mut self, tree: &DeviceTree, attributes: &[DeviceAttributes]) {
        if attributes.is_empty() {
            notify(tree);
        } else {
            notify_with_attributes(tree, attributes);
        }
    }

    fn changes(&mut self, changes: &[GroupChanges], attributes: &[DeviceAttributes]) -> bool {
        notify_changes(changes, attributes)
    }
}

/// The loop behind [`run`] and [`run_attributed`]: scans, tells `tell` the first tree whole and
/// then only what changed (the whole tree again when a group went, when the tree breaks a rule
/// the host checks, such as an id given twice, or when `tell` refuses the changes), and waits.
/// `wait` returns false to stop the loop (then this returns Ok); an Err from `scan` is returned
/// immediately.
pub fn run_telling(
    mut scan: impl FnMut() -> Result<(DeviceTree, Vec<DeviceAttributes>), String>,
    tell: &mut impl Tell,
    mut wait: impl FnMut() -> bool,
) -> Result<(), String> {
    let mut last: Option<(DeviceTree, Vec<DeviceAttributes>)> = None;
    loop {
        let (tree, attributes) = scan()?;
        match &last {
            Some((t, a)) if *t == tree && *a == attributes => {}
            Some((t, a)) => match changes_between((t, a), (&tree, &attributes)) {
                Some((changes, _)) if changes.is_empty() => {}
                Some((changes, changed_attributes)) => {
                    if !tell.changes(&changes, &changed_attributes) {
                        tell.tree(&tree, &attributes);
                    }
                }
                None => tell.tree(&tree, &attributes),
            },
            None => tell.tree(&tree, &attributes),
        }
        last = Some((tree, attributes));
        if !wait() {
            return Ok(());
        }
    }
}

/// Attributes entries by (dev-type, id); `None` when one is given twice.
fn by_device(
    attributes: &[DeviceAttributes],
) -> Option<HashMap<(String, String), &DeviceAttributes>> {
    let mut map = HashMap::with_capacity(attributes.len());
    for a in attributes {
        if map.insert((a.dev_type.clone(), a.id.clone()), a).is_some() {
            return None;
        }
    }
    Some(map)
}

/// What changed from the tree `last` to `new`, each with its attributes: per group of `new`,
/// the devices that appeared or whose information or attributes changed, and the ids that went
/// (a group that appeared is listed with all its devices), with the attributes entries of the
/// changed devices. Empty when only the order changed. `None` when changes cannot say it: a group
/// of `last` is gone, or `new` gives a dev-type, a device id or an attributes entry twice, or
/// attributes for a device it does not have (the host refuses such a tree whole, so it is
/// notified whole).
pub fn changes_between(
    last: (&DeviceTree, &[DeviceAttributes]),
    new: (&DeviceTree, &[DeviceAttributes]),
) -> Option<(Vec<GroupChanges>, Vec<DeviceAttributes>)> {
    let last_attributes = by_device(last.1)?;
    let mut new_attributes = by_device(new.1)?;
    let old: FastMap<&str, &Vec<Device>> = last
        .0
        .iter()
        .map(|g| (g.dev_type.as_str(), &g.devices))
        .collect();
    let mut types = FastSet::default();
    let mut changes = Vec::new();
    let mut changed_attributes = Vec::new();
    for group in new.0 {
        if !types.insert(group.dev_type.as_str()) {
            return None;
        }
        let mut ids = FastSet::default();
        ids.reserve(group.devices.len());
        if !group.devices.iter().all(|d| ids.insert(d.id.as_str())) {
            return None;
        }
        let before = old
            .get(group.dev_type.as_str())
            .map_or(&[][..], |d| d.as_slice());
        let mut same = |was: &Device, now: &Device| {
            if was.id != now.id {
                return None;
            }
            // Keys are made only where there are attributes: most trees have none.
            if last_attributes.is_empty() && new_attributes.is_empty() {
                return Some((was.info == now.info, None));
            }
            let key = (group.dev_type.clone(), now.id.clone());
            let (was_a, now_a) = (
                last_attributes.get(&key).copied(),
                new_attributes.remove(&key),
            );
            Some((was.info == now.info && was_a == now_a, now_a))
        };
        // A scan lists its devices in the same order each time, so the two lists match
        // position by position up to the first change and back from the end: only what lies
        // between is looked up by id.
        let mut changed = Vec::new();
        let mut push = |device: &Device, attributes: Option<&DeviceAttributes>| {
            changed.push(device.clone());
            changed_attributes.extend(attributes.cloned());
        };
        let (mut head, mut tail) = (0, 0);
        while head < before.len().min(group.devices.len()) {
            match same(&before[head], &group.devices[head]) {
                Some((true, _)) => {}
                Some((false, attributes)) => push(&group.devices[head], attributes),
                None => break,
            }
            head += 1;
        }
        while tail < (before.len() - head).min(group.devices.len() - head) {
            let (was, now) = (
                &before[before.len() - 1 - tail],
                &group.devices[group.devices.len() - 1 - tail],
            );
            match same(was, now) {
                Some((true, _)) => {}
                Some((false, attributes)) => push(now, attributes),
                None => break,
            }
            tail += 1;
        }
        let was: FastMap<&str, &Device> = before[head..before.len() - tail]
            .iter()
            .map(|d| (d.id.as_str(), d))
            .collect();
        let middle = &group.devices[head..group.devices.len() - tail];
        for now in middle {
            let (same, attributes) = match was.get(now.id.as_str()) {
                Some(was) => same(was, now).unwrap_or((false, None)),
                // New here: its attributes, if any, come with it.
                None => same(now, now).map_or((false, None), |(_, a)| (false, a)),
            };
            if !same {
                push(now, attributes);
            }
        }
        let removed: Vec<String> = was
            .keys()
            .filter(|id| !ids.contains(*id))
            .map(|id| id.to_string())
            .collect();
        if !(changed.is_empty() && removed.is_empty() && old.contains_key(group.dev_type.as_str()))
        {
            changes.push(GroupChanges {
                dev_type: group.dev_type.clone(),
                changed,
                removed,
            });
        }
    }
    // Attributes left name no device of the tree; a group of the last tree is gone.
    if !new_attributes.is_empty() || old.keys().any(|t| !types.contains(t)) {
        return None;
    }
    Some((changes, changed_attributes))
}

/// FxHash (rustc's): a multiply and a rotate per word. The guest hashes its own ids, of every
/// device at every scan; SipHash's resistance to chosen keys protects nobody here and cost a
/// scan of 10,000 devices more than comparing them.
#[derive(Default, Clone, Copy)]
struct Fx(u64);

impl Fx {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, byte: u8) {
        self.add(u64::from(byte));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;
type FastSet<K> = HashSet<K, BuildHasherDefault<Fx>>;

/// Remembers the last tree notified and says whether a new one differs from it.
#[derive(Debug, Default, Clone)]
pub struct ChangeFilter {
    last: Option<DeviceTree>,
}

impl ChangeFilter {
    /// No tree notified yet, so the first one counts as a change.
    pub fn new() -> Self {
        Self::default()
    }

    /// The tree to notify: `tree` itself (now remembered) when nothing was notified yet or it
    /// differs from the last tree notified; None when it is the same. Takes the tree rather than
    /// a reference so that remembering it moves it, where a copy would duplicate every string
    /// of a large tree after each changed scan.
    pub fn offer(&mut self, tree: DeviceTree) -> Option<&DeviceTree> {
        if self.last.as_ref() == Some(&tree) {
            return None;
        }
        Some(self.last.insert(tree))
    }
}

/// The loop behind [`run`], with its effects passed in so it can be tested: `scan` describes the
/// devices, `notify` receives changed trees, `wait` blocks between scans and returns false to
/// stop the loop (then `run_with` returns Ok). An Err from `scan` is returned immediately.
pub fn run_with(
    mut scan: impl FnMut() -> Result<DeviceTree, String>,
    mut notify: impl FnMut(&DeviceTree),
    mut wait: impl FnMut() -> bool,
) -> Result<(), String> {
    let mut filter = ChangeFilter::new();
    loop {
        if let Some(tree) = filter.offer(scan()?) {
            notify(tree);
        }
        if !wait() {
            return Ok(());
        }
    }
}

/// Runs a scanner forever: calls `scan`, notifies the host when the tree differs from the last
/// one notified (the whole tree the first time, then what changed: [`run_telling`]), then waits with `devfs::wait-for-change` for at most
/// `RESCAN_INTERVAL_MS` (default 30000) before scanning again. Returns only an error: from
/// `scan`, or for a bad `RESCAN_INTERVAL_MS`.
///
/// ```ignore
/// impl wdp_guest::Scanner for MyScanner {
///     fn scan() -> Result<(), String> {
///         wdp_guest::run(scan_once)
///     }
/// }
/// ```
pub fn run(mut scan: impl FnMut() -> Result<DeviceTree, String>) -> Result<(), String> {
    let interval = rescan_interval_ms()?;
    run_telling(
        || Ok((scan()?, Vec::new())),
        &mut Host,
        || {
            crate::devfs::wait_for_change(interval);
            true
        },
    )
}

/// A scanner that keeps its devices between scans and can say what changed without comparing
/// whole trees: [`run_incremental`] tells the host only that.
///
/// Why: [`run`] compares each scan's tree with the last one, which costs a scan of 10,000
/// devices the 10,000 devices even when one changed. A scanner that follows its sources'
/// changes ([`crate::keptglob::KeptGlob`]) knows the changed devices already.
pub trait Incremental {
    /// Scans again: what changed since the last scan (empty: nothing), or `None` when it cannot
    /// say (then the whole tree is told). The first scan's answer is not used: the whole tree
    /// is told then.
    fn scan(&mut self) -> Result<Option<Vec<GroupChanges>>, String>;
    /// The whole tree as of the last scan (kept by the scanner: told without a copy).
    fn tree(&self) -> &DeviceTree;
}

/// Runs an [`Incremental`] scanner forever, as [`run`] runs a plain one: the first tree whole,
/// then what each scan says changed, waiting with `devfs::wait-for-change` for at most
/// `RESCAN_INTERVAL_MS` between scans. Returns only an error.
pub fn run_incremental(scanner: &mut impl Incremental) -> Result<(), String> {
    let interval = rescan_interval_ms()?;
    run_incremental_telling(scanner, &mut Host, || {
        crate::devfs::wait_for_change(interval);
        true
    })
}

/// The loop behind [`run_incremental`], its effects passed in so that it can be tested: the
/// whole tree first, when the scanner cannot say what changed, and when `tell` refuses the
/// changes (the host does not hold the tree they apply to); otherwise the changes, when there
/// are any. `wait` returns false to stop the loop (then this returns Ok).
pub fn run_incremental_telling(
    scanner: &mut impl Incremental,
    tell: &mut impl Tell,
    mut wait: impl FnMut() -> bool,
) -> Result<(), String> {
    let mut told = false;
    loop {
        match scanner.scan()? {
            Some(changes) if told => {
                if !changes.is_empty() && !tell.changes(&changes, &[]) {
                    tell.tree(scanner.tree(), &[]);
                }
            }
            _ => {
                tell.tree(scanner.tree(), &[]);
                told = true;
            }
        }
        if !wait() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DeviceInfo, TreeBuilder};

    fn tree(ids: &[&str]) -> DeviceTree {
        let mut t = TreeBuilder::new();
        for id in ids {
            t.add("t", *id, DeviceInfo::new());
        }
        t.build()
    }

    #[test]
    fn filter_notifies_first_and_changes_only() {
        let mut f = ChangeFilter::new();
        assert_eq!(
            f.offer(vec![]),
            Some(&vec![]),
            "the first tree, even empty, is notified"
        );
        assert_eq!(f.offer(vec![]), None);
        assert_eq!(f.offer(tree(&["a"])), Some(&tree(&["a"])));
        assert_eq!(f.offer(tree(&["a"])), None);
        assert_eq!(f.offer(tree(&["a", "b"])), Some(&tree(&["a", "b"])));
        assert_eq!(f.offer(tree(&["a"])), Some(&tree(&["a"])));
    }

    #[test]
    fn loop_notifies_changes_and_stops_on_error() {
        let scans = [
            Ok(tree(&["a"])),
            Ok(tree(&["a"])),
            Ok(tree(&["a", "b"])),
            Err("boom".to_string()),
            Ok(tree(&["never"])),
        ];
        let mut i = 0;
        let mut notified = Vec::new();
        let mut waits = 0;
        let r = run_with(
            || {
                i += 1;
                scans[i - 1].clone()
            },
            |t| notified.push(t.clone()),
            || {
                waits += 1;
                true
            },
        );
        assert_eq!(r, Err("boom".to_string()));
        assert_eq!(notified, [tree(&["a"]), tree(&["a", "b"])]);
        assert_eq!(waits, 3);
    }

    /// What a loop told, in order; `changes` answers each change with the next of `answers`.
    #[derive(Default)]
    struct Told {
        said: Vec<String>,
        answers: Vec<bool>,
    }

    impl Tell for Told {
        fn tree(&mut self, tree: &DeviceTree, attributes: &[DeviceAttributes]) {
            let ids: Vec<&str> = tree
                .iter()
                .flat_map(|g| g.devices.iter().map(|d| d.id.as_str()))
                .collect();
            self.said
                .push(format!("tree {} +{}", ids.join(","), attributes.len()));
        }

        fn changes(&mut self, changes: &[GroupChanges], attributes: &[DeviceAttributes]) -> bool {
            let list = |ids: Vec<&str>| ids.join(",");
            for g in changes {
                self.said.push(format!(
                    "{}: changed {} removed {} +{}",
                    g.dev_type,
                    list(g.changed.iter().map(|d| d.id.as_str()).collect()),
                    list(g.removed.iter().map(String::as_str).collect()),
                    attributes.len()
                ));
            }
            if self.answers.is_empty() {
                true
            } else {
                self.answers.remove(0)
            }
        }
    }

    /// A scanner whose scans are given: each an id list to become, and whether it can say
    /// what changed.
    struct Given {
        now: Vec<String>,
        tree: DeviceTree,
        scans: Vec<(Vec<&'static str>, bool)>,
    }

    impl Incremental for Given {
        fn scan(&mut self) -> Result<Option<Vec<GroupChanges>>, String> {
            let (ids, can_say) = self.scans.remove(0);
            self.tree = vec![group("t", &ids)];
            let before =
                std::mem::replace(&mut self.now, ids.iter().map(|s| s.to_string()).collect());
            let changed = group("t", &ids)
                .devices
                .into_iter()
                .filter(|d| !before.contains(&d.id))
                .collect::<Vec<_>>();
            let removed: Vec<String> = before
                .into_iter()
                .filter(|id| !self.now.contains(id))
                .collect();
            let changes = if changed.is_empty() && removed.is_empty() {
                vec![]
            } else {
                vec![GroupChanges {
                    dev_type: "t".into(),
                    changed,
                    removed,
                }]
            };
            Ok(can_say.then_some(changes))
        }
        fn tree(&self) -> &DeviceTree {
            &self.tree
        }
    }

    #[test]
    fn an_incremental_scanner_tells_the_first_tree_then_what_changed() {
        let mut scanner = Given {
            now: vec![],
            tree: vec![],
            scans: vec![
                (vec!["a"], true),
                (vec!["a", "b"], true),
                (vec!["a", "b"], true),
                (vec!["b"], true),
                (vec!["b", "c"], false),
                (vec!["c"], true),
            ],
        };
        // The host refuses the changes of the fourth scan: the whole tree follows.
        let mut told = Told {
            said: vec![],
            answers: vec![true, false],
        };
        let mut scans = 0;
        run_incremental_telling(&mut scanner, &mut told, || {
            scans += 1;
            scans < 6
        })
        .unwrap();
        assert_eq!(
            told.said,
            [
                "tree a +0",
                "t: changed b removed  +0",
                "t: changed  removed a +0",
                "tree b +0",
                "tree b,c +0",
                "t: changed  removed b +0",
            ]
        );
    }

    /// A group as a guest may give it: ids as listed, twice if so.
    fn group(dev_type: &str, ids: &[&str]) -> crate::types::DeviceGroup {
        crate::types::DeviceGroup {
            dev_type: dev_type.into(),
            devices: ids
                .iter()
                .map(|id| crate::types::Device {
                    id: id.to_string(),
                    info: DeviceInfo::new(),
                })
                .collect(),
        }
    }

    fn attrs(id: &str, model: &str) -> DeviceAttributes {
        crate::tree::attributes("t", id)
            .text("model", model)
            .build()
    }

    #[test]
    fn changes_say_what_changed_and_only_that() {
        let last = vec![group("t", &["a", "b", "c"]), group("u", &["x"])];
        let mut new = vec![group("t", &["c", "b", "d"]), group("u", &["x"])];
        // b changes health; a goes; d comes; c only moves; u is unchanged.
        new[0].devices[1].info.health = crate::Health::Unhealthy;
        let (changes, attributes) = changes_between((&last, &[]), (&new, &[])).unwrap();
        assert_eq!(changes.len(), 1, "{changes:?}");
        let ids: Vec<&str> = changes[0].changed.iter().map(|d| d.id.as_str()).collect();
        assert_eq!((changes[0].dev_type.as_str(), ids), ("t", vec!["b", "d"]));
        assert_eq!(changes[0].removed, ["a"]);
        assert!(attributes.is_empty());
        // Only the order changed: nothing to say.
        let reordered = vec![group("u", &["x"]), group("t", &["c", "b", "a"])];
        let (changes, _) = changes_between((&last, &[]), (&reordered, &[])).unwrap();
        assert!(changes.is_empty(), "{changes:?}");
        // A new group comes whole, even empty.
        let more = vec![
            group("t", &["a", "b", "c"]),
            group("u", &["x"]),
            group("v", &[]),
        ];
        let (changes, _) = changes_between((&last, &[]), (&more, &[])).unwrap();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].dev_type, "v");
    }

    #[test]
    fn attributes_changes_carry_their_device() {
        let last = vec![group("t", &["a", "b"])];
        let (changes, attributes) = changes_between(
            (&last, &[attrs("a", "x"), attrs("b", "x")]),
            (&last, &[attrs("a", "y"), attrs("b", "x")]),
        )
        .unwrap();
        let ids: Vec<&str> = changes[0].changed.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["a"]);
        assert_eq!(attributes, [attrs("a", "y")]);
    }

    #[test]
    fn what_changes_cannot_say_goes_whole() {
        let last = vec![group("t", &["a"]), group("u", &["x"])];
        // A group gone, an id twice, a dev-type twice, attributes of no device.
        let gone = vec![group("t", &["a"])];
        let twice = vec![group("t", &["a", "a"]), group("u", &["x"])];
        let types_twice = vec![group("t", &["a"]), group("u", &["x"]), group("t", &["b"])];
        for new in [&gone, &twice, &types_twice] {
            assert!(
                changes_between((&last, &[]), (new, &[])).is_none(),
                "{new:?}"
            );
        }
        assert!(changes_between((&last, &[]), (&last, &[attrs("zz", "m")])).is_none());
    }

    #[test]
    fn the_loop_tells_the_first_tree_whole_then_changes_and_falls_back() {
        let scans = [
            tree(&["a"]),
            tree(&["a", "b"]),
            tree(&["a", "b"]),
            tree(&["b"]),
            tree(&["b", "c"]),
        ];
        let i = std::cell::Cell::new(0);
        // The host takes the first changes, refuses the second (it refused a tree meanwhile).
        let mut told = Told {
            answers: vec![true, false],
            ..Told::default()
        };
        let r = run_telling(
            || {
                i.set(i.get() + 1);
                Ok((scans[i.get() - 1].clone(), Vec::new()))
            },
            &mut told,
            || i.get() < scans.len(),
        );
        assert_eq!(r, Ok(()));
        assert_eq!(
            told.said,
            [
                "tree a +0",
                "t: changed b removed  +0",
                "t: changed  removed a +0",
                "tree b +0",
                "t: changed c removed  +0",
            ]
        );
    }

    #[test]
    fn loop_stops_when_wait_says_so() {
        let mut n = 0;
        let r = run_with(|| Ok(tree(&["a"])), |_| n += 1, || false);
        assert_eq!(r, Ok(()));
        assert_eq!(n, 1);
    }
}
