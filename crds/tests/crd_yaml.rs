//! The committed CRD YAML must be what the types generate, and small enough for kubectl apply.

use std::path::PathBuf;

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds")
}

#[test]
fn committed_crd_yaml_is_up_to_date() {
    let stale = crds::crdgen::stale_files(&crd_dir()).unwrap();
    assert!(
        stale.is_empty(),
        "CRD YAML out of date: {stale:?}; run `cargo run -p crds --bin crdgen`"
    );
}

#[test]
fn crds_fit_kubectl_apply_annotation_limit() {
    for (file, crd) in crds::crdgen::all() {
        let json = serde_json::to_string(&crd).unwrap();
        assert!(
            json.len() < 256 * 1024 / 2,
            "{file} is {} bytes, too close to the 256 KiB last-applied limit",
            json.len()
        );
    }
}

#[test]
fn revision_schema_carries_ranges_defaults_and_cel_rules() {
    let crd = serde_json::to_value(crds::crdgen::all()[0].1.clone()).unwrap();
    let v = &crd["spec"]["versions"][0];
    assert_eq!(v["name"], "v1alpha1");
    assert!(v["subresources"]["status"].is_object());
    let root = &v["schema"]["openAPIV3Schema"];
    let spec = &root["properties"]["spec"];
    assert_eq!(spec["properties"]["port"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(
        spec["properties"]["port"]["maximum"].as_f64(),
        Some(65535.0)
    );
    assert_eq!(spec["properties"]["port"]["default"], 8080);
    assert_eq!(spec["properties"]["targetBurstCapacity"]["default"], 200);
    assert_eq!(
        spec["properties"]["minScale"]["minimum"].as_f64(),
        Some(0.0)
    );
    assert_eq!(
        spec["properties"]["template"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
    let required: Vec<&str> = spec["required"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    assert!(required.contains(&"template"), "{required:?}");
    let spec_rules = spec["x-kubernetes-validations"].to_string();
    assert!(
        spec_rules.contains("self.maxScale >= self.minScale"),
        "{spec_rules}"
    );
    let root_rules = root["x-kubernetes-validations"].to_string();
    assert!(
        root_rules.contains("self.metadata.name.size() <= 63"),
        "{root_rules}"
    );
}
