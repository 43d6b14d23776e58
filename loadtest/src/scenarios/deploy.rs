//! `deploy`: a deploy under live traffic. Revision `v1` claims one host and is warm; closed-loop
//! clients send through every activator in turn (round robin) for the whole run, in phases:
//!
//! - `before`: `--before-secs` of v1 alone;
//! - `deploy`: `v2` created claiming the same host; the phase runs until every activator has
//!   answered from v2 (the host moved everywhere), then `--settle-secs`;
//! - `split`: a Route for the host, v1 10 % / v2 90 %; once every activator has answered from
//!   v1 again, `--split-requests` requests measure the shares;
//! - `rollback`: the Route patched to v1 100 % (one edit); the phase runs until every
//!   activator answers from v1 only, then `--settle-secs`;
//! - `after`: `--after-secs` of v1 alone.
//!
//! The revision that answered is read from the pod the app names (`x-pod-name`; app pods are
//! named `<revision>-<node hash>-<ordinal>`). Per phase: requests, failures by status, requests
//! that waited for a pod start (the activator's `x-activator-cold-start` mark on the answer),
//! latency percentiles with the failures ranked last. Per move and per activator: the time from
//! the decision (the deploy: the harness's watch seeing v2's `RoutesReady=True`; a Route: the
//! create or patch answered) to the first answer from the gaining revision, and to the answer
//! after which the entry sent nothing the losing one answered; over the activators, p99 and
//! max with the ones that never moved ranked last. The Ready pods of both revisions at the
//! decision and when the last activator had moved. Runs on the embedded kubesim (or simulated
//! nodes on `--kubeconfig`'s API server) and on an installed product (`loadtest installed
//! --deploy`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crds::contract::REVISION_LABEL;
use crds::{ActivationEndpoints, Revision, Route, RouteSpec, TrafficTarget};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::json;
use tokio::sync::watch as signal;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::common::{SampleSummary, pct_line};
use crate::Error;
use crate::driver::{Driver, Sample};
use crate::plot::{self, Line};
use crate::scenario::{Ctx, Knobs, Outcome, Report, Scenario, app_env};
use crate::stats::Percentiles;

/// The revisions, in the order they are deployed.
pub const OLD: &str = "v1";
pub const NEW: &str = "v2";
/// The Route's split: (revision, percent).
pub const SPLIT: [(&str, i32); 2] = [(OLD, 10), (NEW, 90)];
/// Answers in a row from the gaining revision that show an entry has rolled back: before the
/// rollback it answered from v1 one time in ten, so a stale entry gives 20 in a row with
/// probability 1e-20. (Only ends the phase: the figures come from every answer.)
const IN_A_ROW: usize = 20;
/// A bound on the split's measured requests (a hang detector, not a figure).
const SPLIT_LIMIT: Duration = Duration::from_secs(600);
/// Attempts per activator to wake v1 before the load.
const WARM_ATTEMPTS: usize = 5;

pub fn defaults() -> Knobs {
    Knobs {
        nodes: Some(5),
        activators: Some(3),
        clients: Some(8),
        start_delay_ms: Some(300),
        before_secs: Some(5.0),
        after_secs: Some(5.0),
        settle_secs: Some(3.0),
        split_requests: Some(2000),
        hand_over_timeout_secs: Some(60),
        ..Knobs::default()
    }
}

/// On the embedded kubesim (or simulated nodes on a `--kubeconfig` API server).
pub async fn run(ctx: &Ctx) -> Result<Report, Error> {
    let k = ctx.knobs.clone().or(defaults());
    ctx.on_cluster(
        Scenario::Deploy,
        &k,
        |_| {},
        async |cluster, ns| {
            let app_delay = k.app_delay_ms;
            let make = move |name: &str, hosts: Vec<String>| {
                let mut rev = crate::demo::echo_revision(name, ns, hosts);
                if let Some(ms) = app_delay {
                    app_env(
                        &mut rev,
                        &[(kubesim::node::app::ENV_DELAY_MS, ms.to_string())],
                    );
                }
                rev
            };
            let stage = Stage {
                client: cluster.client.clone(),
                namespace: ns,
                entries: cluster.entries(),
                path: "/",
                revision: &make,
                app: format!(
                    "kubesim app, start delay {} ms",
                    k.start_delay_ms.unwrap_or(300)
                ),
            };
            on_stage(ctx, &k, &stage).await
        },
    )
    .await
}

/// On a cluster where the product is installed: its activators (every Ready activator pod) are
/// the entries, real kubelets run `opts.image` (which names its pod in `x-pod-name` at
/// `opts.path`, as the repo's test app does).
pub async fn run_installed(
    ctx: &Ctx,
    client: &Client,
    opts: &crate::installed::Options,
) -> Result<Report, Error> {
    let k = ctx.knobs.clone().or(Knobs {
        nodes: None,
        activators: None,
        start_delay_ms: None,
        ..defaults()
    });
    let outcome = crate::installed::in_namespace(client, async |ns| {
        let entries = crate::installed::activator_entries(client).await?;
        let make = |name: &str, hosts: Vec<String>| installed_revision(ns, name, hosts, opts);
        let stage = Stage {
            client: client.clone(),
            namespace: ns,
            entries,
            path: &opts.path,
            revision: &make,
            app: format!("real kubelets, image {}", opts.image),
        };
        on_stage(ctx, &k, &stage).await
    })
    .await?;
    Ok(Report {
        scenario: Scenario::Deploy,
        partial: ctx.cancel.is_cancelled(),
        target: "the installed product: its activators, real kubelets".into(),
        knobs: serde_json::to_value(&k).map_err(|e| Error::Options(e.to_string()))?,
        figures: outcome.figures,
        text: outcome.text,
        plots: outcome.plots,
    })
}

fn installed_revision(
    ns: &str,
    name: &str,
    hosts: Vec<String>,
    opts: &crate::installed::Options,
) -> Revision {
    serde_json::from_value(json!({
        "apiVersion": "local-activator.dev/v1alpha1",
        "kind": "Revision",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "port": 8080,
            "hosts": hosts,
            "template": {"spec": crate::installed::pod_spec(opts)},
        },
    }))
    .expect("a static revision deserializes")
}

/// Where the scenario runs.
pub struct Stage<'a> {
    pub client: Client,
    pub namespace: &'a str,
    /// Every activator, by node: each request goes to the next one.
    pub entries: Vec<(String, SocketAddr)>,
    /// The path the app answers on (naming its pod in `x-pod-name`).
    pub path: &'a str,
    /// The app's Revision with this name, claiming these hosts.
    pub revision: &'a (dyn Fn(&str, Vec<String>) -> Revision + Sync),
    /// What starts the app, for the report.
    pub app: String,
}

/// The phases, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Before,
    Deploy,
    Split,
    Rollback,
    After,
}

