//! Typed device attributes and capacities (contract 0.1.1, `notify-with-attributes`), validated
//! with the rules the Kubernetes API applies to a ResourceSlice's devices.
//!
//! Why here: a guest's attributes are as untrusted as its tree, and a front-end that publishes
//! them (Dynamic Resource Allocation) must never send the API server a slice it would refuse; so
//! they are checked once, when the tree is, and kept on the validated tree's devices. The
//! device-plugin servers ignore them: kubelet's Device Plugin API has no place for them.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::bindings::types as wit;

/// Longest C-identifier part of a qualified name (Kubernetes' `DeviceMaxIDLength`).
pub const MAX_NAME: usize = 32;
/// Longest DNS-subdomain prefix of a qualified name.
pub const MAX_PREFIX: usize = 253;
/// Most attributes and capacities of one device, together
/// (`ResourceSliceMaxAttributesAndCapacitiesPerDevice`).
pub const MAX_PER_DEVICE: usize = 32;
/// Longest string or version value (`DeviceAttributeMaxValueLength`).
pub const MAX_VALUE: usize = 64;
/// The prefix Kubernetes defines attributes under; the host sets those itself (NUMA node, PCI
/// bus id), so a guest may not.
pub const RESERVED_PREFIX: &str = "resource.kubernetes.io";

/// One typed attribute value, as Kubernetes' `DeviceAttribute`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttributeValue {
    /// `bool`.
    Bool(bool),
    /// `int`.
    Int(i64),
    /// `string`, at most [`MAX_VALUE`] characters.
    String(String),
    /// `version`: semver 2.0, at most [`MAX_VALUE`] characters.
    Version(String),
}

/// A device's validated attributes and capacities, by qualified name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Attributes {
    /// Typed attributes.
    pub attributes: BTreeMap<String, AttributeValue>,
    /// Capacities, as Kubernetes quantity strings.
    pub capacities: BTreeMap<String, String>,
}

impl Attributes {
    /// True when the device carries none: the serialised tree then omits the field, so output
    /// for trees without attributes is what it always was.
    pub fn is_empty(&self) -> bool {
        self.attributes.is_empty() && self.capacities.is_empty()
    }
}

/// Which rule an attribute or capacity broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttributeRule {
    /// The entry names no device of the tree.
    UnknownDevice,
    /// Two entries for one device.
    DuplicateDevice,
    /// Not an optional DNS-subdomain prefix and `/` then a C identifier of at most 32 characters.
    QualifiedName,
    /// Under `resource.kubernetes.io/`.
    ReservedPrefix,
    /// A name given twice for one device.
    DuplicateName,
    /// More than 32 attributes and capacities on one device.
    TooMany,
    /// A string value longer than 64 characters.
    StringLength,
    /// A version that is not semver 2.0 or longer than 64 characters.
    Version,
    /// A capacity that is not a Kubernetes quantity.
    Quantity,
}

impl AttributeRule {
    /// The rule as a short stable name (for logs and counters).
    pub fn name(self) -> &'static str {
        match self {
            AttributeRule::UnknownDevice => "attribute-device-exists",
            AttributeRule::DuplicateDevice => "attribute-device-unique",
            AttributeRule::QualifiedName => "attribute-qualified-name",
            AttributeRule::ReservedPrefix => "attribute-reserved-prefix",
            AttributeRule::DuplicateName => "attribute-name-unique",
            AttributeRule::TooMany => "attribute-max-per-device",
            AttributeRule::StringLength => "attribute-string-length",
            AttributeRule::Version => "attribute-version",
            AttributeRule::Quantity => "capacity-quantity",
        }
    }

    fn explain(self) -> String {
        match self {
            AttributeRule::UnknownDevice => "it names no device of the notified tree".into(),
            AttributeRule::DuplicateDevice => "the device is given attributes twice".into(),
            AttributeRule::QualifiedName => format!(
                "a name must be an optional DNS-subdomain prefix (at most {MAX_PREFIX} characters) and '/', then a C identifier of at most {MAX_NAME} characters"
            ),
            AttributeRule::ReservedPrefix => {
                format!("the prefix {RESERVED_PREFIX}/ is the host's")
            }
            AttributeRule::DuplicateName => "the name is given twice for the device".into(),
            AttributeRule::TooMany => {
                format!("a device carries at most {MAX_PER_DEVICE} attributes and capacities")
            }
            AttributeRule::StringLength => {
                format!("a string value is at most {MAX_VALUE} characters")
            }
            AttributeRule::Version => {
                format!("a version is a semantic version (2.0) of at most {MAX_VALUE} characters")
            }
            AttributeRule::Quantity => {
                "a capacity is a Kubernetes quantity (e.g. \"16Gi\", \"2\", \"500m\")".into()
            }
        }
    }
}

