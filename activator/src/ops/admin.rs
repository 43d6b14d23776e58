//! The admin port: `/healthz` (the process is alive), `/readyz` (caches synced and not
//! draining), `/metrics` (Prometheus text).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;

use crate::wire::answer::{Body, full};

/// The admin port's paths (the DaemonSet's probes name them; a test checks they agree).
pub const HEALTHZ: &str = "/healthz";
pub const READYZ: &str = "/readyz";
pub const METRICS: &str = "/metrics";

/// State the admin endpoints report.
pub struct Admin {
    pub ready: AtomicBool,
    pub registry: Registry,
}

impl Admin {
    pub fn handle(self: &Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        match req.uri().path() {
            HEALTHZ => text(StatusCode::OK, "ok\n".into()),
            READYZ if self.ready.load(Ordering::Acquire) => text(StatusCode::OK, "ready\n".into()),
            READYZ => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into()),
            METRICS => {
                let mut out = String::new();
                match prometheus_client::encoding::text::encode(&mut out, &self.registry) {
                    Ok(()) => {
                        let mut r = text(StatusCode::OK, out);
                        r.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static(
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            ),
                        );
                        r
                    }
                    Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
                }
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
