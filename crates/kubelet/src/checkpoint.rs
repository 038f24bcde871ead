//! The stand-in kubelet's checkpoint of allocations.
//!
//! kubelet keeps `kubelet_internal_checkpoint` in its plugin directory
//! (`pkg/kubelet/cm/devicemanager/checkpoint`): for each container, the resource, the device ids
//! and the Allocate answer it got. After its own restart it reads the file back and replays each
//! answer (device nodes, mounts, envs, CDI names) for the container instead of calling Allocate
//! again; its start-up cleanup removes sockets only, so the file survives. The stand-in keeps the
//! same file with the same field names; the answer is the protobuf message, base64 in the JSON as
//! Go writes a `[]byte`. (kubelet adds a checksum of the data, which the stand-in leaves out.)

use std::io;
use std::path::Path;

use base64::Engine;
use prost::Message;
use serde::{Deserialize, Serialize};

use super::api;

/// kubelet's `kubeletDeviceManagerCheckpoint`.
pub const CHECKPOINT_NAME: &str = "kubelet_internal_checkpoint";

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Checkpoint {
    data: Data,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Data {
    pod_device_entries: Vec<Entry>,
}

/// One container's allocation of one resource (`PodDevicesEntry`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    container_name: String,
    resource_name: String,
    #[serde(rename = "DeviceIDs")]
    device_ids: Vec<String>,
    alloc_resp: String,
}

impl Checkpoint {
    /// Reads the checkpoint in `dir`; none yet is an empty one.
    pub fn load(dir: &Path) -> io::Result<Self> {
        match std::fs::read(dir.join(CHECKPOINT_NAME)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(io::Error::other),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Checkpoint::default()),
            Err(e) => Err(e),
        }
    }

    /// Writes the checkpoint into `dir` (to a temporary name, then renamed).
    pub fn save(&self, dir: &Path) -> io::Result<()> {
        let bytes = serde_json::to_vec(self).map_err(io::Error::other)?;
        let tmp = dir.join(format!(".{CHECKPOINT_NAME}.tmp"));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, dir.join(CHECKPOINT_NAME))
    }

    /// The device ids and the answer cached for `container` of `pod` and `resource`.
    pub fn find(
        &self,
        pod: &str,
        container: &str,
        resource: &str,
    ) -> Option<(Vec<String>, api::ContainerAllocateResponse)> {
        let entry = self.data.pod_device_entries.iter().find(|e| {
            e.pod_uid == pod && e.container_name == container && e.resource_name == resource
        })?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&entry.alloc_resp)
            .ok()?;
        let response = api::ContainerAllocateResponse::decode(bytes.as_slice()).ok()?;
        Some((entry.device_ids.clone(), response))
    }

    /// Records (or replaces) the allocation of `resource`'s `ids` to `container` of `pod`.
    pub fn insert(
        &mut self,
        pod: &str,
        container: &str,
        resource: &str,
        ids: &[String],
        response: &api::ContainerAllocateResponse,
    ) {
        self.data.pod_device_entries.retain(|e| {
            !(e.pod_uid == pod && e.container_name == container && e.resource_name == resource)
        });
        self.data.pod_device_entries.push(Entry {
            pod_uid: pod.into(),
            container_name: container.into(),
            resource_name: resource.into(),
            device_ids: ids.to_vec(),
            alloc_resp: base64::engine::general_purpose::STANDARD.encode(response.encode_to_vec()),
        });
    }

    /// Every device id allocated from `resource`.
    pub fn allocated(&self, resource: &str) -> Vec<String> {
        self.data
            .pod_device_entries
            .iter()
            .filter(|e| e.resource_name == resource)
            .flat_map(|e| e.device_ids.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_survive_a_write_and_a_read() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Checkpoint::load(dir.path()).unwrap(), Checkpoint::default());
        let response = api::ContainerAllocateResponse {
            cdi_devices: vec![api::CdiDevice {
                name: "devices.example.com/kvm=kvm-0".into(),
            }],
            ..Default::default()
        };
        let mut c = Checkpoint::default();
        c.insert(
            "pod-1",
            "app",
            "devices.example.com/kvm",
            &["kvm-0".into()],
            &response,
        );
        c.save(dir.path()).unwrap();
        let back = Checkpoint::load(dir.path()).unwrap();
        let (ids, cached) = back
            .find("pod-1", "app", "devices.example.com/kvm")
            .unwrap();
        assert_eq!((ids, cached), (vec!["kvm-0".to_string()], response));
        assert_eq!(back.allocated("devices.example.com/kvm"), ["kvm-0"]);
        assert!(
            back.find("pod-1", "other", "devices.example.com/kvm")
                .is_none()
        );
        let text = std::fs::read_to_string(dir.path().join(CHECKPOINT_NAME)).unwrap();
        assert!(
            text.contains("\"PodDeviceEntries\"") && text.contains("\"PodUID\""),
            "{text}"
        );
    }
}
