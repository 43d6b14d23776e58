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

/// Whether a field holds something other than its Go zero value (absent, null, "", 0, a
/// struct of zero values).
fn set(v: &Value, field: &str) -> bool {
    v.get(field).is_some_and(|x| !normalized(x).is_null())
}

/// A value with its Go zero values dropped (null for a zero value), so that two
/// representations of one typed value compare equal (`{}` and absent, `0` and absent...).
fn normalized(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let kept: Map<String, Value> = m
                .iter()
                .map(|(k, v)| (k.clone(), normalized(v)))
                .filter(|(_, v)| !v.is_null())
                .collect();
            if kept.is_empty() {
                Value::Null
            } else {
                Value::Object(kept)
            }
        }
        Value::Array(a) if a.is_empty() => Value::Null,
        Value::String(s) if s.is_empty() => Value::Null,
        Value::Number(n) if n.as_f64() == Some(0.0) => Value::Null,
        Value::Bool(false) => Value::Null,
        other => other.clone(),
    }
}

/// `legacyValidateEvent` on an Event in core shape: what every Event, created or updated
/// through either API, must satisfy. `core_request` names the controller field
/// `reportingComponent` (the core API's name for it), as the real server does.
fn legacy(core: &Value, namespace: &str, core_request: bool, causes: &mut Vec<Cause>) {
    let involved_ns = str_of(core, "/involvedObject/namespace");
    let mismatch = || {
        invalid_value(
            "involvedObject.namespace",
            &json!(involved_ns),
            "does not match event.namespace",
        )
    };
    if !set(core, "eventTime") {
        // an "old" Event: its namespace and its object's agree (or both are unset/default)
        let ok = if involved_ns.is_empty() {
            namespace.is_empty() || namespace == "default"
        } else {
            involved_ns == namespace
        };
        if !ok {
            causes.push(mismatch());
        }
        return;
    }
    if involved_ns.is_empty() && namespace != "default" && namespace != "kube-system" {
        causes.push(mismatch());
    }
    let controller_field = if core_request {
        "reportingComponent"
    } else {
        "reportingController"
    };
    let controller = str_of(core, "/reportingComponent");
    if controller.is_empty() {
        causes.push(required(controller_field));
    }
    for msg in super::selector::qualified_name_errors(controller) {
        causes.push(invalid_value(controller_field, &json!(controller), &msg));
    }
    for (field, limit) in [("reportingInstance", 128), ("action", 128), ("reason", 128)] {
        let v = str_of(core, &format!("/{field}"));
        if v.is_empty() {
            causes.push(required(field));
        }
        if v.len() > limit {
            causes.push(invalid_value(
                field,
                &json!(""),
                &format!("can have at most {limit} characters"),
            ));
        }
    }
    if str_of(core, "/message").len() > 1024 {
        causes.push(invalid_value(
            "message",
            &json!(""),
            "can have at most 1024 characters",
        ));
    }
}

/// `validateV1EventSeries`.
fn series(core: &Value, causes: &mut Vec<Cause>) {
    let Some(series) = core.get("series").filter(|s| !s.is_null()) else {
        return;
    };
    if series.get("count").and_then(Value::as_i64).unwrap_or(0) < 2 {
        causes.push(invalid_value(
            "series.count",
            &json!(""),
            "should be at least 2",
        ));
    }
    if !set(series, "lastObservedTime") {
        causes.push(required("series.lastObservedTime"));
    }
}

/// An Event in the internal (core) shape, from either API's.
fn core_shape(obj: &Value, table: &str) -> Value {
    if table == EVENTS_TABLE {
        convert(obj, CORE_TABLE)
    } else {
        obj.clone()
    }
}

