//! A kubeconfig file read as client-go reads it, for running wdp outside a pod against a real API
//! server: the current context's cluster (server, CA or system roots or
//! `insecure-skip-tls-verify`, `tls-server-name`) and user (`token`, `tokenFile`, a client
//! certificate and key, as files or `-data`).
//!
//! Which file: the one named, else every file of `$KUBECONFIG` (colon-separated; missing ones
//! skipped, the first file that sets a cluster, user, context or `current-context` wins, as
//! client-go merges them), else `~/.kube/config`. Relative paths in an entry are relative to the
//! file that holds it.
//!
//! Why not the `kube` crate's config module: it comes only with kube-client and its tree
//! (see [`super::client`]); what a node agent needs of a kubeconfig is the fields below, a few
//! serde structs over the YAML parser the host already has.
//!
//! What client-go can do and this cannot is refused by name rather than ignored, so that wdp
//! never talks to a server with other credentials than the operator meant: credential plugins
//! (`exec`), `auth-provider`, basic auth (`username`/`password`, which the API server dropped
//! in 1.19), impersonation (`as`, `as-uid`, `as-groups`, `as-user-extra`) and `proxy-url`. What
//! client-go's validation refuses is refused too: a CA together with
//! `insecure-skip-tls-verify`, a field given both as a file and as `-data`, a certificate without
//! its key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

/// Why a kubeconfig cannot be used; every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// No file to read: neither `$KUBECONFIG` nor `$HOME` is set.
    #[error("no kubeconfig: KUBECONFIG and HOME are both unset (name a file: kubeconfig:/path)")]
    NoPath,
    /// No file of `$KUBECONFIG` exists.
    #[error("no kubeconfig: none of the files in KUBECONFIG ({0}) exists")]
    NoneExists(String),
    /// A file could not be read.
    #[error("kubeconfig {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A file is not a kubeconfig (YAML of another shape).
    #[error("kubeconfig {}: not a kubeconfig: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// An entry cannot be used.
    #[error("kubeconfig {}: {entry}: {message}", path.display())]
    Invalid {
        /// The file holding the entry (all of `$KUBECONFIG`'s files, for what none of them has).
        path: PathBuf,
        /// The entry and field, as `user "admin" (context "dev"): exec`.
        entry: String,
        /// What is wrong, and what would be valid.
        message: String,
    },
}

/// The API server as the chosen context describes it.
pub struct Target {
    /// The file holding the context (for errors found later, building the TLS client).
    pub path: PathBuf,
    /// The context's name.
    pub context: String,
    /// `https` (true) or `http`.
    pub https: bool,
    /// The host to connect to (an IPv6 address without brackets).
    pub host: String,
    /// The port (443 or 80 when the URL has none).
    pub port: u16,
    /// The path the API is served under (`server: https://host/prefix`), or "".
    pub prefix: String,
    /// The name the server's certificate must carry: `tls-server-name`, else the host.
    pub server_name: String,
    /// Which certificates the server's may chain to.
    pub trust: Trust,
    /// The client certificate chain and key, when the user has one.
    pub identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    /// The bearer token, when the user has one.
    pub token: Option<Token>,
}

