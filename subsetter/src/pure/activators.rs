//! Activator discovery: which activators may be members, from pods and nodes as a real
//! cluster shows them (pure functions over the watched objects).
//!
//! An activator is a pod with the DaemonSet labels (`crds::contract::ACTIVATOR_SELECTOR`) that
//! is Ready, not being deleted, bound to a node and has a pod IP. Its node must not be known
//! NotReady: a node whose Ready condition is not True loses its activator even before the node
//! lifecycle controller marks the pod. A node that has no Node object (simulated clusters
//! without nodes) does not disqualify its pod.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crds::contract::DATA_PORT;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;

use crate::pure::eligibility::NodeFacts;

/// An activator that can be a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Activator {
    pub node: String,
    /// `ip:port` of its data port.
    pub address: String,
    pub pod: String,
    /// Its Node's labels, taints and cordon, for eligibility (`eligibility.rs`); None where
    /// the cluster has no Node object for it (which then constrains nothing). A change here
    /// is a change of the activator: the revisions it serves are planned again.
    pub facts: Option<Arc<NodeFacts>>,
}

/// The available activators by node, as reconciles read them: in node order (the map it
/// dereferences to), and hashed for the policy's look-ups (in a tree of 5,000 names a look-up
/// is a dozen string comparisons, and a plan makes one per member it considers). Both hold the
/// same activators: every change goes through [`Available::insert`] and [`Available::remove`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Available {
    by_node: BTreeMap<String, Activator>,
    hashed: foldhash::HashMap<String, Activator>,
}

impl Available {
    pub fn get(&self, node: &str) -> Option<&Activator> {
        self.hashed.get(node)
    }

    pub fn get_key_value(&self, node: &str) -> Option<(&String, &Activator)> {
        self.hashed.get_key_value(node)
    }

    pub fn contains_key(&self, node: &str) -> bool {
        self.hashed.contains_key(node)
    }

    /// `a` is the activator of `node` now; the one it replaces.
    pub fn insert(&mut self, node: String, a: Activator) -> Option<Activator> {
        self.hashed.insert(node.clone(), a.clone());
        self.by_node.insert(node, a)
    }

    pub fn remove(&mut self, node: &str) -> Option<Activator> {
        self.hashed.remove(node);
        self.by_node.remove(node)
    }
}

impl std::ops::Deref for Available {
    type Target = BTreeMap<String, Activator>;

    fn deref(&self) -> &Self::Target {
        &self.by_node
    }
}

impl From<BTreeMap<String, Activator>> for Available {
    fn from(by_node: BTreeMap<String, Activator>) -> Self {
        let hashed = by_node
            .iter()
            .map(|(n, a)| (n.clone(), a.clone()))
            .collect();
        Self { by_node, hashed }
    }
}

impl FromIterator<(String, Activator)> for Available {
    fn from_iter<I: IntoIterator<Item = (String, Activator)>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<BTreeMap<_, _>>())
    }
}

/// The activator `pod` stands for, if it is usable.
pub fn from_pod(pod: &Pod) -> Option<Activator> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let status = pod.status.as_ref()?;
    // Ready as its kubelet last said: after a control-plane outage the controller-manager
    // marks every pod unready, and a kubelet clears the mark only when its own pod watch is
    // back (up to a minute and a half later); meanwhile the activators serve, and moving
    // every subset off them would cost each revision a cold start on a node no better off.
    // A failed node is still seen by its Node's NotReady (below, `available`).
    if !crds::pod_ready::ready(pod) {
        return None;
    }
    let node = spec.node_name.clone().filter(|n| !n.is_empty())?;
    let ip = status.pod_ip.clone().filter(|ip| !ip.is_empty())?;
    let port = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("http"))
        .map(|p| p.container_port)
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(DATA_PORT);
    let address = if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    };
    Some(Activator {
        node,
        address,
        pod: pod.metadata.name.clone()?,
        facts: None,
    })
}

/// Whether `node`'s Ready condition is True.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The usable activators, one per node. `nodes` maps the known Node objects to their
/// readiness. Where a node has two usable activator pods (a DaemonSet rolling update), the
/// newest wins, since the old one is about to go (see [`Rank`]).
///
/// A full computation over every pod: the controller keeps the same answer up to date one
/// event at a time with [`ActivatorSet`]; this is what it must equal.
pub fn available<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    nodes: &HashMap<String, bool>,
) -> BTreeMap<String, Activator> {
    let mut best: BTreeMap<String, (Rank, Activator)> = BTreeMap::new();
    for pod in pods {
        let Some(a) = from_pod(pod) else { continue };
        if nodes.get(&a.node) == Some(&false) {
            continue;
        }
        let rank = Rank::of(pod);
        if best.get(&a.node).is_none_or(|(other, _)| rank > *other) {
            best.insert(a.node.clone(), (rank, a));
        }
    }
    best.into_iter().map(|(n, (_, a))| (n, a)).collect()
}

