//! `wdp scan`: run one scanner in the sandbox and print the trees it notifies.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use tokio::sync::mpsc;

use crate::hostfs::DevFs;
use crate::policy::Policy;
use crate::sandbox::compile_cache::CompileCache;
use crate::sandbox::{Guest, GuestLimits, Roots, Sandbox, SandboxOptions};
use crate::scanner::{RestartPolicy, Scanner, ScannerEvent, supervise};
use crate::snapshot::{archive, tree_diff};
use crate::tree::DeviceTree;
use crate::units;

/// Run one scanner component and print each device tree it reports.
///
/// A dry run: nothing is registered with kubelet. The scanner sees --sys-root as /sys and the
/// metadata of --dev-root as /dev, exactly as under `wdp run`; point them at a fixture tree to test
/// a scanner. A guest that fails exits non-zero with the cause.
///
/// With --from-snapshot it replays a `wdp snapshot` archive instead: the scanner (the recorded one,
/// or --component) runs over the recorded /sys and /dev, its first tree is printed and compared
/// with the recorded tree, and any difference is listed and exits 1.
///
/// With --expect it is a test: the first tree is compared with the tree in a file (as this command
/// prints it) and any difference is listed and exits 1, which is what a scanner project's test
/// runs over its fixture.
///
/// Example: wdp scan --component kvm.wasm --env SLOTS=4 --once --format table
#[derive(Debug, Args)]
pub struct ScanArgs {
    /// The scanner component (.wasm, built for wasm32-wasip2). With --from-snapshot: default,
    /// the component recorded in the snapshot.
    #[arg(long, value_name = "FILE", required_unless_present = "from_snapshot")]
    component: Option<PathBuf>,

    /// Replay this `wdp snapshot` archive: implies --once, and compares the tree with the
    /// recorded one (exit 1 on a difference).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["sys_root", "dev_root"])]
    from_snapshot: Option<PathBuf>,

    #[command(flatten)]
    guest: GuestArgs,

    /// Exit after the first tree, or when the scanner returns.
    #[arg(long)]
    once: bool,

    /// Compare the first tree with the one in FILE (JSON, as this command prints a tree): list
    /// each difference and exit 1 when they differ. Implies --once.
    #[arg(long, value_name = "FILE", conflicts_with = "from_snapshot")]
    expect: Option<PathBuf>,

    /// Output: one JSON object per tree and line, or a readable table.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    format: Format,
}

/// The flags `wdp scan` and `wdp snapshot` share: where the guest looks, what it is given.
#[derive(Debug, Args)]
pub struct GuestArgs {
    /// Host directory the guest sees as /sys (read-only).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sys_root: PathBuf,

    /// Host directory the guest sees as /dev (metadata only).
    #[arg(long, value_name = "DIR", default_value = "/dev")]
    pub dev_root: PathBuf,

    /// An environment variable for the guest; repeat for more. The guest sees nothing else.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = super::parse_key_value)]
    pub env: Vec<(String, String)>,

    /// A host path mounts may use (it or anything below it); repeat for more. Default: none, and
    /// a tree with any other mount is refused.
    #[arg(long, value_name = "PATH")]
    pub allow_mount: Vec<String>,

    /// Name used in logs (default: the component's file name).
    #[arg(long)]
    pub name: Option<String>,

    /// Memory cap of the guest (Ki, Mi, Gi) [default: 64Mi; with a config or a snapshot, the
    /// scanner's recorded limit].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,

    /// Keep compiled components here between runs (default: compile every time).
    #[arg(long, value_name = "DIR")]
    pub compile_cache: Option<PathBuf>,

    /// With --compile-cache: compiled components to load before it, never written (what `wdp
    /// precompile` wrote into the image), as `wdp run` does.
    #[arg(long, value_name = "DIR", default_value = "/usr/lib/wdp/compiled")]
    pub precompiled: PathBuf,

    /// Longest the guest may compute without calling the host [default: 5s; with a config or a
    /// snapshot, the scanner's recorded limit].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub call_timeout: Option<Duration>,
}

impl GuestArgs {
    /// The scanner's name: --name, else the component's file stem.
    pub fn name(&self, component: &Path) -> Arc<str> {
        match &self.name {
            Some(n) => n.as_str().into(),
            None => component
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "scanner".into())
                .into(),
        }
    }

    /// The compile cache of --compile-cache, reading --precompiled first; none without it.
    pub fn compile_cache(&self) -> Option<CompileCache> {
        self.compile_cache
            .clone()
            .map(|dir| CompileCache::new(dir).with_precompiled(self.precompiled.clone()))
    }

    /// `base` with the limits given on the command line.
    pub fn limits(&self, base: GuestLimits) -> GuestLimits {
        GuestLimits {
            memory: self.memory.unwrap_or(base.memory),
            call_timeout: self.call_timeout.unwrap_or(base.call_timeout),
        }
    }

    /// The guest's spec with `env` and the command line's limits over `base`, and a policy
    /// allowing `allow_mount`.
    pub fn spec(
        &self,
        name: &str,
        env: Vec<(String, String)>,
        allow_mount: Vec<String>,
        base: GuestLimits,
    ) -> (Guest, Arc<Policy>) {
        let spec = Guest {
            limits: self.limits(base),
            ..Guest::new(name, env)
        };
        let policy = Arc::new(Policy {
            allowed_mounts: allow_mount,
            ..Policy::default()
        });
        (spec, policy)
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Json,
    Table,
}