/// Which server certificates are trusted.
pub enum Trust {
    /// Those chaining to these CA certificates (`certificate-authority(-data)`).
    Roots(Vec<CertificateDer<'static>>),
    /// Those chaining to the system's roots (no CA given, as client-go does).
    System,
    /// Any (`insecure-skip-tls-verify: true`).
    Anyone,
}

/// A bearer token.
pub enum Token {
    /// `token`: sent as it is.
    Value(String),
    /// `tokenFile`: read again for every request, as client-go rereads it (rotated tokens).
    File(PathBuf),
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RawFile {
    current_context: Option<String>,
    clusters: Option<Vec<NamedCluster>>,
    users: Option<Vec<NamedUser>>,
    contexts: Option<Vec<NamedContext>>,
}

#[derive(Debug, Deserialize)]
struct NamedCluster {
    name: String,
    #[serde(default)]
    cluster: RawCluster,
}

#[derive(Debug, Deserialize)]
struct NamedUser {
    name: String,
    #[serde(default)]
    user: RawUser,
}

#[derive(Debug, Deserialize)]
struct NamedContext {
    name: String,
    #[serde(default)]
    context: RawContext,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RawCluster {
    server: Option<String>,
    tls_server_name: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
    certificate_authority: Option<PathBuf>,
    certificate_authority_data: Option<String>,
    proxy_url: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RawUser {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
    client_certificate: Option<PathBuf>,
    client_certificate_data: Option<String>,
    client_key: Option<PathBuf>,
    client_key_data: Option<String>,
    username: Option<String>,
    password: Option<String>,
    exec: Option<serde_yaml_ng::Value>,
    auth_provider: Option<serde_yaml_ng::Value>,
    #[serde(rename = "as")]
    impersonate: Option<String>,
    as_uid: Option<String>,
    as_groups: Option<serde_yaml_ng::Value>,
    as_user_extra: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct RawContext {
    cluster: Option<String>,
    user: Option<String>,
}

/// An entry and the file it came from.
struct Sourced<T> {
    file: PathBuf,
    value: T,
}

/// The files merged, first setter wins.
#[derive(Default)]
struct Merged {
    current_context: Option<Sourced<String>>,
    clusters: BTreeMap<String, Sourced<RawCluster>>,
    users: BTreeMap<String, Sourced<RawUser>>,
    contexts: BTreeMap<String, Sourced<RawContext>>,
}

/// `Some` of a non-empty string: client-go takes an empty field for an absent one.
fn given(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

fn given_path(p: &Option<PathBuf>) -> Option<&Path> {
    p.as_deref().filter(|p| !p.as_os_str().is_empty())
}

/// The API server `file` (or `$KUBECONFIG`, or `~/.kube/config`) names in its current context.
pub fn load(file: Option<&Path>) -> Result<Target, KubeconfigError> {
    let (files, skip_missing) = match file {
        Some(f) => (vec![f.to_path_buf()], false),
        None => match std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
            Some(list) => (
                std::env::split_paths(&list)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect(),
                true,
            ),
            None => {
                let home = std::env::var_os("HOME")
                    .filter(|h| !h.is_empty())
                    .ok_or(KubeconfigError::NoPath)?;
                (vec![Path::new(&home).join(".kube/config")], false)
            }
        },
    };
    load_files(&files, skip_missing)
}

/// The merge of `files` (in order; missing ones skipped when `skip_missing`) and its current
/// context's API server.
fn load_files(files: &[PathBuf], skip_missing: bool) -> Result<Target, KubeconfigError> {
    let mut merged = Merged::default();
    let mut read_any = false;
    for path in files {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if skip_missing && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(KubeconfigError::Read {
                    path: path.clone(),
                    source,
                });
            }
        };
        read_any = true;
        let raw: RawFile = if text.trim().is_empty() {
            RawFile::default()
        } else {
            serde_yaml_ng::from_str(&text).map_err(|e| KubeconfigError::Parse {
                path: path.clone(),
                message: e.to_string(),
            })?
        };
        merge(&mut merged, raw, path);
    }
    if !read_any {
        let list = std::env::join_paths(files)
            .map(|l| l.to_string_lossy().into_owned())
            .unwrap_or_default();
        return Err(KubeconfigError::NoneExists(list));
    }
    let everywhere = std::env::join_paths(files)
        .map(PathBuf::from)
        .unwrap_or_default();
    select(&merged, &everywhere)
}

fn merge(into: &mut Merged, raw: RawFile, file: &Path) {
    let sourced = |value| Sourced {
        file: file.to_path_buf(),
        value,
    };
    if into.current_context.is_none()
        && let Some(c) = raw.current_context.filter(|c| !c.is_empty())
    {
        into.current_context = Some(sourced(c));
    }
    for c in raw.clusters.unwrap_or_default() {
        into.clusters
            .entry(c.name)
            .or_insert_with(|| sourced_of(file, c.cluster));
    }
    for u in raw.users.unwrap_or_default() {
        into.users
            .entry(u.name)
            .or_insert_with(|| sourced_of(file, u.user));
    }
    for c in raw.contexts.unwrap_or_default() {
        into.contexts
            .entry(c.name)
            .or_insert_with(|| sourced_of(file, c.context));
    }
}

fn sourced_of<T>(file: &Path, value: T) -> Sourced<T> {
    Sourced {
        file: file.to_path_buf(),
        value,
    }
}

/// `names` as `a, b, c`, or `none`.
fn listing<T>(names: &BTreeMap<String, T>) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn select(merged: &Merged, everywhere: &Path) -> Result<Target, KubeconfigError> {
    let invalid = |path: &Path, entry: String, message: String| KubeconfigError::Invalid {
        path: path.to_path_buf(),
        entry,
        message,
    };
    let Some(current) = &merged.current_context else {
        return Err(invalid(
            everywhere,
            "current-context".into(),
            format!(
                "not set: choose a context with `kubectl config use-context NAME` (contexts: {})",
                listing(&merged.contexts)
            ),
        ));
    };
    let context_name = &current.value;
    let Some(context) = merged.contexts.get(context_name) else {
        return Err(invalid(
            &current.file,
            format!("current-context {context_name:?}"),
            format!("no such context (contexts: {})", listing(&merged.contexts)),
        ));
    };
    let Some(cluster_name) = given(&context.value.cluster) else {
        return Err(invalid(
            &context.file,
            format!("context {context_name:?}: cluster"),
            "not set: name one of the clusters".into(),
        ));
    };
    let Some(cluster) = merged.clusters.get(cluster_name) else {
        return Err(invalid(
            &context.file,
            format!("context {context_name:?}: cluster"),
            format!(
                "{cluster_name:?}: no such cluster (clusters: {})",
                listing(&merged.clusters)
            ),
        ));
    };
    let user = match given(&context.value.user) {
        None => None,
        Some(name) => match merged.users.get(name) {
            Some(user) => Some((name, user)),
            None => {
                return Err(invalid(
                    &context.file,
                    format!("context {context_name:?}: user"),
                    format!("{name:?}: no such user (users: {})", listing(&merged.users)),
                ));
            }
        },
    };
    let mut target = cluster_target(cluster_name, context_name, cluster)?;
    target.path = context.file.clone();
    if let Some((name, user)) = user {
        let (identity, token) = credentials(name, context_name, user)?;
        target.identity = identity;
        target.token = token;
    }
    Ok(target)
}

/// `p` as the entry from `file` means it: relative to the file's directory.
fn resolve(file: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        return p.to_path_buf();
    }
    file.parent().unwrap_or(Path::new("")).join(p)
}

fn cluster_target(
    name: &str,
    context: &str,
    cluster: &Sourced<RawCluster>,
) -> Result<Target, KubeconfigError> {
    let c = &cluster.value;
    let file = &cluster.file;
    let invalid = |field: &str, message: String| KubeconfigError::Invalid {
        path: file.clone(),
        entry: format!("cluster {name:?} (context {context:?}): {field}"),
        message,
    };
    if given(&c.proxy_url).is_some() {
        return Err(invalid(
            "proxy-url",
            "proxies are not supported: reach the API server directly, or run `kubectl proxy` and use http://127.0.0.1:8001".into(),
        ));
    }
    let server =
        given(&c.server).ok_or_else(|| invalid("server", "not set: https://HOST[:PORT]".into()))?;
    let bad_server = |why: &str| {
        invalid(
            "server",
            format!("{server:?}: {why}: use https://HOST[:PORT][/PATH] or http://HOST[:PORT]"),
        )
    };
    let uri: hyper::Uri = server.parse().map_err(|_| bad_server("not a URL"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(bad_server("not an http or https URL")),
    };
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| bad_server("no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let prefix = uri.path().trim_end_matches('/').to_owned();
    if uri.query().is_some() {
        return Err(bad_server("a query is not allowed"));
    }

    let ca_file = given_path(&c.certificate_authority);
    let ca_data = given(&c.certificate_authority_data);
    let trust = match (ca_file, ca_data, c.insecure_skip_tls_verify) {
        (Some(_), Some(_), _) => {
            return Err(invalid(
                "certificate-authority-data",
                "certificate-authority is set too: keep one of them".into(),
            ));
        }
        (Some(_), None, true) | (None, Some(_), true) => {
            return Err(invalid(
                "insecure-skip-tls-verify",
                "a certificate authority is set too: remove one (client-go refuses both)".into(),
            ));
        }
        (None, None, true) => Trust::Anyone,
        (None, None, false) => Trust::System,
        (Some(path), None, false) => {
            let path = resolve(file, path);
            let pem = std::fs::read(&path).map_err(|e| {
                invalid(
                    "certificate-authority",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            Trust::Roots(certificates(&pem).map_err(|e| {
                invalid("certificate-authority", format!("{}: {e}", path.display()))
            })?)
        }
        (None, Some(data), false) => Trust::Roots(
            decode(data)
                .and_then(|pem| certificates(&pem))
                .map_err(|e| invalid("certificate-authority-data", e))?,
        ),
    };
    Ok(Target {
        path: PathBuf::new(),
        context: context.to_owned(),
        https,
        server_name: given(&c.tls_server_name).unwrap_or(&host).to_owned(),
        host,
        port,
        prefix,
        trust,
        identity: None,
        token: None,
    })
}

type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn credentials(
    name: &str,
    context: &str,
    user: &Sourced<RawUser>,
) -> Result<(Option<Identity>, Option<Token>), KubeconfigError> {
    const SUPPORTED: &str =
        "supported: token, tokenFile, client-certificate(-data) with client-key(-data)";
    let u = &user.value;
    let file = &user.file;
    let invalid = |field: &str, message: String| KubeconfigError::Invalid {
        path: file.clone(),
        entry: format!("user {name:?} (context {context:?}): {field}"),
        message,
    };
    let unsupported = [
        (u.exec.is_some(), "exec", "credential plugins are not run"),
        (
            u.auth_provider.is_some(),
            "auth-provider",
            "auth providers are not supported",
        ),
        (
            given(&u.username).is_some() || given(&u.password).is_some(),
            "username",
            "basic authentication is not supported (the API server dropped it in 1.19)",
        ),
        (
            given(&u.impersonate).is_some(),
            "as",
            "impersonation is not supported",
        ),
        (
            given(&u.as_uid).is_some(),
            "as-uid",
            "impersonation is not supported",
        ),
        (
            u.as_groups.is_some(),
            "as-groups",
            "impersonation is not supported",
        ),
        (
            u.as_user_extra.is_some(),
            "as-user-extra",
            "impersonation is not supported",
        ),
    ];
    if let Some((_, field, why)) = unsupported.iter().find(|(set, ..)| *set) {
        return Err(invalid(field, format!("{why}; {SUPPORTED}")));
    }

    // Both forms of one field: client-go's validation refuses them.
    let either = |path: Option<&Path>, data: Option<&str>, field: &str| match (path, data) {
        (Some(_), Some(_)) => Err(invalid(
            &format!("{field}-data"),
            format!("{field} is set too: keep one of them"),
        )),
        (Some(path), None) => {
            let path = resolve(file, path);
            std::fs::read(&path)
                .map(Some)
                .map_err(|e| invalid(field, format!("cannot read {}: {e}", path.display())))
        }
        (None, Some(data)) => decode(data)
            .map(Some)
            .map_err(|e| invalid(&format!("{field}-data"), e)),
        (None, None) => Ok(None),
    };
    let has_cert =
        given_path(&u.client_certificate).is_some() || given(&u.client_certificate_data).is_some();
    let has_key = given_path(&u.client_key).is_some() || given(&u.client_key_data).is_some();
    if has_cert && !has_key {
        return Err(invalid(
            "client-key",
            "not set: a client certificate needs client-key or client-key-data".into(),
        ));
    }
    if has_key && !has_cert {
        return Err(invalid(
            "client-certificate",
            "not set: a client key needs client-certificate or client-certificate-data".into(),
        ));
    }
    let cert = either(
        given_path(&u.client_certificate),
        given(&u.client_certificate_data),
        "client-certificate",
    )?;
    let key = either(
        given_path(&u.client_key),
        given(&u.client_key_data),
        "client-key",
    )?;
    let identity = match (cert, key) {
        (Some(cert), Some(key)) => {
            let certs = certificates(&cert).map_err(|e| invalid("client-certificate", e))?;
            let key = PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
                invalid(
                    "client-key",
                    format!("not a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
                )
            })?;
            Some((certs, key))
        }
        _ => None,
    };
    // tokenFile over token: client-go starts with `token` but rereads `tokenFile` from then on.
    let token = match (given_path(&u.token_file), given(&u.token)) {
        (Some(path), _) => {
            let path = resolve(file, path);
            std::fs::metadata(&path).map_err(|e| {
                invalid("tokenFile", format!("cannot read {}: {e}", path.display()))
            })?;
            Some(Token::File(path))
        }
        (None, Some(token)) => Some(Token::Value(token.trim().to_owned())),
        (None, None) => None,
    };
    Ok((identity, token))
}

/// A `-data` field: base64 of the file's contents.
fn decode(data: &str) -> Result<Vec<u8>, String> {
    let compact: String = data.split_ascii_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|e| format!("not base64: {e}"))
}

/// Every PEM certificate in `pem`; at least one.
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate".into());
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::client::ApiClient;
    use crate::apiserver::standin::{ApiServerStandIn, Options};
    use crate::apiserver::{ApiError, SliceStore};
    use crate::testing::slice;

    const SERVER_CERT: &[u8] = include_bytes!("testdata/cert.pem");
    const SERVER_KEY: &[u8] = include_bytes!("testdata/key.pem");
    const CLIENT_CA: &[u8] = include_bytes!("testdata/client-ca.pem");
    const CLIENT_CERT: &[u8] = include_bytes!("testdata/client-cert.pem");
    const CLIENT_KEY: &[u8] = include_bytes!("testdata/client-key.pem");

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// A TLS stand-in wanting the token `secret`, and taking client certificates of the test
    /// client CA instead.
    async fn server() -> ApiServerStandIn {
        ApiServerStandIn::start_with(Options {
            tls: Some((SERVER_CERT.to_vec(), SERVER_KEY.to_vec())),
            token: Some("secret".into()),
            client_ca: Some(CLIENT_CA.to_vec()),
            ..Options::default()
        })
        .await
        .unwrap()
    }

    /// A kubeconfig with one context `ctx` of cluster `c` (`cluster`'s fields) and user `u`
    /// (`user`'s), written to `dir/config`.
    fn kubeconfig(dir: &Path, cluster: &str, user: &str) -> PathBuf {
        let path = dir.join("config");
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: c\n  cluster:\n{cluster}\nusers:\n- name: u\n  user:\n{user}\ncontexts:\n- name: ctx\n  context: {{cluster: c, user: u}}\n"
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    async fn works(client: &ApiClient) -> Result<usize, ApiError> {
        client
            .create(&slice(
                &format!("s-{}", rand_name()),
                "node-1",
                "gpu.example.com",
                1,
            ))
            .await?;
        Ok(client.list("node-1", "gpu.example.com").await?.len())
    }

    fn rand_name() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }

    #[tokio::test]
    async fn a_ca_file_and_a_token_or_a_token_file() {
        let server = server().await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), SERVER_CERT).unwrap();
        // The CA path is relative to the kubeconfig's directory, as client-go resolves it.
        let config = kubeconfig(
            dir.path(),
            &format!(
                "    server: https://127.0.0.1:{}\n    certificate-authority: ca.pem",
                server.addr().port()
            ),
            "    token: secret",
        );
        let client = ApiClient::from_kubeconfig(Some(&config)).unwrap();
        assert_eq!(works(&client).await.unwrap(), 1);

        // certificate-authority-data and tokenFile, read again for every request.
        std::fs::write(dir.path().join("token"), "secret\n").unwrap();
        let config = kubeconfig(
            dir.path(),
            &format!(
                "    server: https://127.0.0.1:{}/\n    certificate-authority-data: {}",
                server.addr().port(),
                b64(SERVER_CERT)
            ),
            "    tokenFile: token",
        );
        let client = ApiClient::from_kubeconfig(Some(&config)).unwrap();
        assert_eq!(works(&client).await.unwrap(), 2);
        server.set_token("rotated");
        let err = works(&client).await.unwrap_err();
        assert!(matches!(err, ApiError::Status { code: 401, .. }), "{err}");
        std::fs::write(dir.path().join("token"), "rotated").unwrap();
        assert_eq!(works(&client).await.unwrap(), 3);
        assert_eq!(server.by_certificate(), 0);
    }

    #[tokio::test]
    async fn a_client_certificate_authenticates_without_a_token() {
        let server = server().await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("client.key"), CLIENT_KEY).unwrap();
        let cluster = format!(
            "    server: https://127.0.0.1:{}\n    certificate-authority-data: {}",
            server.addr().port(),
            b64(SERVER_CERT)
        );
        let config = kubeconfig(
            dir.path(),
            &cluster,
            &format!(
                "    client-certificate-data: {}\n    client-key: client.key",
                b64(CLIENT_CERT)
            ),
        );
        let client = ApiClient::from_kubeconfig(Some(&config)).unwrap();
        assert_eq!(works(&client).await.unwrap(), 1);
        assert!(server.by_certificate() >= 2);
        assert_eq!(server.unauthorized(), 0);

        // The same user without its certificate has no credentials: 401.
        let config = kubeconfig(dir.path(), &cluster, "    {}");
        let client = ApiClient::from_kubeconfig(Some(&config)).unwrap();
        let err = works(&client).await.unwrap_err();
        assert!(matches!(err, ApiError::Status { code: 401, .. }), "{err}");
    }

