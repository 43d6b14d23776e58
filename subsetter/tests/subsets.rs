//! The subsetter against kubesim: subsets appear with the contract's labels, owner, shares and
//! conditions; lost activators are repaired only where they were members; invalid revisions
//! and short subsets are reported.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use anyhow::Result;
use crds::contract::{MEMBER_LABEL_PREFIX, member_label};
use kube::ResourceExt;
use subsetter::{LeastLoaded, Random};
use support::*;

#[tokio::test]
async fn subset_has_members_labels_owner_shares_and_conditions() -> Result<()> {
    let c = Cluster::start().await?;
    for i in 1..=5 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.1.{i}"))
            .await?;
    }
    let running = c.run_subsetter(Arc::new(Random::seeded(1)));
    let rev = c.create_revision("hello", spec(5, 2, None)).await?;
    let ae = c.wait_endpoints("hello", ready_with(3)).await?;

    let status = ae.status.clone().unwrap();
    let nodes: HashSet<&str> = status.activators.iter().map(|m| m.node.as_str()).collect();
    assert_eq!(nodes.len(), 3, "members must be distinct");
    for m in &status.activators {
        let i: u32 = m.node.trim_start_matches("node-").parse()?;
        assert_eq!(m.address, format!("127.0.1.{i}:8080"));
        assert_eq!(m.pod, activator_pod(&m.node));
    }
    assert_eq!(status.activators.iter().map(|m| m.max_pods).sum::<i32>(), 5);
    assert_eq!(status.activators.iter().map(|m| m.min_pods).sum::<i32>(), 2);
    assert!(status.activators.iter().all(|m| m.min_pods <= m.max_pods));
    assert_eq!(status.policy.as_deref(), Some("random"));
    assert_eq!(status.observed_generation, rev.metadata.generation);
    assert_eq!(
        ae_condition(&ae, "Degraded"),
        Some(("False".into(), "FullSubset".into()))
    );

    let labels: BTreeMap<String, String> = ae.labels().clone();
    let wanted: BTreeMap<String, String> = status
        .activators
        .iter()
        .map(|m| (member_label(&m.node), String::new()))
        .collect();
    let member_labels: BTreeMap<String, String> = labels
        .into_iter()
        .filter(|(k, _)| k.starts_with(MEMBER_LABEL_PREFIX))
        .collect();
    assert_eq!(member_labels, wanted);

    let owner = ae
        .owner_references()
        .first()
        .cloned()
        .expect("ownerReference");
    assert_eq!(owner.controller, Some(true));
    assert_eq!(Some(owner.uid), rev.uid());
    assert_eq!(owner.kind, "Revision");

    // What each activator would see through its own label selector.
    for i in 1..=5 {
        let node = format!("node-{i}");
        let listed = c.listed_for(&node).await?;
        assert_eq!(
            listed.contains(&"hello".to_string()),
            nodes.contains(node.as_str())
        );
    }

    let rev = c
        .wait_revision("hello", |r| {
            r.status.as_ref().is_some_and(|s| {
                condition(&s.conditions, "Ready").is_some_and(|c| c.status == "True")
            })
        })
        .await?;
    assert_eq!(
        rev.status.unwrap().observed_generation,
        rev.metadata.generation
    );
    running.stop().await
}

