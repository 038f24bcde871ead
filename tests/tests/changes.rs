//! `notify-changes` (contract 0.1.2): a guest that tells only what changed is served as if it had
//! notified each whole tree, and the changes the host cannot apply, or cannot hold, are turned
//! away so that the guest sends its tree again: nothing is lost, nothing grows past the guest's
//! memory limit, and the last good tree stays served.

use std::sync::Arc;

use wdp::sandbox::GuestLimits;
use wdp::scanner::{RestartPolicy, ScannerEvent};
use wdp::tree::DeviceTree;
use wdp_tests::fixture::Fixture;
use wdp_tests::{ids, run_guest, sandbox};

fn annotation(tree: &Arc<DeviceTree>, name: &str) -> String {
    tree.0["report"]["r"].annotations[name].clone()
}

/// Changes before any tree and after a refused change are turned away (the guest then sends
/// its tree); changes after an accepted tree patch it; a change that breaks a rule is refused
/// by that rule, and the tree before it stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_apply_only_to_the_tree_the_host_holds() {
    let f = Fixture::new();
    f.char_dev("null", 1, 3);
    let sandbox = sandbox(&f);
    let mut guest = run_guest(
        &sandbox,
        "hostile",
        &[("ATTACK", "changes-out-of-step")],
        GuestLimits::default(),
        RestartPolicy::Never,
    )
    .await;
    assert_eq!(ids(&guest.next_tree().await, "good"), ["g"]);
    assert_eq!(ids(&guest.next_tree().await, "good"), ["g", "h"]);
    match guest.next().await {
        ScannerEvent::Refused(e) => assert_eq!(e.rule(), "node-exists", "{e}"),
        other => panic!("expected the bad change refused, got {other:?}"),
    }
    let report = guest.next_tree().await;
    assert_eq!(ids(&report, "good"), ["g", "h"]);
    for (answer, expected) in [
        ("before-tree", "false"),
        ("after-tree", "true"),
        ("bad", "true"),
        ("after-refusal", "false"),
    ] {
        assert_eq!(annotation(&report, answer), expected, "{answer}");
    }
}

/// A guest adding devices as fast as it can, each with 4 KiB of env, far past its 16 MiB: what
/// waits is merged and held to the limit, the tree changes make is refused once it would pass
/// a cap, every later change is turned away, and the whole tree sent at the end is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_changes_is_held_to_the_guest_memory() {
    let f = Fixture::new();
    let sandbox = sandbox(&f);
    let flood = 20_000u32;
    let mut guest = run_guest(
        &sandbox,
        "hostile",
        &[
            ("ATTACK", "changes-flood"),
            ("FLOOD", &flood.to_string()),
            ("BYTES", "4096"),
        ],
        GuestLimits {
            memory: 16 << 20,
            ..GuestLimits::default()
        },
        RestartPolicy::Never,
    )
    .await;
    assert_eq!(ids(&guest.next_tree().await, "good"), ["g"]);
    let mut refused = Vec::new();
    let report = loop {
        match guest.next().await {
            ScannerEvent::Tree(t) if t.0.contains_key("report") => break t,
            ScannerEvent::Tree(t) => assert!(ids(&t, "good").len() <= 16_384),
            ScannerEvent::Refused(e) => refused.push(e.rule()),
            other => panic!("expected trees and refusals, got {other:?}"),
        }
    };
    assert_eq!(ids(&report, "good"), ["g"]);
    let count = |name| annotation(&report, name).parse::<u32>().unwrap();
    let (taken, turned_away) = (count("taken"), count("turned-away"));
    assert_eq!(taken + turned_away, flood);
    assert!(turned_away > 0, "all {flood} changes were taken");
    assert!(
        refused
            .iter()
            .all(|r| ["tree-host-memory", "max-tree-bytes", "max-devices-per-type"].contains(r)),
        "{refused:?}"
    );
}
