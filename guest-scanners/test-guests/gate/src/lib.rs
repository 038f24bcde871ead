//! `test_gate`: a scanner and its post-allocate hook in one component (world `device-plugin`)
//! whose faults a test switches with fixture files under /dev, so a fault strikes at a moment
//! the test chooses and is over when the test says, never after a sleep.
//!
//! * `scan` serves dev-type `gate`: one device per entry of `/dev/gate`, the entry its node,
//!   notified again whenever /dev changes. While `/dev/<TRAP>` exists (env `TRAP`; unset:
//!   never) it traps: at once when it starts, or as soon as the file appears while it serves,
//!   so every instance of every scanner of the config traps together and keeps trapping on each
//!   restart until the file goes.
//! * `post-allocate` answers the host's default response unchanged, once `/dev/<HOLD>` exists
//!   (env `HOLD`; unset: at once). Until then it says so on stderr (`post-allocate holding
//!   until /dev/<HOLD> appears`, which the host logs) and waits for /dev to change, without
//!   spinning: an Allocate held in the middle for as long as the test needs.

use wdp_guest::{ContainerAllocateRequest, ContainerAllocateResponse, DeviceInfo, TreeBuilder};
use wdp_guest::{config, devfs};

/// The directory whose entries are the devices.
const DEVICES: &str = "/dev/gate";

/// Whether `/dev/<name>` exists.
fn present(name: &str) -> bool {
    devfs::stat(&format!("/dev/{name}")).is_ok()
}

/// Traps, as a guest bug would (a panic is a trap in wasm): the host must restart the
/// instance.
fn trap_if_armed() {
    if let Some(trap) = config::env_var("TRAP").filter(|t| present(t)) {
        panic!("/dev/{trap} exists");
    }
}

struct Gate;

impl wdp_guest::Scanner for Gate {
    fn scan() -> Result<(), String> {
        loop {
            trap_if_armed();
            let mut tree = TreeBuilder::new();
            tree.group("gate");
            for node in devfs::read_dir(DEVICES).unwrap_or_default() {
                let path = format!("{DEVICES}/{}", node.name);
                let id = wdp_guest::tree::sanitize_id(&node.name);
                tree.add("gate", id, DeviceInfo::new().node(&path, &path, "rw"));
            }
            wdp_guest::notify(&tree.build());
            devfs::wait_for_change(u32::MAX);
        }
    }
}

impl wdp_guest::PostAllocator for Gate {
    fn post_allocate(
        _dev_type: String,
        _requests: Vec<ContainerAllocateRequest>,
        responses: Vec<ContainerAllocateResponse>,
    ) -> Result<Vec<ContainerAllocateResponse>, String> {
        if let Some(hold) = config::env_var("HOLD") {
            eprintln!("post-allocate holding until /dev/{hold} appears");
            while !present(&hold) {
                devfs::wait_for_change(u32::MAX);
            }
        }
        Ok(responses)
    }
}

wdp_guest::export_device_plugin!(Gate);