    #[tokio::test]
    async fn insecure_skip_tls_verify_and_an_untrusted_server() {
        let server = server().await;
        let dir = tempfile::tempdir().unwrap();
        let config = kubeconfig(
            dir.path(),
            &format!(
                "    server: https://127.0.0.1:{}\n    insecure-skip-tls-verify: true",
                server.addr().port()
            ),
            "    token: secret",
        );
        let client = ApiClient::from_kubeconfig(Some(&config)).unwrap();
        assert_eq!(works(&client).await.unwrap(), 1);

        let config = kubeconfig(
            dir.path(),
            &format!(
                "    server: https://127.0.0.1:{}\n    certificate-authority-data: {}",
                server.addr().port(),
                b64(include_bytes!("testdata/other-ca.pem"))
            ),
            "    token: secret",
        );
        let client = ApiClient::from_kubeconfig(Some(&config)).unwrap();
        let err = works(&client).await.unwrap_err();
        assert!(matches!(err, ApiError::Transport(_)), "{err}");
    }

    /// The error `ApiClient::from_kubeconfig` gives for `config`, as text.
    fn refused(config: &Path) -> String {
        match ApiClient::from_kubeconfig(Some(config)) {
            Ok(_) => panic!("{} was accepted", config.display()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn what_cannot_be_used_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = format!(
            "    server: https://127.0.0.1:6443\n    certificate-authority-data: {}",
            b64(SERVER_CERT)
        );
        let config = kubeconfig(dir.path(), &cluster, "    token: t");
        let shown = config.display().to_string();

        let text = std::fs::read_to_string(&config)
            .unwrap()
            .replace("current-context: ctx", "current-context: elsewhere");
        std::fs::write(&config, text).unwrap();
        assert_eq!(
            refused(&config),
            format!(
                "kubeconfig {shown}: current-context \"elsewhere\": no such context (contexts: ctx)"
            )
        );

        let config = kubeconfig(
            dir.path(),
            &cluster,
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws",
        );
        assert_eq!(
            refused(&config),
            format!(
                "kubeconfig {shown}: user \"u\" (context \"ctx\"): exec: credential plugins are not run; supported: token, tokenFile, client-certificate(-data) with client-key(-data)"
            )
        );

        for (cluster, user, wanted) in [
            (
                "    server: https://127.0.0.1:6443\n    insecure-skip-tls-verify: true\n    certificate-authority: ca.pem",
                "    token: t",
                "cluster \"c\" (context \"ctx\"): insecure-skip-tls-verify: a certificate authority is set too",
            ),
            (
                "    server: ftp://127.0.0.1",
                "    token: t",
                "cluster \"c\" (context \"ctx\"): server: \"ftp://127.0.0.1\": not an http or https URL",
            ),
            (
                "    certificate-authority: ca.pem",
                "    token: t",
                "cluster \"c\" (context \"ctx\"): server: not set",
            ),
            (
                "    server: https://127.0.0.1:6443\n    certificate-authority: missing.pem",
                "    token: t",
                "cluster \"c\" (context \"ctx\"): certificate-authority: cannot read",
            ),
            (
                "    server: https://127.0.0.1:6443\n    proxy-url: http://proxy:3128",
                "    token: t",
                "cluster \"c\" (context \"ctx\"): proxy-url: proxies are not supported",
            ),
            (
                &cluster,
                "    client-certificate: cert.pem",
                "user \"u\" (context \"ctx\"): client-key: not set",
            ),
            (
                &cluster,
                "    client-key-data: bm90IGEga2V5",
                "user \"u\" (context \"ctx\"): client-certificate: not set",
            ),
            (
                &cluster,
                "    auth-provider: {name: oidc}",
                "user \"u\" (context \"ctx\"): auth-provider: auth providers are not supported",
            ),
            (
                &cluster,
                "    username: admin\n    password: hunter2",
                "user \"u\" (context \"ctx\"): username: basic authentication is not supported",
            ),
        ] {
            let config = kubeconfig(dir.path(), cluster, user);
            let err = refused(&config);
            assert!(
                err.starts_with(&format!("kubeconfig {shown}: {wanted}")),
                "{err}\nwanted: {wanted}"
            );
        }

        let config = dir.path().join("config");
        std::fs::write(
            &config,
            "current-context: ctx\ncontexts:\n- name: ctx\n  context: {cluster: gone, user: u}\n",
        )
        .unwrap();
        assert_eq!(
            refused(&config),
            format!(
                "kubeconfig {shown}: context \"ctx\": cluster: \"gone\": no such cluster (clusters: none)"
            )
        );
        std::fs::write(&config, "contexts: []\n").unwrap();
        assert!(refused(&config).contains(
            "current-context: not set: choose a context with `kubectl config use-context NAME`"
        ));
        std::fs::write(&config, "clusters: 3\n").unwrap();
        assert!(refused(&config).starts_with(&format!("kubeconfig {shown}: not a kubeconfig: ")));
        let missing = dir.path().join("missing");
        assert!(refused(&missing).starts_with(&format!("kubeconfig {}: ", missing.display())));
    }

    /// `$KUBECONFIG`'s files merge as client-go merges them: missing ones skipped, the first
    /// file that sets a name or the current context wins.
    #[test]
    fn files_merge_first_setter_wins() {
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("first");
        let second = dir.path().join("second");
        std::fs::write(
            &first,
            "current-context: ctx\nclusters:\n- name: c\n  cluster: {server: 'https://10.0.0.1:6443', insecure-skip-tls-verify: true}\n",
        )
        .unwrap();
        std::fs::write(
            &second,
            "current-context: other\nclusters:\n- name: c\n  cluster: {server: 'https://10.9.9.9'}\ncontexts:\n- name: ctx\n  context: {cluster: c}\n",
        )
        .unwrap();
        let target = load_files(
            &[dir.path().join("absent"), first.clone(), second.clone()],
            true,
        )
        .unwrap();
        assert_eq!((target.host.as_str(), target.port), ("10.0.0.1", 6443));
        assert!(matches!(target.trust, Trust::Anyone));
        assert!(target.token.is_none() && target.identity.is_none());
        assert_eq!(target.path, second);

        let err = load_files(&[dir.path().join("absent")], true)
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("no kubeconfig: none of the files"), "{err}");
    }

    /// A server behind a path (a proxy serving several clusters): every request goes below it.
    #[tokio::test]
    async fn requests_go_below_the_servers_path() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let config = kubeconfig(
            dir.path(),
            &format!(
                "    server: http://{}/k8s/clusters/c-1/",
                listener.local_addr().unwrap()
            ),
            "    token: secret",
        );
        let client = ApiClient::from_kubeconfig(Some(&config)).unwrap();
        let call = tokio::spawn(async move { client.list("node-1", "gpu.example.com").await });
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8];
            if conn.read(&mut byte).await.unwrap() == 0 {
                break;
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).unwrap();
        assert!(
            head.starts_with(
                "GET /k8s/clusters/c-1/apis/resource.k8s.io/v1/resourceslices?fieldSelector="
            ),
            "{head}"
        );
        assert!(
            head.contains("\r\nauthorization: Bearer secret\r\n"),
            "{head}"
        );
        drop(conn);
        assert!(call.await.unwrap().is_err());
    }

    #[test]
    fn servers_with_a_path_ipv6_and_default_ports() {
        let dir = tempfile::tempdir().unwrap();
        for (server, host, port, prefix) in [
            ("https://[::1]:6443", "::1", 6443, ""),
            (
                "https://k8s.example.com/k8s/clusters/c-1/",
                "k8s.example.com",
                443,
                "/k8s/clusters/c-1",
            ),
            ("http://127.0.0.1", "127.0.0.1", 80, ""),
        ] {
            let config = kubeconfig(
                dir.path(),
                &format!("    server: '{server}'\n    insecure-skip-tls-verify: true"),
                "    {}",
            );
            let target = load(Some(&config)).unwrap_or_else(|e| panic!("{server}: {e}"));
            assert_eq!(
                (target.host.as_str(), target.port, target.prefix.as_str()),
                (host, port, prefix),
                "{server}"
            );
        }
    }
}
