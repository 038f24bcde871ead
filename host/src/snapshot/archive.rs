//! The snapshot file: one gzip-compressed tar.
//!
//! ```text
//! manifest.json     what was recorded, and the tree the scan produced (see Manifest)
//! component.wasm    the scanner that ran, so the case replays without hunting for the build
//! sys/...           directories, regular files (contents as read) and symlinks (targets kept)
//! dev/...           directories and symlinks, and device nodes as tar `char`/`block` entries:
//!                   type, major, minor and mode in the header, never any contents
//! ```
//!
//! A standard `tar tzvf` lists it. Nothing in it is extracted by path by the replay: /sys goes
//! into a fresh directory through checked names (no `..`, nothing below a symlink), /dev stays a
//! metadata table.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use tar::{EntryType, Header};

use super::SnapshotError;
use super::manifest::{Counts, FORMAT, Manifest};
use super::record::{Entry, Recording};
use crate::hostfs::resolve::{Kind, Stat};
use crate::hostfs::table::DevTable;

/// The manifest's name in the archive.
pub const MANIFEST: &str = "manifest.json";
/// The embedded component's name in the archive.
pub const COMPONENT: &str = "component.wasm";
/// Largest entry a reader accepts (a component included): a damaged or hostile archive cannot
/// make the replay allocate without bound.
const MAX_ENTRY: u64 = 512 << 20;
/// Most entries a reader accepts.
const MAX_ENTRIES: usize = 1 << 20;
/// Most bytes of contents, all entries together, a reader accepts.
const MAX_TOTAL: u64 = 1 << 30;

/// What a recording holds, by kind.
pub fn counts(rec: &Recording) -> Counts {
    let mut c = Counts::default();
    for e in rec.sys.values().chain(rec.dev.values()) {
        match e.stat.kind {
            Kind::Dir => c.dirs += 1,
            Kind::File => c.files += 1,
            Kind::Symlink(_) => c.symlinks += 1,
            Kind::Char { .. } | Kind::Block { .. } => c.nodes += 1,
            Kind::Other => {}
        }
        c.bytes += e.contents.as_ref().map_or(0, |b| b.len() as u64);
    }
    c
}

/// Writes the snapshot to `path` (through a temporary file beside it, so a failed write never
/// leaves half an archive under that name).
pub fn write(
    path: &Path,
    manifest: &Manifest,
    component: &[u8],
    rec: &Recording,
    mtime: u64,
) -> Result<(), SnapshotError> {
    let io = |error| SnapshotError::Io {
        path: path.to_path_buf(),
        error,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    let mut tmp = write_to(tmp, manifest, component, rec, mtime).map_err(io)?;
    tmp.flush().map_err(io)?;
    // On disk before it replaces a case of the same name: a crash or a full disk never leaves
    // a torn archive under that name (a failed write removes the temporary file).
    tmp.as_file().sync_all().map_err(io)?;
    // A case to attach to a bug report: readable like any file the user writes (a temporary file
    // starts private).
    use std::os::unix::fs::PermissionsExt;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

fn header(kind: EntryType, mode: u32, size: u64, mtime: u64) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(mtime);
    h.set_uid(0);
    h.set_gid(0);
    h
}

fn append_file<W: Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    bytes: &[u8],
    mode: u32,
    mtime: u64,
) -> std::io::Result<()> {
    let mut h = header(EntryType::Regular, mode, bytes.len() as u64, mtime);
    tar.append_data(&mut h, name, bytes)
}

fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &Path,
    entry: &Entry,
    mtime: u64,
) -> std::io::Result<()> {
    let mode = entry.stat.mode;
    match &entry.stat.kind {
        Kind::Dir => {
            let mut h = header(EntryType::Directory, mode, 0, mtime);
            tar.append_data(&mut h, path, std::io::empty())
        }
        Kind::File => {
            let bytes = entry.contents.as_deref().unwrap_or_default();
            let mut h = header(EntryType::Regular, mode, bytes.len() as u64, mtime);
            tar.append_data(&mut h, path, bytes)
        }
        Kind::Symlink(target) => {
            let mut h = header(EntryType::Symlink, 0o777, 0, mtime);
            tar.append_link(&mut h, path, target)
        }
        Kind::Char { major, minor } | Kind::Block { major, minor } => {
            let kind = match entry.stat.kind {
                Kind::Char { .. } => EntryType::Char,
                _ => EntryType::Block,
            };
            let mut h = header(kind, mode, 0, mtime);
            h.set_device_major(*major)?;
            h.set_device_minor(*minor)?;
            tar.append_data(&mut h, path, std::io::empty())
        }
        // FIFOs and sockets are not devices and hold nothing a scanner can read.
        Kind::Other => Ok(()),
    }
}

