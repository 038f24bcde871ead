//! Keeps the API server's ResourceSlices of this driver on this node what the inventory says,
//! with no request at rest but one open watch.
//!
//! The publisher follows each node's slices through one [`SliceWatcher`] (list once, then
//! watch from the list's resourceVersion with bookmarks; list again only after a 410 Gone) into
//! a [`SliceCache`], and a pass compares the slices the inventory gives
//! ([`crate::slices::pool_slices`]) with that cache: it writes what differs, deletes what is not
//! wanted (a pool gone, a slice no longer needed), and reads nothing. A pass runs at every
//! inventory change and at every watch event that changes the cache: the echo of the
//! publisher's own write is already known from the write's answer and starts none, while
//! kubelet's deletions (all of a node's slices when it
//! starts, a driver's 30 s after it stopped being usable) and another writer's changes differ
//! and are repaired within milliseconds. A pass that lists first can be asked for without
//! changing anything, with `send_modify(|_| ())` on the inventory's sender: what wdp does when
//! kubelet registers the driver, a rare event after which the node's slices are worth reading
//! afresh.
//!
//! **Pools stay whole.** The scheduler reads a pool from the slices of its highest generation
//! and uses it only when there are `resourceSliceCount` of them. A changed pool gets a new
//! generation, higher than any the API server holds for it and than any this publisher wrote;
//! its slices are written in order, each with the new generation and count, so the slices of
//! that generation always agree, and until the last is written the pool is incomplete (unused)
//! rather than mixed; the slices left over at an older generation are deleted last. A pass cut
//! short (a conflict, a throttled or failed request) is taken up again at the same generation
//! when the slices written so far are still what is wanted, so a retry finishes the pool
//! instead of rewriting it.
//!
//! **Failures** back off ([`Backoff`]: exponential with jitter, never sooner than the server's
//! `Retry-After`); a 409 Conflict means the cache is behind a write it has not seen yet, and
//! the retry compares again with what the watch delivered meanwhile. While a node's cache is
//! not listed yet, that node is left alone.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::apiserver::backoff::Backoff;
use crate::apiserver::cache::SliceCache;
use crate::apiserver::watch::{Observation, SliceWatcher};
use crate::apiserver::{ApiError, SliceStore};
use crate::seam::{Inventory, Pool};
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
    /// What the API server holds on each node whose slices were listed.
    caches: BTreeMap<String, SliceCache>,
}

/// A task that is stopped when this is dropped: a node's watch, while the node is published to.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn name_of(slice: &ResourceSlice) -> String {
    slice.metadata.name.clone().unwrap_or_default()
}

impl<S: SliceStore> Publisher<S> {
    /// A publisher of `driver`'s slices through `store`.
    pub fn new(store: S, driver: impl Into<String>) -> Self {
        Self {
            store,
            driver: driver.into(),
            generations: BTreeMap::new(),
            nodes: BTreeSet::new(),
            caches: BTreeMap::new(),
        }
    }

    /// One pass with fresh lists: each node's slices listed, then made what `inventory` says.
    /// What [`Publisher::run`] does without listing, from its watches.
    pub async fn reconcile(&mut self, inventory: &Inventory) -> Result<Report, ApiError> {
        self.nodes
            .extend(inventory.pools.iter().map(|p| p.node_name.clone()));
        for node in self.nodes.clone() {
            let list = self.store.list_at(&node, &self.driver).await?;
            match self.caches.get_mut(&node) {
                Some(cache) => cache.listed(list),
                None => {
                    self.caches.insert(node, SliceCache::from_list(list));
                }
            }
        }
        self.publish(inventory).await
    }

