//! Talking to kubelet: the Device Plugin API v1beta1 (`proto/`), Unix-socket transport, the
//! device-plugin directory watcher, registration, and a kubelet stand-in for demos and tests.

pub mod dir;
pub mod register;
pub mod standin;
pub mod transport;

/// Code generated from `proto/deviceplugin.proto` (package `v1beta1`).
#[allow(missing_docs, clippy::all)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

/// The only API version kubelet accepts, and the one wdp speaks.
pub const API_VERSION: &str = "v1beta1";

/// kubelet's default device-plugin directory.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// The file name of kubelet's registration socket inside the plugin directory.
pub const KUBELET_SOCKET_NAME: &str = "kubelet.sock";
