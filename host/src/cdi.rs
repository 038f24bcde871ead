//! CDI spec files for a scanner's devices, and the CDI names Allocate returns for them.
//!
//! With the Container Device Interface the container runtime, not kubelet, applies a device's
//! nodes, mounts and environment, from a spec file it finds in a well-known directory
//! (`/var/run/cdi`); the plugin only names the device in its Allocate answer
//! (`cdi_devices`, the Device Plugin API's CDI field). When a scanner's config has `cdi:`, its
//! manager keeps one spec file per resource in that directory, in step with the tree: written
//! before kubelet can see a new or changed device, removed when the device type goes away. Files are written to a temporary
//! name and renamed, so a runtime never reads half a spec. Specs outlive the process: stopping
//! or crashing removes none, and the next start takes them over (`ownership.rs`).
//!
//! Kind `<namespace>/<dev-type>` (one kind per resource, e.g. `gpu.intel.com/i915`), one CDI
//! device per device id (`gpu.intel.com/i915=card0-0`). Each spec declares the lowest CDI version
//! its content needs ([`version`]), so runtimes with an older CDI library read every spec they
//! can, and is checked against that version's rules ([`schema`]) before it is written. A device
//! id that is not a valid CDI device name, or a device with nothing for a runtime to apply (no
//! node, mount or env: a runtime refuses a spec holding one), is served without a CDI name
//! (logged once per tree); its default Allocate answer still carries everything.

pub mod schema;

mod ownership;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

pub use self::ownership::SpecOwnership;

use crate::atomic_file::WriteReport;
use crate::cdi_version::{self as version, CdiVersion};
use crate::metrics::DiskFile;
use crate::status::DiskReport;
use crate::tree::{DeviceGroup, DeviceInfo, DeviceTree, is_cdi_name};

/// Where container runtimes look for specs unless configured otherwise.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";

/// How spec files are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CdiFormat {
    #[default]
    /// JSON, what every CDI library reads.
    Json,
    /// YAML, for people who read the specs.
    Yaml,
}

impl CdiFormat {
    fn extension(self) -> &'static str {
        match self {
            CdiFormat::Json => "json",
            CdiFormat::Yaml => "yaml",
        }
    }
}

/// A scanner's `cdi:` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiConfig {
    /// Where spec files are written (normally `/var/run/cdi`).
    pub dir: PathBuf,
    /// The files' format.
    pub format: CdiFormat,
}

impl Default for CdiConfig {
    fn default() -> Self {
        CdiConfig {
            dir: DEFAULT_CDI_DIR.into(),
            format: CdiFormat::Json,
        }
    }
}

/// Why a spec file could not be written or removed.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error(
        "CDI kind {kind:?} is not valid (the namespace and the dev-type must start with a letter, end with a letter or digit, and hold only letters, digits, '-', '_' and '.')"
    )]
    /// The kind (`vendor/class`) is not a valid CDI kind.
    Kind {
        /// The kind as configured.
        kind: String,
    },
    #[error("CDI spec {path} would not load in a container runtime: {error}")]
    /// A spec would break its version's rules.
    Schema {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error, whole.
        error: schema::SchemaError,
    },
    #[error("cannot write CDI spec {path}: {error}")]
    /// A spec file could not be written.
    Write {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error, whole.
        error: std::io::Error,
    },
    #[error("cannot encode CDI spec {path}: {message}")]
    /// A spec could not be encoded.
    Encode {
        /// The path concerned.
        path: PathBuf,
        /// What is wrong, in words.
        message: String,
    },
}

/// The CDI name wdp gives device `id` of `kind`.
fn own_name(kind: &str, id: &str) -> String {
    format!("{kind}={id}")
}

/// What a spec is written from: the group without its devices' attributes, which no spec
/// carries, nor the CDI names wdp added to it (a group served before is written from again
/// when a write is retried).
fn spec_part(kind: &str, group: &DeviceGroup) -> DeviceGroup {
    group
        .iter()
        .map(|(id, info)| {
            let own = own_name(kind, id);
            let info = DeviceInfo {
                attributes: Default::default(),
                cdi_devices: info
                    .cdi_devices
                    .iter()
                    .filter(|n| **n != own)
                    .cloned()
                    .collect(),
                ..info.clone()
            };
            (id.clone(), info)
        })
        .collect()
}

