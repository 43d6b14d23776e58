//! The Revision watch: keeps the cached store and the host index, and triggers a reconcile
//! when a revision's generation changes (not on the subsetter's own status writes), or when a
//! change of its hosts may flip another revision's `HostConflict`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crds::Revision;
use crds::backoff::resilient;
use futures::StreamExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use tracing::{debug, warn};

use crate::cluster::triggers::{Triggers, trigger};
use crate::pure::hosts::HostIndex;
use crate::pure::key::Key;
use crate::pure::written_status::WrittenStatuses;
use keep_serving::Locked;

/// The Revision watch: keeps the store, the host claims, and triggers a reconcile when a
/// revision's generation changes (the subsetter's own status writes do not).
pub(crate) async fn watch_revisions(
    api: Api<Revision>,
    writer: reflector::store::Writer<Revision>,
    mut claims: HostClaims,
    triggers: Triggers,
    written: Arc<Mutex<WrittenStatuses>>,
) {
    let mut generations: HashMap<ObjectRef<Revision>, Option<i64>> = HashMap::new();
    let mut events = std::pin::pin!(
        // Every watch here: bounded back-off, and a 410 re-lists at once (crds::backoff), so
        // the subsetter is back within a second or so of the API server's return.
        resilient(watcher::watcher(api, watcher::Config::default()))
            // Nothing reads these, and at 100,000 revisions they would be most of the store:
            // managedFields, and kubectl's copy of the whole object it applied.
            .modify(crds::unread::drop_unread_metadata::<Revision>)
            .reflect(writer)
    );
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                warn!(error = %e, "Revision watch");
                continue;
            }
        };
        claims.observe(&event);
        match event {
            Event::Apply(r) | Event::InitApply(r) => {
                let rk = Key::new(r.namespace().unwrap_or_default(), r.name_any());
                written
                    .locked()
                    .seen(&rk, r.metadata.resource_version.as_deref());
                let key = ObjectRef::from_obj(&r);
                let generation = r.metadata.generation;
                if generations.insert(key.clone(), generation) != Some(generation) {
                    triggers.send(key);
                }
            }
            Event::Delete(r) => {
                written
                    .locked()
                    .forget(&Key::new(r.namespace().unwrap_or_default(), r.name_any()));
                generations.remove(&ObjectRef::from_obj(&r));
            }
            Event::Init | Event::InitDone => {}
        }
    }
}

/// Keeps the host index from the Revision watch's events and triggers the revisions whose
/// `HostConflict` a change may flip. Triggers sent before the caches are synced are harmless:
/// reconciles wait for the sync.
#[derive(Clone)]
pub(crate) struct HostClaims {
    index: Arc<Mutex<HostIndex>>,
    triggers: Triggers,
    /// The revisions a relist in progress has shown so far.
    relist: Option<HashSet<Key>>,
}

impl HostClaims {
    pub(crate) fn new(index: Arc<Mutex<HostIndex>>, triggers: Triggers) -> Self {
        Self {
            index,
            triggers,
            relist: None,
        }
    }

    fn observe(&mut self, event: &Event<Revision>) {
        let key_of = |r: &Revision| Key::new(r.namespace().unwrap_or_default(), r.name_any());
        let created = |r: &Revision| {
            r.metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second())
        };
        let affected = {
            let mut ix = self.index.locked();
            match event {
                Event::Init => {
                    self.relist = Some(HashSet::new());
                    return;
                }
                Event::InitApply(r) => {
                    let key = key_of(r);
                    let affected = ix.upsert(&key, created(r), &r.spec.hosts);
                    if let Some(seen) = &mut self.relist {
                        seen.insert(key);
                    }
                    affected
                }
                Event::InitDone => match self.relist.take() {
                    Some(seen) => ix.retain(&seen),
                    None => return,
                },
                Event::Apply(r) => ix.upsert(&key_of(r), created(r), &r.spec.hosts),
                Event::Delete(r) => ix.remove(&key_of(r)),
            }
        };
        if !affected.is_empty() {
            debug!(revisions = affected.len(), "host claims changed");
        }
        trigger(&self.triggers, affected);
    }

    /// The ActivationEndpoints of `key` changed: whether it can take its hosts' traffic decides
    /// the older claimants' HostConflict (see `reconciler::host_conflicts`). Only contested
    /// hosts have older claimants, so most events trigger nothing.
    pub(crate) fn endpoints_changed(&self, key: &Key) {
        let older = self.index.locked().older_claimants(key);
        trigger(&self.triggers, older);
    }
}
