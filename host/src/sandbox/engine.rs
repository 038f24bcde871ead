//! The one wasmtime [`Engine`] of a host process, and the clock that interrupts guests.
//!
//! CPU limits use epoch interruption: a ticker thread bumps the engine's epoch every [`TICK`], and
//! every store's deadline callback decides whether its guest yields, continues or is stopped (see
//! `state::CpuBudget`). Epochs cost a few percent of guest speed, much less than fuel.
//!
//! The ticker only runs while some guest may be executing wasm. A guest counts as running from
//! the moment the host calls into it until it returns, except while it waits in one of our host
//! imports (`notify`, `devfs`, `wait-for-change`). Scanners spend nearly all their time blocked in
//! `wait-for-change`, so an idle host parks the ticker and wakes no more than its scanners do.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig,
};

/// How often the epoch advances while guests run: the granularity of guest CPU accounting and
/// of yields to tokio.
pub const TICK: Duration = Duration::from_millis(10);

/// Wasm stack a guest may use: deep recursion traps instead of growing without bound.
const MAX_WASM_STACK: usize = 1 << 20;

/// Counts guests that may be executing wasm, and drives the epoch while there are any.
#[derive(Debug, Default)]
pub struct Clock {
    running: AtomicUsize,
    ticks: AtomicU64,
    wake: Mutex<()>,
    woken: Condvar,
}

/// A guest is running while this lives. Every store holds one (`Sandbox::store`), so a guest
/// can execute only while its CPU budget is enforced.
#[must_use]
pub struct Running(Arc<Clock>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A running guest is waiting in a host import while this lives (see [`Clock::waiting`]).
#[must_use]
pub struct Waiting(Arc<Clock>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.start();
    }
}

impl Clock {
    /// Marks a guest as running until the guard drops (also on cancellation). Only a store
    /// takes it (`Sandbox::store`), so running a guest and enforcing its limits go together.
    pub(crate) fn running(self: &Arc<Self>) -> Running {
        self.start();
        Running(self.clone())
    }

    /// Marks a running guest as blocked in the host until the guard drops.
    pub fn waiting(self: &Arc<Self>) -> Waiting {
        self.running.fetch_sub(1, Ordering::AcqRel);
        Waiting(self.clone())
    }

    /// Epoch ticks so far: for tests and metrics.
    pub fn ticks(&self) -> u64 {
        self.ticks.load(Ordering::Relaxed)
    }

    fn start(&self) {
        if self.running.fetch_add(1, Ordering::AcqRel) == 0 {
            let _lock = self.wake.lock();
            self.woken.notify_all();
        }
    }

    /// Blocks while no guest runs. The count is checked under the lock `start` takes to notify,
    /// so a wake-up cannot be missed.
    fn park_while_idle(&self) {
        let lock = self.wake.lock().unwrap_or_else(|p| p.into_inner());
        let _lock = self
            .woken
            .wait_while(lock, |_| self.running.load(Ordering::Acquire) == 0)
            .unwrap_or_else(|p| p.into_inner());
    }
}

/// The settings every engine of the host shares: what compiled code depends on (its hash is the
/// compile cache's key) is set here only, so a component compiled for one engine is accepted by
/// the other.
fn base_config() -> Config {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK)
        .cranelift_opt_level(OptLevel::Speed);
    config
}

/// The engine every scanner runs on, without its ticker: the one place its configuration is
/// set, so that what `wdp precompile` compiles with it matches the compile cache's key (the
/// engine's compatibility hash) under `wdp run`.
pub fn compile_engine() -> wasmtime::Result<Engine> {
    Engine::new(&base_config())
}

