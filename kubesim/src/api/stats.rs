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
    pub watches: Vec<WatchInfo>,
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
            .sum()
    }
}

#[derive(Default)]
pub(crate) struct StatsInner {
    pub requests: BTreeMap<RequestKey, u64>,
    pub watches: Vec<Arc<WatchStat>>,
}

impl StatsInner {
    pub fn count(&mut self, verb: &str, group: &str, resource: &str) {
        let k = RequestKey {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
        };
        *self.requests.entry(k).or_default() += 1;
    }

    pub fn snapshot(&self) -> Stats {
        Stats {
            requests: self.requests.clone(),
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
    for w in &s.watches {
        let l = vec![("resource".to_string(), w.resource.clone())];
        events.get_or_create(&l).inc_by(w.events);
        watches.get_or_create(&l).inc();
        if w.open {
            open.get_or_create(&l).inc();
        }
    }
    let mut out = String::new();
    let _ = encode(&mut out, &reg);
    out
}
