//! The node-local activator: receives requests for scale-to-zero revisions, creates their pods
//! on its own node when they are asleep, and proxies to the pod IPs.
//!
//! A library with a thin `main`, so tests and the load test run many activators in one
//! process. Start one with [`Activator::start`]; the request path is in [`pipeline`].

// The activator's rooms, from the bottom up: the wire (names, framing, connections), the
// upstream pools, the node's pods, the caches of the API, the decision and hyper's adapter,
// the fast lane, accepting connections, and operations.
pub(crate) mod accept;
pub mod cache;
pub mod cli;
pub mod config;
pub mod error;
pub mod fast;
mod locks;
pub mod node;
pub mod ops;
pub mod pipeline;
pub(crate) mod threads;
pub mod upstream;
pub mod wire;

// The rooms' modules by their own names, for the wiring below.
use accept::server;
use cache::api_health;
use node::{adopt, node_addr};
use ops::{api_count, metrics};
use pipeline::suspects;
use threads::{placement, serving_threads};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::net::TcpListener;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use config::ActivatorConfig;
pub use error::Error;
pub use metrics::Metrics;

use crate::cache::endpoints::{EndpointsCache, MemberEvent};
use crate::cache::hosts::HostCache;
use crate::cache::pods::PodCache;
use crate::cache::revisions::RevisionCache;
use crate::fast::FastLane;
use crate::node::pool::Shared;
use crate::node::pools::Pools;
use crate::ops::admin::Admin;
use crate::pipeline::handler::Handler;
use crate::upstream::proxy::Upstream;