/// Core instances one pooled hook instance may hold: a component has one per core module it
/// instantiates (its code, the WASI adapter, wit-component's shims and fix-ups); the Python and
/// JavaScript runtimes' have the most.
const CORE_INSTANCES_PER_HOOK: u32 = 32;
/// Linear memories one pooled hook instance may hold: every toolchain the SDK documents makes
/// one. Each costs a slot's reservation (4 GiB and its guard, see [`HookPool`]), so a composed
/// component with more is served by the scanners' engine instead (`Sandbox::load_hooks`).
const MEMORIES_PER_HOOK: u32 = 1;
/// Tables one pooled hook instance may hold (one per core module that defines one).
const TABLES_PER_HOOK: u32 = 16;
/// Of a hook's linear memory, how much of what a call dirtied is reset by copying (the memory
/// image's bytes, or zeros) and stays mapped for the next call, instead of being given back with
/// `madvise`: the Rust `test_hooks` dirties 3 pages (12 KiB) per call, the rest of its memory only
/// read from the image. Giving pages back is what costs (page-table entries cleared on every CPU
/// that ran a thread of the host, then page faults on the next call); keeping them costs their
/// RSS, the pages a call dirtied and at most this much per slot that served a call.
const MEMORY_KEEP_RESIDENT: usize = 1 << 20;
/// The same for a hook's tables (8 bytes an element: 8,192 elements).
const TABLE_KEEP_RESIDENT: usize = 64 << 10;
/// The same for a hook's fiber stack, zeroed after each call: its top, where a call's frames are.
const STACK_KEEP_RESIDENT: usize = 64 << 10;

/// How many hook instances may exist at once: the size of the hook engine's pool.
///
/// Sized from the configuration the host starts with: two per scanner with hooks (kubelet admits
/// pods one at a time, so a resource's `post-allocate` and `get-preferred-allocation` never
/// overlap, while `pre-start-container` comes from the pod workers, one per starting container),
/// at least [`HookPool::MIN_SLOTS`] (a reload may add hooks) and at most [`HookPool::MAX_SLOTS`].
/// A call that finds every slot taken waits for one within its own deadline.
///
/// The memory limit of a guest does not size a slot: a slot is the 4 GiB reservation and 32 MiB
/// guard that compiled code relies on to leave out bounds checks (`Config::memory_reservation`,
/// the same for every engine, since it is part of the compiled code), and the pool's own maximum
/// size cannot shrink it. Each guest's `limits.memory` is enforced by its store's limiter, as for
/// scanners.
///
/// Beside the slots calls wait for, the pool holds [`HookPool::spares`] more, for spare
/// instances: each hook component keeps one fresh instance, made as its last call ran, so the
/// next call does not instantiate on its critical path (`crate::hooks`). A spare never takes a
/// slot a call could wait for: when none of the spares' slots is free, no spare is made.
///
/// The reservation is address space only (`PROT_NONE`), about
/// `(slots + spares) * (4 GiB + 32 MiB + 2 MiB of stack)`: at most 32 slots, 129 GiB of a 128 TiB
/// address space; an idle pool holds no memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookPool {
    /// Hook instances at once, besides the spares.
    pub slots: u32,
}

impl Default for HookPool {
    /// The pool of a configuration without hooks.
    fn default() -> Self {
        Self::for_hooked_scanners(0)
    }
}

impl HookPool {
    /// The fewest slots: a configuration without hooks may gain some on reload.
    pub const MIN_SLOTS: u32 = 2;
    /// The most slots, whatever the configuration says.
    pub const MAX_SLOTS: u32 = 16;

    /// The pool for a configuration with `hooked` scanners with hooks.
    pub fn for_hooked_scanners(hooked: usize) -> Self {
        let wanted = u32::try_from(hooked.saturating_mul(2)).unwrap_or(u32::MAX);
        HookPool {
            slots: wanted.clamp(Self::MIN_SLOTS, Self::MAX_SLOTS),
        }
    }

    /// Slots for spare instances: two per scanner with hooks the pool was sized for (as many as
    /// its slots), as a call that took its hook's spare still holds that spare's slot, with its
    /// finished store, while the hook's next spare is made (`crate::hooks`). Hooks a reload adds
    /// beyond that go without a spare when none is free.
    pub fn spares(self) -> u32 {
        self.slots
    }

