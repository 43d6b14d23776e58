//! Members only where the revision's pod could run: tainted and still-not-ready nodes are
//! never chosen without a toleration, and a node that becomes eligible fills a short subset.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use crds::ActivationEndpoints;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Toleration};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use subsetter::policy::LeastLoaded;
use support::*;

/// A Node that reports Ready. The API server adds `node.kubernetes.io/not-ready:NoSchedule`
/// to every new Node (TaintNodesByCondition); `untaint` plays the lifecycle controller that
/// removes it once the node is Ready, and `taints` are set instead.
async fn node(c: &Cluster, name: &str, taints: serde_json::Value, untaint: bool) -> Result<()> {
    let nodes: Api<Node> = Api::all(c.client.clone());
    let n: Node = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    nodes.create(&PostParams::default(), &n).await?;
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&ready))
        .await?;
    if untaint {
        set_taints(c, name, taints).await?;
    }
    Ok(())
}

async fn set_taints(c: &Cluster, name: &str, taints: serde_json::Value) -> Result<()> {
    let nodes: Api<Node> = Api::all(c.client.clone());
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"taints": taints}})),
        )
        .await?;
    Ok(())
}

fn tolerating_gpu(mut spec: crds::RevisionSpec) -> crds::RevisionSpec {
    let mut template = spec.template.value();
    template["spec"]["tolerations"] = serde_json::to_value(vec![Toleration {
        key: Some("gpu".into()),
        operator: Some("Exists".into()),
        ..Default::default()
    }])
    .unwrap();
    spec.template = template.into();
    spec
}

/// The first events.k8s.io/v1 Event regarding Revision `name` (watched, not polled).
async fn degraded_event(c: &Cluster, name: &str) -> Result<k8s_openapi::api::events::v1::Event> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.client.clone(), NS);
    let events = watcher(api, watcher::Config::default()).applied_objects();
    let mut events = std::pin::pin!(events);
    let found = tokio::time::timeout(WAIT, async {
        while let Some(Ok(e)) = events.next().await {
            let e: k8s_openapi::api::events::v1::Event = e;
            if e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name) {
                return Some(e);
            }
        }
        None
    })
    .await?;
    found.ok_or_else(|| anyhow::anyhow!("the event watch ended"))
}

/// Every member set `name`'s ActivationEndpoints has shown since the call.
fn record_members(c: &Cluster, name: &'static str) -> Arc<Mutex<Vec<BTreeSet<String>>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let api = c.endpoints();
    tokio::spawn(async move {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = std::pin::pin!(watcher(api, cfg).applied_objects());
        while let Some(Ok(ae)) = events.next().await {
            let ae: ActivationEndpoints = ae;
            s.lock()
                .unwrap()
                .push(members(&ae).into_iter().collect::<BTreeSet<_>>());
        }
    });
    seen
}

