//! The ActivationEndpoints watch, the one watch of them: the compact store a reconcile reads
//! (`store.rs`), the membership index, and a trigger of the owning Revision on each change
//! (what `.owns()` does, without a second watch).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};

use crds::backoff::resilient;
use crds::{ActivationEndpoints, Revision};
use futures::StreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tracing::warn;

use crate::cluster::member_stream::MemberHub;
use crate::cluster::metrics::Metrics;
use crate::cluster::synced::Synced;
use crate::cluster::triggers::Triggers;
use crate::cluster::watch::revisions::HostClaims;
use crate::pure::index::MembershipIndex;
use crate::pure::key::Key;
use crate::pure::store::AeStore;
use keep_serving::{Locked, ReadWriteLocked};

/// What the ActivationEndpoints events feed.
pub(crate) struct Fed {
    pub store: Arc<RwLock<AeStore>>,
    pub index: Arc<Mutex<MembershipIndex>>,
    pub claims: HostClaims,
    pub synced: Arc<watch::Sender<Synced>>,
    pub owners: Triggers,
    pub metrics: Arc<Metrics>,
    /// The membership streams (`member_stream`).
    pub hub: Arc<MemberHub>,
}

/// Keeps `store` and `index` from the ActivationEndpoints events, tells the streams, and
/// triggers the owners.
pub(crate) async fn watch_endpoints(api: Api<ActivationEndpoints>, fed: Fed) {
    let Fed {
        store,
        index,
        claims,
        synced,
        owners,
        metrics,
        hub,
    } = fed;
    let mut events = std::pin::pin!(resilient(watcher::watcher(api, watcher::Config::default())));
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                warn!(error = %e, "ActivationEndpoints watch");
                continue;
            }
        };
        let change = stored(&store, &event);
        streamed(&hub, &store, &event, change);
        if let Event::Apply(ae) | Event::Delete(ae) | Event::InitApply(ae) = &event {
            claims.endpoints_changed(&key_of(ae));
        }
        let mut ix = index.locked();
        match event {
            Event::Apply(ae) => {
                // A just-created object has no status yet (the status subresource is written
                // next); keep the members the reconciler reserved rather than zero.
                let key = key_of(&ae);
                if ae.status.is_some() || !ix.contains(&key) {
                    let (nodes, short) = crate::pure::index::entry_of(&ae);
                    ix.set(&key, nodes, short);
                }
                owners.send(owner_of(&ae));
            }
            Event::Delete(ae) => {
                ix.remove(&key_of(&ae));
                owners.send(owner_of(&ae));
            }
            Event::InitApply(ae) => {
                let (nodes, short) = crate::pure::index::entry_of(&ae);
                ix.set(&key_of(&ae), nodes, short);
            }
            Event::InitDone => {
                let keys: HashSet<Key> = store.read_locked().keys().cloned().collect();
                ix.retain(&keys);
                synced.send_modify(|s| s.endpoints = true);
            }
            Event::Init => {}
        }
        metrics.subsets.set(ix.len() as i64);
        metrics.subsets_short.set(ix.short_len() as i64);
    }
}

/// Takes `event` into the store (what a reconcile reads of each object, `store.rs`, not the
/// objects whole); for a change of one subset, how it was before and is now.
fn stored(store: &RwLock<AeStore>, event: &Event<ActivationEndpoints>) -> Option<Change> {
    let mut s = store.write_locked();
    let before = match event {
        Event::Apply(ae) | Event::Delete(ae) => Some(Seen::of(&s, &key_of(ae))),
        _ => None,
    };
    match event {
        Event::Apply(ae) => s.apply(ae),
        Event::Delete(ae) => s.delete(ae),
        Event::Init => s.relist_start(),
        Event::InitApply(ae) => s.relist_apply(ae),
        Event::InitDone => s.relist_done(),
    }
    before.map(|before| {
        let (now, object) = (Seen::of(&s, &before.key), s.stored(&before.key));
        Change {
            before,
            now,
            object,
        }
    })
}

/// One subset before and after a change, and the object as stored after it.
struct Change {
    before: Seen,
    now: Seen,
    object: Option<ActivationEndpoints>,
}

/// The streams hear of a change (`member_stream`), then of the version it brings the store
/// to: a bookmark never runs ahead of a queued change.
fn streamed(
    hub: &MemberHub,
    store: &RwLock<AeStore>,
    event: &Event<ActivationEndpoints>,
    change: Option<Change>,
) {
    if let (Some(c), Event::Apply(ae) | Event::Delete(ae)) = (&change, event) {
        publish(hub, ae, &c.before, &c.now, c.object.as_ref());
    }
    if matches!(event, Event::InitDone) {
        // A relist's changes were not seen one by one: the streams resume from their
        // versions, each with the changes since as its first state.
        hub.close_all();
    }
    if let Some(v) = store.read_locked().newest_version()
        && !matches!(event, Event::Init | Event::InitApply(_))
    {
        hub.advance(v);
    }
}

/// What a change of one subset is compared by: its member labels (the nodes it concerns) and
/// what decides its hosts.
struct Seen {
    key: Key,
    members: Vec<Arc<str>>,
    hosts: (Vec<Arc<str>>, Vec<crds::HostShare>),
}

impl Seen {
    fn of(store: &AeStore, key: &Key) -> Self {
        Self {
            key: key.clone(),
            members: store.member_labels(key),
            hosts: store.host_view(key),
        }
    }
}

/// Hands one change to the streams of the nodes it concerns, and a host change to all.
fn publish(
    hub: &MemberHub,
    ae: &ActivationEndpoints,
    before: &Seen,
    now: &Seen,
    object: Option<&ActivationEndpoints>,
) {
    let Some(rv) = ae
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    hub.changed(rv, &before.key, object, &before.members, &now.members);
    if before.hosts != now.hosts {
        let mut labels: Vec<String> = before
            .hosts
            .0
            .iter()
            .chain(&now.hosts.0)
            .map(|l| l.to_string())
            .collect();
        labels.sort();
        labels.dedup();
        hub.hosts_changed(rv, labels);
    }
}

/// The Revision an ActivationEndpoints belongs to (same name and namespace), as `.owns()`
/// would map it.
fn owner_of(ae: &ActivationEndpoints) -> ObjectRef<Revision> {
    ObjectRef::new(&ae.name_any()).within(&ae.namespace().unwrap_or_default())
}

fn key_of(ae: &ActivationEndpoints) -> Key {
    Key::new(ae.namespace().unwrap_or_default(), ae.name_any())
}
