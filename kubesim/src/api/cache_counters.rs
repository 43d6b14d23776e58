//! What the watch cache counts, per resource, under kube-apiserver's own metric names where it
//! has one: events dispatched, watchers force-closed for not keeping up, LISTs served from the
//! cache and the objects they read; and what kubesim adds: events offered to watchers
//! (queued in their input buffers, before their selectors are applied) and objects scanned by
//! every LIST (from the cache or, for quorum reads, from the storage).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Counters of one resource (`groupResource.String()`: `pods`, `revisions.local-activator.dev`).
#[derive(Debug, Default)]
pub(crate) struct ResourceCounters {
    /// `"/pods"`, `"/local-activator.dev/revisions"`: the `resource_prefix` label of the list
    /// metrics.
    pub prefix: String,
    pub dispatched: AtomicU64,
    pub offered: AtomicU64,
    pub terminated: AtomicU64,
    pub capacity: AtomicU64,
    pub scanned: AtomicU64,
    /// LISTs served from the cache, by index used ("" for none): (lists, objects read).
    cache_lists: Mutex<BTreeMap<String, (u64, u64)>>,
    pub list_returned: AtomicU64,
}

impl ResourceCounters {
    /// One LIST: it read `scanned` objects and answered `returned`; `index` is the index it
    /// used, and `None` when it was not served from the cache.
    pub fn list(&self, cache_index: Option<&str>, scanned: usize, returned: usize) {
        self.scanned.fetch_add(scanned as u64, Ordering::Relaxed);
        if let Some(index) = cache_index {
            let mut l = self.cache_lists.lock().unwrap_or_else(|e| e.into_inner());
            let c = l.entry(index.to_string()).or_default();
            c.0 += 1;
            c.1 += scanned as u64;
            self.list_returned
                .fetch_add(returned as u64, Ordering::Relaxed);
        }
    }
}

/// Every resource's counters.
#[derive(Debug, Default)]
pub(crate) struct CacheCounters {
    by_resource: Mutex<BTreeMap<String, Arc<ResourceCounters>>>,
}

impl CacheCounters {
    /// The counters of a resource, created on first use.
    pub fn of(&self, resource: &str, prefix: &str) -> Arc<ResourceCounters> {
        let mut m = self.by_resource.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(resource.to_string())
            .or_insert_with(|| {
                Arc::new(ResourceCounters {
                    prefix: prefix.to_string(),
                    ..ResourceCounters::default()
                })
            })
            .clone()
    }

    pub fn snapshot(&self) -> BTreeMap<String, WatchCacheStats> {
        let m = self.by_resource.lock().unwrap_or_else(|e| e.into_inner());
        m.iter()
            .map(|(r, c)| {
                let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
                let stats = WatchCacheStats {
                    resource_prefix: c.prefix.clone(),
                    events_dispatched: load(&c.dispatched),
                    events_offered: load(&c.offered),
                    terminated_watchers: load(&c.terminated),
                    capacity: load(&c.capacity),
                    list_objects_scanned: load(&c.scanned),
                    cache_lists: c
                        .cache_lists
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone(),
                    cache_list_returned: load(&c.list_returned),
                };
                (r.clone(), stats)
            })
            .collect()
    }
}

/// One resource's watch cache figures (see [`super::Stats::watch_cache`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchCacheStats {
    /// The `resource_prefix` label of the list metrics (`/pods`, `/<group>/<plural>`).
    pub resource_prefix: String,
    /// Events the cache dispatched (`apiserver_watch_cache_events_dispatched_total`).
    pub events_dispatched: u64,
    /// Events offered to watchers: one per event per watcher it was queued for (or tried to
    /// be), before the watcher's label and field selectors are applied
    /// (`kubesim_apiserver_watch_cache_events_offered_total`).
    pub events_offered: u64,
    /// Watchers closed because an event could not be queued for them within the dispatch
    /// budget (`apiserver_terminated_watchers_total`).
    pub terminated_watchers: u64,
    /// The event window's current capacity (`apiserver_watch_cache_capacity`).
    pub capacity: u64,
    /// Objects every LIST of the resource looked at, matched or not
    /// (`kubesim_apiserver_list_objects_scanned_total`).
    pub list_objects_scanned: u64,
    /// LISTs served from the cache by the index they used ("" none): (LISTs, objects read)
    /// (`apiserver_cache_list_total`, `apiserver_cache_list_fetched_objects_total`).
    pub cache_lists: BTreeMap<String, (u64, u64)>,
    /// Objects those LISTs returned (`apiserver_cache_list_returned_objects_total`).
    pub cache_list_returned: u64,
}
