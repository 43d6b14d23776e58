//! The deploy/ manifests parse, reference files that exist, and agree with the contract
//! constants the code uses (labels, ports, env).

use std::path::PathBuf;

use crds::contract::{
    ACTIVATOR_SELECTOR, ADMIN_PORT, APP_NAME_LABEL, APP_NAME_VALUE, COMPONENT_LABEL,
    COMPONENT_VALUE, DATA_PORT,
};
use serde_json::Value;

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn docs(rel: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(deploy().join(rel)).unwrap();
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text).unwrap()
}

#[test]
fn kustomization_lists_existing_parseable_files() {
    let k = &docs("kustomization.yaml")[0];
    let resources = k["resources"].as_array().unwrap();
    assert!(resources.len() >= 5);
    for r in resources {
        let rel = r.as_str().unwrap();
        let parsed = docs(rel);
        assert!(!parsed.is_empty(), "{rel} has no documents");
        for d in parsed {
            assert!(
                d["apiVersion"].is_string() && d["kind"].is_string(),
                "{rel}: {d}"
            );
        }
    }
}

#[test]
fn daemonset_matches_the_activator_contract() {
    let ds = docs("base/activator-daemonset.yaml")
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap();
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    assert_eq!(labels[APP_NAME_LABEL], APP_NAME_VALUE);
    assert_eq!(labels[COMPONENT_LABEL], COMPONENT_VALUE);
    assert_eq!(
        ACTIVATOR_SELECTOR,
        format!("{APP_NAME_LABEL}={APP_NAME_VALUE},{COMPONENT_LABEL}={COMPONENT_VALUE}")
    );
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let port = |name: &str| {
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(port("http"), u64::from(DATA_PORT));
    assert_eq!(port("admin"), u64::from(ADMIN_PORT));
    let env: Vec<&str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    for v in ["NODE_NAME", "POD_NAME", "POD_NAMESPACE", "POD_IP"] {
        assert!(env.contains(&v), "missing env {v}");
    }
}
