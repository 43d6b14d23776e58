//! The simulated app a pod runs: a real HTTP server (HTTP/1.1 and h2c, with upgrades) on the
//! pod's own loopback address.
//!
//! Every request (other than `/healthz`) is answered with `<METHOD> <path?query>\n` followed by
//! the request body, and the headers `x-pod-name`, `x-pod-namespace`, `x-node-name`, `x-pod-ip`
//! and `x-request-version` (the HTTP version the request arrived in, e.g. `HTTP/2.0`).
//! Behaviour is configured from the first container's env (`SIM_DELAY_MS`: a delay before each
//! answer; `SIM_CONCURRENCY`: at most that many requests in flight, more are answered 503 at
//! once, never queued, so an overload shows up in the caller's numbers instead of as latency).
//! Per request:
//! - `x-sim-delay-ms` overrides the delay and `x-sim-status` picks the status code;
//! - `x-sim-echo-headers` (any value) puts the request's headers, one `name: value` line each,
//!   then an empty line, between the first line and the body;
//! - `x-sim-stream` (any value) streams the request body back as it arrives, frame by frame,
//!   instead of reading it whole first (after the first line);
//! - `content-type: application/grpc…` answers as a gRPC echo would: the request body (its
//!   length-prefixed messages) back, `content-type: application/grpc`, and the trailers
//!   `grpc-status: 0` and `grpc-message: OK`;
//! - an HTTP/1.1 upgrade (`Connection: upgrade` + `Upgrade: <protocol>`) is answered
//!   `101 Switching Protocols` with the same `Upgrade`, then every byte received on the
//!   connection is echoed back until the client closes it (raw bytes: no websocket framing and
//!   no `Sec-WebSocket-Accept`, which only the client's library would check).
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use k8s_openapi::api::core::v1::Pod;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};

pub const DEFAULT_PORT: u16 = 8080;
pub const ENV_DELAY_MS: &str = "SIM_DELAY_MS";
pub const ENV_CONCURRENCY: &str = "SIM_CONCURRENCY";
pub const HEADER_DELAY_MS: &str = "x-sim-delay-ms";
pub const HEADER_STATUS: &str = "x-sim-status";
pub const HEADER_ECHO_HEADERS: &str = "x-sim-echo-headers";
pub const HEADER_STREAM: &str = "x-sim-stream";
pub const HEADER_REQUEST_VERSION: &str = "x-request-version";

/// The body of the app's answers.
type AppBody = BoxBody<Bytes, hyper::Error>;

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
    open_connections: AtomicUsize,
    in_flight: AtomicUsize,
    upgrades: AtomicU64,
    body_errors: AtomicU64,
    /// Woken on every change of the counters above, for [`AppStats::wait_for`].
    changed: Notify,
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
    /// Connections accepted and not yet closed (an upgraded one until its tunnel ends).
    pub fn open_connections(&self) -> usize {
        self.open_connections.load(Ordering::Relaxed)
    }
    /// Upgrades answered 101.
    pub fn upgrades(&self) -> u64 {
        self.upgrades.load(Ordering::Relaxed)
    }
    /// Requests whose body failed before its end (the client cut the connection or reset the
    /// stream mid-body).
    pub fn body_errors(&self) -> u64 {
        self.body_errors.load(Ordering::Relaxed)
    }

    /// Waits until `cond` holds, for at most `timeout`; whether it held.
    pub async fn wait_for(&self, timeout: Duration, cond: impl Fn(&AppStats) -> bool) -> bool {
        tokio::time::timeout(timeout, async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                // Registered before the check, so a change in between is not missed.
                changed.as_mut().enable();
                if cond(self) {
                    return;
                }
                changed.await;
            }
        })
        .await
        .is_ok()
    }

    fn bump(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
    }
}

/// Counts an open connection (or tunnel) until dropped.
struct OpenConnection(Arc<AppStats>);

