//! The host's own dev root as a [`DevReads`]: every path resolved beneath one `cap_std` directory
//! handle, so no symlink leads outside it, and nothing ever opened but directories.

use std::collections::HashSet;
use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, FileType, FileTypeExt, Metadata, MetadataExt};

use super::listing::{DirChanges, Listings};
use super::{DevReads, DevfsError, MAX_DIR_ENTRIES, Node, NodeKind};

/// A dev root on disk, opened once as a capability, with the listings kept of its directories.
#[derive(Debug)]
pub struct HostDir {
    root: Dir,
    listings: Arc<Listings>,
}

impl HostDir {
    /// Opens `root` as the directory every path is resolved beneath.
    pub fn open(root: &Path) -> io::Result<Self> {
        let root = Dir::open_ambient_dir(root, ambient_authority())?;
        let listings = Arc::new(Listings::new(root.dir_metadata()?.dev()));
        Ok(HostDir { root, listings })
    }

    /// The listings kept of this root's directories, for the change watcher to keep true.
    pub fn listings(&self) -> &Arc<Listings> {
        &self.listings
    }

    /// Directory `rel` (the root for `.`), following a final symlink.
    fn open_dir(&self, path: &str, rel: &Path) -> Result<Dir, DevfsError> {
        if rel == Path::new(".") {
            self.root.try_clone()
        } else {
            self.root.open_dir(rel)
        }
        .map_err(|e| map_io(path, e))
    }
}

impl DevReads for HostDir {
    fn read_dir(&self, path: &str, rel: &Path) -> Result<Vec<Node>, DevfsError> {
        let dir = self.open_dir(path, rel)?;
        self.listings.list(&dir, || list(&dir, path))
    }

    fn read_dir_changes(
        &self,
        path: &str,
        rel: &Path,
        since: u64,
    ) -> Result<DirChanges, DevfsError> {
        let dir = self.open_dir(path, rel)?;
        self.listings.changes(&dir, since, || list(&dir, path))
    }

    fn entry_names(&self, path: &str, rel: &Path) -> Result<HashSet<OsString>, DevfsError> {
        let entries = self.root.read_dir(rel).map_err(|e| map_io(path, e))?;
        entries
            .map(|entry| entry.map(|e| e.file_name()).map_err(|e| map_io(path, e)))
            .collect()
    }

    fn stat(&self, path: &str, rel: &Path, name: String, follow: bool) -> Result<Node, DevfsError> {
        let meta = if follow {
            self.root.metadata(rel)
        } else if rel == Path::new(".") {
            self.root.dir_metadata()
        } else {
            self.root.symlink_metadata(rel)
        }
        .map_err(|e| map_io(path, e))?;
        Ok(node(name, &meta))
    }

    fn read_link(&self, path: &str, rel: &Path) -> Result<String, DevfsError> {
        let meta = self
            .root
            .symlink_metadata(rel)
            .map_err(|e| map_io(path, e))?;
        if !meta.file_type().is_symlink() {
            return Err(DevfsError::NotASymlink { path: path.into() });
        }
        let target = self
            .root
            .read_link_contents(rel)
            .map_err(|e| map_io(path, e))?;
        Ok(target.to_string_lossy().into_owned())
    }

    fn stat_batch(&self, rel: &Path, names: &[&str]) -> Option<Vec<Option<Node>>> {
        let opened = if rel == Path::new(".") {
            self.root.try_clone().ok()?
        } else {
            self.root.open_dir(rel).ok()?
        };
        Some(
            names
                .iter()
                .map(|name| {
                    let meta = opened.symlink_metadata(name).ok()?;
                    Some(node(name.to_string(), &meta))
                })
                .collect(),
        )
    }
}

/// The entries of `dir` from scratch: a `getdents` and a `statx` per entry.
fn list(dir: &Dir, path: &str) -> Result<Vec<Node>, DevfsError> {
    let entries = dir.entries().map_err(|e| map_io(path, e))?;
    let mut nodes = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| map_io(path, e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if nodes.len() == MAX_DIR_ENTRIES {
            return Err(DevfsError::TooManyEntries { path: path.into() });
        }
        // An entry can vanish between listing and stat (hot-unplug): skip it.
        let Ok(meta) = entry.metadata() else { continue };
        nodes.push(node(name, &meta));
    }
    Ok(nodes)
}

/// One listed entry as the guest sees it (also what `batch`'s listings carry).
pub(super) fn node(name: String, meta: &Metadata) -> Node {
    let kind = kind_of(meta.file_type());
    let (major, minor) = if matches!(kind, NodeKind::CharDevice | NodeKind::BlockDevice) {
        let rdev = meta.rdev();
        (rustix::fs::major(rdev), rustix::fs::minor(rdev))
    } else {
        (0, 0)
    };
    Node {
        name,
        kind,
        major,
        minor,
        mode: meta.mode() & 0o7777,
    }
}

fn kind_of(ft: FileType) -> NodeKind {
    if ft.is_symlink() {
        NodeKind::Symlink
    } else if ft.is_dir() {
        NodeKind::Directory
    } else if ft.is_char_device() {
        NodeKind::CharDevice
    } else if ft.is_block_device() {
        NodeKind::BlockDevice
    } else if ft.is_file() {
        NodeKind::File
    } else {
        NodeKind::Other
    }
}

fn map_io(path: &str, e: io::Error) -> DevfsError {
    let path = path.to_string();
    match e.kind() {
        io::ErrorKind::NotFound => DevfsError::NotFound { path },
        io::ErrorKind::NotADirectory => DevfsError::NotADirectory { path },
        // cap-std reports a resolution that would leave the root as PermissionDenied.
        io::ErrorKind::PermissionDenied => DevfsError::Escape { path },
        _ => DevfsError::Io { path, error: e },
    }
}
