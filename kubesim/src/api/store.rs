//! The object store: every object of every resource, the cluster-wide resourceVersion, the
//! retained watch history, and indexes for owner references (garbage collection).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::cache_counters::CacheCounters;
use super::dispatch::{Dispatch, Dispatcher, DispatcherSetup};
use super::meta;
use super::resource::{Registry, ResourceDef};
use super::time_budget::TimeBudget;
use super::watch::{EvType, Event};
use super::watch_cache_sizing::{self as sizing, FullWindow, WatchCacheConfig};

/// (namespace or "" for cluster-scoped, name)
pub(crate) type ObjKey = (String, String);
/// (table key "group/plural", object key)
pub(crate) type ObjRef = (String, ObjKey);

/// An object as stored: its JSON, serialized once and shared by GET, LIST and every watcher,
/// and a [`view`](Stored::view) of the parts read on every list, watch and garbage collection
/// pass. The whole object as a `Value` is about 11 times its JSON (a 100,000-revision run held
/// ~38 KiB per revision that way); a write parses the JSON again ([`Stored::full`]).
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    /// `apiVersion`, `kind`, `metadata` but its managedFields, and every other field but
    /// arrays (no selector reads into an array; field selectors read strings, numbers and
    /// booleans).
    pub view: Arc<Value>,
    pub json: Bytes,
}

impl Stored {
    pub fn new(obj: Value) -> Self {
        let json = Bytes::from(serde_json::to_vec(&obj).unwrap_or_default());
        Self {
            view: Arc::new(view_of(obj)),
            json,
        }
    }

    /// The whole object, parsed from its JSON: what a write changes and compares.
    pub fn full(&self) -> Value {
        // The JSON was made from a Value by serde_json: it parses back.
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }

    pub fn rv(&self) -> &str {
        meta::meta_str(&self.view, "resourceVersion").unwrap_or("")
    }
}

/// What [`Stored::view`] keeps of `obj`.
fn view_of(obj: Value) -> Value {
    fn without_arrays(v: Value) -> Option<Value> {
        match v {
            Value::Array(_) => None,
            Value::Object(m) => Some(Value::Object(
                m.into_iter()
                    .filter_map(|(k, v)| Some((k, without_arrays(v)?)))
                    .collect(),
            )),
            v => Some(v),
        }
    }
    match obj {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter_map(|(k, v)| match k.as_str() {
                    "apiVersion" | "kind" => Some((k, v)),
                    // managedFields are most of a small object's metadata as a Value, and
                    // only writes (from the JSON) and metadata-only answers read them.
                    "metadata" => Some((
                        k,
                        match v {
                            Value::Object(mut m) => {
                                m.remove("managedFields");
                                Value::Object(m)
                            }
                            v => v,
                        },
                    )),
                    _ => Some((k, without_arrays(v)?)),
                })
                .collect(),
        ),
        v => v,
    }
}

/// All objects of one group/resource (every served version shares it).
pub(crate) struct Table {
    pub def: Arc<ResourceDef>,
    pub objects: BTreeMap<ObjKey, Stored>,
    /// The watch cache's event window (see [`sizing`]).
    pub history: VecDeque<Arc<Event>>,
    /// Every event with a resourceVersion above this one is still in `history`.
    pub history_start: u64,
    /// The window's capacity now.
    pub capacity: usize,
    /// An event has left the window since it began (or was compacted).
    pub evicted: bool,
    pub watchers: Dispatcher,
}

impl Table {
    /// The oldest resourceVersion a watch may resume from (see [`sizing::oldest_resumable`]).
    pub fn oldest_resumable(&self) -> u64 {
        sizing::oldest_resumable(
            self.history_start,
            self.history.front().map(|e| e.rv),
            self.evicted,
        )
    }

    /// Adds an event to the window, resizing it first as `watchCache.updateCache` does.
    fn keep(&mut self, ev: Arc<Event>, cfg: &WatchCacheConfig, max: usize) {
        let n = self.history.len();
        if n >= self.capacity && n > 0 {
            let age = |i: usize| ev.at.saturating_duration_since(self.history[i].at);
            let full = FullWindow {
                capacity: self.capacity,
                oldest_age: age(0),
                // `cache[(endIndex - capacity/4) % capacity]`: the oldest when a quarter is 0.
                newest_quarter_age: age(match self.capacity / 4 {
                    0 => 0,
                    q => n - q,
                }),
            };
            self.capacity = sizing::resized(full, cfg.window_min, max, cfg.event_fresh);
            self.watchers
                .counters()
                .capacity
                .store(self.capacity as u64, std::sync::atomic::Ordering::Relaxed);
        }
        while self.history.len() >= self.capacity.max(1) {
            match self.history.pop_front() {
                Some(old) => {
                    self.history_start = old.rv;
                    self.evicted = true;
                }
                None => break,
            }
        }
        self.history.push_back(ev);
    }
}

