//! A resource's ListAndWatch list, kept encoded in runs of devices so that an update re-encodes
//! the runs its change falls in rather than every device.
//!
//! Why: every update sends kubelet the whole list (the protocol has no other message), but a
//! change among 10,000 devices is usually one device. Encoding 10,000 devices from the group is
//! a walk of the persistent map and 30,000 small copies per update; the group of the last update
//! and the new one share all but the changed path of their trees, which `imbl`'s diff skips, so
//! the runs a change touches are found in time proportional to the change. The message is then
//! the runs' bytes one after the other: one copy of the list, not one encoding.
//!
//! The runs split the ids in order: a run holds the devices from its key (a lower bound, not
//! necessarily an id still present) up to the next run's key, and the first run's key is the
//! empty string, below every id. The bytes are exactly what encoding the whole group at once
//! writes (unit tests compare the two after every kind of change).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use bytes::{Bytes, BytesMut};
use imbl::ordmap::DiffItem;
use wdp_kubelet::api;
use wdp_kubelet::list::ListEncoder;

use crate::tree::{DeviceGroup, DeviceInfo, Health};

/// Devices per run when runs are cut: small enough that re-encoding one is cheap, large enough
/// that joining them is a few dozen copies for 10,000 devices.
const RUN: usize = 256;

/// A run re-encoded with fewer devices than this is joined to the run before it, so that removals
/// cannot leave the list cut into runs of one device each.
const SMALL: usize = RUN / 8;

/// The encoded list of one resource and the group it encodes.
#[derive(Default)]
pub(super) struct EncodedList {
    /// The devices the runs encode (shared with the server's copy: a persistent map).
    group: DeviceGroup,
    /// Runs by key; empty until the first update.
    runs: BTreeMap<String, Run>,
}

/// The encoding of the devices of one run.
#[derive(Default)]
struct Run {
    healthy: usize,
    bytes: Bytes,
}

/// What one update of the list gives the server and the status page.
pub(super) struct Listed {
    /// The ListAndWatch message's devices field, encoded.
    pub list: Bytes,
    /// Devices reported healthy.
    pub healthy: usize,
}

impl EncodedList {
    /// Moves the list to `group`, re-encoding only the runs its differences from the last group
    /// fall in, and returns the whole list.
    pub fn update(&mut self, group: &DeviceGroup) -> Listed {
        let mut dirty = BTreeSet::new();
        // Past half the runs, encoding all of them at once is cheaper than run by run; before
        // the first update there are no runs to keep.
        let whole = self.runs.is_empty()
            || self.group.diff(group).any(|item| {
                let id = match item {
                    DiffItem::Add(id, _) | DiffItem::Remove(id, _) => id,
                    DiffItem::Update { new: (id, _), .. } => id,
                };
                dirty.insert(self.run_of(id).to_owned());
                dirty.len() > self.runs.len() / 2
            });
        self.group = group.clone();
        if whole {
            // One run over every device, which re-encoding it cuts into runs of RUN.
            self.runs.clear();
            self.runs.insert(String::new(), Run::default());
            dirty = BTreeSet::from([String::new()]);
        }
        for key in dirty {
            self.reencode(&key);
        }
        self.joined()
    }

    /// The key of the run `id` falls in.
    fn run_of(&self, id: &str) -> &str {
        self.runs
            .range::<str, _>((Bound::Unbounded, Bound::Included(id)))
            .next_back()
            .map_or("", |(key, _)| key.as_str())
    }

