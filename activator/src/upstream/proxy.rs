//! Sending a request to a pod or a peer activator, with streaming bodies both ways. Everything
//! protocol-specific about proxying lives here and in the modules it uses:
//!
//! - HTTP/1.1 on pooled keep-alive connections ([`crate::upstream::h1`]) by default; HTTP/2 with prior
//!   knowledge ([`crate::upstream::h2c`]) when the revision's port is named `h2c`, so gRPC's trailers
//!   survive;
//! - hop-by-hop headers stripped (RFC 9110 §7.6.1), except an upgrade's own, which
//!   [`crate::upstream::upgrade`] passes on and tunnels after a 101;
//! - `x-forwarded-*` and `forwarded` added by the first activator ([`crate::http1::forwarded`]);
//! - a request body that stops arriving fails after `body_idle_timeout`
//!   ([`crate::upstream::body_timeout`]), answered 408.
//!
//! A send is two steps: [`Upstream::connect`], then [`Upstream::send`]. A target that refuses
//! the connection never sees the request, so the caller still holds it — with its body — for
//! the next pod or member; nothing has to be copied in case of a retry.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Body as _;
use hyper::upgrade::OnUpgrade;
use tokio::sync::oneshot;

use crate::http1::forwarded::{self, ClientAddr};
use crate::http1::hop_by_hop;
use crate::upstream::body_timeout::{BodyIdle, IdleTimeout};
use crate::upstream::h1::{H1Conn, H1Pool, Returning};
use crate::upstream::h2c::{H2Pool, UpBody};
use crate::upstream::upgrade;
use crate::wire::answer::{Body, Refusal, box_error};
use crate::wire::connect::ConnectError;

/// Which protocol to speak to the pod (or peer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// HTTP/1.1, pooled: what any app speaks.
    #[default]
    Http1,
    /// HTTP/2 with prior knowledge (h2c). Upgrade requests still go over HTTP/1.1, since
    /// HTTP/2 has no `101 Switching Protocols`.
    H2c,
}

impl UpstreamProtocol {
    /// Knative's rule: a container port named `h2c` speaks HTTP/2 with prior knowledge.
    pub fn for_port_name(name: Option<&str>) -> Self {
        match name {
            Some(n) if n.eq_ignore_ascii_case("h2c") => Self::H2c,
            _ => Self::Http1,
        }
    }
}

/// Clients for pods and peers.
#[derive(Clone)]
pub struct Upstream {
    h1: Arc<H1Pool>,
    h2: Arc<H2Pool>,
    retries: u32,
    body_idle_timeout: Duration,
}

/// A connection to one target, made before the request is given to it: a target that
/// refuses leaves the request in the caller's hands for the next one.
pub struct Connected {
    target: SocketAddr,
    conn: Conn,
}

enum Conn {
    H1(H1Conn),
    H2(hyper::client::conn::http2::SendRequest<UpBody>),
}

impl Connected {
    pub fn target(&self) -> SocketAddr {
        self.target
    }
}

/// What the upstream connections need of the activator's configuration
/// ([`crate::config::ActivatorConfig::upstream`] makes it): this layer does not read the
/// whole configuration, which sits above it.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamConfig {
    pub connect_timeout: Duration,
    pub pool_idle_timeout: Duration,
    pub connect_retries: u32,
    pub body_idle_timeout: Duration,
}

impl Upstream {
    pub fn new(cfg: &UpstreamConfig) -> Self {
        Self {
            h1: H1Pool::new(cfg.connect_timeout, cfg.pool_idle_timeout),
            h2: Arc::new(H2Pool::new(cfg.connect_timeout, cfg.pool_idle_timeout)),
            retries: cfg.connect_retries,
            body_idle_timeout: cfg.body_idle_timeout,
        }
    }

    /// How long a body (request or response) may send nothing.
    pub fn body_idle_timeout(&self) -> Duration {
        self.body_idle_timeout
    }

