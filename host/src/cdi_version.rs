//! CDI specification versions, what each one added, and the lowest version a spec's content
//! needs.
//!
//! A leaf below both [`crate::tree`] (which checks the CDI device names a guest returns with
//! [`is_qualified_name`]) and [`crate::cdi`] (which writes spec files at these versions).
//!
//! A container runtime refuses a whole spec file whose `cdiVersion` its CDI library does not
//! know (podman 4.3's library stops at 0.5.0 and answers "invalid version"), and it refuses a
//! field or a name its version does not have (specs are decoded strictly). So a spec must say
//! the lowest version that has everything it holds: then every runtime new enough for the
//! content reads it. This is the rule of the CDI project's own `MinimumRequiredVersion`, and the
//! table below is the specification's version history:
//!
//! | version | added |
//! |---|---|
//! | 0.3.0 | the first tagged release: kind, devices, env, device nodes, mounts, hooks |
//! | 0.4.0 | a mount's `type` |
//! | 0.5.0 | a device node's `hostPath`; device names that start with a digit |
//! | 0.6.0 | `annotations` on the spec and on devices; dots in the name part of `kind` |
//! | 0.7.0 | `intelRdt`, `additionalGids` |
//! | 0.8.0, 1.0.0 | nothing in the file format (library changes) |
//! | 1.1.0 | `netDevices` |
//!
//! The version is computed from the JSON document itself, the exact fields and names that will
//! be written, so it can never disagree with the content.

use serde_json::Value;

/// A released version of the CDI specification, oldest first (the order is the release order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CdiVersion {
    /// The first tagged release.
    V0_3_0,
    /// Adds a mount's `type`.
    V0_4_0,
    /// Adds a node's `hostPath` and names starting with a digit.
    V0_5_0,
    /// Adds annotations and dots in the kind's name part.
    V0_6_0,
    /// Adds `intelRdt` and `additionalGids`.
    V0_7_0,
    /// No file format change.
    V0_8_0,
    /// No file format change.
    V1_0_0,
    /// Adds `netDevices`.
    V1_1_0,
}

impl CdiVersion {
    /// Every version this table knows, oldest first.
    pub const ALL: [CdiVersion; 8] = [
        CdiVersion::V0_3_0,
        CdiVersion::V0_4_0,
        CdiVersion::V0_5_0,
        CdiVersion::V0_6_0,
        CdiVersion::V0_7_0,
        CdiVersion::V0_8_0,
        CdiVersion::V1_0_0,
        CdiVersion::V1_1_0,
    ];

    /// The text `cdiVersion` holds.
    pub fn as_str(self) -> &'static str {
        match self {
            CdiVersion::V0_3_0 => "0.3.0",
            CdiVersion::V0_4_0 => "0.4.0",
            CdiVersion::V0_5_0 => "0.5.0",
            CdiVersion::V0_6_0 => "0.6.0",
            CdiVersion::V0_7_0 => "0.7.0",
            CdiVersion::V0_8_0 => "0.8.0",
            CdiVersion::V1_0_0 => "1.0.0",
            CdiVersion::V1_1_0 => "1.1.0",
        }
    }

    /// The version `cdiVersion` names, if this table knows it. Older libraries compare the text
    /// exactly, so no other spelling (a leading `v`) is taken.
    pub fn parse(text: &str) -> Option<CdiVersion> {
        CdiVersion::ALL.into_iter().find(|v| v.as_str() == text)
    }
}

impl std::fmt::Display for CdiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kinds of JSON object a spec is made of, each with its own fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Object {
    /// The spec document.
    Spec,
    /// One entry of `devices`.
    Device,
    /// `containerEdits`, of the spec or a device.
    ContainerEdits,
    /// One entry of `deviceNodes`.
    DeviceNode,
    /// One entry of `mounts`.
    Mount,
    /// One entry of `hooks`.
    Hook,
}

