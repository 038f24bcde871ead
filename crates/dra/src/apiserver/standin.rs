//! A stand-in API server for tests: the resource.k8s.io/v1 calls of the DRA front-end, served
//! over real HTTP on loopback, so tests exercise [`super::client::ApiClient`] itself.
//!
//! It keeps the rules of the real API server for these calls:
//! - objects get a `uid`, a `resourceVersion` from one counter, and `metadata.generation` 1 at
//!   creation, bumped when an update changes the spec;
//! - create of a taken name: 409 AlreadyExists;
//! - update with a stale `resourceVersion`: 409 Conflict (none given: unconditional, as
//!   ResourceSlices allow); of a missing object: 404; `spec.driver` and `spec.nodeName` are
//!   immutable (422);
//! - delete of a missing object: 404; a body's `preconditions` (`uid`, `resourceVersion`) that
//!   do not hold: 409; DeleteCollection with a field selector;
//! - list with field selectors `spec.nodeName` and `spec.driver` (anything else: 400), its
//!   `metadata.resourceVersion` the latest;
//! - watch (`?watch=true`, the same field selectors): `resourceVersion` unset or "0" starts with
//!   the current slices as ADDED events, a version replays every change after it, and one older
//!   than the kept history ([`ApiServerStandIn::compact`]) gets an `ERROR` event with a 410
//!   Expired Status; DELETED events carry the deletion's resourceVersion; BOOKMARK events with
//!   `allowWatchBookmarks=true` (how often: [`Options::bookmarks`]); the watch ends at
//!   `timeoutSeconds` ([`ApiServerStandIn::end_watches`] ends them all at once); the answer is
//!   chunked, one JSON event a line; a test can make open watches miss events
//!   ([`ApiServerStandIn::lose_watch_events`]);
//! - `generateName`: the prefix cut to 58 bytes and five characters of the API server's name
//!   alphabet appended;
//! - nodes: `GET /api/v1/nodes/NAME` ([`ApiServerStandIn::insert_node`]);
//! - every ResourceSlice written is checked with these rules of kubernetes'
//!   `pkg/apis/resource/validation` (422 Invalid when one fails):
//!   name a DNS subdomain; `spec.driver` a DNS subdomain of at most 63 bytes; `spec.pool.name`
//!   non-empty, at most 253 bytes, '/'-separated DNS subdomains; `pool.generation` >= 0 and
//!   `pool.resourceSliceCount` >= 1; exactly one of `nodeName`, `nodeSelector`, `allNodes`,
//!   `perDeviceNodeSelection`, and `nodeName` a DNS subdomain; at most 128 devices; device names
//!   DNS labels, unique in the slice; at most 32 attributes and capacities per device; attribute
//!   and capacity names qualified names (an optional DNS-subdomain domain of at most 63 bytes,
//!   '/', a C identifier of at most 32 bytes), unique once the driver's domain is applied to
//!   unqualified ones; exactly one value per attribute; string and version values at most 64
//!   bytes, versions semantic versions.
//!
//! It serves plain HTTP, or HTTPS with a bearer token that a test can rotate ([`Options`],
//! [`ApiServerStandIn::set_token`]): a request without the current token gets 401, as from the
//! real server; with [`Options::client_ca`], a client certificate chaining to that CA
//! authenticates instead of the token. A test injects claims
//! ([`ApiServerStandIn::insert_claim`]), wipes slices as kubelet does
//! ([`ApiServerStandIn::wipe_slices`]) and reads what is stored.
//!
//! For the clients' behaviour under a misbehaving server it counts the requests on slices by
//! [`Verb`] ([`ApiServerStandIn::requests`]) and answers them with injected faults
//! ([`ApiServerStandIn::inject`]: a status such as 429 with `Retry-After`, 500, 503 or 409, or
//! an answer slower than the client waits); it breaks open watches mid-stream
//! ([`ApiServerStandIn::reset_watches`]); it holds a read of a claim unanswered until told
//! ([`ApiServerStandIn::hold_claim_read`]: a driver stopped in the middle of a
//! NodePrepareResources, for as long as a test needs, with no sleep); and after every slice change it checks each pool as
//! the scheduler reads it (the slices of its highest generation must agree on
//! `resourceSliceCount`, be no more than that many, and name each device once), recording what
//! breaks that ([`ApiServerStandIn::pool_violations`]).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::json;
use tokio::sync::mpsc;

use super::client::ApiClient;
use crate::names::{is_c_identifier, is_dns_label, is_dns_subdomain, is_semver};

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
const CLAIMS_PREFIX: &str = "/apis/resource.k8s.io/v1/namespaces/";
const NODES_PREFIX: &str = "/api/v1/nodes/";

/// An answer's body: whole, or a watch's events as they come.
type Body = UnsyncBoxBody<Bytes, BodyError>;
/// What ends an answer's body early: the connection is dropped mid-answer (a reset).
type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A kind of request on ResourceSlices, as the stand-in counts and fails them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    /// `GET .../resourceslices/NAME`.
    Get,
    /// `GET .../resourceslices`.
    List,
    /// `GET .../resourceslices?watch=true`.
    Watch,
    /// `POST .../resourceslices`.
    Create,
    /// `PUT .../resourceslices/NAME`.
    Update,
    /// `DELETE .../resourceslices/NAME`.
    Delete,
    /// `DELETE .../resourceslices`.
    DeleteCollection,
}

/// How the stand-in misbehaves on one request.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Answered with this status (a Status body with the usual reason) and, when given,
    /// `Retry-After: seconds`, without serving it: 429 as priority and fairness throttles, 500
    /// and 503 as an overloaded or restarting API server, 409 Conflict as a write that lost a
    /// race.
    Status {
        /// The HTTP status code.
        code: u16,
        /// The `Retry-After` header, in seconds.
        retry_after: Option<u64>,
    },
    /// Served, but answered only after this long: beyond the client's timeout the client sees
    /// a failure although a write was done.
    Slow(Duration),
}
/// An answer.
type Answer = Response<Body>;

