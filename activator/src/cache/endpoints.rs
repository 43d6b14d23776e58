//! ActivationEndpoints: the subsets this node belongs to (watched), and other revisions'
//! subsets (read on demand and kept briefly) for forwarding.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crds::{ActivationEndpoints, ActivatorMember};
use dashmap::DashMap;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::wait::await_condition;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::read::get_cache_first;
use super::revisions::SubsetOf;
use crds::ObjectKey as RevisionKey;

/// Where a request for a revision should be served.
#[derive(Debug, Clone, PartialEq)]
pub enum Membership {
    /// This node is a member: serve here, with this member entry (its pod quota); `peers` are
    /// the other members.
    Member {
        me: Arc<ActivatorMember>,
        peers: Arc<[ActivatorMember]>,
    },
    /// Another node's activators serve it: forward to one of these.
    Others(Vec<ActivatorMember>),
    /// No subset has been published for the revision yet.
    Unassigned,
}

/// What the subset watch tells the rest of the activator about this node's memberships.
#[derive(Debug, Clone)]
pub enum MemberEvent {
    /// A subset lists this node (again, or changed), written for the Revision `of` names.
    /// `listed`: seen in the watch's list (at start, or a re-list after the watch failed),
    /// not as a change: a start finds all of this node's memberships at once.
    Member {
        key: RevisionKey,
        me: ActivatorMember,
        of: SubsetOf,
        listed: bool,
    },
    /// A subset no longer lists this node (or is gone).
    Left(RevisionKey),
}

/// Where this node's memberships come from.
pub enum MemberSource {
    /// A label-selected watch of the API server (a list at start).
    Watch,
    /// The same watch, its first state from the directory (`seeded.rs`).
    Seeded(super::directory::Directory),
    /// Streamed by a directory replica; the API server's watch only as a bounded fallback
    /// (`member_stream.rs`).
    Streamed(Box<Streamed>),
}

/// A streamed source's settings.
pub struct Streamed {
    pub directory: super::directory::Directory,
    pub proof: Option<http::HeaderValue>,
    pub hosts_moved: Option<mpsc::UnboundedSender<Vec<String>>>,
    pub tuning: super::member_stream::Tuning,
    pub counters: super::member_stream::StreamCounters,
}

/// A shared wait for a new revision's subset.
type SubsetWatch = Shared<BoxFuture<'static, Option<Arc<ActivationEndpoints>>>>;

/// How long one shared wait for a new revision's subset lasts.
const SUBSET_WATCH_LIMIT: Duration = Duration::from_secs(30);

/// A subset read from the API server (None: no such object) and when it was read.
type Lookup = (Instant, Option<Arc<ActivationEndpoints>>);

/// The subsets this node belongs to, and a short-lived cache of the others.
#[derive(Clone)]
pub struct EndpointsCache {
    node: String,
    client: Client,
    mine: Store<ActivationEndpoints>,
    others: Arc<DashMap<RevisionKey, Lookup>>,
    /// Waits in progress for new revisions' subsets.
    assigning: Arc<DashMap<RevisionKey, SubsetWatch>>,
    /// This node's memberships as last classified, for the warm path (no clones, no store
    /// lookup), valid while `epoch` is what it was when they were computed.
    memo: Arc<DashMap<RevisionKey, (u64, Membership)>>,
    /// Bumped by every event of the watch (after the store has taken it).
    epoch: Arc<AtomicU64>,
    ttl: Duration,
}

/// Tells `member_of` what one event of the subset watch says of `me`'s memberships: a subset
/// listing it (with whether it came from a list), or one that no longer does.
fn tell_member_of(
    ev: watcher::Event<ActivationEndpoints>,
    me: &str,
    member_of: &mpsc::UnboundedSender<MemberEvent>,
) {
    let key_of = |aep: &ActivationEndpoints| {
        let ns = aep.metadata.namespace.clone()?;
        Some(RevisionKey::new(ns, aep.metadata.name.clone()?))
    };
    let listed = matches!(ev, watcher::Event::InitApply(_));
    match ev {
        watcher::Event::Apply(aep) | watcher::Event::InitApply(aep) => {
            let status = aep.status.as_ref();
            match (key_of(&aep), status.and_then(|s| s.member(me))) {
                (Some(key), Some(m)) => {
                    let _ = member_of.send(MemberEvent::Member {
                        key,
                        me: m.clone(),
                        of: SubsetOf {
                            generation: status.and_then(|s| s.observed_generation),
                            uid: aep
                                .owner_references()
                                .iter()
                                .find(|o| o.controller == Some(true))
                                .map(|o| o.uid.clone()),
                        },
                        listed,
                    });
                }
                (Some(key), None) => {
                    let _ = member_of.send(MemberEvent::Left(key));
                }
                _ => {}
            }
        }
        watcher::Event::Delete(aep) => {
            if let Some(key) = key_of(&aep) {
                let _ = member_of.send(MemberEvent::Left(key));
            }
        }
        _ => {}
    }
}

