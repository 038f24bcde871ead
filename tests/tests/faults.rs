//! Host-side faults: each gives a clear log line, no crash, and recovery once the fault is gone;
//! a kubelet restarting in the middle of a call leaves nothing behind that kubelet and the disk
//! disagree on.

use std::collections::BTreeMap;
use std::time::Duration;

use wdp_kubelet::api::Empty;
use wdp_kubelet::standin::StandIn;
use wdp_tests::fixture::{Fixture, Tmpfs};
use wdp_tests::host::{Host, Seen, serve};
use wdp_tests::{EVENT_TIMEOUT, eventually, eventually_within, guest};

fn kvm_config(f: &Fixture) -> std::path::PathBuf {
    let path = f.path().join("wdp.yaml");
    std::fs::write(
        &path,
        format!(
            "scanners:\n  - name: kvm\n    component: {}\n    namespace: devices.example.com\n    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}\n",
            guest("kvm").display()
        ),
    )
    .unwrap();
    path
}

fn setup() -> (Fixture, std::path::PathBuf, std::path::PathBuf) {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let plugins = f.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let config = kvm_config(&f);
    (f, plugins, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_socket_missing_at_start() {
    let (f, plugins, config) = setup();
    let host = Host::start(&config, &plugins, &f);
    host.logged("kubelet socket absent; waiting for it", 1)
        .await;
    let (kubelet, seen) = StandIn::start(&plugins).unwrap();
    Seen::new(seen)
        .devices("devices.example.com/kvm", &["kvm-0"])
        .await;
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// A "kubelet" that accepts connections and never answers: registration must not hang for
/// ever, and a real kubelet appearing afterwards is registered with at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_that_never_answers_register() {
    let (f, plugins, config) = setup();
    let socket = plugins.join("kubelet.sock");
    let mute = tokio::net::UnixListener::bind(&socket).unwrap();
    let (dialed, mut dials) = tokio::sync::watch::channel(0usize);
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((conn, _)) = mute.accept().await {
            conns.push(conn); // hold, never speak
            dialed.send_replace(conns.len());
        }
    });
    let host = Host::start(&config, &plugins, &f);
    // The host dials the mute kubelet and waits for Register's answer.
    tokio::time::timeout(EVENT_TIMEOUT, dials.wait_for(|n| *n > 0))
        .await
        .expect("the host dials the mute kubelet")
        .unwrap();
    held.abort();
    // The real kubelet replaces the mute one (it removes the old socket as kubelet does).
    std::fs::remove_file(&socket).unwrap();
    let started = std::time::Instant::now();
    let (kubelet, seen) = StandIn::start(&plugins).unwrap();
    Seen::new(seen)
        .devices("devices.example.com/kvm", &["kvm-0"])
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "registration waited out the mute kubelet: {:?}",
        started.elapsed()
    );
    host.logged("registered with kubelet", 1).await;
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// kubelet dropping ListAndWatch streams at random moments: each new stream gets the full list
/// at once, and a long-lived stream keeps receiving updates throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_closed_at_random() {
    let (f, plugins, config) = setup();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("devices.example.com/kvm", &["kvm-0"]).await;
    let client = kubelet.client("devices.example.com/kvm").unwrap();
    // A deterministic "random" schedule (xorshift), so a failure reproduces.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for round in 0..40 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut c = client.clone();
        let mut stream = c.list_and_watch(Empty {}).await.unwrap().into_inner();
        let first = tokio::time::timeout(EVENT_TIMEOUT, stream.message())
            .await
            .expect("first list in time")
            .unwrap()
            .expect("a list");
        assert_eq!(first.devices.len(), 1, "round {round}");
        tokio::time::sleep(Duration::from_millis(x % 20)).await;
        drop(stream); // closed at a random moment
    }
    // The stand-in's own stream saw none of that: a hot-plug still reaches it.
    f.char_dev("fuse", 10, 229);
    seen.devices("devices.example.com/fuse", &["fuse-0"]).await;
    let r = kubelet
        .allocate("devices.example.com/kvm", &["kvm-0"])
        .await
        .unwrap();
    assert_eq!(r.container_responses[0].devices[0].host_path, "/dev/kvm");
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// The plugin directory becomes read-only: the socket cannot be created; once writable again,
/// the resource is served and registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_dir_not_writable() {
    let (f, plugins, config) = setup();
    let Some(tmpfs) = Tmpfs::mount(&plugins, "rw,size=1m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root with mount rights)");
        return;
    };
    let remount = |opts: &str| assert!(tmpfs.remount(opts), "remount {opts}");
    let (kubelet, seen) = StandIn::start(&plugins).unwrap();
    let mut seen = Seen::new(seen);
    remount("ro");
    let host = Host::start(&config, &plugins, &f);
    host.logged("cannot listen; retrying", 1).await;
    assert!(
        host.log().contains("Read-only file system"),
        "{}",
        host.log()
    );
    remount("rw");
    seen.devices("devices.example.com/kvm", &["kvm-0"]).await;
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// The config file deleted while running: nothing changes; the host still serves and still
/// follows a kubelet restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_deleted_while_running() {
    let (f, plugins, config) = setup();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("devices.example.com/kvm", &["kvm-0"]).await;
    std::fs::remove_file(&config).unwrap();
    kubelet.stop().await;
    let (kubelet, seen) = StandIn::start(&plugins).unwrap();
    Seen::new(seen)
        .devices("devices.example.com/kvm", &["kvm-0"])
        .await;
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// Components that cannot run are refused before anything starts, naming scanner and file.
#[test]
fn components_that_are_not_scanners_are_refused_at_start() {
    let (f, plugins, _) = setup();
    let not_wasm = f.path().join("notes.wasm");
    std::fs::write(&not_wasm, "this is not wasm").unwrap();
    // The smallest valid core module: header and version, no sections.
    let core_module = f.path().join("core.wasm");
    std::fs::write(&core_module, b"\0asm\x01\0\0\0").unwrap();
    for (component, needle) in [
        (
            not_wasm.clone(),
            "notes.wasm is not a valid wasm component: it is not WebAssembly at all",
        ),
        (
            core_module,
            "core.wasm is not a valid wasm component: it is a core wasm module (build it for wasm32-wasip2, or wrap it with `wasm-tools component new`)",
        ),
        (
            guest("test_hooks"),
            "does not export wdp:device-plugin/scanner",
        ),
    ] {
        let config = f.path().join("bad.yaml");
        std::fs::write(
            &config,
            format!(
                "scanners:\n  - name: odd\n    component: {}\n    namespace: x.example.com\n",
                component.display()
            ),
        )
        .unwrap();
        let out = wdp_tests::wdp_run_to_exit(&f, &config);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("scanner odd") && err.contains(needle), "{err}");
        // One line, the cause said once (no parser dump, no chain repeating the message).
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(wdp_tests::host::sockets(&plugins).is_empty());
    }
}

