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
//! - the validated form by validation while it builds it ([`crate::tree::charge`]), which
//!   refuses the tree before it does.
//!
//! So each form the host keeps of a guest's tree is at most that guest's limit, whatever the
//! guest's own form of it; how many forms there are at once is the host's memory bound
//! (docs/src/security/output-policy.md).

use std::mem::size_of;

use crate::bindings::types as wit;

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

/// The host memory lifted changes (`notify-changes`) and their attributes hold, as
/// [`lifted_bytes`] counts a tree.
pub fn changes_bytes(changes: &[wit::GroupChanges], attributes: &[wit::DeviceAttributes]) -> usize {
    let groups = list(changes, |g| {
        text(&g.dev_type)
            + list(&g.changed, |d| text(&d.id) + info(&d.info))
            + list(&g.removed, |id| text(id))
    });
    lifted_bytes(&[], attributes) + groups
}

/// How many times its `limits.memory` the host holds at most, at once, for one scanner whose
/// resources it serves to kubelet, each part held to that limit:
///
/// 1. the guest's own memory (its linear memory, `limits.memory` itself);
/// 2. what its current host call copies out of it: a notified tree as it is lifted
///    (`sandbox::lift`, charged), or another call's arguments (wasmtime's hostcall fuel, set to
///    the limit);
/// 3. the pending tree, the latest notified and not yet taken ([`crate::coalesce`]: one);
/// 4. the tree served, validated (charged as it was built, [`crate::tree::charge`]);
/// 5. the tree replacing it: being validated (the lifted tree it is made of is the pending one
///    taken, and the guest does not run meanwhile: both run in the supervisor's task) or being
///    applied by the manager (the supervisor validates the next one only once this one is
///    applied: [`crate::manager::Manager::run`]);
/// 6. for a guest that notifies changes (contract 0.1.2), the last tree accepted, which they
///    patch ([`crate::validate::Validator::keep`], charged as the validated form is).
///
/// The pending tree may instead be pending changes ([`crate::changes::ChangeSet`]), held to the
/// limit as they are merged ([`crate::coalesce`]). So the host's memory stays within its own
/// (what it holds with no tree) and this many times the sum of its scanners' limits, and
/// [`CDI_HELD_PER_SCANNER`] more for those with CDI specs.
pub const HELD_PER_SCANNER: u64 = 6;

/// What a scanner with CDI specs (`cdi:`) adds to [`HELD_PER_SCANNER`]: the CDI writer keeps
/// what it wrote of each group to know when a spec changes (a copy of the served group without
/// attributes: at most the served tree), and makes the new one beside the old when it rewrites
/// one ([`crate::cdi`]).
pub const CDI_HELD_PER_SCANNER: u64 = 2;

/// A healthy device with nothing attached, as a guest notifies it: what the tests of both forms
/// fill trees with.
#[cfg(test)]
pub(crate) fn bare_device(id: &str) -> wit::Device {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_headers_and_rounded_allocations() {
        assert_eq!((heap(0), heap(1), heap(24), heap(25)), (0, 32, 32, 48));
        let empty = lifted_bytes(&[], &[]);
        let tree = vec![wit::DeviceGroup {
            dev_type: "gpu".into(),
            devices: (0..1000).map(|i| bare_device(&format!("d{i}"))).collect(),
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
}
