//! kubelet's ListAndWatch stream ends while kubelet keeps running (a failed connection): kubelet
//! stops the endpoint, and only a new registration brings the resource back.

use std::time::Instant;

use anyhow::{Result, bail};

use super::shared::{Ctx, Demo, demo, expect, ms};
use super::sizes::Sizes;
use crate::e2e::Jitter;
use crate::report::{Report, Row};

/// Cuts the demo resources' streams one after another from the stand-in's side and times each
/// resource's new registration and its first list on the new stream.
pub async fn run(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== stream cut -> registered again (the demo config's 10 resources in turn) ==");
    let Demo {
        fixture: _fixture,
        resources,
        kubelet,
        mut obs,
        host,
        ..
    } = demo(ctx).await?;
    let (mut registered, mut listed) = (Vec::new(), Vec::new());
    let mut jitter = Jitter::new();
    for i in 0..sizes.stream_cuts {
        // Each resource's registration is then over a second old when it is cut again: a loss
        // on its own, which the host answers without its repeated-loss backoff.
        tokio::time::sleep(jitter.between(ms(150), ms(250))).await;
        let resource = &resources[i % resources.len()];
        let registrations = obs.registrations(resource);
        let t0 = Instant::now();
        if !kubelet.cut_stream(resource) {
            bail!("{resource} is not registered with the stand-in");
        }
        let t_reg = expect(&mut obs, &host, "registered again", ms(20_000), |o| {
            o.registrations(resource) > registrations
        })
        .await?;
        // The cut stream's end clears the list; the next one is the new stream's.
        let t_list = expect(&mut obs, &host, "listed again", ms(20_000), |o| {
            !o.any_ended() && o.all_streaming(&resources)
        })
        .await?;
        registered.push(t_reg - t0);
        listed.push(t_list - t0);
    }
    let log = host.log();
    host.stop().await?;
    kubelet.stop().await;
    report.details.push((
        "stream cuts".into(),
        format!(
            "{} cuts; host log over the run: {} \"registering again\" (one per cut expected).\n",
            registered.len(),
            log.matches("stream ended while it kept running; registering again")
                .count(),
        ),
    ));
    report.push(Row::timed(
        "ListAndWatch stream cut -> the resource registered again",
        "p99 <= 100 ms",
        &registered,
        |s| s.p99 <= ms(100),
        "`demo/wdp.yaml`; the stand-in ends one resource's stream (kubelet stops its endpoint), the host registers it again",
    ));
    report.push(Row::timed(
        "ListAndWatch stream cut -> listed on the new stream",
        "(no target)",
        &listed,
        |_| true,
        "same",
    ));
    Ok(())
}