/// The characters the API server draws a `generateName` suffix from (no vowels, no look-alikes).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// The suffix's length, and the longest prefix kept (63 - 5, as the API server truncates it).
const NAME_SUFFIX: usize = 5;
const MAX_GENERATE_PREFIX: usize = 58;

/// The stand-in; the server stops when it is dropped.
pub struct ApiServerStandIn {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

/// How the stand-in serves.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Serve HTTPS with this certificate chain and private key (both PEM).
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    /// Refuse (401) requests without `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// With `tls`: ask for a client certificate and take one that chains to this CA (PEM) as
    /// the request's credentials, instead of the token, as the API server's x509 authenticator
    /// does (`--client-ca-file`). A certificate that does not chain to it fails the handshake;
    /// none at all leaves the token to authenticate.
    pub client_ca: Option<Vec<u8>>,
    /// Send a BOOKMARK event this often on watches that allow them (the real API server: about
    /// every minute); `None`: never.
    pub bookmarks: Option<std::time::Duration>,
}

fn acceptor(
    cert: &[u8],
    key: &[u8],
    client_ca: Option<&[u8]>,
) -> std::io::Result<tokio_rustls::TlsAcceptor> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(std::io::Error::other)?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(std::io::Error::other)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                roots
                    .add(cert.map_err(std::io::Error::other)?)
                    .map_err(std::io::Error::other)?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .allow_unauthenticated()
                    .build()
                    .map_err(std::io::Error::other)?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(std::io::Error::other)?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Serves one connection; `client_cert`: its TLS handshake presented a client certificate the
/// verifier took, which authenticates every request on it.
async fn serve_io<I>(io: I, state: Arc<Mutex<State>>, client_cert: bool)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(handle(&state, request, client_cert).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, service)
        .await;
}

#[derive(Default)]
struct State {
    token: Option<String>,
    version: u64,
    uids: u64,
    slices: BTreeMap<String, ResourceSlice>,
    claims: BTreeMap<(String, String), ResourceClaim>,
    nodes: BTreeMap<String, Node>,
    /// Successful create, update and delete calls on slices.
    writes: u64,
    /// The slice changes after `compacted`, for watches that resume: (resourceVersion, event
    /// line).
    history: Vec<(u64, ResourceSlice, Bytes)>,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    watchers: Vec<Watcher>,
    /// Counts slice changes, for in-process observers that must not poll
    /// ([`ApiServerStandIn::changes`]).
    changes: tokio::sync::watch::Sender<u64>,
    /// While set, changes reach no open watch (events lost on the way): only a new list, or a
    /// watch started afterwards, shows them.
    muted: bool,
    watcher_ids: u64,
    bookmarks: Option<std::time::Duration>,
    /// List calls on slices, watch calls, and requests refused for their token.
    lists: u64,
    watches: u64,
    unauthorized: u64,
    /// Requests authenticated by a client certificate.
    by_certificate: u64,
    /// Requests on slices by verb, including those refused or failed.
    requests: BTreeMap<Verb, u64>,
    /// What the next requests of a verb meet, in order (`None`: served).
    faults: BTreeMap<Verb, VecDeque<Option<Fault>>>,
    /// What the pool checks found, in order.
    violations: Vec<String>,
    /// Reads of a claim still to hold, by (namespace, name) ([`ApiServerStandIn::hold_claim_read`]).
    holds: BTreeMap<(String, String), usize>,
    /// Claim reads held so far.
    held: u64,
    /// Set when held reads are answered ([`ApiServerStandIn::release_claim_reads`]).
    released: tokio::sync::watch::Sender<bool>,
}

/// One open watch: its field selector and where its events go.
struct Watcher {
    id: u64,
    node: Option<String>,
    driver: Option<String>,
    /// An event line, or `None`: break the connection.
    events: mpsc::UnboundedSender<Option<Bytes>>,
}

/// A watch event as the API server writes it: one JSON object and a newline.
fn event_line(kind: &str, object: &impl serde::Serialize) -> Bytes {
    let mut line =
        serde_json::to_vec(&json!({ "type": kind, "object": object })).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

impl State {
    fn next_version(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    /// Records a change of `slice` (already at its new resourceVersion) and hands it to the
    /// watches that select it.
    fn emit(&mut self, kind: &str, slice: &ResourceSlice) {
        let version = slice
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.version);
        let line = event_line(kind, slice);
        self.history.push((version, slice.clone(), line.clone()));
        self.check_pool(&slice.spec.driver, &slice.spec.pool.name);
        self.changes.send_modify(|n| *n += 1);
        if self.muted {
            return;
        }
        self.watchers.retain(|w| {
            !selected(slice, &w.node, &w.driver) || w.events.send(Some(line.clone())).is_ok()
        });
    }

    /// The pool `driver`/`pool` as the scheduler would read it now: its slices of the highest
    /// generation must agree on `resourceSliceCount`, be at most that many, and name each
    /// device once; what does not is recorded.
    fn check_pool(&mut self, driver: &str, pool: &str) {
        let slices: Vec<&ResourceSlice> = self
            .slices
            .values()
            .filter(|s| s.spec.driver == driver && s.spec.pool.name == pool)
            .collect();
        let Some(generation) = slices.iter().map(|s| s.spec.pool.generation).max() else {
            return;
        };
        let newest: Vec<&&ResourceSlice> = slices
            .iter()
            .filter(|s| s.spec.pool.generation == generation)
            .collect();
        let counts: std::collections::BTreeSet<i64> = newest
            .iter()
            .map(|s| s.spec.pool.resource_slice_count)
            .collect();
        let mut found = Vec::new();
        if counts.len() > 1 {
            found.push(format!("resourceSliceCount disagrees: {counts:?}"));
        }
        if let Some(count) = counts.first()
            && i64::try_from(newest.len()).unwrap_or(i64::MAX) > *count
        {
            found.push(format!(
                "{} slices, resourceSliceCount {count}",
                newest.len()
            ));
        }
        let mut names = HashSet::new();
        for device in newest.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
            if !names.insert(device.name.as_str()) {
                found.push(format!("device {} twice", device.name));
            }
        }
        for why in found {
            let at = self.version;
            self.violations.push(format!(
                "pool {driver}/{pool} generation {generation} at resourceVersion {at}: {why}"
            ));
        }
    }

    /// Removes the slice `name`, as a delete does: the DELETED event carries the object at the
    /// deletion's resourceVersion.
    fn remove_slice(&mut self, name: &str) -> Option<ResourceSlice> {
        let mut slice = self.slices.remove(name)?;
        slice.metadata.resource_version = Some(self.next_version());
        self.emit("DELETED", &slice);
        Some(slice)
    }

    fn next_uid(&mut self) -> String {
        self.uids += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.uids)
    }
}

