//! The scenarios of the results table, one module each. Each starts what it measures (fixture,
//! kubelet stand-in, `wdp run` or the sandbox itself), measures, and adds its rows and details
//! to the report; `main` only picks and orders them.
//!
//! | module | rows (`--only`) |
//! |---|---|
//! | [`hotplug`] | `hotplug`, `poll`, `newtype` |
//! | [`allocate`] | `allocate` |
//! | [`dra`] | `dra` (DRA mode: slices and NodePrepareResources) |
//! | [`fleet`] | `fleet` (1,000 DRA publishers against one API server stand-in) |
//! | [`restart`] | `restart` |
//! | [`streamcut`] | `streamcut` |
//! | [`startup`] | `startup` |
//! | [`idle`] | `idle` |
//! | [`bulk`] | `bulk` |
//! | [`native`] | `wasm` |
//! | [`peer`] | `peer` (k8s-device-plugin-lib beside wdp) |
//! | [`micro`] | `micro` (criterion, beside the idle row) |

pub mod allocate;
pub mod bulk;
pub mod dra;
pub mod fleet;
pub mod hotplug;
pub mod idle;
pub mod micro;
pub mod native;
pub mod peer;
pub mod restart;
pub mod shared;
pub mod sizes;
pub mod startup;
pub mod streamcut;
