//! The demo's report: a table per revision and a summary, as text and as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::driver::{Ingress, Sample};
use crate::scenarios::common::pct_line;
use crate::stats::Percentiles;

/// Per-revision figures.
#[derive(Debug, Clone, Serialize)]
pub struct RevisionRow {
    pub revision: String,
    pub members: Vec<String>,
    pub requests: usize,
    pub errors: usize,
    /// Requests that waited for a pod start (failed ones included).
    pub cold_starts: usize,
    /// Distinct pods that answered.
    pub pods: usize,
    pub cold_start_ms: Percentiles,
    pub warm_ms: Percentiles,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub nodes: usize,
    pub revisions: usize,
    pub requests: usize,
    /// Requests that failed (after the ingress model's retry, if it made one).
    pub errors: usize,
    /// The ingress model the requests were sent under.
    pub ingress: Ingress,
    /// Requests whose first attempt failed: the errors with no retry (`ingress: none`).
    pub errors_without_retry: usize,
    /// Requests the ingress model retried, and attempts made in all.
    pub retried: usize,
    pub attempts: usize,
    /// Requests that waited for a pod to start (failed ones included).
    pub cold_starts: usize,
    /// App pods of the demo's revisions at the end of the run.
    pub pods_created: u64,
    /// Revisions that had to be woken (a request waited for a cold start).
    pub revisions_woken: usize,
    /// `pods_created / revisions_woken`: 1 when a wake-up starts one pod; up to the subset's
    /// size when every member an entry reaches starts its own.
    pub pods_per_woken_revision: f64,
    /// Requests that waited for a cold start though they were sent after their revision's
    /// first pod had answered (a second pod started where the first could have served).
    pub cold_after_first_ready: usize,
    /// Every request; a failed one ranks after every answer (see [`Percentiles`]).
    pub all_ms: Percentiles,
    /// Answered requests that waited for a pod start, and the other answered ones.
    pub cold_start_ms: Percentiles,
    pub warm_ms: Percentiles,
    /// The simulated pod start delay, so cold-start latency can be read net of it.
    pub start_delay_ms: u64,
    /// API requests by verb during the run (embedded API server only).
    pub api_requests: BTreeMap<String, u64>,
    /// Which API server the run used, and its latency model: figures from an in-memory
    /// server without one understate the control path several times over.
    pub api_server: String,
    pub wall_ms: f64,
    pub per_revision: Vec<RevisionRow>,
    /// The first few errors, verbatim.
    pub error_samples: Vec<String>,
}

impl Summary {
    pub fn build(
        samples: &[Sample],
        members: &BTreeMap<String, Vec<String>>,
        nodes: usize,
        pods_created: u64,
        start_delay_ms: u64,
        api_requests: BTreeMap<String, u64>,
        wall_ms: f64,
    ) -> Self {
        let mut by_rev: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
        for s in samples {
            by_rev.entry(&s.revision).or_default().push(s);
        }
        let per_revision = by_rev
            .iter()
            .map(|(rev, ss)| {
                let (cold, warm) = latencies(ss.iter().copied());
                RevisionRow {
                    revision: rev.to_string(),
                    members: members.get(*rev).cloned().unwrap_or_default(),
                    requests: ss.len(),
                    errors: ss.iter().filter(|s| !s.ok()).count(),
                    cold_starts: ss.iter().filter(|s| s.cold).count(),
                    pods: ss
                        .iter()
                        .filter_map(|s| s.pod.as_deref())
                        .collect::<std::collections::BTreeSet<_>>()
                        .len(),
                    cold_start_ms: Percentiles::of(&cold),
                    warm_ms: Percentiles::of(&warm),
                }
            })
            .collect();
        let (cold, warm) = latencies(samples.iter());
        let answered: Vec<_> = cold.iter().chain(&warm).copied().collect();
        let errors = samples.iter().filter(|s| !s.ok()).count();
        let revisions_woken = by_rev
            .values()
            .filter(|ss| ss.iter().any(|s| s.cold))
            .count();
        // When each revision's first cold start was answered: its first pod was ready then.
        let cold_after_first_ready = by_rev
            .values()
            .map(|ss| {
                let first_ready = ss
                    .iter()
                    .filter(|s| s.cold && s.ok())
                    .map(|s| s.sent + s.latency)
                    .min();
                first_ready.map_or(0, |t| ss.iter().filter(|s| s.cold && s.sent >= t).count())
            })
            .sum();
        Self {
            nodes,
            revisions: by_rev.len(),
            requests: samples.len(),
            errors,
            ingress: Ingress::None,
            errors_without_retry: samples.iter().filter(|s| !s.ok_without_retry()).count(),
            retried: samples.iter().filter(|s| s.first.is_some()).count(),
            attempts: samples.iter().map(Sample::attempts).sum(),
            cold_starts: samples.iter().filter(|s| s.cold).count(),
            pods_created,
            revisions_woken,
            pods_per_woken_revision: if revisions_woken == 0 {
                0.0
            } else {
                pods_created as f64 / revisions_woken as f64
            },
            cold_after_first_ready,
            all_ms: Percentiles::with_failed(&answered, errors),
            cold_start_ms: Percentiles::of(&cold),
            warm_ms: Percentiles::of(&warm),
            start_delay_ms,
            api_requests,
            api_server: String::new(),
            wall_ms,
            per_revision,
            error_samples: crate::scenarios::common::errors_of(samples),
        }
    }

