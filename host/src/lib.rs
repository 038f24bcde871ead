//! wdp: WebAssembly device plugins.
//!
//! A Kubernetes device-plugin host whose device scanners are WebAssembly components. Data flows
//! one way, and the modules import in the same direction (a unit test fails on an import cycle
//! between them):
//!
//! 1. a guest runs in the [`sandbox`], reading /dev and /sys only through [`hostfs`] and its
//!    preopen, and hands each tree it notifies to a [`sandbox::TreeSink`];
//! 2. the supervisor ([`scanner`]) takes the latest tree of each burst from that sink
//!    ([`coalesce`]): [`validate`] applies the [`policy`] and the [`tree`] rules and fills in
//!    [`topology`];
//! 3. a [`manager`] per scanner diffs the trees, writes [`cdi`] specs and runs one device-plugin
//!    server per resource: `wdp_kubelet`'s server, answering through the [`server`] adapter
//!    (Allocate with `allocate`'s default answer, `preferred`'s shaping of advice, and guest
//!    [`hooks`]) and reporting to [`status`];
//! 4. the servers register with kubelet through `wdp_kubelet`; a scanner configured with
//!    `frontend: dra` is served instead by the [`dra`] front-end (ResourceSlices and kubelet's
//!    DRA API, through `wdp_dra`), fed by its manager the same way.
//!
//! Every stage speaks the WIT types of [`bindings`]; [`fleet`], [`status`], [`http`] and [`cli`]
//! sit on top.

#![warn(missing_docs)]

pub(crate) mod allocate;
pub mod atomic_file;
pub mod bindings;
pub mod cdi;
pub mod cdi_version;
pub mod changes;
pub mod cli;
pub mod coalesce;
pub mod config;
pub mod dra;
pub mod fleet;
pub mod footprint;
#[cfg(test)]
mod fuzz;
pub mod hooks;
pub mod hostfs;
pub mod http;
#[cfg(test)]
mod layering;
pub mod manager;
pub mod metrics;
pub mod mounts;
pub mod policy;
pub(crate) mod preferred;
pub mod sandbox;
pub mod scaffold;
pub mod scanner;
pub mod server;
pub mod snapshot;
pub mod status;
#[cfg(test)]
mod testing;
pub mod topology;
pub mod tree;
pub mod units;
pub mod validate;
