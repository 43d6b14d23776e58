//! What the scenarios watch in the API while they load the system: app pods (how many are
//! live at once, the most ever), and ActivationEndpoints (member changes, repairs). Each is one
//! watch, as a platform engineer's `kubectl get -w` would see it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crds::ActivationEndpoints;
use crds::contract::REVISION_LABEL;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use tokio::sync::watch as signal;

/// The pod's Ready condition is True.
pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pod's IP once it is Ready (a kubelet reports both in one status update).
pub fn ready_ip(p: &Pod) -> Option<String> {
    is_ready(p)
        .then(|| p.status.as_ref()?.pod_ip.clone())
        .flatten()
}

/// Not terminating and not finished.
pub fn is_live(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && !matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Failed" | "Succeeded")
        )
}

/// The revision a pod belongs to (its revision label).
fn revision_of(p: &Pod) -> Option<&str> {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(REVISION_LABEL))
        .map(String::as_str)
}

/// Live app pods of a namespace, per revision, as one watch sees them; remembers the most
/// that were ever live at once for each revision, and the total live now.
pub struct PodWatch {
    store: reflector::Store<Pod>,
    max_live: Arc<std::sync::Mutex<BTreeMap<String, usize>>>,
    created: Arc<AtomicU64>,
    /// Live pods (all revisions) after each event, with its time.
    history: Arc<std::sync::Mutex<Vec<(std::time::Instant, usize)>>>,
    /// Bumped after every event is applied: waiters look again then.
    changed: signal::Receiver<u64>,
    task: JoinHandle<()>,
}

