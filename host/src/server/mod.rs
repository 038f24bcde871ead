//! One resource of a scanner as wdp serves it to kubelet: the adapter between the manager's device
//! groups and guest hooks, and `wdp_kubelet`'s device-plugin server.
//!
//! The server itself (socket, registration, re-registration, ListAndWatch streams) is
//! [`wdp_kubelet::server::ResourceServer`], which knows nothing of trees or guests. What it serves
//! is a [`ServedResource`]: the validated [`DeviceGroup`] as kubelet's devices, Allocate answered
//! with `allocate.rs`'s default response and the post-allocate hook, GetPreferredAllocation with
//! `preferred.rs`'s shaping of its hook's advice, PreStartContainer with its hook
//! ([`crate::hooks`]); what a failed hook answers kubelet is `hook_errors.rs`. Registration and
//! Allocate calls reach `/status` and `/metrics` through the resource's
//! [`crate::status::ResourceHandle`], the server's [`wdp_kubelet::server::ServerReport`].

mod hook_errors;
mod list;

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tonic::Status;
use wdp_kubelet::api;
use wdp_kubelet::names::Resource;
use wdp_kubelet::server::{ResourcePlugin, not_advertised};

use self::hook_errors::{allocate_error, hook_status};
use crate::allocate::{self, AllocateError, ContainerResponse};
use crate::bindings::types as wit;
use crate::hooks::Hooks;
use crate::preferred;
use crate::status::ResourceHandle;
use crate::tree::DeviceGroup;

/// A device-plugin server of one of a scanner's resources, as the manager runs it.
pub type ResourceServer = wdp_kubelet::server::ResourceServer<ServedResource>;

/// One resource of a scanner, answering kubelet's calls: its hooks, if the scanner has any, and
/// where its status goes.
pub struct ServedResource {
    resource: Resource,
    hooks: Option<Arc<Hooks>>,
    status: ResourceHandle,
    /// The list as last sent, in runs: an update encodes what changed.
    list: Mutex<self::list::EncodedList>,
}

impl ServedResource {
    /// `resource`, answered with the scanner's `hooks`, its Allocate calls and hook fallbacks
    /// counted in `status`.
    pub fn new(resource: Resource, hooks: Option<Arc<Hooks>>, status: ResourceHandle) -> Self {
        ServedResource {
            resource,
            hooks,
            status,
            list: Mutex::default(),
        }
    }

    /// Where this resource's status and metrics go.
    pub fn status(&self) -> &ResourceHandle {
        &self.status
    }
}

impl ResourcePlugin for ServedResource {
    type Devices = DeviceGroup;

    fn options(&self) -> api::DevicePluginOptions {
        self.hooks.as_ref().map(|h| h.options()).unwrap_or_default()
    }

    /// Encodes what changed since the last list ([`list::EncodedList`]), and counts the
    /// healthy devices for the status page and metrics as it goes.
    fn list(&self, devices: &DeviceGroup) -> Bytes {
        let listed = self
            .list
            .lock()
            .unwrap_or_else(|poisoned| {
                // An update that panicked may have left the runs half-done: encoded afresh.
                self.list.clear_poison();
                let mut list = poisoned.into_inner();
                *list = list::EncodedList::default();
                list
            })
            .update(devices);
        self.status
            .devices(listed.healthy, devices.len() - listed.healthy);
        listed.list
    }

    /// The default response, then the post-allocate hook if any.
    async fn allocate(
        &self,
        devices: &DeviceGroup,
        requests: Vec<api::ContainerAllocateRequest>,
    ) -> Result<api::AllocateResponse, Status> {
        let responses = allocate::default_responses(&self.resource.name, devices, &requests)?;
        let responses = match &self.hooks {
            Some(hooks) if hooks.has_post_allocate() => {
                self.post_allocate(hooks, &requests, responses).await?
            }
            _ => responses,
        };
        Ok(api::AllocateResponse {
            container_responses: responses
                .into_iter()
                .map(ContainerResponse::into_proto)
                .collect(),
        })
    }

    async fn preferred_allocation(
        &self,
        requests: Vec<api::ContainerPreferredAllocationRequest>,
    ) -> Result<api::PreferredAllocationResponse, Status> {
        let hooks = self.hooks.as_ref().ok_or_else(not_advertised)?;
        let requests: Vec<wit::ContainerPreferredAllocationRequest> = requests
            .into_iter()
            .map(|r| wit::ContainerPreferredAllocationRequest {
                available_device_ids: r.available_device_i_ds,
                must_include_device_ids: r.must_include_device_i_ds,
                allocation_size: u32::try_from(r.allocation_size).unwrap_or(0),
            })
            .collect();
        // Advice only: kubelet allocates without it, so a failing hook must not fail the pod.
        let resource = &self.resource.name;
        let answers = match hooks
            .preferred_allocation(&self.resource.dev_type, &requests)
            .await
        {
            None => return Err(not_advertised()),
            Some(Ok(answers)) if answers.len() == requests.len() => Some(answers),
            Some(Ok(answers)) => {
                tracing::warn!(resource = %resource, answers = answers.len(), requests = requests.len(), "get-preferred-allocation hook answered the wrong number of containers; no preference");
                None
            }
            Some(Err(e)) => {
                tracing::warn!(resource = %resource, error = %e, "get-preferred-allocation hook failed; no preference");
                None
            }
        };
        if answers.is_none() {
            self.status.preferred_fallback();
        }
        let mut answers = answers.map(Vec::into_iter);
        let container_responses = requests
            .iter()
            .map(|request| api::ContainerPreferredAllocationResponse {
                device_i_ds: preferred::answer(request, answers.as_mut().and_then(Iterator::next)),
            })
            .collect();
        Ok(api::PreferredAllocationResponse {
            container_responses,
        })
    }

    async fn pre_start(&self, device_ids: Vec<String>) -> Result<(), Status> {
        let hooks = self.hooks.as_ref().ok_or_else(not_advertised)?;
        match hooks.pre_start(&self.resource.dev_type, &device_ids).await {
            None => Err(not_advertised()),
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(hook_status(&self.resource, "pre-start-container", e)),
        }
    }
}

impl ServedResource {
    /// The post-allocate hook's rewrite of the default `responses`, checked against the
    /// scanner's policy before kubelet sees it.
    async fn post_allocate(
        &self,
        hooks: &Hooks,
        requests: &[api::ContainerAllocateRequest],
        responses: Vec<ContainerResponse>,
    ) -> Result<Vec<ContainerResponse>, AllocateError> {
        let resource = &self.resource.name;
        let wit_requests: Vec<_> = requests
            .iter()
            .map(|r| wit::ContainerAllocateRequest {
                device_ids: r.devices_ids.clone(),
            })
            .collect();
        let wit_responses: Vec<_> = responses.iter().map(ContainerResponse::to_wit).collect();
        let answer = hooks
            .post_allocate(&self.resource.dev_type, &wit_requests, &wit_responses)
            .await;
        let answer = match answer {
            None => return Ok(responses),
            Some(Ok(answer)) => answer,
            Some(Err(e)) => return Err(allocate_error(resource, e)),
        };
        if answer.len() != requests.len() {
            return Err(AllocateError::HookCount {
                resource: resource.clone(),
                got: answer.len(),
                want: requests.len(),
            });
        }
        answer
            .into_iter()
            .enumerate()
            .map(|(i, r)| hooks.check_response(i, r))
            .collect::<Result<_, _>>()
            .map_err(|error| AllocateError::HookInvalid {
                resource: resource.clone(),
                error,
            })
    }
}
