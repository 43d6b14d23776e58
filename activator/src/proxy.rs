//! Sending a request to a pod or a peer activator, with streaming bodies both ways. Everything
//! protocol-specific about proxying lives here and in the modules it uses:
//!
//! - HTTP/1.1 over a pooled client by default; HTTP/2 with prior knowledge ([`crate::h2c`])
//!   when the caller asks for it ([`Upstream::send_as`] with `UpstreamProtocol::H2c`: the revision's port is named `h2c`),
//!   so gRPC's trailers survive;
//! - hop-by-hop headers stripped (RFC 9110 §7.6.1), except an upgrade's own, which
//!   [`crate::upgrade`] passes on and tunnels after a 101;
//! - `x-forwarded-*` and `forwarded` added by the first activator ([`crate::forwarded`]);
//! - a request body that stops arriving fails after `body_idle_timeout`
//!   ([`crate::body_timeout`]), answered 408.
//!
//! Requests without a body are retried on a refused connection; requests with one are not,
//! since their body has already been consumed.

use std::net::SocketAddr;
use std::time::Duration;

use crds::contract::HEADER_ACTIVATOR_HOP;
use http::header::{HOST, TE, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::{Body as _, Incoming};
use hyper::upgrade::OnUpgrade;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::answer::{Body, Refusal, full};
use crate::body_timeout::{BodyIdle, IdleTimeout};
use crate::config::ActivatorConfig;
use crate::forwarded::{self, ClientAddr};
use crate::h2c::{ConnectError, H2Pool, UpBody};
use crate::upgrade;

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
    h1: Client<HttpConnector, UpBody>,
    h2: std::sync::Arc<H2Pool>,
    retries: u32,
    body_idle_timeout: Duration,
}

/// How one attempt failed.
enum SendError {
    H1(hyper_util::client::legacy::Error),
    H2Connect(ConnectError),
    H2(hyper::Error),
}

impl SendError {
    /// The connection was never made: nothing was sent, so a body-less request can be replayed.
    fn is_connect(&self) -> bool {
        match self {
            SendError::H1(e) => e.is_connect(),
            SendError::H2Connect(_) => true,
            SendError::H2(_) => false,
        }
    }

    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        match self {
            SendError::H1(e) => e,
            SendError::H2Connect(e) => e,
            SendError::H2(e) => e,
        }
    }
}

