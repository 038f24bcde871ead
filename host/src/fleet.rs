//! The running set of scanners, keyed by scanner name: what `wdp run` serves right now.
//!
//! A running scanner is two tasks joined by a channel: its supervisor ([`supervise`]: owns the
//! guest, sends its trees) and its manager ([`Manager`]: owns the scanner's resource servers,
//! their sockets and their host-wide resource [`Claims`]). The [`Fleet`] owns both JoinHandles
//! and is the only one that cancels them:
//!
//! - [`Fleet::stop`] aborts the supervisor and awaits it (the guest is dropped with its
//!   sender), then drops the fleet's own sender. The manager sees its channel close, stops every
//!   server (each ends its streams and removes its socket) and releases its claims; the fleet
//!   awaits the manager too. So when `stop` returns nothing of the scanner is left, and a
//!   replacement may claim the same resources and bind the same sockets.
//! - The manager is never aborted: that would leave sockets and claims behind. It ends on its
//!   own once the fleet has closed its channel.
//!
//! Reload uses this to restart only what changed: stop every removed or changed scanner first,
//! then start the new ones ([`Fleet::start_all`]), so two scanners may swap a resource in one
//! reload. CDI specs are not removed by stopping a scanner: [`SpecOwnership`] removes a stopped
//! scanner's specs once the new config is started and nothing in it may serve them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cdi::SpecOwnership;
use crate::config::ScannerIdentity;
use crate::hooks::Hooks;
use crate::manager::{Claims, Manager};
use crate::sandbox::Sandbox;
use crate::scanner::{RestartPolicy, Scanner, ScannerEvent, supervise};
use crate::status::Observability;
use wdp_kubelet::server::PluginSockets;

/// How many events a scanner may have in flight to its manager before it waits.
const EVENT_QUEUE: usize = 16;

/// A scanner checked, compiled and linked: everything [`Fleet::start`] needs, built before the
/// running set is touched so that a config that fails to prepare changes nothing.
pub struct Prepared {
    /// What it was built from; compared on the next reload.
    pub identity: ScannerIdentity,
    /// The scanner to run.
    pub scanner: Scanner,
    /// Its hooks, if it has a post-allocator.
    pub hooks: Option<Arc<Hooks>>,
}

/// One running scanner: the two tasks the fleet owns.
struct RunningScanner {
    identity: ScannerIdentity,
    /// Aborted by [`Fleet::stop`]; ends on its own only when the scanner finishes or its manager
    /// is gone.
    supervisor: JoinHandle<()>,
    /// Never aborted: ends once its channel closes, after removing its sockets and claims.
    manager: JoinHandle<()>,
    /// The fleet's own sender on the manager's channel: the channel closes when the fleet says
    /// so, not when the supervisor returns. A scanner whose `scan` returned ok is done, and its
    /// last tree stays served until it is stopped.
    events: mpsc::Sender<ScannerEvent>,
}

/// The running scanners of one host, and what they share.
pub struct Fleet {
    sandbox: Arc<Sandbox>,
    kubelet: Arc<PluginSockets>,
    claims: Arc<Claims>,
    /// Which CDI spec files are wdp's, and when one may go.
    cdi: Arc<SpecOwnership>,
    /// What `/status`, `/readyz` and `/metrics` show: every running scanner is in it.
    obs: Observability,
    running: BTreeMap<String, RunningScanner>,
}

impl Fleet {
    /// An empty fleet; every scanner started in it shares `sandbox`, `kubelet` and the
    /// host-wide `claims` on resource names.
    pub fn new(
        sandbox: Arc<Sandbox>,
        kubelet: Arc<PluginSockets>,
        claims: Arc<Claims>,
        obs: Observability,
    ) -> Self {
        Fleet {
            sandbox,
            kubelet,
            claims,
            cdi: Arc::default(),
            obs,
            running: BTreeMap::new(),
        }
    }

    /// Which CDI spec files are wdp's (the specs of earlier runs not yet taken over, for tests
    /// and `wdp status`).
    pub fn cdi(&self) -> &Arc<SpecOwnership> {
        &self.cdi
    }

    /// Starts the scanners a config adds or changes, after [`Fleet::stop`] of every one it
    /// removes or changes. The CDI spec files of their directories are taken over first (the
    /// first start's reconciliation), every one of them joins the spec ownership before any
    /// starts, and once all run, the specs nothing configured may serve any more are removed.
    pub async fn start_all(&mut self, scanners: Vec<Prepared>) {
        let cdi: Vec<_> = scanners
            .iter()
            .filter_map(|p| Some((&p.identity.config, p.identity.config.cdi.as_ref()?)))
            .collect();
        self.cdi.adopt(cdi.iter().map(|(_, c)| c.dir.as_path()));
        for (config, c) in &cdi {
            // The name its manager writes under (the guest's name is the config's).
            self.cdi
                .join(&config.name.as_str().into(), &config.namespace, &c.dir);
        }
        for prepared in scanners {
            self.start(prepared).await;
        }
        self.cdi.sweep();
    }

