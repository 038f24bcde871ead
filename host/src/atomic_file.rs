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

    /// A tmpfs of 64 KiB mounted on a fresh directory, unmounted when dropped (also when a test
    /// fails).
    struct SmallDisk {
        dir: tempfile::TempDir,
    }

    impl SmallDisk {
        fn mount() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let status = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "mount tmpfs (tests run as root)");
            SmallDisk { dir }
        }

        fn path(&self) -> &Path {
            self.dir.path()
        }

        /// Fills the disk to its last byte.
        fn fill(&self) {
            let mut f = std::fs::File::create(self.path().join("filler")).unwrap();
            let chunk = [0u8; 4096];
            loop {
                match f.write(&chunk) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(28) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            // The last partial block too.
            while f.write(&[0u8]).is_ok_and(|n| n == 1) {}
        }

        fn remount(&self, options: &str) {
            let status = std::process::Command::new("mount")
                .args(["-o", options])
                .arg(self.path())
                .status()
                .unwrap();
            assert!(status.success());
        }

        fn names(&self) -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(self.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            names
        }
    }

    impl Drop for SmallDisk {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg(self.dir.path())
                .status();
        }
    }

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

        std::fs::remove_file(disk.path().join("filler")).unwrap();
        disk.remount("remount,ro");
        let error = write(&path, &new, 0o644, ".tmp-").unwrap_err();
        assert_eq!(error.raw_os_error(), Some(30), "{error}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");

        disk.remount("remount,rw");
        write(&path, &new, 0o600, ".tmp-").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), new);
        assert_eq!(disk.names(), ["spec.json"]);
    }
}
