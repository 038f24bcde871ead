//! The scanner between scans: its devices kept, and each scan told as what changed.
//!
//! Why: a type such as `[{"name":"bulk","groups":[{"paths":[{"path":"/dev/bulk/d*"}]}]}]` over
//! 10,000 nodes would otherwise be discovered whole on every scan, 10,000 devices built and
//! compared for one node that came or went. A type of one group of one path globbing one
//! directory (the common shape) is kept as one device per match of a [`KeptGlob`], which follows
//! the host's record of what changed in the directory: a scan after one hot-plug builds one
//! device. Any other type (several groups or paths, whose devices zip matches together, shared
//! devices, or USB) is discovered whole and compared with its last group, as [`wdp_guest::run`]
//! would.
//!
//! The state is the tree itself, each kept type's devices in the order they came (a device gone
//! is replaced by the last one): the host keys devices by id, so the order means nothing to it,
//! and the whole tree, when it is told, is told without a copy. Its devices are what
//! [`discover`] gives: the tests compare the two.

use foldhash::HashMap;
use foldhash::HashMapExt;
use wdp_guest::hostfs::HostFs;
use wdp_guest::keptglob::KeptGlob;
use wdp_guest::scan::{Incremental, changes_between};
use wdp_guest::tree::{id_from_path, is_id_char};
use wdp_guest::types::{Device, DeviceGroup, GroupChanges};
use wdp_guest::{DeviceInfo, DeviceTree};

use crate::config::{DeviceType, PathSpec};
use crate::discover::{discover, with_path};

/// The configured types over filesystem `fs`, kept between scans.
pub struct Live<F> {
    fs: F,
    /// One group per configured type, in their order.
    tree: DeviceTree,
    /// How each group is kept.
    types: Vec<Kept>,
    /// A scan was made: the next one's changes are told (the first's are not used).
    scanned: bool,
}

enum Kept {
    /// One group of one path globbing one directory: its devices follow the glob's matches.
    Matches {
        spec: PathSpec,
        glob: KeptGlob,
        /// The position of each device in the group, by id: a match's id is a function of its
        /// path alone (the directory's, then the entry's name, whose characters are all id
        /// characters: see [`Kept::scan`]), so it finds the device of a path.
        at: HashMap<String, usize>,
    },
    /// Discovered whole at each scan.
    Whole(DeviceType),
}

impl Kept {
    fn new(dt: &DeviceType) -> Self {
        if let [group] = dt.groups.as_slice()
            && let [spec] = group.paths.as_slice()
            && group.usb.is_empty()
            && group.count <= 1
            && spec.limit >= 1
            && let Ok(glob) = KeptGlob::new(&spec.path)
            && glob.follows_a_directory()
        {
            return Kept::Matches {
                spec: spec.clone(),
                glob,
                at: HashMap::new(),
            };
        }
        Kept::Whole(dt.clone())
    }

    /// The type as configured (for a kept one, rebuilt from what it keeps).
    fn config(&self, name: &str) -> DeviceType {
        match self {
            Kept::Whole(dt) => dt.clone(),
            Kept::Matches { spec, .. } => DeviceType {
                name: name.to_string(),
                groups: vec![crate::config::Group {
                    paths: vec![spec.clone()],
                    usb: Vec::new(),
                    count: 1,
                }],
            },
        }
    }

