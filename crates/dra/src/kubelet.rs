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
//!   gave, with kubelet's 45 s timeout, through the service version it picked, and opens the
//!   `NodeWatchResources` health stream of a driver that advertised `v1.DRAResourceHealth`.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::apiserver::standin::ApiServerStandIn;
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
}

/// The stand-in; its watcher stops when it is dropped.
pub struct KubeletStandIn {
    state: Arc<Mutex<State>>,
    watcher: JoinHandle<()>,
}

impl Drop for KubeletStandIn {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl KubeletStandIn {
    /// Starts kubelet on `node`: wipes the node's slices in `api`, then watches `registry`.
    pub fn start(registry: &Path, api: &ApiServerStandIn, node: &str) -> Self {
        Self::start_refusing(registry, api, node, None)
    }

    /// [`KubeletStandIn::start`], refusing every registration with `reason` when it is set (as
    /// kubelet refuses a driver name already registered, or a version it does not speak).
    pub fn start_refusing(
        registry: &Path,
        api: &ApiServerStandIn,
        node: &str,
        reason: Option<String>,
    ) -> Self {
        api.wipe_slices(Some(node), None);
        let state = Arc::new(Mutex::new(State {
            refuse: reason,
            ..State::default()
        }));
        let watcher = tokio::spawn(watch(registry.to_path_buf(), state.clone()));
        Self { state, watcher }
    }

    /// Stops the watcher: the stand-in keeps what it registered but sees nothing new.
    pub fn stop(self) {}

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
        let plugin = self.driver(driver)?;
        let channel = connect(&plugin.endpoint).await?;
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
        let plugin = self.driver(driver)?;
        let channel = connect(&plugin.endpoint).await?;
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
async fn watch(registry: PathBuf, state: Arc<Mutex<State>>) {
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
            s.drivers.remove(&driver);
        }
        for (path, id) in new {
            // Marked seen even when it fails: kubelet retries only on a new socket event.
            lock(&state).seen.insert(path.clone(), id);
            if let Err(e) = register(&path, &state).await {
                tracing::warn!(socket = %path.display(), error = %e, "DRA registration failed");
            }
        }
        tokio::time::sleep(WATCH_INTERVAL).await;
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
