//! Directory listings of the dev root kept between scans, patched from the change watcher's
//! inotify events instead of listed again.
//!
//! Why: a scanner lists the same directories on every scan, and a listing costs a `getdents` and
//! a `statx` per entry in the host (about 1 µs an entry: 10 ms for a directory of 10,000 device
//! nodes, every time one of them changes). The kernel already tells the host which entries
//! changed: the change watcher ([`crate::sandbox`]'s) reads an inotify event for every entry
//! created, removed, moved or changed in mode under the dev root. A kept listing is patched with
//! a `stat` of each named entry, so a scan after one hot-plug costs one `stat`, not 10,000.
//!
//! Why it is never stale for a scan that reacts to a change: the watcher notes each event here
//! *before* it wakes the guests, so a guest woken by a change finds it noted. An event still
//! queued in the kernel when a scan lists (a scan on its timer, racing a hot-plug) is noted
//! afterwards and then wakes the guest, whose next scan sees it: what a fresh listing racing the
//! same change would give. Whatever the watcher cannot vouch for is listed afresh:
//! - nothing is kept until a watcher is connected, and nothing from the moment it is dropped or
//!   its task ends (the drop disconnects it before it returns: a listing taken after the drop is
//!   fresh, whenever the task's end comes);
//! - the queue overflowed (events were lost): every listing is dropped;
//! - a directory removed or unmounted (its watch is gone): its listing is dropped;
//! - a directory on another filesystem than the dev root's (a mount such as `/dev/pts`, whose
//!   filesystem may create entries without inotify events) is never kept.
//!
//! Listings are keyed by the watch descriptor of the directory's inode, which the kernel gives
//! per inode: a directory renamed keeps its listing, and a path that names another directory
//! now (replaced, or a different symlink) finds that directory's. The watch is placed through
//! `/proc/self/fd` on the directory already opened beneath the root, so the inode watched is the
//! one listed, whatever symlinks the path crossed.
//!
//! A kept listing also answers *what changed* since an earlier answer (`devfs.read-dir-changes`,
//! [`Listings::changes`]): each entry a patch changes is written in the listing's log under the
//! listing's next sequence number, and an answer carries a version (the listing's number and
//! its sequence number). Asked again with that version, the host answers the entries named in
//! the log since: a scan after one hot-plug lowers one entry into the guest, not 10,000. A
//! version the host cannot vouch for (another listing's, one older than the log's bounded
//! length, or any while nothing is kept) is answered with the whole listing, so a guest is
//! never told less than a fresh listing would tell it.
//!
//! Known limit: a filesystem mounted over an entry of a kept directory after it was listed (a
//! mount makes no inotify event) shows the entry as it was until the entry itself changes. The
//! mounts under /dev (`pts`, `shm`, `mqueue`, `hugepages`) are made at boot, before the host.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cap_std::fs::{Dir, MetadataExt};
use inotify::{EventMask, WatchDescriptor, WatchMask, Watches};

use super::{MAX_DIR_ENTRIES, Node};

/// Most directories kept at once: a bound for a guest that lists ever-new directories. Beyond
/// it, other directories are listed afresh each time.
const MAX_LISTINGS: usize = 256;

/// Most entries a listing's log of changes holds: a version older than that is answered with
/// the whole listing.
const MAX_LOG: usize = 1024;

/// The events a kept listing needs of its directory: every entry made, removed, moved or changed
/// in mode. The change watcher watches directories with these (and more).
pub const EVENTS: WatchMask = WatchMask::CREATE
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::ATTRIB);

/// The dev root's kept listings. Shared by the [`super::DevFs`] that serves guests and the
/// change watcher that keeps them true ([`Listings::connect`], [`Listings::note`]).
#[derive(Debug)]
pub struct Listings {
    /// The dev root's filesystem: only its directories are kept.
    root_dev: u64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The connected watcher; `None` while none is (nothing is kept then).
    watcher: Option<Watcher>,
    /// Connections made so far: each has its own number, so that a watcher disconnected (whose
    /// task may still be noting) or a listing begun under it can never touch what another
    /// watcher's instance, with its own watch descriptors, keeps.
    connections: u64,
    /// Listings kept so far: each has its own number, which its versions carry.
    kept: u32,
    by_watch: HashMap<WatchDescriptor, Listing>,
}

