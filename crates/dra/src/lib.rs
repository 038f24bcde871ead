//! wdp's Dynamic Resource Allocation (`resource.k8s.io/v1`) front-end.
#![warn(missing_docs)]

pub mod proto;
pub mod registration;
pub mod socket;
#[cfg(test)]
mod testing;
