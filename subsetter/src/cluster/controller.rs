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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};

use crds::backoff::resilient;
use crds::directory::DirectoryAnswer;
use crds::{ActivationEndpoints, Revision, Route};
use futures::channel::mpsc::{UnboundedSender, unbounded};
use futures::{FutureExt, StreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Controller, Error as ControllerError};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::error::Result;
use crate::hosts::HostIndex;
use crate::index::{Key, MembershipIndex};
use crate::locks::{lock, read, write};
use crate::metrics::Metrics;
use crate::namespaces::{self, Selected};
use crate::policy::SubsetPolicy;
use crate::queue::Queued;
use crate::rebalance;
use crate::reconciler::{self, Config, Context};
use crate::settings::{self, Settings};
use crate::shared::SharedCaches;
use crate::store::AeStore;
use crate::usable_activators::{ActivatorSources, watch_activators};

/// The subsetter controller: [`Subsetter::run`] alone, or with leader election
/// [`Subsetter::start_caches`] once and [`Subsetter::lead`] each time this replica becomes
/// leader.
pub struct Subsetter {
    client: Client,
    config: Config,
    policy: Arc<dyn SubsetPolicy>,
    metrics: Arc<Metrics>,
}

#[derive(Default, Clone, Copy)]
pub(crate) struct Synced {
    pub(crate) endpoints: bool,
    pub(crate) pods: bool,
    pub(crate) nodes: bool,
    pub(crate) namespaces: bool,
    pub(crate) routes: bool,
    pub(crate) app_pods: bool,
}

impl Synced {
    fn all(self) -> bool {
        self.endpoints && self.pods && self.nodes && self.namespaces && self.routes && self.app_pods
    }
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
        let client = self.client.clone();
        let (revisions, endpoints): (Api<Revision>, Api<ActivationEndpoints>) =
            match &self.config.namespace {
                Some(ns) => (
                    Api::namespaced(client.clone(), ns),
                    Api::namespaced(client.clone(), ns),
                ),
                None => (Api::all(client.clone()), Api::all(client.clone())),
            };
        let pods: Api<Pod> = match &self.config.activator_namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let nodes: Api<Node> = Api::all(client.clone());

        let (synced_tx, synced_rx) = watch::channel(false);
        let synced = Arc::new(watch::Sender::new(Synced {
            namespaces: self.config.namespace_selector.is_none(),
            ..Synced::default()
        }));
        let mut tasks = Vec::new();
        {
            // Fold the three flags into the one the reconciler waits on.
            let mut rx = synced.subscribe();
            tasks.push(tokio::spawn(async move {
                if rx.wait_for(|s| s.all()).await.is_ok() {
                    let _ = synced_tx.send(true);
                }
                // Keep the sender alive (reconcilers treat a dropped sender as shutdown).
                synced_tx.closed().await;
            }));
        }
        let selected = Selected::new(self.config.namespace_selector.as_deref());
        let triggers = Triggers::new(
            Arc::new(Queued::new(self.metrics.reconciles_queued.clone())),
            selected.clone(),
        );
        let shared = SharedCaches::new(
            synced_rx,
            Arc::clone(&triggers.queued),
            self.config.outage_hold,
        );
        let claims = HostClaims::new(Arc::clone(&shared.hosts), triggers.clone());

