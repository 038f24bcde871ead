//! Changes a guest notified with `notify-changes` (contract 0.1.2) and the host has not validated
//! yet, merged into one set.
//!
//! A guest that tells only what changed lets the host validate and patch in proportion to the
//! change. Changes are coalesced like trees ([`crate::coalesce`]): between two takes, each call's
//! changes are merged into the pending set, a device changed twice keeping its last state, so
//! what waits is at most one entry per device named, whatever the guest's pace. The set is
//! checked against the host's last accepted tree only when taken
//! ([`crate::validate::Validator::check_changes`]).

use std::collections::BTreeMap;

use crate::bindings::types as wit;

/// The pending changes of one scanner instance, by group and device id, as the guest gave them.
#[derive(Debug, Default)]
pub struct ChangeSet {
    /// By dev-type: each device id's new state (`None`: removed).
    pub groups: BTreeMap<String, BTreeMap<String, Option<wit::DeviceInfo>>>,
    /// Typed attributes of changed devices, by (dev-type, id): an entry is dropped when its
    /// device changes again without one, or goes.
    pub attributes: BTreeMap<(String, String), wit::DeviceAttributes>,
    /// What the calls merged here were charged as they were lifted, summed: replaced entries
    /// are not taken off, so this bounds what the set holds.
    pub bytes: usize,
}

impl ChangeSet {
    /// Merges one call's changes after those already here. Within the call, an id both changed
    /// and removed is removed; an attributes entry replaces its device's earlier one.
    pub fn merge(
        &mut self,
        changes: Vec<wit::GroupChanges>,
        attributes: Vec<wit::DeviceAttributes>,
        bytes: usize,
    ) {
        self.bytes = self.bytes.saturating_add(bytes);
        for group in changes {
            let devices = self.groups.entry(group.dev_type.clone()).or_default();
            for device in group.changed {
                self.attributes
                    .remove(&(group.dev_type.clone(), device.id.clone()));
                devices.insert(device.id, Some(device.info));
            }
            for id in group.removed {
                self.attributes
                    .remove(&(group.dev_type.clone(), id.clone()));
                devices.insert(id, None);
            }
        }
        for entry in attributes {
            self.attributes
                .insert((entry.dev_type.clone(), entry.id.clone()), entry);
        }
    }

    /// The changed devices as a tree (every group named, changed devices or not) with their
    /// attributes, and the removed ids by group: the tree is validated as any notified tree is.
    pub fn split(self) -> (wit::DeviceTree, Vec<wit::DeviceAttributes>, Removed) {
        let mut tree = Vec::with_capacity(self.groups.len());
        let mut removed = Removed::new();
        for (dev_type, devices) in self.groups {
            let mut changed = Vec::new();
            for (id, info) in devices {
                match info {
                    Some(info) => changed.push(wit::Device { id, info }),
                    None => removed.entry(dev_type.clone()).or_default().push(id),
                }
            }
            tree.push(wit::DeviceGroup {
                dev_type,
                devices: changed,
            });
        }
        (tree, self.attributes.into_values().collect(), removed)
    }
}

/// Removed device ids by dev-type.
pub type Removed = BTreeMap<String, Vec<String>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::footprint::bare_device;

    fn changes(dev_type: &str, changed: &[&str], removed: &[&str]) -> wit::GroupChanges {
        wit::GroupChanges {
            dev_type: dev_type.into(),
            changed: changed.iter().map(|id| bare_device(id)).collect(),
            removed: removed.iter().map(|id| id.to_string()).collect(),
        }
    }

    fn attributes(id: &str) -> wit::DeviceAttributes {
        wit::DeviceAttributes {
            dev_type: "t".into(),
            id: id.into(),
            attributes: vec![("model".into(), wit::AttributeValue::Int(1))],
            capacities: vec![],
        }
    }

    #[test]
    fn later_calls_win_and_removal_wins_within_a_call() {
        let mut set = ChangeSet::default();
        set.merge(
            vec![changes("t", &["a", "b"], &["c"])],
            vec![attributes("a"), attributes("b")],
            10,
        );
        // b goes, c comes back, a changes again without attributes; d is changed and removed.
        set.merge(
            vec![
                changes("t", &["c", "a", "d"], &["b", "d"]),
                changes("u", &[], &[]),
            ],
            vec![],
            5,
        );
        assert_eq!(set.bytes, 15);
        let (tree, attrs, removed) = set.split();
        let ids: Vec<(&str, Vec<&str>)> = tree
            .iter()
            .map(|g| {
                (
                    g.dev_type.as_str(),
                    g.devices.iter().map(|d| d.id.as_str()).collect(),
                )
            })
            .collect();
        assert_eq!(ids, [("t", vec!["a", "c"]), ("u", vec![])]);
        assert!(
            attrs.is_empty(),
            "a changed again without attributes: {attrs:?}"
        );
        assert_eq!(removed["t"], ["b", "d"]);
        assert!(!removed.contains_key("u"));
    }

    #[test]
    fn an_attributes_entry_follows_its_device() {
        let mut set = ChangeSet::default();
        set.merge(vec![changes("t", &["a"], &[])], vec![attributes("a")], 1);
        set.merge(vec![], vec![attributes("x")], 1);
        let (_, attrs, _) = set.split();
        let ids: Vec<&str> = attrs.iter().map(|a| a.id.as_str()).collect();
        // x names no changed device: validation refuses it, as it refuses one in a tree.
        assert_eq!(ids, ["a", "x"]);
    }
}