    /// Encodes run `key` again from the group; a run that grew is cut in two or more, one that
    /// shrank to a few devices joins the run before it.
    fn reencode(&mut self, key: &str) {
        let end = self
            .runs
            .range::<str, _>((Bound::Excluded(key), Bound::Unbounded))
            .next()
            .map(|(next, _)| next.clone());
        let range = (
            Bound::Included(key),
            end.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
        );
        let devices: Vec<(&String, &DeviceInfo)> = self.group.range::<_, str>(range).collect();
        if devices.len() < SMALL && !key.is_empty() {
            self.runs.remove(key);
            let before = self.run_of(key).to_owned();
            return self.reencode(&before);
        }
        // More than two runs' worth is cut into runs of RUN, the first keeping `key`; less stays
        // one run, which is empty for an empty group's only run.
        let size = if devices.len() > 2 * RUN {
            RUN
        } else {
            devices.len().max(1)
        };
        let mut run_key = key.to_owned();
        let mut run = Encoding::new(size);
        for (i, (id, info)) in devices.into_iter().enumerate() {
            if i > 0 && i % size == 0 {
                let done = std::mem::replace(&mut run, Encoding::new(size));
                self.runs
                    .insert(std::mem::replace(&mut run_key, id.clone()), done.finish());
            }
            run.push(id, info);
        }
        self.runs.insert(run_key, run.finish());
    }

    /// The runs one after the other, and their healthy devices.
    fn joined(&self) -> Listed {
        let len = self.runs.values().map(|r| r.bytes.len()).sum();
        let mut list = BytesMut::with_capacity(len);
        let mut healthy = 0;
        for run in self.runs.values() {
            list.extend_from_slice(&run.bytes);
            healthy += run.healthy;
        }
        Listed {
            list: list.freeze(),
            healthy,
        }
    }
}

/// A run being encoded.
struct Encoding {
    list: ListEncoder,
    healthy: usize,
}

impl Encoding {
    fn new(devices: usize) -> Self {
        Encoding {
            list: ListEncoder::with_capacity(devices),
            healthy: 0,
        }
    }

    /// Adds device `id` as kubelet sees it: id, health and NUMA nodes.
    fn push(&mut self, id: &str, info: &DeviceInfo) {
        // An empty list would tell kubelet the device is NUMA-aware yet on no node (some
        // kubelet versions then never align it): no nodes is no topology.
        let topology = info
            .numa_nodes
            .as_ref()
            .filter(|n| !n.is_empty())
            .map(|nodes| api::TopologyInfo {
                nodes: nodes
                    .iter()
                    .map(|&n| api::NumaNode { id: n.into() })
                    .collect(),
            });
        self.list.push(id, info.health.as_str(), topology.as_ref());
        self.healthy += usize::from(info.health == Health::Healthy);
    }