pub const PHASES: [Phase; 5] = [
    Phase::Before,
    Phase::Deploy,
    Phase::Split,
    Phase::Rollback,
    Phase::After,
];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Before => "before",
            Phase::Deploy => "deploy",
            Phase::Split => "split",
            Phase::Rollback => "rollback",
            Phase::After => "after",
        }
    }
}

/// The revision of an app pod, from its name (`<revision>-<16 hex digits>-<ordinal>`,
/// `crds::contract::pod_name`).
pub fn revision_of_pod(pod: &str) -> Option<&str> {
    let mut parts = pod.rsplitn(3, '-');
    let (ordinal, hash, revision) = (parts.next()?, parts.next()?, parts.next()?);
    let ordinal_ok = !ordinal.is_empty() && ordinal.bytes().all(|b| b.is_ascii_digit());
    let hash_ok = hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit());
    (ordinal_ok && hash_ok && !revision.is_empty()).then_some(revision)
}

/// One request of the load: its phase (at its send), its outcome, the revision that answered.
#[derive(Debug, Clone)]
pub struct Answer {
    pub phase: Phase,
    pub sample: Sample,
    /// From the answering pod's name; none for a failure or an answer naming no known pod.
    pub revision: Option<String>,
}

impl Answer {
    fn done(&self) -> Instant {
        self.sample.sent + self.sample.latency
    }

    fn by(&self, revision: &str) -> bool {
        self.sample.ok() && self.revision.as_deref() == Some(revision)
    }
}

/// What the phase controller waits on: answers since a mark, per entry.
#[derive(Debug, Default)]
struct Progress {
    /// Requests sent before it are not counted.
    mark: Option<Instant>,
    /// The revision awaited.
    target: String,
    entries: BTreeMap<String, Track>,
    /// Requests sent since the mark, failed ones included.
    since_mark: usize,
}

#[derive(Debug, Default, Clone, Copy)]
struct Track {
    /// Answers from the target.
    seen: usize,
    /// Answers from the target since the last answer from another revision.
    in_a_row: usize,
}

impl Progress {
    fn aim(&mut self, target: &str, mark: Instant) {
        *self = Progress {
            mark: Some(mark),
            target: target.to_string(),
            ..Progress::default()
        };
    }

    fn record(&mut self, a: &Answer) {
        if self.mark.is_none_or(|m| a.sample.sent < m) {
            return;
        }
        self.since_mark += 1;
        let t = self.entries.entry(a.sample.entry.clone()).or_default();
        match &a.revision {
            Some(r) if a.sample.ok() && *r == self.target => {
                t.seen += 1;
                t.in_a_row += 1;
            }
            Some(_) if a.sample.ok() => t.in_a_row = 0,
            _ => {}
        }
    }

    fn every(&self, entries: &[(String, SocketAddr)], f: impl Fn(&Track) -> bool) -> bool {
        entries
            .iter()
            .all(|(n, _)| self.entries.get(n).is_some_and(&f))
    }
}

/// The closed-loop load's shared state.
struct Load {
    answers: Mutex<Vec<Answer>>,
    phase: AtomicUsize,
    progress: signal::Sender<Progress>,
    next_entry: AtomicUsize,
}

impl Load {
    fn new() -> Self {
        Self {
            answers: Mutex::new(Vec::new()),
            phase: AtomicUsize::new(0),
            progress: signal::Sender::new(Progress::default()),
            next_entry: AtomicUsize::new(0),
        }
    }

    fn enter(&self, phase: Phase) {
        let i = PHASES.iter().position(|p| *p == phase).unwrap_or(0);
        self.phase.store(i, Ordering::Relaxed);
    }

    fn aim(&self, target: &str, mark: Instant) {
        self.progress.send_modify(|p| p.aim(target, mark));
    }

    /// Waits until `pred` holds, at most `limit`; false on timeout or Ctrl-C.
    async fn until(
        &self,
        cancel: &CancellationToken,
        limit: Duration,
        pred: impl Fn(&Progress) -> bool,
    ) -> bool {
        let mut rx = self.progress.subscribe();
        tokio::select! {
            r = tokio::time::timeout(limit, rx.wait_for(|p| pred(p))) => matches!(r, Ok(Ok(_))),
            _ = cancel.cancelled() => false,
        }
    }

    /// One client: a request at a time, each to the next activator, until `stop`.
    async fn client(
        &self,
        driver: Driver,
        entries: &[(String, SocketAddr)],
        host: &str,
        path: &str,
        stop: &CancellationToken,
    ) {
        while !stop.is_cancelled() {
            let (node, addr) =
                &entries[self.next_entry.fetch_add(1, Ordering::Relaxed) % entries.len()];
            let phase = PHASES[self.phase.load(Ordering::Relaxed)];
            let sample = driver.get((node.as_str(), *addr), host, host, path).await;
            let revision = sample
                .pod
                .as_deref()
                .filter(|_| sample.ok())
                .and_then(revision_of_pod)
                .map(str::to_string);
            let a = Answer {
                phase,
                sample,
                revision,
            };
            self.progress.send_modify(|p| p.record(&a));
            self.answers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(a);
        }
    }
}

/// Waits `d`, or less on Ctrl-C.
async fn hold(cancel: &CancellationToken, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = cancel.cancelled() => {}
    }
}

/// What the controller did, and when.
#[derive(Debug, Default)]
struct Marks {
    /// When each phase began.
    phases: BTreeMap<usize, Instant>,
    deploy_action: Option<Instant>,
    split_action: Option<Instant>,
    /// The Route's create answered.
    split_decision: Option<Instant>,
    /// Every activator had answered from v1 under the split (or the bound passed): the
    /// measured window starts.
    split_settled: Option<Instant>,
    split_followed_everywhere: bool,
    rollback_action: Option<Instant>,
    /// The Route's patch answered.
    rollback_decision: Option<Instant>,
    end: Option<Instant>,
}

impl Marks {
    fn start(&mut self, load: &Load, phase: Phase) -> Instant {
        load.enter(phase);
        let now = Instant::now();
        let i = PHASES.iter().position(|p| *p == phase).unwrap_or(0);
        self.phases.insert(i, now);
        now
    }

    fn phase_window(&self, phase: Phase) -> Option<(Instant, Instant)> {
        let i = PHASES.iter().position(|p| *p == phase)?;
        let from = *self.phases.get(&i)?;
        let to = self.phases.get(&(i + 1)).copied().or(self.end)?;
        Some((from, to))
    }
}

