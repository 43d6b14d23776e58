//! Where the caches send the revisions a change concerns. Its own module, below both the
//! watches that send and the leader that receives, so neither imports the other.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use crds::Revision;
use futures::channel::mpsc::UnboundedSender;
use kube::runtime::reflector::ObjectRef;

use crate::cluster::namespaces::Selected;
use crate::pure::key::Key;
use crate::pure::queue::Queued;
use keep_serving::Locked;

/// Where the caches send the revisions a change concerns: to the leading controller, or
/// nowhere while this replica is a standby (taking the lead reconciles everything anyway).
/// What is sent is counted as queued until its reconcile starts (`queue.rs`).
#[derive(Clone)]
pub(crate) struct Triggers {
    tx: Arc<Mutex<Option<UnboundedSender<ObjectRef<Revision>>>>>,
    pub(crate) queued: Arc<Queued>,
    /// Revisions outside it are left to another subsetter (`namespaces.rs`).
    selected: Selected,
}

impl Triggers {
    pub(crate) fn new(queued: Arc<Queued>, selected: Selected) -> Self {
        Self {
            tx: Arc::default(),
            queued,
            selected,
        }
    }

    pub(crate) fn send(&self, r: ObjectRef<Revision>) {
        if !self
            .selected
            .allows(r.namespace.as_deref().unwrap_or_default())
        {
            return;
        }
        if let Some(tx) = &*self.tx.locked() {
            // Counted before it is sent: the reconcile that takes it out may start at once.
            let key = Key::new(r.namespace.clone().unwrap_or_default(), r.name.clone());
            self.queued.entered(key.clone());
            if tx.unbounded_send(r).is_err() {
                self.queued.left(&key);
            }
        }
    }

    /// This replica leads: triggers go to `tx`, the controller's.
    pub(crate) fn lead(&self, tx: UnboundedSender<ObjectRef<Revision>>) {
        *self.tx.locked() = Some(tx);
    }

    /// The controller stopped: its queue is gone with it.
    pub(crate) fn follow(&self) {
        let mut tx = self.tx.locked();
        *tx = None;
        self.queued.clear();
    }
}

/// Triggers each of `keys`.
pub(crate) fn trigger(triggers: &Triggers, keys: BTreeSet<Key>) {
    for key in keys {
        triggers.send(ObjectRef::new(&key.name).within(&key.namespace));
    }
}