    fn finish(self) -> Run {
        Run {
            healthy: self.healthy,
            bytes: self.list.finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The whole group encoded at once: what the runs must always add up to.
    fn whole(group: &DeviceGroup) -> (Bytes, usize) {
        let mut run = Encoding::new(group.len());
        for (id, info) in group.iter() {
            run.push(id, info);
        }
        let run = run.finish();
        (run.bytes, run.healthy)
    }

    fn device(health: Health, numa: Option<Vec<u32>>) -> DeviceInfo {
        DeviceInfo {
            health,
            numa_nodes: numa,
            ..DeviceInfo::default()
        }
    }

    fn group(n: usize) -> DeviceGroup {
        (0..n)
            .map(|i| (format!("d{i:05}"), device(Health::Healthy, None)))
            .collect()
    }

    fn check(list: &mut EncodedList, group: &DeviceGroup) {
        let listed = list.update(group);
        let (bytes, healthy) = whole(group);
        assert_eq!(
            listed.list, bytes,
            "the runs' bytes are the whole group's encoding"
        );
        assert_eq!(listed.healthy, healthy);
        let keys: Vec<&String> = list.runs.keys().collect();
        assert_eq!(
            keys.first().map(|k| k.as_str()),
            Some(""),
            "the first run starts below every id"
        );
    }

    #[test]
    fn one_change_re_encodes_its_run_and_the_list_stays_whole() {
        let mut list = EncodedList::default();
        let mut g = group(10_000);
        check(&mut list, &g);
        assert!(list.runs.len() >= 10_000 / RUN, "cut into runs");
        let before: Vec<Bytes> = list.runs.values().map(|r| r.bytes.clone()).collect();

        g.insert("d05000x".into(), device(Health::Healthy, Some(vec![1])));
        check(&mut list, &g);
        let after: Vec<Bytes> = list.runs.values().map(|r| r.bytes.clone()).collect();
        let same = before
            .iter()
            .zip(&after)
            .filter(|(a, b)| a.as_ptr() == b.as_ptr())
            .count();
        assert_eq!(
            same,
            before.len() - 1,
            "only the changed run was encoded again"
        );

        g.insert("d00001".into(), device(Health::Unhealthy, Some(vec![])));
        check(&mut list, &g);
        g.remove("d09999");
        check(&mut list, &g);
        g.insert("a".into(), device(Health::Healthy, None));
        check(&mut list, &g);
        g.insert("zzz".into(), device(Health::Healthy, None));
        check(&mut list, &g);
    }

    #[test]
    fn runs_are_cut_as_they_grow_and_joined_as_they_empty() {
        let mut list = EncodedList::default();
        let mut g = group(2 * RUN);
        check(&mut list, &g);
        // Grown to many runs' worth between two ids of one run.
        for i in 0..5 * RUN {
            g.insert(format!("d00000-{i:05}"), device(Health::Healthy, None));
        }
        check(&mut list, &g);
        assert!(
            list.runs.len() >= 5,
            "grown runs are cut: {} runs",
            list.runs.len()
        );
        // One run in the middle emptied but for a few: joined to the run before it.
        let runs = list.runs.len();
        let middle: Vec<String> = list.runs.keys().skip(runs / 2).take(2).cloned().collect();
        let ids: Vec<String> = g
            .range::<_, str>((
                Bound::Included(middle[0].as_str()),
                Bound::Excluded(middle[1].as_str()),
            ))
            .map(|(id, _)| id.clone())
            .skip(2)
            .collect();
        for id in ids {
            g.remove(&id);
        }
        check(&mut list, &g);
        assert_eq!(
            list.runs.len(),
            runs - 1,
            "the small run joined the one before it"
        );
        // Emptied but for a few.
        let ids: Vec<String> = g.keys().skip(3).cloned().collect();
        for id in ids {
            g.remove(&id);
        }
        check(&mut list, &g);
        assert_eq!(list.runs.len(), 1, "small runs joined: {}", list.runs.len());
        g.clear();
        check(&mut list, &g);
        g.insert("only".into(), device(Health::Healthy, None));
        check(&mut list, &g);
    }

    #[test]
    fn an_unrelated_group_is_encoded_whole() {
        let mut list = EncodedList::default();
        check(&mut list, &group(1000));
        let other: DeviceGroup = (0..700)
            .map(|i| (format!("e{i}"), device(Health::Unhealthy, None)))
            .collect();
        check(&mut list, &other);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Add(u16, bool),
        Remove(u16),
        Flip(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u16..2000, any::<bool>()).prop_map(|(i, h)| Op::Add(i, h)),
            (0u16..2000).prop_map(Op::Remove),
            (0u16..2000).prop_map(Op::Flip),
        ]
    }

    proptest! {
        #[test]
        fn every_update_lists_what_encoding_the_group_would(
            start in 0usize..1500,
            steps in proptest::collection::vec(proptest::collection::vec(op(), 1..40), 1..12),
        ) {
            let mut list = EncodedList::default();
            let mut g: DeviceGroup = (0..start)
                .map(|i| (format!("d{:04}", i * 2000 / start.max(1)), device(Health::Healthy, None)))
                .collect();
            check(&mut list, &g);
            for step in steps {
                for op in step {
                    match op {
                        Op::Add(i, healthy) => {
                            let health = if healthy { Health::Healthy } else { Health::Unhealthy };
                            g.insert(format!("d{i:04}"), device(health, Some(vec![u32::from(i % 3)])));
                        }
                        Op::Remove(i) => {
                            g.remove(&format!("d{i:04}"));
                        }
                        Op::Flip(i) => {
                            if let Some(d) = g.get_mut(&format!("d{i:04}")) {
                                d.health = if d.health == Health::Healthy { Health::Unhealthy } else { Health::Healthy };
                            }
                        }
                    }
                }
                check(&mut list, &g);
            }
        }
    }
}
