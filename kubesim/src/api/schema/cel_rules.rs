//! `x-kubernetes-validations`: rules compiled once per CRD version and evaluated at the node
//! where they appear, as `apiextensions-apiserver/pkg/apiserver/schema/cel` does.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use cel::objects::{Key, Map as CelMap};
use cel::{Context, Env, ExecutionError, Program, Value as CelValue};
use serde_json::Value;

use super::FieldCause;
use super::errors::{Bad, ErrKind, FieldErr, go_quote};
use super::k8s_lib;
use super::node::Node;
use super::structural::{FieldPath, list_map_key};

/// The CEL environment of CRD validation rules: the standard library, the strings extension and
/// the Kubernetes list and regex functions.
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    // These registrations only fail on duplicate declarations, which a fixed set cannot have.
    let _ = env.add_extension(cel::extensions::strings);
    let _ = env.add_extension(k8s_lib::extension);
    Arc::new(env)
});

const REASONS: [&str; 4] = [
    "FieldValueInvalid",
    "FieldValueForbidden",
    "FieldValueRequired",
    "FieldValueDuplicate",
];

#[derive(Debug)]
pub(crate) struct Rule {
    pub rule: String,
    pub message: String,
    pub reason: Option<String>,
    /// `fieldPath` normalised to a relative field path (`spec.port`).
    pub field_path: Option<String>,
    program: Program,
    message_expression: Option<Program>,
    uses_old_self: bool,
}

impl Rule {
    /// `ruleErrorString`: the message when there is one, else the rule.
    fn error_string(&self) -> &str {
        let message = self.message.trim();
        if message.is_empty() {
            self.rule.trim()
        } else {
            message
        }
    }

    /// `ruleMessageOrDefault`.
    fn message_or_default(&self) -> String {
        let message = self.message.trim();
        if message.is_empty() {
            format!("failed rule: {}", self.error_string())
        } else {
            message.to_string()
        }
    }
}

fn go_rule_struct(m: &serde_json::Map<String, Value>) -> String {
    let s = |k: &str| go_quote(m.get(k).and_then(Value::as_str).unwrap_or(""));
    let reason = if m.get("reason").and_then(Value::as_str).is_some() {
        "(*apiextensions.FieldValueErrorReason)(0xc000000000)"
    } else {
        "(*apiextensions.FieldValueErrorReason)(nil)"
    };
    format!(
        "apiextensions.ValidationRule{{Rule:{}, Message:{}, MessageExpression:{}, Reason:{reason}, FieldPath:{}}}",
        s("rule"),
        s("message"),
        s("messageExpression"),
        s("fieldPath"),
    )
}

/// Compiles one entry of `x-kubernetes-validations`; `path` locates it in the CRD for the error.
pub(crate) fn compile_rule(v: &Value, path: &str) -> Result<Rule, FieldCause> {
    let Value::Object(m) = v else {
        return Err(FieldErr::new(
            ErrKind::Invalid,
            path,
            Bad::Json(v.clone()),
            "must be an object",
        )
        .into_cause());
    };
    let text = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
    let rule = text("rule").unwrap_or_default();
    if rule.trim().is_empty() {
        return Err(FieldErr::new(
            ErrKind::Required,
            format!("{path}.rule"),
            Bad::Omit,
            "rule is not specified",
        )
        .into_cause());
    }
    let program = ENV.compile(&rule).map_err(|e| {
        FieldErr::new(
            ErrKind::Invalid,
            format!("{path}.rule"),
            Bad::Raw(go_rule_struct(m)),
            format!("compilation failed: {e}"),
        )
        .into_cause()
    })?;
    let message_expression = match text("messageExpression").filter(|s| !s.trim().is_empty()) {
        None => None,
        Some(expr) => Some(ENV.compile(&expr).map_err(|e| {
            FieldErr::new(
                ErrKind::Invalid,
                format!("{path}.messageExpression"),
                Bad::Raw(go_rule_struct(m)),
                format!("messageExpression compilation failed: {e}"),
            )
            .into_cause()
        })?),
    };
    let reason = text("reason").filter(|r| !r.is_empty());
    if let Some(r) = &reason
        && !REASONS.contains(&r.as_str())
    {
        let supported: Vec<String> = REASONS.iter().map(|r| go_quote(r)).collect();
        return Err(FieldErr::new(
            ErrKind::NotSupported,
            format!("{path}.reason"),
            Bad::str(r.clone()),
            format!("supported values: {}", supported.join(", ")),
        )
        .into_cause());
    }
    let field_path = match text("fieldPath").filter(|p| !p.is_empty()) {
        None => None,
        Some(p) => Some(normalize_field_path(&p).ok_or_else(|| {
            FieldErr::new(
                ErrKind::Invalid,
                format!("{path}.fieldPath"),
                Bad::str(p.clone()),
                "fieldPath must be a valid path",
            )
            .into_cause()
        })?),
    };
    let uses_old_self = program.references().has_variable("oldSelf");
    Ok(Rule {
        rule,
        message: text("message").unwrap_or_default(),
        reason,
        field_path,
        program,
        message_expression,
        uses_old_self,
    })
}

