//! Per-guest memory and table caps.
//!
//! wasmtime's `StoreLimits` reports an overrun only as text; this limiter stops the guest with a
//! typed [`Stopped`] cause instead, so the supervisor can say exactly what happened.

use std::sync::Arc;

use wasmtime::ResourceLimiter;

use super::state::Stopped;
use crate::metrics::ScannerMetrics;

/// Table elements a guest may have per table: far above what real guests use (a few thousand),
/// low enough that a runaway `table.grow` is stopped.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// The caps of one store.
#[derive(Debug, Clone)]
pub struct GuestLimiter {
    /// Bytes per linear memory.
    pub memory: usize,
    /// Where a scanner instance's memory growth is counted (`None` for hook instances, which
    /// come and go per call).
    pub usage: Option<Arc<ScannerMetrics>>,
}

impl ResourceLimiter for GuestLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory {
            return Err(Stopped::Memory {
                limit: self.memory as u64,
            }
            .into());
        }
        // Called at creation too (from 0), so the sum over the instance's memories is its size.
        // Past the memory's own maximum the growth fails after this call: not counted.
        if let Some(usage) = &self.usage
            && maximum.is_none_or(|max| desired <= max)
        {
            usage.memory_grew(desired.saturating_sub(current));
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
