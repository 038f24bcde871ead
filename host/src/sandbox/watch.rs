//! Change notification behind WIT `devfs.wait-for-change`.
//!
//! One inotify instance per host watches the dev root recursively (new directories are followed)
//! and the class, bus and driver directories of the sys root. Every event bumps a generation counter in a
//! `tokio::sync::watch` channel. Each guest store holds its own receiver, which remembers the last
//! generation that guest has seen: a change that happens while the guest is scanning is reported
//! by its next `wait-for-change` at once, so no hot-plug is lost between a scan and the next wait.
//!
//! Real sysfs emits few inotify events (kernfs only notifies attribute changes), so /sys watches
//! mostly serve fixture trees. On a real node the kernel's uevents ([`super::uevent`]) are what
//! announce drivers binding and devices appearing in /sys; they bump the same counter. Bursts
//! coalesce by construction: a guest that wakes on the first event rescans once for everything
//! that happened until its scan ends, and the first event wakes it at once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use super::uevent::Uevents;
use crate::hostfs::listing::{self, Connected, Listings};

/// Upper bound on inotify watches per host; beyond it new directories are not followed.
const MAX_WATCHES: usize = 8192;

/// Owns the watching tasks (inotify, uevents); dropping it stops them.
#[derive(Debug)]
pub struct ChangeWatcher {
    rx: watch::Receiver<u64>,
    /// The dev root's kept listings, as the inotify task keeps them true.
    listings: Option<Arc<Connected>>,
    /// Aborted when this is dropped: the watch ends with its owner.
    tasks: Vec<AbortOnDropHandle<()>>,
}

impl Drop for ChangeWatcher {
    /// The kept listings are disconnected here, not when the aborted task's future is dropped
    /// (later, on a runtime thread): from the moment nothing notes changes, nothing kept is
    /// served.
    fn drop(&mut self) {
        if let Some(listings) = &self.listings {
            listings.disconnect();
        }
    }
}

impl ChangeWatcher {
    /// Starts watching. Must run inside a tokio runtime. If inotify is unavailable (e.g. the
    /// per-user instance limit is reached) the host still works: `wait-for-change` then only
    /// returns at its timeout, and a warning says so.
    ///
    /// Kernel uevents are heard whatever the sys root is (they describe the real machine): with a
    /// fixture root they only cost a rescan that finds nothing new.
    ///
    /// `listings`, the dev root's kept listings, are connected to the inotify instance: each
    /// event is noted there before the guests are told (see [`crate::hostfs::listing`]).
    pub fn start(dev_root: &Path, sys_root: &Path, listings: Option<&Arc<Listings>>) -> Self {
        let (tx, rx) = watch::channel(0u64);
        let mut this = Self::inotify(dev_root, sys_root, listings, &tx, rx);
        match Uevents::open() {
            Ok(uevents) => this
                .tasks
                .push(AbortOnDropHandle::new(tokio::spawn(forward_uevents(
                    uevents, tx,
                )))),
            Err(e) => tracing::warn!(
                error = %e,
                "kernel uevents unavailable: driver and sysfs changes wait for the rescan interval"
            ),
        }
        this
    }

    /// The inotify half of [`ChangeWatcher::start`], telling `rx` through `tx`. Alone in the
    /// tests, where a kernel uevent from elsewhere on the machine would be a change the test did
    /// not make.
    fn inotify(
        dev_root: &Path,
        sys_root: &Path,
        listings: Option<&Arc<Listings>>,
        tx: &watch::Sender<u64>,
        rx: watch::Receiver<u64>,
    ) -> Self {
        let mut this = ChangeWatcher {
            rx,
            listings: None,
            tasks: Vec::new(),
        };
        match Watching::new(dev_root, sys_root, listings) {
            Ok(watching) => {
                this.listings = watching.listings.clone();
                this.tasks.push(AbortOnDropHandle::new(tokio::spawn(
                    watching.run(tx.clone()),
                )));
            }
            Err(e) => tracing::warn!(
                error = %e,
                "inotify unavailable: scanners will only rescan at their timeout"
            ),
        }
        this
    }

    /// A receiver for one guest, with every change so far marked as seen.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        let mut rx = self.rx.clone();
        rx.borrow_and_update();
        rx
    }
}

