//! How each list of the served kinds merges: the strategic-merge-patch merge key
//! (`patchMergeKey`/`patchStrategy` struct tags in k8s.io/api) and the server-side-apply list
//! type (`x-kubernetes-list-type`/`-list-map-keys`). Lists not named here are replaced by
//! strategic merge patch and atomic for server-side apply, as in the real types.
//!
//! Paths are dotted field names from the object root, with `[]` for "each element of the list":
//!
//! | kind | path | SMP | SSA |
//! |---|---|---|---|
//! | every kind | `metadata.ownerReferences` | merge by `uid` | map `[uid]` |
//! | every kind | `metadata.finalizers` | merge (set of strings) | set |
//! | Pod | `spec.containers`, `spec.initContainers`, `spec.ephemeralContainers` | by `name` | map `[name]` |
//! | Pod | `spec.<those>[].ports` | by `containerPort` | map `[containerPort, protocol]` (protocol defaults to TCP) |
//! | Pod | `spec.<those>[].env` | by `name` | map `[name]` |
//! | Pod | `spec.<those>[].volumeMounts` | by `mountPath` | map `[mountPath]` |
//! | Pod | `spec.<those>[].volumeDevices` | by `devicePath` | map `[devicePath]` |
//! | Pod | `spec.volumes`, `spec.imagePullSecrets`, `spec.schedulingGates`, `spec.resourceClaims` | by `name` | map `[name]` |
//! | Pod | `spec.hostAliases` | by `ip` | map `[ip]` |
//! | Pod | `spec.topologySpreadConstraints` | by `topologyKey` | map `[topologyKey, whenUnsatisfiable]` |
//! | Pod | `status.conditions` | by `type` | map `[type]` |
//! | Pod | `status.podIPs`, `status.hostIPs` | by `ip` | map `[ip]` |
//! | Node | `spec.podCIDRs` | merge (set of strings) | set |
//! | Node | `status.conditions`, `status.addresses` | by `type` | map `[type]` |
//! | Namespace, CustomResourceDefinition | `status.conditions` | by `type` | map `[type]` |
//!
//! Everything else (tolerations, taints, readinessGates, container args/command, EndpointSlice
//! endpoints and ports, CRD versions) is replaced / atomic. Custom resources' lists follow
//! their schema's `x-kubernetes-list-type` for server-side apply ([`CustomLists`]) and are
//! replaced by merge patches (custom resources take no strategic merge patch).

/// Strategic-merge-patch behaviour of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmpList {
    /// The patch's list replaces the live one.
    Replace,
    /// Elements are objects merged by this key.
    MergeKey(&'static str),
    /// A list of scalars merged as a set (`patchStrategy:"merge"` without a key).
    Primitive,
}

/// Server-side-apply list type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SsaList {
    Atomic,
    /// `listType=map` with these keys.
    Map(&'static [&'static str]),
    /// `listType=set` (scalars).
    Set,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListRule {
    pub smp: SmpList,
    pub ssa: SsaList,
}

const ATOMIC: ListRule = ListRule {
    smp: SmpList::Replace,
    ssa: SsaList::Atomic,
};

const fn keyed(smp: &'static str, ssa: &'static [&'static str]) -> ListRule {
    ListRule {
        smp: SmpList::MergeKey(smp),
        ssa: SsaList::Map(ssa),
    }
}

const SET: ListRule = ListRule {
    smp: SmpList::Primitive,
    ssa: SsaList::Set,
};

/// The merge rule of the list at `path` (see the module table) in an object of `kind`.
pub fn list_rule(kind: &str, path: &str) -> ListRule {
    match path {
        "metadata.ownerReferences" => return keyed("uid", &["uid"]),
        "metadata.finalizers" => return SET,
        _ => {}
    }
    match kind {
        "Pod" => pod_rule(path),
        "Node" => match path {
            "spec.podCIDRs" => SET,
            "status.conditions" | "status.addresses" => keyed("type", &["type"]),
            _ => ATOMIC,
        },
        "Namespace" | "CustomResourceDefinition" => match path {
            "status.conditions" => keyed("type", &["type"]),
            _ => ATOMIC,
        },
        _ => ATOMIC,
    }
}

fn pod_rule(path: &str) -> ListRule {
    if let Some(rest) = path.strip_prefix("spec.") {
        for c in ["containers", "initContainers", "ephemeralContainers"] {
            if rest == c {
                return keyed("name", &["name"]);
            }
            if let Some(sub) = rest.strip_prefix(c).and_then(|r| r.strip_prefix("[].")) {
                return match sub {
                    "ports" => keyed("containerPort", &["containerPort", "protocol"]),
                    "env" => keyed("name", &["name"]),
                    "volumeMounts" => keyed("mountPath", &["mountPath"]),
                    "volumeDevices" => keyed("devicePath", &["devicePath"]),
                    _ => ATOMIC,
                };
            }
        }
        return match rest {
            "volumes" | "imagePullSecrets" | "schedulingGates" | "resourceClaims" => {
                keyed("name", &["name"])
            }
            "hostAliases" => keyed("ip", &["ip"]),
            "topologySpreadConstraints" => {
                keyed("topologyKey", &["topologyKey", "whenUnsatisfiable"])
            }
            _ => ATOMIC,
        };
    }
    match path {
        "status.conditions" => keyed("type", &["type"]),
        "status.podIPs" | "status.hostIPs" => keyed("ip", &["ip"]),
        _ => ATOMIC,
    }
}

/// What server-side apply needs of a custom resource's schema, by rule path (see the module
/// doc; below a map with `additionalProperties` every key's rule path uses `*`):
/// - list types (`x-kubernetes-list-type` / `x-kubernetes-list-map-keys`); lists it does not
///   name are atomic, as for built-ins;
/// - which objects are maps with arbitrary keys (`additionalProperties`);
/// - which objects are atomic (`x-kubernetes-map-type: atomic`): owned as one value.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CustomLists {
    lists: std::collections::BTreeMap<String, SsaList>,
    maps: std::collections::BTreeSet<String>,
    atomic: std::collections::BTreeSet<String>,
    /// (map list's rule path, key field) -> the key field's schema default.
    key_defaults: std::collections::BTreeMap<(String, String), serde_json::Value>,
}

