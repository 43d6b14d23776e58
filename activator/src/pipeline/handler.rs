//! The request path, top to bottom — each stage one function below:
//!
//! 1. **resolve**: which revision the request names (headers, or Host looked up by label) —
//!    400 for bad names, 404 for none;
//! 2. **route**: serve here if this node is a member with a share of the revision's pods,
//!    else forward to a member (once: a request carrying `x-activator-hop` is never
//!    forwarded again);
//! 3. **admit**: a slot on a pod of the revision on this node (throttled by
//!    containerConcurrency), waiting in the revision's buffer while none is free; the scaler
//!    starts pods meanwhile — 503 when the buffer is full, forwarded when this node cannot
//!    start the revision, 504 at the revision's timeoutSeconds;
//! 4. **proxy**: to the pod's IP; a pod that refuses the connection is taken out and a
//!    request without a body goes to the next slot — 502 when none answers;
//! 5. **account**: one count per request by route and status.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crds::ActivatorMember;
use futures::future::Either;
use http::{HeaderValue, Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};
use tracing::instrument::Instrumented;
use tracing::{Instrument, Span};

use crate::http1::framing::framing_problem;
use crate::http1::names::{CLIENT_GONE, HEADER_COLD_START, HOST_STALE, SERVED_BY, SERVER_TIMING};
use crate::node::pool::{Lease, NoSlot, Spec};
use crate::ops::metrics::{HostRefresh, Phase, Route};
use crate::ops::telemetry;
use crate::pipeline::core::{Core, HostPick, Resolved, RouteTo};
use crate::pipeline::hop;
use crate::pipeline::rules::{can_start, request_timeout, too_late, upstream_protocol};
use crate::upstream::proxy::{Upstream, UpstreamProtocol};
use crate::upstream::upgrade;
use crate::wire::answer::{Body, BodyError, Refusal, box_error, full};
use crate::wire::naming::{Named, RevisionKey, named};

// Header names parsed once, not on every request.

/// hyper's adapter of the request path: carries out every decision of the [`Core`] it holds
/// (one per serving thread, shared with the thread's fast lane) over hyper's connections.
pub struct Handler {
    pub core: Arc<Core>,
    pub node_header: HeaderValue,
    pub upstream: Upstream,
    /// Which forwarded requests are a peer's ([`crate::pipeline::hop`]).
    pub hop: crate::pipeline::hop::HopAuth,
    /// Members whose connect failed lately, shared by the serving threads: tried last.
    pub suspects: Arc<crate::pipeline::suspects::Suspects>,
}

/// Why [`Handler::serve_here`] found no slot here: the request goes to a peer member, or
/// is answered with this refusal.
enum NotHere {
    Forward,
    Refused(Refusal),
}

/// Who sent a request this node serves: a client, or a peer activator (a proven hop) that
/// may have another member to try (`spill`).
#[derive(Clone, Copy)]
struct Sender {
    hopped: bool,
    spill: bool,
}

impl Handler {
    pub async fn handle(self: Arc<Self>, mut req: Request<Incoming>) -> Response<Body> {
        let arrived = Instant::now();
        // A hop only a peer proved counts; anyone else's is removed, as if never sent.
        let hopped = self.hop.verified(req.headers());
        if !hopped {
            hop::strip(req.headers_mut());
        }
        // The forwarding entry's host answer is older than this member's subset: it is told
        // so on the answer, whatever the answer is.
        let stale = hopped && self.subset_is_newer(req.headers());
        let span = if telemetry::request_spans() {
            let s = tracing::info_span!("request", method = %req.method(), path = req.uri().path());
            telemetry::set_parent_from_headers(&s, req.headers());
            s
        } else {
            Span::none()
        };
        // Counted as 499 if the client leaves first (the connection drops this future).
        let mut unanswered = Unanswered(Some(&self.core));
        let served = self.serve(req.map(|b| b.map_err(box_error).boxed()), arrived, hopped);
        let served = in_span(span, served);
        let served = served.await;
        unanswered.0 = None;
        let (route, mut resp) = match served {
            Ok(served) => served,
            Err(refusal) => {
                tracing::debug!(status = %refusal.status, reason = %refusal.reason, "refused");
                (Route::Refused, refusal.into_response())
            }
        };
        // 5. account
        self.core.account(route, resp.status().as_u16());
        let h = resp.headers_mut();
        h.entry(SERVED_BY)
            .or_insert_with(|| self.node_header.clone());
        // The hint is this activator's own to give, to the entry that forwarded the request:
        // an app's (or a peer's, already read by the forward) never reaches anyone, since an
        // app must not make entries read hosts again.
        h.remove(HOST_STALE);
        if stale {
            self.core.metrics.hosts.stale_answers.inc();
            h.insert(HOST_STALE, HeaderValue::from_static("1"));
        }
        resp
    }

