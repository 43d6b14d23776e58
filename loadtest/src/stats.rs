//! Latency summaries. Pure logic, no IO.

use serde::Serialize;
use std::time::Duration;

/// Percentiles of a set of requests' latencies, in milliseconds. A request that got no answer
/// ranks after every answer, as infinitely slow: a percentile that falls among the failures is
/// infinite (`null` in JSON), so a failure can never make a percentile look better (neither a
/// fast error nor a slow request that gave up).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Requests counted, failures included.
    pub count: usize,
    /// Of `count`, those that got no answer (failed).
    pub failed: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles (the value at rank ceil(p·n)) of answered requests; all zero
    /// for no samples.
    pub fn of(samples: &[Duration]) -> Self {
        Self::with_failed(samples, 0)
    }

    /// As [`Percentiles::of`], of values already in milliseconds (e.g. `Server-Timing` marks).
    pub fn of_ms(ms: impl IntoIterator<Item = f64>) -> Self {
        let d: Vec<Duration> = ms
            .into_iter()
            .map(|m| Duration::from_secs_f64(m / 1e3))
            .collect();
        Self::of(&d)
    }

    /// As [`Percentiles::of`], with `failed` more requests that got no answer, ranked last.
    pub fn with_failed(answered: &[Duration], failed: usize) -> Self {
        let n = answered.len() + failed;
        if n == 0 {
            return Self::default();
        }
        let mut ms: Vec<f64> = answered.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let r = ((p * n as f64).ceil() as usize).clamp(1, n);
            ms.get(r - 1).copied().unwrap_or(f64::INFINITY)
        };
        Self {
            count: n,
            failed,
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: rank(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|m| Duration::from_millis(*m)).collect()
    }

    #[test]
    fn nearest_rank() {
        let p = Percentiles::of(&ms(&(1..=100).collect::<Vec<_>>()));
        assert_eq!(
            (p.count, p.p50, p.p90, p.p99, p.max),
            (100, 50.0, 90.0, 99.0, 100.0)
        );
        let p = Percentiles::of(&ms(&[7]));
        assert_eq!((p.p50, p.p99, p.max), (7.0, 7.0, 7.0));
        let p = Percentiles::of(&ms(&[30, 10, 20]));
        assert_eq!((p.p50, p.p90, p.max), (20.0, 30.0, 30.0));
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
    }

    #[test]
    fn a_failure_ranks_after_every_answer() {
        // 8 answers of 1..=8 ms and 2 failures: p50 is the 5th answer, p90 and max are
        // beyond every answer; leaving the failures out would say p90 = 8 ms.
        let p = Percentiles::with_failed(&ms(&(1..=8).collect::<Vec<_>>()), 2);
        assert_eq!(
            (p.count, p.failed, p.p50, p.p90),
            (10, 2, 5.0, f64::INFINITY)
        );
        assert_eq!(p.max, f64::INFINITY);
        let only_failed = Percentiles::with_failed(&[], 3);
        assert_eq!((only_failed.count, only_failed.p50), (3, f64::INFINITY));
        let json = serde_json::to_value(p).unwrap();
        assert!(json["p90"].is_null() && json["p50"] == 5.0, "{json}");
    }
}
