//! What a hook's failure answers kubelet, in one place: a pre-start-container failure as a gRPC
//! status, a post-allocate failure as the Allocate error it becomes. A hook stopped by its
//! deadline is told apart from one that failed, since kubelet's caller can act on the difference.

use tonic::Status;

use crate::allocate::AllocateError;
use crate::hooks::HookError;
use wdp_kubelet::names::Resource;

/// The status of a failed `hook` call on `resource`: DeadlineExceeded when it ran out of time,
/// running or waiting for a free instance slot.
pub(super) fn hook_status(resource: &Resource, hook: &str, e: HookError) -> Status {
    let message = format!("{}: {hook} hook failed: {e}", resource.name);
    match e {
        HookError::Timeout(_) | HookError::Busy { .. } => Status::deadline_exceeded(message),
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
        e @ HookError::Busy { .. } => AllocateError::HookTimeout {
            resource: resource.to_string(),
            cause: e.to_string(),
        },
        e => AllocateError::Hook {
            resource: resource.to_string(),
            cause: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A call that waited out its deadline for a free instance slot ran out of time as surely as
    /// one that ran too long: kubelet is told the same.
    #[test]
    fn no_free_slot_is_a_deadline_exceeded() {
        let busy = || HookError::Busy {
            slots: 2,
            waited: Duration::from_secs(5),
        };
        let allocate: Status = allocate_error("x.example.com/serial", busy()).into();
        assert_eq!(allocate.code(), tonic::Code::DeadlineExceeded);
        assert!(
            allocate.message().contains("2 hook instance slots"),
            "{allocate:?}"
        );
        let failed: Status =
            allocate_error("x.example.com/serial", HookError::Failed("trap".into())).into();
        assert_eq!(failed.code(), tonic::Code::Internal);
    }
}
