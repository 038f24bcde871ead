//! The host's own model of a device tree.
//!
//! Guests hand the host WIT records (`wdp:device-plugin/types`); those are untrusted. This module is
//! the only place they become host data: [`DeviceTree::from_guest`] checks every rule a kubelet
//! resource depends on and refuses the whole tree on the first broken one, naming the rule and the
//! offending value. Everything downstream (printing, the manager, the kubelet servers) only ever
//! sees a validated [`DeviceTree`].

use imbl::ordmap::Entry;
use std::collections::BTreeMap;

use serde::Serialize;

use crate::bindings::types as wit;
use wdp_kubelet::names::is_dev_type;

pub mod attributes;
pub mod charge;

pub use attributes::{AttributeError, AttributeRule, AttributeValue, Attributes, Named};
use charge::Budget;

/// A device's health, as kubelet spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Health {
    /// Usable: kubelet may allocate it.
    Healthy,
    /// Listed but not allocatable.
    Unhealthy,
}

impl Health {
    /// The string kubelet's API uses (`"Healthy"` / `"Unhealthy"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "Healthy",
            Health::Unhealthy => "Unhealthy",
        }
    }
}

/// A device node given to a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceSpec {
    /// Where the container sees it.
    pub container_path: String,
    /// The node on the host, under `/dev`.
    pub host_path: String,
    /// cgroup access: a combination of `r`, `w`, `m`.
    pub permissions: String,
}

/// A bind mount given to a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mount {
    /// Where the container sees it.
    pub container_path: String,
    /// The host path.
    pub host_path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// Everything needed to serve and allocate one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    /// Whether kubelet may allocate it.
    pub health: Health,
    /// Device nodes given to a container.
    pub nodes: Vec<DeviceSpec>,
    /// Bind mounts given to a container.
    pub mounts: Vec<Mount>,
    /// Sorted by key: env names are unique per device.
    pub envs: BTreeMap<String, String>,
    /// Annotations, sorted by key.
    pub annotations: BTreeMap<String, String>,
    /// `None`: the guest left topology to the host.
    pub numa_nodes: Option<Vec<u32>>,
    /// Fully qualified CDI device names.
    pub cdi_devices: Vec<String>,
    /// Typed attributes and capacities from `notify-with-attributes`, for front-ends that
    /// publish them (DRA); the device-plugin servers ignore them.
    #[serde(skip_serializing_if = "Attributes::is_empty")]
    pub attributes: Attributes,
}

impl Default for DeviceInfo {
    /// A healthy device with nothing attached; topology left to the host.
    fn default() -> Self {
        DeviceInfo {
            health: Health::Healthy,
            nodes: Vec::new(),
            mounts: Vec::new(),
            envs: BTreeMap::new(),
            annotations: BTreeMap::new(),
            numa_nodes: None,
            cdi_devices: Vec::new(),
            attributes: Attributes::default(),
        }
    }
}

/// All devices of one type, keyed (and so ordered) by device id.
///
/// A persistent map: a group patched with one changed device shares every other device with the
/// group it came from, so the copies the host hands on (to the servers, to the manager, the
/// tree kept for a guest's next changes) cost the change, not the 10,000 devices of a large
/// group, and so does dropping the group an update replaced.
pub type DeviceGroup = imbl::OrdMap<String, DeviceInfo>;

/// A whole validated inventory: dev-type -> device id -> info.
///
/// Ordered maps make equality, diffing and printed output deterministic, which guests' list order
/// is not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct DeviceTree(pub BTreeMap<String, DeviceGroup>);

