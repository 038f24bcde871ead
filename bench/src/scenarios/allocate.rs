//! Allocate latency: kubelet's call over the plugin's Unix socket, answered by the host alone
//! or rewritten by a post-allocator guest in a fresh instance per call.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use wdp_bench::fixtures::{BenchFixture, generic_devices, scanner_yaml, write_config};
use wdp_bench::stats::human;
use wdp_kubelet::api;

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
    let memory = wdp_bench::procfs::memory(host.pid()).ok();
    host.stop().await?;
    let [(plain, plain_floor), (hooked, _)] =
        <[_; 2]>::try_from(results).map_err(|_| anyhow::anyhow!("two resources"))?;
    // Judged against the floor measured in this run, same client and socket: what Allocate
    // adds to a call that does nothing.
    let floor = wdp_bench::stats::Summary::of(&plain_floor).map_or(Duration::ZERO, |s| s.p99);
    report.push(Row::timed(
        "Allocate, no hook",
        &format!("p99 <= floor p99 + 100 µs ({})", human(floor + us(100))),
        &plain,
        |s| s.p99 <= floor + us(100),
        "1 container, 1 device; tonic client of the stand-in over the plugin's Unix socket",
    ));
    report.push(Row::timed(
        "Allocate, Rust post-allocator guest",
        &format!("p99 <= floor p99 + 250 µs ({})", human(floor + us(250))),
        &hooked,
        |s| s.p99 <= floor + us(250),
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
