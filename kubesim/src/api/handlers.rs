//! Object reads and writes: get, create, replace, patch, delete, binding. Each runs under the
//! state lock and answers like kube-apiserver's generic registry does.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::builtin;
use super::crd::{self, CRD_TABLE};
use super::delete::{self, DeleteOpts, Deleted};
use super::gc;
use super::http::Query;
use super::meta;
use super::patch::{self, PatchError};
use super::resource::ResourceDef;
use super::status::{ApiError, Cause, invalid_value, required};
use super::store::{ObjKey, State, Stored};
use super::watch::partial_metadata;

/// One resource request, routed.
pub(crate) struct Ctx {
    pub def: Arc<ResourceDef>,
    pub ns: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
    pub query: Query,
    pub body: Bytes,
    pub content_type: String,
    /// `Accept: application/json;as=PartialObjectMetadata[List]`
    pub meta_only: bool,
    /// fieldManager query parameter, or the client's User-Agent product name.
    pub manager: String,
}

impl Ctx {
    pub fn key(&self) -> ObjKey {
        (
            self.ns.clone().unwrap_or_default(),
            self.name.clone().unwrap_or_default(),
        )
    }
    fn strict(&self) -> bool {
        self.query.get("fieldValidation") == Some("Strict")
    }
    fn dry_run(&self) -> bool {
        !self.query.all("dryRun").is_empty()
    }
}

/// A successful answer.
pub(crate) struct Reply {
    pub code: u16,
    pub body: Bytes,
    pub warnings: Vec<String>,
}

impl Reply {
    fn obj(code: u16, s: &Stored, meta_only: bool, warnings: Vec<String>) -> Self {
        let body = if meta_only {
            Bytes::from(serde_json::to_vec(&partial_metadata(s)).unwrap_or_default())
        } else {
            s.json.clone()
        };
        Self {
            code,
            body,
            warnings,
        }
    }
    fn value(code: u16, v: &Value) -> Self {
        Self {
            code,
            body: Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
            warnings: Vec::new(),
        }
    }
}

fn content_type_base(ct: &str) -> &str {
    ct.split(';').next().unwrap_or("").trim()
}

/// Decodes a request body (JSON, or YAML when the content type says so).
pub(crate) fn parse_body(ctx: &Ctx) -> Result<Value, ApiError> {
    let base = content_type_base(&ctx.content_type);
    let v: Value = if base.contains("yaml") {
        let s = std::str::from_utf8(&ctx.body).map_err(|e| ApiError::bad_request(e.to_string()))?;
        serde_saphyr::from_str(s)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
    } else {
        serde_json::from_slice(&ctx.body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?
    };
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "couldn't get version/kind; json parse error: expected an object",
        ));
    }
    Ok(v)
}

/// Checks apiVersion/kind of a body against the endpoint and fills them in.
fn check_type(def: &ResourceDef, obj: &mut Value) -> Result<(), ApiError> {
    let av = def.api_version();
    let m = obj.as_object_mut().expect("object");
    match m.get("apiVersion").and_then(Value::as_str) {
        Some(a) if !a.is_empty() && a != av => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({a}) does not match the expected API version ({av})"
            )));
        }
        _ => {}
    }
    match m.get("kind").and_then(Value::as_str) {
        Some(k) if !k.is_empty() && k != def.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                def.kind
            )));
        }
        _ => {}
    }
    m.insert("apiVersion".into(), av.into());
    m.insert("kind".into(), def.kind.clone().into());
    Ok(())
}

fn check_namespace(ctx: &Ctx, obj: &mut Value) -> Result<(), ApiError> {
    set_namespace(ctx.def.namespaced, ctx.ns.as_deref(), obj)
}

/// Puts the request's namespace on a namespaced object (refusing a different one in the body)
/// and removes any namespace from a cluster-scoped one, as the real server does.
fn set_namespace(namespaced: bool, ns: Option<&str>, obj: &mut Value) -> Result<(), ApiError> {
    let m = meta::meta_mut(obj);
    if namespaced {
        let ns = ns.unwrap_or_default();
        match m.get("namespace").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {}
        }
        m.insert("namespace".into(), ns.into());
    } else {
        m.remove("namespace");
    }
    Ok(())
}