        tasks.push(tokio::spawn(watch_endpoints(
            endpoints,
            Arc::clone(&shared.ae_store),
            Arc::clone(&shared.index),
            claims.clone(),
            Arc::clone(&synced),
            triggers.clone(),
            Arc::clone(&self.metrics),
        )));
        tasks.push(tokio::spawn(watch_activators(
            ActivatorSources {
                pods,
                nodes,
                aftermath: shared.aftermath.clone(),
                available_count: Arc::clone(&shared.available_count),
                replacement_hold: self.config.replacement_hold,
            },
            Arc::clone(&shared.index),
            Arc::clone(&shared.activators),
            Arc::clone(&synced),
            triggers.clone(),
            Arc::clone(&self.metrics),
        )));
        // An etcd outage leaves the watches open: only `/readyz` tells it (`control_plane.rs`).
        tasks.push(tokio::spawn(crate::control_plane::probe(
            client.clone(),
            shared.aftermath.clone(),
            self.metrics.readyz_failures.clone(),
        )));
        // App pods (hand-overs and Route steps wait on their readiness) and Routes.
        let app_pods: Api<Pod> = match &self.config.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        tasks.push(tokio::spawn(crate::app_pods::watch_app_pods(
            app_pods,
            Arc::clone(&shared.ready_pods),
            triggers.clone(),
            Arc::clone(&shared.route_wake),
            Arc::clone(&synced),
        )));
        let routes_api: Api<Route> = match &self.config.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let (route_reader, route_writer) = reflector::store::<Route>();
        tasks.push(tokio::spawn(crate::routes::watch_routes(
            routes_api,
            route_writer,
            Arc::clone(&shared.routes),
            triggers.clone(),
            Arc::clone(&shared.route_wake),
            Arc::clone(&synced),
        )));
        let (rev_reader, rev_writer) = reflector::store::<Revision>();
        if let Some(selector) = self.config.namespace_selector.clone() {
            let (synced, reader, tx) = (Arc::clone(&synced), rev_reader.clone(), triggers.clone());
            tasks.push(tokio::spawn(namespaces::watch_namespaces(
                Api::all(client),
                selector,
                selected,
                move || synced.send_modify(|s| s.namespaces = true),
                // A namespace that becomes selected: its Revisions, from the cache.
                move |added: Vec<String>| {
                    for r in reader.state() {
                        if added.iter().any(|ns| r.namespace().as_deref() == Some(ns)) {
                            tx.send(ObjectRef::from_obj(&*r));
                        }
                    }
                },
            )));
        }
        tasks.push(tokio::spawn(watch_revisions(
            revisions,
            rev_writer,
            claims,
            triggers.clone(),
            Arc::clone(&shared.written_statuses),
        )));
        Caches {
            shared,
            rev_reader,
            route_reader,
            triggers,
            tasks,
            all_namespaces: self.config.namespace.is_none(),
        }
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
        let rebalance_task = (!self.config.rebalance_interval.is_zero()).then(|| {
            tokio::spawn(rebalance_loop(
                Arc::clone(&ctx),
                caches.triggers.clone(),
                self.config.rebalance_interval,
                self.config.rebalance,
            ))
        });
        let settings_task = self.config.settings_config_map.clone().map(|(name, ns)| {
            let base = Settings {
                policy: self.policy.name().to_owned(),
                max_node_selection: self.config.default_activators,
                write_qps: self.config.write_qps,
                write_burst: self.config.write_burst,
                image_locality: self.config.image_locality,
            };
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &ns);
            tokio::spawn(watch_settings(api, name, base, Arc::clone(&ctx)))
        });
        let routes_task = tokio::spawn(crate::routes::run(
            Arc::clone(&ctx),
            caches.route_reader.clone(),
            caches.rev_reader.clone(),
            caches.triggers.clone(),
            Arc::clone(&caches.shared.route_wake),
        ));
        // Everything cached, once the Revision store has its first list.
        let everything = {
            let reader = caches.rev_reader.clone();
            let tx = caches.triggers.clone();
            tokio::spawn(async move {
                if reader.wait_until_ready().await.is_ok() {
                    for r in reader.state() {
                        tx.send(ObjectRef::from_obj(&*r));
                    }
                }
            })
        };
        info!(namespace = ?self.config.namespace, policy = self.policy.name(), "subsetter leading");
        let forced = forced_stop(
            stop.clone(),
            caches.rev_reader.clone(),
            self.config.shutdown_grace,
        );
        // The Revision watch is the caches' (it runs on a standby too): the controller takes
        // its work from the triggers alone, and its objects from the cached store.
        let no_watch = stream::pending::<std::result::Result<Revision, watcher::Error>>();
        let queued = Arc::clone(&caches.triggers.queued);
        let controller = Controller::for_stream(no_watch, caches.rev_reader.clone())
            .with_config(
                kube::runtime::controller::Config::default().concurrency(self.config.concurrency),
            )
            .reconcile_on(trigger_rx)
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
            });
        tokio::select! {
            () = controller => {}
            () = forced => {}
        }
        caches.triggers.follow();
        everything.abort();
        routes_task.abort();
        for t in [settings_task, rebalance_task].into_iter().flatten() {
            t.abort();
        }
        info!("subsetter stopped leading");
        Ok(())
    }
}

