//! ResourceSlices from the inventory: what the scheduler allocates from.
//!
//! One pool per scanner and node, `spec.nodeName` set; devices named by [`names::device_name`]
//! and sorted by name, at most [`MAX_DEVICES_PER_SLICE`] to a slice; unhealthy devices left out
//! (the scheduler must not allocate them; the health stream still reports them). Each device
//! carries the attributes the host knows first: `type` (the dev-type), `id` (the scanner's raw
//! id), `resource.kubernetes.io/numaNode`, `resource.kubernetes.io/pciBusID` and
//! `resource.kubernetes.io/pcieRoot` where known; then the guest's attributes and capacities as
//! long as they are valid and fit the API's 32 per device. `resource.kubernetes.io/*` is the
//! host's: a guest attribute there is dropped, as is one that would shadow the host's.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::names::{self, is_qualified_name, is_semver};
use crate::seam::{self, AttributeValue};

/// The API's limit of devices in one ResourceSlice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// The API's limit of attributes and capacities of one device, together.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// The API's limit of a string or version attribute value, in bytes.
pub const MAX_VALUE_LEN: usize = 64;
/// The attribute domain Kubernetes standardizes and the host alone fills.
pub const RESERVED_DOMAIN: &str = "resource.kubernetes.io";
/// The scanner's device type.
pub const ATTR_TYPE: &str = "type";
/// The scanner's raw device id (the device name is derived from it).
pub const ATTR_ID: &str = "id";
/// The NUMA node of the device.
pub const ATTR_NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
/// The PCI address of the device.
pub const ATTR_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// The PCIe root complex of the device.
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

fn string_attr(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_owned()),
        ..Default::default()
    }
}

/// `name` with the driver's domain applied when it has none: how the API tells attribute names
/// apart.
fn full_name(name: &str, driver: &str) -> String {
    if name.contains('/') {
        name.to_owned()
    } else {
        format!("{driver}/{name}")
    }
}

/// The published form of `device`.
pub fn device(driver: &str, device: &seam::Device) -> Device {
    let name = device.name();
    let mut attributes = BTreeMap::new();
    let mut put = |key: &str, value: DeviceAttribute| {
        attributes.insert(key.to_owned(), value);
    };
    if device.dev_type.len() <= MAX_VALUE_LEN {
        put(ATTR_TYPE, string_attr(&device.dev_type));
    }
    if device.id.len() <= MAX_VALUE_LEN {
        put(ATTR_ID, string_attr(&device.id));
    } else {
        tracing::warn!(device = %name, "device id longer than an attribute value may be; not published as one");
    }
    if let Some(numa) = device.numa_node {
        put(
            ATTR_NUMA_NODE,
            DeviceAttribute {
                int: Some(numa),
                ..Default::default()
            },
        );
    }
    if let Some(bus) = device
        .pci_bus_id
        .as_deref()
        .filter(|b| b.len() <= MAX_VALUE_LEN)
    {
        put(ATTR_PCI_BUS_ID, string_attr(bus));
    }
    if let Some(root) = device
        .pcie_root
        .as_deref()
        .filter(|r| r.len() <= MAX_VALUE_LEN)
    {
        put(ATTR_PCIE_ROOT, string_attr(root));
    }
    let mut taken: BTreeSet<String> = attributes.keys().map(|k| full_name(k, driver)).collect();
    let mut room = MAX_ATTRIBUTES_AND_CAPACITIES.saturating_sub(attributes.len());
    let mut dropped = Vec::new();
    for (key, value) in &device.attributes {
        let reserved = key
            .split_once('/')
            .is_some_and(|(domain, _)| domain == RESERVED_DOMAIN);
        let value = match value {
            AttributeValue::Bool(b) => Some(DeviceAttribute {
                bool: Some(*b),
                ..Default::default()
            }),
            AttributeValue::Int(i) => Some(DeviceAttribute {
                int: Some(*i),
                ..Default::default()
            }),
            AttributeValue::String(s) => (s.len() <= MAX_VALUE_LEN).then(|| string_attr(s)),
            AttributeValue::Version(v) => {
                (v.len() <= MAX_VALUE_LEN && is_semver(v)).then(|| DeviceAttribute {
                    version: Some(v.clone()),
                    ..Default::default()
                })
            }
        };
        match value {
            Some(value)
                if !reserved
                    && room > 0
                    && is_qualified_name(key)
                    && taken.insert(full_name(key, driver)) =>
            {
                attributes.insert(key.clone(), value);
                room -= 1;
            }
            _ => dropped.push(key.clone()),
        }
    }
    let mut capacity = BTreeMap::new();
    for (key, quantity) in &device.capacity {
        if room > 0 && is_qualified_name(key) && taken.insert(full_name(key, driver)) {
            capacity.insert(
                key.clone(),
                DeviceCapacity {
                    value: Quantity(quantity.clone()),
                    request_policy: None,
                },
            );
            room -= 1;
        } else {
            dropped.push(key.clone());
        }
    }
    if !dropped.is_empty() {
        tracing::warn!(device = %name, ?dropped, "attributes or capacities not published: reserved, invalid, shadowing the host's, or beyond 32");
    }
    Device {
        name,
        attributes: Some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        allow_multiple_allocations: device.allow_multiple_allocations.then_some(true),
        ..Default::default()
    }
}

