//! Routes: the watch that keeps [`RouteIndex`] on every replica, and the leader's pass that
//! decides what each Route serves (`route_plan.rs`), writes its status and an Event on each
//! move, and triggers the revisions whose shares or warm pods changed, so their
//! ActivationEndpoints carry the new `status.routes` (gaining revisions are triggered first:
//! a host's readers then never see a share taken before it is given).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crds::backoff::resilient;
use crds::{Revision, Route};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::Patch;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::cluster::context::Context;
use crate::cluster::triggers::{Triggers, trigger};
use crate::cluster::write_limit::Lane;
use crate::pure::hosts::label_of_normalized;
use crate::pure::key::Key;
use crate::pure::route_index::RouteIndex;
use crate::pure::route_plan::{self, Facts};
use keep_serving::{Locked, ReadWriteLocked};

/// A pass runs at least this often while leading: a Route's `latestRevision` follows new
/// Revisions, and steps and bounds come due, without an event of the Route's own.
const PASS_EVERY: Duration = Duration::from_secs(1);

fn key_of(r: &Route) -> Key {
    Key::new(r.namespace().unwrap_or_default(), r.name_any())
}

fn created(r: &Route) -> i64 {
    r.metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second())
}

/// Keeps the route store and `index` from the Route watch; wakes the pass on each change.
pub(crate) async fn watch_routes(
    api: Api<Route>,
    mut writer: Writer<Route>,
    index: Arc<Mutex<RouteIndex>>,
    triggers: Triggers,
    wake: Arc<Notify>,
    synced: Arc<tokio::sync::watch::Sender<crate::cluster::synced::Synced>>,
) {
    let mut events = std::pin::pin!(resilient(watcher::watcher(api, watcher::Config::default())));
    let mut listed: BTreeSet<Key> = BTreeSet::new();
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                // Without the Route CRD (a cluster not upgraded yet) there are no routes:
                // that must not hold every revision's reconcile.
                if is_not_found(&e) {
                    synced.send_modify(|s| s.routes = true);
                }
                warn!(error = %e, "Route watch");
                continue;
            }
        };
        if matches!(event, Event::InitDone) {
            synced.send_modify(|s| s.routes = true);
        }
        writer.apply_watcher_event(&event);
        let changed = {
            let mut ix = index.locked();
            match &event {
                Event::Apply(r) | Event::InitApply(r) => {
                    listed.insert(key_of(r));
                    let traffic = r.status.as_ref().map(|s| s.traffic.clone());
                    ix.upsert(
                        &key_of(r),
                        created(r),
                        &r.spec.hosts,
                        &traffic.unwrap_or_default(),
                    )
                }
                Event::Delete(r) => ix.remove(&key_of(r)),
                Event::Init => {
                    listed.clear();
                    BTreeSet::new()
                }
                Event::InitDone => {
                    let gone: Vec<Key> = ix
                        .keys()
                        .into_iter()
                        .filter(|k| !listed.contains(k))
                        .collect();
                    gone.iter().flat_map(|k| ix.remove(k)).collect()
                }
            }
        };
        trigger(&triggers, changed);
        wake.notify_one();
    }
}

fn is_not_found(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 404,
        _ => false,
    }
}

/// The leader's route pass, until the task is aborted.
pub(crate) async fn run(
    ctx: Arc<Context>,
    routes: Store<Route>,
    revisions: Store<Revision>,
    triggers: Triggers,
    wake: Arc<Notify>,
) {
    let _ = routes.wait_until_ready().await;
    let _ = revisions.wait_until_ready().await;
    loop {
        let mut next = PASS_EVERY;
        for route in routes.state() {
            match pass_one(&ctx, &route, &revisions, &triggers).await {
                Ok(Some(d)) => next = next.min(d),
                Ok(None) => {}
                Err(e) => debug!(route = %key_of(&route), error = %e, "route pass"),
            }
        }
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(next) => {}
        }
    }
}

/// One route: decide, write its status if it changed, publish, say so. Returns when to look
/// again.
async fn pass_one(
    ctx: &Context,
    route: &Route,
    revisions: &Store<Revision>,
    triggers: &Triggers,
) -> Result<Option<Duration>, kube::Error> {
    let key = key_of(route);
    let ns = key.namespace.clone();
    let hosts = route.spec.normalized_hosts();
    let rev = |name: &str| revisions.get(&ObjectRef::new(name).within(&ns));
    let ready = Arc::clone(&ctx.caches.ready_pods);
    let facts = |name: &str| -> Option<Facts> {
        let r = rev(name)?;
        if !r.problems().is_empty() {
            return None;
        }
        Some(Facts {
            ready: ready.locked().ready(&Key::new(ns.clone(), name.to_owned())),
            max_scale: r.spec.max_scale,
            bound_seconds: r.spec.hand_over_bound(),
        })
    };
    let claims = host_claims(ctx, &key, &hosts, &facts, &rev);
    let now = Timestamp::now();
    let d = route_plan::decide(&route_plan::Inputs {
        spec: &route.spec,
        generation: route.metadata.generation,
        status: route.status.as_ref(),
        latest: claims.latest,
        facts: &facts,
        serving_now: claims.serving_now,
        problems: claims.problems,
        now,
    });
    keep_warm(ctx, &key, &d.warm, triggers);
    if route.status.as_ref() != Some(&d.status) {
        write_status(ctx, route, &key, &d, triggers).await?;
    }
    Ok(d.requeue)
}

