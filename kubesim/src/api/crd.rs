//! CustomResourceDefinitions: validation, registration of the resources they define,
//! the status the apiextensions controllers write, and admission of custom resources.

use std::sync::Arc;

use serde_json::{Value, json};

use super::meta;
use super::resource::ResourceDef;
use super::schema::CompiledSchema;
use super::status::{ApiError, Cause, invalid_value, required};
use super::store::State;

/// A served version's name and compiled schema.
pub(crate) type VersionSchema = (String, Option<Arc<CompiledSchema>>);

pub(crate) const CRD_TABLE: &str = "apiextensions.k8s.io/customresourcedefinitions";

/// Sets (or replaces) a condition in `status.conditions`.
pub(crate) fn set_condition(obj: &mut Value, ty: &str, status: &str, reason: &str, message: &str) {
    if !obj.get("status").is_some_and(Value::is_object) {
        obj["status"] = json!({});
    }
    let conds = obj["status"]
        .as_object_mut()
        .expect("map")
        .entry("conditions")
        .or_insert_with(|| json!([]));
    let Some(cs) = conds.as_array_mut() else {
        return;
    };
    let c = json!({"type": ty, "status": status, "lastTransitionTime": meta::now_rfc3339(), "reason": reason, "message": message});
    match cs
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
    {
        Some(old) => {
            if old.get("status") != c.get("status") {
                *old = c;
            }
        }
        None => cs.push(c),
    }
}

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// Compiled schemas of a CRD's versions, validating the CRD as the API server does
/// (the parts that matter to clients).
pub(crate) fn validate(crd: &mut Value) -> Result<Vec<VersionSchema>, Vec<Cause>> {
    let mut causes = Vec::new();
    let group = s(crd, "/spec/group").to_string();
    let plural = s(crd, "/spec/names/plural").to_string();
    let kind = s(crd, "/spec/names/kind").to_string();
    if group.is_empty() {
        causes.push(required("spec.group"));
    } else if !group.contains('.') {
        causes.push(invalid_value(
            "spec.group",
            &json!(group),
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        causes.push(required("spec.names.plural"));
    }
    if kind.is_empty() {
        causes.push(required("spec.names.kind"));
    }
    let name = meta::name_of(crd).to_string();
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        causes.push(invalid_value(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let scope = s(crd, "/spec/scope");
    if !matches!(scope, "Namespaced" | "Cluster") {
        causes.push(Cause {
            reason: "FieldValueNotSupported".into(),
            field: "spec.scope".into(),
            message: format!(
                "Unsupported value: \"{scope}\": supported values: \"Cluster\", \"Namespaced\""
            ),
        });
    }
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        causes.push(required("spec.versions"));
    }
    let storage = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if !versions.is_empty() && storage != 1 {
        causes.push(invalid_value(
            "spec.versions",
            &json!(versions.iter().map(|v| s(v, "/name")).collect::<Vec<_>>()),
            "must have exactly one version marked as storage version",
        ));
    }
    let mut out = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let vname = s(v, "/name").to_string();
        if vname.is_empty() {
            causes.push(required(format!("spec.versions[{i}].name")));
        }
        match v.pointer("/schema/openAPIV3Schema") {
            None => causes.push(Cause {
                reason: "FieldValueRequired".into(),
                field: format!("spec.versions[{i}].schema.openAPIV3Schema"),
                message: "Required value: schemas are required".into(),
            }),
            Some(sch) => {
                match CompiledSchema::compile_at(
                    sch,
                    &format!("spec.versions[{i}].schema.openAPIV3Schema"),
                ) {
                    Ok(c) => out.push((vname, Some(Arc::new(c)))),
                    // the cause names the schema's own field, as the real CRD validation does
                    Err(c) => causes.push(Cause {
                        reason: c.reason,
                        field: c.field,
                        message: c.message,
                    }),
                }
            }
        }
    }
    if !causes.is_empty() {
        return Err(causes);
    }
    if let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) {
        spec.entry("conversion")
            .or_insert_with(|| json!({"strategy": "None"}));
        if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) {
            names
                .entry("singular")
                .or_insert_with(|| json!(kind.to_lowercase()));
            names
                .entry("listKind")
                .or_insert_with(|| json!(format!("{kind}List")));
        }
    }
    Ok(out)
}