impl PodWatch {
    pub fn start(client: &Client, namespace: &str) -> Self {
        let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let cfg = watcher::Config::default().labels(REVISION_LABEL);
        let (store, writer) = reflector::store::<Pod>();
        let max_live = Arc::new(std::sync::Mutex::new(BTreeMap::<String, usize>::new()));
        let created = Arc::new(AtomicU64::new(0));
        let history = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (m, c, reader, h) = (
            max_live.clone(),
            created.clone(),
            store.clone(),
            history.clone(),
        );
        let (tx, changed) = signal::channel(0u64);
        let task = tokio::spawn(async move {
            let mut seen = BTreeSet::new();
            let mut events = std::pin::pin!(watcher(api, cfg).reflect(writer).applied_objects());
            while let Some(ev) = events.next().await {
                let Ok(pod) = ev else { continue };
                if seen.insert(pod.uid().unwrap_or_default()) {
                    c.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(rev) = revision_of(&pod) {
                    let live = reader
                        .state()
                        .iter()
                        .filter(|p| revision_of(p) == Some(rev) && is_live(p))
                        .count();
                    let mut max = m.lock().unwrap_or_else(|e| e.into_inner());
                    let e = max.entry(rev.to_string()).or_default();
                    *e = (*e).max(live);
                }
                let live = reader.state().iter().filter(|p| is_live(p)).count();
                h.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((std::time::Instant::now(), live));
                tx.send_modify(|v| *v += 1);
            }
        });
        Self {
            history,
            store,
            max_live,
            created,
            changed,
            task,
        }
    }

    /// The most pods of each revision ever live at once.
    pub fn max_live(&self) -> BTreeMap<String, usize> {
        self.max_live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Live pods (all revisions) after each pod event.
    pub fn history(&self) -> Vec<(std::time::Instant, usize)> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Live pods now, all revisions.
    pub fn live(&self) -> usize {
        self.store.state().iter().filter(|p| is_live(p)).count()
    }

    /// Distinct pods seen so far.
    pub fn created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    /// Waits until the live pods (all revisions) satisfy `pred`, at most `limit`.
    pub async fn wait_live(&self, limit: Duration, pred: impl Fn(usize) -> bool) -> bool {
        let mut changed = self.changed.clone();
        let waiting = async {
            let _ = self.store.wait_until_ready().await;
            loop {
                if pred(self.live()) || changed.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(limit, waiting).await.is_ok()
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Members by revision as one watch shows them, with how many subsets each node is in, kept
/// as the events come: a question about one node (is it still a member anywhere? which nodes
/// are in the most subsets?) costs a lookup, not a walk over every revision. At 100,000
/// revisions a walk (or a copy of the map, as waits once made on every event) takes a good
/// part of a second of the one process's CPU, and a repair is hundreds of events.
#[derive(Debug, Default)]
struct Members {
    by_revision: BTreeMap<String, BTreeSet<String>>,
    /// Nodes in at least one subset, with the number of subsets.
    subsets_of: HashMap<String, usize>,
    /// When each revision was first seen with a member: its assignment, as this watch saw it.
    first_assigned: HashMap<String, std::time::Instant>,
}

impl Members {
    /// `revision`'s members are `now`; returns the nodes that joined or left it (0 for a
    /// revision seen for the first time).
    fn set(&mut self, revision: String, now: BTreeSet<String>) -> u64 {
        let empty = BTreeSet::new();
        let before = self.by_revision.get(&revision);
        let was = before.unwrap_or(&empty);
        for left in was.difference(&now) {
            if let Some(n) = self.subsets_of.get_mut(left) {
                *n -= 1;
                if *n == 0 {
                    self.subsets_of.remove(left);
                }
            }
        }
        for joined in now.difference(was) {
            *self.subsets_of.entry(joined.clone()).or_default() += 1;
        }
        let moved = before.map_or(0, |b| b.symmetric_difference(&now).count() as u64);
        if !now.is_empty() && !self.first_assigned.contains_key(&revision) {
            self.first_assigned
                .insert(revision.clone(), std::time::Instant::now());
        }
        self.by_revision.insert(revision, now);
        moved
    }

    fn subsets_of(&self, node: &str) -> usize {
        self.subsets_of.get(node).copied().unwrap_or(0)
    }
}

fn locked(m: &std::sync::Mutex<Members>) -> std::sync::MutexGuard<'_, Members> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One revision's members at a time, as a [`MemberWatch`] sees them.
#[derive(Clone)]
pub struct MemberView(Arc<std::sync::Mutex<Members>>);

impl MemberView {
    /// The member nodes of `revision` now (none when it has no ActivationEndpoints yet).
    pub fn of(&self, revision: &str) -> Vec<String> {
        locked(&self.0)
            .by_revision
            .get(revision)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// The members of every ActivationEndpoints of a namespace as one watch sees them; counts
/// member changes (a node in or out of a subset).
pub struct MemberWatch {
    members: Arc<std::sync::Mutex<Members>>,
    changes: Arc<AtomicU64>,
    events: Arc<AtomicUsize>,
    changed: signal::Receiver<u64>,
    task: JoinHandle<()>,
}

impl MemberWatch {
    pub fn start(client: &Client, namespace: &str) -> Self {
        let api: Api<ActivationEndpoints> = Api::namespaced(client.clone(), namespace);
        let members = Arc::new(std::sync::Mutex::new(Members::default()));
        let changes = Arc::new(AtomicU64::new(0));
        let events = Arc::new(AtomicUsize::new(0));
        let (m, c, n) = (members.clone(), changes.clone(), events.clone());
        let (tx, changed) = signal::channel(0u64);
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
            );
            while let Some(ev) = stream.next().await {
                let aep = match ev {
                    Ok(aep) => aep,
                    Err(e) => {
                        // What the figures wait on: a failing watch is worth knowing of.
                        tracing::warn!(error = %e, "the harness's ActivationEndpoints watch");
                        continue;
                    }
                };
                n.fetch_add(1, Ordering::Relaxed);
                let now: BTreeSet<String> = aep
                    .status
                    .map(|s| s.activators.into_iter().map(|a| a.node).collect())
                    .unwrap_or_default();
                let name = aep.metadata.name.unwrap_or_default();
                let moved = locked(&m).set(name, now);
                c.fetch_add(moved, Ordering::Relaxed);
                tx.send_modify(|v| *v += 1);
            }
        });
        Self {
            members,
            changes,
            events,
            changed,
            task,
        }
    }

    /// A handle that reads one revision's members, for a request's retry (which happens
    /// after the watch may have moved on).
    pub fn view(&self) -> MemberView {
        MemberView(self.members.clone())
    }

    /// Member nodes by revision, now (a copy: for a scenario's setup, not for a loop).
    pub fn members(&self) -> BTreeMap<String, BTreeSet<String>> {
        locked(&self.members).by_revision.clone()
    }

    /// `nodes` with the number of subsets each is in now, most first (ties by name,
    /// descending): the nodes whose loss costs the most.
    pub fn busiest<'a>(&self, nodes: impl IntoIterator<Item = &'a String>) -> Vec<(usize, String)> {
        let now = locked(&self.members);
        let mut ranked: Vec<(usize, String)> = nodes
            .into_iter()
            .map(|n| (now.subsets_of(n), n.clone()))
            .collect();
        drop(now);
        ranked.sort_by(|a, b| b.cmp(a));
        ranked
    }

    /// How many subsets `node` is in now.
    pub fn subsets_of(&self, node: &str) -> usize {
        locked(&self.members).subsets_of(node)
    }

    /// When `revision` was first seen with a member (none yet: `None`).
    pub fn first_assigned(&self, revision: &str) -> Option<std::time::Instant> {
        locked(&self.members).first_assigned.get(revision).copied()
    }

    /// ActivationEndpoints events seen.
    pub fn events(&self) -> usize {
        self.events.load(Ordering::Relaxed)
    }

    /// Nodes that joined or left a subset since the watch started (each counts once per
    /// revision).
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// Waits until the members satisfy `pred`, at most `limit`; false on timeout. `pred`
    /// sees the members in place (the watch waits meanwhile): keep it small, or use
    /// [`MemberWatch::wait_gone`].
    pub async fn wait(
        &self,
        limit: Duration,
        pred: impl Fn(&BTreeMap<String, BTreeSet<String>>) -> bool,
    ) -> bool {
        self.wait_members(limit, |m| pred(&m.by_revision)).await
    }

    /// Waits until `node` is in no subset, at most `limit`; false on timeout.
    pub async fn wait_gone(&self, node: &str, limit: Duration) -> bool {
        self.wait_members(limit, |m| m.subsets_of(node) == 0).await
    }

    async fn wait_members(&self, limit: Duration, pred: impl Fn(&Members) -> bool) -> bool {
        let mut changed = self.changed.clone();
        let waiting = async {
            loop {
                if pred(&locked(&self.members)) || changed.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(limit, waiting).await.is_ok()
    }
}

impl Drop for MemberWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// When each pod of a label selector was first seen in a state: `seen` names the pod's key
/// and a value when it is in that state (bound, Ready with an IP…). One watch, started only
/// once it has listed, so nothing that happens after [`FirstSeen::start`] returns is missed.
pub struct FirstSeen<T> {
    seen: signal::Receiver<BTreeMap<String, (std::time::Instant, T)>>,
    task: JoinHandle<()>,
}

impl<T: Clone + Send + Sync + 'static> FirstSeen<T> {
    pub async fn start(
        api: Api<Pod>,
        labels: &str,
        seen: impl Fn(&Pod) -> Option<(String, T)> + Send + 'static,
    ) -> Self {
        let (tx, rx) = signal::channel(BTreeMap::new());
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let cfg = watcher::Config::default().labels(labels);
        let task = tokio::spawn(async move {
            let mut listed_tx = Some(listed_tx);
            let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
            while let Some(ev) = events.next().await {
                let pod = match ev {
                    Ok(watcher::Event::InitDone) => {
                        if let Some(t) = listed_tx.take() {
                            let _ = t.send(());
                        }
                        continue;
                    }
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                    _ => continue,
                };
                if let Some((key, v)) = seen(&pod) {
                    tx.send_if_modified(|m| {
                        if m.contains_key(&key) {
                            return false;
                        }
                        m.insert(key, (std::time::Instant::now(), v));
                        true
                    });
                }
            }
        });
        let _ = listed.await;
        Self { seen: rx, task }
    }

    /// Waits, at most `limit`, until every one of `keys` has been seen; what was seen then.
    pub async fn wait_all(
        &self,
        keys: &[String],
        limit: Duration,
    ) -> Option<BTreeMap<String, (std::time::Instant, T)>> {
        let mut rx = self.seen.clone();
        let all = rx.wait_for(|m| keys.iter().all(|k| m.contains_key(k)));
        tokio::time::timeout(limit, all).await.ok()?.ok()?;
        Some(self.seen.borrow().clone())
    }

    /// Waits, at most `limit`, until `key` has been seen.
    pub async fn wait_one(&self, key: &str, limit: Duration) -> Option<(std::time::Instant, T)> {
        let mut rx = self.seen.clone();
        tokio::time::timeout(limit, rx.wait_for(|m| m.contains_key(key)))
            .await
            .ok()?
            .ok()?
            .get(key)
            .cloned()
    }
}

impl<T> Drop for FirstSeen<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(nodes: &[&str]) -> BTreeSet<String> {
        nodes.iter().map(|n| n.to_string()).collect()
    }

    /// The counts kept event by event are the counts a walk over every subset gives.
    #[test]
    fn subsets_per_node_follow_every_change() {
        let mut m = Members::default();
        assert_eq!(m.set("a".into(), set(&["n1", "n2", "n3"])), 0);
        assert_eq!(m.set("b".into(), set(&["n1", "n4"])), 0);
        // n1 is replaced by n5 in a: one left, one joined.
        assert_eq!(m.set("a".into(), set(&["n5", "n2", "n3"])), 2);
        // The same members again: nothing moved.
        assert_eq!(m.set("b".into(), set(&["n1", "n4"])), 0);
        assert_eq!(m.set("b".into(), BTreeSet::new()), 2);
        assert_eq!(m.set("c".into(), set(&["n2"])), 0);
        for node in ["n1", "n2", "n3", "n4", "n5", "n6"] {
            let walked = m.by_revision.values().filter(|s| s.contains(node)).count();
            assert_eq!(m.subsets_of(node), walked, "{node}");
        }
        assert_eq!(m.subsets_of("n2"), 2);
        // Nodes in no subset are not kept.
        assert_eq!(m.subsets_of.len(), 3);
    }

    /// A revision's assignment is when it first had a member: not a later change, and not
    /// its creation without members.
    #[test]
    fn first_assignment_is_the_first_member_set() {
        let mut m = Members::default();
        m.set("a".into(), BTreeSet::new());
        assert!(!m.first_assigned.contains_key("a"));
        m.set("a".into(), set(&["n1"]));
        let first = m.first_assigned["a"];
        m.set("a".into(), set(&["n2", "n3"]));
        m.set("a".into(), BTreeSet::new());
        m.set("a".into(), set(&["n4"]));
        assert_eq!(m.first_assigned["a"], first);
        assert_eq!(m.first_assigned.len(), 1);
    }
}
