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
use wasmtime::{CallHook, Trap, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::blocking::CallError;
use super::engine::TICK;
use super::sink::TreeSink;
use crate::bindings::{devfs, notifier, types, wit_hostfs};
use crate::hostfs::batch::{self, BatchError, Budget, SysView};
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
    #[error(
        "its notified tree would hold more than {max} bytes of host memory as lifted, its memory limit (rule tree-host-memory); refused before it was copied out"
    )]
    /// It notified a tree whose host form would exceed its memory limit ([`super::lift`]).
    TreeHostMemory {
        /// The guest's memory limit, in bytes.
        max: usize,
    },
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
        None => match not_utf8(error) {
            Some(cause) => cause,
            // The outermost context of an error from inside a call is only "error while
            // executing at wasm backtrace:": the cause is the innermost one.
            None => match error.downcast_ref::<wasmtime::WasmBacktrace>() {
                Some(_) => first_line(&error.root_cause().to_string()),
                None => first_line(&format!("{error:?}")),
            },
        },
    }
}

/// The cause of a host call the host could not even start: the guest passed a string (a path,
/// a name) that is not UTF-8, which the canonical ABI refuses while lifting the arguments, before
/// any host code runs, so the guest cannot be answered with an error value. Names the guest
/// function that made the call, where its name section says.
fn not_utf8(error: &wasmtime::Error) -> Option<String> {
    let utf8 = error.chain().find_map(|e| {
        e.downcast_ref::<std::str::Utf8Error>()
            .map(ToString::to_string)
            .or_else(|| {
                let text = e.to_string();
                text.to_ascii_lowercase().contains("utf-8").then_some(text)
            })
    })?;
    let caller = error
        .downcast_ref::<wasmtime::WasmBacktrace>()
        .and_then(|trace| trace.frames().first()?.func_name().map(str::to_owned))
        .map(|name| format!(" (called from the guest's {})", first_line(&name)))
        .unwrap_or_default();
    Some(format!(
        "passed a string that is not valid UTF-8 to a host call{caller}: {utf8}"
    ))
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
    /// Told when a wait ends at its timeout: a safety rescan follows.
    pub(crate) rescans: Arc<super::rescans::Rescans>,
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

/// CPU accounting: how long a guest has executed wasm since it last called one of our imports.
///
/// A guest is expected to call the host (notify, devfs, hostfs, wait-for-change) between bursts
/// of work; a call into one of our imports resets the count ([`CpuBudget::check_in`]). Time is
/// counted only while wasm runs: every host call, WASI's included, is bracketed by wasmtime's
/// call hooks ([`CpuBudget::on_call`]), so a guest blocked in a slow read through its /sys
/// preopen is waiting, not computing. Wall-clock intervals between hooks and epoch ticks are
/// counted, each at most one tick: after a tick the guest yields to tokio, and how long it then
/// waits for a worker is not its computation. (Thread CPU time would not do: a guest moves
/// between worker threads at every yield, and a thread's clock counts every task it ran.)
/// A host call that blocked for several ticks (a sleep, a read that waited for the device)
/// resets the count too, as a call into our imports does. A guest that computes for longer
/// than `limit` without either is stopped.
#[derive(Debug)]
pub struct CpuBudget {
    limit: Duration,
    /// Wasm time counted since the last check-in.
    computed: Duration,
    /// Start of the interval being counted: the guest was last seen entering or running wasm.
    since: Instant,
    /// When the host call the guest is in began.
    in_host: Option<Instant>,
}

/// A host call longer than this means the guest was blocked, not computing.
const BLOCKED: Duration = Duration::from_millis(TICK.as_millis() as u64 * 5);

impl CpuBudget {
    /// A budget of `limit` of continuous computation.
    pub fn new(limit: Duration) -> Self {
        CpuBudget {
            limit,
            computed: Duration::ZERO,
            since: Instant::now(),
            in_host: None,
        }
    }

    /// The guest called one of our imports: its computing slice ends here.
    pub fn check_in(&mut self) {
        self.computed = Duration::ZERO;
        self.since = Instant::now();
    }

    /// Called from the store's call hook, on every crossing between wasm and the host.
    pub fn on_call(&mut self, hook: CallHook) {
        self.on_call_at(hook, Instant::now());
    }

    fn on_call_at(&mut self, hook: CallHook, now: Instant) {
        match hook {
            CallHook::CallingHost | CallHook::ReturningFromWasm => {
                self.count_until(now);
                if matches!(hook, CallHook::CallingHost) {
                    self.in_host = Some(now);
                }
            }
            CallHook::ReturningFromHost | CallHook::CallingWasm => {
                if let Some(entered) = self.in_host.take()
                    && now.duration_since(entered) > BLOCKED
                {
                    self.computed = Duration::ZERO;
                }
                self.since = now;
            }
        }
    }

    fn count_until(&mut self, now: Instant) {
        self.computed += now.duration_since(self.since).min(TICK);
        self.since = now;
    }

    /// Called from the epoch deadline callback.
    pub fn on_tick(&mut self) -> wasmtime::Result<UpdateDeadline> {
        self.on_tick_at(Instant::now())
    }

    fn on_tick_at(&mut self, now: Instant) -> wasmtime::Result<UpdateDeadline> {
        self.count_until(now);
        if self.computed > self.limit {
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

    /// Not reached from a guest (`super::lift` shadows it): a tree from elsewhere is charged
    /// here, as the lift would have charged it.
    async fn notify_with_attributes(
        &mut self,
        tree: types::DeviceTree,
        attributes: Vec<types::DeviceAttributes>,
    ) -> wasmtime::Result<()> {
        let bytes = crate::footprint::lifted_bytes(&tree, &attributes);
        self.notified(tree, attributes, bytes).await
    }

    /// Not reached from a guest (`super::lift` shadows it), as `notify_with_attributes`.
    async fn notify_changes(
        &mut self,
        changes: Vec<types::GroupChanges>,
        attributes: Vec<types::DeviceAttributes>,
    ) -> wasmtime::Result<bool> {
        let bytes = crate::footprint::changes_bytes(&changes, &attributes);
        self.changed(changes, attributes, bytes).await
    }
}

impl GuestState {
    /// A tree lifted out of the guest, its host form charged at `bytes`: handed to the sink.
    pub(crate) async fn notified(
        &mut self,
        tree: types::DeviceTree,
        attributes: Vec<types::DeviceAttributes>,
        bytes: usize,
    ) -> wasmtime::Result<()> {
        let _waiting = self.clock.waiting();
        self.cpu.check_in();
        let Some(sink) = &mut self.sink else {
            tracing::warn!(scanner = &*self.guest.name, "a hook called notify; ignored");
            return Ok(());
        };
        // Waiting here back-pressures a guest that notifies faster than the host consumes.
        sink.notify(tree, attributes, bytes)
            .await
            .map_err(|_| Stopped::SinkClosed)?;
        self.cpu.check_in();
        Ok(())
    }

    /// Changes lifted out of the guest, their host form charged at `bytes`: handed to the sink,
    /// which says whether it holds the tree they apply to.
    pub(crate) async fn changed(
        &mut self,
        changes: Vec<types::GroupChanges>,
        attributes: Vec<types::DeviceAttributes>,
        bytes: usize,
    ) -> wasmtime::Result<bool> {
        let _waiting = self.clock.waiting();
        self.cpu.check_in();
        let Some(sink) = &mut self.sink else {
            tracing::warn!(
                scanner = &*self.guest.name,
                "a hook called notify-changes; ignored"
            );
            return Ok(false);
        };
        let applied = sink
            .changes(changes, attributes, bytes)
            .await
            .map_err(|_| Stopped::SinkClosed)?;
        self.cpu.check_in();
        Ok(applied)
    }

    /// Runs a filesystem host call off the async workers, within the scanner's call-timeout
    /// and a share of its memory limit ([`super::blocking`], [`Budget`]). The guest counts as
    /// waiting, not computing, meanwhile.
    async fn blocking<R: Send + 'static>(
        &mut self,
        call: &'static str,
        work: impl FnOnce(Budget) -> Result<R, String> + Send + 'static,
    ) -> Result<R, String> {
        let _waiting = self.clock.waiting();
        self.cpu.check_in();
        let memory = self.guest.limits.memory;
        let answer = self
            .guest
            .host_calls
            .run(call, self.guest.limits.call_timeout, move |until| {
                work(Budget::for_guest(memory, until))
            })
            .await;
        self.cpu.check_in();
        match answer {
            Ok(answer) => answer,
            Err(e) => {
                if let CallError::Deadline { .. } = e {
                    tracing::warn!(scanner = &*self.guest.name, "{e}");
                }
                Err(e.to_string())
            }
        }
    }
}

impl devfs::Host for GuestState {
    async fn read_dir(
        &mut self,
        path: String,
    ) -> wasmtime::Result<Result<Vec<devfs::Node>, String>> {
        let devfs = self.devfs.clone();
        Ok(self
            .blocking("devfs.read-dir", move |budget| {
                let nodes = devfs.read_dir(&path).map_err(|e| e.to_string())?;
                within(&budget, &nodes, &[])?;
                Ok(nodes.into_iter().map(to_wit).collect())
            })
            .await)
    }

    async fn read_dir_changes(
        &mut self,
        path: String,
        since: u64,
    ) -> wasmtime::Result<Result<devfs::DirChanges, String>> {
        let devfs = self.devfs.clone();
        Ok(self
            .blocking("devfs.read-dir-changes", move |budget| {
                let changes = devfs
                    .read_dir_changes(&path, since)
                    .map_err(|e| e.to_string())?;
                within(&budget, &changes.changed, &changes.removed)?;
                Ok(devfs::DirChanges {
                    version: changes.version,
                    whole: changes.whole,
                    changed: changes.changed.into_iter().map(to_wit).collect(),
                    removed: changes.removed,
                })
            })
            .await)
    }

    async fn stat(&mut self, path: String) -> wasmtime::Result<Result<devfs::Node, String>> {
        let devfs = self.devfs.clone();
        Ok(self
            .blocking("devfs.stat", move |_| {
                devfs.stat(&path).map(to_wit).map_err(|e| e.to_string())
            })
            .await)
    }

    async fn read_link(&mut self, path: String) -> wasmtime::Result<Result<String, String>> {
        let devfs = self.devfs.clone();
        Ok(self
            .blocking("devfs.read-link", move |_| {
                devfs.read_link(&path).map_err(|e| e.to_string())
            })
            .await)
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
        if !changed {
            self.rescans.started();
        }
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
        let (devfs, sys) = (self.devfs.clone(), self.sys.clone());
        Ok(self
            .blocking("hostfs.list-dir", move |budget| {
                let entries =
                    batch::list_dir(&devfs, &sys, &path, &budget).map_err(|e| e.to_string())?;
                Ok(entries
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
                    .collect())
            })
            .await)
    }

    async fn read_files(
        &mut self,
        paths: Vec<String>,
    ) -> wasmtime::Result<Result<Vec<Result<String, wit_hostfs::ReadError>>, String>> {
        let sys = self.sys.clone();
        Ok(self
            .blocking("hostfs.read-files", move |budget| {
                let results = sys.read_files(&paths, &budget).map_err(|e| e.to_string())?;
                Ok(results
                    .into_iter()
                    .map(|r| r.map_err(read_error_to_wit))
                    .collect())
            })
            .await)
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

/// Refuses an answer of `nodes` and `names` that would take more than the guest's `budget`
/// to hand over: what the host builds for the guest is bounded by the guest's own limit.
fn within(budget: &Budget, nodes: &[Node], names: &[String]) -> Result<(), String> {
    let cost: usize = nodes
        .iter()
        .map(|n| std::mem::size_of::<Node>() + n.name.len())
        .chain(
            names
                .iter()
                .map(|n| std::mem::size_of::<String>() + n.len()),
        )
        .sum();
    if cost > budget.bytes {
        return Err(BatchError::TooLarge {
            budget: budget.bytes,
        }
        .to_string());
    }
    Ok(())
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

#[cfg(test)]
mod cpu_tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn computing_is_stopped_and_waiting_in_the_host_is_not_counted() {
        // Spinning: a tick every 10 ms of wasm, nothing else.
        let start = Instant::now();
        let mut spin = CpuBudget::new(MS * 100);
        spin.since = start;
        let stopped = (1..=20).find(|i| spin.on_tick_at(start + TICK * *i).is_err());
        assert_eq!(stopped, Some(11), "stopped once past 100 ms of computing");

        // A slow reader: 1 ms of wasm, then 14 ms blocked in a WASI read, 500 times: 7 s of
        // wall clock, 0.5 s of wasm; each resumption sees a tick.
        let mut reader = CpuBudget::new(MS * 600);
        reader.since = start;
        let mut now = start;
        for i in 0..500 {
            now += MS;
            reader.on_call_at(CallHook::CallingHost, now);
            now += MS * 14;
            reader.on_call_at(CallHook::ReturningFromHost, now);
            assert!(
                reader.on_tick_at(now).is_ok(),
                "read {i}: stopped while waiting"
            );
        }
        assert!(reader.computed <= MS * 501, "{:?}", reader.computed);

        // The same with the wasm slices long enough to exceed the budget: stopped all the same.
        let mut busy = CpuBudget::new(MS * 600);
        busy.since = start;
        let mut now = start;
        let stopped = (0..500).find(|_| {
            now += TICK;
            if busy.on_tick_at(now).is_err() {
                return true;
            }
            busy.on_call_at(CallHook::CallingHost, now);
            now += MS * 14;
            busy.on_call_at(CallHook::ReturningFromHost, now);
            false
        });
        assert_eq!(
            stopped,
            Some(60),
            "stopped after 600 ms of wasm between reads"
        );

        // A long block (a sleep) starts a new slice, as a call into our imports does.
        let mut sleeper = CpuBudget::new(MS * 100);
        sleeper.since = start;
        sleeper.on_tick_at(start + MS * 90).unwrap();
        sleeper.on_call_at(CallHook::CallingHost, start + MS * 90);
        sleeper.on_call_at(CallHook::ReturningFromHost, start + MS * 200);
        assert_eq!(sleeper.computed, Duration::ZERO);
    }
}
