//! What a guest's tree costs the host's memory, in each form the host keeps of it, charged
//! against the guest's own memory limit.
//!
//! A guest's tree is lifted out of its linear memory into host `String`s and `Vec`s before the
//! host sees it, then validated into the host's own tree ([`crate::tree::DeviceTree`]), which is
//! what is served. Both forms can be larger than the guest's (a header of 24 bytes and an
//! allocation of at least 32 bytes for a 6-byte id; a B-tree node of eleven slots for a map of
//! one entry). Without a charge, what the host holds for one guest's tree grows with how
//! compactly the guest packs it, not with the memory the guest is given. So each form is charged
//! as it is made, before it can pass the guest's `limits.memory` (rule `tree-host-memory`):
//!
//! - the lifted form ([`lifted_bytes`]'s sums) by the sandbox while it copies a notified tree out
//!   (`sandbox::lift`), which stops a guest whose tree would exceed it before the copy does;
//! - the validated form ([`validated_device`], [`btree`]) by validation while it builds it
//!   ([`Budget`]), which refuses the tree before it does.
//!
//! So each form the host keeps of a guest's tree is at most that guest's limit, whatever the
//! guest's own form of it; how many forms there are at once is the README's memory bound
//! (section Security).

use std::mem::size_of;

use crate::bindings::types as wit;
use crate::tree::{AttributeValue, Attributes, DeviceInfo, Named, OutputError};

/// Bytes the allocator takes for an allocation of `len` bytes: glibc's chunks carry 8 bytes of
/// header, come in steps of 16 bytes and are at least 32 bytes; an empty `String` or `Vec`
/// allocates nothing.
pub(crate) fn heap(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len.saturating_add(8)).next_multiple_of(16).max(32)
    }
}

/// A string's heap share (its header is counted where it is stored).
fn text(s: &str) -> usize {
    heap(s.len())
}

/// A list's heap share: its elements' array and what each element owns.
fn list<T>(items: &[T], owned: impl Fn(&T) -> usize) -> usize {
    items
        .iter()
        .map(owned)
        .fold(heap(size_of_val(items)), usize::saturating_add)
}

fn pairs(items: &[(String, String)]) -> usize {
    list(items, |(a, b)| text(a) + text(b))
}

fn info(info: &wit::DeviceInfo) -> usize {
    list(&info.nodes, |n| {
        text(&n.container_path) + text(&n.host_path) + text(&n.permissions)
    }) + list(&info.mounts, |m| {
        text(&m.container_path) + text(&m.host_path)
    }) + pairs(&info.envs)
        + pairs(&info.annotations)
        + info.numa_nodes.as_deref().map_or(0, |n| list(n, |_| 0))
        + list(&info.cdi_devices, |s| text(s))
}

fn value(v: &wit::AttributeValue) -> usize {
    match v {
        wit::AttributeValue::Text(s) | wit::AttributeValue::Version(s) => text(s),
        wit::AttributeValue::Boolean(_) | wit::AttributeValue::Int(_) => 0,
    }
}

/// The host memory a lifted tree and its attributes hold, estimated from their shapes: every
/// `String` and `Vec` header, every allocation as the allocator rounds it.
pub fn lifted_bytes(tree: &[wit::DeviceGroup], attributes: &[wit::DeviceAttributes]) -> usize {
    let groups = list(tree, |g| {
        text(&g.dev_type) + list(&g.devices, |d| text(&d.id) + info(&d.info))
    });
    let attributes = list(attributes, |a| {
        text(&a.dev_type)
            + text(&a.id)
            + list(&a.attributes, |(n, v)| text(n) + value(v))
            + pairs(&a.capacities)
    });
    size_of::<wit::DeviceTree>() + size_of::<Vec<wit::DeviceAttributes>>() + groups + attributes
}

