//! Scanners as OCI artifacts: push, pull, pin, verify, cache.
//!
//! The artifact is the CNCF TAG-Runtime Wasm layout ([`artifact`]: config
//! `application/vnd.wasm.config.v0+json` listing the component's imports and exports, one
//! `application/wasm` layer), so other tools of that ecosystem can use what wdp pushes.
//!
//! A pull is trusted only after: the manifest has exactly that layout, the layer's sha256 matches
//! the manifest (and the reference's digest, when pinned), the component's world is one the host
//! offers (checked from the artifact config, before anything is compiled), and, when a key is
//! configured, a cosign signature over the manifest digest verifies ([`sign`]). Pulled components
//! go to a content-addressed [`cache`], so a node restarts and serves with the registry down.

#![warn(missing_docs)]

pub mod artifact;
pub mod cache;
pub mod contract;
pub mod sign;

use std::path::{Path, PathBuf};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};

use artifact::{ComponentWorld, WasmConfig};

pub use cache::Cache;

/// The scheme of component references in the config.
pub const SCHEME: &str = "oci://";

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Registries (`host:port`) spoken to over plain HTTP; everything else is HTTPS.
    pub insecure: Vec<String>,
    /// Explicit credentials; otherwise the docker config file, otherwise anonymous.
    pub username: Option<String>,
    /// The password of `username`.
    pub password: Option<String>,
}

/// What can go wrong with an artifact. Messages name the reference.
///
/// Every variant carries the reference as the user wrote it (`reference`), so a message found in
/// a log says which config entry or command it belongs to.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The text is not a reference at all.
    #[error(
        "{reference:?} is not a valid OCI reference (registry/repository[:tag][@sha256:digest]): {error}"
    )]
    Reference {
        /// The reference as written.
        reference: String,
        /// What the parser refused.
        error: oci_client::ParseError,
    },
    /// The registry could not be reached, or answered with an error other than "unauthorized".
    #[error("{reference}: the registry could not be reached or refused: {message}")]
    Registry {
        /// The reference as written.
        reference: String,
        /// The client's error.
        message: String,
    },
    /// The registry wants credentials: said apart so the message can say where to give them.
    #[error(
        "{reference}: the registry wants credentials it did not get or did not accept (give --username/--password, WDP_REGISTRY_USERNAME/WDP_REGISTRY_PASSWORD, or log in so the docker config file has them): {message}"
    )]
    Unauthorized {
        /// The reference as written.
        reference: String,
        /// The registry's answer.
        message: String,
    },
    /// The manifest is not the Wasm artifact layout (a container image, say).
    #[error("{reference}: not a wasm component artifact: {error}")]
    Layout {
        /// The reference as written.
        reference: String,
        /// Which part of the layout is wrong.
        error: artifact::LayoutError,
    },
    /// A pinned digest does not match what the registry served.
    #[error("{reference}: digest mismatch: expected {expected}, got {actual}")]
    Digest {
        /// The reference as written.
        reference: String,
        /// The digest the reference pins.
        expected: String,
        /// The digest of what was served.
        actual: String,
    },
    /// A blob's content does not hash to the digest its manifest gives.
    #[error(
        "{reference}: a blob does not match its digest (corrupted or tampered with in the registry): {detail}"
    )]
    Tampered {
        /// The reference as written.
        reference: String,
        /// Which blob, and the two digests.
        detail: String,
    },
    /// The artifact's config lists imports or exports the host does not offer for this role.
    #[error("{reference}: the component's world is not one this host runs: {message}")]
    World {
        /// The reference as written.
        reference: String,
        /// What is missing or foreign.
        message: String,
    },
    /// A key is configured and no signature over the manifest digest verifies with it.
    #[error("{reference}: signature check failed: {message}")]
    Signature {
        /// The reference as written.
        reference: String,
        /// Why: no signature, a malformed one, or one made with another key.
        message: String,
    },
    /// The config requires pinned references and this one is a tag.
    #[error(
        "{reference}: a digest is required (the config sets oci.require-digest): pin it as @sha256:..."
    )]
    DigestRequired {
        /// The reference as written.
        reference: String,
    },
    /// The local cache could not be read or written.
    #[error("cache {path}: {error}")]
    Cache {
        /// The file of the cache.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// A local file (a component to push, a key) could not be read or is malformed.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
}

