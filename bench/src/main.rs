//! `wdp-bench`: the end-to-end half of `make bench`.
//!
//! Runs every row of the results table against the real thing: `wdp run` as a child process
//! (the binary next to this one, built with the same profile; the idle row prefers the shipped
//! `release` build when it is current), the kubelet stand-in over real
//! Unix sockets with a real gRPC client, fixture dev roots made of real character devices (mknod:
//! run as root). Prints each figure as it is measured and writes `RESULTS.md` with the machine,
//! the date, the numbers, the criterion micro-benchmarks (read from criterion's JSON output) and
//! the hand-written notes.
//!
//! ```text
//! wdp-bench [--out FILE] [--criterion DIR] [--notes FILE] [--profile NAME] [--wdp BIN]
//!           [--idle-wdp BIN] [--guests DIR] [--native BIN] [--build-seconds S] [--quick] [--only ROW,ROW...]
//! ```
//!
//! Rows: hotplug, poll, newtype, allocate, dra, fleet, restart, streamcut, startup, idle, bulk, wasm, peer, and
//! micro (the criterion benchmarks, through `cargo bench`). Each is measured by a module of
//! [`scenarios`]; this file parses the arguments, runs the selected rows in order and writes the
//! report.

mod e2e;
mod report;
mod scenarios;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;

use report::Report;
use scenarios::shared::{Ctx, GUESTS};
use scenarios::sizes::Sizes;
use scenarios::{
    allocate, bulk, dra, fleet, hotplug, idle, micro, native, peer, restart, startup, streamcut,
};
use wdp_bench::fixtures;

/// Measures wdp against its performance targets on this machine and writes
/// bench/RESULTS.md: hot-plug latency against a poll-mode baseline, Allocate, kubelet restart,
/// start-up, idle memory and wake-ups, 10,000 devices, wasm against native.
///
/// Runs the real `wdp` binary (built with this one) against a kubelet stand-in over Unix
/// sockets, on fixture dev roots of real character devices on tmpfs: run it as root. `make bench`
/// builds everything first (this runs the criterion micro-benchmarks with `cargo bench`, which
/// would otherwise build them) and passes --criterion.
#[derive(Debug, Parser)]
#[command(name = "wdp-bench", about, long_about)]
struct Args {
    /// Where to write the results [default: bench/RESULTS.md in the repository].
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,

    /// criterion's output directory (relative to the repository): the `micro` row writes its
    /// estimates there, and they join the results (also when `micro` is not run: an earlier run's).
    #[arg(long, value_name = "DIR", default_value = "target/criterion")]
    criterion: PathBuf,

    /// Hand-written notes appended to the results [default: bench/NOTES.md]; a file that cannot
    /// be read (e.g. /dev/null) appends nothing.
    #[arg(long, value_name = "FILE")]
    notes: Option<PathBuf>,

    /// The cargo profile the binaries were built with, as the results should name it.
    #[arg(long, value_name = "NAME", default_value = "perf")]
    profile: String,

    /// The `wdp` binary to measure [default: the one beside this binary].
    #[arg(long, value_name = "BIN")]
    wdp: Option<PathBuf>,

    /// The `wdp` binary the idle row measures [default: the shipped build, target/release/wdp,
    /// when it is built from the current sources; else the one the other rows measure].
    #[arg(long, value_name = "BIN")]
    idle_wdp: Option<PathBuf>,

    /// Where the guest components are [default: target/guests/wasm32-wasip2/release].
    #[arg(long, value_name = "DIR")]
    guests: Option<PathBuf>,

    /// The native build of `generic` for the wasm-vs-native row [default: target/guests/release].
    #[arg(long, value_name = "BIN")]
    native: Option<PathBuf>,

    /// How long the build took, in seconds, for the results' header.
    #[arg(long, value_name = "S")]
    build_seconds: Option<f64>,

    /// Fewer samples and smaller trees: a smoke run, not a measurement.
    #[arg(long)]
    quick: bool,

    /// Only these rows (comma-separated).
    #[arg(long, value_name = "ROWS", value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(ROWS))]
    only: Option<Vec<String>>,
}

/// The rows `--only` selects from (the run order is `main`'s).
const ROWS: [&str; 14] = [
    "hotplug",
    "poll",
    "newtype",
    "allocate",
    "dra",
    "fleet",
    "restart",
    "streamcut",
    "startup",
    "idle",
    "bulk",
    "wasm",
    "peer",
    "micro",
];

