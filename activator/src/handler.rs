//! The request path, top to bottom:
//!
//! 1. **resolve**: which revision the request names (headers, then Host) — 404 if none;
//! 2. **route**: serve here if this node is in the revision's subset, else forward to a member
//!    (once: a request carrying `x-activator-hop` is never forwarded again);
//! 3. **pod**: a ready pod of the revision on this node, cold-starting one if needed — 504 when
//!    that outlives the revision's timeout;
//! 4. **proxy**: to the pod's IP — 502 when it is unreachable after retries.

use std::sync::Arc;
use std::time::Duration;

use crds::ActivatorMember;
use crds::contract::{
    HEADER_ACTIVATOR_HOP, HEADER_KNATIVE_NAMESPACE, HEADER_KNATIVE_REVISION, HEADER_REVISION_NAME,
    HEADER_REVISION_NAMESPACE,
};
use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body as _, Incoming};
use tokio_util::sync::CancellationToken;

use crate::answer::{Body, Refusal, full};
use crate::cache::endpoints::{EndpointsCache, Membership};
use crate::cache::revisions::RevisionCache;
use crate::metrics::{Metrics, Outcome};
use crate::proxy::Upstream;
use crate::routing::RevisionKey;
use crate::scheduler::LocalScheduler;

/// Response header naming the activator that served (or forwarded) the request.
pub const HEADER_SERVED_BY: &str = "x-activator-node";
/// Response header set when the request waited for a pod to start.
pub const HEADER_COLD_START: &str = "x-activator-cold-start";

/// How long a request waits for a new revision's subset to be published before a 503.
const SUBSET_WAIT: Duration = Duration::from_secs(10);
/// Upper bound on one API read on the request path (the client has no read timeout of its own).
const API_READ_LIMIT: Duration = Duration::from_secs(10);
/// The schema's maximum `timeoutSeconds`.
const MAX_TIMEOUT_SECONDS: i64 = 3600;

/// What the request path needs; shared by all connections.
pub struct Handler {
    pub node: String,
    pub revisions: RevisionCache,
    pub endpoints: EndpointsCache,
    pub scheduler: LocalScheduler,
    pub upstream: Upstream,
    pub metrics: Arc<Metrics>,
    /// Cancelled when the activator starts draining.
    pub draining: CancellationToken,
}

