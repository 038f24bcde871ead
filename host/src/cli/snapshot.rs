//! `wdp snapshot`: record what a scanner reads of /sys and /dev into one archive.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args;

use super::scan::{GuestArgs, first_tree, sha256_hex};
use crate::config::{self, ComponentSource};
use crate::hostfs::record::Recorder;
use crate::policy::Policy;
use crate::sandbox::{Guest, GuestLimits, Roots, Sandbox, SandboxOptions};
use crate::scanner::Scanner;
use crate::snapshot::manifest::{FORMAT, Manifest};
use crate::snapshot::{archive, redact};
use crate::tree::DeviceTree;

/// Record what a scanner reads of /sys and /dev into one archive, for a bug report or a test.
///
/// Runs the scanner as `wdp scan --once` does, notes every path it (and the host for it) looks
/// at, and writes a gzip-compressed tar holding: the /sys directories, symlinks and file
/// contents it read, the metadata of the /dev entries it looked at (type, major:minor, mode;
/// never a device's contents), the component itself, and a manifest with the configuration,
/// the kernel release and the tree the scanner reported. `wdp scan --from-snapshot FILE`
/// replays it anywhere, without root.
///
/// Example: wdp snapshot --component gpu.wasm --env SHARED_DEV_NUM=2 --output gpu-case.tar.gz
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// The scanner component (.wasm, built for wasm32-wasip2).
    #[arg(long, value_name = "FILE", required_unless_present = "config")]
    component: Option<PathBuf>,

    /// Take the scanner from this `wdp run` config file (its component, env, limits and allowed
    /// mounts), as the host runs it; --env and --allow-mount add to it. Needs --scanner.
    #[arg(
        long,
        value_name = "FILE",
        requires = "scanner",
        conflicts_with = "component"
    )]
    config: Option<PathBuf>,

    /// The scanner of --config to record, by name.
    #[arg(long, value_name = "NAME", requires = "config")]
    scanner: Option<String>,

    #[command(flatten)]
    guest: GuestArgs,

    /// Where to write the archive (a .tar.gz); `-` for stdout (e.g. out of a pod with
    /// `kubectl exec ... -- wdp snapshot ... -o - > case.tar.gz`), the summary then going to
    /// stderr.
    #[arg(long, short, value_name = "FILE")]
    output: PathBuf,

    /// Replace the contents of every recorded /sys file with this name (e.g. serial) by a
    /// placeholder, here and wherever the value appears in the configuration and the tree;
    /// repeat for more.
    #[arg(long, value_name = "NAME")]
    redact: Vec<String>,

    /// Longest to wait for the scanner's first tree.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    timeout: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::units::parse_duration(s).map_err(|e| e.to_string())
}

