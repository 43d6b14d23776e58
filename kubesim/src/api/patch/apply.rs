//! Server-side apply and the field ownership (`metadata.managedFields`) of every write.

use serde_json::{Map, Value};

use super::PatchError;
use super::fieldset::{
    FieldSet, Pe, covers, element_key, element_key_with, from_fields_v1, path_string, to_fields_v1,
};
use super::lists::{CustomLists, SsaList, child_path, elem_path, list_rule};

const APPLY: &str = "Apply";
const UPDATE: &str = "Update";

/// Fields nobody owns (the apiserver's strip set), by parent rule path.
fn stripped(parent: &str, field: &str) -> bool {
    match parent {
        "" => matches!(field, "apiVersion" | "kind"),
        "metadata" => matches!(
            field,
            "name"
                | "namespace"
                | "creationTimestamp"
                | "selfLink"
                | "uid"
                | "clusterName"
                | "generation"
                | "managedFields"
                | "resourceVersion"
        ),
        _ => false,
    }
}

/// `metadata` itself is stripped too: only its fields can be owned.
fn clean(mut set: FieldSet) -> FieldSet {
    set.remove(&vec![Pe::Field("metadata".into())]);
    set
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    subresource: Option<String>,
    time: Option<String>,
    set: FieldSet,
}

impl Entry {
    fn same_identity(&self, manager: &str, operation: &str, api: &str, sub: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == sub
            // appliers keep one entry whatever version they apply with
            && (operation == APPLY || self.api_version == api)
    }

    /// How the apiserver names a manager in conflict messages.
    fn display(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if let Some(sub) = &self.subresource {
            s.push_str(&format!(" with subresource {sub:?}"));
        }
        if self.operation == UPDATE {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }

    fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), self.manager.clone().into());
        m.insert("operation".into(), self.operation.clone().into());
        m.insert("apiVersion".into(), self.api_version.clone().into());
        if let Some(t) = &self.time {
            m.insert("time".into(), t.clone().into());
        }
        m.insert("fieldsType".into(), "FieldsV1".into());
        m.insert("fieldsV1".into(), to_fields_v1(&self.set));
        if let Some(s) = &self.subresource {
            m.insert("subresource".into(), s.clone().into());
        }
        Value::Object(m)
    }
}

/// Reads `metadata.managedFields`. Entries that cannot be decoded are dropped (simplified:
/// the real server refuses to work with corrupt managedFields and resets them).
fn read_entries(obj: &Value) -> Vec<Entry> {
    let Some(Value::Array(items)) = obj.pointer("/metadata/managedFields") else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
            Some(Entry {
                manager: s("manager").unwrap_or_default(),
                operation: s("operation")?,
                api_version: s("apiVersion").unwrap_or_default(),
                subresource: s("subresource").filter(|s| !s.is_empty()),
                time: s("time"),
                set: from_fields_v1(e.get("fieldsV1")?).ok()?,
            })
        })
        .collect()
}

fn write_entries(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    // The apiserver's order: operation, then time, manager, apiVersion, subresource.
    entries.sort_by(|a, b| {
        (
            &a.operation,
            &a.time,
            &a.manager,
            &a.api_version,
            &a.subresource,
        )
            .cmp(&(
                &b.operation,
                &b.time,
                &b.manager,
                &b.api_version,
                &b.subresource,
            ))
    });
    let Some(Value::Object(meta)) = obj.get_mut("metadata") else {
        if entries.is_empty() {
            return;
        }
        if let Value::Object(root) = obj {
            root.insert("metadata".into(), Value::Object(Map::new()));
        }
        return write_entries(obj, entries);
    };
    if entries.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert(
            "managedFields".into(),
            Value::Array(entries.iter().map(Entry::to_value).collect()),
        );
    }
}

fn str_field<'a>(v: Option<&'a Value>, field: &str) -> Option<&'a str> {
    v.and_then(|v| v.get(field)).and_then(Value::as_str)
}

/// Elements of the map-type list at `rule` by key, or None when some element has no key
/// (then the list is treated as atomic).
fn keyed_elements<'a>(
    items: &'a [Value],
    keys: &[&str],
    kind: &Kind<'_>,
    rule: &str,
) -> Option<Vec<(String, &'a Value)>> {
    items
        .iter()
        .map(|i| Some((kind.key(rule, i, keys)?, i)))
        .collect()
}

/// The set an applied configuration claims: its leaves and its map-list elements (not the
/// maps on the way, as the real server's `ToFieldSet`).
fn applied_set(v: &Value, kind: &Kind<'_>) -> Result<FieldSet, PatchError> {
    let mut set = FieldSet::new();
    let mut path = Vec::new();
    applied_walk(v, kind, "", &mut path, &mut set)?;
    Ok(clean(set))
}

