//! ActivationEndpoints: the subsets this node belongs to (watched), and other revisions'
//! subsets (read on demand and kept briefly) for forwarding.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crds::{ActivationEndpoints, ActivatorMember};
use dashmap::DashMap;
use futures::StreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::wait::await_condition;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::routing::RevisionKey;

/// Where a request for a revision should be served.
#[derive(Debug, Clone, PartialEq)]
pub enum Membership {
    /// This node is a member: serve here, with this member entry (its pod quota); `peers` are
    /// the other members.
    Member {
        me: ActivatorMember,
        peers: Vec<ActivatorMember>,
    },
    /// Another node's activators serve it: forward to one of these.
    Others(Vec<ActivatorMember>),
    /// No subset has been published for the revision yet.
    Unassigned,
}

/// A subset read from the API server (None: no such object) and when it was read.
type Lookup = (Instant, Option<Arc<ActivationEndpoints>>);

/// The subsets this node belongs to, and a short-lived cache of the others.
#[derive(Clone)]
pub struct EndpointsCache {
    node: String,
    client: Client,
    mine: Store<ActivationEndpoints>,
    others: Arc<DashMap<RevisionKey, Lookup>>,
    ttl: Duration,
}

impl EndpointsCache {
    /// Starts the label-selected watch of the subsets listing `node`.
    pub fn start(client: Client, node: &str, ttl: Duration, stop: CancellationToken) -> Self {
        let (mine, writer) = reflector::store();
        let api: Api<ActivationEndpoints> = Api::all(client.clone());
        let cfg = watcher::Config::default()
            .labels(&crds::contract::member_selector(node))
            .any_semantic();
        let events = watcher(api, cfg).default_backoff().reflect(writer);
        tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    ev = events.next() => match ev {
                        None => return,
                        Some(Err(e)) => tracing::warn!(error = %e, "endpoints watch error; retrying"),
                        Some(Ok(_)) => {}
                    },
                }
            }
        });
        Self {
            node: node.to_string(),
            client,
            mine,
            others: Arc::new(DashMap::new()),
            ttl,
        }
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
    /// Watches only that one object, so the wait ends on the event, not on a poll.
    pub async fn await_assigned(&self, key: &RevisionKey, limit: Duration) -> Membership {
        let api: Api<ActivationEndpoints> = Api::namespaced(self.client.clone(), &key.namespace);
        let has_members = |a: Option<&ActivationEndpoints>| {
            a.and_then(|a| a.status.as_ref())
                .is_some_and(|s| !s.activators.is_empty())
        };
        match tokio::time::timeout(limit, await_condition(api, &key.name, has_members)).await {
            Ok(Ok(Some(aep))) => {
                let aep = Arc::new(aep);
                self.others
                    .insert(key.clone(), (Instant::now(), Some(aep.clone())));
                self.classify(Some(&aep))
            }
            Ok(Ok(None)) => Membership::Unassigned,
            Ok(Err(e)) => {
                tracing::warn!(revision = %key, error = %e, "waiting for the subset");
                Membership::Unassigned
            }
            Err(_elapsed) => Membership::Unassigned,
        }
    }

    /// Drops the cached copy of `key`'s subset (after a member failed to answer).
    pub fn invalidate(&self, key: &RevisionKey) {
        self.others.remove(key);
    }

    fn member_entry(&self, key: &RevisionKey) -> Option<Membership> {
        let aep = self
            .mine
            .get(&ObjectRef::new(&key.name).within(&key.namespace))?;
        match self.classify(Some(&aep)) {
            m @ Membership::Member { .. } => Some(m),
            _ => None,
        }
    }

    fn classify(&self, aep: Option<&ActivationEndpoints>) -> Membership {
        let Some(status) = aep.and_then(|a| a.status.as_ref()) else {
            return Membership::Unassigned;
        };
        if let Some(me) = status.member(&self.node) {
            return Membership::Member {
                me: me.clone(),
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
        let got = api.get_opt(&key.name).await?.map(Arc::new);
        self.others
            .insert(key.clone(), (Instant::now(), got.clone()));
        Ok(got)
    }
}