/// Whether device `id` of `kind` would be written as `written` (from a [`spec_part`]) was:
/// equal but for its attributes and the CDI name wdp adds.
fn same_device(kind: &str, id: &str, written: &DeviceInfo, device: &DeviceInfo) -> bool {
    // Destructured: a field added to devices is compared until said otherwise here.
    let DeviceInfo {
        health,
        nodes,
        mounts,
        envs,
        annotations,
        numa_nodes,
        cdi_devices,
        attributes: _,
    } = device;
    let own = own_name(kind, id);
    written.health == *health
        && written.nodes == *nodes
        && written.mounts == *mounts
        && written.envs == *envs
        && written.annotations == *annotations
        && written.numa_nodes == *numa_nodes
        && written
            .cdi_devices
            .iter()
            .eq(cdi_devices.iter().filter(|n| **n != own))
}

/// Whether `group` would be written as `written` (a [`spec_part`]) was: the same devices, each
/// the same.
fn same_spec(kind: &str, written: &DeviceGroup, group: &DeviceGroup) -> bool {
    written.len() == group.len()
        && written
            .iter()
            .zip(group)
            .all(|((wid, w), (id, d))| wid == id && same_device(kind, id, w, d))
}

/// The name wdp gives the spec of resource `<namespace>/<dev-type>` in `format`.
fn spec_file_name(namespace: &str, dev_type: &str, format: CdiFormat) -> String {
    format!("wdp-{namespace}-{dev_type}.{}", format.extension())
}

/// The spec files of one scanner's resources.
#[derive(Debug)]
pub struct CdiWriter {
    config: CdiConfig,
    namespace: String,
    /// The scanner, as [`SpecOwnership`] knows it.
    scanner: Arc<str>,
    ownership: Arc<SpecOwnership>,
    /// Until [`CdiWriter::leave`]: after it, the scanner's name may already be a successor's.
    joined: bool,
    /// Per dev-type: the group its spec file on disk was written from, and that file (None:
    /// the group had no device with a CDI name, so there is no file). A write that fails leaves
    /// the entry (and the file) as they were.
    written: BTreeMap<String, (DeviceGroup, Option<PathBuf>)>,
    /// Per dev-type whose last write failed on the disk (full, read-only): the group wanted on
    /// disk ([`spec_part`]), written again by [`CdiWriter::retry`] or the next tree.
    pending: BTreeMap<String, DeviceGroup>,
    /// Where failed and succeeded writes are reported (`/readyz`, metrics, the log once per
    /// change).
    report: DiskReport,
}

impl CdiWriter {
    /// Spec files for the resources of `namespace`, in `config.dir`, written for `scanner`;
    /// `ownership` learns which files it writes.
    pub fn new(
        config: CdiConfig,
        namespace: &str,
        scanner: Arc<str>,
        ownership: Arc<SpecOwnership>,
    ) -> Self {
        ownership.join(&scanner, namespace, &config.dir);
        CdiWriter {
            config,
            namespace: namespace.to_string(),
            scanner,
            ownership,
            joined: true,
            written: BTreeMap::new(),
            pending: BTreeMap::new(),
            report: DiskReport::detached(DiskFile::Cdi),
        }
    }

    /// Reports its writes to `report` (a manager's `/readyz` and metrics) instead of the log
    /// alone.
    pub fn report_to(&mut self, report: DiskReport) {
        self.report = report;
    }

