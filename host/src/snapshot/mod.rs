//! Debugging snapshots: what a scanner read of /sys and /dev on one machine, replayable anywhere.
//!
//! `wdp snapshot` runs a scanner with a [`crate::hostfs::record::Recorder`] attached: the
//! sandbox's WASI filesystem hooks (`sandbox::recording`), its devfs and the host's own sysfs
//! reads for the guest (NUMA affinity, through [`crate::hostfs::sys`]) note every path asked
//! about. Once the first tree is in, the recorder reads what those paths hold (metadata, symlink
//! targets, directory listings, /sys file contents; never a device's contents) and [`archive`]
//! writes it, the tree and a manifest into one tar.gz. `wdp scan --from-snapshot` reads it back:
//! /sys is written into a temporary directory used as the sys root, /dev is served from the
//! recorded metadata ([`crate::hostfs::table::DevTable`]), and the tree the scanner reports there
//! is compared with the recorded one.
//!
//! Nothing here runs unless a snapshot is taken or replayed: the recording hooks are linked only
//! into the sandbox `wdp snapshot` builds.

pub mod archive;
pub mod manifest;
pub mod record;
pub mod redact;

use std::path::PathBuf;

/// Why a snapshot could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// (The I/O error is part of the message, not a `source`: `{:#}` would print it twice.)
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    #[error("{path} is not a usable wdp snapshot: {reason}")]
    /// The archive cannot be used.
    Corrupt {
        /// The path concerned.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// Where two trees (as `wdp scan` prints them) differ, one line per difference, each naming the
/// JSON path: empty when they are equal.
pub fn tree_diff(recorded: &serde_json::Value, replayed: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    diff_at("", recorded, replayed, &mut out);
    out
}

fn diff_at(at: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let here = format!("{at}/{k}");
                match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => diff_at(&here, v, w, out),
                    (Some(v), None) => out.push(format!("{here}: only recorded: {v}")),
                    (None, Some(w)) => out.push(format!("{here}: only replayed: {w}")),
                    (None, None) => {}
                }
            }
        }
        _ if a == b => {}
        _ => out.push(format!(
            "{}: recorded {a}, replayed {b}",
            if at.is_empty() { "/" } else { at }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn diff_names_each_difference() {
        let a = json!({"kvm": {"kvm-0": {"health": "Healthy"}, "kvm-1": {}}});
        let b = json!({"kvm": {"kvm-0": {"health": "Unhealthy"}}, "tun": {}});
        assert_eq!(
            tree_diff(&a, &b),
            [
                "/kvm/kvm-0/health: recorded \"Healthy\", replayed \"Unhealthy\"",
                "/kvm/kvm-1: only recorded: {}",
                "/tun: only replayed: {}",
            ]
        );
        assert!(tree_diff(&a, &a).is_empty());
    }
}
