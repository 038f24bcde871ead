//! The gRPC `DevicePlugin` service of one resource, and its conversions between kubelet's
//! messages and the WIT types hooks speak.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::Stream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::hook_errors::{allocate_error, hook_status, not_advertised};
use super::lifecycle::{StreamEnd, Streams};
use crate::allocate::{self, AllocateError, ContainerResponse};
use crate::bindings::types as wit;
use crate::hooks::Hooks;
use crate::preferred;
use crate::status::ResourceHandle;
use crate::tree::DeviceGroup;
use wdp_kubelet::api::device_plugin_server::DevicePlugin;
use wdp_kubelet::api::{self, DevicePluginOptions};
use wdp_kubelet::names::Resource;

/// The DevicePlugin service of one resource. Cheap to clone: one per connection.
#[derive(Clone)]
pub(super) struct PluginService {
    pub(super) resource: Arc<Resource>,
    pub(super) devices: watch::Receiver<Arc<DeviceGroup>>,
    pub(super) hooks: Option<Arc<Hooks>>,
    /// Cancelled when this socket stops serving; ends open streams.
    pub(super) stop: CancellationToken,
    pub(super) status: ResourceHandle,
    /// kubelet's streams, shared by every socket the resource serves on.
    pub(super) streams: Arc<Streams>,
}

impl PluginService {
    pub(super) fn options(&self) -> DevicePluginOptions {
        self.hooks.as_ref().map(|h| h.options()).unwrap_or_default()
    }
}

/// The ListAndWatch message that lists `devices` (public for the benchmarks, which time it).
pub fn to_list(devices: &DeviceGroup) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: devices
            .iter()
            .map(|(id, info)| api::Device {
                id: id.clone(),
                health: info.health.as_str().into(),
                // An empty list would tell kubelet the device is NUMA-aware yet on no node (some
                // kubelet versions then never align it): no nodes is no topology.
                topology: info
                    .numa_nodes
                    .as_ref()
                    .filter(|n| !n.is_empty())
                    .map(|nodes| api::TopologyInfo {
                        nodes: nodes
                            .iter()
                            .map(|&n| api::NumaNode { id: n.into() })
                            .collect(),
                    }),
            })
            .collect(),
    }
}

type ListStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(self.options()))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        // Each stream owns its receiver: streams never compete for updates.
        let mut rx = self.devices.clone();
        rx.mark_changed();
        let stop = self.stop.clone();
        let end = StreamEnd {
            number: self.streams.opened.fetch_add(1, Ordering::SeqCst) + 1,
            streams: self.streams.clone(),
            stop: stop.clone(),
        };
        let stream = futures::stream::unfold((rx, stop, end), |(mut rx, stop, end)| async move {
            tokio::select! {
                _ = stop.cancelled() => None,
                changed = rx.changed() => match changed {
                    Ok(()) => {
                        let list = to_list(&rx.borrow_and_update());
                        Some((Ok(list), (rx, stop, end)))
                    }
                    // The server was dropped: its task unlinks the socket, then cancels `stop`.
                    // Ending only then means a stream's end always finds the socket gone.
                    Err(_) => {
                        stop.cancelled().await;
                        None
                    }
                },
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let hooks = self.hooks.as_ref().ok_or_else(not_advertised)?;
        let requests: Vec<wit::ContainerPreferredAllocationRequest> = request
            .into_inner()
            .container_requests
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
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let started = Instant::now();
        let answer = self.answer_allocate(request).await;
        self.status.allocated(started.elapsed(), answer.is_ok());
        answer
    }

    async fn pre_start_container(
        &self,
        request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        let ids = request.into_inner().devices_ids;
        let hooks = self.hooks.as_ref().ok_or_else(not_advertised)?;
        match hooks.pre_start(&self.resource.dev_type, &ids).await {
            None => Err(not_advertised()),
            Some(Ok(())) => Ok(Response::new(api::PreStartContainerResponse {})),
            Some(Err(e)) => Err(hook_status(&self.resource, "pre-start-container", e)),
        }
    }
}

impl PluginService {
    /// The Allocate answer: the default response, then the post-allocate hook if any.
    async fn answer_allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let requests = request.into_inner().container_requests;
        let devices = self.devices.borrow().clone();
        let responses = allocate::default_responses(&self.resource.name, &devices, &requests)?;
        let responses = match &self.hooks {
            Some(hooks) if hooks.has_post_allocate() => {
                self.post_allocate(hooks, &requests, responses).await?
            }
            _ => responses,
        };
        Ok(Response::new(api::AllocateResponse {
            container_responses: responses
                .into_iter()
                .map(ContainerResponse::into_proto)
                .collect(),
        }))
    }

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