/// The resources a CRD defines, one per served version.
pub(crate) fn defs(crd: &Value, schemas: &[VersionSchema]) -> Vec<Arc<ResourceDef>> {
    let strs = |p: &str| -> Vec<String> {
        crd.pointer(p)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let kind = s(crd, "/spec/names/kind").to_string();
    let mut out = Vec::new();
    for v in crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let vname = s(v, "/name").to_string();
        let schema = schemas
            .iter()
            .find(|(n, _)| *n == vname)
            .and_then(|(_, s)| s.clone());
        let selectable: Vec<&'static str> = v
            .get("selectableFields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
            .map(|p| &*Box::leak(p.trim_start_matches('.').to_string().into_boxed_str()))
            .collect();
        out.push(Arc::new(ResourceDef {
            group: s(crd, "/spec/group").into(),
            version: vname,
            plural: s(crd, "/spec/names/plural").into(),
            singular: {
                let x = s(crd, "/spec/names/singular");
                if x.is_empty() {
                    kind.to_lowercase()
                } else {
                    x.into()
                }
            },
            kind: kind.clone(),
            short_names: strs("/spec/names/shortNames"),
            categories: strs("/spec/names/categories"),
            namespaced: s(crd, "/spec/scope") == "Namespaced",
            status_subresource: v.pointer("/subresources/status").is_some(),
            generation: true,
            unconditional_update: false,
            return_deleted_object: false,
            custom: true,
            field_labels: selectable,
            schema,
            extra_subresources: Vec::new(),
        }));
    }
    out
}

/// Registers (or re-registers) a CRD's resources; the storage table is kept.
pub(crate) fn register(st: &mut State, crd: &Value) {
    let mut crd_copy = crd.clone();
    let Ok(schemas) = validate(&mut crd_copy) else {
        return;
    };
    let group = s(crd, "/spec/group").to_string();
    let plural = s(crd, "/spec/names/plural").to_string();
    st.registry.remove(&group, &plural);
    let defs = defs(crd, &schemas);
    let mut order: Vec<String> = defs.iter().map(|d| d.version.clone()).collect();
    order.sort_by_cached_key(|v| std::cmp::Reverse(kube::core::Version::parse(v).priority()));
    for d in &defs {
        st.registry.add(d.clone());
    }
    st.registry.set_version_order(&group, order);
    let tk = format!("{group}/{plural}");
    if let (Some(t), Some(d)) = (st.tables.get_mut(&tk), defs.first()) {
        t.def = d.clone();
    }
}

/// The status the apiextensions controllers write once a CRD's names are accepted.
pub(crate) fn established_status(crd: &Value) -> Value {
    let mut obj = crd.clone();
    let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let storage: Vec<String> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .map(|v| s(v, "/name").to_string())
        .collect();
    if !obj.get("status").is_some_and(Value::is_object) {
        obj["status"] = json!({});
    }
    obj["status"]["acceptedNames"] = names;
    let mut stored: Vec<String> = crd
        .pointer("/status/storedVersions")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    for v in storage {
        if !stored.contains(&v) {
            stored.push(v);
        }
    }
    obj["status"]["storedVersions"] = json!(stored);
    set_condition(
        &mut obj,
        "NamesAccepted",
        "True",
        "NoConflicts",
        "no conflicts found",
    );
    set_condition(
        &mut obj,
        "Established",
        "True",
        "InitialNamesAccepted",
        "the initial names have been accepted",
    );
    obj
}

/// Defaulting, pruning and validation of a custom resource write. Returns the warnings
/// (pruned unknown fields).
pub(crate) fn admit_custom(
    def: &ResourceDef,
    obj: &mut Value,
    old: Option<&Value>,
    strict: bool,
) -> Result<Vec<String>, ApiError> {
    let Some(schema) = &def.schema else {
        return Ok(Vec::new());
    };
    let pruned = schema.default_and_prune(obj);
    let unknown: Vec<String> = pruned
        .iter()
        .map(|p| format!("unknown field \"{p}\""))
        .collect();
    if strict && !unknown.is_empty() {
        return Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            unknown.join(", ")
        )));
    }
    let causes = schema.validate(obj, old);
    if !causes.is_empty() {
        let name = meta::name_of(obj).to_string();
        let message = super::schema::invalid_message(&def.qualified_kind(), &name, &causes);
        let cs: Vec<Cause> = causes
            .iter()
            .map(|c| Cause {
                reason: c.reason.clone(),
                field: c.field.clone(),
                message: c.message.clone(),
            })
            .collect();
        return Err(ApiError::invalid_with_message(def, &name, message, &cs));
    }
    Ok(unknown)
}
