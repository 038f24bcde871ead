//! Attacks on `notify-changes` (contract 0.1.2), the call that tells the host only what changed.
//!
//! * `changes-out-of-step`: changes the host cannot apply. Calls `notify-changes` before any
//!   tree (answer `before-tree`), notifies a tree (dev-type `good`, device `g`), adds device `h`
//!   (`after-tree`), waits up to a second (`h` is taken meanwhile), adds device `bad` whose node
//!   `/dev/missing` does not exist (`bad`: taken, then refused when the host validates it), adds
//!   device `late` (`after-refusal`), then notifies a whole tree: `good` with `g` and `h`, and
//!   dev-type `report`, device `r`, whose annotations are the four answers (`true` or `false`),
//!   and stays up.
//! * `changes-flood`: after a tree (`good`, `g`), `FLOOD` (default 100,000) calls as fast as it
//!   can, each adding one new device (`n<i>`, with an env of `BYTES`, default 1,024, bytes):
//!   what waits between two takes must stay within the guest's memory limit. The answers are
//!   counted, then a whole tree is notified (`good` with `g`, and `report` device `r` whose
//!   annotations `taken` and `turned-away` count them), and the guest stays up.
//! * `changes-alias`: `lift-alias` through `notify-changes`: one changed device whose
//!   `cdi-devices` are `ENTRIES` entries all pointing at the same `BYTES` bytes.
//! * `dir-changes`: `devfs.read-dir-changes` asked with versions the host never gave for the
//!   directory: another directory's, one ahead of the last, forged ones; and paths out of /dev.
//!   Notifies `report` device `r` whose annotations say, per probe, `whole` (the whole listing
//!   of `/dev/bulk`, as `read-dir` gives it), `denied: <error>`, or `LEAKED: <what came
//!   back>`. Then waits for a change and notifies `report` device `delta`, whose annotation
//!   `delta` is what `read-dir-changes` of `/dev/bulk` answered since its first listing:
//!   `whole=<bool> changed=<names> removed=<names>`, and stays up.

use wdp_guest::{DeviceInfo, GroupChanges, TreeBuilder, config, devfs, notify, notify_changes};

use crate::single;

/// The attacks of this module, as `ATTACK` names them.
pub const CHANGES_ATTACKS: [&str; 4] = [
    "changes-out-of-step",
    "changes-flood",
    "changes-alias",
    "dir-changes",
];

fn add(dev_type: &str, id: &str, info: DeviceInfo) -> Vec<GroupChanges> {
    vec![GroupChanges {
        dev_type: dev_type.into(),
        changed: vec![wdp_guest::Device {
            id: id.into(),
            info,
        }],
        removed: vec![],
    }]
}

/// Runs `attack` (one of [`CHANGES_ATTACKS`]).
pub fn run(attack: &str) -> Result<(), String> {
    match attack {
        "changes-out-of-step" => {
            let mut answers = Vec::new();
            let before = notify_changes(&add("good", "x", DeviceInfo::new()), &[]);
            answers.push(("before-tree", before));
            notify(&single("good", "g"));
            let after = notify_changes(&add("good", "h", DeviceInfo::new()), &[]);
            answers.push(("after-tree", after));
            devfs::wait_for_change(1000);
            let bad = DeviceInfo::new().node("/dev/missing", "/dev/missing", "rw");
            answers.push(("bad", notify_changes(&add("good", "bad", bad), &[])));
            let late = notify_changes(&add("good", "late", DeviceInfo::new()), &[]);
            answers.push(("after-refusal", late));
            let mut tree = TreeBuilder::new();
            tree.add("good", "g", DeviceInfo::new());
            tree.add("good", "h", DeviceInfo::new());
            let mut report = DeviceInfo::new();
            for (name, answer) in answers {
                report = report.annotation(name, answer.to_string());
            }
            tree.add("report", "r", report);
            notify(&tree.build());
            stay_up()
        }
        "changes-flood" => {
            let flood = config::env_u32("FLOOD", 100_000, 1..=10_000_000)?;
            let bytes = config::env_u32("BYTES", 1024, 1..=1 << 20)? as usize;
            let value = "v".repeat(bytes);
            notify(&single("good", "g"));
            let (mut taken, mut turned_away) = (0u32, 0u32);
            for i in 0..flood {
                let info = DeviceInfo::new().env("FLOOD", value.as_str());
                if notify_changes(&add("good", &format!("n{i}"), info), &[]) {
                    taken += 1;
                } else {
                    turned_away += 1;
                }
            }
            let mut tree = TreeBuilder::new();
            tree.add("good", "g", DeviceInfo::new());
            let report = DeviceInfo::new()
                .annotation("taken", taken.to_string())
                .annotation("turned-away", turned_away.to_string());
            tree.add("report", "r", report);
            notify(&tree.build());
            stay_up()
        }
        "changes-alias" => {
            let entries = config::env_u32("ENTRIES", 100_000, 1..=1_000_000)? as usize;
            let bytes = config::env_u32("BYTES", 65_536, 1..=1 << 20)? as usize;
            notify(&single("good", "g"));
            alias(entries, bytes);
            Err("LEAKED: the host lifted aliased changes".into())
        }
        "dir-changes" => dir_changes(),
        other => Err(format!("ATTACK={other:?} is not a changes attack")),
    }
}

