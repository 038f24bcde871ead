//! What a validated tree holds of the host's memory, charged against its guest's memory limit
//! while validation builds it ([`Budget`]): the second form of a guest's tree the host keeps, the
//! first being the lifted one ([`crate::footprint`]). A tree whose validated form would pass the
//! limit is refused (rule `tree-host-memory`) before it does.
//!
//! The validated form can be larger than the lifted one: its devices are kept in a map, whose
//! B-tree nodes have sixteen slots each (eleven in the maps of types and of a device's envs and
//! annotations). So the charge counts nodes as imbl's `OrdMap` and std's `BTreeMap` make them, each array as allocated (its
//! capacity), and each string and node as glibc rounds it ([`heap`]).

use std::collections::BTreeMap;
use std::mem::size_of;

use super::{AttributeValue, Attributes, DeviceInfo, Named, OutputError};
use crate::footprint::heap;

/// A string's heap share (its header is counted where it is stored).
fn text(s: &str) -> usize {
    heap(s.len())
}

/// Slots of a node of std's `BTreeMap` (its `B` of 6).
const BTREE_CAPACITY: usize = 11;

/// The host memory a `BTreeMap` of `n` entries holds in nodes (what its keys and values own is
/// counted apart). Entries are only ever inserted into the host's maps, never removed while they
/// are charged, and std's insertion splits a full node into halves of at least 5 entries: every
/// leaf but the root holds 5, and each leaf but the last has a separator in a node above, so
/// there are at most (n + 1) / 6 leaves; an inner node (the slots and 12 child pointers) has at
/// least 6 children, so there are at most a fifth as many of them, and one more.
pub(crate) fn btree<K, V>(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    // A leaf: its parent pointer, its index there and its length, then the slots.
    let slots = BTREE_CAPACITY * (size_of::<K>() + size_of::<V>()) + 16;
    let leaf = heap(slots);
    if n <= BTREE_CAPACITY {
        return leaf;
    }
    let leaves = (n + 1).div_ceil(6);
    let inner = heap(slots + (BTREE_CAPACITY + 1) * size_of::<usize>());
    leaves
        .saturating_mul(leaf)
        .saturating_add((leaves.div_ceil(5) + 1).saturating_mul(inner))
}

/// Slots of a node of imbl's `OrdMap`, the map a [`crate::tree::DeviceGroup`] is (its chunk
/// size).
const ORD_CAPACITY: usize = 16;

/// The fewest entries of an `OrdMap` leaf (the root aside) in a map only ever inserted into:
/// imbl splits a full leaf of 16 into halves of 8 and 9.
pub(crate) const BUILT: usize = 8;

/// The fewest entries of an `OrdMap` leaf (the root aside) in a map entries were also removed
/// from: imbl merges a leaf only below a third (5).
pub(crate) const PATCHED: usize = 5;

/// The host memory an `OrdMap` of `n` entries holds in nodes (what its keys and values own is
/// counted apart), its leaves holding at least `least` entries ([`BUILT`] or [`PATCHED`]):
/// at most n / `least` leaves, and, every branch but the root having at least 8 children, a
/// seventh as many branches plus one per level. Nodes one version shares with another are
/// counted in each: a bound, never an under-count.
pub(crate) fn ordmap<K, V>(n: usize, least: usize) -> usize {
    if n == 0 {
        return 0;
    }
    // An `Arc` (two counts) of a chunk (its two indices and the slots).
    let chunk = |slots: usize| 4 * size_of::<usize>() + slots;
    let leaf = heap(chunk(ORD_CAPACITY * (size_of::<K>() + size_of::<V>())));
    if n <= ORD_CAPACITY {
        return leaf;
    }
    let leaves = n.div_ceil(least.max(1));
    // The keys, then the children's chunk and which kind they are.
    let branch = heap(
        chunk(ORD_CAPACITY * size_of::<K>())
            + 4 * size_of::<usize>()
            + (ORD_CAPACITY + 1) * size_of::<usize>(),
    );
    // Levels: at most log base 8 of the leaves, and 64 bits of entries.
    let branches = leaves.div_ceil(7) + 22;
    leaves
        .saturating_mul(leaf)
        .saturating_add(branches.saturating_mul(branch))
}

/// A vector's heap share as allocated (its capacity, not its length), and what each element
/// owns.
fn vector<T>(items: &Vec<T>, owned: impl Fn(&T) -> usize) -> usize {
    items.iter().map(owned).fold(
        heap(items.capacity() * size_of::<T>()),
        usize::saturating_add,
    )
}

fn map(items: &BTreeMap<String, String>) -> usize {
    items
        .iter()
        .map(|(k, v)| text(k) + text(v))
        .fold(btree::<String, String>(items.len()), usize::saturating_add)
}

fn named<V>(items: &Named<V>, owned: impl Fn(&V) -> usize) -> usize {
    items
        .iter()
        .map(|(name, value)| text(name) + owned(value))
        .fold(
            heap(items.capacity() * size_of::<(String, V)>()),
            usize::saturating_add,
        )
}

/// NUMA nodes validation may fill in for a device that has nodes and gave none
/// ([`crate::topology`]): one allocation, charged for this many node ids (a machine's NUMA nodes
/// are few; 6 ids take the same 32-byte chunk as one).
const NUMA_FILLED: usize = 6;

