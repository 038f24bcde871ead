//! A recorded /dev: the metadata table a replay serves through devfs, so device nodes need no
//! `mknod` (and no root) to be replayed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::resolve::{Kind, Lookup, ResolveError, Stat};

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
