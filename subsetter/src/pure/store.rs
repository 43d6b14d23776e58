//! The ActivationEndpoints the subsetter keeps between reconciles: per object only what a
//! reconcile reads, with the strings that repeat across objects shared.
//!
//! A reflector store would keep every object whole: at 100,000 revisions that was most of the
//! subsetter's memory (about 2.4 KiB an object in `subsetter bench`, and more on a real API
//! server, whose objects also carry managedFields). A reconcile reads the members, the
//! conditions, the policy and observedGeneration (the plan compares the whole status), the
//! labels (the label patch, a host's winner), the resourceVersion (whether the store lags its
//! own writes), the uid and the controller owner's uid. [`Compact`] keeps those, with what
//! repeats interned ([`Interner`]), since 100,000 subsets of 3 share 5,000 nodes' strings and a
//! handful of condition messages: a member's (node, address, pod) is one shared value, found
//! with one lookup, and so are a condition's four words; label keys and the policy are shared
//! strings, and the empty label value is shared without a lookup.
//! [`AeStore::current`] gives a reconcile an `ActivationEndpoints` rebuilt from it, so the plan
//! reads the same object it did.
//!
//! The store also remembers what the reconciler itself wrote ([`AeStore::wrote`]) while the
//! watch has not caught up: a policy fed the stale members could pick other replacements
//! (needless churn). That copy is dropped as soon as the watch shows a newer version.
//!
//! Pure: the watch applies events ([`AeStore::apply`], [`AeStore::delete`], the relist calls),
//! the reconciler reads.

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use crds::{ActivationEndpoints, ActivationEndpointsStatus, ActivatorMember, Revision};
use foldhash::HashMap as FastMap;
use foldhash::HashSet as FastSet;
use hashbrown::HashTable;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::{Resource, ResourceExt};

use crate::pure::key::Key;

/// One table of shared values, found by a hash and an equality on a borrowed form (so a lookup
/// that hits allocates nothing). An entry no object uses any more is dropped at the next sweep,
/// which runs when the table has doubled since the last one.
#[derive(Debug)]
struct Table<T: ?Sized> {
    items: HashTable<Arc<T>>,
    swept_at: usize,
}

impl<T: ?Sized> Default for Table<T> {
    fn default() -> Self {
        Self {
            items: HashTable::new(),
            swept_at: 0,
        }
    }
}

impl<T: ?Sized> Table<T> {
    /// The shared value `hash` and `is` find, else the one `make` gives (then kept); `hash_of`
    /// hashes a kept value as `hash` was computed.
    fn get(
        &mut self,
        hash: u64,
        is: impl Fn(&T) -> bool,
        make: impl FnOnce() -> Arc<T>,
        hash_of: impl Fn(&T) -> u64,
    ) -> Arc<T> {
        if let Some(a) = self.items.find(hash, |a| is(a)) {
            return Arc::clone(a);
        }
        if self.items.len() >= 2 * self.swept_at.max(1024) {
            self.items.retain(|a| Arc::strong_count(a) > 1);
            self.swept_at = self.items.len();
        }
        let a = make();
        self.items
            .insert_unique(hash, Arc::clone(&a), |a| hash_of(a));
        a
    }
}

/// What a member says of its activator: the same for every subset the node is in, so it is
/// shared whole (one lookup per member, not one per string).
#[derive(Debug, PartialEq, Eq)]
struct Endpoint {
    node: Box<str>,
    address: Box<str>,
    pod: Box<str>,
}

/// The words of a condition: a handful of distinct ones across all objects.
#[derive(Debug, PartialEq, Eq)]
struct CondText {
    type_: Box<str>,
    status: Box<str>,
    reason: Box<str>,
    message: Box<str>,
}

/// Shared copies of what many objects carry: strings (label keys and values, the policy), the
/// members' (node, address, pod) and the conditions' words. The empty string (every label's
/// value) is shared without a lookup.
#[derive(Debug)]
pub struct Interner {
    hasher: foldhash::fast::RandomState,
    strings: Table<str>,
    endpoints: Table<Endpoint>,
    conditions: Table<CondText>,
    empty: Arc<str>,
}

impl Default for Interner {
    fn default() -> Self {
        Self {
            hasher: Default::default(),
            strings: Table::default(),
            endpoints: Table::default(),
            conditions: Table::default(),
            empty: Arc::from(""),
        }
    }
}