pub async fn run(args: SnapshotArgs) -> anyhow::Result<ExitCode> {
    let g = &args.guest;
    let (component_path, (spec, policy)) = match (&args.config, &args.scanner, &args.component) {
        (Some(config), Some(scanner), _) => from_config(config, scanner, g)?,
        (_, _, Some(component)) => {
            let name = g.name(component);
            let spec = g.spec(
                &name,
                g.env.clone(),
                g.allow_mount.clone(),
                GuestLimits::default(),
            );
            (component.clone(), spec)
        }
        _ => anyhow::bail!("give --component, or --config and --scanner"),
    };
    let name = spec.name.clone();
    let to_stdout = args.output == Path::new("-");
    if to_stdout && std::io::stdout().is_terminal() {
        anyhow::bail!("refusing to write a binary archive to a terminal: redirect stdout");
    }
    let component = std::fs::read(&component_path)
        .with_context(|| format!("cannot read component {}", component_path.display()))?;
    let recorder = Arc::new(Recorder::new(&g.sys_root, &g.dev_root).with_context(|| {
        format!(
            "cannot use {} and {} as the sys and dev roots",
            g.sys_root.display(),
            g.dev_root.display()
        )
    })?);
    let sandbox = Sandbox::with_options(
        Roots {
            sys: g.sys_root.clone(),
            dev: g.dev_root.clone(),
        },
        SandboxOptions {
            compile_cache: g.compile_cache(),
            devfs: None,
            recorder: Some(recorder.clone()),
            ..SandboxOptions::default()
        },
    )?;
    let pre = sandbox.load(&component_path).await?.scanner()?;
    let env = spec.env.clone();
    let allow_mount = policy.allowed_mounts.clone();
    let limits = spec.limits;
    let scanner = Scanner {
        guest: spec,
        policy,
        pre,
    };
    let outcome = tokio::time::timeout(args.timeout, first_tree(sandbox, scanner))
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "scanner {name} reported no tree within {}",
                humantime::format_duration(args.timeout)
            )
        })?;
    let empty = Arc::new(DeviceTree::default());
    let (tree, error) = match outcome {
        Ok(tree) => (tree, None),
        // Recorded all the same: a scanner that fails on one machine is what a bug report is for.
        Err(e) => {
            eprintln!("note: {e}; the snapshot records this failure");
            (empty, Some(e))
        }
    };
    let mut recording = recorder.finish();
    let replacements = redact::redact_files(&mut recording, &args.redact);
    let counts = archive::counts(&recording);
    let now = SystemTime::now();
    let manifest = Manifest {
        format: FORMAT,
        wdp_version: env!("CARGO_PKG_VERSION").into(),
        scanner: name.to_string(),
        component: component_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        component_sha256: sha256_hex(&component),
        env: env
            .iter()
            .map(|(k, v)| (k.clone(), redact::apply(v, &replacements)))
            .collect(),
        allow_mount,
        created: humantime::format_rfc3339_seconds(now).to_string(),
        kernel_release: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .map(|s| s.trim().to_string()),
        sys_root: g.sys_root.display().to_string(),
        dev_root: g.dev_root.display().to_string(),
        counts: counts.clone(),
        tree: match error {
            None => redact::apply_json(
                &serde_json::to_value(&*tree).context("cannot encode the tree")?,
                &replacements,
            ),
            Some(_) => serde_json::Value::Null,
        },
        error: error.as_deref().map(|e| redact::apply(e, &replacements)),
        redacted: args.redact.clone(),
        limits: Some(limits.into()),
    };
    let mtime = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let summary = format!(
        "{}: {} file(s) ({} bytes of /sys contents), {} dir(s), {} symlink(s), {} device \
         node(s); scanner {name} {}",
        if to_stdout {
            "wrote the snapshot to stdout".to_string()
        } else {
            format!("wrote {}", args.output.display())
        },
        counts.files,
        counts.bytes,
        counts.dirs,
        counts.symlinks,
        counts.nodes,
        match &error {
            None => format!(
                "reported {} type(s), {} device(s)",
                tree.0.len(),
                tree.device_count()
            ),
            Some(_) => "reported no tree (failed)".into(),
        }
    );
    if to_stdout {
        archive::write_to(
            std::io::stdout().lock(),
            &manifest,
            &component,
            &recording,
            mtime,
        )
        .and_then(|mut out| out.flush())
        .context("cannot write the snapshot to stdout")?;
        eprintln!("{summary}");
    } else {
        archive::write(&args.output, &manifest, &component, &recording, mtime)?;
        println!("{summary}");
    }
    for path in &recording.truncated {
        eprintln!(
            "note: /sys/{} is longer than {} KiB: kept truncated",
            path.display(),
            crate::snapshot::record::MAX_FILE >> 10
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The component and guest spec of scanner `name` in the config file at `path`, with the
/// command line's --env (replacing a configured value of the same key) and --allow-mount added.
fn from_config(
    path: &Path,
    name: &str,
    g: &GuestArgs,
) -> anyhow::Result<(PathBuf, (Guest, Arc<Policy>))> {
    let config = config::load(path)?;
    let Some(scanner) = config.scanners.into_iter().find(|s| s.name == name) else {
        anyhow::bail!("{} has no scanner named {name:?}", path.display());
    };
    let component = match scanner.component {
        ComponentSource::File(file) => file,
        ComponentSource::Oci(reference) => anyhow::bail!(
            "scanner {name} runs {reference}: fetch it with `wdp pull` and give the file with \
             --component (and its env with --env)"
        ),
    };
    let mut env = scanner.env;
    for (k, v) in &g.env {
        env.retain(|(key, _)| key != k);
        env.push((k.clone(), v.clone()));
    }
    let mut policy = scanner.policy;
    policy.allowed_mounts.extend(g.allow_mount.iter().cloned());
    let spec = Guest {
        limits: g.limits(scanner.limits),
        ..Guest::new(name, env)
    };
    Ok((component, (spec, Arc::new(policy))))
}
