//! One device type with many devices (10,000 by default): a node appearing or going must still
//! reach ListAndWatch quickly, scan, diff and message included.

use std::time::{Duration, Instant};

use anyhow::Result;
use wdp_bench::fixtures::{self, BenchFixture, generic_devices, scanner_yaml, write_config};
use wdp_bench::stats::human;

use super::shared::{Ctx, expect, expect_log, guest, ms};
use super::sizes::Sizes;
use crate::e2e::{Jitter, kubelet};
use crate::report::{Report, Row};

/// What `wdp run` logs (at debug) once it handed back what loading made resident.
const HANDED_BACK: &str = "handed back what loading the config made resident";

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
    // The hand-back's debug line says when it happened.
    let host = ctx.launch(&f, &config, "info,wdp::cli::run=debug", &[])?;
    let long = Duration::from_secs(60);
    expect(&mut obs, &host, "bulk listed", long, |o| {
        o.count(BULK) == Some(n)
    })
    .await?;
    // Shortly after its start the host hands back what loading made resident, the code of the
    // change path among it (it ran for the first scan), which the next change reads back in. The
    // row is a change in steady state: measured from after the hand-back, and the first change
    // after it on a row of its own.
    expect_log(&host, HANDED_BACK, long).await?;
    let extra = format!("bulk/d{n}");
    let mut jitter = Jitter::new();
    // One node added, then removed again: the two changes' times to the stand-in's list.
    let mut cycle = async || -> Result<[Duration; 2]> {
        tokio::time::sleep(jitter.after_quiet_interval()).await;
        let t0 = Instant::now();
        f.char_dev(&extra, fixtures::BULK_MAJOR, n as u32);
        let at = expect(&mut obs, &host, "one more", long, |o| {
            o.count(BULK) == Some(n + 1)
        })
        .await?;
        let added = at - t0;
        tokio::time::sleep(jitter.after_quiet_interval()).await;
        let t0 = Instant::now();
        f.remove_dev(&extra);
        let at = expect(&mut obs, &host, "one fewer", long, |o| {
            o.count(BULK) == Some(n)
        })
        .await?;
        Ok([added, at - t0])
    };
    let first = cycle().await?;
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for _ in 0..sizes.bulk_cycles {
        let [added, removed] = cycle().await?;
        up.push(added);
        down.push(removed);
    }
    let mem = wdp_bench::procfs::memory(host.pid()).ok();
    host.stop().await?;
    let both: Vec<Duration> = up.iter().chain(&down).copied().collect();
    report.push(Row::timed(
        &format!("one type with {n} devices: scan -> diff -> ListAndWatch update"),
        "p50 <= 5 ms, p99 <= 10 ms",
        &both,
        |s| s.median <= ms(5) && s.p99 <= ms(10),
        "generic (`/dev/bulk/d*`, telling the host what changed: contract 0.1.2); a node added or removed, to the stand-in's decoded list; from after the start-up's hand-back, its first change not counted",
    ));
    report.push(Row::timed(
        &format!("one type with {n} devices: the first change after the start-up's hand-back"),
        "(no target)",
        &first,
        |_| true,
        "the node added, then removed: the change path's code read back in (the hand-back's trade-off, see the idle row)",
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
