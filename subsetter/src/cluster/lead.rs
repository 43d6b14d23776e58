//! Leading: the kube-runtime `Controller` over the caches' triggers, with the leader's own
//! tasks beside it (rebalancing, the settings ConfigMap, the route pass, the first pass over
//! everything cached), and a stop that cannot hang on a Revision store never listed.

use std::future::Future;
use std::sync::Arc;

use crds::Revision;
use futures::channel::mpsc::UnboundedReceiver;
use futures::{FutureExt, StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::controller::{Controller, Error as ControllerError};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::cluster::caches::Caches;
use crate::cluster::config::Config;
use crate::cluster::context::Context;
use crate::cluster::rebalancer::rebalance_loop;
use crate::cluster::reconciler;
use crate::cluster::watch::settings::watch_settings;
use crate::pure::key::Key;
use crate::pure::settings::Settings;

/// The tasks that run only while this replica leads, stopped when it stops leading.
pub(crate) struct LeaderTasks {
    rebalance: Option<JoinHandle<()>>,
    settings: Option<JoinHandle<()>>,
    routes: JoinHandle<()>,
    everything: JoinHandle<()>,
}

impl LeaderTasks {
    /// Starts them, from `caches`, with `ctx` (whose policy name and settings are the flags').
    pub(crate) fn start(
        ctx: &Arc<Context>,
        caches: &Caches,
        config: &Config,
        policy: &str,
    ) -> Self {
        let rebalance = (!config.rebalance_interval.is_zero()).then(|| {
            tokio::spawn(rebalance_loop(
                Arc::clone(ctx),
                caches.triggers.clone(),
                config.rebalance_interval,
                config.rebalance,
            ))
        });
        let settings = config.settings_config_map.clone().map(|(name, ns)| {
            let base = Settings {
                policy: policy.to_owned(),
                max_node_selection: config.default_activators,
                write_qps: config.write_qps,
                write_burst: config.write_burst,
                image_locality: config.image_locality,
            };
            let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
            tokio::spawn(watch_settings(api, name, base, Arc::clone(ctx)))
        });
        let routes = tokio::spawn(crate::cluster::routes::run(
            Arc::clone(ctx),
            caches.route_reader.clone(),
            caches.rev_reader.clone(),
            caches.triggers.clone(),
            Arc::clone(&caches.shared.route_wake),
        ));
        Self {
            rebalance,
            settings,
            routes,
            everything: trigger_everything(caches),
        }
    }

    /// Stops them (in the order they stopped before they were one value).
    pub(crate) fn abort(self) {
        self.everything.abort();
        self.routes.abort();
        for t in [self.settings, self.rebalance].into_iter().flatten() {
            t.abort();
        }
    }
}

/// Everything cached, once the Revision store has its first list.
fn trigger_everything(caches: &Caches) -> JoinHandle<()> {
    let reader = caches.rev_reader.clone();
    let tx = caches.triggers.clone();
    tokio::spawn(async move {
        if reader.wait_until_ready().await.is_ok() {
            for r in reader.state() {
                tx.send(ObjectRef::from_obj(&*r));
            }
        }
    })
}

/// The kube-runtime `Controller` until `stop` (and its graceful shutdown) ends it: its work
/// from `triggers` alone and its objects from the cached store, since the Revision watch is
/// the caches' (it runs on a standby too).
pub(crate) async fn run_controller(
    caches: &Caches,
    triggers: UnboundedReceiver<ObjectRef<Revision>>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
    ctx: Arc<Context>,
    concurrency: u16,
) {
    let no_watch = stream::pending::<std::result::Result<Revision, watcher::Error>>();
    let queued = Arc::clone(&caches.triggers.queued);
    Controller::for_stream(no_watch, caches.rev_reader.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .reconcile_on(triggers)
        .graceful_shutdown_on(stop)
        .run(reconciler::reconcile, reconciler::error_policy, ctx)
        .for_each(|res| {
            match res {
                // A trigger for a Revision deleted meanwhile: it never starts.
                Err(ControllerError::ObjectNotFound(r)) => {
                    queued.left(&Key::new(r.namespace.unwrap_or_default(), r.name));
                }
                Err(e) => debug!(error = %e, "controller event"),
                Ok(_) => {}
            }
            std::future::ready(())
        })
        .await;
}

/// Resolves when a stop must no longer wait for the controller's graceful shutdown.
///
/// kube-runtime's graceful shutdown stops reading the Revision watch at once, then waits for
/// the runner to finish — and the runner holds every task until the Revision store has had its
/// first list. A stop that comes before that list has been answered (a slow real API server, a
/// subsetter stopped right after it started) would wait forever, so then nothing can be in
/// flight and the stop is immediate. Otherwise reconciles in flight get `grace` to finish.
pub(crate) async fn forced_stop(
    stop: impl Future<Output = ()>,
    revisions: Store<Revision>,
    grace: std::time::Duration,
) {
    stop.await;
    if revisions.wait_until_ready().now_or_never().is_none() {
        info!("stopped before the first Revision list; nothing in flight");
        return;
    }
    tokio::time::sleep(grace).await;
    warn!(
        ?grace,
        "reconciles still in flight after the shutdown grace; dropping them"
    );
}
