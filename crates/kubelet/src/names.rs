//! Names as kubelet and Linux accept them: resource names, dev-types, socket paths.
//!
//! Configuration, validation, the servers and the kubelet stand-in all check names with these
//! rules, so none of them needs another for its naming.
//!
//! kubelet refuses a registration whose resource name fails its `IsExtendedResourceName`
//! (`pkg/apis/core/helper`): the name must be outside the `kubernetes.io` namespace, must not
//! start with `requests.` (quota's prefix), and `requests.<name>` must be a qualified name
//! (apimachinery's `IsQualifiedName`): a DNS-1123 subdomain of at most 253 characters, `/`, and a
//! name part of at most 63 characters. A plugin whose name fails is refused on every attempt, so
//! wdp checks the same rules where the names are made: the namespace when the config is loaded
//! (and reloaded), the dev-type when a guest's tree is validated. The stand-in kubelet refuses
//! registrations with the same function.
use std::path::{Path, PathBuf};

/// Quota's prefix: kubelet checks `requests.<name>`, and refuses names that already have it.
const QUOTA_PREFIX: &str = "requests.";
/// Names containing it are native resources (`IsNativeResource`), never a plugin's.
const NATIVE_NAMESPACE: &str = "kubernetes.io/";
/// apimachinery's `DNS1123SubdomainMaxLength`.
pub const MAX_SUBDOMAIN: usize = 253;
/// apimachinery's `qualifiedNameMaxLength`: the name part of a qualified name.
pub const MAX_NAME_PART: usize = 63;

/// Which of kubelet's rules a resource name breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameRule {
    #[error("has no namespace: kubelet takes a name without '/' for a native resource")]
    /// No `/`.
    NoNamespace,
    #[error(
        "is in the kubernetes.io namespace, which kubelet reserves for native resources: use a domain of your own"
    )]
    /// In `kubernetes.io`.
    Native,
    #[error("starts with \"requests.\", the prefix kubelet reserves for quota names")]
    /// Starts with `requests.`.
    QuotaPrefix,
    #[error(
        "has a namespace of {len} characters: kubelet checks \"requests.\" + it as a DNS subdomain of at most {MAX_SUBDOMAIN}, so at most {} are left",
        MAX_SUBDOMAIN - QUOTA_PREFIX.len()
    )]
    /// A namespace too long.
    NamespaceTooLong {
        /// Its length in bytes.
        len: usize,
    },
    #[error(
        "has a namespace that is not a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', each part starting and ending with a letter or digit (devices.example.com)"
    )]
    /// A namespace that is not a DNS subdomain.
    NamespaceSyntax,
    #[error("has more than one '/': kubelet takes <namespace>/<name>")]
    /// More than one `/`.
    TooManySlashes,
    #[error("has a name part of {len} characters; kubelet allows {MAX_NAME_PART}")]
    /// A name part over 63 characters.
    NameTooLong {
        /// Its length in bytes.
        len: usize,
    },
    #[error(
        "has a name part that is not a qualified name: letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    )]
    /// A name part that is not a qualified name.
    NameSyntax,
}

/// kubelet's `IsExtendedResourceName`, with the rule that fails.
pub fn check_resource_name(name: &str) -> Result<(), NameRule> {
    if !name.contains('/') {
        return Err(NameRule::NoNamespace);
    }
    if name.contains(NATIVE_NAMESPACE) {
        return Err(NameRule::Native);
    }
    if name.starts_with(QUOTA_PREFIX) {
        return Err(NameRule::QuotaPrefix);
    }
    // `IsQualifiedName("requests." + name)`.
    let quota = format!("{QUOTA_PREFIX}{name}");
    let mut parts = quota.split('/');
    let (Some(prefix), Some(part), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(NameRule::TooManySlashes);
    };
    if prefix.len() > MAX_SUBDOMAIN {
        return Err(NameRule::NamespaceTooLong {
            len: prefix.len() - QUOTA_PREFIX.len(),
        });
    }
    if !is_dns1123_subdomain(prefix) {
        return Err(NameRule::NamespaceSyntax);
    }
    check_name_part(part)
}

/// The namespace of a resource (`<namespace>/<dev-type>`), by the same rules: every dev-type a
/// guest may report (see [`check_name_part`]) then makes a name kubelet accepts.
pub fn check_namespace(namespace: &str) -> Result<(), NameRule> {
    check_resource_name(&format!("{namespace}/x"))
}