    /// One pass against the caches: every node whose slices are known made to hold the slices
    /// of `inventory`, writing only what differs.
    async fn publish(&mut self, inventory: &Inventory) -> Result<Report, ApiError> {
        let mut report = Report::default();
        self.nodes
            .extend(inventory.pools.iter().map(|p| p.node_name.clone()));
        for node in self.nodes.clone() {
            let pools: Vec<&Pool> = inventory
                .pools
                .iter()
                .filter(|p| p.node_name == node)
                .collect();
            let Some(cache) = self.caches.get_mut(&node) else {
                if pools.is_empty() {
                    // Never listed, nothing published there: nothing to clean up.
                    self.nodes.remove(&node);
                }
                continue;
            };
            let mut unwanted: BTreeSet<String> = cache.slices().keys().cloned().collect();
            for pool in pools.iter().copied() {
                let key = (node.clone(), pool.name.clone());
                let held: Vec<&ResourceSlice> = cache
                    .slices()
                    .values()
                    .filter(|s| s.spec.pool.name == pool.name)
                    .collect();
                let held_generation = held.iter().map(|s| s.spec.pool.generation).max();
                let ours = self.generations.get(&key).copied();
                // The held generation goes on when every slice already at it is one wanted at
                // it (nothing changed, or a pass was cut short); anything else is a new state.
                let go_on = held_generation
                    .filter(|g| ours.is_none_or(|o| o <= *g))
                    .map(|g| (g, pool_slices(&self.driver, pool, g)))
                    .filter(|(g, wanted)| {
                        held.iter()
                            .filter(|h| h.spec.pool.generation == *g)
                            .all(|h| {
                                wanted
                                    .iter()
                                    .any(|w| w.metadata.name == h.metadata.name && w.spec == h.spec)
                            })
                    });
                let (generation, wanted) = match go_on {
                    Some(found) => found,
                    None => {
                        let generation = match (held_generation, ours) {
                            (None, None) => 0,
                            (a, b) => a.into_iter().chain(b).max().unwrap_or(0) + 1,
                        };
                        (generation, pool_slices(&self.driver, pool, generation))
                    }
                };
                self.generations.insert(key, generation);
                for mut slice in wanted {
                    let name = name_of(&slice);
                    unwanted.remove(&name);
                    let held = cache.slices().get(&name);
                    if held.is_some_and(|h| h.spec == slice.spec) {
                        continue;
                    }
                    let written = match held {
                        Some(old) => {
                            slice.metadata.resource_version = old.metadata.resource_version.clone();
                            let written = self.store.update(&slice).await?;
                            report.updated += 1;
                            written
                        }
                        None => {
                            let written = self.store.create(&slice).await?;
                            report.created += 1;
                            written
                        }
                    };
                    cache.wrote(written);
                }
            }
            // What is left is no wanted slice of any pool on this node; deleted after the
            // wanted ones are written, so a pool's older generation goes last.
            for name in unwanted {
                match self.store.delete(&name).await {
                    Ok(()) | Err(ApiError::NotFound(_)) => {
                        cache.removed(&name);
                        report.deleted += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            if pools.is_empty() {
                self.nodes.remove(&node);
                self.caches.remove(&node);
                self.generations.retain(|(n, _), _| *n != node);
            }
        }
        Ok(report)
    }

    /// What the watch of `node` saw, into its cache; whether that may call for a write (a
    /// list, or an event that changed what is known; not the echo of an own write).
    fn observe(&mut self, node: &str, seen: Observation) -> bool {
        if !self.nodes.contains(node) {
            // Its watch was stopped after this was sent.
            return false;
        }
        match seen {
            Observation::Listed(list) => {
                match self.caches.get_mut(node) {
                    Some(cache) => cache.listed(list),
                    None => {
                        self.caches
                            .insert(node.to_owned(), SliceCache::from_list(list));
                    }
                }
                true
            }
            Observation::Changed(event) => self
                .caches
                .get_mut(node)
                .is_some_and(|cache| cache.observed(&event)),
        }
    }

    /// Publishes until `shutdown` completes: a pass at every inventory change and at every
    /// watch event that changes what is known, each comparing with the watched state and writing only what differs. A
    /// failed pass is logged and tried again after a pause ([`Backoff`]); changes meanwhile
    /// wait for it.
    pub async fn run(
        mut self,
        mut inventory: watch::Receiver<Inventory>,
        shutdown: impl Future<Output = ()>,
    ) where
        S: Clone,
    {
        tokio::pin!(shutdown);
        let (seen_tx, mut seen) = mpsc::channel::<(String, Observation)>(64);
        let mut watches: BTreeMap<String, AbortOnDrop> = BTreeMap::new();
        let mut backoff = Backoff::default();
        let mut retry_at: Option<Instant> = None;
        let mut due = true;
        // The inventory of the last pass, and whether a pass was asked for without a change.
        let mut last: Option<Inventory> = None;
        let mut relist = false;
        loop {
            if due && retry_at.is_none_or(|at| at <= Instant::now()) {
                due = false;
                retry_at = None;
                let current = inventory.borrow_and_update().clone();
                self.nodes
                    .extend(current.pools.iter().map(|p| p.node_name.clone()));
                self.start_watches(&mut watches, &seen_tx);
                let pass = if relist {
                    self.reconcile(&current).await
                } else {
                    self.publish(&current).await
                };
                last = Some(current);
                match pass {
                    Ok(report) => {
                        relist = false;
                        backoff.reset();
                        if report.changed() {
                            tracing::info!(driver = %self.driver, ?report, "ResourceSlices published");
                        }
                    }
                    Err(e) => {
                        let pause = backoff.pause(&e);
                        tracing::warn!(driver = %self.driver, error = %e, ?pause, "ResourceSlices not published; retrying");
                        retry_at = Some(Instant::now() + pause);
                        due = true;
                    }
                }
                watches.retain(|node, _| self.nodes.contains(node));
            }
            let retry = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut shutdown => return,
                changed = inventory.changed() => {
                    if changed.is_err() { return }
                    relist |= last.as_ref() == Some(&*inventory.borrow());
                    due = true;
                }
                Some((node, observed)) = seen.recv() => {
                    due |= self.observe(&node, observed);
                    // Events that came together make one pass.
                    while let Ok((node, observed)) = seen.try_recv() {
                        due |= self.observe(&node, observed);
                    }
                }
                () = retry => {}
            }
        }
    }

    /// A watch for every node published to that has none.
    fn start_watches(
        &self,
        watches: &mut BTreeMap<String, AbortOnDrop>,
        seen: &mpsc::Sender<(String, Observation)>,
    ) where
        S: Clone,
    {
        for node in &self.nodes {
            if watches.contains_key(node) {
                continue;
            }
            let mut watcher = SliceWatcher::new(self.store.clone(), node, &self.driver);
            let (name, tx) = (node.clone(), seen.clone());
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::standin::{ApiServerStandIn, Fault, Options, Verb, validate};
    use crate::seam::{Device, Pool};
    use std::time::Duration;

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
        let task = tokio::spawn(again.run(rx, async {
            let _ = stopped.await;
        }));
        tx.send_modify(|inv| inv.pools[0] = pool("node-a", &["gpu-0", "gpu-1"]));
        crate::testing::wait_for(|| devices(&server).len() == 2).await;
        assert!(devices(&server).iter().all(|(_, g, _)| *g == 1));
        // Wiped while running: the watch sees it and the publisher writes them again.
        server.wipe_slices(None, Some(DRIVER));
        crate::testing::wait_for(|| devices(&server).len() == 2).await;
        let _ = stop.send(());
        task.await.unwrap();
    }

    /// How long a wiped slice may stay away when only the watch can notice: what "at once" means
    /// here, with room for a loaded machine.
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
        let task = tokio::spawn(publisher.run(rx, std::future::pending()));
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
        assert_eq!(server.lists(), lists, "repaired from the watch, not a list");

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
        let task = tokio::spawn(Publisher::new(client, DRIVER).run(rx, std::future::pending()));
        crate::testing::wait_for(wanted_back(&server)).await;
        crate::testing::wait_for(|| server.watches() == 1).await;

        // The API server now wants the rotated token, and the open watch ends: the watcher's
        // next attempt with the old file is refused...
        server.set_token("second");
        server.end_watches();
        crate::testing::wait_for(|| server.unauthorized() > 0).await;
        // ...with a backoff, not in a loop: a few attempts in two seconds (pauses from 100 ms,
        // doubling).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let refused = server.unauthorized();
        assert!(refused <= 6, "{refused} attempts refused in 2 s");
        // ...until kubelet writes the new token: the watch starts again with it, from where it
        // was, and a wipe meanwhile is seen and repaired.
        std::fs::write(dir.path().join("token"), "second\n").unwrap();
        server.wipe_slices(Some("node-a"), None);
        let took = crate::testing::wait_within(Duration::from_secs(8), wanted_back(&server)).await;
        eprintln!("rotation, wipe -> republished in {took:?}");
        assert!(server.watches() >= 2);
        assert_eq!(server.lists(), 1, "resumed, not listed again");
        task.abort();
    }

    #[tokio::test]
    async fn a_pass_is_asked_for_without_a_change() {
        let server = ApiServerStandIn::start().await.unwrap();
        let (tx, rx) = watch::channel(Inventory {
            pools: vec![pool("node-a", &["gpu-0"])],
        });
        let publisher = Publisher::new(server.client(), DRIVER);
        let task = tokio::spawn(publisher.run(rx, std::future::pending()));
        crate::testing::wait_for(|| devices(&server).len() == 1).await;
        crate::testing::wait_for(|| server.lists() == 1).await;
        // The deletion's event lost: only the nudge brings the slices back, with one list.
        server.lose_watch_events(true);
        server.wipe_slices(Some("node-a"), None);
        tx.send_modify(|_| ());
        crate::testing::wait_for(|| devices(&server).len() == 1).await;
        assert_eq!(server.lists(), 2);
        task.abort();
    }

    fn writes(server: &ApiServerStandIn) -> u64 {
        [
            Verb::Create,
            Verb::Update,
            Verb::Delete,
            Verb::DeleteCollection,
        ]
        .into_iter()
        .map(|v| server.requests(v))
        .sum()
    }

    #[tokio::test]
    async fn at_rest_only_the_watch_one_write_per_change_and_a_list_only_after_410() {
        let server = ApiServerStandIn::start_with(Options {
            bookmarks: Some(Duration::from_millis(20)),
            ..Options::default()
        })
        .await
        .unwrap();
        let (tx, rx) = watch::channel(Inventory {
            pools: vec![pool("node-a", &["gpu-0", "gpu-1"])],
        });
        let task = AbortOnDrop(tokio::spawn(
            Publisher::new(server.client(), DRIVER).run(rx, std::future::pending()),
        ));
        crate::testing::wait_for(wanted_back(&server)).await;
        assert_eq!(writes(&server), 1);

        // At rest over several watch timeouts (and another driver's writes moving the
        // collection's version): each watch resumed, nothing listed, nothing written.
        for i in 0..4 {
            let watches = server.requests(Verb::Watch);
            server.end_watches();
            let mut nic =
                crate::testing::slice(&format!("nic-{i}"), "node-a", "nic.example.com", 0);
            nic.spec.pool.name = format!("nic-{i}");
            server.put_slice(nic).unwrap();
            crate::testing::wait_for(|| server.requests(Verb::Watch) > watches).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(server.requests(Verb::List), 1);
        assert_eq!(writes(&server), 1);

        // One device change: one write.
        tx.send_modify(|inv| inv.pools[0].devices[1].healthy = false);
        crate::testing::wait_for(|| devices(&server).len() == 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(writes(&server), 2);

        // A slice deleted by someone else comes back from the watch event: one write, no list.
        server.wipe_slices(Some("node-a"), Some(DRIVER));
        crate::testing::wait_within(REPUBLISH_BOUND, || devices(&server).len() == 1).await;
        assert_eq!((writes(&server), server.requests(Verb::List)), (3, 1));
        // Changed by someone else: rewritten.
        let mut foreign = server
            .slices()
            .into_iter()
            .find(|s| s.spec.driver == DRIVER)
            .unwrap();
        foreign.spec.devices = Some(vec![]);
        server.put_slice(foreign).unwrap();
        crate::testing::wait_within(REPUBLISH_BOUND, || devices(&server).len() == 1).await;
        assert_eq!((writes(&server), server.requests(Verb::List)), (4, 1));

        // The watch cannot resume (410): one list, and nothing written for it.
        server.expire_watches();
        crate::testing::wait_for(|| server.requests(Verb::List) == 2).await;
        server.wipe_slices(Some("node-a"), Some(DRIVER));
        crate::testing::wait_within(REPUBLISH_BOUND, || devices(&server).len() == 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!((writes(&server), server.requests(Verb::List)), (5, 2));
        assert_eq!(server.pool_violations(), Vec::<String>::new());
        drop(task);
    }

    /// 200 devices: a pool of two slices.
    fn two_slices() -> Inventory {
        let ids: Vec<String> = (0..200).map(|i| format!("gpu-{i:03}")).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        Inventory {
            pools: vec![pool("node-a", &ids)],
        }
    }

    /// Whether the driver's pool is whole (every slice at one generation, as many as its
    /// resourceSliceCount) with `count` devices.
    fn whole(server: &ApiServerStandIn, count: usize) -> bool {
        let slices: Vec<_> = server
            .slices()
            .into_iter()
            .filter(|s| s.spec.driver == DRIVER)
            .collect();
        let generation = slices.iter().map(|s| s.spec.pool.generation).max();
        slices.iter().all(|s| {
            Some(s.spec.pool.generation) == generation
                && usize::try_from(s.spec.pool.resource_slice_count) == Ok(slices.len())
        }) && devices(server).len() == count
    }

    /// A publisher through `client` of [`two_slices`], published and watching.
    async fn publishing(
        server: &ApiServerStandIn,
        client: crate::apiserver::client::ApiClient,
    ) -> (watch::Sender<Inventory>, AbortOnDrop) {
        let (tx, rx) = watch::channel(two_slices());
        let task = AbortOnDrop(tokio::spawn(
            Publisher::new(client, DRIVER).run(rx, std::future::pending()),
        ));
        crate::testing::wait_for(|| whole(server, 200)).await;
        crate::testing::wait_for(|| server.requests(Verb::Watch) == 1).await;
        (tx, task)
    }

    /// A device of the first slice turns unhealthy: both slices change.
    fn one_device_down(tx: &watch::Sender<Inventory>) {
        tx.send_modify(|inv| inv.pools[0].devices[0].healthy = false);
    }

    /// How many `verb` requests a fault case made: at most `bound`, and the pool always whole
    /// or incomplete, never mixed.
    fn bounded(server: &ApiServerStandIn, verb: Verb, before: u64, bound: u64) {
        let made = server.requests(verb) - before;
        assert!(
            made <= bound,
            "{made} {verb:?} requests, at most {bound} expected"
        );
        assert_eq!(server.pool_violations(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn throttled_429_waits_as_long_as_retry_after_says() {
        let server = ApiServerStandIn::start().await.unwrap();
        let (tx, _task) = publishing(&server, server.client()).await;
        let before = server.requests(Verb::Update);
        let throttled = Fault::Status {
            code: 429,
            retry_after: Some(1),
        };
        server.inject(Verb::Update, throttled, 2);
        let start = tokio::time::Instant::now();
        one_device_down(&tx);
        crate::testing::wait_within(Duration::from_secs(15), || whole(&server, 199)).await;
        assert!(
            start.elapsed() >= Duration::from_secs(2),
            "two Retry-After: 1 honoured, {:?}",
            start.elapsed()
        );
        // Two refused, then the two slices.
        assert_eq!(server.requests(Verb::Update) - before, 4);
        bounded(&server, Verb::Update, before, 4);
    }

    #[tokio::test]
    async fn server_errors_back_off_and_the_pool_comes_back_whole() {
        let server = ApiServerStandIn::start().await.unwrap();
        let (tx, _task) = publishing(&server, server.client()).await;
        let before = server.requests(Verb::Update);
        let unavailable = Fault::Status {
            code: 503,
            retry_after: None,
        };
        server.inject(Verb::Update, unavailable, 3);
        one_device_down(&tx);
        crate::testing::wait_within(Duration::from_secs(15), || whole(&server, 199)).await;
        bounded(&server, Verb::Update, before, 5);

        // kubelet wipes the slices while creates fail with 500: backed off, then both back.
        let before = server.requests(Verb::Create);
        let failing = Fault::Status {
            code: 500,
            retry_after: None,
        };
        server.inject(Verb::Create, failing, 3);
        server.wipe_slices(Some("node-a"), None);
        crate::testing::wait_within(Duration::from_secs(15), || whole(&server, 199)).await;
        bounded(&server, Verb::Create, before, 5);
        assert_eq!(server.requests(Verb::List), 1);
    }

    #[tokio::test]
    async fn a_conflict_mid_pool_finishes_the_pool_instead_of_rewriting_it() {
        let server = ApiServerStandIn::start().await.unwrap();
        let (tx, _task) = publishing(&server, server.client()).await;
        let before = server.requests(Verb::Update);
        let conflict = Fault::Status {
            code: 409,
            retry_after: None,
        };
        // The first slice is written at the new generation, the second meets a conflict: the
        // pool is incomplete (not mixed) until the retry writes the second slice only.
        server.inject_after(Verb::Update, 1, conflict, 1);
        one_device_down(&tx);
        crate::testing::wait_within(Duration::from_secs(15), || whole(&server, 199)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(server.requests(Verb::Update) - before, 3);
        bounded(&server, Verb::Update, before, 3);
        assert!(devices(&server).iter().all(|(_, g, _)| *g == 1));
    }

    #[tokio::test]
    async fn an_answer_slower_than_the_client_waits_is_retried_without_a_rewrite() {
        let server = ApiServerStandIn::start().await.unwrap();
        let client = server
            .client()
            .with_call_timeout(Duration::from_millis(300));
        let (tx, _task) = publishing(&server, client).await;
        let before = server.requests(Verb::Update);
        // The update is done, but its answer comes after the client gave up: the watch shows
        // it was done, and the retry writes only what is left.
        server.inject(Verb::Update, Fault::Slow(Duration::from_secs(2)), 1);
        one_device_down(&tx);
        crate::testing::wait_within(Duration::from_secs(15), || whole(&server, 199)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        bounded(&server, Verb::Update, before, 3);
        assert!(devices(&server).iter().all(|(_, g, _)| *g == 1));
    }

    #[tokio::test]
    async fn a_watch_reset_mid_stream_is_resumed_without_a_list() {
        let server = ApiServerStandIn::start().await.unwrap();
        let (_tx, _task) = publishing(&server, server.client()).await;
        let watches = server.requests(Verb::Watch);
        // Reset, and the next two attempts answered 503: backed off, then resumed from where
        // it was, so a wipe meanwhile is seen from the replayed history.
        server.inject(
            Verb::Watch,
            Fault::Status {
                code: 503,
                retry_after: None,
            },
            2,
        );
        server.reset_watches();
        server.wipe_slices(Some("node-a"), None);
        crate::testing::wait_within(Duration::from_secs(15), || whole(&server, 200)).await;
        assert_eq!(server.requests(Verb::List), 1);
        bounded(&server, Verb::Watch, watches, 3);
    }
}