    /// Whether a proven hop's host answer is older than this node's own copy of the picked
    /// revision's subset (a member watches its subsets): the subsetter wrote it since.
    fn subset_is_newer(&self, headers: &http::HeaderMap) -> bool {
        let (Some(key), Some(theirs)) =
            (hop::picked_revision(headers), hop::subset_version(headers))
        else {
            return false;
        };
        self.core.endpoints.subset_newer_than(&key, theirs)
    }

    async fn serve(
        &self,
        req: Request<Body>,
        arrived: Instant,
        hopped: bool,
    ) -> Result<(Route, Response<Body>), Refusal> {
        // 0. what hyper's parser lets through but the activator does not carry
        if let Some(why) = framing_problem(req.headers()) {
            return Err(Refusal::bad_request(why));
        }
        // The forwarding peer has another member to try if this one cannot serve at once.
        let spill = hopped && hop::may_spill(req.headers());
        // 1. resolve: the revision a forwarding entry picked from a host answer, not a pick
        // of this node's own (a host split between revisions would be picked twice).
        let named = match hopped
            .then(|| hop::picked_revision(req.headers()))
            .flatten()
        {
            Some(key) => Ok(Named::Revision(key)),
            None => named(req.headers(), req.uri().authority().map(|a| a.as_str())),
        };
        let resolved = in_span(stage("resolve"), self.core.resolve(named, arrived)).await?;
        let (key, rev) = (&resolved.key, &resolved.rev);
        let timeout = request_timeout(rev);
        let deadline = arrived + timeout;
        let late = || too_late(key, timeout);
        // 2. route
        let routed = self.core.route(key, rev, hopped, deadline);
        let (spec, peers, req) = match in_span(stage("route"), routed).await? {
            RouteTo::Here { spec, peers, ahead } if ahead.is_empty() => (spec, peers, req),
            // Not the primary, no pod here: the members ahead first; this node serves what
            // they all refuse before it was sent.
            RouteTo::Here { spec, peers, ahead } => {
                let rest: Arc<[ActivatorMember]> = peers
                    .iter()
                    .filter(|p| !ahead.iter().any(|a| a.node == p.node))
                    .cloned()
                    .collect();
                match self
                    .forward_timed(&resolved, req, ahead, true, arrived)
                    .await
                {
                    Ok(resp) => return Ok((Route::Forwarded, resp)),
                    Err((_, Some(req))) => {
                        self.core.metrics.primary_refused.inc();
                        (spec, rest, req)
                    }
                    Err((refusal, None)) => return Err(refusal),
                }
            }
            RouteTo::Elsewhere(members) => {
                let resp = self.forward_timed(&resolved, req, members, false, arrived);
                return Ok((Route::Forwarded, resp.await.map_err(|(r, _)| r)?));
            }
        };
        // 3. admit and 4. proxy, within the revision's timeout.
        let from = Sender { hopped, spill };
        let here = self.serve_here(&resolved, req, &spec, &peers, arrived, from);
        tokio::time::timeout_at(deadline, here)
            .await
            .map_err(|_| late())?
    }

    /// Stage 2b within the request's deadline, with the entry's `Server-Timing` marks on a
    /// cold answer. The request comes back when no member was sent it.
    async fn forward_timed(
        &self,
        to: &Resolved,
        req: Request<Body>,
        members: Vec<ActivatorMember>,
        fall_back: bool,
        arrived: Instant,
    ) -> Result<Response<Body>, (Refusal, Option<Request<Body>>)> {
        let (key, rev) = (&to.key, &to.rev);
        let timeout = request_timeout(rev);
        let deadline = arrived + timeout;
        let sent_on = arrived.elapsed();
        let forward = in_span(
            stage("forward"),
            Box::pin(self.forward(to, req, members, fall_back)),
        );
        let sent = tokio::time::timeout_at(deadline, forward);
        let mut resp = sent.await.map_err(|_| (too_late(key, timeout), None))??;
        // A cold answer says where the entry's share of its time went too.
        if resp.headers().contains_key(HEADER_COLD_START) {
            let t = crate::node::cold_start::entry_timing(sent_on, arrived.elapsed());
            if let Ok(v) = HeaderValue::try_from(t) {
                resp.headers_mut().append(SERVER_TIMING, v);
            }
        }
        Ok(resp)
    }

