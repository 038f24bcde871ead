//! The wasm sandbox: two engines and linkers per host (scanners' instances mapped as they come,
//! hooks' from a pool: `engine::hook_engine`), one store per guest instance.
//!
//! What a guest gets, and nothing more:
//! - `/sys`: the host's sys root as a read-only WASI preopen (the whole tree, because sysfs links
//!   are relative and would otherwise point outside the preopen);
//! - `/dev`: metadata only, through the `devfs` import ([`crate::hostfs`]);
//! - the environment variables its configuration names, no arguments, no stdin, no network;
//! - stdout/stderr as rate-limited log lines ([`output`]);
//! - a memory cap, a CPU budget enforced with epoch interruption, and a deadline on hook calls.

pub mod blocking;
pub mod compile_cache;
mod engine;
mod lift;
mod limits;
mod open_guard;
pub mod output;
mod recording;
pub mod rescans;
mod sink;
mod state;
pub mod uevent;
pub mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{Component, HasSelf, InstancePre, Linker};
use wasmtime::{Engine, Store};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

pub use engine::{Clock, HookPool, Running, TICK, Waiting};
pub use sink::{SinkClosed, TreeSink};
pub use state::{CpuBudget, GuestState, Stopped, describe};

use self::output::{GuestOutput, Stream};
use self::watch::ChangeWatcher;
use crate::bindings;
use crate::hostfs::DevFs;
use crate::hostfs::batch::SysView;
use crate::hostfs::sys::{RecordedSys, SysDir, SysReads};
use crate::metrics::ScannerMetrics;

/// Per-guest resource limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestLimits {
    /// Cap on each linear memory of the guest, in bytes.
    pub memory: u64,
    /// Longest a guest may compute without calling the host, and the deadline of each hook call.
    pub call_timeout: Duration,
}

impl Default for GuestLimits {
    fn default() -> Self {
        GuestLimits {
            memory: 64 << 20,
            call_timeout: Duration::from_secs(5),
        }
    }
}

/// A guest as the sandbox runs it: its name, what it is given, and the live counters each of its
/// instances (and hooks) update.
#[derive(Debug, Clone)]
pub struct Guest {
    /// Name used in logs and errors.
    pub name: Arc<str>,
    /// The guest's whole environment.
    pub env: Vec<(String, String)>,
    /// Memory and CPU limits.
    pub limits: GuestLimits,
    /// Its counters.
    pub metrics: Arc<ScannerMetrics>,
    /// Its filesystem host calls still running, abandoned ones included: shared by all its
    /// instances, so restarting cannot shed the threads its blocked reads hold.
    pub host_calls: Arc<blocking::HostCalls>,
}

impl Guest {
    /// A guest with the default limits.
    pub fn new(name: &str, env: Vec<(String, String)>) -> Self {
        Guest {
            name: name.into(),
            env,
            limits: GuestLimits::default(),
            metrics: Arc::default(),
            host_calls: Arc::default(),
        }
    }
}

/// Where a sandbox's guests see /sys and /dev from.
#[derive(Debug, Clone)]
pub struct Roots {
    /// The sys root (normally `/sys`).
    pub sys: PathBuf,
    /// The dev root (normally `/dev`).
    pub dev: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            sys: "/sys".into(),
            dev: "/dev".into(),
        }
    }
}

/// What callers change in a sandbox: `wdp snapshot` and its replay the first three, `wdp run`
/// the hooks' pool.
#[derive(Default)]
pub struct SandboxOptions {
    /// Keep compiled components here across runs.
    pub compile_cache: Option<compile_cache::CompileCache>,
    /// Serve /dev from this instead of opening the dev root (a replayed snapshot's table).
    pub devfs: Option<DevFs>,
    /// Note every path guests (and the host for them) ask about under /sys and /dev.
    pub recorder: Option<Arc<crate::hostfs::record::Recorder>>,
    /// How many hook instances may exist at once (`wdp run` sizes it from its configuration).
    pub hook_pool: HookPool,
}

