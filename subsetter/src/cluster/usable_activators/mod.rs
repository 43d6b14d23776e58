//! The usable activator set, kept from the activator pod and Node watches one event at a time
//! (`activators::ActivatorSet`), published to the reconciler and the load index, with the
//! settle times that tell a lost node from a control plane marking every node at once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, RwLock};

use crds::backoff::resilient;
use crds::contract::ACTIVATOR_SELECTOR;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::cluster::control_plane::Aftermath;
use crate::cluster::metrics::Metrics;
use crate::cluster::synced::Synced;
use crate::cluster::triggers::{Triggers, trigger};
use crate::pure::activators::{self, Activator, Available};
use crate::pure::index::MembershipIndex;
use crate::pure::key::Key;
use crate::pure::locks::{lock, read, write};
use crate::pure::loss_burst::LossBurst;
use crate::pure::replacements::Replacements;

/// An event of the activator pod watch or of the Node watch.
enum Watched {
    Pod(Box<Event<Pod>>),
    Node(Box<Event<Node>>),
}

/// What [`watch_activators`] watches, and the outage aftermath within which it reads a Node
/// NotReady as the outage's, not the node's (`Config::outage_hold`).
pub(crate) struct ActivatorSources {
    pub pods: Api<Pod>,
    pub nodes: Api<Node>,
    /// Losses to a Node NotReady within its hold of an outage's last sign are the outage's
    /// aftermath. Signs: a watch here that failed for want of the API server (not for an
    /// expired resourceVersion), and the `/readyz` probe's failures (`control_plane.rs`).
    pub aftermath: Aftermath,
    /// How many activators are published as usable, for whoever waits for a number of them
    /// (`Caches::wait_for_activators`).
    pub available_count: Arc<watch::Sender<usize>>,
    /// How long an activator lost on a Ready node stays a member, waiting for its replacement
    /// (`Config::replacement_hold`, `replacements.rs`).
    pub replacement_hold: std::time::Duration,
}

/// What woke the loop.
enum Wake<E> {
    Event(Option<E>),
    /// The losses held for [`LOSS_SETTLE`] (or an outage's aftermath) have settled.
    Settled,
    /// A hold for a replacement ran out.
    ReplacementDue,
}

