//! Sends requests to activators and records what happened to each, under a model of the
//! ingress in front of them ([`Ingress`]): the client itself never retries, so every attempt
//! a figure rests on is one this module made and counted.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::anatomy::ColdPhases;

/// Response header set by the activator when the request waited for a pod start.
const COLD_HEADER: &str = activator::http1::names::HEADER_COLD_START;

/// What sits in front of the activators, as far as retries go.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Ingress {
    /// Picks a member and never retries: every failed attempt is a failed request.
    #[default]
    None,
    /// One retry on another member when the first attempt failed before any response byte
    /// (a refused or failed connection, or a connection reset or closed before the answer
    /// began), as Envoy's `retry_on: connect-failure,refused-stream` or nginx's
    /// `proxy_next_upstream error` do for a GET.
    Retry,
}

impl Ingress {
    pub fn name(self) -> &'static str {
        match self {
            Ingress::None => "none",
            Ingress::Retry => "retry",
        }
    }
}

/// A first attempt that failed and was retried.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The activator it was sent to (its node).
    pub entry: String,
    pub error: String,
    /// Its time to failure.
    pub latency: Duration,
}

/// One request's outcome (after the ingress model's retry, if it made one).
#[derive(Debug, Clone)]
pub struct Sample {
    pub revision: String,
    /// The activator the request was sent to (its node).
    pub entry: String,
    pub status: u16,
    pub latency: Duration,
    /// The request waited for a pod to start.
    pub cold: bool,
    /// The pod that answered (`x-pod-name` from the sim app), if any.
    pub pod: Option<String>,
    /// Transport error or non-2xx body, for the report.
    pub error: Option<String>,
    /// When the request was sent.
    pub sent: Instant,
    /// A cold start's phases, from the response's `Server-Timing`.
    pub phases: Option<ColdPhases>,
    /// It failed before any byte of an answer arrived: an ingress could retry it elsewhere.
    pub retryable: bool,
    /// When the ingress model retried: the first attempt (`entry` is then the second's).
    pub first: Option<Attempt>,
}

impl Sample {
    /// A failure with no attempt made (e.g. no member to send it to).
    pub fn unsent(revision: &str, error: String) -> Self {
        Self {
            revision: revision.to_string(),
            entry: String::new(),
            status: 0,
            latency: Duration::ZERO,
            cold: false,
            pod: None,
            error: Some(error),
            sent: Instant::now(),
            phases: None,
            retryable: false,
            first: None,
        }
    }

    pub fn ok(&self) -> bool {
        self.error.is_none() && (200..300).contains(&self.status)
    }

    /// Whether it would have succeeded with no retry: its first attempt did.
    pub fn ok_without_retry(&self) -> bool {
        self.first.is_none() && self.ok()
    }

    /// Attempts made (0 when none could be).
    pub fn attempts(&self) -> usize {
        usize::from(!self.entry.is_empty()) + usize::from(self.first.is_some())
    }

    /// The activator the first attempt went to.
    pub fn first_entry(&self) -> &str {
        self.first.as_ref().map_or(&self.entry, |f| &f.entry)
    }

    /// The first attempt's time: to its answer, or to its failure.
    pub fn first_latency(&self) -> Duration {
        self.first.as_ref().map_or(self.latency, |f| f.latency)
    }
}