fn patch_error(def: &ResourceDef, name: &str, e: PatchError) -> ApiError {
    match e {
        PatchError::BadRequest(m) => ApiError::bad_request(m),
        PatchError::Invalid(m) => {
            let mut d = Map::new();
            d.insert("name".into(), name.into());
            if !def.group.is_empty() {
                d.insert("group".into(), def.group.clone().into());
            }
            d.insert("kind".into(), def.kind.clone().into());
            ApiError {
                details: Some(Value::Object(d)),
                ..ApiError::new(422, "Invalid", m)
            }
        }
        PatchError::Conflict { message, causes } => {
            let mut d = Map::new();
            d.insert("name".into(), name.into());
            if !def.group.is_empty() {
                d.insert("group".into(), def.group.clone().into());
            }
            d.insert("kind".into(), def.plural.clone().into());
            let cs: Vec<Value> = causes
                .iter()
                .map(|(f, m)| json!({"reason": "FieldManagerConflict", "message": m, "field": f}))
                .collect();
            d.insert("causes".into(), Value::Array(cs));
            ApiError {
                details: Some(Value::Object(d)),
                ..ApiError::new(409, "Conflict", message)
            }
        }
    }
}

pub(crate) fn get(st: &State, ctx: &Ctx) -> Result<Reply, ApiError> {
    let s = st
        .get(&ctx.def.table_key(), &ctx.key())
        .ok_or_else(|| ApiError::not_found(&ctx.def, ctx.name.as_deref().unwrap_or("")))?;
    if ctx.sub.as_deref().is_some_and(|s| s != "status") {
        return Err(ApiError::method_not_allowed());
    }
    Ok(Reply::obj(200, s, ctx.meta_only, Vec::new()))
}

pub(crate) fn create(st: &mut State, ctx: &Ctx) -> Result<Reply, ApiError> {
    if ctx.sub.as_deref() == Some("binding") && ctx.def.table_key() == "/pods" {
        return binding(st, ctx);
    }
    if ctx.sub.is_some() || ctx.name.is_some() {
        return Err(ApiError::method_not_allowed());
    }
    let mut obj = parse_body(ctx)?;
    check_type(&ctx.def, &mut obj)?;
    let (s, warnings) = create_object(
        st,
        &ctx.def,
        ctx.ns.as_deref(),
        obj,
        &ctx.manager,
        ctx.strict(),
        ctx.dry_run(),
        false,
    )?;
    Ok(Reply::obj(201, &s, ctx.meta_only, warnings))
}