/// A running activator.
pub struct Activator {
    /// This activator's own pod (from the downward API).
    pod_name: String,
    /// The caches, for [`Activator::cached_objects`].
    caches: (RevisionCache, Option<HostCache>, EndpointsCache, PodCache),
    data_addr: SocketAddr,
    admin_addr: SocketAddr,
    metrics: Arc<Metrics>,
    admin: Arc<Admin>,
    /// Stops accepting and starts draining.
    stop: CancellationToken,
    /// Stops the watches, once draining is over: requests still in flight need them.
    stop_caches: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Activator {
    /// Binds the data and admin ports, starts the caches and serves. Ready (`/readyz`) once
    /// the caches have their first full lists.
    pub async fn start(cfg: ActivatorConfig, client: kube::Client) -> Result<Self, Error> {
        let ports = Ports::bind(&cfg).await?;
        let stop = CancellationToken::new();
        let stop_caches = CancellationToken::new();
        let metrics = Arc::new(Metrics::default());
        let (client, api) = counted_client(client, &metrics);
        let (caches, member_of) = Caches::start(&cfg, &client, &metrics, &stop_caches);
        let events = crate::ops::events::EventSink::new(
            client.clone(),
            cfg.pod_name.clone(),
            crate::ops::events::EventConfig::default(),
        );
        let prepull = start_prepull(
            &cfg,
            &client,
            &caches.revisions,
            &events,
            &metrics,
            &stop_caches,
        );
        let pools = pools(
            &cfg,
            client,
            &api,
            &caches.pods,
            &metrics,
            events,
            &stop_caches,
        );
        tokio::spawn(node::warm::keep_members_warm(
            member_of,
            pools.clone(),
            caches.revisions.clone(),
            prepull,
            cfg.read_ahead,
            metrics.read_ahead_queued.clone(),
            stop_caches.child_token(),
        ));
        let serving = Serving {
            cfg: &cfg,
            node_header: node_header(&cfg.node_name)?,
            caches: &caches,
            pools: pools.clone(),
            metrics: metrics.clone(),
            stop: stop.clone(),
            api,
            suspects: Arc::new(suspects::Suspects::default()),
        };
        let admin = Arc::new(Admin {
            ready: Default::default(),
            registry: metrics.registry(),
        });

        let mut tasks = vec![serve_admin(ports.admin, admin.clone(), &stop)];
        tasks.extend(serving.serve_data(ports.data, ports.data_addr)?);
        tasks.push(tokio::spawn(adopt::ready_then_adopt(
            admin.clone(),
            cfg.node_name.clone(),
            caches.pods.clone(),
            caches.endpoints.clone(),
            caches.revisions.clone(),
            pools,
            stop.child_token(),
        )));
        let (data_addr, admin_addr) = (ports.data_addr, ports.admin_addr);
        tracing::info!(node = %cfg.node_name, %data_addr, %admin_addr, "activator started");
        Ok(Self {
            caches: caches.counted(),
            pod_name: cfg.pod_name.clone(),
            data_addr,
            admin_addr,
            metrics,
            admin,
            stop,
            stop_caches,
            tasks,
        })
    }

    /// How many objects the caches hold now.
    pub fn cached_objects(&self) -> cache::CachedObjects {
        let (revisions, hosts, endpoints, pods) = &self.caches;
        let (subsets, other_subsets) = endpoints.counts();
        let (pod_count, pod_revisions) = pods.counts();
        cache::CachedObjects {
            subsets,
            other_subsets,
            revisions: revisions.len(),
            hosts: hosts.as_ref().map_or(0, HostCache::len),
            pods: pod_count,
            pod_revisions,
        }
    }

    pub fn pod_name(&self) -> &str {
        &self.pod_name
    }

    pub fn data_addr(&self) -> SocketAddr {
        self.data_addr
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Fails `/readyz` from now on, serving on (the first step of a shutdown).
    pub fn set_not_ready(&self) {
        self.admin.ready.store(false, Ordering::Release);
    }

    /// Whether the caches have synced (what `/readyz` answers).
    pub fn is_ready(&self) -> bool {
        self.admin.ready.load(Ordering::Acquire)
    }

    /// Stops accepting, marks not ready, forwards requests still waiting for a pod to peer
    /// members, lets in-flight requests finish, then returns.
    pub async fn shutdown(mut self) {
        self.admin.ready.store(false, Ordering::Release);
        self.stop.cancel();
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
        self.stop_caches.cancel();
    }
}

impl Drop for Activator {
    /// An activator dropped without [`Activator::shutdown`] stops at once (no draining).
    fn drop(&mut self) {
        self.stop.cancel();
        self.stop_caches.cancel();
    }
}

/// The data and admin ports, bound.
struct Ports {
    data: TcpListener,
    admin: TcpListener,
    data_addr: SocketAddr,
    admin_addr: SocketAddr,
}

impl Ports {
    async fn bind(cfg: &ActivatorConfig) -> Result<Self, Error> {
        let data = bind_shared("data port", cfg.data_addr, cfg.io_threads > 1)?;
        let admin = bind("admin port", cfg.admin_addr).await?;
        let data_addr = data.local_addr().map_err(|source| Error::Bind {
            what: "data port",
            addr: cfg.data_addr,
            source,
        })?;
        let admin_addr = admin.local_addr().map_err(|source| Error::Bind {
            what: "admin port",
            addr: cfg.admin_addr,
            source,
        })?;
        Ok(Self {
            data,
            admin,
            data_addr,
            admin_addr,
        })
    }
}

/// The kube client with its requests counted, and whether the API server answers.
fn counted_client(
    client: kube::Client,
    metrics: &Metrics,
) -> (kube::Client, api_health::ApiHealth) {
    let heard = api_health::Heard::default();
    let client = api_count::counted(client, metrics.api_requests.clone(), heard.clone());
    // Calls on the request path give up as soon as the API server is found not to answer.
    let api = api_health::ApiHealth::new(client.clone(), heard);
    (client, api)
}

/// What the activator knows of the API.
struct Caches {
    revisions: RevisionCache,
    hosts: Option<HostCache>,
    endpoints: EndpointsCache,
    pods: PodCache,
    directory: Option<cache::directory::Directory>,
}

impl Caches {
    /// Starts the watches (stopped by `stop`); the receiver tells of this node's memberships.
    fn start(
        cfg: &ActivatorConfig,
        client: &kube::Client,
        metrics: &Arc<Metrics>,
        stop: &CancellationToken,
    ) -> (Self, UnboundedReceiver<MemberEvent>) {
        let revisions = RevisionCache::new(client.clone());
        // Off, no Host lookup is ever made (requests must name their revision by headers).
        let hosts = cfg.host_routing.then(|| {
            HostCache::new(
                client.clone(),
                cfg.host_ttl,
                cfg.host_miss_ttl,
                metrics.clone(),
            )
        });
        let (member_of_tx, member_of) = tokio::sync::mpsc::unbounded_channel();
        let directory =
            cache::directory::Directory::start(&cfg.directory, client.clone(), stop.child_token());
        let endpoints = EndpointsCache::start(
            client.clone(),
            &cfg.node_name,
            cfg.endpoints_ttl,
            stop.child_token(),
            member_of_tx,
            directory.clone().filter(|_| cfg.members_from_directory),
        );
        let pods = PodCache::start(client.clone(), &cfg.node_name, stop.child_token());
        let caches = Self {
            revisions,
            hosts,
            endpoints,
            pods,
            directory,
        };
        (caches, member_of)
    }

    /// The caches [`Activator::cached_objects`] counts.
    fn counted(&self) -> (RevisionCache, Option<HostCache>, EndpointsCache, PodCache) {
        (
            self.revisions.clone(),
            self.hosts.clone(),
            self.endpoints.clone(),
            self.pods.clone(),
        )
    }
}

/// The pre-pull of member revisions' images, with a node agent to pull through (on this,
/// the control runtime: never a serving thread).
fn start_prepull(
    cfg: &ActivatorConfig,
    client: &kube::Client,
    revisions: &RevisionCache,
    events: &crate::ops::events::EventSink,
    metrics: &Arc<Metrics>,
    stop_caches: &CancellationToken,
) -> Option<node::prepull::Prepull> {
    let socket = cfg.node_agent.as_ref()?;
    if !node::prepull::enabled(cfg.prepull, Some(socket)) {
        return None;
    }
    Some(node::prepull::Prepull::start(
        node::prepull::PrepullDeps {
            agent_socket: socket.clone(),
            node: cfg.node_name.clone(),
            cfg: cfg.prepull(),
            client: client.clone(),
            revisions: revisions.clone(),
            events: events.clone(),
            metrics: metrics.clone(),
        },
        stop_caches.child_token(),
    ))
}

/// The pools of this node's revisions (their scalers stop with `stop_caches`).
fn pools(
    cfg: &ActivatorConfig,
    client: kube::Client,
    api: &api_health::ApiHealth,
    pods: &PodCache,
    metrics: &Arc<Metrics>,
    events: crate::ops::events::EventSink,
    stop_caches: &CancellationToken,
) -> Pools {
    Pools::new(Shared {
        client,
        api: api.clone(),
        events,
        node: cfg.node_name.clone(),
        pods: pods.clone(),
        metrics: metrics.clone(),
        cfg: cfg.pool.clone(),
        queued_total: Default::default(),
        stop: stop_caches.child_token(),
        epoch: tokio::time::Instant::now(),
        full: Default::default(),
        node_addresses: cfg
            .node_agent
            .as_ref()
            .map(|path| node_addr::NodeAddresses::new(path, metrics.clone())),
    })
}

/// The node's name as the header value the activator's answers carry.
fn node_header(node: &str) -> Result<http::HeaderValue, Error> {
    http::HeaderValue::from_str(node)
        .map_err(|_| Error::Config(format!("node name {node:?} is not a header value")))
}

/// Serves the admin port until `stop`.
fn serve_admin(
    listener: TcpListener,
    admin: Arc<Admin>,
    stop: &CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(server::serve(
        listener,
        stop.child_token(),
        std::time::Duration::from_secs(1),
        move |req| {
            let a = admin.clone();
            async move { a.handle(req) }
        },
    ))
}

/// What the data port's serving threads are made of.
struct Serving<'a> {
    cfg: &'a ActivatorConfig,
    node_header: http::HeaderValue,
    caches: &'a Caches,
    pools: Pools,
    metrics: Arc<Metrics>,
    /// Stops accepting; each handler's `draining` is a child of it.
    stop: CancellationToken,
    api: api_health::ApiHealth,
    suspects: Arc<suspects::Suspects>,
}

impl Serving<'_> {
    /// One handler per serving thread: each has its own connection pool to pods and peers,
    /// so a request and its upstream connection stay on one thread.
    fn handler(&self) -> Arc<Handler> {
        let (cfg, caches) = (self.cfg, self.caches);
        Arc::new(Handler {
            node: cfg.node_name.clone(),
            node_header: self.node_header.clone(),
            revisions: caches.revisions.clone(),
            hosts: caches.hosts.clone(),
            endpoints: caches.endpoints.clone(),
            pools: self.pools.clone(),
            upstream: Upstream::new(&cfg.upstream()),
            metrics: self.metrics.clone(),
            draining: self.stop.child_token(),
            hop: cfg.hop.clone(),
            api: self.api.clone(),
            directory: caches.directory.clone(),
            suspects: self.suspects.clone(),
        })
    }

