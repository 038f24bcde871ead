//! Soak: many kubelet restarts in a row, alternating a graceful stop and a crash (the stale
//! `kubelet.sock` left behind), with pods admitted, their containers restarted from kubelet's
//! checkpoint (CDI names resolved in the spec directory) and a ListAndWatch stream cut between
//! them. `make test` runs 20 restarts; `make soak` runs 200 (`WDP_SOAK_RESTARTS`) and writes
//! the report into bench/RESULTS.md (`WDP_SOAK_RESULTS`).
//!
//! The DRA soak: cycles of a DRA kubelet restart and a wdp restart (SIGTERM and SIGKILL in
//! turn), claims prepared and unprepared between them. `make test` runs 3 cycles; `make soak`
//! runs 200 (`WDP_SOAK_DRA_CYCLES`) and writes its report beside the other.

use std::path::Path;
use std::time::{Duration, Instant};

use wdp_kubelet::standin::StandIn;
use wdp_tests::fixture::Fixture;
use wdp_tests::guest;
use wdp_tests::host::{Host, Seen};

/// Pods admitted over the run, each asking for one device of every resource.
const PODS: usize = 4;

/// Nearest-rank percentile of sorted `d`.
fn pct(d: &[Duration], p: usize) -> Duration {
    d[((d.len() * p).div_ceil(100)).clamp(1, d.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Whether a container runtime finds CDI device `name` in the spec directory `cdi`.
fn resolves(cdi: &Path, name: &str) -> bool {
    let Some((kind, device)) = name.split_once('=') else {
        return false;
    };
    std::fs::read_dir(cdi)
        .into_iter()
        .flatten()
        .flatten()
        .any(|entry| {
            let Ok(bytes) = std::fs::read(entry.path()) else {
                return false;
            };
            let Ok(spec) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
                return false;
            };
            spec["kind"] == kind
                && spec["devices"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|d| d["name"] == device))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restarts_with_allocations_container_restarts_and_stream_cuts() {
    let restarts: usize = std::env::var("WDP_SOAK_RESTARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232).char_dev("net/tun", 10, 200);
    let cdi = f.path().join("cdi");
    let config = f.path().join("wdp.yaml");
    std::fs::write(
        &config,
        format!(
            "scanners:
  - name: kvm
    component: {}
    namespace: devices.example.com
    env: {{ SLOTS: {PODS}, RESCAN_INTERVAL_MS: 600000 }}
    cdi: {{ dir: {} }}
",
            guest("kvm").display(),
            cdi.display()
        ),
    )
    .unwrap();
    let plugins = f.path().join("plugins");
    let resources = ["devices.example.com/kvm", "devices.example.com/tun"];
    let (mut kubelet, observed) = StandIn::start(&plugins).unwrap();
    let host = Host::start(&config, &plugins, &f);
    let mut seen = Seen::new(observed);
    seen.all_listed(&resources).await;

    let (mut recovery, mut cut_recovery) = (Vec::new(), Vec::new());
    let (mut stale, mut replays, mut unresolved, mut reallocated) = (0, 0, 0, 0);
    let mut admitted = 0;
    for i in 0..restarts {
        // Pods: a new one now and then; every admitted one is re-admitted (kubelet after its
        // restart: no Allocate) and its container restarted from the checkpoint.
        if admitted < PODS && i % 3 == 0 {
            for r in resources {
                kubelet
                    .admit(&format!("pod-{admitted}"), "app", r, 1)
                    .await
                    .unwrap_or_else(|e| panic!("admit pod-{admitted} {r}: {e:?}"));
            }
            admitted += 1;
        }
        let calls = kubelet.allocate_calls();
        for p in 0..admitted {
            for r in resources {
                let pod = format!("pod-{p}");
                kubelet.admit(&pod, "app", r, 1).await.unwrap();
                let answer = kubelet.start_container(&pod, "app", r).await.unwrap();
                replays += 1;
                if !answer.cdi_devices.iter().all(|d| resolves(&cdi, &d.name)) {
                    unresolved += 1;
                }
            }
        }
        reallocated += kubelet.allocate_calls() - calls;

        // A stream cut: kubelet stops the endpoint, wdp registers again.
        let r = resources[i % resources.len()];
        let before = seen.registrations(r);
        let ends = seen.stream_ends(r);
        let t0 = Instant::now();
        assert!(kubelet.cut_stream(r));
        seen.until("registered again after a cut", |s| {
            s.registrations(r) > before && s.stream_ends(r) > ends
        })
        .await;
        cut_recovery.push(t0.elapsed());
        seen.all_listed(&resources).await;

        // The restart: graceful and crash in turn.
        if i % 2 == 0 {
            kubelet.stop().await;
        } else {
            kubelet.crash().await;
        }
        let t0 = Instant::now();
        let (k, observed) = StandIn::start(&plugins).unwrap();
        kubelet = k;
        seen = Seen::new(observed);
        // A registration still missing after 20 s fails the run here, naming the lists seen.
        seen.until("every resource registered and listed", |s| {
            resources
                .iter()
                .all(|r| s.registrations(r) > 0 && s.listed(r))
        })
        .await;
        recovery.push(t0.elapsed());
        stale += resources
            .iter()
            .filter(|r| kubelet.stopped(r) != Some(false))
            .count();
    }
    assert!(host.terminate().await.success());
    kubelet.stop().await;
    recovery.sort();
    cut_recovery.sort();
    let report = format!(
        "{restarts} kubelet restarts (graceful stop and crash in turn), {} resources, {admitted} pods: \
         lost registrations 0 (one missing for 20 s fails the run), stale endpoints {stale}, container restarts from the checkpoint {replays} \
         (CDI names not resolved: {unresolved}; Allocate calls on re-admission: {reallocated}); \
         restart -> all registered and listed p50 {} p99 {}; stream cut -> registered again p50 {} p99 {}",
        resources.len(),
        ms(pct(&recovery, 50)),
        ms(pct(&recovery, 99)),
        ms(pct(&cut_recovery, 50)),
        ms(pct(&cut_recovery, 99)),
    );
    eprintln!("soak: {report}");
    if let Ok(path) = std::env::var("WDP_SOAK_RESULTS") {
        write_results(
            Path::new(&path),
            "Soak",
            &format!("`make soak` ({restarts} restarts)"),
            &report,
        );
    }
    assert_eq!((stale, unresolved, reallocated), (0, 0, 0), "{report}");
}

/// Replaces the `## <title>` section of bench/RESULTS.md (or adds it) with this run's figures,
/// `what` saying which run they are from.
fn write_results(path: &Path, title: &str, what: &str, report: &str) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let heading = format!("\n## {title}\n");
    let start = text.find(&heading);
    let kept = match start {
        Some(i) => {
            let skip = heading.len() - 1;
            let rest = &text[i + 1..];
            let end = rest[skip..].find("\n## ").map(|j| i + 1 + skip + j);
            let mut t = text[..i].to_string();
            if let Some(e) = end {
                t.push_str(&text[e..]);
            }
            t
        }
        None => text,
    };
    let now = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let section = format!(
        "\n## {title}\n\n{what}, {now}, load average at the end {} (anything else the machine ran meanwhile counts in the times): {report}.\n",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    std::fs::write(
        path,
        format!(
            "{}{section}",
            kept.trim_end_matches('\n').to_string() + "\n"
        ),
    )
    .unwrap();
}

/// Devices of the DRA soak's driver (kvm slots): claims take turns on them.
const DRA_DEVICES: usize = 4;

/// The DRA soak: each cycle restarts wdp (SIGTERM and SIGKILL in turn) and reads the checkpoint
/// it left on disk (no claim lost, none kept after its unprepare, no device in two claims),
/// restarts the DRA kubelet stand-in, which prepares every held claim again (each answered as
/// its first Prepare was), then prepares a new claim on a free device, tries a claim on a held
/// one (refused), and unprepares the oldest claim once three are held. Any break fails the run
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_kubelet_and_wdp_restarts_with_claims_prepared_and_unprepared() {
    use crate::dra::{
        DRIVER, KubeletDirs, NODE, allocated, checkpointed, claim_ref, in_two_claims,
        until_published,
    };
    use std::collections::BTreeMap;
    use wdp_dra::apiserver::standin::ApiServerStandIn;
    use wdp_dra::kubelet::KubeletStandIn;
    use wdp_dra::plugin::ClaimRef;
    use wdp_dra::proto::dra_v1::Device;

    let cycles: usize = std::env::var("WDP_SOAK_DRA_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let dirs = KubeletDirs::new(&f);
    let api = ApiServerStandIn::start().await.unwrap();
    let env = format!("SLOTS: {DRA_DEVICES}, RESCAN_INTERVAL_MS: 600000");
    let config = crate::dra::kvm_config(&f, &dirs, &api, &env, "");
    let plugins = f.plugin_dir();
    let devices: Vec<String> = (0..DRA_DEVICES).map(|i| format!("kvm-{i}")).collect();
    let devices: Vec<&str> = devices.iter().map(String::as_str).collect();
    let mut kubelet = KubeletStandIn::start(&dirs.registry, &api, NODE);
    let mut host = Host::start(&config, &plugins, &f);
    kubelet
        .registered(DRIVER, Duration::from_secs(20))
        .await
        .expect("registered");

    // Held claims, oldest first: (claim, device, the first answer).
    let mut held: Vec<(ClaimRef, String, Vec<Device>)> = Vec::new();
    let (mut prepares, mut repeats, mut unprepares, mut refused) = (0usize, 0usize, 0usize, 0usize);
    let (mut kills, mut terms, mut kubelet_restarts) = (0usize, 0usize, 0usize);
    let mut cycle_times = Vec::with_capacity(cycles);
    for i in 0..cycles {
        let t0 = Instant::now();
        // wdp restarts, a graceful stop and a crash in turn; while it is down the checkpoint
        // on disk holds the held claims, only, and no device twice.
        if i % 2 == 0 {
            assert!(host.terminate().await.success(), "cycle {i}");
            terms += 1;
        } else {
            host.kill().await;
            kills += 1;
        }
        let on_disk = checkpointed(&dirs);
        let want: BTreeMap<String, Vec<String>> = held
            .iter()
            .map(|(c, d, _)| (c.uid.clone(), vec![format!("{NODE}/{d}")]))
            .collect();
        assert_eq!(
            on_disk, want,
            "cycle {i}: the checkpoint holds the held claims, only"
        );
        assert_eq!(in_two_claims(&on_disk), Vec::<String>::new(), "cycle {i}");
        host = Host::start(&config, &plugins, &f);

        // kubelet restarts (it wipes the node's slices), and prepares every held claim again:
        // the same answers.
        kubelet.stop();
        kubelet = KubeletStandIn::start(&dirs.registry, &api, NODE);
        kubelet_restarts += 1;
        kubelet
            .registered(DRIVER, Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("cycle {i}: registered with the new kubelet"));
        check_prepared(&kubelet, &held, i, "after wdp and kubelet restarted").await;
        repeats += held.len();

        // Published again by this wdp, so its inventory is in: a new claim on a free device.
        until_published(&api, &devices).await;
        let free = devices
            .iter()
            .find(|d| held.iter().all(|(_, h, _)| h != *d))
            .unwrap_or_else(|| panic!("cycle {i}: no free device"));
        let claim = claim_ref(&api.insert_claim(allocated(&format!("c{i}"), "kvm", free)));
        let answer = kubelet
            .prepare(DRIVER, std::slice::from_ref(&claim))
            .await
            .unwrap();
        let got = &answer[&claim.uid];
        assert_eq!(got.error, "", "cycle {i}: prepare {}", claim.name);
        assert_eq!(got.devices.len(), 1, "cycle {i}");
        assert_eq!(got.devices[0].device_name, *free, "cycle {i}");
        held.push((claim, free.to_string(), got.devices.clone()));
        prepares += 1;

        // A claim on a held device is refused; the oldest claim goes once three are held.
        let (_, taken, _) = &held[i % held.len()];
        let thief = claim_ref(&api.insert_claim(allocated(&format!("thief{i}"), "kvm", taken)));
        let answer = kubelet
            .prepare(DRIVER, std::slice::from_ref(&thief))
            .await
            .unwrap();
        assert!(
            answer[&thief.uid].error.contains("held by"),
            "cycle {i}: {taken} given twice: {answer:?}"
        );
        refused += 1;
        if held.len() >= 3 {
            let (gone, ..) = held.remove(0);
            let out = kubelet.unprepare(DRIVER, &[gone, thief]).await.unwrap();
            assert!(out.values().all(String::is_empty), "cycle {i}: {out:?}");
            unprepares += 1;
        }
        cycle_times.push(t0.elapsed());
    }
    assert!(host.terminate().await.success());
    kubelet.stop();
    let total: Duration = cycle_times.iter().sum();
    cycle_times.sort();
    let report = format!(
        "{cycles} cycles, each a DRA kubelet restart and a wdp restart ({terms} SIGTERM, {kills} SIGKILL; \
         {kubelet_restarts} kubelet restarts), {DRA_DEVICES} devices: {prepares} claims prepared, \
         {repeats} repeated Prepares each answered as the first, {unprepares} unprepared, {refused} claims on a held device refused; \
         failures 0 (a claim lost from or left in the checkpoint, a device in two claims or another answer fails the run); \
         per cycle p50 {} p99 {}, {:.1} s in all",
        ms(pct(&cycle_times, 50)),
        ms(pct(&cycle_times, 99)),
        total.as_secs_f64(),
    );
    eprintln!("DRA soak: {report}");
    if let Ok(path) = std::env::var("WDP_SOAK_RESULTS") {
        write_results(
            Path::new(&path),
            "DRA soak",
            &format!("`make soak` ({cycles} DRA cycles)"),
            &report,
        );
    }
}

/// Prepares every claim of `held` again, one call each, failing the run unless each answer is
/// its first.
async fn check_prepared(
    kubelet: &wdp_dra::kubelet::KubeletStandIn,
    held: &[(
        wdp_dra::plugin::ClaimRef,
        String,
        Vec<wdp_dra::proto::dra_v1::Device>,
    )],
    cycle: usize,
    when: &str,
) {
    for (claim, _, first) in held {
        let answer = kubelet
            .prepare(crate::dra::DRIVER, std::slice::from_ref(claim))
            .await
            .unwrap_or_else(|e| panic!("cycle {cycle}, {when}: prepare {}: {e}", claim.name));
        let got = &answer[&claim.uid];
        assert_eq!(
            (got.error.as_str(), &got.devices),
            ("", first),
            "cycle {cycle}, {when}: {} answered otherwise",
            claim.name
        );
    }
}