fn names(nodes: &[devfs::Node]) -> String {
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    names.join(",")
}

fn dir_changes() -> Result<(), String> {
    const BULK: &str = "/dev/bulk";
    let first = devfs::read_dir_changes(BULK, 0)?;
    let listed = devfs::read_dir(BULK)?;
    let other = devfs::read_dir_changes("/dev/other", 0)?;
    let mut report = DeviceInfo::new();
    for (probe, since) in [
        ("other-directory", other.version),
        ("ahead", first.version.wrapping_add(1)),
        ("forged-number", first.version ^ (1 << 40)),
        ("max", u64::MAX),
        ("one", 1),
    ] {
        let outcome = match devfs::read_dir_changes(BULK, since) {
            Ok(answer) if answer.whole && answer.changed == listed && answer.removed.is_empty() => {
                "whole".to_string()
            }
            Ok(answer) => format!(
                "LEAKED: whole={} changed={} removed={}",
                answer.whole,
                names(&answer.changed),
                answer.removed.join(",")
            ),
            Err(e) => format!("denied: {e}"),
        };
        report = report.annotation(probe, outcome);
    }
    for (probe, path) in [
        ("dotdot", "/dev/../etc"),
        ("outside", "/etc"),
        ("escape-link", "/dev/escape"),
    ] {
        let outcome = match devfs::read_dir_changes(path, first.version) {
            Ok(answer) => format!("LEAKED: {}", names(&answer.changed)),
            Err(e) => format!("denied: {e}"),
        };
        report = report.annotation(probe, outcome);
    }
    let mut tree = TreeBuilder::new();
    tree.add("report", "r", report);
    notify(&tree.build());
    devfs::wait_for_change(10_000);
    let delta = devfs::read_dir_changes(BULK, first.version)?;
    let said = format!(
        "whole={} changed={} removed={}",
        delta.whole,
        names(&delta.changed),
        delta.removed.join(",")
    );
    let mut tree = TreeBuilder::new();
    tree.add(
        "report",
        "delta",
        DeviceInfo::new().annotation("delta", said),
    );
    notify(&tree.build());
    stay_up()
}

fn stay_up() -> Result<(), String> {
    loop {
        devfs::wait_for_change(u32::MAX);
    }
}

// The raw canonical-ABI import behind `notifier.notify-changes(list<group-changes>,
// list<device-attributes>) -> bool`: two (pointer, length) pairs, the answer as an i32.
#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wdp:device-plugin/notifier@0.1.2")]
unsafe extern "C" {
    #[link_name = "notify-changes"]
    fn raw_notify_changes(
        changes: *const u8,
        len: usize,
        attrs: *const u8,
        attrs_len: usize,
    ) -> i32;
}

#[cfg(target_arch = "wasm32")]
fn alias(entries: usize, bytes: usize) {
    use std::hint::black_box;
    let text = "a".repeat(bytes);
    let cdi: Vec<[u32; 2]> = vec![[text.as_ptr() as u32, text.len() as u32]; entries];
    let device = crate::lift_attacks::aliased_device(&cdi);
    let dev_type = "alias";
    // A group-changes record: dev-type, changed, removed (empty).
    let group: [u32; 6] = [
        dev_type.as_ptr() as u32,
        dev_type.len() as u32,
        device.as_ptr() as u32,
        1,
        0,
        0,
    ];
    let attrs: [u32; 0] = [];
    unsafe {
        raw_notify_changes(
            black_box(group.as_ptr()).cast(),
            1,
            black_box(attrs.as_ptr()).cast(),
            0,
        )
    };
    black_box((&text, &cdi, &device));
}

#[cfg(not(target_arch = "wasm32"))]
fn alias(_: usize, _: usize) {
    unreachable!("the raw ABI exists only in wasm")
}
