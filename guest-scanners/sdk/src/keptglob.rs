//! A glob's matches kept between scans, and what changed in them since the last scan.
//!
//! Why: a scanner of a directory of thousands of nodes (`/dev/bulk/d*`) that globs it afresh on
//! every scan pays for the whole directory each time one node comes or goes: the listing lowered
//! into its memory, every name matched, every device built and compared. With the host's
//! `devfs.read-dir-changes` (contract 0.1.2) a glob whose only pattern is its last component
//! (`/dev/dri/card*`, `/dev/ttyUSB*`) asks the host for the entries changed since its last
//! listing and matches only those, so a scan after one hot-plug costs one entry. Any other
//! pattern (a glob in a directory component, a literal path) is globbed afresh and compared with
//! the kept matches: the same answer, at the old cost.

use std::collections::BTreeMap;

use glob::Pattern;

use crate::devfs::Node;
use crate::pathglob::{self, DirSource, Match, OPTIONS};

/// A glob pattern and its matches as of the last [`KeptGlob::update`].
#[derive(Debug)]
pub struct KeptGlob {
    pattern: String,
    /// The directory listed and the pattern its entries' names must match, when the pattern's
    /// only glob is its last component.
    dir: Option<(String, Pattern)>,
    /// The version of the directory's last answer (0: none).
    version: u64,
    /// The matches, by path.
    matches: BTreeMap<String, Node>,
}

/// What changed in a glob's matches between two [`KeptGlob::update`]s.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GlobChanges {
    /// Matches that appeared or whose metadata changed, sorted by path.
    pub changed: Vec<Match>,
    /// Paths that no longer match, sorted.
    pub removed: Vec<String>,
}

impl GlobChanges {
    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.removed.is_empty()
    }
}

impl KeptGlob {
    /// A glob of `pattern` (checked as [`pathglob::validate`] does) with no matches yet: the
    /// first [`KeptGlob::update`] reports every match as changed.
    pub fn new(pattern: &str) -> Result<Self, String> {
        pathglob::validate(pattern)?;
        let dir = pattern.rsplit_once('/').and_then(|(dir, last)| {
            let literal = !pathglob::is_glob(dir) && pathglob::is_glob(last);
            let pattern = Pattern::new(last).ok()?;
            literal.then(|| (if dir.is_empty() { "/" } else { dir }.to_string(), pattern))
        });
        Ok(KeptGlob {
            pattern: pattern.to_string(),
            dir,
            version: 0,
            matches: BTreeMap::new(),
        })
    }

    /// The pattern.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// True when the pattern's only glob is its last component: its matches are the entries of
    /// one directory, followed through the host's changes of it.
    pub fn follows_a_directory(&self) -> bool {
        self.dir.is_some()
    }

