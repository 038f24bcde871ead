//! One kubelet device-plugin server per resource `<namespace>/<dev-type>`.
//!
//! [`ResourceServer::start`] spawns the task that owns the resource's socket. The task serves, then
//! registers with kubelet (retrying while kubelet is absent: it waits for `kubelet.sock` to appear
//! or to accept connections rather than sleeping; a registration kubelet answers with an error is
//! logged with kubelet's reason, reported, and retried with a backoff), then waits. When kubelet
//! restarts (its socket is recreated) or our socket is deleted (kubelet's cleanup), it serves again
//! and re-registers at once. When the stream ends because kubelet stopped (its socket, which a
//! stopping kubelet leaves in place, refuses connections), it waits for the next kubelet and
//! registers once. When kubelet's ListAndWatch stream ends while both sides keep running (same
//! socket, `kubelet.sock` still accepting), it
//! registers again at once, with a backoff if that keeps happening: kubelet has then marked every
//! device unhealthy and stopped the endpoint, calls ListAndWatch on it never again, and drops the
//! resource after 5 minutes (`endpointStopGracePeriod`); only a new registration replaces the
//! endpoint. Stopping cancels the task, which ends every stream, removes the socket and leaves
//! nothing behind, whatever state it was in.
//!
//! One concept per file: what a resource answers kubelet ([`ResourcePlugin`], `plugin.rs`), what a
//! server reports about itself ([`ServerReport`], `report.rs`), the registration state machine
//! (`lifecycle.rs`), the gRPC service (`service.rs`). A server knows nothing of what it serves: its
//! owner (wdp's manager) implements both traits. The names a server derives (endpoint, socket path)
//! are [`crate::names::Resource`]'s.
//!
//! Device updates never wait on kubelet: they replace the value in a `watch` channel, so a slow or
//! absent consumer sees only the latest list, and each ListAndWatch stream is its own consumer.

mod lifecycle;
mod plugin;
mod report;
mod service;

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::dir::PluginDir;
use crate::names::Resource;

use self::lifecycle::{Streams, lifecycle};
pub use self::plugin::{ResourcePlugin, not_advertised};
pub use self::report::ServerReport;
use self::service::PluginService;

/// The plugin directory, watched, and kubelet's registration socket in it: where every server of
/// a host puts its socket and whom it registers with.
pub struct PluginSockets {
    /// The watched plugin directory (normally `/var/lib/kubelet/device-plugins`).
    pub dir: PluginDir,
    /// kubelet's registration socket (`kubelet.sock` in `dir`).
    pub socket: PathBuf,
}

impl PluginSockets {
    /// True when `name`, a file in the plugin directory, is kubelet's registration socket.
    fn is_socket(&self, name: &str) -> bool {
        self.socket.file_name().is_some_and(|n| n == name)
    }
}

/// A resource's devices as its owner gave them, with their ListAndWatch list encoded once for
/// every stream ([`ResourcePlugin::list`]).
pub(crate) struct Listed<D> {
    pub(crate) devices: Arc<D>,
    pub(crate) list: Bytes,
}

// By hand: a derive would ask `D: Clone`.
impl<D> Clone for Listed<D> {
    fn clone(&self) -> Self {
        Listed {
            devices: self.devices.clone(),
            list: self.list.clone(),
        }
    }
}

impl<D> Listed<D> {
    fn of<P: ResourcePlugin<Devices = D>>(plugin: &P, devices: Arc<D>) -> Self {
        Listed {
            list: plugin.list(&devices),
            devices,
        }
    }
}

