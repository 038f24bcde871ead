//! Counters the host keeps per scanner: what an operator (and a test) reads to see how a guest
//! behaves without parsing logs.

use std::sync::atomic::{AtomicU64, Ordering};

/// One scanner's counters; shared by its instances, its supervisor and its manager.
#[derive(Debug, Default)]
pub struct ScannerMetrics {
    /// Trees that passed validation and the policy.
    pub trees_accepted: AtomicU64,
    /// Trees refused as a whole.
    pub trees_refused: AtomicU64,
    /// Times the guest failed and was (or would have been) restarted.
    pub failures: AtomicU64,
}

impl ScannerMetrics {
    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A counter's current value.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
