//! `loadtest installed --image-pull`: the first request after a Revision is created whose image
//! is on no node, on a cluster with real kubelets and a registry (the local one of
//! `hack/cluster`: docs/real-cluster.md). Four ways to the first byte, each round, each from the
//! client's act:
//!
//! - **present**: the image already on every node (pulled by a pod per node first), a request
//!   to the member of a new Revision: the cold start every earlier figure measured.
//! - **pulled ahead**: the image removed from every node, a new Revision; its member pulls the
//!   image as soon as it is a member (the activator's pre-pull through its node agent); the
//!   request comes once the member's Node reports the image (`status.images`), as the first
//!   request of a deploy usually comes a while after it.
//! - **no pull ahead**: the same with the Revision's pre-pull turned off
//!   (`local-activator.dev/prepull: "false"`): the request right after the subset is written,
//!   so the kubelet pulls in the cold start.
//! - **deployment**: a Deployment with the same image scaled 0 → 1, image on no node.
//!
//! The image is removed from every node by a command the caller gives (`--evict-cmd`, run
//! once per node with `{node}` and `{image}` replaced: `hack/cluster/node image-rm {node}
//! {image}` on the local cluster). Where the time went: the kubelet's own pull time (its
//! `Pulled` event, "Successfully pulled image … in 5.461s") and the activator's phases
//! (`Server-Timing`). A failure is counted beside every percentile, never dropped.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{ListParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};
use serde::Serialize;
use serde_json::json;

use crate::activator_metrics;
use tokio::time::Instant;

use crds::contract::PREPULL_ANNOTATION;

use crate::Error;
use crate::anatomy::ColdPhases;
use crate::driver::Driver;
use crate::installed::{
    Options, Outcome, PathFigures, clean, deployment, jitter, pod_spec, revision_annotated,
};
use crate::stats::Percentiles;

#[derive(Debug, Clone, Serialize)]
pub struct PullReport {
    pub nodes: Vec<String>,
    pub runs: usize,
    pub image: String,
    /// present, pulled ahead, no pull ahead, deployment.
    pub paths: Vec<PathFigures>,
    /// The kubelet's pull time (its `Pulled` event) where a pod pulled, by path.
    pub kubelet_pull_ms: Vec<(String, Percentiles)>,
    /// Cold starts of "pulled ahead" whose kubelet found the image present (of all of them).
    pub ahead_found_present: usize,
    /// From the subset written to the member's node holding the image (outside the measured
    /// time: the pre-pull's own length; through `status.images` without `--has-cmd`, late by
    /// up to minutes).
    pub ahead_ready_ms: Percentiles,
    /// The activator's phases (p50, ms from the request's arrival) on the two activator paths
    /// that differ: pod usable, first byte.
    pub phases: Vec<(String, f64, f64)>,
    /// pulled ahead p50 ÷ present p50 (None when either has failures).
    pub ahead_over_present_p50: Option<f64>,
    pub no_ahead_over_present_p50: Option<f64>,
    pub deployment_over_ahead_p50: Option<f64>,
}

impl PullReport {
    pub fn table(&self) -> String {
        let mut s = format!(
            "first request after a Revision is created, image {} ({} nodes), {} runs\n",
            self.image,
            self.nodes.len(),
            self.runs
        );
        s += "path            count failed    p50 ms    p90 ms    p99 ms    max ms\n";
        for p in &self.paths {
            let f = &p.first_byte_ms;
            s += &format!(
                "{:<15} {:>5} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1}\n",
                p.path, f.count, f.failed, f.p50, f.p90, f.p99, f.max
            );
        }
        for (path, p) in &self.kubelet_pull_ms {
            s += &format!(
                "kubelet pull time on {path}: {} pulls, p50 {:.1} ms, max {:.1} ms\n",
                p.count, p.p50, p.max
            );
        }
        s += &format!(
            "pulled ahead: the kubelet found the image present in {} of {} cold starts; image \
             on the member's node p50 {:.0} ms after the subset\n",
            self.ahead_found_present, self.runs, self.ahead_ready_ms.p50
        );
        for (path, usable, first) in &self.phases {
            s += &format!(
                "activator anatomy ({path}), p50 ms from the request: pod usable {usable:.1}, first byte {first:.1}\n"
            );
        }
        let ratio = |r: Option<f64>| r.map_or("invalid (failures)".into(), |r| format!("{r:.2}"));
        s += &format!(
            "p50 ratios: pulled ahead ÷ present {}, no pull ahead ÷ present {}, deployment ÷ pulled ahead {}\n",
            ratio(self.ahead_over_present_p50),
            ratio(self.no_ahead_over_present_p50),
            ratio(self.deployment_over_ahead_p50)
        );
        for p in &self.paths {
            for e in p.errors.iter().take(5) {
                s += &format!("  {} failed: {e}\n", p.path);
            }
        }
        s
    }
}