/// Why what a guest returned was refused: a notified tree, or a hook's answer (post-allocate
/// responses follow the same rules). Each variant names the rule; the `value` is the offending
/// input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputError {
    #[error(
        "dev-type {value:?} is invalid: it must be 1-63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric"
    )]
    /// A dev-type that is not a qualified name part.
    DevType {
        /// The offending value, as given.
        value: String,
    },
    #[error("dev-type {value:?} appears more than once in one tree")]
    /// A dev-type given twice.
    DuplicateDevType {
        /// The offending value, as given.
        value: String,
    },
    #[error(
        "device id {value:?} in dev-type {dev_type:?} is invalid: it must be 1-63 characters with no control characters"
    )]
    /// A device id that is empty, too long or has control characters.
    DeviceId {
        /// The device type it is in.
        dev_type: String,
        /// The offending value, as given.
        value: String,
    },
    #[error("device id {value:?} appears more than once in dev-type {dev_type:?}")]
    /// A device id given twice in a group.
    DuplicateDeviceId {
        /// The device type it is in.
        dev_type: String,
        /// The offending value, as given.
        value: String,
    },
    #[error(
        "{what} {value:?} of {owner} must be an absolute, normalised path (no '..', '.' or '//')"
    )]
    /// A path that is not absolute and plain.
    Path {
        /// Where the value is: the device or group, as the message names it.
        owner: String,
        /// Which of the owner's values it is.
        what: &'static str,
        /// The offending value, as given.
        value: String,
    },
    #[error("device node {value:?} of {owner} must be under /dev")]
    /// A device node outside `/dev`.
    NodeOutsideDev {
        /// Where the value is: the device or group, as the message names it.
        owner: String,
        /// The offending value, as given.
        value: String,
    },
    #[error("permissions {value:?} of {owner} may only contain 'r', 'w' and 'm', each once")]
    /// Permissions other than `r`, `w`, `m`.
    Permissions {
        /// Where the value is: the device or group, as the message names it.
        owner: String,
        /// The offending value, as given.
        value: String,
    },
    #[error("env {value:?} of {owner} is not a valid name ([A-Za-z_][A-Za-z0-9_]*)")]
    /// An environment variable name that is not one.
    EnvName {
        /// Where the value is: the device or group, as the message names it.
        owner: String,
        /// The offending value, as given.
        value: String,
    },
    #[error("{what} {value:?} of {owner} is set twice")]
    /// A key given twice.
    DuplicateKey {
        /// Where the value is: the device or group, as the message names it.
        owner: String,
        /// Which of the owner's values it is.
        what: &'static str,
        /// The offending value, as given.
        value: String,
    },
    #[error(
        "annotation key {value:?} of {owner} is not a Kubernetes annotation key ([prefix/]name: a DNS subdomain prefix of at most 253 characters, a name of 1-63 of [A-Za-z0-9-_.] starting and ending alphanumeric)"
    )]
    /// An annotation key that is not a qualified name.
    AnnotationKey {
        /// Where the value is: the device or group, as the message names it.
        owner: String,
        /// The offending value, as given.
        value: String,
    },
    #[error("CDI device {value:?} of {owner} is not fully qualified (vendor.example/class=name)")]
    /// A CDI name that is not fully qualified.
    CdiName {
        /// Where the value is: the device or group, as the message names it.
        owner: String,
        /// The offending value, as given.
        value: String,
    },
    #[error("{count} device types; the policy allows at most {max}")]
    /// More device types than the policy allows.
    TooManyTypes {
        /// How many types the tree has.
        count: usize,
        /// The limit it exceeds.
        max: usize,
    },
    #[error("{count} devices in dev-type {dev_type:?}; the policy allows at most {max}")]
    /// More devices in a group than the policy allows.
    TooManyDevices {
        /// The device type it is in.
        dev_type: String,
        /// How many there are.
        count: usize,
        /// The limit it exceeds.
        max: usize,
    },
    #[error("a string of {owner} ({start:?}...) is {len} bytes; the policy allows at most {max}")]
    /// A string longer than the policy allows.
    StringTooLong {
        /// Where the value is: the device or group, as the message names it.
        owner: String,
        /// The value's first characters.
        start: String,
        /// Its length in bytes.
        len: usize,
        /// The limit it exceeds.
        max: usize,
    },
    #[error(
        "the tree would hold more than {bytes} bytes of host memory as {form}, more than the scanner's memory limit of {max} bytes charged for it (send fewer or smaller devices, or raise limits.memory)"
    )]
    /// A tree whose host form is larger than its guest's memory limit allows
    /// ([`crate::footprint`]).
    TreeHostMemory {
        /// The estimate of its host form, in bytes (when it was refused: at least this much).
        bytes: usize,
        /// The guest's memory limit, in bytes.
        max: usize,
        /// Which form: `lifted` or `validated`.
        form: &'static str,
    },
    #[error("the strings of the tree exceed {max} bytes, the policy's limit")]
    /// A tree larger than the policy allows.
    TreeTooLarge {
        /// The limit, in bytes.
        max: usize,
    },
    #[error(
        "dev-type {value:?} is longer than {max} characters: its socket path would not fit (shorten the dev-type, the namespace or the plugin directory)"
    )]
    /// A dev-type too long for a socket path.
    DevTypeTooLong {
        /// The offending value, as given.
        value: String,
        /// The longest that fits.
        max: usize,
    },
    #[error("device node {value:?} of {owner} does not exist in the dev root: {cause}")]
    /// A device node that does not exist in the dev root.
    NodeMissing {
        /// Where the value is: the device or group, as the message names it.
        owner: String,
        /// The offending value, as given.
        value: String,
        /// Why, in words.
        cause: String,
    },
    #[error(
        "mount of host path {value:?} by {owner} is not allowed: add it (or a parent) to the scanner's policy.allowed-mounts"
    )]
    /// A mount outside the allowed paths.
    MountNotAllowed {
        /// Where the value is: the device or group, as the message names it.
        owner: String,
        /// The offending value, as given.
        value: String,
    },
    #[error(transparent)]
    /// A typed attribute or capacity broke one of the Kubernetes API's rules.
    Attribute(#[from] AttributeError),
    #[error(
        "changes were notified, but the host holds no accepted tree for them to apply to (notify the whole tree)"
    )]
    /// Changes (`notify-changes`) with no accepted tree to apply them to.
    ChangesWithoutTree,
}