/// kubelet restarted while wdp is in the middle of a NodePrepareResources (the API server holds
/// wdp's read of the call's second claim, so the call is stopped there, after the first claim
/// was prepared, for as long as the test needs): kubelet's call and connection go. A call that
/// went with its kubelet leaves the checkpoint as it was: another pod's Prepare of the first
/// claim alone is answered only once that claim is on disk. The retried Prepare gets the same
/// answer, the checkpoint holds each claim once and no device twice, a crash and restart of
/// wdp changes no answer, and once unprepared nothing is left (checkpoint entries, CDI specs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restarted_during_node_prepare_resources() {
    use crate::dra::{DRIVER, NODE, allocated, cdi_specs, checkpointed, claim_ref, in_two_claims};
    use wdp_dra::kubelet::{KubeletStandIn, Options};
    let (f, dirs, api, config) = crate::dra::setup().await;
    let plugins = f.plugin_dir();
    let (kubelet, dp_kubelet, _, host) =
        crate::dra::serve_registered(&f, &dirs, &api, &config, Options::default()).await;
    let specs = cdi_specs(&f.path().join("cdi"));
    assert!(!specs.is_empty(), "the CDI specs of kvm-0 and kvm-1");
    let a = api.insert_claim(allocated("a", "kvm", "kvm-0"));
    let b = api.insert_claim(allocated("b", "kvm", "kvm-1"));
    let uid = |c: &k8s_openapi::api::resource::v1::ResourceClaim| c.metadata.uid.clone().unwrap();
    let (ua, ub) = (uid(&a), uid(&b));

    // One Prepare of both, stopped at its read of b: a is prepared by then.
    api.hold_claim_read("default", "b");
    let kubelet = std::sync::Arc::new(kubelet);
    let call = {
        let kubelet = kubelet.clone();
        let claims = [claim_ref(&a), claim_ref(&b)];
        tokio::spawn(async move { kubelet.prepare(DRIVER, &claims).await })
    };
    eventually("wdp in the middle of the Prepare", || async {
        (api.claim_reads_held() == 1).then_some(())
    })
    .await;
    // kubelet goes: its call is abandoned and its connection closed.
    call.abort();
    assert!(call.await.expect_err("abandoned").is_cancelled());
    let Ok(kubelet) = std::sync::Arc::try_unwrap(kubelet) else {
        panic!("the abandoned call still holds the stand-in");
    };
    kubelet.stop();
    assert_eq!(checkpointed(&dirs), BTreeMap::new(), "nothing answered");

    let kubelet = KubeletStandIn::start(&dirs.registry, &api, NODE);
    kubelet
        .registered(DRIVER, EVENT_TIMEOUT)
        .await
        .expect("registered with the new kubelet");
    // Another pod sharing claim a asks for it alone: its answer is on disk when it comes.
    let alone = kubelet.prepare(DRIVER, &[claim_ref(&a)]).await.unwrap();
    assert_eq!(alone[&ua].error, "");
    assert_eq!(alone[&ua].devices[0].device_name, "kvm-0");
    assert_eq!(
        checkpointed(&dirs),
        BTreeMap::from([(ua.clone(), vec![format!("{NODE}/kvm-0")])]),
        "a claim answered is a claim on disk"
    );

    // kubelet retries the first pod's Prepare: the same answer for a, b prepared, each once.
    let retried = kubelet
        .prepare(DRIVER, &[claim_ref(&a), claim_ref(&b)])
        .await
        .unwrap();
    assert_eq!(retried[&ua], alone[&ua], "the same answer");
    assert_eq!(retried[&ub].error, "");
    assert_eq!(retried[&ub].devices[0].device_name, "kvm-1");
    let held = checkpointed(&dirs);
    let uids: std::collections::BTreeSet<&String> = held.keys().collect();
    assert_eq!(uids, [&ua, &ub].into(), "each claim once");
    assert_eq!(in_two_claims(&held), Vec::<String>::new());
    let thief = api.insert_claim(allocated("thief", "kvm", "kvm-0"));
    let refused = kubelet.prepare(DRIVER, &[claim_ref(&thief)]).await.unwrap();
    assert!(
        refused[&uid(&thief)].error.contains("held by"),
        "{refused:?}"
    );

    // wdp crashes and comes back (its stale registration socket replaced by a new one): the
    // same answers, from the checkpoint.
    let registrations = kubelet.registrations(DRIVER);
    host.kill().await;
    let host = Host::start(&config, &plugins, &f);
    eventually("the driver registered again", || async {
        (kubelet.registrations(DRIVER) > registrations).then_some(())
    })
    .await;
    let after = kubelet
        .prepare(DRIVER, &[claim_ref(&a), claim_ref(&b)])
        .await
        .unwrap();
    assert_eq!(after, retried, "one answer across a wdp crash");
    assert_eq!(checkpointed(&dirs), held);

    // Unprepared: nothing left behind.
    let out = kubelet
        .unprepare(DRIVER, &[claim_ref(&a), claim_ref(&b), claim_ref(&thief)])
        .await
        .unwrap();
    assert!(out.values().all(String::is_empty), "{out:?}");
    assert_eq!(checkpointed(&dirs), BTreeMap::new());
    assert_eq!(
        cdi_specs(&f.path().join("cdi")),
        specs,
        "the CDI specs as before"
    );
    api.release_claim_reads();
    assert!(host.terminate().await.success());
    dp_kubelet.stop().await;
}