    /// How often a request is tried on another pod after a refused connection.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// A connection to `target` for `req`, speaking `protocol` (HTTP/2 with prior knowledge
    /// when the revision's port is named `h2c`; use it for the peer hop of such a revision
    /// too, so trailers survive it) — HTTP/1.1 for an upgrade whatever the protocol, since
    /// HTTP/2 has no `101 Switching Protocols`. `what` names the target in errors; a refusal
    /// here is `retry_elsewhere`: nothing was sent.
    pub async fn connect(
        &self,
        protocol: UpstreamProtocol,
        req: &Request<Body>,
        target: SocketAddr,
        what: &str,
    ) -> Result<Connected, Refusal> {
        let conn = if protocol == UpstreamProtocol::H2c && !is_upgrade(req) {
            self.h2.get(target).await.map(Conn::H2)
        } else {
            self.h1.get(target).await.map(Conn::H1)
        };
        conn.map(|conn| Connected { target, conn }).map_err(|e| {
            Refusal::unreachable(format!(
                "{what} at {target} is unreachable: {}",
                error_chain(&e)
            ))
        })
    }

    /// Sends `req` on `to`, adding `extra` headers. `what` names the target in errors.
    ///
    /// In stages: the head rewritten for the upstream, addressed for the connection's
    /// protocol, the body given its idle timer, the request sent (once more on a fresh
    /// connection when that is safe), and the outcome turned into a response or a refusal.
    pub async fn send(
        &self,
        to: Connected,
        req: Request<Body>,
        extra: &[(HeaderName, String)],
        what: &str,
    ) -> Result<Response<Body>, Refusal> {
        let target = to.target;
        let Outgoing {
            mut parts,
            body,
            host,
            client_upgrade,
        } = Outgoing::rewrite(req, extra);
        address(&mut parts, host, &to.conn, target)?;
        let (body, idle) = self.timed(body);
        let replay = replay_copy(&to.conn, &parts, &body);
        let sent = self.transmit(to.conn, target, Request::from_parts(parts, body), replay);
        // The upstream client may see the aborted body only as a reset stream (HTTP/2) or
        // keep waiting for an answer that cannot come: the body's own signal decides.
        let result = tokio::select! {
            r = sent => r,
            e = timed_out(idle) => return Err(body_timed_out(e)),
        };
        self.outcome(result, client_upgrade, what, target)
    }

    /// A body-less request has nothing to stall: no timer for it.
    fn timed(&self, body: Body) -> (UpBody, Option<oneshot::Receiver<BodyIdle>>) {
        if body.is_end_stream() {
            (IdleTimeout::untimed(body), None)
        } else {
            let (b, idle) = IdleTimeout::new(body, self.body_idle_timeout);
            (b, Some(idle))
        }
    }

    /// Sends the addressed request on the connection; `replay` is the copy an HTTP/1.1
    /// request may go again as ([`replay_copy`]).
    async fn transmit(
        &self,
        conn: Conn,
        target: SocketAddr,
        req: Request<UpBody>,
        replay: Option<Request<Body>>,
    ) -> Result<Response<Body>, SendError> {
        match conn {
            Conn::H1(c) => self.transmit_h1(c, target, req, replay).await,
            Conn::H2(mut send) => send
                .send_request(req)
                .await
                .map(|r| r.map(|b| b.map_err(box_error).boxed()))
                .map_err(SendError::Http),
        }
    }

