//! wdp's Dynamic Resource Allocation (`resource.k8s.io/v1`) front-end: the parts that speak to
//! kubelet and the API server, fed by the host through one seam.
//!
//! # The seam
//!
//! The host owns a `tokio::sync::watch::Sender<`[`seam::Inventory`]`>` per DRA driver and sends
//! the driver's pools (one per scanner and node: devices with raw id, dev-type, health, NUMA
//! node, PCI placement, attributes, capacity and the CDI device names it wrote the specs of)
//! whenever a scan or a health change alters them. Everything below reads the latest value:
//!
//! - [`publisher::Publisher`] keeps the API server's ResourceSlices of the driver on the node
//!   equal to the inventory ([`slices`] builds them; [`names`] derives device names), and
//!   follows them through a watch ([`apiserver::watch`]) so that a wipe by kubelet is repaired
//!   at once;
//! - [`plugin::DraService`] serves kubelet's DRAPlugin v1 and v1beta1 (prepare and unprepare,
//!   idempotent through [`checkpoint`]) and DRAResourceHealth (the health stream);
//! - [`registration::Registrar`] answers kubelet's plugin watcher, and [`socket::serve`] keeps
//!   both sockets in place.
//!
//! The API server is reached through two traits, [`apiserver::ClaimSource`] and
//! [`apiserver::SliceStore`], both implemented by [`apiserver::client::ApiClient`] (in-cluster
//! configuration, or a kubeconfig's current context); [`apiserver::standin::ApiServerStandIn`] is a test API server that keeps the
//! real one's rules for these calls, so tests run the real client over real HTTP;
//! [`kubelet::KubeletStandIn`] is kubelet's side (plugin watcher, registration, Prepare and
//! Unprepare, a pod's claims handed to its containers as kubelet's DRA manager does, including
//! the extended-resource claim the scheduler makes, and kubelet's wipes of slices) over the real
//! sockets.
//!
//! # Putting it together
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use wdp_dra::{apiserver::client::ApiClient, checkpoint::Checkpoint, plugin::DraService,
//!     publisher::Publisher, registration::*, seam::Inventory, socket};
//!
//! let driver = "gpu.example.com";
//! let (inventory, updates) = tokio::sync::watch::channel(Inventory::default());
//! let api = ApiClient::in_cluster()?;
//! let endpoints = Endpoints {
//!     driver: driver.into(),
//!     plugins_registry: "/var/lib/kubelet/plugins_registry".into(),
//!     plugins: "/var/lib/kubelet/plugins".into(),
//!     health: true,
//! };
//! let checkpoint = Checkpoint::open("/var/lib/kubelet/plugins/gpu.example.com/checkpoint.json")?;
//! let service = DraService::new(driver, api.clone(), updates.clone(), checkpoint,
//!     Duration::from_secs(10));
//! let status = RegistrationStatusHandle::default();
//! let registrar = Registrar::new(&endpoints, status.clone());
//! tokio::spawn(socket::serve(endpoints.dra_socket(), service.routes(&endpoints),
//!     Duration::from_secs(1), std::future::pending(), || {}));
//! tokio::spawn(socket::serve(endpoints.registration_socket(),
//!     tonic::service::Routes::new(registrar.into_service()), Duration::from_secs(1),
//!     std::future::pending(), move || status.set(RegistrationState::Pending)));
//! tokio::spawn(Publisher::new(api, driver).run(updates, Duration::from_secs(10),
//!     std::future::pending()));
//! // ... and the host sends each scan's result: inventory.send(...)
//! # drop(inventory); Ok(()) }
//! ```
//!
//! # Who feeds it
//!
//! `wdp run` (its `dra` module) builds the [`seam::Inventory`] from its validated trees, with the
//! guests' typed attributes and capacities, and starts the pieces above for scanners configured
//! with `frontend: dra`.
#![warn(missing_docs)]

pub mod apiserver;
pub mod checkpoint;
pub mod kubelet;
pub mod names;
pub mod plugin;
pub mod proto;
pub mod publisher;
pub mod registration;
pub mod seam;
pub mod slices;
pub mod socket;
#[cfg(test)]
mod testing;