pub(crate) struct State {
    pub rv: u64,
    pub registry: Registry,
    pub tables: HashMap<String, Table>,
    pub uids: HashMap<String, ObjRef>,
    /// owner uid -> objects whose ownerReferences name it
    pub dependents: HashMap<String, HashSet<ObjRef>>,
    /// dependents whose owners the garbage collector must check
    pub gc_queue: Vec<ObjRef>,
    /// owners being deleted in the foreground
    pub foreground: HashSet<ObjRef>,
    pub terminating_namespaces: HashSet<String>,
    /// CRD names being deleted (their custom resources are removed first)
    pub terminating_crds: HashSet<String>,
    /// The event window's upper bound (`ApiServerConfig::watch_history`).
    pub history_cap: usize,
    pub cache: WatchCacheConfig,
    pub bookmark_interval: std::time::Duration,
    pub counters: Arc<CacheCounters>,
}

impl State {
    pub fn new(
        history_cap: usize,
        cache: WatchCacheConfig,
        bookmark_interval: std::time::Duration,
        counters: Arc<CacheCounters>,
    ) -> Self {
        Self {
            rv: 0,
            registry: Registry::new(),
            tables: HashMap::new(),
            uids: HashMap::new(),
            dependents: HashMap::new(),
            gc_queue: Vec::new(),
            foreground: HashSet::new(),
            terminating_namespaces: HashSet::new(),
            terminating_crds: HashSet::new(),
            history_cap: history_cap.max(1),
            cache,
            bookmark_interval,
            counters,
        }
    }

    /// The table of a resource, created on first use.
    pub fn table(&mut self, def: &Arc<ResourceDef>) -> &mut Table {
        let (cache, cap) = (&self.cache, self.history_cap);
        let (counters, bookmarks) = (&self.counters, self.bookmark_interval);
        self.tables.entry(def.table_key()).or_insert_with(|| {
            let capacity = cache.window_min.min(cap).max(1);
            let c = counters.of(&def.group_resource(), &def.resource_prefix());
            c.capacity
                .store(capacity as u64, std::sync::atomic::Ordering::Relaxed);
            Table {
                def: def.clone(),
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                history_start: 0,
                capacity,
                evicted: false,
                watchers: Dispatcher::new(DispatcherSetup {
                    resource: def.group_resource(),
                    indexed: def.table_key() == "/pods",
                    budget: TimeBudget::new(
                        std::time::Instant::now(),
                        cache.budget_refresh_per_second,
                        cache.budget_max,
                    ),
                    counters: c,
                    bookmark_interval: bookmarks,
                }),
            }
        })
    }

    pub fn get(&self, tk: &str, key: &ObjKey) -> Option<&Stored> {
        self.tables.get(tk).and_then(|t| t.objects.get(key))
    }

    pub fn namespace_exists(&self, ns: &str) -> Option<&Stored> {
        self.get("/namespaces", &(String::new(), ns.to_string()))
    }

    fn index_owners(&mut self, r: &ObjRef, old: Option<&Value>, new: Option<&Value>) {
        let old_o = old.map(meta::owner_uids).unwrap_or_default();
        let new_o = new.map(meta::owner_uids).unwrap_or_default();
        for u in old_o.iter().filter(|u| !new_o.contains(u)) {
            if let Some(s) = self.dependents.get_mut(u) {
                s.remove(r);
                if s.is_empty() {
                    self.dependents.remove(u);
                }
            }
        }
        let mut dangling = false;
        for u in new_o.iter() {
            self.dependents
                .entry(u.clone())
                .or_default()
                .insert(r.clone());
            dangling |= !self.uids.contains_key(u);
        }
        if dangling {
            self.gc_queue.push(r.clone());
        }
    }

    fn record(&mut self, tk: &str, ev: Event) {
        let t = self.tables.get_mut(tk).expect("table exists");
        let ev = Arc::new(ev);
        t.keep(ev.clone(), &self.cache, self.history_cap);
        t.watchers.send(Dispatch::Event(ev));
    }

    /// Stores a created or modified object at the next resourceVersion and sends its event.
    pub fn commit(&mut self, def: &Arc<ResourceDef>, key: ObjKey, mut obj: Value) -> Stored {
        self.rv += 1;
        let rv = self.rv;
        meta::meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let stored = Stored::new(obj);
        let tk = def.table_key();
        let old = self.table(def).objects.insert(key.clone(), stored.clone());
        let r: ObjRef = (tk.clone(), key);
        if let Some(uid) = meta::meta_str(&stored.view, "uid") {
            self.uids.insert(uid.to_string(), r.clone());
        }
        self.index_owners(&r, old.as_ref().map(|o| &*o.view), Some(&stored.view));
        let ty = if old.is_some() {
            EvType::Modified
        } else {
            EvType::Added
        };
        self.record(&tk, Event::new(rv, ty, old, stored.clone()));
        self.mirror_commit(&tk, &r.1, &stored, rv);
        stored
    }