    /// Scans this type again into `group`: its changes (`None` for no change, and always when
    /// not `told`: nobody reads them), or `Err(())` when they cannot be said.
    fn scan(
        &mut self,
        group: &mut DeviceGroup,
        fs: &impl HostFs,
        told: bool,
    ) -> Result<Option<GroupChanges>, ()> {
        let mut changes = GroupChanges {
            dev_type: group.dev_type.clone(),
            changed: Vec::new(),
            removed: Vec::new(),
        };
        match self {
            Kept::Whole(dt) => {
                let now = discover(std::slice::from_ref(dt), fs);
                let before = vec![DeviceGroup {
                    dev_type: group.dev_type.clone(),
                    devices: std::mem::take(&mut group.devices),
                }];
                let said = changes_between((&before, &[]), (&now, &[]));
                *group = now.into_iter().next().ok_or(())?;
                let (changes, _) = said.ok_or(())?;
                return Ok(changes.into_iter().next());
            }
            Kept::Matches { spec, glob, at } => {
                let found = glob.update(fs);
                for path in found.removed {
                    let Some(i) = at.remove(&id_from_path(&path)) else {
                        continue;
                    };
                    let gone = group.devices.swap_remove(i);
                    if let Some(moved) = group.devices.get(i)
                        && let Some(slot) = at.get_mut(&moved.id)
                    {
                        *slot = i;
                    }
                    changes.removed.push(gone.id);
                }
                // A first scan of a large directory: one allocation each, no growth.
                at.reserve(found.changed.len());
                group.devices.reserve(found.changed.len());
                for m in found.changed {
                    // Ids are the directory's, then the entry's name: two names make one id
                    // only when the id had to change a character of one of them, and then
                    // only the first is in the tree, which this keeping does not follow.
                    let name = m.path.rsplit('/').next().unwrap_or_default();
                    if !name.bytes().all(is_id_char) {
                        return Err(());
                    }
                    let id = id_from_path(&m.path);
                    let info = with_path(DeviceInfo::new(), spec, m.path);
                    let i = match at.get(&id) {
                        Some(&i) if group.devices[i].info == info => continue,
                        Some(&i) => {
                            group.devices[i].info = info;
                            i
                        }
                        None => {
                            at.insert(id.clone(), group.devices.len());
                            group.devices.push(Device { id, info });
                            group.devices.len() - 1
                        }
                    };
                    if told {
                        changes.changed.push(group.devices[i].clone());
                    }
                }
            }
        }
        Ok((!changes.changed.is_empty() || !changes.removed.is_empty()).then_some(changes))
    }
}

impl<F: HostFs> Live<F> {
    /// The configured `types` over `fs`, nothing scanned yet.
    pub fn new(types: Vec<DeviceType>, fs: F) -> Self {
        Live {
            fs,
            tree: types
                .iter()
                .map(|dt| DeviceGroup {
                    dev_type: dt.name.clone(),
                    devices: Vec::new(),
                })
                .collect(),
            types: types.iter().map(Kept::new).collect(),
            scanned: false,
        }
    }
}

impl<F: HostFs> Incremental for Live<F> {
    fn scan(&mut self) -> Result<Option<Vec<GroupChanges>>, String> {
        let mut changes = Vec::new();
        let mut said = true;
        let told = std::mem::replace(&mut self.scanned, true);
        for (kept, group) in self.types.iter_mut().zip(self.tree.iter_mut()) {
            match kept.scan(group, &self.fs, told) {
                Ok(Some(c)) => changes.push(c),
                Ok(None) => {}
                Err(()) => {
                    // Two matches make one id: discovered whole from now on, which keeps the
                    // first as the tree always did.
                    *kept = Kept::Whole(kept.config(&group.dev_type));
                    group.devices.clear();
                    let _ = kept.scan(group, &self.fs, told);
                    said = false;
                }
            }
        }
        Ok(said.then_some(changes))
    }

