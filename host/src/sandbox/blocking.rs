//! The filesystem host calls of one scanner (`devfs`, `hostfs`), run off the async workers with a
//! deadline each.
//!
//! A read of /sys or a listing can take long (a PCI `config` file costs milliseconds of device
//! access) or never end (tracefs `trace_pipe`, a hung mount). Run on a tokio worker, it would
//! stall every other scanner, the gRPC servers and the HTTP endpoint sharing that worker, and a
//! task stuck in it could not even be aborted. So each call runs on tokio's blocking pool, the
//! pool wasmtime-wasi runs the guest's own preopen reads on, and the guest waits for it
//! asynchronously: its task stays abortable, and shutdown or a reload never waits for it.
//!
//! Three bounds hold:
//! - a call that has not answered by its deadline is abandoned: the guest gets an error, and the
//!   thread, which cannot be interrupted in the kernel, finishes (or not) on its own;
//! - a scanner has at most [`MAX_OUTSTANDING`] calls on the pool at once, abandoned ones
//!   included, for as long as it is configured (the count outlives its instances): a guest that
//!   asks again and again for a read that never ends occupies that many threads, not the pool;
//! - the work itself is told its deadline, so a batch stops between two reads once nobody waits
//!   for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

/// Most filesystem host calls one scanner may have running at once, including the ones whose
/// guest stopped waiting for them: its share of the blocking pool (tokio's caps it at 512
/// threads) when every read it starts blocks for ever.
pub const MAX_OUTSTANDING: usize = 4;

/// Why a host call gave no answer; its text is what the guest receives.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// It ran past its deadline and was abandoned.
    #[error(
        "{call} did not finish within {deadline:?} (the scanner's call-timeout); abandoned, it is still counted against the scanner until it returns"
    )]
    Deadline {
        /// The WIT function.
        call: &'static str,
        /// Its deadline.
        deadline: Duration,
    },
    /// Every slot was taken, by calls still blocked, for the whole deadline.
    #[error(
        "{call} refused: {MAX_OUTSTANDING} earlier host calls of this scanner are still blocked (abandoned after their deadline)"
    )]
    Busy {
        /// The WIT function.
        call: &'static str,
    },
    /// The thread running it panicked (a bug of the host).
    #[error("{call} failed in the host")]
    Panicked {
        /// The WIT function.
        call: &'static str,
    },
}

/// One scanner's filesystem host calls: a semaphore of [`MAX_OUTSTANDING`] slots, each held by a
/// call until its thread returns (not until its guest stops waiting).
#[derive(Debug)]
pub struct HostCalls {
    slots: Arc<Semaphore>,
}

impl Default for HostCalls {
    fn default() -> Self {
        HostCalls {
            slots: Arc::new(Semaphore::new(MAX_OUTSTANDING)),
        }
    }
}

impl HostCalls {
    /// Runs `work` on the blocking pool and waits at most `deadline` for a slot and its answer.
    /// `work` is given the instant its caller gives up, to stop early at a safe point.
    pub async fn run<R: Send + 'static>(
        &self,
        call: &'static str,
        deadline: Duration,
        work: impl FnOnce(Instant) -> R + Send + 'static,
    ) -> Result<R, CallError> {
        let until = Instant::now() + deadline;
        let slot = tokio::time::timeout(deadline, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| CallError::Busy { call })?
            // Never closed: the semaphore lives as long as this.
            .map_err(|_| CallError::Busy { call })?;
        let task = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            work(until)
        });
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, task).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(CallError::Panicked { call }),
            Err(_) => {
                tracing::debug!(call, ?deadline, "host call abandoned after its deadline");
                Err(CallError::Deadline { call, deadline })
            }
        }
    }

    /// Calls running now, abandoned ones included.
    pub fn outstanding(&self) -> usize {
        MAX_OUTSTANDING - self.slots.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_that_never_returns_is_abandoned_and_keeps_its_slot() {
        let calls = HostCalls::default();
        let deadline = Duration::from_millis(200);
        assert_eq!(calls.run("quick", deadline, |_| 7).await.unwrap(), 7);
        assert_eq!(calls.outstanding(), 0, "a finished call frees its slot");

        // Reads blocked until the test lets them go: each is abandoned at its deadline.
        let (release, blocked) = mpsc::channel::<()>();
        let blocked = Arc::new(std::sync::Mutex::new(blocked));
        for i in 0..MAX_OUTSTANDING {
            let blocked = blocked.clone();
            let started = Instant::now();
            let err = calls
                .run("stuck", deadline, move |_| {
                    let _ = blocked.lock().map(|rx| rx.recv());
                })
                .await
                .unwrap_err();
            assert!(matches!(err, CallError::Deadline { .. }), "{i}: {err}");
            assert!(
                started.elapsed() < deadline * 10,
                "{i}: waited past the deadline"
            );
            assert_eq!(calls.outstanding(), i + 1);
        }
        // Every slot is held by a blocked read: the next call is refused, not queued for ever.
        let err = calls.run("more", deadline, |_| ()).await.unwrap_err();
        assert!(matches!(err, CallError::Busy { .. }), "{err}");

        // Once they return, the slots come back.
        for _ in 0..MAX_OUTSTANDING {
            release.send(()).unwrap();
        }
        let freed = Instant::now() + Duration::from_secs(30);
        while calls.outstanding() > 0 {
            assert!(
                Instant::now() < freed,
                "slots not freed once the reads returned"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(calls.run("after", deadline, |_| 1).await.unwrap(), 1);
    }
}