impl Drop for ApiServerStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl ApiServerStandIn {
    /// Serves plain HTTP on a free loopback port, without authentication.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(Options::default()).await
    }

    /// Serves on a free loopback port as `options` say: HTTPS, a bearer token.
    pub async fn start_with(options: Options) -> std::io::Result<Self> {
        let acceptor = match &options.tls {
            Some((cert, key)) => Some(acceptor(cert, key, options.client_ca.as_deref())?),
            None => None,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            token: options.token,
            bookmarks: options.bookmarks,
            ..State::default()
        }));
        let served = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = served.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(stream).await {
                                let client_cert = tls.get_ref().1.peer_certificates().is_some();
                                serve_io(TokioIo::new(tls), state, client_cert).await;
                            }
                        }
                        None => serve_io(TokioIo::new(stream), state, false).await,
                    }
                });
            }
        });
        Ok(Self { addr, state, task })
    }

    /// From now on, requests must carry `token` (a rotated service-account token).
    pub fn set_token(&self, token: &str) {
        lock(&self.state).token = Some(token.to_owned());
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client of this server.
    pub fn client(&self) -> ApiClient {
        ApiClient::http(self.addr)
    }

    /// Stores `claim` (as the scheduler leaves it, allocation and all): given a UID if it has
    /// none and a new resourceVersion; it replaces any claim of the same namespace and name.
    /// Returns the stored claim.
    pub fn insert_claim(&self, mut claim: ResourceClaim) -> ResourceClaim {
        let mut state = lock(&self.state);
        if claim.metadata.uid.is_none() {
            claim.metadata.uid = Some(state.next_uid());
        }
        claim.metadata.resource_version = Some(state.next_version());
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        state.claims.insert(key, claim.clone());
        claim
    }

    /// Holds the next read of the claim `namespace/name` unanswered until
    /// [`ApiServerStandIn::release_claim_reads`] (or the stand-in's end): a driver preparing
    /// it stops there, in the middle of its NodePrepareResources, for as long as the test needs;
    /// [`ApiServerStandIn::claim_reads_held`] says when it got there.
    pub fn hold_claim_read(&self, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        *lock(&self.state).holds.entry(key).or_default() += 1;
    }

    /// How many claim reads were held so far (each one counted when it arrives).
    pub fn claim_reads_held(&self) -> u64 {
        lock(&self.state).held
    }

    /// Answers every held claim read, and holds no further ones that are pending.
    pub fn release_claim_reads(&self) {
        let mut s = lock(&self.state);
        s.holds.clear();
        s.released.send_replace(true);
    }

    /// Deletes the claim `namespace/name`.
    pub fn delete_claim(&self, namespace: &str, name: &str) {
        lock(&self.state)
            .claims
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Deletes the slices on `node` (every node: `None`) of `driver` (every driver: `None`), as
    /// kubelet does at its start (all of its node's) and 30 s after a driver became unusable.
    pub fn wipe_slices(&self, node: Option<&str>, driver: Option<&str>) -> usize {
        let mut state = lock(&self.state);
        let doomed: Vec<String> = state
            .slices
            .iter()
            .filter(|(_, s)| {
                node.is_none_or(|n| s.spec.node_name.as_deref() == Some(n))
                    && driver.is_none_or(|d| s.spec.driver == d)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in &doomed {
            state.remove_slice(name);
        }
        doomed.len()
    }

    /// Forgets the change history, as etcd's compaction does: a watch that resumes from an
    /// earlier resourceVersion gets 410 Gone and must list again.
    pub fn compact(&self) {
        let mut state = lock(&self.state);
        state.compacted = state.version;
        state.history.clear();
    }

    /// Ends every open watch, as the API server does at a watch's `timeoutSeconds` or when it
    /// restarts; the events already sent are still delivered.
    pub fn end_watches(&self) {
        lock(&self.state).watchers.clear();
    }

    /// Forgets the change history and ends every open watch with an `ERROR` event 410 Expired,
    /// as the API server does when a watcher fell behind its watch cache: the watcher cannot
    /// resume and must list again.
    pub fn expire_watches(&self) {
        let mut state = lock(&self.state);
        state.compacted = state.version;
        state.history.clear();
        let line = event_line("ERROR", &expired(state.version, state.compacted));
        for w in std::mem::take(&mut state.watchers) {
            let _ = w.events.send(Some(line.clone()));
        }
    }

    /// Breaks every open watch mid-answer (the connection dropped without the chunked answer's
    /// end, as a restarting API server or a load balancer does): the client sees an error, not
    /// an end.
    pub fn reset_watches(&self) {
        for w in std::mem::take(&mut lock(&self.state).watchers) {
            let _ = w.events.send(None);
        }
    }

    /// The next `times` requests of `verb` meet `fault`.
    pub fn inject(&self, verb: Verb, fault: Fault, times: usize) {
        self.inject_after(verb, 0, fault, times);
    }

    /// The next `served` requests of `verb` are served, then `times` meet `fault`.
    pub fn inject_after(&self, verb: Verb, served: usize, fault: Fault, times: usize) {
        let mut state = lock(&self.state);
        let queue = state.faults.entry(verb).or_default();
        queue.extend(std::iter::repeat_n(None, served));
        queue.extend(std::iter::repeat_n(Some(fault), times));
    }

    /// How many requests of `verb` on slices arrived so far, whatever their answer.
    pub fn requests(&self, verb: Verb) -> u64 {
        lock(&self.state)
            .requests
            .get(&verb)
            .copied()
            .unwrap_or_default()
    }

    /// Every time a pool was not as the scheduler can use it (see the module documentation),
    /// in order.
    pub fn pool_violations(&self) -> Vec<String> {
        lock(&self.state).violations.clone()
    }

    /// A receiver that is marked changed at every slice change (create, update, delete, wipe):
    /// how a benchmark times a change reaching the API server without polling or a watch's HTTP
    /// in between.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        lock(&self.state).changes.subscribe()
    }

    /// While `lost` is true, slice changes are stored but no open watch hears of them, as if
    /// the events were lost between the API server and its clients; a watch started or resumed
    /// afterwards replays them from the history.
    pub fn lose_watch_events(&self, lost: bool) {
        lock(&self.state).muted = lost;
    }

    /// Stores `node` (given a UID if it has none) and serves it at `/api/v1/nodes/NAME`.
    pub fn insert_node(&self, mut node: Node) -> Node {
        let mut state = lock(&self.state);
        if node.metadata.uid.is_none() {
            node.metadata.uid = Some(state.next_uid());
        }
        node.metadata.resource_version = Some(state.next_version());
        let name = node.metadata.name.clone().unwrap_or_default();
        state.nodes.insert(name, node.clone());
        node
    }

    /// The latest resourceVersion handed out.
    pub fn resource_version(&self) -> String {
        lock(&self.state).version.to_string()
    }

    /// How many list calls on slices were served so far (a watcher's re-lists show here).
    pub fn lists(&self) -> u64 {
        lock(&self.state).lists
    }

    /// How many watch calls were served so far.
    pub fn watches(&self) -> u64 {
        lock(&self.state).watches
    }

    /// How many requests were refused (401) for a missing or outdated token.
    pub fn unauthorized(&self) -> u64 {
        lock(&self.state).unauthorized
    }

    /// How many requests came over a connection authenticated by a client certificate.
    pub fn by_certificate(&self) -> u64 {
        lock(&self.state).by_certificate
    }

    /// Stores `slice` as if another writer had created it (validated like any other).
    pub fn put_slice(&self, mut slice: ResourceSlice) -> Result<ResourceSlice, String> {
        let mut state = lock(&self.state);
        let errors = validate(&slice);
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        let name = slice.metadata.name.clone().unwrap_or_default();
        slice.metadata.uid = Some(state.next_uid());
        slice.metadata.resource_version = Some(state.next_version());
        slice.metadata.generation = Some(1);
        let kind = if state.slices.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.slices.insert(name, slice.clone());
        state.emit(kind, &slice);
        Ok(slice)
    }

    /// Every stored slice, by name.
    pub fn slices(&self) -> Vec<ResourceSlice> {
        lock(&self.state).slices.values().cloned().collect()
    }

    /// How many slice writes (create, update, delete) succeeded so far.
    pub fn writes(&self) -> u64 {
        lock(&self.state).writes
    }
}

/// A claim as the scheduler leaves it, for [`ApiServerStandIn::insert_claim`]: `namespace/name`
/// with an allocation of `results`, each (request, device) of `driver`'s pool `pool`; no spec,
/// reserved for nobody (a test adds what its case needs).
pub fn allocated_claim(
    namespace: &str,
    name: &str,
    driver: &str,
    pool: &str,
    results: &[(&str, &str)],
) -> ResourceClaim {
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };
    let results = results
        .iter()
        .map(|(request, device)| DeviceRequestAllocationResult {
            driver: driver.into(),
            pool: pool.into(),
            device: (*device).into(),
            request: (*request).into(),
            ..Default::default()
        })
        .collect();
    ResourceClaim {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            ..Default::default()
        },
        spec: None,
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Answer {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message.into(),
        "reason": reason,
        "code": code.as_u16(),
    });
    respond(code, &body)
}

