//! OpenAPI value validation as kube-openapi's `SchemaValidator` runs it for custom resources,
//! with its errors converted as `apiextensions-apiserver`'s `ValidateCustomResource` does.
//! Paths are kube-openapi's: `spec.hosts[0]`, map entries `spec.labels.key`.

use serde_json::Value;

use super::errors::{Bad, ErrKind, FieldErr, child, err_field, go_float, go_quote, json_type};
use super::formats;
use super::node::Node;

/// A kube-openapi validation error before conversion: its code decides the field error type.
enum Code {
    Required,
    Enum(Vec<Value>),
    TooLong(i64),
    MaxItems {
        actual: i64,
        max: i64,
    },
    InvalidType,
    Other,
    /// Errors that are not `*errors.Validation` (anyOf/oneOf/not, additionalProperties: false):
    /// the apiserver reports them on the nil path with an empty bad value.
    Composite,
}

struct OpenApiErr {
    code: Code,
    name: String,
    value: Value,
    message: String,
}

fn convert(e: OpenApiErr) -> FieldErr {
    let field = err_field(e.name.trim_start_matches('.'));
    match e.code {
        Code::Required => FieldErr::new(ErrKind::Required, field, Bad::Omit, ""),
        Code::Enum(values) => {
            let quoted: Vec<String> = values
                .iter()
                .map(|v| match v {
                    Value::String(s) => go_quote(s),
                    other => go_quote(&other.to_string()),
                })
                .collect();
            let detail = if quoted.is_empty() {
                String::new()
            } else {
                format!("supported values: {}", quoted.join(", "))
            };
            FieldErr::new(ErrKind::NotSupported, field, Bad::Json(e.value), detail)
        }
        Code::TooLong(max) => FieldErr::new(
            ErrKind::TooLong,
            field,
            Bad::Json(e.value),
            format!("may not be longer than {max}"),
        ),
        Code::MaxItems { actual, max } => FieldErr::new(
            ErrKind::TooMany,
            field,
            Bad::Int(actual),
            format!("must have at most {max} items"),
        ),
        Code::InvalidType => {
            FieldErr::new(ErrKind::TypeInvalid, field, Bad::Json(e.value), e.message)
        }
        // A validation error without a value shows `""`, as ValidateCustomResource substitutes.
        Code::Other if e.value.is_null() => {
            FieldErr::new(ErrKind::Invalid, field, Bad::str(""), e.message)
        }
        Code::Other => FieldErr::new(ErrKind::Invalid, field, Bad::Json(e.value), e.message),
        Code::Composite => FieldErr::new(ErrKind::Invalid, "<nil>", Bad::str(""), e.message),
    }
}

fn err(code: Code, name: &str, value: Value, message: String) -> OpenApiErr {
    OpenApiErr {
        code,
        name: name.to_string(),
        value,
        message,
    }
}

/// Validates `obj` against the schema; the errors as the apiserver reports them.
pub(crate) fn validate(obj: &Value, root: &Node) -> Vec<FieldErr> {
    let mut out = Vec::new();
    validate_node(obj, root, "", &mut out);
    let mut errs: Vec<FieldErr> = out.into_iter().map(convert).collect();
    validate_embedded_and_lists(obj, root, &FieldPath::root(), true, &mut errs);
    errs
}

fn type_error(path: &str, ty: &str, data_type: &str) -> OpenApiErr {
    let message = format!(
        "{path} in body must be of type {ty}: {}",
        go_quote(data_type)
    );
    err(
        Code::InvalidType,
        path,
        Value::String(data_type.to_string()),
        message,
    )
}