/// The scenario on a stage: the load, the phases, the figures.
pub async fn on_stage(ctx: &Ctx, k: &Knobs, stage: &Stage<'_>) -> Result<Outcome, Error> {
    if stage.entries.is_empty() {
        return Err(Error::Options("no activator to send requests to".into()));
    }
    let ns = stage.namespace;
    let host = format!("deploy.{ns}.test");
    let clients = k.clients.unwrap_or(8).max(1);
    let secs = |v: Option<f64>, d: f64| Duration::from_secs_f64(v.unwrap_or(d).max(0.0));
    let before = secs(k.before_secs, 5.0);
    let after = secs(k.after_secs, 5.0);
    let settle = secs(k.settle_secs, 3.0);
    let split_requests = k.split_requests.unwrap_or(2000).max(1);
    let hand_over = k.hand_over_timeout_secs.unwrap_or(60).max(0);
    // A move's bound (a hang detector, not a figure): the hand-over's own bound (a Route's
    // move waits for the gaining revision's pods too), and a minute more to reach every
    // activator.
    let move_limit = Duration::from_secs(hand_over as u64 + 60);

    let revs: Api<Revision> = Api::namespaced(stage.client.clone(), ns);
    let routes: Api<Route> = Api::namespaced(stage.client.clone(), ns);
    ctx.step("watching the Revisions, the Route and the app pods");
    let status = StatusLog::start(&stage.client, ns).await?;
    let pods = ReadyPods::start(&stage.client, ns).await?;

    ctx.step(format!("creating {OLD} on {host}"));
    let mut v1 = (stage.revision)(OLD, vec![host.clone()]);
    v1.spec.timeout_seconds = 60;
    v1.spec.hand_over_timeout_seconds = Some(hand_over);
    revs.create(&PostParams::default(), &v1).await?;
    crate::demo::wait_subsets(
        &stage.client,
        ns,
        &[OLD.to_string()],
        Duration::from_secs(60),
    )
    .await?;

    ctx.step(format!("waking {OLD} through every activator"));
    let driver = Driver::new();
    let mut warm_up = Vec::new();
    for (node, addr) in &stage.entries {
        for _ in 0..WARM_ATTEMPTS {
            let s = driver
                .get((node.as_str(), *addr), &host, &host, stage.path)
                .await;
            let ok = s.ok();
            warm_up.push(s);
            if ok {
                break;
            }
        }
    }
    let warm_summary = SampleSummary::of(&warm_up);
    if warm_summary.errors == warm_up.len() {
        return Err(Error::Options(format!(
            "{OLD} never answered on {host}: {:?}",
            warm_summary.error_samples
        )));
    }

    let load = Load::new();
    let stop = ctx.cancel.child_token();
    let t0 = Instant::now();
    let traffic = futures::future::join_all(
        (0..clients).map(|_| load.client(driver.clone(), &stage.entries, &host, stage.path, &stop)),
    );
    let entries = &stage.entries;
    let cancel = &ctx.cancel;
    let controller = async {
        let mut m = Marks::default();
        let result: Result<(), Error> = async {
            ctx.step(format!("before: {OLD} alone"));
            m.start(&load, Phase::Before);
            hold(cancel, before).await;
            if cancel.is_cancelled() {
                return Ok(());
            }

            ctx.step(format!(
                "deploy: {NEW} created, until every activator answers from it"
            ));
            let now = m.start(&load, Phase::Deploy);
            load.aim(NEW, now);
            m.deploy_action = Some(now);
            let mut v2 = (stage.revision)(NEW, vec![host.clone()]);
            v2.spec.timeout_seconds = 60;
            v2.spec.hand_over_timeout_seconds = Some(hand_over);
            revs.create(&PostParams::default(), &v2).await?;
            load.until(cancel, move_limit, |p| p.every(entries, |t| t.seen > 0))
                .await;
            hold(cancel, settle).await;
            if cancel.is_cancelled() {
                return Ok(());
            }

            ctx.step("split: a Route, v1 10 % / v2 90 %");
            let now = m.start(&load, Phase::Split);
            load.aim(OLD, now);
            m.split_action = Some(now);
            routes
                .create(&PostParams::default(), &route(ns, &host, &SPLIT))
                .await?;
            m.split_decision = Some(Instant::now());
            m.split_followed_everywhere = load
                .until(cancel, move_limit, |p| p.every(entries, |t| t.seen > 0))
                .await;
            let settled = Instant::now();
            m.split_settled = Some(settled);
            load.aim(OLD, settled);
            ctx.step(format!("split: {split_requests} requests measured"));
            load.until(cancel, SPLIT_LIMIT, |p| p.since_mark >= split_requests)
                .await;
            if cancel.is_cancelled() {
                return Ok(());
            }

            ctx.step(format!("rollback: the Route to {OLD} 100 %"));
            let now = m.start(&load, Phase::Rollback);
            load.aim(OLD, now);
            m.rollback_action = Some(now);
            routes
                .patch(
                    "deploy",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"spec": {"traffic": [{"revisionName": OLD, "percent": 100}]}}),
                    ),
                )
                .await?;
            m.rollback_decision = Some(Instant::now());
            load.until(cancel, move_limit, |p| {
                p.every(entries, |t| t.in_a_row >= IN_A_ROW)
            })
            .await;
            hold(cancel, settle).await;
            if cancel.is_cancelled() {
                return Ok(());
            }

            ctx.step(format!("after: {OLD} alone"));
            m.start(&load, Phase::After);
            hold(cancel, after).await;
            Ok(())
        }
        .await;
        m.end = Some(Instant::now());
        stop.cancel();
        (m, result)
    };
    let (_, (marks, result)) = tokio::join!(traffic, controller);
    result?;
    let answers = std::mem::take(&mut *load.answers.lock().unwrap_or_else(|e| e.into_inner()));
    let log = status.events();
    let figures = Figures::build(&answers, &marks, entries, &log, &pods, split_requests);
    let heading = format!(
        "deploy: host {host}, {} activators (each request to the next one), {clients} clients in a closed loop; {}\n\
         waking {OLD}: {} requests, {} failed\n\
         cold = the activator marked the answer x-activator-cold-start (the request waited for a pod start)\n",
        entries.len(),
        stage.app,
        warm_summary.requests,
        warm_summary.errors
    );
    let text = figures.text(heading, &log, t0);
    let plots = vec![("timeline", timeline(&answers, &marks, &log, t0)?)];
    let figures = json!({
        "host": host,
        "activators": entries.len(),
        "clients": clients,
        "app": stage.app,
        "cold_signal": "x-activator-cold-start on the answer: the activator made the request wait for a pod start",
        "warm_up": {"requests": warm_summary.requests, "failed": warm_summary.errors},
        "failed": figures.phases.iter().map(|p| p.failed).sum::<usize>(),
        "phases": figures.phases,
        "moves": figures.moves,
        "split": figures.split,
        "status_log": log.iter().map(|e| e.json(t0)).collect::<Vec<_>>(),
    });
    Ok(Outcome {
        figures,
        text,
        plots,
    })
}