    /// Stages 3 and 4: a slot on a pod here, then the pod. A request that cannot be served
    /// here (node full, draining) goes to a peer while it still may.
    async fn serve_here(
        &self,
        resolved: &Resolved,
        mut req: Request<Body>,
        spec: &Spec,
        peers: &[ActivatorMember],
        arrived: Instant,
        Sender { hopped, spill }: Sender,
    ) -> Result<(Route, Response<Body>), Refusal> {
        let key = &resolved.key;
        // The peers that may take the request (with a share of maxScale), when it must go.
        let can_forward = !hopped && peers.iter().any(|m| can_start(&spec.rev, m));
        let starters = || -> Vec<ActivatorMember> {
            peers
                .iter()
                .filter(|m| can_start(&spec.rev, m))
                .cloned()
                .collect()
        };
        let mut retries = self.core.pod_retries();
        let protocol = upstream_protocol(&spec.rev);
        loop {
            // 3. admit
            let lease = match self.slot_here(key, spec, arrived, can_forward, spill).await {
                Ok(lease) => lease,
                Err(NotHere::Refused(refusal)) => return Err(refusal),
                Err(NotHere::Forward) => {
                    let forward = Box::pin(self.forward(resolved, req, starters(), false));
                    return Ok((Route::Forwarded, forward.await.map_err(|(r, _)| r)?));
                }
            };
            // 4. proxy: the connection first. A pod that refuses it never saw the request,
            // which goes to the next slot as it is, body and all.
            let proxy = stage("proxy");
            let connect = self.upstream.connect(protocol, &req, lease.addr(), "pod");
            let connected = in_span(proxy.clone(), connect).await;
            let to = match connected {
                Ok(to) => to,
                Err(_) if retries.after_refused(lease) => continue,
                // No pod here took the connection, so the request reached no app: the peer
                // that forwarded it has another member to try (a 503 it replays, where a 502
                // would end the request there; seen in the node-failure scenario, where a
                // killed node's pods refused while its activator still answered).
                Err(refusal) if spill => {
                    return Err(Refusal::unavailable(format!(
                        "revision {key}: no pod on node {} took the connection ({})",
                        self.core.node, refusal.reason
                    )));
                }
                Err(refusal) => return Err(of_revision(key, refusal)),
            };
            proxy.in_scope(|| telemetry::inject_traceparent(req.headers_mut()));
            // Boxed: the send future is the largest part of the request's state, and a
            // request waiting in the buffer (10,000 of them) should not carry its room.
            let sent = Box::pin(self.upstream.send(to, req, &[], "pod"));
            return match in_span(proxy, sent).await {
                Ok(resp) => Ok(self.answered(spec, arrived, lease, resp)),
                // The pooled connection closed under the request and the pod refused a fresh
                // one (its app gone between two requests): as a refused connection above, a
                // 503 the forwarding peer replays to its next member. Seen in CI under load:
                // the race of a killed app with the pool noticing its connection closed.
                Err(refusal) if spill && refusal.retry_elsewhere => {
                    Err(Refusal::unavailable(format!(
                        "revision {key}: no pod on node {} took the connection ({})",
                        self.core.node, refusal.reason
                    )))
                }
                Err(refusal) => Err(of_revision(key, refusal)),
            };
        }
    }

    /// Stage 3 for [`Self::serve_here`]: a slot on a pod here, or why the request goes
    /// elsewhere — forwarded by this node (`can_forward`), or refused (503) back to the peer
    /// that forwarded it and has another member to try (`spill`) — or is refused.
    async fn slot_here(
        &self,
        key: &RevisionKey,
        spec: &Spec,
        arrived: Instant,
        can_forward: bool,
        spill: bool,
    ) -> Result<Lease, NotHere> {
        // What this node cannot serve at once goes elsewhere: forwarded by this node, or
        // refused (503) back to the peer that forwarded it and has another member to try.
        let may_go_elsewhere = can_forward || spill;
        let admitted = tokio::select! {
            l = in_span(stage("admit"), self.core.admit(key, spec, arrived, may_go_elsewhere)) => l,
            // Draining, and the peer that forwarded it can try another member.
            _ = self.core.draining.cancelled(), if spill => {
                return Err(NotHere::Refused(Refusal::unavailable(format!(
                    "revision {key}: node {} is draining", self.core.node
                ))));
            }
            // Draining (SIGTERM) while the request waits: a peer member serves it.
            _ = self.core.draining.cancelled(), if can_forward => {
                self.core.metrics.drained_to_peers.inc();
                return Err(NotHere::Forward);
            }
        };
        match admitted {
            Ok(lease) => Ok(lease),
            Err(NoSlot::Elsewhere(why)) if can_forward => {
                tracing::debug!(revision = %key, reason = %why, "forwarding: cannot serve here");
                Err(NotHere::Forward)
            }
            Err(NoSlot::Elsewhere(why)) if spill => {
                tracing::debug!(revision = %key, reason = %why, "refused to the forwarding peer: cannot serve here at once");
                Err(NotHere::Refused(Refusal::unavailable(why)))
            }
            Err(no) => Err(NotHere::Refused(self.core.no_slot(key, no))),
        }
    }

