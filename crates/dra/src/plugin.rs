//! The DRAPlugin service kubelet calls around a pod's containers (v1 and v1beta1, one
//! implementation), and the device health stream.
//!
//! kubelet sends only each claim's namespace, name and UID: the allocation is read from the API
//! server ([`ClaimSource`]). A claim whose UID differs was deleted and created again under the
//! same name (refused: the pod is for the old one); a claim without an allocation has nothing to
//! prepare yet (refused). The allocation's results for this driver are matched against the
//! inventory to find each device's CDI devices. What was prepared goes into the checkpoint before
//! the answer, so a repeated call (kubelet or driver restarted, a timeout) answers the same from
//! the checkpoint, and a device held by one claim is refused to another unless both share it
//! (`allowMultipleAllocations`, the allocator's `shareID`) or either has admin access.
//! Prepare and Unprepare run one at a time: they read and write one checkpoint.

use std::collections::BTreeMap;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{Mutex, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::apiserver::ClaimSource;
use crate::checkpoint::{Checkpoint, CheckpointError, PreparedClaim, PreparedDevice};
use crate::proto::{health_v1, health_v1alpha1};
use crate::registration::Endpoints;
use crate::seam::Inventory;

/// A claim as kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's UID: tells it from a later claim of the same name.
    pub uid: String,
    /// The claim's name.
    pub name: String,
}

/// The DRA service of one driver: prepare, unprepare, health.
pub struct DraService<C> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for DraService<C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<C> {
    driver: String,
    claims: C,
    inventory: watch::Receiver<Inventory>,
    /// Held for the whole of a Prepare or Unprepare: that is what serializes them.
    checkpoint: Mutex<Checkpoint>,
    health_refresh: Duration,
    /// Told how each write of the checkpoint went, once set.
    report: OnceLock<CheckpointReport>,
}

/// Told the outcome of each write of the checkpoint (its path, and the error when it failed):
/// the host turns it into `/readyz`, metrics and one log line per change, rather than a line per
/// refused claim while a disk stays full.
pub type CheckpointReport = Box<dyn Fn(&Path, Option<&CheckpointError>) + Send + Sync>;

/// The outcome of one claim's prepare: its devices or why not.
pub type PrepareOutcome = Result<Vec<PreparedDevice>, String>;

/// The request a device satisfies as kubelet matches it to containers: a subrequest of a
/// prioritized list (`gpu/large`) counts for its request (`gpu`).
fn base_request(request: &str) -> String {
    request.split('/').next().unwrap_or(request).to_owned()
}

