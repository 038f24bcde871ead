//! Attacks on the output policy through `notify-with-attributes` (contract 0.1.1): attributes
//! and capacities the host must count, bound and refuse like any other string, and notifies that
//! must not flood kubelet or the host's memory.
//!
//! Each one first notifies a good tree (dev-type `good`, device `g`), then attacks, then stays
//! up waiting for changes: the host must keep serving (the good tree, or the attack's last
//! accepted tree) and keep every other scanner served.
//!
//! * `giant-capacity`: a capacity of [`GIANT_CAPACITY_BYTES`] digits.
//! * `wide-text`: a text attribute of 64 characters and 256 bytes (4-byte characters).
//! * `attribute-flood`: `FLOOD` (default 100,000) notifies of the same device list (dev-type
//!   `flood`, device `x`), each changing only an attribute, then one more tree with a second
//!   device `done`.
//! * `many-devices`: `ROUNDS` (default 8) notifies of `DEVICES` (default 16,384) devices of
//!   dev-type `many`, each with 3 attributes and a capacity, one attribute changing every
//!   round, then one more tree whose last device is `done` instead.

use wdp_guest::types::{AttributeValue, Device, DeviceAttributes};
use wdp_guest::{
    DeviceInfo, DeviceTree, TreeBuilder, config, devfs, notify, notify_with_attributes,
};

/// The attacks of this module, as `ATTACK` names them.
pub const OUTPUT_ATTACKS: [&str; 4] = [
    "giant-capacity",
    "wide-text",
    "attribute-flood",
    "many-devices",
];

/// Bytes of `giant-capacity`'s capacity: the size that was once accepted and served.
pub const GIANT_CAPACITY_BYTES: usize = 28_000_000;

/// A text attribute of 64 characters of 4 bytes each.
pub fn wide_text() -> String {
    "\u{1F600}".repeat(64)
}

fn entry(
    dev_type: &str,
    id: &str,
    attributes: Vec<(&str, AttributeValue)>,
    capacities: Vec<(&str, String)>,
) -> DeviceAttributes {
    DeviceAttributes {
        dev_type: dev_type.into(),
        id: id.into(),
        attributes: attributes
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect(),
        capacities: capacities
            .into_iter()
            .map(|(n, q)| (n.to_string(), q))
            .collect(),
    }
}

fn one(dev_type: &str, ids: &[&str]) -> DeviceTree {
    let mut t = TreeBuilder::new();
    for id in ids {
        t.add(dev_type, *id, DeviceInfo::new());
    }
    t.build()
}

/// `count` devices `d<i>` of `dev_type` (the last one `done` instead when `done`), each with a
/// model, a firmware version and a round counter, and a memory capacity.
fn many(
    dev_type: &str,
    count: usize,
    round: i64,
    done: bool,
) -> (DeviceTree, Vec<DeviceAttributes>) {
    let mut ids: Vec<String> = (0..count).map(|i| format!("d{i}")).collect();
    if done && let Some(last) = ids.last_mut() {
        *last = "done".into();
    }
    let mut t = TreeBuilder::new();
    // Pushed directly: the builder's duplicate check is linear per add.
    t.group(dev_type)
        .devices
        .extend(ids.iter().map(|id| Device {
            id: id.clone(),
            info: DeviceInfo::new(),
        }));
    let attributes = ids
        .iter()
        .map(|id| {
            entry(
                dev_type,
                id,
                vec![
                    ("model", AttributeValue::Text("hostile-accelerator".into())),
                    ("firmware", AttributeValue::Version("1.2.3".into())),
                    ("round", AttributeValue::Int(round)),
                ],
                vec![("memory", "16Gi".into())],
            )
        })
        .collect();
    (t.build(), attributes)
}

/// Runs output attack `attack`; returns only on a bad configuration.
pub fn run(attack: &str) -> Result<(), String> {
    notify(&one("good", &["g"]));
    match attack {
        "giant-capacity" => {
            let capacity = "9".repeat(GIANT_CAPACITY_BYTES);
            let attrs = [entry("good", "g", vec![], vec![("memory", capacity)])];
            notify_with_attributes(&one("good", &["g"]), &attrs);
        }
        "wide-text" => {
            let attrs = [entry(
                "good",
                "g",
                vec![("model", AttributeValue::Text(wide_text()))],
                vec![],
            )];
            notify_with_attributes(&one("good", &["g"]), &attrs);
        }
        "attribute-flood" => {
            let floods = config::env_u32("FLOOD", 100_000, 1..=u32::MAX)?;
            let tree = one("flood", &["x"]);
            for i in 0..floods {
                let attrs = [entry(
                    "flood",
                    "x",
                    vec![("round", AttributeValue::Int(i.into()))],
                    vec![],
                )];
                notify_with_attributes(&tree, &attrs);
            }
            notify(&one("flood", &["done", "x"]));
        }
        "many-devices" => {
            let devices = config::env_u32("DEVICES", 16_384, 1..=1 << 20)? as usize;
            let rounds = config::env_u32("ROUNDS", 8, 1..=u32::MAX)?;
            for round in 0..rounds {
                let (tree, attrs) = many("many", devices, round.into(), false);
                notify_with_attributes(&tree, &attrs);
            }
            // The last tree renames a device: what reached kubelet last is the last tree.
            let (tree, attrs) = many("many", devices, rounds.into(), true);
            notify_with_attributes(&tree, &attrs);
        }
        other => return Err(format!("ATTACK={other:?} is not an output attack")),
    }
    // Stay up: the host must keep serving what it accepted.
    loop {
        devfs::wait_for_change(u32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let text = wide_text();
        assert_eq!((text.chars().count(), text.len()), (64, 256));
        let (tree, attrs) = many("many", 3, 0, true);
        assert_eq!(tree[0].devices.len(), 3);
        assert_eq!(attrs.len(), 3);
        assert_eq!(attrs[2].id, "done");
        assert_eq!(attrs[0].attributes.len(), 3);
    }
}
