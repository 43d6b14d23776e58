//! Revisions: either every Revision, watched (needed to route by Host header), or only those
//! requests name, read on demand (when an ingress names revisions with the `x-revision-*`
//! headers). The second keeps an activator's memory and watch traffic to what its node serves
//! (DESIGN §4): with 5,000 activators, a watch of every Revision costs each change 5,000
//! events and every activator a copy of every Revision.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crds::Revision;
use dashmap::DashMap;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::routing::{HostTable, RevisionKey};

/// How long a revision found missing is not looked up again.
const MISS_TTL: Duration = Duration::from_secs(1);
/// How long a revision read on demand is served before it is read again (in the background:
/// requests keep using the copy they have meanwhile).
const FETCHED_TTL: Duration = Duration::from_secs(10);
/// Entries kept before expired ones are dropped (names come from request headers).
const ENTRIES_KEPT: usize = 10_000;

/// A revision read on demand, or the fact that it does not exist, and when.
#[derive(Clone)]
struct Fetched {
    at: Instant,
    revision: Option<Arc<Revision>>,
    refreshing: Arc<AtomicBool>,
}

/// Revisions known to this activator and, with host routing, the hosts they claim.
#[derive(Clone)]
pub struct RevisionCache {
    client: Client,
    /// Host routing: every Revision, watched, and the host table built from them.
    watched: Option<(Store<Revision>, Arc<RwLock<HostTable>>)>,
    /// Revisions read from the API server (not watched, or not delivered by the watch yet).
    fetched: Arc<DashMap<RevisionKey, Fetched>>,
}

impl RevisionCache {
    /// With `host_routing`, starts the watch of every Revision (until `stop`); without, reads
    /// revisions on demand only.
    pub fn start(client: Client, host_routing: bool, stop: CancellationToken) -> Self {
        let watched = host_routing.then(|| watch_all(client.clone(), stop));
        Self {
            client,
            watched,
            fetched: Arc::new(DashMap::new()),
        }
    }

    /// Waits until the first full list has been received (at once without host routing).
    pub async fn synced(&self) {
        if let Some((store, _)) = &self.watched {
            // The writer lives as long as the watch, so this only fails on shutdown.
            let _ = store.wait_until_ready().await;
        }
    }

    /// The revision from the watch, or from an on-demand read. Reads are remembered:
    /// a revision for [`FETCHED_TTL`] (then refreshed in the background), a missing one for
    /// [`MISS_TTL`], so requests naming an unknown revision cost the API server one read per
    /// second, not one per request.
    pub async fn get_or_fetch(
        &self,
        key: &RevisionKey,
    ) -> Result<Option<Arc<Revision>>, kube::Error> {
        if let Some((store, _)) = &self.watched
            && let Some(rev) = store.get(&ObjectRef::new(&key.name).within(&key.namespace))
        {
            return Ok(Some(rev));
        }
        if let Some(hit) = self.fetched.get(key).map(|e| e.clone()) {
            match &hit.revision {
                Some(rev) if hit.at.elapsed() >= FETCHED_TTL => {
                    self.refresh_in_background(key, &hit);
                    return Ok(Some(rev.clone()));
                }
                Some(rev) => return Ok(Some(rev.clone())),
                None if hit.at.elapsed() < MISS_TTL => return Ok(None),
                None => {}
            }
        }
        self.fetch(key).await
    }

    /// The revision a Host header routes to (None without host routing).
    pub fn resolve_host(&self, host: &str) -> Option<RevisionKey> {
        let (_, hosts) = self.watched.as_ref()?;
        hosts.read().expect("host table lock").resolve(host)
    }

    /// Whether Host headers are routed.
    pub fn routes_hosts(&self) -> bool {
        self.watched.is_some()
    }

    async fn fetch(&self, key: &RevisionKey) -> Result<Option<Arc<Revision>>, kube::Error> {
        let api: Api<Revision> = Api::namespaced(self.client.clone(), &key.namespace);
        let revision = api.get_opt(&key.name).await?.map(Arc::new);
        if self.fetched.len() >= ENTRIES_KEPT {
            self.fetched.retain(|_, e| {
                e.at.elapsed()
                    < if e.revision.is_some() {
                        FETCHED_TTL
                    } else {
                        MISS_TTL
                    }
            });
        }
        self.fetched.insert(
            key.clone(),
            Fetched {
                at: Instant::now(),
                revision: revision.clone(),
                refreshing: Arc::new(AtomicBool::new(false)),
            },
        );
        Ok(revision)
    }

    fn refresh_in_background(&self, key: &RevisionKey, hit: &Fetched) {
        if hit.refreshing.swap(true, Ordering::AcqRel) {
            return; // one refresh at a time per revision
        }
        let (this, key, flag) = (self.clone(), key.clone(), hit.refreshing.clone());
        tokio::spawn(async move {
            if let Err(e) = this.fetch(&key).await {
                tracing::debug!(revision = %key, error = %e, "refreshing revision");
                flag.store(false, Ordering::Release);
            }
        });
    }
}

/// The watch of every Revision, maintaining the host table.
fn watch_all(client: Client, stop: CancellationToken) -> (Store<Revision>, Arc<RwLock<HostTable>>) {
    let (store, writer) = reflector::store();
    let hosts = Arc::new(RwLock::new(HostTable::default()));
    let table = hosts.clone();
    let api: Api<Revision> = Api::all(client);
    let events = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(writer);
    // A relist builds a fresh table, swapped in when complete, so revisions deleted
    // while the watch was down disappear and requests keep routing meanwhile.
    let mut rebuilding: Option<HostTable> = None;
    super::spawn_watch("revision", events, stop, move |ev| match ev {
        watcher::Event::Init => rebuilding = Some(HostTable::default()),
        watcher::Event::InitApply(rev) => {
            if let Some(t) = rebuilding.as_mut() {
                claim(t, &rev);
            }
        }
        watcher::Event::InitDone => {
            if let Some(t) = rebuilding.take() {
                *table.write().expect("host table lock") = t;
            }
        }
        watcher::Event::Apply(rev) => claim(&mut table.write().expect("host table lock"), &rev),
        watcher::Event::Delete(rev) => table
            .write()
            .expect("host table lock")
            .remove(&key_of(&rev)),
    });
    (store, hosts)
}

fn key_of(rev: &Revision) -> RevisionKey {
    RevisionKey::new(rev.namespace().unwrap_or_default(), rev.name_any())
}

fn claim(table: &mut HostTable, rev: &Revision) {
    let created = rev
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .unwrap_or(0);
    table.upsert(&key_of(rev), created, &rev.spec.hosts);
}
