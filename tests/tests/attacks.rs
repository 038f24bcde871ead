//! Guests that try to make kubelet expose what the operator did not allow: every tree is refused
//! by the named rule, the guest's last good tree stays in force, and a healthy scanner in the
//! same host keeps working throughout.

use std::sync::Arc;
use std::time::Duration;

use wdp::metrics::ScannerMetrics;
use wdp::sandbox::{Guest, GuestLimits};
use wdp::scanner::{RestartPolicy, Scanner, ScannerEvent, supervise};
use wdp_tests::fixture::Fixture;
use wdp_tests::{guest, healthy_kvm, ids, run_guest, sandbox};

/// (BAD kind, the rule that must refuse it).
const BAD_TREES: [(&str, &str); 17] = [
    ("node-outside-dev", "node-under-dev"),
    ("node-dotdot", "normalised-path"),
    ("node-missing", "node-exists"),
    ("node-escape-link", "node-exists"),
    ("mount-root", "allowed-mounts"),
    ("mount-etc", "allowed-mounts"),
    ("permissions", "permissions"),
    ("env-name", "env-name"),
    ("duplicate-ids", "unique-device-id"),
    ("long-id", "device-id"),
    ("dev-type", "dev-type"),
    ("giant-tree", "max-devices-per-type"),
    ("giant-string", "max-string-bytes"),
    ("too-many-types", "max-types"),
    ("cdi-name", "cdi-name"),
    ("annotation-key", "annotation-key"),
    ("relative-container-path", "normalised-path"),
];

fn fixture() -> Fixture {
    let f = Fixture::new();
    f.char_dev("null", 1, 3)
        .char_dev("kvm", 10, 232)
        .dev_link("escape", "/etc");
    f
}

async fn next(rx: &mut tokio::sync::mpsc::Receiver<ScannerEvent>, kind: &str) -> ScannerEvent {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("{kind}: no event"))
        .unwrap_or_else(|| panic!("{kind}: channel closed"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_tree_is_refused_by_its_rule() {
    let f = fixture();
    let sandbox = sandbox(&f);
    let mut kvm = healthy_kvm(&sandbox).await;

    let component = sandbox.load(&guest("hostile")).await.unwrap();
    for (kind, rule) in BAD_TREES {
        let metrics = Arc::new(ScannerMetrics::default());
        let spec = Guest {
            // Room for the giant trees to be built: the policy, not the memory cap, must stop them.
            limits: GuestLimits {
                memory: 512 << 20,
                call_timeout: Duration::from_secs(10),
            },
            metrics: metrics.clone(),
            ..Guest::new(
                &format!("hostile-{kind}"),
                vec![
                    ("ATTACK".into(), "bad-tree".into()),
                    ("BAD".into(), kind.into()),
                ],
            )
        };
        let scanner = Scanner {
            guest: spec,
            policy: Default::default(),
            pre: component.scanner().unwrap(),
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        let task = tokio::spawn(supervise(
            sandbox.clone(),
            scanner,
            RestartPolicy::Never,
            tx,
        ));
        match next(&mut rx, kind).await {
            ScannerEvent::Tree(t) => assert_eq!(ids(&t, "good"), ["g"], "{kind}"),
            other => panic!("{kind}: expected the good tree first, got {other:?}"),
        }
        match next(&mut rx, kind).await {
            ScannerEvent::Refused(e) => {
                assert_eq!(e.rule(), rule, "{kind}: refused for {e}");
            }
            other => panic!("{kind}: expected a refusal, got {other:?}"),
        }
        assert_eq!(ScannerMetrics::get(&metrics.trees_refused), 1, "{kind}");
        assert_eq!(ScannerMetrics::get(&metrics.trees_accepted), 1, "{kind}");
        // The guest is still running (waiting), neither failed nor stopped.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), rx.recv())
                .await
                .is_err(),
            "{kind}: the guest should still be running"
        );
        task.abort();
    }

    // Through all of that the healthy scanner kept working.
    f.char_dev("fuse", 10, 229);
    assert_eq!(ids(&kvm.next_tree().await, "fuse"), ["fuse-0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_the_host_cannot_lift_traps_only_that_guest() {
    let f = fixture();
    let sandbox = sandbox(&f);
    let mut kvm = healthy_kvm(&sandbox).await;
    for attack in ["raw-out-of-bounds", "raw-bad-utf8"] {
        let mut g = run_guest(
            &sandbox,
            "hostile",
            &[("ATTACK", attack)],
            GuestLimits::default(),
            RestartPolicy::Never,
        )
        .await;
        assert_eq!(ids(&g.next_tree().await, "good"), ["g"], "{attack}");
        let cause = g.failure().await;
        assert!(!cause.contains("LEAKED"), "{attack}: {cause}");
    }
    f.char_dev("fuse", 10, 229);
    assert_eq!(ids(&kvm.next_tree().await, "fuse"), ["fuse-0"]);
}
