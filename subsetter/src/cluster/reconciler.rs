//! The per-Revision reconcile: validate, plan, and perform only the writes the plan needs.

use std::sync::Arc;
use std::time::Duration;

use crds::{ActivationEndpoints, Revision};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::cluster::error::{Error, Result};
use crate::cluster::metrics::Metrics;
use crate::cluster::write_limit::Lane;
use crate::pure::conditions::{Desired, NoMembers};
use crate::pure::handover::{self, HandOver};
use crate::pure::hosts;
use crate::pure::key::Key;
use crate::pure::plan::{self, SubsetInputs, SubsetPlan};
use crate::pure::route_plan;
use keep_serving::{Locked, ReadWriteLocked};

// Their paths from before they had files of their own.
pub use crate::cluster::config::{Config, DEFAULT_CONCURRENCY};
pub use crate::cluster::context::{Context, Tuned};

/// Reconciles one Revision.
pub async fn reconcile(rev: Arc<Revision>, ctx: Arc<Context>) -> Result<Action> {
    ctx.caches.queued.left(&Key::new(
        rev.namespace().unwrap_or_default(),
        rev.name_any(),
    ));
    // Before the activator, node and ActivationEndpoints caches are synced, an empty cache
    // would look like "no activators" and wipe every subset.
    let mut synced = ctx.caches.synced.clone();
    // The sender lives as long as the controller; if it is gone the controller is stopping.
    if synced.wait_for(|s| *s).await.is_err() {
        return Ok(Action::await_change());
    }
    ctx.metrics.reconciles.inc();
    let started = std::time::Instant::now();
    ctx.metrics.reconciles_in_flight.inc();
    let r = reconcile_synced(&rev, &ctx).await;
    ctx.metrics.reconciles_in_flight.dec();
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().as_secs_f64());
    r
}

/// The reconcile proper, once the caches are synced. It reads top to bottom: an invalid spec
/// only gets its Revision status; otherwise read what is cached, plan, write what the plan
/// changes, then the Revision's status.
async fn reconcile_synced(rev: &Arc<Revision>, ctx: &Arc<Context>) -> Result<Action> {
    let target = Target::of(rev, ctx)?;
    let now = Timestamp::now();

    let problems = rev.problems();
    if !problems.is_empty() {
        debug!(revision = %target.key, ?problems, "invalid spec");
        let none = NoMembers::default();
        write_revision_status(ctx, &target.revisions, rev, &problems, 0, &none, None, now).await?;
        return Ok(succeeded(ctx, &target.key));
    }

    let current = ctx.current(&target.key);
    if let Some(cur) = &current {
        delete_if_foreign(&target, rev, cur).await?;
    }
    let routing = routing(ctx, &target.key, rev, current.as_ref(), now);
    let plan = plan_and_reserve(ctx, &target.key, rev, current.as_ref(), &routing, now);

    let observed = current.as_ref().and_then(|c| c.status.as_ref());
    let lane = lane_of(observed.map(|s| s.observed_generation), rev);
    let written = match &current {
        None => match create_subset(ctx, &target, rev, &plan, lane).await {
            Err(e) if namespace_terminating(&e) => {
                // The namespace is being deleted (its objects go in any order: this
                // Revision's subset went first). No create there can succeed and the
                // Revision is going too: retrying would only repeat the refused write.
                debug!(revision = %target.key, "namespace terminating; no subset");
                ctx.caches.index.locked().remove(&target.key);
                return Ok(succeeded(ctx, &target.key));
            }
            created => Some(created?),
        },
        Some(cur) => update_subset(ctx, &target, cur, &plan, lane).await?,
    };
    if let Some(written) = written {
        record_written(ctx, &target.key, rev, written, &plan).await;
    }
    if ctx.config.endpoint_slices {
        ctx.apply_endpoint_slice(&target.key, rev, &plan.status.activators)
            .await?;
    }

    if let HandOver::Move {
        warm,
        waited,
        message,
        ..
    } = &routing.hand_over
    {
        moved_event(ctx, &target.key, rev, *warm, *waited, message).await;
    }

    let members = plan.status.activators.len();
    let no_activators = NoMembers::default();
    let none = plan.no_members.as_ref().unwrap_or(&no_activators);
    let routes_ready = routes_ready(rev, &routing.hand_over);
    write_revision_status(
        ctx,
        &target.revisions,
        rev,
        &[],
        members,
        none,
        routes_ready,
        now,
    )
    .await?;
    let done = succeeded(ctx, &target.key);
    // A hand-over that waits is looked at again at its bound (pod changes trigger it before).
    Ok(match &routing.hand_over {
        HandOver::Wait { deadline, .. } => {
            let left = deadline.duration_since(now).as_millis();
            Action::requeue(Duration::from_millis(
                u64::try_from(left).unwrap_or(0).max(100),
            ))
        }
        _ => done,
    })
}

