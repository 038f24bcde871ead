//! A CDI spec checked against the rules of the version it declares, as a container runtime's
//! CDI library loads it: a runtime that finds one thing wrong in a spec file refuses every device
//! in it.
//!
//! The rules are those of the CDI JSON schema (`schema.json`, `defs.json`: required fields and
//! their types) and of the library's loader, which is stricter: a field the declared version does
//! not have is refused (specs are decoded strictly), names follow the version's grammar, every
//! device has edits, `env` entries are `NAME=value`, node types and permissions are from their
//! sets, hooks have known names, and the declared version is at least what the content needs
//! ([`crate::cdi_version::minimum`]).

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::cdi_version::{
    CdiVersion, Object, class_ok, device_name_ok, field_since, minimum, vendor_ok,
};

/// What makes a spec unloadable, and where (a JSON path such as `devices[1].containerEdits`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("cdiVersion {0:?} is not a released CDI version (0.3.0 to 1.1.0)")]
    /// `cdiVersion` names no released version.
    UnknownVersion(String),
    #[error("{at}: {field:?} is not a field of a CDI {object}")]
    /// A field no CDI version has.
    UnknownField {
        /// Where, as a JSON path (`devices[1].containerEdits`).
        at: String,
        /// The kind of object it is in.
        object: &'static str,
        /// The field's name.
        field: String,
    },
    #[error("{at}: {field:?} came in CDI {since}, the spec declares {declared}")]
    /// A field newer than the declared version.
    FieldTooNew {
        /// Where, as a JSON path (`devices[1].containerEdits`).
        at: String,
        /// The field's name.
        field: String,
        /// The first version with the field.
        since: CdiVersion,
        /// The version the spec declares.
        declared: CdiVersion,
    },
    #[error("{at}: the required field {field:?} is missing")]
    /// A required field is missing.
    Missing {
        /// Where, as a JSON path (`devices[1].containerEdits`).
        at: String,
        /// The field's name.
        field: &'static str,
    },
    #[error("{at}: expected {expected}")]
    /// A field of the wrong JSON type.
    Type {
        /// Where, as a JSON path (`devices[1].containerEdits`).
        at: String,
        /// The JSON type expected.
        expected: &'static str,
    },
    #[error("{at}: {value:?} is not valid in CDI {declared}: {rule}")]
    /// A value the declared version's rules refuse.
    Invalid {
        /// Where, as a JSON path (`devices[1].containerEdits`).
        at: String,
        /// The offending value, as given.
        value: String,
        /// The version the spec declares.
        declared: CdiVersion,
        /// The rule it breaks.
        rule: &'static str,
    },
    #[error("the content needs CDI {needs}, the spec declares {declared}")]
    /// The declared version is lower than the content needs.
    VersionTooLow {
        /// The version the spec declares.
        declared: CdiVersion,
        /// The lowest version its content needs.
        needs: CdiVersion,
    },
}

/// Checks `doc` against the rules of its `cdiVersion` and returns that version.
pub fn check(doc: &Value) -> Result<CdiVersion, SchemaError> {
    let text = doc
        .get("cdiVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| SchemaError::Missing {
            at: "spec".into(),
            field: "cdiVersion",
        })?;
    let declared =
        CdiVersion::parse(text).ok_or_else(|| SchemaError::UnknownVersion(text.into()))?;
    let c = Checker { declared };
    c.spec(doc)?;
    let needs = minimum(doc);
    if needs > declared {
        return Err(SchemaError::VersionTooLow { declared, needs });
    }
    Ok(declared)
}

/// The node types a device node may name (empty: the runtime stats the host's node).
const NODE_TYPES: [&str; 5] = ["", "b", "c", "u", "p"];
/// The OCI hooks a CDI hook may run at.
const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

struct Checker {
    declared: CdiVersion,
}

