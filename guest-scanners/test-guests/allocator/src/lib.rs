//! `test_allocator`: a test hook exporting `preferred-allocator` and `pre-starter` (no
//! post-allocator), so host tests can exercise kubelet's two optional calls.
//!
//! * get-preferred-allocation: the "packed" policy: must-include ids first, then the available
//!   ids in sorted order, up to the allocation size; a request for more than is available fails.
//! * pre-start-container: fails for any device id containing "bad", succeeds otherwise.

use wdp_guest::ContainerPreferredAllocationRequest;

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

impl wdp_guest::PreferredAllocator for Allocator {
    fn get_preferred_allocation(
        _dev_type: String,
        requests: Vec<ContainerPreferredAllocationRequest>,
    ) -> Result<Vec<Vec<String>>, String> {
        requests.iter().map(packed).collect()
    }
}

impl wdp_guest::PreStarter for Allocator {
    fn pre_start_container(dev_type: String, device_ids: Vec<String>) -> Result<(), String> {
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
}
