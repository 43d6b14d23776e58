//! Accounting: requests by verb and resource, watch events delivered per watch; readable from
//! Rust ([`Stats`]) and as Prometheus text (`/metrics`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::cache_counters::WatchCacheStats;
use super::watch::WatchStat;

/// A request's identity for accounting.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    /// get, list, watch, create, update, patch, delete, deletecollection
    pub verb: String,
    /// API group ("" for core)
    pub group: String,
    /// `pods`, or `pods/status` for a subresource
    pub resource: String,
}

/// A request as an authorizer sees it: who asked, and what for. kubesim has no
/// authentication; a client names itself with the `Impersonate-User` header (kube-rs sets it
/// from `AuthInfo::impersonate`), so a test can give each component its own identity and
/// compare what each one asked for with the RBAC it is granted.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UserRequestKey {
    /// The `Impersonate-User` header, or "" without one.
    pub user: String,
    pub verb: String,
    pub group: String,
    /// `pods`, or `pods/status` for a subresource
    pub resource: String,
    /// The request's namespace; None for a cluster-scoped resource or an all-namespaces
    /// list or watch.
    pub namespace: Option<String>,
}

/// One watch and what it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchInfo {
    pub id: u64,
    pub resource: String,
    pub namespace: Option<String>,
    pub label_selector: String,
    pub field_selector: String,
    /// events (incl. bookmarks and initial events) delivered to this watch
    pub events: u64,
    pub open: bool,
}

/// A snapshot of the server's accounting.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub requests: BTreeMap<RequestKey, u64>,
    /// The same requests by the identity that made them and their namespace (for checking
    /// RBAC against what each component does).
    pub requests_by_user: BTreeMap<UserRequestKey, u64>,
    /// Of those, the GETs and LISTs that named no resourceVersion: quorum reads, which a real
    /// server sends to etcd (the others it answers from its watch cache).
    pub quorum_reads_by_user: BTreeMap<UserRequestKey, u64>,
    /// Open watches and recently closed ones, each with its own event count.
    pub watches: Vec<WatchInfo>,
    /// Older closed watches, folded per resource: (watches, events delivered).
    pub closed: BTreeMap<String, (u64, u64)>,
    /// The watch cache of each resource, by `group_resource` (`pods`,
    /// `revisions.local-activator.dev`): dispatch, forced closes, window, LIST scans.
    pub watch_cache: BTreeMap<String, WatchCacheStats>,
}

impl Stats {
    /// Requests with this verb and resource (any group).
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.requests
            .iter()
            .filter(|(k, _)| k.verb == verb && k.resource == resource)
            .map(|(_, v)| *v)
            .sum()
    }
    /// Watchers of a resource (`pods`, `revisions.local-activator.dev`) the server closed for
    /// not keeping up (`apiserver_terminated_watchers_total`).
    pub fn terminated_watchers(&self, group_resource: &str) -> u64 {
        self.watch_cache
            .get(group_resource)
            .map_or(0, |c| c.terminated_watchers)
    }
    /// Events of a resource offered to watchers, before their selectors.
    pub fn events_offered(&self, group_resource: &str) -> u64 {
        self.watch_cache
            .get(group_resource)
            .map_or(0, |c| c.events_offered)
    }
    /// Objects LISTs of a resource looked at.
    pub fn list_objects_scanned(&self, group_resource: &str) -> u64 {
        self.watch_cache
            .get(group_resource)
            .map_or(0, |c| c.list_objects_scanned)
    }
    pub fn total_requests(&self) -> u64 {
        self.requests.values().sum()
    }
    pub fn open_watches(&self) -> usize {
        self.watches.iter().filter(|w| w.open).count()
    }
    /// Watch events delivered to all watches of a resource.
    pub fn watch_events(&self, resource: &str) -> u64 {
        self.watches
            .iter()
            .filter(|w| w.resource == resource)
            .map(|w| w.events)
            .sum::<u64>()
            + self.closed.get(resource).map_or(0, |c| c.1)
    }
}