fn applied_walk(
    v: &Value,
    kind: &Kind<'_>,
    rule: &str,
    path: &mut Vec<Pe>,
    set: &mut FieldSet,
) -> Result<(), PatchError> {
    let Value::Object(m) = v else {
        set.insert(path.clone());
        return Ok(());
    };
    for (k, child) in m {
        if child.is_null() || stripped(rule, k) {
            continue;
        }
        let crule = kind.child(rule, k);
        path.push(Pe::Field(k.clone()));
        match child {
            // an atomic map is one value
            Value::Object(_) if kind.atomic_map(&crule) => {
                set.insert(path.clone());
            }
            // an empty map claims nothing (not even itself), as in the real ToFieldSet
            Value::Object(_) => applied_walk(child, kind, &crule, path, set)?,
            Value::Array(items) => match kind.ssa(&crule) {
                SsaList::Atomic => {
                    set.insert(path.clone());
                }
                SsaList::Set => {
                    for i in items {
                        path.push(Pe::Value(i.to_string()));
                        if !set.insert(path.clone()) {
                            return Err(PatchError::Invalid(format!(
                                "{}: duplicate entries for key {}",
                                path_string(&path[..path.len() - 1]),
                                i
                            )));
                        }
                        path.pop();
                    }
                }
                SsaList::Map(keys) => {
                    let erule = elem_path(&crule);
                    for (n, i) in items.iter().enumerate() {
                        let Some(key) = kind.key(&crule, i, keys) else {
                            return Err(PatchError::Invalid(format!(
                                "{}: element {n}: associative list with keys has an element that omits key field {:?} (and doesn't have default value)",
                                path_string(path),
                                keys.iter()
                                    .find(|k| i.get(**k).is_none_or(Value::is_null))
                                    .copied()
                                    .unwrap_or_default()
                            )));
                        };
                        path.push(Pe::Key(key));
                        if !set.insert(path.clone()) {
                            return Err(PatchError::Invalid(format!(
                                "{}: duplicate entries for key {}",
                                path_string(&path[..path.len() - 1]),
                                path_string(&path[path.len() - 1..]).trim_start_matches('.')
                            )));
                        }
                        applied_walk(i, kind, &erule, path, set)?;
                        path.pop();
                    }
                }
            },
            _ => {
                set.insert(path.clone());
            }
        }
        path.pop();
    }
    Ok(())
}

/// Every node of a subtree: what a write adds or removes when the whole subtree appears or
/// disappears (maps included, hence the `.` entries of Update managers).
fn all_nodes(v: &Value, kind: &Kind<'_>, rule: &str, path: &mut Vec<Pe>, set: &mut FieldSet) {
    if !path.is_empty() {
        set.insert(path.clone());
    }
    match v {
        Value::Object(_) if kind.atomic_map(rule) => {}
        Value::Object(m) => {
            for (k, child) in m {
                if child.is_null() || stripped(rule, k) {
                    continue;
                }
                path.push(Pe::Field(k.clone()));
                all_nodes(child, kind, &kind.child(rule, k), path, set);
                path.pop();
            }
        }
        Value::Array(items) => match kind.ssa(rule) {
            SsaList::Atomic => {}
            SsaList::Set => {
                for i in items {
                    path.push(Pe::Value(i.to_string()));
                    set.insert(path.clone());
                    path.pop();
                }
            }
            SsaList::Map(keys) => {
                if let Some(elems) = keyed_elements(items, keys, kind, rule) {
                    let erule = elem_path(rule);
                    for (key, i) in elems {
                        path.push(Pe::Key(key));
                        all_nodes(i, kind, &erule, path, set);
                        path.pop();
                    }
                }
            }
        },
        _ => {}
    }
}

#[derive(Default, Debug)]
struct Diff {
    added: FieldSet,
    modified: FieldSet,
    removed: FieldSet,
}

