//! Device and slice names: what the API server accepts, derived from the scanner's ids.
//!
//! A device name in a ResourceSlice must be a DNS label (RFC 1123: at most 63 lowercase
//! alphanumerics and '-', starting and ending alphanumeric). Scanner ids are free-form (`GPU0`,
//! `0000:3b:00.0`, `/dev/ttyUSB0`), so an id that is not a label is sanitized and given a short
//! hash of the raw id: two ids that sanitize alike (`ttyUSB0`, `ttyusb0`) still get different
//! names, and the same id always gets the same name (claims name devices across restarts).

use sha2::{Digest, Sha256};

/// The longest DNS label.
pub const MAX_LABEL: usize = 63;
/// The longest DNS subdomain (object names).
pub const MAX_SUBDOMAIN: usize = 253;

/// Whether `s` is an RFC 1123 DNS label.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LABEL
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a DNS subdomain as Kubernetes checks object names: dot-separated labels, at
/// most 253 bytes in all (Kubernetes does not limit each label to 63 here).
pub fn is_dns_subdomain(s: &str) -> bool {
    let label = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !s.is_empty() && s.len() <= MAX_SUBDOMAIN && s.split('.').all(label)
}

/// The first eight hex digits of the SHA-256 of `s`: short, stable, and enough to tell apart the
/// few ids of one pool that sanitize alike.
pub fn short_hash(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// `s` lowercased with every run of characters a label cannot hold turned into one '-', without
/// leading or trailing '-', cut to `max` bytes.
fn sanitize(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max));
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.truncate(max);
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// The published name of the device with scanner id `id`: the id itself when it is a DNS label,
/// else the sanitized id, '-' and [`short_hash`] of the raw id.
pub fn device_name(id: &str) -> String {
    if is_dns_label(id) {
        return id.to_owned();
    }
    let hash = short_hash(id);
    let stem = sanitize(id, MAX_LABEL - 1 - hash.len());
    if stem.is_empty() {
        format!("dev-{hash}")
    } else {
        format!("{stem}-{hash}")
    }
}

/// The name of slice `index` of pool `pool` of driver `driver` on node `node`: stable, so the
/// publisher updates its own slices in place, and a DNS subdomain whatever the inputs. The hash
/// covers all three names, so two pools never share a name after sanitizing.
pub fn slice_name(node: &str, driver: &str, pool: &str, index: usize) -> String {
    let hash = short_hash(&format!("{node}\n{driver}\n{pool}"));
    let stem = sanitize(&format!("{node}-{driver}-{pool}"), 200);
    if stem.is_empty() {
        format!("slice-{hash}-{index}")
    } else {
        format!("{stem}-{hash}-{index}")
    }
}

/// A C identifier: letters, digits and '_', not starting with a digit.
pub fn is_c_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A semantic version 2.0.0 (core version, optional pre-release and build).
pub fn is_semver(s: &str) -> bool {
    let (rest, build) = match s.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (s, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let numeric = |p: &str| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (p == "0" || !p.starts_with('0'))
    };
    let ident =
        |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| numeric(p))
        && pre.is_none_or(|p| {
            p.split('.')
                .all(|i| ident(i) && (!i.bytes().all(|b| b.is_ascii_digit()) || numeric(i)))
        })
        && build.is_none_or(|b| b.split('.').all(ident))
}

/// A qualified attribute or capacity name: an optional domain (a DNS subdomain of at most 63
/// bytes) and '/', then a C identifier of at most 32 bytes.
pub fn is_qualified_name(name: &str) -> bool {
    let (domain, id) = match name.split_once('/') {
        Some((d, i)) => (Some(d), i),
        None => (None, name),
    };
    domain.is_none_or(|d| is_dns_subdomain(d) && d.len() <= 63)
        && is_c_identifier(id)
        && id.len() <= 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_id_is_its_own_name() {
        assert_eq!(device_name("gpu-0"), "gpu-0");
        assert_eq!(device_name("0"), "0");
    }

    #[test]
    fn other_ids_are_sanitized_with_a_hash_and_stay_apart() {
        let upper = device_name("ttyUSB0");
        let lower = device_name("ttyusb0");
        assert_eq!(lower, "ttyusb0");
        assert!(upper.starts_with("ttyusb0-"), "{upper}");
        assert_ne!(upper, lower);
        for id in [
            "0000:3b:00.0",
            "/dev/ttyUSB0",
            "-",
            "",
            "ÄÖÜ",
            &"x".repeat(200),
            "a--b__c",
            "GPU-",
        ] {
            let name = device_name(id);
            assert!(is_dns_label(&name), "{id:?} -> {name:?}");
            assert_eq!(name, device_name(id), "stable");
        }
        assert_eq!(
            device_name("0000:3b:00.0"),
            format!("0000-3b-00-0-{}", short_hash("0000:3b:00.0"))
        );
    }

    #[test]
    fn slice_names_are_subdomains_and_distinct() {
        let a = slice_name("Node_1", "gpu.example.com", "pool", 0);
        let b = slice_name("node-1", "gpu.example.com", "pool", 0);
        assert!(is_dns_subdomain(&a), "{a}");
        assert!(is_dns_subdomain(&b), "{b}");
        assert_ne!(a, b);
        let long = slice_name(&"n".repeat(253), &"d".repeat(63), &"p".repeat(253), 12);
        assert!(is_dns_subdomain(&long), "{long}");
        assert!(!is_dns_label("A"));
        assert!(!is_dns_label("a-"));
        assert!(is_dns_subdomain("gpu.example.com"));
        assert!(!is_dns_subdomain("gpu..example"));
    }

    #[test]
    fn attribute_names_and_versions() {
        assert!(is_semver("1.2.3-rc.1+build.5"));
        assert!(!is_semver("01.2.3"));
        assert!(!is_semver("1.2"));
        assert!(is_qualified_name("gpu.example.com/memory_MB"));
        assert!(is_qualified_name("model"));
        assert!(!is_qualified_name("bad-name"));
        assert!(!is_qualified_name("Bad.Domain/x"));
        assert!(!is_qualified_name(&"x".repeat(33)));
    }
}
