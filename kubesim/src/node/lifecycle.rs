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

use std::collections::{HashMap, HashSet};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use tokio::task::JoinHandle;
use tokio::time::Instant;

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
    let checks = check_loop(client, nodes, leases, grace);
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

async fn check_loop(client: Client, nodes: Store<Node>, leases: Store<Lease>, grace: Duration) {
    if nodes.wait_until_ready().await.is_err() || leases.wait_until_ready().await.is_err() {
        return;
    }
    // Taints follow readiness within a second or so (the real tainting pass is event-driven).
    let period = (grace / 8).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut ticker = tokio::time::interval(period);
    let mut observed: HashMap<String, Observed> = HashMap::new();
    // Nodes whose pods still have to be marked NotReady (retried until it succeeds).
    let mut pods_to_mark: HashSet<String> = HashSet::new();
    loop {
        ticker.tick().await;
        let now_instant = Instant::now();
        let current = nodes.state();
        let names: HashSet<&str> = current
            .iter()
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        observed.retain(|name, _| names.contains(name.as_str()));
        // What this pass decides, then written by up to `UPDATE_WORKERS` at once: one after
        // another, a pass lasts as long as all its writes (at start, every new Node's
        // admission taint, queued with the kubelets' leases).
        let mut work = Vec::new();
        for node in current.iter() {
            let Some(name) = node.metadata.name.clone() else {
                continue;
            };
            let lease = leases.get(&ObjectRef::new(&name).within(LEASE_NAMESPACE));
            let renew = lease.and_then(|l| {
                l.spec
                    .as_ref()
                    .and_then(|s| s.renew_time.as_ref())
                    .map(|t| t.0)
            });
            let ready = condition(node, "Ready");
            let heartbeat = ready
                .and_then(|c| c.last_heartbeat_time.as_ref())
                .map(|t| t.0);
            let ready_status = ready.map(|c| c.status.as_str()).unwrap_or("Unknown");
            let seen = observed.entry(name.clone()).or_insert(Observed {
                renew,
                heartbeat,
                changed_at: now_instant,
            });
            if seen.renew != renew || seen.heartbeat != heartbeat {
                *seen = Observed {
                    renew,
                    heartbeat,
                    changed_at: now_instant,
                };
            }
            let stale = now_instant.duration_since(seen.changed_at) > grace;

            // A node that never posted a Ready condition goes Unknown too ("Kubelet never
            // posted node status" on a real cluster).
            let write = if stale && (ready.is_none() || ready_status != "Unknown") {
                tracing::info!(node = %name, "node stopped posting status; marking it Unknown");
                Some(NodeWrite::MarkUnknown {
                    was_ready: ready_status == "True",
                })
            } else {
                if ready_status == "True" {
                    pods_to_mark.remove(&name);
                }
                // A node that never reported keeps its admission taint until it is stale.
                (ready.is_some() && condition_taints(node) != wanted_condition_taints(ready_status))
                    .then(|| NodeWrite::SyncTaints(ready_status.to_string()))
            };
            let mark_pods = pods_to_mark.contains(&name) && ready_status != "True";
            if write.is_some() || mark_pods {
                work.push((Arc::clone(node), write, mark_pods));
            }
        }
        let done: Vec<Written> = futures::stream::iter(work)
            .map(|(node, write, mark_pods)| run_writes(&client, node, write, mark_pods))
            .buffer_unordered(UPDATE_WORKERS)
            .collect()
            .await;
        for w in done {
            if w.marked_unknown {
                pods_to_mark.insert(w.name.clone());
            }
            if w.pods_marked {
                pods_to_mark.remove(&w.name);
            }
        }
    }
}

/// Nodes a pass writes at once: kube-controller-manager's node lifecycle controller updates
/// nodes with 8 workers (`nodeUpdateWorkerSize`).
const UPDATE_WORKERS: usize = 8;

/// What a pass writes to one Node.
enum NodeWrite {
    /// Its conditions Unknown, then the unreachable taints; `was_ready`: its pods are marked
    /// NotReady next.
    MarkUnknown { was_ready: bool },
    /// Its condition taints brought in line with its Ready status (the String).
    SyncTaints(String),
}

/// What a node's writes did.
struct Written {
    name: String,
    marked_unknown: bool,
    pods_marked: bool,
}

async fn run_writes(
    client: &Client,
    node: Arc<Node>,
    write: Option<NodeWrite>,
    mark_pods: bool,
) -> Written {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut marked_unknown = false;
    match write {
        Some(NodeWrite::MarkUnknown { was_ready }) => match mark_unknown(client, &node).await {
            Ok(()) => marked_unknown = was_ready,
            Err(e) => tracing::warn!(node = %name, error = %e, "could not mark node Unknown"),
        },
        Some(NodeWrite::SyncTaints(ready)) => {
            if let Err(e) = sync_condition_taints(client, &node, &ready).await {
                tracing::warn!(node = %name, error = %e, "could not update condition taints");
            }
        }
        None => {}
    }
    let mut pods_marked = false;
    if mark_pods {
        match mark_pods_not_ready(client, &name).await {
            Ok(()) => pods_marked = true,
            Err(e) => tracing::warn!(node = %name, error = %e, "could not mark pods NotReady"),
        }
    }
    Written {
        name,
        marked_unknown,
        pods_marked,
    }
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
/// reported in the meantime wins (409) and the next pass looks again.
async fn mark_unknown(client: &Client, node: &Node) -> Result<(), kube::Error> {
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
        Err(e) if is_code(&e, 409) || is_code(&e, 404) => return Ok(()),
        Err(e) => return Err(e),
    };
    sync_condition_taints(client, &replaced, "Unknown").await
}

/// Replaces the node's condition taints with the ones its Ready status `ready` calls for,
/// keeping every other taint. A write with the cached resourceVersion: on a conflict the
/// next pass looks again.
async fn sync_condition_taints(
    client: &Client,
    node: &Node,
    ready: &str,
) -> Result<(), kube::Error> {
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
        Ok(_) => Ok(()),
        Err(e) if is_code(&e, 409) || is_code(&e, 404) => Ok(()),
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