pub async fn run(args: ScanArgs) -> anyhow::Result<ExitCode> {
    if let Some(snapshot) = &args.from_snapshot {
        return replay(&args, snapshot).await;
    }
    let Some(component) = &args.component else {
        anyhow::bail!("--component is required");
    };
    let g = &args.guest;
    let name = g.name(component);
    let expected = match &args.expect {
        Some(file) => Some(read_expected(file)?),
        None => None,
    };
    let sandbox = Sandbox::with_compile_cache(
        Roots {
            sys: g.sys_root.clone(),
            dev: g.dev_root.clone(),
        },
        g.compile_cache(),
    )?;
    let pre = sandbox.load(component).await?.scanner()?;
    let (spec, policy) = g.spec(
        &name,
        g.env.clone(),
        g.allow_mount.clone(),
        GuestLimits::default(),
    );
    let scanner = Scanner {
        guest: spec,
        policy,
        pre,
    };
    let (tx, mut rx) = mpsc::channel(16);
    // The supervisor ends when `rx` is dropped: returning from here stops the guest.
    tokio::spawn(supervise(sandbox, scanner, RestartPolicy::Never, tx));

    let mut printed = 0usize;
    loop {
        let event = tokio::select! {
            event = rx.recv() => event,
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        };
        match event {
            Some(ScannerEvent::Tree(tree)) => {
                printed += 1;
                print_tree(&tree, args.format, printed).context("cannot write to stdout")?;
                if let (Some(expected), Some(file)) = (&expected, &args.expect) {
                    return compare_with_expected(&tree, expected, file);
                }
                if args.once {
                    return Ok(ExitCode::SUCCESS);
                }
            }
            Some(ScannerEvent::Refused(e)) => {
                eprintln!("scanner {name}: tree refused ({}): {e}", e.rule());
                // A scanner notifies only changes: waiting would wait for a tree that may never
                // come. A dry run asked for one tree, and this is the answer.
                if args.once || expected.is_some() {
                    return Ok(ExitCode::FAILURE);
                }
            }
            Some(ScannerEvent::Failed { error, .. }) => {
                eprintln!("error: scanner {name} failed: {error}");
                return Ok(ExitCode::FAILURE);
            }
            Some(ScannerEvent::Finished) | None if expected.is_some() => {
                eprintln!("error: scanner {name} finished without reporting a tree");
                return Ok(ExitCode::FAILURE);
            }
            Some(ScannerEvent::Finished) | None => return Ok(ExitCode::SUCCESS),
        }
    }
}

/// The tree of an `--expect` file.
fn read_expected(file: &Path) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the expected tree {}", file.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a JSON tree (write one with `wdp scan ... --once > {}`)",
            file.display(),
            file.display()
        )
    })
}

/// `--expect`: success when `tree` is `expected`, else each difference on stderr and exit 1.
fn compare_with_expected(
    tree: &DeviceTree,
    expected: &serde_json::Value,
    file: &Path,
) -> anyhow::Result<ExitCode> {
    let got = serde_json::to_value(tree).context("cannot encode the tree")?;
    let diff = tree_diff(expected, &got);
    if diff.is_empty() {
        eprintln!("the tree equals {}", file.display());
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "the tree differs from {} ({} difference(s); \"recorded\" is the file's):",
        file.display(),
        diff.len()
    );
    for line in &diff {
        eprintln!("  {line}");
    }
    Ok(ExitCode::FAILURE)
}

/// The first tree `scanner` reports in `sandbox`, or why there is none (a refused tree, a
/// failure, or a scanner that finished without one), as one line. The scanner is stopped on
/// return.
pub async fn first_tree(
    sandbox: Arc<Sandbox>,
    scanner: Scanner,
) -> Result<Arc<DeviceTree>, String> {
    let name = scanner.guest.name.clone();
    let (tx, mut rx) = mpsc::channel(16);
    let task = tokio::spawn(supervise(sandbox, scanner, RestartPolicy::Never, tx));
    let event = rx.recv().await;
    task.abort();
    match event {
        Some(ScannerEvent::Tree(tree)) => Ok(tree),
        Some(ScannerEvent::Refused(e)) => {
            Err(format!("scanner {name}: tree refused ({}): {e}", e.rule()))
        }
        Some(ScannerEvent::Failed { error, .. }) => Err(format!("scanner {name} failed: {error}")),
        Some(ScannerEvent::Finished) | None => {
            Err(format!("scanner {name} finished without reporting a tree"))
        }
    }
}

