//! End to end on a real cluster: the local one of `hack/cluster` (docs/real-cluster.md) —
//! real kubelets, real containers, the product installed from `deploy/` with its own
//! ServiceAccounts and RBAC. Every request goes through a real activator pod to a real app
//! container (`hack/images/build`'s test app: `/cgi-bin/app` names its pod, `?ms=N` holds the
//! request N ms), pulled from the cluster's registry (`imagePullPolicy: IfNotPresent`), as on a
//! real cluster.
//!
//! Skipped, with the reason printed, when there is no such cluster: `LA_E2E_KUBECONFIG`, or
//! `hack/cluster/.state/kubeconfig` of this repository, must exist and answer, and the product
//! must be installed (`hack/cluster/up && hack/images/build && hack/cluster/install`). CI has
//! none, so there every test here passes as a skip. The tests change the cluster (they stop a
//! kubelet, delete an activator, roll the DaemonSet, uninstall and reinstall): they run one at
//! a time (`.config/nextest.toml`), each in a namespace of its own, and leave the cluster as
//! they found it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crds::contract::REVISION_LABEL;
use crds::{ActivationEndpoints, ActivatorMember, Revision};
use futures::StreamExt;
use futures::future::join_all;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use loadtest::driver::{Driver, Ingress, Sample, with_ingress};
use serde_json::json;
use tokio::time::Instant;

const SYSTEM_NS: &str = "local-activator";
/// The test app in the cluster's registry (hack/cluster/up starts it, hack/images/build pushes).
const APP_IMAGE: &str = "10.88.255.1:5000/local-activator/testapp:dev";
const APP: &str = "/cgi-bin/app";
/// A bound on any wait for the cluster (a hang detector, not a timing).
const LIMIT: Duration = Duration::from_secs(180);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn kubeconfig_path() -> PathBuf {
    std::env::var_os("LA_E2E_KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("hack/cluster/.state/kubeconfig"))
}

/// One test's view of the cluster: a client, a namespace of its own (deleted when dropped).
struct Env {
    client: Client,
    ns: String,
    driver: Driver,
    /// This test's turn on the cluster: the tests change it (faults, restarts) and must run
    /// one at a time. nextest runs each in its own process (and its `real-cluster` test group
    /// one at a time); `cargo test` runs a binary's tests on threads of one process, which
    /// this lock serializes. Released after the namespace is deleted (fields drop last).
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

/// The lock behind [`Env::_turn`].
static TURN: std::sync::LazyLock<Arc<tokio::sync::Mutex<()>>> =
    std::sync::LazyLock::new(Arc::default);

impl Drop for Env {
    fn drop(&mut self) {
        // Also on a panic: nothing of a test outlives it.
        let _ = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig_path())
            .args(["delete", "namespace", &self.ns, "--wait=false"])
            .output();
    }
}

/// The cluster, or None (the reason printed) when there is none to test.
async fn env(test: &str) -> Option<Env> {
    let turn = TURN.clone().lock_owned().await;
    let path = kubeconfig_path();
    let skip = |why: String| {
        eprintln!("SKIPPED {test}: {why}");
    };
    if !path.exists() {
        skip(format!(
            "no real cluster ({} does not exist; docs/real-cluster.md: hack/cluster/up, \
             hack/images/build, hack/cluster/install)",
            path.display()
        ));
        return None;
    }
    let kc = kube::config::Kubeconfig::read_from(&path).expect("the kubeconfig parses");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("the kubeconfig is usable");
    let client = Client::try_from(cfg).expect("a client");
    match tokio::time::timeout(Duration::from_secs(10), client.apiserver_version()).await {
        Ok(Ok(_)) => {}
        other => {
            skip(format!(
                "the cluster of {} does not answer ({other:?}): hack/cluster/up",
                path.display()
            ));
            return None;
        }
    }
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), SYSTEM_NS);
    if ds.get_opt("activator").await.ok().flatten().is_none() {
        skip("the product is not installed: hack/cluster/install".into());
        return None;
    }
    // Installed: it must be healthy (a failure from here on is a failure, not a skip).
    wait_daemonset_ready(&client).await;
    let ns = format!("e2e-{:08x}", rand::random::<u32>());
    loadtest::cluster::ensure_namespace(&client, &ns)
        .await
        .expect("the test namespace");
    Some(Env {
        client,
        ns,
        driver: Driver::new(),
        _turn: turn,
    })
}

async fn wait_daemonset_ready(client: &Client) {
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), SYSTEM_NS);
    let rolled = await_condition(ds, "activator", |d: Option<&DaemonSet>| {
        let Some(d) = d else { return false };
        let (Some(st), Some(gen_)) = (&d.status, d.metadata.generation) else {
            return false;
        };
        st.observed_generation.unwrap_or(0) >= gen_
            && st.desired_number_scheduled > 0
            && st.updated_number_scheduled == Some(st.desired_number_scheduled)
            && st.number_ready == st.desired_number_scheduled
            && st.number_available == Some(st.desired_number_scheduled)
    });
    tokio::time::timeout(LIMIT, rolled)
        .await
        .expect("the activator DaemonSet is rolled out and Ready")
        .unwrap();
}

impl Env {
    /// Creates the revision (the test app; `f` shapes its spec) and returns its subset's
    /// members once it has `members` of them.
    async fn revision(
        &self,
        name: &str,
        members: usize,
        f: impl FnOnce(&mut serde_json::Value),
    ) -> Vec<ActivatorMember> {
        let mut spec = json!({
            "hosts": [self.host(name)],
            "port": 8080,
            "template": {"spec": {"containers": [{
                "name": "app",
                "image": APP_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "ports": [{"containerPort": 8080}],
            }]}},
        });
        f(&mut spec);
        let rev: Revision = serde_json::from_value(json!({
            "apiVersion": "local-activator.dev/v1alpha1",
            "kind": "Revision",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": spec,
        }))
        .expect("a revision");
        let api: Api<Revision> = Api::namespaced(self.client.clone(), &self.ns);
        api.create(&PostParams::default(), &rev).await.unwrap();
        self.members(name, move |m| m.len() == members).await
    }

    fn host(&self, name: &str) -> String {
        format!("{name}.{}.e2e.local", self.ns)
    }

    /// The subset's members, once `pred` holds of them.
    async fn members(
        &self,
        name: &str,
        pred: impl Fn(&[ActivatorMember]) -> bool + Send + 'static,
    ) -> Vec<ActivatorMember> {
        let api: Api<ActivationEndpoints> = Api::namespaced(self.client.clone(), &self.ns);
        let found = await_condition(api, name, move |a: Option<&ActivationEndpoints>| {
            a.and_then(|a| a.status.as_ref())
                .is_some_and(|s| pred(&s.activators))
        });
        let ae = tokio::time::timeout(LIMIT, found)
            .await
            .unwrap_or_else(|_| panic!("the subset of {name}"))
            .unwrap()
            .unwrap();
        ae.status.unwrap().activators
    }

    async fn pods(&self, rev: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        api.list(&ListParams::default().labels(&format!("{REVISION_LABEL}={rev}")))
            .await
            .unwrap()
            .items
    }

    async fn uid_of(&self, pod: &str) -> Option<String> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        api.get_opt(pod).await.unwrap().map(|p| p.uid().unwrap())
    }

    async fn get(&self, m: &ActivatorMember, rev: &str, path: &str) -> Sample {
        self.driver
            .get_named((&m.node, addr(m)), &self.ns, rev, path)
            .await
    }

    /// The activator pods (data address by node), members or not.
    async fn activators(&self) -> BTreeMap<String, SocketAddr> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), SYSTEM_NS);
        let lp = ListParams::default().labels("app.kubernetes.io/component=activator");
        api.list(&lp)
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(is_ready)
            .filter_map(|p| {
                let node = p.spec.as_ref()?.node_name.clone()?;
                let ip = p.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
                Some((node, SocketAddr::new(ip, crds::contract::DATA_PORT)))
            })
            .collect()
    }

    /// Keeps the most pods of `rev` alive at once (starting or serving), per node too, until
    /// the returned guard is read.
    fn track_pods(&self, rev: &str) -> PodPeak {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let cfg = watcher::Config::default().labels(&format!("{REVISION_LABEL}={rev}"));
        let peak = Arc::new(Mutex::new((0usize, BTreeMap::<String, usize>::new())));
        let p = peak.clone();
        let task = tokio::spawn(async move {
            let mut live: BTreeMap<String, String> = BTreeMap::new();
            let mut s = std::pin::pin!(watcher(api, cfg).default_backoff().touched_objects());
            while let Some(Ok(pod)) = s.next().await {
                let name = pod.name_any();
                let gone = pod.metadata.deletion_timestamp.is_some()
                    || pod
                        .status
                        .as_ref()
                        .and_then(|s| s.phase.as_deref())
                        .is_some_and(|ph| ph == "Failed" || ph == "Succeeded");
                if gone {
                    live.remove(&name);
                } else if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
                    live.insert(name, node);
                }
                let mut by_node: BTreeMap<String, usize> = BTreeMap::new();
                for n in live.values() {
                    *by_node.entry(n.clone()).or_default() += 1;
                }
                let mut pk = p.lock().unwrap();
                pk.0 = pk.0.max(live.len());
                for (n, c) in by_node {
                    let e = pk.1.entry(n).or_default();
                    *e = (*e).max(c);
                }
            }
        });
        PodPeak { peak, task }
    }
}

