//! The structural schema, parsed once from a CRD version's `openAPIV3Schema`.

use std::sync::Arc;

use regex::Regex;
use serde_json::{Map, Value};

use super::FieldCause;
use super::cel_rules::{self, Rule};
use super::errors::{Bad, ErrKind, FieldErr, go_quote};

#[derive(Debug, Clone, Default)]
pub(crate) struct Node {
    pub ty: Option<String>,
    pub format: Option<String>,
    pub nullable: bool,
    /// Declared properties, in key order.
    pub properties: Vec<(String, Node)>,
    pub required: Vec<String>,
    pub items: Option<Box<Node>>,
    /// `additionalProperties` with a schema: the node is a map.
    pub additional: Option<Box<Node>>,
    /// `additionalProperties: false`.
    pub additional_forbidden: bool,
    pub default: Option<Value>,
    pub enum_values: Option<Vec<Value>>,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
    pub exclusive_minimum: bool,
    pub exclusive_maximum: bool,
    pub multiple_of: Option<f64>,
    pub min_length: Option<i64>,
    pub max_length: Option<i64>,
    pub pattern: Option<(String, Regex)>,
    pub min_items: Option<i64>,
    pub max_items: Option<i64>,
    pub unique_items: bool,
    pub min_properties: Option<i64>,
    pub max_properties: Option<i64>,
    pub all_of: Vec<Node>,
    pub any_of: Vec<Node>,
    pub one_of: Vec<Node>,
    pub not: Option<Box<Node>>,
    pub preserve_unknown: bool,
    pub embedded: bool,
    pub int_or_string: bool,
    pub list_type: Option<String>,
    pub list_map_keys: Vec<String>,
    /// `x-kubernetes-map-type` (`granular` or `atomic`).
    pub map_type: Option<String>,
    pub rules: Vec<Arc<Rule>>,
}

impl Node {
    pub(crate) fn property(&self, name: &str) -> Option<&Node> {
        self.properties
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, n)| n)
    }

    /// The type kube-openapi checks (`x-kubernetes-int-or-string` is `integer,string`).
    pub(crate) fn types(&self) -> Vec<&str> {
        if self.int_or_string {
            vec!["integer", "string"]
        } else {
            self.ty.iter().map(String::as_str).collect()
        }
    }

    /// The value the apiserver's CEL errors show as the bad value: the schema's type.
    pub(crate) fn cel_type_name(&self) -> &str {
        self.ty.as_deref().unwrap_or("")
    }
}

/// Where a schema node sits inside the CRD, for errors on the CRD itself:
/// `openAPIV3Schema.properties[spec].items`.
#[derive(Clone)]
pub(crate) struct SchemaPath(pub String);

impl SchemaPath {
    fn key(&self, field: &str, key: &str) -> SchemaPath {
        SchemaPath(format!("{}.{field}[{key}]", self.0))
    }
    fn child(&self, field: &str) -> SchemaPath {
        SchemaPath(format!("{}.{field}", self.0))
    }
    fn index(&self, field: &str, i: usize) -> SchemaPath {
        SchemaPath(format!("{}.{field}[{i}]", self.0))
    }
}

fn invalid(path: &SchemaPath, bad: Value, detail: impl Into<String>) -> FieldCause {
    FieldErr::new(ErrKind::Invalid, path.0.clone(), Bad::Json(bad), detail).into_cause()
}

fn get_bool(m: &Map<String, Value>, key: &str, path: &SchemaPath) -> Result<bool, FieldCause> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(invalid(&path.child(key), v.clone(), "must be a boolean")),
    }
}

fn get_f64(
    m: &Map<String, Value>,
    key: &str,
    path: &SchemaPath,
) -> Result<Option<f64>, FieldCause> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(v) => Err(invalid(&path.child(key), v.clone(), "must be a number")),
    }
}

fn get_i64(
    m: &Map<String, Value>,
    key: &str,
    path: &SchemaPath,
) -> Result<Option<i64>, FieldCause> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_i64().is_some_and(|i| i >= 0) => Ok(n.as_i64()),
        Some(v) => Err(invalid(
            &path.child(key),
            v.clone(),
            "must be a non-negative integer",
        )),
    }
}