    /// The pod's answer, marked when it waited for a pod start, with the slot held until the
    /// response is done: the tunnel of an upgrade closed, or the body sent.
    fn answered(
        &self,
        spec: &Spec,
        arrived: Instant,
        lease: Lease,
        mut resp: Response<Body>,
    ) -> (Route, Response<Body>) {
        let route = if lease.cold {
            let waited = arrived.elapsed();
            if lease.first_of_cold {
                self.core.metrics.observe_phase(Phase::FirstByte, waited);
            }
            let h = resp.headers_mut();
            h.insert(HEADER_COLD_START, HeaderValue::from_static("true"));
            if let Some(t) = lease.timings
                && let Ok(v) = HeaderValue::try_from(t.server_timing(waited))
            {
                h.append(SERVER_TIMING, v);
            }
            Route::Cold
        } else {
            Route::Warm
        };
        // An upgraded connection holds its slot until the tunnel closes: an open
        // websocket is a request in flight for the app.
        if let Some(open) = resp.extensions_mut().remove::<upgrade::TunnelOpen>() {
            tokio::spawn(async move {
                open.closed().await;
                drop(lease);
            });
            return (route, resp);
        }
        // The slot is held until the response body has been sent, and the body
        // is bounded by the revision's timeout unless it streams by design.
        let streaming = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| crate::http1::streaming::is_streaming_type(v.as_bytes()));
        let deadline = (!streaming).then_some(arrived + request_timeout(&spec.rev));
        let idle = self.upstream.body_idle_timeout();
        (
            route,
            resp.map(|b| Held::new(b, lease, deadline, idle).boxed()),
        )
    }

    /// Stage 2b: forward to the members in their ranked order (the revision's primary
    /// first, [`crate::pipeline::primary`]), trying the next one when a member is unreachable or, for a
    /// request that can be replayed, answers 503 (e.g. it is no longer a member, its node is
    /// full, or its share of the revision's pods is busy). When no member was sent the
    /// request, or all refused one that can be replayed, it comes back with the refusal.
    async fn forward(
        &self,
        to: &Resolved,
        req: Request<Body>,
        members: Vec<ActivatorMember>,
        fall_back: bool,
    ) -> Result<Response<Body>, (Refusal, Option<Request<Body>>)> {
        let (key, rev) = (&to.key, &to.rev);
        if members.is_empty() {
            return Err((
                Refusal::unavailable(format!(
                    "revision {key} has no other member to take the request"
                )),
                Some(req),
            ));
        }
        self.core.metrics.forwards.inc();
        // Every entry tries the members in the same order, so a trickle wakes one pod; one
        // that did not take a connection lately goes last (`suspects`).
        let members = self.suspects.reorder(
            crate::pipeline::primary::ranked(key, members),
            std::time::Instant::now(),
        );
        let mut req = Some(req);
        let mut last = Refusal::unavailable(format!("revision {key} has no reachable activator"));
        let protocol = upstream_protocol(rev);
        for (i, m) in members.iter().enumerate() {
            let Ok(addr) = m.address.parse() else {
                tracing::warn!(revision = %key, address = %m.address, "member has a bad address");
                continue;
            };
            let Some(r) = req.take() else { break };
            let turn = Turn {
                m,
                addr,
                more: i + 1 < members.len(),
                pick: to.pick.as_ref(),
            };
            match self.try_member(key, protocol, turn, r, fall_back).await {
                Ok(resp) => return Ok(resp),
                // Not taken: why, and the request when it can go on (to the next member,
                // or back to the caller).
                Err((why, back)) => (last, req) = (why, back),
            }
        }
        Err((last, req))
    }

    /// Stage 2b, one member's turn: connect, then send. The member's answer, or why it did
    /// not take the request with the request itself when it can be sent again.
    async fn try_member(
        &self,
        key: &RevisionKey,
        protocol: UpstreamProtocol,
        turn: Turn<'_>,
        mut r: Request<Body>,
        fall_back: bool,
    ) -> Result<Response<Body>, (Refusal, Option<Request<Body>>)> {
        let Turn {
            m,
            addr,
            more,
            pick,
        } = turn;
        let what = format!("activator on node {}", m.node);
        // A member that refuses the connection never saw the request: the next one
        // gets it as it is.
        let to = match self.upstream.connect(protocol, &r, addr, &what).await {
            Ok(to) => {
                self.suspects.answered(&m.address);
                to
            }
            Err(e) => {
                self.suspects.failed(&m.address, std::time::Instant::now());
                self.core.endpoints.invalidate(key);
                if more {
                    self.core.metrics.retries.inc();
                }
                return Err((Refusal::unavailable(e.reason), Some(r)));
            }
        };
        // Only a body-less request can be sent again after the member answered 503 or
        // failed once it had the request: to the next member, or back to a caller that
        // serves what every member refused (`fall_back`).
        let replay = ((more || fall_back) && r.body().is_end_stream()).then(|| replay_of(&r));
        // Someone else can take it: the member may refuse what it cannot serve at once.
        let mut extra = self.hop.forward_headers(&self.core.node, replay.is_some());
        if let Some(p) = pick {
            extra.extend(hop::pick_headers(key, p.version.as_deref()));
        }
        telemetry::inject_traceparent(r.headers_mut());
        // No retries against one peer: the next member is the retry.
        let sent = self.upstream.send(to, r, &extra, &what).await;
        let sent = sent.map(|mut resp| {
            self.take_stale_hint(&mut resp, pick);
            resp
        });
        match sent {
            Ok(resp)
                if resp.status() == http::StatusCode::SERVICE_UNAVAILABLE && replay.is_some() =>
            {
                self.core.endpoints.invalidate(key);
                self.core.metrics.retries.inc();
                Err((Refusal::unavailable(format!("{what} answered 503")), replay))
            }
            Ok(resp) => Ok(resp),
            Err(e) => {
                self.core.endpoints.invalidate(key);
                if replay.is_some() {
                    self.core.metrics.retries.inc();
                }
                Err((e, replay))
            }
        }
    }

    /// A member's answer to a request this entry forwarded: a host-stale hint on it is taken
    /// off (no client sees it), and — for a request picked from a host answer — the host is
    /// read again in the background. The hint counts only here, on the answer of the peer
    /// the request was sent to; this request keeps the answer it got.
    fn take_stale_hint(&self, resp: &mut Response<Body>, pick: Option<&HostPick>) {
        let stale = hop::says_stale(resp.headers());
        resp.headers_mut().remove(HOST_STALE);
        if stale
            && let Some(p) = pick
            && let Some(hosts) = &self.core.hosts
        {
            hosts.refresh(&p.host, HostRefresh::StaleHint);
        }
    }
}