/// The create path (POST, and server-side apply of an absent object).
#[allow(clippy::too_many_arguments)]
pub(crate) fn create_object(
    st: &mut State,
    def: &Arc<ResourceDef>,
    ns: Option<&str>,
    mut obj: Value,
    manager: &str,
    strict: bool,
    dry_run: bool,
    managed_done: bool,
) -> Result<(Stored, Vec<String>), ApiError> {
    meta::strip_null_meta(&mut obj);
    set_namespace(def.namespaced, ns, &mut obj)?;
    let tk = def.table_key();
    let ns_s = if def.namespaced {
        ns.unwrap_or_default().to_string()
    } else {
        String::new()
    };
    let mut name = meta::name_of(&obj).to_string();
    if name.is_empty()
        && let Some(g) = meta::meta_str(&obj, "generateName")
            .filter(|g| !g.is_empty())
            .map(String::from)
    {
        loop {
            name = format!("{g}{}", meta::name_suffix());
            if st.get(&tk, &(ns_s.clone(), name.clone())).is_none() {
                break;
            }
        }
        meta::meta_mut(&mut obj).insert("name".into(), name.clone().into());
    }
    if name.is_empty() {
        let c = Cause {
            reason: "FieldValueRequired".into(),
            field: "metadata.name".into(),
            message: "Required value: name or generateName is required".into(),
        };
        return Err(ApiError::invalid(def, "", &[c]));
    }
    let name_errs = if tk == "/namespaces" {
        meta::validate_label(&name)
    } else {
        meta::validate_subdomain(&name)
    };
    if !name_errs.is_empty() {
        let cs: Vec<Cause> = name_errs
            .iter()
            .map(|m| invalid_value("metadata.name", &json!(name), m))
            .collect();
        return Err(ApiError::invalid(def, &name, &cs));
    }
    if def.namespaced {
        match st.namespace_exists(&ns_s) {
            None => return Err(ApiError::namespace_not_found(&ns_s)),
            Some(n) if meta::is_deleting(&n.view) => {
                return Err(ApiError::namespace_terminating(def, &name, &ns_s));
            }
            _ => {}
        }
    }
    let key = (ns_s, name.clone());
    if st.get(&tk, &key).is_some() {
        return Err(ApiError::already_exists(def, &name));
    }

    let mut warnings = Vec::new();
    let mut crd_schemas = None;
    match tk.as_str() {
        "/pods" => {
            builtin::default_pod(&mut obj);
            obj["status"] = json!({"phase": "Pending", "qosClass": builtin::qos_class(&obj)});
            let causes = builtin::validate_pod(&obj);
            if !causes.is_empty() {
                return Err(ApiError::invalid(def, &name, &causes));
            }
        }
        "/namespaces" => {
            let causes = builtin::validate_namespace_finalizers(&obj, false);
            if !causes.is_empty() {
                return Err(ApiError::invalid(def, &name, &causes));
            }
            builtin::default_namespace(&mut obj);
        }
        "/nodes" => builtin::taint_new_node(&mut obj),
        "/configmaps" => {
            let causes = super::configmap::validate(&obj);
            if !causes.is_empty() {
                return Err(ApiError::invalid(def, &name, &causes));
            }
        }
        super::events::CORE_TABLE | super::events::EVENTS_TABLE => {
            let causes = super::events::validate_create(&obj, &tk, &key.0);
            if !causes.is_empty() {
                return Err(ApiError::invalid(def, &name, &causes));
            }
        }
        CRD_TABLE => {
            obj.as_object_mut().expect("object").remove("status");
            crd_schemas =
                Some(crd::validate(&mut obj).map_err(|c| ApiError::invalid(def, &name, &c))?);
        }
        _ if def.custom => {
            if def.status_subresource {
                obj.as_object_mut().expect("object").remove("status");
            }
            warnings = crd::admit_custom(def, &mut obj, None, strict)?;
        }
        _ => {}
    }
    {
        let m = meta::meta_mut(&mut obj);
        for k in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            m.remove(k);
        }
        m.insert("uid".into(), meta::new_uid().into());
        m.insert("creationTimestamp".into(), meta::now_rfc3339().into());
        if def.generation {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
    }
    if !managed_done {
        let lists = def.schema.as_ref().map(|s| s.list_types());
        patch::record_update_with(None, &mut obj, manager, None, &meta::now_rfc3339(), lists);
    }
    if dry_run {
        return Ok((Stored::new(obj), warnings));
    }
    let s = st.commit(def, key.clone(), obj);
    if crd_schemas.is_some() {
        crd::register(st, &s.full());
        // The apiextensions controllers accept the names and establish the CRD in a
        // second write, as on a real cluster.
        let established = crd::established_status(&s.full());
        st.commit(def, key, established);
    }
    Ok((s, warnings))
}

fn spec_changed(def: &ResourceDef, old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            if def.status_subresource {
                m.remove("status");
            }
        }
        v
    };
    strip(old) != strip(new)
}

/// An object without its resourceVersion: a write that changes nothing else (managedFields
/// included: an apply that only takes a share of fields another manager set is written, as
/// the real field manager's result is) is a no-op.
fn without_volatile(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    v
}