impl Interner {
    pub fn get(&mut self, s: &str) -> Arc<str> {
        if s.is_empty() {
            return Arc::clone(&self.empty);
        }
        let h = &self.hasher;
        self.strings.get(
            h.hash_one(s),
            |a| a == s,
            || Arc::from(s),
            |a| h.hash_one(a),
        )
    }

    fn endpoint(&mut self, m: &ActivatorMember) -> Arc<Endpoint> {
        let h = &self.hasher;
        let hash_of = |node: &str, address: &str, pod: &str| h.hash_one((node, address, pod));
        self.endpoints.get(
            hash_of(&m.node, &m.address, &m.pod),
            |e| *e.node == *m.node && *e.address == *m.address && *e.pod == *m.pod,
            || {
                Arc::new(Endpoint {
                    node: m.node.as_str().into(),
                    address: m.address.as_str().into(),
                    pod: m.pod.as_str().into(),
                })
            },
            |e| hash_of(&e.node, &e.address, &e.pod),
        )
    }

    fn condition(&mut self, c: &Condition) -> Arc<CondText> {
        let h = &self.hasher;
        let hash_of = |t: &str, s: &str, r: &str, m: &str| h.hash_one((t, s, r, m));
        self.conditions.get(
            hash_of(&c.type_, &c.status, &c.reason, &c.message),
            |t| {
                *t.type_ == *c.type_
                    && *t.status == *c.status
                    && *t.reason == *c.reason
                    && *t.message == *c.message
            },
            || {
                Arc::new(CondText {
                    type_: c.type_.as_str().into(),
                    status: c.status.as_str().into(),
                    reason: c.reason.as_str().into(),
                    message: c.message.as_str().into(),
                })
            },
            |t| hash_of(&t.type_, &t.status, &t.reason, &t.message),
        )
    }

