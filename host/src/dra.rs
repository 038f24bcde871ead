//! The DRA front-end: a scanner configured with `frontend: dra` is served through kubelet's
//! Dynamic Resource Allocation API instead of device-plugin servers.
//!
//! It sits on the data path beside [`crate::server`]: the scanner's manager hands it every tree
//! it accepts, after writing the CDI specs (CDI is mandatory in DRA mode: a prepared claim gives
//! the runtime CDI names and nothing else). A [`DraDriver`] turns each tree into the driver's
//! [`Inventory`] (one pool, named after the node) and runs, until it is stopped, the parts of
//! `wdp_dra`: the registration socket kubelet's plugin watcher finds, the DRA socket (DRAPlugin
//! v1 and v1beta1, and the health stream), and the ResourceSlice publisher, which runs only while
//! kubelet has the driver registered (`Kubelet` below says why). kubelet's answer to the
//! registration, or its silence, is reported to `/readyz` through the scanner's status, to the
//! log and to `/metrics`.
//!
//! Stopping removes both sockets; the CDI specs and the prepared-claims checkpoint stay, so
//! containers kubelet restarts meanwhile still resolve their devices and a restarted wdp answers
//! a repeated Prepare as the first one.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use wdp_dra::apiserver::client::ApiClient;
use wdp_dra::checkpoint::Checkpoint;
use wdp_dra::plugin::DraService;
use wdp_dra::registration::{Endpoints, Registrar, RegistrationState, RegistrationStatusHandle};
use wdp_dra::seam::{AttributeValue, Device, Inventory, Pool};

use crate::atomic_file::WriteReport;
use crate::config::{ApiServer, DraConfig};
use crate::hostfs::sys::{SysDir, SysReads};
use crate::hostfs::{DevFs, NodeKind};
use crate::metrics::DiskFile;
use crate::sandbox::Roots;
use crate::status::{ResourceHandle, ScannerHandle};
use crate::tree::{AttributeValue as TreeAttributeValue, DeviceTree, Health};

/// How often a removed socket is noticed and bound again.
const SOCKET_CHECK: Duration = Duration::from_secs(1);
/// How often the health stream repeats the whole list (kubelet marks devices it hears nothing
/// about as unknown).
const HEALTH_REFRESH: Duration = Duration::from_secs(10);

/// Why a DRA driver could not start.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    /// The API server configuration (in-cluster or a kubeconfig) is missing or unusable.
    #[error("DRA driver {driver}: the API server: {source}")]
    Api {
        /// The driver.
        driver: String,
        /// What the client said.
        source: wdp_dra::apiserver::ApiError,
    },
    /// The prepared-claims checkpoint could not be read.
    #[error("DRA driver {driver}: {source}")]
    Checkpoint {
        /// The driver.
        driver: String,
        /// What reading it said.
        source: wdp_dra::checkpoint::CheckpointError,
    },
}

/// One running DRA driver: its inventory channel and the tasks serving it.
pub struct DraDriver {
    driver: String,
    node_name: String,
    inventory: watch::Sender<Inventory>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// Where the device nodes sit on the PCI bus, when the roots can be read.
    pci: Option<PciPlacement>,
    /// The scanner's namespace: each dev-type shows in `/status` and `/metrics` as
    /// `<namespace>/<dev-type>`, as a device-plugin resource does.
    namespace: String,
    status: ScannerHandle,
    /// Each dev-type of the last tree, in `/status` and `wdp_resource_devices`.
    resources: BTreeMap<String, ResourceHandle>,
    /// The prepared-claims checkpoint: a failed write of it no longer matters once stopped.
    checkpoint: PathBuf,
}