/// How `rev`'s hosts are routed in this reconcile: a Route's shares, the hand-over of hosts
/// older revisions serve, and the pods to keep started for either.
struct Routing {
    shares: Vec<crds::HostShare>,
    hand_over: HandOver,
    pending: Vec<String>,
    warm_pods: i32,
}

fn routing(
    ctx: &Context,
    key: &Key,
    rev: &Revision,
    current: Option<&ActivationEndpoints>,
    now: Timestamp,
) -> Routing {
    let (shares, route_warm, routed) = {
        let rix = ctx.caches.routes.locked();
        let hosts = ctx.caches.hosts.locked().hosts_of(key);
        let routed: Vec<String> = hosts
            .into_iter()
            .filter(|h| rix.owner(h).is_some())
            .collect();
        (rix.shares_of(key), rix.warm_of(key), routed)
    };
    let held = held_hosts(ctx, key, current, &routed);
    let waiting_since = rev
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == route_plan::ROUTES_READY && c.status == "False")
        })
        .map(|c| c.last_transition_time.0);
    let ready = ctx.caches.ready_pods.locked().ready(key);
    let hand_over = handover::decide(&handover::Inputs {
        held: &held,
        ready,
        max_scale: rev.spec.max_scale,
        bound_seconds: rev.spec.hand_over_bound(),
        waiting_since,
        now,
    });
    let waits = matches!(hand_over, HandOver::Wait { .. });
    ctx.caches
        .ready_pods
        .locked()
        .watch(key, waits || route_warm > 0);
    let (pending, warm) = match &hand_over {
        HandOver::Wait { needed, .. } => (held.iter().map(|h| h.host.clone()).collect(), *needed),
        _ => (Vec::new(), 0),
    };
    Routing {
        shares,
        hand_over,
        pending,
        warm_pods: warm.max(route_warm),
    }
}

/// The hosts of `key` that an older revision serves now while `key`'s own object carries no
/// label for them (hosts a Route owns are the Route's to move).
fn held_hosts(
    ctx: &Context,
    key: &Key,
    current: Option<&ActivationEndpoints>,
    routed: &[String],
) -> Vec<handover::Held> {
    let candidates: Vec<(String, Vec<Key>)> = {
        let hix = ctx.caches.hosts.locked();
        hix.hosts_of(key)
            .into_iter()
            .filter(|h| !routed.contains(h))
            .map(|h| {
                let older = hix.older_than(&h, key);
                (h, older)
            })
            .collect()
    };
    let mut held = Vec::new();
    for (host, older) in candidates {
        let label = hosts::label_of_normalized(&host);
        let own = current.is_some_and(|c| c.labels().contains_key(&label));
        if own || older.is_empty() {
            continue;
        }
        let by = {
            let ae = ctx.caches.ae_store.read_locked();
            older.into_iter().find(|k| ae.has_label(k, &label))
        };
        if let Some(by) = by {
            let ready = ctx.caches.ready_pods.locked().ready(&by);
            held.push(handover::Held { host, by, ready });
        }
    }
    held
}

