//! What one resource answers kubelet: the seam between the server, which owns the socket, the
//! registration and the streams, and whoever knows the devices (wdp's manager and guest hooks).
//!
//! The server never looks inside a device list: it keeps the latest one in a `watch` channel,
//! converts it with [`ResourcePlugin::list`] for each ListAndWatch stream when it is sent, and
//! hands the same list to [`ResourcePlugin::allocate`], so an Allocate call always sees what its
//! stream last had a chance to send, and a list no stream reads is never converted.

use std::future::Future;

use tonic::Status;

use bytes::Bytes;

use crate::api;

/// The answers of one resource to kubelet's DevicePlugin calls, for the server to put on the
/// wire. Errors are gRPC statuses: the code is what kubelet reports with the pod.
pub trait ResourcePlugin: Send + Sync + 'static {
    /// The device list as its owner keeps it; replaced whole on every update
    /// ([`super::ResourceServer::update`]).
    type Devices: Send + Sync + 'static;

    /// What the plugin advertises, at registration and in `GetDevicePluginOptions`: whether
    /// kubelet calls PreStartContainer and GetPreferredAllocation.
    fn options(&self) -> api::DevicePluginOptions;

    /// `devices` as kubelet's `Device`s, encoded for a ListAndWatch message
    /// ([`crate::list::ListEncoder`], or [`crate::list::encode`] of `api::Device`s). Called once
    /// per update (and once at the start), and sent as it is by every stream. The one pass over
    /// the devices per update: an owner that reports what it lists (how many are healthy)
    /// counts it here rather than in a pass of its own.
    fn list(&self, devices: &Self::Devices) -> Bytes;

    /// The answer to `Allocate` for `requests`, one container each, from the current `devices`.
    fn allocate(
        &self,
        devices: &Self::Devices,
        requests: Vec<api::ContainerAllocateRequest>,
    ) -> impl Future<Output = Result<api::AllocateResponse, Status>> + Send;

    /// The answer to `GetPreferredAllocation` (asked only when [`ResourcePlugin::options`] says
    /// so): advice, which kubelet may ignore.
    fn preferred_allocation(
        &self,
        requests: Vec<api::ContainerPreferredAllocationRequest>,
    ) -> impl Future<Output = Result<api::PreferredAllocationResponse, Status>> + Send;

    /// The answer to `PreStartContainer` for `device_ids` (asked only when
    /// [`ResourcePlugin::options`] says so); an error fails the container's start.
    fn pre_start(&self, device_ids: Vec<String>)
    -> impl Future<Output = Result<(), Status>> + Send;
}

/// A call the plugin did not advertise to kubelet: what an implementation answers to a call its
/// [`ResourcePlugin::options`] left out, which a kubelet should not make.
pub fn not_advertised() -> Status {
    Status::unimplemented("this device plugin does not advertise this call")
}
