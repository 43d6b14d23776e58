//! Wiring: watches, caches and triggers around the reconciler.
//!
//! - The watches and caches run whether this replica leads or not ([`Caches`]): a standby
//!   that takes over reconciles from warm caches instead of relisting the cluster.
//! - Revisions are watched by the caches; a generation change (not the subsetter's own status
//!   writes) triggers the leader's kube-runtime `Controller`, which takes its objects from the
//!   cached store. Taking the lead triggers every cached revision once.
//! - ActivationEndpoints are watched once: a compact store (`store.rs`: what a reconcile reads
//!   of each object, strings shared) gives the reconciler the current members, the membership
//!   index is updated from the same events, and each change triggers the owning Revision
//!   (what `.owns()` does, without a second watch).
//! - Activator pods and Nodes are watched; whenever the usable activator set changes, only the
//!   revisions that had a lost (or changed) activator are triggered, and a new activator
//!   triggers only the revisions short of their N.
//! - Host claims are indexed from the Revision watch's events (before the generation filter,
//!   which would hide deletes). A revision created, deleted, or changing its hosts triggers the
//!   older claimants of the hosts concerned; an ActivationEndpoints event triggers the older
//!   claimants of its revision's hosts (whether it can take traffic decides their
//!   `HostConflict`). Uncontested hosts trigger nothing.

use std::future::Future;
use std::sync::Arc;

use crds::Revision;
use futures::FutureExt;
use futures::channel::mpsc::unbounded;
use kube::Client;
use kube::runtime::reflector::ObjectRef;
use tracing::info;

use crate::cluster::caches::Caches;
use crate::cluster::context::Context;
use crate::cluster::error::Result;
use crate::cluster::lead::{LeaderTasks, forced_stop, run_controller};
use crate::cluster::metrics::Metrics;
use crate::cluster::reconciler::Config;
use crate::pure::policy::SubsetPolicy;

/// The subsetter controller: [`Subsetter::run`] alone, or with leader election
/// [`Subsetter::start_caches`] once and [`Subsetter::lead`] each time this replica becomes
/// leader.
pub struct Subsetter {
    client: Client,
    config: Config,
    policy: Arc<dyn SubsetPolicy>,
    metrics: Arc<Metrics>,
}

impl Subsetter {
    pub fn new(client: Client, config: Config, policy: Arc<dyn SubsetPolicy>) -> Self {
        Self {
            client,
            config,
            policy,
            metrics: Arc::new(Metrics::default()),
        }
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// Runs until `stop` resolves: starts the caches, then leads.
    pub async fn run(&self, stop: impl Future<Output = ()> + Send + Sync + 'static) -> Result<()> {
        let caches = self.start_caches();
        let r = self.lead(&caches, stop).await;
        caches.stop();
        r
    }

    /// Starts the watches and caches (ActivationEndpoints, activator pods and nodes,
    /// Revisions). A standby replica keeps them running, so that taking over is a reconcile of
    /// what is cached, not a relist of the cluster (100,000 revisions take seconds to list).
    pub fn start_caches(&self) -> Caches {
        Caches::start(&self.client, &self.config, &self.metrics)
    }

    /// Reconciles as the leader, from `caches`, until `stop` resolves. Every cached revision
    /// is reconciled first (as a new controller's initial list would), then each change. A
    /// stop lets reconciles in flight finish, for at most `Config::shutdown_grace`, and
    /// returns at once when none can be in flight.
    pub async fn lead(
        &self,
        caches: &Caches,
        stop: impl Future<Output = ()> + Send + Sync + 'static,
    ) -> Result<()> {
        let stop = stop.shared();
        let ctx = Arc::new(Context::new(
            self.client.clone(),
            self.config.clone(),
            Arc::clone(&self.policy),
            Arc::clone(&self.metrics),
            caches.shared.clone(),
        ));
        let (trigger_tx, trigger_rx) = unbounded::<ObjectRef<Revision>>();
        caches.triggers.lead(trigger_tx);
        let tasks = LeaderTasks::start(&ctx, caches, &self.config, self.policy.name());
        info!(namespace = ?self.config.namespace, policy = self.policy.name(), "subsetter leading");
        let forced = forced_stop(
            stop.clone(),
            caches.rev_reader.clone(),
            self.config.shutdown_grace,
        );
        let controller = run_controller(caches, trigger_rx, stop, ctx, self.config.concurrency);
        tokio::select! {
            () = controller => {}
            () = forced => {}
        }
        caches.triggers.follow();
        tasks.abort();
        info!("subsetter stopped leading");
        Ok(())
    }
}
