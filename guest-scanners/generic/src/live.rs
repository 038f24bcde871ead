//! The scanner between scans: its devices kept, and each scan told as what changed.
//!
//! Why: a type such as `[{"name":"bulk","groups":[{"paths":[{"path":"/dev/bulk/d*"}]}]}]` over
//! 10,000 nodes would otherwise be discovered whole on every scan, 10,000 devices built and
//! compared for one node that came or went. A type of one group of one path (the common shape)
//! is kept as one device (or `count` shared slots) per match of a [`KeptGlob`], which follows the
//! host's record of what changed in the directory: a scan after one hot-plug builds one device.
//! Any other type (several groups or paths, whose devices zip matches together, or USB) is
//! discovered whole and compared with its last group, as [`wdp_guest::run`] would.
//!
//! Either way the tree told is what [`discover`] gives: the tests compare the two.

use std::collections::BTreeMap;

use wdp_guest::hostfs::HostFs;
use wdp_guest::keptglob::KeptGlob;
use wdp_guest::scan::{Incremental, changes_between};
use wdp_guest::tree::{id_from_path, slot_ids};
use wdp_guest::types::{Device, DeviceGroup, GroupChanges};
use wdp_guest::{DeviceInfo, DeviceTree};

use crate::config::{DeviceType, PathSpec};
use crate::discover::{discover, with_path};

/// The configured types over filesystem `fs`, kept between scans.
pub struct Live<F> {
    fs: F,
    types: Vec<Kept>,
    /// A scan was made: the next one's changes are told (the first's are not used).
    scanned: bool,
}

enum Kept {
    /// One group of one path globbing one directory: its devices follow the glob's matches.
    Matches {
        name: String,
        spec: PathSpec,
        count: u32,
        glob: KeptGlob,
        /// The device of each match (its id before `count`'s suffix, and its information), by
        /// path.
        devices: BTreeMap<String, (String, DeviceInfo)>,
    },
    /// Discovered whole at each scan.
    Whole { dt: DeviceType, group: DeviceGroup },
}

impl Kept {
    fn new(dt: DeviceType) -> Self {
        if let [group] = dt.groups.as_slice()
            && let [spec] = group.paths.as_slice()
            && group.usb.is_empty()
            && spec.limit >= 1
            && let Ok(glob) = KeptGlob::new(&spec.path)
            && glob.follows_a_directory()
        {
            return Kept::Matches {
                name: dt.name,
                spec: spec.clone(),
                count: group.count,
                glob,
                devices: BTreeMap::new(),
            };
        }
        Kept::whole(dt)
    }

    fn whole(dt: DeviceType) -> Self {
        let group = DeviceGroup {
            dev_type: dt.name.clone(),
            devices: Vec::new(),
        };
        Kept::Whole { dt, group }
    }

    /// Scans this type again: its changes (`None` for no change, and always when not `told`:
    /// nobody reads them), or `Err(())` when they cannot be said.
    fn scan(&mut self, fs: &impl HostFs, told: bool) -> Result<Option<GroupChanges>, ()> {
        match self {
            Kept::Whole { dt, group } => {
                let now = discover(std::slice::from_ref(dt), fs);
                let said = changes_between((&vec![group.clone()], &[]), (&now, &[]));
                *group = now.into_iter().next().ok_or(())?;
                let (changes, _) = said.ok_or(())?;
                Ok(changes.into_iter().next())
            }
            Kept::Matches {
                name,
                spec,
                count,
                glob,
                devices,
            } => {
                let found = glob.update(fs);
                let mut changes = GroupChanges {
                    dev_type: name.clone(),
                    changed: Vec::new(),
                    removed: Vec::new(),
                };
                for path in found.removed {
                    if let Some((id, _)) = devices.remove(&path) {
                        changes.removed.extend(slots(&id, *count));
                    }
                }
                for m in found.changed {
                    // Ids are the directory's, then the entry's name: two names make one id
                    // only when the id had to change a character of one of them, and then
                    // only the first is in the tree, which this keeping does not follow.
                    let name = m.path.rsplit('/').next().unwrap_or_default();
                    if !name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                    {
                        return Err(());
                    }
                    let id = id_from_path(&m.path);
                    let info = with_path(DeviceInfo::new(), spec, m.path.clone());
                    if devices.get(&m.path).is_some_and(|(_, was)| *was == info) {
                        continue;
                    }
                    if told {
                        changes.changed.extend(slots(&id, *count).map(|id| Device {
                            id,
                            info: info.clone(),
                        }));
                    }
                    devices.insert(m.path, (id, info));
                }
                Ok((!changes.changed.is_empty() || !changes.removed.is_empty()).then_some(changes))
            }
        }
    }

    fn group(&self) -> DeviceGroup {
        match self {
            Kept::Whole { group, .. } => group.clone(),
            Kept::Matches {
                name,
                devices,
                count,
                ..
            } => DeviceGroup {
                dev_type: name.clone(),
                devices: devices
                    .values()
                    .flat_map(|(id, info)| {
                        slots(id, *count).map(|id| Device {
                            id,
                            info: info.clone(),
                        })
                    })
                    .collect(),
            },
        }
    }

    fn config(&self) -> Option<DeviceType> {
        match self {
            Kept::Whole { .. } => None,
            Kept::Matches {
                name, spec, count, ..
            } => Some(DeviceType {
                name: name.clone(),
                groups: vec![crate::config::Group {
                    paths: vec![spec.clone()],
                    usb: Vec::new(),
                    count: *count,
                }],
            }),
        }
    }
}

/// The ids of a device made `count` times: `<id>-0` .. (see [`slot_ids`]), or the id itself.
fn slots(id: &str, count: u32) -> impl Iterator<Item = String> + '_ {
    let shared = (count > 1).then(|| slot_ids(id, count));
    let single = (count <= 1).then(|| id.to_string());
    shared.into_iter().flatten().chain(single)
}

impl<F: HostFs> Live<F> {
    /// The configured `types` over `fs`, nothing scanned yet.
    pub fn new(types: Vec<DeviceType>, fs: F) -> Self {
        Live {
            fs,
            types: types.into_iter().map(Kept::new).collect(),
            scanned: false,
        }
    }
}

impl<F: HostFs> Incremental for Live<F> {
    fn scan(&mut self) -> Result<Option<Vec<GroupChanges>>, String> {
        let mut changes = Vec::new();
        let mut said = true;
        let told = std::mem::replace(&mut self.scanned, true);
        for kept in &mut self.types {
            match kept.scan(&self.fs, told) {
                Ok(Some(c)) => changes.push(c),
                Ok(None) => {}
                Err(()) => {
                    // Two matches make one id: discovered whole from now on, which keeps the
                    // first as the tree always did.
                    if let Some(dt) = kept.config() {
                        *kept = Kept::whole(dt);
                        let _ = kept.scan(&self.fs, told);
                    }
                    said = false;
                }
            }
        }
        Ok(said.then_some(changes))
    }

    fn tree(&self) -> DeviceTree {
        self.types.iter().map(Kept::group).collect()
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
        assert_eq!(live.tree(), discover(&types, fs), "{config}");
        changes
    }

    fn said(changes: &[GroupChanges]) -> Vec<String> {
        changes
            .iter()
            .map(|g| {
                let ids: Vec<&str> = g.changed.iter().map(|d| d.id.as_str()).collect();
                format!(
                    "{}: +{} -{}",
                    g.dev_type,
                    ids.join(","),
                    g.removed.join(",")
                )
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
