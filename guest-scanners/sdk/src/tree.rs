//! Building device trees: a builder on [`DeviceInfo`], a [`TreeBuilder`] and device-id helpers.
//!
//! Why: the WIT records have seven fields each and most devices use two of them; the builder
//! keeps scanners to one line per device with the right defaults (healthy, NUMA nodes left to the
//! host), and the tree builder groups devices by type, keeps their order stable and refuses
//! duplicate ids, so that the host's tree diffing sees no spurious changes.

use std::collections::HashSet;

use crate::types::{
    AttributeValue, Device, DeviceAttributes, DeviceGroup, DeviceInfo, DeviceSpec, DeviceTree,
    Health, Mount,
};

impl Default for DeviceInfo {
    fn default() -> Self {
        DeviceInfo::new()
    }
}

impl DeviceInfo {
    /// A healthy device with nothing attached; `numa-nodes` none (the host derives NUMA nodes
    /// from sysfs for the nodes' host paths).
    pub fn new() -> Self {
        DeviceInfo {
            health: Health::Healthy,
            nodes: Vec::new(),
            mounts: Vec::new(),
            envs: Vec::new(),
            annotations: Vec::new(),
            numa_nodes: None,
            cdi_devices: Vec::new(),
        }
    }

    /// Adds a device node: `host_path` (under /dev) appears at `container_path` in the container
    /// with cgroup `permissions` (any of "r", "w", "m", e.g. "rw").
    pub fn node(
        mut self,
        host_path: impl Into<String>,
        container_path: impl Into<String>,
        permissions: impl Into<String>,
    ) -> Self {
        self.nodes.push(DeviceSpec {
            host_path: host_path.into(),
            container_path: container_path.into(),
            permissions: permissions.into(),
        });
        self
    }

    /// Adds a bind mount of `host_path` at `container_path`.
    pub fn mount(
        mut self,
        host_path: impl Into<String>,
        container_path: impl Into<String>,
        read_only: bool,
    ) -> Self {
        self.mounts.push(Mount {
            host_path: host_path.into(),
            container_path: container_path.into(),
            read_only,
        });
        self
    }

    /// Adds an environment variable for the container.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Adds an annotation for the container runtime.
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.push((key.into(), value.into()));
        self
    }

    /// Adds a fully qualified CDI device name, e.g. "vendor.example/class=name".
    pub fn cdi_device(mut self, name: impl Into<String>) -> Self {
        self.cdi_devices.push(name.into());
        self
    }

    /// Sets the NUMA nodes explicitly (instead of letting the host derive them).
    pub fn numa_nodes(mut self, nodes: impl Into<Vec<u32>>) -> Self {
        self.numa_nodes = Some(nodes.into());
        self
    }

    /// Sets the health.
    pub fn health(mut self, health: Health) -> Self {
        self.health = health;
        self
    }

    /// Marks the device unhealthy (kubelet will not allocate it).
    pub fn unhealthy(self) -> Self {
        self.health(Health::Unhealthy)
    }
}

/// Collects devices into a [`DeviceTree`]: groups in order of first use, devices in order of
/// addition, at most one device per id within a group.
#[derive(Debug, Default, Clone)]
pub struct TreeBuilder {
    groups: Vec<DeviceGroup>,
    /// The hashes of the ids in each group (same index as `groups`), so `add` stays linear in
    /// the number of devices: a scan of 10,000 devices spent a second comparing ids before.
    /// Hashes rather than ids: no copy of every id; a hash seen before is confirmed against the
    /// group's devices, so a collision costs a scan of the group, never a lost device. Rebuilt
    /// when a group was changed through [`TreeBuilder::group`]'s `&mut` (its length no longer
    /// matches).
    ids: Vec<HashSet<u64>>,
}

