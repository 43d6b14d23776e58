//! Accepting connections (HTTP/1.1 and h2c) until told to stop, then letting in-flight
//! requests finish.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::answer::Body;

/// How long a client may take to send a request's head before its connection is closed
/// (hyper's default, which needs a timer to be enforced).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `handle` on `listener` until `stop` is cancelled, then waits for open connections
/// to finish their in-flight requests — at most `drain` — and closes what is left.
pub async fn serve<H, F>(listener: TcpListener, stop: CancellationToken, drain: Duration, handle: H)
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let handle = Arc::new(handle);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, _peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // e.g. EMFILE: keep serving the connections we have, and give them a moment to
                // close before trying again rather than spinning on the error.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let h = handle.clone();
        let svc = service_fn(move |req| {
            let h = h.clone();
            async move { Ok::<_, Infallible>(h(req).await) }
        });
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            ?drain,
            "connections still open after the drain period; closing them"
        );
    }
}