/// A Route named `deploy` for `host` with this split.
fn route(ns: &str, host: &str, split: &[(&str, i32)]) -> Route {
    let mut r = Route::new(
        "deploy",
        RouteSpec {
            hosts: vec![host.to_string()],
            traffic: split
                .iter()
                .map(|(rev, percent)| TrafficTarget {
                    revision_name: Some(rev.to_string()),
                    percent: *percent,
                    ..TrafficTarget::default()
                })
                .collect(),
            rollout_duration_seconds: 0,
        },
    );
    r.metadata.namespace = Some(ns.to_string());
    r
}

/// ms from `from` to `t`, negative when `t` is earlier.
fn signed_ms(t: Instant, from: Instant) -> f64 {
    if t >= from {
        (t - from).as_secs_f64() * 1e3
    } else {
        -((from - t).as_secs_f64() * 1e3)
    }
}

/// One phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseFigures {
    pub phase: Phase,
    pub secs: f64,
    pub requests: usize,
    pub failed: usize,
    /// Failed requests by HTTP status (`no answer`: the connection failed or broke).
    pub failed_by_status: BTreeMap<String, usize>,
    /// Requests whose answer the activator marked as having waited for a pod start
    /// (`x-activator-cold-start`), failed ones included.
    pub waited_for_pod_start: usize,
    /// Distinct pods that answered such requests.
    pub pods_cold_started: usize,
    /// Answered requests by the revision of the pod that answered (`unknown`: no pod named).
    pub answered_by: BTreeMap<String, usize>,
    /// Every request, the failures ranked after every answer.
    pub latency_ms: Percentiles,
    /// Answered requests that waited for a pod start, and the others.
    pub cold_ms: Percentiles,
    pub warm_ms: Percentiles,
    /// The first few failures, verbatim.
    pub error_samples: Vec<String>,
}

impl PhaseFigures {
    fn of(phase: Phase, secs: f64, answers: &[&Answer]) -> Self {
        let samples: Vec<Sample> = answers.iter().map(|a| a.sample.clone()).collect();
        let s = SampleSummary::of(&samples);
        let mut failed_by_status = BTreeMap::new();
        let mut answered_by = BTreeMap::new();
        for a in answers {
            if a.sample.ok() {
                let rev = a.revision.clone().unwrap_or_else(|| "unknown".into());
                *answered_by.entry(rev).or_default() += 1;
            } else {
                let key = match a.sample.status {
                    0 => "no answer".to_string(),
                    code => code.to_string(),
                };
                *failed_by_status.entry(key).or_default() += 1;
            }
        }
        Self {
            phase,
            secs,
            requests: s.requests,
            failed: s.errors,
            failed_by_status,
            waited_for_pod_start: s.cold,
            pods_cold_started: s.cold_starts,
            answered_by,
            latency_ms: s.all_ms,
            cold_ms: s.cold_ms,
            warm_ms: s.warm_ms,
            error_samples: s.error_samples,
        }
    }
}

/// p50, p99 and max over activators, those that never moved ranked last (`null`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Spread {
    pub activators: usize,
    pub not_moved: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl Spread {
    /// Nearest rank over `ms` (signed: an activator may move before the decision is seen)
    /// and `not_moved` more, ranked last.
    pub fn of(ms: &[f64], not_moved: usize) -> Self {
        let n = ms.len() + not_moved;
        let mut v = ms.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let r = ((p * n as f64).ceil() as usize).clamp(1, n.max(1));
            v.get(r - 1).copied()
        };
        if n == 0 {
            return Self::default();
        }
        Self {
            activators: n,
            not_moved,
            p50_ms: rank(0.5),
            p99_ms: rank(0.99),
            max_ms: rank(1.0),
        }
    }
}

/// One activator's part in a move, ms from the decision.
#[derive(Debug, Clone, Serialize)]
pub struct ActivatorMove {
    pub node: String,
    /// To the first answer from the gaining revision.
    pub first_new_ms: Option<f64>,
    /// To the first answer from the gaining revision sent after the entry's last request the
    /// losing one answered: from then on it answered from the gaining one only (moves to
    /// 100 % only; none unless 20 answers in a row from the gaining one prove it, so an entry
    /// still split at the end of the run has not moved).
    pub moved_ms: Option<f64>,
    /// The same as `moved_ms` (or `first_new_ms`), from the action (the create or patch sent).
    pub from_action_ms: Option<f64>,
    /// Answers from the losing revision to requests sent after the decision.
    pub old_after_decision: usize,
}

/// A move of the host between revisions.
#[derive(Debug, Clone, Serialize)]
pub struct Move {
    pub name: &'static str,
    pub from: &'static str,
    pub to: &'static str,
    /// What the times count from.
    pub decision: String,
    /// The decision was seen (else the times count from the action).
    pub decision_seen: bool,
    /// The decision after the action, ms.
    pub decision_after_action_ms: Option<f64>,
    /// The gaining revision takes all of the host (else a share).
    pub exclusive: bool,
    pub per_activator: Vec<ActivatorMove>,
    /// Over activators, of `moved_ms` (exclusive moves) or `first_new_ms`.
    pub over_activators: Spread,
    pub moved_everywhere: bool,
    /// Answers from the losing revision to requests sent after the decision, all activators.
    pub old_after_decision: usize,
    /// Ready pods by revision at the decision, and when the last activator had moved.
    pub ready_pods_at_decision: BTreeMap<String, usize>,
    pub ready_pods_when_moved_everywhere: Option<BTreeMap<String, usize>>,
}

/// Per entry, the answers sent in `window`: when it moved from `from` to `to`.
pub fn per_activator(
    answers: &[Answer],
    entries: &[(String, SocketAddr)],
    (from, to): (&str, &str),
    window: (Instant, Instant),
    action: Instant,
    decision: Instant,
    exclusive: Option<usize>,
) -> Vec<(ActivatorMove, Option<Instant>)> {
    entries
        .iter()
        .map(|(node, _)| {
            let mut mine: Vec<&Answer> = answers
                .iter()
                .filter(|a| a.sample.entry == *node)
                .filter(|a| a.sample.sent >= window.0 && a.sample.sent < window.1)
                .collect();
            mine.sort_by_key(|a| a.sample.sent);
            let first_new = mine.iter().filter(|a| a.by(to)).map(|a| a.done()).min();
            let last_old = mine.iter().rposition(|a| a.by(from));
            let after_old = last_old.map_or(&mine[..], |i| &mine[i + 1..]);
            let new_after_old: Vec<Instant> = after_old
                .iter()
                .filter(|a| a.by(to))
                .map(|a| a.done())
                .collect();
            // Moved for good only on evidence: an entry still split at the window's end has
            // a last answer from the losing revision too, followed by a few from the other.
            let moved = exclusive
                .filter(|n| new_after_old.len() >= *n)
                .and_then(|_| new_after_old.iter().min().copied());
            let moved_at = if exclusive.is_some() {
                moved
            } else {
                first_new
            };
            let old_after_decision = mine
                .iter()
                .filter(|a| a.by(from) && a.sample.sent >= decision)
                .count();
            (
                ActivatorMove {
                    node: node.clone(),
                    first_new_ms: first_new.map(|t| signed_ms(t, decision)),
                    moved_ms: moved.map(|t| signed_ms(t, decision)),
                    from_action_ms: moved_at.map(|t| signed_ms(t, action)),
                    old_after_decision,
                },
                moved_at,
            )
        })
        .collect()
}

