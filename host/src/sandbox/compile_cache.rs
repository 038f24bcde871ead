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
//!
//! A second, read-only directory of entries may be consulted first
//! ([`CompileCache::with_precompiled`]): what `wdp precompile` wrote when the image was built, so
//! that the first start on a node loads the bundled scanners instead of compiling them. Its
//! entries are named exactly as this cache names its own, so a wdp built with another wasmtime,
//! other compiler settings, or a node whose CPU features differ from the build machine's simply
//! misses and falls through to the writable cache, then to compiling. It belongs to the image
//! (root's, read-only: as trusted as the binary beside it): nothing is ever written or removed
//! there.

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
    /// Loaded from the read-only precompiled directory (the image's): no compiling, nothing
    /// written.
    Precompiled,
    /// Loaded from the cache.
    Hit,
    /// Not cached yet: compiled and stored.
    Miss,
    /// A bad entry was found, removed, and the component recompiled.
    Rebuilt,
}

/// Why `wdp precompile` could not produce an entry: a component wasmtime refuses, or a
/// directory it cannot write.
#[derive(Debug, thiserror::Error)]
pub enum PrecompileError {
    /// wasmtime could not compile the component.
    #[error("cannot compile: {0:#}")]
    Compile(wasmtime::Error),
    /// The entry (or its directory) could not be written.
    #[error("cannot write {path}: {error}")]
    Write {
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },
}

/// The modes of an entry's directory and files.
#[derive(Debug, Clone, Copy)]
struct Modes {
    dir: u32,
    file: u32,
}

/// The writable cache's: the host's alone (see the module's doc: what is there is trusted).
const PRIVATE: Modes = Modes {
    dir: 0o700,
    file: 0o600,
};

/// A precompiled directory's: it ships in an image, owned by root and read-only there, to be
/// read by whichever user runs wdp.
const SHARED: Modes = Modes {
    dir: 0o755,
    file: 0o644,
};

/// The cache directory.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: PathBuf,
    /// Read-only entries consulted first (the image's); never written.
    precompiled: Option<PathBuf>,
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
            precompiled: None,
            report: Arc::new(LogWrites),
        }
    }

    /// Consults the read-only entries in `dir` (what `wdp precompile` wrote into the image)
    /// before this cache's own, so that a node's first start loads instead of compiling. An
    /// absent directory, or one without an entry for this engine, is no error: the component is
    /// looked for in the cache, then compiled.
    pub fn with_precompiled(mut self, dir: impl Into<PathBuf>) -> Self {
        self.precompiled = Some(dir.into());
        self
    }

    /// Reports its writes to `report` (`wdp_disk_write_failing{kind="compile-cache"}`) instead
    /// of the log alone.
    pub fn report_to(mut self, report: impl WriteReport + 'static) -> Self {
        self.report = Arc::new(report);
        self
    }

    /// The entry for `component` bytes under `engine`.
    pub fn entry_path(&self, engine: &Engine, component: &[u8]) -> PathBuf {
        self.dir.join(entry_name(engine, component))
    }

    /// The compiled component, from the precompiled directory, the cache, or compiled now (and
    /// stored in the cache).
    pub fn load(
        &self,
        engine: &Engine,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let name = entry_name(engine, bytes);
        if let Some(component) = self.load_precompiled(engine, &name) {
            return Ok((component, CacheOutcome::Precompiled));
        }
        let path = self.dir.join(&name);
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
        match self.store(&path, &component.serialize()?, PRIVATE) {
            Ok(()) => self.report.wrote(&path, None),
            Err(e) => self.report.wrote(&path, Some(&e)),
        }
        Ok((component, outcome))
    }

    /// The precompiled directory's entry `name`, if there is one `engine` accepts. Anything
    /// else falls through to the writable cache: the entry is left as it is (the directory is
    /// the image's, read-only), and said once per load.
    fn load_precompiled(&self, engine: &Engine, name: &str) -> Option<Component> {
        let path = self.precompiled.as_ref()?.join(name);
        if !path.exists() {
            // The usual miss: a component not bundled, or an image built for other CPU features.
            tracing::debug!(path = %path.display(), "no precompiled entry for this component and engine");
            return None;
        }
        match open_entry(engine, &path) {
            Ok(component) => Some(component),
            Err(reason) => {
                tracing::warn!(path = %path.display(), %reason, "precompiled entry rejected (left as it is); using the compile cache");
                None
            }
        }
    }

    /// Compiles `bytes` with `engine` and writes its entry into this cache's directory (created
    /// if need be), as [`CompileCache::load`] would but readable by all: what `wdp precompile`
    /// writes for an image to carry. Returns the entry's path.
    pub fn precompile(&self, engine: &Engine, bytes: &[u8]) -> Result<PathBuf, PrecompileError> {
        let payload = engine
            .precompile_component(bytes)
            .map_err(PrecompileError::Compile)?;
        let path = self.entry_path(engine, bytes);
        // The directory first, so that its own failure names it rather than the entry.
        create_dir(&self.dir, SHARED).map_err(|error| PrecompileError::Write {
            path: self.dir.clone(),
            error,
        })?;
        self.store(&path, &payload, SHARED)
            .map_err(|error| PrecompileError::Write {
                path: path.clone(),
                error,
            })?;
        Ok(path)
    }

    /// Writes the payload, then its checksum, each to a temporary name renamed into place: a
    /// crash between the two leaves a mismatch, which is rebuilt; a failed write leaves no
    /// temporary file behind.
    fn store(&self, path: &Path, payload: &[u8], modes: Modes) -> std::io::Result<()> {
        create_dir(&self.dir, modes)?;
        atomic_file::write(path, payload, modes.file, TEMP_PREFIX)?;
        atomic_file::write(
            &sum_path(path),
            hex(&Sha256::digest(payload)).as_bytes(),
            modes.file,
            TEMP_PREFIX,
        )
    }
}

