//! A small Kubernetes API client: the handful of REST calls the DRA front-end makes, on the hyper
//! and rustls already in wdp's tree.
//!
//! Why not the `kube` crate: it is the complete client (watchers, reflectors, discovery, config
//! files, exec auth, its own tower stack). kube 5.0 with only `client`, `rustls-tls` and `ring`
//! resolves against wdp's Cargo.lock to 27 crates the tree does not have (kube-client, kube-core,
//! jsonpath-rust and the pest parser generator, a YAML parser, derive_more, tower-http 0.7,
//! secrecy, psm and stacker with their assembly build, ...), for a handful of REST calls and one
//! watch. This client adds
//! none: hyper, hyper-util, tokio-rustls and rustls-pki-types are already built for tonic and
//! the OCI client. What a node agent needs from in-cluster configuration is small: the API server at
//! `KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT`, its CA and a service-account token, both in
//! `/var/run/secrets/kubernetes.io/serviceaccount`. The token is a projected one that kubelet
//! rotates, so it is read again for every request (a watch, too, when it is started again).
//! Outside a pod, [`ApiClient::from_kubeconfig`] takes the same parts (server, trust, token or
//! client certificate) from a kubeconfig's current context ([`super::kubeconfig`]). One
//! connection per request: these calls are rare (a slice change, a claim prepared) and a
//! connection pool is not worth its code. The watch of the node's slices is one long request
//! whose chunked answer is one JSON event a line (see [`super::watch`] for resuming it).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

use super::kubeconfig::{self, KubeconfigError, Token, Trust};
use super::{ApiError, ClaimSource, SliceList, SliceStore, WatchEvent, WatchStream};

/// Where the service-account files are mounted in a pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The resource.k8s.io/v1 ResourceSlice collection.
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// How long one call may take, connect to last byte.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the API server keeps one watch open (`timeoutSeconds`); the watcher resumes from
/// the last resourceVersion. Under the five minutes a load balancer in front of the API server
/// commonly allows an idle connection.
const WATCH_SECONDS: u64 = 290;

/// A watch that sends nothing for this long (no event, no bookmark; the API server sends a
/// bookmark about every minute) is taken for a dead connection and started again.
const WATCH_IDLE: Duration = Duration::from_secs(WATCH_SECONDS + 30);

/// The longest watch line read: far beyond a slice of 128 devices with 32 attributes each.
const MAX_WATCH_LINE: usize = 16 << 20;

/// A client of one API server.
#[derive(Clone)]
pub struct ApiClient {
    inner: Arc<Inner>,
}

struct Inner {
    host: String,
    port: u16,
    /// The path the API is served under (a kubeconfig's `server: https://host/prefix`), or "".
    prefix: String,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    token: Option<Token>,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient")
            .field("host", &self.inner.host)
            .field("port", &self.inner.port)
            .field("tls", &self.inner.tls.is_some())
            .finish()
    }
}

impl ApiClient {
    /// The client a pod uses: the API server from the `KUBERNETES_SERVICE_HOST` and
    /// `KUBERNETES_SERVICE_PORT` variables, trusted through and authenticated with the files in
    /// [`SERVICE_ACCOUNT_DIR`].
    pub fn in_cluster() -> Result<Self, ApiError> {
        let var = |name: &str| {
            std::env::var(name).map_err(|_| ApiError::Config(format!("{name} is not set")))
        };
        let host = var("KUBERNETES_SERVICE_HOST")?;
        let port = var("KUBERNETES_SERVICE_PORT")?;
        let port = port.parse().map_err(|_| {
            ApiError::Config(format!("KUBERNETES_SERVICE_PORT {port:?} is not a port"))
        })?;
        Self::https(&host, port, Path::new(SERVICE_ACCOUNT_DIR))
    }

