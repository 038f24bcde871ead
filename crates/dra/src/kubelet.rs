//! A DRA kubelet stand-in for tests: what kubelet's plugin manager and DRA manager do with a
//! DRA driver, over the real sockets, so a test runs the real `wdp run` against it.
//!
//! It follows kubelet (`pkg/kubelet/pluginmanager`, `pkg/kubelet/cm/dra`):
//!
//! - at its start it deletes every ResourceSlice of its node (kubelet does, so that slices of
//!   drivers gone while it was down do not linger);
//! - it behaves as one kubelet release ([`Version`], 1.34 by default) where releases differ on
//!   the wire: the `:authority` of each dial, the DRA services it speaks, the health stream;
//! - its plugin watcher finds `*-reg.sock` in the registry directory by inotify, as kubelet does
//!   (its reconciler acts on what the events said every 50 ms, kubelet's every second), dials it
//!   as kubelet does (grpc-go with the bare socket path:
//!   the percent-encoded path as `:authority`), calls `GetInfo`, accepts only `DRAPlugin`, picks
//!   the newest DRA service both speak (`v1.DRAPlugin`, else `v1beta1.DRAPlugin`; 1.32 and 1.33
//!   only know `v1beta1.DRAPlugin` of wdp's) and answers `NotifyRegistrationStatus`; a socket
//!   created again is registered again (whatever inode the file system gave it), a socket
//!   removed deregisters the driver;
//! - it calls `NodePrepareResources` and `NodeUnprepareResources` on the endpoint the driver
//!   gave, over one connection per driver kept until the driver registers again, with kubelet's
//!   45 s timeout, through the service version it picked; from 1.34 on it opens the
//!   `/v1alpha1.DRAResourceHealth/NodeWatchResources` health stream over that connection, as
//!   those releases do on every driver (with their ResourceHealthStatus gate on) whatever
//!   `GetInfo` listed: on demand ([`KubeletStandIn::health`]) or, with the gate
//!   ([`Options::resource_health_status`]), from registration on, opened again 5 s after it
//!   fails or ends;
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
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::task::JoinHandle;
use tonic::transport::Channel;
use wdp_kubelet::dir::{DirEvent, PluginDir};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::apiserver::client::ApiClient;
use crate::apiserver::standin::ApiServerStandIn;
use crate::apiserver::{ApiError, ClaimSource};
use crate::plugin::ClaimRef;
use crate::proto::pluginregistration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use crate::proto::{dra_v1, dra_v1beta1, health_v1alpha1};
use crate::registration::{DRA_V1, DRA_V1BETA1, PLUGIN_TYPE};

/// kubelet's timeout of a NodePrepareResources or NodeUnprepareResources call.
pub const PLUGIN_CALL_TIMEOUT: Duration = Duration::from_secs(45);
/// How often the stand-in's reconciler brings the registered plugins to the sockets present
/// (kubelet's `reconcilerLoopSleepPeriod` is 1 s; shorter here, for tests' sake).
const WATCH_INTERVAL: Duration = Duration::from_millis(50);
/// How long kubelet waits before opening a driver's health stream again after it failed or
/// ended (`wait.UntilWithContext` in `dra_plugin_manager.go`).
pub const HEALTH_RETRY: Duration = Duration::from_secs(5);
/// kubelet's delay between a driver going away and the deletion of its slices
/// (`defaultWipingDelay`): long enough for a DaemonSet's pod to be replaced.
pub const WIPING_DELAY: Duration = Duration::from_secs(30);

/// The kubelet release the stand-in behaves as, where releases differ on the wire (read from
/// each release's `pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go`,
/// `pkg/kubelet/cm/dra/plugin/` and the grpc-go it vendors).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// 1.32: DRAPlugin v1beta1 (or v1alpha4.Node); `dra.sock` dialled by its bare path; no
    /// health client.
    V1_32,
    /// 1.33: as 1.32.
    V1_33,
    /// 1.34: DRAPlugin v1 or v1beta1; `dra.sock` dialled as `unix:<path>`; the v1alpha1 health
    /// stream.
    #[default]
    V1_34,
    /// 1.35: as 1.34.
    V1_35,
}

