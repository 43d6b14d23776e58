//! A real API server's own figures, read from its `/metrics` with the client's credentials:
//! request latency by verb and resource (`apiserver_request_duration_seconds`, the histogram
//! the Kubernetes scalability SLOs are stated on), the watches it holds open, its memory and
//! CPU; and, when the control plane runs on this machine, etcd's and the API server's
//! processes as `/proc` shows them. Parsing and the SLO arithmetic are pure and tested here.

use std::collections::BTreeMap;

/// (verb, resource with its subresource, scope) of one latency histogram.
pub type Series = (String, String, String);

/// One histogram: cumulative counts by upper bound (ascending, `+Inf` last as infinity).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
}

impl Histogram {
    pub fn count(&self) -> f64 {
        self.buckets.last().map_or(0.0, |b| b.1)
    }

    /// This histogram less `before` (the requests between two readings).
    pub fn since(&self, before: Option<&Histogram>) -> Histogram {
        let Some(before) = before else {
            return self.clone();
        };
        let buckets = self
            .buckets
            .iter()
            .map(|(le, n)| {
                let was = before
                    .buckets
                    .iter()
                    .find(|(l, _)| l == le)
                    .map_or(0.0, |b| b.1);
                (*le, (n - was).max(0.0))
            })
            .collect();
        Histogram { buckets }
    }

    /// The share of requests that took at most `secs` (exact at a bucket bound, linear
    /// within a bucket otherwise); None when empty.
    pub fn share_within(&self, secs: f64) -> Option<f64> {
        let total = self.count();
        if total <= 0.0 {
            return None;
        }
        let mut prev = (0.0, 0.0);
        for &(le, n) in &self.buckets {
            if secs <= le {
                if le.is_infinite() {
                    return Some(prev.1 / total);
                }
                let frac = (secs - prev.0) / (le - prev.0);
                return Some((prev.1 + (n - prev.1) * frac) / total);
            }
            prev = (le, n);
        }
        Some(prev.1 / total)
    }

    /// The `q` quantile in seconds as Prometheus' `histogram_quantile` computes it (linear
    /// within the bucket it falls in; the last finite bound if it falls in `+Inf`); None when
    /// empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut prev = (0.0, 0.0);
        for &(le, n) in &self.buckets {
            if n >= rank {
                if le.is_infinite() {
                    return Some(prev.0);
                }
                let in_bucket = n - prev.1;
                let frac = if in_bucket > 0.0 {
                    (rank - prev.1) / in_bucket
                } else {
                    1.0
                };
                return Some(prev.0 + (le - prev.0) * frac);
            }
            prev = (le, n);
        }
        Some(prev.0)
    }
}

/// One reading of `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Request latency by series (WATCH and CONNECT are not in this histogram's SLOs and
    /// left out).
    pub latency: BTreeMap<Series, Histogram>,
    /// Watches open (`apiserver_longrunning_requests{verb="WATCH"}`), all resources.
    pub watches: f64,
    /// `process_resident_memory_bytes`.
    pub rss_bytes: f64,
    /// `process_cpu_seconds_total`.
    pub cpu_secs: f64,
    /// Watches the server closed because their watcher fell behind
    /// (`apiserver_terminated_watchers_total`, all resources).
    pub terminated_watchers: f64,
    /// The same, by resource (`activationendpoints.local-activator.dev`, `pods`).
    pub terminated_by_resource: BTreeMap<String, f64>,
    /// WATCH requests made, by resource (the `+Inf` bucket of their latency histogram: the
    /// histogram's SLOs leave watches out, but it counts them).
    pub watch_requests: BTreeMap<String, f64>,
}

/// A sample line: its name, labels and value (floats, as the API server writes them).
fn sample(line: &str) -> Option<(&str, BTreeMap<&str, &str>, f64)> {
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let (head, value) = line.rsplit_once(' ')?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        v => v.parse().ok()?,
    };
    let (name, labels) = match head.split_once('{') {
        Some((n, rest)) => (n, rest.strip_suffix('}')?),
        None => (head, ""),
    };
    // Label values here never hold `",` (verbs, resources, scopes, bounds).
    let labels = labels
        .split("\",")
        .filter_map(|kv| {
            let (k, v) = kv.split_once("=\"")?;
            Some((k.trim_start_matches(','), v.trim_end_matches('"')))
        })
        .collect();
    Some((name, labels, value))
}

