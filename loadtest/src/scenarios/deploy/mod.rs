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

mod figures;
mod load;
mod watches;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crds::{Revision, Route, RouteSpec, TrafficTarget};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::common::SampleSummary;
use crate::Error;
use crate::driver::Driver;
use crate::scenario::{Ctx, Knobs, Outcome, Report, Scenario, app_env};
pub use figures::{ActivatorMove, Move, PhaseFigures, Share, SplitFigures, Spread, per_activator};
use figures::{Figures, timeline};
pub use load::{Answer, PHASES, Phase, revision_of_pod};
use load::{Load, Marks};
pub use watches::StatusEvent;
use watches::{ReadyPods, StatusLog};

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

/// Waits `d`, or less on Ctrl-C.
async fn hold(cancel: &CancellationToken, d: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = cancel.cancelled() => {}
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

/// What the tests of `load` and `figures` share; each file's tests sit with its code.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Sample;

    pub(super) fn answer(entry: &str, t0: Instant, sent_ms: u64, rev: Option<&str>) -> Answer {
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
}