impl Args {
    /// Whether `row` is selected (every row without `--only`).
    fn runs(&self, row: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|r| r == row))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(dir) = &args.guests {
        let _ = GUESTS.set(dir.clone());
    }
    if let Some(bin) = &args.native {
        let _ = native::NATIVE.set(bin.clone());
    }
    let root = fixtures::repo_root();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| root.join("bench/RESULTS.md"));
    let notes = args
        .notes
        .clone()
        .unwrap_or_else(|| root.join("bench/NOTES.md"));
    if !wdp_bench::procfs::is_root() {
        bail!("wdp-bench makes device nodes with mknod: run it as root");
    }
    let sizes = if args.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    let started = Instant::now();
    let mut report = Report::new(&args.profile, args.build_seconds, args.quick);
    // One compiled-component cache for the whole run (the start-up row uses its own).
    let cache = tempfile::tempdir()?;
    let ctx = Ctx {
        wdp: match &args.wdp {
            Some(w) => w.clone(),
            None => default_wdp()?,
        },
        cache: cache.path().to_path_buf(),
    };
    println!("wdp-bench: host binary {}", ctx.wdp.display());

    // The idle row watches a host that is meant to do nothing, for more than a minute: what it
    // measures (that host's own wake-ups and memory) does not change while other processes run.
    // It starts first, alone until its host is idle (its first start compiles); the hot-plug rows
    // (fixtures of their own, no kernel uevents), the poll baseline (asleep for seconds) and the
    // micro-benchmarks (a process of their own) run beside its window. The rows whose tails
    // matter to a target (Allocate, restart, start-up, 10,000 devices, wasm) run after, alone.
    let (idling, idle_started) = tokio::sync::oneshot::channel();
    let idle = args.runs("idle").then(|| {
        let build = idle_build(&args, &ctx.wdp);
        println!(
            "wdp-bench: idle row measures {} ({})",
            build.1.display(),
            build.0
        );
        let ctx = Ctx {
            wdp: build.1,
            ..ctx.clone()
        };
        let (window, build) = (sizes.idle, build.0);
        tokio::spawn(async move { idle::run(&ctx, &build, window, idling).await })
    });
    // An error only means there is no idle row to wait for (or it failed: its task says why).
    let _ = idle_started.await;
    if args.runs("hotplug") {
        hotplug::event_driven(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("newtype") {
        hotplug::new_type(&ctx, &sizes, &mut report).await?;
    }
    let micro = args.runs("micro").then(|| {
        let (root, dir) = (root.clone(), root.join(&args.criterion));
        let (profile, quick) = (args.profile.clone(), args.quick);
        tokio::spawn(async move { micro::run(&root, &dir, &profile, quick).await })
    });
    if args.runs("poll") {
        hotplug::poll_baseline(&ctx, &sizes, &mut report).await?;
    }
    if let Some(idle) = idle {
        let (rows, details) = idle.await??;
        report.rows.extend(rows);
        report.details.extend(details);
    }
    if let Some(micro) = micro {
        micro.await??;
    }
    if args.runs("allocate") {
        allocate::run(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("dra") {
        dra::run(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("fleet") {
        fleet::run(&sizes, &mut report).await?;
    }
    if args.runs("restart") {
        restart::run(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("streamcut") {
        streamcut::run(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("startup") {
        startup::run(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("bulk") {
        bulk::run(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("wasm") {
        native::run(&sizes, &mut report).await?;
    }
    if args.runs("peer") {
        peer::run(&ctx, &sizes, &mut report).await?;
    }
    report.hotplug_ratio();
    report.read_criterion(&root.join(&args.criterion));
    let notes = std::fs::read_to_string(&notes).ok();
    report.run_seconds = started.elapsed().as_secs_f64();
    let previous = std::fs::read_to_string(&out).unwrap_or_default();
    let text = format!(
        "{}{}",
        report.markdown(notes.as_deref()),
        soak_sections(&previous)
    );
    std::fs::write(&out, text).with_context(|| format!("write {}", out.display()))?;
    println!(
        "\nwdp-bench: {} rows in {:.0} s; wrote {}",
        report.rows.len(),
        report.run_seconds,
        out.display()
    );
    Ok(())
}

/// The sections `make soak` writes into the results (`tests/tests/soak.rs`, each replaced whole
/// by the next soak run): a bench run does not measure them, and rewriting the file must not lose
/// them, nor the book's links to them.
const SOAK_SECTIONS: &[&str] = &["DRA soak", "Soak"];

/// The [`SOAK_SECTIONS`] of `previous` (the results file being replaced), each from its heading
/// to the next `## ` heading, as they were.
fn soak_sections(previous: &str) -> String {
    let mut kept = String::new();
    for title in SOAK_SECTIONS {
        let heading = format!("\n## {title}\n");
        let Some(start) = previous.find(&heading).map(|i| i + 1) else {
            continue;
        };
        let body = &previous[start..];
        let end = body[heading.len() - 1..]
            .find("\n## ")
            .map_or(body.len(), |j| heading.len() - 1 + j);
        kept.push('\n');
        kept.push_str(body[..end].trim_end());
        kept.push('\n');
    }
    kept
}

/// The binary the idle row measures and how its row names the build: `--idle-wdp`, else the
/// shipped `release` build when it is current (the image's; `make bench` does not build it: 15-20
/// minutes of thin LTO here, more than the whole run), else `other` (the other rows' binary).
fn idle_build(args: &Args, other: &Path) -> (String, PathBuf) {
    if let Some(bin) = &args.idle_wdp {
        return (format!("given: {}", bin.display()), bin.clone());
    }
    let release = fixtures::repo_root().join("target/release/wdp");
    match built_from_current_sources(&release) {
        Ok(true) => ("the `release` build".into(), release),
        Ok(false) => (
            format!(
                "the `{}` build; target/release/wdp is older than its sources",
                args.profile
            ),
            other.to_path_buf(),
        ),
        Err(_) => (
            format!("the `{}` build; no target/release/wdp", args.profile),
            other.to_path_buf(),
        ),
    }
}

/// Whether `bin` is newer than every source cargo's dep-info file beside it lists (an error when
/// it is missing).
fn built_from_current_sources(bin: &Path) -> std::io::Result<bool> {
    let built = std::fs::metadata(bin)?.modified()?;
    let deps = std::fs::read_to_string(bin.with_extension("d"))?;
    let sources = deps.split_once(": ").map(|(_, d)| d).unwrap_or_default();
    Ok(sources.split_whitespace().all(|source| {
        std::fs::metadata(source)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t <= built)
    }))
}

/// The `wdp` built with this binary (same profile directory).
fn default_wdp() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let wdp = exe.with_file_name("wdp");
    ensure!(
        wdp.exists(),
        "{} is missing: build it with this binary (`make bench` does), or pass --wdp",
        wdp.display()
    );
    Ok(wdp)
}