/// Errors setting up the sandbox or loading a component.
///
/// Each message carries its cause whole (a wasmtime error with its chain): the cause is not also
/// a `source`, so `{:#}` at the edges prints it once.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot open the dev root {path}: {error}")]
    /// The dev root cannot be opened.
    DevRoot {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error, whole.
        error: std::io::Error,
    },
    #[error("cannot use the sys root {path}: {error}")]
    /// The sys root cannot be used.
    SysRoot {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error, whole.
        error: std::io::Error,
    },
    #[error("cannot read component {path}: {error}")]
    /// The component file cannot be read.
    Read {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error, whole.
        error: std::io::Error,
    },
    #[error(
        "{path} is not a valid wasm component: it is a core wasm module ({})",
        wdp_oci::contract::CORE_MODULE_REMEDY
    )]
    /// A core module, not a component.
    CoreModule {
        /// The path concerned.
        path: PathBuf,
    },
    #[error(
        "{path} is not a valid wasm component: it is not WebAssembly at all (no `\\0asm` header; build it for wasm32-wasip2)"
    )]
    /// Not WebAssembly.
    NotWasm {
        /// The path concerned.
        path: PathBuf,
    },
    #[error("{path} is not a valid wasm component (build it for wasm32-wasip2): {error:#}")]
    /// wasmtime refused to compile it.
    Compile {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error, whole.
        error: wasmtime::Error,
    },
    #[error("{path} is refused: {error}")]
    /// It speaks a contract version this host does not.
    Contract {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error, whole.
        error: wdp_oci::contract::ContractError,
    },
    #[error("{path} needs imports this host does not provide: {error:#}")]
    /// It imports what the host does not provide.
    Link {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error, whole.
        error: wasmtime::Error,
    },
    #[error("{path} does not export {export}: {error:#}")]
    /// It lacks an export its role needs.
    MissingExport {
        /// The path concerned.
        path: PathBuf,
        /// The export it lacks.
        export: &'static str,
        /// The underlying error, whole.
        error: wasmtime::Error,
    },
    #[error("wasmtime: {0:#}")]
    /// wasmtime itself failed.
    Engine(wasmtime::Error),
}

/// Refuses what is not a component this host can run, saying what it is instead, before
/// anything compiles it: `wdp run` and `wdp precompile` refuse the same files with the same
/// words.
pub fn check_component(path: &Path, bytes: &[u8]) -> Result<(), SandboxError> {
    // wasmtime's own message for these is the parser's, with the expected header dumped byte by
    // byte: say what the file is instead.
    if !wasmparser::Parser::is_component(bytes) {
        let path = path.to_path_buf();
        return Err(if wasmparser::Parser::is_core_wasm(bytes) {
            SandboxError::CoreModule { path }
        } else {
            SandboxError::NotWasm { path }
        });
    }
    // A contract version this host does not speak is named here, before a compile that would
    // only end in a bare "import not found".
    if let Ok(world) = wdp_oci::artifact::ComponentWorld::of(bytes) {
        let names = world.imports.iter().chain(&world.exports);
        wdp_oci::contract::check(names.map(String::as_str)).map_err(|error| {
            SandboxError::Contract {
                path: path.to_path_buf(),
                error,
            }
        })?;
    }
    Ok(())
}

/// An engine configured exactly as every sandbox's, for compiling only (no epoch ticker): what
/// `wdp precompile` writes is then named and accepted as the compile cache of `wdp run` expects.
pub fn compile_engine() -> Result<Engine, SandboxError> {
    engine::compile_engine().map_err(SandboxError::Engine)
}

/// The engine, the linker and the host resources all guests share.
pub struct Sandbox {
    engine: Engine,
    /// Hook instances' engine: the scanners' settings, instances from a pool ([`HookPool`]).
    hook_engine: Engine,
    hook_linker: Linker<GuestState>,
    /// One permit per slot of the hooks' pool: a call holds one while its store lives.
    hook_slots: Arc<tokio::sync::Semaphore>,
    /// One permit per slot of the pool kept for spare instances ([`HookPool::spares`]): a spare
    /// holds one from when it is made until the call that takes it ends.
    hook_spares: Arc<tokio::sync::Semaphore>,
    hook_pool: HookPool,
    clock: Arc<Clock>,
    rescans: Arc<rescans::Rescans>,
    compile_cache: Option<compile_cache::CompileCache>,
    linker: Linker<GuestState>,
    roots: Roots,
    devfs: Arc<DevFs>,
    sys_reads: Arc<dyn SysReads>,
    /// The guests' /sys as `hostfs` reads it.
    sys_view: Arc<SysView>,
    changes: ChangeWatcher,
}

