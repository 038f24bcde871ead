//! What one guest instance owns: its WASI context, its limits, and the host side of the WIT
//! imports (`notifier`, `devfs`, `hostfs`).
//!
//! A `GuestState` lives in exactly one `Store`, and a store runs exactly one instance: after a
//! trap or a cancelled call the instance is poisoned, so the supervisor drops the whole store and
//! builds a new one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use wasmtime::component::ResourceTable;
use wasmtime::{Trap, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::engine::TICK;
use super::sink::TreeSink;
use crate::bindings::{devfs, notifier, types, wit_hostfs};
use crate::hostfs::batch::{self, SysView};
use crate::hostfs::{DevFs, Node, NodeKind};

/// Why the host stopped a guest (as opposed to the guest trapping on its own).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Stopped {
    #[error("ran {0:?} of CPU without calling the host (spinning?)")]
    /// It computed this long without calling the host.
    CpuBudget(Duration),
    #[error("exceeded its memory limit of {} MiB", limit >> 20)]
    /// It grew past its memory limit.
    Memory {
        /// The limit, in bytes.
        limit: u64,
    },
    #[error("exceeded its table limit of {limit} elements")]
    /// It grew a table past its limit.
    Table {
        /// The limit, in elements.
        limit: usize,
    },
    #[error("the host stopped listening for its trees")]
    /// Nobody listens for its trees any more.
    SinkClosed,
}

/// Turns a wasmtime error into a cause an operator can act on.
pub fn describe(error: &wasmtime::Error) -> String {
    if let Some(stopped) = error.downcast_ref::<Stopped>() {
        return match stopped {
            Stopped::Memory { .. } | Stopped::Table { .. } => stopped.to_string(),
            _ => format!("stopped by the host: {stopped}"),
        };
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::StackOverflow) => "stack overflow (recursion too deep)".into(),
        // Rust guests panic by trapping on `unreachable`, after printing the panic to stderr.
        Some(Trap::UnreachableCodeReached) => {
            "trapped: unreachable instruction (a Rust guest panicked?)".into()
        }
        // Rust guests keep their stack in linear memory: overflowing it lands out of bounds.
        Some(Trap::MemoryOutOfBounds) => {
            "trapped: out-of-bounds memory access (a stack overflow in the guest?)".into()
        }
        Some(trap) => format!("trapped: {trap}"),
        None => first_line(&format!("{error:?}")),
    }
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or(text).to_string()
}

/// The store data of one guest instance.
pub struct GuestState {
    pub(crate) guest: super::Guest,
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limits: super::limits::GuestLimiter,
    pub(crate) devfs: Arc<DevFs>,
    /// /sys as `hostfs` reads it for the guest.
    pub(crate) sys: Arc<SysView>,
    pub(crate) changes: watch::Receiver<u64>,
    /// Where trees go; `None` for hook instances, which have no business notifying.
    pub(crate) sink: Option<Box<dyn TreeSink>>,
    pub(crate) cpu: CpuBudget,
    pub(crate) stderr: super::output::GuestOutput,
    /// Released while the guest waits in one of our imports, so an idle host stops ticking.
    pub(crate) clock: Arc<super::Clock>,
    /// Counts this instance as running for as long as its store lives: CPU limits hold only
    /// while the clock ticks, and a store is what a guest runs in, so no caller can run a
    /// guest without it.
    pub(crate) _running: super::Running,
}

impl GuestState {
    /// The guest's last few stderr lines: a Rust guest prints its panic message there before
    /// it traps.
    pub fn stderr_tail(&self) -> Option<String> {
        self.stderr.tail()
    }
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// CPU accounting from epoch ticks.
///
/// A guest is expected to call the host (notify, devfs, wait-for-change) between bursts of work.
/// Each epoch tick spent in wasm counts; a call into one of our imports resets the count. A gap of
/// several ticks between two callbacks means the guest was blocked in some WASI call (a sleep, a
/// read) rather than computing, so it resets the count too. A guest that computes for longer than
/// `limit` without either is stopped.
#[derive(Debug)]
pub struct CpuBudget {
    limit: Duration,
    max_ticks: u32,
    ticks: u32,
    last: Instant,
}

impl CpuBudget {
    /// A budget of `limit` of continuous computation.
    pub fn new(limit: Duration) -> Self {
        let max_ticks = (limit.as_millis() / TICK.as_millis()).clamp(1, u32::MAX as u128) as u32;
        CpuBudget {
            limit,
            max_ticks,
            ticks: 0,
            last: Instant::now(),
        }
    }

    /// The guest called the host: its computing slice ends here.
    pub fn check_in(&mut self) {
        self.ticks = 0;
        self.last = Instant::now();
    }

    /// Called from the epoch deadline callback.
    pub fn on_tick(&mut self) -> wasmtime::Result<UpdateDeadline> {
        let now = Instant::now();
        if now.duration_since(self.last) > TICK * 5 {
            self.ticks = 0;
        }
        self.last = now;
        self.ticks += 1;
        if self.ticks > self.max_ticks {
            return Err(Stopped::CpuBudget(self.limit).into());
        }
        // Yield so a busy guest never holds a tokio worker for more than a tick.
        Ok(UpdateDeadline::Yield(1))
    }
}

impl types::Host for GuestState {}

impl notifier::Host for GuestState {
    async fn notify(&mut self, tree: types::DeviceTree) -> wasmtime::Result<()> {
        self.notify_with_attributes(tree, Vec::new()).await
    }

