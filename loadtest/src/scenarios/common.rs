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
use crate::driver::{Driver, Sample};
use crate::observe::MemberWatch;
use crate::plot::{self, Line};
use crate::stats::Percentiles;

/// How requests reach the activators.
#[derive(Clone)]
pub struct Sender {
    pub driver: Driver,
    pub namespace: String,
    pub by_host: bool,
}

impl Sender {
    pub fn new(namespace: &str, by_host: bool) -> Self {
        Self {
            driver: Driver::new(),
            namespace: namespace.to_string(),
            by_host,
        }
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
    pub errors: usize,
    /// Requests that waited for a slot (a pod starting or all busy).
    pub cold: usize,
    /// Cold starts: distinct pods that answered requests which waited for them to start.
    pub cold_starts: usize,
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
        let phases: Vec<ColdPhases> = ok().filter_map(|s| s.phases).collect();
        Self {
            requests: samples.len(),
            errors: samples.iter().filter(|s| !s.ok()).count(),
            cold: cold.len(),
            cold_starts: ok()
                .filter(|s| s.phases.is_some())
                .filter_map(|s| s.pod.as_deref())
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            cold_ms: Percentiles::of(&cold),
            warm_ms: Percentiles::of(&warm),
            anatomy: Anatomy::of(&phases),
            error_samples: errors(samples),
        }
    }

    /// Cold and warm latencies in ms, for a CDF.
    pub fn cdf_series(samples: &[Sample]) -> Vec<(&'static str, Vec<f64>)> {
        let ms = |cold: bool| {
            samples
                .iter()
                .filter(|s| s.ok() && s.cold == cold)
                .map(|s| s.latency.as_secs_f64() * 1e3)
                .collect()
        };
        vec![("cold", ms(true)), ("warm", ms(false))]
    }

    /// Table lines.
    pub fn lines(&self) -> String {
        let mut o = format!(
            "requests {}  errors {}  waited (cold) {}  cold starts (pods) {}\n",
            self.requests, self.errors, self.cold, self.cold_starts
        );
        o += &pct_line("cold ms", &self.cold_ms);
        o += &pct_line("warm ms", &self.warm_ms);
        if self.anatomy.count > 0 {
            o += &format!(
                "cold-start anatomy ({} requests that waited for a pod start), ms:\n",
                self.anatomy.count
            );
            for (name, p) in crate::anatomy::SEGMENTS.iter().zip(self.anatomy.segments()) {
                o += &pct_line(&format!("  {name}"), p);
            }
            o += &pct_line("  arrival→first byte", &self.anatomy.total_ms);
        }
        for e in &self.error_samples {
            o += &format!("error: {e}\n");
        }
        o
    }
}

/// One table line of percentiles.
pub fn pct_line(name: &str, p: &Percentiles) -> String {
    if p.count == 0 {
        format!("{name:<24} no samples\n")
    } else {
        format!(
            "{name:<24} p50 {:>9.2}  p90 {:>9.2}  p99 {:>9.2}  max {:>9.2}  (n={})\n",
            p.p50, p.p90, p.p99, p.max, p.count
        )
    }
}

/// The first five failed samples, verbatim.
pub fn errors(samples: &[Sample]) -> Vec<String> {
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

/// Answered and failed requests per 100 ms since `t0`, as timeline lines.
pub fn request_lines(samples: &[Sample], t0: Instant) -> Vec<Line> {
    let events = samples
        .iter()
        .map(|s| (s.sent.saturating_duration_since(t0).as_secs_f64(), s.ok()));
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

/// Sends a request for `rev` through a random member of its subset as `members` sees it now
/// (as an ingress following the ActivationEndpoints would), and records the sample; false when
/// it failed or the revision has no member with an address.
pub fn via_a_member(
    members: &MemberWatch,
    entries: &[(String, SocketAddr)],
    sender: &Sender,
    samples: &Arc<Mutex<Vec<Sample>>>,
    rev: String,
) -> impl std::future::Future<Output = bool> + Send + 'static {
    let subset: Vec<String> = members
        .members()
        .get(&rev)
        .map(|s| s.iter().cloned().collect())
        .unwrap_or_default();
    let entry = (!subset.is_empty())
        .then(|| &subset[rand::rng().random_range(0..subset.len())])
        .and_then(|node| entries.iter().find(|(n, _)| n == node).cloned());
    let (sender, samples) = (sender.clone(), samples.clone());
    async move {
        let Some(entry) = entry else { return false };
        let s = sender.send(&entry, &rev, &[]).await;
        let ok = s.ok();
        samples.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        ok
    }
}
