//! Deletion semantics shared by DELETE, delete-collection and the garbage collector:
//! preconditions, finalizers, graceful pod deletion, namespace and CRD termination,
//! propagation policies.

use std::sync::Arc;

use serde_json::{Value, json};

use super::meta;
use super::resource::ResourceDef;
use super::status::ApiError;
use super::store::{ObjKey, State, Stored};

pub(crate) const FOREGROUND: &str = "foregroundDeletion";
pub(crate) const CRD_CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";

#[derive(Debug, Default, Clone)]
pub(crate) struct DeleteOpts {
    pub grace: Option<i64>,
    pub propagation: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

impl DeleteOpts {
    /// From a `DeleteOptions` body (may be empty) and query parameters.
    pub fn parse(body: &[u8], q: &super::http::Query) -> Result<Self, ApiError> {
        let mut o = Self::default();
        let trimmed = body.iter().any(|b| !b.is_ascii_whitespace());
        if trimmed {
            let v: Value = serde_json::from_slice(body).map_err(|e| {
                ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
            })?;
            o.grace = v.get("gracePeriodSeconds").and_then(Value::as_i64);
            o.propagation = v
                .get("propagationPolicy")
                .and_then(Value::as_str)
                .map(String::from);
            if o.propagation.is_none()
                && let Some(orphan) = v.get("orphanDependents").and_then(Value::as_bool)
            {
                o.propagation = Some(if orphan { "Orphan" } else { "Background" }.into());
            }
            if let Some(p) = v.get("preconditions") {
                o.precondition_uid = p.get("uid").and_then(Value::as_str).map(String::from);
                o.precondition_rv = p
                    .get("resourceVersion")
                    .and_then(Value::as_str)
                    .map(String::from);
            }
            o.dry_run = v
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
        }
        if let Some(g) = q.non_empty("gracePeriodSeconds") {
            o.grace =
                Some(g.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid gracePeriodSeconds: {g}"))
                })?);
        }
        if let Some(p) = q.non_empty("propagationPolicy") {
            o.propagation = Some(p.to_string());
        }
        if let Some(p) = q.non_empty("orphanDependents")
            && o.propagation.is_none()
        {
            o.propagation = Some(if p == "true" { "Orphan" } else { "Background" }.into());
        }
        if !q.all("dryRun").is_empty() {
            o.dry_run = true;
        }
        if let Some(p) = &o.propagation
            && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
        {
            return Err(ApiError {
                details: Some(
                    json!({"causes": [{"reason": "FieldValueNotSupported", "message": format!("Unsupported value: \"{p}\": supported values: \"Foreground\", \"Background\", \"Orphan\""), "field": "propagationPolicy"}]}),
                ),
                ..ApiError::new(
                    422,
                    "Invalid",
                    format!(
                        "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"{p}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
                    ),
                )
            });
        }
        Ok(o)
    }
}

pub(crate) enum Deleted {
    /// Removed from the store; the object's last content.
    Gone(Stored),
    /// Still present (finalizers, graceful deletion, termination in progress).
    Pending(Stored),
}

fn mark_deleting(obj: &mut Value, def: &ResourceDef, grace: i64) {
    let m = meta::meta_mut(obj);
    if m.get("deletionTimestamp").is_none_or(Value::is_null) {
        m.insert("deletionTimestamp".into(), meta::rfc3339_in(grace).into());
        if def.generation {
            let g = m.get("generation").and_then(Value::as_i64).unwrap_or(0);
            m.insert("generation".into(), (g + 1).into());
        }
    }
    m.insert("deletionGracePeriodSeconds".into(), grace.into());
}

