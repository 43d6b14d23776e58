//! The warm hand-over and Routes against kubesim: a newer revision claiming a host an older
//! one serves gets the host's label only once it has as many Ready pods as the older one
//! (its members asked to keep them started through `minPods`), or at its bound; a Route's
//! split is published as `status.routes` on the revisions' ActivationEndpoints, with a host
//! label each, waits for the gaining revision's pods, and a rollback is one edit.

mod support;

use std::sync::Arc;

use anyhow::Result;
use crds::contract::{REVISION_LABEL, host_label};
use crds::{ActivationEndpoints, HostShare, Revision, Route};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use subsetter::Random;
use support::*;

const HOST: &str = "shop.example.com";

fn has_host(ae: &ActivationEndpoints) -> bool {
    ae.labels().contains_key(&host_label(HOST))
}

fn min_pods(ae: &ActivationEndpoints) -> i32 {
    ae.status
        .as_ref()
        .map_or(0, |s| s.activators.iter().map(|m| m.min_pods).sum())
}

fn routes(ae: &ActivationEndpoints) -> Vec<HostShare> {
    ae.status
        .as_ref()
        .map(|s| s.routes.clone())
        .unwrap_or_default()
}

fn routes_ready(r: &Revision) -> Option<(String, String)> {
    r.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "RoutesReady")
            .map(|c| (c.status.clone(), c.reason.clone()))
    })
}

async fn create(c: &Cluster, name: &str, bound: Option<i64>) -> Result<()> {
    let mut s = spec(0, 0, Some(2));
    s.hosts = vec![HOST.into()];
    s.hand_over_timeout_seconds = bound;
    c.create_revision(name, s).await?;
    Ok(())
}

/// An app pod of `rev`, as an activator creates it, Ready as its kubelet reports.
async fn app_pod(c: &Cluster, rev: &str, name: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let pod = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: Some([(REVISION_LABEL.to_owned(), rev.to_owned())].into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some("node-1".into()),
            containers: vec![Container {
                name: "app".into(),
                image: Some("app:1".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    pods.create(&PostParams::default(), &pod).await?;
    let patch = json!({ "status": { "phase": "Running", "podIP": "127.0.9.9",
        "conditions": [{ "type": "Ready", "status": "True",
                         "lastTransitionTime": "2026-01-01T00:00:00Z" }] }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_newer_revision_takes_a_served_host_once_it_has_the_pods() -> Result<()> {
    let c = Cluster::start().await?;
    c.add_activator("node-1", "127.0.1.1").await?;
    c.add_activator("node-2", "127.0.1.2").await?;
    let running = c.run_subsetter(Arc::new(Random::seeded(1)));

    // Nobody serves the host yet: v1 takes it at once.
    create(&c, "v1", None).await?;
    c.wait_endpoints("v1", has_host).await?;
    app_pod(&c, "v1", "v1-a").await?;
    app_pod(&c, "v1", "v1-b").await?;

    // v2 claims it: no label until it has v1's two pods; its members keep two started.
    create(&c, "v2", None).await?;
    let ae = c
        .wait_endpoints("v2", |ae| min_pods(ae) == 2 && !ae.labels().is_empty())
        .await?;
    assert!(!has_host(&ae), "v2 takes no host without pods");
    let r = c.wait_revision("v2", |r| routes_ready(r).is_some()).await?;
    assert_eq!(
        routes_ready(&r),
        Some(("False".into(), "WaitingForPods".into()))
    );
    let v1 = c.endpoints().get("v1").await?;
    assert!(ae_condition(&v1, "HostConflict").is_none(), "v1 keeps it");

    app_pod(&c, "v2", "v2-a").await?;
    let half = c.endpoints().get("v2").await?;
    assert!(!has_host(&half), "one of two is not enough");
    app_pod(&c, "v2", "v2-b").await?;
    let ae = c.wait_endpoints("v2", has_host).await?;
    c.wait_endpoints("v2", |ae| min_pods(ae) == 0).await?;
    assert!(has_host(&ae));
    c.wait_endpoints("v1", |ae| {
        ae_condition(ae, "HostConflict").is_some_and(|(s, _)| s == "True")
    })
    .await?;
    let r = c
        .wait_revision("v2", |r| routes_ready(r).is_some_and(|(s, _)| s == "True"))
        .await?;
    assert_eq!(
        routes_ready(&r),
        Some(("True".into(), "HostsRouted".into()))
    );
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_handovers_warm_total") == 1
    })
    .await?;

    // v3 with a one-second bound and no pods: it takes the host at the bound.
    create(&c, "v3", Some(1)).await?;
    c.wait_endpoints("v3", has_host).await?;
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_handovers_bound_total") == 1
    })
    .await?;
    running.stop().await
}

async fn apply_route(c: &Cluster, traffic: serde_json::Value) -> Result<()> {
    let api: Api<Route> = Api::namespaced(c.client.clone(), NS);
    let route: Route = serde_json::from_value(json!({
        "apiVersion": "local-activator.dev/v1alpha1",
        "kind": "Route",
        "metadata": { "name": "shop", "namespace": NS },
        "spec": { "hosts": [HOST], "traffic": traffic },
    }))?;
    match api.get_opt("shop").await? {
        None => {
            api.create(&PostParams::default(), &route).await?;
        }
        Some(_) => {
            api.patch(
                "shop",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "traffic": route.spec.traffic } })),
            )
            .await?;
        }
    }
    Ok(())
}