impl Version {
    /// Every release the stand-in knows, oldest first.
    pub const ALL: [Version; 4] = [
        Version::V1_32,
        Version::V1_33,
        Version::V1_34,
        Version::V1_35,
    ];

    /// The `:authority` of the plugin watcher's connection to a registration socket: every
    /// release dials the bare socket path with grpc-go, whose `passthrough` resolver sends the
    /// path percent-encoded.
    pub fn registration_authority(self, socket: &Path) -> Vec<u8> {
        wdp_kubelet::authority::grpc_go_passthrough(socket)
    }

    /// The `:authority` of the DRA manager's connection to a driver's `dra.sock`: 1.32 and 1.33
    /// dial the bare path (`grpc.Dial(endpoint)`: percent-encoded), 1.34 and later
    /// `unix:<path>` (`grpc.NewClient`: `localhost`).
    pub fn dra_authority(self, endpoint: &Path) -> Vec<u8> {
        match self {
            Version::V1_32 | Version::V1_33 => {
                wdp_kubelet::authority::grpc_go_passthrough(endpoint)
            }
            Version::V1_34 | Version::V1_35 => wdp_kubelet::authority::LOCALHOST.into(),
        }
    }

    /// The DRAPlugin services it speaks that wdp serves, newest first
    /// (`servicesSupportedByKubelet`).
    pub fn dra_services(self) -> &'static [&'static str] {
        match self {
            Version::V1_32 | Version::V1_33 => &[DRA_V1BETA1],
            Version::V1_34 | Version::V1_35 => &[DRA_V1, DRA_V1BETA1],
        }
    }

    /// Whether it opens the v1alpha1 health stream on every registered driver (1.34 and 1.35,
    /// with their ResourceHealthStatus gate on); 1.32 and 1.33 have no health client.
    pub fn watches_health(self) -> bool {
        self >= Version::V1_34
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Version::V1_32 => "1.32",
            Version::V1_33 => "1.33",
            Version::V1_34 => "1.34",
            Version::V1_35 => "1.35",
        })
    }
}

/// How the stand-in behaves where a test needs it to differ from kubelet's defaults.
#[derive(Clone, Debug)]
pub struct Options {
    /// The kubelet release it behaves as ([`Version::V1_34`] by default).
    pub version: Version,
    /// What every registration is refused with, when set (as kubelet refuses a driver name
    /// already registered, or a version it does not speak).
    pub refuse: Option<String>,
    /// How long after a driver is gone its slices are deleted ([`WIPING_DELAY`] by default; a
    /// test shortens it rather than waiting half a minute).
    pub wiping_delay: Duration,
    /// kubelet's `ResourceHealthStatus` feature gate (off by default in 1.34 and 1.35): from
    /// 1.34 on, the health stream of every registered driver is kept open, opened again
    /// [`HEALTH_RETRY`] after it fails or ends, and what it says is kept
    /// ([`KubeletStandIn::device_health`]).
    pub resource_health_status: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            version: Version::default(),
            refuse: None,
            wiping_delay: WIPING_DELAY,
            resource_health_status: false,
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
    /// The kubelet release it behaves as.
    version: Version,
    /// Registered drivers, by name.
    drivers: BTreeMap<String, Registered>,
    /// Registrations answered, accepted or refused, by driver.
    registrations: BTreeMap<String, usize>,
    /// The registration sockets registered, by path, with the generation of the creation
    /// registered (see [`Desired`]).
    seen: BTreeMap<PathBuf, u64>,
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
    /// Whether registered drivers' health streams are kept open (the feature gate).
    health_watch: bool,
    /// The health streams kept open, by driver.
    health_watchers: BTreeMap<String, JoinHandle<()>>,
    /// The last health each driver's stream gave, by (driver, pool, device).
    health: BTreeMap<(String, String, String), i32>,
    /// Why each driver's health stream last failed.
    health_errors: BTreeMap<String, String>,
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
        let mut s = lock(&self.state);
        for wipe in s.wipes.drain(..) {
            wipe.abort();
        }
        for (_, watcher) in std::mem::take(&mut s.health_watchers) {
            watcher.abort();
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
            version: options.version,
            refuse: options.refuse,
            health_watch: options.resource_health_status,
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

    /// Stops like kubelet (SIGTERM or SIGKILL alike): the watcher ends and the connections to
    /// drivers close; the registry directory, every driver's sockets and files and the slices
    /// are left as they are, as kubelet leaves them when its process ends (the plugin watcher
    /// removes nothing; a driver's slices are wiped by the next kubelet, not this one).
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
        driver_channel(&self.state, driver).await
    }