impl OutputError {
    /// The rule that was broken, as a short stable name (for logs and counters).
    pub fn rule(&self) -> &'static str {
        match self {
            OutputError::DevType { .. } => "dev-type",
            OutputError::DuplicateDevType { .. } => "unique-dev-type",
            OutputError::DeviceId { .. } => "device-id",
            OutputError::DuplicateDeviceId { .. } => "unique-device-id",
            OutputError::Path { .. } => "normalised-path",
            OutputError::NodeOutsideDev { .. } => "node-under-dev",
            OutputError::Permissions { .. } => "permissions",
            OutputError::EnvName { .. } => "env-name",
            OutputError::DuplicateKey { .. } => "unique-key",
            OutputError::AnnotationKey { .. } => "annotation-key",
            OutputError::CdiName { .. } => "cdi-name",
            OutputError::TooManyTypes { .. } => "max-types",
            OutputError::TooManyDevices { .. } => "max-devices-per-type",
            OutputError::StringTooLong { .. } => "max-string-bytes",
            OutputError::TreeTooLarge { .. } => "max-tree-bytes",
            OutputError::TreeHostMemory { .. } => "tree-host-memory",
            OutputError::DevTypeTooLong { .. } => "dev-type-length",
            OutputError::NodeMissing { .. } => "node-exists",
            OutputError::MountNotAllowed { .. } => "allowed-mounts",
            OutputError::Attribute(e) => e.rule.name(),
            OutputError::ChangesWithoutTree => "changes-apply-to-a-tree",
        }
    }
}

impl DeviceTree {
    /// Validates and converts what a guest notified. The whole tree is refused on the first error.
    pub fn from_guest(groups: Vec<wit::DeviceGroup>) -> Result<Self, OutputError> {
        Self::from_guest_within(groups, &mut Budget::new(usize::MAX))
    }

