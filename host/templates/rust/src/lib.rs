//! `{{name}}`: a wdp scanner. Every character device under /dev that matches `DEVICE_GLOB` is one
//! device of type `{{name}}` (kubelet sees the resource `<namespace>/{{name}}`), given to the
//! container that is allocated it at the same path.
//!
//! Health: a node is Healthy while the kernel lists its device number in sysfs
//! (`/sys/dev/char/<major>:<minor>`), Unhealthy when that is gone (a stale node whose driver went
//! away): kubelet stops allocating it, and it comes back Healthy on its own.
//!
//! Configuration (environment variables, set per scanner in the host's config):
//! * `DEVICE_GLOB` (default `/dev/{{name}}*`): the nodes to serve, a glob under /dev;
//! * `RESCAN_INTERVAL_MS` (default 30000): the longest wait between scans; the host wakes the
//!   scanner as soon as /dev or /sys changes.
{{#post-allocator}}
//!
//! Its post-allocator tells each container which devices it got: `{{NAME}}_DEVICES` is the
//! comma-separated list of their ids.
{{/post-allocator}}

{{#post-allocator}}
use wdp_guest::{ContainerAllocateRequest, ContainerAllocateResponse};
{{/post-allocator}}
use wdp_guest::{DeviceInfo, DeviceTree, Health, TreeBuilder, config, devfs, tree::id_from_path};

/// The device type.
pub const DEV_TYPE: &str = "{{name}}";
/// The environment variable with the glob of the nodes to serve.
pub const GLOB_ENV: &str = "DEVICE_GLOB";
/// The nodes served when `DEVICE_GLOB` is unset.
pub const DEFAULT_GLOB: &str = "/dev/{{name}}*";
{{#post-allocator}}
/// The variable the post-allocator sets in each container.
pub const DEVICES_ENV: &str = "{{NAME}}_DEVICES";
{{/post-allocator}}

/// The glob to serve: `value` is `DEVICE_GLOB` (None: unset). A bad one is an error naming the
/// variable, the value and what is valid: that is all the operator sees in the host's log.
pub fn parse_glob(value: Option<&str>) -> Result<String, String> {
    let glob = value.unwrap_or(DEFAULT_GLOB);
    devfs::check_dev_pattern(glob).map_err(|e| {
        format!("{GLOB_ENV}={glob:?} is not valid ({e}): expected a glob under /dev, e.g. {DEFAULT_GLOB}")
    })?;
    Ok(glob.to_string())
}

/// The sysfs entry of a character device number: present while the kernel knows the device.
pub fn sysfs_entry(major: u32, minor: u32) -> String {
    format!("/sys/dev/char/{major}:{minor}")
}

/// One scan: the tree of the nodes matching `glob` (the type is always there, maybe empty).
fn scan_once(glob: &str) -> Result<DeviceTree, String> {
    let mut tree = TreeBuilder::new();
    tree.group(DEV_TYPE);
    for m in devfs::glob_dev(glob)? {
        if m.node.kind != devfs::NodeKind::CharDevice {
            continue;
        }
        let known = std::fs::metadata(sysfs_entry(m.node.major, m.node.minor)).is_ok();
        let health = if known {
            Health::Healthy
        } else {
            Health::Unhealthy
        };
        let info = DeviceInfo::new()
            .node(&m.path, &m.path, "rw")
            .health(health);
        tree.add(DEV_TYPE, id_from_path(&m.path), info);
    }
    Ok(tree.build())
}

{{#post-allocator}}
/// What the post-allocator adds to one container's response: its device ids, in kubelet's order.
pub fn devices_env(request: &ContainerAllocateRequest) -> (String, String) {
    (DEVICES_ENV.to_string(), request.device_ids.join(","))
}

{{/post-allocator}}
struct Scanner;

impl wdp_guest::Scanner for Scanner {
    fn scan() -> Result<(), String> {
        let glob = parse_glob(config::env_var(GLOB_ENV).as_deref())?;
        // scan, notify when the tree changed, wait for a change (or RESCAN_INTERVAL_MS), forever
        wdp_guest::run(|| scan_once(&glob))
    }
}
{{#post-allocator}}

impl wdp_guest::PostAllocator for Scanner {
    fn post_allocate(
        _dev_type: String,
        requests: Vec<ContainerAllocateRequest>,
        mut responses: Vec<ContainerAllocateResponse>,
    ) -> Result<Vec<ContainerAllocateResponse>, String> {
        for (request, response) in requests.iter().zip(&mut responses) {
            response.envs.push(devices_env(request));
        }
        Ok(responses)
    }
}

wdp_guest::export_device_plugin!(Scanner);
{{/post-allocator}}
{{^post-allocator}}

wdp_guest::export_scanner!(Scanner);
{{/post-allocator}}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_glob_defaults_and_a_bad_one_says_what_is_valid() {
        assert_eq!(parse_glob(None).unwrap(), DEFAULT_GLOB);
        assert_eq!(parse_glob(Some("/dev/x*")).unwrap(), "/dev/x*");
        let err = parse_glob(Some("/etc/*")).unwrap_err();
        assert!(
            err.starts_with("DEVICE_GLOB=\"/etc/*\" is not valid"),
            "{err}"
        );
        assert!(err.contains(DEFAULT_GLOB), "{err}");
    }
{{#post-allocator}}

    #[test]
    fn each_container_learns_its_device_ids() {
        let request = ContainerAllocateRequest {
            device_ids: vec!["{{name}}1".into(), "{{name}}0".into()],
        };
        let env = devices_env(&request);
        assert_eq!(env, (DEVICES_ENV.into(), "{{name}}1,{{name}}0".into()));
    }
{{/post-allocator}}
}
