//! Events: `core/v1` and `events.k8s.io/v1` are two views of one store on a real server (one
//! internal type, converted per request). kubesim keeps a table per API and mirrors every
//! write of one into the other at the same resourceVersion, converted, so an Event written
//! through either API is read, listed, watched, patched and deleted through the other.
//! Field names follow k8s.io/kubernetes pkg/apis/events/v1's conversion; validation follows
//! pkg/apis/core/validation/events.go.

use serde_json::{Map, Value, json};

use super::status::{Cause, invalid_value, required};

/// Table keys of the two Event APIs.
pub(crate) const CORE_TABLE: &str = "/events";
pub(crate) const EVENTS_TABLE: &str = "events.k8s.io/events";

/// (core v1 name, events.k8s.io/v1 name) of every field whose name differs.
const RENAMED: &[(&str, &str)] = &[
    ("message", "note"),
    ("involvedObject", "regarding"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];
/// Fields both APIs name alike.
const SAME: &[&str] = &[
    "metadata",
    "eventTime",
    "series",
    "action",
    "reason",
    "related",
    "type",
    "reportingInstance",
];

/// The other table of an Event table, with its group.
pub(crate) fn mirror_of(table: &str) -> Option<(&'static str, &'static str)> {
    match table {
        CORE_TABLE => Some((EVENTS_TABLE, "events.k8s.io")),
        EVENTS_TABLE => Some((CORE_TABLE, "")),
        _ => None,
    }
}

/// An Event of one API as the other API shows it (`to_table` names the target table).
pub(crate) fn convert(obj: &Value, to_table: &str) -> Value {
    let to_events = to_table == EVENTS_TABLE;
    let mut out = Map::new();
    let Some(src) = obj.as_object() else {
        return obj.clone();
    };
    for (core, events) in RENAMED {
        let (from, to) = if to_events {
            (core, events)
        } else {
            (events, core)
        };
        if let Some(v) = src.get(*from) {
            out.insert((*to).to_string(), v.clone());
        }
    }
    for f in SAME {
        if let Some(v) = src.get(*f) {
            out.insert((*f).to_string(), v.clone());
        }
    }
    let (api_version, kind) = if to_events {
        ("events.k8s.io/v1", "Event")
    } else {
        ("v1", "Event")
    };
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!(kind));
    Value::Object(out)
}

fn str_of<'a>(v: &'a Value, path: &str) -> &'a str {
    v.pointer(path).and_then(Value::as_str).unwrap_or("")
}

fn set(v: &Value, field: &str) -> bool {
    v.get(field)
        .is_some_and(|x| !x.is_null() && x != &json!("") && x != &json!(0) && x != &json!({}))
}

