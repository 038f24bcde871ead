//! The registration state machine of one resource server: serve, register (waiting for
//! kubelet's socket), wait for kubelet to restart, go away, delete our socket or lose our
//! stream, and again, until stopped.
//!
//! Whether kubelet is there is asked of its socket, never of the file's inode: a real kubelet
//! never removes `kubelet.sock` when it stops (SIGTERM ends the process without calling its
//! device manager's Stop), so a stopped kubelet leaves the same file behind, and a new one may
//! bind a file that gets the same inode number back. A stream that ends while `kubelet.sock`
//! refuses connections is kubelet going away, not a lost stream: the server waits for kubelet to
//! come back and registers once.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::PluginSockets;
use super::plugin::ResourcePlugin;
use super::service::PluginService;
use crate::api::device_plugin_server::DevicePluginServer;
use crate::dir::{self, DirEvent};
use crate::register::{self, RegisterError};

/// Why a served socket stopped being useful, or its registration did.
enum Restart {
    /// kubelet restarted (`kubelet.sock` recreated) or deleted our socket.
    Kubelet,
    /// kubelet went away (its socket refuses connections): register on the same socket once it
    /// is back, unless its cleanup removes our socket first.
    KubeletGone,
    /// kubelet's stream ended while it kept running: register again on the same socket.
    StreamLost,
    /// The server was stopped.
    Stopped,
}

/// kubelet's ListAndWatch streams on one resource's socket: which is the latest, and the number
/// of the last one that ended while the server was serving. Each stream reports its own end
/// (see [`StreamEnd`]), so an older stream ending late is told apart from the current one.
#[derive(Debug)]
pub(super) struct Streams {
    pub(super) opened: AtomicU64,
    pub(super) lost: watch::Sender<u64>,
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
    pub(super) fn opened(&self) -> u64 {
        self.opened.load(Ordering::SeqCst)
    }
}

