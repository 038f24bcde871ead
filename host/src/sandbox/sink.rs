//! Where a guest's notified trees go: the one thing the sandbox hands upward.
//!
//! The sandbox does not judge trees. The `notify` import passes each one, as the guest wrote it,
//! to the [`TreeSink`] its store was built with; the supervisor implements the trait (validation,
//! policy, NUMA affinity, counters), so the data path runs one way: guest, sandbox, sink.

use futures::future::BoxFuture;

use crate::bindings::types;

/// The receiving end of a guest's `notify` calls.
///
/// Called once per notified tree or set of changes, in order. The future may wait: that back-pressures
/// a guest that notifies faster than the host consumes, without the sandbox knowing why.
pub trait TreeSink: Send {
    /// Takes one tree and the typed attributes the guest gave for its devices (none from
    /// `notify`, a guest's list from `notify-with-attributes`), with `bytes`, what their host
    /// form was charged against the guest's memory limit as they were lifted
    /// ([`crate::footprint`]): nothing downstream walks them again to learn it. [`SinkClosed`]
    /// when nobody listens any more, which stops the guest.
    fn notify(
        &mut self,
        tree: types::DeviceTree,
        attributes: Vec<types::DeviceAttributes>,
        bytes: usize,
    ) -> BoxFuture<'_, Result<(), SinkClosed>>;

    /// Takes one call's changes (`notify-changes`) with `bytes`, what they were charged as they
    /// were lifted. True when they are taken; false when the sink holds no tree they apply to
    /// (the guest is to notify its whole tree), and then they are dropped.
    fn changes(
        &mut self,
        changes: Vec<types::GroupChanges>,
        attributes: Vec<types::DeviceAttributes>,
        bytes: usize,
    ) -> BoxFuture<'_, Result<bool, SinkClosed>>;
}

/// The sink's reader is gone: the guest is stopped, since its trees would go nowhere.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the host stopped listening for its trees")]
pub struct SinkClosed;
