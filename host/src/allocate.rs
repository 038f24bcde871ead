//! Building the answer to kubelet's `Allocate`.
//!
//! The default answer comes from the served devices: for each container request, in order, the
//! nodes, mounts, envs, annotations and CDI names of each requested device, in request order.
//! Device nodes and mounts are de-duplicated by container path (two devices often share a control
//! node such as `/dev/vfio/vfio`). A post-allocator hook may then rewrite the answer; what it
//! returns is validated with the same rules as a notified tree before kubelet sees it.

use std::collections::BTreeMap;

use crate::bindings::types as wit;
use crate::tree::{self, DeviceGroup, DeviceSpec, Health, Mount, OutputError};
use wdp_kubelet::api;

/// What one container receives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerResponse {
    /// Environment variables, unique by name.
    pub envs: BTreeMap<String, String>,
    /// Bind mounts.
    pub mounts: Vec<Mount>,
    /// Device nodes.
    pub devices: Vec<DeviceSpec>,
    /// Annotations, unique by key.
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names for a CDI-aware runtime.
    pub cdi_devices: Vec<String>,
}

/// Why an Allocate call fails. Each maps to a gRPC status kubelet reports with the pod.
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    #[error("{resource}: no such device {id:?}")]
    /// kubelet asked for a device this resource does not list.
    Unknown {
        /// The resource, `<namespace>/<dev-type>`.
        resource: String,
        /// The device id asked for.
        id: String,
    },
    #[error("{resource}: device {id:?} is unhealthy")]
    /// kubelet asked for a device that is not healthy.
    Unhealthy {
        /// The resource, `<namespace>/<dev-type>`.
        resource: String,
        /// The device id asked for.
        id: String,
    },
    #[error("{resource}: post-allocate hook failed: {cause}")]
    /// The post-allocate hook failed.
    Hook {
        /// The resource, `<namespace>/<dev-type>`.
        resource: String,
        /// Why, in words.
        cause: String,
    },
    #[error("{resource}: post-allocate hook timed out: {cause}")]
    /// The post-allocate hook ran out of time.
    HookTimeout {
        /// The resource, `<namespace>/<dev-type>`.
        resource: String,
        /// Why, in words.
        cause: String,
    },
    #[error("{resource}: post-allocate hook returned {got} responses for {want} containers")]
    /// The post-allocate hook answered for the wrong number of containers.
    HookCount {
        /// The resource, `<namespace>/<dev-type>`.
        resource: String,
        /// How many responses the hook returned.
        got: usize,
        /// How many containers kubelet asked for.
        want: usize,
    },
    #[error("{resource}: post-allocate hook returned an invalid response: {error}")]
    /// The post-allocate hook answered something the policy refuses.
    HookInvalid {
        /// The resource, `<namespace>/<dev-type>`.
        resource: String,
        /// The rule it breaks.
        error: OutputError,
    },
}

impl From<AllocateError> for tonic::Status {
    fn from(e: AllocateError) -> Self {
        let message = e.to_string();
        match e {
            AllocateError::Unknown { .. } => tonic::Status::invalid_argument(message),
            AllocateError::Unhealthy { .. } => tonic::Status::failed_precondition(message),
            AllocateError::HookTimeout { .. } => tonic::Status::deadline_exceeded(message),
            AllocateError::Hook { .. }
            | AllocateError::HookCount { .. }
            | AllocateError::HookInvalid { .. } => tonic::Status::internal(message),
        }
    }
}

/// The default answer: one response per container request, in order.
pub fn default_responses(
    resource: &str,
    devices: &DeviceGroup,
    requests: &[api::ContainerAllocateRequest],
) -> Result<Vec<ContainerResponse>, AllocateError> {
    requests
        .iter()
        .map(|request| {
            let mut out = ContainerResponse::default();
            for id in &request.devices_ids {
                let info = devices.get(id).ok_or_else(|| AllocateError::Unknown {
                    resource: resource.into(),
                    id: id.clone(),
                })?;
                if info.health != Health::Healthy {
                    return Err(AllocateError::Unhealthy {
                        resource: resource.into(),
                        id: id.clone(),
                    });
                }
                for node in &info.nodes {
                    if !out
                        .devices
                        .iter()
                        .any(|d| d.container_path == node.container_path)
                    {
                        out.devices.push(node.clone());
                    }
                }
                for mount in &info.mounts {
                    if !out
                        .mounts
                        .iter()
                        .any(|m| m.container_path == mount.container_path)
                    {
                        out.mounts.push(mount.clone());
                    }
                }
                // As Intel's framework: a later device's value for the same key wins.
                out.envs.extend(info.envs.clone());
                out.annotations.extend(info.annotations.clone());
                for name in &info.cdi_devices {
                    if !out.cdi_devices.contains(name) {
                        out.cdi_devices.push(name.clone());
                    }
                }
            }
            Ok(out)
        })
        .collect()
}