/// `.spec.port` or `.spec['port']` → `spec.port`.
fn normalize_field_path(p: &str) -> Option<String> {
    let mut rest = p;
    let mut parts = Vec::new();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']")?;
            parts.push(r[..end].to_string());
            rest = &r[end + 2..];
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end == 0 {
                return None;
            }
            parts.push(r[..end].to_string());
            rest = &r[end..];
        } else {
            return None;
        }
    }
    if parts.is_empty() {
        None
    } else {
        Some(parts.join("."))
    }
}

/// Evaluates every rule of the schema against `obj` (and `old` on update).
pub(crate) fn validate(obj: &Value, old: Option<&Value>, root: &Node, out: &mut Vec<FieldErr>) {
    walk(obj, old, root, &FieldPath::root(), true, out);
}

fn walk(
    v: &Value,
    old: Option<&Value>,
    s: &Node,
    path: &FieldPath,
    is_root: bool,
    out: &mut Vec<FieldErr>,
) {
    if !s.rules.is_empty() {
        let this = to_cel(v, Some(s), is_root);
        let old_this = old.map(|o| to_cel(o, Some(s), is_root));
        for rule in &s.rules {
            evaluate(rule, &this, old_this.as_ref(), s, path, out);
        }
    }
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let old_child = old.and_then(|o| o.get(k));
                if let Some(prop) = s.property(k) {
                    walk(child, old_child, prop, &path.child(k), false, out);
                } else if let Some(additional) = s.additional.as_deref() {
                    walk(child, old_child, additional, &path.key(k), false, out);
                }
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = s.items.as_deref() else {
                return;
            };
            let old_items = old.and_then(Value::as_array);
            for (i, item) in items.iter().enumerate() {
                // Only items of `map` lists correlate with an old item (by their keys).
                let old_item = match (s.list_type.as_deref(), old_items) {
                    (Some("map"), Some(old_items)) => {
                        let key = list_map_key(item, s);
                        old_items.iter().find(|o| list_map_key(o, s) == key)
                    }
                    _ => None,
                };
                walk(item, old_item, item_schema, &path.index(i), false, out);
            }
        }
        _ => {}
    }
}

fn evaluate(
    rule: &Rule,
    this: &CelValue,
    old_this: Option<&CelValue>,
    s: &Node,
    path: &FieldPath,
    out: &mut Vec<FieldErr>,
) {
    // Transition rules only run on update, where the node has an old value.
    if rule.uses_old_self && old_this.is_none() {
        return;
    }
    let mut ctx = Context::with_env(Arc::clone(&ENV));
    ctx.add_variable_from_value("self", this.clone());
    if let Some(old) = old_this {
        ctx.add_variable_from_value("oldSelf", old.clone());
    }
    let type_name = s.cel_type_name().to_string();
    match rule.program.execute(&ctx) {
        Ok(CelValue::Bool(true)) => {}
        Ok(CelValue::Bool(false)) => {
            let detail = rule
                .message_expression
                .as_ref()
                .and_then(|expr| match expr.execute(&ctx) {
                    Ok(CelValue::String(m)) if !m.trim().is_empty() && !m.contains('\n') => {
                        Some(m.to_string())
                    }
                    _ => None,
                })
                .unwrap_or_else(|| rule.message_or_default());
            let field = match &rule.field_path {
                Some(fp) => path.child(fp),
                None => path.clone(),
            };
            out.push(rule_error(
                rule.reason.as_deref(),
                field.render(),
                type_name,
                detail,
            ));
        }
        Ok(_) => out.push(FieldErr::new(
            ErrKind::Invalid,
            path.render(),
            Bad::str(type_name),
            format!(
                "rule did not evaluate to a bool evaluating rule: {}",
                rule.error_string()
            ),
        )),
        Err(e) => {
            let detail = if is_overload_error(&e) {
                format!(
                    "'no such overload': call arguments did not match a supported operator, function or macro signature for rule: {}",
                    rule.error_string()
                )
            } else {
                format!(
                    "{} evaluating rule: {}",
                    cel_go_error(&e),
                    rule.error_string()
                )
            };
            out.push(FieldErr::new(
                ErrKind::Invalid,
                path.render(),
                Bad::str(type_name),
                detail,
            ));
        }
    }
}

