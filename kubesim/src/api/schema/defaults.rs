//! Pruning and defaulting, in the order the apiserver's decoder applies them:
//! `structuralpruning.Prune`, metadata coercion, `PruneNonNullableNullsWithoutDefaults`, then
//! `structuraldefaulting.Default`.

use serde_json::{Map, Number, Value};

use super::node::Node;

/// Tracks the JSON path of the node being visited, as `UnknownFieldPathOptions` prints it:
/// keys joined by `.`, list indices as `[i]`.
struct PathBuf(String);

impl PathBuf {
    fn with_key(&self, key: &str) -> String {
        if self.0.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.0)
        }
    }
    fn push_key(&mut self, key: &str) -> usize {
        let len = self.0.len();
        if !self.0.is_empty() {
            self.0.push('.');
        }
        self.0.push_str(key);
        len
    }
    fn push_index(&mut self, i: usize) -> usize {
        let len = self.0.len();
        self.0.push_str(&format!("[{i}]"));
        len
    }
    fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }
}

/// Prunes unknown fields of a whole resource; returns their sorted paths followed by the unknown
/// `metadata` fields.
pub(crate) fn prune_resource(obj: &mut Value, root: &Node) -> Vec<String> {
    let mut pruned = Vec::new();
    let mut path = PathBuf(String::new());
    // The resource root is treated as an embedded resource: apiVersion, kind and metadata
    // survive even when the schema does not declare them.
    prune(obj, Some(root), true, &mut path, &mut pruned);
    pruned.sort();
    let mut path = PathBuf(String::new());
    coerce_metadata(obj, Some(root), true, &mut path, &mut pruned);
    pruned
}

fn is_meta_kept(key: &str) -> bool {
    matches!(key, "apiVersion" | "kind" | "metadata")
}

