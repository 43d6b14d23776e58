//! The node lifecycle controller's health part (kube-controller-manager's job in a real
//! cluster, which kubesim has to play itself): a node whose Lease (and Ready heartbeat) has
//! not changed for `grace` is marked Unknown, tainted unreachable, and its pods NotReady.
//! Its NoSchedule tainting pass keeps the condition taints in step with the Ready condition:
//! none while Ready, `not-ready` while not Ready (every new Node is admitted with it), and
//! `unreachable` while Unknown.
//!
//! Like the real controller it measures staleness on its own clock, from when it last saw
//! the renew time change, so clock skew between kubelet and controller does not matter.
//! Pods are not evicted (the real controller's taint manager would delete them after their
//! toleration, 300 s by default).

use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::objects::{LEASE_NAMESPACE, now};
use super::retry::is_code;

pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
pub const UNKNOWN_REASON: &str = "NodeStatusUnknown";
pub const UNKNOWN_MESSAGE: &str = "Kubelet stopped posting node status.";
/// The conditions the kubelet owns, all turned Unknown together.
const KUBELET_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// Runs until dropped (or [`shutdown`](Self::shutdown)).
pub struct NodeLifecycleController {
    task: JoinHandle<()>,
}

impl NodeLifecycleController {
    /// `grace`: how long a node may go without a lease renewal (the real default,
    /// `--node-monitor-grace-period`, is 40 s; 50 s from 1.32).
    pub fn start(client: Client, grace: Duration) -> Self {
        NodeLifecycleController {
            task: tokio::spawn(run(client, grace)),
        }
    }

    pub fn shutdown(self) {}
}

impl Drop for NodeLifecycleController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the controller last saw of a node's heartbeats, and when it saw them change.
struct Observed {
    renew: Option<Timestamp>,
    heartbeat: Option<Timestamp>,
    changed_at: Instant,
}

async fn run(client: Client, grace: Duration) {
    let (nodes, node_writer) = reflector::store::<Node>();
    let (leases, lease_writer) = reflector::store::<Lease>();
    let node_api: Api<Node> = Api::all(client.clone());
    let lease_api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    // A failing watch leaves its store as it was (the back-off reaches 30 s): said, since a
    // stale lease store marks live nodes Unknown.
    let node_stream = watcher::watcher(node_api.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .for_each(|e| async move { log_watch("Node", e) });
    let lease_stream = watcher::watcher(lease_api, watcher::Config::default())
        .default_backoff()
        .reflect(lease_writer)
        .for_each(|e| async move { log_watch("Lease", e) });
    let checks = check_loop(ApiWrites { client }, nodes, leases, grace);
    let (mut a, mut b, mut c) = (pin!(node_stream), pin!(lease_stream), pin!(checks));
    tokio::select! {
        _ = &mut a => {}
        _ = &mut b => {}
        _ = &mut c => {}
    }
}

fn log_watch<K>(what: &str, event: Result<watcher::Event<K>, watcher::Error>) {
    match event {
        Err(e) => tracing::warn!(error = %e, "node lifecycle controller: {what} watch failed"),
        Ok(watcher::Event::Init) => {
            tracing::info!("node lifecycle controller: {what} watch lists again")
        }
        Ok(_) => {}
    }
}

/// The controller's writes, apart from its decisions so that these can be tested on tokio's
/// paused clock without an API server. Each answers whether it wrote (false: a conflict or
/// the object is gone, to be looked at again by a later pass).
pub(crate) trait NodeWrites: Clone + Send + Sync + 'static {
    fn mark_unknown(&self, node: Arc<Node>) -> impl Future<Output = WriteResult> + Send;
    fn sync_taints(
        &self,
        node: Arc<Node>,
        ready: String,
    ) -> impl Future<Output = WriteResult> + Send;
    fn mark_pods_not_ready(&self, node: String) -> impl Future<Output = WriteResult> + Send;
}

pub(crate) type WriteResult = Result<bool, kube::Error>;

/// [`NodeWrites`] to the API server.
#[derive(Clone)]
struct ApiWrites {
    client: Client,
}

