//! End to end on a real cluster: the local one of `hack/cluster` (docs/real-cluster.md) —
//! real kubelets, real containers, the product installed from `deploy/` with its own
//! ServiceAccounts and RBAC. Every request goes through a real activator pod to a real app
//! container (`hack/images/build`'s test app: `/cgi-bin/app` names its pod, `?ms=N` holds the
//! request N ms).
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
const APP_IMAGE: &str = "localhost/local-activator/testapp:dev";
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
}

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
                "imagePullPolicy": "Never",
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
    assert_eq!(
        by_probe().await,
        probe0 + 1,
        "the activator's own check made it usable"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_of_the_activators_under_load_loses_nothing_and_keeps_the_pods() {
    let Some(env) = env("a_rolling_update_of_the_activators_under_load").await else {
        return;
    };
    env.revision("rolled", 2, |s| s["activators"] = 2.into())
        .await;
    let load = Load::start(&env, "rolled", 4);
    load.wait_for(20).await;
    let before: BTreeSet<String> = env
        .pods("rolled")
        .await
        .iter()
        .filter(|p| is_ready(p))
        .map(|p| p.uid().unwrap())
        .collect();
    assert!(!before.is_empty());
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
    let left: Vec<String> = crds
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.name_any())
        .filter(|n| n.ends_with("local-activator.dev"))
        .collect();
    assert!(left.is_empty(), "CRDs left: {left:?}");
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client.clone());
    assert!(nss.get_opt(SYSTEM_NS).await.unwrap().is_none());
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(env.client.clone());
    let left: Vec<String> = roles
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|r| r.name_any())
        .filter(|n| n.contains("local-activator"))
        .collect();
    assert!(left.is_empty(), "ClusterRoles left: {left:?}");
    assert!(env.pods("gone").await.is_empty(), "app pods left");
    script("install", &[]);
    wait_daemonset_ready(&env.client).await;
}
