//! The host side of WIT `hostfs` (contract 0.1.1): listings that carry each entry's metadata and
//! symlink target, and many /sys files read in one call.
//!
//! Why: a scanner's walk over /sys through its WASI preopen costs a boundary crossing per
//! directory entry, per `stat`, per `readlink` and several per file read (open, read, close);
//! these calls answer a whole directory, or a whole batch of attributes, in one. The confinement
//! is the one the guest already lives with: /dev through [`DevFs`] (metadata only, its path
//! rules), /sys through a `cap_std` directory of the sys root (read-only; no path, and no
//! symlink, leads outside it), paths absolute with no `.`, `..` or empty components.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptionsExt};

use super::record::{Access, Recorder};
use super::{DevFs, DevfsError, MAX_DIR_ENTRIES, MAX_PATH, Node, NodeKind};

/// Largest file [`SysView::read_file`] returns: sysfs attributes are at most a page; anything
/// larger is not an attribute and would only cost guest memory.
pub const MAX_FILE: u64 = 64 * 1024;

/// Most paths one `read-files` call takes: a batch larger than this is an error, not a huge
/// allocation in the host.
pub const MAX_BATCH: usize = 4096;

/// What one call may cost the host: the bytes its answer may hold, and when its caller stops
/// waiting for it.
///
/// The answer is built in the host before it is copied into the guest, so without a budget one
/// call (4096 files of 64 KiB) could hold 256 MiB of host memory for a guest allowed 16. The
/// budget is a share of the guest's own memory limit: an answer larger than that could not be
/// copied into the guest anyway. Bytes are counted as results accumulate, before each is
/// allocated, and the whole answer is dropped when the call returns.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Most bytes the answer may hold (strings and the records around them).
    pub bytes: usize,
    /// When the caller stops waiting: the work stops at the next file or entry after it.
    pub until: Instant,
}

impl Budget {
    /// What one answer may hold for a guest whose linear memory may grow to `memory` bytes.
    pub const SHARE_OF_GUEST_MEMORY: usize = 4;

    /// The budget of a call for a guest of `memory` bytes, abandoned at `until`.
    pub fn for_guest(memory: u64, until: Instant) -> Self {
        let memory = usize::try_from(memory).unwrap_or(usize::MAX);
        Budget {
            bytes: memory / Self::SHARE_OF_GUEST_MEMORY,
            until,
        }
    }

    /// No bound: the host's own reads, and tests.
    pub fn unbounded() -> Self {
        Budget {
            bytes: usize::MAX,
            until: Instant::now() + std::time::Duration::from_secs(3600 * 24 * 365),
        }
    }

    /// Charges `bytes` against `used`, or says the answer is too large.
    fn charge(&self, used: &mut usize, bytes: usize) -> Result<(), BatchError> {
        let total = used.saturating_add(bytes);
        if total > self.bytes {
            return Err(BatchError::TooLarge { budget: self.bytes });
        }
        *used = total;
        Ok(())
    }

    /// Errs once the caller has stopped waiting.
    fn check_time(&self) -> Result<(), BatchError> {
        if Instant::now() >= self.until {
            return Err(BatchError::Abandoned);
        }
        Ok(())
    }
}

/// One listed entry: its metadata, and a symlink's stored target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// What `stat` says of it.
    pub node: Node,
    /// The stored target when it is a symlink (it may be relative).
    pub link_target: Option<String>,
}

/// Why one file of a batch was not read, as WIT `hostfs.read-error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// Nothing there.
    #[error("no such file")]
    Missing,
    /// Not a path under /sys this call reads (or one that would leave the sys root).
    #[error("not a plain absolute path under /sys")]
    Refused,
    /// A directory or a special file.
    #[error("not a regular file")]
    NotAFile,
    /// Larger than [`MAX_FILE`], or not UTF-8.
    #[error("larger than {MAX_FILE} bytes or not UTF-8")]
    TooLargeOrBinary,
    /// Any other I/O error.
    #[error("unreadable")]
    Unreadable,
}