    fn tree(&self) -> &DeviceTree {
        &self.tree
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_devices;
    use wdp_guest::hostfs::FakeFs;

    fn live(config: &str, fs: &FakeFs) -> Live<FakeFs> {
        Live::new(parse_devices(Some(config)).unwrap(), fs.clone())
    }

    /// Scans `live` over `fs` and checks its tree against [`discover`]'s; the changes said.
    fn scan(live: &mut Live<FakeFs>, fs: &FakeFs, config: &str) -> Option<Vec<GroupChanges>> {
        live.fs = fs.clone();
        let changes = live.scan().unwrap();
        let types = parse_devices(Some(config)).unwrap();
        // In any order: the host keys devices by id.
        let sorted = |mut tree: DeviceTree| {
            for g in &mut tree {
                g.devices.sort_by(|a, b| a.id.cmp(&b.id));
            }
            tree
        };
        assert_eq!(
            sorted(live.tree().clone()),
            sorted(discover(&types, fs)),
            "{config}"
        );
        changes
    }

    fn said(changes: &[GroupChanges]) -> Vec<String> {
        changes
            .iter()
            .map(|g| {
                let mut ids: Vec<&str> = g.changed.iter().map(|d| d.id.as_str()).collect();
                let mut removed = g.removed.clone();
                ids.sort();
                removed.sort();
                format!("{}: +{} -{}", g.dev_type, ids.join(","), removed.join(","))
            })
            .collect()
    }

    #[test]
    fn one_path_types_tell_the_matches_that_changed() {
        let config = r#"[{"name":"serial","groups":[{"paths":[{"path":"/dev/ttyUSB*"}]}]},
            {"name":"fuse","groups":[{"count":2,"paths":[{"path":"/dev/fuse*","mountPath":"/dev/"}]}]},
            {"name":"gpu","groups":[{"paths":[{"path":"/dev/dri/card*"},{"path":"/dev/dri/renderD*"}]}]}]"#;
        let mut fs = FakeFs::new();
        fs.char_dev("/dev/ttyUSB0", 188, 0)
            .char_dev("/dev/fuse", 10, 229)
            .char_dev("/dev/dri/card0", 226, 0)
            .char_dev("/dev/dri/renderD128", 226, 128);
        let mut live = live(config, &fs);
        scan(&mut live, &fs, config);
        assert_eq!(
            scan(&mut live, &fs, config),
            Some(vec![]),
            "nothing changed"
        );

        fs.char_dev("/dev/ttyUSB1", 188, 1).remove("/dev/fuse");
        let changes = scan(&mut live, &fs, config).unwrap();
        assert_eq!(
            said(&changes),
            ["serial: +ttyUSB1 -", "fuse: + -fuse-0,fuse-1"]
        );

        fs.char_dev("/dev/dri/card1", 226, 1)
            .char_dev("/dev/dri/renderD129", 226, 129);
        let changes = scan(&mut live, &fs, config).unwrap();
        assert_eq!(said(&changes), ["gpu: +dri_card1+dri_renderD129 -"]);
    }

    #[test]
    fn a_device_moved_into_a_removed_ones_place_is_found_there() {
        let config = r#"[{"name":"bulk","groups":[{"paths":[{"path":"/dev/bulk/d*"}]}]}]"#;
        let mut fs = FakeFs::new();
        fs.char_dev("/dev/bulk/d0", 240, 0)
            .char_dev("/dev/bulk/d1", 240, 1)
            .char_dev("/dev/bulk/d2", 240, 2);
        let mut live = live(config, &fs);
        scan(&mut live, &fs, config);
        // d2, the last device, takes d0's place; then it goes too.
        fs.remove("/dev/bulk/d0");
        let changes = scan(&mut live, &fs, config).unwrap();
        assert_eq!(said(&changes), ["bulk: + -bulk_d0"]);
        fs.remove("/dev/bulk/d2");
        let changes = scan(&mut live, &fs, config).unwrap();
        assert_eq!(said(&changes), ["bulk: + -bulk_d2"]);
        fs.char_dev("/dev/bulk/d3", 240, 3);
        let changes = scan(&mut live, &fs, config).unwrap();
        assert_eq!(said(&changes), ["bulk: +bulk_d3 -"]);
    }

    #[test]
    fn two_matches_of_one_id_are_discovered_whole_from_then_on() {
        // `a:b` and `a_b` both make the id `a_b`: the first in path order wins.
        let config = r#"[{"name":"x","groups":[{"paths":[{"path":"/dev/a*"}]}]}]"#;
        let mut fs = FakeFs::new();
        fs.char_dev("/dev/a_b", 1, 1);
        let mut live = live(config, &fs);
        scan(&mut live, &fs, config);
        fs.char_dev("/dev/a:b", 1, 2);
        assert_eq!(scan(&mut live, &fs, config), None, "the whole tree is told");
        fs.char_dev("/dev/a1", 1, 3);
        let changes = scan(&mut live, &fs, config).unwrap();
        assert_eq!(said(&changes), ["x: +a1 -"]);
    }
}