/// Which of two usable pods on one node is the activator: the newer (creationTimestamp), then
/// the greater name, then the greater namespace (so the choice never depends on the order the
/// pods are seen in).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank {
    created: Option<k8s_openapi::jiff::Timestamp>,
    name: String,
    namespace: String,
}

impl Rank {
    pub fn of(pod: &Pod) -> Self {
        Self {
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        }
    }
}

/// The share of NotReady nodes above which the set counts as [`ActivatorSet::disrupted`]:
/// kube-controller-manager's default `--unhealthy-zone-threshold`.
pub const DISRUPTED_SHARE: f64 = 0.55;

/// What the set knows of a Node object.
#[derive(Debug)]
struct NodeState {
    ready: bool,
    facts: Arc<NodeFacts>,
}

/// The usable activators (as [`available`] computes them, with each node's [`NodeFacts`]),
/// kept up to date one event at a time: a pod event recomputes that pod's node, a Node event
/// that node — O(log) and the size of the one object, where recomputing from every pod and
/// node costs O(nodes) per event (at 5,000 nodes, every Node status update). A relist
/// replaces all pods or all nodes at once when it is complete (`relist_*`). Each change returns
/// how the set changed ([`Diff`]).
///
/// It keeps what it derived from the objects, not the objects: no store of whole Pods and
/// Nodes (a real Node's status lists its images, often tens of KiB) is needed beside it.
#[derive(Debug, Default)]
pub struct ActivatorSet {
    /// Every usable activator pod, by (namespace, name): its rank and activator (no facts).
    pods: HashMap<(String, String), (Rank, Activator)>,
    /// The usable pods on each node, by rank (the last one is the node's activator).
    on_node: HashMap<String, BTreeSet<Rank>>,
    /// The Node objects seen.
    nodes: HashMap<String, NodeState>,
    available: BTreeMap<String, Activator>,
    /// What a pod relist in progress has shown so far.
    relisted_pods: Option<HashMap<(String, String), (Rank, Activator)>>,
    /// What a Node relist in progress has shown so far.
    relisted_nodes: Option<HashMap<String, NodeState>>,
    /// Every activator pod bound to a node, usable or not, by (namespace, name): its node and
    /// whether it is Ready. Only [`ActivatorSet::disrupted`] reads it: a pod marked unready
    /// by the controller-manager may be seen before its Node's NotReady.
    bound: HashMap<(String, String), (String, bool)>,
    relisted_bound: Option<HashMap<(String, String), (String, bool)>>,
    /// Every activator pod bound to a node and terminating (its `deletionTimestamp` set, the
    /// object still there), by (namespace, name): its node and when its grace period ends.
    /// Only the replacement hold reads it (`replacements.rs`): the DaemonSet creates a node's
    /// new activator once the old pod is gone.
    terminating: HashMap<(String, String), (String, Timestamp)>,
    relisted_terminating: Option<HashMap<(String, String), (String, Timestamp)>>,
}

impl ActivatorSet {
    /// The usable activators, one per node.
    pub fn available(&self) -> &BTreeMap<String, Activator> {
        &self.available
    }

    pub fn get(&self, node: &str) -> Option<&Activator> {
        self.available.get(node)
    }

    /// Whether `node`'s Node object is known and NotReady.
    pub fn node_not_ready(&self, node: &str) -> bool {
        self.nodes.get(node).is_some_and(|s| !s.ready)
    }

    /// Whether `node`'s Node object is known and Ready: an activator lost there is being
    /// replaced, or restarted (`replacements.rs`), not lost with its node.
    pub fn node_known_ready(&self, node: &str) -> bool {
        self.nodes.get(node).is_some_and(|s| s.ready)
    }

    /// When the grace period of `node`'s terminating activator pods ends (the latest, if
    /// several): None when none is terminating there.
    pub fn terminating_until(&self, node: &str) -> Option<Timestamp> {
        self.terminating
            .values()
            .filter(|(n, _)| n == node)
            .map(|(_, t)| *t)
            .max()
    }