#[tokio::test]
async fn tainted_and_not_ready_nodes_are_never_members_without_a_toleration() -> Result<()> {
    let c = Cluster::start().await?;
    node(&c, "n1", json!([]), true).await?;
    node(&c, "n2", json!([]), true).await?;
    node(
        &c,
        "n3",
        json!([{"key": "gpu", "value": "true", "effect": "NoSchedule"}]),
        true,
    )
    .await?;
    // n4 is Ready but still carries the not-ready taint the API server gave it.
    node(&c, "n4", json!([]), false).await?;
    for (i, n) in ["n1", "n2", "n3", "n4"].iter().enumerate() {
        c.add_activator(n, &format!("127.0.2.{}", i + 1)).await?;
    }
    let plain_seen = record_members(&c, "plain");
    let running = c.run_subsetter(Arc::new(LeastLoaded));
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_activators_available") == 4
    })
    .await?;

    c.create_revision("plain", spec(0, 0, Some(3))).await?;
    c.create_revision("gpu", tolerating_gpu(spec(0, 0, Some(3))))
        .await?;
    let plain = c
        .wait_endpoints("plain", |ae| members(ae).len() == 2)
        .await?;
    let plain_members: BTreeSet<String> = members(&plain).into_iter().collect();
    assert_eq!(plain_members, BTreeSet::from(["n1".into(), "n2".into()]));
    assert_eq!(
        ae_condition(&plain, "Degraded"),
        Some(("True".into(), "InsufficientActivators".into()))
    );
    // The subset turned Degraded: a Warning Event on the Revision says why.
    let event = degraded_event(&c, "plain").await?;
    assert_eq!(event.reason.as_deref(), Some("InsufficientActivators"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let gpu = c.wait_endpoints("gpu", |ae| members(ae).len() == 3).await?;
    let gpu_members: BTreeSet<String> = members(&gpu).into_iter().collect();
    assert_eq!(
        gpu_members,
        BTreeSet::from(["n1".into(), "n2".into(), "n3".into()]),
        "the toleration admits n3; n4 is still not-ready"
    );
    // The gauge an operator alerts on counts `plain` (2 of 3), not `gpu`.
    c.wait_metrics(&running, |m| counter(m, "subsetter_subsets_short") == 1)
        .await?;

    // A reconcile of `plain` with n4 in the activator set (a new generation, observed in its
    // status) still leaves n4 out.
    let revs = c.revisions();
    revs.patch(
        "plain",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"idleTimeoutSeconds": 301}})),
    )
    .await?;
    let generation = revs.get("plain").await?.metadata.generation;
    let plain = c
        .wait_endpoints("plain", |ae| {
            ae.status.as_ref().and_then(|s| s.observed_generation) == generation
        })
        .await?;
    assert!(!members(&plain).contains(&"n4".to_string()));

    // The lifecycle controller lifts n4's taint: the short subset takes it.
    set_taints(&c, "n4", json!([])).await?;
    let plain = c
        .wait_endpoints("plain", |ae| members(ae).len() == 3)
        .await?;
    assert!(members(&plain).contains(&"n4".to_string()));

    // Tainting a member's node takes it out of the subsets that do not tolerate it.
    set_taints(
        &c,
        "n1",
        json!([{"key": "maintenance", "value": "", "effect": "NoExecute"}]),
    )
    .await?;
    let plain = c
        .wait_endpoints("plain", |ae| !members(ae).contains(&"n1".to_string()))
        .await?;
    assert_eq!(members(&plain).len(), 2);

    let seen = plain_seen.lock().unwrap().clone();
    assert!(!seen.is_empty());
    for set in &seen {
        assert!(!set.contains("n3"), "n3's taint is not tolerated: {seen:?}");
    }
    running.stop().await
}

#[tokio::test]
async fn a_node_turning_not_ready_is_repaired_and_its_return_moves_nothing() -> Result<()> {
    let c = Cluster::start().await?;
    for (i, n) in ["m1", "m2", "m3", "m4"].iter().enumerate() {
        node(&c, n, json!([]), true).await?;
        c.add_activator(n, &format!("127.0.7.{}", i + 1)).await?;
    }
    let running = c.run_subsetter(Arc::new(LeastLoaded));
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_activators_available") == 4
    })
    .await?;
    let names: Vec<String> = (0..4).map(|i| format!("s{i}")).collect();
    for n in &names {
        c.create_revision(n, spec(0, 0, Some(2))).await?;
    }
    let mut before = Vec::new();
    for n in &names {
        before.push(c.wait_endpoints(n, ready_with(2)).await?);
    }
    let victim = members(&before[0])[0].clone();
    let had: Vec<&String> = names
        .iter()
        .zip(&before)
        .filter(|(_, ae)| members(ae).contains(&victim))
        .map(|(n, _)| n)
        .collect();

    // The kubelet reports NotReady: every subset that had the node is repaired, the others
    // are not written.
    let nodes: Api<Node> = Api::all(c.client.clone());
    let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    let t = std::time::Instant::now();
    nodes
        .patch_status(&victim, &PatchParams::default(), &Patch::Merge(&not_ready))
        .await?;
    for n in &had {
        let v = victim.clone();
        c.wait_endpoints(n, move |ae| ready_with(2)(ae) && !members(ae).contains(&v))
            .await?;
    }
    eprintln!(
        "{} subset(s) repaired {:?} after node {victim} turned NotReady",
        had.len(),
        t.elapsed()
    );
    let mut after = Vec::new();
    for (n, b) in names.iter().zip(&before) {
        let ae = c.endpoints().get(n).await?;
        if !had.contains(&n) {
            assert_eq!(
                ae.metadata.resource_version, b.metadata.resource_version,
                "{n} was written"
            );
        }
        after.push(ae);
    }

    // Ready again: its activator is back, and nothing moves (no churn).
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    nodes
        .patch_status(&victim, &PatchParams::default(), &Patch::Merge(&ready))
        .await?;
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_activators_available") == 4
    })
    .await?;
    // A reconcile that started on the change has run once a later one has: touch the last
    // revision and wait for its new generation to be observed.
    c.revisions()
        .patch(
            &names[3],
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"idleTimeoutSeconds": 301}})),
        )
        .await?;
    let generation = c.revisions().get(&names[3]).await?.metadata.generation;
    c.wait_endpoints(&names[3], |ae| {
        ae.status.as_ref().and_then(|s| s.observed_generation) == generation
    })
    .await?;
    for (n, a) in names.iter().zip(&after).take(3) {
        let now = c.endpoints().get(n).await?;
        assert_eq!(
            members(&now),
            members(a),
            "{n} changed members when the node came back"
        );
    }
    running.stop().await
}

