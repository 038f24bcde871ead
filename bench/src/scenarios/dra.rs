//! DRA mode: how long a scan takes to reach the API server's ResourceSlices, and how long
//! kubelet's NodePrepareResources takes, for the hot-plug rows' fixture (the `generic` scanner
//! over `/dev/ttyUSB*`) served with `frontend: dra`.
//!
//! `wdp run` publishes to `wdp_dra`'s API server stand-in over real HTTP on loopback (every slice
//! validated by the API's rules on the way in) and serves the DRA socket to its kubelet stand-in
//! (real gRPC over the Unix socket, one connection kept, as kubelet keeps). A slice change is
//! timed from the mknod/unlink to the stand-in storing the slice, through its change notifier
//! (no polling); a Prepare from kubelet's call to its answer, which includes wdp reading the
//! claim from the API server.
//!
//! The CDI specs go to a tmpfs, as on a node (`/var/run/cdi` is below `/run`); the claim
//! checkpoint stays on the temporary directory's disk, as kubelet's plugins directory does.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use wdp_bench::fixtures::{BenchFixture, generic_devices, scanner_yaml, tmpfs};
use wdp_dra::apiserver::standin::{ApiServerStandIn, allocated_claim};
use wdp_dra::kubelet::KubeletStandIn;
use wdp_dra::plugin::ClaimRef;

use super::shared::{Ctx, guest};
use super::sizes::Sizes;
use crate::e2e::Jitter;
use crate::report::{Report, Row};

/// The driver (and namespace) served.
const DRIVER: &str = "bench.wdp.dev";
/// The node, and so the pool.
const NODE: &str = "bench-node";

/// The raw ids (the `id` attribute: `ttyUSB0` is no DNS label, so not the name) of the devices
/// the API server's slices of the driver hold, sorted.
fn published(api: &ApiServerStandIn) -> Vec<String> {
    let mut names: Vec<String> = api
        .slices()
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .filter_map(|d| d.attributes?.get("id")?.string.clone())
        .collect();
    names.sort();
    names
}

/// Waits until the driver's slices hold exactly `want`; the instant the change was stored.
async fn until_published(api: &ApiServerStandIn, want: &[&str], what: &str) -> Result<Instant> {
    let mut changes = api.changes();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        changes.borrow_and_update();
        if published(api) == want {
            return Ok(Instant::now());
        }
        tokio::time::timeout_at(deadline, changes.changed())
            .await
            .with_context(|| format!("{what}: not in the slices within 30 s"))?
            .context("the API server stand-in stopped")?;
    }
}