/// Runs the rounds in namespace `ns` over the Ready `nodes`. With `has_cmd` (exit status 0
/// when `{node}` holds `{image}`), "pulled ahead" waits for the member's node to hold the
/// image by asking it; without, for the Node's `status.images`, which the kubelet refreshes
/// from a list it re-reads every 30 s and was seen to lag by minutes.
pub async fn measure(
    client: &Client,
    opts: &Options,
    evict_cmd: &str,
    has_cmd: Option<&str>,
    ns: &str,
    nodes: &[String],
) -> Result<PullReport, Error> {
    let opts = pulling(opts);
    let driver = Driver::new();
    let (mut present, mut ahead, mut no_ahead, mut dep) = (vec![], vec![], vec![], vec![]);
    let (mut present_phases, mut ahead_phases) = (vec![], vec![]);
    let (mut ahead_ready, mut found_present) = (vec![], 0);
    let mut pulls: Vec<(String, Vec<Duration>)> = ["no pull ahead", "deployment", "pulled ahead"]
        .iter()
        .map(|p| (p.to_string(), vec![]))
        .collect();
    for r in 0..opts.runs {
        // present: the image on every node first.
        pull_everywhere(client, ns, &format!("warm-{r}"), nodes, &opts).await?;
        let name = format!("present-{r}");
        present.push(
            activator_path(
                client,
                &driver,
                ns,
                &name,
                &opts,
                false,
                &mut present_phases,
            )
            .await,
        );
        // no pull ahead: the member's kubelet pulls in the cold start.
        evict(client, ns, evict_cmd, nodes, &opts).await?;
        let name = format!("noahead-{r}");
        no_ahead.push(activator_path(client, &driver, ns, &name, &opts, true, &mut vec![]).await);
        collect_pulls(client, ns, &name, &mut pulls[0].1).await;
        // deployment 0 → 1, image on no node.
        evict(client, ns, evict_cmd, nodes, &opts).await?;
        let name = format!("dep-{r}");
        dep.push(deployment(client, ns, &name, &opts, &driver).await);
        collect_pulls(client, ns, &format!("d-{name}"), &mut pulls[1].1).await;
        // pulled ahead: the member pulls before the request. Without `has_cmd`, every node's
        // status first says the image is gone, so that the member's reporting it means it
        // pulled it again.
        evict(client, ns, evict_cmd, nodes, &opts).await?;
        if has_cmd.is_none() {
            for node in nodes {
                node_reports_image(client, node, &opts.image, false, opts.limit)
                    .await
                    .map_err(Error::Options)?;
            }
        }
        let name = format!("ahead-{r}");
        let outcome = async {
            let m = revision_annotated(client, ns, &name, &opts, json!({})).await?;
            let t = Instant::now();
            match has_cmd {
                Some(cmd) => node_holds(cmd, &m.0, &opts.image, opts.limit).await?,
                None => node_reports_image(client, &m.0, &opts.image, true, opts.limit).await?,
            }
            ahead_ready.push(t.elapsed());
            jitter().await;
            let s = driver.get_named((&m.0, m.1), ns, &name, &opts.path).await;
            match s.ok() {
                true => {
                    ahead_phases.extend(s.phases);
                    Ok(s.latency)
                }
                false => Err(format!("{}: {}", m.0, s.error.unwrap_or_default())),
            }
        }
        .await;
        ahead.push(outcome);
        found_present += collect_pulls(client, ns, &name, &mut pulls[2].1).await;
        clean(client, ns, opts.limit).await?;
        tracing::info!(run = r, "image-pull round done");
    }
    let fig = PathFigures::of;
    let paths = vec![
        fig("present", &present),
        fig("pulled ahead", &ahead),
        fig("no pull ahead", &no_ahead),
        fig("deployment", &dep),
    ];
    let ratio = |x: &PathFigures, y: &PathFigures| {
        let (fx, fy) = (&x.first_byte_ms, &y.first_byte_ms);
        (fx.failed == 0 && fy.failed == 0 && fy.p50 > 0.0).then(|| fx.p50 / fy.p50)
    };
    let p50 = |v: &[ColdPhases], f: fn(&ColdPhases) -> f64| Percentiles::of_ms(v.iter().map(f)).p50;
    Ok(PullReport {
        nodes: nodes.to_vec(),
        runs: opts.runs,
        image: opts.image.clone(),
        kubelet_pull_ms: pulls
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(p, v)| (p, Percentiles::with_failed(&v, 0)))
            .collect(),
        ahead_found_present: found_present,
        ahead_ready_ms: Percentiles::with_failed(&ahead_ready, 0),
        phases: vec![
            (
                "present".into(),
                p50(&present_phases, |p| p.pod_ready),
                p50(&present_phases, |p| p.wait),
            ),
            (
                "pulled ahead".into(),
                p50(&ahead_phases, |p| p.pod_ready),
                p50(&ahead_phases, |p| p.wait),
            ),
        ],
        ahead_over_present_p50: ratio(&paths[1], &paths[0]),
        no_ahead_over_present_p50: ratio(&paths[2], &paths[0]),
        deployment_over_ahead_p50: ratio(&paths[3], &paths[1]),
        paths,
    })
}