impl Checker {
    fn spec(&self, doc: &Value) -> Result<(), SchemaError> {
        let at = "spec";
        let fields = self.fields(doc, Object::Spec, at)?;
        let kind = string(fields, "kind", at)?;
        let (vendor, class) = kind.split_once('/').unwrap_or(("", kind));
        if !vendor_ok(vendor) || !class_ok(class, self.declared) {
            return Err(self.invalid(
                "kind",
                kind,
                "vendor/class: a vendor of letters, digits, '-', '_' and '.', a class of letters, digits, '-', '_' (and '.' from 0.6.0), each starting with a letter and ending with a letter or digit",
            ));
        }
        annotations(fields, at)?;
        if let Some(edits) = fields.get("containerEdits") {
            self.edits(edits, "containerEdits")?;
        }
        let devices = list(fields, "devices", at)?;
        if devices.is_empty() {
            return Err(SchemaError::Type {
                at: "devices".into(),
                expected: "at least one device",
            });
        }
        let mut names = BTreeSet::new();
        for (i, device) in devices.iter().enumerate() {
            let at = format!("devices[{i}]");
            let fields = self.fields(device, Object::Device, &at)?;
            let name = string(fields, "name", &at)?;
            if !device_name_ok(name, self.declared) {
                return Err(self.invalid(
                    &format!("{at}.name"),
                    name,
                    "letters, digits, '-', '_', '.' and ':', starting with a letter (or from 0.5.0 a digit) and ending with a letter or digit",
                ));
            }
            if !names.insert(name) {
                return Err(self.invalid(&format!("{at}.name"), name, "device names are unique"));
            }
            annotations(fields, &at)?;
            let edits_at = format!("{at}.containerEdits");
            let edits = self.edits(&fields["containerEdits"], &edits_at)?;
            if edits.values().all(is_empty) {
                return Err(SchemaError::Type {
                    at: edits_at,
                    expected: "something for the runtime to apply (a device without edits is refused)",
                });
            }
        }
        Ok(())
    }

    fn edits<'a>(&self, value: &'a Value, at: &str) -> Result<&'a Map<String, Value>, SchemaError> {
        let fields = self.fields(value, Object::ContainerEdits, at)?;
        self.env(fields, at)?;
        for (i, node) in optional_list(fields, "deviceNodes", at)?.iter().enumerate() {
            let at = format!("{at}.deviceNodes[{i}]");
            let node = self.fields(node, Object::DeviceNode, &at)?;
            non_empty(node, "path", &at)?;
            optional_string(node, "hostPath", &at)?;
            let kind = optional_string(node, "type", &at)?.unwrap_or("");
            if !NODE_TYPES.contains(&kind) {
                return Err(self.invalid(&format!("{at}.type"), kind, "one of b, c, u, p"));
            }
            let perms = optional_string(node, "permissions", &at)?.unwrap_or("");
            if !perms.chars().all(|c| "rwm".contains(c)) {
                return Err(self.invalid(&format!("{at}.permissions"), perms, "only r, w and m"));
            }
            for number in ["major", "minor", "fileMode", "uid", "gid"] {
                if node.get(number).is_some_and(|n| !n.is_i64()) {
                    return Err(SchemaError::Type {
                        at: format!("{at}.{number}"),
                        expected: "an integer",
                    });
                }
            }
        }
        for (i, mount) in optional_list(fields, "mounts", at)?.iter().enumerate() {
            let at = format!("{at}.mounts[{i}]");
            let mount = self.fields(mount, Object::Mount, &at)?;
            non_empty(mount, "hostPath", &at)?;
            non_empty(mount, "containerPath", &at)?;
            optional_string(mount, "type", &at)?;
            strings(mount, "options", &at)?;
        }
        for (i, hook) in optional_list(fields, "hooks", at)?.iter().enumerate() {
            let at = format!("{at}.hooks[{i}]");
            let hook = self.fields(hook, Object::Hook, &at)?;
            let name = string(hook, "hookName", &at)?;
            if !HOOK_NAMES.contains(&name) {
                return Err(self.invalid(
                    &format!("{at}.hookName"),
                    name,
                    "an OCI hook: prestart, createRuntime, createContainer, startContainer, poststart or poststop",
                ));
            }
            non_empty(hook, "path", &at)?;
            strings(hook, "args", &at)?;
            self.env(hook, &at)?;
        }
        Ok(fields)
    }

    /// `env` of edits or of a hook: `NAME=value` strings.
    fn env(&self, fields: &Map<String, Value>, at: &str) -> Result<(), SchemaError> {
        for (i, entry) in strings(fields, "env", at)?.into_iter().enumerate() {
            if entry.find('=').is_none_or(|eq| eq == 0) {
                return Err(self.invalid(&format!("{at}.env[{i}]"), entry, "NAME=value"));
            }
        }
        Ok(())
    }

    /// `value` as an `object`: every field one the declared version has, every required one
    /// there.
    fn fields<'a>(
        &self,
        value: &'a Value,
        object: Object,
        at: &str,
    ) -> Result<&'a Map<String, Value>, SchemaError> {
        let fields = value.as_object().ok_or_else(|| SchemaError::Type {
            at: at.into(),
            expected: "an object",
        })?;
        for field in fields.keys() {
            match field_since(object, field) {
                None => {
                    return Err(SchemaError::UnknownField {
                        at: at.into(),
                        object: object.name(),
                        field: field.clone(),
                    });
                }
                Some(since) if since > self.declared => {
                    return Err(SchemaError::FieldTooNew {
                        at: at.into(),
                        field: field.clone(),
                        since,
                        declared: self.declared,
                    });
                }
                Some(_) => {}
            }
        }
        for field in required(object) {
            if !fields.contains_key(*field) {
                return Err(SchemaError::Missing {
                    at: at.into(),
                    field,
                });
            }
        }
        Ok(fields)
    }

    fn invalid(&self, at: &str, value: &str, rule: &'static str) -> SchemaError {
        SchemaError::Invalid {
            at: at.into(),
            value: value.into(),
            declared: self.declared,
            rule,
        }
    }
}

