//! A kubelet stand-in, for `make demo` (`wdp kubelet`) and the integration tests.
//!
//! It does what kubelet's device manager does with plugins, over the real protocol, following
//! kubelet's `pkg/kubelet/cm/devicemanager` (`manager.go`, `endpoint.go`,
//! `plugin/v1beta1/{server,handler,client}.go`):
//! - on start, removes every socket in the plugin directory and nothing else (kubelet's
//!   `CleanupPluginDirectory`: its checkpoint and other files stay), which is how plugins learn
//!   that kubelet restarted, then listens on `kubelet.sock`;
//! - inside `Register`: checks the version and the resource name (kubelet's
//!   `IsExtendedResourceName`, [`crate::names`]), dials the plugin's endpoint (10 s, as
//!   kubelet's `dial`, whose `WithAuthority("localhost")` every release from 1.32 to 1.35 keeps:
//!   [`transport::connect`] sends the same), calls `GetDevicePluginOptions`, and only then
//!   answers;
//! - then consumes `ListAndWatch`, one stream per registration, reporting every list. When a
//!   stream ends while the stand-in runs, the resource's devices become unhealthy and its
//!   endpoint is stopped (`PluginDisconnected`): calls on it fail until the plugin registers
//!   again;
//! - stopping it ([`StandIn::stop`], or [`StandIn::crash`]: the same on the wire) ends it as a
//!   real kubelet ends, SIGTERM or SIGKILL alike: its listener closes, then every plugin
//!   connection, and `kubelet.sock` stays behind, refusing connections, until the next kubelet's
//!   cleanup. kubelet never calls its device manager's `Stop` when it exits (which would close
//!   its gRPC server and, Go's `net.Listen` listener unlinking its file on close, remove the
//!   socket); plugin sockets are the plugins' own and stay too.
//!
//! - it keeps a checkpoint of allocations in the plugin directory ([`super::checkpoint`]): a
//!   container it admitted is started and restarted from the cached Allocate answer without
//!   asking the plugin again, also after the stand-in's own restart, when it requires the
//!   container's devices to come back healthy; GetPreferredAllocation and PreStartContainer are
//!   called only when the plugin advertised them, PreStartContainer with kubelet's 30 s.
//!
//! What it sees is reported as [`Observed`] events; [`StandIn::admit`] and
//! [`StandIn::start_container`] are kubelet's pod admission and container start;
//! [`StandIn::allocate`] is one bare Allocate call, refused on a stopped endpoint as kubelet
//! refuses it.

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
use super::checkpoint::Checkpoint;
use super::{API_VERSION, KUBELET_SOCKET_NAME, transport};
use crate::names;

/// A client to one plugin's socket, as kubelet holds one (the type [`StandIn::client`] returns,
/// named so that callers can pass it around without depending on tonic).
pub type PluginClient = DevicePluginClient<Channel>;

/// kubelet's `KubeletPreStartContainerRPCTimeoutInSecs`.
const PRE_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// kubelet's `dial` gives a plugin's socket 10 s to answer.
const DIAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the stand-in saw, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    /// A plugin registered (after its options were fetched).
    Registered {
        /// The resource registered.
        resource: String,
        /// The plugin's socket, in the plugin directory.
        endpoint: String,
        /// What the plugin advertised.
        options: DevicePluginOptions,
    },
    /// A ListAndWatch message: the resource's whole device list.
    Devices {
        /// The resource listed.
        resource: String,
        /// The stream it came on (see [`Observed::StreamEnded`]).
        stream: u64,
        /// Its devices, as the plugin sent them: the list the stand-in keeps, shared.
        devices: Arc<Vec<api::Device>>,
    },
    /// A ListAndWatch stream ended (plugin stopped, or its server went away).
    StreamEnded {
        /// The resource whose stream ended.
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
    /// The number of this registration's stream.
    stream: u64,
    /// Ends this registration's stream from kubelet's side ([`StandIn::cut_stream`]).
    cut: CancellationToken,
    /// Set when its stream ended: kubelet's endpoint `stopTime`.
    stopped: bool,
    /// When it was stopped, for the grace period after which kubelet forgets it.
    stopped_at: Option<std::time::Instant>,
    /// The stream's last list as decoded, shared with its [`Observed::Devices`]: one list of
    /// 10,000 devices is not copied into a map of 20,000 strings at every message, which
    /// would put the stand-in's bookkeeping into every latency measured to it. What kubelet
    /// keeps of it is read from here when asked ([`Plugin::health`]).
    devices: Arc<Vec<api::Device>>,
}

