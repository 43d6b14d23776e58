//! The pools of this node's revisions, by revision: where a request finds its revision's
//! [`Pool`], and where a pool is made and its scaler ([`crate::node::scaler`]) started. It
//! lives apart from the pool so that the pool does not know its scaler: the scaler drives a
//! pool through the pool's own methods, and this map is the one place that pairs them.

use std::sync::Arc;

use crds::{ActivatorMember, Revision};
use dashmap::DashMap;

use crate::node::pool::{Pool, Shared, Spec};
use crate::node::scaler;
use crds::ObjectKey as RevisionKey;

/// The pools of this node's revisions.
#[derive(Clone)]
pub struct Pools {
    map: Arc<DashMap<RevisionKey, Arc<Pool>>>,
    shared: Arc<Shared>,
}

impl Pools {
    pub fn new(shared: Shared) -> Self {
        Self {
            map: Arc::new(DashMap::new()),
            shared: Arc::new(shared),
        }
    }

    /// The revision's pool, made (and its scaler started) if it has none.
    pub fn get(
        &self,
        key: &RevisionKey,
        rev: &Arc<Revision>,
        me: &Arc<ActivatorMember>,
    ) -> Arc<Pool> {
        if let Some(p) = self.map.get(key)
            && !p.is_retired()
        {
            return p.clone();
        }
        // None yet, or a retired one its scaler has not removed yet (it retires under the
        // pool's lock and leaves the map a moment later): replace it here, in one step, so
        // a request never finds the retired pool again.
        let fresh = || {
            let pool = Pool::new(key.clone(), rev.clone(), me.clone(), self.shared.clone());
            scaler::spawn(pool.clone(), self.map.clone());
            pool
        };
        match self.map.entry(key.clone()) {
            dashmap::Entry::Occupied(mut o) => {
                if o.get().is_retired() {
                    o.insert(fresh());
                }
                o.get().clone()
            }
            dashmap::Entry::Vacant(v) => v.insert(fresh()).clone(),
        }
    }

    /// Whether the revision has a pod here that takes requests now (a member that is not
    /// the revision's primary serves only then; [`crate::pipeline::primary`]).
    pub fn has_usable_pod(&self, key: &RevisionKey) -> bool {
        self.map.get(key).is_some_and(|p| p.has_usable_pod())
    }

    /// The spec of the revision's pool when it has a pod here that takes requests now: a
    /// node that was a member a moment ago still serves what a peer forwarded to it from its
    /// own pod, rather than refusing it while the subset moves.
    pub fn usable_spec(&self, key: &RevisionKey) -> Option<Spec> {
        self.map.get(key)?.usable_spec()
    }

    /// Pools alive now (revisions with pods or requests on this node).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}
