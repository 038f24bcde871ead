//! What the host reads on a guest's behalf, through one seam: the confined, metadata-only view
//! of the dev root that serves WIT `devfs`, and that the policy and the NUMA lookup use too.
//!
//! wasmtime-wasi has no "stat but never open" preopen mode, so /dev is never preopened; guests see
//! it only through these calls. Three rules hold for every call:
//! - guest paths are absolute, under `/dev`, with no `.`, `..` or empty components;
//! - resolution goes through a `cap_std::fs::Dir` of the dev root, so no symlink (absolute, or
//!   relative with `..`) can lead outside it;
//! - nothing here opens a file: only `lstat`, directory listing and `readlink`. A device node's
//!   contents can never be read, and opening one (which has side effects for some drivers) never
//!   happens.
//!
//! [`DevFs`] keeps the path rules; where answers come from is a [`DevReads`], one of three: the
//! host's directory ([`dir::HostDir`]), a snapshot's recorded table ([`table::DevTable`], for
//! `wdp scan --from-snapshot`, resolved by the same rules through [`resolve`]), or either of
//! those wrapped to note every question in a [`record::Recorder`] (`wdp snapshot`). The host's
//! directory keeps its listings between scans ([`listing`]), patched from the change watcher's
//! events.
//!
//! A leaf of the crate: the sandbox, the policy, the topology and the snapshot tools all build on
//! it, and it imports none of them.

pub mod batch;
pub mod dir;
pub mod listing;
pub mod record;
pub mod resolve;
pub mod sys;
pub mod table;

use std::collections::HashSet;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use self::listing::{DirChanges, Listings};
use self::record::Recorder;
use self::table::DevTable;

/// Longest guest path accepted (Linux's `PATH_MAX`).
const MAX_PATH: usize = 4096;
/// Most entries one `read-dir` returns; a larger directory is an error, not a huge allocation.
const MAX_DIR_ENTRIES: usize = 65_536;

/// What a path names, as WIT `devfs.node-kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A character device node.
    CharDevice,
    /// A block device node.
    BlockDevice,
    /// A directory.
    Directory,
    /// A symlink.
    Symlink,
    /// A regular file.
    File,
    /// Anything else (a FIFO, a socket).
    Other,
}

/// Metadata of one entry, as WIT `devfs.node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The entry's name.
    pub name: String,
    /// What it is.
    pub kind: NodeKind,
    /// Major device number; 0 unless a device node.
    pub major: u32,
    /// Minor device number; 0 unless a device node.
    pub minor: u32,
    /// Permission bits only (`mode & 0o7777`).
    pub mode: u32,
}

/// Why a devfs call failed; its text is what the guest receives.
#[derive(Debug, thiserror::Error)]
pub enum DevfsError {
    #[error("{path:?}: not a path under /dev (absolute, no '.', '..' or '//' components)")]
    /// Not an absolute, plain path under `/dev`.
    InvalidPath {
        /// The path concerned.
        path: String,
    },
    #[error("{path:?}: path longer than {MAX_PATH} bytes")]
    /// Longer than `PATH_MAX`.
    TooLong {
        /// The path concerned.
        path: String,
    },
    #[error("{path:?}: not found")]
    /// Nothing there.
    NotFound {
        /// The path concerned.
        path: String,
    },
    #[error("{path:?}: leaves the dev root")]
    /// Resolution would leave the dev root.
    Escape {
        /// The path concerned.
        path: String,
    },
    #[error("{path:?}: not a directory")]
    /// A directory was expected.
    NotADirectory {
        /// The path concerned.
        path: String,
    },
    #[error("{path:?}: not a symlink")]
    /// A symlink was expected.
    NotASymlink {
        /// The path concerned.
        path: String,
    },
    #[error("{path:?}: more than {MAX_DIR_ENTRIES} entries")]
    /// A directory too large to list.
    TooManyEntries {
        /// The path concerned.
        path: String,
    },
    #[error("{path:?}: {error}")]
    /// Any other I/O error.
    Io {
        /// The path concerned.
        path: String,
        /// The underlying error, whole.
        error: io::Error,
    },
}

/// The source of [`DevFs`]'s answers. `rel` is the guest's `path` already checked and made
/// relative to the dev root (`.` for the root); `path` is only for error messages.
pub trait DevReads: Send + Sync + std::fmt::Debug {
    /// The entries of directory `rel` (following a final symlink), in any order.
    fn read_dir(&self, path: &str, rel: &Path) -> Result<Vec<Node>, DevfsError>;