/// The watches and caches a replica keeps whether it leads or not (see
/// [`Subsetter::start_caches`]).
pub struct Caches {
    /// What the reconciler reads too.
    shared: SharedCaches,
    rev_reader: Store<Revision>,
    route_reader: Store<Route>,
    triggers: Triggers,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Whether the ActivationEndpoints watch covers every namespace (the members answer).
    all_namespaces: bool,
}

impl Caches {
    /// Whether every cache has had its first list.
    pub fn is_synced(&self) -> bool {
        *self.shared.synced.borrow() && self.rev_reader.wait_until_ready().now_or_never().is_some()
    }

    /// Waits until every cache has had its first list.
    pub async fn wait_synced(&self) {
        let mut synced = self.shared.synced.clone();
        let _ = synced.wait_for(|s| *s).await;
        let _ = self.rev_reader.wait_until_ready().await;
    }

    /// Waits until at least `n` activators are usable as this replica's caches show them
    /// (Ready pods on Ready nodes): what a harness that just started `n` must wait for before
    /// it creates revisions, or the first ones are planned with the few seen so far.
    pub async fn wait_for_activators(&self, n: usize) {
        let mut count = self.shared.available_count.subscribe();
        let _ = count.wait_for(|c| *c >= n).await;
    }

    /// What the directory answers (`crds::directory`): from this replica's caches, which a
    /// watch that fails keeps, so a lookup is answered through an API server outage. None
    /// for a host no revision claims, or a revision not cached.
    pub fn directory(&self, q: &crds::directory::DirectoryQuery) -> Option<DirectoryAnswer> {
        use crds::directory::DirectoryQuery;
        let key = match q {
            // What readers of the labels would find: a Route's largest share, else the newest
            // claimant whose object carries the label (not one whose hand-over still waits).
            DirectoryQuery::Host(h) => self.host_winner(h)?,
            DirectoryQuery::Revision { namespace, name } => Key::new(namespace, name),
        };
        let revision = self
            .rev_reader
            .get(&ObjectRef::new(&key.name).within(&key.namespace))?;
        let endpoints = read(&self.shared.ae_store).current(&key);
        Some(DirectoryAnswer {
            revision: (*revision).clone(),
            endpoints,
        })
    }

    /// The revision the directory answers for `host`: of a Route's host, the revision with the
    /// largest share (the directory answers one revision); else the newest claimant whose
    /// ActivationEndpoints carries the host label.
    fn host_winner(&self, host: &str) -> Option<Key> {
        let h = crds::contract::normalize_host(host);
        let label = crate::hosts::label_of_normalized(&h);
        let claimants = lock(&self.shared.hosts).claimants(&h);
        if let Some(k) = lock(&self.shared.routes).largest_share(&h) {
            return Some(k);
        }
        let store = read(&self.shared.ae_store);
        claimants.into_iter().find(|k| store.has_label(k, &label))
    }

