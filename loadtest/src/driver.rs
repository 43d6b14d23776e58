//! Sends requests to activators and records what happened to each.

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
const COLD_HEADER: &str = "x-activator-cold-start";

/// One request's outcome.
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
}

impl Sample {
    pub fn ok(&self) -> bool {
        self.error.is_none() && (200..300).contains(&self.status)
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
                sample.phases = h
                    .get(activator::cold_start::HEADER_SERVER_TIMING)
                    .and_then(|v| v.to_str().ok())
                    .and_then(ColdPhases::parse);
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
            Err(e) => sample.error = Some(format!("request failed: {e}")),
        }
        sample.latency = start.elapsed();
        sample
    }
}