/// `fieldErrorForReason`.
fn rule_error(reason: Option<&str>, field: String, type_name: String, detail: String) -> FieldErr {
    match reason {
        Some("FieldValueForbidden") => FieldErr::new(ErrKind::Forbidden, field, Bad::Omit, detail),
        Some("FieldValueRequired") => FieldErr::new(ErrKind::Required, field, Bad::Omit, detail),
        Some("FieldValueDuplicate") => {
            FieldErr::new(ErrKind::Duplicate, field, Bad::str(type_name), "")
        }
        _ => FieldErr::new(ErrKind::Invalid, field, Bad::str(type_name), detail),
    }
}

fn is_overload_error(e: &ExecutionError) -> bool {
    matches!(
        e,
        ExecutionError::NoSuchOverload(_)
            | ExecutionError::ValuesNotComparable(..)
            | ExecutionError::UnsupportedBinaryOperator(..)
            | ExecutionError::UnexpectedType { .. }
    )
}

/// The text cel-go gives the same runtime error.
fn cel_go_error(e: &ExecutionError) -> String {
    match e {
        ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
        ExecutionError::DivisionByZero(_) => "division by zero".into(),
        ExecutionError::RemainderByZero(_) => "modulus by zero".into(),
        ExecutionError::Overflow(..) => "integer overflow".into(),
        ExecutionError::IndexOutOfBounds(i) => match i {
            CelValue::Int(i) => format!("index out of range: {i}"),
            CelValue::UInt(i) => format!("index out of range: {i}"),
            other => format!("index out of range: {other:?}"),
        },
        ExecutionError::UndeclaredReference(name) => format!("no such attribute: {name}"),
        ExecutionError::FunctionError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

fn key(s: &str) -> Key {
    Key::String(Arc::new(s.to_string()))
}

fn cel_map(entries: HashMap<Key, CelValue>) -> CelValue {
    CelValue::Map(CelMap {
        map: Arc::new(entries),
    })
}

/// Converts a JSON value to CEL as the apiserver types it from the schema: `number` fields are
/// doubles, `integer` ones ints; at a resource root only `metadata.name` and
/// `metadata.generateName` are visible; objects with declared properties expose only those.
fn to_cel(v: &Value, s: Option<&Node>, is_resource: bool) -> CelValue {
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::String(text) => CelValue::String(Arc::new(text.clone())),
        Value::Number(n) => {
            let ty = s.and_then(|s| s.ty.as_deref());
            match (ty, n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some("number"), _, _, Some(f)) => CelValue::Float(f),
                (_, Some(i), _, _) => CelValue::Int(i),
                (Some("integer"), _, _, Some(f)) if f.fract() == 0.0 && f.abs() < 9.2e18 => {
                    CelValue::Int(f as i64)
                }
                (_, None, Some(u), _) => CelValue::UInt(u),
                (_, _, _, Some(f)) => CelValue::Float(f),
                _ => CelValue::Null,
            }
        }
        Value::Array(items) => {
            let item_schema = s.and_then(|s| s.items.as_deref());
            CelValue::List(Arc::new(
                items
                    .iter()
                    .map(|i| to_cel(i, item_schema, item_schema.is_some_and(|n| n.embedded)))
                    .collect(),
            ))
        }
        Value::Object(map) => {
            let mut entries = HashMap::new();
            let is_resource = is_resource || s.is_some_and(|n| n.embedded);
            if is_resource {
                for k in ["apiVersion", "kind"] {
                    if let Some(Value::String(text)) = map.get(k) {
                        entries.insert(key(k), CelValue::String(Arc::new(text.clone())));
                    }
                }
                if let Some(Value::Object(meta)) = map.get("metadata") {
                    let mut visible = HashMap::new();
                    for k in ["name", "generateName"] {
                        if let Some(Value::String(text)) = meta.get(k) {
                            visible.insert(key(k), CelValue::String(Arc::new(text.clone())));
                        }
                    }
                    entries.insert(key("metadata"), cel_map(visible));
                }
            }
            match s {
                Some(node) if !node.properties.is_empty() => {
                    for (k, prop) in &node.properties {
                        if is_resource && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                            continue;
                        }
                        if let Some(child) = map.get(k) {
                            entries.insert(key(k), to_cel(child, Some(prop), false));
                        }
                    }
                }
                Some(node) if node.additional.is_some() => {
                    let additional = node.additional.as_deref();
                    for (k, child) in map {
                        entries.insert(key(k), to_cel(child, additional, false));
                    }
                }
                _ => {
                    for (k, child) in map {
                        if !(is_resource
                            && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                        {
                            entries.insert(key(k), to_cel(child, None, false));
                        }
                    }
                }
            }
            cel_map(entries)
        }
    }
}
