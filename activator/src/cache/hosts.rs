//! Host routing without a cluster-wide watch (docs/architecture.md, "The contracts"): a Host this activator has not
//! seen is looked up as the ActivationEndpoints carrying its label
//! (`host.local-activator.dev/<h>`): from a directory replica's index first
//! (`/v1/host-claims/<host>`), else with one label-selected LIST across namespaces
//! (`resourceVersion=0` so the API server answers from its cache; a scan of every subset
//! there). The answer ([`HostRoute`]: the revisions serving it, by weight) is kept: for
//! `positive_ttl` (then read again in the background while requests keep routing), a miss for
//! `negative_ttl`, at most `ENTRIES_KEPT` hosts. Concurrent lookups of one host share one LIST.
//!
//! A host moves (a Route's split changes, a newer revision takes it over) when the subsetter
//! writes the ActivationEndpoints; a cached answer would follow only at its TTL. So a host is
//! also read again at once when a member says the answer is older than its subset, or when
//! this node's own copy of the picked revision's subset is newer ([`HostCache::refresh`]):
//! in the background, sharing a LIST in flight, at most once per host per `REFRESH_GAP`; and
//! when the membership stream says subsets carrying its label changed
//! ([`HostCache::follow_moves`]), so a move reaches every activator that routes the host at
//! once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crds::ActivationEndpoints;
use crds::contract::{host_label, host_selector, normalize_host};
use dashmap::DashMap;
use dashmap::mapref::entry::Entry as Slot;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use kube::api::ListParams;
use kube::{Api, Client};

use tokio::sync::mpsc::UnboundedReceiver;

use super::directory::Directory;
use super::host_route::HostRoute;
use crate::ops::metrics::{HostRefresh, Metrics};
use crds::ObjectKey as RevisionKey;

/// Hosts kept before expired entries are swept (Host headers come from clients).
const ENTRIES_KEPT: usize = 10_000;
/// The least time between two refreshes of one host asked by hints: a member keeps saying
/// "stale" to every request until the LIST's answer catches up with its watch (a real API
/// server's cache may lag a moment), and each hint must not cost a LIST.
const REFRESH_GAP: Duration = Duration::from_millis(200);

#[derive(Clone)]
struct Entry {
    at: Instant,
    route: Option<Arc<HostRoute>>,
    refreshing: Arc<AtomicBool>,
}

type Answer = Option<Arc<HostRoute>>;
type Lookup = Shared<BoxFuture<'static, Result<Answer, Arc<kube::Error>>>>;

/// Host → the revisions serving it, looked up by label and cached.
#[derive(Clone)]
pub struct HostCache {
    client: Client,
    directory: Option<Directory>,
    /// Lookups the directory answered.
    directory_reads: prometheus_client::metrics::counter::Counter,
    entries: Arc<DashMap<String, Entry>>,
    pending: Arc<DashMap<String, Lookup>>,
    /// When each host was last refreshed on a hint (`REFRESH_GAP`).
    refreshed: Arc<DashMap<String, Instant>>,
    positive_ttl: Duration,
    negative_ttl: Duration,
    metrics: Arc<Metrics>,
}