    /// Distinct values kept (strings, members' endpoints, conditions' words).
    pub fn len(&self) -> usize {
        self.strings.items.len() + self.endpoints.items.len() + self.conditions.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Member {
    endpoint: Arc<Endpoint>,
    max_pods: i32,
    min_pods: i32,
}

#[derive(Clone, Debug, PartialEq)]
struct Cond {
    text: Arc<CondText>,
    last_transition_time: Time,
    observed_generation: Option<i64>,
}

#[derive(Clone, Debug, PartialEq)]
struct Status {
    members: Box<[Member]>,
    policy: Option<Arc<str>>,
    observed_generation: Option<i64>,
    conditions: Box<[Cond]>,
    image_members: Option<crds::ImageMembers>,
    /// Routes' shares: rare (only revisions a Route splits), kept as they are.
    routes: Box<[crds::HostShare]>,
}

/// What the subsetter keeps of one ActivationEndpoints.
#[derive(Clone, Debug, PartialEq)]
pub struct Compact {
    resource_version: Option<Box<str>>,
    uid: Option<Box<str>>,
    /// The uid of its controller (ownerReference with `controller: true`).
    controller: Option<Box<str>>,
    labels: Box<[(Arc<str>, Arc<str>)]>,
    status: Option<Status>,
}

impl Compact {
    pub fn of(ae: &ActivationEndpoints, strings: &mut Interner) -> Self {
        let status = ae.status.as_ref().map(|s| Status {
            members: s
                .activators
                .iter()
                .map(|m| Member {
                    endpoint: strings.endpoint(m),
                    max_pods: m.max_pods,
                    min_pods: m.min_pods,
                })
                .collect(),
            policy: s.policy.as_deref().map(|p| strings.get(p)),
            observed_generation: s.observed_generation,
            conditions: s
                .conditions
                .iter()
                .map(|c| Cond {
                    text: strings.condition(c),
                    last_transition_time: c.last_transition_time.clone(),
                    observed_generation: c.observed_generation,
                })
                .collect(),
            image_members: s.image_members,
            routes: s.routes.iter().cloned().collect(),
        });
        Self {
            resource_version: ae.metadata.resource_version.as_deref().map(Box::from),
            uid: ae.metadata.uid.as_deref().map(Box::from),
            controller: ae
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .map(|o| Box::from(o.uid.as_str())),
            labels: ae
                .labels()
                .iter()
                .map(|(k, v)| (strings.get(k), strings.get(v)))
                .collect(),
            status,
        }
    }

    /// The object as a reconcile reads it: name, namespace, labels, resourceVersion, uid, a
    /// controller ownerReference to a Revision of the same name (its uid is what is checked),
    /// and the status.
    pub fn object(&self, key: &Key) -> ActivationEndpoints {
        let mut ae = ActivationEndpoints::new(&key.name, Default::default());
        ae.metadata.namespace = Some(key.namespace.clone());
        ae.metadata.resource_version = self.resource_version.as_deref().map(str::to_owned);
        ae.metadata.uid = self.uid.as_deref().map(str::to_owned);
        ae.metadata.owner_references = self.controller.as_deref().map(|uid| {
            vec![OwnerReference {
                api_version: Revision::api_version(&()).into_owned(),
                kind: Revision::kind(&()).into_owned(),
                name: key.name.clone(),
                uid: uid.to_owned(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]
        });
        if !self.labels.is_empty() {
            ae.metadata.labels = Some(
                self.labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            );
        }
        ae.status = self.status.as_ref().map(|s| ActivationEndpointsStatus {
            activators: s
                .members
                .iter()
                .map(|m| ActivatorMember {
                    node: m.endpoint.node.to_string(),
                    address: m.endpoint.address.to_string(),
                    pod: m.endpoint.pod.to_string(),
                    max_pods: m.max_pods,
                    min_pods: m.min_pods,
                })
                .collect(),
            policy: s.policy.as_deref().map(str::to_owned),
            observed_generation: s.observed_generation,
            conditions: s
                .conditions
                .iter()
                .map(|c| Condition {
                    type_: c.text.type_.to_string(),
                    status: c.text.status.to_string(),
                    reason: c.text.reason.to_string(),
                    message: c.text.message.to_string(),
                    last_transition_time: c.last_transition_time.clone(),
                    observed_generation: c.observed_generation,
                })
                .collect(),
            image_members: s.image_members,
            routes: s.routes.to_vec(),
        });
        ae
    }

    pub fn has_label(&self, key: &str) -> bool {
        self.labels.iter().any(|(k, _)| &**k == key)
    }

    /// Its labels naming a member node.
    fn member_labels(&self) -> impl Iterator<Item = &(Arc<str>, Arc<str>)> {
        self.labels
            .iter()
            .filter(|(k, _)| k.starts_with(crds::contract::MEMBER_LABEL_PREFIX))
    }

    fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }
}

/// What the reconciler wrote, and every resourceVersion it wrote over: while the watch still
/// shows one of those, the store is older than the API.
#[derive(Debug)]
struct Written {
    stale: Vec<Option<String>>,
    object: Compact,
}

impl Written {
    fn is_stale(&self, rv: Option<&str>) -> bool {
        self.stale.iter().any(|s| s.as_deref() == rv)
    }
}

/// The ActivationEndpoints by revision, as the watch shows them (see the module docs).
#[derive(Debug, Default)]
pub struct AeStore {
    /// Boxed: the table's entries stay small, so growing it (at 100,000 objects) moves and
    /// faults in a third of the bytes.
    /// Keys shared (`Arc`) with the member-label index below, which then costs a pointer
    /// per membership (300,000 at 100,000 revisions) rather than a copy of two strings.
    objects: FastMap<Arc<Key>, Box<Compact>>,
    written: FastMap<Key, Written>,
    strings: Interner,
    /// The objects a relist in progress has shown so far.
    relist: Option<FastMap<Arc<Key>, Box<Compact>>>,
    /// The newest resourceVersion among the objects and deletions the watch has shown
    /// ([`AeStore::members`]); the relist's own until it is done.
    newest: Newest,
    relist_newest: Newest,
    /// The objects carrying each member label, as the watch showed them: a starting
    /// activator's memberships ([`AeStore::members`]) are found among its node's, not by a
    /// scan of every object (at 100,000 subsets a DaemonSet rollout's hundred starts at once
    /// scanned ten million objects between them).
    by_member_label: FastMap<Arc<str>, FastSet<Filed>>,
}

/// A key as the member-label index files it: the very `Arc` the objects map holds, compared
/// and hashed by address. Filing and unfiling 300,000 memberships then hashes a pointer, not
/// two strings, and a set growing past its capacity rehashes pointers (the strings' hashing
/// was a tenth of `subsetter bench`'s assignment). Sound because an object's key is one
/// allocation for as long as the object is stored: `apply` reuses the stored `Arc`, `delete`
/// unfiles with the `Arc` it removes, and a relist refiles everything from its own.
#[derive(Clone, Debug)]
struct Filed(Arc<Key>);

impl PartialEq for Filed {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Filed {}

impl std::hash::Hash for Filed {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state);
    }
}

/// The newest of the resourceVersions seen, read as etcd's revisions (the numbers a real API
/// server and kubesim give). One that is not a number makes it unknown until a relist shows
/// only numbers: versions are opaque to clients, and an order this store cannot tell is no
/// version to watch from.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum Newest {
    #[default]
    None,
    At(u64),
    Opaque,
}

impl Newest {
    fn see(&mut self, rv: Option<&str>) {
        let Some(rv) = rv else { return };
        *self = match (*self, rv.parse::<u64>()) {
            (Self::Opaque, _) | (_, Err(_)) => Self::Opaque,
            (Self::None, Ok(n)) => Self::At(n),
            (Self::At(m), Ok(n)) => Self::At(m.max(n)),
        };
    }
}

/// The subsets carrying a member label, as [`AeStore::members`] answers.
#[derive(Debug, Clone, PartialEq)]
pub struct MembersSnapshot {
    /// No object in `items` is newer, and the watch has shown every change up to it.
    pub resource_version: String,
    pub items: Vec<ActivationEndpoints>,
}

/// Files `key` under each member label `c` carries.
fn index_add(index: &mut FastMap<Arc<str>, FastSet<Filed>>, key: &Arc<Key>, c: &Compact) {
    for (label, _) in c.member_labels() {
        let filed = Filed(Arc::clone(key));
        match index.get_mut(&**label) {
            Some(keys) => {
                keys.insert(filed);
            }
            None => {
                index.entry(label.clone()).or_default().insert(filed);
            }
        }
    }
}

/// Takes `key` out from under the member labels `old` carried and `now` (its replacement,
/// already filed) does not.
fn index_remove(
    index: &mut FastMap<Arc<str>, FastSet<Filed>>,
    key: &Arc<Key>,
    old: &Compact,
    now: Option<&Compact>,
) {
    for (label, _) in old.member_labels() {
        if now.is_some_and(|n| n.has_label(label)) {
            continue;
        }
        if let Some(keys) = index.get_mut(&**label) {
            keys.remove(&Filed(Arc::clone(key)));
            if keys.is_empty() {
                index.remove(&**label);
            }
        }
    }
}

fn key_of(ae: &ActivationEndpoints) -> Key {
    Key::new(ae.namespace().unwrap_or_default(), ae.name_any())
}

impl AeStore {
    /// The watch saw `ae` created or changed.
    pub fn apply(&mut self, ae: &ActivationEndpoints) {
        let key = key_of(ae);
        let compact = Compact::of(ae, &mut self.strings);
        self.settle(&key, compact.resource_version());
        self.newest.see(compact.resource_version());
        let key = match self.objects.get_key_value(&key) {
            Some((shared, _)) => shared.clone(),
            None => Arc::new(key),
        };
        index_add(&mut self.by_member_label, &key, &compact);
        if let Some(old) = self.objects.insert(key.clone(), Box::new(compact)) {
            let now = self.objects.get(&*key).map(|c| &**c);
            index_remove(&mut self.by_member_label, &key, &old, now);
        }
    }

