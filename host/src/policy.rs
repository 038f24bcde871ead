//! The output policy: what a guest may put in front of kubelet.
//!
//! [`crate::tree`] checks that a tree is well formed; this module adds the operator's rules, which
//! depend on the node and the config: size caps (checked first, on the raw guest data, so a giant
//! tree costs nothing more), device nodes that must exist in the dev root, mounts only from an
//! explicit allow-list, and dev-type names short enough for their socket path. Every tree a guest
//! notifies and every response a hook returns passes here before kubelet sees it.

use std::collections::BTreeMap;
use std::ffi::OsStr;

use crate::allocate::ContainerResponse;
use crate::bindings::types as wit;
use crate::hostfs::DevFs;
use crate::tree::charge::Budget;
use crate::tree::{DeviceTree, Health, Mount, OutputError};

/// The per-scanner policy. `Default` is the safe default: no mounts, generous size caps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Host paths a mount may use: a listed path itself or anything below it. Empty: no mounts.
    pub allowed_mounts: Vec<String>,
    /// Most device types in one tree.
    pub max_types: usize,
    /// Most devices in one type.
    pub max_devices_per_type: usize,
    /// Longest string (id, path, env or annotation key or value, CDI name, attribute or capacity
    /// name or value), in bytes.
    pub max_string_bytes: usize,
    /// Most bytes of strings in one tree (its attributes and capacities included) or one hook
    /// answer.
    pub max_tree_bytes: usize,
    /// Longest dev-type: 63 for kubelet, less when the socket path would not fit.
    pub max_dev_type_len: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            allowed_mounts: Vec::new(),
            max_types: 64,
            max_devices_per_type: 16_384,
            max_string_bytes: 4096,
            max_tree_bytes: 16 << 20,
            max_dev_type_len: 63,
        }
    }
}

impl Policy {
    /// Checks a notified tree: caps, structure, then the operator's rules.
    pub fn check_tree(
        &self,
        groups: Vec<wit::DeviceGroup>,
        dev: &DevFs,
    ) -> Result<DeviceTree, OutputError> {
        self.check_tree_knowing(groups, Vec::new(), dev, &|_| false)
    }

    /// [`Policy::check_tree`] of a tree notified with typed `attributes` for its devices (kept
    /// on them), where `known` names the node paths already known to exist (and known not to
    /// have changed since): those are not looked up again, so a tree that differs from the last
    /// one by one device asks the dev root about that device only.
    pub fn check_tree_knowing(
        &self,
        groups: Vec<wit::DeviceGroup>,
        attributes: Vec<wit::DeviceAttributes>,
        dev: &DevFs,
        known: &dyn Fn(&str) -> bool,
    ) -> Result<DeviceTree, OutputError> {
        let mut unlimited = Budget::new(usize::MAX);
        self.check_tree_charged(groups, attributes, dev, known, &mut unlimited)
    }

    /// [`Policy::check_tree_knowing`], the validated tree charged to `budget` as it is built
    /// ([`crate::tree::charge`]).
    pub fn check_tree_charged(
        &self,
        groups: Vec<wit::DeviceGroup>,
        attributes: Vec<wit::DeviceAttributes>,
        dev: &DevFs,
        known: &dyn Fn(&str) -> bool,
        budget: &mut Budget,
    ) -> Result<DeviceTree, OutputError> {
        self.check_sizes(&groups, &attributes)?;
        if let Some(g) = groups
            .iter()
            .find(|g| g.dev_type.len() > self.max_dev_type_len)
        {
            return Err(OutputError::DevTypeTooLong {
                value: g.dev_type.clone(),
                max: self.max_dev_type_len,
            });
        }
        let tree = DeviceTree::from_guest_within(groups, budget)?;
        let mut nodes = NodeCheck::new(dev);
        for (id, info) in tree.0.values().flat_map(|g| g.iter()) {
            let owner = || format!("device {id:?}");
            self.check_mounts(&owner, &info.mounts)?;
            // An Unhealthy device is never allocated, and "its node vanished" is exactly why a
            // scanner reports one: only devices that may reach a container need their nodes.
            if info.health != Health::Unhealthy {
                nodes.want(
                    info.nodes
                        .iter()
                        .map(|n| n.host_path.as_str())
                        .filter(|p| !known(p)),
                );
            }
        }
        nodes.check(|path| {
            tree.0
                .values()
                .flat_map(|g| g.iter())
                .find(|(_, info)| {
                    info.health != Health::Unhealthy
                        && info.nodes.iter().any(|n| n.host_path == path)
                })
                .map_or_else(|| "a device".into(), |(id, _)| format!("device {id:?}"))
        })?;
        let mut tree = tree;
        tree.attach_within(attributes, budget)?;
        Ok(tree)
    }

