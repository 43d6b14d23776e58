//! The composition root: [`Activator::start`] binds the ports, starts the caches
//! ([`caches`]), the node's pools and pre-pull ([`pools`]) and serves ([`serving`]);
//! [`watch_only::WatchOnly`] starts the same watches for a node with no whole activator (load
//! tests), and [`keep_serving::shutdown_signal`] is what the binary waits for.

mod caches;
mod pools;
mod serving;
pub mod watch_only;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cache::CachedObjects;
use crate::cache::hosts::HostCache;
use crate::config::ActivatorConfig;
use crate::error::Error;
use crate::node::{adopt, warm};
use crate::ops::admin::Admin;
use crate::ops::events::{EventConfig, EventSink};
use crate::ops::metrics::Metrics;
use crate::pipeline::suspects::Suspects;
use caches::{Caches, Counted};
use serving::{Ports, Serving, node_header, serve_admin};

/// A running activator.
pub struct Activator {
    /// This activator's own pod (from the downward API).
    pod_name: String,
    /// The caches, for [`Activator::cached_objects`].
    caches: Counted,
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
        let (client, api) = caches::counted_client(client, &metrics);
        let (caches, member_of) = Caches::start(&cfg, &client, &metrics, &stop_caches);
        let events = EventSink::new(client.clone(), cfg.pod_name.clone(), EventConfig::default());
        let prepull = pools::start_prepull(
            &cfg,
            &client,
            &caches.revisions,
            &events,
            &metrics,
            &stop_caches,
        );
        let pools = pools::pools(
            &cfg,
            client,
            &api,
            &caches.pods,
            &metrics,
            events,
            &stop_caches,
        );
        tokio::spawn(warm::keep_members_warm(
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
            suspects: Arc::new(Suspects::default()),
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
    pub fn cached_objects(&self) -> CachedObjects {
        let (revisions, hosts, endpoints, pods) = &self.caches;
        let (subsets, other_subsets) = endpoints.counts();
        let (pod_count, pod_revisions) = pods.counts();
        CachedObjects {
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
