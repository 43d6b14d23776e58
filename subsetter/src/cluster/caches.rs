//! The watches and caches a replica keeps whether it leads or not: a standby that takes over
//! reconciles from warm caches instead of relisting the cluster. Started in named steps (the
//! APIs, the sync flag, then the watches by what they feed); answered from for the directory.

use std::sync::Arc;

use crds::directory::DirectoryAnswer;
use crds::member_stream::Held;
use crds::{ActivationEndpoints, Revision, Route};
use futures::FutureExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster::config::Config;
use crate::cluster::member_stream::MemberHub;
use crate::cluster::metrics::Metrics;
use crate::cluster::namespaces::{self, Selected};
use crate::cluster::shared::SharedCaches;
use crate::cluster::synced::Synced;
use crate::cluster::triggers::Triggers;
use crate::cluster::usable_activators::{ActivatorSources, watch_activators};
use crate::cluster::watch::app_pods::watch_app_pods;
use crate::cluster::watch::endpoints::{Fed, watch_endpoints};
use crate::cluster::watch::revisions::{HostClaims, watch_revisions};
use crate::pure::key::Key;
use crate::pure::queue::Queued;
use keep_serving::{Locked, ReadWriteLocked};

/// The watches and caches a replica keeps whether it leads or not (see
/// [`crate::cluster::controller::Subsetter::start_caches`]).
pub struct Caches {
    /// What the reconciler reads too.
    pub(crate) shared: SharedCaches,
    pub(crate) rev_reader: Store<Revision>,
    pub(crate) route_reader: Store<Route>,
    pub(crate) triggers: Triggers,
    /// The membership streams open on this replica (`member_stream`).
    pub hub: Arc<MemberHub>,
    tasks: Vec<JoinHandle<()>>,
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
        let endpoints = self.shared.ae_store.read_locked().current(&key);
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
        let label = crate::pure::hosts::label_of_normalized(&h);
        let claimants = self.shared.hosts.locked().claimants(&h);
        if let Some(k) = self.shared.routes.locked().largest_share(&h) {
            return Some(k);
        }
        let store = self.shared.ae_store.read_locked();
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
            return Err(crds::member_stream::ONE_NAMESPACE);
        }
        let label = crds::contract::member_label(node);
        let m = self
            .shared
            .ae_store
            .read_locked()
            .members(&label)
            .ok_or("no numeric resourceVersion seen yet")?;
        Ok(crds::directory::MembersAnswer {
            resource_version: m.resource_version,
            items: m.items,
        })
    }

    /// The subsets carrying `host`'s label (normalized) as the watch showed them, and the
    /// store's version: what a label-selected list of the host would find (the claimants of
    /// the host and the revisions a Route gives a share of it are where the label can be).
    pub fn host_claims(
        &self,
        host: &str,
    ) -> std::result::Result<crds::directory::MembersAnswer, &'static str> {
        if !self.all_namespaces {
            return Err(crds::member_stream::ONE_NAMESPACE);
        }
        let label = crate::pure::hosts::label_of_normalized(host);
        let mut keys = self.shared.hosts.locked().claimants(host);
        keys.extend(self.shared.routes.locked().sharing(host));
        keys.sort();
        keys.dedup();
        let store = self.shared.ae_store.read_locked();
        let version = store
            .newest_version()
            .ok_or("no numeric resourceVersion seen yet")?;
        Ok(crds::directory::MembersAnswer {
            resource_version: version.to_string(),
            items: keys
                .iter()
                .filter_map(|k| store.stored_with_label(k, &label))
                .collect(),
        })
    }

    /// `node`'s memberships for a stream's first state (`crds::member_stream`): the version
    /// they are at (at least the streams' hub's, read first: every change up to it is in the
    /// store), the name and version of each, and the objects newer than `since`.
    pub fn member_sync(
        &self,
        node: &str,
        since: Option<u64>,
    ) -> std::result::Result<(u64, Vec<Held>, Vec<ActivationEndpoints>), &'static str> {
        let floor = self.hub.version();
        let m = match self.members(node) {
            Ok(m) => m,
            // Synced and empty (a fresh install): no object gives a version, and there is
            // nothing to name; every change from here has a version above 0.
            Err(_)
                if self.all_namespaces
                    && self.is_synced()
                    && self.shared.ae_store.read_locked().is_empty() =>
            {
                return Ok((floor, Vec::new(), Vec::new()));
            }
            Err(e) => return Err(e),
        };
        let at = crds::member_stream::version(&m.resource_version)
            .map_err(|_| "no numeric resourceVersion seen yet")?
            .max(floor);
        let rv = |o: &ActivationEndpoints| {
            o.metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(u64::MAX)
        };
        let held = m
            .items
            .iter()
            .map(|o| Held {
                namespace: o.namespace().unwrap_or_default(),
                name: o.name_any(),
                resource_version: o.metadata.resource_version.clone().unwrap_or_default(),
            })
            .collect();
        let items = m
            .items
            .into_iter()
            .filter(|o| since.is_none_or(|s| rv(o) > s))
            .collect();
        Ok((at, held, items))
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

