//! Sets of field paths, as server-side apply tracks ownership, and their `FieldsV1` encoding
//! (`f:spec`, `k:{"name":"app"}`, `v:"x"`, `i:0`, `.` for "this node itself").

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pe {
    /// A field of an object.
    Field(String),
    /// An element of a map-type list: the canonical JSON object of its key fields.
    Key(String),
    /// An element of a set-type list: its canonical JSON.
    Value(String),
    /// An element of a list by position (only read from foreign managedFields).
    Index(usize),
}

pub type Path = Vec<Pe>;
pub type FieldSet = BTreeSet<Path>;

/// Whether `set` holds `path` or anything below it.
pub fn covers(set: &FieldSet, path: &[Pe]) -> bool {
    set.range(path.to_vec()..)
        .next()
        .is_some_and(|q| q.starts_with(path))
}

/// The `k:` identity of an element of a map-type list, or None when a key field is missing
/// and has no default.
pub fn element_key(elem: &Value, keys: &[&str]) -> Option<String> {
    element_key_with(elem, keys, super::lists::key_default)
}

/// [`element_key`] with the values of omitted key fields from `default`.
pub fn element_key_with(
    elem: &Value,
    keys: &[&str],
    default: impl Fn(&str) -> Option<Value>,
) -> Option<String> {
    let obj = elem.as_object()?;
    let mut key = Map::new();
    for k in keys {
        let v = match obj.get(*k) {
            Some(v) if !v.is_null() => v.clone(),
            _ => default(k)?,
        };
        key.insert((*k).to_owned(), v);
    }
    Some(Value::Object(key).to_string())
}

/// The `.spec.containers[name="app"].image` form used in conflict messages.
pub fn path_string(path: &[Pe]) -> String {
    let mut out = String::new();
    for pe in path {
        match pe {
            Pe::Field(f) => {
                out.push('.');
                out.push_str(f);
            }
            Pe::Key(k) => {
                let parts: Vec<String> = match serde_json::from_str::<Map<String, Value>>(k) {
                    Ok(m) => m.iter().map(|(n, v)| format!("{n}={v}")).collect(),
                    Err(_) => vec![k.clone()],
                };
                out.push_str(&format!("[{}]", parts.join(",")));
            }
            Pe::Value(v) => out.push_str(&format!("[={v}]")),
            Pe::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn pe_string(pe: &Pe) -> String {
    match pe {
        Pe::Field(f) => format!("f:{f}"),
        Pe::Key(k) => format!("k:{k}"),
        Pe::Value(v) => format!("v:{v}"),
        Pe::Index(i) => format!("i:{i}"),
    }
}

fn parse_pe(s: &str) -> Result<Pe, String> {
    let canonical = |json: &str| -> Result<String, String> {
        serde_json::from_str::<Value>(json)
            .map(|v| v.to_string())
            .map_err(|e| format!("invalid path element {s:?}: {e}"))
    };
    if let Some(f) = s.strip_prefix("f:") {
        Ok(Pe::Field(f.to_owned()))
    } else if let Some(k) = s.strip_prefix("k:") {
        Ok(Pe::Key(canonical(k)?))
    } else if let Some(v) = s.strip_prefix("v:") {
        Ok(Pe::Value(canonical(v)?))
    } else if let Some(i) = s.strip_prefix("i:") {
        i.parse()
            .map(Pe::Index)
            .map_err(|_| format!("invalid path element {s:?}"))
    } else {
        Err(format!("invalid path element {s:?}"))
    }
}

#[derive(Default)]
struct Node {
    member: bool,
    children: BTreeMap<String, Node>,
}

impl Node {
    fn into_value(self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".into(), Value::Object(Map::new()));
        }
        for (k, child) in self.children {
            m.insert(k, child.into_value());
        }
        Value::Object(m)
    }
}

/// Encodes a set as a `fieldsV1` object.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Node::default();
    for path in set {
        let mut node = &mut root;
        for pe in path {
            node = node.children.entry(pe_string(pe)).or_default();
        }
        node.member = true;
    }
    root.into_value()
}

/// Decodes a `fieldsV1` object.
pub fn from_fields_v1(v: &Value) -> Result<FieldSet, String> {
    let mut set = FieldSet::new();
    let mut path = Vec::new();
    walk(v, &mut path, &mut set)?;
    Ok(set)
}

fn walk(v: &Value, path: &mut Path, set: &mut FieldSet) -> Result<(), String> {
    let Value::Object(m) = v else {
        return Err("fieldsV1 nodes must be objects".into());
    };
    for (k, child) in m {
        if k == "." {
            if !path.is_empty() {
                set.insert(path.clone());
            }
            continue;
        }
        path.push(parse_pe(k)?);
        if child.as_object().is_some_and(Map::is_empty) {
            set.insert(path.clone());
        } else {
            walk(child, path, set)?;
        }
        path.pop();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn f(s: &str) -> Pe {
        Pe::Field(s.into())
    }

    #[test]
    fn round_trip_and_format() {
        let key = element_key(&json!({"name": "app", "image": "x"}), &["name"]).unwrap();
        assert_eq!(key, r#"{"name":"app"}"#);
        let mut set = FieldSet::new();
        set.insert(vec![f("spec"), f("containers"), Pe::Key(key.clone())]);
        set.insert(vec![
            f("spec"),
            f("containers"),
            Pe::Key(key.clone()),
            f("image"),
        ]);
        set.insert(vec![f("metadata"), f("labels"), f("app")]);
        set.insert(vec![
            f("metadata"),
            f("finalizers"),
            Pe::Value(r#""x""#.into()),
        ]);
        let v = to_fields_v1(&set);
        assert_eq!(
            v,
            json!({
                "f:metadata": {"f:finalizers": {"v:\"x\"": {}}, "f:labels": {"f:app": {}}},
                "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {}}}}
            })
        );
        assert_eq!(from_fields_v1(&v).unwrap(), set);
        assert_eq!(
            path_string(&[f("spec"), f("containers"), Pe::Key(key), f("image")]),
            r#".spec.containers[name="app"].image"#
        );
        let ports = element_key(
            &json!({"containerPort": 80}),
            &["containerPort", "protocol"],
        )
        .unwrap();
        assert_eq!(
            path_string(&[Pe::Key(ports)]),
            r#"[containerPort=80,protocol="TCP"]"#
        );
        assert!(element_key(&json!({"image": "x"}), &["name"]).is_none());
        assert!(covers(&set, &[f("metadata")]));
        assert!(!covers(&set, &[f("status")]));
        assert!(from_fields_v1(&json!({"x:bad": {}})).is_err());
    }
}