/// Deletes (or starts deleting) one object.
pub(crate) fn delete_object(
    st: &mut State,
    def: &Arc<ResourceDef>,
    key: &ObjKey,
    opts: &DeleteOpts,
) -> Result<Deleted, ApiError> {
    let tk = def.table_key();
    let cur = st
        .get(&tk, key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(def, &key.1))?;
    let uid = meta::meta_str(&cur.obj, "uid").unwrap_or("").to_string();
    if let Some(p) = &opts.precondition_uid
        && *p != uid
    {
        return Err(ApiError::conflict(
            def,
            &key.1,
            &format!("Precondition failed: UID in precondition: {p}, UID in object meta: {uid}"),
        ));
    }
    if let Some(p) = &opts.precondition_rv
        && p != cur.rv()
    {
        return Err(ApiError::conflict(
            def,
            &key.1,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {p}, ResourceVersion in object meta: {}",
                cur.rv()
            ),
        ));
    }
    if opts.dry_run {
        return Ok(Deleted::Pending(cur));
    }
    let mut obj = (*cur.obj).clone();
    let deleting = meta::is_deleting(&obj);

    if tk == "/namespaces" {
        if deleting {
            return Ok(Deleted::Pending(cur));
        }
        mark_deleting(&mut obj, def, 0);
        obj["status"] = json!({"phase": "Terminating"});
        let s = st.commit(def, key.clone(), obj);
        st.terminating_namespaces.insert(key.1.clone());
        return Ok(Deleted::Pending(s));
    }
    if tk == "apiextensions.k8s.io/customresourcedefinitions" {
        if deleting {
            return Ok(Deleted::Pending(cur));
        }
        let mut f = meta::finalizers(&obj);
        if !f.iter().any(|x| x == CRD_CLEANUP) {
            f.push(CRD_CLEANUP.into());
        }
        meta::set_finalizers(&mut obj, f);
        mark_deleting(&mut obj, def, 0);
        super::crd::set_condition(
            &mut obj,
            "Terminating",
            "True",
            "InstanceDeletionInProgress",
            "CustomResource deletion is in progress",
        );
        let s = st.commit(def, key.clone(), obj);
        st.terminating_crds.insert(key.1.clone());
        return Ok(Deleted::Pending(s));
    }

    let policy = opts.propagation.as_deref().unwrap_or("Background");
    if policy == "Orphan" && !uid.is_empty() {
        orphan_dependents(st, &uid);
    }
    if policy == "Foreground" && !deleting {
        let mut f = meta::finalizers(&obj);
        if !f.iter().any(|x| x == FOREGROUND) {
            f.push(FOREGROUND.into());
        }
        meta::set_finalizers(&mut obj, f);
    }

    let mut grace = 0;
    if tk == "/pods" {
        let spec = obj.get("spec");
        let bound = spec
            .and_then(|s| s.get("nodeName"))
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        let phase = obj
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        let terminal = matches!(phase, "Failed" | "Succeeded");
        let default = spec
            .and_then(|s| s.get("terminationGracePeriodSeconds"))
            .and_then(Value::as_i64)
            .unwrap_or(30);
        grace = opts.grace.unwrap_or(default).max(0);
        if !bound || terminal {
            grace = 0;
        }
        if grace > 0 {
            let existing = meta::meta(&obj)
                .and_then(|m| m.get("deletionGracePeriodSeconds"))
                .and_then(Value::as_i64);
            if deleting
                && existing.is_some_and(|e| e <= grace)
                && meta::finalizers(&obj) == meta::finalizers(&cur.obj)
            {
                return Ok(Deleted::Pending(cur));
            }
            mark_deleting(&mut obj, def, grace);
            return Ok(Deleted::Pending(st.commit(def, key.clone(), obj)));
        }
    }

    if !meta::finalizers(&obj).is_empty() {
        if deleting && obj == *cur.obj && grace == 0 {
            let already_zero = meta::meta(&obj)
                .and_then(|m| m.get("deletionGracePeriodSeconds"))
                .and_then(Value::as_i64)
                == Some(0);
            if already_zero {
                return Ok(Deleted::Pending(cur));
            }
        }
        mark_deleting(&mut obj, def, 0);
        if policy == "Foreground" {
            st.foreground.insert((tk.clone(), key.clone()));
        }
        if obj == *cur.obj {
            return Ok(Deleted::Pending(cur));
        }
        return Ok(Deleted::Pending(st.commit(def, key.clone(), obj)));
    }
    let gone = st.remove(&tk, key).expect("object exists");
    if tk == "/pods" {
        // A pod deleted with grace 0 (unbound, terminal, or asked for) goes at once, and the
        // answer carries the deletion as the pod strategy set it: deletionTimestamp now, grace 0.
        let mut answered = (*gone.obj).clone();
        mark_deleting(&mut answered, def, 0);
        return Ok(Deleted::Gone(Stored::new(answered)));
    }
    Ok(Deleted::Gone(gone))
}

/// Removes ownerReferences to `owner_uid` from its dependents.
pub(crate) fn orphan_dependents(st: &mut State, owner_uid: &str) {
    let deps: Vec<_> = st
        .dependents
        .get(owner_uid)
        .map(|s| s.iter().cloned().collect())
        .unwrap_or_default();
    for (tk, key) in deps {
        let Some(cur) = st.get(&tk, &key).cloned() else {
            continue;
        };
        let Some(def) = st.tables.get(&tk).map(|t| t.def.clone()) else {
            continue;
        };
        let mut obj = (*cur.obj).clone();
        strip_owner(&mut obj, owner_uid);
        st.commit(&def, key, obj);
    }
}

pub(crate) fn strip_owner(obj: &mut Value, owner_uid: &str) {
    let m = meta::meta_mut(obj);
    if let Some(Value::Array(refs)) = m.get_mut("ownerReferences") {
        refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(owner_uid));
        if refs.is_empty() {
            m.remove("ownerReferences");
        }
    }
}
