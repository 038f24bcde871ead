//! Registration with kubelet's plugin watcher: the `pluginregistration.Registration` service on
//! `<plugins_registry>/<driver>-reg.sock`.
//!
//! kubelet finds the socket, calls GetInfo, checks the answer (type `DRAPlugin`, a driver name,
//! an endpoint, a service version it speaks), connects to the endpoint and reports the outcome
//! with NotifyRegistrationStatus. A refusal is the only news a driver gets that kubelet will not
//! call it, and no GetInfo at all the only sign that kubelet never found the socket (or that its
//! calls fail before they reach the service): both are kept ([`RegistrationState`]) for whoever
//! warns, reports readiness and decides what to publish. When kubelet restarts it scans the registry
//! directory again and registers every socket it finds; [`crate::socket::serve`] keeps the socket
//! there (binding it anew when it is removed, which starts a new registration).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use tonic::{Request, Response, Status};

use crate::proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::{Registration, RegistrationServer},
};

/// The plugin type kubelet routes to its DRA manager.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRAPlugin service, v1, as kubelet names it in `supported_versions`.
pub const DRA_V1: &str = "v1.DRAPlugin";
/// The DRAPlugin service, v1beta1.
pub const DRA_V1BETA1: &str = "v1beta1.DRAPlugin";
/// The device health service, v1: what kubelets after 1.36 prefer when PluginInfo lists it.
pub const HEALTH_V1: &str = "v1.DRAResourceHealth";
/// The device health service, v1alpha1: kubelet 1.34 to 1.36 open it on every driver whatever
/// PluginInfo lists (their ResourceHealthStatus gate on); later kubelets when it is listed and
/// v1 is not.
pub const HEALTH_V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";

/// Where a driver's sockets go and what it serves.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// The driver name (a DNS subdomain, as ResourceSlices name it).
    pub driver: String,
    /// kubelet's plugin registry directory (`/var/lib/kubelet/plugins_registry`).
    pub plugins_registry: PathBuf,
    /// kubelet's plugins directory (`/var/lib/kubelet/plugins`).
    pub plugins: PathBuf,
    /// Whether the DRA socket also serves `DRAResourceHealth`.
    pub health: bool,
}

impl Endpoints {
    /// `<plugins_registry>/<driver>-reg.sock`: the socket the plugin watcher finds.
    pub fn registration_socket(&self) -> PathBuf {
        self.plugins_registry
            .join(format!("{}-reg.sock", self.driver))
    }

    /// `<plugins>/<driver>/dra.sock`: the DRAPlugin (and health) socket kubelet calls.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugins.join(&self.driver).join("dra.sock")
    }

    /// The services advertised in GetInfo, newest first.
    pub fn supported_versions(&self) -> Vec<String> {
        let mut v = vec![DRA_V1.to_owned(), DRA_V1BETA1.to_owned()];
        if self.health {
            v.push(HEALTH_V1.to_owned());
            v.push(HEALTH_V1ALPHA1.to_owned());
        }
        v
    }
}

/// What kubelet last said about the registration.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum RegistrationState {
    /// Nothing from kubelet since the socket was (re)bound: not even GetInfo. A kubelet whose
    /// plugin watcher finds the socket calls it within about a second; one that never does is
    /// not watching this directory, or its calls fail before they reach the service (an HTTP/2
    /// error, in the transport's debug log).
    #[default]
    Pending,
    /// kubelet called GetInfo; its verdict (NotifyRegistrationStatus) has not come yet.
    Asked,
    /// kubelet registered the driver.
    Registered,
    /// kubelet refused the driver, with its reason.
    Refused(String),
}

/// The registration state, shared between the server and whoever reports readiness or acts on
/// a new registration (kubelet wipes a node's slices when it starts, then registers the driver
/// again: a caller that [`subscribe`](Self::subscribe)s can republish at once).
#[derive(Clone, Debug)]
pub struct RegistrationStatusHandle(Arc<watch::Sender<RegistrationState>>);

impl Default for RegistrationStatusHandle {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(RegistrationState::Pending)))
    }
}

impl RegistrationStatusHandle {
    /// What kubelet last said.
    pub fn get(&self) -> RegistrationState {
        self.0.borrow().clone()
    }

    /// Records `state` and tells the subscribers.
    pub fn set(&self, state: RegistrationState) {
        self.0.send_replace(state);
    }

    /// A receiver that sees every state recorded from now on.
    pub fn subscribe(&self) -> watch::Receiver<RegistrationState> {
        self.0.subscribe()
    }
}

/// The Registration service of one driver.
#[derive(Clone, Debug)]
pub struct Registrar {
    info: PluginInfo,
    status: RegistrationStatusHandle,
}

impl Registrar {
    /// The service for `endpoints`, recording kubelet's answers in `status`.
    pub fn new(endpoints: &Endpoints, status: RegistrationStatusHandle) -> Self {
        Self {
            info: PluginInfo {
                r#type: PLUGIN_TYPE.to_owned(),
                name: endpoints.driver.clone(),
                endpoint: path_string(&endpoints.dra_socket()),
                supported_versions: endpoints.supported_versions(),
            },
            status,
        }
    }