fn present(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

fn diff(
    old: Option<&Value>,
    new: Option<&Value>,
    kind: &Kind<'_>,
    rule: &str,
    path: &mut Vec<Pe>,
    d: &mut Diff,
) {
    match (present(old), present(new)) {
        (None, None) => {}
        (None, Some(n)) => all_nodes(n, kind, rule, path, &mut d.added),
        (Some(o), None) => all_nodes(o, kind, rule, path, &mut d.removed),
        (Some(Value::Object(o)), Some(Value::Object(n))) if kind.atomic_map(rule) => {
            if o != n {
                d.modified.insert(path.clone());
            }
        }
        (Some(Value::Object(o)), Some(Value::Object(n))) => {
            let keys: std::collections::BTreeSet<&String> = o.keys().chain(n.keys()).collect();
            for k in keys {
                if stripped(rule, k) {
                    continue;
                }
                path.push(Pe::Field(k.clone()));
                diff(o.get(k), n.get(k), kind, &kind.child(rule, k), path, d);
                path.pop();
            }
        }
        (Some(Value::Array(o)), Some(Value::Array(n))) if o != n => match kind.ssa(rule) {
            SsaList::Atomic => {
                d.modified.insert(path.clone());
            }
            SsaList::Set => {
                for i in o.iter().filter(|i| !n.contains(i)) {
                    path.push(Pe::Value(i.to_string()));
                    d.removed.insert(path.clone());
                    path.pop();
                }
                for i in n.iter().filter(|i| !o.contains(i)) {
                    path.push(Pe::Value(i.to_string()));
                    d.added.insert(path.clone());
                    path.pop();
                }
            }
            SsaList::Map(keys) => match (
                keyed_elements(o, keys, kind, rule),
                keyed_elements(n, keys, kind, rule),
            ) {
                (Some(oe), Some(ne)) => {
                    let erule = elem_path(rule);
                    let mut seen = std::collections::BTreeSet::new();
                    for (key, _) in oe.iter().chain(ne.iter()) {
                        if !seen.insert(key.clone()) {
                            continue;
                        }
                        let ov = oe.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
                        let nv = ne.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
                        path.push(Pe::Key(key.clone()));
                        diff(ov, nv, kind, &erule, path, d);
                        path.pop();
                    }
                }
                _ => {
                    d.modified.insert(path.clone());
                }
            },
        },
        (Some(o), Some(n)) => {
            if o != n {
                d.modified.insert(path.clone());
            }
        }
    }
}

fn diff_objects(old: &Value, new: &Value, kind: &Kind<'_>) -> Diff {
    let mut d = Diff::default();
    diff(Some(old), Some(new), kind, "", &mut Vec::new(), &mut d);
    d.added = clean(d.added);
    d.modified = clean(d.modified);
    d.removed = clean(d.removed);
    d
}

/// Merges an applied configuration into the live object: maps recursively, map-type lists by
/// key (new elements appended), set-type lists as a union, everything else replaced.
fn merge_applied(live: &mut Value, applied: &Value, kind: &Kind<'_>, rule: &str) {
    if applied.is_object() && kind.atomic_map(rule) {
        *live = strip_nulls(applied);
        return;
    }
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, av) in a {
                if av.is_null() || (rule == "metadata" && k == "managedFields") {
                    continue;
                }
                let crule = kind.child(rule, k);
                match l.get_mut(k) {
                    Some(lv) if !lv.is_null() => merge_applied(lv, av, kind, &crule),
                    _ => {
                        let mut fresh = if av.is_object() {
                            Value::Object(Map::new())
                        } else {
                            Value::Null
                        };
                        merge_applied(&mut fresh, av, kind, &crule);
                        l.insert(k.clone(), fresh);
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(a)) => match kind.ssa(rule) {
            SsaList::Atomic => *l = a.clone(),
            SsaList::Set => {
                for i in a {
                    if !l.contains(i) {
                        l.push(i.clone());
                    }
                }
            }
            SsaList::Map(keys) => {
                if keyed_elements(l, keys, kind, rule).is_none() {
                    *l = a.clone();
                    return;
                }
                let erule = elem_path(rule);
                for ai in a {
                    let Some(akey) = kind.key(rule, ai, keys) else {
                        continue;
                    };
                    match l
                        .iter_mut()
                        .find(|li| kind.key(rule, li, keys).as_deref() == Some(&akey))
                    {
                        Some(li) => merge_applied(li, ai, kind, &erule),
                        None => {
                            let mut fresh = Value::Object(Map::new());
                            merge_applied(&mut fresh, ai, kind, &erule);
                            l.push(fresh);
                        }
                    }
                }
            }
        },
        (l, a) => *l = strip_nulls(a),
    }
}

fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

/// Removes the node at `path` from `v`; maps and lists emptied by the removal (below the
/// object's top-level fields) go too, as Go's `omitempty` would drop them.
fn remove_path(v: &mut Value, path: &[Pe], kind: &Kind<'_>, rule: &str, depth: usize) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    match (v, first) {
        (Value::Object(m), Pe::Field(f)) => {
            if rest.is_empty() {
                return m.remove(f).is_some();
            }
            let Some(child) = m.get_mut(f) else {
                return false;
            };
            let removed = remove_path(child, rest, kind, &kind.child(rule, f), depth + 1);
            let emptied = match child {
                Value::Object(c) => c.is_empty(),
                Value::Array(c) => c.is_empty(),
                _ => false,
            };
            if removed && emptied && depth >= 1 {
                m.remove(f);
            }
            removed
        }
        (Value::Array(items), pe) => {
            let pos = match pe {
                Pe::Key(k) => match kind.ssa(rule) {
                    SsaList::Map(keys) => items
                        .iter()
                        .position(|i| kind.key(rule, i, keys).as_deref() == Some(k.as_str())),
                    _ => None,
                },
                Pe::Value(s) => serde_json::from_str::<Value>(s)
                    .ok()
                    .and_then(|want| items.iter().position(|i| *i == want)),
                Pe::Index(n) => (*n < items.len()).then_some(*n),
                Pe::Field(_) => None,
            };
            let Some(pos) = pos else {
                return false;
            };
            if rest.is_empty() {
                items.remove(pos);
                true
            } else {
                remove_path(&mut items[pos], rest, kind, &elem_path(rule), depth + 1)
            }
        }
        _ => false,
    }
}