    /// The watch saw `ae` deleted.
    pub fn delete(&mut self, ae: &ActivationEndpoints) {
        let key = key_of(ae);
        self.newest.see(ae.metadata.resource_version.as_deref());
        if let Some((shared, old)) = self.objects.remove_entry(&key) {
            index_remove(&mut self.by_member_label, &shared, &old, None);
        }
        self.written.remove(&key);
    }

    /// A relist begins: its objects replace the store's at [`Self::relist_done`].
    pub fn relist_start(&mut self) {
        self.relist = Some(FastMap::default());
        self.relist_newest = Newest::None;
    }

    /// An object of the relist.
    pub fn relist_apply(&mut self, ae: &ActivationEndpoints) {
        let compact = Compact::of(ae, &mut self.strings);
        if let Some(r) = &mut self.relist {
            self.relist_newest.see(compact.resource_version());
            r.insert(Arc::new(key_of(ae)), Box::new(compact));
        }
    }

    /// The relist is complete: it is the store now.
    pub fn relist_done(&mut self) {
        let Some(objects) = self.relist.take() else {
            return;
        };
        self.objects = objects;
        self.by_member_label.clear();
        for (key, c) in &self.objects {
            index_add(&mut self.by_member_label, key, c);
        }
        // The list's own version is at least its newest object's: a watch from there replays
        // what came between, which changes nothing a replay ends on.
        self.newest = self.relist_newest;
        let objects = &self.objects;
        self.written
            .retain(|k, w| w.is_stale(objects.get(k).and_then(|c| c.resource_version())));
    }