impl HostCache {
    pub fn new(
        client: Client,
        directory: Option<Directory>,
        directory_reads: prometheus_client::metrics::counter::Counter,
        positive_ttl: Duration,
        negative_ttl: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            client,
            directory,
            directory_reads,
            entries: Arc::new(DashMap::new()),
            pending: Arc::new(DashMap::new()),
            refreshed: Arc::new(DashMap::new()),
            positive_ttl,
            negative_ttl,
            metrics,
        }
    }

    /// Hosts remembered now (found or missing).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The revisions serving `host` (any spelling: port, case and trailing dot are ignored).
    pub async fn resolve(&self, host: &str) -> Result<Answer, Arc<kube::Error>> {
        match self.cached(host) {
            Some(known) => Ok(known),
            None => self.lookup(normalize_host(host)).await,
        }
    }

    /// What an earlier lookup says about `host`, without IO: `Some(Some(_))` the revisions (an
    /// old answer is refreshed in the background), `Some(None)` a recent "no revision",
    /// `None` when only a lookup can tell. The request path asks this first, so that a
    /// cached answer arms no timeout.
    pub fn cached(&self, host: &str) -> Option<Answer> {
        let host = normalize_host(host);
        if let Some(hit) = self.entries.get(&host).map(|e| e.clone()) {
            let age = hit.at.elapsed();
            match &hit.route {
                Some(route) => {
                    if age >= self.positive_ttl && !hit.refreshing.swap(true, Ordering::AcqRel) {
                        let this = self.clone();
                        let h = host.clone();
                        tokio::spawn(async move {
                            if let Err(e) = this.lookup(h.clone()).await {
                                tracing::debug!(host = %h, error = %e, "refreshing host");
                                hit.refreshing.store(false, Ordering::Release);
                            }
                        });
                    }
                    return Some(Some(route.clone()));
                }
                None if age < self.negative_ttl => return Some(None),
                None => {}
            }
        }
        None
    }

    /// Reads `host` again now, in the background: its answer is older than a subset a member
    /// (or this node) has seen (`why`). Shares a LIST in flight; at most one per host per
    /// `REFRESH_GAP`, further calls meanwhile do nothing. Requests keep the answer they
    /// picked from: a refresh changes only what later requests pick.
    pub fn refresh(&self, host: &str, why: HostRefresh) {
        let host = normalize_host(host);
        let now = Instant::now();
        match self.refreshed.entry(host.clone()) {
            Slot::Occupied(last) if now.duration_since(*last.get()) < REFRESH_GAP => return,
            Slot::Occupied(mut last) => {
                last.insert(now);
            }
            Slot::Vacant(v) => {
                v.insert(now);
            }
        }
        // Bounded like the entries: client Hosts could fill it otherwise.
        if self.refreshed.len() > ENTRIES_KEPT {
            self.refreshed
                .retain(|_, at| now.duration_since(*at) < REFRESH_GAP);
        }
        self.metrics.hosts.refreshed(why);
        tracing::debug!(host = %host, reason = ?why, "host answer older than a subset: reading it again");
        let this = self.clone();
        tokio::spawn(async move {
            match this.lookup(host.clone()).await {
                Ok(_) => this
                    .metrics
                    .hosts
                    .refresh_seconds
                    .observe(now.elapsed().as_secs_f64()),
                Err(e) => tracing::debug!(host = %host, error = %e, "refreshing host"),
            }
        });
    }

    /// Remembers `host` → `revision` as found elsewhere (the directory, while the API server
    /// does not answer); it is read again from the API server once its TTL is past.
    pub fn seed(&self, host: &str, revision: RevisionKey) {
        let route = Arc::new(HostRoute::single(revision));
        self.store(&normalize_host(host), Some(route));
    }

    /// Reads again, at once, each host held whose label is among those `moved` sends (the
    /// membership stream's [`crds::member_stream::Frame::Hosts`]), until `moved` closes.
    pub fn follow_moves(&self, mut moved: UnboundedReceiver<Vec<String>>) {
        let this = self.clone();
        tokio::spawn(async move {
            while let Some(labels) = moved.recv().await {
                let hosts: Vec<String> = this
                    .entries
                    .iter()
                    .filter(|e| labels.contains(&host_label(e.key())))
                    .map(|e| e.key().clone())
                    .collect();
                for h in hosts {
                    this.refresh(&h, HostRefresh::Streamed);
                }
            }
        });
    }

    /// Forgets `host` (its revision turned out not to claim it).
    pub fn forget(&self, host: &str) {
        self.entries.remove(&normalize_host(host));
    }

    async fn lookup(&self, host: String) -> Result<Answer, Arc<kube::Error>> {
        let shared = self
            .pending
            .entry(host.clone())
            .or_insert_with(|| {
                let this = self.clone();
                let h = host.clone();
                async move {
                    let r = this.list(&h).await.map_err(Arc::new);
                    if let Ok(route) = &r {
                        this.store(&h, route.clone());
                    }
                    this.pending.remove(&h);
                    r
                }
                .boxed()
                .shared()
            })
            .clone();
        shared.await
    }

    async fn list(&self, host: &str) -> Result<Answer, kube::Error> {
        if let Some(d) = &self.directory {
            match d.host_claims(host).await {
                Ok(found) => {
                    self.directory_reads.inc();
                    return Ok(HostRoute::from_claims(host, &found.items).map(Arc::new));
                }
                Err(e) => {
                    tracing::debug!(host, error = %e, "host claims not from the directory: listing")
                }
            }
        }
        let api: Api<ActivationEndpoints> = Api::all(self.client.clone());
        let lp = ListParams::default()
            .labels(&host_selector(host))
            .match_any();
        let found = api.list(&lp).await?;
        Ok(HostRoute::from_claims(host, &found.items).map(Arc::new))
    }

    fn store(&self, host: &str, route: Answer) {
        if self.entries.len() >= ENTRIES_KEPT {
            let (pos, neg) = (self.positive_ttl, self.negative_ttl);
            self.entries
                .retain(|_, e| e.at.elapsed() < if e.route.is_some() { pos } else { neg });
            // Still full of live entries (a flood of distinct hosts): drop misses first.
            if self.entries.len() >= ENTRIES_KEPT {
                self.entries.retain(|_, e| e.route.is_some());
            }
        }
        let entry = Entry {
            at: Instant::now(),
            route,
            refreshing: Arc::new(AtomicBool::new(false)),
        };
        let moved = match self.entries.insert(host.to_string(), entry.clone()) {
            Some(Entry {
                route: Some(before),
                ..
            }) => !entry
                .route
                .as_ref()
                .is_some_and(|now| now.same_split(&before)),
            _ => false,
        };
        if moved {
            self.metrics.hosts.moves.inc();
            tracing::debug!(host, "host moved");
        }
    }
}