    /// What changed in directory `rel` since the answer that carried version `since`
    /// ([`listing`]); by default (nothing kept) the whole listing, with version 0.
    fn read_dir_changes(
        &self,
        path: &str,
        rel: &Path,
        _since: u64,
    ) -> Result<DirChanges, DevfsError> {
        Ok(DirChanges::whole(self.read_dir(path, rel)?, 0))
    }

    /// The names in directory `rel`, without describing them.
    fn entry_names(&self, path: &str, rel: &Path) -> Result<HashSet<OsString>, DevfsError>;

    /// Describes `rel` as `name`, following a final symlink only when `follow`.
    fn stat(&self, path: &str, rel: &Path, name: String, follow: bool) -> Result<Node, DevfsError>;

    /// The stored target of the symlink `rel`.
    fn read_link(&self, path: &str, rel: &Path) -> Result<String, DevfsError>;

    /// `lstat` of many plain entry `names` of directory `rel` at once, where that is cheaper than
    /// one by one; `None` (the default) to have [`DevFs::stat_in`] ask one by one. A `None` entry
    /// is asked again one by one, so errors always read as [`DevFs::stat`]'s.
    fn stat_batch(&self, _rel: &Path, _names: &[&str]) -> Option<Vec<Option<Node>>> {
        None
    }
}

/// The dev root as guests may see it: the path rules over a [`DevReads`].
#[derive(Debug)]
pub struct DevFs {
    reads: Box<dyn DevReads>,
    root_path: PathBuf,
    /// The host directory's kept listings; `None` for a snapshot's table.
    listings: Option<Arc<Listings>>,
}

impl DevFs {
    /// Opens `root` (normally `/dev`) as the directory every guest path is resolved beneath.
    pub fn open(root: &Path) -> io::Result<Self> {
        let dir = dir::HostDir::open(root)?;
        Ok(DevFs {
            listings: Some(dir.listings().clone()),
            reads: Box::new(dir),
            root_path: root.to_path_buf(),
        })
    }

    /// A dev root served from a snapshot's recorded metadata (`wdp scan --from-snapshot`);
    /// `shown_as` is what [`DevFs::root_path`] reports.
    pub fn from_table(table: Arc<DevTable>, shown_as: PathBuf) -> Self {
        DevFs {
            reads: Box::new(table),
            root_path: shown_as,
            listings: None,
        }
    }

    /// Notes every path asked about in `recorder` (`wdp snapshot`).
    pub fn recording(self, recorder: Arc<Recorder>) -> Self {
        DevFs {
            reads: Box::new(record::Recorded::new(self.reads, recorder)),
            root_path: self.root_path,
            listings: self.listings,
        }
    }

    /// The listings kept of the host directory's entries ([`listing`]), for the change watcher
    /// to connect to; `None` when answers come from a snapshot's table.
    pub fn listings(&self) -> Option<&Arc<Listings>> {
        self.listings.as_ref()
    }

    /// The host directory guests see as `/dev`.
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Lists a directory, sorted by name. Entries whose names are not UTF-8 are skipped: WIT
    /// strings cannot carry them, and no device naming scheme uses them.
    pub fn read_dir(&self, path: &str) -> Result<Vec<Node>, DevfsError> {
        let rel = guest_to_relative(path)?;
        let mut nodes = self.reads.read_dir(path, &rel)?;
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(nodes)
    }

    /// What changed in a directory since the answer that carried version `since` (0: none),
    /// each list sorted by name: the entries made, changed or removed since then, or the whole
    /// listing when the host cannot vouch for that version ([`listing`]). Entries whose names
    /// are not UTF-8 are skipped, as [`DevFs::read_dir`] skips them.
    pub fn read_dir_changes(&self, path: &str, since: u64) -> Result<DirChanges, DevfsError> {
        let rel = guest_to_relative(path)?;
        let mut changes = self.reads.read_dir_changes(path, &rel, since)?;
        changes.changed.sort_by(|a, b| a.name.cmp(&b.name));
        changes.removed.sort();
        Ok(changes)
    }