/// The fields an object must have (the schema's `required`).
fn required(object: Object) -> &'static [&'static str] {
    match object {
        Object::Spec => &["cdiVersion", "kind", "devices"],
        Object::Device => &["name", "containerEdits"],
        Object::ContainerEdits => &[],
        Object::DeviceNode => &["path"],
        Object::Mount => &["hostPath", "containerPath"],
        Object::Hook => &["hookName", "path"],
    }
}

/// An edit that gives the runtime nothing to do: an absent, null or empty value.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

fn string<'a>(
    fields: &'a Map<String, Value>,
    field: &'static str,
    at: &str,
) -> Result<&'a str, SchemaError> {
    optional_string(fields, field, at)?.ok_or_else(|| SchemaError::Missing {
        at: at.into(),
        field,
    })
}

fn non_empty<'a>(
    fields: &'a Map<String, Value>,
    field: &'static str,
    at: &str,
) -> Result<&'a str, SchemaError> {
    let s = string(fields, field, at)?;
    if s.is_empty() {
        return Err(SchemaError::Type {
            at: format!("{at}.{field}"),
            expected: "a non-empty string",
        });
    }
    Ok(s)
}

fn optional_string<'a>(
    fields: &'a Map<String, Value>,
    field: &str,
    at: &str,
) -> Result<Option<&'a str>, SchemaError> {
    match fields.get(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(SchemaError::Type {
            at: format!("{at}.{field}"),
            expected: "a string",
        }),
    }
}

fn list<'a>(
    fields: &'a Map<String, Value>,
    field: &'static str,
    at: &str,
) -> Result<&'a [Value], SchemaError> {
    match fields.get(field) {
        None => Err(SchemaError::Missing {
            at: at.into(),
            field,
        }),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(SchemaError::Type {
            at: format!("{at}.{field}"),
            expected: "a list",
        }),
    }
}

fn optional_list<'a>(
    fields: &'a Map<String, Value>,
    field: &'static str,
    at: &str,
) -> Result<&'a [Value], SchemaError> {
    match fields.get(field) {
        None | Some(Value::Null) => Ok(&[]),
        Some(_) => list(fields, field, at),
    }
}

fn strings<'a>(
    fields: &'a Map<String, Value>,
    field: &'static str,
    at: &str,
) -> Result<Vec<&'a str>, SchemaError> {
    optional_list(fields, field, at)?
        .iter()
        .map(|v| {
            v.as_str().ok_or_else(|| SchemaError::Type {
                at: format!("{at}.{field}"),
                expected: "a list of strings",
            })
        })
        .collect()
}