fn respond(code: StatusCode, body: &impl serde::Serialize) -> Answer {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut response = Response::new(
        Full::new(Bytes::from(bytes))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = code;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The field selector of `query` as (nodeName, driver) requirements; an error names a field the
/// real API server would not filter ResourceSlices by.
fn field_selector(query: Option<&str>) -> Result<(Option<String>, Option<String>), String> {
    let mut node = None;
    let mut driver = None;
    for pair in query.unwrap_or_default().split('&') {
        let Some(value) = pair.strip_prefix("fieldSelector=") else {
            continue;
        };
        for term in percent_decode(value).split(',').filter(|t| !t.is_empty()) {
            let (field, wanted) = term
                .split_once("==")
                .or_else(|| term.split_once('='))
                .ok_or_else(|| format!("invalid selector term {term:?}"))?;
            match field {
                "spec.nodeName" => node = Some(wanted.to_owned()),
                "spec.driver" => driver = Some(wanted.to_owned()),
                other => {
                    return Err(format!("field label not supported: {other}"));
                }
            }
        }
    }
    Ok((node, driver))
}

fn selected(slice: &ResourceSlice, node: &Option<String>, driver: &Option<String>) -> bool {
    node.as_ref()
        .is_none_or(|n| slice.spec.node_name.as_deref().unwrap_or_default() == n)
        && driver.as_ref().is_none_or(|d| &slice.spec.driver == d)
}

async fn handle(
    state: &Arc<Mutex<State>>,
    request: Request<Incoming>,
    client_cert: bool,
) -> Answer {
    let verb = verb_of(
        request.method(),
        request.uri().path(),
        request.uri().query(),
    );
    if let Some(verb) = verb {
        *lock(state).requests.entry(verb).or_default() += 1;
    }
    let token = lock(state).token.clone().filter(|_| !client_cert);
    if client_cert {
        lock(state).by_certificate += 1;
    }
    if let Some(token) = token {
        let given = request
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if given != Some(format!("Bearer {token}").as_str()) {
            lock(state).unauthorized += 1;
            return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
        }
    }
    let fault = verb.and_then(|v| lock(state).faults.get_mut(&v)?.pop_front().flatten());
    let answer = match fault {
        Some(Fault::Status { code, retry_after }) => {
            let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut answer = status(
                code,
                code.canonical_reason().unwrap_or("Failure"),
                format!("injected {code}"),
            );
            if let Some(seconds) = retry_after {
                answer.headers_mut().insert(
                    hyper::header::RETRY_AFTER,
                    hyper::header::HeaderValue::from(seconds),
                );
            }
            return answer;
        }
        Some(Fault::Slow(delay)) => Some(delay),
        None => None,
    };
    let served = serve(state, request).await;
    if let Some(delay) = answer {
        tokio::time::sleep(delay).await;
    }
    served
}

/// The verb of a request on slices; `None` for other resources.
fn verb_of(method: &Method, path: &str, query: Option<&str>) -> Option<Verb> {
    if path == SLICES {
        return match *method {
            Method::GET if param(query, "watch").is_some_and(|w| w == "true" || w == "1") => {
                Some(Verb::Watch)
            }
            Method::GET => Some(Verb::List),
            Method::POST => Some(Verb::Create),
            Method::DELETE => Some(Verb::DeleteCollection),
            _ => None,
        };
    }
    path.strip_prefix(SLICES)?.strip_prefix('/')?;
    match *method {
        Method::GET => Some(Verb::Get),
        Method::PUT => Some(Verb::Update),
        Method::DELETE => Some(Verb::Delete),
        _ => None,
    }
}

/// Serves an authenticated request.
async fn serve(state: &Arc<Mutex<State>>, request: Request<Incoming>) -> Answer {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().map(str::to_owned);
    let body = match request.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    if path == SLICES {
        return match method {
            Method::GET
                if param(query.as_deref(), "watch").is_some_and(|w| w == "true" || w == "1") =>
            {
                watch(state, query.as_deref())
            }
            Method::GET => list(state, query.as_deref()),
            Method::POST => create(state, &body),
            Method::DELETE => delete_collection(state, query.as_deref()),
            _ => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "method not allowed",
            ),
        };
    }
    if let Some(name) = path.strip_prefix(SLICES).and_then(|p| p.strip_prefix('/')) {
        let name = percent_decode(name);
        return match method {
            Method::GET => match lock(state).slices.get(&name) {
                Some(s) => respond(StatusCode::OK, s),
                None => not_found("resourceslices", &name),
            },
            Method::PUT => update(state, &name, &body),
            Method::DELETE => delete(state, &name, &body),
            _ => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "method not allowed",
            ),
        };
    }
    if let Some(name) = path.strip_prefix(NODES_PREFIX)
        && method == Method::GET
    {
        let name = percent_decode(name);
        return match lock(state).nodes.get(&name) {
            Some(n) => respond(StatusCode::OK, n),
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("nodes \"{name}\" not found"),
            ),
        };
    }
    if let Some(rest) = path.strip_prefix(CLAIMS_PREFIX)
        && let Some((namespace, name)) = rest.split_once("/resourceclaims/")
        && method == Method::GET
    {
        let key = (percent_decode(namespace), percent_decode(name));
        let held = {
            let mut s = lock(state);
            match s.holds.get_mut(&key) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    s.held += 1;
                    Some(s.released.subscribe())
                }
                _ => None,
            }
        };
        if let Some(mut released) = held {
            // Until released, or the stand-in is gone.
            let _ = released.wait_for(|r| *r).await;
        }
        return match lock(state).claims.get(&key) {
            Some(c) => respond(StatusCode::OK, c),
            None => not_found("resourceclaims", &key.1),
        };
    }
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("no route {method} {path}"),
    )
}

