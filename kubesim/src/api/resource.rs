//! What the server serves: resource definitions (built-in kinds and CRD-registered ones).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::schema::CompiledSchema;

/// One served resource at one group/version.
#[derive(Debug)]
pub(crate) struct ResourceDef {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub namespaced: bool,
    /// Has a `/status` subresource: main writes ignore status, status writes ignore the rest.
    pub status_subresource: bool,
    /// Keeps `metadata.generation`, bumped when anything but metadata (and status) changes.
    pub generation: bool,
    /// PUT without `metadata.resourceVersion` is allowed (most built-ins) or 422 (CRs, CRDs).
    pub unconditional_update: bool,
    /// DELETE answers with the object (pods, namespaces) rather than a success `Status`.
    pub return_deleted_object: bool,
    /// A custom resource (served from a CRD): list items keep kind/apiVersion, no
    /// strategic merge patch.
    pub custom: bool,
    /// Field labels accepted in fieldSelector besides metadata.name / metadata.namespace.
    pub field_labels: Vec<&'static str>,
    /// The version's structural schema (custom resources only).
    pub schema: Option<Arc<CompiledSchema>>,
    /// Other subresources served for discovery (`binding`, `finalize`).
    pub extra_subresources: Vec<&'static str>,
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
    /// `pods` or `revisions.local-activator.dev`, as in error messages.
    pub fn qualified_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
    /// `Pod` or `Revision.local-activator.dev`, as in Invalid messages.
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }
    /// Storage key shared by every version of a group/resource.
    pub fn table_key(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }
    /// `schema.GroupResource.String()`: `pods`, `revisions.local-activator.dev` (the
    /// `resource` label of kube-apiserver's watch cache metrics).
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
    /// The storage prefix the cacher's list metrics name (`resource_prefix`): `/pods`,
    /// `/local-activator.dev/revisions`.
    pub fn resource_prefix(&self) -> String {
        if self.group.is_empty() {
            format!("/{}", self.plural)
        } else {
            format!("/{}/{}", self.group, self.plural)
        }
    }
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.podIPs",
    "status.nominatedNodeName",
];
const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

struct B {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    short: &'static [&'static str],
    namespaced: bool,
    status: bool,
    generation: bool,
}

fn builtin(b: B) -> ResourceDef {
    ResourceDef {
        group: b.group.into(),
        version: b.version.into(),
        plural: b.plural.into(),
        singular: b.singular.into(),
        kind: b.kind.into(),
        short_names: b.short.iter().map(|s| s.to_string()).collect(),
        categories: Vec::new(),
        namespaced: b.namespaced,
        status_subresource: b.status,
        generation: b.generation,
        unconditional_update: true,
        return_deleted_object: false,
        custom: false,
        field_labels: Vec::new(),
        schema: None,
        extra_subresources: Vec::new(),
    }
}