/// `wdp scan --from-snapshot`: the scanner over the recorded /sys and /dev, compared with the
/// recorded tree.
async fn replay(args: &ScanArgs, path: &Path) -> anyhow::Result<ExitCode> {
    let snapshot = archive::read(path)?;
    let m = &snapshot.manifest;
    let g = &args.guest;
    let work = tempfile::tempdir().context("cannot create a temporary directory")?;
    let component = match &args.component {
        Some(c) => {
            let bytes = std::fs::read(c)
                .with_context(|| format!("cannot read component {}", c.display()))?;
            let sha = sha256_hex(&bytes);
            if sha != m.component_sha256 {
                eprintln!(
                    "note: {} (sha256 {sha}) is not the recorded component {} (sha256 {}): \
                     replaying another build",
                    c.display(),
                    m.component,
                    m.component_sha256
                );
            }
            c.clone()
        }
        None => {
            let bytes = snapshot.component.as_deref().with_context(|| {
                format!(
                    "{} holds no component: give the scanner with --component",
                    path.display()
                )
            })?;
            // Not the recorded file name: the manifest is not trusted to name a path.
            let file = work.path().join("component.wasm");
            std::fs::write(&file, bytes)
                .with_context(|| format!("cannot write {}", file.display()))?;
            file
        }
    };
    let sys = work.path().join("sys");
    let dev = work.path().join("dev");
    std::fs::create_dir_all(&sys).context("cannot create the replay's sys root")?;
    std::fs::create_dir_all(&dev).context("cannot create the replay's dev root")?;
    snapshot.extract_sys(&sys, path)?;
    // The recorded configuration, with --env and --allow-mount added (an --env replaces the
    // recorded value of the same key).
    let mut env = m.env.clone();
    for (k, v) in &g.env {
        env.retain(|(key, _)| key != k);
        env.push((k.clone(), v.clone()));
    }
    let mut allow_mount = m.allow_mount.clone();
    allow_mount.extend(g.allow_mount.iter().cloned());
    let name: Arc<str> = match &g.name {
        Some(n) => n.as_str().into(),
        None => m.scanner.as_str().into(),
    };
    let devfs = DevFs::from_table(Arc::new(snapshot.dev), "/dev".into());
    let sandbox = Sandbox::with_options(
        Roots { sys, dev },
        SandboxOptions {
            compile_cache: g.compile_cache(),
            devfs: Some(devfs),
            recorder: None,
            ..SandboxOptions::default()
        },
    )?;
    let pre = sandbox.load(&component).await?.scanner()?;
    let (spec, policy) = g.spec(
        &name,
        env,
        allow_mount,
        m.limits.map(GuestLimits::from).unwrap_or_default(),
    );
    let scanner = Scanner {
        guest: spec,
        policy,
        pre,
    };
    let outcome = first_tree(sandbox, scanner).await;
    if let Ok(tree) = &outcome {
        print_tree(tree, args.format, 1).context("cannot write to stdout")?;
    }
    let diff = match (&m.error, &outcome) {
        (None, Ok(tree)) => {
            let replayed = serde_json::to_value(&**tree).context("cannot encode the tree")?;
            tree_diff(&m.tree, &replayed)
        }
        (Some(recorded), Err(replayed)) if recorded == replayed => Vec::new(),
        (Some(recorded), Err(replayed)) => vec![format!(
            "the scanner failed differently: recorded {recorded:?}, replayed {replayed:?}"
        )],
        (None, Err(replayed)) => vec![format!(
            "a tree was recorded, the replay has none: {replayed}"
        )],
        (Some(recorded), Ok(_)) => vec![format!(
            "no tree was recorded ({recorded}), the replay has one"
        )],
    };
    let when = format!(
        "{} ({})",
        m.created,
        m.kernel_release.as_deref().unwrap_or("kernel unknown")
    );
    if diff.is_empty() {
        match &m.error {
            None => eprintln!(
                "replay of {}: the tree equals the one recorded on {when}",
                path.display()
            ),
            Some(e) => eprintln!(
                "replay of {}: the scanner fails as it did on {when}: {e}",
                path.display()
            ),
        }
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "replay of {}: the outcome differs from the one recorded on {} ({} difference(s)):",
        path.display(),
        m.created,
        diff.len()
    );
    for line in &diff {
        eprintln!("  {line}");
    }
    Ok(ExitCode::FAILURE)
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn print_tree(tree: &DeviceTree, format: Format, n: usize) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match format {
        Format::Json => {
            serde_json::to_writer(&mut out, tree)?;
            writeln!(out)?;
        }
        Format::Table => {
            writeln!(
                out,
                "# tree {n}: {} type(s), {} device(s)",
                tree.0.len(),
                tree.device_count()
            )?;
            writeln!(
                out,
                "{:<16} {:<24} {:<10} {:<6} NODES",
                "DEV-TYPE", "ID", "HEALTH", "NUMA"
            )?;
            for (dev_type, devices) in &tree.0 {
                for (id, info) in devices {
                    let nodes: Vec<&str> =
                        info.nodes.iter().map(|n| n.host_path.as_str()).collect();
                    let numa = match &info.numa_nodes {
                        Some(n) => n.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
                        None => "-".into(),
                    };
                    writeln!(
                        out,
                        "{dev_type:<16} {id:<24} {:<10} {numa:<6} {}",
                        info.health.as_str(),
                        nodes.join(",")
                    )?;
                }
            }
        }
    }
    out.flush()
}
