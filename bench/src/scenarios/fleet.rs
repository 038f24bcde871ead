//! A fleet against one API server: how many requests the DRA publishers of many nodes make, at
//! rest and when things change, counted by verb by `wdp_dra`'s API server stand-in.
//!
//! Each simulated node is one `wdp_dra` publisher (the one `wdp run` starts per DRA driver) with
//! its own node name and a pool of four devices, all in this process, all talking real HTTP on
//! loopback to one stand-in. Scenarios, in order: every node starting; the fleet at rest for a
//! window (what the API server pays per node and minute besides the open watches); one device
//! change on one node; a health flap on every node (one device down, then up); and every node
//! restarting at once, the herd, with the first half of its lists refused with 429 and
//! `Retry-After: 1`, as priority and fairness refuses a burst.
//!
//! The publisher before this one listed its node's slices every 10 s besides its watch: 100
//! LIST/s per 1,000 nodes at rest, computed from its period rather than measured here (its code
//! is gone from the tree).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use tokio::sync::watch;
use wdp_dra::apiserver::standin::{ApiServerStandIn, Fault, Verb};
use wdp_dra::publisher::Publisher;
use wdp_dra::seam::{Device, Inventory, Pool};

use super::sizes::Sizes;
use crate::report::{Report, Row};

/// The driver every node publishes.
const DRIVER: &str = "fleet.wdp.dev";
/// Devices per node.
const DEVICES: usize = 4;
/// How long one scenario may take before the run fails.
const BOUND: Duration = Duration::from_secs(300);

fn inventory(node: &str) -> Inventory {
    Inventory {
        pools: vec![Pool {
            name: node.into(),
            node_name: node.into(),
            devices: (0..DEVICES)
                .map(|i| Device {
                    id: format!("dev-{i}"),
                    dev_type: "dev".into(),
                    healthy: true,
                    ..Device::default()
                })
                .collect(),
        }],
    }
}

/// The simulated nodes' publishers.
struct Fleet {
    nodes: Vec<(watch::Sender<Inventory>, tokio::task::JoinHandle<()>)>,
}

impl Fleet {
    fn start(api: &ApiServerStandIn, count: usize) -> Self {
        let nodes = (0..count)
            .map(|i| {
                let (tx, rx) = watch::channel(inventory(&format!("node-{i:05}")));
                let publisher = Publisher::new(api.client(), DRIVER);
                let task = tokio::spawn(publisher.run(rx, std::future::pending()));
                (tx, task)
            })
            .collect();
        Self { nodes }
    }

    /// Every publisher stopped at once (its watch with it), as a node's wdp killed.
    fn stop(self) {
        for (_, task) in self.nodes {
            task.abort();
        }
    }
}

/// The slice requests so far, by verb.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    lists: u64,
    watches: u64,
    writes: u64,
}

impl Counts {
    fn of(api: &ApiServerStandIn) -> Self {
        Self {
            lists: api.requests(Verb::List),
            watches: api.requests(Verb::Watch),
            writes: [
                Verb::Create,
                Verb::Update,
                Verb::Delete,
                Verb::DeleteCollection,
            ]
            .into_iter()
            .map(|v| api.requests(v))
            .sum(),
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            lists: self.lists - before.lists,
            watches: self.watches - before.watches,
            writes: self.writes - before.writes,
        }
    }

    fn total(self) -> u64 {
        self.lists + self.watches + self.writes
    }
}

/// Healthy devices published per node, when every node has a slice.
fn healthy_everywhere(api: &ApiServerStandIn, nodes: usize) -> Option<Vec<usize>> {
    let slices: Vec<_> = api
        .slices()
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .collect();
    (slices.len() == nodes).then(|| {
        slices
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .collect()
    })
}

/// Waits until `done` holds, looking again at every slice change and every 50 ms (watches
/// opening change no slice).
async fn until(api: &ApiServerStandIn, what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let mut changes = api.changes();
    let deadline = tokio::time::Instant::now() + BOUND;
    while !done() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "fleet: {what} not reached in {BOUND:?}"
        );
        changes.borrow_and_update();
        let _ = tokio::time::timeout(Duration::from_millis(50), changes.changed()).await;
    }
    Ok(())
}