    async fn notify_with_attributes(
        &mut self,
        tree: types::DeviceTree,
        attributes: Vec<types::DeviceAttributes>,
    ) -> wasmtime::Result<()> {
        let _waiting = self.clock.waiting();
        self.cpu.check_in();
        let Some(sink) = &mut self.sink else {
            tracing::warn!(scanner = &*self.guest.name, "a hook called notify; ignored");
            return Ok(());
        };
        // Waiting here back-pressures a guest that notifies faster than the host consumes.
        sink.notify(tree, attributes)
            .await
            .map_err(|_| Stopped::SinkClosed)?;
        self.cpu.check_in();
        Ok(())
    }
}

impl devfs::Host for GuestState {
    async fn read_dir(
        &mut self,
        path: String,
    ) -> wasmtime::Result<Result<Vec<devfs::Node>, String>> {
        let _waiting = self.clock.waiting();
        self.cpu.check_in();
        Ok(self
            .devfs
            .read_dir(&path)
            .map(|nodes| nodes.into_iter().map(to_wit).collect())
            .map_err(|e| e.to_string()))
    }

    async fn stat(&mut self, path: String) -> wasmtime::Result<Result<devfs::Node, String>> {
        let _waiting = self.clock.waiting();
        self.cpu.check_in();
        Ok(self
            .devfs
            .stat(&path)
            .map(to_wit)
            .map_err(|e| e.to_string()))
    }

    async fn read_link(&mut self, path: String) -> wasmtime::Result<Result<String, String>> {
        let _waiting = self.clock.waiting();
        self.cpu.check_in();
        Ok(self.devfs.read_link(&path).map_err(|e| e.to_string()))
    }

    async fn wait_for_change(&mut self, timeout_ms: u32) -> wasmtime::Result<bool> {
        let _waiting = self.clock.waiting();
        self.cpu.check_in();
        let timeout = Duration::from_millis(timeout_ms.into());
        let changed = match tokio::time::timeout(timeout, self.changes.changed()).await {
            Ok(Ok(())) => true,
            // The watcher is gone (inotify failed): behave as a plain sleep.
            Ok(Err(_)) => {
                tokio::time::sleep(timeout).await;
                false
            }
            Err(_) => false,
        };
        self.changes.borrow_and_update();
        self.guest.metrics.woke();
        self.cpu.check_in();
        Ok(changed)
    }
}

impl wit_hostfs::Host for GuestState {
    async fn list_dir(
        &mut self,
        path: String,
    ) -> wasmtime::Result<Result<Vec<wit_hostfs::Entry>, String>> {
        let _waiting = self.clock.waiting();
        self.cpu.check_in();
        Ok(batch::list_dir(&self.devfs, &self.sys, &path)
            .map(|entries| {
                entries
                    .into_iter()
                    .map(|e| {
                        let node = to_wit(e.node);
                        wit_hostfs::Entry {
                            name: node.name,
                            kind: node.kind,
                            mode: node.mode,
                            major: node.major,
                            minor: node.minor,
                            link_target: e.link_target,
                        }
                    })
                    .collect()
            })
            .map_err(|e| e.to_string()))
    }

    async fn read_files(
        &mut self,
        paths: Vec<String>,
    ) -> wasmtime::Result<Result<Vec<Result<String, wit_hostfs::ReadError>>, String>> {
        let _waiting = self.clock.waiting();
        self.cpu.check_in();
        Ok(self
            .sys
            .read_files(&paths)
            .map(|results| {
                results
                    .into_iter()
                    .map(|r| r.map_err(read_error_to_wit))
                    .collect()
            })
            .map_err(|e| e.to_string()))
    }
}

fn read_error_to_wit(e: batch::ReadError) -> wit_hostfs::ReadError {
    match e {
        batch::ReadError::Missing => wit_hostfs::ReadError::Missing,
        batch::ReadError::Refused => wit_hostfs::ReadError::Refused,
        batch::ReadError::NotAFile => wit_hostfs::ReadError::NotAFile,
        batch::ReadError::TooLargeOrBinary => wit_hostfs::ReadError::TooLargeOrBinary,
        batch::ReadError::Unreadable => wit_hostfs::ReadError::Unreadable,
    }
}

fn to_wit(node: Node) -> devfs::Node {
    devfs::Node {
        name: node.name,
        kind: match node.kind {
            NodeKind::CharDevice => devfs::NodeKind::CharDevice,
            NodeKind::BlockDevice => devfs::NodeKind::BlockDevice,
            NodeKind::Directory => devfs::NodeKind::Directory,
            NodeKind::Symlink => devfs::NodeKind::Symlink,
            NodeKind::File => devfs::NodeKind::File,
            NodeKind::Other => devfs::NodeKind::Other,
        },
        major: node.major,
        minor: node.minor,
        mode: node.mode,
    }
}