    /// The tonic service, to add to a router.
    pub fn into_service(self) -> RegistrationServer<Self> {
        RegistrationServer::new(self)
    }
}

fn path_string(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        tracing::debug!(driver = %self.info.name, "kubelet called GetInfo");
        // Only a first call changes anything: a registered driver asked again (a restarted
        // kubelet) stays registered until kubelet says otherwise.
        self.status.0.send_if_modified(|state| {
            let first = *state == RegistrationState::Pending;
            if first {
                *state = RegistrationState::Asked;
            }
            first
        });
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.info.name, "kubelet registered the DRA driver");
            self.status.set(RegistrationState::Registered);
        } else {
            // Logged by whoever follows the state, with what the refusal means for them.
            tracing::debug!(driver = %self.info.name, reason = %status.error, "kubelet refused the DRA driver");
            self.status.set(RegistrationState::Refused(status.error));
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::pluginregistration::registration_client::RegistrationClient;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn kubelet_gets_the_driver_and_its_answer_is_kept_across_a_removed_socket() {
        let dir = tempfile::tempdir().unwrap();
        let endpoints = Endpoints {
            driver: "gpu.example.com".into(),
            plugins_registry: dir.path().join("plugins_registry"),
            plugins: dir.path().join("plugins"),
            health: true,
        };
        let socket = endpoints.registration_socket();
        assert_eq!(
            socket,
            dir.path().join("plugins_registry/gpu.example.com-reg.sock")
        );
        let status = RegistrationStatusHandle::default();
        let routes =
            tonic::service::Routes::new(Registrar::new(&endpoints, status.clone()).into_service());
        let binds = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let counted = binds.clone();
        let reset = status.clone();
        let server = tokio::spawn(crate::socket::serve(
            socket.clone(),
            routes,
            Duration::from_millis(30),
            async {
                let _ = stopped.await;
            },
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                reset.set(RegistrationState::Pending);
            },
        ));

        // Dialled as kubelet's plugin watcher dials: the percent-encoded socket path as
        // `:authority`.
        crate::testing::wait_for(|| socket.exists()).await;
        let authority = wdp_kubelet::authority::grpc_go_passthrough(&socket);
        let channel = wdp_kubelet::transport::connect_with_authority(&socket, authority)
            .await
            .unwrap();
        let mut client = RegistrationClient::new(channel);
        let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "gpu.example.com");
        assert_eq!(
            info.endpoint,
            dir.path()
                .join("plugins/gpu.example.com/dra.sock")
                .to_str()
                .unwrap()
        );
        assert_eq!(
            info.supported_versions,
            [
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth"
            ]
        );

        assert_eq!(status.get(), RegistrationState::Asked, "GetInfo is heard");
        let mut news = status.subscribe();
        client
            .notify_registration_status(RegistrationStatus {
                plugin_registered: false,
                error: "driver name taken".into(),
            })
            .await
            .unwrap();
        assert_eq!(
            status.get(),
            RegistrationState::Refused("driver name taken".into())
        );
        client
            .notify_registration_status(RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(status.get(), RegistrationState::Registered);
        assert!(news.has_changed().unwrap(), "subscribers hear of it");
        assert_eq!(*news.borrow_and_update(), RegistrationState::Registered);

        // The socket is removed (as when kubelet's directory is cleaned): it comes back, and the
        // plugin watcher registers it anew.
        std::fs::remove_file(&socket).unwrap();
        crate::testing::wait_for(|| binds.load(Ordering::SeqCst) == 2 && socket.exists()).await;
        assert_eq!(status.get(), RegistrationState::Pending);
        let mut client = RegistrationClient::new(crate::testing::channel(&socket).await);
        let again = client.get_info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(again, info);

        // Another instance's socket at the path is not taken back, nor removed at shutdown.
        let elsewhere = dir.path().join("other.sock");
        let _other = std::os::unix::net::UnixListener::bind(&elsewhere).unwrap();
        std::fs::rename(&elsewhere, &socket).unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(
            binds.load(Ordering::SeqCst),
            2,
            "no new bind while another socket is there"
        );
        let _ = stop.send(());
        server.await.unwrap().unwrap();
        assert!(socket.exists(), "another instance's socket is left alone");
        std::fs::remove_file(&socket).unwrap();
    }

    #[test]
    fn without_health_the_health_service_is_not_advertised() {
        let endpoints = Endpoints {
            driver: "d.example.com".into(),
            plugins_registry: "/r".into(),
            plugins: "/p".into(),
            health: false,
        };
        assert_eq!(
            endpoints.supported_versions(),
            ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        );
        assert_eq!(
            endpoints.dra_socket(),
            Path::new("/p/d.example.com/dra.sock")
        );
    }
}
