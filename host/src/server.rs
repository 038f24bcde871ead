//! One kubelet device plugin server per resource `<namespace>/<dev-type>`.
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
//! Device updates never wait on kubelet: they replace the value in a `watch` channel, so a slow
//! or absent consumer sees only the latest list, and each ListAndWatch stream is its own consumer.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::net::UnixListener;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::allocate::{self, AllocateError, ContainerResponse};
use crate::bindings::types as wit;
use crate::hooks::{HookError, Hooks};
use crate::kubelet::api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::kubelet::api::{self, DevicePluginOptions};
use crate::kubelet::dir::{self, DirEvent, PluginDir};
use crate::kubelet::register;
use crate::names::Resource;
use crate::preferred;
use crate::status::ResourceHandle;
use crate::tree::DeviceGroup;

/// Where kubelet is and where plugin sockets go; shared by every server of a host.
pub struct Kubelet {
    pub dir: PluginDir,
    pub socket: PathBuf,
}

impl Kubelet {
    /// True when `name`, a file in the plugin directory, is kubelet's registration socket.
    fn is_socket(&self, name: &str) -> bool {
        self.socket.file_name().is_some_and(|n| n == name)
    }
}

/// A running resource server. Dropping it without [`ResourceServer::stop`] also stops it.
pub struct ResourceServer {
    resource: Resource,
    status: ResourceHandle,
    devices: watch::Sender<Arc<DeviceGroup>>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Drop for ResourceServer {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl ResourceServer {
    /// Starts serving `devices` as `resource`, reporting registration and Allocate calls to
    /// `status`.
    pub fn start(
        kubelet: Arc<Kubelet>,
        resource: Resource,
        devices: Arc<DeviceGroup>,
        hooks: Option<Arc<Hooks>>,
        status: ResourceHandle,
    ) -> Self {
        let (tx, rx) = watch::channel(devices);
        let cancel = CancellationToken::new();
        let service = PluginService {
            resource: Arc::new(resource.clone()),
            devices: rx,
            hooks,
            stop: cancel.clone(),
            status: status.clone(),
            streams: Arc::new(Streams::default()),
        };
        let task = tokio::spawn(lifecycle(kubelet, service, cancel.clone()));
        ResourceServer {
            resource,
            status,
            devices: tx,
            cancel,
            task: Some(task),
        }
    }

    /// The resource served.
    pub fn resource(&self) -> &Resource {
        &self.resource
    }

    /// Where this resource's status and metrics go.
    pub fn status(&self) -> &ResourceHandle {
        &self.status
    }

    /// Replaces the device list; every open ListAndWatch stream sends it. Never blocks.
    pub fn update(&self, devices: Arc<DeviceGroup>) {
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

/// Why a served socket stopped being useful, or its registration did.
enum Restart {
    /// kubelet restarted (`kubelet.sock` recreated) or deleted our socket.
    Kubelet,
    /// kubelet's stream ended while it kept running: register again on the same socket.
    StreamLost,
    /// The server was stopped.
    Stopped,
}

/// kubelet's ListAndWatch streams on one resource's socket: which is the latest, and the number
/// of the last one that ended while the server was serving. Each stream reports its own end
/// (see [`StreamEnd`]), so an older stream ending late is told apart from the current one.
#[derive(Debug)]
struct Streams {
    opened: AtomicU64,
    lost: watch::Sender<u64>,
}

impl Default for Streams {
    fn default() -> Self {
        Streams {
            opened: AtomicU64::new(0),
            lost: watch::Sender::new(0),
        }
    }
}

impl Streams {
    fn opened(&self) -> u64 {
        self.opened.load(Ordering::SeqCst)
    }
}

/// Held by one ListAndWatch stream: its drop (kubelet went away from it, or the server stops)
/// reports a loss when the stream was the latest and the server was not stopping.
struct StreamEnd {
    streams: Arc<Streams>,
    number: u64,
    stop: CancellationToken,
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        if !self.stop.is_cancelled() && self.streams.opened() == self.number {
            self.streams.lost.send_replace(self.number);
        }
    }
}

/// The delay before registering again after a stream loss: none for a loss on its own, then
/// doubling from 10 ms up to 5 s while each new registration's stream is lost again within a
/// second (a kubelet that drops every stream at once must not be hammered).
#[derive(Debug, Default)]
struct LossBackoff {
    delay: Duration,
}

impl LossBackoff {
    fn next(&mut self, registration_lived: Duration) -> Duration {
        if registration_lived > Duration::from_secs(1) {
            self.delay = Duration::ZERO;
        }
        let now = self.delay;
        self.delay = (self.delay * 2)
            .max(Duration::from_millis(10))
            .min(Duration::from_secs(5));
        now
    }
}

/// Serve, register, wait, and again after every kubelet restart, until cancelled.
async fn lifecycle(kubelet: Arc<Kubelet>, service: PluginService, cancel: CancellationToken) {
    let resource = service.resource.clone();
    // Subscribe first: events from here on are seen, including those racing our own setup.
    let mut events = kubelet.dir.subscribe();
    let mut bind_delay = Duration::from_millis(100);
    loop {
        let started = Instant::now();
        let listener = match bind(&resource.socket) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(resource = %resource.name, socket = %resource.socket.display(), error = %e, "cannot listen; retrying");
                if retry_bind_after(bind_delay, &cancel, &mut events).await {
                    break;
                }
                bind_delay = (bind_delay * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        // kubelet's cleanup may unlink the socket between bind and this look; "absent" then
        // could not be told apart from "still ours" later, so bind again at once.
        let Some(inode) = socket_inode(&resource.socket) else {
            tracing::debug!(resource = %resource.name, "socket removed as soon as bound; binding again");
            continue;
        };
        // Not a child of `cancel`: streams must end only after the socket is unlinked below, so
        // whoever sees a stream end never finds the socket of a stopped resource.
        let serving = CancellationToken::new();
        let server = tokio::spawn(serve(listener, service.clone(), serving.clone()));

        let mut backoff = LossBackoff::default();
        let outcome = loop {
            // Streams opened from here on belong to this registration (kubelet may open one
            // before its Register answer reaches us).
            let before = service.streams.opened();
            match register_until_done(&kubelet, &service, &cancel, &mut events, inode).await {
                Registration::Stopped => break Restart::Stopped,
                Registration::SocketGone => break Restart::Kubelet,
                Registration::Done(dialed) => {
                    tracing::info!(resource = %resource.name, elapsed = ?started.elapsed(), "registered with kubelet");
                    let registered = Instant::now();
                    service.status.registered(true);
                    let restart = wait_for_restart(
                        &kubelet,
                        &service,
                        &cancel,
                        &mut events,
                        inode,
                        dialed,
                        before,
                    )
                    .await;
                    service.status.registered(false);
                    let Restart::StreamLost = restart else {
                        break restart;
                    };
                    service.status.stream_lost();
                    let delay = backoff.next(registered.elapsed());
                    tracing::warn!(resource = %resource.name, ?delay, "kubelet's ListAndWatch stream ended while it kept running; registering again");
                    tokio::select! {
                        _ = cancel.cancelled() => break Restart::Stopped,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        };
        if let Restart::Stopped = outcome {
            // Unlink first: no new connection may reach a server that is going away.
            let _ = std::fs::remove_file(&resource.socket);
        }
        serving.cancel();
        let _ = server.await;
        if let Restart::Stopped = outcome {
            break;
        }
        tracing::info!(resource = %resource.name, "kubelet restarted; serving and registering again");
    }
    // After a kubelet cleanup the socket may already be gone; that is fine.
    let _ = std::fs::remove_file(&resource.socket);
    tracing::info!(resource = %resource.name, "stopped");
}

/// Waits `delay` before binding again, or less when the plugin directory is created again (the
/// watch then reports [`DirEvent::Overflow`]); true when the server was stopped meanwhile.
async fn retry_bind_after(
    delay: Duration,
    cancel: &CancellationToken,
    events: &mut broadcast::Receiver<DirEvent>,
) -> bool {
    let deadline = tokio::time::sleep(delay);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return true,
            _ = &mut deadline => return false,
            event = dir::next_event(events) => match event {
                Some(DirEvent::Overflow) => return false,
                // The watch is gone (the host is stopping): the deadline still holds.
                None => {
                    tokio::select! {
                        _ = cancel.cancelled() => return true,
                        _ = &mut deadline => return false,
                    }
                }
                Some(_) => {}
            },
        }
    }
}

/// How a registration attempt ended.
enum Registration {
    /// Registered with the kubelet listening on the `kubelet.sock` of this inode.
    Done(Option<u64>),
    /// kubelet cleaned the directory while we were starting: serve again.
    SocketGone,
    Stopped,
}

/// Registers until it succeeds, our socket disappears, or the server is stopped.
async fn register_until_done(
    kubelet: &Kubelet,
    service: &PluginService,
    cancel: &CancellationToken,
    events: &mut broadcast::Receiver<DirEvent>,
    inode: u64,
) -> Registration {
    let resource = &service.resource;
    // Short at first: the usual failure is a kubelet caught between creating its socket (which
    // woke us) and listening on it, a window of microseconds; then doubling up to 5 s.
    let mut delay = Duration::from_millis(5);
    let mut warned = false;
    loop {
        if socket_inode(&resource.socket) != Some(inode) {
            return Registration::SocketGone;
        }
        if kubelet.socket.exists() {
            // The Created event of the very kubelet we are about to call may still be queued:
            // only a socket other than this one means a new kubelet.
            let dialed = socket_inode(&kubelet.socket);
            let attempt = register::register(
                &kubelet.socket,
                &resource.endpoint,
                &resource.name,
                service.options(),
            );
            tokio::pin!(attempt);
            // A kubelet that never answers must not hold us: if kubelet.sock is recreated while
            // we wait, a new kubelet is there, and the attempt starts over at once.
            let result = loop {
                tokio::select! {
                    _ = cancel.cancelled() => return Registration::Stopped,
                    r = &mut attempt => break Some(r),
                    event = dir::next_event(events) => match event {
                        Some(DirEvent::Created(name))
                            if kubelet.is_socket(&name) && socket_inode(&kubelet.socket) != dialed =>
                        {
                            tracing::warn!(resource = %resource.name, "kubelet restarted during registration; registering again");
                            break None;
                        }
                        // The directory watch is gone (the host is stopping): just finish.
                        None => break Some((&mut attempt).await),
                        Some(_) => {}
                    },
                }
            };
            let Some(result) = result else { continue };
            match result {
                Ok(()) => return Registration::Done(dialed),
                Err(e) if !warned => {
                    tracing::warn!(resource = %resource.name, error = %e, "registration failed; retrying");
                    warned = true;
                }
                Err(e) => {
                    tracing::debug!(resource = %resource.name, error = %e, "registration failed")
                }
            }
        } else if !warned {
            tracing::warn!(resource = %resource.name, kubelet = %kubelet.socket.display(), "kubelet socket absent; waiting for it");
            warned = true;
        }
        // Wait for kubelet.sock to (re)appear, with a backoff as a safety net.
        let deadline = tokio::time::sleep(delay);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return Registration::Stopped,
                _ = &mut deadline => break,
                event = dir::next_event(events) => match event {
                    Some(DirEvent::Created(name)) if kubelet.is_socket(&name) => break,
                    Some(DirEvent::Overflow) | None => break,
                    Some(_) => {}
                },
            }
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// After registering with the kubelet of `kubelet.sock` inode `dialed`: waits for kubelet to
/// restart, for a stream opened after `before` to be lost, or for a stop.
async fn wait_for_restart(
    kubelet: &Kubelet,
    service: &PluginService,
    cancel: &CancellationToken,
    events: &mut broadcast::Receiver<DirEvent>,
    inode: u64,
    dialed: Option<u64>,
    before: u64,
) -> Restart {
    let resource = &service.resource;
    let mut lost = service.streams.lost.subscribe();
    let mut threshold = before;
    // Events queued before registration finished are history now.
    while events.try_recv().is_ok() {}
    loop {
        if socket_inode(&resource.socket) != Some(inode) {
            return Restart::Kubelet;
        }
        let event = tokio::select! {
            _ = cancel.cancelled() => return Restart::Stopped,
            ended = lost.wait_for(|n| *n > threshold) => {
                // The same kubelet: it stopped the endpoint. Another one (or none): its
                // restart is seen through the directory, as always.
                if dialed.is_some() && socket_inode(&kubelet.socket) == dialed {
                    return Restart::StreamLost;
                }
                threshold = ended.map(|n| *n).unwrap_or(u64::MAX);
                continue;
            }
            event = dir::next_event(events) => event,
        };
        match event {
            Some(DirEvent::Created(name)) if kubelet.is_socket(&name) => {
                return Restart::Kubelet;
            }
            // kubelet went away: our registration went with it, until the next kubelet.
            Some(DirEvent::Removed(name)) if kubelet.is_socket(&name) => {
                service.status.registered(false);
            }
            // A removal of our socket is re-checked by inode at the top of the loop.
            Some(_) => {}
            // The directory watch is gone: nothing more to wait for but the stop.
            None => {
                cancel.cancelled().await;
                return Restart::Stopped;
            }
        }
    }
}

/// Runs the gRPC server on `listener` until `stop`; streams end first so shutdown is prompt.
async fn serve(listener: UnixListener, service: PluginService, stop: CancellationToken) {
    let service = PluginService {
        stop: stop.clone(),
        ..service
    };
    let result = tonic::transport::Server::builder()
        .add_service(DevicePluginServer::new(service))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled_owned())
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "device plugin server failed");
    }
}

fn bind(socket: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(socket)
}

fn socket_inode(path: &Path) -> Option<u64> {
    std::fs::symlink_metadata(path).ok().map(|m| m.ino())
}

/// The DevicePlugin service of one resource. Cheap to clone: one per connection.
#[derive(Clone)]
struct PluginService {
    resource: Arc<Resource>,
    devices: watch::Receiver<Arc<DeviceGroup>>,
    hooks: Option<Arc<Hooks>>,
    /// Cancelled when this socket stops serving; ends open streams.
    stop: CancellationToken,
    status: ResourceHandle,
    /// kubelet's streams, shared by every socket the resource serves on.
    streams: Arc<Streams>,
}

impl PluginService {
    fn options(&self) -> DevicePluginOptions {
        self.hooks.as_ref().map(|h| h.options()).unwrap_or_default()
    }
}

/// The ListAndWatch message that lists `devices` (public for the benchmarks, which time it).
pub fn to_list(devices: &DeviceGroup) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: devices
            .iter()
            .map(|(id, info)| api::Device {
                id: id.clone(),
                health: info.health.as_str().into(),
                // An empty list would tell kubelet the device is NUMA-aware yet on no node (some
                // kubelet versions then never align it): no nodes is no topology.
                topology: info
                    .numa_nodes
                    .as_ref()
                    .filter(|n| !n.is_empty())
                    .map(|nodes| api::TopologyInfo {
                        nodes: nodes
                            .iter()
                            .map(|&n| api::NumaNode { id: n.into() })
                            .collect(),
                    }),
            })
            .collect(),
    }
}

type ListStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(self.options()))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        // Each stream owns its receiver: streams never compete for updates.
        let mut rx = self.devices.clone();
        rx.mark_changed();
        let stop = self.stop.clone();
        let end = StreamEnd {
            number: self.streams.opened.fetch_add(1, Ordering::SeqCst) + 1,
            streams: self.streams.clone(),
            stop: stop.clone(),
        };
        let stream = futures::stream::unfold((rx, stop, end), |(mut rx, stop, end)| async move {
            tokio::select! {
                _ = stop.cancelled() => None,
                changed = rx.changed() => match changed {
                    Ok(()) => {
                        let list = to_list(&rx.borrow_and_update());
                        Some((Ok(list), (rx, stop, end)))
                    }
                    // The server was dropped: its task unlinks the socket, then cancels `stop`.
                    // Ending only then means a stream's end always finds the socket gone.
                    Err(_) => {
                        stop.cancelled().await;
                        None
                    }
                },
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let hooks = self.hooks.as_ref().ok_or_else(not_advertised)?;
        let requests: Vec<wit::ContainerPreferredAllocationRequest> = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| wit::ContainerPreferredAllocationRequest {
                available_device_ids: r.available_device_i_ds,
                must_include_device_ids: r.must_include_device_i_ds,
                allocation_size: u32::try_from(r.allocation_size).unwrap_or(0),
            })
            .collect();
        // Advice only: kubelet allocates without it, so a failing hook must not fail the pod.
        let resource = &self.resource.name;
        let answers = match hooks
            .preferred_allocation(&self.resource.dev_type, &requests)
            .await
        {
            None => return Err(not_advertised()),
            Some(Ok(answers)) if answers.len() == requests.len() => Some(answers),
            Some(Ok(answers)) => {
                tracing::warn!(resource = %resource, answers = answers.len(), requests = requests.len(), "get-preferred-allocation hook answered the wrong number of containers; no preference");
                None
            }
            Some(Err(e)) => {
                tracing::warn!(resource = %resource, error = %e, "get-preferred-allocation hook failed; no preference");
                None
            }
        };
        if answers.is_none() {
            self.status.preferred_fallback();
        }
        let mut answers = answers.map(Vec::into_iter);
        let container_responses = requests
            .iter()
            .map(|request| api::ContainerPreferredAllocationResponse {
                device_i_ds: preferred::answer(request, answers.as_mut().and_then(Iterator::next)),
            })
            .collect();
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let started = Instant::now();
        let answer = self.answer_allocate(request).await;
        self.status.allocated(started.elapsed(), answer.is_ok());
        answer
    }

    async fn pre_start_container(
        &self,
        request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        let ids = request.into_inner().devices_ids;
        let hooks = self.hooks.as_ref().ok_or_else(not_advertised)?;
        match hooks.pre_start(&self.resource.dev_type, &ids).await {
            None => Err(not_advertised()),
            Some(Ok(())) => Ok(Response::new(api::PreStartContainerResponse {})),
            Some(Err(e)) => Err(hook_status(&self.resource, "pre-start-container", e)),
        }
    }
}

