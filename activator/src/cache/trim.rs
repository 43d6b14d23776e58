//! What the caches drop from each object before keeping it.
//!
//! An activator keeps a copy of every subset it belongs to and of each of those subsets'
//! Revisions, so what a copy costs is paid per membership (about 60 per node at the design's
//! 5,000 × 100,000). Parsed into `serde_json::Value`, every JSON object is a `BTreeMap` whose
//! first node alone takes ~630 bytes, and the objects an API server answers carry
//! `metadata.managedFields`: one field tree per writer (the creator, the subsetter's status
//! writes), each a map per field. Those trees were half of the ~22 KiB of heap a membership
//! cost (docs/load-testing.md, "The activator's own memory, trimmed"), and no path of the
//! activator reads them. So the caches keep each object without them, without the `kubectl
//! apply` copy of the whole object (an annotation as large as the object); a subset without
//! its labels (the watch selected on them already), what its status says for people
//! (conditions, policy, image counts) and the hosts routed to it (entries read those by their
//! host lookups); a Revision without its status (the subsetter's conditions). What is kept:
//! the members, the generation and owner the subset was written for, the Revision's spec.

use crds::unread::drop_unread_metadata as metadata;
use crds::{ActivationEndpoints, Revision};

/// A subset as the activator keeps it: its members and what they were written for.
pub(crate) fn subset(ae: &mut ActivationEndpoints) {
    metadata(ae);
    ae.metadata.labels = None;
    if let Some(s) = ae.status.as_mut() {
        s.conditions = Vec::new();
        s.policy = None;
        s.image_members = None;
        // A member serves the revision an entry picked; which hosts route to it is the
        // entries' to read (their host lookups), never from this copy.
        s.routes = Vec::new();
    }
}

/// A Revision as the activator keeps it: its metadata trimmed, its status dropped.
pub(crate) fn revision(mut rev: Revision) -> Revision {
    metadata(&mut rev);
    rev.status = None;
    rev
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::unread::LAST_APPLIED;

    fn read<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> K {
        serde_json::from_value(v).expect("a valid object")
    }

    const MANAGED: &str = r#"[{"manager":"subsetter","operation":"Update","apiVersion":"local-activator.dev/v1alpha1","fieldsType":"FieldsV1","fieldsV1":{"f:status":{".":{},"f:activators":{}}},"subresource":"status"}]"#;

    #[test]
    fn a_subset_keeps_its_owner_generation_and_members_and_loses_the_rest() {
        let mut ae: ActivationEndpoints = read(serde_json::json!({
            "apiVersion": "local-activator.dev/v1alpha1", "kind": "ActivationEndpoints",
            "spec": {},
            "metadata": {
                "name": "r", "namespace": "n", "uid": "u", "resourceVersion": "7",
                "labels": {"member.local-activator.dev/0011223344556677": ""},
                "annotations": {(LAST_APPLIED): "{\"big\":true}"},
                "ownerReferences": [{"apiVersion": "local-activator.dev/v1alpha1",
                    "kind": "Revision", "name": "r", "uid": "ru", "controller": true}],
                "managedFields": serde_json::from_str::<serde_json::Value>(MANAGED).unwrap(),
            },
            "status": {"observedGeneration": 4, "policy": "random",
                "imageMembers": {"holding": 1, "of": 1},
                "routes": [{"host": "app.test", "percent": 100}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "Assigned",
                    "message": "", "lastTransitionTime": "2026-11-28T00:00:00Z"}],
                "activators": [{"node": "a", "address": "10.0.0.1:8080",
                "pod": "p", "maxPods": 2, "minPods": 0}]},
        }));
        let before = ae.clone();
        subset(&mut ae);
        assert_eq!(ae.metadata.managed_fields, None);
        assert_eq!(ae.metadata.annotations, None, "only last-applied was there");
        assert_eq!(ae.metadata.labels, None);
        assert_eq!(ae.metadata.name, before.metadata.name);
        assert_eq!(ae.metadata.namespace, before.metadata.namespace);
        assert_eq!(
            ae.metadata.owner_references,
            before.metadata.owner_references
        );
        assert_eq!(
            ae.metadata.resource_version,
            before.metadata.resource_version
        );
        let (s, was) = (ae.status.as_ref().unwrap(), before.status.as_ref().unwrap());
        assert_eq!(s.activators, was.activators);
        assert_eq!(s.observed_generation, Some(4));
        assert!(s.conditions.is_empty() && s.policy.is_none() && s.image_members.is_none());
        assert!(!was.routes.is_empty() && s.routes.is_empty());
        assert_eq!(s.member("a"), was.member("a"));
        assert!(
            serde_json::to_vec(&ae).unwrap().len() < serde_json::to_vec(&before).unwrap().len()
        );
    }

    #[test]
    fn a_revision_keeps_its_spec_and_other_annotations_and_loses_its_status() {
        let rev: Revision = read(serde_json::json!({
            "apiVersion": "local-activator.dev/v1alpha1", "kind": "Revision",
            "metadata": {
                "name": "r", "namespace": "n", "uid": "u", "generation": 3,
                "annotations": {(LAST_APPLIED): "{}", (crds::contract::PREPULL_ANNOTATION): "false"},
                "managedFields": serde_json::from_str::<serde_json::Value>(MANAGED).unwrap(),
            },
            "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "i"}]}}},
            "status": {"observedGeneration": 3, "conditions": [{"type": "Ready",
                "status": "True", "lastTransitionTime": "2026-11-28T00:00:00Z",
                "reason": "Assigned", "message": ""}]},
        }));
        let spec = serde_json::to_value(&rev.spec).unwrap();
        let kept = revision(rev);
        assert_eq!(serde_json::to_value(&kept.spec).unwrap(), spec);
        assert_eq!(kept.metadata.generation, Some(3));
        assert_eq!(kept.metadata.uid.as_deref(), Some("u"));
        assert_eq!(kept.status, None);
        assert_eq!(kept.metadata.managed_fields, None);
        assert!(crate::node::prepull_images::opted_out(&kept));
        assert_eq!(kept.metadata.annotations.map(|a| a.len()), Some(1));
    }
}