    /// The other Event API's copy of an Event just written, at the same resourceVersion
    /// (see [`super::events`]).
    fn mirror_commit(&mut self, tk: &str, key: &ObjKey, stored: &Stored, rv: u64) {
        let Some((mirror_tk, group)) = super::events::mirror_of(tk) else {
            return;
        };
        let Some(def) = self.registry.get(group, "v1", "events") else {
            return;
        };
        let copy = Stored::new(super::events::convert(&stored.full(), mirror_tk));
        let old = self.table(&def).objects.insert(key.clone(), copy.clone());
        let ty = if old.is_some() {
            EvType::Modified
        } else {
            EvType::Added
        };
        self.record(mirror_tk, Event::new(rv, ty, old, copy));
    }

    /// Removes an object at the next resourceVersion; returns its final state (its last content
    /// at the deletion's resourceVersion), as DELETED events carry it.
    pub fn remove(&mut self, tk: &str, key: &ObjKey) -> Option<Stored> {
        let old = self.tables.get_mut(tk)?.objects.remove(key)?;
        self.rv += 1;
        let rv = self.rv;
        let last = Stored::new(meta::with_rv(&old.full(), rv));
        let r: ObjRef = (tk.to_string(), key.clone());
        if let Some(uid) = meta::meta_str(&old.view, "uid") {
            self.uids.remove(uid);
            if let Some(deps) = self.dependents.get(uid) {
                self.gc_queue.extend(deps.iter().cloned());
            }
        }
        self.index_owners(&r, Some(&old.view), None);
        self.foreground.remove(&r);
        self.record(tk, Event::new(rv, EvType::Deleted, Some(old), last.clone()));
        if let Some((mirror_tk, _)) = super::events::mirror_of(tk)
            && let Some(copy) = self
                .tables
                .get_mut(mirror_tk)
                .and_then(|t| t.objects.remove(key))
        {
            let copy_last = Stored::new(meta::with_rv(&copy.full(), rv));
            self.record(
                mirror_tk,
                Event::new(rv, EvType::Deleted, Some(copy), copy_last),
            );
        }
        Some(last)
    }

    /// Forgets all retained watch history: a watch from any earlier resourceVersion gets 410.
    pub fn compact(&mut self) {
        let rv = self.rv;
        for t in self.tables.values_mut() {
            t.history.clear();
            t.history_start = rv;
            t.evicted = false;
        }
    }

    /// Drops a whole table (its CRD was deleted), ending its watches.
    pub fn drop_table(&mut self, tk: &str) {
        if let Some(t) = self.tables.remove(tk) {
            t.watchers.watchers().close_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What every list, watch and collection pass reads stays in the view; what only a write
    /// reads (arrays: containers, conditions, members, finalizers in a spec) is read from the
    /// JSON, which keeps all of it.
    #[test]
    fn the_view_keeps_metadata_and_scalars_and_the_json_keeps_everything() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "p", "namespace": "ns", "labels": {"app": "a"},
                "finalizers": ["x/y"],
                "ownerReferences": [{"uid": "u1", "blockOwnerDeletion": true}],
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}],
                     "securityContext": {"runAsUser": 1000, "supplementalGroups": [1]}},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready"}]},
        });
        let s = Stored::new(pod.clone());
        assert_eq!(s.full(), pod, "the JSON is the whole object");
        let v = &*s.view;
        assert_eq!(
            v["metadata"], pod["metadata"],
            "metadata whole, arrays included"
        );
        assert_eq!(v["spec"]["nodeName"], "n1");
        assert_eq!(v["status"]["phase"], "Running");
        assert_eq!(v["status"]["podIP"], "10.0.0.1");
        assert_eq!(v["spec"]["securityContext"]["runAsUser"], 1000);
        assert!(v["spec"].get("containers").is_none());
        assert!(
            v["spec"]["securityContext"]
                .get("supplementalGroups")
                .is_none()
        );
        assert!(v["status"].get("conditions").is_none());
        assert_eq!(v["kind"], "Pod");
        assert_eq!(s.rv(), "");
    }

    /// A field selector reads the view: every field label a built-in serves is a scalar the
    /// view keeps (an Event's `source` and `involvedObject` are objects of scalars).
    #[test]
    fn field_selectors_read_the_same_from_the_view_as_from_the_object() {
        let event = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "ns"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "ns", "uid": "u"},
            "reason": "Started", "type": "Normal", "source": {"component": "kubelet"},
            "reportingComponent": "kubelet",
        });
        let s = Stored::new(event.clone());
        for path in [
            "involvedObject.kind",
            "involvedObject.name",
            "involvedObject.uid",
            "reason",
            "type",
            "source",
            "reportingComponent",
            "metadata.name",
        ] {
            assert_eq!(
                super::super::selector::field_value(&s.view, path),
                super::super::selector::field_value(&event, path),
                "{path}"
            );
        }
    }
}
