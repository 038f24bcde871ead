//! `wdp precompile`: compile components ahead of time into a directory `wdp run --precompiled`
//! loads from, so that an image's first start on a node compiles nothing it carries.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Args;

use crate::sandbox::compile_cache::{CompileCache, PrecompileError};
use crate::sandbox::{self, SandboxError};

/// Compile components ahead of time, for an image to carry and `wdp run --precompiled` to load.
///
/// Without it, the first `wdp run` on a node compiles every scanner (a fraction of a second for
/// the bundled Rust scanners, many seconds for Python or JavaScript ones), and pays that again
/// whenever its compile cache starts empty: in a new pod, which every image upgrade makes. This
/// writes, for each COMPONENT, the entry `wdp run` would write into its --compile-cache, into
/// --out; an image ships that directory read-only and `wdp run --precompiled DIR` loads from it
/// before its own cache (the wdp image carries its bundled scanners' at /usr/lib/wdp/compiled,
/// `wdp run`'s default).
///
/// The engine settings are `wdp run`'s own, so an entry is found exactly where `wdp run` would
/// look. The output is tied to this wdp version (its wasmtime and compiler settings) and to the
/// features of this machine's CPU: a node running another wdp, or whose CPU lacks a feature this
/// one has, finds no entry and compiles as it would without one. It is never wrong, only
/// slower: build the image on a machine no newer than the nodes that run it to be sure of hits.
///
/// Prints the path of each entry written. Entries already in --out are kept (another
/// component's) or replaced (the same component's).
///
/// Example: wdp precompile --out image/compiled kvm.wasm generic.wasm
#[derive(Debug, Args)]
pub struct PrecompileArgs {
    /// Directory to write the entries into (created if absent, readable by all).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,

    /// The components to compile (.wasm, built for wasm32-wasip2).
    #[arg(value_name = "COMPONENT", required = true)]
    components: Vec<PathBuf>,
}

pub async fn run(args: PrecompileArgs) -> anyhow::Result<ExitCode> {
    let engine = sandbox::compile_engine()?;
    let cache = CompileCache::new(&args.out);
    // One component after another, on this thread: nothing else runs in this command, and
    // wasmtime compiles each component's functions in parallel already.
    for component in &args.components {
        let bytes = std::fs::read(component)
            .with_context(|| format!("cannot read component {}", component.display()))?;
        sandbox::check_component(component, &bytes)?;
        let started = Instant::now();
        let entry = cache
            .precompile(&engine, &bytes)
            .map_err(|error| match error {
                PrecompileError::Compile(error) => anyhow::Error::new(SandboxError::Compile {
                    path: component.clone(),
                    error,
                }),
                write @ PrecompileError::Write { .. } => anyhow::Error::new(write),
            })?;
        tracing::info!(component = %component.display(), entry = %entry.display(), elapsed = ?started.elapsed(), "component precompiled");
        println!("{}", entry.display());
    }
    Ok(ExitCode::SUCCESS)
}
