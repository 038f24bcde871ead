//! A DRA kubelet stand-in for tests: what kubelet's plugin manager and DRA manager do with a
//! DRA driver, over the real sockets, so a test runs the real `wdp run` against it.
//!
//! It follows kubelet (`pkg/kubelet/pluginmanager`, `pkg/kubelet/cm/dra`):
//!
//! - at its start it deletes every ResourceSlice of its node (kubelet does, so that slices of
//!   drivers gone while it was down do not linger);
//! - its plugin watcher finds `*-reg.sock` in the registry directory (kubelet uses inotify; the
//!   stand-in looks every 50 ms), calls `GetInfo`, accepts only `DRAPlugin`, picks the newest
//!   DRA service the plugin supports (`v1.DRAPlugin`, else `v1beta1.DRAPlugin`) and answers
//!   `NotifyRegistrationStatus`; a socket bound again (another inode) is registered again, a
//!   socket removed deregisters the driver;
//! - it calls `NodePrepareResources` and `NodeUnprepareResources` on the endpoint the driver
//!   gave, over one connection per driver kept until the driver registers again, with kubelet's
//!   45 s timeout, through the service version it picked, and opens the
//!   `NodeWatchResources` health stream of a driver that advertised `v1.DRAResourceHealth`;
//! - 30 s after a driver is gone (its registration socket removed) and not back, it deletes the
//!   driver's slices on its node (`defaultWipingDelay` in `pkg/kubelet/cm/dra/manager.go`, the
//!   pending wipe of `pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`'s `wipeResourceSlices`,
//!   cancelled when the driver registers again); [`Options::wiping_delay`] shortens it for tests;
//! - a pod's claims are prepared and handed to its containers as `pkg/kubelet/cm/dra/manager.go`
//!   does ([`KubeletStandIn::prepare_pod`]): the claims of `spec.resourceClaims` and, for a pod
//!   whose containers ask for an extended resource served by DRA (`DRAExtendedResource`), the claim the
//!   scheduler made for it (`status.extendedResourceClaimStatus`); each container gets the CDI
//!   ids of its own requests only.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint, Uri};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::apiserver::client::ApiClient;
use crate::apiserver::standin::ApiServerStandIn;
use crate::apiserver::{ApiError, ClaimSource};
use crate::plugin::ClaimRef;
use crate::proto::pluginregistration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use crate::proto::{dra_v1, dra_v1beta1, health_v1};
use crate::registration::{DRA_V1, DRA_V1BETA1, HEALTH_V1, PLUGIN_TYPE};

/// kubelet's timeout of a NodePrepareResources or NodeUnprepareResources call.
pub const PLUGIN_CALL_TIMEOUT: Duration = Duration::from_secs(45);
/// How often the stand-in's plugin watcher looks at the registry directory.
const WATCH_INTERVAL: Duration = Duration::from_millis(50);
/// kubelet's delay between a driver going away and the deletion of its slices
/// (`defaultWipingDelay`): long enough for a DaemonSet's pod to be replaced.
pub const WIPING_DELAY: Duration = Duration::from_secs(30);

/// How the stand-in behaves where a test needs it to differ from kubelet's defaults.
#[derive(Clone, Debug)]
pub struct Options {
    /// What every registration is refused with, when set (as kubelet refuses a driver name
    /// already registered, or a version it does not speak).
    pub refuse: Option<String>,
    /// How long after a driver is gone its slices are deleted ([`WIPING_DELAY`] by default; a
    /// test shortens it rather than waiting half a minute).
    pub wiping_delay: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            refuse: None,
            wiping_delay: WIPING_DELAY,
        }
    }
}

/// A driver the stand-in registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The DRA socket the driver gave in GetInfo.
    pub endpoint: PathBuf,
    /// The DRA service version picked: the newest both sides speak.
    pub version: String,
    /// Every service the driver advertised.
    pub supported_versions: Vec<String>,
}

#[derive(Default)]
struct State {
    /// Registered drivers, by name.
    drivers: BTreeMap<String, Registered>,
    /// Registrations answered, accepted or refused, by driver.
    registrations: BTreeMap<String, usize>,
    /// The registration sockets handled, by path, as (device, inode).
    seen: BTreeMap<PathBuf, (u64, u64)>,
    /// What every registration is refused with, when set.
    refuse: Option<String>,
    /// Deregistrations per driver: a pending wipe is dropped when the driver came back (or went
    /// again, which starts a wipe of its own) meanwhile.
    departures: BTreeMap<String, u64>,
    /// The wipes waiting for their delay; stopped with the stand-in.
    wipes: Vec<JoinHandle<()>>,
    /// The claims prepared for pods, by (namespace, name): kubelet's claim info cache.
    claims: BTreeMap<(String, String), ClaimInfo>,
    /// One connection per registered driver, as kubelet keeps (dropped when it registers again).
    channels: BTreeMap<String, Channel>,
}

/// What kubelet keeps of a claim it prepared (`ClaimInfo` of `pkg/kubelet/cm/dra/claiminfo.go`).
#[derive(Clone, Debug)]
struct ClaimInfo {
    uid: String,
    /// The drivers of its allocation results: each is asked to prepare it.
    drivers: BTreeSet<String>,
    /// The pods using it: it is unprepared when the last one goes.
    pods: BTreeSet<String>,
    /// Every driver's answer, once prepared.
    devices: Vec<dra_v1::Device>,
    prepared: bool,
}

