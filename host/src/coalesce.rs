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

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::bindings::types as wit;
use crate::metrics::ScannerMetrics;
use crate::sandbox::{SinkClosed, TreeSink};

/// Shortest time between two trees of one scanner taken for validation.
pub const NOTIFY_INTERVAL: Duration = Duration::from_millis(100);

/// A notified tree as the guest gave it, with its attributes and what their host form was
/// charged as they were lifted.
pub type Notified = (wit::DeviceTree, Vec<wit::DeviceAttributes>, usize);

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
    /// The latest tree not yet taken.
    pending: Option<Notified>,
    /// When a tree was last taken.
    last: Option<Instant>,
    /// The taker is gone.
    closed: bool,
}

impl Slot {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A coalescing pair for one scanner instance: the sink its store is given, and the supervisor's
/// end.
pub fn coalescing(metrics: Arc<ScannerMetrics>) -> (NotifySink, Latest) {
    coalescing_every(NOTIFY_INTERVAL, metrics)
}

fn coalescing_every(interval: Duration, metrics: Arc<ScannerMetrics>) -> (NotifySink, Latest) {
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
        },
        Latest { slot },
    )
}

/// The sandbox's end: keeps the latest notified tree.
pub struct NotifySink {
    slot: Arc<Slot>,
    metrics: Arc<ScannerMetrics>,
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
            let due = state.pending.is_none()
                && state
                    .last
                    .is_none_or(|last| Instant::now() >= last + self.slot.interval);
            (state.pending.replace((tree, attributes, bytes)), due)
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

    /// The pending tree, if any; the interval starts again now.
    pub fn take(&mut self) -> Option<Notified> {
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

    fn id(notified: Option<Notified>) -> String {
        notified.expect("a tree").0[0].devices[0].id.clone()
    }

    #[tokio::test]
    async fn a_burst_reaches_its_taker_as_its_latest_tree() {
        let metrics = Arc::new(ScannerMetrics::default());
        // An interval no test outlasts: every notify after the first is in its burst.
        let (mut sink, mut latest) = coalescing_every(Duration::from_secs(3600), metrics.clone());
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
        let (mut sink, mut latest) = coalescing_every(interval, Arc::default());
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

    #[tokio::test]
    async fn a_cancelled_wait_loses_nothing() {
        let (mut sink, mut latest) = coalescing_every(Duration::from_secs(3600), Arc::default());
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
