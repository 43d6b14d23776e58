//! `--namespace-selector` against kubesim: a namespace labelled as another subsetter's is left
//! alone (its Revisions get no ActivationEndpoints from this one), and one that starts or stops
//! matching is taken or left while the subsetter runs; a selector the API server refuses is
//! refused with its reason.

mod support;

use std::sync::Arc;

use anyhow::Result;
use crds::contract::{OTHER_SUBSETTERS_EXCLUDED, SUBSETTER_LABEL};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use subsetter::{Config, Random};
use support::*;

const MINE: &str = "mine";

async fn label(c: &Cluster, ns: &str, owner: Option<&str>) -> Result<()> {
    let api: Api<Namespace> = Api::all(c.client.clone());
    let patch = json!({ "metadata": { "labels": { SUBSETTER_LABEL: owner } } });
    api.patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn revision_in(c: &Cluster, ns: &str, name: &str) -> Result<()> {
    let mut r = crds::Revision::new(name, spec(3, 0, Some(2)));
    r.metadata.namespace = Some(ns.into());
    Api::<crds::Revision>::namespaced(c.client.clone(), ns)
        .create(&PostParams::default(), &r)
        .await?;
    Ok(())
}

async fn wait_assigned_in(c: &Cluster, ns: &str, name: &str) -> Result<()> {
    let api = Api::<crds::ActivationEndpoints>::namespaced(c.client.clone(), ns);
    let check = ready_with(2);
    tokio::time::timeout(
        WAIT,
        kube::runtime::wait::await_condition(api, name, move |o: Option<&_>| o.is_some_and(&check)),
    )
    .await??;
    Ok(())
}

async fn has_endpoints(c: &Cluster, ns: &str, name: &str) -> Result<bool> {
    let api = Api::<crds::ActivationEndpoints>::namespaced(c.client.clone(), ns);
    Ok(api.get_opt(name).await?.is_some())
}

#[tokio::test]
async fn namespaces_labelled_as_another_subsetters_are_left_alone_until_they_are_not() -> Result<()>
{
    let c = Cluster::start().await?;
    c.add_activator("n1", "127.0.0.11").await?;
    c.add_activator("n2", "127.0.0.12").await?;
    let mine: Namespace = serde_json::from_value(json!({ "metadata": { "name": MINE } }))?;
    Api::<Namespace>::all(c.client.clone())
        .create(&PostParams::default(), &mine)
        .await?;
    label(&c, NS, Some("rig-1")).await?;
    revision_in(&c, NS, "claimed").await?;
    revision_in(&c, MINE, "open").await?;

    let running = c.run_subsetter_with(
        Arc::new(Random::new()),
        Config {
            namespace_selector: Some(OTHER_SUBSETTERS_EXCLUDED.into()),
            ..Config::default()
        },
    );
    wait_assigned_in(&c, MINE, "open").await?;
    // Both were triggered together when it took the lead; the other subsetter's got nothing.
    assert!(
        !has_endpoints(&c, NS, "claimed").await?,
        "a Revision in a namespace labelled as another subsetter's was given a subset"
    );

    // The label removed: the namespace starts matching, its Revision is taken from the cache.
    label(&c, NS, None).await?;
    wait_assigned_in(&c, NS, "claimed").await?;

    // Labelled again, then a new namespace: once a Revision there is assigned, the namespace
    // watch has passed the relabelling (one watch, in order).
    label(&c, MINE, Some("canary")).await?;
    Api::<Namespace>::all(c.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "third" } }))?,
        )
        .await?;
    revision_in(&c, "third", "barrier").await?;
    wait_assigned_in(&c, "third", "barrier").await?;
    // A Revision created in the relabelled namespace, then one elsewhere: once the second is
    // assigned, the Revision watch has passed the first (again one watch, in order).
    revision_in(&c, MINE, "late").await?;
    revision_in(&c, "third", "later").await?;
    wait_assigned_in(&c, "third", "later").await?;
    assert!(
        !has_endpoints(&c, MINE, "late").await?,
        "a Revision created after its namespace was labelled as another's got a subset"
    );
    running.stop().await
}

#[tokio::test]
async fn a_selector_the_api_server_refuses_is_refused_with_its_reason() -> Result<()> {
    let c = Cluster::start().await?;
    let api: Api<Namespace> = Api::all(c.client.clone());
    let err = subsetter::namespaces::check_selector(&api, "a in (b")
        .await
        .expect_err("an unclosed set is not a selector");
    let text = err.to_string();
    assert!(
        text.starts_with("--namespace-selector \"a in (b\": ") && text.len() > 30,
        "{text}"
    );
    subsetter::namespaces::check_selector(&api, OTHER_SUBSETTERS_EXCLUDED).await?;
    Ok(())
}
