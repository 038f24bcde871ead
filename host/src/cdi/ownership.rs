//! Which CDI spec files are wdp's, and when one may be removed.
//!
//! A spec must outlive the process that wrote it. kubelet caches each Allocate answer, CDI names
//! included, and replays it on every restart of the container and after its own restart without
//! asking the plugin again; the container runtime then resolves the names from the spec
//! directory. So while wdp is stopped, crashed or being replaced by a rolling update, the specs
//! of the devices already handed out must stay. A spec is therefore removed only by a running wdp
//! that stops serving its resource: the device type vanished from its scanner's tree, or a reload
//! removed the scanner (or moved it to another namespace, directory or format). Stopping, for
//! any reason, removes nothing.
//!
//! A file is wdp's when both its name and its contents say so: it is named
//! `wdp-<namespace>-<dev-type>.json` (or `.yaml`) and the spec inside has exactly that kind,
//! `<namespace>/<dev-type>`. Nothing else in the directory is ever touched (wdp's own temporary
//! files, `.wdp-cdi-*`, left by a crash in the middle of a write, aside).
//!
//! [`SpecOwnership`] is host-wide. At start (and when a reload adds a directory) the files wdp
//! owns there are *orphans*: on disk, written by no running scanner. Each waits for the scanners
//! that may serve its resource, those configured with its namespace and directory. Once every one
//! of them has applied its first accepted tree, an orphan that none of them rewrote is removed,
//! and so is a spec of the same resource in the other format (a `json` to `yaml` change leaves
//! one file). An orphan no configured scanner may serve is removed at once. A scanner that is
//! stopped leaves its files as orphans; only [`SpecOwnership::sweep`], called after a config is
//! applied, removes those that nothing configured may serve any more. A scanner that never
//! delivers a tree keeps its predecessor's specs: a container using them still starts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{CdiFormat, remove, spec_file_name};

/// The prefix of wdp's temporary files, renamed over a spec once written.
pub(super) const TEMP_PREFIX: &str = ".wdp-cdi-";

/// The host-wide record of wdp's spec files. Cheap to share (`Arc`).
#[derive(Debug, Default)]
pub struct SpecOwnership {
    ledger: Mutex<Ledger>,
}

#[derive(Debug, Default)]
struct Ledger {
    /// Directories already searched for wdp's files.
    adopted: BTreeSet<PathBuf>,
    /// wdp's files that no running scanner writes, by path.
    orphans: BTreeMap<PathBuf, Orphan>,
    /// Running scanners with `cdi:`, by scanner name.
    writers: BTreeMap<Arc<str>, Writer>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Orphan {
    dir: PathBuf,
    namespace: String,
    dev_type: String,
}

#[derive(Debug)]
struct Writer {
    namespace: String,
    dir: PathBuf,
    /// Has applied a tree: what it does not write now, it does not serve.
    settled: bool,
}

impl Writer {
    fn may_serve(&self, orphan: &Orphan) -> bool {
        self.namespace == orphan.namespace && self.dir == orphan.dir
    }
}

impl SpecOwnership {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes in the spec files wdp owns in `dirs` (those not searched before) as orphans, and
    /// removes wdp's temporary files there. A directory that does not exist yet has none.
    pub fn adopt<'a>(&self, dirs: impl IntoIterator<Item = &'a Path>) {
        let mut ledger = self.ledger();
        for dir in dirs {
            if !ledger.adopted.insert(dir.to_path_buf()) {
                continue;
            }
            for (path, orphan) in owned_files(dir) {
                tracing::info!(spec = %path.display(), "CDI spec of an earlier run: kept until its scanner's first tree");
                ledger.orphans.insert(path, orphan);
            }
        }
    }

    /// A scanner with `cdi:` starts writing specs of `namespace` into `dir`. Every scanner a config
    /// starts joins before any of them starts: one scanner's first tree must not settle specs
    /// that another of the same namespace may still serve.
    pub fn join(&self, scanner: &Arc<str>, namespace: &str, dir: &Path) {
        self.ledger().writers.insert(
            scanner.clone(),
            Writer {
                namespace: namespace.to_string(),
                dir: dir.to_path_buf(),
                settled: false,
            },
        );
    }

