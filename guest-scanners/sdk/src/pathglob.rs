//! Glob patterns over a directory tree reached through some listing function.
//!
//! Why: /dev is not a preopen, so `std::fs` (and the `glob` crate's own walker) cannot see it; a
//! scanner lists it through the host's `devfs::read-dir` instead. This module walks a pattern such
//! as `/dev/bus/usb/*/*` one component at a time over any [`DirSource`] (devfs, std::fs for /sys,
//! or a fake in unit tests), matching each component with the `glob` crate's `Pattern`.
//!
//! Semantics follow shell globs and Go's `filepath.Glob`: `*`, `?` and `[...]` match within one
//! path component, a leading `.` must be matched literally, intermediate components must be
//! directories (or symlinks, which the source may follow), literal final components must exist,
//! unreadable directories are skipped, and the result is sorted by path.

use crate::bindings::scanner::wdp::device_plugin::devfs::{DirChanges, Node, NodeKind};
use glob::{MatchOptions, Pattern};

/// Something that can list directories and describe entries (absolute paths, `/`-separated).
pub trait DirSource {
    /// The entries of directory `dir`.
    fn list(&self, dir: &str) -> Result<Vec<Node>, String>;
    /// The entry at `path`, without following a final symlink.
    fn stat(&self, path: &str) -> Result<Node, String>;
    /// What changed in directory `dir` since the answer that carried version `since` (0: none
    /// yet), as the host's `devfs.read-dir-changes` answers it. By default the whole listing,
    /// with version 0: a source that keeps nothing.
    fn list_changes(&self, dir: &str, _since: u64) -> Result<DirChanges, String> {
        whole_listing(self, dir)
    }
}

/// The whole listing of `dir` as `list_changes` answers it, with version 0: what a source that
/// keeps nothing between listings says.
pub(crate) fn whole_listing<S: DirSource + ?Sized>(
    source: &S,
    dir: &str,
) -> Result<DirChanges, String> {
    Ok(DirChanges {
        version: 0,
        whole: true,
        changed: source.list(dir)?,
        removed: Vec::new(),
    })
}

/// One path matched by a glob, with its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    /// absolute path, e.g. "/dev/ttyUSB0"
    pub path: String,
    /// What the source said of it: from the directory listing, or a stat for a literal final
    /// component.
    pub node: Node,
}

pub(crate) const OPTIONS: MatchOptions = MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: true,
};

/// True when `s` has glob metacharacters (`*`, `?`, `[`).
pub fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Checks that `pattern` is an absolute glob without `.`/`..` components whose every component
/// is a valid `glob::Pattern`. The error says what is wrong (the caller adds where it came from).
pub fn validate(pattern: &str) -> Result<(), String> {
    if !pattern.starts_with('/') {
        return Err("must be an absolute path".into());
    }
    for comp in pattern.split('/').filter(|c| !c.is_empty()) {
        if comp == "." || comp == ".." {
            return Err("must not contain '.' or '..' components".into());
        }
        if is_glob(comp) {
            Pattern::new(comp).map_err(|e| format!("bad glob component {comp:?}: {}", e.msg))?;
        }
    }
    Ok(())
}

