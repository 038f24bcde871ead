//! wdp: WebAssembly device plugins.
//!
//! A Kubernetes device-plugin host whose device scanners are WebAssembly components. Data flows
//! one way: a guest scanner notifies a device tree ([`sandbox`], [`scanner`]), the host validates
//! it ([`tree`]) and serves it to kubelet.

pub mod allocate;
pub mod cdi;
pub mod cli;
pub mod config;
pub mod fleet;
#[cfg(test)]
mod fuzz;
pub mod hooks;
pub mod http;
pub mod kubelet;
pub mod manager;
pub mod metrics;
pub mod policy;
pub mod preferred;
pub mod sandbox;
pub mod scaffold;
pub mod scanner;
pub mod server;
pub mod snapshot;
pub mod status;
pub mod topology;
pub mod tree;
pub mod units;