impl ClaimInfo {
    /// Adds the claim `namespace/name` to the call of each of its drivers.
    fn batch(&self, batches: &mut BTreeMap<String, Vec<ClaimRef>>, namespace: &str, name: &str) {
        for driver in &self.drivers {
            batches.entry(driver.clone()).or_default().push(ClaimRef {
                namespace: namespace.to_owned(),
                uid: self.uid.clone(),
                name: name.to_owned(),
            });
        }
    }
}

/// Why a pod's claims could not be prepared or unprepared: kubelet's reasons, reported with the
/// pod.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// Reading a claim from the API server failed.
    #[error("fetch ResourceClaim {claim}: {source}")]
    Api {
        /// The claim's name.
        claim: String,
        /// What the client said.
        source: ApiError,
    },
    /// The pod names a claim that does not exist.
    #[error("ResourceClaim {0} not found")]
    Missing(String),
    /// The claim is not reserved for this pod (`resourceclaim.IsReservedForPod`).
    #[error("pod {pod} is not allowed to use ResourceClaim {claim}")]
    NotReserved {
        /// The pod's name.
        pod: String,
        /// The claim's name.
        claim: String,
    },
    /// The claim has no allocation yet.
    #[error("ResourceClaim {0} is not allocated")]
    NotAllocated(String),
    /// A claim of that name with another UID is still prepared (the old pod force-deleted).
    #[error("old ResourceClaim with same name {claim} and different UID {uid} still exists")]
    Replaced {
        /// The claim's name.
        claim: String,
        /// The UID prepared before.
        uid: String,
    },
    /// The driver could not be called, or failed the whole call.
    #[error("{0}")]
    Driver(#[from] tonic::Status),
    /// The driver refused one claim.
    #[error("NodePrepareResources failed for ResourceClaim {claim}: {error}")]
    Prepare {
        /// The claim's name.
        claim: String,
        /// The driver's error.
        error: String,
    },
    /// The driver left a claim out of its answer.
    #[error("{call} skipped ResourceClaim {claim}")]
    Skipped {
        /// NodePrepareResources or NodeUnprepareResources.
        call: &'static str,
        /// The claim's name.
        claim: String,
    },
    /// The driver refused to unprepare one claim.
    #[error("NodeUnprepareResources failed for ResourceClaim {claim}: {error}")]
    Unprepare {
        /// The claim's name.
        claim: String,
        /// The driver's error.
        error: String,
    },
}

/// The CDI device ids each container of a pod gets, by container name.
pub type ContainerDevices = BTreeMap<String, Vec<String>>;

/// The stand-in; its watcher stops when it is dropped.
pub struct KubeletStandIn {
    state: Arc<Mutex<State>>,
    watcher: JoinHandle<()>,
    api: ApiClient,
}

