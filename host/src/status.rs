//! What a running host serves, as the code that does the work sees it: the shared state behind
//! `/status`, `/readyz` and `/metrics`.
//!
//! One [`Observability`] is created per `wdp run`. Each scanner gets a [`ScannerHandle`] from
//! [`Observability::add_scanner`]; its manager reports the scanner's events through it and gets a
//! [`ResourceHandle`] for each resource it serves, which the resource's server updates
//! (registered with kubelet or not, Allocate calls). Stopping a scanner removes it, its resources
//! and their metric series ([`ScannerHandle::remove`], which a manager calls when it stops).
//!
//! Readiness: ready when every scanner has had a tree accepted and every resource of those trees
//! is served and registered with kubelet. A scanner whose only trees were refused, or that fails
//! before its first tree, keeps the host not ready; a scanner that fails after a good tree does
//! not (its last tree stays served). A resource is unregistered while kubelet is away (its
//! `kubelet.sock` gone) until the next kubelet accepts its registration. A scanner served
//! through DRA has its dev-types tracked as resources too ([`ScannerHandle::dra_resource`]), so
//! `/status` and `wdp_resource_devices` read alike for both front-ends; they are registered while
//! its driver is, and readiness is the driver's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wdp_kubelet::server::ServerReport;

use crate::atomic_file::WriteReport;
use crate::metrics::{DiskFile, Live, Metrics, ResourceMetrics, ScannerMetrics, Visit};
use crate::scanner::ScannerEvent;

/// The host-wide observability state. Cheap to clone: every clone is the same state.
#[derive(Clone)]
pub struct Observability {
    inner: Arc<Inner>,
}

impl Default for Observability {
    fn default() -> Self {
        Self::new()
    }
}

struct Inner {
    shared: Arc<Shared>,
    /// Exports `shared`'s series at each scrape.
    metrics: Metrics,
    /// Tells apart two scanners of the same name over time (a reload that replaces one), so the
    /// old one's late removals never touch the new one's entries.
    next_id: AtomicU64,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Live for Arc<Shared> {
    fn with_series(&self, f: &mut Visit<'_>) {
        let state = self.state();
        let scanners: Vec<(&str, &ScannerMetrics)> = state
            .scanners
            .iter()
            .map(|(name, s)| (&**name, &*s.metrics))
            .collect();
        let resources: Vec<(&str, &ResourceMetrics)> = state
            .resources
            .iter()
            .map(|(name, r)| (&**name, &r.metrics))
            .collect();
        f(&scanners, &resources);
    }
}

#[derive(Default)]
struct State {
    /// The first config has been applied: until then the set of scanners is not known yet.
    loaded: bool,
    /// What [`Observability::writable_mounts`] was told.
    writable_mounts: Vec<String>,
    scanners: BTreeMap<Arc<str>, ScannerEntry>,
    resources: BTreeMap<Arc<str>, ResourceEntry>,
    /// Files whose last write failed, with the error: until a write of the same file succeeds
    /// (or nothing wants it written any more).
    disk: BTreeMap<(DiskFile, PathBuf), String>,
}

struct ScannerEntry {
    id: u64,
    phase: Phase,
    /// True once a tree was accepted: its resources are then what readiness waits for.
    accepted: bool,
    last_error: Option<String>,
    /// Resources of the last tree that could not be served, with why (a name clash, a socket
    /// path too long).
    unserved: BTreeMap<String, String>,
    /// Why its DRA driver is not usable by kubelet (not registered, refused); None when it is
    /// or the scanner is served through device plugins.
    dra_not_ready: Option<String>,
    /// Its DRA driver's name and whether kubelet has it registered, once the driver reported.
    dra_driver: Option<(String, bool)>,
    metrics: Arc<ScannerMetrics>,
}

struct ResourceEntry {
    owner: u64,
    metrics: ResourceMetrics,
    registered: bool,
    /// kubelet's answer to the last registration, when it was an error; cleared by the next
    /// accepted one.
    refused: Option<String>,
    healthy: usize,
    unhealthy: usize,
    /// A dev-type served through its scanner's DRA driver: registered when the driver is, and
    /// readiness is the driver's (see [`ScannerHandle::dra_not_ready`]).
    dra: bool,
}

/// Where a scanner is in its life, as `/status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Started, no tree yet.
    Starting,
    /// Its last tree was accepted and is served.
    Serving,
    /// Its last tree was refused; the one before it (if any) stays served.
    Refused,
    /// It failed and restarts after a backoff; its last good tree stays served.
    Restarting,
    /// It failed and is not restarted.
    Failed,
    /// `scan` returned: its last tree stays served.
    Finished,
}

