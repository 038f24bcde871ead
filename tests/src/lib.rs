//! Shared support for wdp's integration tests and its benchmarks (`wdp-bench` builds on it):
//! guest components built from source (see `build.rs`), sysfs/dev fixture trees with real device
//! nodes, the `wdp` binary and its processes, what the kubelet stand-in observes, polling for a
//! state, an HTTP GET, deploy/'s DaemonSet as kubelet would run it, and the book's pages.

pub mod book;
pub mod daemonset;
pub mod fixture;
pub mod host;
pub mod http;
pub mod podman;
pub mod registry;

use std::path::PathBuf;
use std::process::{Command, Output};

/// The repository's root, where the tests find what the project ships (deploy/, scripts/, the
/// Containerfile).
pub fn repo() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

/// The compiled guest `name` (e.g. "kvm", "hostile"), built by this crate's build script.
pub fn guest(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("WDP_GUESTS_DIR")).join(format!("{name}.wasm"));
    assert!(path.exists(), "guest {} was not built", path.display());
    path
}

/// The `wdp` binary of this workspace. `make test` builds it before running the tests.
pub fn wdp_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/wdp
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executable lives in target/<profile>/deps");
    let bin = profile_dir.join("wdp");
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} is missing: build it first (`cargo build -p wdp`, or `make test`)",
                bin.display()
            )
        });
    // `cargo test` does not rebuild another package's binary: refuse to test stale code. Cargo's
    // dep-info file next to the binary lists exactly the sources it was built from.
    let deps = std::fs::read_to_string(profile_dir.join("wdp.d")).unwrap_or_default();
    let sources = deps.split_once(": ").map(|(_, d)| d).unwrap_or_default();
    for source in sources.split_whitespace().map(PathBuf::from) {
        if std::fs::metadata(&source)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t > built)
        {
            panic!(
                "{} is older than {}: rebuild it (`cargo build -p wdp`, or `make test`)",
                bin.display(),
                source.display()
            );
        }
    }
    bin
}

/// Runs `wdp` with `args` and returns its output.
pub fn wdp(args: &[&str]) -> Output {
    Command::new(wdp_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run wdp")
}

/// `wdp run --config <config>` over the fixture (plugin dir `<fixture>/plugins`, compile cache
/// `<fixture>/compiled`), to completion: for runs that must fail before serving anything.
pub fn wdp_run_to_exit(f: &fixture::Fixture, config: &std::path::Path) -> Output {
    let arg = |p: std::path::PathBuf| p.display().to_string();
    wdp(&[
        "run",
        "--config",
        &arg(config.to_path_buf()),
        "--plugin-dir",
        &arg(f.path().join("plugins")),
        "--compile-cache",
        &arg(f.path().join("compiled")),
        "--sys-root",
        &arg(f.sys()),
        "--dev-root",
        &arg(f.dev()),
    ])
}

/// Replaces the config file `path` as editors and kubelet's ConfigMap updates do: a temporary
/// file renamed over it, so a reload never reads half a file (a plain write truncates first).
pub fn write_renamed(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Parses one JSON document per non-empty line of `stdout`.
pub fn json_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;
use wdp::sandbox::{Guest, GuestLimits, Sandbox};
use wdp::scanner::{RestartPolicy, Scanner, ScannerEvent, supervise};
use wdp::tree::DeviceTree;

/// How long a test waits for one event, or for a state it polls, before failing.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// Polls `check` every 50 ms until it gives a value, failing the test after [`EVENT_TIMEOUT`]:
/// for states that announce themselves by no event (a log line, an HTTP answer, a file).
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(EVENT_TIMEOUT, what, check).await
}

/// [`eventually`] with another bound, for states that take longer to reach.
pub async fn eventually_within<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(timeout, what, || {
        let checked = check();
        async { checked.await.ok_or_else(String::new) }
    })
    .await
}

/// [`eventually`] of a state whose absence says something: `check` gives what it saw instead
/// (`Err`), and a timeout's message ends with the last of it.
pub async fn eventually_showing<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    poll(EVENT_TIMEOUT, what, check).await
}

/// Polls `check` every 50 ms until it gives a value, failing the test after `timeout` with what
/// it gave last (when it said anything).
async fn poll<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let seen = match check().await {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}{}",
            if seen.is_empty() {
                String::new()
            } else {
                format!("; last seen:\n{seen}")
            }
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A scanner running under [`supervise`]; dropping it stops the guest.
pub struct Running {
    /// What the supervisor reports: trees, refusals, failures.
    pub events: mpsc::Receiver<ScannerEvent>,
    /// The supervisor's task, aborted with the guest when this is dropped.
    _task: AbortOnDropHandle<()>,
}

impl Running {
    /// The next event, failing the test after [`EVENT_TIMEOUT`].
    pub async fn next(&mut self) -> ScannerEvent {
        tokio::time::timeout(EVENT_TIMEOUT, self.events.recv())
            .await
            .expect("no scanner event in time")
            .expect("scanner event channel closed")
    }

    /// The next tree, failing on a failure event.
    pub async fn next_tree(&mut self) -> Arc<DeviceTree> {
        match self.next().await {
            ScannerEvent::Tree(t) => t,
            other => panic!("expected a tree, got {other:?}"),
        }
    }