/// The measured share of one revision under the split.
#[derive(Debug, Clone, Serialize)]
pub struct Share {
    pub revision: String,
    pub expected_percent: f64,
    pub answered: usize,
    pub measured_percent: f64,
    /// Half the 95 % interval of the measured percent (normal approximation), in points.
    pub ci95_points: f64,
    /// measured − expected, in points.
    pub off_by_points: f64,
}

/// The split's measured window.
#[derive(Debug, Clone, Serialize)]
pub struct SplitFigures {
    /// Every activator had answered from v1 under the split before the window began.
    pub followed_everywhere: bool,
    pub requests: usize,
    pub failed: usize,
    /// Answered by a pod of neither revision (or naming none).
    pub unknown: usize,
    pub shares: Vec<Share>,
}

impl SplitFigures {
    pub fn of(window: &[&Answer], split: &[(&str, i32)], followed_everywhere: bool) -> Self {
        let failed = window.iter().filter(|a| !a.sample.ok()).count();
        let answered = window.len() - failed;
        let count = |rev: &str| window.iter().filter(|a| a.by(rev)).count();
        let known: usize = split.iter().map(|(r, _)| count(r)).sum();
        let shares = split
            .iter()
            .map(|(rev, pct)| {
                let n = count(rev);
                let p = n as f64 / answered.max(1) as f64;
                Share {
                    revision: rev.to_string(),
                    expected_percent: f64::from(*pct),
                    answered: n,
                    measured_percent: 100.0 * p,
                    ci95_points: 100.0 * 1.96 * (p * (1.0 - p) / answered.max(1) as f64).sqrt(),
                    off_by_points: 100.0 * p - f64::from(*pct),
                }
            })
            .collect();
        Self {
            followed_everywhere,
            requests: window.len(),
            failed,
            unknown: answered - known,
            shares,
        }
    }
}

/// Everything measured.
struct Figures {
    phases: Vec<PhaseFigures>,
    moves: Vec<Move>,
    split: Option<SplitFigures>,
    /// What the reader should know about the figures (a window cut short).
    notes: Vec<String>,
}

impl Figures {
    fn build(
        answers: &[Answer],
        m: &Marks,
        entries: &[(String, SocketAddr)],
        log: &[StatusEvent],
        pods: &ReadyPods,
        split_requests: usize,
    ) -> Self {
        let phases = PHASES
            .iter()
            .filter_map(|p| {
                let (from, to) = m.phase_window(*p)?;
                let mine: Vec<&Answer> = answers.iter().filter(|a| a.phase == *p).collect();
                Some(PhaseFigures::of(*p, (to - from).as_secs_f64(), &mine))
            })
            .collect();
        let mut moves = Vec::new();
        let mut notes = Vec::new();
        let end = m.end.unwrap_or_else(Instant::now);
        let next_phase = |p: Phase| m.phase_window(p).map_or(end, |w| w.1);
        if let Some(action) = m.deploy_action {
            let seen = log
                .iter()
                .find(|e| {
                    e.at >= action
                        && e.kind == "Revision"
                        && e.object == NEW
                        && e.field == "RoutesReady"
                        && e.value.starts_with("True")
                })
                .map(|e| e.at);
            let decision = format!(
                "{}: the harness's watch saw {NEW}'s RoutesReady=True",
                if seen.is_some() {
                    "seen"
                } else {
                    "NOT seen (times from the create)"
                }
            );
            moves.push(one_move(
                answers,
                entries,
                pods,
                ("deploy", OLD, NEW, true),
                (action, next_phase(Phase::Deploy)),
                seen,
                decision,
            ));
        }
        if let (Some(action), Some(decision)) = (m.split_action, m.split_decision) {
            moves.push(one_move(
                answers,
                entries,
                pods,
                ("split", NEW, OLD, false),
                (action, m.split_settled.unwrap_or(end)),
                Some(decision),
                "the Route's create answered (v1 10 % / v2 90 %); the gaining revision is v1"
                    .into(),
            ));
        }
        if let (Some(action), Some(decision)) = (m.rollback_action, m.rollback_decision) {
            moves.push(one_move(
                answers,
                entries,
                pods,
                ("rollback", NEW, OLD, true),
                (action, end),
                Some(decision),
                "the Route's patch to v1 100 % answered".into(),
            ));
        }
        let split = m.split_settled.map(|settled| {
            let to = next_phase(Phase::Split);
            let window: Vec<&Answer> = answers
                .iter()
                .filter(|a| {
                    a.phase == Phase::Split && a.sample.sent >= settled && a.sample.sent < to
                })
                .collect();
            SplitFigures::of(&window, &SPLIT, m.split_followed_everywhere)
        });
        if let Some(s) = &split
            && s.requests < split_requests
        {
            notes.push(format!(
                "the split's window has {} requests, fewer than the {split_requests} asked (cut short)",
                s.requests
            ));
        }
        Self {
            phases,
            moves,
            split,
            notes,
        }
    }