/// The `RoutesReady` condition of a revision: False while a hand-over waits, True once it
/// took its hosts; absent on a revision that never had to wait (most never do).
fn routes_ready(rev: &Revision, hand_over: &HandOver) -> Option<Desired> {
    match hand_over {
        HandOver::Wait { message, .. } => Some(Desired {
            type_: route_plan::ROUTES_READY,
            status: false,
            reason: "WaitingForPods",
            message: message.clone(),
        }),
        HandOver::Move { message, .. } => Some(Desired {
            type_: route_plan::ROUTES_READY,
            status: true,
            reason: "HostsRouted",
            message: message.clone(),
        }),
        HandOver::Nothing => {
            let had = rev.status.as_ref().and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == route_plan::ROUTES_READY)
            })?;
            Some(Desired {
                type_: route_plan::ROUTES_READY,
                status: true,
                reason: "HostsRouted",
                message: if had.status == "True" {
                    had.message.clone()
                } else {
                    "no other revision serves its hosts".into()
                },
            })
        }
    }
}

/// A host moved to `rev`: counted, logged, and an Event on the Revision.
async fn moved_event(
    ctx: &Context,
    key: &Key,
    rev: &Revision,
    warm: bool,
    waited: k8s_openapi::jiff::SignedDuration,
    message: &str,
) {
    if warm {
        ctx.metrics.handovers_warm.inc();
    } else {
        ctx.metrics.handovers_bound.inc();
    }
    ctx.metrics
        .handover_wait_seconds
        .observe(waited.as_secs_f64().max(0.0));
    info!(revision = %key, warm, %message, "host handed over");
    let reason = if warm {
        "HostMoved"
    } else {
        "HostMovedAtBound"
    };
    ctx.revision_event(rev, warm, reason, message).await;
}

/// The revision a reconcile works on, and the APIs of its namespace.
struct Target {
    key: Key,
    revisions: Api<Revision>,
    endpoints: Api<ActivationEndpoints>,
}

impl Target {
    fn of(rev: &Revision, ctx: &Context) -> Result<Self> {
        let namespace = rev
            .namespace()
            .ok_or_else(|| Error::NoNamespace(rev.name_any()))?;
        Ok(Self {
            revisions: Api::namespaced(ctx.client.clone(), &namespace),
            endpoints: Api::namespaced(ctx.client.clone(), &namespace),
            key: Key::new(namespace, rev.name_any()),
        })
    }
}

/// The reconcile of `key` is done: its next failure backs off from the start again.
fn succeeded(ctx: &Context, key: &Key) -> Action {
    ctx.failures.locked().remove(key);
    Action::await_change()
}

/// The write lane of an object that last saw generation `observed` of `rev`: a Revision that
/// is new, or changed since, is a user's request, and its writes go ahead of repairs
/// (`write_limit.rs`).
fn lane_of(observed: Option<Option<i64>>, rev: &Revision) -> Lane {
    if observed == Some(rev.metadata.generation) {
        Lane::Bulk
    } else {
        Lane::Urgent
    }
}

/// An ActivationEndpoints controlled by another object is a leftover of an earlier Revision
/// with this name (the garbage collector removes it soon). It is deleted with a uid
/// precondition, which cannot remove a newer object, and the reconcile fails: its retry
/// creates this revision's own.
async fn delete_if_foreign(
    target: &Target,
    rev: &Revision,
    current: &ActivationEndpoints,
) -> Result<()> {
    let owner_uid = current
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str());
    if owner_uid == rev.uid().as_deref() {
        return Ok(());
    }
    let key = &target.key;
    warn!(revision = %key, "ActivationEndpoints has another controller; deleting it");
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: current.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match target.endpoints.delete(&key.name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Err(Error::ForeignOwner(key.to_string()))
}

