//! Replacing a file so that no fault loses it: the files wdp keeps (CDI specs, compiled
//! components) are read by others at any moment (a container runtime, the next start), and a
//! full or read-only disk must leave them as they were, never truncated or half written.
//!
//! The new content goes to a temporary file in the same directory (a rename within one file
//! system is atomic), is synced, and is renamed over the old file; the directory is synced so
//! the rename itself survives a crash. When any step fails the temporary file is removed (it
//! would otherwise hold on to the very space a full disk lacks) and the old file is untouched.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a writer of files reports how each write of a file went: the host's status implements
/// it (`/readyz`, the disk metrics, one log line per change of state). A trait so that a writer
/// below the status module (the compile cache, in the sandbox) reports to it without importing
/// it: data flows one way.
pub trait WriteReport: std::fmt::Debug + Send + Sync {
    /// The write of `path` succeeded (`None`) or failed with `error`; the previous file stays
    /// either way.
    fn wrote(&self, path: &Path, error: Option<&dyn std::fmt::Display>);
}

/// A report to the log alone, for a writer nothing observes (tests, tools).
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWrites;

impl WriteReport for LogWrites {
    fn wrote(&self, path: &Path, error: Option<&dyn std::fmt::Display>) {
        if let Some(error) = error {
            tracing::warn!(path = %path.display(), %error, "cannot write; the previous file stays");
        }
    }
}

/// Tells apart the temporary files of concurrent writes in one process.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Replaces the file at `path` with `bytes` (mode `mode`), or leaves it as it was and says why:
/// the OS error alone (`No space left on device (os error 28)`), the same at every attempt, so
/// a caller can tell a new failure from the same one again. The temporary file's name starts
/// with `prefix`, so whoever cleans the directory after a crash knows it.
pub fn write(path: &Path, bytes: &[u8], mode: u32, prefix: &str) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut tmp = Temporary(Some(
        dir.join(format!("{prefix}{}-{n}", std::process::id())),
    ));
    let tmp_path = tmp.0.clone().unwrap_or_default();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp_path)?;
    file.write_all(bytes)?;
    // The mode asked for, whatever the umask took from it.
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp_path, path)?;
    // Renamed: nothing left to remove.
    tmp.0 = None;
    std::fs::File::open(dir)?.sync_all()
}

/// A temporary file removed when dropped: on every early return of [`write`].
struct Temporary(Option<PathBuf>);

impl Drop for Temporary {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::SmallDisk;

    #[test]
    fn a_full_or_read_only_disk_keeps_the_old_file_and_no_temporary_one() {
        let disk = SmallDisk::mount();
        let path = disk.path().join("spec.json");
        write(&path, b"old", 0o644, ".tmp-").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);

        disk.fill();
        let new = vec![b'n'; 16 * 1024];
        let error = write(&path, &new, 0o644, ".tmp-").unwrap_err();
        assert_eq!(error.raw_os_error(), Some(28), "{error}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(
            disk.names(),
            ["filler", "spec.json"],
            "no temporary file left"
        );

        disk.free();
        disk.remount("ro");
        let error = write(&path, &new, 0o644, ".tmp-").unwrap_err();
        assert_eq!(error.raw_os_error(), Some(30), "{error}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");

        disk.remount("rw");
        write(&path, &new, 0o600, ".tmp-").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), new);
        assert_eq!(disk.names(), ["spec.json"]);
    }
}