impl ContainerResponse {
    /// The WIT form, for a post-allocator.
    pub fn to_wit(&self) -> wit::ContainerAllocateResponse {
        wit::ContainerAllocateResponse {
            envs: self
                .envs
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            mounts: self
                .mounts
                .iter()
                .map(|m| wit::Mount {
                    container_path: m.container_path.clone(),
                    host_path: m.host_path.clone(),
                    read_only: m.read_only,
                })
                .collect(),
            devices: self
                .devices
                .iter()
                .map(|d| wit::DeviceSpec {
                    container_path: d.container_path.clone(),
                    host_path: d.host_path.clone(),
                    permissions: d.permissions.clone(),
                })
                .collect(),
            annotations: self
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            cdi_devices: self.cdi_devices.clone(),
        }
    }

    /// Validates what a post-allocator returned for container `index`.
    pub fn from_wit(index: usize, r: wit::ContainerAllocateResponse) -> Result<Self, OutputError> {
        // Formatted only for an error.
        let owner = &|| format!("the response for container {index}");
        Ok(ContainerResponse {
            envs: tree::check_envs(owner, r.envs)?,
            mounts: tree::check_mounts(owner, r.mounts)?,
            devices: tree::check_nodes(owner, r.devices)?,
            annotations: tree::check_annotations(owner, r.annotations)?,
            cdi_devices: tree::check_cdi_names(owner, r.cdi_devices)?,
        })
    }

    /// The wire form.
    pub fn into_proto(self) -> api::ContainerAllocateResponse {
        api::ContainerAllocateResponse {
            envs: self.envs.into_iter().collect(),
            mounts: self
                .mounts
                .into_iter()
                .map(|m| api::Mount {
                    container_path: m.container_path,
                    host_path: m.host_path,
                    read_only: m.read_only,
                })
                .collect(),
            devices: self
                .devices
                .into_iter()
                .map(|d| api::DeviceSpec {
                    container_path: d.container_path,
                    host_path: d.host_path,
                    permissions: d.permissions,
                })
                .collect(),
            annotations: self.annotations.into_iter().collect(),
            cdi_devices: self
                .cdi_devices
                .into_iter()
                .map(|name| api::CdiDevice { name })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::DeviceInfo;

    fn info(nodes: &[&str], env: (&str, &str), health: Health) -> DeviceInfo {
        DeviceInfo {
            health,
            nodes: nodes
                .iter()
                .map(|p| DeviceSpec {
                    container_path: p.to_string(),
                    host_path: p.to_string(),
                    permissions: "rw".into(),
                })
                .collect(),
            mounts: vec![],
            envs: [(env.0.to_string(), env.1.to_string())].into(),
            annotations: BTreeMap::new(),
            numa_nodes: None,
            cdi_devices: vec!["v.example/c=shared".into()],
            ..DeviceInfo::default()
        }
    }

    fn group() -> DeviceGroup {
        [
            (
                "a".to_string(),
                info(&["/dev/a", "/dev/ctl"], ("A", "1"), Health::Healthy),
            ),
            (
                "b".into(),
                info(&["/dev/b", "/dev/ctl"], ("B", "2"), Health::Healthy),
            ),
            (
                "sick".into(),
                info(&["/dev/s"], ("S", "3"), Health::Unhealthy),
            ),
        ]
        .into_iter()
        .collect()
    }

    fn req(ids: &[&str]) -> api::ContainerAllocateRequest {
        api::ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn merges_in_order_and_dedups_nodes() {
        let out = default_responses("r/x", &group(), &[req(&["b", "a"]), req(&["a"])]).unwrap();
        assert_eq!(out.len(), 2);
        let paths: Vec<_> = out[0]
            .devices
            .iter()
            .map(|d| d.host_path.as_str())
            .collect();
        assert_eq!(paths, ["/dev/b", "/dev/ctl", "/dev/a"]);
        assert_eq!(out[0].envs.len(), 2);
        assert_eq!(out[0].cdi_devices, ["v.example/c=shared"]);
        assert_eq!(out[1].devices.len(), 2);
    }

    #[test]
    fn unknown_and_unhealthy_fail() {
        let e = default_responses("r/x", &group(), &[req(&["a", "zzz"])]).unwrap_err();
        assert!(matches!(e, AllocateError::Unknown { ref id, .. } if id == "zzz"));
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::InvalidArgument);
        let e = default_responses("r/x", &group(), &[req(&["sick"])]).unwrap_err();
        assert_eq!(
            tonic::Status::from(e).code(),
            tonic::Code::FailedPrecondition
        );
    }

    #[test]
    fn hook_answers_are_validated() {
        let mut r = ContainerResponse::default().to_wit();
        r.devices.push(wit::DeviceSpec {
            container_path: "/dev/x".into(),
            host_path: "/etc/shadow".into(),
            permissions: "rw".into(),
        });
        let e = ContainerResponse::from_wit(0, r).unwrap_err();
        assert!(e.to_string().contains("under /dev"), "{e}");
    }
}
