//! What a resource server reports about itself: the seam through which its owner's status and
//! metrics (`/readyz`, `/metrics` in wdp) learn what only the server sees.

use std::time::Duration;

/// The events of one resource server that its owner counts or shows. Called from the server's
/// task and its gRPC handlers, so each call must be quick and must not block.
pub trait ServerReport: Send + Sync + 'static {
    /// kubelet accepted the registration (`true`), or went away or restarted (`false`): the
    /// resource is usable by pods only while registered.
    fn registered(&self, registered: bool);

    /// kubelet answered the registration with an error (or not in time): `reason` is kubelet's
    /// own message where it gave one. The server retries with a backoff; the reason holds until
    /// the next [`ServerReport::registered`]`(true)`, for whoever shows why the resource is not
    /// usable. A kubelet that is merely not running is no failure: nothing is reported then.
    fn registration_failed(&self, reason: &str);

    /// kubelet's ListAndWatch stream ended while kubelet kept running: the server registers
    /// again, since kubelet will not call ListAndWatch on the old endpoint again. A stream that
    /// ends because kubelet stopped (its socket refuses connections) is no loss: kubelet's next
    /// start is followed by one registration, as after any restart.
    fn stream_lost(&self);

    /// One Allocate call answered (`ok`) or failed, after `elapsed`: the latency pods wait on.
    fn allocated(&self, elapsed: Duration, ok: bool);
}
