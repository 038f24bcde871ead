//! Path resolution inside one root, seeing every step: the recorder uses it over the host's
//! roots to learn which directories and symlinks a path went through, and the replayed /dev uses
//! it over the recorded table.
//!
//! It resolves the way the sandbox does (cap-std beneath a root): symlinks are followed one
//! component at a time, an absolute target or a `..` above the root leaves the root and fails,
//! and at most [`MAX_SYMLINKS`] links are followed, like Linux.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

/// Links followed before resolution gives up (Linux's `MAXSYMLINKS`).
pub const MAX_SYMLINKS: usize = 40;

/// What a directory entry is, as far as a snapshot cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symlink and its stored target.
    Symlink(String),
    /// A character device and its number.
    Char {
        /// The major device number.
        major: u32,
        /// The minor device number.
        minor: u32,
    },
    /// A block device and its number.
    Block {
        /// The major device number.
        major: u32,
        /// The minor device number.
        minor: u32,
    },
    /// A FIFO or socket: kept out of snapshots.
    Other,
}

/// One entry's metadata: its kind and permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// What it is.
    pub kind: Kind,
    /// Permission bits.
    pub mode: u32,
}

/// Why a path did not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("not found")]
    /// Nothing there.
    NotFound,
    #[error("not a directory")]
    /// A directory was expected.
    NotADirectory,
    #[error("leaves the root")]
    /// The path would leave the root.
    Escape,
    #[error("too many levels of symbolic links")]
    /// More than `MAX_SYMLINKS` links.
    Loop,
    #[error("{0}")]
    /// Any other error, in words.
    Io(String),
}

/// A tree of entries addressed by paths relative to its root, none of whose components is a
/// symlink (resolution guarantees that before asking).
pub trait Lookup {
    /// The entry at `rel` without following it; `rel` is empty for the root itself.
    fn lstat(&self, rel: &Path) -> Result<Stat, ResolveError>;
}

/// Resolves `rel` (relative, may hold `..` and symlinks) beneath the root of `tree`. Calls
/// `seen` with every entry passed through or reached: each directory, each symlink followed (and
/// the final one when `follow_final` is false), and the final entry. Returns the resolved path
/// (no symlink in it) and the final entry's metadata.
pub fn resolve(
    tree: &impl Lookup,
    rel: &Path,
    follow_final: bool,
    seen: &mut impl FnMut(&Path, &Stat),
) -> Result<(PathBuf, Stat), ResolveError> {
    let mut todo: VecDeque<OsString> = VecDeque::new();
    push_front(&mut todo, rel)?;
    let mut here = PathBuf::new();
    let mut here_stat = tree.lstat(&here)?;
    let mut links = 0usize;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            if !here.pop() {
                return Err(ResolveError::Escape);
            }
            here_stat = tree.lstat(&here)?;
            continue;
        }
        if here_stat.kind != Kind::Dir {
            return Err(ResolveError::NotADirectory);
        }
        let next = here.join(&name);
        let stat = tree.lstat(&next)?;
        seen(&next, &stat);
        match &stat.kind {
            Kind::Symlink(target) if !todo.is_empty() || follow_final => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(ResolveError::Loop);
                }
                if target.starts_with('/') {
                    return Err(ResolveError::Escape);
                }
                push_front(&mut todo, Path::new(target))?;
            }
            _ => {
                here = next;
                here_stat = stat;
            }
        }
    }
    Ok((here, here_stat))
}

/// Puts the components of `path` in front of `todo`, dropping `.`; refuses absolute paths.
fn push_front(todo: &mut VecDeque<OsString>, path: &Path) -> Result<(), ResolveError> {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_os_string()),
            Component::ParentDir => parts.push("..".into()),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(ResolveError::Escape),
        }
    }
    for p in parts.into_iter().rev() {
        todo.push_front(p);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    struct Map(BTreeMap<PathBuf, Stat>);

    impl Lookup for Map {
        fn lstat(&self, rel: &Path) -> Result<Stat, ResolveError> {
            if rel.as_os_str().is_empty() {
                return Ok(Stat {
                    kind: Kind::Dir,
                    mode: 0o755,
                });
            }
            self.0.get(rel).cloned().ok_or(ResolveError::NotFound)
        }
    }

    fn map(entries: &[(&str, Kind)]) -> Map {
        Map(entries
            .iter()
            .map(|(p, k)| {
                (
                    PathBuf::from(p),
                    Stat {
                        kind: k.clone(),
                        mode: 0o644,
                    },
                )
            })
            .collect())
    }

    #[test]
    fn follows_relative_links_and_reports_each_step() {
        let m = map(&[
            ("bus", Kind::Dir),
            ("bus/pci", Kind::Dir),
            ("bus/pci/x", Kind::Symlink("../../devices/x".into())),
            ("devices", Kind::Dir),
            ("devices/x", Kind::Dir),
            ("devices/x/vendor", Kind::File),
            ("abs", Kind::Symlink("/etc".into())),
            ("up", Kind::Symlink("..".into())),
            ("loop", Kind::Symlink("loop".into())),
        ]);
        let mut steps = Vec::new();
        let (path, stat) = resolve(&m, Path::new("bus/pci/x/vendor"), true, &mut |p, _| {
            steps.push(p.display().to_string())
        })
        .unwrap();
        assert_eq!(path, Path::new("devices/x/vendor"));
        assert_eq!(stat.kind, Kind::File);
        assert_eq!(
            steps,
            [
                "bus",
                "bus/pci",
                "bus/pci/x",
                "devices",
                "devices/x",
                "devices/x/vendor"
            ]
        );
        let (path, stat) = resolve(&m, Path::new("bus/pci/x"), false, &mut |_, _| {}).unwrap();
        assert_eq!(path, Path::new("bus/pci/x"));
        assert!(matches!(stat.kind, Kind::Symlink(_)));
        let none = &mut |_: &Path, _: &Stat| {};
        assert_eq!(
            resolve(&m, Path::new("abs/passwd"), true, none),
            Err(ResolveError::Escape)
        );
        assert_eq!(
            resolve(&m, Path::new("up/x"), true, none),
            Err(ResolveError::Escape)
        );
        assert_eq!(
            resolve(&m, Path::new("../x"), true, none),
            Err(ResolveError::Escape)
        );
        assert_eq!(
            resolve(&m, Path::new("loop"), true, none),
            Err(ResolveError::Loop)
        );
        assert_eq!(
            resolve(&m, Path::new("nope"), true, none),
            Err(ResolveError::NotFound)
        );
        assert_eq!(
            resolve(&m, Path::new("devices/x/vendor/y"), true, none),
            Err(ResolveError::NotADirectory)
        );
    }
}
