//! The HTTP server: binding, routing, accounting, latency injection, watches and shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, header};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, watch as tokio_watch};
use tokio::task::JoinHandle;

use super::cache_counters::CacheCounters;
use super::cache_watcher;
use super::discovery;
use super::dispatch::Dispatch;
use super::gc;
use super::handlers::{self, Ctx, Reply};
use super::http::{Body, Query, error_response, json_response, text_response, value_response};
use super::list::Selectors;
use super::stats::{Stats, StatsInner, UserRequestKey, metrics_text};
use super::status::{ApiError, Cause};
use super::storage::{Access, Storage, StorageShape};
use super::store::State;
use super::watch::{
    Scope, WatchStat, Watcher, bookmark_line, event_line, exact_term, next_bookmark,
};
use super::watch_cache_sizing::{WINDOW_MAX, WatchCacheConfig, chan_size};
use crate::delay::Delay;
use crate::error::Error;

/// kube-apiserver's bookmark frequency (`cacheWatcher`'s `bookmarkFrequency`).
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);

/// Used when a watch names no `timeoutSeconds` (kube-apiserver's `--min-request-timeout`).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// How to run an [`ApiServer`].
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// Address to bind; port 0 picks a free one.
    pub bind: SocketAddr,
    /// Delay before handling each request (simulates a remote API server).
    pub latency: Option<Duration>,
    /// Time each write (create, update, patch, delete) holds the storage before it is applied
    /// and answered, sampled per write: on a real server every write is an etcd commit.
    pub write_latency: Delay,
    /// Time each GET and LIST takes in the server itself, before it is answered, cached or
    /// not (watches are not delayed).
    pub read_latency: Delay,
    /// Time a quorum read (a GET or LIST without `resourceVersion`) holds the storage, on top
    /// of `read_latency`; a read naming a resourceVersion is served from the watch cache.
    pub quorum_read_latency: Delay,
    /// Writes and quorum reads the storage serves at once; more wait in arrival order (see
    /// [`super::storage`]). `None`: no queueing, each waits only its own time.
    pub storage_lanes: Option<usize>,
    /// Writes and quorum reads one commit takes at most: those that arrived while a lane's
    /// previous commit ran share its next one, as etcd batches proposals. 1: one by one.
    pub storage_batch: usize,
    /// Time each write adds to its commit past the first (the server's own work per write,
    /// which batching does not share).
    pub storage_write_cost: Delay,
    /// The most watch events kept per resource for resuming watches (the watch cache's
    /// window: it starts at `watch_cache.window_min` events and grows while they are recent,
    /// up to this; kube-apiserver: 102,400); a watch from an older resourceVersion gets 410
    /// Gone. A value below `watch_cache.window_min` is a fixed window of this many events.
    pub watch_history: usize,
    /// The rest of the watch cache: its window's growth, watchers' buffer sizes and the
    /// dispatch time budget (see [`WatchCacheConfig`]; the default is kube-apiserver
    /// v1.28.7's).
    pub watch_cache: WatchCacheConfig,
    /// How often watches with `allowWatchBookmarks` get a BOOKMARK (kube-apiserver: a
    /// minute), plus one 2 s before the watch's `timeoutSeconds` ends. Watches that did not
    /// ask get none: a quiet watch is silent.
    pub bookmark_interval: Duration,
}

impl Default for ApiServerConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            latency: None,
            write_latency: Delay::ZERO,
            read_latency: Delay::ZERO,
            quorum_read_latency: Delay::ZERO,
            storage_lanes: None,
            storage_batch: 1,
            storage_write_cost: Delay::ZERO,
            watch_history: WINDOW_MAX,
            watch_cache: WatchCacheConfig::default(),
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
        }
    }
}

