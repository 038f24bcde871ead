//! A kubelet stand-in, for `make demo` (`wdp kubelet`) and the integration tests.
//!
//! It does what kubelet's device manager does with plugins, over the real protocol:
//! - on start, removes every socket in the plugin directory (kubelet's `CleanupPluginDirectory`),
//!   which is how plugins learn that kubelet restarted, then listens on `kubelet.sock`;
//! - inside `Register`: checks the version and resource name, dials the plugin's endpoint, calls
//!   `GetDevicePluginOptions`, and only then answers;
//! - then consumes `ListAndWatch`, one stream per registration, reporting every list.
//!
//! What it sees is reported as [`Observed`] events; [`StandIn::allocate`] calls a plugin the way
//! kubelet does at pod admission.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::api::device_plugin_client::DevicePluginClient;
use super::api::registration_server::{Registration, RegistrationServer};
use super::api::{self, DevicePluginOptions, Empty, RegisterRequest};
use super::{API_VERSION, KUBELET_SOCKET_NAME, transport};

/// What the stand-in saw, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    /// A plugin registered (after its options were fetched).
    Registered {
        resource: String,
        endpoint: String,
        options: DevicePluginOptions,
    },
    /// A ListAndWatch message: the resource's whole device list.
    Devices {
        resource: String,
        /// The stream it came on (see [`Observed::StreamEnded`]).
        stream: u64,
        devices: Vec<api::Device>,
    },
    /// A ListAndWatch stream ended (plugin stopped, or its server went away).
    StreamEnded {
        resource: String,
        /// Streams are numbered from 1 in the order plugins registered with this stand-in: each
        /// stream reports on its own task, so a replaced stream's end (or last list) can arrive
        /// after its successor's first list, and only the number tells which is current.
        stream: u64,
    },
}

/// Tells the events of each resource's current ListAndWatch stream from those of streams it
/// replaced, for whoever keeps "the latest list" from [`Observed`] events.
#[derive(Debug, Default)]
pub struct CurrentStreams(HashMap<String, u64>);

impl CurrentStreams {
    /// Whether `event` is about its resource's current stream: a list from a stream at least as
    /// new as any seen (which it makes current), or the end of that stream. Registrations are
    /// always current.
    pub fn admit(&mut self, event: &Observed) -> bool {
        match event {
            Observed::Registered { .. } => true,
            Observed::Devices {
                resource, stream, ..
            } => {
                let current = self.0.entry(resource.clone()).or_default();
                if *stream < *current {
                    return false;
                }
                *current = *stream;
                true
            }
            Observed::StreamEnded { resource, stream } => {
                self.0.get(resource).is_none_or(|current| stream >= current)
            }
        }
    }
}

struct Plugin {
    client: DevicePluginClient<Channel>,
    options: DevicePluginOptions,
}

/// A running stand-in. [`StandIn::stop`] (or drop) ends it: the socket goes, streams close.
pub struct StandIn {
    socket: PathBuf,
    plugins: Arc<Mutex<HashMap<String, Plugin>>>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl StandIn {
    /// Cleans `plugin_dir` as kubelet does and serves `Registration` on `kubelet.sock` in it.
    /// Returns the stand-in and the stream of what it observes.
    pub fn start(plugin_dir: &Path) -> io::Result<(Self, mpsc::UnboundedReceiver<Observed>)> {
        std::fs::create_dir_all(plugin_dir)?;
        cleanup_plugin_dir(plugin_dir)?;
        let socket = plugin_dir.join(KUBELET_SOCKET_NAME);
        let listener = UnixListener::bind(&socket)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let plugins = Arc::new(Mutex::new(HashMap::new()));
        let cancel = CancellationToken::new();
        let service = RegistrationService {
            plugin_dir: plugin_dir.to_path_buf(),
            plugins: plugins.clone(),
            observed: tx,
            cancel: cancel.clone(),
            streams: AtomicU64::new(0),
        };
        let shutdown = cancel.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "kubelet stand-in failed");
            }
        });
        Ok((
            StandIn {
                socket,
                plugins,
                cancel,
                task: Some(task),
            },
            rx,
        ))
    }

    /// The registration socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Resources registered so far, sorted.
    pub fn resources(&self) -> Vec<String> {
        let mut r: Vec<_> = self.plugins().keys().cloned().collect();
        r.sort();
        r
    }

    /// The options a resource registered with.
    pub fn options(&self, resource: &str) -> Option<DevicePluginOptions> {
        self.plugins().get(resource).map(|p| p.options)
    }

    /// A client to a registered plugin, as kubelet holds one.
    pub fn client(&self, resource: &str) -> Option<DevicePluginClient<Channel>> {
        self.plugins().get(resource).map(|p| p.client.clone())
    }

    /// One Allocate call for one container, as kubelet makes at pod admission.
    pub async fn allocate(
        &self,
        resource: &str,
        ids: &[&str],
    ) -> Result<api::AllocateResponse, Status> {
        let mut client = self
            .client(resource)
            .ok_or_else(|| Status::not_found(format!("{resource} is not registered")))?;
        let request = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        };
        client.allocate(request).await.map(Response::into_inner)
    }

    /// Stops serving (like kubelet going down): the socket is removed, streams are dropped.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    fn plugins(&self) -> std::sync::MutexGuard<'_, HashMap<String, Plugin>> {
        self.plugins.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Removes every Unix socket in `dir`, as kubelet does when it starts.