impl Object {
    /// The object's name in the CDI specification, for errors.
    pub fn name(self) -> &'static str {
        match self {
            Object::Spec => "spec",
            Object::Device => "device",
            Object::ContainerEdits => "containerEdits",
            Object::DeviceNode => "deviceNode",
            Object::Mount => "mount",
            Object::Hook => "hook",
        }
    }
}

use CdiVersion::*;

/// Every field of every object, with the version that added it. `intelRdt` and `netDevices`
/// are known (a document holding them needs their version) but wdp writes neither, so their
/// insides are not described.
const FIELDS: &[(Object, &str, CdiVersion)] = &[
    (Object::Spec, "cdiVersion", V0_3_0),
    (Object::Spec, "kind", V0_3_0),
    (Object::Spec, "devices", V0_3_0),
    (Object::Spec, "containerEdits", V0_3_0),
    (Object::Spec, "annotations", V0_6_0),
    (Object::Device, "name", V0_3_0),
    (Object::Device, "containerEdits", V0_3_0),
    (Object::Device, "annotations", V0_6_0),
    (Object::ContainerEdits, "env", V0_3_0),
    (Object::ContainerEdits, "deviceNodes", V0_3_0),
    (Object::ContainerEdits, "hooks", V0_3_0),
    (Object::ContainerEdits, "mounts", V0_3_0),
    (Object::ContainerEdits, "intelRdt", V0_7_0),
    (Object::ContainerEdits, "additionalGids", V0_7_0),
    (Object::ContainerEdits, "netDevices", V1_1_0),
    (Object::DeviceNode, "path", V0_3_0),
    (Object::DeviceNode, "type", V0_3_0),
    (Object::DeviceNode, "major", V0_3_0),
    (Object::DeviceNode, "minor", V0_3_0),
    (Object::DeviceNode, "fileMode", V0_3_0),
    (Object::DeviceNode, "permissions", V0_3_0),
    (Object::DeviceNode, "uid", V0_3_0),
    (Object::DeviceNode, "gid", V0_3_0),
    (Object::DeviceNode, "hostPath", V0_5_0),
    (Object::Mount, "hostPath", V0_3_0),
    (Object::Mount, "containerPath", V0_3_0),
    (Object::Mount, "options", V0_3_0),
    (Object::Mount, "type", V0_4_0),
    (Object::Hook, "hookName", V0_3_0),
    (Object::Hook, "path", V0_3_0),
    (Object::Hook, "args", V0_3_0),
    (Object::Hook, "env", V0_3_0),
    (Object::Hook, "timeout", V0_3_0),
];

/// The version that added `field` to `object`; None: no version has it.
pub fn field_since(object: Object, field: &str) -> Option<CdiVersion> {
    FIELDS
        .iter()
        .find(|(o, f, _)| *o == object && *f == field)
        .map(|(_, _, v)| *v)
}

/// The objects a field holds (one, or a list of them), for walking a document.
pub fn field_object(object: Object, field: &str) -> Option<Object> {
    match (object, field) {
        (Object::Spec, "devices") => Some(Object::Device),
        (Object::Spec | Object::Device, "containerEdits") => Some(Object::ContainerEdits),
        (Object::ContainerEdits, "deviceNodes") => Some(Object::DeviceNode),
        (Object::ContainerEdits, "mounts") => Some(Object::Mount),
        (Object::ContainerEdits, "hooks") => Some(Object::Hook),
        _ => None,
    }
}

/// Whether `vendor`, the part of `kind` before the slash, is valid: the same in every version.
pub fn vendor_ok(vendor: &str) -> bool {
    name_ok(vendor, u8::is_ascii_alphabetic, b"-_.")
}

/// Whether `class`, the part of `kind` after the slash, is valid in `version`: dots came in
/// 0.6.0.
pub fn class_ok(class: &str, version: CdiVersion) -> bool {
    let extra: &[u8] = if version >= V0_6_0 { b"-_." } else { b"-_" };
    name_ok(class, u8::is_ascii_alphabetic, extra)
}

