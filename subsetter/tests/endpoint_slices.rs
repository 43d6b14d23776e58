//! `--endpoint-slices`: one EndpointSlice per revision listing its activators, kept in step
//! with the subset, hidden from kube-proxy.

mod support;

use std::sync::Arc;

use anyhow::{Context as _, Result};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::wait::await_condition;
use subsetter::Config;
use subsetter::policy::LeastLoaded;
use support::*;

fn ips(s: &EndpointSlice) -> Vec<String> {
    let mut v: Vec<String> = s
        .endpoints
        .iter()
        .flatten()
        .flat_map(|e| e.addresses.clone())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn each_revision_gets_a_slice_that_follows_its_subset() -> Result<()> {
    let c = Cluster::start().await?;
    for i in 1..=3 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.6.{i}"))
            .await?;
    }
    let config = Config {
        endpoint_slices: true,
        ..Config::default()
    };
    let running = c.run_subsetter_with(Arc::new(LeastLoaded), config);
    c.create_revision("web", spec(0, 0, Some(2))).await?;
    let ae = c.wait_endpoints("web", ready_with(2)).await?;
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), NS);
    let want: Vec<String> = {
        let mut v: Vec<String> = ae
            .status
            .as_ref()
            .unwrap()
            .activators
            .iter()
            .map(|m| m.address.split(':').next().unwrap().to_owned())
            .collect();
        v.sort();
        v
    };
    let w = want.clone();
    let slice = tokio::time::timeout(
        WAIT,
        await_condition(
            slices.clone(),
            "web-activationendpoints",
            move |s: Option<&EndpointSlice>| s.is_some_and(|s| ips(s) == w),
        ),
    )
    .await
    .context("waiting for the slice")??
    .context("slice vanished")?;
    let labels = slice.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("service.kubernetes.io/service-proxy-name")
            .map(String::as_str),
        Some("local-activator")
    );
    assert_eq!(slice.address_type, "IPv4");

    // A member's activator goes: the slice follows the repaired subset.
    let gone = members(&ae)[0].clone();
    c.delete_activator(&gone).await?;
    let ae = c
        .wait_endpoints("web", |ae| {
            ready_with(2)(ae) && !members(ae).contains(&gone)
        })
        .await?;
    let mut want: Vec<String> = ae
        .status
        .unwrap()
        .activators
        .iter()
        .map(|m| m.address.split(':').next().unwrap().to_owned())
        .collect();
    want.sort();
    tokio::time::timeout(
        WAIT,
        await_condition(
            slices,
            "web-activationendpoints",
            move |s: Option<&EndpointSlice>| s.is_some_and(|s| ips(s) == want),
        ),
    )
    .await
    .context("waiting for the slice to follow")??;
    running.stop().await
}