/// The zero value of a built-in kind as the apiserver's typed objects have it: structs that
/// are always present, so that creating an object does not claim them as added.
fn empty_typed(kind: &Kind<'_>, api_version: &str) -> Value {
    let fields: &[&str] = match (kind.name, api_version) {
        ("Pod" | "Node" | "Namespace" | "CustomResourceDefinition", _) => {
            &["metadata", "spec", "status"]
        }
        ("Lease", _) => &["metadata", "spec"],
        ("Event", "v1") => &["metadata", "involvedObject", "source"],
        ("Event", _) => &["metadata", "regarding", "deprecatedSource"],
        _ => &["metadata"],
    };
    Value::Object(
        fields
            .iter()
            .map(|f| ((*f).to_owned(), Value::Object(Map::new())))
            .collect(),
    )
}

fn conflict_error(conflicts: &[(String, String)]) -> PatchError {
    // grouped by manager, managers sorted, paths in the order found
    let mut managers: Vec<&str> = conflicts.iter().map(|(m, _)| m.as_str()).collect();
    managers.sort();
    managers.dedup();
    let message = if let [(m, p)] = conflicts {
        format!("Apply failed with 1 conflict: conflict with {m}: {p}")
    } else {
        let mut lines = Vec::new();
        for m in managers {
            lines.push(format!("conflicts with {m}:"));
            for (_, p) in conflicts.iter().filter(|(cm, _)| cm == m) {
                lines.push(format!("- {p}"));
            }
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    PatchError::Conflict {
        message,
        causes: conflicts
            .iter()
            .map(|(m, p)| (p.clone(), format!("conflict with {m}")))
            .collect(),
    }
}

/// The kind of the object being applied and, for a custom resource, what its schema
/// declares: what decides how each list and map is owned.
#[derive(Clone, Copy)]
pub(crate) struct Kind<'a> {
    name: &'a str,
    lists: Option<&'a CustomLists>,
}

impl Kind<'_> {
    fn ssa(&self, path: &str) -> SsaList {
        match self.lists {
            // a custom resource: its schema, and the metadata lists every kind shares (a
            // custom kind named like a built-in does not take the built-in's lists)
            Some(l) => l.get(path).unwrap_or_else(|| list_rule("", path).ssa),
            None => list_rule(self.name, path).ssa,
        }
    }

    /// The rule path of `field` of the object at `rule` (`*` for any key of a schema map).
    fn child(&self, rule: &str, field: &str) -> String {
        if self.lists.is_some_and(|l| l.is_map(rule)) {
            child_path(rule, "*")
        } else {
            child_path(rule, field)
        }
    }

    /// The `k:` identity of an element of the map list at `rule`: omitted key fields take the
    /// schema's default for a custom resource, the built-in defaults otherwise.
    fn key(&self, rule: &str, elem: &Value, keys: &[&str]) -> Option<String> {
        match self.lists {
            Some(l) => element_key_with(elem, keys, |k| l.key_default(rule, k)),
            None => element_key(elem, keys),
        }
    }

    /// Whether the object at `rule` is owned as one value (`x-kubernetes-map-type: atomic`).
    fn atomic_map(&self, rule: &str) -> bool {
        self.lists.is_some_and(|l| l.is_atomic(rule))
    }
}

/// Server-side apply of `applied` (the request body, already decoded from YAML) by `manager`
/// onto `live` (None: the object does not exist yet). Returns the new object with its
/// `metadata.managedFields` updated; a conflict with another manager's fields fails unless
/// `force`.
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    subresource: Option<&str>,
    now: &str,
) -> Result<Value, PatchError> {
    server_side_apply_with(live, applied, manager, force, subresource, now, None)
}