/// kube-openapi's `typeValidator`.
fn check_type(v: &Value, s: &Node, path: &str, out: &mut Vec<OpenApiErr>) {
    let types = s.types();
    let format = s.format.as_deref().unwrap_or("");
    if types.is_empty() && format.is_empty() {
        return;
    }
    if v.is_null() {
        if !types.is_empty() && !types.contains(&"null") && !s.nullable {
            out.push(type_error(path, &types.join(","), "null"));
        }
        return;
    }
    let sch_type = json_type(v);
    let data_format = match v {
        Value::Number(n) if n.is_i64() => "int64",
        Value::Number(_) => "float64",
        _ => "",
    };
    let is_float_int = sch_type == "number"
        && v.as_f64()
            .is_some_and(|f| f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0)
        && types.contains(&"integer");
    let is_int_float = sch_type == "integer" && types.contains(&"number");
    let is_lower_int = format == "int64" && data_format == "int32";
    let stringish = v.is_string() || v.is_array();
    let format_accepts = types.contains(&sch_type)
        || data_format == format
        || is_float_int
        || is_int_float
        || is_lower_int;
    if !(stringish || format.is_empty() || format_accepts) {
        out.push(type_error(path, format, data_format));
        return;
    }
    let numeric = types.contains(&"number") || types.contains(&"integer");
    if stringish && !numeric && !format.is_empty() {
        return;
    }
    if !(types.contains(&sch_type) || is_float_int || is_int_float) {
        out.push(type_error(path, &types.join(","), sch_type));
    }
}

fn validate_node(v: &Value, s: &Node, path: &str, out: &mut Vec<OpenApiErr>) {
    check_type(v, s, path, out);
    if v.is_null() {
        check_enum(v, s, path, out);
        return;
    }
    check_composition(v, s, path, out);
    if let Value::String(text) = v {
        check_string(text, s, path, out);
        if let Some(format) = s.format.as_deref()
            && !formats::is_valid(format, text)
        {
            let message = format!(
                "{path} in body must be of type {format}: {}",
                go_quote(text)
            );
            out.push(err(Code::InvalidType, path, v.clone(), message));
        }
    }
    if let Value::Number(n) = v {
        check_number(v, n.as_f64().unwrap_or(0.0), s, path, out);
    }
    if let Value::Array(items) = v {
        check_array(items, s, path, out);
    }
    check_enum(v, s, path, out);
    if let Value::Object(map) = v {
        check_object(map, s, path, out);
    }
}

fn check_composition(v: &Value, s: &Node, path: &str, out: &mut Vec<OpenApiErr>) {
    for sub in &s.all_of {
        validate_node(v, sub, path, out);
    }
    if !s.any_of.is_empty() {
        let results: Vec<Vec<OpenApiErr>> =
            s.any_of.iter().map(|sub| collect(v, sub, path)).collect();
        if !results.iter().any(Vec::is_empty) {
            let message = format!("{path} must validate at least one schema (anyOf)");
            out.push(err(Code::Composite, path, Value::Null, message));
            if let Some(first) = results.into_iter().next() {
                out.extend(first);
            }
        }
    }
    if !s.one_of.is_empty() {
        let results: Vec<Vec<OpenApiErr>> =
            s.one_of.iter().map(|sub| collect(v, sub, path)).collect();
        let valid = results.iter().filter(|r| r.is_empty()).count();
        if valid != 1 {
            let detail = if valid > 1 {
                format!("Found {valid} valid alternatives")
            } else {
                String::new()
            };
            let message = format!("{path} must validate one and only one schema (oneOf). {detail}");
            out.push(err(Code::Composite, path, Value::Null, message));
            if valid == 0
                && let Some(first) = results.into_iter().next()
            {
                out.extend(first);
            }
        }
    }
    if let Some(not) = s.not.as_deref()
        && collect(v, not, path).is_empty()
    {
        let message = format!("{path} must not validate the schema (not)");
        out.push(err(Code::Composite, path, Value::Null, message));
    }
}

fn collect(v: &Value, s: &Node, path: &str) -> Vec<OpenApiErr> {
    let mut out = Vec::new();
    validate_node(v, s, path, &mut out);
    out
}

/// kube-openapi's `stringValidator`: stops at the first failure.
fn check_string(text: &str, s: &Node, path: &str, out: &mut Vec<OpenApiErr>) {
    let len = text.chars().count() as i64;
    let value = Value::String(text.to_string());
    if let Some(max) = s.max_length
        && len > max
    {
        let message = format!("{path} in body should be at most {max} chars long");
        out.push(err(Code::TooLong(max), path, value, message));
        return;
    }
    if let Some(min) = s.min_length
        && len < min
    {
        let message = format!("{path} in body should be at least {min} chars long");
        out.push(err(Code::Other, path, value, message));
        return;
    }
    if let Some((pattern, re)) = &s.pattern
        && !re.is_match(text)
    {
        let message = format!("{path} in body should match '{pattern}'");
        out.push(err(Code::Other, path, value, message));
    }
}

