//! The data and admin ports: bound, and served — the data port on the caller's runtime or on
//! serving threads of their own, each with its own hyper adapter and fast lane.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::caches::Caches;
use crate::accept::server;
use crate::cache::api_health::ApiHealth;
use crate::config::ActivatorConfig;
use crate::error::Error;
use crate::fast::FastLane;
use crate::node::pools::Pools;
use crate::ops::admin::Admin;
use crate::ops::metrics::Metrics;
use crate::pipeline::core::Core;
use crate::pipeline::handler::Handler;
use crate::pipeline::suspects::Suspects;
use crate::threads::{placement, serving_threads};
use crate::upstream::proxy::Upstream;

/// The data and admin ports, bound.
pub(super) struct Ports {
    pub data: TcpListener,
    pub admin: TcpListener,
    pub data_addr: SocketAddr,
    pub admin_addr: SocketAddr,
}

impl Ports {
    pub async fn bind(cfg: &ActivatorConfig) -> Result<Self, Error> {
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

/// The node's name as the header value the activator's answers carry.
pub(super) fn node_header(node: &str) -> Result<http::HeaderValue, Error> {
    http::HeaderValue::from_str(node)
        .map_err(|_| Error::Config(format!("node name {node:?} is not a header value")))
}

/// Serves the admin port until `stop`.
pub(super) fn serve_admin(
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
pub(super) struct Serving<'a> {
    pub cfg: &'a ActivatorConfig,
    pub node_header: http::HeaderValue,
    pub caches: &'a Caches,
    pub pools: Pools,
    pub metrics: Arc<Metrics>,
    /// Stops accepting; each handler's `draining` is a child of it.
    pub stop: CancellationToken,
    pub api: ApiHealth,
    pub suspects: Arc<Suspects>,
}

impl Serving<'_> {
    /// One handler per serving thread: each has its own connection pool to pods and peers,
    /// so a request and its upstream connection stay on one thread. Its core is the
    /// thread's fast lane's too.
    fn handler(&self) -> Arc<Handler> {
        let (cfg, caches) = (self.cfg, self.caches);
        let upstream = cfg.upstream();
        let core = Arc::new(Core {
            node: cfg.node_name.clone(),
            revisions: caches.revisions.clone(),
            hosts: caches.hosts.clone(),
            endpoints: caches.endpoints.clone(),
            pools: self.pools.clone(),
            metrics: self.metrics.clone(),
            draining: self.stop.child_token(),
            api: self.api.clone(),
            directory: caches.directory.clone(),
            pod_retries: upstream.connect_retries,
        });
        Arc::new(Handler {
            core,
            node_header: self.node_header.clone(),
            upstream: Upstream::new(&upstream),
            hop: cfg.hop.clone(),
            suspects: self.suspects.clone(),
        })
    }

    /// The fast lane of a serving thread, on its handler's core (off: hyper serves every
    /// request).
    fn fast(&self, h: &Arc<Handler>, stop: &CancellationToken) -> Option<Arc<FastLane>> {
        let cfg = self.cfg;
        cfg.fast_lane.then(|| {
            FastLane::new(
                h.core.clone(),
                cfg.connect_timeout,
                cfg.pool_idle_timeout,
                cfg.body_idle_timeout,
                stop.clone(),
            )
        })
    }

    /// Serves the data port: on the caller's runtime, or on `cfg.io_threads` threads.
    pub fn serve_data(
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