pub(crate) struct Inner {
    state: Mutex<State>,
    stats: Mutex<StatsInner>,
    addr: SocketAddr,
    /// nanoseconds; u64::MAX = none
    latency: AtomicU64,
    storage: Storage,
    read_latency: Mutex<Delay>,
    /// Read latency of particular resources (by plural), over `read_latency`.
    resource_read_latency: Mutex<std::collections::HashMap<String, Delay>>,
    bookmark_interval: Duration,
    /// Watch buffers of a fixed size (`watch_cache.chan_size`), or sized as the real server.
    chan_size: Option<usize>,
    counters: Arc<CacheCounters>,
    next_watch: AtomicU64,
    gc: Notify,
    shutdown: tokio_watch::Sender<bool>,
    /// Stopped ([`ApiServer::stop`]): not listening, every connection cut, state kept.
    down: tokio_watch::Sender<bool>,
    /// Its etcd stopped ([`ApiServer::stop_storage`]): serving from the cache only.
    storage_down: tokio_watch::Sender<bool>,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn stats(&self) -> MutexGuard<'_, StatsInner> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn snapshot(&self) -> Stats {
        let mut s = self.stats().snapshot();
        s.watch_cache = self.counters.snapshot();
        s
    }
}

/// An in-memory Kubernetes API server speaking the real REST + watch protocol.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// The accept loop while serving (None while stopped).
    accept: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("addr", &self.inner.addr)
            .finish()
    }
}

fn latency_nanos(d: Option<Duration>) -> u64 {
    d.map(|d| d.as_nanos().min(u64::MAX as u128 - 1) as u64)
        .unwrap_or(u64::MAX)
}