    /// The last health `driver`'s stream gave for `device` of `pool` (kept with
    /// [`Options::resource_health_status`]).
    pub fn device_health(
        &self,
        driver: &str,
        pool: &str,
        device: &str,
    ) -> Option<health_v1alpha1::HealthStatus> {
        let s = lock(&self.state);
        let key = (driver.to_owned(), pool.to_owned(), device.to_owned());
        s.health
            .get(&key)
            .and_then(|h| health_v1alpha1::HealthStatus::try_from(*h).ok())
    }

    /// Why `driver`'s kept health stream last failed, if it did.
    pub fn health_error(&self, driver: &str) -> Option<String> {
        lock(&self.state).health_errors.get(driver).cloned()
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

    /// The health stream of `driver`, as the release opens it: from 1.34 on,
    /// `/v1alpha1.DRAResourceHealth/NodeWatchResources` on the driver's connection, whatever
    /// `GetInfo` listed (those releases have no other health client and do not look);
    /// `Unimplemented` for 1.32 and 1.33, which have no health client at all.
    pub async fn health(
        &self,
        driver: &str,
    ) -> Result<tonic::Streaming<health_v1alpha1::NodeWatchResourcesResponse>, tonic::Status> {
        open_health(&self.state, driver).await
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

/// `driver`'s connection: the one already open, or a new one kept for the next calls, dialled as
/// the release dials `dra.sock`.
async fn driver_channel(
    state: &Mutex<State>,
    driver: &str,
) -> Result<(Registered, Channel), tonic::Status> {
    let (plugin, open, version) = {
        let s = lock(state);
        let plugin = s.drivers.get(driver).cloned().ok_or_else(|| {
            tonic::Status::failed_precondition(format!("DRA driver {driver} is not registered"))
        })?;
        (plugin, s.channels.get(driver).cloned(), s.version)
    };
    if let Some(channel) = open {
        return Ok((plugin, channel));
    }
    let channel = connect(&plugin.endpoint, version.dra_authority(&plugin.endpoint)).await?;
    lock(state)
        .channels
        .insert(driver.to_owned(), channel.clone());
    Ok((plugin, channel))
}

/// `driver`'s health stream as the release opens it (see [`KubeletStandIn::health`]).
async fn open_health(
    state: &Mutex<State>,
    driver: &str,
) -> Result<tonic::Streaming<health_v1alpha1::NodeWatchResourcesResponse>, tonic::Status> {
    let version = lock(state).version;
    if !version.watches_health() {
        return Err(tonic::Status::unimplemented(format!(
            "kubelet {version} has no DRA health client"
        )));
    }
    let (_, channel) = driver_channel(state, driver).await?;
    let mut client =
        health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(channel);
    Ok(client
        .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
        .await?
        .into_inner())
}

/// kubelet's health stream of a registered driver (`DRAPluginManager.add` with
/// `ResourceHealthStatus`): opened, read until it ends, opened again after [`HEALTH_RETRY`];
/// every message's devices kept.
async fn watch_health(driver: String, state: Arc<Mutex<State>>) {
    loop {
        let ended = match open_health(&state, &driver).await {
            Ok(mut stream) => loop {
                match stream.message().await {
                    Ok(Some(message)) => {
                        let mut s = lock(&state);
                        for d in message.devices {
                            if let Some(id) = d.device {
                                let key = (driver.clone(), id.pool_name, id.device_name);
                                s.health.insert(key, d.health);
                            }
                        }
                    }
                    Ok(None) => break None,
                    Err(e) => break Some(e),
                }
            },
            Err(e) => Some(e),
        };
        if let Some(e) = ended {
            tracing::info!(%driver, error = %e, "DRA health stream failed; opening it again in 5 s");
            lock(&state)
                .health_errors
                .insert(driver.clone(), e.to_string());
        }
        tokio::time::sleep(HEALTH_RETRY).await;
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

/// A channel to the gRPC server on the Unix socket `path`, its requests carrying `authority`.
async fn connect(path: &Path, authority: Vec<u8>) -> Result<Channel, tonic::Status> {
    wdp_kubelet::transport::connect_with_authority(path, authority)
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{}: {e}", path.display())))
}

/// The plugin watcher and its reconciler, as kubelet's `pluginwatcher` and
/// `pluginmanager/reconciler`: inotify events of the registry directory make the desired state
/// (every `*-reg.sock` created, each creation a new generation, as kubelet stamps it with the
/// event's time), and every [`WATCH_INTERVAL`] the registered state is brought to it: a socket
/// created again is registered again even when the file system gave it the inode of the one
/// removed (kubelet compares the stamps, not the files), a removed one deregisters its driver.
async fn watch(registry: PathBuf, state: Arc<Mutex<State>>, wiper: Wiper) {
    let dir = match PluginDir::watch(&registry) {
        Ok(dir) => dir,
        Err(e) => {
            tracing::error!(dir = %registry.display(), error = %e, "cannot watch the plugin registry");
            return;
        }
    };
    // Subscribed before the first look, so no socket created meanwhile is missed.
    let mut events = dir.subscribe();
    let mut desired = Desired::default();
    desired.traverse(&registry);
    let mut reconcile = tokio::time::interval(WATCH_INTERVAL);
    reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(DirEvent::Created(name)) => desired.created(registry.join(name)),
                Ok(DirEvent::Removed(name)) => {
                    desired.sockets.remove(&registry.join(name));
                }
                // Events lost: what is there now is what is desired (kubelet logs the error
                // and goes on; the stand-in looks again so a test sees no lost socket).
                Ok(DirEvent::Overflow) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    desired.traverse(&registry);
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
            _ = reconcile.tick() => reconcile_once(&desired, &state, &wiper).await,
        }
    }
}

/// The registration sockets kubelet wants registered, each with the generation of its last
/// creation.
#[derive(Default)]
struct Desired {
    sockets: BTreeMap<PathBuf, u64>,
    generation: u64,
}

impl Desired {
    /// A file was created: a registration socket gets a new generation, anything else is not a
    /// plugin (kubelet's `handleCreateEvent` ignores what is not a Unix socket).
    fn created(&mut self, path: PathBuf) {
        let is_reg = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with("-reg.sock"));
        let is_socket =
            std::fs::symlink_metadata(&path).is_ok_and(|meta| meta.file_type().is_socket());
        if is_reg && is_socket {
            self.generation += 1;
            self.sockets.insert(path, self.generation);
        }
    }

    /// kubelet's first walk of the directory, and the stand-in's look after lost events: sockets
    /// gone are forgotten, sockets not yet known are added.
    fn traverse(&mut self, registry: &Path) {
        let present: BTreeSet<PathBuf> = std::fs::read_dir(registry)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .collect();
        self.sockets.retain(|path, _| present.contains(path));
        for path in present {
            if !self.sockets.contains_key(&path) {
                self.created(path);
            }
        }
    }
}

/// One pass of the reconciler: deregisters drivers whose socket is gone, registers sockets not
/// registered in their latest generation.
async fn reconcile_once(desired: &Desired, state: &Arc<Mutex<State>>, wiper: &Wiper) {
    let (new, gone): (Vec<_>, Vec<_>) = {
        let s = lock(state);
        let new = desired
            .sockets
            .iter()
            .filter(|(p, generation)| s.seen.get(*p) != Some(*generation))
            .map(|(p, generation)| (p.clone(), *generation))
            .collect();
        let gone = s
            .seen
            .keys()
            .filter(|p| !desired.sockets.contains_key(*p))
            .cloned()
            .collect();
        (new, gone)
    };
    for path in gone {
        let mut s = lock(state);
        s.seen.remove(&path);
        let driver = driver_of(&path);
        s.channels.remove(&driver);
        if let Some(watcher) = s.health_watchers.remove(&driver) {
            watcher.abort();
        }
        if s.drivers.remove(&driver).is_some() {
            let departure = s.departures.entry(driver.clone()).or_default();
            *departure += 1;
            let wipe = tokio::spawn(wiper.clone().wipe(driver, *departure, state.clone()));
            s.wipes.retain(|w| !w.is_finished());
            s.wipes.push(wipe);
        }
    }
    for (path, generation) in new {
        // Not marked registered when no answer came (a socket bound but not yet listening, a
        // stale one): tried again at the next pass, as kubelet's reconciler retries a plugin it
        // could not register.
        match register(&path, state).await {
            Ok(()) => {
                lock(state).seen.insert(path.clone(), generation);
            }
            Err(e) => {
                tracing::warn!(socket = %path.display(), error = %e, "DRA registration failed");
            }
        }
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

async fn register(path: &Path, state: &Arc<Mutex<State>>) -> Result<(), tonic::Status> {
    let kubelet = lock(state).version;
    let channel = connect(path, kubelet.registration_authority(path)).await?;
    let mut client = RegistrationClient::new(channel);
    let info = client.get_info(InfoRequest {}).await?.into_inner();
    let version = kubelet
        .dra_services()
        .iter()
        .copied()
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
    if let Some(watcher) = s.health_watchers.remove(&info.name) {
        watcher.abort();
    }
    if let (None, Some(version)) = (refusal, version) {
        s.drivers.insert(
            info.name.clone(),
            Registered {
                endpoint: PathBuf::from(info.endpoint),
                version: version.to_owned(),
                supported_versions: info.supported_versions,
            },
        );
        if s.health_watch && kubelet.watches_health() {
            let watcher = tokio::spawn(watch_health(info.name.clone(), state.clone()));
            s.health_watchers.insert(info.name, watcher);
        }
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
        let server = serve_registration(std::os::unix::net::UnixListener::from(fd), &registry);
        kubelet
            .registered("late.example.com", Duration::from_secs(20))
            .await
            .expect("registered once it answers");
        server.abort();
    }

    /// Serves the registration of a DRA driver named after the socket of `listener` (bound and
    /// listening), as a driver does: kubelet's dial sends the socket path as `:authority`.
    fn serve_registration(
        listener: std::os::unix::net::UnixListener,
        registry: &Path,
    ) -> JoinHandle<Result<(), tonic::transport::Error>> {
        let path = listener
            .local_addr()
            .unwrap()
            .as_pathname()
            .unwrap()
            .to_owned();
        let plugin = Plugin {
            info: PluginInfo {
                r#type: PLUGIN_TYPE.into(),
                name: driver_of(&path),
                endpoint: registry.join("nowhere.sock").display().to_string(),
                supported_versions: vec![DRA_V1.into()],
            },
            answers: Arc::default(),
        };
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::UnixListener::from_std(listener).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(plugin))
                .serve_with_incoming(wdp_kubelet::authority::incoming(listener)),
        )
    }

    /// A driver restarting removes its registration socket and binds it again. ext4 gives the
    /// new socket the inode the old one had, and a loaded machine may not let kubelet look at
    /// the directory in between (here nothing is awaited between the two, so the stand-in's
    /// tasks cannot run): kubelet registers the driver again all the same, from the directory's
    /// inotify events, not from a comparison of what it finds.
    #[tokio::test]
    async fn a_socket_bound_again_at_once_is_registered_again() {
        let api = ApiServerStandIn::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let registry = dir.path().join("plugins_registry");
        std::fs::create_dir_all(&registry).unwrap();
        let path = registry.join("again.example.com-reg.sock");
        let bind = || std::os::unix::net::UnixListener::bind(&path).unwrap();
        let first = serve_registration(bind(), &registry);
        let kubelet = KubeletStandIn::start(&registry, &api, "node-a");
        kubelet
            .registered("again.example.com", Duration::from_secs(20))
            .await
            .expect("registered");
        assert_eq!(kubelet.registrations("again.example.com"), 1);

        // The first driver's process ends (its listening socket closed, the file left behind),
        // then the next one removes the file and binds again.
        first.abort();
        let _ = first.await;
        std::fs::remove_file(&path).unwrap();
        let second = serve_registration(bind(), &registry);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while kubelet.registrations("again.example.com") < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the socket bound again was not registered again within 20 s"
            );
            tokio::time::sleep(WATCH_INTERVAL).await;
        }
        second.abort();
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

    /// Every connection's bytes as a server read them, one buffer per connection.
    type Wires = Arc<Mutex<Vec<Arc<Mutex<Vec<u8>>>>>>;

    /// A server's connection that keeps a copy of every byte it reads.
    struct Tap {
        inner: tokio::net::UnixStream,
        wire: Arc<Mutex<Vec<u8>>>,
    }

    impl tokio::io::AsyncRead for Tap {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let before = buf.filled().len();
            let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
            let read = buf.filled()[before..].to_vec();
            self.wire.lock().unwrap().extend(read);
            polled
        }
    }

