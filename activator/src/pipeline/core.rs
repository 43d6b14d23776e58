//! The transport-neutral core of the request path: the state it needs ([`Core`]) and its
//! stages, top to bottom, each one function below — hyper's adapter
//! (`crate::pipeline::handler`) and the fast lane (`crate::fast`) both hold a [`Core`] and
//! differ only in how they carry bytes (stage 4, proxy, is theirs):
//!
//! 1. **resolve** ([`Core::resolve`]): the revision a request names, and the Revision;
//! 2. **route** ([`Core::route`]): serve here, with the members ahead of this one, or forward
//!    to other members;
//! 3. **admit** ([`Core::admit`], [`Core::no_slot`]): a slot on a pod of the revision here,
//!    or why there is none; a pod that refuses the connection is retried ([`Core::pod_retries`]);
//! 5. **account** ([`Core::account`]): one count per request by route and status.
//!
//! The fast lane carries a request only when the route is "here, nobody ahead" and hands
//! everything else to hyper's adapter, which decides again from warm caches.

use std::sync::Arc;

use crds::contract::normalize_host;
use crds::directory::DirectoryQuery;
use crds::{ActivatorMember, Revision};
use rand::RngExt;
use tokio::time::Instant;

use prometheus_client::metrics::counter::Counter;
use tokio_util::sync::CancellationToken;

use super::retries::PodRetries;
use super::rules::{API_READ_LIMIT, SUBSET_WAIT, can_start};
use crate::cache::api_health::ApiHealth;
use crate::cache::directory::Directory;
use crate::cache::endpoints::{EndpointsCache, Membership};
use crate::cache::host_route::Target;
use crate::cache::hosts::HostCache;
use crate::cache::revisions::RevisionCache;
use crate::node::pool::{Lease, NoSlot, Spec};
use crate::node::pools::Pools;
use crate::ops::metrics::{HostRefresh, Metrics, Outcome, Route};
use crate::wire::answer::Refusal;
use crate::wire::naming::{Named, RevisionKey, Unnamed};

/// What the request path's stages need, whatever carries the request: the caches, this
/// node's pools, the metrics. One per serving thread, shared by its hyper adapter and its
/// fast lane.
pub struct Core {
    pub node: String,
    pub revisions: RevisionCache,
    /// Host lookups; None when Host routing is off (`--host-routing=false`).
    pub hosts: Option<HostCache>,
    pub endpoints: EndpointsCache,
    pub pools: Pools,
    pub metrics: Arc<Metrics>,
    /// Cancelled when the activator starts draining.
    pub draining: CancellationToken,
    /// Whether the API server answers: a read it does not is given up at once.
    pub api: ApiHealth,
    /// Where lookups the API server does not answer are asked (None: nowhere).
    pub directory: Option<Directory>,
    /// How often a request is tried on another pod after a refused connection.
    pub pod_retries: u32,
}

/// Where stage 2 sends the request.
pub(crate) enum RouteTo {
    /// This node serves it, as this member; `peers` take it if this node cannot.
    Here {
        spec: Spec,
        peers: Arc<[ActivatorMember]>,
        /// Members ranked ahead of this one that are tried first (this node is not the
        /// revision's primary and has no pod of its own: one pod per wake-up).
        ahead: Vec<ActivatorMember>,
    },
    /// Other members serve it.
    Elsewhere(Vec<ActivatorMember>),
}

/// What the directory answered, kept in the caches.
struct Found {
    key: RevisionKey,
    rev: Arc<Revision>,
    membership: Membership,
}

/// Stage 1's answer: the revision, and how it was found from the request's Host.
pub(crate) struct Resolved {
    pub key: RevisionKey,
    pub rev: Arc<Revision>,
    /// Set when the revision was picked from a host answer (the request named only a Host).
    pub pick: Option<HostPick>,
}

/// A revision picked from a host answer: what a forward tells the member (the revision, the
/// version of its subset in the answer), and the host to read again when the member says the
/// answer is older than its subset.
pub(crate) struct HostPick {
    /// Normalized.
    pub host: String,
    /// The resourceVersion of the picked revision's ActivationEndpoints in the host answer
    /// (None: the directory's answer).
    pub version: Option<Arc<str>>,
}