impl NodeWrites for ApiWrites {
    async fn mark_unknown(&self, node: Arc<Node>) -> WriteResult {
        mark_unknown(&self.client, &node).await
    }
    async fn sync_taints(&self, node: Arc<Node>, ready: String) -> WriteResult {
        sync_condition_taints(&self.client, &node, &ready).await
    }
    async fn mark_pods_not_ready(&self, node: String) -> WriteResult {
        mark_pods_not_ready(&self.client, &node)
            .await
            .map(|()| true)
    }
}

/// Nodes written at once, per kind of write: kube-controller-manager's node lifecycle
/// controller updates node health with 8 workers and runs its NoSchedule tainting pass with
/// 8 more (`nodeUpdateWorkerSize`).
const UPDATE_WORKERS: usize = 8;

/// A health write: the monitor found the node stale, or its pods still to be marked.
#[derive(Debug, Clone, PartialEq)]
enum HealthJob {
    /// Conditions Unknown and the unreachable taints, if the node is still as the monitor
    /// saw it when it found it stale (same lease renewal, same heartbeat).
    MarkUnknown {
        renew: Option<Timestamp>,
        heartbeat: Option<Timestamp>,
    },
    /// Ready=False on its pods.
    MarkPods,
}

/// What a write did, for the monitor's bookkeeping.
struct Done {
    name: String,
    /// A taint write (else a health write).
    taints: bool,
    /// resourceVersion of the Node copy a successful Node write started from.
    written_from: Option<String>,
    /// Marked Unknown while it was Ready: its pods are marked next.
    marked_unknown_from_ready: bool,
    pods_marked: bool,
}

/// The health monitor and its two work queues. Every `period` it looks at every node in the
/// stores and queues the writes it finds needed; it never waits for them. Writes run at most
/// [`UPDATE_WORKERS`] at a time per queue, each on the freshest copy in the store.
///
/// Why apart: when a pass waited for its own writes, one pass with thousands of them (every
/// new Node's admission taint at start, 5,000 writes queued with the kubelets' leases in the
/// storage model) lasted 40–85 s at 5,000 nodes, and no node's staleness was looked at
/// meanwhile: a node killed during that pass was first seen without renewals when it ended,
/// and marked a grace period after that (~95 s after the kill where 40 s was due). Health
/// writes have a queue of their own so that they never wait behind thousands of taint
/// writes either. The real controller has the same split: `monitorNodeHealth` every
/// `--node-monitor-period`, the tainting pass on its own work queue.
struct Monitor {
    grace: Duration,
    observed: HashMap<String, Observed>,
    /// Nodes whose pods still have to be marked NotReady (retried until it succeeds).
    pods_to_mark: HashSet<String>,
    health: VecDeque<(String, HealthJob)>,
    taints: VecDeque<String>,
    /// Nodes with a health write (resp. taint write) queued or running: queued once.
    health_queued: HashSet<String>,
    taints_queued: HashSet<String>,
    /// resourceVersion of the copy each node's last successful write started from, while the
    /// store still holds that copy: a watch that lags behind the writes would otherwise have
    /// every pass write the same change again on a stale resourceVersion (a conflict each).
    written_from: HashMap<String, String>,
}

impl Monitor {
    fn new(grace: Duration) -> Self {
        Monitor {
            grace,
            observed: HashMap::new(),
            pods_to_mark: HashSet::new(),
            health: VecDeque::new(),
            taints: VecDeque::new(),
            health_queued: HashSet::new(),
            taints_queued: HashSet::new(),
            written_from: HashMap::new(),
        }
    }