/// [`server_side_apply`] for a custom resource whose schema declares `lists`.
pub fn server_side_apply_with(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    subresource: Option<&str>,
    now: &str,
    lists: Option<&CustomLists>,
) -> Result<Value, PatchError> {
    if !applied.is_object() {
        return Err(PatchError::BadRequest(
            "the body of an apply patch must be an object".into(),
        ));
    }
    let kind_name = str_field(Some(applied), "kind")
        .or(str_field(live, "kind"))
        .unwrap_or_default()
        .to_owned();
    let kind = Kind {
        name: &kind_name,
        lists,
    };
    let api_version = str_field(Some(applied), "apiVersion")
        .or(str_field(live, "apiVersion"))
        .unwrap_or_default()
        .to_owned();

    let mut entries = live.map(read_entries).unwrap_or_default();
    if let Some(live) = live
        && entries.is_empty()
    {
        // An object nobody has claimed yet: its present fields belong to a synthetic
        // manager, so that applying over them with other values conflicts.
        let d = diff_objects(&empty_typed(&kind, &api_version), live, &kind);
        entries.push(Entry {
            manager: "before-first-apply".into(),
            operation: UPDATE.into(),
            api_version: str_field(Some(live), "apiVersion")
                .unwrap_or_default()
                .to_owned(),
            subresource: None,
            time: Some(now.to_owned()),
            set: d.added.union(&d.modified).cloned().collect(),
        });
    }
    let mine = entries
        .iter()
        .position(|e| e.same_identity(manager, APPLY, &api_version, subresource));
    let last_set = mine.map(|i| entries[i].set.clone()).unwrap_or_default();
    let new_set = applied_set(applied, &kind)?;

    let base = live.cloned().unwrap_or_else(|| Value::Object(Map::new()));
    let mut merged = base.clone();
    merge_applied(&mut merged, applied, &kind, "");

    // Fields this manager stopped applying go, unless someone else still owns them.
    let others: FieldSet = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != mine)
        .flat_map(|(_, e)| e.set.iter().cloned())
        .collect();
    // Parents come before their children: a removed list element takes its fields along.
    for path in last_set.difference(&new_set) {
        if !covers(&others, path) && !covers(&new_set, path) {
            remove_path(&mut merged, path, &kind, "", 0);
        }
    }

    let d = diff_objects(&base, &merged, &kind);
    let mut conflicts: Vec<(String, String)> = Vec::new();
    let mut lost: Vec<(usize, Vec<Pe>)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if Some(i) == mine {
            continue;
        }
        for p in e
            .set
            .iter()
            .filter(|p| d.modified.contains(*p) || d.added.contains(*p))
        {
            conflicts.push((e.display(), path_string(p)));
            lost.push((i, p.clone()));
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(&conflicts));
    }
    for (i, p) in lost {
        entries[i].set.remove(&p);
    }
    for (i, e) in entries.iter_mut().enumerate() {
        if Some(i) != mine {
            e.set = e.set.difference(&d.removed).cloned().collect();
        }
    }
    match mine {
        Some(i) => {
            let e = &mut entries[i];
            if e.set != new_set || e.api_version != api_version {
                e.time = Some(now.to_owned());
            }
            e.set = new_set;
            e.api_version = api_version;
        }
        None => entries.push(Entry {
            manager: manager.to_owned(),
            operation: APPLY.into(),
            api_version,
            subresource: subresource.map(str::to_owned),
            time: Some(now.to_owned()),
            set: new_set,
        }),
    }
    write_entries(&mut merged, entries);
    Ok(merged)
}

/// Records a create/update/patch write (operation `Update`) by `manager`: it gains the fields
/// the write added or changed, loses the ones it removed, and every other manager loses the
/// fields the write changed or removed. `new.metadata.managedFields` is rewritten from
/// `old`'s (whatever the request body carried there is ignored).
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    now: &str,
) {
    record_update_with(old, new, manager, subresource, now, None)
}