/// kubelet restarted while wdp is in the middle of an Allocate (the post-allocate hook holds it
/// until /dev/open appears): kubelet's call and connection go. The new kubelet gets the
/// resource registered again, its retried Allocate succeeds with the answer an uninterrupted
/// one gives, its checkpoint holds the pod once, the next pod gets the other device, and the
/// CDI specs are as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restarted_during_an_allocate() {
    let f = Fixture::new();
    f.char_dev("gate/a", 10, 240).char_dev("gate/b", 10, 241);
    let cdi = f.path().join("cdi");
    let config = f.write_config(&format!(
        "scanners:
  - name: gate
    component: {gate}
    post-allocator: {gate}
    namespace: devices.example.com
    env: {{ HOLD: open }}
    limits: {{ call-timeout: 600s }}
    cdi: {{ dir: {cdi} }}
",
        gate = guest("test_gate").display(),
        cdi = cdi.display(),
    ));
    let plugins = f.plugin_dir();
    let resource = "devices.example.com/gate";
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices(resource, &["a", "b"]).await;
    let specs = crate::dra::cdi_specs(&cdi);
    assert!(!specs.is_empty());

    let kubelet = std::sync::Arc::new(kubelet);
    let call = {
        let kubelet = kubelet.clone();
        tokio::spawn(async move { kubelet.admit("pod", "app", resource, 1).await })
    };
    host.logged("post-allocate holding until /dev/open appears", 1)
        .await;
    call.abort();
    assert!(call.await.expect_err("abandoned").is_cancelled());
    let Ok(kubelet) = std::sync::Arc::try_unwrap(kubelet) else {
        panic!("the abandoned call still holds the stand-in");
    };
    kubelet.crash().await;

    let (kubelet, observed) = StandIn::start(&plugins).unwrap();
    seen.replace(observed);
    seen.devices(resource, &["a", "b"]).await;
    f.char_dev("open", 10, 242);
    let answer = kubelet
        .admit("pod", "app", resource, 1)
        .await
        .expect("the retried Allocate");
    assert_eq!(
        wdp_tests::node_specs(&answer),
        [("/dev/gate/a", "/dev/gate/a", "rw")]
    );
    assert!(
        answer
            .cdi_devices
            .iter()
            .all(|d| wdp_tests::resolve_cdi(&cdi, &d.name).is_some()),
        "{answer:?}"
    );
    assert_eq!(kubelet.allocate_calls(), 1);
    let next = kubelet.admit("pod-2", "app", resource, 1).await.unwrap();
    assert_eq!(
        wdp_tests::node_specs(&next),
        [("/dev/gate/b", "/dev/gate/b", "rw")],
        "the interrupted call took no device"
    );
    assert_eq!(
        crate::dra::cdi_specs(&cdi),
        specs,
        "the CDI specs as before"
    );
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// The scanners that failed, in order, from a log: (scanner, when, announced restart delay).
fn failures(log: &str) -> Vec<(String, std::time::SystemTime, Duration)> {
    log.lines()
        .filter(|l| l.contains("scanner failed"))
        .filter_map(|line| {
            let when = humantime::parse_rfc3339(line.split_whitespace().next()?).ok()?;
            let scanner = line.split("scanner=\"").nth(1)?.split('"').next()?;
            let delay = line.split("restart_in=Some(").nth(1)?.split(')').next()?;
            Some((
                scanner.to_string(),
                when,
                humantime::parse_duration(delay).ok()?,
            ))
        })
        .collect()
}

