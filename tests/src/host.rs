//! `wdp run` as a child process, and waiting for what the kubelet stand-in observes.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use wdp_kubelet::standin::{CurrentStreams, Observed, StandIn};

use crate::fixture::Fixture;

/// A running `wdp run`; killed on drop, its log printed if the test is failing.
pub struct Host {
    child: Option<Child>,
    log: PathBuf,
}

impl Host {
    /// Starts `wdp run --config <config>` over the fixture, serving in `plugin_dir`.
    pub fn start(config: &Path, plugin_dir: &Path, f: &Fixture) -> Host {
        Self::start_with(config, plugin_dir, f, &[])
    }

    /// [`Host::start`] with more `wdp run` arguments (e.g. `--metrics-addr`).
    pub fn start_with(config: &Path, plugin_dir: &Path, f: &Fixture, more: &[&str]) -> Host {
        let log = f.path().join(format!(
            "wdp-run-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        let log_file = std::fs::File::create(&log).expect("create log");
        let child = Command::new(crate::wdp_bin())
            .arg("run")
            .arg("--config")
            .arg(config)
            .arg("--plugin-dir")
            .arg(plugin_dir)
            .arg("--sys-root")
            .arg(f.sys())
            .arg("--dev-root")
            .arg(f.dev())
            .arg("--compile-cache")
            .arg(f.path().join("compiled"))
            .args(more)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn wdp run");
        Host {
            child: Some(child),
            log,
        }
    }

    /// The host's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` (a `kill` name such as "HUP") to the running host.
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("running");
        let pid = child.id().expect("pid").to_string();
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// Sends SIGTERM and waits for the exit.
    pub async fn terminate(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let pid = child.id().expect("pid").to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(status.success());
        tokio::time::timeout(Duration::from_secs(20), child.wait())
            .await
            .expect("wdp run did not stop within 20 s of SIGTERM")
            .expect("wait")
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- wdp run log ----\n{}", self.log());
        }
    }
}

/// What the stand-in has reported so far: the latest device ids of each resource.
pub struct Seen {
    rx: mpsc::UnboundedReceiver<Observed>,
    latest: HashMap<String, Vec<String>>,
    health: HashMap<String, HashMap<String, String>>,
    numa: HashMap<String, HashMap<String, Option<Vec<i64>>>>,
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
            latest: HashMap::new(),
            health: HashMap::new(),
            numa: HashMap::new(),
            ended: HashSet::new(),
            registrations: HashMap::new(),
            stream_ends: HashMap::new(),
            streams: CurrentStreams::default(),
        }
    }

    fn record(&mut self, ev: Observed) {
        // Every stream's end is counted; only the current stream's events make the state.
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
                let health = devices.iter().map(|d| (d.id.clone(), d.health.clone()));
                self.health.insert(resource.clone(), health.collect());
                let numa = devices.iter().map(|d| {
                    let nodes = d.topology.as_ref().map(|t| t.nodes.iter().map(|n| n.id));
                    (d.id.clone(), nodes.map(Iterator::collect))
                });
                self.numa.insert(resource.clone(), numa.collect());
                let mut ids: Vec<String> = devices.into_iter().map(|d| d.id).collect();
                ids.sort();
                self.ended.remove(&resource);
                self.latest.insert(resource, ids);
            }
            Observed::StreamEnded { resource, .. } => {
                self.latest.remove(&resource);
                self.ended.insert(resource);
            }
            Observed::Registered { resource, .. } => {
                *self.registrations.entry(resource).or_default() += 1;
            }
        }
    }

    /// Waits until `done` holds for the state, failing after 20 s.
    pub async fn until(&mut self, what: &str, mut done: impl FnMut(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !done(self) {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(ev)) => self.record(ev),
                Ok(None) => panic!("stand-in closed while waiting for {what}"),
                Err(_) => panic!(
                    "timed out waiting for {what}; latest device lists: {:?}",
                    self.latest
                ),
            }
        }
    }

    /// Waits until `resource`'s latest list has exactly `ids` (any order).
    pub async fn devices(&mut self, resource: &str, ids: &[&str]) {
        let mut want: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        want.sort();
        let what = format!("{resource} with devices {ids:?}");
        self.until(&what, |s| s.latest.get(resource) == Some(&want))
            .await;
    }

    /// Waits until kubelet's latest list for `resource` has device `id` with `health`
    /// ("Healthy" or "Unhealthy").
    pub async fn health(&mut self, resource: &str, id: &str, health: &str) {
        let what = format!("{resource} device {id} {health}");
        self.until(&what, |s| {
            s.health
                .get(resource)
                .and_then(|h| h.get(id))
                .is_some_and(|h| h == health)
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
        self.numa.get(resource)?.get(id).cloned()
    }

    /// How many times `resource` registered so far (as far as events were consumed).
    pub fn registrations(&self, resource: &str) -> usize {
        self.registrations.get(resource).copied().unwrap_or(0)
    }

    /// Whether `resource`'s current stream has listed a device.
    pub fn listed(&self, resource: &str) -> bool {
        self.latest.get(resource).is_some_and(|ids| !ids.is_empty())
    }

    /// How many of `resource`'s ListAndWatch streams ended so far.
    pub fn stream_ends(&self, resource: &str) -> usize {
        self.stream_ends.get(resource).copied().unwrap_or(0)
    }

    /// Waits until `resource`'s stream has ended.
    pub async fn ended(&mut self, resource: &str) {
        let what = format!("the end of {resource}'s stream");
        self.until(&what, |s| s.ended.contains(resource)).await;
    }

    /// Waits until every resource in `resources` has a non-empty list.
    pub async fn all_listed(&mut self, resources: &[&str]) {
        self.until("every resource listed", |s| {
            resources
                .iter()
                .all(|r| s.latest.get(*r).is_some_and(|ids| !ids.is_empty()))
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
