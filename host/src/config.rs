//! The `wdp run` configuration file (YAML).
//!
//! ```yaml
//! scanners:
//!   - name: kvm                          # unique; used in logs and metrics
//!     component: path/to/kvm.wasm        # relative paths are relative to the config file
//!     namespace: devices.example.com     # resources are <namespace>/<dev-type>
//!     env: { SLOTS: "10" }               # the guest's environment, nothing else
//!     post-allocator: path/to/hook.wasm  # optional; may be the same file as component
//!     limits: { memory: 64Mi, call-timeout: 5s }
//!     policy: { allowed-mounts: [/run/udev] } # optional; see `crate::policy::Policy`
//!     verify-key: cosign.pub             # optional: oci:// components must carry a signature
//!     cdi: { dir: /var/run/cdi, format: json } # optional: write CDI specs, return CDI names
//!     frontend: device-plugin            # or dra: serve through kubelet's DRA API instead
//!     dra: { driver: devices.example.com } # with frontend: dra; the driver defaults to the namespace
//! node:                                  # optional; read only when a scanner has frontend: dra
//!   name: worker-1                       # default: the NODE_NAME environment variable
//!   plugins-dir: /var/lib/kubelet/plugins
//!   plugins-registry-dir: /var/lib/kubelet/plugins_registry
//!   api-server: in-cluster               # or kubeconfig, kubeconfig:PATH, http://HOST:PORT
//! oci:                                   # optional; for oci://registry/repo[:tag][@digest]
//!   cache-dir: /var/lib/wdp/oci
//!   insecure-registries: [127.0.0.1:5000]
//!   require-digest: false
//! ```
//!
//! Everything is checked before anything starts; an error names the file, the key (as
//! `scanners[1].limits.memory`), the value and what would be valid.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::cdi::{CdiConfig, CdiFormat};
use crate::policy::Policy;
use crate::sandbox::GuestLimits;
use crate::tree::{is_env_name, is_normal_absolute_path};
use crate::units;
use wdp_kubelet::names;

/// A checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The scanners, in file order.
    pub scanners: Vec<ScannerConfig>,
    /// Settings for `oci://` components.
    pub oci: OciConfig,
}

/// Where a component comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentSource {
    /// A local component file.
    File(PathBuf),
    /// An `oci://` reference, as written.
    Oci(String),
}

/// Settings for `oci://` components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciConfig {
    /// Where pulled components are kept.
    pub cache_dir: PathBuf,
    /// Registries reached over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// Refuse references without a digest.
    pub require_digest: bool,
}

/// Where pulled components are kept by default.
pub const DEFAULT_OCI_CACHE: &str = "/var/lib/wdp/oci";

/// One scanner, with paths resolved against the config file's directory.
#[derive(Debug, Clone, PartialEq)]
pub struct ScannerConfig {
    /// Unique name, used in logs, metrics and status.
    pub name: String,
    /// The scanner component.
    pub component: ComponentSource,
    /// The resource namespace: resources are `<namespace>/<dev-type>`.
    pub namespace: String,
    /// The guest's whole environment.
    pub env: Vec<(String, String)>,
    /// The hook component, if any.
    pub post_allocator: Option<ComponentSource>,
    /// Public key an `oci://` component's signature must verify with.
    pub verify_key: Option<wdp_oci::sign::PublicKey>,
    /// Memory and CPU limits.
    pub limits: GuestLimits,
    /// The rules its trees and answers must follow.
    pub policy: Policy,
    /// Write CDI spec files for its devices (see [`crate::cdi`]); None: no CDI.
    pub cdi: Option<CdiConfig>,
    /// Served through kubelet's DRA API rather than device-plugin servers, when set.
    pub dra: Option<DraConfig>,
}

/// How a scanner with `frontend: dra` is served: its driver and the node's kubelet and API
/// server. The node settings are copied into every DRA scanner so that changing them restarts
/// exactly the scanners they concern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraConfig {
    /// The DRA driver name (a DNS subdomain): the ResourceSlices' driver and the socket names.
    pub driver: String,
    /// The node the devices are on (`spec.nodeName` of the slices).
    pub node_name: String,
    /// kubelet's plugins directory: the DRA socket is `<plugins>/<driver>/dra.sock`.
    pub plugins_dir: PathBuf,
    /// kubelet's plugin registry: the registration socket is `<dir>/<driver>-reg.sock`.
    pub plugins_registry_dir: PathBuf,
    /// Where the ResourceSlices and ResourceClaims are.
    pub api_server: ApiServer,
}

/// How the API server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiServer {
    /// The pod's service account and `KUBERNETES_SERVICE_HOST`/`PORT`.
    InCluster,
    /// Plain HTTP without credentials: a local `kubectl proxy`, or a test API server.
    Http(std::net::SocketAddr),
    /// The current context of a kubeconfig: this file, or (`None`) `$KUBECONFIG`, else
    /// `~/.kube/config`, read when the driver starts (outside a pod, as kubectl would).
    Kubeconfig(Option<PathBuf>),
}

