//! A peer in the same run: a device plugin built on the crates.io crate `k8s-device-plugin-lib`
//! 0.2.0 (bench/peer/, its `StaticDevicePlugin`), and wdp's generic scanner, each serving the same
//! 4 fixture devices under one resource to the same kubelet stand-in, started, asked and measured
//! alike: process start to registration, Allocate, idle resident memory, binary size.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use tokio::process::Command;
use wdp_bench::fixtures::{BenchFixture, generic_devices, repo_root, scanner_yaml, write_config};
use wdp_bench::procfs::Memory;
use wdp_bench::stats::{Summary, human};
use wdp_kubelet::api;
use wdp_kubelet::standin::StandIn;
use wdp_tests::host::{Host, Seen};

use super::shared::{Ctx, expect, expect_quiet, guest, ms};
use super::sizes::Sizes;

use crate::e2e::kubelet;
use crate::report::{Report, Row};

/// Devices each plugin serves.
const DEVICES: u32 = 4;
const WDP_RESOURCE: &str = "serial.wdp.dev/serial";
const PEER_RESOURCE: &str = "peer.example.com/serial";
/// How long after its spawn a plugin's memory is read: as the idle row, past the 10 s after which
/// tokio's idle blocking-pool threads exit.
const IDLE_AFTER: Duration = Duration::from_secs(12);

/// The peer, as `make bench` builds it (bench/peer, `perf` profile, its own target directory).
pub fn peer_bin() -> PathBuf {
    repo_root().join("target/peer/perf/wdp-bench-peer")
}

/// What one plugin measured.
struct Measured {
    registered: Vec<Duration>,
    allocate: Vec<Duration>,
    idle: Memory,
    binary: u64,
}

/// Measures wdp, then the peer, over one fixture and stand-in; adds the peer's rows, wdp's beside
/// them, and a table of the ratios.
pub async fn run(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== peer: k8s-device-plugin-lib 0.2.0 beside wdp, {DEVICES} static devices ==");
    let peer = peer_bin();
    ensure!(
        peer.exists(),
        "{} is missing: `make bench` builds it (bench/peer)",
        peer.display()
    );
    let f = BenchFixture::new();
    let mut paths = Vec::new();
    for i in 0..DEVICES {
        f.char_dev(&format!("ttyUSB{i}"), 188, i);
        paths.push(f.dev().join(format!("ttyUSB{i}")));
    }
    let devices = generic_devices("serial", "/dev/ttyUSB*");
    let config = write_config(
        &f,
        &[scanner_yaml(
            "serial",
            &guest("generic"),
            "serial.wdp.dev",
            &[("DEVICES", devices.as_str())],
            None,
        )],
    );
    let dir = f.plugin_dir();
    let (kubelet, mut obs) = kubelet(&dir)?;
    let wdp = measure(&kubelet, &mut obs, sizes, WDP_RESOURCE, &ctx.wdp, || {
        ctx.start(&f, &config)
    })
    .await
    .context("wdp")?;
    let log = f.path().join("peer.log");
    let peer = measure(&kubelet, &mut obs, sizes, PEER_RESOURCE, &peer, || {
        start_peer(&peer, &dir, &paths, &log)
    })
    .await
    .context("the peer")?;

    let (ws, ps) = (summary(&wdp.registered)?, summary(&peer.registered)?);
    let (wa, pa) = (summary(&wdp.allocate)?, summary(&peer.allocate)?);
    let name = "peer (k8s-device-plugin-lib 0.2.0)";
    report.push(Row::timed(
        &format!("{name}: process start -> registered"),
        "(reference)",
        &peer.registered,
        |_| true,
        &format!(
            "its `StaticDevicePlugin`, {DEVICES} devices, 1 resource; spawn to the stand-in's Register (bench/peer)"
        ),
    ));
    report.push(Row::timed(
        "wdp beside it: process start -> registered",
        "(reference)",
        &wdp.registered,
        |_| true,
        &format!(
            "generic scanner over the same {DEVICES} nodes, compile cache warm; median {} the peer's",
            ratio(ws.median, ps.median)
        ),
    ));
    report.push(Row::timed(
        &format!("{name}: Allocate"),
        "(reference)",
        &peer.allocate,
        |_| true,
        "1 container, 1 device; same stand-in client over the plugin's Unix socket",
    ));
    report.push(Row::timed(
        "wdp beside it: Allocate",
        "(reference)",
        &wdp.allocate,
        |_| true,
        &format!(
            "same; p50 {}, p99 {} the peer's",
            ratio(wa.median, pa.median),
            ratio(wa.p99, pa.p99)
        ),
    ));
    for (who, m, other) in [(name, &peer, None), ("wdp beside it", &wdp, Some(&peer))] {
        let vs = |a: u64, b: u64| {
            other.map_or(String::new(), |_| {
                format!("; {:.2}x the peer's", a as f64 / b as f64)
            })
        };
        report.push(Row::value(
            &format!("{who}: resident memory, idle"),
            "(reference)",
            mib(m.idle.vm_rss),
            format!("{} high-water", mib(m.idle.vm_hwm)),
            None,
            &format!(
                "VmRSS {} s after the spawn: anon {} KiB, file {} KiB; {} threads{}",
                IDLE_AFTER.as_secs(),
                m.idle.rss_anon,
                m.idle.rss_file,
                m.idle.threads,
                vs(m.idle.vm_rss, peer.idle.vm_rss)
            ),
        ));
        report.push(Row::value(
            &format!("{who}: binary size"),
            "(reference)",
            mib(m.binary / 1024),
            "-".into(),
            None,
            &format!(
                "the `perf` build stripped as shipped (`strip --strip-all`){}",
                vs(m.binary, peer.binary)
            ),
        ));
    }
    report.details.push((
        "wdp beside the peer".into(),
        format!(
            "Same run, fixture ({DEVICES} character devices), stand-in and client; wdp runs the generic \
             scanner in its sandbox, the peer serves a static list. Ratios are wdp over the peer.\n\n\
             | figure | wdp | peer | wdp / peer |\n|---|---|---|---|\n\
             | process start -> registered, median | {} | {} | {} |\n\
             | Allocate p50 | {} | {} | {} |\n\
             | Allocate p99 | {} | {} | {} |\n\
             | resident memory, idle | {} | {} | {:.2}x |\n\
             | binary size | {} | {} | {:.2}x |\n",
            human(ws.median),
            human(ps.median),
            ratio(ws.median, ps.median),
            human(wa.median),
            human(pa.median),
            ratio(wa.median, pa.median),
            human(wa.p99),
            human(pa.p99),
            ratio(wa.p99, pa.p99),
            mib(wdp.idle.vm_rss),
            mib(peer.idle.vm_rss),
            wdp.idle.vm_rss as f64 / peer.idle.vm_rss.max(1) as f64,
            mib(wdp.binary / 1024),
            mib(peer.binary / 1024),
            wdp.binary as f64 / peer.binary.max(1) as f64,
        ),
    ));
    Ok(())
}

