//! The content-addressed cache of pulled components, so a node restarts with the registry down.
//!
//! Layout under the cache directory:
//! - `blobs/sha256/<hex>.wasm`: a component, named by its own digest;
//! - `blobs/sha256/<hex>.config.json`: its artifact config (the declared world);
//! - `refs/<reference, escaped>`: what a reference last resolved to (manifest and layer digests,
//!   and the key fingerprint its signature was verified with, if any).
//!
//! Nothing read back is trusted blindly: a blob is re-hashed and must match its name.
//! Writes go to a temp file renamed into place, so a crash never leaves a torn entry.

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

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), OciError> {
    let err = |error| OciError::Cache {
        path: path.to_path_buf(),
        error,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
