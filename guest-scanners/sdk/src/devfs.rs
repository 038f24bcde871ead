//! /dev through the host's `devfs` interface: list, stat and glob device nodes.
//!
//! Why: /dev is never preopened in the guest (wasmtime-wasi has no "stat but never open" mode),
//! so `std::fs` cannot see it at all; the host offers a metadata-only view instead. These helpers
//! wrap that view and add what scanners need on top of it: globbing (`/dev/ttyUSB*`,
//! `/dev/dri/card*`, `/dev/bus/usb/*/*`) and "is this a character device" checks. Paths are
//! absolute guest paths under `/dev`.

use crate::bindings::scanner::wdp::device_plugin::devfs as raw;
use crate::pathglob::{self, DirSource};
use crate::reads::{HostFs, ReadError};

pub use crate::pathglob::Match;
pub use raw::{DirChanges, Node, NodeKind};

/// Lists a directory under /dev (sorted by name). Errors name the path and the cause.
pub fn read_dir(path: &str) -> Result<Vec<Node>, String> {
    raw::read_dir(path)
}

/// What changed in a directory under /dev since the answer that carried version `since` (0 for
/// the first call): the entries made, changed and removed since, or the whole listing when the
/// host cannot vouch for that version (contract 0.1.2). [`crate::keptglob::KeptGlob`] keeps a
/// glob's matches with it.
pub fn read_dir_changes(path: &str, since: u64) -> Result<DirChanges, String> {
    raw::read_dir_changes(path, since)
}

/// Describes one entry under /dev without following a final symlink.
pub fn stat(path: &str) -> Result<Node, String> {
    raw::stat(path)
}

/// The target of a symlink under /dev, as stored (it may be relative).
pub fn read_link(path: &str) -> Result<String, String> {
    raw::read_link(path)
}

/// Blocks until something under /dev or /sys may have changed, or `timeout_ms` passes; true when
/// a change was seen. [`crate::run`] calls this between scans.
pub fn wait_for_change(timeout_ms: u32) -> bool {
    raw::wait_for_change(timeout_ms)
}

/// True when `path` exists and is a character device (a symlink does not count).
///
/// Why: a scanner should advertise a device only when its node is really there; stat through
/// devfs is the only way a guest can tell.
pub fn exists_char_device(path: &str) -> bool {
    matches!(raw::stat(path), Ok(n) if n.kind == NodeKind::CharDevice)
}

/// The [`DirSource`] of the host's devfs, for [`pathglob::glob_with`].
pub struct Devfs;

impl DirSource for Devfs {
    fn list(&self, dir: &str) -> Result<Vec<Node>, String> {
        raw::read_dir(dir)
    }
    fn stat(&self, path: &str) -> Result<Node, String> {
        raw::stat(path)
    }
    fn list_changes(&self, dir: &str, since: u64) -> Result<DirChanges, String> {
        raw::read_dir_changes(dir, since)
    }
}

impl HostFs for Devfs {
    fn read_link(&self, path: &str) -> Result<String, String> {
        raw::read_link(path)
    }
    /// Always an error: devfs describes nodes, it never opens them.
    fn read(&self, path: &str) -> Result<String, ReadError> {
        Err(ReadError::Unreadable(format!(
            "{path}: devfs gives metadata only, never contents"
        )))
    }
}

/// Checks that `pattern` is a valid glob under /dev (`/dev` itself or `/dev/...`, no `..`).
pub fn check_dev_pattern(pattern: &str) -> Result<(), String> {
    if pattern != "/dev" && !pattern.starts_with("/dev/") {
        return Err("must be a path under /dev/".into());
    }
    pathglob::validate(pattern)
}

/// All entries under /dev matching the glob `pattern`, sorted by path, e.g.
/// `glob_dev("/dev/dri/card*")`. Missing or unreadable directories give no matches; only an
/// invalid pattern (or one outside /dev) is an error.
pub fn glob_dev(pattern: &str) -> Result<Vec<Match>, String> {
    check_dev_pattern(pattern).map_err(|e| format!("glob {pattern:?}: {e}"))?;
    pathglob::glob_with(&Devfs, pattern)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_patterns() {
        assert!(check_dev_pattern("/dev/ttyUSB*").is_ok());
        assert!(check_dev_pattern("/dev").is_ok());
        assert!(check_dev_pattern("/devices/x").is_err());
        assert!(check_dev_pattern("/etc/passwd").is_err());
        assert!(check_dev_pattern("/dev/../etc").is_err());
        assert!(check_dev_pattern("dev/x").is_err());
    }
}