impl ApiServer {
    /// Binds and starts serving, with the namespaces a fresh cluster has.
    pub async fn start(cfg: ApiServerConfig) -> Result<ApiServer, Error> {
        let listener = TcpListener::bind(cfg.bind).await?;
        let addr = listener.local_addr()?;
        let (shutdown, _) = tokio_watch::channel(false);
        let (down, _) = tokio_watch::channel(false);
        let (storage_down, _) = tokio_watch::channel(false);
        let counters = Arc::new(CacheCounters::default());
        let inner = Arc::new(Inner {
            state: Mutex::new(State::new(
                cfg.watch_history,
                cfg.watch_cache.clone(),
                cfg.bookmark_interval,
                counters.clone(),
            )),
            stats: Mutex::new(StatsInner::default()),
            addr,
            latency: AtomicU64::new(latency_nanos(cfg.latency)),
            storage: Storage::new(
                StorageShape {
                    lanes: cfg.storage_lanes,
                    batch: cfg.storage_batch,
                    write_cost: cfg.storage_write_cost.clone(),
                },
                cfg.write_latency.clone(),
                cfg.quorum_read_latency.clone(),
            ),
            read_latency: Mutex::new(cfg.read_latency.clone()),
            resource_read_latency: Mutex::default(),
            bookmark_interval: cfg.bookmark_interval,
            chan_size: cfg.watch_cache.chan_size,
            counters,
            next_watch: AtomicU64::new(1),
            gc: Notify::new(),
            shutdown,
            down,
            storage_down,
        });
        {
            let mut st = inner.state();
            let def = st
                .registry
                .get("", "v1", "namespaces")
                .expect("namespaces served");
            for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                let obj =
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                handlers::create_object(
                    &mut st,
                    &def,
                    None,
                    obj,
                    "kube-apiserver",
                    false,
                    false,
                    false,
                )
                .map_err(|e| Error::KubeConfig(e.message))?;
            }
        }
        let accept = tokio::spawn(accept_loop(inner.clone(), listener));
        let tasks = vec![
            tokio::spawn(gc_loop(inner.clone())),
            tokio::spawn(bookmark_loop(inner.clone())),
        ];
        Ok(ApiServer {
            inner,
            tasks: Arc::new(Mutex::new(tasks)),
            accept: Arc::new(Mutex::new(Some(accept))),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    pub fn kube_config(&self) -> kube::Config {
        let mut c = kube::Config::new(self.url().parse().expect("valid url"));
        c.default_namespace = "default".into();
        c
    }

    /// A real kube client for this server.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.kube_config()).expect("client for a plain http url")
    }

    /// A kube client for this server that names itself `user` (the `Impersonate-User`
    /// header): kubesim authorizes nothing, but counts each request under its user in
    /// [`Stats::requests_by_user`], so a test can tell apart what each component asked for.
    pub fn client_as(&self, user: &str) -> kube::Client {
        let mut cfg = self.kube_config();
        cfg.auth_info.impersonate = Some(user.to_string());
        kube::Client::try_from(cfg).expect("client for a plain http url")
    }

    /// Writes a kubeconfig (cluster `kubesim`, no auth) that kube-rs and kubectl can use.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), Error> {
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kubesim\n  cluster:\n    server: {}\ncontexts:\n- name: kubesim\n  context:\n    cluster: kubesim\n    user: kubesim\n    namespace: default\ncurrent-context: kubesim\nusers:\n- name: kubesim\n  user: {{}}\npreferences: {{}}\n",
            self.url()
        );
        std::fs::write(path, yaml)?;
        Ok(())
    }

    pub fn stats(&self) -> Stats {
        self.inner.snapshot()
    }

    pub fn set_latency(&self, d: Option<Duration>) {
        self.inner
            .latency
            .store(latency_nanos(d), Ordering::Relaxed);
    }

    /// Changes the write-latency model (every create, update, patch and delete from now on).
    pub fn set_write_latency(&self, d: Delay) {
        self.inner.storage.set_write(d);
    }

    /// Changes the read-latency model (every GET and LIST from now on).
    pub fn set_read_latency(&self, d: Delay) {
        *self
            .inner
            .read_latency
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = d;
    }

    /// Changes the read latency of one resource (its plural, e.g. `revisions`): a list a
    /// real server answers slowly (an uncached resource, a busy etcd) while others are fast.
    pub fn set_resource_read_latency(&self, plural: &str, d: Delay) {
        self.inner
            .resource_read_latency
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(plural.to_string(), d);
    }

    /// Forgets retained watch history: a watch resuming from any earlier resourceVersion gets
    /// 410 Gone (as after an etcd compaction).
    pub fn compact(&self) {
        self.inner.state().compact();
    }

    /// The current cluster-wide resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inner.state().rv
    }

    /// Ends all watches: clients see their streams close and re-watch (as when an API server
    /// instance restarts behind a load balancer).
    pub fn close_watches(&self) {
        let mut st = self.inner.state();
        for t in st.tables.values_mut() {
            t.watchers.watchers().close_all();
        }
    }

    /// Stops answering as a stopped or crashed kube-apiserver does, until
    /// [`ApiServer::resume`]: the port is closed (connections are refused), every open
    /// connection is cut where it is (watches end mid-stream, requests get no answer), and
    /// the objects, their resourceVersions and the watch history are kept, as etcd keeps
    /// them. Returns once the port is closed and every connection is gone.
    pub async fn stop(&self) {
        self.inner.down.send_replace(true);
        let accept = self.accept.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(a) = accept {
            let _ = a.await;
        }
    }

    /// Serves again on the same address after [`ApiServer::stop`], from the state it kept
    /// (a watch resuming from a resourceVersion the history still holds gets what it missed;
    /// call [`ApiServer::compact`] while stopped to make every resumed watch get 410 Gone, as
    /// a restarted kube-apiserver's fresh watch cache does). Does nothing while serving.
    pub async fn resume(&self) -> Result<(), Error> {
        if !*self.inner.down.borrow() {
            return Ok(());
        }
        let listener = bind_again(self.inner.addr).await?;
        self.inner.down.send_replace(false);
        let accept = tokio::spawn(accept_loop(self.inner.clone(), listener));
        *self.accept.lock().unwrap_or_else(|e| e.into_inner()) = Some(accept);
        Ok(())
    }

    /// Behaves as a kube-apiserver whose etcd stopped, until [`ApiServer::start_storage`]:
    /// it keeps listening, its open watches stay open (quiet: nothing is written), reads
    /// naming a resourceVersion are answered from the cache, `/readyz`, `/livez` and
    /// `/healthz` answer 500 (their etcd check fails), and a write or quorum read waits for
    /// the storage until its request's `timeout` (kube-apiserver's `--request-timeout`,
    /// 60 s, without one), then gets 504 — or is served if the storage is back first.
    pub fn stop_storage(&self) {
        self.inner.storage_down.send_replace(true);
    }

    /// Ends [`ApiServer::stop_storage`]: the waiting writes and quorum reads go on.
    pub fn start_storage(&self) {
        self.inner.storage_down.send_replace(false);
    }

    /// Stops serving: ends watches and open connections.
    pub async fn shutdown(self) {
        let _ = self.inner.shutdown.send(true);
        self.close_watches();
        let mut tasks: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        tasks.extend(self.accept.lock().unwrap_or_else(|e| e.into_inner()).take());
        for t in tasks {
            let _ = t.await;
        }
    }
}

