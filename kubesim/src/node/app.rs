//! The simulated app a pod runs: a real HTTP/1.1 server on the pod's own loopback address.
//!
//! Every request (other than `/healthz`) is answered with `<METHOD> <path?query>\n` followed by
//! the request body, and the headers `x-pod-name`, `x-pod-namespace`, `x-node-name`, `x-pod-ip`.
//! Behaviour is configured from the first container's env (`SIM_DELAY_MS`: a delay before each
//! answer; `SIM_CONCURRENCY`: at most that many requests in flight, more are answered 503 at
//! once, never queued, so an overload shows up in the caller's numbers instead of as latency).
//! Per request, `x-sim-delay-ms` overrides the delay and `x-sim-status` picks the status code.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use k8s_openapi::api::core::v1::Pod;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};

pub const DEFAULT_PORT: u16 = 8080;
pub const ENV_DELAY_MS: &str = "SIM_DELAY_MS";
pub const ENV_CONCURRENCY: &str = "SIM_CONCURRENCY";
pub const HEADER_DELAY_MS: &str = "x-sim-delay-ms";
pub const HEADER_STATUS: &str = "x-sim-status";

/// What one app serves and as whom.
#[derive(Clone, Debug)]
pub struct AppSpec {
    pub pod_name: String,
    pub namespace: String,
    pub node_name: String,
    pub addr: SocketAddr,
    pub delay: Duration,
    /// `None`: unlimited.
    pub concurrency: Option<usize>,
}

