//! A device-plugin process under test (`wdp run`, or another plugin binary), and waiting for what
//! the kubelet stand-in observes: one process handle and one observer for the tests and the
//! benchmarks alike.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use wdp_kubelet::api;
use wdp_kubelet::standin::{CurrentStreams, Observed, StandIn};

use crate::fixture::Fixture;

/// How long a stopped host may take to exit after SIGTERM before that is an error.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a host could not be started, signalled or stopped.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The log file could not be created.
    #[error("create the log file {}: {source}", path.display())]
    Log {
        /// The log file.
        path: PathBuf,
        /// Why it could not be created.
        source: std::io::Error,
    },
    /// The program could not be spawned.
    #[error("spawn {}: {source}", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why it could not be spawned.
        source: std::io::Error,
    },
    /// The process was gone before its pid could be read.
    #[error("{} exited at once", program.display())]
    ExitedAtOnce {
        /// The program.
        program: PathBuf,
    },
    /// `kill` could not be run or refused the signal.
    #[error("kill -{signal} {pid} failed")]
    Signal {
        /// The signal's `kill` name.
        signal: String,
        /// The process.
        pid: u32,
    },
    /// The process outlived [`STOP_TIMEOUT`] after SIGTERM.
    #[error("pid {pid} did not stop within {STOP_TIMEOUT:?} of SIGTERM")]
    StopTimeout {
        /// The process.
        pid: u32,
    },
    /// Waiting for the exit failed.
    #[error("wait for pid {pid}: {source}")]
    Wait {
        /// The process.
        pid: u32,
        /// Why waiting failed.
        source: std::io::Error,
    },
}

/// What differs between the `wdp run`s of tests and of benchmarks: the binary (the tests' debug
/// build or the benchmarks' optimised one), the compile cache, the log filter and more arguments.
pub struct Launch<'a> {
    /// The `wdp` binary.
    pub wdp: PathBuf,
    /// `--compile-cache`.
    pub compile_cache: PathBuf,
    /// `RUST_LOG` (the shipped default is `info`).
    pub log_filter: &'a str,
    /// More `wdp run` arguments (e.g. `--metrics-addr`, `--log-format json`).
    pub args: &'a [&'a str],
}

impl Launch<'_> {
    /// What tests run: this workspace's `wdp` ([`crate::wdp_bin`]), the fixture's own compile
    /// cache (`<fixture>/compiled`), `info` logs.
    pub fn test(f: &Fixture) -> Launch<'static> {
        Launch {
            wdp: crate::wdp_bin(),
            compile_cache: f.path().join("compiled"),
            log_filter: "info",
            args: &[],
        }
    }
}

/// A running device-plugin process, its stderr in a log file: killed on drop, its log printed if
/// the thread is panicking (a failed test's assertion says what went wrong, the log says why).
pub struct Host {
    child: Child,
    pid: u32,
    log: PathBuf,
    spawned: Instant,
    spawned_wall: SystemTime,
}

impl Host {
    /// Starts `wdp run --config <config>` over the fixture, serving in `plugin_dir`.
    pub fn start(config: &Path, plugin_dir: &Path, f: &Fixture) -> Host {
        Self::start_with(config, plugin_dir, f, &[])
    }

    /// [`Host::start`] with more `wdp run` arguments (e.g. `--metrics-addr`).
    pub fn start_with(config: &Path, plugin_dir: &Path, f: &Fixture, more: &[&str]) -> Host {
        let launch = Launch {
            args: more,
            ..Launch::test(f)
        };
        Self::launch(config, plugin_dir, f, &launch).expect("start wdp run")
    }

    /// [`Host::start`] with `/metrics`, `/readyz` and `/status` on a free port, and the address
    /// they are served on (from its log).
    pub async fn start_with_metrics(
        config: &Path,
        plugin_dir: &Path,
        f: &Fixture,
    ) -> (Host, String) {
        let host = Self::start_with(config, plugin_dir, f, &["--metrics-addr", "127.0.0.1:0"]);
        let addr = host.metrics_addr().await;
        (host, addr)
    }

