//! The questions of a recorded scan: which paths a guest, and the host on its behalf, asked
//! about under /sys and /dev, and how. `wdp snapshot` reads what they held once the scan is done
//! (`snapshot::record`); here they are only noted, cheaply and deduplicated.

use std::collections::BTreeSet;
use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::listing::DirChanges;
use super::{DevReads, DevfsError, Node};

/// Which root a path is under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Root {
    /// The sys root.
    Sys,
    /// The dev root.
    Dev,
}

/// What was asked of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// Opened (a file's contents are kept; a directory is only kept as existing).
    Open {
        /// Whether a final symlink was followed.
        follow: bool,
    },
    /// Its metadata.
    Stat {
        /// Whether a final symlink was followed.
        follow: bool,
    },
    /// A symlink's target.
    ReadLink,
    /// A directory's listing.
    ReadDir,
}

/// Collects the paths a scan touches. Shared by the WASI filesystem hooks and the devfs.
#[derive(Debug)]
pub struct Recorder {
    sys: PathBuf,
    dev: PathBuf,
    ops: Mutex<BTreeSet<(Root, PathBuf, Access)>>,
}

impl Recorder {
    /// A recorder over the host's sys and dev roots (made canonical: descriptors are compared
    /// with them by their real paths).
    pub fn new(sys: &Path, dev: &Path) -> std::io::Result<Self> {
        Ok(Recorder {
            sys: std::fs::canonicalize(sys)?,
            dev: std::fs::canonicalize(dev)?,
            ops: Mutex::default(),
        })
    }

    /// The guest asked for `path` relative to the /sys directory descriptor `dir` (an open host
    /// directory somewhere under the sys root).
    pub fn sys_at(&self, dir: &std::fs::File, path: &str, access: Access) {
        use std::os::fd::AsRawFd;
        let Ok(base) = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
            return;
        };
        let Ok(base) = base.strip_prefix(&self.sys) else {
            return;
        };
        self.add(Root::Sys, base.join(path), access);
    }

    /// The host asked, for a guest, about `path` (absolute, under the sys root; anything else
    /// is not the sys root's and is not kept).
    pub fn sys(&self, path: &Path, access: Access) {
        if let Ok(rel) = path.strip_prefix(&self.sys) {
            self.add(Root::Sys, rel.to_path_buf(), access);
        }
    }

    /// The guest (or the host for it) asked devfs about `rel` (relative to the dev root; empty
    /// for the root).
    pub fn dev(&self, rel: &Path, access: Access) {
        let rel = if rel == Path::new(".") {
            Path::new("")
        } else {
            rel
        };
        self.add(Root::Dev, rel.to_path_buf(), access);
    }

    /// The sys root, canonical.
    pub fn sys_root(&self) -> &Path {
        &self.sys
    }

    /// The dev root, canonical.
    pub fn dev_root(&self) -> &Path {
        &self.dev
    }

    /// Every question so far, in order of root, path and access.
    pub fn questions(&self) -> Vec<(Root, PathBuf, Access)> {
        let ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        ops.iter().cloned().collect()
    }

    fn add(&self, root: Root, path: PathBuf, access: Access) {
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        ops.insert((root, path, access));
    }
}

/// Any [`DevReads`] with each question noted in a [`Recorder`] before it is answered.
#[derive(Debug)]
pub struct Recorded {
    inner: Box<dyn DevReads>,
    recorder: Arc<Recorder>,
}

impl Recorded {
    /// `inner`'s answers, its questions noted in `recorder`.
    pub fn new(inner: Box<dyn DevReads>, recorder: Arc<Recorder>) -> Self {
        Recorded { inner, recorder }
    }
}

impl DevReads for Recorded {
    fn read_dir(&self, path: &str, rel: &Path) -> Result<Vec<Node>, DevfsError> {
        self.recorder.dev(rel, Access::ReadDir);
        self.inner.read_dir(path, rel)
    }

    fn read_dir_changes(
        &self,
        path: &str,
        rel: &Path,
        since: u64,
    ) -> Result<DirChanges, DevfsError> {
        self.recorder.dev(rel, Access::ReadDir);
        self.inner.read_dir_changes(path, rel, since)
    }

    fn entry_names(&self, path: &str, rel: &Path) -> Result<HashSet<OsString>, DevfsError> {
        self.recorder.dev(rel, Access::ReadDir);
        self.inner.entry_names(path, rel)
    }

    fn stat(&self, path: &str, rel: &Path, name: String, follow: bool) -> Result<Node, DevfsError> {
        self.recorder.dev(rel, Access::Stat { follow });
        self.inner.stat(path, rel, name, follow)
    }

    fn read_link(&self, path: &str, rel: &Path) -> Result<String, DevfsError> {
        self.recorder.dev(rel, Access::ReadLink);
        self.inner.read_link(path, rel)
    }
}