/// Validation of an Event created through `table`, given in that API's own shape
/// (`ValidateEventCreate`: the legacy rules for everyone, the strict ones for
/// events.k8s.io/v1). Field paths are the internal type's (core names), as on the real server.
pub(crate) fn validate_create(obj: &Value, table: &str, namespace: &str) -> Vec<Cause> {
    let strict = table == EVENTS_TABLE;
    let core = core_shape(obj, table);
    let mut causes = Vec::new();
    legacy(&core, namespace, !strict, &mut causes);
    if !strict {
        return causes;
    }
    series(&core, &mut causes);
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
    for field in ["firstTimestamp", "lastTimestamp", "count"] {
        if set(&core, field) {
            causes.push(invalid_value(field, &json!(""), "needs to be unset"));
        }
    }
    if !str_of(&core, "/source/component").is_empty() || !str_of(&core, "/source/host").is_empty() {
        causes.push(invalid_value("source", &json!(""), "needs to be unset"));
    }
    causes
}

/// Validation of an update through `table` (`ValidateEventUpdate`): the legacy rules on the
/// new Event; through events.k8s.io/v1 also a changed series' rules and every field but
/// `series` (and metadata) immutable.
pub(crate) fn validate_update(
    new: &Value,
    old: &Value,
    table: &str,
    namespace: &str,
) -> Vec<Cause> {
    let strict = table == EVENTS_TABLE;
    let new = core_shape(new, table);
    let old = core_shape(old, table);
    let mut causes = Vec::new();
    legacy(&new, namespace, !strict, &mut causes);
    if !strict {
        return causes;
    }
    let field = |v: &Value, f: &str| normalized(v.get(f).unwrap_or(&Value::Null));
    if field(&new, "series") != field(&old, "series") {
        series(&new, &mut causes);
    }
    // The real list checks `reason` twice.
    for f in [
        "involvedObject",
        "reason",
        "message",
        "source",
        "firstTimestamp",
        "lastTimestamp",
        "count",
        "reason",
        "type",
        "eventTime",
        "action",
        "related",
        "reportingComponent",
        "reportingInstance",
    ] {
        let same = match f {
            // times compare as the typed values do (metav1.Time: seconds, MicroTime: micros)
            "firstTimestamp" | "lastTimestamp" => instant(&new, f, 1) == instant(&old, f, 1),
            "eventTime" => instant(&new, f, 1_000_000) == instant(&old, f, 1_000_000),
            _ => field(&new, f) == field(&old, f),
        };
        if !same {
            let path = if f == "reportingComponent" {
                "reportingController"
            } else {
                f
            };
            causes.push(Cause {
                reason: "FieldValueInvalid".into(),
                field: path.into(),
                message: format!(
                    "Invalid value: {}: field is immutable",
                    go_value(f, new.get(f))
                ),
            });
        }
    }
    causes
}

/// A time field as whole units of 1/`per_second` s (None when unset or unparsable).
fn instant(v: &Value, field: &str, per_second: i128) -> Option<i128> {
    let t = v.get(field)?.as_str()?.parse::<jiff::Timestamp>().ok()?;
    Some(t.as_nanosecond().div_euclid(1_000_000_000 / per_second))
}

/// A field of the internal Event as Go's `field.Invalid` prints it: strings quoted, numbers
/// plain, times by `time.Time.String`, structs in `%#v` syntax, nil pointers as `null`.
fn go_value(field: &str, v: Option<&Value>) -> String {
    let s = |v: &Value, k: &str| format!("{:?}", v.get(k).and_then(Value::as_str).unwrap_or(""));
    let v = v.unwrap_or(&Value::Null);
    match field {
        "involvedObject" | "related" => {
            if field == "related" && v.is_null() {
                return "null".into();
            }
            format!(
                "core.ObjectReference{{Kind:{}, Namespace:{}, Name:{}, UID:{}, APIVersion:{}, ResourceVersion:{}, FieldPath:{}}}",
                s(v, "kind"),
                s(v, "namespace"),
                s(v, "name"),
                s(v, "uid"),
                s(v, "apiVersion"),
                s(v, "resourceVersion"),
                s(v, "fieldPath")
            )
        }
        "source" => format!(
            "core.EventSource{{Component:{}, Host:{}}}",
            s(v, "component"),
            s(v, "host")
        ),
        "firstTimestamp" | "lastTimestamp" | "eventTime" => go_time(v.as_str().unwrap_or("")),
        "count" => v.as_i64().unwrap_or(0).to_string(),
        _ => format!("{:?}", v.as_str().unwrap_or("")),
    }
}

