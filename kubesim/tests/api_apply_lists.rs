//! Server-side apply on custom resources follows the schema's list types: a
//! `x-kubernetes-list-type: map` list is owned element by element (by its map keys) and a
//! `set` value by value, so two managers can each own their part of one list; lists without a
//! type stay atomic.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use kubesim::api::{ApiServer, ApiServerConfig};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

async fn with_crd() -> anyhow::Result<(ApiServer, Client, Api<DynamicObject>)> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let client = s.client();
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object", "properties": {
                    "members": {
                        "type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["node"],
                        "items": {"type": "object", "required": ["node"], "properties": {
                            "node": {"type": "string"}, "weight": {"type": "integer"}}},
                    },
                    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                    "plain": {"type": "array", "items": {"type": "string"}},
                }}},
            }}}],
        },
    }))?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd).await?;
    tokio::time::timeout(
        WAIT,
        await_condition(
            crds,
            "widgets.example.com",
            conditions::is_crd_established(),
        ),
    )
    .await??;
    let ar = ApiResource {
        group: "example.com".into(),
        version: "v1".into(),
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let api = Api::namespaced_with(client.clone(), "default", &ar);
    Ok((s, client, api))
}

fn widget(spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec})
}

async fn apply(
    api: &Api<DynamicObject>,
    manager: &str,
    spec: Value,
) -> kube::Result<DynamicObject> {
    api.patch(
        "w",
        &PatchParams::apply(manager),
        &Patch::Apply(widget(spec)),
    )
    .await
}

fn nodes(o: &DynamicObject) -> Vec<String> {
    o.data["spec"]["members"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|e| e["node"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn map_and_set_lists_are_owned_per_element() -> anyhow::Result<()> {
    let (s, _client, api) = with_crd().await?;
    apply(
        &api,
        "alice",
        json!({"members": [{"node": "a", "weight": 1}], "tags": ["x"]}),
    )
    .await?;
    let both = apply(
        &api,
        "bob",
        json!({"members": [{"node": "b", "weight": 2}], "tags": ["y"]}),
    )
    .await?;
    assert_eq!(
        nodes(&both),
        vec!["a", "b"],
        "each manager keeps its element"
    );
    assert_eq!(both.data["spec"]["tags"], json!(["x", "y"]));

    // Ownership is recorded per element, in the real field-path syntax.
    let alice = both
        .managed_fields()
        .iter()
        .find(|m| m.manager.as_deref() == Some("alice"))
        .expect("alice's entry");
    let fields = serde_json::to_string(&alice.fields_v1)?;
    assert!(fields.contains(r#"k:{\"node\":\"a\"}"#), "{fields}");
    assert!(fields.contains(r#"v:\"x\""#), "{fields}");

    // Another manager's element is a conflict only where the values differ.
    let e = apply(
        &api,
        "bob",
        json!({"members": [{"node": "a", "weight": 9}, {"node": "b", "weight": 2}]}),
    )
    .await
    .unwrap_err();
    let kube::Error::Api(status) = e else {
        panic!("an API error")
    };
    assert_eq!(status.code, 409);
    assert!(
        status.message.contains("conflict with \"alice\""),
        "{}",
        status.message
    );

    // Alice stops applying her element: only hers goes.
    let after = apply(&api, "alice", json!({"tags": ["x"]})).await?;
    assert_eq!(nodes(&after), vec!["b"]);
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn untyped_lists_stay_atomic() -> anyhow::Result<()> {
    let (s, _client, api) = with_crd().await?;
    apply(&api, "alice", json!({"plain": ["x"]})).await?;
    let e = apply(&api, "bob", json!({"plain": ["y"]}))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = e else {
        panic!("an API error")
    };
    assert_eq!(status.code, 409, "the whole list is alice's");
    let forced = api
        .patch(
            "w",
            &PatchParams::apply("bob").force(),
            &Patch::Apply(widget(json!({"plain": ["y"]}))),
        )
        .await?;
    assert_eq!(forced.data["spec"]["plain"], json!(["y"]));
    assert_eq!(forced.name_any(), "w");
    s.shutdown().await;
    Ok(())
}
