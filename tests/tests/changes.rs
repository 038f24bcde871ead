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

/// `devfs.read-dir-changes` asked with versions the host never gave for the directory (another
/// directory's, one ahead, forged) answers the whole listing, never a part nor another
/// directory's entries; paths out of /dev are refused as `read-dir` refuses them; and asked with
/// the version it gave, it answers exactly the node made since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_changes_answer_only_what_the_host_can_vouch_for() {
    let f = Fixture::new();
    for i in 0..20 {
        f.char_dev(&format!("bulk/d{i}"), 240, i);
    }
    f.char_dev("other/o0", 240, 100).dev_link("escape", "/etc");
    let sandbox = sandbox(&f);
    let mut guest = run_guest(
        &sandbox,
        "hostile",
        &[("ATTACK", "dir-changes")],
        GuestLimits::default(),
        RestartPolicy::Never,
    )
    .await;
    let report = guest.next_tree().await;
    let probes = &report.0["report"]["r"].annotations;
    for probe in ["other-directory", "ahead", "forged-number", "max", "one"] {
        assert_eq!(probes[probe], "whole", "{probe}");
    }
    for probe in ["dotdot", "outside", "escape-link"] {
        assert!(
            probes[probe].starts_with("denied: "),
            "{probe}: {}",
            probes[probe]
        );
    }
    f.char_dev("bulk/d20", 240, 20);
    let delta = guest.next_tree().await;
    assert_eq!(
        delta.0["report"]["delta"].annotations["delta"],
        "whole=false changed=d20 removed="
    );
}