impl Drop for KubeletStandIn {
    fn drop(&mut self) {
        self.watcher.abort();
        for wipe in lock(&self.state).wipes.drain(..) {
            wipe.abort();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl KubeletStandIn {
    /// Starts kubelet on `node`: wipes the node's slices in `api`, then watches `registry`.
    pub fn start(registry: &Path, api: &ApiServerStandIn, node: &str) -> Self {
        Self::start_with(registry, api, node, Options::default())
    }

    /// [`KubeletStandIn::start`], refusing every registration with `reason` when it is set (as
    /// kubelet refuses a driver name already registered, or a version it does not speak).
    pub fn start_refusing(
        registry: &Path,
        api: &ApiServerStandIn,
        node: &str,
        reason: Option<String>,
    ) -> Self {
        let options = Options {
            refuse: reason,
            ..Options::default()
        };
        Self::start_with(registry, api, node, options)
    }

    /// [`KubeletStandIn::start`] as `options` say.
    pub fn start_with(
        registry: &Path,
        api: &ApiServerStandIn,
        node: &str,
        options: Options,
    ) -> Self {
        api.wipe_slices(Some(node), None);
        let state = Arc::new(Mutex::new(State {
            refuse: options.refuse,
            ..State::default()
        }));
        let wiper = Wiper {
            api: api.client(),
            node: node.to_owned(),
            delay: options.wiping_delay,
        };
        let watcher = tokio::spawn(watch(registry.to_path_buf(), state.clone(), wiper));
        Self {
            state,
            watcher,
            api: api.client(),
        }
    }

    /// Stops the watcher: the stand-in keeps what it registered but sees nothing new.
    pub fn stop(self) {}

    /// Prepares the claims of `pod` and returns what each of its containers gets, as kubelet's
    /// `Manager.PrepareResources` and then `Manager.GetResources` for each container
    /// (`pkg/kubelet/cm/dra/manager.go`):
    ///
    /// - the claims are those of `spec.resourceClaims` (by `resourceClaimName`, or the name
    ///   `status.resourceClaimStatuses` gives a claim made from a template) and, when set,
    ///   `status.extendedResourceClaimStatus.resourceClaimName`: the claim the scheduler made for
    ///   the extended resources DRA serves;
    /// - each is read from the API server and must be reserved for the pod (by UID, as
    ///   `resourceclaim.IsReservedForPod`) and allocated; a cached claim of that name with
    ///   another UID is refused; the pod is added to the claim's users;
    /// - claims not prepared yet are sent, batched per driver of their allocation results, in one
    ///   NodePrepareResources call per driver; any error, or a claim left out, fails the pod;
    /// - a container gets, for each `resources.claims` entry naming a pod claim, the CDI ids of
    ///   that claim's devices for the entry's request (all of them without a request), and, for
    ///   each extended resource it requests (non-zero, after the API server's defaulting of
    ///   requests from limits) with a `requestMappings` entry of its name and that resource, the
    ///   CDI ids of the mapped request's devices (`ClaimInfo.cdiDevicesAsList`: a device
    ///   answered without request names goes to every request).
    pub async fn prepare_pod(&self, pod: &Pod) -> Result<ContainerDevices, PodError> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        // The validation pass, before the cache changes: a failing pod leaves nothing behind.
        let mut claims = Vec::new();
        for name in claim_names(pod) {
            let claim = self
                .api
                .get_claim(&namespace, &name)
                .await
                .map_err(|source| PodError::Api {
                    claim: name.clone(),
                    source,
                })?
                .ok_or_else(|| PodError::Missing(name.clone()))?;
            if !reserved_for(&claim, &pod_uid) {
                return Err(PodError::NotReserved {
                    pod: pod_name,
                    claim: name,
                });
            }
            let drivers =
                allocated_drivers(&claim).ok_or_else(|| PodError::NotAllocated(name.clone()))?;
            for driver in &drivers {
                self.driver(driver)?;
            }
            claims.push((
                name,
                claim.metadata.uid.clone().unwrap_or_default(),
                drivers,
            ));
        }
        let mut batches: BTreeMap<String, Vec<ClaimRef>> = BTreeMap::new();
        {
            let mut s = lock(&self.state);
            for (name, uid, drivers) in &claims {
                let info = s
                    .claims
                    .entry((namespace.clone(), name.clone()))
                    .or_insert_with(|| ClaimInfo {
                        uid: uid.clone(),
                        drivers: drivers.clone(),
                        pods: BTreeSet::new(),
                        devices: Vec::new(),
                        prepared: false,
                    });
                if info.uid != *uid {
                    return Err(PodError::Replaced {
                        claim: name.clone(),
                        uid: info.uid.clone(),
                    });
                }
                info.pods.insert(pod_uid.clone());
                if info.prepared {
                    continue;
                }
                info.batch(&mut batches, &namespace, name);
            }
        }
        let mut answered: BTreeMap<(String, String), Vec<dra_v1::Device>> = BTreeMap::new();
        for (driver, refs) in &batches {
            let mut answer = self.prepare(driver, refs).await?;
            for claim in refs {
                let result = answered_for(&mut answer, claim, "NodePrepareResources")?;
                if !result.error.is_empty() {
                    return Err(PodError::Prepare {
                        claim: claim.name.clone(),
                        error: result.error,
                    });
                }
                answered
                    .entry((claim.namespace.clone(), claim.name.clone()))
                    .or_default()
                    .extend(result.devices);
            }
        }
        let mut s = lock(&self.state);
        for (key, devices) in answered {
            if let Some(info) = s.claims.get_mut(&key) {
                info.devices = devices;
                info.prepared = true;
            }
        }
        let mut out = ContainerDevices::new();
        let containers = pod.spec.iter().flat_map(|spec| {
            spec.init_containers
                .iter()
                .flatten()
                .chain(spec.containers.iter())
        });
        for container in containers {
            let ids = container_devices(pod, container, &namespace, &s.claims);
            out.insert(container.name.clone(), ids);
        }
        Ok(out)
    }

    /// Unprepares the claims of `pod`, as kubelet's `Manager.UnprepareResources`: claims it
    /// never prepared are skipped, a claim other pods still use only loses this pod, the others
    /// are sent to their drivers in one NodeUnprepareResources call per driver and forgotten once
    /// every driver succeeded.
    pub async fn unprepare_pod(&self, pod: &Pod) -> Result<(), PodError> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut batches: BTreeMap<String, Vec<ClaimRef>> = BTreeMap::new();
        let mut done = Vec::new();
        {
            let mut s = lock(&self.state);
            for name in claim_names(pod) {
                let key = (namespace.clone(), name.clone());
                let Some(info) = s.claims.get_mut(&key) else {
                    continue;
                };
                if info.pods.len() > 1 {
                    info.pods.remove(&pod_uid);
                    continue;
                }
                info.batch(&mut batches, &namespace, &name);
                done.push(key);
            }
        }
        for (driver, refs) in &batches {
            let mut answer = self.unprepare(driver, refs).await?;
            for claim in refs {
                let error = answered_for(&mut answer, claim, "NodeUnprepareResources")?;
                if !error.is_empty() {
                    return Err(PodError::Unprepare {
                        claim: claim.name.clone(),
                        error,
                    });
                }
            }
        }
        let mut s = lock(&self.state);
        for key in done {
            s.claims.remove(&key);
        }
        Ok(())
    }

    /// The driver `driver`, once registered (waits up to `within`).
    pub async fn registered(&self, driver: &str, within: Duration) -> Option<Registered> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(r) = lock(&self.state).drivers.get(driver) {
                return Some(r.clone());
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(WATCH_INTERVAL).await;
        }
    }

