//! `wdp run`: serve every configured scanner's devices to kubelet.

mod prepare;
mod resident;
mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use tokio::signal::unix::{Signal, SignalKind, signal};

use self::prepare::Plan;
use self::watch::ConfigWatch;
use crate::config::{self, Config, ConfigError};
use crate::fleet::Fleet;
use crate::manager::Claims;
use crate::sandbox::compile_cache::CompileCache;
use crate::sandbox::{HookPool, Roots, Sandbox, SandboxOptions};
use crate::status::Observability;
use wdp_kubelet::dir::PluginDir;
use wdp_kubelet::server::PluginSockets;
use wdp_kubelet::{DEFAULT_PLUGIN_DIR, KUBELET_SOCKET_NAME};

/// Run the configured scanners and serve their devices to kubelet.
///
/// Each dev-type a scanner reports becomes the resource <namespace>/<dev-type>, served on
/// <plugin-dir>/<namespace>-<dev-type>.sock and registered with kubelet; re-registered whenever
/// kubelet restarts. A scanner configured with `frontend: dra` is served instead through kubelet's
/// DRA API (<plugins>/<driver>/dra.sock, registered through <plugins_registry>/<driver>-reg.sock)
/// and ResourceSlices; the config's `node:` section says where. A failing scanner is restarted
/// with backoff while its last good devices stay served. SIGTERM or SIGINT stops everything and
/// removes the sockets.
///
/// The config file is checked completely (and every component compiled) before anything starts.
/// It is reloaded when it changes (its directory is watched: editors' renames and ConfigMap
/// symlink swaps are seen) and on SIGHUP (which also picks up component files rebuilt in place).
/// A reload restarts only the scanners that were added, removed or changed; a config that fails
/// any check is refused with an error and the running scanners are kept as they are.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The YAML config listing the scanners (every key: docs/src/reference/config.md).
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

    /// Compiled components to load before the compile cache, never written: what `wdp
    /// precompile` wrote into the image. An absent directory, or one compiled by another wdp or
    /// for other CPU features, only means compiling as without it.
    #[arg(long, value_name = "DIR", default_value = "/usr/lib/wdp/compiled")]
    precompiled: PathBuf,

    /// Serve /metrics (Prometheus, OpenMetrics text), /healthz, /readyz and /status (JSON) over
    /// HTTP on this address, e.g. 0.0.0.0:9464 [default: not served].
    #[arg(long, value_name = "ADDR", env = "WDP_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
}

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    // Watch before the first read: a change made while starting is then seen, not lost. An
    // unreadable config is reported as such, before a failed watch of its directory.
    let watch = ConfigWatch::start(&args.config);
    let (mut seen, config) = read_config(&args.config)?;
    let mut watch = watch.with_context(|| {
        format!(
            "cannot watch the directory of the config file {}",
            args.config.display()
        )
    })?;
    // Install signal handlers before starting anything, so a signal is never lost.
    let mut signals = Signals::install()?;
    // Listening before the components load: liveness answers during a slow first compile, and
    // readiness says what is still missing.
    let obs = Observability::new();
    let http = match args.metrics_addr {
        Some(addr) => {
            let server = crate::http::HttpServer::start(addr, obs.clone()).await?;
            tracing::info!(addr = %server.addr(), "serving /metrics, /healthz, /readyz and /status");
            Some(server)
        }
        None => None,
    };

    let roots = Roots {
        sys: args.sys_root,
        dev: args.dev_root,
    };
    obs.writable_mounts(&crate::mounts::check(&roots));
    let cache = CompileCache::new(args.compile_cache)
        .with_precompiled(args.precompiled)
        .report_to(obs.disk(crate::metrics::DiskFile::CompileCache));
    // Hook instances come from a pool sized by the hooks of the first config (a reload's new
    // hooks share it: a call that finds it full waits for a slot within its deadline).
    let hooked = config
        .scanners
        .iter()
        .filter(|s| s.post_allocator.is_some())
        .count();
    let sandbox = Sandbox::with_options(
        roots,
        SandboxOptions {
            compile_cache: Some(cache),
            hook_pool: HookPool::for_hooked_scanners(hooked),
            ..SandboxOptions::default()
        },
    )?;
    // Lives as long as the runtime: what each round of safety rescans maps again goes back.
    tokio::spawn(resident::after_rescans(sandbox.rescans()));
    let kubelet_socket = args
        .kubelet_socket
        .unwrap_or_else(|| args.plugin_dir.join(KUBELET_SOCKET_NAME));
    let dir = PluginDir::watch(&args.plugin_dir).with_context(|| {
        format!(
            "cannot watch the plugin directory {}",
            args.plugin_dir.display()
        )
    })?;
    let kubelet = Arc::new(PluginSockets {
        dir,
        socket: kubelet_socket,
    });
    let mut fleet = Fleet::new(
        sandbox.clone(),
        kubelet,
        Arc::new(Claims::default()),
        obs.clone(),
    );
    let host = Host {
        sandbox,
        plugin_dir: args.plugin_dir,
        config: args.config,
    };

    // The first config is all or nothing: every component is compiled before anything starts.
    let plan = tokio::select! {
        plan = host.prepare(&config, &fleet) => plan?,
        signal = signals.stop.recv() => {
            tracing::info!("{signal} while starting: stopping");
            return Ok(ExitCode::SUCCESS);
        }
    };
    apply(&mut fleet, plan, "config loaded").await;
    obs.loaded();
    tracing::info!(scanners = fleet.len(), plugin_dir = %host.plugin_dir.display(), config = %host.config.display(), watching = %watch.dir().display(), "running");

    loop {
        let trigger = tokio::select! {
            signal = signals.stop.recv() => {
                tracing::info!("{signal}: stopping");
                break;
            }
            _ = signals.hangup.recv() => Trigger::Hangup,
            () = watch.changed() => Trigger::FileChanged,
        };
        // Preparing touches nothing, so it may be abandoned for a stop signal; applying is not
        // interrupted (it is quick), so the fleet is never left half-changed.
        let outcome = tokio::select! {
            outcome = host.prepare_reload(&fleet, &mut seen, trigger) => outcome,
            signal = signals.stop.recv() => {
                tracing::info!("{signal} during a reload: stopping");
                break;
            }
        };
        match outcome {
            Reload::Skipped => {}
            Reload::Ready(plan) => {
                apply(&mut fleet, plan, "config reloaded").await;
                obs.reload_succeeded();
            }
            Reload::Refused => obs.reload_failed(),
        }
    }
    fleet.stop_all().await;
    if let Some(http) = http {
        http.stop().await;
    }
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Why a reload was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// SIGHUP: always reload, and re-read every component file.
    Hangup,
    /// The config's directory changed: reload when the file's text did.
    FileChanged,
}