#[tokio::test]
async fn lost_activator_is_replaced_only_where_it_was_a_member() -> Result<()> {
    let c = Cluster::start().await?;
    for i in 1..=6 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.1.{i}"))
            .await?;
    }
    let running = c.run_subsetter(Arc::new(LeastLoaded));
    let names: Vec<String> = (0..6).map(|i| format!("rev-{i}")).collect();
    for name in &names {
        c.create_revision(name, spec(0, 0, Some(2))).await?;
    }
    let mut before = BTreeMap::new();
    for name in &names {
        before.insert(name.clone(), c.wait_endpoints(name, ready_with(2)).await?);
    }
    // Six subsets of two over six idle activators: least-loaded gives each node exactly two.
    let mut load: BTreeMap<String, usize> = BTreeMap::new();
    for ae in before.values() {
        for n in members(ae) {
            *load.entry(n).or_default() += 1;
        }
    }
    assert!(load.values().all(|l| *l == 2), "unbalanced: {load:?}");

    for (lost, how) in [("node-1", "deleted"), ("node-2", "not ready")] {
        let text = running.subsetter.metrics().encode();
        let (joined0, left0) = (
            counter(&text, "subsetter_members_joined_total"),
            counter(&text, "subsetter_members_left_total"),
        );
        let had: Vec<&String> = names
            .iter()
            .filter(|n| members(&before[*n]).contains(&lost.to_string()))
            .collect();
        assert!(!had.is_empty());
        if how == "deleted" {
            c.delete_activator(lost).await?;
        } else {
            c.set_activator_ready(lost, "127.0.1.2", false).await?;
        }
        let mut after = before.clone();
        for name in &had {
            let gone = lost.to_string();
            let ae = c
                .wait_endpoints(name, move |ae| {
                    let member_labels = ae
                        .labels()
                        .keys()
                        .filter(|k| k.starts_with(MEMBER_LABEL_PREFIX))
                        .count();
                    members(ae).len() == 2
                        && !members(ae).contains(&gone)
                        && !ae.labels().contains_key(&member_label(&gone))
                        && member_labels == 2
                })
                .await?;
            // The surviving member keeps its slot.
            let old = members(&before[*name]);
            let new = members(&ae);
            for (slot, node) in old.iter().enumerate() {
                if node != lost {
                    assert_eq!(&new[slot], node, "{name}: {old:?} -> {new:?}");
                }
            }
            after.insert((*name).clone(), ae);
        }
        // Exactly one member joined and one left per affected revision: nothing else churned.
        let n = had.len() as u64;
        c.wait_metrics(&running, |t| {
            counter(t, "subsetter_members_left_total") >= left0 + n
        })
        .await?;
        let text = running.subsetter.metrics().encode();
        assert_eq!(
            counter(&text, "subsetter_members_joined_total"),
            joined0 + n
        );
        assert_eq!(counter(&text, "subsetter_members_left_total"), left0 + n);
        for name in names.iter().filter(|n| !had.contains(n)) {
            let now = c.endpoints().get(name).await?;
            assert_eq!(members(&now), members(&before[name]), "{name} changed");
            assert_eq!(
                now.resource_version(),
                before[name].resource_version(),
                "{name} rewritten"
            );
        }
        assert!(c.listed_for(lost).await?.is_empty(), "{lost} still listed");
        before = after;
    }
    running.stop().await
}

#[tokio::test]
async fn invalid_revision_is_reported_and_gets_no_subset() -> Result<()> {
    let c = Cluster::start().await?;
    c.add_activator("node-1", "127.0.1.1").await?;
    let running = c.run_subsetter(Arc::new(Random::seeded(2)));
    let mut bad = spec(0, 0, None);
    // The schema cannot check the (schemaless) template, so this one gets through.
    let mut template = bad.template.parse().unwrap();
    template.spec.as_mut().unwrap().containers.clear();
    bad.template = template.into();
    c.create_revision("broken", bad).await?;
    let rev = c
        .wait_revision("broken", |r| {
            r.status.as_ref().is_some_and(|s| {
                condition(&s.conditions, "Ready")
                    .is_some_and(|c| c.status == "False" && c.reason == "InvalidSpec")
            })
        })
        .await?;
    let cond = condition(&rev.status.as_ref().unwrap().conditions, "Ready").unwrap();
    assert!(cond.message.contains("containers"), "{}", cond.message);

    // A valid revision created afterwards is reconciled; by then the invalid one was long
    // done, so it having no ActivationEndpoints is a decision, not a race.
    c.create_revision("fine", spec(0, 0, None)).await?;
    c.wait_endpoints("fine", ready_with(1)).await?;
    assert!(c.endpoints().get_opt("broken").await?.is_none());
    running.stop().await
}

