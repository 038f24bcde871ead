//! Running and supervising one scanner guest.
//!
//! [`supervise`] owns the guest: it instantiates it in a fresh store, calls `scan` (which loops,
//! notifying trees, until the host stops it), and on a trap, an error, a CPU or memory overrun
//! drops the store and starts again from the same `InstancePre`, with exponential backoff. Its
//! [`ScannerEvent`]s are the only thing that leaves: the caller decides what a tree means. Each
//! notified tree reaches it through the [`TreeSink`] given to the sandbox, which keeps the latest
//! of a burst ([`crate::coalesce`]); the supervisor takes it when due, and its [`EventSink`]
//! validates it ([`crate::validate`]) and sends it on.
//! Cancelling is dropping the future (or aborting the task that runs it); that drops the store and
//! the guest with it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::mpsc;

use crate::bindings::scanner::ScannerPluginPre;
use crate::bindings::types as wit;
use crate::coalesce::{Latest, Pending, coalescing};
use crate::policy::Policy;
use crate::sandbox::{Guest, GuestState, Sandbox, SinkClosed, Stopped, TreeSink, describe};
use crate::topology::Topology;
use crate::tree::{DeviceTree, OutputError};
use crate::validate::Validator;

/// What happens after a scanner fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Report the failure and stop (`wdp scan`: a dry run should fail loudly).
    Never,
    /// Restart after 1 s, doubling to 60 s; the delay resets after a minute of healthy running.
    Backoff,
}

/// First restart delay.
pub const BACKOFF_START: Duration = Duration::from_secs(1);
/// Longest restart delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Running this long before a failure counts as healthy and resets the backoff.
pub const HEALTHY_AFTER: Duration = Duration::from_secs(60);

/// Everything a supervised scanner reports, in order.
#[derive(Debug, Clone)]
pub enum ScannerEvent {
    /// A notified tree that passed validation.
    Tree(Arc<DeviceTree>),
    /// A notified tree that was refused as a whole; the previous tree stays in force.
    Refused(OutputError),
    /// The instance failed; it restarts after `restart_in`, or never when `None`.
    Failed {
        /// The cause, one line.
        error: String,
        /// When it restarts; `None`: never.
        restart_in: Option<Duration>,
    },
    /// `scan` returned ok: the scanner is done, its last tree stays served.
    Finished,
}

/// A scanner ready to run: its identity, the rules its trees must follow, and its linked
/// component.
#[derive(Clone)]
pub struct Scanner {
    /// What the sandbox gives each of its instances.
    pub guest: Guest,
    /// The rules its trees must follow.
    pub policy: Arc<Policy>,
    /// The component, linked and checked to export `scanner`.
    pub pre: ScannerPluginPre<GuestState>,
}

/// The supervisor's side of a scanner instance's `notify`: each tree validated, then sent on as a
/// [`ScannerEvent`]. Waiting for room on `events` back-pressures the guest.
pub struct EventSink {
    validator: Validator,
    events: mpsc::Sender<ScannerEvent>,
}

impl EventSink {
    /// A sink that validates with `validator` and reports to `events`.
    pub fn new(validator: Validator, events: mpsc::Sender<ScannerEvent>) -> Self {
        EventSink { validator, events }
    }

    /// The sink of one instance of `scanner` in `sandbox`, NUMA affinity read through
    /// `topology`.
    pub fn for_scanner(
        sandbox: &Sandbox,
        scanner: &Scanner,
        topology: Arc<Topology>,
        events: mpsc::Sender<ScannerEvent>,
    ) -> Self {
        let validator = Validator::new(
            scanner.guest.name.clone(),
            scanner.policy.clone(),
            scanner.guest.metrics.clone(),
            sandbox.devfs().clone(),
            topology,
        )
        .charging(usize::try_from(scanner.guest.limits.memory).unwrap_or(usize::MAX));
        EventSink::new(validator, events)
    }
}

