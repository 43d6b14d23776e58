//! What several scenarios do the same way: send a request to an activator, and sum up samples.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

use rand::RngExt;
use serde::Serialize;

use std::sync::{Arc, Mutex};

use crate::anatomy::{Anatomy, ColdPhases};
use crate::cluster::SimCluster;
use crate::demo::host_of;
use crate::driver::{Driver, Ingress, Sample, with_ingress};
use crate::observe::MemberWatch;
use crate::plot::{self, Line};
use crate::stats::Percentiles;

/// How requests reach the activators.
#[derive(Clone)]
pub struct Sender {
    pub driver: Driver,
    pub namespace: String,
    pub by_host: bool,
    /// The ingress model [`via_a_member`] follows (the other senders send to one activator).
    pub ingress: Ingress,
}

impl Sender {
    pub fn new(namespace: &str, by_host: bool) -> Self {
        Self {
            driver: Driver::new(),
            namespace: namespace.to_string(),
            by_host,
            ingress: Ingress::None,
        }
    }

    pub fn with_ingress(self, ingress: Ingress) -> Self {
        Self { ingress, ..self }
    }

    /// GET `/` of `revision` through the activator at `entry`; `headers` are added (the sim
    /// app's `x-sim-delay-ms`).
    pub async fn send(
        &self,
        entry: &(String, SocketAddr),
        revision: &str,
        headers: &[(&str, &str)],
    ) -> Sample {
        let e = (entry.0.as_str(), entry.1);
        if self.by_host && headers.is_empty() {
            let host = host_of(revision, &self.namespace);
            self.driver.get(e, revision, &host, "/").await
        } else {
            self.driver
                .get_named_with(e, &self.namespace, revision, "/", headers)
                .await
        }
    }
}

/// A random activator of the cluster.
pub fn random_entry(entries: &[(String, SocketAddr)]) -> (String, SocketAddr) {
    entries[rand::rng().random_range(0..entries.len())].clone()
}

/// Requests, errors, cold and warm latency, the cold-start anatomy.
#[derive(Debug, Clone, Serialize)]
pub struct SampleSummary {
    pub requests: usize,
    /// Requests that failed (after the ingress model's retry, if any).
    pub errors: usize,
    /// The ingress model the requests were sent under.
    pub ingress: Ingress,
    /// Attempts made, retries included (a request with no member to send to makes none).
    pub attempts: usize,
    /// Requests the ingress model retried.
    pub retried: usize,
    /// Requests whose first attempt failed: the errors with no retry (`ingress: none`).
    pub errors_without_retry: usize,
    /// Requests that waited for a slot (a pod starting or all busy), failed ones included.
    pub cold: usize,
    /// Cold starts: distinct pods that answered requests which waited for them to start.
    pub cold_starts: usize,
    /// Every request, failed ones ranked after every answer (see [`Percentiles`]).
    pub all_ms: Percentiles,
    /// Answered requests that waited for a pod; failures are in `all_ms` (a failed request
    /// cannot be told cold or warm).
    pub cold_ms: Percentiles,
    pub warm_ms: Percentiles,
    pub anatomy: Anatomy,
    /// The first few errors, verbatim.
    pub error_samples: Vec<String>,
}

