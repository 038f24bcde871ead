//! A metadata-only, confined view of the host's dev root: the host side of WIT `devfs`.
//!
//! wasmtime-wasi has no "stat but never open" preopen mode, so /dev is never preopened; guests see
//! it only through these calls. Three rules hold for every call:
//! - guest paths are absolute, under `/dev`, with no `.`, `..` or empty components;
//! - resolution goes through a `cap_std::fs::Dir` of the dev root, so no symlink (absolute, or
//!   relative with `..`) can lead outside it;
//! - nothing here opens a file: only `lstat`, directory listing and `readlink`. A device node's
//!   contents can never be read, and opening one (which has side effects for some drivers) never
//!   happens.

use std::io;
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, FileType, FileTypeExt, Metadata, MetadataExt};

/// Longest guest path accepted (Linux's `PATH_MAX`).
const MAX_PATH: usize = 4096;
/// Most entries one `read-dir` returns; a larger directory is an error, not a huge allocation.
const MAX_DIR_ENTRIES: usize = 65_536;

/// What a path names, as WIT `devfs.node-kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    CharDevice,
    BlockDevice,
    Directory,
    Symlink,
    File,
    Other,
}

/// Metadata of one entry, as WIT `devfs.node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub kind: NodeKind,
    pub major: u32,
    pub minor: u32,
    /// Permission bits only (`mode & 0o7777`).
    pub mode: u32,
}

/// Why a devfs call failed; its text is what the guest receives.
#[derive(Debug, thiserror::Error)]
pub enum DevfsError {
    #[error("{path:?}: not a path under /dev (absolute, no '.', '..' or '//' components)")]
    InvalidPath { path: String },
    #[error("{path:?}: path longer than {MAX_PATH} bytes")]
    TooLong { path: String },
    #[error("{path:?}: not found")]
    NotFound { path: String },
    #[error("{path:?}: leaves the dev root")]
    Escape { path: String },
    #[error("{path:?}: not a directory")]
    NotADirectory { path: String },
    #[error("{path:?}: not a symlink")]
    NotASymlink { path: String },
    #[error("{path:?}: more than {MAX_DIR_ENTRIES} entries")]
    TooManyEntries { path: String },
    #[error("{path:?}: {source}")]
    Io { path: String, source: io::Error },
}

/// The dev root, opened once as a capability.
#[derive(Debug)]
pub struct DevFs {
    root: Dir,
    root_path: PathBuf,
}

impl DevFs {
    /// Opens `root` (normally `/dev`) as the directory every guest path is resolved beneath.
    pub fn open(root: &Path) -> io::Result<Self> {
        let dir = Dir::open_ambient_dir(root, ambient_authority())?;
        Ok(DevFs {
            root: dir,
            root_path: root.to_path_buf(),
        })
    }

    /// The host directory guests see as `/dev`.
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Lists a directory, sorted by name. Entries whose names are not UTF-8 are skipped: WIT
    /// strings cannot carry them, and no device naming scheme uses them.
    pub fn read_dir(&self, path: &str) -> Result<Vec<Node>, DevfsError> {
        let rel = guest_to_relative(path)?;
        let entries = self.root.read_dir(&rel).map_err(|e| map_io(path, e))?;
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
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(nodes)
    }

    /// Describes one entry without following a final symlink.
    pub fn stat(&self, path: &str) -> Result<Node, DevfsError> {
        let rel = guest_to_relative(path)?;
        let meta = if rel == Path::new(".") {
            self.root.dir_metadata()
        } else {
            self.root.symlink_metadata(&rel)
        }
        .map_err(|e| map_io(path, e))?;
        let name = path.rsplit('/').next().unwrap_or_default().to_string();
        Ok(node(name, &meta))
    }

    /// Describes what `path` names after following symlinks, which must stay inside the dev
    /// root: the host's own question when it looks up a node's `major:minor` (NUMA affinity),
    /// never a guest's.
    pub fn stat_following(&self, path: &str) -> Result<Node, DevfsError> {
        let rel = guest_to_relative(path)?;
        let meta = self.root.metadata(&rel).map_err(|e| map_io(path, e))?;
        let name = path.rsplit('/').next().unwrap_or_default().to_string();
        Ok(node(name, &meta))
    }

    /// The stored target of a symlink. It is only text: following it is the guest's business and
    /// goes through these same checks.
    pub fn read_link(&self, path: &str) -> Result<String, DevfsError> {
        let rel = guest_to_relative(path)?;
        let meta = self
            .root
            .symlink_metadata(&rel)
            .map_err(|e| map_io(path, e))?;
        if !meta.file_type().is_symlink() {
            return Err(DevfsError::NotASymlink { path: path.into() });
        }
        let target = self
            .root
            .read_link_contents(&rel)
            .map_err(|e| map_io(path, e))?;
        Ok(target.to_string_lossy().into_owned())
    }
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

fn node(name: String, meta: &Metadata) -> Node {
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
        _ => DevfsError::Io { path, source: e },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