/// Starts a plugin `sizes.starts + 1` times (the first, which may compile, is not counted) and
/// times each start to its registration; the last one then sits idle until [`IDLE_AFTER`], has
/// its memory read and answers `sizes.allocate_calls` Allocate calls.
async fn measure(
    kubelet: &StandIn,
    obs: &mut Seen,
    sizes: &Sizes,
    resource: &str,
    binary: &Path,
    start: impl Fn() -> Result<Host>,
) -> Result<Measured> {
    let mut registered = Vec::new();
    let mut last = None;
    for run in 0..=sizes.starts {
        obs.forget();
        let plugin = start()?;
        let t_reg = expect(obs, &plugin, "registered", ms(30_000), |o| {
            o.registrations(resource) > 0
        })
        .await?;
        expect(obs, &plugin, "listed", ms(30_000), |o| {
            o.count(resource) == Some(DEVICES as usize)
        })
        .await?;
        if run > 0 {
            registered.push(t_reg - plugin.spawned());
        }
        if run < sizes.starts {
            plugin.stop().await?;
            expect_quiet(obs, &[resource.to_string()]).await;
        } else {
            last = Some(plugin);
        }
    }
    let plugin = last.ok_or_else(|| anyhow!("no start"))?;
    tokio::time::sleep_until((plugin.spawned() + IDLE_AFTER).into()).await;
    let idle = wdp_bench::procfs::memory(plugin.pid())?;
    let mut client = kubelet
        .client(resource)
        .with_context(|| format!("{resource} is not registered"))?;
    let request = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: vec!["ttyUSB0".into()],
        }],
    };
    let warmup = sizes.allocate_calls / 10;
    let mut allocate = Vec::with_capacity(sizes.allocate_calls);
    for i in 0..(sizes.allocate_calls + warmup) {
        let t0 = Instant::now();
        let answer = client.allocate(request.clone()).await?.into_inner();
        let elapsed = t0.elapsed();
        ensure!(
            answer.container_responses.len() == 1
                && answer.container_responses[0].devices.len() == 1,
            "{resource}: unexpected Allocate answer {answer:?}"
        );
        if i >= warmup {
            allocate.push(elapsed);
        }
    }
    plugin.stop().await?;
    expect_quiet(obs, &[resource.to_string()]).await;
    let binary = stripped_size(binary).await?;
    Ok(Measured {
        registered,
        allocate,
        idle,
        binary,
    })
}

/// The size of `binary` as shipped: a copy stripped of debug info and symbols (`strip
/// --strip-all`, what the release profile's `strip = "symbols"` and the image do), so that the
/// `perf` builds, which keep symbols for profiling, compare as the binaries a node holds.
async fn stripped_size(binary: &Path) -> Result<u64> {
    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("stripped");
    let status = Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&copy)
        .arg(binary)
        .status()
        .await
        .with_context(|| format!("strip --strip-all {} (binutils)", binary.display()))?;
    ensure!(
        status.success(),
        "strip --strip-all {}: {status}",
        binary.display()
    );
    Ok(std::fs::metadata(&copy)
        .with_context(|| format!("size of {}", copy.display()))?
        .len())
}

/// Starts the peer serving `devices` to the stand-in in `plugin_dir`, logging into `log`.
fn start_peer(bin: &Path, plugin_dir: &Path, devices: &[PathBuf], log: &Path) -> Result<Host> {
    let mut cmd = Command::new(bin);
    cmd.arg(plugin_dir).arg(PEER_RESOURCE).args(devices);
    Ok(Host::spawn(&mut cmd, log)?)
}

fn summary(samples: &[Duration]) -> Result<Summary> {
    Summary::of(samples).ok_or_else(|| anyhow!("no samples"))
}

/// `a / b` as a factor.
fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64().max(1e-9))
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}