/// Plans `rev`'s subset from what is cached (activators, host claims, load, a pending
/// eviction, the policy in force), and reserves its members in the membership index under the
/// same lock: reconciles of other revisions running concurrently then see this one's load
/// (`error_policy` restores the index from the store if the writes fail).
fn plan_and_reserve(
    ctx: &Context,
    key: &Key,
    rev: &Revision,
    current: Option<&ActivationEndpoints>,
    routing: &Routing,
    now: Timestamp,
) -> SubsetPlan {
    let host_conflicts = host_conflicts(ctx, key);
    let available = Arc::clone(&*ctx.caches.activators.read_locked());
    let key_str = key.to_string();
    let tuned = ctx.tuned();
    let evict = ctx.evictions.locked().remove(key);
    let mut index = ctx.caches.index.locked();
    // Locality off, or no node reporting an image (kubelets listing none, kubesim without
    // images): nothing to prefer, and the template is not parsed (a plan costs what it did
    // before image locality; `status.imageMembers` is then left out).
    let images = if tuned.image_locality && index.loads().has_images() {
        ctx.wanted_images.get(
            rev.metadata.uid.as_deref(),
            rev.metadata.generation,
            &rev.spec.template,
        )
    } else {
        Arc::from([])
    };
    let plan = plan::subset(&SubsetInputs {
        key: &key_str,
        revision: rev,
        current,
        available: &available,
        load: &|n| index.load(n),
        loads: Some(index.loads()),
        evict: evict.as_deref(),
        policy: tuned.policy.as_ref(),
        image_locality: tuned.image_locality,
        images: &images,
        default_n: tuned.max_node_selection,
        host_conflicts: &host_conflicts,
        routes: &routing.shares,
        pending_hosts: &routing.pending,
        warm_pods: routing.warm_pods,
        now,
    });
    let nodes = plan.status.activators.iter().map(|m| &m.node);
    index.set(key, nodes, plan.short);
    plan
}

/// What a reconcile wrote of an ActivationEndpoints: the object as the API server last
/// answered, and the resource versions it wrote over (the first the one it read), which the
/// store then knows to be older (`store.rs`).
struct Written {
    object: ActivationEndpoints,
    stale: Vec<Option<String>>,
}

fn status_patch(plan: &SubsetPlan) -> Patch<serde_json::Value> {
    let mut status = json!(plan.status);
    // An empty list is left out when serialized, and a merge patch leaves out what it omits:
    // a revision that lost its last Route share must say so with a null.
    if plan.status.routes.is_empty() {
        status["routes"] = serde_json::Value::Null;
    }
    Patch::Merge(json!({ "status": status }))
}

/// Creates `rev`'s ActivationEndpoints (owned by it, with the plan's labels), then writes its
/// status, which a create cannot carry (a subresource).
async fn create_subset(
    ctx: &Context,
    target: &Target,
    rev: &Revision,
    plan: &SubsetPlan,
    lane: Lane,
) -> Result<Written> {
    let name = &target.key.name;
    let mut ae = ActivationEndpoints::new(name, Default::default());
    ae.metadata.namespace = Some(target.key.namespace.clone());
    ae.metadata.labels = Some(plan.labels.clone());
    ae.metadata.owner_references = rev.controller_owner_ref(&()).map(|o| vec![o]);
    let post = PostParams {
        field_manager: Some(ctx.config.field_manager.clone()),
        ..Default::default()
    };
    ctx.write_turn(lane).await;
    ctx.metrics.writes.inc();
    let (created, adopted) = match target.endpoints.create(&post, &ae).await {
        Ok(created) => (created, false),
        // It exists though the store has not seen it: an earlier attempt's create landed but
        // its answer was lost, or the watch lags. Take it over rather than retrying a create
        // that can never succeed.
        Err(kube::Error::Api(s)) if s.code == 409 => (target.endpoints.get(name).await?, true),
        Err(e) => return Err(e.into()),
    };
    let mut stale = vec![None, created.resource_version()];
    let pp = ctx.patch_params();
    ctx.write_turn(lane).await;
    let mut object = target
        .endpoints
        .patch_status(name, &pp, &status_patch(plan))
        .await?;
    ctx.metrics.writes.inc();
    // One taken over carries the labels of whoever wrote it.
    if adopted && object.metadata.labels.as_ref() != Some(&plan.labels) {
        stale.push(object.resource_version());
        ctx.write_turn(lane).await;
        let labels = json!({ "metadata": { "labels": plan.labels } });
        object = target
            .endpoints
            .patch(name, &pp, &Patch::Merge(labels))
            .await?;
        ctx.metrics.writes.inc();
    }
    Ok(Written { object, stale })
}

