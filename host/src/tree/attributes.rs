//! Typed device attributes and capacities (contract 0.1.1, `notify-with-attributes`), validated
//! with the rules the Kubernetes API applies to a ResourceSlice's devices.
//!
//! Why here: a guest's attributes are as untrusted as its tree, and a front-end that publishes
//! them (Dynamic Resource Allocation) must never send the API server a slice it would refuse; so
//! they are checked once, when the tree is, and kept on the validated tree's devices. The
//! device-plugin servers ignore them: kubelet's Device Plugin API has no place for them.

use serde::Serialize;

use crate::bindings::types as wit;

/// Longest C-identifier part of a qualified name, in bytes (Kubernetes' `DeviceMaxIDLength`).
pub const MAX_NAME: usize = 32;
/// Longest DNS-subdomain prefix of a qualified name, in bytes: Kubernetes checks the prefix as a
/// driver name (`DriverNameMaxLength`).
pub const MAX_PREFIX: usize = 63;
/// Most attributes and capacities of one device, together
/// (`ResourceSliceMaxAttributesAndCapacitiesPerDevice`).
pub const MAX_PER_DEVICE: usize = 32;
/// Longest string or version value, in bytes: Kubernetes compares `DeviceAttributeMaxValueLength`
/// with Go's `len()`, which counts bytes, so a 64-character value of multi-byte characters is
/// refused by the API server.
pub const MAX_VALUE: usize = 64;
/// Longest capacity quantity, in bytes. Kubernetes accepts any quantity it can parse, of any
/// length (the request's size is the only bound); a quantity is a number and a suffix, and 64
/// bytes hold any value [`MAX_QUANTITY_VALUE`] allows with nine fraction digits and a suffix.
pub const MAX_QUANTITY: usize = 64;
/// Largest capacity value, in absolute value: a Kubernetes quantity holds an int64 exactly,
/// silently caps a binary-suffixed one there (`9Ei` becomes `8Ei - 1`) and builds an
/// arbitrary-precision number for a larger decimal one (`1e999999999` costs the API server a
/// billion digits). Values finer than `1n` are silently rounded up, so they are refused too.
pub const MAX_QUANTITY_VALUE: i64 = i64::MAX;
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
    /// `string`, at most [`MAX_VALUE`] bytes.
    String(String),
    /// `version`: semver 2.0, at most [`MAX_VALUE`] bytes.
    Version(String),
}

/// A device's validated attributes and capacities, by qualified name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Attributes {
    /// Typed attributes.
    pub attributes: Named<AttributeValue>,
    /// Capacities, as Kubernetes quantity strings.
    pub capacities: Named<String>,
}

/// Values by name, in name order, serialised as a map.
///
/// Why not a `BTreeMap`: a device carries a handful of attributes, and a map allocates a node of
/// eleven slots for the first one; two maps per device of a 16,384-device tree cost 1.2 KB a
/// device, more than the rest of the device. A sorted vector holds what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named<V>(Vec<(String, V)>);

impl<V> Default for Named<V> {
    fn default() -> Self {
        Named(Vec::new())
    }
}

impl<V> Named<V> {
    /// Room for `n` values without growing: validation knows how many a device gives, and an
    /// array grown by doubling would hold up to twice what it holds ([`crate::footprint`]).
    pub(crate) fn with_capacity(n: usize) -> Self {
        Named(Vec::with_capacity(n))
    }

    /// How many values it has room for (its host memory, [`crate::footprint`]).
    pub(crate) fn capacity(&self) -> usize {
        self.0.capacity()
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&V> {
        self.position(name).ok().map(|i| &self.0[i].1)
    }

    /// Whether `name` has a value.
    pub fn contains_key(&self, name: &str) -> bool {
        self.position(name).is_ok()
    }

    /// Sets `name` to `value`, returning the value it replaces.
    pub fn insert(&mut self, name: String, value: V) -> Option<V> {
        match self.position(&name) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (name, value));
                None
            }
        }
    }

    /// Names and values, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.0.iter().map(|(n, v)| (n, v))
    }

    /// How many names have a value.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no name has a value.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<V> std::ops::Index<&str> for Named<V> {
    type Output = V;

    /// The value of `name`; panics when it has none, as a map's index does.
    fn index(&self, name: &str) -> &V {
        self.get(name)
            .unwrap_or_else(|| panic!("no value named {name:?}"))
    }
}