impl Snapshot {
    pub fn parse(text: &str) -> Self {
        let mut s = Snapshot::default();
        for line in text.lines() {
            let Some((name, labels, value)) = sample(line) else {
                continue;
            };
            match name {
                "apiserver_request_duration_seconds_bucket" => {
                    let verb = labels.get("verb").copied().unwrap_or_default();
                    if verb == "WATCH" && labels.get("le") == Some(&"+Inf") {
                        let resource = labels.get("resource").copied().unwrap_or("");
                        *s.watch_requests.entry(resource.to_string()).or_default() += value;
                    }
                    if verb == "WATCH" || verb == "CONNECT" {
                        continue;
                    }
                    let le = match labels.get("le").copied() {
                        Some("+Inf") => f64::INFINITY,
                        Some(l) => match l.parse() {
                            Ok(l) => l,
                            Err(_) => continue,
                        },
                        None => continue,
                    };
                    let resource = match labels.get("subresource").copied() {
                        Some(sub) if !sub.is_empty() => {
                            format!("{}/{sub}", labels.get("resource").copied().unwrap_or(""))
                        }
                        _ => labels.get("resource").copied().unwrap_or("").to_string(),
                    };
                    let key = (
                        verb.to_string(),
                        resource,
                        labels.get("scope").copied().unwrap_or("").to_string(),
                    );
                    // Several series (groups, versions, components) may share a key: added.
                    let h = s.latency.entry(key).or_default();
                    match h.buckets.iter_mut().find(|(l, _)| *l == le) {
                        Some(b) => b.1 += value,
                        None => h.buckets.push((le, value)),
                    }
                }
                "apiserver_longrunning_requests" if labels.get("verb") == Some(&"WATCH") => {
                    s.watches += value
                }
                "process_resident_memory_bytes" => s.rss_bytes = value,
                "process_cpu_seconds_total" => s.cpu_secs = value,
                "apiserver_terminated_watchers_total" => {
                    s.terminated_watchers += value;
                    let resource = labels.get("resource").copied().unwrap_or("");
                    *s.terminated_by_resource
                        .entry(resource.to_string())
                        .or_default() += value;
                }
                _ => {}
            }
        }
        for h in s.latency.values_mut() {
            h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        s
    }

    /// Reads the API server's `/metrics` through `client`.
    pub async fn fetch(client: &kube::Client) -> Result<Self, kube::Error> {
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        Ok(Self::parse(&client.request_text(req).await?))
    }

    /// What happened between `before` and this reading.
    pub fn since(&self, before: &Snapshot) -> Phase {
        let requests = self
            .latency
            .iter()
            .map(|(k, h)| (k.clone(), h.since(before.latency.get(k))))
            .filter(|(_, h)| h.count() > 0.0)
            .collect();
        let delta = |now: &BTreeMap<String, f64>, was: &BTreeMap<String, f64>| {
            now.iter()
                .map(|(k, v)| (k.clone(), (v - was.get(k).copied().unwrap_or(0.0)).max(0.0)))
                .filter(|(_, v)| *v > 0.0)
                .collect()
        };
        Phase {
            requests,
            terminated: delta(&self.terminated_by_resource, &before.terminated_by_resource),
            watch_requests: delta(&self.watch_requests, &before.watch_requests),
            watches: self.watches,
            rss_bytes: self.rss_bytes,
            cpu_secs: (self.cpu_secs - before.cpu_secs).max(0.0),
        }
    }
}

/// The requests of a phase, and the server's state at its end.
#[derive(Debug, Clone, Default)]
pub struct Phase {
    pub requests: BTreeMap<Series, Histogram>,
    /// Watches the server closed for falling behind, by resource.
    pub terminated: BTreeMap<String, f64>,
    /// WATCH requests made, by resource.
    pub watch_requests: BTreeMap<String, f64>,
    pub watches: f64,
    pub rss_bytes: f64,
    pub cpu_secs: f64,
}

/// The SLO class of a series, with its p99 limit in seconds (the Kubernetes scalability SLOs:
/// mutating calls and single-object reads ≤ 1 s; lists ≤ 1 s for one object's scope,
/// 5 s for a namespace, 30 s for the cluster). None for what the SLOs leave out: watches,
/// and requests for no API object (`/readyz`, `/metrics`: no scope), which the SLOs' "API
/// calls" are not (the subsetter's once-a-second `/readyz` was read as a single-object read).
pub fn slo_limit(verb: &str, scope: &str) -> Option<(&'static str, f64)> {
    if scope.is_empty() {
        return None;
    }
    match verb {
        "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY" => Some(("mutating", 1.0)),
        "GET" => Some(("read one", 1.0)),
        "LIST" => match scope {
            "resource" => Some(("list", 1.0)),
            "namespace" => Some(("list", 5.0)),
            "cluster" => Some(("list", 30.0)),
            _ => None,
        },
        _ => None,
    }
}

/// One series' figures in a phase.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SeriesFigures {
    pub verb: String,
    pub resource: String,
    pub scope: String,
    pub count: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub slo_ms: Option<f64>,
    /// More than 1 % of the phase's requests over the SLO's limit. (The SLOs take p99 over
    /// 5 minutes; a phase may be shorter or longer: the figure is over the phase.)
    pub breach: bool,
}

