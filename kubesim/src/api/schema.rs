//! Structural-schema handling for custom resources: defaulting, pruning, validation and CEL
//! rules (`x-kubernetes-validations`). Pure logic: no IO.
//!
//! Errors reproduce the real apiserver's: causes carry its reasons (`FieldValueInvalid`, ...),
//! fields and message bodies, and [`invalid_message`] builds the 422 `Status` message.

mod cel_rules;
mod defaults;
mod errors;
mod formats;
mod k8s_lib;
mod node;
mod structural;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use serde_json::Value;

use errors::{ErrKind, FieldErr, go_quote};
use node::{Node, SchemaPath};

/// One cause of a 422 `Invalid` (`StatusCause`): `reason` is its `type`, `message` the error body
/// without the field (`Invalid value: 70000: spec.port in body should be ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldCause {
    pub reason: String,
    pub field: String,
    pub message: String,
}

impl FieldCause {
    /// `field: message`, as the cause appears inside the `Status` message.
    pub fn full_message(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

/// A CRD version's `openAPIV3Schema`, parsed and with its CEL rules compiled; built once per CRD
/// version and used on every write.
#[derive(Debug, Clone)]
pub struct CompiledSchema {
    root: Arc<Node>,
    /// [`CompiledSchema::list_types`], worked out on first use (every apply and update of
    /// the kind needs it).
    lists: std::sync::OnceLock<crate::api::patch::CustomLists>,
}

/// The message the apiserver adds when structural errors kept CEL rules from running.
const RULES_NOT_CHECKED: &str = "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation";

impl CompiledSchema {
    /// What server-side apply reads of this schema: every array node with
    /// `x-kubernetes-list-type: map` (keyed by its `x-kubernetes-list-map-keys`) or `set`,
    /// every map (`additionalProperties`, its values at `<path>.*`) and every
    /// `x-kubernetes-map-type: atomic` object.
    pub fn list_types(&self) -> &crate::api::patch::CustomLists {
        self.lists.get_or_init(|| self.find_list_types())
    }

    fn find_list_types(&self) -> crate::api::patch::CustomLists {
        fn walk(n: &Node, path: &str, out: &mut crate::api::patch::CustomLists) {
            use crate::api::patch::SsaList;
            for (k, child) in &n.properties {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(child, &p, out);
            }
            if n.map_type.as_deref() == Some("atomic") {
                out.insert_atomic(path.to_string());
            }
            if let Some(values) = &n.additional {
                out.insert_map(path.to_string());
                let p = if path.is_empty() {
                    "*".to_string()
                } else {
                    format!("{path}.*")
                };
                walk(values, &p, out);
            }
            if let Some(items) = &n.items {
                match n.list_type.as_deref() {
                    Some("map") if !n.list_map_keys.is_empty() => {
                        out.insert(
                            path.to_string(),
                            SsaList::Map(crate::api::patch::intern_keys(&n.list_map_keys)),
                        );
                        for k in &n.list_map_keys {
                            if let Some(d) = items.property(k).and_then(|p| p.default.clone()) {
                                out.insert_key_default(path.to_string(), k.clone(), d);
                            }
                        }
                    }
                    Some("set") => out.insert(path.to_string(), SsaList::Set),
                    _ => {}
                }
                walk(items, &format!("{path}[]"), out);
            }
        }
        let mut out = crate::api::patch::CustomLists::default();
        walk(&self.root, "", &mut out);
        out
    }

    /// Parses the schema and compiles every `x-kubernetes-validations` rule; a bad schema or rule
    /// is an error naming it (`openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: ...`).
    pub fn compile(open_api_v3_schema: &Value) -> Result<CompiledSchema, String> {
        Self::compile_at(open_api_v3_schema, "openAPIV3Schema").map_err(|c| c.full_message())
    }

    /// Like [`CompiledSchema::compile`], with the error as the cause of the CRD's 422; `at` is the
    /// schema's field path in the CRD (`spec.versions[0].schema.openAPIV3Schema`).
    pub fn compile_at(open_api_v3_schema: &Value, at: &str) -> Result<CompiledSchema, FieldCause> {
        let root = node::parse(open_api_v3_schema, &SchemaPath(at.to_string()))?;
        Ok(CompiledSchema {
            root: Arc::new(root),
            lists: Default::default(),
        })
    }

    /// Prunes fields the schema does not know (kept under `x-kubernetes-preserve-unknown-fields`;
    /// `apiVersion`, `kind` and `metadata` always kept at the root, `metadata` reduced to
    /// ObjectMeta), drops nulls the schema does not allow, then applies `default`s. Returns the
    /// pruned paths (`spec.foo`, `spec.items[0].bar`, `metadata.foo`).
    pub fn default_and_prune(&self, obj: &mut Value) -> Vec<String> {
        let pruned = defaults::prune_resource(obj, &self.root);
        defaults::prune_nulls(obj, &self.root);
        defaults::apply_defaults(obj, &self.root);
        defaults::normalize_numbers(obj);
        pruned
    }

    /// Structural validation, then the CEL rules (`old` is the stored object on update, enabling
    /// transition rules). CEL rules are skipped, with the apiserver's notice, when a structural
    /// error of a blocking kind (type, required, enum, maxLength, maxItems) is present.
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<FieldCause> {
        let mut errs = structural::validate(obj, &self.root);
        if errs.iter().any(|e| e.kind.blocks_cel()) {
            errs.push(FieldErr::new(
                ErrKind::Invalid,
                "<nil>",
                errors::Bad::Json(Value::Null),
                RULES_NOT_CHECKED,
            ));
        } else {
            cel_rules::validate(obj, old, &self.root, &mut errs);
        }
        errs.into_iter().map(FieldErr::into_cause).collect()
    }
}

/// The message of the 422 `Invalid` `Status`: `Revision.local-activator.dev "bad" is invalid:
/// spec: Invalid value: ...`; several causes are listed in brackets, duplicates once.
pub fn invalid_message(qualified_kind: &str, name: &str, causes: &[FieldCause]) -> String {
    let mut seen: Vec<String> = Vec::new();
    for cause in causes {
        let m = cause.full_message();
        if !seen.contains(&m) {
            seen.push(m);
        }
    }
    let head = format!("{qualified_kind} {} is invalid", go_quote(name));
    match seen.len() {
        0 => head,
        1 => format!("{head}: {}", seen[0]),
        _ => format!("{head}: [{}]", seen.join(", ")),
    }
}
