//! From a checked config to scanners ready to start, touching nothing that runs.
//!
//! Preparing a config does everything that can fail: the socket-path budget of each namespace,
//! the digest of each local component, and for each scanner that is new or changed, fetching,
//! compiling and linking its component and its post-allocator. Scanners whose identity has not
//! changed are not loaded again: they keep running as they are. Only when all of it succeeded
//! does the caller stop and start anything, so a bad config leaves the running set untouched.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use sha2::{Digest, Sha256};

use crate::config::{ComponentSource, Config, ConfigDiff, ScannerConfig, ScannerIdentity};
use crate::fleet::{Fleet, Prepared};
use crate::hooks::Hooks;
use crate::policy::{self, Policy};
use crate::sandbox::{Guest, Sandbox};
use crate::scanner::Scanner;
use wdp_oci as oci;

/// What applying a config will do: the diff, and the scanners to start (added and changed).
pub struct Plan {
    pub diff: ConfigDiff,
    pub start: Vec<Prepared>,
}

/// Prepares `config` against the scanners `fleet` runs. `config_path` is for messages.
pub async fn prepare(
    sandbox: &Arc<Sandbox>,
    plugin_dir: &Path,
    config_path: &Path,
    config: &Config,
    fleet: &Fleet,
) -> anyhow::Result<Plan> {
    let mut identities = Vec::with_capacity(config.scanners.len());
    for (i, s) in config.scanners.iter().enumerate() {
        let at = || {
            format!(
                "config {}: scanners[{i}]: scanner {}",
                config_path.display(),
                s.name
            )
        };
        max_dev_type_len(plugin_dir, s).with_context(at)?;
        let component = digest(&s.component).await.with_context(at)?;
        let post_allocator = match &s.post_allocator {
            Some(source) => digest(source)
                .await
                .with_context(|| format!("{}: post-allocator", at()))?,
            None => None,
        };
        identities.push(ScannerIdentity::new(
            s.clone(),
            &config.oci,
            component,
            post_allocator,
        ));
    }
    let diff = ConfigDiff::new(fleet.identities(), &identities);

    // Fetching is set up from the new file: its `oci:` settings apply to what it fetches.
    let registry = LazyRegistry {
        options: oci::RegistryOptions {
            insecure: config.oci.insecure_registries.clone(),
            username: std::env::var("WDP_REGISTRY_USERNAME").ok(),
            password: std::env::var("WDP_REGISTRY_PASSWORD").ok(),
        },
        client: OnceLock::new(),
    };
    let cache = oci::Cache::new(&config.oci.cache_dir);
    let mut start = Vec::new();
    for (i, identity) in identities.into_iter().enumerate() {
        if !diff.starts(&identity.config.name) {
            continue;
        }
        let at = format!(
            "config {}: scanners[{i}]: scanner {}",
            config_path.display(),
            identity.config.name
        );
        let prepared = load(sandbox, plugin_dir, &registry, &cache, config, identity)
            .await
            .context(at)?;
        start.push(prepared);
    }
    Ok(Plan { diff, start })
}

/// The registry client, made on first use: making one loads and parses the system's root
/// certificates, which a host serving only local components never needs (it showed in the
/// start-up profile, and its memory stayed).
struct LazyRegistry {
    options: oci::RegistryOptions,
    client: OnceLock<oci::Registry>,
}

impl LazyRegistry {
    fn get(&self) -> &oci::Registry {
        self.client
            .get_or_init(|| oci::Registry::new(self.options.clone()))
    }
}

/// The longest dev-type whose socket path still fits under `plugin_dir`; an error when none does.
fn max_dev_type_len(plugin_dir: &Path, s: &ScannerConfig) -> anyhow::Result<usize> {
    let len = policy::dev_type_budget(plugin_dir.as_os_str().len(), &s.namespace);
    if len == 0 {
        anyhow::bail!(
            "namespace {:?} leaves no room for a dev-type in a socket path under {} ({} bytes at most)",
            s.namespace,
            plugin_dir.display(),
            wdp_kubelet::names::MAX_SOCKET_PATH
        );
    }
    Ok(len)
}

/// sha256 (hex) of a local component file; None for an `oci://` component.
async fn digest(source: &ComponentSource) -> anyhow::Result<Option<String>> {
    let ComponentSource::File(path) = source else {
        return Ok(None);
    };
    let bytes = tokio::fs::read(path)
        .await
        .with_context(|| format!("cannot read component {}", path.display()))?;
    let hash = tokio::task::spawn_blocking(move || Sha256::digest(&bytes))
        .await
        .context("hashing task failed")?;
    Ok(Some(hash.iter().map(|b| format!("{b:02x}")).collect()))
}

/// Fetches, compiles and links one scanner and its post-allocator.
///
/// The file is read again to compile it: if it was replaced since it was hashed, the scanner
/// runs the newer bytes under the older digest, and the next reload restarts it once more.
async fn load(
    sandbox: &Arc<Sandbox>,
    plugin_dir: &Path,
    registry: &LazyRegistry,
    cache: &oci::Cache,
    config: &Config,
    identity: ScannerIdentity,
) -> anyhow::Result<Prepared> {
    let s = &identity.config;
    let spec = Guest {
        limits: s.limits,
        ..Guest::new(&s.name, s.env.clone())
    };
    let policy = Arc::new(Policy {
        max_dev_type_len: max_dev_type_len(plugin_dir, s)?,
        ..s.policy.clone()
    });
    let fetch = oci::FetchPolicy {
        require_digest: config.oci.require_digest,
        key: s.verify_key.clone(),
    };
    let path = resolve(registry, cache, &s.component, oci::Role::Scanner, &fetch).await?;
    let pre = sandbox.load(&path).await?.scanner()?;
    let hooks = match &s.post_allocator {
        None => None,
        Some(source) => {
            let hooks = async {
                let path = resolve(registry, cache, source, oci::Role::Hooks, &fetch).await?;
                let hook = sandbox.load_hooks(&path).await?;
                anyhow::Ok(Hooks::new(
                    sandbox.clone(),
                    spec.clone(),
                    policy.clone(),
                    &hook,
                )?)
            };
            Some(Arc::new(hooks.await.context("post-allocator")?))
        }
    };
    Ok(Prepared {
        scanner: Scanner {
            guest: spec,
            policy,
            pre,
        },
        hooks,
        identity,
    })
}

/// A local file for `source`: as is, or pulled, checked and cached.
async fn resolve(
    registry: &LazyRegistry,
    cache: &oci::Cache,
    source: &ComponentSource,
    role: oci::Role,
    fetch: &oci::FetchPolicy,
) -> anyhow::Result<PathBuf> {
    match source {
        ComponentSource::File(path) => {
            if fetch.key.is_some() {
                anyhow::bail!(
                    "{}: verify-key applies to oci:// components; a local file carries no signature",
                    path.display()
                );
            }
            Ok(path.clone())
        }
        ComponentSource::Oci(reference) => {
            Ok(oci::fetch(registry.get(), cache, reference, role, fetch).await?)
        }
    }
}