fn get_str(
    m: &Map<String, Value>,
    key: &str,
    path: &SchemaPath,
) -> Result<Option<String>, FieldCause> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(invalid(&path.child(key), v.clone(), "must be a string")),
    }
}

fn get_str_list(
    m: &Map<String, Value>,
    key: &str,
    path: &SchemaPath,
) -> Result<Vec<String>, FieldCause> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(invalid(
                    &path.index(key, i),
                    other.clone(),
                    "must be a string",
                )),
            })
            .collect(),
        Some(v) => Err(invalid(
            &path.child(key),
            v.clone(),
            "must be a list of strings",
        )),
    }
}

const TYPES: [&str; 6] = ["array", "boolean", "integer", "number", "object", "string"];

pub(crate) fn parse(v: &Value, path: &SchemaPath) -> Result<Node, FieldCause> {
    let Value::Object(m) = v else {
        return Err(invalid(path, v.clone(), "must be an object"));
    };
    let mut node = Node {
        ty: get_str(m, "type", path)?,
        format: get_str(m, "format", path)?,
        nullable: get_bool(m, "nullable", path)?,
        required: get_str_list(m, "required", path)?,
        default: m.get("default").cloned(),
        minimum: get_f64(m, "minimum", path)?,
        maximum: get_f64(m, "maximum", path)?,
        exclusive_minimum: get_bool(m, "exclusiveMinimum", path)?,
        exclusive_maximum: get_bool(m, "exclusiveMaximum", path)?,
        multiple_of: get_f64(m, "multipleOf", path)?,
        min_length: get_i64(m, "minLength", path)?,
        max_length: get_i64(m, "maxLength", path)?,
        min_items: get_i64(m, "minItems", path)?,
        max_items: get_i64(m, "maxItems", path)?,
        unique_items: get_bool(m, "uniqueItems", path)?,
        min_properties: get_i64(m, "minProperties", path)?,
        max_properties: get_i64(m, "maxProperties", path)?,
        preserve_unknown: get_bool(m, "x-kubernetes-preserve-unknown-fields", path)?,
        embedded: get_bool(m, "x-kubernetes-embedded-resource", path)?,
        int_or_string: get_bool(m, "x-kubernetes-int-or-string", path)?,
        list_type: get_str(m, "x-kubernetes-list-type", path)?,
        list_map_keys: get_str_list(m, "x-kubernetes-list-map-keys", path)?,
        map_type: get_str(m, "x-kubernetes-map-type", path)?,
        ..Node::default()
    };
    if let Some(ty) = &node.ty
        && !TYPES.contains(&ty.as_str())
    {
        let supported: Vec<String> = TYPES.iter().map(|t| go_quote(t)).collect();
        return Err(FieldErr::new(
            ErrKind::NotSupported,
            path.child("type").0,
            Bad::str(ty.clone()),
            format!("supported values: {}", supported.join(", ")),
        )
        .into_cause());
    }
    if let Some(Value::Null) = node.default {
        node.default = None;
    }
    if let Some(p) = get_str(m, "pattern", path)? {
        let re = Regex::new(&p).map_err(|e| {
            invalid(
                &path.child("pattern"),
                Value::String(p.clone()),
                format!("must be a valid regular expression, but isn't: {e}"),
            )
        })?;
        node.pattern = Some((p, re));
    }
    match m.get("enum") {
        None | Some(Value::Null) => {}
        Some(Value::Array(values)) => node.enum_values = Some(values.clone()),
        Some(other) => {
            return Err(invalid(
                &path.child("enum"),
                other.clone(),
                "must be a list",
            ));
        }
    }
    match m.get("properties") {
        None | Some(Value::Null) => {}
        Some(Value::Object(props)) => {
            for (k, v) in props {
                node.properties
                    .push((k.clone(), parse(v, &path.key("properties", k))?));
            }
        }
        Some(other) => {
            return Err(invalid(
                &path.child("properties"),
                other.clone(),
                "must be an object",
            ));
        }
    }
    match m.get("items") {
        None | Some(Value::Null) => {}
        Some(v @ Value::Object(_)) => node.items = Some(Box::new(parse(v, &path.child("items"))?)),
        Some(other) => {
            return Err(invalid(
                &path.child("items"),
                other.clone(),
                "items must be a schema object and not an array",
            ));
        }
    }
    match m.get("additionalProperties") {
        None | Some(Value::Null) | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => node.additional_forbidden = true,
        Some(v) => {
            node.additional = Some(Box::new(parse(v, &path.child("additionalProperties"))?));
        }
    }
    for (key, out) in [
        ("allOf", &mut node.all_of),
        ("anyOf", &mut node.any_of),
        ("oneOf", &mut node.one_of),
    ] {
        match m.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Array(subs)) => {
                for (i, sub) in subs.iter().enumerate() {
                    out.push(parse(sub, &path.index(key, i))?);
                }
            }
            Some(other) => return Err(invalid(&path.child(key), other.clone(), "must be a list")),
        }
    }
    if let Some(v) = m.get("not").filter(|v| !v.is_null()) {
        node.not = Some(Box::new(parse(v, &path.child("not"))?));
    }
    match m.get("x-kubernetes-validations") {
        None | Some(Value::Null) => {}
        Some(Value::Array(rules)) => {
            for (i, rule) in rules.iter().enumerate() {
                let rule_path = path.index("x-kubernetes-validations", i);
                node.rules
                    .push(Arc::new(cel_rules::compile_rule(rule, &rule_path.0)?));
            }
        }
        Some(other) => {
            return Err(invalid(
                &path.child("x-kubernetes-validations"),
                other.clone(),
                "must be a list",
            ));
        }
    }
    check_list_and_map_types(&node, path)?;
    Ok(node)
}

