//! The node-local activator: receives requests for scale-to-zero revisions, creates their pods
//! on its own node when they are asleep, and proxies to the pod IPs.
//!
//! A library with a thin `main`, so tests and the load test run many activators in one
//! process. Start one with [`Activator::start`]; the request path is in [`handler`].

pub mod admin;
pub mod answer;
pub mod cache;
pub mod config;
pub mod error;
pub mod handler;
pub mod metrics;
pub mod pod_spec;
pub mod proxy;
pub mod routing;
pub mod scheduler;
pub mod server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use config::ActivatorConfig;
pub use error::Error;
pub use metrics::Metrics;

use crate::admin::Admin;
use crate::cache::endpoints::EndpointsCache;
use crate::cache::pods::PodCache;
use crate::cache::revisions::RevisionCache;
use crate::handler::Handler;
use crate::proxy::Upstream;
use crate::scheduler::LocalScheduler;

/// A running activator.
pub struct Activator {
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
        let data = bind("data port", cfg.data_addr).await?;
        let admin_l = bind("admin port", cfg.admin_addr).await?;
        let data_addr = data.local_addr().map_err(|source| Error::Bind {
            what: "data port",
            addr: cfg.data_addr,
            source,
        })?;
        let admin_addr = admin_l.local_addr().map_err(|source| Error::Bind {
            what: "admin port",
            addr: cfg.admin_addr,
            source,
        })?;

        let stop = CancellationToken::new();
        let stop_caches = CancellationToken::new();
        let metrics = Arc::new(Metrics::default());
        let revisions =
            RevisionCache::start(client.clone(), cfg.host_routing, stop_caches.child_token());
        let endpoints = EndpointsCache::start(
            client.clone(),
            &cfg.node_name,
            cfg.endpoints_ttl,
            stop_caches.child_token(),
        );
        let pods = PodCache::start(client.clone(), &cfg.node_name, stop_caches.child_token());
        let scheduler = LocalScheduler::new(client, &cfg.node_name, pods.clone(), metrics.clone());
        let handler = Arc::new(Handler {
            node: cfg.node_name.clone(),
            revisions: revisions.clone(),
            endpoints: endpoints.clone(),
            scheduler,
            upstream: Upstream::new(&cfg),
            metrics: metrics.clone(),
            draining: stop.child_token(),
        });
        let admin = Arc::new(Admin {
            ready: Default::default(),
            registry: metrics.registry(),
        });

        let mut tasks = Vec::new();
        let a = admin.clone();
        tasks.push(tokio::spawn(server::serve(
            admin_l,
            stop.child_token(),
            std::time::Duration::from_secs(1),
            move |req| {
                let a = a.clone();
                async move { a.handle(req) }
            },
        )));
        let h = handler.clone();
        tasks.push(tokio::spawn(server::serve(
            data,
            stop.child_token(),
            cfg.drain_timeout,
            move |req| h.clone().handle(req),
        )));
        let a = admin.clone();
        let ready_stop = stop.child_token();
        tasks.push(tokio::spawn(async move {
            tokio::select! {
                _ = ready_stop.cancelled() => {}
                _ = async { tokio::join!(revisions.synced(), endpoints.synced(), pods.synced()) } => {
                    a.ready.store(true, Ordering::Release);
                    tracing::info!("caches synced; ready");
                }
            }
        }));
        tracing::info!(node = %cfg.node_name, %data_addr, %admin_addr, "activator started");
        Ok(Self {
            data_addr,
            admin_addr,
            metrics,
            admin,
            stop,
            stop_caches,
            tasks,
        })
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

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { what, addr, source })
}
