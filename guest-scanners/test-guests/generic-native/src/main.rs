//! `generic-native`: the `generic` scanner's discovery (its own `config.rs`, `discover.rs` and
//! `live.rs`, included from source) compiled for the build machine instead of wasm32-wasip2, with the same
//! release profile as the guests, reading a fixture's /dev with `std::fs` where the guest calls
//! the host's `devfs`. `make bench` builds it natively (`cargo build --release -p generic-native`
//! in this workspace) and times it against the wasm component over the same fixture.
//!
//! ```text
//! generic-native --dev-root DIR --sys-root DIR --devices JSON [--runs N] [--warmup N]
//! ```
//!
//! Prints `devices <count>` (of the first type), then the duration of each timed scan in
//! nanoseconds, one per line. A scan is what a fresh instance of the guest does first: parse
//! `DEVICES` (counting it here only favours wasm), scan with the state it keeps between scans
//! (`live::Live`: the globs' matches and the devices made of them) and make the tree it
//! notifies.

#[allow(dead_code)]
#[path = "../../../generic/src/config.rs"]
mod config;
#[allow(dead_code)]
#[path = "../../../generic/src/discover.rs"]
mod discover;
#[allow(dead_code)]
#[path = "../../../generic/src/live.rs"]
mod live;

use std::path::PathBuf;
use std::time::Instant;

use wdp_guest::devfs::{Node, NodeKind};
use wdp_guest::hostfs::{HostFs, ReadError};
use wdp_guest::pathglob::DirSource;

/// /dev and /sys of a fixture through std::fs, guest paths mapped onto the roots.
struct StdFs {
    dev_root: PathBuf,
    sys_root: PathBuf,
}

impl StdFs {
    fn host_path(&self, guest: &str) -> PathBuf {
        let (root, rest) = match guest.strip_prefix("/dev") {
            Some(rest) => (&self.dev_root, rest),
            None => (&self.sys_root, guest.strip_prefix("/sys").unwrap_or(guest)),
        };
        root.join(rest.trim_start_matches('/'))
    }
}

/// An entry's node, as the host's devfs describes it. Off unix (the wasm32 build of this
/// workspace compiles every member) there are no device numbers or modes.
#[cfg(unix)]
fn node_of(name: String, meta: &std::fs::Metadata) -> Node {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let t = meta.file_type();
    let kind = if t.is_char_device() {
        NodeKind::CharDevice
    } else if t.is_block_device() {
        NodeKind::BlockDevice
    } else if t.is_dir() {
        NodeKind::Directory
    } else if t.is_symlink() {
        NodeKind::Symlink
    } else if t.is_file() {
        NodeKind::File
    } else {
        NodeKind::Other
    };
    let rdev = meta.rdev();
    let (major, minor) = if matches!(kind, NodeKind::CharDevice | NodeKind::BlockDevice) {
        // glibc's gnu_dev_major / gnu_dev_minor
        (
            (((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0x0000_0fff)) as u32,
            (((rdev >> 12) & 0xffff_ff00) | (rdev & 0x0000_00ff)) as u32,
        )
    } else {
        (0, 0)
    };
    Node {
        name,
        kind,
        major,
        minor,
        mode: meta.mode() & 0o7777,
    }
}

#[cfg(not(unix))]
fn node_of(name: String, meta: &std::fs::Metadata) -> Node {
    let t = meta.file_type();
    let kind = if t.is_dir() {
        NodeKind::Directory
    } else if t.is_symlink() {
        NodeKind::Symlink
    } else if t.is_file() {
        NodeKind::File
    } else {
        NodeKind::Other
    };
    Node {
        name,
        kind,
        major: 0,
        minor: 0,
        mode: 0,
    }
}

impl DirSource for StdFs {
    /// Lists and stats every entry, sorted by name: what the host's devfs `read-dir` returns.
    fn list(&self, dir: &str) -> Result<Vec<Node>, String> {
        let entries = std::fs::read_dir(self.host_path(dir)).map_err(|e| format!("{dir}: {e}"))?;
        let mut nodes = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| format!("{dir}: {e}"))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let Ok(meta) = entry.metadata() else { continue };
            nodes.push(node_of(name, &meta));
        }
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(nodes)
    }

    fn stat(&self, path: &str) -> Result<Node, String> {
        let meta = std::fs::symlink_metadata(self.host_path(path)).map_err(|e| e.to_string())?;
        let name = path.rsplit('/').next().unwrap_or_default().to_string();
        Ok(node_of(name, &meta))
    }
}

impl HostFs for StdFs {
    fn read_link(&self, path: &str) -> Result<String, String> {
        let target =
            std::fs::read_link(self.host_path(path)).map_err(|e| format!("{path}: {e}"))?;
        Ok(target.to_string_lossy().into_owned())
    }

    /// Reads as the guest reads /sys; /dev has no contents for a guest, so none here either.
    fn read(&self, path: &str) -> Result<String, ReadError> {
        if path == "/dev" || path.starts_with("/dev/") {
            return Err(ReadError::Unreadable(format!(
                "{path}: devfs gives no contents"
            )));
        }
        std::fs::read_to_string(self.host_path(path)).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ReadError::Missing,
            _ => ReadError::Unreadable(e.to_string()),
        })
    }
}

fn main() -> Result<(), String> {
    let mut dev_root = None;
    let mut sys_root = None;
    let mut devices = None;
    let (mut runs, mut warmup) = (200usize, 10usize);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().ok_or(format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--dev-root" => dev_root = Some(PathBuf::from(value)),
            "--sys-root" => sys_root = Some(PathBuf::from(value)),
            "--devices" => devices = Some(value),
            "--runs" => runs = value.parse().map_err(|e| format!("--runs: {e}"))?,
            "--warmup" => warmup = value.parse().map_err(|e| format!("--warmup: {e}"))?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let machine = StdFs {
        dev_root: dev_root.ok_or("--dev-root is required")?,
        sys_root: sys_root.ok_or("--sys-root is required")?,
    };
    let devices = devices.ok_or("--devices is required")?;
    // What a fresh instance does first: its state built, and the tree it tells (by reference,
    // as the guest's loop tells it).
    let scan = || -> Result<live::Live<StdFs>, String> {
        use wdp_guest::scan::Incremental;
        let types = config::parse_devices(Some(&devices))?;
        let fs = StdFs {
            dev_root: machine.dev_root.clone(),
            sys_root: machine.sys_root.clone(),
        };
        let mut live = live::Live::new(types, fs);
        live.scan()?;
        Ok(live)
    };
    let count = |live: &live::Live<StdFs>| {
        use wdp_guest::scan::Incremental;
        live.tree().first().map_or(0, |g| g.devices.len())
    };
    let first = scan()?;
    println!("devices {}", count(&first));
    let mut took = Vec::with_capacity(runs);
    for i in 0..warmup + runs {
        let t0 = Instant::now();
        let live = std::hint::black_box(scan()?);
        let elapsed = t0.elapsed();
        drop(live);
        if i >= warmup {
            took.push(elapsed.as_nanos());
        }
    }
    for ns in took {
        println!("{ns}");
    }
    Ok(())
}
