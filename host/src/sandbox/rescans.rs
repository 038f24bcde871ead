//! Safety rescans, announced to whoever keeps the host's memory small.
//!
//! A scanner whose `wait-for-change` runs to its timeout rescans everything it serves (every
//! 30 s by default). Such a rescan runs code that serving otherwise leaves alone (the guest's
//! discovery, its reads of /sys and /dev, the host's listing and validation), and the kernel
//! maps that code back with its neighbours: an idle host with the 12 bundled scanners went from
//! 15 to 24 MiB resident at its first rescan and stayed there. Announcing each rescan lets the
//! run command hand those pages back once the round is over (`cli::run::resident`).

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

/// Rescans started since the sandbox was made, and a wake-up for the one task that follows them.
#[derive(Debug, Default)]
pub struct Rescans {
    started: AtomicU64,
    notify: Notify,
}

impl Rescans {
    /// A scanner's wait ended at its timeout: it is about to rescan. Never blocks; rescans
    /// announced while nobody waits are remembered as one.
    pub(crate) fn started(&self) {
        self.started.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_one();
    }

    /// Returns once a rescan has started since the last return (at once if one already has).
    pub async fn next(&self) {
        self.notify.notified().await;
    }

    /// How many rescans have started: for tests and logs.
    pub fn count(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescans_announced_while_nobody_waits_wake_the_next_wait_once() {
        use futures::FutureExt;
        let rescans = Rescans::default();
        assert!(
            rescans.next().now_or_never().is_none(),
            "nothing announced yet"
        );
        rescans.started();
        rescans.started();
        assert_eq!(rescans.count(), 2);
        // The two announcements are one wake-up.
        assert!(
            rescans.next().now_or_never().is_some(),
            "a rescan was announced"
        );
        assert!(
            rescans.next().now_or_never().is_none(),
            "no new rescan since"
        );
    }
}
