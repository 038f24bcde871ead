//! Noticing that the config file may have changed, the ways it is replaced in practice.
//!
//! The file itself is not watched: editors write a temporary file and rename it over the old one,
//! and Kubernetes updates a ConfigMap volume by writing a new `..<timestamp>` directory and
//! swapping the `..data` symlink the file's own symlink points through. Either way the watched
//! inode is never written. So the directory holding the file is watched (inotify), and an event
//! on the file's name or on any `..`-prefixed name (the ConfigMap machinery) counts. A burst of
//! events (temp file, rename, symlink swap, old directory removed) is coalesced into one signal,
//! sent once the directory has been quiet for [`QUIET`]. Whether the contents really changed is
//! for the receiver to decide: a signal only means "read it again".

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use inotify::{EventMask, Inotify, WatchMask};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

/// How long the directory must be quiet before a burst of events counts as done.
pub const QUIET: Duration = Duration::from_millis(200);
/// Longest a burst is held back: a directory that is never quiet still gets read.
pub const MAX_BURST: Duration = Duration::from_secs(2);

/// A watch on the config file's directory. Dropping it stops the watch.
pub struct ConfigWatch {
    dir: PathBuf,
    rx: mpsc::Receiver<()>,
    /// Aborted when this is dropped: the watch ends with its owner.
    _task: AbortOnDropHandle<()>,
}

impl ConfigWatch {
    /// Watches the directory of `config`. Must run inside a tokio runtime.
    pub fn start(config: &Path) -> io::Result<Self> {
        let dir = match config.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = config
            .file_name()
            .map(OsString::from)
            .ok_or_else(|| io::Error::other(format!("{} names no file", config.display())))?;
        let inotify = Inotify::init()?;
        inotify.watches().add(
            &dir,
            WatchMask::CREATE
                | WatchMask::DELETE
                | WatchMask::MODIFY
                | WatchMask::CLOSE_WRITE
                | WatchMask::MOVED_FROM
                | WatchMask::MOVED_TO
                | WatchMask::ATTRIB
                | WatchMask::DELETE_SELF
                | WatchMask::MOVE_SELF
                | WatchMask::ONLYDIR,
        )?;
        let mut events = inotify.into_event_stream(vec![0u8; 4096])?;
        // One pending signal is enough: the receiver reads the file once for all of them.
        let (tx, rx) = mpsc::channel(1);
        let watched = dir.clone();
        let task = tokio::spawn(async move {
            loop {
                // Wait for an event that concerns the file.
                loop {
                    match events.next().await {
                        Some(Ok(e))
                            if e.mask.intersects(
                                EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED,
                            ) =>
                        {
                            tracing::error!(dir = %watched.display(), "the config directory went away: config changes are no longer seen (SIGHUP still reloads)");
                            return;
                        }
                        Some(Ok(e)) if concerns(&name, e.mask, e.name.as_deref()) => break,
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            tracing::error!(dir = %watched.display(), error = %e, "watching the config directory failed: config changes are no longer seen (SIGHUP still reloads)");
                            return;
                        }
                        None => return,
                    }
                }
                // Coalesce the rest of the burst.
                let started = Instant::now();
                loop {
                    let until = (Instant::now() + QUIET).min(started + MAX_BURST);
                    match tokio::time::timeout_at(until, events.next()).await {
                        Ok(Some(Ok(_))) => {}
                        Ok(Some(Err(_)) | None) | Err(_) => break,
                    }
                }
                // Full: a signal is already pending, which covers this one.
                let _ = tx.try_send(());
            }
        });
        Ok(ConfigWatch {
            dir,
            rx,
            _task: AbortOnDropHandle::new(task),
        })
    }

    /// The watched directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Waits until the file may have changed. Pending forever once the watch has failed (that
    /// was logged), so a `select!` on it keeps serving signals.
    pub async fn changed(&mut self) {
        if self.rx.recv().await.is_none() {
            std::future::pending::<()>().await;
        }
    }
}

/// True when an event in the directory may have changed what the config path reads: the file's
/// own name, a `..`-prefixed name (a ConfigMap volume's `..data` swap), or lost events.
fn concerns(file: &OsString, mask: EventMask, name: Option<&std::ffi::OsStr>) -> bool {
    if mask.contains(EventMask::Q_OVERFLOW) {
        return true;
    }
    match name {
        Some(n) => n == file.as_os_str() || n.as_encoded_bytes().starts_with(b".."),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_that_concern_the_file() {
        let file = OsString::from("wdp.yaml");
        let create = EventMask::CREATE;
        assert!(concerns(&file, create, Some("wdp.yaml".as_ref())));
        assert!(concerns(
            &file,
            EventMask::MOVED_TO,
            Some("..data".as_ref())
        ));
        assert!(concerns(&file, create, Some("..2026_11_30".as_ref())));
        assert!(concerns(&file, EventMask::Q_OVERFLOW, None));
        // The host's own log next to the config must not wake it up (it would log, and wake).
        assert!(!concerns(
            &file,
            EventMask::MODIFY,
            Some("wdp.log".as_ref())
        ));
        assert!(!concerns(&file, create, Some(".wdp.yaml.swp".as_ref())));
        assert!(!concerns(&file, create, None));
    }
}
