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

use crate::conditions::NoMembers;
use crate::error::{Error, Result};
use crate::hosts;
use crate::index::Key;
use crate::locks::{lock, read, write};
use crate::metrics::Metrics;
use crate::plan::{self, SubsetInputs, SubsetPlan};
use crate::write_limit::Lane;

// Their paths from before they had files of their own.
pub use crate::config::{Config, DEFAULT_CONCURRENCY};
pub use crate::context::{Context, Tuned};

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
        write_revision_status(ctx, &target.revisions, rev, &problems, 0, &none, now).await?;
        return Ok(succeeded(ctx, &target.key));
    }

    let current = ctx.current(&target.key);
    if let Some(cur) = &current {
        delete_if_foreign(&target, rev, cur).await?;
    }
    let plan = plan_and_reserve(ctx, &target.key, rev, current.as_ref(), now);

    let observed = current.as_ref().and_then(|c| c.status.as_ref());
    let lane = lane_of(observed.map(|s| s.observed_generation), rev);
    let written = match &current {
        None => Some(create_subset(ctx, &target, rev, &plan, lane).await?),
        Some(cur) => update_subset(ctx, &target, cur, &plan, lane).await?,
    };
    if let Some(written) = written {
        record_written(ctx, &target.key, rev, written, &plan).await;
    }
    if ctx.config.endpoint_slices {
        ctx.apply_endpoint_slice(&target.key, rev, &plan.status.activators)
            .await?;
    }

    let members = plan.status.activators.len();
    let no_activators = NoMembers::default();
    let none = plan.no_members.as_ref().unwrap_or(&no_activators);
    write_revision_status(ctx, &target.revisions, rev, &[], members, none, now).await?;
    Ok(succeeded(ctx, &target.key))
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
    lock(&ctx.failures).remove(key);
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
    now: Timestamp,
) -> SubsetPlan {
    let host_conflicts = host_conflicts(ctx, key);
    let available = Arc::clone(&*read(&ctx.caches.activators));
    let key_str = key.to_string();
    let tuned = ctx.tuned();
    let evict = lock(&ctx.evictions).remove(key);
    let mut index = lock(&ctx.caches.index);
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
    Patch::Merge(json!({ "status": plan.status }))
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
    write(&ctx.caches.ae_store).wrote(key, written.stale, &written.object);
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
                .get_or_create(&crate::metrics::ReplacedBy { reason })
                .inc_by(n as u64);
        }
    }
}

/// The hosts `key` loses to a newer revision. A newer claimant counts only once its
/// ActivationEndpoints carries the host label: until then readers could not find it, and
/// marking this revision would leave the host with no route. The AE watch triggers this
/// revision again when the newer one's object changes.
fn host_conflicts(ctx: &Context, key: &Key) -> Vec<hosts::Conflict> {
    let newer = lock(&ctx.caches.hosts).newer_claimants(key);
    if newer.is_empty() {
        return Vec::new();
    }
    let conflicts = hosts::conflicts(&newer, |winner, host| {
        read(&ctx.caches.ae_store).has_label(winner, &hosts::label_of_normalized(host))
    });
    if !conflicts.is_empty() {
        debug!(revision = %key, ?conflicts, "hosts claimed by newer revisions");
    }
    conflicts
}

async fn write_revision_status(
    ctx: &Context,
    revisions: &Api<Revision>,
    rev: &Revision,
    problems: &[String],
    members: usize,
    none: &NoMembers,
    now: Timestamp,
) -> Result<()> {
    if let Some((generation, conditions)) =
        plan::revision_conditions(rev, problems, members, none, now)
    {
        let key = Key::new(rev.namespace().unwrap_or_default(), rev.name_any());
        let rv = rev.metadata.resource_version.as_deref();
        if lock(&ctx.caches.written_statuses).repeats(&key, rv, generation, &conditions) {
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
        lock(&ctx.caches.written_statuses).wrote(
            key,
            rv,
            made.metadata.resource_version.as_deref(),
            generation,
            &conditions,
        );
    }
    Ok(())
}

/// Retries with exponential backoff per revision: 0.5 s, 1 s, 2 s ... up to 60 s.
pub fn error_policy(rev: Arc<Revision>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.errors.inc();
    let key = Key::new(rev.namespace().unwrap_or_default(), rev.name_any());
    // What we believed we wrote may not have happened: trust the store again.
    let stored = {
        let mut store = write(&ctx.caches.ae_store);
        store.forget_written(&key);
        lock(&ctx.caches.written_statuses).forget(&key);
        store.stored(&key)
    };
    {
        let mut index = lock(&ctx.caches.index);
        match stored {
            Some(ae) => {
                let (nodes, short) = crate::index::entry_of(&ae);
                index.set(&key, nodes, short);
            }
            None => index.remove(&key),
        }
    }
    let attempt = {
        let mut failures = lock(&ctx.failures);
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

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(4));
        assert_eq!(backoff(30), Duration::from_secs(60));
    }
}