fn err(kind: ErrKind, path: &SchemaPath, bad: Bad, detail: impl Into<String>) -> FieldCause {
    FieldErr::new(kind, path.0.clone(), bad, detail).into_cause()
}

/// The CRD validation of `x-kubernetes-list-type`, `x-kubernetes-list-map-keys` and
/// `x-kubernetes-map-type` (apiextensions' `ValidateCustomResourceDefinitionOpenAPISchema` and
/// `validateMapListKeysMapSet`, in their order; the first error only).
fn check_list_and_map_types(node: &Node, path: &SchemaPath) -> Result<(), FieldCause> {
    use ErrKind::{Forbidden, Invalid, NotSupported, Required};
    let ty = node.ty.as_deref().unwrap_or("");
    let supported = |values: &[&str]| {
        let quoted: Vec<String> = values.iter().map(|v| go_quote(v)).collect();
        format!("supported values: {}", quoted.join(", "))
    };
    let type_error = |what: &str| {
        let detail = format!(
            "must be {what} if x-kubernetes-{}-type is specified",
            if what == "object" { "map" } else { "list" }
        );
        if ty.is_empty() {
            err(Required, &path.child("type"), Bad::Omit, detail)
        } else {
            err(Invalid, &path.child("type"), Bad::str(ty), detail)
        }
    };
    if let Some(mt) = node.map_type.as_deref() {
        if ty != "object" {
            return Err(type_error("object"));
        }
        if mt != "atomic" && mt != "granular" {
            return Err(err(
                NotSupported,
                &path.child("x-kubernetes-map-type"),
                Bad::str(mt),
                supported(&["atomic", "granular"]),
            ));
        }
    }
    let items = node.items.as_deref();
    let list_type = node.list_type.as_deref();
    if list_type.is_some() && ty != "array" {
        return Err(type_error("array"));
    }
    // Go passes the items' list type (a *string, maybe nil) as the bad value of both
    let items_list_type = || {
        items
            .and_then(|i| i.list_type.clone())
            .map_or(Bad::Json(serde_json::Value::Null), Bad::str)
    };
    const SET_ITEMS: &str = "must be atomic as item of a list with x-kubernetes-list-type=set";
    if list_type == Some("set")
        && let Some(is) = items
    {
        match is.ty.as_deref() {
            Some("array") if is.list_type.as_deref().is_some_and(|t| t != "atomic") => {
                return Err(err(
                    Invalid,
                    &path.child("items").child("x-kubernetes-list-type"),
                    items_list_type(),
                    SET_ITEMS,
                ));
            }
            Some("object") if is.map_type.as_deref() != Some("atomic") => {
                return Err(err(
                    Invalid,
                    &path.child("items").child("x-kubernetes-map-type"),
                    items_list_type(),
                    SET_ITEMS,
                ));
            }
            _ => {}
        }
    }
    if let Some(lt) = list_type
        && !["atomic", "set", "map"].contains(&lt)
    {
        return Err(err(
            NotSupported,
            &path.child("x-kubernetes-list-type"),
            Bad::str(lt),
            supported(&["atomic", "set", "map"]),
        ));
    }
    const KEYS_NEED_MAP: &str = "must be map if x-kubernetes-list-map-keys is non-empty";
    if !node.list_map_keys.is_empty() {
        match list_type {
            None => {
                return Err(err(
                    Required,
                    &path.child("x-kubernetes-list-type"),
                    Bad::Omit,
                    KEYS_NEED_MAP,
                ));
            }
            Some(lt) if lt != "map" => {
                return Err(err(
                    Invalid,
                    &path.child("x-kubernetes-list-type"),
                    Bad::str(lt),
                    KEYS_NEED_MAP,
                ));
            }
            _ => {}
        }
    }
    let keys_value = || {
        let quoted: Vec<String> = node.list_map_keys.iter().map(|k| go_quote(k)).collect();
        Bad::Raw(format!("[]string{{{}}}", quoted.join(", ")))
    };
    if list_type == Some("map") {
        if node.list_map_keys.is_empty() {
            return Err(err(
                Required,
                &path.child("x-kubernetes-list-map-keys"),
                Bad::Omit,
                "must not be empty if x-kubernetes-list-type is map",
            ));
        }
        let Some(is) = items else {
            return Err(err(
                Required,
                &path.child("items"),
                Bad::Omit,
                "must have a schema if x-kubernetes-list-type is map",
            ));
        };
        let item_ty = is.ty.as_deref().unwrap_or("");
        if item_ty != "object" {
            return Err(err(
                Invalid,
                &path.child("items").child("type"),
                Bad::str(item_ty),
                "must be object if parent array's x-kubernetes-list-type is map",
            ));
        }
        let mut seen = Vec::new();
        for k in &node.list_map_keys {
            match is.property(k) {
                Some(p) if matches!(p.ty.as_deref(), Some("array" | "object")) => {
                    return Err(err(
                        Invalid,
                        &path.child("items").key("properties", k).child("type"),
                        Bad::str(item_ty),
                        "must be a scalar type if parent array's x-kubernetes-list-type is map",
                    ));
                }
                Some(_) => {}
                None => {
                    return Err(err(
                        Invalid,
                        &path.child("x-kubernetes-list-map-keys"),
                        keys_value(),
                        "entries must all be names of item properties",
                    ));
                }
            }
            if seen.contains(&k) {
                return Err(err(
                    Invalid,
                    &path.child("x-kubernetes-list-map-keys"),
                    keys_value(),
                    "must not contain duplicate entries",
                ));
            }
            seen.push(k);
        }
    }
    if let (Some(lt @ ("set" | "map")), Some(is)) = (list_type, items) {
        if is.nullable {
            return Err(err(
                Forbidden,
                &path.child("items").child("nullable"),
                Bad::Omit,
                format!("cannot be nullable when x-kubernetes-list-type is {lt}"),
            ));
        }
        if lt == "map" {
            for k in &node.list_map_keys {
                let Some(p) = is.property(k) else { continue };
                let at = path.child("items").key("properties", k);
                if !is.required.contains(k) && p.default.is_none() {
                    return Err(err(
                        Required,
                        &at.child("default"),
                        Bad::Omit,
                        "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
                    ));
                }
                if p.nullable {
                    return Err(err(
                        Forbidden,
                        &at.child("nullable"),
                        Bad::Omit,
                        "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
                    ));
                }
            }
        }
    }
    Ok(())
}
