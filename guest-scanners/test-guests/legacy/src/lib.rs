//! `legacy`: a scanner built against `wdp:device-plugin@0.1.0`, with that version's WIT kept in
//! `wit/` (pinned: it never follows `wit/device-plugin.wit`), and without the SDK, which follows
//! the current contract.
//!
//! Why: the contract promises that a guest built against an earlier version of its line keeps
//! working on a newer host; this guest is such a guest, built from source with every test run.
//! It serves each character device in the directory `DEV_DIR` (default `/dev/legacy`) as a
//! device of type `legacy` (its node given to the container), and rescans on every change.

wit_bindgen::generate!({
    path: "wit",
    world: "scanner-plugin",
});

use wdp::device_plugin::devfs::{self, NodeKind};
use wdp::device_plugin::notifier::notify;
use wdp::device_plugin::types::{Device, DeviceGroup, DeviceInfo, DeviceSpec, Health};

struct Legacy;

/// The tree of the character devices in `dir`: one device per node, named by it.
fn tree(dir: &str) -> Vec<DeviceGroup> {
    let devices = devfs::read_dir(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.kind == NodeKind::CharDevice)
        .map(|n| {
            let path = format!("{dir}/{}", n.name);
            Device {
                id: n.name,
                info: DeviceInfo {
                    health: Health::Healthy,
                    nodes: vec![DeviceSpec {
                        container_path: path.clone(),
                        host_path: path,
                        permissions: "rw".into(),
                    }],
                    mounts: Vec::new(),
                    envs: Vec::new(),
                    annotations: Vec::new(),
                    numa_nodes: Some(Vec::new()),
                    cdi_devices: Vec::new(),
                },
            }
        })
        .collect();
    vec![DeviceGroup {
        dev_type: "legacy".into(),
        devices,
    }]
}

impl exports::wdp::device_plugin::scanner::Guest for Legacy {
    fn scan() -> Result<(), String> {
        let dir = std::env::var("DEV_DIR").unwrap_or_else(|_| "/dev/legacy".into());
        loop {
            notify(&tree(&dir));
            devfs::wait_for_change(60_000);
        }
    }
}

export!(Legacy);
