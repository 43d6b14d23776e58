//! Reading the activator's `/metrics` (Prometheus text or OpenMetrics): sums of counters and
//! gauges, histogram buckets per label, and quantiles from buckets as Prometheus'
//! `histogram_quantile` computes them (linear interpolation inside the bucket).

use std::collections::BTreeMap;

/// One sample line: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the sample lines of an exposition (comments and blank lines skipped; a trailing
/// timestamp or exemplar is ignored).
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) if open < line.find(' ').unwrap_or(usize::MAX) => {
            let close = closing_brace(line, open)?;
            (
                &line[..open],
                parse_labels(&line[open + 1..close])?,
                &line[close + 1..],
            )
        }
        _ => {
            let (name, rest) = line.split_once(' ')?;
            (name, BTreeMap::new(), rest)
        }
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// The `}` closing the label set opened at `open`, skipping quoted values.
fn closing_brace(line: &str, open: usize) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in line[open..].char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(open + i),
            _ => {}
        }
    }
    None
}

fn parse_labels(s: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let after = after.trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return None,
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(key.trim().to_string(), value);
        rest = after[end? + 1..]
            .trim_start()
            .trim_start_matches(',')
            .trim_start();
    }
    Some(out)
}

/// The sum of every sample named `name` (all label sets), or None when there is none.
pub fn sum(samples: &[Sample], name: &str) -> Option<f64> {
    let mut found = false;
    let total = samples
        .iter()
        .filter(|s| s.name == name)
        .inspect(|_| found = true)
        .map(|s| s.value)
        .sum();
    found.then_some(total)
}

/// A histogram's cumulative buckets `(upper bound, count)`, sorted by bound, `+Inf` last.
pub type Buckets = Vec<(f64, f64)>;

/// The buckets of histogram `name` (without the `_bucket` suffix) grouped by the value of
/// `label`; buckets of other label sets with the same `label` value are added together.
pub fn histograms_by(samples: &[Sample], name: &str, label: &str) -> BTreeMap<String, Buckets> {
    let bucket_name = format!("{name}_bucket");
    let mut by: BTreeMap<String, BTreeMap<u64, (f64, f64)>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == bucket_name) {
        let Some(le) = s.labels.get("le").and_then(|v| parse_bound(v)) else {
            continue;
        };
        let key = s.labels.get(label).cloned().unwrap_or_default();
        // f64 bounds keyed by their bits: all are positive or +Inf, so bit order is value order.
        let e = by
            .entry(key)
            .or_default()
            .entry(le.to_bits())
            .or_insert((le, 0.0));
        e.1 += s.value;
    }
    by.into_iter()
        .map(|(k, b)| (k, b.into_values().collect()))
        .collect()
}

fn parse_bound(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        v => v.parse().ok(),
    }
}

/// The `q` quantile (0..=1) of a histogram, as Prometheus' `histogram_quantile`: the bucket
/// holding the rank, linear interpolation inside it (from 0 for the first bucket); a rank in
/// the `+Inf` bucket answers the largest finite bound. None for an empty histogram.
pub fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let mut prev_bound = 0.0;
    let mut prev_count = 0.0;
    for &(bound, count) in buckets {
        if count >= rank {
            if bound.is_infinite() {
                return Some(prev_bound);
            }
            let in_bucket = count - prev_count;
            if in_bucket <= 0.0 {
                return Some(bound);
            }
            return Some(prev_bound + (bound - prev_bound) * (rank - prev_count) / in_bucket);
        }
        prev_bound = bound;
        prev_count = count;
    }
    Some(prev_bound)
}

/// The number of observations of a histogram (its `+Inf` bucket).
pub fn count(buckets: &[(f64, f64)]) -> f64 {
    buckets.last().map(|b| b.1).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP activator_cold_start_phase_seconds Time from request arrival to each phase.
# TYPE activator_cold_start_phase_seconds histogram
activator_cold_start_phase_seconds_bucket{phase="pod_post_sent",le="0.001"} 10
activator_cold_start_phase_seconds_bucket{phase="pod_post_sent",le="0.002"} 30
activator_cold_start_phase_seconds_bucket{phase="pod_post_sent",le="0.004"} 40
activator_cold_start_phase_seconds_bucket{phase="pod_post_sent",le="+Inf"} 40
activator_cold_start_phase_seconds_sum{phase="pod_post_sent"} 0.05
activator_cold_start_phase_seconds_count{phase="pod_post_sent"} 40
activator_cold_start_phase_seconds_bucket{phase="first_byte",le="0.001"} 0
activator_cold_start_phase_seconds_bucket{phase="first_byte",le="0.002"} 0
activator_cold_start_phase_seconds_bucket{phase="first_byte",le="0.004"} 1
activator_cold_start_phase_seconds_bucket{phase="first_byte",le="+Inf"} 2
# TYPE activator_queued_requests gauge
activator_queued_requests{revision="a/b"} 7
activator_queued_requests{revision="a/c"} 3
activator_requests_total{route="proxied",code="200"} 5
# EOF
"#;

    #[test]
    fn parses_samples_and_sums() {
        let s = parse(TEXT);
        assert_eq!(sum(&s, "activator_queued_requests"), Some(10.0));
        assert_eq!(sum(&s, "activator_requests_total"), Some(5.0));
        assert_eq!(sum(&s, "activator_missing"), None);
        let r = s
            .iter()
            .find(|s| s.name == "activator_requests_total")
            .unwrap();
        assert_eq!(r.labels["code"], "200");
        assert_eq!(r.labels["route"], "proxied");
    }

    #[test]
    fn quantiles_interpolate_inside_buckets() {
        let h = histograms_by(&parse(TEXT), "activator_cold_start_phase_seconds", "phase");
        let post = &h["pod_post_sent"];
        assert_eq!(count(post), 40.0);
        // rank 20 of 40: the (0.001, 0.002] bucket holds ranks 10..30 -> halfway.
        assert!((quantile(post, 0.5).unwrap() - 0.0015).abs() < 1e-12);
        // rank 39.6: (0.002, 0.004] holds 30..40 -> 0.002 + 0.002 * 9.6 / 10.
        assert!((quantile(post, 0.99).unwrap() - 0.00392).abs() < 1e-12);
        // rank 5 in the first bucket: interpolated from 0.
        assert!((quantile(post, 0.125).unwrap() - 0.0005).abs() < 1e-12);
        // A rank in +Inf answers the largest finite bound.
        assert_eq!(quantile(&h["first_byte"], 0.99), Some(0.004));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[(f64::INFINITY, 0.0)], 0.5), None);
    }

    #[test]
    fn labels_with_escapes_and_commas() {
        let s = parse(r#"m{a="x,\"y\"}",b="2"} 1.5 1700000000"#);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].labels["a"], "x,\"y\"}");
        assert_eq!(s[0].labels["b"], "2");
        assert_eq!(s[0].value, 1.5);
    }
}