    /// The JSON report (`--json PATH`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("the summary serializes")
    }

    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "{:<14} {:>4} {:>4} {:>4} {:>4} {:>9} {:>9} {:>9}  members",
            "revision", "req", "err", "cold", "pods", "cold p50", "cold max", "warm p50"
        );
        for r in &self.per_revision {
            let _ = writeln!(
                o,
                "{:<14} {:>4} {:>4} {:>4} {:>4} {:>9.1} {:>9.1} {:>9.1}  {}",
                r.revision,
                r.requests,
                r.errors,
                r.cold_starts,
                r.pods,
                r.cold_start_ms.p50,
                r.cold_start_ms.max,
                r.warm_ms.p50,
                r.members.join(",")
            );
        }
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "nodes {}  revisions {}  requests {}  errors {}  cold starts {}  pods created {}  wall {:.0} ms",
            self.nodes,
            self.revisions,
            self.requests,
            self.errors,
            self.cold_starts,
            self.pods_created,
            self.wall_ms
        );
        let _ = writeln!(
            o,
            "pods per woken revision {:.2} ({} pods, {} revisions woken); requests that waited for a cold start after their revision's first pod answered: {}",
            self.pods_per_woken_revision,
            self.pods_created,
            self.revisions_woken,
            self.cold_after_first_ready
        );
        if self.ingress == Ingress::Retry {
            let _ = writeln!(
                o,
                "ingress retry (one retry on another activator of a request refused or reset before any answer): {} retried, {} attempts; errors with no retry (ingress none) {}",
                self.retried, self.attempts, self.errors_without_retry
            );
        }
        o += &pct_line("all ms", &self.all_ms);
        let c = &self.cold_start_ms;
        if c.count == 0 {
            let _ = writeln!(o, "cold start ms  no samples");
        } else {
            let _ = writeln!(
                o,
                "cold start ms  p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}   (answered; simulated start delay {} ms; p50 net of it {:.1})",
                c.p50,
                c.p90,
                c.p99,
                c.max,
                self.start_delay_ms,
                c.p50 - self.start_delay_ms as f64
            );
        }
        let w = &self.warm_ms;
        if w.count == 0 {
            let _ = writeln!(o, "warm ms        no samples");
        } else {
            let _ = writeln!(
                o,
                "warm ms        p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}   (answered)",
                w.p50, w.p90, w.p99, w.max
            );
        }
        if !self.api_server.is_empty() {
            let _ = writeln!(o, "API server     {}", self.api_server);
        }
        if !self.api_requests.is_empty() {
            let verbs: Vec<String> = self
                .api_requests
                .iter()
                .map(|(v, n)| format!("{v} {n}"))
                .collect();
            let _ = writeln!(o, "API requests   {}", verbs.join("  "));
        }
        for e in &self.error_samples {
            let _ = writeln!(o, "error: {e}");
        }
        o
    }
}