/// Why a listing or a batch failed as a whole; its text is what the guest receives.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// A /dev listing failed as `devfs.read-dir` would.
    #[error(transparent)]
    Dev(#[from] DevfsError),
    /// Not `/sys`, `/dev` or a plain path below one of them.
    #[error("{path:?}: not a path under /dev or /sys (absolute, no '.', '..' or '//' components)")]
    InvalidPath {
        /// The path concerned.
        path: String,
    },
    /// Nothing there.
    #[error("{path:?}: not found")]
    NotFound {
        /// The path concerned.
        path: String,
    },
    /// Not a directory.
    #[error("{path:?}: not a directory")]
    NotADirectory {
        /// The path concerned.
        path: String,
    },
    /// Resolution would leave the sys root.
    #[error("{path:?}: leaves the sys root")]
    Escape {
        /// The path concerned.
        path: String,
    },
    /// A directory too large to list.
    #[error("{path:?}: more than {MAX_DIR_ENTRIES} entries")]
    TooManyEntries {
        /// The path concerned.
        path: String,
    },
    /// More paths than one batch takes.
    #[error("{count} paths in one read-files call; at most {MAX_BATCH}")]
    BatchTooLarge {
        /// How many were asked for.
        count: usize,
    },
    /// The answer would hold more than the call's [`Budget`].
    #[error(
        "the answer would hold more than {budget} bytes (a quarter of the scanner's memory limit); ask for fewer files or smaller directories per call"
    )]
    TooLarge {
        /// The budget, in bytes.
        budget: usize,
    },
    /// The caller stopped waiting before the work was done; nobody sees this but the log.
    #[error("abandoned after the call's deadline")]
    Abandoned,
    /// Any other I/O error.
    #[error("{path:?}: {error}")]
    Io {
        /// The path concerned.
        path: String,
        /// The underlying error, whole.
        error: io::Error,
    },
}

/// The guest's /sys as the host reads it for `hostfs`: the sys root opened once as a capability,
/// and the recorder of `wdp snapshot` when one records.
#[derive(Debug)]
pub struct SysView {
    root: Dir,
    recorder: Option<Arc<Recorder>>,
}

impl SysView {
    /// Opens `root` (normally `/sys`) as the directory every /sys path is resolved beneath.
    pub fn open(root: &Path, recorder: Option<Arc<Recorder>>) -> io::Result<Self> {
        Ok(SysView {
            root: Dir::open_ambient_dir(root, ambient_authority())?,
            recorder,
        })
    }

    fn note(&self, rel: &Path, access: Access) {
        if let Some(r) = &self.recorder {
            let rel = if rel == Path::new(".") {
                Path::new("")
            } else {
                rel
            };
            r.sys(&r.sys_root().join(rel), access);
        }
    }

    /// The entries of the /sys directory `path`, sorted by name, each with its metadata and, for
    /// a symlink, its stored target. Entries whose names are not UTF-8 are skipped, and so are
    /// entries that vanish between listing and stat (a device unplugged meanwhile).
    pub fn list_dir(&self, path: &str, budget: &Budget) -> Result<Vec<Entry>, BatchError> {
        let rel =
            sys_to_relative(path).ok_or_else(|| BatchError::InvalidPath { path: path.into() })?;
        let mut used = 0;
        self.note(&rel, Access::ReadDir);
        let dir = if rel == Path::new(".") {
            self.root.try_clone()
        } else {
            self.root.open_dir(&rel)
        }
        .map_err(|e| map_io(path, e))?;
        let mut entries = Vec::new();
        for entry in dir.entries().map_err(|e| map_io(path, e))? {
            let entry = entry.map_err(|e| map_io(path, e))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if entries.len() == MAX_DIR_ENTRIES {
                return Err(BatchError::TooManyEntries { path: path.into() });
            }
            budget.check_time()?;
            let Ok(meta) = dir.symlink_metadata(&name) else {
                continue;
            };
            let node = super::dir::node(name, &meta);
            let link_target = if node.kind == NodeKind::Symlink {
                self.note(&rel.join(&node.name), Access::ReadLink);
                dir.read_link_contents(&node.name)
                    .ok()
                    .map(|t| t.to_string_lossy().into_owned())
            } else {
                None
            };
            self.note(&rel.join(&node.name), Access::Stat { follow: false });
            let entry = Entry { node, link_target };
            budget.charge(&mut used, entry.cost())?;
            entries.push(entry);
        }
        entries.sort_by(|a, b| a.node.name.cmp(&b.node.name));
        Ok(entries)
    }

    /// The contents of the /sys file `path`, following symlinks inside the sys root; only
    /// regular files are opened.
    pub fn read_file(&self, path: &str) -> Result<String, ReadError> {
        let mut scratch = Vec::new();
        self.read_into(path, &mut scratch)?;
        to_text(&scratch)
    }