pub async fn run(sizes: &Sizes, report: &mut Report) -> Result<()> {
    let nodes = sizes.fleet_nodes;
    let window = sizes.fleet_rest;
    let per_node = |n: u64| n as f64 / nodes as f64;
    let api = ApiServerStandIn::start()
        .await
        .context("the API server stand-in")?;
    let n = nodes as u64;

    // Start: every node lists, watches and creates its slice.
    let started = Instant::now();
    let fleet = Fleet::start(&api, nodes);
    until(&api, "every node published and watching", || {
        healthy_everywhere(&api, nodes).is_some_and(|d| d.iter().all(|d| *d == DEVICES))
            && api.requests(Verb::Watch) >= n
    })
    .await?;
    let start = Counts::of(&api);
    println!(
        "  fleet: {nodes} nodes published and watching in {:.1} s ({} lists, {} watches, {} writes)",
        started.elapsed().as_secs_f64(),
        start.lists,
        start.watches,
        start.writes
    );

    // At rest.
    tokio::time::sleep(window).await;
    let rest = Counts::of(&api).since(start);
    let per_second = rest.total() as f64 / window.as_secs_f64() * 1000.0 / nodes as f64;
    report.push(Row::value(
        "fleet at rest: API requests per 1,000 nodes",
        "0 besides the open watches",
        format!("{per_second:.2}/s"),
        "baseline 100 LIST/s".into(),
        Some(rest.total() == 0),
        &format!(
            "{nodes} publishers (one process, distinct node names, {DEVICES} devices each) against the API server stand-in, counted by verb over {} s at rest: {} lists, {} watch requests, {} writes; baseline: the previous publisher re-listed every 10 s (computed from its period, not measured)",
            window.as_secs(),
            rest.lists,
            rest.watches,
            rest.writes
        ),
    ));

    // One device change on one node.
    let before = Counts::of(&api);
    fleet.nodes[0]
        .0
        .send_modify(|inv| inv.pools[0].devices[0].healthy = false);
    until(&api, "one device down on one node", || {
        healthy_everywhere(&api, nodes)
            .is_some_and(|d| d.iter().filter(|d| **d == DEVICES - 1).count() == 1)
    })
    .await?;
    fleet.nodes[0]
        .0
        .send_modify(|inv| inv.pools[0].devices[0].healthy = true);
    until(&api, "the device back", || {
        healthy_everywhere(&api, nodes).is_some_and(|d| d.iter().all(|d| *d == DEVICES))
    })
    .await?;
    let one = Counts::of(&api).since(before);
    report.push(Row::value(
        "fleet: one device change on one node: requests",
        "1 write per change",
        format!("{}", one.total() as f64 / 2.0),
        format!("{} writes for 2 changes", one.writes),
        Some(one.writes == 2 && one.total() == 2),
        &format!(
            "one device of one of {nodes} nodes unhealthy, then healthy again: {} lists, {} watch requests, {} writes in all",
            one.lists, one.watches, one.writes
        ),
    ));

    // A health flap on every node.
    let before = Counts::of(&api);
    let flap = Instant::now();
    for (tx, _) in &fleet.nodes {
        tx.send_modify(|inv| inv.pools[0].devices[0].healthy = false);
    }
    until(&api, "one device down on every node", || {
        healthy_everywhere(&api, nodes).is_some_and(|d| d.iter().all(|d| *d == DEVICES - 1))
    })
    .await?;
    for (tx, _) in &fleet.nodes {
        tx.send_modify(|inv| inv.pools[0].devices[0].healthy = true);
    }
    until(&api, "every device back", || {
        healthy_everywhere(&api, nodes).is_some_and(|d| d.iter().all(|d| *d == DEVICES))
    })
    .await?;
    let flapped = Counts::of(&api).since(before);
    report.push(Row::value(
        "fleet: a health flap on every node: requests per node",
        "2 (down, up)",
        format!("{:.2}", per_node(flapped.total())),
        format!("{:.1} s", flap.elapsed().as_secs_f64()),
        Some(flapped.total() == 2 * n),
        &format!(
            "one device down then up on each of {nodes} nodes at once: {} lists, {} watch requests, {} writes; the second figure is the time until the last node was back",
            flapped.lists, flapped.watches, flapped.writes
        ),
    ));

    // The herd: every node restarting at once, half of the lists refused.
    fleet.stop();
    api.inject(
        Verb::List,
        Fault::Status {
            code: 429,
            retry_after: Some(1),
        },
        nodes / 2,
    );
    let before = Counts::of(&api);
    let watches = api.requests(Verb::Watch);
    let herd = Instant::now();
    let fleet = Fleet::start(&api, nodes);
    until(&api, "every restarted node watching", || {
        api.requests(Verb::Watch) >= watches + n
    })
    .await?;
    let settled = herd.elapsed();
    let restarted = Counts::of(&api).since(before);
    report.push(Row::value(
        "fleet: every node restarting at once: requests per node",
        "<= 3 (list, watch; a refused list retried once)",
        format!("{:.2}", per_node(restarted.total())),
        format!("{:.1} s", settled.as_secs_f64()),
        Some(restarted.total() <= 3 * n && restarted.writes == 0),
        &format!(
            "{nodes} publishers stopped and started again at once, the first {} lists answered 429 with Retry-After: 1: {} lists, {} watch requests, {} writes (the slices were unchanged); the second figure is the time until every node watched again",
            nodes / 2,
            restarted.lists,
            restarted.watches,
            restarted.writes
        ),
    ));
    fleet.stop();
    Ok(())
}