/// The name part of a qualified name (a dev-type): `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`,
/// at most 63 characters.
pub fn check_name_part(part: &str) -> Result<(), NameRule> {
    if part.len() > MAX_NAME_PART {
        return Err(NameRule::NameTooLong { len: part.len() });
    }
    let b = part.as_bytes();
    let ok = match b {
        [] => false,
        [first, .., last] | [first @ last] => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
    };
    if ok {
        Ok(())
    } else {
        Err(NameRule::NameSyntax)
    }
}

/// apimachinery's `IsDNS1123Subdomain`: at most 253 characters of dot-separated labels, each of
/// lowercase letters, digits and '-', starting and ending with a letter or digit. (Unlike DNS
/// itself it sets no 63-character limit per label.)
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= MAX_SUBDOMAIN
        && s.split('.').all(|label| match label.as_bytes() {
            [] => false,
            b @ ([first, .., last] | [first @ last]) => {
                first.is_ascii_alphanumeric()
                    && last.is_ascii_alphanumeric()
                    && b.iter()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            }
        })
}

/// A dev-type a guest may report: the name part of a Kubernetes extended resource name
/// (kubelet's `IsQualifiedName`), so that every tree the host accepts names resources kubelet
/// registers.
pub fn is_dev_type(s: &str) -> bool {
    check_name_part(s).is_ok()
}

/// Longest socket path Linux accepts (`sun_path` is 108 bytes, including the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// A resource's names, derived once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// `<namespace>/<dev-type>`, what pods request.
    pub name: String,
    /// The name part: what the guest's tree calls the group.
    pub dev_type: String,
    /// The socket's file name, `<namespace>-<dev-type>.sock`, sent to kubelet as the endpoint.
    pub endpoint: String,
    /// The socket's full path.
    pub socket: PathBuf,
}

/// A resource whose socket path would not fit in a Unix socket address.
#[derive(Debug, thiserror::Error)]
#[error(
    "socket path {path} for {resource} is {len} bytes; Unix sockets allow {MAX_SOCKET_PATH}: use a shorter namespace, dev-type or plugin directory"
)]
pub struct SocketTooLong {
    /// The resource.
    pub resource: String,
    /// The socket path it would have.
    pub path: String,
    /// The path's length in bytes.
    pub len: usize,
}

impl Resource {
    /// Names the resource `namespace/dev_type`, served in `plugin_dir`.
    pub fn new(namespace: &str, dev_type: &str, plugin_dir: &Path) -> Result<Self, SocketTooLong> {
        let name = format!("{namespace}/{dev_type}");
        let endpoint = format!("{namespace}-{dev_type}.sock");
        let socket = plugin_dir.join(&endpoint);
        let len = socket.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(SocketTooLong {
                resource: name,
                path: socket.display().to_string(),
                len,
            });
        }
        Ok(Resource {
            name,
            dev_type: dev_type.into(),
            endpoint,
            socket,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelets_rules() {
        for good in [
            "devices.example.com/kvm",
            "gpu.intel.com/i915",
            "a/B",
            "x.io/Name_with.dots-1",
            &format!("{}/x", "a".repeat(244)),
            &format!("{}.io/x", "a".repeat(100)),
            &format!("ns.io/{}", "b".repeat(63)),
        ] {
            assert_eq!(check_resource_name(good), Ok(()), "{good}");
        }
        for (bad, rule) in [
            ("kvm", NameRule::NoNamespace),
            ("kubernetes.io/x", NameRule::Native),
            ("k8s.kubernetes.io/x", NameRule::Native),
            ("mykubernetes.io/x", NameRule::Native),
            ("requests.example.com/x", NameRule::QuotaPrefix),
            (
                &format!("{}/x", "a".repeat(245)),
                NameRule::NamespaceTooLong { len: 245 },
            ),
            ("Example.com/x", NameRule::NamespaceSyntax),
            ("-a.com/x", NameRule::NamespaceSyntax),
            ("a..com/x", NameRule::NamespaceSyntax),
            ("/x", NameRule::NamespaceSyntax),
            ("a.com/x/y", NameRule::TooManySlashes),
            (
                &format!("a.com/{}", "b".repeat(64)),
                NameRule::NameTooLong { len: 64 },
            ),
            ("a.com/", NameRule::NameSyntax),
            ("a.com/-x", NameRule::NameSyntax),
            ("a.com/x y", NameRule::NameSyntax),
        ] {
            assert_eq!(check_resource_name(bad), Err(rule), "{bad}");
        }
        assert_eq!(check_namespace("requests.x.io"), Err(NameRule::QuotaPrefix));
        assert_eq!(check_namespace("x.io"), Ok(()));
    }
}