/// Held by one ListAndWatch stream: its drop (kubelet went away from it, or the server stops)
/// reports a loss when the stream was the latest and the server was not stopping.
pub(super) struct StreamEnd {
    pub(super) streams: Arc<Streams>,
    pub(super) number: u64,
    pub(super) stop: CancellationToken,
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
pub(super) async fn lifecycle<P: ResourcePlugin>(
    kubelet: Arc<PluginSockets>,
    service: PluginService<P>,
    cancel: CancellationToken,
) {
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
        // Whether the last registration ended with kubelet going away: said once, then waited
        // for quietly.
        let mut gone = false;
        let outcome = loop {
            // Streams opened from here on belong to this registration (kubelet may open one
            // before its Register answer reaches us).
            let before = service.streams.opened();
            let registration =
                register_until_done(&kubelet, &service, &cancel, &mut events, inode, gone);
            gone = false;
            match registration.await {
                Registration::Stopped => break Restart::Stopped,
                Registration::SocketGone => break Restart::Kubelet,
                Registration::Done(dialed) => {
                    tracing::info!(resource = %resource.name, elapsed = ?started.elapsed(), "registered with kubelet");
                    let registered = Instant::now();
                    service.report.registered(true);
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
                    service.report.registered(false);
                    match restart {
                        Restart::StreamLost => {}
                        Restart::KubeletGone => {
                            tracing::info!(resource = %resource.name, kubelet = %kubelet.socket.display(), "kubelet stopped (its socket refuses connections); registering again when it is back");
                            gone = true;
                            continue;
                        }
                        restart => break restart,
                    }
                    service.report.stream_lost();
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
    /// Registered with the kubelet listening on `kubelet.sock`, the file of this identity.
    Done(Option<SocketId>),
    /// kubelet cleaned the directory while we were starting: serve again.
    SocketGone,
    Stopped,
}

/// The longest wait between two looks at an absent or silent kubelet: when no inotify event
/// says that kubelet is back (a directory inotify cannot watch, a kubelet that binds its socket
/// without cleaning), a dial that succeeds is the sign.
const ABSENT_RETRY_MAX: Duration = Duration::from_secs(1);

/// The longest wait between two registrations kubelet answered with an error.
const REFUSED_RETRY_MAX: Duration = Duration::from_secs(5);

/// Registers until it succeeds, our socket disappears, or the server is stopped. `gone`: kubelet
/// was just seen going away (already said): its absence is not logged again.
async fn register_until_done<P: ResourcePlugin>(
    kubelet: &PluginSockets,
    service: &PluginService<P>,
    cancel: &CancellationToken,
    events: &mut broadcast::Receiver<DirEvent>,
    inode: u64,
    gone: bool,
) -> Registration {
    let resource = &service.resource;
    // Short at first: the usual failure is a kubelet caught between creating its socket (which
    // woke us) and listening on it, a window of microseconds; then doubling up to a cap.
    let mut delay = Duration::from_millis(5);
    // What was last said about this registration: a condition that lasts is logged once, a new
    // one (another reason from kubelet) again.
    let mut said: Option<String> = gone.then(|| NOT_LISTENING.to_owned());
    // Whether the last dial was refused by a socket that listened right after it.
    let mut dial_refused_once = false;
    loop {
        if socket_inode(&resource.socket) != Some(inode) {
            return Registration::SocketGone;
        }
        let mut cap = ABSENT_RETRY_MAX;
        if kubelet.socket.exists() {
            // The Created event of the very kubelet we are about to call may still be queued:
            // only a socket other than this one means a new kubelet.
            let dialed = socket_id(&kubelet.socket);
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
                            if kubelet.is_socket(&name) && socket_id(&kubelet.socket) != dialed =>
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
                // Nobody listens (a stopped kubelet's socket, left behind): no answer, nothing
                // refused; kubelet is waited for.
                Err(e) if !listening(&kubelet.socket).await => {
                    if said.as_deref() != Some(NOT_LISTENING) {
                        tracing::info!(resource = %resource.name, kubelet = %kubelet.socket.display(), "kubelet is not listening on its socket; registering when it is");
                        said = Some(NOT_LISTENING.to_owned());
                    }
                    tracing::debug!(resource = %resource.name, error = %e, "registration failed");
                }
                // The dial was refused, yet the socket listens now: a starting kubelet binds its
                // socket (which woke us) before it listens, and the dial fell between the two.
                // An ordinary restart, retried after the short delay; only a second such refusal
                // in a row is a failure.
                Err(RegisterError::Connect { .. }) if !dial_refused_once => {
                    dial_refused_once = true;
                    tracing::debug!(resource = %resource.name, "kubelet's socket listens only now; registering again");
                }
                Err(e) => {
                    let reason = match &e {
                        RegisterError::Refused { status, .. } => status.message().to_owned(),
                        e => e.to_string(),
                    };
                    if said.as_ref() != Some(&reason) {
                        tracing::warn!(resource = %resource.name, kubelet = %kubelet.socket.display(), error = %e, "registration failed; retrying");
                        said = Some(reason.clone());
                    } else {
                        tracing::debug!(resource = %resource.name, error = %e, "registration failed");
                    }
                    service.report.registration_failed(&reason);
                    cap = REFUSED_RETRY_MAX;
                }
            }
        } else if said.is_none() {
            tracing::warn!(resource = %resource.name, kubelet = %kubelet.socket.display(), "kubelet socket absent; waiting for it");
            said = Some(ABSENT.to_owned());
        }
        // Wait for kubelet.sock to (re)appear, with a backoff as a safety net.
        let deadline = tokio::time::sleep(delay.min(cap));
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
        delay = (delay * 2).min(cap);
    }
}

/// What [`register_until_done`] said last, for the conditions that are not kubelet's answers.
const NOT_LISTENING: &str = "not listening";
const ABSENT: &str = "absent";

/// After registering with the kubelet of the `kubelet.sock` identified as `dialed`: waits for
/// kubelet to restart or go away, for a stream opened after `before` to end, or for a stop.
async fn wait_for_restart<P: ResourcePlugin>(
    kubelet: &PluginSockets,
    service: &PluginService<P>,
    cancel: &CancellationToken,
    events: &mut broadcast::Receiver<DirEvent>,
    inode: u64,
    dialed: Option<SocketId>,
    before: u64,
) -> Restart {
    let resource = &service.resource;
    let mut lost = service.streams.lost.subscribe();
    // Events queued before registration finished are history now.
    while events.try_recv().is_ok() {}
    loop {
        if socket_inode(&resource.socket) != Some(inode) {
            return Restart::Kubelet;
        }
        let event = tokio::select! {
            _ = cancel.cancelled() => return Restart::Stopped,
            // The guard `wait_for` gives is dropped here, before the look at kubelet's socket.
            _ = lost.wait_for(|n| *n > before) => None,
            event = dir::next_event(events) => Some(event),
        };
        let Some(event) = event else {
            return why_stream_ended(kubelet, &resource.socket, inode, dialed).await;
        };
        match event {
            // A Created event of the socket registered with (its inotify event arriving after
            // the registration) is no new kubelet: one registration per kubelet.
            Some(DirEvent::Created(name))
                if kubelet.is_socket(&name) && socket_id(&kubelet.socket) != dialed =>
            {
                return Restart::Kubelet;
            }
            // kubelet went away: our registration went with it, until the next kubelet.
            Some(DirEvent::Removed(name)) if kubelet.is_socket(&name) => {
                service.report.registered(false);
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

/// Why kubelet's latest stream on `socket` (ours, bound as `inode`) ended. kubelet gone (its
/// socket refuses connections, whatever file is there): it is waited for. A new kubelet (it
/// removes every plugin socket before it listens, and binds `kubelet.sock` anew): serve again.
/// Else the kubelet registered with dropped the stream while it kept running.
async fn why_stream_ended(
    kubelet: &PluginSockets,
    socket: &Path,
    inode: u64,
    dialed: Option<SocketId>,
) -> Restart {
    if socket_inode(socket) != Some(inode) {
        return Restart::Kubelet;
    }
    if !listening(&kubelet.socket).await {
        return Restart::KubeletGone;
    }
    if socket_inode(socket) != Some(inode) || socket_id(&kubelet.socket) != dialed {
        return Restart::Kubelet;
    }
    Restart::StreamLost
}

/// How long kubelet may take to answer an HTTP/2 handshake on its socket before it counts as
/// there but busy (a full accept queue, a loaded machine).
const DIAL_PROBE: Duration = Duration::from_secs(1);

/// The client's HTTP/2 connection preface and an empty SETTINGS frame: what any gRPC client
/// sends first, and what kubelet's gRPC server answers with its own SETTINGS.
const HTTP2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// Whether a running kubelet serves `socket`: the one sign that kubelet runs, since a stopped
/// kubelet leaves its socket file behind. A connect alone is not enough: while kubelet's process
/// exits, its streams end before its listening socket closes, and the kernel still completes
/// connections into that socket's queue for those milliseconds; nobody answers them, and they are
/// reset when the socket closes. So the probe waits for kubelet's HTTP/2 server to answer.
async fn listening(socket: &Path) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut conn = UnixStream::connect(socket).await?;
        conn.write_all(HTTP2_HELLO).await?;
        // The first frame header of the answer: a server that reads the preface sends its
        // SETTINGS; a dying process's queued connection reads end-of-file or a reset instead.
        let mut header = [0u8; 9];
        conn.read_exact(&mut header).await?;
        Ok::<(), std::io::Error>(())
    };
    match tokio::time::timeout(DIAL_PROBE, probe).await {
        Ok(Ok(())) | Err(_) => true,
        Ok(Err(_)) => false,
    }
}

/// Runs the gRPC server on `listener` until `stop`; streams end first so shutdown is prompt.
async fn serve<P: ResourcePlugin>(
    listener: UnixListener,
    service: PluginService<P>,
    stop: CancellationToken,
) {
    let service = PluginService {
        stop: stop.clone(),
        ..service
    };
    // kubelet's device-plugin client sends `localhost`; other clients' authorities are accepted
    // as on every socket kubelet dials (crate::authority).
    let result = tonic::transport::Server::builder()
        .add_service(DevicePluginServer::new(service))
        .serve_with_incoming_shutdown(crate::authority::incoming(listener), stop.cancelled_owned())
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

/// A file told apart from another at the same path, also when a new one gets the inode number
/// of a removed one back: its device, inode and change time.
type SocketId = (u64, u64, i64, i64);

fn socket_id(path: &Path) -> Option<SocketId> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}