/// kube-openapi's `numberValidator`: multipleOf, minimum, maximum.
fn check_number(v: &Value, f: f64, s: &Node, path: &str, out: &mut Vec<OpenApiErr>) {
    if let Some(m) = s.multiple_of
        && m != 0.0
    {
        let q = f / m;
        if q.fract() != 0.0 {
            let message = format!("{path} in body should be a multiple of {}", go_float(m));
            out.push(err(Code::Other, path, v.clone(), message));
        }
    }
    if let Some(min) = s.minimum {
        let (bad, word) = if s.exclusive_minimum {
            (f <= min, "greater than")
        } else {
            (f < min, "greater than or equal to")
        };
        if bad {
            let message = format!("{path} in body should be {word} {}", go_float(min));
            out.push(err(Code::Other, path, v.clone(), message));
        }
    }
    if let Some(max) = s.maximum {
        let (bad, word) = if s.exclusive_maximum {
            (f >= max, "less than")
        } else {
            (f > max, "less than or equal to")
        };
        if bad {
            let message = format!("{path} in body should be {word} {}", go_float(max));
            out.push(err(Code::Other, path, v.clone(), message));
        }
    }
}

fn check_array(items: &[Value], s: &Node, path: &str, out: &mut Vec<OpenApiErr>) {
    if let Some(item_schema) = s.items.as_deref() {
        for (i, item) in items.iter().enumerate() {
            validate_node(item, item_schema, &format!("{path}[{i}]"), out);
        }
    }
    let size = items.len() as i64;
    if let Some(min) = s.min_items
        && size < min
    {
        let message = format!("{path} in body should have at least {min} items");
        out.push(err(Code::Other, path, Value::from(size), message));
    }
    if let Some(max) = s.max_items
        && size > max
    {
        let message = format!("{path} in body should have at most {max} items");
        out.push(err(
            Code::MaxItems { actual: size, max },
            path,
            Value::from(size),
            message,
        ));
    }
    if s.unique_items {
        let duplicate = items
            .iter()
            .enumerate()
            .any(|(i, a)| items[..i].iter().any(|b| json_eq(a, b)));
        if duplicate {
            let message = format!("{path} in body shouldn't contain duplicates");
            out.push(err(
                Code::Other,
                path,
                Value::Array(items.to_vec()),
                message,
            ));
        }
    }
}

/// Equality as Go's `reflect.DeepEqual` after the enum validator's conversion: numbers compare
/// by value whatever their JSON representation.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

fn check_enum(v: &Value, s: &Node, path: &str, out: &mut Vec<OpenApiErr>) {
    let Some(values) = &s.enum_values else { return };
    if values.is_empty() || values.iter().any(|e| json_eq(e, v)) {
        return;
    }
    let listed: Vec<String> = values.iter().map(|e| e.to_string()).collect();
    let message = format!("{path} in body should be one of [{}]", listed.join(" "));
    out.push(err(Code::Enum(values.clone()), path, v.clone(), message));
}

fn check_object(
    map: &serde_json::Map<String, Value>,
    s: &Node,
    path: &str,
    out: &mut Vec<OpenApiErr>,
) {
    let n = map.len() as i64;
    if let Some(min) = s.min_properties
        && n < min
    {
        let message = format!("{path} in body should have at least {min} properties");
        out.push(err(Code::Other, path, Value::Null, message));
        return;
    }
    if let Some(max) = s.max_properties
        && n > max
    {
        let message = format!("{path} in body should have at most {max} properties");
        out.push(err(
            Code::MaxItems { actual: -1, max },
            path,
            Value::Null,
            message,
        ));
        return;
    }
    for k in &s.required {
        if !map.contains_key(k) {
            let name = format!("{path}.{k}");
            let message = format!("{} in body is required", name.trim_start_matches('.'));
            out.push(err(Code::Required, &name, Value::Null, message));
        }
    }
    for (k, v) in map {
        if let Some(prop) = s.property(k) {
            validate_node(v, prop, &child(path, k), out);
        } else if let Some(additional) = s.additional.as_deref() {
            validate_node(v, additional, &child(path, k), out);
        } else if s.additional_forbidden {
            let message = format!("{} in body is a forbidden property", child(path, k));
            out.push(err(Code::Composite, path, Value::Null, message));
        }
    }
}

