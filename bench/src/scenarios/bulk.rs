//! One device type with many devices (10,000 by default): a node appearing or going must still
//! reach ListAndWatch quickly, scan, diff and message included.

use std::time::{Duration, Instant};

use anyhow::Result;
use wdp_bench::fixtures::{self, BenchFixture, generic_devices, scanner_yaml, write_config};
use wdp_bench::stats::human;

use super::shared::{Ctx, expect, guest, ms};
use super::sizes::Sizes;
use crate::e2e::{Jitter, kubelet};
use crate::report::{Report, Row};

/// The resource the bulk fixture serves.
const BULK: &str = "bulk.wdp.dev/bulk";

/// One `generic` type over `sizes.bulk_devices` nodes; a node added or removed is timed to the
/// stand-in's decoded list.
pub async fn run(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    let n = sizes.bulk_devices;
    println!("\n== one type with {n} devices: a node appears or goes ==");
    let f = BenchFixture::new();
    let t = Instant::now();
    fixtures::bulk(&f, "bulk", n);
    println!("  ({n} nodes made in {})", human(t.elapsed()));
    let devices = generic_devices("bulk", "/dev/bulk/d*");
    let config = write_config(
        &f,
        &[scanner_yaml(
            "bulk",
            &guest("generic"),
            "bulk.wdp.dev",
            &[("DEVICES", devices.as_str())],
            None,
        )],
    );
    let (_kubelet, mut obs) = kubelet(&f.plugin_dir())?;
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
        tokio::time::sleep(jitter.after_quiet_interval()).await;
        let t0 = Instant::now();
        f.char_dev(&extra, fixtures::BULK_MAJOR, n as u32);
        let at = expect(&mut obs, &host, "one more", long, |o| {
            o.count(BULK) == Some(n + 1)
        })
        .await?;
        up.push(at - t0);
        tokio::time::sleep(jitter.after_quiet_interval()).await;
        let t0 = Instant::now();
        f.remove_dev(&extra);
        let at = expect(&mut obs, &host, "one fewer", long, |o| {
            o.count(BULK) == Some(n)
        })
        .await?;
        down.push(at - t0);
    }
    let mem = wdp_bench::procfs::memory(host.pid()).ok();
    host.stop().await?;
    let both: Vec<Duration> = up.iter().chain(&down).copied().collect();
    report.push(Row::timed(
        &format!("one type with {n} devices: scan -> diff -> ListAndWatch update"),
        "p50 <= 5 ms, p99 <= 10 ms",
        &both,
        |s| s.median <= ms(5) && s.p99 <= ms(10),
        "generic (`/dev/bulk/d*`, telling the host what changed: contract 0.1.2); a node added or removed, to the stand-in's decoded list",
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
