//! kubelet restarts: kubelet deletes every socket in its plugin directory and comes back; the
//! host must notice and register all its resources again.

use std::time::Instant;

use anyhow::Result;
use wdp_bench::stats::human;

use super::shared::{Ctx, Demo, demo, expect, ms};
use super::sizes::Sizes;
use crate::e2e::Jitter;
use crate::report::{Report, Row};

/// Restarts the stand-in under a host serving the demo configuration and times every
/// resource's registration and first list.
pub async fn run(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== kubelet restart -> the demo config's 10 resources registered again ==");
    let Demo {
        fixture: _fixture,
        resources,
        dir,
        mut kubelet,
        mut obs,
        host,
    } = demo(ctx).await?;
    let (mut registered, mut listed) = (Vec::new(), Vec::new());
    let mut jitter = Jitter::new();
    for _ in 0..sizes.restarts {
        tokio::time::sleep(jitter.between(ms(20), ms(60))).await;
        kubelet.stop().await;
        let t0 = Instant::now();
        // StandIn::start deletes every socket in the directory first, as kubelet does.
        let (k, rx) = wdp_kubelet::standin::StandIn::start(&dir)?;
        kubelet = k;
        obs.replace(rx);
        let t_reg = expect(&mut obs, &host, "all registered", ms(20_000), |o| {
            o.all_registered(&resources)
        })
        .await?;
        let t_list = expect(&mut obs, &host, "all listed", ms(20_000), |o| {
            o.all_streaming(&resources)
        })
        .await?;
        registered.push(t_reg - t0);
        listed.push(t_list - t0);
    }
    let log = host.log();
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