/// The update path shared by PUT and PATCH, main resource or `/status`.
#[allow(clippy::too_many_arguments)]
fn update_object(
    st: &mut State,
    ctx: &Ctx,
    old: &Stored,
    mut new: Value,
    managed_done: bool,
) -> Result<Reply, ApiError> {
    let def = &ctx.def;
    let name = ctx.name.clone().unwrap_or_default();
    let sub = ctx.sub.as_deref();
    // A namespace's `/finalize` changes only `spec.finalizers` (what the namespace
    // controller, or another finalizer's owner, uses to let a terminating namespace go).
    let finalize = sub == Some("finalize") && def.table_key() == "/namespaces";
    if sub.is_some_and(|s| s != "status") && !finalize {
        return Err(ApiError::method_not_allowed());
    }
    if sub == Some("status") && !def.status_subresource {
        return Err(ApiError::no_resource());
    }
    meta::strip_null_meta(&mut new);
    let old_full = old.full();
    let old_obj: &Value = &old_full;
    if finalize {
        let finalizers = new
            .pointer("/spec/finalizers")
            .cloned()
            .unwrap_or_else(|| json!([]));
        new = old_obj.clone();
        new["spec"]["finalizers"] = finalizers;
        let causes = builtin::validate_namespace_finalizers(&new, true);
        if !causes.is_empty() {
            return Err(ApiError::invalid(def, &name, &causes));
        }
    }
    if sub == Some("status") {
        let mut base = old_obj.clone();
        match new.get("status") {
            Some(s) => base["status"] = s.clone(),
            None => {
                base.as_object_mut().expect("object").remove("status");
            }
        }
        if let Some(mf) = meta::meta(&new)
            .and_then(|m| m.get("managedFields"))
            .cloned()
        {
            meta::meta_mut(&mut base).insert("managedFields".into(), mf);
        }
        new = base;
    } else if def.status_subresource {
        match old_obj.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                new.as_object_mut().expect("object").remove("status");
            }
        }
    }
    let body_uid = meta::meta_str(&new, "uid").unwrap_or("").to_string();
    let old_uid = meta::meta_str(old_obj, "uid").unwrap_or("").to_string();
    if !body_uid.is_empty() && body_uid != old_uid {
        return Err(ApiError::conflict(
            def,
            &name,
            &format!(
                "Precondition failed: UID in precondition: {body_uid}, UID in object meta: {old_uid}"
            ),
        ));
    }
    {
        let om = meta::meta(old_obj).cloned().unwrap_or_default();
        let m = meta::meta_mut(&mut new);
        for k in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            match om.get(k) {
                Some(v) => m.insert(k.into(), v.clone()),
                None => m.remove(k),
            };
        }
        m.remove("selfLink");
    }
    if meta::is_deleting(old_obj) {
        let old_f = meta::finalizers(old_obj);
        let added: Vec<String> = meta::finalizers(&new)
            .into_iter()
            .filter(|f| !old_f.contains(f))
            .collect();
        if !added.is_empty() {
            let list = added
                .iter()
                .map(|f| format!("{f:?}"))
                .collect::<Vec<_>>()
                .join(", ");
            let c = super::status::forbidden(
                "metadata.finalizers",
                &format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{list}}}"
                ),
            );
            return Err(ApiError::invalid(def, &name, &[c]));
        }
    }
    let tk = def.table_key();
    let mut warnings = Vec::new();
    match tk.as_str() {
        "/pods" if sub.is_none() => {
            let causes = builtin::validate_pod_update(&new, old_obj);
            if !causes.is_empty() {
                return Err(ApiError::invalid(def, &name, &causes));
            }
        }
        "/namespaces" if sub.is_none() => {
            if let Some(s) = old_obj.get("spec") {
                new["spec"] = s.clone();
            }
        }
        "/configmaps" => {
            let mut causes = builtin::validate_configmap_update(&new, old_obj);
            causes.extend(super::configmap::validate(&new));
            if !causes.is_empty() {
                return Err(ApiError::invalid(def, &name, &causes));
            }
        }
        super::events::CORE_TABLE | super::events::EVENTS_TABLE => {
            let ns = meta::namespace_of(old_obj);
            let causes = super::events::validate_update(&new, old_obj, &tk, ns);
            if !causes.is_empty() {
                return Err(ApiError::invalid(def, &name, &causes));
            }
        }
        CRD_TABLE if sub.is_none() => {
            crd::validate(&mut new).map_err(|c| ApiError::invalid(def, &name, &c))?;
        }
        _ if def.custom => {
            warnings = crd::admit_custom(def, &mut new, Some(old_obj), ctx.strict())?;
        }
        _ => {}
    }
    if def.generation && spec_changed(def, old_obj, &new) {
        let g = meta::meta(old_obj)
            .and_then(|m| m.get("generation"))
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta::meta_mut(&mut new).insert("generation".into(), json!(g + 1));
    }
    if !managed_done {
        let lists = def.schema.as_ref().map(|s| s.list_types());
        patch::record_update_with(
            Some(old_obj),
            &mut new,
            &ctx.manager,
            sub,
            &meta::now_rfc3339(),
            lists,
        );
    }
    if without_volatile(&new) == without_volatile(old_obj) {
        return Ok(Reply::obj(200, old, ctx.meta_only, warnings));
    }
    if ctx.dry_run() {
        return Ok(Reply::obj(200, &Stored::new(new), ctx.meta_only, warnings));
    }
    let key = ctx.key();
    if meta::is_deleting(&new) && meta::finalizers(&new).is_empty() && gc::may_go(&tk, &new) {
        let gone = st.remove(&tk, &key).expect("object exists");
        let mut v = new;
        meta::meta_mut(&mut v).insert("resourceVersion".into(), json!(gone.rv()));
        return Ok(Reply::obj(200, &Stored::new(v), ctx.meta_only, warnings));
    }
    let s = st.commit(def, key, new);
    if tk == CRD_TABLE && sub.is_none() {
        crd::register(st, &s.full());
    }
    Ok(Reply::obj(200, &s, ctx.meta_only, warnings))
}