    /// `scanner` applied a tree and now writes exactly `files` (each with its dev-type): orphans
    /// it rewrote are its own again, orphans of the same resources in another format go, and
    /// orphans of its namespace and directory that no unsettled scanner may still serve are
    /// removed.
    pub fn wrote(&self, scanner: &Arc<str>, files: &[(&str, &Path)]) {
        let mut ledger = self.ledger();
        let Some(writer) = ledger.writers.get_mut(scanner) else {
            return;
        };
        writer.settled = true;
        let (namespace, dir) = (writer.namespace.clone(), writer.dir.clone());
        for (dev_type, path) in files {
            ledger.orphans.remove(*path);
            let other_format: Vec<PathBuf> = ledger
                .orphans
                .iter()
                .filter(|(_, o)| {
                    o.dir == dir && o.namespace == namespace && o.dev_type == *dev_type
                })
                .map(|(p, _)| p.clone())
                .collect();
            for path in other_format {
                ledger.orphans.remove(&path);
                tracing::info!(spec = %path.display(), "CDI spec replaced by one in the configured format");
                remove(&path);
            }
        }
        // Only orphans this scanner may serve: another's wait for it to join and settle (or
        // for the sweep once the config is applied, if nothing configured may serve them).
        ledger.resolve(|o| o.dir == dir && o.namespace == namespace);
    }

    /// `scanner` stopped; the files it wrote (`files`) stay on disk as orphans until a sweep
    /// finds nothing configured that may serve them.
    pub fn leave(&self, scanner: &Arc<str>, files: impl IntoIterator<Item = (String, PathBuf)>) {
        let mut ledger = self.ledger();
        let Some(writer) = ledger.writers.remove(scanner) else {
            return;
        };
        for (dev_type, path) in files {
            let orphan = Orphan {
                dir: writer.dir.clone(),
                namespace: writer.namespace.clone(),
                dev_type,
            };
            ledger.orphans.insert(path, orphan);
        }
    }

    /// Removes the orphans that no running scanner may serve, or whose every possible writer has
    /// applied a tree without rewriting them. Called once a config is applied: scanners it
    /// removed have left, the ones it started have joined.
    pub fn sweep(&self) {
        self.ledger().sweep();
    }

    /// The orphans waiting for a scanner's first tree (for `wdp status` and tests).
    pub fn orphans(&self) -> Vec<PathBuf> {
        self.ledger().orphans.keys().cloned().collect()
    }
}

impl Ledger {
    fn sweep(&mut self) {
        self.resolve(|_| true);
    }

    /// Removes the orphans picked by `which` whose possible writers have all settled.
    fn resolve(&mut self, which: impl Fn(&Orphan) -> bool) {
        let done: Vec<PathBuf> = self
            .orphans
            .iter()
            .filter(|(_, orphan)| which(orphan))
            .filter(|(_, orphan)| {
                self.writers
                    .values()
                    .filter(|w| w.may_serve(orphan))
                    .all(|w| w.settled)
            })
            .map(|(p, _)| p.clone())
            .collect();
        for path in done {
            self.orphans.remove(&path);
            tracing::info!(spec = %path.display(), "CDI spec removed: its resource is no longer served");
            remove(&path);
        }
    }
}

/// The spec files in `dir` that are wdp's, each with what it describes; removes wdp's leftover
/// temporary files on the way.
fn owned_files(dir: &Path) -> Vec<(PathBuf, Orphan)> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot list the CDI directory; specs of an earlier run are left alone");
            return Vec::new();
        }
    };
    let mut owned = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with(TEMP_PREFIX) && entry.file_type().is_ok_and(|t| t.is_file()) {
            remove(&path);
            continue;
        }
        if let Some((namespace, dev_type)) = owner(&path, &name) {
            owned.push((
                path,
                Orphan {
                    dir: dir.to_path_buf(),
                    namespace,
                    dev_type,
                },
            ));
        }
    }
    owned
}