impl DraDriver {
    /// Starts serving `config`'s driver with an empty inventory; kubelet's registration answers
    /// go to `status` (not ready until kubelet registered it), and so do the devices of each
    /// dev-type, named `<namespace>/<dev-type>`.
    pub fn start(
        config: &DraConfig,
        roots: &Roots,
        namespace: &str,
        status: ScannerHandle,
    ) -> Result<Self, DraError> {
        let driver = config.driver.clone();
        let api = match config.api_server {
            ApiServer::InCluster => ApiClient::in_cluster().map_err(|source| DraError::Api {
                driver: driver.clone(),
                source,
            })?,
            ApiServer::Http(addr) => ApiClient::http(addr),
            ApiServer::Kubeconfig(ref file) => ApiClient::from_kubeconfig(file.as_deref())
                .map_err(|source| DraError::Api {
                    driver: driver.clone(),
                    source,
                })?,
        };
        let endpoints = Endpoints {
            driver: driver.clone(),
            plugins_registry: config.plugins_registry_dir.clone(),
            plugins: config.plugins_dir.clone(),
            health: true,
        };
        let checkpoint =
            Checkpoint::open(checkpoint_path(config)).map_err(|source| DraError::Checkpoint {
                driver: driver.clone(),
                source,
            })?;
        let (inventory, updates) = watch::channel(Inventory::default());
        let (stop, stopped) = watch::channel(false);
        let shutdown = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            }
        };
        let service = DraService::new(
            driver.clone(),
            api.clone(),
            updates.clone(),
            checkpoint,
            HEALTH_REFRESH,
        );
        let disk = status.disk(DiskFile::Checkpoint);
        service.report_checkpoint_to(Box::new(
            move |path: &std::path::Path, error: Option<&wdp_dra::checkpoint::CheckpointError>| {
                // The OS error alone: the report names the file.
                let error = error.map(|e| match e {
                    wdp_dra::checkpoint::CheckpointError::Io { source, .. } => {
                        source as &dyn std::fmt::Display
                    }
                    other => other as &dyn std::fmt::Display,
                });
                disk.wrote(path, error);
            },
        ));
        let registration = RegistrationStatusHandle::default();
        let mut tasks = Vec::new();
        let socket = endpoints.dra_socket();
        let routes = service.routes(&endpoints);
        let name = driver.clone();
        tasks.push(tokio::spawn({
            let shutdown = shutdown();
            async move {
                if let Err(e) =
                    wdp_dra::socket::serve(socket, routes, SOCKET_CHECK, shutdown, || {}).await
                {
                    tracing::error!(driver = %name, error = %e, "DRA socket not served");
                }
            }
        }));
        let socket = endpoints.registration_socket();
        let routes = tonic::service::Routes::new(
            Registrar::new(&endpoints, registration.clone()).into_service(),
        );
        let name = driver.clone();
        let rebound = registration.clone();
        tasks.push(tokio::spawn({
            let shutdown = shutdown();
            async move {
                // A socket bound again is a registration kubelet has not answered yet.
                let on_bind = move || rebound.set(RegistrationState::Pending);
                if let Err(e) =
                    wdp_dra::socket::serve(socket, routes, SOCKET_CHECK, shutdown, on_bind).await
                {
                    tracing::error!(driver = %name, error = %e, "DRA registration socket not served");
                }
            }
        }));
        let kubelet = Kubelet {
            driver: driver.clone(),
            node: config.node_name.clone(),
            socket: endpoints.registration_socket(),
            registration,
            status: status.clone(),
            api,
            updates,
            inventory: inventory.clone(),
        };
        tasks.push(tokio::spawn(kubelet.follow(shutdown())));
        tracing::info!(driver = %driver, registration = %endpoints.registration_socket().display(), dra = %endpoints.dra_socket().display(), "serving through DRA");
        let pci = match PciPlacement::new(roots) {
            Ok(pci) => Some(pci),
            Err(e) => {
                tracing::warn!(driver = %driver, dev = %roots.dev.display(), error = %e, "no PCI placement in the slices");
                None
            }
        };
        Ok(DraDriver {
            driver,
            node_name: config.node_name.clone(),
            inventory,
            stop,
            tasks,
            pci,
            namespace: namespace.to_owned(),
            status,
            resources: BTreeMap::new(),
            checkpoint: checkpoint_path(config),
        })
    }

    /// The driver's name.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// Serves `tree` (its CDI names already filled in by the manager) as the driver's pool, and
    /// shows its dev-types' devices in `/status` and `/metrics`. `unwritten` holds, by dev-type,
    /// the devices whose CDI spec could not be written and why ([`crate::cdi::CdiWriter::unwritten`]):
    /// they stay published (the disk is a passing fault), but a claim holding one is refused
    /// until the spec is on disk, rather than prepared with no CDI name for the runtime.
    pub fn update(&mut self, tree: &DeviceTree, unwritten: &BTreeMap<&str, (String, Vec<&str>)>) {
        self.resources.retain(|dev_type, handle| {
            let kept = tree.0.contains_key(dev_type);
            if !kept {
                handle.remove();
            }
            kept
        });
        for (dev_type, group) in &tree.0 {
            let healthy = group
                .values()
                .filter(|d| d.health == Health::Healthy)
                .count();
            self.resources
                .entry(dev_type.clone())
                .or_insert_with(|| {
                    self.status
                        .dra_resource(&format!("{}/{dev_type}", self.namespace))
                })
                .devices(healthy, group.len() - healthy);
        }
        let mut pool = pool(&self.node_name, tree);
        // `pool` lists the tree's devices in the tree's order.
        let ids = tree
            .0
            .iter()
            .flat_map(|(t, g)| g.keys().map(move |id| (t.as_str(), id.as_str())));
        for (device, (dev_type, id)) in pool.devices.iter_mut().zip(ids) {
            if let Some((why, ids)) = unwritten.get(dev_type)
                && ids.contains(&id)
            {
                device.unavailable = Some(why.clone());
            }
        }
        if let Some(pci) = &self.pci {
            pci.fill(&mut pool, tree);
        }
        let pools = vec![pool];
        self.inventory.send_if_modified(|inventory| {
            if inventory.pools == pools {
                return false;
            }
            inventory.pools = pools;
            true
        });
    }

    /// Stops every task and waits for them: both sockets are removed, the slices stay until
    /// kubelet (or the next wdp) cleans them, the checkpoint stays for the next run.
    pub async fn stop(self) {
        for handle in self.resources.values() {
            handle.remove();
        }
        self.stop.send_replace(true);
        for task in self.tasks {
            if let Err(e) = task.await {
                tracing::error!(driver = %self.driver, error = %e, "DRA task failed");
            }
        }
        // Stopped: nothing writes it any more.
        self.status
            .disk(DiskFile::Checkpoint)
            .forget(&self.checkpoint);
    }
}

