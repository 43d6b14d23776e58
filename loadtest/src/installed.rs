//! `loadtest installed`: cold starts on a cluster where the product is installed and real
//! kubelets run real containers (the local cluster of `hack/cluster`, docs/real-cluster.md, or
//! any other). Three ways from nothing to an answer, each to the first byte through the same
//! app container, each measured the same way (from the moment the client acts):
//!
//! - **activator**: a request to a member activator of a new Revision (no pod): the activator
//!   POSTs the pod with `spec.nodeName`, waits for it, proxies. Its `Server-Timing` gives the
//!   anatomy (pod POST sent, create answered, pod usable, first byte).
//! - **deployment**: a Deployment scaled 0 → 1 (ReplicaSet controller, kube-scheduler, the
//!   kubelet), its pod watched until Ready, then the same request to the pod IP.
//! - **pod POST** (the floor): the pod the activator would create, POSTed with `spec.nodeName`
//!   by the client itself, watched until Ready, then the same request.
//!
//! The pods of all three are alike (the activator's defaults: no ServiceAccount token, no
//! service links), so the difference is the control path. Runs rotate over the nodes (the
//! deployment's pod goes where kube-scheduler puts it). A failure is counted, never dropped:
//! each figure is printed with its failures (ranked last, as everywhere in the load test).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use crds::{ActivationEndpoints, Revision};
use futures::future::join_all;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::Error;
use crate::anatomy::ColdPhases;
use crate::driver::Driver;
use crate::observe::FirstSeen;
use crate::stats::Percentiles;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// Rounds; each starts `burst` of each path.
    pub runs: usize,
    /// Cold starts at once per path in a round (1: one at a time).
    pub burst: usize,
    /// The app image (it must answer `path` on port 8080 and be on every node).
    pub image: String,
    pub path: String,
    /// A bound on each cold start (a hang detector, not a figure).
    pub limit: Duration,
    /// An HTTP readinessProbe (GET of `path`) with this periodSeconds on the app: the
    /// kubelet then reports Ready only at its probe's period.
    pub readiness_period: Option<u32>,
    /// The app container's imagePullPolicy: `Never` (the image is on every node) or, for the
    /// image-pull mode, `IfNotPresent`.
    pub pull_policy: &'static str,
    /// The app listens this long after its container starts (a JVM's start, shortened): the
    /// test app's server is started after a sleep, and gets a TCP readinessProbe (period 1 s)
    /// unless `readiness_period` gives an HTTP one, so Ready means it answers.
    pub listen_delay_ms: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            runs: 10,
            burst: 1,
            image: "localhost/local-activator/testapp:dev".into(),
            path: "/cgi-bin/app".into(),
            limit: Duration::from_secs(120),
            readiness_period: None,
            pull_policy: "Never",
            listen_delay_ms: None,
        }
    }
}

/// One path's figures, in ms from the client's first act to the first byte of the answer.
#[derive(Debug, Clone, Serialize)]
pub struct PathFigures {
    pub path: &'static str,
    pub first_byte_ms: Percentiles,
    /// Why each failure failed.
    pub errors: Vec<String>,
}

impl PathFigures {
    /// A path's outcomes: the answered ones' percentiles with the failures counted beside
    /// them, and why each failure failed.
    pub(crate) fn of(path: &'static str, outcomes: &[Outcome]) -> Self {
        let ok: Vec<Duration> = outcomes
            .iter()
            .filter_map(|o| o.as_ref().ok().copied())
            .collect();
        let errors: Vec<String> = outcomes
            .iter()
            .filter_map(|o| o.as_ref().err().cloned())
            .collect();
        PathFigures {
            path,
            first_byte_ms: Percentiles::with_failed(&ok, errors.len()),
            errors,
        }
    }
}

/// The activator's own account of its cold starts (Server-Timing), p50 of each phase, ms from
/// the request's arrival.
#[derive(Debug, Clone, Serialize)]
pub struct Anatomy {
    pub pod_post_ms: Percentiles,
    pub pod_bound_ms: Percentiles,
    /// The pod's address known to the activator (from its node agent, or the pod watch).
    pub pod_addr_ms: Percentiles,
    /// The pod usable: the activator's own check passed, or the kubelet's Ready came.
    pub pod_ready_ms: Percentiles,
    pub first_byte_ms: Percentiles,
}