impl Plugin {
    /// The health kubelet holds for each device id: what the last list said (a repeated id's
    /// last entry, as kubelet's map keeps it), every device "Unhealthy" once the endpoint
    /// stopped (`markResourceUnhealthy`).
    fn health(&self) -> HashMap<&str, &str> {
        self.devices
            .iter()
            .map(|d| (d.id.as_str(), self.held(d)))
            .collect()
    }

    /// The health kubelet holds for `device`, one of the last list's: its own, or "Unhealthy"
    /// once the endpoint stopped.
    fn held<'a>(&self, device: &'a api::Device) -> &'a str {
        if self.stopped {
            "Unhealthy"
        } else {
            &device.health
        }
    }
}

/// kubelet's `ErrEndpointStopped`.
fn endpoint_stopped(resource: &str) -> Status {
    Status::unavailable(format!("endpoint {resource} has been stopped"))
}

/// A running stand-in. [`StandIn::stop`] (or drop) ends it: the socket goes, streams close.
pub struct StandIn {
    socket: PathBuf,
    dir: PathBuf,
    plugins: Arc<Mutex<HashMap<String, Plugin>>>,
    /// Allocations, kept in the plugin directory across restarts as kubelet keeps them.
    checkpoint: Mutex<Checkpoint>,
    allocate_calls: AtomicU64,
    /// What every Register call is refused with, when set ([`StandIn::refuse`]).
    refusal: Arc<Mutex<Option<String>>>,
    /// Ends the plugin connections (ListAndWatch streams, clients).
    cancel: CancellationToken,
    /// Closes the listener on `kubelet.sock`.
    serving: CancellationToken,
    task: Option<JoinHandle<()>>,
    /// The listening socket itself, kept past the server's end by [`StandIn::stop`] for as long
    /// as a kubelet's exiting process keeps it.
    listening: Option<std::os::fd::OwnedFd>,
}

/// How long the stand-in's listening socket outlives its streams on [`StandIn::stop`]: a real
/// kubelet's, as seen on a node (its streams ended 27 ms before its socket refused connections).
const EXIT_LINGER: std::time::Duration = std::time::Duration::from_millis(50);

