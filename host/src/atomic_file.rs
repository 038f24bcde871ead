//! Replacing a file so that no fault loses it: the files wdp keeps (CDI specs, compiled
//! components) are read by others at any moment (a container runtime, the next start), and a
//! full or read-only disk must leave them as they were, never truncated or half written.
//!
//! The new content goes to a temporary file in the same directory (a rename within one file
//! system is atomic), is synced, and is renamed over the old file; the directory is synced so
//! the rename itself survives a crash. When any step fails the temporary file is removed (it
//! would otherwise hold on to the very space a full disk lacks) and the old file is untouched.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Replaces the file at `path` with `bytes` (mode `mode`), or leaves it as it was and says why.
/// The temporary file's name starts with `prefix`, so whoever cleans the directory knows it.
pub fn write(path: &Path, bytes: &[u8], mode: u32, prefix: &str) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // Dropped (and removed) on any early return.
    let mut tmp = tempfile::Builder::new().prefix(prefix).tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
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
        assert_eq!(disk.names(), ["filler", "spec.json"], "no temporary file left");

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
