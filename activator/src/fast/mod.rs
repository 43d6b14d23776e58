//! The fast lane: HTTP/1.1 requests for a revision this node serves, carried as bytes.
//!
//! Why: hyper on both sides of the proxy costs two HTTP/1 stacks and two tasks per request
//! (the client's connection and the pod's), header maps built and encoded twice, and a
//! request body type per side; the warm path stayed at about 0.8× nginx with every other
//! cost taken out (docs/benchmarks.md). nginx parses a request once and passes its bytes on.
//! The fast lane does the same: one task per client connection that parses the request head
//! (httparse, as hyper does), rewrites it into the pod's own keep-alive connection, and
//! relays the response's bytes back, with no other task involved.
//!
//! It carries only the common case and leaves everything else to hyper's path
//! ([`crate::pipeline::handler`]), which has the whole protocol: a connection starts here and is handed
//! to hyper, with the bytes read so far put back in front ([`prefixed`]), as soon as a
//! request is anything but a plain HTTP/1.1 request for a revision (named by headers or by
//! a Host that resolves) whose subset this node belongs to with a share, whose app speaks
//! HTTP/1.1, and while spans are off. Until a request's first byte goes to a pod, nothing is consumed, so a hand-over can
//! happen at any point before that: an unknown revision, a subset to read, a request to
//! forward, a full node or a drain go to hyper's path as they are. The stages are the same
//! (resolve, route, admit, proxy, account); admit is the very same code ([`Core::admit`]),
//! so buffering, throttling and scaling are shared.
//!
//! Once a request went out, failures are answered here: 502 for a pod that failed, 408 for a
//! body that stalls, 504 past the revision's timeout, each closing the client connection.

pub mod exchange;
pub mod pod_conns;
pub mod prefixed;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use crds::ObjectKey as RevisionKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::http1::framing::HEADER_READ_TIMEOUT;
use crate::http1::names::CLIENT_GONE;
use crate::node::pool::{Lease, NoSlot, Spec};
use crate::ops::metrics::{Phase, Route};
use crate::ops::telemetry;
use crate::pipeline::core::{Core, Resolved, RouteTo};
use crate::pipeline::rules::{can_start, request_timeout, too_late, upstream_protocol};
use crate::threads::serving_threads::Mover;
use crate::upstream::proxy::UpstreamProtocol;
use crate::wire::answer::Refusal;
use crate::wire::naming::Named;

use crate::http1::refusal::refusal_bytes;
use crate::http1::request_head::{self, Classified, RequestHead};
use exchange::{Ended, Scratch};
use pod_conns::{PodConn, PodConns};

/// A request head larger than this goes to hyper (which answers 431 past its own limit).
const MAX_HEAD: usize = 16 * 1024;
/// How much of a request body is read ahead while the request waits for a slot (to notice
/// the client going away); more waits in the socket.
const MAX_READ_AHEAD: usize = 64 * 1024;
/// Room for a request head: most fit, a larger one grows the buffer.
const HEAD_ROOM: usize = 2 * 1024;

/// What the fast lane shares across its connections (one per serving thread).
pub struct FastLane {
    core: Arc<Core>,
    pods: Arc<PodConns>,
    body_idle_timeout: Duration,
    /// Cancelled when the activator stops accepting: idle connections close, busy ones after
    /// their response.
    stop: CancellationToken,
    served_by: Bytes,
}

/// A request this node serves, as resolve and route decided it.
struct ServeHere {
    head: RequestHead,
    key: RevisionKey,
    /// The revision and this member's share of it.
    spec: Spec,
    arrived: Instant,
    /// The revision's timeout, from the arrival.
    deadline: Instant,
    /// Another member could start the revision: hyper's path forwards what this node
    /// cannot serve.
    can_forward: bool,
}

