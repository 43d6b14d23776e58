//! The controllers that finish deletions: the garbage collector (ownerReferences, foreground
//! deletion), the namespace controller and the CRD finalizer.

use std::sync::Arc;

use serde_json::Value;

use super::crd::CRD_TABLE;
use super::delete::{self, CRD_CLEANUP, DeleteOpts, FOREGROUND};
use super::meta;
use super::resource::ResourceDef;
use super::store::{ObjKey, State};

/// Runs until nothing is left to do right now.
pub(crate) fn run(st: &mut State) {
    for _ in 0..1000 {
        let before = st.rv;
        pass(st);
        if st.rv == before && st.gc_queue.is_empty() {
            break;
        }
    }
}

fn def_of(st: &State, tk: &str) -> Option<Arc<ResourceDef>> {
    st.tables.get(tk).map(|t| t.def.clone())
}

fn background() -> DeleteOpts {
    DeleteOpts {
        propagation: Some("Background".into()),
        ..Default::default()
    }
}

fn pass(st: &mut State) {
    for (tk, key) in std::mem::take(&mut st.gc_queue) {
        let Some(cur) = st.get(&tk, &key).cloned() else {
            continue;
        };
        let Some(def) = def_of(st, &tk) else { continue };
        let owners = meta::owner_uids(&cur.view);
        if owners.is_empty() {
            continue;
        }
        let missing: Vec<&String> = owners
            .iter()
            .filter(|u| !st.uids.contains_key(*u))
            .collect();
        if missing.len() == owners.len() {
            if !meta::is_deleting(&cur.view) {
                let _ = delete::delete_object(st, &def, &key, &background());
            }
        } else if !missing.is_empty() {
            let mut obj = cur.full();
            for u in missing {
                delete::strip_owner(&mut obj, u);
            }
            st.commit(&def, key, obj);
        }
    }

    for (tk, key) in st.foreground.clone() {
        let Some(cur) = st.get(&tk, &key).cloned() else {
            st.foreground.remove(&(tk, key));
            continue;
        };
        let uid = meta::meta_str(&cur.view, "uid").unwrap_or("").to_string();
        let deps: Vec<_> = st
            .dependents
            .get(&uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        let mut blocking = 0;
        for (dtk, dkey) in deps {
            let Some(d) = st.get(&dtk, &dkey).cloned() else {
                continue;
            };
            let Some(ddef) = def_of(st, &dtk) else {
                continue;
            };
            if !meta::is_deleting(&d.view) {
                let opts = DeleteOpts {
                    propagation: Some("Foreground".into()),
                    ..Default::default()
                };
                let _ = delete::delete_object(st, &ddef, &dkey, &opts);
            }
            if st.get(&dtk, &dkey).is_some() && blocks(&d.view, &uid) {
                blocking += 1;
            }
        }
        if blocking == 0 {
            let Some(def) = def_of(st, &tk) else { continue };
            st.foreground.remove(&(tk.clone(), key.clone()));
            remove_finalizer(st, &def, &key, FOREGROUND);
        }
    }

    for ns in st.terminating_namespaces.clone() {
        let mut remaining = 0;
        let tables: Vec<String> = st
            .tables
            .iter()
            .filter(|(_, t)| t.def.namespaced)
            .map(|(k, _)| k.clone())
            .collect();
        for tk in tables {
            let keys: Vec<ObjKey> = st.tables[&tk]
                .objects
                .range((ns.clone(), String::new())..)
                .take_while(|(k, _)| k.0 == ns)
                .map(|(k, _)| k.clone())
                .collect();
            let Some(def) = def_of(st, &tk) else { continue };
            for k in keys {
                remaining += 1;
                let deleting = st.get(&tk, &k).is_some_and(|s| meta::is_deleting(&s.view));
                if !deleting {
                    let _ = delete::delete_object(st, &def, &k, &background());
                }
            }
        }
        if remaining == 0 {
            finish_namespace(st, &ns);
        }
    }

    for name in st.terminating_crds.clone() {
        let key = (String::new(), name.clone());
        let Some(crd) = st.get(CRD_TABLE, &key).cloned() else {
            st.terminating_crds.remove(&name);
            continue;
        };
        let group = crd
            .view
            .pointer("/spec/group")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let plural = crd
            .view
            .pointer("/spec/names/plural")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let tk = format!("{group}/{plural}");
        let keys: Vec<ObjKey> = st
            .tables
            .get(&tk)
            .map(|t| t.objects.keys().cloned().collect())
            .unwrap_or_default();
        if let Some(def) = def_of(st, &tk) {
            for k in &keys {
                let deleting = st.get(&tk, k).is_some_and(|s| meta::is_deleting(&s.view));
                if !deleting {
                    let _ = delete::delete_object(st, &def, k, &background());
                }
            }
        }
        let left = st.tables.get(&tk).map(|t| t.objects.len()).unwrap_or(0);
        if left == 0 {
            st.registry.remove(&group, &plural);
            st.drop_table(&tk);
            st.terminating_crds.remove(&name);
            if let Some(def) = def_of(st, CRD_TABLE) {
                remove_finalizer(st, &def, &key, CRD_CLEANUP);
            }
        }
    }
}

/// The namespace controller's last step for an emptied namespace: it drops its own
/// `kubernetes` finalizer from `spec.finalizers` (a MODIFIED event, as `/finalize` makes), and
/// the namespace goes once no finalizer of either kind is left. Another finalizer keeps it
/// Terminating until its owner removes it through `/finalize`.
fn finish_namespace(st: &mut State, ns: &str) {
    let key = (String::new(), ns.to_string());
    let Some(cur) = st.get("/namespaces", &key).cloned() else {
        st.terminating_namespaces.remove(ns);
        return;
    };
    let cur_full = cur.full();
    let spec_finalizers: Vec<Value> = cur_full
        .pointer("/spec/finalizers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let left: Vec<Value> = spec_finalizers
        .iter()
        .filter(|f| f.as_str() != Some("kubernetes"))
        .cloned()
        .collect();
    // The controller is done with it; whatever finalizers are left are removed through
    // updates, which delete the namespace when the last one goes.
    st.terminating_namespaces.remove(ns);
    if left.is_empty() && meta::finalizers(&cur.view).is_empty() {
        // The finalize update that empties the list deletes the namespace in the same write
        // (ShouldDeleteNamespaceDuringUpdate): watchers see DELETED, no MODIFIED before it.
        st.remove("/namespaces", &key);
        return;
    }
    if left.len() != spec_finalizers.len()
        && let Some(def) = def_of(st, "/namespaces")
    {
        let mut obj = cur_full;
        obj["spec"]["finalizers"] = Value::Array(left);
        st.commit(&def, key, obj);
    }
}

fn blocks(dep: &Value, owner_uid: &str) -> bool {
    meta::meta(dep)
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| {
            r.get("uid").and_then(Value::as_str) == Some(owner_uid)
                && r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true)
        })
}