    /// wasmtime's pooling configuration for these slots and the spares': every total is the
    /// slots times what one instance may hold, so an instance holding a slot
    /// (`Sandbox::hook_slot`, `Sandbox::spare_slot`) never finds the pool exhausted.
    fn allocation(self) -> PoolingAllocationConfig {
        let slots = self.slots.saturating_add(self.spares());
        // Keeping pages resident is where the pool's gain is: with nothing kept, every page a
        // call touched is dropped with `madvise` and faulted in again by the next call, and a
        // pooled hook call measured no faster than one mapped per call (criterion, 75 against
        // 69 µs; 30 µs keeping them). It needs PAGEMAP_SCAN (Linux 6.7), which finds the pages a
        // call dirtied; without it the first bytes of every memory, table and stack would be
        // rewritten (and made resident) on every call whatever it touched.
        let pagemap = PoolingAllocationConfig::is_pagemap_scan_available();
        let keep = |bytes: usize| if pagemap { bytes } else { 0 };
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(slots)
            .max_core_instances_per_component(CORE_INSTANCES_PER_HOOK)
            .total_core_instances(slots.saturating_mul(CORE_INSTANCES_PER_HOOK))
            .max_memories_per_component(MEMORIES_PER_HOOK)
            .total_memories(slots.saturating_mul(MEMORIES_PER_HOOK))
            .max_tables_per_component(TABLES_PER_HOOK)
            .total_tables(slots.saturating_mul(TABLES_PER_HOOK))
            .total_stacks(slots)
            .linear_memory_keep_resident(keep(MEMORY_KEEP_RESIDENT))
            .table_keep_resident(keep(TABLE_KEEP_RESIDENT))
            .async_stack_keep_resident(keep(STACK_KEEP_RESIDENT))
            .pagemap_scan(if pagemap { Enabled::Yes } else { Enabled::No });
        pool
    }
}

/// The engine hook instances run on: the scanners' settings, with instances from a pool of
/// [`HookPool::slots`] slots instead of mapped and unmapped per call.
///
/// A hook call still gets a fresh instance holding nothing of an earlier call; what wasmtime 48
/// does when an instance returns its slot:
/// - linear memory: reset to the module's initial image (the data segments' bytes, zeros
///   elsewhere) before the slot can be taken again: the pages the call dirtied up to
///   [`MEMORY_KEEP_RESIDENT`] are rewritten from the image, the rest are dropped with `madvise`
///   (`MADV_DONTNEED`: private pages fall back to the image's file or to zero pages), and the
///   accessible size goes back to the initial one (`mprotect`);
/// - tables: zeroed the same way (a table is filled anew at instantiation);
/// - the fiber stack: zeroed (`async_stack_zeroing`), the top [`STACK_KEEP_RESIDENT`] by
///   `memset` and the rest by `madvise`. Compiled wasm never reads a stack slot it did not
///   write, and no wasm can address the host's stack; the zeroing is there in case of a compiler
///   bug, and keeps what stacks mapped afresh per call gave;
/// - globals and the instance's own state (`VMContext`) are written anew by every
///   instantiation.
///
/// A warm instance kept from one call to the next would save the instantiation (tens of µs),
/// but its memory, globals and tables would be what the previous pod's call left there: heap and
/// statics holding that pod's device IDs and environment, and after a trap an instance that must
/// not be entered again. That would make isolation between pods' allocations depend on every
/// hook's own hygiene, so it is not done. What is done instead (`crate::hooks`) is a spare: an
/// instance made after a call, never entered before the one call that takes it.
pub fn hook_engine(pool: HookPool) -> wasmtime::Result<Engine> {
    let mut config = base_config();
    config
        .async_stack_zeroing(true)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool.allocation()));
    Engine::new(&config)
}