impl Drop for StandIn {
    fn drop(&mut self) {
        self.serving.cancel();
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
        let listening = {
            use std::os::fd::AsFd;
            listener.as_fd().try_clone_to_owned()?
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let plugins = Arc::new(Mutex::new(HashMap::new()));
        let cancel = CancellationToken::new();
        let refusal = Arc::new(Mutex::new(None));
        let service = RegistrationService {
            refusal: refusal.clone(),
            plugin_dir: plugin_dir.to_path_buf(),
            plugins: plugins.clone(),
            observed: tx,
            cancel: cancel.clone(),
            streams: AtomicU64::new(0),
        };
        let serving = CancellationToken::new();
        let shutdown = serving.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "kubelet stand-in failed");
            }
        });
        let checkpoint = Checkpoint::load(plugin_dir).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the checkpoint; starting without allocations");
            Checkpoint::default()
        });
        Ok((
            StandIn {
                socket,
                dir: plugin_dir.to_path_buf(),
                plugins,
                checkpoint: Mutex::new(checkpoint),
                allocate_calls: AtomicU64::new(0),
                refusal,
                cancel,
                serving,
                task: Some(task),
                listening: Some(listening),
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

    /// Makes every Register call fail with `reason` (kubelet's error text) until called with
    /// `None`, as kubelet refuses a plugin it cannot take (a version it does not speak, an
    /// invalid name, a plugin it cannot dial back).
    pub fn refuse(&self, reason: Option<String>) {
        *self.refusal.lock().unwrap_or_else(|p| p.into_inner()) = reason;
    }

    /// The options a resource registered with.
    pub fn options(&self, resource: &str) -> Option<DevicePluginOptions> {
        self.plugins().get(resource).map(|p| p.options)
    }

    /// A client to a registered plugin, as kubelet holds one.
    pub fn client(&self, resource: &str) -> Option<PluginClient> {
        self.plugins().get(resource).map(|p| p.client.clone())
    }

    /// Whether `resource`'s endpoint is stopped (its stream ended): kubelet then counts every
    /// device unhealthy and calls nothing on it until the plugin registers again.
    pub fn stopped(&self, resource: &str) -> Option<bool> {
        self.plugins().get(resource).map(|p| p.stopped)
    }

    /// The health kubelet holds for `resource`'s device `id`: what the last list said, or
    /// "Unhealthy" for every device once the endpoint stopped.
    pub fn health(&self, resource: &str, id: &str) -> Option<String> {
        let plugins = self.plugins();
        let plugin = plugins.get(resource)?;
        // From the end: a repeated id's last entry is the one kubelet's map keeps. One id is
        // asked about, so the map of every device is not built for it.
        let device = plugin.devices.iter().rev().find(|d| d.id == id)?;
        Some(plugin.held(device).to_owned())
    }

    /// What kubelet's device manager reports for the Node's status (`GetCapacity` in
    /// `pkg/kubelet/cm/devicemanager/manager.go`): per registered resource, capacity (every
    /// device) and allocatable (the healthy ones; none once its endpoint stopped); a resource
    /// whose endpoint stopped `grace` or longer ago ([`crate::nodestatus::ENDPOINT_STOP_GRACE`]
    /// in kubelet) is forgotten and reported removed, once.
    pub fn capacity(&self, grace: std::time::Duration) -> crate::nodestatus::DeviceCapacity {
        let mut out = crate::nodestatus::DeviceCapacity::default();
        self.plugins().retain(|name, p| {
            if p.stopped_at.is_some_and(|at| at.elapsed() >= grace) {
                out.removed.push(name.clone());
                return false;
            }
            let health = p.health();
            let healthy = health.values().filter(|h| **h == "Healthy").count();
            out.capacity.insert(
                name.clone(),
                i64::try_from(health.len()).unwrap_or(i64::MAX),
            );
            out.allocatable
                .insert(name.clone(), i64::try_from(healthy).unwrap_or(i64::MAX));
            true
        });
        out.removed.sort();
        out
    }

    /// Ends `resource`'s ListAndWatch stream from kubelet's side, as a failed connection does;
    /// false when the resource is not registered.
    pub fn cut_stream(&self, resource: &str) -> bool {
        match self.plugins().get(resource) {
            Some(p) => {
                p.cut.cancel();
                true
            }
            None => false,
        }
    }

    /// One Allocate call for one container, as kubelet makes at pod admission.
    pub async fn allocate(
        &self,
        resource: &str,
        ids: &[&str],
    ) -> Result<api::AllocateResponse, Status> {
        let mut client = match self.plugins().get(resource) {
            None => return Err(Status::not_found(format!("{resource} is not registered"))),
            Some(p) if p.stopped => return Err(endpoint_stopped(resource)),
            Some(p) => p.client.clone(),
        };
        let request = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        };
        client.allocate(request).await.map(Response::into_inner)
    }

    /// Admits `container` of `pod` asking for `count` devices of `resource`, as kubelet's
    /// `devicesToAllocate` and `allocateContainerResources` do. A container the checkpoint
    /// already holds (kubelet re-admitting its pods after a restart) is not allocated again: the
    /// resource must be registered and the container's devices healthy, and the cached answer
    /// stays. Otherwise the stand-in takes healthy devices nobody holds (the plugin's preferred
    /// ones first, when it advertises GetPreferredAllocation and there is a choice), makes one
    /// Allocate call and checkpoints the answer.
    pub async fn admit(
        &self,
        pod: &str,
        container: &str,
        resource: &str,
        count: usize,
    ) -> Result<api::ContainerAllocateResponse, Status> {
        let cached = self.checkpoint().find(pod, container, resource);
        let (mut client, options, healthy) = {
            let plugins = self.plugins();
            let Some(p) = plugins.get(resource) else {
                return Err(Status::failed_precondition(format!(
                    "cannot allocate unregistered device {resource}"
                )));
            };
            let mut healthy: Vec<String> = p
                .health()
                .into_iter()
                .filter(|(_, h)| *h == "Healthy")
                .map(|(id, _)| id.to_string())
                .collect();
            healthy.sort();
            (p.client.clone(), p.options, healthy)
        };
        if healthy.is_empty() {
            return Err(Status::failed_precondition(format!(
                "no healthy devices present; cannot allocate unhealthy devices {resource}"
            )));
        }
        if let Some((ids, response)) = cached {
            if !ids.iter().all(|id| healthy.contains(id)) {
                return Err(Status::failed_precondition(format!(
                    "previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
                )));
            }
            return Ok(response);
        }
        let allocated = self.checkpoint().allocated(resource);
        let available: Vec<String> = healthy
            .into_iter()
            .filter(|id| !allocated.contains(id))
            .collect();
        if available.len() < count {
            return Err(Status::resource_exhausted(format!(
                "requested number of devices unavailable for {resource}. Requested: {count}, Available: {}",
                available.len()
            )));
        }
        let mut chosen: Vec<String> = Vec::with_capacity(count);
        if options.get_preferred_allocation_available && available.len() > count {
            let request = api::PreferredAllocationRequest {
                container_requests: vec![api::ContainerPreferredAllocationRequest {
                    available_device_i_ds: available.clone(),
                    must_include_device_i_ds: Vec::new(),
                    allocation_size: i32::try_from(count).unwrap_or(i32::MAX),
                }],
            };
            let preferred = client.get_preferred_allocation(request).await?.into_inner();
            let ids = preferred.container_responses.into_iter().next();
            for id in ids.map(|r| r.device_i_ds).unwrap_or_default() {
                if chosen.len() < count && available.contains(&id) && !chosen.contains(&id) {
                    chosen.push(id);
                }
            }
        }
        for id in &available {
            if chosen.len() < count && !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
        let request = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: chosen.clone(),
            }],
        };
        self.allocate_calls.fetch_add(1, Ordering::Relaxed);
        let answer = client.allocate(request).await?.into_inner();
        let Some(response) = answer.container_responses.into_iter().next() else {
            return Err(Status::internal(
                "no containers return in allocation response",
            ));
        };
        let mut checkpoint = self.checkpoint();
        checkpoint.insert(pod, container, resource, &chosen, &response);
        checkpoint
            .save(&self.dir)
            .map_err(|e| Status::internal(format!("cannot write the checkpoint: {e}")))?;
        Ok(response)
    }

    /// Starts (or restarts) `container` of `pod`, as kubelet's `GetDeviceRunContainerOptions`:
    /// PreStartContainer on its devices when the registered plugin asks for it (with kubelet's
    /// 30 s deadline; refused on a stopped endpoint), then the cached answer for the runtime. No
    /// Allocate call: the answer, CDI names included, comes from the checkpoint, also while no
    /// plugin runs.
    pub async fn start_container(
        &self,
        pod: &str,
        container: &str,
        resource: &str,
    ) -> Result<api::ContainerAllocateResponse, Status> {
        let Some((ids, response)) = self.checkpoint().find(pod, container, resource) else {
            return Err(Status::failed_precondition(format!(
                "no devices found allocated in local cache for pod {pod}, container {container}, resource {resource}"
            )));
        };
        let plugin = self
            .plugins()
            .get(resource)
            .map(|p| (p.client.clone(), p.options, p.stopped));
        if let Some((mut client, options, stopped)) = plugin
            && options.pre_start_required
        {
            if stopped {
                return Err(endpoint_stopped(resource));
            }
            let mut request = Request::new(api::PreStartContainerRequest { devices_ids: ids });
            request.set_timeout(PRE_START_TIMEOUT);
            client.pre_start_container(request).await?;
        }
        Ok(response)
    }

    /// Allocate calls this stand-in made so far (kubelet makes none for a container it has
    /// checkpointed).
    pub fn allocate_calls(&self) -> u64 {
        self.allocate_calls.load(Ordering::Relaxed)
    }

    fn checkpoint(&self) -> std::sync::MutexGuard<'_, Checkpoint> {
        self.checkpoint.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends like kubelet going down (SIGTERM): its server stops answering, then the plugin
    /// connections end, then its socket closes; `kubelet.sock` stays behind, refusing
    /// connections, until the next kubelet's cleanup, as a real kubelet leaves it.
    pub async fn stop(mut self) {
        // As kubelet's process ends: nothing answers on `kubelet.sock` any more, its connections
        // (the plugins' ListAndWatch streams) end, and for a few milliseconds more the socket
        // still queues the connections plugins make (the kernel completes them; nobody answers),
        // until it closes with the process and they are reset. The file stays.
        self.serving.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.cancel.cancel();
        tokio::time::sleep(EXIT_LINGER).await;
        self.listening.take();
        self.plugins().clear();
    }

    /// Ends like a killed kubelet (SIGKILL): on the wire the same as [`StandIn::stop`], since
    /// kubelet does nothing more on SIGTERM.
    pub async fn crash(self) {
        self.stop().await;
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
    refusal: Arc<Mutex<Option<String>>>,
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
        let refusal = self
            .refusal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(reason) = refusal {
            // kubelet's errors are plain Go errors: gRPC's Unknown, with the text.
            return Err(Status::unknown(reason));
        }
        if req.version != API_VERSION {
            return Err(Status::invalid_argument(format!(
                "requested API version {:?} is not supported by kubelet. Supported version is [\"{API_VERSION}\"]",
                req.version
            )));
        }
        if let Err(rule) = names::check_resource_name(&req.resource_name) {
            return Err(Status::invalid_argument(format!(
                "the ResourceName {:?} is invalid: it {rule}",
                req.resource_name
            )));
        }
        // Like kubelet: dial back (within 10 s) and ask the options before answering.
        let endpoint = self.plugin_dir.join(&req.endpoint);
        let channel = tokio::time::timeout(DIAL_TIMEOUT, transport::connect(&endpoint))
            .await
            .map_err(|_| Status::unavailable("failed to dial device plugin: timed out"))?
            .map_err(|e| Status::unavailable(format!("failed to dial device plugin: {e}")))?;
        let mut client = DevicePluginClient::new(channel);
        let options = client
            .get_device_plugin_options(Empty {})
            .await
            .map_err(|e| Status::unavailable(format!("failed to get device plugin options: {e}")))?
            .into_inner();
        let stream = self.streams.fetch_add(1, Ordering::Relaxed) + 1;
        let cut = self.cancel.child_token();
        self.plugins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                req.resource_name.clone(),
                Plugin {
                    client: client.clone(),
                    options,
                    stream,
                    cut: cut.clone(),
                    stopped: false,
                    stopped_at: None,
                    devices: Arc::default(),
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
            stream,
            self.plugins.clone(),
            self.observed.clone(),
            (self.cancel.clone(), cut),
        ));
        Ok(Response::new(Empty {}))
    }
}