/// What preparing a reload came to.
enum Reload {
    /// The file's text was the same as last time: nothing to do.
    Skipped,
    /// The new config is good: apply this.
    Ready(Plan),
    /// The new config was refused (and logged); the running scanners are untouched.
    Refused,
}

/// What stays fixed for the life of the process: the CLI flags a reload cannot change.
struct Host {
    sandbox: Arc<Sandbox>,
    plugin_dir: PathBuf,
    config: PathBuf,
}

impl Host {
    /// Loads (compiling where the cache has nothing) what `config` needs, touching nothing.
    /// Shortly after, what loading made resident and serving does not use is handed back
    /// ([`resident`]), whether the config is applied or refused.
    async fn prepare(&self, config: &Config, fleet: &Fleet) -> anyhow::Result<Plan> {
        let plan =
            prepare::prepare(&self.sandbox, &self.plugin_dir, &self.config, config, fleet).await;
        tokio::spawn(async {
            tokio::time::sleep(resident::AFTER).await;
            let released = resident::release();
            tracing::debug!(
                mappings = released.mappings,
                kib = released.kib,
                "handed back what loading the config made resident"
            );
        });
        plan
    }

    /// Reads the config again and prepares what it takes to run it, touching nothing. `seen`
    /// is the text last read (applied or refused), so an unrelated event does not retry a
    /// refused file, and the same text is not reloaded twice.
    async fn prepare_reload(&self, fleet: &Fleet, seen: &mut String, trigger: Trigger) -> Reload {
        let (text, parsed) = match std::fs::read_to_string(&self.config) {
            Ok(text) => {
                let parsed = config::parse(&text, &self.config, config_base(&self.config));
                (text, parsed)
            }
            Err(e) => {
                let error = ConfigError::Read {
                    path: self.config.clone(),
                    error: e,
                };
                tracing::error!("config reload refused, the running scanners are kept: {error}");
                return Reload::Refused;
            }
        };
        if trigger == Trigger::FileChanged && text == *seen {
            tracing::debug!(config = %self.config.display(), "config text unchanged");
            return Reload::Skipped;
        }
        *seen = text;
        tracing::info!(config = %self.config.display(), ?trigger, "reloading the config");
        let plan = match parsed {
            Ok(config) => self.prepare(&config, fleet).await,
            Err(e) => Err(e.into()),
        };
        match plan {
            Ok(plan) => Reload::Ready(plan),
            Err(e) => {
                tracing::error!("config reload refused, the running scanners are kept: {e:#}");
                Reload::Refused
            }
        }
    }
}

/// Stops every removed and changed scanner, then starts every added and changed one: all stops
/// first, so a changed scanner never clashes with its old self and two scanners may swap a
/// resource. Unchanged scanners are not touched: their sockets, registrations and streams stay.
async fn apply(fleet: &mut Fleet, plan: Plan, what: &str) {
    let Plan { diff, start } = plan;
    for (name, keys) in &diff.changed {
        tracing::info!(
            "scanner {name} changed ({}): restarting it",
            keys.join(", ")
        );
    }
    for name in diff.stops() {
        fleet.stop(name).await;
    }
    fleet.start_all(start).await;
    tracing::info!("{what}: {diff}");
}

/// Reads and checks the config file, keeping its text to compare with later reads.
fn read_config(path: &Path) -> Result<(String, Config), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    let config = config::parse(&text, path, config_base(path))?;
    Ok((text, config))
}

/// Relative paths in the config are relative to its directory (as [`config::load`] does).
fn config_base(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("."))
}

/// The signals `wdp run` acts on.
struct Signals {
    /// SIGTERM and SIGINT: stop.
    stop: Stop,
    /// SIGHUP: reload the config.
    hangup: Signal,
}

/// SIGTERM and SIGINT.
struct Stop {
    term: Signal,
    int: Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        Ok(Signals {
            stop: Stop {
                term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
                int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            },
            hangup: signal(SignalKind::hangup()).context("cannot handle SIGHUP")?,
        })
    }
}

impl Stop {
    /// Waits for SIGTERM or SIGINT; returns its name.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
