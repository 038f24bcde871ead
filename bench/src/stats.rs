//! Median and p99 of a set of timings.

use std::time::Duration;

/// Order statistics of one measured quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub n: usize,
    pub min: Duration,
    pub median: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Summary {
    /// Nearest-rank percentiles of `samples` (which need not be sorted); `None` when empty.
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort();
        Some(Summary {
            n: s.len(),
            min: s[0],
            median: percentile(&s, 50.0),
            p99: percentile(&s, 99.0),
            max: s[s.len() - 1],
        })
    }
}

/// The nearest-rank `p`th percentile of sorted, non-empty `s`.
pub fn percentile(s: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// A duration in the unit that reads best: `850 ns`, `245 µs`, `12.3 ms`, `2.41 s`.
pub fn human(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        let us = ns / 1e3;
        if us < 10.0 {
            format!("{us:.2} µs")
        } else {
            format!("{us:.0} µs")
        }
    } else if ns < 1e9 {
        let ms = ns / 1e6;
        if ms < 10.0 {
            format!("{ms:.2} ms")
        } else {
            format!("{ms:.1} ms")
        }
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}
