//! `wdp-bench`: the end-to-end half of `make bench` (issue 8).
//!
//! Runs every row of the issue's table against the real thing: `wdp run` as a child process
//! (the binary next to this one, built with the same profile), the kubelet stand-in over real
//! Unix sockets with a real gRPC client, fixture dev roots made of real character devices (mknod:
//! run as root). Prints each figure as it is measured and writes `RESULTS.md` with the machine,
//! the date, the numbers, the criterion micro-benchmarks (read from criterion's JSON output) and
//! the hand-written notes.
//!
//! ```text
//! wdp-bench [--out FILE] [--criterion DIR] [--notes FILE] [--profile NAME] [--wdp BIN]
//!           [--guests DIR] [--native BIN] [--build-seconds S] [--quick] [--only ROW,ROW...]
//! ```
//!
//! Rows: hotplug, poll, newtype, allocate, restart, startup, idle, bulk, wasm.

mod e2e;
mod report;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail, ensure};
use tokio::sync::mpsc;
use wdp::kubelet::api;
use wdp::policy::Policy;
use wdp::sandbox::devfs::DevFs;
use wdp::sandbox::watch::ChangeWatcher;
use wdp::sandbox::{GuestSpec, Roots, Sandbox};
use wdp::scanner::ScannerEvent;
use wdp::topology::Topology;

use e2e::{Jitter, Observer, RunOptions, WdpRun, kubelet};
use report::{Report, Row};
use wdp_bench::fixtures::{self, Fixture, generic_devices, scanner_yaml, write_config};
use wdp_bench::stats::{Summary, human};

/// Components from `--guests DIR` instead of this tree's build (for what-if runs).
static GUESTS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
/// `generic-native` from `--native BIN` instead of this tree's build.
static NATIVE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The compiled guest `name` (`generic`, `kvm`, `test_hooks`, ...).
fn guest(name: &str) -> PathBuf {
    match GUESTS.get() {
        Some(dir) => dir.join(format!("{name}.wasm")),
        None => wdp_tests::guest(name),
    }
}

/// Run sizes. `--quick` shrinks every count for a smoke run.
struct Sizes {
    hotplug_cycles: usize,
    poll_cycles: usize,
    newtype_cycles: usize,
    allocate_calls: usize,
    restarts: usize,
    starts: usize,
    idle: Duration,
    bulk_devices: usize,
    bulk_cycles: usize,
    wasm_devices: usize,
    wasm_cold: usize,
    wasm_warm: usize,
    native_runs: usize,
}

impl Sizes {
    fn full() -> Self {
        Sizes {
            hotplug_cycles: 100,
            poll_cycles: 6,
            newtype_cycles: 20,
            allocate_calls: 2000,
            restarts: 30,
            starts: 10,
            // Two default 30 s safety rescans show in the timeline.
            idle: Duration::from_secs(62),
            bulk_devices: 10_000,
            bulk_cycles: 15,
            wasm_devices: 1000,
            wasm_cold: 20,
            wasm_warm: 40,
            native_runs: 200,
        }
    }

    fn quick() -> Self {
        Sizes {
            hotplug_cycles: 10,
            poll_cycles: 1,
            newtype_cycles: 3,
            allocate_calls: 200,
            restarts: 5,
            starts: 3,
            idle: Duration::from_secs(10),
            bulk_devices: 10_000,
            bulk_cycles: 3,
            wasm_devices: 1000,
            wasm_cold: 3,
            wasm_warm: 5,
            native_runs: 20,
        }
    }
}

struct Args {
    out: PathBuf,
    criterion: Option<PathBuf>,
    notes: Option<PathBuf>,
    profile: String,
    build_seconds: Option<f64>,
    quick: bool,
    only: Option<Vec<String>>,
    wdp: Option<PathBuf>,
}

const ROWS: [&str; 9] = [
    "hotplug", "poll", "newtype", "allocate", "restart", "startup", "idle", "bulk", "wasm",
];

impl Args {
    fn parse() -> Result<Args> {
        let root = fixtures::repo_root();
        let mut a = Args {
            out: root.join("bench/RESULTS.md"),
            criterion: None,
            notes: Some(root.join("bench/NOTES.md")),
            profile: "perf".into(),
            build_seconds: None,
            quick: false,
            only: None,
            wdp: None,
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
            match arg.as_str() {
                "--out" => a.out = value()?.into(),
                "--criterion" => a.criterion = Some(value()?.into()),
                "--notes" => a.notes = Some(value()?.into()),
                "--profile" => a.profile = value()?,
                "--wdp" => a.wdp = Some(value()?.into()),
                "--guests" => {
                    let _ = GUESTS.set(value()?.into());
                }
                "--native" => {
                    let _ = NATIVE.set(value()?.into());
                }
                "--build-seconds" => a.build_seconds = Some(value()?.parse()?),
                "--quick" => a.quick = true,
                "--only" => {
                    let only: Vec<String> = value()?.split(',').map(str::to_string).collect();
                    if let Some(bad) = only.iter().find(|r| !ROWS.contains(&r.as_str())) {
                        bail!("unknown row {bad:?}; rows: {}", ROWS.join(", "));
                    }
                    a.only = Some(only);
                }
                "-h" | "--help" => {
                    println!(
                        "wdp-bench [--out FILE] [--criterion DIR] [--notes FILE] [--profile NAME] \
                         [--wdp BIN] [--guests DIR] [--native BIN] [--build-seconds S] [--quick] \
                         [--only {}]",
                        ROWS.join(",")
                    );
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other:?} (try --help)"),
            }
        }
        Ok(a)
    }