/// `time.Time.String()` of an RFC 3339 timestamp (the zero time when absent).
fn go_time(rfc3339: &str) -> String {
    let Ok(t) = rfc3339.parse::<jiff::Timestamp>() else {
        return "0001-01-01 00:00:00 +0000 UTC".into();
    };
    let secs = t.strftime("%Y-%m-%d %H:%M:%S").to_string();
    let nanos = t.subsec_nanosecond();
    let frac = if nanos == 0 {
        String::new()
    } else {
        format!(".{nanos:09}").trim_end_matches('0').to_string()
    };
    format!("{secs}{frac} +0000 UTC")
}

/// The value an Event field selector term reads (the registry's `ToSelectableFields`):
/// `source` is the source component, or the reporting controller when there is none.
pub(crate) fn selectable_source(obj: &Value) -> Option<String> {
    if obj.get("kind").and_then(Value::as_str) != Some("Event") {
        return None;
    }
    let events = obj.get("apiVersion").and_then(Value::as_str) == Some("events.k8s.io/v1");
    let (source, controller) = if events {
        ("/deprecatedSource/component", "/reportingController")
    } else {
        ("/source/component", "/reportingComponent")
    };
    let component = str_of(obj, source);
    Some(if component.is_empty() {
        str_of(obj, controller).to_string()
    } else {
        component.to_string()
    })
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
        // an empty controller is also not a qualified name (two more messages)
        assert_eq!(
            fields,
            vec![
                "reportingController",
                "reportingController",
                "reportingController",
                "action"
            ]
        );
        let mut old_style = full.clone();
        old_style["deprecatedCount"] = json!(2);
        old_style["deprecatedSource"] = json!({"component": "kubelet"});
        old_style["series"] = json!({"count": 1});
        let fields: Vec<String> = validate_create(&old_style, EVENTS_TABLE, "ns")
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(
            fields,
            vec!["series.count", "series.lastObservedTime", "count", "source"],
            "the internal type's field names"
        );
    }

    #[test]
    fn events_api_updates_keep_all_but_the_series() {
        let old = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "ns"},
            "regarding": {"kind": "Pod", "name": "p", "namespace": "ns"},
            "eventTime": "2026-01-01T00:00:00.000000Z", "type": "Normal", "note": "n",
            "reportingController": "x.dev/c", "reportingInstance": "i", "action": "A", "reason": "R",
        });
        let mut new = old.clone();
        new["series"] = json!({"count": 2, "lastObservedTime": "2026-01-01T00:00:01.000000Z"});
        assert_eq!(validate_update(&new, &old, EVENTS_TABLE, "ns"), vec![]);
        new["note"] = json!("changed");
        new["reason"] = json!("Other");
        new["eventTime"] = json!("2026-01-01T00:00:02.5Z");
        let causes = validate_update(&new, &old, EVENTS_TABLE, "ns");
        let msgs: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        assert_eq!(
            msgs,
            vec![
                "reason: Invalid value: \"Other\": field is immutable",
                "message: Invalid value: \"changed\": field is immutable",
                "reason: Invalid value: \"Other\": field is immutable",
                "eventTime: Invalid value: 2026-01-01 00:00:02.5 +0000 UTC: field is immutable",
            ]
        );
        // the core API only keeps the legacy rules
        let core_old = convert(&old, CORE_TABLE);
        let mut core_new = core_old.clone();
        core_new["message"] = json!("changed");
        assert_eq!(
            validate_update(&core_new, &core_old, CORE_TABLE, "ns"),
            vec![]
        );
        core_new["involvedObject"]["namespace"] = json!("");
        let causes = validate_update(&core_new, &core_old, CORE_TABLE, "ns");
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].field, "involvedObject.namespace");
    }

    #[test]
    fn source_selects_the_component_or_the_controller() {
        let core = json!({"apiVersion": "v1", "kind": "Event", "source": {"component": "kubelet"}});
        assert_eq!(selectable_source(&core).as_deref(), Some("kubelet"));
        let new = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "reportingController": "x.dev/c"});
        assert_eq!(selectable_source(&new).as_deref(), Some("x.dev/c"));
        assert_eq!(selectable_source(&json!({"kind": "Pod"})), None);
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
