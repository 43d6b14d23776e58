//! App pods on this node, per revision, with a channel per revision so a cold-starting request
//! waits for the pod watch to report Ready instead of polling.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use crds::contract::REVISION_LABEL;
use dashmap::DashMap;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crds::ObjectKey as RevisionKey;

/// What the activator needs to know of one app pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPod {
    pub name: String,
    /// The pod's UID (the node agent is asked by it: names come back, UIDs do not).
    pub uid: String,
    pub ip: Option<IpAddr>,
    pub ready: bool,
    /// Being deleted (deletionTimestamp set): take no new requests.
    pub terminating: bool,
    /// Phase Failed or Succeeded: it will never serve; its reason, e.g. `OutOfpods`.
    pub failed: Option<String>,
}

impl LocalPod {
    pub fn from_pod(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        // As its kubelet last said: the node controller's unready mark after an outage is
        // not the app's failure (crds::pod_ready).
        let ready = crds::pod_ready::ready(pod);
        Self {
            name: pod.name_any(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            ip: status
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok()),
            ready: ready && phase == "Running",
            terminating: pod.metadata.deletion_timestamp.is_some(),
            failed: matches!(phase, "Failed" | "Succeeded").then(|| {
                status
                    .and_then(|s| s.reason.clone())
                    .unwrap_or_else(|| phase.to_string())
            }),
        }
    }

    /// Can take requests now.
    pub fn serving(&self) -> bool {
        self.ready && !self.terminating && self.failed.is_none() && self.ip.is_some()
    }

    /// Counts against the revision's pods on this node (will serve, or is starting).
    pub fn live(&self) -> bool {
        !self.terminating && self.failed.is_none()
    }
}

/// A revision's pods on this node, by pod name.
pub type RevisionPods = BTreeMap<String, LocalPod>;

/// App pods on this node.
#[derive(Clone)]
pub struct PodCache {
    by_revision: Arc<DashMap<RevisionKey, watch::Sender<RevisionPods>>>,
    synced: watch::Receiver<bool>,
}

