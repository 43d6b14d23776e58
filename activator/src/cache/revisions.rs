//! Revisions, read on demand: only those requests name (by header, or by a Host resolved
//! through [`super::hosts`]). No activator watches every Revision: with 5,000 activators a
//! cluster-wide watch costs each change 5,000 events and every activator a copy of every
//! Revision (the scale rules, docs/architecture.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crds::Revision;
use dashmap::DashMap;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use kube::{Api, Client};

use super::read::get_cache_first;
use crds::ObjectKey as RevisionKey;

/// How long a revision found missing is not looked up again.
const MISS_TTL: Duration = Duration::from_secs(1);
/// How long a revision read on demand is served before it is read again (in the background:
/// requests keep using the copy they have meanwhile).
const FETCHED_TTL: Duration = Duration::from_secs(10);
/// Entries kept before expired ones are dropped (names come from request headers).
const ENTRIES_KEPT: usize = 10_000;

/// Which Revision a subset was written for: the generation the subsetter last reconciled
/// (`status.observedGeneration`) and the Revision's uid (the subset's controller
/// ownerReference). A Revision deleted and created again under the same name starts again at
/// generation 1: by generation alone, a copy of the old one looks current, and pods made of it
/// name an owner that no longer exists (the garbage collector deletes each as it is created).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubsetOf {
    pub generation: Option<i64>,
    pub uid: Option<String>,
}

impl SubsetOf {
    /// Whether `rev` is the Revision the subset was written for, at least that recent.
    pub fn held_by(&self, rev: &Revision) -> bool {
        let same = match (&self.uid, &rev.metadata.uid) {
            (Some(want), Some(have)) => want == have,
            _ => true,
        };
        same && self
            .generation
            .is_none_or(|g| rev.metadata.generation >= Some(g))
    }
}

/// A revision read on demand, or the fact that it does not exist, and when.
#[derive(Clone)]
struct Fetched {
    at: Instant,
    revision: Option<Arc<Revision>>,
    refreshing: Arc<AtomicBool>,
}

/// Revisions read from the API server, kept briefly; those of this node's subsets are read
/// ahead and kept while the node is a member.
#[derive(Clone)]
pub struct RevisionCache {
    client: Client,
    /// Asked first (a replica's memory, no API server request); the API server when it does
    /// not answer, or answers an older generation than wanted or no such revision (its cache
    /// may not have a just-created one yet).
    directory: Option<super::directory::Directory>,
    /// Reads the directory answered.
    directory_reads: prometheus_client::metrics::counter::Counter,
    fetched: Arc<DashMap<RevisionKey, Fetched>>,
    pending: Arc<DashMap<RevisionKey, Read>>,
    /// Revisions of the subsets that list this node, with the generation their subset says
    /// the subsetter last reconciled. Their copy is kept without a TTL and read again only
    /// when that generation moves past it (a spec change): a member's cold start then makes
    /// no read at all. Bounded by this node's memberships.
    pinned: Arc<DashMap<RevisionKey, Option<i64>>>,
}

/// A read in progress, shared by the requests waiting for it.
type Read = Shared<BoxFuture<'static, Result<Option<Arc<Revision>>, Arc<kube::Error>>>>;

impl RevisionCache {
    pub fn new(
        client: Client,
        directory: Option<super::directory::Directory>,
        directory_reads: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        Self {
            client,
            directory,
            directory_reads,
            fetched: Arc::new(DashMap::new()),
            pending: Arc::new(DashMap::new()),
            pinned: Arc::new(DashMap::new()),
        }
    }

    /// This node is a member of `key`'s subset, written for `of`: keep its Revision while it
    /// is. A copy of another Revision of the same name (deleted and created again) is dropped
    /// at once, so that no request uses it meanwhile. Whether and when the Revision is read
    /// ahead is the caller's ([`crate::node::read_ahead`]): [`RevisionCache::wants_read`],
    /// then [`RevisionCache::read_ahead`].
    pub fn pin(&self, key: &RevisionKey, of: &SubsetOf) {
        self.pinned.insert(key.clone(), of.generation);
        let other = self
            .fetched
            .get(key)
            .and_then(|e| e.revision.clone())
            .is_some_and(|rev| of.uid.is_some() && of.uid != rev.metadata.uid);
        if other {
            self.fetched.remove(key);
        }
    }