/// FNV-1a of an id: [`TreeBuilder`]'s duplicate check. Not keyed: a guest's ids are its own, and
/// a collision only costs a scan of one group.
fn id_hash(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl TreeBuilder {
    /// An empty tree: one per scan.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes sure the group `dev_type` exists, even if it gets no devices (the resource is then
    /// advertised with zero devices rather than not at all).
    pub fn group(&mut self, dev_type: &str) -> &mut DeviceGroup {
        let i = self.index(dev_type);
        &mut self.groups[i]
    }

    fn index(&mut self, dev_type: &str) -> usize {
        match self.groups.iter().position(|g| g.dev_type == dev_type) {
            Some(i) => i,
            None => {
                self.groups.push(DeviceGroup {
                    dev_type: dev_type.to_string(),
                    devices: Vec::new(),
                });
                self.ids.push(HashSet::new());
                self.groups.len() - 1
            }
        }
    }

    /// Adds device `id` of type `dev_type`. Returns false, and keeps the first one, when the
    /// group already has a device with that id.
    pub fn add(&mut self, dev_type: &str, id: impl Into<String>, info: DeviceInfo) -> bool {
        let id = id.into();
        let i = self.index(dev_type);
        let (group, ids) = (&mut self.groups[i], &mut self.ids[i]);
        if ids.len() != group.devices.len() {
            *ids = group.devices.iter().map(|d| id_hash(&d.id)).collect();
        }
        if !ids.insert(id_hash(&id)) && group.devices.iter().any(|d| d.id == id) {
            return false;
        }
        group.devices.push(Device { id, info });
        true
    }

    /// Adds `count` devices sharing one `info`, with ids `<base>-0` .. `<base>-<count-1>` (see
    /// [`slot_ids`]): the way to let one physical device be allocated to several containers.
    pub fn add_shared(&mut self, dev_type: &str, base: &str, count: u32, info: DeviceInfo) {
        for id in slot_ids(base, count) {
            self.add(dev_type, id, info.clone());
        }
    }

    /// True when no group was added.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The tree.
    pub fn build(self) -> DeviceTree {
        self.groups
    }
}

/// True for a name kubelet accepts as the part of a resource name after the `/` (1-63 of
/// letters, digits, `-`, `_`, `.`, starting and ending with a letter or digit): for scanners whose
/// device types come from configuration, so a bad name fails at start with the variable named
/// rather than as a refused tree.
pub fn is_dev_type(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| is_id_char(c))
}

/// True for a byte that device ids and device type names are made of: an ASCII letter or digit,
/// `.`, `_` or `-`. Why: [`sanitize_id`] keeps exactly these and replaces every other character,
/// so a scanner that makes ids from names can tell whether a name survives as it is.
pub fn is_id_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-')
}

/// `<base>-0` .. `<base>-<count-1>`.
pub fn slot_ids(base: &str, count: u32) -> Vec<String> {
    (0..count).map(|i| format!("{base}-{i}")).collect()
}

/// Every device of `tree` as `<type>/<id>`, in tree order. Why: what kubelet sees of a tree is
/// its resources and their device ids, so a scanner's tests compare a scan with this list.
pub fn type_ids(tree: &[DeviceGroup]) -> Vec<String> {
    tree.iter()
        .flat_map(|g| {
            g.devices
                .iter()
                .map(move |d| format!("{}/{}", g.dev_type, d.id))
        })
        .collect()
}