impl<C: ClaimSource> DraService<C> {
    /// The service for `driver`, reading claims from `claims`, devices from `inventory`, and
    /// keeping prepared claims in `checkpoint`. The health stream repeats the full list every
    /// `health_refresh` (kubelet turns a device Unknown when it hears nothing for a while) and at
    /// every inventory change.
    pub fn new(
        driver: impl Into<String>,
        claims: C,
        inventory: watch::Receiver<Inventory>,
        checkpoint: Checkpoint,
        health_refresh: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                driver: driver.into(),
                claims,
                inventory,
                checkpoint: Mutex::new(checkpoint),
                health_refresh,
                report: OnceLock::new(),
            }),
        }
    }

    /// Tells `report` how each write of the checkpoint goes, instead of logging each failed one.
    /// Only the first report set is kept.
    pub fn report_checkpoint_to(&self, report: CheckpointReport) {
        let _ = self.inner.report.set(report);
    }

    /// Saves the checkpoint and reports how it went.
    fn save(&self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let saved = checkpoint.save();
        match self.inner.report.get() {
            Some(report) => report(checkpoint.path(), saved.as_ref().err()),
            None => {
                if let Err(e) = &saved {
                    tracing::error!(error = %e, "checkpoint not written");
                }
            }
        }
        saved
    }

    /// The gRPC services for the DRA socket: DRAPlugin v1 and v1beta1, and DRAResourceHealth
    /// (v1, and v1alpha1, the only one kubelet 1.34 to 1.36 open) when `endpoints` says it is served: the same value GetInfo advertises, so the two never
    /// disagree.
    pub fn routes(&self, endpoints: &Endpoints) -> Routes {
        let mut routes = Routes::new(
            crate::proto::dra_v1::dra_plugin_server::DraPluginServer::new(self.clone()),
        )
        .add_service(
            crate::proto::dra_v1beta1::dra_plugin_server::DraPluginServer::new(self.clone()),
        );
        if endpoints.health {
            routes = routes
                .add_service(
                    health_v1::dra_resource_health_server::DraResourceHealthServer::new(
                        self.clone(),
                    ),
                )
                .add_service(
                    health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                        self.clone(),
                    ),
                );
        }
        routes
    }

    /// The claims prepared now, by UID (what the checkpoint holds).
    pub async fn prepared(&self) -> BTreeMap<String, PreparedClaim> {
        self.inner.checkpoint.lock().await.claims().clone()
    }

    /// Prepares `claims`: one outcome per claim UID.
    ///
    /// Cancel-safe: kubelet going away mid-call (its connection closed, the call's deadline
    /// passed) drops this future at an await, while a claim is read from the API server. The
    /// claims are therefore prepared into a copy of the checkpoint, which replaces the kept one
    /// only once it is saved, after the last await: a dropped call leaves the checkpoint as it
    /// was, never holding in memory a claim that is not on disk (a later Prepare of that claim
    /// would answer it from memory, and a crash then lose it while kubelet runs its pod).
    pub async fn prepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<String, PrepareOutcome> {
        let mut checkpoint = self.inner.checkpoint.lock().await;
        let mut next = restore(&checkpoint, checkpoint.claims().clone());
        let mut out = BTreeMap::new();
        let mut added = Vec::new();
        for claim in claims {
            if let Some(done) = next.get(&claim.uid) {
                out.insert(claim.uid.clone(), Ok(done.devices.clone()));
                continue;
            }
            match self.prepare_one(&next, &claim).await {
                Ok(prepared) => {
                    out.insert(claim.uid.clone(), Ok(prepared.devices.clone()));
                    next.insert(claim.uid.clone(), prepared);
                    added.push(claim.uid);
                }
                Err(e) => {
                    tracing::warn!(namespace = %claim.namespace, claim = %claim.name, uid = %claim.uid, error = %e, "claim not prepared");
                    out.insert(claim.uid, Err(e));
                }
            }
        }
        if added.is_empty() {
            return out;
        }
        match self.save(&next) {
            Ok(()) => *checkpoint = next,
            Err(e) => {
                // Nothing is prepared that is not durable: the kept checkpoint stays as it was,
                // and kubelet retries.
                for uid in added {
                    out.insert(uid, Err(format!("checkpoint not written: {e}")));
                }
            }
        }
        out
    }

    async fn prepare_one(
        &self,
        checkpoint: &Checkpoint,
        claim: &ClaimRef,
    ) -> Result<PreparedClaim, String> {
        let who = format!("{}/{}", claim.namespace, claim.name);
        let found = self
            .inner
            .claims
            .get_claim(&claim.namespace, &claim.name)
            .await
            .map_err(|e| format!("reading claim {who}: {e}"))?
            .ok_or_else(|| format!("claim {who} does not exist"))?;
        let uid = found.metadata.uid.as_deref().unwrap_or_default();
        if uid != claim.uid {
            return Err(format!(
                "claim {who} has UID {uid}, not {}: it was replaced",
                claim.uid
            ));
        }
        let results = found
            .status
            .and_then(|s| s.allocation)
            .ok_or_else(|| format!("claim {who} is not allocated"))?
            .devices
            .and_then(|d| d.results)
            .unwrap_or_default();
        let inventory = self.inner.inventory.borrow().clone();
        let mut devices: Vec<PreparedDevice> = Vec::new();
        for result in results
            .into_iter()
            .filter(|r| r.driver == self.inner.driver)
        {
            let device = inventory
                .device(&result.pool, &result.device)
                .ok_or_else(|| {
                    format!(
                        "device {}/{} of claim {who} is not one this driver serves here",
                        result.pool, result.device
                    )
                })?;
            if let Some(why) = &device.unavailable {
                return Err(format!(
                    "device {}/{} of claim {who} cannot be prepared now: {why}",
                    result.pool, result.device
                ));
            }
            let prepared = PreparedDevice {
                request_names: vec![base_request(&result.request)],
                pool: result.pool.clone(),
                device: result.device.clone(),
                cdi_device_ids: device.cdi_device_ids.clone(),
                admin_access: result.admin_access == Some(true),
                shared: result.share_id.is_some(),
            };
            for (other_uid, other) in checkpoint.claims() {
                let clash = other.devices.iter().any(|held| {
                    held.pool == prepared.pool
                        && held.device == prepared.device
                        && !compatible(held, &prepared)
                });
                if clash && other_uid != &claim.uid {
                    return Err(format!(
                        "device {}/{} is held by claim {}/{} (UID {other_uid})",
                        prepared.pool, prepared.device, other.namespace, other.name
                    ));
                }
            }
            devices.push(prepared);
        }
        Ok(PreparedClaim {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            devices,
        })
    }

    /// Unprepares `claims`: one outcome per claim UID; an unknown claim (never prepared here,
    /// already unprepared, deleted) has nothing to undo and succeeds.
    pub async fn unprepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<String, Result<(), String>> {
        let mut checkpoint = self.inner.checkpoint.lock().await;
        let before = checkpoint.claims().clone();
        let mut removed = Vec::new();
        let mut out = BTreeMap::new();
        for claim in claims {
            if checkpoint.remove(&claim.uid) {
                removed.push(claim.uid.clone());
            }
            out.insert(claim.uid, Ok(()));
        }
        if !removed.is_empty()
            && let Err(e) = self.save(&checkpoint)
        {
            *checkpoint = restore(&checkpoint, before);
            for uid in removed {
                out.insert(uid, Err(format!("checkpoint not written: {e}")));
            }
        }
        out
    }

    /// The health of every device of the inventory now.
    pub fn health(&self) -> health_v1::NodeWatchResourcesResponse {
        health_of(&self.inner.inventory.borrow())
    }
}