/// Binds `addr` again after a stop. The port was just closed; should the system not have let
/// go of it yet, binding is retried for a while.
async fn bind_again(addr: SocketAddr) -> Result<TcpListener, Error> {
    let mut tries = 0;
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 100 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn accept_loop(inner: Arc<Inner>, listener: TcpListener) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut sd = inner.shutdown.subscribe();
    let mut down = inner.down.subscribe();
    // The open connections, so that a stop can cut them all.
    let mut conns = tokio::task::JoinSet::new();
    let mut stopped = false;
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((stream, _)) = r else { continue };
                let _ = stream.set_nodelay(true);
                let inner = inner.clone();
                let svc = hyper::service::service_fn(move |req| {
                    let inner = inner.clone();
                    async move { Ok::<_, Infallible>(handle(inner, req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), svc);
                let conn = graceful.watch(conn);
                conns.spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended");
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = sd.changed() => break,
            _ = down.wait_for(|d| *d) => {
                stopped = true;
                break;
            }
        }
    }
    drop(listener);
    if stopped {
        // Stopped: closed to new connections (above), and the open ones dropped where they
        // are (not drained), as a killed process's are.
        conns.shutdown().await;
        return;
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), graceful.shutdown()).await;
    // As before there was a stop: what the drain did not end is left to finish on its own.
    conns.detach_all();
}

async fn gc_loop(inner: Arc<Inner>) {
    let mut sd = inner.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = inner.gc.notified() => gc::run(&mut inner.state()),
            _ = sd.changed() => break,
        }
    }
}

/// Sends each bookmark-asking watch its BOOKMARK when due (see [`next_bookmark`]). Bookmarks
/// are queued for each resource's dispatcher under the state lock, after every event queued
/// before, so one never overtakes an event with a lower resourceVersion.
async fn bookmark_loop(inner: Arc<Inner>) {
    let mut sd = inner.shutdown.subscribe();
    let resolution =
        (inner.bookmark_interval / 10).clamp(Duration::from_millis(5), Duration::from_secs(1));
    let mut tick = tokio::time::interval(resolution);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let st = inner.state();
                for t in st.tables.values() {
                    if t.watchers.watchers().len() > 0 {
                        let line = bookmark_line(&t.def.api_version(), &t.def.kind, st.rv, false);
                        t.watchers.send(Dispatch::Bookmark(line));
                    }
                }
            }
            _ = sd.changed() => break,
        }
    }
}

fn not_found_text() -> Response<Body> {
    text_response(404, "text/plain; charset=utf-8", "404 page not found\n")
}

fn accepts(req: &Request<Incoming>, what: &str) -> bool {
    req.headers()
        .get_all(header::ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|s| s.contains(what)))
}

/// The server's own time for one request of `verb` on `plural`: reads only (the storage's
/// share is [`Storage::serve`]'s).
fn read_latency(inner: &Inner, verb: &str, plural: &str) -> Duration {
    if !matches!(verb, "get" | "list") {
        return Duration::ZERO;
    }
    let per = inner
        .resource_read_latency
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(d) = per.get(plural) {
        return d.sample_now();
    }
    drop(per);
    inner
        .read_latency
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .sample_now()
}