/// After one request.
enum Next {
    KeepAlive,
    Close,
    /// Hyper serves this request, and the rest of the connection.
    Hyper(&'static str),
}

impl FastLane {
    pub fn new(
        core: Arc<Core>,
        connect_timeout: Duration,
        pool_idle_timeout: Duration,
        body_idle_timeout: Duration,
        stop: CancellationToken,
    ) -> Arc<Self> {
        let served_by = Bytes::copy_from_slice(core.node.as_bytes());
        Arc::new(Self {
            core,
            pods: PodConns::new(connect_timeout, pool_idle_timeout),
            body_idle_timeout,
            stop,
            served_by,
        })
    }

    /// Serves `stream` while its requests are for the fast lane. Returns the connection, and
    /// the bytes read from it but not consumed, when hyper must serve the rest. With
    /// `mover`, the connection moves to another serving thread between two requests when
    /// this one is hot ([`crate::threads::placement`]).
    pub async fn serve(
        &self,
        mut stream: TcpStream,
        peer: SocketAddr,
        mover: Option<&Mover>,
    ) -> Option<(Bytes, TcpStream)> {
        let mut buf = BytesMut::new();
        let mut scratch = Scratch::default();
        let client = request_head::Client::new(peer.ip());
        loop {
            let head = match self.next_head(&mut stream, &mut buf, &mut scratch).await {
                Ok(Some(head)) => head,
                Ok(None) => return None,
                Err(why) => return self.hand_over(why, buf, stream),
            };
            match self
                .one(&mut stream, &mut buf, head, &client, &mut scratch)
                .await
            {
                // Nothing of the next request read yet: it can be served anywhere.
                Next::KeepAlive if buf.is_empty() => {
                    if let Some(m) = mover {
                        match m.move_if_hot(stream, peer) {
                            Ok(()) => return None,
                            Err(back) => stream = back,
                        }
                    }
                }
                Next::KeepAlive => {}
                Next::Close => {
                    let _ = stream.shutdown().await;
                    return None;
                }
                Next::Hyper(why) => return self.hand_over(why, buf, stream),
            }
        }
    }

    fn hand_over(
        &self,
        why: &'static str,
        buf: BytesMut,
        stream: TcpStream,
    ) -> Option<(Bytes, TcpStream)> {
        tracing::trace!(reason = why, "to hyper");
        self.core.metrics.fast_lane_handovers.inc();
        Some((buf.freeze(), stream))
    }

    /// The next request head: None when the connection ends (closed, idle too long, or the
    /// activator stopping while it is idle), Err for hyper.
    async fn next_head(
        &self,
        stream: &mut TcpStream,
        buf: &mut BytesMut,
        scratch: &mut Scratch,
    ) -> Result<Option<RequestHead>, &'static str> {
        // The connection's own timer, moved later: no timer-wheel work per request.
        let timeout = &mut scratch.head_timer;
        timeout.as_mut().reset(Instant::now() + HEADER_READ_TIMEOUT);
        loop {
            if !buf.is_empty() {
                match request_head::classify_request(buf) {
                    Classified::Fast(h) => return Ok(Some(h)),
                    Classified::Fallback(why) => return Err(why),
                    Classified::Partial if buf.len() >= MAX_HEAD => return Err("large head"),
                    Classified::Partial => {}
                }
            }
            if buf.capacity() - buf.len() < 512 {
                buf.reserve(HEAD_ROOM.max(buf.len()));
            }
            let read = tokio::select! {
                biased;
                r = stream.read_buf(buf) => r,
                _ = self.stop.cancelled(), if buf.is_empty() => return Ok(None),
                _ = timeout.as_mut() => {
                    // A head that stopped half way: hyper's own timeout answers it.
                    return if buf.is_empty() { Ok(None) } else { Err("slow head") };
                }
            };
            match read {
                Ok(0) if buf.is_empty() => return Ok(None),
                // Half a head, then the end: hyper answers what it can of it.
                Ok(0) => return Err("truncated head"),
                Ok(_) => {}
                Err(_) => return Ok(None),
            }
        }
    }