/// The APIs the caches watch, each within the namespace the configuration gives it.
struct Apis {
    revisions: Api<Revision>,
    endpoints: Api<ActivationEndpoints>,
    activator_pods: Api<Pod>,
    nodes: Api<Node>,
    app_pods: Api<Pod>,
    routes: Api<Route>,
}

impl Apis {
    fn new(client: &Client, config: &Config) -> Self {
        let ns = config.namespace.as_deref();
        Self {
            revisions: within(client, ns),
            endpoints: within(client, ns),
            activator_pods: within(client, config.activator_namespace.as_deref()),
            nodes: Api::all(client.clone()),
            app_pods: within(client, ns),
            routes: within(client, ns),
        }
    }
}

/// `K` in namespace `ns`, or in every namespace.
fn within<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// What every watch feeds: the shared caches, its sync flag, the triggers, the metrics.
struct Feeds<'a> {
    shared: &'a SharedCaches,
    synced: &'a Arc<watch::Sender<Synced>>,
    triggers: &'a Triggers,
    metrics: &'a Arc<Metrics>,
    hub: &'a Arc<MemberHub>,
}

impl Caches {
    /// Starts the watches and caches (see `Subsetter::start_caches`).
    pub(crate) fn start(client: &Client, config: &Config, metrics: &Arc<Metrics>) -> Self {
        let apis = Apis::new(client, config);
        let mut tasks = Vec::new();
        let (synced, synced_rx) = sync_flags(config, &mut tasks);
        let selected = Selected::new(config.namespace_selector.as_deref());
        let triggers = Triggers::new(
            Arc::new(Queued::new(metrics.reconciles_queued.clone())),
            selected.clone(),
        );
        let shared = SharedCaches::new(synced_rx, Arc::clone(&triggers.queued), config.outage_hold);
        let claims = HostClaims::new(Arc::clone(&shared.hosts), triggers.clone());
        let hub = MemberHub::new(Arc::clone(metrics));
        let feeds = Feeds {
            hub: &hub,
            shared: &shared,
            synced: &synced,
            triggers: &triggers,
            metrics,
        };
        spawn_member_watches(&apis, &feeds, claims.clone(), config, client, &mut tasks);
        let route_reader = spawn_app_watches(&apis, &feeds, &mut tasks);
        let rev_reader = spawn_revision_watches(
            apis.revisions,
            &feeds,
            claims,
            config,
            client,
            selected,
            &mut tasks,
        );
        Caches {
            shared,
            rev_reader,
            route_reader,
            triggers,
            hub,
            tasks,
            all_namespaces: config.namespace.is_none(),
        }
    }
}

