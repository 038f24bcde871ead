//! Coalescing a scanner's notifies: a burst of trees reaches validation, and kubelet, as its
//! latest tree.
//!
//! A guest may call `notify` as fast as it can (a hostile one did 174,000 times a second); every
//! tree validated and served would cost the host a validation, copies and a ListAndWatch update
//! each, and kubelet an update each. So the sink the sandbox is given ([`NotifySink`]) only keeps
//! the latest tree, and the supervisor takes it ([`Latest::ready`], [`Latest::take`]) at most
//! once per [`NOTIFY_INTERVAL`]:
//!
//! - the first notify after a quiet interval is taken at once: a hot-plug is not delayed;
//! - a notify within the interval of the last one taken waits for the interval's end, and a
//!   later notify meanwhile replaces it (counted in `notifies_coalesced`): the latest wins;
//! - the latest is never lost: it is taken when the interval ends, whatever the guest does
//!   meanwhile, and when the guest's scan ends the supervisor takes what is left.
//!
//! The host holds at most one pending tree per scanner, whatever the guest's pace: the guest never
//! waits in `notify`, and a tree it replaces is dropped at once.
//!
//! Changes (`notify-changes`) are coalesced the same way, merged into one pending set
//! ([`ChangeSet`]) held to the guest's memory limit. They apply to the last tree the host
//! accepted, so they are taken only while the host holds it: the supervisor says so after each
//! validation ([`Latest::in_step`]), and the first changes of an instance, changes after a refusal,
//! changes behind a pending whole tree and changes that would hold more than the limit are turned
//! away (the guest is told to notify its whole tree). The supervisor keeps the tree changes apply
//! to only for an instance that has sent some ([`Latest::wants_base`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::bindings::types as wit;
use crate::changes::ChangeSet;
use crate::metrics::ScannerMetrics;
use crate::sandbox::{SinkClosed, TreeSink};

/// Shortest time between two trees of one scanner taken for validation.
pub const NOTIFY_INTERVAL: Duration = Duration::from_millis(100);

/// A notified tree as the guest gave it, with its attributes and what their host form was
/// charged as they were lifted.
pub type Notified = (wit::DeviceTree, Vec<wit::DeviceAttributes>, usize);

/// What waits to be taken: a whole tree, or changes to the last one accepted.
#[derive(Debug)]
pub enum Pending {
    /// A tree from `notify` or `notify-with-attributes`.
    Tree(Notified),
    /// Changes from `notify-changes`, merged.
    Changes(ChangeSet),
}

/// What the sink and the supervisor share.
struct Slot {
    /// [`NOTIFY_INTERVAL`], but in tests.
    interval: Duration,
    state: Mutex<State>,
    /// Signalled on each notify.
    notified: Notify,
    /// Signalled on each take, and when the taker is gone.
    taken: Notify,
}

#[derive(Default)]
struct State {
    /// The latest tree, or the changes, not yet taken.
    pending: Option<Pending>,
    /// When a tree was last taken.
    last: Option<Instant>,
    /// The taker is gone.
    closed: bool,
    /// The taker holds the tree the guest's next changes apply to.
    in_step: bool,
    /// The guest sent changes: the taker is to keep the tree they apply to.
    wants_base: bool,
}