    /// [`DeviceTree::from_guest`], each device charged to `budget` as it is made
    /// ([`charge`]): a tree whose validated form would pass it is refused before it
    /// does (rule `tree-host-memory`).
    pub fn from_guest_within(
        groups: Vec<wit::DeviceGroup>,
        budget: &mut Budget,
    ) -> Result<Self, OutputError> {
        let mut tree = BTreeMap::new();
        for group in groups {
            if !is_dev_type(&group.dev_type) {
                return Err(OutputError::DevType {
                    value: group.dev_type,
                });
            }
            let mut devices = DeviceGroup::new();
            for device in group.devices {
                if !is_device_id(&device.id) {
                    return Err(OutputError::DeviceId {
                        dev_type: group.dev_type,
                        value: device.id,
                    });
                }
                let info = DeviceInfo::from_guest(&device.id, device.info)?;
                let n = devices.len();
                budget.take(
                    charge::validated_device(&device.id, &info)
                        + charge::ordmap::<String, DeviceInfo>(n + 1, charge::BUILT)
                        - charge::ordmap::<String, DeviceInfo>(n, charge::BUILT),
                )?;
                match devices.entry(device.id) {
                    Entry::Vacant(slot) => {
                        slot.insert(info);
                    }
                    Entry::Occupied(taken) => {
                        return Err(OutputError::DuplicateDeviceId {
                            dev_type: group.dev_type,
                            value: taken.key().clone(),
                        });
                    }
                }
            }
            if tree.contains_key(&group.dev_type) {
                return Err(OutputError::DuplicateDevType {
                    value: group.dev_type,
                });
            }
            let n = tree.len();
            budget.take(
                crate::footprint::heap(group.dev_type.len())
                    + charge::btree::<String, DeviceGroup>(n + 1)
                    - charge::btree::<String, DeviceGroup>(n),
            )?;
            tree.insert(group.dev_type, devices);
        }
        Ok(DeviceTree(tree))
    }

    /// Validates the typed attributes a guest gave with this tree and keeps them on their
    /// devices; the tree is refused as a whole when one breaks a rule, as for any other rule.
    pub fn attach(&mut self, entries: Vec<wit::DeviceAttributes>) -> Result<(), OutputError> {
        self.attach_within(entries, &mut Budget::new(usize::MAX))
    }

    /// [`DeviceTree::attach`], each device's attributes charged to `budget` as they are kept.
    /// The entries are sorted in place, so an entry naming a device already given is the one
    /// before it: nothing is built beside the tree to find it.
    pub fn attach_within(
        &mut self,
        mut entries: Vec<wit::DeviceAttributes>,
        budget: &mut Budget,
    ) -> Result<(), OutputError> {
        entries.sort_unstable_by(|a, b| (&a.dev_type, &a.id).cmp(&(&b.dev_type, &b.id)));
        let mut last: Option<(String, String)> = None;
        for entry in entries {
            let has_device =
                |dev_type: &str, id: &str| self.0.get(dev_type).is_some_and(|g| g.contains_key(id));
            let (key, attrs) = attributes::validate_entry(entry, &has_device)?;
            if last.as_ref() == Some(&key) {
                return Err(attributes::duplicate(key).into());
            }
            budget.take(charge::attributes(&attrs))?;
            if let Some(info) = self.0.get_mut(&key.0).and_then(|g| g.get_mut(&key.1)) {
                info.attributes = attrs;
            }
            last = Some(key);
        }
        Ok(())
    }

    /// Number of devices over all types.
    pub fn device_count(&self) -> usize {
        self.0.values().map(DeviceGroup::len).sum()
    }
}

impl DeviceInfo {
    fn from_guest(id: &str, info: wit::DeviceInfo) -> Result<Self, OutputError> {
        // Only an error names the device: formatting it for each of 10,000 devices cost more
        // than the checks.
        let owner = &|| format!("device {id:?}");
        let numa_nodes = info.numa_nodes.map(|mut n| {
            n.sort_unstable();
            n.dedup();
            n
        });
        Ok(DeviceInfo {
            health: match info.health {
                wit::Health::Healthy => Health::Healthy,
                wit::Health::Unhealthy => Health::Unhealthy,
            },
            nodes: check_nodes(owner, info.nodes)?,
            mounts: check_mounts(owner, info.mounts)?,
            envs: check_envs(owner, info.envs)?,
            annotations: check_annotations(owner, info.annotations)?,
            numa_nodes,
            cdi_devices: check_cdi_names(owner, info.cdi_devices)?,
            attributes: Attributes::default(),
        })
    }
}