    /// How many registrations of `driver` were answered (accepted or refused).
    pub fn registrations(&self, driver: &str) -> usize {
        lock(&self.state)
            .registrations
            .get(driver)
            .copied()
            .unwrap_or(0)
    }

    /// The driver's connection: the one already open, or a new one kept for the next calls.
    async fn channel(&self, driver: &str) -> Result<(Registered, Channel), tonic::Status> {
        let plugin = self.driver(driver)?;
        if let Some(channel) = lock(&self.state).channels.get(driver) {
            return Ok((plugin, channel.clone()));
        }
        let channel = connect(&plugin.endpoint).await?;
        lock(&self.state)
            .channels
            .insert(driver.to_owned(), channel.clone());
        Ok((plugin, channel))
    }

    fn driver(&self, driver: &str) -> Result<Registered, tonic::Status> {
        lock(&self.state)
            .drivers
            .get(driver)
            .cloned()
            .ok_or_else(|| {
                tonic::Status::failed_precondition(format!("DRA driver {driver} is not registered"))
            })
    }

    /// NodePrepareResources of `claims` on `driver`, as kubelet calls it for a pod's claims:
    /// the answer per claim UID.
    pub async fn prepare(
        &self,
        driver: &str,
        claims: &[ClaimRef],
    ) -> Result<BTreeMap<String, dra_v1::NodePrepareResourceResponse>, tonic::Status> {
        let (plugin, channel) = self.channel(driver).await?;
        let claims: Vec<dra_v1::Claim> = claims.iter().map(v1_claim).collect();
        if plugin.version == DRA_V1 {
            let mut client = dra_v1::dra_plugin_client::DraPluginClient::new(channel);
            let answer = client
                .node_prepare_resources(timed(dra_v1::NodePrepareResourcesRequest { claims }))
                .await?;
            return Ok(answer.into_inner().claims.into_iter().collect());
        }
        let mut client = dra_v1beta1::dra_plugin_client::DraPluginClient::new(channel);
        let answer = client
            .node_prepare_resources(timed(dra_v1beta1::NodePrepareResourcesRequest {
                claims: claims.into_iter().map(beta_claim).collect(),
            }))
            .await?;
        Ok(answer
            .into_inner()
            .claims
            .into_iter()
            .map(|(uid, r)| {
                let devices = r
                    .devices
                    .into_iter()
                    .map(|d| dra_v1::Device {
                        request_names: d.request_names,
                        pool_name: d.pool_name,
                        device_name: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                    })
                    .collect();
                (
                    uid,
                    dra_v1::NodePrepareResourceResponse {
                        devices,
                        error: r.error,
                    },
                )
            })
            .collect())
    }

    /// The `NodeWatchResources` stream of `driver`, as kubelet opens it for a driver that
    /// advertised the health service.
    pub async fn health(
        &self,
        driver: &str,
    ) -> Result<tonic::Streaming<health_v1::NodeWatchResourcesResponse>, tonic::Status> {
        let plugin = self.driver(driver)?;
        if !plugin.supported_versions.iter().any(|v| v == HEALTH_V1) {
            return Err(tonic::Status::unimplemented(format!(
                "DRA driver {driver} did not advertise {HEALTH_V1}"
            )));
        }
        let channel = connect(&plugin.endpoint).await?;
        let mut client =
            health_v1::dra_resource_health_client::DraResourceHealthClient::new(channel);
        Ok(client
            .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
            .await?
            .into_inner())
    }

    /// NodeUnprepareResources of `claims` on `driver`: the error per claim UID (empty: done).
    pub async fn unprepare(
        &self,
        driver: &str,
        claims: &[ClaimRef],
    ) -> Result<BTreeMap<String, String>, tonic::Status> {
        let (plugin, channel) = self.channel(driver).await?;
        let claims: Vec<dra_v1::Claim> = claims.iter().map(v1_claim).collect();
        if plugin.version == DRA_V1 {
            let mut client = dra_v1::dra_plugin_client::DraPluginClient::new(channel);
            let answer = client
                .node_unprepare_resources(timed(dra_v1::NodeUnprepareResourcesRequest { claims }))
                .await?;
            return Ok(answer
                .into_inner()
                .claims
                .into_iter()
                .map(|(uid, r)| (uid, r.error))
                .collect());
        }
        let mut client = dra_v1beta1::dra_plugin_client::DraPluginClient::new(channel);
        let answer = client
            .node_unprepare_resources(timed(dra_v1beta1::NodeUnprepareResourcesRequest {
                claims: claims.into_iter().map(beta_claim).collect(),
            }))
            .await?;
        Ok(answer
            .into_inner()
            .claims
            .into_iter()
            .map(|(uid, r)| (uid, r.error))
            .collect())
    }
}

/// The driver's answer for `claim` out of a `call`'s answers; a claim left out fails the pod.
fn answered_for<T>(
    answers: &mut BTreeMap<String, T>,
    claim: &ClaimRef,
    call: &'static str,
) -> Result<T, PodError> {
    answers.remove(&claim.uid).ok_or_else(|| PodError::Skipped {
        call,
        claim: claim.name.clone(),
    })
}