/// The host memory one validated device holds besides its slot in its group's map: its id and
/// everything its info owns, the NUMA nodes validation may still fill in included.
pub(crate) fn validated_device(id: &str, info: &DeviceInfo) -> usize {
    let numa = match &info.numa_nodes {
        Some(n) => vector(n, |_| 0),
        None if info.nodes.is_empty() => 0,
        None => heap(NUMA_FILLED * size_of::<u32>()),
    };
    [
        text(id),
        vector(&info.nodes, |n| {
            text(&n.container_path) + text(&n.host_path) + text(&n.permissions)
        }),
        vector(&info.mounts, |m| {
            text(&m.container_path) + text(&m.host_path)
        }),
        map(&info.envs),
        map(&info.annotations),
        numa,
        vector(&info.cdi_devices, |s| text(s)),
        attributes(&info.attributes),
    ]
    .into_iter()
    .fold(0, usize::saturating_add)
}

/// The host memory a device's validated attributes and capacities hold.
pub(crate) fn attributes(a: &Attributes) -> usize {
    named(&a.attributes, |v| match v {
        AttributeValue::String(s) | AttributeValue::Version(s) => text(s),
        AttributeValue::Bool(_) | AttributeValue::Int(_) => 0,
    })
    .saturating_add(named(&a.capacities, |q| text(q)))
}

/// What a validated tree holds so far, and the guest's memory limit it may not pass: charged as
/// the tree is built, so a tree too large is refused before it is.
#[derive(Debug)]
pub struct Budget {
    spent: usize,
    max: usize,
}

impl Budget {
    /// Nothing spent yet of `max` bytes.
    pub fn new(max: usize) -> Self {
        Budget { spent: 0, max }
    }

    /// Spends `bytes`; [`OutputError::TreeHostMemory`] when that passes the limit.
    pub fn take(&mut self, bytes: usize) -> Result<(), OutputError> {
        self.spent = self.spent.saturating_add(bytes);
        if self.spent > self.max {
            return Err(OutputError::TreeHostMemory {
                bytes: self.spent,
                max: self.max,
                form: "validated",
            });
        }
        Ok(())
    }

    /// What was spent.
    pub fn spent(&self) -> usize {
        self.spent
    }
}

/// The host memory a validated tree holds, as validation charged it while building it.
pub(crate) fn validated_bytes(tree: &super::DeviceTree) -> usize {
    use super::DeviceGroup;
    tree.0
        .iter()
        .map(|(dev_type, group)| {
            group
                .iter()
                .map(|(id, info)| validated_device(id, info))
                .fold(
                    heap(dev_type.len()) + ordmap::<String, DeviceInfo>(group.len(), BUILT),
                    usize::saturating_add,
                )
        })
        .fold(
            btree::<String, DeviceGroup>(tree.0.len()),
            usize::saturating_add,
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_is_charged_its_nodes() {
        assert_eq!(btree::<u64, u64>(0), 0);
        // Up to eleven entries: one leaf of eleven 16-byte slots and its 16-byte header.
        assert_eq!(btree::<u64, u64>(1), heap(11 * 16 + 16));
        assert_eq!(btree::<u64, u64>(11), btree::<u64, u64>(1));
        assert!(btree::<u64, u64>(12) > btree::<u64, u64>(11));
        for n in 1..10_000 {
            assert!(btree::<u64, u64>(n + 1) >= btree::<u64, u64>(n), "{n}");
        }
    }

    #[test]
    fn a_device_group_is_charged_its_nodes_the_more_when_patched() {
        assert_eq!(ordmap::<u64, u64>(0, BUILT), 0);
        // Up to sixteen entries: one leaf, its slots, the chunk's indices and the `Arc`'s counts.
        assert_eq!(ordmap::<u64, u64>(1, BUILT), heap(16 * 16 + 32));
        assert_eq!(
            ordmap::<u64, u64>(16, PATCHED),
            ordmap::<u64, u64>(1, BUILT)
        );
        for n in 1..10_000 {
            assert!(
                ordmap::<u64, u64>(n + 1, BUILT) >= ordmap::<u64, u64>(n, BUILT),
                "{n}"
            );
            assert!(
                ordmap::<u64, u64>(n, PATCHED) >= ordmap::<u64, u64>(n, BUILT),
                "{n}"
            );
        }
    }

    #[test]
    fn a_validated_tree_is_charged_as_it_is_built() {
        use crate::bindings::types as wit;
        use crate::tree::DeviceTree;
        let groups = || {
            vec![wit::DeviceGroup {
                dev_type: "gpu".into(),
                devices: (0..1000)
                    .map(|i| crate::footprint::bare_device(&format!("d{i}")))
                    .collect(),
            }]
        };
        let attrs = || {
            (0..1000)
                .rev()
                .map(|i| wit::DeviceAttributes {
                    dev_type: "gpu".into(),
                    id: format!("d{i}"),
                    attributes: vec![("model".into(), wit::AttributeValue::Text("x1".into()))],
                    capacities: vec![("memory".into(), "16Gi".into())],
                })
                .collect::<Vec<_>>()
        };
        let mut budget = Budget::new(usize::MAX);
        let mut tree = DeviceTree::from_guest_within(groups(), &mut budget).unwrap();
        tree.attach_within(attrs(), &mut budget).unwrap();
        assert_eq!(budget.spent(), validated_bytes(&tree));
        assert_eq!(tree.0["gpu"]["d7"].attributes.capacities["memory"], "16Gi");
        // A budget one byte short refuses it, while it is built.
        let mut short = Budget::new(budget.spent() - 1);
        let mut tree = DeviceTree::from_guest_within(groups(), &mut short).unwrap();
        let err = tree.attach_within(attrs(), &mut short).unwrap_err();
        assert_eq!(err.rule(), "tree-host-memory", "{err}");
        let mut shorter = Budget::new(1000 * 32);
        let err = DeviceTree::from_guest_within(groups(), &mut shorter).unwrap_err();
        assert_eq!(err.rule(), "tree-host-memory", "{err}");
    }
}
