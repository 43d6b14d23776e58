//! An open-loop load generator: request i is sent at `start + i / rate` whether or not earlier
//! ones have been answered, and its latency counts from that intended time. A slow system then
//! shows as growing latency instead of hiding behind fewer requests sent (coordinated
//! omission). Bounded: `rate × duration` requests at most, and at most `max_in_flight` at once —
//! a request due while that many are outstanding is not sent (nor delayed): it is recorded
//! with its intended send time as "did not complete within the run", an error, and it sits in
//! the latency tail after every answer (see [`Latency`]).
//!
//! Every request due is an [`Outcome`]: answered, failed (with its time to failure), its sender
//! task panicked, never sent, or still outstanding when a cancelled run stopped. No figure
//! leaves one out.

use std::collections::HashMap;
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

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fate {
    /// Sent and answered (`send` said it succeeded).
    Answered,
    /// Sent, and `send` said it failed.
    Failed,
    /// The task sending it panicked.
    Panicked,
    /// Due while `max_in_flight` were outstanding: never sent.
    Overflowed,
    /// Still outstanding when a cancelled run stopped.
    Aborted,
}

/// One request as the generator saw it.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Its intended send time, from the start.
    pub intended: Duration,
    /// How late it was actually sent (zero when it never was).
    pub send_lag: Duration,
    /// From the intended send time to the whole response, or to the failure; for a request
    /// that did not complete, to the run's end. Only answers' latencies enter [`Latency`].
    pub latency: Duration,
    pub fate: Fate,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.fate == Fate::Answered
    }

    /// Sent, and over: answered or failed (a panic counts as a failure).
    pub fn completed(&self) -> bool {
        matches!(self.fate, Fate::Answered | Fate::Failed | Fate::Panicked)
    }

    pub fn sent(&self) -> bool {
        self.fate != Fate::Overflowed
    }
}

/// What a run did.
#[derive(Debug)]
pub struct Run {
    /// Every request that fell due, by intended send time (sent or not).
    pub outcomes: Vec<Outcome>,
    /// The run ended early (Ctrl-C).
    pub cancelled: bool,
    pub elapsed: Duration,
}

/// Latency percentiles from an HDR histogram (µs precision, 3 significant digits), in ms, of
/// every request counted. A request that failed or did not complete never got an answer: it
/// ranks after every answer, as infinitely slow, so a percentile that falls among them is
/// infinite (`null` in JSON) and no failure can make a percentile look better — neither a
/// fast error answer nor a slow request that gave up. `failed` and `incomplete` say how many.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    pub count: u64,
    /// Of `count`, failed.
    pub failed: u64,
    /// Of `count`, did not complete within the run (never sent, or still outstanding at its
    /// end).
    pub incomplete: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// A percentile of a [`Latency`] in whole milliseconds, or `failed` where it falls among the
/// requests that never got an answer (ranked last, infinite).
pub fn whole_ms(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.0}")
    } else {
        "failed".into()
    }
}

impl Latency {
    /// Of plain samples, all answered.
    pub fn of(samples: impl IntoIterator<Item = Duration>) -> Self {
        Self::of_fates(samples.into_iter().map(|d| (d, Fate::Answered)))
    }

    /// Of every request, whatever became of it (only answers' times are kept).
    pub fn of_fates(samples: impl IntoIterator<Item = (Duration, Fate)>) -> Self {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
            .expect("static histogram bounds are valid");
        let (mut failed, mut incomplete) = (0, 0);
        for (d, fate) in samples {
            match fate {
                Fate::Answered => h.saturating_record(d.as_micros().max(1) as u64),
                Fate::Failed | Fate::Panicked => failed += 1,
                Fate::Overflowed | Fate::Aborted => incomplete += 1,
            }
        }
        let answered = h.len();
        let count = answered + failed + incomplete;
        if count == 0 {
            return Self::default();
        }
        // Quantile q of all requests is quantile q·count/answered of the answers, or beyond
        // every answer.
        let ms = |q: f64| {
            let rank = (q * count as f64).ceil().max(1.0);
            if rank > answered as f64 {
                f64::INFINITY
            } else {
                h.value_at_quantile(rank / answered as f64) as f64 / 1e3
            }
        };
        Self {
            count,
            failed,
            incomplete,
            p50: ms(0.50),
            p90: ms(0.90),
            p99: ms(0.99),
            p999: ms(0.999),
            max: ms(1.0),
        }
    }