    /// Checks what a post-allocator returned for container `index`.
    pub(crate) fn check_response(
        &self,
        index: usize,
        response: wit::ContainerAllocateResponse,
        dev: &DevFs,
    ) -> Result<ContainerResponse, OutputError> {
        let mut bytes = 0usize;
        let owner = || format!("the response for container {index}");
        for s in attached_strings(
            &response.devices,
            &response.mounts,
            &response.envs,
            &response.annotations,
            &response.cdi_devices,
        ) {
            self.check_string(&owner, s, &mut bytes)?;
        }
        let response = ContainerResponse::from_wit(index, response)?;
        self.check_mounts(&owner, &response.mounts)?;
        let mut nodes = NodeCheck::new(dev);
        nodes.want(response.devices.iter().map(|n| n.host_path.as_str()));
        nodes.check(|_| owner())?;
        Ok(response)
    }

    /// The caps, on the guest's data as lifted: before anything is copied out of it, a tree too
    /// large for the policy is refused. Attributes count like any other string: their names,
    /// text and version values, capacities, and the device each entry names.
    fn check_sizes(
        &self,
        groups: &[wit::DeviceGroup],
        attributes: &[wit::DeviceAttributes],
    ) -> Result<(), OutputError> {
        if groups.len() > self.max_types {
            return Err(OutputError::TooManyTypes {
                count: groups.len(),
                max: self.max_types,
            });
        }
        let mut bytes = 0usize;
        for g in groups {
            self.check_string(&|| "a dev-type".into(), &g.dev_type, &mut bytes)?;
            if g.devices.len() > self.max_devices_per_type {
                return Err(OutputError::TooManyDevices {
                    dev_type: g.dev_type.clone(),
                    count: g.devices.len(),
                    max: self.max_devices_per_type,
                });
            }
            for d in &g.devices {
                self.check_string(&|| "a device id".into(), &d.id, &mut bytes)?;
                let owner = || format!("device {:?}", d.id);
                let i = &d.info;
                for s in
                    attached_strings(&i.nodes, &i.mounts, &i.envs, &i.annotations, &i.cdi_devices)
                {
                    self.check_string(&owner, s, &mut bytes)?;
                }
            }
        }
        for a in attributes {
            let owner = || format!("the attributes of device {:?}", a.id);
            for s in attribute_strings(a) {
                self.check_string(&owner, s, &mut bytes)?;
            }
        }
        Ok(())
    }

    /// `owner` names what carries `s` in an error; it is only called to build one, because a
    /// large tree passes here tens of thousands of times.
    fn check_string(
        &self,
        owner: &dyn Fn() -> String,
        s: &str,
        total: &mut usize,
    ) -> Result<(), OutputError> {
        if s.len() > self.max_string_bytes {
            return Err(OutputError::StringTooLong {
                owner: owner(),
                start: s.chars().take(32).collect(),
                len: s.len(),
                max: self.max_string_bytes,
            });
        }
        *total += s.len();
        if *total > self.max_tree_bytes {
            return Err(OutputError::TreeTooLarge {
                max: self.max_tree_bytes,
            });
        }
        Ok(())
    }

