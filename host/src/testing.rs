//! What the unit tests of several modules make on disk: real device nodes in fixture roots, and
//! small file systems that fill up or turn read-only.

use std::path::Path;

/// `mknod` of a character device `major:minor` with permission bits `mode` at `path` (tests run
/// as root; where they cannot, the caller decides what stands in).
pub fn char_device(path: &Path, major: u32, minor: u32, mode: u32) -> std::io::Result<()> {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(mode),
        rustix::fs::makedev(major, minor),
    )
    .map_err(Into::into)
}

/// A tmpfs of 64 KiB mounted on a fresh directory (tests run as root), unmounted when dropped:
/// also when a test fails, so no mount outlives it.
pub struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// Mounts it.
    pub fn mount() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount a tmpfs (tests run as root)");
        SmallDisk { dir }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills it to its last byte with the file `filler`.
    pub fn fill(&self) {
        use std::io::Write;
        let mut file = std::fs::File::create(self.path().join("filler")).expect("create filler");
        for chunk in [4096, 1] {
            let bytes = vec![0u8; chunk];
            while file.write(&bytes).is_ok_and(|n| n > 0) {}
        }
    }

    /// Removes the filler.
    pub fn free(&self) {
        std::fs::remove_file(self.path().join("filler")).expect("remove filler");
    }

    /// `mount -o remount,<options>` (`ro`, `rw`).
    pub fn remount(&self, options: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(self.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "remount {options}");
    }

    /// The names in it, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path())
            .expect("read the disk")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
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