/// An HTTP client for the load: pooled, nodelay, bounded connect time.
#[derive(Clone)]
pub struct Driver {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Driver {
    fn default() -> Self {
        Self::new()
    }
}

impl Driver {
    pub fn new() -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(2)));
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            // hyper-util resends a request whose pooled connection closed before it was
            // written, and counts it once: a retry the ingress model did not ask for, hidden.
            .retry_canceled_requests(false)
            .build(http);
        Self { client }
    }

    /// GET `path` from the activator at `entry`, naming the revision by its `host`.
    pub async fn get(
        &self,
        entry: (&str, SocketAddr),
        revision: &str,
        host: &str,
        path: &str,
    ) -> Sample {
        let req =
            Request::get(format!("http://{}{path}", entry.1)).header(http::header::HOST, host);
        self.send(entry, revision, req).await
    }

    /// GET `path` from the activator at `entry`, naming the revision with the
    /// `x-revision-namespace` / `x-revision-name` headers, as an ingress does.
    pub async fn get_named(
        &self,
        entry: (&str, SocketAddr),
        namespace: &str,
        revision: &str,
        path: &str,
    ) -> Sample {
        let req = Request::get(format!("http://{}{path}", entry.1))
            .header(crds::contract::HEADER_REVISION_NAMESPACE, namespace)
            .header(crds::contract::HEADER_REVISION_NAME, revision);
        self.send(entry, revision, req).await
    }

    /// As [`Driver::get_named`], with extra request headers (e.g. the sim app's
    /// `x-sim-delay-ms`).
    pub async fn get_named_with(
        &self,
        entry: (&str, SocketAddr),
        namespace: &str,
        revision: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Sample {
        let mut req = Request::get(format!("http://{}{path}", entry.1))
            .header(crds::contract::HEADER_REVISION_NAMESPACE, namespace)
            .header(crds::contract::HEADER_REVISION_NAME, revision);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(entry, revision, req).await
    }

    async fn send(
        &self,
        entry: (&str, SocketAddr),
        revision: &str,
        req: http::request::Builder,
    ) -> Sample {
        let start = Instant::now();
        let req = req
            .body(Full::new(Bytes::new()))
            .expect("static request parts are valid");
        let mut sample = Sample {
            revision: revision.to_string(),
            entry: entry.0.to_string(),
            status: 0,
            latency: Duration::ZERO,
            cold: false,
            pod: None,
            error: None,
            sent: start,
            phases: None,
            retryable: false,
            first: None,
        };
        match self.client.request(req).await {
            Ok(resp) => {
                sample.status = resp.status().as_u16();
                let h = resp.headers();
                sample.cold = h.contains_key(COLD_HEADER);
                sample.pod = h
                    .get("x-pod-name")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                // The member's metrics and, after a forward, the entry's: one list.
                let timing: Vec<&str> = h
                    .get_all(activator::http1::names::HEADER_SERVER_TIMING)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .collect();
                sample.phases = ColdPhases::parse(&timing.join(", "));
                let ok = resp.status().is_success();
                match resp.into_body().collect().await {
                    Ok(body) if !ok => {
                        sample.error =
                            Some(String::from_utf8_lossy(&body.to_bytes()).trim().to_string())
                    }
                    Ok(_) => {}
                    Err(e) => sample.error = Some(format!("reading the body: {e}")),
                }
            }
            Err(e) => {
                sample.retryable = before_any_response_byte(&e);
                sample.error = Some(format!("request failed: {}", chain(&e)));
            }
        }
        sample.latency = start.elapsed();
        sample
    }
}

/// Sends a request by `send` to `first`, and under [`Ingress::Retry`] once more to the
/// activator `other` names (given the one that failed), when the first attempt failed before
/// any response byte. The sample's latency then runs from the first attempt's start to the
/// second's end; the first is kept in [`Sample::first`].
pub async fn with_ingress<F, Fut>(
    ingress: Ingress,
    first: (String, SocketAddr),
    other: impl FnOnce(&str) -> Option<(String, SocketAddr)>,
    send: F,
) -> Sample
where
    F: Fn((String, SocketAddr)) -> Fut,
    Fut: Future<Output = Sample>,
{
    let s = send(first).await;
    if ingress == Ingress::None || s.ok() || !s.retryable {
        return s;
    }
    let Some(next) = other(&s.entry) else {
        return s;
    };
    let mut again = send(next).await;
    again.latency = again.sent.saturating_duration_since(s.sent) + again.latency;
    again.sent = s.sent;
    again.first = Some(Attempt {
        entry: s.entry,
        error: s.error.unwrap_or_default(),
        latency: s.latency,
    });
    again
}