    /// The names in a directory, without describing them: one listing answers "does it exist"
    /// for many nodes of one directory (the policy's check of a large tree) at the cost of a
    /// few `getdents` calls instead of a `stat` per node.
    pub fn entry_names(&self, path: &str) -> Result<HashSet<OsString>, DevfsError> {
        let rel = guest_to_relative(path)?;
        self.reads.entry_names(path, &rel)
    }

    /// Describes one entry without following a final symlink.
    pub fn stat(&self, path: &str) -> Result<Node, DevfsError> {
        let rel = guest_to_relative(path)?;
        self.reads.stat(path, &rel, entry_name(path), false)
    }

    /// Describes what `path` names after following symlinks, which must stay inside the dev
    /// root: the host's own question when it looks up a node's `major:minor` (NUMA affinity),
    /// never a guest's.
    pub fn stat_following(&self, path: &str) -> Result<Node, DevfsError> {
        let rel = guest_to_relative(path)?;
        self.reads.stat(path, &rel, entry_name(path), true)
    }

    /// The stored target of a symlink. It is only text: following it is the guest's business and
    /// goes through these same checks.
    pub fn read_link(&self, path: &str) -> Result<String, DevfsError> {
        let rel = guest_to_relative(path)?;
        self.reads.read_link(path, &rel)
    }

    /// [`DevFs::stat`] of many entries of one directory: the directory is opened once, where
    /// each `stat` opens the parent of its path beneath the root again (an `openat2` per node:
    /// 30 ms for a tree of 10,000 nodes, which the host's NUMA lookup asks about on every
    /// notify). `names` are plain entry names; answers come in the same order.
    pub fn stat_in(&self, dir: &str, names: &[&str]) -> Vec<Result<Node, DevfsError>> {
        let full = |name: &str| format!("{}/{name}", dir.trim_end_matches('/'));
        let plain =
            |name: &&str| !(name.is_empty() || *name == "." || *name == ".." || name.contains('/'));
        let batch = guest_to_relative(dir).ok().and_then(|rel| {
            let asked: Vec<&str> = names.iter().copied().filter(plain).collect();
            self.reads.stat_batch(&rel, &asked)
        });
        let Some(batch) = batch else {
            // A snapshot, a recording, or a directory that cannot be opened: one by one, so
            // each answer (and error) is exactly what `stat` says.
            return names.iter().map(|name| self.stat(&full(name))).collect();
        };
        let mut answers = batch.into_iter();
        names
            .iter()
            .map(|name| {
                let answer = if plain(name) {
                    answers.next().flatten()
                } else {
                    None
                };
                answer.map_or_else(|| self.stat(&full(name)), Ok)
            })
            .collect()
    }
}

/// The last component of a guest path: the name a described entry carries.
fn entry_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or_default().to_string()
}

