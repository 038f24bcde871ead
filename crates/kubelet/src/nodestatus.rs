//! What a device plugin leaves in its Node's status, and what the scheduler makes of it: the
//! two rules that decide whether a resource moved from a device plugin to DRA can be scheduled
//! through DRA at all.
//!
//! - kubelet writes each registered resource's capacity and allocatable into the Node's status
//!   (`MachineInfo` in `pkg/kubelet/nodestatus/setters.go`), and a resource its device manager
//!   forgot (the endpoint stopped [`ENDPOINT_STOP_GRACE`] ago, `GetCapacity` in
//!   `pkg/kubelet/cm/devicemanager/manager.go`) at capacity 0, never deleting the name: "this
//!   is to indicate that the resource is managed by device plugin and had been registered
//!   before". Allocatable follows capacity; an extended resource leaves allocatable only when it
//!   left capacity, which kubelet never does. Only an API write to the Node's status removes it.
//! - the scheduler (1.34, `pkg/scheduler/framework/plugins/noderesources/fit.go` and the
//!   DynamicResources plugin) sends an extended-resource request to the device-plugin check
//!   whenever the name is in the node's allocatable, whatever its quantity, and to DRA (the
//!   DeviceClass whose `extendedResourceName` it is) only when the name is absent. A name kubelet
//!   keeps at 0 is "Insufficient" for ever. (Later schedulers delegate a name at 0 to DRA too;
//!   1.34's is the one this models.)

use std::collections::BTreeMap;
use std::time::Duration;

/// kubelet's `endpointStopGracePeriod`: how long a stopped device-plugin endpoint's resource is
/// kept (its devices unhealthy) before the device manager forgets it.
pub const ENDPOINT_STOP_GRACE: Duration = Duration::from_secs(5 * 60);

/// What kubelet's device manager reports at one Node status update.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceCapacity {
    /// Every device of each resource it knows.
    pub capacity: BTreeMap<String, i64>,
    /// The healthy devices of each.
    pub allocatable: BTreeMap<String, i64>,
    /// Resources forgotten since the last report.
    pub removed: Vec<String>,
}

/// The device-plugin part of a Node's `status.capacity` and `status.allocatable`, as the API
/// server keeps it between kubelet's updates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStatus {
    /// `status.capacity`.
    pub capacity: BTreeMap<String, i64>,
    /// `status.allocatable`.
    pub allocatable: BTreeMap<String, i64>,
}

/// Where the scheduler sends one extended-resource request on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// To the device-plugin check, against this allocatable ("Insufficient" below the request).
    DevicePlugin(i64),
    /// To DRA, through the DeviceClass that names it.
    Dra,
    /// Nowhere: "Insufficient", no DeviceClass names it.
    Unknown,
}

impl NodeStatus {
    /// kubelet's status update with `reported`: capacities written, removed resources kept at
    /// 0, allocatable set from capacity then from the device manager's allocatable.
    pub fn update(&mut self, reported: &DeviceCapacity) {
        for (name, n) in &reported.capacity {
            self.capacity.insert(name.clone(), *n);
        }
        for name in &reported.removed {
            self.capacity.insert(name.clone(), 0);
        }
        self.allocatable
            .retain(|name, _| self.capacity.contains_key(name));
        for (name, n) in &self.capacity {
            self.allocatable.insert(name.clone(), *n);
        }
        for (name, n) in &reported.allocatable {
            self.allocatable.insert(name.clone(), *n);
        }
    }

    /// An API write removing `name` from both maps: the JSON patch of
    /// `kubectl patch node NODE --subresource=status --type=json`.
    pub fn remove(&mut self, name: &str) {
        self.capacity.remove(name);
        self.allocatable.remove(name);
    }