    /// The next failure's cause, skipping trees.
    pub async fn failure(&mut self) -> String {
        loop {
            match self.next().await {
                ScannerEvent::Failed { error, .. } => return error,
                ScannerEvent::Tree(_) => {}
                other => panic!("expected a failure, got {other:?}"),
            }
        }
    }
}

/// Loads guest `file` (see [`guest`]) into `sandbox` and runs it with `env`.
pub async fn run_guest(
    sandbox: &Arc<Sandbox>,
    file: &str,
    env: &[(&str, &str)],
    limits: GuestLimits,
    policy: RestartPolicy,
) -> Running {
    let component = sandbox.load(&guest(file)).await.expect("load guest");
    let scanner = Scanner {
        guest: Guest {
            limits,
            ..Guest::new(
                file,
                env.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        },
        policy: Default::default(),
        pre: component.scanner().expect("guest exports scanner"),
    };
    let (tx, events) = mpsc::channel(16);
    let task = AbortOnDropHandle::new(tokio::spawn(supervise(
        sandbox.clone(),
        scanner,
        policy,
        tx,
    )));
    Running {
        events,
        _task: task,
    }
}

/// Sorted device ids of `dev_type` in `tree` (empty if the type is absent).
pub fn ids(tree: &Arc<DeviceTree>, dev_type: &str) -> Vec<String> {
    tree.0
        .get(dev_type)
        .map(|g| g.keys().cloned().collect())
        .unwrap_or_default()
}

/// A sandbox over the fixture's roots.
pub fn sandbox(f: &fixture::Fixture) -> Arc<Sandbox> {
    Sandbox::new(wdp::sandbox::Roots {
        sys: f.sys(),
        dev: f.dev(),
    })
    .expect("sandbox over the fixture")
}

/// A healthy `kvm` scanner (one slot, rescans only on a change) that has reported its first
/// tree: tests use it to show the host and other guests keep working.
pub async fn healthy_kvm(sandbox: &Arc<Sandbox>) -> Running {
    let mut kvm = run_guest(
        sandbox,
        "kvm",
        &[("SLOTS", "1"), ("RESCAN_INTERVAL_MS", "600000")],
        GuestLimits::default(),
        RestartPolicy::Never,
    )
    .await;
    kvm.next_tree().await;
    kvm
}

/// A guest written in another language (`lang`: python, js or c), as `make guests` builds it:
/// `target/guests/<lang>/<name>.wasm` from `guest-scanners/<lang>/<name>/`. Missing, or older
/// than one of its sources, is a test failure that says how to build it: these guests need
/// toolchains cargo does not provide, so this crate's build script cannot build them.
pub fn lang_guest(lang: &str, name: &str) -> PathBuf {
    let target = PathBuf::from(env!("WDP_TARGET_DIR"));
    let path = target.join(format!("guests/{lang}/{name}.wasm"));
    let how = format!(
        "`make guests` builds it (after `make setup` installed the toolchains; one guest alone: \
         scripts/build-lang-guest.sh {lang} {name})"
    );
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} is missing: {how}", path.display()));
    let sources = target
        .parent()
        .expect("target/ is inside the repository")
        .join(format!("guest-scanners/{lang}/{name}"));
    for entry in std::fs::read_dir(&sources)
        .unwrap_or_else(|e| panic!("{}: {e}", sources.display()))
        .filter_map(Result::ok)
    {
        let newer = entry
            .metadata()
            .is_ok_and(|m| m.is_file() && m.modified().is_ok_and(|t| t > built));
        if newer {
            panic!(
                "{} is older than {}: {how}",
                path.display(),
                entry.path().display()
            );
        }
    }
    path
}

/// Makes the kernel send a real uevent (`change` of `/dev/null`'s device, which has no other
/// effect than udev, if any runs, re-applying /dev/null's permissions): a sysfs-side change
/// signal that no inotify watch can see, for testing that the host listens to uevents.
pub fn kernel_uevent() {
    std::fs::write("/sys/devices/virtual/mem/null/uevent", "change")
        .expect("write /sys/devices/virtual/mem/null/uevent (tests run as root)");
}

/// One container's device specs from an Allocate answer, as `(host path, container path,
/// permissions)` in answer order: what Allocate tests compare.
pub fn node_specs(c: &wdp_kubelet::api::ContainerAllocateResponse) -> Vec<(&str, &str, &str)> {
    c.devices
        .iter()
        .map(|d| {
            (
                d.host_path.as_str(),
                d.container_path.as_str(),
                d.permissions.as_str(),
            )
        })
        .collect()
}

/// What a container runtime does with a CDI name `kind=device`: finds the spec of its kind in
/// `dir` and the device of its name there; the device's `containerEdits`. Specs are JSON here
/// (the tests' CDI format).
pub fn resolve_cdi(dir: &std::path::Path, name: &str) -> Option<serde_json::Value> {
    let (kind, device) = name.split_once('=')?;
    std::fs::read_dir(dir).ok()?.flatten().find_map(|entry| {
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(entry.path()).ok()?).ok()?;
        if spec["kind"] != kind {
            return None;
        }
        let devices = spec["devices"].as_array()?;
        let d = devices.iter().find(|d| d["name"] == device)?;
        Some(d["containerEdits"].clone())
    })
}