/// The per-watch sync flags, and the one flag the reconciler waits on: true once they all
/// are (a task in `tasks` folds them).
fn sync_flags(
    config: &Config,
    tasks: &mut Vec<JoinHandle<()>>,
) -> (Arc<watch::Sender<Synced>>, watch::Receiver<bool>) {
    let (synced_tx, synced_rx) = watch::channel(false);
    let synced = Arc::new(watch::Sender::new(Synced {
        namespaces: config.namespace_selector.is_none(),
        ..Synced::default()
    }));
    // Fold the flags into the one the reconciler waits on.
    let mut rx = synced.subscribe();
    tasks.push(tokio::spawn(async move {
        if rx.wait_for(|s| s.all()).await.is_ok() {
            let _ = synced_tx.send(true);
        }
        // Keep the sender alive (reconcilers treat a dropped sender as shutdown).
        synced_tx.closed().await;
    }));
    (synced, synced_rx)
}

/// Who is a member where, and who can be: the ActivationEndpoints watch, the activator pod
/// and Node watches, and the API server's `/readyz` probe.
fn spawn_member_watches(
    apis: &Apis,
    feeds: &Feeds<'_>,
    claims: HostClaims,
    config: &Config,
    client: &Client,
    tasks: &mut Vec<JoinHandle<()>>,
) {
    let shared = feeds.shared;
    tasks.push(tokio::spawn(watch_endpoints(
        apis.endpoints.clone(),
        Fed {
            store: Arc::clone(&shared.ae_store),
            index: Arc::clone(&shared.index),
            claims,
            synced: Arc::clone(feeds.synced),
            owners: feeds.triggers.clone(),
            metrics: Arc::clone(feeds.metrics),
            hub: Arc::clone(feeds.hub),
        },
    )));
    tasks.push(tokio::spawn(watch_activators(
        ActivatorSources {
            pods: apis.activator_pods.clone(),
            nodes: apis.nodes.clone(),
            aftermath: shared.aftermath.clone(),
            available_count: Arc::clone(&shared.available_count),
            replacement_hold: config.replacement_hold,
        },
        Arc::clone(&shared.index),
        Arc::clone(&shared.activators),
        Arc::clone(feeds.synced),
        feeds.triggers.clone(),
        Arc::clone(feeds.metrics),
    )));
    // An etcd outage leaves the watches open: only `/readyz` tells it (`control_plane.rs`).
    tasks.push(tokio::spawn(crate::cluster::control_plane::probe(
        client.clone(),
        shared.aftermath.clone(),
        feeds.metrics.readyz_failures.clone(),
    )));
}

/// App pods (hand-overs and Route steps wait on their readiness) and Routes; the Route store.
fn spawn_app_watches(
    apis: &Apis,
    feeds: &Feeds<'_>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Store<Route> {
    let shared = feeds.shared;
    tasks.push(tokio::spawn(watch_app_pods(
        apis.app_pods.clone(),
        Arc::clone(&shared.ready_pods),
        feeds.triggers.clone(),
        Arc::clone(&shared.route_wake),
        Arc::clone(feeds.synced),
    )));
    let (route_reader, route_writer) = reflector::store::<Route>();
    tasks.push(tokio::spawn(crate::cluster::routes::watch_routes(
        apis.routes.clone(),
        route_writer,
        Arc::clone(&shared.routes),
        feeds.triggers.clone(),
        Arc::clone(&shared.route_wake),
        Arc::clone(feeds.synced),
    )));
    route_reader
}

/// The namespace watch (with `--namespace-selector`) and the Revision watch; the Revision
/// store.
fn spawn_revision_watches(
    revisions: Api<Revision>,
    feeds: &Feeds<'_>,
    claims: HostClaims,
    config: &Config,
    client: &Client,
    selected: Selected,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Store<Revision> {
    let (rev_reader, rev_writer) = reflector::store::<Revision>();
    if let Some(selector) = config.namespace_selector.clone() {
        let synced = Arc::clone(feeds.synced);
        let (reader, tx) = (rev_reader.clone(), feeds.triggers.clone());
        tasks.push(tokio::spawn(namespaces::watch_namespaces(
            Api::all(client.clone()),
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
        feeds.triggers.clone(),
        Arc::clone(&feeds.shared.written_statuses),
    )));
    rev_reader
}