impl<V: Serialize> Serialize for Named<V> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
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
    /// Not an optional DNS-subdomain prefix and `/` then a C identifier of at most 32 bytes.
    QualifiedName,
    /// Under `resource.kubernetes.io/`.
    ReservedPrefix,
    /// A name given twice for one device.
    DuplicateName,
    /// More than 32 attributes and capacities on one device.
    TooMany,
    /// A string value longer than 64 bytes.
    StringLength,
    /// A version that is not semver 2.0 or longer than 64 bytes.
    Version,
    /// A capacity that is not a Kubernetes quantity of at most 64 bytes whose value Kubernetes
    /// holds exactly.
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
                "a name must be an optional DNS-subdomain prefix (at most {MAX_PREFIX} bytes) and '/', then a C identifier of at most {MAX_NAME} bytes"
            ),
            AttributeRule::ReservedPrefix => {
                format!("the prefix {RESERVED_PREFIX}/ is the host's")
            }
            AttributeRule::DuplicateName => "the name is given twice for the device".into(),
            AttributeRule::TooMany => {
                format!("a device carries at most {MAX_PER_DEVICE} attributes and capacities")
            }
            AttributeRule::StringLength => {
                format!("a string value is at most {MAX_VALUE} bytes (UTF-8)")
            }
            AttributeRule::Version => {
                format!("a version is a semantic version (2.0) of at most {MAX_VALUE} bytes")
            }
            AttributeRule::Quantity => format!(
                "a capacity is a Kubernetes quantity (e.g. \"16Gi\", \"2\", \"500m\") of at most {MAX_QUANTITY} bytes, its value at most {MAX_QUANTITY_VALUE} in absolute value and a whole number of 1n"
            ),
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
/// through `has_device`), returning each device's validated attributes: the rules of one
/// entry as [`crate::tree::DeviceTree::attach`] applies them, tested here entry by entry.
#[cfg(test)]
pub(crate) fn validate(
    entries: Vec<wit::DeviceAttributes>,
    has_device: impl Fn(&str, &str) -> bool,
) -> Result<std::collections::BTreeMap<(String, String), Attributes>, AttributeError> {
    let mut out = std::collections::BTreeMap::new();
    for entry in entries {
        let (key, attrs) = validate_entry(entry, &has_device)?;
        if out.contains_key(&key) {
            return Err(duplicate(key));
        }
        out.insert(key, attrs);
    }
    Ok(out)
}

/// A second entry for device `(dev_type, id)`.
pub(crate) fn duplicate((dev_type, id): (String, String)) -> AttributeError {
    AttributeError {
        dev_type,
        id,
        name: String::new(),
        rule: AttributeRule::DuplicateDevice,
    }
}

