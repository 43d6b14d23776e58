//! An open-loop load generator: request i is sent at `start + i / rate` whether or not earlier
//! ones have been answered, and its latency counts from that intended time. A slow system then
//! shows as growing latency instead of hiding behind fewer requests sent (coordinated
//! omission). Bounded: `rate × duration` requests at most, and at most `max_in_flight` at once —
//! a request due while that many are outstanding is counted as `overflow`, not delayed.

use std::future::Future;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The schedule.
#[derive(Debug, Clone, Copy)]
pub struct OpenLoop {
    /// Requests per second.
    pub rate: f64,
    pub duration: Duration,
    pub max_in_flight: usize,
}

/// One request as the generator saw it.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Its intended send time, from the start.
    pub intended: Duration,
    /// How late it was actually sent.
    pub send_lag: Duration,
    /// From the intended send time to the whole response.
    pub latency: Duration,
    pub ok: bool,
}

/// What a run did.
#[derive(Debug)]
pub struct Run {
    pub outcomes: Vec<Outcome>,
    /// Requests due while `max_in_flight` were outstanding (not sent; errors).
    pub overflow: u64,
    /// The run ended early (Ctrl-C).
    pub cancelled: bool,
    pub elapsed: Duration,
}

/// Latency percentiles from an HDR histogram (µs precision, 3 significant digits), in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Latency {
    pub fn of(samples: impl IntoIterator<Item = Duration>) -> Self {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
            .expect("static histogram bounds are valid");
        for d in samples {
            h.saturating_record(d.as_micros().max(1) as u64);
        }
        if h.is_empty() {
            return Self::default();
        }
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
        Self {
            count: h.len(),
            p50: ms(0.50),
            p90: ms(0.90),
            p99: ms(0.99),
            p999: ms(0.999),
            max: h.max() as f64 / 1e3,
        }
    }
}

impl Run {
    /// An empty run, to [`Run::absorb`] slices into.
    pub fn empty() -> Self {
        Self {
            outcomes: Vec::new(),
            overflow: 0,
            cancelled: false,
            elapsed: Duration::ZERO,
        }
    }

    /// Adds a later slice of the same target's load (interleaved runs).
    pub fn absorb(&mut self, other: Run) {
        let offset = self.elapsed;
        self.outcomes
            .extend(other.outcomes.into_iter().map(|mut o| {
                o.intended += offset;
                o
            }));
        self.overflow += other.overflow;
        self.cancelled |= other.cancelled;
        self.elapsed += other.elapsed;
    }

    pub fn sent(&self) -> usize {
        self.outcomes.len()
    }

    pub fn errors(&self) -> u64 {
        self.outcomes.iter().filter(|o| !o.ok).count() as u64 + self.overflow
    }

    /// Latency of the answered requests, from their intended send times.
    pub fn latency(&self) -> Latency {
        Latency::of(self.outcomes.iter().filter(|o| o.ok).map(|o| o.latency))
    }

    /// Latency of the answered requests from their actual send times: the open-loop figure
    /// minus the generator's own timer lag (tokio's timer has millisecond resolution).
    pub fn service(&self) -> Latency {
        Latency::of(
            self.outcomes
                .iter()
                .filter(|o| o.ok)
                .map(|o| o.latency.saturating_sub(o.send_lag)),
        )
    }

    pub fn send_lag(&self) -> Latency {
        Latency::of(self.outcomes.iter().map(|o| o.send_lag))
    }

    /// Requests per second actually answered.
    pub fn throughput(&self) -> f64 {
        let ok = self.outcomes.iter().filter(|o| o.ok).count() as f64;
        ok / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl OpenLoop {
    /// Runs the schedule; `send(i)` makes request i and says whether it succeeded.
    pub async fn run<F, Fut>(&self, cancel: &CancellationToken, mut send: F) -> Run
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = bool> + Send + 'static,
    {
        let total = (self.rate * self.duration.as_secs_f64()).floor() as u64;
        let interval = Duration::from_secs_f64(1.0 / self.rate.max(1e-9));
        let start = Instant::now();
        let mut tasks: JoinSet<Outcome> = JoinSet::new();
        let mut outcomes = Vec::with_capacity(total as usize);
        let mut overflow = 0;
        let mut cancelled = false;
        for i in 0..total {
            let intended = start + interval.mul_f64(i as f64);
            tokio::select! {
                _ = cancel.cancelled() => { cancelled = true; break; }
                _ = tokio::time::sleep_until(intended) => {}
            }
            while let Some(done) = tasks.try_join_next() {
                outcomes.extend(done.ok());
            }
            if tasks.len() >= self.max_in_flight {
                overflow += 1;
                continue;
            }
            let fut = send(i);
            tasks.spawn(async move {
                let sent = Instant::now();
                let ok = fut.await;
                Outcome {
                    intended: intended - start,
                    send_lag: sent - intended,
                    latency: intended.elapsed(),
                    ok,
                }
            });
        }
        loop {
            tokio::select! {
                done = tasks.join_next() => match done {
                    Some(done) => outcomes.extend(done.ok()),
                    None => break,
                },
                _ = cancel.cancelled(), if !cancelled => {
                    cancelled = true;
                    tasks.abort_all();
                }
            }
        }
        outcomes.sort_by_key(|o| o.intended);
        Run {
            outcomes,
            overflow,
            cancelled,
            elapsed: start.elapsed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hdr_percentiles_in_ms() {
        let l = Latency::of((1..=1000).map(Duration::from_millis));
        assert_eq!(l.count, 1000);
        assert!((l.p50 - 500.0).abs() < 1.0, "{l:?}");
        assert!((l.p99 - 990.0).abs() < 1.0, "{l:?}");
        assert!((l.max - 1000.0).abs() < 1.0, "{l:?}");
        assert_eq!(Latency::of([]), Latency::default());
    }

    #[tokio::test(start_paused = true)]
    async fn sends_on_schedule_and_counts_overflow_instead_of_waiting() {
        // Every request takes 1 s; at 100/s with room for 20 in flight, the 21st and later
        // (until the first answers) overflow rather than being sent late.
        let cancel = CancellationToken::new();
        let run = OpenLoop {
            rate: 100.0,
            duration: Duration::from_millis(500),
            max_in_flight: 20,
        }
        .run(&cancel, |_| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            true
        })
        .await;
        assert_eq!(run.sent(), 20);
        assert_eq!(run.overflow, 30);
        assert_eq!(run.errors(), 30);
        assert!(
            run.outcomes
                .iter()
                .all(|o| o.send_lag < Duration::from_millis(1))
        );
        assert!(
            run.outcomes
                .iter()
                .all(|o| o.latency >= Duration::from_secs(1))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn cancel_ends_the_run_with_what_was_answered() {
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        let run = OpenLoop {
            rate: 10.0,
            duration: Duration::from_secs(100),
            max_in_flight: 100,
        }
        .run(&cancel, move |i| {
            if i == 4 {
                c.cancel();
            }
            async { true }
        })
        .await;
        assert!(run.cancelled);
        assert_eq!(run.sent(), 5, "sent before the cancel, and answered");
    }
}
