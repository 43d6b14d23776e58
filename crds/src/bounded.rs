//! A bound on how long a request to the API server waits for its answer.
//!
//! kube 5's client sets no read timeout by default ("watch streams are protected by a
//! watcher-level idle timeout instead"), and kube-runtime's watcher lists with a plain
//! `Api::list`: a LIST whose answer never comes — a connection that died without a reset, an
//! API server that stopped reading — waits forever, and a watch that has not synced keeps its
//! component unready forever (an end-to-end run saw a subsetter replica answer `/readyz` 503
//! for minutes after its first lists went unanswered). The API server bounds every request that
//! is not a watch by its own `--request-timeout` (60 s by default): past it, it answers 504 if
//! it has not begun, and drops the connection if it has (its timeout filter). So an answer not
//! whole well past that — no headers, or headers and a body that stops — is one that will never
//! be. [`bounded`] gives such a request an error instead, which the caller's retry (the
//! watcher's back-off) handles like any other. The bound is on the whole answer, body
//! included: the client reads a list's body after its headers, and a connection that goes
//! silent between the two (a node whose packets are dropped, an API server host that dies)
//! sends neither the rest nor a reset, and kube's connections have no TCP keep-alive to tell.
//! Watches are left alone: they are long by design, and the watcher's idle timeout covers
//! them.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, BodyStream, StreamBody};
use kube::Client;
use kube::client::Body;
use tokio::time::Instant;

/// The API server's default `--request-timeout` (60 s) and a margin for its 504 to arrive.
pub const DEFAULT_ANSWER_LIMIT: Duration = Duration::from_secs(75);

/// `client`, with every request but a watch given at most `limit` for its whole answer.
pub fn bounded(client: Client, limit: Duration) -> Client {
    let default_ns = client.default_namespace().to_string();
    let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
        let client = client.clone();
        async move {
            if is_watch(req.uri()) {
                return client.send(req).await.map(|a| a.map(BodyExt::boxed_unsync));
            }
            let what = format!("{} {}", req.method(), req.uri().path());
            let deadline = Instant::now() + limit;
            match tokio::time::timeout_at(deadline, client.send(req)).await {
                Ok(answer) => answer.map(|a| whole_by(a, deadline, limit, what)),
                Err(_) => {
                    tracing::warn!(request = %what, limit_s = limit.as_secs_f64(), "no answer from the API server: giving up");
                    Err(kube::Error::Service(
                        format!("{what}: no answer from the API server within {limit:?}").into(),
                    ))
                }
            }
        }
    });
    Client::new(svc, default_ns)
}

/// `answer`, its body cut short with an error if it is not whole by `deadline`.
fn whole_by(
    answer: Response<Body>,
    deadline: Instant,
    limit: Duration,
    what: String,
) -> Response<UnsyncBoxBody<Bytes, kube::Error>> {
    answer.map(|body| {
        let frames = futures::stream::unfold(Some(BodyStream::new(body)), move |rest| {
            let what = what.clone();
            async move {
                let mut rest = rest?;
                match tokio::time::timeout_at(deadline, rest.next()).await {
                    Ok(Some(Ok(frame))) => Some((Ok(frame), Some(rest))),
                    Ok(Some(Err(e))) => Some((Err(e), None)),
                    Ok(None) => None,
                    Err(_) => {
                        tracing::warn!(request = %what, limit_s = limit.as_secs_f64(), "the API server's answer stopped before its end: giving up");
                        let e = format!("{what}: answer not whole within {limit:?}");
                        Some((Err(kube::Error::Service(e.into())), None))
                    }
                }
            }
        });
        StreamBody::new(frames).boxed_unsync()
    })
}