/// kubelet's default plugins directory (DRA sockets).
pub const DEFAULT_KUBELET_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// kubelet's default plugin registry directory (the plugin watcher's).
pub const DEFAULT_KUBELET_PLUGINS_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {error}")]
    /// The file could not be read.
    Read {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error, whole.
        error: std::io::Error,
    },
    #[error("config {path}: {message}")]
    /// The file is not valid YAML of the expected shape.
    Parse {
        /// The path concerned.
        path: PathBuf,
        /// What is wrong, in words.
        message: String,
    },
    #[error("config {path}: {key}: {message}")]
    /// A value breaks a rule.
    Invalid {
        /// The path concerned.
        path: PathBuf,
        /// The key, as a dotted path into the file.
        key: String,
        /// What is wrong, in words.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    scanners: Vec<RawScanner>,
    #[serde(default)]
    oci: RawOci,
    #[serde(default)]
    node: RawNode,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawNode {
    name: Option<String>,
    plugins_dir: Option<PathBuf>,
    plugins_registry_dir: Option<PathBuf>,
    api_server: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDra {
    driver: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawOci {
    cache_dir: Option<PathBuf>,
    #[serde(default)]
    insecure_registries: Vec<String>,
    #[serde(default)]
    require_digest: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawScanner {
    name: String,
    component: String,
    namespace: String,
    #[serde(default)]
    env: BTreeMap<String, Scalar>,
    post_allocator: Option<String>,
    verify_key: Option<PathBuf>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    policy: RawPolicy,
    cdi: Option<RawCdi>,
    frontend: Option<String>,
    dra: Option<RawDra>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawCdi {
    dir: Option<PathBuf>,
    format: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawPolicy {
    #[serde(default)]
    allowed_mounts: Vec<String>,
    max_types: Option<usize>,
    max_devices_per_type: Option<usize>,
    max_string_bytes: Option<usize>,
    max_tree_bytes: Option<Scalar>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawLimits {
    memory: Option<Scalar>,
    call_timeout: Option<Scalar>,
}

/// Env values and limits may be written as YAML numbers or booleans; the guest gets text.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Scalar {
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Scalar {
    fn into_text(self) -> String {
        match self {
            Scalar::Text(s) => s,
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Bool(b) => b.to_string(),
        }
    }
}

/// Reads and checks the config file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse(&text, path, base)
}

/// Checks config `text`; `path` is for messages, `base` resolves relative component paths.
pub fn parse(text: &str, path: &Path, base: &Path) -> Result<Config, ConfigError> {
    let raw: RawConfig = serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let invalid = |key: String, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        key,
        message,
    };
    if raw.scanners.is_empty() {
        return Err(invalid(
            "scanners".into(),
            "lists no scanner; add at least one".into(),
        ));
    }
    let raw_require_digest = raw.oci.require_digest;
    let node = raw.node;
    let mut drivers: BTreeMap<String, usize> = BTreeMap::new();
    let mut names = HashSet::new();
    let mut scanners = Vec::with_capacity(raw.scanners.len());
    for (i, s) in raw.scanners.into_iter().enumerate() {
        let key = |k: &str| format!("scanners[{i}].{k}");
        if !is_name(&s.name) {
            return Err(invalid(
                key("name"),
                format!(
                    "{:?} is not a valid name: use 1-63 characters of a-z, 0-9, '-' and '_'",
                    s.name
                ),
            ));
        }
        if !names.insert(s.name.clone()) {
            return Err(invalid(
                key("name"),
                format!(
                    "{:?} is used by another scanner; names must be unique",
                    s.name
                ),
            ));
        }
        // kubelet refuses, on every attempt, a registration whose name breaks these rules.
        if let Err(rule) = names::check_namespace(&s.namespace) {
            return Err(invalid(
                key("namespace"),
                format!(
                    "{:?}: kubelet refuses a resource name <namespace>/<dev-type> that {rule}",
                    s.namespace
                ),
            ));
        }
        let source = |k: &str, value: &str| -> Result<ComponentSource, ConfigError> {
            if value.starts_with(wdp_oci::SCHEME) {
                let reference =
                    wdp_oci::parse_reference(value).map_err(|e| invalid(key(k), e.to_string()))?;
                if raw_require_digest && reference.digest().is_none() {
                    return Err(invalid(
                        key(k),
                        format!(
                            "{value:?} has no digest, and oci.require-digest is set: pin it as @sha256:..."
                        ),
                    ));
                }
                return Ok(ComponentSource::Oci(value.to_string()));
            }
            let path = resolve(base, Path::new(value));
            if !path.is_file() {
                return Err(invalid(key(k), format!("{}: no such file", path.display())));
            }
            Ok(ComponentSource::File(path))
        };
        let component = source("component", &s.component)?;
        let post_allocator = s
            .post_allocator
            .as_deref()
            .map(|p| source("post-allocator", p))
            .transpose()?;
        let verify_key = s
            .verify_key
            .map(|k| wdp_oci::sign::PublicKey::from_file(&resolve(base, &k)))
            .transpose()
            .map_err(|e| invalid(key("verify-key"), e.to_string()))?;
        let mut env = Vec::with_capacity(s.env.len());
        for (k, v) in s.env {
            if !is_env_name(&k) {
                return Err(invalid(
                    key(&format!("env.{k}")),
                    "not a valid variable name: use [A-Za-z_][A-Za-z0-9_]*".into(),
                ));
            }
            env.push((k, v.into_text()));
        }
        let mut limits = GuestLimits::default();
        if let Some(memory) = s.limits.memory {
            limits.memory = units::parse_size(&memory.into_text())
                .map_err(|e| invalid(key("limits.memory"), e.to_string()))?;
            if limits.memory < 1 << 20 {
                return Err(invalid(key("limits.memory"), "must be at least 1Mi".into()));
            }
        }
        if let Some(timeout) = s.limits.call_timeout {
            limits.call_timeout = units::parse_duration(&timeout.into_text())
                .map_err(|e| invalid(key("limits.call-timeout"), e.to_string()))?;
            if limits.call_timeout.is_zero() {
                return Err(invalid(
                    key("limits.call-timeout"),
                    "must be more than zero".into(),
                ));
            }
        }
        let mut policy = Policy::default();
        for (j, mount) in s.policy.allowed_mounts.into_iter().enumerate() {
            if !is_normal_absolute_path(&mount) {
                return Err(invalid(
                    key(&format!("policy.allowed-mounts[{j}]")),
                    format!("{mount:?} is not an absolute, normalised path"),
                ));
            }
            policy.allowed_mounts.push(mount);
        }
        let positive = |k: &str, v: Option<usize>, default: usize| match v {
            Some(0) => Err(invalid(key(k), "must be more than zero".into())),
            Some(v) => Ok(v),
            None => Ok(default),
        };
        policy.max_types = positive("policy.max-types", s.policy.max_types, policy.max_types)?;
        policy.max_devices_per_type = positive(
            "policy.max-devices-per-type",
            s.policy.max_devices_per_type,
            policy.max_devices_per_type,
        )?;
        policy.max_string_bytes = positive(
            "policy.max-string-bytes",
            s.policy.max_string_bytes,
            policy.max_string_bytes,
        )?;
        if let Some(bytes) = s.policy.max_tree_bytes {
            let bytes = units::parse_size(&bytes.into_text())
                .map_err(|e| invalid(key("policy.max-tree-bytes"), e.to_string()))?;
            policy.max_tree_bytes = positive(
                "policy.max-tree-bytes",
                Some(usize::try_from(bytes).unwrap_or(usize::MAX)),
                0,
            )?;
        }
        let cdi = match s.cdi {
            None => None,
            Some(raw) => {
                let format = match raw.format.as_deref() {
                    None | Some("json") => CdiFormat::Json,
                    Some("yaml") => CdiFormat::Yaml,
                    Some(other) => {
                        return Err(invalid(
                            key("cdi.format"),
                            format!("{other:?} is not a CDI spec format: use json or yaml"),
                        ));
                    }
                };
                let dir = raw.dir.map(|d| resolve(base, &d));
                Some(CdiConfig {
                    dir: dir.unwrap_or_else(|| crate::cdi::DEFAULT_CDI_DIR.into()),
                    format,
                })
            }
        };
        let dra = match s.frontend.as_deref() {
            None | Some("device-plugin") => {
                if s.dra.is_some() {
                    return Err(invalid(
                        key("dra"),
                        "is only read with frontend: dra; remove it or set frontend: dra".into(),
                    ));
                }
                None
            }
            Some("dra") => {
                // A prepared claim hands the runtime CDI names only: without specs there is
                // nothing to give a container.
                if cdi.is_none() {
                    return Err(invalid(
                        key("cdi"),
                        "is required with frontend: dra (a prepared claim names CDI devices only); add cdi: {}".into(),
                    ));
                }
                // Its hooks answer Allocate, GetPreferredAllocation and PreStartContainer, which
                // DRA does not call: it would be loaded and never run.
                if post_allocator.is_some() {
                    return Err(invalid(
                        key("post-allocator"),
                        "is never called with frontend: dra (DRA has no Allocate, preferred allocation or pre-start call); remove it".into(),
                    ));
                }
                let driver = s
                    .dra
                    .and_then(|d| d.driver)
                    .unwrap_or_else(|| s.namespace.clone());
                if !names::is_dns1123_subdomain(&driver) {
                    return Err(invalid(
                        key("dra.driver"),
                        format!(
                            "{driver:?} is not a DRA driver name: use a DNS subdomain of at most 253 characters (a-z, 0-9, '-', '.')"
                        ),
                    ));
                }
                if let Some(other) = drivers.insert(driver.clone(), i) {
                    return Err(invalid(
                        key("dra.driver"),
                        format!(
                            "{driver:?} is the driver of scanners[{other}] too; a driver has one pool per node, give one of them dra: {{ driver: ... }}"
                        ),
                    ));
                }
                Some(dra_node(&node, driver, base, &invalid)?)
            }
            Some(other) => {
                return Err(invalid(
                    key("frontend"),
                    format!("{other:?} is not a front-end: use device-plugin or dra"),
                ));
            }
        };
        scanners.push(ScannerConfig {
            name: s.name,
            component,
            namespace: s.namespace,
            env,
            post_allocator,
            verify_key,
            limits,
            policy,
            cdi,
            dra,
        });
    }
    // kubelet and the scheduler hand an extended resource to DRA only where no device plugin
    // advertises it: one provider per node. A namespace is where resource names come from, so
    // one namespace is served through one front-end.
    for (i, s) in scanners.iter().enumerate() {
        if let Some(j) = scanners[..i]
            .iter()
            .position(|o| o.namespace == s.namespace && o.dra.is_some() != s.dra.is_some())
        {
            return Err(invalid(
                format!("scanners[{i}].frontend"),
                format!(
                    "namespace {:?} is served through the device-plugin front-end by one of scanners[{j}] and scanners[{i}] and through dra by the other; a <namespace>/<dev-type> has one provider per node (kubelet and the scheduler route an extended resource to DRA only where no device plugin advertises it): give one of them another namespace",
                    s.namespace
                ),
            ));
        }
    }
    let oci = OciConfig {
        cache_dir: raw
            .oci
            .cache_dir
            .map(|d| resolve(base, &d))
            .unwrap_or_else(|| DEFAULT_OCI_CACHE.into()),
        insecure_registries: raw.oci.insecure_registries,
        require_digest: raw_require_digest,
    };
    Ok(Config { scanners, oci })
}

/// What a running scanner was built from. Two equal identities run the same thing, so a reload
/// leaves that scanner (its guest, its sockets, its kubelet streams) alone; any difference
/// restarts it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScannerIdentity {
    /// Its configuration, as loaded.
    pub config: ScannerConfig,
    /// sha256 (hex) of the local component file: a component rebuilt in place is a change.
    /// None for an `oci://` component, which is compared by its reference as written.
    pub component_sha256: Option<String>,
    /// The same for the post-allocator file.
    pub post_allocator_sha256: Option<String>,
    /// The `oci:` settings, when a component of this scanner is fetched from a registry: they
    /// decide how it is fetched and checked, so changing them re-fetches it.
    pub oci: Option<OciConfig>,
}

impl ScannerIdentity {
    /// An identity for `config` under the file's `oci` settings, with the given file digests.
    pub fn new(
        config: ScannerConfig,
        oci: &OciConfig,
        component_sha256: Option<String>,
        post_allocator_sha256: Option<String>,
    ) -> Self {
        let from_registry = matches!(config.component, ComponentSource::Oci(_))
            || matches!(config.post_allocator, Some(ComponentSource::Oci(_)));
        ScannerIdentity {
            config,
            component_sha256,
            post_allocator_sha256,
            oci: from_registry.then(|| oci.clone()),
        }
    }

    /// The config keys in which `new` differs from `self`, in config order; empty: unchanged.
    pub fn changes(&self, new: &ScannerIdentity) -> Vec<&'static str> {
        let (a, b) = (&self.config, &new.config);
        let mut keys = Vec::new();
        let mut check = |differs: bool, key: &'static str| {
            if differs {
                keys.push(key);
            }
        };
        check(a.component != b.component, "component");
        check(
            a.component == b.component && self.component_sha256 != new.component_sha256,
            "component contents",
        );
        check(a.namespace != b.namespace, "namespace");
        check(a.env != b.env, "env");
        check(a.post_allocator != b.post_allocator, "post-allocator");
        check(
            a.post_allocator == b.post_allocator
                && self.post_allocator_sha256 != new.post_allocator_sha256,
            "post-allocator contents",
        );
        check(a.verify_key != b.verify_key, "verify-key");
        check(a.limits != b.limits, "limits");
        check(a.policy != b.policy, "policy");
        check(a.cdi != b.cdi, "cdi");
        check(a.dra.is_some() != b.dra.is_some(), "frontend");
        check(a.dra.is_some() && b.dra.is_some() && a.dra != b.dra, "dra");
        check(self.oci != new.oci, "oci");
        keys
    }
}

/// How a new config differs from the running scanners, by scanner name. A renamed scanner is
/// one removed and one added.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ConfigDiff {
    /// In the new file's order.
    pub added: Vec<String>,
    /// Sorted.
    pub removed: Vec<String>,
    /// In the new file's order, each with the keys that differ.
    pub changed: Vec<(String, Vec<&'static str>)>,
    /// In the new file's order.
    pub unchanged: Vec<String>,
}

impl ConfigDiff {
    /// Compares the `running` scanners with the scanners of a new config.
    pub fn new<'a>(
        running: impl IntoIterator<Item = (&'a str, &'a ScannerIdentity)>,
        new: &[ScannerIdentity],
    ) -> Self {
        let running: BTreeMap<&str, &ScannerIdentity> = running.into_iter().collect();
        let mut d = ConfigDiff::default();
        for identity in new {
            let name = &identity.config.name;
            match running.get(name.as_str()) {
                None => d.added.push(name.clone()),
                Some(old) => {
                    let keys = old.changes(identity);
                    if keys.is_empty() {
                        d.unchanged.push(name.clone());
                    } else {
                        d.changed.push((name.clone(), keys));
                    }
                }
            }
        }
        let kept: HashSet<&str> = new.iter().map(|i| i.config.name.as_str()).collect();
        d.removed = running
            .keys()
            .filter(|name| !kept.contains(*name))
            .map(|name| name.to_string())
            .collect();
        d
    }

    /// True when a scanner must be started: added or changed.
    pub fn starts(&self, name: &str) -> bool {
        self.added.iter().any(|n| n == name) || self.changed.iter().any(|(n, _)| n == name)
    }

    /// Scanners to stop, before any is started: removed and changed.
    pub fn stops(&self) -> impl Iterator<Item = &str> {
        self.removed
            .iter()
            .map(String::as_str)
            .chain(self.changed.iter().map(|(n, _)| n.as_str()))
    }
}

/// `added [a], removed [b], changed [c], unchanged [d]`: the reload log line.
impl std::fmt::Display for ConfigDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let changed: Vec<&str> = self.changed.iter().map(|(n, _)| n.as_str()).collect();
        write!(
            f,
            "added [{}], removed [{}], changed [{}], unchanged [{}]",
            self.added.join(", "),
            self.removed.join(", "),
            changed.join(", "),
            self.unchanged.join(", ")
        )
    }
}