    /// One look at every node: what it last renewed, whether it is stale, whether its taints
    /// follow its Ready condition. Queues what needs writing. Synchronous and quick (~20 ms
    /// at 5,000 nodes): it is what measures staleness, so nothing may hold it up.
    fn pass(&mut self, now: Instant, current: &[Arc<Node>], leases: &Store<Lease>) {
        let names: HashSet<&str> = current
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        self.observed
            .retain(|name, _| names.contains(name.as_str()));
        self.pods_to_mark
            .retain(|name| names.contains(name.as_str()));
        for node in current {
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            let renew = lease_renew(leases, name);
            let ready = condition(node, "Ready");
            let heartbeat = ready
                .and_then(|c| c.last_heartbeat_time.as_ref())
                .map(|t| t.0);
            let ready_status = ready.map(|c| c.status.as_str()).unwrap_or("Unknown");
            let seen = self.observed.entry(name.to_string()).or_insert(Observed {
                renew,
                heartbeat,
                changed_at: now,
            });
            if seen.renew != renew || seen.heartbeat != heartbeat {
                *seen = Observed {
                    renew,
                    heartbeat,
                    changed_at: now,
                };
            }
            let stale = now.duration_since(seen.changed_at) > self.grace;
            let rv = node.metadata.resource_version.as_deref();
            // The store still holds the copy this controller last wrote from: the write is
            // not seen yet, nothing to decide on this copy.
            let written = match (self.written_from.get(name), rv) {
                (Some(from), Some(rv)) if from == rv => true,
                (Some(_), _) => {
                    self.written_from.remove(name);
                    false
                }
                _ => false,
            };

            // A node that never posted a Ready condition goes Unknown too ("Kubelet never
            // posted node status" on a real cluster).
            if stale && (ready.is_none() || ready_status != "Unknown") {
                if !written && self.health_queued.insert(name.to_string()) {
                    tracing::info!(node = %name, "node stopped posting status; marking it Unknown");
                    self.health.push_back((
                        name.to_string(),
                        HealthJob::MarkUnknown { renew, heartbeat },
                    ));
                }
                continue;
            }
            if ready_status == "True" {
                self.pods_to_mark.remove(name);
            }
            // A node that never reported keeps its admission taint until it is stale.
            if !written
                && ready.is_some()
                && condition_taints(node) != wanted_condition_taints(ready_status)
                && self.taints_queued.insert(name.to_string())
            {
                self.taints.push_back(name.to_string());
            }
            if self.pods_to_mark.contains(name)
                && ready_status != "True"
                && self.health_queued.insert(name.to_string())
            {
                self.health
                    .push_back((name.to_string(), HealthJob::MarkPods));
            }
        }
    }

    fn done(&mut self, d: Done) {
        if d.taints {
            self.taints_queued.remove(&d.name);
        } else {
            self.health_queued.remove(&d.name);
        }
        if let Some(rv) = d.written_from {
            self.written_from.insert(d.name.clone(), rv);
        }
        if d.marked_unknown_from_ready {
            self.pods_to_mark.insert(d.name.clone());
        }
        if d.pods_marked {
            self.pods_to_mark.remove(&d.name);
        }
    }
}

fn lease_renew(leases: &Store<Lease>, node: &str) -> Option<Timestamp> {
    leases
        .get(&ObjectRef::new(node).within(LEASE_NAMESPACE))
        .and_then(|l| {
            l.spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0)
        })
}

async fn check_loop<W: NodeWrites>(
    writes: W,
    nodes: Store<Node>,
    leases: Store<Lease>,
    grace: Duration,
) {
    if nodes.wait_until_ready().await.is_err() || leases.wait_until_ready().await.is_err() {
        return;
    }
    // Taints follow readiness within a second or so (the real tainting pass is event-driven).
    let period = (grace / 8).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut ticker = tokio::time::interval(period);
    // A late pass is not made up for with a burst of passes.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut monitor = Monitor::new(grace);
    let mut health_running = FuturesUnordered::new();
    let mut taints_running = FuturesUnordered::new();
    loop {
        tokio::select! {
            _ = ticker.tick() => monitor.pass(Instant::now(), &nodes.state(), &leases),
            Some(d) = health_running.next() => monitor.done(d),
            Some(d) = taints_running.next() => monitor.done(d),
        }
        while health_running.len() < UPDATE_WORKERS
            && let Some((name, job)) = monitor.health.pop_front()
        {
            health_running.push(health_write(
                writes.clone(),
                nodes.clone(),
                leases.clone(),
                name,
                job,
            ));
        }
        while taints_running.len() < UPDATE_WORKERS
            && let Some(name) = monitor.taints.pop_front()
        {
            taints_running.push(taint_write(writes.clone(), nodes.clone(), name));
        }
    }
}

fn node_in(nodes: &Store<Node>, name: &str) -> Option<Arc<Node>> {
    nodes.get(&ObjectRef::new(name))
}