async fn handle(inner: Arc<Inner>, req: Request<Incoming>) -> Response<Body> {
    let lat = inner.latency.load(Ordering::Relaxed);
    if lat != u64::MAX {
        tokio::time::sleep(Duration::from_nanos(lat)).await;
    }
    let path = req.uri().path().trim_end_matches('/').to_string();
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let aggregated = accepts(&req, "as=APIGroupDiscoveryList");
    if req.method() == Method::GET {
        let st_doc = |f: &dyn Fn(&State) -> Option<serde_json::Value>| {
            let v = f(&inner.state());
            match v {
                Some(v) => value_response(200, &v, &[]),
                None => not_found_text(),
            }
        };
        match s.as_slice() {
            ["version"] => return value_response(200, &discovery::version(), &[]),
            ["healthz"] | ["readyz"] | ["livez"] => {
                if *inner.storage_down.borrow() {
                    // As kube-apiserver words it (the reason is withheld from a caller
                    // without `?verbose`).
                    return text_response(
                        500,
                        "text/plain; charset=utf-8",
                        format!(
                            "[-]etcd failed: reason withheld\n{}z check failed\n",
                            s[0].trim_end_matches('z')
                        ),
                    );
                }
                return text_response(200, "text/plain; charset=utf-8", "ok");
            }
            ["metrics"] => {
                let text = metrics_text(&inner.snapshot());
                return text_response(
                    200,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    text,
                );
            }
            ["api"] if aggregated => {
                let v = discovery::aggregated(&inner.state().registry, true);
                let mut r = value_response(200, &v, &[]);
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    discovery::AGGREGATED.parse().expect("header"),
                );
                return r;
            }
            ["apis"] if aggregated => {
                let v = discovery::aggregated(&inner.state().registry, false);
                let mut r = value_response(200, &v, &[]);
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    discovery::AGGREGATED.parse().expect("header"),
                );
                return r;
            }
            ["api"] => {
                return value_response(200, &discovery::api_versions(&inner.addr.to_string()), &[]);
            }
            ["apis"] => return st_doc(&|st| Some(discovery::api_group_list(&st.registry))),
            ["api", v] => {
                let v = v.to_string();
                return st_doc(&|st| discovery::resource_list(&st.registry, "", &v));
            }
            ["apis", g] => {
                let g = g.to_string();
                return st_doc(&|st| discovery::api_group(&st.registry, &g));
            }
            ["apis", g, v] => {
                let (g, v) = (g.to_string(), v.to_string());
                return st_doc(&|st| discovery::resource_list(&st.registry, &g, &v));
            }
            _ => {}
        }
    }
    let (group, version, rest) = match s.as_slice() {
        ["api", v, rest @ ..] if !rest.is_empty() => ("", *v, rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
        _ => return not_found_text(),
    };
    let (ns, plural, name, sub): (Option<&str>, &str, Option<&str>, Option<&str>) = match rest {
        ["namespaces", n, p, tail @ ..] if !matches!(*p, "status" | "finalize") => {
            (Some(*n), *p, tail.first().copied(), tail.get(1).copied())
        }
        [p, tail @ ..] => (None, *p, tail.first().copied(), tail.get(1).copied()),
        [] => return not_found_text(),
    };
    if rest.len() > 5 || (ns.is_none() && rest.len() > 3) {
        return error_response(&ApiError::no_resource());
    }
    let def = {
        let st = inner.state();
        if !st.registry.has_group_version(group, version) {
            return not_found_text();
        }
        st.registry.get(group, version, plural)
    };
    let Some(def) = def else {
        return error_response(&ApiError::no_resource());
    };
    if ns.is_some() && !def.namespaced {
        return error_response(&ApiError::no_resource());
    }
    if def.namespaced && ns.is_none() && name.is_some() {
        return error_response(&ApiError::no_resource());
    }
    let query = Query::parse(req.uri().query());
    let method = req.method().clone();
    let watch = query.flag("watch");
    let verb = match (&method, name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if watch => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => {
            inner.stats().count(method.as_str(), group, plural);
            return error_response(&ApiError::method_not_allowed());
        }
    };
    let resource = match sub {
        Some(sub) => format!("{plural}/{sub}"),
        None => plural.to_string(),
    };
    let user_key = UserRequestKey {
        user: req
            .headers()
            .get("impersonate-user")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
        verb: verb.to_string(),
        group: group.to_string(),
        resource: resource.clone(),
        namespace: ns.map(String::from),
    };
    {
        let mut stats = inner.stats();
        stats.count(verb, group, &resource);
        stats.count_by_user(user_key.clone());
    }
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let meta_only = accepts(&req, "as=PartialObjectMetadata");
    let ua_manager = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|u| u.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_string();
    let manager = query
        .non_empty("fieldManager")
        .map(String::from)
        .unwrap_or(ua_manager);
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error_response(&ApiError::bad_request(format!("reading body: {e}"))),
    };
    let ctx = Ctx {
        def,
        ns: ns.map(String::from),
        name: name.map(String::from),
        sub: sub.map(String::from),
        query,
        body,
        content_type,
        meta_only,
        manager,
    };
    let access = Access::of(verb, ctx.query.get("resourceVersion").unwrap_or(""));
    if access == Access::QuorumRead {
        inner.stats().count_quorum_read(user_key.clone());
    }
    if matches!(access, Access::Write | Access::QuorumRead)
        && let Err(e) = storage_up(&inner, &ctx.query).await
    {
        return error_response(&e);
    }
    inner.storage.serve(access).await;
    let own = read_latency(&inner, verb, ctx.def.plural.as_str());
    if !own.is_zero() {
        tokio::time::sleep(own).await;
    }
    if verb == "watch" {
        return match start_watch(&inner, &ctx, resource) {
            Ok(r) => r,
            Err(e) => error_response(&e),
        };
    }
    let result: Result<Reply, ApiError> = {
        let mut st = inner.state();
        match verb {
            "get" => handlers::get(&st, &ctx),
            "list" => super::list::list(&st, &ctx),
            "create" => handlers::create(&mut st, &ctx),
            "update" => handlers::replace(&mut st, &ctx),
            "patch" => handlers::patch(&mut st, &ctx),
            "delete" => handlers::delete(&mut st, &ctx),
            _ => handlers::delete_collection(&mut st, &ctx),
        }
    };
    if !matches!(verb, "get" | "list") {
        inner.gc.notify_one();
    }
    match result {
        Ok(r) => json_response(r.code, r.body, &r.warnings),
        Err(e) => error_response(&e),
    }
}

