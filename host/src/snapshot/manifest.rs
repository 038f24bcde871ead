//! `manifest.json`: what a snapshot was taken of, and the tree the scan produced there.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sandbox::GuestLimits;

/// The version of the archive layout; a reader refuses others.
pub const FORMAT: u32 = 1;

/// Describes one snapshot. Everything a scanner author needs to reproduce the case besides the
/// files: which scanner, built how, configured how, on which kernel, and what it found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The `wdp` that took it.
    pub wdp_version: String,
    /// The scanner's name (as in logs).
    pub scanner: String,
    /// The component's file name on the machine.
    pub component: String,
    /// Hex SHA-256 of the component's bytes: a replay with another build says so.
    pub component_sha256: String,
    /// The guest's environment (its configuration).
    pub env: Vec<(String, String)>,
    /// Host paths mounts were allowed under (`--allow-mount`).
    pub allow_mount: Vec<String>,
    /// When it was taken (RFC 3339, UTC).
    pub created: String,
    /// `/proc/sys/kernel/osrelease` of the machine, if readable.
    pub kernel_release: Option<String>,
    /// The host directories that were /sys and /dev.
    pub sys_root: String,
    /// The dev root the scan saw.
    pub dev_root: String,
    /// File names whose /sys contents were replaced by placeholders (`--redact`).
    #[serde(default)]
    pub redacted: Vec<String>,
    /// The guest's limits on the machine; a replay uses them unless told otherwise.
    #[serde(default)]
    pub limits: Option<Limits>,
    /// What the archive holds.
    pub counts: Counts,
    /// The first tree the scanner reported on the machine, as `wdp scan` prints it; null when
    /// it reported none (see `error`).
    pub tree: serde_json::Value,
    /// Why the scanner reported no tree on the machine (it failed, or its tree was refused): a
    /// failing scanner is as worth a bug report as a wrong tree.
    #[serde(default)]
    pub error: Option<String>,
}

/// Entries in a snapshot, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Regular files kept.
    pub files: usize,
    /// Directories kept.
    pub dirs: usize,
    /// Symlinks kept.
    pub symlinks: usize,
    /// Device nodes kept.
    pub nodes: usize,
    /// Bytes of /sys file contents.
    pub bytes: u64,
}

/// A guest's limits, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory cap in bytes.
    pub memory: u64,
    /// CPU budget between host calls, in milliseconds.
    pub call_timeout_ms: u64,
}

impl From<GuestLimits> for Limits {
    fn from(l: GuestLimits) -> Self {
        Limits {
            memory: l.memory,
            call_timeout_ms: u64::try_from(l.call_timeout.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl From<Limits> for GuestLimits {
    fn from(l: Limits) -> Self {
        GuestLimits {
            memory: l.memory,
            call_timeout: Duration::from_millis(l.call_timeout_ms),
        }
    }
}