/// What a Host names (stage 1).
enum ByHost<'a> {
    /// The revision picked from the host's answer, with the host and the cache it came from;
    /// `legacy`: the answer is the legacy rule's claimant, so the Revision once read must
    /// claim the host (else it is forgotten).
    Key {
        key: RevisionKey,
        pick: HostPick,
        hosts: &'a HostCache,
        legacy: bool,
    },
    /// The directory's answer, the Revision included (seeded in the caches).
    Directory(Found, HostPick),
}

/// A cached host whose revision no longer claims it (hosts moved): look again next time.
/// Only for the legacy rule's answers: a Route's revisions need not claim the hosts it routes
/// to them (a tag's `<tag>-<host>` never is).
fn still_claimed(h: &str, hosts: &HostCache, rev: &Revision) -> Result<(), Refusal> {
    if !rev.spec.hosts.iter().any(|c| normalize_host(c) == h) {
        hosts.forget(h);
        return Err(Refusal::unknown_revision(format!(
            "no revision serves host {h}"
        )));
    }
    Ok(())
}

/// Stage 2's answer when no member may start a pod of the revision.
fn no_share(key: &RevisionKey) -> Refusal {
    Refusal::unavailable(format!(
        "no member of revision {key} has a share of its maxScale"
    ))
}

impl Core {
    /// Stage 1: the revision a request names (`named`, from its headers or its Host), and
    /// the Revision itself. Cached answers come without a timer; what the API server does not
    /// answer is asked of the directory (`cache::directory`). A Host split between revisions
    /// picks one here, per request.
    pub(crate) async fn resolve(
        &self,
        named: Result<Named, Unnamed>,
        arrived: Instant,
    ) -> Result<Resolved, Refusal> {
        let (key, by_host) = match named {
            Ok(Named::Revision(key)) => (key, None),
            Ok(Named::Host(host)) => match self.host_key(host).await? {
                ByHost::Key {
                    key,
                    pick,
                    hosts,
                    legacy,
                } => (key, Some((pick, hosts, legacy))),
                // The directory answered with the Revision itself: nothing more to read.
                ByHost::Directory(found, pick) => {
                    return Ok(Resolved {
                        key: found.key,
                        rev: found.rev,
                        pick: Some(pick),
                    });
                }
            },
            Err(Unnamed::BadName(why)) => return Err(Refusal::bad_request(why)),
            Err(Unnamed::Nothing) => {
                return Err(Refusal::unknown_revision(
                    "the request names no revision and no host",
                ));
            }
        };
        let forget = by_host
            .as_ref()
            .map(|(p, hosts, _)| (p.host.as_str(), *hosts));
        let rev = self.read_revision(&key, forget, arrived).await?;
        if let Some((pick, hosts, legacy)) = &by_host
            && *legacy
        {
            still_claimed(&pick.host, hosts, &rev)?;
        }
        Ok(Resolved {
            key,
            rev,
            pick: by_host.map(|(pick, _, _)| pick),
        })
    }