#[derive(Debug, Clone, Serialize)]
pub struct InstalledReport {
    pub nodes: Vec<String>,
    pub runs: usize,
    pub burst: usize,
    pub paths: Vec<PathFigures>,
    pub activator_anatomy: Anatomy,
    /// Whether the installed activators run with a node agent (an activator pod with a
    /// `node-agent` container), read from the cluster.
    pub node_agent: bool,
    /// The app's readinessProbe periodSeconds, if it had one.
    pub readiness_period: Option<u32>,
    /// activator p50 ÷ pod POST p50 (None when either has failures: a ratio is refused then).
    pub activator_over_floor_p50: Option<f64>,
    /// The same at p90 and p99.
    pub activator_over_floor_p90: Option<f64>,
    pub activator_over_floor_p99: Option<f64>,
    /// deployment p50 ÷ activator p50 (None as above).
    pub deployment_over_activator_p50: Option<f64>,
}

impl InstalledReport {
    pub fn table(&self) -> String {
        let mut s = format!(
            "cold start to the first byte on real kubelets ({} nodes: {}), {} runs × {} at once\n",
            self.nodes.len(),
            self.nodes.join(", "),
            self.runs,
            self.burst
        );
        s += &format!(
            "activators with a node agent: {}; app readinessProbe: {}\n",
            if self.node_agent { "yes" } else { "no" },
            self.readiness_period
                .map_or("none".into(), |p| format!("httpGet, periodSeconds {p}"))
        );
        s += "path          count failed    p50 ms    p90 ms    p99 ms    max ms\n";
        for p in &self.paths {
            let f = &p.first_byte_ms;
            s += &format!(
                "{:<13} {:>5} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1}\n",
                p.path, f.count, f.failed, f.p50, f.p90, f.p99, f.max
            );
        }
        let a = &self.activator_anatomy;
        s += &format!(
            "activator anatomy, p50 ms from the request's arrival: pod POST sent {:.1}, create \
             answered {:.1}, address known {:.1}, pod usable {:.1}, first byte {:.1}\n",
            a.pod_post_ms.p50,
            a.pod_bound_ms.p50,
            a.pod_addr_ms.p50,
            a.pod_ready_ms.p50,
            a.first_byte_ms.p50
        );
        let ratio = |r: Option<f64>| r.map_or("invalid (failures)".into(), |r| format!("{r:.2}"));
        s += &format!(
            "activator ÷ pod POST floor: p50 {}, p90 {}, p99 {}; deployment ÷ activator (p50): {}\n",
            ratio(self.activator_over_floor_p50),
            ratio(self.activator_over_floor_p90),
            ratio(self.activator_over_floor_p99),
            ratio(self.deployment_over_activator_p50)
        );
        for p in &self.paths {
            for e in p.errors.iter().take(5) {
                s += &format!("  {} failed: {e}\n", p.path);
            }
        }
        s
    }
}

/// An outcome: time to the first byte, or why it failed.
pub(crate) type Outcome = Result<Duration, String>;

pub async fn run(client: &Client, opts: &Options) -> Result<InstalledReport, Error> {
    let nodes = ready_nodes(client).await?;
    in_namespace(client, async |ns| measure(client, opts, ns, &nodes).await).await
}

/// The image-pull mode (crate::image_pull): `evict_cmd` removes the image from a node.
pub async fn run_image_pull(
    client: &Client,
    opts: &Options,
    evict_cmd: &str,
    has_cmd: Option<&str>,
) -> Result<crate::image_pull::PullReport, Error> {
    let nodes = ready_nodes(client).await?;
    in_namespace(client, async |ns| {
        crate::image_pull::measure(client, opts, evict_cmd, has_cmd, ns, &nodes).await
    })
    .await
}

/// Warm traffic during pre-pulls (crate::image_pull::warm_during_pulls).
pub async fn run_warm_during_pulls(
    client: &Client,
    opts: &Options,
    load: &crate::image_pull::PullLoad<'_>,
) -> Result<crate::image_pull::WarmDuringPulls, Error> {
    let nodes = ready_nodes(client).await?;
    in_namespace(client, async |ns| {
        crate::image_pull::warm_during_pulls(client, opts, load, ns, &nodes).await
    })
    .await
}

async fn ready_nodes(client: &Client) -> Result<Vec<String>, Error> {
    let nodes: Vec<String> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .map(|n| n.name_any())
        .collect();
    if nodes.is_empty() {
        return Err(Error::Options("no Ready node".into()));
    }
    Ok(nodes)
}