/// One member's turn at a forwarded request (stage 2b): the member, its address, whether
/// another member follows it, and how the revision was picked from a Host (if it was).
struct Turn<'a> {
    m: &'a ActivatorMember,
    addr: std::net::SocketAddr,
    more: bool,
    pick: Option<&'a HostPick>,
}

/// Counts a request whose answer never came because its client left (its future was
/// dropped by the connection): `activator_requests_total{route="refused",code="499"}`.
struct Unanswered<'a>(Option<&'a Core>);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(core) = self.0 {
            core.account(Route::Refused, CLIENT_GONE);
        }
    }
}

/// `f` inside `span` — or `f` itself while spans are off (`span` is none): the warm path
/// does not pay for entering and leaving a span that records nothing on every poll.
fn in_span<F: Future>(span: Span, f: F) -> Either<Instrumented<F>, F> {
    if span.is_none() {
        Either::Right(f)
    } else {
        Either::Left(f.instrument(span))
    }
}

/// A span for one stage of the request path (none while spans are not exported).
fn stage(name: &'static str) -> Span {
    if !telemetry::request_spans() {
        return Span::none();
    }
    match name {
        "resolve" => tracing::info_span!("resolve"),
        "route" => tracing::info_span!("route"),
        "admit" => tracing::info_span!("admit"),
        "proxy" => tracing::info_span!("proxy"),
        _ => tracing::info_span!("forward"),
    }
}