impl EventSink {
    /// Validates and sends each tree of `latest` when it is due, until the events' reader is
    /// gone. A tree is taken only once the reader is done with every event before it (the whole
    /// queue is reserved, and the manager holds a place while it applies a tree:
    /// [`crate::manager::Manager::run`]), so a validated tree is never made while another waits
    /// or is being applied: while the reader lags, the guest's trees keep replacing the pending
    /// one instead of queueing, each validated tree a form of a possibly large tree.
    /// Cancel-safe: room is reserved before a tree is taken, so a tree taken is sent.
    async fn deliver(&mut self, latest: &mut Latest) -> SinkClosed {
        loop {
            latest.ready().await;
            let Ok(mut permits) = self.events.reserve_many(self.events.max_capacity()).await else {
                latest.close();
                return SinkClosed;
            };
            if let (Some(permit), Some(pending)) = (permits.next(), latest.take()) {
                permit.send(checked(&mut self.validator, latest, pending));
            }
        }
    }

    /// Sends what `latest` still holds: the last tree of a scan is never lost. Validated, as in
    /// [`EventSink::deliver`], only once the reader is done with every event before it.
    async fn flush(&mut self, latest: &mut Latest) {
        let Ok(mut permits) = self.events.reserve_many(self.events.max_capacity()).await else {
            latest.close();
            return;
        };
        if let (Some(permit), Some(pending)) = (permits.next(), latest.take()) {
            permit.send(checked(&mut self.validator, latest, pending));
        }
    }
}

/// A notified tree, or changes to the last one, as an event: validated, or refused. Tells
/// `latest` whether the guest's next changes can apply to what the validator now keeps.
fn checked(validator: &mut Validator, latest: &mut Latest, pending: Pending) -> ScannerEvent {
    let checked = match pending {
        Pending::Tree((tree, attributes, bytes)) => {
            validator.forget();
            let checked = validator.check_lifted(tree, attributes, bytes);
            if let Ok(tree) = &checked
                && latest.wants_base()
            {
                validator.keep(tree);
                latest.in_step(true);
            }
            checked
        }
        Pending::Changes(changes) => {
            let checked = validator.check_changes(changes);
            latest.in_step(checked.is_ok());
            checked
        }
    };
    event(checked)
}

/// A validated tree as an event, or its refusal.
fn event(checked: Result<DeviceTree, OutputError>) -> ScannerEvent {
    match checked {
        Ok(tree) => ScannerEvent::Tree(Arc::new(tree)),
        Err(e) => ScannerEvent::Refused(e),
    }
}

impl TreeSink for EventSink {
    fn notify(
        &mut self,
        tree: wit::DeviceTree,
        attributes: Vec<wit::DeviceAttributes>,
        bytes: usize,
    ) -> BoxFuture<'_, Result<(), SinkClosed>> {
        let event = event(self.validator.check_lifted(tree, attributes, bytes));
        Box::pin(async move { self.events.send(event).await.map_err(|_| SinkClosed) })
    }

    /// Used without coalescing, this sink takes whole trees only: the guest is told to send
    /// its tree.
    fn changes(
        &mut self,
        _changes: Vec<wit::GroupChanges>,
        _attributes: Vec<wit::DeviceAttributes>,
        _bytes: usize,
    ) -> BoxFuture<'_, Result<bool, SinkClosed>> {
        Box::pin(async { Ok(false) })
    }
}

/// Runs `scanner` until it finishes, fails under [`RestartPolicy::Never`], or `events` closes.
pub async fn supervise(
    sandbox: Arc<Sandbox>,
    scanner: Scanner,
    policy: RestartPolicy,
    events: mpsc::Sender<ScannerEvent>,
) {
    let name = scanner.guest.name.clone();
    // Shared by its instances: affinity read once stays known across restarts.
    let topology = Arc::new(Topology::over(sandbox.sys_reads().clone()));
    let mut delay = BACKOFF_START;
    loop {
        let started = Instant::now();
        let sink = EventSink::for_scanner(&sandbox, &scanner, topology.clone(), events.clone());
        let outcome = run_once(&sandbox, &scanner, sink).await;
        // The instance is gone, and its memory with it.
        scanner.guest.metrics.memory_reset();
        let error = match outcome {
            Ok(()) => {
                tracing::info!(
                    scanner = &*name,
                    "scanner finished; its last tree stays served"
                );
                let _ = events.send(ScannerEvent::Finished).await;
                return;
            }
            Err(error) => error,
        };
        if events.is_closed() {
            return;
        }
        crate::metrics::ScannerMetrics::bump(&scanner.guest.metrics.failures);
        if started.elapsed() >= HEALTHY_AFTER {
            delay = BACKOFF_START;
        }
        let restart_in = match policy {
            RestartPolicy::Never => None,
            RestartPolicy::Backoff => Some(delay),
        };
        tracing::warn!(scanner = &*name, %error, ?restart_in, "scanner failed");
        let failed = ScannerEvent::Failed { error, restart_in };
        if events.send(failed).await.is_err() {
            return;
        }
        let Some(wait) = restart_in else { return };
        tokio::time::sleep(wait).await;
        delay = (delay * 2).min(BACKOFF_MAX);
    }
}