    /// The subsets carrying `node`'s member label and a version to watch them from
    /// (`crds::directory::MembersAnswer`), as this replica's ActivationEndpoints watch shows
    /// them. Err with the reason when this replica cannot answer for the whole cluster: it
    /// watches one namespace, or has no version yet.
    pub fn members(
        &self,
        node: &str,
    ) -> std::result::Result<crds::directory::MembersAnswer, &'static str> {
        if !self.all_namespaces {
            return Err("this replica watches one namespace, not every subset");
        }
        let label = crds::contract::member_label(node);
        let m = read(&self.shared.ae_store)
            .members(&label)
            .ok_or("no numeric resourceVersion seen yet")?;
        Ok(crds::directory::MembersAnswer {
            resource_version: m.resource_version,
            items: m.items,
        })
    }

    /// Stops the watches.
    pub fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Drop for Caches {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where the caches send the revisions a change concerns: to the leading controller, or
/// nowhere while this replica is a standby (taking the lead reconciles everything anyway).
/// What is sent is counted as queued until its reconcile starts (`queue.rs`).
#[derive(Clone)]
pub(crate) struct Triggers {
    tx: Arc<Mutex<Option<UnboundedSender<ObjectRef<Revision>>>>>,
    queued: Arc<Queued>,
    /// Revisions outside it are left to another subsetter (`namespaces.rs`).
    selected: Selected,
}

impl Triggers {
    fn new(queued: Arc<Queued>, selected: Selected) -> Self {
        Self {
            tx: Arc::default(),
            queued,
            selected,
        }
    }

    pub(crate) fn send(&self, r: ObjectRef<Revision>) {
        if !self
            .selected
            .allows(r.namespace.as_deref().unwrap_or_default())
        {
            return;
        }
        if let Some(tx) = &*lock(&self.tx) {
            // Counted before it is sent: the reconcile that takes it out may start at once.
            let key = Key::new(r.namespace.clone().unwrap_or_default(), r.name.clone());
            self.queued.entered(key.clone());
            if tx.unbounded_send(r).is_err() {
                self.queued.left(&key);
            }
        }
    }

    fn lead(&self, tx: UnboundedSender<ObjectRef<Revision>>) {
        *lock(&self.tx) = Some(tx);
    }

    /// The controller stopped: its queue is gone with it.
    fn follow(&self) {
        let mut tx = lock(&self.tx);
        *tx = None;
        self.queued.clear();
    }
}

/// The Revision watch: keeps the store, the host claims, and triggers a reconcile when a
/// revision's generation changes (the subsetter's own status writes do not).
async fn watch_revisions(
    api: Api<Revision>,
    writer: reflector::store::Writer<Revision>,
    mut claims: HostClaims,
    triggers: Triggers,
    written: Arc<Mutex<crate::written_status::WrittenStatuses>>,
) {
    let mut generations: HashMap<ObjectRef<Revision>, Option<i64>> = HashMap::new();
    let mut events = std::pin::pin!(
        // Every watch here: bounded back-off, and a 410 re-lists at once (crds::backoff), so
        // the subsetter is back within a second or so of the API server's return.
        resilient(watcher::watcher(api, watcher::Config::default()))
            // Nothing reads these, and at 100,000 revisions they would be most of the store:
            // managedFields, and kubectl's copy of the whole object it applied.
            .modify(crds::unread::drop_unread_metadata::<Revision>)
            .reflect(writer)
    );
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                warn!(error = %e, "Revision watch");
                continue;
            }
        };
        claims.observe(&event);
        match event {
            Event::Apply(r) | Event::InitApply(r) => {
                let rk = Key::new(r.namespace().unwrap_or_default(), r.name_any());
                lock(&written).seen(&rk, r.metadata.resource_version.as_deref());
                let key = ObjectRef::from_obj(&r);
                let generation = r.metadata.generation;
                if generations.insert(key.clone(), generation) != Some(generation) {
                    triggers.send(key);
                }
            }
            Event::Delete(r) => {
                lock(&written).forget(&Key::new(r.namespace().unwrap_or_default(), r.name_any()));
                generations.remove(&ObjectRef::from_obj(&r));
            }
            Event::Init | Event::InitDone => {}
        }
    }
}

