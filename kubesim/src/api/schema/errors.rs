//! Field errors as `k8s.io/apimachinery/pkg/util/validation/field` builds and prints them, so
//! causes and messages match a real API server byte for byte.

use serde_json::Value;

use super::FieldCause;

/// `field.ErrorType`: the reason (cause type) and the word that starts the message body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrKind {
    Required,
    Invalid,
    TypeInvalid,
    NotSupported,
    TooLong,
    TooMany,
    Duplicate,
    Forbidden,
}

impl ErrKind {
    fn reason(self) -> &'static str {
        match self {
            ErrKind::Required => "FieldValueRequired",
            ErrKind::Invalid => "FieldValueInvalid",
            ErrKind::TypeInvalid => "FieldValueTypeInvalid",
            ErrKind::NotSupported => "FieldValueNotSupported",
            ErrKind::TooLong => "FieldValueTooLong",
            ErrKind::TooMany => "FieldValueTooMany",
            ErrKind::Duplicate => "FieldValueDuplicate",
            ErrKind::Forbidden => "FieldValueForbidden",
        }
    }

    fn word(self) -> &'static str {
        match self {
            ErrKind::Required => "Required value",
            ErrKind::Invalid | ErrKind::TypeInvalid => "Invalid value",
            ErrKind::NotSupported => "Unsupported value",
            ErrKind::TooLong => "Too long",
            ErrKind::TooMany => "Too many",
            ErrKind::Duplicate => "Duplicate value",
            ErrKind::Forbidden => "Forbidden",
        }
    }

    /// The error types after which the apiserver does not run CEL rules (`hasBlockingErr`).
    pub(crate) fn blocks_cel(self) -> bool {
        matches!(
            self,
            ErrKind::NotSupported
                | ErrKind::Required
                | ErrKind::TooLong
                | ErrKind::TooMany
                | ErrKind::TypeInvalid
        )
    }
}

/// The `BadValue` of a field error, typed as the Go value would be.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Bad {
    /// `field.omitValue`: the body shows only the error type.
    Omit,
    /// A JSON value as decoded into `interface{}` (int64, float64, string, bool, map, slice, nil).
    Json(Value),
    /// A Go `int` (TooMany's count).
    Int(i64),
    /// Printed as given (a Go struct's `%#v`).
    Raw(String),
}

impl Bad {
    pub(crate) fn str(s: impl Into<String>) -> Bad {
        Bad::Json(Value::String(s.into()))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FieldErr {
    pub kind: ErrKind,
    /// `field.Path.String()`: `"<nil>"` for the nil path.
    pub field: String,
    pub bad: Bad,
    pub detail: String,
}

impl FieldErr {
    pub(crate) fn new(
        kind: ErrKind,
        field: impl Into<String>,
        bad: Bad,
        detail: impl Into<String>,
    ) -> Self {
        FieldErr {
            kind,
            field: field.into(),
            bad,
            detail: detail.into(),
        }
    }

    /// `(*field.Error).ErrorBody()`.
    pub(crate) fn body(&self) -> String {
        let mut s = match (&self.kind, &self.bad) {
            (ErrKind::Required | ErrKind::Forbidden | ErrKind::TooLong, _) | (_, Bad::Omit) => {
                self.kind.word().to_string()
            }
            (_, Bad::Int(i)) => format!("{}: {i}", self.kind.word()),
            (_, Bad::Raw(r)) => format!("{}: {r}", self.kind.word()),
            (_, Bad::Json(v)) => format!("{}: {}", self.kind.word(), body_value(v)),
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    pub(crate) fn into_cause(self) -> FieldCause {
        FieldCause {
            reason: self.kind.reason().to_string(),
            message: self.body(),
            field: self.field,
        }
    }
}

/// How `ErrorBody` prints a bad value: nil as `"null"`, strings `%q`, numbers and bools `%v`,
/// anything else Go-syntax (`%#v`).
fn body_value(v: &Value) -> String {
    match v {
        Value::Null => go_quote("null"),
        Value::String(s) => go_quote(s),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => go_number(n),
        Value::Object(_) | Value::Array(_) => go_sharp_v(v),
    }
}

/// A JSON number as Go prints the int64 or float64 the apiserver decoded it into.
pub(crate) fn go_number(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else {
        go_float(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// Go's `%v` for a float64: the shortest representation, in exponent form when the decimal
/// exponent is below -4 or at least 6 (`1e+06`, `1.5e-05`).
pub(crate) fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        format!("{f}")
    }
}

/// Go's `strconv.Quote`.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `%#v` of a value decoded into `interface{}` (maps print with sorted keys).
pub(crate) fn go_sharp_v(v: &Value) -> String {
    match v {
        Value::Null => "interface {}(nil)".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => go_number(n),
        Value::String(s) => go_quote(s),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(go_sharp_v).collect();
            format!("[]interface {{}}{{{}}}", inner.join(", "))
        }
        Value::Object(map) => {
            let inner: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}:{}", go_quote(k), go_sharp_v(v)))
                .collect();
            format!("map[string]interface {{}}{{{}}}", inner.join(", "))
        }
    }
}

/// The JSON type name kube-openapi infers for a decoded value (`schemaInfoForType`).
pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Joins a child key onto a kube-openapi validation path (`a.b`).
pub(crate) fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The field of a kube-openapi error (`fldPath.Child(name)` with a nil `fldPath`).
pub(crate) fn err_field(path: &str) -> String {
    if path.is_empty() {
        "<nil>".to_string()
    } else {
        path.to_string()
    }
}