#[derive(Debug)]
struct Watcher {
    /// Its inotify instance.
    watches: Watches,
    /// The mask it watches directories with.
    mask: WatchMask,
    /// Its connection's number.
    connection: u64,
}

impl State {
    /// True while `connection` is the connected watcher's.
    fn connected(&self, connection: u64) -> bool {
        self.watcher
            .as_ref()
            .is_some_and(|w| w.connection == connection)
    }
}

#[derive(Debug)]
struct Listing {
    /// `None` while the first listing is being taken (outside the lock): events meanwhile are
    /// noted in `changed` all the same.
    nodes: Option<BTreeMap<String, Node>>,
    /// Entries named by events since they were last looked at.
    changed: HashSet<OsString>,
    /// What versions of this listing say (set when it is first kept).
    log: Log,
}

/// The changes a kept listing went through, for [`Listings::changes`].
#[derive(Debug, Default)]
struct Log {
    /// The listing's number, unique among the listings of this dev root (never 0).
    number: u32,
    /// The sequence number of the last change.
    seq: u32,
    /// The oldest sequence number the log can answer from: changes after it are all in
    /// `names`.
    floor: u32,
    /// The entries changed, by sequence number, oldest first; at most [`MAX_LOG`].
    names: VecDeque<(u32, String)>,
}

impl Log {
    fn new(number: u32) -> Self {
        Log {
            number,
            ..Log::default()
        }
    }

    /// The version an answer given now carries.
    fn version(&self) -> u64 {
        (u64::from(self.number) << 32) | u64::from(self.seq)
    }

    /// Notes that entry `name` changed. False when the log has run out of sequence numbers:
    /// the listing is to be dropped (and kept again afresh, under a new number).
    fn push(&mut self, name: &str) -> bool {
        let Some(seq) = self.seq.checked_add(1) else {
            return false;
        };
        self.seq = seq;
        self.names.push_back((seq, name.to_owned()));
        if self.names.len() > MAX_LOG
            && let Some((oldest, _)) = self.names.pop_front()
        {
            self.floor = oldest;
        }
        true
    }

    /// The entries changed since `version`, sorted by name; `None` when the log cannot say
    /// (another listing's version, or one older than the log).
    fn since(&self, version: u64) -> Option<Vec<&str>> {
        let (number, seq) = ((version >> 32) as u32, version as u32);
        if number != self.number || seq < self.floor || seq > self.seq {
            return None;
        }
        let mut names: Vec<&str> = self
            .names
            .iter()
            .rev()
            .take_while(|(at, _)| *at > seq)
            .map(|(_, name)| name.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        Some(names)
    }
}

/// What [`Listings::changes`] answers: the entries changed and removed since the version asked
/// about, or the whole listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirChanges {
    /// The version to ask with next time; 0 when the listing is not kept (the next answer is
    /// whole again).
    pub version: u64,
    /// True when `changed` is the whole listing (the version asked about could not be vouched
    /// for).
    pub whole: bool,
    /// Entries made or changed since (all of them when `whole`).
    pub changed: Vec<Node>,
    /// Names of entries removed since (empty when `whole`).
    pub removed: Vec<String>,
}

impl DirChanges {
    /// The whole listing `nodes`, with the version to ask with next.
    pub fn whole(nodes: Vec<Node>, version: u64) -> Self {
        DirChanges {
            version,
            whole: true,
            changed: nodes,
            removed: Vec::new(),
        }
    }
}

/// A watcher's connection to [`Listings`]: its events go through [`Connected::note`], and
/// [`Connected::disconnect`] (or the drop) ends the keeping.
///
/// Why an explicit disconnect: the watcher's owner and its task both hold it (in an `Arc`), and
/// whichever stops first must stop the keeping at once. An aborted task ends later, on a runtime
/// thread: until then nothing would note changes, yet kept listings would still be served.
#[derive(Debug)]
pub struct Connected {
    listings: Arc<Listings>,
    connection: u64,
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.disconnect();
    }
}

impl Connected {
    /// Stops the keeping: every listing from now on is taken afresh, and notes of this
    /// connection are ignored. Does nothing when already disconnected (or another watcher has
    /// connected since).
    pub fn disconnect(&self) {
        let mut state = self.listings.lock();
        if state.connected(self.connection) {
            state.watcher = None;
            state.by_watch.clear();
        }
    }

