//! Guests that attack what the host's filesystem calls (`hostfs.read-files`, `hostfs.list-dir`,
//! the WASI /sys preopen) cost the host: its workers, its shutdown, its memory. Each runs in
//! `wdp run` beside a healthy scanner, and the host must keep serving that scanner's updates to
//! kubelet, answer `/healthz` within [`HEALTHZ_BOUND`], and end on SIGTERM within
//! [`GRACE`], the DaemonSet's grace period.
//!
//! A read that never returns is tracefs's `trace_pipe`, the real thing: a tracefs is mounted in
//! the fixture's /sys (the DaemonSet's /sys has one) and each test reads a trace instance of its
//! own, so no test sees another's trace data.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use wdp_kubelet::standin::StandIn;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::{Host, Seen};
use wdp_tests::http::http_get;
use wdp_tests::{eventually, eventually_within, guest};

/// Longest `/healthz` may take to answer while a guest attacks.
const HEALTHZ_BOUND: Duration = Duration::from_secs(5);

/// `terminationGracePeriodSeconds` of deploy/daemonset.yaml.
const GRACE: Duration = Duration::from_secs(30);

/// A tracefs mounted at `<sys>/kernel/tracing`, with trace instances of this test's own; all
/// removed (and unmounted) on drop.
struct Tracefs {
    mount: PathBuf,
    instances: Vec<PathBuf>,
}

impl Tracefs {
    fn mount(f: &Fixture) -> Tracefs {
        let mount = f.sys().join("kernel/tracing");
        std::fs::create_dir_all(&mount).expect("mkdir kernel/tracing");
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tracefs", "nodev"])
            .arg(&mount)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            mounted,
            "mount -t tracefs on {} failed: these tests need root and a kernel with tracefs",
            mount.display()
        );
        Tracefs {
            mount,
            instances: Vec::new(),
        }
    }

    /// A new trace instance; its `trace_pipe` as the guest names it.
    fn instance(&mut self, tag: &str) -> (String, PathBuf) {
        let name = format!("wdp-test-{}-{tag}", std::process::id());
        let dir = self.mount.join("instances").join(&name);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("mkdir {} (a trace instance): {e}", dir.display()));
        self.instances.push(dir.clone());
        (
            format!("/sys/kernel/tracing/instances/{name}/trace_pipe"),
            dir,
        )
    }
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        for dir in &self.instances {
            // Busy while a reader (a host killed a moment ago) still has its pipe open.
            let until = Instant::now() + Duration::from_secs(10);
            while std::fs::remove_dir(dir).is_err() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.mount)
            .status();
    }
}

/// Writes a line to an instance's `trace_marker` every 20 ms until dropped: reads of its
/// `trace_pipe` then always have a little more to wait for.
struct Trickle(Arc<AtomicBool>);

impl Trickle {
    fn start(instance: &Path) -> Trickle {
        let stop = Arc::new(AtomicBool::new(false));
        let marker = instance.join("trace_marker");
        let stopped = stop.clone();
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let _ = std::fs::write(&marker, "wdp test trickle\n");
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Trickle(stop)
    }
}

impl Drop for Trickle {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `wdp run` serving a healthy `kvm` scanner (namespace devices.example.com) and the `hostile`
/// scanners in `hostile` (YAML list items) to a kubelet stand-in, with its HTTP endpoint;
/// returns once kvm's first list reached the stand-in.
async fn serve(f: &Fixture, hostile: &str) -> (StandIn, Seen, Host, String) {
    f.char_dev("kvm", 10, 232);
    let config = f.write_config(&format!(
        "scanners:
  - name: kvm
    component: {kvm}
    namespace: devices.example.com
    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}
{hostile}",
        kvm = guest("kvm").display(),
    ));
    let plugins = f.plugin_dir();
    let (kubelet, observed) = StandIn::start(&plugins).expect("start the kubelet stand-in");
    let host = Host::start_with(&config, &plugins, f, &["--metrics-addr", "127.0.0.1:0"]);
    let addr = eventually("the metrics address in the host's log", || async {
        let log = without_colours(&host.log());
        let line = log.lines().find(|l| l.contains("serving /metrics"))?;
        let addr = line.split("addr=").nth(1)?.split_whitespace().next()?;
        Some(addr.to_string())
    })
    .await;
    let mut seen = Seen::new(observed);
    seen.devices("devices.example.com/kvm", &["kvm-0"]).await;
    (kubelet, seen, host, addr)
}