pub(crate) fn replace(st: &mut State, ctx: &Ctx) -> Result<Reply, ApiError> {
    let name = ctx.name.clone().ok_or_else(ApiError::method_not_allowed)?;
    let mut obj = parse_body(ctx)?;
    check_type(&ctx.def, &mut obj)?;
    let body_name = meta::name_of(&obj).to_string();
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    check_namespace(ctx, &mut obj)?;
    let old = st
        .get(&ctx.def.table_key(), &ctx.key())
        .cloned()
        .ok_or_else(|| ApiError::not_found(&ctx.def, &name))?;
    match meta::meta_str(&obj, "resourceVersion").filter(|r| !r.is_empty()) {
        None if !ctx.def.unconditional_update => {
            let c = Cause {
                reason: "FieldValueInvalid".into(),
                field: "metadata.resourceVersion".into(),
                message: "Invalid value: 0x0: must be specified for an update".into(),
            };
            return Err(ApiError::invalid(&ctx.def, &name, &[c]));
        }
        Some(rv) if rv != old.rv() => return Err(ApiError::stale(&ctx.def, &name)),
        _ => {}
    }
    update_object(st, ctx, &old, obj, false)
}

pub(crate) fn patch(st: &mut State, ctx: &Ctx) -> Result<Reply, ApiError> {
    let name = ctx.name.clone().ok_or_else(ApiError::method_not_allowed)?;
    let def = &ctx.def;
    let tk = def.table_key();
    let old = st.get(&tk, &ctx.key()).cloned();
    let ct = content_type_base(&ctx.content_type).to_string();
    let now = meta::now_rfc3339();
    if ct == "application/apply-patch+yaml" {
        let Some(manager) = ctx.query.non_empty("fieldManager") else {
            let c = required("fieldManager");
            let c = Cause {
                message: "Required value: is required for apply patch".into(),
                ..c
            };
            return Err(ApiError {
                details: Some(
                    json!({"kind": "PatchOptions", "group": "meta.k8s.io", "causes": [{"reason": c.reason, "message": c.message, "field": c.field}]}),
                ),
                ..ApiError::new(
                    422,
                    "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                )
            });
        };
        let s = std::str::from_utf8(&ctx.body).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let mut applied: Value = serde_saphyr::from_str(s)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
        if !applied.is_object() {
            return Err(ApiError::bad_request(
                "error decoding YAML: expected an object",
            ));
        }
        check_type(def, &mut applied)?;
        let applied_name = meta::name_of(&applied).to_string();
        if applied_name.is_empty() {
            // The name comes from the URL when the body has none (kube-lease-manager's
            // applies carry no metadata.name), as the real patch handler's merged object does.
            if let Some(m) = applied.as_object_mut() {
                let md = m.entry("metadata").or_insert_with(|| json!({}));
                if let Some(md) = md.as_object_mut() {
                    md.insert("name".into(), json!(name));
                }
            }
        } else if applied_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({applied_name}) does not match the name on the URL ({name})"
            )));
        }
        if def.status_subresource {
            // Fields outside the endpoint's part are reset by the server, so the manager must
            // not own them: status on the main resource, everything but status on /status.
            let obj = applied
                .as_object_mut()
                .expect("checked to be an object above");
            if ctx.sub.as_deref() == Some("status") {
                obj.retain(|k, _| {
                    matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status")
                });
                if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.retain(|k, _| matches!(k.as_str(), "name" | "namespace" | "resourceVersion"));
                }
            } else {
                obj.remove("status");
            }
        }
        let force = ctx.query.flag("force");
        let lists = def.schema.as_ref().map(|s| s.list_types());
        let merged = patch::server_side_apply_with(
            old.as_ref().map(Stored::full).as_ref(),
            &applied,
            manager,
            force,
            ctx.sub.as_deref(),
            &now,
            lists,
        )
        .map_err(|e| patch_error(def, &name, e))?;
        return match old {
            None if ctx.sub.is_some() => Err(ApiError::not_found(def, &name)),
            None => {
                let (s, w) = create_object(
                    st,
                    def,
                    ctx.ns.as_deref(),
                    merged,
                    manager,
                    ctx.strict(),
                    ctx.dry_run(),
                    true,
                )?;
                Ok(Reply::obj(201, &s, ctx.meta_only, w))
            }
            Some(old) => {
                if let Some(rv) =
                    meta::meta_str(&applied, "resourceVersion").filter(|r| !r.is_empty())
                    && rv != old.rv()
                {
                    return Err(ApiError::stale(def, &name));
                }
                let mut merged = merged;
                meta::meta_mut(&mut merged).insert("resourceVersion".into(), json!(old.rv()));
                update_object(st, ctx, &old, merged, true)
            }
        };
    }
    let old = old.ok_or_else(|| ApiError::not_found(def, &name))?;
    let p: Value = serde_json::from_slice(&ctx.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let mut new = old.full();
    match ct.as_str() {
        "application/merge-patch+json" => patch::merge_patch(&mut new, &p),
        "application/json-patch+json" => {
            patch::json_patch(&mut new, &p).map_err(|e| patch_error(def, &name, e))?
        }
        "application/strategic-merge-patch+json" if !def.custom => {
            patch::strategic_merge_patch(&mut new, &p, &def.kind)
                .map_err(|e| patch_error(def, &name, e))?
        }
        "application/strategic-merge-patch+json" => {
            return Err(ApiError::unsupported_media(&[
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
            ]));
        }
        _ => {
            return Err(ApiError::unsupported_media(&[
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
                "application/strategic-merge-patch+json",
            ]));
        }
    }
    if !new.is_object() {
        return Err(ApiError::bad_request(
            "the patch produced something that is not an object",
        ));
    }
    if meta::name_of(&new) != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta::name_of(&new)
        )));
    }
    if let Some(rv) = meta::meta_str(&new, "resourceVersion").filter(|r| !r.is_empty())
        && rv != old.rv()
    {
        return Err(ApiError::stale(def, &name));
    }
    check_type(def, &mut new)?;
    check_namespace(ctx, &mut new)?;
    update_object(st, ctx, &old, new, false)
}

