//! Hot-plug: how long a node appearing or going takes to reach kubelet's ListAndWatch.
//!
//! Three scenarios share one fixture shape (a `ttyUSB*` serial glob, or the `kvm` scanner's
//! `/dev/fuse`): the event-driven `generic` scanner (the one measured against the target), the same discovery
//! polling every 5 s (the baseline it is compared with, in [`crate::report::Report::hotplug_ratio`])
//! and a node of a device type not served yet (a new server, socket, registration and stream).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use wdp_bench::fixtures::{BenchFixture, generic_devices, scanner_yaml, write_config};
use wdp_bench::stats::Summary;

use super::shared::{Ctx, expect, guest, ms};
use super::sizes::Sizes;
use crate::e2e::{Jitter, kubelet};
use crate::report::{Report, Row};

/// The resource the hot-plug fixture serves.
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
    let f = BenchFixture::new();
    f.char_dev("ttyUSB0", 188, 0);
    let devices = generic_devices("serial", "/dev/ttyUSB*");
    let mut env = vec![("DEVICES", devices.as_str())];
    env.extend_from_slice(extra_env);
    let config = write_config(
        &f,
        &[scanner_yaml(
            "serial",
            component,
            "bench.wdp.dev",
            &env,
            None,
        )],
    );
    let (_kubelet, mut obs) = kubelet(&f.plugin_dir())?;
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

/// Hot-plug with the event-driven `generic` scanner (wait-for-change): node appears, node
/// goes, each to the ListAndWatch message that shows it.
pub async fn event_driven(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== hot-plug, event-driven (generic scanner, wait-for-change) ==");
    let mut jitter = Jitter::new();
    let (plug, unplug) = plug_cycles(ctx, &guest("generic"), &[], sizes.hotplug_cycles, || {
        jitter.after_quiet_interval()
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

/// The same cycles with the `poller` guest (generic's discovery, sleeping 5 s between scans):
/// the baseline the event-driven rows are compared with.
pub async fn poll_baseline(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
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
pub async fn new_type(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== hot-plug of a new device type (kvm scanner: /dev/fuse appears) ==");
    let f = BenchFixture::new();
    f.char_dev("kvm", 10, 232);
    let config = write_config(
        &f,
        &[scanner_yaml(
            "kvm",
            &guest("kvm"),
            "kvm.wdp.dev",
            &[("SLOTS", "4")],
            None,
        )],
    );
    let (_kubelet, mut obs) = kubelet(&f.plugin_dir())?;
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
        tokio::time::sleep(jitter.after_quiet_interval()).await;
        let registrations = obs.registrations(FUSE);
        let t0 = Instant::now();
        f.char_dev("fuse", 10, 229);
        let at = expect(&mut obs, &host, "fuse registered and listed", long, |o| {
            o.registrations(FUSE) > registrations && o.count(FUSE) == Some(4)
        })
        .await?;
        up.push(at - t0);
        tokio::time::sleep(jitter.after_quiet_interval()).await;
        let t0 = Instant::now();
        f.remove_dev("fuse");
        let at = expect(&mut obs, &host, "fuse stream ended", long, |o| {
            o.has_ended(FUSE)
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