/// A running resource server, answering with `P`. Dropping it without [`ResourceServer::stop`]
/// also stops it.
pub struct ResourceServer<P: ResourcePlugin> {
    resource: Resource,
    plugin: Arc<P>,
    devices: watch::Sender<Listed<P::Devices>>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl<P: ResourcePlugin> Drop for ResourceServer<P> {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl<P: ResourcePlugin> ResourceServer<P> {
    /// Starts serving `devices` as `resource` in `kubelet`'s plugin directory, answering calls
    /// with `plugin` and reporting registration, lost streams and Allocate calls to `report`.
    /// Must run inside a tokio runtime: the server is a task of its own.
    pub fn start(
        kubelet: Arc<PluginSockets>,
        resource: Resource,
        devices: Arc<P::Devices>,
        plugin: P,
        report: impl ServerReport,
    ) -> Self {
        let (tx, rx) = watch::channel(Listed::of(&plugin, devices));
        let cancel = CancellationToken::new();
        let plugin = Arc::new(plugin);
        let service = PluginService {
            resource: Arc::new(resource.clone()),
            devices: rx,
            plugin: plugin.clone(),
            stop: cancel.clone(),
            report: Arc::new(report),
            streams: Arc::new(Streams::default()),
        };
        let task = tokio::spawn(lifecycle(kubelet, service, cancel.clone()));
        ResourceServer {
            resource,
            plugin,
            devices: tx,
            cancel,
            task: Some(task),
        }
    }

    /// The resource served.
    pub fn resource(&self) -> &Resource {
        &self.resource
    }

    /// What the server answers with: its owner's state for this resource.
    pub fn plugin(&self) -> &P {
        &self.plugin
    }

    /// Replaces the devices; every open ListAndWatch stream sends their list when it differs
    /// from the one before. Never blocks.
    ///
    /// What kubelet sees of the devices is their list (ids, health, topology); what else changed
    /// (a device's mounts, say) is answered from the new devices on the next Allocate without a
    /// list sent for nothing: a scanner that changes only that, over and over, must not flood
    /// kubelet with identical lists.
    pub fn update(&self, devices: Arc<P::Devices>) {
        let new = Listed::of(&*self.plugin, devices);
        self.devices.send_if_modified(|current| {
            let changed = current.list != new.list;
            *current = new;
            changed
        });
    }

    /// Stops serving: streams end, the socket is removed. Returns once all of that is done.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use tokio::sync::mpsc;
    use tonic::Status;

    use super::*;
    use crate::api;
    use crate::standin::{Observed, StandIn};

    /// A resource of plain ids: what a server needs of its owner, and nothing of wdp's.
    struct Ids;

    impl ResourcePlugin for Ids {
        type Devices = Vec<String>;

        fn options(&self) -> api::DevicePluginOptions {
            api::DevicePluginOptions::default()
        }

        fn list(&self, devices: &Vec<String>) -> Bytes {
            let mut list = crate::list::ListEncoder::default();
            for id in devices {
                list.push(id, "Healthy", None);
            }
            list.finish()
        }

        async fn allocate(
            &self,
            devices: &Vec<String>,
            requests: Vec<api::ContainerAllocateRequest>,
        ) -> Result<api::AllocateResponse, Status> {
            let mut container_responses = Vec::new();
            for request in requests {
                let mut response = api::ContainerAllocateResponse::default();
                for id in request.devices_ids {
                    if !devices.contains(&id) {
                        return Err(Status::invalid_argument(format!("no device {id}")));
                    }
                    response.envs.insert("ID".into(), id);
                }
                container_responses.push(response);
            }
            Ok(api::AllocateResponse {
                container_responses,
            })
        }

        async fn preferred_allocation(
            &self,
            _: Vec<api::ContainerPreferredAllocationRequest>,
        ) -> Result<api::PreferredAllocationResponse, Status> {
            Err(not_advertised())
        }

        async fn pre_start(&self, _: Vec<String>) -> Result<(), Status> {
            Err(not_advertised())
        }
    }

    /// Every report, in order.
    #[derive(Default)]
    struct Reports {
        registered: Mutex<Vec<bool>>,
        failures: Mutex<Vec<String>>,
        losses: std::sync::atomic::AtomicU64,
        allocated: Mutex<Vec<bool>>,
    }

    impl ServerReport for Arc<Reports> {
        fn registered(&self, registered: bool) {
            self.registered.lock().unwrap().push(registered);
        }
        fn registration_failed(&self, reason: &str) {
            self.failures.lock().unwrap().push(reason.to_owned());
        }
        fn stream_lost(&self) {
            self.losses
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        fn allocated(&self, _: Duration, ok: bool) {
            self.allocated.lock().unwrap().push(ok);
        }
    }

    /// The next device list the stand-in saw for `resource`.
    async fn next_list(
        observed: &mut mpsc::UnboundedReceiver<Observed>,
        resource: &str,
    ) -> Vec<String> {
        let wait = async {
            loop {
                match observed.recv().await {
                    Some(Observed::Devices {
                        resource: r,
                        devices,
                        ..
                    }) if r == resource => break devices.iter().map(|d| d.id.clone()).collect(),
                    Some(_) => {}
                    None => panic!("the stand-in stopped"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("a device list within 10 s")
    }

    /// Serves the one-device resource `example.com/ids` in `plugins`, reporting to the returned
    /// reports.
    fn serve_ids(plugins: &std::path::Path) -> (ResourceServer<Ids>, Arc<Reports>) {
        let sockets = Arc::new(PluginSockets {
            dir: PluginDir::watch(plugins).unwrap(),
            socket: plugins.join(crate::KUBELET_SOCKET_NAME),
        });
        let resource = Resource::new("example.com", "ids", plugins).unwrap();
        let reports = Arc::new(Reports::default());
        let server = ResourceServer::start(
            sockets,
            resource,
            Arc::new(vec!["a".to_string()]),
            Ids,
            reports.clone(),
        );
        (server, reports)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_registers_lists_updates_and_answers_through_its_plugin() {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("device-plugins");
        let (kubelet, mut observed) = StandIn::start(&plugins).unwrap();
        let (server, reports) = serve_ids(&plugins);
        let socket = Resource::new("example.com", "ids", &plugins)
            .unwrap()
            .socket;

        assert_eq!(next_list(&mut observed, "example.com/ids").await, ["a"]);
        // kubelet may open its stream before the server has read Register's answer.
        for _ in 0..100 {
            if !reports.registered.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(*reports.registered.lock().unwrap(), [true]);
        server.update(Arc::new(vec!["a".into(), "b".into()]));
        assert_eq!(
            next_list(&mut observed, "example.com/ids").await,
            ["a", "b"]
        );

        // Devices whose list is the same are served without a list sent: the next list seen
        // is the one after them.
        server.update(Arc::new(vec!["a".into(), "b".into()]));
        server.update(Arc::new(vec!["a".into(), "b".into(), "c".into()]));
        assert_eq!(
            next_list(&mut observed, "example.com/ids").await,
            ["a", "b", "c"]
        );

        // Allocate reaches the plugin with the list as it is now; its refusal is kubelet's error.
        let answer = kubelet.allocate("example.com/ids", &["b"]).await.unwrap();
        assert_eq!(answer.container_responses[0].envs["ID"], "b");
        let refused = kubelet
            .allocate("example.com/ids", &["z"])
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert_eq!(*reports.allocated.lock().unwrap(), [true, false]);

        assert!(socket.exists());
        server.stop().await;
        assert!(!socket.exists(), "stopping removes the socket");
        assert_eq!(*reports.registered.lock().unwrap(), [true, false]);
        kubelet.stop().await;
    }

    /// The registrations of `resource` among the events queued in `observed` (drained).
    fn registrations(observed: &mut mpsc::UnboundedReceiver<Observed>, resource: &str) -> usize {
        let mut n = 0;
        while let Ok(event) = observed.try_recv() {
            if matches!(&event, Observed::Registered { resource: r, .. } if r == resource) {
                n += 1;
            }
        }
        n
    }

    /// Polls `done` every 10 ms for up to 10 s.
    async fn until(what: &str, done: impl Fn() -> bool) {
        for _ in 0..1000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("not within 10 s: {what}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kubelet_that_stops_is_waited_for_and_no_stream_is_counted_lost() {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("device-plugins");
        let (mut kubelet, mut observed) = StandIn::start(&plugins).unwrap();
        let (server, reports) = serve_ids(&plugins);
        let registered = |n: usize| {
            let reports = reports.clone();
            move || {
                let r = reports.registered.lock().unwrap();
                r.len() == n && r.last() == Some(&true)
            }
        };
        assert_eq!(next_list(&mut observed, "example.com/ids").await, ["a"]);
        until("registered", registered(1)).await;

        // Stopped (SIGTERM), then killed: either way kubelet.sock stays, refusing connections.
        for (round, killed) in [false, true].into_iter().enumerate() {
            if killed {
                kubelet.crash().await;
            } else {
                kubelet.stop().await;
            }
            assert!(plugins.join("kubelet.sock").exists());
            until("kubelet's departure seen", || {
                reports.registered.lock().unwrap().len() == 2 * round + 2
            })
            .await;
            (kubelet, observed) = StandIn::start(&plugins).unwrap();
            until("registered again", registered(2 * round + 3)).await;
            until("listed", || {
                kubelet.health("example.com/ids", "a").is_some()
            })
            .await;
            assert_eq!(registrations(&mut observed, "example.com/ids"), 1);
        }
        assert_eq!(reports.losses.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(*reports.failures.lock().unwrap(), Vec::<String>::new());

        // A stream kubelet drops while it runs: a loss, and one registration.
        assert!(kubelet.cut_stream("example.com/ids"));
        until("registered after the cut", registered(7)).await;
        assert_eq!(registrations(&mut observed, "example.com/ids"), 1);
        assert_eq!(reports.losses.load(std::sync::atomic::Ordering::SeqCst), 1);
        server.stop().await;
        kubelet.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_registration_kubelet_refuses_is_reported_with_its_reason_and_retried() {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("device-plugins");
        let (kubelet, _observed) = StandIn::start(&plugins).unwrap();
        kubelet.refuse(Some("no room for example.com/ids".into()));
        let (server, reports) = serve_ids(&plugins);
        until("refused twice", || {
            reports.failures.lock().unwrap().len() >= 2
        })
        .await;
        assert!(
            reports
                .failures
                .lock()
                .unwrap()
                .iter()
                .all(|r| r == "no room for example.com/ids"),
            "kubelet's own words"
        );
        assert!(reports.registered.lock().unwrap().is_empty());
        // kubelet takes it now: the retry goes through.
        kubelet.refuse(None);
        until("registered", || {
            *reports.registered.lock().unwrap() == [true]
        })
        .await;
        server.stop().await;
        kubelet.stop().await;
    }
}