impl EndpointsCache {
    /// Starts following the subsets listing `node`, from `source`. Each subset that lists
    /// this node is sent to `member_of` as it is seen (its Revision is read ahead of the first
    /// request, and a share of minScale starts pods without one), and each that stops listing
    /// it as [`MemberEvent::Left`].
    pub fn start(
        client: Client,
        node: &str,
        ttl: Duration,
        stop: CancellationToken,
        member_of: mpsc::UnboundedSender<MemberEvent>,
        source: MemberSource,
    ) -> Self {
        let (mine, writer) = reflector::store();
        let api: Api<ActivationEndpoints> = Api::all(client.clone());
        let cfg = watcher::Config {
            // One page from the API server's watch cache, not pages from etcd (see the pod
            // watch in pods.rs): bounded by this node's memberships.
            page_size: None,
            ..watcher::Config::default()
                .labels(&crds::contract::member_selector(node))
                .any_semantic()
        };
        let events = match source {
            // As the pod watch (pods.rs): bounded back-off, a 410 re-lists at once.
            MemberSource::Watch => crds::backoff::resilient(watcher::watcher(api, cfg)).boxed(),
            MemberSource::Seeded(directory) => crds::backoff::resilient(super::seeded::watch(
                api,
                cfg,
                node.to_string(),
                Some(directory),
            ))
            .boxed(),
            MemberSource::Streamed(s) => {
                super::member_stream::events(super::member_stream::Source {
                    node: node.to_string(),
                    directory: s.directory,
                    proof: s.proof,
                    held: mine.clone(),
                    api,
                    fallback: cfg,
                    hosts_moved: s.hosts_moved,
                    tuning: s.tuning,
                    counters: s.counters,
                })
            }
        };
        let events = events.modify(super::trim::subset).reflect(writer);
        let me = node.to_string();
        let memo: Arc<DashMap<RevisionKey, (u64, Membership)>> = Arc::default();
        let epoch: Arc<AtomicU64> = Arc::default();
        let (memo_w, epoch_w) = (memo.clone(), epoch.clone());
        super::spawn_watch("endpoints", events, stop, move |ev| {
            // Memberships classified before this event may be stale: all of them go (the
            // watch holds this node's subsets only, so events are few).
            epoch_w.fetch_add(1, Ordering::AcqRel);
            memo_w.clear();
            tell_member_of(ev, &me, &member_of);
        });
        Self {
            node: node.to_string(),
            client,
            mine,
            others: Arc::new(DashMap::new()),
            assigning: Arc::new(DashMap::new()),
            memo,
            epoch,
            ttl,
        }
    }

    /// (subsets listing this node, other revisions' subsets looked up) cached now.
    pub fn counts(&self) -> (usize, usize) {
        (self.mine.state().len(), self.others.len())
    }

    pub async fn synced(&self) {
        let _ = self.mine.wait_until_ready().await;
    }

    /// Where `key` is served. `confirm` re-reads the object from the API server when this node
    /// does not appear to be a member: a forwarded request (it carries the hop header) was sent
    /// here because a peer saw this node in the subset, and this node's watch may lag behind.
    pub async fn membership(
        &self,
        key: &RevisionKey,
        confirm: bool,
    ) -> Result<Membership, kube::Error> {
        if let Some(m) = self.member_entry(key) {
            return Ok(m);
        }
        let aep = self.lookup(key, confirm).await?;
        Ok(self.classify(aep.as_deref()))
    }

    /// Waits, at most `limit`, for the subset of a revision that has none yet (a request that
    /// arrives right after its Revision was created, before the subsetter has written it).
    /// Watches only that one object, so the wait ends on the event, not on a poll; concurrent
    /// requests for the revision share one watch.
    pub async fn await_assigned(&self, key: &RevisionKey, limit: Duration) -> Membership {
        let shared = self
            .assigning
            .entry(key.clone())
            .or_insert_with(|| self.subset_watch(key))
            .clone();
        let got = tokio::time::timeout(limit, shared).await.ok().flatten();
        if let Some(aep) = got {
            self.others
                .insert(key.clone(), (Instant::now(), Some(aep.clone())));
            return self.classify(Some(&aep));
        }
        Membership::Unassigned
    }