/// Writes what the plan changes of an existing ActivationEndpoints, if anything. Status
/// first: an activator that starts matching the new label then already finds itself in
/// status.activators.
async fn update_subset(
    ctx: &Context,
    target: &Target,
    current: &ActivationEndpoints,
    plan: &SubsetPlan,
    lane: Lane,
) -> Result<Option<Written>> {
    let name = &target.key.name;
    let pp = ctx.patch_params();
    let mut stale = vec![current.resource_version()];
    let mut wrote: Option<ActivationEndpoints> = None;
    if plan.status_changed {
        ctx.write_turn(lane).await;
        let o = target
            .endpoints
            .patch_status(name, &pp, &status_patch(plan))
            .await?;
        ctx.metrics.writes.inc();
        wrote = Some(o);
    }
    if let Some(labels) = &plan.label_patch {
        if let Some(o) = &wrote {
            stale.push(o.resource_version());
        }
        ctx.write_turn(lane).await;
        wrote = Some(
            target
                .endpoints
                .patch(name, &pp, &Patch::Merge(labels))
                .await?,
        );
        ctx.metrics.writes.inc();
    }
    Ok(wrote.map(|object| Written { object, stale }))
}

/// After a write: the store keeps what was written until the watch shows it (`store.rs`),
/// the churn is counted, and a subset that became Degraded gets its Event.
async fn record_written(
    ctx: &Context,
    key: &Key,
    rev: &Revision,
    written: Written,
    plan: &SubsetPlan,
) {
    ctx.caches
        .ae_store
        .write_locked()
        .wrote(key, written.stale, &written.object);
    count_churn(&ctx.metrics, plan);
    if let Some((reason, message)) = &plan.degraded {
        ctx.degraded_event(rev, reason, message).await;
    }
    info!(
        revision = %key,
        members = ?plan.status.activators.iter().map(|m| m.node.as_str()).collect::<Vec<_>>(),
        joined = plan.joined,
        left = plan.left,
        "subset written"
    );
}

/// Members that joined and left with a written plan, and why those that left did.
fn count_churn(metrics: &Metrics, plan: &SubsetPlan) {
    metrics.members_joined.inc_by(plan.joined as u64);
    metrics.members_left.inc_by(plan.left as u64);
    for (reason, n) in [
        ("lost", plan.left_lost),
        ("ineligible", plan.left_ineligible),
        ("rebalance", plan.left_rebalanced),
    ] {
        if n > 0 {
            metrics
                .members_replaced
                .get_or_create(&crate::cluster::metrics::ReplacedBy { reason })
                .inc_by(n as u64);
        }
    }
}

/// The hosts `key` loses to a newer revision. A newer claimant counts only once its
/// ActivationEndpoints carries the host label: until then readers could not find it, and
/// marking this revision would leave the host with no route. The AE watch triggers this
/// revision again when the newer one's object changes.
fn host_conflicts(ctx: &Context, key: &Key) -> Vec<hosts::Conflict> {
    let mut newer = ctx.caches.hosts.locked().newer_claimants(key);
    {
        // A host a Route owns is the Route's to split: claims do not conflict over it.
        let rix = ctx.caches.routes.locked();
        newer.retain(|(h, _)| rix.owner(h).is_none());
    }
    if newer.is_empty() {
        return Vec::new();
    }
    let conflicts = hosts::conflicts(&newer, |winner, host| {
        ctx.caches
            .ae_store
            .read_locked()
            .has_label(winner, &hosts::label_of_normalized(host))
    });
    if !conflicts.is_empty() {
        debug!(revision = %key, ?conflicts, "hosts claimed by newer revisions");
    }
    conflicts
}

