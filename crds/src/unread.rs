//! Metadata no component of the product reads, dropped from what it caches.
//!
//! The subsetter keeps every Revision and each activator the objects of its memberships. What
//! an API server answers carries `metadata.managedFields` (a field tree per writer, each JSON
//! object of it a `BTreeMap` once parsed) and, for objects written by `kubectl apply`, a copy
//! of the whole object in an annotation; at 100,000 revisions those would be most of a cache.

use kube::Resource;

/// The annotation `kubectl apply` keeps the last applied object in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops `managedFields` and the `kubectl apply` copy from `k`'s metadata.
pub fn drop_unread_metadata<K: Resource>(k: &mut K) {
    let meta = k.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(LAST_APPLIED);
        if a.is_empty() {
            meta.annotations = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    #[test]
    fn only_the_field_trees_and_the_applied_copy_go() {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("c".into());
        cm.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        cm.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        cm.metadata.annotations = Some(
            [(LAST_APPLIED, "{}"), ("keep", "me")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
        );
        drop_unread_metadata(&mut cm);
        assert_eq!(cm.metadata.managed_fields, None);
        assert_eq!(cm.metadata.name.as_deref(), Some("c"));
        assert_eq!(cm.metadata.labels.as_ref().map(|l| l.len()), Some(1));
        let a = cm.metadata.annotations.unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a.get("keep").map(String::as_str), Some("me"));

        let mut only_applied = ConfigMap::default();
        only_applied.metadata.annotations =
            Some([(LAST_APPLIED.to_string(), "{}".to_string())].into());
        drop_unread_metadata(&mut only_applied);
        assert_eq!(only_applied.metadata.annotations, None);
    }
}