    /// HTTP/1.1: a pooled connection that fails under the request is replaced once when the
    /// request surely did not reach the app, or may safely reach it twice; the response's
    /// body returns the connection to the pool when it ends.
    async fn transmit_h1(
        &self,
        mut c: H1Conn,
        target: SocketAddr,
        req: Request<UpBody>,
        replay: Option<Request<Body>>,
    ) -> Result<Response<Body>, SendError> {
        let heard = c.heard.bytes();
        let resp = match c.send.try_send_request(req).await {
            Ok(resp) => resp,
            // A pooled connection the app closed as the request went out: the request was
            // not written, so it goes on a fresh connection once.
            Err(mut e) if c.reused && e.message().is_some() => {
                let req = e.take_message().expect("checked above");
                (c.send, c.heard) = self.h1.connect(target).await.map_err(SendError::Connect)?;
                c.send.send_request(req).await.map_err(SendError::Http)?
            }
            // Written, and the pooled connection failed with not one byte of answer: only an
            // idempotent request without a body goes again. A POST the app may have acted on,
            // or a request it began to answer, is the client's 502, never sent twice.
            Err(e) if replay.is_some() && c.heard.bytes() == heard && !e.error().is_timeout() => {
                tracing::debug!(%target, error = %e.error(), "pooled connection failed: request sent again");
                let req = replay.expect("checked above").map(IdleTimeout::untimed);
                (c.send, c.heard) = self.h1.connect(target).await.map_err(SendError::Connect)?;
                c.send.send_request(req).await.map_err(SendError::Http)?
            }
            Err(e) => return Err(SendError::Http(e.into_error())),
        };
        Ok(if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            // The connection is the tunnel's now.
            resp.map(|b| b.map_err(box_error).boxed())
        } else {
            resp.map(|b| {
                Returning::new(b, c, target, self.h1.clone())
                    .map_err(box_error)
                    .boxed()
            })
        })
    }

    /// What the client is answered: the upstream's response, or why there is none.
    fn outcome(
        &self,
        result: Result<Response<Body>, SendError>,
        client_upgrade: Option<OnUpgrade>,
        what: &str,
        target: SocketAddr,
    ) -> Result<Response<Body>, Refusal> {
        match result {
            Ok(resp) => self.response(resp, client_upgrade, what, target),
            // Nothing new reached an app: the pooled connection closed under the request
            // (before it was written, or, for an idempotent request only, with no byte of
            // answer) and the fresh one was refused.
            Err(SendError::Connect(e)) => Err(Refusal::unreachable(format!(
                "{what} at {target} is unreachable: {}",
                error_chain(&e)
            ))),
            Err(SendError::Http(e)) => {
                if let Some(idle) = find::<BodyIdle>(&e) {
                    return Err(body_timed_out(*idle));
                }
                if e.is_user() {
                    // The client's own body broke (it went away mid-request): nobody
                    // upstream is at fault, and the client will not read this answer.
                    return Err(Refusal::bad_request(format!(
                        "the request body failed: {}",
                        error_chain(&e)
                    )));
                }
                Err(Refusal::bad_gateway(format!(
                    "{what} at {target} failed: {}",
                    error_chain(&e)
                )))
            }
        }
    }

    /// Connects, then sends: for callers that have no other target to try.
    pub async fn send_to(
        &self,
        protocol: UpstreamProtocol,
        req: Request<Body>,
        target: SocketAddr,
        extra: &[(HeaderName, String)],
        what: &str,
    ) -> Result<Response<Body>, Refusal> {
        let to = self.connect(protocol, &req, target, what).await?;
        self.send(to, req, extra, what).await
    }

    fn response(
        &self,
        mut resp: Response<Body>,
        client_upgrade: Option<OnUpgrade>,
        what: &str,
        target: SocketAddr,
    ) -> Result<Response<Body>, Refusal> {
        // hyper's client takes `Content-Length: 5, 5`; the fast lane and nginx do not.
        let bad_length = resp
            .headers()
            .get_all(CONTENT_LENGTH)
            .iter()
            .any(|v| crate::http1::framing::content_length(v.as_bytes()).is_none());
        if bad_length {
            return Err(Refusal::bad_gateway(format!(
                "{what} at {target} sent an invalid content-length"
            )));
        }
        // RFC 9112 §6.3: the transfer coding framed the body; a length beside it goes.
        if resp.headers().contains_key(TRANSFER_ENCODING) {
            resp.headers_mut().remove(CONTENT_LENGTH);
        } else if let Some(one) = resp.headers().get(CONTENT_LENGTH).cloned()
            && resp
                .headers()
                .get_all(CONTENT_LENGTH)
                .iter()
                .nth(1)
                .is_some()
        {
            // The same length twice (hyper's client checked they agree): hyper's server
            // would refuse to write the second and close the connection instead.
            resp.headers_mut().insert(CONTENT_LENGTH, one);
        }
        let switched = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        let tunnel = match client_upgrade {
            Some(client) if switched => Some((client, hyper::upgrade::on(&mut resp))),
            _ => None,
        };
        let (mut rp, rb) = resp.into_parts();
        let protocol = rp.headers.get(UPGRADE).cloned();
        hop_by_hop::strip(&mut rp.headers);
        // The server writes the version it speaks; this avoids hyper's warning about an
        // HTTP/2 response written as HTTP/1.1.
        rp.version = Version::HTTP_11;
        if let Some((client, upstream)) = tunnel {
            if let Some(p) = protocol {
                upgrade::restore(&mut rp.headers, p);
            }
            let open = upgrade::tunnel(client, upstream, what.to_string());
            rp.extensions.insert(open);
        }
        Ok(Response::from_parts(rp, rb))
    }
}

