//! The scan loop: scan, notify when the tree changed, wait for a change, forever.
//!
//! Why: the host calls `scanner.scan` once and expects it to loop (Intel's `Scanner.Scan`); every
//! scanner would otherwise re-implement the same loop, and getting it subtly wrong (notifying an
//! unchanged tree every few seconds, busy-looping, swallowing errors) costs the host work or hides
//! failures. An error from one scan is returned as is: the host restarts the guest with backoff.

use crate::config;
use crate::types::{DeviceAttributes, DeviceTree};

/// The environment variable that sets the longest wait between two scans, in milliseconds.
pub const RESCAN_INTERVAL_ENV: &str = "RESCAN_INTERVAL_MS";
/// The wait between scans when [`RESCAN_INTERVAL_ENV`] is unset: 30 s.
pub const DEFAULT_RESCAN_INTERVAL_MS: u32 = 30_000;

/// Reads [`RESCAN_INTERVAL_ENV`] (1 ..= u32::MAX ms, default 30000).
pub fn rescan_interval_ms() -> Result<u32, String> {
    config::env_u32(
        RESCAN_INTERVAL_ENV,
        DEFAULT_RESCAN_INTERVAL_MS,
        1..=u32::MAX,
    )
}

/// Hands a whole tree to the host (it replaces the previous one). [`run`] calls this for you.
pub fn notify(tree: &DeviceTree) {
    crate::bindings::scanner::wdp::device_plugin::notifier::notify(tree)
}

/// Hands a whole tree to the host with typed attributes and capacities for some of its devices
/// (contract 0.1.1), for front-ends that publish them (Dynamic Resource Allocation); the host
/// validates them with the tree. [`run_attributed`] calls this for you.
pub fn notify_with_attributes(tree: &DeviceTree, attributes: &[DeviceAttributes]) {
    crate::bindings::scanner::wdp::device_plugin::notifier::notify_with_attributes(tree, attributes)
}

/// [`run`] for a scanner that describes its devices with typed attributes: `scan` returns the
/// tree and the attributes (see [`crate::tree::attributes`]); both are notified again only when
/// either changed.
pub fn run_attributed(
    mut scan: impl FnMut() -> Result<(DeviceTree, Vec<DeviceAttributes>), String>,
) -> Result<(), String> {
    let interval = rescan_interval_ms()?;
    let mut last: Option<(DeviceTree, Vec<DeviceAttributes>)> = None;
    loop {
        let scanned = scan()?;
        if last.as_ref() != Some(&scanned) {
            notify_with_attributes(&scanned.0, &scanned.1);
            last = Some(scanned);
        }
        crate::devfs::wait_for_change(interval);
    }
}

/// Remembers the last tree notified and says whether a new one differs from it.
#[derive(Debug, Default, Clone)]
pub struct ChangeFilter {
    last: Option<DeviceTree>,
}

impl ChangeFilter {
    /// No tree notified yet, so the first one counts as a change.
    pub fn new() -> Self {
        Self::default()
    }

    /// The tree to notify: `tree` itself (now remembered) when nothing was notified yet or it
    /// differs from the last tree notified; None when it is the same. Takes the tree rather than
    /// a reference so that remembering it moves it, where a copy would duplicate every string
    /// of a large tree after each changed scan.
    pub fn offer(&mut self, tree: DeviceTree) -> Option<&DeviceTree> {
        if self.last.as_ref() == Some(&tree) {
            return None;
        }
        Some(self.last.insert(tree))
    }
}

/// The loop behind [`run`], with its effects passed in so it can be tested: `scan` describes the
/// devices, `notify` receives changed trees, `wait` blocks between scans and returns false to
/// stop the loop (then `run_with` returns Ok). An Err from `scan` is returned immediately.
pub fn run_with(
    mut scan: impl FnMut() -> Result<DeviceTree, String>,
    mut notify: impl FnMut(&DeviceTree),
    mut wait: impl FnMut() -> bool,
) -> Result<(), String> {
    let mut filter = ChangeFilter::new();
    loop {
        if let Some(tree) = filter.offer(scan()?) {
            notify(tree);
        }
        if !wait() {
            return Ok(());
        }
    }
}

/// Runs a scanner forever: calls `scan`, notifies the host when the tree differs from the last
/// one notified (always the first time), then waits with `devfs::wait-for-change` for at most
/// `RESCAN_INTERVAL_MS` (default 30000) before scanning again. Returns only an error: from
/// `scan`, or for a bad `RESCAN_INTERVAL_MS`.
///
/// ```ignore
/// impl wdp_guest::Scanner for MyScanner {
///     fn scan() -> Result<(), String> {
///         wdp_guest::run(scan_once)
///     }
/// }
/// ```
pub fn run(scan: impl FnMut() -> Result<DeviceTree, String>) -> Result<(), String> {
    let interval = rescan_interval_ms()?;
    run_with(scan, notify, || {
        crate::devfs::wait_for_change(interval);
        true
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DeviceInfo, TreeBuilder};

    fn tree(ids: &[&str]) -> DeviceTree {
        let mut t = TreeBuilder::new();
        for id in ids {
            t.add("t", *id, DeviceInfo::new());
        }
        t.build()
    }

    #[test]
    fn filter_notifies_first_and_changes_only() {
        let mut f = ChangeFilter::new();
        assert_eq!(
            f.offer(vec![]),
            Some(&vec![]),
            "the first tree, even empty, is notified"
        );
        assert_eq!(f.offer(vec![]), None);
        assert_eq!(f.offer(tree(&["a"])), Some(&tree(&["a"])));
        assert_eq!(f.offer(tree(&["a"])), None);
        assert_eq!(f.offer(tree(&["a", "b"])), Some(&tree(&["a", "b"])));
        assert_eq!(f.offer(tree(&["a"])), Some(&tree(&["a"])));
    }

    #[test]
    fn loop_notifies_changes_and_stops_on_error() {
        let scans = [
            Ok(tree(&["a"])),
            Ok(tree(&["a"])),
            Ok(tree(&["a", "b"])),
            Err("boom".to_string()),
            Ok(tree(&["never"])),
        ];
        let mut i = 0;
        let mut notified = Vec::new();
        let mut waits = 0;
        let r = run_with(
            || {
                i += 1;
                scans[i - 1].clone()
            },
            |t| notified.push(t.clone()),
            || {
                waits += 1;
                true
            },
        );
        assert_eq!(r, Err("boom".to_string()));
        assert_eq!(notified, [tree(&["a"]), tree(&["a", "b"])]);
        assert_eq!(waits, 3);
    }

    #[test]
    fn loop_stops_when_wait_says_so() {
        let mut n = 0;
        let r = run_with(|| Ok(tree(&["a"])), |_| n += 1, || false);
        assert_eq!(r, Ok(()));
        assert_eq!(n, 1);
    }
}