    /// Reads the /sys file `path` into `bytes` (cleared first; at most [`MAX_FILE`] bytes).
    fn read_into(&self, path: &str, bytes: &mut Vec<u8>) -> Result<(), ReadError> {
        bytes.clear();
        let rel = sys_to_relative(path).ok_or(ReadError::Refused)?;
        self.note(&rel, Access::Open { follow: true });
        let refusal = |e: io::Error| match e.kind() {
            io::ErrorKind::NotFound => ReadError::Missing,
            // cap-std refuses a resolution that would leave the root as PermissionDenied; so
            // does the kernel a file the host may not read: both are refusals to the guest.
            io::ErrorKind::PermissionDenied => ReadError::Refused,
            io::ErrorKind::IsADirectory => ReadError::NotAFile,
            _ => ReadError::Unreadable,
        };
        // Looked at before it is opened: a device node is never opened, since opening one has
        // side effects for some drivers.
        if !self.root.metadata(&rel).map_err(refusal)?.is_file() {
            return Err(ReadError::NotAFile);
        }
        // Non-blocking, and looked at again once open: a FIFO swapped in meanwhile opens
        // without waiting for a writer and is refused here, and a file whose reads wait for
        // data (tracefs `trace_pipe`, `/proc/kmsg`: regular files to `stat`) answers "would
        // block" at once (the guest gets `unreadable`) instead of holding a thread for ever.
        // sysfs attributes ignore the flag.
        let mut options = cap_std::fs::OpenOptions::new();
        options
            .read(true)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
        let file = self.root.open_with(&rel, &options).map_err(refusal)?;
        if !file.metadata().map_err(refusal)?.is_file() {
            return Err(ReadError::NotAFile);
        }
        match file.take(MAX_FILE + 1).read_to_end(bytes) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(ReadError::Unreadable),
            Err(_) => return Err(ReadError::Unreadable),
        }
        if bytes.len() as u64 > MAX_FILE {
            return Err(ReadError::TooLargeOrBinary);
        }
        Ok(())
    }

    /// [`SysView::read_file`] of each of `paths`, in order, within `budget`: the bytes of every
    /// result read so far are counted before the next is copied out of the one read buffer.
    pub fn read_files(
        &self,
        paths: &[String],
        budget: &Budget,
    ) -> Result<Vec<Result<String, ReadError>>, BatchError> {
        if paths.len() > MAX_BATCH {
            return Err(BatchError::BatchTooLarge { count: paths.len() });
        }
        let mut used = 0;
        budget.charge(
            &mut used,
            paths.len() * std::mem::size_of::<Result<String, ReadError>>(),
        )?;
        let mut results = Vec::with_capacity(paths.len());
        let mut scratch = Vec::new();
        for path in paths {
            budget.check_time()?;
            let result = match self.read_into(path, &mut scratch) {
                Ok(()) => {
                    budget.charge(&mut used, scratch.len())?;
                    to_text(&scratch)
                }
                Err(e) => Err(e),
            };
            results.push(result);
        }
        Ok(results)
    }
}

/// A file's bytes as the text the guest receives.
fn to_text(bytes: &[u8]) -> Result<String, ReadError> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| ReadError::TooLargeOrBinary)
}

impl Entry {
    /// Host bytes this entry holds.
    fn cost(&self) -> usize {
        std::mem::size_of::<Entry>()
            + self.node.name.len()
            + self.link_target.as_ref().map_or(0, String::len)
    }
}

/// `hostfs.list-dir`: a /dev directory through `devfs` (each symlink's target read through it
/// too), a /sys one through `sys`.
pub fn list_dir(
    devfs: &DevFs,
    sys: &SysView,
    path: &str,
    budget: &Budget,
) -> Result<Vec<Entry>, BatchError> {
    if under(path, "/sys") {
        return sys.list_dir(path, budget);
    }
    if !under(path, "/dev") {
        return Err(BatchError::InvalidPath { path: path.into() });
    }
    let nodes = devfs.read_dir(path)?;
    let dir = path.trim_end_matches('/');
    let mut used = 0;
    let mut entries = Vec::with_capacity(nodes.len());
    for node in nodes {
        budget.check_time()?;
        let link_target = (node.kind == NodeKind::Symlink)
            .then(|| devfs.read_link(&format!("{dir}/{}", node.name)).ok())
            .flatten();
        let entry = Entry { node, link_target };
        budget.charge(&mut used, entry.cost())?;
        entries.push(entry);
    }
    Ok(entries)
}