/// How a send failed after its connection was made.
enum SendError {
    /// A fresh connection, after the pooled one closed under the request, was refused.
    Connect(ConnectError),
    Http(hyper::Error),
}

/// The client's request taken apart, its head rewritten for the upstream.
struct Outgoing {
    parts: http::request::Parts,
    body: Body,
    /// The host the client named (Host, or an HTTP/2 request's :authority).
    host: Option<HeaderValue>,
    /// The client connection's upgrade, when the request asks for one it can carry out.
    client_upgrade: Option<OnUpgrade>,
}

impl Outgoing {
    /// Hop-by-hop headers out, the forwarding headers in, `extra` added, an upgrade's own
    /// headers put back.
    fn rewrite(mut req: Request<Body>, extra: &[(HeaderName, String)]) -> Self {
        // An upgrade the client's connection can carry out (server.rs serves with upgrades).
        let upgrade_to = upgrade::requested(req.version(), req.headers())
            .filter(|_| req.extensions().get::<OnUpgrade>().is_some());
        let client_upgrade = upgrade_to.as_ref().map(|_| hyper::upgrade::on(&mut req));
        let client_ip = req.extensions().get::<ClientAddr>().map(|c| c.0.ip());

        let (mut parts, body) = req.into_parts();
        // HTTP/2 carries the host in :authority, HTTP/1.1 in Host.
        let host: Option<HeaderValue> = parts.headers.get(HOST).cloned().or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        hop_by_hop::strip(&mut parts.headers);
        // The hop headers are for a peer only (the handler removed unproven ones; a proven
        // one ends here): `extra` carries this activator's own when it forwards.
        hop_by_hop::strip_activator_hops(&mut parts.headers);
        // The real peer address, always: a peer activator's own address follows the
        // client's, which the first activator appended (a hop never hides a client).
        forwarded::add(
            &mut parts.headers,
            client_ip,
            host.as_ref().and_then(|h| h.to_str().ok()),
        );
        for (name, value) in extra {
            if let Ok(v) = value.parse() {
                parts.headers.insert(name.clone(), v);
            }
        }
        if let Some(p) = upgrade_to {
            upgrade::restore(&mut parts.headers, p);
        }
        // What the server put there (the upgrade handle, the client's address) is not for
        // the upstream client.
        parts.extensions = http::Extensions::new();
        Self {
            parts,
            body,
            host,
            client_upgrade,
        }
    }
}

