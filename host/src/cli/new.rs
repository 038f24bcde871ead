//! `wdp new`: writes a standalone scanner project (see [`crate::scaffold`]).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::scaffold::{self, Lang, Options, toolchain};

/// Start a scanner project: source, contract, build, fixture, test and README, in one language.
///
/// The scanner serves every character device under /dev matching the glob in its DEVICE_GLOB
/// variable (default /dev/NAME*), Healthy or Unhealthy, with a post-allocator when asked. The
/// project builds with its language's own tools only, offline from the wdp repository: the WIT
/// (and for Rust the wdp-guest SDK) it gets are the ones this wdp was built with.
///
/// What each language needs installed (checked before anything is written):
///   rust    cargo with the wasm32-wasip1 and wasm32-wasip2 targets, cargo-component 0.21
///   python  python3, componentize-py 0.25
///   js      node 20+ and npm (componentize-js and jco come as dev dependencies)
///   c       clang + lld + wasi-libc, wit-bindgen (cli) 0.63, wasm-tools, make, and the
///           wasi_snapshot_preview1 reactor adapter
///
/// Every project's README gives its four commands: build, test (`wdp scan` over its fixture
/// against the expected tree), dry-run, push.
///
/// Example: wdp new acme-scanner --lang rust --name acme --with-post-allocator
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct NewArgs {
    /// Where to write the project: a new or empty directory.
    dir: PathBuf,

    /// The language.
    #[arg(long, value_enum)]
    lang: Lang,

    /// The scanner's name: its device type (kubelet sees <namespace>/NAME) and file names
    /// [default: DIR's name].
    #[arg(long)]
    name: Option<String>,

    /// Export a post-allocator as well: it sets NAME_DEVICES in each container to the ids of
    /// the devices it was given (world device-plugin instead of scanner-plugin).
    #[arg(long)]
    with_post_allocator: bool,
}

pub async fn run(args: NewArgs) -> anyhow::Result<ExitCode> {
    let name = match args.name {
        Some(n) => n,
        None => args
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    scaffold::check_name(&name)?;
    let missing = toolchain::missing(args.lang, std::env::var_os("PATH").as_deref());
    if !missing.is_empty() {
        let list: Vec<String> = missing
            .iter()
            .map(|t| format!("  {}: {}", t.program, t.install))
            .collect();
        anyhow::bail!(
            "a {} scanner's build needs tools that are not on PATH:\n{}",
            args.lang.name(),
            list.join("\n")
        );
    }
    let options = Options {
        name,
        lang: args.lang,
        post_allocator: args.with_post_allocator,
    };
    let written = scaffold::write(&args.dir, &options)?;
    println!(
        "wrote {} files into {} ({} scanner {:?}{})",
        written.len(),
        args.dir.display(),
        args.lang.name(),
        options.name,
        if options.post_allocator {
            " with a post-allocator"
        } else {
            ""
        }
    );
    println!(
        "next: cd {} && {}   (README.md has the rest)",
        args.dir.display(),
        options.build_command()
    );
    Ok(ExitCode::SUCCESS)
}