    /// One watch of `key`'s ActivationEndpoints until it has members, or `SUBSET_WATCH_LIMIT`.
    fn subset_watch(&self, key: &RevisionKey) -> SubsetWatch {
        let api: Api<ActivationEndpoints> = Api::namespaced(self.client.clone(), &key.namespace);
        let (key, assigning) = (key.clone(), self.assigning.clone());
        async move {
            let has_members = |a: Option<&ActivationEndpoints>| {
                a.and_then(|a| a.status.as_ref())
                    .is_some_and(|s| !s.activators.is_empty())
            };
            let cond = await_condition(api, &key.name, has_members);
            let got = match tokio::time::timeout(SUBSET_WATCH_LIMIT, cond).await {
                Ok(Ok(aep)) => aep.map(|mut a| {
                    super::trim::subset(&mut a);
                    Arc::new(a)
                }),
                Ok(Err(e)) => {
                    tracing::warn!(revision = %key, error = %e, "waiting for the subset");
                    None
                }
                Err(_elapsed) => None,
            };
            assigning.remove(&key);
            got
        }
        .boxed()
        .shared()
    }

    /// Keeps `key`'s subset as found elsewhere (the directory, while the API server does not
    /// answer) like a lookup's, and says where the revision is served.
    pub fn seed(&self, key: &RevisionKey, aep: Option<Arc<ActivationEndpoints>>) -> Membership {
        let m = self.classify(aep.as_deref());
        self.others.insert(key.clone(), (Instant::now(), aep));
        m
    }

    /// Drops the cached copy of `key`'s subset (after a member failed to answer).
    pub fn invalidate(&self, key: &RevisionKey) {
        self.others.remove(key);
    }

    /// Where `key` is served, if this node is a member of its (watched) subset: no IO.
    pub fn member_entry(&self, key: &RevisionKey) -> Option<Membership> {
        // Read before the store: an event that lands in between makes this entry stale.
        let epoch = self.epoch.load(Ordering::Acquire);
        if let Some(hit) = self.memo.get(key)
            && hit.0 == epoch
        {
            return Some(hit.1.clone());
        }
        let aep = self
            .mine
            .get(&ObjectRef::new(&key.name).within(&key.namespace))?;
        match self.classify(Some(&aep)) {
            m @ Membership::Member { .. } => {
                self.memo.insert(key.clone(), (epoch, m.clone()));
                Some(m)
            }
            _ => None,
        }
    }

    /// Whether this node's watched copy of `key`'s subset is newer than the version a host
    /// answer read it at (`answered`): the subsetter wrote it since (a Route's split changed,
    /// a host was handed over). False when the subset is not one of this node's. No IO.
    pub fn subset_newer_than(&self, key: &RevisionKey, answered: &str) -> bool {
        self.mine
            .get(&ObjectRef::new(&key.name).within(&key.namespace))
            .and_then(|a| {
                let mine = a.metadata.resource_version.as_deref()?;
                Some(super::host_route::newer(mine, answered))
            })
            .unwrap_or(false)
    }

    fn classify(&self, aep: Option<&ActivationEndpoints>) -> Membership {
        let Some(status) = aep.and_then(|a| a.status.as_ref()) else {
            return Membership::Unassigned;
        };
        if let Some(me) = status.member(&self.node) {
            return Membership::Member {
                me: Arc::new(me.clone()),
                peers: status
                    .activators
                    .iter()
                    .filter(|m| m.node != self.node)
                    .cloned()
                    .collect(),
            };
        }
        if status.activators.is_empty() {
            Membership::Unassigned
        } else {
            Membership::Others(status.activators.clone())
        }
    }

    async fn lookup(
        &self,
        key: &RevisionKey,
        fresh: bool,
    ) -> Result<Option<Arc<ActivationEndpoints>>, kube::Error> {
        if !fresh
            && let Some(hit) = self.others.get(key)
            && hit.0.elapsed() < self.ttl
        {
            return Ok(hit.1.clone());
        }
        let api: Api<ActivationEndpoints> = Api::namespaced(self.client.clone(), &key.namespace);
        // A fresh look (this node's own watch, or a member, was found stale) reads etcd; any
        // other from the API server's cache, as a TTL-cached copy is at least as old.
        let got = if fresh {
            api.get_opt(&key.name).await?
        } else {
            get_cache_first(&api, &key.name, None).await?
        }
        .map(|mut a| {
            super::trim::subset(&mut a);
            Arc::new(a)
        });
        self.others
            .insert(key.clone(), (Instant::now(), got.clone()));
        Ok(got)
    }
}
