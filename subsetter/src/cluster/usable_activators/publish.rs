//! Publishing a change of the usable activator set: the shared map and the membership index
//! updated where the set changed, and the revisions it concerns triggered.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;
use tracing::info;

use crate::cluster::metrics::Metrics;
use crate::cluster::triggers::{Triggers, trigger};
use crate::pure::activators::{self, Activator, Available};
use crate::pure::index::MembershipIndex;
use crate::pure::key::Key;
use keep_serving::{Locked, ReadWriteLocked};

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
pub(super) fn publish(
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
        let mut shared = available.write_locked();
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
        let mut ix = index.locked();
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
