//! The admin port: `/metrics` (Prometheus text), `/healthz`, `/readyz`. Every replica serves
//! it, leader or not, so probes and scrapes work on the standby too. `/readyz` answers 200
//! once the replica's caches have had their first list (a standby is ready to take over), and
//! 503 before: a replica that cannot reach the API server is not Ready, so `kubectl rollout
//! status` does not pass on it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::cluster::metrics::Metrics;

/// Binds `addr` and serves until the returned task is aborted or the process exits.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_plain("admin", addr, move |req| {
        answer(req.uri().path(), &metrics, ready.load(Ordering::Acquire))
    })
    .await
}

/// Binds `addr` and answers every request with `respond` (no body is read), on HTTP/1.1 or
/// h2c, until the returned task is aborted: the admin and directory ports' one loop.
pub(crate) async fn serve_plain<F>(
    what: &'static str,
    addr: SocketAddr,
    respond: F,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)>
where
    F: Fn(&Request<hyper::body::Incoming>) -> Response<Full<Bytes>> + Send + Sync + 'static,
{
    serve_with(what, addr, move |req, _peer| {
        let r = respond(&req);
        async move { r }
    })
    .await
}

/// [`serve_plain`] for an answer made asynchronously, with any body (the directory's
/// membership streams), told the peer's address.
pub(crate) async fn serve_with<F, Fut, B>(
    what: &'static str,
    addr: SocketAddr,
    respond: F,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)>
where
    F: Fn(Request<hyper::body::Incoming>, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let respond = Arc::new(respond);
    let task = tokio::spawn(async move {
        // The connections belong to this task: aborting it (a replica stopping) ends them,
        // streams included, as a process exiting would; finished ones are reaped as we go.
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                Some(_) = connections.join_next() => continue,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "{what} accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let respond = Arc::clone(&respond);
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = respond(req, peer);
                async move { Ok::<_, Infallible>(r.await) }
            });
            connections.spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok((bound, task))
}

fn answer(path: &str, metrics: &Metrics, ready: bool) -> Response<Full<Bytes>> {
    let (status, body, ctype) = match path {
        "/metrics" => (
            StatusCode::OK,
            metrics.encode(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        "/healthz" => (StatusCode::OK, "ok\n".into(), "text/plain; charset=utf-8"),
        "/readyz" if ready => (StatusCode::OK, "ok\n".into(), "text/plain; charset=utf-8"),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "caches not synced: the API server has not answered the first lists\n".into(),
            "text/plain; charset=utf-8",
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "not found\n".into(),
            "text/plain; charset=utf-8",
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let m = Metrics::default();
        assert_eq!(answer("/healthz", &m, false).status(), StatusCode::OK);
        assert_eq!(answer("/nope", &m, true).status(), StatusCode::NOT_FOUND);
        assert_eq!(answer("/metrics", &m, false).status(), StatusCode::OK);
        assert_eq!(
            answer("/readyz", &m, false).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(answer("/readyz", &m, true).status(), StatusCode::OK);
    }
}

#[cfg(test)]
mod stopping {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A replica stopping must end the connections it holds, not only its listener: an
    /// activator's kept-alive connection (its membership stream's) would otherwise go on
    /// being answered by a replica that is gone.
    #[tokio::test]
    async fn aborting_the_task_closes_the_connections_it_accepted() {
        let (addr, task) = serve_plain("test", "127.0.0.1:0".parse().unwrap(), |_| {
            Response::new(Full::new(Bytes::from_static(b"ok")))
        })
        .await
        .unwrap();
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 1024];
        let n = conn.read(&mut buf).await.unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "answered while serving"
        );
        task.abort();
        // Kept alive until now; the abort ends it: end of file, or a reset.
        let end = conn.read(&mut buf).await;
        assert!(matches!(end, Ok(0) | Err(_)), "still open: {end:?}");
    }
}
