//! One manager per configured scanner: from device trees to resource servers.
//!
//! The manager consumes its scanner's events and keeps one [`ResourceServer`] (wdp-kubelet's
//! server, answering through a [`ServedResource`]) per dev-type of the latest good tree, as
//! Intel's Notifier does: types added since the last tree get a new server, changed types get
//! the new device list, removed types are stopped. Applying a tree never waits
//! on kubelet (servers take updates through a `watch` channel), so a slow kubelet never holds up
//! a scanner. Resource names are claimed host-wide: two scanners serving the same
//! `<namespace>/<dev-type>` is refused with an error naming both.

use std::borrow::Borrow;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::cdi::{CdiConfig, CdiWriter, SpecOwnership};
use crate::config::DraConfig;
use crate::dra::DraDriver;
use crate::hooks::Hooks;
use crate::metrics::DiskFile;
use crate::sandbox::Roots;
use crate::scanner::ScannerEvent;
use crate::server::{ResourceServer, ServedResource};
use crate::status::ScannerHandle;
use crate::tree::{DeviceGroup, DeviceTree};
use wdp_kubelet::names::Resource;
use wdp_kubelet::server::PluginSockets;

/// Which dev-types changed between two trees (sorted, each type in at most one list).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TreeDiff {
    /// Device ids that appeared.
    pub added: Vec<String>,
    /// Device ids whose information changed.
    pub updated: Vec<String>,
    /// Device ids that went away.
    pub removed: Vec<String>,
}

impl TreeDiff {
    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.updated.is_empty() && self.removed.is_empty()
    }
}

/// Compares `old` and `new` at dev-type granularity; one changed device makes its type updated.
pub(crate) fn diff(old: &BTreeMap<String, impl Borrow<DeviceGroup>>, new: &DeviceTree) -> TreeDiff {
    let mut d = TreeDiff::default();
    for (dev_type, devices) in &new.0 {
        match old.get(dev_type) {
            None => d.added.push(dev_type.clone()),
            Some(before) if before.borrow() != devices => d.updated.push(dev_type.clone()),
            Some(_) => {}
        }
    }
    d.removed = old
        .keys()
        .filter(|t| !new.0.contains_key(*t))
        .cloned()
        .collect();
    d
}

/// Host-wide ownership of what a resource occupies on disk.
///
/// A resource `<namespace>/<dev-type>` is served on the socket `<namespace>-<dev-type>.sock` and
/// described by the CDI spec `wdp-<namespace>-<dev-type>.*`, so two distinct names can meet in
/// one file: `a.example/x-y` and `a.example-x/y` (a namespace may hold '-', a dev-type too).
/// Claims are therefore keyed by that joined name, and the first scanner to claim it keeps it;
/// the second is refused with both resource names rather than both servers unlinking and
/// binding each other's socket.
#[derive(Debug, Default)]
pub struct Claims {
    /// Joined name -> (scanner, resource name).
    owners: Mutex<HashMap<String, (Arc<str>, String)>>,
}

/// Why a claim was refused: who holds the joined name, under which resource name.
#[derive(Debug, PartialEq, Eq)]
struct Held {
    scanner: Arc<str>,
    resource: String,
}

/// The name a resource's socket and CDI spec are derived from.
fn joined(namespace: &str, dev_type: &str) -> String {
    format!("{namespace}-{dev_type}")
}

impl Claims {
    /// Claims `namespace/dev_type` for `scanner`; `Err` names who holds its joined name.
    fn claim(&self, namespace: &str, dev_type: &str, scanner: &Arc<str>) -> Result<(), Held> {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        let resource = format!("{namespace}/{dev_type}");
        match owners.entry(joined(namespace, dev_type)) {
            Entry::Occupied(held) if held.get().0 != *scanner || held.get().1 != resource => {
                let (scanner, resource) = held.get().clone();
                Err(Held { scanner, resource })
            }
            Entry::Occupied(_) => Ok(()),
            Entry::Vacant(free) => {
                free.insert((scanner.clone(), resource));
                Ok(())
            }
        }
    }

    /// Whether `scanner` holds `namespace/dev_type` or may claim it.
    fn available(&self, namespace: &str, dev_type: &str, scanner: &Arc<str>) -> bool {
        let owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        owners
            .get(&joined(namespace, dev_type))
            .is_none_or(|(owner, held)| {
                owner == scanner && *held == format!("{namespace}/{dev_type}")
            })
    }

    fn release(&self, namespace: &str, dev_type: &str, scanner: &Arc<str>) {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        let key = joined(namespace, dev_type);
        if owners.get(&key).is_some_and(|(owner, _)| owner == scanner) {
            owners.remove(&key);
        }
    }
}