/// A `field.Path` as apimachinery prints it: `spec.hosts[0]`, map keys `spec.labels[key]`,
/// `<nil>` at the root.
#[derive(Clone, Debug)]
pub(crate) struct FieldPath(String);

impl FieldPath {
    pub(crate) fn root() -> Self {
        FieldPath(String::new())
    }
    pub(crate) fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            FieldPath(name.to_string())
        } else {
            FieldPath(format!("{}.{name}", self.0))
        }
    }
    pub(crate) fn index(&self, i: usize) -> Self {
        FieldPath(format!("{}[{i}]", self.0))
    }
    pub(crate) fn key(&self, k: &str) -> Self {
        FieldPath(format!("{}[{k}]", self.0))
    }
    pub(crate) fn render(&self) -> String {
        err_field(&self.0)
    }
}

/// `schemaobjectmeta.Validate` (apiVersion/kind of embedded resources) and
/// `structurallisttype.ValidateListSetsAndMaps` (no duplicates in `set` and `map` lists).
fn validate_embedded_and_lists(
    v: &Value,
    s: &Node,
    path: &FieldPath,
    is_root: bool,
    out: &mut Vec<FieldErr>,
) {
    match v {
        Value::Object(map) => {
            if s.embedded && !is_root {
                for key in ["apiVersion", "kind"] {
                    if !map.contains_key(key) {
                        out.push(FieldErr::new(
                            ErrKind::Required,
                            path.child(key).render(),
                            Bad::Omit,
                            "must not be empty",
                        ));
                    }
                }
                for key in ["apiVersion", "kind"] {
                    match map.get(key) {
                        None => {}
                        Some(Value::String(text)) if text.is_empty() => out.push(FieldErr::new(
                            ErrKind::Invalid,
                            path.child(key).render(),
                            Bad::str(""),
                            "must not be empty",
                        )),
                        Some(Value::String(_)) => {}
                        Some(other) => out.push(FieldErr::new(
                            ErrKind::Invalid,
                            path.child(key).render(),
                            Bad::Json(other.clone()),
                            "must be a string",
                        )),
                    }
                }
            }
            for (k, child_value) in map {
                if let Some(prop) = s.property(k) {
                    validate_embedded_and_lists(child_value, prop, &path.child(k), false, out);
                } else if let Some(additional) = s.additional.as_deref() {
                    validate_embedded_and_lists(child_value, additional, &path.key(k), false, out);
                }
            }
        }
        Value::Array(items) => {
            match s.list_type.as_deref() {
                Some("set") => {
                    for (i, item) in items.iter().enumerate() {
                        if items[..i].iter().any(|prev| json_eq(prev, item)) {
                            out.push(FieldErr::new(
                                ErrKind::Duplicate,
                                path.index(i).render(),
                                Bad::Json(item.clone()),
                                "",
                            ));
                        }
                    }
                }
                Some("map") => {
                    let keys: Vec<Value> = items.iter().map(|item| list_map_key(item, s)).collect();
                    for i in 0..items.len() {
                        if items[i].is_object()
                            && keys[..i].iter().any(|prev| json_eq(prev, &keys[i]))
                        {
                            out.push(FieldErr::new(
                                ErrKind::Duplicate,
                                path.index(i).render(),
                                Bad::Json(keys[i].clone()),
                                "",
                            ));
                        }
                    }
                }
                _ => {}
            }
            if let Some(item_schema) = s.items.as_deref() {
                for (i, item) in items.iter().enumerate() {
                    validate_embedded_and_lists(item, item_schema, &path.index(i), false, out);
                }
            }
        }
        _ => {}
    }
}

/// The key of a `x-kubernetes-list-type: map` item: the map of its key fields (a missing key
/// field takes its default).
pub(crate) fn list_map_key(item: &Value, s: &Node) -> Value {
    let mut key = serde_json::Map::new();
    for k in &s.list_map_keys {
        let v = item.get(k).cloned().or_else(|| {
            s.items
                .as_deref()
                .and_then(|items| items.property(k))
                .and_then(|p| p.default.clone())
        });
        if let Some(v) = v {
            key.insert(k.clone(), v);
        }
    }
    Value::Object(key)
}