impl SampleSummary {
    pub fn of(samples: &[Sample]) -> Self {
        let ok = || samples.iter().filter(|s| s.ok());
        let cold: Vec<_> = ok().filter(|s| s.cold).map(|s| s.latency).collect();
        let warm: Vec<_> = ok().filter(|s| !s.cold).map(|s| s.latency).collect();
        let answered: Vec<_> = ok().map(|s| s.latency).collect();
        let errors = samples.len() - answered.len();
        let phases: Vec<ColdPhases> = samples.iter().filter_map(|s| s.phases).collect();
        let retried = samples.iter().filter(|s| s.first.is_some()).count();
        Self {
            requests: samples.len(),
            errors,
            // The senders other than `via_a_member` never retry; it says otherwise (`under`).
            ingress: Ingress::None,
            attempts: samples.iter().map(Sample::attempts).sum(),
            retried,
            errors_without_retry: samples.iter().filter(|s| !s.ok_without_retry()).count(),
            cold: samples.iter().filter(|s| s.cold).count(),
            cold_starts: samples
                .iter()
                .filter(|s| s.phases.is_some())
                .filter_map(|s| s.pod.as_deref())
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            all_ms: Percentiles::with_failed(&answered, errors),
            cold_ms: Percentiles::of(&cold),
            warm_ms: Percentiles::of(&warm),
            anatomy: Anatomy::of(&phases),
            error_samples: errors_of(samples),
        }
    }

    /// As [`SampleSummary::of`], for samples sent under `ingress`.
    pub fn under(ingress: Ingress, samples: &[Sample]) -> Self {
        Self {
            ingress,
            ..Self::of(samples)
        }
    }

    /// Every request, and the answered cold and warm ones, in ms, for a CDF; a failed request
    /// is infinite in the first (the curve ends at the share answered).
    pub fn cdf_series(samples: &[Sample]) -> Vec<(&'static str, Vec<f64>)> {
        let ms = |s: &Sample| s.latency.as_secs_f64() * 1e3;
        let answered = |cold: bool| {
            samples
                .iter()
                .filter(|s| s.ok() && s.cold == cold)
                .map(ms)
                .collect()
        };
        let all = samples
            .iter()
            .map(|s| if s.ok() { ms(s) } else { f64::INFINITY })
            .collect();
        vec![
            ("all requests", all),
            ("cold, answered", answered(true)),
            ("warm, answered", answered(false)),
        ]
    }

    /// Table lines.
    pub fn lines(&self) -> String {
        let mut o = format!(
            "requests {}  errors {} ({:.2} %)  waited (cold) {}  cold starts (pods) {}\n",
            self.requests,
            self.errors,
            share(self.errors, self.requests),
            self.cold,
            self.cold_starts
        );
        if self.ingress == Ingress::Retry {
            o += &format!(
                "ingress retry: {} retried, {} attempts; with no retry (ingress none) {} errors ({:.2} %)\n",
                self.retried,
                self.attempts,
                self.errors_without_retry,
                share(self.errors_without_retry, self.requests)
            );
        }
        o += &pct_line("all ms", &self.all_ms);
        o += &pct_line("cold ms (answered)", &self.cold_ms);
        o += &pct_line("warm ms (answered)", &self.warm_ms);
        if self.anatomy.count > 0 {
            o += &format!(
                "cold-start anatomy ({} requests that waited for a pod start), ms:\n",
                self.anatomy.count
            );
            for (name, p) in crate::anatomy::SEGMENTS.iter().zip(self.anatomy.segments()) {
                o += &pct_line(&format!("  {name}"), p);
            }
            o += &pct_line("  arrival→first byte", &self.anatomy.total_ms);
            if self.anatomy.forwarded > 0 {
                o += &format!(
                    "forwarded by an entry ({} of them), ms from the arrival there:\n",
                    self.anatomy.forwarded
                );
                o += &pct_line("  entry: arrival→sent on", &self.anatomy.entry_ms);
                o += &pct_line("  the hop, less the member's wait", &self.anatomy.hop_ms);
                o += &pct_line("  entry: arrival→answer", &self.anatomy.forwarded_total_ms);
            }
        }
        for e in &self.error_samples {
            o += &format!("error: {e}\n");
        }
        o
    }
}

/// `part` as a percentage of `whole`.
pub fn share(part: usize, whole: usize) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

