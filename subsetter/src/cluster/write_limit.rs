//! A rate limit on the subsetter's API writes. Every membership change is a write per
//! revision: a zone outage that takes 500 nodes away touches some 30,000 subsets at
//! 100,000 revisions, and writing them all at once would be a burst the API server (and etcd)
//! feels cluster-wide. Writes above the rate wait their turn instead; the queue of
//! reconciles holds the rest.
//!
//! A user's new or changed Revision must not wait behind such a flood of repairs (the
//! Pinterest lesson: no head-of-line blocking behind background work): urgent writes have a
//! lane of their own, a quarter of the rate and burst on top of the shared bucket, taken
//! first when it has a token.
//!
//! [`TokenBucket`] is the pure part (time is passed in); [`WriteLimiter`] waits on it.

use std::sync::Mutex;
use std::time::Duration;

use keep_serving::Locked;
use tokio::time::Instant;

/// `rate` tokens a second, at most `burst` saved up. Each write takes one; a write that
/// finds none reserves the next one and is told how long to wait for it, so waiters are
/// served in the order they asked.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(rate: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes a token at `now` if one is saved; never reserves.
    pub fn try_take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes a token at `now`: how long to wait before using it (zero when one was saved).
    pub fn take(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst) - 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

/// The writes' limiter; `None` rate means unlimited.
#[derive(Debug)]
pub struct WriteLimiter {
    lanes: Mutex<Lanes>,
}

#[derive(Debug)]
struct Lanes {
    /// None: no limit.
    bulk: Option<TokenBucket>,
    /// The urgent lane (a new or changed Revision's writes).
    urgent: Option<TokenBucket>,
}

impl Lanes {
    fn new(qps: f64, burst: u32, now: Instant) -> Self {
        Self {
            bulk: (qps > 0.0).then(|| TokenBucket::new(qps, burst, now)),
            urgent: (qps > 0.0).then(|| TokenBucket::new(qps / 4.0, (burst / 4).max(1), now)),
        }
    }
}

/// Whose write it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// A user created or changed a Revision: served first.
    Urgent,
    /// Repairs and follow-ups: in turn.
    Bulk,
}

impl WriteLimiter {
    /// `qps` ≤ 0 means no limit.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            lanes: Mutex::new(Lanes::new(qps, burst, Instant::now())),
        }
    }

    /// A new rate and burst (the ConfigMap changed); writes already waiting keep their turn.
    pub fn reconfigure(&self, qps: f64, burst: u32) {
        *self.lanes.locked() = Lanes::new(qps, burst, Instant::now());
    }

    /// Waits for this write's turn in `lane`; returns how long it waited.
    pub async fn acquire(&self, lane: Lane) -> Duration {
        let wait = {
            let mut lanes = self.lanes.locked();
            let now = Instant::now();
            if lane == Lane::Urgent
                && let Some(urgent) = &mut lanes.urgent
                && urgent.try_take(now)
            {
                return Duration::ZERO;
            }
            match &mut lanes.bulk {
                None => return Duration::ZERO,
                Some(bulk) => bulk.take(now),
            }
        };
        if !wait.is_zero() {
            // Pacing, not synchronisation: the token this write reserved becomes valid then.
            tokio::time::sleep(wait).await;
        }
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_free_then_writes_are_spaced_at_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 3, t0);
        for _ in 0..3 {
            assert_eq!(b.take(t0), Duration::ZERO);
        }
        // The 4th and 5th at the same instant wait 0.1 s and 0.2 s: in turn, at 10/s.
        assert_eq!(b.take(t0), Duration::from_millis(100));
        assert_eq!(b.take(t0), Duration::from_millis(200));
        // A second later the reservations are paid and 8 tokens accrued, capped at 3.
        let t1 = t0 + Duration::from_secs(2);
        for _ in 0..3 {
            assert_eq!(b.take(t1), Duration::ZERO);
        }
        assert!(b.take(t1) > Duration::ZERO);
    }

    #[test]
    fn thirty_thousand_writes_take_their_time() {
        // A zone outage's 30,000 subset writes at 100/s with a burst of 200: the last one is
        // scheduled 298 s after the first, not at once.
        let t0 = Instant::now();
        let mut b = TokenBucket::new(100.0, 200, t0);
        let mut last = Duration::ZERO;
        for _ in 0..30_000 {
            last = b.take(t0);
        }
        assert_eq!(last.as_secs(), 298);
    }

    #[tokio::test(start_paused = true)]
    async fn the_limiter_waits_only_past_the_burst() {
        let l = WriteLimiter::new(20.0, 2);
        assert_eq!(l.acquire(Lane::Bulk).await, Duration::ZERO);
        assert_eq!(l.acquire(Lane::Bulk).await, Duration::ZERO);
        assert_eq!(l.acquire(Lane::Bulk).await, Duration::from_millis(50));
        assert_eq!(
            WriteLimiter::new(0.0, 1).acquire(Lane::Bulk).await,
            Duration::ZERO
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_urgent_write_does_not_queue_behind_a_flood_of_repairs() {
        let l = WriteLimiter::new(100.0, 8);
        // A flood: 1,000 repairs reserve the next ten seconds of the shared bucket.
        let mut last = Duration::ZERO;
        for _ in 0..1_000 {
            let mut lanes = l.lanes.lock().unwrap();
            last = lanes.bulk.as_mut().unwrap().take(Instant::now());
        }
        assert!(last > Duration::from_secs(9));
        // A user's new Revision is written at once, from its own lane.
        assert_eq!(l.acquire(Lane::Urgent).await, Duration::ZERO);
        assert_eq!(l.acquire(Lane::Urgent).await, Duration::ZERO);
        // Its lane is a quarter of the burst: past it, it queues like the rest.
        assert!(l.acquire(Lane::Urgent).await > Duration::from_secs(9));
    }
}