    /// The table after `heading`; `log`'s times from `t0`.
    fn text(&self, heading: String, log: &[StatusEvent], t0: Instant) -> String {
        let mut o = heading;
        o += &format!(
            "{:<9} {:>6} {:>8} {:>7} {:>5} {:>8} {:>8}  failed by status\n",
            "phase", "secs", "requests", "failed", "cold", OLD, NEW
        );
        for p in &self.phases {
            let by = |r: &str| p.answered_by.get(r).copied().unwrap_or(0);
            let statuses = if p.failed_by_status.is_empty() {
                "-".to_string()
            } else {
                p.failed_by_status
                    .iter()
                    .map(|(s, n)| format!("{s}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            o += &format!(
                "{:<9} {:>6.1} {:>8} {:>7} {:>5} {:>8} {:>8}  {statuses}\n",
                p.phase.name(),
                p.secs,
                p.requests,
                p.failed,
                p.waited_for_pod_start,
                by(OLD),
                by(NEW)
            );
        }
        for p in &self.phases {
            o += &pct_line(&format!("{} all ms", p.phase.name()), &p.latency_ms);
            if p.cold_ms.count > 0 {
                o += &pct_line(
                    &format!("{} cold ms (answered)", p.phase.name()),
                    &p.cold_ms,
                );
            }
            for e in &p.error_samples {
                o += &format!("  {} error: {e}\n", p.phase.name());
            }
        }
        let ms = |v: Option<f64>| v.map_or("never".to_string(), |v| format!("{v:.1} ms"));
        for mv in &self.moves {
            o += &format!(
                "move {} ({} → {}): times from the decision, {}\n",
                mv.name, mv.from, mv.to, mv.decision
            );
            if let Some(d) = mv.decision_after_action_ms {
                o += &format!("  decision {d:.1} ms after the action\n");
            }
            let pods = |m: &BTreeMap<String, usize>| {
                [mv.to, mv.from]
                    .iter()
                    .map(|r| format!("{r} {}", m.get(*r).copied().unwrap_or(0)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            o += &format!(
                "  Ready pods at the decision: {}; when every activator had moved: {}\n",
                pods(&mv.ready_pods_at_decision),
                mv.ready_pods_when_moved_everywhere
                    .as_ref()
                    .map_or("never moved everywhere".to_string(), pods)
            );
            for a in &mv.per_activator {
                o += &format!(
                    "  {:<20} first answer from {}: {:>10}{}; from the action {}; answers from {} after the decision: {}\n",
                    a.node,
                    mv.to,
                    ms(a.first_new_ms),
                    if mv.exclusive {
                        format!(", only {} from {:>10}", mv.to, ms(a.moved_ms))
                    } else {
                        String::new()
                    },
                    ms(a.from_action_ms),
                    mv.from,
                    a.old_after_decision
                );
            }
            let s = &mv.over_activators;
            o += &format!(
                "  over {} activators: p50 {}, p99 {}, max {} (never moved: {}, ranked last); answers from {} after the decision: {}\n",
                s.activators,
                ms(s.p50_ms),
                ms(s.p99_ms),
                ms(s.max_ms),
                s.not_moved,
                mv.from,
                mv.old_after_decision
            );
        }
        if let Some(s) = &self.split {
            o += &format!(
                "split, measured once every activator had answered from {OLD} ({}): {} requests, {} failed, {} from an unknown pod\n",
                if s.followed_everywhere {
                    "yes"
                } else {
                    "NO: bound reached"
                },
                s.requests,
                s.failed,
                s.unknown
            );
            for sh in &s.shares {
                o += &format!(
                    "  {} {:.2} % ±{:.2} (95 %), expected {:.0} %, off by {:+.2} points\n",
                    sh.revision,
                    sh.measured_percent,
                    sh.ci95_points,
                    sh.expected_percent,
                    sh.off_by_points
                );
            }
        }
        o += "status changes, ms from the load's start (as the harness's watches saw them):\n";
        for e in log {
            o += &format!(
                "  {:>10.1} {} {} {}: {}{}\n",
                signed_ms(e.at, t0),
                e.kind,
                e.object,
                e.field,
                e.value,
                if e.detail.is_empty() {
                    String::new()
                } else {
                    format!(" — {}", e.detail)
                }
            );
        }
        for n in &self.notes {
            o += &format!("note: {n}\n");
        }
        o
    }
}

fn one_move(
    answers: &[Answer],
    entries: &[(String, SocketAddr)],
    pods: &ReadyPods,
    (name, from, to, exclusive): (&'static str, &'static str, &'static str, bool),
    window: (Instant, Instant),
    decision: Option<Instant>,
    what: String,
) -> Move {
    let action = window.0;
    let at = decision.unwrap_or(action);
    let proof = exclusive.then_some(IN_A_ROW);
    let rows = per_activator(answers, entries, (from, to), window, action, at, proof);
    let moved: Vec<f64> = rows
        .iter()
        .filter_map(|(r, _)| {
            if exclusive {
                r.moved_ms
            } else {
                r.first_new_ms
            }
        })
        .collect();
    let not_moved = rows.len() - moved.len();
    let last = rows
        .iter()
        .map(|(_, t)| *t)
        .collect::<Option<Vec<Instant>>>()
        .and_then(|ts| ts.into_iter().max());
    Move {
        name,
        from,
        to,
        decision: what,
        decision_seen: decision.is_some(),
        decision_after_action_ms: decision.map(|d| signed_ms(d, action)),
        exclusive,
        old_after_decision: rows.iter().map(|(r, _)| r.old_after_decision).sum(),
        over_activators: Spread::of(&moved, not_moved),
        moved_everywhere: not_moved == 0,
        ready_pods_at_decision: pods.at(at),
        ready_pods_when_moved_everywhere: last.map(|t| pods.at(t)),
        per_activator: rows.into_iter().map(|(r, _)| r).collect(),
    }
}

/// Answers by revision and failures per 100 ms, with the controller's steps and the status
/// changes as marks.
fn timeline(
    answers: &[Answer],
    m: &Marks,
    log: &[StatusEvent],
    t0: Instant,
) -> Result<String, Error> {
    let at = |a: &Answer| a.sample.sent.saturating_duration_since(t0).as_secs_f64();
    let line = |name: String, pick: &dyn Fn(&Answer) -> bool| Line {
        name,
        points: plot::bucket(
            answers.iter().filter(|a| pick(a)).map(|a| (at(a), true)),
            0.1,
        )
        .into_iter()
        .map(|(t, n, _)| (t, n))
        .collect(),
    };
    let lines = vec![
        line(format!("answered by {OLD}"), &|a: &Answer| a.by(OLD)),
        line(format!("answered by {NEW}"), &|a: &Answer| a.by(NEW)),
        line("failed".into(), &|a: &Answer| !a.sample.ok()),
    ];
    let secs = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
    let mut marks: Vec<(f64, String)> = [
        (m.deploy_action, format!("{NEW} created")),
        (m.split_decision, "Route 10/90".to_string()),
        (m.rollback_decision, format!("Route {OLD} 100")),
    ]
    .into_iter()
    .filter_map(|(t, what)| t.map(|t| (secs(t), what)))
    .collect();
    if let Some(e) = log.iter().find(|e| {
        e.kind == "Revision"
            && e.object == NEW
            && e.field == "RoutesReady"
            && e.value.starts_with("True")
    }) {
        marks.push((secs(e.at), format!("{NEW} RoutesReady")));
    }
    plot::timeline(
        "deploy: answers per 100 ms by revision",
        "requests",
        &lines,
        &marks,
    )
}

/// A change of a watched status field, as the harness's watch saw it.
#[derive(Debug, Clone)]
pub struct StatusEvent {
    pub at: Instant,
    /// `Revision`, `Route` or `ActivationEndpoints`.
    pub kind: &'static str,
    pub object: String,
    /// A condition type, `summary` (a Route's) or `routes` (an ActivationEndpoints' host
    /// shares, what the activators read).
    pub field: String,
    /// `status/reason` of a condition, or the field's value.
    pub value: String,
    /// A condition's message and lastTransitionTime.
    pub detail: String,
}

impl StatusEvent {
    fn json(&self, t0: Instant) -> serde_json::Value {
        json!({
            "at_ms": signed_ms(self.at, t0),
            "kind": self.kind,
            "object": self.object,
            "field": self.field,
            "value": self.value,
            "detail": self.detail,
        })
    }
}

/// The conditions of the Revisions and the Route of a namespace, the Route's summary, and of
/// the ActivationEndpoints their `HostConflict` and host shares, as they change.
struct StatusLog {
    log: signal::Receiver<Vec<StatusEvent>>,
    tasks: Vec<JoinHandle<()>>,
}

type Fields = Vec<(String, String, String)>;

fn condition_fields(cs: &[Condition]) -> Fields {
    cs.iter()
        .map(|c| {
            let when = serde_json::to_value(&c.last_transition_time)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            (
                c.type_.clone(),
                format!("{}/{}", c.status, c.reason),
                if c.message.is_empty() {
                    format!("(lastTransitionTime {when})")
                } else {
                    format!("{} (lastTransitionTime {when})", c.message)
                },
            )
        })
        .collect()
}

fn revision_fields(r: &Revision) -> Fields {
    condition_fields(r.status.as_ref().map_or(&[], |s| &s.conditions[..]))
}

fn route_fields(r: &Route) -> Fields {
    let Some(s) = r.status.as_ref() else {
        return Vec::new();
    };
    let mut out = condition_fields(&s.conditions);
    if let Some(summary) = &s.summary {
        out.push(("summary".into(), summary.clone(), String::new()));
    }
    out
}

fn endpoints_fields(a: &ActivationEndpoints) -> Fields {
    let Some(s) = a.status.as_ref() else {
        return Vec::new();
    };
    let mut out: Fields = condition_fields(&s.conditions)
        .into_iter()
        .filter(|(field, _, _)| field == "HostConflict")
        .collect();
    let routes = if s.routes.is_empty() {
        "none".to_string()
    } else {
        s.routes
            .iter()
            .map(|r| format!("{} {}%", r.host, r.percent))
            .collect::<Vec<_>>()
            .join(", ")
    };
    out.push(("routes".into(), routes, String::new()));
    out
}

impl StatusLog {
    /// The watches, once each has listed (bounded: a Route CRD missing is an error).
    async fn start(client: &Client, ns: &str) -> Result<Self, Error> {
        let (tx, log) = signal::channel(Vec::new());
        let tx = Arc::new(tx);
        let (r_listed, r_task) = watch_fields(
            Api::<Revision>::namespaced(client.clone(), ns),
            "Revision",
            revision_fields,
            tx.clone(),
        );
        let (o_listed, o_task) = watch_fields(
            Api::<Route>::namespaced(client.clone(), ns),
            "Route",
            route_fields,
            tx.clone(),
        );
        let (a_listed, a_task) = watch_fields(
            Api::<ActivationEndpoints>::namespaced(client.clone(), ns),
            "ActivationEndpoints",
            endpoints_fields,
            tx,
        );
        let this = Self {
            log,
            tasks: vec![r_task, o_task, a_task],
        };
        let limit = Duration::from_secs(30);
        tokio::time::timeout(limit, async {
            let _ = r_listed.await;
            let _ = o_listed.await;
            let _ = a_listed.await;
        })
        .await
        .map_err(|_| Error::Timeout {
            what: "the Revision, Route and ActivationEndpoints watches to list (is the Route CRD installed?)".into(),
            secs: limit.as_secs(),
        })?;
        Ok(this)
    }

    fn events(&self) -> Vec<StatusEvent> {
        self.log.borrow().clone()
    }
}

impl Drop for StatusLog {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Watches `api`, appending to `tx` each change of a field `fields` reads; the receiver says
/// when the first list is done.
fn watch_fields<K>(
    api: Api<K>,
    kind: &'static str,
    fields: fn(&K) -> Fields,
    tx: Arc<signal::Sender<Vec<StatusEvent>>>,
) -> (tokio::sync::oneshot::Receiver<()>, JoinHandle<()>)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default,
{
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut listed_tx = Some(listed_tx);
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        while let Some(ev) = events.next().await {
            let obj = match ev {
                Ok(watcher::Event::InitDone) => {
                    if let Some(t) = listed_tx.take() {
                        let _ = t.send(());
                    }
                    continue;
                }
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, kind, "the deploy scenario's status watch");
                    continue;
                }
            };
            let now = Instant::now();
            let name = obj.name_any();
            tx.send_if_modified(|log| {
                let mut changed = false;
                for (field, value, detail) in fields(&obj) {
                    let last = log
                        .iter()
                        .rev()
                        .find(|e| e.kind == kind && e.object == name && e.field == field);
                    if last.is_none_or(|e| e.value != value) {
                        log.push(StatusEvent {
                            at: now,
                            kind,
                            object: name.clone(),
                            field,
                            value,
                            detail,
                        });
                        changed = true;
                    }
                }
                changed
            });
        }
    });
    (listed, task)
}

/// Ready app pods by revision over time, from one pod watch of the namespace.
/// Ready pods by revision, from the moment each count was seen on.
type ReadyHistory = Vec<(Instant, BTreeMap<String, usize>)>;

struct ReadyPods {
    history: Arc<Mutex<ReadyHistory>>,
    task: JoinHandle<()>,
}

impl ReadyPods {
    async fn start(client: &Client, ns: &str) -> Result<Self, Error> {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let cfg = watcher::Config::default().labels(REVISION_LABEL);
        let (store, writer) = reflector::store::<Pod>();
        let history = Arc::new(Mutex::new(ReadyHistory::new()));
        let h = history.clone();
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut listed_tx = Some(listed_tx);
            let mut events = std::pin::pin!(watcher(api, cfg).default_backoff().reflect(writer));
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(watcher::Event::InitDone) => {
                        if let Some(t) = listed_tx.take() {
                            let _ = t.send(());
                        }
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "the deploy scenario's pod watch");
                        continue;
                    }
                }
                let mut ready: BTreeMap<String, usize> = BTreeMap::new();
                for p in store.state() {
                    if crate::observe::is_ready(&p)
                        && let Some(rev) = p.labels().get(REVISION_LABEL)
                    {
                        *ready.entry(rev.clone()).or_default() += 1;
                    }
                }
                let mut h = h.lock().unwrap_or_else(|e| e.into_inner());
                if h.last().is_none_or(|(_, last)| *last != ready) {
                    h.push((Instant::now(), ready));
                }
            }
        });
        let limit = Duration::from_secs(30);
        tokio::time::timeout(limit, listed)
            .await
            .map_err(|_| Error::Timeout {
                what: "the app pod watch to list".into(),
                secs: limit.as_secs(),
            })?
            .map_err(|_| Error::Options("the app pod watch ended".into()))?;
        Ok(Self { history, task })
    }

    /// Ready pods by revision at `t`, as the watch had seen them.
    fn at(&self, t: Instant) -> BTreeMap<String, usize> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .rev()
            .find(|(at, _)| *at <= t)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

