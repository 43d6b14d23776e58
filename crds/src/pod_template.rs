//! `spec.template` as a Revision holds it: its JSON text.
//!
//! The CRD keeps the template schemaless, so the API server accepts any JSON there; holding it
//! as JSON means one malformed template cannot stop a watch of all Revisions from decoding
//! (every activator and the subsetter watch them). It is parsed into a `PodTemplateSpec` where
//! it is used, and a bad one is reported for its revision alone.
//!
//! Held as compact text rather than a `serde_json::Value`: a `Value` keeps every JSON object as
//! a `BTreeMap`, ~630 bytes for its first node alone, so a one-container template took ~3.9 KiB
//! where its text takes ~160 bytes. The subsetter keeps every Revision (100,000 at the design
//! target) and each activator those of its subsets, so that difference is paid per revision.
//! The few readers parse what they need when they need it; what a request reads each time
//! (the first port's name) is parsed once per copy.

use std::fmt;
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// A Revision's `spec.template`: any JSON, held as its compact text.
#[derive(Clone)]
pub struct PodTemplate {
    /// The template's JSON, as `serde_json` writes a `Value` (object keys sorted, no spaces):
    /// two templates are equal exactly when their texts are.
    json: Arc<str>,
    /// `spec.containers[0].ports[0].name`, parsed at its first use (per request, for the
    /// upstream protocol).
    first_port_name: Arc<OnceLock<Option<Box<str>>>>,
}

impl PodTemplate {
    /// The template as a `PodTemplateSpec`, or why it is not one.
    pub fn parse(&self) -> Result<PodTemplateSpec, String> {
        serde_json::from_str(&self.json).map_err(|e| format!("spec.template: {e}"))
    }

    /// The template as JSON (a new tree, parsed from the text).
    pub fn value(&self) -> Value {
        serde_json::from_str(&self.json).expect("the text was written from a Value")
    }

    /// The template's JSON text.
    pub fn json(&self) -> &str {
        &self.json
    }

    /// The name of the first container's first port, if the template has one.
    pub fn first_port_name(&self) -> Option<&str> {
        self.first_port_name
            .get_or_init(|| {
                self.value()["spec"]["containers"][0]["ports"][0]["name"]
                    .as_str()
                    .map(Box::from)
            })
            .as_deref()
    }
}

impl From<Value> for PodTemplate {
    fn from(v: Value) -> Self {
        Self::from(&v)
    }
}

impl From<&Value> for PodTemplate {
    fn from(v: &Value) -> Self {
        Self {
            json: Arc::from(v.to_string()),
            first_port_name: Arc::default(),
        }
    }
}

impl From<PodTemplateSpec> for PodTemplate {
    fn from(t: PodTemplateSpec) -> Self {
        Self::from(serde_json::to_value(t).expect("a PodTemplateSpec serializes"))
    }
}

impl Default for PodTemplate {
    /// No template (`null`), as a `Value` defaults.
    fn default() -> Self {
        Self::from(Value::Null)
    }
}

impl PartialEq for PodTemplate {
    fn eq(&self, other: &Self) -> bool {
        self.json == other.json
    }
}

impl fmt::Debug for PodTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PodTemplate").field(&&*self.json).finish()
    }
}

impl Serialize for PodTemplate {
    /// As the JSON it holds, for any serializer (YAML too).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(s)
    }
}

impl<'de> Deserialize<'de> for PodTemplate {
    /// Any JSON (a malformed template is reported where it is parsed, not here).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn it_reads_and_writes_the_same_json_whatever_its_key_order_and_spacing() {
        let a: PodTemplate = serde_json::from_str(
            r#"{ "spec": {"containers": [{"name":"app","image":"i"}]}, "metadata": {} }"#,
        )
        .unwrap();
        let b = PodTemplate::from(
            json!({"metadata": {}, "spec": {"containers": [{"image": "i", "name": "app"}]}}),
        );
        assert_eq!(a, b);
        assert_eq!(
            a.json(),
            r#"{"metadata":{},"spec":{"containers":[{"image":"i","name":"app"}]}}"#
        );
        assert_eq!(serde_json::to_value(&a).unwrap(), b.value());
        assert_ne!(a, PodTemplate::from(json!({"metadata": {}})));
    }

    #[test]
    fn any_json_is_held_and_only_parsing_says_it_is_no_pod_template() {
        let bad: PodTemplate = serde_json::from_str(r#"{"spec": {"containers": "x"}}"#).unwrap();
        assert!(bad.parse().unwrap_err().starts_with("spec.template: "));
        assert_eq!(bad.first_port_name(), None);
        let null = PodTemplate::default();
        assert_eq!(null.json(), "null");
        assert!(null.parse().is_err());
    }

    #[test]
    fn the_first_ports_name_is_read_once_and_shared_by_copies() {
        let t = PodTemplate::from(json!({"spec": {"containers": [
            {"name": "a", "ports": [{"name": "h2c", "containerPort": 8080}, {"name": "x"}]},
            {"name": "b", "ports": [{"name": "y"}]},
        ]}}));
        let copy = t.clone();
        assert_eq!(t.first_port_name(), Some("h2c"));
        assert!(
            copy.first_port_name.get().is_some(),
            "a copy shares the parsed name"
        );
        assert_eq!(
            PodTemplate::from(json!({"spec": {"containers": [{"name": "a"}]}})).first_port_name(),
            None
        );
    }

    #[test]
    fn a_typed_template_round_trips() {
        let spec: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "x"}},
            "spec": {"containers": [{"name": "app", "image": "i", "ports": [{"containerPort": 8080}]}]},
        }))
        .unwrap();
        assert_eq!(PodTemplate::from(spec.clone()).parse().unwrap(), spec);
    }

    #[test]
    fn it_serializes_to_yaml_as_the_json_it_holds() {
        let t = PodTemplate::from(json!({"spec": {"containers": [{"name": "app"}]}}));
        let yaml = serde_saphyr::to_string(&t).unwrap();
        assert!(yaml.contains("containers"), "{yaml}");
        let back: Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, t.value());
    }
}