struct Watching {
    stream: inotify::EventStream<Vec<u8>>,
    watches: Watches,
    /// Directories whose new subdirectories are followed (the dev root's tree).
    recursive: HashMap<WatchDescriptor, PathBuf>,
    /// Where the dev root's kept listings learn of changes; disconnected when this is dropped
    /// (the task's end, aborted or not), or before, when the [`ChangeWatcher`] is.
    listings: Option<Arc<Connected>>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        if let Some(listings) = &self.listings {
            listings.disconnect();
        }
    }
}

/// Every entry change (what the dev root's kept listings need too), never through a symlink.
const DIR_MASK: WatchMask = listing::EVENTS
    .union(WatchMask::DONT_FOLLOW)
    .union(WatchMask::ONLYDIR);

impl Watching {
    fn new(
        dev_root: &Path,
        sys_root: &Path,
        listings: Option<&Arc<Listings>>,
    ) -> std::io::Result<Self> {
        let inotify = Inotify::init()?;
        let stream = inotify.into_event_stream(vec![0u8; 16 * 1024])?;
        let mut this = Watching {
            watches: stream.watches(),
            listings: listings.map(|l| Arc::new(l.connect(stream.watches(), DIR_MASK))),
            stream,
            recursive: HashMap::new(),
        };
        this.add_tree(dev_root);
        for top in ["class", "bus"] {
            let top = sys_root.join(top);
            this.add_one(&top);
            for child in subdirs(&top) {
                this.add_one(&child);
                this.add_one(&child.join("devices"));
                // bus/<bus>/drivers/<driver>: binding and unbinding adds and removes a link
                // there; followed like the dev root, so a driver loaded later is watched too.
                this.add_tree(&child.join("drivers"));
            }
        }
        Ok(this)
    }

    fn add_one(&mut self, dir: &Path) -> Option<WatchDescriptor> {
        if self.watch_count() >= MAX_WATCHES {
            return None;
        }
        self.watches.add(dir, DIR_MASK).ok()
    }

    fn watch_count(&self) -> usize {
        // Recursive watches dominate; sys watches are a few hundred at most.
        self.recursive.len()
    }

    /// Watches `dir` and every directory below it (symlinks are not followed).
    fn add_tree(&mut self, dir: &Path) {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let Some(wd) = self.add_one(&dir) else {
                continue;
            };
            stack.extend(subdirs(&dir));
            self.recursive.insert(wd, dir);
        }
    }

    async fn run(mut self, tx: watch::Sender<u64>) {
        while let Some(event) = self.stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!(error = %e, "inotify read failed; change watching stops");
                    return;
                }
            };
            let new_dir = event.mask.contains(EventMask::ISDIR)
                && event
                    .mask
                    .intersects(EventMask::CREATE | EventMask::MOVED_TO);
            if let (true, Some(parent), Some(name)) =
                (new_dir, self.recursive.get(&event.wd), &event.name)
            {
                let child = parent.join(name);
                self.add_tree(&child);
            }
            if event.mask.contains(EventMask::IGNORED) {
                self.recursive.remove(&event.wd);
            }
            // Before the guests hear of it: a guest woken by this event lists what it changed.
            if let Some(listings) = &self.listings {
                listings.note(&event.wd, event.mask, event.name.as_deref());
            }
            tx.send_modify(|generation| *generation += 1);
            if tx.is_closed() {
                return;
            }
        }
    }
}