/// Whether the request asks for a watch (`watch=true` or `watch=1` in its query).
fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch=True"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use kube::api::{ListParams, WatchParams};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn watches_are_told_from_other_requests_by_their_query() {
        let w = |s: &str| is_watch(&s.parse().unwrap());
        assert!(w("/api/v1/pods?watch=true&resourceVersion=5"));
        assert!(w("/api/v1/pods?labelSelector=a%3Db&watch=1"));
        assert!(!w("/api/v1/pods"));
        assert!(!w("/api/v1/pods?limit=500"));
        assert!(!w("/api/v1/pods?watch=false"));
        assert!(!w("/api/v1/pods?labelSelector=watch%3Dtrue"));
    }

    /// An API server that accepts connections, reads what it is sent, and never answers.
    async fn mute_server() -> std::net::SocketAddr {
        stalling_server("").await
    }

    /// An API server that answers each request's first bytes with `said`, then goes silent
    /// (reads on, never closes): headers and part of a body, from a connection that died.
    async fn stalling_server(said: &'static str) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let mut answered = false;
                    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {
                        if !answered && !said.is_empty() {
                            answered = true;
                            let _ = conn.write_all(said.as_bytes()).await;
                        }
                    }
                });
            }
        });
        addr
    }

    /// Virtual time: the runtime's clock jumps to the next timer whenever every task waits.
    #[tokio::test(start_paused = true)]
    async fn a_list_with_no_answer_fails_at_the_limit_and_a_watch_waits_on() {
        let addr = mute_server().await;
        let cfg = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = bounded(Client::try_from(cfg).unwrap(), Duration::from_secs(75));
        let api: Api<ConfigMap> = Api::namespaced(client, "default");

        let started = tokio::time::Instant::now();
        let err = api
            .list(&ListParams::default())
            .await
            .expect_err("no answer");
        assert!(err.to_string().contains("no answer"), "{err}");
        assert_eq!(started.elapsed().as_secs(), 75, "failed at the limit");

        // A watch has no such bound: still waiting at ten times the limit.
        let params = WatchParams::default();
        let watch = api.watch(&params, "0");
        let waited = tokio::time::timeout(Duration::from_secs(750), watch).await;
        assert!(waited.is_err(), "the watch was not cut short");
    }

    const LIST: &str = r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[]}"#;

    fn answer_head(len: usize) -> String {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        )
    }

    /// The headers come, then half the body, then nothing: without a bound on the body the
    /// list waits forever (the headers' bound has passed).
    #[tokio::test(start_paused = true)]
    async fn a_list_whose_body_stops_fails_at_the_limit() {
        let half = &LIST[..LIST.len() / 2];
        let said: &'static str =
            Box::leak(format!("{}{half}", answer_head(LIST.len())).into_boxed_str());
        let addr = stalling_server(said).await;
        let cfg = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = bounded(Client::try_from(cfg).unwrap(), Duration::from_secs(75));
        let api: Api<ConfigMap> = Api::namespaced(client, "default");

        let started = tokio::time::Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(750), api.list(&ListParams::default()))
            .await
            .expect("the list still waited at ten times the limit")
            .expect_err("the body never ends");
        assert!(err.to_string().contains("not whole"), "{err}");
        assert_eq!(started.elapsed().as_secs(), 75, "failed at the limit");
    }

    /// A whole answer passes through the bound unchanged, and a watch whose headers came but
    /// whose events do not is not cut short.
    #[tokio::test(start_paused = true)]
    async fn a_whole_answer_is_read_and_a_quiet_watch_waits_on() {
        let said: &'static str =
            Box::leak(format!("{}{LIST}", answer_head(LIST.len())).into_boxed_str());
        let addr = stalling_server(said).await;
        let cfg = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = bounded(Client::try_from(cfg).unwrap(), Duration::from_secs(75));
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        let list = api
            .list(&ListParams::default())
            .await
            .expect("a whole list");
        assert!(list.items.is_empty());
        assert_eq!(list.metadata.resource_version.as_deref(), Some("7"));

        let chunked = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
        let addr = stalling_server(chunked).await;
        let cfg = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = bounded(Client::try_from(cfg).unwrap(), Duration::from_secs(75));
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        let params = WatchParams::default();
        let mut events = api
            .watch(&params, "0")
            .await
            .expect("the watch's headers")
            .boxed();
        let waited = tokio::time::timeout(Duration::from_secs(750), events.next()).await;
        assert!(waited.is_err(), "the watch was not cut short");
    }
}