    /// The fast lane of a serving thread (off: hyper serves every request).
    fn fast(&self, h: &Arc<Handler>, stop: &CancellationToken) -> Option<Arc<FastLane>> {
        let cfg = self.cfg;
        cfg.fast_lane.then(|| {
            FastLane::new(
                h.clone(),
                cfg.connect_timeout,
                cfg.pool_idle_timeout,
                cfg.body_idle_timeout,
                stop.clone(),
            )
        })
    }

    /// Serves the data port: on the caller's runtime, or on `cfg.io_threads` threads.
    fn serve_data(
        &self,
        data: TcpListener,
        data_addr: SocketAddr,
    ) -> Result<Vec<JoinHandle<()>>, Error> {
        let cfg = self.cfg;
        if cfg.io_threads > 1 {
            return serve_on_threads(
                cfg,
                data,
                data_addr,
                &self.metrics,
                &|| self.handler(),
                &|h, stop| self.fast(h, stop),
                &self.stop,
            );
        }
        let h = self.handler();
        let stop = self.stop.child_token();
        let fast = self.fast(&h, &stop);
        Ok(vec![tokio::spawn(server::serve_with(
            data,
            stop,
            cfg.drain_timeout,
            cfg.body_idle_timeout,
            move |req| h.clone().handle(req),
            fast,
            None,
        ))])
    }
}

