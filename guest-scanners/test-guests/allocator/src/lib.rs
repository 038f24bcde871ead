//! `test_allocator`: a test hook exporting `preferred-allocator` and `pre-starter` (no
//! post-allocator), so host tests can exercise kubelet's two optional calls.
//!
//! * get-preferred-allocation, env `PREFERRED_MODE`:
//!   * `packed` (default): must-include ids first, then the available ids in sorted order, up to
//!     the allocation size; a request for more than is available fails;
//!   * `greedy`: an answer the host must shape: an id never offered, then every available id in
//!     reverse order, twice, with no regard for the size or the must-include ids;
//!   * `sleep`: blocks (without spinning) far past any deadline.
//! * pre-start-container, env `PRE_START_MODE`:
//!   * `check` (default): fails for any device id containing "bad", succeeds otherwise;
//!   * `sleep`: blocks (without spinning) far past any deadline.

use std::time::Duration;

use wdp_guest::{ContainerPreferredAllocationRequest, config};

/// How long `sleep` blocks: longer than any deadline a test sets.
const SLEEP: Duration = Duration::from_secs(3600);

/// The packed choice for one container.
pub fn packed(request: &ContainerPreferredAllocationRequest) -> Result<Vec<String>, String> {
    let size = request.allocation_size as usize;
    if size > request.available_device_ids.len() {
        return Err(format!(
            "asked for {size} devices, only {} available",
            request.available_device_ids.len()
        ));
    }
    let mut chosen: Vec<String> = request.must_include_device_ids.clone();
    let mut rest = request.available_device_ids.clone();
    rest.sort();
    for id in rest {
        if chosen.len() >= size {
            break;
        }
        if !chosen.contains(&id) {
            chosen.push(id);
        }
    }
    Ok(chosen)
}

struct Allocator;

/// An answer that breaks every rule kubelet's answer must keep.
pub fn greedy(request: &ContainerPreferredAllocationRequest) -> Vec<String> {
    let mut ids = vec!["never-offered".to_string()];
    for _ in 0..2 {
        ids.extend(request.available_device_ids.iter().rev().cloned());
    }
    ids.retain(|id| !request.must_include_device_ids.contains(id));
    ids
}

impl wdp_guest::PreferredAllocator for Allocator {
    fn get_preferred_allocation(
        _dev_type: String,
        requests: Vec<ContainerPreferredAllocationRequest>,
    ) -> Result<Vec<Vec<String>>, String> {
        match config::env_choice("PREFERRED_MODE", "packed", &["packed", "greedy", "sleep"])? {
            "greedy" => Ok(requests.iter().map(greedy).collect()),
            "sleep" => {
                std::thread::sleep(SLEEP);
                Err("slept".into())
            }
            _ => requests.iter().map(packed).collect(),
        }
    }
}

impl wdp_guest::PreStarter for Allocator {
    fn pre_start_container(dev_type: String, device_ids: Vec<String>) -> Result<(), String> {
        if config::env_choice("PRE_START_MODE", "check", &["check", "sleep"])? == "sleep" {
            std::thread::sleep(SLEEP);
        }
        match device_ids.iter().find(|id| id.contains("bad")) {
            Some(id) => Err(format!(
                "{dev_type}: device {id} failed its pre-start check"
            )),
            None => Ok(()),
        }
    }
}

wdp_guest::export_preferred_allocator!(Allocator);
wdp_guest::export_pre_starter!(Allocator);

#[cfg(test)]
mod tests {
    use super::*;

    fn req(available: &[&str], must: &[&str], size: u32) -> ContainerPreferredAllocationRequest {
        ContainerPreferredAllocationRequest {
            available_device_ids: available.iter().map(|s| s.to_string()).collect(),
            must_include_device_ids: must.iter().map(|s| s.to_string()).collect(),
            allocation_size: size,
        }
    }

    #[test]
    fn packs_in_order_after_must_include() {
        assert_eq!(
            packed(&req(&["c", "a", "b"], &["c"], 2)).unwrap(),
            ["c", "a"]
        );
        assert_eq!(packed(&req(&["c", "a", "b"], &[], 2)).unwrap(), ["a", "b"]);
        assert!(packed(&req(&["a"], &[], 2)).is_err());
    }

    #[test]
    fn greedy_breaks_the_rules() {
        let answer = greedy(&req(&["a", "b"], &["a"], 1));
        assert_eq!(answer, ["never-offered", "b", "b"]);
    }
}
