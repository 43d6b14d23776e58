//! The settings ConfigMap: its keys override the flags while it exists, a bad version is
//! refused whole, and deleting it restores the flags.

mod support;

use std::sync::Arc;

use anyhow::Result;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use subsetter::Config;
use subsetter::policy::LeastLoaded;
use support::*;

#[tokio::test]
async fn the_config_map_overrides_the_flags_until_it_is_deleted() -> Result<()> {
    let c = Cluster::start().await?;
    for i in 1..=5 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.4.{i}"))
            .await?;
    }
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), ACT_NS);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "subsetter-settings"},
        "data": {"maxNodeSelection": "2"},
    }))?;
    cms.create(&PostParams::default(), &cm).await?;
    let config = Config {
        settings_config_map: Some(("subsetter-settings".into(), ACT_NS.into())),
        ..Config::default()
    };
    let running = c.run_subsetter_with(Arc::new(LeastLoaded), config);
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_settings_applied_total") >= 1
    })
    .await?;
    // No spec.activators, containerConcurrency 0: N is maxNodeSelection, 2 from the ConfigMap.
    c.create_revision("two", spec(0, 0, None)).await?;
    c.wait_endpoints("two", ready_with(2)).await?;

    // A version with a typo is refused whole: the settings in force stay.
    cms.patch(
        "subsetter-settings",
        &PatchParams::default(),
        &Patch::Merge(&json!({"data": {"maxNodeSelection": "4", "maxNodeSelections": "1"}})),
    )
    .await?;
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_settings_refused_total") >= 1
    })
    .await?;
    c.create_revision("still-two", spec(0, 0, None)).await?;
    c.wait_endpoints("still-two", ready_with(2)).await?;

    // Deleted: the flags' maxNodeSelection (3) is back.
    cms.delete("subsetter-settings", &Default::default())
        .await?;
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_settings_reverted_total") >= 1
    })
    .await?;
    c.create_revision("three", spec(0, 0, None)).await?;
    c.wait_endpoints("three", ready_with(3)).await?;
    running.stop().await
}
