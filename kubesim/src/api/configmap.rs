//! ConfigMap validation on create and update (`ValidateConfigMap` in
//! pkg/apis/core/validation): config-key syntax of every `data`/`binaryData` key, no key in
//! both, at most 1 MiB of values. (The immutable rule of updates is in `builtin`.)

use serde_json::{Value, json};

use super::status::{Cause, invalid_value};

/// `core.MaxSecretSize`, which ConfigMaps share.
const MAX_SIZE: usize = 1024 * 1024;

/// `validation.IsConfigMapKey`.
fn config_key_errors(key: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if key.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    let ok = !key.is_empty()
        && key
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'));
    if !ok {
        errs.push("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')".to_string());
    }
    if key == "." {
        errs.push("must not be '.'".to_string());
    } else if key == ".." {
        errs.push("must not be '..'".to_string());
    } else if key.starts_with("..") {
        errs.push("must not start with '..'".to_string());
    }
    errs
}

/// The causes a ConfigMap's data fails with (empty when valid). Keys are checked in sorted
/// order (Go iterates its maps in random order).
pub(crate) fn validate(cm: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let data = cm.get("data").and_then(Value::as_object);
    let binary = cm.get("binaryData").and_then(Value::as_object);
    let mut size = 0;
    for (k, v) in data.into_iter().flatten() {
        let field = format!("data[{k}]");
        for msg in config_key_errors(k) {
            causes.push(invalid_value(&field, &json!(k), &msg));
        }
        if binary.is_some_and(|b| b.contains_key(k)) {
            causes.push(invalid_value(
                &field,
                &json!(k),
                "duplicate of key present in binaryData",
            ));
        }
        size += v.as_str().map_or(0, str::len);
    }
    for (k, v) in binary.into_iter().flatten() {
        for msg in config_key_errors(k) {
            causes.push(invalid_value(format!("binaryData[{k}]"), &json!(k), &msg));
        }
        // the decoded bytes count: base64 holds 3 bytes in every 4 characters
        let b64 = v.as_str().unwrap_or("");
        size += b64.trim_end_matches('=').len() * 3 / 4;
    }
    if size > MAX_SIZE {
        causes.push(Cause {
            reason: "FieldValueTooLong".into(),
            field: String::new(),
            message: format!("Too long: must have at most {MAX_SIZE} bytes"),
        });
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_config_key_rules() {
        assert!(config_key_errors("policy.yaml").is_empty());
        assert!(config_key_errors("KEY_NAME-1").is_empty());
        assert_eq!(config_key_errors("..x"), ["must not start with '..'"]);
        assert_eq!(config_key_errors("a b").len(), 1);
        let cm = json!({"data": {"k": "v", "bad key": "v"}, "binaryData": {"k": "AAE="}});
        let fields: Vec<String> = validate(&cm).into_iter().map(|c| c.field).collect();
        assert_eq!(fields, ["data[bad key]", "data[k]"]);
        let big = json!({"data": {"k": "x".repeat(MAX_SIZE + 1)}});
        assert_eq!(validate(&big)[0].reason, "FieldValueTooLong");
    }
}