/// The Revision's status, with `RoutesReady` when it has one.
#[allow(clippy::too_many_arguments)]
async fn write_revision_status(
    ctx: &Context,
    revisions: &Api<Revision>,
    rev: &Revision,
    problems: &[String],
    members: usize,
    none: &NoMembers,
    routes_ready: Option<Desired>,
    now: Timestamp,
) -> Result<()> {
    if let Some((generation, conditions)) =
        plan::revision_conditions(rev, problems, members, none, routes_ready, now)
    {
        let key = Key::new(rev.namespace().unwrap_or_default(), rev.name_any());
        let rv = rev.metadata.resource_version.as_deref();
        if ctx
            .caches
            .written_statuses
            .locked()
            .repeats(&key, rv, generation, &conditions)
        {
            debug!(revision = %key, "status written already, over the version planned from");
            return Ok(());
        }
        let patch =
            json!({ "status": { "observedGeneration": generation, "conditions": conditions } });
        let lane = lane_of(rev.status.as_ref().map(|s| s.observed_generation), rev);
        ctx.write_turn(lane).await;
        let made = revisions
            .patch_status(&rev.name_any(), &ctx.patch_params(), &Patch::Merge(patch))
            .await?;
        ctx.metrics.writes.inc();
        ctx.caches.written_statuses.locked().wrote(
            key,
            rv,
            made.metadata.resource_version.as_deref(),
            generation,
            &conditions,
        );
    }
    Ok(())
}

/// Whether the API server refused a write because its namespace is being deleted (403 with
/// the cause `NamespaceTerminating`), which no retry can change.
fn namespace_terminating(e: &Error) -> bool {
    matches!(e, Error::Kube(kube::Error::Api(s)) if s.code == 403
    && s.details.as_ref().is_some_and(|d| {
        d.causes.iter().any(|c| c.reason == "NamespaceTerminating")
    }))
}

/// Retries with exponential backoff per revision: 0.5 s, 1 s, 2 s ... up to 60 s.
pub fn error_policy(rev: Arc<Revision>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.errors.inc();
    let key = Key::new(rev.namespace().unwrap_or_default(), rev.name_any());
    // What we believed we wrote may not have happened: trust the store again.
    let stored = {
        let mut store = ctx.caches.ae_store.write_locked();
        store.forget_written(&key);
        ctx.caches.written_statuses.locked().forget(&key);
        store.stored(&key)
    };
    {
        let mut index = ctx.caches.index.locked();
        match stored {
            Some(ae) => {
                let (nodes, short) = crate::pure::index::entry_of(&ae);
                index.set(&key, nodes, short);
            }
            None => index.remove(&key),
        }
    }
    let attempt = {
        let mut failures = ctx.failures.locked();
        let n = failures.entry(key.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay = match error {
        // The API server did not answer (it is down or restarting): retried as often as the
        // watches retry, so what failed during an outage is done within a second or two of
        // its return, not after a wait doubled through the whole outage (up to a minute).
        Error::Kube(e) if crds::backoff::unanswered(e) => backoff(attempt).min(UNANSWERED_RETRY),
        _ => backoff(attempt),
    };
    warn!(revision = %key, %error, attempt, ?delay, "reconcile failed; retrying");
    Action::requeue(delay)
}

/// The longest wait before a reconcile that got no answer from the API server is retried
/// (the watches' bound, [`crds::backoff::CAP`]).
const UNANSWERED_RETRY: Duration = crds::backoff::CAP;

pub(crate) fn backoff(attempt: u32) -> Duration {
    let ms = 500u64.saturating_mul(1u64 << attempt.saturating_sub(1).min(16));
    Duration::from_millis(ms.min(60_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden(cause: &str) -> Error {
        let details: kube::core::response::StatusDetails = serde_json::from_value(json!({
            "name": "r", "kind": "activationendpoints",
            "causes": [{ "reason": cause, "message": "m", "field": "metadata.namespace" }],
        }))
        .unwrap();
        Error::Kube(kube::Error::Api(
            kube::core::Status {
                code: 403,
                reason: "Forbidden".into(),
                details: Some(details),
                ..Default::default()
            }
            .boxed(),
        ))
    }

    #[test]
    fn only_a_terminating_namespace_is_not_retried() {
        assert!(namespace_terminating(&forbidden("NamespaceTerminating")));
        assert!(!namespace_terminating(&forbidden("SomethingElse")));
        let rbac = Error::Kube(kube::Error::Api(
            kube::core::Status {
                code: 403,
                reason: "Forbidden".into(),
                ..Default::default()
            }
            .boxed(),
        ));
        assert!(!namespace_terminating(&rbac), "RBAC refusals are retried");
        assert!(!namespace_terminating(&Error::ForeignOwner("ns/r".into())));
    }

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(4));
        assert_eq!(backoff(30), Duration::from_secs(60));
    }
}