    /// Whether most nodes are NotReady at once: a disruption of the control plane or the
    /// network (after an API server or etcd outage longer than the node-monitor grace
    /// period, the controller-manager marks every node whose lease went stale NotReady, and
    /// every pod on it unready), not that many nodes failing together. The node lifecycle
    /// controller reasons the same way and stops evicting pods; the subsetter keeps the
    /// members it has (`controller.rs`). At least two nodes, and more than
    /// [`DISRUPTED_SHARE`] of the Node objects known.
    pub fn disrupted(&self) -> bool {
        // The nodes that have an activator pod, or a Node object: down when the Node is not
        // Ready or no pod of it is (whichever of the two the watches showed first).
        let mut ready_pod: HashMap<&str, bool> = HashMap::new();
        for (node, ready) in self.bound.values() {
            *ready_pod.entry(node.as_str()).or_default() |= *ready;
        }
        for name in self.nodes.keys() {
            ready_pod.entry(name.as_str()).or_insert(true);
        }
        let down = ready_pod
            .iter()
            .filter(|(node, pod_ready)| {
                !**pod_ready || self.nodes.get(**node).is_some_and(|s| !s.ready)
            })
            .count();
        down >= 2 && down as f64 > DISRUPTED_SHARE * ready_pod.len() as f64
    }

    /// An activator pod was created or changed.
    pub fn apply_pod(&mut self, pod: &Pod) -> Diff {
        match bound_to(pod) {
            Some(b) => self.bound.insert(pod_key(pod), b),
            None => self.bound.remove(&pod_key(pod)),
        };
        match terminating(pod) {
            Some(t) => self.terminating.insert(pod_key(pod), t),
            None => self.terminating.remove(&pod_key(pod)),
        };
        let mut touched = self.unlink_pod(pod);
        if let Some(a) = from_pod(pod) {
            let rank = Rank::of(pod);
            self.on_node
                .entry(a.node.clone())
                .or_default()
                .insert(rank.clone());
            touched.push(a.node.clone());
            self.pods.insert(pod_key(pod), (rank, a));
        }
        self.recompute(touched)
    }

    /// An activator pod was deleted.
    pub fn delete_pod(&mut self, pod: &Pod) -> Diff {
        self.bound.remove(&pod_key(pod));
        self.terminating.remove(&pod_key(pod));
        let touched = self.unlink_pod(pod);
        self.recompute(touched)
    }

    /// A Node was created or changed.
    pub fn apply_node(&mut self, node: &Node) -> Diff {
        let name = node.metadata.name.clone().unwrap_or_default();
        let ready = node_ready(node);
        let facts = NodeFacts::of(node);
        match self.nodes.get_mut(&name) {
            // A status heartbeat changes neither: nothing to recompute.
            Some(s) if s.ready == ready && *s.facts == facts => return Diff::default(),
            Some(s) => {
                s.ready = ready;
                if *s.facts != facts {
                    s.facts = Arc::new(facts);
                }
            }
            None => {
                self.nodes.insert(
                    name.clone(),
                    NodeState {
                        ready,
                        facts: Arc::new(facts),
                    },
                );
            }
        }
        self.recompute(vec![name])
    }

    /// A Node was deleted: its activator, if any, no longer has facts or readiness to answer
    /// to (as in a cluster without Node objects).
    pub fn delete_node(&mut self, name: &str) -> Diff {
        if self.nodes.remove(name).is_none() {
            return Diff::default();
        }
        self.recompute(vec![name.to_owned()])
    }

    /// A relist of the activator pods begins: its pods replace every pod known when it is
    /// done.
    pub fn relist_pods_start(&mut self) {
        self.relisted_pods = Some(HashMap::new());
        self.relisted_bound = Some(HashMap::new());
        self.relisted_terminating = Some(HashMap::new());
    }

    /// A pod of the relist in progress.
    pub fn relist_pod(&mut self, pod: &Pod) {
        if let (Some(seen), Some(b)) = (&mut self.relisted_bound, bound_to(pod)) {
            seen.insert(pod_key(pod), b);
        }
        if let (Some(seen), Some(t)) = (&mut self.relisted_terminating, terminating(pod)) {
            seen.insert(pod_key(pod), t);
        }
        if let (Some(seen), Some(a)) = (&mut self.relisted_pods, from_pod(pod)) {
            seen.insert(pod_key(pod), (Rank::of(pod), a));
        }
    }

    /// The pod relist is complete: its pods are the pods now.
    pub fn relist_pods_done(&mut self) -> Diff {
        let Some(pods) = self.relisted_pods.take() else {
            return Diff::default();
        };
        self.bound = self.relisted_bound.take().unwrap_or_default();
        self.terminating = self.relisted_terminating.take().unwrap_or_default();
        self.on_node.clear();
        for (rank, a) in pods.values() {
            self.on_node
                .entry(a.node.clone())
                .or_default()
                .insert(rank.clone());
        }
        self.pods = pods;
        self.rebuild()
    }

    /// A relist of the Nodes begins: its Nodes replace every node known when it is done.
    pub fn relist_nodes_start(&mut self) {
        self.relisted_nodes = Some(HashMap::new());
    }