/// `<plugins>/<driver>/checkpoint.json`: beside the DRA socket, in kubelet's directory for
/// the driver, so it survives wdp's restarts and goes with the node.
fn checkpoint_path(config: &DraConfig) -> PathBuf {
    config
        .plugins_dir
        .join(&config.driver)
        .join("checkpoint.json")
}

/// The pool of `tree` on `node`. Device ids are the scanner's; an id that more than one
/// dev-type of the tree uses is served as `<dev-type>-<id>`, since names in a pool are unique.
pub fn pool(node: &str, tree: &DeviceTree) -> Pool {
    let mut uses: BTreeMap<&str, usize> = BTreeMap::new();
    for group in tree.0.values() {
        for id in group.keys() {
            *uses.entry(id.as_str()).or_default() += 1;
        }
    }
    let mut devices = Vec::new();
    for (dev_type, group) in &tree.0 {
        for (id, info) in group {
            let healthy = info.health == Health::Healthy;
            devices.push(Device {
                id: if uses[id.as_str()] > 1 {
                    format!("{dev_type}-{id}")
                } else {
                    id.clone()
                },
                dev_type: dev_type.clone(),
                healthy,
                health_message: if healthy {
                    String::new()
                } else {
                    "the scanner reports it unhealthy".into()
                },
                // The attribute is one node: a device spanning several has none.
                numa_node: match info.numa_nodes.as_deref() {
                    Some([node]) => Some(i64::from(*node)),
                    _ => None,
                },
                cdi_device_ids: info.cdi_devices.clone(),
                // What the guest gave through `notify-with-attributes`, already validated with
                // the API's rules when the tree was.
                attributes: info
                    .attributes
                    .attributes
                    .iter()
                    .map(|(name, value)| (name.clone(), dra_value(value)))
                    .collect(),
                capacity: info
                    .attributes
                    .capacities
                    .iter()
                    .map(|(name, quantity)| (name.clone(), quantity.clone()))
                    .collect(),
                ..Device::default()
            });
        }
    }
    Pool {
        name: node.to_string(),
        node_name: node.to_string(),
        devices,
    }
}

/// A validated guest attribute as the DRA front-end's.
fn dra_value(value: &TreeAttributeValue) -> AttributeValue {
    match value {
        TreeAttributeValue::Bool(b) => AttributeValue::Bool(*b),
        TreeAttributeValue::Int(i) => AttributeValue::Int(*i),
        TreeAttributeValue::String(s) => AttributeValue::String(s.clone()),
        TreeAttributeValue::Version(v) => AttributeValue::Version(v.clone()),
    }
}