/// Binds `addr`; with `shared`, with SO_REUSEPORT so several serving threads can each have
/// a listener on the same port.
fn bind_shared(what: &'static str, addr: SocketAddr, shared: bool) -> Result<TcpListener, Error> {
    let err = |source| Error::Bind { what, addr, source };
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(err)?;
    socket.set_reuseaddr(true).map_err(err)?;
    if shared {
        socket.set_reuseport(true).map_err(err)?;
    }
    socket.bind(addr).map_err(err)?;
    socket.listen(4096).map_err(err)
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { what, addr, source })
}

/// The fast lane of a serving thread, made from its handler (None: the fast lane is off).
type MakeFast<'a> = dyn Fn(&Arc<Handler>, &CancellationToken) -> Option<Arc<FastLane>> + 'a;

/// Serves the data port on `cfg.io_threads` threads; returns a task per thread that ends
/// with it.
fn serve_on_threads(
    cfg: &ActivatorConfig,
    data: TcpListener,
    data_addr: SocketAddr,
    metrics: &Arc<Metrics>,
    make_handler: &dyn Fn() -> Arc<Handler>,
    make_fast: &MakeFast<'_>,
    stop: &CancellationToken,
) -> Result<Vec<JoinHandle<()>>, Error> {
    let mut tasks = Vec::new();
    // Thread per core, as nginx runs a worker per core: each thread runs its own
    // single-threaded runtime with its own listener on the port (SO_REUSEPORT, so the
    // kernel spreads connections), and a connection, its request and the upstream
    // connection never change threads. The caches and the kube client stay on the
    // caller's runtime.
    let mut listeners = vec![data.into_std().map_err(|source| Error::Bind {
        what: "data port",
        addr: data_addr,
        source,
    })?];
    for _ in 1..cfg.io_threads {
        let l = bind_shared("data port", data_addr, true)?;
        listeners.push(l.into_std().map_err(|source| Error::Bind {
            what: "data port",
            addr: data_addr,
            source,
        })?);
    }
    let placement = placement::Placement::with_thresholds(
        cfg.io_threads,
        cfg.conns_per_thread,
        (cfg.thread_hot * 1000.0).round() as u32,
        (cfg.thread_cool * 1000.0).round() as u32,
    );
    let threaded = serving_threads::Threaded::all(&placement, metrics);
    for ((i, listener), threaded) in listeners.into_iter().enumerate().zip(threaded) {
        let (h, stop, drain) = (make_handler(), stop.child_token(), cfg.drain_timeout);
        let write_stall = cfg.body_idle_timeout;
        let fast = make_fast(&h, &stop);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("activator-io-{i}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "starting a serving thread");
                        return;
                    }
                };
                rt.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(l) => {
                            server::serve_with(
                                l,
                                stop,
                                drain,
                                write_stall,
                                move |req| h.clone().handle(req),
                                fast,
                                Some(threaded),
                            )
                            .await
                        }
                        Err(e) => tracing::error!(error = %e, "serving thread listener"),
                    }
                });
                drop(done_tx);
            })
            .map_err(|e| Error::Config(format!("starting serving thread {i}: {e}")))?;
        tasks.push(tokio::spawn(async move {
            let _ = done_rx.await;
        }));
    }
    Ok(tasks)
}