/// Keeps the usable activator set from the activator pod and Node watches, one event at a
/// time (`activators::ActivatorSet`): a pod event recomputes that pod's node, a Node event that
/// node, and only a (re)list recomputes everything. What changed is published (the shared
/// `available` map and the membership index's load index, both updated only where the set
/// changed) and triggers the revisions it concerns.
pub(crate) async fn watch_activators(
    ActivatorSources {
        pods,
        nodes,
        aftermath,
        available_count,
        replacement_hold,
    }: ActivatorSources,
    index: Arc<Mutex<MembershipIndex>>,
    available: Arc<RwLock<Arc<Available>>>,
    synced: Arc<watch::Sender<Synced>>,
    triggers: Triggers,
    metrics: Arc<Metrics>,
) {
    // No stores of the objects: the set keeps what it derives from them.
    let pod_events = resilient(watcher::watcher(
        pods,
        watcher::Config::default().labels(ACTIVATOR_SELECTOR),
    ))
    .map(|e| e.map(|e| Watched::Pod(Box::new(e))));
    let node_events = resilient(watcher::watcher(nodes, watcher::Config::default()))
        .map(|e| e.map(|e| Watched::Node(Box::new(e))));
    let mut events = std::pin::pin!(stream::select(pod_events, node_events));
    let mut listed = (false, false);
    let mut set = activators::ActivatorSet::default();
    // Nodes whose activator was lost while most nodes were NotReady at once, kept published
    // until that ends (`ActivatorSet::disrupted`).
    let mut held: BTreeSet<String> = BTreeSet::new();
    // A loss is applied only after [`LOSS_SETTLE`], so that the first node of a mass NotReady
    // is not moved before the rest show it is a disruption.
    let mut settle: Option<tokio::time::Instant> = None;
    // NotReady nodes repaired at once: a few alone, not a burst (`loss_burst.rs`).
    let mut burst = LossBurst::default();
    // Activators lost on a Ready node, kept published while their replacement comes.
    let mut replacements = Replacements::new(replacement_hold, LOSS_SETTLE);
    loop {
        let due = replacements.next();
        let wake = tokio::select! {
            e = events.next() => Wake::Event(e),
            _ = tokio::time::sleep_until(settle.unwrap_or_else(tokio::time::Instant::now)), if settle.is_some() => Wake::Settled,
            _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => Wake::ReplacementDue,
        };
        let event = match wake {
            Wake::Event(Some(e)) => Some(e),
            Wake::Event(None) => break,
            Wake::Settled => None,
            Wake::ReplacementDue => {
                // Not replaced in time: lost after all, through the settle (which still tells
                // a disruption from a loss).
                let now = tokio::time::Instant::now();
                for node in replacements.due(now) {
                    if set.get(&node).is_none() {
                        warn!(
                            node,
                            hold_s = replacement_hold.as_secs_f64(),
                            "an activator lost on a Ready node was not replaced within its hold: \
                             its subsets are repaired"
                        );
                        metrics.replacement_holds_expired.inc();
                        held.insert(node);
                        settle = Some(settle.map_or(now, |s| s.min(now)));
                    }
                }
                metrics.held_for_replacement.set(replacements.len() as i64);
                continue;
            }
        };
        let Some(event) = event else {
            // The losses have settled: applied, unless most nodes are NotReady by now.
            if set.disrupted() {
                warn!(
                    held = ?held,
                    "most nodes are NotReady at once: a control-plane or network disruption, not \
                     node failures; their activators stay members until it ends"
                );
                metrics.disruption_holds.inc_by(held.len() as u64);
                settle = None;
                continue;
            }
            settle = None;
            let published = Arc::clone(&*read(&available));
            let mut diff = activators::diff(&published, set.available());
            // Still waiting for their replacement: not lost yet.
            diff.lost.retain(|n| !replacements.contains(n));
            held.clear();
            // Within an outage's aftermath (another watch failure may have extended it), a
            // node still NotReady stays held; anything else lost is repaired now.
            if let Some(end) = aftermath.ends() {
                held = diff
                    .lost
                    .iter()
                    .filter(|n| set.node_not_ready(n))
                    .cloned()
                    .collect();
                diff.lost.retain(|n| !held.contains(n));
                if !held.is_empty() {
                    settle = Some(end);
                }
            }
            publish(
                &diff,
                &set,
                (&available, &available_count),
                &index,
                &metrics,
                &triggers,
            );
            continue;
        };
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                if !crds::backoff::is_gone(&e) {
                    aftermath.sign();
                }
                warn!(error = %e, "activator pod or node watch");
                continue;
            }
        };
        // A relist (Init, InitApply..., InitDone) replaces the pods or the Nodes when it is
        // complete, as a reflector store would.
        // The nodes whose terminating pods this event may have changed: the pod's, or every
        // node after a relist.
        let mut pods_of: Option<Vec<String>> = None;
        let diff = match event {
            Watched::Pod(e) => match *e {
                Event::Apply(p) => {
                    pods_of = Some(activators::bound_node(&p).into_iter().collect());
                    set.apply_pod(&p)
                }
                Event::Delete(p) => {
                    pods_of = Some(activators::bound_node(&p).into_iter().collect());
                    set.delete_pod(&p)
                }
                Event::Init => {
                    set.relist_pods_start();
                    continue;
                }
                Event::InitApply(p) => {
                    set.relist_pod(&p);
                    continue;
                }
                Event::InitDone => {
                    listed.0 = true;
                    pods_of = Some(replacements.nodes().cloned().collect());
                    set.relist_pods_done()
                }
            },
            Watched::Node(e) => match *e {
                Event::Apply(n) => set.apply_node(&n),
                Event::Delete(n) => set.delete_node(&n.name_any()),
                Event::Init => {
                    set.relist_nodes_start();
                    continue;
                }
                Event::InitApply(n) => {
                    set.relist_node(&n);
                    continue;
                }
                Event::InitDone => {
                    listed.1 = true;
                    set.relist_nodes_done()
                }
            },
        };
        if !(listed.0 && listed.1) {
            continue;
        }
        let first = !synced.borrow().pods;
        if first {
            // Publishing the first set before the flag: reconciles start only after it.
            let next = set.available();
            *write(&available) = Arc::new(Available::from(next.clone()));
            lock(&index).set_available(next);
            metrics.activators.set(next.len() as i64);
            available_count.send_replace(next.len());
            synced.send_modify(|s| {
                s.pods = true;
                s.nodes = true;
            });
            info!(activators = next.len(), "activator set synced");
            continue;
        }
        // A held node's old pod terminating, or gone: the hold runs until its grace period
        // ends, or from now (`replacements.rs`).
        for node in pods_of.iter().flatten() {
            if replacements.contains(node) {
                match set.terminating_until(node) {
                    Some(ends) => replacements.terminating(node, instant_of(ends)),
                    None => replacements.gone(node, tokio::time::Instant::now()),
                }
            }
        }
        // A Node event that changes no activator may still end a hold (below).
        if diff.is_empty() && replacements.is_empty() {
            continue;
        }
        // Most nodes NotReady at once is the control plane's (or the network's) trouble, not
        // theirs: moving every subset would cost every warm revision a cold start on nodes
        // no healthier than the last. A Node NotReady alone is repaired at once; any other
        // loss (more NotReady nodes than a lone failure's budget, an activator pod gone or
        // unready on a Ready node: a rollout, a crash) waits [`LOSS_SETTLE`] (the
        // controller-manager marks the nodes and their pods within a pass of its monitor)
        // and is held while most nodes are NotReady; when that ends the whole set is
        // compared with what was published.
        let mut diff = diff;
        let now = tokio::time::Instant::now();
        // A held node whose Node turned NotReady or was deleted failed, or left: lost as
        // such (`replacements.rs`), unless its activator is back meanwhile.
        let failed: Vec<String> = replacements
            .nodes()
            .filter(|n| !set.node_known_ready(n) && set.get(n).is_none())
            .cloned()
            .collect();
        for node in failed {
            replacements.end(&node);
            diff.lost.insert(node);
        }
        // An activator lost on a Ready node is being replaced or restarted: held.
        if replacements.enabled() && !set.disrupted() {
            let replaced: Vec<String> = diff
                .lost
                .iter()
                .filter(|n| set.node_known_ready(n) && !held.contains(*n))
                .cloned()
                .collect();
            for node in replaced {
                diff.lost.remove(&node);
                replacements.lost(&node, now);
                if let Some(ends) = set.terminating_until(&node) {
                    replacements.terminating(&node, instant_of(ends));
                }
                metrics.replacement_holds.inc();
                info!(
                    node,
                    hold_s = replacement_hold.as_secs_f64(),
                    "an activator lost on a Ready node: kept as a member while its replacement \
                     comes"
                );
            }
        }
        // A held node's activator is back: the published one is replaced by it (a new pod,
        // a new address: its subsets are written again), or is the same (a container that
        // restarted).
        let back: Vec<String> = diff
            .added
            .iter()
            .filter(|n| replacements.contains(n))
            .cloned()
            .collect();
        if !back.is_empty() {
            let published = Arc::clone(&*read(&available));
            for node in back {
                replacements.end(&node);
                diff.added.remove(&node);
                if published.get(&node) != set.get(&node) {
                    diff.changed.insert(node);
                }
            }
        }
        metrics.held_for_replacement.set(replacements.len() as i64);
        let mut at_once = BTreeSet::new();
        if !diff.lost.is_empty() {
            if set.disrupted() && settle.is_none() {
                warn!(
                    held = ?diff.lost,
                    "most nodes are NotReady at once: a control-plane or network disruption, not \
                     node failures; their activators stay members until it ends"
                );
                metrics.disruption_holds.inc_by(diff.lost.len() as u64);
            }
            // A Node NotReady soon after an outage, though only one: the controller-manager
            // marks each node whose kubelet has not renewed its lease since (after a 30 s etcd
            // outage, one node of three for 6 s on the repo's cluster); its kubelet clears it
            // at its next report. Held until the aftermath is over, then compared.
            if let Some(end) = aftermath.ends().filter(|_| !set.disrupted()) {
                let marked: Vec<&String> =
                    diff.lost.iter().filter(|n| set.node_not_ready(n)).collect();
                if !marked.is_empty() {
                    warn!(
                        held = ?marked,
                        for_s = (end - tokio::time::Instant::now()).as_secs_f64(),
                        "Nodes NotReady right after a control-plane outage: their kubelets have \
                         not renewed since; their activators stay members until the aftermath \
                         is over"
                    );
                    metrics.disruption_holds.inc_by(marked.len() as u64);
                    settle = Some(settle.map_or(end, |s| s.max(end)));
                }
            }
            // Outside an outage's aftermath and a disruption, NotReady nodes within the
            // budget of lone failures are repaired now.
            if !set.disrupted() && aftermath.ends().is_none() {
                let failed: BTreeSet<String> = diff
                    .lost
                    .iter()
                    .filter(|n| set.node_not_ready(n))
                    .cloned()
                    .collect();
                let nodes = read(&available).len();
                if !failed.is_empty()
                    && burst.admit(tokio::time::Instant::now(), failed.len(), nodes)
                {
                    diff.lost.retain(|n| !failed.contains(n));
                    at_once = failed;
                }
            }
            held.append(&mut diff.lost);
            if !held.is_empty() && settle.is_none() && !set.disrupted() {
                settle = Some(tokio::time::Instant::now() + LOSS_SETTLE);
            }
        }
        diff.lost = at_once;
        if !held.is_empty() && settle.is_none() && !set.disrupted() {
            // The disruption is over: the kubelets report again within their status sync
            // (10 s), clearing the controller-manager's marks; what is still gone after
            // [`RECOVERY_SETTLE`] is lost.
            info!(
                held = ?held,
                "the disruption is over: held activators are compared with the watches in {:?}",
                RECOVERY_SETTLE
            );
            settle = Some(tokio::time::Instant::now() + RECOVERY_SETTLE);
        }
        // Held nodes that came back, or changed, are not the published ones' news yet.
        diff.changed.retain(|n| !held.contains(n));
        diff.added.retain(|n| !held.contains(n));
        if diff.is_empty() {
            continue;
        }
        publish(
            &diff,
            &set,
            (&available, &available_count),
            &index,
            &metrics,
            &triggers,
        );
    }
}

