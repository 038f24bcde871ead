//! Keeps the API server's ResourceSlices of this driver on this node what the inventory says.
//!
//! Each pass lists the driver's slices on each node (through [`SliceStore`]), compares them with
//! the slices the inventory gives ([`crate::slices::pool_slices`]), writes what differs and
//! deletes what is not wanted (a pool gone, a slice no longer needed). A changed pool gets a new
//! generation, higher than any the API server holds for it and than any this publisher wrote,
//! so the scheduler never mixes slices of two states.
//!
//! A pass runs at start, at every inventory change, whenever the watch of a node's slices
//! ([`SliceWatcher`]) shows them differ from what the last pass left (kubelet deletes all of a
//! node's slices when it starts and a driver's 30 s after the driver stops being usable; the
//! watch sees that within milliseconds, and the pass puts them back), and every `resync` as a
//! safety net. The watch's echo of the publisher's own writes matches what it wrote and starts
//! no pass. A pass can also be asked for without changing anything, with `send_modify(|_| ())` on
//! the inventory's sender.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use tokio::sync::{mpsc, watch};

use crate::apiserver::watch::{Observation, SliceWatcher};
use crate::apiserver::{ApiError, SliceStore, WatchEvent};
use crate::seam::Inventory;
use crate::slices::pool_slices;

/// What one pass changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Slices created.
    pub created: usize,
    /// Slices updated.
    pub updated: usize,
    /// Slices deleted.
    pub deleted: usize,
}

impl Report {
    /// Whether the pass wrote anything.
    pub fn changed(&self) -> bool {
        self.created + self.updated + self.deleted > 0
    }
}

/// The publisher of one driver.
pub struct Publisher<S> {
    store: S,
    driver: String,
    /// The last generation written per (node, pool).
    generations: BTreeMap<(String, String), i64>,
    /// Every node published to, so a pool that leaves the inventory is still cleaned up.
    nodes: BTreeSet<String>,
    /// What the last pass left on each node: slice name -> spec. A watched slice that differs
    /// from this (or is missing from it, or is deleted from it) starts a pass.
    published: BTreeMap<String, BTreeMap<String, ResourceSliceSpec>>,
}

