//! `bench control`: the cold-start control path. K cold revisions, one request each; the
//! activator's own phase histogram (`activator_cold_start_phase_seconds`, from request
//! arrival) when it exposes one, and always the view from outside: when a watch in the bench
//! saw each pod created and Ready, and the client's end-to-end latency.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use kubesim::node::Delay;

use crate::Error;
use crate::cluster::{BenchCluster, ClusterOptions, NAMESPACE, create_revision};
use crate::http::{get, revision_headers};
use crate::process::{activator_binary, spawn_activator};
use crate::prom;

/// The activator's phase histogram and its phases, in path order.
pub const PHASE_HISTOGRAM: &str = "activator_cold_start_phase_seconds";
pub const PHASES: [&str; 4] = [
    "pod_post_sent",
    "pod_bound_seen",
    "pod_ready_seen",
    "first_byte",
];

/// `bench control`'s knobs.
#[derive(Debug, Clone)]
pub struct ControlOptions {
    pub revisions: usize,
    /// Requests in flight at once (1: one after another).
    pub concurrency: usize,
    pub write_latency: Delay,
    pub activator_bin: Option<PathBuf>,
}

impl Default for ControlOptions {
    fn default() -> Self {
        Self {
            revisions: 200,
            concurrency: 1,
            write_latency: Delay::ZERO,
            activator_bin: None,
        }
    }
}

/// p50/p99 of one phase.
#[derive(Debug, Clone)]
pub struct Phase {
    pub name: String,
    pub count: u64,
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
}

/// What `bench control` measured.
#[derive(Debug, Clone)]
pub struct ControlReport {
    pub revisions: usize,
    pub concurrency: usize,
    pub api: String,
    /// From the activator's histogram; None when it does not expose one.
    pub activator_phases: Option<Vec<Phase>>,
    /// From outside: the bench's pod watch and the client.
    pub outside: Vec<Phase>,
    pub statuses: BTreeMap<u16, usize>,
    pub errors: usize,
    pub cold_answers: usize,
    pub api_requests: BTreeMap<String, u64>,
    pub wall: Duration,
}

/// When the bench's watch first saw each pod, and first saw it Ready, by revision.
#[derive(Default)]
struct PodTimes {
    created: HashMap<String, Instant>,
    ready: HashMap<String, Instant>,
}