/// How long a lost activator waits before its subsets are repaired: long enough for a mass
/// NotReady (the controller-manager marks every stale node, then their pods, in one pass) to
/// show itself, short beside the node-monitor grace period (40 s) a node failure already
/// takes to be seen.
pub const LOSS_SETTLE: std::time::Duration = std::time::Duration::from_secs(3);

/// How long after its watches failed for want of the API server the subsetter takes a Node
/// NotReady for the outage's aftermath (`Config::outage_hold`): the node-monitor grace
/// period (40 s) after the lease a kubelet renewed last before the outage, plus its renewal
/// interval (10 s) and a margin; a node that really failed meanwhile is repaired this much
/// later.
pub const OUTAGE_HOLD: std::time::Duration = std::time::Duration::from_secs(60);

/// How long held activators wait after a disruption ends before what is still gone is
/// repaired: the kubelets' status sync (10 s) clears the controller-manager's unready marks.
pub const RECOVERY_SETTLE: std::time::Duration = std::time::Duration::from_secs(15);

/// `at` (the API server's clock) on this process's monotonic clock: now for a time past.
fn instant_of(at: k8s_openapi::jiff::Timestamp) -> tokio::time::Instant {
    let ahead = at.duration_since(k8s_openapi::jiff::Timestamp::now());
    let now = tokio::time::Instant::now();
    std::time::Duration::try_from(ahead).map_or(now, |d| now + d)
}