/// The Status of a watch from `version` when the history starts at `compacted`.
fn expired(version: u64, compacted: u64) -> serde_json::Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("too old resource version: {version} ({compacted})"),
        "reason": "Expired",
        "code": 410,
    })
}

fn not_found(resource: &str, name: &str) -> Answer {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{resource}.resource.k8s.io \"{name}\" not found"),
    )
}

/// The value of the query parameter `name`, decoded.
fn param(query: Option<&str>, name: &str) -> Option<String> {
    query
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .map(percent_decode)
}

/// A watch of the selected slices, with the real API server's semantics for these parameters:
/// `resourceVersion` unset or "0": the current slices as ADDED events first; a version: every
/// change after it (410 Gone in an ERROR event when the history no longer reaches back to it);
/// `allowWatchBookmarks=true`: BOOKMARK events with the current resourceVersion;
/// `timeoutSeconds`: the watch ends then. The answer is chunked, one event a line.
fn watch(state: &Arc<Mutex<State>>, query: Option<&str>) -> Answer {
    let (node, driver) = match field_selector(query) {
        Ok(s) => s,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e),
    };
    let since = match param(query, "resourceVersion").filter(|v| !v.is_empty() && v != "0") {
        None => None,
        Some(v) => match v.parse::<u64>() {
            Ok(v) => Some(v),
            Err(_) => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("invalid resource version {v:?}"),
                );
            }
        },
    };
    let timeout = param(query, "timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map(std::time::Duration::from_secs);
    let allow_bookmarks = param(query, "allowWatchBookmarks").is_some_and(|b| b == "true");
    let (events, received) = mpsc::unbounded_channel::<Option<Bytes>>();
    let mut st = lock(state);
    st.watches += 1;
    match since {
        Some(v) if v < st.compacted => {
            let _ = events.send(Some(event_line("ERROR", &expired(v, st.compacted))));
            drop(events);
        }
        since => {
            let backlog: Vec<Bytes> = match since {
                Some(v) => st
                    .history
                    .iter()
                    .filter(|(at, s, _)| *at > v && selected(s, &node, &driver))
                    .map(|(_, _, line)| line.clone())
                    .collect(),
                None => st
                    .slices
                    .values()
                    .filter(|s| selected(s, &node, &driver))
                    .map(|s| event_line("ADDED", s))
                    .collect(),
            };
            for line in backlog {
                let _ = events.send(Some(line));
            }
            st.watcher_ids += 1;
            let id = st.watcher_ids;
            if let Some(every) = st.bookmarks.filter(|_| allow_bookmarks) {
                let state = state.clone();
                let events = events.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(every).await;
                        let line = {
                            let st = lock(&state);
                            if !st.watchers.iter().any(|w| w.id == id) {
                                return;
                            }
                            let mark = json!({
                                "kind": "ResourceSlice",
                                "apiVersion": "resource.k8s.io/v1",
                                "metadata": { "resourceVersion": st.version.to_string() },
                            });
                            event_line("BOOKMARK", &mark)
                        };
                        if events.send(Some(line)).is_err() {
                            return;
                        }
                    }
                });
            }
            st.watchers.push(Watcher {
                id,
                node,
                driver,
                events,
            });
        }
    }
    drop(st);
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let frames = futures::stream::unfold(received, move |mut rx| async move {
        let line = match deadline {
            Some(at) => tokio::time::timeout_at(at, rx.recv()).await.ok().flatten(),
            None => rx.recv().await,
        }?;
        let frame = match line {
            Some(line) => Ok(Frame::data(line)),
            None => Err(BodyError::from("watch reset")),
        };
        Some((frame, rx))
    });
    let mut response = Response::new(StreamBody::new(frames).boxed_unsync());
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn list(state: &Mutex<State>, query: Option<&str>) -> Answer {
    let (node, driver) = match field_selector(query) {
        Ok(s) => s,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e),
    };
    let mut state = lock(state);
    state.lists += 1;
    let items: Vec<_> = state
        .slices
        .values()
        .filter(|s| selected(s, &node, &driver))
        .cloned()
        .collect();
    respond(
        StatusCode::OK,
        &json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSliceList",
            "metadata": { "resourceVersion": state.version.to_string() },
            "items": items,
        }),
    )
}

