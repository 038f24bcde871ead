//! Start-up: from the spawn of `wdp run` to every resource registered with kubelet, with the
//! compile cache warm (as on any restart), with it empty but the components precompiled (a new
//! pod of the image, which carries its scanners precompiled), and where the time goes (read from
//! the host's JSON log).

use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, ensure};
use wdp_bench::fixtures::{demo_fixture, demo_resources};
use wdp_bench::stats::human;
use wdp_tests::host::{Host, Launch};

use super::shared::{Ctx, expect, expect_quiet, ms};
use super::sizes::Sizes;

use crate::e2e::{self, kubelet};
use crate::report::{self, Report, Row};

/// Starts the host over the demo configuration, once cold then `sizes.starts` times from the
/// warm cache, and times each start to the last registration and the last first list.
pub async fn run(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== process start -> every resource registered (compile cache warm) ==");
    let (f, config) = demo_fixture();
    let resources = demo_resources();
    let dir = f.plugin_dir();
    let cache = f.path().join("compiled");
    let (_kubelet, mut obs) = kubelet(&dir)?;
    let mut cold = None;
    let (mut registered, mut listed) = (Vec::new(), Vec::new());
    let mut phases: Vec<Vec<(String, Duration)>> = Vec::new();
    for run in 0..=sizes.starts {
        obs.forget();
        let launch = Launch {
            wdp: ctx.wdp.clone(),
            compile_cache: cache.clone(),
            log_filter: "info",
            args: &["--log-format", "json"],
        };
        let host = Host::launch(&config, &dir, &f, &launch)?;
        let t0 = host.spawned();
        let t_reg = expect(&mut obs, &host, "all registered", ms(60_000), |o| {
            o.all_registered(&resources)
        })
        .await?;
        let t_list = expect(&mut obs, &host, "all listed", ms(60_000), |o| {
            o.all_streaming(&resources)
        })
        .await?;
        let log = host.log();
        let spawned_wall = host.spawned_wall();
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

    // The image's first start on a node: the compile cache empty (a new pod's emptyDir), the
    // components precompiled (`wdp precompile`, as scripts/image.sh does) in `--precompiled`.
    println!(
        "\n== process start -> every resource registered (compile cache empty, precompiled) =="
    );
    let precompiled = f.path().join("precompiled");
    let components = precompile(ctx, &config, &precompiled)?;
    let precompiled_arg = precompiled.to_string_lossy().into_owned();
    let mut from_precompiled = Vec::new();
    for run in 0..sizes.starts {
        obs.forget();
        let empty = f.path().join(format!("compiled-empty-{run}"));
        let launch = Launch {
            wdp: ctx.wdp.clone(),
            compile_cache: empty.clone(),
            log_filter: "info",
            args: &["--log-format", "json", "--precompiled", &precompiled_arg],
        };
        let host = Host::launch(&config, &dir, &f, &launch)?;
        let t0 = host.spawned();
        let t_reg = expect(&mut obs, &host, "all registered", ms(60_000), |o| {
            o.all_registered(&resources)
        })
        .await?;
        let log = host.log();
        host.stop().await?;
        expect_quiet(&mut obs, &resources).await;
        // A start that compiled would be timed as a cold one: the row would mislead.
        let loaded = log
            .matches("component loaded from the precompiled components")
            .count();
        ensure!(
            loaded >= components && !log.contains("component compiled") && !empty.exists(),
            "start {run} with --precompiled: {loaded} loads of {components} components precompiled, compile cache {}",
            if empty.exists() { "written" } else { "empty" }
        );
        from_precompiled.push(t_reg - t0);
    }
    report.push(Row::timed(
        "process start -> every resource registered (cache empty, precompiled)",
        "<= 50 ms",
        &from_precompiled,
        |s| s.median <= ms(50),
        "same, each start with an empty compile cache and the components from `wdp precompile` in `--precompiled`: a new pod of the image",
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

/// Precompiles every component `config` names into `out` with the binary under test, as
/// scripts/image.sh does for the image; returns how many there are.
fn precompile(ctx: &Ctx, config: &Path, out: &Path) -> Result<usize> {
    let parsed = wdp::config::load(config)?;
    let mut components: Vec<&Path> = parsed
        .scanners
        .iter()
        .filter_map(|s| match &s.component {
            wdp::config::ComponentSource::File(path) => Some(path.as_path()),
            wdp::config::ComponentSource::Oci(_) => None,
        })
        .collect();
    components.sort_unstable();
    components.dedup();
    ensure!(
        !components.is_empty(),
        "{} names no component",
        config.display()
    );
    let done = std::process::Command::new(&ctx.wdp)
        .arg("precompile")
        .arg("--out")
        .arg(out)
        .args(&components)
        .env("RUST_LOG", "warn")
        .output()
        .with_context(|| format!("run {} precompile", ctx.wdp.display()))?;
    ensure!(
        done.status.success(),
        "wdp precompile: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    Ok(components.len())
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