impl Slot {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A coalescing pair for one scanner instance: the sink its store is given, and the supervisor's
/// end. Pending changes are held to `memory`, the guest's memory limit.
pub fn coalescing(metrics: Arc<ScannerMetrics>, memory: usize) -> (NotifySink, Latest) {
    coalescing_every(NOTIFY_INTERVAL, metrics, memory)
}

fn coalescing_every(
    interval: Duration,
    metrics: Arc<ScannerMetrics>,
    memory: usize,
) -> (NotifySink, Latest) {
    let slot = Arc::new(Slot {
        interval,
        state: Mutex::default(),
        notified: Notify::new(),
        taken: Notify::new(),
    });
    (
        NotifySink {
            slot: slot.clone(),
            metrics,
            memory,
        },
        Latest { slot },
    )
}

/// The sandbox's end: keeps the latest notified tree.
pub struct NotifySink {
    slot: Arc<Slot>,
    metrics: Arc<ScannerMetrics>,
    /// The guest's memory limit, which pending changes may not pass.
    memory: usize,
}

impl NotifySink {
    /// Waits until what is pending was taken (or the taker is gone).
    fn taken(&self) -> BoxFuture<'static, Result<(), SinkClosed>> {
        let slot = self.slot.clone();
        Box::pin(async move {
            loop {
                let taken = slot.taken.notified();
                {
                    let state = slot.state();
                    if state.closed {
                        return Err(SinkClosed);
                    }
                    if state.pending.is_none() {
                        return Ok(());
                    }
                }
                taken.await;
            }
        })
    }

    /// Whether what is pending now is due at once: nothing was pending and the interval since
    /// the last take has passed.
    fn due(&self, state: &State) -> bool {
        state.pending.is_none()
            && state
                .last
                .is_none_or(|last| Instant::now() >= last + self.slot.interval)
    }
}

impl TreeSink for NotifySink {
    fn notify(
        &mut self,
        tree: wit::DeviceTree,
        attributes: Vec<wit::DeviceAttributes>,
        bytes: usize,
    ) -> BoxFuture<'_, Result<(), SinkClosed>> {
        // The scan that began at the guest's last wake-up ends here, whenever it is validated.
        self.metrics.notified();
        let (replaced, due) = {
            let mut state = self.slot.state();
            if state.closed {
                return Box::pin(async { Err(SinkClosed) });
            }
            let due = self.due(&state);
            // Changes after this tree apply to it, once it is accepted.
            state.in_step = false;
            let replaced = state
                .pending
                .replace(Pending::Tree((tree, attributes, bytes)));
            (replaced, due)
        };
        if replaced.is_some() {
            ScannerMetrics::bump(&self.metrics.notifies_coalesced);
        }
        // Dropped outside the lock: a large tree takes a while to free.
        drop(replaced);
        self.slot.notified.notify_one();
        if !due {
            return Box::pin(async { Ok(()) });
        }
        // The first tree after a quiet interval goes out at once: the guest waits until it is
        // taken, so its next notify cannot replace it first.
        self.taken()
    }

    fn changes(
        &mut self,
        changes: Vec<wit::GroupChanges>,
        attributes: Vec<wit::DeviceAttributes>,
        bytes: usize,
    ) -> BoxFuture<'_, Result<bool, SinkClosed>> {
        self.metrics.notified();
        let (merged, due, dropped) = {
            let mut guard = self.slot.state();
            let state = &mut *guard;
            if state.closed {
                return Box::pin(async { Err(SinkClosed) });
            }
            state.wants_base = true;
            let due = self.due(state);
            let in_step = state.in_step;
            let fits = |held: usize| held.saturating_add(bytes) <= self.memory;
            match &mut state.pending {
                // The changes apply to a tree not yet accepted: it is to be sent again whole.
                Some(Pending::Tree(_)) => (false, due, None),
                _ if !in_step => (false, due, None),
                Some(Pending::Changes(set)) if fits(set.bytes) => {
                    ScannerMetrics::bump(&self.metrics.notifies_coalesced);
                    set.merge(changes, attributes, bytes);
                    (true, due, None)
                }
                None if fits(0) => {
                    let mut set = ChangeSet::default();
                    set.merge(changes, attributes, bytes);
                    state.pending = Some(Pending::Changes(set));
                    (true, due, None)
                }
                _ => {
                    // More than the guest's memory would wait: what waits is dropped, and the
                    // guest sends its whole tree, which replaces it all.
                    state.in_step = false;
                    (false, due, state.pending.take())
                }
            }
        };
        drop(dropped);
        if !merged {
            return Box::pin(async { Ok(false) });
        }
        self.slot.notified.notify_one();
        if !due {
            return Box::pin(async { Ok(true) });
        }
        let taken = self.taken();
        Box::pin(async move { taken.await.map(|()| true) })
    }
}