/// Waits while the storage is stopped ([`ApiServer::stop_storage`]), up to the request's
/// `timeout` (a Go duration as clients send it: `10s`, `1m`; 60 s without one, as
/// kube-apiserver's `--request-timeout`), and then answers as kube-apiserver does: 504.
async fn storage_up(inner: &Inner, query: &Query) -> Result<(), ApiError> {
    let mut down = inner.storage_down.subscribe();
    if !*down.borrow_and_update() {
        return Ok(());
    }
    let limit = query
        .get("timeout")
        .and_then(go_duration)
        .unwrap_or(REQUEST_TIMEOUT);
    match tokio::time::timeout(limit, down.wait_for(|d| !*d)).await {
        Ok(_) => Ok(()),
        Err(_) => Err(ApiError::new(
            504,
            "Timeout",
            "Timeout: request did not complete within requested timeout - context deadline exceeded",
        )),
    }
}

/// kube-apiserver's `--request-timeout` default.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A Go duration of one unit (`10s`, `500ms`, `1m`), as clients write `?timeout=`.
fn go_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n * 60)),
        _ => None,
    }
}

/// Removes a watcher from its table when its stream ends (client gone, timeout, shutdown).
struct WatchGuard {
    inner: Arc<Inner>,
    table: String,
    id: u64,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let mut st = self.inner.state();
        if let Some(t) = st.tables.get_mut(&self.table) {
            t.watchers.watchers().remove(self.id);
        }
    }
}