/// Parses `registry/repo[:tag][@sha256:...]`, with or without the `oci://` scheme.
pub fn parse_reference(s: &str) -> Result<Reference, OciError> {
    let bare = s.strip_prefix(SCHEME).unwrap_or(s);
    bare.parse::<Reference>()
        .map_err(|error| OciError::Reference {
            reference: s.to_string(),
            error,
        })
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A registry client with wdp's settings.
pub struct Registry {
    client: Client,
    options: RegistryOptions,
}

/// A component fetched from a registry, checked.
#[derive(Debug)]
pub struct Pulled {
    /// The manifest digest the reference resolved to.
    pub manifest_digest: String,
    /// The component layer's digest.
    pub layer_digest: String,
    /// The component, its digest checked.
    pub bytes: Vec<u8>,
    /// The artifact's config, its layout checked.
    pub config: WasmConfig,
}

impl Registry {
    /// A client speaking plain HTTP only to `options.insecure`.
    pub fn new(options: RegistryOptions) -> Self {
        // The process-wide TLS provider reqwest builds its clients with (the workspace's
        // Cargo.toml says why ring). Err only means one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(options.insecure.clone()),
            ..Default::default()
        });
        Registry { client, options }
    }

    /// The raw client, for signatures.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Credentials for `reference`'s registry: flags, then the docker config, then anonymous.
    pub fn auth(&self, reference: &Reference) -> RegistryAuth {
        if let (Some(u), Some(p)) = (&self.options.username, &self.options.password) {
            return RegistryAuth::Basic(u.clone(), p.clone());
        }
        match docker_credential::get_credential(reference.resolve_registry()) {
            Ok(docker_credential::DockerCredential::UsernamePassword(u, p)) => {
                RegistryAuth::Basic(u, p)
            }
            _ => RegistryAuth::Anonymous,
        }
    }

    /// Pushes a component file; returns the manifest digest.
    pub async fn push(&self, file: &Path, reference: &str) -> Result<String, OciError> {
        let r = parse_reference(reference)?;
        let bytes = tokio::fs::read(file).await.map_err(|e| OciError::File {
            path: file.to_path_buf(),
            message: e.to_string(),
        })?;
        let package = artifact::Package::of(bytes).map_err(|e| OciError::File {
            path: file.to_path_buf(),
            message: format!("not a wasm component: {e}"),
        })?;
        let response = self
            .client
            .push(
                &r,
                &package.layers,
                package.config,
                &self.auth(&r),
                Some(package.manifest),
            )
            .await
            .map_err(|e| classify(reference, e))?;
        // The manifest URL ends in the digest the registry stored it under.
        Ok(response
            .manifest_url
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string())
    }

    /// Pulls and checks a component: layout, layer digest, and the reference's pinned digest.
    pub async fn pull(&self, reference: &str) -> Result<Pulled, OciError> {
        let r = parse_reference(reference)?;
        let auth = self.auth(&r);
        let (manifest, manifest_digest, config) = self
            .client
            .pull_manifest_and_config(&r, &auth)
            .await
            .map_err(|e| classify(reference, e))?;
        let (layer, config) =
            artifact::check(&manifest, &config).map_err(|error| OciError::Layout {
                reference: reference.into(),
                error,
            })?;
        if let Some(pinned) = r.digest()
            && pinned != manifest_digest
        {
            return Err(OciError::Digest {
                reference: reference.into(),
                expected: pinned.into(),
                actual: manifest_digest,
            });
        }
        let mut bytes = Vec::new();
        self.client
            .pull_blob(&r, layer, &mut bytes)
            .await
            .map_err(|e| classify(reference, e))?;
        let actual = sha256_digest(&bytes);
        if actual != layer.digest {
            return Err(OciError::Digest {
                reference: reference.into(),
                expected: layer.digest.clone(),
                actual,
            });
        }
        Ok(Pulled {
            manifest_digest,
            layer_digest: actual,
            bytes,
            config,
        })
    }
}

/// Sorts a registry client's error: missing credentials, a digest mismatch (oci-client reports
/// those as errors of its own), or "down". Only the top-level message is kept: the error chain
/// repeats it.
fn classify(reference: &str, e: impl std::fmt::Display) -> OciError {
    let message = e.to_string();
    if message.contains("UNAUTHORIZED") || message.contains("code: 401") {
        OciError::Unauthorized {
            reference: reference.into(),
            message,
        }
    } else if message.contains("Digest error") || message.contains("Invalid digest") {
        OciError::Tampered {
            reference: reference.into(),
            detail: message,
        }
    } else {
        OciError::Registry {
            reference: reference.into(),
            message,
        }
    }
}

/// What a component must look like to run in this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A component a scanner entry's `component` names: it exports the scanner interface.
    Scanner,
    /// A component a hook entry names: it exports one or more of the hook interfaces.
    Hooks,
}

