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
    let uid = meta::meta_str(&cur.view, "uid").unwrap_or("").to_string();
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
    let cur_full = cur.full();
    let mut obj = cur_full.clone();
    let deleting = meta::is_deleting(&obj);

    if tk == "/namespaces" {
        if !deleting {
            // The namespace registry's first DELETE: a deletionTimestamp (and no grace
            // period) and phase Terminating; the namespace controller takes it from there.
            meta::meta_mut(&mut obj).insert("deletionTimestamp".into(), meta::now_rfc3339().into());
            if !obj.get("status").is_some_and(Value::is_object) {
                obj["status"] = json!({});
            }
            obj["status"]["phase"] = json!("Terminating");
            let s = st.commit(def, key.clone(), obj);
            st.terminating_namespaces.insert(key.1.clone());
            return Ok(Deleted::Pending(s));
        }
        // Later DELETEs change nothing while `spec.finalizers` holds anything; once it is
        // empty the namespace is deleted like any object (metadata finalizers permitting).
        let spec_finalizers = obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if spec_finalizers {
            return Ok(Deleted::Pending(cur));
        }
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

    if tk == "/pods" {
        match pod_grace(&mut obj, opts, deleting) {
            PodGrace::Pending => return Ok(Deleted::Pending(cur)),
            PodGrace::Graceful(period) => {
                // The deletion is written first (a MODIFIED event); a pod whose period is
                // over and that has no finalizers then goes (DELETED), as the generic store's
                // updateForGracefulDeletionAndFinalizers + Delete do.
                let s = st.commit(def, key.clone(), obj);
                if policy == "Foreground" {
                    st.foreground.insert((tk.clone(), key.clone()));
                }
                if period > 0 || !meta::finalizers(&s.view).is_empty() {
                    return Ok(Deleted::Pending(s));
                }
                let gone = st.remove(&tk, key).expect("object exists");
                return Ok(Deleted::Gone(gone));
            }
            PodGrace::NotGraceful => {}
        }
    }

    if !meta::finalizers(&obj).is_empty() {
        if deleting && obj == cur_full {
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
        if obj == cur_full {
            return Ok(Deleted::Pending(cur));
        }
        return Ok(Deleted::Pending(st.commit(def, key.clone(), obj)));
    }
    let gone = st.remove(&tk, key).expect("object exists");
    Ok(Deleted::Gone(gone))
}

/// What the pod strategy makes of a DELETE (`rest.BeforeDelete` with the pod's
/// `CheckGracefulDelete`).
enum PodGrace {
    /// A graceful deletion is under way and this DELETE does not shorten it: nothing changes.
    Pending,
    /// `deletionTimestamp`/`deletionGracePeriodSeconds` set on the object for this period.
    Graceful(i64),
    /// Already deleting with grace 0: deleted like any object (finalizers permitting).
    NotGraceful,
}

fn pod_grace(pod: &mut Value, opts: &DeleteOpts, deleting: bool) -> PodGrace {
    // A negative period counts as 1 s on the delete path.
    let asked = opts.grace.map(|g| if g < 0 { 1 } else { g });
    if deleting {
        let m = meta::meta_mut(pod);
        let current = match m.get("deletionGracePeriodSeconds").and_then(Value::as_i64) {
            None | Some(0) => 0,
            Some(g) if g < 0 => 1,
            Some(g) => g,
        };
        if current == 0 {
            return PodGrace::NotGraceful;
        }
        // Only a shorter period may be asked for; the deadline moves with it.
        let Some(period) = asked.filter(|p| *p < current) else {
            return PodGrace::Pending;
        };
        let deadline = m
            .get("deletionTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .and_then(|t| {
                t.checked_sub(jiff::SignedDuration::from_secs(current - period))
                    .ok()
            });
        if let Some(t) = deadline {
            m.insert(
                "deletionTimestamp".into(),
                t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string().into(),
            );
        }
        m.insert("deletionGracePeriodSeconds".into(), period.into());
        return PodGrace::Graceful(period);
    }
    let spec = pod.get("spec");
    let bound = spec
        .and_then(|s| s.get("nodeName"))
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let terminal = matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Failed" | "Succeeded")
    );
    let mut period = asked
        .or_else(|| {
            spec.and_then(|s| s.get("terminationGracePeriodSeconds"))
                .and_then(Value::as_i64)
        })
        .unwrap_or(0);
    if !bound || terminal {
        period = 0;
    }
    if period < 0 {
        period = 1;
    }
    let m = meta::meta_mut(pod);
    m.insert("deletionTimestamp".into(), meta::rfc3339_in(period).into());
    m.insert("deletionGracePeriodSeconds".into(), period.into());
    PodGrace::Graceful(period)
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
        let mut obj = cur.full();
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