    /// Starts `wdp run --config <config>` over the fixture's roots as `launch` says, serving in
    /// `plugin_dir` and logging into a new file in the fixture.
    pub fn launch(
        config: &Path,
        plugin_dir: &Path,
        f: &Fixture,
        launch: &Launch<'_>,
    ) -> Result<Host, HostError> {
        let mut cmd = Self::command(config, plugin_dir, f, launch);
        let log = f.path().join(format!(
            "wdp-run-{}.log",
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        Self::spawn(&mut cmd, &log)
    }

    /// The `wdp run` command [`Host::launch`] spawns, for a test that spawns it another way (its
    /// stderr a pipe, say).
    pub fn command(config: &Path, plugin_dir: &Path, f: &Fixture, launch: &Launch<'_>) -> Command {
        let mut cmd = Command::new(&launch.wdp);
        cmd.arg("run")
            .arg("--config")
            .arg(config)
            .arg("--plugin-dir")
            .arg(plugin_dir)
            .arg("--sys-root")
            .arg(f.sys())
            .arg("--dev-root")
            .arg(f.dev())
            .arg("--compile-cache")
            .arg(&launch.compile_cache)
            .args(launch.args)
            .env("RUST_LOG", launch.log_filter);
        // Not the default /usr/lib/wdp/compiled: a machine with wdp installed would lend its
        // compiled components to every run. Absent, so none unless the launch names one.
        if !launch.args.contains(&"--precompiled") {
            cmd.arg("--precompiled").arg(f.path().join("precompiled"));
        }
        cmd
    }

    /// Spawns `cmd` with its stderr into `log` (created), stdin and stdout closed, and the
    /// shipped defaults: no backtrace capture on errors (the caller's environment may ask for it,
    /// which would make every error path slower and every log longer).
    pub fn spawn(cmd: &mut Command, log: &Path) -> Result<Host, HostError> {
        let log_file = std::fs::File::create(log).map_err(|source| HostError::Log {
            path: log.to_path_buf(),
            source,
        })?;
        let program = PathBuf::from(cmd.as_std().get_program());
        cmd.env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true);
        let spawned_wall = SystemTime::now();
        let spawned = Instant::now();
        let child = cmd.spawn().map_err(|source| HostError::Spawn {
            program: program.clone(),
            source,
        })?;
        let pid = child.id().ok_or(HostError::ExitedAtOnce { program })?;
        Ok(Host {
            child,
            pid,
            log: log.to_path_buf(),
            spawned,
            spawned_wall,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// When the process was spawned (monotonic: for timing).
    pub fn spawned(&self) -> Instant {
        self.spawned
    }

    /// When the process was spawned, by the wall clock (what log timestamps are in).
    pub fn spawned_wall(&self) -> SystemTime {
        self.spawned_wall
    }

    /// The host's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of the log: what goes with an error that a timeout alone would not
    /// explain.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Waits until the log has `needle` at least `times` times, failing the test after 60 s;
    /// returns the log.
    pub async fn logged(&self, needle: &str, times: usize) -> String {
        let what = format!("{times} log lines with {needle:?}");
        crate::eventually_within(Duration::from_secs(60), &what, || async {
            let log = self.log();
            (log.matches(needle).count() >= times).then_some(log)
        })
        .await
    }

    /// Sends `signal` (a `kill` name such as "HUP"), failing the test if it cannot.
    pub fn signal(&self, signal: &str) {
        self.try_signal(signal).unwrap_or_else(|e| panic!("{e}"));
    }

    fn try_signal(&self, signal: &str) -> Result<(), HostError> {
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if !sent {
            return Err(HostError::Signal {
                signal: signal.to_string(),
                pid: self.pid,
            });
        }
        Ok(())
    }

    /// Sends SIGTERM and waits for the exit.
    pub async fn stop(mut self) -> Result<ExitStatus, HostError> {
        self.try_signal("TERM")?;
        let pid = self.pid;
        tokio::time::timeout(STOP_TIMEOUT, self.child.wait())
            .await
            .map_err(|_| HostError::StopTimeout { pid })?
            .map_err(|source| HostError::Wait { pid, source })
    }

    /// [`Host::stop`], failing the test when the host does not stop.
    pub async fn terminate(self) -> ExitStatus {
        self.stop().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Sends SIGKILL and waits for the exit, failing the test if it cannot: a crash, which
    /// leaves behind whatever the process had on disk (sockets, files half-done) as it was.
    pub async fn kill(mut self) -> ExitStatus {
        self.signal("KILL");
        let pid = self.pid;
        tokio::time::timeout(STOP_TIMEOUT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("pid {pid} outlived SIGKILL by {STOP_TIMEOUT:?}"))
            .unwrap_or_else(|e| panic!("wait for pid {pid}: {e}"))
    }

    /// The address `--metrics-addr 127.0.0.1:0` ended up serving on, from the log.
    pub async fn metrics_addr(&self) -> String {
        crate::eventually("the metrics address in the host's log", || async {
            let log = self.log();
            let line = log.lines().find(|l| l.contains("serving /metrics"))?;
            let port: String = line
                .split("127.0.0.1:")
                .nth(1)?
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            Some(format!("127.0.0.1:{port}"))
        })
        .await
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- {} ----\n{}", self.log.display(), self.log());
        }
    }
}

/// Why waiting on the stand-in's observations ended without the awaited state.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The stand-in stopped reporting.
    #[error("the kubelet stand-in closed while waiting for {what}")]
    Closed {
        /// What was awaited.
        what: String,
    },
    /// The state did not come in time.
    #[error("timed out after {timeout:?} waiting for {what}; latest device lists: {lists:?}")]
    TimedOut {
        /// What was awaited.
        what: String,
        /// How long it was awaited.
        timeout: Duration,
        /// The device ids of each open stream's latest list, by resource: what was there
        /// instead.
        lists: Vec<(String, Vec<String>)>,
    },
}

/// How long [`Seen::until`] waits before failing the test.
const SEEN_TIMEOUT: Duration = Duration::from_secs(20);

/// What the stand-in has reported so far, per resource: the latest list of each open
/// ListAndWatch stream, registrations and stream ends. Only the events of a resource's current
/// stream make the state (a replaced stream's late list or end would otherwise overwrite its
/// successor's, see [`CurrentStreams`]); every stream's end is counted.
pub struct Seen {
    rx: mpsc::UnboundedReceiver<Observed>,
    /// The latest list of each resource whose stream is open.
    lists: HashMap<String, Arc<Vec<api::Device>>>,
    /// The latest list of each resource, kept when its stream ends: what kubelet was last told
    /// of each device's health and topology.
    last: HashMap<String, Arc<Vec<api::Device>>>,
    /// Resources whose stream ended and has not listed devices since.
    ended: HashSet<String>,
    registrations: HashMap<String, usize>,
    stream_ends: HashMap<String, usize>,
    streams: CurrentStreams,
}

impl Seen {
    /// Follows the observations of one stand-in.
    pub fn new(rx: mpsc::UnboundedReceiver<Observed>) -> Self {
        Seen {
            rx,
            lists: HashMap::new(),
            last: HashMap::new(),
            ended: HashSet::new(),
            registrations: HashMap::new(),
            stream_ends: HashMap::new(),
            streams: CurrentStreams::default(),
        }
    }

    /// Follows a new stand-in, forgetting everything seen before.
    pub fn replace(&mut self, rx: mpsc::UnboundedReceiver<Observed>) {
        *self = Seen::new(rx);
    }

    /// Forgets the state, so that a wait sees only what comes next (events already queued are
    /// still applied later; which stream is current is kept).
    pub fn forget(&mut self) {
        self.lists.clear();
        self.last.clear();
        self.ended.clear();
        self.registrations.clear();
        self.stream_ends.clear();
    }

    fn record(&mut self, ev: Observed) {
        if let Observed::StreamEnded { resource, .. } = &ev {
            *self.stream_ends.entry(resource.clone()).or_default() += 1;
        }
        if !self.streams.admit(&ev) {
            return;
        }
        match ev {
            Observed::Devices {
                resource, devices, ..
            } => {
                self.ended.remove(&resource);
                self.last.insert(resource.clone(), devices.clone());
                self.lists.insert(resource, devices);
            }
            Observed::StreamEnded { resource, .. } => {
                self.lists.remove(&resource);
                self.ended.insert(resource);
            }
            Observed::Registered { resource, .. } => {
                *self.registrations.entry(resource).or_default() += 1;
            }
        }
    }

    /// Applies events until `done` holds, at most `timeout`; returns when the event that made it
    /// hold arrived (taken before the event is looked at, so a benchmark's own bookkeeping is not
    /// counted), or now when it held already.
    pub async fn wait(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> Result<Instant, WaitError> {
        if done(self) {
            return Ok(Instant::now());
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ev = match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(ev)) => ev,
                Ok(None) => return Err(WaitError::Closed { what: what.into() }),
                Err(_) => {
                    let mut lists: Vec<(String, Vec<String>)> = self
                        .lists
                        .keys()
                        .map(|r| (r.clone(), self.ids(r).unwrap_or_default()))
                        .collect();
                    lists.sort();
                    return Err(WaitError::TimedOut {
                        what: what.into(),
                        timeout,
                        lists,
                    });
                }
            };
            let at = Instant::now();
            self.record(ev);
            if done(self) {
                return Ok(at);
            }
        }
    }

    /// Waits until `done` holds for the state, failing the test after 20 s.
    pub async fn until(&mut self, what: &str, done: impl FnMut(&Self) -> bool) {
        if let Err(e) = self.wait(what, SEEN_TIMEOUT, done).await {
            panic!("{e}");
        }
    }

    /// The sorted device ids of `resource`'s latest list (None: no open stream).
    pub fn ids(&self, resource: &str) -> Option<Vec<String>> {
        let mut ids: Vec<String> = self
            .lists
            .get(resource)?
            .iter()
            .map(|d| d.id.clone())
            .collect();
        ids.sort();
        Some(ids)
    }

    /// Waits until `resource`'s latest list has exactly `ids` (any order).
    pub async fn devices(&mut self, resource: &str, ids: &[&str]) {
        let mut want: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        want.sort();
        let what = format!("{resource} with devices {ids:?}");
        self.until(&what, |s| s.ids(resource).as_ref() == Some(&want))
            .await;
    }

    /// The device `id` of `resource` as kubelet was last told of it.
    fn last_device(&self, resource: &str, id: &str) -> Option<&api::Device> {
        self.last.get(resource)?.iter().find(|d| d.id == id)
    }

    /// Waits until kubelet's latest list for `resource` has device `id` with `health`
    /// ("Healthy" or "Unhealthy").
    pub async fn health(&mut self, resource: &str, id: &str, health: &str) {
        let what = format!("{resource} device {id} {health}");
        self.until(&what, |s| {
            s.last_device(resource, id)
                .is_some_and(|d| d.health == health)
        })
        .await;
    }

    /// The NUMA nodes kubelet was last told for device `id` of `resource` (empty: no topology).
    pub fn numa(&self, resource: &str, id: &str) -> Option<Vec<i64>> {
        self.topology(resource, id).map(Option::unwrap_or_default)
    }

    /// The `topology` kubelet was last told for device `id` of `resource`: `Some(None)` when the
    /// device was listed without one.
    pub fn topology(&self, resource: &str, id: &str) -> Option<Option<Vec<i64>>> {
        let device = self.last_device(resource, id)?;
        Some(
            device
                .topology
                .as_ref()
                .map(|t| t.nodes.iter().map(|n| n.id).collect()),
        )
    }

    /// How many times `resource` registered so far (as far as events were consumed).
    pub fn registrations(&self, resource: &str) -> usize {
        self.registrations.get(resource).copied().unwrap_or(0)
    }

    /// Whether every one of `resources` registered (since the last [`Seen::forget`]).
    pub fn all_registered(&self, resources: &[String]) -> bool {
        resources.iter().all(|r| self.registrations(r) > 0)
    }

    /// Whether `resource`'s current stream has listed a device.
    pub fn listed(&self, resource: &str) -> bool {
        self.lists.get(resource).is_some_and(|ids| !ids.is_empty())
    }

    /// Whether `resource`'s latest list has a device `id`.
    pub fn has(&self, resource: &str, id: &str) -> bool {
        self.lists
            .get(resource)
            .is_some_and(|d| d.iter().any(|x| x.id == id))
    }

    /// The number of devices in `resource`'s latest list (None: no open stream).
    pub fn count(&self, resource: &str) -> Option<usize> {
        self.lists.get(resource).map(|devices| devices.len())
    }

    /// Whether every one of `resources` has an open stream that listed (possibly no devices).
    pub fn all_streaming(&self, resources: &[String]) -> bool {
        resources.iter().all(|r| self.lists.contains_key(r))
    }

    /// How many of `resource`'s ListAndWatch streams ended so far.
    pub fn stream_ends(&self, resource: &str) -> usize {
        self.stream_ends.get(resource).copied().unwrap_or(0)
    }

    /// Whether `resource`'s stream ended and has listed nothing since.
    pub fn has_ended(&self, resource: &str) -> bool {
        self.ended.contains(resource)
    }

    /// Whether any resource's stream ended and has listed nothing since.
    pub fn any_ended(&self) -> bool {
        !self.ended.is_empty()
    }

    /// Waits until `resource`'s stream has ended.
    pub async fn ended(&mut self, resource: &str) {
        let what = format!("the end of {resource}'s stream");
        self.until(&what, |s| s.has_ended(resource)).await;
    }

    /// Waits until every resource in `resources` has a non-empty list.
    pub async fn all_listed(&mut self, resources: &[&str]) {
        self.until("every resource listed", |s| {
            resources.iter().all(|r| s.listed(r))
        })
        .await;
    }
}

/// Socket files left in `dir`, sorted.
pub fn sockets(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::FileTypeExt;
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A kubelet stand-in in `plugin_dir`, and `wdp run --config <config>` serving into it.
pub fn serve(f: &Fixture, config: &Path, plugin_dir: &Path) -> (StandIn, Seen, Host) {
    let (kubelet, observed) = StandIn::start(plugin_dir).expect("start the kubelet stand-in");
    let host = Host::start(config, plugin_dir, f);
    (kubelet, Seen::new(observed), host)
}
