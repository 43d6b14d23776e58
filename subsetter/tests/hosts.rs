//! Host labels and HostConflict against kubesim: each host of a revision is a label on its
//! ActivationEndpoints (any spelling of a host is one label), found by one label-selected
//! LIST across namespaces; where two revisions claim a host the older one is marked, and the
//! mark goes when the newer one stops claiming it or is deleted.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::Result;
use crds::contract::{HOST_LABEL_PREFIX, host_label, host_selector};
use crds::{ActivationEndpoints, Revision};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use subsetter::Random;
use support::*;

const OTHER_NS: &str = "other";

fn host_labels(ae: &ActivationEndpoints) -> BTreeSet<String> {
    ae.labels()
        .keys()
        .filter(|k| k.starts_with(HOST_LABEL_PREFIX))
        .cloned()
        .collect()
}

fn labels_of(hosts: &[&str]) -> BTreeSet<String> {
    hosts.iter().map(|h| host_label(h)).collect()
}

fn ready(ae: &ActivationEndpoints) -> bool {
    ae_condition(ae, "Ready").is_some_and(|(s, _)| s == "True")
}

fn conflicted(ae: &ActivationEndpoints) -> bool {
    ae_condition(ae, "HostConflict").is_some_and(|(s, _)| s == "True")
}

/// What an activator meeting an unknown Host does: one LIST across namespaces, selected by the
/// host label and served from the API server's cache (resourceVersion=0).
async fn lookup(c: &Cluster, host: &str) -> Result<BTreeSet<String>> {
    let lp = ListParams::default()
        .labels(&host_selector(host))
        .match_any();
    let list = Api::<ActivationEndpoints>::all(c.client.clone())
        .list(&lp)
        .await?;
    Ok(list
        .items
        .iter()
        .map(|a| format!("{}/{}", a.namespace().unwrap_or_default(), a.name_any()))
        .collect())
}

fn names(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

async fn set_hosts(c: &Cluster, name: &str, hosts: &[&str]) -> Result<()> {
    c.revisions()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "hosts": hosts } })),
        )
        .await?;
    Ok(())
}

async fn create_with_hosts(c: &Cluster, ns: &str, name: &str, hosts: &[&str]) -> Result<()> {
    let mut s = spec(0, 0, Some(1));
    s.hosts = hosts.iter().map(|h| (*h).to_owned()).collect();
    // These tests are about claims and labels: a newer claimant takes a host at once, as
    // with no pods to wait for (the warm hand-over has its own tests, `handover.rs`).
    s.hand_over_timeout_seconds = Some(0);
    let mut r = Revision::new(name, s);
    r.metadata.namespace = Some(ns.into());
    Api::<Revision>::namespaced(c.client.clone(), ns)
        .create(&PostParams::default(), &r)
        .await?;
    Ok(())
}