impl Drop for ReadyPods {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_revision_is_read_from_the_pod_name_and_nothing_else_passes() {
        let pod = crds::contract::pod_name("my-app-v2", "node-7", 3);
        assert_eq!(revision_of_pod(&pod), Some("my-app-v2"));
        for not in [
            "v1",
            "v1-abc-0",
            "v1-0123456789abcdef-",
            "-0123456789abcdef-1",
        ] {
            assert_eq!(revision_of_pod(not), None, "{not}");
        }
        assert_eq!(revision_of_pod("v1-0123456789abcdeg-1"), None, "not hex");
    }

    fn answer(entry: &str, t0: Instant, sent_ms: u64, rev: Option<&str>) -> Answer {
        let mut s = Sample::unsent("h", String::new());
        s.entry = entry.into();
        s.sent = t0 + Duration::from_millis(sent_ms);
        s.latency = Duration::from_millis(2);
        match rev {
            Some(_) => (s.status, s.error) = (200, None),
            None => (s.status, s.error) = (503, Some("full".into())),
        }
        Answer {
            phase: Phase::Deploy,
            sample: s,
            revision: rev.map(str::to_string),
        }
    }

    #[test]
    fn an_activator_has_moved_after_its_last_answer_from_the_old_revision() {
        let t0 = Instant::now();
        let entries: Vec<(String, SocketAddr)> = ["a", "b", "c"]
            .iter()
            .map(|n| (n.to_string(), "127.0.0.1:1".parse().unwrap()))
            .collect();
        let answers = vec![
            // a: v2 at 10, a stale v1 at 20, v2 from 30 on.
            answer("a", t0, 10, Some("v2")),
            answer("a", t0, 20, Some("v1")),
            answer("a", t0, 30, Some("v2")),
            answer("a", t0, 40, Some("v2")),
            // b: a failure, then v2 at 15.
            answer("b", t0, 5, None),
            answer("b", t0, 15, Some("v2")),
            // c: v1 only.
            answer("c", t0, 12, Some("v1")),
            // Before the window: not counted.
            answer("c", t0, 0, Some("v2")),
        ];
        let action = t0 + Duration::from_millis(1);
        let decision = t0 + Duration::from_millis(11);
        let rows = per_activator(
            &answers,
            &entries,
            ("v1", "v2"),
            (action, t0 + Duration::from_secs(1)),
            action,
            decision,
            Some(1),
        );
        let a = &rows[0].0;
        assert_eq!(
            a.first_new_ms,
            Some(1.0),
            "v2 answered at 12 ms, decision at 11"
        );
        assert_eq!(
            a.moved_ms,
            Some(21.0),
            "the v2 answer sent at 30, done at 32"
        );
        assert_eq!(a.old_after_decision, 1);
        assert_eq!(a.from_action_ms, Some(31.0));
        let b = &rows[1].0;
        assert_eq!((b.first_new_ms, b.moved_ms), (Some(6.0), Some(6.0)));
        let c = &rows[2].0;
        assert_eq!((c.first_new_ms, c.moved_ms), (None, None));
        assert_eq!(rows[2].1, None);
        // Two answers from v2 after the last from v1 do not prove a move that asks for three:
        // the entry may still be split when the window ends.
        let rows = per_activator(
            &answers,
            &entries,
            ("v1", "v2"),
            (action, t0 + Duration::from_secs(1)),
            action,
            decision,
            Some(3),
        );
        assert_eq!((rows[0].0.moved_ms, rows[0].1), (None, None));
        assert_eq!(rows[0].0.first_new_ms, Some(1.0));
        // A share, not all: the first answer is the move.
        let rows = per_activator(
            &answers,
            &entries,
            ("v1", "v2"),
            (action, t0 + Duration::from_secs(1)),
            action,
            decision,
            None,
        );
        assert_eq!(rows[0].0.moved_ms, None);
        assert_eq!(rows[0].0.from_action_ms, Some(11.0));
    }