impl Sandbox {
    /// Builds the sandbox over `roots`, compiling every component afresh. Must run inside a tokio
    /// runtime (change watching).
    pub fn new(roots: Roots) -> Result<Arc<Self>, SandboxError> {
        Self::with_compile_cache(roots, None)
    }

    /// Like [`Sandbox::new`], keeping compiled components in `cache` across runs.
    pub fn with_compile_cache(
        roots: Roots,
        cache: Option<compile_cache::CompileCache>,
    ) -> Result<Arc<Self>, SandboxError> {
        Self::with_options(
            roots,
            SandboxOptions {
                compile_cache: cache,
                ..SandboxOptions::default()
            },
        )
    }

    /// The sandbox of `wdp run`, `wdp snapshot` and `wdp scan --from-snapshot`: like
    /// [`Sandbox::with_compile_cache`], with the extras `options` names.
    pub fn with_options(roots: Roots, options: SandboxOptions) -> Result<Arc<Self>, SandboxError> {
        let SandboxOptions {
            compile_cache: cache,
            devfs,
            recorder,
            hook_pool,
        } = options;
        let devfs = match devfs {
            Some(devfs) => devfs,
            None => DevFs::open(&roots.dev).map_err(|error| SandboxError::DevRoot {
                path: roots.dev.clone(),
                error,
            })?,
        };
        let sys_reads: Arc<dyn SysReads> = Arc::new(SysDir::new(&roots.sys));
        let (devfs, sys_reads) = match &recorder {
            Some(r) => (
                devfs.recording(r.clone()),
                Arc::new(RecordedSys::new(sys_reads, r.clone())) as Arc<dyn SysReads>,
            ),
            None => (devfs, sys_reads),
        };
        std::fs::read_dir(&roots.sys).map_err(|error| SandboxError::SysRoot {
            path: roots.sys.clone(),
            error,
        })?;
        let sys_view =
            SysView::open(&roots.sys, recorder.clone()).map_err(|error| SandboxError::SysRoot {
                path: roots.sys.clone(),
                error,
            })?;
        let (engine, hook_engine, clock) =
            engine::new_engines(hook_pool).map_err(SandboxError::Engine)?;
        let linker = Self::linker(&engine, recorder.clone()).map_err(SandboxError::Engine)?;
        let hook_linker = Self::linker(&hook_engine, recorder).map_err(SandboxError::Engine)?;
        let changes = ChangeWatcher::start(&roots.dev, &roots.sys, devfs.listings());
        Ok(Arc::new(Sandbox {
            engine,
            hook_engine,
            hook_linker,
            hook_slots: Arc::new(tokio::sync::Semaphore::new(hook_pool.slots as usize)),
            hook_spares: Arc::new(tokio::sync::Semaphore::new(hook_pool.spares() as usize)),
            hook_pool,
            clock,
            rescans: Arc::default(),
            compile_cache: cache,
            linker,
            roots,
            devfs: Arc::new(devfs),
            sys_reads,
            sys_view: Arc::new(sys_view),
            changes,
        }))
    }

    /// The host's imports, for guests of `engine`.
    fn linker(
        engine: &Engine,
        recorder: Option<Arc<crate::hostfs::record::Recorder>>,
    ) -> wasmtime::Result<Linker<GuestState>> {
        let mut linker = Linker::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        open_guard::install(&mut linker)?;
        if let Some(r) = recorder {
            recording::install(&mut linker, r)?;
        }
        bindings::scanner::ScannerPlugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        lift::install(&mut linker)?;
        Ok(linker)
    }

    /// The safety rescans of every scanner this sandbox runs, as they start.
    pub fn rescans(&self) -> Arc<rescans::Rescans> {
        self.rescans.clone()
    }

    /// The roots guests see.
    pub fn roots(&self) -> &Roots {
        &self.roots
    }

    /// The epoch clock, for its tick count: every store counts as running while it lives.
    pub fn clock(&self) -> &Arc<Clock> {
        &self.clock
    }

    /// What the host reads under the sys root for its guests (NUMA affinity); recorded when
    /// the sandbox records.
    pub fn sys_reads(&self) -> &Arc<dyn SysReads> {
        &self.sys_reads
    }

    /// The confined view of the dev root, for checking what guests return.
    pub fn devfs(&self) -> &Arc<DevFs> {
        &self.devfs
    }