/// `opts` with the app pulled when absent (the image-pull mode's images are on no node).
fn pulling(opts: &Options) -> Options {
    Options {
        pull_policy: "IfNotPresent",
        ..opts.clone()
    }
}

/// A new Revision (pre-pull off if `no_prepull`), then the request to its member at once.
async fn activator_path(
    client: &Client,
    driver: &Driver,
    ns: &str,
    name: &str,
    opts: &Options,
    no_prepull: bool,
    phases: &mut Vec<ColdPhases>,
) -> Outcome {
    let annotations = match no_prepull {
        true => json!({ PREPULL_ANNOTATION: "false" }),
        false => json!({}),
    };
    let m = revision_annotated(client, ns, name, opts, annotations).await?;
    let s = driver.get_named((&m.0, m.1), ns, name, &opts.path).await;
    match s.ok() {
        true => {
            phases.extend(s.phases);
            Ok(s.latency)
        }
        false => Err(format!("{}: {}", m.0, s.error.unwrap_or_default())),
    }
}

/// The image pulled on every node: a pod of it POSTed to each, awaited Running, deleted.
async fn pull_everywhere(
    client: &Client,
    ns: &str,
    prefix: &str,
    nodes: &[String],
    opts: &Options,
) -> Result<(), Error> {
    pull_everywhere_keep(client, ns, prefix, nodes, opts).await?;
    clean(client, ns, opts.limit).await
}

/// As [`pull_everywhere`], the pods left running (their image stays on their node).
async fn pull_everywhere_keep(
    client: &Client,
    ns: &str,
    prefix: &str,
    nodes: &[String],
    opts: &Options,
) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    for (i, node) in nodes.iter().enumerate() {
        let mut spec = pod_spec(opts);
        spec["nodeName"] = node.as_str().into();
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("{prefix}-{i}")},
            "spec": spec,
        }))
        .map_err(|e| Error::Options(e.to_string()))?;
        api.create(&PostParams::default(), &p).await?;
    }
    for i in 0..nodes.len() {
        let pod = format!("{prefix}-{i}");
        let running = await_condition(api.clone(), &pod, |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref()?.phase.as_deref()) == Some("Running")
        });
        tokio::time::timeout(opts.limit, running)
            .await
            .map_err(|_| Error::Timeout {
                what: format!("{prefix}-{i} to pull {} and run", opts.image),
                secs: opts.limit.as_secs(),
            })?
            .map_err(|e| Error::Start {
                what: format!("{prefix}-{i}"),
                message: e.to_string(),
            })?;
    }
    Ok(())
}