fn parse(body: &[u8]) -> Result<ResourceSlice, Box<Answer>> {
    serde_json::from_slice(body)
        .map_err(|e| Box::new(status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string())))
}

fn invalid(errors: &[String]) -> Answer {
    status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("ResourceSlice is invalid: {}", errors.join("; ")),
    )
}

fn create(state: &Mutex<State>, body: &[u8]) -> Answer {
    let mut slice = match parse(body) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let mut state = lock(state);
    if slice.metadata.name.as_deref().is_none_or(str::is_empty)
        && let Some(prefix) = slice.metadata.generate_name.clone()
    {
        // The API server's rule: the prefix cut to 58 bytes, five characters of its alphabet
        // appended (random there; drawn from a counter here, so tests are repeatable).
        let prefix: String = prefix.chars().take(MAX_GENERATE_PREFIX).collect();
        let mut n = state.uids + 1;
        let mut suffix = String::with_capacity(NAME_SUFFIX);
        for _ in 0..NAME_SUFFIX {
            let len = NAME_ALPHABET.len() as u64;
            suffix.push(char::from(
                NAME_ALPHABET[usize::try_from(n % len).unwrap_or(0)],
            ));
            n /= len;
        }
        slice.metadata.name = Some(format!("{prefix}{suffix}"));
    }
    let errors = validate(&slice);
    if !errors.is_empty() {
        return invalid(&errors);
    }
    let name = slice.metadata.name.clone().unwrap_or_default();
    if state.slices.contains_key(&name) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("resourceslices.resource.k8s.io \"{name}\" already exists"),
        );
    }
    slice.metadata.uid = Some(state.next_uid());
    slice.metadata.resource_version = Some(state.next_version());
    slice.metadata.generation = Some(1);
    state.slices.insert(name, slice.clone());
    state.writes += 1;
    state.emit("ADDED", &slice);
    respond(StatusCode::CREATED, &slice)
}

fn update(state: &Mutex<State>, name: &str, body: &[u8]) -> Answer {
    let mut slice = match parse(body) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    if slice.metadata.name.as_deref() != Some(name) {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the name of the object does not match the name on the URL",
        );
    }
    let mut state = lock(state);
    let Some(stored) = state.slices.get(name).cloned() else {
        return not_found("resourceslices", name);
    };
    if let Some(version) = &slice.metadata.resource_version
        && Some(version) != stored.metadata.resource_version.as_ref()
    {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on resourceslices.resource.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        );
    }
    let mut errors = validate(&slice);
    if slice.spec.driver != stored.spec.driver {
        errors.push("spec.driver: field is immutable".into());
    }
    if slice.spec.node_name != stored.spec.node_name {
        errors.push("spec.nodeName: field is immutable".into());
    }
    if !errors.is_empty() {
        return invalid(&errors);
    }
    let generation = stored.metadata.generation.unwrap_or(1);
    slice.metadata.uid = stored.metadata.uid.clone();
    slice.metadata.generation = Some(if slice.spec == stored.spec {
        generation
    } else {
        generation + 1
    });
    slice.metadata.resource_version = Some(state.next_version());
    state.slices.insert(name.to_owned(), slice.clone());
    state.writes += 1;
    state.emit("MODIFIED", &slice);
    respond(StatusCode::OK, &slice)
}

fn delete(state: &Mutex<State>, name: &str, body: &[u8]) -> Answer {
    let options: serde_json::Value = if body.is_empty() {
        serde_json::Value::Null
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
        }
    };
    let mut state = lock(state);
    let Some(stored) = state.slices.get(name) else {
        return not_found("resourceslices", name);
    };
    let pre = &options["preconditions"];
    let uid_ok = pre["uid"]
        .as_str()
        .is_none_or(|u| stored.metadata.uid.as_deref() == Some(u));
    let version_ok = pre["resourceVersion"]
        .as_str()
        .is_none_or(|v| stored.metadata.resource_version.as_deref() == Some(v));
    if !uid_ok || !version_ok {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Precondition failed for resourceslices.resource.k8s.io \"{name}\""),
        );
    }
    let removed = state.remove_slice(name);
    state.writes += 1;
    respond(StatusCode::OK, &removed)
}

