//! Helpers of the crate's tests: a gRPC channel over a Unix socket, waiting for a condition, and
//! an API server reached as from a pod (TLS, a service-account token).

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tempfile::TempDir;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::apiserver::client::ApiClient;
use crate::apiserver::standin::{ApiServerStandIn, Options};

/// A channel to the gRPC server on `socket`, as kubelet opens one.
pub async fn channel(socket: &Path) -> Channel {
    wait_for(|| socket.exists()).await;
    let socket = socket.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
        .expect("connect to the socket")
}

/// Waits up to `bound` for `done`; how long it took.
pub async fn wait_within(bound: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = tokio::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < bound,
            "condition not reached in {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    start.elapsed()
}

/// Waits up to 5 s for `done`.
pub async fn wait_for(mut done: impl FnMut() -> bool) {
    for _ in 0..250 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("condition not reached in 5 s");
}

/// An API server stand-in over TLS that wants the bearer token `first`, and a client configured
/// as in a pod: the CA and the token in the returned directory, where a test writes a rotated
/// token as kubelet does.
pub async fn tls_server_and_client() -> (ApiServerStandIn, TempDir, ApiClient) {
    let cert = include_bytes!("apiserver/testdata/cert.pem").to_vec();
    let key = include_bytes!("apiserver/testdata/key.pem").to_vec();
    let server = ApiServerStandIn::start_with(Options {
        tls: Some((cert.clone(), key)),
        token: Some("first".into()),
        ..Options::default()
    })
    .await
    .expect("start the TLS stand-in");
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("ca.crt"), &cert).expect("write ca.crt");
    std::fs::write(dir.path().join("token"), "first\n").expect("write the token");
    let client = ApiClient::https("127.0.0.1", server.addr().port(), dir.path())
        .expect("a client of the stand-in");
    (server, dir, client)
}

/// A slice `name` of `driver` for `node`'s pool (generation 0, one slice), with `devices`
/// devices `dev-<i>`.
pub fn slice(name: &str, node: &str, driver: &str, devices: usize) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation: 0,
                resource_slice_count: 1,
            },
            devices: Some(
                (0..devices)
                    .map(|i| Device {
                        name: format!("dev-{i}"),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        },
    }
}