fn list_options_invalid(field: &str, message: &str) -> ApiError {
    let c = Cause {
        reason: "FieldValueForbidden".into(),
        field: field.into(),
        message: format!("Forbidden: {message}"),
    };
    ApiError {
        details: Some(
            json!({"kind": "ListOptions", "group": "meta.k8s.io", "causes": [{"reason": c.reason, "message": c.message, "field": c.field}]}),
        ),
        ..ApiError::new(
            422,
            "Invalid",
            format!("ListOptions.meta.k8s.io \"\" is invalid: {field}: Forbidden: {message}"),
        )
    }
}

/// A watch request's options, checked.
struct WatchParams {
    sel: Selectors,
    bookmarks: bool,
    initial: bool,
    timeout: Option<Duration>,
    from_rv: Option<u64>,
}

fn watch_params(ctx: &Ctx) -> Result<WatchParams, ApiError> {
    let sel = Selectors::parse(&ctx.def, &ctx.query)?;
    let q = &ctx.query;
    let bookmarks = q.flag("allowWatchBookmarks");
    let initial = q.flag("sendInitialEvents");
    if initial && q.get("resourceVersionMatch") != Some("NotOlderThan") {
        return Err(list_options_invalid(
            "resourceVersionMatch",
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if initial && !bookmarks {
        return Err(list_options_invalid(
            "allowWatchBookmarks",
            "sendInitialEvents requires setting allowWatchBookmarks to true",
        ));
    }
    let timeout = match q.non_empty("timeoutSeconds") {
        Some(t) => Some(Duration::from_secs(t.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds: {t}"))
        })?)),
        None => None,
    };
    let from_rv: Option<u64> = match q.get("resourceVersion").unwrap_or("") {
        "" | "0" => None,
        r => Some(
            r.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {r}")))?,
        ),
    };
    Ok(WatchParams {
        sel,
        bookmarks,
        initial,
        timeout,
        from_rv,
    })
}

/// The watch's scope (`Cacher.Watch`, cacher.go:533-545): the request's namespace or an exact
/// `metadata.namespace=`, and an exact `metadata.name=`.
fn watch_scope(ctx: &Ctx, raw_field: &str) -> Scope {
    Scope {
        namespace: ctx
            .ns
            .clone()
            .or_else(|| exact_term(raw_field, "metadata.namespace"))
            .unwrap_or_default(),
        name: exact_term(raw_field, "metadata.name").unwrap_or_default(),
    }
}

/// The lines a watch starts with: the objects it matches (as ADDED), or the events it resumes
/// from; `Err` with the ERROR line when its resourceVersion has left the window.
fn watch_start(
    st: &mut State,
    ctx: &Ctx,
    p: &WatchParams,
    w: &Watcher,
) -> Result<Vec<Bytes>, Bytes> {
    let def = &ctx.def;
    let current = st.rv;
    let t = st.table(def);
    let oldest = t.oldest_resumable();
    if let Some(r) = p.from_rv.filter(|r| *r < oldest && !p.initial) {
        let e = ApiError::expired(format!("too old resource version: {r} ({oldest})"));
        return Err(event_line(
            "ERROR",
            &serde_json::to_vec(&e.to_value()).unwrap_or_default(),
        ));
    }
    let mut lines = Vec::new();
    if let Some(r) = p.from_rv.filter(|_| !p.initial) {
        lines.extend(
            t.history
                .iter()
                .filter(|e| e.rv > r)
                .filter_map(|e| e.line_for(w)),
        );
        return Ok(lines);
    }
    let start = match &ctx.ns {
        Some(n) => std::ops::Bound::Included((n.clone(), String::new())),
        None => std::ops::Bound::Unbounded,
    };
    for (k, s) in t.objects.range((start, std::ops::Bound::Unbounded)) {
        if ctx.ns.as_ref().is_some_and(|n| *n != k.0) {
            break;
        }
        if w.matches(&s.view) {
            let json = if w.meta_only {
                Bytes::from(
                    serde_json::to_vec(&super::watch::partial_metadata(s)).unwrap_or_default(),
                )
            } else {
                s.json.clone()
            };
            lines.push(event_line("ADDED", &json));
        }
    }
    if p.initial {
        lines.push(bookmark_line(&def.api_version(), &def.kind, current, true));
    }
    Ok(lines)
}

fn start_watch(
    inner: &Arc<Inner>,
    ctx: &Ctx,
    resource: String,
) -> Result<Response<Body>, ApiError> {
    let p = watch_params(ctx)?;
    let id = inner.next_watch.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let deadline = started + p.timeout.unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let stat = Arc::new(WatchStat {
        id,
        resource,
        namespace: ctx.ns.clone(),
        label_selector: p.sel.raw_label.clone(),
        field_selector: p.sel.raw_field.clone(),
        events: AtomicU64::new(0),
        open: std::sync::atomic::AtomicBool::new(true),
    });
    inner.stats().add_watch(stat.clone());
    let table = ctx.def.table_key();
    let mut st = inner.state();
    let t = st.table(&ctx.def);
    let size = inner
        .chan_size
        .unwrap_or_else(|| chan_size(t.capacity, t.watchers.indexed(), p.sel.node.is_some()))
        .max(1);
    let (input, input_rx) = mpsc::channel(size);
    let (result, result_rx) = mpsc::channel::<Bytes>(size);
    let w = Arc::new(Watcher {
        id,
        namespace: ctx.ns.clone(),
        label: p.sel.label.clone(),
        field: p.sel.field.clone(),
        node: p.sel.node.clone(),
        scope: watch_scope(ctx, &p.sel.raw_field),
        input,
        done: tokio_util::sync::CancellationToken::new(),
        start_rv: st.rv,
        identifier: format!(
            "key: \"{}\", labels: \"{}\", fields: \"{}\"",
            ctx.def.resource_prefix(),
            p.sel.raw_label,
            p.sel.raw_field
        ),
        next_bookmark: std::sync::Mutex::new(
            p.bookmarks
                .then(|| next_bookmark(started, inner.bookmark_interval, deadline))
                .flatten(),
        ),
        deadline,
        meta_only: ctx.meta_only,
        stat: stat.clone(),
    });
    let guard = match watch_start(&mut st, ctx, &p, &w) {
        Err(line) => {
            stat.open.store(false, Ordering::Relaxed);
            let _ = result.try_send(line);
            drop(result);
            None
        }
        Ok(lines) => {
            st.table(&ctx.def).watchers.watchers().add(w.clone());
            tokio::spawn(cache_watcher::process(w, lines, input_rx, result));
            Some(WatchGuard {
                inner: inner.clone(),
                table,
                id,
            })
        }
    };
    drop(st);
    Ok(watch_response(inner, result_rx, deadline, guard))
}

/// The HTTP answer of a watch: what its result buffer holds, until it ends, the watch's
/// deadline, or the server's shutdown.
fn watch_response(
    inner: &Arc<Inner>,
    rx: mpsc::Receiver<Bytes>,
    deadline: Instant,
    guard: Option<WatchGuard>,
) -> Response<Body> {
    let sleep = Box::pin(tokio::time::sleep_until(deadline.into()));
    let sd = inner.shutdown.subscribe();
    let stream = futures::stream::unfold(
        (rx, sleep, sd, guard),
        |(mut rx, mut sleep, mut sd, guard)| async move {
            if *sd.borrow() {
                return None;
            }
            tokio::select! {
                biased;
                m = rx.recv() => m.map(|b| (Ok::<_, Infallible>(Frame::data(b)), (rx, sleep, sd, guard))),
                _ = &mut sleep => None,
                _ = sd.changed() => None,
            }
        },
    );
    let body: Body = BodyExt::boxed_unsync(StreamBody::new(stream.boxed()));
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(body)
        .expect("valid response")
}

#[allow(dead_code)]
fn _assert_send() {
    fn is_send<T: Send>() {}
    is_send::<ApiServer>();
    let _ = json_response;
}
