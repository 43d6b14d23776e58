//! The kustomize overlays (deploy/overlays/{small,large}) and the Helm chart
//! (deploy/helm/local-activator) render (support/render.rs: no kustomize or helm binary
//! needed), every rendered document is a k8s-openapi type with no field that type does not
//! know, and the chart with values-small.yaml / values-large.yaml renders the same objects as
//! the overlay of that size (container args are compared parsed, by the binaries' own
//! parsers, in the activator's and the subsetter's `rendered_manifests` tests).

#[path = "support/render.rs"]
mod render;

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use render::{RELEASE_NAMESPACE, all_renderings, chart_crds, helm_template, id, kustomize, values};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// `doc` parses as `T` and serializes back to itself: no field `T` does not know (a typo
/// or a field at the wrong level would be dropped silently by a plain parse).
fn roundtrip<T: DeserializeOwned + Serialize>(what: &str, doc: &Value) {
    let typed: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{what}: {} does not parse: {e}", doc["kind"]));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        normalize(doc.clone()),
        normalize(back),
        "{what}: {:?} has fields its type drops",
        id(doc)
    );
}

/// Numbers as k8s-openapi writes them back (`cpu: 1` → "1" is a Quantity string already).
fn normalize(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, normalize(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(normalize).collect()),
        other => other,
    }
}

fn parse_typed(what: &str, doc: &Value) {
    match doc["kind"].as_str().unwrap_or_default() {
        "Namespace" => roundtrip::<Namespace>(what, doc),
        "ServiceAccount" => roundtrip::<ServiceAccount>(what, doc),
        "ClusterRole" => roundtrip::<ClusterRole>(what, doc),
        "ClusterRoleBinding" => roundtrip::<ClusterRoleBinding>(what, doc),
        "Role" => roundtrip::<Role>(what, doc),
        "RoleBinding" => roundtrip::<RoleBinding>(what, doc),
        "DaemonSet" => roundtrip::<DaemonSet>(what, doc),
        "Deployment" => roundtrip::<Deployment>(what, doc),
        "CustomResourceDefinition" => roundtrip::<CustomResourceDefinition>(what, doc),
        "ValidatingAdmissionPolicy" => roundtrip::<ValidatingAdmissionPolicy>(what, doc),
        "ValidatingAdmissionPolicyBinding" => {
            roundtrip::<ValidatingAdmissionPolicyBinding>(what, doc)
        }
        other => panic!("{what}: kind {other:?} has no k8s-openapi type here"),
    }
}

#[test]
fn every_rendered_document_is_a_known_kubernetes_type() {
    let renderings = all_renderings();
    assert_eq!(renderings.len(), 6);
    for (what, docs) in &renderings {
        assert!(docs.len() >= 10, "{what}: {} documents", docs.len());
        for d in docs {
            parse_typed(what, d);
        }
    }
    for d in chart_crds() {
        parse_typed("chart crds/", &d);
    }
}

/// Objects by id, container args removed (compared parsed elsewhere).
fn comparable(docs: Vec<Value>) -> BTreeMap<(String, String, String, String), Value> {
    docs.into_iter()
        .map(|mut d| {
            if let Some(cs) = d["spec"]["template"]["spec"]["containers"].as_array_mut() {
                for c in cs {
                    c.as_object_mut().unwrap().remove("args");
                }
            }
            (id(&d), d)
        })
        .collect()
}

#[test]
fn a_misplaced_field_fails_the_typed_parse() {
    let mut ds = render::find(&kustomize(&render::deploy_dir()), "DaemonSet", "activator").clone();
    roundtrip::<DaemonSet>("base", &ds);
    ds["spec"]["template"]["spec"]["containers"][0]["resources"]["limit"] = "typo".into();
    let caught = std::panic::catch_unwind(|| roundtrip::<DaemonSet>("typo", &ds));
    assert!(
        caught.is_err(),
        "a field DaemonSet does not know went unnoticed"
    );
}

#[test]
fn the_chart_renders_what_each_overlay_does() {
    let d = render::deploy_dir();
    for (overlay, files) in [
        (d.clone(), &[][..]),
        (d.join("overlays/small"), &["values-small.yaml"][..]),
        (d.join("overlays/large"), &["values-large.yaml"][..]),
    ] {
        let mut want = comparable(kustomize(&overlay));
        // Helm installs CRDs from the chart's crds/ (compared below) and the release
        // namespace with --create-namespace.
        want.retain(|(_, kind, _, _), _| kind != "CustomResourceDefinition" && kind != "Namespace");
        let got = comparable(helm_template(&values(files), RELEASE_NAMESPACE));
        assert_eq!(
            want.keys().collect::<Vec<_>>(),
            got.keys().collect::<Vec<_>>(),
            "{}: other objects",
            overlay.display()
        );
        for (k, w) in &want {
            assert_eq!(
                w,
                &got[k],
                "{}: {k:?} differs from the chart with {files:?}",
                overlay.display()
            );
        }
    }
    // The chart's CRDs are deploy/crds (copied: Helm reads only files inside the chart).
    let by_name = |docs: Vec<Value>| -> BTreeMap<String, Value> {
        docs.into_iter()
            .map(|d| (d["metadata"]["name"].as_str().unwrap().to_string(), d))
            .collect()
    };
    let (deploy, chart) = (by_name(kustomize(&d.join("crds"))), by_name(chart_crds()));
    assert_eq!(
        deploy.keys().collect::<Vec<_>>(),
        chart.keys().collect::<Vec<_>>()
    );
    for (name, crd) in &deploy {
        assert!(
            crd == &chart[name],
            "{name}: the chart's crds/ differs from deploy/crds (copy it)"
        );
    }
}