/// All paths matching `pattern` in `src`, sorted by path. Errors only for an invalid pattern.
pub fn glob_with(src: &impl DirSource, pattern: &str) -> Result<Vec<Match>, String> {
    validate(pattern)?;
    let comps: Vec<&str> = pattern.split('/').filter(|c| !c.is_empty()).collect();
    // (path so far, its node when it came from a listing)
    let mut current: Vec<(String, Option<Node>)> = vec![(String::new(), None)];
    for (i, comp) in comps.iter().enumerate() {
        let last = i + 1 == comps.len();
        let mut next = Vec::new();
        if is_glob(comp) {
            let pat = Pattern::new(comp).map_err(|e| e.msg.to_string())?;
            for (dir, _) in &current {
                let listed = if dir.is_empty() { "/" } else { dir.as_str() };
                let Ok(entries) = src.list(listed) else {
                    continue;
                };
                for n in entries {
                    if !pat.matches_with(&n.name, OPTIONS) {
                        continue;
                    }
                    if !last && !matches!(n.kind, NodeKind::Directory | NodeKind::Symlink) {
                        continue;
                    }
                    // (not `format!`: its machinery, once per entry, is a visible share of a
                    // 1,000-entry glob inside wasm)
                    let mut path = String::with_capacity(dir.len() + 1 + n.name.len());
                    path.push_str(dir);
                    path.push('/');
                    path.push_str(&n.name);
                    next.push((path, Some(n)));
                }
            }
        } else {
            for (dir, _) in &current {
                next.push((format!("{dir}/{comp}"), None));
            }
        }
        current = next;
    }
    let mut out: Vec<Match> = current
        .into_iter()
        .filter_map(|(path, node)| {
            let node = match node {
                Some(n) => n,
                None => src.stat(if path.is_empty() { "/" } else { &path }).ok()?,
            };
            Some(Match {
                path: if path.is_empty() { "/".into() } else { path },
                node,
            })
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out.dedup_by(|a, b| a.path == b.path);
    Ok(out)
}

/// A [`Node`] with only a name and a kind (major, minor and mode 0), for sources that have no more.
pub fn node(name: &str, kind: NodeKind) -> Node {
    Node {
        name: name.to_string(),
        kind,
        major: 0,
        minor: 0,
        mode: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostfs::FakeFs;

    fn fixture() -> FakeFs {
        use NodeKind::*;
        let mut fs = FakeFs::new();
        for (path, kind) in [
            ("/dev/ttyUSB0", CharDevice),
            ("/dev/ttyUSB1", CharDevice),
            ("/dev/ttyUSB10", CharDevice),
            ("/dev/ttyS0", CharDevice),
            ("/dev/.hidden", CharDevice),
            ("/dev/dri/card0", CharDevice),
            ("/dev/dri/card1", CharDevice),
            ("/dev/dri/renderD128", CharDevice),
            ("/dev/bus/usb/001/001", CharDevice),
            ("/dev/bus/usb/001/004", CharDevice),
            ("/dev/bus/usb/002/001", CharDevice),
            ("/dev/bus/usb/notes", File),
            ("/dev/kvm", CharDevice),
        ] {
            fs.node(path, kind);
        }
        fs.link("/dev/serial/by-id/usb-FTDI_x-if00", "../../ttyUSB0");
        fs
    }

    fn paths(v: Vec<Match>) -> Vec<String> {
        v.into_iter().map(|m| m.path).collect()
    }

    #[test]
    fn single_component_globs() {
        let fs = fixture();
        assert_eq!(
            paths(glob_with(&fs, "/dev/ttyUSB*").unwrap()),
            ["/dev/ttyUSB0", "/dev/ttyUSB1", "/dev/ttyUSB10"]
        );
        assert_eq!(
            paths(glob_with(&fs, "/dev/ttyUSB?").unwrap()),
            ["/dev/ttyUSB0", "/dev/ttyUSB1"]
        );
        assert_eq!(
            paths(glob_with(&fs, "/dev/tty[SU]*0").unwrap()),
            ["/dev/ttyS0", "/dev/ttyUSB0", "/dev/ttyUSB10"]
        );
        // a leading dot needs a literal dot
        assert!(!paths(glob_with(&fs, "/dev/*").unwrap()).contains(&"/dev/.hidden".into()));
        assert_eq!(paths(glob_with(&fs, "/dev/.h*").unwrap()), ["/dev/.hidden"]);
    }

    #[test]
    fn multi_component_globs() {
        let fs = fixture();
        assert_eq!(
            paths(glob_with(&fs, "/dev/dri/card*").unwrap()),
            ["/dev/dri/card0", "/dev/dri/card1"]
        );
        // `notes` is a file, so it cannot be an intermediate directory
        assert_eq!(
            paths(glob_with(&fs, "/dev/bus/usb/*/*").unwrap()),
            [
                "/dev/bus/usb/001/001",
                "/dev/bus/usb/001/004",
                "/dev/bus/usb/002/001"
            ]
        );
        assert_eq!(
            paths(glob_with(&fs, "/dev/*/usb/00[2]/*").unwrap()),
            ["/dev/bus/usb/002/001"]
        );
        let m = glob_with(&fs, "/dev/serial/by-id/*").unwrap();
        assert_eq!(m[0].node.kind, NodeKind::Symlink);
    }

    #[test]
    fn literal_paths_must_exist() {
        let fs = fixture();
        assert_eq!(paths(glob_with(&fs, "/dev/kvm").unwrap()), ["/dev/kvm"]);
        assert!(glob_with(&fs, "/dev/nope").unwrap().is_empty());
        assert!(glob_with(&fs, "/dev/nope/*").unwrap().is_empty());
        assert!(glob_with(&fs, "/dev/kvm/*").unwrap().is_empty());
        assert_eq!(
            glob_with(&fs, "/dev/kvm").unwrap()[0].node.kind,
            NodeKind::CharDevice
        );
    }

    #[test]
    fn invalid_patterns() {
        let fs = fixture();
        assert!(glob_with(&fs, "dev/tty*").is_err());
        assert!(glob_with(&fs, "/dev/../etc/*").is_err());
        assert!(glob_with(&fs, "/dev/./x").is_err());
        assert!(glob_with(&fs, "/dev/[abc").is_err());
        assert!(validate("/dev/tty[0-9]*").is_ok());
        assert!(!is_glob("/dev/kvm"));
        assert!(is_glob("/dev/tty?"));
    }
}