fn latencies<'a>(
    samples: impl Iterator<Item = &'a Sample>,
) -> (Vec<std::time::Duration>, Vec<std::time::Duration>) {
    let (cold, warm): (Vec<&Sample>, Vec<&Sample>) =
        samples.filter(|s| s.ok()).partition(|s| s.cold);
    (
        cold.iter().map(|s| s.latency).collect(),
        warm.iter().map(|s| s.latency).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sample(rev: &str, status: u16, ms: u64, cold: bool, pod: &str) -> Sample {
        Sample {
            revision: rev.into(),
            entry: "node-0".into(),
            status,
            latency: Duration::from_millis(ms),
            cold,
            pod: Some(pod.into()),
            error: (status >= 400).then(|| "boom".to_string()),
            sent: std::time::Instant::now(),
            phases: None,
            retryable: false,
            first: None,
        }
    }

    #[test]
    fn a_cold_start_after_the_first_pod_answered_is_counted_and_pods_per_wake_up_reported() {
        let t0 = std::time::Instant::now();
        let at = |ms: u64, latency: u64, cold: bool, pod: &str| {
            let mut s = sample("a", 200, latency, cold, pod);
            s.sent = t0 + Duration::from_millis(ms);
            s
        };
        let samples = vec![
            // The first pod answers at 400 ms; a request sent at 300 ms may still wait for
            // it, one sent at 500 ms waited for a second pod.
            at(0, 400, true, "a-1"),
            at(300, 100, true, "a-1"),
            at(500, 350, true, "a-2"),
            at(900, 2, false, "a-1"),
        ];
        let s = Summary::build(&samples, &BTreeMap::new(), 3, 2, 300, BTreeMap::new(), 10.0);
        assert_eq!(s.cold_after_first_ready, 1);
        assert_eq!((s.revisions_woken, s.pods_per_woken_revision), (1, 2.0));
        assert!(
            s.to_text().contains("pods per woken revision 2.00"),
            "{}",
            s.to_text()
        );
    }

    #[test]
    fn summary_counts_and_splits_cold_from_warm() {
        let samples = vec![
            sample("a", 200, 400, true, "a-1"),
            sample("a", 200, 2, false, "a-1"),
            sample("b", 200, 500, true, "b-1"),
            sample("b", 502, 1, false, "b-1"),
        ];
        let s = Summary::build(&samples, &BTreeMap::new(), 3, 2, 300, BTreeMap::new(), 10.0);
        assert_eq!(
            (s.requests, s.errors, s.cold_starts, s.revisions),
            (4, 1, 2, 2)
        );
        assert_eq!(s.cold_start_ms.max, 500.0);
        assert_eq!(s.warm_ms.count, 1, "answered warm requests");
        assert_eq!((s.revisions_woken, s.pods_per_woken_revision), (2, 1.0));
        assert_eq!(s.cold_after_first_ready, 0);
        // The failed one (1 ms) ranks after every answer: the max is not 500 ms.
        assert_eq!((s.all_ms.count, s.all_ms.failed), (4, 1));
        assert_eq!(s.all_ms.max, f64::INFINITY);
        assert!(
            s.to_text().contains("(n=4, 1 failed, ranked last)"),
            "{}",
            s.to_text()
        );
        let j = s.to_json();
        for k in [
            "requests",
            "errors",
            "cold_starts",
            "pods_created",
            "cold_start_ms",
            "warm_ms",
            "api_requests",
        ] {
            assert!(j.get(k).is_some(), "missing {k}");
        }
        for k in ["p50", "p90", "p99", "max"] {
            assert!(j["cold_start_ms"].get(k).is_some());
        }
        assert!(s.to_text().contains("error: b via node-0: 502 boom"));
        // A request that waited for a pod start and then failed (a 504) is a cold start too.
        let mut failed_cold = samples.clone();
        failed_cold.push(sample("c", 504, 900, true, "c-1"));
        let s = Summary::build(
            &failed_cold,
            &BTreeMap::new(),
            3,
            3,
            300,
            BTreeMap::new(),
            10.0,
        );
        assert_eq!((s.errors, s.cold_starts), (2, 3));
        assert_eq!(s.per_revision[2].cold_starts, 1);
        let none = Summary::build(&[], &BTreeMap::new(), 1, 0, 0, BTreeMap::new(), 0.0);
        assert!(none.to_text().contains("warm ms        no samples"));
    }
}