    /// Reads and compiles a component file for the scanners' engine. Compiling is CPU-heavy
    /// (milliseconds for Rust guests, seconds for Python), so it runs on the blocking pool.
    pub async fn load(&self, path: &Path) -> Result<LoadedComponent, SandboxError> {
        self.load_into(path, &self.engine, &self.linker).await
    }

    /// Reads and compiles a hook component for the hooks' engine, whose instances come from the
    /// pool. A component the pool cannot hold (more memories, tables or core instances than a
    /// slot has, or larger ones) is loaded for the scanners' engine instead, whose instances are
    /// mapped per call: it runs as well, only without the pool.
    pub async fn load_hooks(&self, path: &Path) -> Result<LoadedComponent, SandboxError> {
        match self
            .load_into(path, &self.hook_engine, &self.hook_linker)
            .await
        {
            Ok(component) => Ok(component),
            Err(pooled) => {
                // The engines differ only in where instances come from: if the scanners' takes
                // the component, the pool's limits refused it; if not, its own error says why.
                let component = self.load(path).await?;
                tracing::warn!(
                    component = %path.display(),
                    error = %pooled,
                    "the hook component does not fit the hooks' instance pool: its instances are mapped per call"
                );
                Ok(component)
            }
        }
    }

    /// Whether instances of `component` come from the hooks' pool: loaded with
    /// [`Sandbox::load_hooks`] and fitting a slot.
    pub fn is_pooled(&self, component: &LoadedComponent) -> bool {
        Engine::same(component.pre.engine(), &self.hook_engine)
    }

    /// A slot of the hooks' pool for one instance of `component`, held until the instance's
    /// store is dropped: `None` when `component` is not from the pool. Waits while every slot is
    /// taken (the caller bounds the wait).
    pub async fn hook_slot(
        &self,
        component: &LoadedComponent,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if !self.is_pooled(component) {
            return None;
        }
        // The semaphore is never closed, so acquiring only waits.
        self.hook_slots.clone().acquire_owned().await.ok()
    }

    /// A slot of the hooks' pool for a spare instance of `component`, if one is free now: a
    /// spare is made ahead of need, so it never waits, and never takes a slot a call could wait
    /// for. `None` as well when `component` is not from the pool (instances mapped per call are
    /// not made ahead).
    pub fn spare_slot(
        &self,
        component: &LoadedComponent,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if !self.is_pooled(component) {
            return None;
        }
        self.hook_spares.clone().try_acquire_owned().ok()
    }

    /// The size of the hooks' pool.
    pub fn hook_pool(&self) -> HookPool {
        self.hook_pool
    }

    /// The hooks' engine, for its pool's figures (`pooling_allocator_metrics`).
    pub fn hook_engine(&self) -> &Engine {
        &self.hook_engine
    }