/// `annotations`, where present: an object of strings.
fn annotations(fields: &Map<String, Value>, at: &str) -> Result<(), SchemaError> {
    let Some(value) = fields.get("annotations") else {
        return Ok(());
    };
    let wrong = || SchemaError::Type {
        at: format!("{at}.annotations"),
        expected: "an object of strings",
    };
    let map = value.as_object().ok_or_else(wrong)?;
    if map.iter().any(|(k, v)| k.is_empty() || !v.is_string()) {
        return Err(wrong());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn good() -> Value {
        json!({
            "cdiVersion": "0.4.0",
            "kind": "gpu.example.com/i915",
            "devices": [{"name": "card0", "containerEdits": {
                "env": ["A=1"],
                "deviceNodes": [{"path": "/dev/dri/card0", "permissions": "rw"}],
                "mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "none", "options": ["bind", "ro"]}]
            }}]
        })
    }

    fn refused(doc: &Value) -> SchemaError {
        check(doc).expect_err("refused")
    }

    #[test]
    fn a_good_spec_passes_at_its_version_and_later_ones() {
        assert_eq!(check(&good()), Ok(CdiVersion::V0_4_0));
        let mut doc = good();
        doc["cdiVersion"] = json!("1.1.0");
        assert_eq!(check(&doc), Ok(CdiVersion::V1_1_0));
    }

    #[test]
    fn a_version_below_the_content_or_unknown_is_refused() {
        let mut doc = good();
        doc["cdiVersion"] = json!("0.3.0");
        assert_eq!(
            refused(&doc),
            SchemaError::FieldTooNew {
                at: "devices[0].containerEdits.mounts[0]".into(),
                field: "type".into(),
                since: CdiVersion::V0_4_0,
                declared: CdiVersion::V0_3_0,
            }
        );
        doc["devices"][0]["name"] = json!("0card");
        doc["devices"][0]["containerEdits"]["mounts"][0]
            .as_object_mut()
            .unwrap()
            .remove("type");
        assert!(
            matches!(refused(&doc), SchemaError::Invalid { at, .. } if at == "devices[0].name")
        );
        doc["cdiVersion"] = json!("0.6");
        assert_eq!(refused(&doc), SchemaError::UnknownVersion("0.6".into()));
    }

    #[test]
    fn a_dotted_class_needs_0_6_0() {
        let mut doc = good();
        doc["kind"] = json!("gpu.example.com/i915.x");
        assert!(matches!(refused(&doc), SchemaError::Invalid { at, .. } if at == "kind"));
        doc["cdiVersion"] = json!("0.6.0");
        assert!(check(&doc).is_ok());
    }

    #[test]
    fn what_a_loader_refuses_is_refused() {
        type Edit = fn(&mut Value);
        let cases: Vec<(&str, Edit)> = vec![
            ("unknown field", |d| d["devices"][0]["extra"] = json!(1)),
            ("missing devices", |d| {
                d.as_object_mut().unwrap().remove("devices");
            }),
            ("no devices", |d| d["devices"] = json!([])),
            ("empty edits", |d| {
                d["devices"][0]["containerEdits"] = json!({})
            }),
            ("env without =", |d| {
                d["devices"][0]["containerEdits"]["env"] = json!(["=1"])
            }),
            ("node type", |d| {
                d["devices"][0]["containerEdits"]["deviceNodes"][0]["type"] = json!("x")
            }),
            ("permissions", |d| {
                d["devices"][0]["containerEdits"]["deviceNodes"][0]["permissions"] = json!("rwx")
            }),
            ("empty mount path", |d| {
                d["devices"][0]["containerEdits"]["mounts"][0]["hostPath"] = json!("")
            }),
            ("hook name", |d| {
                d["containerEdits"] = json!({"hooks": [{"hookName": "later", "path": "/x"}]})
            }),
            ("duplicate name", |d| {
                let dev = d["devices"][0].clone();
                d["devices"].as_array_mut().unwrap().push(dev);
            }),
            ("vendor", |d| d["kind"] = json!("1vendor.example/x")),
            ("no class", |d| d["kind"] = json!("vendor.example")),
            ("annotation value", |d| {
                d["cdiVersion"] = json!("0.6.0");
                d["devices"][0]["annotations"] = json!({"a": 1});
            }),
            ("major", |d| {
                d["devices"][0]["containerEdits"]["deviceNodes"][0]["major"] = json!("1")
            }),
        ];
        for (what, edit) in cases {
            let mut doc = good();
            edit(&mut doc);
            assert!(check(&doc).is_err(), "{what}: {doc}");
        }
    }

    #[test]
    fn errors_say_where_and_what_is_valid() {
        let mut doc = good();
        doc["devices"][0]["containerEdits"]["deviceNodes"][0]["permissions"] = json!("rwx");
        assert_eq!(
            refused(&doc).to_string(),
            "devices[0].containerEdits.deviceNodes[0].permissions: \"rwx\" is not valid in CDI 0.4.0: only r, w and m"
        );
    }
}
