//! The prepared claims, on disk: what makes NodePrepareResources idempotent across kubelet and
//! driver restarts. kubelet may prepare a claim again after either restarts, and must get the
//! same devices; a device held by one claim must stay held while the driver is down.
//!
//! The file is JSON, rewritten whole on every change through a temporary file in the same
//! directory that is fsynced and renamed over the old one (and the directory fsynced), so a
//! crash leaves either the old state or the new one, never a torn file. A write that fails (a
//! full or read-only disk) leaves the old file as it was and removes its temporary file, which
//! would otherwise keep the very space the disk lacks.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Why the checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading, writing, syncing or renaming failed.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The checkpoint file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not a checkpoint this version reads.
    #[error("checkpoint {path} is not valid: {source}")]
    Invalid {
        /// The checkpoint file.
        path: PathBuf,
        /// What did not parse.
        source: serde_json::Error,
    },
    /// The file is from a format version this build does not know.
    #[error("checkpoint {path} has version {found}, this build reads {VERSION}")]
    Version {
        /// The checkpoint file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
    },
}

/// The format version written; a different one is refused rather than guessed at.
pub const VERSION: u32 = 1;

/// One device handed to a claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's requests the device satisfies (the allocation result's request).
    pub request_names: Vec<String>,
    /// The pool of the device.
    pub pool: String,
    /// The device's published name.
    pub device: String,
    /// The CDI devices the runtime injects.
    pub cdi_device_ids: Vec<String>,
    /// Allocated with admin access: it may overlap any other claim.
    pub admin_access: bool,
    /// Allocated as one share of a device that allows multiple allocations.
    pub shared: bool,
}

/// One prepared claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// Its devices, in the allocation's order.
    pub devices: Vec<PreparedDevice>,
}

#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    /// Claim UID -> what was prepared for it.
    claims: BTreeMap<String, PreparedClaim>,
}

/// The prepared claims by UID, kept in memory and on disk.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    claims: BTreeMap<String, PreparedClaim>,
}

impl Checkpoint {
    /// The checkpoint at `path`: its claims when the file exists, none when it does not.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, CheckpointError> {
        let path = path.into();
        let claims = match std::fs::read(&path) {
            Ok(bytes) => {
                let file: File =
                    serde_json::from_slice(&bytes).map_err(|source| CheckpointError::Invalid {
                        path: path.clone(),
                        source,
                    })?;
                if file.version != VERSION {
                    return Err(CheckpointError::Version {
                        path,
                        found: file.version,
                    });
                }
                file.claims
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => return Err(CheckpointError::Io { path, source }),
        };
        Ok(Self { path, claims })
    }

    /// A checkpoint at `path` holding nothing, whatever the file holds (it is overwritten at the
    /// next save).
    pub fn empty(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            claims: BTreeMap::new(),
        }
    }

    /// The file this checkpoint lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The prepared claims by UID.
    pub fn claims(&self) -> &BTreeMap<String, PreparedClaim> {
        &self.claims
    }

    /// What was prepared for the claim with UID `uid`.
    pub fn get(&self, uid: &str) -> Option<&PreparedClaim> {
        self.claims.get(uid)
    }

    /// Records `claim` under `uid` in memory; [`Checkpoint::save`] makes it durable.
    pub fn insert(&mut self, uid: String, claim: PreparedClaim) {
        self.claims.insert(uid, claim);
    }

    /// Forgets the claim with UID `uid`; whether it was there.
    pub fn remove(&mut self, uid: &str) -> bool {
        self.claims.remove(uid).is_some()
    }

    /// Writes the state atomically: a temporary file beside the checkpoint, fsynced, renamed
    /// over it, and the directory fsynced so the rename itself survives a crash.
    pub fn save(&self) -> Result<(), CheckpointError> {
        let io = |source| CheckpointError::Io {
            path: self.path.clone(),
            source,
        };
        let file = File {
            version: VERSION,
            claims: self.claims.clone(),
        };
        let bytes =
            serde_json::to_vec_pretty(&file).map_err(|source| CheckpointError::Invalid {
                path: self.path.clone(),
                source,
            })?;
        let dir = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "checkpoint".into());
        let tmp = dir.join(format!(".{name}.tmp"));
        // One save at a time (the service holds the checkpoint's lock), so one temporary name
        // does; removed when any step fails, or it would keep the space a full disk lacks.
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(&bytes)?;
            f.sync_all()
        });
        if let Err(source) = written.and_then(|()| std::fs::rename(&tmp, &self.path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(source));
        }
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(device: &str) -> PreparedClaim {
        PreparedClaim {
            namespace: "ns".into(),
            name: "c".into(),
            devices: vec![PreparedDevice {
                request_names: vec!["gpu".into()],
                pool: "node-a".into(),
                device: device.into(),
                cdi_device_ids: vec!["example.com/gpu=0".into()],
                admin_access: false,
                shared: false,
            }],
        }
    }

    #[test]
    fn survives_a_reopen_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/dra.json");
        let mut cp = Checkpoint::open(&path).unwrap();
        assert!(cp.claims().is_empty());
        cp.insert("uid-1".into(), claim("gpu-0"));
        cp.insert("uid-2".into(), claim("gpu-1"));
        cp.save().unwrap();
        assert!(cp.remove("uid-2"));
        assert!(!cp.remove("uid-3"));
        cp.save().unwrap();

        let again = Checkpoint::open(&path).unwrap();
        assert_eq!(again.claims().len(), 1);
        assert_eq!(again.get("uid-1"), Some(&claim("gpu-0")));
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["dra.json"]);
    }

    /// Unmounts the tmpfs at its path when dropped, also when the test fails.
    struct Mounted(PathBuf);

    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }

    #[test]
    fn a_full_disk_keeps_the_last_checkpoint_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs (tests run as root)");
        let mounted = Mounted(dir.path().to_path_buf());
        let path = mounted.0.join("dra.json");
        let mut cp = Checkpoint::open(&path).unwrap();
        cp.insert("uid-1".into(), claim("gpu-0"));
        cp.save().unwrap();
        let before = std::fs::read(&path).unwrap();

        // Filled to the last byte.
        let mut filler = std::fs::File::create(mounted.0.join("filler")).unwrap();
        while filler.write(&[0u8; 512]).is_ok_and(|n| n > 0) {}
        while filler.write(&[0u8]).is_ok_and(|n| n > 0) {}
        for i in 0..200 {
            cp.insert(format!("uid-{i}"), claim(&format!("gpu-{i}")));
        }
        let error = cp.save().unwrap_err();
        assert!(error.to_string().contains("(os error 28)"), "{error}");
        assert_eq!(std::fs::read(&path).unwrap(), before, "the last one, whole");
        let mut names: Vec<_> = std::fs::read_dir(&mounted.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["dra.json", "filler"], "no temporary file left");
        assert_eq!(Checkpoint::open(&path).unwrap().claims().len(), 1);
    }

    #[test]
    fn a_torn_or_foreign_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dra.json");
        std::fs::write(&path, b"{\"version\":1,\"claims\":{").unwrap();
        assert!(matches!(
            Checkpoint::open(&path),
            Err(CheckpointError::Invalid { .. })
        ));
        std::fs::write(&path, b"{\"version\":7,\"claims\":{}}").unwrap();
        assert!(matches!(
            Checkpoint::open(&path),
            Err(CheckpointError::Version { found: 7, .. })
        ));
    }
}