/// A task that is stopped when this is dropped: a node's watch, while the node is published to.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<S: SliceStore> Publisher<S> {
    /// A publisher of `driver`'s slices through `store`.
    pub fn new(store: S, driver: impl Into<String>) -> Self {
        Self {
            store,
            driver: driver.into(),
            generations: BTreeMap::new(),
            nodes: BTreeSet::new(),
            published: BTreeMap::new(),
        }
    }

    /// One pass: the API server made to hold the slices of `inventory`.
    pub async fn reconcile(&mut self, inventory: &Inventory) -> Result<Report, ApiError> {
        let mut report = Report::default();
        self.nodes
            .extend(inventory.pools.iter().map(|p| p.node_name.clone()));
        for node in self.nodes.clone() {
            let existing = self.store.list(&node, &self.driver).await?;
            let mut by_name: BTreeMap<String, ResourceSlice> = existing
                .into_iter()
                .filter_map(|s| s.metadata.name.clone().map(|n| (n, s)))
                .collect();
            let mut left = BTreeMap::new();
            for pool in inventory.pools.iter().filter(|p| p.node_name == node) {
                let key = (node.clone(), pool.name.clone());
                let held: Vec<&ResourceSlice> = by_name
                    .values()
                    .filter(|s| s.spec.pool.name == pool.name)
                    .collect();
                let held_generation = held.iter().map(|s| s.spec.pool.generation).max();
                // Unchanged: the held slices are exactly the wanted ones at the held generation.
                if let Some(generation) = held_generation {
                    let wanted = pool_slices(&self.driver, pool, generation);
                    let same = wanted.len() == held.len()
                        && wanted.iter().all(|w| {
                            by_name
                                .get(w.metadata.name.as_deref().unwrap_or_default())
                                .is_some_and(|h| h.spec == w.spec)
                        });
                    if same {
                        self.generations.insert(key, generation);
                        for w in wanted {
                            let name = w.metadata.name.clone().unwrap_or_default();
                            by_name.remove(&name);
                            left.insert(name, w.spec);
                        }
                        continue;
                    }
                }
                let generation = match (held_generation, self.generations.get(&key)) {
                    (None, None) => 0,
                    (a, b) => a.into_iter().chain(b.copied()).max().unwrap_or(0) + 1,
                };
                for mut slice in pool_slices(&self.driver, pool, generation) {
                    let name = slice.metadata.name.clone().unwrap_or_default();
                    left.insert(name.clone(), slice.spec.clone());
                    match by_name.remove(&name) {
                        Some(old) => {
                            slice.metadata.resource_version = old.metadata.resource_version;
                            self.store.update(&slice).await?;
                            report.updated += 1;
                        }
                        None => {
                            self.store.create(&slice).await?;
                            report.created += 1;
                        }
                    }
                }
                self.generations.insert(key, generation);
            }
            // What is left is no wanted slice of any pool on this node.
            for name in by_name.keys() {
                match self.store.delete(name).await {
                    Ok(()) | Err(ApiError::NotFound(_)) => report.deleted += 1,
                    Err(e) => return Err(e),
                }
            }
            if inventory.pools.iter().any(|p| p.node_name == node) {
                self.published.insert(node, left);
            } else {
                self.nodes.remove(&node);
                self.published.remove(&node);
            }
        }
        Ok(report)
    }

    /// Whether `seen` on `node` shows slices other than the last pass left there.
    fn differs(&self, node: &str, seen: &Observation) -> bool {
        let empty = BTreeMap::new();
        let published = self.published.get(node).unwrap_or(&empty);
        let name = |s: &ResourceSlice| s.metadata.name.clone().unwrap_or_default();
        match seen {
            Observation::Listed(items) => {
                let listed: BTreeMap<String, &ResourceSliceSpec> =
                    items.iter().map(|s| (name(s), &s.spec)).collect();
                listed.len() != published.len()
                    || published
                        .iter()
                        .any(|(n, spec)| listed.get(n) != Some(&spec))
            }
            Observation::Changed(event) => match event.as_ref() {
                WatchEvent::Added(s) | WatchEvent::Modified(s) => {
                    published.get(&name(s)) != Some(&s.spec)
                }
                WatchEvent::Deleted(s) => published.contains_key(&name(s)),
                WatchEvent::Bookmark(_) => false,
            },
        }
    }

    /// Publishes until `shutdown` completes: a pass at start, at every inventory change, when
    /// a node's watched slices differ from what the last pass left, and every `resync`; a failed
    /// pass (API server away, a conflict with another writer) is logged and retried at the next.
    pub async fn run(
        mut self,
        mut inventory: watch::Receiver<Inventory>,
        resync: Duration,
        shutdown: impl Future<Output = ()>,
    ) where
        S: Clone,
    {
        tokio::pin!(shutdown);
        let (seen_tx, mut seen) = mpsc::channel::<(String, Observation)>(64);
        let mut watches: BTreeMap<String, AbortOnDrop> = BTreeMap::new();
        loop {
            let current = inventory.borrow_and_update().clone();
            match self.reconcile(&current).await {
                Ok(report) if report.changed() => {
                    tracing::info!(driver = %self.driver, ?report, "ResourceSlices published");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(driver = %self.driver, error = %e, "ResourceSlices not published; retrying");
                }
            }
            watches.retain(|node, _| self.nodes.contains(node));
            for node in &self.nodes {
                if watches.contains_key(node) {
                    continue;
                }
                let mut watcher = SliceWatcher::new(self.store.clone(), node, &self.driver);
                let (name, tx) = (node.clone(), seen_tx.clone());
                let task = tokio::spawn(async move {
                    loop {
                        let seen = watcher.next().await;
                        if tx.send((name.clone(), seen)).await.is_err() {
                            return;
                        }
                    }
                });
                watches.insert(node.clone(), AbortOnDrop(task));
            }
            let next_resync = tokio::time::Instant::now() + resync;
            loop {
                tokio::select! {
                    () = &mut shutdown => return,
                    changed = inventory.changed() => {
                        if changed.is_err() { return }
                        break;
                    }
                    () = tokio::time::sleep_until(next_resync) => break,
                    Some((node, observed)) = seen.recv() => {
                        if self.differs(&node, &observed) {
                            tracing::debug!(driver = %self.driver, %node, "ResourceSlices changed by someone else; publishing again");
                            break;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::standin::{ApiServerStandIn, validate};
    use crate::seam::{Device, Pool};

    const DRIVER: &str = "gpu.example.com";

    fn pool(node: &str, ids: &[&str]) -> Pool {
        Pool {
            name: node.into(),
            node_name: node.into(),
            devices: ids
                .iter()
                .map(|id| Device {
                    id: (*id).into(),
                    dev_type: "gpu".into(),
                    healthy: true,
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn devices(server: &ApiServerStandIn) -> Vec<(String, i64, String)> {
        let mut out: Vec<_> = server
            .slices()
            .into_iter()
            .flat_map(|s| {
                let pool = s.spec.pool.name.clone();
                let generation = s.spec.pool.generation;
                s.spec
                    .devices
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |d| (pool.clone(), generation, d.name))
            })
            .collect();
        out.sort();
        out
    }

    #[tokio::test]
    async fn slices_are_published_updated_cleaned_and_republished_after_a_wipe() {
        let server = ApiServerStandIn::start().await.unwrap();
        let mut publisher = Publisher::new(server.client(), DRIVER);
        let mut inventory = Inventory {
            pools: vec![pool("node-a", &["gpu-0", "gpu-1"])],
        };
        let report = publisher.reconcile(&inventory).await.unwrap();
        assert_eq!(report.created, 1);
        assert_eq!(
            devices(&server),
            [
                ("node-a".into(), 0, "gpu-0".into()),
                ("node-a".into(), 0, "gpu-1".into())
            ]
        );
        for s in server.slices() {
            assert_eq!(validate(&s), Vec::<String>::new());
        }

        // Nothing changed: nothing written.
        let writes = server.writes();
        assert!(!publisher.reconcile(&inventory).await.unwrap().changed());
        assert_eq!(server.writes(), writes);

        // A device turns unhealthy: the pool's generation goes up and the device leaves.
        inventory.pools[0].devices[1].healthy = false;
        publisher.reconcile(&inventory).await.unwrap();
        assert_eq!(devices(&server), [("node-a".into(), 1, "gpu-0".into())]);

        // Grows past one slice, then shrinks: the extra slices go.
        let many: Vec<String> = (0..200).map(|i| format!("gpu-{i}")).collect();
        let ids: Vec<&str> = many.iter().map(String::as_str).collect();
        inventory.pools[0] = pool("node-a", &ids);
        let report = publisher.reconcile(&inventory).await.unwrap();
        assert_eq!((report.created, report.updated), (1, 1));
        assert_eq!(server.slices().len(), 2);
        assert!(server.slices().iter().all(|s| s.spec.pool.generation == 2));
        inventory.pools[0] = pool("node-a", &["gpu-0"]);
        let report = publisher.reconcile(&inventory).await.unwrap();
        assert_eq!((report.updated, report.deleted), (1, 1));
        assert_eq!(devices(&server), [("node-a".into(), 3, "gpu-0".into())]);

        // kubelet wipes the node's slices: the next pass puts them back with a newer generation.
        assert_eq!(server.wipe_slices(Some("node-a"), None), 1);
        let report = publisher.reconcile(&inventory).await.unwrap();
        assert_eq!(report.created, 1);
        assert_eq!(devices(&server), [("node-a".into(), 4, "gpu-0".into())]);

        // A stale slice of this driver on this node (an earlier pool) is deleted; another
        // driver's and another node's are left alone.
        let mut stale = server.slices()[0].clone();
        stale.metadata.name = Some("leftover".into());
        stale.spec.pool.name = "old-pool".into();
        server.put_slice(stale.clone()).unwrap();
        let mut other = stale.clone();
        other.metadata.name = Some("other-driver".into());
        other.spec.driver = "nic.example.com".into();
        server.put_slice(other).unwrap();
        let report = publisher.reconcile(&inventory).await.unwrap();
        assert_eq!(report.deleted, 1);
        let mut names: Vec<_> = server
            .slices()
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect();
        names.sort();
        assert_eq!(names.len(), 2);
        assert!(names.contains(&"other-driver".to_string()));

        // The pool leaves the inventory: its slices go.
        publisher.reconcile(&Inventory::default()).await.unwrap();
        let left: Vec<_> = server
            .slices()
            .into_iter()
            .filter(|s| s.spec.driver == DRIVER)
            .collect();
        assert!(left.is_empty());
    }

    #[tokio::test]
    async fn a_restarted_publisher_continues_the_generation_and_run_follows_changes() {
        let server = ApiServerStandIn::start().await.unwrap();
        let inventory = Inventory {
            pools: vec![pool("node-a", &["gpu-0"])],
        };
        Publisher::new(server.client(), DRIVER)
            .reconcile(&inventory)
            .await
            .unwrap();
        // A new publisher (wdp restarted) with the same inventory writes nothing.
        let mut again = Publisher::new(server.client(), DRIVER);
        assert!(!again.reconcile(&inventory).await.unwrap().changed());

        let (tx, rx) = watch::channel(inventory);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(again.run(rx, Duration::from_millis(50), async {
            let _ = stopped.await;
        }));
        tx.send_modify(|inv| inv.pools[0] = pool("node-a", &["gpu-0", "gpu-1"]));
        crate::testing::wait_for(|| devices(&server).len() == 2).await;
        assert!(devices(&server).iter().all(|(_, g, _)| *g == 1));
        // Wiped while running: the resync republishes.
        server.wipe_slices(None, Some(DRIVER));
        crate::testing::wait_for(|| devices(&server).len() == 2).await;
        let _ = stop.send(());
        task.await.unwrap();
    }

    /// How long a wiped slice may stay away when only the watch can notice (the resync is an
    /// hour): what "at once" means here, with room for a loaded machine.
    const REPUBLISH_BOUND: Duration = Duration::from_secs(10);

    fn wanted_back(server: &ApiServerStandIn) -> impl FnMut() -> bool + '_ {
        || devices(server).len() == 2
    }

    #[tokio::test]
    async fn a_wipe_is_republished_through_the_watch_and_own_writes_start_no_pass() {
        let server = ApiServerStandIn::start().await.unwrap();
        let (_tx, rx) = watch::channel(Inventory {
            pools: vec![pool("node-a", &["gpu-0", "gpu-1"])],
        });
        let publisher = Publisher::new(server.client(), DRIVER);
        let task =
            tokio::spawn(publisher.run(rx, Duration::from_secs(3600), std::future::pending()));
        crate::testing::wait_for(wanted_back(&server)).await;
        crate::testing::wait_for(|| server.watches() == 1).await;
        // The watch echoes the publisher's own create: no second pass, no write.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (writes, lists) = (server.writes(), server.lists());
        assert_eq!(writes, 1);

        // kubelet wipes the node's slices (at its start): back at once, not in an hour.
        server.wipe_slices(Some("node-a"), None);
        let took = crate::testing::wait_within(REPUBLISH_BOUND, wanted_back(&server)).await;
        eprintln!("wipe -> republished in {took:?}");
        assert!(devices(&server).iter().all(|(_, g, _)| *g == 1));
        // Another writer changes the slice: put back as well.
        let mut foreign = server.slices()[0].clone();
        foreign.spec.devices = Some(vec![]);
        server.put_slice(foreign).unwrap();
        crate::testing::wait_within(REPUBLISH_BOUND, wanted_back(&server)).await;
        // And then it settles: the echoes of its repairs start no further writes (a repair
        // still under way on a loaded machine may add its own first).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let before = server.writes();
            tokio::time::sleep(Duration::from_millis(300)).await;
            if server.writes() == before {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "writes never stop");
        }
        assert!(server.lists() > lists);

        // The watch cannot resume (ended, history compacted): the watcher lists again and the
        // publisher still notices the wipe.
        server.end_watches();
        server.wipe_slices(Some("node-a"), None);
        server.compact();
        crate::testing::wait_within(REPUBLISH_BOUND, wanted_back(&server)).await;
        task.abort();
    }

    #[tokio::test]
    async fn the_watch_survives_a_token_rotation() {
        let (server, dir, client) = crate::testing::tls_server_and_client().await;
        let (_tx, rx) = watch::channel(Inventory {
            pools: vec![pool("node-a", &["gpu-0", "gpu-1"])],
        });
        let task = tokio::spawn(Publisher::new(client, DRIVER).run(
            rx,
            Duration::from_secs(3600),
            std::future::pending(),
        ));
        crate::testing::wait_for(wanted_back(&server)).await;
        crate::testing::wait_for(|| server.watches() == 1).await;

        // The API server now wants the rotated token, and the open watch ends: the watcher's
        // next attempt with the old file is refused...
        server.set_token("second");
        server.end_watches();
        crate::testing::wait_for(|| server.unauthorized() > 0).await;
        // ...until kubelet writes the new token: the watch starts again with it, from where it
        // was, and a wipe meanwhile is seen and repaired.
        std::fs::write(dir.path().join("token"), "second\n").unwrap();
        server.wipe_slices(Some("node-a"), None);
        let took = crate::testing::wait_within(Duration::from_secs(8), wanted_back(&server)).await;
        eprintln!("rotation, wipe -> republished in {took:?}");
        assert!(server.watches() >= 2);
        task.abort();
    }

    #[tokio::test]
    async fn a_pass_is_asked_for_without_a_change() {
        let server = ApiServerStandIn::start().await.unwrap();
        let (tx, rx) = watch::channel(Inventory {
            pools: vec![pool("node-a", &["gpu-0"])],
        });
        let publisher = Publisher::new(server.client(), DRIVER);
        let task =
            tokio::spawn(publisher.run(rx, Duration::from_secs(3600), std::future::pending()));
        crate::testing::wait_for(|| devices(&server).len() == 1).await;
        server.wipe_slices(Some("node-a"), None);
        // No resync for an hour: only the nudge brings the slices back.
        tx.send_modify(|_| ());
        crate::testing::wait_for(|| devices(&server).len() == 1).await;
        task.abort();
    }
}