    #[test]
    fn the_spread_ranks_activators_that_never_moved_last() {
        let s = Spread::of(&[-3.0, 10.0, 5.0], 0);
        assert_eq!(
            (s.p50_ms, s.p99_ms, s.max_ms),
            (Some(5.0), Some(10.0), Some(10.0))
        );
        let s = Spread::of(&[1.0, 2.0, 3.0], 1);
        assert_eq!((s.activators, s.not_moved), (4, 1));
        assert_eq!((s.p50_ms, s.max_ms), (Some(2.0), None));
        let json = serde_json::to_value(s).unwrap();
        assert!(json["max_ms"].is_null(), "{json}");
        assert_eq!(Spread::of(&[], 0), Spread::default());
    }

    #[test]
    fn the_split_shares_count_failures_apart_and_give_their_interval() {
        let t0 = Instant::now();
        let mut window: Vec<Answer> = (0..900)
            .map(|i| answer("a", t0, i, Some("v2")))
            .chain((0..100).map(|i| answer("a", t0, i, Some("v1"))))
            .collect();
        window.push(answer("a", t0, 0, None));
        let refs: Vec<&Answer> = window.iter().collect();
        let s = SplitFigures::of(&refs, &SPLIT, true);
        assert_eq!((s.requests, s.failed, s.unknown), (1001, 1, 0));
        let v1 = &s.shares[0];
        assert_eq!((v1.revision.as_str(), v1.answered), ("v1", 100));
        assert!((v1.measured_percent - 10.0).abs() < 1e-9, "{v1:?}");
        // 1.96 × sqrt(0.1 × 0.9 / 1000) = 1.86 points.
        assert!((v1.ci95_points - 1.859).abs() < 0.01, "{v1:?}");
        assert!((s.shares[1].off_by_points).abs() < 1e-9);
    }

    #[test]
    fn progress_counts_from_the_mark_and_resets_a_run_on_the_other_revision() {
        let t0 = Instant::now();
        let mut p = Progress::default();
        p.aim("v1", t0 + Duration::from_millis(10));
        p.record(&answer("a", t0, 5, Some("v1")));
        assert_eq!(p.since_mark, 0, "sent before the mark");
        for (ms, rev) in [
            (11, Some("v1")),
            (12, Some("v1")),
            (13, None),
            (14, Some("v2")),
            (15, Some("v1")),
        ] {
            p.record(&answer("a", t0, ms, rev));
        }
        let t = p.entries["a"];
        assert_eq!((p.since_mark, t.seen, t.in_a_row), (5, 3, 1));
    }
}
