//! What the host reads under the sys root on a guest's behalf: the NUMA affinity of the device
//! nodes a guest reports ([`crate::topology`]). Guests read /sys themselves through their WASI
//! preopen; these are the host's own reads, behind the same seam as its /dev reads so that
//! `wdp snapshot` records exactly what was read ([`RecordedSys`]).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::record::{Access, Recorder};

/// The source of the host's sysfs reads. Paths are absolute and under [`SysReads::root`].
pub trait SysReads: Send + Sync + std::fmt::Debug {
    /// The sys root, canonical, so resolved paths can be compared with it.
    fn root(&self) -> &Path;

    /// The stored target of the symlink `path`.
    fn read_link(&self, path: &Path) -> io::Result<PathBuf>;

    /// `path` with every symlink resolved.
    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf>;

    /// The paths of the entries of directory `path`.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>>;

    /// The contents of the file `path`.
    fn read_to_string(&self, path: &Path) -> io::Result<String>;
}

/// The host's sys root on disk.
#[derive(Debug)]
pub struct SysDir {
    root: PathBuf,
    /// Directories symlinks were read in, opened once: a `readlinkat` from there costs one path
    /// component, where the full path cost a walk from `/` for each node (the NUMA lookup reads
    /// one `<sys>/dev/{char,block}/MAJ:MIN` link per node of every notified tree). Only
    /// successful opens are kept, so a directory that appears later is still found.
    link_dirs: Mutex<HashMap<PathBuf, Arc<OwnedFd>>>,
}

impl SysDir {
    /// Reads below `root` (normally `/sys`).
    pub fn new(root: &Path) -> Self {
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        SysDir {
            root,
            link_dirs: Mutex::default(),
        }
    }

    fn link_dir(&self, dir: &Path) -> io::Result<Arc<OwnedFd>> {
        let mut dirs = self.link_dirs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(fd) = dirs.get(dir) {
            return Ok(fd.clone());
        }
        let fd = Arc::new(rustix::fs::open(
            dir,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?);
        dirs.insert(dir.to_path_buf(), fd.clone());
        Ok(fd)
    }
}

impl SysReads for SysDir {
    fn root(&self) -> &Path {
        &self.root
    }

    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return std::fs::read_link(path);
        };
        let dir = self.link_dir(dir)?;
        let target = rustix::fs::readlinkat(&*dir, name, Vec::new())?;
        Ok(PathBuf::from(OsString::from_vec(target.into_bytes())))
    }

    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
        std::fs::canonicalize(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        // An entry that cannot be read is skipped, as a vanished one would be.
        Ok(std::fs::read_dir(path)?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .collect())
    }

    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }
}

/// Any [`SysReads`] with each read noted in a [`Recorder`] first, as the guest's own /sys reads
/// are: a snapshot then holds what the host read, no more and no less.
#[derive(Debug)]
pub struct RecordedSys {
    inner: Arc<dyn SysReads>,
    recorder: Arc<Recorder>,
}

impl RecordedSys {
    /// `inner`'s answers, its reads noted in `recorder`.
    pub fn new(inner: Arc<dyn SysReads>, recorder: Arc<Recorder>) -> Self {
        RecordedSys { inner, recorder }
    }
}

impl SysReads for RecordedSys {
    fn root(&self) -> &Path {
        self.inner.root()
    }

    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        self.recorder.sys(path, Access::ReadLink);
        self.inner.read_link(path)
    }

    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
        self.recorder.sys(path, Access::Stat { follow: true });
        self.inner.canonicalize(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        self.recorder.sys(path, Access::ReadDir);
        self.inner.read_dir(path)
    }

    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        self.recorder.sys(path, Access::Open { follow: true });
        self.inner.read_to_string(path)
    }
}