/// Removes a finalizer; an object being deleted with none left is removed.
pub(crate) fn remove_finalizer(st: &mut State, def: &Arc<ResourceDef>, key: &ObjKey, f: &str) {
    let tk = def.table_key();
    let Some(cur) = st.get(&tk, key).cloned() else {
        return;
    };
    let mut fs = meta::finalizers(&cur.view);
    let before = fs.len();
    fs.retain(|x| x != f);
    if fs.len() == before {
        return;
    }
    if fs.is_empty() && meta::is_deleting(&cur.view) && may_go(&tk, &cur.full()) {
        st.remove(&tk, key);
        return;
    }
    let mut obj = cur.full();
    meta::set_finalizers(&mut obj, fs);
    st.commit(def, key.clone(), obj);
}

/// Whether an object being deleted whose metadata finalizers are all gone may be removed
/// (the generic store's `ShouldDeleteDuringUpdate`, with the namespace registry's rule on top:
/// a namespace goes only once its `spec.finalizers` is empty too).
pub(crate) fn may_go(tk: &str, obj: &Value) -> bool {
    let spec_finalizers = tk == "/namespaces"
        && obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
    !spec_finalizers && pod_may_go(tk, obj)
}

/// A terminating pod is removed only once its grace period was cut to zero (by its kubelet).
pub(crate) fn pod_may_go(tk: &str, obj: &Value) -> bool {
    tk != "/pods"
        || meta::meta(obj)
            .and_then(|m| m.get("deletionGracePeriodSeconds"))
            .and_then(Value::as_i64)
            .unwrap_or(0)
            == 0
}
