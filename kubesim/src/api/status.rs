//! API errors rendered as `Status` objects exactly like kube-apiserver's.

use serde_json::{Map, Value, json};

use super::resource::ResourceDef;

/// An error answer: HTTP code + a `Status` body.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

/// One entry of `details.causes`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cause {
    pub reason: String,
    pub field: String,
    pub message: String,
}

fn details(def: &ResourceDef, name: &str, kind: &str) -> Value {
    let mut d = Map::new();
    if !name.is_empty() {
        d.insert("name".into(), name.into());
    }
    if !def.group.is_empty() {
        d.insert("group".into(), def.group.clone().into());
    }
    d.insert("kind".into(), kind.into());
    Value::Object(d)
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// The generic 404 for a path no resource serves.
    pub fn no_resource() -> Self {
        Self {
            details: Some(json!({})),
            ..Self::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        }
    }

    pub fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self {
            details: Some(details(def, name, &def.plural)),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", def.qualified_resource()),
            )
        }
    }

    pub fn namespace_not_found(ns: &str) -> Self {
        Self {
            details: Some(json!({"name": ns, "kind": "namespaces"})),
            ..Self::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
        }
    }

    pub fn namespace_terminating(def: &ResourceDef, name: &str, ns: &str) -> Self {
        let mut d = details(def, name, &def.plural);
        // The NamespaceLifecycle admission plugin says which field is at fault, and why.
        d["causes"] = serde_json::json!([{
            "reason": "NamespaceTerminating",
            "message": format!("namespace {ns} is being terminated"),
            "field": "metadata.namespace",
        }]);
        Self {
            details: Some(d),
            ..Self::new(
                403,
                "Forbidden",
                format!(
                    "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    def.qualified_resource()
                ),
            )
        }
    }

    pub fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self {
            details: Some(details(def, name, &def.plural)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", def.qualified_resource()),
            )
        }
    }

    /// `Operation cannot be fulfilled on pods "x": <why>`.
    pub fn conflict(def: &ResourceDef, name: &str, why: &str) -> Self {
        Self {
            details: Some(details(def, name, &def.plural)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {why}",
                    def.qualified_resource()
                ),
            )
        }
    }

    pub fn stale(def: &ResourceDef, name: &str) -> Self {
        Self::conflict(
            def,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid; `message` is the full message (`Kind "name" is invalid: ...`).
    pub fn invalid_with_message(
        def: &ResourceDef,
        name: &str,
        message: String,
        causes: &[Cause],
    ) -> Self {
        let mut d = details(def, name, &def.kind);
        let cs: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        d.as_object_mut()
            .expect("map")
            .insert("causes".into(), Value::Array(cs));
        Self {
            details: Some(d),
            ..Self::new(422, "Invalid", message)
        }
    }

    /// 422 Invalid with the message built from the causes the way apimachinery's
    /// `NewInvalid` does.
    pub fn invalid(def: &ResourceDef, name: &str, causes: &[Cause]) -> Self {
        // the message lists each distinct error once (`ErrorList.ToAggregate`); the causes
        // keep them all
        let mut msgs: Vec<String> = Vec::new();
        for c in causes {
            let m = format!("{}: {}", c.field, c.message);
            if !msgs.contains(&m) {
                msgs.push(m);
            }
        }
        let body = if msgs.len() == 1 {
            msgs[0].clone()
        } else {
            format!("[{}]", msgs.join(", "))
        };
        let message = format!("{} \"{name}\" is invalid: {body}", def.qualified_kind());
        Self::invalid_with_message(def, name, message, causes)
    }

    pub fn method_not_allowed() -> Self {
        Self {
            details: Some(json!({})),
            ..Self::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        }
    }

    pub fn unsupported_media(accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    pub fn expired(message: String) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), "Status".into());
        m.insert("apiVersion".into(), "v1".into());
        m.insert("metadata".into(), json!({}));
        m.insert("status".into(), "Failure".into());
        m.insert("message".into(), self.message.clone().into());
        m.insert("reason".into(), self.reason.into());
        if let Some(d) = &self.details {
            m.insert("details".into(), d.clone());
        }
        m.insert("code".into(), self.code.into());
        Value::Object(m)
    }
}

/// `Field: Required value` cause.
pub(crate) fn required(field: impl Into<String>) -> Cause {
    Cause {
        reason: "FieldValueRequired".into(),
        field: field.into(),
        message: "Required value".into(),
    }
}

/// `Field: Invalid value: <value>: <why>` cause.
pub(crate) fn invalid_value(field: impl Into<String>, value: &Value, why: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid".into(),
        field: field.into(),
        message: format!("Invalid value: {}: {why}", value),
    }
}

pub(crate) fn forbidden(field: impl Into<String>, why: &str) -> Cause {
    Cause {
        reason: "FieldValueForbidden".into(),
        field: field.into(),
        message: format!("Forbidden: {why}"),
    }
}
