//! `wdp run`: serve every configured scanner's devices to kubelet.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::config::{self, ComponentSource};
use crate::hooks::Hooks;
use crate::kubelet::dir::PluginDir;
use crate::kubelet::{DEFAULT_PLUGIN_DIR, KUBELET_SOCKET_NAME};
use crate::manager::{Claims, Manager};
use crate::oci;
use crate::policy::{self, Policy};
use crate::sandbox::compile_cache::CompileCache;
use crate::sandbox::{GuestSpec, Roots, Sandbox};
use crate::scanner::{RestartPolicy, Scanner, supervise};
use crate::server::Kubelet;

/// Run the configured scanners and serve their devices to kubelet.
///
/// Each dev-type a scanner reports becomes the resource <namespace>/<dev-type>, served on
/// <plugin-dir>/<namespace>-<dev-type>.sock and registered with kubelet; re-registered whenever
/// kubelet restarts. A failing scanner is restarted with backoff while its last good devices stay
/// served. SIGTERM or SIGINT stops everything and removes the sockets.
///
/// The config file is checked completely (and every component compiled) before anything starts.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The YAML config listing the scanners (see the README for every key).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,

    /// kubelet's device-plugin directory, where plugin sockets are created.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PLUGIN_DIR)]
    plugin_dir: PathBuf,

    /// kubelet's registration socket [default: <plugin-dir>/kubelet.sock].
    #[arg(long, value_name = "PATH")]
    kubelet_socket: Option<PathBuf>,

    /// Host directory guests see as /sys (read-only).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    sys_root: PathBuf,

    /// Host directory guests see as /dev (metadata only).
    #[arg(long, value_name = "DIR", default_value = "/dev")]
    dev_root: PathBuf,

    /// Where compiled components are kept between runs (created 0700; must be the host's alone).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/wdp/compiled")]
    compile_cache: PathBuf,
}

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let config = config::load(&args.config)?;
    // Install signal handlers before starting anything, so a signal is never lost.
    let mut sigterm = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;

    let sandbox = Sandbox::with_compile_cache(
        Roots {
            sys: args.sys_root,
            dev: args.dev_root,
        },
        Some(CompileCache::new(args.compile_cache)),
    )?;
    let registry = oci::Registry::new(oci::RegistryOptions {
        insecure: config.oci.insecure_registries.clone(),
        username: std::env::var("WDP_REGISTRY_USERNAME").ok(),
        password: std::env::var("WDP_REGISTRY_PASSWORD").ok(),
    });
    let cache = oci::Cache::new(&config.oci.cache_dir);
    let plugin_dir_len = args.plugin_dir.as_os_str().len();
    let mut ready = Vec::with_capacity(config.scanners.len());
    for s in &config.scanners {
        let max_dev_type_len = policy::dev_type_budget(plugin_dir_len, &s.namespace);
        if max_dev_type_len == 0 {
            anyhow::bail!(
                "scanner {}: namespace {:?} leaves no room for a dev-type in a socket path under {} ({} bytes at most)",
                s.name,
                s.namespace,
                args.plugin_dir.display(),
                crate::server::MAX_SOCKET_PATH
            );
        }
        let spec = GuestSpec {
            limits: s.limits,
            policy: Arc::new(Policy {
                max_dev_type_len,
                ..s.policy.clone()
            }),
            ..GuestSpec::new(&s.name, s.env.clone())
        };
        let fetch = oci::FetchPolicy {
            require_digest: config.oci.require_digest,
            key: s.verify_key.clone(),
        };
        let path = resolve(&registry, &cache, &s.component, oci::Role::Scanner, &fetch)
            .await
            .with_context(|| format!("scanner {}", s.name))?;
        let component = sandbox
            .load(&path)
            .await
            .with_context(|| format!("scanner {}", s.name))?;
        let pre = component
            .scanner()
            .with_context(|| format!("scanner {}", s.name))?;
        let hooks = match &s.post_allocator {
            None => None,
            Some(source) => {
                let path = resolve(&registry, &cache, source, oci::Role::Hooks, &fetch)
                    .await
                    .with_context(|| format!("scanner {}: post-allocator", s.name))?;
                let hook = sandbox
                    .load(&path)
                    .await
                    .with_context(|| format!("scanner {}: post-allocator", s.name))?;
                let hooks = Hooks::new(sandbox.clone(), spec.clone(), &hook)
                    .with_context(|| format!("scanner {}: post-allocator", s.name))?;
                Some(Arc::new(hooks))
            }
        };
        ready.push((
            Scanner { spec, pre },
            s.namespace.clone(),
            hooks,
            s.cdi.clone(),
        ));
    }

    let kubelet_socket = args
        .kubelet_socket
        .unwrap_or_else(|| args.plugin_dir.join(KUBELET_SOCKET_NAME));
    let dir = PluginDir::watch(&args.plugin_dir).with_context(|| {
        format!(
            "cannot watch the plugin directory {}",
            args.plugin_dir.display()
        )
    })?;
    let kubelet = Arc::new(Kubelet {
        dir,
        socket: kubelet_socket,
    });
    let claims = Arc::new(Claims::default());

    let mut supervisors = Vec::new();
    let mut managers = Vec::new();
    for (scanner, namespace, hooks, cdi) in ready {
        let (tx, rx) = mpsc::channel(16);
        let mut manager = Manager::new(
            scanner.spec.name.clone(),
            namespace,
            kubelet.clone(),
            hooks,
            claims.clone(),
        );
        if let Some(cdi) = cdi {
            manager = manager.with_cdi(cdi);
        }
        managers.push(tokio::spawn(manager.run(rx)));
        supervisors.push(tokio::spawn(supervise(
            sandbox.clone(),
            scanner,
            RestartPolicy::Backoff,
            tx,
        )));
    }
    tracing::info!(scanners = managers.len(), plugin_dir = %args.plugin_dir.display(), "running");

    tokio::select! {
        _ = sigterm.recv() => tracing::info!("SIGTERM: stopping"),
        _ = sigint.recv() => tracing::info!("SIGINT: stopping"),
    }
    // Stopping a supervisor drops its guest and closes its channel; the manager then stops its
    // servers, each removing its socket.
    for supervisor in &supervisors {
        supervisor.abort();
    }
    for manager in managers {
        let _ = manager.await;
    }
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// A local file for `source`: as is, or pulled, checked and cached.
async fn resolve(
    registry: &oci::Registry,
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
            Ok(oci::fetch(registry, cache, reference, role, fetch).await?)
        }
    }
}