/// Maps `/dev/a/b` to `a/b` (and `/dev` to `.`), refusing anything else.
fn guest_to_relative(path: &str) -> Result<PathBuf, DevfsError> {
    if path.len() > MAX_PATH {
        return Err(DevfsError::TooLong {
            path: path.chars().take(64).collect::<String>() + "...",
        });
    }
    let invalid = || DevfsError::InvalidPath { path: path.into() };
    let rest = match path.strip_prefix("/dev") {
        Some("") | Some("/") => return Ok(PathBuf::from(".")),
        Some(rest) => rest.strip_prefix('/').ok_or_else(invalid)?,
        None => return Err(invalid()),
    };
    // One trailing slash is tolerated ("/dev/dri/"); everything else must be a plain name.
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if path.contains('\0')
        || rest
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(invalid());
    }
    Ok(PathBuf::from(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_in_answers_as_stat_does() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("bus")).unwrap();
        std::fs::write(tmp.path().join("bus/a"), "").unwrap();
        std::os::unix::fs::symlink("a", tmp.path().join("bus/link")).unwrap();
        std::fs::write(tmp.path().join("top"), "").unwrap();
        let dev = DevFs::open(tmp.path()).unwrap();
        let describe = |r: Result<Node, DevfsError>| r.map_err(|e| e.to_string());
        for (dir, names) in [
            ("/dev/bus", vec!["a", "link", "missing", "..", ""]),
            ("/dev", vec!["top", "bus"]),
            ("/dev/nowhere", vec!["a"]),
            ("/etc", vec!["passwd"]),
        ] {
            let batch: Vec<_> = dev.stat_in(dir, &names).into_iter().map(describe).collect();
            let one: Vec<_> = names
                .iter()
                .map(|n| describe(dev.stat(&format!("{dir}/{n}"))))
                .collect();
            assert_eq!(batch, one, "{dir}");
        }
        assert_eq!(
            dev.stat_in("/dev/bus", &["link"])[0].as_ref().unwrap().kind,
            NodeKind::Symlink
        );
    }

    #[test]
    fn guest_paths() {
        assert_eq!(guest_to_relative("/dev").unwrap(), PathBuf::from("."));
        assert_eq!(guest_to_relative("/dev/").unwrap(), PathBuf::from("."));
        assert_eq!(
            guest_to_relative("/dev/dri/card0").unwrap(),
            PathBuf::from("dri/card0")
        );
        assert_eq!(
            guest_to_relative("/dev/dri/").unwrap(),
            PathBuf::from("dri")
        );
        for bad in [
            "",
            "dev",
            "/devx",
            "/dev/..",
            "/dev/../etc",
            "/dev/a/../b",
            "/dev/./a",
            "/dev//a",
            "/etc/passwd",
            "/dev/a//",
            "/dev/a\0b",
        ] {
            assert!(guest_to_relative(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(matches!(
            guest_to_relative(&format!("/dev/{}", "a".repeat(5000))),
            Err(DevfsError::TooLong { .. })
        ));
    }

    #[test]
    fn confined_to_root() {
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("dev");
        std::fs::create_dir_all(dev.join("dri")).unwrap();
        std::fs::write(tmp.path().join("secret"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", dev.join("abs")).unwrap();
        std::os::unix::fs::symlink("../secret", dev.join("rel")).unwrap();
        std::os::unix::fs::symlink("..", dev.join("up")).unwrap();
        std::os::unix::fs::symlink("dri", dev.join("inside")).unwrap();
        let fs = DevFs::open(&dev).unwrap();

        let names: Vec<_> = fs
            .read_dir("/dev")
            .unwrap()
            .into_iter()
            .map(|n| n.name)
            .collect();
        assert_eq!(names, ["abs", "dri", "inside", "rel", "up"]);
        assert_eq!(fs.stat("/dev/abs").unwrap().kind, NodeKind::Symlink);
        assert_eq!(fs.read_link("/dev/abs").unwrap(), "/etc");
        assert!(matches!(
            fs.read_dir("/dev/abs"),
            Err(DevfsError::Escape { .. })
        ));
        assert!(matches!(
            fs.stat("/dev/abs/passwd"),
            Err(DevfsError::Escape { .. })
        ));
        assert!(matches!(
            fs.read_dir("/dev/up"),
            Err(DevfsError::Escape { .. })
        ));
        assert!(matches!(
            fs.stat("/dev/up/secret"),
            Err(DevfsError::Escape { .. })
        ));
        assert!(fs.read_dir("/dev/inside").unwrap().is_empty());
        assert!(matches!(
            fs.stat("/dev/nope"),
            Err(DevfsError::NotFound { .. })
        ));
        assert!(matches!(
            fs.read_link("/dev/dri"),
            Err(DevfsError::NotASymlink { .. })
        ));
    }

    /// A dev root recorded by the snapshot recorder and served from its table answers every
    /// question as the real directory does: nodes, links, listings, and the same refusals.
    #[test]
    fn a_recorded_table_answers_like_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("dev");
        std::fs::create_dir_all(dev.join("dri/by-path")).unwrap();
        std::fs::create_dir_all(dev.join("net")).unwrap();
        std::fs::write(dev.join("plain"), "").unwrap();
        std::os::unix::fs::symlink("../card0", dev.join("dri/by-path/pci-card")).unwrap();
        std::os::unix::fs::symlink("/etc", dev.join("abs")).unwrap();
        std::os::unix::fs::symlink("..", dev.join("up")).unwrap();
        std::os::unix::fs::symlink("loop", dev.join("loop")).unwrap();
        std::os::unix::fs::symlink("dri", dev.join("inside")).unwrap();
        // Device nodes where the tests may make them (root); plain files stand in otherwise.
        for (rel, minor) in [("dri/card0", 0), ("net/tun", 200)] {
            if crate::testing::char_device(&dev.join(rel), 226, minor, 0o660).is_err() {
                std::fs::write(dev.join(rel), "").unwrap();
            }
        }
        let paths = [
            "/dev",
            "/dev/dri",
            "/dev/dri/card0",
            "/dev/dri/by-path",
            "/dev/dri/by-path/pci-card",
            "/dev/net",
            "/dev/net/tun",
            "/dev/plain",
            "/dev/abs",
            "/dev/abs/passwd",
            "/dev/up",
            "/dev/up/dev",
            "/dev/loop",
            "/dev/inside",
            "/dev/inside/card0",
            "/dev/nope",
            "/dev/plain/x",
            "/dev/dri/by-path/pci-card/x",
        ];
        let recorder = Arc::new(Recorder::new(tmp.path(), &dev).unwrap());
        let real = DevFs::open(&dev).unwrap().recording(recorder.clone());
        let answers = |fs: &DevFs, p: &str| {
            (
                format!("{:?}", fs.read_dir(p)),
                format!("{:?}", fs.stat(p)),
                format!("{:?}", fs.stat_following(p).map_err(|e| e.to_string())),
                format!("{:?}", fs.read_link(p)),
                format!("{:?}", fs.entry_names(p).map(|n| n.len())),
            )
        };
        let on_disk: Vec<_> = paths.iter().map(|p| answers(&real, p)).collect();
        let rec = recorder.finish();
        assert!(
            rec.dev.values().all(|e| e.contents.is_none()),
            "no contents under /dev"
        );
        let table = DevTable::new(rec.dev.into_iter().map(|(p, e)| (p, e.stat)));
        let replayed = DevFs::from_table(Arc::new(table), dev.clone());
        for (p, want) in paths.iter().zip(on_disk) {
            let got = answers(&replayed, p);
            // The I/O error texts of a loop differ (the OS's vs ours); its kind is what matters.
            if p.ends_with("loop") {
                assert!(
                    got.2.contains("symbolic links") || got.2.contains("Io"),
                    "{p}: {got:?}"
                );
                continue;
            }
            assert_eq!(got, want, "{p}");
        }
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn guest_path() -> impl Strategy<Value = String> {
            prop::collection::vec(
                prop_oneof![
                    Just("escape"),
                    Just("up"),
                    Just(".."),
                    Just("."),
                    Just(""),
                    Just("dri"),
                    Just("card0"),
                    Just("passwd"),
                ],
                0..6,
            )
            .prop_flat_map(|parts| {
                (
                    Just(parts.join("/")),
                    prop_oneof![Just("/dev/"), Just("/dev"), Just("/"), Just("")],
                )
            })
            .prop_map(|(rest, prefix)| format!("{prefix}{rest}"))
        }

        proptest! {
            #![proptest_config(crate::fuzz::config())]

            /// Any string: the resolver never panics and never yields a path with `..`.
            #[test]
            fn resolver_only_yields_plain_relative_paths(path in "\\PC{0,64}") {
                if let Ok(rel) = guest_to_relative(&path) {
                    prop_assert!(rel.is_relative());
                    prop_assert!(rel.components().all(|c| matches!(
                        c,
                        std::path::Component::Normal(_) | std::path::Component::CurDir
                    )));
                }
            }

            /// Paths through symlinks that leave the root never reach what is outside it.
            #[test]
            fn nothing_outside_the_root_is_ever_described(path in guest_path()) {
                let tmp = tempfile::tempdir().unwrap();
                let dev = tmp.path().join("dev");
                std::fs::create_dir_all(dev.join("dri")).unwrap();
                std::fs::write(dev.join("dri/card0"), "").unwrap();
                std::fs::write(tmp.path().join("passwd"), "secret").unwrap();
                std::os::unix::fs::symlink(tmp.path(), dev.join("escape")).unwrap();
                std::os::unix::fs::symlink("..", dev.join("up")).unwrap();
                let fs = DevFs::open(&dev).unwrap();
                let through_link = path
                    .split('/')
                    .collect::<Vec<_>>()
                    .windows(2)
                    .any(|w| matches!(w[0], "escape" | "up") && !w[1].is_empty());
                if through_link {
                    prop_assert!(fs.stat(&path).is_err(), "{path:?} reached outside");
                    prop_assert!(fs.read_dir(&path).is_err(), "{path:?} listed outside");
                }
                prop_assert!(fs.read_link(&path).map_or(true, |t| !t.contains("secret")));
            }
        }
    }
}