impl PodCache {
    /// Watches pods with `spec.nodeName=<node>` that carry the revision label.
    pub fn start(client: Client, node: &str, stop: CancellationToken) -> Self {
        let by_revision: Arc<DashMap<RevisionKey, watch::Sender<RevisionPods>>> =
            Arc::new(DashMap::new());
        let (synced_tx, synced) = watch::channel(false);
        let api: Api<Pod> = Api::all(client);
        let cfg = watcher::Config {
            // kube-core leaves `resourceVersion=0` out of a paged list, which then goes to
            // etcd; this list is bounded by the node (its maxPods), so one page from the API
            // server's watch cache: a DaemonSet rollout's thousands of lists cost etcd nothing.
            page_size: None,
            ..watcher::Config::default()
                .fields(&format!("spec.nodeName={node}"))
                .labels(REVISION_LABEL)
                .any_semantic()
        };
        // Bounded back-off, and a re-list at once after a 410: back within a second or so
        // of the API server's return, however long it was gone (crds::backoff).
        let events = crds::backoff::resilient(watcher(api, cfg));
        let table = by_revision.clone();
        // Pods listed by the current relist, so those gone meanwhile can be dropped.
        let mut relisted: Option<HashSet<(RevisionKey, String)>> = None;
        super::spawn_watch("pod", events, stop, move |ev| match ev {
            watcher::Event::Init => relisted = Some(HashSet::new()),
            watcher::Event::InitApply(pod) => {
                if let Some(key) = revision_of(&pod) {
                    if let Some(seen) = relisted.as_mut() {
                        seen.insert((key.clone(), pod.name_any()));
                    }
                    upsert(&table, key, LocalPod::from_pod(&pod), true);
                }
            }
            watcher::Event::InitDone => {
                if let Some(seen) = relisted.take() {
                    retain(&table, &seen);
                }
                let _ = synced_tx.send(true);
            }
            watcher::Event::Apply(pod) => {
                if let Some(key) = revision_of(&pod) {
                    upsert(&table, key, LocalPod::from_pod(&pod), true);
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some(key) = revision_of(&pod) {
                    remove(&table, &key, &pod.name_any());
                }
            }
        });
        Self {
            by_revision,
            synced,
        }
    }

    pub async fn synced(&self) {
        let mut rx = self.synced.clone();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The revision's pods on this node now.
    /// (pods, revisions) cached now.
    pub fn counts(&self) -> (usize, usize) {
        let pods = self
            .by_revision
            .iter()
            .map(|e| e.value().borrow().len())
            .sum();
        (pods, self.by_revision.len())
    }

    /// The revisions with a live pod on this node now (after a restart: the pods a previous
    /// activator process left, which this one must adopt so they idle out).
    pub fn revisions_with_live_pods(&self) -> Vec<RevisionKey> {
        self.by_revision
            .iter()
            .filter(|e| e.value().borrow().values().any(LocalPod::live))
            .map(|e| e.key().clone())
            .collect()
    }

    pub fn snapshot(&self, key: &RevisionKey) -> RevisionPods {
        self.by_revision
            .get(key)
            .map(|tx| tx.borrow().clone())
            .unwrap_or_default()
    }

    /// A receiver that sees every change to the revision's pods on this node.
    pub fn subscribe(&self, key: &RevisionKey) -> watch::Receiver<RevisionPods> {
        self.by_revision
            .entry(key.clone())
            .or_insert_with(|| watch::channel(RevisionPods::new()).0)
            .subscribe()
    }

    /// Records a pod this activator has just created, unless the watch has reported it
    /// already (its report is newer), so a request arriving before the watch event does not
    /// create the pod again.
    pub fn observe_created(&self, key: &RevisionKey, pod: &Pod) {
        upsert(
            &self.by_revision,
            key.clone(),
            LocalPod::from_pod(pod),
            false,
        );
    }
}

fn revision_of(pod: &Pod) -> Option<RevisionKey> {
    Some(RevisionKey::new(
        pod.namespace()?,
        pod.labels().get(REVISION_LABEL)?.clone(),
    ))
}

/// Records `pod` in its revision's channel; `replace` = false keeps an entry already there
/// (the watch's report is newer than a create response).
fn upsert(
    table: &DashMap<RevisionKey, watch::Sender<RevisionPods>>,
    key: RevisionKey,
    pod: LocalPod,
    replace: bool,
) {
    let tx = table
        .entry(key)
        .or_insert_with(|| watch::channel(RevisionPods::new()).0);
    tx.send_if_modified(|pods| match pods.get(&pod.name) {
        Some(old) if !replace || *old == pod => false,
        _ => {
            pods.insert(pod.name.clone(), pod);
            true
        }
    });
}

fn remove(
    table: &DashMap<RevisionKey, watch::Sender<RevisionPods>>,
    key: &RevisionKey,
    name: &str,
) {
    if let Some(tx) = table.get(key) {
        tx.send_if_modified(|pods| pods.remove(name).is_some());
    }
}

fn retain(
    table: &DashMap<RevisionKey, watch::Sender<RevisionPods>>,
    seen: &HashSet<(RevisionKey, String)>,
) {
    let gone: Vec<(RevisionKey, String)> = table
        .iter()
        .flat_map(|e| {
            let key = e.key().clone();
            e.value()
                .borrow()
                .keys()
                .filter(|n| !seen.contains(&(key.clone(), (*n).clone())))
                .map(|n| (key.clone(), n.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    for (key, name) in gone {
        remove(table, &key, &name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ready: &str, container_ready: Option<bool>) -> Pod {
        let containers = match container_ready {
            Some(r) => serde_json::json!([{
                "name": "app", "image": "x", "imageID": "", "restartCount": 0,
                "ready": r, "state": {"running": {"startedAt": "2026-11-27T00:00:00Z"}}
            }]),
            None => serde_json::json!([]),
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": ready}],
                "containerStatuses": containers,
            }
        }))
        .expect("a pod")
    }

    #[test]
    fn the_node_controllers_mark_does_not_stop_a_pod_the_kubelets_readiness_does() {
        assert!(LocalPod::from_pod(&pod("True", Some(true))).serving());
        // MarkPodsNotReady: the Ready condition only; the containers still ready.
        assert!(LocalPod::from_pod(&pod("False", Some(true))).serving());
        // The kubelet: the app failed its readiness probe.
        assert!(!LocalPod::from_pod(&pod("False", Some(false))).serving());
        // Nothing known of the containers: the condition stands.
        assert!(!LocalPod::from_pod(&pod("False", None)).serving());
        assert!(!LocalPod::from_pod(&pod("Unknown", Some(true))).serving());
    }
}