/// Builds the scanners' engine and the hooks' (over `pool`) and starts their epoch ticker,
/// driven by the returned [`Clock`].
///
/// The ticker holds only weak references to the engines, so it ends on its own once the
/// scanners' engine is dropped.
pub fn new_engines(pool: HookPool) -> wasmtime::Result<(Engine, Engine, Arc<Clock>)> {
    let engine = compile_engine()?;
    let hooks = hook_engine(pool)?;
    let clock = Arc::new(Clock::default());
    let weak = engine.weak();
    let weak_hooks = hooks.weak();
    let ticker = clock.clone();
    std::thread::Builder::new()
        .name("wdp-epoch".into())
        .spawn(move || {
            loop {
                ticker.park_while_idle();
                // The first tick comes a tick after a guest starts, not as it starts: a tick
                // makes a running guest yield to tokio, and a hook call that ends within its
                // first tick (most do) should not be rescheduled, maybe onto the other worker,
                // for nothing. Its CPU budget counts from its start all the same.
                std::thread::sleep(TICK);
                let Some(engine) = weak.upgrade() else { return };
                engine.increment_epoch();
                if let Some(hooks) = weak_hooks.upgrade() {
                    hooks.increment_epoch();
                }
                ticker.ticks.fetch_add(1, Ordering::Relaxed);
                drop(engine);
            }
        })
        .map_err(|e| wasmtime::format_err!("cannot start the epoch ticker thread: {e}"))?;
    Ok((engine, hooks, clock))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits up to 20 s (a loaded machine may hold the ticker thread back) for `done`.
    fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "never {what}");
            std::thread::sleep(TICK);
        }
    }

    #[test]
    fn ticks_only_while_a_guest_runs() {
        let (_engine, _hooks, clock) = new_engines(HookPool::for_hooked_scanners(0)).unwrap();
        std::thread::sleep(TICK * 10);
        assert_eq!(clock.ticks(), 0, "idle: no ticks");
        let running = clock.running();
        until("ticking while running", || clock.ticks() >= 3);
        // From here the ticker ends at most the tick it is in: it parks before the next.
        let waiting = clock.waiting();
        let parked = clock.ticks();
        std::thread::sleep(TICK * 10);
        assert!(clock.ticks() <= parked + 1, "waiting in the host: parked");
        drop(waiting);
        until("ticking back in wasm", || clock.ticks() > parked + 2);
        drop(running);
    }

    #[test]
    fn hook_pool_is_sized_from_the_hooked_scanners_within_bounds() {
        let slots = |hooked| HookPool::for_hooked_scanners(hooked).slots;
        assert_eq!(
            slots(0),
            HookPool::MIN_SLOTS,
            "room for hooks a reload adds"
        );
        assert_eq!(slots(1), 2);
        assert_eq!(slots(3), 6);
        assert_eq!(slots(8), 16);
        assert_eq!(slots(9), HookPool::MAX_SLOTS);
        assert_eq!(slots(usize::MAX), HookPool::MAX_SLOTS);
        assert_eq!(HookPool { slots: 2 }.spares(), 2, "two per hooked scanner");
        assert_eq!(HookPool { slots: 5 }.spares(), 5);
        // Five slots for calls and five for spares.
        let pool = HookPool { slots: 5 }.allocation();
        assert_eq!(pool.get_total_component_instances(), 10);
        assert_eq!(pool.get_total_stacks(), 10);
        assert_eq!(pool.get_total_memories(), 10 * MEMORIES_PER_HOOK);
        assert_eq!(pool.get_total_tables(), 10 * TABLES_PER_HOOK);
        assert_eq!(
            pool.get_total_core_instances(),
            10 * CORE_INSTANCES_PER_HOOK
        );
    }

    /// The compile cache and `wdp precompile` key compiled code by the engine's compatibility
    /// hash: the hooks' engine must read what the scanners' wrote, and the other way round.
    #[test]
    fn the_hook_engine_runs_code_compiled_for_the_scanners() {
        use std::hash::{Hash, Hasher};
        let hash = |engine: &Engine| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            engine.precompile_compatibility_hash().hash(&mut h);
            h.finish()
        };
        let scanners = compile_engine().unwrap();
        let hooks = hook_engine(HookPool { slots: 2 }).unwrap();
        assert_eq!(hash(&scanners), hash(&hooks));
    }
}
