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
                    "ports": {
                        "type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["port", "protocol"],
                        "items": {"type": "object", "required": ["port", "protocol"], "properties": {
                            "port": {"type": "integer"}, "protocol": {"type": "string"},
                            "name": {"type": "string"}}},
                    },
                    "groups": {"type": "object", "additionalProperties": {
                        "type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}},
                    "selector": {"type": "object", "x-kubernetes-map-type": "atomic",
                        "additionalProperties": {"type": "string"}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "slots": {
                        "type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name", "zone"],
                        "items": {"type": "object", "required": ["name"], "properties": {
                            "name": {"type": "string"},
                            "zone": {"type": "string", "default": "z1"},
                            "size": {"type": "integer"}}},
                    },
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
    assert_eq!(
        status.message,
        "Apply failed with 1 conflict: conflict with \"alice\": .spec.members[node=\"a\"].weight"
    );

    // Alice stops applying her element: only hers goes; her tag stays hers.
    let after = apply(&api, "alice", json!({"tags": ["x"]})).await?;
    assert_eq!(nodes(&after), vec!["b"]);
    assert_eq!(after.data["spec"]["tags"], json!(["x", "y"]));
    // Bob stops applying his tag: only his goes.
    let after = apply(
        &api,
        "bob",
        json!({"members": [{"node": "b", "weight": 2}]}),
    )
    .await?;
    assert_eq!(after.data["spec"]["tags"], json!(["x"]));
    // An element both apply (same values: no conflict) stays while either still applies it
    // (bob's apply changes only managedFields, and is written).
    apply(
        &api,
        "alice",
        json!({"tags": ["x"], "members": [{"node": "c", "weight": 3}]}),
    )
    .await?;
    apply(
        &api,
        "bob",
        json!({"members": [{"node": "b", "weight": 2}, {"node": "c", "weight": 3}]}),
    )
    .await?;
    let after = apply(&api, "alice", json!({"tags": ["x"]})).await?;
    assert_eq!(nodes(&after), vec!["b", "c"]);
    let after = apply(
        &api,
        "bob",
        json!({"members": [{"node": "b", "weight": 2}]}),
    )
    .await?;
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

fn entry_fields(o: &DynamicObject, manager: &str) -> String {
    let e = o
        .managed_fields()
        .iter()
        .find(|m| m.manager.as_deref() == Some(manager))
        .unwrap_or_else(|| panic!("{manager}'s managedFields entry"));
    serde_json::to_string(&e.fields_v1).expect("fieldsV1 serializes")
}

fn conflict(e: kube::Error) -> String {
    let kube::Error::Api(status) = e else {
        panic!("an API error, got {e:?}")
    };
    assert_eq!(status.code, 409, "{}", status.message);
    status.message
}

#[tokio::test]
async fn multi_key_maps_map_values_and_atomic_maps() -> anyhow::Result<()> {
    let (s, _client, api) = with_crd().await?;
    // a map list keyed by two fields, one an integer
    apply(
        &api,
        "alice",
        json!({"ports": [{"port": 80, "protocol": "TCP", "name": "http"}]}),
    )
    .await?;
    let both = apply(
        &api,
        "bob",
        json!({"ports": [{"port": 80, "protocol": "UDP", "name": "dns"}]}),
    )
    .await?;
    assert_eq!(both.data["spec"]["ports"].as_array().map(Vec::len), Some(2));
    let alice = entry_fields(&both, "alice");
    assert!(
        alice.contains(r#"k:{\"port\":80,\"protocol\":\"TCP\"}"#),
        "{alice}"
    );
    let msg = conflict(
        apply(
            &api,
            "bob",
            json!({"ports": [{"port": 80, "protocol": "TCP", "name": "web"}]}),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        msg,
        "Apply failed with 1 conflict: conflict with \"alice\": .spec.ports[port=80,protocol=\"TCP\"].name"
    );

    // lists that are the values of a map follow the map's value schema
    apply(&api, "alice", json!({"groups": {"ops": ["a"]}})).await?;
    let groups = apply(&api, "bob", json!({"groups": {"ops": ["b"]}})).await?;
    assert_eq!(groups.data["spec"]["groups"]["ops"], json!(["a", "b"]));
    let bob = entry_fields(&groups, "bob");
    assert!(bob.contains(r#""f:ops":{"v:\"b\"":{}}"#), "{bob}");

    // an atomic map is one value: a different one is a conflict, the same one is not, and
    // a forced apply replaces it whole; a granular map merges
    apply(
        &api,
        "alice",
        json!({"selector": {"app": "x"}, "labels": {"a": "1"}}),
    )
    .await?;
    let msg = conflict(
        apply(&api, "bob", json!({"selector": {"tier": "y"}}))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        msg,
        "Apply failed with 1 conflict: conflict with \"alice\": .spec.selector"
    );
    let same = apply(
        &api,
        "bob",
        json!({"selector": {"app": "x"}, "labels": {"b": "2"}}),
    )
    .await?;
    assert_eq!(same.data["spec"]["labels"], json!({"a": "1", "b": "2"}));
    let bob = entry_fields(&same, "bob");
    assert!(bob.contains(r#""f:selector":{}"#), "{bob}");
    let forced = api
        .patch(
            "w",
            &PatchParams::apply("bob").force(),
            &Patch::Apply(widget(json!({"selector": {"tier": "y"}}))),
        )
        .await?;
    assert_eq!(forced.data["spec"]["selector"], json!({"tier": "y"}));
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn update_managers_own_map_list_elements() -> anyhow::Result<()> {
    let (s, _client, api) = with_crd().await?;
    apply(
        &api,
        "alice",
        json!({"members": [{"node": "a", "weight": 1}, {"node": "b", "weight": 2}]}),
    )
    .await?;
    // A merge patch replaces the list; the Update entry claims only what changed.
    let patched = api
        .patch(
            "w",
            &PatchParams {
                field_manager: Some("carol".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"spec": {"members": [
                {"node": "a", "weight": 5}, {"node": "b", "weight": 2}]}})),
        )
        .await?;
    let carol = entry_fields(&patched, "carol");
    assert!(
        carol.contains(r#"k:{\"node\":\"a\"}":{"f:weight":{}}"#),
        "{carol}"
    );
    assert!(!carol.contains(r#"k:{\"node\":\"b\"}"#), "{carol}");
    let msg = conflict(
        apply(
            &api,
            "alice",
            json!({"members": [{"node": "a", "weight": 1}, {"node": "b", "weight": 2}]}),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        msg,
        "Apply failed with 1 conflict: conflict with \"carol\" using example.com/v1: .spec.members[node=\"a\"].weight"
    );
    s.shutdown().await;
    Ok(())
}

/// The project's ActivationEndpoints CRD: `status.activators` declares no list type, so it is
/// atomic (one owner, a second applier conflicts) — as on a real server; the same CRD with
/// `x-kubernetes-list-type: map` keyed by `node` lets each activator own its element.
#[tokio::test]
async fn activation_endpoints_activators_follow_what_the_crd_declares() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let client = s.client();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/crds/activationendpoints.yaml");
    let declared: Value = serde_saphyr::from_str(&std::fs::read_to_string(path)?)?;
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = "activationendpoints.local-activator.dev";
    let register = |crd: Value| {
        let crd_api = crd_api.clone();
        async move {
            let crd: CustomResourceDefinition = serde_json::from_value(crd)?;
            crd_api
                .patch(
                    name,
                    &PatchParams::apply("test").force(),
                    &Patch::Apply(&crd),
                )
                .await?;
            tokio::time::timeout(
                WAIT,
                await_condition(crd_api, name, conditions::is_crd_established()),
            )
            .await??;
            anyhow::Ok(())
        }
    };
    register(declared.clone()).await?;
    let ar = ApiResource::erase::<crds::ActivationEndpoints>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let status_of = |obj: &str, node: &str| {
        json!({
            "apiVersion": ar.api_version, "kind": ar.kind, "metadata": {"name": obj},
            "status": {"activators": [{"node": node, "address": format!("{node}:9000"), "pod": format!("act-{node}")}]},
        })
    };
    let nodes_of = |o: &DynamicObject| -> Vec<String> {
        o.data["status"]["activators"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a["node"].as_str().unwrap_or("").to_string())
            .collect()
    };

    let ae = |n: &str| json!({"apiVersion": ar.api_version, "kind": ar.kind, "metadata": {"name": n}, "spec": {}});
    api.create(
        &PostParams::default(),
        &serde_json::from_value(ae("atomic"))?,
    )
    .await?;
    api.patch_status(
        "atomic",
        &PatchParams::apply("node-a"),
        &Patch::Apply(status_of("atomic", "a")),
    )
    .await?;
    let msg = conflict(
        api.patch_status(
            "atomic",
            &PatchParams::apply("node-b"),
            &Patch::Apply(status_of("atomic", "b")),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        msg,
        "Apply failed with 1 conflict: conflict with \"node-a\" with subresource \"status\": .status.activators"
    );

    // The same CRD declaring the list a map keyed by node.
    let mut keyed = declared;
    let activators = keyed
        .pointer_mut(
            "/spec/versions/0/schema/openAPIV3Schema/properties/status/properties/activators",
        )
        .expect("status.activators in the CRD");
    activators["x-kubernetes-list-type"] = json!("map");
    activators["x-kubernetes-list-map-keys"] = json!(["node"]);
    register(keyed).await?;
    api.create(
        &PostParams::default(),
        &serde_json::from_value(ae("keyed"))?,
    )
    .await?;
    for node in ["a", "b"] {
        api.patch_status(
            "keyed",
            &PatchParams::apply(&format!("node-{node}")),
            &Patch::Apply(status_of("keyed", node)),
        )
        .await?;
    }
    assert_eq!(nodes_of(&api.get("keyed").await?), ["a", "b"]);
    // node-a leaves: only its element goes
    let left = api
        .patch_status(
            "keyed",
            &PatchParams::apply("node-a"),
            &Patch::Apply(json!({
                "apiVersion": ar.api_version, "kind": ar.kind, "metadata": {"name": "keyed"},
                "status": {"activators": []},
            })),
        )
        .await?;
    assert_eq!(nodes_of(&left), ["b"]);
    s.shutdown().await;
    Ok(())
}

/// A CRD whose list types cannot work is refused, as the real CRD validation does.
#[tokio::test]
async fn crds_with_broken_list_types_are_refused() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "gadgets.example.com"},
        "spec": {
            "group": "example.com", "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object", "properties": {
                    "members": {
                        "type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["node"],
                        "items": {"type": "object", "properties": {"node": {"type": "string"}}},
                    },
                }}},
            }}}],
        },
    }))?;
    let crds: Api<CustomResourceDefinition> = Api::all(s.client());
    let e = crds.create(&PostParams::default(), &crd).await.unwrap_err();
    let kube::Error::Api(status) = e else {
        panic!("an API error")
    };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    let causes = status.details.expect("details").causes;
    assert_eq!(
        causes[0].field,
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[members].items.properties[node].default"
    );
    assert_eq!(
        causes[0].message,
        "Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property"
    );
    s.shutdown().await;
    Ok(())
}

/// A key field the element omits takes its schema default (the CRD must give one or require
/// the field), for apply's element identity as for the stored object.
#[tokio::test]
async fn omitted_map_keys_take_their_schema_default() -> anyhow::Result<()> {
    let (s, _client, api) = with_crd().await?;
    let first = apply(&api, "alice", json!({"slots": [{"name": "a", "size": 1}]})).await?;
    assert_eq!(
        first.data["spec"]["slots"],
        json!([{"name": "a", "zone": "z1", "size": 1}])
    );
    let fields = entry_fields(&first, "alice");
    assert!(
        fields.contains(r#"k:{\"name\":\"a\",\"zone\":\"z1\"}"#),
        "{fields}"
    );
    // the same element, spelled with its key in full: changed in place, not added
    let second = apply(
        &api,
        "alice",
        json!({"slots": [{"name": "a", "zone": "z1", "size": 2}]}),
    )
    .await?;
    assert_eq!(
        second.data["spec"]["slots"],
        json!([{"name": "a", "zone": "z1", "size": 2}])
    );
    // another manager's element in another zone is its own
    let third = apply(
        &api,
        "bob",
        json!({"slots": [{"name": "a", "zone": "z2", "size": 3}]}),
    )
    .await?;
    assert_eq!(
        third.data["spec"]["slots"].as_array().map(Vec::len),
        Some(2)
    );
    s.shutdown().await;
    Ok(())
}