impl CustomLists {
    pub fn insert(&mut self, path: String, list: SsaList) {
        self.lists.insert(path, list);
    }

    /// Marks the object at `path` as a map whose children's rule paths are `path.*`.
    pub fn insert_map(&mut self, path: String) {
        self.maps.insert(path);
    }

    /// Marks the object at `path` as atomic.
    pub fn insert_atomic(&mut self, path: String) {
        self.atomic.insert(path);
    }

    /// Records the schema default of key field `key` of the map list at `path`.
    pub fn insert_key_default(&mut self, path: String, key: String, default: serde_json::Value) {
        self.key_defaults.insert((path, key), default);
    }

    pub fn get(&self, path: &str) -> Option<SsaList> {
        self.lists.get(path).copied()
    }

    /// The schema default of key field `key` of the map list at `path`.
    pub fn key_default(&self, path: &str, key: &str) -> Option<serde_json::Value> {
        self.key_defaults
            .get(&(path.to_string(), key.to_string()))
            .cloned()
    }

    pub fn is_map(&self, path: &str) -> bool {
        self.maps.contains(path)
    }

    pub fn is_atomic(&self, path: &str) -> bool {
        self.atomic.contains(path)
    }
}

/// A `'static` copy of a list's map keys, shared by every list that declares the same keys:
/// list rules are `Copy` and name their keys statically, and CRDs declare few distinct sets.
pub fn intern_keys(keys: &[String]) -> &'static [&'static str] {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static KEYS: OnceLock<Mutex<HashSet<&'static [&'static str]>>> = OnceLock::new();
    let mut all = KEYS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(found) = all
        .iter()
        .find(|k| k.len() == keys.len() && k.iter().zip(keys).all(|(a, b)| *a == b))
    {
        return found;
    }
    let leaked: Vec<&'static str> = keys
        .iter()
        .map(|k| &*Box::leak(k.clone().into_boxed_str()))
        .collect();
    let leaked: &'static [&'static str] = Box::leak(leaked.into_boxed_slice());
    all.insert(leaked);
    leaked
}

/// The value a map-list key field takes when the element omits it (API defaulting would
/// have filled it in on a real server before the key is computed).
pub fn key_default(field: &str) -> Option<serde_json::Value> {
    (field == "protocol").then(|| serde_json::Value::String("TCP".into()))
}

/// Appends a field name to a rule path.
pub fn child_path(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

/// The rule path of the elements of the list at `path`.
pub fn elem_path(path: &str) -> String {
    format!("{path}[]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lookups() {
        assert_eq!(
            list_rule("Pod", "spec.containers").smp,
            SmpList::MergeKey("name")
        );
        assert_eq!(
            list_rule("Pod", "spec.initContainers[].ports").ssa,
            SsaList::Map(&["containerPort", "protocol"])
        );
        assert_eq!(list_rule("Pod", "spec.containers[].args"), ATOMIC);
        assert_eq!(list_rule("Pod", "spec.tolerations"), ATOMIC);
        assert_eq!(
            list_rule("Node", "status.addresses").smp,
            SmpList::MergeKey("type")
        );
        assert_eq!(list_rule("Revision", "metadata.finalizers"), SET);
        assert_eq!(list_rule("Revision", "status.conditions"), ATOMIC);
        assert_eq!(
            list_rule("Lease", "metadata.ownerReferences").smp,
            SmpList::MergeKey("uid")
        );
        assert_eq!(child_path("", "spec"), "spec");
        assert_eq!(
            elem_path(&child_path("spec", "containers")),
            "spec.containers[]"
        );
    }
}