/// How many times its `limits.memory` the host holds at most, at once, for one scanner whose
/// resources it serves to kubelet, each part held to that limit:
///
/// 1. the guest's own memory (its linear memory, `limits.memory` itself);
/// 2. what its current host call copies out of it: a notified tree as it is lifted
///    (`sandbox::lift`, charged), or another call's arguments (wasmtime's hostcall fuel, set to
///    the limit);
/// 3. the pending tree, the latest notified and not yet taken ([`crate::coalesce`]: one);
/// 4. the tree served, validated (charged as it was built, [`Budget`]);
/// 5. the tree replacing it: being validated (the lifted tree it is made of is the pending one
///    taken, and the guest does not run meanwhile: both run in the supervisor's task) or being
///    applied by the manager (the supervisor validates the next one only once this one is
///    applied: [`crate::manager::Manager::run`]).
///
/// So the host's memory stays within its own (what it holds with no tree) and this many times
/// the sum of its scanners' limits, and [`CDI_HELD_PER_SCANNER`] more for those with CDI specs.
pub const HELD_PER_SCANNER: u64 = 5;

/// What a scanner with CDI specs (`cdi:`) adds to [`HELD_PER_SCANNER`]: the CDI writer keeps
/// what it wrote of each group to know when a spec changes (a copy of the served group without
/// attributes: at most the served tree), and makes the new one beside the old when it rewrites
/// one ([`crate::cdi`]).
pub const CDI_HELD_PER_SCANNER: u64 = 2;

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

/// A vector's heap share as allocated (its capacity, not its length), and what each element
/// owns.
fn vector<T>(items: &Vec<T>, owned: impl Fn(&T) -> usize) -> usize {
    items
        .iter()
        .map(owned)
        .fold(heap(items.capacity() * size_of::<T>()), usize::saturating_add)
}

fn map(items: &std::collections::BTreeMap<String, String>) -> usize {
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
        vector(&info.mounts, |m| text(&m.container_path) + text(&m.host_path)),
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
#[cfg(test)]
pub(crate) fn validated_bytes(tree: &crate::tree::DeviceTree) -> usize {
    use crate::tree::DeviceGroup;
    tree.0
        .iter()
        .map(|(dev_type, group)| {
            group
                .iter()
                .map(|(id, info)| validated_device(id, info))
                .fold(
                    heap(dev_type.len()) + btree::<String, DeviceInfo>(group.len()),
                    usize::saturating_add,
                )
        })
        .fold(btree::<String, DeviceGroup>(tree.0.len()), usize::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(id: &str) -> wit::Device {
        wit::Device {
            id: id.into(),
            info: wit::DeviceInfo {
                health: wit::Health::Healthy,
                nodes: Vec::new(),
                mounts: Vec::new(),
                envs: Vec::new(),
                annotations: Vec::new(),
                numa_nodes: None,
                cdi_devices: Vec::new(),
            },
        }
    }

    #[test]
    fn counts_headers_and_rounded_allocations() {
        assert_eq!((heap(0), heap(1), heap(24), heap(25)), (0, 32, 32, 48));
        let empty = lifted_bytes(&[], &[]);
        let tree = vec![wit::DeviceGroup {
            dev_type: "gpu".into(),
            devices: (0..1000).map(|i| device(&format!("d{i}"))).collect(),
        }];
        let one = lifted_bytes(&tree, &[]);
        // Each device: its record in the group's array, and a 32-byte chunk for its short id.
        let per_device = size_of::<wit::Device>() + 32;
        assert!(one - empty >= 1000 * per_device, "{one}");
        assert!(one - empty <= 1000 * per_device + 4096, "{one}");
        let attrs: Vec<_> = (0..1000)
            .map(|i| wit::DeviceAttributes {
                dev_type: "gpu".into(),
                id: format!("d{i}"),
                attributes: vec![("model".into(), wit::AttributeValue::Int(1))],
                capacities: Vec::new(),
            })
            .collect();
        assert!(lifted_bytes(&tree, &attrs) > one + 1000 * 3 * 32);
    }

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
    fn a_validated_tree_is_charged_as_it_is_built() {
        use crate::tree::DeviceTree;
        let groups = || {
            vec![wit::DeviceGroup {
                dev_type: "gpu".into(),
                devices: (0..1000).map(|i| device(&format!("d{i}"))).collect(),
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