struct PodPeak {
    peak: Arc<Mutex<(usize, BTreeMap<String, usize>)>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodPeak {
    fn read(self) -> (usize, BTreeMap<String, usize>) {
        self.task.abort();
        self.peak.lock().unwrap().clone()
    }
}

fn addr(m: &ActivatorMember) -> SocketAddr {
    m.address.parse().expect("a member address is ip:port")
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn assert_all_ok(samples: &[Sample]) {
    let failed: Vec<&Sample> = samples.iter().filter(|s| !s.ok()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed, e.g. {:?}",
        failed.len(),
        samples.len(),
        failed.first()
    );
}

/// Requests sent while something happens to the cluster: `workers` clients in a loop, each
/// to a member of the revision's subset as last seen (re-read every second), with an
/// ingress's retry of a refused or reset connection on another member.
struct Load {
    samples: Arc<Mutex<Vec<(Instant, Sample)>>>,
    stop: tokio_util::sync::CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(env: &Env, rev: &str, workers: usize) -> Self {
        let members: Arc<Mutex<Vec<ActivatorMember>>> = Arc::default();
        let stop = tokio_util::sync::CancellationToken::new();
        let samples: Arc<Mutex<Vec<(Instant, Sample)>>> = Arc::default();
        let mut tasks = Vec::new();
        {
            let (m, stop) = (members.clone(), stop.clone());
            let api: Api<ActivationEndpoints> = Api::namespaced(env.client.clone(), &env.ns);
            let rev = rev.to_string();
            tasks.push(tokio::spawn(async move {
                while !stop.is_cancelled() {
                    if let Ok(Some(ae)) = api.get_opt(&rev).await {
                        let got = ae.status.map(|s| s.activators).unwrap_or_default();
                        if !got.is_empty() {
                            *m.lock().unwrap() = got;
                        }
                    }
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }));
        }
        for w in 0..workers {
            let (members, stop, samples) = (members.clone(), stop.clone(), samples.clone());
            let (driver, ns, rev) = (env.driver.clone(), env.ns.clone(), rev.to_string());
            tasks.push(tokio::spawn(async move {
                let mut i = w;
                while !stop.is_cancelled() {
                    let now: Vec<(String, SocketAddr)> = members
                        .lock()
                        .unwrap()
                        .iter()
                        .map(|m| (m.node.clone(), addr(m)))
                        .collect();
                    if now.is_empty() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    i += 1;
                    let first = now[i % now.len()].clone();
                    let others = now.clone();
                    let sent = Instant::now();
                    let s = with_ingress(
                        Ingress::Retry,
                        first,
                        move |failed| others.iter().find(|(n, _)| n != failed).cloned(),
                        |(node, a)| {
                            let (driver, ns, rev) = (driver.clone(), ns.clone(), rev.clone());
                            async move { driver.get_named((&node, a), &ns, &rev, APP).await }
                        },
                    )
                    .await;
                    samples.lock().unwrap().push((sent, s));
                }
            }));
        }
        Self {
            samples,
            stop,
            tasks,
        }
    }

    async fn stop(self) -> Vec<(Instant, Sample)> {
        self.stop.cancel();
        for t in self.tasks {
            t.await.expect("a load task ends without panicking");
        }
        std::mem::take(&mut *self.samples.lock().unwrap())
    }

    /// Waits until `n` more requests have been answered (the load is running).
    async fn wait_for(&self, n: usize) {
        let start = self.samples.lock().unwrap().len();
        tokio::time::timeout(LIMIT, async {
            while self.samples.lock().unwrap().len() < start + n {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the load makes progress");
    }
}

fn summary(samples: &[(Instant, Sample)]) -> String {
    let failed = samples.iter().filter(|(_, s)| !s.ok()).count();
    let retried = samples.iter().filter(|(_, s)| s.first.is_some()).count();
    // Per entry activator: requests, failures, latency p50 / p99 / max (failures included,
    // at their time to failure).
    let mut by_entry: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for (_, s) in samples {
        by_entry.entry(s.entry.as_str()).or_default().push(s);
    }
    let per: Vec<String> = by_entry
        .into_iter()
        .map(|(e, ss)| {
            let mut l: Vec<Duration> = ss.iter().map(|s| s.latency).collect();
            l.sort();
            let q = |f: f64| l[((l.len() - 1) as f64 * f) as usize].as_millis();
            format!(
                "{e}: {} requests, {} failed, p50 {} ms, p99 {} ms, max {} ms",
                ss.len(),
                ss.iter().filter(|s| !s.ok()).count(),
                q(0.5),
                q(0.99),
                q(1.0)
            )
        })
        .collect();
    let per = per.join("; ");
    format!(
        "{} requests, {failed} failed, {retried} answered on a second member after a refused \
         or reset connection [{per}]",
        samples.len()
    )
}

/// Runs a hack/cluster script (root; the cluster's state is this repository's).
fn script(name: &str, args: &[&str]) {
    let out = std::process::Command::new(repo().join("hack/cluster").join(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("hack/cluster/{name}: {e}"));
    assert!(
        out.status.success(),
        "hack/cluster/{name} {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A node's kubelet, stopped until this is dropped (also when the test fails: the next test
/// must find every node).
struct StoppedKubelet(String);

impl StoppedKubelet {
    fn stop(index: &str) -> Self {
        script("node", &["stop", index]);
        Self(index.to_string())
    }
}

impl Drop for StoppedKubelet {
    fn drop(&mut self) {
        let _ = std::process::Command::new(repo().join("hack/cluster/node"))
            .args(["start", &self.0])
            .output();
    }
}

async fn node_ready(client: &Client, node: &str, ready: bool) {
    let nodes: Api<Node> = Api::all(client.clone());
    let cond = await_condition(nodes, node, move |n: Option<&Node>| {
        n.and_then(|n| n.status.as_ref()?.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| (c.status == "True") == ready)
    });
    tokio::time::timeout(LIMIT, cond)
        .await
        .unwrap_or_else(|_| panic!("node {node} Ready={ready}"))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_start_by_headers_and_by_host_through_a_real_activator() {
    let Some(env) = env("cold_start_by_headers_and_by_host").await else {
        return;
    };
    let members = env
        .revision("hello", 1, |s| s["activators"] = 1.into())
        .await;
    let m = &members[0];
    let cold = env.get(m, "hello", APP).await;
    assert!(cold.ok() && cold.cold, "{cold:?}");
    assert!(cold.phases.is_some(), "a cold answer carries its phases");
    let pod = cold.pod.clone().expect("the app names its pod");
    eprintln!(
        "cold start by headers on {}: request -> answer {} ms",
        m.node,
        cold.latency.as_millis()
    );
    let by_host = env
        .driver
        .get((&m.node, addr(m)), "hello", &env.host("hello"), APP)
        .await;
    assert!(by_host.ok() && !by_host.cold, "{by_host:?}");
    assert_eq!(by_host.pod.as_ref(), Some(&pod), "the same pod, warm");
    // An activator that is not a member forwards to one (by Host: it looks the Host up).
    let others = env.activators().await;
    let (node, a) = others
        .iter()
        .find(|(n, _)| **n != m.node)
        .expect("three nodes, one member");
    let fwd = env
        .driver
        .get((node, *a), "hello", &env.host("hello"), APP)
        .await;
    assert!(fwd.ok(), "forwarded from {node}: {fwd:?}");
    assert_eq!(fwd.pod.as_ref(), Some(&pod));
}

/// An activator pod's counter `name` with the label `label` = `value`, read from its admin
/// port (the member's pod IP, port 9090).
async fn counter(m: &ActivatorMember, name: &str, label: (&str, &str)) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ip = addr(m).ip();
    let mut s = tokio::net::TcpStream::connect((ip, crds::contract::ADMIN_PORT))
        .await
        .expect("the activator's admin port");
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    loadtest::activator_metrics::parse(&text, name)
        .into_iter()
        .filter(|(l, _)| l.get(label.0).map(String::as_str) == Some(label.1))
        .map(|(_, v)| v)
        .sum()
}

/// The node agent (deploy/components/node-agent, on in overlays/local) gives the activator a
/// starting pod's address from its sandbox, and the activator's own check serves the pod
/// before the kubelet reports it Ready: here the app's readinessProbe waits 5 s before its
/// first run, so the kubelet cannot say Ready for 5 s, while the app listens well before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_agent_gives_the_address_and_the_pod_serves_before_the_kubelets_ready() {
    let Some(env) = env("the_node_agent_gives_the_address").await else {
        return;
    };
    let ds: Api<DaemonSet> = Api::namespaced(env.client.clone(), SYSTEM_NS);
    let ds = ds.get("activator").await.unwrap();
    let containers = &ds.spec.template.spec.unwrap().containers;
    assert!(
        containers.iter().any(|c| c.name == "node-agent"),
        "deploy/overlays/local installs the node agent: {:?}",
        containers.iter().map(|c| &c.name).collect::<Vec<_>>()
    );
    let members = env
        .revision("agent", 1, |s| {
            s["activators"] = 1.into();
            s["template"]["spec"]["containers"][0]["readinessProbe"] = json!({
                "httpGet": {"path": APP, "port": 8080},
                "initialDelaySeconds": 5,
                "periodSeconds": 10,
            });
        })
        .await;
    let m = &members[0];
    let by_agent = || counter(m, "activator_pod_address_total", ("source", "agent"));
    let by_probe = || counter(m, "activator_pod_usable_first_total", ("by", "probe"));
    let (agent0, probe0) = (by_agent().await, by_probe().await);
    let cold = env.get(m, "agent", APP).await;
    assert!(cold.ok() && cold.cold, "{cold:?}");
    // The kubelet has not reported the pod Ready (its probe has not run yet), yet it served.
    let pod = cold.pod.clone().expect("the app names its pod");
    let api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let p = api.get(&pod).await.unwrap();
    assert!(
        !is_ready(&p),
        "answered in {} ms, and the kubelet had not said Ready: {:?}",
        cold.latency.as_millis(),
        p.status.and_then(|s| s.conditions)
    );
    assert_eq!(
        by_agent().await,
        agent0 + 1,
        "the address came from the node agent"
    );
    // What made the pod usable first is counted when the kubelet's Ready arrives (the
    // probe's lead over it is measured then): await that Ready, then the activator's count.
    let ready = await_condition(api.clone(), &pod, |p: Option<&Pod>| p.is_some_and(is_ready));
    tokio::time::timeout(LIMIT, ready)
        .await
        .expect("the kubelet reports the pod Ready")
        .unwrap();
    let counted = async {
        while by_probe().await < probe0 + 1 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), counted)
        .await
        .expect("the activator counts its own check as what made the pod usable first");
    assert_eq!(by_probe().await, probe0 + 1);
    eprintln!(
        "cold start on {} with the node agent: request -> answer {} ms, phases {:?}",
        m.node,
        cold.latency.as_millis(),
        cold.phases
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_concurrency_throttles_and_scales_out_on_a_node() {
    let Some(env) = env("container_concurrency_throttles_and_scales_out_on_a_node").await else {
        return;
    };
    let members = env
        .revision("busy", 1, |s| {
            s["activators"] = 1.into();
            s["containerConcurrency"] = 1.into();
            s["maxScale"] = 3.into();
        })
        .await;
    let m = members[0].clone();
    let peak = env.track_pods("busy");
    // Six requests of 2 s at once: one per pod at a time, at most three pods.
    let slow = format!("{APP}?ms=2000");
    let samples = join_all((0..6).map(|_| env.get(&m, "busy", &slow))).await;
    assert_all_ok(&samples);
    let served: BTreeSet<&String> = samples.iter().filter_map(|s| s.pod.as_ref()).collect();
    let (most, by_node) = peak.read();
    eprintln!("busy: served by {served:?}; most pods at once {most}, by node {by_node:?}");
    assert!(served.len() >= 2, "scaled out: {served:?}");
    assert!(most <= 3, "maxScale 3, yet {most} pods at once");
    assert_eq!(
        by_node.keys().collect::<Vec<_>>(),
        vec![&m.node],
        "all on the member's node"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_revision_goes_to_zero_and_comes_back_cold() {
    let Some(env) = env("an_idle_revision_goes_to_zero_and_comes_back_cold").await else {
        return;
    };
    let members = env
        .revision("sleepy", 1, |s| {
            s["activators"] = 1.into();
            s["idleTimeoutSeconds"] = 3.into();
        })
        .await;
    let m = &members[0];
    let first = env.get(m, "sleepy", APP).await;
    assert!(first.ok() && first.cold, "{first:?}");
    let first_uid = env.uid_of(first.pod.as_ref().unwrap()).await.unwrap();
    let warm = env.get(m, "sleepy", APP).await;
    assert!(warm.ok() && !warm.cold, "{warm:?}");
    // No request: the member deletes its pod after idleTimeoutSeconds.
    tokio::time::timeout(LIMIT, async {
        while !env.pods("sleepy").await.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("the idle revision goes to zero");
    let again = env.get(m, "sleepy", APP).await;
    assert!(again.ok() && again.cold, "asleep, so cold again: {again:?}");
    let again_uid = env.uid_of(again.pod.as_ref().unwrap()).await.unwrap();
    assert_ne!(again_uid, first_uid, "a new pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_scale_three_with_three_members_never_exceeds_three_pods() {
    let Some(env) = env("max_scale_three_with_three_members_never_exceeds_three_pods").await else {
        return;
    };
    let members = env
        .revision("shared", 3, |s| {
            s["activators"] = 3.into();
            s["containerConcurrency"] = 1.into();
            s["maxScale"] = 3.into();
        })
        .await;
    assert!(members.iter().all(|m| m.max_pods == 1), "{members:?}");
    let peak = env.track_pods("shared");
    let slow = format!("{APP}?ms=1500");
    let samples = join_all((0..12).map(|i| env.get(&members[i % 3], "shared", &slow))).await;
    assert_all_ok(&samples);
    let (most, by_node) = peak.read();
    eprintln!("shared: most pods at once {most}, by node {by_node:?}");
    assert!(most <= 3, "maxScale 3, yet {most} pods at once");
    assert!(
        by_node.values().all(|&n| n <= 1),
        "one pod per member: {by_node:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_lost_under_load_is_replaced_and_nothing_fails_after_the_repair() {
    let Some(env) = env("a_node_lost_under_load").await else {
        return;
    };
    let members = env
        .revision("steady", 2, |s| s["activators"] = 2.into())
        .await;
    let lost = members[0].node.clone();
    let index = lost
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .to_string();
    let load = Load::start(&env, "steady", 4);
    load.wait_for(20).await;
    let kubelet = StoppedKubelet::stop(&index);
    let stopped = Instant::now();
    node_ready(&env.client, &lost, false).await;
    let lost2 = lost.clone();
    let repaired = env
        .members("steady", move |m| {
            m.len() == 2 && m.iter().all(|m| m.node != lost2)
        })
        .await;
    let repair = Instant::now();
    eprintln!(
        "{lost} stopped; NotReady and replaced after {} ms by {:?}",
        repair.duration_since(stopped).as_millis(),
        repaired.iter().map(|m| &m.node).collect::<Vec<_>>()
    );
    load.wait_for(200).await;
    let samples = load.stop().await;
    drop(kubelet);
    node_ready(&env.client, &lost, true).await;
    let after: Vec<Sample> = samples
        .iter()
        .filter(|(t, _)| *t >= repair)
        .map(|(_, s)| s.clone())
        .collect();
    let (before, after_s): (Vec<_>, Vec<_>) =
        samples.iter().cloned().partition(|(t, _)| *t < repair);
    eprintln!(
        "before the repair: {}\nafter the repair: {}",
        summary(&before),
        summary(&after_s)
    );
    for (_, s) in samples.iter().filter(|(_, s)| !s.ok()) {
        eprintln!("failed: {s:?}");
    }
    assert!(after.len() >= 200);
    assert_all_ok(&after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activator_deleted_under_load_drains_and_loses_nothing() {
    let Some(env) = env("an_activator_deleted_under_load").await else {
        return;
    };
    let members = env
        .revision("drained", 2, |s| s["activators"] = 2.into())
        .await;
    let load = Load::start(&env, "drained", 4);
    load.wait_for(20).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), SYSTEM_NS);
    let victim = members[0].pod.clone();
    pods.delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    // The DaemonSet's replacement on that node is Ready, and serves.
    let node = members[0].node.clone();
    tokio::time::timeout(LIMIT, async {
        loop {
            let a = env.activators().await;
            let lp = ListParams::default().labels("app.kubernetes.io/component=activator");
            let fresh = pods.list(&lp).await.unwrap().items.into_iter().any(|p| {
                p.name_any() != victim
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node)
                    && is_ready(&p)
            });
            if fresh && a.contains_key(&node) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("a new activator on the node");
    load.wait_for(100).await;
    let samples = load.stop().await;
    eprintln!("activator {victim} deleted: {}", summary(&samples));
    let all: Vec<Sample> = samples.into_iter().map(|(_, s)| s).collect();
    assert_all_ok(&all);
}

/// Each activator's ActivationEndpoints lists and watches on the API server (its own count).
async fn endpoints_reads(acts: &BTreeMap<String, SocketAddr>) -> u64 {
    let mut total = 0;
    for a in acts.values() {
        let Some(text) = loadtest::activator_metrics::fetch(
            SocketAddr::new(a.ip(), crds::contract::ADMIN_PORT),
            "/metrics",
        )
        .await
        else {
            continue;
        };
        total += loadtest::activator_metrics::parse(&text, "activator_api_requests_total")
            .into_iter()
            .filter(|(l, _)| {
                l.get("resource").map(String::as_str) == Some("activationendpoints")
                    && matches!(l.get("verb").map(String::as_str), Some("list" | "watch"))
            })
            .map(|(_, v)| v)
            .sum::<u64>();
    }
    total
}

/// The membership streams each activator has opened (`activator_member_streams_opened`).
async fn streams_opened(acts: &BTreeMap<String, SocketAddr>) -> u64 {
    let mut total = 0;
    for a in acts.values() {
        total += metric_total(*a, "activator_member_streams_opened_total")
            .await
            .unwrap_or(0);
    }
    total
}

/// A directory replica (a subsetter pod) killed under warm traffic: nothing fails, the
/// activators whose stream it held resume on the other replica, a membership written after
/// it reaches its node (a new revision's cold start through a member), and no activator
/// lists or watches ActivationEndpoints on the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_replica_killed_under_warm_traffic_loses_nothing() {
    let Some(env) = env("a_directory_replica_killed").await else {
        return;
    };
    env.revision("streamed", 2, |s| s["activators"] = 2.into())
        .await;
    let load = Load::start(&env, "streamed", 4);
    load.wait_for(20).await;
    let acts = env.activators().await;
    let (reads0, opened0) = (endpoints_reads(&acts).await, streams_opened(&acts).await);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), SYSTEM_NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=subsetter");
    let replicas = pods.list(&lp).await.unwrap().items;
    assert!(replicas.len() >= 2, "two directory replicas to kill one of");
    // Each activator streams from a replica it drew at random (and draws again at its
    // stream's maximum age): the victim is the replica holding the most streams now, so
    // that some activator must resume (with 3 activators on 2 replicas, one holds all of
    // them an eighth of the time).
    let mut held = Vec::new();
    for p in &replicas {
        let ip = p.status.as_ref().and_then(|s| s.pod_ip.as_deref());
        let streams = match ip.and_then(|ip| ip.parse::<std::net::IpAddr>().ok()) {
            Some(ip) => loadtest::activator_metrics::fetch(SocketAddr::new(ip, 9091), "/metrics")
                .await
                .map_or(0, |text| {
                    loadtest::activator_metrics::parse(&text, "subsetter_member_streams")
                        .into_iter()
                        .map(|(_, v)| v)
                        .sum::<u64>()
                }),
            None => 0,
        };
        held.push((streams, p.name_any()));
    }
    held.sort();
    eprintln!("membership streams by replica: {held:?}");
    let victim = held.last().expect("replicas").1.clone();
    pods.delete(&victim, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    // Every activator whose stream the victim held opens one elsewhere.
    tokio::time::timeout(LIMIT, async {
        while streams_opened(&acts).await <= opened0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("streams resumed on the other replica");
    // A subset written after the kill reaches its members: a cold start through one.
    let members = env
        .revision("after-kill", 1, |s| s["activators"] = 1.into())
        .await;
    let target = Target {
        label: "after-kill".into(),
        node: members[0].node.clone(),
        addr: addr(&members[0]),
        rev: "after-kill".into(),
        by: By::Headers,
    };
    let cold = send_to(&env.driver, &env.ns, &target).await;
    load.wait_for(100).await;
    let samples = load.stop().await;
    eprintln!(
        "directory replica {victim} killed: {}; streams opened {} -> {}; cold start after it {:?} ms",
        summary(&samples),
        opened0,
        streams_opened(&acts).await,
        cold.latency.as_millis()
    );
    let mut all: Vec<Sample> = samples.into_iter().map(|(_, s)| s).collect();
    all.push(cold);
    assert_all_ok(&all);
    assert_eq!(
        endpoints_reads(&acts).await,
        reads0,
        "no activator listed or watched ActivationEndpoints"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_of_the_activators_under_load_loses_nothing_and_keeps_the_pods() {
    let Some(env) = env("a_rolling_update_of_the_activators_under_load").await else {
        return;
    };
    env.revision("rolled", 2, |s| s["activators"] = 2.into())
        .await;
    // Every member set the subset shows through the rollout: the subsetter holds each node's
    // activator for its replacement (`--replacement-hold-seconds`), so none moves.
    let seen: Arc<Mutex<Vec<BTreeSet<String>>>> = Arc::default();
    let recorder = {
        let seen = Arc::clone(&seen);
        let api: Api<ActivationEndpoints> = Api::namespaced(env.client.clone(), &env.ns);
        let stream = watcher(
            api,
            watcher::Config::default().fields("metadata.name=rolled"),
        )
        .applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(ae)) = stream.next().await {
                let nodes = ae
                    .status
                    .map(|s| s.activators.into_iter().map(|m| m.node).collect())
                    .unwrap_or_default();
                seen.lock().unwrap().push(nodes);
            }
        })
    };
    let load = Load::start(&env, "rolled", 4);
    load.wait_for(20).await;
    // The pods serving the load (with the node agent they serve before the kubelet reports
    // them Ready, so "live" here, not "Ready").
    let before: BTreeSet<String> = env
        .pods("rolled")
        .await
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.uid().unwrap())
        .collect();
    assert!(!before.is_empty());
    // The members as the rollout starts (an earlier fault test's node may have been repaired
    // since the revision was created): only what happens from here is the rollout's.
    let aes: Api<ActivationEndpoints> = Api::namespaced(env.client.clone(), &env.ns);
    let original: BTreeSet<String> = aes
        .get("rolled")
        .await
        .unwrap()
        .status
        .map(|s| s.activators.into_iter().map(|m| m.node).collect())
        .unwrap_or_default();
    seen.lock().unwrap().clear();
    let ds: Api<DaemonSet> = Api::namespaced(env.client.clone(), SYSTEM_NS);
    let stamp = format!("{}", rand::random::<u32>());
    ds.patch(
        "activator",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {
            "e2e.local-activator.dev/restarted": stamp
        }}}}})),
    )
    .await
    .unwrap();
    let started = Instant::now();
    wait_daemonset_ready(&env.client).await;
    eprintln!(
        "rollout of 3 activators: {} ms",
        started.elapsed().as_millis()
    );
    load.wait_for(100).await;
    let samples = load.stop().await;
    eprintln!("rolling update: {}", summary(&samples));
    let all: Vec<Sample> = samples.into_iter().map(|(_, s)| s).collect();
    assert_all_ok(&all);
    // The new activators adopted the app's pods: still serving, none started again.
    let after: BTreeSet<String> = env
        .pods("rolled")
        .await
        .iter()
        .map(|p| p.uid().unwrap())
        .collect();
    assert!(before.is_subset(&after), "{before:?} not all in {after:?}");
    // The subset names the new activator pods, and its members never changed.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), SYSTEM_NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=activator");
    let current: BTreeSet<String> = pods
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.name_any())
        .collect();
    let members = env
        .members("rolled", move |m| {
            m.iter().all(|m| current.contains(&m.pod))
        })
        .await;
    recorder.abort();
    let seen = seen.lock().unwrap().clone();
    eprintln!(
        "members through the rollout: {} states, {:?}",
        seen.len(),
        members
            .iter()
            .map(|m| (&m.node, &m.pod))
            .collect::<Vec<_>>()
    );
    if !seen.iter().all(|m| *m == original) {
        // Why, from the subsetter's own account of the activator set.
        let log = subsetter_set_log(&env.client).await;
        panic!("a member moved during the rollout (from {original:?}): {seen:?}\n{log}");
    }
}

/// The subsetter replicas' log lines of the last 10 minutes about the activator set (losses,
/// holds, returns), by replica: what a test that finds a member moved prints.
async fn subsetter_set_log(client: &Client) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=subsetter");
    let mut out = String::new();
    for p in pods.list(&lp).await.map(|l| l.items).unwrap_or_default() {
        let params = kube::api::LogParams {
            since_seconds: Some(600),
            ..Default::default()
        };
        let text = pods.logs(&p.name_any(), &params).await.unwrap_or_default();
        out.push_str(&format!("--- {}\n", p.name_any()));
        for line in text.lines().filter(|l| {
            l.contains("usable_activators") || l.contains("leader") || l.contains("control_plane")
        }) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_cluster_keeps_the_endpoints_contract() {
    let Some(env) = env("the_live_cluster_keeps_the_endpoints_contract").await else {
        return;
    };
    env.revision("contract", 2, |s| s["activators"] = 2.into())
        .await;
    let cluster = subsetter::contract::read_cluster(&env.client)
        .await
        .expect("reading the cluster");
    let breaches = subsetter::contract::check(&cluster);
    eprintln!(
        "{} ActivationEndpoints, {} Revisions, {} usable activators: {} breach(es)",
        cluster.endpoints.len(),
        cluster.revisions.len(),
        cluster.activators.len(),
        breaches.len()
    );
    assert!(cluster.activators.len() >= 3);
    assert!(breaches.is_empty(), "{breaches:#?}");
}

/// The names of the objects `api` lists that contain `part`.
async fn names_containing<K>(api: &Api<K>, part: &str) -> Vec<String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| o.name_any())
        .filter(|n| n.contains(part))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_leaves_nothing_and_install_restores_the_product() {
    let Some(env) = env("uninstall_leaves_nothing").await else {
        return;
    };
    env.revision("gone", 1, |s| s["activators"] = 1.into())
        .await;
    script("uninstall", &[]);
    // Nothing of the product is left: its CRDs (and so every Revision), its namespace, its
    // cluster-wide RBAC and admission policy, and no app pod it made.
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(env.client.clone());
    let left = names_containing(&crds, "local-activator.dev").await;
    assert!(left.is_empty(), "CRDs left: {left:?}");
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client.clone());
    assert!(nss.get_opt(SYSTEM_NS).await.unwrap().is_none());
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(env.client.clone());
    let left = names_containing(&roles, "local-activator").await;
    assert!(left.is_empty(), "ClusterRoles left: {left:?}");
    // The one Role outside its namespace: the API server's address (crds::api_route).
    let roles: Api<k8s_openapi::api::rbac::v1::Role> =
        Api::namespaced(env.client.clone(), crds::api_route::SERVICE_NAMESPACE);
    let left = names_containing(&roles, "local-activator").await;
    assert!(left.is_empty(), "Roles left in default: {left:?}");
    assert!(env.pods("gone").await.is_empty(), "app pods left");
    script("install", &[]);
    wait_daemonset_ready(&env.client).await;
}

// --- Real faults: the API server or etcd stopped, a node blackholed, a containerd killed ------

/// A client gives up on a request after this long: the request counts as failed ("no answer").
const GIVE_UP: Duration = Duration::from_secs(15);

/// Runs a hack/cluster script off the runtime's threads (the load keeps running meanwhile);
/// returns how long it took.
async fn script_blocking(name: &'static str, args: &[&str]) -> Duration {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let t = std::time::Instant::now();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        script(name, &args)
    })
    .await
    .expect("the script's thread");
    t.elapsed()
}

/// A fault put on the cluster (a hack/cluster script), undone by another when this is dropped
/// — also when the test panics: the next test must find the cluster whole.
struct Fault {
    script: &'static str,
    undo: Vec<String>,
    undone: bool,
}

impl Fault {
    async fn inject(script: &'static str, args: &[&str], undo: &[&str]) -> (Self, Duration) {
        let guard = Self {
            script,
            undo: undo.iter().map(|a| a.to_string()).collect(),
            undone: false,
        };
        let took = script_blocking(script, args).await;
        (guard, took)
    }

    /// Undoes the fault now (the script must succeed); returns how long it took.
    async fn undo(mut self) -> Duration {
        self.undone = true;
        let undo: Vec<&str> = self.undo.iter().map(String::as_str).collect();
        script_blocking(self.script, &undo).await
    }
}

impl Drop for Fault {
    fn drop(&mut self) {
        if !self.undone {
            let _ = std::process::Command::new(repo().join("hack/cluster").join(self.script))
                .args(&self.undo)
                .output();
        }
    }
}

/// How a request names its revision.
#[derive(Clone, Debug)]
enum By {
    /// `x-revision-namespace` / `x-revision-name`, as an ingress does.
    Headers,
    /// The revision's Host (the activator looks it up).
    Host(String),
}

/// One request loop's target: an activator, a revision, and how to name it.
#[derive(Clone, Debug)]
struct Target {
    label: String,
    node: String,
    addr: SocketAddr,
    rev: String,
    by: By,
}

/// A request to `t`, given up on after [`GIVE_UP`] (then a failure with status 0).
async fn send_to(driver: &Driver, ns: &str, t: &Target) -> Sample {
    let sent = std::time::Instant::now();
    let entry = (t.node.as_str(), t.addr);
    let answer = match &t.by {
        By::Headers => {
            tokio::time::timeout(GIVE_UP, driver.get_named(entry, ns, &t.rev, APP)).await
        }
        By::Host(h) => tokio::time::timeout(GIVE_UP, driver.get(entry, &t.rev, h, APP)).await,
    };
    answer.unwrap_or_else(|_| {
        let mut s = Sample::unsent(
            &t.rev,
            format!("no answer within {GIVE_UP:?}: the client gave up"),
        );
        s.entry = t.node.clone();
        s.sent = sent;
        s.latency = GIVE_UP;
        s
    })
}

/// Requests in loops, one at a time per target with `pause` between them, each kept with its
/// target's label.
struct Loops {
    samples: Arc<Mutex<Vec<(String, Sample)>>>,
    stop: tokio_util::sync::CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Loops {
    fn start(env: &Env, targets: &[Target], pause: Duration) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let samples: Arc<Mutex<Vec<(String, Sample)>>> = Arc::default();
        let tasks = targets
            .iter()
            .cloned()
            .map(|t| {
                let (stop, samples) = (stop.clone(), samples.clone());
                let (driver, ns) = (env.driver.clone(), env.ns.clone());
                tokio::spawn(async move {
                    while !stop.is_cancelled() {
                        let s = send_to(&driver, &ns, &t).await;
                        samples.lock().unwrap().push((t.label.clone(), s));
                        tokio::select! {
                            _ = stop.cancelled() => {}
                            _ = tokio::time::sleep(pause) => {}
                        }
                    }
                })
            })
            .collect();
        Self {
            samples,
            stop,
            tasks,
        }
    }

    fn len(&self) -> usize {
        self.samples.lock().unwrap().len()
    }

    async fn stop(self) -> Vec<(String, Sample)> {
        self.stop.cancel();
        for t in self.tasks {
            t.await.expect("a request loop ends without panicking");
        }
        std::mem::take(&mut *self.samples.lock().unwrap())
    }
}

/// A failed request's kind: its status, or "no answer" for a transport failure or a client
/// that gave up.
fn failure_kind(s: &Sample) -> String {
    if s.status == 0 {
        let e = s.error.as_deref().unwrap_or("");
        if e.contains("gave up") {
            "no answer (gave up)".into()
        } else {
            "no answer (transport)".into()
        }
    } else {
        s.status.to_string()
    }
}

/// Per label and phase (by the time each request was sent: `first` before the first phase's
/// start, then each phase from its start): requests, and failures by kind.
fn tally(
    samples: &[(String, Sample)],
    first: &str,
    phases: &[(&str, std::time::Instant)],
) -> String {
    let phases: Vec<(&str, Option<std::time::Instant>)> = std::iter::once((first, None))
        .chain(phases.iter().map(|(n, t)| (*n, Some(*t))))
        .collect();
    let mut out = String::new();
    let labels: BTreeSet<&String> = samples.iter().map(|(l, _)| l).collect();
    for label in labels {
        let mine: Vec<&Sample> = samples
            .iter()
            .filter(|(l, _)| l == label)
            .map(|(_, s)| s)
            .collect();
        let mut parts = Vec::new();
        for (i, (name, from)) in phases.iter().enumerate() {
            let to = phases.get(i + 1).and_then(|(_, t)| *t);
            let these: Vec<&&Sample> = mine
                .iter()
                .filter(|s| from.is_none_or(|f| s.sent >= f) && to.is_none_or(|t| s.sent < t))
                .collect();
            let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
            for s in these.iter().filter(|s| !s.ok()) {
                *by_kind.entry(failure_kind(s)).or_default() += 1;
            }
            let failed: usize = by_kind.values().sum();
            let mut l: Vec<u128> = these
                .iter()
                .filter(|s| s.ok())
                .map(|s| s.latency.as_millis())
                .collect();
            l.sort();
            let lat = match (l.get(l.len() / 2), l.last()) {
                (Some(p50), Some(max)) => format!(", answered in p50 {p50} / max {max} ms"),
                _ => String::new(),
            };
            parts.push(if failed == 0 {
                format!("{name} {} (0 failed{lat})", these.len())
            } else {
                format!("{name} {} ({failed} failed: {by_kind:?}{lat})", these.len())
            });
        }
        let first_error = mine
            .iter()
            .find(|s| !s.ok())
            .map(|s| format!("; e.g. {:?}", s.error.as_deref().unwrap_or("")))
            .unwrap_or_default();
        out += &format!("  {label}: {}{first_error}\n", parts.join(", "));
    }
    out
}

fn failures_of(samples: &[(String, Sample)], label_has: &str) -> (usize, usize) {
    let mine: Vec<&Sample> = samples
        .iter()
        .filter(|(l, _)| l.contains(label_has))
        .map(|(_, s)| s)
        .collect();
    (mine.len(), mine.iter().filter(|s| !s.ok()).count())
}

/// A raw HTTP/1.1 GET of the test app to `addr` with `headers`: its status (0: none within
/// `limit`, or no connection), headers, and the time to the whole answer.
async fn raw_get(
    addr: SocketAddr,
    headers: &[(&str, &str)],
    limit: Duration,
) -> (u16, Vec<(String, String)>, Duration, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t = std::time::Instant::now();
    let mut req = format!("GET {APP} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    let got = tokio::time::timeout(limit, async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    })
    .await;
    let took = t.elapsed();
    let buf = match got {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return (0, vec![], took, format!("{e}")),
        Err(_) => return (0, vec![], took, format!("no answer within {limit:?}")),
    };
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let hs = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, hs, took, body.trim().chars().take(200).collect())
}

/// Polls until the API server answers a read through `client` (bounded by `limit`).
async fn api_answers(client: &Client, limit: Duration) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        if let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_secs(2), client.apiserver_version()).await
        {
            let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
            if let Ok(Ok(_)) =
                tokio::time::timeout(Duration::from_secs(2), ns.get_opt("default")).await
            {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// The sum of an activator's counter `name` over all its labels, from its admin port (None
/// when it does not answer).
async fn metric_total(data: SocketAddr, name: &str) -> Option<u64> {
    loadtest::activator_metrics::read_total(data.ip(), name).await
}

/// The members the subsetters replaced because their activator was lost
/// (`subsetter_members_replaced_total{reason="lost"}`), summed over every replica that
/// answers on its admin port (9091); None when none answers.
async fn lost_replacements(client: &Client) -> Option<u64> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=subsetter");
    let mut total = None;
    for p in pods.list(&lp).await.ok()?.items {
        let Some(ip) = p.status.and_then(|s| s.pod_ip) else {
            continue;
        };
        let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
            continue;
        };
        if let Some(text) =
            loadtest::activator_metrics::fetch(SocketAddr::new(ip, 9091), "/metrics").await
        {
            let lost: u64 =
                loadtest::activator_metrics::parse(&text, "subsetter_members_replaced_total")
                    .into_iter()
                    .filter(|(l, _)| l.get("reason").map(String::as_str) == Some("lost"))
                    .map(|(_, v)| v)
                    .sum();
            *total.get_or_insert(0) += lost;
        }
    }
    total
}

/// Every activator's `activator_api_requests_total`, by node.
async fn api_requests(acts: &BTreeMap<String, SocketAddr>) -> BTreeMap<String, Option<u64>> {
    let mut out = BTreeMap::new();
    for (node, a) in acts {
        out.insert(
            node.clone(),
            metric_total(*a, "activator_api_requests_total").await,
        );
    }
    out
}

/// The API server (`component` "api") or etcd ("etcd") stopped for `outage` under warm load
/// through every activator; a cold start during it; a new revision after it.
/// When each activator's watches said they were receiving events again (its log's `… watch
/// receiving events again`, written on the first event after errors: after an API server
/// restart each re-lists, which is an event), the first such line after `from`, in seconds
/// after `back` (negative: before it).
async fn watches_resumed(
    client: &Client,
    from: k8s_openapi::jiff::Timestamp,
    back: k8s_openapi::jiff::Timestamp,
) -> BTreeMap<String, BTreeMap<String, f64>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=activator");
    let mut out = BTreeMap::new();
    for p in pods.list(&lp).await.map(|l| l.items).unwrap_or_default() {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let params = kube::api::LogParams {
            container: Some("activator".into()),
            since_seconds: Some(600),
            ..Default::default()
        };
        let text = pods.logs(&p.name_any(), &params).await.unwrap_or_default();
        let mut seen = BTreeMap::new();
        for line in text.lines() {
            let Some((ts, rest)) = line.split_once(' ') else {
                continue;
            };
            let Some(what) = rest
                .split_once("activator::cache: ")
                .and_then(|(_, r)| r.split_once(" watch receiving events again"))
                .map(|(w, _)| w.to_string())
            else {
                continue;
            };
            let Ok(at) = ts.parse::<k8s_openapi::jiff::Timestamp>() else {
                continue;
            };
            if at >= from {
                seen.entry(what)
                    .or_insert(at.duration_since(back).as_secs_f64());
            }
        }
        out.insert(node, seen);
    }
    out
}

async fn control_plane_outage(test: &str, component: &'static str, outage: Duration) {
    let Some(env) = env(test).await else {
        return;
    };
    let acts = env.activators().await;
    assert!(acts.len() >= 3, "an activator on every node: {acts:?}");
    // Three revisions of one member each: "warm" served before the outage through every
    // activator (by headers and by Host: each has looked both up), "unseen" served only
    // through its member (the others never looked it up), "cold" never requested.
    let warm = env
        .revision("warm", 1, |s| s["activators"] = 1.into())
        .await;
    let unseen = env
        .revision("unseen", 1, |s| s["activators"] = 1.into())
        .await;
    let cold = env
        .revision("cold", 1, |s| s["activators"] = 1.into())
        .await;
    for (node, a) in &acts {
        let h = env.driver.get_named((node, *a), &env.ns, "warm", APP).await;
        assert!(h.ok(), "warm by headers via {node}: {h:?}");
        let h = env
            .driver
            .get((node, *a), "warm", &env.host("warm"), APP)
            .await;
        assert!(h.ok(), "warm by Host via {node}: {h:?}");
    }
    let u = env.get(&unseen[0], "unseen", APP).await;
    assert!(u.ok(), "unseen through its member: {u:?}");
    eprintln!(
        "{component} outage: warm's member {}, unseen's member {}, cold's member {}",
        warm[0].node, unseen[0].node, cold[0].node
    );
    let mut targets = Vec::new();
    for (node, a) in &acts {
        for (rev, member) in [("warm", &warm[0].node), ("unseen", &unseen[0].node)] {
            let role = if node == member {
                "member"
            } else {
                "non-member"
            };
            targets.push(Target {
                label: format!("{rev} by headers via {node} ({role})"),
                node: node.clone(),
                addr: *a,
                rev: rev.into(),
                by: By::Headers,
            });
            targets.push(Target {
                label: format!("{rev} by Host via {node} ({role})"),
                node: node.clone(),
                addr: *a,
                rev: rev.into(),
                by: By::Host(env.host(rev)),
            });
        }
    }
    let loops = Loops::start(&env, &targets, Duration::from_millis(50));
    tokio::time::sleep(Duration::from_secs(2)).await;

    let lost0 = lost_replacements(&env.client).await;
    let api0 = api_requests(&acts).await;
    let t_stop = std::time::Instant::now();
    let (fault, took) = Fault::inject(component, &["stop"], &["start"]).await;
    let t_down = std::time::Instant::now();
    eprintln!("{component} stopped ({} ms)", took.as_millis());
    // A cold start while it is down: the member must answer 503 with Retry-After at once,
    // and so must an activator that forwards to it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut problems: Vec<String> = Vec::new();
    let cold_headers = [
        (crds::contract::HEADER_REVISION_NAMESPACE, env.ns.as_str()),
        (crds::contract::HEADER_REVISION_NAME, "cold"),
    ];
    let non_member = acts
        .iter()
        .find(|(n, _)| **n != cold[0].node)
        .map(|(n, a)| (n.clone(), *a))
        .unwrap();
    // Both at once, each given up on after a third of the outage (it must stay an outage).
    let limit = outage / 3;
    let answers = join_all(
        [
            (format!("its member {}", cold[0].node), addr(&cold[0])),
            (format!("non-member {}", non_member.0), non_member.1),
        ]
        .into_iter()
        .map(|(what, a)| {
            let cold_headers = &cold_headers;
            async move { (what, raw_get(a, cold_headers, limit).await) }
        }),
    )
    .await;
    for (what, (status, hs, took, body)) in answers {
        let retry_after = hs
            .iter()
            .find(|(k, _)| k == "retry-after")
            .map(|(_, v)| v.clone());
        eprintln!(
            "cold request during the {component} outage via {what}: {status} in {} ms, \
             Retry-After {retry_after:?}, body {body:?}",
            took.as_millis()
        );
        if status != 503 {
            problems.push(format!(
                "cold via {what}: status {status}, not 503 ({body:?})"
            ));
        }
        if retry_after.is_none() {
            problems.push(format!("cold via {what}: no Retry-After"));
        }
    }
    let left = outage.saturating_sub(t_down.elapsed());
    tokio::time::sleep(left).await;
    let sent_during = loops.len();
    // What the activators asked of the API server while it was down (as they count it).
    let api1 = api_requests(&acts).await;
    let secs = t_stop.elapsed().as_secs_f64();
    for (node, before) in &api0 {
        let after = api1.get(node).copied().flatten();
        match (before, after) {
            (Some(b), Some(a)) => eprintln!(
                "activator on {node}: {} API requests during the {component} outage \
                 ({:.2}/s over {secs:.0} s; activator_api_requests_total)",
                a.saturating_sub(*b),
                a.saturating_sub(*b) as f64 / secs
            ),
            _ => eprintln!("activator on {node}: its metrics did not answer"),
        }
    }

    let t_start = std::time::Instant::now();
    let start_at = k8s_openapi::jiff::Timestamp::now();
    let took = fault.undo().await;
    let t_ready = std::time::Instant::now();
    let back_at = k8s_openapi::jiff::Timestamp::now();
    let answered = api_answers(&env.client, Duration::from_secs(60)).await;
    let t_up = std::time::Instant::now();
    eprintln!(
        "{component} down {} ms; started again: /readyz ok after {} ms, this client's reads \
         answered {} ms later ({answered})",
        t_start.duration_since(t_down).as_millis(),
        took.as_millis(),
        t_up.duration_since(t_ready).as_millis()
    );
    // A new revision, served through every activator: each retried until served (60 s).
    let api: Api<Revision> = Api::namespaced(env.client.clone(), &env.ns);
    let rev: Revision = serde_json::from_value(json!({
        "apiVersion": "local-activator.dev/v1alpha1",
        "kind": "Revision",
        "metadata": {"name": "after", "namespace": env.ns},
        "spec": {
            "hosts": [env.host("after")],
            "port": 8080,
            "activators": 1,
            "template": {"spec": {"containers": [{
                "name": "app", "image": APP_IMAGE, "imagePullPolicy": "IfNotPresent",
                "ports": [{"containerPort": 8080}],
            }]}},
        },
    }))
    .unwrap();
    // When each kubelet's own pod watch is back (client-go's reflector backs off up to 30 s,
    // jittered up to twice that, after an API server outage): a bare pod bound to each
    // node, timed until its kubelet first writes its status. A new revision's pod waits
    // for this, whatever the activators do.
    let kubelets = {
        let (client, ns) = (env.client.clone(), env.ns.clone());
        let nodes: Vec<String> = acts.keys().cloned().collect();
        tokio::spawn(async move {
            join_all(nodes.into_iter().map(|node| {
                let (client, ns) = (client.clone(), ns.clone());
                async move {
                    let d = kubelet_sees_a_pod(&client, &ns, &node, Duration::from_secs(120)).await;
                    (node, d)
                }
            }))
            .await
        })
    };
    let mut created = false;
    while !created && t_up.elapsed() < Duration::from_secs(30) {
        created = api.create(&PostParams::default(), &rev).await.is_ok()
            || api.get_opt("after").await.ok().flatten().is_some();
        if !created {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(created, "the revision 'after' could not be created");
    let t_created = std::time::Instant::now();
    // The subsetter's side of recovery: its watches and its write of the new subset.
    let assigned = {
        let aes: Api<ActivationEndpoints> = Api::namespaced(env.client.clone(), &env.ns);
        tokio::spawn(async move {
            while t_created.elapsed() < Duration::from_secs(90) {
                if let Ok(Some(ae)) = aes.get_opt("after").await
                    && ae.status.as_ref().is_some_and(|s| !s.activators.is_empty())
                {
                    return Some(t_created.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            None
        })
    };
    // The kubelets' back-off (above) can hold a new pod for a minute or more after an
    // outage (seen: 50-96 s): the product is held to the kubelets' own figure below, and
    // this is only where waiting stops.
    let within = Duration::from_secs(150);
    let served = join_all(acts.iter().map(|(node, a)| {
        let env = &env;
        async move {
            let mut tries = 0;
            let mut last = None;
            while let Some(left) = within.checked_sub(t_created.elapsed()) {
                tries += 1;
                let t = Target {
                    label: String::new(),
                    node: node.clone(),
                    addr: *a,
                    rev: "after".into(),
                    by: By::Headers,
                };
                match tokio::time::timeout(left, send_to(&env.driver, &env.ns, &t)).await {
                    Ok(s) if s.ok() => {
                        return (node.clone(), Some(t_created.elapsed()), tries, None);
                    }
                    Ok(s) => {
                        last = Some(format!(
                            "{} after {} ms: {:?}",
                            s.status,
                            s.latency.as_millis(),
                            s.error
                        ))
                    }
                    Err(_) => last = Some("still waiting at the end".into()),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (node.clone(), None, tries, last)
        }
    }))
    .await;
    let kubelets = kubelets.await.expect("the kubelet measurement ends");
    for (node, d) in &kubelets {
        match d {
            Some(d) => eprintln!(
                "kubelet on {node}: a pod created once {component} was back got its first \
                 status {} ms later",
                d.as_millis()
            ),
            None => eprintln!("kubelet on {node}: never wrote a new pod's status"),
        }
    }
    // A new revision's pod cannot run before its node's kubelet watches pods again: the
    // product is allowed 30 s beyond the slowest kubelet's own figure (a bare pod bound to
    // its node), never less than the 90 s it was held to before.
    let slowest_kubelet = kubelets.iter().filter_map(|(_, d)| *d).max();
    let allowed = slowest_kubelet
        .map_or(within, |k| k + Duration::from_secs(30))
        .clamp(Duration::from_secs(90), within);
    for (node, after, tries, last) in &served {
        match after {
            Some(d) => {
                eprintln!(
                    "new revision served via {node} {} ms after it was created, {} ms after \
                     {component} was back ({tries} tries)",
                    d.as_millis(),
                    (*d + t_created.duration_since(t_up)).as_millis()
                );
                if *d > allowed {
                    problems.push(format!(
                        "'after' served via {node} {} ms after its create: more than {} ms \
                         (the slowest kubelet's {:?} + 30 s)",
                        d.as_millis(),
                        allowed.as_millis(),
                        slowest_kubelet
                    ));
                }
            }
            None => {
                eprintln!(
                    "new revision NOT served via {node} within {} s ({tries} tries), last {last:?}",
                    within.as_secs()
                );
                problems.push(format!(
                    "'after' not served via {node} within {} s: {last:?}",
                    within.as_secs()
                ));
            }
        }
    }
    match assigned.await.expect("the subset measurement ends") {
        Some(d) => eprintln!(
            "the subsetter assigned 'after' {} ms after it was created",
            d.as_millis()
        ),
        None => problems.push("'after' got no subset within 90 s".into()),
    }
    for (node, watches) in watches_resumed(&env.client, start_at, back_at).await {
        eprintln!(
            "activator on {node}: watches receiving events again after {component} answered \
             /readyz (the script's poll; negative: before it): {}",
            if watches.is_empty() {
                "none logged (no watch failed, or none re-listed)".to_string()
            } else {
                watches
                    .iter()
                    .map(|(w, s)| format!("{w} {s:+.2} s"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let samples = loops.stop().await;
    eprintln!(
        "{} warm requests in all ({sent_during} by the end of the outage); by phase (when sent):\n{}",
        samples.len(),
        tally(
            &samples,
            "before",
            &[
                ("stopping", t_stop),
                ("down", t_down),
                ("starting", t_start),
                ("after", t_up),
            ]
        )
    );
    // Every warm revision through every activator: "unseen" through the two that never
    // looked it up is answered from the directory (the subsetter's caches).
    for (what, label) in [
        ("warm by headers", "warm by headers"),
        (
            "warm by Host (every activator looked it up before)",
            "warm by Host",
        ),
        (
            "unseen by headers (only its member had served it)",
            "unseen by headers",
        ),
        (
            "unseen by Host (only its member had looked it up)",
            "unseen by Host",
        ),
    ] {
        let (n, failed) = failures_of(&samples, label);
        eprintln!("{what}: {failed} of {n} failed");
        if failed > 0 || n == 0 {
            problems.push(format!("{what}: {failed} of {n} failed"));
        }
    }
    let directory: Vec<(String, Option<u64>)> = join_all(acts.iter().map(|(node, a)| async move {
        (
            node.clone(),
            metric_total(*a, "activator_directory_answered_total").await,
        )
    }))
    .await;
    eprintln!("lookups the directory answered, by activator: {directory:?}");
    // An outage is no node's failure: the subsetter holds the Nodes the controller-manager
    // marks NotReady afterwards (after an etcd outage its watches stay open: its `/readyz`
    // probe sees it) and does not rebalance meanwhile. Asserted: no member replaced as lost.
    // The members are printed, not asserted: the rebalancer may move one before the outage
    // (the three revisions may start on one node); what a move would cost is in the
    // failures above.
    let lost1 = lost_replacements(&env.client).await;
    eprintln!(
        "members the subsetters replaced as lost: before the outage {lost0:?}, after {lost1:?}"
    );
    match (lost0, lost1) {
        (Some(a), Some(b)) if b > a => problems.push(format!(
            "{} members replaced as lost across the {component} outage (no node failed)",
            b - a
        )),
        (Some(_), Some(_)) => {}
        // A replica restarted (its counters from 0) or none answered: not comparable.
        other => eprintln!("lost replacements not comparable: {other:?}"),
    }
    for (rev, before) in [("warm", &warm), ("unseen", &unseen), ("cold", &cold)] {
        let now = env.members(rev, |_| true).await;
        let nodes = |m: &[ActivatorMember]| m.iter().map(|m| m.node.clone()).collect::<Vec<_>>();
        eprintln!(
            "{rev}'s members before the outage {:?}, after {:?}",
            nodes(before),
            nodes(&now)
        );
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_stopped_for_60s_keeps_warm_traffic_through_every_activator() {
    control_plane_outage(
        "the_api_server_stopped_for_60s_keeps_warm_traffic",
        "api",
        Duration::from_secs(60),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stopped_for_30s_keeps_warm_traffic() {
    control_plane_outage(
        "etcd_stopped_for_30s_keeps_warm_traffic",
        "etcd",
        Duration::from_secs(30),
    )
    .await;
}

/// Creates a bare pod bound to `node` and waits until its kubelet writes its first status
/// (the `Initialized` condition): how long the kubelet's pod watch took to see it. The pod is
/// deleted after.
async fn kubelet_sees_a_pod(
    client: &Client,
    ns: &str,
    node: &str,
    limit: Duration,
) -> Option<Duration> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let name = format!("kubelet-probe-{}", node_index(node));
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": APP_IMAGE, "imagePullPolicy": "IfNotPresent"}],
        },
    }))
    .ok()?;
    let t = std::time::Instant::now();
    let mut created = false;
    while !created && t.elapsed() < limit {
        created = pods.create(&PostParams::default(), &pod).await.is_ok();
        if !created {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let t = std::time::Instant::now();
    let seen = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.conditions.as_ref().is_some_and(|c| !c.is_empty()))
    };
    let got = tokio::time::timeout(limit, await_condition(pods.clone(), &name, seen))
        .await
        .ok()
        .and_then(|r| r.ok())
        .map(|_| t.elapsed());
    let _ = pods
        .delete(&name, &DeleteParams::default().grace_period(0))
        .await;
    got
}

fn node_index(node: &str) -> String {
    node.trim_start_matches(|c: char| !c.is_ascii_digit())
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_node_under_load_fails_at_most_what_was_in_flight_on_it() {
    let Some(env) = env("a_blackholed_node_under_load").await else {
        return;
    };
    let members = env
        .revision("dark", 3, |s| s["activators"] = 3.into())
        .await;
    // Every entry sends the revision's requests to its primary first.
    let ranked = loadtest::demo::member_nodes(&env.client, &env.ns, "dark")
        .await
        .unwrap();
    let primary = ranked[0].clone();
    let entries: Vec<&ActivatorMember> = members.iter().filter(|m| m.node != primary).collect();
    assert_eq!(entries.len(), 2, "{members:?}");
    let w = env.get(entries[0], "dark", APP).await;
    assert!(w.ok(), "{w:?}");
    let pods = env.pods("dark").await;
    let on: Vec<String> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    eprintln!("dark: primary {primary}, ranked {ranked:?}; warm, pods on {on:?}");
    // Two clients per entry, by headers, one request at a time each: at most 4 in flight.
    let mut targets = Vec::new();
    for m in &entries {
        for k in 0..2 {
            targets.push(Target {
                label: format!("via {} #{k}", m.node),
                node: m.node.clone(),
                addr: addr(m),
                rev: "dark".into(),
                by: By::Headers,
            });
        }
    }
    let concurrency = targets.len();
    let loops = Loops::start(&env, &targets, Duration::from_millis(5));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t_bh = std::time::Instant::now();
    let idx = node_index(&primary);
    let (fault, took) = Fault::inject(
        "node",
        &["blackhole", idx.as_str()],
        &["restore", idx.as_str()],
    )
    .await;
    eprintln!(
        "{primary} blackholed and its kubelet stopped ({} ms)",
        took.as_millis()
    );
    node_ready(&env.client, &primary, false).await;
    let t_notready = std::time::Instant::now();
    let p = primary.clone();
    let repaired = env
        .members("dark", move |m| {
            !m.is_empty() && m.iter().all(|m| m.node != p)
        })
        .await;
    let t_repair = std::time::Instant::now();
    eprintln!(
        "{primary}: NotReady after {} ms, out of the subset after {} ms (members {:?})",
        t_notready.duration_since(t_bh).as_millis(),
        t_repair.duration_since(t_bh).as_millis(),
        repaired.iter().map(|m| &m.node).collect::<Vec<_>>()
    );
    let until = (t_bh + Duration::from_secs(60)).max(t_repair + Duration::from_secs(10));
    tokio::time::sleep(until.saturating_duration_since(std::time::Instant::now())).await;
    let samples = loops.stop().await;
    let took = fault.undo().await;
    node_ready(&env.client, &primary, true).await;
    eprintln!("{primary} restored ({} ms)", took.as_millis());

    let in_flight = samples
        .iter()
        .filter(|(_, s)| s.sent <= t_bh && s.sent + s.latency > t_bh)
        .count();
    let failed: Vec<&Sample> = samples.iter().map(|(_, s)| s).filter(|s| !s.ok()).collect();
    let first_failure = failed.iter().map(|s| s.sent + s.latency).min();
    let late: Vec<&&Sample> = match first_failure {
        Some(f) => failed
            .iter()
            .filter(|s| s.sent >= f + Duration::from_secs(2))
            .collect(),
        None => vec![],
    };
    let after_bh_2s = failed
        .iter()
        .filter(|s| s.sent >= t_bh + Duration::from_secs(2))
        .count();
    let slow_after = samples
        .iter()
        .filter(|(_, s)| s.sent > t_bh && s.ok() && s.latency >= Duration::from_secs(2))
        .count();
    eprintln!(
        "{} requests, {} failed (in flight at the blackhole: {in_flight}; concurrency \
         {concurrency}); first failure {} ms after the blackhole; failed among those sent \
         2 s after it: {}, 2 s after the blackhole: {after_bh_2s}; answered but slower than 2 s \
         after the blackhole: {slow_after}\nby phase (when sent):\n{}",
        samples.len(),
        failed.len(),
        first_failure.map_or("-".into(), |f| f
            .duration_since(t_bh)
            .as_millis()
            .to_string()),
        late.len(),
        tally(
            &samples,
            "before",
            &[
                ("blackholed", t_bh),
                ("NotReady", t_notready),
                ("repaired", t_repair),
            ]
        )
    );
    for s in &failed {
        let at = s.sent.saturating_duration_since(t_bh).as_millis() as i64
            - t_bh.saturating_duration_since(s.sent).as_millis() as i64;
        eprintln!(
            "failed: sent {at} ms after the blackhole, after {} ms: {} {:?}",
            s.latency.as_millis(),
            s.status,
            s.error
        );
    }
    assert!(
        failed.len() <= concurrency,
        "{} failed, more than the {concurrency} that can be in flight",
        failed.len()
    );
    assert!(
        late.is_empty(),
        "{} failed after the first failure + 2 s",
        late.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_containerd_killed_and_restarted_keeps_warm_traffic_elsewhere() {
    let Some(env) = env("a_nodes_containerd_killed").await else {
        return;
    };
    let acts = env.activators().await;
    // "here" is warm on the node whose containerd is killed, "elsewhere" on another node: each
    // kept on its node by a nodeSelector (the subsetter's eligibility follows it).
    let nodes: Vec<&String> = acts.keys().collect();
    let victim = nodes[rand::random::<u32>() as usize % nodes.len()].clone();
    let other = nodes.iter().find(|n| ***n != victim).unwrap().to_string();
    let on = |node: String| {
        move |s: &mut serde_json::Value| {
            s["activators"] = 1.into();
            s["template"]["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
        }
    };
    let here = env.revision("here", 1, on(victim.clone())).await;
    assert_eq!(here[0].node, victim);
    let elsewhere = "elsewhere".to_string();
    let m = env.revision(&elsewhere, 1, on(other.clone())).await;
    assert_eq!(m[0].node, other);
    let mut targets = Vec::new();
    for (node, a) in &acts {
        for rev in ["here", elsewhere.as_str()] {
            let s = env.driver.get_named((node, *a), &env.ns, rev, APP).await;
            assert!(s.ok(), "{rev} via {node}: {s:?}");
            let tag = if rev == "here" {
                "warm on the killed node"
            } else {
                "warm on another node"
            };
            targets.push(Target {
                label: format!("{tag} via {node}"),
                node: node.clone(),
                addr: *a,
                rev: rev.into(),
                by: By::Headers,
            });
        }
    }
    let loops = Loops::start(&env, &targets, Duration::from_millis(50));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t_kill = std::time::Instant::now();
    let idx = node_index(&victim);
    let (fault, _) = Fault::inject(
        "node",
        &["containerd-kill", idx.as_str()],
        &["containerd-start", idx.as_str()],
    )
    .await;
    eprintln!("{victim}'s containerd killed");
    tokio::time::sleep(Duration::from_secs(30)).await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    let ready = nodes
        .get(&victim)
        .await
        .ok()
        .and_then(|n| n.status?.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"))
        .map(|c| format!("{} ({:?})", c.status, c.message));
    eprintln!("{victim} 30 s without containerd: Ready {ready:?}");
    let t_start = std::time::Instant::now();
    let took = fault.undo().await;
    eprintln!(
        "{victim}'s containerd started again ({} ms)",
        took.as_millis()
    );
    // The node's activator Ready again (its node agent talks to containerd), then a cold
    // start on that node.
    wait_daemonset_ready(&env.client).await;
    eprintln!(
        "every activator Ready {} ms after containerd was started again",
        t_start.elapsed().as_millis()
    );
    let name = "fresh".to_string();
    let m = env.revision(&name, 1, on(victim.clone())).await[0].clone();
    let f = env.get(&m, &name, APP).await;
    eprintln!(
        "a cold start on {victim} after the restart: {} in {} ms",
        f.status,
        f.latency.as_millis()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let samples = loops.stop().await;
    eprintln!(
        "{} requests; by phase (when sent):\n{}",
        samples.len(),
        tally(
            &samples,
            "before",
            &[("killed", t_kill), ("restarted", t_start),]
        )
    );
    // Not asserted: the kubelet reports the node NotReady ("container runtime is down") and
    // the subsetter moves that revision's member away, though its container keeps running.
    let (n, failed) = failures_of(&samples, "on the killed node");
    eprintln!("warm on the killed node (not asserted): {failed} of {n} failed");
    let (n, failed) = failures_of(&samples, "on another node");
    assert!(
        n > 0 && failed == 0,
        "warm on another node: {failed} of {n} failed"
    );
    assert!(f.ok(), "a cold start after the restart: {f:?}");
}

/// The image-pull test's app: the test app plus a Java runtime from Debian (~190 MB in four
/// layers; hack/images/build testapp-big), only in the registry, never imported.
const BIG_IMAGE: &str = "10.88.255.1:5000/local-activator/testapp-big:dev";

/// Whether node `index`'s containerd holds `image` (hack/cluster/node image-has).
fn node_has_image(index: &str, image: &str) -> bool {
    std::process::Command::new(repo().join("hack/cluster/node"))
        .args(["image-has", index, image])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The kubelet's `Pulled` event of the pod's container: "already present on machine", or
/// "Successfully pulled image ... in 5.461s ...". Awaited (the kubelet sends its events in
/// batches).
async fn pulled_event(client: &Client, ns: &str, pod: &str) -> String {
    use k8s_openapi::api::core::v1::Event;
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().fields(&format!("involvedObject.name={pod},reason=Pulled"));
    let found = async {
        loop {
            if let Some(e) = api
                .list(&lp)
                .await
                .ok()
                .and_then(|l| l.items.into_iter().next())
            {
                return e.message.unwrap_or_default();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(LIMIT, found)
        .await
        .unwrap_or_else(|_| panic!("a Pulled event for {pod}"))
}

/// Images pulled ahead: a new Revision whose image is on no node. Its members pull the image before any
/// request (the kubelet then finds it present), non-members do not pull it, and the first
/// request is a cold start without a pull.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_pull_a_new_revisions_image_before_its_first_request() {
    let Some(env) = env("members_pull_a_new_revisions_image").await else {
        return;
    };
    let nodes: Vec<String> = env.activators().await.into_keys().collect();
    assert!(nodes.len() >= 3, "three nodes: {nodes:?}");
    for n in &nodes {
        script("node", &["image-rm", &node_index(n), BIG_IMAGE]);
        assert!(
            !node_has_image(&node_index(n), BIG_IMAGE),
            "{n} still has it"
        );
    }
    let members = env
        .revision("big", 2, |s| {
            s["activators"] = 2.into();
            s["template"]["spec"]["containers"][0]["image"] = BIG_IMAGE.into();
        })
        .await;
    let t0 = Instant::now();
    // No request yet: each member's node gets the image by itself.
    for m in &members {
        let index = node_index(&m.node);
        let pulled = async {
            while !node_has_image(&index, BIG_IMAGE) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        tokio::time::timeout(LIMIT, pulled)
            .await
            .unwrap_or_else(|_| panic!("{} pulls {BIG_IMAGE} ahead of any request", m.node));
        eprintln!(
            "{}: {BIG_IMAGE} present {} ms after the subset was written",
            m.node,
            t0.elapsed().as_millis()
        );
    }
    // Only the members pull: N nodes, not every node.
    for n in nodes
        .iter()
        .filter(|n| !members.iter().any(|m| m.node == **n))
    {
        assert!(
            !node_has_image(&node_index(n), BIG_IMAGE),
            "{n} is not a member of big's subset and pulled its image"
        );
    }
    let cold = env.get(&members[0], "big", APP).await;
    assert!(cold.ok() && cold.cold, "{cold:?}");
    let pod = cold.pod.clone().expect("the app names its pod");
    let pulled = pulled_event(&env.client, &env.ns, &pod).await;
    assert!(
        pulled.contains("already present"),
        "the kubelet found the image on the node: {pulled}"
    );
    eprintln!(
        "first request after the pull ahead, on {}: request -> answer {} ms, phases {:?}",
        members[0].node,
        cold.latency.as_millis(),
        cold.phases
    );
}

/// A deploy under load, a 10/90 split and a one-edit rollback on the real cluster (the
/// `deploy` scenario on the installed product, its test app listening `listen_ms` after its
/// container starts): nothing fails, no request waits for a cold start, every activator
/// follows each move, the split holds within ±7 points over 2,000 requests.
async fn deploy_split_rollback(test: &str, listen_ms: Option<u64>) {
    let Some(env) = env(test).await else { return };
    let knobs = loadtest::scenario::Knobs {
        scenario: Some(loadtest::scenario::Scenario::Deploy),
        clients: Some(4),
        before_secs: Some(3.0),
        after_secs: Some(2.0),
        settle_secs: Some(2.0),
        split_requests: Some(2000),
        ..Default::default()
    };
    let ctx = loadtest::scenario::Ctx {
        knobs,
        target: loadtest::scenario::Target::Cluster(env.client.clone()),
        cancel: tokio_util::sync::CancellationToken::new(),
        progress: indicatif::ProgressBar::hidden(),
    };
    let opts = loadtest::installed::Options {
        image: APP_IMAGE.into(),
        pull_policy: "IfNotPresent",
        listen_delay_ms: listen_ms,
        ..Default::default()
    };
    let report = tokio::time::timeout(
        LIMIT * 4,
        loadtest::scenarios::deploy::run_installed(&ctx, &env.client, &opts),
    )
    .await
    .expect("the deploy scenario ends")
    .expect("the deploy scenario runs");
    let (f, text) = (&report.figures, &report.text);
    eprintln!("{text}");
    assert_eq!(f["failed"].as_u64(), Some(0), "{text}");
    for p in f["phases"].as_array().expect("phases") {
        assert!(p["requests"].as_u64().unwrap_or(0) > 0, "{p}\n{text}");
        assert_eq!(p["failed"].as_u64(), Some(0), "{p}\n{text}");
        assert_eq!(p["waited_for_pod_start"].as_u64(), Some(0), "{p}\n{text}");
    }
    let moves = f["moves"].as_array().expect("moves");
    for m in moves {
        assert_eq!(m["moved_everywhere"], true, "{m}\n{text}");
    }
    let split = &f["split"];
    assert_eq!(split["followed_everywhere"], true, "{text}");
    for share in split["shares"].as_array().expect("shares") {
        assert!(
            share["off_by_points"].as_f64().unwrap_or(100.0).abs() <= 7.0,
            "{share}\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_under_load_a_split_and_a_rollback_wait_for_no_cold_start() {
    deploy_split_rollback("deploy_quick_app", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_of_an_app_that_listens_after_2s_waits_for_no_cold_start() {
    deploy_split_rollback("deploy_slow_app", Some(2000)).await;
}