/// Names the revision in a refusal about its pod.
fn of_revision(key: &RevisionKey, mut r: Refusal) -> Refusal {
    r.reason = format!("revision {key}: {}", r.reason);
    r
}

/// A copy of a body-less request, for sending it again.
fn replay_of(r: &Request<Body>) -> Request<Body> {
    let mut copy = Request::new(full(bytes::Bytes::new()));
    *copy.method_mut() = r.method().clone();
    *copy.uri_mut() = r.uri().clone();
    *copy.version_mut() = r.version();
    *copy.headers_mut() = r.headers().clone();
    // The client's address (x-forwarded-for) and an upgrade's handle travel as extensions.
    *copy.extensions_mut() = r.extensions().clone();
    copy
}

/// A response body that holds its slot until it has been sent, and is bounded: past the
/// revision's timeout (unless it streams by design, [`crate::http1::streaming`]) or after the body
/// idle timeout with nothing from the app, it fails — so hyper closes the client connection
/// instead of ending the message as if it were whole. Its timers are made only once the app
/// keeps the body waiting: a body that is already there costs none.
struct Held {
    inner: Body,
    lease: Option<Lease>,
    /// The revision's deadline; None for a stream.
    deadline: Option<Instant>,
    idle: Duration,
    timers: Option<Box<Timers>>,
}

/// The deadline's timer (None for a stream) and the idle one.
type Timers = (Option<Pin<Box<Sleep>>>, Pin<Box<Sleep>>);

/// Why a response body was cut.
#[derive(Debug)]
struct Cut(&'static str);

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Cut {}

impl Held {
    fn new(inner: Body, lease: Lease, deadline: Option<Instant>, idle: Duration) -> Self {
        Self {
            inner,
            lease: Some(lease),
            deadline,
            idle,
            timers: None,
        }
    }
}

impl hyper::body::Body for Held {
    type Data = bytes::Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.lease = None,
            Poll::Ready(Some(Ok(_))) => {
                // A frame came: the idle clock starts again at the next wait.
                if let Some(t) = &mut this.timers {
                    t.1.as_mut().reset(Instant::now() + this.idle);
                }
            }
            Poll::Pending => {
                let (deadline, idle) = (this.deadline, this.idle);
                let t = this.timers.get_or_insert_with(|| {
                    Box::new((
                        deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
                        Box::pin(tokio::time::sleep(idle)),
                    ))
                });
                let why = if t.0.as_mut().is_some_and(|d| d.as_mut().poll(cx).is_ready()) {
                    Some("the response outlived the revision's timeout")
                } else if t.1.as_mut().poll(cx).is_ready() {
                    Some("the response body sent nothing for the body idle timeout")
                } else {
                    None
                };
                if let Some(why) = why {
                    tracing::debug!(reason = why, "response cut");
                    this.lease = None;
                    return Poll::Ready(Some(Err(BodyError(Box::new(Cut(why))))));
                }
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request waiting in the buffer holds its whole request-path future: its size is a part of
/// what each of 10,000 waiting requests costs (docs/benchmarks.md, `bench buffer`). Sizes
/// from a debug build, which lays futures out no smaller than a release build.
#[cfg(test)]
mod future_sizes {
    use super::*;

    /// The size of the future `f` would return, without calling it.
    fn size_of_future<F>(_f: impl FnOnce() -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    #[allow(unreachable_code, unused_variables, clippy::diverging_sub_expression)]
    fn a_waiting_request_does_not_carry_the_send_or_the_api_reads() {
        let handle = size_of_future(|| Handler::handle(unreachable!(), unreachable!()));
        let send = size_of_future(|| {
            let u: &Upstream = unreachable!();
            u.send(
                unreachable!(),
                unreachable!(),
                unreachable!(),
                unreachable!(),
            )
        });
        let route = size_of_future(|| {
            let c: &Core = unreachable!();
            c.route(unreachable!(), unreachable!(), false, unreachable!())
        });
        // 3,816 bytes before the send's connection and the subset reads were boxed.
        assert!(
            handle <= 3 * 1024,
            "the request path's future is {handle} bytes"
        );
        assert!(send > 1024, "the send ({send} bytes) is boxed for a reason");
        assert!(route <= 256, "the route stage's future is {route} bytes");
    }
}