impl Phase {
    /// Every series with its percentiles, most requests first.
    pub fn figures(&self) -> Vec<SeriesFigures> {
        let mut v: Vec<SeriesFigures> = self
            .requests
            .iter()
            .map(|((verb, resource, scope), h)| {
                let p99 = h.quantile(0.99);
                let slo = slo_limit(verb, scope).map(|(_, s)| s);
                SeriesFigures {
                    verb: verb.clone(),
                    resource: resource.clone(),
                    scope: scope.clone(),
                    count: h.count() as u64,
                    p50_ms: h.quantile(0.5).map(|s| s * 1e3),
                    p99_ms: p99.map(|s| s * 1e3),
                    slo_ms: slo.map(|s| s * 1e3),
                    // Fewer than 99 % within the limit: exact where the limit is a bucket
                    // bound (1, 5 and 30 s are), and right when the tail is all in +Inf.
                    breach: slo
                        .and_then(|s| h.share_within(s))
                        .is_some_and(|w| w < 0.99),
                }
            })
            .collect();
        v.sort_by_key(|f| std::cmp::Reverse(f.count));
        v
    }

    /// Requests by verb.
    pub fn by_verb(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for ((verb, _, _), h) in &self.requests {
            *m.entry(verb.clone()).or_default() += h.count() as u64;
        }
        m
    }

    /// One line: requests by verb, the worst p99 of each SLO class against its limit, and
    /// the series over their limit.
    pub fn line(&self) -> String {
        let figures = self.figures();
        let verbs: Vec<String> = self
            .by_verb()
            .iter()
            .map(|(v, n)| format!("{v} {n}"))
            .collect();
        let mut worst: BTreeMap<&str, (f64, String, f64)> = BTreeMap::new();
        for f in &figures {
            let (Some((class, limit)), Some(p99)) = (slo_limit(&f.verb, &f.scope), f.p99_ms) else {
                continue;
            };
            let name = format!("{} {} ({})", f.verb, f.resource, f.scope);
            let e = worst.entry(class).or_insert((p99, name.clone(), limit));
            if p99 / limit > e.0 / e.2 {
                *e = (p99, name, limit);
            }
        }
        let worst: Vec<String> = worst
            .iter()
            .map(|(class, (p99, name, limit))| {
                format!(
                    "{class} worst p99 {p99:.0} ms ({name}; SLO {:.0} ms)",
                    limit * 1e3
                )
            })
            .collect();
        let breaches = figures.iter().filter(|f| f.breach).count();
        let ae = "activationendpoints";
        let ae_lists: u64 = figures
            .iter()
            .filter(|f| f.verb == "LIST" && f.resource == ae)
            .map(|f| f.count)
            .sum();
        let ae_watches = self.watch_requests.get(ae).copied().unwrap_or(0.0);
        // Folded from +0: an empty f64 sum is -0, printed "-0".
        let forced = self.terminated.values().fold(0.0, |a, b| a + b);
        let forced_by: Vec<String> = self
            .terminated
            .iter()
            .map(|(r, n)| format!("{r} {n:.0}"))
            .collect();
        format!(
            "API server requests {} ({}); {}; SLO breaches {breaches}; ActivationEndpoints LIST {ae_lists}, WATCH {ae_watches:.0}; forced watch closes {forced:.0}{}; {:.0} watches open; RSS {:.0} MiB; {:.0} s CPU",
            figures.iter().map(|f| f.count).sum::<u64>(),
            verbs.join(", "),
            worst.join("; "),
            if forced_by.is_empty() {
                String::new()
            } else {
                format!(" ({})", forced_by.join(", "))
            },
            self.watches,
            self.rss_bytes / (1024.0 * 1024.0),
            self.cpu_secs,
        )
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "by_verb": self.by_verb(),
            "series": self.figures(),
            "slo_breaches": self.figures().iter().filter(|f| f.breach).count(),
            "forced_watch_closes": self.terminated,
            "watch_requests": self.watch_requests,
            "watches_open": self.watches,
            "rss_mib": self.rss_bytes / (1024.0 * 1024.0),
            "cpu_s": self.cpu_secs,
        })
    }
}

