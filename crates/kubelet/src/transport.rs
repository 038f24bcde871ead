//! gRPC over Unix sockets, both ways: kubelet and device plugins only ever talk through socket
//! files in the device-plugin directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::authority::Rewrite;

/// How long a connection attempt may take (kubelet uses 10 s for plugins).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a gRPC channel to the server listening on the socket `path`; its requests carry
/// `localhost` as `:authority`, as kubelet's device-plugin client sends (`WithAuthority`).
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

/// [`connect`], with `authority` as every request's `:authority`, byte for byte: what kubelet's
/// grpc-go sends where it dials a bare socket path (the percent-encoded path, which
/// `http::Uri` cannot hold; see [`crate::authority`]).
pub async fn connect_with_authority(
    path: &Path,
    authority: Vec<u8>,
) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_timeout(CONNECT_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            let authority = authority.clone();
            async move {
                let stream = UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(Rewrite::outbound(stream, authority)))
            }
        }))
        .await
}