/// The built-in kinds kubesim serves.
pub(crate) fn builtins() -> Vec<ResourceDef> {
    let mut ns = builtin(B {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        short: &["ns"],
        namespaced: false,
        status: true,
        generation: false,
    });
    ns.return_deleted_object = true;
    ns.field_labels = vec!["status.phase"];
    ns.extra_subresources = vec!["finalize"];
    let mut node = builtin(B {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        short: &["no"],
        namespaced: false,
        status: true,
        generation: false,
    });
    node.field_labels = vec!["spec.unschedulable"];
    let mut pod = builtin(B {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        short: &["po"],
        namespaced: true,
        status: true,
        generation: false,
    });
    pod.return_deleted_object = true;
    pod.categories = vec!["all".into()];
    pod.field_labels = POD_FIELDS.to_vec();
    pod.extra_subresources = vec!["binding"];
    let mut ev = builtin(B {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        short: &["ev"],
        namespaced: true,
        status: false,
        generation: false,
    });
    ev.field_labels = EVENT_FIELDS.to_vec();
    let mut ev2 = builtin(B {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        short: &["ev"],
        namespaced: true,
        status: false,
        generation: false,
    });
    // events.k8s.io/v1's field label conversion (to the core Event's selectable fields)
    ev2.field_labels = vec![
        "reason",
        "type",
        "reportingController",
        "source",
        "regarding.kind",
        "regarding.name",
        "regarding.namespace",
        "regarding.uid",
        "regarding.apiVersion",
        "regarding.resourceVersion",
        "regarding.fieldPath",
    ];
    let lease = builtin(B {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        short: &[],
        namespaced: true,
        status: false,
        generation: false,
    });
    let cm = builtin(B {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        short: &["cm"],
        namespaced: true,
        status: false,
        generation: false,
    });
    // Read by the activator's pre-pull (--prepull-secrets): a revision's image pull secrets.
    // ServiceAccounts are not served: loadtest waits for a namespace's `default` one where
    // they are (a real cluster's controller creates it), and kubesim has no such controller;
    // the pre-pull skips a service account it cannot find, as the kubelet does.
    let secret = builtin(B {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        short: &[],
        namespaced: true,
        status: false,
        generation: false,
    });
    // Served for `default/kubernetes`, the API server's own address, which in-cluster
    // components read at start (crds::api_route).
    let endpoints = builtin(B {
        group: "",
        version: "v1",
        plural: "endpoints",
        singular: "endpoints",
        kind: "Endpoints",
        short: &["ep"],
        namespaced: true,
        status: false,
        generation: false,
    });
    let eps = builtin(B {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        short: &[],
        namespaced: true,
        status: false,
        generation: true,
    });
    let mut crd = builtin(B {
        group: "apiextensions.k8s.io",
        version: "v1",
        plural: "customresourcedefinitions",
        singular: "customresourcedefinition",
        kind: "CustomResourceDefinition",
        short: &["crd", "crds"],
        namespaced: false,
        status: true,
        generation: true,
    });
    crd.categories = vec!["api-extensions".into()];
    crd.unconditional_update = false;
    vec![
        ns, node, pod, ev, ev2, cm, secret, lease, endpoints, eps, crd,
    ]
}

/// All served group/version/resources, in discovery order.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// (group, version, plural) -> def
    defs: BTreeMap<(String, String, String), Arc<ResourceDef>>,
    /// group -> versions in preference order
    groups: Vec<(String, Vec<String>)>,
}

impl Registry {
    pub fn new() -> Self {
        let mut r = Self::default();
        for d in builtins() {
            r.add(Arc::new(d));
        }
        r
    }

    pub fn add(&mut self, def: Arc<ResourceDef>) {
        let g = def.group.clone();
        let v = def.version.clone();
        match self.groups.iter_mut().find(|(n, _)| *n == g) {
            Some((_, vs)) => {
                if !vs.contains(&v) {
                    vs.push(v.clone());
                }
            }
            None => self.groups.push((g.clone(), vec![v.clone()])),
        }
        self.defs.insert((g, v, def.plural.clone()), def);
    }

    /// Removes every version of group/plural; drops groups and versions left empty.
    pub fn remove(&mut self, group: &str, plural: &str) {
        self.defs
            .retain(|(g, _, p), _| !(g == group && p == plural));
        let defs = &self.defs;
        for (g, vs) in self.groups.iter_mut() {
            vs.retain(|v| defs.keys().any(|(dg, dv, _)| dg == g && dv == v));
        }
        self.groups.retain(|(_, vs)| !vs.is_empty());
    }

    /// Sets a group's version preference order (CRD versions sorted like kube does).
    pub fn set_version_order(&mut self, group: &str, order: Vec<String>) {
        if let Some((_, vs)) = self.groups.iter_mut().find(|(n, _)| n == group) {
            let mut sorted: Vec<String> = order.into_iter().filter(|v| vs.contains(v)).collect();
            for v in vs.iter() {
                if !sorted.contains(v) {
                    sorted.push(v.clone());
                }
            }
            *vs = sorted;
        }
    }

    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.defs
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    pub fn has_group_version(&self, group: &str, version: &str) -> bool {
        self.groups
            .iter()
            .any(|(g, vs)| g == group && vs.iter().any(|v| v == version))
    }

    /// Non-core groups with their versions (preferred first).
    pub fn groups(&self) -> impl Iterator<Item = &(String, Vec<String>)> {
        self.groups.iter().filter(|(g, _)| !g.is_empty())
    }

    pub fn versions(&self, group: &str) -> Option<&Vec<String>> {
        self.groups
            .iter()
            .find(|(g, _)| g == group)
            .map(|(_, vs)| vs)
    }

    pub fn resources(&self, group: &str, version: &str) -> Vec<Arc<ResourceDef>> {
        self.defs
            .iter()
            .filter(|((g, v, _), _)| g == group && v == version)
            .map(|(_, d)| d.clone())
            .collect()
    }
}