fn success_status(def: &ResourceDef, s: &Stored) -> Value {
    let mut d = Map::new();
    d.insert("name".into(), meta::name_of(&s.view).into());
    if !def.group.is_empty() {
        d.insert("group".into(), def.group.clone().into());
    }
    d.insert("kind".into(), def.plural.clone().into());
    d.insert(
        "uid".into(),
        meta::meta_str(&s.view, "uid").unwrap_or("").into(),
    );
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": d})
}

pub(crate) fn delete(st: &mut State, ctx: &Ctx) -> Result<Reply, ApiError> {
    if ctx.sub.is_some() {
        return Err(ApiError::method_not_allowed());
    }
    let opts = DeleteOpts::parse(&ctx.body, &ctx.query)?;
    match delete::delete_object(st, &ctx.def, &ctx.key(), &opts)? {
        Deleted::Gone(s) if !ctx.def.return_deleted_object => {
            Ok(Reply::value(200, &success_status(&ctx.def, &s)))
        }
        Deleted::Gone(s) | Deleted::Pending(s) => {
            Ok(Reply::obj(200, &s, ctx.meta_only, Vec::new()))
        }
    }
}

pub(crate) fn delete_collection(st: &mut State, ctx: &Ctx) -> Result<Reply, ApiError> {
    let sel = super::list::Selectors::parse(&ctx.def, &ctx.query)?;
    let opts = DeleteOpts::parse(&ctx.body, &ctx.query)?;
    let tk = ctx.def.table_key();
    let keys: Vec<ObjKey> = st
        .tables
        .get(&tk)
        .map(|t| {
            t.objects
                .iter()
                .filter(|(k, s)| ctx.ns.as_ref().is_none_or(|n| *n == k.0) && sel.matches(&s.view))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    let mut items = Vec::new();
    for k in keys {
        match delete::delete_object(st, &ctx.def, &k, &opts) {
            Ok(Deleted::Gone(s)) | Ok(Deleted::Pending(s)) => items.push(s),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let body = super::list::list_body(&ctx.def, items.iter(), st.rv, None, None, ctx.meta_only);
    Ok(Reply {
        code: 200,
        body,
        warnings: Vec::new(),
    })
}

/// `POST pods/{name}/binding`: what kube-scheduler does to bind a pod.
fn binding(st: &mut State, ctx: &Ctx) -> Result<Reply, ApiError> {
    let name = ctx.name.clone().ok_or_else(ApiError::method_not_allowed)?;
    let b = parse_body(ctx)?;
    let node = b
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if node.is_empty() {
        return Err(ApiError::invalid(
            &ctx.def,
            &name,
            &[required("target.name")],
        ));
    }
    let old = st
        .get("/pods", &ctx.key())
        .cloned()
        .ok_or_else(|| ApiError::not_found(&ctx.def, &name))?;
    if meta::is_deleting(&old.view) {
        return Err(ApiError::conflict(
            &ctx.def,
            &name,
            "pod is being deleted, cannot be assigned to a host",
        ));
    }
    if let Some(cur) = old
        .view
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        return Err(ApiError {
            message: format!(
                "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{cur}\""
            ),
            ..ApiError::conflict(&ctx.def, &name, "")
        });
    }
    let mut new = old.full();
    new["spec"]["nodeName"] = json!(node);
    let mut st_obj = new.clone();
    crd::set_condition(&mut st_obj, "PodScheduled", "True", "", "");
    if let Some(c) = st_obj
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    {
        for c in c.iter_mut().filter_map(Value::as_object_mut) {
            c.retain(|_, v| v.as_str() != Some(""));
        }
    }
    new["status"] = st_obj["status"].clone();
    st.commit(&ctx.def, ctx.key(), new);
    Ok(Reply::value(
        201,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}