impl Upstream {
    pub fn new(cfg: &ActivatorConfig) -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(cfg.connect_timeout));
        http.enforce_http(true);
        let h1 = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(cfg.pool_idle_timeout)
            .build(http);
        Self {
            h1,
            h2: std::sync::Arc::new(H2Pool::new(cfg.connect_timeout, cfg.pool_idle_timeout)),
            retries: cfg.connect_retries,
            body_idle_timeout: cfg.body_idle_timeout,
        }
    }

    /// How often a body-less request to a pod is retried on a refused connection.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// Sends `req` to `target` speaking `protocol` (HTTP/2 with prior knowledge when the
    /// revision's port is named `h2c`; use it for the peer hop of such a revision too, so
    /// trailers survive it), adding `extra` headers; a body-less request is retried up to
    /// `retries` times on a refused connection. `what` names the target in errors.
    pub async fn send_as(
        &self,
        protocol: UpstreamProtocol,
        mut req: Request<Body>,
        target: SocketAddr,
        extra: &[(HeaderName, String)],
        what: &str,
        retries: u32,
    ) -> Result<Response<Body>, Refusal> {
        // An upgrade the client's connection can carry out (server.rs serves with upgrades).
        let upgrade_to = upgrade::requested(req.version(), req.headers())
            .filter(|_| req.extensions().get::<OnUpgrade>().is_some());
        let client_upgrade = upgrade_to.as_ref().map(|_| hyper::upgrade::on(&mut req));
        let protocol = if upgrade_to.is_some() {
            UpstreamProtocol::Http1
        } else {
            protocol
        };
        // A peer activator already said who the client is; from here it would be us.
        let first_hop = !req.headers().contains_key(HEADER_ACTIVATOR_HOP);
        let client_ip = req.extensions().get::<ClientAddr>().map(|c| c.0.ip());

        let (mut parts, body) = req.into_parts();
        // HTTP/2 carries the host in :authority, HTTP/1.1 in Host.
        let host: Option<String> = parts
            .headers
            .get(HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or_else(|| parts.uri.authority().map(|a| a.as_str().to_string()));
        strip_hop_by_hop(&mut parts.headers);
        if first_hop {
            forwarded::add(&mut parts.headers, client_ip, host.as_deref());
        }
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
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        match protocol {
            UpstreamProtocol::Http1 => {
                // The pool speaks HTTP/1.1 whatever the client spoke; an HTTP/2 request's
                // :authority becomes the Host header the app (or peer) routes on.
                if !parts.headers.contains_key(HOST)
                    && let Some(h) = host.as_deref().and_then(|h| h.parse().ok())
                {
                    parts.headers.insert(HOST, h);
                }
                parts.version = Version::HTTP_11;
                parts.uri = Uri::try_from(format!("http://{target}{path}"))
                    .map_err(|e| Refusal::bad_request(format!("bad request path: {e}")))?;
            }
            UpstreamProtocol::H2c => {
                // The connection goes to `target` (the pool's key); :authority stays the
                // client's host, and HTTP/2 has no Host header beside it.
                parts.headers.remove(HOST);
                parts.version = Version::HTTP_2;
                let authority = host
                    .as_deref()
                    .filter(|h| h.parse::<http::uri::Authority>().is_ok())
                    .map(str::to_string)
                    .unwrap_or_else(|| target.to_string());
                parts.uri = Uri::try_from(format!("http://{authority}{path}"))
                    .map_err(|e| Refusal::bad_request(format!("bad request path: {e}")))?;
            }
        }

        let bodyless = body.is_end_stream();
        let (body, idle) = IdleTimeout::new(body, self.body_idle_timeout);
        // Resolves only if the body timed out; pending forever once it can no longer.
        let idle = async {
            match idle.await {
                Ok(e) => e,
                Err(_) => std::future::pending().await,
            }
        };
        tokio::pin!(idle);
        let mut body = Some(body);
        let mut parts = Some(parts);
        let mut attempt = 0;
        loop {
            let b = match body.take() {
                Some(b) => b,
                // Only a body-less request is ever sent again.
                None => IdleTimeout::new(full(bytes::Bytes::new()), self.body_idle_timeout).0,
            };
            // The head is copied only while a retry may still need it.
            let head = if bodyless && attempt < retries {
                parts.clone()
            } else {
                parts.take()
            };
            let req =
                Request::from_parts(head.expect("the head is kept while a retry may follow"), b);
            let sent = async {
                match protocol {
                    UpstreamProtocol::Http1 => self.h1.request(req).await.map_err(SendError::H1),
                    UpstreamProtocol::H2c => {
                        let mut send = self.h2.get(target).await.map_err(SendError::H2Connect)?;
                        send.send_request(req).await.map_err(SendError::H2)
                    }
                }
            };
            // The upstream client may see the aborted body only as a reset stream (HTTP/2) or
            // keep waiting for an answer that cannot come: the body's own signal decides.
            let result = tokio::select! {
                r = sent => r,
                e = &mut idle => return Err(body_timed_out(e)),
            };
            match result {
                Ok(resp) => return Ok(self.response(resp, client_upgrade, what)),
                Err(e) if e.is_connect() && bodyless && attempt < retries => {
                    attempt += 1;
                    tracing::debug!(%target, attempt, error = %error_chain(e.as_error()), "connect failed; retrying");
                    // Backoff, not synchronisation: give a restarting app a moment.
                    tokio::time::sleep(Duration::from_millis(25 << attempt)).await;
                }
                Err(e) => {
                    let connect = e.is_connect();
                    let e = e.as_error();
                    if let Some(idle) = find::<BodyIdle>(e) {
                        return Err(body_timed_out(*idle));
                    }
                    if find::<hyper::Error>(e).is_some_and(|h| h.is_user()) {
                        // The client's own body broke (it went away mid-request): nobody
                        // upstream is at fault, and the client will not read this answer.
                        return Err(Refusal::bad_request(format!(
                            "the request body failed: {}",
                            error_chain(e)
                        )));
                    }
                    let reason = format!("{what} at {target} is unreachable: {}", error_chain(e));
                    // Not connected: nothing was sent, another target may take it.
                    return Err(if connect {
                        Refusal::unreachable(reason)
                    } else {
                        Refusal::bad_gateway(reason)
                    });
                }
            }
        }
    }

    /// The upstream's answer as the client's: hop-by-hop headers stripped; after a 101 to an
    /// upgrade, the upgrade's headers kept and the tunnel started.
    fn response(
        &self,
        mut resp: Response<Incoming>,
        client_upgrade: Option<OnUpgrade>,
        what: &str,
    ) -> Response<Body> {
        let switched = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        let tunnel = match client_upgrade {
            Some(client) if switched => Some((client, hyper::upgrade::on(&mut resp))),
            _ => None,
        };
        let (mut rp, rb) = resp.into_parts();
        let protocol = rp.headers.get(UPGRADE).cloned();
        strip_hop_by_hop(&mut rp.headers);
        // The server writes the version it speaks; this avoids hyper's warning about an
        // HTTP/2 response written as HTTP/1.1.
        rp.version = Version::HTTP_11;
        if let Some((client, upstream)) = tunnel {
            if let Some(p) = protocol {
                upgrade::restore(&mut rp.headers, p);
            }
            upgrade::tunnel(client, upstream, what.to_string());
        }
        Response::from_parts(rp, rb.boxed())
    }
}

fn body_timed_out(e: BodyIdle) -> Refusal {
    Refusal::request_timeout(format!(
        "the request body sent nothing for {} ms",
        e.0.as_millis()
    ))
}

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1). `TE: trailers`
/// stays: it says the client takes trailers, which gRPC needs the app to know.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let trailers = upgrade::has_token(h, TE.as_str(), "trailers");
    let named: Vec<HeaderName> = h
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    ] {
        h.remove(n);
    }
    if trailers {
        h.insert(TE, HeaderValue::from_static("trailers"));
    }
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
    fn hop_by_hop_headers_go_and_te_trailers_stays() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-private, te"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("te", HeaderValue::from_static("trailers, deflate"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("x-app", HeaderValue::from_static("kept"));
        strip_hop_by_hop(&mut h);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-app", "te"]);
        assert_eq!(h["te"], "trailers");
    }

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