    /// A Node of the relist in progress.
    pub fn relist_node(&mut self, node: &Node) {
        if let Some(seen) = &mut self.relisted_nodes {
            let state = NodeState {
                ready: node_ready(node),
                facts: Arc::new(NodeFacts::of(node)),
            };
            seen.insert(node.metadata.name.clone().unwrap_or_default(), state);
        }
    }

    /// The Node relist is complete: its Nodes are the nodes now.
    pub fn relist_nodes_done(&mut self) -> Diff {
        let Some(nodes) = self.relisted_nodes.take() else {
            return Diff::default();
        };
        self.nodes = nodes;
        self.rebuild()
    }

    /// A whole relist of the activator pods at once.
    pub fn replace_pods<'a>(&mut self, pods: impl IntoIterator<Item = &'a Pod>) -> Diff {
        self.relist_pods_start();
        for pod in pods {
            self.relist_pod(pod);
        }
        self.relist_pods_done()
    }

    /// A whole relist of the Nodes at once.
    pub fn replace_nodes<'a>(&mut self, nodes: impl IntoIterator<Item = &'a Node>) -> Diff {
        self.relist_nodes_start();
        for node in nodes {
            self.relist_node(node);
        }
        self.relist_nodes_done()
    }

    /// Forgets `pod`; returns the node it was a usable activator pod on, if any.
    fn unlink_pod(&mut self, pod: &Pod) -> Vec<String> {
        let Some((rank, a)) = self.pods.remove(&pod_key(pod)) else {
            return Vec::new();
        };
        if let Some(ranks) = self.on_node.get_mut(&a.node) {
            ranks.remove(&rank);
            if ranks.is_empty() {
                self.on_node.remove(&a.node);
            }
        }
        vec![a.node]
    }

    /// What `node`'s activator is now, from its pods and its Node.
    fn entry(&self, node: &str) -> Option<Activator> {
        let state = self.nodes.get(node);
        if state.is_some_and(|s| !s.ready) {
            return None;
        }
        let rank = self.on_node.get(node)?.last()?;
        let (_, a) = self
            .pods
            .get(&(rank.namespace.clone(), rank.name.clone()))?;
        Some(Activator {
            facts: state.map(|s| Arc::clone(&s.facts)),
            ..a.clone()
        })
    }

    fn recompute(&mut self, touched: Vec<String>) -> Diff {
        let mut d = Diff::default();
        for node in touched {
            let old = match self.entry(&node) {
                Some(a) => self.available.insert(node.clone(), a),
                None => self.available.remove(&node),
            };
            match (old, self.available.get(&node)) {
                (None, Some(_)) => {
                    d.added.insert(node);
                }
                (Some(_), None) => {
                    d.lost.insert(node);
                }
                (Some(old), Some(new)) if old != *new => {
                    d.changed.insert(node);
                }
                _ => {}
            }
        }
        d
    }

    fn rebuild(&mut self) -> Diff {
        let next: BTreeMap<String, Activator> = self
            .on_node
            .keys()
            .filter_map(|n| Some((n.clone(), self.entry(n)?)))
            .collect();
        let d = diff(&self.available, &next);
        self.available = next;
        d
    }
}

/// The node an activator pod is bound to and whether it is Ready as its kubelet last said
/// (a pod being deleted counts as gone).
fn bound_to(pod: &Pod) -> Option<(String, bool)> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let node = bound_node(pod)?;
    // Ready as `from_pod` reads it: the controller-manager's unready mark alone does not
    // make a node down once its Node is Ready again (`crds::pod_ready`).
    Some((node, crds::pod_ready::ready(pod)))
}

/// The node a terminating activator pod is bound to, and when its grace period ends (the API
/// server sets `deletionTimestamp` to the deletion's time plus its grace period).
fn terminating(pod: &Pod) -> Option<(String, Timestamp)> {
    let ends = pod.metadata.deletion_timestamp.as_ref()?.0;
    Some((bound_node(pod)?, ends))
}

/// The node a pod is bound to (`spec.nodeName`), if any.
pub(crate) fn bound_node(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .node_name
        .clone()
        .filter(|n| !n.is_empty())
}

fn pod_key(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// How the activator set changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diff {
    /// Nodes whose activator is gone.
    pub lost: BTreeSet<String>,
    /// Nodes whose activator is a different pod or address (members must be rewritten).
    pub changed: BTreeSet<String>,
    /// Nodes that gained an activator.
    pub added: BTreeSet<String>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.lost.is_empty() && self.changed.is_empty() && self.added.is_empty()
    }
}

