//! What the paths a scanner (and the host on its behalf) looked at held, at the end of a recorded
//! scan.
//!
//! During the scan only the questions are kept ([`crate::hostfs::record`]: a root, a path, the
//! kind of access), cheaply and deduplicated, the host's own reads for the guest (NUMA affinity)
//! among them. [`Recorder::finish`] then resolves each one again over the host's roots, step by
//! step ([`crate::hostfs::resolve`]), and keeps every directory and symlink it passes through,
//! the final entry, the full listing of each directory the scanner read, and the contents of each regular
//! file under /sys the scanner opened (at most [`MAX_FILE`] bytes). Nothing under /dev is ever
//! opened: its entries are metadata only.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::hostfs::record::{Access, Recorder, Root};
use crate::hostfs::resolve::{Kind, Lookup, ResolveError, Stat, resolve};

/// Most bytes kept of one /sys file (sysfs attributes are at most a page; binary ones such as a
/// PCI `config` a few KiB).
pub const MAX_FILE: usize = 64 << 10;

/// One recorded entry: its metadata and, for a /sys file the scanner opened, its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its metadata.
    pub stat: Stat,
    /// A /sys file's contents, when the scanner opened it.
    pub contents: Option<Vec<u8>>,
}

/// Everything a snapshot holds of the two roots, by path relative to each root.
#[derive(Debug, Default, Clone)]
pub struct Recording {
    /// Entries under the sys root.
    pub sys: BTreeMap<PathBuf, Entry>,
    /// Entries under the dev root.
    pub dev: BTreeMap<PathBuf, Entry>,
    /// /sys files longer than [`MAX_FILE`], kept truncated.
    pub truncated: Vec<PathBuf>,
}

impl Recorder {
    /// Reads what every recorded path holds now: the guest's questions and the host's own for
    /// it (NUMA affinity, [`crate::topology`], noted as it read).
    pub fn finish(&self) -> Recording {
        let ops = self.questions();
        let sys = HostRoot(self.sys_root());
        let dev = HostRoot(self.dev_root());
        let mut rec = Recording::default();
        for (root, path, access) in ops {
            match root {
                Root::Sys => visit(&sys, &mut rec.sys, &mut rec.truncated, &path, access, true),
                Root::Dev => visit(&dev, &mut rec.dev, &mut rec.truncated, &path, access, false),
            };
        }
        rec
    }
}

/// Resolves one recorded access over `root` and keeps what it finds in `out`. Returns the
/// resolved path and entry, if any.
fn visit(
    root: &HostRoot,
    out: &mut BTreeMap<PathBuf, Entry>,
    truncated: &mut Vec<PathBuf>,
    path: &Path,
    access: Access,
    contents: bool,
) -> Option<(PathBuf, Stat)> {
    let follow = match access {
        Access::Open { follow } | Access::Stat { follow } => follow,
        Access::ReadLink => false,
        Access::ReadDir => true,
    };
    let mut keep = |p: &Path, s: &Stat| {
        out.entry(p.to_path_buf()).or_insert_with(|| Entry {
            stat: s.clone(),
            contents: None,
        });
    };
    let (resolved, stat) = resolve(root, path, follow, &mut keep).ok()?;
    match (&access, &stat.kind) {
        (Access::Open { .. }, Kind::File) if contents => {
            if let Some((bytes, cut)) = root.read(&resolved)
                && let Some(e) = out.get_mut(&resolved)
            {
                e.contents = Some(bytes);
                if cut {
                    truncated.push(resolved.clone());
                }
            }
        }
        (Access::ReadDir, Kind::Dir) => {
            for (name, s) in root.list(&resolved) {
                keep(&resolved.join(name), &s);
            }
        }
        _ => {}
    }
    Some((resolved, stat))
}

/// A host directory as a [`Lookup`].
struct HostRoot<'a>(&'a Path);

impl HostRoot<'_> {
    /// Paths from [`resolve`] hold no symlink, so joining them to the root follows none.
    fn full(&self, rel: &Path) -> PathBuf {
        self.0.join(rel)
    }

    /// A regular file's first [`MAX_FILE`] bytes, and whether there was more. Opened without
    /// following a symlink and without blocking, and checked to be a regular file once open, so
    /// no device node or FIFO is ever read.
    fn read(&self, rel: &Path) -> Option<(Vec<u8>, bool)> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc_flags())
            .open(self.full(rel))
            .ok()?;
        if !file.metadata().ok()?.file_type().is_file() {
            return None;
        }
        let mut bytes = Vec::new();
        // A sysfs attribute that cannot be read (EIO, EACCES on write-only ones) is kept empty.
        let _ = file.take(MAX_FILE as u64 + 1).read_to_end(&mut bytes);
        let cut = bytes.len() > MAX_FILE;
        bytes.truncate(MAX_FILE);
        Some((bytes, cut))
    }

    fn list(&self, rel: &Path) -> Vec<(std::ffi::OsString, Stat)> {
        let Ok(entries) = std::fs::read_dir(self.full(rel)) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let stat = self.lstat(&rel.join(&name)).ok()?;
                Some((name, stat))
            })
            .collect()
    }
}

/// `O_NOFOLLOW | O_NONBLOCK`.
fn libc_flags() -> i32 {
    (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32
}

impl Lookup for HostRoot<'_> {
    fn lstat(&self, rel: &Path) -> Result<Stat, ResolveError> {
        let full = self.full(rel);
        let meta = std::fs::symlink_metadata(&full).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ResolveError::NotFound,
            std::io::ErrorKind::NotADirectory => ResolveError::NotADirectory,
            _ => ResolveError::Io(e.to_string()),
        })?;
        let ft = meta.file_type();
        let rdev = meta.rdev();
        let (major, minor) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
        let kind = if ft.is_symlink() {
            let target = std::fs::read_link(&full).map_err(|e| ResolveError::Io(e.to_string()))?;
            Kind::Symlink(target.to_string_lossy().into_owned())
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else if ft.is_char_device() {
            Kind::Char { major, minor }
        } else if ft.is_block_device() {
            Kind::Block { major, minor }
        } else {
            Kind::Other
        };
        Ok(Stat {
            kind,
            mode: meta.mode() & 0o7777,
        })
    }
}
