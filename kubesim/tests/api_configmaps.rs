//! ConfigMaps through kube-rs: a watch sees the create, each patch as MODIFIED and the delete;
//! `data`/`binaryData` survive writes; keys are checked as `ValidateConfigMap` does and an
//! immutable ConfigMap refuses changes to its data and its flag.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kubesim::api::{ApiServer, ApiServerConfig};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_sees_modified_and_deleted_with_data_kept() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let created = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "cfg", "labels": {"app": "subsetter"}},
                "data": {"policy": "random"},
                "binaryData": {"blob": "AAE="},
            }))?,
        )
        .await?;
    let rv = created.metadata.resource_version.clone().unwrap();
    let mut events = cms
        .watch(&WatchParams::default().labels("app=subsetter"), &rv)
        .await?
        .boxed();

    cms.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"policy": "least-loaded"}})),
    )
    .await?;
    let ev = tokio::time::timeout(WAIT, events.try_next())
        .await??
        .expect("an event");
    let WatchEvent::Modified(cm) = ev else {
        panic!("MODIFIED expected, got {ev:?}")
    };
    assert_eq!(cm.data.as_ref().unwrap()["policy"], "least-loaded");
    assert_eq!(cm.binary_data.as_ref().unwrap()["blob"].0, vec![0u8, 1]);

    // server-side apply keeps what it does not name
    cms.patch(
        "cfg",
        &PatchParams::apply("tuner"),
        &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
            "data": {"threshold": "3"},
        })),
    )
    .await?;
    let ev = tokio::time::timeout(WAIT, events.try_next())
        .await??
        .expect("an event");
    let WatchEvent::Modified(cm) = ev else {
        panic!("MODIFIED expected, got {ev:?}")
    };
    let data = cm.data.unwrap();
    assert_eq!(
        (data["policy"].as_str(), data["threshold"].as_str()),
        ("least-loaded", "3")
    );
    assert!(cm.binary_data.is_some());

    cms.delete("cfg", &DeleteParams::default()).await?;
    let ev = tokio::time::timeout(WAIT, events.try_next())
        .await??
        .expect("an event");
    assert!(matches!(ev, WatchEvent::Deleted(_)), "{ev:?}");
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn keys_and_immutability_are_validated() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    let bad: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "bad"}, "data": {"bad key": "v", "k": "v"}, "binaryData": {"k": "AAE="},
    }))?;
    let e = api_err(cms.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "ConfigMap \"bad\" is invalid: [data[bad key]: Invalid value: \"bad key\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+'), data[k]: Invalid value: \"k\": duplicate of key present in binaryData]"
    );

    let frozen: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "frozen"}, "data": {"k": "v"}, "binaryData": {"b": "AAE="},
        "immutable": true,
    }))?;
    cms.create(&PostParams::default(), &frozen).await?;
    let e = api_err(
        cms.patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(json!({"immutable": false, "binaryData": {"b": "AAI="}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    let causes: Vec<(String, String)> = e
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| (c.field, c.reason))
        .collect();
    assert_eq!(
        causes,
        [
            ("immutable".to_string(), "FieldValueForbidden".to_string()),
            ("binaryData".to_string(), "FieldValueForbidden".to_string()),
        ]
    );
    // an immutable ConfigMap can still be deleted
    cms.delete("frozen", &DeleteParams::default()).await?;
    assert_eq!(api_err(cms.get("frozen").await.unwrap_err()).code, 404);
    s.shutdown().await;
    Ok(())
}