fn prune(
    x: &mut Value,
    s: Option<&Node>,
    embedded: bool,
    path: &mut PathBuf,
    out: &mut Vec<String>,
) {
    if let Some(node) = s
        && node.preserve_unknown
    {
        skip_prune(x, node, embedded || node.embedded, path, out);
        return;
    }
    match x {
        Value::Object(map) => {
            let Some(node) = s else {
                out.extend(map.keys().map(|k| path.with_key(k)));
                map.clear();
                return;
            };
            let embedded = embedded || node.embedded;
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if embedded && is_meta_kept(&k) {
                    continue;
                }
                let child = node.property(&k).or(node.additional.as_deref());
                if let Some(child) = child {
                    let len = path.push_key(&k);
                    if let Some(v) = map.get_mut(&k) {
                        prune(v, Some(child), false, path, out);
                    }
                    path.truncate(len);
                } else {
                    out.push(path.with_key(&k));
                    map.remove(&k);
                }
            }
        }
        Value::Array(items) => {
            let item_schema = s.and_then(|n| n.items.as_deref());
            for (i, v) in items.iter_mut().enumerate() {
                let len = path.push_index(i);
                prune(v, item_schema, false, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// Inside `x-kubernetes-preserve-unknown-fields`: unknown keys stay, declared ones are still
/// pruned below.
fn skip_prune(x: &mut Value, s: &Node, embedded: bool, path: &mut PathBuf, out: &mut Vec<String>) {
    match x {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if embedded && is_meta_kept(k) {
                    continue;
                }
                if let Some(child) = s.property(k).or(s.additional.as_deref()) {
                    let len = path.push_key(k);
                    prune(v, Some(child), false, path, out);
                    path.truncate(len);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = s.items.as_deref() {
                for (i, v) in items.iter_mut().enumerate() {
                    let len = path.push_index(i);
                    skip_prune(v, item_schema, item_schema.embedded, path, out);
                    path.truncate(len);
                }
            }
        }
        _ => {}
    }
}

const OBJECT_META_FIELDS: [&str; 15] = [
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];
const OWNER_REFERENCE_FIELDS: [&str; 6] = [
    "apiVersion",
    "kind",
    "name",
    "uid",
    "controller",
    "blockOwnerDeletion",
];
const MANAGED_FIELDS_ENTRY_FIELDS: [&str; 7] = [
    "manager",
    "operation",
    "apiVersion",
    "time",
    "fieldsType",
    "fieldsV1",
    "subresource",
];

fn drop_unknown(
    map: &mut Map<String, Value>,
    known: &[&str],
    path: &PathBuf,
    out: &mut Vec<String>,
) {
    let unknown: Vec<String> = map
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .cloned()
        .collect();
    for k in unknown {
        out.push(path.with_key(&k));
        map.remove(&k);
    }
}

fn coerce_object_meta(meta: &mut Map<String, Value>, path: &mut PathBuf, out: &mut Vec<String>) {
    drop_unknown(meta, &OBJECT_META_FIELDS, path, out);
    for (field, known) in [
        ("ownerReferences", &OWNER_REFERENCE_FIELDS[..]),
        ("managedFields", &MANAGED_FIELDS_ENTRY_FIELDS[..]),
    ] {
        if let Some(Value::Array(items)) = meta.get_mut(field) {
            let len = path.push_key(field);
            for (i, item) in items.iter_mut().enumerate() {
                if let Value::Object(entry) = item {
                    let len = path.push_index(i);
                    drop_unknown(entry, known, path, out);
                    path.truncate(len);
                }
            }
            path.truncate(len);
        }
    }
}

/// Drops fields of `metadata` (of the resource and of embedded resources) that are not part of
/// ObjectMeta, as the round trip through `metav1.ObjectMeta` does.
fn coerce_metadata(
    x: &mut Value,
    s: Option<&Node>,
    embedded: bool,
    path: &mut PathBuf,
    out: &mut Vec<String>,
) {
    let Some(node) = s else { return };
    match x {
        Value::Object(map) => {
            let embedded = embedded || node.embedded;
            for (k, v) in map.iter_mut() {
                let len = path.push_key(k);
                if embedded && k == "metadata" {
                    if let Value::Object(meta) = v {
                        coerce_object_meta(meta, path, out);
                    }
                } else if let Some(child) = node.property(k).or(node.additional.as_deref()) {
                    coerce_metadata(v, Some(child), false, path, out);
                }
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                let len = path.push_index(i);
                coerce_metadata(v, node.items.as_deref(), false, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// `PruneNonNullableNullsWithoutDefaults`: a null for a declared, non-nullable field without a
/// default is dropped, as if it had not been sent.
pub(crate) fn prune_nulls(x: &mut Value, s: &Node) {
    match x {
        Value::Object(map) => {
            map.retain(|k, v| match s.property(k) {
                Some(p) => !(v.is_null() && p.default.is_none() && !p.nullable),
                None => true,
            });
            for (k, v) in map.iter_mut() {
                if let Some(child) = s.property(k).or(s.additional.as_deref()) {
                    prune_nulls(v, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = s.items.as_deref() {
                for v in items.iter_mut() {
                    prune_nulls(v, item_schema);
                }
            }
        }
        _ => {}
    }
}

/// `structuraldefaulting.Default`.
pub(crate) fn apply_defaults(x: &mut Value, s: &Node) {
    match x {
        Value::Object(map) => {
            for (k, prop) in &s.properties {
                let Some(default) = &prop.default else {
                    continue;
                };
                let missing = match map.get(k) {
                    None => true,
                    Some(v) => v.is_null() && !prop.nullable,
                };
                if missing {
                    map.insert(k.clone(), default.clone());
                }
            }
            for (k, v) in map.iter_mut() {
                if let Some(prop) = s.property(k) {
                    apply_defaults(v, prop);
                } else if let Some(additional) = s.additional.as_deref() {
                    if v.is_null() && !additional.nullable {
                        *v = additional.default.clone().unwrap_or(Value::Null);
                    }
                    apply_defaults(v, additional);
                }
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = s.items.as_deref() else {
                return;
            };
            for v in items.iter_mut() {
                if v.is_null() && !item_schema.nullable {
                    *v = item_schema.default.clone().unwrap_or(Value::Null);
                }
                apply_defaults(v, item_schema);
            }
        }
        _ => {}
    }
}

/// Go decodes `3.0` into a float64 and encodes it back as `3`; a stored object never keeps an
/// integral float.
pub(crate) fn normalize_numbers(x: &mut Value) {
    match x {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
                && f.abs() < 9.223_372_036_854_775e18
            {
                *n = Number::from(f as i64);
            }
        }
        Value::Object(map) => map.values_mut().for_each(normalize_numbers),
        Value::Array(items) => items.iter_mut().for_each(normalize_numbers),
        _ => {}
    }
}
