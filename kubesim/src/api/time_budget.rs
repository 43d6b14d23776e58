//! The watch cache's dispatch time budget, as kube-apiserver v1.28.7 keeps it
//! (`staging/src/k8s.io/apiserver/pkg/storage/cacher/time_budget.go`): one budget per resource,
//! empty at start, refilled by `refresh` for every second that passes (50 ms), never above
//! `max` (100 ms). Dispatching an event that some watcher cannot take at once takes the whole
//! budget (`takeAvailable`), waits at most that long for the blocked watchers, and gives back
//! what it did not use (`returnUnused`). Pure: the caller says what time it is.

use std::time::{Duration, Instant};

/// `refreshPerSecond` (time_budget.go:27).
pub const REFRESH_PER_SECOND: Duration = Duration::from_millis(50);
/// `maxBudget` (time_budget.go:28).
pub const MAX_BUDGET: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub(crate) struct TimeBudget {
    budget: Duration,
    max: Duration,
    refresh: Duration,
    last: Instant,
}

impl TimeBudget {
    /// An empty budget at `now` (`newTimeBudget`: `budget: 0`).
    pub fn new(now: Instant, refresh: Duration, max: Duration) -> Self {
        Self {
            budget: Duration::ZERO,
            max,
            refresh,
            last: now,
        }
    }

    /// Everything accumulated until `now`, leaving the budget empty (`takeAvailable`).
    pub fn take_available(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last);
        let acc = self.refresh.mul_f64(elapsed.as_secs_f64());
        self.budget = (self.budget + acc).min(self.max);
        self.last = now;
        std::mem::take(&mut self.budget)
    }

    /// Gives back the part of a taken budget that was not spent (`returnUnused`).
    pub fn return_unused(&mut self, unused: Duration) {
        self.budget = (self.budget + unused).min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn starts_empty_and_fills_50ms_per_second_up_to_100ms() {
        let t0 = Instant::now();
        let mut b = TimeBudget::new(t0, REFRESH_PER_SECOND, MAX_BUDGET);
        assert_eq!(b.take_available(t0), Duration::ZERO, "empty at start");
        assert_eq!(b.take_available(t0 + ms(1000)), ms(50));
        // Taken: empty again until time passes.
        assert_eq!(b.take_available(t0 + ms(1000)), Duration::ZERO);
        assert_eq!(b.take_available(t0 + ms(1500)), ms(25));
        // Ten seconds of refill is still only the maximum.
        assert_eq!(b.take_available(t0 + ms(11_500)), MAX_BUDGET);
    }

    #[test]
    fn unused_time_comes_back_capped_and_overspending_returns_nothing() {
        let t0 = Instant::now();
        let mut b = TimeBudget::new(t0, REFRESH_PER_SECOND, MAX_BUDGET);
        let got = b.take_available(t0 + ms(2000));
        assert_eq!(got, ms(100));
        // 30 ms spent waiting for a blocked watcher: 70 ms go back.
        b.return_unused(got - ms(30));
        assert_eq!(b.take_available(t0 + ms(2000)), ms(70));
        // A dispatch that spent all of it gives back nothing (saturating: never negative).
        b.return_unused(got.saturating_sub(ms(150)));
        assert_eq!(b.take_available(t0 + ms(2000)), Duration::ZERO);
        b.return_unused(ms(500));
        assert_eq!(b.take_available(t0 + ms(2000)), MAX_BUDGET, "capped");
    }

    #[test]
    fn a_clock_that_goes_back_adds_nothing() {
        let t0 = Instant::now() + ms(5000);
        let mut b = TimeBudget::new(t0, REFRESH_PER_SECOND, MAX_BUDGET);
        assert_eq!(b.take_available(t0 - ms(1000)), Duration::ZERO);
    }
}