    /// Whether some spec could not be written and waits for [`CdiWriter::retry`].
    pub fn failing(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The spec file of `dev_type`.
    pub fn path(&self, dev_type: &str) -> PathBuf {
        self.config.dir.join(spec_file_name(
            &self.namespace,
            dev_type,
            self.config.format,
        ))
    }

    /// Brings the spec files in line with `tree` (writes changed and new types, removes gone
    /// ones) and returns the tree to serve: `tree` with each device's CDI name added where its
    /// type's spec on disk describes it as it is now. The tree is taken and given back, not
    /// copied; a spec is written again only when what it describes changed (a device's
    /// attributes are not in it), or its last write failed.
    ///
    /// A write that fails on the disk (full, read-only) leaves the previous spec in place:
    /// kubelet replays the CDI names it already handed out on every container restart, and
    /// they must still resolve. Devices that spec does not describe as they are now are served
    /// without a CDI name until it is written (by [`CdiWriter::retry`] or the next tree):
    /// their default Allocate answer still carries their nodes, mounts and env, while a name
    /// the runtime cannot resolve, or resolves to other edits, would fail or misconfigure the
    /// container (a DRA claim holding one is refused instead: [`CdiWriter::unwritten`]).
    pub fn sync(&mut self, mut tree: DeviceTree) -> DeviceTree {
        let gone: Vec<String> = self
            .written
            .keys()
            .chain(self.pending.keys())
            .filter(|t| !tree.0.contains_key(*t))
            .cloned()
            .collect();
        for dev_type in gone {
            let had_file = matches!(self.written.remove(&dev_type), Some((_, Some(_))));
            if self.pending.remove(&dev_type).is_some() || had_file {
                let path = self.path(&dev_type);
                remove(&path);
                self.report.forget(&path);
            }
        }
        for (dev_type, group) in &mut tree.0 {
            let kind = format!("{}/{dev_type}", self.namespace);
            let unchanged = self
                .written
                .get(dev_type)
                .is_some_and(|(written, _)| same_spec(&kind, written, group));
            if unchanged {
                if self.pending.remove(dev_type).is_some() {
                    // Back to what is on disk: nothing left to write.
                    self.report.forget(&self.path(dev_type));
                }
            } else {
                self.write_group(dev_type, &kind, spec_part(&kind, group));
            }
            self.name(dev_type, &kind, group);
        }
        self.tell_ownership();
        tree
    }

    /// Writes again every spec whose last write failed; whether one now is on disk (then the
    /// served tree gets the CDI names of its devices: [`CdiWriter::names`]).
    pub fn retry(&mut self) -> bool {
        let mut wrote = false;
        for (dev_type, wanted) in std::mem::take(&mut self.pending) {
            let kind = format!("{}/{dev_type}", self.namespace);
            wrote |= self.write_group(&dev_type, &kind, wanted);
        }
        if wrote {
            self.tell_ownership();
        }
        wrote
    }

    /// `tree` (one this writer returned from [`CdiWriter::sync`]) with the CDI names of the
    /// devices whose specs are on disk now added; nothing is written or removed.
    pub fn names(&self, mut tree: DeviceTree) -> DeviceTree {
        for (dev_type, group) in &mut tree.0 {
            let kind = format!("{}/{dev_type}", self.namespace);
            self.name(dev_type, &kind, group);
        }
        tree
    }

    /// The devices of the last tree whose specs could not be written (they have no CDI name),
    /// with the write's error, by dev-type: a DRA claim holding one must fail, since a prepared
    /// claim gives the runtime CDI names and nothing else.
    pub fn unwritten(&self) -> BTreeMap<&str, (String, Vec<&str>)> {
        let mut out = BTreeMap::new();
        for (dev_type, wanted) in &self.pending {
            let kind = format!("{}/{dev_type}", self.namespace);
            let on_disk = self.on_disk(dev_type);
            let ids: Vec<&str> = wanted
                .iter()
                .filter(|(id, info)| SpecDevice::describes(&kind, id, info))
                .filter(|(id, info)| {
                    !on_disk
                        .and_then(|g| g.get(*id))
                        .is_some_and(|w| same_device(&kind, id, w, info))
                })
                .map(|(id, _)| id.as_str())
                .collect();
            if !ids.is_empty() {
                let why = format!(
                    "its CDI spec {} could not be written (see /readyz)",
                    self.path(dev_type).display()
                );
                out.insert(dev_type.as_str(), (why, ids));
            }
        }
        out
    }

    /// The group the spec of `dev_type` on disk describes, if there is one.
    fn on_disk(&self, dev_type: &str) -> Option<&DeviceGroup> {
        self.written
            .get(dev_type)
            .and_then(|(g, path)| path.as_ref().map(|_| g))
    }

    /// Adds the CDI name of each device of `group` that the spec on disk describes as it is.
    fn name(&self, dev_type: &str, kind: &str, group: &mut DeviceGroup) {
        let Some(on_disk) = self.on_disk(dev_type) else {
            return;
        };
        let named: Vec<(String, String)> = group
            .iter()
            .filter_map(|(id, info)| {
                let name = own_name(kind, id);
                let described = on_disk
                    .get(id)
                    .is_some_and(|w| same_device(kind, id, w, info));
                (described
                    && SpecDevice::describes(kind, id, info)
                    && !info.cdi_devices.contains(&name))
                .then(|| (id.clone(), name))
            })
            .collect();
        // Only the devices named are copied out of what the group shares with older versions.
        for (id, name) in named {
            if let Some(info) = group.get_mut(&id) {
                info.cdi_devices.push(name);
            }
        }
    }

    /// Writes the spec of `wanted` (a [`spec_part`]); whether it is on disk now. A failure of
    /// the disk keeps the previous file and leaves the group pending; any other (a kind or spec
    /// no runtime would load) is not retried: the spec would be refused again.
    fn write_group(&mut self, dev_type: &str, kind: &str, wanted: DeviceGroup) -> bool {
        match self.write(dev_type, kind, &wanted) {
            Ok(path) => {
                if self.pending.remove(dev_type).is_some() || path.is_some() {
                    self.report.wrote(&self.path(dev_type), None);
                }
                self.written.insert(dev_type.to_string(), (wanted, path));
                true
            }
            Err(CdiError::Write { path, error }) => {
                self.report.wrote(&path, Some(&error));
                self.pending.insert(dev_type.to_string(), wanted);
                false
            }
            Err(e) => {
                tracing::error!(namespace = %self.namespace, dev_type, error = %e, "CDI spec not written");
                if let Some((_, Some(path))) = self.written.remove(dev_type) {
                    remove(&path);
                }
                if self.pending.remove(dev_type).is_some() {
                    self.report.forget(&self.path(dev_type));
                }
                false
            }
        }
    }

    /// Tells the ownership which files this scanner writes: those on disk, and those whose
    /// write failed (the file of an earlier run stays for the runtime until it is rewritten).
    fn tell_ownership(&self) {
        let pending: Vec<(&str, PathBuf)> = self
            .pending
            .keys()
            .filter(|t| !self.written.contains_key(*t))
            .map(|t| (t.as_str(), self.path(t)))
            .filter(|(_, p)| p.exists())
            .collect();
        let files: Vec<(&str, &Path)> = self
            .written
            .iter()
            .filter_map(|(t, (_, path))| Some((t.as_str(), path.as_deref()?)))
            .chain(pending.iter().map(|(t, p)| (*t, p.as_path())))
            .collect();
        self.ownership.wrote(&self.scanner, &files);
    }

    /// Stops writing: the spec files stay for the runtime (kubelet replays their names after
    /// any restart) and are handed to [`SpecOwnership`], which removes them only once nothing
    /// configured may serve them.
    pub fn leave(&mut self) {
        if !std::mem::take(&mut self.joined) {
            return;
        }
        for dev_type in std::mem::take(&mut self.pending).into_keys() {
            let path = self.path(&dev_type);
            self.report.forget(&path);
            if !self.written.contains_key(&dev_type) && path.exists() {
                // An earlier run's file it could not rewrite: still the runtime's to read.
                self.written
                    .insert(dev_type, (DeviceGroup::default(), Some(path)));
            }
        }
        let files = std::mem::take(&mut self.written)
            .into_iter()
            .filter_map(|(t, (_, path))| Some((t, path?)));
        self.ownership.leave(&self.scanner, files);
    }

    /// Writes the spec of one group; a group without a device to describe has no file.
    fn write(
        &self,
        dev_type: &str,
        kind: &str,
        group: &DeviceGroup,
    ) -> Result<Option<PathBuf>, CdiError> {
        if !is_cdi_name(&format!("{kind}=x")) {
            return Err(CdiError::Kind { kind: kind.into() });
        }
        let mut spec = Spec::new(kind, group);
        let skipped = group.len() - spec.devices.len();
        if skipped > 0 {
            tracing::warn!(
                kind,
                skipped,
                "devices whose id is not a CDI device name, or with no node, mount or env, get no CDI name"
            );
        }
        let path = self.path(dev_type);
        if spec.devices.is_empty() {
            remove(&path);
            return Ok(None);
        }
        spec.settle_version(&path)?;
        let bytes = match self.config.format {
            CdiFormat::Json => serde_json::to_vec_pretty(&spec).map_err(|e| e.to_string()),
            CdiFormat::Yaml => serde_yaml_ng::to_string(&spec)
                .map(String::into_bytes)
                .map_err(|e| e.to_string()),
        }
        .map_err(|message| CdiError::Encode {
            path: path.clone(),
            message,
        })?;
        // A spec already on disk as it would be written (an earlier run's, after a restart) is
        // kept as is: nothing to write, so nothing a full or read-only disk could refuse.
        if std::fs::read(&path).is_ok_and(|on_disk| on_disk == bytes) {
            return Ok(Some(path));
        }
        std::fs::create_dir_all(&self.config.dir)
            .and_then(|()| crate::atomic_file::write(&path, &bytes, 0o644, ownership::TEMP_PREFIX))
            .map_err(|error| CdiError::Write {
                path: path.clone(),
                error,
            })?;
        Ok(Some(path))
    }
}

impl Drop for CdiWriter {
    fn drop(&mut self) {
        self.leave();
    }
}

fn remove(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot remove CDI spec"),
    }
}

