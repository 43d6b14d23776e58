//! Latency summaries. Pure logic, no IO.

use serde::Serialize;
use std::time::Duration;

/// Percentiles of a set of latencies, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles (the value at rank ceil(p·n)); all zero for no samples.
    pub fn of(samples: &[Duration]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let r = (p * ms.len() as f64).ceil() as usize;
            ms[r.clamp(1, ms.len()) - 1]
        };
        Self {
            count: ms.len(),
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: ms[ms.len() - 1],
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
}