/// The slices of `pool` for `driver` at pool generation `generation`: the healthy devices in
/// name order, [`MAX_DEVICES_PER_SLICE`] to a slice, and always at least one slice (an empty
/// pool is still published, so the scheduler knows it has nothing rather than not hearing of
/// it). A device whose name another device of the pool already has is left out (two ids that
/// are the same once sanitized and hashed: not expected, but never an invalid slice).
pub fn pool_slices(driver: &str, pool: &seam::Pool, generation: i64) -> Vec<ResourceSlice> {
    let mut devices: BTreeMap<String, Device> = BTreeMap::new();
    for d in pool.devices.iter().filter(|d| d.healthy) {
        let published = device(driver, d);
        if devices.contains_key(&published.name) {
            tracing::warn!(pool = %pool.name, device = %published.name, id = %d.id, "two devices with one name; the second is not published");
            continue;
        }
        devices.insert(published.name.clone(), published);
    }
    let devices: Vec<Device> = devices.into_values().collect();
    let chunks: Vec<Vec<Device>> = if devices.is_empty() {
        vec![Vec::new()]
    } else {
        devices
            .chunks(MAX_DEVICES_PER_SLICE)
            .map(<[Device]>::to_vec)
            .collect()
    };
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);
    chunks
        .into_iter()
        .enumerate()
        .map(|(index, devices)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(names::slice_name(
                    &pool.node_name,
                    driver,
                    &pool.name,
                    index,
                )),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: driver.to_owned(),
                node_name: Some(pool.node_name.clone()),
                pool: ResourcePool {
                    name: pool.name.clone(),
                    generation,
                    resource_slice_count: count,
                },
                devices: Some(devices),
                ..Default::default()
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::standin::validate;

    fn dev(id: &str) -> seam::Device {
        seam::Device {
            id: id.into(),
            dev_type: "gpu".into(),
            healthy: true,
            ..Default::default()
        }
    }

    #[test]
    fn attributes_are_the_hosts_first_and_the_guests_within_the_rules() {
        let mut d = dev("GPU0");
        d.numa_node = Some(1);
        d.pci_bus_id = Some("0000:3b:00.0".into());
        d.pcie_root = Some("pci0000:3a".into());
        d.attributes
            .insert("model".into(), AttributeValue::String("A100".into()));
        d.attributes.insert(
            "resource.kubernetes.io/numaNode".into(),
            AttributeValue::Int(7),
        );
        d.attributes.insert(
            "gpu.example.com/type".into(),
            AttributeValue::String("x".into()),
        );
        d.attributes
            .insert("bad-name".into(), AttributeValue::Bool(true));
        d.attributes.insert(
            "driverVersion".into(),
            AttributeValue::Version("1.2".into()),
        );
        d.attributes
            .insert("firmware".into(), AttributeValue::Version("1.2.3".into()));
        d.capacity.insert("memory".into(), "16Gi".into());
        for i in 0..40 {
            d.attributes
                .insert(format!("zextra{i:02}"), AttributeValue::Int(i));
        }
        let published = device("gpu.example.com", &d);
        let attrs = published.attributes.as_ref().unwrap();
        assert_eq!(attrs[ATTR_TYPE].string.as_deref(), Some("gpu"));
        assert_eq!(attrs[ATTR_ID].string.as_deref(), Some("GPU0"));
        assert_eq!(
            attrs[ATTR_NUMA_NODE].int,
            Some(1),
            "the host's NUMA node, not the guest's"
        );
        assert_eq!(
            attrs[ATTR_PCI_BUS_ID].string.as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(attrs[ATTR_PCIE_ROOT].string.as_deref(), Some("pci0000:3a"));
        assert_eq!(attrs["model"].string.as_deref(), Some("A100"));
        assert_eq!(attrs["firmware"].version.as_deref(), Some("1.2.3"));
        for gone in ["gpu.example.com/type", "bad-name", "driverVersion"] {
            assert!(!attrs.contains_key(gone), "{gone}");
        }
        let total = attrs.len() + published.capacity.as_ref().map_or(0, BTreeMap::len);
        assert_eq!(total, MAX_ATTRIBUTES_AND_CAPACITIES);
        assert!(published.name.starts_with("gpu0-"));

        let pool = seam::Pool {
            name: "node-a".into(),
            node_name: "node-a".into(),
            devices: vec![d],
        };
        for slice in pool_slices("gpu.example.com", &pool, 3) {
            assert_eq!(validate(&slice), Vec::<String>::new());
        }
    }

    #[test]
    fn large_pools_split_and_unhealthy_devices_stay_out() {
        let mut devices: Vec<_> = (0..300).map(|i| dev(&format!("dev-{i:03}"))).collect();
        devices[5].healthy = false;
        let pool = seam::Pool {
            name: "node-a".into(),
            node_name: "node-a".into(),
            devices,
        };
        let slices = pool_slices("gpu.example.com", &pool, 0);
        let sizes: Vec<_> = slices
            .iter()
            .map(|s| s.spec.devices.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, [128, 128, 43]);
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 3));
        assert!(
            !slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .any(|d| d.name == "dev-005")
        );
        let empty = seam::Pool {
            name: "p".into(),
            node_name: "node-a".into(),
            devices: vec![],
        };
        let slices = pool_slices("gpu.example.com", &empty, 0);
        assert_eq!(slices.len(), 1);
        assert_eq!(validate(&slices[0]), Vec::<String>::new());
    }
}