/// Whether two states of one node's activator differ in more than the node's images.
fn same_placement(old: &Activator, new: &Activator) -> bool {
    old.address == new.address
        && old.pod == new.pod
        && match (&old.facts, &new.facts) {
            (Some(o), Some(n)) => o.same_placement(n),
            (None, None) => true,
            _ => false,
        }
}

/// Applies `diff` (from `set`) to the published activators and the membership index, and
/// triggers the revisions it concerns.
fn publish(
    diff: &activators::Diff,
    set: &activators::ActivatorSet,
    (available, count): (&Arc<RwLock<Arc<Available>>>, &watch::Sender<usize>),
    index: &Arc<Mutex<MembershipIndex>>,
    metrics: &Metrics,
    triggers: &Triggers,
) {
    if diff.is_empty() {
        return;
    }
    // Only the nodes that changed. A reconcile holding the previous map (planning with
    // it) makes this a copy; otherwise the map is changed in place.
    let changes: Vec<(&String, Option<Activator>, Option<&Activator>)> = {
        let mut shared = write(available);
        let map = Arc::make_mut(&mut *shared);
        diff.lost
            .iter()
            .chain(&diff.changed)
            .chain(&diff.added)
            .map(|node| {
                let new = set.get(node);
                let old = match new {
                    Some(a) => map.insert(node.clone(), a.clone()),
                    None => map.remove(node),
                };
                (node, old, new)
            })
            .collect()
    };
    let targets: BTreeSet<Key> = {
        let mut ix = lock(index);
        for (node, old, new) in &changes {
            ix.update_available(node, old.as_ref(), *new);
        }
        let mut t = BTreeSet::new();
        for node in diff.lost.iter().chain(&diff.changed) {
            t.extend(ix.revisions_on(node));
        }
        // A new activator, or a node that changed (a taint lifted, a label added), may
        // be what a short subset was waiting for; a node that only pulled or dropped an
        // image is not (its own subsets are planned above: their image count changed).
        let placement_changed = changes.iter().any(|(_, old, new)| match (old, new) {
            (Some(o), Some(n)) => !same_placement(o, n),
            _ => false,
        });
        if !diff.added.is_empty() || placement_changed {
            t.extend(ix.short());
        }
        t
    };
    metrics.activators.set(set.available().len() as i64);
    count.send_replace(set.available().len());
    info!(
        lost = ?diff.lost,
        changed = ?diff.changed,
        added = ?diff.added,
        revisions = targets.len(),
        "activator set changed"
    );
    trigger(triggers, targets);
}