    impl tokio::io::AsyncWrite for Tap {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    impl tonic::transport::server::Connected for Tap {
        type ConnectInfo = ();

        fn connect_info(&self) -> Self::ConnectInfo {}
    }

    /// Serves `routes` on `socket` as wdp does (through the authority layer), keeping what each
    /// connection's client sent.
    fn serve_tapped(socket: &Path, routes: tonic::service::Routes) -> Wires {
        use futures::StreamExt;
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        let wires = Wires::default();
        let kept = wires.clone();
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener).map(move |c| {
            c.map(|inner| {
                let wire = Arc::default();
                kept.lock().unwrap().push(Arc::clone(&wire));
                wdp_kubelet::authority::Rewrite::inbound(Tap { inner, wire })
            })
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_routes(routes)
                .serve_with_incoming(incoming),
        );
        wires
    }

    /// The (`:authority`, `:path`) of every request the clients sent, decoded from their bytes.
    fn requests(wires: &Wires) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for wire in wires.lock().unwrap().iter() {
            let wire = wire.lock().unwrap();
            let mut rest = wire
                .strip_prefix(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".as_slice())
                .expect("HTTP/2's preface");
            let mut decoder = loona_hpack::Decoder::new();
            let mut block = Vec::new();
            while rest.len() >= 9 {
                let len =
                    usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
                let (kind, flags) = (rest[3], rest[4]);
                let Some(payload) = rest.get(9..9 + len) else {
                    break;
                };
                if kind == 0x1 || kind == 0x9 {
                    // No padding or priority: neither tonic nor grpc-go sends them.
                    block.extend_from_slice(payload);
                    if flags & 0x4 != 0 {
                        let fields = decoder.decode(&block).expect("HPACK");
                        let field = |n: &[u8]| {
                            let (_, v) = fields.iter().find(|(name, _)| name == n).unwrap();
                            String::from_utf8(v.clone()).unwrap()
                        };
                        out.insert((field(b":authority"), field(b":path")));
                        block.clear();
                    }
                }
                rest = &rest[9 + len..];
            }
        }
        out
    }

