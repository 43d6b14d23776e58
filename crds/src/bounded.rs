//! A bound on how long a request to the API server waits for its answer.
//!
//! kube 5's client sets no read timeout by default ("watch streams are protected by a
//! watcher-level idle timeout instead"), and kube-runtime's watcher lists with a plain
//! `Api::list`: a LIST whose answer never comes — a connection that died without a reset, an
//! API server that stopped reading — waits forever, and a watch that has not synced keeps its
//! component unready forever (an end-to-end run saw a subsetter replica answer `/readyz` 503
//! for minutes after its first lists went unanswered). The API server bounds every request that
//! is not a watch by its own `--request-timeout` (60 s by default) and answers 504 past it; so a
//! request with no answer headers well past that is one no answer will come for. [`bounded`]
//! gives such a request an error instead, which the caller's retry (the watcher's back-off)
//! handles like any other. Watches are left alone: they are long by design, and the watcher's
//! idle timeout covers them.

use std::time::Duration;

use http::Request;
use kube::Client;

/// The API server's default `--request-timeout` (60 s) and a margin for its 504 to arrive.
pub const DEFAULT_ANSWER_LIMIT: Duration = Duration::from_secs(75);

/// `client`, with every request but a watch given at most `limit` for its answer's headers.
pub fn bounded(client: Client, limit: Duration) -> Client {
    let default_ns = client.default_namespace().to_string();
    let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
        let client = client.clone();
        async move {
            if is_watch(req.uri()) {
                return client.send(req).await;
            }
            let what = format!("{} {}", req.method(), req.uri().path());
            match tokio::time::timeout(limit, client.send(req)).await {
                Ok(answer) => answer,
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
    use tokio::io::AsyncReadExt;

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
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
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
}
