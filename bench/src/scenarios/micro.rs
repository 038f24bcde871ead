//! The criterion micro-benchmarks (`benches/micro.rs`), run by `cargo bench` as a process of
//! their own while the idle row waits out its window.
//!
//! Why beside the idle row: that row spends more than a minute watching a host that is meant to
//! do nothing, and what it measures (that host's own wake-ups and memory) is not changed by
//! another process using a core; the micro-benchmarks need a core and about 40 s. Criterion's
//! progress goes to a log file: interleaved with the driver's rows it would be unreadable.

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, Result, ensure};

/// Runs the micro-benchmarks of the `profile` build, writing criterion's estimates under `dir`
/// (where [`crate::report::Report::read_criterion`] reads them) and its output to
/// `dir/micro.log`. `quick` is criterion's own `--quick` (stop once the estimate is stable).
pub async fn run(root: &Path, dir: &Path, profile: &str, quick: bool) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let log_path = dir.join("micro.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("create {}", log_path.display()))?;
    println!(
        "\n== criterion micro-benchmarks (beside the idle row; output in {}) ==",
        log_path.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    let status = tokio::process::Command::new(&cargo)
        .args(["bench", "--locked", "--profile", profile])
        .args(["-p", "wdp-bench", "--bench", "micro"])
        .args(if quick { &["--", "--quick"][..] } else { &[] })
        .env("CRITERION_HOME", dir)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .await
        .with_context(|| format!("run {} bench", cargo.to_string_lossy()))?;
    ensure!(
        status.success(),
        "the micro-benchmarks failed ({status}): see {}",
        log_path.display()
    );
    println!(
        "micro-benchmarks: done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