/// Twelve scanners trapping at the same moment while serving (each traps while /dev/trap
/// exists, at once when restarted): each is restarted with the documented backoff (1 s,
/// doubling; the log's restart delays and times say so, and `wdp_scanner_restarts_total`
/// agrees), never in a tight loop; kubelet keeps every device they served, healthy and
/// allocatable, meanwhile; and when the trap is gone they serve again (a device plugged in
/// afterwards reaches kubelet through each of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_scanners_trapping_at_once() {
    const SCANNERS: usize = 12;
    /// Failures of each scanner seen while the trap holds: restarts after 1, 2 and 4 s.
    const FAILURES: usize = 4;
    let f = Fixture::new();
    f.char_dev("gate/a", 10, 240);
    let mut config = String::from("scanners:\n");
    for i in 0..SCANNERS {
        config.push_str(&format!(
            "  - name: s{i}\n    component: {}\n    namespace: s{i}.example.com\n    env: {{ TRAP: trap }}\n",
            guest("test_gate").display()
        ));
    }
    let config = f.write_config(&config);
    let plugins = f.plugin_dir();
    let (kubelet, observed) = StandIn::start(&plugins).unwrap();
    let host = Host::start_with(&config, &plugins, &f, &["--metrics-addr", "127.0.0.1:0"]);
    let metrics = host.metrics_addr().await;
    let mut seen = Seen::new(observed);
    let resources: Vec<String> = (0..SCANNERS)
        .map(|i| format!("s{i}.example.com/gate"))
        .collect();
    for r in &resources {
        seen.devices(r, &["a"]).await;
    }

    f.char_dev("trap", 10, 241);
    let per_scanner = |log: &str| {
        let all = failures(log);
        (0..SCANNERS)
            .map(|i| {
                let name = format!("s{i}");
                all.iter()
                    .filter(|(s, ..)| *s == name)
                    .map(|(_, when, delay)| (*when, *delay))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    eventually_within(
        Duration::from_secs(120),
        "every scanner failing 4 times",
        || async {
            per_scanner(&host.log())
                .iter()
                .all(|f| f.len() >= FAILURES)
                .then_some(())
        },
    )
    .await;
    // Meanwhile kubelet was told nothing new: every device still there, healthy, allocatable.
    for r in &resources {
        assert_eq!(kubelet.health(r, "a").as_deref(), Some("Healthy"), "{r}");
        assert_eq!(seen.stream_ends(r), 0, "{r}");
        let answer = kubelet.allocate(r, &["a"]).await.unwrap();
        assert_eq!(
            answer.container_responses[0].devices[0].host_path,
            "/dev/gate/a"
        );
    }

    // The trap gone, each scanner's next restart serves: a device plugged in now is listed.
    f.remove_dev("trap");
    f.char_dev("gate/b", 10, 242);
    eventually_within(
        Duration::from_secs(120),
        "every scanner serving again",
        || async {
            resources
                .iter()
                .all(|r| kubelet.health(r, "b").as_deref() == Some("Healthy"))
                .then_some(())
        },
    )
    .await;

    // The backoff, from the log: 1 s, doubling, each restart no sooner than announced.
    let metrics = wdp_tests::http::http_get(&metrics, "/metrics")
        .await
        .unwrap()
        .1;
    for (i, failed) in per_scanner(&host.log()).into_iter().enumerate() {
        assert!(failed.len() >= FAILURES, "s{i}: {failed:?}");
        for (k, (when, delay)) in failed.iter().enumerate() {
            let want = (Duration::from_secs(1) * 2u32.pow(k as u32)).min(Duration::from_secs(60));
            assert_eq!(*delay, want, "s{i}: failure {k}");
            if let Some((next, _)) = failed.get(k + 1) {
                let gap = next.duration_since(*when).unwrap_or_default();
                assert!(
                    gap >= *delay,
                    "s{i}: restarted {gap:?} after failure {k}, announced {delay:?}"
                );
            }
        }
        let restarts = format!(
            "wdp_scanner_restarts_total{{scanner=\"s{i}\"}} {}\n",
            failed.len()
        );
        assert!(metrics.contains(&restarts), "{restarts} in\n{metrics}");
    }
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}