/// Checks one of the guest's entries (whether another names the same device is the caller's
/// to check), returning its device's `(dev-type, id)` and its validated attributes, made of the
/// entry's own strings.
pub(crate) fn validate_entry(
    entry: wit::DeviceAttributes,
    has_device: &impl Fn(&str, &str) -> bool,
) -> Result<((String, String), Attributes), AttributeError> {
    let wit::DeviceAttributes {
        dev_type,
        id,
        attributes,
        capacities,
    } = entry;
    let err = |name: &str, rule| AttributeError {
        dev_type: dev_type.clone(),
        id: id.clone(),
        name: name.to_string(),
        rule,
    };
    if !has_device(&dev_type, &id) {
        return Err(err("", AttributeRule::UnknownDevice));
    }
    if attributes.len() + capacities.len() > MAX_PER_DEVICE {
        return Err(err("", AttributeRule::TooMany));
    }
    let mut attrs = Attributes {
        attributes: Named::with_capacity(attributes.len()),
        capacities: Named::with_capacity(capacities.len()),
    };
    for (name, value) in attributes {
        check_name(&name).map_err(|rule| err(&name, rule))?;
        let value = match value {
            wit::AttributeValue::Boolean(b) => AttributeValue::Bool(b),
            wit::AttributeValue::Int(i) => AttributeValue::Int(i),
            wit::AttributeValue::Text(s) => {
                if s.len() > MAX_VALUE {
                    return Err(err(&name, AttributeRule::StringLength));
                }
                AttributeValue::String(s)
            }
            wit::AttributeValue::Version(v) => {
                if v.len() > MAX_VALUE || semver::Version::parse(&v).is_err() {
                    return Err(err(&name, AttributeRule::Version));
                }
                AttributeValue::Version(v)
            }
        };
        if attrs.attributes.contains_key(&name) {
            return Err(err(&name, AttributeRule::DuplicateName));
        }
        attrs.attributes.insert(name, value);
    }
    for (name, quantity) in capacities {
        check_name(&name).map_err(|rule| err(&name, rule))?;
        if !is_quantity(&quantity) {
            return Err(err(&name, AttributeRule::Quantity));
        }
        if attrs.attributes.contains_key(&name) || attrs.capacities.contains_key(&name) {
            return Err(err(&name, AttributeRule::DuplicateName));
        }
        attrs.capacities.insert(name, quantity);
    }
    Ok(((dev_type, id), attrs))
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
/// by dots, at most [`MAX_PREFIX`] bytes.
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

/// A capacity Kubernetes takes as the guest wrote it: its quantity grammar (a signed decimal
/// number, then an optional binary suffix `Ki`..`Ei`, decimal suffix `n u m k M G T P E` or
/// exponent `e3`, `E-2`), at most [`MAX_QUANTITY`] bytes, its value within
/// ±[`MAX_QUANTITY_VALUE`] and a whole number of `1n`.
fn is_quantity(s: &str) -> bool {
    if s.len() > MAX_QUANTITY {
        return false;
    }
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let digits_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(digits_end);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let number_ok = !(int.is_empty() && frac.is_empty())
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit());
    if !number_ok {
        return false;
    }
    // The value is `digits * 10^ten * 2^two`.
    let (ten, two): (i64, u32) = match suffix {
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "" => (0, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        exp => {
            let Some(e) = exp.strip_prefix(['e', 'E']) else {
                return false;
            };
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return false;
            }
            // At most 64 bytes: the exponent has fewer than 64 digits, but may still not fit.
            match e.parse::<i64>() {
                Ok(e) => (e, 0),
                Err(_) => return false,
            }
        }
    };
    fits(int, frac, ten, two)
}