/// The head's version, target and host for the connection's protocol.
fn address(
    parts: &mut http::request::Parts,
    host: Option<HeaderValue>,
    conn: &Conn,
    target: SocketAddr,
) -> Result<(), Refusal> {
    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    match conn {
        Conn::H1(_) => {
            // HTTP/1.1 whatever the client spoke, in origin form on a connection that is
            // already the target's; an HTTP/2 request's :authority becomes the Host header
            // the app (or peer) routes on.
            let host = host.unwrap_or_else(|| {
                HeaderValue::from_str(&target.to_string())
                    .unwrap_or(HeaderValue::from_static("localhost"))
            });
            parts.headers.entry(HOST).or_insert(host);
            parts.version = Version::HTTP_11;
            parts.uri = Uri::from(path);
        }
        Conn::H2(_) => {
            // The connection goes to `target`; :authority stays the client's host, and
            // HTTP/2 has no Host header beside it.
            parts.headers.remove(HOST);
            parts.version = Version::HTTP_2;
            let authority = host
                .as_ref()
                .and_then(|h| h.to_str().ok())
                .and_then(|h| h.parse::<http::uri::Authority>().ok())
                .unwrap_or_else(|| {
                    target
                        .to_string()
                        .parse()
                        .expect("a socket address is an authority")
                });
            parts.uri = Uri::builder()
                .scheme("http")
                .authority(authority)
                .path_and_query(path)
                .build()
                .map_err(|e| Refusal::bad_request(format!("bad request path: {e}")))?;
        }
    }
    Ok(())
}

/// A body-less request with an idempotent method may go again on a fresh connection if a
/// pooled one fails before any answer (RFC 9110 §9.2.2); anything else only if hyper says it
/// was not written. The copy is made only for a pooled connection.
fn replay_copy(conn: &Conn, parts: &http::request::Parts, body: &UpBody) -> Option<Request<Body>> {
    match conn {
        Conn::H1(c) if c.reused && body.is_end_stream() && parts.method.is_idempotent() => {
            let mut copy = Request::new(crate::wire::answer::full(bytes::Bytes::new()));
            *copy.method_mut() = parts.method.clone();
            *copy.uri_mut() = parts.uri.clone();
            *copy.version_mut() = parts.version;
            *copy.headers_mut() = parts.headers.clone();
            Some(copy)
        }
        _ => None,
    }
}

/// Resolves only if the body timed out; pending forever once it can no longer.
async fn timed_out(idle: Option<oneshot::Receiver<BodyIdle>>) -> BodyIdle {
    match idle {
        Some(idle) => match idle.await {
            Ok(e) => e,
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// Whether `req` asks to switch protocols (sent over HTTP/1.1 whatever the revision speaks).
fn is_upgrade(req: &Request<Body>) -> bool {
    upgrade::requested(req.version(), req.headers()).is_some()
        && req.extensions().get::<OnUpgrade>().is_some()
}

fn body_timed_out(e: BodyIdle) -> Refusal {
    Refusal::request_timeout(format!(
        "the request body sent nothing for {} ms",
        e.0.as_millis()
    ))
}

/// The first error of type `T` in `e`'s source chain.
fn find<'a, T: std::error::Error + 'static>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(t) = c.downcast_ref::<T>() {
            return Some(t);
        }
        cur = c.source();
    }
    None
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_port_named_h2c_asks_for_http2() {
        assert_eq!(
            UpstreamProtocol::for_port_name(Some("h2c")),
            UpstreamProtocol::H2c
        );
        assert_eq!(
            UpstreamProtocol::for_port_name(Some("H2C")),
            UpstreamProtocol::H2c
        );
        assert_eq!(
            UpstreamProtocol::for_port_name(Some("http")),
            UpstreamProtocol::Http1
        );
        assert_eq!(
            UpstreamProtocol::for_port_name(None),
            UpstreamProtocol::Http1
        );
    }
}