/// One table line of percentiles; one that falls among the failures reads `failed`.
pub fn pct_line(name: &str, p: &Percentiles) -> String {
    let v = |x: f64| {
        if x.is_finite() {
            format!("{x:>9.2}")
        } else {
            format!("{:>9}", "failed")
        }
    };
    if p.count == 0 {
        format!("{name:<24} no samples\n")
    } else if p.failed == 0 {
        format!(
            "{name:<24} p50 {}  p90 {}  p99 {}  max {}  (n={})\n",
            v(p.p50),
            v(p.p90),
            v(p.p99),
            v(p.max),
            p.count
        )
    } else {
        format!(
            "{name:<24} p50 {}  p90 {}  p99 {}  max {}  (n={}, {} failed, ranked last)\n",
            v(p.p50),
            v(p.p90),
            v(p.p99),
            v(p.max),
            p.count,
            p.failed
        )
    }
}

/// The first five failed samples, verbatim.
pub fn errors_of(samples: &[Sample]) -> Vec<String> {
    samples
        .iter()
        .filter(|s| !s.ok())
        .take(5)
        .map(|s| {
            format!(
                "{} via {}: {} {}",
                s.revision,
                s.entry,
                s.status,
                s.error.as_deref().unwrap_or("")
            )
        })
        .collect()
}