impl Handler {
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let (route, result) = self.serve(req.map(BodyExt::boxed)).await;
        let mut resp = match result {
            Ok(resp) => resp,
            Err(refusal) => {
                tracing::debug!(status = %refusal.status, reason = %refusal.reason, "refused");
                refusal.into_response()
            }
        };
        let route = if resp.status().is_success() || route != "refused" {
            route
        } else {
            "refused"
        };
        self.metrics
            .requests
            .get_or_create(&Outcome {
                route,
                code: resp.status().as_u16(),
            })
            .inc();
        if let Ok(v) = HeaderValue::from_str(&self.node) {
            resp.headers_mut().entry(HEADER_SERVED_BY).or_insert(v);
        }
        resp
    }

    async fn serve(&self, req: Request<Body>) -> (&'static str, Result<Response<Body>, Refusal>) {
        let arrived = tokio::time::Instant::now();
        // 1. resolve
        let key = match self.resolve(&req) {
            Ok(k) => k,
            Err(r) => return ("refused", Err(r)),
        };
        let rev =
            match tokio::time::timeout(API_READ_LIMIT, self.revisions.get_or_fetch(&key)).await {
                Ok(Ok(Some(rev))) => rev,
                Ok(Ok(None)) => return ("refused", Err(Refusal::unknown_revision(&key))),
                Ok(Err(e)) => {
                    return (
                        "refused",
                        Err(Refusal::unavailable(format!("reading revision {key}: {e}"))),
                    );
                }
                Err(_) => {
                    return (
                        "refused",
                        Err(Refusal::unavailable(format!(
                            "reading revision {key}: the API server did not answer"
                        ))),
                    );
                }
            };
        // Clamped as the schema does, in case the Revision got past it.
        let timeout = Duration::from_secs(
            rev.spec
                .timeout_seconds
                .clamp(1, MAX_TIMEOUT_SECONDS)
                .unsigned_abs(),
        );
        let deadline = arrived + timeout;
        // Members that may create pods: with maxScale set, only those with a share of it.
        let can_start = |m: &ActivatorMember| rev.spec.max_scale == 0 || m.max_pods > 0;

        // 2. route
        let hopped = req.headers().contains_key(HEADER_ACTIVATOR_HOP);
        let read_by = deadline.min(tokio::time::Instant::now() + API_READ_LIMIT);
        let membership = match tokio::time::timeout_at(
            read_by,
            self.endpoints.membership(&key, hopped),
        )
        .await
        {
            // The subsetter gives an invalid revision no subset: say why instead of waiting.
            Ok(Ok(Membership::Unassigned)) if !rev.problems().is_empty() => {
                return (
                    "refused",
                    Err(Refusal::bad_gateway(format!(
                        "revision {key} is invalid: {}",
                        rev.problems().join("; ")
                    ))),
                );
            }
            // A revision created a moment ago: its subset is being written.
            Ok(Ok(Membership::Unassigned)) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                self.endpoints
                    .await_assigned(&key, left.min(SUBSET_WAIT))
                    .await
            }
            Ok(Ok(m)) => m,
            Ok(Err(e)) => {
                return (
                    "refused",
                    Err(Refusal::unavailable(format!(
                        "reading the activators of revision {key}: {e}"
                    ))),
                );
            }
            Err(_) => {
                return (
                    "refused",
                    Err(Refusal::unavailable(format!(
                        "reading the activators of revision {key}: the API server did not answer"
                    ))),
                );
            }
        };
        let (quota, peers) = match membership {
            // A member without a share of maxScale may not create pods: the members with
            // one serve the cold start (DESIGN §3: shares sum to at most maxScale).
            Membership::Member { me, peers } if !can_start(&me) && !hopped => {
                let with_quota: Vec<ActivatorMember> =
                    peers.into_iter().filter(can_start).collect();
                if with_quota.is_empty() {
                    return (
                        "refused",
                        Err(Refusal::unavailable(format!(
                            "no member of revision {key} has a share of its maxScale"
                        ))),
                    );
                }
                return self
                    .forward_within(&key, req, with_quota, deadline, timeout)
                    .await;
            }
            Membership::Member { me, peers } => {
                (me, peers.into_iter().filter(can_start).collect::<Vec<_>>())
            }
            Membership::Unassigned => {
                return (
                    "refused",
                    Err(Refusal::unavailable(format!(
                        "revision {key} has no activators assigned yet"
                    ))),
                );
            }
            Membership::Others(_) if hopped => {
                return (
                    "refused",
                    Err(Refusal::unavailable(format!(
                        "forwarded request for revision {key} reached node {}, which is not a member",
                        self.node
                    ))),
                );
            }
            Membership::Others(members) => {
                let members: Vec<ActivatorMember> = members.into_iter().filter(can_start).collect();
                if members.is_empty() {
                    return (
                        "refused",
                        Err(Refusal::unavailable(format!(
                            "no member of revision {key} has a share of its maxScale"
                        ))),
                    );
                }
                return self
                    .forward_within(&key, req, members, deadline, timeout)
                    .await;
            }
        };

        // 3. pod, 4. proxy — both within the revision's timeout.
        let serve_here = async {
            let target = tokio::select! {
                t = self.scheduler.ready_pod(&key, &rev, &quota) => t?,
                // Draining (SIGTERM) while the request waits for a pod: a peer member serves
                // it instead. A request forwarded here already is not forwarded again.
                _ = self.draining.cancelled(), if !hopped && !peers.is_empty() => {
                    self.metrics.drained_to_peers.inc();
                    return self.forward(&key, req, peers).await;
                }
            };
            let mut resp = self
                .upstream
                .send(
                    req,
                    target.addr,
                    &[],
                    &format!("pod of revision {key}"),
                    self.upstream.retries(),
                )
                .await?;
            if target.cold {
                resp.headers_mut()
                    .insert(HEADER_COLD_START, HeaderValue::from_static("true"));
            }
            Ok(resp)
        };
        match tokio::time::timeout_at(deadline, serve_here).await {
            Ok(r) => ("proxied", r),
            Err(_) => (
                "proxied",
                Err(Refusal::timeout(format!(
                    "revision {key}: no ready pod and answer within {}s",
                    timeout.as_secs()
                ))),
            ),
        }
    }

    /// Stage 1: the revision a request names.
    fn resolve(&self, req: &Request<Body>) -> Result<RevisionKey, Refusal> {
        let headers = req.headers();
        let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        let named = header(HEADER_REVISION_NAMESPACE)
            .zip(header(HEADER_REVISION_NAME))
            .or_else(|| header(HEADER_KNATIVE_NAMESPACE).zip(header(HEADER_KNATIVE_REVISION)));
        if let Some((ns, name)) = named {
            if !is_dns_label(ns) || !is_dns_subdomain(name) {
                return Err(Refusal::bad_request(format!(
                    "invalid revision namespace/name in headers: {ns:?}/{name:?}"
                )));
            }
            return Ok(RevisionKey::new(ns, name));
        }
        // HTTP/2 carries the host in :authority, HTTP/1.1 in Host.
        let host = header(http::header::HOST.as_str())
            .or_else(|| req.uri().authority().map(|a| a.as_str()))
            .ok_or_else(|| Refusal::unknown_revision("the request names no host"))?;
        if !self.revisions.routes_hosts() {
            return Err(Refusal::unknown_revision(format!(
                "host routing is off on this activator; name the revision of {host} with \
                 {HEADER_REVISION_NAMESPACE} and {HEADER_REVISION_NAME}"
            )));
        }
        self.revisions
            .resolve_host(host)
            .ok_or_else(|| Refusal::unknown_revision(format!("no revision serves host {host}")))
    }

    /// Stage 2b, bounded by the request's deadline.
    async fn forward_within(
        &self,
        key: &RevisionKey,
        req: Request<Body>,
        members: Vec<ActivatorMember>,
        deadline: tokio::time::Instant,
        timeout: Duration,
    ) -> (&'static str, Result<Response<Body>, Refusal>) {
        match tokio::time::timeout_at(deadline, self.forward(key, req, members)).await {
            Ok(r) => ("forwarded", r),
            Err(_) => (
                "forwarded",
                Err(Refusal::timeout(format!(
                    "revision {key}: no answer from its activators within {}s",
                    timeout.as_secs()
                ))),
            ),
        }
    }

    /// Stage 2b: forward to a member, trying the next one when a member is unreachable or,
    /// for a request that can be replayed, answers 503 (e.g. it is no longer a member).
    async fn forward(
        &self,
        key: &RevisionKey,
        req: Request<Body>,
        members: Vec<ActivatorMember>,
    ) -> Result<Response<Body>, Refusal> {
        // Requests for one revision entering at one node stick to one member (its pod stays
        // warm); different revisions and entry nodes spread over the members.
        let start = crds::contract::node_hash(&format!("{}/{key}", self.node))
            .bytes()
            .fold(0usize, |a, b| a.wrapping_mul(31).wrapping_add(b as usize))
            % members.len();
        let hop = [(
            HeaderName::from_static(HEADER_ACTIVATOR_HOP),
            self.node.clone(),
        )];
        let mut req = Some(req);
        let mut last = Refusal::unavailable(format!("revision {key} has no reachable activator"));
        for i in 0..members.len() {
            let m = &members[(start + i) % members.len()];
            let Ok(addr) = m.address.parse() else {
                tracing::warn!(revision = %key, address = %m.address, "member has a bad address");
                continue;
            };
            let Some(r) = req.take() else { break };
            // Only a body-less request can be replayed to the next member.
            let replay = r.body().is_end_stream().then(|| replay_of(&r));
            let what = format!("activator on node {}", m.node);
            // No retries against one peer: the next member is the retry.
            match self.upstream.send(r, addr, &hop, &what, 0).await {
                Ok(resp)
                    if resp.status() == http::StatusCode::SERVICE_UNAVAILABLE
                        && replay.is_some()
                        && i + 1 < members.len() =>
                {
                    self.endpoints.invalidate(key);
                    last = Refusal::unavailable(format!("{what} answered 503"));
                    req = replay;
                }
                Ok(resp) => return Ok(resp),
                Err(e) => {
                    self.endpoints.invalidate(key);
                    // A peer that cannot be reached is "no member can take it": 503.
                    last = Refusal::unavailable(e.reason);
                    req = replay;
                }
            }
        }
        Err(last)
    }
}

/// A copy of a body-less request, for sending it again.
fn replay_of(r: &Request<Body>) -> Request<Body> {
    let mut copy = Request::new(full(bytes::Bytes::new()));
    *copy.method_mut() = r.method().clone();
    *copy.uri_mut() = r.uri().clone();
    *copy.version_mut() = r.version();
    *copy.headers_mut() = r.headers().clone();
    copy
}

/// RFC 1123 label, as Kubernetes requires of namespace names.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain, as Kubernetes requires of most object names.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_must_be_kubernetes_names() {
        assert!(is_dns_label("default"));
        assert!(is_dns_subdomain("rev-1.v2"));
        for bad in ["", "-a", "a-", "A", "a/b", "..", "a..b", &"x".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad:?}");
            assert!(!is_dns_subdomain(bad), "{bad:?}");
        }
        assert!(!is_dns_label("a.b"));
        assert!(!is_dns_subdomain("../etc"));
    }
}