    /// Whether `key` is still pinned and the copy held (if any) is not the Revision `of`
    /// names: a read ahead would fetch something new.
    pub fn wants_read(&self, key: &RevisionKey, of: &SubsetOf) -> bool {
        if !self.pinned.contains_key(key) {
            return false;
        }
        let held = self.fetched.get(key).and_then(|e| e.revision.clone());
        !held.is_some_and(|rev| of.held_by(&rev))
    }

    /// Whether this node is (still) a member of `key`'s subset.
    pub fn is_pinned(&self, key: &RevisionKey) -> bool {
        self.pinned.contains_key(key)
    }

    /// Reads `key` for a membership (shared with a request's read of it, if one is in
    /// flight); a failure is left for the first request to meet again.
    pub async fn read_ahead(&self, key: &RevisionKey, of: &SubsetOf) {
        if let Err(e) = self.fetch_shared(key, of.clone()).await {
            tracing::debug!(revision = %key, error = %e, "reading a member revision ahead");
        }
    }

    /// A member revision that is the one its subset was written for (`of`): the copy held if
    /// it is, else a read (shared with [`RevisionCache::read_ahead`]'s).
    pub async fn get_member(
        &self,
        key: &RevisionKey,
        of: &SubsetOf,
    ) -> Result<Option<Arc<Revision>>, kube::Error> {
        let held = self.fetched.get(key).and_then(|e| e.revision.clone());
        if let Some(rev) = held
            && of.held_by(&rev)
        {
            return Ok(Some(rev));
        }
        self.fetch_shared(key, of.clone())
            .await
            .map_err(|e| match &*e {
                kube::Error::Api(s) => kube::Error::Api(s.clone()),
                other => kube::Error::Service(other.to_string().into()),
            })
    }

    /// This node left `key`'s subset: its copy ages out like any other.
    pub fn unpin(&self, key: &RevisionKey) {
        self.pinned.remove(key);
    }

    /// Revisions held for this node's subsets.
    pub fn pinned(&self) -> usize {
        self.pinned.len()
    }

    /// Revisions remembered now (found or missing).
    pub fn len(&self) -> usize {
        self.fetched.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fetched.is_empty()
    }

    /// The revision, from an earlier read or a new one. Reads are remembered:
    /// a revision for [`FETCHED_TTL`] (then refreshed in the background), a missing one for
    /// [`MISS_TTL`], so requests naming an unknown revision cost the API server one read per
    /// second, not one per request.
    pub async fn get_or_fetch(
        &self,
        key: &RevisionKey,
    ) -> Result<Option<Arc<Revision>>, kube::Error> {
        if let Some(known) = self.cached(key, Instant::now()) {
            return Ok(known);
        }
        self.fetch_shared(key, SubsetOf::default())
            .await
            .map_err(|e| match &*e {
                // kube::Error is not Clone: keep the API status where there is one.
                kube::Error::Api(s) => kube::Error::Api(s.clone()),
                other => kube::Error::Service(other.to_string().into()),
            })
    }

    /// What an earlier read says about `key` at `now`, without IO: `Some(Some(_))` the
    /// revision (an old answer is refreshed in the background), `Some(None)` a recent "not
    /// found", `None` when only a read can tell. The fast lane asks this first with the
    /// request's arrival time, rather than reading the clock again and arming a timeout
    /// around a lookup that is nearly always answered at once.
    pub fn cached(&self, key: &RevisionKey, now: Instant) -> Option<Option<Arc<Revision>>> {
        let hit = self.fetched.get(key).map(|e| e.clone())?;
        let age = now.saturating_duration_since(hit.at);
        match &hit.revision {
            // A member's revision is kept fresh by its subset's events, not by age.
            Some(rev) if self.pinned.contains_key(key) => Some(Some(rev.clone())),
            Some(rev) => {
                if age >= FETCHED_TTL {
                    self.refresh_in_background(key, &hit);
                }
                Some(Some(rev.clone()))
            }
            None if age < MISS_TTL => Some(None),
            None => None,
        }
    }