/// Makes `s` a conservative device id: ASCII letters, digits, `.`, `_` and `-` are kept, every
/// other character becomes `_` (an empty string becomes `_`).
pub fn sanitize_id(s: &str) -> String {
    if s.is_empty() {
        return "_".into();
    }
    // Paths are ASCII but for odd names: byte for byte, in one allocation of the final size (a
    // scan of 1,000 devices makes 1,000 ids inside wasm, where decoding and pushing each
    // character one by one was a fifteenth of the scan).
    if s.is_ascii() {
        let bytes = s
            .bytes()
            .map(|c| if is_id_char(c) { c } else { b'_' })
            .collect();
        // Always Ok: ASCII bytes, some replaced by another ASCII byte.
        if let Ok(id) = String::from_utf8(bytes) {
            return id;
        }
    }
    s.chars()
        .map(|c| {
            if c.is_ascii() && is_id_char(c as u8) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A readable, stable device id for a node path: the path below /dev (or below / elsewhere) with
/// `/` turned into `_`, sanitized by [`sanitize_id`]: `/dev/ttyUSB0` -> `ttyUSB0`,
/// `/dev/bus/usb/001/004` -> `bus_usb_001_004`, `/sys/class/x` -> `sys_class_x`.
pub fn id_from_path(path: &str) -> String {
    let rel = path
        .strip_prefix("/dev/")
        .unwrap_or_else(|| path.trim_start_matches('/'));
    // `/` is not an id character: sanitizing turns it into `_` already.
    sanitize_id(rel)
}

/// Typed attributes and capacities of one device, for [`crate::scan::notify_with_attributes`]:
/// `attributes("gpu", "card0").text("model", "A100").capacity("memory", "80Gi").build()`.
///
/// Why a builder: the WIT record is lists of tuples of variants, wordy to write by hand; the
/// host checks the names and values (qualified names, at most 32 per device, strings and
/// versions at most 64 characters, no `resource.kubernetes.io/` names) and refuses the whole
/// tree on a broken rule, naming the device, the attribute and the rule.
pub fn attributes(dev_type: &str, id: &str) -> AttributesBuilder {
    AttributesBuilder(DeviceAttributes {
        dev_type: dev_type.to_string(),
        id: id.to_string(),
        attributes: Vec::new(),
        capacities: Vec::new(),
    })
}

/// See [`attributes`].
#[derive(Debug, Clone)]
pub struct AttributesBuilder(DeviceAttributes);

impl AttributesBuilder {
    fn with(mut self, name: &str, value: AttributeValue) -> Self {
        self.0.attributes.push((name.to_string(), value));
        self
    }
    /// A boolean attribute.
    pub fn bool(self, name: &str, value: bool) -> Self {
        self.with(name, AttributeValue::Boolean(value))
    }
    /// An integer attribute.
    pub fn int(self, name: &str, value: i64) -> Self {
        self.with(name, AttributeValue::Int(value))
    }
    /// A string attribute (at most 64 characters).
    pub fn text(self, name: &str, value: &str) -> Self {
        self.with(name, AttributeValue::Text(value.to_string()))
    }
    /// A semantic-version attribute (semver 2.0, e.g. "1.2.3").
    pub fn version(self, name: &str, value: &str) -> Self {
        self.with(name, AttributeValue::Version(value.to_string()))
    }
    /// A capacity, as a Kubernetes quantity ("80Gi", "2").
    pub fn capacity(mut self, name: &str, quantity: &str) -> Self {
        self.0
            .capacities
            .push((name.to_string(), quantity.to_string()));
        self
    }
    /// The record for `notify-with-attributes`.
    pub fn build(self) -> DeviceAttributes {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_types_are_kubelet_resource_names() {
        assert!(is_dev_type("serial") && is_dev_type("a.b-c_d9") && is_dev_type(&"a".repeat(63)));
        for bad in ["", "-a", "a-", "a/b", "a b"] {
            assert!(!is_dev_type(bad), "{bad:?}");
        }
        assert!(!is_dev_type(&"a".repeat(64)));
    }

    #[test]
    fn device_info_builder() {
        let info = DeviceInfo::new()
            .node("/dev/kvm", "/dev/kvm", "rw")
            .mount("/sys/x", "/x", true)
            .env("A", "1")
            .annotation("k", "v")
            .cdi_device("vendor.example/class=a");
        assert_eq!(info.health, Health::Healthy);
        assert_eq!(info.numa_nodes, None);
        assert_eq!(info.nodes[0].host_path, "/dev/kvm");
        assert_eq!(info.nodes[0].permissions, "rw");
        assert!(info.mounts[0].read_only);
        assert_eq!(info.envs, [("A".to_string(), "1".to_string())]);
        assert_eq!(info.cdi_devices.len(), 1);
        let sick = DeviceInfo::default().unhealthy().numa_nodes([0, 1]);
        assert_eq!(sick.health, Health::Unhealthy);
        assert_eq!(sick.numa_nodes, Some(vec![0, 1]));
    }

    #[test]
    fn tree_builder_groups_and_dedups() {
        let mut t = TreeBuilder::new();
        assert!(t.is_empty());
        assert!(t.add("a", "x", DeviceInfo::new()));
        assert!(t.add("b", "x", DeviceInfo::new()));
        assert!(t.add("a", "y", DeviceInfo::new()));
        assert!(!t.add("a", "x", DeviceInfo::new().unhealthy()));
        t.group("empty");
        t.add_shared("kvm", "kvm", 3, DeviceInfo::new());
        let tree = t.build();
        let types: Vec<&str> = tree.iter().map(|g| g.dev_type.as_str()).collect();
        assert_eq!(types, ["a", "b", "empty", "kvm"]);
        let a: Vec<&str> = tree[0].devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(a, ["x", "y"]);
        assert_eq!(tree[0].devices[0].info.health, Health::Healthy);
        assert!(tree[2].devices.is_empty());
        let k: Vec<&str> = tree[3].devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(k, ["kvm-0", "kvm-1", "kvm-2"]);
    }

    #[test]
    fn a_hash_collision_keeps_both_devices() {
        let mut t = TreeBuilder::new();
        assert!(t.add("a", "x", DeviceInfo::new()));
        // As if "z" hashed like "x": its hash is already there, but no device has its id.
        t.ids[0] = HashSet::from([id_hash("z")]);
        assert!(
            t.add("a", "z", DeviceInfo::new()),
            "a collision is not a duplicate"
        );
        assert!(!t.add("a", "x", DeviceInfo::new()), "a duplicate still is");
        assert!(!t.add("a", "z", DeviceInfo::new()));
        let ids: Vec<&str> = t.groups[0].devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["x", "z"]);
    }

    #[test]
    fn tree_builder_sees_devices_pushed_through_group() {
        let mut t = TreeBuilder::new();
        assert!(t.add("a", "x", DeviceInfo::new()));
        t.group("a").devices.push(Device {
            id: "y".into(),
            info: DeviceInfo::new(),
        });
        assert!(!t.add("a", "y", DeviceInfo::new()), "pushed id is known");
        assert!(t.add("a", "z", DeviceInfo::new()));
        let tree = t.build();
        let ids: Vec<String> = tree[0].devices.iter().map(|d| d.id.clone()).collect();
        assert_eq!(ids, ["x", "y", "z"]);
        assert_eq!(type_ids(&tree), ["a/x", "a/y", "a/z"]);
    }

    #[test]
    fn ids() {
        assert_eq!(slot_ids("tun", 2), ["tun-0", "tun-1"]);
        assert!(slot_ids("tun", 0).is_empty());
        assert_eq!(id_from_path("/dev/ttyUSB0"), "ttyUSB0");
        assert_eq!(id_from_path("/dev/bus/usb/001/004"), "bus_usb_001_004");
        assert_eq!(id_from_path("/sys/class/x"), "sys_class_x");
        assert_eq!(
            id_from_path("/dev/serial/by-path/pci-0000:00:14.0-usb-0:1:1.0"),
            "serial_by-path_pci-0000_00_14.0-usb-0_1_1.0"
        );
        assert_eq!(sanitize_id(""), "_");
        assert_eq!(sanitize_id("a b+c"), "a_b_c");
        assert_eq!(
            sanitize_id("né/x"),
            "n__x",
            "one `_` a character, not a byte"
        );
    }
}