/// The supervisor's end: the latest tree, when it is due.
pub struct Latest {
    slot: Arc<Slot>,
}

impl Latest {
    /// Returns once a tree is pending and the interval since the last one taken has passed.
    /// Cancel-safe: nothing is taken here.
    pub async fn ready(&mut self) {
        let last = loop {
            // Registered before looking, so a notify in between is not missed.
            let notified = self.slot.notified.notified();
            {
                let state = self.slot.state();
                if state.pending.is_some() {
                    break state.last;
                }
            }
            notified.await;
        };
        if let Some(due) = last.map(|last| last + self.slot.interval)
            && Instant::now() < due
        {
            tokio::time::sleep_until(due).await;
        }
    }

    /// Whether the taker now holds the tree the guest's next changes apply to: true once a tree
    /// or changes were accepted, false once refused.
    pub fn in_step(&mut self, in_step: bool) {
        self.slot.state().in_step = in_step;
    }

    /// Whether the guest has sent changes, so the taker is to keep the tree they apply to.
    pub fn wants_base(&self) -> bool {
        self.slot.state().wants_base
    }

    /// The pending tree or changes, if any; the interval starts again now.
    pub fn take(&mut self) -> Option<Pending> {
        let taken = {
            let mut state = self.slot.state();
            let taken = state.pending.take();
            if taken.is_some() {
                state.last = Some(Instant::now());
            }
            taken
        };
        self.slot.taken.notify_waiters();
        taken
    }