    fn check_mounts(
        &self,
        owner: &dyn Fn() -> String,
        mounts: &[Mount],
    ) -> Result<(), OutputError> {
        for m in mounts {
            let allowed = self.allowed_mounts.iter().any(|a| {
                m.host_path == *a
                    || m.host_path
                        .strip_prefix(a.as_str())
                        .is_some_and(|rest| rest.starts_with('/') || a.ends_with('/'))
            });
            if !allowed {
                return Err(OutputError::MountNotAllowed {
                    owner: owner(),
                    value: m.host_path.clone(),
                });
            }
        }
        Ok(())
    }
}

/// The node-exists rule: a device node's host path must name something in the dev root (a node,
/// or a link to one; not followed).
///
/// Paths are grouped by directory: a directory many nodes share is listed once (a 10,000-device
/// tree took 26 ms of `stat` calls), the others are `stat`ed. Only a path missing from its
/// listing is `stat`ed again, for the error's cause (or because it appeared meanwhile).
struct NodeCheck<'a> {
    dev: &'a DevFs,
    /// Wanted paths by parent directory (guest paths: `/dev/...`).
    by_dir: BTreeMap<&'a str, Vec<&'a str>>,
}

/// From this many wanted nodes in one directory on, the directory is listed instead.
const LIST_FROM: usize = 16;

impl<'a> NodeCheck<'a> {
    fn new(dev: &'a DevFs) -> Self {
        NodeCheck {
            dev,
            by_dir: BTreeMap::new(),
        }
    }

    fn want(&mut self, paths: impl Iterator<Item = &'a str>) {
        for path in paths {
            let dir = path.rsplit_once('/').map_or("", |(dir, _)| dir);
            self.by_dir.entry(dir).or_default().push(path);
        }
    }

