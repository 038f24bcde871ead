//! A recorded /dev: the metadata table a replay serves through devfs, so device nodes need no
//! `mknod` (and no root) to be replayed. Paths resolve by the rules of the host's directory
//! ([`super::resolve`]), so a replay answers as the recorded machine did.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::resolve::{self, Kind, Lookup, ResolveError, Stat};
use super::{DevReads, DevfsError, Node, NodeKind};

/// Entries by path relative to the dev root; the root itself is implied.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DevTable {
    entries: BTreeMap<PathBuf, Stat>,
}

impl DevTable {
    /// A table of `entries`; missing parent directories are added.
    pub fn new(entries: impl IntoIterator<Item = (PathBuf, Stat)>) -> Self {
        let mut table = DevTable::default();
        for (path, stat) in entries {
            let mut parent = path.parent();
            while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
                table.entries.entry(p.to_path_buf()).or_insert(Stat {
                    kind: Kind::Dir,
                    mode: 0o755,
                });
                parent = p.parent();
            }
            table.entries.insert(path, stat);
        }
        table
    }

    /// All entries, in path order.
    pub fn entries(&self) -> impl Iterator<Item = (&PathBuf, &Stat)> {
        self.entries.iter()
    }

    /// The entries directly inside `dir` (a resolved path), by name.
    pub fn children(&self, dir: &Path) -> Vec<(String, Stat)> {
        self.entries
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .filter_map(|(p, s)| {
                let name = p.file_name()?.to_str()?.to_string();
                Some((name, s.clone()))
            })
            .collect()
    }
}

impl Lookup for DevTable {
    fn lstat(&self, rel: &Path) -> Result<Stat, ResolveError> {
        if rel.as_os_str().is_empty() {
            return Ok(Stat {
                kind: Kind::Dir,
                mode: 0o755,
            });
        }
        self.entries.get(rel).cloned().ok_or(ResolveError::NotFound)
    }
}

impl DevReads for Arc<DevTable> {
    fn read_dir(&self, path: &str, rel: &Path) -> Result<Vec<Node>, DevfsError> {
        Ok(children(self, path, rel)?
            .into_iter()
            .map(|(name, stat)| recorded_node(name, &stat))
            .collect())
    }

    fn entry_names(&self, path: &str, rel: &Path) -> Result<HashSet<OsString>, DevfsError> {
        Ok(children(self, path, rel)?
            .into_iter()
            .map(|(name, _)| name.into())
            .collect())
    }

    fn stat(&self, path: &str, rel: &Path, name: String, follow: bool) -> Result<Node, DevfsError> {
        let (_, stat) = lookup(self, path, rel, follow)?;
        Ok(recorded_node(name, &stat))
    }

    fn read_link(&self, path: &str, rel: &Path) -> Result<String, DevfsError> {
        match lookup(self, path, rel, false)?.1.kind {
            Kind::Symlink(target) => Ok(target),
            _ => Err(DevfsError::NotASymlink { path: path.into() }),
        }
    }
}

/// Resolves `rel` in the recorded table.
fn lookup(
    table: &DevTable,
    path: &str,
    rel: &Path,
    follow: bool,
) -> Result<(PathBuf, Stat), DevfsError> {
    let rel = if rel == Path::new(".") {
        Path::new("")
    } else {
        rel
    };
    resolve::resolve(table, rel, follow, &mut |_, _| {}).map_err(|e| {
        let path = path.to_string();
        match e {
            ResolveError::NotFound => DevfsError::NotFound { path },
            ResolveError::NotADirectory => DevfsError::NotADirectory { path },
            ResolveError::Escape => DevfsError::Escape { path },
            ResolveError::Loop => DevfsError::Io {
                path,
                error: io::Error::from_raw_os_error(rustix::io::Errno::LOOP.raw_os_error()),
            },
            ResolveError::Io(m) => DevfsError::Io {
                path,
                error: io::Error::other(m),
            },
        }
    })
}

/// The recorded entries of the directory `rel` (following links to it).
fn children(table: &DevTable, path: &str, rel: &Path) -> Result<Vec<(String, Stat)>, DevfsError> {
    let (dir, stat) = lookup(table, path, rel, true)?;
    if stat.kind != Kind::Dir {
        return Err(DevfsError::NotADirectory { path: path.into() });
    }
    Ok(table.children(&dir))
}

/// A recorded entry as devfs reports it: the same fields the host directory reads.
fn recorded_node(name: String, stat: &Stat) -> Node {
    let (kind, major, minor) = match stat.kind {
        Kind::Dir => (NodeKind::Directory, 0, 0),
        Kind::File => (NodeKind::File, 0, 0),
        Kind::Symlink(_) => (NodeKind::Symlink, 0, 0),
        Kind::Char { major, minor } => (NodeKind::CharDevice, major, minor),
        Kind::Block { major, minor } => (NodeKind::BlockDevice, major, minor),
        Kind::Other => (NodeKind::Other, 0, 0),
    };
    Node {
        name,
        kind,
        major,
        minor,
        mode: stat.mode & 0o7777,
    }
}