/// The namespace emptied (a running container keeps its image's content on the node), then
/// `cmd` run once per node, `{node}` and `{image}` replaced.
async fn evict(
    client: &Client,
    ns: &str,
    cmd: &str,
    nodes: &[String],
    opts: &Options,
) -> Result<(), Error> {
    clean(client, ns, opts.limit).await?;
    run_per_node(cmd, nodes, &opts.image).await
}

/// Runs `cmd` once per node, `{node}` and `{image}` replaced; the first failure is returned.
async fn run_per_node(cmd: &str, nodes: &[String], image: &str) -> Result<(), Error> {
    for node in nodes {
        let line = cmd.replace("{node}", node).replace("{image}", image);
        let out = tokio::process::Command::new("sh")
            .args(["-c", &line])
            .output()
            .await
            .map_err(|e| Error::Command {
                line: line.clone(),
                message: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(Error::Command {
                message: format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                line,
            });
        }
    }
    Ok(())
}

/// Awaits `cmd` saying `node` holds `image` (asked every 100 ms).
async fn node_holds(cmd: &str, node: &str, image: &str, limit: Duration) -> Result<(), String> {
    let nodes = [node.to_string()];
    let held = async {
        while run_per_node(cmd, &nodes, image).await.is_err() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(limit, held)
        .await
        .map_err(|_| format!("{node} did not hold {image} within {limit:?}"))
}

/// Awaits `image` among `node`'s `status.images` (`present`), or not among them (the kubelet
/// refreshes them every ~10 s from a list of at most 30 s age).
async fn node_reports_image(
    client: &Client,
    node: &str,
    image: &str,
    present: bool,
    limit: Duration,
) -> Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let wanted = image.to_string();
    let has = await_condition(nodes, node, move |n: Option<&Node>| {
        n.and_then(|n| n.status.as_ref()?.images.as_ref())
            .is_some_and(|imgs| {
                imgs.iter()
                    .any(|i| i.names.iter().flatten().any(|n| *n == wanted))
            })
            == present
    });
    tokio::time::timeout(limit, has)
        .await
        .map_err(|_| {
            format!("{node}'s status.images: {image} present={present} not within {limit:?}")
        })?
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The kubelet's pull times of the pods whose names start with `prefix-` into `into`; the
/// number of them whose kubelet found the image present.
async fn collect_pulls(client: &Client, ns: &str, prefix: &str, into: &mut Vec<Duration>) -> usize {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().fields("reason=Pulled");
    let Ok(events) = api.list(&lp).await else {
        return 0;
    };
    let mut present = 0;
    for e in events.items {
        let name = e.involved_object.name.clone().unwrap_or_default();
        if !name.starts_with(&format!("{prefix}-")) {
            continue;
        }
        let msg = e.message.unwrap_or_default();
        if msg.contains("already present") {
            present += 1;
        } else if let Some(d) = pulled_in(&msg) {
            into.push(d);
        }
    }
    present
}

/// The pull time in a kubelet `Pulled` message: `Successfully pulled image "x" in 5.461s
/// (5.461s including waiting)` (a Go duration: `850ms`, `5.461s`, `1m2.5s`).
pub fn pulled_in(msg: &str) -> Option<Duration> {
    let rest = msg.split("\" in ").nth(1)?;
    go_duration(rest.split_whitespace().next()?)
}

/// A Go `time.Duration` string (`h`, `m`, `s`, `ms`, `µs`/`us`, `ns` units, decimals).
pub fn go_duration(s: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let value: f64 = num.parse().ok()?;
        let (unit, secs) = [
            ("ns", 1e-9),
            ("us", 1e-6),
            ("µs", 1e-6),
            ("ms", 1e-3),
            ("h", 3600.0),
            ("m", 60.0),
            ("s", 1.0),
        ]
        .into_iter()
        .find(|(u, _)| tail.starts_with(u))?;
        total += value * secs;
        rest = &tail[unit.len()..];
    }
    Some(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_as_the_kubelet_prints_them() {
        assert_eq!(go_duration("5.461s"), Some(Duration::from_millis(5461)));
        assert_eq!(go_duration("850ms"), Some(Duration::from_millis(850)));
        assert_eq!(go_duration("1m2.5s"), Some(Duration::from_millis(62_500)));
        assert_eq!(go_duration("1h0m0s"), Some(Duration::from_secs(3600)));
        assert_eq!(go_duration("12µs"), Some(Duration::from_micros(12)));
        assert_eq!(go_duration(""), None);
        assert_eq!(go_duration("5"), None, "a number without a unit");
        assert_eq!(go_duration("5x"), None);
        assert_eq!(go_duration("s"), None);
    }

    #[test]
    fn the_pull_time_is_read_from_the_kubelets_message() {
        let msg = "Successfully pulled image \"10.88.255.1:5000/local-activator/testapp-big:dev\" \
                   in 5.461s (5.461s including waiting)";
        assert_eq!(pulled_in(msg), Some(Duration::from_millis(5461)));
        let present = "Container image \"x:dev\" already present on machine";
        assert_eq!(pulled_in(present), None);
    }
}

/// Warm traffic on one node while its activator pre-pulls ten images, against the same traffic
/// just before: the pulls must not slow requests being served.
#[derive(Debug, Clone, Serialize)]
pub struct WarmDuringPulls {
    pub node: String,
    pub images: usize,
    /// Concurrent clients of the warm revision, closed loop, through the node's activator
    /// (when `rate` is None).
    pub clients: usize,
    /// Open loop at this many requests a second.
    pub rate: Option<f64>,
    pub path: String,
    pub before_ms: Percentiles,
    pub during_ms: Percentiles,
    /// From the pull revisions' creation to every image present on the node.
    pub pulls_s: f64,
    /// during p99 ÷ before p99 (None when either window had failures).
    pub p99_ratio: Option<f64>,
    pub p50_ratio: Option<f64>,
    pub errors: Vec<String>,
}

impl WarmDuringPulls {
    pub fn table(&self) -> String {
        let row = |name: &str, p: &Percentiles| {
            format!(
                "{name:<15} {:>6} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>9.2}\n",
                p.count, p.failed, p.p50, p.p90, p.p99, p.max
            )
        };
        let ratio = |r: Option<f64>| r.map_or("invalid (failures)".into(), |r| format!("{r:.2}"));
        let load = match self.rate {
            Some(r) => format!("open loop, {r} req/s"),
            None => format!("{} clients, closed loop", self.clients),
        };
        let mut s = format!(
            "warm requests for {} on {} ({load}) while its activator pre-pulls {} images ({:.1} \
             s until all were on the node)\nwindow          count failed    p50 ms    p90 ms    \
             p99 ms    max ms\n",
            self.path, self.node, self.images, self.pulls_s
        );
        s += &row("before pulls", &self.before_ms);
        s += &row("during pulls", &self.during_ms);
        s += &format!(
            "during ÷ before: p50 {}, p99 {}\n",
            ratio(self.p50_ratio),
            ratio(self.p99_ratio)
        );
        for e in self.errors.iter().take(5) {
            s += &format!("  failed: {e}\n");
        }
        s
    }
}

/// What the warm-during-pulls measure needs from the caller.
pub struct PullLoad<'a> {
    /// The ten (or so) images, each present on no node after `evict_cmd`.
    pub images: Vec<String>,
    pub evict_cmd: &'a str,
    /// Exit status 0 when `{node}` holds `{image}` (`hack/cluster/node image-has {node}
    /// {image}`): the end of the pulls, seen at once (a Node's status.images lags).
    pub has_cmd: &'a str,
    pub clients: usize,
    /// Open loop at this many requests a second instead of `clients` in a closed loop. A
    /// closed loop keeps the node's CPU busy by construction (each client sends again as soon
    /// as it is answered), so any other work, a pull or not, slows it by its share of the
    /// CPU; an open loop below the node's capacity asks whether the pulls slow a node serving
    /// traffic, which is the question.
    pub rate: Option<f64>,
    /// The warm requests' path (the app's CGI forks a shell per request; `/` is a file).
    pub path: String,
    /// The window before the pulls.
    pub before: Duration,
}

/// One window of warm traffic, closed or open loop, until `stop`.
async fn warm_window(
    driver: &Driver,
    entry: &(String, std::net::SocketAddr),
    ns: &str,
    load: &PullLoad<'_>,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<crate::driver::Sample> {
    let get = |driver: Driver, entry: (String, std::net::SocketAddr), ns: String, path: String| async move {
        driver
            .get_named((&entry.0, entry.1), &ns, "warm", &path)
            .await
    };
    match load.rate {
        Some(rate) => {
            let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let lp = crate::open_loop::OpenLoop {
                rate,
                // Ended by `stop`; the bound only keeps a forgotten stop finite.
                duration: Duration::from_secs(3600),
                max_in_flight: 256,
            };
            let run = lp
                .run_until(&stop, |_| {
                    let f = get(
                        driver.clone(),
                        entry.clone(),
                        ns.to_string(),
                        load.path.clone(),
                    );
                    let samples = samples.clone();
                    async move {
                        let s = f.await;
                        let ok = s.ok();
                        samples.lock().expect("not poisoned").push(s);
                        ok
                    }
                })
                .await;
            let mut out = std::mem::take(&mut *samples.lock().expect("not poisoned"));
            // Never sent (more than 256 outstanding): failures, counted.
            for _ in 0..run.count(crate::open_loop::Fate::Overflowed) {
                out.push(crate::driver::Sample::unsent(
                    "warm",
                    "not sent: 256 requests outstanding".into(),
                ));
            }
            // Latency from the intended send time (no coordinated omission): the open loop's
            // own figure replaces each answer's.
            let mut lat: Vec<Duration> = run
                .outcomes
                .iter()
                .filter(|o| o.ok())
                .map(|o| o.latency)
                .collect();
            lat.sort();
            let mut answered: Vec<&mut crate::driver::Sample> =
                out.iter_mut().filter(|s| s.ok()).collect();
            answered.sort_by_key(|s| s.latency);
            for (s, l) in answered.into_iter().zip(lat) {
                s.latency = l;
            }
            out
        }
        None => {
            let per_client = (0..load.clients).map(|_| {
                let (driver, entry, ns, path) = (
                    driver.clone(),
                    entry.clone(),
                    ns.to_string(),
                    load.path.clone(),
                );
                let stop = stop.clone();
                async move {
                    let mut out = vec![];
                    while !stop.is_cancelled() {
                        out.push(
                            get(driver.clone(), entry.clone(), ns.clone(), path.clone()).await,
                        );
                    }
                    out
                }
            });
            futures::future::join_all(per_client)
                .await
                .into_iter()
                .flatten()
                .collect()
        }
    }
}

/// A warm revision on one node; the pull images present on every other node (so that only
/// this node pulls), removed from it; warm traffic for `before`, then the pull revisions
/// created (every node a member) and the same traffic until the node holds every image.
pub async fn warm_during_pulls(
    client: &Client,
    opts: &Options,
    load: &PullLoad<'_>,
    ns: &str,
    nodes: &[String],
) -> Result<WarmDuringPulls, Error> {
    let opts = pulling(opts);
    let driver = Driver::new();
    let m = revision_annotated(client, ns, "warm", &opts, json!({}))
        .await
        .map_err(Error::Options)?;
    let wake = driver.get_named((&m.0, m.1), ns, "warm", &opts.path).await;
    if !wake.ok() {
        return Err(Error::Options(format!("waking warm: {:?}", wake.error)));
    }
    let others: Vec<String> = nodes.iter().filter(|n| **n != m.0).cloned().collect();
    for (i, image) in load.images.iter().enumerate() {
        let o = Options {
            image: image.clone(),
            ..opts.clone()
        };
        pull_everywhere_keep(client, ns, &format!("pre-{i}"), &others, &o).await?;
    }
    for image in &load.images {
        run_per_node(load.evict_cmd, std::slice::from_ref(&m.0), image).await?;
    }
    let entry = (m.0.clone(), m.1);
    // Before.
    let stop = tokio_util::sync::CancellationToken::new();
    let before = {
        let (driver, entry, ns, stop2) =
            (driver.clone(), entry.clone(), ns.to_string(), stop.clone());
        let window = async move { warm_window(&driver, &entry, &ns, load, stop2).await };
        let stopper = async {
            tokio::time::sleep(load.before).await;
            stop.cancel();
        };
        let (before, ()) = tokio::join!(window, stopper);
        before
    };
    // During: the pull revisions, then traffic until the node holds every image.
    let stop = tokio_util::sync::CancellationToken::new();
    let during = warm_window(&driver, &entry, ns, load, stop.clone());
    // The pulls' end, seen in the node's activator's own counters (one small HTTP request
    // per 100 ms): polling `has_cmd` instead (a shell and `ctr` per image and poll) was itself
    // a load on the node's CPU, during this window only. `has_cmd` confirms afterwards.
    let ip = m.1.ip();
    let done_pulls = async move || {
        let ok = activator_metrics::read_total(ip, "activator_prepull_succeeded_total").await?;
        let failed = activator_metrics::read_total(ip, "activator_prepull_failed_total").await?;
        Some((ok, failed))
    };
    let (ok0, failed0) = done_pulls()
        .await
        .ok_or_else(|| Error::Options(format!("{}'s activator serves no metrics", m.0)))?;
    let pulls = async {
        let t0 = Instant::now();
        let result = async {
            for (i, image) in load.images.iter().enumerate() {
                let o = Options {
                    image: image.clone(),
                    ..opts.clone()
                };
                let name = format!("pull-{i}");
                revision_all_members(client, ns, &name, &o, nodes.len())
                    .await
                    .map_err(Error::Options)?;
            }
            let n = load.images.len() as u64;
            let all_over = async {
                loop {
                    if let Some((ok, failed)) = done_pulls().await
                        && ok + failed >= ok0 + failed0 + n
                    {
                        return (ok - ok0, failed - failed0);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            };
            tokio::time::timeout(opts.limit, all_over)
                .await
                .map_err(|_| Error::Timeout {
                    what: format!("{} to pull the {} images", m.0, load.images.len()),
                    secs: opts.limit.as_secs(),
                })
        }
        .await;
        stop.cancel();
        result.map(|counts| (counts, t0.elapsed().as_secs_f64()))
    };
    let (during, pulls) = tokio::join!(during, pulls);
    let ((_, failed_pulls), pulls_s) = pulls?;
    if failed_pulls > 0 {
        return Err(Error::Options(format!(
            "{} of {}'s pre-pulls failed (activator_prepull_failed_total)",
            failed_pulls, m.0
        )));
    }
    for image in &load.images {
        node_holds(load.has_cmd, &m.0, image, Duration::from_secs(5))
            .await
            .map_err(Error::Options)?;
    }
    let window = |v: &[crate::driver::Sample]| {
        let ok: Vec<Duration> = v.iter().filter(|s| s.ok()).map(|s| s.latency).collect();
        Percentiles::with_failed(&ok, v.len() - ok.len())
    };
    let (b, d) = (window(&before), window(&during));
    let errors = before
        .iter()
        .chain(&during)
        .filter(|s| !s.ok())
        .map(|s| {
            s.error
                .clone()
                .unwrap_or_else(|| format!("status {}", s.status))
        })
        .collect();
    let ratio = |x: f64, y: f64| (b.failed == 0 && d.failed == 0 && y > 0.0).then(|| x / y);
    Ok(WarmDuringPulls {
        node: m.0,
        images: load.images.len(),
        clients: load.clients,
        rate: load.rate,
        path: load.path.clone(),
        p99_ratio: ratio(d.p99, b.p99),
        p50_ratio: ratio(d.p50, b.p50),
        before_ms: b,
        during_ms: d,
        pulls_s,
        errors,
    })
}

/// A Revision with `members` activators (every node), created without waiting for its subset.
async fn revision_all_members(
    client: &Client,
    ns: &str,
    name: &str,
    opts: &Options,
    members: usize,
) -> Result<(), String> {
    let rev: crds::Revision = serde_json::from_value(json!({
        "apiVersion": "local-activator.dev/v1alpha1",
        "kind": "Revision",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"port": 8080, "activators": members, "template": {"spec": pod_spec(opts)}},
    }))
    .map_err(|e| e.to_string())?;
    Api::<crds::Revision>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &rev)
        .await
        .map(|_| ())
        .map_err(|e| format!("creating revision {name}: {e}"))
}
