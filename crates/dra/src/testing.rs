//! Helpers of the crate's tests: a gRPC channel over a Unix socket, and waiting for a condition.

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

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