/// Closed watches are folded into per-resource totals once this many watches are listed, so
/// a long run (kubelets re-watch every few minutes) keeps the list bounded.
const WATCHES_LISTED: usize = 20_000;

#[derive(Default)]
pub(crate) struct StatsInner {
    pub requests: BTreeMap<RequestKey, u64>,
    requests_by_user: BTreeMap<UserRequestKey, u64>,
    quorum_reads_by_user: BTreeMap<UserRequestKey, u64>,
    watches: Vec<Arc<WatchStat>>,
    closed: BTreeMap<String, (u64, u64)>,
}

impl StatsInner {
    pub fn add_watch(&mut self, stat: Arc<WatchStat>) {
        if self.watches.len() >= WATCHES_LISTED {
            let closed = &mut self.closed;
            self.watches.retain(|w| {
                if w.open.load(Ordering::Relaxed) {
                    return true;
                }
                let c = closed.entry(w.resource.clone()).or_default();
                c.0 += 1;
                c.1 += w.events.load(Ordering::Relaxed);
                false
            });
        }
        self.watches.push(stat);
    }

    pub fn count(&mut self, verb: &str, group: &str, resource: &str) {
        let k = RequestKey {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
        };
        *self.requests.entry(k).or_default() += 1;
    }

    /// Counts a request by its identity too (see [`UserRequestKey`]).
    pub fn count_by_user(&mut self, key: UserRequestKey) {
        *self.requests_by_user.entry(key).or_default() += 1;
    }

    /// Counts a quorum read (see [`Stats::quorum_reads_by_user`]).
    pub fn count_quorum_read(&mut self, key: UserRequestKey) {
        *self.quorum_reads_by_user.entry(key).or_default() += 1;
    }

    pub fn snapshot(&self) -> Stats {
        Stats {
            requests: self.requests.clone(),
            requests_by_user: self.requests_by_user.clone(),
            quorum_reads_by_user: self.quorum_reads_by_user.clone(),
            watches: self
                .watches
                .iter()
                .map(|w| WatchInfo {
                    id: w.id,
                    resource: w.resource.clone(),
                    namespace: w.namespace.clone(),
                    label_selector: w.label_selector.clone(),
                    field_selector: w.field_selector.clone(),
                    events: w.events.load(Ordering::Relaxed),
                    open: w.open.load(Ordering::Relaxed),
                })
                .collect(),
            closed: self.closed.clone(),
            watch_cache: BTreeMap::new(),
        }
    }
}

