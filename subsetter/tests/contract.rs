//! `verify-contract` finds nothing in what the subsetter wrote, and catches a hand-broken
//! ActivationEndpoints.

mod support;

use std::sync::Arc;

use anyhow::Result;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use subsetter::contract::{check, read_cluster};
use subsetter::policy::LeastLoaded;
use support::*;

fn rules(b: &[subsetter::contract::Breach]) -> Vec<&'static str> {
    b.iter().map(|b| b.rule).collect()
}

#[tokio::test]
async fn what_the_subsetter_writes_keeps_the_contract_and_a_broken_object_does_not() -> Result<()> {
    let c = Cluster::start().await?;
    for i in 1..=4 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.3.{i}"))
            .await?;
    }
    let running = c.run_subsetter(Arc::new(LeastLoaded));
    let mut hosted = spec(4, 1, None);
    hosted.hosts = vec!["shop.example.com".into()];
    c.create_revision("shop", hosted).await?;
    c.create_revision("plain", spec(0, 0, Some(2))).await?;
    c.wait_endpoints("shop", ready_with(3)).await?;
    c.wait_endpoints("plain", ready_with(2)).await?;
    running.stop().await?;

    let found = check(&read_cluster(&c.client).await?);
    assert!(found.is_empty(), "{found:#?}");

    // Break "shop" by hand: shares above maxScale, a member that is not an activator, and a
    // member label dropped.
    let ae = c.endpoints().get("shop").await?;
    let mut members = serde_json::to_value(&ae.status.as_ref().unwrap().activators)?;
    members[0]["maxPods"] = json!(9);
    members[1]["node"] = json!("node-9");
    c.endpoints()
        .patch_status(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"activators": members}})),
        )
        .await?;
    let found = check(&read_cluster(&c.client).await?);
    let r = rules(&found);
    assert!(r.contains(&"maxPods"), "{found:#?}");
    assert!(r.contains(&"members"), "{found:#?}");
    assert!(r.contains(&"member labels"), "{found:#?}");
    assert!(found.iter().all(|b| b.object == "apps/shop"), "{found:#?}");

    // A Revision without its object.
    c.endpoints().delete("plain", &Default::default()).await?;
    let found = check(&read_cluster(&c.client).await?);
    assert!(
        found
            .iter()
            .any(|b| b.object == "apps/plain" && b.rule == "one ActivationEndpoints per Revision"),
        "{found:#?}"
    );
    Ok(())
}