    /// The reconciler wrote `object` over the versions `stale` (the one it read first).
    /// Remembered unless the watch has already shown something newer.
    pub fn wrote(&mut self, key: &Key, stale: Vec<Option<String>>, object: &ActivationEndpoints) {
        let written = Written {
            stale,
            object: Compact::of(object, &mut self.strings),
        };
        if written.is_stale(self.objects.get(key).and_then(|c| c.resource_version())) {
            self.written.insert(key.clone(), written);
        } else {
            self.written.remove(key);
        }
    }

    /// Forget what the reconciler wrote for `key` (its write may not have happened).
    pub fn forget_written(&mut self, key: &Key) {
        self.written.remove(key);
    }

    /// The watch shows version `rv` of `key`: what the reconciler wrote is no longer ahead.
    fn settle(&mut self, key: &Key, rv: Option<&str>) {
        if self.written.get(key).is_some_and(|w| !w.is_stale(rv)) {
            self.written.remove(key);
        }
    }

    fn newest(&self, key: &Key) -> Option<&Compact> {
        let stored = self.objects.get(key).map(|c| &**c);
        match self.written.get(key) {
            Some(w) if w.is_stale(stored.and_then(Compact::resource_version)) => Some(&w.object),
            _ => stored,
        }
    }

    /// The object a reconcile of `key` plans from: what the reconciler wrote while the watch
    /// lags behind it, else what the watch showed.
    pub fn current(&self, key: &Key) -> Option<ActivationEndpoints> {
        self.newest(key).map(|c| c.object(key))
    }

    /// What the watch showed of `key` (not the reconciler's own writes).
    pub fn stored(&self, key: &Key) -> Option<ActivationEndpoints> {
        self.objects.get(key).map(|c| c.object(key))
    }

    /// Every object carrying `label`, as the watch showed them (never the reconciler's own
    /// writes ahead of it: a version newer than the watch's would hide the changes in
    /// between), and the newest version the watch has shown: what a list selecting `label`
    /// gives, and a version to watch it from. None while no version is known, or the
    /// versions are not numbers. Read from the label's index (where the API server's own
    /// list scans every object), under one read of the store, so the objects and the version
    /// agree.
    pub fn members(&self, label: &str) -> Option<MembersSnapshot> {
        let Newest::At(newest) = self.newest else {
            return None;
        };
        let items = self
            .by_member_label
            .get(label)
            .into_iter()
            .flatten()
            .filter_map(|Filed(k)| self.objects.get(&**k).map(|c| c.object(k)))
            .collect();
        Some(MembersSnapshot {
            resource_version: newest.to_string(),
            items,
        })
    }

    /// The objects [`AeStore::members`] answers, found by a scan of every object (as the API
    /// server's own label-selected list finds them): the index's reference, for its property
    /// test and `subsetter bench`.
    pub fn members_scanned(&self, label: &str) -> Vec<ActivationEndpoints> {
        self.objects
            .iter()
            .filter(|(_, c)| c.has_label(label))
            .map(|(k, c)| c.object(k))
            .collect()
    }

    /// The member labels of `key` as the watch showed it (empty when it has none or is gone):
    /// the nodes a change of it concerns.
    pub fn member_labels(&self, key: &Key) -> Vec<Arc<str>> {
        self.objects
            .get(key)
            .map(|c| c.member_labels().map(|(k, _)| k.clone()).collect())
            .unwrap_or_default()
    }

    /// What of `key` decides which revision a host goes to, as the watch showed it: its host
    /// labels and its Routes' shares. A change of it may move a host.
    pub fn host_view(&self, key: &Key) -> (Vec<Arc<str>>, Vec<crds::HostShare>) {
        let Some(c) = self.objects.get(key) else {
            return Default::default();
        };
        let labels = c
            .labels
            .iter()
            .filter(|(k, _)| k.starts_with(crds::contract::HOST_LABEL_PREFIX))
            .map(|(k, _)| k.clone())
            .collect();
        let routes = c
            .status
            .as_ref()
            .map(|s| s.routes.to_vec())
            .unwrap_or_default();
        (labels, routes)
    }