/// Every `every`, moves at most `limits.max_moves` members from the most to the least loaded
/// activators while the load is uneven (`rebalance.rs`): each move is a reconcile of one
/// revision with that member left out, so the policy picks the replacement and the write
/// goes through the write limit like any other.
async fn rebalance_loop(
    ctx: Arc<Context>,
    triggers: Triggers,
    every: std::time::Duration,
    limits: rebalance::Limits,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once; the caches are not even synced then.
    tick.tick().await;
    loop {
        tick.tick().await;
        if !*ctx.caches.synced.borrow() {
            continue;
        }
        // Not while an outage's aftermath lasts: each move is a cold start on the new
        // member, and the kubelets may not see a new pod for a minute after an outage.
        if ctx.caches.aftermath.ends().is_some() {
            info!("no rebalancing: a control-plane outage's aftermath lasts until its hold ends");
            continue;
        }
        let moves = {
            let ix = lock(&ctx.caches.index);
            let loads: BTreeMap<String, usize> = ix
                .loads()
                .nodes()
                .iter()
                .map(|n| (n.to_string(), ix.load(n)))
                .collect();
            rebalance::moves(&loads, |n| ix.revisions_on(n), limits)
        };
        let mut evictions = lock(&ctx.evictions);
        // Moves not made since the last interval (a revision deleted meanwhile) are dropped.
        evictions.clear();
        if moves.is_empty() {
            continue;
        }
        info!(moves = moves.len(), "rebalancing");
        for (key, node) in moves {
            // Recorded before the trigger: the reconcile it starts must find it.
            let target = ObjectRef::new(&key.name).within(&key.namespace);
            evictions.insert(key, node);
            triggers.send(target);
        }
    }
}

/// Keeps the settings in force in step with the ConfigMap `name`: its keys over `base` (the
/// flags) while it exists and parses, `base` once it is gone. A ConfigMap that does not parse
/// is refused whole, with its reasons logged, and the settings in force stay.
async fn watch_settings(api: Api<ConfigMap>, name: String, base: Settings, ctx: Arc<Context>) {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(resilient(watcher::watcher(api, cfg)));
    let mut listed = false;
    while let Some(ev) = events.next().await {
        let cm = match ev {
            Ok(Event::Init) => {
                listed = false;
                continue;
            }
            Ok(Event::InitDone) => {
                if !listed {
                    ctx.apply(&base);
                    ctx.metrics.settings_reverted.inc();
                }
                continue;
            }
            Ok(Event::Delete(_)) => {
                info!(configmap = %name, "settings ConfigMap deleted; the flags are in force");
                ctx.apply(&base);
                ctx.metrics.settings_reverted.inc();
                continue;
            }
            Ok(Event::Apply(cm) | Event::InitApply(cm)) => cm,
            Err(e) => {
                warn!(configmap = %name, error = %e, "settings watch; retrying");
                continue;
            }
        };
        listed = true;
        match settings::parse(&cm.data.unwrap_or_default(), &base) {
            Ok(s) => {
                info!(configmap = %name, ?s, "settings in force");
                ctx.apply(&s);
                ctx.metrics.settings_applied.inc();
            }
            Err(reasons) => {
                warn!(configmap = %name, ?reasons, "settings ConfigMap refused; keeping the settings in force");
                ctx.metrics.settings_refused.inc();
            }
        }
    }
}

