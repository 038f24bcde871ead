//! Allocate latency: kubelet's call over the plugin's Unix socket, answered by the host alone
//! or rewritten by a post-allocator guest in a fresh instance per call (five runs of it, each
//! judged against a floor of its own).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use wdp_bench::fixtures::{BenchFixture, generic_devices, scanner_yaml, write_config};
use wdp_bench::stats::human;
use wdp_kubelet::api;
use wdp_kubelet::standin::PluginClient;

use super::shared::{Ctx, expect, guest, us};
use super::sizes::Sizes;
use crate::e2e::kubelet;
use crate::report::{Report, Row};

/// Allocate over the plugin's Unix socket, without a hook and through the Rust post-allocator
/// guest, next to the transport's floor (a call that does no work).
pub async fn run(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== Allocate over the Unix socket ==");
    let f = BenchFixture::new();
    f.char_dev("ttyUSB0", 188, 0);
    let devices = generic_devices("serial", "/dev/ttyUSB*");
    let env = [("DEVICES", devices.as_str())];
    let generic = guest("generic");
    let config = write_config(
        &f,
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
    let (kubelet, mut obs) = kubelet(&f.plugin_dir())?;
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
    let client = |resource: &str| {
        kubelet
            .client(resource)
            .with_context(|| format!("{resource} is not registered"))
    };
    // Each row's floor is measured call for call between its own Allocate calls, on the same
    // client: this VM's wake-up latency changes from one minute to the next, so a floor taken
    // before (or after) the calls it judges would see other minutes' tails than they did.
    let mut plain_client = client(resources[0])?;
    let (plain, plain_floor) = allocate(&mut plain_client, &request, resources[0], sizes).await?;
    // The hooked row's tails are this machine's wake-ups as much as the hook: it is measured
    // HOOKED_RUNS times, each run against the floor interleaved with it, so whether its bound
    // holds run after run is read from one `make bench`.
    let mut hooked_client = client(resources[1])?;
    let mut hooked = Vec::with_capacity(HOOKED_RUNS);
    for _ in 0..HOOKED_RUNS {
        hooked.push(allocate(&mut hooked_client, &request, resources[1], sizes).await?);
    }
    let memory = wdp_bench::procfs::memory(host.pid()).ok();
    host.stop().await?;
    // Judged against the floor measured between its own calls, same client and socket: what
    // Allocate adds to a call that does nothing, over the same minutes.
    let p99 = |samples: &[Duration]| {
        wdp_bench::stats::Summary::of(samples).map_or(Duration::ZERO, |s| s.p99)
    };
    let floor = p99(&plain_floor);
    report.push(Row::timed(
        "Allocate, no hook",
        &format!("p99 <= floor p99 + 100 µs ({})", human(floor + us(100))),
        &plain,
        |s| s.p99 <= floor + us(100),
        &format!(
            "1 container, 1 device; tonic client of the stand-in over the plugin's Unix socket; the floor: p99 {} over {} GetDevicePluginOptions, one before each Allocate, same client",
            human(floor),
            plain_floor.len()
        ),
    ));
    let mut within = 0;
    for (run, (took, run_floor)) in hooked.iter().enumerate() {
        let bound = p99(run_floor) + us(250);
        let row = Row::timed(
            &format!(
                "Allocate, Rust post-allocator guest, run {} of {HOOKED_RUNS}",
                run + 1
            ),
            &format!("p99 <= its run's floor p99 + 250 µs ({})", human(bound)),
            took,
            |s| s.p99 <= bound,
            &format!(
                "`test_hooks` (renumber mode) in a fresh instance per call (pooled memory and stack), answer validated; the run's floor: p99 {} over {} GetDevicePluginOptions, one before each Allocate of the run, same client",
                human(p99(run_floor)),
                run_floor.len()
            ),
        );
        within += usize::from(row.met == Some(true));
        report.push(row);
    }
    report.push(Row::value(
        "Allocate, Rust post-allocator guest: runs within bound",
        &format!("{HOOKED_RUNS} of {HOOKED_RUNS}"),
        format!("{within} of {HOOKED_RUNS}"),
        "-".into(),
        Some(within == HOOKED_RUNS),
        "the runs above, each against the floor interleaved with its calls",
    ));
    report.push(Row::timed(
        "gRPC floor: GetDevicePluginOptions",
        "(reference)",
        &plain_floor,
        |_| true,
        "same socket and client as the row without a hook, one before each of its Allocate calls; a call that does no work",
    ));
    if let Some(m) = memory {
        report.details.push((
            "Allocate host".into(),
            format!(
                "RSS of the host after {} hooked Allocate calls: {} KiB (high-water mark {} KiB).\n",
                hooked.iter().map(|(took, _)| took.len()).sum::<usize>(),
                m.vm_rss,
                m.vm_hwm
            ),
        ));
    }
    Ok(())
}

/// How many times the hooked row is measured in one run.
const HOOKED_RUNS: usize = 5;

/// `sizes.allocate_calls` timed Allocate calls of `request` on `client`, each after a timed
/// GetDevicePluginOptions (the transport's floor: a call that does no work) on the same client,
/// after a tenth as many unmeasured pairs: (Allocate's times, the floor's).
///
/// One floor call per Allocate call, alternating, gives the floor as many samples as the row it
/// judges, taken over the same minutes: a p99 compared with a p99 of the same count and time.
async fn allocate(
    client: &mut PluginClient,
    request: &api::AllocateRequest,
    resource: &str,
    sizes: &Sizes,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let warmup = sizes.allocate_calls / 10;
    let mut took = Vec::with_capacity(sizes.allocate_calls);
    let mut floor = Vec::with_capacity(sizes.allocate_calls);
    for i in 0..(sizes.allocate_calls + warmup) {
        let t0 = Instant::now();
        client.get_device_plugin_options(api::Empty {}).await?;
        let floor_took = t0.elapsed();
        let t0 = Instant::now();
        let answer = client.allocate(request.clone()).await?.into_inner();
        let elapsed = t0.elapsed();
        ensure!(
            answer.container_responses.len() == 1,
            "{resource}: unexpected Allocate answer {answer:?}"
        );
        if i >= warmup {
            took.push(elapsed);
            floor.push(floor_took);
        }
    }
    Ok((took, floor))
}