    /// The newest version the watch has shown, as a number (None before any, or when
    /// versions are not numbers).
    pub fn newest_version(&self) -> Option<u64> {
        match self.newest {
            Newest::At(v) => Some(v),
            _ => None,
        }
    }

    /// What the watch showed of `key`, if it carries `label`.
    pub fn stored_with_label(&self, key: &Key, label: &str) -> Option<ActivationEndpoints> {
        let c = self.objects.get(key)?;
        c.has_label(label).then(|| c.object(key))
    }

    /// Whether the newest version of `key` carries the label `label`.
    pub fn has_label(&self, key: &Key, label: &str) -> bool {
        self.newest(key).is_some_and(|c| c.has_label(label))
    }

    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.objects.keys().map(|k| &**k)
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Distinct strings shared by the objects kept.
    pub fn interned(&self) -> usize {
        self.strings.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn ae(name: &str, rv: &str, nodes: &[&str]) -> ActivationEndpoints {
        let mut ae = ActivationEndpoints::new(name, Default::default());
        ae.metadata.namespace = Some("ns".into());
        ae.metadata.resource_version = Some(rv.into());
        ae.metadata.uid = Some(format!("uid-{name}"));
        ae.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "local-activator.dev/v1alpha1".into(),
            kind: "Revision".into(),
            name: name.into(),
            uid: format!("rev-uid-{name}"),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        ae.metadata.labels = Some(
            nodes
                .iter()
                .map(|n| (crds::contract::member_label(n), String::new()))
                .collect(),
        );
        ae.status = Some(ActivationEndpointsStatus {
            activators: nodes
                .iter()
                .map(|n| ActivatorMember {
                    node: (*n).into(),
                    address: format!("{n}.local:8080"),
                    pod: format!("activator-{n}"),
                    max_pods: 2,
                    min_pods: 1,
                })
                .collect(),
            policy: Some("least-loaded".into()),
            observed_generation: Some(3),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "SubsetAssigned".into(),
                message: "2 activator(s) assigned".into(),
                last_transition_time: Time(Timestamp::from_second(100).unwrap()),
                observed_generation: Some(3),
            }],
            image_members: Some(crds::ImageMembers { holding: 1, of: 2 }),
            routes: vec![crds::HostShare {
                host: "shop.test".into(),
                percent: 90,
            }],
        });
        ae
    }

    #[test]
    fn a_reconcile_reads_what_the_watch_showed() {
        let mut s = AeStore::default();
        let a = ae("r1", "5", &["n1", "n2"]);
        s.apply(&a);
        let key = Key::new("ns", "r1");
        let got = s.current(&key).unwrap();
        assert_eq!(got.status, a.status);
        assert_eq!(got.metadata.labels, a.metadata.labels);
        assert_eq!(got.metadata.resource_version, a.metadata.resource_version);
        assert_eq!(got.metadata.uid, a.metadata.uid);
        assert_eq!(got.metadata.name, a.metadata.name);
        assert_eq!(got.metadata.namespace, a.metadata.namespace);
        let owner = |o: &ActivationEndpoints| {
            o.owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .map(|o| o.uid.clone())
        };
        assert_eq!(owner(&got), owner(&a));
        assert!(s.has_label(&key, &crds::contract::member_label("n1")));
        assert!(!s.has_label(&key, &crds::contract::member_label("n3")));
        // An object without status, labels or owner stays without them.
        let mut bare = ActivationEndpoints::new("r2", Default::default());
        bare.metadata.namespace = Some("ns".into());
        s.apply(&bare);
        let got = s.current(&Key::new("ns", "r2")).unwrap();
        assert!(got.status.is_none() && got.metadata.labels.is_none());
        assert!(got.owner_references().is_empty());
    }

    #[test]
    fn objects_share_their_strings() {
        let mut s = AeStore::default();
        for i in 0..100 {
            s.apply(&ae(&format!("r{i}"), "1", &["n1", "n2"]));
        }
        // Two nodes' (name, address, pod) and label, the policy and the condition's words:
        // not 100 of each (the empty label value is shared without a table).
        assert_eq!(s.interned(), 2 * 2 + 1 + 1);
        let status = |i: usize| {
            s.objects[&Key::new("ns", format!("r{i}"))]
                .status
                .clone()
                .unwrap()
        };
        let (a, b) = (status(0), status(99));
        for (x, y) in a.members.iter().zip(b.members.iter()) {
            assert!(Arc::ptr_eq(&x.endpoint, &y.endpoint));
        }
        assert!(Arc::ptr_eq(&a.conditions[0].text, &b.conditions[0].text));
    }