async fn health_write<W: NodeWrites>(
    writes: W,
    nodes: Store<Node>,
    leases: Store<Lease>,
    name: String,
    job: HealthJob,
) -> Done {
    let mut done = Done {
        name,
        taints: false,
        written_from: None,
        marked_unknown_from_ready: false,
        pods_marked: false,
    };
    let name = done.name.as_str();
    match job {
        HealthJob::MarkUnknown { renew, heartbeat } => {
            // The freshest copy: queued for a while, the node may have reported meanwhile.
            let Some(node) = node_in(&nodes, name) else {
                return done;
            };
            let ready = condition(&node, "Ready");
            let still_silent = lease_renew(&leases, name) == renew
                && ready
                    .and_then(|c| c.last_heartbeat_time.as_ref())
                    .map(|t| t.0)
                    == heartbeat;
            let status = ready.map(|c| c.status.clone());
            if !still_silent {
                tracing::info!(node = %name, "node reported before it was marked Unknown; left as it is");
                return done;
            }
            if status.as_deref() == Some("Unknown") {
                return done;
            }
            let rv = node.metadata.resource_version.clone();
            match writes.mark_unknown(node).await {
                Ok(true) => {
                    done.written_from = rv;
                    done.marked_unknown_from_ready = status.as_deref() == Some("True");
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(node = %name, error = %e, "could not mark node Unknown"),
            }
        }
        HealthJob::MarkPods => match writes.mark_pods_not_ready(name.to_string()).await {
            Ok(marked) => done.pods_marked = marked,
            Err(e) => tracing::warn!(node = %name, error = %e, "could not mark pods NotReady"),
        },
    }
    done
}

/// Brings a node's condition taints in line with its Ready condition, as the store has it
/// when the write starts (not when it was queued).
async fn taint_write<W: NodeWrites>(writes: W, nodes: Store<Node>, name: String) -> Done {
    let mut done = Done {
        name,
        taints: true,
        written_from: None,
        marked_unknown_from_ready: false,
        pods_marked: false,
    };
    let Some(node) = node_in(&nodes, &done.name) else {
        return done;
    };
    let Some(ready) = condition(&node, "Ready").map(|c| c.status.clone()) else {
        return done;
    };
    if condition_taints(&node) == wanted_condition_taints(&ready) {
        return done;
    }
    let rv = node.metadata.resource_version.clone();
    match writes.sync_taints(node, ready).await {
        Ok(true) => done.written_from = rv,
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(node = %done.name, error = %e, "could not update condition taints")
        }
    }
    done
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// The node's taints that follow its Ready condition, as (key, effect), sorted.
fn condition_taints(node: &Node) -> Vec<(String, String)> {
    let mut t: Vec<(String, String)> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.key == UNREACHABLE_TAINT || t.key == NOT_READY_TAINT)
        .map(|t| (t.key.clone(), t.effect.clone()))
        .collect();
    t.sort();
    t
}

/// What the real controller keeps on a node whose Ready condition is `ready`: nothing when
/// True; both `not-ready` taints when False; both `unreachable` taints when Unknown (its
/// NoSchedule tainting pass sets the NoSchedule one, its eviction pass the NoExecute one,
/// which is what would evict pods). Sorted as [`condition_taints`] sorts.
fn wanted_condition_taints(ready: &str) -> Vec<(String, String)> {
    let mut t: Vec<(String, String)> = match ready {
        "True" => vec![],
        "False" => vec![
            (NOT_READY_TAINT.into(), "NoSchedule".into()),
            (NOT_READY_TAINT.into(), "NoExecute".into()),
        ],
        _ => vec![
            (UNREACHABLE_TAINT.into(), "NoSchedule".into()),
            (UNREACHABLE_TAINT.into(), "NoExecute".into()),
        ],
    };
    t.sort();
    t
}

