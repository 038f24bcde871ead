//! gRPC served on a Unix socket that is put back when it disappears.
//!
//! kubelet's plugin watcher finds plugins by their sockets in `plugins_registry` (inotify, and a
//! scan when kubelet starts) and deregisters a plugin whose socket is removed: a socket someone
//! deleted (a cleanup of the directory, an operator) is a driver kubelet no longer calls. So the
//! path is checked every interval, and when it is gone the socket is bound again; kubelet sees a
//! new socket and registers the driver anew. A different file at the path is left alone: it is
//! another instance's socket (a rolling update), and two instances taking the path from each other
//! in turn would leave kubelet registering and deregistering forever.
//!
//! kubelet's plugin watcher dials the registration socket with the percent-encoded socket path as
//! HTTP/2 `:authority` (and kubelet 1.33 and older dial `dra.sock` so too), which the HTTP/2
//! server under tonic refuses: every connection goes through [`wdp_kubelet::authority`].

use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixListener;
use tonic::service::Routes;

/// How long calls in flight may run once the socket is stopped or bound again.
const GRACE: Duration = Duration::from_millis(500);

/// Why a socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Creating the directory, removing a stale socket or binding failed.
    #[error("socket {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// The file at `path` as (device, inode), or `None` when there is none.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Binds `path` afresh: its directory created, a leftover file removed.
fn bind(path: &Path) -> Result<(UnixListener, Option<(u64, u64)>), SocketError> {
    let err = |source| SocketError::Bind {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    Ok((listener, identity(path)))
}

/// Serves `routes` on `path` until `shutdown` completes, binding the socket again whenever the
/// file at `path` disappears (checked every `check`). `on_bind` runs after each
/// bind (the first included), so a caller can count re-creations or reset registration state.
/// On shutdown the socket file is removed, if it is still ours.
pub async fn serve(
    path: PathBuf,
    routes: Routes,
    check: Duration,
    shutdown: impl Future<Output = ()>,
    mut on_bind: impl FnMut() + Send,
) -> Result<(), SocketError> {
    tokio::pin!(shutdown);
    loop {
        let (listener, ours) = bind(&path)?;
        on_bind();
        tracing::debug!(socket = %path.display(), "serving");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_routes(routes.clone())
                .serve_with_incoming_shutdown(wdp_kubelet::authority::incoming(listener), async {
                    let _ = stopped.await;
                }),
        );
        let mut replaced = false;
        let finished = loop {
            tokio::select! {
                () = &mut shutdown => break true,
                () = tokio::time::sleep(check) => match identity(&path) {
                    None => {
                        tracing::info!(socket = %path.display(), "socket removed; binding it again");
                        break false;
                    }
                    Some(now) if Some(now) != ours && !replaced => {
                        replaced = true;
                        tracing::warn!(socket = %path.display(), "socket replaced by another file (another instance?); not taking it back");
                    }
                    Some(_) => {}
                },
            }
        };
        let _ = stop.send(());
        // A graceful stop waits for every open call, and kubelet keeps the health stream open
        // for good: after a grace period the connections are dropped.
        let mut server = server;
        match tokio::time::timeout(GRACE, &mut server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => {
                tracing::warn!(socket = %path.display(), error = %e, "socket server failed");
            }
            Ok(Err(e)) => {
                tracing::warn!(socket = %path.display(), error = %e, "socket server task failed");
            }
            Err(_) => server.abort(),
        }
        if finished {
            if identity(&path) == ours {
                let _ = std::fs::remove_file(&path);
            }
            return Ok(());
        }
    }
}