/// Where sysfs puts device nodes on the PCI bus: the `resource.kubernetes.io/pciBusID` and
/// `pcieRoot` attributes the scheduler aligns devices of different drivers with.
pub struct PciPlacement {
    dev: DevFs,
    sys: SysDir,
}

impl PciPlacement {
    /// Placement read from the host's roots (the ones guests see).
    pub fn new(roots: &Roots) -> std::io::Result<Self> {
        Ok(PciPlacement {
            dev: DevFs::open(&roots.dev)?,
            sys: SysDir::new(&roots.sys),
        })
    }

    /// The PCI function (`0000:3b:00.0`) and root complex (`pci0000:3a`) of the device node at
    /// `path` (under /dev): from `<sys>/dev/{char,block}/MAJ:MIN`, the last PCI address and the
    /// first root in the resolved path below `<sys>/devices`. None for a node off the PCI bus.
    pub fn of_node(&self, path: &str) -> Option<(String, String)> {
        let node = self.dev.stat_following(path).ok()?;
        let class = match node.kind {
            NodeKind::CharDevice => "char",
            NodeKind::BlockDevice => "block",
            _ => return None,
        };
        if node.major == 0 {
            return None;
        }
        let link = self
            .sys
            .root()
            .join("dev")
            .join(class)
            .join(format!("{}:{}", node.major, node.minor));
        let device = self.sys.canonicalize(&link).ok()?;
        let below = device.strip_prefix(self.sys.root().join("devices")).ok()?;
        let parts: Vec<&str> = below.iter().filter_map(|c| c.to_str()).collect();
        let root = parts.first().filter(|r| is_pci_root(r))?;
        let function = parts.iter().rev().find(|p| is_pci_address(p))?;
        Some((function.to_string(), root.to_string()))
    }

    /// Sets the PCI placement of every device of `pool` whose first device node in `tree` has
    /// one. Nodes many devices share (slot devices) are looked up once.
    fn fill(&self, pool: &mut Pool, tree: &DeviceTree) {
        let mut known: BTreeMap<&str, Option<(String, String)>> = BTreeMap::new();
        let firsts = tree
            .0
            .values()
            .flat_map(|g| g.values())
            .map(|info| info.nodes.first().map(|n| n.host_path.as_str()));
        // `pool` lists the devices in the tree's order (see `pool`).
        for (device, node) in pool.devices.iter_mut().zip(firsts) {
            let Some(node) = node else { continue };
            let placement = known.entry(node).or_insert_with(|| self.of_node(node));
            if let Some((bus_id, root)) = placement {
                device.pci_bus_id = Some(bus_id.clone());
                device.pcie_root = Some(root.clone());
            }
        }
    }
}

/// `pci0000:3a`: a PCI root bus as sysfs names it (domain and bus in hex).
fn is_pci_root(s: &str) -> bool {
    s.strip_prefix("pci").is_some_and(|rest| {
        let b = rest.as_bytes();
        b.len() == 7 && b[4] == b':' && hex(&b[..4]) && hex(&b[5..])
    })
}

/// `0000:3b:00.0`: a PCI function address (domain, bus, device, function in hex).
fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(&b[..4])
        && hex(&b[5..7])
        && hex(&b[8..10])
        && hex(&b[11..])
}

fn hex(b: &[u8]) -> bool {
    b.iter().all(u8::is_ascii_hexdigit)
}

/// How long kubelet may stay silent after the registration socket is bound (no GetInfo, or
/// no verdict after it) before that is warned about and shown on `/readyz`. kubelet's plugin
/// watcher sees a new socket through inotify (or its start-up scan) and registers it within
/// about a second.
const KUBELET_SILENCE: Duration = Duration::from_secs(10);