    /// Keeps `rev` as found elsewhere (the directory, while the API server does not answer)
    /// like a read's: refreshed from the API server once its TTL is past.
    pub fn seed(&self, key: &RevisionKey, rev: Arc<Revision>) {
        self.fetched.insert(
            key.clone(),
            Fetched {
                at: Instant::now(),
                revision: Some(rev),
                refreshing: Arc::new(AtomicBool::new(false)),
            },
        );
    }

    /// One read per revision at a time: a burst of first requests for a revision shares it.
    async fn fetch_shared(
        &self,
        key: &RevisionKey,
        want: SubsetOf,
    ) -> Result<Option<Arc<Revision>>, Arc<kube::Error>> {
        let shared = self
            .pending
            .entry(key.clone())
            .or_insert_with(|| {
                let (this, key) = (self.clone(), key.clone());
                async move {
                    let r = this.fetch(&key, &want).await.map_err(Arc::new);
                    this.pending.remove(&key);
                    r
                }
                .boxed()
                .shared()
            })
            .clone();
        shared.await
    }

    /// Reads `key` from a directory replica when one holds the Revision `want` names, else from
    /// the API server's cache (a miss, or a copy older than `want`'s generation, from etcd):
    /// see [`super::read`].
    async fn fetch(
        &self,
        key: &RevisionKey,
        want: &SubsetOf,
    ) -> Result<Option<Arc<Revision>>, kube::Error> {
        let revision = match self.directory_copy(key, want).await {
            Some(r) => Some(r),
            None => {
                let api: Api<Revision> = Api::namespaced(self.client.clone(), &key.namespace);
                get_cache_first(&api, &key.name, want.generation).await?
            }
        }
        .map(|r| Arc::new(super::trim::revision(r)));
        if self.fetched.len() >= ENTRIES_KEPT {
            let pinned = &self.pinned;
            self.fetched.retain(|k, e| {
                pinned.contains_key(k)
                    || e.at.elapsed()
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

    /// `key` as a directory replica holds it, if one answers the Revision `want` names (its
    /// uid, at its generation or later): a replica that still holds a deleted Revision of the
    /// same name, or an older generation, sends the read to the API server.
    async fn directory_copy(&self, key: &RevisionKey, want: &SubsetOf) -> Option<Revision> {
        let q = crds::directory::DirectoryQuery::Revision {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
        };
        let d = self.directory.as_ref().filter(|d| d.worth_asking())?;
        let found = d.lookup(&q).await.ok()??;
        let fresh = want.held_by(&found.revision);
        if fresh {
            self.directory_reads.inc();
        }
        fresh.then_some(found.revision)
    }

    fn refresh_in_background(&self, key: &RevisionKey, hit: &Fetched) {
        if hit.refreshing.swap(true, Ordering::AcqRel) {
            return; // one refresh at a time per revision
        }
        let (this, key, flag) = (self.clone(), key.clone(), hit.refreshing.clone());
        tokio::spawn(async move {
            if let Err(e) = this.fetch(&key, &SubsetOf::default()).await {
                tracing::debug!(revision = %key, error = %e, "refreshing revision");
                flag.store(false, Ordering::Release);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(uid: &str, generation: i64) -> Revision {
        let mut r: Revision = serde_json::from_value(serde_json::json!({
            "apiVersion": "local-activator.dev/v1alpha1",
            "kind": "Revision",
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "i"}]}}}
        }))
        .unwrap();
        r.metadata.uid = Some(uid.into());
        r.metadata.generation = Some(generation);
        r
    }

    #[test]
    fn a_copy_is_the_subsets_revision_only_with_its_uid_and_at_least_its_generation() {
        let of = |g: i64, uid: &str| SubsetOf {
            generation: Some(g),
            uid: Some(uid.into()),
        };
        assert!(of(1, "a").held_by(&rev("a", 1)));
        assert!(of(1, "a").held_by(&rev("a", 2)), "newer is fine");
        assert!(!of(2, "a").held_by(&rev("a", 1)), "older is not");
        // Deleted and created again: generation 1 both times, another uid.
        assert!(!of(1, "b").held_by(&rev("a", 1)));
        assert!(!of(1, "b").held_by(&rev("a", 7)));
        // What the subset does not say is not checked.
        assert!(SubsetOf::default().held_by(&rev("a", 1)));
        let no_uid = SubsetOf {
            generation: Some(1),
            uid: None,
        };
        assert!(no_uid.held_by(&rev("a", 1)));
    }
}