/// A process on this machine by its command name (`/proc/<pid>/comm`): resident memory in
/// bytes and CPU seconds used (user + system). None when no such process runs here (the
/// control plane is elsewhere) or several do.
pub fn local_process(comm: &str) -> Option<(u64, f64)> {
    let mut found = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let path = entry.path();
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        if name.trim_end() != comm {
            continue;
        }
        if found.is_some() {
            return None;
        }
        let status = std::fs::read_to_string(path.join("status")).ok()?;
        let rss_kib: u64 = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let stat = std::fs::read_to_string(path.join("stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
        found = Some((rss_kib * 1024, ticks / 100.0));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP apiserver_request_duration_seconds [STABLE] Response latency
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"namespace\",subresource=\"\",verb=\"POST\",version=\"v1\",le=\"0.1\"} 90
apiserver_request_duration_seconds_bucket{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"namespace\",subresource=\"\",verb=\"POST\",version=\"v1\",le=\"1\"} 99
apiserver_request_duration_seconds_bucket{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"namespace\",subresource=\"\",verb=\"POST\",version=\"v1\",le=\"+Inf\"} 100
apiserver_request_duration_seconds_bucket{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"namespace\",subresource=\"status\",verb=\"PATCH\",version=\"v1\",le=\"0.1\"} 10
apiserver_request_duration_seconds_bucket{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"namespace\",subresource=\"status\",verb=\"PATCH\",version=\"v1\",le=\"+Inf\"} 10
apiserver_request_duration_seconds_bucket{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\",version=\"v1\",le=\"+Inf\"} 7
apiserver_request_duration_seconds_sum{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"namespace\",subresource=\"\",verb=\"POST\",version=\"v1\"} 12.5
apiserver_longrunning_requests{component=\"apiserver\",group=\"\",resource=\"pods\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 3
apiserver_longrunning_requests{component=\"apiserver\",group=\"\",resource=\"nodes\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 4
process_resident_memory_bytes 1.048576e+08
process_cpu_seconds_total 12.5
apiserver_terminated_watchers_total{resource=\"activationendpoints.local-activator.dev\"} 245
apiserver_terminated_watchers_total{resource=\"pods\"} 5
";

    #[test]
    fn histograms_by_verb_resource_and_scope_watches_and_process() {
        let s = Snapshot::parse(TEXT);
        let post = &s.latency[&("POST".into(), "pods".into(), "namespace".into())];
        assert_eq!(
            post.buckets,
            vec![(0.1, 90.0), (1.0, 99.0), (f64::INFINITY, 100.0)]
        );
        assert!(s.latency.contains_key(&(
            "PATCH".into(),
            "pods/status".into(),
            "namespace".into()
        )));
        assert_eq!(
            s.latency.len(),
            2,
            "WATCH is left out: {:?}",
            s.latency.keys()
        );
        assert_eq!(s.watches, 7.0);
        assert_eq!(s.rss_bytes, 104_857_600.0);
        assert_eq!(s.cpu_secs, 12.5);
        assert_eq!(s.terminated_watchers, 250.0, "summed over resources");
        assert_eq!(
            s.terminated_by_resource["activationendpoints.local-activator.dev"],
            245.0
        );
        assert_eq!(s.watch_requests["pods"], 7.0, "the +Inf bucket of WATCH");
    }

    #[test]
    fn a_phase_counts_forced_closes_and_watches_made_in_it_only() {
        let before = Snapshot::parse(TEXT);
        let later = TEXT.replace("} 245\n", "} 250\n").replace(
            "verb=\"WATCH\",version=\"v1\",le=\"+Inf\"} 7",
            "verb=\"WATCH\",version=\"v1\",le=\"+Inf\"} 9",
        );
        let p = Snapshot::parse(&later).since(&before);
        assert_eq!(
            p.terminated.get("activationendpoints.local-activator.dev"),
            Some(&5.0)
        );
        assert!(
            !p.terminated.contains_key("pods"),
            "pods' closes did not grow"
        );
        assert_eq!(p.watch_requests.get("pods"), Some(&2.0));
        assert!(p.line().contains("forced watch closes 5"), "{}", p.line());
        let quiet = Snapshot::parse(TEXT).since(&before);
        assert!(
            quiet.line().contains("forced watch closes 0;"),
            "{}",
            quiet.line()
        );
    }

    #[test]
    fn quantiles_interpolate_within_their_bucket_as_prometheus_does() {
        let h = Histogram {
            buckets: vec![(0.1, 90.0), (1.0, 99.0), (f64::INFINITY, 100.0)],
        };
        // p50: rank 50 of the first bucket's 90 → 0.1 × 50/90.
        assert!((h.quantile(0.5).unwrap() - 0.1 * 50.0 / 90.0).abs() < 1e-9);
        // p99: rank 99 ends the second bucket exactly.
        assert!((h.quantile(0.99).unwrap() - 1.0).abs() < 1e-9);
        // p999 falls in +Inf: the last finite bound.
        assert_eq!(h.quantile(0.999), Some(1.0));
        assert_eq!(Histogram::default().quantile(0.99), None);
        assert_eq!(h.share_within(1.0), Some(0.99));
        assert_eq!(h.share_within(0.1), Some(0.9));
        assert_eq!(h.share_within(100.0), Some(0.99));
    }

    #[test]
    fn a_phase_counts_only_what_happened_in_it_and_finds_breaches() {
        let before = Snapshot::parse(TEXT);
        let after = Snapshot::parse(
            &TEXT
                .replace("le=\"+Inf\"} 100", "le=\"+Inf\"} 120")
                .replace(
                    "process_cpu_seconds_total 12.5",
                    "process_cpu_seconds_total 20",
                ),
        );
        let phase = after.since(&before);
        // Only the POSTs moved: 20 requests, all slower than 1 s.
        assert_eq!(phase.by_verb(), BTreeMap::from([("POST".to_string(), 20)]));
        let f = phase.figures();
        assert_eq!(f.len(), 1);
        assert!(f[0].breach, "{f:?}");
        assert_eq!(f[0].p99_ms, Some(1000.0));
        assert_eq!(phase.cpu_secs, 7.5);
        assert!(phase.line().contains("SLO breaches 1"), "{}", phase.line());
        // Nothing moved: nothing to breach.
        assert_eq!(before.since(&before).figures().len(), 0);
    }

    #[test]
    fn slo_classes() {
        assert_eq!(slo_limit("PATCH", "namespace"), Some(("mutating", 1.0)));
        assert_eq!(slo_limit("GET", "namespace"), Some(("read one", 1.0)));
        assert_eq!(slo_limit("LIST", "cluster"), Some(("list", 30.0)));
        assert_eq!(slo_limit("LIST", "namespace"), Some(("list", 5.0)));
        assert_eq!(slo_limit("WATCH", "cluster"), None);
        assert_eq!(
            slo_limit("GET", ""),
            None,
            "a non-resource URL such as /readyz"
        );
    }

    #[test]
    fn a_process_is_found_by_its_name() {
        // A copy of sleep under a name nothing else has.
        let dir = std::env::temp_dir().join(format!("lt-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let name = format!("ltp{}", std::process::id() % 1_000_000);
        let bin = dir.join(&name);
        std::fs::copy("/bin/sleep", &bin).unwrap();
        let mut child = std::process::Command::new(&bin).arg("30").spawn().unwrap();
        let found = local_process(&name);
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let (rss, cpu) = found.expect("the process is found");
        assert!(rss > 0 && cpu >= 0.0);
        assert_eq!(local_process("no-such-process-here"), None);
    }
}