    #[test]
    fn a_member_whose_address_changed_is_another_endpoint() {
        let mut strings = Interner::default();
        let member = |address: &str| ActivatorMember {
            node: "n1".into(),
            address: address.into(),
            pod: "activator-n1".into(),
            max_pods: 0,
            min_pods: 0,
        };
        let old = strings.endpoint(&member("10.0.0.1:8080"));
        let new = strings.endpoint(&member("10.0.0.2:8080"));
        assert!(!Arc::ptr_eq(&old, &new));
        assert_eq!(&*new.address, "10.0.0.2:8080");
        assert!(Arc::ptr_eq(
            &old,
            &strings.endpoint(&member("10.0.0.1:8080"))
        ));
        assert!(Arc::ptr_eq(&strings.get(""), &strings.get("")));
        assert_eq!(strings.len(), 2);
    }

    #[test]
    fn the_reconcilers_write_is_read_until_the_watch_shows_a_newer_version() {
        let mut s = AeStore::default();
        let key = Key::new("ns", "r1");
        s.apply(&ae("r1", "5", &["n1", "n2"]));
        // Written over 5 (status, giving 6) and 6 (labels, giving 7).
        let mine = ae("r1", "7", &["n1", "n3"]);
        s.wrote(&key, vec![Some("5".into()), Some("6".into())], &mine);
        assert_eq!(s.current(&key).unwrap().status, mine.status);
        assert!(s.has_label(&key, &crds::contract::member_label("n3")));
        // The watch shows 6: still behind.
        s.apply(&ae("r1", "6", &["n1", "n3"]));
        assert_eq!(
            s.current(&key)
                .unwrap()
                .metadata
                .resource_version
                .as_deref(),
            Some("7")
        );
        // It shows 7 (or anything newer): the watch is the truth again, and the copy is gone.
        let theirs = ae("r1", "8", &["n4", "n3"]);
        s.apply(&theirs);
        assert_eq!(s.current(&key).unwrap().status, theirs.status);
        assert!(s.written.is_empty());
        // A write the watch has already overtaken is not remembered.
        s.wrote(&key, vec![Some("5".into())], &mine);
        assert!(s.written.is_empty());
        // Nor one whose write may have failed.
        s.wrote(&key, vec![Some("8".into())], &mine);
        s.forget_written(&key);
        assert_eq!(s.current(&key).unwrap().status, theirs.status);
    }

    #[test]
    fn a_create_is_read_before_the_watch_shows_it_and_a_delete_forgets_it() {
        let mut s = AeStore::default();
        let key = Key::new("ns", "r1");
        let mine = ae("r1", "2", &["n1"]);
        s.wrote(&key, vec![None, Some("1".into())], &mine);
        assert_eq!(s.current(&key).unwrap().status, mine.status);
        assert!(s.stored(&key).is_none());
        s.delete(&mine);
        assert!(s.current(&key).is_none());
    }

    #[test]
    fn a_relist_replaces_everything_at_its_end() {
        let mut s = AeStore::default();
        s.apply(&ae("r1", "1", &["n1"]));
        s.apply(&ae("r2", "1", &["n1"]));
        s.relist_start();
        s.relist_apply(&ae("r2", "3", &["n2"]));
        assert_eq!(s.len(), 2, "the old objects until the relist is complete");
        s.relist_done();
        assert_eq!(
            s.keys().cloned().collect::<Vec<_>>(),
            vec![Key::new("ns", "r2")]
        );
        let r2 = s.current(&Key::new("ns", "r2")).unwrap();
        assert_eq!(r2.metadata.resource_version.as_deref(), Some("3"));
    }

    #[test]
    fn strings_no_object_uses_are_swept() {
        let mut strings = Interner::default();
        for i in 0..5000 {
            drop(strings.get(&format!("s{i}")));
        }
        let kept = strings.get("kept");
        assert!(strings.len() < 2100, "{}", strings.len());
        assert!(Arc::ptr_eq(&kept, &strings.get("kept")));
    }