/// Resolves when a stop must no longer wait for the controller's graceful shutdown.
///
/// kube-runtime's graceful shutdown stops reading the Revision watch at once, then waits for
/// the runner to finish — and the runner holds every task until the Revision store has had its
/// first list. A stop that comes before that list has been answered (a slow real API server, a
/// subsetter stopped right after it started) would wait forever, so then nothing can be in
/// flight and the stop is immediate. Otherwise reconciles in flight get `grace` to finish.
async fn forced_stop(
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

/// The Revision an ActivationEndpoints belongs to (same name and namespace), as `.owns()`
/// would map it.
fn owner_of(ae: &ActivationEndpoints) -> ObjectRef<Revision> {
    ObjectRef::new(&ae.name_any()).within(&ae.namespace().unwrap_or_default())
}

fn key_of(ae: &ActivationEndpoints) -> Key {
    Key::new(ae.namespace().unwrap_or_default(), ae.name_any())
}

pub(crate) fn trigger(triggers: &Triggers, keys: BTreeSet<Key>) {
    for key in keys {
        triggers.send(ObjectRef::new(&key.name).within(&key.namespace));
    }
}

/// Keeps the host index from the Revision watch's events and triggers the revisions whose
/// `HostConflict` a change may flip. Triggers sent before the caches are synced are harmless:
/// reconciles wait for the sync.
#[derive(Clone)]
struct HostClaims {
    index: Arc<Mutex<HostIndex>>,
    triggers: Triggers,
    /// The revisions a relist in progress has shown so far.
    relist: Option<HashSet<Key>>,
}

impl HostClaims {
    fn new(index: Arc<Mutex<HostIndex>>, triggers: Triggers) -> Self {
        Self {
            index,
            triggers,
            relist: None,
        }
    }

    fn observe(&mut self, event: &Event<Revision>) {
        let key_of = |r: &Revision| Key::new(r.namespace().unwrap_or_default(), r.name_any());
        let created = |r: &Revision| {
            r.metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second())
        };
        let affected = {
            let mut ix = lock(&self.index);
            match event {
                Event::Init => {
                    self.relist = Some(HashSet::new());
                    return;
                }
                Event::InitApply(r) => {
                    let key = key_of(r);
                    let affected = ix.upsert(&key, created(r), &r.spec.hosts);
                    if let Some(seen) = &mut self.relist {
                        seen.insert(key);
                    }
                    affected
                }
                Event::InitDone => match self.relist.take() {
                    Some(seen) => ix.retain(&seen),
                    None => return,
                },
                Event::Apply(r) => ix.upsert(&key_of(r), created(r), &r.spec.hosts),
                Event::Delete(r) => ix.remove(&key_of(r)),
            }
        };
        if !affected.is_empty() {
            debug!(revisions = affected.len(), "host claims changed");
        }
        trigger(&self.triggers, affected);
    }

    /// The ActivationEndpoints of `key` changed: whether it can take its hosts' traffic decides
    /// the older claimants' HostConflict (see `reconciler::host_conflicts`). Only contested
    /// hosts have older claimants, so most events trigger nothing.
    fn endpoints_changed(&self, key: &Key) {
        let older = lock(&self.index).older_claimants(key);
        trigger(&self.triggers, older);
    }
}

async fn watch_endpoints(
    api: Api<ActivationEndpoints>,
    store: Arc<RwLock<AeStore>>,
    index: Arc<Mutex<MembershipIndex>>,
    claims: HostClaims,
    synced: Arc<watch::Sender<Synced>>,
    owners: Triggers,
    metrics: Arc<Metrics>,
) {
    let mut events = std::pin::pin!(resilient(watcher::watcher(api, watcher::Config::default())));
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                warn!(error = %e, "ActivationEndpoints watch");
                continue;
            }
        };
        {
            // The store keeps what a reconcile reads of each object (`store.rs`), not the
            // objects whole.
            let mut s = write(&store);
            match &event {
                Event::Apply(ae) => s.apply(ae),
                Event::Delete(ae) => s.delete(ae),
                Event::Init => s.relist_start(),
                Event::InitApply(ae) => s.relist_apply(ae),
                Event::InitDone => s.relist_done(),
            }
        }
        if let Event::Apply(ae) | Event::Delete(ae) | Event::InitApply(ae) = &event {
            claims.endpoints_changed(&key_of(ae));
        }
        let mut ix = lock(&index);
        match event {
            Event::Apply(ae) => {
                // A just-created object has no status yet (the status subresource is written
                // next); keep the members the reconciler reserved rather than zero.
                let key = key_of(&ae);
                if ae.status.is_some() || !ix.contains(&key) {
                    let (nodes, short) = crate::index::entry_of(&ae);
                    ix.set(&key, nodes, short);
                }
                owners.send(owner_of(&ae));
            }
            Event::Delete(ae) => {
                ix.remove(&key_of(&ae));
                owners.send(owner_of(&ae));
            }
            Event::InitApply(ae) => {
                let (nodes, short) = crate::index::entry_of(&ae);
                ix.set(&key_of(&ae), nodes, short);
            }
            Event::InitDone => {
                let keys: HashSet<Key> = read(&store).keys().cloned().collect();
                ix.retain(&keys);
                synced.send_modify(|s| s.endpoints = true);
            }
            Event::Init => {}
        }
        metrics.subsets.set(ix.len() as i64);
        metrics.subsets_short.set(ix.short_len() as i64);
    }
}