/// A CDI spec (container-device-interface `specs-go`), only the fields wdp writes.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    cdi_version: &'static str,
    kind: String,
    devices: Vec<SpecDevice>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecDevice {
    name: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
    container_edits: ContainerEdits,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ContainerEdits {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    device_nodes: Vec<DeviceNode>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    mounts: Vec<SpecMount>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct DeviceNode {
    path: String,
    /// Only where it differs from `path` (the runtime uses `path` then): a host path needs CDI
    /// 0.5.0, and most nodes keep their path.
    #[serde(skip_serializing_if = "Option::is_none")]
    host_path: Option<String>,
    permissions: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecMount {
    host_path: String,
    container_path: String,
    #[serde(rename = "type")]
    kind: &'static str,
    options: Vec<&'static str>,
}

impl Spec {
    fn new(kind: &str, group: &DeviceGroup) -> Self {
        let devices = group
            .iter()
            .filter(|(id, info)| SpecDevice::describes(kind, id, info))
            .map(|(id, info)| SpecDevice::new(id, info))
            .collect();
        Spec {
            cdi_version: CdiVersion::V0_3_0.as_str(),
            kind: kind.to_string(),
            devices,
        }
    }

    /// Declares the lowest CDI version the content needs, and checks the spec against that
    /// version's rules: a spec a runtime would refuse is never written.
    fn settle_version(&mut self, path: &Path) -> Result<(), CdiError> {
        let mut doc = serde_json::to_value(&*self).map_err(|e| CdiError::Encode {
            path: path.into(),
            message: e.to_string(),
        })?;
        let needs = version::minimum(&doc);
        self.cdi_version = needs.as_str();
        doc["cdiVersion"] = needs.as_str().into();
        schema::check(&doc).map_err(|error| CdiError::Schema {
            path: path.into(),
            error,
        })?;
        Ok(())
    }
}

impl SpecDevice {
    /// Whether device `id` of `kind` goes into the spec: its CDI name is valid, and it has
    /// something for the runtime to apply.
    fn describes(kind: &str, id: &str, info: &DeviceInfo) -> bool {
        is_cdi_name(&format!("{kind}={id}"))
            && !(info.nodes.is_empty() && info.mounts.is_empty() && info.envs.is_empty())
    }

    fn new(id: &str, info: &DeviceInfo) -> Self {
        SpecDevice {
            name: id.to_string(),
            annotations: info.annotations.clone(),
            container_edits: ContainerEdits {
                env: info.envs.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                device_nodes: info
                    .nodes
                    .iter()
                    .map(|n| DeviceNode {
                        path: n.container_path.clone(),
                        host_path: (n.host_path != n.container_path).then(|| n.host_path.clone()),
                        permissions: n.permissions.clone(),
                    })
                    .collect(),
                mounts: info
                    .mounts
                    .iter()
                    .map(|m| SpecMount {
                        host_path: m.host_path.clone(),
                        container_path: m.container_path.clone(),
                        kind: "none",
                        options: vec!["bind", if m.read_only { "ro" } else { "rw" }],
                    })
                    .collect(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{DeviceSpec, Mount};

    fn group(ids: &[&str]) -> DeviceGroup {
        ids.iter()
            .map(|id| {
                let info = DeviceInfo {
                    nodes: vec![DeviceSpec {
                        container_path: format!("/dev/dri/{id}"),
                        host_path: format!("/dev/dri/{id}"),
                        permissions: "rw".into(),
                    }],
                    mounts: vec![Mount {
                        container_path: "/dev/dri/by-path".into(),
                        host_path: "/dev/dri/by-path".into(),
                        read_only: true,
                    }],
                    envs: BTreeMap::from([("A".to_string(), "1".to_string())]),
                    ..DeviceInfo::default()
                };
                (id.to_string(), info)
            })
            .collect()
    }

    fn writer(dir: &Path, format: CdiFormat) -> CdiWriter {
        CdiWriter::new(
            CdiConfig {
                dir: dir.join("cdi"),
                format,
            },
            "gpu.example.com",
            "gpu".into(),
            Arc::default(),
        )
    }

    #[test]
    fn specs_follow_the_tree_and_names_are_served() {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = writer(tmp.path(), CdiFormat::Json);
        let mut tree = DeviceTree::default();
        tree.0.insert("i915".into(), group(&["card0", "card1"]));
        tree.0.insert("9bad".into(), group(&["x"]));
        let served = w.sync(tree.clone());
        assert_eq!(
            served.0["i915"]["card1"].cdi_devices,
            ["gpu.example.com/i915=card1"]
        );
        assert!(served.0["9bad"]["x"].cdi_devices.is_empty(), "invalid kind");
        assert!(!w.path("9bad").exists());

        let path = w.path("i915");
        assert_eq!(path, tmp.path().join("cdi/wdp-gpu.example.com-i915.json"));
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            spec,
            serde_json::json!({
                "cdiVersion": "0.4.0",
                "kind": "gpu.example.com/i915",
                "devices": [
                    {"name": "card0", "containerEdits": {
                        "env": ["A=1"],
                        "deviceNodes": [{"path": "/dev/dri/card0", "permissions": "rw"}],
                        "mounts": [{"hostPath": "/dev/dri/by-path", "containerPath": "/dev/dri/by-path", "type": "none", "options": ["bind", "ro"]}]}},
                    {"name": "card1", "containerEdits": {
                        "env": ["A=1"],
                        "deviceNodes": [{"path": "/dev/dri/card1", "permissions": "rw"}],
                        "mounts": [{"hostPath": "/dev/dri/by-path", "containerPath": "/dev/dri/by-path", "type": "none", "options": ["bind", "ro"]}]}}
                ]
            })
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);

        // A change of attributes only is not in the spec: the file is not written again.
        std::fs::write(&path, "kept").unwrap();
        let mut attributed = tree.clone();
        if let Some(card) = attributed
            .0
            .get_mut("i915")
            .and_then(|g| g.get_mut("card0"))
        {
            card.attributes
                .capacities
                .insert("memory".into(), "16Gi".into());
        }
        let served = w.sync(attributed);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "kept");
        assert_eq!(
            served.0["i915"]["card0"].attributes.capacities["memory"],
            "16Gi"
        );
        w.sync(tree.clone());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "kept");

        // A changed group is rewritten; a removed one deleted; nothing else is left in the dir.
        tree.0.insert("i915".into(), group(&["card0"]));
        w.sync(tree.clone());
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(spec["devices"].as_array().unwrap().len(), 1);
        tree.0.insert("i915".into(), group(&[]));
        w.sync(tree.clone());
        assert!(!path.exists(), "no devices, no spec");
        tree.0.insert("i915".into(), group(&["card0"]));
        w.sync(tree.clone());
        assert!(path.exists());
        tree.0.remove("i915");
        w.sync(tree.clone());
        assert!(!path.exists());
        let left: Vec<_> = std::fs::read_dir(tmp.path().join("cdi")).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    /// The `cdiVersion` and content of `w`'s spec for `dev_type`.
    fn written(w: &CdiWriter, dev_type: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(w.path(dev_type)).unwrap()).unwrap()
    }

    #[test]
    fn the_version_follows_the_content_and_a_change_rewrites_it() {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = writer(tmp.path(), CdiFormat::Json);
        let node = |host: &str| DeviceSpec {
            container_path: "/dev/ttyUSB0".into(),
            host_path: host.into(),
            permissions: "rw".into(),
        };
        let only = |info: DeviceInfo| {
            DeviceTree(BTreeMap::from([(
                "tty".to_string(),
                DeviceGroup::from_iter([("port-a".to_string(), info)]),
            )]))
        };
        let plain = DeviceInfo {
            nodes: vec![node("/dev/ttyUSB0")],
            ..DeviceInfo::default()
        };
        w.sync(only(plain.clone()));
        assert_eq!(written(&w, "tty")["cdiVersion"], "0.3.0");
        let moved = DeviceInfo {
            nodes: vec![node("/dev/ttyUSB1")],
            ..DeviceInfo::default()
        };
        w.sync(only(moved));
        let spec = written(&w, "tty");
        assert_eq!(spec["cdiVersion"], "0.5.0", "a host path of its own");
        assert_eq!(
            spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"],
            "/dev/ttyUSB1"
        );
        let annotated = DeviceInfo {
            annotations: BTreeMap::from([("example.com/port".to_string(), "a".to_string())]),
            ..plain.clone()
        };
        w.sync(only(annotated));
        assert_eq!(written(&w, "tty")["cdiVersion"], "0.6.0");
        w.sync(only(plain));
        assert_eq!(written(&w, "tty")["cdiVersion"], "0.3.0", "and back down");

        // A leading digit, a dotted dev-type: each needs its version; every file passes the
        // rules of the version it declares.
        let mut tree = DeviceTree::default();
        tree.0.insert("qat".into(), group(&["0000:3d:01.1"]));
        tree.0.insert("i915.vf".into(), group(&["card0"]));
        let served = w.sync(tree.clone());
        assert_eq!(written(&w, "qat")["cdiVersion"], "0.5.0");
        assert_eq!(written(&w, "i915.vf")["cdiVersion"], "0.6.0");
        assert_eq!(
            served.0["i915.vf"]["card0"].cdi_devices,
            ["gpu.example.com/i915.vf=card0"]
        );
        for t in ["qat", "i915.vf"] {
            schema::check(&written(&w, t)).unwrap();
        }
    }

    #[test]
    fn a_device_with_nothing_to_apply_gets_no_cdi_name() {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = writer(tmp.path(), CdiFormat::Json);
        let mut g = group(&["card0"]);
        g.insert("queue".into(), DeviceInfo::default());
        let tree = DeviceTree(BTreeMap::from([("i915".to_string(), g)]));
        let served = w.sync(tree.clone());
        assert!(served.0["i915"]["queue"].cdi_devices.is_empty());
        assert_eq!(served.0["i915"]["card0"].cdi_devices.len(), 1);
        let spec = written(&w, "i915");
        assert_eq!(spec["devices"].as_array().unwrap().len(), 1);
        schema::check(&spec).unwrap();
        // Only such devices: no file at all.
        let empty = DeviceTree(BTreeMap::from([(
            "i915".to_string(),
            DeviceGroup::from_iter([("queue".to_string(), DeviceInfo::default())]),
        )]));
        w.sync(empty.clone());
        assert!(!w.path("i915").exists());
    }

    #[test]
    fn yaml_and_specs_outlive_the_writer() {
        let tmp = tempfile::tempdir().unwrap();
        let mut w = writer(tmp.path(), CdiFormat::Yaml);
        let mut tree = DeviceTree::default();
        tree.0.insert("acc".into(), group(&["a:0", "/dev/bad"]));
        let served = w.sync(tree.clone());
        assert!(served.0["acc"]["/dev/bad"].cdi_devices.is_empty());
        let path = w.path("acc");
        let text = std::fs::read_to_string(&path).unwrap();
        let spec: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(spec["kind"], "gpu.example.com/acc");
        assert_eq!(spec["devices"][0]["name"], "a:0");
        assert_eq!(spec["devices"].as_array().unwrap().len(), 1);
        // Stopping removes nothing: kubelet replays the names after any restart.
        drop(w);
        assert!(path.exists());
    }

    #[test]
    fn a_full_disk_keeps_the_spec_and_names_only_what_it_describes() {
        let disk = crate::testing::SmallDisk::mount();
        let mut w = CdiWriter::new(
            CdiConfig {
                dir: disk.path().to_path_buf(),
                format: CdiFormat::Json,
            },
            "gpu.example.com",
            "gpu".into(),
            Arc::default(),
        );
        let mut tree = DeviceTree::default();
        tree.0.insert("i915".into(), group(&["card0"]));
        w.sync(tree.clone());
        let path = w.path("i915");
        let before = std::fs::read(&path).unwrap();

        disk.fill();
        tree.0.insert("i915".into(), group(&["card0", "card1"]));
        let served = w.sync(tree.clone());
        assert_eq!(
            served.0["i915"]["card0"].cdi_devices,
            ["gpu.example.com/i915=card0"],
            "the spec on disk describes it as it is"
        );
        assert!(
            served.0["i915"]["card1"].cdi_devices.is_empty(),
            "not on disk"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before, "the old spec, whole");
        assert!(w.failing());
        assert_eq!(w.unwritten()["i915"].1, ["card1"]);
        assert!(!w.retry(), "still full");
        assert_eq!(std::fs::read(&path).unwrap(), before);

        disk.free();
        assert!(w.retry());
        assert!(!w.failing() && w.unwritten().is_empty());
        let named = w.names(served);
        assert_eq!(
            named.0["i915"]["card1"].cdi_devices,
            ["gpu.example.com/i915=card1"]
        );
        assert_eq!(
            named.0["i915"]["card0"].cdi_devices,
            ["gpu.example.com/i915=card0"],
            "named once"
        );
        assert_eq!(written(&w, "i915")["devices"].as_array().unwrap().len(), 2);
        // The served tree, names and all, is what is on disk: nothing to write again.
        std::fs::write(&path, "kept").unwrap();
        w.sync(named);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "kept");
        assert_eq!(disk.names(), ["wdp-gpu.example.com-i915.json"]);
    }

    #[test]
    fn an_unwritable_dir_serves_without_names() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("cdi"), "a file, not a dir").unwrap();
        let mut w = writer(tmp.path(), CdiFormat::Json);
        let mut tree = DeviceTree::default();
        tree.0.insert("i915".into(), group(&["card0"]));
        let served = w.sync(tree.clone());
        assert!(served.0["i915"]["card0"].cdi_devices.is_empty());
    }
}
