//! Image locality end to end: members are chosen among the nodes whose `status.images` hold the
//! revision's image while the load allows, the ActivationEndpoints says how many members hold
//! it, and a member's node pulling the image updates that count without moving anyone.

mod support;

use std::sync::Arc;

use anyhow::Result;
use crds::ImageMembers;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use subsetter::policy::LeastLoaded;
use support::*;

const DIGEST: &str = "sha256:4f6c1ce2e5a41d3ad3b5c7eab0a2f6fd7e6f1a0f0c63f7b7e0d3a4c2b1e0f9a8";

/// A Ready, untainted Node reporting `images` (each a list of names, as containerd gives them).
async fn node(c: &Cluster, name: &str, images: serde_json::Value) -> Result<()> {
    let nodes: Api<Node> = Api::all(c.client.clone());
    let n: Node = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    nodes.create(&PostParams::default(), &n).await?;
    set_status(c, name, images).await?;
    // The lifecycle controller's part: the not-ready taint the API server added goes.
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"taints": []}})),
        )
        .await?;
    Ok(())
}

async fn set_status(c: &Cluster, name: &str, images: serde_json::Value) -> Result<()> {
    let nodes: Api<Node> = Api::all(c.client.clone());
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True"}],
        "images": images,
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

fn with_image(mut spec: crds::RevisionSpec, image: &str) -> crds::RevisionSpec {
    let mut template = spec.template.value();
    template["spec"]["containers"][0]["image"] = json!(image);
    spec.template = template.into();
    spec
}

fn image_members(ae: &crds::ActivationEndpoints) -> Option<ImageMembers> {
    ae.status.as_ref()?.image_members
}

#[tokio::test]
async fn members_are_the_nodes_holding_the_image_and_the_status_counts_them() -> Result<()> {
    let c = Cluster::start().await?;
    let app = json!([{"names": [format!("registry:5000/app@{DIGEST}"), "registry:5000/app:v1"]}]);
    let other = json!([{"names": ["docker.io/library/busybox:1.36"]}]);
    for (i, n) in ["n1", "n2", "n3", "n4", "n5"].iter().enumerate() {
        let images = if ["n2", "n4"].contains(n) {
            &app
        } else {
            &other
        };
        node(&c, n, images.clone()).await?;
        c.add_activator(n, &format!("127.0.9.{}", i + 1)).await?;
    }
    let running = c.run_subsetter(Arc::new(LeastLoaded));
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_activators_available") == 5
    })
    .await?;

    // By tag: the two holders are as idle as the rest, so they are the members.
    c.create_revision(
        "by-tag",
        with_image(spec(0, 0, Some(2)), "registry:5000/app:v1"),
    )
    .await?;
    let ae = c.wait_endpoints("by-tag", ready_with(2)).await?;
    let mut got = members(&ae);
    got.sort();
    assert_eq!(got, ["n2", "n4"]);
    assert_eq!(image_members(&ae), Some(ImageMembers { holding: 2, of: 2 }));

    // By digest (a tag beside it does not matter), the same holders: but they are one subset
    // busier than three idle nodes now, and below a least load of 50 the balance bound
    // leaves locality no slack (`policy::locality_slack`): it only breaks ties, so the idle
    // nodes win and no member holds the image.
    c.create_revision(
        "by-digest",
        with_image(
            spec(0, 0, Some(2)),
            &format!("registry:5000/app:v2@{DIGEST}"),
        ),
    )
    .await?;
    let ae = c.wait_endpoints("by-digest", ready_with(2)).await?;
    let got = members(&ae);
    assert!(
        got.iter().all(|n| !["n2", "n4"].contains(&n.as_str())),
        "n2 and n4 are busier than three idle nodes: {got:?}"
    );
    assert_eq!(image_members(&ae), Some(ImageMembers { holding: 0, of: 2 }));

    // A member's node pulls the image (its next status update lists it): the count follows,
    // and the members stay where they are.
    let pulled = &got[0];
    set_status(
        &c,
        pulled,
        json!([
            {"names": ["docker.io/library/busybox:1.36"]},
            {"names": [format!("registry:5000/app@{DIGEST}")]},
        ]),
    )
    .await?;
    let after = c
        .wait_endpoints("by-digest", |ae| {
            image_members(ae) == Some(ImageMembers { holding: 1, of: 2 })
        })
        .await?;
    assert_eq!(members(&after), got, "an image pull moves no member");

    // No image on any node: counted as none of the members.
    c.create_revision("nowhere", with_image(spec(0, 0, Some(3)), "nginx"))
        .await?;
    let ae = c.wait_endpoints("nowhere", ready_with(3)).await?;
    assert_eq!(image_members(&ae), Some(ImageMembers { holding: 0, of: 3 }));
    running.stop().await
}
