//! Sending a request to a pod or a peer activator over a pooled HTTP client, with streaming
//! bodies. Requests without a body are retried on a refused connection; requests with one are
//! not, since their body has already been consumed.

use std::net::SocketAddr;

use http::{HeaderMap, HeaderName, Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Body as _;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::answer::{Body, Refusal, full};
use crate::config::ActivatorConfig;

/// Pooled HTTP/1.1 client for pods and peers.
#[derive(Clone)]
pub struct Upstream {
    client: Client<HttpConnector, Body>,
    retries: u32,
}

impl Upstream {
    pub fn new(cfg: &ActivatorConfig) -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(cfg.connect_timeout));
        http.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(cfg.pool_idle_timeout)
            .build(http);
        Self {
            client,
            retries: cfg.connect_retries,
        }
    }

    /// How often a body-less request to a pod is retried on a refused connection.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// Sends `req` to `target` over HTTP/1.1, adding `extra` headers; a body-less request is
    /// retried up to `retries` times on a refused connection. `what` names the target in errors.
    pub async fn send(
        &self,
        req: Request<Body>,
        target: SocketAddr,
        extra: &[(HeaderName, String)],
        what: &str,
        retries: u32,
    ) -> Result<Response<Body>, Refusal> {
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        // The pool speaks HTTP/1.1 to pods and peers whatever the client spoke; an HTTP/2
        // request's :authority becomes the Host header the app (or peer) routes on.
        if !parts.headers.contains_key(http::header::HOST)
            && let Some(authority) = parts.uri.authority()
            && let Ok(v) = authority.as_str().parse()
        {
            parts.headers.insert(http::header::HOST, v);
        }
        parts.version = http::Version::HTTP_11;
        for (name, value) in extra {
            if let Ok(v) = value.parse() {
                parts.headers.insert(name.clone(), v);
            }
        }
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        parts.uri = Uri::try_from(format!("http://{target}{path}"))
            .map_err(|e| Refusal::bad_request(format!("bad request path: {e}")))?;

        let bodyless = body.is_end_stream();
        let mut body = Some(body);
        let mut attempt = 0;
        loop {
            let b = match body.take() {
                Some(b) => b,
                None => full(bytes::Bytes::new()),
            };
            let req = Request::from_parts(parts.clone(), b);
            match self.client.request(req).await {
                Ok(resp) => {
                    let (mut rp, rb) = resp.into_parts();
                    strip_hop_by_hop(&mut rp.headers);
                    return Ok(Response::from_parts(rp, rb.boxed()));
                }
                Err(e) if e.is_connect() && bodyless && attempt < retries => {
                    attempt += 1;
                    tracing::debug!(%target, attempt, error = %e, "connect failed; retrying");
                    // Backoff, not synchronisation: give a restarting app a moment.
                    tokio::time::sleep(std::time::Duration::from_millis(25 << attempt)).await;
                }
                Err(e) => {
                    return Err(Refusal::bad_gateway(format!(
                        "{what} at {target} is unreachable: {}",
                        error_chain(&e)
                    )));
                }
            }
        }
    }
}

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1).
fn strip_hop_by_hop(h: &mut HeaderMap) {
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
