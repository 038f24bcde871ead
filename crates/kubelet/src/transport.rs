//! gRPC over Unix sockets, both ways: kubelet and device plugins only ever talk through socket
//! files in the device-plugin directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// How long a connection attempt may take (kubelet uses 10 s for plugins).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a gRPC channel to the server listening on the socket `path`.
pub async fn connect(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    // The URI is required by tonic but unused: the connector below decides where to connect.
    Endpoint::from_static("http://localhost")
        .connect_timeout(CONNECT_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}