/// What follows kubelet's word on the driver: `/readyz`, the metric, the warnings, and whether
/// the driver's ResourceSlices are published.
///
/// Slices are published only while kubelet has the driver registered. The scheduler allocates
/// from any published slice, whoever published it, and kubelet prepares claims only for drivers
/// it registered; kubelet also deletes only the slices of drivers it registered (when one is gone
/// for 30 s, and all of its node's when it starts). So a slice published before kubelet
/// registered the driver offers devices no pod can get, and nothing would ever take it back.
/// Hence: nothing is published before the first registration; publishing pauses when the
/// registration socket is bound again (kubelet deregistered the driver, and its own wipe covers
/// what was published); a refusal withdraws the driver's slices on the node, since kubelet will
/// neither prepare nor delete them.
struct Kubelet {
    driver: String,
    node: String,
    /// The registration socket, for the warnings.
    socket: PathBuf,
    registration: RegistrationStatusHandle,
    status: ScannerHandle,
    api: ApiClient,
    updates: watch::Receiver<Inventory>,
    inventory: watch::Sender<Inventory>,
}

/// A running publisher, stopped when dropped.
struct Publishing {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Publishing {
    async fn stop(self) {
        self.stop.send_replace(true);
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "DRA publisher task failed");
        }
    }
}