    /// A client of `https://host:port`, trusting the CA bundle `<dir>/ca.crt` and sending the
    /// token `<dir>/token` (read again for every request).
    pub fn https(host: &str, port: u16, dir: &Path) -> Result<Self, ApiError> {
        let ca = dir.join("ca.crt");
        let pem =
            std::fs::read(&ca).map_err(|e| ApiError::Config(format!("{}: {e}", ca.display())))?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ApiError::Config(format!("{}: {e}", ca.display())))?;
        if certs.is_empty() {
            return Err(ApiError::Config(format!(
                "{} holds no certificate",
                ca.display()
            )));
        }
        let tls = connector(Trust::Roots(certs), None)
            .map_err(|e| ApiError::Config(format!("{}: {e}", ca.display())))?;
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| ApiError::Config(format!("server name {host:?}: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                host: host.to_owned(),
                port,
                prefix: String::new(),
                tls: Some((tls, name)),
                token: Some(Token::File(dir.join("token"))),
            }),
        })
    }

    /// The client the current context of a kubeconfig describes: `file`, else `$KUBECONFIG`,
    /// else `~/.kube/config` (see [`super::kubeconfig`] for what is supported).
    pub fn from_kubeconfig(file: Option<&Path>) -> Result<Self, ApiError> {
        let target = kubeconfig::load(file)?;
        let tls = if target.https {
            let config_error = |e: String| {
                ApiError::Kubeconfig(KubeconfigError::Invalid {
                    path: target.path.clone(),
                    entry: format!("context {:?}: TLS", target.context),
                    message: e,
                })
            };
            let connector = connector(target.trust, target.identity).map_err(config_error)?;
            let name = ServerName::try_from(target.server_name.clone())
                .map_err(|e| config_error(format!("server name {:?}: {e}", target.server_name)))?;
            Some((connector, name))
        } else {
            None
        };
        Ok(Self {
            inner: Arc::new(Inner {
                host: target.host,
                port: target.port,
                prefix: target.prefix,
                tls,
                token: target.token,
            }),
        })
    }

    /// A client of `http://addr` without credentials: the stand-in API server of the tests.
    pub fn http(addr: SocketAddr) -> Self {
        Self {
            inner: Arc::new(Inner {
                host: addr.ip().to_string(),
                port: addr.port(),
                prefix: String::new(),
                tls: None,
                token: None,
            }),
        }
    }

    /// `method path` with a JSON `body`; the body of a success (2xx), else the error the
    /// status means.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes, ApiError> {
        let call = async {
            let response = self.request(method, path, body).await?;
            let status = response.status();
            let bytes = collect(response.into_body()).await?;
            Ok::<_, ApiError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .map_err(|_| ApiError::Transport(format!("no answer in {CALL_TIMEOUT:?}")))??;
        if status.is_success() {
            return Ok(bytes);
        }
        Err(error_of(status, &bytes))
    }

    /// Sends one request on a new connection; the response with its body still to be read.
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<hyper::Response<Incoming>, ApiError> {
        let inner = &self.inner;
        let authority = if inner.host.contains(':') {
            format!("[{}]:{}", inner.host, inner.port)
        } else {
            format!("{}:{}", inner.host, inner.port)
        };
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", inner.prefix))
            .header(hyper::header::HOST, &authority)
            .header(hyper::header::ACCEPT, "application/json");
        let token = match &inner.token {
            None => None,
            Some(Token::Value(token)) => Some(token.clone()),
            Some(Token::File(file)) => Some(
                std::fs::read_to_string(file)
                    .map_err(|e| ApiError::Config(format!("{}: {e}", file.display())))?
                    .trim()
                    .to_owned(),
            ),
        };
        if let Some(token) = token {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if body.is_some() {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ApiError::Transport(e.to_string()))?;
        let tcp = TcpStream::connect((inner.host.as_str(), inner.port))
            .await
            .map_err(|e| ApiError::Transport(format!("connect {authority}: {e}")))?;
        match &inner.tls {
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| ApiError::Transport(format!("TLS to {authority}: {e}")))?;
                send(TokioIo::new(tls), request).await
            }
            None => send(TokioIo::new(tcp), request).await,
        }
    }

    /// Reads the node `name` (`GET /api/v1/nodes/NAME`), `None` when there is none: its UID
    /// is what a ResourceSlice's owner reference names, so that the slices of a deleted node
    /// are garbage-collected with it.
    pub async fn get_node(&self, name: &str) -> Result<Option<Node>, ApiError> {
        let path = format!("/api/v1/nodes/{}", percent_encode(name));
        match self.call(Method::GET, &path, None).await {
            Ok(body) => Ok(Some(serde_json::from_slice(&body)?)),
            Err(ApiError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes every slice of `driver` on `node` in one call (DeleteCollection): what a driver
    /// removed from the node does to leave nothing behind.
    pub async fn delete_all_slices(&self, node: &str, driver: &str) -> Result<(), ApiError> {
        self.call(Method::DELETE, &slice_selector(node, driver), None)
            .await
            .map(drop)
    }
}

/// A TLS connector trusting `trust`, presenting `identity` when there is one.
fn connector(
    trust: Trust,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<tokio_rustls::TlsConnector, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let roots = |certs: Vec<CertificateDer<'static>>| {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs {
            roots.add(cert).map_err(|e| e.to_string())?;
        }
        Ok::<_, String>(roots)
    };
    let builder = match trust {
        Trust::Roots(certs) => builder.with_root_certificates(roots(certs)?),
        Trust::System => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                return Err(format!(
                    "no certificate-authority given and no system CA certificates found ({}): set certificate-authority or certificate-authority-data",
                    found
                        .errors
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                ));
            }
            let mut store = rustls::RootCertStore::empty();
            // A system bundle may hold certificates webpki cannot use; client-go skips them too.
            let _ = store.add_parsable_certificates(found.certs);
            builder.with_root_certificates(store)
        }
        Trust::Anyone => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider))),
    };
    let config = match identity {
        Some((certs, key)) => builder
            .with_client_auth_cert(certs, key)
            .map_err(|e| format!("client certificate and key: {e}"))?,
        None => builder.with_no_client_auth(),
    };
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// `insecure-skip-tls-verify: true`: any server certificate is taken, but the handshake's
/// signatures are still checked with the key it carries.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The slice collection filtered to `node` and `driver`.
fn slice_selector(node: &str, driver: &str) -> String {
    format!(
        "{SLICES}?fieldSelector={}",
        percent_encode(&format!("spec.nodeName={node},spec.driver={driver}"))
    )
}