fn share(percent: i32) -> Vec<HostShare> {
    vec![HostShare {
        host: HOST.into(),
        percent,
    }]
}

#[tokio::test]
async fn a_route_splits_a_host_and_rolls_back_in_one_edit() -> Result<()> {
    let c = Cluster::start().await?;
    c.add_activator("node-1", "127.0.1.1").await?;
    let running = c.run_subsetter(Arc::new(Random::seeded(1)));
    create(&c, "v1", None).await?;
    c.wait_endpoints("v1", has_host).await?;
    app_pod(&c, "v1", "v1-a").await?;
    create(&c, "v2", Some(0)).await?;
    c.wait_endpoints("v2", has_host).await?;
    app_pod(&c, "v2", "v2-a").await?;

    // 10/90, with tag `canary` for v1.
    apply_route(
        &c,
        json!([{ "revisionName": "v1", "percent": 10, "tag": "canary" },
               { "revisionName": "v2", "percent": 90 }]),
    )
    .await?;
    let canary = host_label(&format!("canary-{HOST}"));
    let v1 = c
        .wait_endpoints("v1", |ae| {
            routes(ae).iter().any(|r| r.host == HOST) && ae.labels().contains_key(&canary)
        })
        .await?;
    let mut want = vec![
        HostShare {
            host: format!("canary-{HOST}"),
            percent: 100,
        },
        share(10)[0].clone(),
    ];
    want.sort_by(|a, b| a.host.cmp(&b.host));
    assert_eq!(routes(&v1), want);
    c.wait_endpoints("v2", |ae| routes(ae) == share(90)).await?;
    let api: Api<Route> = Api::namespaced(c.client.clone(), NS);
    let r = api.get("shop").await?;
    assert_eq!(
        r.status.and_then(|s| s.summary).as_deref(),
        Some("v1=10% v2=90%")
    );

    // Rollback: one edit. v1 takes all of it once it has the pods serving the host now (two).
    app_pod(&c, "v1", "v1-b").await?;
    apply_route(&c, json!([{ "revisionName": "v1", "percent": 100 }])).await?;
    c.wait_endpoints("v1", |ae| routes(ae) == share(100))
        .await?;
    c.wait_endpoints("v2", |ae| routes(ae).is_empty()).await?;

    // An invalid edit (percents summing to 90) is refused by the subsetter's check too, and
    // what is served stays.
    let bad = json!({ "spec": { "traffic": [{ "revisionName": "v2", "percent": 90 }] } });
    if api
        .patch("shop", &PatchParams::default(), &Patch::Merge(bad))
        .await
        .is_ok()
    {
        let r = tokio::time::timeout(
            WAIT,
            kube::runtime::wait::await_condition(api.clone(), "shop", |o: Option<&Route>| {
                o.and_then(|r| r.status.as_ref()).is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.reason == "InvalidRoute")
                })
            }),
        )
        .await??
        .expect("route");
        assert_eq!(r.status.and_then(|s| s.summary).as_deref(), Some("v1=100%"));
    }
    let v1 = c.endpoints().get("v1").await?;
    assert_eq!(routes(&v1), share(100));
    running.stop().await
}

#[tokio::test]
async fn a_gradual_rollout_moves_in_steps() -> Result<()> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let c = Cluster::start().await?;
    c.add_activator("node-1", "127.0.1.1").await?;
    let running = c.run_subsetter(Arc::new(Random::seeded(1)));
    create(&c, "v1", None).await?;
    c.wait_endpoints("v1", has_host).await?;
    app_pod(&c, "v1", "v1-a").await?;
    create(&c, "v2", Some(0)).await?;
    app_pod(&c, "v2", "v2-a").await?;
    apply_route(&c, json!([{ "revisionName": "v1", "percent": 100 }])).await?;
    c.wait_endpoints("v1", |ae| routes(ae) == share(100))
        .await?;

    // Every summary the Route's status shows while it rolls out to v2 over two seconds.
    let api: Api<Route> = Api::namespaced(c.client.clone(), NS);
    let seen = tokio::spawn({
        let api = api.clone();
        async move {
            let mut summaries: Vec<String> = Vec::new();
            let mut events = std::pin::pin!(
                watcher(api, watcher::Config::default().fields("metadata.name=shop"))
                    .applied_objects()
            );
            while let Some(Ok(r)) = events.next().await {
                let s = r.status.and_then(|s| s.summary).unwrap_or_default();
                if summaries.last() != Some(&s) {
                    summaries.push(s.clone());
                }
                if s == "v2=100%" {
                    break;
                }
            }
            summaries
        }
    });
    api.patch(
        "shop",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": {
            "rolloutDurationSeconds": 2,
            "traffic": [{ "revisionName": "v2", "percent": 100 }],
        }})),
    )
    .await?;
    let summaries = tokio::time::timeout(WAIT, seen).await??;
    let steps: Vec<&String> = summaries
        .iter()
        .filter(|s| s.contains("v1=") && s.contains("v2="))
        .collect();
    assert!(
        !steps.is_empty(),
        "no step between v1=100% and v2=100%: {summaries:?}"
    );
    assert_eq!(summaries.last().map(String::as_str), Some("v2=100%"));
    c.wait_endpoints("v1", |ae| routes(ae).is_empty()).await?;
    running.stop().await
}