fn delete_collection(state: &Mutex<State>, query: Option<&str>) -> Answer {
    let (node, driver) = match field_selector(query) {
        Ok(s) => s,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e),
    };
    let mut state = lock(state);
    let doomed: Vec<String> = state
        .slices
        .iter()
        .filter(|(_, s)| selected(s, &node, &driver))
        .map(|(n, _)| n.clone())
        .collect();
    let mut items = Vec::new();
    for name in doomed {
        if let Some(s) = state.remove_slice(&name) {
            items.push(s);
            state.writes += 1;
        }
    }
    respond(
        StatusCode::OK,
        &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {}, "items": items}),
    )
}

/// Checks a qualified attribute or capacity name; the name with the driver's domain applied.
fn qualified(name: &str, driver: &str, errors: &mut Vec<String>, at: &str) -> String {
    let (domain, id) = match name.split_once('/') {
        Some((d, i)) => (Some(d), i),
        None => (None, name),
    };
    if let Some(d) = domain
        && !(is_dns_subdomain(d) && d.len() <= 63)
    {
        errors.push(format!(
            "{at}: domain {d:?} is not a DNS subdomain of at most 63 bytes"
        ));
    }
    if !(is_c_identifier(id) && id.len() <= 32) {
        errors.push(format!(
            "{at}: {id:?} is not a C identifier of at most 32 bytes"
        ));
    }
    format!("{}/{id}", domain.unwrap_or(driver))
}

