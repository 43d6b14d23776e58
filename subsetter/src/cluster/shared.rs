//! The caches a replica keeps whether it leads or not, as one value: the watches fill them
//! (`controller.rs`), the reconciler plans from them, and it writes ahead of the watch into the
//! index and the store (what it reserved and wrote, until the watch shows it).

use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;

use crate::pure::activators::Available;
use crate::pure::hosts::HostIndex;
use crate::pure::index::MembershipIndex;
use crate::pure::queue::Queued;
use crate::pure::store::AeStore;

/// Handles to the shared caches; a clone shares them.
#[derive(Clone)]
pub(crate) struct SharedCaches {
    /// Who is in which subset, and each activator's load (`index.rs`).
    pub(crate) index: Arc<Mutex<MembershipIndex>>,
    /// The hosts each revision claims (`hosts.rs`).
    pub(crate) hosts: Arc<Mutex<HostIndex>>,
    /// The usable activators. A reconcile plans with the set it took; a change meanwhile
    /// copies it rather than changing it under the plan (`controller::publish`).
    pub(crate) activators: Arc<RwLock<Arc<Available>>>,
    /// The ActivationEndpoints as the watch shows them, and what the reconciler wrote while
    /// the watch lags (`store.rs`).
    pub(crate) ae_store: Arc<RwLock<AeStore>>,
    /// True once the activator, node, namespace and ActivationEndpoints watches have each had
    /// their first list: before that an empty cache would read as "no activators".
    pub(crate) synced: watch::Receiver<bool>,
    /// Revisions triggered and not started yet (`queue.rs`).
    pub(crate) queued: Arc<Queued>,
    /// Until when the aftermath of a control-plane outage lasts (`Config::outage_hold` after
    /// its last sign: a watch that failed for want of the API server, or a failed `/readyz`):
    /// no rebalancing meanwhile, since a moved member's cold start waits on kubelets whose
    /// own watches are still backing off.
    pub(crate) aftermath: crate::cluster::control_plane::Aftermath,
    /// Revision statuses written and not shown by the watch yet (`written_status.rs`).
    pub(crate) written_statuses: Arc<Mutex<crate::pure::written_status::WrittenStatuses>>,
    /// How many activators `activators` holds, published on each change.
    pub(crate) available_count: Arc<watch::Sender<usize>>,
    /// Routes' shares of hosts by revision, and the pods their moves wait for
    /// (`route_index.rs`).
    pub(crate) routes: Arc<Mutex<crate::pure::route_index::RouteIndex>>,
    /// Ready app pods by revision (`ready_pods.rs`).
    pub(crate) ready_pods: Arc<Mutex<crate::pure::ready_pods::ReadyPods>>,
    /// Wakes the leader's route pass (a Route changed, a waited-on revision's pods did).
    pub(crate) route_wake: Arc<tokio::sync::Notify>,
}

impl SharedCaches {
    /// Empty caches that `synced` says are ready once filled, counting the triggers in
    /// `queued`, whose outage aftermath lasts `outage_hold` from its last sign.
    pub(crate) fn new(
        synced: watch::Receiver<bool>,
        queued: Arc<Queued>,
        outage_hold: std::time::Duration,
    ) -> Self {
        let aftermath = crate::cluster::control_plane::Aftermath::new(outage_hold);
        Self {
            index: Arc::default(),
            hosts: Arc::default(),
            activators: Arc::default(),
            ae_store: Arc::default(),
            synced,
            queued,
            aftermath,
            available_count: Arc::new(watch::Sender::new(0)),
            written_statuses: Arc::default(),
            routes: Arc::default(),
            ready_pods: Arc::default(),
            route_wake: Arc::default(),
        }
    }
}
