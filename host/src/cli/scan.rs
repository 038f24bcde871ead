//! `wdp scan`: run one scanner in the sandbox and print the trees it notifies.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use tokio::sync::mpsc;

use crate::policy::Policy;
use crate::sandbox::compile_cache::CompileCache;
use crate::sandbox::{GuestLimits, GuestSpec, Roots, Sandbox};
use crate::scanner::{RestartPolicy, Scanner, ScannerEvent, supervise};
use crate::tree::DeviceTree;
use crate::units;

/// Run one scanner component and print each device tree it reports.
///
/// A dry run: nothing is registered with kubelet. The scanner sees --sys-root as /sys and the
/// metadata of --dev-root as /dev, exactly as under `wdp run`; point them at a fixture tree to test
/// a scanner. A guest that fails exits non-zero with the cause.
///
/// Example: wdp scan --component kvm.wasm --env SLOTS=4 --once --format table
#[derive(Debug, Args)]
pub struct ScanArgs {
    /// The scanner component (.wasm, built for wasm32-wasip2).
    #[arg(long, value_name = "FILE")]
    component: PathBuf,

    /// Host directory the guest sees as /sys (read-only).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    sys_root: PathBuf,

    /// Host directory the guest sees as /dev (metadata only).
    #[arg(long, value_name = "DIR", default_value = "/dev")]
    dev_root: PathBuf,

    /// An environment variable for the guest; repeat for more. The guest sees nothing else.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = super::parse_key_value)]
    env: Vec<(String, String)>,

    /// A host path mounts may use (it or anything below it); repeat for more. Default: none, and
    /// a tree with any other mount is refused.
    #[arg(long, value_name = "PATH")]
    allow_mount: Vec<String>,

    /// Exit after the first tree, or when the scanner returns.
    #[arg(long)]
    once: bool,

    /// Output: one JSON object per tree and line, or a readable table.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    format: Format,

    /// Name used in logs (default: the component's file name).
    #[arg(long)]
    name: Option<String>,

    /// Memory cap of the guest (Ki, Mi, Gi).
    #[arg(long, value_name = "SIZE", default_value = "64Mi", value_parser = parse_size)]
    memory: u64,

    /// Keep compiled components here between runs (default: compile every time).
    #[arg(long, value_name = "DIR")]
    compile_cache: Option<PathBuf>,

    /// Longest the guest may compute without calling the host.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    call_timeout: Duration,
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
    let name: Arc<str> = match &args.name {
        Some(n) => n.as_str().into(),
        None => args
            .component
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scanner".into())
            .into(),
    };
    let sandbox = Sandbox::with_compile_cache(
        Roots {
            sys: args.sys_root.clone(),
            dev: args.dev_root.clone(),
        },
        args.compile_cache.clone().map(CompileCache::new),
    )?;
    let component = sandbox.load(&args.component).await?;
    let pre = component.scanner()?;
    let scanner = Scanner {
        spec: GuestSpec {
            limits: GuestLimits {
                memory: args.memory,
                call_timeout: args.call_timeout,
            },
            policy: Arc::new(Policy {
                allowed_mounts: args.allow_mount.clone(),
                ..Policy::default()
            }),
            ..GuestSpec::new(&name, args.env.clone())
        },
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
                if args.once {
                    return Ok(ExitCode::SUCCESS);
                }
            }
            Some(ScannerEvent::Refused(e)) => {
                eprintln!("scanner {name}: tree refused ({}): {e}", e.rule());
                // A scanner notifies only changes: waiting would wait for a tree that may never
                // come. A dry run asked for one tree, and this is the answer.
                if args.once {
                    return Ok(ExitCode::FAILURE);
                }
            }
            Some(ScannerEvent::Failed { error, .. }) => {
                eprintln!("error: scanner {name} failed: {error}");
                return Ok(ExitCode::FAILURE);
            }
            Some(ScannerEvent::Finished) | None => return Ok(ExitCode::SUCCESS),
        }
    }
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
