//! An on-disk cache of compiled components.
//!
//! Compiling a component is the slowest thing the host does (milliseconds for a Rust guest, ten
//! seconds or more for Python or JavaScript on two cores). The cache keeps wasmtime's compiled
//! form keyed by the component's sha256 and the engine's compatibility hash (wasmtime version,
//! compiler settings, CPU features), so a restart loads in milliseconds and any change of engine
//! simply misses.
//!
//! An entry is two files: `<key>.cwasm`, exactly what `Component::serialize` wrote, and
//! `<key>.cwasm.sha256`, its checksum. It is trusted only after the checksum matches and wasmtime
//! accepts it; a corrupt, truncated or stale entry is logged, removed and rebuilt. The payload is
//! a file of its own so that wasmtime can map it (`deserialize_file`) instead of copying it into
//! anonymous memory: the compiled code of every scanner is then shared, file-backed memory of
//! which only the pages in use are resident. Loading compiled code is `unsafe` in wasmtime because
//! it is executable code: the cache directory must be writable by the host alone (it is created
//! 0700; a file replaced there after its checksum was checked would be trusted, and only the host
//! or root can replace it).

use std::hash::{Hash, Hasher};
use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::atomic_file::{self, LogWrites, WriteReport};

/// The prefix of the cache's temporary files.
const TEMP_PREFIX: &str = ".wdp-cwasm-";

/// How a load went, for logs, metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from the cache.
    Hit,
    /// Not cached yet: compiled and stored.
    Miss,
    /// A bad entry was found, removed, and the component recompiled.
    Rebuilt,
}

/// The cache directory.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: PathBuf,
    /// Where failed writes go: a read-only or full disk costs compile time at the next start,
    /// never correctness, and is logged once per entry, not at every load.
    report: Arc<dyn WriteReport>,
}

/// Feeds `Hash` output into sha256, so the engine's compatibility hash is stable across runs.
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        unreachable!("only the sha256 state is read")
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl CompileCache {
    /// A cache in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CompileCache {
            dir: dir.into(),
            report: Arc::new(LogWrites),
        }
    }

    /// Reports its writes to `report` (`wdp_disk_write_failing{kind="compile-cache"}`) instead
    /// of the log alone.
    pub fn report_to(mut self, report: impl WriteReport + 'static) -> Self {
        self.report = Arc::new(report);
        self
    }

    /// The entry for `component` bytes under `engine`.
    pub fn entry_path(&self, engine: &Engine, component: &[u8]) -> PathBuf {
        let mut h = ShaHasher(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut h);
        h.0.update(Sha256::digest(component));
        self.dir.join(format!("{}.cwasm", hex(&h.0.finalize())))
    }

    /// The compiled component, from the cache or compiled now (and stored).
    pub fn load(
        &self,
        engine: &Engine,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let path = self.entry_path(engine, bytes);
        let mut outcome = CacheOutcome::Miss;
        if path.exists() {
            match open_entry(engine, &path) {
                Ok(component) => return Ok((component, CacheOutcome::Hit)),
                Err(reason) => {
                    tracing::warn!(path = %path.display(), %reason, "compiled-component cache entry rejected; recompiling");
                    let _ = std::fs::remove_file(&path);
                    let _ = std::fs::remove_file(sum_path(&path));
                    outcome = CacheOutcome::Rebuilt;
                }
            }
        }
        let component = Component::new(engine, bytes)?;
        // A read-only or full disk costs speed, never correctness: the component runs from
        // memory, and is compiled again at the next start.
        match self.store(&path, &component.serialize()?) {
            Ok(()) => self.report.wrote(&path, None),
            Err(e) => self.report.wrote(&path, Some(&e)),
        }
        Ok((component, outcome))
    }

    /// Writes the payload, then its checksum, each to a temporary name renamed into place: a
    /// crash between the two leaves a mismatch, which is rebuilt; a failed write leaves no
    /// temporary file behind.
    fn store(&self, path: &Path, payload: &[u8]) -> std::io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        atomic_file::write(path, payload, 0o600, TEMP_PREFIX)?;
        atomic_file::write(
            &sum_path(path),
            hex(&Sha256::digest(payload)).as_bytes(),
            0o600,
            TEMP_PREFIX,
        )
    }
}

/// The checksum file of the entry at `path`.
fn sum_path(path: &Path) -> PathBuf {
    path.with_extension("cwasm.sha256")
}

/// Checks the entry's checksum (streaming: a 35 MB Python entry is never held in memory), then
/// maps it.
fn open_entry(engine: &Engine, path: &Path) -> Result<Component, String> {
    let want = std::fs::read_to_string(sum_path(path)).map_err(|e| format!("checksum: {e}"))?;
    let mut hasher = Sha256::new();
    let mut file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        hasher.update(&chunk[..n]);
    }
    if hex(&hasher.finalize()) != want.trim() {
        return Err("checksum mismatch".into());
    }
    // SAFETY: the file is what `Component::serialize` wrote into a directory only this host may
    // write (0700), and its checksum matches; wasmtime itself refuses payloads from another
    // version or configuration. It is not modified while mapped: entries are only ever replaced
    // by rename, which leaves the mapped file intact.
    unsafe { Component::deserialize_file(engine, path) }.map_err(|e| format!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest component: no imports, no exports.
    const EMPTY_COMPONENT: &[u8] = &[0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

    #[test]
    fn miss_hit_and_rebuild() {
        let engine = Engine::default();
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache::new(dir.path().join("c"));
        assert_eq!(
            cache.load(&engine, EMPTY_COMPONENT).unwrap().1,
            CacheOutcome::Miss
        );
        assert_eq!(
            cache.load(&engine, EMPTY_COMPONENT).unwrap().1,
            CacheOutcome::Hit
        );
        let path = cache.entry_path(&engine, EMPTY_COMPONENT);
        let mut entry = std::fs::read(&path).unwrap();
        let last = entry.len() - 1;
        entry[last] ^= 1;
        std::fs::write(&path, &entry).unwrap();
        assert_eq!(
            cache.load(&engine, EMPTY_COMPONENT).unwrap().1,
            CacheOutcome::Rebuilt
        );
        assert_eq!(
            cache.load(&engine, EMPTY_COMPONENT).unwrap().1,
            CacheOutcome::Hit
        );
        std::fs::write(&path, b"short").unwrap();
        assert_eq!(
            cache.load(&engine, EMPTY_COMPONENT).unwrap().1,
            CacheOutcome::Rebuilt
        );
        std::fs::remove_file(sum_path(&path)).unwrap();
        assert_eq!(
            cache.load(&engine, EMPTY_COMPONENT).unwrap().1,
            CacheOutcome::Rebuilt,
            "no checksum, no trust"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("c"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