/// `text` without terminal colour codes (`ESC [ ... m`).
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            out.push(c);
        }
    }
    out
}

/// A `hostile` scanner entry of the config.
fn hostile(name: &str, limits: &str, env: &str) -> String {
    format!(
        "  - name: {name}
    component: {hostile}
    namespace: {name}.example.com
    limits: {{ {limits} }}
    env: {{ {env} }}
",
        hostile = guest("hostile").display(),
    )
}

/// What every attack must leave standing: the healthy scanner's next update reaches kubelet,
/// `/healthz` answers in time, and SIGTERM ends the host within the grace period.
async fn host_kept_working(f: &Fixture, seen: &mut Seen, host: Host, addr: &str) {
    f.char_dev("fuse", 10, 229);
    seen.devices("devices.example.com/fuse", &["fuse-0"]).await;
    for _ in 0..3 {
        let asked = Instant::now();
        let answer = tokio::time::timeout(HEALTHZ_BOUND, http_get(addr, "/healthz")).await;
        assert!(
            matches!(answer, Ok(Ok((200, _)))),
            "/healthz: {answer:?} after {:?}",
            asked.elapsed()
        );
    }
    let log = host.log();
    let asked = Instant::now();
    let status = tokio::time::timeout(GRACE, host.stop())
        .await
        .unwrap_or_else(|_| panic!("SIGTERM: still running after {GRACE:?}; log:\n{log}"))
        .unwrap_or_else(|e| panic!("SIGTERM: {e}; log:\n{log}"));
    assert!(status.success(), "{status}");
    assert!(asked.elapsed() < GRACE);
}

/// Reads of tracefs pipes, one never fed, one fed a line every 20 ms, 1024 per call in a loop
/// by two scanners: none of it holds a runtime worker or a thread for long, every call answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_that_never_end_stall_neither_the_host_nor_its_shutdown() {
    let f = Fixture::new();
    let mut tracefs = Tracefs::mount(&f);
    let (never, _) = tracefs.instance("never");
    let (slow, slow_dir) = tracefs.instance("slow");
    let _trickle = Trickle::start(&slow_dir);
    let config = [("never", &never), ("slow", &slow)]
        .map(|(name, path)| {
            hostile(
                name,
                "call-timeout: 2s",
                &format!("ATTACK: hostfs-stuck-reads, READ_PATH: '{path}'"),
            )
        })
        .concat();
    let (_kubelet, mut seen, host, addr) = serve(&f, &config).await;
    for name in ["never", "slow"] {
        let resource = format!("{name}.example.com/answers");
        // The guest notifies `answered-1, 2, 4, 8, ...`; a tree within 100 ms of the last is
        // replaced by the next (coalescing), so any count from 8 on says 8 calls were answered.
        seen.until(&format!("{resource}: 8 calls answered"), |s| {
            s.ids(&resource).is_some_and(|ids| {
                ids.iter().any(|id| {
                    id.strip_prefix("answered-")
                        .and_then(|n| n.parse::<u64>().ok())
                        .is_some_and(|n| n >= 8)
                })
            })
        })
        .await;
    }
    host_kept_working(&f, &mut seen, host, &addr).await;
}

/// The resident memory of process `pid` from /proc: (VmRSS, VmHWM) in bytes.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
            * 1024
    };
    (field("VmRSS"), field("VmHWM"))
}

