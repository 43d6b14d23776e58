//! Host routing without a cluster-wide watch (docs/architecture.md, "The contracts"): a Host this activator has not
//! seen is looked up with one label-selected LIST of ActivationEndpoints across namespaces
//! (`host.local-activator.dev/<h>`, `resourceVersion=0` so the API server answers from its
//! cache), and the answer is kept: a revision for `positive_ttl` (then read again in the
//! background while requests keep routing), a miss for `negative_ttl`, at most
//! `ENTRIES_KEPT` hosts. Concurrent lookups of one host share one LIST.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crds::ActivationEndpoints;
use crds::contract::{host_selector, normalize_host};
use dashmap::DashMap;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crds::ObjectKey as RevisionKey;

/// Hosts kept before expired entries are swept (Host headers come from clients).
const ENTRIES_KEPT: usize = 10_000;
/// The condition a subsetter sets on revisions that lost a host to a newer one.
const HOST_CONFLICT: &str = "HostConflict";

#[derive(Clone)]
struct Entry {
    at: Instant,
    revision: Option<RevisionKey>,
    refreshing: Arc<AtomicBool>,
}

type Lookup = Shared<BoxFuture<'static, Result<Option<RevisionKey>, Arc<kube::Error>>>>;

/// Host → revision, looked up by label and cached.
#[derive(Clone)]
pub struct HostCache {
    client: Client,
    entries: Arc<DashMap<String, Entry>>,
    pending: Arc<DashMap<String, Lookup>>,
    positive_ttl: Duration,
    negative_ttl: Duration,
}

impl HostCache {
    pub fn new(client: Client, positive_ttl: Duration, negative_ttl: Duration) -> Self {
        Self {
            client,
            entries: Arc::new(DashMap::new()),
            pending: Arc::new(DashMap::new()),
            positive_ttl,
            negative_ttl,
        }
    }

    /// Hosts remembered now (found or missing).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The revision serving `host` (any spelling: port, case and trailing dot are ignored).
    pub async fn resolve(&self, host: &str) -> Result<Option<RevisionKey>, Arc<kube::Error>> {
        match self.cached(host) {
            Some(known) => Ok(known),
            None => self.lookup(normalize_host(host)).await,
        }
    }

    /// What an earlier lookup says about `host`, without IO: `Some(Some(_))` the revision (an
    /// old answer is refreshed in the background), `Some(None)` a recent "no revision",
    /// `None` when only a lookup can tell. The request path asks this first, so that a
    /// cached answer arms no timeout.
    pub fn cached(&self, host: &str) -> Option<Option<RevisionKey>> {
        let host = normalize_host(host);
        if let Some(hit) = self.entries.get(&host).map(|e| e.clone()) {
            let age = hit.at.elapsed();
            match &hit.revision {
                Some(key) => {
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
                    return Some(Some(key.clone()));
                }
                None if age < self.negative_ttl => return Some(None),
                None => {}
            }
        }
        None
    }

    /// Remembers `host` → `revision` as found elsewhere (the directory, while the API server
    /// does not answer); it is read again from the API server once its TTL is past.
    pub fn seed(&self, host: &str, revision: RevisionKey) {
        self.store(&normalize_host(host), Some(revision));
    }

    /// Forgets `host` (its revision turned out not to claim it).
    pub fn forget(&self, host: &str) {
        self.entries.remove(&normalize_host(host));
    }

    async fn lookup(&self, host: String) -> Result<Option<RevisionKey>, Arc<kube::Error>> {
        let shared = self
            .pending
            .entry(host.clone())
            .or_insert_with(|| {
                let this = self.clone();
                let h = host.clone();
                async move {
                    let r = this.list(&h).await.map_err(Arc::new);
                    if let Ok(revision) = &r {
                        this.store(&h, revision.clone());
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

    async fn list(&self, host: &str) -> Result<Option<RevisionKey>, kube::Error> {
        let api: Api<ActivationEndpoints> = Api::all(self.client.clone());
        let lp = ListParams::default()
            .labels(&host_selector(host))
            .match_any();
        let found = api.list(&lp).await?;
        Ok(winner(&found.items))
    }

    fn store(&self, host: &str, revision: Option<RevisionKey>) {
        if self.entries.len() >= ENTRIES_KEPT {
            let (pos, neg) = (self.positive_ttl, self.negative_ttl);
            self.entries
                .retain(|_, e| e.at.elapsed() < if e.revision.is_some() { pos } else { neg });
            // Still full of live entries (a flood of distinct hosts): drop misses first.
            if self.entries.len() >= ENTRIES_KEPT {
                self.entries.retain(|_, e| e.revision.is_some());
            }
        }
        self.entries.insert(
            host.to_string(),
            Entry {
                at: Instant::now(),
                revision,
                refreshing: Arc::new(AtomicBool::new(false)),
            },
        );
    }
}

/// Among the ActivationEndpoints claiming a host: those the subsetter marked as having lost
/// it are out; of the rest, the newest (creationTimestamp, then name, then namespace) wins,
/// the rule the subsetter applies, for the moment before it has marked the loser.
pub fn winner(claims: &[ActivationEndpoints]) -> Option<RevisionKey> {
    claims
        .iter()
        .filter(|a| {
            !a.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == HOST_CONFLICT && c.status == "True")
            })
        })
        .max_by(|a, b| {
            let k = |x: &ActivationEndpoints| {
                (
                    x.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    x.name_any(),
                    x.namespace().unwrap_or_default(),
                )
            };
            k(a).cmp(&k(b))
        })
        .map(|a| RevisionKey::new(a.namespace().unwrap_or_default(), a.name_any()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::ActivationEndpointsStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn aep(ns: &str, name: &str, created: i64, conflict: bool) -> ActivationEndpoints {
        let mut a = ActivationEndpoints::new(name, Default::default());
        a.metadata.namespace = Some(ns.into());
        a.metadata.creation_timestamp = Some(Time(jiff::Timestamp::from_second(created).unwrap()));
        if conflict {
            a.status = Some(ActivationEndpointsStatus {
                conditions: vec![Condition {
                    type_: HOST_CONFLICT.into(),
                    status: "True".into(),
                    reason: "HostClaimedByNewerRevision".into(),
                    message: String::new(),
                    last_transition_time: Time(jiff::Timestamp::from_second(created).unwrap()),
                    observed_generation: None,
                }],
                ..Default::default()
            });
        }
        a
    }

    #[test]
    fn newest_unconflicted_claim_wins() {
        assert_eq!(winner(&[]), None);
        let old = aep("a", "old", 10, false);
        let new = aep("a", "new", 20, false);
        assert_eq!(
            winner(&[old.clone(), new.clone()]),
            Some(RevisionKey::new("a", "new"))
        );
        // Once the subsetter has marked the loser, the mark decides even against the clock.
        let marked_new = aep("a", "new", 20, true);
        assert_eq!(
            winner(&[old.clone(), marked_new]),
            Some(RevisionKey::new("a", "old"))
        );
        // Same second: the greater name.
        let twin = aep("a", "zz", 20, false);
        assert_eq!(winner(&[new, twin]), Some(RevisionKey::new("a", "zz")));
    }
}
