//! Building the answer to kubelet's `GetPreferredAllocation`.
//!
//! The answer is advice. kubelet asks only when it has a choice to make (more available devices
//! than it needs), and whatever it gets, it allocates only available devices: it takes the
//! answer's ids that it offered, then fills any shortfall itself. An answer with more ids than
//! `allocation_size` leaves kubelet to pick among them arbitrarily, which defeats the point of a
//! preference, so what a hook returns is shaped here before kubelet sees it: the must-include ids
//! first (kubelet has already allocated them), then the hook's choices among the available ids
//! in its order, without repeats, up to the allocation size. A hook that fails, times out or
//! answers the wrong number of containers costs the pod nothing: the answer is "no preference"
//! (an empty list), the same as a plugin that does not implement the call.

use crate::bindings::types as wit;

/// kubelet's answer for one container, from the hook's `choice` (None: no usable answer).
pub fn answer(
    request: &wit::ContainerPreferredAllocationRequest,
    choice: Option<Vec<String>>,
) -> Vec<String> {
    let Some(choice) = choice else {
        return Vec::new();
    };
    let size = usize::try_from(request.allocation_size).unwrap_or(usize::MAX);
    let mut ids: Vec<String> = Vec::with_capacity(size.min(request.available_device_ids.len()));
    for id in &request.must_include_device_ids {
        if !ids.contains(id) {
            ids.push(id.clone());
        }
    }
    for id in choice {
        if ids.len() >= size {
            break;
        }
        if request.available_device_ids.contains(&id) && !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request(
        available: &[&str],
        must: &[&str],
        size: u32,
    ) -> wit::ContainerPreferredAllocationRequest {
        wit::ContainerPreferredAllocationRequest {
            available_device_ids: available.iter().map(|s| s.to_string()).collect(),
            must_include_device_ids: must.iter().map(|s| s.to_string()).collect(),
            allocation_size: size,
        }
    }

    fn ids(s: &[&str]) -> Option<Vec<String>> {
        Some(s.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn trimmed_available_and_must_include_first() {
        let r = request(&["a", "b", "c", "d"], &["c"], 2);
        // Too many, an id never offered, a repeat, and the must-include id left out.
        assert_eq!(answer(&r, ids(&["x", "b", "b", "a", "d"])), ["c", "b"]);
        assert_eq!(answer(&r, ids(&["c", "a"])), ["c", "a"]);
        // Short answers stay short: kubelet fills the rest.
        assert_eq!(answer(&r, ids(&[])), ["c"]);
        // No usable answer: no preference.
        assert!(answer(&r, None).is_empty());
        assert_eq!(
            answer(&request(&["a"], &[], 0), ids(&["a"])),
            Vec::<String>::new()
        );
    }

    proptest! {
        #![proptest_config(crate::fuzz::config())]

        /// Whatever the hook returns: the must-include ids, then only offered ids, no repeats,
        /// never more than the size (unless kubelet's own must-include list is longer).
        #[test]
        fn any_hook_answer_is_shaped(
            available in prop::collection::vec("[a-e]", 0..6),
            must in prop::collection::vec("[a-e]", 0..3),
            size in 0u32..6,
            choice in prop::option::of(prop::collection::vec("[a-g]", 0..10)),
        ) {
            let r = wit::ContainerPreferredAllocationRequest {
                available_device_ids: available.clone(),
                must_include_device_ids: must.clone(),
                allocation_size: size,
            };
            let none = choice.is_none();
            let out = answer(&r, choice);
            if none {
                prop_assert!(out.is_empty());
                return Ok(());
            }
            for id in &must {
                prop_assert!(out.contains(id));
            }
            for (i, id) in out.iter().enumerate() {
                prop_assert!(must.contains(id) || available.contains(id));
                prop_assert!(!out[..i].contains(id));
            }
            let must_count = out.iter().filter(|id| must.contains(id)).count();
            prop_assert!(out.len() <= (size as usize).max(must_count));
        }
    }
}