/// The `(namespace, dev-type)` of a spec file that is wdp's: its name is the one wdp gives the
/// spec of the kind it holds.
fn owner(path: &Path, name: &str) -> Option<(String, String)> {
    if !name.starts_with("wdp-") {
        return None;
    }
    let format = if name.ends_with(".json") {
        CdiFormat::Json
    } else if name.ends_with(".yaml") {
        CdiFormat::Yaml
    } else {
        return None;
    };
    let text = std::fs::read_to_string(path).ok()?;
    let spec: serde_json::Value = match format {
        CdiFormat::Json => serde_json::from_str(&text).ok()?,
        CdiFormat::Yaml => serde_yaml_ng::from_str(&text).ok()?,
    };
    let (namespace, dev_type) = spec.get("kind")?.as_str()?.split_once('/')?;
    (spec_file_name(namespace, dev_type, format) == name)
        .then(|| (namespace.to_string(), dev_type.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &Path, name: &str, kind: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!("{{\"cdiVersion\": \"0.6.0\", \"kind\": \"{kind}\", \"devices\": []}}"),
        )
        .unwrap();
        path
    }

    #[test]
    fn only_wdps_files_are_taken_and_waited_for() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let kvm = spec(dir, "wdp-a.io-kvm.json", "a.io/kvm");
        let tun = spec(dir, "wdp-a.io-tun.json", "a.io/tun");
        let gone = spec(dir, "wdp-b.io-x.json", "b.io/x");
        // Not wdp's: another vendor's spec, a name whose contents disagree, a file with no spec.
        let vendor = spec(dir, "nvidia.json", "nvidia.com/gpu");
        let liar = spec(dir, "wdp-a.io-gpu.json", "a.io/other");
        std::fs::write(dir.join("wdp-notes.txt"), "x").unwrap();
        std::fs::write(dir.join(".wdp-cdi-abc123"), "half a spec").unwrap();

        let owners = SpecOwnership::default();
        owners.adopt([dir]);
        assert_eq!(owners.orphans(), [kvm.clone(), tun.clone(), gone.clone()]);
        assert!(
            !dir.join(".wdp-cdi-abc123").exists(),
            "a crash's temporary file"
        );

        // Scanner k serves a.io; nothing serves b.io any more.
        let k: Arc<str> = "k".into();
        owners.join(&k, "a.io", dir);
        owners.sweep();
        assert!(!gone.exists(), "no configured scanner may serve b.io/x");
        assert!(kvm.exists() && tun.exists(), "kept until k's first tree");

        // k's first tree has kvm only.
        owners.wrote(&k, &[("kvm", &kvm)]);
        assert!(kvm.exists() && !tun.exists());
        assert!(owners.orphans().is_empty());
        for other in [vendor, liar, dir.join("wdp-notes.txt")] {
            assert!(other.exists(), "{} was touched", other.display());
        }
    }

    #[test]
    fn a_stopped_scanner_leaves_its_files_until_a_sweep_finds_no_server() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let owners = SpecOwnership::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let x = spec(dir, "wdp-n.io-x.json", "n.io/x");
        let y = spec(dir, "wdp-n.io-y.json", "n.io/y");
        owners.join(&a, "n.io", dir);
        owners.join(&b, "n.io", dir);
        owners.wrote(&a, &[("x", &x)]);
        owners.wrote(&b, &[("y", &y)]);

        // The host stops: nothing is removed.
        owners.leave(&a, [("x".to_string(), x.clone())]);
        assert!(x.exists());
        // A reload starts a again (a changed scanner): x waits for its first tree ...
        owners.join(&a, "n.io", dir);
        owners.sweep();
        assert!(x.exists());
        owners.wrote(&a, &[("x", &x)]);
        assert!(owners.orphans().is_empty());

        // ... and a reload that removes b: b's spec goes once the config is applied, although a
        // shares its namespace (a has applied trees without y).
        owners.leave(&b, [("y".to_string(), y.clone())]);
        assert!(y.exists());
        owners.sweep();
        assert!(!y.exists());
        assert!(x.exists());
    }

    #[test]
    fn a_format_change_leaves_one_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let json = spec(dir, "wdp-n.io-x.json", "n.io/x");
        let yaml = dir.join("wdp-n.io-x.yaml");
        std::fs::write(&yaml, "cdiVersion: 0.6.0\nkind: n.io/x\ndevices: []\n").unwrap();
        let owners = SpecOwnership::default();
        owners.adopt([dir]);
        owners.adopt([dir]);
        assert_eq!(owners.orphans(), [json.clone(), yaml.clone()]);
        let s: Arc<str> = "s".into();
        owners.join(&s, "n.io", dir);
        owners.wrote(&s, &[("x", &yaml)]);
        assert!(yaml.exists() && !json.exists());
    }
}