/// An attribute or capacity refused: the device, the attribute and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "attribute {name:?} of device {id:?} in dev-type {dev_type:?} is refused: {}",
    rule.explain()
)]
pub struct AttributeError {
    /// The device's group.
    pub dev_type: String,
    /// The device's id.
    pub id: String,
    /// The attribute or capacity name (empty when the rule is about the device's entry).
    pub name: String,
    /// The rule broken.
    pub rule: AttributeRule,
}

/// Checks the guest's `entries` for the devices of `tree` (`dev-type -> id -> ()`-like lookup
/// through `has_device`), returning each device's validated attributes.
pub fn validate(
    entries: Vec<wit::DeviceAttributes>,
    has_device: impl Fn(&str, &str) -> bool,
) -> Result<BTreeMap<(String, String), Attributes>, AttributeError> {
    let mut out = BTreeMap::new();
    for entry in entries {
        let err = |name: &str, rule| AttributeError {
            dev_type: entry.dev_type.clone(),
            id: entry.id.clone(),
            name: name.to_string(),
            rule,
        };
        if !has_device(&entry.dev_type, &entry.id) {
            return Err(err("", AttributeRule::UnknownDevice));
        }
        if entry.attributes.len() + entry.capacities.len() > MAX_PER_DEVICE {
            return Err(err("", AttributeRule::TooMany));
        }
        let mut attrs = Attributes::default();
        for (name, value) in &entry.attributes {
            check_name(name).map_err(|rule| err(name, rule))?;
            let value = match value {
                wit::AttributeValue::Boolean(b) => AttributeValue::Bool(*b),
                wit::AttributeValue::Int(i) => AttributeValue::Int(*i),
                wit::AttributeValue::Text(s) => {
                    if s.chars().count() > MAX_VALUE {
                        return Err(err(name, AttributeRule::StringLength));
                    }
                    AttributeValue::String(s.clone())
                }
                wit::AttributeValue::Version(v) => {
                    if v.chars().count() > MAX_VALUE || semver::Version::parse(v).is_err() {
                        return Err(err(name, AttributeRule::Version));
                    }
                    AttributeValue::Version(v.clone())
                }
            };
            if attrs.attributes.insert(name.clone(), value).is_some() {
                return Err(err(name, AttributeRule::DuplicateName));
            }
        }
        for (name, quantity) in &entry.capacities {
            check_name(name).map_err(|rule| err(name, rule))?;
            if !is_quantity(quantity) {
                return Err(err(name, AttributeRule::Quantity));
            }
            if attrs.attributes.contains_key(name)
                || attrs
                    .capacities
                    .insert(name.clone(), quantity.clone())
                    .is_some()
            {
                return Err(err(name, AttributeRule::DuplicateName));
            }
        }
        if out
            .insert((entry.dev_type.clone(), entry.id.clone()), attrs)
            .is_some()
        {
            return Err(err("", AttributeRule::DuplicateDevice));
        }
    }
    Ok(out)
}

/// A qualified name as Kubernetes' `FullyQualifiedName` or its short form: an optional
/// DNS-subdomain prefix and `/`, then a C identifier of at most [`MAX_NAME`] characters.
fn check_name(name: &str) -> Result<(), AttributeRule> {
    let (prefix, ident) = match name.split_once('/') {
        Some((prefix, ident)) => (Some(prefix), ident),
        None => (None, name),
    };
    if let Some(prefix) = prefix {
        if !is_dns_subdomain(prefix) {
            return Err(AttributeRule::QualifiedName);
        }
        if prefix == RESERVED_PREFIX {
            return Err(AttributeRule::ReservedPrefix);
        }
    }
    let c_ident = ident.len() <= MAX_NAME
        && ident
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && ident.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if c_ident {
        Ok(())
    } else {
        Err(AttributeRule::QualifiedName)
    }
}