/// Writes the snapshot as a gzip stream into `out` (a file, or stdout for `--output -`) and
/// returns it.
pub fn write_to<W: Write>(
    out: W,
    manifest: &Manifest,
    component: &[u8],
    rec: &Recording,
    mtime: u64,
) -> std::io::Result<W> {
    let mut tar = tar::Builder::new(GzEncoder::new(out, Compression::default()));
    let json = serde_json::to_vec_pretty(manifest).map_err(std::io::Error::other)?;
    append_file(&mut tar, MANIFEST, &json, 0o644, mtime)?;
    append_file(&mut tar, COMPONENT, component, 0o644, mtime)?;
    for (top, entries) in [("sys", &rec.sys), ("dev", &rec.dev)] {
        let root = Entry {
            stat: Stat {
                kind: Kind::Dir,
                mode: 0o755,
            },
            contents: None,
        };
        append(&mut tar, Path::new(top), &root, mtime)?;
        for (rel, entry) in entries {
            append(&mut tar, &Path::new(top).join(rel), entry, mtime)?;
        }
    }
    tar.into_inner()?.finish()
}

/// A snapshot read back.
#[derive(Debug)]
pub struct Snapshot {
    /// The archive's manifest.
    pub manifest: Manifest,
    /// The recorded component, if the archive has one.
    pub component: Option<Vec<u8>>,
    /// /sys entries by path relative to the sys root.
    pub sys: BTreeMap<PathBuf, Entry>,
    /// /dev, as metadata.
    pub dev: DevTable,
}

/// Reads the snapshot at `path`; any damage is an error naming the file and what is wrong.
pub fn read(path: &Path) -> Result<Snapshot, SnapshotError> {
    let corrupt = |reason: String| SnapshotError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|error| SnapshotError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    let mut archive = tar::Archive::new(GzDecoder::new(file));
    let mut manifest = None;
    let mut component = None;
    let mut sys = BTreeMap::new();
    let mut dev = Vec::new();
    let entries = archive
        .entries()
        .map_err(|e| corrupt(format!("not a gzip-compressed tar: {e}")))?;
    let mut total = 0u64;
    for (n, entry) in entries.enumerate() {
        if n == MAX_ENTRIES {
            return Err(corrupt(format!("more than {MAX_ENTRIES} entries")));
        }
        let mut entry =
            entry.map_err(|e| corrupt(format!("not a gzip-compressed tar (entry {n}): {e}")))?;
        let name = entry
            .path()
            .map_err(|e| corrupt(format!("entry {n}: bad name: {e}")))?
            .into_owned();
        let kind = entry.header().entry_type();
        total = total.saturating_add(entry.size());
        if total > MAX_TOTAL {
            return Err(corrupt(format!(
                "more than {} MiB of contents",
                MAX_TOTAL >> 20
            )));
        }
        if entry.size() > MAX_ENTRY {
            return Err(corrupt(format!(
                "{}: {} bytes, more than a snapshot entry may hold",
                name.display(),
                entry.size()
            )));
        }
        let contents = |entry: &mut tar::Entry<_>| -> Result<Vec<u8>, SnapshotError> {
            let mut bytes = Vec::new();
            entry
                .read_to_end(&mut bytes)
                .map_err(|e| corrupt(format!("{}: {e}", name.display())))?;
            Ok(bytes)
        };
        if name == Path::new(MANIFEST) {
            let bytes = contents(&mut entry)?;
            let m: Manifest =
                serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("{MANIFEST}: {e}")))?;
            manifest = Some(m);
            continue;
        }
        if name == Path::new(COMPONENT) {
            component = Some(contents(&mut entry)?);
            continue;
        }
        let (top, rel) = split(&name)
            .ok_or_else(|| corrupt(format!("unexpected entry {:?}", name.display())))?;
        let mode = entry.header().mode().unwrap_or(0o644) & 0o7777;
        let stat_kind = match kind {
            EntryType::Directory => Kind::Dir,
            EntryType::Regular | EntryType::Continuous => Kind::File,
            EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| corrupt(format!("{}: {e}", name.display())))?
                    .ok_or_else(|| {
                        corrupt(format!("{}: symlink without a target", name.display()))
                    })?;
                Kind::Symlink(target.to_string_lossy().into_owned())
            }
            EntryType::Char | EntryType::Block => {
                let numbers = |n: std::io::Result<Option<u32>>| {
                    n.ok()
                        .flatten()
                        .ok_or_else(|| corrupt(format!("{}: bad device numbers", name.display())))
                };
                let major = numbers(entry.header().device_major())?;
                let minor = numbers(entry.header().device_minor())?;
                if kind == EntryType::Char {
                    Kind::Char { major, minor }
                } else {
                    Kind::Block { major, minor }
                }
            }
            other => {
                return Err(corrupt(format!(
                    "{}: unexpected entry type {other:?}",
                    name.display()
                )));
            }
        };
        let file_bytes = if stat_kind == Kind::File && top == "sys" {
            Some(contents(&mut entry)?)
        } else {
            None
        };
        let stat = Stat {
            kind: stat_kind,
            mode,
        };
        if rel.as_os_str().is_empty() {
            continue; // "sys/" or "dev/" itself
        }
        if top == "sys" {
            sys.insert(
                rel,
                Entry {
                    stat,
                    contents: file_bytes,
                },
            );
        } else {
            if matches!(stat.kind, Kind::File) && entry.size() > 0 {
                return Err(corrupt(format!(
                    "{}: a /dev entry with contents (snapshots never hold device contents)",
                    name.display()
                )));
            }
            dev.push((rel, stat));
        }
    }
    let manifest = manifest.ok_or_else(|| corrupt(format!("no {MANIFEST}")))?;
    if manifest.format != FORMAT {
        return Err(corrupt(format!(
            "format {} (this wdp reads format {FORMAT})",
            manifest.format
        )));
    }
    Ok(Snapshot {
        manifest,
        component,
        sys,
        dev: DevTable::new(dev),
    })
}

