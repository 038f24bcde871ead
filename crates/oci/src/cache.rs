//! The content-addressed cache of pulled components, so a node restarts with the registry down.
//!
//! Layout under the cache directory:
//! - `blobs/sha256/<hex>.wasm`: a component, named by its own digest;
//! - `blobs/sha256/<hex>.config.json`: its artifact config (the declared world);
//! - `refs/<reference, escaped>`: what a reference last resolved to (manifest and layer digests,
//!   and the key fingerprint its signature was verified with, if any).
//!
//! Nothing read back is trusted blindly: a blob is re-hashed and must match its name.
//! Writes go to a temporary file flushed and renamed into place, so a crash never leaves a torn
//! entry.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::artifact::WasmConfig;
use super::{OciError, Pulled, sha256_digest};

/// The cache directory.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
}

/// What a reference resolved to when it was last pulled.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RefEntry {
    /// The manifest digest the reference resolved to.
    pub manifest_digest: String,
    /// The component layer's digest: the blob's name in the cache.
    pub layer_digest: String,
    /// Fingerprint of the key the signature was verified with.
    pub verified_key: Option<String>,
}

/// A cached component, re-verified.
#[derive(Debug)]
pub struct Cached {
    /// What the reference resolved to.
    pub entry: RefEntry,
    /// The component file, its digest checked again.
    pub path: PathBuf,
    /// The artifact config stored with it.
    pub config: WasmConfig,
}

impl Cache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Cache { dir: dir.into() }
    }

    /// Where a component with `layer_digest` is stored.
    pub fn blob_path(&self, layer_digest: &str) -> PathBuf {
        let hex = layer_digest.trim_start_matches("sha256:");
        self.dir.join("blobs/sha256").join(format!("{hex}.wasm"))
    }

    fn config_path(&self, layer_digest: &str) -> PathBuf {
        self.blob_path(layer_digest).with_extension("config.json")
    }

    fn ref_path(&self, reference: &str) -> PathBuf {
        let escaped: String = reference
            .trim_start_matches(super::SCHEME)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir.join("refs").join(escaped)
    }

    /// Stores a pulled component under its digest and records what `reference` resolved to.
    pub fn store(
        &self,
        reference: &str,
        pulled: &Pulled,
        verified_key: Option<String>,
    ) -> Result<PathBuf, OciError> {
        let blob = self.blob_path(&pulled.layer_digest);
        write_atomic(&blob, &pulled.bytes)?;
        let config = serde_json::to_vec(&pulled.config).map_err(|e| OciError::Cache {
            path: blob.clone(),
            error: std::io::Error::other(e),
        })?;
        write_atomic(&self.config_path(&pulled.layer_digest), &config)?;
        let entry = RefEntry {
            manifest_digest: pulled.manifest_digest.clone(),
            layer_digest: pulled.layer_digest.clone(),
            verified_key,
        };
        let entry = serde_json::to_vec(&entry).map_err(|e| OciError::Cache {
            path: blob.clone(),
            error: std::io::Error::other(e),
        })?;
        write_atomic(&self.ref_path(reference), &entry)?;
        Ok(blob)
    }

    /// What `reference` last resolved to, if its blob is still intact.
    pub fn lookup(&self, reference: &str) -> Option<Cached> {
        let entry: RefEntry =
            serde_json::from_slice(&std::fs::read(self.ref_path(reference)).ok()?).ok()?;
        let path = self.blob_path(&entry.layer_digest);
        let bytes = std::fs::read(&path).ok()?;
        if sha256_digest(&bytes) != entry.layer_digest {
            tracing::warn!(path = %path.display(), "cached component does not match its digest; ignored");
            return None;
        }
        let config =
            serde_json::from_slice(&std::fs::read(self.config_path(&entry.layer_digest)).ok()?)
                .ok()?;
        Some(Cached {
            entry,
            path,
            config,
        })
    }
}

/// Replaces `path` with `bytes`, or leaves what was there: the bytes go to a temporary file in
/// the same directory (named `.wdp-oci-*`, removed on every failure), flushed to disk before the
/// rename, and the directory after it, so a crash or a full disk never leaves a torn entry.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), OciError> {
    let err = |error| OciError::Cache {
        path: path.to_path_buf(),
        error,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".wdp-oci-")
        .tempfile_in(dir)
        .map_err(err)?;
    tmp.write_all(bytes).map_err(err)?;
    tmp.as_file().sync_all().map_err(err)?;
    tmp.persist(path).map_err(|e| err(e.error))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pulled(bytes: &[u8]) -> Pulled {
        let layer_digest = sha256_digest(bytes);
        Pulled {
            manifest_digest: format!("sha256:{}", "0".repeat(64)),
            layer_digest: layer_digest.clone(),
            bytes: bytes.to_vec(),
            config: WasmConfig {
                created: "2026-12-07T00:00:00Z".into(),
                author: None,
                architecture: "wasm".into(),
                os: "wasip2".into(),
                layer_digests: vec![layer_digest],
                component: None,
            },
        }
    }

    /// Every name under `dir`, recursively.
    fn names(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            out.push(entry.file_name().to_string_lossy().into_owned());
            if entry.path().is_dir() {
                out.extend(names(&entry.path()));
            }
        }
        out
    }

    const REFERENCE: &str = "oci://registry.example/scanners/pci:1";

    #[test]
    fn a_stored_component_is_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path());
        let first = pulled(b"first component");
        let path = cache.store(REFERENCE, &first, None).unwrap();
        let found = cache.lookup(REFERENCE).unwrap();
        assert_eq!(found.path, path);
        assert_eq!(found.entry.layer_digest, first.layer_digest);
        assert_eq!(found.config.layer_digests, first.config.layer_digests);
        assert!(!names(dir.path()).iter().any(|n| n.starts_with(".wdp-oci-")));
    }

    #[test]
    fn a_failed_write_keeps_the_previous_entry_and_removes_its_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path());
        let first = pulled(b"first component");
        cache.store(REFERENCE, &first, None).unwrap();
        // The second component's config cannot be renamed into place: a non-empty directory
        // holds its name.
        let second = pulled(b"second component");
        let blocked = cache.config_path(&second.layer_digest);
        std::fs::create_dir_all(blocked.join("occupied")).unwrap();
        let error = cache.store(REFERENCE, &second, None).unwrap_err();
        assert!(
            error.to_string().contains(&blocked.display().to_string()),
            "{error}"
        );
        let found = cache.lookup(REFERENCE).unwrap();
        assert_eq!(found.entry.layer_digest, first.layer_digest);
        let left: Vec<_> = names(dir.path())
            .into_iter()
            .filter(|n| n.starts_with(".wdp-oci-") || n.contains(".tmp"))
            .collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
    }
}