/// The DRA rows: a node appearing and going, each to the slice that shows it; and
/// NodePrepareResources of a new claim (read from the API server, checked, checkpointed) and of
/// one already prepared (answered from the checkpoint).
pub async fn run(ctx: &Ctx, sizes: &Sizes, report: &mut Report) -> Result<()> {
    println!("\n== DRA mode: scan -> ResourceSlice, NodePrepareResources ==");
    let f = BenchFixture::new();
    f.char_dev("ttyUSB0", 188, 0);
    let api = ApiServerStandIn::start().await?;
    let cdi = f.path().join("cdi");
    let _cdi_tmpfs = tmpfs(&cdi, "CDI specs (fsync included)")?;
    let kubelet_dir = f.path().join("kubelet");
    let registry = kubelet_dir.join("plugins_registry");
    std::fs::create_dir_all(&registry)?;
    let devices = generic_devices("serial", "/dev/ttyUSB*");
    let mut entry = scanner_yaml(
        "serial",
        &guest("generic"),
        DRIVER,
        &[("DEVICES", devices.as_str())],
        None,
    );
    entry.push_str(&format!(
        "    cdi: {{ dir: {} }}\n    frontend: dra\n",
        cdi.display()
    ));
    let config = f.write_config(&format!(
        "scanners:\n{entry}node:\n  name: {NODE}\n  plugins-dir: {}\n  plugins-registry-dir: {}\n  api-server: http://{}\n",
        kubelet_dir.join("plugins").display(),
        registry.display(),
        api.addr()
    ));
    let kubelet = KubeletStandIn::start(&registry, &api, NODE);
    let host = ctx.start(&f, &config)?;
    if let Err(e) = until_published(&api, &["ttyUSB0"], "ttyUSB0").await {
        anyhow::bail!("{e:#}; the host's log:\n{}", host.log_tail(20));
    }
    kubelet
        .registered(DRIVER, Duration::from_secs(30))
        .await
        .context("the driver did not register")?;

    let mut jitter = Jitter::new();
    let (mut plug, mut unplug) = (Vec::new(), Vec::new());
    for _ in 0..sizes.hotplug_cycles {
        tokio::time::sleep(jitter.after_quiet_interval()).await;
        let t0 = Instant::now();
        f.char_dev("ttyUSB1", 188, 1);
        let at = until_published(&api, &["ttyUSB0", "ttyUSB1"], "ttyUSB1 plugged").await?;
        plug.push(at - t0);
        tokio::time::sleep(jitter.after_quiet_interval()).await;
        let t0 = Instant::now();
        f.remove_dev("ttyUSB1");
        let at = until_published(&api, &["ttyUSB0"], "ttyUSB1 unplugged").await?;
        unplug.push(at - t0);
    }

    // The device's name in the pool, which the scheduler's allocation names.
    let device = api
        .slices()
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .map(|d| d.name)
        .next()
        .context("no device published")?;
    // Each claim new (its own name and UID), unprepared after so the device is free again.
    let calls = sizes.allocate_calls / 4;
    let warmup = calls / 10;
    let (mut fresh, mut repeated) = (Vec::new(), Vec::new());
    for i in 0..(calls + warmup) {
        let name = format!("bench-{i}");
        let claim = allocated_claim("default", &name, DRIVER, NODE, &[("serial", &device)]);
        let stored = api.insert_claim(claim);
        let reference = ClaimRef {
            namespace: "default".into(),
            uid: stored.metadata.uid.clone().unwrap_or_default(),
            name: stored.metadata.name.clone().unwrap_or_default(),
        };
        let claims = [reference];
        let t0 = Instant::now();
        let answer = kubelet.prepare(DRIVER, &claims).await?;
        let first = t0.elapsed();
        let t0 = Instant::now();
        let again = kubelet.prepare(DRIVER, &claims).await?;
        let second = t0.elapsed();
        let entry = answer
            .get(&claims[0].uid)
            .context("no answer for the claim")?;
        ensure!(
            entry.error.is_empty() && entry.devices.len() == 1 && again == answer,
            "unexpected NodePrepareResources answer {answer:?} then {again:?}"
        );
        let out = kubelet.unprepare(DRIVER, &claims).await?;
        ensure!(
            out.values().all(String::is_empty),
            "NodeUnprepareResources failed: {out:?}"
        );
        if i >= warmup {
            fresh.push(first);
            repeated.push(second);
        }
    }
    host.stop().await?;

    let how = "generic scanner (`/dev/ttyUSB*`), `frontend: dra`, `wdp run` + API server stand-in (HTTP, slices validated) + DRA kubelet stand-in";
    report.push(Row::timed(
        "DRA: node appears -> ResourceSlice has it",
        "(no target)",
        &plug,
        |_| true,
        how,
    ));
    report.push(Row::timed(
        "DRA: node removed -> ResourceSlice without it",
        "(no target)",
        &unplug,
        |_| true,
        "same",
    ));
    report.push(Row::timed(
        "DRA: NodePrepareResources, new claim",
        "(no target)",
        &fresh,
        |_| true,
        "1 claim, 1 device; includes wdp's GET of the claim and the checkpoint's atomic write",
    ));
    report.push(Row::timed(
        "DRA: NodePrepareResources, claim already prepared",
        "(no target)",
        &repeated,
        |_| true,
        "the same claim again: answered from the checkpoint",
    ));
    Ok(())
}