    fn runs(&self, row: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|r| r == row))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse()?;
    if !wdp_bench::procfs::is_root() {
        bail!("wdp-bench makes device nodes with mknod: run it as root");
    }
    let sizes = if args.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    let started = Instant::now();
    let mut report = Report::new(&args.profile, args.build_seconds, args.quick);
    // One compiled-component cache for the whole run (the start-up row uses its own).
    let cache = tempfile::tempdir()?;
    let ctx = Ctx {
        wdp: match &args.wdp {
            Some(w) => w.clone(),
            None => default_wdp()?,
        },
        cache: cache.path().to_path_buf(),
    };
    println!("wdp-bench: host binary {}", ctx.wdp.display());

    if args.runs("hotplug") {
        hotplug(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("newtype") {
        new_type(&ctx, &sizes, &mut report).await?;
    }
    // The poll baseline spends its time asleep: the idle row (which only looks at its own host's
    // wake-ups and memory) runs beside it.
    let idle = args.runs("idle").then(|| {
        let ctx = ctx.clone();
        let window = sizes.idle;
        tokio::spawn(async move { idle(&ctx, window).await })
    });
    if args.runs("poll") {
        poll(&ctx, &sizes, &mut report).await?;
    }
    if let Some(idle) = idle {
        let (rows, details) = idle.await??;
        report.rows.extend(rows);
        report.details.extend(details);
    }
    if args.runs("allocate") {
        allocate(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("restart") {
        restart(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("startup") {
        startup(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("bulk") {
        bulk(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("wasm") {
        wasm_vs_native(&sizes, &mut report).await?;
    }
    report.hotplug_ratio();
    if let Some(dir) = &args.criterion {
        report.read_criterion(dir);
    }
    let notes = args
        .notes
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok());
    report.run_seconds = started.elapsed().as_secs_f64();
    let text = report.markdown(notes.as_deref());
    std::fs::write(&args.out, text).with_context(|| format!("write {}", args.out.display()))?;
    println!(
        "\nwdp-bench: {} rows in {:.0} s; wrote {}",
        report.rows.len(),
        report.run_seconds,
        args.out.display()
    );
    Ok(())
}

/// The `wdp` built with this binary (same profile directory).
fn default_wdp() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let wdp = exe.with_file_name("wdp");
    ensure!(
        wdp.exists(),
        "{} is missing: build it with this binary (`make bench` does), or pass --wdp",
        wdp.display()
    );
    Ok(wdp)
}

#[derive(Clone)]
struct Ctx {
    wdp: PathBuf,
    cache: PathBuf,
}

impl Ctx {
    fn start(&self, f: &Fixture, config: &Path) -> Result<WdpRun> {
        WdpRun::start(
            f,
            &RunOptions {
                wdp: &self.wdp,
                config,
                plugin_dir: &plugin_dir(f),
                compile_cache: &self.cache,
                json_logs: false,
                log_filter: "info",
            },
        )
    }
}

fn plugin_dir(f: &Fixture) -> PathBuf {
    f.path().join("plugins")
}

/// Waits for a condition; on failure the host's log goes with the error.
async fn expect(
    obs: &mut Observer,
    host: &WdpRun,
    what: &str,
    timeout: Duration,
    done: impl FnMut(&Observer) -> bool,
) -> Result<Instant> {
    match obs.until(what, timeout, done).await {
        Ok(at) => Ok(at),
        Err(e) => {
            let log = host.log_text();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            Err(e.context(format!("host log (tail):\n{}", tail.join("\n"))))
        }
    }
}

const SERIAL: &str = "bench.wdp.dev/serial";

/// Plug and unplug `ttyUSB1` next to `ttyUSB0`, `cycles` times; each change is timed from the
/// mknod/unlink to the ListAndWatch message that shows it. `pause` draws the wait before each
/// change (a poller's latency depends on where in its period the change falls).
async fn plug_cycles(
    ctx: &Ctx,
    component: &Path,
    extra_env: &[(&str, &str)],
    cycles: usize,
    mut pause: impl FnMut() -> Duration,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let f = Fixture::new();
    f.char_dev("ttyUSB0", 188, 0);
    let devices = generic_devices("serial", "/dev/ttyUSB*");
    let mut env = vec![("DEVICES", devices.as_str())];
    env.extend_from_slice(extra_env);
    let config = write_config(
        &f,
        "wdp.yaml",
        &[scanner_yaml(
            "serial",
            component,
            "bench.wdp.dev",
            &env,
            None,
        )],
    );
    let (_kubelet, mut obs) = kubelet(&plugin_dir(&f))?;
    let host = ctx.start(&f, &config)?;
    let long = Duration::from_secs(30);
    expect(&mut obs, &host, "ttyUSB0 listed", long, |o| {
        o.has(SERIAL, "ttyUSB0")
    })
    .await?;
    let (mut plug, mut unplug) = (Vec::new(), Vec::new());
    for _ in 0..cycles {
        tokio::time::sleep(pause()).await;
        let t0 = Instant::now();
        f.char_dev("ttyUSB1", 188, 1);
        let at = expect(&mut obs, &host, "ttyUSB1 plugged", long, |o| {
            o.has(SERIAL, "ttyUSB1")
        })
        .await?;
        plug.push(at - t0);
        tokio::time::sleep(pause()).await;
        let t0 = Instant::now();
        f.remove_dev("ttyUSB1");
        let at = expect(&mut obs, &host, "ttyUSB1 unplugged", long, |o| {
            o.has(SERIAL, "ttyUSB0") && !o.has(SERIAL, "ttyUSB1")
        })
        .await?;
        unplug.push(at - t0);
    }
    host.stop().await?;
    Ok((plug, unplug))
}

async fn hotplug(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== hot-plug, event-driven (generic scanner, wait-for-change) ==");
    let mut jitter = Jitter::new();
    let (plug, unplug) = plug_cycles(ctx, &guest("generic"), &[], sizes.hotplug_cycles, || {
        jitter.between(Duration::from_millis(5), Duration::from_millis(25))
    })
    .await?;
    let target = "p50 <= 20 ms, p99 <= 50 ms";
    let ok = |s: &Summary| s.median <= ms(20) && s.p99 <= ms(50);
    report.push(Row::timed(
        "hot-plug: node appears -> ListAndWatch has it",
        target,
        &plug,
        ok,
        "generic scanner (`/dev/ttyUSB*`), fixture dev root, `wdp run` + stand-in",
    ));
    report.push(Row::timed(
        "hot-plug: node removed -> ListAndWatch without it",
        target,
        &unplug,
        ok,
        "same",
    ));
    report.event_plug = Summary::of(&plug);
    report.event_unplug = Summary::of(&unplug);
    Ok(())
}

async fn poll(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== hot-plug, poll-mode baseline (the same logic sleeping 5 s between scans) ==");
    let mut jitter = Jitter::new();
    let (plug, unplug) = plug_cycles(
        ctx,
        &guest("poller"),
        &[("POLL_INTERVAL_MS", "5000")],
        sizes.poll_cycles,
        // Uniform over one period: changes land anywhere in the poller's cycle.
        || jitter.between(Duration::from_millis(10), Duration::from_millis(5010)),
    )
    .await?;
    report.push(Row::timed(
        "baseline: poll every 5 s, node appears",
        "(reference)",
        &plug,
        |_| true,
        "`poller` guest: generic's own discovery, `sleep(5 s)` instead of wait-for-change",
    ));
    report.push(Row::timed(
        "baseline: poll every 5 s, node removed",
        "(reference)",
        &unplug,
        |_| true,
        "same",
    ));
    report.poll_plug = Summary::of(&plug);
    report.poll_unplug = Summary::of(&unplug);
    Ok(())
}

/// A node whose device type was not served appears: the host starts a server, binds its
/// socket, registers with kubelet, which dials back and opens ListAndWatch.
async fn new_type(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== hot-plug of a new device type (kvm scanner: /dev/fuse appears) ==");
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let config = write_config(
        &f,
        "wdp.yaml",
        &[scanner_yaml(
            "kvm",
            &guest("kvm"),
            "kvm.wdp.dev",
            &[("SLOTS", "4")],
            None,
        )],
    );
    let (_kubelet, mut obs) = kubelet(&plugin_dir(&f))?;
    let host = ctx.start(&f, &config)?;
    let long = Duration::from_secs(30);
    const FUSE: &str = "kvm.wdp.dev/fuse";
    expect(&mut obs, &host, "kvm listed", long, |o| {
        o.count("kvm.wdp.dev/kvm") == Some(4)
    })
    .await?;
    let mut jitter = Jitter::new();
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for _ in 0..sizes.newtype_cycles {
        tokio::time::sleep(jitter.between(ms(5), ms(25))).await;
        obs.registered.remove(FUSE);
        let t0 = Instant::now();
        f.char_dev("fuse", 10, 229);
        let at = expect(&mut obs, &host, "fuse registered and listed", long, |o| {
            o.registered.contains(FUSE) && o.count(FUSE) == Some(4)
        })
        .await?;
        up.push(at - t0);
        tokio::time::sleep(jitter.between(ms(5), ms(25))).await;
        let t0 = Instant::now();
        f.remove_dev("fuse");
        let at = expect(&mut obs, &host, "fuse stream ended", long, |o| {
            o.ended.contains(FUSE)
        })
        .await?;
        down.push(at - t0);
    }
    host.stop().await?;
    report.push(Row::timed(
        "new device type appears -> served, registered, listed",
        "(no target)",
        &up,
        |_| true,
        "kvm scanner; includes socket bind, Register, kubelet's dial-back and first list",
    ));
    report.push(Row::timed(
        "device type vanishes -> its stream ends",
        "(no target)",
        &down,
        |_| true,
        "same",
    ));
    Ok(())
}

async fn allocate(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== Allocate over the Unix socket ==");
    let f = Fixture::new();
    f.char_dev("ttyUSB0", 188, 0);
    let devices = generic_devices("serial", "/dev/ttyUSB*");
    let env = [("DEVICES", devices.as_str())];
    let generic = guest("generic");
    let config = write_config(
        &f,
        "wdp.yaml",
        &[
            scanner_yaml("plain", &generic, "plain.wdp.dev", &env, None),
            scanner_yaml(
                "hooked",
                &generic,
                "hooked.wdp.dev",
                &env,
                Some(&guest("test_hooks")),
            ),
        ],
    );
    let (kubelet, mut obs) = kubelet(&plugin_dir(&f))?;
    let host = ctx.start(&f, &config)?;
    let resources = ["plain.wdp.dev/serial", "hooked.wdp.dev/serial"];
    expect(
        &mut obs,
        &host,
        "both listed",
        Duration::from_secs(30),
        |o| resources.iter().all(|r| o.has(r, "ttyUSB0")),
    )
    .await?;
    let request = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: vec!["ttyUSB0".into()],
        }],
    };
    let mut results = Vec::new();
    for resource in resources {
        let mut client = kubelet
            .client(resource)
            .with_context(|| format!("{resource} is not registered"))?;
        // The transport's floor: a call that does no work.
        let mut floor = Vec::new();
        for i in 0..(sizes.allocate_calls / 4 + 50) {
            let t0 = Instant::now();
            client.get_device_plugin_options(api::Empty {}).await?;
            if i >= 50 {
                floor.push(t0.elapsed());
            }
        }
        let warmup = sizes.allocate_calls / 10;
        let mut took = Vec::with_capacity(sizes.allocate_calls);
        for i in 0..(sizes.allocate_calls + warmup) {
            let t0 = Instant::now();
            let answer = client.allocate(request.clone()).await?.into_inner();
            let elapsed = t0.elapsed();
            ensure!(
                answer.container_responses.len() == 1,
                "{resource}: unexpected Allocate answer {answer:?}"
            );
            if i >= warmup {
                took.push(elapsed);
            }
        }
        results.push((took, floor));
    }
    let memory = wdp_bench::procfs::memory(host.pid).ok();
    host.stop().await?;
    let [(plain, plain_floor), (hooked, _)] =
        <[_; 2]>::try_from(results).map_err(|_| anyhow::anyhow!("two resources"))?;
    report.push(Row::timed(
        "Allocate, no hook",
        "p99 <= 300 µs",
        &plain,
        |s| s.p99 <= us(300),
        "1 container, 1 device; tonic client of the stand-in over the plugin's Unix socket",
    ));
    report.push(Row::timed(
        "Allocate, Rust post-allocator guest",
        "p99 <= 500 µs",
        &hooked,
        |s| s.p99 <= us(500),
        "`test_hooks` (renumber mode) in a fresh instance per call, answer validated",
    ));
    report.push(Row::timed(
        "gRPC floor: GetDevicePluginOptions",
        "(reference)",
        &plain_floor,
        |_| true,
        "same socket and client; a call that does no work",
    ));
    if let Some(m) = memory {
        report.details.push((
            "Allocate host".into(),
            format!(
                "RSS of the host after {} hooked Allocate calls: {} KiB (high-water mark {} KiB).\n",
                hooked.len(),
                m.vm_rss,
                m.vm_hwm
            ),
        ));
    }
    Ok(())
}

/// The 10 resources the demo configuration serves over a fixture holding all its nodes.
fn demo_resources() -> Vec<String> {
    let mut r: Vec<String> = ["kvm", "tun", "vhost-net", "fuse"]
        .iter()
        .map(|t| format!("devices.wdp.dev/{t}"))
        .collect();
    r.extend(
        ["serial", "null", "zero", "full", "urandom", "tty"]
            .iter()
            .map(|t| format!("generic.wdp.dev/{t}")),
    );
    r
}

fn demo_fixture() -> (Fixture, PathBuf) {
    let f = Fixture::new();
    fixtures::demo_nodes(&f);
    let (config, _) = fixtures::demo_config(&f);
    (f, config)
}

async fn restart(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== kubelet restart -> the demo config's 10 resources registered again ==");
    let (f, config) = demo_fixture();
    let resources = demo_resources();
    let dir = plugin_dir(&f);
    let (mut kubelet, mut obs) = kubelet(&dir)?;
    let host = ctx.start(&f, &config)?;
    expect(
        &mut obs,
        &host,
        "10 resources",
        Duration::from_secs(30),
        |o| o.all_listed(&resources),
    )
    .await?;
    let (mut registered, mut listed) = (Vec::new(), Vec::new());
    let mut jitter = Jitter::new();
    for _ in 0..sizes.restarts {
        tokio::time::sleep(jitter.between(ms(20), ms(60))).await;
        kubelet.stop().await;
        let t0 = Instant::now();
        // StandIn::start deletes every socket in the directory first, as kubelet does.
        let (k, rx) = wdp::kubelet::standin::StandIn::start(&dir)?;
        kubelet = k;
        obs.replace(rx);
        let t_reg = expect(&mut obs, &host, "all registered", ms(20_000), |o| {
            o.all_registered(&resources)
        })
        .await?;
        let t_list = expect(&mut obs, &host, "all listed", ms(20_000), |o| {
            o.all_listed(&resources)
        })
        .await?;
        registered.push(t_reg - t0);
        listed.push(t_list - t0);
    }
    let log = host.log_text();
    host.stop().await?;
    kubelet.stop().await;
    // What the host said about the registrations that did not go straight through.
    let count = |what: &str| log.matches(what).count();
    let slow: Vec<String> = registered
        .iter()
        .filter(|d| **d > ms(50))
        .map(|d| human(*d))
        .collect();
    report.details.push((
        "kubelet restarts".into(),
        format!(
            "{} restarts; slower than 50 ms: {slow:?}. Host log over the run: {} \"registration failed; retrying\", \
             {} \"kubelet restarted during registration\", {} \"kubelet socket absent\", {} \"cannot listen\".\n",
            registered.len(),
            count("registration failed; retrying"),
            count("kubelet restarted during registration"),
            count("kubelet socket absent"),
            count("cannot listen"),
        ),
    ));
    report.push(Row::timed(
        "kubelet restart -> all 10 demo resources registered",
        "p99 <= 100 ms",
        &registered,
        |s| s.p99 <= ms(100),
        "`demo/wdp.yaml` over a fixture dev root holding its nodes; stand-in restarted (sockets deleted, kubelet.sock recreated)",
    ));
    report.push(Row::timed(
        "kubelet restart -> all 10 listed (first ListAndWatch message)",
        "(no target)",
        &listed,
        |_| true,
        "same",
    ));
    Ok(())
}

async fn startup(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== process start -> every resource registered (compile cache warm) ==");
    let (f, config) = demo_fixture();
    let resources = demo_resources();
    let dir = plugin_dir(&f);
    let cache = f.path().join("compiled");
    let (_kubelet, mut obs) = kubelet(&dir)?;
    let mut cold = None;
    let (mut registered, mut listed) = (Vec::new(), Vec::new());
    let mut phases: Vec<Vec<(String, Duration)>> = Vec::new();
    for run in 0..=sizes.starts {
        obs.forget();
        let host = WdpRun::start(
            &f,
            &RunOptions {
                wdp: &ctx.wdp,
                config: &config,
                plugin_dir: &dir,
                compile_cache: &cache,
                json_logs: true,
                log_filter: "info",
            },
        )?;
        let t0 = host.spawned;
        let t_reg = expect(&mut obs, &host, "all registered", ms(60_000), |o| {
            o.all_registered(&resources)
        })
        .await?;
        let t_list = expect(&mut obs, &host, "all listed", ms(60_000), |o| {
            o.all_listed(&resources)
        })
        .await?;
        let log = host.log_text();
        let spawned_wall = host.spawned_wall;
        host.stop().await?;
        expect_quiet(&mut obs, &resources).await;
        if run == 0 {
            cold = Some(t_reg - t0);
            continue;
        }
        registered.push(t_reg - t0);
        listed.push(t_list - t0);
        phases.push(startup_phases(&log, spawned_wall));
    }
    report.push(Row::timed(
        "process start -> every resource registered (cache warm)",
        "<= 150 ms",
        &registered,
        |s| s.median <= ms(150),
        "`demo/wdp.yaml`, 10 resources; spawn of `wdp run` to the stand-in's last Register",
    ));
    report.push(Row::timed(
        "process start -> every resource listed (cache warm)",
        "(no target)",
        &listed,
        |_| true,
        "same, to the last first ListAndWatch message",
    ));
    if let Some(cold) = cold {
        report.details.push((
            "Start-up with a cold compile cache".into(),
            format!(
                "The first start of the same configuration, compiling both components: {} to every resource registered.\n",
                human(cold)
            ),
        ));
    }
    report.details.push((
        "Start-up breakdown (median of the warm starts, from the host's JSON log)".into(),
        report::phase_table(&phases),
    ));
    Ok(())
}

/// After a host stops, waits until the stand-in saw every stream end (at most 5 s).
async fn expect_quiet(obs: &mut Observer, resources: &[String]) {
    let _ = obs
        .until("streams ended", Duration::from_secs(5), |o| {
            resources.iter().all(|r| o.ended.contains(r))
        })
        .await;
}

/// Milestones of one start, relative to the spawn: when the first log line was written (the
/// process is up and has read its config), each component loaded, "running", the last
/// "registered with kubelet".
fn startup_phases(log: &str, spawned: SystemTime) -> Vec<(String, Duration)> {
    let events = e2e::read_json_log(log);
    let since = |t: SystemTime| t.duration_since(spawned).unwrap_or_default();
    let mut out = Vec::new();
    if let Some(first) = events.first() {
        out.push((
            "first log line (exec, runtime, config)".into(),
            since(first.at),
        ));
    }
    let loads: Vec<_> = events
        .iter()
        .filter(|e| e.message.starts_with("component loaded") || e.message == "component compiled")
        .collect();
    if let Some(last) = loads.last() {
        out.push((
            format!("{} components loaded from the cache", loads.len()),
            since(last.at),
        ));
    }
    if let Some(running) = events.iter().find(|e| e.message == "running") {
        out.push(("\"running\" (scanners spawned)".into(), since(running.at)));
    }
    if let Some(first) = events
        .iter()
        .find(|e| e.message == "serving new device type")
    {
        out.push(("first device type served".into(), since(first.at)));
    }
    let regs: Vec<_> = events
        .iter()
        .filter(|e| e.message == "registered with kubelet")
        .collect();
    if let Some(first) = regs.first() {
        out.push(("first \"registered with kubelet\"".into(), since(first.at)));
    }
    if let Some(last) = regs.last() {
        out.push(("last \"registered with kubelet\"".into(), since(last.at)));
    }
    out
}

/// Every bundled Rust scanner, one `wdp run`, idle: resident memory and wake-ups.
async fn idle(ctx: &Ctx, window: Duration) -> Result<(Vec<Row>, Vec<(String, String)>)> {
    println!(
        "\n== idle host, every bundled Rust scanner loaded (runs beside the poll baseline) =="
    );
    let (f, _demo) = demo_fixture();
    let resources = demo_resources();
    let (_, demo_text) = fixtures::demo_config(&f);
    // The demo's two scanners as they are, then every other bundled scanner with its defaults.
    let mut entries = vec![
        demo_text
            .split_once("scanners:\n")
            .map(|(_, s)| s.to_string())
            .context("demo config has scanners:")?,
    ];
    let others = [
        "gpu", "qat", "idxd", "sgx", "npu", "dlb", "vfio", "nvidia", "usb", "serial",
    ];
    for name in others {
        // The three that have no default for what they select (they fail without it).
        let env: &[(&str, &str)] = match name {
            "idxd" => &[("IDXD_DEVICE", "dsa")],
            "vfio" => &[("VFIO_DEVICE_IDS", "0x0b25")],
            "usb" => &[("USB_DEVICES", "1050:0407")],
            _ => &[],
        };
        entries.push(scanner_yaml(
            name,
            &guest(name),
            &format!("{name}.wdp.dev"),
            env,
            None,
        ));
    }
    let config = write_config(&f, "all.yaml", &entries);
    let (_kubelet, mut obs) = kubelet(&plugin_dir(&f))?;
    // A first start compiles the ten scanners no earlier row used: its memory includes the
    // compiler's. Measured, then the host is restarted from the warm cache, as on any restart.
    let cold = {
        let host = ctx.start(&f, &config)?;
        expect(&mut obs, &host, "demo resources", ms(120_000), |o| {
            o.all_listed(&resources)
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mem = wdp_bench::procfs::memory(host.pid)?;
        host.stop().await?;
        expect_quiet(&mut obs, &resources).await;
        obs.forget();
        mem
    };
    // JSON logs, with the change watcher's trace events: kernel uevents (which describe the real
    // machine, whatever the fixture) wake every scanner, and the timeline says which bursts they
    // explain.
    let host = WdpRun::start(
        &f,
        &RunOptions {
            wdp: &ctx.wdp,
            config: &config,
            plugin_dir: &plugin_dir(&f),
            compile_cache: &ctx.cache,
            json_logs: true,
            log_filter: "info,wdp::sandbox::watch=trace",
        },
    )?;
    expect(&mut obs, &host, "demo resources", ms(60_000), |o| {
        o.all_listed(&resources)
    })
    .await?;
    // Let every scanner settle in wait-for-change, and tokio's blocking-pool threads (used while
    // starting) reach their 10 s keep-alive and exit: those are one-off wake-ups.
    tokio::time::sleep(SETTLE).await;
    let pid = host.pid;
    let mem = wdp_bench::procfs::memory(pid)?;
    let cpu0 = wdp_bench::procfs::cpu_ticks(pid)?;
    // (second, wake-ups, threads that exited) for every second with any.
    let mut timeline: Vec<(u64, u64, usize)> = Vec::new();
    let mut last = wdp_bench::procfs::thread_switches(pid)?;
    let begin = Instant::now();
    let begin_wall = SystemTime::now();
    let mut second = 0u64;
    while begin.elapsed() < window {
        second += 1;
        tokio::time::sleep_until((begin + Duration::from_secs(second)).into()).await;
        let now = wdp_bench::procfs::thread_switches(pid)?;
        let woke: u64 = now
            .iter()
            .map(|(tid, n)| n.saturating_sub(last.get(tid).copied().unwrap_or(0)))
            .sum();
        let exited = last.keys().filter(|t| !now.contains_key(t)).count();
        if woke > 0 || exited > 0 {
            timeline.push((second, woke, exited));
        }
        last = now;
    }
    let cpu1 = wdp_bench::procfs::cpu_ticks(pid)?;
    let mem_end = wdp_bench::procfs::memory(pid)?;
    let log = host.log_text();
    host.stop().await?;
    let scanners = 2 + others.len();
    let failed = log.matches("scanner failed").count();
    // A failing scanner restarts with backoff (1 s doubling): that would be measured as wake-ups.
    ensure!(
        failed == 0,
        "{failed} scanner failures in the idle host's log: the idle figures would be wrong:\n{}",
        log.lines()
            .filter(|l| l.contains("scanner failed"))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let secs = window.as_secs();
    // Kernel uevents in the window, by second (1-based like the timeline).
    let uevents: Vec<u64> = e2e::read_json_log(&log)
        .iter()
        .filter(|e| e.message == "kernel uevent")
        .filter_map(|e| e.at.duration_since(begin_wall).ok())
        .map(|d| d.as_secs() + 1)
        .filter(|s| *s <= secs)
        .collect();
    let total: u64 = timeline.iter().map(|(_, n, _)| n).sum();
    // A uevent, or a rescan, starts an episode: its scans, then (10 s later) the exit of the
    // blocking-pool threads its file reads used. Wake-ups a uevent explains are set aside; the
    // rest are merged into episodes, which must be as far apart as the 30 s safety rescan.
    let explained = |s: u64| uevents.iter().any(|u| s + 1 >= *u && s <= u + 12);
    let mut spans: Vec<(u64, u64)> = Vec::new(); // (first second, last second)
    for &(s, _, _) in timeline.iter().filter(|(s, _, _)| !explained(*s)) {
        match spans.last_mut() {
            Some(span) if s <= span.1 + 12 => span.1 = s,
            _ => spans.push((s, s)),
        }
    }
    let episodes: Vec<u64> = spans.iter().map(|(first, _)| *first).collect();
    let shortest_gap = episodes.windows(2).map(|w| w[1] - w[0]).min();
    let met = shortest_gap.is_none_or(|g| g >= 25);
    let rss_mib = mem.vm_rss as f64 / 1024.0;
    let rows = vec![
        Row::value(
            &format!("resident memory, idle, {scanners} Rust scanners loaded"),
            "<= 20 MiB",
            format!("{rss_mib:.1} MiB"),
            format!("{:.1} MiB at the end", mem_end.vm_rss as f64 / 1024.0),
            Some(rss_mib <= 20.0),
            &format!(
                "VmRSS of a start from the warm compile cache, {} s idle: anon {} KiB, file (binary text and data) {} KiB; {} threads. First start (compiling): {:.1} MiB",
                SETTLE.as_secs(),
                mem.rss_anon,
                mem.rss_file,
                mem.threads,
                cold.vm_rss as f64 / 1024.0
            ),
        ),
        Row::value(
            "CPU when nothing changes: wake-ups",
            "none more often than the 30 s rescan",
            format!("{} episodes in {secs} s", episodes.len()),
            match shortest_gap {
                Some(g) => format!("{g} s apart at least"),
                None => "-".into(),
            },
            Some(met),
            &format!(
                "{total} context switches over all threads in {secs} s, {} kernel uevents; CPU {} ticks; see the timeline",
                uevents.len(),
                cpu1.saturating_sub(cpu0)
            ),
        ),
    ];
    let tl = if timeline.is_empty() {
        "none".to_string()
    } else {
        timeline
            .iter()
            .map(|(s, n, exited)| {
                let mut t = format!("{s}: {n}");
                if *exited > 0 {
                    t += &format!(" ({exited} threads exited)");
                }
                if uevents.contains(s) {
                    t += " (uevent)";
                }
                t
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let details = vec![(
        "Idle timeline".into(),
        format!(
            "Wake-ups (voluntary + involuntary context switches, summed over threads) of the idle \
             host, per second of the {secs} s window that starts {} s after all resources were \
             listed (second: count): {tl}.\n\nEpisodes not explained by a kernel uevent start at \
             seconds {episodes:?}; kernel uevents at seconds {uevents:?}.\n",
            SETTLE.as_secs()
        ),
    )];
    for r in &rows {
        r.print();
    }
    Ok((rows, details))
}

/// Wait before the idle window: longer than tokio's 10 s blocking-thread keep-alive.
const SETTLE: Duration = Duration::from_secs(12);

const BULK: &str = "bulk.wdp.dev/bulk";

async fn bulk(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    let n = sizes.bulk_devices;
    println!("\n== one type with {n} devices: a node appears or goes ==");
    let f = Fixture::new();
    let t = Instant::now();
    fixtures::bulk(&f, "bulk", n);
    println!("  ({n} nodes made in {})", human(t.elapsed()));
    let devices = generic_devices("bulk", "/dev/bulk/d*");
    let config = write_config(
        &f,
        "wdp.yaml",
        &[scanner_yaml(
            "bulk",
            &guest("generic"),
            "bulk.wdp.dev",
            &[("DEVICES", devices.as_str())],
            None,
        )],
    );
    let (_kubelet, mut obs) = kubelet(&plugin_dir(&f))?;
    let host = ctx.start(&f, &config)?;
    let long = Duration::from_secs(60);
    expect(&mut obs, &host, "bulk listed", long, |o| {
        o.count(BULK) == Some(n)
    })
    .await?;
    let extra = format!("bulk/d{n}");
    let mut jitter = Jitter::new();
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for _ in 0..sizes.bulk_cycles {
        tokio::time::sleep(jitter.between(ms(20), ms(60))).await;
        let t0 = Instant::now();
        f.char_dev(&extra, fixtures::BULK_MAJOR, n as u32);
        let at = expect(&mut obs, &host, "one more", long, |o| {
            o.count(BULK) == Some(n + 1)
        })
        .await?;
        up.push(at - t0);
        tokio::time::sleep(jitter.between(ms(20), ms(60))).await;
        let t0 = Instant::now();
        f.remove_dev(&extra);
        let at = expect(&mut obs, &host, "one fewer", long, |o| {
            o.count(BULK) == Some(n)
        })
        .await?;
        down.push(at - t0);
    }
    let mem = wdp_bench::procfs::memory(host.pid).ok();
    host.stop().await?;
    let both: Vec<Duration> = up.iter().chain(&down).copied().collect();
    report.push(Row::timed(
        &format!("one type with {n} devices: scan -> diff -> ListAndWatch update"),
        "<= 50 ms",
        &both,
        |s| s.median <= ms(50),
        "generic (`/dev/bulk/d*`); a node added or removed, to the stand-in's decoded list",
    ));
    if let Some(m) = mem {
        report.details.push((
            format!("{n}-device host"),
            format!(
                "RSS of the host serving {n} devices: {} KiB (high-water mark {} KiB).\n",
                m.vm_rss, m.vm_hwm
            ),
        ));
    }
    Ok(())
}

/// The `generic` scanner over the same 1,000-node fixture: as a wasm component in the sandbox,
/// and its own discovery code compiled natively.
async fn wasm_vs_native(sizes: &Sizes, report: &mut Report) -> Result<()> {
    let n = sizes.wasm_devices;
    println!("\n== wasm scanner vs the same logic native, {n} devices ==");
    let f = Fixture::new();
    fixtures::bulk(&f, "bench", n);
    // Each match as a mount rather than a device node: the scan is the same glob and the same
    // tree building, but the host's own work on the tree (which both sides pay, and which is
    // subtracted below) shrinks to validation: no node-exists stat and no NUMA lookup per device.
    let devices =
        r#"[{"name":"bench","groups":[{"paths":[{"path":"/dev/bench/d*","type":"Mount"}]}]}]"#
            .to_string();
    let policy = Arc::new(Policy {
        allowed_mounts: vec!["/dev/bench".into()],
        ..Policy::default()
    });

    // Native: generic's config.rs + discover.rs compiled for this machine, over std::fs.
    let native_std = native_scans(&f, &devices, n, sizes.native_runs).await?;
    // What the host does with a notified tree, natively, on the same tree: policy (node-exists
    // for every node), conversion, NUMA lookups.
    let devfs = DevFs::open(&f.dev())?;
    let topology = Topology::new(&f.sys());
    let mut host_check = Vec::new();
    let tree = fixtures::synthetic_tree("bench", "bench", n, true);
    for i in 0..(sizes.native_runs + 10) {
        let groups = tree.clone();
        let t0 = Instant::now();
        let mut checked = policy.check_tree(groups, &devfs)?;
        topology.fill(&mut checked, &devfs);
        let d = t0.elapsed();
        std::hint::black_box(checked);
        if i >= 10 {
            host_check.push(d);
        }
    }

    // Wasm: the real component in the wdp sandbox over the same fixture.
    let sandbox = Sandbox::new(Roots {
        sys: f.sys(),
        dev: f.dev(),
    })?;
    let component = sandbox.load(&guest("generic")).await?;
    let pre = component.scanner()?;
    let spec = GuestSpec {
        policy,
        ..GuestSpec::new(
            "generic",
            vec![
                ("DEVICES".into(), devices.clone()),
                ("RESCAN_INTERVAL_MS".into(), "600000".into()),
            ],
        )
    };
    // Cold: a fresh instance's first scan, from the end of instantiation to the validated tree.
    let mut cold = Vec::new();
    let mut instantiate = Vec::new();
    for _ in 0..sizes.wasm_cold {
        let (tx, mut rx) = mpsc::channel(4);
        let mut store = sandbox.store(&spec, Some(tx))?;
        let running = sandbox.clock().running();
        let t_inst = Instant::now();
        let plugin = pre.instantiate_async(&mut store).await?;
        let t0 = Instant::now();
        instantiate.push(t0 - t_inst);
        let task = tokio::spawn(async move {
            let _running = running;
            plugin
                .wdp_device_plugin_scanner()
                .call_scan(&mut store)
                .await
        });
        let first = rx.recv().await;
        cold.push(t0.elapsed());
        task.abort();
        match first {
            Some(ScannerEvent::Tree(t)) => ensure!(t.device_count() == n, "wasm tree size"),
            other => bail!("expected a tree from the wasm scanner, got {other:?}"),
        }
    }
    // Warm: one instance, a node added and removed in turn; each change is timed from the
    // moment an inotify watcher of our own wakes (the guest's wake-up comes from the same event)
    // to the validated tree.
    let watcher = ChangeWatcher::start(&f.dev(), &f.sys());
    let mut woke = watcher.subscribe();
    let (tx, mut rx) = mpsc::channel(4);
    let mut store = sandbox.store(&spec, Some(tx))?;
    let running = sandbox.clock().running();
    let plugin = pre.instantiate_async(&mut store).await?;
    let task = tokio::spawn(async move {
        let _running = running;
        plugin
            .wdp_device_plugin_scanner()
            .call_scan(&mut store)
            .await
    });
    let first = rx.recv().await;
    ensure!(matches!(first, Some(ScannerEvent::Tree(_))), "first tree");
    let extra = format!("bench/d{n}");
    let mut warm = Vec::new();
    let mut warm_total = Vec::new();
    let mut jitter = Jitter::new();
    for i in 0..sizes.wasm_warm {
        tokio::time::sleep(jitter.between(ms(10), ms(30))).await;
        woke.borrow_and_update();
        let t0 = Instant::now();
        let want = if i % 2 == 0 {
            f.char_dev(&extra, fixtures::BULK_MAJOR, n as u32);
            n + 1
        } else {
            f.remove_dev(&extra);
            n
        };
        tokio::time::timeout(Duration::from_secs(10), woke.changed()).await??;
        let t_w = Instant::now();
        let got = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await?
            .context("scanner stopped")?;
        let t1 = Instant::now();
        match got {
            ScannerEvent::Tree(t) => ensure!(t.device_count() == want, "warm tree size"),
            other => bail!("expected a tree, got {other:?}"),
        }
        warm.push(t1 - t_w);
        warm_total.push(t1 - t0);
    }
    task.abort();
    drop(watcher);

    let med = |v: &[Duration]| Summary::of(v).map(|s| s.median).unwrap_or_default();
    let (std_m, check_m) = (med(&native_std), med(&host_check));
    let warm_scan = med(&warm).saturating_sub(check_m);
    let cold_scan = med(&cold).saturating_sub(check_m);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    let r_warm = ratio(warm_scan, std_m);
    report.push(Row::value(
        &format!("wasm scanner vs the same logic native, {n} devices"),
        "<= 1.5x native",
        format!("{r_warm:.2}x"),
        format!("{:.2}x cold instance", ratio(cold_scan, std_m)),
        Some(r_warm <= 1.5),
        &format!(
            "generic over `/dev/bench/d*` (as mounts); scan medians: wasm {} (warm instance), native {}",
            human(warm_scan),
            human(std_m)
        ),
    ));
    let line = |name: &str, v: &[Duration]| -> String {
        match Summary::of(v) {
            Some(s) => format!(
                "| {name} | {} | {} | {} |\n",
                human(s.median),
                human(s.p99),
                s.n
            ),
            None => format!("| {name} | - | - | 0 |\n"),
        }
    };
    let mut t = String::from(
        "Medians are of the measured spans; the scan estimates subtract the host's own work on \
         the notified tree (measured natively on the same tree), which both sides pay.\n\n\
         | span | median | p99 | n |\n|---|---|---|---|\n",
    );
    t += &line(
        "native scan (`generic-native`: parse DEVICES + discover over std::fs)",
        &native_std,
    );
    t += &line(
        "host work on the notified tree (validation, policy), native",
        &host_check,
    );
    t += &line("wasm: instantiate a fresh instance", &instantiate);
    t += &line(
        "wasm, fresh instance: first scan + notify + host work",
        &cold,
    );
    t += &line(
        "wasm, warm instance: wake-up to validated tree (scan + notify + host work)",
        &warm,
    );
    t += &line(
        "wasm, warm instance: mknod/unlink to validated tree",
        &warm_total,
    );
    t += &format!(
        "\nEstimated wasm scan (warm): {} = {:.2}x native. Fresh instance: {} = {:.2}x.\n",
        human(warm_scan),
        r_warm,
        human(cold_scan),
        ratio(cold_scan, std_m)
    );
    report
        .details
        .push((format!("Wasm vs native, {n} devices"), t));
    Ok(())
}

/// Runs `generic-native` over the fixture and returns its timed scans.
async fn native_scans(f: &Fixture, devices: &str, n: usize, runs: usize) -> Result<Vec<Duration>> {
    let bin = NATIVE
        .get()
        .cloned()
        .unwrap_or_else(fixtures::generic_native_bin);
    let out = tokio::process::Command::new(&bin)
        .arg("--dev-root")
        .arg(f.dev())
        .arg("--sys-root")
        .arg(f.sys())
        .args(["--devices", devices, "--runs", &runs.to_string()])
        .output()
        .await
        .with_context(|| {
            format!(
                "run {} (built by `make bench`: cargo build --release -p generic-native in guest-scanners)",
                bin.display()
            )
        })?;
    ensure!(
        out.status.success(),
        "generic-native failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut lines = text.lines();
    let found = lines.next().and_then(|l| l.strip_prefix("devices "));
    ensure!(
        found == Some(&n.to_string()),
        "generic-native found {found:?} devices, expected {n}"
    );
    lines
        .map(|l| Ok(Duration::from_nanos(l.trim().parse()?)))
        .collect()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}
