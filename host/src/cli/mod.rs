//! The `wdp` command line: a thin layer over the library.

mod kubelet;
mod new;
mod oci;
mod precompile;
mod run;
mod scan;
mod snapshot;
mod status;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// WebAssembly device plugins: Kubernetes device plugins whose scanners are sandboxed wasm
/// components.
///
/// Scanners read /sys (read-only) and the metadata of /dev, and report device trees; wdp serves
/// those trees to kubelet. Start with `wdp scan --component kvm.wasm` to see what a scanner finds
/// on this machine, then `wdp run --config wdp.yaml` to serve it. `wdp new` starts a scanner
/// project of your own.
#[derive(Debug, Parser)]
#[command(name = "wdp", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,

    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    Scan(scan::ScanArgs),
    Snapshot(snapshot::SnapshotArgs),
    Run(run::RunArgs),
    Precompile(precompile::PrecompileArgs),
    Kubelet(kubelet::KubeletArgs),
    New(new::NewArgs),
    Status(status::StatusArgs),
    Push(oci::PushArgs),
    Pull(oci::PullArgs),
    Inspect(oci::InspectArgs),
    Sign(oci::SignArgs),
}

/// How long the runtime's blocking threads are waited for when the process ends.
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Entry point of the `wdp` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    limit_malloc_arenas();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("wdp")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Scan(args) => scan::run(args).await,
            Command::Snapshot(args) => snapshot::run(args).await,
            Command::Run(args) => run::run(args).await,
            Command::Precompile(args) => precompile::run(args).await,
            Command::Kubelet(args) => kubelet::run(args).await,
            Command::New(args) => new::run(args).await,
            Command::Status(args) => status::run(args).await,
            Command::Push(args) => oci::push(args).await,
            Command::Pull(args) => oci::pull(args).await,
            Command::Inspect(args) => oci::inspect(args).await,
            Command::Sign(args) => oci::sign(args).await,
        }
    });
    // Threads of the blocking pool may still be in a read that never returns (a guest's read of
    // a tracefs pipe through its preopen, abandoned): dropping the runtime would wait for them
    // for ever. Nothing else is left to finish once `block_on` has returned.
    runtime.shutdown_timeout(SHUTDOWN_WAIT);
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// How many malloc arenas glibc may make: the main one (the brk heap) and one more.
///
/// By default glibc gives each new thread an arena of its own, up to eight per core, and never
/// returns the top of any arena but the main one: `malloc_trim` skips those tops, and freeing
/// into them trims only past a threshold that large frees raise to megabytes. Each round of
/// safety rescans runs its file reads on new blocking-pool threads (the old ones exited 10 s
/// after the last round), so the rounds spread over more and more arenas and each kept its
/// touched top: an idle host with the 12 bundled scanners grew from 4.9 to 6.1 MiB anonymous over
/// ten minutes. Capped, the threads share these arenas and reuse what earlier rounds freed
/// (bench/NOTES.md has the measurements). Two rather than one, so two threads compiling on a
/// first start do not wait for each other's allocations.
#[cfg(target_env = "gnu")]
const MALLOC_ARENAS: libc::c_int = 2;

/// Caps glibc's malloc arenas at [`MALLOC_ARENAS`]; called before any other thread exists,
/// since glibc fixes the cap when a thread first needs an arena of its own. Other C libraries
/// have no such arenas: nothing to do.
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a parameter of glibc's allocator; no memory is touched.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

/// Logs go to stderr (stdout is for trees); `RUST_LOG` overrides the default `info` level.
/// Colours only on a terminal and without `NO_COLOR` (no-color.org: set and not empty): a log read
/// from a file, a pipe or `kubectl logs` carries no escape sequences.
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    // A log line that cannot be written is dropped. tracing-subscriber would otherwise report
    // it on stderr with `eprint!`, which panics when stderr is a pipe whose reader has gone (a
    // log collector restarted): the host would then die as it stops, its sockets left behind.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Parses `KEY=VALUE` for flags such as `--env`.
fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}