/// The claims of `pod` kubelet prepares, by name: `spec.resourceClaims` that name one (directly
/// or through the name generated from a template, in `status.resourceClaimStatuses`), then the
/// scheduler's claim for extended resources.
fn claim_names(pod: &Pod) -> Vec<String> {
    let mut names: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|spec| spec.resource_claims.iter().flatten())
        .filter_map(|c| pod_claim_name(pod, &c.name))
        .collect();
    if let Some(extended) = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
    {
        names.push(extended.resource_claim_name.clone());
    }
    names
}

/// The ResourceClaim behind the pod's claim entry `entry` (`resourceclaim.Name`): its
/// `resourceClaimName`, or the name generated for its template; `None` when there is none.
fn pod_claim_name(pod: &Pod, entry: &str) -> Option<String> {
    let spec = pod
        .spec
        .as_ref()?
        .resource_claims
        .iter()
        .flatten()
        .find(|c| c.name == entry)?;
    if let Some(name) = &spec.resource_claim_name {
        return Some(name.clone());
    }
    pod.status
        .as_ref()?
        .resource_claim_statuses
        .iter()
        .flatten()
        .find(|s| s.name == entry)?
        .resource_claim_name
        .clone()
}

/// Whether `claim` is reserved for the pod with UID `pod_uid` (`resourceclaim.IsReservedForPod`).
fn reserved_for(claim: &ResourceClaim, pod_uid: &str) -> bool {
    claim
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .any(|r| r.resource == "pods" && r.uid == pod_uid)
}

/// The drivers of `claim`'s allocation results, `None` when it is not allocated.
fn allocated_drivers(claim: &ResourceClaim) -> Option<BTreeSet<String>> {
    let allocation = claim.status.as_ref()?.allocation.as_ref()?;
    Some(
        allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
            .map(|r| r.driver.clone())
            .collect(),
    )
}

/// What `container` of `pod` gets from the prepared `claims` (`Manager.GetResources`).
fn container_devices(
    pod: &Pod,
    container: &Container,
    namespace: &str,
    claims: &BTreeMap<(String, String), ClaimInfo>,
) -> Vec<String> {
    let mut ids = Vec::new();
    let info = |name: &str| claims.get(&(namespace.to_owned(), name.to_owned()));
    let resources = container.resources.as_ref();
    for entry in resources.iter().flat_map(|r| r.claims.iter().flatten()) {
        if let Some(info) = pod_claim_name(pod, &entry.name).and_then(|n| info(&n)) {
            ids.extend(cdi_devices(
                info,
                entry.request.as_deref().unwrap_or_default(),
            ));
        }
    }
    let Some(extended) = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
    else {
        return ids;
    };
    let Some(info) = info(&extended.resource_claim_name) else {
        return ids;
    };
    for resource in requested(container) {
        if !is_dra_extended_resource(&resource) {
            continue;
        }
        for mapping in &extended.request_mappings {
            if mapping.container_name == container.name && mapping.resource_name == resource {
                ids.extend(cdi_devices(info, &mapping.request_name));
            }
        }
    }
    ids
}

/// The CDI ids of `info`'s devices for `request` (`ClaimInfo.cdiDevicesAsList`): every device
/// when the request is empty, and a device answered without request names for any request.
fn cdi_devices(info: &ClaimInfo, request: &str) -> Vec<String> {
    info.devices
        .iter()
        .filter(|d| {
            request.is_empty()
                || d.request_names.is_empty()
                || d.request_names.iter().any(|r| r == request)
        })
        .flat_map(|d| d.cdi_device_ids.iter().cloned())
        .collect()
}

/// The resources `container` requests with a non-zero quantity, after the API server's
/// defaulting (a resource in `limits` but not in `requests` is requested at its limit).
fn requested(container: &Container) -> BTreeSet<String> {
    let Some(resources) = &container.resources else {
        return BTreeSet::new();
    };
    let mut requests = resources.requests.clone().unwrap_or_default();
    for (name, limit) in resources.limits.iter().flatten() {
        requests
            .entry(name.clone())
            .or_insert_with(|| limit.clone());
    }
    requests
        .into_iter()
        .filter(|(_, q)| !is_zero(&q.0))
        .map(|(name, _)| name)
        .collect()
}

/// Whether a quantity (`0`, `0.0`, `0Mi`, `1`, `500m`) is zero.
fn is_zero(quantity: &str) -> bool {
    !quantity
        .trim()
        .trim_start_matches(['+', '0', '.'])
        .starts_with(|c: char| c.is_ascii_digit())
}

/// Whether `name` is an extended resource DRA may serve (`schedutil.IsDRAExtendedResourceName`):
/// a DeviceClass's implicit name (`deviceclass.resource.kubernetes.io/<class>`), or any name
/// outside Kubernetes' own domains with a domain of its own (`v1helper.IsExtendedResourceName`).
fn is_dra_extended_resource(name: &str) -> bool {
    if name.starts_with("deviceclass.resource.kubernetes.io/") {
        return true;
    }
    let Some((domain, _)) = name.split_once('/') else {
        return false;
    };
    !name.starts_with("requests.")
        && domain != "kubernetes.io"
        && !domain.ends_with(".kubernetes.io")
}

