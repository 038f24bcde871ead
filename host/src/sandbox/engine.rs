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

use wasmtime::{Config, Engine, OptLevel};

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

/// The engine every sandbox runs on, without its ticker: the one place its configuration is
/// set, so that what `wdp precompile` compiles with it matches the compile cache's key (the
/// engine's compatibility hash) under `wdp run`.
pub fn compile_engine() -> wasmtime::Result<Engine> {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK)
        .cranelift_opt_level(OptLevel::Speed);
    Engine::new(&config)
}

/// Builds the engine and starts its epoch ticker, driven by the returned [`Clock`].
///
/// The ticker holds only a weak reference to the engine, so it ends on its own once the engine
/// is dropped.
pub fn new_engine() -> wasmtime::Result<(Engine, Arc<Clock>)> {
    let engine = compile_engine()?;
    let clock = Arc::new(Clock::default());
    let weak = engine.weak();
    let ticker = clock.clone();
    std::thread::Builder::new()
        .name("wdp-epoch".into())
        .spawn(move || {
            loop {
                ticker.park_while_idle();
                let Some(engine) = weak.upgrade() else { return };
                engine.increment_epoch();
                ticker.ticks.fetch_add(1, Ordering::Relaxed);
                drop(engine);
                std::thread::sleep(TICK);
            }
        })
        .map_err(|e| wasmtime::format_err!("cannot start the epoch ticker thread: {e}"))?;
    Ok((engine, clock))
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
        let (_engine, clock) = new_engine().unwrap();
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
}