/// The error and its causes, one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out += &format!(": {s}");
        src = s.source();
    }
    out
}

/// A request that failed before any byte of an answer: the connection was refused or failed,
/// or it was reset or closed before the answer began. (Once an answer has begun, the request
/// is the app's, and an ingress does not retry it.)
fn before_any_response_byte(e: &hyper_util::client::legacy::Error) -> bool {
    use std::io::ErrorKind::*;
    if e.is_connect() {
        return true;
    }
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(h) = s.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_canceled())
        {
            return true;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | BrokenPipe
                    | UnexpectedEof
            )
        {
            return true;
        }
        src = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server on loopback that reads one request head per connection, writes `answer` (if
    /// any) and closes it.
    async fn server(answer: Option<&'static [u8]>) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    if let Some(a) = answer {
                        let _ = s.write_all(a).await;
                    }
                    // Dropped: closed, with or without an answer.
                });
            }
        });
        addr
    }

    async fn get(addr: SocketAddr) -> Sample {
        Driver::new().get(("n", addr), "r", "h", "/").await
    }

    #[tokio::test]
    async fn a_failure_before_any_answer_byte_is_retryable_and_an_answer_is_not() {
        // Refused: nothing listens there any more.
        let gone = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let s = get(gone).await;
        assert!(!s.ok() && s.retryable, "refused: {s:?}");
        // Closed after reading the request, before answering.
        let s = get(server(None).await).await;
        assert!(!s.ok() && s.retryable, "closed before the answer: {s:?}");
        // An answer, even a failed one, is the app's: not retried.
        let answer = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nfull";
        let s = get(server(Some(answer)).await).await;
        assert_eq!(s.status, 503);
        assert!(!s.ok() && !s.retryable, "answered: {s:?}");
    }

    fn sample(entry: &str, status: u16, retryable: bool) -> Sample {
        Sample {
            entry: entry.into(),
            status,
            error: (status != 200).then(|| "boom".into()),
            retryable,
            latency: Duration::from_millis(10),
            ..Sample::unsent("r", String::new())
        }
    }

    #[tokio::test]
    async fn the_retry_model_retries_once_elsewhere_only_what_failed_before_an_answer() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let run = |ingress, first: Sample| {
            let sent = Mutex::new(Vec::new());
            async move {
                let s = with_ingress(
                    ingress,
                    ("a".into(), a),
                    |failed| (failed == "a").then(|| ("b".to_string(), a)),
                    |(node, _)| {
                        sent.lock().unwrap().push(node.clone());
                        let s = if node == "a" {
                            first.clone()
                        } else {
                            sample("b", 200, false)
                        };
                        async move { s }
                    },
                )
                .await;
                (s, sent.into_inner().unwrap())
            }
        };
        // Refused on a: once more, on b; both attempts counted, the first kept.
        let (s, sent) = run(Ingress::Retry, sample("a", 0, true)).await;
        assert_eq!(sent, ["a", "b"]);
        assert!(s.ok() && !s.ok_without_retry(), "{s:?}");
        assert_eq!((s.attempts(), s.first_entry()), (2, "a"));
        assert_eq!(s.first_latency(), Duration::from_millis(10));
        assert!(
            s.latency >= Duration::from_millis(10),
            "both attempts: {s:?}"
        );
        // No retry under `none`, nor of an answer (a 503), nor of a success.
        for (ingress, first) in [
            (Ingress::None, sample("a", 0, true)),
            (Ingress::Retry, sample("a", 503, false)),
            (Ingress::Retry, sample("a", 200, false)),
        ] {
            let (s, sent) = run(ingress, first.clone()).await;
            assert_eq!(sent, ["a"], "{ingress:?} {first:?}");
            assert_eq!((s.attempts(), s.ok()), (1, first.ok()));
        }
    }
}