/// `sys/a/b` -> ("sys", "a/b"); None for anything else, and for names with `..`, `.` or a root.
fn split(name: &Path) -> Option<(&'static str, PathBuf)> {
    let mut parts = name.components();
    let top = match parts.next()? {
        Component::Normal(t) if t == "sys" => "sys",
        Component::Normal(t) if t == "dev" => "dev",
        _ => return None,
    };
    let mut rel = PathBuf::new();
    for c in parts {
        match c {
            Component::Normal(n) => rel.push(n),
            _ => return None,
        }
    }
    Some((top, rel))
}

impl Snapshot {
    /// Writes the recorded /sys below `dir` (an empty directory): directories, files with their
    /// recorded contents, symlinks with their recorded targets. Refuses an entry below a
    /// recorded symlink or file, so nothing is ever written through a link.
    pub fn extract_sys(&self, dir: &Path, archive: &Path) -> Result<(), SnapshotError> {
        let io = |p: &Path, error| SnapshotError::Io {
            path: p.to_path_buf(),
            error,
        };
        for (rel, entry) in &self.sys {
            let mut parent = rel.parent();
            while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
                if let Some(e) = self.sys.get(p)
                    && e.stat.kind != Kind::Dir
                {
                    return Err(SnapshotError::Corrupt {
                        path: archive.to_path_buf(),
                        reason: format!("sys/{} is below a non-directory", rel.display()),
                    });
                }
                parent = p.parent();
            }
            let full = dir.join(rel);
            if let Some(p) = full.parent() {
                std::fs::create_dir_all(p).map_err(|e| io(p, e))?;
            }
            match &entry.stat.kind {
                Kind::Dir => std::fs::create_dir_all(&full).map_err(|e| io(&full, e))?,
                Kind::File => std::fs::write(&full, entry.contents.as_deref().unwrap_or_default())
                    .map_err(|e| io(&full, e))?,
                Kind::Symlink(target) => {
                    std::os::unix::fs::symlink(target, &full).map_err(|e| io(&full, e))?
                }
                // Device nodes under /sys are not replayed (sysfs has none).
                Kind::Char { .. } | Kind::Block { .. } | Kind::Other => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            format: FORMAT,
            wdp_version: "0".into(),
            scanner: "s".into(),
            component: "s.wasm".into(),
            component_sha256: String::new(),
            env: Vec::new(),
            allow_mount: Vec::new(),
            created: String::new(),
            kernel_release: None,
            sys_root: "/sys".into(),
            dev_root: "/dev".into(),
            redacted: Vec::new(),
            limits: None,
            counts: Counts::default(),
            tree: serde_json::json!({}),
            error: None,
        }
    }