/// Runs `f` in a namespace of its own, deleted afterwards whatever `f` returned.
pub(crate) async fn in_namespace<T>(
    client: &Client,
    f: impl AsyncFnOnce(&str) -> Result<T, Error>,
) -> Result<T, Error> {
    let ns = format!("installed-{:08x}", rand::random::<u32>());
    crate::cluster::ensure_namespace(client, &ns).await?;
    let result = f(&ns).await;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    result
}

async fn measure(
    client: &Client,
    opts: &Options,
    ns: &str,
    nodes: &[String],
) -> Result<InstalledReport, Error> {
    let driver = Driver::new();
    let (mut act, mut dep, mut pod) = (Vec::new(), Vec::new(), Vec::new());
    let mut phases: Vec<ColdPhases> = Vec::new();
    for r in 0..opts.runs {
        let names: Vec<String> = (0..opts.burst).map(|b| format!("r{r}-{b}")).collect();
        // The activator: every revision's subset first (its creation is not the cold start).
        let members = join_all(names.iter().map(|n| revision(client, ns, n, opts))).await;
        let outcomes = join_all(names.iter().zip(members).map(|(n, m)| {
            let driver = driver.clone();
            async move {
                let m = m?;
                jitter().await;
                let s = driver.get_named((&m.0, m.1), ns, n, &opts.path).await;
                match s.ok() {
                    true => Ok((s.latency, s.phases)),
                    false => Err(format!("{}: {}", m.0, s.error.unwrap_or_default())),
                }
            }
        }))
        .await;
        for o in outcomes {
            act.push(o.map(|(l, p)| {
                phases.extend(p);
                l
            }));
        }
        // The Deployment path.
        dep.extend(
            join_all(
                names
                    .iter()
                    .map(|n| deployment(client, ns, n, opts, &driver)),
            )
            .await,
        );
        // The floor: the activator's pod, POSTed by the client.
        pod.extend(
            join_all(names.iter().enumerate().map(|(b, n)| {
                let node = &nodes[(r * opts.burst + b) % nodes.len()];
                raw_pod(client, ns, n, node, opts, &driver)
            }))
            .await,
        );
        // Every round starts from the same nodes: nothing of the last one left running.
        clean(client, ns, opts.limit).await?;
        tracing::info!(run = r, "round done");
    }
    let fig = PathFigures::of;
    let (a, d, p) = (
        fig("activator", &act),
        fig("deployment", &dep),
        fig("pod POST", &pod),
    );
    let ms = |f: &dyn Fn(&ColdPhases) -> f64| Percentiles::of_ms(phases.iter().map(f));
    let ratio_at = |x: &PathFigures, y: &PathFigures, at: fn(&Percentiles) -> f64| {
        let (fx, fy) = (&x.first_byte_ms, &y.first_byte_ms);
        (fx.failed == 0 && fy.failed == 0 && at(fy) > 0.0).then(|| at(fx) / at(fy))
    };
    let ratio = |x: &PathFigures, y: &PathFigures| ratio_at(x, y, |p| p.p50);
    Ok(InstalledReport {
        nodes: nodes.to_vec(),
        runs: opts.runs,
        burst: opts.burst,
        activator_anatomy: Anatomy {
            pod_post_ms: ms(&|p| p.pod_post),
            pod_bound_ms: ms(&|p| p.pod_bound),
            pod_addr_ms: ms(&|p| p.pod_addr.unwrap_or(p.pod_ready)),
            pod_ready_ms: ms(&|p| p.pod_ready),
            first_byte_ms: ms(&|p| p.wait),
        },
        node_agent: node_agent_installed(client).await,
        readiness_period: opts.readiness_period,
        activator_over_floor_p50: ratio(&a, &p),
        activator_over_floor_p90: ratio_at(&a, &p, |p| p.p90),
        activator_over_floor_p99: ratio_at(&a, &p, |p| p.p99),
        deployment_over_activator_p50: ratio(&d, &a),
        paths: vec![a, d, p],
    })
}