/// Whether `name` is a valid device name in `version`: one that starts with a digit came in
/// 0.5.0.
pub fn device_name_ok(name: &str, version: CdiVersion) -> bool {
    let first = if version >= V0_5_0 {
        u8::is_ascii_alphanumeric
    } else {
        u8::is_ascii_alphabetic
    };
    name_ok(name, first, b"-_.:")
}

/// A fully qualified CDI device name (`vendor.example/class=name`) under the newest rules: what
/// a runtime of today resolves.
pub fn is_qualified_name(s: &str) -> bool {
    let newest = V1_1_0;
    let Some((kind, name)) = s.split_once('=') else {
        return false;
    };
    let Some((vendor, class)) = kind.split_once('/') else {
        return false;
    };
    vendor_ok(vendor) && class_ok(class, newest) && device_name_ok(name, newest)
}

/// The CDI name rule: a first character `first` accepts, letters and digits and `extra` inside,
/// a letter or digit at the end.
fn name_ok(s: &str, first: fn(&u8) -> bool, extra: &[u8]) -> bool {
    match s.as_bytes() {
        [] => false,
        [head, .., tail] | [head @ tail] => {
            first(head)
                && tail.is_ascii_alphanumeric()
                && s.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
        }
    }
}

/// The lowest version that has every field and name `doc` (a CDI spec as JSON) uses. Fields no
/// version has are left to [`crate::cdi::schema::check`], which refuses them.
pub fn minimum(doc: &Value) -> CdiVersion {
    let mut need = V0_3_0;
    walk(doc, Object::Spec, &mut need);
    if let Some((_, class)) = doc
        .get("kind")
        .and_then(Value::as_str)
        .and_then(|k| k.split_once('/'))
        && !class_ok(class, V0_5_0)
        && class_ok(class, V0_6_0)
    {
        need = need.max(V0_6_0);
    }
    let names = doc.get("devices").and_then(Value::as_array).into_iter();
    for name in names.flatten().filter_map(|d| d.get("name")?.as_str()) {
        if !device_name_ok(name, V0_4_0) && device_name_ok(name, V0_5_0) {
            need = need.max(V0_5_0);
        }
    }
    need
}