/// Whether `int.frac * 10^ten * 2^two` is a whole number of nano-units of at most
/// [`MAX_QUANTITY_VALUE`]: in nano-units it must be an integer of at most `MAX * 10^9`, which
/// a `u128` holds.
fn fits(int: &str, frac: &str, ten: i64, two: u32) -> bool {
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return true;
    }
    // value = significant * 10^scale * 2^two
    let trailing = (digits.len() - significant.len()) as i64;
    let scale = ten - frac.len() as i64 + trailing;
    // In nano-units: significant * 10^(scale + 9) * 2^two. A negative power of ten leaves a
    // fraction of 1n, the significant digits ending in a non-zero digit; with a binary suffix
    // it may not (`0.0000000005Ki` is 512n), too rare a way to write a capacity to be worth
    // exact arithmetic: refused.
    let Ok(nano_scale) = u32::try_from(scale + 9) else {
        return false;
    };
    let limit = MAX_QUANTITY_VALUE as u128 * 1_000_000_000;
    let Ok(significant) = significant.parse::<u128>() else {
        return false;
    };
    10u128
        .checked_pow(nano_scale)
        .and_then(|p| significant.checked_mul(p))
        .and_then(|v| v.checked_mul(1u128 << two))
        .is_some_and(|v| v <= limit)
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
            &format!("{}/x", "a".repeat(MAX_PREFIX)),
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
            // Kubernetes checks the prefix as a driver name: at most 63 bytes.
            (
                &format!("{}.b/x", "a".repeat(MAX_PREFIX - 1)) as &str,
                "long prefix",
            ),
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
    fn string_values_are_at_most_64_bytes() {
        let ok = |value: &str| validate(vec![entry(vec![("m", text(value))], vec![])], only_card0);
        assert!(ok(&"s".repeat(63)).is_ok());
        assert!(ok(&"s".repeat(MAX_VALUE)).is_ok());
        // 32 two-byte characters: 64 bytes.
        assert!(ok(&"é".repeat(32)).is_ok());
        refused(
            vec![entry(
                vec![("model", text(&"s".repeat(MAX_VALUE + 1)))],
                vec![],
            )],
            "model",
            AttributeRule::StringLength,
        );
        // 33 two-byte characters: 66 bytes; 64 four-byte characters: 256 bytes. Kubernetes
        // counts bytes, so both would be refused by the API server.
        for value in [
            "é".repeat(33),
            "\u{1F600}".repeat(64),
            format!("{}é", "s".repeat(63)),
        ] {
            assert!(value.chars().count() <= MAX_VALUE && value.len() > MAX_VALUE);
            refused(
                vec![entry(vec![("model", text(&value))], vec![])],
                "model",
                AttributeRule::StringLength,
            );
        }
    }

    #[test]
    fn versions_are_semver_of_at_most_64_bytes() {
        let v = |s: &str| wit::AttributeValue::Version(s.into());
        assert!(
            validate(
                vec![entry(vec![("fw", v("1.2.3-rc.1+build.5"))], vec![])],
                only_card0
            )
            .is_ok()
        );
        // 64 bytes exactly, then 65.
        let at_limit = format!("1.2.3-{}", "a".repeat(MAX_VALUE - 6));
        assert_eq!(at_limit.len(), MAX_VALUE);
        assert!(validate(vec![entry(vec![("fw", v(&at_limit))], vec![])], only_card0).is_ok());
        for bad in [
            "1.2",
            "v1.2.3",
            "01.2.3",
            &format!("{at_limit}a") as &str,
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
        for ok in [
            "1", "16Gi", "500m", "1.5", ".5", "+2", "1e3", "2E-2", "0", "1.", "-3k",
        ] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in [
            "", "Gi", "1GB", "1.2.3", "e3", "1e", "--1", "1 Gi", ".", "1e+",
        ] {
            assert!(!is_quantity(bad), "{bad}");
        }
        refused(
            vec![entry(vec![], vec![("memory", "80GB")])],
            "memory",
            AttributeRule::Quantity,
        );
    }

    #[test]
    fn capacities_are_at_most_64_bytes() {
        // Leading zeros keep the value small: only the length refuses these.
        let padded = |len: usize| format!("{}1", "0".repeat(len - 1));
        assert!(is_quantity(&padded(63)));
        assert!(is_quantity(&padded(MAX_QUANTITY)));
        assert!(!is_quantity(&padded(MAX_QUANTITY + 1)));
        // The giant capacity of a hostile guest: refused before any parsing.
        let giant = "9".repeat(28_000_000);
        refused(
            vec![entry(vec![], vec![("memory", &giant)])],
            "memory",
            AttributeRule::Quantity,
        );
    }

    #[test]
    fn capacity_values_are_what_kubernetes_holds_exactly() {
        let max = i64::MAX.to_string();
        let over = (i64::MAX as u128 + 1).to_string();
        for ok in [
            max.as_str(),
            &format!("-{max}"),
            "7.5Ei",
            "8191Pi",
            "9223372036854775807000m",
            "9223372036854775807000000000n",
            "9.223372036854775807e18",
            "1n",
            "0.000000001",
            "1e-9",
            "1.5Ki",
            "0e999999",
        ] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in [
            over.as_str(),
            &format!("-{over}"),
            // Kubernetes caps binary quantities at 2^63 - 1: 8Ei is 2^63.
            "8Ei",
            "8192Pi",
            "9223372036854775808000m",
            "10E",
            "1e19",
            "1e999999999",
            "1e99999999999999999999",
            // Finer than 1n: Kubernetes rounds it up.
            "0.1n",
            "1e-10",
            "0.0000000001",
        ] {
            assert!(!is_quantity(bad), "{bad}");
        }
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