/// Validation of an Event created through `table`, given in that API's own shape
/// (ValidateEventCreate: the legacy rules for everyone, the strict ones for events.k8s.io/v1).
pub(crate) fn validate_create(obj: &Value, table: &str, namespace: &str) -> Vec<Cause> {
    let strict = table == EVENTS_TABLE;
    // Validation runs on the internal (core-shaped) object, with its field names.
    let core = if strict {
        convert(obj, CORE_TABLE)
    } else {
        obj.clone()
    };
    let mut causes = Vec::new();
    let involved_ns = str_of(&core, "/involvedObject/namespace");
    if !set(&core, "eventTime") {
        let ok = if involved_ns.is_empty() {
            namespace.is_empty() || namespace == "default"
        } else {
            involved_ns == namespace
        };
        if !ok {
            causes.push(invalid_value(
                "involvedObject.namespace",
                &json!(involved_ns),
                "does not match event.namespace",
            ));
        }
    } else {
        if involved_ns.is_empty() && namespace != "default" && namespace != "kube-system" {
            causes.push(invalid_value(
                "involvedObject.namespace",
                &json!(involved_ns),
                "does not match event.namespace",
            ));
        }
        let controller_field = if strict {
            "reportingController"
        } else {
            "reportingComponent"
        };
        if str_of(&core, "/reportingComponent").is_empty() {
            causes.push(required(controller_field));
        }
        for (field, limit) in [("reportingInstance", 128), ("action", 128), ("reason", 128)] {
            let v = str_of(&core, &format!("/{field}"));
            if v.is_empty() {
                causes.push(required(field));
            } else if v.len() > limit {
                causes.push(invalid_value(
                    field,
                    &json!(""),
                    &format!("can have at most {limit} characters"),
                ));
            }
        }
    }
    if !strict {
        return causes;
    }
    if !set(&core, "eventTime") {
        causes.push(required("eventTime"));
    }
    let ty = str_of(&core, "/type");
    if ty != "Normal" && ty != "Warning" {
        causes.push(invalid_value(
            "type",
            &json!(""),
            &format!("has invalid value: {ty}"),
        ));
    }
    for (field, name) in [
        ("firstTimestamp", "deprecatedFirstTimestamp"),
        ("lastTimestamp", "deprecatedLastTimestamp"),
        ("count", "deprecatedCount"),
        ("source", "deprecatedSource"),
    ] {
        if set(&core, field) {
            causes.push(invalid_value(name, &json!(""), "needs to be unset"));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_both_ways_without_loss() {
        let core = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "ns"},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "ns"},
            "message": "started", "reason": "Started", "type": "Normal",
            "source": {"component": "kubelet"}, "count": 2,
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:01Z",
            "reportingComponent": "kubelet", "reportingInstance": "node-1",
        });
        let ev = convert(&core, EVENTS_TABLE);
        assert_eq!(ev["apiVersion"], "events.k8s.io/v1");
        assert_eq!(ev["note"], "started");
        assert_eq!(ev["regarding"]["name"], "p");
        assert_eq!(ev["deprecatedSource"]["component"], "kubelet");
        assert_eq!(ev["deprecatedCount"], 2);
        assert_eq!(ev["reportingController"], "kubelet");
        assert!(ev.get("message").is_none());
        assert_eq!(convert(&ev, CORE_TABLE), core);
    }

    #[test]
    fn events_api_requires_the_new_fields() {
        let ev = json!({"metadata": {"name": "e"}, "regarding": {"namespace": "ns"}});
        let fields: Vec<String> = validate_create(&ev, EVENTS_TABLE, "ns")
            .into_iter()
            .map(|c| c.field)
            .collect();
        for f in ["eventTime", "type"] {
            assert!(fields.contains(&f.to_string()), "{fields:?}");
        }
        let full = json!({
            "metadata": {"name": "e"}, "regarding": {"namespace": "ns"},
            "eventTime": "2026-01-01T00:00:00.000000Z", "type": "Normal",
            "reportingController": "x.dev/c", "reportingInstance": "i", "action": "A", "reason": "R",
        });
        assert_eq!(validate_create(&full, EVENTS_TABLE, "ns"), vec![]);
        let mut missing = full.clone();
        missing.as_object_mut().unwrap().remove("action");
        missing
            .as_object_mut()
            .unwrap()
            .remove("reportingController");
        let fields: Vec<String> = validate_create(&missing, EVENTS_TABLE, "ns")
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(fields, vec!["reportingController", "action"]);
    }

    #[test]
    fn core_event_namespace_must_match_its_object() {
        let ev = json!({"metadata": {"name": "e"}, "involvedObject": {"namespace": "other"}});
        let causes = validate_create(&ev, CORE_TABLE, "ns");
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "involvedObject.namespace");
        assert_eq!(
            causes[0].message,
            "Invalid value: \"other\": does not match event.namespace"
        );
        let ok = json!({"metadata": {"name": "e"}, "involvedObject": {"namespace": "ns"}});
        assert!(validate_create(&ok, CORE_TABLE, "ns").is_empty());
    }
}