/// A random pause of up to a second before each measured start. A kubelet notices a started
/// container at its next one-second relist, so a cold start's length depends on where in that
/// second it begins; rounds that start the paths at fixed offsets from each other would favour
/// one path by its phase alone (two runs without this gave the activator 0.78× and 1.62× the
/// floor). The pause is outside every measured time.
pub(crate) async fn jitter() {
    use rand::RngExt;
    let ms = rand::rng().random_range(0..1000u64);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// The pod spec all three paths run (the activator adds nodeName and its labels).
pub(crate) fn pod_spec(opts: &Options) -> Value {
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "containers": [{
            "name": "app",
            "image": opts.image,
            "imagePullPolicy": opts.pull_policy,
            "ports": [{"containerPort": 8080}],
        }],
    });
    if let Some(ms) = opts.listen_delay_ms.filter(|ms| *ms > 0) {
        // The image's own command (hack/images/build), after a sleep.
        let run = format!(
            "trap 'exit 0' TERM INT; /bin/busybox usleep {}; \
             /bin/busybox httpd -f -p 8080 -h /www & wait",
            ms * 1000
        );
        spec["containers"][0]["command"] = json!(["/bin/busybox", "sh", "-c", run]);
        spec["containers"][0]["readinessProbe"] = json!({
            "tcpSocket": {"port": 8080},
            "periodSeconds": 1,
        });
    }
    if let Some(period) = opts.readiness_period {
        spec["containers"][0]["readinessProbe"] = json!({
            "httpGet": {"path": opts.path, "port": 8080},
            "periodSeconds": period,
        });
    }
    spec
}

/// Every Ready activator pod of the installed product, by node, at its pod IP and data port
/// (the address its ActivationEndpoints memberships give).
pub(crate) async fn activator_entries(client: &Client) -> Result<Vec<(String, SocketAddr)>, Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let lp = ListParams::default().labels(crds::contract::ACTIVATOR_SELECTOR);
    let mut entries: Vec<(String, SocketAddr)> = pods
        .list(&lp)
        .await?
        .items
        .iter()
        .filter(|p| crate::observe::is_ready(p))
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            let ip: std::net::IpAddr = p.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
            Some((node, SocketAddr::new(ip, crds::contract::DATA_PORT)))
        })
        .collect();
    entries.sort();
    if entries.is_empty() {
        return Err(Error::Options(
            "no Ready activator pod (is the product installed?)".into(),
        ));
    }
    Ok(entries)
}

/// Whether the installed activator pods carry a `node-agent` container and their activator
/// container is told its socket (`NODE_AGENT_SOCKET` or `--node-agent-socket`).
pub(crate) async fn node_agent_installed(client: &Client) -> bool {
    let pods: Api<Pod> = Api::all(client.clone());
    let lp = ListParams::default().labels(crds::contract::ACTIVATOR_SELECTOR);
    pods.list(&lp).await.is_ok_and(|l| {
        l.items.iter().any(|p| {
            let Some(spec) = p.spec.as_ref() else {
                return false;
            };
            let agent = spec.containers.iter().any(|c| c.name == "node-agent");
            let told = spec.containers.iter().any(|c| {
                c.name == "activator"
                    && (c
                        .env
                        .iter()
                        .flatten()
                        .any(|e| e.name == "NODE_AGENT_SOCKET")
                        || c.args
                            .iter()
                            .flatten()
                            .any(|a| a.starts_with("--node-agent-socket")))
            });
            agent && told
        })
    })
}

/// Creates a revision (one member) and returns its member once assigned.
async fn revision(
    client: &Client,
    ns: &str,
    name: &str,
    opts: &Options,
) -> Result<(String, SocketAddr), String> {
    revision_annotated(client, ns, name, opts, json!({})).await
}

/// [`revision`] with these annotations on the Revision.
pub(crate) async fn revision_annotated(
    client: &Client,
    ns: &str,
    name: &str,
    opts: &Options,
    annotations: Value,
) -> Result<(String, SocketAddr), String> {
    let rev: Revision = serde_json::from_value(json!({
        "apiVersion": "local-activator.dev/v1alpha1",
        "kind": "Revision",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {"port": 8080, "activators": 1, "template": {"spec": pod_spec(opts)}},
    }))
    .map_err(|e| e.to_string())?;
    Api::<Revision>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &rev)
        .await
        .map_err(|e| format!("creating revision {name}: {e}"))?;
    let api: Api<ActivationEndpoints> = Api::namespaced(client.clone(), ns);
    let assigned = await_condition(api, name, |a: Option<&ActivationEndpoints>| {
        a.and_then(|a| a.status.as_ref())
            .is_some_and(|s| !s.activators.is_empty())
    });
    let ae = tokio::time::timeout(opts.limit, assigned)
        .await
        .map_err(|_| format!("{name}: no subset within {:?}", opts.limit))?
        .map_err(|e| e.to_string())?
        .ok_or("the subset vanished")?;
    let m = ae.status.unwrap().activators.remove(0);
    let addr = m
        .address
        .parse()
        .map_err(|e| format!("{}: {e}", m.address))?;
    Ok((m.node, addr))
}

