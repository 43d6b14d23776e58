//! The activator watch between events: the set, the losses held and until when, the nodes
//! waiting for a replacement. One method per thing that can happen (a pod or Node event, a
//! watch failure, the first complete list, the settle, a replacement's hold running out),
//! each deciding with the pure parts (`activators`, `replacements`, `loss_burst`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, RwLock};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::publish::publish;
use crate::cluster::control_plane::Aftermath;
use crate::cluster::metrics::Metrics;
use crate::cluster::synced::Synced;
use crate::cluster::triggers::Triggers;
use crate::pure::activators::{self, ActivatorSet, Available, Diff};
use crate::pure::index::MembershipIndex;
use crate::pure::loss_burst::LossBurst;
use crate::pure::replacements::Replacements;
use crate::pure::settle::{LOSS_SETTLE, RECOVERY_SETTLE};
use keep_serving::{Locked, ReadWriteLocked};

/// An event of the activator pod watch or of the Node watch.
pub(super) enum Watched {
    Pod(Box<Event<Pod>>),
    Node(Box<Event<Node>>),
}

/// Where the watch publishes the set, and what it tells when.
pub(super) struct Outputs {
    pub(super) index: Arc<Mutex<MembershipIndex>>,
    pub(super) available: Arc<RwLock<Arc<Available>>>,
    pub(super) available_count: Arc<watch::Sender<usize>>,
    pub(super) synced: Arc<watch::Sender<Synced>>,
    pub(super) triggers: Triggers,
    pub(super) metrics: Arc<Metrics>,
}

/// The state [`super::watch_activators`] keeps between events.
pub(super) struct ActivatorWatch {
    out: Outputs,
    aftermath: Aftermath,
    replacement_hold: std::time::Duration,
    /// Whether the pod watch and the Node watch have each had their first list.
    listed: (bool, bool),
    set: ActivatorSet,
    /// Nodes whose activator was lost while most nodes were NotReady at once, kept published
    /// until that ends (`ActivatorSet::disrupted`).
    held: BTreeSet<String>,
    /// A loss is applied only after [`LOSS_SETTLE`], so that the first node of a mass NotReady
    /// is not moved before the rest show it is a disruption.
    settle: Option<Instant>,
    /// NotReady nodes repaired at once: a few alone, not a burst (`loss_burst.rs`).
    burst: LossBurst,
    /// Activators lost on a Ready node, kept published while their replacement comes.
    replacements: Replacements,
}

impl ActivatorWatch {
    pub(super) fn new(
        out: Outputs,
        aftermath: Aftermath,
        replacement_hold: std::time::Duration,
    ) -> Self {
        Self {
            out,
            aftermath,
            replacement_hold,
            listed: (false, false),
            set: ActivatorSet::default(),
            held: BTreeSet::new(),
            settle: None,
            burst: LossBurst::default(),
            replacements: Replacements::new(replacement_hold, LOSS_SETTLE),
        }
    }

    /// When the held losses settle, if any are held.
    pub(super) fn settle_at(&self) -> Option<Instant> {
        self.settle
    }

    /// When the first replacement's hold runs out, if any node waits for one.
    pub(super) fn replacement_due_at(&self) -> Option<Instant> {
        self.replacements.next().map(Instant::from_std)
    }

    /// Holds for a replacement ran out: those nodes are lost after all, through the settle
    /// (which still tells a disruption from a loss).
    pub(super) fn replacement_due(&mut self) {
        let now = Instant::now();
        for node in self.replacements.due(now.into_std()) {
            if self.set.get(&node).is_none() {
                warn!(
                    node,
                    hold_s = self.replacement_hold.as_secs_f64(),
                    "an activator lost on a Ready node was not replaced within its hold: \
                     its subsets are repaired"
                );
                self.out.metrics.replacement_holds_expired.inc();
                self.held.insert(node);
                self.settle = Some(self.settle.map_or(now, |s| s.min(now)));
            }
        }
        self.out
            .metrics
            .held_for_replacement
            .set(self.replacements.len() as i64);
    }

