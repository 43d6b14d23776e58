//! The ValidatingAdmissionPolicy that keeps an activator to its own node, evaluated with the
//! `cel` crate as the API server would: its match condition, its `pod` variable and each
//! validation, against requests it must allow and requests it must refuse.

use std::collections::HashMap;
use std::sync::Arc;

use cel::objects::{Key, Map as CelMap};
use cel::{Context, Env, Value as CelValue};
use serde_json::{Value, json};

const ACTIVATOR: &str = "system:serviceaccount:local-activator:activator";
const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";

fn policy() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/admission-policy.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(&text).unwrap();
    docs.into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .unwrap()
}

fn to_cel(v: &Value) -> CelValue {
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Number(n) => n
            .as_i64()
            .map(CelValue::Int)
            .unwrap_or_else(|| CelValue::Float(n.as_f64().unwrap_or_default())),
        Value::Array(items) => CelValue::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(m) => CelValue::Map(CelMap {
            map: Arc::new(
                m.iter()
                    .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                    .collect::<HashMap<_, _>>(),
            ),
        }),
    }
}

/// What the policy decides: None when it does not apply (the match condition is false),
/// else Ok or the message of the first failing validation.
fn admit(request: &Value, object: &Value, old: &Value) -> Option<Result<(), String>> {
    let p = policy();
    let env = Arc::new(Env::stdlib());
    let mut ctx = Context::with_env(Arc::clone(&env));
    ctx.add_variable_from_value("request", to_cel(request));
    ctx.add_variable_from_value("object", to_cel(object));
    ctx.add_variable_from_value("oldObject", to_cel(old));
    let eval = |ctx: &Context, expr: &str| -> CelValue {
        env.compile(expr)
            .unwrap_or_else(|e| panic!("{expr}: {e:?}"))
            .execute(ctx)
            .unwrap_or_else(|e| panic!("{expr}: {e:?}"))
    };
    for cond in p["spec"]["matchConditions"].as_array().unwrap() {
        if eval(&ctx, cond["expression"].as_str().unwrap()) != CelValue::Bool(true) {
            return None;
        }
    }
    let mut variables = HashMap::new();
    for var in p["spec"]["variables"].as_array().unwrap() {
        let v = eval(&ctx, var["expression"].as_str().unwrap());
        variables.insert(
            Key::String(Arc::new(var["name"].as_str().unwrap().into())),
            v,
        );
    }
    ctx.add_variable_from_value(
        "variables",
        CelValue::Map(CelMap {
            map: Arc::new(variables),
        }),
    );
    for v in p["spec"]["validations"].as_array().unwrap() {
        match eval(&ctx, v["expression"].as_str().unwrap()) {
            CelValue::Bool(true) => {}
            CelValue::Bool(false) => return Some(Err(v["message"].as_str().unwrap().into())),
            other => panic!("a validation returned {other:?}"),
        }
    }
    Some(Ok(()))
}

fn request(op: &str, user: &str, node: Option<&str>) -> Value {
    let extra = match node {
        Some(n) => json!({ NODE_CLAIM: [n] }),
        None => json!({}),
    };
    json!({"operation": op, "userInfo": {"username": user, "extra": extra}})
}

fn app_pod(node: &str) -> Value {
    json!({
        "metadata": {
            "name": "shop-abc",
            "labels": {"local-activator.dev/revision": "shop"},
            "ownerReferences": [{"apiVersion": "local-activator.dev/v1alpha1", "kind": "Revision",
                                 "name": "shop", "uid": "u", "controller": true}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "app"}]},
    })
}

fn refused(r: Option<Result<(), String>>, about: &str) {
    match r {
        Some(Err(m)) => assert!(m.contains(about), "refused for another reason: {m}"),
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn an_activator_creates_and_deletes_its_own_nodes_pods() {
    let create = request("CREATE", ACTIVATOR, Some("node-1"));
    assert_eq!(
        admit(&create, &app_pod("node-1"), &Value::Null),
        Some(Ok(()))
    );
    let delete = request("DELETE", ACTIVATOR, Some("node-1"));
    assert_eq!(
        admit(&delete, &Value::Null, &app_pod("node-1")),
        Some(Ok(()))
    );
}

#[test]
fn other_nodes_pods_are_refused_both_ways() {
    let create = request("CREATE", ACTIVATOR, Some("node-1"));
    refused(admit(&create, &app_pod("node-2"), &Value::Null), "own node");
    let delete = request("DELETE", ACTIVATOR, Some("node-1"));
    refused(admit(&delete, &Value::Null, &app_pod("node-2")), "own node");
    let mut unbound = app_pod("node-1");
    unbound["spec"].as_object_mut().unwrap().remove("nodeName");
    refused(admit(&create, &unbound, &Value::Null), "own node");
}

#[test]
fn a_token_without_the_node_claim_is_refused() {
    let create = request("CREATE", ACTIVATOR, None);
    refused(admit(&create, &app_pod("node-1"), &Value::Null), "own node");
}

#[test]
fn pods_without_the_revision_label_or_owner_are_refused() {
    let create = request("CREATE", ACTIVATOR, Some("node-1"));
    let mut unlabelled = app_pod("node-1");
    unlabelled["metadata"]["labels"] = json!({"app": "x"});
    refused(admit(&create, &unlabelled, &Value::Null), "revision label");
    let mut orphan = app_pod("node-1");
    orphan["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    refused(admit(&create, &orphan, &Value::Null), "ownerReference");
    let mut not_controller = app_pod("node-1");
    not_controller["metadata"]["ownerReferences"][0]["controller"] = json!(false);
    refused(
        admit(&create, &not_controller, &Value::Null),
        "ownerReference",
    );
    // A DELETE needs the label, not an owner (the pod is what the activator made).
    let delete = request("DELETE", ACTIVATOR, Some("node-1"));
    refused(admit(&delete, &Value::Null, &unlabelled), "revision label");
    assert_eq!(admit(&delete, &Value::Null, &orphan), Some(Ok(())));
}

#[test]
fn other_users_are_not_this_policys_business() {
    let create = request(
        "CREATE",
        "system:serviceaccount:kube-system:replicaset-controller",
        None,
    );
    assert_eq!(admit(&create, &app_pod("node-2"), &Value::Null), None);
}