/// API requests by verb since `before` (embedded API server only).
pub fn api_delta(cluster: &SimCluster, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    cluster
        .api_requests_by_verb()
        .into_iter()
        .map(|(verb, n)| {
            let b = before.get(&verb).copied().unwrap_or(0);
            (verb, n - b)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Answered and failed requests per 100 ms since `t0`, as timeline lines; the run's requests
/// that left no sample (never sent, cut off, a sender that panicked) are failed ones at their
/// intended send times.
pub fn request_lines(samples: &[Sample], run: &crate::open_loop::Run, t0: Instant) -> Vec<Line> {
    let events = samples
        .iter()
        .map(|s| (s.sent.saturating_duration_since(t0).as_secs_f64(), s.ok()))
        .chain(without_sample(run).map(|o| (o.intended.as_secs_f64(), false)));
    let bins = plot::bucket(events, 0.1);
    vec![
        Line {
            name: "answered".into(),
            points: bins.iter().map(|b| (b.0, b.1)).collect(),
        },
        Line {
            name: "failed".into(),
            points: bins.iter().map(|b| (b.0, b.2)).collect(),
        },
    ]
}

/// The requests of an open-loop run that left no sample: never sent (overflow), cut off at
/// the end of a cancelled run, or whose sender task panicked.
pub fn without_sample(
    run: &crate::open_loop::Run,
) -> impl Iterator<Item = &crate::open_loop::Outcome> {
    use crate::open_loop::Fate;
    run.outcomes
        .iter()
        .filter(|o| matches!(o.fate, Fate::Overflowed | Fate::Aborted | Fate::Panicked))
}

/// When the requests that were never sent were due, in seconds from the run's start.
pub fn overflowed_at(run: &crate::open_loop::Run) -> Vec<f64> {
    run.outcomes
        .iter()
        .filter(|o| o.fate == crate::open_loop::Fate::Overflowed)
        .map(|o| o.intended.as_secs_f64())
        .collect()
}

/// Sends a request for `rev` through a random member of its subset as `members` sees it now
/// (as an ingress following the ActivationEndpoints would), under the sender's ingress model
/// (a retry goes to another member, as the watch sees them then), and records the sample;
/// false when it failed. A revision with no member with an address is a failed request too,
/// recorded as such.
pub fn via_a_member(
    members: &MemberWatch,
    entries: &[(String, SocketAddr)],
    sender: &Sender,
    samples: &Arc<Mutex<Vec<Sample>>>,
    rev: String,
) -> impl std::future::Future<Output = bool> + Send + 'static {
    let view = members.view();
    let entries = entries.to_vec();
    let pick = move |rev: &str, not: Option<&str>| {
        let subset: Vec<String> = view
            .of(rev)
            .into_iter()
            .filter(|n| Some(n.as_str()) != not)
            .filter(|n| entries.iter().any(|(e, _)| e == n))
            .collect();
        (!subset.is_empty())
            .then(|| &subset[rand::rng().random_range(0..subset.len())])
            .and_then(|node| entries.iter().find(|(n, _)| n == node).cloned())
    };
    let first = pick(&rev, None);
    let (sender, samples) = (sender.clone(), samples.clone());
    async move {
        let s = match first {
            None => Sample::unsent(
                &rev,
                format!("no member of {rev} with an address to send it to"),
            ),
            Some(first) => {
                let send = |e: (String, SocketAddr)| {
                    let (sender, rev) = (sender.clone(), rev.clone());
                    async move { sender.send(&e, &rev, &[]).await }
                };
                with_ingress(
                    sender.ingress,
                    first,
                    |failed| pick(&rev, Some(failed)),
                    send,
                )
                .await
            }
        };
        let ok = s.ok();
        samples.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        ok
    }
}

/// The failures of an open-loop run over its samples, under one ingress model: the run's
/// requests that left no sample (never sent, cut off, or whose task panicked) fail under
/// either.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Failures {
    pub failed_requests: usize,
    /// Of them, sent before `split` (the repair, in node-failure).
    pub before: usize,
    /// Of them, sent after `split`.
    pub after: usize,
}

impl Failures {
    /// Counts the failures of `run` and its `samples` (sent from `t0`, the run's start),
    /// split at `split` after `t0`; `failed` says whether a sample failed under the model.
    pub fn of(
        run: &crate::open_loop::Run,
        samples: &[Sample],
        t0: Instant,
        split: Option<std::time::Duration>,
        failed: impl Fn(&Sample) -> bool,
    ) -> Self {
        let at: Vec<std::time::Duration> = samples
            .iter()
            .filter(|s| failed(s))
            .map(|s| s.sent.saturating_duration_since(t0))
            .chain(without_sample(run).map(|o| o.intended))
            .collect();
        let after = split.map_or(0, |r| at.iter().filter(|t| **t > r).count());
        Self {
            failed_requests: at.len(),
            before: at.len() - after,
            after,
        }
    }
}

/// Requests whose first attempt went to one of `nodes` and was outstanding at some moment of
/// `window` (since `t0`): in flight there when it left or died.
pub fn in_flight_on<'a>(
    samples: &'a [Sample],
    nodes: &[String],
    t0: Instant,
    window: (std::time::Duration, std::time::Duration),
) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| nodes.iter().any(|n| n == s.first_entry()))
        .filter(|s| {
            let start = s.sent.saturating_duration_since(t0);
            start <= window.1 && start + s.first_latency() >= window.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::open_loop::{Fate, Outcome, Run};
    use std::time::Duration;

    #[test]
    fn requests_that_left_no_sample_are_failures_in_the_timeline_and_the_counts() {
        let at = |ms: u64, fate: Fate| Outcome {
            intended: Duration::from_millis(ms),
            send_lag: Duration::ZERO,
            latency: Duration::from_millis(1),
            fate,
        };
        let run = Run {
            outcomes: vec![
                at(0, Fate::Answered),
                at(150, Fate::Overflowed),
                at(160, Fate::Panicked),
            ],
            cancelled: false,
            elapsed: Duration::from_millis(200),
        };
        let t0 = Instant::now();
        let mut sample = Sample::unsent("r", String::new());
        (sample.error, sample.status, sample.entry, sample.sent) = (None, 200, "n".into(), t0);
        let lines = request_lines(std::slice::from_ref(&sample), &run, t0);
        let total = |l: &Line| l.points.iter().map(|p| p.1).sum::<f64>();
        assert_eq!((total(&lines[0]), total(&lines[1])), (1.0, 2.0));
        assert_eq!(overflowed_at(&run), [0.15]);
        let f = Failures::of(&run, &[sample], t0, Some(Duration::from_millis(155)), |s| {
            !s.ok()
        });
        assert_eq!((f.failed_requests, f.before, f.after), (2, 1, 1));
    }
}