/// Whether two allocations of one device may be prepared together: either has admin access, or
/// both are shares of a device that allows multiple allocations.
fn compatible(a: &PreparedDevice, b: &PreparedDevice) -> bool {
    a.admin_access || b.admin_access || (a.shared && b.shared)
}

/// A checkpoint at the same path holding `claims`: a copy to change before it is saved, or the
/// state before a failed save.
fn restore(checkpoint: &Checkpoint, claims: BTreeMap<String, PreparedClaim>) -> Checkpoint {
    let mut fresh = Checkpoint::empty(checkpoint.path().to_path_buf());
    for (uid, claim) in claims {
        fresh.insert(uid, claim);
    }
    fresh
}

fn health_of(inventory: &Inventory) -> health_v1::NodeWatchResourcesResponse {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or_default();
    let devices = inventory
        .pools
        .iter()
        .flat_map(|pool| {
            pool.devices.iter().map(move |d| health_v1::DeviceHealth {
                device: Some(health_v1::DeviceIdentifier {
                    pool_name: pool.name.clone(),
                    device_name: d.name(),
                }),
                health: if d.healthy {
                    health_v1::HealthStatus::Healthy
                } else {
                    health_v1::HealthStatus::Unhealthy
                } as i32,
                last_updated_time: now,
                health_check_timeout_seconds: 0,
                message: d.health_message.chars().take(1024).collect(),
            })
        })
        .collect();
    health_v1::NodeWatchResourcesResponse { devices }
}