/// Raises `need` to the version of each field of `value` (an `object`) and of the objects in it.
fn walk(value: &Value, object: Object, need: &mut CdiVersion) {
    let Some(fields) = value.as_object() else {
        return;
    };
    for (field, inner) in fields {
        if let Some(since) = field_since(object, field) {
            *need = (*need).max(since);
        }
        if let Some(child) = field_object(object, field) {
            match inner {
                Value::Array(items) => items.iter().for_each(|i| walk(i, child, need)),
                other => walk(other, child, need),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A spec with one device holding `edits`, named `name`, of kind `kind`.
    fn spec(kind: &str, name: &str, edits: Value) -> Value {
        json!({"cdiVersion": "0.3.0", "kind": kind, "devices": [{"name": name, "containerEdits": edits}]})
    }

    fn node() -> Value {
        json!({"deviceNodes": [{"path": "/dev/kvm", "permissions": "rw"}]})
    }

    #[test]
    fn versions_parse_and_print_in_release_order() {
        for v in CdiVersion::ALL {
            assert_eq!(CdiVersion::parse(v.as_str()), Some(v));
        }
        assert!(CdiVersion::ALL.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(CdiVersion::parse("v0.5.0"), None);
        assert_eq!(CdiVersion::parse("0.2.9"), None);
    }

    #[test]
    fn nodes_env_and_hooks_alone_need_0_3_0() {
        let mut edits = node();
        edits["env"] = json!(["A=1"]);
        edits["hooks"] = json!([{"hookName": "createContainer", "path": "/bin/true"}]);
        edits["mounts"] = json!([{"hostPath": "/a", "containerPath": "/a", "options": ["bind"]}]);
        assert_eq!(minimum(&spec("a.example/b", "dev", edits)), V0_3_0);
    }

    #[test]
    fn a_mount_type_needs_0_4_0() {
        let edits = json!({"mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "none"}]});
        assert_eq!(minimum(&spec("a.example/b", "dev", edits)), V0_4_0);
    }

    #[test]
    fn a_node_host_path_or_a_leading_digit_needs_0_5_0() {
        let edits = json!({"deviceNodes": [{"path": "/dev/ttyUSB0", "hostPath": "/dev/serial/x"}]});
        assert_eq!(minimum(&spec("a.example/b", "dev", edits)), V0_5_0);
        assert_eq!(
            minimum(&spec("a.example/b", "0000:3d:01.1", node())),
            V0_5_0
        );
        // A digit elsewhere in the name is older than that.
        assert_eq!(minimum(&spec("a.example/b", "card0-1", node())), V0_3_0);
    }

    #[test]
    fn annotations_or_a_dotted_class_need_0_6_0() {
        let mut doc = spec("a.example/b", "dev", node());
        doc["devices"][0]["annotations"] = json!({"a.example/x": "1"});
        assert_eq!(minimum(&doc), V0_6_0);
        let mut doc = spec("a.example/b", "dev", node());
        doc["annotations"] = json!({"a.example/x": "1"});
        assert_eq!(minimum(&doc), V0_6_0);
        assert_eq!(minimum(&spec("a.example/b.c", "dev", node())), V0_6_0);
        // Dots in the vendor part were always allowed.
        assert_eq!(minimum(&spec("a.b.example/c", "dev", node())), V0_3_0);
    }

    #[test]
    fn rdt_and_gids_need_0_7_0_and_net_devices_1_1_0() {
        let mut edits = node();
        edits["additionalGids"] = json!([5]);
        assert_eq!(minimum(&spec("a.example/b", "dev", edits)), V0_7_0);
        let mut doc = spec("a.example/b", "dev", node());
        doc["containerEdits"] = json!({"intelRdt": {"closID": "x"}});
        assert_eq!(minimum(&doc), V0_7_0);
        let mut edits = node();
        edits["netDevices"] = json!([{"hostInterfaceName": "eth1", "name": "net0"}]);
        assert_eq!(minimum(&spec("a.example/b", "dev", edits)), V1_1_0);
    }

    #[test]
    fn the_highest_need_wins() {
        let edits = json!({
            "deviceNodes": [{"path": "/dev/a", "hostPath": "/dev/b"}],
            "mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "none"}],
        });
        let mut doc = spec("a.example/b", "dev", edits);
        assert_eq!(minimum(&doc), V0_5_0);
        doc["devices"][0]["annotations"] = json!({"k": "v"});
        assert_eq!(minimum(&doc), V0_6_0);
    }

    #[test]
    fn names_follow_their_version() {
        assert!(vendor_ok("gpu.intel.com"));
        assert!(!vendor_ok("1password.com"), "a vendor starts with a letter");
        assert!(!class_ok("i915.x", V0_5_0));
        assert!(class_ok("i915.x", V0_6_0));
        assert!(!class_ok("9bad", V1_1_0));
        assert!(!device_name_ok("0000:00:02.0", V0_4_0));
        assert!(device_name_ok("0000:00:02.0", V0_5_0));
        assert!(!device_name_ok("/dev/dlb0", V1_1_0));
        assert!(!device_name_ok("card0-", V1_1_0));
        assert!(device_name_ok("x", V0_3_0));
        assert!(is_qualified_name("gpu.intel.com/i915=card0-0"));
        assert!(is_qualified_name("a.example/b.c=0:1"));
        assert!(!is_qualified_name("a.example/b"));
        assert!(!is_qualified_name("a.example=b"));
        assert!(!is_qualified_name("nokind"));
    }
}