/// Creates `dir` (and its parents) with `modes.dir`; an existing one is left as it is.
fn create_dir(dir: &Path, modes: Modes) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(modes.dir)
        .create(dir)
}

/// The file name of the entry for `component` bytes under `engine`: the same in the writable
/// cache and in a precompiled directory, and different for any other engine (wasmtime version,
/// compiler settings, CPU features).
fn entry_name(engine: &Engine, component: &[u8]) -> String {
    let mut h = ShaHasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut h);
    h.0.update(Sha256::digest(component));
    format!("{}.cwasm", hex(&h.0.finalize()))
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
    // SAFETY: the file is what `Component::serialize` (or `wdp precompile`) wrote into a
    // directory only this host may write (the cache, 0700) or only the image's builder wrote
    // (the precompiled directory, root's and read-only), and its checksum matches; wasmtime
    // itself refuses payloads from another version or configuration. It is not modified while
    // mapped: entries are only ever replaced by rename, which leaves the mapped file intact.
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

    /// Every file under `dir` with its contents: what "nothing was written there" compares.
    fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let path = e.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                (path, bytes)
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn precompiled_is_read_and_never_written() {
        let engine = Engine::default();
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let entry = CompileCache::new(&a)
            .precompile(&engine, EMPTY_COMPONENT)
            .unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&a), mode(&entry)), (0o755, 0o644), "readable by all");
        let cache = CompileCache::new(&b).with_precompiled(&a);
        assert_eq!(
            entry,
            a.join(
                cache
                    .entry_path(&engine, EMPTY_COMPONENT)
                    .file_name()
                    .unwrap()
            ),
            "named as the writable cache names it"
        );
        let shipped = contents(&a);
        assert_eq!(shipped.len(), 2, "payload and checksum: {shipped:?}");

        assert_eq!(
            cache.load(&engine, EMPTY_COMPONENT).unwrap().1,
            CacheOutcome::Precompiled
        );
        assert!(!b.exists(), "nothing compiled, nothing written");

        // Another engine configuration is another key: it misses and compiles into the cache.
        let mut config = wasmtime::Config::new();
        config.cranelift_opt_level(wasmtime::OptLevel::None);
        let other = Engine::new(&config).unwrap();
        assert_eq!(
            cache.load(&other, EMPTY_COMPONENT).unwrap().1,
            CacheOutcome::Miss
        );
        assert_eq!(contents(&a), shipped);
        std::fs::remove_dir_all(&b).unwrap();

        // A corrupt precompiled entry is passed over and left as it is.
        let mut payload = std::fs::read(&entry).unwrap();
        let last = payload.len() - 1;
        payload[last] ^= 1;
        std::fs::write(&entry, &payload).unwrap();
        let corrupt = contents(&a);
        assert_eq!(
            cache.load(&engine, EMPTY_COMPONENT).unwrap().1,
            CacheOutcome::Miss
        );
        assert_eq!(
            contents(&a),
            corrupt,
            "the precompiled directory is untouched"
        );
        assert_eq!(contents(&b).len(), 2, "compiled into the writable cache");
        assert_eq!(
            cache.load(&engine, EMPTY_COMPONENT).unwrap().1,
            CacheOutcome::Hit
        );
        assert_eq!(contents(&a), corrupt);

        // So is an entry without its checksum, and an absent directory is no error.
        std::fs::remove_file(sum_path(&entry)).unwrap();
        std::fs::remove_dir_all(&b).unwrap();
        assert_eq!(
            cache.load(&engine, EMPTY_COMPONENT).unwrap().1,
            CacheOutcome::Miss
        );
        assert_eq!(contents(&a).len(), 1);
        let absent =
            CompileCache::new(dir.path().join("c")).with_precompiled(dir.path().join("none"));
        assert_eq!(
            absent.load(&engine, EMPTY_COMPONENT).unwrap().1,
            CacheOutcome::Miss
        );
        assert!(!dir.path().join("none").exists());
    }
}