    /// Notes one event of the watcher's instance. Called for every event, before the guests are
    /// told of it.
    pub fn note(&self, wd: &WatchDescriptor, mask: EventMask, name: Option<&OsStr>) {
        let mut state = self.listings.lock();
        if !state.connected(self.connection) {
            return;
        }
        if mask.contains(EventMask::Q_OVERFLOW) {
            state.by_watch.clear();
        } else if mask.contains(EventMask::IGNORED) {
            state.by_watch.remove(wd);
        } else if let (Some(listing), Some(name)) = (state.by_watch.get_mut(wd), name) {
            listing.changed.insert(name.to_owned());
        }
        // An event of the directory itself (moved, its mode changed) leaves its entries as
        // they are: the listing is the inode's.
    }
}

impl Listings {
    /// Listings of directories on filesystem `root_dev` (the dev root's `st_dev`); none are kept
    /// until a watcher connects.
    pub(super) fn new(root_dev: u64) -> Self {
        Listings {
            root_dev,
            state: Mutex::default(),
        }
    }

    /// Connects the watcher whose inotify instance `watches` is: from now on its events must be
    /// given to [`Connected::note`]. `mask` is what it watches directories with (a directory
    /// watched by both is watched with one mask per instance, and adding a watch replaces it);
    /// the path flags in it are dropped, since the watch is placed through a `/proc/self/fd`
    /// link, which must be followed.
    pub fn connect(self: &Arc<Self>, watches: Watches, mask: WatchMask) -> Connected {
        debug_assert!(mask.contains(EVENTS), "a watcher that misses changes");
        let mask = mask.difference(WatchMask::DONT_FOLLOW | WatchMask::ONLYDIR);
        let mut state = self.lock();
        state.connections += 1;
        let connection = state.connections;
        state.watcher = Some(Watcher {
            watches,
            mask,
            connection,
        });
        state.by_watch.clear();
        drop(state);
        Connected {
            listings: self.clone(),
            connection,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent at every step: a panic elsewhere cannot leave it half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The entries of `dir` (opened beneath the dev root), kept or patched when its listing is
    /// kept, else from `fresh`: the listing taken from scratch, whose answer is then kept.
    pub(super) fn list<E>(
        &self,
        dir: &Dir,
        fresh: impl FnOnce() -> Result<Vec<Node>, E>,
    ) -> Result<Vec<Node>, E> {
        self.versioned(dir, fresh).map(|(nodes, _)| nodes)
    }

    /// What changed in `dir` since the answer that carried `since`: the entries named in the
    /// kept listing's log since then, or the whole listing ([`Listings::list`]'s) when the log
    /// cannot say.
    pub(super) fn changes<E>(
        &self,
        dir: &Dir,
        since: u64,
        fresh: impl FnOnce() -> Result<Vec<Node>, E>,
    ) -> Result<DirChanges, E> {
        if since != 0 {
            let mut state = self.lock();
            if let Some((_, wd)) = watch(&mut state, dir, self.root_dev)
                && let Some(Listing {
                    nodes: Some(nodes),
                    changed,
                    log,
                }) = state.by_watch.get_mut(&wd)
            {
                if !patch(dir, nodes, changed, log) {
                    state.by_watch.remove(&wd);
                } else if let Some(names) = log.since(since) {
                    let (mut made, mut removed) = (Vec::new(), Vec::new());
                    for name in names {
                        match nodes.get(name) {
                            Some(node) => made.push(node.clone()),
                            None => removed.push(name.to_owned()),
                        }
                    }
                    return Ok(DirChanges {
                        version: log.version(),
                        whole: false,
                        changed: made,
                        removed,
                    });
                }
            }
        }
        let (nodes, version) = self.versioned(dir, fresh)?;
        Ok(DirChanges::whole(nodes, version))
    }

    /// [`Listings::list`], with the version of the kept listing the answer is (0 when it is
    /// not kept).
    fn versioned<E>(
        &self,
        dir: &Dir,
        fresh: impl FnOnce() -> Result<Vec<Node>, E>,
    ) -> Result<(Vec<Node>, u64), E> {
        let unkept = |fresh: Result<Vec<Node>, E>| fresh.map(|nodes| (nodes, 0));
        let mut state = self.lock();
        let Some((connection, wd)) = watch(&mut state, dir, self.root_dev) else {
            drop(state);
            return unkept(fresh());
        };
        let full = state.by_watch.len() >= MAX_LISTINGS;
        match state.by_watch.get_mut(&wd) {
            Some(Listing {
                nodes: Some(nodes),
                changed,
                log,
            }) => {
                if patch(dir, nodes, changed, log) {
                    return Ok((nodes.values().cloned().collect(), log.version()));
                }
                // Grown past what a listing may hold: listed afresh, which refuses it.
                state.by_watch.remove(&wd);
                drop(state);
                return unkept(fresh());
            }
            // Another guest is listing it now: this one lists too, without keeping.
            Some(_) => {
                drop(state);
                return unkept(fresh());
            }
            None if full => {
                drop(state);
                return unkept(fresh());
            }
            None => {}
        }
        state.kept = state.kept.wrapping_add(1).max(1);
        let number = state.kept;
        state.by_watch.insert(
            wd.clone(),
            Listing {
                nodes: None,
                changed: HashSet::new(),
                log: Log::new(number),
            },
        );
        // Listed without the lock: other guests' listings and the watcher's notes go on.
        drop(state);
        let listed = fresh();
        let mut state = self.lock();
        let Ok(nodes) = &listed else {
            state.by_watch.remove(&wd);
            return unkept(listed);
        };
        // Gone meanwhile (the queue overflowed, the directory went, the watcher was
        // disconnected): this answer stands, as a fresh listing's would, but it is not kept.
        if !state.connected(connection) {
            return unkept(listed);
        }
        if let Some(listing) = state.by_watch.get_mut(&wd) {
            let mut kept = nodes
                .iter()
                .map(|n| (n.name.clone(), n.clone()))
                .collect::<BTreeMap<_, _>>();
            if listing.changed.is_empty() {
                listing.nodes = Some(kept);
                let version = listing.log.version();
                return listed.map(|nodes| (nodes, version));
            }
            // Entries changed while it was listed: the listing may hold either state of them.
            if !patch(dir, &mut kept, &mut listing.changed, &mut listing.log) {
                state.by_watch.remove(&wd);
                return unkept(listed);
            }
            let answer = kept.values().cloned().collect();
            listing.nodes = Some(kept);
            return Ok((answer, listing.log.version()));
        }
        unkept(listed)
    }
}

/// The connected watcher's number and the watch of `dir`'s inode in its instance (placed if need
/// be), when `dir`'s listing may be kept: on filesystem `root_dev`, while a watcher is connected.
fn watch(state: &mut State, dir: &Dir, root_dev: u64) -> Option<(u64, WatchDescriptor)> {
    // No watcher (a host without one, or the tools that read a dev root once): not even the
    // `fstat`.
    let watcher = state.watcher.as_mut()?;
    if dir.dir_metadata().ok()?.dev() != root_dev {
        return None;
    }
    // The same inode watched twice in one instance is one watch: this returns the watch the
    // watcher already has when it watches this directory.
    let link = format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd());
    let wd = watcher.watches.add(link, watcher.mask).ok()?;
    Some((watcher.connection, wd))
}

/// Applies the entries named in `changed` to `nodes`, each looked up again (gone, or no longer
/// describable: removed, as a fresh listing skips it), and writes those that changed in `log`.
/// False when the listing cannot be kept: `nodes` grew past [`MAX_DIR_ENTRIES`], or `log` ran
/// out of sequence numbers.
fn patch(
    dir: &Dir,
    nodes: &mut BTreeMap<String, Node>,
    changed: &mut HashSet<OsString>,
    log: &mut Log,
) -> bool {
    let mut kept = true;
    for name in changed.drain() {
        // A fresh listing skips names WIT strings cannot carry.
        let Ok(name) = name.into_string() else {
            continue;
        };
        match dir.symlink_metadata(&name) {
            Ok(meta) => {
                let node = super::dir::node(name.clone(), &meta);
                if nodes.get(&name) != Some(&node) {
                    kept &= log.push(&name);
                    nodes.insert(name, node);
                }
            }
            Err(_) => {
                if nodes.remove(&name).is_some() {
                    kept &= log.push(&name);
                }
            }
        }
    }
    kept && nodes.len() <= MAX_DIR_ENTRIES
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use inotify::Inotify;

    use super::*;
    use crate::hostfs::DevFs;

    /// A dev root whose listings are kept, with a watcher stand-in: an inotify instance whose
    /// events the test hands over itself, as the change watcher does, after each change.
    struct Kept {
        devfs: DevFs,
        plain: DevFs,
        inotify: Inotify,
        connected: Option<Connected>,
        /// Per path, a guest's copy built only from `read_dir_changes`: its last version and
        /// the entries.
        followed: HashMap<String, (u64, BTreeMap<String, Node>)>,
    }

    impl Kept {
        fn new(root: &Path) -> Self {
            let devfs = DevFs::open(root).unwrap();
            let inotify = Inotify::init().unwrap();
            let connected = devfs.listings().unwrap().connect(inotify.watches(), EVENTS);
            Kept {
                devfs,
                plain: DevFs::open(root).unwrap(),
                inotify,
                connected: Some(connected),
                followed: HashMap::new(),
            }
        }

        /// Hands over every queued event; true when the queue had overflowed.
        fn deliver(&mut self) -> bool {
            let mut buffer = vec![0u8; 64 * 1024];
            let mut overflowed = false;
            loop {
                match self.inotify.read_events(&mut buffer) {
                    Ok(events) => {
                        let mut any = false;
                        for e in events {
                            any = true;
                            overflowed |= e.mask.contains(EventMask::Q_OVERFLOW);
                            if let Some(c) = &self.connected {
                                c.note(&e.wd, e.mask, e.name);
                            }
                        }
                        if !any {
                            return overflowed;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return overflowed,
                    Err(e) => panic!("{e}"),
                }
            }
        }

        /// The kept listing of `path` equals a fresh one.
        fn check(&mut self, path: &str, what: &str) {
            self.deliver();
            let kept = self.devfs.read_dir(path).map_err(|e| e.to_string());
            let fresh = self.plain.read_dir(path).map_err(|e| e.to_string());
            assert_eq!(kept, fresh, "{path} after {what}");
            self.follow(path, what);
        }

        /// A copy of `path` kept only from the changes since its last version equals a fresh
        /// listing; the answer is the whole listing exactly when the host cannot vouch for the
        /// version. Returns whether it was whole.
        fn follow(&mut self, path: &str, what: &str) -> bool {
            let (since, mut copy) = self.followed.remove(path).unwrap_or_default();
            let fresh = self.plain.read_dir(path).map_err(|e| e.to_string());
            let answer = match self.devfs.read_dir_changes(path, since) {
                Ok(answer) => answer,
                Err(e) => {
                    assert_eq!(Err(e.to_string()), fresh, "{path} after {what}");
                    return true;
                }
            };
            if answer.whole {
                assert!(answer.removed.is_empty());
                copy.clear();
            }
            assert!(answer.changed.is_sorted_by(|a, b| a.name < b.name));
            assert!(answer.removed.is_sorted());
            for name in &answer.removed {
                assert!(copy.remove(name).is_some(), "{path}: {name} removed twice");
            }
            for node in answer.changed {
                copy.insert(node.name.clone(), node);
            }
            let followed: Vec<Node> = copy.values().cloned().collect();
            assert_eq!(Ok(followed), fresh, "{path} followed after {what}");
            self.followed
                .insert(path.to_owned(), (answer.version, copy));
            answer.whole
        }

        fn kept_count(&self) -> usize {
            let state = self.devfs.listings().unwrap().lock();
            state
                .by_watch
                .values()
                .filter(|l| l.nodes.is_some())
                .count()
        }
    }

    /// A device node where the tests may make one (root); a plain file stands in otherwise.
    fn mknod(path: &Path, minor: u32) {
        crate::testing::char_device(path, 240, minor, 0o660)
            .or_else(|_| std::fs::write(path, ""))
            .unwrap();
    }

    #[test]
    fn a_kept_listing_follows_every_kind_of_change() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("bus/sub")).unwrap();
        for i in 0..100 {
            mknod(&root.join(format!("bus/n{i}")), i);
        }
        let mut kept = Kept::new(root);
        kept.check("/dev/bus", "the first listing");
        assert_eq!(kept.kept_count(), 1, "the listing is kept");

        mknod(&root.join("bus/new"), 500);
        kept.check("/dev/bus", "a node created");
        std::fs::remove_file(root.join("bus/n3")).unwrap();
        kept.check("/dev/bus", "a node removed");
        std::fs::remove_file(root.join("bus/n4")).unwrap();
        mknod(&root.join("bus/n4"), 900);
        kept.check("/dev/bus", "a node replaced by another device");
        std::fs::set_permissions(
            root.join("bus/n5"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        kept.check("/dev/bus", "a mode changed");
        std::fs::rename(root.join("bus/n6"), root.join("bus/renamed")).unwrap();
        kept.check("/dev/bus", "a node renamed");
        std::fs::rename(root.join("bus/n7"), root.join("bus/sub/n7")).unwrap();
        kept.check("/dev/bus", "a node moved out");
        kept.check("/dev/bus/sub", "a node moved in");
        std::os::unix::fs::symlink("n8", root.join("bus/link")).unwrap();
        kept.check("/dev/bus", "a symlink made");
        std::fs::create_dir(root.join("bus/dir")).unwrap();
        kept.check("/dev/bus", "a directory made");
        std::fs::remove_dir(root.join("bus/dir")).unwrap();
        kept.check("/dev/bus", "a directory removed");

        // The path names another directory now: that one's listing, not the kept one.
        std::fs::rename(root.join("bus"), root.join("old")).unwrap();
        std::fs::create_dir(root.join("bus")).unwrap();
        mknod(&root.join("bus/only"), 1);
        kept.check("/dev/bus", "the directory replaced");
        kept.check("/dev/old", "the directory renamed");
        std::os::unix::fs::symlink("old", root.join("via")).unwrap();
        kept.check("/dev/via", "a symlink to a kept directory");
        mknod(&root.join("old/late"), 2);
        kept.check("/dev/via", "a change seen through the symlink");

        // Removed and made again: the old watch is gone, nothing of it remains.
        for entry in std::fs::read_dir(root.join("old/sub")).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        std::fs::remove_dir(root.join("old/sub")).unwrap();
        std::fs::create_dir(root.join("old/sub")).unwrap();
        kept.check("/dev/old/sub", "a directory removed and made again");
        kept.check("/dev/nowhere", "a listing of nothing");
        kept.check("/dev/old/n9", "a listing of a node");
    }

    #[test]
    fn changes_are_answered_from_the_log_and_whole_when_it_cannot_say() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("bus")).unwrap();
        std::fs::create_dir_all(root.join("other")).unwrap();
        for i in 0..50 {
            mknod(&root.join(format!("bus/n{i}")), i);
        }
        let mut kept = Kept::new(root);
        assert!(
            kept.follow("/dev/bus", "the first call"),
            "the first is whole"
        );
        mknod(&root.join("bus/new"), 100);
        std::fs::remove_file(root.join("bus/n1")).unwrap();
        kept.deliver();
        let (version, _) = kept.followed["/dev/bus"];
        let answer = kept.devfs.read_dir_changes("/dev/bus", version).unwrap();
        assert!(!answer.whole);
        assert_eq!(answer.removed, ["n1"]);
        let made: Vec<&str> = answer.changed.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(made, ["new"], "only what changed");
        assert!(!kept.follow("/dev/bus", "a node made and one removed"));
        assert!(
            !kept.follow("/dev/bus", "nothing"),
            "nothing changed: still a delta"
        );

        // Another directory's version, a forged one, one from before the log: whole.
        kept.follow("/dev/other", "the first call");
        let (other, _) = kept.followed["/dev/other"];
        for since in [other, u64::MAX, 1, version + (1 << 32)] {
            let answer = kept.devfs.read_dir_changes("/dev/bus", since).unwrap();
            assert!(answer.whole, "version {since:#x}");
            assert_eq!(answer.changed.len(), 50);
        }
        for i in 0..(MAX_LOG + 10) {
            let path = root.join(format!("bus/n{}", 2 + i % 40));
            std::fs::set_permissions(
                path,
                std::os::unix::fs::PermissionsExt::from_mode(0o600 + (i / 40 % 2) as u32),
            )
            .unwrap();
            kept.deliver();
            // Patched as they come, as scans of other guests would.
            kept.devfs.read_dir("/dev/bus").unwrap();
        }
        assert!(kept.follow("/dev/bus", "more changes than the log holds"));
        assert!(!kept.follow("/dev/bus", "after that"));
    }

    #[test]
    fn a_log_out_of_sequence_numbers_gives_its_listing_up() {
        let mut log = Log::new(3);
        log.seq = u32::MAX - 1;
        log.floor = u32::MAX - 1;
        let before = log.version();
        assert!(log.push("a"), "the last number is used");
        assert_eq!(log.since(before), Some(vec!["a"]));
        assert!(!log.push("b"), "none is left: the listing is to be dropped");
        // The listing under the next number answers no version of this one.
        assert_eq!(Log::new(4).since(before), None);
    }

    #[test]
    fn nothing_is_kept_without_a_watcher_or_after_an_overflow() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir(root.join("many")).unwrap();
        let mut kept = Kept::new(root);
        kept.check("/dev/many", "the first listing");
        assert_eq!(kept.kept_count(), 1);

        // More events than the kernel queues (16,384 by default), none handed over: the
        // overflow drops every listing, and the next is taken afresh.
        let queued: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
            .map_or(16_384, |s| s.trim().parse().unwrap_or(16_384));
        for i in 0..queued + 10 {
            std::fs::write(root.join(format!("many/f{i}")), "").unwrap();
        }
        assert!(kept.deliver(), "the queue overflowed");
        assert_eq!(kept.kept_count(), 0, "an overflow drops what was kept");
        kept.check("/dev/many", "an overflow");
        assert_eq!(kept.kept_count(), 1);

        // The watcher gone: nothing is kept, and later changes are still seen.
        kept.connected = None;
        assert_eq!(kept.kept_count(), 0);
        std::fs::remove_file(root.join("many/f0")).unwrap();
        kept.check("/dev/many", "the watcher gone");
        assert_eq!(kept.kept_count(), 0);
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Node(u8, u8),
            Remove(u8, u8),
            Chmod(u8, u8),
            Rename(u8, u8, u8, u8),
            List(u8),
        }