    /// Nobody takes trees any more: the guest's next notify fails, which stops it.
    pub fn close(&mut self) {
        let dropped = {
            let mut state = self.slot.state();
            state.closed = true;
            state.pending.take()
        };
        self.slot.taken.notify_waiters();
        drop(dropped);
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    fn tree(id: &str) -> wit::DeviceTree {
        vec![wit::DeviceGroup {
            dev_type: "t".into(),
            devices: vec![wit::Device {
                id: id.into(),
                info: wit::DeviceInfo {
                    health: wit::Health::Healthy,
                    nodes: vec![],
                    mounts: vec![],
                    envs: vec![],
                    annotations: vec![],
                    numa_nodes: None,
                    cdi_devices: vec![],
                },
            }],
        }]
    }

    fn id(pending: Option<Pending>) -> String {
        match pending {
            Some(Pending::Tree(notified)) => notified.0[0].devices[0].id.clone(),
            other => panic!("expected a tree, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_burst_reaches_its_taker_as_its_latest_tree() {
        let metrics = Arc::new(ScannerMetrics::default());
        // An interval no test outlasts: every notify after the first is in its burst.
        let (mut sink, mut latest) =
            coalescing_every(Duration::from_secs(3600), metrics.clone(), usize::MAX);
        // The first notify is ready at once, and returns once it is taken.
        let (notified, taken) = tokio::join!(sink.notify(tree("a"), vec![], 0), async {
            latest.ready().now_or_never().expect("ready at once");
            latest.take()
        });
        notified.unwrap();
        assert_eq!(id(taken), "a");
        // A burst right after: each notify returns at once; the taker is not ready before the
        // interval's end, then gets the burst's last tree.
        for i in 0..1000 {
            sink.notify(tree(&format!("b{i}")), vec![], 0)
                .await
                .unwrap();
        }
        assert!(latest.ready().now_or_never().is_none());
        assert_eq!(id(latest.take()), "b999");
        assert_eq!(ScannerMetrics::get(&metrics.notifies_coalesced), 999);
        assert!(latest.take().is_none());
        // Nobody takes trees: the guest's notify fails.
        latest.close();
        assert!(sink.notify(tree("d"), vec![], 0).await.is_err());
    }

    #[tokio::test]
    async fn after_a_quiet_interval_a_tree_is_taken_at_once() {
        let interval = Duration::from_millis(20);
        let (mut sink, mut latest) = coalescing_every(interval, Arc::default(), usize::MAX);
        for name in ["a", "b"] {
            let (notified, taken) = tokio::join!(sink.notify(tree(name), vec![], 0), async {
                latest.ready().now_or_never().expect("ready at once");
                latest.take()
            });
            notified.unwrap();
            assert_eq!(id(taken), name);
            tokio::time::sleep(interval).await;
        }
    }

    fn changed(id: &str) -> Vec<wit::GroupChanges> {
        vec![wit::GroupChanges {
            dev_type: "t".into(),
            changed: vec![tree(id).remove(0).devices.remove(0)],
            removed: vec![],
        }]
    }

    fn changed_ids(pending: Option<Pending>) -> Vec<String> {
        match pending {
            Some(Pending::Changes(set)) => set.groups["t"].keys().cloned().collect(),
            other => panic!("expected changes, got {other:?}"),
        }
    }

    /// Changes are taken only while the taker holds the tree they apply to, are merged while
    /// they wait, and are turned away behind a pending tree or past the guest's memory.
    #[tokio::test]
    async fn changes_wait_merged_and_only_where_they_apply() {
        let metrics = Arc::new(ScannerMetrics::default());
        let (mut sink, mut latest) =
            coalescing_every(Duration::from_secs(3600), metrics.clone(), 100);
        // Nothing accepted yet: turned away, and the taker is asked to keep the next tree.
        assert!(!latest.wants_base());
        assert!(!sink.changes(changed("a"), vec![], 10).await.unwrap());
        assert!(latest.wants_base());
        assert!(latest.take().is_none(), "turned-away changes are not kept");
        // The taker holds the tree: the first changes go out at once (the guest waits for the
        // take), the next ones wait merged.
        latest.in_step(true);
        let (applied, taken) = tokio::join!(sink.changes(changed("a"), vec![], 10), async {
            latest.ready().await;
            latest.take()
        });
        assert!(applied.unwrap());
        assert_eq!(changed_ids(taken), ["a"]);
        assert!(sink.changes(changed("b"), vec![], 10).await.unwrap());
        assert!(sink.changes(changed("c"), vec![], 10).await.unwrap());
        assert_eq!(ScannerMetrics::get(&metrics.notifies_coalesced), 1);
        assert_eq!(changed_ids(latest.take()), ["b", "c"]);
        // Past the guest's memory (100 bytes) what waits is dropped: the guest sends its tree.
        assert!(sink.changes(changed("d"), vec![], 60).await.unwrap());
        assert!(!sink.changes(changed("e"), vec![], 60).await.unwrap());
        assert!(latest.take().is_none());
        assert!(
            !sink.changes(changed("f"), vec![], 1).await.unwrap(),
            "out of step"
        );
        // A tree is pending: changes to it wait for it to be accepted, so are turned away.
        latest.in_step(true);
        sink.notify(tree("g"), vec![], 0).await.unwrap();
        assert!(!sink.changes(changed("h"), vec![], 1).await.unwrap());
        assert!(matches!(latest.take(), Some(Pending::Tree(_))));
    }

    #[tokio::test]
    async fn a_cancelled_wait_loses_nothing() {
        let (mut sink, mut latest) =
            coalescing_every(Duration::from_secs(3600), Arc::default(), usize::MAX);
        tokio::join!(sink.notify(tree("a"), vec![], 0), async {
            latest.ready().await;
            latest.take()
        })
        .0
        .unwrap();
        sink.notify(tree("b"), vec![], 0).await.unwrap();
        // Waiting is cut short by something else, as when the guest's scan ends first: the tree
        // is still there for the last take.
        assert!(latest.ready().now_or_never().is_none());
        assert_eq!(id(latest.take()), "b");
    }
}
