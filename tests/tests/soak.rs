//! Soak: many kubelet restarts in a row, alternating a graceful stop and a crash (the stale
//! `kubelet.sock` left behind), with pods admitted, their containers restarted from kubelet's
//! checkpoint (CDI names resolved in the spec directory) and a ListAndWatch stream cut between
//! them. `make test` runs 20 restarts; `make soak` runs 200 (`WDP_SOAK_RESTARTS`) and writes
//! the report into bench/RESULTS.md (`WDP_SOAK_RESULTS`).

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
        write_results(Path::new(&path), &report, restarts);
    }
    assert_eq!((stale, unresolved, reallocated), (0, 0, 0), "{report}");
}

/// Replaces the `## Soak` section of bench/RESULTS.md (or adds it) with this run's figures.
fn write_results(path: &Path, report: &str, restarts: usize) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.find("\n## Soak\n");
    let kept = match start {
        Some(i) => {
            let rest = &text[i + 1..];
            let end = rest[8..].find("\n## ").map(|j| i + 1 + 8 + j);
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
        "\n## Soak\n\n`make soak` ({restarts} restarts), {now}, load average at the end {} (anything else the machine ran meanwhile counts in the times): {report}.\n",
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