/// The first retry of a CDI spec whose write failed (a full or read-only disk); each next one
/// waits twice as long, up to [`CDI_RETRY_MAX`]. A new tree retries at once.
const CDI_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(500);
/// The longest wait between two retries of a CDI spec.
const CDI_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// What a manager needs to serve a scanner's resources.
pub struct Manager {
    scanner: Arc<str>,
    namespace: String,
    kubelet: Arc<PluginSockets>,
    hooks: Option<Arc<Hooks>>,
    claims: Arc<Claims>,
    /// Spec files for the container runtime, when the scanner has `cdi:`.
    cdi: Option<CdiWriter>,
    /// The last tree applied (types refused for a name clash are left out), each group shared
    /// with its server rather than copied (a 10,000-device group costs 2 ms to clone).
    current: BTreeMap<String, Arc<DeviceGroup>>,
    servers: BTreeMap<String, ResourceServer>,
    /// Where `/status`, `/readyz` and `/metrics` learn what this scanner serves.
    status: ScannerHandle,
    /// Served through DRA instead of device-plugin servers: the config until [`Manager::run`]
    /// starts the driver, then the driver.
    dra: Dra,
}

/// A manager's DRA front-end, if it has one.
enum Dra {
    None,
    Configured(DraConfig, Roots),
    Running(DraDriver),
    /// Configured, but it could not start (logged and on /readyz): nothing is served.
    Failed,
}

impl Manager {
    /// A manager for `scanner`, serving under `namespace`.
    pub fn new(
        scanner: Arc<str>,
        namespace: String,
        kubelet: Arc<PluginSockets>,
        hooks: Option<Arc<Hooks>>,
        claims: Arc<Claims>,
    ) -> Self {
        Manager {
            status: ScannerHandle::detached(&scanner),
            scanner,
            namespace,
            kubelet,
            hooks,
            claims,
            cdi: None,
            current: BTreeMap::new(),
            servers: BTreeMap::new(),
            dra: Dra::None,
        }
    }

    /// Serves this scanner's trees through the DRA driver of `config` instead of device-plugin
    /// servers; it needs [`Manager::with_cdi`] too (the config refuses DRA without CDI). The
    /// PCI placement of device nodes is read below `roots`, the ones the guest sees.
    pub fn with_dra(mut self, config: DraConfig, roots: Roots) -> Self {
        self.dra = Dra::Configured(config, roots);
        self
    }

    /// Keeps CDI spec files for this scanner's resources and serves their CDI names; the
    /// host-wide `ownership` decides when a file this scanner no longer writes is removed.
    pub fn with_cdi(mut self, config: CdiConfig, ownership: Arc<SpecOwnership>) -> Self {
        let mut cdi = CdiWriter::new(config, &self.namespace, self.scanner.clone(), ownership);
        cdi.report_to(self.status.disk(DiskFile::Cdi));
        self.cdi = Some(cdi);
        self
    }

    /// Reports this scanner and its resources through `status` (from
    /// [`crate::status::Observability::add_scanner`]) instead of a state nobody reads.
    pub fn with_status(mut self, status: ScannerHandle) -> Self {
        if let Some(cdi) = &mut self.cdi {
            cdi.report_to(status.disk(DiskFile::Cdi));
        }
        self.status = status;
        self
    }