/// Prometheus text exposition of a snapshot.
pub(crate) fn metrics_text(s: &Stats) -> String {
    let mut reg = Registry::default();
    let requests = Family::<Vec<(String, String)>, Counter>::default();
    reg.register(
        "kubesim_apiserver_requests",
        "API requests by verb, group and resource",
        requests.clone(),
    );
    for (k, v) in &s.requests {
        let labels = vec![
            ("verb".to_string(), k.verb.clone()),
            ("group".to_string(), k.group.clone()),
            ("resource".to_string(), k.resource.clone()),
        ];
        requests.get_or_create(&labels).inc_by(*v);
    }
    let events = Family::<Vec<(String, String)>, Counter>::default();
    reg.register(
        "kubesim_apiserver_watch_events",
        "Watch events delivered, by resource",
        events.clone(),
    );
    let watches = Family::<Vec<(String, String)>, Counter>::default();
    reg.register(
        "kubesim_apiserver_watches",
        "Watches started, by resource",
        watches.clone(),
    );
    let open = Family::<Vec<(String, String)>, Gauge>::default();
    reg.register(
        "kubesim_apiserver_open_watches",
        "Watches currently open, by resource",
        open.clone(),
    );
    for (resource, (n, ev)) in &s.closed {
        let l = vec![("resource".to_string(), resource.clone())];
        events.get_or_create(&l).inc_by(*ev);
        watches.get_or_create(&l).inc_by(*n);
    }
    for w in &s.watches {
        let l = vec![("resource".to_string(), w.resource.clone())];
        events.get_or_create(&l).inc_by(w.events);
        watches.get_or_create(&l).inc();
        if w.open {
            open.get_or_create(&l).inc();
        }
    }
    register_watch_cache(&mut reg, &s.watch_cache);
    let mut out = String::new();
    let _ = encode(&mut out, &reg);
    out
}

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The watch cache's figures, under kube-apiserver's names where it has them.
fn register_watch_cache(reg: &mut Registry, caches: &BTreeMap<String, WatchCacheStats>) {
    let counter = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<Labels, Counter>::default();
        reg.register(name, help, f.clone());
        f
    };
    let terminated = counter(
        reg,
        "apiserver_terminated_watchers",
        "Counter of watchers closed due to unresponsiveness broken by resource type.",
    );
    let dispatched = counter(
        reg,
        "apiserver_watch_cache_events_dispatched",
        "Counter of events dispatched in watch cache broken by resource type.",
    );
    let offered = counter(
        reg,
        "kubesim_apiserver_watch_cache_events_offered",
        "Events queued (or tried) into watchers' input buffers, one per event per watcher, before the watchers' selectors are applied",
    );
    let scanned = counter(
        reg,
        "kubesim_apiserver_list_objects_scanned",
        "Objects LIST requests looked at (matched or not), from the watch cache or the storage",
    );
    let lists = counter(
        reg,
        "apiserver_cache_list",
        "Number of LIST requests served from watch cache",
    );
    let fetched = counter(
        reg,
        "apiserver_cache_list_fetched_objects",
        "Number of objects read from watch cache in the course of serving a LIST request",
    );
    let returned = counter(
        reg,
        "apiserver_cache_list_returned_objects",
        "Number of objects returned for a LIST request from watch cache",
    );
    let capacity = Family::<Labels, Gauge>::default();
    reg.register(
        "apiserver_watch_cache_capacity",
        "Total capacity of watch cache broken by resource type.",
        capacity.clone(),
    );
    for (r, c) in caches {
        let l = labels(&[("resource", r)]);
        terminated.get_or_create(&l).inc_by(c.terminated_watchers);
        dispatched.get_or_create(&l).inc_by(c.events_dispatched);
        offered.get_or_create(&l).inc_by(c.events_offered);
        scanned.get_or_create(&l).inc_by(c.list_objects_scanned);
        capacity.get_or_create(&l).set(c.capacity as i64);
        let p = c.resource_prefix.as_str();
        for (index, (n, objs)) in &c.cache_lists {
            let l = labels(&[("resource_prefix", p), ("index", index)]);
            lists.get_or_create(&l).inc_by(*n);
            fetched.get_or_create(&l).inc_by(*objs);
        }
        if !c.cache_lists.is_empty() {
            returned
                .get_or_create(&labels(&[("resource_prefix", p)]))
                .inc_by(c.cache_list_returned);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64};

    fn stat(id: u64, open: bool, events: u64) -> Arc<WatchStat> {
        Arc::new(WatchStat {
            id,
            resource: "pods".into(),
            namespace: None,
            label_selector: String::new(),
            field_selector: String::new(),
            events: AtomicU64::new(events),
            open: AtomicBool::new(open),
        })
    }

    #[test]
    fn closed_watches_fold_into_totals_and_the_list_stays_bounded() {
        let mut inner = StatsInner::default();
        for i in 0..(WATCHES_LISTED as u64 * 3) {
            // Every tenth watch stays open; each delivered 2 events.
            inner.add_watch(stat(i, i % 10 == 0, 2));
        }
        let s = inner.snapshot();
        assert!(s.watches.len() <= WATCHES_LISTED + WATCHES_LISTED / 10 * 3);
        assert_eq!(
            s.watch_events("pods"),
            WATCHES_LISTED as u64 * 3 * 2,
            "no event lost"
        );
        assert_eq!(s.open_watches(), WATCHES_LISTED * 3 / 10);
        let text = metrics_text(&s);
        assert!(
            text.contains("kubesim_apiserver_watches_total{resource=\"pods\"} 60000"),
            "{text}"
        );
    }
}
