//! One HTTP/1.1 GET over plain TCP: what the tests ask of `wdp run --metrics-addr` (and of the
//! probes a DaemonSet points at it), without an HTTP client crate in the tests' build.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Why a GET got no answer to look at.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Connecting, writing or reading failed (e.g. nothing listens yet).
    #[error("GET {path} from {addr}: {source}")]
    Io {
        /// The address asked.
        addr: String,
        /// The path asked for.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
    /// What came back is not an HTTP answer.
    #[error("GET {path} from {addr}: not an HTTP answer: {response:?}")]
    Malformed {
        /// The address asked.
        addr: String,
        /// The path asked for.
        path: String,
        /// What came back.
        response: String,
    },
}

/// `GET path` from `addr` (`host:port`), the connection closed after the answer: its status code
/// and body.
pub async fn http_get(addr: &str, path: &str) -> Result<(u16, String), HttpError> {
    let io = |source| HttpError::Io {
        addr: addr.to_string(),
        path: path.to_string(),
        source,
    };
    let mut stream = TcpStream::connect(addr).await.map_err(io)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(io)?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.map_err(io)?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let parsed = response.split_once("\r\n\r\n").and_then(|(head, body)| {
        let code = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, body.to_string()))
    });
    parsed.ok_or_else(|| HttpError::Malformed {
        addr: addr.to_string(),
        path: path.to_string(),
        response,
    })
}