pub fn diff(old: &BTreeMap<String, Activator>, new: &BTreeMap<String, Activator>) -> Diff {
    let mut d = Diff::default();
    for (node, a) in old {
        match new.get(node) {
            None => {
                d.lost.insert(node.clone());
            }
            Some(b) if b != a => {
                d.changed.insert(node.clone());
            }
            Some(_) => {}
        }
    }
    for node in new.keys() {
        if !old.contains_key(node) {
            d.added.insert(node.clone());
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, NodeCondition, NodeStatus, PodCondition, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;

    fn pod(name: &str, node: &str, ip: &str, ready: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                containers: vec![Container {
                    name: "activator".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                pod_ip: Some(ip.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn ready_pod_is_an_activator_at_default_port() {
        let a = from_pod(&pod("act-1", "n1", "10.0.0.1", true)).unwrap();
        assert_eq!(a.address, "10.0.0.1:8080");
        assert_eq!(a.node, "n1");
        assert_eq!(a.pod, "act-1");
    }

    #[test]
    fn named_http_port_is_used_and_ipv6_is_bracketed() {
        let mut p = pod("act-1", "n1", "fd00::1", true);
        p.spec.as_mut().unwrap().containers[0].ports = Some(vec![
            ContainerPort {
                name: Some("admin".into()),
                container_port: 9090,
                ..Default::default()
            },
            ContainerPort {
                name: Some("http".into()),
                container_port: 8081,
                ..Default::default()
            },
        ]);
        assert_eq!(from_pod(&p).unwrap().address, "[fd00::1]:8081");
    }

    #[test]
    fn unready_deleting_unbound_or_ipless_pods_are_not_activators() {
        assert!(from_pod(&pod("a", "n1", "10.0.0.1", false)).is_none());
        let mut p = pod("a", "n1", "10.0.0.1", true);
        p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(from_pod(&p).is_none());
        assert!(from_pod(&pod("a", "", "10.0.0.1", true)).is_none());
        assert!(from_pod(&pod("a", "n1", "", true)).is_none());
    }

    #[test]
    fn a_terminating_pod_is_known_by_its_node_until_it_is_gone_or_relisted_away() {
        let mut set = ActivatorSet::default();
        let ends = Timestamp::UNIX_EPOCH + k8s_openapi::jiff::SignedDuration::from_secs(120);
        let later = ends + k8s_openapi::jiff::SignedDuration::from_secs(30);
        let mut old = pod("old", "n1", "10.0.0.1", true);
        set.apply_pod(&old);
        assert_eq!(set.terminating_until("n1"), None, "not terminating yet");
        old.metadata.deletion_timestamp = Some(Time(ends));
        let d = set.apply_pod(&old);
        assert!(d.lost.contains("n1"), "a terminating pod is no activator");
        assert_eq!(set.terminating_until("n1"), Some(ends));
        assert_eq!(set.terminating_until("n2"), None);
        // Two terminating on one node: the later end.
        let mut other = pod("other", "n1", "10.0.0.2", false);
        other.metadata.deletion_timestamp = Some(Time(later));
        set.apply_pod(&other);
        assert_eq!(set.terminating_until("n1"), Some(later));
        set.delete_pod(&other);
        assert_eq!(set.terminating_until("n1"), Some(ends));
        // A relist that no longer shows it: gone.
        set.replace_pods([&pod("new", "n1", "10.0.0.3", true)]);
        assert_eq!(set.terminating_until("n1"), None);
        // A relist that shows one terminating: known.
        set.replace_pods([&old]);
        assert_eq!(set.terminating_until("n1"), Some(ends));
        set.delete_pod(&old);
        assert_eq!(set.terminating_until("n1"), None);
    }

    #[test]
    fn not_ready_nodes_lose_their_activator_unknown_nodes_do_not() {
        let pods = [
            pod("a1", "n1", "10.0.0.1", true),
            pod("a2", "n2", "10.0.0.2", true),
            pod("a3", "n3", "10.0.0.3", true),
        ];
        let nodes = HashMap::from([("n1".to_string(), true), ("n2".to_string(), false)]);
        let avail = available(&pods, &nodes);
        assert_eq!(avail.keys().collect::<Vec<_>>(), vec!["n1", "n3"]);
    }

    #[test]
    fn newest_pod_wins_on_a_node() {
        let mut old = pod("old", "n1", "10.0.0.1", true);
        old.metadata.creation_timestamp = Some(Time(Timestamp::from_second(10).unwrap()));
        let mut new = pod("new", "n1", "10.0.0.9", true);
        new.metadata.creation_timestamp = Some(Time(Timestamp::from_second(20).unwrap()));
        let avail = available([&new, &old], &HashMap::new());
        assert_eq!(avail["n1"].pod, "new");
        let avail = available([&old, &new], &HashMap::new());
        assert_eq!(avail["n1"].pod, "new");
    }

    #[test]
    fn node_readiness_from_conditions() {
        let mut n = Node::default();
        assert!(!node_ready(&n));
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(node_ready(&n));
    }

    fn node(name: &str, ready: bool, zone: u8, tainted: bool) -> Node {
        let mut n: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { "zone": format!("z{zone}") } },
            "status": { "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] },
        }))
        .unwrap();
        if tainted {
            n.spec = Some(
                serde_json::from_value(serde_json::json!({
                    "taints": [{ "key": "k", "effect": "NoSchedule" }]
                }))
                .unwrap(),
            );
        }
        n
    }

    /// What the controller did before the set was incremental: everything from every pod and
    /// node.
    fn full(
        pods: &BTreeMap<(u8, u8), Pod>,
        nodes: &BTreeMap<u8, Node>,
    ) -> BTreeMap<String, Activator> {
        let ready: HashMap<String, bool> = nodes
            .values()
            .map(|n| (n.metadata.name.clone().unwrap(), node_ready(n)))
            .collect();
        let mut m = available(pods.values(), &ready);
        for a in m.values_mut() {
            a.facts = nodes
                .values()
                .find(|n| n.metadata.name.as_deref() == Some(a.node.as_str()))
                .map(|n| Arc::new(NodeFacts::of(n)));
        }
        m
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// (namespace, name), node, ready, created (seconds), being deleted
        ApplyPod((u8, u8), u8, bool, i64, bool),
        DeletePod((u8, u8)),
        /// node, ready, zone label, tainted
        ApplyNode(u8, bool, u8, bool),
        DeleteNode(u8),
        /// A relist that no longer shows this pod (or node).
        RelistPods((u8, u8)),
        RelistNodes(u8),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let pod = (0u8..2, 0u8..4);
        prop_oneof![
            4 => (pod.clone(), 0u8..3, any::<bool>(), 0i64..3, proptest::bool::weighted(0.1))
                .prop_map(|(p, n, r, c, d)| Op::ApplyPod(p, n, r, c, d)),
            1 => pod.clone().prop_map(Op::DeletePod),
            3 => (0u8..3, proptest::bool::weighted(0.7), 0u8..2, proptest::bool::weighted(0.2))
                .prop_map(|(n, r, z, t)| Op::ApplyNode(n, r, z, t)),
            1 => (0u8..3).prop_map(Op::DeleteNode),
            1 => pod.prop_map(Op::RelistPods),
            1 => (0u8..3).prop_map(Op::RelistNodes),
        ]
    }

    proptest::proptest! {
        // Event by event, the incremental set is the full computation over the objects the
        // watches show, and each change reports the diff between the two full computations.
        #[test]
        fn incremental_set_is_the_full_recompute(ops in proptest::collection::vec(op(), 1..60)) {
            let mut pods: BTreeMap<(u8, u8), Pod> = BTreeMap::new();
            let mut nodes: BTreeMap<u8, Node> = BTreeMap::new();
            let mut set = ActivatorSet::default();
            let mut before = BTreeMap::new();
            for op in ops {
                let d = match op {
                    Op::ApplyPod((ns, name), n, ready, created, deleting) => {
                        let mut p = pod(&format!("p{name}"), &format!("n{n}"), &format!("10.0.{ns}.{name}"), ready);
                        p.metadata.namespace = Some(format!("ns{ns}"));
                        p.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
                        if deleting {
                            p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
                        }
                        let d = set.apply_pod(&p);
                        pods.insert((ns, name), p);
                        d
                    }
                    Op::DeletePod(k) => match pods.remove(&k) {
                        Some(p) => set.delete_pod(&p),
                        None => continue,
                    },
                    Op::ApplyNode(n, ready, zone, tainted) => {
                        let node = node(&format!("n{n}"), ready, zone, tainted);
                        let d = set.apply_node(&node);
                        nodes.insert(n, node);
                        d
                    }
                    Op::DeleteNode(n) => match nodes.remove(&n) {
                        Some(_) => set.delete_node(&format!("n{n}")),
                        None => continue,
                    },
                    Op::RelistPods(k) => {
                        pods.remove(&k);
                        set.replace_pods(pods.values())
                    }
                    Op::RelistNodes(n) => {
                        nodes.remove(&n);
                        set.replace_nodes(nodes.values())
                    }
                };
                let after = full(&pods, &nodes);
                proptest::prop_assert_eq!(set.available(), &after);
                proptest::prop_assert_eq!(d, diff(&before, &after));
                before = after;
            }
        }
    }

    #[test]
    fn a_node_heartbeat_changes_nothing_a_taint_changes_its_activator() {
        let mut set = ActivatorSet::default();
        let d = set.apply_pod(&pod("a1", "n1", "10.0.0.1", true));
        assert_eq!(d.added, BTreeSet::from(["n1".to_string()]));
        assert!(set.get("n1").unwrap().facts.is_none());
        let d = set.apply_node(&node("n1", true, 0, false));
        assert_eq!(d.changed, BTreeSet::from(["n1".to_string()]), "facts came");
        let mut beat = node("n1", true, 0, false);
        beat.metadata.resource_version = Some("2".into());
        assert!(set.apply_node(&beat).is_empty());
        let d = set.apply_node(&node("n1", true, 0, true));
        assert_eq!(d.changed, BTreeSet::from(["n1".to_string()]));
        let d = set.apply_node(&node("n1", false, 0, true));
        assert_eq!(d.lost, BTreeSet::from(["n1".to_string()]));
        let d = set.delete_node("n1");
        assert_eq!(
            d.added,
            BTreeSet::from(["n1".to_string()]),
            "no Node: usable again"
        );
        assert!(set.get("n1").unwrap().facts.is_none());
    }

    /// A heartbeat that lists the same images in another order (or under names that
    /// normalise alike) is no change; a pulled image is, and only the images changed.
    #[test]
    fn only_a_real_change_of_a_nodes_images_changes_its_activator() {
        let with_images = |rv: &str, images: serde_json::Value| {
            let mut n = node("n1", true, 0, false);
            n.metadata.resource_version = Some(rv.into());
            n.status.as_mut().unwrap().images = Some(serde_json::from_value(images).unwrap());
            n
        };
        let mut set = ActivatorSet::default();
        set.apply_pod(&pod("a1", "n1", "10.0.0.1", true));
        let d = set.apply_node(&with_images(
            "1",
            serde_json::json!([{"names": ["nginx:1.27"]}, {"names": ["registry:5000/app:v1"]}]),
        ));
        assert_eq!(d.changed, BTreeSet::from(["n1".to_string()]));
        let before = set.get("n1").unwrap().facts.clone().unwrap();
        let beat = with_images(
            "2",
            serde_json::json!([
                {"names": ["registry:5000/app:v1"], "sizeBytes": 5},
                {"names": ["docker.io/library/nginx:1.27"]}
            ]),
        );
        assert!(set.apply_node(&beat).is_empty(), "same images, other order");
        let pulled = with_images(
            "3",
            serde_json::json!([
                {"names": ["nginx:1.27"]},
                {"names": ["registry:5000/app:v1"]},
                {"names": ["registry:5000/app:v2"]}
            ]),
        );
        let d = set.apply_node(&pulled);
        assert_eq!(d.changed, BTreeSet::from(["n1".to_string()]));
        let after = set.get("n1").unwrap().facts.clone().unwrap();
        assert!(after.same_placement(&before), "only the images changed");
        assert_ne!(after.images, before.images);
    }

    #[test]
    fn most_nodes_not_ready_at_once_is_a_disruption_one_is_not() {
        let mut set = ActivatorSet::default();
        for n in ["n1", "n2", "n3"] {
            set.apply_node(&node(n, true, 0, false));
        }
        assert!(!set.disrupted());
        set.apply_node(&node("n1", false, 0, false));
        assert!(!set.disrupted(), "one node of three is a node failure");
        set.apply_node(&node("n2", false, 0, false));
        assert!(set.disrupted(), "two of three");
        set.apply_node(&node("n1", true, 0, false));
        assert!(!set.disrupted());
        // The controller-manager's unready marks on the pods may come before the Nodes'.
        let mut pods_first = ActivatorSet::default();
        for (i, n) in ["n1", "n2", "n3"].iter().enumerate() {
            pods_first.apply_node(&node(n, true, 0, false));
            pods_first.apply_pod(&pod(&format!("a{i}"), n, &format!("10.0.0.{i}"), true));
        }
        assert!(!pods_first.disrupted());
        pods_first.apply_pod(&pod("a0", "n1", "10.0.0.0", false));
        assert!(
            !pods_first.disrupted(),
            "one unready pod is one node's trouble"
        );
        pods_first.apply_pod(&pod("a1", "n2", "10.0.0.1", false));
        assert!(
            pods_first.disrupted(),
            "two of three pods unready, the Nodes still Ready"
        );
        pods_first.apply_pod(&pod("a1", "n2", "10.0.0.1", true));
        assert!(!pods_first.disrupted());
        // One node alone is never a disruption: its failure must be repaired.
        let mut one = ActivatorSet::default();
        one.apply_node(&node("n1", false, 0, false));
        assert!(!one.disrupted());
    }

    /// `pod` as the controller-manager leaves it after an outage (`MarkPodsNotReady`): the
    /// Ready condition False, the containers as the kubelet last reported them, ready.
    fn marked(name: &str, node: &str, ip: &str) -> Pod {
        let mut p = pod(name, node, ip, false);
        p.status.as_mut().unwrap().container_statuses = Some(vec![
            serde_json::from_value(serde_json::json!({
                "name": "activator", "image": "a", "imageID": "", "restartCount": 0,
                "ready": true, "state": {"running": {"startedAt": "2026-11-28T00:00:00Z"}}
            }))
            .unwrap(),
        ]);
        p
    }

    #[test]
    fn activators_the_controller_marked_unready_stay_members_once_their_nodes_are_ready() {
        let mut set = ActivatorSet::default();
        for (i, n) in ["n1", "n2", "n3"].iter().enumerate() {
            set.apply_node(&node(n, true, 0, false));
            set.apply_pod(&pod(&format!("a{i}"), n, &format!("10.0.0.{i}"), true));
        }
        assert_eq!(set.available().len(), 3);
        // The API server was away longer than the grace period: every Node NotReady, then
        // every pod marked.
        for (i, n) in ["n1", "n2", "n3"].iter().enumerate() {
            set.apply_node(&node(n, false, 0, false));
            set.apply_pod(&marked(&format!("a{i}"), n, &format!("10.0.0.{i}")));
        }
        assert!(
            set.available().is_empty(),
            "NotReady nodes lose their activators"
        );
        assert!(set.disrupted());
        // The kubelets report their Nodes again within seconds, but clear their pods' marks
        // only when their pod watches are back, up to a minute and a half later: meanwhile
        // every activator is what it was.
        let mut back = Diff::default();
        for n in ["n1", "n2", "n3"] {
            let d = set.apply_node(&node(n, true, 0, false));
            back.added.extend(d.added);
            assert!(d.lost.is_empty());
        }
        assert_eq!(back.added.len(), 3, "{back:?}");
        assert_eq!(set.available().len(), 3);
        assert!(
            !set.disrupted(),
            "the disruption ends with the Nodes' NotReady"
        );
        // A container the kubelet reports unready is the activator's own trouble.
        let mut failing = marked("a0", "n1", "10.0.0.0");
        failing
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .ready = false;
        let d = set.apply_pod(&failing);
        assert_eq!(d.lost, BTreeSet::from(["n1".to_string()]));
    }

    #[test]
    fn diff_reports_lost_changed_added() {
        let a = |n: &str, ip: &str| Activator {
            node: n.into(),
            address: ip.into(),
            pod: format!("p-{n}"),
            facts: None,
        };
        let old = BTreeMap::from([
            ("n1".into(), a("n1", "1")),
            ("n2".into(), a("n2", "2")),
            ("n3".into(), a("n3", "3")),
        ]);
        let new = BTreeMap::from([
            ("n1".into(), a("n1", "1")),
            ("n2".into(), a("n2", "22")),
            ("n4".into(), a("n4", "4")),
        ]);
        let d = diff(&old, &new);
        assert_eq!(d.lost, BTreeSet::from(["n3".to_string()]));
        assert_eq!(d.changed, BTreeSet::from(["n2".to_string()]));
        assert_eq!(d.added, BTreeSet::from(["n4".to_string()]));
        assert!(diff(&new, &new).is_empty());
    }

    proptest::proptest! {
        // The hashed view answers as the ordered map, whatever the changes.
        #[test]
        fn available_keeps_its_two_views_alike(
            ops in proptest::collection::vec((0usize..8, proptest::prelude::any::<bool>(), 0u8..3), 0..40),
        ) {
            let act = |n: &str, v: u8| Activator {
                node: n.into(),
                address: format!("10.0.0.{v}:8080"),
                pod: format!("activator-{n}"),
                facts: None,
            };
            let mut available = Available::default();
            let mut model: BTreeMap<String, Activator> = BTreeMap::new();
            for (n, add, v) in ops {
                let node = format!("n{n}");
                if add {
                    proptest::prop_assert_eq!(
                        available.insert(node.clone(), act(&node, v)),
                        model.insert(node.clone(), act(&node, v))
                    );
                } else {
                    proptest::prop_assert_eq!(available.remove(&node), model.remove(&node));
                }
            }
            proptest::prop_assert_eq!(&*available, &model);
            for n in 0..8 {
                let node = format!("n{n}");
                proptest::prop_assert_eq!(available.get(&node), model.get(&node));
                proptest::prop_assert_eq!(available.get_key_value(&node), model.get_key_value(&node));
                proptest::prop_assert_eq!(available.contains_key(&node), model.contains_key(&node));
            }
            proptest::prop_assert_eq!(Available::from(model.clone()), available);
        }
    }
}