    /// Requests that were not answered, as a share of those counted.
    pub fn failed_share(&self) -> f64 {
        (self.failed + self.incomplete) as f64 / (self.count.max(1)) as f64
    }

    /// Every request counted was answered.
    pub fn clean(&self) -> bool {
        self.failed + self.incomplete == 0
    }
}

impl Run {
    /// An empty run, to [`Run::absorb`] slices into.
    pub fn empty() -> Self {
        Self {
            outcomes: Vec::new(),
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
        self.cancelled |= other.cancelled;
        self.elapsed += other.elapsed;
    }

    /// Requests that fell due: sent or not.
    pub fn due(&self) -> usize {
        self.outcomes.len()
    }

    /// Requests actually sent.
    pub fn sent(&self) -> usize {
        self.outcomes.iter().filter(|o| o.sent()).count()
    }

    /// Requests due while `max_in_flight` were outstanding (not sent; errors).
    pub fn overflow(&self) -> u64 {
        self.count(Fate::Overflowed)
    }

    /// Requests of this fate.
    pub fn count(&self, fate: Fate) -> u64 {
        self.outcomes.iter().filter(|o| o.fate == fate).count() as u64
    }

    /// Every request that was not answered: failed, panicked, never sent, or cut off.
    pub fn errors(&self) -> u64 {
        self.outcomes.iter().filter(|o| !o.ok()).count() as u64
    }

    /// Latency of every request due, from its intended send time (see [`Latency`]).
    pub fn latency(&self) -> Latency {
        Latency::of_fates(self.outcomes.iter().map(|o| (o.latency, o.fate)))
    }

    /// As [`Run::latency`], from the actual send times: the open-loop figure minus the
    /// generator's own timer lag (tokio's timer has millisecond resolution).
    pub fn service(&self) -> Latency {
        Latency::of_fates(
            self.outcomes
                .iter()
                .map(|o| (o.latency.saturating_sub(o.send_lag), o.fate)),
        )
    }

    /// How late the requests sent were sent.
    pub fn send_lag(&self) -> Latency {
        Latency::of(
            self.outcomes
                .iter()
                .filter(|o| o.sent())
                .map(|o| o.send_lag),
        )
    }

    /// Requests per second actually answered.
    pub fn throughput(&self) -> f64 {
        let ok = self.outcomes.iter().filter(|o| o.ok()).count() as f64;
        ok / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A request sent and not yet over: what is known of it if its task never reports.
struct Pending {
    intended: Instant,
    spawned: Instant,
}

impl OpenLoop {
    /// Runs the schedule; `send(i)` makes request i and says whether it succeeded. A cancel
    /// stops sending; one that comes once every request was sent also cuts off those still
    /// outstanding ([`Fate::Aborted`]).
    pub async fn run<F, Fut>(&self, cancel: &CancellationToken, send: F) -> Run
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = bool> + Send + 'static,
    {
        self.run_inner(cancel, true, send).await
    }

    /// As [`OpenLoop::run`], but `stop` never cuts a request off: the requests outstanding
    /// are waited for and count as what they became. For a window that ends on an event (the
    /// requests in flight then are part of the window).
    pub async fn run_until<F, Fut>(&self, stop: &CancellationToken, send: F) -> Run
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = bool> + Send + 'static,
    {
        self.run_inner(stop, false, send).await
    }

    async fn run_inner<F, Fut>(&self, cancel: &CancellationToken, abort: bool, mut send: F) -> Run
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = bool> + Send + 'static,
    {
        let total = (self.rate * self.duration.as_secs_f64()).floor() as u64;
        let interval = Duration::from_secs_f64(1.0 / self.rate.max(1e-9));
        let start = Instant::now();
        let mut tasks: JoinSet<Outcome> = JoinSet::new();
        let mut pending: HashMap<tokio::task::Id, Pending> = HashMap::new();
        let mut outcomes = Vec::with_capacity(total as usize);
        let mut overflowed = Vec::new();
        let mut cancelled = false;
        // A task's result, or what became of it when it has none: a panic is a failure at
        // the time it was noticed, an abort (a cancelled run) did not complete.
        let settle = |done: Result<(tokio::task::Id, Outcome), tokio::task::JoinError>,
                      pending: &mut HashMap<tokio::task::Id, Pending>,
                      outcomes: &mut Vec<Outcome>| {
            match done {
                Ok((id, o)) => {
                    pending.remove(&id);
                    outcomes.push(o);
                }
                Err(e) => {
                    let Some(p) = pending.remove(&e.id()) else {
                        return;
                    };
                    let fate = if e.is_panic() {
                        tracing::warn!(error = %e, "a request's task panicked: counted as failed");
                        Fate::Panicked
                    } else {
                        Fate::Aborted
                    };
                    outcomes.push(Outcome {
                        intended: p.intended - start,
                        send_lag: p.spawned.saturating_duration_since(p.intended),
                        latency: p.intended.elapsed(),
                        fate,
                    });
                }
            }
        };
        for i in 0..total {
            let intended = start + interval.mul_f64(i as f64);
            tokio::select! {
                _ = cancel.cancelled() => { cancelled = true; break; }
                _ = tokio::time::sleep_until(intended) => {}
            }
            while let Some(done) = tasks.try_join_next_with_id() {
                settle(done, &mut pending, &mut outcomes);
            }
            if tasks.len() >= self.max_in_flight {
                overflowed.push(intended - start);
                continue;
            }
            let fut = send(i);
            let handle = tasks.spawn(async move {
                let sent = Instant::now();
                let ok = fut.await;
                Outcome {
                    intended: intended - start,
                    send_lag: sent - intended,
                    latency: intended.elapsed(),
                    fate: if ok { Fate::Answered } else { Fate::Failed },
                }
            });
            pending.insert(
                handle.id(),
                Pending {
                    intended,
                    spawned: Instant::now(),
                },
            );
        }
        loop {
            tokio::select! {
                done = tasks.join_next_with_id() => match done {
                    Some(done) => settle(done, &mut pending, &mut outcomes),
                    None => break,
                },
                _ = cancel.cancelled(), if abort && !cancelled => {
                    cancelled = true;
                    tasks.abort_all();
                }
            }
        }
        let elapsed = start.elapsed();
        // Never sent: they count in the tail at the time they waited until the run ended,
        // which is less than they would have taken.
        outcomes.extend(overflowed.into_iter().map(|intended| Outcome {
            intended,
            send_lag: Duration::ZERO,
            latency: elapsed.saturating_sub(intended),
            fate: Fate::Overflowed,
        }));
        outcomes.sort_by_key(|o| o.intended);
        Run {
            outcomes,
            cancelled,
            elapsed,
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
        assert_eq!(run.overflow(), 30);
        assert_eq!(run.errors(), 30);
        assert_eq!(run.due(), 50);
        assert!(
            run.outcomes
                .iter()
                .all(|o| o.send_lag < Duration::from_millis(1))
        );
        assert!(
            run.outcomes
                .iter()
                .filter(|o| o.sent())
                .all(|o| o.latency >= Duration::from_secs(1))
        );
        // The overflowed requests keep their intended send times (every 10 ms from 200 ms),
        // and count in the tail until the run's end (1.19 s, when the last answer came).
        let over: Vec<_> = run.outcomes.iter().filter(|o| !o.sent()).collect();
        assert_eq!(over[0].intended, Duration::from_millis(200));
        assert_eq!(over[29].intended, Duration::from_millis(490));
        for o in &over {
            assert_eq!(o.intended + o.latency, run.elapsed, "{o:?}");
        }
        let l = run.latency();
        assert_eq!((l.count, l.failed, l.incomplete), (50, 0, 30));
        // 20 answered after 1 s, 30 never sent: the median is beyond every answer, not the
        // 1 s that the 20 answers alone would say.
        assert_eq!(l.p50, f64::INFINITY, "{l:?}");
        assert!((l.failed_share() - 0.6).abs() < 1e-9);
        assert!(!l.clean());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_or_panicked_send_is_a_failure_ranked_after_every_answer() {
        let cancel = CancellationToken::new();
        let run = OpenLoop {
            rate: 10.0,
            duration: Duration::from_secs(1),
            max_in_flight: 100,
        }
        .run(&cancel, |i| async move {
            tokio::time::sleep(Duration::from_millis(50 * (i + 1))).await;
            match i {
                3 => panic!("a sender bug"),
                5 => false,
                _ => true,
            }
        })
        .await;
        assert_eq!(run.due(), 10, "the panicked one is not dropped");
        assert_eq!(run.count(Fate::Panicked), 1);
        assert_eq!(run.count(Fate::Failed), 1);
        assert_eq!(run.errors(), 2);
        let panicked = run.outcomes[3];
        assert_eq!(panicked.fate, Fate::Panicked);
        assert_eq!(panicked.intended, Duration::from_millis(300));
        assert!(
            panicked.latency >= Duration::from_millis(200),
            "{panicked:?}"
        );
        let l = run.latency();
        assert_eq!((l.count, l.failed, l.incomplete), (10, 2, 0));
        // Two of ten failed: the 80th percentile is the slowest answer (500 ms), and the 90th
        // and the max are beyond every answer. Failures (even the fast ones) never make a
        // percentile faster than the answers'.
        // The 5th of the 8 answers (50, 100, 150, 250, 350, …, 500 ms), HDR-rounded.
        assert!((l.p50 - 350.0).abs() < 1.0, "{l:?}");
        assert_eq!(l.p90, f64::INFINITY);
        assert_eq!(l.max, f64::INFINITY);
        assert_eq!(run.service().count, 10);
        let json = serde_json::to_value(l).unwrap();
        assert!(json["p99"].is_null(), "infinite is null in JSON: {json}");
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

    /// A stop that comes after the last request was sent, with one still in flight: `run`
    /// cuts it off, `run_until` waits for it.
    #[tokio::test(start_paused = true)]
    async fn run_until_waits_for_the_requests_in_flight_at_the_stop() {
        for drain in [false, true] {
            let stop = CancellationToken::new();
            let send = |i: u64| async move {
                if i == 2 {
                    // Sent at 0.2 s, answered at 5.2 s: in flight at the stop (1 s).
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                true
            };
            let lp = OpenLoop {
                rate: 10.0,
                duration: Duration::from_millis(300),
                max_in_flight: 100,
            };
            let s = stop.clone();
            let stopper = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                s.cancel();
            });
            let run = if drain {
                lp.run_until(&stop, send).await
            } else {
                lp.run(&stop, send).await
            };
            stopper.await.unwrap();
            assert_eq!(run.due(), 3);
            let (answered, aborted) = (run.count(Fate::Answered), run.count(Fate::Aborted));
            if drain {
                assert_eq!((answered, aborted), (3, 0));
                assert!(
                    run.latency().max >= 5000.0,
                    "the slow one counted at its time"
                );
            } else {
                assert_eq!((answered, aborted), (2, 1));
            }
        }
    }
}