impl Kubelet {
    /// Follows the registration state until `shutdown`.
    async fn follow(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut states = self.registration.subscribe();
        let mut publishing: Option<Publishing> = None;
        // When kubelet's silence since the last bind becomes worth a warning.
        let mut silence_ends: Option<tokio::time::Instant> = None;
        let mut silent = false;
        loop {
            let state = states.borrow_and_update().clone();
            match &state {
                // Every bind sets Pending anew: a new registration kubelet owes us.
                RegistrationState::Pending => {
                    silence_ends = Some(tokio::time::Instant::now() + KUBELET_SILENCE);
                    silent = false;
                    if let Some(p) = publishing.take() {
                        tracing::info!(driver = %self.driver, "registration socket bound again: ResourceSlices left to kubelet until it registers the driver again");
                        p.stop().await;
                    }
                }
                RegistrationState::Asked => {}
                RegistrationState::Registered => {
                    silence_ends = None;
                    silent = false;
                    tracing::info!(driver = %self.driver, "registered with kubelet");
                    match &publishing {
                        // A starting kubelet deleted every slice of its node first: a pass now.
                        Some(_) => self.inventory.send_modify(|_| {}),
                        None => publishing = Some(self.publish()),
                    }
                }
                RegistrationState::Refused(reason) => {
                    silence_ends = None;
                    silent = false;
                    tracing::warn!(driver = %self.driver, socket = %self.socket.display(), %reason, "kubelet refused the DRA driver; check kubelet's log for the driver, and that no other DRA driver of this name runs on the node");
                    if let Some(p) = publishing.take() {
                        p.stop().await;
                    }
                    self.withdraw().await;
                }
            }
            self.report(&state, silent);
            loop {
                let silence = async {
                    match silence_ends {
                        Some(at) if !silent => tokio::time::sleep_until(at).await,
                        _ => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = &mut shutdown => {
                        if let Some(p) = publishing {
                            p.stop().await;
                        }
                        return;
                    }
                    changed = states.changed() => match changed {
                        Ok(()) => break,
                        Err(_) => return,
                    },
                    () = silence => {
                        silent = true;
                        match &state {
                            RegistrationState::Pending => tracing::warn!(driver = %self.driver, socket = %self.socket.display(), "kubelet has not called GetInfo on the DRA registration socket within {KUBELET_SILENCE:?}: check that kubelet runs on this node with DynamicResourceAllocation, that this directory is its plugins_registry (under its --root-dir), and wdp's debug log (RUST_LOG=h2=debug) for connections refused before GetInfo; no ResourceSlices are published until kubelet registers the driver"),
                            _ => tracing::warn!(driver = %self.driver, socket = %self.socket.display(), "kubelet called GetInfo on the DRA registration socket but has not reported the registration within {KUBELET_SILENCE:?}: check kubelet's log for the driver; no ResourceSlices are published until kubelet registers the driver"),
                        }
                        self.report(&state, true);
                    }
                }
            }
        }
    }

    /// `/readyz` and the metric for `state`; `silent` when kubelet's silence outlasted the bound.
    fn report(&self, state: &RegistrationState, silent: bool) {
        let driver = &self.driver;
        let socket = self.socket.display();
        self.status
            .dra_registered(driver, *state == RegistrationState::Registered);
        self.status.dra_not_ready(match state {
            RegistrationState::Registered => None,
            RegistrationState::Pending if silent => Some(format!(
                "DRA driver {driver}: kubelet has not called GetInfo on {socket} within {KUBELET_SILENCE:?} (is kubelet's plugin watcher watching that directory?)"
            )),
            RegistrationState::Asked if silent => Some(format!(
                "DRA driver {driver}: kubelet called GetInfo on {socket} but has not reported the registration within {KUBELET_SILENCE:?}"
            )),
            RegistrationState::Pending | RegistrationState::Asked => Some(format!(
                "DRA driver {driver}: not registered with kubelet yet"
            )),
            RegistrationState::Refused(reason) => Some(format!(
                "DRA driver {driver}: kubelet refused the registration: {reason}"
            )),
        });
    }

    /// Starts publishing the inventory.
    fn publish(&self) -> Publishing {
        let (stop, mut stopped) = watch::channel(false);
        let publisher = wdp_dra::publisher::Publisher::new(self.api.clone(), self.driver.clone());
        let task = tokio::spawn(publisher.run(self.updates.clone(), async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        Publishing { stop, task }
    }

    /// Deletes the driver's slices on the node (kubelet refused the driver: it will neither
    /// prepare their devices nor delete them).
    async fn withdraw(&self) {
        match self.api.delete_all_slices(&self.node, &self.driver).await {
            Ok(()) => {
                tracing::info!(driver = %self.driver, node = %self.node, "ResourceSlices withdrawn")
            }
            Err(e) => {
                tracing::warn!(driver = %self.driver, node = %self.node, error = %e, "withdrawing the ResourceSlices failed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{DeviceGroup, DeviceInfo};

    #[test]
    fn pci_names() {
        assert!(is_pci_root("pci0000:3a") && !is_pci_root("pci0000:3") && !is_pci_root("virtual"));
        assert!(is_pci_address("0000:3b:00.0"));
        assert!(
            !is_pci_address("0000:3b:00")
                && !is_pci_address("card0")
                && !is_pci_address("0000:3b:0g.0")
        );
    }

    #[test]
    fn a_tree_becomes_one_pool_with_unique_names_numa_and_cdi() {
        let mut tree = DeviceTree::default();
        let info = DeviceInfo {
            numa_nodes: Some(vec![1]),
            cdi_devices: vec!["ns.example.com/a=0".into()],
            ..DeviceInfo::default()
        };
        tree.0.insert(
            "a".into(),
            DeviceGroup::from_iter([("0".to_string(), info)]),
        );
        let sick = DeviceInfo {
            health: Health::Unhealthy,
            numa_nodes: Some(vec![0, 1]),
            ..DeviceInfo::default()
        };
        tree.0.insert(
            "b".into(),
            DeviceGroup::from_iter([("0".to_string(), sick), ("x".into(), DeviceInfo::default())]),
        );
        let pool = pool("node-1", &tree);
        assert_eq!(
            (pool.name.as_str(), pool.node_name.as_str()),
            ("node-1", "node-1")
        );
        let ids: Vec<_> = pool.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["a-0", "b-0", "x"]);
        assert_eq!(pool.devices[0].numa_node, Some(1));
        assert_eq!(pool.devices[0].cdi_device_ids, ["ns.example.com/a=0"]);
        assert_eq!(pool.devices[1].numa_node, None, "two nodes are no scalar");
        assert!(!pool.devices[1].healthy && !pool.devices[1].health_message.is_empty());
        assert!(pool.devices[2].healthy);
    }

    #[test]
    fn a_devices_guest_attributes_and_capacities_reach_its_pool_entry() {
        let mut info = DeviceInfo::default();
        info.attributes
            .attributes
            .insert("model".into(), TreeAttributeValue::String("A100".into()));
        info.attributes
            .attributes
            .insert("fw".into(), TreeAttributeValue::Version("1.2.3".into()));
        info.attributes
            .capacities
            .insert("memory".into(), "80Gi".into());
        let mut tree = DeviceTree::default();
        tree.0.insert(
            "gpu".into(),
            DeviceGroup::from_iter([("card0".to_string(), info)]),
        );
        let pool = pool("node-1", &tree);
        let d = &pool.devices[0];
        assert_eq!(d.attributes["model"], AttributeValue::String("A100".into()));
        assert_eq!(d.attributes["fw"], AttributeValue::Version("1.2.3".into()));
        assert_eq!(d.capacity["memory"], "80Gi");
    }
}
