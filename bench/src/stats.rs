//! Small statistics over samples.

use std::time::Duration;

/// Nearest-rank quantile (`q` in 0..=1) of unsorted samples; None when empty.
pub fn quantile(samples: &[Duration], q: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_unstable();
    let rank = (q.clamp(0.0, 1.0) * s.len() as f64).ceil() as usize;
    Some(s[rank.clamp(1, s.len()) - 1])
}

/// p50 and p99 in ms, `-` when empty.
pub fn p50_p99_ms(samples: &[Duration]) -> (String, String) {
    let f = |q| {
        quantile(samples, q)
            .map(|d| format!("{:.2}", d.as_secs_f64() * 1e3))
            .unwrap_or_else(|| "-".into())
    };
    (f(0.5), f(0.99))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let s: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(quantile(&s, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(quantile(&s, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(quantile(&s, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(quantile(&s, 0.0), Some(Duration::from_millis(1)));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
