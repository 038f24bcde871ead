//! What a hook's failure answers kubelet, in one place: a pre-start-container failure as a gRPC
//! status, a post-allocate failure as the Allocate error it becomes. A hook stopped by its
//! deadline is told apart from one that failed, since kubelet's caller can act on the difference.

use tonic::Status;

use crate::allocate::AllocateError;
use crate::hooks::HookError;
use wdp_kubelet::names::Resource;

/// The status of a failed `hook` call on `resource`: DeadlineExceeded when it ran out of time.
pub(super) fn hook_status(resource: &Resource, hook: &str, e: HookError) -> Status {
    let message = format!("{}: {hook} hook failed: {e}", resource.name);
    match e {
        HookError::Timeout(_) => Status::deadline_exceeded(message),
        _ => Status::internal(message),
    }
}

/// The Allocate error of a failed `post-allocate` call on `resource`.
pub(super) fn allocate_error(resource: &str, e: HookError) -> AllocateError {
    match e {
        HookError::Timeout(d) => AllocateError::HookTimeout {
            resource: resource.to_string(),
            cause: format!("no answer within {d:?}"),
        },
        e => AllocateError::Hook {
            resource: resource.to_string(),
            cause: e.to_string(),
        },
    }
}
