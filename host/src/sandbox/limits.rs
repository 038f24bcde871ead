//! Per-guest memory and table caps.
//!
//! wasmtime's `StoreLimits` reports an overrun only as text; this limiter stops the guest with a
//! typed [`Stopped`] cause instead, so the supervisor can say exactly what happened.

use wasmtime::ResourceLimiter;

use super::state::Stopped;

/// Table elements a guest may have per table: far above what real guests use (a few thousand),
/// low enough that a runaway `table.grow` is stopped.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// The caps of one store.
#[derive(Debug, Clone, Copy)]
pub struct GuestLimiter {
    /// Bytes per linear memory.
    pub memory: usize,
}

impl ResourceLimiter for GuestLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory {
            return Err(Stopped::Memory {
                limit: self.memory as u64,
            }
            .into());
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Err(Stopped::Table {
                limit: MAX_TABLE_ELEMENTS,
            }
            .into());
        }
        Ok(true)
    }
}