/// RFC 1123 subdomain: lowercase labels of `[a-z0-9-]`, starting and ending alphanumeric, joined
/// by dots, at most [`MAX_PREFIX`] characters.
fn is_dns_subdomain(s: &str) -> bool {
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !s.is_empty() && s.len() <= MAX_PREFIX && s.split('.').all(label)
}

/// Kubernetes' quantity grammar: a signed decimal number, then an optional binary suffix
/// (`Ki`..`Ei`), decimal suffix (`n u m k M G T P E`) or exponent (`e3`, `E-2`).
fn is_quantity(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let number_ok = !(int.is_empty() && frac.is_empty())
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit());
    if !number_ok {
        return false;
    }
    match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T"
        | "P" | "E" => true,
        exp => exp
            .strip_prefix(['e', 'E'])
            .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        attributes: Vec<(&str, wit::AttributeValue)>,
        capacities: Vec<(&str, &str)>,
    ) -> wit::DeviceAttributes {
        wit::DeviceAttributes {
            dev_type: "gpu".into(),
            id: "card0".into(),
            attributes: attributes
                .into_iter()
                .map(|(n, v)| (n.to_string(), v))
                .collect(),
            capacities: capacities
                .into_iter()
                .map(|(n, q)| (n.to_string(), q.to_string()))
                .collect(),
        }
    }

    fn only_card0(dev_type: &str, id: &str) -> bool {
        dev_type == "gpu" && id == "card0"
    }

    fn text(s: &str) -> wit::AttributeValue {
        wit::AttributeValue::Text(s.into())
    }

    /// Asserts `entries` are refused by `rule`, the message naming the device, the attribute
    /// and the rule.
    fn refused(entries: Vec<wit::DeviceAttributes>, name: &str, rule: AttributeRule) {
        let err = validate(entries, only_card0).expect_err("refused");
        assert_eq!(err.rule, rule);
        assert_eq!(err.name, name);
        let message = err.to_string();
        for part in ["\"card0\"", "\"gpu\"", &format!("{name:?}")] {
            assert!(message.contains(part), "{message} lacks {part}");
        }
        assert!(message.contains(&rule.explain()), "{message}");
    }

    #[test]
    fn a_valid_device_keeps_its_typed_attributes_and_capacities() {
        let attrs = validate(
            vec![entry(
                vec![
                    ("model", text("A100")),
                    ("gpu.example.com/ecc", wit::AttributeValue::Boolean(true)),
                    ("cores", wit::AttributeValue::Int(108)),
                    (
                        "driverVersion",
                        wit::AttributeValue::Version("550.54.15".into()),
                    ),
                    ("x", text(&"s".repeat(MAX_VALUE))),
                ],
                vec![("memory", "80Gi"), ("gpu.example.com/slices", "7")],
            )],
            only_card0,
        )
        .unwrap();
        let card = &attrs[&("gpu".to_string(), "card0".to_string())];
        assert_eq!(card.attributes["cores"], AttributeValue::Int(108));
        assert_eq!(card.capacities["memory"], "80Gi");
        assert_eq!(validate(vec![], only_card0).unwrap().len(), 0);
    }

    #[test]
    fn names_are_qualified_names() {
        for ok in [
            "a",
            "_x",
            "memoryType",
            &"n".repeat(MAX_NAME),
            "gpu.example.com/memoryType",
            "a-b.c/x1",
        ] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("1x", "starts with a digit"),
            ("memory-type", "a hyphen"),
            (&"n".repeat(MAX_NAME + 1) as &str, "too long"),
            ("Gpu.Example/x", "uppercase prefix"),
            ("-a.b/x", "prefix label starts with '-'"),
            ("a..b/x", "empty label"),
            ("/x", "empty prefix"),
            ("a/b/c", "two slashes"),
        ] {
            assert_eq!(check_name(bad), Err(AttributeRule::QualifiedName), "{why}");
        }
        refused(
            vec![entry(vec![("memory-type", text("x"))], vec![])],
            "memory-type",
            AttributeRule::QualifiedName,
        );
        refused(
            vec![entry(vec![], vec![("gpu/1slices", "1")])],
            "gpu/1slices",
            AttributeRule::QualifiedName,
        );
    }

    #[test]
    fn the_kubernetes_prefix_is_the_hosts() {
        assert!(
            validate(
                vec![entry(
                    vec![("resource.kubernetes.io.example/x", text("a"))],
                    vec![]
                )],
                only_card0
            )
            .is_ok()
        );
        refused(
            vec![entry(
                vec![("resource.kubernetes.io/pciBusID", text("0000:01:00.0"))],
                vec![],
            )],
            "resource.kubernetes.io/pciBusID",
            AttributeRule::ReservedPrefix,
        );
        refused(
            vec![entry(
                vec![],
                vec![("resource.kubernetes.io/memory", "1Gi")],
            )],
            "resource.kubernetes.io/memory",
            AttributeRule::ReservedPrefix,
        );
    }

    #[test]
    fn at_most_32_attributes_and_capacities_per_device() {
        let names: Vec<String> = (0..MAX_PER_DEVICE).map(|i| format!("a{i}")).collect();
        let half = MAX_PER_DEVICE / 2;
        let at_limit = entry(
            names[..half]
                .iter()
                .map(|n| (n.as_str(), text("v")))
                .collect(),
            names[half..].iter().map(|n| (n.as_str(), "1")).collect(),
        );
        assert!(validate(vec![at_limit.clone()], only_card0).is_ok());
        let mut over = at_limit;
        over.capacities.push(("extra".into(), "1".into()));
        refused(vec![over], "", AttributeRule::TooMany);
    }

    #[test]
    fn string_values_are_at_most_64_characters() {
        // 64 characters, more bytes: the limit counts characters.
        assert!(
            validate(
                vec![entry(vec![("m", text(&"é".repeat(64)))], vec![])],
                only_card0
            )
            .is_ok()
        );
        refused(
            vec![entry(
                vec![("model", text(&"s".repeat(MAX_VALUE + 1)))],
                vec![],
            )],
            "model",
            AttributeRule::StringLength,
        );
    }

    #[test]
    fn versions_are_semver_of_at_most_64_characters() {
        let v = |s: &str| wit::AttributeValue::Version(s.into());
        assert!(
            validate(
                vec![entry(vec![("fw", v("1.2.3-rc.1+build.5"))], vec![])],
                only_card0
            )
            .is_ok()
        );
        for bad in [
            "1.2",
            "v1.2.3",
            "01.2.3",
            &format!("1.2.3-{}", "a".repeat(60)) as &str,
        ] {
            refused(
                vec![entry(vec![("fw", v(bad))], vec![])],
                "fw",
                AttributeRule::Version,
            );
        }
    }

    #[test]
    fn capacities_are_quantities() {
        for ok in ["1", "16Gi", "500m", "1.5", ".5", "+2", "1e3", "2E-2", "0"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "Gi", "1GB", "1.2.3", "e3", "1e", "--1", "1 Gi"] {
            assert!(!is_quantity(bad), "{bad}");
        }
        refused(
            vec![entry(vec![], vec![("memory", "80GB")])],
            "memory",
            AttributeRule::Quantity,
        );
    }

    #[test]
    fn a_name_once_per_device_and_a_device_once() {
        refused(
            vec![entry(vec![("m", text("a")), ("m", text("b"))], vec![])],
            "m",
            AttributeRule::DuplicateName,
        );
        refused(
            vec![entry(vec![("m", text("a"))], vec![("m", "1")])],
            "m",
            AttributeRule::DuplicateName,
        );
        refused(
            vec![entry(vec![], vec![]), entry(vec![], vec![])],
            "",
            AttributeRule::DuplicateDevice,
        );
    }

    #[test]
    fn entries_name_devices_of_the_tree() {
        let mut other = entry(vec![("m", text("a"))], vec![]);
        other.id = "card9".into();
        let err = validate(vec![other], only_card0).expect_err("unknown device");
        assert_eq!(err.rule, AttributeRule::UnknownDevice);
        assert!(err.to_string().contains("\"card9\""), "{err}");
    }
}
