//! What several scenarios use: which components to run, how a scenario starts its host, and
//! waiting on the stand-in with the host's log attached when the wait fails (a timeout alone says
//! nothing about why).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Result;
use wdp_bench::fixtures::{BenchFixture, Fixture, demo_fixture, demo_resources};
use wdp_kubelet::standin::StandIn;

use wdp_tests::host::{Host, Launch, Seen};

use crate::e2e::kubelet;

/// Components from `--guests DIR` instead of this tree's build (for what-if runs).
pub static GUESTS: OnceLock<PathBuf> = OnceLock::new();

/// The compiled guest `name` (`generic`, `kvm`, `test_hooks`, ...).
pub fn guest(name: &str) -> PathBuf {
    match GUESTS.get() {
        Some(dir) => dir.join(format!("{name}.wasm")),
        None => wdp_tests::guest(name),
    }
}

/// What every host of the run shares: the binary under test and one compiled-component cache
/// (so only the first scenario to load a component pays for compiling it).
#[derive(Clone)]
pub struct Ctx {
    /// The `wdp` binary.
    pub wdp: PathBuf,
    /// The `--compile-cache` of every host started with [`Ctx::start`].
    pub cache: PathBuf,
}

impl Ctx {
    /// Starts `wdp run` over the fixture with `config`, as shipped: text logs at `info`.
    pub fn start(&self, f: &Fixture, config: &Path) -> Result<Host> {
        self.launch(f, config, "info", &[])
    }

    /// Starts `wdp run` over the fixture with `config`, logs filtered by `log_filter`, with more
    /// arguments (e.g. `--log-format json`).
    pub fn launch(
        &self,
        f: &Fixture,
        config: &Path,
        log_filter: &str,
        args: &[&str],
    ) -> Result<Host> {
        let launch = Launch {
            wdp: self.wdp.clone(),
            compile_cache: self.cache.clone(),
            log_filter,
            args,
        };
        Ok(Host::launch(config, &f.plugin_dir(), f, &launch)?)
    }
}

/// The demo configuration served to a stand-in, every resource listed: where the rows that
/// disturb a running host's registrations start.
pub struct Demo {
    /// Holds the fixture's directory for as long as the host runs.
    pub fixture: BenchFixture,
    pub resources: Vec<String>,
    pub dir: PathBuf,
    pub kubelet: StandIn,
    pub obs: Seen,
    pub host: Host,
}

/// Starts [`Demo`]: the stand-in first, then the host, then waits for all 10 lists.
pub async fn demo(ctx: &Ctx) -> Result<Demo> {
    let (fixture, config) = demo_fixture();
    let resources = demo_resources();
    let dir = fixture.plugin_dir();
    let (kubelet, mut obs) = kubelet(&dir)?;
    let host = ctx.start(&fixture, &config)?;
    expect(
        &mut obs,
        &host,
        "10 resources",
        Duration::from_secs(30),
        |o| o.all_streaming(&resources),
    )
    .await?;
    Ok(Demo {
        fixture,
        resources,
        dir,
        kubelet,
        obs,
        host,
    })
}

/// Waits for a condition; on failure the host's log goes with the error.
pub async fn expect(
    obs: &mut Seen,
    host: &Host,
    what: &str,
    timeout: Duration,
    done: impl FnMut(&Seen) -> bool,
) -> Result<Instant> {
    obs.wait(what, timeout, done)
        .await
        .map_err(|e| anyhow::Error::new(e).context(format!("log (tail):\n{}", host.log_tail(30))))
}

/// Waits until `host`'s log has `line`, at most `timeout`.
pub async fn expect_log(host: &Host, line: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !host.log().contains(line) {
        if Instant::now() >= deadline {
            anyhow::bail!(
                "{line:?} not logged within {timeout:?}; log (tail):\n{}",
                host.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// After a host stops, waits until the stand-in saw every stream end (at most 5 s).
pub async fn expect_quiet(obs: &mut Seen, resources: &[String]) {
    let _ = obs
        .wait("streams ended", Duration::from_secs(5), |o| {
            resources.iter().all(|r| o.has_ended(r))
        })
        .await;
}

/// `n` milliseconds (targets and jitter read better in the unit they are written in).
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` microseconds.
pub fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}