    /// Applies events until the scanner's channel closes, then stops every server and removes
    /// the scanner from the shared status.
    ///
    /// `queue` is the sending side of `events`, held weakly (the channel still closes when the
    /// supervisor goes): while a tree is applied, the manager holds a place in it. The
    /// supervisor validates a scanner's next tree only once every place is free
    /// ([`crate::scanner`]), so a validated tree never waits beside the one being applied: the
    /// host holds at most two validated forms of a scanner's tree, the one served and the one
    /// replacing it.
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<ScannerEvent>,
        queue: mpsc::WeakSender<ScannerEvent>,
    ) {
        if let Dra::Configured(config, roots) = &self.dra {
            self.dra = match DraDriver::start(config, roots, &self.namespace, self.status.clone()) {
                Ok(driver) => Dra::Running(driver),
                Err(e) => {
                    tracing::error!(scanner = &*self.scanner, error = %e, "not served");
                    self.status.dra_not_ready(Some(e.to_string()));
                    Dra::Failed
                }
            };
        }
        let mut backoff = CDI_RETRY_FIRST;
        loop {
            let failing = self.cdi.as_ref().is_some_and(CdiWriter::failing);
            if !failing {
                backoff = CDI_RETRY_FIRST;
            }
            let event = tokio::select! {
                event = events.recv() => event,
                () = tokio::time::sleep(backoff), if failing => {
                    self.retry_cdi();
                    backoff = (backoff * 2).min(CDI_RETRY_MAX);
                    continue;
                }
            };
            let Some(event) = event else {
                break;
            };
            // Released when the event is done with; none when the supervisor is gone.
            let _applying = queue.upgrade().and_then(|tx| tx.try_reserve_owned().ok());
            self.status.event(&event);
            match event {
                ScannerEvent::Tree(tree) => {
                    // Nobody else holds the tree by now: its changed groups are moved, not copied.
                    self.apply(Arc::unwrap_or_clone(tree));
                }
                ScannerEvent::Refused(_) | ScannerEvent::Failed { .. } | ScannerEvent::Finished => {
                    // Logged where they happen; the last good tree stays served.
                }
            }
        }
        self.stop_all().await;
        self.status.remove();
    }

    /// Writes again the CDI specs whose last write failed (a full or read-only disk); once one is
    /// on disk, its devices are served again with their CDI names, without waiting for the
    /// scanner's next tree (which may never come: nothing changed on the node).
    pub fn retry_cdi(&mut self) {
        let Some(cdi) = &mut self.cdi else {
            return;
        };
        if !cdi.retry() {
            return;
        }
        let served = DeviceTree(
            self.current
                .iter()
                .map(|(t, g)| (t.clone(), DeviceGroup::clone(g)))
                .collect(),
        );
        let tree = cdi.names(served);
        self.serve(tree);
    }

    /// The dev-types currently served.
    pub fn served(&self) -> Vec<String> {
        self.servers.keys().cloned().collect()
    }

    /// Brings the servers in line with `tree`. Never waits. CDI specs are written first, so no
    /// device is served before the spec that describes it exists; only for the types this
    /// scanner may serve, so a type another scanner holds never overwrites that one's spec. The
    /// tree is taken apart: each changed group is moved into the servers' shared copy, not
    /// copied (a 10,000-device group costs 1.5 ms to clone).
    pub fn apply(&mut self, tree: DeviceTree) -> TreeDiff {
        let tree = match &mut self.cdi {
            Some(cdi) => {
                let held = |t: &String| self.claims.available(&self.namespace, t, &self.scanner);
                if tree.0.keys().all(held) {
                    cdi.sync(tree)
                } else {
                    let (mine, others): (BTreeMap<_, _>, BTreeMap<_, _>) =
                        tree.0.into_iter().partition(|(t, _)| held(t));
                    let mut served = cdi.sync(DeviceTree(mine));
                    // The others go on to be refused by name below, as without CDI.
                    served.0.extend(others);
                    served
                }
            }
            None => tree,
        };
        self.serve(tree)
    }

    /// Brings the servers (or the DRA driver) in line with `tree`, whose CDI names are filled
    /// in.
    fn serve(&mut self, mut tree: DeviceTree) -> TreeDiff {
        let d = diff(&self.current, &tree);
        // A DRA scanner has no device-plugin servers, whether its driver runs or not.
        if !matches!(self.dra, Dra::None) {
            if let Dra::Running(driver) = &mut self.dra {
                let unwritten = self
                    .cdi
                    .as_ref()
                    .map(CdiWriter::unwritten)
                    .unwrap_or_default();
                driver.update(&tree, &unwritten);
            }
            self.current = tree.0.into_iter().map(|(t, g)| (t, Arc::new(g))).collect();
            return d;
        }
        for dev_type in &d.removed {
            self.current.remove(dev_type);
            if let Some(server) = self.servers.remove(dev_type) {
                self.claims
                    .release(&self.namespace, &server.resource().dev_type, &self.scanner);
                tracing::info!(scanner = &*self.scanner, resource = %server.resource().name, "device type removed");
                server.plugin().status().remove();
                // Dropping cancels it; its task removes the socket on its own.
                drop(server);
            }
        }
        for dev_type in &d.updated {
            let devices = Arc::new(tree.0.remove(dev_type).unwrap_or_default());
            if let Some(server) = self.servers.get(dev_type) {
                server.update(devices.clone());
            }
            self.current.insert(dev_type.clone(), devices);
        }
        let mut unserved = BTreeMap::new();
        for dev_type in &d.added {
            let devices = Arc::new(tree.0.remove(dev_type).unwrap_or_default());
            // Never registered before its first device: kubelet would put the name on the Node
            // at capacity 0 (which also keeps DRA's extended-resource bridge off that name). Left
            // out of `current`, so the tree that brings one starts it; served ever after.
            if devices.is_empty() {
                continue;
            }
            match self.start(dev_type, devices.clone()) {
                Ok(server) => {
                    self.servers.insert(dev_type.clone(), server);
                    self.current.insert(dev_type.clone(), devices);
                }
                Err(e) => {
                    // Left out of `current`, so the next tree tries again.
                    tracing::error!(scanner = &*self.scanner, dev_type, error = %e, "device type not served");
                    unserved.insert(format!("{}/{dev_type}", self.namespace), e);
                }
            }
        }
        self.status.unserved(unserved);
        d
    }

    fn start(&self, dev_type: &str, devices: Arc<DeviceGroup>) -> Result<ResourceServer, String> {
        let resource = Resource::new(&self.namespace, dev_type, self.kubelet.dir.path())
            .map_err(|e| e.to_string())?;
        self.claims
            .claim(&self.namespace, dev_type, &self.scanner)
            .map_err(|held| {
                if held.resource == resource.name {
                    format!(
                        "resource {} is already served by scanner {:?}; give one of them another namespace",
                        resource.name, held.scanner
                    )
                } else {
                    format!(
                        "resource {} would share the socket {} (and CDI spec name) of resource {}, served by scanner {:?}: kubelet names both files <namespace>-<dev-type>; give one of them another namespace",
                        resource.name, resource.endpoint, held.resource, held.scanner
                    )
                }
            })?;
        tracing::info!(scanner = &*self.scanner, resource = %resource.name, devices = devices.len(), "serving new device type");
        let status = self.status.resource(&resource.name);
        let served = ServedResource::new(resource.clone(), self.hooks.clone(), status.clone());
        Ok(ResourceServer::start(
            self.kubelet.clone(),
            resource,
            devices,
            served,
            status,
        ))
    }

    /// Stops every server and waits until their sockets are gone.
    pub async fn stop_all(&mut self) {
        let servers = std::mem::take(&mut self.servers);
        for (_, server) in servers {
            self.claims
                .release(&self.namespace, &server.resource().dev_type, &self.scanner);
            let status = server.plugin().status().clone();
            server.stop().await;
            status.remove();
        }
        // The specs stay: kubelet replays their names on every container restart, even while
        // no wdp runs. The host-wide ownership removes them if nothing configured serves them.
        if let Some(cdi) = &mut self.cdi {
            cdi.leave();
        }
        if let Dra::Running(driver) = std::mem::replace(&mut self.dra, Dra::None) {
            driver.stop().await;
        }
        self.current.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::DeviceInfo;

    fn tree(types: &[(&str, &[&str])]) -> DeviceTree {
        DeviceTree(
            types
                .iter()
                .map(|(t, ids)| {
                    let group = ids
                        .iter()
                        .map(|id| (id.to_string(), DeviceInfo::default()))
                        .collect();
                    (t.to_string(), group)
                })
                .collect(),
        )
    }

    #[test]
    fn diffs_by_type() {
        let old = tree(&[("a", &["1"]), ("b", &["1"]), ("c", &["1"])]);
        let new = tree(&[("a", &["1"]), ("b", &["1", "2"]), ("d", &["1"])]);
        let d = diff(&old.0, &new);
        assert_eq!(d.added, ["d"]);
        assert_eq!(d.updated, ["b"]);
        assert_eq!(d.removed, ["c"]);
        assert!(diff(&new.0, &new).is_empty());
        assert_eq!(
            diff(&new.0, &DeviceTree::default()).removed,
            ["a", "b", "d"]
        );
    }

    #[test]
    fn claims_are_exclusive() {
        let claims = Claims::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        claims.claim("ns", "x", &a).unwrap();
        claims.claim("ns", "x", &a).unwrap();
        assert_eq!(claims.claim("ns", "x", &b).unwrap_err().scanner, a);
        claims.release("ns", "x", &b);
        assert!(claims.claim("ns", "x", &b).is_err());
        claims.release("ns", "x", &a);
        claims.claim("ns", "x", &b).unwrap();
    }

    #[test]
    fn names_that_share_a_socket_are_exclusive() {
        // a.example/x-y and a.example-x/y: distinct resources, one socket file
        // (a.example-x-y.sock) and one CDI spec name.
        let claims = Claims::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        claims.claim("a.example", "x-y", &a).unwrap();
        assert!(!claims.available("a.example-x", "y", &b));
        let held = claims.claim("a.example-x", "y", &b).unwrap_err();
        assert_eq!(
            held,
            Held {
                scanner: a.clone(),
                resource: "a.example/x-y".into()
            }
        );
        assert!(claims.available("a.example", "x-y", &a));
        claims.release("a.example", "x-y", &a);
        claims.claim("a.example-x", "y", &b).unwrap();
    }
}