pub async fn run(opts: &ControlOptions) -> Result<ControlReport, Error> {
    let max = kubesim::node::addresses::MAX_PODS_PER_NODE;
    if opts.revisions == 0 || opts.revisions > max {
        return Err(Error::Options(format!(
            "--revisions must be 1..={max} (the pods of one simulated node)"
        )));
    }
    let bin = activator_binary(opts.activator_bin.as_deref())?;
    let cluster = BenchCluster::start(ClusterOptions {
        write_latency: opts.write_latency.clone(),
        ..ClusterOptions::default()
    })
    .await?;
    let ip = cluster.node_ip();
    let data = std::net::SocketAddr::from((ip, crate::cluster::free_port(ip)?));
    let admin = std::net::SocketAddr::from((ip, crate::cluster::free_port(ip)?));
    let names: Vec<String> = (0..opts.revisions)
        .map(|i| format!("cold-{i:04}"))
        .collect();
    let member = [cluster.member(data)];
    futures::stream::iter(names.iter())
        .map(|n| create_revision(&cluster.client, n, &member, |_| {}))
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>, Error>>()?;
    let mut activator = spawn_activator(
        &bin,
        &cluster.kubeconfig,
        cluster.node_name(),
        data,
        admin,
        cluster.dir.path().join("activator.log"),
    )?;
    activator.wait_ready(Duration::from_secs(60)).await?;

    let times = Arc::new(Mutex::new(PodTimes::default()));
    let watch = watch_pods(cluster.client.clone(), times.clone()).await?;

    let api_before = cluster.api_requests_by_verb();
    let began = Instant::now();
    type Answer = Result<(crate::http::Reply, Duration), Error>;
    let results: Vec<(String, Instant, Answer)> = futures::stream::iter(names.iter())
        .map(|n| async move {
            let sent = Instant::now();
            let r = get(
                data,
                "/",
                &revision_headers(NAMESPACE, n),
                Duration::from_secs(60),
            )
            .await;
            (n.clone(), sent, r.map(|r| (r, sent.elapsed())))
        })
        .buffer_unordered(opts.concurrency.max(1))
        .collect()
        .await;
    let wall = began.elapsed();
    // The client's end-to-end times, measured when each answer had been read.
    let mut e2e = Vec::new();
    let mut statuses = BTreeMap::new();
    let (mut errors, mut cold) = (0, 0);
    let mut sent_at = HashMap::new();
    for (name, sent, r) in &results {
        sent_at.insert(name.clone(), *sent);
        match r {
            Ok((reply, took)) => {
                e2e.push(*took);
                *statuses.entry(reply.status.as_u16()).or_insert(0) += 1;
                if reply.headers.contains_key("x-activator-cold-start") {
                    cold += 1;
                }
            }
            Err(e) => {
                errors += 1;
                tracing::warn!(revision = %name, error = %e, "cold request failed");
            }
        }
    }
    // Ready events may trail the answer by a moment; give the watch a little time.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let api_after = cluster.api_requests_by_verb();
    watch.abort();
    let metrics = activator.metrics().await.ok_or_else(|| Error::Http {
        target: format!("{admin}/metrics"),
        message: "no 200 answer within 5 s".into(),
    })?;
    activator.stop().await;
    let api = cluster.api_description();
    cluster.shutdown().await;

    let t = times.lock().unwrap_or_else(|e| e.into_inner());
    let since = |m: &HashMap<String, Instant>| -> Vec<Duration> {
        m.iter()
            .filter_map(|(rev, at)| Some(at.saturating_duration_since(*sent_at.get(rev)?)))
            .collect()
    };
    let phase = |name: &str, samples: &[Duration]| Phase {
        name: name.into(),
        count: samples.len() as u64,
        p50: crate::stats::quantile(samples, 0.5),
        p99: crate::stats::quantile(samples, 0.99),
    };
    let outside = vec![
        phase("pod created (watch saw it)", &since(&t.created)),
        phase("pod Ready (watch saw it)", &since(&t.ready)),
        phase("end to end (client)", &e2e),
    ];
    let api_requests = api_after
        .into_iter()
        .map(|(verb, n)| {
            let d = n - api_before.get(&verb).copied().unwrap_or(0);
            (verb, d)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    Ok(ControlReport {
        revisions: opts.revisions,
        concurrency: opts.concurrency.max(1),
        api,
        activator_phases: activator_phases(&metrics),
        outside,
        statuses,
        errors,
        cold_answers: cold,
        api_requests,
        wall,
    })
}

/// The phases of the activator's histogram, in path order (others after), or None when the
/// activator has no such histogram.
pub fn activator_phases(metrics: &str) -> Option<Vec<Phase>> {
    let samples = prom::parse(metrics);
    let by = prom::histograms_by(&samples, PHASE_HISTOGRAM, "phase");
    if by.is_empty() {
        return None;
    }
    let mut names: Vec<&String> = by.keys().collect();
    names.sort_by_key(|n| PHASES.iter().position(|p| p == n).unwrap_or(PHASES.len()));
    Some(
        names
            .into_iter()
            .map(|n| {
                let b = &by[n];
                let q = |q| prom::quantile(b, q).and_then(|s| Duration::try_from_secs_f64(s).ok());
                Phase {
                    name: n.clone(),
                    count: prom::count(b) as u64,
                    p50: q(0.5),
                    p99: q(0.99),
                }
            })
            .collect(),
    )
}

/// Starts a watch of the bench namespace's pods recording when each revision's pod was first
/// seen and first seen Ready; returns once the initial list is in.
async fn watch_pods(
    client: kube::Client,
    times: Arc<Mutex<PodTimes>>,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let api: Api<Pod> = Api::namespaced(client, NAMESPACE);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(ev) = stream.next().await {
            let now = Instant::now();
            let pod = match ev {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                _ => continue,
            };
            let Some(rev) = pod.labels().get(crds::contract::REVISION_LABEL).cloned() else {
                continue;
            };
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let mut t = times.lock().unwrap_or_else(|e| e.into_inner());
            t.created.entry(rev.clone()).or_insert(now);
            if ready {
                t.ready.entry(rev).or_insert(now);
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), rx)
        .await
        .map_err(|_| Error::Timeout {
            what: "the bench's pod watch to list".into(),
            secs: 30,
        })?
        .map_err(|_| Error::Options("the pod watch ended".into()))?;
    Ok(task)
}

fn ms(d: Option<Duration>) -> String {
    d.map(|d| format!("{:.2}", d.as_secs_f64() * 1e3))
        .unwrap_or_else(|| "-".into())
}

fn phase_table(f: &mut fmt::Formatter<'_>, phases: &[Phase]) -> fmt::Result {
    writeln!(
        f,
        "  {:<28} {:>6} {:>9} {:>9}",
        "phase", "n", "p50 ms", "p99 ms"
    )?;
    for p in phases {
        writeln!(
            f,
            "  {:<28} {:>6} {:>9} {:>9}",
            p.name,
            p.count,
            ms(p.p50),
            ms(p.p99)
        )?;
    }
    Ok(())
}

impl fmt::Display for ControlReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "control path: {} cold revisions, one request each, {} at a time, in {:.2} s",
            self.revisions,
            self.concurrency,
            self.wall.as_secs_f64()
        )?;
        writeln!(f, "API server: {}", self.api)?;
        writeln!(
            f,
            "answers: {:?} (status: count), {} cold, {} errors",
            self.statuses, self.cold_answers, self.errors
        )?;
        match &self.activator_phases {
            Some(p) => {
                writeln!(
                    f,
                    "activator's histogram {PHASE_HISTOGRAM} (from request arrival; \
                     quantiles interpolated inside its buckets):"
                )?;
                phase_table(f, p)?;
            }
            None => writeln!(
                f,
                "activator's histogram {PHASE_HISTOGRAM}: not exposed by this activator; \
                 figures below are from outside"
            )?,
        }
        writeln!(
            f,
            "from outside (the bench's pod watch and its client, from request sent):"
        )?;
        phase_table(f, &self.outside)?;
        writeln!(
            f,
            "API requests during the run (the bench's pod watch included): {:?}",
            self.api_requests
        )
    }
}
