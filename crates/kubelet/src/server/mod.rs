//! One kubelet device-plugin server per resource `<namespace>/<dev-type>`.
//!
//! [`ResourceServer::start`] spawns the task that owns the resource's socket. The task serves,
//! then registers with kubelet (retrying while kubelet is absent: it waits for `kubelet.sock` to
//! appear rather than sleeping), then waits. When kubelet restarts (its socket is recreated) or
//! our socket is deleted (kubelet's cleanup), it serves again and re-registers at once. When
//! kubelet's ListAndWatch stream ends while both sides keep running (same socket, same
//! `kubelet.sock`), it registers again at once, with a backoff if that keeps happening: kubelet
//! has then marked every device unhealthy and stopped the endpoint, calls ListAndWatch on it
//! never again, and drops the resource after 5 minutes (`endpointStopGracePeriod`); only a new
//! registration replaces the endpoint. Stopping cancels the task, which ends every stream,
//! removes the socket and leaves nothing behind, whatever state it was in.
//!
//! One concept per file: what a resource answers kubelet ([`ResourcePlugin`], `plugin.rs`), what
//! a server reports about itself ([`ServerReport`], `report.rs`), the registration state machine
//! (`lifecycle.rs`), the gRPC service (`service.rs`). A server knows nothing of what it serves:
//! its owner (wdp's manager) implements both traits. The names a server derives (endpoint,
//! socket path) are [`crate::names::Resource`]'s.
//!
//! Device updates never wait on kubelet: they replace the value in a `watch` channel, so a slow
//! or absent consumer sees only the latest list, and each ListAndWatch stream is its own consumer.

mod lifecycle;
mod plugin;
mod report;
mod service;

use std::path::PathBuf;
use std::sync::Arc;

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

/// A running resource server, answering with `P`. Dropping it without [`ResourceServer::stop`]
/// also stops it.
pub struct ResourceServer<P: ResourcePlugin> {
    resource: Resource,
    plugin: Arc<P>,
    devices: watch::Sender<Arc<P::Devices>>,
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
        let (tx, rx) = watch::channel(devices);
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

    /// Replaces the device list; every open ListAndWatch stream sends it. Never blocks.
    pub fn update(&self, devices: Arc<P::Devices>) {
        self.devices.send_replace(devices);
    }

    /// Stops serving: streams end, the socket is removed. Returns once all of that is done.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}