/// What the claims on a Route's hosts tell its decision.
struct Claims {
    /// The revision `latestRevision` follows: the newest valid claimant of the route's
    /// namespace, over its hosts.
    latest: Option<String>,
    /// What serves the hosts by the claim rule (in the route's namespace).
    serving_now: Option<String>,
    /// Hosts another Route routes.
    problems: Vec<String>,
}

/// The claims on `hosts` of the Route `key`, from the host and route indexes and the store.
fn host_claims(
    ctx: &Context,
    key: &Key,
    hosts: &[String],
    facts: &dyn Fn(&str) -> Option<Facts>,
    rev: &dyn Fn(&str) -> Option<Arc<Revision>>,
) -> Claims {
    let ns = &key.namespace;
    let hix = ctx.caches.hosts.locked();
    let rix = ctx.caches.routes.locked();
    let ae = ctx.caches.ae_store.read_locked();
    let mut latest: Option<(i64, Key)> = None;
    let mut serving: Option<String> = None;
    let mut problems = Vec::new();
    for h in hosts {
        if let Some(owner) = rix.owner(h).filter(|o| *o != key) {
            problems.push(format!("host {h} is routed by Route {owner}"));
        }
        for c in hix.claimants(h) {
            if c.namespace != *ns || facts(&c.name).is_none() {
                continue;
            }
            let at = rev(&c.name)
                .and_then(|r| r.metadata.creation_timestamp.clone())
                .map_or(0, |t| t.0.as_second());
            if latest.as_ref().is_none_or(|(t, k)| (at, &c) > (*t, k)) {
                latest = Some((at, c.clone()));
            }
            break;
        }
        if serving.is_none() {
            serving = hix
                .claimants(h)
                .into_iter()
                .find(|c| ae.has_label(c, &label_of_normalized(h)))
                .filter(|c| c.namespace == *ns)
                .map(|c| c.name);
        }
    }
    Claims {
        latest: latest.map(|(_, k)| k.name),
        serving_now: serving,
        problems,
    }
}

/// Pods to keep started for the revisions a move waits on; they wake the pass when ready.
fn keep_warm(ctx: &Context, key: &Key, warm: &[(String, i32)], triggers: &Triggers) {
    let warm: Vec<(Key, i32)> = warm
        .iter()
        .map(|(n, p)| (Key::new(key.namespace.clone(), n.clone()), *p))
        .collect();
    {
        let mut rp = ctx.caches.ready_pods.locked();
        for (k, _) in &warm {
            rp.watch(k, true);
        }
    }
    let warm_changed = ctx.caches.routes.locked().set_warm(key, &warm);
    trigger(triggers, warm_changed);
}

/// Writes the Route's new status, takes its shares into the route index ahead of the watch
/// (the revisions' plans read them at once, the gaining ones triggered first), and tells of
/// a move in an Event.
async fn write_status(
    ctx: &Context,
    route: &Route,
    key: &Key,
    d: &route_plan::Decision,
    triggers: &Triggers,
) -> Result<(), kube::Error> {
    let api: Api<Route> = Api::namespaced(ctx.client.clone(), &key.namespace);
    ctx.write_turn(Lane::Urgent).await;
    let patch = Patch::Merge(json!({ "status": d.status }));
    api.patch_status(&key.name, &ctx.patch_params(), &patch)
        .await?;
    ctx.metrics.writes.inc();
    let changed = ctx.caches.routes.locked().upsert(
        key,
        created(route),
        &route.spec.hosts,
        &d.status.traffic,
    );
    let gaining = |k: &Key| {
        d.status
            .traffic
            .iter()
            .any(|t| t.revision_name == k.name && t.percent > 0)
    };
    let (first, then): (BTreeSet<Key>, BTreeSet<Key>) =
        changed.into_iter().partition(|k| gaining(k));
    trigger(triggers, first);
    trigger(triggers, then);
    if let Some(moved) = &d.moved {
        info!(route = %key, %moved, "route moved");
        ctx.metrics.route_moves.inc();
        ctx.publish_event(
            &route.object_ref(&()),
            EventType::Normal,
            "TrafficMoved",
            moved,
            "RouteTraffic",
        )
        .await;
    }
    Ok(())
}