/// `s` with everything but unreserved URL characters percent-encoded.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The error a non-success answer means: its Status message (or the body) under the kind of
/// failure the code says.
fn error_of(status: StatusCode, bytes: &[u8]) -> ApiError {
    let message = serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(bytes).into_owned());
    match status {
        StatusCode::NOT_FOUND => ApiError::NotFound(message),
        StatusCode::CONFLICT => ApiError::Conflict(message),
        StatusCode::GONE => ApiError::Gone(message),
        _ => ApiError::Status {
            code: status.as_u16(),
            message,
        },
    }
}

async fn collect(body: Incoming) -> Result<Bytes, ApiError> {
    Ok(body
        .collect()
        .await
        .map_err(|e| ApiError::Transport(e.to_string()))?
        .to_bytes())
}

async fn send<I>(
    io: I,
    request: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<Incoming>, ApiError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| ApiError::Transport(e.to_string()))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "API server connection ended");
        }
    });
    sender
        .send_request(request)
        .await
        .map_err(|e| ApiError::Transport(e.to_string()))
}

/// One line of a watch answer: `{"type": ..., "object": ...}`.
#[derive(serde::Deserialize)]
struct RawEvent {
    #[serde(rename = "type")]
    kind: String,
    object: serde_json::Value,
}

/// A watch line as a [`WatchEvent`]; an `ERROR` line is the error its Status says (410: Gone).
fn parse_event(line: &[u8]) -> Result<WatchEvent, ApiError> {
    let raw: RawEvent = serde_json::from_slice(line)?;
    match raw.kind.as_str() {
        "ADDED" => Ok(WatchEvent::Added(serde_json::from_value(raw.object)?)),
        "MODIFIED" => Ok(WatchEvent::Modified(serde_json::from_value(raw.object)?)),
        "DELETED" => Ok(WatchEvent::Deleted(serde_json::from_value(raw.object)?)),
        "BOOKMARK" => Ok(WatchEvent::Bookmark(
            raw.object["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )),
        "ERROR" => {
            let code = raw.object["code"].as_u64().unwrap_or(500);
            let code = StatusCode::from_u16(u16::try_from(code).unwrap_or(500))
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Err(error_of(code, &serde_json::to_vec(&raw.object)?))
        }
        other => Err(ApiError::Transport(format!(
            "unknown watch event type {other:?}"
        ))),
    }
}

/// What is left of a watch answer: the body, the bytes of an unfinished line, and whether it
/// ended (after an error nothing more is read).
struct WatchBody {
    body: Incoming,
    pending: Vec<u8>,
    done: bool,
}

impl WatchBody {
    /// The next event: one JSON object a line, as the API server writes them into its chunked
    /// answer (a chunk may hold part of a line or several).
    async fn next(&mut self) -> Option<Result<WatchEvent, ApiError>> {
        while !self.done {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event = parse_event(&line);
                self.done = event.is_err();
                return Some(event);
            }
            if self.pending.len() > MAX_WATCH_LINE {
                self.done = true;
                return Some(Err(ApiError::Transport(format!(
                    "a watch event longer than {MAX_WATCH_LINE} bytes"
                ))));
            }
            match tokio::time::timeout(WATCH_IDLE, self.body.frame()).await {
                Err(_) => {
                    self.done = true;
                    return Some(Err(ApiError::Transport(format!(
                        "watch silent for {WATCH_IDLE:?}"
                    ))));
                }
                Ok(None) => self.done = true,
                Ok(Some(Err(e))) => {
                    self.done = true;
                    return Some(Err(ApiError::Transport(e.to_string())));
                }
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.pending.extend_from_slice(&data);
                    }
                }
            }
        }
        None
    }
}

