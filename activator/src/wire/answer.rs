//! The answers the activator makes itself (docs/architecture.md, "The contracts"): a status code, a short plain-text
//! body saying why, and `Retry-After` where retrying later can help.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};

/// The content type of the activator's own answers.
pub const CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// The body type of every response the activator returns (proxied or its own).
/// Every body the activator serves or sends: hyper's, or one of its own whose failure (a
/// response past its timeout) must reach hyper as an error, so that the connection closes
/// instead of ending the message early as if it were whole.
pub type Body = BoxBody<Bytes, BodyError>;
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a body failed: hyper's error, or the activator's own. A concrete type, not a
/// `BoxError`: hyper's `Into<BoxError>` bound on a boxed error trips the compiler's
/// higher-ranked checks inside spawned futures.
#[derive(Debug)]
pub struct BodyError(pub BoxError);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// A hyper body's error as a [`BodyError`].
pub fn box_error(e: hyper::Error) -> BodyError {
    BodyError(Box::new(e))
}

/// A request the activator answers itself instead of proxying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub reason: String,
    pub retry_after_secs: Option<u32>,
    /// The request never reached its target (the connection was refused or timed out), so
    /// another pod or member may take it, if the request can be sent again.
    pub retry_elsewhere: bool,
}

impl Refusal {
    /// 404: the request names no known revision.
    pub fn unknown_revision(what: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("unknown revision: {what}"))
    }
    /// 503 + Retry-After: nobody can take the request right now.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self {
            retry_after_secs: Some(1),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, reason)
        }
    }
    /// 504: the cold start or the request outlived its timeout.
    pub fn timeout(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::GATEWAY_TIMEOUT, reason)
    }
    /// 502: the app (or the peer) is unreachable after retries.
    pub fn bad_gateway(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, reason)
    }
    /// 502 for a target that did not take the connection: the request was not sent, so it
    /// may be retried elsewhere.
    pub fn unreachable(reason: impl Into<String>) -> Self {
        Self {
            retry_elsewhere: true,
            ..Self::bad_gateway(reason)
        }
    }
    /// 400: the request itself is malformed.
    pub fn bad_request(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, reason)
    }

    /// 408: the request body stopped arriving.
    pub fn request_timeout(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, reason)
    }

    fn new(status: StatusCode, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
            retry_after_secs: None,
            retry_elsewhere: false,
        }
    }

    /// The body of the answer: the reason, on one line.
    pub fn body_text(&self) -> String {
        format!("{}\n", self.reason)
    }

    /// The HTTP response for this refusal.
    pub fn into_response(self) -> Response<Body> {
        let mut resp = Response::new(full(self.body_text()));
        *resp.status_mut() = self.status;
        let h = resp.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(CONTENT_TYPE),
        );
        if let Some(s) = self.retry_after_secs {
            h.insert(http::header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// A complete in-memory body.
pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}