    #[test]
    fn members_are_what_the_watch_showed_with_the_newest_version() {
        let label = crds::contract::member_label("n1");
        let mut s = AeStore::default();
        assert_eq!(s.members(&label), None, "no version seen yet");
        s.apply(&ae("a", "7", &["n1", "n2"]));
        s.apply(&ae("b", "9", &["n2", "n3"]));
        s.apply(&ae("c", "8", &["n1"]));
        let m = s.members(&label).expect("versions seen");
        assert_eq!(
            m.resource_version, "9",
            "the newest of all, not only of n1's"
        );
        let mut names: Vec<_> = m.items.iter().map(|o| o.name_any()).collect();
        names.sort();
        assert_eq!(names, ["a", "c"]);
        assert_eq!(
            m.items.iter().find(|o| o.name_any() == "a"),
            Some(&s.stored(&Key::new("ns", "a")).unwrap())
        );

        // The reconciler's own write, ahead of the watch, is not answered: its version would
        // skip the changes the watch has not shown yet.
        s.wrote(
            &Key::new("ns", "b"),
            vec![Some("9".into())],
            &ae("b", "12", &["n1", "n3"]),
        );
        let m = s.members(&label).unwrap();
        assert_eq!(m.resource_version, "9");
        assert_eq!(m.items.len(), 2);

        // A deletion's version counts; a relist replaces the version with its own.
        s.delete(&ae("c", "15", &["n1"]));
        let m = s.members(&label).unwrap();
        assert_eq!((m.resource_version.as_str(), m.items.len()), ("15", 1));
        s.relist_start();
        s.relist_apply(&ae("a", "7", &["n1"]));
        assert_eq!(
            s.members(&label).unwrap().resource_version,
            "15",
            "until the relist is done"
        );
        s.relist_done();
        assert_eq!(s.members(&label).unwrap().resource_version, "7");

        // A version that is not a number: no version to watch from, for good.
        s.apply(&ae("d", "x1", &["n1"]));
        s.apply(&ae("e", "20", &["n1"]));
        assert_eq!(s.members(&label), None);
    }

    /// One watch event or relist step, for the index property below.
    #[derive(Debug, Clone)]
    enum Op {
        Apply(u8, Vec<u8>),
        Delete(u8),
        Relist(Vec<(u8, Vec<u8>)>),
        Wrote(u8, Vec<u8>),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let nodes = || proptest::collection::vec(0u8..5, 0..4);
        prop_oneof![
            4 => (0u8..8, nodes()).prop_map(|(r, n)| Op::Apply(r, n)),
            2 => (0u8..8).prop_map(Op::Delete),
            1 => proptest::collection::vec((0u8..8, nodes()), 0..6).prop_map(Op::Relist),
            1 => (0u8..8, nodes()).prop_map(|(r, n)| Op::Wrote(r, n)),
        ]
    }

    proptest::proptest! {
        /// Whatever the events, a node's memberships from the index are what a scan of every
        /// object the watch showed finds (the answer before the index).
        #[test]
        fn the_member_index_answers_what_a_scan_finds(ops in proptest::collection::vec(op(), 1..40)) {
            let mut s = AeStore::default();
            let names: Vec<String> = (0..8).map(|i| format!("r{i}")).collect();
            let node_names: Vec<String> = (0..5).map(|i| format!("n{i}")).collect();
            let build = |r: u8, nodes: &[u8], rv: usize| {
                let nodes: Vec<&str> = nodes.iter().map(|n| node_names[*n as usize].as_str()).collect();
                ae(&names[r as usize], &rv.to_string(), &nodes)
            };
            for (i, op) in ops.iter().enumerate() {
                let rv = i + 1;
                match op {
                    Op::Apply(r, n) => s.apply(&build(*r, n, rv)),
                    Op::Delete(r) => s.delete(&build(*r, &[], rv)),
                    Op::Relist(items) => {
                        s.relist_start();
                        for (r, n) in items {
                            s.relist_apply(&build(*r, n, rv));
                        }
                        s.relist_done();
                    }
                    Op::Wrote(r, n) => {
                        let key = Key::new("ns", names[*r as usize].clone());
                        let old = s.stored(&key).and_then(|o| o.metadata.resource_version);
                        s.wrote(&key, vec![old], &build(*r, n, rv + 1000));
                    }
                }
                for node in &node_names {
                    let label = crds::contract::member_label(node);
                    let Some(m) = s.members(&label) else { continue };
                    let mut got: Vec<String> = m.items.iter().map(|o| o.name_any()).collect();
                    got.sort();
                    let mut scanned: Vec<String> =
                        s.members_scanned(&label).iter().map(|o| o.name_any()).collect();
                    scanned.sort();
                    proptest::prop_assert_eq!(got, scanned, "{} after {:?}", node, op);
                }
            }
        }
    }
}