/// Device nodes: normalised absolute paths, host path under /dev, permissions from "rwm".
pub(crate) fn check_nodes(
    owner: &dyn Fn() -> String,
    nodes: Vec<wit::DeviceSpec>,
) -> Result<Vec<DeviceSpec>, OutputError> {
    nodes
        .into_iter()
        .map(|node| {
            check_path(owner, "container path", &node.container_path)?;
            check_path(owner, "host path", &node.host_path)?;
            if node.host_path != "/dev" && !node.host_path.starts_with("/dev/") {
                return Err(OutputError::NodeOutsideDev {
                    owner: owner(),
                    value: node.host_path,
                });
            }
            if !is_permissions(&node.permissions) {
                return Err(OutputError::Permissions {
                    owner: owner(),
                    value: node.permissions,
                });
            }
            Ok(DeviceSpec {
                container_path: node.container_path,
                host_path: node.host_path,
                permissions: node.permissions,
            })
        })
        .collect()
}

/// Mounts: normalised absolute paths on both sides.
pub(crate) fn check_mounts(
    owner: &dyn Fn() -> String,
    mounts: Vec<wit::Mount>,
) -> Result<Vec<Mount>, OutputError> {
    mounts
        .into_iter()
        .map(|mount| {
            check_path(owner, "mount container path", &mount.container_path)?;
            check_path(owner, "mount host path", &mount.host_path)?;
            Ok(Mount {
                container_path: mount.container_path,
                host_path: mount.host_path,
                read_only: mount.read_only,
            })
        })
        .collect()
}

/// Env names: POSIX names, each once.
pub(crate) fn check_envs(
    owner: &dyn Fn() -> String,
    envs: Vec<(String, String)>,
) -> Result<BTreeMap<String, String>, OutputError> {
    let mut out = BTreeMap::new();
    for (key, value) in envs {
        if !is_env_name(&key) {
            return Err(OutputError::EnvName {
                owner: owner(),
                value: key,
            });
        }
        if out.insert(key.clone(), value).is_some() {
            return Err(OutputError::DuplicateKey {
                owner: owner(),
                what: "env",
                value: key,
            });
        }
    }
    Ok(out)
}

/// Annotation keys: non-empty, bounded, each once.
pub(crate) fn check_annotations(
    owner: &dyn Fn() -> String,
    annotations: Vec<(String, String)>,
) -> Result<BTreeMap<String, String>, OutputError> {
    let mut out = BTreeMap::new();
    for (key, value) in annotations {
        if !is_annotation_key(&key) {
            return Err(OutputError::AnnotationKey {
                owner: owner(),
                value: key,
            });
        }
        if out.insert(key.clone(), value).is_some() {
            return Err(OutputError::DuplicateKey {
                owner: owner(),
                what: "annotation",
                value: key,
            });
        }
    }
    Ok(out)
}

/// CDI device names: fully qualified.
pub(crate) fn check_cdi_names(
    owner: &dyn Fn() -> String,
    names: Vec<String>,
) -> Result<Vec<String>, OutputError> {
    if let Some(bad) = names.iter().find(|n| !is_cdi_name(n)) {
        return Err(OutputError::CdiName {
            owner: owner(),
            value: bad.clone(),
        });
    }
    Ok(names)
}

fn check_path(
    owner: &dyn Fn() -> String,
    what: &'static str,
    path: &str,
) -> Result<(), OutputError> {
    if is_normal_absolute_path(path) {
        Ok(())
    } else {
        Err(OutputError::Path {
            owner: owner(),
            what,
            value: path.to_string(),
        })
    }
}

/// True for `/`-rooted paths with no empty, `.` or `..` components and no NUL.
pub fn is_normal_absolute_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    if path.len() > 4096 || path.contains('\0') {
        return false;
    }
    rest.is_empty()
        || rest
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// kubelet documents a 63 character limit for device ids and uses them only as keys (maps, its
/// checkpoint's JSON), so any printable text fits: Intel's DLB plugin uses node paths
/// (`/dev/dlb0`). Control characters are refused because ids end up in logs and `wdp status`.
/// Nothing in the host makes a path from an id (sockets are named after the dev-type), and a CDI
/// spec leaves out an id that is not a CDI device name.
fn is_device_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && !s.chars().any(char::is_control)
}

