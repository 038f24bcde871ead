//! End-to-end plumbing beside the tests' (`wdp_tests::host`: the process handle and the
//! observer of the kubelet stand-in): the stand-in started for a scenario, jitter between
//! actions, and the host's JSON log read back.

use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use wdp_kubelet::standin::StandIn;
use wdp_tests::host::Seen;

/// A kubelet stand-in in `plugin_dir` and what it observes.
pub fn kubelet(plugin_dir: &Path) -> Result<(StandIn, Seen)> {
    let (k, rx) = StandIn::start(plugin_dir).context("start the kubelet stand-in")?;
    Ok((k, Seen::new(rx)))
}

/// A small pseudo-random generator (xorshift), seeded from the clock: jitter between actions.
pub struct Jitter(u64);

impl Jitter {
    pub fn new() -> Self {
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        Jitter(seed | 1)
    }

    /// The wait before a change that should reach kubelet as an isolated hot-plug does: the host
    /// takes a scanner's first tree after a quiet [`NOTIFY_INTERVAL`] at once, and holds one
    /// that comes sooner until the interval's end (`wdp::coalesce`), so a change made 5-25 ms
    /// after the last one would be timed with most of that interval in it. The interval, then
    /// 5-25 ms more.
    ///
    /// [`NOTIFY_INTERVAL`]: wdp::coalesce::NOTIFY_INTERVAL
    pub fn after_quiet_interval(&mut self) -> Duration {
        wdp::coalesce::NOTIFY_INTERVAL
            + self.between(Duration::from_millis(5), Duration::from_millis(25))
    }

    /// Uniform in [lo, hi).
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        let span = hi.saturating_sub(lo).as_nanos().max(1) as u64;
        lo + Duration::from_nanos(x % span)
    }
}

/// `YYYY-MM-DD HH:MM UTC` of `t`.
pub fn utc(t: SystemTime) -> String {
    // `YYYY-MM-DDTHH:MM:SSZ`: the date, the hour and the minute.
    let rfc3339 = humantime::format_rfc3339_seconds(t).to_string();
    format!("{} {} UTC", &rfc3339[..10], &rfc3339[11..16])
}

/// One event of a JSON log: when, and its message.
pub struct LogEvent {
    pub at: SystemTime,
    pub message: String,
}

/// The events of a JSON log file.
pub fn read_json_log(text: &str) -> Vec<LogEvent> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            // RFC 3339 in UTC, as tracing-subscriber's JSON logs write it.
            let at = humantime::parse_rfc3339(v.get("timestamp")?.as_str()?).ok()?;
            let message = v
                .get("fields")?
                .get("message")
                .and_then(|m| m.as_str())
                .unwrap_or_default()
                .to_string();
            Some(LogEvent { at, message })
        })
        .collect()
}