#[tokio::test]
async fn each_host_is_one_label_found_by_a_cluster_wide_lookup() -> Result<()> {
    let c = Cluster::start().await?;
    let ns: Namespace = serde_json::from_value(json!({ "metadata": { "name": OTHER_NS } }))?;
    Api::<Namespace>::all(c.client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    c.add_activator("node-1", "127.0.1.1").await?;
    let running = c.run_subsetter(Arc::new(Random::seeded(1)));

    create_with_hosts(
        &c,
        NS,
        "web",
        &[
            "App.Example.com:8080",
            "app.example.com.",
            "api.example.com",
        ],
    )
    .await?;
    create_with_hosts(&c, OTHER_NS, "elsewhere", &["other.example.com"]).await?;
    let want = labels_of(&["app.example.com", "api.example.com"]);
    let ae = c
        .wait_endpoints("web", |ae| ready(ae) && host_labels(ae) == want)
        .await?;
    assert!(ae.labels().values().all(String::is_empty));
    assert!(!conflicted(&ae));
    let other = tokio::time::timeout(
        WAIT,
        kube::runtime::wait::await_condition(
            Api::<ActivationEndpoints>::namespaced(c.client.clone(), OTHER_NS),
            "elsewhere",
            |o: Option<&ActivationEndpoints>| o.is_some_and(|ae| !host_labels(ae).is_empty()),
        ),
    )
    .await??;
    assert!(other.is_some());

    // Any spelling of a host finds the one revision claiming it, in whatever namespace.
    for h in ["app.example.com", "APP.EXAMPLE.COM:443", "api.example.com"] {
        assert_eq!(lookup(&c, h).await?, names(&["apps/web"]), "{h}");
    }
    assert_eq!(
        lookup(&c, "other.example.com").await?,
        names(&["other/elsewhere"])
    );
    assert!(lookup(&c, "nobody.example.com").await?.is_empty());

    // Dropping a host removes its label; the members' labels stay.
    let members_before = members(&ae);
    set_hosts(&c, "web", &["api.example.com", "new.example.com"]).await?;
    let want = labels_of(&["api.example.com", "new.example.com"]);
    let ae = c
        .wait_endpoints("web", |ae| host_labels(ae) == want)
        .await?;
    assert_eq!(members(&ae), members_before);
    assert!(
        ae.labels()
            .contains_key(&crds::contract::member_label(&members_before[0]))
    );
    assert!(lookup(&c, "app.example.com").await?.is_empty());
    assert_eq!(lookup(&c, "new.example.com").await?, names(&["apps/web"]));
    running.stop().await
}

#[tokio::test]
async fn older_claimant_is_marked_until_the_newer_one_lets_go() -> Result<()> {
    let c = Cluster::start().await?;
    c.add_activator("node-1", "127.0.1.1").await?;
    let running = c.run_subsetter(Arc::new(Random::seeded(2)));

    create_with_hosts(&c, NS, "v1", &["shop.example.com", "v1.example.com"]).await?;
    let v1 = c.wait_endpoints("v1", ready).await?;
    assert!(!conflicted(&v1));

    // v2 is created after v1 and has the greater name: it is the newer claimant whichever of
    // creationTimestamp (seconds) and name decides.
    create_with_hosts(&c, NS, "v2", &["SHOP.example.com:443"]).await?;
    let v1 = c.wait_endpoints("v1", conflicted).await?;
    let cond = condition(&v1.status.as_ref().unwrap().conditions, "HostConflict").unwrap();
    assert_eq!(cond.reason, "HostClaimedByNewerRevision");
    assert!(
        cond.message.contains("shop.example.com"),
        "{}",
        cond.message
    );
    assert!(cond.message.contains("apps/v2"), "{}", cond.message);
    assert!(
        !cond.message.contains("v1.example.com"),
        "only the lost host: {}",
        cond.message
    );
    assert_eq!(
        host_labels(&v1),
        labels_of(&["shop.example.com", "v1.example.com"]),
        "the loser keeps its host labels"
    );
    // v1 is marked only once v2 can take the traffic.
    let v2 = c.endpoints().get("v2").await?;
    assert!(ready(&v2) && host_labels(&v2) == labels_of(&["shop.example.com"]));
    assert!(!conflicted(&v2), "the newer claimant is not marked");
    assert_eq!(
        lookup(&c, "shop.example.com").await?,
        names(&["apps/v1", "apps/v2"])
    );

    // v2 stops claiming the host: v1 is no longer marked.
    set_hosts(&c, "v2", &[]).await?;
    let v1 = c
        .wait_endpoints("v1", |ae| ready(ae) && !conflicted(ae))
        .await?;
    assert!(ae_condition(&v1, "HostConflict").is_none());
    c.wait_endpoints("v2", |ae| host_labels(ae).is_empty())
        .await?;

    // v2 claims it again, then is deleted: the mark comes, then goes.
    set_hosts(&c, "v2", &["shop.example.com"]).await?;
    c.wait_endpoints("v1", conflicted).await?;
    c.revisions().delete("v2", &Default::default()).await?;
    let v1 = c
        .wait_endpoints("v1", |ae| ready(ae) && !conflicted(ae))
        .await?;
    assert!(ae_condition(&v1, "HostConflict").is_none());
    assert_eq!(
        host_labels(&v1),
        labels_of(&["shop.example.com", "v1.example.com"])
    );
    running.stop().await
}