    /// Stage 1, a request named by its Host: the revision that serves it, picked by weight
    /// from the host cache's answer or the API server's, or — when the API server does not
    /// answer — the directory's Revision.
    async fn host_key(&self, host: String) -> Result<ByHost<'_>, Refusal> {
        let Some(hosts) = &self.hosts else {
            return Err(Refusal::unknown_revision(format!(
                "Host routing is off on this activator: name the revision with the \
                 x-revision-namespace and x-revision-name headers (host {host})"
            )));
        };
        let found = match hosts.cached(&host) {
            Some(known) => Ok(Ok(known)),
            None => self.api.within(API_READ_LIMIT, hosts.resolve(&host)).await,
        };
        match found {
            Ok(Ok(Some(route))) => {
                let host = normalize_host(&host);
                let target = route.pick(rand::rng().random::<u32>());
                self.compare_locally(&host, target, hosts);
                Ok(ByHost::Key {
                    key: target.key.clone(),
                    pick: HostPick {
                        host,
                        version: target.version.clone(),
                    },
                    hosts,
                    legacy: !route.is_routed(),
                })
            }
            Ok(Ok(None)) => Err(Refusal::unknown_revision(format!(
                "no revision serves host {host}"
            ))),
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "the API server did not answer".to_string(),
                };
                let q = DirectoryQuery::Host(normalize_host(&host));
                match self.ask_directory(&q).await {
                    Some(Some(found)) => {
                        hosts.seed(&host, found.key.clone());
                        let pick = HostPick {
                            host: normalize_host(&host),
                            version: None,
                        };
                        Ok(ByHost::Directory(found, pick))
                    }
                    Some(None) => Err(Refusal::unknown_revision(format!(
                        "no revision serves host {host}"
                    ))),
                    None => Err(Refusal::unavailable(format!(
                        "looking up host {host}: {why}"
                    ))),
                }
            }
        }
    }

    /// An entry that is itself a member of the revision it picked has that revision's subset
    /// watched: newer than the host answer's copy, the subsetter wrote it since (a Route's
    /// split changed, a host was handed over), so the host is read again in the background.
    /// This request keeps its pick.
    fn compare_locally(&self, host: &str, target: &Target, hosts: &HostCache) {
        if let Some(answered) = &target.version
            && self.endpoints.subset_newer_than(&target.key, answered)
        {
            hosts.refresh(host, HostRefresh::LocalNewer);
        }
    }

    /// Stage 1, the Revision `key` names: nearly always cached (no timeout armed, no clock
    /// read: the arrival time serves), else read from the API server or, when it does not
    /// answer, asked of the directory. A host that led to a revision that is gone is
    /// forgotten (`host`).
    async fn read_revision(
        &self,
        key: &RevisionKey,
        host: Option<(&str, &HostCache)>,
        arrived: Instant,
    ) -> Result<Arc<Revision>, Refusal> {
        let read = match self.revisions.cached(key, arrived.into_std()) {
            Some(known) => Ok(Ok(known)),
            None => {
                self.api
                    .within(API_READ_LIMIT, self.revisions.get_or_fetch(key))
                    .await
            }
        };
        match read {
            Ok(Ok(Some(rev))) => Ok(rev),
            Ok(Ok(None)) => {
                if let Some((h, hosts)) = host {
                    hosts.forget(h);
                }
                Err(Refusal::unknown_revision(key))
            }
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "the API server did not answer".to_string(),
                };
                let q = DirectoryQuery::Revision {
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                };
                match self.ask_directory(&q).await {
                    Some(Some(found)) => Ok(found.rev),
                    Some(None) => Err(Refusal::unknown_revision(key)),
                    None => Err(Refusal::unavailable(format!(
                        "reading revision {key}: {why}"
                    ))),
                }
            }
        }
    }

    /// Asks the directory what the API server did not answer, and keeps the answer in the
    /// caches a lookup fills (the revision, its subset). None: no directory, or no replica
    /// answered; `Some(None)`: it knows no such host or revision.
    async fn ask_directory(&self, q: &DirectoryQuery) -> Option<Option<Found>> {
        let directory = self.directory.as_ref()?;
        match directory.lookup(q).await {
            Ok(Some(found)) => {
                self.metrics.directory_answered.inc();
                let rev = Arc::new(found.revision);
                let key = RevisionKey::new(
                    rev.metadata.namespace.clone().unwrap_or_default(),
                    rev.metadata.name.clone().unwrap_or_default(),
                );
                self.revisions.seed(&key, rev.clone());
                let membership = self.endpoints.seed(&key, found.endpoints.map(Arc::new));
                Some(Some(Found {
                    key,
                    rev,
                    membership,
                }))
            }
            Ok(None) => {
                self.metrics.directory_answered.inc();
                Some(None)
            }
            Err(e) => {
                self.metrics.directory_failed.inc();
                tracing::warn!(error = %e, "the directory did not answer a lookup either");
                None
            }
        }
    }

    /// Stage 2: serve here, or which members to forward to.
    pub(crate) async fn route(
        &self,
        key: &RevisionKey,
        rev: &Arc<Revision>,
        hopped: bool,
        deadline: Instant,
    ) -> Result<RouteTo, Refusal> {
        let can_start = |m: &ActivatorMember| can_start(rev, m);
        // The subsets this node belongs to are watched: answered at once. Anything else
        // is read from the API server, boxed so that a request's state stays small.
        let membership = match self.endpoints.member_entry(key) {
            Some(m) => m,
            None => Box::pin(self.membership(key, rev, hopped, deadline)).await?,
        };
        match membership {
            Membership::Member { me, peers } if can_start(&me) => {
                Ok(self.here_as_member(key, rev, me, peers, hopped))
            }
            // A member without a share of maxScale may not create pods: the members with
            // one serve (the contracts, docs/architecture.md: shares sum to at most maxScale). A forwarded request
            // that lands here anyway is served if a pod is running (none can be).
            Membership::Member { me, peers } => {
                self.member_without_share(key, rev, me, &peers, hopped)
            }
            // A peer forwarded it here because its copy of the subset lists this node: while
            // the subset moves (a node back from a fault, a rebalance), a pod still here
            // serves it. No new pod is made for it, and it is not sent on (one hop).
            Membership::Unassigned | Membership::Others(_)
                if hopped && let Some(spec) = self.pools.usable_spec(key) =>
            {
                self.metrics.served_as_former_member.inc();
                Ok(RouteTo::Here {
                    spec,
                    peers: Arc::from(Vec::new()),
                    ahead: Vec::new(),
                })
            }
            Membership::Unassigned => Err(Refusal::unavailable(format!(
                "revision {key} has no activators assigned yet"
            ))),
            Membership::Others(_) if hopped => Err(Refusal::unavailable(format!(
                "forwarded request for revision {key} reached node {}, which is not a member",
                self.node
            ))),
            Membership::Others(members) => {
                let members: Vec<ActivatorMember> = members.into_iter().filter(can_start).collect();
                if members.is_empty() {
                    return Err(no_share(key));
                }
                Ok(RouteTo::Elsewhere(members))
            }
        }
    }

    /// Stage 2, this node a member with a share of maxScale: served here. A forwarded
    /// request, or a revision with a pod here, is served here at once; else the members
    /// ranked ahead of this one (the primary first) are asked first.
    fn here_as_member(
        &self,
        key: &RevisionKey,
        rev: &Arc<Revision>,
        me: Arc<ActivatorMember>,
        peers: Arc<[ActivatorMember]>,
        hopped: bool,
    ) -> RouteTo {
        let ahead = if hopped || self.pools.has_usable_pod(key) {
            Vec::new()
        } else {
            let starters = peers.iter().filter(|m| can_start(rev, m)).cloned();
            crate::pipeline::primary::ahead_of(key, &self.node, starters)
        };
        RouteTo::Here {
            spec: Spec {
                rev: rev.clone(),
                me,
            },
            peers,
            ahead,
        }
    }

    /// Stage 2, this node a member without a share of maxScale: the members with one, or
    /// here for a forwarded request (not sent on: one hop).
    fn member_without_share(
        &self,
        key: &RevisionKey,
        rev: &Arc<Revision>,
        me: Arc<ActivatorMember>,
        peers: &[ActivatorMember],
        hopped: bool,
    ) -> Result<RouteTo, Refusal> {
        let with_share: Vec<ActivatorMember> = peers
            .iter()
            .filter(|m| can_start(rev, m))
            .cloned()
            .collect();
        if hopped || with_share.is_empty() {
            if hopped {
                return Ok(RouteTo::Here {
                    spec: Spec {
                        rev: rev.clone(),
                        me,
                    },
                    peers: Arc::from(Vec::new()),
                    ahead: Vec::new(),
                });
            }
            return Err(no_share(key));
        }
        Ok(RouteTo::Elsewhere(with_share))
    }

    /// Stage 2, not a watched subset: the revision's subset read from the API server, or
    /// awaited when it has not been published yet.
    async fn membership(
        &self,
        key: &RevisionKey,
        rev: &Arc<Revision>,
        hopped: bool,
        deadline: Instant,
    ) -> Result<Membership, Refusal> {
        let limit = deadline
            .saturating_duration_since(Instant::now())
            .min(API_READ_LIMIT);
        let read = self
            .api
            .within(limit, self.endpoints.membership(key, hopped));
        let read = match read.await {
            Ok(Ok(m)) => Ok(Ok(m)),
            // What the API server does not answer, the directory may.
            failed => {
                let q = DirectoryQuery::Revision {
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                };
                match self.ask_directory(&q).await {
                    Some(Some(found)) => Ok(Ok(found.membership)),
                    _ => failed,
                }
            }
        };
        match read {
            // The subsetter gives an invalid revision no subset: say why instead of waiting.
            Ok(Ok(Membership::Unassigned)) if !rev.problems().is_empty() => {
                Err(Refusal::bad_gateway(format!(
                    "revision {key} is invalid: {}",
                    rev.problems().join("; ")
                )))
            }
            // A revision created a moment ago: its subset is being written.
            Ok(Ok(Membership::Unassigned)) => {
                let left = deadline.saturating_duration_since(Instant::now());
                Ok(self
                    .endpoints
                    .await_assigned(key, left.min(SUBSET_WAIT))
                    .await)
            }
            Ok(Ok(m)) => Ok(m),
            Ok(Err(e)) => Err(Refusal::unavailable(format!(
                "reading the activators of revision {key}: {e}"
            ))),
            Err(_) => Err(Refusal::unavailable(format!(
                "reading the activators of revision {key}: the API server did not answer"
            ))),
        }
    }

    /// Stage 3: a slot, from the revision's pool (a fresh one if it retired meanwhile).
    pub(crate) async fn admit(
        &self,
        key: &RevisionKey,
        spec: &Spec,
        arrived: Instant,
        can_forward: bool,
    ) -> Result<Lease, NoSlot> {
        for _ in 0..3 {
            let pool = self.pools.get(key, &spec.rev, &spec.me);
            match pool.acquire(spec, arrived, can_forward).await {
                Err(NoSlot::Retired) => {}
                r => return r,
            }
        }
        Err(NoSlot::Retired)
    }

    /// The answer to a request no slot can be found for here (and that is not forwarded):
    /// 503 for a full buffer (counted), a node that cannot serve it, or a pod that cannot be
    /// made now (the API server does not answer); 502 for a revision whose pods cannot be
    /// made at all. Both request paths answer with it.
    pub(crate) fn no_slot(&self, key: &RevisionKey, no: NoSlot) -> Refusal {
        match no {
            NoSlot::Full(why) => {
                self.metrics.buffer_full.inc();
                Refusal::unavailable(why)
            }
            NoSlot::Elsewhere(why) => Refusal::unavailable(why),
            NoSlot::Retired => Refusal::unavailable(format!(
                "revision {key}: no pool on this node took the request"
            )),
            NoSlot::Failed(why) => Refusal::bad_gateway(why),
            NoSlot::Unavailable(why) => Refusal::unavailable(why),
        }
    }

    /// Stage 3, after a pod refused the connection: the request takes another slot as it
    /// is, a bounded number of times ([`PodRetries`]).
    pub(crate) fn pod_retries(&self) -> PodRetries<'_> {
        PodRetries::new(self.pod_retries, &self.metrics)
    }

    /// Stage 5: one count per request, by route and status.
    pub(crate) fn account(&self, route: Route, code: u16) {
        self.metrics
            .requests
            .get_or_create(&Outcome { route, code })
            .inc();
    }

    /// Stage 5 on a connection that counts request after request: the counter of the last
    /// outcome is kept in `last`, so a run of like requests looks the family up once.
    pub(crate) fn account_on(
        &self,
        last: &mut Option<(Outcome, Counter)>,
        route: Route,
        code: u16,
    ) {
        let outcome = Outcome { route, code };
        match last {
            Some((was, counter)) if *was == outcome => {
                counter.inc();
            }
            _ => {
                let counter = self.metrics.requests.get_or_create_owned(&outcome);
                counter.inc();
                *last = Some((outcome, counter));
            }
        }
    }
}
