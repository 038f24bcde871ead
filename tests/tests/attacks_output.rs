//! Guests that attack the output policy through `notify-with-attributes`: attributes too large
//! for what Kubernetes accepts are refused by their rule, a flood of notifies that changes only
//! attributes reaches kubelet as a bounded number of updates, and four guests notifying 16,384
//! devices with attributes, over and over, keep the host's memory within a stated bound, as does a
//! tree whose strings all alias the same guest bytes (refused before it is copied out). Through
//! each, another scanner keeps being served.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use wdp::metrics::ScannerMetrics;
use wdp::sandbox::{Guest, GuestLimits};
use wdp::scanner::{RestartPolicy, Scanner, ScannerEvent, supervise};
use wdp_kubelet::standin::{Observed, StandIn};
use wdp_tests::fixture::Fixture;
use wdp_tests::host::Host;
use wdp_tests::{guest, healthy_kvm, ids, sandbox};

async fn next(rx: &mut mpsc::Receiver<ScannerEvent>, what: &str) -> ScannerEvent {
    tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("{what}: no event"))
        .unwrap_or_else(|| panic!("{what}: channel closed"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_past_what_kubernetes_accepts_are_refused_by_their_rule() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let sandbox = sandbox(&f);
    let mut kvm = healthy_kvm(&sandbox).await;
    let component = sandbox.load(&guest("hostile")).await.unwrap();
    // (attack, the rule that must refuse it): a 28 MB capacity is past `max-string-bytes`,
    // refused before the tree is copied; a 64-character text of 256 bytes is past the 64 bytes
    // the API server allows.
    for (attack, rule) in [
        ("giant-capacity", "max-string-bytes"),
        ("wide-text", "attribute-string-length"),
    ] {
        let metrics = Arc::new(ScannerMetrics::default());
        let scanner = Scanner {
            guest: Guest {
                // Room for the giant capacity: the policy, not the memory cap, must stop it.
                limits: GuestLimits {
                    memory: 256 << 20,
                    call_timeout: Duration::from_secs(10),
                },
                metrics: metrics.clone(),
                ..Guest::new(
                    &format!("hostile-{attack}"),
                    vec![("ATTACK".into(), attack.into())],
                )
            },
            policy: Default::default(),
            pre: component.scanner().unwrap(),
        };
        let (tx, mut rx) = mpsc::channel(4);
        let task = tokio::spawn(supervise(
            sandbox.clone(),
            scanner,
            RestartPolicy::Never,
            tx,
        ));
        match next(&mut rx, attack).await {
            ScannerEvent::Tree(t) => assert_eq!(ids(&t, "good"), ["g"], "{attack}"),
            other => panic!("{attack}: expected the good tree first, got {other:?}"),
        }
        match next(&mut rx, attack).await {
            ScannerEvent::Refused(e) => assert_eq!(e.rule(), rule, "{attack}: refused for {e}"),
            other => panic!("{attack}: expected a refusal, got {other:?}"),
        }
        assert_eq!(ScannerMetrics::get(&metrics.trees_refused), 1, "{attack}");
        task.abort();
    }
    // Through all of that the healthy scanner kept working.
    f.char_dev("fuse", 10, 229);
    assert_eq!(ids(&kvm.next_tree().await, "fuse"), ["fuse-0"]);
}

/// Waits until `done` holds for the device lists the stand-in reported (each resource's latest
/// list and how many lists it sent), failing after `timeout` with what was seen.
async fn until_lists(
    observed: &mut mpsc::UnboundedReceiver<Observed>,
    lists: &mut BTreeMap<String, (usize, Vec<String>)>,
    timeout: Duration,
    what: &str,
    done: impl Fn(&BTreeMap<String, (usize, Vec<String>)>) -> bool,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !done(lists) {
        let seen = || {
            lists
                .iter()
                .map(|(r, (n, ids))| format!("{r}: {n} lists, the last of {} ids", ids.len()))
                .collect::<Vec<_>>()
        };
        match tokio::time::timeout_at(deadline, observed.recv()).await {
            Ok(Some(Observed::Devices {
                resource, devices, ..
            })) => {
                let entry = lists.entry(resource).or_default();
                entry.0 += 1;
                entry.1 = devices.iter().map(|d| d.id.clone()).collect();
                entry.1.sort();
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("{what}: the stand-in stopped; seen {:?}", seen()),
            Err(_) => panic!("{what}: not within {timeout:?}; seen {:?}", seen()),
        }
    }
}

fn scanner_config(name: &str, namespace: &str, env: &str, memory: &str) -> String {
    format!(
        "  - name: {name}
    component: {hostile}
    namespace: {namespace}
    env: {{ {env} }}
    limits: {{ memory: {memory} }}
",
        hostile = guest("hostile").display(),
    )
}

/// `wdp run` of the kvm scanner and `scanners` (config entries) over a fixture holding
/// /dev/kvm, served to a kubelet stand-in; the fixture is returned for the test's own changes.
fn run_beside_kvm(scanners: &str) -> (Fixture, StandIn, mpsc::UnboundedReceiver<Observed>, Host) {
    run_with(&kvm_config(), scanners)
}

/// [`run_beside_kvm`], the kvm scanner limited to `memory`.
fn run_beside_kvm_limited(
    scanners: &str,
    memory: &str,
) -> (Fixture, StandIn, mpsc::UnboundedReceiver<Observed>, Host) {
    let kvm = format!("{}    limits: {{ memory: {memory} }}\n", kvm_config());
    run_with(&kvm, scanners)
}

fn run_with(
    kvm: &str,
    scanners: &str,
) -> (Fixture, StandIn, mpsc::UnboundedReceiver<Observed>, Host) {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let config = f.write_config(&format!("scanners:\n{kvm}{scanners}"));
    let plugins = f.plugin_dir();
    let (kubelet, observed) = StandIn::start(&plugins).unwrap();
    let host = Host::start(&config, &plugins, &f);
    (f, kubelet, observed, host)
}

fn kvm_config() -> String {
    format!(
        "  - name: kvm
    component: {kvm}
    namespace: devices.example.com
    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}
",
        kvm = guest("kvm").display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_attribute_changes_sends_kubelet_a_bounded_number_of_lists() {
    let (f, kubelet, mut observed, host) = run_beside_kvm(&scanner_config(
        "flood",
        "flood.example.com",
        "ATTACK: attribute-flood, FLOOD: 100000",
        "16Mi",
    ));
    let mut lists = BTreeMap::new();
    // The guest's last tree adds `done` after 100,000 notifies of [x] with one attribute
    // changed: kubelet sees [x] (and [done, x] at the end), not an update per notify.
    until_lists(
        &mut observed,
        &mut lists,
        Duration::from_secs(120),
        "the flood's last list",
        |l| {
            l.get("flood.example.com/flood")
                .is_some_and(|(_, ids)| ids == &["done", "x"])
        },
    )
    .await;
    let sent = lists["flood.example.com/flood"].0;
    assert!(
        sent <= 3,
        "kubelet got {sent} lists of the flood's resource; [x] then [done, x] was all there was to say"
    );
    // Another scanner is served meanwhile and after.
    f.char_dev("fuse", 10, 229);
    until_lists(
        &mut observed,
        &mut lists,
        Duration::from_secs(20),
        "the kvm scanner's hot-plugged device",
        |l| {
            l.get("devices.example.com/fuse")
                .is_some_and(|(_, ids)| ids == &["fuse-0"])
        },
    )
    .await;
    let log = host.log();
    assert!(host.terminate().await.success(), "{log}");
    kubelet.stop().await;
}

/// The peak resident set of process `pid`, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in /proc/{pid}/status:\n{status}"))
}

/// Each guest's memory limit in the bound tests, as the shipped ConfigMap gives its scanners.
const GUEST_MEMORY: &str = "16Mi";
const GUEST_MEMORY_KIB: u64 = 16 << 10;

/// `wdp run` of the kvm scanner and four hostile guests notifying `devices` devices with
/// attributes 9 times each, every guest limited to [`GUEST_MEMORY`], until kubelet has every
/// guest's last tree; returns the host's peak resident set then (KiB), the host still running.
async fn four_guests_of(
    devices: usize,
) -> (
    Fixture,
    StandIn,
    mpsc::UnboundedReceiver<Observed>,
    Host,
    u64,
) {
    let mut scanners = String::new();
    for i in 0..4 {
        scanners.push_str(&scanner_config(
            &format!("many{i}"),
            &format!("many{i}.example.com"),
            &format!("ATTACK: many-devices, DEVICES: {devices}, ROUNDS: 8"),
            GUEST_MEMORY,
        ));
    }
    let (f, kubelet, mut observed, host) = run_beside_kvm_limited(&scanners, GUEST_MEMORY);
    let mut lists = BTreeMap::new();
    // Each guest's last tree has `done` among its devices: served, all four.
    until_lists(
        &mut observed,
        &mut lists,
        Duration::from_secs(300),
        "every guest's last tree",
        |l| {
            (0..4).all(|i| {
                l.get(&format!("many{i}.example.com/many"))
                    .is_some_and(|(_, ids)| ids.len() == devices && ids.contains(&"done".into()))
            })
        },
    )
    .await;
    let peak = peak_rss_kib(host.pid());
    (f, kubelet, observed, host, peak)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_guests_of_16384_devices_with_attributes_keep_the_host_in_its_memory_bound() {
    let (f, kubelet, mut observed, host, peak) = four_guests_of(16_384).await;
    let mut lists = BTreeMap::new();
    // Another scanner is served meanwhile and after.
    f.char_dev("fuse", 10, 229);
    until_lists(
        &mut observed,
        &mut lists,
        Duration::from_secs(30),
        "the kvm scanner's hot-plugged device",
        |l| {
            l.get("devices.example.com/fuse")
                .is_some_and(|(_, ids)| ids == &["fuse-0"])
        },
    )
    .await;
    let log = host.log();
    assert!(host.terminate().await.success(), "{log}");
    kubelet.stop().await;
    // The host's own memory: the same build, scanners and limits, each guest notifying one
    // device: what it holds with no tree of size (the runtime, the compiled guests, their
    // instances).
    let (_f, kubelet, _observed, host, base) = four_guests_of(1).await;
    let log = host.log();
    assert!(host.terminate().await.success(), "{log}");
    kubelet.stop().await;
    // The bound the code keeps (wdp::footprint::HELD_PER_SCANNER): its own memory and, for
    // each of the five scanners, that many times its memory limit.
    let bound = base + wdp::footprint::HELD_PER_SCANNER * 5 * GUEST_MEMORY_KIB;
    eprintln!(
        "peak RSS: {} MiB; the host's own: {} MiB; bound: {} MiB",
        peak >> 10,
        base >> 10,
        bound >> 10
    );
    assert!(
        peak <= bound,
        "the host peaked at {} MiB, past its bound of {} MiB ({} MiB of its own)",
        peak >> 10,
        bound >> 10,
        base >> 10
    );
}

/// The host's bound under `lift-alias` and `read-alias`: a base of 64 MiB for the host itself and
/// four times the guest's 16 MiB limit. The aliased arguments copied out string by string are
/// 6.5 GB; wasmtime's own cap on what one host call may copy (128 MiB of "hostcall fuel") stopped
/// them, before each guest's cap was its memory limit, with the host past 190 MiB.
const ALIAS_BOUND_KIB: u64 = (64 + 4 * 16) << 10;

/// Runs the hostile guest's `attack` (16 MiB) beside the kvm scanner: the attack's call is
/// refused with `cause` in the log, the host's peak stays within [`ALIAS_BOUND_KIB`], and the
/// other scanner keeps being served.
async fn aliased_arguments_are_refused(attack: &str, cause: &str) {
    let (f, kubelet, mut observed, host) = run_beside_kvm(&scanner_config(
        "alias",
        "alias.example.com",
        &format!("ATTACK: {attack}"),
        "16Mi",
    ));
    let mut lists = BTreeMap::new();
    until_lists(
        &mut observed,
        &mut lists,
        Duration::from_secs(60),
        "the guest's good tree",
        |l| {
            l.get("alias.example.com/good")
                .is_some_and(|(_, ids)| ids == &["g"])
        },
    )
    .await;
    let log = host.logged("scanner failed scanner=\"alias\"", 1).await;
    let peak = peak_rss_kib(host.pid());
    assert!(
        peak <= ALIAS_BOUND_KIB,
        "{attack}: the host peaked at {} MiB, past its bound of {} MiB",
        peak >> 10,
        ALIAS_BOUND_KIB >> 10
    );
    assert!(log.contains(cause), "{attack}: {log}");
    assert!(!log.contains("LEAKED"), "{attack}: {log}");
    eprintln!("{attack}: peak RSS: {} MiB", peak >> 10);
    // Another scanner is served meanwhile and after, and the refused tree never was.
    f.char_dev("fuse", 10, 229);
    until_lists(
        &mut observed,
        &mut lists,
        Duration::from_secs(30),
        "the kvm scanner's hot-plugged device",
        |l| {
            l.get("devices.example.com/fuse")
                .is_some_and(|(_, ids)| ids == &["fuse-0"])
        },
    )
    .await;
    assert!(!lists.contains_key("alias.example.com/alias"), "{lists:?}");
    let log = host.log();
    assert!(host.terminate().await.success(), "{log}");
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_of_aliased_strings_is_refused_before_it_is_copied_out() {
    aliased_arguments_are_refused(
        "lift-alias",
        "(rule tree-host-memory); refused before it was copied out",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_of_aliased_strings_are_refused_before_they_are_copied_out() {
    aliased_arguments_are_refused(
        "changes-alias",
        "(rule tree-host-memory); refused before it was copied out",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliased_paths_of_a_read_are_refused_within_the_guest_memory_limit() {
    aliased_arguments_are_refused(
        "read-alias",
        "fuel allocated for hostcalls has been exhausted",
    )
    .await;
}
