//! The operator's HTTP endpoint of `wdp run --metrics-addr`: `/metrics`, `/healthz`, `/readyz`
//! and `/status`, over plain HTTP/1 on TCP.
//!
//! Every answer is computed from the shared [`Observability`] state at request time; nothing
//! here waits on a guest or on kubelet, so a scrape never stalls the host and the host never
//! stalls a scrape. Probes and scrapers open short connections; a client that sends no request
//! headers within [`HEADER_TIMEOUT`] is dropped, so idle connections cannot pile up.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::status::Observability;

/// How long a connection may take to send its request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The content type of `/metrics`: the OpenMetrics text format the encoder writes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The address could not be listened on.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} for /metrics, /healthz, /readyz and /status: {error}")]
pub struct BindError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// Why it could not be bound.
    pub error: std::io::Error,
}

/// A running endpoint. [`HttpServer::stop`] (or dropping it) closes the listener and every
/// connection.
pub struct HttpServer {
    addr: SocketAddr,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl HttpServer {
    /// Listens on `addr` (port 0 picks a free port; see [`HttpServer::addr`]) and serves `obs`.
    pub async fn start(addr: SocketAddr, obs: Observability) -> Result<Self, BindError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|error| BindError { addr, error })?;
        let bound = listener
            .local_addr()
            .map_err(|error| BindError { addr, error })?;
        let cancel = CancellationToken::new();
        let task = tokio::spawn(accept(listener, obs, cancel.clone()));
        Ok(HttpServer {
            addr: bound,
            cancel,
            task: Some(task),
        })
    }

    /// The address actually listened on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening and ends every open connection; returns once they are gone.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

async fn accept(listener: TcpListener, obs: Observability, cancel: CancellationToken) {
    let mut connections = JoinSet::new();
    loop {
        let stream = tokio::select! {
            _ = cancel.cancelled() => break,
            // Reap finished connections as we go, so the set stays as small as the open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let obs = obs.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let response = respond(&obs, &request);
                async move { Ok::<_, Infallible>(response) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(error = %e, "metrics endpoint: connection ended with an error");
            }
        });
    }
    connections.shutdown().await;
}

/// The answer to one request.
fn respond(obs: &Observability, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    let known = matches!(path, "/metrics" | "/healthz" | "/readyz" | "/status");
    if !known {
        return text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz, /readyz or /status\n".into(),
        );
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/metrics" => with_type(StatusCode::OK, OPENMETRICS, obs.metrics_text()),
        // The runtime answered: the process is alive.
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match obs.readiness() {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(reasons) => {
                let mut body = String::from("not ready:\n");
                for reason in reasons {
                    body.push_str("- ");
                    body.push_str(&reason);
                    body.push('\n');
                }
                text(StatusCode::SERVICE_UNAVAILABLE, body)
            }
        },
        _ => match serde_json::to_string_pretty(&obs.report()) {
            Ok(mut json) => {
                json.push('\n');
                with_type(StatusCode::OK, "application/json", json)
            }
            Err(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot encode the status: {e}\n"),
            ),
        },
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    with_type(status, "text/plain; charset=utf-8", body)
}

fn with_type(
    status: StatusCode,
    content_type: &'static str,
    body: String,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