fn timed<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(PLUGIN_CALL_TIMEOUT);
    request
}

fn v1_claim(c: &ClaimRef) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: c.namespace.clone(),
        uid: c.uid.clone(),
        name: c.name.clone(),
    }
}

fn beta_claim(c: dra_v1::Claim) -> dra_v1beta1::Claim {
    dra_v1beta1::Claim {
        namespace: c.namespace,
        uid: c.uid,
        name: c.name,
    }
}

/// A channel to the gRPC server on the Unix socket `path`.
async fn connect(path: &Path) -> Result<Channel, tonic::Status> {
    let path = path.to_path_buf();
    let shown = path.display().to_string();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{shown}: {e}")))
}

/// The plugin watcher: registers every new registration socket, forgets removed ones.
async fn watch(registry: PathBuf, state: Arc<Mutex<State>>, wiper: Wiper) {
    loop {
        let mut present = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(&registry) {
            for entry in entries.filter_map(Result::ok) {
                let path = entry.path();
                let is_reg = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with("-reg.sock"));
                if let Ok(meta) = std::fs::symlink_metadata(&path)
                    && is_reg
                    && meta.file_type().is_socket()
                {
                    present.insert(path, (meta.dev(), meta.ino()));
                }
            }
        }
        let (new, gone): (Vec<_>, Vec<_>) = {
            let s = lock(&state);
            let new = present
                .iter()
                .filter(|(p, id)| s.seen.get(*p) != Some(*id))
                .map(|(p, id)| (p.clone(), *id))
                .collect();
            let gone = s
                .seen
                .keys()
                .filter(|p| !present.contains_key(*p))
                .cloned()
                .collect();
            (new, gone)
        };
        for path in gone {
            let mut s = lock(&state);
            s.seen.remove(&path);
            let driver = driver_of(&path);
            s.channels.remove(&driver);
            if s.drivers.remove(&driver).is_some() {
                let departure = s.departures.entry(driver.clone()).or_default();
                *departure += 1;
                let wipe = tokio::spawn(wiper.clone().wipe(driver, *departure, state.clone()));
                s.wipes.retain(|w| !w.is_finished());
                s.wipes.push(wipe);
            }
        }
        for (path, id) in new {
            // Not marked seen when no answer came (a socket bound but not yet listening, a
            // stale one): tried again at the next scan, as kubelet's reconciler retries a plugin
            // it could not register.
            match register(&path, &state).await {
                Ok(()) => {
                    lock(&state).seen.insert(path.clone(), id);
                }
                Err(e) => {
                    tracing::warn!(socket = %path.display(), error = %e, "DRA registration failed");
                }
            }
        }
        tokio::time::sleep(WATCH_INTERVAL).await;
    }
}

/// kubelet's deletion of a gone driver's slices on its node.
#[derive(Clone)]
struct Wiper {
    api: ApiClient,
    node: String,
    delay: Duration,
}

impl Wiper {
    /// After the delay, deletes `driver`'s slices on the node unless it registered again (or
    /// left again, which has a wipe of its own) since its `departure`-th deregistration.
    async fn wipe(self, driver: String, departure: u64, state: Arc<Mutex<State>>) {
        tokio::time::sleep(self.delay).await;
        {
            let s = lock(&state);
            if s.drivers.contains_key(&driver) || s.departures.get(&driver) != Some(&departure) {
                return;
            }
        }
        if let Err(e) = self.api.delete_all_slices(&self.node, &driver).await {
            tracing::warn!(%driver, error = %e, "wiping the ResourceSlices of a gone DRA driver failed");
        }
    }
}

/// The driver a registration socket is named after (`<driver>-reg.sock`).
fn driver_of(path: &Path) -> String {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix("-reg.sock"))
        .unwrap_or_default()
        .to_owned()
}

