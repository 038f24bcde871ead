//! Devices that vanish become Unhealthy instead of disappearing.
//!
//! Why: when a device's node disappears or its driver is unbound, kubelet should see the device
//! go Unhealthy (it stops allocating it, and the pod that holds it can be told) rather than see
//! the capacity silently shrink; and when the device comes back it should be the same device,
//! Healthy again. A scanner only sees what is there now, so the memory of what was there lives
//! here, for the life of the guest instance.

use std::collections::{BTreeMap, BTreeSet};

use crate::types::{DeviceTree, Health};
use crate::{Device, DeviceGroup, DeviceInfo};

/// Remembers every device a scanner has reported, keyed by (device type, id).
#[derive(Debug, Default, Clone)]
pub struct Vanished {
    seen: BTreeMap<(String, String), DeviceInfo>,
}

impl Vanished {
    /// Nothing seen yet: keep one across the scans of a scanner's loop.
    pub fn new() -> Self {
        Self::default()
    }

    /// Like [`Vanished::mark`], for devices that can change type: a remembered device whose
    /// `key(dev_type, id)` is also the key of a device in `tree` moved (a QAT VF whose PF now
    /// offers `dc` instead of `cy`, a work queue switched from shared to dedicated) rather than
    /// vanished, so it is forgotten instead of lingering as an Unhealthy ghost of its old type.
    pub fn mark_moving(
        &mut self,
        tree: DeviceTree,
        key: impl Fn(&str, &str) -> String,
    ) -> DeviceTree {
        let mut present = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for group in &tree {
            for d in &group.devices {
                present.insert((group.dev_type.clone(), d.id.clone()));
                keys.insert(key(&group.dev_type, &d.id));
            }
        }
        self.seen.retain(|(dev_type, id), _| {
            present.contains(&(dev_type.clone(), id.clone())) || !keys.contains(&key(dev_type, id))
        });
        self.mark(tree)
    }

    /// `tree` plus every device reported before but missing now, with its last description and
    /// health Unhealthy, appended to its group (the group is recreated if it went away).
    pub fn mark(&mut self, mut tree: DeviceTree) -> DeviceTree {
        let mut present = BTreeSet::new();
        for group in &tree {
            for d in &group.devices {
                present.insert((group.dev_type.clone(), d.id.clone()));
                self.seen
                    .insert((group.dev_type.clone(), d.id.clone()), d.info.clone());
            }
        }
        for ((dev_type, id), info) in &self.seen {
            if present.contains(&(dev_type.clone(), id.clone())) {
                continue;
            }
            let group = match tree.iter().position(|g| &g.dev_type == dev_type) {
                Some(i) => &mut tree[i],
                None => {
                    tree.push(DeviceGroup {
                        dev_type: dev_type.clone(),
                        devices: Vec::new(),
                    });
                    let last = tree.len() - 1;
                    &mut tree[last]
                }
            };
            group.devices.push(Device {
                id: id.clone(),
                info: DeviceInfo {
                    health: Health::Unhealthy,
                    ..info.clone()
                },
            });
        }
        tree
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TreeBuilder;

    fn tree(devs: &[(&str, &str)]) -> DeviceTree {
        let mut t = TreeBuilder::new();
        for (ty, id) in devs {
            t.add(ty, *id, DeviceInfo::new().node("/dev/x", "/dev/x", "rw"));
        }
        t.build()
    }

    fn health(t: &DeviceTree) -> Vec<String> {
        t.iter()
            .flat_map(|g| {
                g.devices
                    .iter()
                    .map(|d| format!("{}/{} {:?}", g.dev_type, d.id, d.info.health))
            })
            .collect()
    }

    #[test]
    fn vanished_devices_turn_unhealthy_and_recover() {
        let mut v = Vanished::new();
        let all = tree(&[("a", "1"), ("a", "2"), ("b", "x")]);
        let first = v.mark(all.clone());
        assert_eq!(first, all, "nothing vanished yet");
        let second = v.mark(tree(&[("a", "2")]));
        assert_eq!(
            health(&second),
            [
                "a/2 Health::Healthy",
                "a/1 Health::Unhealthy",
                "b/x Health::Unhealthy"
            ]
        );
        assert_eq!(
            second[0].devices[1].info.nodes.len(),
            1,
            "last description kept"
        );
        assert_eq!(v.mark(all.clone()), all, "back to Healthy, in scan order");
    }

    #[test]
    fn moved_devices_are_forgotten_not_kept_as_ghosts() {
        let mut v = Vanished::new();
        let by_id = |_: &str, id: &str| id.to_string();
        v.mark_moving(tree(&[("cy", "vf0"), ("cy", "vf1")]), by_id);
        // vf0's PF now offers dc: vf0 moved; vf1 vanished.
        let t = v.mark_moving(tree(&[("dc", "vf0")]), by_id);
        assert_eq!(
            health(&t),
            ["dc/vf0 Health::Healthy", "cy/vf1 Health::Unhealthy"]
        );
        let t = v.mark_moving(tree(&[("dc", "vf0"), ("cy", "vf1")]), by_id);
        assert_eq!(
            health(&t),
            ["dc/vf0 Health::Healthy", "cy/vf1 Health::Healthy"]
        );
    }
}