/// Status Unknown on every kubelet condition (keeping the last heartbeat), then the
/// unreachable taints. Both are writes with the cached resourceVersion, so a kubelet that
/// reported in the meantime wins (409, `Ok(false)`) and the next pass looks again.
async fn mark_unknown(client: &Client, node: &Node) -> Result<bool, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut updated = node.clone();
    let t = now();
    let status = updated.status.get_or_insert_with(Default::default);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    for type_ in KUBELET_CONDITIONS {
        let unknown = |c: &mut NodeCondition| {
            c.status = "Unknown".into();
            c.reason = Some(UNKNOWN_REASON.into());
            c.message = Some(UNKNOWN_MESSAGE.into());
            c.last_transition_time = Some(t.clone());
        };
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => unknown(c),
            None => {
                let mut c = NodeCondition {
                    type_: type_.into(),
                    ..Default::default()
                };
                unknown(&mut c);
                conditions.push(c);
            }
        }
    }
    let replaced = match api
        .replace_status(&name, &PostParams::default(), &updated)
        .await
    {
        Ok(n) => n,
        Err(e) if is_code(&e, 409) || is_code(&e, 404) => return Ok(false),
        Err(e) => return Err(e),
    };
    // The status is written: the taints' conflict, if any, is for the tainting pass to mend.
    sync_condition_taints(client, &replaced, "Unknown").await?;
    Ok(true)
}