async fn register(path: &Path, state: &Mutex<State>) -> Result<(), tonic::Status> {
    let mut client = RegistrationClient::new(connect(path).await?);
    let info = client.get_info(InfoRequest {}).await?.into_inner();
    let version = [DRA_V1, DRA_V1BETA1]
        .into_iter()
        .find(|v| info.supported_versions.iter().any(|s| s == v));
    let refusal = if info.r#type != PLUGIN_TYPE {
        Some(format!(
            "plugin type {:?} is not {PLUGIN_TYPE}",
            info.r#type
        ))
    } else if let Some(reason) = lock(state).refuse.clone() {
        Some(reason)
    } else if version.is_none() {
        Some(format!(
            "none of the versions {:?} is supported",
            info.supported_versions
        ))
    } else {
        None
    };
    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: refusal.is_none(),
            error: refusal.clone().unwrap_or_default(),
        })
        .await?;
    let mut s = lock(state);
    *s.registrations.entry(info.name.clone()).or_default() += 1;
    s.channels.remove(&info.name);
    if let (None, Some(version)) = (refusal, version) {
        s.drivers.insert(
            info.name,
            Registered {
                endpoint: PathBuf::from(info.endpoint),
                version: version.to_owned(),
                supported_versions: info.supported_versions,
            },
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::pluginregistration::{
        PluginInfo, RegistrationStatusResponse,
        registration_server::{Registration, RegistrationServer},
    };

    /// A plugin's registration server answering GetInfo with `info`, keeping kubelet's answers.
    #[derive(Clone)]
    struct Plugin {
        info: PluginInfo,
        answers: Arc<Mutex<Vec<RegistrationStatus>>>,
    }

    #[tonic::async_trait]
    impl Registration for Plugin {
        async fn get_info(
            &self,
            _: tonic::Request<InfoRequest>,
        ) -> Result<tonic::Response<PluginInfo>, tonic::Status> {
            Ok(tonic::Response::new(self.info.clone()))
        }

        async fn notify_registration_status(
            &self,
            request: tonic::Request<RegistrationStatus>,
        ) -> Result<tonic::Response<RegistrationStatusResponse>, tonic::Status> {
            self.answers.lock().unwrap().push(request.into_inner());
            Ok(tonic::Response::new(RegistrationStatusResponse {}))
        }
    }

    fn plugin(registry: &Path, kind: &str, name: &str, versions: &[&str]) -> Plugin {
        let plugin = Plugin {
            info: PluginInfo {
                r#type: kind.into(),
                name: name.into(),
                endpoint: registry.join("nowhere.sock").display().to_string(),
                supported_versions: versions.iter().map(|v| v.to_string()).collect(),
            },
            answers: Arc::default(),
        };
        tokio::spawn(crate::socket::serve(
            registry.join(format!("{name}-reg.sock")),
            tonic::service::Routes::new(RegistrationServer::new(plugin.clone())),
            Duration::from_secs(1),
            std::future::pending(),
            || {},
        ));
        plugin
    }

    /// A registration socket found before it answers (bound, not yet listening: a plugin
    /// starting on a loaded machine) is registered once it does, as kubelet's reconciler retries
    /// a plugin it could not register.
    #[tokio::test]
    async fn a_socket_found_before_it_listens_is_registered_once_it_does() {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};
        let api = ApiServerStandIn::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let registry = dir.path().join("plugins_registry");
        std::fs::create_dir_all(&registry).unwrap();
        let path = registry.join("late.example.com-reg.sock");
        let fd = rustix::net::socket(AddressFamily::UNIX, SocketType::STREAM, None).unwrap();
        rustix::net::bind(&fd, &SocketAddrUnix::new(&path).unwrap()).unwrap();
        let kubelet = KubeletStandIn::start_with(&registry, &api, "node-a", Options::default());
        // Scans meanwhile (a scan every 50 ms; fewer on a loaded machine) find it refusing.
        tokio::time::sleep(WATCH_INTERVAL * 4).await;
        assert_eq!(kubelet.registrations("late.example.com"), 0);

        rustix::net::listen(&fd, 16).unwrap();
        let listener = std::os::unix::net::UnixListener::from(fd);
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::UnixListener::from_std(listener).unwrap();
        let plugin = Plugin {
            info: PluginInfo {
                r#type: PLUGIN_TYPE.into(),
                name: "late.example.com".into(),
                endpoint: registry.join("nowhere.sock").display().to_string(),
                supported_versions: vec![DRA_V1.into()],
            },
            answers: Arc::default(),
        };
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(plugin))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        kubelet
            .registered("late.example.com", Duration::from_secs(20))
            .await
            .expect("registered once it answers");
        server.abort();
    }

    #[tokio::test]
    async fn a_gone_driver_loses_its_slices_after_the_delay_unless_it_comes_back() {
        let api = ApiServerStandIn::start().await.unwrap();
        let pool = crate::seam::Pool {
            name: "node-a".into(),
            node_name: "node-a".into(),
            devices: vec![crate::seam::Device {
                id: "gpu-0".into(),
                dev_type: "gpu".into(),
                healthy: true,
                ..Default::default()
            }],
        };
        let dir = tempfile::tempdir().unwrap();
        let registry = dir.path().join("plugins_registry");
        // Long enough for a loaded machine to bind a socket again within it.
        let delay = Duration::from_secs(5);
        let options = Options {
            wiping_delay: delay,
            ..Options::default()
        };
        let _back = plugin(&registry, PLUGIN_TYPE, "back.example.com", &[DRA_V1]);
        let kubelet = KubeletStandIn::start_with(&registry, &api, "node-a", options);
        let within = Duration::from_secs(5);
        kubelet
            .registered("back.example.com", within)
            .await
            .unwrap();
        for driver in ["back.example.com", "gone.example.com"] {
            for slice in crate::slices::pool_slices(driver, &pool, 0) {
                api.put_slice(slice).unwrap();
            }
        }
        let drivers = |api: &ApiServerStandIn| -> BTreeSet<String> {
            api.slices().into_iter().map(|s| s.spec.driver).collect()
        };
        // A driver registered and gone for good: its slices wiped after the delay, not before.
        let gone = dir.path().join("gone");
        std::fs::create_dir_all(&gone).unwrap();
        let server = tokio::spawn(crate::socket::serve(
            registry.join("gone.example.com-reg.sock"),
            tonic::service::Routes::new(
                crate::proto::pluginregistration::registration_server::RegistrationServer::new(
                    Plugin {
                        info: PluginInfo {
                            r#type: PLUGIN_TYPE.into(),
                            name: "gone.example.com".into(),
                            endpoint: gone.join("dra.sock").display().to_string(),
                            supported_versions: vec![DRA_V1.into()],
                        },
                        answers: Arc::default(),
                    },
                ),
            ),
            Duration::from_secs(3600),
            std::future::pending(),
            || {},
        ));
        kubelet
            .registered("gone.example.com", within)
            .await
            .unwrap();
        server.abort();
        let _ = server.await;
        let _ = std::fs::remove_file(registry.join("gone.example.com-reg.sock"));
        // The other driver's socket removed too: bound again at once, so it is back before its
        // delay ends and its wipe is dropped.
        std::fs::remove_file(registry.join("back.example.com-reg.sock")).unwrap();
        crate::testing::wait_for(|| kubelet.registrations("back.example.com") >= 2).await;
        assert_eq!(
            kubelet.registrations("back.example.com"),
            2,
            "registered again"
        );
        assert_eq!(
            drivers(&api),
            BTreeSet::from(["back.example.com".into(), "gone.example.com".into()]),
            "nothing wiped before the delay"
        );
        let back = BTreeSet::from(["back.example.com".to_string()]);
        crate::testing::wait_within(delay * 4, || drivers(&api) == back).await;
        // The returned driver's wipe would have come just after the gone one's: still kept.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            drivers(&api),
            back,
            "the gone driver's slices wiped, the returned one's kept"
        );
    }

    #[test]
    fn extended_resources_and_quantities_as_kubelet_reads_them() {
        for name in [
            "devices.example.com/kvm",
            "nvidia.com/gpu",
            "deviceclass.resource.kubernetes.io/gpu.example.com",
        ] {
            assert!(is_dra_extended_resource(name), "{name}");
        }
        for name in [
            "cpu",
            "memory",
            "hugepages-2Mi",
            "kubernetes.io/foo",
            "node.kubernetes.io/foo",
            "requests.example.com/x",
        ] {
            assert!(!is_dra_extended_resource(name), "{name}");
        }
        for zero in ["0", "0.0", "0Mi", "+0", "000"] {
            assert!(is_zero(zero), "{zero}");
        }
        for some in ["1", "10", "0.5", "500m", "1Gi"] {
            assert!(!is_zero(some), "{some}");
        }
    }

    #[test]
    fn a_devices_cdi_ids_go_to_its_requests_and_unnamed_ones_to_every_request() {
        let device = |requests: &[&str], id: &str| dra_v1::Device {
            request_names: requests.iter().map(|r| r.to_string()).collect(),
            cdi_device_ids: vec![id.into()],
            ..Default::default()
        };
        let info = ClaimInfo {
            uid: "u".into(),
            drivers: BTreeSet::new(),
            pods: BTreeSet::new(),
            devices: vec![
                device(&["a"], "x=a"),
                device(&["b"], "x=b"),
                device(&[], "x=any"),
            ],
            prepared: true,
        };
        assert_eq!(cdi_devices(&info, "a"), ["x=a", "x=any"]);
        assert_eq!(cdi_devices(&info, "b"), ["x=b", "x=any"]);
        assert_eq!(cdi_devices(&info, ""), ["x=a", "x=b", "x=any"]);
    }

    #[tokio::test]
    async fn the_watcher_picks_the_newest_dra_service_and_refuses_what_it_cannot_use() {
        let api = ApiServerStandIn::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let registry = dir.path().join("plugins_registry");
        let beta = plugin(&registry, PLUGIN_TYPE, "beta.example.com", &[DRA_V1BETA1]);
        let both = plugin(
            &registry,
            PLUGIN_TYPE,
            "both.example.com",
            &[DRA_V1BETA1, DRA_V1],
        );
        let device_plugin = plugin(&registry, "DevicePlugin", "dp.example.com", &["v1beta1"]);
        let future = plugin(&registry, PLUGIN_TYPE, "v9.example.com", &["v9.DRAPlugin"]);
        let kubelet = KubeletStandIn::start(&registry, &api, "node-a");

        let within = Duration::from_secs(5);
        let r = kubelet
            .registered("beta.example.com", within)
            .await
            .unwrap();
        assert_eq!(r.version, DRA_V1BETA1);
        let r = kubelet
            .registered("both.example.com", within)
            .await
            .unwrap();
        assert_eq!(
            r.version, DRA_V1,
            "the newest both speak, whatever the order"
        );
        let answered = |p: &Plugin| p.answers.lock().unwrap().clone();
        for _ in 0..100 {
            if !answered(&device_plugin).is_empty() && !answered(&future).is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let refused = answered(&device_plugin);
        assert!(!refused[0].plugin_registered, "{refused:?}");
        assert!(refused[0].error.contains("\"DevicePlugin\""), "{refused:?}");
        let refused = answered(&future);
        assert!(!refused[0].plugin_registered);
        assert!(refused[0].error.contains("v9.DRAPlugin"), "{refused:?}");
        assert!(
            kubelet
                .registered("dp.example.com", Duration::ZERO)
                .await
                .is_none()
        );
        assert_eq!(
            answered(&beta),
            [RegistrationStatus {
                plugin_registered: true,
                error: String::new()
            }]
        );
        assert_eq!(kubelet.registrations("both.example.com"), 1);
        assert_eq!(answered(&both).len(), 1);
    }
}