/// [`record_update`] for a custom resource whose schema declares `lists`.
pub fn record_update_with(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    subresource: Option<&str>,
    now: &str,
    lists: Option<&CustomLists>,
) {
    let kind_name = str_field(Some(new), "kind").unwrap_or_default().to_owned();
    let kind = Kind {
        name: &kind_name,
        lists,
    };
    let api_version = str_field(Some(new), "apiVersion")
        .unwrap_or_default()
        .to_owned();
    let mut entries = old.map(read_entries).unwrap_or_default();
    let base = old
        .cloned()
        .unwrap_or_else(|| empty_typed(&kind, &api_version));
    let d = diff_objects(&base, new, &kind);
    let touched: FieldSet = d
        .added
        .iter()
        .chain(&d.modified)
        .chain(&d.removed)
        .cloned()
        .collect();
    let mine = entries
        .iter()
        .position(|e| e.same_identity(manager, UPDATE, &api_version, subresource));
    for (i, e) in entries.iter_mut().enumerate() {
        if Some(i) != mine {
            e.set = e.set.difference(&touched).cloned().collect();
        }
    }
    let gained = |mut set: FieldSet| -> FieldSet {
        set.extend(d.added.iter().cloned());
        set.extend(d.modified.iter().cloned());
        set.difference(&d.removed).cloned().collect()
    };
    match mine {
        Some(i) => {
            let e = &mut entries[i];
            let set = gained(e.set.clone());
            if set != e.set {
                e.time = Some(now.to_owned());
                e.set = set;
            }
        }
        None => entries.push(Entry {
            manager: manager.to_owned(),
            operation: UPDATE.into(),
            api_version,
            subresource: subresource.map(str::to_owned),
            time: Some(now.to_owned()),
            set: gained(FieldSet::new()),
        }),
    }
    write_entries(new, entries);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-01-01T00:01:00Z";
    const T2: &str = "2026-01-01T00:02:00Z";

    fn entry<'a>(obj: &'a Value, manager: &str, op: &str) -> Option<&'a Value> {
        obj.pointer("/metadata/managedFields")?
            .as_array()?
            .iter()
            .find(|e| e["manager"] == manager && e["operation"] == op)
    }

    fn cm(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d"}, "data": data})
    }

    fn pod_cfg(image: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "d", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": image, "ports": [{"containerPort": 8080}]}]}
        })
    }

    fn conflict(err: PatchError) -> (String, Vec<(String, String)>) {
        match err {
            PatchError::Conflict { message, causes } => (message, causes),
            other => panic!("expected a conflict, got {other:?}"),
        }
    }

    #[test]
    fn create_by_apply_records_real_fieldsv1() {
        let obj = server_side_apply(None, &pod_cfg("app:1"), "kubectl", false, None, T0).unwrap();
        assert_eq!(obj["spec"]["containers"][0]["image"], "app:1");
        assert_eq!(obj["metadata"]["name"], "p");
        let e = entry(&obj, "kubectl", "Apply").unwrap();
        assert_eq!(
            *e,
            json!({
                "manager": "kubectl", "operation": "Apply", "apiVersion": "v1", "time": T0,
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {
                        ".": {}, "f:image": {}, "f:name": {},
                        "f:ports": {"k:{\"containerPort\":8080,\"protocol\":\"TCP\"}": {
                            ".": {}, "f:containerPort": {}
                        }}
                    }}}
                }
            })
        );
        assert_eq!(
            obj["metadata"]["managedFields"].as_array().unwrap().len(),
            1
        );
    }

    #[test]
    fn reapply_removes_omitted_fields_and_keeps_time_when_unchanged() {
        let v1 = server_side_apply(None, &cm(json!({"a": "1", "b": "2"})), "m", false, None, T0)
            .unwrap();
        let same = server_side_apply(
            Some(&v1),
            &cm(json!({"a": "1", "b": "2"})),
            "m",
            false,
            None,
            T1,
        )
        .unwrap();
        assert_eq!(
            same, v1,
            "a no-op apply changes nothing, not even the entry's time"
        );
        let v2 =
            server_side_apply(Some(&v1), &cm(json!({"a": "1"})), "m", false, None, T1).unwrap();
        assert_eq!(v2["data"], json!({"a": "1"}));
        let e = entry(&v2, "m", "Apply").unwrap();
        assert_eq!(e["fieldsV1"], json!({"f:data": {"f:a": {}}}));
        assert_eq!(e["time"], T1);
        // dropping the last owned label also drops the emptied labels map
        let with_label = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "labels": {"x": "y"}}, "data": {"a": "1"}});
        let v3 = server_side_apply(Some(&v2), &with_label, "m", false, None, T2).unwrap();
        assert_eq!(v3["metadata"]["labels"], json!({"x": "y"}));
        let v4 =
            server_side_apply(Some(&v3), &cm(json!({"a": "1"})), "m", false, None, T2).unwrap();
        assert!(v4["metadata"].get("labels").is_none(), "{v4}");
    }

    #[test]
    fn reapply_removes_omitted_list_items_but_keeps_others() {
        let mut cfg = pod_cfg("app:1");
        cfg["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "side", "image": "side:1"}));
        let v1 = server_side_apply(None, &cfg, "m", false, None, T0).unwrap();
        assert_eq!(v1["spec"]["containers"].as_array().unwrap().len(), 2);
        let v2 = server_side_apply(Some(&v1), &pod_cfg("app:1"), "m", false, None, T1).unwrap();
        let cs = v2["spec"]["containers"].as_array().unwrap();
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0]["name"], "app");
        assert_eq!(cs[0]["ports"], json!([{"containerPort": 8080}]));
    }

    #[test]
    fn conflict_between_two_appliers_and_force() {
        let v1 = server_side_apply(None, &cm(json!({"a": "1"})), "alice", false, None, T0).unwrap();
        let err = server_side_apply(Some(&v1), &cm(json!({"a": "2"})), "bob", false, None, T1)
            .unwrap_err();
        let (message, causes) = conflict(err);
        assert_eq!(
            message,
            "Apply failed with 1 conflict: conflict with \"alice\": .data.a"
        );
        assert_eq!(
            causes,
            [(".data.a".to_owned(), "conflict with \"alice\"".to_owned())]
        );

        let forced =
            server_side_apply(Some(&v1), &cm(json!({"a": "2"})), "bob", true, None, T1).unwrap();
        assert_eq!(forced["data"]["a"], "2");
        assert!(
            entry(&forced, "alice", "Apply").is_none(),
            "alice lost her only field"
        );
        assert_eq!(
            entry(&forced, "bob", "Apply").unwrap()["fieldsV1"],
            json!({"f:data": {"f:a": {}}})
        );
        // now alice conflicts with bob
        let err = server_side_apply(
            Some(&forced),
            &cm(json!({"a": "1"})),
            "alice",
            false,
            None,
            T2,
        )
        .unwrap_err();
        assert!(conflict(err).0.contains("conflict with \"bob\": .data.a"));
    }

    #[test]
    fn same_value_is_shared_not_a_conflict() {
        let v1 = server_side_apply(
            None,
            &cm(json!({"a": "1", "b": "1"})),
            "alice",
            false,
            None,
            T0,
        )
        .unwrap();
        let v2 =
            server_side_apply(Some(&v1), &cm(json!({"a": "1"})), "bob", false, None, T1).unwrap();
        assert_eq!(v2["data"], json!({"a": "1", "b": "1"}));
        assert!(entry(&v2, "alice", "Apply").is_some());
        assert_eq!(
            entry(&v2, "bob", "Apply").unwrap()["fieldsV1"],
            json!({"f:data": {"f:a": {}}})
        );
        // alice stops applying `a`: bob still owns it, so it stays; `b` only alice owned.
        let v3 =
            server_side_apply(Some(&v2), &cm(json!({"b": "1"})), "alice", false, None, T2).unwrap();
        assert_eq!(v3["data"], json!({"a": "1", "b": "1"}));
        let v4 = server_side_apply(Some(&v3), &cm(json!({})), "alice", false, None, T2).unwrap();
        assert_eq!(v4["data"], json!({"a": "1"}));
        assert!(entry(&v4, "alice", "Apply").is_none());
        // and bob changing the shared value now conflicts with nobody
        let v5 =
            server_side_apply(Some(&v4), &cm(json!({"a": "2"})), "bob", false, None, T2).unwrap();
        assert_eq!(v5["data"]["a"], "2");
    }

    #[test]
    fn several_conflicts_mirror_the_real_message() {
        let v1 = server_side_apply(
            None,
            &cm(json!({"a": "1", "b": "1"})),
            "alice",
            false,
            None,
            T0,
        )
        .unwrap();
        let v2 =
            server_side_apply(Some(&v1), &cm(json!({"c": "1"})), "carol", false, None, T0).unwrap();
        let err = server_side_apply(
            Some(&v2),
            &cm(json!({"a": "2", "b": "2", "c": "2"})),
            "bob",
            false,
            None,
            T1,
        )
        .unwrap_err();
        let (message, causes) = conflict(err);
        assert_eq!(
            message,
            "Apply failed with 3 conflicts: conflicts with \"alice\":\n- .data.a\n- .data.b\nconflicts with \"carol\":\n- .data.c"
        );
        assert_eq!(causes.len(), 3);
        assert!(causes.contains(&(".data.c".into(), "conflict with \"carol\"".into())));
    }

    #[test]
    fn update_owned_fields_conflict_with_apply() {
        let mut created = cm(json!({"a": "1"}));
        record_update(None, &mut created, "kubectl-create", None, T0);
        let e = entry(&created, "kubectl-create", "Update").unwrap();
        assert_eq!(e["fieldsV1"], json!({"f:data": {".": {}, "f:a": {}}}));
        assert_eq!(e["apiVersion"], "v1");

        let err = server_side_apply(
            Some(&created),
            &cm(json!({"a": "2"})),
            "ctrl",
            false,
            None,
            T1,
        )
        .unwrap_err();
        let (message, causes) = conflict(err);
        assert_eq!(
            message,
            "Apply failed with 1 conflict: conflict with \"kubectl-create\" using v1: .data.a"
        );
        assert_eq!(causes[0].0, ".data.a");

        // an update that changes a field takes it away from its applier
        let applied = server_side_apply(
            Some(&created),
            &cm(json!({"b": "1"})),
            "ctrl",
            false,
            None,
            T1,
        )
        .unwrap();
        let mut edited = applied.clone();
        edited["data"]["b"] = json!("9");
        record_update(Some(&applied), &mut edited, "editor", None, T2);
        assert!(entry(&edited, "ctrl", "Apply").is_none());
        assert_eq!(
            entry(&edited, "editor", "Update").unwrap()["fieldsV1"],
            json!({"f:data": {"f:b": {}}})
        );
        let err = server_side_apply(
            Some(&edited),
            &cm(json!({"b": "1"})),
            "ctrl",
            false,
            None,
            T2,
        )
        .unwrap_err();
        assert!(
            conflict(err)
                .0
                .ends_with("conflict with \"editor\" using v1: .data.b")
        );
    }

    #[test]
    fn record_update_of_a_pod_with_status_subresource() {
        let mut pod = pod_cfg("app:1");
        record_update(None, &mut pod, "activator", None, T0);
        let e = entry(&pod, "activator", "Update").unwrap();
        // spec existed in the typed zero value; containers and labels are new
        assert_eq!(
            e["fieldsV1"]["f:spec"]["f:containers"]["k:{\"name\":\"app\"}"]["."],
            json!({})
        );
        assert!(e["fieldsV1"]["f:spec"].get(".").is_none());
        assert_eq!(
            e["fieldsV1"]["f:metadata"]["f:labels"],
            json!({".": {}, "f:app": {}})
        );

        let mut running = pod.clone();
        running["status"] =
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        record_update(Some(&pod), &mut running, "kubelet", Some("status"), T1);
        let k = entry(&running, "kubelet", "Update").unwrap();
        assert_eq!(k["subresource"], "status");
        assert_eq!(
            k["fieldsV1"],
            json!({"f:status": {".": {}, "f:phase": {}, "f:conditions": {".": {}, "k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}}})
        );
        // the activator's entry is untouched, and sorted before the newer one
        let mf = running["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(mf[0]["manager"], "activator");
        assert_eq!(mf[1]["manager"], "kubelet");

        let err = server_side_apply(
            Some(&running),
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                    "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            "other",
            false,
            Some("status"),
            T2,
        )
        .unwrap_err();
        assert_eq!(
            conflict(err).0,
            "Apply failed with 1 conflict: conflict with \"kubelet\" with subresource \"status\" using v1: .status.conditions[type=\"Ready\"].status"
        );

        // a no-op update keeps the entry (and its time) as it was
        let mut again = running.clone();
        record_update(Some(&running), &mut again, "kubelet", Some("status"), T2);
        assert_eq!(again, running);
    }

    #[test]
    fn finalizers_are_a_set_and_before_first_apply_claims_unowned_fields() {
        let live = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "finalizers": ["a"]}, "data": {"x": "1"}});
        let err = server_side_apply(Some(&live), &cm(json!({"x": "2"})), "m", false, None, T0)
            .unwrap_err();
        assert!(
            conflict(err)
                .0
                .contains("\"before-first-apply\" using v1: .data.x")
        );

        let cfg = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "finalizers": ["b"]}, "data": {"x": "1"}});
        let v1 = server_side_apply(Some(&live), &cfg, "m", false, None, T0).unwrap();
        assert_eq!(v1["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            entry(&v1, "m", "Apply").unwrap()["fieldsV1"]["f:metadata"],
            json!({"f:finalizers": {"v:\"b\"": {}}})
        );
        let mut cfg2 = cfg.clone();
        cfg2["metadata"]["finalizers"] = json!([]);
        let v2 = server_side_apply(Some(&v1), &cfg2, "m", false, None, T1).unwrap();
        assert_eq!(v2["metadata"]["finalizers"], json!(["a"]));
    }

    #[test]
    fn bad_applied_configurations() {
        let mut cfg = pod_cfg("x");
        cfg["spec"]["containers"] = json!([{"image": "x"}]);
        let err = server_side_apply(None, &cfg, "m", false, None, T0).unwrap_err();
        assert!(
            matches!(&err, PatchError::Invalid(m) if m.contains("omits key field \"name\"")),
            "{err:?}"
        );
        cfg["spec"]["containers"] = json!([{"name": "a"}, {"name": "a"}]);
        let err = server_side_apply(None, &cfg, "m", false, None, T0).unwrap_err();
        assert!(
            matches!(&err, PatchError::Invalid(m) if m.contains("duplicate entries for key [name=\"a\"]")),
            "{err:?}"
        );
        assert!(matches!(
            server_side_apply(None, &json!([1]), "m", false, None, T0),
            Err(PatchError::BadRequest(_))
        ));
    }

    #[test]
    fn atomic_lists_are_owned_whole() {
        let mut cfg = pod_cfg("app:1");
        cfg["spec"]["tolerations"] = json!([{"key": "a"}]);
        let v1 = server_side_apply(None, &cfg, "m", false, None, T0).unwrap();
        let e = entry(&v1, "m", "Apply").unwrap();
        assert_eq!(e["fieldsV1"]["f:spec"]["f:tolerations"], json!({}));
        let mut other = pod_cfg("app:1");
        other["spec"]["tolerations"] = json!([{"key": "b"}]);
        let err = server_side_apply(Some(&v1), &other, "n", false, None, T1).unwrap_err();
        assert!(
            conflict(err)
                .0
                .ends_with("conflict with \"m\": .spec.tolerations")
        );
    }
}
