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

use crate::eligibility::NodeFacts;

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

/// The activator `pod` stands for, if it is usable.
pub fn from_pod(pod: &Pod) -> Option<Activator> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
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
/// newest wins, since the old one is about to go.
pub fn available<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    nodes: &HashMap<String, bool>,
) -> BTreeMap<String, Activator> {
    let mut best: BTreeMap<String, (&'a Pod, Activator)> = BTreeMap::new();
    for pod in pods {
        let Some(a) = from_pod(pod) else { continue };
        if nodes.get(&a.node) == Some(&false) {
            continue;
        }
        let newer = match best.get(&a.node) {
            None => true,
            Some((other, _)) => {
                let key = |p: &Pod| {
                    (
                        p.metadata.creation_timestamp.as_ref().map(|t| t.0),
                        p.metadata.name.clone(),
                    )
                };
                key(pod) > key(other)
            }
        };
        if newer {
            best.insert(a.node.clone(), (pod, a));
        }
    }
    best.into_iter().map(|(n, (_, a))| (n, a)).collect()
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
}
