//! `wdp-bench`: the end-to-end half of `make bench` (issue 8).
//!
//! Runs every row of the issue's table against the real thing: `wdp run` as a child process
//! (the binary next to this one, built with the same profile), the kubelet stand-in over real
//! Unix sockets with a real gRPC client, fixture dev roots made of real character devices (mknod:
//! run as root). Prints each figure as it is measured and writes `RESULTS.md` with the machine,
//! the date, the numbers, the criterion micro-benchmarks (read from criterion's JSON output) and
//! the hand-written notes.
//!
//! ```text
//! wdp-bench [--out FILE] [--criterion DIR] [--notes FILE] [--profile NAME] [--wdp BIN]
//!           [--guests DIR] [--native BIN] [--build-seconds S] [--quick] [--only ROW,ROW...]
//! ```
//!
//! Rows: hotplug, poll, newtype, allocate, restart, startup, idle, bulk, wasm. Each is measured by
//! a module of [`scenarios`]; this file parses the arguments, runs the selected rows in order and
//! writes the report.

mod e2e;
mod report;
mod scenarios;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use report::Report;
use scenarios::shared::{Ctx, GUESTS};
use scenarios::sizes::Sizes;
use scenarios::{allocate, bulk, hotplug, idle, native, restart, startup};
use wdp_bench::fixtures;

/// The command line.
struct Args {
    out: PathBuf,
    criterion: Option<PathBuf>,
    notes: Option<PathBuf>,
    profile: String,
    build_seconds: Option<f64>,
    quick: bool,
    only: Option<Vec<String>>,
    wdp: Option<PathBuf>,
}

/// The rows `--only` selects from (the run order is `main`'s).
const ROWS: [&str; 9] = [
    "hotplug", "poll", "newtype", "allocate", "restart", "startup", "idle", "bulk", "wasm",
];

impl Args {
    /// Parses `std::env::args`; `--help` prints the usage and exits.
    fn parse() -> Result<Args> {
        let root = fixtures::repo_root();
        let mut a = Args {
            out: root.join("bench/RESULTS.md"),
            criterion: None,
            notes: Some(root.join("bench/NOTES.md")),
            profile: "perf".into(),
            build_seconds: None,
            quick: false,
            only: None,
            wdp: None,
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
            match arg.as_str() {
                "--out" => a.out = value()?.into(),
                "--criterion" => a.criterion = Some(value()?.into()),
                "--notes" => a.notes = Some(value()?.into()),
                "--profile" => a.profile = value()?,
                "--wdp" => a.wdp = Some(value()?.into()),
                "--guests" => {
                    let _ = GUESTS.set(value()?.into());
                }
                "--native" => {
                    let _ = native::NATIVE.set(value()?.into());
                }
                "--build-seconds" => a.build_seconds = Some(value()?.parse()?),
                "--quick" => a.quick = true,
                "--only" => {
                    let only: Vec<String> = value()?.split(',').map(str::to_string).collect();
                    if let Some(bad) = only.iter().find(|r| !ROWS.contains(&r.as_str())) {
                        bail!("unknown row {bad:?}; rows: {}", ROWS.join(", "));
                    }
                    a.only = Some(only);
                }
                "-h" | "--help" => {
                    println!(
                        "wdp-bench [--out FILE] [--criterion DIR] [--notes FILE] [--profile NAME] \
                         [--wdp BIN] [--guests DIR] [--native BIN] [--build-seconds S] [--quick] \
                         [--only {}]",
                        ROWS.join(",")
                    );
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other:?} (try --help)"),
            }
        }
        Ok(a)
    }

    /// Whether `row` is selected (every row without `--only`).
    fn runs(&self, row: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|r| r == row))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse()?;
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

    if args.runs("hotplug") {
        hotplug::event_driven(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("newtype") {
        hotplug::new_type(&ctx, &sizes, &mut report).await?;
    }
    // The poll baseline spends its time asleep: the idle row (which only looks at its own host's
    // wake-ups and memory) runs beside it.
    let idle = args.runs("idle").then(|| {
        let ctx = ctx.clone();
        let window = sizes.idle;
        tokio::spawn(async move { idle::run(&ctx, window).await })
    });
    if args.runs("poll") {
        hotplug::poll_baseline(&ctx, &sizes, &mut report).await?;
    }
    if let Some(idle) = idle {
        let (rows, details) = idle.await??;
        report.rows.extend(rows);
        report.details.extend(details);
    }
    if args.runs("allocate") {
        allocate::run(&ctx, &sizes, &mut report).await?;
    }
    if args.runs("restart") {
        restart::run(&ctx, &sizes, &mut report).await?;
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
    report.hotplug_ratio();
    if let Some(dir) = &args.criterion {
        report.read_criterion(dir);
    }
    let notes = args
        .notes
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok());
    report.run_seconds = started.elapsed().as_secs_f64();
    let text = report.markdown(notes.as_deref());
    std::fs::write(&args.out, text).with_context(|| format!("write {}", args.out.display()))?;
    println!(
        "\nwdp-bench: {} rows in {:.0} s; wrote {}",
        report.rows.len(),
        report.run_seconds,
        args.out.display()
    );
    Ok(())
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
