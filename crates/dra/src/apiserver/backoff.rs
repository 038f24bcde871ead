//! How long to wait before the next attempt at the API server after a failure, as client-go
//! waits: exponentially longer with each failure in a row, up to a bound, with jitter so that
//! the nodes of a fleet that failed together (an API server restart, a priority-and-fairness
//! throttle) do not come back together; and never sooner than the server's `Retry-After`.
//!
//! client-go's reflector backs off its list and watch from 800 ms to 30 s, doubling, with a
//! jitter of up to the pause again; its REST client honours `Retry-After` on 429 and 5xx
//! answers. Here a pause is drawn between half and all of the current step (so the bound holds
//! and the fleet is spread over half a step), the step doubles from [`FIRST`] to [`MAX`], and a
//! `Retry-After` is honoured up to [`MAX_RETRY_AFTER`] (a server asking for more is not
//! believed, so a wrong header cannot silence a node for hours).

use std::time::Duration;

use super::ApiError;

/// The first step.
pub const FIRST: Duration = Duration::from_millis(200);
/// The longest step.
pub const MAX: Duration = Duration::from_secs(30);
/// The longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// The pauses of one sequence of attempts; [`Backoff::reset`] after a success.
#[derive(Clone, Debug)]
pub struct Backoff {
    step: Duration,
    first: Duration,
    max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(FIRST, MAX)
    }
}

impl Backoff {
    /// Steps from `first`, doubling up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            step: first,
            first,
            max,
        }
    }

    /// The pause before the attempt after one that failed with `error`: the current step with
    /// jitter, or the `Retry-After` the answer carried when that is longer. The step doubles.
    pub fn pause(&mut self, error: &ApiError) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        let jittered = step.mul_f64(0.5 + fastrand::f64() / 2.0);
        match error.retry_after() {
            Some(asked) => asked.min(MAX_RETRY_AFTER).max(jittered),
            None => jittered,
        }
    }

    /// Back to the first step: the last attempt succeeded.
    pub fn reset(&mut self) {
        self.step = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(retry_after: Option<u64>) -> ApiError {
        ApiError::Status {
            code: 503,
            message: String::new(),
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    #[test]
    fn pauses_double_within_bounds_with_jitter_and_honour_retry_after() {
        let mut backoff = Backoff::default();
        let mut steps = Vec::new();
        for _ in 0..12 {
            let pause = backoff.pause(&failed(None));
            steps.push(pause);
        }
        let mut step = FIRST;
        for pause in &steps {
            assert!(
                *pause >= step / 2 && *pause <= step,
                "{pause:?} for step {step:?}"
            );
            step = (step * 2).min(MAX);
        }
        assert!(steps.last().is_some_and(|p| *p >= MAX / 2));
        // A fleet failing together is spread: not every pause the same.
        let spread: std::collections::BTreeSet<_> = (0..20)
            .map(|_| Backoff::default().pause(&failed(None)))
            .collect();
        assert!(spread.len() > 1);

        backoff.reset();
        assert!(backoff.pause(&failed(Some(3))) == Duration::from_secs(3));
        assert!(backoff.pause(&failed(Some(100_000))) == MAX_RETRY_AFTER);
        assert!(backoff.pause(&failed(None)) <= FIRST * 4);
    }
}
