//! One key for a namespaced object (a Revision, its ActivationEndpoints): the activator and the
//! subsetter each had their own identical namespace/name pair.

/// A namespaced object's namespace and name. Ordered by namespace, then name; shown as
/// `namespace/name`, the form logs and the API's own messages use.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_as_namespace_slash_name_and_ordered_by_namespace_first() {
        let a = ObjectKey::new("apps", "web");
        assert_eq!(a.to_string(), "apps/web");
        let mut keys = [
            ObjectKey::new("b", "a"),
            ObjectKey::new("a", "z"),
            ObjectKey::new("a", "b"),
        ];
        keys.sort();
        let shown: Vec<String> = keys.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["a/b", "a/z", "b/a"]);
    }
}