impl PluginService {
    /// The Allocate answer: the default response, then the post-allocate hook if any.
    async fn answer_allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let requests = request.into_inner().container_requests;
        let devices = self.devices.borrow().clone();
        let responses = allocate::default_responses(&self.resource.name, &devices, &requests)?;
        let responses = match &self.hooks {
            Some(hooks) if hooks.has_post_allocate() => {
                self.post_allocate(hooks, &requests, responses).await?
            }
            _ => responses,
        };
        Ok(Response::new(api::AllocateResponse {
            container_responses: responses
                .into_iter()
                .map(ContainerResponse::into_proto)
                .collect(),
        }))
    }

    async fn post_allocate(
        &self,
        hooks: &Hooks,
        requests: &[api::ContainerAllocateRequest],
        responses: Vec<ContainerResponse>,
    ) -> Result<Vec<ContainerResponse>, AllocateError> {
        let resource = &self.resource.name;
        let wit_requests: Vec<_> = requests
            .iter()
            .map(|r| wit::ContainerAllocateRequest {
                device_ids: r.devices_ids.clone(),
            })
            .collect();
        let wit_responses: Vec<_> = responses.iter().map(ContainerResponse::to_wit).collect();
        let answer = hooks
            .post_allocate(&self.resource.dev_type, &wit_requests, &wit_responses)
            .await;
        let answer = match answer {
            None => return Ok(responses),
            Some(Ok(answer)) => answer,
            Some(Err(HookError::Timeout(d))) => {
                return Err(AllocateError::HookTimeout {
                    resource: resource.clone(),
                    cause: format!("no answer within {d:?}"),
                });
            }
            Some(Err(e)) => {
                return Err(AllocateError::Hook {
                    resource: resource.clone(),
                    cause: e.to_string(),
                });
            }
        };
        if answer.len() != requests.len() {
            return Err(AllocateError::HookCount {
                resource: resource.clone(),
                got: answer.len(),
                want: requests.len(),
            });
        }
        answer
            .into_iter()
            .enumerate()
            .map(|(i, r)| hooks.check_response(i, r))
            .collect::<Result<_, _>>()
            .map_err(|error| AllocateError::HookInvalid {
                resource: resource.clone(),
                error,
            })
    }
}

fn not_advertised() -> Status {
    Status::unimplemented("this device plugin does not advertise this call")
}

fn hook_status(resource: &Resource, hook: &str, e: HookError) -> Status {
    let message = format!("{}: {hook} hook failed: {e}", resource.name);
    match e {
        HookError::Timeout(_) => Status::deadline_exceeded(message),
        _ => Status::internal(message),
    }
}
