//! The gRPC `DevicePlugin` service of one resource: ListAndWatch from the server's device list,
//! every other call handed to the resource's [`ResourcePlugin`].

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::Stream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::Listed;
use super::lifecycle::{StreamEnd, Streams};
use super::plugin::ResourcePlugin;
use super::report::ServerReport;
use crate::api::device_plugin_server::DevicePlugin;
use crate::api::{self, DevicePluginOptions};
use crate::names::Resource;

/// The DevicePlugin service of one resource. Cheap to clone: one per connection.
pub(super) struct PluginService<P: ResourcePlugin> {
    pub(super) resource: Arc<Resource>,
    pub(super) devices: watch::Receiver<Listed<P::Devices>>,
    pub(super) plugin: Arc<P>,
    /// Cancelled when this socket stops serving; ends open streams.
    pub(super) stop: CancellationToken,
    pub(super) report: Arc<dyn ServerReport>,
    /// kubelet's streams, shared by every socket the resource serves on.
    pub(super) streams: Arc<Streams>,
}

// By hand: a derive would ask `P: Clone`, and only the `Arc`s are cloned.
impl<P: ResourcePlugin> Clone for PluginService<P> {
    fn clone(&self) -> Self {
        PluginService {
            resource: self.resource.clone(),
            devices: self.devices.clone(),
            plugin: self.plugin.clone(),
            stop: self.stop.clone(),
            report: self.report.clone(),
            streams: self.streams.clone(),
        }
    }
}

impl<P: ResourcePlugin> PluginService<P> {
    pub(super) fn options(&self) -> DevicePluginOptions {
        self.plugin.options()
    }
}

type ListStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<P: ResourcePlugin> DevicePlugin for PluginService<P> {
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
                        let list = rx.borrow_and_update().list.clone();
                        let list = api::ListAndWatchResponse::from_encoded(list);
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
        let requests = request.into_inner().container_requests;
        self.plugin
            .preferred_allocation(requests)
            .await
            .map(Response::new)
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let started = Instant::now();
        let requests = request.into_inner().container_requests;
        // The list as it is now, held for the whole call: an update meanwhile does not change
        // what this answer is built from.
        let devices = self.devices.borrow().devices.clone();
        let answer = self.plugin.allocate(&devices, requests).await;
        self.report.allocated(started.elapsed(), answer.is_ok());
        answer.map(Response::new)
    }

    async fn pre_start_container(
        &self,
        request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        let ids = request.into_inner().devices_ids;
        self.plugin.pre_start(ids).await?;
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}