    /// Checks every wanted path; `owner` names who wanted a missing one.
    fn check(self, owner: impl Fn(&str) -> String) -> Result<(), OutputError> {
        for (dir, paths) in &self.by_dir {
            let listed = if paths.len() >= LIST_FROM {
                self.dev.entry_names(dir).ok()
            } else {
                None
            };
            for path in paths {
                let name = path.rsplit_once('/').map_or(*path, |(_, name)| name);
                // A name not in the listing may be a path the listing cannot vouch for
                // ("/dev/x/.."): the stat decides, and explains.
                if listed
                    .as_ref()
                    .is_some_and(|l| l.contains(OsStr::new(name)))
                {
                    continue;
                }
                if let Err(e) = self.dev.stat(path) {
                    return Err(OutputError::NodeMissing {
                        owner: owner(path),
                        value: (*path).into(),
                        cause: e.to_string(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Every string of one device's attributes entry, for the size caps.
fn attribute_strings(a: &wit::DeviceAttributes) -> impl Iterator<Item = &str> {
    let values = a.attributes.iter().flat_map(|(name, value)| {
        let value = match value {
            wit::AttributeValue::Text(s) | wit::AttributeValue::Version(s) => s.as_str(),
            wit::AttributeValue::Boolean(_) | wit::AttributeValue::Int(_) => "",
        };
        [name.as_str(), value]
    });
    let capacities = a
        .capacities
        .iter()
        .flat_map(|(name, quantity)| [name.as_str(), quantity.as_str()]);
    [a.dev_type.as_str(), a.id.as_str()]
        .into_iter()
        .chain(values)
        .chain(capacities)
}

/// Every string a device or a container response carries: the same fields in both.
fn attached_strings<'a>(
    nodes: &'a [wit::DeviceSpec],
    mounts: &'a [wit::Mount],
    envs: &'a [(String, String)],
    annotations: &'a [(String, String)],
    cdi_devices: &'a [String],
) -> impl Iterator<Item = &'a str> {
    let nodes = nodes
        .iter()
        .flat_map(|n| [&n.container_path, &n.host_path, &n.permissions]);
    let mounts = mounts
        .iter()
        .flat_map(|m| [&m.container_path, &m.host_path]);
    let pairs = envs.iter().chain(annotations).flat_map(|(k, v)| [k, v]);
    nodes
        .chain(mounts)
        .chain(pairs)
        .chain(cdi_devices)
        .map(String::as_str)
}

/// The longest dev-type whose socket `<plugin_dir>/<namespace>-<dev-type>.sock` still fits.
pub fn dev_type_budget(plugin_dir_len: usize, namespace: &str) -> usize {
    let fixed = plugin_dir_len + 1 + namespace.len() + 1 + ".sock".len();
    wdp_kubelet::names::MAX_SOCKET_PATH
        .saturating_sub(fixed)
        .min(63)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> (tempfile::TempDir, DevFs) {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("kvm"), "").unwrap();
        let dev = DevFs::open(tmp.path()).unwrap();
        (tmp, dev)
    }

    fn group(dev_type: &str, n: usize, info: wit::DeviceInfo) -> wit::DeviceGroup {
        wit::DeviceGroup {
            dev_type: dev_type.into(),
            devices: (0..n)
                .map(|i| wit::Device {
                    id: format!("d{i}"),
                    info: info.clone(),
                })
                .collect(),
        }
    }

    fn info(host: &str, mount: Option<&str>) -> wit::DeviceInfo {
        wit::DeviceInfo {
            health: wit::Health::Healthy,
            nodes: vec![wit::DeviceSpec {
                container_path: "/dev/x".into(),
                host_path: host.into(),
                permissions: "rw".into(),
            }],
            mounts: mount
                .map(|m| wit::Mount {
                    container_path: "/m".into(),
                    host_path: m.into(),
                    read_only: true,
                })
                .into_iter()
                .collect(),
            envs: vec![],
            annotations: vec![],
            numa_nodes: None,
            cdi_devices: vec![],
        }
    }

    #[test]
    fn caps_nodes_and_mounts() {
        let (_tmp, dev) = dev();
        let p = Policy {
            allowed_mounts: vec!["/run/ok".into()],
            max_types: 2,
            max_devices_per_type: 3,
            max_string_bytes: 64,
            max_tree_bytes: 1000,
            max_dev_type_len: 10,
        };
        let rule = |groups| p.check_tree(groups, &dev).map(|_| ()).unwrap_err().rule();
        assert!(
            p.check_tree(
                vec![group("a", 3, info("/dev/kvm", Some("/run/ok/x")))],
                &dev
            )
            .is_ok()
        );
        assert_eq!(
            rule(vec![group("a", 4, info("/dev/kvm", None))]),
            "max-devices-per-type"
        );
        assert_eq!(
            rule(vec![group("a", 1, info("/dev/kvm", None)); 3]),
            "max-types"
        );
        assert_eq!(
            rule(vec![group("a", 1, info(&"/dev/x".repeat(20), None))]),
            "max-string-bytes"
        );
        assert_eq!(
            rule(vec![group("abcdefghijk", 1, info("/dev/kvm", None))]),
            "dev-type-length"
        );
        assert_eq!(
            rule(vec![group("a", 1, info("/dev/nope", None))]),
            "node-exists"
        );
        // A device reported Unhealthy because its node vanished is served as such.
        let gone = wit::DeviceInfo {
            health: wit::Health::Unhealthy,
            ..info("/dev/nope", None)
        };
        assert!(p.check_tree(vec![group("a", 1, gone)], &dev).is_ok());
        assert_eq!(
            rule(vec![group("a", 1, info("/dev/kvm", Some("/run/okay")))]),
            "allowed-mounts"
        );
        assert_eq!(
            rule(vec![group("a", 1, info("/dev/kvm", Some("/")))]),
            "allowed-mounts"
        );
        let big = Policy {
            max_tree_bytes: 30,
            ..p.clone()
        };
        let err = big
            .check_tree(vec![group("a", 3, info("/dev/kvm", None))], &dev)
            .unwrap_err();
        assert_eq!(err.rule(), "max-tree-bytes");
    }

    /// One entry for device `d0` of type `a`: a text attribute and a capacity.
    fn attributes(text: &str, quantity: &str) -> Vec<wit::DeviceAttributes> {
        vec![wit::DeviceAttributes {
            dev_type: "a".into(),
            id: "d0".into(),
            attributes: vec![("model".into(), wit::AttributeValue::Text(text.into()))],
            capacities: vec![("memory".into(), quantity.into())],
        }]
    }

    #[test]
    fn attributes_count_in_the_size_caps() {
        let (_tmp, dev) = dev();
        let p = Policy {
            max_string_bytes: 16,
            max_tree_bytes: 100,
            ..Policy::default()
        };
        let check = |text: &str, quantity: &str| {
            let groups = vec![group("a", 1, info("/dev/kvm", None))];
            p.check_tree_knowing(groups, attributes(text, quantity), &dev, &|_| false)
        };
        let tree = check("x", "1").unwrap();
        let card = &tree.0["a"]["d0"].attributes;
        assert_eq!(card.capacities["memory"], "1");
        assert!(check(&"x".repeat(16), "1").is_ok());
        for (text, quantity) in [
            ("x".repeat(17), "1".to_string()),
            ("x".into(), "1".repeat(17)),
        ] {
            let err = check(&text, &quantity).unwrap_err();
            assert_eq!(err.rule(), "max-string-bytes", "{err}");
            assert!(
                err.to_string().contains("attributes of device \"d0\""),
                "{err}"
            );
        }
        // The tree alone: "a", "d0", "/dev/x", "/dev/kvm", "rw" (19 bytes); the entry: "a",
        // "d0", "model", "memory" (14 bytes), then its two values of 16 bytes: 65 bytes.
        let quantity = format!("{}1", "0".repeat(15));
        let at = |max_tree_bytes| {
            let groups = vec![group("a", 1, info("/dev/kvm", None))];
            let attrs = attributes(&"x".repeat(16), &quantity);
            Policy {
                max_tree_bytes,
                ..p.clone()
            }
            .check_tree_knowing(groups, attrs, &dev, &|_| false)
        };
        assert!(at(65).is_ok());
        let err = at(64).unwrap_err();
        assert_eq!(err.rule(), "max-tree-bytes");
    }

    #[test]
    fn node_exists_in_a_listed_directory() {
        let (tmp, dev) = dev();
        std::fs::create_dir(tmp.path().join("bulk")).unwrap();
        for i in 0..40 {
            std::fs::write(tmp.path().join(format!("bulk/n{i}")), "").unwrap();
        }
        std::os::unix::fs::symlink("nowhere", tmp.path().join("bulk/dangling")).unwrap();
        let tree = |paths: &[&str]| wit::DeviceGroup {
            dev_type: "bulk".into(),
            devices: paths
                .iter()
                .enumerate()
                .map(|(i, p)| wit::Device {
                    id: format!("d{i}"),
                    info: info(p, None),
                })
                .collect(),
        };
        let mut paths: Vec<String> = (0..40).map(|i| format!("/dev/bulk/n{i}")).collect();
        paths.push("/dev/bulk/dangling".into());
        let ok: Vec<&str> = paths.iter().map(String::as_str).collect();
        let p = Policy::default();
        assert!(
            p.check_tree(vec![tree(&ok)], &dev).is_ok(),
            "links count, unfollowed"
        );
        for bad in ["/dev/bulk/n40", "/dev/bulk/n1/x", "/dev/none/x"] {
            let mut with_bad = ok.clone();
            with_bad.insert(7, bad);
            let err = p.check_tree(vec![tree(&with_bad)], &dev).unwrap_err();
            assert!(
                matches!(&err, OutputError::NodeMissing { owner, value, .. }
                    if owner == "device \"d7\"" && value == bad),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn socket_budget() {
        assert_eq!(dev_type_budget(31, "devices.example.com"), 50);
        assert_eq!(dev_type_budget(0, "a"), 63);
        assert_eq!(dev_type_budget(200, "a"), 0);
    }
}