pub fn cleanup_plugin_dir(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type().is_ok_and(|t| t.is_socket()) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

struct RegistrationService {
    plugin_dir: PathBuf,
    plugins: Arc<Mutex<HashMap<String, Plugin>>>,
    observed: mpsc::UnboundedSender<Observed>,
    cancel: CancellationToken,
    /// The number of the last stream started.
    streams: AtomicU64,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let req = request.into_inner();
        if req.version != API_VERSION {
            return Err(Status::invalid_argument(format!(
                "requested API version {:?} is not supported by kubelet. Supported version is [\"{API_VERSION}\"]",
                req.version
            )));
        }
        if !is_extended_resource_name(&req.resource_name) {
            return Err(Status::invalid_argument(format!(
                "the ResourceName {:?} is invalid",
                req.resource_name
            )));
        }
        if req.endpoint.is_empty() || req.endpoint.contains('/') {
            return Err(Status::invalid_argument(format!(
                "endpoint {:?} must be a file name in the plugin directory",
                req.endpoint
            )));
        }
        // Like kubelet: dial back and ask the options before answering.
        let channel = transport::connect(&self.plugin_dir.join(&req.endpoint))
            .await
            .map_err(|e| Status::unavailable(format!("failed to dial device plugin: {e}")))?;
        let mut client = DevicePluginClient::new(channel);
        let options = client
            .get_device_plugin_options(Empty {})
            .await
            .map_err(|e| Status::unavailable(format!("failed to get device plugin options: {e}")))?
            .into_inner();
        self.plugins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                req.resource_name.clone(),
                Plugin {
                    client: client.clone(),
                    options,
                },
            );
        let _ = self.observed.send(Observed::Registered {
            resource: req.resource_name.clone(),
            endpoint: req.endpoint,
            options,
        });
        tokio::spawn(watch(
            client,
            req.resource_name,
            self.streams.fetch_add(1, Ordering::Relaxed) + 1,
            self.observed.clone(),
            self.cancel.clone(),
        ));
        Ok(Response::new(Empty {}))
    }
}

/// Consumes one ListAndWatch stream until it ends or the stand-in stops.
async fn watch(
    mut client: DevicePluginClient<Channel>,
    resource: String,
    stream_number: u64,
    observed: mpsc::UnboundedSender<Observed>,
    cancel: CancellationToken,
) {
    let stream = tokio::select! {
        _ = cancel.cancelled() => return,
        s = client.list_and_watch(Empty {}) => s,
    };
    if let Ok(stream) = stream {
        let mut stream = stream.into_inner();
        loop {
            let message = tokio::select! {
                _ = cancel.cancelled() => return,
                m = stream.message() => m,
            };
            match message {
                Ok(Some(list)) => {
                    let _ = observed.send(Observed::Devices {
                        resource: resource.clone(),
                        stream: stream_number,
                        devices: list.devices,
                    });
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
    let _ = observed.send(Observed::StreamEnded {
        resource,
        stream: stream_number,
    });
}

/// kubelet's extended-resource-name check: `<dns-subdomain>/<name>`, not under kubernetes.io.
fn is_extended_resource_name(name: &str) -> bool {
    let Some((prefix, rest)) = name.split_once('/') else {
        return false;
    };
    !prefix.is_empty()
        && prefix.len() <= 253
        && !name.contains("kubernetes.io/")
        && !name.starts_with("requests.")
        && crate::tree::is_dev_type(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(resource: &str, stream: u64) -> Observed {
        Observed::Devices {
            resource: resource.into(),
            stream,
            devices: Vec::new(),
        }
    }

    fn ended(resource: &str, stream: u64) -> Observed {
        Observed::StreamEnded {
            resource: resource.into(),
            stream,
        }
    }

    #[test]
    fn a_replaced_streams_late_events_are_not_current() {
        let mut streams = CurrentStreams::default();
        assert!(streams.admit(&listed("a.example.com/x", 1)));
        // The plugin restarted: its new stream lists before the old one's end arrives.
        assert!(streams.admit(&listed("a.example.com/x", 2)));
        assert!(!streams.admit(&ended("a.example.com/x", 1)));
        assert!(!streams.admit(&listed("a.example.com/x", 1)));
        // Another resource's streams are its own.
        assert!(streams.admit(&listed("b.example.com/y", 3)));
        assert!(streams.admit(&ended("b.example.com/y", 3)));
        assert!(streams.admit(&ended("a.example.com/x", 2)));
    }

    #[test]
    fn an_end_with_no_list_yet_is_current() {
        let mut streams = CurrentStreams::default();
        assert!(streams.admit(&ended("a.example.com/x", 1)));
        assert!(streams.admit(&listed("a.example.com/x", 2)));
    }
}