/// Replaces the node's condition taints with the ones its Ready status `ready` calls for,
/// keeping every other taint. A write with the cached resourceVersion: on a conflict
/// (`Ok(false)`) the next pass looks again.
async fn sync_condition_taints(
    client: &Client,
    node: &Node,
    ready: &str,
) -> Result<bool, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut updated = node.clone();
    let spec = updated.spec.get_or_insert_with(Default::default);
    let mut taints: Vec<Taint> = spec.taints.take().unwrap_or_default();
    taints.retain(|t| t.key != UNREACHABLE_TAINT && t.key != NOT_READY_TAINT);
    for (key, effect) in wanted_condition_taints(ready) {
        taints.push(Taint {
            time_added: (effect == "NoExecute").then(now),
            key,
            effect,
            value: None,
        });
    }
    spec.taints = (!taints.is_empty()).then_some(taints);
    match api.replace(&name, &PostParams::default(), &updated).await {
        Ok(_) => Ok(true),
        Err(e) if is_code(&e, 409) || is_code(&e, 404) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Ready=False on the node's pods, as the real controller's MarkPodsNotReady does, so
/// whoever routes by readiness stops sending traffic to a dead node.
async fn mark_pods_not_ready(client: &Client, node: &str) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::all(client.clone());
    let pods = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    for mut pod in pods.items {
        let Some(conditions) = pod.status.as_mut().and_then(|s| s.conditions.as_mut()) else {
            continue;
        };
        let Some(ready) = conditions
            .iter_mut()
            .find(|c| c.type_ == "Ready" && c.status == "True")
        else {
            continue;
        };
        ready.status = "False".into();
        ready.last_transition_time = Some(now());
        let (Some(ns), Some(name)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone())
        else {
            continue;
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        match pods
            .replace_status(&name, &PostParams::default(), &pod)
            .await
        {
            Ok(_) => {}
            Err(e) if is_code(&e, 409) || is_code(&e, 404) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
    use kube::runtime::reflector::store::Writer;

    use super::*;

    const GRACE: Duration = Duration::from_secs(40);
    /// The kubelets' lease renewal interval.
    const RENEW: Duration = Duration::from_secs(10);
    /// The monitor's period for `GRACE`.
    const PERIOD: Duration = Duration::from_secs(1);

    /// resourceVersions, shared by every object of a test.
    static RV: AtomicU64 = AtomicU64::new(1);

    fn next_rv() -> String {
        RV.fetch_add(1, Ordering::Relaxed).to_string()
    }

    /// Times as the kubelets write them: any value works as long as each renewal is new.
    fn stamp(n: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + n).unwrap()
    }

    fn node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(next_rv()),
                ..Default::default()
            },
            // Admitted with the not-ready taint, as every new Node is.
            spec: Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: NOT_READY_TAINT.into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_heartbeat_time: Some(Time(stamp(0))),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn lease(name: &str, renew: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(LEASE_NAMESPACE.into()),
                resource_version: Some(next_rv()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(name.into()),
                renew_time: Some(MicroTime(renew)),
                ..Default::default()
            }),
        }
    }

    /// `n` nodes named `node-<i>`, their Nodes and Leases (renewed at 0) in filled stores.
    #[allow(clippy::type_complexity)]
    fn cluster(
        n: usize,
    ) -> (
        Vec<String>,
        (Store<Node>, Writer<Node>),
        (Store<Lease>, Writer<Lease>),
    ) {
        let names: Vec<String> = (0..n).map(|i| format!("node-{i}")).collect();
        let (nodes, mut node_writer) = reflector::store::<Node>();
        let (leases, mut lease_writer) = reflector::store::<Lease>();
        filled(&mut node_writer, names.iter().map(|n| node(n)).collect());
        filled(
            &mut lease_writer,
            names.iter().map(|n| lease(n, stamp(0))).collect(),
        );
        (names, (nodes, node_writer), (leases, lease_writer))
    }

    fn filled<K>(writer: &mut Writer<K>, objects: Vec<K>)
    where
        K: kube::Resource + Clone,
        K::DynamicType: Eq + std::hash::Hash + Clone,
    {
        writer.apply_watcher_event(&watcher::Event::Init);
        for o in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(o));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
    }

    /// The API server and its watches, as the controller sees them: a write lands in the
    /// store (as its watch event would) when `watch_shows_writes`, after `taint_write_time`
    /// for a taint write (a storage queue full of other writes).
    #[derive(Clone)]
    struct Sim {
        nodes: Arc<Mutex<Writer<Node>>>,
        /// What the writes are checked against, as the API server checks resourceVersions.
        server: Store<Node>,
        taint_write_time: Duration,
        watch_shows_writes: bool,
        /// Each node marked Unknown, and when.
        marked: Arc<Mutex<Vec<(String, Instant)>>>,
        /// Taint writes per node.
        taint_writes: Arc<Mutex<HashMap<String, usize>>>,
    }

    impl Sim {
        fn new(nodes: Writer<Node>, taint_write_time: Duration, watch_shows_writes: bool) -> Self {
            Sim {
                server: nodes.as_reader(),
                nodes: Arc::new(Mutex::new(nodes)),
                taint_write_time,
                watch_shows_writes,
                marked: Arc::default(),
                taint_writes: Arc::default(),
            }
        }

        /// A write from a copy that is no longer the server's fails (409): without this, a
        /// taint write started before the node was marked Unknown would put Ready back.
        fn conflicts(&self, node: &Node) -> bool {
            let current = self.server.get(&ObjectRef::from_obj(node));
            current.is_some_and(|c| c.metadata.resource_version != node.metadata.resource_version)
        }

        fn show(&self, mut node: Node) {
            node.metadata.resource_version = Some(next_rv());
            if self.watch_shows_writes {
                self.nodes
                    .lock()
                    .unwrap()
                    .apply_watcher_event(&watcher::Event::Apply(node));
            }
        }

        fn marked(&self) -> Vec<(String, Instant)> {
            self.marked.lock().unwrap().clone()
        }
    }

    impl NodeWrites for Sim {
        async fn mark_unknown(&self, node: Arc<Node>) -> WriteResult {
            if self.conflicts(&node) {
                return Ok(false);
            }
            let mut node = (*node).clone();
            let name = node.metadata.name.clone().unwrap_or_default();
            for c in node
                .status
                .iter_mut()
                .flat_map(|s| s.conditions.iter_mut().flatten())
            {
                c.status = "Unknown".into();
            }
            self.marked.lock().unwrap().push((name, Instant::now()));
            self.show(node);
            Ok(true)
        }

        async fn sync_taints(&self, node: Arc<Node>, ready: String) -> WriteResult {
            tokio::time::sleep(self.taint_write_time).await;
            if self.conflicts(&node) {
                return Ok(false);
            }
            let mut node = (*node).clone();
            let name = node.metadata.name.clone().unwrap_or_default();
            *self.taint_writes.lock().unwrap().entry(name).or_default() += 1;
            let taints = wanted_condition_taints(&ready)
                .into_iter()
                .map(|(key, effect)| Taint {
                    key,
                    effect,
                    ..Default::default()
                })
                .collect::<Vec<_>>();
            node.spec.get_or_insert_with(Default::default).taints =
                (!taints.is_empty()).then_some(taints);
            self.show(node);
            Ok(true)
        }

        async fn mark_pods_not_ready(&self, _node: String) -> WriteResult {
            Ok(true)
        }
    }

    /// Kubelets renewing every node's lease each `RENEW`, spread over the interval, except
    /// `dead`'s from `dies_at` on. Returns when `dead` renewed last.
    async fn kubelets(
        mut leases: Writer<Lease>,
        names: Vec<String>,
        dead: String,
        dies_at: Instant,
        until: Instant,
    ) -> Instant {
        let mut ticker = tokio::time::interval(RENEW / names.len() as u32);
        let mut renewals = 0i64;
        let mut dead_renewed = Instant::now();
        while Instant::now() < until {
            for name in &names {
                ticker.tick().await;
                let now = Instant::now();
                if *name == dead && now >= dies_at {
                    continue;
                }
                renewals += 1;
                leases.apply_watcher_event(&watcher::Event::Apply(lease(name, stamp(renewals))));
                if *name == dead {
                    dead_renewed = now;
                }
            }
        }
        dead_renewed
    }

    fn has_condition_taints(node: &Node, ready: &str) -> bool {
        condition_taints(node) == wanted_condition_taints(ready)
    }

    /// At start every new Node's admission taint is to be lifted, thousands of writes behind
    /// other writes in a big cluster. Staleness is still looked at every period meanwhile: a
    /// node that dies then is marked within the grace period and a pass of its last renewal,
    /// and no node that keeps renewing is marked. (When a pass waited for its writes, the
    /// dead node was marked a grace period after the tainting pass ended: here at ~280 s.)
    #[tokio::test(start_paused = true)]
    async fn a_long_tainting_pass_holds_up_no_health_check() {
        let (names, (nodes, node_writer), (leases, lease_writer)) = cluster(64);
        // 64 taint writes, 8 at once, 30 s each: 240 s of tainting.
        let sim = Sim::new(node_writer, Duration::from_secs(30), true);
        let start = Instant::now();
        let dead = names[5].clone();
        let dies_at = start + Duration::from_secs(20);
        let until = start + Duration::from_secs(300);
        let controller = tokio::spawn(check_loop(sim.clone(), nodes.clone(), leases, GRACE));
        let dead_renewed =
            kubelets(lease_writer, names.clone(), dead.clone(), dies_at, until).await;
        controller.abort();

        let marked = sim.marked();
        let marked_names: Vec<&str> = marked.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(marked_names, [dead.as_str()], "only the dead node, once");
        let after = marked[0].1 - dead_renewed;
        assert!(
            after > GRACE && after <= GRACE + 2 * PERIOD,
            "marked {after:?} after its last renewal (grace {GRACE:?})"
        );
        // And the tainting went on: every live node's admission taint lifted, the dead one
        // tainted unreachable.
        for n in nodes.state() {
            let name = n.metadata.name.as_deref().unwrap();
            let ready = if name == dead { "Unknown" } else { "True" };
            assert!(
                has_condition_taints(&n, ready),
                "{name}: {:?}",
                condition_taints(&n)
            );
        }
    }

    /// Writes the watch has not shown yet are not made again: a lagging watch would otherwise
    /// have each pass rewrite them on a stale resourceVersion (a conflict each in a real API
    /// server, and as many writes queued with everyone else's).
    #[tokio::test(start_paused = true)]
    async fn a_write_is_not_repeated_while_the_watch_lags() {
        let (names, (nodes, node_writer), (leases, lease_writer)) = cluster(20);
        let sim = Sim::new(node_writer, Duration::from_millis(100), false);
        let start = Instant::now();
        let controller = tokio::spawn(check_loop(sim.clone(), nodes, leases, GRACE));
        // ~40 passes (the kubelets renew for 40 s), every node alive.
        let never = start + Duration::from_secs(3600);
        kubelets(
            lease_writer,
            names.clone(),
            String::new(),
            never,
            start + Duration::from_secs(30),
        )
        .await;
        controller.abort();
        let writes = sim.taint_writes.lock().unwrap().clone();
        assert_eq!(
            writes.len(),
            names.len(),
            "every node's taint lifted: {writes:?}"
        );
        assert!(writes.values().all(|&n| n == 1), "each once: {writes:?}");
        assert!(sim.marked().is_empty());
    }
}