/// The node settings of a DRA scanner with driver `driver`, defaults filled in.
fn dra_node(
    node: &RawNode,
    driver: String,
    base: &Path,
    invalid: &impl Fn(String, String) -> ConfigError,
) -> Result<DraConfig, ConfigError> {
    let node_name = match &node.name {
        Some(name) => name.clone(),
        None => std::env::var("NODE_NAME").map_err(|_| {
            invalid(
                "node.name".into(),
                "is needed by frontend: dra (the slices' nodeName): set it, or the NODE_NAME environment variable (the downward API's spec.nodeName)".into(),
            )
        })?,
    };
    if !names::is_dns1123_subdomain(&node_name) {
        return Err(invalid(
            "node.name".into(),
            format!("{node_name:?} is not a node name: use a DNS subdomain (a-z, 0-9, '-', '.')"),
        ));
    }
    let dir = |key: &str, value: &Option<PathBuf>, default: &str| match value {
        Some(p) if !p.is_absolute() => Err(invalid(
            key.into(),
            format!("{}: must be an absolute path (kubelet's own)", p.display()),
        )),
        Some(p) => Ok(p.clone()),
        None => Ok(PathBuf::from(default)),
    };
    let api_server = match node.api_server.as_deref() {
        None | Some("in-cluster") => ApiServer::InCluster,
        Some("kubeconfig") => ApiServer::Kubeconfig(None),
        Some(file) if file.starts_with("kubeconfig:") => {
            let file = Path::new(&file["kubeconfig:".len()..]);
            if file.as_os_str().is_empty() {
                return Err(invalid(
                    "node.api-server".into(),
                    "\"kubeconfig:\" names no file: use kubeconfig (KUBECONFIG, else ~/.kube/config) or kubeconfig:PATH".into(),
                ));
            }
            ApiServer::Kubeconfig(Some(resolve(base, file)))
        }
        Some(url) => match url
            .strip_prefix("http://")
            .map(|a| a.trim_end_matches('/').parse())
        {
            Some(Ok(addr)) => ApiServer::Http(addr),
            _ => {
                return Err(invalid(
                    "node.api-server".into(),
                    format!(
                        "{url:?}: use in-cluster, kubeconfig, kubeconfig:PATH or http://IP:PORT"
                    ),
                ));
            }
        },
    };
    Ok(DraConfig {
        driver,
        node_name,
        plugins_dir: dir(
            "node.plugins-dir",
            &node.plugins_dir,
            DEFAULT_KUBELET_PLUGINS_DIR,
        )?,
        plugins_registry_dir: dir(
            "node.plugins-registry-dir",
            &node.plugins_registry_dir,
            DEFAULT_KUBELET_PLUGINS_REGISTRY_DIR,
        )?,
        api_server,
    })
}

fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::time::Duration;

    /// The fields a config struct accepts, as serde's `deny_unknown_fields` lists them.
    fn fields<T: serde::de::DeserializeOwned + std::fmt::Debug>() -> Vec<String> {
        let err = serde_yaml_ng::from_str::<T>("zz-not-a-key: 1")
            .unwrap_err()
            .to_string();
        let (_, expected) = err
            .split_once("expected ")
            .unwrap_or_else(|| panic!("{err}"));
        expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(String::from)
            .collect()
    }

    /// The book's config reference (its example and its key table) says exactly what the
    /// parser accepts: a key added to the code and not to the table, or the reverse, fails here.
    #[test]
    fn the_config_reference_matches_the_parser() {
        let page = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/src/reference/config.md"
        ))
        .expect("docs/src/reference/config.md");
        let section = |name: &str| {
            let begin = format!("<!-- {name}:begin -->");
            let end = format!("<!-- {name}:end -->");
            let start = page.find(&begin).map(|i| i + begin.len());
            let stop = page.find(&end);
            match (start, stop) {
                (Some(a), Some(b)) if a < b => page[a..b].to_string(),
                _ => panic!("docs/src/reference/config.md has no {begin} ... {end} section"),
            }
        };

        let mut code: BTreeSet<String> = BTreeSet::from(["scanners".to_string()]);
        code.extend(fields::<RawOci>().iter().map(|f| format!("oci.{f}")));
        code.extend(fields::<RawNode>().iter().map(|f| format!("node.{f}")));
        for f in fields::<RawScanner>() {
            match f.as_str() {
                "limits" => code.extend(fields::<RawLimits>().iter().map(|g| format!("{f}.{g}"))),
                "policy" => code.extend(fields::<RawPolicy>().iter().map(|g| format!("{f}.{g}"))),
                "cdi" => code.extend(fields::<RawCdi>().iter().map(|g| format!("{f}.{g}"))),
                "dra" => code.extend(fields::<RawDra>().iter().map(|g| format!("{f}.{g}"))),
                _ => {
                    code.insert(f);
                }
            }
        }
        assert_eq!(
            fields::<RawConfig>(),
            ["scanners", "oci", "node"],
            "a new top-level key: teach this test its place"
        );

        let table = section("config-keys");
        let documented: BTreeSet<String> = table
            .lines()
            .filter(|l| l.starts_with("| `"))
            .flat_map(|l| {
                let first = l.split('|').nth(1).unwrap_or_default();
                first
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .map(String::from)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(
            documented, code,
            "docs/src/reference/config.md's key table against the parser"
        );

        // The example parses as it stands (its two component files made to exist).
        let example = section("config-example");
        let yaml = example
            .split_once("```yaml")
            .and_then(|(_, rest)| rest.split_once("```"))
            .map(|(yaml, _)| yaml)
            .expect("a yaml block");
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("path/to")).unwrap();
        std::fs::write(dir.path().join("path/to/kvm.wasm"), b"").unwrap();
        std::fs::write(dir.path().join("path/to/hook.wasm"), b"").unwrap();
        let config =
            parse(yaml, Path::new("config.md"), dir.path()).expect("the reference's example");
        assert_eq!(config.scanners.len(), 1);
    }

    fn with_files(yaml: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kvm.wasm"), b"").unwrap();
        std::fs::write(dir.path().join("hook.wasm"), b"").unwrap();
        parse(yaml, Path::new("wdp.yaml"), dir.path())
    }

    #[test]
    fn full_example() {
        let c = with_files(
            "scanners:\n  - name: kvm\n    component: kvm.wasm\n    namespace: devices.example.com\n    env: { SLOTS: 10, DEBUG: true }\n    post-allocator: hook.wasm\n    limits: { memory: 32Mi, call-timeout: 2s }\n    policy: { allowed-mounts: [/run/udev], max-types: 3, max-tree-bytes: 1Mi }\n",
        )
        .unwrap();
        let s = &c.scanners[0];
        assert_eq!(
            s.env,
            [
                ("DEBUG".into(), "true".into()),
                ("SLOTS".into(), "10".into())
            ]
        );
        assert_eq!(s.limits.memory, 32 << 20);
        assert_eq!(s.limits.call_timeout, Duration::from_secs(2));
        assert!(
            matches!(&s.component, ComponentSource::File(p) if p.ends_with("kvm.wasm") && p.is_absolute())
        );
        assert_eq!(s.policy.allowed_mounts, ["/run/udev"]);
        assert_eq!((s.policy.max_types, s.policy.max_tree_bytes), (3, 1 << 20));
        assert_eq!(s.cdi, None, "CDI is off unless asked for");
    }

    #[test]
    fn cdi_defaults_and_dir() {
        let c = with_files(
            "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, cdi: {}}\n  - {name: b, component: kvm.wasm, namespace: y.io, cdi: {dir: specs, format: yaml}}\n",
        )
        .unwrap();
        assert_eq!(c.scanners[0].cdi, Some(CdiConfig::default()));
        let b = c.scanners[1].cdi.as_ref().unwrap();
        assert!(b.dir.is_absolute() && b.dir.ends_with("specs"));
        assert_eq!(b.format, CdiFormat::Yaml);
    }

    const NODE: &str = "node: { name: node-1, api-server: 'http://127.0.0.1:6443' }\n";

    #[test]
    fn dra_defaults_and_node_settings() {
        let c = with_files(&format!(
            "scanners:\n  - {{name: a, component: kvm.wasm, namespace: x.io, cdi: {{}}, frontend: dra}}\n  - {{name: b, component: kvm.wasm, namespace: y.io, cdi: {{}}, frontend: dra, dra: {{driver: gpu.y.io}}}}\n  - {{name: c, component: kvm.wasm, namespace: z.io, frontend: device-plugin}}\n{NODE}"
        ))
        .unwrap();
        let a = c.scanners[0].dra.as_ref().expect("frontend: dra");
        assert_eq!(a.driver, "x.io", "the driver defaults to the namespace");
        assert_eq!(a.node_name, "node-1");
        assert_eq!(a.plugins_dir, Path::new(DEFAULT_KUBELET_PLUGINS_DIR));
        assert_eq!(
            a.plugins_registry_dir,
            Path::new(DEFAULT_KUBELET_PLUGINS_REGISTRY_DIR)
        );
        assert_eq!(
            a.api_server,
            ApiServer::Http("127.0.0.1:6443".parse().unwrap())
        );
        assert_eq!(c.scanners[1].dra.as_ref().unwrap().driver, "gpu.y.io");
        assert_eq!(c.scanners[2].dra, None);

        // Moving a scanner between front-ends, or to another driver, restarts it.
        let old = ScannerIdentity::new(c.scanners[2].clone(), &c.oci, None, None);
        let mut moved = c.scanners[2].clone();
        moved.dra = c.scanners[0].dra.clone();
        let new = ScannerIdentity::new(moved, &c.oci, None, None);
        assert_eq!(old.changes(&new), ["frontend"]);
        let mut renamed = c.scanners[0].clone();
        renamed.dra.as_mut().unwrap().driver = "other.x.io".into();
        let a = ScannerIdentity::new(c.scanners[0].clone(), &c.oci, None, None);
        let b = ScannerIdentity::new(renamed, &c.oci, None, None);
        assert_eq!(a.changes(&b), ["dra"]);
    }

    #[test]
    fn api_server_kubeconfig_default_or_a_file() {
        let dra = |api: &str| {
            let c = with_files(&format!(
                "scanners:\n  - {{name: a, component: kvm.wasm, namespace: x.io, cdi: {{}}, frontend: dra}}\nnode: {{ name: n, api-server: '{api}' }}\n"
            ))
            .unwrap();
            c.scanners[0].dra.as_ref().unwrap().api_server.clone()
        };
        assert_eq!(dra("kubeconfig"), ApiServer::Kubeconfig(None));
        assert_eq!(
            dra("kubeconfig:/etc/kubernetes/wdp.conf"),
            ApiServer::Kubeconfig(Some("/etc/kubernetes/wdp.conf".into()))
        );
        // Relative to the config file, like every path in it.
        let ApiServer::Kubeconfig(Some(relative)) = dra("kubeconfig:kube/config") else {
            panic!("not a kubeconfig");
        };
        assert!(relative.is_absolute() && relative.ends_with("kube/config"));
        assert_eq!(dra("in-cluster"), ApiServer::InCluster);
    }

    #[test]
    fn dra_refusals_name_the_key_the_value_and_the_rule() {
        let cases = [
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, frontend: grpc}",
                "scanners[0].frontend: \"grpc\" is not a front-end: use device-plugin or dra",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, frontend: dra}",
                "scanners[0].cdi: is required with frontend: dra",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, cdi: {}, frontend: dra, post-allocator: hook.wasm}",
                "scanners[0].post-allocator: is never called with frontend: dra",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, dra: {driver: x.io}}",
                "scanners[0].dra: is only read with frontend: dra",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, cdi: {}, frontend: dra, dra: {driver: Bad_Driver}}",
                "scanners[0].dra.driver: \"Bad_Driver\" is not a DRA driver name",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, cdi: {}, frontend: dra}\n  - {name: b, component: kvm.wasm, namespace: y.io, cdi: {}, frontend: dra, dra: {driver: x.io}}",
                "scanners[1].dra.driver: \"x.io\" is the driver of scanners[0] too",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io}\n  - {name: b, component: kvm.wasm, namespace: x.io, cdi: {}, frontend: dra, dra: {driver: b.x.io}}",
                "scanners[1].frontend: namespace \"x.io\" is served through the device-plugin front-end by one of scanners[0] and scanners[1] and through dra by the other; a <namespace>/<dev-type> has one provider per node",
            ),
        ];
        for (yaml, want) in cases {
            let e = with_files(&format!("{yaml}\n{NODE}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{yaml}\n  gave {e}\n  want {want}");
        }
        let node_cases = [
            (
                "node: { name: Node_1 }",
                "node.name: \"Node_1\" is not a node name",
            ),
            (
                "node: { name: n, plugins-dir: plugins }",
                "node.plugins-dir: plugins: must be an absolute path",
            ),
            (
                "node: { name: n, api-server: 'https://k8s:6443' }",
                "node.api-server: \"https://k8s:6443\": use in-cluster, kubeconfig, kubeconfig:PATH or http://IP:PORT",
            ),
            (
                "node: { name: n, api-server: 'kubeconfig:' }",
                "node.api-server: \"kubeconfig:\" names no file",
            ),
        ];
        for (node, want) in node_cases {
            let yaml = format!(
                "scanners:\n  - {{name: a, component: kvm.wasm, namespace: x.io, cdi: {{}}, frontend: dra}}\n{node}\n"
            );
            let e = with_files(&yaml).unwrap_err().to_string();
            assert!(e.contains(want), "{yaml}\n  gave {e}\n  want {want}");
        }
        // The node settings concern DRA scanners only.
        with_files("scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io}\nnode: { name: Node_1 }\n")
            .expect("no DRA scanner: node settings unread");
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("scanners: []", "scanners: lists no scanner"),
            (
                "scanners:\n  - {name: kvm, component: kvm.wasm, namespace: x.io, colour: red}",
                "unknown field `colour`",
            ),
            (
                "scanners:\n  - {name: KVM, component: kvm.wasm, namespace: x.io}",
                "scanners[0].name: \"KVM\"",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io}\n  - {name: a, component: kvm.wasm, namespace: y.io}",
                "scanners[1].name",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: Bad_NS}",
                "scanners[0].namespace",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: k8s.kubernetes.io}",
                "scanners[0].namespace: \"k8s.kubernetes.io\": kubelet refuses a resource name <namespace>/<dev-type> that is in the kubernetes.io namespace",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: requests.example.com}",
                "scanners[0].namespace: \"requests.example.com\": kubelet refuses a resource name <namespace>/<dev-type> that starts with \"requests.\"",
            ),
            (
                "scanners:\n  - {name: a, component: nope.wasm, namespace: x.io}",
                "scanners[0].component",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, limits: {memory: 64MB}}",
                "scanners[0].limits.memory: \"64MB\" is not a memory size",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, limits: {call-timeout: 5}}",
                "scanners[0].limits.call-timeout",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, env: {1X: y}}",
                "scanners[0].env.1X",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, policy: {allowed-mounts: [run/x]}}",
                "scanners[0].policy.allowed-mounts[0]",
            ),
            (
                "scanners:\n  - {name: a, component: 'oci://r.example/k:1', namespace: x.io}\noci: {require-digest: true}",
                "scanners[0].component: \"oci://r.example/k:1\" has no digest",
            ),
            (
                "scanners:\n  - {name: a, component: 'oci://Bad Ref', namespace: x.io}",
                "scanners[0].component",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, verify-key: nope.pub}",
                "scanners[0].verify-key",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, policy: {max-types: 0}}",
                "scanners[0].policy.max-types: must be more than zero",
            ),
            (
                "scanners:\n  - {name: a, component: kvm.wasm, namespace: x.io, cdi: {format: toml}}",
                "scanners[0].cdi.format: \"toml\" is not a CDI spec format: use json or yaml",
            ),
        ];
        for (yaml, needle) in cases {
            let err = with_files(yaml).unwrap_err().to_string();
            assert!(err.starts_with("config wdp.yaml: "), "{err}");
            assert!(err.contains(needle), "{err:?} should contain {needle:?}");
        }
        // A namespace kubelet's quota check makes too long (a DNS name allows it).
        let long = format!("{}.io", "a".repeat(242));
        let err = with_files(&format!(
            "scanners:\n  - {{name: a, component: kvm.wasm, namespace: {long}}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("scanners[0].namespace") && err.contains("a namespace of 245 characters"),
            "{err}"
        );
    }

    /// Parses `yaml` against one directory for the whole test binary, so that the same
    /// relative path is the same component path in every identity compared.
    fn in_shared_dir(yaml: &str) -> Config {
        static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
        let dir = DIR.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("kvm.wasm"), b"").unwrap();
            std::fs::write(dir.path().join("hook.wasm"), b"").unwrap();
            dir
        });
        parse(yaml, Path::new("wdp.yaml"), dir.path()).unwrap()
    }

    fn identity(yaml_scanner: &str, sha: &str) -> ScannerIdentity {
        let c = in_shared_dir(&format!("scanners:\n  - {yaml_scanner}\n"));
        let s = c.scanners.into_iter().next().unwrap();
        ScannerIdentity::new(s, &c.oci, Some(sha.into()), None)
    }

    #[test]
    fn diff_by_name_and_identity() {
        let a = identity("{name: a, component: kvm.wasm, namespace: a.io}", "1");
        let b = identity("{name: b, component: kvm.wasm, namespace: b.io}", "1");
        let c = identity("{name: c, component: kvm.wasm, namespace: c.io}", "1");
        let running = [("a", &a), ("b", &b), ("c", &c)];
        let b2 = identity(
            "{name: b, component: kvm.wasm, namespace: b.io, env: {X: 1}}",
            "1",
        );
        let c2 = identity("{name: c, component: kvm.wasm, namespace: c.io}", "2");
        let d = identity("{name: d, component: kvm.wasm, namespace: d.io}", "1");
        let diff = ConfigDiff::new(running, &[d.clone(), c2, b2, a.clone()]);
        assert_eq!(diff.added, ["d"]);
        assert_eq!(diff.removed, Vec::<String>::new());
        assert_eq!(
            diff.changed,
            [
                ("c".to_string(), vec!["component contents"]),
                ("b".to_string(), vec!["env"])
            ]
        );
        assert_eq!(diff.unchanged, ["a"]);
        assert_eq!(diff.stops().collect::<Vec<_>>(), ["c", "b"]);
        assert!(diff.starts("d") && diff.starts("b") && !diff.starts("a"));
        assert_eq!(
            diff.to_string(),
            "added [d], removed [], changed [c, b], unchanged [a]"
        );

        // A renamed scanner is one removed and one added.
        let renamed = identity("{name: a2, component: kvm.wasm, namespace: a.io}", "1");
        let diff = ConfigDiff::new([("a", &a)], &[renamed]);
        assert_eq!(
            (diff.added, diff.removed),
            (vec!["a2".into()], vec!["a".into()])
        );
        assert!(diff.changed.is_empty() && diff.unchanged.is_empty());
    }

    #[test]
    fn every_key_is_a_change() {
        let base = "name: a, component: kvm.wasm, namespace: a.io";
        let a = identity(&format!("{{{base}}}"), "1");
        for (extra, key) in [
            ("env: {X: 1}", "env"),
            ("post-allocator: hook.wasm", "post-allocator"),
            ("limits: {memory: 32Mi}", "limits"),
            ("policy: {max-types: 3}", "policy"),
            ("cdi: {}", "cdi"),
        ] {
            let b = identity(&format!("{{{base}, {extra}}}"), "1");
            assert_eq!(a.changes(&b), [key], "{extra}");
        }
        let moved = identity("{name: a, component: hook.wasm, namespace: a.io}", "2");
        assert_eq!(a.changes(&moved), ["component"]);
        let ns = identity("{name: a, component: kvm.wasm, namespace: b.io}", "1");
        assert_eq!(a.changes(&ns), ["namespace"]);
        assert!(a.changes(&a.clone()).is_empty());
    }

    #[test]
    fn oci_settings_matter_only_to_oci_components() {
        let load = |oci: &str, component: &str| {
            let c = in_shared_dir(&format!(
                "scanners:\n  - {{name: a, component: '{component}', namespace: a.io}}\noci: {oci}\n"
            ));
            let s = c.scanners.into_iter().next().unwrap();
            let sha = matches!(s.component, ComponentSource::File(_)).then(|| "1".to_string());
            ScannerIdentity::new(s, &c.oci, sha, None)
        };
        let file = load("{}", "kvm.wasm");
        let file2 = load("{insecure-registries: [r.example:5000]}", "kvm.wasm");
        assert!(file.changes(&file2).is_empty());
        let oci = load("{}", "oci://r.example/k:1");
        let oci2 = load(
            "{insecure-registries: [r.example:5000]}",
            "oci://r.example/k:1",
        );
        assert_eq!(oci.changes(&oci2), ["oci"]);
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn yamlish() -> impl Strategy<Value = String> {
            prop::collection::vec(
                prop_oneof![
                    Just("scanners:\n".to_string()),
                    Just("  - name: kvm\n".to_string()),
                    Just("    component: kvm.wasm\n".to_string()),
                    Just("    namespace: x.io\n".to_string()),
                    Just("    limits: {memory: 1Gi, call-timeout: 1s}\n".to_string()),
                    Just("    policy: {allowed-mounts: [/x]}\n".to_string()),
                    Just("    env: {A: 1}\n".to_string()),
                    "[ -~\n]{0,16}",
                ],
                0..10,
            )
            .prop_map(|parts| parts.concat())
        }

        proptest! {
            #![proptest_config(crate::fuzz::config())]

            /// Any text: parsing never panics, and every error names the file.
            #[test]
            fn any_text_parses_or_names_the_file(text in yamlish()) {
                let dir = tempfile::tempdir().unwrap();
                std::fs::write(dir.path().join("kvm.wasm"), b"").unwrap();
                if let Err(e) = parse(&text, Path::new("fuzz.yaml"), dir.path()) {
                    prop_assert!(e.to_string().starts_with("config fuzz.yaml: "), "{e}");
                }
            }
        }
    }
}