impl OpenConnection {
    fn new(stats: &Arc<AppStats>) -> Self {
        stats.open_connections.fetch_add(1, Ordering::Relaxed);
        stats.changed.notify_waiters();
        OpenConnection(stats.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::Relaxed);
        self.0.changed.notify_waiters();
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
                ctx.stats.bump(&ctx.stats.connections);
                let open = OpenConnection::new(&ctx.stats);
                if black_hole {
                    conns.spawn(async move {
                        let _held = (stream, open);
                        std::future::pending::<()>().await;
                    });
                    continue;
                }
                let ctx = ctx.clone();
                let svc = service_fn(move |req| handle(req, ctx.clone()));
                // HTTP/1.1 or h2c by the first bytes, as an app behind a `h2c` port may be.
                let conn = auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                    .into_owned();
                let conn = graceful.watch(conn);
                conns.spawn(serve_connection(conn, mode.clone(), open));
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

async fn serve_connection<F: Future>(
    conn: F,
    mut mode: watch::Receiver<Mode>,
    _open: OpenConnection,
) {
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
        stats.changed.notify_waiters();
        InFlight(stats)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.changed.notify_waiters();
    }
}

async fn handle(
    mut req: Request<Incoming>,
    ctx: Arc<Ctx>,
) -> Result<Response<AppBody>, Infallible> {
    if req.uri().path() == "/healthz" {
        ctx.stats.bump(&ctx.stats.health_checks);
        return Ok(respond(
            &ctx,
            &req,
            StatusCode::OK,
            full(Bytes::from_static(b"ok\n")),
        ));
    }
    ctx.stats.bump(&ctx.stats.requests);
    let _permit = match &ctx.limit {
        Some(limit) => match limit.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                ctx.stats.bump(&ctx.stats.rejected);
                let body =
                    Bytes::from_static(b"over the app's concurrency cap (SIM_CONCURRENCY)\n");
                return Ok(respond(
                    &ctx,
                    &req,
                    StatusCode::SERVICE_UNAVAILABLE,
                    full(body),
                ));
            }
        },
        None => None,
    };
    if let Some(protocol) = upgrade_requested(&req) {
        return Ok(upgrade(&ctx, &mut req, protocol));
    }
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
    let mut head = format!(
        "{} {}\n",
        req.method(),
        req.uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
    );
    if req.headers().contains_key(HEADER_ECHO_HEADERS) {
        for (name, value) in req.headers() {
            head.push_str(&format!(
                "{name}: {}\n",
                String::from_utf8_lossy(value.as_bytes())
            ));
        }
        head.push('\n');
    }
    let grpc = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if req.headers().contains_key(HEADER_STREAM) && !grpc {
        return Ok(stream_back(&ctx, req, status, head));
    }
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            ctx.stats.bump(&ctx.stats.body_errors);
            Bytes::new()
        }
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let req = Request::from_parts(parts, ());
    if grpc {
        // Echoed messages keep their own length prefixes: a valid gRPC answer.
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("grpc-message", HeaderValue::from_static("OK"));
        let frames = [Ok(Frame::data(body)), Ok(Frame::trailers(trailers))];
        let body = StreamBody::new(futures::stream::iter(frames)).boxed();
        let mut resp = respond(&ctx, &req, status, body);
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        return Ok(resp);
    }
    let mut out = BytesMut::with_capacity(head.len() + body.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(&body);
    Ok(respond(&ctx, &req, status, full(out.freeze())))
}

/// The protocol an HTTP/1.1 upgrade request asks for.
fn upgrade_requested<B>(req: &Request<B>) -> Option<HeaderValue> {
    let connection_says_upgrade = req
        .headers()
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if req.version() != http::Version::HTTP_11 || !connection_says_upgrade {
        return None;
    }
    req.headers().get(http::header::UPGRADE).cloned()
}

/// Answers 101 and echoes the upgraded connection's bytes.
fn upgrade(
    ctx: &Arc<Ctx>,
    req: &mut Request<Incoming>,
    protocol: HeaderValue,
) -> Response<AppBody> {
    ctx.stats.bump(&ctx.stats.upgrades);
    let on_upgrade = hyper::upgrade::on(&mut *req);
    let stats = ctx.stats.clone();
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed");
                return;
            }
        };
        let _open = OpenConnection::new(&stats);
        let mut io = TokioIo::new(upgraded);
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // Written and flushed at once: an echo, not a buffer.
            if io.write_all(&buf[..n]).await.is_err() || io.flush().await.is_err() {
                break;
            }
        }
        let _ = io.shutdown().await;
    });
    let mut resp = respond(
        ctx,
        req,
        StatusCode::SWITCHING_PROTOCOLS,
        full(Bytes::new()),
    );
    let h = resp.headers_mut();
    h.remove(http::header::CONTENT_TYPE);
    h.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("upgrade"),
    );
    h.insert(http::header::UPGRADE, protocol);
    resp
}

/// Answers with `head`, then each frame of the request body as it arrives.
fn stream_back(
    ctx: &Arc<Ctx>,
    req: Request<Incoming>,
    status: StatusCode,
    head: String,
) -> Response<AppBody> {
    let (parts, body) = req.into_parts();
    let stats = ctx.stats.clone();
    let first = futures::stream::once(async move { Ok(Frame::data(Bytes::from(head))) });
    let rest = futures::stream::unfold(Some(body), move |body| {
        let stats = stats.clone();
        async move {
            let mut body = body?;
            match body.frame().await {
                Some(Ok(frame)) => Some((Ok(frame), Some(body))),
                Some(Err(e)) => {
                    stats.bump(&stats.body_errors);
                    Some((Err(e), None))
                }
                None => None,
            }
        }
    });
    let body = StreamBody::new(futures::StreamExt::chain(first, rest)).boxed();
    respond(ctx, &Request::from_parts(parts, ()), status, body)
}

fn full(b: Bytes) -> AppBody {
    Full::new(b).map_err(|never| match never {}).boxed()
}

fn respond<B>(ctx: &Ctx, req: &Request<B>, status: StatusCode, body: AppBody) -> Response<AppBody> {
    let mut resp = Response::new(body);
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
    h.insert(
        HEADER_REQUEST_VERSION,
        HeaderValue::from_static(version_name(req.version())),
    );
    resp
}

fn version_name(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}