    /// The matches as of the last update, sorted by path.
    pub fn matches(&self) -> impl Iterator<Item = Match> + '_ {
        self.matches.iter().map(|(path, node)| Match {
            path: path.clone(),
            node: node.clone(),
        })
    }

    /// Globs again in `src` and tells what changed since the last update. A directory that
    /// cannot be listed has no matches, as in [`pathglob::glob_with`].
    pub fn update(&mut self, src: &impl DirSource) -> GlobChanges {
        let Some((dir, names)) = &self.dir else {
            let now = pathglob::glob_with(src, &self.pattern).unwrap_or_default();
            return self.replace(now);
        };
        let answer = match src.list_changes(dir, self.version) {
            Ok(answer) => answer,
            Err(_) => {
                self.version = 0;
                return self.replace(Vec::new());
            }
        };
        self.version = answer.version;
        let path_of = |name: &str| {
            let mut path = String::with_capacity(dir.len() + 1 + name.len());
            path.push_str(dir.trim_end_matches('/'));
            path.push('/');
            path.push_str(name);
            path
        };
        let matching = answer
            .changed
            .into_iter()
            .filter(|n| names.matches_with(&n.name, OPTIONS));
        if answer.whole {
            let now = matching
                .map(|node| Match {
                    path: path_of(&node.name),
                    node,
                })
                .collect();
            return self.replace(now);
        }
        let mut changes = GlobChanges::default();
        for name in answer.removed {
            if names.matches_with(&name, OPTIONS) && self.matches.remove(&path_of(&name)).is_some()
            {
                changes.removed.push(path_of(&name));
            }
        }
        for node in matching {
            let path = path_of(&node.name);
            if self.matches.get(&path) != Some(&node) {
                self.matches.insert(path.clone(), node.clone());
                changes.changed.push(Match { path, node });
            }
        }
        changes
    }

    /// Replaces the matches with `now`, telling what differs.
    ///
    /// The map is built in one go (a sorted listing is then laid out without a search per
    /// entry) and compared with the matches before in one ordered pass: a few string
    /// comparisons per match instead of a search of the map for each, which inside wasm
    /// (byte-by-byte `memcmp`) was most of a first scan of a large directory.
    fn replace(&mut self, now: Vec<Match>) -> GlobChanges {
        let now: BTreeMap<String, Node> = now.into_iter().map(|m| (m.path, m.node)).collect();
        let before = std::mem::replace(&mut self.matches, now);
        let mut changes = GlobChanges::default();
        let mut before = before.into_iter().peekable();
        for (path, node) in &self.matches {
            while let Some((gone, _)) = before.next_if(|(old, _)| old < path) {
                changes.removed.push(gone);
            }
            let same = before
                .next_if(|(old, _)| old == path)
                .is_some_and(|(_, old)| old == *node);
            if !same {
                changes.changed.push(Match {
                    path: path.clone(),
                    node: node.clone(),
                });
            }
        }
        changes.removed.extend(before.map(|(gone, _)| gone));
        changes
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use super::*;
    use crate::devfs::{DirChanges, NodeKind};
    use crate::hostfs::FakeFs;

    /// What the host remembers of the last answer: its version and listing.
    #[derive(Default)]
    struct HostLog {
        last: RefCell<(u64, Vec<Node>)>,
        whole_answers: Cell<usize>,
    }

    /// A [`FakeFs`] that answers changes as the host does: by version, from `log`.
    struct Logged<'a> {
        fs: &'a FakeFs,
        log: &'a HostLog,
    }

    impl DirSource for Logged<'_> {
        fn list(&self, dir: &str) -> Result<Vec<Node>, String> {
            self.fs.list(dir)
        }
        fn stat(&self, path: &str) -> Result<Node, String> {
            self.fs.stat(path)
        }
        fn list_changes(&self, dir: &str, since: u64) -> Result<DirChanges, String> {
            let now = self.fs.list(dir)?;
            let mut last = self.log.last.borrow_mut();
            let version = last.0 + 1;
            let answer = if since == 0 || since != last.0 {
                self.log.whole_answers.set(self.log.whole_answers.get() + 1);
                DirChanges {
                    version,
                    whole: true,
                    changed: now.clone(),
                    removed: Vec::new(),
                }
            } else {
                let changed = now
                    .iter()
                    .filter(|n| !last.1.contains(n))
                    .cloned()
                    .collect();
                let removed = last
                    .1
                    .iter()
                    .filter(|n| !now.iter().any(|m| m.name == n.name))
                    .map(|n| n.name.clone())
                    .collect();
                DirChanges {
                    version,
                    whole: false,
                    changed,
                    removed,
                }
            };
            *last = (version, now);
            Ok(answer)
        }
    }

    fn paths(m: &[Match]) -> Vec<&str> {
        m.iter().map(|m| m.path.as_str()).collect()
    }

    #[test]
    fn a_last_component_glob_follows_the_directory_s_changes() {
        let mut fs = FakeFs::new();
        for (i, name) in ["tty0", "ttyUSB0", "ttyUSB1", ".ttyUSB9"]
            .iter()
            .enumerate()
        {
            fs.char_dev(&format!("/dev/{name}"), 4, i as u32);
        }
        let mut glob = KeptGlob::new("/dev/ttyUSB*").unwrap();
        let log = HostLog::default();
        let first = glob.update(&Logged { fs: &fs, log: &log });
        assert_eq!(paths(&first.changed), ["/dev/ttyUSB0", "/dev/ttyUSB1"]);
        assert!(first.removed.is_empty());
        assert!(glob.update(&Logged { fs: &fs, log: &log }).is_empty());

        fs.char_dev("/dev/ttyUSB2", 4, 9)
            .char_dev("/dev/tty1", 4, 10);
        fs.remove("/dev/ttyUSB0");
        let changes = glob.update(&Logged { fs: &fs, log: &log });
        assert_eq!(paths(&changes.changed), ["/dev/ttyUSB2"]);
        assert_eq!(changes.removed, ["/dev/ttyUSB0"]);
        assert_eq!(log.whole_answers.get(), 1, "only the first answer is whole");
        let now: Vec<String> = glob.matches().map(|m| m.path).collect();
        assert_eq!(now, ["/dev/ttyUSB1", "/dev/ttyUSB2"]);
    }

    #[test]
    fn other_patterns_and_whole_answers_are_compared_with_the_kept_matches() {
        let mut fs = FakeFs::new();
        fs.char_dev("/dev/bus/usb/001/001", 189, 0)
            .char_dev("/dev/bus/usb/001/002", 189, 1)
            .char_dev("/dev/kvm", 10, 232);
        let mut usb = KeptGlob::new("/dev/bus/usb/*/*").unwrap();
        let mut kvm = KeptGlob::new("/dev/kvm").unwrap();
        let mut plain = KeptGlob::new("/dev/bus/usb/001/*").unwrap();
        assert_eq!(usb.update(&fs).changed.len(), 2);
        assert_eq!(paths(&kvm.update(&fs).changed), ["/dev/kvm"]);
        assert_eq!(plain.update(&fs).changed.len(), 2);

        fs.remove("/dev/bus/usb/001/001").remove("/dev/kvm");
        fs.node("/dev/bus/usb/001/002", NodeKind::BlockDevice);
        for glob in [&mut usb, &mut plain] {
            // FakeFs answers whole listings (version 0): compared with what was kept.
            let changes = glob.update(&fs);
            assert_eq!(changes.removed, ["/dev/bus/usb/001/001"]);
            assert_eq!(paths(&changes.changed), ["/dev/bus/usb/001/002"]);
            assert_eq!(changes.changed[0].node.kind, NodeKind::BlockDevice);
        }
        assert_eq!(kvm.update(&fs).removed, ["/dev/kvm"]);
        // A directory gone: no matches.
        fs.remove("/dev/bus/usb/001/002").remove("/dev/bus/usb/001");
        assert_eq!(plain.update(&fs).removed, ["/dev/bus/usb/001/002"]);
        assert!(KeptGlob::new("/dev/[x").is_err());
    }

    #[test]
    fn kept_matches_equal_a_fresh_glob_whatever_changes() {
        let mut fs = FakeFs::new();
        let mut glob = KeptGlob::new("/dev/d*").unwrap();
        let log = HostLog::default();
        // A fixed pseudo-random walk of makes and removes, checked after each step.
        let mut x = 7u32;
        for step in 0..300 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let name = format!("/dev/d{}", (x >> 16) % 20);
            if (x >> 8).is_multiple_of(3) {
                fs.remove(&name);
            } else {
                fs.char_dev(&name, 240, (x >> 4) % 4);
            }
            glob.update(&Logged { fs: &fs, log: &log });
            let fresh: Vec<Match> = pathglob::glob_with(&fs, "/dev/d*").unwrap();
            assert_eq!(glob.matches().collect::<Vec<_>>(), fresh, "step {step}");
        }
    }
}