impl Phase {
    /// The word `wdp status` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Serving => "serving",
            Phase::Refused => "refused",
            Phase::Restarting => "restarting",
            Phase::Failed => "failed",
            Phase::Finished => "finished",
        }
    }
}

/// The `/status` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// The host's version.
    pub version: String,
    /// What `/readyz` answers.
    pub ready: bool,
    /// Why not ready, one line each (empty when ready).
    pub not_ready: Vec<String>,
    /// Every scanner, by name.
    pub scanners: Vec<ScannerReport>,
    /// Mounts at or under the sys and dev roots that are not read-only, as `path (fstype)`
    /// (see [`crate::mounts`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable_mounts: Vec<String>,
}

/// One scanner in `/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScannerReport {
    /// The scanner's name.
    pub name: String,
    /// Where it is in its life.
    pub state: Phase,
    /// Instances that failed and restarted.
    pub restarts: u64,
    /// Trees accepted.
    pub trees_accepted: u64,
    /// Trees refused.
    pub trees_refused: u64,
    /// Unix seconds of the last accepted tree.
    pub last_scan: Option<u64>,
    /// Linear memory of its running instance.
    pub guest_memory_bytes: u64,
    /// The last failure's cause.
    pub last_error: Option<String>,
    /// Its resources.
    pub resources: Vec<ResourceReport>,
}

/// One resource in `/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceReport {
    /// `<namespace>/<dev-type>`.
    pub name: String,
    /// Registered with the running kubelet.
    pub registered: bool,
    /// Healthy devices.
    pub healthy: usize,
    /// Unhealthy devices.
    pub unhealthy: usize,
    /// Why it is not served (then it has no devices and is never registered).
    pub error: Option<String>,
    /// The DRA driver that publishes its devices in ResourceSlices, when the scanner is served
    /// through DRA; `registered` then says whether kubelet has that driver registered. Absent
    /// for a device-plugin resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra_driver: Option<String>,
}

