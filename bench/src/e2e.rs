//! End-to-end plumbing: `wdp run` as a child process, and what the kubelet stand-in observes,
//! timestamped as it arrives.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use wdp_kubelet::api;
use wdp_kubelet::standin::{CurrentStreams, Observed, StandIn};

use wdp_bench::fixtures::Fixture;

/// A running `wdp run`.
pub struct WdpRun {
    child: Child,
    pub pid: u32,
    pub log: PathBuf,
    /// Wall-clock time just before the spawn (log timestamps are wall-clock).
    pub spawned_wall: SystemTime,
    pub spawned: Instant,
}

/// How a host is started.
pub struct RunOptions<'a> {
    pub wdp: &'a Path,
    pub config: &'a Path,
    pub plugin_dir: &'a Path,
    pub compile_cache: &'a Path,
    /// JSON logs (parsed for the start-up breakdown) instead of text.
    pub json_logs: bool,
    /// `RUST_LOG` (the shipped default is `info`).
    pub log_filter: &'a str,
}

impl WdpRun {
    /// Starts `wdp run` over the fixture's roots, logging into a file in the fixture.
    pub fn start(f: &Fixture, o: &RunOptions<'_>) -> Result<WdpRun> {
        let log = f.path().join(format!(
            "wdp-run-{}.log",
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        let log_file = std::fs::File::create(&log).context("create the host's log file")?;
        let mut cmd = Command::new(o.wdp);
        cmd.arg("run")
            .arg("--config")
            .arg(o.config)
            .arg("--plugin-dir")
            .arg(o.plugin_dir)
            .arg("--sys-root")
            .arg(f.sys())
            .arg("--dev-root")
            .arg(f.dev())
            .arg("--compile-cache")
            .arg(o.compile_cache);
        if o.json_logs {
            cmd.args(["--log-format", "json"]);
        }
        // The shipped defaults: no backtrace capture on errors (the caller's environment may ask
        // for it, which would make every error path slower).
        cmd.env("RUST_LOG", o.log_filter)
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true);
        let spawned_wall = SystemTime::now();
        let spawned = Instant::now();
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", o.wdp.display()))?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("wdp run exited at once"))?;
        Ok(WdpRun {
            child,
            pid,
            log,
            spawned_wall,
            spawned,
        })
    }

    /// The host's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits for the exit.
    pub async fn stop(mut self) -> Result<ExitStatus> {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .context("run kill")?;
        if !status.success() {
            bail!("kill -TERM {} failed", self.pid);
        }
        let exit = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .context("wdp run did not stop within 20 s of SIGTERM")??;
        Ok(exit)
    }
}

/// What the stand-in reported so far, per resource.
pub struct Observer {
    rx: mpsc::UnboundedReceiver<Observed>,
    /// The latest ListAndWatch list of each resource whose stream is open.
    pub lists: HashMap<String, Vec<api::Device>>,
    pub registered: HashSet<String>,
    pub ended: HashSet<String>,
    streams: CurrentStreams,
}

impl Observer {
    pub fn new(rx: mpsc::UnboundedReceiver<Observed>) -> Self {
        Observer {
            rx,
            lists: HashMap::new(),
            registered: HashSet::new(),
            ended: HashSet::new(),
            streams: CurrentStreams::default(),
        }
    }

    /// Follows a new stand-in, forgetting everything seen before.
    pub fn replace(&mut self, rx: mpsc::UnboundedReceiver<Observed>) {
        *self = Observer::new(rx);
    }

    /// Forgets the state (events already queued are still applied later).
    pub fn forget(&mut self) {
        self.lists.clear();
        self.registered.clear();
        self.ended.clear();
    }

    fn apply(&mut self, ev: Observed) {
        if !self.streams.admit(&ev) {
            return;
        }
        match ev {
            Observed::Registered { resource, .. } => {
                self.ended.remove(&resource);
                self.registered.insert(resource);
            }
            Observed::Devices {
                resource, devices, ..
            } => {
                self.ended.remove(&resource);
                self.lists.insert(resource, devices);
            }
            Observed::StreamEnded { resource, .. } => {
                self.lists.remove(&resource);
                self.ended.insert(resource);
            }
        }
    }

    /// Applies events until `done` holds; returns when the event that made it hold arrived
    /// (taken before the event is looked at, so the bench's own bookkeeping is not counted).
    pub async fn until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> Result<Instant> {
        if done(self) {
            return Ok(Instant::now());
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ev = match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(ev)) => ev,
                Ok(None) => bail!("the kubelet stand-in closed while waiting for {what}"),
                Err(_) => bail!(
                    "timed out after {timeout:?} waiting for {what}; lists: {:?}",
                    self.lists
                        .iter()
                        .map(|(r, d)| (r.clone(), d.len()))
                        .collect::<Vec<_>>()
                ),
            };
            let at = Instant::now();
            self.apply(ev);
            if done(self) {
                return Ok(at);
            }
        }
    }

    /// True when `resource`'s latest list has a device `id`.
    pub fn has(&self, resource: &str, id: &str) -> bool {
        self.lists
            .get(resource)
            .is_some_and(|d| d.iter().any(|x| x.id == id))
    }

    /// Number of devices in `resource`'s latest list (None: no open stream).
    pub fn count(&self, resource: &str) -> Option<usize> {
        self.lists.get(resource).map(Vec::len)
    }

    /// True when every resource has a list (possibly empty).
    pub fn all_listed(&self, resources: &[String]) -> bool {
        resources.iter().all(|r| self.lists.contains_key(r))
    }

    pub fn all_registered(&self, resources: &[String]) -> bool {
        resources.iter().all(|r| self.registered.contains(r))
    }
}

/// A kubelet stand-in in `plugin_dir` and its observer.
pub fn kubelet(plugin_dir: &Path) -> Result<(StandIn, Observer)> {
    let (k, rx) = StandIn::start(plugin_dir).context("start the kubelet stand-in")?;
    Ok((k, Observer::new(rx)))
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

/// Parses the RFC 3339 UTC timestamps of tracing-subscriber's JSON logs
/// (`2026-11-30T13:20:01.123456Z`).
pub fn parse_timestamp(s: &str) -> Option<SystemTime> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<u64>());
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let nanos: u64 = format!("{frac:0<9}")[..9].parse().ok()?;
    let days = days_from_civil(y, m, day);
    let secs = days as u64 * 86_400 + hh * 3600 + mm * 60 + ss;
    Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos as u32))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD HH:MM UTC` of `t`.
pub fn utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // civil_from_days
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
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
            let at = parse_timestamp(v.get("timestamp")?.as_str()?)?;
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
