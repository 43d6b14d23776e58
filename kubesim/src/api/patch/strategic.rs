//! Kubernetes strategic merge patch (`application/strategic-merge-patch+json`).
//!
//! Maps merge recursively and `null` deletes a key; lists merge as [`super::lists`] says
//! (by merge key, as a set of scalars, or replaced). Directives: `$patch: replace|delete|merge`
//! on maps and on list elements (`{"$patch": "replace"}` as a list element replaces the whole
//! list), `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>` and `$retainKeys`.

use serde_json::{Map, Value};

use super::PatchError;
use super::lists::{SmpList, child_path, elem_path, list_rule};

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";
const SET_ORDER: &str = "$setElementOrder/";

/// Applies a strategic merge patch to `target`, an object of `kind`.
pub fn strategic_merge_patch(
    target: &mut Value,
    patch: &Value,
    kind: &str,
) -> Result<(), PatchError> {
    let Value::Object(patch) = patch else {
        return Err(PatchError::BadRequest(
            "the body of a strategic merge patch must be a JSON object".into(),
        ));
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let mut result = target.clone();
    if let Some(replaced) = merge_map(&mut result, patch, kind, "")? {
        result = replaced;
    }
    *target = result;
    Ok(())
}

/// Merges `patch` into `target` (an object). Returns `Some(value)` when a `$patch` directive
/// makes the whole map something else (replace), in which case `target` is untouched.
fn merge_map(
    target: &mut Value,
    patch: &Map<String, Value>,
    kind: &str,
    path: &str,
) -> Result<Option<Value>, PatchError> {
    match patch.get(PATCH) {
        None => {}
        Some(Value::String(s)) if s == "merge" => {}
        Some(Value::String(s)) if s == "replace" => {
            let mut fresh = Value::Object(Map::new());
            let mut rest = patch.clone();
            rest.remove(PATCH);
            merge_map(&mut fresh, &rest, kind, path)?;
            return Ok(Some(fresh));
        }
        Some(Value::String(s)) if s == "delete" => return Ok(Some(Value::Object(Map::new()))),
        Some(other) => {
            return Err(PatchError::BadRequest(format!(
                "unknown patch type: {other} in map: {}",
                Value::Object(patch.clone())
            )));
        }
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(tmap) = target else {
        unreachable!("target was made an object above")
    };

    if let Some(retain) = patch.get(RETAIN_KEYS) {
        let Value::Array(keys) = retain else {
            return Err(PatchError::BadRequest(format!(
                "invalid patch: {RETAIN_KEYS} must be a list of strings"
            )));
        };
        let keep: Vec<&str> = keys.iter().filter_map(Value::as_str).collect();
        tmap.retain(|k, _| keep.contains(&k.as_str()));
    }

    for (k, v) in patch {
        if let Some(field) = k.strip_prefix(DELETE_PRIMITIVE) {
            let Value::Array(remove) = v else {
                return Err(PatchError::BadRequest(format!(
                    "invalid patch: {k} must be a list"
                )));
            };
            if let Some(Value::Array(items)) = tmap.get_mut(field) {
                items.retain(|i| !remove.contains(i));
            }
        }
    }

    for (k, v) in patch {
        if k.starts_with('$') {
            continue;
        }
        let cpath = child_path(path, k);
        match v {
            Value::Null => {
                tmap.remove(k);
            }
            Value::Object(pm) => {
                if pm.get(PATCH).and_then(Value::as_str) == Some("delete") {
                    tmap.remove(k);
                    continue;
                }
                let slot = tmap.entry(k.clone()).or_insert(Value::Null);
                if let Some(replaced) = merge_map(slot, pm, kind, &cpath)? {
                    *slot = replaced;
                }
            }
            Value::Array(items) => {
                let merged = match list_rule(kind, &cpath).smp {
                    SmpList::Replace => strip_list(items, kind, &cpath)?,
                    SmpList::Primitive => {
                        let mut cur = match tmap.get(k) {
                            Some(Value::Array(a)) => a.clone(),
                            _ => Vec::new(),
                        };
                        for i in items {
                            if !cur.contains(i) {
                                cur.push(i.clone());
                            }
                        }
                        cur
                    }
                    SmpList::MergeKey(key) => {
                        let cur = match tmap.get(k) {
                            Some(Value::Array(a)) => a.clone(),
                            _ => Vec::new(),
                        };
                        merge_keyed(cur, items, key, kind, &cpath)?
                    }
                };
                tmap.insert(k.clone(), Value::Array(merged));
            }
            scalar => {
                tmap.insert(k.clone(), scalar.clone());
            }
        }
    }

    for (k, v) in patch {
        if let Some(field) = k.strip_prefix(SET_ORDER) {
            let Value::Array(order) = v else {
                return Err(PatchError::BadRequest(format!(
                    "invalid patch: {k} must be a list"
                )));
            };
            let key = match list_rule(kind, &child_path(path, field)).smp {
                SmpList::MergeKey(key) => Some(key),
                _ => None,
            };
            if let Some(Value::Array(items)) = tmap.get_mut(field) {
                reorder(items, order, key);
            }
        }
    }
    Ok(None)
}

/// A list that replaces the live one, with directives and nulls removed from its maps.
fn strip_list(items: &[Value], kind: &str, path: &str) -> Result<Vec<Value>, PatchError> {
    let epath = elem_path(path);
    let mut out = Vec::with_capacity(items.len());
    for i in items {
        match i {
            Value::Object(m) => {
                let mut fresh = Value::Object(Map::new());
                match merge_map(&mut fresh, m, kind, &epath)? {
                    Some(replaced) => out.push(replaced),
                    None => out.push(fresh),
                }
            }
            other => out.push(other.clone()),
        }
    }
    Ok(out)
}

fn merge_keyed(
    mut cur: Vec<Value>,
    patch: &[Value],
    key: &str,
    kind: &str,
    path: &str,
) -> Result<Vec<Value>, PatchError> {
    let epath = elem_path(path);
    let is_replace = |v: &Value| {
        v.as_object().is_some_and(|m| {
            m.len() == 1 && m.get(PATCH).and_then(Value::as_str) == Some("replace")
        })
    };
    if patch.iter().any(is_replace) {
        let rest: Vec<Value> = patch.iter().filter(|v| !is_replace(v)).cloned().collect();
        return strip_list(&rest, kind, path);
    }
    for p in patch {
        let Value::Object(pm) = p else {
            return Err(PatchError::BadRequest(format!(
                "invalid patch: an element of the list {path} is not an object (merge key {key})"
            )));
        };
        let Some(kv) = pm.get(key) else {
            return Err(PatchError::BadRequest(format!(
                "map: {p} does not contain declared merge key: {key}"
            )));
        };
        let pos = cur.iter().position(|c| c.get(key) == Some(kv));
        match (pm.get(PATCH).and_then(Value::as_str), pos) {
            (Some("delete"), _) => cur.retain(|c| c.get(key) != Some(kv)),
            (_, Some(i)) => {
                if let Some(replaced) = merge_map(&mut cur[i], pm, kind, &epath)? {
                    cur[i] = replaced;
                }
            }
            (_, None) => {
                let mut fresh = Value::Object(Map::new());
                match merge_map(&mut fresh, pm, kind, &epath)? {
                    Some(replaced) => cur.push(replaced),
                    None => cur.push(fresh),
                }
            }
        }
    }
    Ok(cur)
}

/// `$setElementOrder`: the elements it names come first, in its order; the others (present
/// only on the server) follow in their previous relative order. The real algorithm
/// interleaves server-only elements by their old positions; this is the simplified form.
fn reorder(items: &mut Vec<Value>, order: &[Value], key: Option<&str>) {
    let ident = |v: &Value| -> Option<Value> {
        match key {
            Some(k) => v.get(k).cloned(),
            None => Some(v.clone()),
        }
    };
    let wanted: Vec<Value> = order.iter().filter_map(&ident).collect();
    let mut named: Vec<(usize, Value)> = Vec::new();
    let mut others = Vec::new();
    for item in items.drain(..) {
        match ident(&item).and_then(|id| wanted.iter().position(|w| *w == id)) {
            Some(rank) => named.push((rank, item)),
            None => others.push(item),
        }
    }
    named.sort_by_key(|(rank, _)| *rank);
    items.extend(named.into_iter().map(|(_, v)| v));
    items.extend(others);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smp(mut target: Value, patch: Value, kind: &str) -> Value {
        strategic_merge_patch(&mut target, &patch, kind).unwrap();
        target
    }

    fn pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}, "finalizers": ["x", "y"]},
            "spec": {
                "containers": [
                    {"name": "app", "image": "app:1", "ports": [{"containerPort": 80}],
                     "env": [{"name": "A", "value": "1"}], "args": ["--a"]},
                    {"name": "side", "image": "side:1"}
                ],
                "tolerations": [{"key": "k1"}]
            },
            "status": {"conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "PodScheduled", "status": "True"}
            ]}
        })
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        let out = smp(
            pod(),
            json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
            "Pod",
        );
        assert_eq!(out["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        assert_eq!(out["metadata"]["name"], "p");
    }

    #[test]
    fn containers_merge_by_name() {
        let out = smp(
            pod(),
            json!({"spec": {"containers": [
                {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "2"}],
                 "ports": [{"containerPort": 80, "name": "http"}], "args": ["--b"]},
                {"name": "new", "image": "new:1"}
            ]}}),
            "Pod",
        );
        let cs = out["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 3);
        assert_eq!(cs[0]["image"], "app:2");
        assert_eq!(
            cs[0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])
        );
        assert_eq!(
            cs[0]["ports"],
            json!([{"containerPort": 80, "name": "http"}])
        );
        // args has no merge strategy: replaced
        assert_eq!(cs[0]["args"], json!(["--b"]));
        assert_eq!(cs[1]["name"], "side");
        assert_eq!(cs[2]["name"], "new");
    }

    #[test]
    fn conditions_merge_by_type_and_other_lists_replace() {
        let out = smp(
            pod(),
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]},
                   "spec": {"tolerations": [{"key": "k2"}]}}),
            "Pod",
        );
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}])
        );
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "k2"}]));
        let node =
            json!({"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.2"}]}});
        let out = smp(
            node,
            json!({"status": {"addresses": [{"type": "Hostname", "address": "n1"}]}}),
            "Node",
        );
        assert_eq!(out["status"]["addresses"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn patch_delete_and_replace_directives() {
        let out = smp(
            pod(),
            json!({"spec": {"containers": [{"name": "side", "$patch": "delete"}]}}),
            "Pod",
        );
        let cs = out["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0]["name"], "app");

        let out = smp(
            pod(),
            json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "o"}]}}),
            "Pod",
        );
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "only", "image": "o"}])
        );

        let out = smp(
            pod(),
            json!({"metadata": {"labels": {"$patch": "replace", "z": "9"}}}),
            "Pod",
        );
        assert_eq!(out["metadata"]["labels"], json!({"z": "9"}));

        let out = smp(
            pod(),
            json!({"metadata": {"labels": {"$patch": "delete"}}}),
            "Pod",
        );
        assert!(out["metadata"].get("labels").is_none());

        let err = strategic_merge_patch(&mut pod(), &json!({"spec": {"$patch": "bogus"}}), "Pod")
            .unwrap_err();
        assert!(matches!(err, PatchError::BadRequest(_)));
    }

    #[test]
    fn finalizers_merge_as_set_and_delete_from_primitive_list() {
        let out = smp(
            pod(),
            json!({"metadata": {"finalizers": ["z", "x"]}}),
            "Pod",
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["x", "y", "z"]));
        let out = smp(
            pod(),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}),
            "Pod",
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["y"]));
        // custom resources: same metadata rules, other lists replaced
        let cr = json!({"metadata": {"finalizers": ["a"]}, "spec": {"hosts": ["h1"]}});
        let out = smp(
            cr,
            json!({"metadata": {"finalizers": ["b"]}, "spec": {"hosts": ["h2"]}}),
            "Revision",
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(out["spec"]["hosts"], json!(["h2"]));
    }

    #[test]
    fn set_element_order_and_retain_keys() {
        let out = smp(
            pod(),
            json!({"spec": {
                "$setElementOrder/containers": [{"name": "side"}, {"name": "app"}],
                "containers": [{"name": "side", "image": "side:2"}]
            }}),
            "Pod",
        );
        let names: Vec<_> = out["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["side", "app"]);
        assert_eq!(out["spec"]["containers"][0]["image"], "side:2");

        let out = smp(
            json!({"spec": {"strategy": {"type": "Recreate", "rollingUpdate": {"x": 1}}}}),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
            "Deployment",
        );
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn new_keyed_elements_are_stripped_of_directives_and_missing_keys_fail() {
        let out = smp(
            json!({"spec": {}}),
            json!({"spec": {"containers": [{"name": "a", "image": null, "env": [{"name": "E", "$patch": "delete"}]}]}}),
            "Pod",
        );
        assert_eq!(out["spec"]["containers"], json!([{"name": "a", "env": []}]));
        let err = strategic_merge_patch(
            &mut pod(),
            &json!({"spec": {"containers": [{"image": "x"}]}}),
            "Pod",
        )
        .unwrap_err();
        assert!(
            matches!(err, PatchError::BadRequest(m) if m.contains("does not contain declared merge key: name"))
        );
    }
}