/// Consumes one ListAndWatch stream until it ends, is cut, or the stand-in stops. The end of a
/// stream while the stand-in runs stops the endpoint, as kubelet's `PluginDisconnected` does.
async fn watch(
    mut client: DevicePluginClient<Channel>,
    resource: String,
    stream_number: u64,
    plugins: Arc<Mutex<HashMap<String, Plugin>>>,
    observed: mpsc::UnboundedSender<Observed>,
    (cancel, cut): (CancellationToken, CancellationToken),
) {
    let plugin = |f: &mut dyn FnMut(&mut Plugin)| {
        let mut plugins = plugins.lock().unwrap_or_else(|p| p.into_inner());
        // Another registration of the resource overtook this stream: it is not this one's.
        if let Some(p) = plugins
            .get_mut(&resource)
            .filter(|p| p.stream == stream_number)
        {
            f(p);
        }
    };
    let stream = tokio::select! {
        _ = cancel.cancelled() => return,
        _ = cut.cancelled() => None,
        s = client.list_and_watch(Empty {}) => s.ok(),
    };
    if let Some(stream) = stream {
        let mut stream = stream.into_inner();
        loop {
            let message = tokio::select! {
                _ = cancel.cancelled() => return,
                _ = cut.cancelled() => break,
                m = stream.message() => m,
            };
            match message {
                Ok(Some(list)) => {
                    let devices = Arc::new(list.devices);
                    plugin(&mut |p| p.devices = devices.clone());
                    let _ = observed.send(Observed::Devices {
                        resource: resource.clone(),
                        stream: stream_number,
                        devices,
                    });
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
    plugin(&mut |p| {
        p.stopped = true;
        p.stopped_at = Some(std::time::Instant::now());
    });
    let _ = observed.send(Observed::StreamEnded {
        resource,
        stream: stream_number,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(resource: &str, stream: u64) -> Observed {
        Observed::Devices {
            resource: resource.into(),
            stream,
            devices: Arc::default(),
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