#[test]
fn the_overlays_change_what_they_say() {
    let d = render::deploy_dir();
    let base = kustomize(&d);
    let small = kustomize(&d.join("overlays/small"));
    let large = kustomize(&d.join("overlays/large"));
    let mem = |docs: &[Value], kind: &str, name: &str| {
        render::first_container(render::find(docs, kind, name))["resources"]["limits"]["memory"]
            .clone()
    };
    assert_eq!(mem(&base, "DaemonSet", "activator"), "1Gi");
    assert_eq!(mem(&small, "DaemonSet", "activator"), "256Mi");
    assert_eq!(mem(&large, "DaemonSet", "activator"), "2Gi");
    assert_eq!(mem(&large, "Deployment", "subsetter"), "4Gi");
    let args = |docs: &[Value]| {
        render::first_container(render::find(docs, "Deployment", "subsetter"))["args"].clone()
    };
    assert!(args(&base).is_null());
    assert!(
        args(&small)
            .as_array()
            .unwrap()
            .contains(&"--write-qps=20".into())
    );
    assert!(
        args(&large)
            .as_array()
            .unwrap()
            .contains(&"--policy=least-loaded".into())
    );
    // Host routing on everywhere: a large cluster resolves Hosts from the directory, not by
    // a label-selected list each (docs/member-stream.md).
    let activator_args = |docs: &[Value]| {
        render::first_container(render::find(docs, "DaemonSet", "activator"))["args"].clone()
    };
    assert_eq!(activator_args(&large), serde_json::json!([]));
    assert_eq!(activator_args(&small), serde_json::json!([]));
}

#[test]
fn images_are_values_and_name_dockerfile_targets() {
    for bin in ["activator", "subsetter"] {
        let v = values(&[]);
        let repo = v[bin]["image"]["repository"].as_str().unwrap();
        assert_eq!(repo, format!("ghcr.io/local-activator/{bin}"));
        let mut v2 = v.clone();
        v2[bin]["image"]["repository"] = "registry.example/la/x".into();
        v2[bin]["image"]["tag"] = "v9.9.9".into();
        let kind = if bin == "activator" {
            "DaemonSet"
        } else {
            "Deployment"
        };
        let image = |v: &Value| {
            let docs = helm_template(v, RELEASE_NAMESPACE);
            render::first_container(render::find(&docs, kind, bin))["image"].clone()
        };
        assert_eq!(image(&v), format!("{repo}:latest"));
        assert_eq!(image(&v2), "registry.example/la/x:v9.9.9");
    }
    // The Dockerfile has a target of each repository's last segment.
    let dockerfile =
        std::fs::read_to_string(render::deploy_dir().join("docker/Dockerfile")).unwrap();
    for bin in ["activator", "subsetter"] {
        assert!(
            dockerfile.contains(&format!(" AS {bin}\n")),
            "no target {bin}"
        );
    }
}

#[test]
fn the_release_namespace_reaches_every_namespaced_object_and_the_policy() {
    let docs = helm_template(&values(&[]), "platform-x");
    for d in &docs {
        let ns = &d["metadata"]["namespace"];
        match d["kind"].as_str().unwrap() {
            "ClusterRole"
            | "ClusterRoleBinding"
            | "ValidatingAdmissionPolicy"
            | "ValidatingAdmissionPolicyBinding" => assert!(ns.is_null()),
            // Where the kubernetes Service's Endpoints live (crds::api_route).
            "Role" | "RoleBinding" if d["metadata"]["name"] == "local-activator:api-address" => {
                assert_eq!(ns, crds::api_route::SERVICE_NAMESPACE)
            }
            _ => assert_eq!(ns, "platform-x", "{:?}", id(d)),
        }
        for s in d["subjects"].as_array().into_iter().flatten() {
            assert_eq!(s["namespace"], "platform-x");
        }
    }
    let policy = render::find(
        &docs,
        "ValidatingAdmissionPolicy",
        "local-activator-own-node-pods",
    );
    assert!(
        policy
            .to_string()
            .contains("system:serviceaccount:platform-x:activator"),
        "{policy}"
    );
    let mut off = values(&[]);
    off["admissionPolicy"]["enabled"] = false.into();
    assert!(
        !helm_template(&off, "x")
            .iter()
            .any(|d| d["kind"] == "ValidatingAdmissionPolicy")
    );
}

#[test]
fn the_helm_functions_follow_helms_semantics() {
    let v = serde_json::json!({"r": {"limits": {"memory": "1Gi"}, "requests": {"cpu": "1"}},
                               "n": 2, "a": "0.0.0.0:9091"});
    let out = render::render_template(
        "x: {{ .Values.n | quote }}\ny:\n  {{- toYaml .Values.r | nindent 2 }}\nz: {{ last (splitList \":\" .Values.a) }}\n",
        &v,
        "ns",
    );
    let parsed = &render::parse_docs(&out, "test")[0];
    assert_eq!(parsed["x"], "2");
    assert_eq!(parsed["y"], v["r"], "{out}");
    assert_eq!(parsed["z"], 9091);
}
