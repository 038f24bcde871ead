//! What a notified tree costs the host's memory as lifted from the guest, charged against the
//! guest's own memory limit.
//!
//! A guest's tree is lifted out of its linear memory into host `String`s and `Vec`s before the
//! host sees it, and the host form of many small strings is larger than the guest's (a header of
//! 24 bytes and an allocation of at least 32 bytes for a 6-byte id). Without a charge, what the
//! host holds for one guest's tree grows with how compactly the guest packs it, not with the
//! memory the guest is given. [`lifted_bytes`] estimates the host form; the sandbox charges the
//! same sums while it copies a notified tree out (`sandbox::lift`), stopping a guest whose tree
//! would exceed its memory limit (rule `tree-host-memory`) before the copy passes it, and
//! validation checks the estimate again, so each copy of a tree the host holds for a guest is at
//! most that guest's limit.

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
}
