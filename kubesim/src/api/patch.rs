//! PATCH semantics: JSON merge patch, JSON patch, strategic merge patch, server-side apply,
//! and the field ownership (`metadata.managedFields`) every write records.
//! Pure logic: no IO.
//!
//! How lists merge for strategic merge patch and server-side apply is one table per kind in
//! [`lists`] (merge keys of the core kinds kubesim serves).
//!
//! Simplified compared with the real API server (the field manager of
//! k8s.io/apiserver and sigs.k8s.io/structured-merge-diff):
//! - Strategic merge patch knows the list merge keys of the kinds kubesim serves only
//!   (table in [`lists`]); every other list, and every list of a custom resource, is replaced.
//!   `$setElementOrder` puts the named elements first in its order and the others after them
//!   (the real server interleaves server-only elements by their old positions); `$retainKeys`
//!   drops the keys it does not name, on any map. Custom resources are not refused here (the
//!   real server answers 415 to a strategic merge patch of a custom resource: the caller
//!   decides).
//! - Server-side apply knows the list types of built-in kinds from the same table instead of
//!   the OpenAPI schema: lists not in it are atomic. Custom resources follow their CRD's
//!   structural schema ([`CustomLists`]): `x-kubernetes-list-type` `map` (keyed by
//!   `x-kubernetes-list-map-keys`) and `set`, others atomic; `x-kubernetes-map-type: atomic`
//!   objects are owned as one value; `additionalProperties` maps' values follow the value
//!   schema. Unions, the built-ins' atomic structs (e.g. `spec.selector`, `nodeAffinity`) and
//!   defaulting are not modelled: such structs are owned field by field, and of all defaults
//!   only a port's `protocol: TCP` (built-ins) and the schema's defaults of key fields (custom
//!   resources) are used, when computing list keys.
//! - Elements added to a map-type list by apply go after the live ones (the real merge follows
//!   the applied order).
//! - Removing a field the manager no longer applies also drops maps and lists it leaves empty
//!   below the top-level fields (as Go's `omitempty` does for built-in types).
//! - `null` in an applied configuration means "not set" (skipped).
//! - Manager identity is (manager, operation, subresource, and apiVersion for Update); Update
//!   entries are never merged into an `ancient-changes` entry (the real server caps them at 10).
//! - A write's own `metadata.managedFields` in the request body is ignored: ownership is always
//!   computed from the stored object's entries.
//! - The apply/update functions do not reset fields by subresource: the caller strips
//!   `status` from a main-resource apply (and everything but `status` from a `/status` apply)
//!   before calling, as it does for updates.
//! - Entries whose `fieldsV1` cannot be decoded are dropped rather than refused.

mod apply;
mod fieldset;
mod lists;
mod strategic;

pub use apply::{record_update, record_update_with, server_side_apply, server_side_apply_with};
pub use lists::{CustomLists, ListRule, SmpList, SsaList, intern_keys, list_rule};
pub use strategic::strategic_merge_patch;

use serde_json::Value;

/// Why a patch could not be applied; the server maps these to a Status.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// Malformed patch document (400 BadRequest).
    #[error("{0}")]
    BadRequest(String),
    /// The patch cannot apply to this object (422 Invalid).
    #[error("{0}")]
    Invalid(String),
    /// Server-side apply conflict (409 Conflict); causes are (field path, message) pairs with
    /// reason `FieldManagerConflict`.
    #[error("{message}")]
    Conflict {
        message: String,
        causes: Vec<(String, String)>,
    },
}

/// RFC 7386 JSON merge patch (`application/merge-patch+json`).
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// RFC 6902 JSON patch (`application/json-patch+json`). Atomic: on error `target` is
/// unchanged.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| PatchError::BadRequest(format!("invalid JSON patch: {e}")))?;
    json_patch::patch(target, &ops).map_err(|e| {
        let op = ops.0.get(e.operation);
        let path = e.path.to_string();
        // Texts of the apiserver's JSON patch library (evanphx/json-patch).
        let message = match (&e.kind, op) {
            (json_patch::PatchErrorKind::TestFailed, _) => {
                format!("testing value {path} failed: test failed")
            }
            (_, Some(json_patch::PatchOperation::Remove(_))) => format!(
                "error in remove for path: '{path}': Unable to remove nonexistent key: {}: missing value",
                path.rsplit('/').next().unwrap_or_default()
            ),
            (_, Some(json_patch::PatchOperation::Replace(_))) => format!(
                "replace operation does not apply: doc is missing key: {path}: missing value"
            ),
            (_, Some(json_patch::PatchOperation::Add(_))) => format!(
                "add operation does not apply: doc is missing path: \"{path}\": missing value"
            ),
            (json_patch::PatchErrorKind::InvalidFromPointer, _) => {
                format!("{}: missing value", e.path)
            }
            (kind, _) => format!("{kind} (operation {}, path {path})", e.operation),
        };
        PatchError::Invalid(message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_null_deletes_and_lists_replace() {
        let mut doc = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"l": [1, 2]}});
        merge_patch(
            &mut doc,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"l": [3]}}),
        );
        assert_eq!(
            doc,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"l": [3]}})
        );
    }

    #[test]
    fn json_patch_ops() {
        let mut doc = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"l": [1, 2]}});
        json_patch(
            &mut doc,
            &json!([
                {"op": "test", "path": "/metadata/labels/a", "value": "1"},
                {"op": "add", "path": "/metadata/labels/b", "value": "2"},
                {"op": "replace", "path": "/spec/l/0", "value": 9},
                {"op": "remove", "path": "/spec/l/1"},
                {"op": "copy", "from": "/metadata/labels/a", "path": "/spec/a"},
                {"op": "move", "from": "/spec/a", "path": "/spec/moved"},
                {"op": "add", "path": "/spec/l/-", "value": 7}
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"l": [9, 7], "moved": "1"}})
        );
    }

    #[test]
    fn json_patch_failures() {
        let orig = json!({"metadata": {"labels": {"a": "1"}}});
        let mut doc = orig.clone();
        let err = json_patch(
            &mut doc,
            &json!([
                {"op": "add", "path": "/metadata/labels/b", "value": "2"},
                {"op": "test", "path": "/metadata/labels/a", "value": "2"}
            ]),
        )
        .unwrap_err();
        assert!(
            matches!(&err, PatchError::Invalid(m) if m == "testing value /metadata/labels/a failed: test failed"),
            "{err:?}"
        );
        assert_eq!(doc, orig, "a failed patch leaves the object unchanged");

        let err = json_patch(&mut doc, &json!([{"op": "remove", "path": "/spec/x"}])).unwrap_err();
        assert!(
            matches!(&err, PatchError::Invalid(m) if m.contains("Unable to remove nonexistent key: x")),
            "{err:?}"
        );
        let err = json_patch(
            &mut doc,
            &json!([{"op": "replace", "path": "/nope", "value": 1}]),
        )
        .unwrap_err();
        assert!(
            matches!(&err, PatchError::Invalid(m) if m.starts_with("replace operation does not apply")),
            "{err:?}"
        );

        for bad in [
            json!({"op": "add"}),
            json!([{"op": "frobnicate", "path": "/a"}]),
            json!([{"op": "add", "value": 1}]),
        ] {
            let err = json_patch(&mut doc, &bad).unwrap_err();
            assert!(matches!(err, PatchError::BadRequest(_)), "{bad}: {err:?}");
        }
    }
}
