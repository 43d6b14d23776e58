//! One membership stream (`crds::member_stream`): who may open it, its first state, then the
//! hub's changes and a bookmark at each beat.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use crds::ActivationEndpoints;
use crds::member_stream::{CONTENT_TYPE, Frame, Held, StreamQuery};
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};

use super::hub::{MemberHub, Subscription};

/// The body of every directory answer: whole, or a stream.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Who may open a stream, how many, and its beat.
#[derive(Clone)]
pub struct StreamAccess {
    /// The cluster's hop secret, the proof an activator gives (`Authorization: Bearer`).
    /// None: every caller is answered (tests; a cluster without the Secret).
    pub secret: Option<Arc<[u8]>>,
    /// Streams one replica holds at most; beyond, 503 and the caller tries another.
    pub max_streams: usize,
    /// How often a stream says where it is (and that it lives) when nothing changes.
    pub bookmark: Duration,
    /// How long a caller ahead of this replica waits for it before being sent elsewhere.
    pub behind_wait: Duration,
}

impl Default for StreamAccess {
    fn default() -> Self {
        Self {
            secret: None,
            max_streams: 10_000,
            bookmark: Duration::from_secs(10),
            behind_wait: Duration::from_secs(2),
        }
    }
}

/// What a stream's first state is read from: a replica's caches (a trait so the answers are
/// tested without a cluster).
pub trait SyncSource: Send + Sync {
    fn synced(&self) -> bool;
    /// The node's memberships for a [`Frame::Sync`]: their version, each one's name and
    /// version, the objects newer than `since`; or why this replica cannot answer them.
    #[allow(clippy::type_complexity)]
    fn member_sync(
        &self,
        node: &str,
        since: Option<u64>,
    ) -> Result<(u64, Vec<Held>, Vec<ActivationEndpoints>), &'static str>;
}

/// The answer to a stream request.
pub async fn respond(
    q: StreamQuery,
    headers: &HeaderMap,
    source: &dyn SyncSource,
    hub: &Arc<MemberHub>,
    access: &StreamAccess,
) -> Response<Body> {
    if let Some(secret) = &access.secret
        && !proven(headers, secret)
    {
        hub.refused();
        let mut r = text(StatusCode::UNAUTHORIZED, "no activator's proof\n");
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer"),
        );
        return r;
    }
    if hub.streams() >= access.max_streams {
        hub.refused();
        let mut r = text(StatusCode::SERVICE_UNAVAILABLE, "too many streams here\n");
        r.headers_mut()
            .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("5"));
        return r;
    }
    if !source.synced() {
        return text(StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n");
    }
    if let Some(since) = q.since
        && !hub.reached(since, access.behind_wait).await
    {
        hub.refused();
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "this replica is behind the version asked from\n",
        );
    }
    let label = crds::contract::member_label(&q.node);
    let sub = hub.subscribe(&label);
    let (at, held, items) = match source.member_sync(&q.node, q.since) {
        Ok(s) => s,
        Err(why) if why == crds::member_stream::ONE_NAMESPACE => {
            return text(StatusCode::NOT_IMPLEMENTED, &format!("{why}\n"));
        }
        Err(why) => return text(StatusCode::SERVICE_UNAVAILABLE, &format!("{why}\n")),
    };
    let sync = Frame::Sync {
        resource_version: at.to_string(),
        held,
        items,
    };
    let state = Beat {
        first: Some(Bytes::from(sync.line())),
        sub,
        at,
        hub: Arc::clone(hub),
        tick: tokio::time::interval_at(
            tokio::time::Instant::now() + access.bookmark,
            access.bookmark,
        ),
    };
    let frames = futures::stream::unfold(state, |mut s| async move {
        let chunk = s.next().await?;
        s.hub.sent();
        Some((Ok(hyper::body::Frame::data(chunk)), s))
    });
    let mut r = Response::new(BodyExt::boxed_unsync(StreamBody::new(StreamExt::boxed(
        frames,
    ))));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(CONTENT_TYPE),
    );
    r
}

/// A stream's state: its first state until sent, the hub's queue, the newest version sent.
struct Beat {
    first: Option<Bytes>,
    sub: Subscription,
    /// Changes at or before it are in the first state (or were sent): not sent again.
    at: u64,
    hub: Arc<MemberHub>,
    tick: tokio::time::Interval,
}

impl Beat {
    /// The next chunk: the first state, a change, or at a beat whatever is queued and a
    /// bookmark. None when the hub closed the stream.
    async fn next(&mut self) -> Option<Bytes> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        loop {
            tokio::select! {
                q = self.sub.rx.recv() => {
                    let (rv, line) = q?;
                    if rv > self.at {
                        self.at = rv;
                        return Some(line);
                    }
                }
                _ = self.tick.tick() => {
                    // The version is read before the queue is drained: every change up to
                    // it was queued before it was published (`MemberHub::advance`).
                    let v = self.hub.version();
                    let mut out = BytesMut::new();
                    while let Ok((rv, line)) = self.sub.rx.try_recv() {
                        if rv > self.at {
                            self.at = rv;
                            out.extend_from_slice(&line);
                        }
                    }
                    self.at = self.at.max(v);
                    out.extend_from_slice(&Frame::Bookmark { resource_version: self.at.to_string() }.line());
                    return Some(out.freeze());
                }
            }
        }
    }
}

/// Exactly one `Authorization: Bearer <secret>`, compared in constant time.
fn proven(headers: &HeaderMap, secret: &[u8]) -> bool {
    let mut all = headers.get_all(hyper::header::AUTHORIZATION).iter();
    let (Some(v), None) = (all.next(), all.next()) else {
        return false;
    };
    let Some(token) = v.as_bytes().strip_prefix(b"Bearer ") else {
        return false;
    };
    token.len() == secret.len()
        && token
            .iter()
            .zip(secret)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

pub fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut r = Response::new(
        http_body_util::Full::new(Bytes::from(body.to_owned()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proof_is_one_exact_bearer_token() {
        let mut h = HeaderMap::new();
        assert!(!proven(&h, b"s3cret"));
        h.insert(
            hyper::header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cret"),
        );
        assert!(proven(&h, b"s3cret"));
        assert!(!proven(&h, b"s3cre"));
        assert!(!proven(&h, b"s3creT"));
        h.append(
            hyper::header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cret"),
        );
        assert!(!proven(&h, b"s3cret"), "two proofs");
        let mut h = HeaderMap::new();
        h.insert(
            hyper::header::AUTHORIZATION,
            HeaderValue::from_static("Basic s3cret"),
        );
        assert!(!proven(&h, b"s3cret"));
    }
}