/// A DNS subdomain as Kubernetes checks one (apimachinery's `IsDNS1123Subdomain`).
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && wdp_kubelet::names::is_dns1123_subdomain(s)
}

/// Kubernetes' annotation key rule (`IsQualifiedName`): `[prefix/]name`.
fn is_annotation_key(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let prefix_ok = prefix.is_none_or(is_dns_subdomain);
    prefix_ok && is_dev_type(name)
}

fn is_permissions(s: &str) -> bool {
    let mut seen = [false; 3];
    s.chars().all(|c| {
        let i = match c {
            'r' => 0,
            'w' => 1,
            'm' => 2,
            _ => return false,
        };
        !std::mem::replace(&mut seen[i], true)
    })
}

pub(crate) fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// `vendor.example/class=name`, as the CDI spec qualifies device names.
/// A fully qualified CDI device name, `vendor/class=name`, by the rules of the current CDI
/// specification: vendor and class start with a letter, the name with a letter or digit, all
/// three end with a letter or digit; vendor and class may hold `-_.`, name `-_.:`.
pub(crate) fn is_cdi_name(s: &str) -> bool {
    crate::cdi_version::is_qualified_name(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> wit::DeviceInfo {
        wit::DeviceInfo {
            health: wit::Health::Healthy,
            nodes: vec![wit::DeviceSpec {
                container_path: "/dev/kvm".into(),
                host_path: "/dev/kvm".into(),
                permissions: "rw".into(),
            }],
            mounts: vec![],
            envs: vec![("A".into(), "1".into())],
            annotations: vec![],
            numa_nodes: None,
            cdi_devices: vec!["vendor.example/class=dev0".into()],
        }
    }

    fn tree(dev_type: &str, ids: &[&str], info: wit::DeviceInfo) -> Vec<wit::DeviceGroup> {
        vec![wit::DeviceGroup {
            dev_type: dev_type.into(),
            devices: ids
                .iter()
                .map(|id| wit::Device {
                    id: id.to_string(),
                    info: info.clone(),
                })
                .collect(),
        }]
    }

    #[test]
    fn accepts_a_good_tree() {
        let t = DeviceTree::from_guest(tree("kvm", &["kvm-1", "kvm-0"], info())).unwrap();
        assert_eq!(t.device_count(), 2);
        let ids: Vec<_> = t.0["kvm"].keys().cloned().collect();
        assert_eq!(ids, ["kvm-0", "kvm-1"]);
    }

    /// Entries are checked in the order of their devices, not the guest's: a device given
    /// attributes twice is refused wherever the two entries are.
    #[test]
    fn a_device_given_attributes_twice_is_refused() {
        let entry = |id: &str, model: &str| wit::DeviceAttributes {
            dev_type: "kvm".into(),
            id: id.into(),
            attributes: vec![("model".into(), wit::AttributeValue::Text(model.into()))],
            capacities: vec![],
        };
        let mut t = DeviceTree::from_guest(tree("kvm", &["kvm-0", "kvm-1"], info())).unwrap();
        t.attach(vec![entry("kvm-1", "b"), entry("kvm-0", "a")])
            .unwrap();
        assert_eq!(
            t.0["kvm"]["kvm-0"].attributes.attributes["model"],
            AttributeValue::String("a".into())
        );
        let err = t
            .attach(vec![
                entry("kvm-0", "a"),
                entry("kvm-1", "b"),
                entry("kvm-0", "c"),
            ])
            .unwrap_err();
        assert_eq!(err.rule(), "attribute-device-unique", "{err}");
        let err = t.attach(vec![entry("kvm-2", "a")]).unwrap_err();
        assert_eq!(err.rule(), "attribute-device-exists", "{err}");
    }

    #[test]
    fn refuses_each_rule() {
        let bad = |groups, needle: &str| {
            let err = DeviceTree::from_guest(groups).unwrap_err().to_string();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        };
        bad(tree("", &["a"], info()), "dev-type \"\"");
        bad(tree("a/b", &["a"], info()), "dev-type \"a/b\"");
        bad(tree("kvm", &["a", "a"], info()), "more than once");
        bad(tree("kvm", &[&"x".repeat(64)], info()), "device id");
        bad(tree("kvm", &["a\nb"], info()), "device id");
        assert!(DeviceTree::from_guest(tree("pf", &["/dev/dlb0"], info())).is_ok());
        let mut i = info();
        i.nodes[0].host_path = "/dev/../etc/passwd".into();
        bad(tree("kvm", &["a"], i), "normalised");
        let mut i = info();
        i.nodes[0].host_path = "/etc/passwd".into();
        bad(tree("kvm", &["a"], i), "under /dev");
        let mut i = info();
        i.nodes[0].permissions = "rwx".into();
        bad(tree("kvm", &["a"], i), "permissions");
        let mut i = info();
        i.envs.push(("1BAD".into(), "x".into()));
        bad(tree("kvm", &["a"], i), "env \"1BAD\"");
        let mut i = info();
        i.envs.push(("A".into(), "2".into()));
        bad(tree("kvm", &["a"], i), "set twice");
        let mut i = info();
        i.cdi_devices = vec!["nokind".into()];
        bad(tree("kvm", &["a"], i), "CDI");
        let mut g = tree("kvm", &["a"], info());
        g.extend(tree("kvm", &["b"], info()));
        bad(g, "appears more than once in one tree");
    }

    #[test]
    fn annotation_keys() {
        for ok in ["a", "probe-x", "example.com/key_1", "a.b-c/X.y"] {
            assert!(is_annotation_key(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a/",
            "/a",
            "Example.com/a",
            "a/b/c",
            &"x".repeat(64),
        ] {
            assert!(!is_annotation_key(bad), "{bad}");
        }
    }

    #[test]
    fn paths() {
        assert!(is_normal_absolute_path("/dev/dri/card0"));
        assert!(is_normal_absolute_path("/"));
        for p in ["dev/x", "/dev//x", "/dev/./x", "/dev/../x", "/dev/x/", ""] {
            assert!(!is_normal_absolute_path(p), "{p}");
        }
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        /// Paths made of the prefixes and segments that matter to the path rules.
        fn path() -> impl Strategy<Value = String> {
            (
                prop_oneof![
                    Just("/dev/"),
                    Just("/dev"),
                    Just("/"),
                    Just(""),
                    Just("/run/")
                ],
                prop::collection::vec(
                    prop_oneof![
                        Just(".."),
                        Just("."),
                        Just(""),
                        Just("etc"),
                        Just("kvm"),
                        Just("dri")
                    ],
                    0..4,
                ),
            )
                .prop_map(|(prefix, segments)| format!("{prefix}{}", segments.join("/")))
        }

        /// Mostly `valid`, sometimes anything at all: trees that pass most rules.
        fn mostly(valid: &'static str) -> impl Strategy<Value = String> {
            prop_oneof![6 => valid, 1 => "\\PC{0,6}", 1 => path()]
        }

        fn info() -> impl Strategy<Value = wit::DeviceInfo> {
            (
                prop::collection::vec(
                    (
                        path(),
                        path(),
                        prop_oneof![Just("rw"), Just("r"), Just("mrw"), Just("rwx")],
                    ),
                    0..3,
                ),
                prop::collection::vec((path(), path(), any::<bool>()), 0..2),
                prop::collection::vec((mostly("[A-Z_][A-Z0-9_]{0,6}"), mostly(".{0,4}")), 0..3),
                prop::collection::vec(
                    (
                        mostly("[a-z]{1,4}(\\.[a-z]{1,3}/)?[a-z]{1,5}"),
                        mostly(".{0,4}"),
                    ),
                    0..2,
                ),
                prop::collection::vec(
                    mostly("[a-z]{1,4}\\.example/[a-z]{1,3}=[a-z0-9]{1,3}"),
                    0..2,
                ),
            )
                .prop_map(|(nodes, mounts, envs, annotations, cdi)| wit::DeviceInfo {
                    health: wit::Health::Healthy,
                    nodes: nodes
                        .into_iter()
                        .map(|(c, h, p)| wit::DeviceSpec {
                            container_path: c,
                            host_path: h,
                            permissions: p.to_string(),
                        })
                        .collect(),
                    mounts: mounts
                        .into_iter()
                        .map(|(c, h, r)| wit::Mount {
                            container_path: c,
                            host_path: h,
                            read_only: r,
                        })
                        .collect(),
                    envs,
                    annotations,
                    numa_nodes: None,
                    cdi_devices: cdi,
                })
        }

        fn groups() -> impl Strategy<Value = Vec<wit::DeviceGroup>> {
            prop::collection::vec(
                (
                    mostly("[a-z][a-z0-9-]{0,6}[a-z0-9]"),
                    prop::collection::vec((mostly("[a-z0-9:.-]{1,10}"), info()), 0..4),
                ),
                0..4,
            )
            .prop_map(|groups| {
                groups
                    .into_iter()
                    .map(|(dev_type, devices)| wit::DeviceGroup {
                        dev_type,
                        devices: devices
                            .into_iter()
                            .map(|(id, info)| wit::Device { id, info })
                            .collect(),
                    })
                    .collect()
            })
        }

        fn valid_info() -> wit::DeviceInfo {
            wit::DeviceInfo {
                health: wit::Health::Healthy,
                nodes: vec![wit::DeviceSpec {
                    container_path: "/dev/x".into(),
                    host_path: "/dev/x".into(),
                    permissions: "rw".into(),
                }],
                mounts: vec![],
                envs: vec![],
                annotations: vec![],
                numa_nodes: None,
                cdi_devices: vec![],
            }
        }

        fn one(info: wit::DeviceInfo) -> Vec<wit::DeviceGroup> {
            vec![wit::DeviceGroup {
                dev_type: "t".into(),
                devices: vec![wit::Device {
                    id: "d".into(),
                    info,
                }],
            }]
        }

        proptest! {
            #![proptest_config(crate::fuzz::config())]

            /// One node whose host path varies, everything else valid: accepted only when the
            /// host path is a normalised path under /dev.
            #[test]
            fn node_host_paths(host in path(), perms in "[rwmx]{0,3}") {
                let mut i = valid_info();
                i.nodes[0].host_path = host.clone();
                i.nodes[0].permissions = perms.clone();
                let accepted = DeviceTree::from_guest(one(i)).is_ok();
                let under_dev = host == "/dev" || host.starts_with("/dev/");
                prop_assert_eq!(
                    accepted,
                    under_dev && is_normal_absolute_path(&host) && is_permissions(&perms),
                    "host {:?} perms {:?}", host, perms
                );
            }

            /// One mount whose paths vary: accepted only when both are normalised and absolute.
            #[test]
            fn mount_paths(host in path(), container in path()) {
                let mut i = valid_info();
                i.mounts.push(wit::Mount { container_path: container.clone(), host_path: host.clone(), read_only: true });
                let accepted = DeviceTree::from_guest(one(i)).is_ok();
                prop_assert_eq!(accepted, is_normal_absolute_path(&host) && is_normal_absolute_path(&container));
            }

            /// Whatever a guest sends, validation never panics, and an accepted tree keeps
            /// every promise kubelet and the container runtime rely on.
            #[test]
            fn accepted_trees_keep_the_rules(groups in groups()) {
                if let Ok(tree) = DeviceTree::from_guest(groups) {
                    for (dev_type, devices) in &tree.0 {
                        prop_assert!(is_dev_type(dev_type));
                        for (id, info) in devices {
                            prop_assert!(is_device_id(id));
                            for n in &info.nodes {
                                prop_assert!(n.host_path == "/dev" || n.host_path.starts_with("/dev/"));
                                prop_assert!(!n.host_path.split('/').any(|c| c == ".."));
                                prop_assert!(is_normal_absolute_path(&n.container_path));
                                prop_assert!(is_permissions(&n.permissions));
                            }
                            for m in &info.mounts {
                                prop_assert!(is_normal_absolute_path(&m.host_path));
                            }
                            prop_assert!(info.envs.keys().all(|k| is_env_name(k)));
                            prop_assert!(info.annotations.keys().all(|k| is_annotation_key(k)));
                            prop_assert!(info.cdi_devices.iter().all(|c| is_cdi_name(c)));
                        }
                    }
                }
            }
        }
    }
}