/// True for `root` itself and the paths below it.
fn under(path: &str, root: &str) -> bool {
    path.strip_prefix(root)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Maps `/sys/a/b` to `a/b` (and `/sys` to `.`); None for anything that is not a plain path
/// under /sys: the rules of devfs paths, for the sys root.
fn sys_to_relative(path: &str) -> Option<PathBuf> {
    if path.len() > MAX_PATH || path.contains('\0') {
        return None;
    }
    let rest = match path.strip_prefix("/sys")? {
        "" | "/" => return Some(PathBuf::from(".")),
        rest => rest.strip_prefix('/')?,
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return None;
    }
    Some(PathBuf::from(rest))
}

fn map_io(path: &str, e: io::Error) -> BatchError {
    let path = path.to_string();
    match e.kind() {
        io::ErrorKind::NotFound => BatchError::NotFound { path },
        io::ErrorKind::NotADirectory => BatchError::NotADirectory { path },
        io::ErrorKind::PermissionDenied => BatchError::Escape { path },
        _ => BatchError::Io { path, error: e },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sys_paths_follow_the_devfs_rules() {
        assert_eq!(sys_to_relative("/sys"), Some(PathBuf::from(".")));
        assert_eq!(
            sys_to_relative("/sys/class/drm/"),
            Some(PathBuf::from("class/drm"))
        );
        for bad in [
            "/system",
            "/sys/../etc",
            "/sys//x",
            "/sys/./x",
            "sys/x",
            "/etc/passwd",
        ] {
            assert_eq!(sys_to_relative(bad), None, "{bad}");
        }
    }

    #[test]
    fn listings_carry_link_targets_and_reads_stay_inside() {
        let tmp = tempfile::tempdir().unwrap();
        let sys = tmp.path().join("sys");
        std::fs::create_dir_all(sys.join("devices/d0")).unwrap();
        std::fs::write(sys.join("devices/d0/vendor"), "0x8086\n").unwrap();
        std::fs::write(tmp.path().join("secret"), "no").unwrap();
        std::os::unix::fs::symlink("../devices/d0", sys.join("devices/link")).unwrap();
        std::os::unix::fs::symlink("../../secret", sys.join("devices/out")).unwrap();
        let dev = tmp.path().join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        std::os::unix::fs::symlink("null", dev.join("zero")).unwrap();
        let view = SysView::open(&sys, None).unwrap();
        let devfs = DevFs::open(&dev).unwrap();

        let any = Budget::unbounded();
        let listed = list_dir(&devfs, &view, "/sys/devices", &any).unwrap();
        let names: Vec<_> = listed.iter().map(|e| e.node.name.as_str()).collect();
        assert_eq!(names, ["d0", "link", "out"]);
        assert_eq!(listed[0].node.kind, NodeKind::Directory);
        assert_eq!(listed[1].link_target.as_deref(), Some("../devices/d0"));
        let dev_listed = list_dir(&devfs, &view, "/dev", &any).unwrap();
        assert_eq!(dev_listed[0].link_target.as_deref(), Some("null"));
        assert!(matches!(
            list_dir(&devfs, &view, "/etc", &any),
            Err(BatchError::InvalidPath { .. })
        ));

        let paths = [
            "/sys/devices/link/vendor",
            "/sys/devices/d0/nope",
            "/sys/devices/out",
            "/sys/../secret",
            "/sys/devices",
        ]
        .map(String::from);
        assert_eq!(
            view.read_files(&paths, &any).unwrap(),
            [
                Ok("0x8086\n".into()),
                Err(ReadError::Missing),
                Err(ReadError::Refused),
                Err(ReadError::Refused),
                Err(ReadError::NotAFile),
            ]
        );
        let many = vec![String::from("/sys/x"); MAX_BATCH + 1];
        assert!(matches!(
            view.read_files(&many, &any),
            Err(BatchError::BatchTooLarge { .. })
        ));
    }

    #[test]
    fn answers_stay_within_their_budget_and_nothing_waits() {
        let tmp = tempfile::tempdir().unwrap();
        let sys = tmp.path().join("sys");
        std::fs::create_dir_all(sys.join("big")).unwrap();
        for i in 0..8 {
            std::fs::write(sys.join(format!("big/f{i}")), [b'x'; 1000]).unwrap();
        }
        rustix::fs::mknodat(
            rustix::fs::CWD,
            sys.join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let view = SysView::open(&sys, None).unwrap();
        let paths: Vec<String> = (0..8).map(|i| format!("/sys/big/f{i}")).collect();
        let records = paths.len() * std::mem::size_of::<Result<String, ReadError>>();
        let far = Instant::now() + std::time::Duration::from_secs(3600);

        let enough = Budget {
            bytes: records + 8 * 1000,
            until: far,
        };
        assert!(
            view.read_files(&paths, &enough)
                .unwrap()
                .iter()
                .all(Result::is_ok)
        );
        let short = Budget {
            bytes: records + 8 * 1000 - 1,
            until: far,
        };
        assert!(matches!(
            view.read_files(&paths, &short),
            Err(BatchError::TooLarge { budget }) if budget == short.bytes
        ));
        let listing = view.list_dir("/sys/big", &enough).unwrap();
        let cost: usize = listing.iter().map(Entry::cost).sum();
        let tight = Budget {
            bytes: cost - 1,
            until: far,
        };
        assert!(matches!(
            view.list_dir("/sys/big", &tight),
            Err(BatchError::TooLarge { .. })
        ));

        // Nobody waits any more: the batch stops before its first read.
        let late = Budget {
            bytes: usize::MAX,
            until: Instant::now(),
        };
        assert!(matches!(
            view.read_files(&paths, &late),
            Err(BatchError::Abandoned)
        ));

        // A FIFO no one writes is refused, not waited on.
        assert_eq!(
            view.read_files(&["/sys/fifo".to_string()], &enough)
                .unwrap(),
            [Err(ReadError::NotAFile)]
        );
    }
}
