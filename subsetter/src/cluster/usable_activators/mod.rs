//! The usable activator set, kept from the activator pod and Node watches one event at a time
//! (`activators::ActivatorSet`), published to the reconciler and the load index, with the
//! settle times that tell a lost node from a control plane marking every node at once.
//!
//! The loop here only waits: for an event of either watch, for the settle of held losses, or
//! for a replacement's hold to run out. What each of those does is a method of
//! [`ActivatorWatch`] (`state.rs`).

mod publish;
mod state;

use std::sync::{Arc, Mutex, RwLock};

use crds::backoff::resilient;
use crds::contract::ACTIVATOR_SELECTOR;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use crate::cluster::control_plane::Aftermath;
use crate::cluster::metrics::Metrics;
use crate::cluster::synced::Synced;
use crate::cluster::triggers::Triggers;
use crate::pure::activators::Available;
use crate::pure::index::MembershipIndex;
pub use crate::pure::settle::{LOSS_SETTLE, OUTAGE_HOLD, RECOVERY_SETTLE};
use state::{ActivatorWatch, Outputs, Watched};

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
    sources: ActivatorSources,
    index: Arc<Mutex<MembershipIndex>>,
    available: Arc<RwLock<Arc<Available>>>,
    synced: Arc<watch::Sender<Synced>>,
    triggers: Triggers,
    metrics: Arc<Metrics>,
) {
    // No stores of the objects: the set keeps what it derives from them.
    let pod_events = resilient(watcher::watcher(
        sources.pods,
        watcher::Config::default().labels(ACTIVATOR_SELECTOR),
    ))
    .map(|e| e.map(|e| Watched::Pod(Box::new(e))));
    let node_events = resilient(watcher::watcher(sources.nodes, watcher::Config::default()))
        .map(|e| e.map(|e| Watched::Node(Box::new(e))));
    let mut events = std::pin::pin!(stream::select(pod_events, node_events));
    let outputs = Outputs {
        index,
        available,
        available_count: sources.available_count,
        synced,
        triggers,
        metrics,
    };
    let mut w = ActivatorWatch::new(outputs, sources.aftermath, sources.replacement_hold);
    loop {
        let (settle, due) = (w.settle_at(), w.replacement_due_at());
        let wake = tokio::select! {
            e = events.next() => Wake::Event(e),
            _ = sleep_until(settle.unwrap_or_else(Instant::now)), if settle.is_some() => Wake::Settled,
            _ = sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => Wake::ReplacementDue,
        };
        match wake {
            Wake::Event(Some(e)) => w.event(e),
            Wake::Event(None) => break,
            Wake::Settled => w.settled(),
            Wake::ReplacementDue => w.replacement_due(),
        }
    }
}