    #[tokio::test]
    async fn each_release_dials_registers_and_watches_health_as_that_kubelet_does() {
        use crate::registration::{Endpoints, Registrar, RegistrationStatusHandle};
        const DRIVER: &str = "gpu.example.com";
        for version in Version::ALL {
            let api = ApiServerStandIn::start().await.unwrap();
            let dir = tempfile::tempdir().unwrap();
            let endpoints = Endpoints {
                driver: DRIVER.into(),
                plugins_registry: dir.path().join("plugins_registry"),
                plugins: dir.path().join("plugins"),
                health: true,
            };
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
            let (_inventory, watched) =
                tokio::sync::watch::channel(crate::seam::Inventory { pools: vec![pool] });
            let checkpoint =
                crate::checkpoint::Checkpoint::open(dir.path().join("checkpoint.json")).unwrap();
            let service = crate::plugin::DraService::new(
                DRIVER,
                api.client(),
                watched,
                checkpoint,
                Duration::from_secs(60),
            );
            let dra = serve_tapped(&endpoints.dra_socket(), service.routes(&endpoints));
            let registrar = Registrar::new(&endpoints, RegistrationStatusHandle::default());
            let reg = serve_tapped(
                &endpoints.registration_socket(),
                tonic::service::Routes::new(registrar.into_service()),
            );
            let options = Options {
                version,
                resource_health_status: true,
                ..Options::default()
            };
            let kubelet =
                KubeletStandIn::start_with(&endpoints.plugins_registry, &api, "node-a", options);

            let registered = kubelet
                .registered(DRIVER, Duration::from_secs(10))
                .await
                .unwrap_or_else(|| panic!("{version}: registered"));
            let service = if version >= Version::V1_34 {
                DRA_V1
            } else {
                DRA_V1BETA1
            };
            assert_eq!(registered.version, service, "{version}");
            let gone = ClaimRef {
                namespace: "default".into(),
                uid: "no-such-uid".into(),
                name: "gone".into(),
            };
            let answer = kubelet.unprepare(DRIVER, &[gone]).await.unwrap();
            assert_eq!(answer["no-such-uid"], "", "{version}");
            // With the feature gate on, 1.34 and later keep the v1alpha1 stream open on their
            // own.
            let health = "/v1alpha1.DRAResourceHealth/NodeWatchResources";
            if version >= Version::V1_34 {
                let healthy = Some(health_v1alpha1::HealthStatus::Healthy);
                crate::testing::wait_for(|| {
                    kubelet.device_health(DRIVER, "node-a", "gpu-0") == healthy
                })
                .await;
                assert_eq!(kubelet.health_error(DRIVER), None, "{version}");
            } else {
                let e = kubelet.health(DRIVER).await.expect_err("no health client");
                assert_eq!(e.code(), tonic::Code::Unimplemented, "{version}");
            }

            let encoded = |path: &Path| {
                String::from_utf8(wdp_kubelet::authority::grpc_go_passthrough(path)).unwrap()
            };
            let registration = encoded(&endpoints.registration_socket());
            assert!(registration.starts_with("%2F"), "{registration}");
            let call = |authority: &str, path: &str| (authority.to_owned(), path.to_owned());
            assert_eq!(
                requests(&reg),
                BTreeSet::from([
                    call(&registration, "/pluginregistration.Registration/GetInfo"),
                    call(
                        &registration,
                        "/pluginregistration.Registration/NotifyRegistrationStatus"
                    ),
                ]),
                "{version}: the plugin watcher dials the bare path"
            );
            let (authority, service, watched) = if version >= Version::V1_34 {
                ("localhost".to_owned(), "v1", true)
            } else {
                (encoded(&endpoints.dra_socket()), "v1beta1", false)
            };
            let dra_calls = requests(&dra);
            assert!(
                dra_calls.iter().all(|(a, _)| *a == authority),
                "{version}: {dra_calls:?}"
            );
            let paths: Vec<&str> = dra_calls.iter().map(|(_, p)| p.as_str()).collect();
            let unprepare =
                format!("/k8s.io.kubelet.pkg.apis.dra.{service}.DRAPlugin/NodeUnprepareResources");
            assert!(paths.contains(&unprepare.as_str()), "{version}: {paths:?}");
            assert_eq!(paths.contains(&health), watched, "{version}: {paths:?}");
        }
    }
}
