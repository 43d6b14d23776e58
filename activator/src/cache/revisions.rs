//! Revisions, and the host routing table maintained from the same watch.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crds::Revision;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::routing::{HostTable, RevisionKey};

/// Revisions known to this activator and the hosts they claim.
#[derive(Clone)]
pub struct RevisionCache {
    client: Client,
    store: Store<Revision>,
    hosts: Arc<RwLock<HostTable>>,
    /// Revisions recently read from the API server and not found.
    missing: Arc<DashMap<RevisionKey, Instant>>,
}

/// How long a revision found missing is not looked up again.
const MISS_TTL: Duration = Duration::from_secs(1);
/// Misses remembered before expired ones are dropped.
const MISSES_KEPT: usize = 10_000;

impl RevisionCache {
    /// Starts the watch; it runs until `stop` is cancelled.
    pub fn start(client: Client, stop: CancellationToken) -> Self {
        let (store, writer) = reflector::store();
        let hosts = Arc::new(RwLock::new(HostTable::default()));
        let table = hosts.clone();
        let api: Api<Revision> = Api::all(client.clone());
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
        Self {
            client,
            store,
            hosts,
            missing: Arc::new(DashMap::new()),
        }
    }

    /// Waits until the first full list has been received.
    pub async fn synced(&self) {
        // The writer is never dropped while the watch runs, so this only fails on shutdown.
        let _ = self.store.wait_until_ready().await;
    }

    pub fn get(&self, key: &RevisionKey) -> Option<Arc<Revision>> {
        self.store
            .get(&ObjectRef::new(&key.name).within(&key.namespace))
    }

    /// The revision from the cache, or — for one created a moment ago that the watch has not
    /// delivered yet — from the API server. Misses are remembered briefly so a stream of
    /// requests for a revision that does not exist costs the API server one read per second.
    pub async fn get_or_fetch(
        &self,
        key: &RevisionKey,
    ) -> Result<Option<Arc<Revision>>, kube::Error> {
        if let Some(rev) = self.get(key) {
            return Ok(Some(rev));
        }
        if self
            .missing
            .get(key)
            .is_some_and(|at| at.elapsed() < MISS_TTL)
        {
            return Ok(None);
        }
        let api: Api<Revision> = Api::namespaced(self.client.clone(), &key.namespace);
        match api.get_opt(&key.name).await? {
            Some(rev) => {
                self.missing.remove(key);
                Ok(Some(Arc::new(rev)))
            }
            None => {
                if self.missing.len() >= MISSES_KEPT {
                    // Names come from request headers: keep the map bounded.
                    self.missing.retain(|_, at| at.elapsed() < MISS_TTL);
                }
                self.missing.insert(key.clone(), Instant::now());
                Ok(None)
            }
        }
    }

    /// The revision a Host header routes to.
    pub fn resolve_host(&self, host: &str) -> Option<RevisionKey> {
        self.hosts.read().expect("host table lock").resolve(host)
    }
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