/// One implementation behind both versions of DRAPlugin: their messages are the same on the
/// wire and differ only in their Rust paths.
macro_rules! dra_plugin_version {
    ($version:ident) => {
        impl From<crate::proto::$version::Claim> for ClaimRef {
            fn from(c: crate::proto::$version::Claim) -> Self {
                ClaimRef {
                    namespace: c.namespace,
                    uid: c.uid,
                    name: c.name,
                }
            }
        }

        #[tonic::async_trait]
        impl<C: ClaimSource> crate::proto::$version::dra_plugin_server::DraPlugin
            for DraService<C>
        {
            async fn node_prepare_resources(
                &self,
                request: Request<crate::proto::$version::NodePrepareResourcesRequest>,
            ) -> Result<Response<crate::proto::$version::NodePrepareResourcesResponse>, Status>
            {
                use crate::proto::$version as api;
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(ClaimRef::from)
                    .collect();
                let claims = self
                    .prepare(claims)
                    .await
                    .into_iter()
                    .map(|(uid, outcome)| {
                        let answer = match outcome {
                            Ok(devices) => api::NodePrepareResourceResponse {
                                devices: devices
                                    .into_iter()
                                    .map(|d| api::Device {
                                        request_names: d.request_names,
                                        pool_name: d.pool,
                                        device_name: d.device,
                                        cdi_device_ids: d.cdi_device_ids,
                                    })
                                    .collect(),
                                error: String::new(),
                            },
                            Err(error) => api::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, answer)
                    })
                    .collect();
                Ok(Response::new(api::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<crate::proto::$version::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<crate::proto::$version::NodeUnprepareResourcesResponse>, Status>
            {
                use crate::proto::$version as api;
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(ClaimRef::from)
                    .collect();
                let claims = self
                    .unprepare(claims)
                    .await
                    .into_iter()
                    .map(|(uid, outcome)| {
                        (
                            uid,
                            api::NodeUnprepareResourceResponse {
                                error: outcome.err().unwrap_or_default(),
                            },
                        )
                    })
                    .collect();
                Ok(Response::new(api::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

dra_plugin_version!(dra_v1);
dra_plugin_version!(dra_v1beta1);

impl<C: ClaimSource> DraService<C> {
    /// The health stream both API versions serve: the full list now, then at every inventory
    /// change and every refresh, until kubelet hangs up.
    fn health_stream(
        &self,
    ) -> ReceiverStream<Result<health_v1::NodeWatchResourcesResponse, Status>> {
        let mut inventory = self.inner.inventory.clone();
        let refresh = self.inner.health_refresh;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let message = health_of(&inventory.borrow_and_update());
                if tx.send(Ok(message)).await.is_err() {
                    return; // kubelet hung up
                }
                tokio::select! {
                    changed = inventory.changed() => if changed.is_err() { return },
                    () = tokio::time::sleep(refresh) => {}
                    () = tx.closed() => return,
                }
            }
        });
        ReceiverStream::new(rx)
    }
}

#[tonic::async_trait]
impl<C: ClaimSource> health_v1::dra_resource_health_server::DraResourceHealth for DraService<C> {
    type NodeWatchResourcesStream = Pin<
        Box<
            dyn futures::Stream<Item = Result<health_v1::NodeWatchResourcesResponse, Status>>
                + Send,
        >,
    >;

    async fn node_watch_resources(
        &self,
        _: Request<health_v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(Box::pin(self.health_stream())))
    }
}

/// v1alpha1: v1's messages without `message`.
#[tonic::async_trait]
impl<C: ClaimSource> health_v1alpha1::dra_resource_health_server::DraResourceHealth
    for DraService<C>
{
    type NodeWatchResourcesStream = Pin<
        Box<
            dyn futures::Stream<Item = Result<health_v1alpha1::NodeWatchResourcesResponse, Status>>
                + Send,
        >,
    >;

    async fn node_watch_resources(
        &self,
        _: Request<health_v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        use futures::StreamExt;
        let stream = self
            .health_stream()
            .map(|message| message.map(v1alpha1_health));
        Ok(Response::new(Box::pin(stream)))
    }
}

/// A v1 health message as v1alpha1 carries it (the same fields, less `message`).
fn v1alpha1_health(
    message: health_v1::NodeWatchResourcesResponse,
) -> health_v1alpha1::NodeWatchResourcesResponse {
    let devices = message
        .devices
        .into_iter()
        .map(|d| health_v1alpha1::DeviceHealth {
            device: d.device.map(|id| health_v1alpha1::DeviceIdentifier {
                pool_name: id.pool_name,
                device_name: id.device_name,
            }),
            health: d.health,
            last_updated_time: d.last_updated_time,
            health_check_timeout_seconds: d.health_check_timeout_seconds,
        })
        .collect();
    health_v1alpha1::NodeWatchResourcesResponse { devices }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::standin::{ApiServerStandIn, allocated_claim};
    use crate::proto::{dra_v1, dra_v1beta1};
    use crate::seam::{Device, Pool};
    use k8s_openapi::api::resource::v1::ResourceClaim;
    use std::path::{Path, PathBuf};

    const DRIVER: &str = "gpu.example.com";

    fn device(id: &str, shared: bool) -> Device {
        Device {
            id: id.into(),
            dev_type: "gpu".into(),
            healthy: true,
            cdi_device_ids: vec![format!("example.com/gpu={id}")],
            allow_multiple_allocations: shared,
            ..Default::default()
        }
    }

    fn inventory() -> Inventory {
        Inventory {
            pools: vec![Pool {
                name: "node-a".into(),
                node_name: "node-a".into(),
                devices: vec![
                    device("gpu-0", false),
                    device("gpu-1", false),
                    device("GPU2", false),
                    device("shared-0", true),
                ],
            }],
        }
    }

    /// A claim as the scheduler leaves it: `results` as (request, device, shared), and another
    /// driver's device in the same claim (not ours).
    fn claim(name: &str, results: &[(&str, &str, bool)]) -> ResourceClaim {
        let mut all: Vec<(&str, &str)> = results.iter().map(|(r, d, _)| (*r, *d)).collect();
        all.push(("nic", "nic-0"));
        let mut claim = allocated_claim("ns", name, DRIVER, "node-a", &all);
        let allocated = claim
            .status
            .as_mut()
            .and_then(|s| s.allocation.as_mut())
            .and_then(|a| a.devices.as_mut())
            .and_then(|d| d.results.as_mut())
            .expect("allocated_claim gives results");
        for (result, (_, _, shared)) in allocated.iter_mut().zip(results) {
            result.share_id = shared.then(|| format!("share-{name}"));
        }
        if let Some(nic) = allocated.last_mut() {
            nic.driver = "nic.example.com".into();
        }
        claim
    }

    fn uid(c: &ResourceClaim) -> String {
        c.metadata.uid.clone().unwrap()
    }

    fn v1_claim(c: &ResourceClaim) -> dra_v1::Claim {
        dra_v1::Claim {
            namespace: c.metadata.namespace.clone().unwrap(),
            uid: uid(c),
            name: c.metadata.name.clone().unwrap(),
        }
    }

    struct Running {
        socket: PathBuf,
        stop: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<Result<(), crate::socket::SocketError>>,
    }

    fn start(
        server: &ApiServerStandIn,
        inventory: watch::Receiver<Inventory>,
        dir: &Path,
        name: &str,
    ) -> Running {
        let checkpoint = Checkpoint::open(dir.join("checkpoint.json")).unwrap();
        let service = DraService::new(
            DRIVER,
            server.client(),
            inventory,
            checkpoint,
            Duration::from_millis(100),
        );
        let socket = dir.join(name);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(crate::socket::serve(
            socket.clone(),
            service.routes(&Endpoints {
                driver: DRIVER.into(),
                plugins_registry: dir.join("registry"),
                plugins: dir.to_path_buf(),
                health: true,
            }),
            Duration::from_secs(1),
            async {
                let _ = stopped.await;
            },
            || {},
        ));
        Running { socket, stop, task }
    }

    async fn v1(
        socket: &Path,
    ) -> dra_v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
        crate::testing::wait_for(|| socket.exists()).await;
        dra_v1::dra_plugin_client::DraPluginClient::new(crate::testing::channel(socket).await)
    }

    async fn prepare(
        client: &mut dra_v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
        claims: Vec<dra_v1::Claim>,
    ) -> BTreeMap<String, dra_v1::NodePrepareResourceResponse> {
        client
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims })
            .await
            .unwrap()
            .into_inner()
            .claims
            .into_iter()
            .collect()
    }

    #[tokio::test]
    async fn claims_are_prepared_once_refused_when_wrong_and_unprepared() {
        let server = ApiServerStandIn::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (_tx, rx) = watch::channel(inventory());
        let running = start(&server, rx.clone(), dir.path(), "dra.sock");
        let mut client = v1(&running.socket).await;

        // Two containers' requests (as the scheduler's extended-resource claim names them), each its own device; a
        // subrequest of a prioritized list counts for its request.
        let gpu2 = crate::names::device_name("GPU2");
        let pod = server.insert_claim(claim(
            "pod",
            &[
                ("container-0", "gpu-0", false),
                ("container-1/large", &gpu2, false),
            ],
        ));
        let answer = prepare(&mut client, vec![v1_claim(&pod)]).await;
        let entry = &answer[&uid(&pod)];
        assert_eq!(entry.error, "");
        assert_eq!(
            entry.devices,
            [
                dra_v1::Device {
                    request_names: vec!["container-0".into()],
                    pool_name: "node-a".into(),
                    device_name: "gpu-0".into(),
                    cdi_device_ids: vec!["example.com/gpu=gpu-0".into()],
                },
                dra_v1::Device {
                    request_names: vec!["container-1".into()],
                    pool_name: "node-a".into(),
                    device_name: gpu2.clone(),
                    cdi_device_ids: vec!["example.com/gpu=GPU2".into()],
                },
            ]
        );
        // Again, and through v1beta1 as kubelet 1.33 calls it (dialling the bare socket path:
        // the percent-encoded path as `:authority`): the same answer.
        assert_eq!(prepare(&mut client, vec![v1_claim(&pod)]).await, answer);
        let authority = wdp_kubelet::authority::grpc_go_passthrough(&running.socket);
        let channel = wdp_kubelet::transport::connect_with_authority(&running.socket, authority)
            .await
            .unwrap();
        let mut beta = dra_v1beta1::dra_plugin_client::DraPluginClient::new(channel);
        let via_beta = beta
            .node_prepare_resources(dra_v1beta1::NodePrepareResourcesRequest {
                claims: vec![dra_v1beta1::Claim {
                    namespace: "ns".into(),
                    uid: uid(&pod),
                    name: "pod".into(),
                }],
            })
            .await
            .unwrap()
            .into_inner();
        let beta_devices: Vec<_> = via_beta.claims[&uid(&pod)]
            .devices
            .iter()
            .map(|d| {
                (
                    d.device_name.clone(),
                    d.request_names.clone(),
                    d.cdi_device_ids.clone(),
                )
            })
            .collect();
        let v1_devices: Vec<_> = entry
            .devices
            .iter()
            .map(|d| {
                (
                    d.device_name.clone(),
                    d.request_names.clone(),
                    d.cdi_device_ids.clone(),
                )
            })
            .collect();
        assert_eq!(beta_devices, v1_devices);

        // A device held by another claim; a replaced claim; an unallocated one; a missing one.
        let thief = server.insert_claim(claim("thief", &[("gpu", "gpu-0", false)]));
        let old = server.insert_claim(claim("replaced", &[("gpu", "gpu-1", false)]));
        let mut again = claim("replaced", &[("gpu", "gpu-1", false)]);
        again.metadata.uid = None;
        server.insert_claim(again);
        let mut pending = claim("pending", &[]);
        pending.status = None;
        let pending = server.insert_claim(pending);
        let missing = dra_v1::Claim {
            namespace: "ns".into(),
            uid: "no-such-uid".into(),
            name: "missing".into(),
        };
        let answer = prepare(
            &mut client,
            vec![
                v1_claim(&thief),
                v1_claim(&old),
                v1_claim(&pending),
                missing,
            ],
        )
        .await;
        assert_eq!(answer.len(), 4);
        let error = |u: &str| answer[u].error.clone();
        assert!(
            error(&uid(&thief)).contains("is held by claim ns/pod"),
            "{}",
            error(&uid(&thief))
        );
        assert!(
            error(&uid(&old)).contains("it was replaced"),
            "{}",
            error(&uid(&old))
        );
        assert!(
            error(&uid(&pending)).contains("not allocated"),
            "{}",
            error(&uid(&pending))
        );
        assert!(
            error("no-such-uid").contains("does not exist"),
            "{}",
            error("no-such-uid")
        );

        // Two shares of a device that allows multiple allocations are both prepared.
        let a = server.insert_claim(claim("share-a", &[("gpu", "shared-0", true)]));
        let b = server.insert_claim(claim("share-b", &[("gpu", "shared-0", true)]));
        let answer = prepare(&mut client, vec![v1_claim(&a), v1_claim(&b)]).await;
        assert_eq!(answer[&uid(&a)].error, "");
        assert_eq!(answer[&uid(&b)].error, "");

        // Unprepare: an unknown claim succeeds; once the pod's claim is unprepared its device is
        // free for the other.
        let answer = client
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
                claims: vec![
                    v1_claim(&pod),
                    dra_v1::Claim {
                        namespace: "ns".into(),
                        uid: "never-prepared".into(),
                        name: "gone".into(),
                    },
                ],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.claims.len(), 2);
        assert!(answer.claims.values().all(|c| c.error.is_empty()));
        let answer = prepare(&mut client, vec![v1_claim(&thief)]).await;
        assert_eq!(answer[&uid(&thief)].error, "");
        let _ = running.stop.send(());
        running.task.await.unwrap().unwrap();
        assert!(
            !running.socket.exists(),
            "the socket is removed at shutdown"
        );
    }

    #[tokio::test]
    async fn a_restarted_driver_answers_from_its_checkpoint() {
        let server = ApiServerStandIn::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (_tx, rx) = watch::channel(inventory());
        let first = start(&server, rx.clone(), dir.path(), "dra.sock");
        let pod = server.insert_claim(claim("pod", &[("gpu", "gpu-0", false)]));
        let answer = prepare(&mut v1(&first.socket).await, vec![v1_claim(&pod)]).await;
        assert_eq!(answer[&uid(&pod)].error, "");
        let _ = first.stop.send(());
        first.task.await.unwrap().unwrap();

        // The driver comes back; the claim is no longer readable (the API server is behind, or
        // the claim is being deleted): the checkpoint answers, and the device stays held.
        server.delete_claim("ns", "pod");
        let second = start(&server, rx, dir.path(), "dra.sock");
        let mut client = v1(&second.socket).await;
        assert_eq!(prepare(&mut client, vec![v1_claim(&pod)]).await, answer);
        let thief = server.insert_claim(claim("thief", &[("gpu", "gpu-0", false)]));
        let refused = prepare(&mut client, vec![v1_claim(&thief)]).await;
        assert!(refused[&uid(&thief)].error.contains("held by"));
        let _ = second.stop.send(());
        second.task.await.unwrap().unwrap();
    }

    fn direct(
        server: &ApiServerStandIn,
        checkpoint: Checkpoint,
    ) -> DraService<crate::apiserver::client::ApiClient> {
        let (_tx, rx) = watch::channel(inventory());
        DraService::new(
            DRIVER,
            server.client(),
            rx,
            checkpoint,
            Duration::from_secs(1),
        )
    }

    fn claim_ref(c: &ResourceClaim) -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            uid: uid(c),
            name: c.metadata.name.clone().unwrap(),
        }
    }

    #[tokio::test]
    async fn concurrent_prepares_of_one_device_give_it_to_one_claim() {
        let server = ApiServerStandIn::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let service = direct(
            &server,
            Checkpoint::open(dir.path().join("cp.json")).unwrap(),
        );
        for round in 0..10 {
            let a = server.insert_claim(claim(&format!("a{round}"), &[("gpu", "gpu-1", false)]));
            let b = server.insert_claim(claim(&format!("b{round}"), &[("gpu", "gpu-1", false)]));
            // Each call reads its claim over HTTP before it decides: without serialization both
            // would see the device free.
            let (ra, rb) = tokio::join!(
                service.prepare(vec![claim_ref(&a)]),
                service.prepare(vec![claim_ref(&b)])
            );
            let won = [ra[&uid(&a)].is_ok(), rb[&uid(&b)].is_ok()];
            assert_eq!(
                won.iter().filter(|w| **w).count(),
                1,
                "round {round}: {ra:?} {rb:?}"
            );
            service.unprepare(vec![claim_ref(&a), claim_ref(&b)]).await;
        }
    }

    #[tokio::test]
    async fn a_prepare_dropped_midway_leaves_the_checkpoint_as_it_was() {
        let server = ApiServerStandIn::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cp.json");
        let service = direct(&server, Checkpoint::open(&path).unwrap());
        let a = server.insert_claim(claim("a", &[("gpu", "gpu-0", false)]));
        let b = server.insert_claim(claim("b", &[("gpu", "gpu-1", false)]));
        // The call stops at its read of b, a prepared by then; it is dropped there, as when
        // kubelet goes away.
        server.hold_claim_read("ns", "b");
        tokio::select! {
            answer = service.prepare(vec![claim_ref(&a), claim_ref(&b)]) => {
                panic!("answered while b's read is held: {answer:?}")
            }
            () = crate::testing::wait_for(|| server.claim_reads_held() == 1) => {}
        }
        assert!(
            service.prepared().await.is_empty(),
            "nothing kept in memory"
        );
        // a alone: prepared now, and on disk when answered.
        let alone = service.prepare(vec![claim_ref(&a)]).await;
        assert!(alone[&uid(&a)].is_ok(), "{alone:?}");
        let on_disk = Checkpoint::open(&path).unwrap();
        assert_eq!(on_disk.claims().keys().collect::<Vec<_>>(), [&uid(&a)]);
        server.release_claim_reads();
    }

    #[tokio::test]
    async fn nothing_is_prepared_that_the_checkpoint_does_not_hold() {
        let server = ApiServerStandIn::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        // The checkpoint's directory cannot be created: a file is in the way.
        std::fs::write(dir.path().join("blocked"), b"").unwrap();
        let service = direct(
            &server,
            Checkpoint::empty(dir.path().join("blocked/cp.json")),
        );
        let pod = server.insert_claim(claim("pod", &[("gpu", "gpu-0", false)]));
        let answer = service.prepare(vec![claim_ref(&pod)]).await;
        let error = answer[&uid(&pod)].clone().unwrap_err();
        assert!(error.contains("checkpoint not written"), "{error}");
        assert!(service.prepared().await.is_empty());
    }

    #[tokio::test]
    async fn a_device_whose_cdi_spec_is_not_on_disk_fails_its_claim_until_it_is() {
        let server = ApiServerStandIn::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut unwritten = inventory();
        unwritten.pools[0].devices[0].unavailable =
            Some("its CDI spec could not be written".into());
        let (tx, rx) = watch::channel(unwritten);
        let service = DraService::new(
            DRIVER,
            server.client(),
            rx,
            Checkpoint::open(dir.path().join("cp.json")).unwrap(),
            Duration::from_secs(1),
        );
        let pod = server.insert_claim(claim("pod", &[("gpu", "gpu-0", false)]));
        let error = service.prepare(vec![claim_ref(&pod)]).await[&uid(&pod)]
            .clone()
            .unwrap_err();
        assert!(
            error.contains("cannot be prepared now: its CDI spec could not be written"),
            "{error}"
        );
        assert!(service.prepared().await.is_empty());
        tx.send_replace(inventory());
        let devices = service.prepare(vec![claim_ref(&pod)]).await[&uid(&pod)]
            .clone()
            .unwrap();
        assert_eq!(devices[0].cdi_device_ids, ["example.com/gpu=gpu-0"]);
    }

    #[tokio::test]
    async fn the_health_stream_follows_the_inventory() {
        use health_v1::dra_resource_health_client::DraResourceHealthClient;
        let server = ApiServerStandIn::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = watch::channel(inventory());
        let running = start(&server, rx, dir.path(), "dra.sock");
        crate::testing::wait_for(|| running.socket.exists()).await;
        let mut client =
            DraResourceHealthClient::new(crate::testing::channel(&running.socket).await);
        let mut stream = client
            .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
        let first = stream.message().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 4, "the full list");
        assert!(
            first
                .devices
                .iter()
                .all(|d| d.health == health_v1::HealthStatus::Healthy as i32)
        );

        tx.send_modify(|inv| {
            let d = &mut inv.pools[0].devices[1];
            d.healthy = false;
            d.health_message = "link down".into();
        });
        loop {
            let m = stream.message().await.unwrap().unwrap();
            let gpu1 = m
                .devices
                .iter()
                .find(|d| d.device.as_ref().unwrap().device_name == "gpu-1")
                .unwrap();
            if gpu1.health == health_v1::HealthStatus::Unhealthy as i32 {
                assert_eq!(gpu1.message, "link down");
                assert_eq!(m.devices.len(), 4, "still the full list");
                break;
            }
        }
        // v1alpha1, which kubelet 1.34 to 1.36 open: the same list, without the messages.
        let mut alpha = health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
            crate::testing::channel(&running.socket).await,
        );
        let m = alpha
            .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
            .await
            .unwrap()
            .into_inner()
            .message()
            .await
            .unwrap()
            .unwrap();
        let healths: Vec<(String, i32)> = m
            .devices
            .iter()
            .map(|d| (d.device.clone().unwrap().device_name, d.health))
            .collect();
        let unhealthy = health_v1alpha1::HealthStatus::Unhealthy as i32;
        assert_eq!(healths.len(), 4);
        assert!(
            healths.contains(&("gpu-1".into(), unhealthy)),
            "{healths:?}"
        );
        let _ = running.stop.send(());
        running.task.await.unwrap().unwrap();
    }
}