/// The interface a scanner exports.
const SCANNER_EXPORT: &str = "scanner";
/// The interfaces of which a hook component exports at least one.
const HOOK_EXPORTS: [&str; 3] = ["post-allocator", "preferred-allocator", "pre-starter"];

/// Whether `name` is the contract's `interface` at a version this host speaks (the contract check
/// has refused every other version by then).
fn is_export(name: &str, interface: &str) -> bool {
    name.strip_prefix(contract::PACKAGE)
        .and_then(|n| n.strip_prefix('/'))
        .and_then(|n| n.strip_prefix(interface))
        .is_some_and(|n| n.starts_with('@'))
}

/// Checks an artifact's declared world before anything is compiled: a contract version this
/// host speaks, the exports its role needs, and imports only from WASI and this package.
pub fn check_world(
    reference: &str,
    component: Option<&ComponentWorld>,
    role: Role,
) -> Result<(), OciError> {
    let fail = |message: String| OciError::World {
        reference: reference.into(),
        message,
    };
    let component =
        component.ok_or_else(|| fail("the artifact config describes no component".into()))?;
    let names = component.imports.iter().chain(&component.exports);
    contract::check(names.map(String::as_str)).map_err(|e| fail(e.to_string()))?;
    let exports = &component.exports;
    let ok = match role {
        Role::Scanner => exports.iter().any(|e| is_export(e, SCANNER_EXPORT)),
        Role::Hooks => exports
            .iter()
            .any(|e| HOOK_EXPORTS.iter().any(|h| is_export(e, h))),
    };
    if !ok {
        let at = |i: &str| format!("{}/{i}@{}", contract::PACKAGE, contract::VERSION);
        let wanted = match role {
            Role::Scanner => at(SCANNER_EXPORT),
            Role::Hooks => HOOK_EXPORTS.map(at).join(" or "),
        };
        return Err(fail(format!("it exports {exports:?}, not {wanted}")));
    }
    if let Some(bad) = component
        .imports
        .iter()
        .find(|i| !i.starts_with("wasi:") && !i.starts_with("wdp:device-plugin/"))
    {
        return Err(fail(format!(
            "it imports {bad}, which this host does not provide"
        )));
    }
    Ok(())
}

/// How `wdp run` obtains `oci://` components.
#[derive(Debug, Clone)]
pub struct FetchPolicy {
    /// Refuse references without a digest (`oci.require-digest`).
    pub require_digest: bool,
    /// When set, a signature by this key is required.
    pub key: Option<sign::PublicKey>,
}

/// Resolves `reference` to a checked local component file for `role`.
///
/// A tag is resolved to a digest once (and logged). When the registry cannot be reached, the
/// cache serves what the reference last resolved to, if it was verified under the same key; a
/// digest, layout, world or signature failure is never papered over by the cache.
pub async fn fetch(
    registry: &Registry,
    cache: &Cache,
    reference: &str,
    role: Role,
    policy: &FetchPolicy,
) -> Result<PathBuf, OciError> {
    let parsed = parse_reference(reference)?;
    if policy.require_digest && parsed.digest().is_none() {
        return Err(OciError::DigestRequired {
            reference: reference.into(),
        });
    }
    let key_fingerprint = policy.key.as_ref().map(|k| k.fingerprint.clone());
    match registry.pull(reference).await {
        Ok(pulled) => {
            check_world(reference, pulled.config.component.as_ref(), role)?;
            if let Some(key) = &policy.key {
                sign::verify(registry, reference, &pulled.manifest_digest, key).await?;
            }
            tracing::info!(
                reference,
                digest = %pulled.manifest_digest,
                layer = %pulled.layer_digest,
                signed = policy.key.is_some(),
                "pulled component"
            );
            cache.store(reference, &pulled, key_fingerprint)
        }
        Err(OciError::Registry { message, .. }) => {
            let cached = cache
                .lookup(reference)
                .filter(|c| key_fingerprint.is_none() || c.entry.verified_key == key_fingerprint)
                .ok_or_else(|| OciError::Registry {
                    reference: reference.into(),
                    message: format!("{message} (and nothing usable is cached)"),
                })?;
            check_world(reference, cached.config.component.as_ref(), role)?;
            tracing::warn!(
                reference,
                digest = %cached.entry.manifest_digest,
                error = %message,
                "registry unreachable; using the cached component"
            );
            Ok(cached.path)
        }
        Err(e) => Err(e),
    }
}
