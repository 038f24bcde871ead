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
    let mut plain_client = client(resources[0])?;
    let plain_floor = floor(&mut plain_client, sizes).await?;
    let plain = allocate(&mut plain_client, &request, resources[0], sizes).await?;
    // The hooked row's tails are this machine's wake-ups as much as the hook: it is measured
    // HOOKED_RUNS times, each run after a floor of its own on the same client, so whether its
    // bound holds run after run is read from one `make bench`.
    let mut hooked_client = client(resources[1])?;
    let mut hooked = Vec::with_capacity(HOOKED_RUNS);
    for _ in 0..HOOKED_RUNS {
        let floor = floor(&mut hooked_client, sizes).await?;
        let took = allocate(&mut hooked_client, &request, resources[1], sizes).await?;
        hooked.push((took, floor));
    }
    let memory = wdp_bench::procfs::memory(host.pid()).ok();
    host.stop().await?;
    // Judged against the floor measured in this run, same client and socket: what Allocate
    // adds to a call that does nothing.
    let p99 = |samples: &[Duration]| {
        wdp_bench::stats::Summary::of(samples).map_or(Duration::ZERO, |s| s.p99)
    };
    let floor = p99(&plain_floor);
    report.push(Row::timed(
        "Allocate, no hook",
        &format!("p99 <= floor p99 + 100 µs ({})", human(floor + us(100))),
        &plain,
        |s| s.p99 <= floor + us(100),
        "1 container, 1 device; tonic client of the stand-in over the plugin's Unix socket",
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
                "`test_hooks` (renumber mode) in a fresh instance per call (pooled memory and stack), answer validated; the run's floor: p99 {} over {} GetDevicePluginOptions just before, same client",
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
        "the runs above, each against the floor measured just before it",
    ));
    report.push(Row::timed(
        "gRPC floor: GetDevicePluginOptions",
        "(reference)",
        &plain_floor,
        |_| true,
        "same socket and client as the row without a hook; a call that does no work",
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

/// The transport's floor on `client`: a call that does no work, after 50 unmeasured ones.
async fn floor(client: &mut PluginClient, sizes: &Sizes) -> Result<Vec<Duration>> {
    let mut floor = Vec::with_capacity(sizes.allocate_calls / 4);
    for i in 0..(sizes.allocate_calls / 4 + 50) {
        let t0 = Instant::now();
        client.get_device_plugin_options(api::Empty {}).await?;
        if i >= 50 {
            floor.push(t0.elapsed());
        }
    }
    Ok(floor)
}

/// `sizes.allocate_calls` timed Allocate calls of `request` on `client`, after a tenth as many
/// unmeasured ones.
async fn allocate(
    client: &mut PluginClient,
    request: &api::AllocateRequest,
    resource: &str,
    sizes: &Sizes,
) -> Result<Vec<Duration>> {
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
    Ok(took)
}
