//! What the host feeds the DRA front-end: the devices of each pool this driver serves on this
//! node, as the scanner's validated tree and the host's own derivations (NUMA node, PCI
//! placement, CDI specs) give them.
//!
//! The host owns a [`tokio::sync::watch`] channel of [`Inventory`] and sends a new value whenever
//! a scan changes a tree or a device's health; the ResourceSlice publisher, the DRAPlugin service
//! and the health stream all read the latest value. The host writes the CDI specs before it sends
//! the inventory that names them, so a claim prepared from an inventory never points the runtime
//! at a spec that is not on disk yet.

use std::collections::BTreeMap;

use crate::names;

/// Everything one DRA driver serves on one node: one pool per scanner.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inventory {
    /// The pools, each published as its own ResourceSlices.
    pub pools: Vec<Pool>,
}

/// One resource pool: the devices one scanner found on one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pool {
    /// The pool name in the ResourceSlices; the scheduler's allocation results name it back.
    pub name: String,
    /// The node the devices are on (`spec.nodeName` of the slices).
    pub node_name: String,
    /// The devices, healthy or not: unhealthy ones are kept out of the slices but still reported
    /// on the health stream.
    pub devices: Vec<Device>,
}

/// One device of a pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Device {
    /// The scanner's id of the device; the published device name is derived from it
    /// ([`names::device_name`]) and the raw id kept as an attribute.
    pub id: String,
    /// The scanner's device type (`<namespace>/<dev-type>` is what the device-plugin front-end
    /// would advertise); published as an attribute, the key of DeviceClass selectors.
    pub dev_type: String,
    /// Whether the device may be allocated; unhealthy devices are not published.
    pub healthy: bool,
    /// Why the device is unhealthy, for the health stream; empty when healthy.
    pub health_message: String,
    /// The NUMA node of the device, from the host's sysfs derivation.
    pub numa_node: Option<i64>,
    /// The PCI address (`0000:3b:00.0`) where sysfs gives one.
    pub pci_bus_id: Option<String>,
    /// The PCIe root complex (`pci0000:3a`) where sysfs gives one.
    pub pcie_root: Option<String>,
    /// The guest's own attributes; names in `resource.kubernetes.io/` are the host's and are
    /// dropped, invalid ones too (see [`crate::slices`]).
    pub attributes: BTreeMap<String, AttributeValue>,
    /// The guest's capacities, as Kubernetes quantities (`"16Gi"`, `"4"`).
    pub capacity: BTreeMap<String, String>,
    /// The fully qualified CDI device names (`vendor.example/class=name`) the host wrote the
    /// specs of: what a prepared claim hands the runtime.
    pub cdi_device_ids: Vec<String>,
    /// The device may be allocated to several claims at once (`allowMultipleAllocations`).
    pub allow_multiple_allocations: bool,
    /// Why a claim holding the device cannot be prepared now (its CDI spec could not be
    /// written): Prepare fails for that claim with this reason, and kubelet retries it. None
    /// when it can.
    pub unavailable: Option<String>,
}

impl Device {
    /// The name the device is published under in its pool.
    pub fn name(&self) -> String {
        names::device_name(&self.id)
    }
}

/// A typed attribute value, the four kinds `resource.k8s.io/v1` knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttributeValue {
    /// A boolean.
    Bool(bool),
    /// A 64-bit integer.
    Int(i64),
    /// A string of at most 64 bytes.
    String(String),
    /// A semantic version (semver 2.0.0) of at most 64 bytes.
    Version(String),
}

impl Inventory {
    /// The device published as `device` in pool `pool`, if this inventory has it.
    pub fn device(&self, pool: &str, device: &str) -> Option<&Device> {
        self.pools
            .iter()
            .filter(|p| p.name == pool)
            .flat_map(|p| p.devices.iter())
            .find(|d| d.name() == device)
    }
}