/// A watch of the pods labelled `app=<name>`, established (its first list answered) before
/// this returns, as the activator's own pod watch is before a request comes: the first Ready
/// pod's node and IP, under `name`.
pub(crate) async fn watch_ready(
    client: &Client,
    ns: &str,
    name: &str,
) -> FirstSeen<(String, String)> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let key = name.to_string();
    FirstSeen::start(api, &watcher_labels(name), move |p| {
        let ip = crate::observe::ready_ip(p)?;
        let node = p.spec.as_ref()?.node_name.clone().unwrap_or_default();
        Some((key.clone(), (node, ip)))
    })
    .await
}

/// Awaits the Ready pod, then requests it: the time from `t0` to its answer.
pub(crate) async fn then_request(
    ready: FirstSeen<(String, String)>,
    name: &str,
    opts: &Options,
    driver: &Driver,
    t0: Instant,
) -> Outcome {
    let (_, (node, ip)) = ready
        .wait_one(name, opts.limit.saturating_sub(t0.elapsed()))
        .await
        .ok_or_else(|| format!("{name}: not Ready within {:?}", opts.limit))?;
    let addr = SocketAddr::new(ip.parse().map_err(|e| format!("{ip}: {e}"))?, 8080);
    let s = driver.get((&node, addr), name, "app", &opts.path).await;
    if s.ok() {
        Ok(t0.elapsed())
    } else {
        Err(format!("{node}: {}", s.error.unwrap_or_default()))
    }
}

fn watcher_labels(name: &str) -> String {
    format!("loadtest.local-activator.dev/app={name}")
}

pub(crate) fn labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(
        "loadtest.local-activator.dev/app".to_string(),
        name.to_string(),
    )])
}

/// A Deployment at 0, then scaled to 1 at `t0`.
pub(crate) async fn deployment(
    client: &Client,
    ns: &str,
    name: &str,
    opts: &Options,
    driver: &Driver,
) -> Outcome {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": format!("d-{name}")},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels(&format!("d-{name}"))},
            "template": {
                "metadata": {"labels": labels(&format!("d-{name}"))},
                "spec": pod_spec(opts),
            },
        },
    }))
    .map_err(|e| e.to_string())?;
    api.create(&PostParams::default(), &d)
        .await
        .map_err(|e| format!("creating deployment d-{name}: {e}"))?;
    let ready = watch_ready(client, ns, &format!("d-{name}")).await;
    jitter().await;
    let t0 = Instant::now();
    api.patch(
        &format!("d-{name}"),
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await
    .map_err(|e| format!("scaling d-{name}: {e}"))?;
    then_request(ready, &format!("d-{name}"), opts, driver, t0).await
}

/// The floor: the pod POSTed with `spec.nodeName` at `t0`.
pub(crate) async fn raw_pod(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    opts: &Options,
    driver: &Driver,
) -> Outcome {
    let mut spec = pod_spec(opts);
    spec["nodeName"] = node.into();
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("p-{name}"), "labels": labels(&format!("p-{name}"))},
        "spec": spec,
    }))
    .map_err(|e| e.to_string())?;
    let ready = watch_ready(client, ns, &format!("p-{name}")).await;
    jitter().await;
    let t0 = Instant::now();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &p)
        .await
        .map_err(|e| format!("creating pod p-{name}: {e}"))?;
    then_request(ready, &format!("p-{name}"), opts, driver, t0).await
}

/// Deletes what a round made (Revisions take their pods along) and waits until no pod of the
/// namespace is left, so that no path runs on nodes busier than another's.
pub(crate) async fn clean(client: &Client, ns: &str, limit: Duration) -> Result<(), Error> {
    let dp = DeleteParams::default();
    let lp = ListParams::default();
    Api::<Revision>::namespaced(client.clone(), ns)
        .delete_collection(&dp, &lp)
        .await?;
    Api::<Deployment>::namespaced(client.clone(), ns)
        .delete_collection(&dp, &lp)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.delete_collection(&dp, &lp).await?;
    let gone = async {
        loop {
            match pods.list(&lp).await {
                Ok(l) if l.items.is_empty() => return,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    };
    tokio::time::timeout(limit, gone)
        .await
        .map_err(|_| Error::Timeout {
            what: format!("the pods of {ns} to be deleted"),
            secs: limit.as_secs(),
        })
}