    /// Where the scheduler sends a request for `name`, given the extended resource names
    /// DeviceClasses map (`spec.extendedResourceName`).
    pub fn route(&self, name: &str, device_classes: &[&str]) -> Route {
        match self.allocatable.get(name) {
            Some(n) => Route::DevicePlugin(*n),
            None if device_classes.contains(&name) => Route::Dra,
            None => Route::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::api;
    use crate::dir::PluginDir;
    use crate::names::Resource;
    use crate::server::{PluginSockets, ResourcePlugin, ResourceServer, ServerReport};
    use crate::standin::StandIn;

    struct One;

    impl ResourcePlugin for One {
        type Devices = ();
        fn options(&self) -> api::DevicePluginOptions {
            api::DevicePluginOptions::default()
        }
        fn list(&self, _: &()) -> bytes::Bytes {
            crate::list::encode(&[api::Device {
                id: "kvm-0".into(),
                health: "Healthy".into(),
                topology: None,
            }])
        }
        async fn allocate(
            &self,
            _: &(),
            _: Vec<api::ContainerAllocateRequest>,
        ) -> Result<api::AllocateResponse, tonic::Status> {
            Err(crate::server::not_advertised())
        }
        async fn preferred_allocation(
            &self,
            _: Vec<api::ContainerPreferredAllocationRequest>,
        ) -> Result<api::PreferredAllocationResponse, tonic::Status> {
            Err(crate::server::not_advertised())
        }
        async fn pre_start(&self, _: Vec<String>) -> Result<(), tonic::Status> {
            Err(crate::server::not_advertised())
        }
    }

    struct Quiet;

    impl ServerReport for Quiet {
        fn registered(&self, _: bool) {}
        fn registration_failed(&self, _: &str) {}
        fn stream_lost(&self) {}
        fn allocated(&self, _: Duration, _: bool) {}
    }

    async fn until(what: &str, done: impl Fn() -> bool) {
        for _ in 0..1000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("not within 10 s: {what}");
    }

    /// A resource served by a device plugin, then moved to DRA (its server stopped): kubelet
    /// keeps the name, unhealthy during the grace period and at 0 after it, so the scheduler
    /// never takes the DRA path; only the name's removal from the Node's status opens it, and
    /// kubelet does not write it back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resource_moved_to_dra_is_scheduled_through_dra_only_once_its_name_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("device-plugins");
        let (kubelet, _observed) = StandIn::start(&plugins).unwrap();
        let sockets = Arc::new(PluginSockets {
            dir: PluginDir::watch(&plugins).unwrap(),
            socket: plugins.join(crate::KUBELET_SOCKET_NAME),
        });
        let resource = Resource::new("devices.example.com", "kvm", &plugins).unwrap();
        let server = ResourceServer::start(sockets, resource, Arc::new(()), One, Quiet);
        let kvm = "devices.example.com/kvm";
        let classes = [kvm];
        until("listed", || kubelet.health(kvm, "kvm-0").is_some()).await;
        let mut node = NodeStatus::default();
        node.update(&kubelet.capacity(ENDPOINT_STOP_GRACE));
        assert_eq!(node.route(kvm, &classes), Route::DevicePlugin(1));

        // frontend: dra: the device-plugin server stops. Within the grace period the name
        // stays with its devices unhealthy.
        server.stop().await;
        until("the endpoint stopped", || {
            kubelet.stopped(kvm) == Some(true)
        })
        .await;
        node.update(&kubelet.capacity(ENDPOINT_STOP_GRACE));
        assert_eq!(node.capacity[kvm], 1);
        assert_eq!(node.route(kvm, &classes), Route::DevicePlugin(0));

        // The grace period over: forgotten by kubelet, kept by the Node at 0, still not DRA's.
        let forgotten = kubelet.capacity(Duration::ZERO);
        assert_eq!(forgotten.removed, [kvm]);
        node.update(&forgotten);
        assert_eq!((node.capacity[kvm], node.allocatable[kvm]), (0, 0));
        assert_eq!(node.route(kvm, &classes), Route::DevicePlugin(0));
        node.update(&kubelet.capacity(Duration::ZERO));
        assert_eq!(node.route(kvm, &classes), Route::DevicePlugin(0), "kept");

        // Removed from the Node's status: DRA's, and kubelet's next updates leave it so.
        node.remove(kvm);
        assert_eq!(node.route(kvm, &classes), Route::Dra);
        node.update(&kubelet.capacity(Duration::ZERO));
        assert_eq!(node.route(kvm, &classes), Route::Dra);
        assert_eq!(node.route("other.example.com/x", &classes), Route::Unknown);
        kubelet.stop().await;
    }
}