/// The rules of kubernetes' ResourceSlice validation this stand-in keeps (listed in the module
/// documentation); every failure, as `field: why`.
pub fn validate(slice: &ResourceSlice) -> Vec<String> {
    let mut errors = Vec::new();
    let name = slice.metadata.name.as_deref().unwrap_or_default();
    if !is_dns_subdomain(name) {
        errors.push(format!("metadata.name: {name:?} is not a DNS subdomain"));
    }
    let spec = &slice.spec;
    if !(is_dns_subdomain(&spec.driver) && spec.driver.len() <= 63) {
        errors.push(format!(
            "spec.driver: {:?} is not a DNS subdomain of at most 63 bytes",
            spec.driver
        ));
    }
    let pool = &spec.pool;
    if pool.name.is_empty() || pool.name.len() > 253 || !pool.name.split('/').all(is_dns_subdomain)
    {
        errors.push(format!(
            "spec.pool.name: {:?} is not '/'-separated DNS subdomains of at most 253 bytes",
            pool.name
        ));
    }
    if pool.generation < 0 {
        errors.push("spec.pool.generation: must be greater than or equal to 0".into());
    }
    if pool.resource_slice_count < 1 {
        errors.push("spec.pool.resourceSliceCount: must be greater than 0".into());
    }
    let selectors = [
        spec.node_name.as_ref().is_some_and(|n| !n.is_empty()),
        spec.node_selector.is_some(),
        spec.all_nodes == Some(true),
        spec.per_device_node_selection == Some(true),
    ];
    if selectors.iter().filter(|s| **s).count() != 1 {
        errors.push(
            "spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection is required"
                .into(),
        );
    }
    if let Some(node) = &spec.node_name
        && !node.is_empty()
        && !is_dns_subdomain(node)
    {
        errors.push(format!("spec.nodeName: {node:?} is not a DNS subdomain"));
    }
    let devices = spec.devices.as_deref().unwrap_or_default();
    if devices.len() > 128 {
        errors.push(format!(
            "spec.devices: {} devices, at most 128 allowed",
            devices.len()
        ));
    }
    let mut names = HashSet::new();
    for (i, device) in devices.iter().enumerate() {
        let at = format!("spec.devices[{i}]");
        if !is_dns_label(&device.name) {
            errors.push(format!("{at}.name: {:?} is not a DNS label", device.name));
        }
        if !names.insert(device.name.as_str()) {
            errors.push(format!("{at}.name: duplicate {:?}", device.name));
        }
        let attributes = device.attributes.as_ref();
        let capacity = device.capacity.as_ref();
        let total = attributes.map_or(0, BTreeMap::len) + capacity.map_or(0, BTreeMap::len);
        if total > 32 {
            errors.push(format!(
                "{at}: {total} attributes and capacities, at most 32 allowed"
            ));
        }
        let mut full = HashSet::new();
        for (key, value) in attributes.into_iter().flatten() {
            let at = format!("{at}.attributes[{key}]");
            if !full.insert(qualified(key, &spec.driver, &mut errors, &at)) {
                errors.push(format!("{at}: duplicate attribute name"));
            }
            let set = [
                value.bool.is_some(),
                value.int.is_some(),
                value.string.is_some(),
                value.version.is_some(),
                value.bools.is_some(),
                value.ints.is_some(),
                value.strings.is_some(),
                value.versions.is_some(),
            ];
            if set.iter().filter(|s| **s).count() != 1 {
                errors.push(format!("{at}: exactly one value is required"));
            }
            if let Some(s) = &value.string
                && s.len() > 64
            {
                errors.push(format!("{at}.string: longer than 64 bytes"));
            }
            if let Some(v) = &value.version
                && (v.len() > 64 || !is_semver(v))
            {
                errors.push(format!(
                    "{at}.version: {v:?} is not a semantic version of at most 64 bytes"
                ));
            }
        }
        for key in capacity.into_iter().flatten().map(|(k, _)| k) {
            let at = format!("{at}.capacity[{key}]");
            if !full.insert(qualified(key, &spec.driver, &mut errors, &at)) {
                errors.push(format!("{at}: duplicate name"));
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::{ApiError, ClaimSource, SliceStore};
    use crate::testing::slice;
    use k8s_openapi::api::resource::v1::Device;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[tokio::test]
    async fn the_client_meets_the_api_servers_rules() {
        let server = ApiServerStandIn::start().await.unwrap();
        let client = server.client();
        let created = client
            .create(&slice("a", "node-1", "gpu.example.com", 2))
            .await
            .unwrap();
        assert_eq!(created.metadata.generation, Some(1));
        let version = created.metadata.resource_version.clone().unwrap();
        assert!(matches!(
            client
                .create(&slice("a", "node-1", "gpu.example.com", 1))
                .await,
            Err(ApiError::Conflict(_))
        ));
        client
            .create(&slice("b", "node-2", "gpu.example.com", 1))
            .await
            .unwrap();
        client
            .create(&slice("c", "node-1", "nic.example.com", 1))
            .await
            .unwrap();

        let listed = client.list("node-1", "gpu.example.com").await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].metadata.name.as_deref(), Some("a"));

        // Update: the spec change bumps metadata.generation; a stale resourceVersion is refused.
        let mut changed = created.clone();
        changed.spec.devices = Some(vec![Device {
            name: "other".into(),
            ..Default::default()
        }]);
        let updated = client.update(&changed).await.unwrap();
        assert_eq!(updated.metadata.generation, Some(2));
        assert_ne!(
            updated.metadata.resource_version.as_deref(),
            Some(version.as_str())
        );
        assert!(matches!(
            client.update(&changed).await,
            Err(ApiError::Conflict(_))
        ));
        let mut moved = updated.clone();
        moved.spec.node_name = Some("node-3".into());
        moved.spec.pool.name = "node-3".into();
        let err = client.update(&moved).await.unwrap_err();
        assert!(err.to_string().contains("immutable"), "{err}");

        // Invalid slices are refused with the API's reasons.
        let mut bad = slice("d", "node-1", "gpu.example.com", 129);
        bad.spec.devices.as_mut().unwrap()[0].name = "Not_A_Label".into();
        let err = client.create(&bad).await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ApiError::Status { code: 422, .. }), "{text}");
        assert!(
            text.contains("at most 128") && text.contains("not a DNS label"),
            "{text}"
        );

        client.delete("a").await.unwrap();
        assert!(matches!(
            client.delete("a").await,
            Err(ApiError::NotFound(_))
        ));
        client
            .delete_all_slices("node-2", "gpu.example.com")
            .await
            .unwrap();
        let names: Vec<_> = server
            .slices()
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect();
        assert_eq!(names, ["c"]);

        assert_eq!(client.get_claim("ns", "missing").await.unwrap(), None);
    }

    #[tokio::test]
    async fn in_cluster_tls_and_a_rotated_token() {
        let (server, dir, client) = crate::testing::tls_server_and_client().await;
        client
            .create(&slice("a", "node-1", "gpu.example.com", 1))
            .await
            .unwrap();

        // kubelet rotates the projected token: the next request reads the new file.
        server.set_token("second");
        let err = client.list("node-1", "gpu.example.com").await.unwrap_err();
        assert!(matches!(err, ApiError::Status { code: 401, .. }), "{err}");
        std::fs::write(dir.path().join("token"), "second").unwrap();
        assert_eq!(
            client
                .list("node-1", "gpu.example.com")
                .await
                .unwrap()
                .len(),
            1
        );

        // A CA that did not sign the server's certificate: no connection.
        let other = tempfile::tempdir().unwrap();
        std::fs::write(
            other.path().join("ca.crt"),
            include_bytes!("testdata/other-ca.pem"),
        )
        .unwrap();
        std::fs::write(other.path().join("token"), "second").unwrap();
        let untrusting = ApiClient::https("127.0.0.1", server.addr().port(), other.path()).unwrap();
        let err = untrusting
            .list("node-1", "gpu.example.com")
            .await
            .unwrap_err();
        assert!(matches!(err, ApiError::Transport(_)), "{err}");
    }

    #[tokio::test]
    async fn generated_names_and_nodes() {
        let server = ApiServerStandIn::start().await.unwrap();
        let client = server.client();
        let mut generated = slice("", "node-1", "gpu.example.com", 1);
        generated.metadata.name = None;
        generated.metadata.generate_name = Some(format!("{}-", "n".repeat(70)));
        let a = client.create(&generated).await.unwrap();
        let b = client.create(&generated).await.unwrap();
        let (a, b) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 63, "{a}");
        assert!(a.starts_with(&"n".repeat(58)), "{a}");
        assert!(a[58..].bytes().all(|c| NAME_ALPHABET.contains(&c)), "{a}");

        assert_eq!(client.get_node("node-1").await.unwrap(), None);
        let stored = server.insert_node(Node {
            metadata: ObjectMeta {
                name: Some("node-1".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let node = client.get_node("node-1").await.unwrap().unwrap();
        assert_eq!(node.metadata.uid, stored.metadata.uid);
        assert!(node.metadata.uid.is_some());
    }

    #[test]
    fn attribute_rules() {
        use k8s_openapi::api::resource::v1::DeviceAttribute;
        let mut s = slice("a", "node-1", "gpu.example.com", 1);
        let attrs = BTreeMap::from([
            (
                "model".to_string(),
                DeviceAttribute {
                    string: Some("x".into()),
                    ..Default::default()
                },
            ),
            (
                "gpu.example.com/model".to_string(),
                DeviceAttribute {
                    string: Some("y".into()),
                    ..Default::default()
                },
            ),
            (
                "driverVersion".to_string(),
                DeviceAttribute {
                    version: Some("1.2".into()),
                    ..Default::default()
                },
            ),
            (
                "two".to_string(),
                DeviceAttribute {
                    int: Some(1),
                    bool: Some(true),
                    ..Default::default()
                },
            ),
            (
                "bad-name".to_string(),
                DeviceAttribute {
                    int: Some(1),
                    ..Default::default()
                },
            ),
        ]);
        s.spec.devices.as_mut().unwrap()[0].attributes = Some(attrs);
        let errors = validate(&s).join("\n");
        assert!(errors.contains("duplicate attribute name"), "{errors}");
        assert!(errors.contains("not a semantic version"), "{errors}");
        assert!(errors.contains("exactly one value"), "{errors}");
        assert!(
            errors.contains("\"bad-name\" is not a C identifier"),
            "{errors}"
        );
    }
}