impl AppSpec {
    /// The app of `pod` bound at `ip`, on the first container's first port (8080 when none).
    pub fn from_pod(pod: &Pod, node_name: &str, ip: Ipv4Addr) -> Self {
        let first = pod.spec.as_ref().and_then(|s| s.containers.first());
        let port = first
            .and_then(|c| c.ports.as_ref())
            .and_then(|p| p.first())
            .and_then(|p| u16::try_from(p.container_port).ok())
            .filter(|p| *p != 0)
            .unwrap_or(DEFAULT_PORT);
        let env = |name: &str| {
            first
                .and_then(|c| c.env.as_ref())
                .and_then(|env| env.iter().find(|e| e.name == name))
                .and_then(|e| e.value.as_deref())
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        AppSpec {
            pod_name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            node_name: node_name.to_owned(),
            addr: SocketAddr::from((ip, port)),
            delay: Duration::from_millis(env(ENV_DELAY_MS).unwrap_or(0)),
            concurrency: env(ENV_CONCURRENCY).filter(|c| *c > 0).map(|c| c as usize),
        }
    }
}

/// Counters of one app, shared with whoever holds the handle.
#[derive(Debug, Default)]
pub struct AppStats {
    requests: AtomicU64,
    rejected: AtomicU64,
    health_checks: AtomicU64,
    connections: AtomicU64,
    in_flight: AtomicUsize,
}

impl AppStats {
    /// Requests received, excluding `/healthz`, including those refused by the concurrency cap.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
    /// Requests answered 503 because of the concurrency cap.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }
    pub fn health_checks(&self) -> u64 {
        self.health_checks.load(Ordering::Relaxed)
    }
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Serve,
    /// Accept connections, never answer on any of them.
    BlackHole,
    /// Stop accepting, let in-flight requests finish.
    Drain,
}

/// A running app. Dropping it stops it at once: the listener closes (new connections are
/// refused) and open connections are cut.
pub struct App {
    addr: SocketAddr,
    stats: Arc<AppStats>,
    mode: watch::Sender<Mode>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

struct Ctx {
    stats: Arc<AppStats>,
    limit: Option<Arc<Semaphore>>,
    delay: Duration,
    pod_name: HeaderValue,
    namespace: HeaderValue,
    node_name: HeaderValue,
    pod_ip: HeaderValue,
}

fn header_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

impl App {
    pub async fn start(spec: AppSpec) -> std::io::Result<App> {
        let listener = TcpListener::bind(spec.addr).await?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(AppStats::default());
        let ctx = Arc::new(Ctx {
            stats: stats.clone(),
            limit: spec.concurrency.map(|c| Arc::new(Semaphore::new(c))),
            delay: spec.delay,
            pod_name: header_value(&spec.pod_name),
            namespace: header_value(&spec.namespace),
            node_name: header_value(&spec.node_name),
            pod_ip: header_value(&addr.ip().to_string()),
        });
        let (mode, mode_rx) = watch::channel(Mode::Serve);
        let task = tokio::spawn(serve(listener, ctx, mode_rx));
        Ok(App {
            addr,
            stats,
            mode,
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stats(&self) -> &Arc<AppStats> {
        &self.stats
    }

    /// From now on connections are accepted but nothing is ever answered, on new connections
    /// and on open ones: what a client sees of a machine that froze or a partitioned network.
    pub fn black_hole(&self) {
        self.mode.send_replace(Mode::BlackHole);
    }

    /// Stops at once and returns when the listener is closed, so new connections are refused
    /// from then on; open connections are cut.
    pub async fn stop(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Stops accepting (the listener closes), lets in-flight requests finish for up to
    /// `grace`, then cuts whatever is left. Idle keep-alive connections are closed.
    pub async fn drain(mut self, grace: Duration) {
        self.mode.send_replace(Mode::Drain);
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(grace, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

async fn serve(listener: TcpListener, ctx: Arc<Ctx>, mut mode: watch::Receiver<Mode>) {
    let graceful = GracefulShutdown::new();
    // Dropping the set (when this task ends or is aborted) aborts every connection task.
    let mut conns = JoinSet::new();
    let mut black_hole = false;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(addr = ?listener.local_addr().ok(), error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                ctx.stats.connections.fetch_add(1, Ordering::Relaxed);
                if black_hole {
                    conns.spawn(async move {
                        let _held = stream;
                        std::future::pending::<()>().await;
                    });
                    continue;
                }
                let ctx = ctx.clone();
                let svc = service_fn(move |req| handle(req, ctx.clone()));
                let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
                let conn = graceful.watch(conn);
                conns.spawn(serve_connection(conn, mode.clone()));
            }
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                match *mode.borrow_and_update() {
                    Mode::Serve => {}
                    Mode::BlackHole => black_hole = true,
                    Mode::Drain => break,
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    graceful.shutdown().await;
}

async fn serve_connection<F: Future>(conn: F, mut mode: watch::Receiver<Mode>) {
    let mut conn = pin!(conn);
    let black_holed = async move { mode.wait_for(|m| *m == Mode::BlackHole).await.is_ok() };
    tokio::select! {
        _ = &mut conn => return,
        held = black_holed => if !held { return },
    }
    // The socket stays open (owned by `conn`), but is never read or written again.
    std::future::pending::<()>().await;
}

struct InFlight<'a>(&'a AppStats);

impl<'a> InFlight<'a> {
    fn new(stats: &'a AppStats) -> Self {
        stats.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(stats)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn handle(
    req: Request<Incoming>,
    ctx: Arc<Ctx>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() == "/healthz" {
        ctx.stats.health_checks.fetch_add(1, Ordering::Relaxed);
        return Ok(respond(&ctx, StatusCode::OK, Bytes::from_static(b"ok\n")));
    }
    ctx.stats.requests.fetch_add(1, Ordering::Relaxed);
    let _permit = match &ctx.limit {
        Some(limit) => match limit.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                ctx.stats.rejected.fetch_add(1, Ordering::Relaxed);
                let body =
                    Bytes::from_static(b"over the app's concurrency cap (SIM_CONCURRENCY)\n");
                return Ok(respond(&ctx, StatusCode::SERVICE_UNAVAILABLE, body));
            }
        },
        None => None,
    };
    let _in_flight = InFlight::new(&ctx.stats);
    let header_num = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let delay = header_num(HEADER_DELAY_MS)
        .map(Duration::from_millis)
        .unwrap_or(ctx.delay);
    let status = header_num(HEADER_STATUS)
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK);
    let head = format!(
        "{} {}\n",
        req.method(),
        req.uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
    );
    let body = match req.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut out = BytesMut::with_capacity(head.len() + body.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(&body);
    Ok(respond(&ctx, status, out.freeze()))
}

fn respond(ctx: &Ctx, status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert("x-pod-name", ctx.pod_name.clone());
    h.insert("x-pod-namespace", ctx.namespace.clone());
    h.insert("x-node-name", ctx.node_name.clone());
    h.insert("x-pod-ip", ctx.pod_ip.clone());
    resp
}