/// Bumps the change counter on every relevant kernel uevent, until the socket fails.
async fn forward_uevents(mut uevents: Uevents, tx: watch::Sender<u64>) {
    loop {
        match uevents.next().await {
            Ok(action) => {
                tracing::trace!(action, "kernel uevent");
                tx.send_modify(|generation| *generation += 1);
            }
            Err(e) => {
                tracing::warn!(error = %e, "uevent socket failed; sysfs changes now wait for the rescan interval");
                return;
            }
        }
    }
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::hostfs::DevFs;

    /// A watcher of inotify alone: every change it reports is one the test made.
    fn watching(dev: &Path, sys: &Path, listings: Option<&Arc<Listings>>) -> ChangeWatcher {
        let (tx, rx) = watch::channel(0u64);
        ChangeWatcher::inotify(dev, sys, listings, &tx, rx)
    }

    fn names(devfs: &DevFs, dir: &str) -> Vec<String> {
        let nodes = devfs.read_dir(dir).unwrap();
        nodes.into_iter().map(|n| n.name).collect()
    }

    /// A guest woken by a change lists it: the watcher notes each event in the dev root's kept
    /// listings before it bumps the counter, so no listing read after the wake-up misses it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_woken_guest_lists_the_change_that_woke_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("dev");
        let sys = tmp.path().join("sys");
        std::fs::create_dir_all(dev.join("bus")).unwrap();
        std::fs::create_dir_all(&sys).unwrap();
        let devfs = DevFs::open(&dev).unwrap();
        let watcher = watching(&dev, &sys, devfs.listings());
        let mut rx = watcher.subscribe();
        let names = |devfs: &DevFs| names(devfs, "/dev/bus");
        let mut expected = Vec::new();
        for i in 0..200 {
            // Kept from the second listing on; each round one entry more, or one fewer.
            assert_eq!(names(&devfs), expected, "round {i}");
            let name = format!("n{i:03}");
            if i % 3 == 2 {
                let gone = expected.remove(0);
                std::fs::remove_file(dev.join("bus").join(&gone)).unwrap();
            } else {
                std::fs::write(dev.join("bus").join(&name), "").unwrap();
                expected.push(name);
            }
            tokio::time::timeout(Duration::from_secs(30), rx.changed())
                .await
                .expect("the change is reported")
                .unwrap();
            rx.borrow_and_update();
        }
        assert_eq!(names(&devfs), expected);
        // The watcher dropped: nothing kept from then on, whenever its task ends.
        drop(watcher);
        std::fs::write(dev.join("bus/after"), "").unwrap();
        expected.insert(0, "after".into());
        assert_eq!(names(&devfs), expected);
    }

    /// No listing is served from a kept copy once the watcher is dropped, though its task (here
    /// on a one-thread runtime the test holds) has not ended yet and notes nothing any more.
    #[tokio::test]
    async fn a_listing_after_the_watcher_is_dropped_is_taken_afresh() {
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("dev");
        let sys = tmp.path().join("sys");
        std::fs::create_dir_all(dev.join("bus")).unwrap();
        std::fs::create_dir_all(&sys).unwrap();
        let devfs = DevFs::open(&dev).unwrap();
        let watcher = watching(&dev, &sys, devfs.listings());
        assert!(names(&devfs, "/dev/bus").is_empty());
        std::fs::write(dev.join("bus/early"), "").unwrap();
        assert!(
            names(&devfs, "/dev/bus").is_empty(),
            "kept: the event waits for the watcher's task, which has not run"
        );
        drop(watcher);
        std::fs::write(dev.join("bus/late"), "").unwrap();
        assert_eq!(names(&devfs, "/dev/bus"), ["early", "late"]);

        // A new watcher keeps listings again; the old task's end (now) leaves them be.
        let watcher = watching(&dev, &sys, devfs.listings());
        let mut rx = watcher.subscribe();
        assert_eq!(names(&devfs, "/dev/bus"), ["early", "late"]);
        tokio::task::yield_now().await;
        std::fs::write(dev.join("bus/new"), "").unwrap();
        tokio::time::timeout(Duration::from_secs(30), rx.changed())
            .await
            .expect("the change is reported")
            .unwrap();
        assert_eq!(names(&devfs, "/dev/bus"), ["early", "late", "new"]);
        std::fs::write(dev.join("bus/unnoted"), "").unwrap();
        assert_eq!(
            names(&devfs, "/dev/bus"),
            ["early", "late", "new"],
            "still kept (the event is not read yet)"
        );
    }

    #[tokio::test]
    async fn sees_new_files_in_new_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("dev");
        let sys = tmp.path().join("sys");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(sys.join("class/drm")).unwrap();
        let watcher = watching(&dev, &sys, None);
        let mut rx = watcher.subscribe();
        let wait = |rx: &mut watch::Receiver<u64>| {
            let mut rx = rx.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(30), rx.changed())
                    .await
                    .is_ok()
            }
        };

        std::fs::create_dir(dev.join("dri")).unwrap();
        assert!(wait(&mut rx).await, "mkdir under the dev root");
        // Reported only once the new directory is watched (and only the test makes changes).
        rx.borrow_and_update();
        std::fs::write(dev.join("dri/card0"), "").unwrap();
        assert!(wait(&mut rx).await, "new file in a new directory");
        rx.borrow_and_update();
        std::fs::create_dir(sys.join("class/drm/card0")).unwrap();
        assert!(wait(&mut rx).await, "new sysfs class entry");
    }
}