/// One instance, from instantiation to the end of `scan`. The error is a one-line cause.
///
/// The guest's notifies are coalesced ([`crate::coalesce`]); `sink` validates and sends what
/// they leave, beside the guest in this task, and whatever is pending when `scan` ends (the last
/// tree before a trap included) is sent before the outcome.
async fn run_once(sandbox: &Sandbox, scanner: &Scanner, mut sink: EventSink) -> Result<(), String> {
    // A new instance: its memory is counted afresh, and its first scan starts now.
    scanner.guest.metrics.memory_reset();
    scanner.guest.metrics.woke();
    let memory = usize::try_from(scanner.guest.limits.memory).unwrap_or(usize::MAX);
    let (notify, mut latest) = coalescing(scanner.guest.metrics.clone(), memory);
    let mut store = sandbox
        .store(&scanner.guest, Box::new(notify))
        .map_err(|e| e.to_string())?;
    let plugin = scanner
        .pre
        .instantiate_async(&mut store)
        .await
        .map_err(|e| format!("instantiation failed: {}", describe(&e)))?;
    let outcome = tokio::select! {
        outcome = plugin.wdp_device_plugin_scanner().call_scan(&mut store) => outcome,
        SinkClosed = sink.deliver(&mut latest) => {
            return Err(describe(&wasmtime::Error::from(Stopped::SinkClosed)));
        }
    };
    sink.flush(&mut latest).await;
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(message)) => Err(format!("scan returned an error: {message}")),
        Err(e) => {
            let mut cause = describe(&e);
            if let Some(tail) = store.data().stderr_tail() {
                cause.push_str(&format!(" (last stderr: {tail})"));
            }
            Err(cause)
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use crate::hostfs::DevFs;
    use crate::metrics::ScannerMetrics;

    fn tree(id: &str) -> wit::DeviceTree {
        vec![wit::DeviceGroup {
            dev_type: "t".into(),
            devices: vec![crate::footprint::bare_device(id)],
        }]
    }

    /// While the reader holds a place in the queue (as the manager does while it applies a
    /// tree), the pending tree is neither taken nor validated: no second validated tree exists
    /// beside the one being applied. Once the place is free, it is.
    #[tokio::test]
    async fn the_next_tree_is_validated_only_once_the_last_one_is_applied() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(ScannerMetrics::default());
        let validator = Validator::new(
            "s".into(),
            Arc::new(Policy::default()),
            metrics.clone(),
            Arc::new(DevFs::open(dir.path()).unwrap()),
            Arc::new(Topology::new(&dir.path().join("sys"))),
        );
        let (tx, mut rx) = mpsc::channel(4);
        let mut sink = EventSink::new(validator, tx.clone());
        let (mut notify, mut latest) = coalescing(metrics.clone(), usize::MAX);
        // The tree is pending once notify returns its future, which waits for the take.
        drop(notify.notify(tree("a"), Vec::new(), 0));
        let applying = tx.clone().reserve_owned().await.unwrap();
        assert!(sink.deliver(&mut latest).now_or_never().is_none());
        assert_eq!(ScannerMetrics::get(&metrics.trees_accepted), 0);
        assert!(rx.try_recv().is_err());
        drop(applying);
        let delivering = tokio::spawn(async move { sink.deliver(&mut latest).await });
        match rx.recv().await {
            Some(ScannerEvent::Tree(t)) => assert!(t.0["t"].contains_key("a")),
            other => panic!("expected the tree, got {other:?}"),
        }
        assert_eq!(ScannerMetrics::get(&metrics.trees_accepted), 1);
        delivering.abort();
    }
}