    /// A tar.gz with the manifest and then `extra` raw entries `(name, type, link)`.
    fn hostile(path: &Path, extra: &[(&str, EntryType, &str)]) {
        let file = std::fs::File::create(path).unwrap();
        let mut tar = tar::Builder::new(GzEncoder::new(file, Compression::fast()));
        let json = serde_json::to_vec(&manifest()).unwrap();
        append_file(&mut tar, MANIFEST, &json, 0o644, 0).unwrap();
        for (name, kind, link) in extra {
            let mut h = header(*kind, 0o644, 0, 0);
            // Raw names: the builder's own checks would refuse some of these.
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            if !link.is_empty() {
                h.set_link_name(link).unwrap();
            }
            h.set_cksum();
            tar.append(&h, std::io::empty()).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap();
    }

    #[test]
    fn round_trip_keeps_every_kind() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = Recording::default();
        let e = |kind, contents: Option<&str>| Entry {
            stat: Stat { kind, mode: 0o640 },
            contents: contents.map(|c| c.as_bytes().to_vec()),
        };
        rec.sys.insert("a".into(), e(Kind::Dir, None));
        rec.sys.insert("a/f".into(), e(Kind::File, Some("1\n")));
        // Symlinks have no mode of their own (lstat says 0777, and so does the archive).
        let mut link = e(Kind::Symlink("a/f".into()), None);
        link.stat.mode = 0o777;
        rec.sys.insert("l".into(), link);
        rec.dev.insert(
            "c".into(),
            e(
                Kind::Char {
                    major: 226,
                    minor: 128,
                },
                None,
            ),
        );
        rec.dev
            .insert("b".into(), e(Kind::Block { major: 8, minor: 1 }, None));
        let file = dir.path().join("s.tar.gz");
        write(&file, &manifest(), b"wasm", &rec, 0).unwrap();
        let s = read(&file).unwrap();
        assert_eq!(s.manifest, manifest());
        assert_eq!(s.component.as_deref(), Some(&b"wasm"[..]));
        assert_eq!(s.sys, rec.sys);
        let dev: Vec<_> = s
            .dev
            .entries()
            .map(|(p, st)| (p.clone(), st.clone()))
            .collect();
        let want: Vec<_> = rec
            .dev
            .iter()
            .map(|(p, e)| (p.clone(), e.stat.clone()))
            .collect();
        assert_eq!(dev, want);
        let out = dir.path().join("x");
        s.extract_sys(&out, &file).unwrap();
        assert_eq!(std::fs::read_to_string(out.join("l")).unwrap(), "1\n");
    }

    #[test]
    fn hostile_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for (name, kind, link) in [
            ("sys/../escape", EntryType::Regular, ""),
            ("/etc/passwd", EntryType::Regular, ""),
            ("other/x", EntryType::Regular, ""),
            ("sys/x", EntryType::Fifo, ""),
        ] {
            let file = dir.path().join("bad.tar.gz");
            hostile(&file, &[(name, kind, link)]);
            let e = read(&file).unwrap_err().to_string();
            assert!(e.contains("is not a usable wdp snapshot"), "{name}: {e}");
        }
        // A file below a symlink would be written through it: refused at extraction.
        let file = dir.path().join("link.tar.gz");
        hostile(
            &file,
            &[
                ("sys/l", EntryType::Symlink, "/tmp"),
                ("sys/l/x", EntryType::Regular, ""),
            ],
        );
        let s = read(&file).unwrap();
        let e = s.extract_sys(&dir.path().join("out"), &file).unwrap_err();
        assert!(e.to_string().contains("below a non-directory"), "{e}");
    }
}