    async fn load_into(
        &self,
        path: &Path,
        engine: &Engine,
        linker: &Linker<GuestState>,
    ) -> Result<LoadedComponent, SandboxError> {
        let bytes = tokio::fs::read(path)
            .await
            .map_err(|error| SandboxError::Read {
                path: path.to_path_buf(),
                error,
            })?;
        check_component(path, &bytes)?;
        let engine = engine.clone();
        let cache = self.compile_cache.clone();
        let started = std::time::Instant::now();
        let compiled = tokio::task::spawn_blocking(move || match cache {
            Some(cache) => cache.load(&engine, &bytes),
            None => Component::new(&engine, &bytes).map(|c| (c, compile_cache::CacheOutcome::Miss)),
        })
        .await
        .map_err(|e| SandboxError::Engine(wasmtime::format_err!("compile task failed: {e}")))?;
        let (component, outcome) = compiled.map_err(|error| SandboxError::Compile {
            path: path.to_path_buf(),
            error,
        })?;
        tracing::info!(
            component = %path.display(),
            elapsed = ?started.elapsed(),
            cache = ?outcome,
            "{}",
            match outcome {
                compile_cache::CacheOutcome::Precompiled => "component loaded from the precompiled components",
                compile_cache::CacheOutcome::Hit => "component loaded from the compiled-component cache",
                compile_cache::CacheOutcome::Miss | compile_cache::CacheOutcome::Rebuilt => "component compiled",
            }
        );
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|error| SandboxError::Link {
                path: path.to_path_buf(),
                error,
            })?;
        Ok(LoadedComponent {
            path: path.to_path_buf(),
            pre,
        })
    }

    /// A fresh store for one scanner instance of `guest`. `sink` receives its notified trees.
    /// The store holds the clock's [`Running`] guard until it is dropped, so the guest's CPU
    /// budget is enforced whenever it can execute.
    pub fn store(
        &self,
        guest: &Guest,
        sink: Box<dyn TreeSink>,
    ) -> Result<Store<GuestState>, SandboxError> {
        self.store_in(&self.engine, guest, Some(sink))
    }

    /// A fresh store for one hook instance of `guest` from `component`, on the engine it was
    /// loaded for (from the hooks' pool, unless it did not fit: [`Sandbox::load_hooks`]).
    pub fn hook_store(
        &self,
        guest: &Guest,
        component: &LoadedComponent,
    ) -> Result<Store<GuestState>, SandboxError> {
        self.store_in(component.pre.engine(), guest, None)
    }

    fn store_in(
        &self,
        engine: &Engine,
        guest: &Guest,
        sink: Option<Box<dyn TreeSink>>,
    ) -> Result<Store<GuestState>, SandboxError> {
        let stderr = GuestOutput::new(guest.name.clone(), Stream::Stderr);
        let mut wasi = WasiCtxBuilder::new();
        wasi.envs(&guest.env)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .stdout(GuestOutput::new(guest.name.clone(), Stream::Stdout))
            .stderr(stderr.clone())
            .preopened_dir(&self.roots.sys, "/sys", FsPerms::ReadOnly)
            .map_err(|e| SandboxError::SysRoot {
                path: self.roots.sys.clone(),
                error: std::io::Error::other(e.to_string()),
            })?;
        let limits = limits::GuestLimiter {
            memory: usize::try_from(guest.limits.memory).unwrap_or(usize::MAX),
            usage: sink.is_some().then(|| guest.metrics.clone()),
        };
        let state = GuestState {
            guest: guest.clone(),
            wasi: wasi.build(),
            table: Default::default(),
            limits,
            devfs: self.devfs.clone(),
            sys: self.sys_view.clone(),
            changes: self.changes.subscribe(),
            sink,
            cpu: CpuBudget::new(guest.limits.call_timeout),
            stderr,
            clock: self.clock.clone(),
            rescans: self.rescans.clone(),
            _running: self.clock.running(),
        };
        let mut store = Store::new(engine, state);
        store.limiter(|s| &mut s.limits);
        // What one host call may copy out of the guest (wasmtime's default is 128 MiB, eight
        // times a 16 MiB guest): aliased strings make it many times what the guest holds.
        store.set_hostcall_fuel(usize::try_from(guest.limits.memory).unwrap_or(usize::MAX));
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| ctx.data_mut().cpu.on_tick());
        store.call_hook(|mut ctx, hook| {
            ctx.data_mut().cpu.on_call(hook);
            Ok(())
        });
        Ok(store)
    }
}

/// A compiled component, linked against the host and ready to instantiate many times.
#[derive(Clone)]
pub struct LoadedComponent {
    path: PathBuf,
    pre: InstancePre<GuestState>,
}

impl LoadedComponent {
    /// The file it came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks that it exports `scanner`.
    pub fn scanner(&self) -> Result<bindings::scanner::ScannerPluginPre<GuestState>, SandboxError> {
        bindings::scanner::ScannerPluginPre::new(self.pre.clone()).map_err(|error| {
            SandboxError::MissingExport {
                path: self.path.clone(),
                export: "wdp:device-plugin/scanner",
                error,
            }
        })
    }

    /// The `post-allocator` export, if any.
    pub fn post_allocator(
        &self,
    ) -> Option<bindings::post_allocator::PostAllocatorPluginPre<GuestState>> {
        bindings::post_allocator::PostAllocatorPluginPre::new(self.pre.clone()).ok()
    }

    /// The `preferred-allocator` export, if any.
    pub fn preferred_allocator(
        &self,
    ) -> Option<bindings::preferred_allocator::PreferredAllocatorPluginPre<GuestState>> {
        bindings::preferred_allocator::PreferredAllocatorPluginPre::new(self.pre.clone()).ok()
    }

    /// What every hook instance is made from.
    pub(crate) fn instance_pre(&self) -> &InstancePre<GuestState> {
        &self.pre
    }

    /// The `pre-starter` export, if any.
    pub fn pre_starter(&self) -> Option<bindings::pre_starter::PreStarterPluginPre<GuestState>> {
        bindings::pre_starter::PreStarterPluginPre::new(self.pre.clone()).ok()
    }
}