    /// The running scanners' identities, by name.
    pub fn identities(&self) -> impl Iterator<Item = (&str, &ScannerIdentity)> {
        self.running
            .iter()
            .map(|(name, r)| (name.as_str(), &r.identity))
    }

    /// How many scanners run.
    pub fn len(&self) -> usize {
        self.running.len()
    }

    /// True when no scanner runs.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Starts a prepared scanner: its manager, then its supervisor. A scanner of the same name
    /// must have been stopped first (it is stopped here, with an error, if not: two managers of
    /// one name would share its claims).
    pub async fn start(&mut self, prepared: Prepared) {
        let Prepared {
            identity,
            scanner,
            hooks,
        } = prepared;
        let name = identity.config.name.clone();
        if self.running.contains_key(&name) {
            tracing::error!(scanner = %name, "started while running; stopping the old one first");
            self.stop(&name).await;
        }
        // Before the guest can report anything. The spec's series are the ones its hooks share.
        let status = self.obs.add_scanner(&name, scanner.guest.metrics.clone());
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let mut manager = Manager::new(
            scanner.guest.name.clone(),
            identity.config.namespace.clone(),
            self.kubelet.clone(),
            hooks,
            self.claims.clone(),
        );
        if let Some(cdi) = identity.config.cdi.clone() {
            manager = manager.with_cdi(cdi, self.cdi.clone());
        }
        if let Some(dra) = identity.config.dra.clone() {
            manager = manager.with_dra(dra, self.sandbox.roots().clone());
        }
        // The manager removes the scanner from `obs` once its servers are stopped.
        manager = manager.with_status(status);
        let manager = tokio::spawn(manager.run(rx, tx.downgrade()));
        let supervisor = tokio::spawn(supervise(
            self.sandbox.clone(),
            scanner,
            RestartPolicy::Backoff,
            tx.clone(),
        ));
        self.running.insert(
            name,
            RunningScanner {
                identity,
                supervisor,
                manager,
                events: tx,
            },
        );
    }

    /// Stops scanner `name` and returns once its guest is gone, its sockets are removed and its
    /// resource names are free. False when no such scanner runs.
    pub async fn stop(&mut self, name: &str) -> bool {
        let Some(running) = self.running.remove(name) else {
            return false;
        };
        running.supervisor.abort();
        join(name, "supervisor", running.supervisor, stop_deadline()).await;
        // The guest and its senders are gone; this was the last one.
        drop(running.events);
        // The manager has removed the scanner and its resources from /status and /metrics.
        join(name, "manager", running.manager, stop_deadline()).await;
        true
    }

    /// Stops every scanner: all guests first, then waits for every manager, so shutting down
    /// takes as long as the slowest scanner rather than the sum.
    pub async fn stop_all(&mut self) {
        let running = std::mem::take(&mut self.running);
        for r in running.values() {
            r.supervisor.abort();
        }
        let mut managers = Vec::with_capacity(running.len());
        let deadline = stop_deadline();
        for (name, r) in running {
            join(&name, "supervisor", r.supervisor, deadline).await;
            drop(r.events);
            managers.push((name, r.manager));
        }
        let deadline = stop_deadline();
        for (name, manager) in managers {
            join(&name, "manager", manager, deadline).await;
        }
    }
}

/// Longest [`Fleet::stop`] waits for each of a scanner's tasks to end: shutdown and reload finish
/// within this whatever a guest does. An aborted task ends at its next await, and no guest holds
/// a worker between two (host calls that block run on the blocking pool, wasm yields every
/// tick), so reaching it means a bug; the task is then left behind, logged.
const STOP_WAIT: Duration = Duration::from_secs(5);

fn stop_deadline() -> Instant {
    Instant::now() + STOP_WAIT
}

/// Awaits a scanner task until `deadline` (tasks stopped together share one); a panic is logged
/// (a bug: the task's state is lost with it).
async fn join(scanner: &str, task: &str, handle: JoinHandle<()>, deadline: Instant) {
    match tokio::time::timeout_at(deadline, handle).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.is_cancelled() => {}
        Ok(Err(e)) => tracing::error!(scanner, task, error = %e, "scanner task panicked"),
        Err(_) => tracing::error!(
            scanner,
            task,
            "scanner task did not end within {STOP_WAIT:?} of being stopped; abandoned"
        ),
    }
}
