//! The validation stage of the data path: what a notified tree goes through before anything
//! serves it.
//!
//! A guest's tree leaves the sandbox as the guest wrote it. [`Validator::check`] applies the
//! scanner's policy (structure rules, caps, nodes that exist, allowed mounts), fills in NUMA
//! affinity the guest did not give, counts accepted and refused trees, and logs refusals at most
//! once a second. The supervisor ([`crate::scanner`]) calls it from the sink it gives the sandbox.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bindings::types as wit;
use crate::hostfs::DevFs;
use crate::metrics::ScannerMetrics;
use crate::policy::Policy;
use crate::topology::Topology;
use crate::tree::{DeviceTree, OutputError};

/// One scanner's validation: its rules, its counters and its refusal log.
pub struct Validator {
    name: Arc<str>,
    policy: Arc<Policy>,
    metrics: Arc<ScannerMetrics>,
    devfs: Arc<DevFs>,
    topology: Arc<Topology>,
    /// When a refused tree was last logged, and how many were not logged since.
    refusals_logged: Option<Instant>,
    refusals_unlogged: u64,
}

impl Validator {
    /// Validation of scanner `name`'s trees by `policy` against the nodes of `devfs`, NUMA
    /// affinity from `topology`, counted in `metrics`.
    pub fn new(
        name: Arc<str>,
        policy: Arc<Policy>,
        metrics: Arc<ScannerMetrics>,
        devfs: Arc<DevFs>,
        topology: Arc<Topology>,
    ) -> Self {
        Validator {
            name,
            policy,
            metrics,
            devfs,
            topology,
            refusals_logged: None,
            refusals_unlogged: 0,
        }
    }

    /// One notified tree: the tree to serve, or why it is refused as a whole (the last good tree
    /// stays served).
    pub fn check(&mut self, tree: wit::DeviceTree) -> Result<DeviceTree, OutputError> {
        self.check_with_attributes(tree, Vec::new())
    }

    /// [`Validator::check`] of a tree notified with typed attributes for its devices: they are
    /// validated with it and kept on its devices.
    pub fn check_with_attributes(
        &mut self,
        tree: wit::DeviceTree,
        attributes: Vec<wit::DeviceAttributes>,
    ) -> Result<DeviceTree, OutputError> {
        let metrics = &self.metrics;
        metrics.notified();
        let checked = self
            .policy
            .check_tree(tree, &self.devfs)
            .and_then(|mut tree| tree.attach(attributes).map(|()| tree));
        match checked {
            Ok(mut tree) => {
                self.topology.fill(&mut tree, &self.devfs);
                ScannerMetrics::bump(&metrics.trees_accepted);
                Ok(tree)
            }
            Err(e) => {
                ScannerMetrics::bump(&metrics.trees_refused);
                self.log_refusal(&e);
                Err(e)
            }
        }
    }

    /// One event per refused tree, but at most one a second: a guest that floods bad trees must
    /// not flood the log. The counter sees every one.
    fn log_refusal(&mut self, e: &OutputError) {
        let now = Instant::now();
        if self
            .refusals_logged
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            tracing::warn!(
                scanner = &*self.name,
                rule = e.rule(),
                error = %e,
                not_logged_since_last = self.refusals_unlogged,
                "device tree refused; the last good tree stays served"
            );
            self.refusals_logged = Some(now);
            self.refusals_unlogged = 0;
        } else {
            self.refusals_unlogged += 1;
        }
    }
}