        fn op() -> impl Strategy<Value = Op> {
            let d = 0u8..2;
            let n = 0u8..6;
            prop_oneof![
                (d.clone(), n.clone()).prop_map(|(d, n)| Op::Node(d, n)),
                (d.clone(), n.clone()).prop_map(|(d, n)| Op::Remove(d, n)),
                (d.clone(), n.clone()).prop_map(|(d, n)| Op::Chmod(d, n)),
                (d.clone(), n.clone(), d.clone(), n)
                    .prop_map(|(a, b, c, e)| Op::Rename(a, b, c, e)),
                d.prop_map(Op::List),
            ]
        }

        proptest! {
            #![proptest_config(crate::fuzz::config())]

            /// Any sequence of changes in two directories, listed at any points in between: a
            /// kept listing always equals a fresh one.
            #[test]
            fn kept_listings_equal_fresh_ones(ops in prop::collection::vec(op(), 1..40)) {
                let tmp = tempfile::tempdir().unwrap();
                let root = tmp.path();
                for d in 0..2 {
                    std::fs::create_dir(root.join(format!("d{d}"))).unwrap();
                }
                let mut kept = Kept::new(root);
                let at = |d: u8, n: u8| root.join(format!("d{d}/e{n}"));
                for op in &ops {
                    // Failures (a name already taken, or absent) are changes not made.
                    match *op {
                        Op::Node(d, n) => mknod_if_absent(&at(d, n), n.into()),
                        Op::Remove(d, n) => drop(std::fs::remove_file(at(d, n))),
                        Op::Chmod(d, n) => drop(std::fs::set_permissions(
                            at(d, n),
                            std::os::unix::fs::PermissionsExt::from_mode(0o600 + u32::from(n)),
                        )),
                        Op::Rename(a, b, c, e) => drop(std::fs::rename(at(a, b), at(c, e))),
                        Op::List(d) => kept.check(&format!("/dev/d{d}"), &format!("{ops:?}")),
                    }
                }
                for d in 0..2 {
                    kept.check(&format!("/dev/d{d}"), &format!("{ops:?}"));
                }
            }
        }

        fn mknod_if_absent(path: &Path, minor: u32) {
            if std::fs::symlink_metadata(path).is_err() {
                mknod(path, minor);
            }
        }
    }
}