impl ClaimSource for ApiClient {
    async fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ResourceClaim>, ApiError> {
        let path = format!(
            "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}",
            percent_encode(namespace),
            percent_encode(name)
        );
        match self.call(Method::GET, &path, None).await {
            Ok(body) => Ok(Some(serde_json::from_slice(&body)?)),
            Err(ApiError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl SliceStore for ApiClient {
    async fn list(&self, node: &str, driver: &str) -> Result<Vec<ResourceSlice>, ApiError> {
        Ok(self.list_at(node, driver).await?.items)
    }

    async fn list_at(&self, node: &str, driver: &str) -> Result<SliceList, ApiError> {
        let body = self
            .call(Method::GET, &slice_selector(node, driver), None)
            .await?;
        let list: k8s_openapi::List<ResourceSlice> = serde_json::from_slice(&body)?;
        Ok(SliceList {
            items: list.items,
            resource_version: list.metadata.resource_version.unwrap_or_default(),
        })
    }

    async fn watch(
        &self,
        node: &str,
        driver: &str,
        resource_version: &str,
    ) -> Result<WatchStream, ApiError> {
        let path = format!(
            "{}&watch=true&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds={WATCH_SECONDS}",
            slice_selector(node, driver),
            percent_encode(resource_version)
        );
        let response = tokio::time::timeout(CALL_TIMEOUT, self.request(Method::GET, &path, None))
            .await
            .map_err(|_| ApiError::Transport(format!("no answer in {CALL_TIMEOUT:?}")))??;
        let status = response.status();
        if !status.is_success() {
            let bytes = tokio::time::timeout(CALL_TIMEOUT, collect(response.into_body()))
                .await
                .map_err(|_| ApiError::Transport(format!("no answer in {CALL_TIMEOUT:?}")))??;
            return Err(error_of(status, &bytes));
        }
        let body = WatchBody {
            body: response.into_body(),
            pending: Vec::new(),
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(body, |mut body| async {
            body.next().await.map(|event| (event, body))
        })))
    }

    async fn create(&self, slice: &ResourceSlice) -> Result<ResourceSlice, ApiError> {
        let body = self
            .call(Method::POST, SLICES, Some(serde_json::to_vec(slice)?))
            .await?;
        Ok(serde_json::from_slice(&body)?)
    }

    async fn update(&self, slice: &ResourceSlice) -> Result<ResourceSlice, ApiError> {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        let path = format!("{SLICES}/{}", percent_encode(name));
        let body = self
            .call(Method::PUT, &path, Some(serde_json::to_vec(slice)?))
            .await?;
        Ok(serde_json::from_slice(&body)?)
    }

    async fn delete(&self, name: &str) -> Result<(), ApiError> {
        let path = format!("{SLICES}/{}", percent_encode(name));
        self.call(Method::DELETE, &path, None).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_cluster_files_missing_or_empty_are_configuration_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            ApiClient::https("10.0.0.1", 443, dir.path()),
            Err(ApiError::Config(_))
        ));
        std::fs::write(dir.path().join("ca.crt"), "not a certificate\n").unwrap();
        let err = ApiClient::https("10.0.0.1", 443, dir.path()).unwrap_err();
        assert!(err.to_string().contains("no certificate"), "{err}");
    }

    #[test]
    fn selectors_are_encoded() {
        assert_eq!(
            slice_selector("node-1", "gpu.example.com"),
            "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-1%2Cspec.driver%3Dgpu.example.com"
        );
    }
}