/// A `read-files` call of 4096 files of 64 KiB (256 MiB of answer) and a listing of 20,000 long
/// names, by guests of 16 MiB: refused as too large, and the host's memory grows by no more than
/// the guests may hold (their memory limits, plus the quarter of it an answer may take) and a
/// margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giant_answers_stay_within_the_guests_memory() {
    let f = Fixture::new();
    let page = "x".repeat(64 * 1024);
    for i in 0..64 {
        f.sys_file(&format!("big/f{i}"), &page);
    }
    let wide = f.sys().join("wide");
    std::fs::create_dir_all(&wide).unwrap();
    for i in 0..20_000 {
        std::fs::write(wide.join(format!("{i:05}{}", "n".repeat(200))), "").unwrap();
    }
    const GUEST_MIB: u64 = 16;
    let config = [
        ("batch", "hostfs-giant-batch"),
        ("listing", "hostfs-giant-listing"),
    ]
    .map(|(name, attack)| {
        hostile(
            name,
            &format!("memory: {GUEST_MIB}Mi"),
            &format!("ATTACK: {attack}, GO_FILE: /sys/go"),
        )
    })
    .concat();
    let (_kubelet, mut seen, host, addr) = serve(&f, &config).await;

    // Started and compiled: the peak from here on is the attack's. (Writing 5 to clear_refs
    // resets VmHWM to the current VmRSS.)
    std::fs::write(format!("/proc/{}/clear_refs", host.pid()), "5").expect("reset VmHWM");
    let (before, _) = memory(host.pid());
    f.sys_file("go", "");
    for name in ["batch", "listing"] {
        seen.devices(&format!("{name}.example.com/answers"), &["too-large"])
            .await;
    }
    let (_, peak) = memory(host.pid());
    // Each guest: its linear memory, an answer of a quarter of it; and 32 MiB for the host's
    // own (wasmtime's instances, allocator slack).
    let bound = before + 2 * (GUEST_MIB + GUEST_MIB / 4) * (1 << 20) + (32 << 20);
    assert!(
        peak <= bound,
        "the host's peak resident memory grew from {} to {} MiB: more than the guests' limits allow ({} MiB)",
        before >> 20,
        peak >> 20,
        bound >> 20
    );
    host_kept_working(&f, &mut seen, host, &addr).await;
}

/// A scanner whose reads through its /sys preopen are slow (15 ms each, as a PCI `config` read)
/// for longer than its CPU budget is waiting, not spinning: it is not stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reads_through_the_preopen_are_not_spinning() {
    let f = Fixture::new();
    f.sys_file("ok", "1\n");
    let config = hostile(
        "reader",
        "call-timeout: 1s",
        "ATTACK: slow-preopen-reads, READS: 300",
    );
    let (_kubelet, mut seen, host, addr) = serve(&f, &config).await;
    let resource = "reader.example.com/answers";
    let what = format!("{resource}: done-300");
    if let Err(e) = seen
        .wait(&what, Duration::from_secs(120), |s| {
            s.has(resource, "done-300")
        })
        .await
    {
        panic!("{e}\n{}", host.log_tail(20));
    }
    let log = host.log();
    assert!(!log.contains("spinning"), "stopped as spinning:\n{log}");
    host_kept_working(&f, &mut seen, host, &addr).await;
}

/// A path that is not UTF-8 cannot be answered with an error (the host cannot even read the
/// call's arguments): the guest traps, and the log says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_is_not_utf8_traps_with_its_cause() {
    let f = Fixture::new();
    let config = hostile("utf8", "call-timeout: 5s", "ATTACK: hostfs-bad-utf8");
    let (_kubelet, mut seen, host, addr) = serve(&f, &config).await;
    seen.devices("utf8.example.com/good", &["g"]).await;
    let log = eventually_within(Duration::from_secs(60), "the trap's cause logged", || {
        let log = host.log();
        async move { log.contains("scanner failed").then_some(log) }
    })
    .await;
    let failed = log
        .lines()
        .find(|l| l.contains("scanner failed"))
        .unwrap_or_default();
    assert!(
        failed.contains("passed a string that is not valid UTF-8 to a host call"),
        "{failed}"
    );
    assert!(!log.contains("LEAKED"), "{log}");
    host_kept_working(&f, &mut seen, host, &addr).await;
}
