//! The one wasmtime [`Engine`] of a host process, and the clock that interrupts guests.
//!
//! CPU limits use epoch interruption: a ticker thread bumps the engine's epoch every [`TICK`], and
//! every store's deadline callback decides whether its guest yields, continues or is stopped (see
//! `state::CpuBudget`). Epochs cost a few percent of guest speed, much less than fuel.

use std::time::Duration;

use wasmtime::{Config, Engine, OptLevel};

/// How often the epoch advances: the granularity of guest CPU accounting and of yields to tokio.
pub const TICK: Duration = Duration::from_millis(10);

/// Wasm stack a guest may use: deep recursion traps instead of growing without bound.
const MAX_WASM_STACK: usize = 1 << 20;

/// Builds the engine and starts its epoch ticker.
///
/// The ticker holds only a weak reference, so it ends on its own once the engine is dropped.
pub fn new_engine() -> wasmtime::Result<Engine> {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK)
        .cranelift_opt_level(OptLevel::Speed);
    let engine = Engine::new(&config)?;
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wdp-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(TICK);
            }
        })
        .map_err(|e| wasmtime::format_err!("cannot start the epoch ticker thread: {e}"))?;
    Ok(engine)
}