/// A revision whose template tolerates no node's taint has no member, and its conditions say
/// why: activators are Ready, none is on a node that can run it, and which taint (not "no
/// Ready activator is available", which sends an operator to the activators).
#[tokio::test]
async fn no_eligible_node_says_which_taint_keeps_the_revision_out() -> Result<()> {
    let c = Cluster::start().await?;
    for (i, n) in ["t1", "t2"].iter().enumerate() {
        node(
            &c,
            n,
            json!([{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]),
            true,
        )
        .await?;
        c.add_activator(n, &format!("127.0.2.{}", i + 11)).await?;
    }
    let running = c.run_subsetter(Arc::new(LeastLoaded));
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_activators_available") == 2
    })
    .await?;
    c.create_revision("shy", spec(0, 0, Some(2))).await?;
    let ae = c
        .wait_endpoints("shy", |ae| ae_condition(ae, "Ready").is_some())
        .await?;
    let ready = condition(&ae.status.as_ref().unwrap().conditions, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "NoEligibleActivators")
    );
    assert!(
        ready
            .message
            .starts_with("2 Ready activator(s), none on a node that can run")
            && ready.message.contains("taint dedicated=infra:NoSchedule")
            && ready.message.contains("and 1 more"),
        "{}",
        ready.message
    );
    let rev = c
        .wait_revision("shy", |r| {
            r.status
                .as_ref()
                .and_then(|s| condition(&s.conditions, "Ready"))
                .is_some_and(|c| c.reason == "NoEligibleActivators")
        })
        .await?;
    let rev_ready = condition(&rev.status.as_ref().unwrap().conditions, "Ready").unwrap();
    assert_eq!(rev_ready.message, ready.message);
    running.stop().await?;
    Ok(())
}

/// A Node NotReady alone is a node failure, repaired as soon as the watch shows it; a second
/// right after it (within `loss_burst::WINDOW`) may be the start of a disruption and waits
/// `LOSS_SETTLE` — here two of three nodes NotReady is one, so it is held. (Before, every
/// loss waited: the first node's subsets stayed too.)
#[tokio::test]
async fn a_lone_not_ready_node_is_repaired_at_once_and_a_second_right_after_is_held() -> Result<()>
{
    let c = Cluster::start().await?;
    for (i, n) in ["b1", "b2", "b3"].iter().enumerate() {
        node(&c, n, json!([]), true).await?;
        c.add_activator(n, &format!("127.0.7.{}", i + 1)).await?;
    }
    let running = c.run_subsetter(Arc::new(LeastLoaded));
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_activators_available") == 3
    })
    .await?;
    // One member each: least-loaded spreads them over the three nodes.
    let names: Vec<String> = (0..3).map(|i| format!("r{i}")).collect();
    let mut on = Vec::new();
    for n in &names {
        c.create_revision(n, spec(0, 0, Some(1))).await?;
        on.push(members(&c.wait_endpoints(n, ready_with(1)).await?)[0].clone());
    }
    let distinct: BTreeSet<&String> = on.iter().collect();
    assert_eq!(distinct.len(), 3, "one revision per node: {on:?}");
    let (first, second) = (on[0].clone(), on[1].clone());

    let nodes: Api<Node> = Api::all(c.client.clone());
    let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    for victim in [&first, &second] {
        nodes
            .patch_status(victim, &PatchParams::default(), &Patch::Merge(&not_ready))
            .await?;
    }
    // The first is repaired; the second, two of three nodes NotReady, is held.
    let f = first.clone();
    c.wait_endpoints(&names[0], move |ae| {
        ready_with(1)(ae) && !members(ae).contains(&f)
    })
    .await?;
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_disruption_holds_total") >= 1
    })
    .await?;
    let held = c.endpoints().get(&names[1]).await?;
    assert_eq!(
        members(&held),
        vec![second.clone()],
        "{second}'s revision keeps it through the disruption"
    );
    running.stop().await
}