    /// One request: resolve, route, admit, proxy, account.
    async fn one(
        &self,
        stream: &mut TcpStream,
        buf: &mut BytesMut,
        head: RequestHead,
        client: &request_head::Client,
        scratch: &mut Scratch,
    ) -> Next {
        let arrived = Instant::now();
        if telemetry::request_spans() {
            return Next::Hyper("spans");
        }
        // 1. resolve and 2. route
        let req = match self.decide(head, arrived, scratch).await {
            Ok(req) => req,
            Err(why) => return Next::Hyper(why),
        };
        // 3. admit, and a connection to the pod.
        let admitted = match self.admit(stream, buf, scratch, &req).await {
            Ok(admitted) => admitted,
            Err(next) => return next,
        };
        // 4. proxy
        let cold = admitted.0.cold;
        let ended = self
            .proxy(stream, buf, client, admitted, &req, scratch)
            .await;
        // 5. account
        self.account(stream, scratch, &req.key, cold, ended).await
    }

    /// Resolve and route: the decision hyper's path makes, from the same code. Anything but
    /// "serve here, nobody ahead" (an unknown revision, a read that failed, a subset to read
    /// or forward to, a member without a share, the primary elsewhere, an app that speaks
    /// HTTP/2) is hyper's to carry out, named by the error: nothing of the request has been
    /// consumed.
    async fn decide(
        &self,
        mut head: RequestHead,
        arrived: Instant,
        scratch: &mut Scratch,
    ) -> Result<ServeHere, &'static str> {
        let h = &*self.core;
        let name = std::mem::replace(&mut head.name, Named::Host(String::new()));
        // A Host split between revisions is picked here, once per request, as on hyper's path
        // (a hand-over decides again: hyper's path may pick another, which is as random).
        let Ok(Resolved { key, rev, .. }) = h.resolve(Ok(name), arrived).await else {
            return Err("resolve");
        };
        let protocol = match &scratch.protocol {
            Some((r, p)) if Arc::ptr_eq(r, &rev) => *p,
            _ => {
                let p = upstream_protocol(&rev);
                scratch.protocol = Some((rev.clone(), p));
                p
            }
        };
        if protocol != UpstreamProtocol::Http1 {
            return Err("h2c app");
        }
        let deadline = arrived + request_timeout(&rev);
        let (spec, peers) = match h.route(&key, &rev, false, deadline).await {
            Ok(RouteTo::Here { spec, peers, ahead }) if ahead.is_empty() => (spec, peers),
            _ => return Err("route"),
        };
        // No request here carries a hop (those go to hyper's path, which checks them).
        let can_forward = peers.iter().any(|m| can_start(&spec.rev, m));
        Ok(ServeHere {
            head,
            key,
            spec,
            arrived,
            deadline,
            can_forward,
        })
    }

    /// A slot on a pod and a connection to it, trying another pod after a refused connect;
    /// Err is how the request ends instead (answered here, closed, or hyper's).
    async fn admit(
        &self,
        stream: &mut TcpStream,
        buf: &mut BytesMut,
        scratch: &mut Scratch,
        req: &ServeHere,
    ) -> Result<(Lease, PodConn), Next> {
        let h = &*self.core;
        let (key, deadline) = (&req.key, req.deadline);
        let mut retries = h.pod_retries();
        loop {
            let admitted = tokio::select! {
                biased;
                l = h.admit(key, &req.spec, req.arrived, req.can_forward) => l,
                // Draining: hyper's path sends it to a peer member.
                _ = h.draining.cancelled(), if req.can_forward => return Err(Next::Hyper("draining")),
                () = client_gone(stream, buf) => {
                    // nginx's 499: the client closed the connection before its answer.
                    self.count(scratch, Route::Refused, CLIENT_GONE);
                    return Err(Next::Close);
                }
                () = tokio::time::sleep_until(deadline) => {
                    let r = too_late(key, deadline.duration_since(req.arrived));
                    return Err(self.refuse(stream, scratch, r).await);
                }
            };
            let lease = match admitted {
                Ok(lease) => lease,
                // Another member serves it: hyper's path forwards (nothing was consumed).
                Err(NoSlot::Elsewhere(_)) if req.can_forward => {
                    return Err(Next::Hyper("elsewhere"));
                }
                Err(no) => {
                    let r = h.no_slot(key, no);
                    return Err(self.refuse(stream, scratch, r).await);
                }
            };
            match self.pods.get(lease.addr()).await {
                Ok(conn) => return Ok((lease, conn)),
                Err(e) => {
                    let addr = lease.addr();
                    if !retries.after_refused(lease) {
                        let r = Refusal::bad_gateway(format!(
                            "revision {key}: pod at {addr} is unreachable: {e}"
                        ));
                        return Err(self.refuse(stream, scratch, r).await);
                    }
                }
            }
        }
    }

    /// The exchange with the pod, holding the slot until the response has been sent.
    async fn proxy(
        &self,
        stream: &mut TcpStream,
        buf: &mut BytesMut,
        client: &request_head::Client,
        (mut lease, conn): (Lease, PodConn),
        req: &ServeHere,
        scratch: &mut Scratch,
    ) -> Ended {
        let h = &*self.core;
        let (arrived, head) = (req.arrived, &req.head);
        let (cold, first_of_cold) = (lease.cold, lease.first_of_cold);
        let timings = lease.timings.take();
        let server_timing = || {
            let waited = arrived.elapsed();
            if first_of_cold {
                h.metrics.observe_phase(Phase::FirstByte, waited);
            }
            timings.map(|t| t.server_timing(waited)).unwrap_or_default()
        };
        let out = exchange::Request {
            head,
            client,
            target: lease.addr(),
            deadline: req.deadline,
            body_idle_timeout: self.body_idle_timeout,
            served_by: &self.served_by,
            cold: cold.then_some(&server_timing as &(dyn Fn() -> String + Sync)),
            close: head.close || self.stop.is_cancelled(),
            retries: Some(&h.metrics.retries),
        };
        let ended = exchange::exchange(stream, buf, conn, &self.pods, &out, scratch).await;
        // The slot is held until the response has been sent.
        drop(lease);
        ended
    }

    /// Counts how the request ended and whether the connection goes on.
    async fn account(
        &self,
        stream: &mut TcpStream,
        scratch: &mut Scratch,
        key: &RevisionKey,
        cold: bool,
        ended: Ended,
    ) -> Next {
        let route = if cold { Route::Cold } else { Route::Warm };
        match ended {
            Ended::Done { status, close, .. } => {
                self.count(scratch, route, status);
                if close { Next::Close } else { Next::KeepAlive }
            }
            Ended::Refused(r) => {
                let r = Refusal {
                    reason: format!("revision {}: {}", key, r.reason),
                    ..r
                };
                self.refuse(stream, scratch, r).await
            }
            Ended::Broken { status } => {
                if let Some(status) = status {
                    self.count(scratch, route, status);
                }
                Next::Close
            }
        }
    }

    /// The activator's own answer, then the connection closes (a body may be left unread).
    async fn refuse(&self, stream: &mut TcpStream, scratch: &mut Scratch, r: Refusal) -> Next {
        tracing::debug!(status = %r.status, reason = %r.reason, "refused");
        self.count(scratch, Route::Refused, r.status.as_u16());
        refusal_bytes(&mut scratch.out, &r, &self.served_by);
        let _ = stream.write_all(&scratch.out).await;
        Next::Close
    }

    fn count(&self, scratch: &mut Scratch, route: Route, code: u16) {
        self.core.account_on(&mut scratch.counted, route, code);
    }
}

/// Resolves when the client closes its connection (or it fails) while its request waits;
/// what it sends meanwhile (the body, a pipelined request) is kept in `buf`, up to a bound.
async fn client_gone(stream: &mut TcpStream, buf: &mut BytesMut) {
    loop {
        if buf.len() >= MAX_READ_AHEAD {
            return std::future::pending().await;
        }
        if buf.capacity() - buf.len() < 512 {
            buf.reserve(HEAD_ROOM);
        }
        match stream.read_buf(buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
