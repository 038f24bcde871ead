//! Watching kubelet's device-plugin directory.
//!
//! A restarting kubelet deletes every socket in the directory (its `CleanupPluginDirectory`),
//! then creates `kubelet.sock` again. Both are the signal to serve again and re-register, and both
//! are seen here through inotify as they happen: no polling, no fixed sleeps.
//!
//! The directory itself may go too (an operator's `rm -rf`, a kubelet whose root was wiped): its
//! parent is watched as well, and when the directory is created again it is watched afresh and
//! every subscriber is told to re-check everything ([`DirEvent::Overflow`]), so servers bind and
//! register again without a restart.

use std::io;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use inotify::{EventMask, Inotify, WatchMask};
use tokio::sync::broadcast;
use tokio_util::task::AbortOnDropHandle;

/// What the directory's own watch reports: its files coming and going, and itself going.
const DIR_MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::ONLYDIR);

/// Something happened to a file in the plugin directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirEvent {
    /// A file appeared (created, or moved in).
    Created(String),
    /// A file went away (deleted, or moved out).
    Removed(String),
    /// Events were lost (inotify queue overflow, or a slow subscriber): re-check everything.
    Overflow,
}

/// The watched plugin directory. Dropping it stops the watch.
#[derive(Debug)]
pub struct PluginDir {
    path: PathBuf,
    tx: broadcast::Sender<DirEvent>,
    /// Aborted when this is dropped: the watch ends with its owner.
    _task: AbortOnDropHandle<()>,
}

impl PluginDir {
    /// Creates the directory if needed and starts watching it (and its parent, for the
    /// directory's own removal and re-creation). Must run inside a tokio runtime.
    pub fn watch(path: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(path)?;
        let inotify = Inotify::init()?;
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        let dir_name = path.file_name().map(|n| n.to_os_string());
        let parent_watch = match parent {
            Some(parent) => Some(inotify.watches().add(
                parent,
                WatchMask::CREATE | WatchMask::MOVED_TO | WatchMask::ONLYDIR,
            )?),
            None => None,
        };
        let mut dir_watch = inotify.watches().add(path, DIR_MASK)?;
        let mut stream = inotify.into_event_stream(vec![0u8; 8192])?;
        let (tx, _) = broadcast::channel(256);
        let sender = tx.clone();
        let watched = path.to_path_buf();
        let task = tokio::spawn(async move {
            while let Some(event) = stream.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(e) => {
                        tracing::error!(error = %e, "plugin directory watch failed");
                        return;
                    }
                };
                if Some(&event.wd) == parent_watch.as_ref() {
                    // The directory is back: watch the new one, and have everyone re-check.
                    if event.name.as_ref() == dir_name.as_ref() {
                        match stream.watches().add(&watched, DIR_MASK) {
                            Ok(wd) => {
                                dir_watch = wd;
                                tracing::info!(dir = %watched.display(), "plugin directory created again; serving in it");
                                let _ = sender.send(DirEvent::Overflow);
                            }
                            Err(e) => {
                                tracing::warn!(dir = %watched.display(), error = %e, "cannot watch the re-created plugin directory")
                            }
                        }
                    }
                    continue;
                }
                if event.wd != dir_watch && !event.mask.contains(EventMask::Q_OVERFLOW) {
                    continue;
                }
                if event
                    .mask
                    .intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF)
                {
                    tracing::warn!(dir = %watched.display(), "plugin directory removed; waiting for it to be created again");
                    let _ = sender.send(DirEvent::Overflow);
                    continue;
                }
                let name = event.name.map(|n| n.to_string_lossy().into_owned());
                let out = if event.mask.contains(EventMask::Q_OVERFLOW) {
                    DirEvent::Overflow
                } else if event.mask.contains(EventMask::IGNORED) {
                    continue;
                } else if let Some(name) = name {
                    if event
                        .mask
                        .intersects(EventMask::CREATE | EventMask::MOVED_TO)
                    {
                        DirEvent::Created(name)
                    } else {
                        DirEvent::Removed(name)
                    }
                } else {
                    continue;
                };
                // No receivers is fine: nobody is serving right now.
                let _ = sender.send(out);
            }
        });
        Ok(PluginDir {
            path: path.to_path_buf(),
            tx,
            _task: AbortOnDropHandle::new(task),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Events from now on. Subscribe before acting, so nothing that follows is missed.
    pub fn subscribe(&self) -> broadcast::Receiver<DirEvent> {
        self.tx.subscribe()
    }
}

/// Receives the next event, turning a lagging receiver into [`DirEvent::Overflow`].
pub async fn next_event(rx: &mut broadcast::Receiver<DirEvent>) -> Option<DirEvent> {
    match rx.recv().await {
        Ok(event) => Some(event),
        Err(broadcast::error::RecvError::Lagged(_)) => Some(DirEvent::Overflow),
        Err(broadcast::error::RecvError::Closed) => None,
    }
}