impl Observability {
    /// A fresh state with no scanner.
    pub fn new() -> Self {
        let shared = Arc::new(Shared::default());
        Observability {
            inner: Arc::new(Inner {
                metrics: Metrics::new(shared.clone()),
                shared,
                next_id: AtomicU64::new(0),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.shared.state()
    }

    /// Starts tracking scanner `name` (replacing any earlier scanner of that name) with the
    /// series `metrics`, the `Guest::metrics` its instances and hooks already share: its
    /// status entry, in state `starting`, and its series in `/metrics`. Give the handle to its
    /// manager ([`crate::manager::Manager::with_status`]), which removes the scanner when it
    /// stops.
    pub fn add_scanner(&self, name: &str, metrics: Arc<ScannerMetrics>) -> ScannerHandle {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let name: Arc<str> = name.into();
        self.state().scanners.insert(
            name.clone(),
            ScannerEntry {
                id,
                phase: Phase::Starting,
                accepted: false,
                last_error: None,
                unserved: BTreeMap::new(),
                dra_not_ready: None,
                dra_driver: None,
                metrics: metrics.clone(),
            },
        );
        ScannerHandle {
            obs: self.clone(),
            name,
            id,
            metrics,
        }
    }

    /// The first config has been applied: readiness now depends on its scanners alone.
    pub fn loaded(&self) {
        self.state().loaded = true;
    }

    /// `Ok` when ready, else every reason why not, one line each.
    pub fn readiness(&self) -> Result<(), Vec<String>> {
        let state = self.state();
        let mut reasons = Vec::new();
        if !state.loaded {
            reasons.push("the host is still loading its config and components".to_string());
        }
        for (name, s) in &state.scanners {
            if !s.accepted {
                reasons.push(match (s.phase, &s.last_error) {
                    (Phase::Refused, Some(e)) => {
                        format!("scanner {name}: its tree was refused: {e}")
                    }
                    (Phase::Restarting | Phase::Failed, Some(e)) => {
                        format!("scanner {name}: failed before its first tree: {e}")
                    }
                    (Phase::Finished, _) => {
                        format!("scanner {name}: finished without notifying a tree")
                    }
                    _ => format!("scanner {name}: no device tree yet"),
                });
            }
            for (resource, error) in &s.unserved {
                reasons.push(format!("resource {resource}: not served: {error}"));
            }
            if let Some(reason) = &s.dra_not_ready {
                reasons.push(format!("scanner {name}: {reason}"));
            }
        }
        for ((kind, path), error) in &state.disk {
            let path = path.display();
            reasons.push(match kind {
                DiskFile::Cdi => format!(
                    "CDI spec {path} not written: {error} (the previous one stays; its new or changed devices are served without a CDI name until it is)"
                ),
                DiskFile::Checkpoint => format!(
                    "DRA checkpoint {path} not written: {error} (the previous one stays; claims are not prepared or unprepared until it is)"
                ),
                // Costs compile time at the next start, nothing else: not a readiness matter.
                DiskFile::CompileCache => continue,
            });
        }
        for (name, r) in &state.resources {
            // A DRA driver's registration is the scanner's line above.
            if r.registered || r.dra {
                continue;
            }
            reasons.push(match &r.refused {
                Some(reason) => {
                    format!("resource {name}: not registered with kubelet: registration failed: {reason}")
                }
                None => format!("resource {name}: not registered with kubelet"),
            });
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons)
        }
    }

    /// Everything `/status` shows.
    pub fn report(&self) -> StatusReport {
        let not_ready = self.readiness().err().unwrap_or_default();
        let state = self.state();
        let scanners = state
            .scanners
            .iter()
            .map(|(name, s)| {
                let mut resources: Vec<ResourceReport> = state
                    .resources
                    .iter()
                    .filter(|(_, r)| r.owner == s.id)
                    .map(|(rname, r)| {
                        let dra = s.dra_driver.as_ref().filter(|_| r.dra);
                        ResourceReport {
                            name: rname.to_string(),
                            registered: match dra {
                                Some((_, registered)) => *registered,
                                None => r.registered,
                            },
                            healthy: r.healthy,
                            unhealthy: r.unhealthy,
                            error: None,
                            dra_driver: dra.map(|(driver, _)| driver.clone()),
                        }
                    })
                    .collect();
                resources.extend(s.unserved.iter().map(|(rname, e)| ResourceReport {
                    name: rname.clone(),
                    registered: false,
                    healthy: 0,
                    unhealthy: 0,
                    error: Some(e.clone()),
                    dra_driver: None,
                }));
                resources.sort_by(|a, b| a.name.cmp(&b.name));
                let last_scan = u64::try_from(s.metrics.last_scan()).ok().filter(|&t| t > 0);
                ScannerReport {
                    name: name.to_string(),
                    state: s.phase,
                    restarts: ScannerMetrics::get(&s.metrics.failures),
                    trees_accepted: ScannerMetrics::get(&s.metrics.trees_accepted),
                    trees_refused: ScannerMetrics::get(&s.metrics.trees_refused),
                    last_scan,
                    guest_memory_bytes: u64::try_from(s.metrics.memory()).unwrap_or(0),
                    last_error: s.last_error.clone(),
                    resources,
                }
            })
            .collect();
        StatusReport {
            version: env!("CARGO_PKG_VERSION").to_string(),
            ready: not_ready.is_empty(),
            not_ready,
            scanners,
            writable_mounts: state.writable_mounts.clone(),
        }
    }

    /// The writable mounts at or under each root (`sys`, `dev`), as [`crate::mounts::check`]
    /// found them: in `/status` and `wdp_host_writable_mounts`.
    pub fn writable_mounts(&self, found: &[(&'static str, Vec<String>)]) {
        for (root, mounts) in found {
            self.inner.metrics.writable_mounts(root, mounts.len());
        }
        self.state().writable_mounts = found.iter().flat_map(|(_, m)| m.clone()).collect();
    }

    /// Where writes of `kind` files report to: [`DiskReport::wrote`].
    pub fn disk(&self, kind: DiskFile) -> DiskReport {
        DiskReport {
            obs: self.clone(),
            kind,
        }
    }

    /// `/metrics`, in the OpenMetrics text format.
    pub fn metrics_text(&self) -> String {
        self.inner.metrics.encode()
    }

    /// A config reload (file change or SIGHUP) was applied.
    pub fn reload_succeeded(&self) {
        self.inner.metrics.reload_succeeded();
    }

    /// A config reload was refused; the old config keeps running.
    pub fn reload_failed(&self) {
        self.inner.metrics.reload_failed();
    }
}

/// Where the writer of one kind of file reports how its writes went: into `/readyz`,
/// `wdp_disk_write_failing` and `wdp_disk_write_failures_total`, and the log, once per change
/// of a file's state (a disk that stays full is logged once, not at every retry). Cheap to
/// clone.
#[derive(Clone)]
pub struct DiskReport {
    obs: Observability,
    kind: DiskFile,
}

impl std::fmt::Debug for DiskReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskReport")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl DiskReport {
    /// A report no `/readyz` reads, for a writer nothing observes (tests, tools): it still
    /// logs once per change.
    pub fn detached(kind: DiskFile) -> Self {
        Observability::new().disk(kind)
    }

    /// Nothing wants `path` written any more (its device type went away, its scanner stopped):
    /// whatever its last write did no longer matters.
    pub fn forget(&self, path: &Path) {
        let mut state = self.obs.state();
        if state
            .disk
            .remove(&(self.kind, path.to_path_buf()))
            .is_some()
        {
            tracing::info!(kind = self.kind.as_str(), path = %path.display(), "no longer written");
        }
        self.settle(&state);
    }

    fn settle(&self, state: &State) {
        let failing = state.disk.keys().any(|(k, _)| *k == self.kind);
        self.obs.inner.metrics.disk_failing(self.kind, failing);
    }
}

impl WriteReport for DiskReport {
    fn wrote(&self, path: &Path, error: Option<&dyn std::fmt::Display>) {
        let kind = self.kind.as_str();
        let mut state = self.obs.state();
        let key = (self.kind, path.to_path_buf());
        match error {
            None => {
                if state.disk.remove(&key).is_some() {
                    tracing::info!(kind, path = %path.display(), "written again");
                }
            }
            Some(error) => {
                self.obs.inner.metrics.disk_write_failed(self.kind);
                let error = error.to_string();
                if state.disk.get(&key) != Some(&error) {
                    if self.kind == DiskFile::CompileCache {
                        // Costs compile time at the next start, nothing else.
                        tracing::warn!(kind, path = %path.display(), %error, "cannot write; the previous file stays");
                    } else {
                        tracing::error!(kind, path = %path.display(), %error, "cannot write; the previous file stays");
                    }
                    state.disk.insert(key, error);
                }
            }
        }
        self.settle(&state);
    }
}

/// One scanner's view of the shared state. Cheap to clone.
#[derive(Clone)]
pub struct ScannerHandle {
    obs: Observability,
    name: Arc<str>,
    id: u64,
    metrics: Arc<ScannerMetrics>,
}

impl ScannerHandle {
    /// A handle to a state of its own, for a manager no `/status` reads (tests, tools).
    pub fn detached(name: &str) -> Self {
        Observability::new().add_scanner(name, Arc::default())
    }

    /// The scanner's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The scanner's metric series (those given to [`Observability::add_scanner`]).
    pub fn metrics(&self) -> Arc<ScannerMetrics> {
        self.metrics.clone()
    }

    /// Runs `f` on this scanner's entry, if it is still this scanner's.
    fn update(&self, f: impl FnOnce(&mut ScannerEntry)) {
        let mut state = self.obs.state();
        if let Some(entry) = state.scanners.get_mut(&self.name)
            && entry.id == self.id
        {
            f(entry);
        }
    }

    /// Records what the scanner's supervisor reported.
    pub fn event(&self, event: &ScannerEvent) {
        match event {
            ScannerEvent::Tree(_) => {
                self.metrics.accepted_now();
                self.update(|s| {
                    s.phase = Phase::Serving;
                    s.accepted = true;
                });
            }
            ScannerEvent::Refused(e) => self.update(|s| {
                s.phase = Phase::Refused;
                s.last_error = Some(e.to_string());
            }),
            ScannerEvent::Failed { error, restart_in } => self.update(|s| {
                s.phase = match restart_in {
                    Some(_) => Phase::Restarting,
                    None => Phase::Failed,
                };
                s.last_error = Some(error.clone());
            }),
            ScannerEvent::Finished => self.update(|s| s.phase = Phase::Finished),
        }
    }

    /// Starts tracking resource `name` (`<namespace>/<dev-type>`), served for this scanner: not
    /// registered, no devices.
    pub fn resource(&self, name: &str) -> ResourceHandle {
        self.track(name, ResourceMetrics::default(), false)
    }

    /// Starts tracking dev-type `name` (`<namespace>/<dev-type>`) served through this scanner's
    /// DRA driver: in `/status` and `wdp_resource_devices` as a device-plugin resource is, so
    /// both front-ends read alike; registered while the driver is.
    pub fn dra_resource(&self, name: &str) -> ResourceHandle {
        self.track(name, ResourceMetrics::dra(), true)
    }

    fn track(&self, name: &str, metrics: ResourceMetrics, dra: bool) -> ResourceHandle {
        let name: Arc<str> = name.into();
        self.obs.state().resources.insert(
            name.clone(),
            ResourceEntry {
                owner: self.id,
                metrics: metrics.clone(),
                registered: false,
                refused: None,
                healthy: 0,
                unhealthy: 0,
                dra,
            },
        );
        ResourceHandle {
            obs: self.obs.clone(),
            name,
            owner: self.id,
            metrics,
        }
    }

    /// The resources of the last tree that could not be served, with why; replaces the last list.
    pub fn unserved(&self, resources: BTreeMap<String, String>) {
        self.update(|s| s.unserved = resources);
    }

    /// Where the writes of this scanner's `kind` files report to.
    pub fn disk(&self, kind: DiskFile) -> DiskReport {
        self.obs.disk(kind)
    }

    /// Its DRA driver is usable by kubelet (`None`) or not, with why: what `/readyz` reports
    /// for a scanner served through DRA.
    pub fn dra_not_ready(&self, reason: Option<String>) {
        self.update(|s| s.dra_not_ready = reason);
    }

    /// Whether kubelet has its DRA driver `driver` registered: `wdp_dra_driver_registered`,
    /// and the `registered` of its dev-types in `/status`.
    pub fn dra_registered(&self, driver: &str, registered: bool) {
        self.metrics.dra_registered(driver, registered);
        self.update(|s| s.dra_driver = Some((driver.to_owned(), registered)));
    }

    /// Stops tracking this scanner: its entry, its resources and their metric series. Does
    /// nothing to a newer scanner of the same name; doing it twice is harmless.
    pub fn remove(&self) {
        let mut state = self.obs.state();
        if state
            .scanners
            .get(&self.name)
            .is_none_or(|s| s.id != self.id)
        {
            return;
        }
        state.scanners.remove(&self.name);
        state.resources.retain(|_, r| r.owner != self.id);
    }
}

/// One resource's view of the shared state. Cheap to clone.
#[derive(Clone)]
pub struct ResourceHandle {
    obs: Observability,
    name: Arc<str>,
    owner: u64,
    metrics: ResourceMetrics,
}

impl ResourceHandle {
    /// Runs `f` on this resource's entry, if it is still this scanner's.
    fn update(&self, f: impl FnOnce(&mut ResourceEntry)) {
        let mut state = self.obs.state();
        if let Some(entry) = state.resources.get_mut(&self.name)
            && entry.owner == self.owner
        {
            f(entry);
        }
    }

    /// The resource now lists `healthy` and `unhealthy` devices (counted as its list is
    /// encoded: one pass over the devices per update).
    pub fn devices(&self, healthy: usize, unhealthy: usize) {
        self.metrics.devices(healthy, unhealthy);
        self.update(|r| {
            r.healthy = healthy;
            r.unhealthy = unhealthy;
        });
    }

    /// A GetPreferredAllocation answered "no preference" because its hook failed.
    pub fn preferred_fallback(&self) {
        self.metrics.preferred_fallback();
    }

    /// The resource is no longer served: its entry and its metric series go.
    pub fn remove(&self) {
        let mut state = self.obs.state();
        if state
            .resources
            .get(&self.name)
            .is_some_and(|r| r.owner == self.owner)
        {
            state.resources.remove(&self.name);
        }
    }
}

/// What the resource's server sees: registration into `/status` and `/readyz`, lost streams and
/// Allocate calls into `/metrics`.
impl ServerReport for ResourceHandle {
    fn registered(&self, registered: bool) {
        self.update(|r| {
            r.registered = registered;
            if registered {
                r.refused = None;
            }
        });
    }

    fn registration_failed(&self, reason: &str) {
        self.metrics.registration_failed();
        self.update(|r| r.refused = Some(reason.to_owned()));
    }

    fn stream_lost(&self) {
        self.metrics.stream_lost();
    }

    fn allocated(&self, elapsed: Duration, ok: bool) {
        self.metrics.allocated(elapsed, ok);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::OutputError;

    #[test]
    fn a_dra_driver_kubelet_has_not_registered_keeps_the_host_not_ready() {
        let obs = Observability::new();
        let kvm = obs.add_scanner("kvm", Arc::default());
        obs.loaded();
        kvm.event(&ScannerEvent::Tree(Arc::default()));
        assert_eq!(obs.readiness(), Ok(()));
        kvm.dra_not_ready(Some(
            "DRA driver x.io: kubelet refused the registration: no".into(),
        ));
        assert_eq!(
            obs.readiness().unwrap_err(),
            ["scanner kvm: DRA driver x.io: kubelet refused the registration: no"]
        );
        kvm.dra_not_ready(None);
        assert_eq!(obs.readiness(), Ok(()));
        // Its dev-types: counted, registered with the driver, never a readiness line of their own.
        let r = kvm.dra_resource("x.io/kvm");
        r.devices(3, 1);
        assert_eq!(obs.readiness(), Ok(()));
        kvm.dra_registered("x.io", true);
        let shown = &obs.report().scanners[0].resources[0];
        assert_eq!(
            (shown.registered, shown.healthy, shown.unhealthy),
            (true, 3, 1)
        );
        assert_eq!(shown.dra_driver.as_deref(), Some("x.io"));
        let text = obs.metrics_text();
        assert!(
            text.contains("wdp_resource_devices{resource=\"x.io/kvm\",health=\"healthy\"} 3\n"),
            "{text}"
        );
        assert!(!text.contains("wdp_resource_allocations_total{resource=\"x.io/kvm\""));
        kvm.dra_not_ready(Some("pending".into()));
        kvm.remove();
        assert_eq!(obs.readiness(), Ok(()), "gone with its scanner");
    }

    #[test]
    fn ready_once_every_scanner_has_a_tree_and_every_resource_is_registered() {
        let obs = Observability::new();
        assert_eq!(
            obs.readiness().unwrap_err(),
            ["the host is still loading its config and components"]
        );
        let kvm = obs.add_scanner("kvm", Arc::default());
        let serial = obs.add_scanner("serial", Arc::default());
        obs.loaded();
        let reasons = obs.readiness().unwrap_err();
        assert_eq!(
            reasons,
            [
                "scanner kvm: no device tree yet",
                "scanner serial: no device tree yet"
            ]
        );
        kvm.event(&ScannerEvent::Tree(Arc::default()));
        let r = kvm.resource("ns/kvm");
        r.devices(2, 1);
        serial.event(&ScannerEvent::Refused(OutputError::DevType {
            value: "-".into(),
        }));
        let reasons = obs.readiness().unwrap_err();
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(reasons[0].starts_with("scanner serial: its tree was refused: "));
        assert_eq!(reasons[1], "resource ns/kvm: not registered with kubelet");
        // kubelet answers with an error: its reason, until a registration goes through.
        r.registration_failed("the ResourceName \"ns/kvm\" is invalid");
        assert_eq!(
            obs.readiness().unwrap_err()[1],
            "resource ns/kvm: not registered with kubelet: registration failed: the ResourceName \"ns/kvm\" is invalid"
        );
        assert!(
            obs.metrics_text()
                .contains("wdp_resource_registration_failures_total{resource=\"ns/kvm\"} 1\n")
        );
        r.registered(true);
        serial.event(&ScannerEvent::Tree(Arc::default()));
        assert_eq!(obs.readiness(), Ok(()));
        // A failure after a good tree keeps the last tree served: still ready.
        serial.event(&ScannerEvent::Failed {
            error: "trapped".into(),
            restart_in: Some(Duration::from_secs(1)),
        });
        assert_eq!(obs.readiness(), Ok(()));
        let report = obs.report();
        assert!(report.ready);
        let k = &report.scanners[0];
        assert_eq!((k.name.as_str(), k.state), ("kvm", Phase::Serving));
        assert_eq!((k.resources[0].healthy, k.resources[0].unhealthy), (2, 1));
        assert_eq!(report.scanners[1].state, Phase::Restarting);
        // kubelet goes away: not registered, and no refusal left from before.
        r.registered(false);
        assert_eq!(
            obs.readiness().unwrap_err(),
            ["resource ns/kvm: not registered with kubelet"]
        );
    }

    #[test]
    fn a_failing_write_is_a_reason_and_a_gauge_until_it_succeeds() {
        let obs = Observability::new();
        obs.loaded();
        let cdi = obs.disk(DiskFile::Cdi);
        let cache = obs.disk(DiskFile::CompileCache);
        let full = std::io::Error::from_raw_os_error(28);
        let path = Path::new("/var/run/cdi/wdp-x-y.json");
        cdi.wrote(path, Some(&full));
        cdi.wrote(path, Some(&full));
        cache.wrote(Path::new("/var/cache/wdp/a.cwasm"), Some(&full));
        assert_eq!(
            obs.readiness().unwrap_err(),
            [
                "CDI spec /var/run/cdi/wdp-x-y.json not written: No space left on device (os error 28) (the previous one stays; its new or changed devices are served without a CDI name until it is)"
            ],
            "the compile cache costs compile time only"
        );
        let text = obs.metrics_text();
        for want in [
            "wdp_disk_write_failing{kind=\"cdi\"} 1\n",
            "wdp_disk_write_failing{kind=\"compile-cache\"} 1\n",
            "wdp_disk_write_failing{kind=\"checkpoint\"} 0\n",
            "wdp_disk_write_failures_total{kind=\"cdi\"} 2\n",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        cdi.wrote(path, None);
        cache.forget(Path::new("/var/cache/wdp/a.cwasm"));
        assert_eq!(obs.readiness(), Ok(()));
        let text = obs.metrics_text();
        assert!(
            text.contains("wdp_disk_write_failing{kind=\"cdi\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("wdp_disk_write_failures_total{kind=\"cdi\"} 2\n"));
    }

    #[test]
    fn a_replaced_scanner_never_touches_its_successor() {
        let obs = Observability::new();
        obs.loaded();
        let old = obs.add_scanner("kvm", Arc::default());
        let old_r = old.resource("ns/kvm");
        let new = obs.add_scanner("kvm", Arc::default());
        let new_r = new.resource("ns/kvm");
        new_r.registered(true);
        old_r.registered(false);
        old_r.remove();
        old.remove();
        new.event(&ScannerEvent::Tree(Arc::default()));
        assert_eq!(obs.readiness(), Ok(()));
        assert!(obs.metrics_text().contains("resource=\"ns/kvm\""));
        new.remove();
        assert!(obs.report().scanners.is_empty());
        assert!(!obs.metrics_text().contains("ns/kvm"));
    }
}