#[tokio::test]
async fn short_subset_is_degraded_and_grows_when_activators_arrive() -> Result<()> {
    let c = Cluster::start().await?;
    for i in 1..=3 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.1.{i}"))
            .await?;
    }
    let running = c.run_subsetter(Arc::new(Random::seeded(3)));
    c.create_revision("wide", spec(2, 1, Some(5))).await?;
    c.create_revision("single", spec(0, 0, Some(1))).await?;
    let ae = c.wait_endpoints("wide", ready_with(3)).await?;
    assert_eq!(
        ae_condition(&ae, "Degraded"),
        Some(("True".into(), "InsufficientActivators".into()))
    );
    let shares: Vec<i32> = ae
        .status
        .as_ref()
        .unwrap()
        .activators
        .iter()
        .map(|m| m.max_pods)
        .collect();
    assert_eq!(shares, vec![1, 1, 0], "maxScale 2 over 3 members");
    let first = members(&ae);

    let single = c.wait_endpoints("single", ready_with(1)).await?;
    assert_eq!(
        ae_condition(&single, "Degraded"),
        Some(("True".into(), "SingleActivator".into()))
    );

    for i in 4..=5 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.1.{i}"))
            .await?;
    }
    let ae = c
        .wait_endpoints("wide", |ae| {
            members(ae).len() == 5
                && ae_condition(ae, "Degraded").is_some_and(|(s, _)| s == "False")
        })
        .await?;
    assert_eq!(
        &members(&ae)[..3],
        &first[..],
        "existing members keep their slots"
    );
    let status = ae.status.unwrap();
    assert!(status.activators.iter().map(|m| m.max_pods).sum::<i32>() <= 2);
    assert_eq!(status.activators.iter().map(|m| m.min_pods).sum::<i32>(), 1);
    // The full N=1 subset was not short, so the new activators did not touch it.
    let single_now = c.endpoints().get("single").await?;
    assert_eq!(single_now.resource_version(), single.resource_version());
    running.stop().await
}

#[tokio::test]
async fn deleted_endpoints_are_recreated_and_unchanged_world_is_not_rewritten() -> Result<()> {
    let c = Cluster::start().await?;
    for i in 1..=4 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.1.{i}"))
            .await?;
    }
    let running = c.run_subsetter(Arc::new(Random::seeded(4)));
    c.create_revision("again", spec(0, 0, None)).await?;
    let ae = c.wait_endpoints("again", ready_with(3)).await?;
    let old_uid = ae.uid();
    c.endpoints().delete("again", &Default::default()).await?;
    let ae = c
        .wait_endpoints("again", move |ae| ae.uid() != old_uid && ready_with(3)(ae))
        .await?;
    // A Ready change of an activator that is not a member triggers nothing.
    let outsider = (1..=4)
        .map(|i| format!("node-{i}"))
        .find(|n| !members(&ae).contains(n))
        .unwrap();
    let writes = counter(
        &running.subsetter.metrics().encode(),
        "subsetter_writes_total",
    );
    c.set_activator_ready(&outsider, "127.0.9.9", true).await?;
    // A member's address change is written through. Activator events are handled in order,
    // so once it is, the outsider's change was handled too (and must have written nothing).
    let member = members(&ae)[0].clone();
    c.set_activator_ready(&member, "127.0.8.8", true).await?;
    let m2 = member.clone();
    let ae2 = c
        .wait_endpoints("again", move |ae| {
            ae.status
                .as_ref()
                .and_then(|s| s.member(&m2))
                .is_some_and(|m| m.address == "127.0.8.8:8080")
        })
        .await?;
    assert_eq!(
        members(&ae2),
        members(&ae),
        "an address change is not a membership change"
    );
    c.wait_metrics(&running, |t| counter(t, "subsetter_writes_total") > writes)
        .await?;
    let after = counter(
        &running.subsetter.metrics().encode(),
        "subsetter_writes_total",
    );
    assert_eq!(
        after,
        writes + 1,
        "only the member's address update was written"
    );
    running.stop().await
}