    /// The held losses have settled: applied, unless most nodes are NotReady by now.
    pub(super) fn settled(&mut self) {
        if self.set.disrupted() {
            warn!(
                held = ?self.held,
                "most nodes are NotReady at once: a control-plane or network disruption, not \
                 node failures; their activators stay members until it ends"
            );
            self.out
                .metrics
                .disruption_holds
                .inc_by(self.held.len() as u64);
            self.settle = None;
            return;
        }
        self.settle = None;
        let published = Arc::clone(&*self.out.available.read_locked());
        let mut diff = activators::diff(&published, self.set.available());
        // Still waiting for their replacement: not lost yet.
        diff.lost.retain(|n| !self.replacements.contains(n));
        self.held.clear();
        // Within an outage's aftermath (another watch failure may have extended it), a
        // node still NotReady stays held; anything else lost is repaired now.
        if let Some(end) = self.aftermath.ends() {
            self.held = diff
                .lost
                .iter()
                .filter(|n| self.set.node_not_ready(n))
                .cloned()
                .collect();
            diff.lost.retain(|n| !self.held.contains(n));
            if !self.held.is_empty() {
                self.settle = Some(end);
            }
        }
        self.publish(&diff);
    }

    /// An event of either watch, or its failure.
    pub(super) fn event(&mut self, event: Result<Watched, watcher::Error>) {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                if !crds::backoff::is_gone(&e) {
                    self.aftermath.sign();
                }
                warn!(error = %e, "activator pod or node watch");
                return;
            }
        };
        let applied = match event {
            Watched::Pod(e) => self.pod_event(*e),
            Watched::Node(e) => self.node_event(*e),
        };
        let Some((diff, pods_of)) = applied else {
            return;
        };
        if !(self.listed.0 && self.listed.1) {
            return;
        }
        if !self.out.synced.borrow().pods {
            self.publish_first();
            return;
        }
        self.changed(diff, pods_of);
    }

    /// A pod event applied to the set: what it changed, and the nodes whose terminating pods
    /// it may have changed (the pod's, or every held node after a relist). None within a
    /// relist: a relist (Init, InitApply..., InitDone) replaces the pods when it is complete,
    /// as a reflector store would.
    fn pod_event(&mut self, event: Event<Pod>) -> Option<(Diff, Option<Vec<String>>)> {
        let set = &mut self.set;
        Some(match event {
            Event::Apply(p) => {
                let pods_of = activators::bound_node(&p).into_iter().collect();
                (set.apply_pod(&p), Some(pods_of))
            }
            Event::Delete(p) => {
                let pods_of = activators::bound_node(&p).into_iter().collect();
                (set.delete_pod(&p), Some(pods_of))
            }
            Event::Init => {
                set.relist_pods_start();
                return None;
            }
            Event::InitApply(p) => {
                set.relist_pod(&p);
                return None;
            }
            Event::InitDone => {
                self.listed.0 = true;
                let pods_of = self.replacements.nodes().cloned().collect();
                (set.relist_pods_done(), Some(pods_of))
            }
        })
    }

    /// A Node event applied to the set: what it changed (None within a relist, as for pods).
    fn node_event(&mut self, event: Event<Node>) -> Option<(Diff, Option<Vec<String>>)> {
        let set = &mut self.set;
        Some(match event {
            Event::Apply(n) => (set.apply_node(&n), None),
            Event::Delete(n) => (set.delete_node(&n.name_any()), None),
            Event::Init => {
                set.relist_nodes_start();
                return None;
            }
            Event::InitApply(n) => {
                set.relist_node(&n);
                return None;
            }
            Event::InitDone => {
                self.listed.1 = true;
                (set.relist_nodes_done(), None)
            }
        })
    }

    /// Both watches have listed for the first time: the whole set published, before the
    /// flag (reconciles start only after it).
    fn publish_first(&mut self) {
        let next = self.set.available();
        *self.out.available.write_locked() = Arc::new(Available::from(next.clone()));
        self.out.index.locked().set_available(next);
        self.out.metrics.activators.set(next.len() as i64);
        self.out.available_count.send_replace(next.len());
        self.out.synced.send_modify(|s| {
            s.pods = true;
            s.nodes = true;
        });
        info!(activators = next.len(), "activator set synced");
    }

    /// The set changed by `diff` (an event after the first list): what is held, what is
    /// repaired at once, what is published.
    ///
    /// Most nodes NotReady at once is the control plane's (or the network's) trouble, not
    /// theirs: moving every subset would cost every warm revision a cold start on nodes no
    /// healthier than the last. A Node NotReady alone is repaired at once; any other loss
    /// (more NotReady nodes than a lone failure's budget, an activator pod gone or unready on
    /// a Ready node: a rollout, a crash) waits [`LOSS_SETTLE`] (the controller-manager marks
    /// the nodes and their pods within a pass of its monitor) and is held while most nodes
    /// are NotReady; when that ends the whole set is compared with what was published.
    fn changed(&mut self, mut diff: Diff, pods_of: Option<Vec<String>>) {
        self.follow_old_pods(pods_of.iter().flatten());
        // A Node event that changes no activator may still end a hold (below).
        if diff.is_empty() && self.replacements.is_empty() {
            return;
        }
        let now = Instant::now();
        self.end_failed_holds(&mut diff);
        self.hold_for_replacement(&mut diff, now);
        self.take_back(&mut diff);
        self.out
            .metrics
            .held_for_replacement
            .set(self.replacements.len() as i64);
        let at_once = if diff.lost.is_empty() {
            BTreeSet::new()
        } else {
            self.hold_losses(&mut diff)
        };
        diff.lost = at_once;
        self.after_disruption();
        // Held nodes that came back, or changed, are not the published ones' news yet.
        diff.changed.retain(|n| !self.held.contains(n));
        diff.added.retain(|n| !self.held.contains(n));
        if diff.is_empty() {
            return;
        }
        self.publish(&diff);
    }

    /// A held node's old pod terminating, or gone: the hold runs until its grace period
    /// ends, or from now (`replacements.rs`).
    fn follow_old_pods<'a>(&mut self, nodes: impl Iterator<Item = &'a String>) {
        for node in nodes {
            if self.replacements.contains(node) {
                match self.set.terminating_until(node) {
                    Some(ends) => self.replacements.terminating(node, instant_of(ends)),
                    None => self.replacements.gone(node, Instant::now().into_std()),
                }
            }
        }
    }

    /// A held node whose Node turned NotReady or was deleted failed, or left: lost as such
    /// (`replacements.rs`), unless its activator is back meanwhile.
    fn end_failed_holds(&mut self, diff: &mut Diff) {
        let failed: Vec<String> = self
            .replacements
            .nodes()
            .filter(|n| !self.set.node_known_ready(n) && self.set.get(n).is_none())
            .cloned()
            .collect();
        for node in failed {
            self.replacements.end(&node);
            diff.lost.insert(node);
        }
    }

    /// An activator lost on a Ready node is being replaced or restarted: held.
    fn hold_for_replacement(&mut self, diff: &mut Diff, now: Instant) {
        if !self.replacements.enabled() || self.set.disrupted() {
            return;
        }
        let replaced: Vec<String> = diff
            .lost
            .iter()
            .filter(|n| self.set.node_known_ready(n) && !self.held.contains(*n))
            .cloned()
            .collect();
        for node in replaced {
            diff.lost.remove(&node);
            self.replacements.lost(&node, now.into_std());
            if let Some(ends) = self.set.terminating_until(&node) {
                self.replacements.terminating(&node, instant_of(ends));
            }
            self.out.metrics.replacement_holds.inc();
            info!(
                node,
                hold_s = self.replacement_hold.as_secs_f64(),
                "an activator lost on a Ready node: kept as a member while its replacement \
                 comes"
            );
        }
    }

    /// A held node's activator is back: the published one is replaced by it (a new pod, a new
    /// address: its subsets are written again), or is the same (a container that restarted).
    fn take_back(&mut self, diff: &mut Diff) {
        let back: Vec<String> = diff
            .added
            .iter()
            .filter(|n| self.replacements.contains(n))
            .cloned()
            .collect();
        if back.is_empty() {
            return;
        }
        let published = Arc::clone(&*self.out.available.read_locked());
        for node in back {
            self.replacements.end(&node);
            diff.added.remove(&node);
            if published.get(&node) != self.set.get(&node) {
                diff.changed.insert(node);
            }
        }
    }

    /// Losses (`diff.lost`, not empty): held, but for NotReady nodes within the budget of lone
    /// failures outside an outage's aftermath and a disruption, which are returned to be
    /// repaired at once.
    fn hold_losses(&mut self, diff: &mut Diff) -> BTreeSet<String> {
        let mut at_once = BTreeSet::new();
        if self.set.disrupted() && self.settle.is_none() {
            warn!(
                held = ?diff.lost,
                "most nodes are NotReady at once: a control-plane or network disruption, not \
                 node failures; their activators stay members until it ends"
            );
            self.out
                .metrics
                .disruption_holds
                .inc_by(diff.lost.len() as u64);
        }
        self.hold_outage_marks(diff);
        if !self.set.disrupted() && self.aftermath.ends().is_none() {
            let failed: BTreeSet<String> = diff
                .lost
                .iter()
                .filter(|n| self.set.node_not_ready(n))
                .cloned()
                .collect();
            let nodes = self.out.available.read_locked().len();
            if !failed.is_empty()
                && self
                    .burst
                    .admit(Instant::now().into_std(), failed.len(), nodes)
            {
                diff.lost.retain(|n| !failed.contains(n));
                at_once = failed;
            }
        }
        self.held.append(&mut diff.lost);
        if !self.held.is_empty() && self.settle.is_none() && !self.set.disrupted() {
            self.settle = Some(Instant::now() + LOSS_SETTLE);
        }
        at_once
    }

    /// A Node NotReady soon after an outage, though only one: the controller-manager marks
    /// each node whose kubelet has not renewed its lease since (after a 30 s etcd outage, one
    /// node of three for 6 s on the repo's cluster); its kubelet clears it at its next report.
    /// Held until the aftermath is over, then compared.
    fn hold_outage_marks(&mut self, diff: &Diff) {
        let Some(end) = self.aftermath.ends().filter(|_| !self.set.disrupted()) else {
            return;
        };
        let marked: Vec<&String> = diff
            .lost
            .iter()
            .filter(|n| self.set.node_not_ready(n))
            .collect();
        if !marked.is_empty() {
            warn!(
                held = ?marked,
                for_s = (end - Instant::now()).as_secs_f64(),
                "Nodes NotReady right after a control-plane outage: their kubelets have \
                 not renewed since; their activators stay members until the aftermath \
                 is over"
            );
            self.out
                .metrics
                .disruption_holds
                .inc_by(marked.len() as u64);
            self.settle = Some(self.settle.map_or(end, |s| s.max(end)));
        }
    }

    /// The disruption is over: the kubelets report again within their status sync (10 s),
    /// clearing the controller-manager's marks; what is still gone after [`RECOVERY_SETTLE`]
    /// is lost.
    fn after_disruption(&mut self) {
        if !self.held.is_empty() && self.settle.is_none() && !self.set.disrupted() {
            info!(
                held = ?self.held,
                "the disruption is over: held activators are compared with the watches in {:?}",
                RECOVERY_SETTLE
            );
            self.settle = Some(Instant::now() + RECOVERY_SETTLE);
        }
    }

    fn publish(&self, diff: &Diff) {
        let out = &self.out;
        publish(
            diff,
            &self.set,
            (&out.available, &out.available_count),
            &out.index,
            &out.metrics,
            &out.triggers,
        );
    }
}

/// `at` (the API server's clock) on this process's monotonic clock: now for a time past.
fn instant_of(at: k8s_openapi::jiff::Timestamp) -> std::time::Instant {
    let ahead = at.duration_since(k8s_openapi::jiff::Timestamp::now());
    let now = Instant::now();
    std::time::Duration::try_from(ahead)
        .map_or(now, |d| now + d)
        .into_std()
}
