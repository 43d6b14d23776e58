//! Discovery documents: /version, /api, /apis, group and group/version resource lists, in
//! both the legacy and the aggregated (apidiscovery.k8s.io/v2) forms.

use serde_json::{Value, json};

use super::resource::{Registry, ResourceDef};

pub(crate) const AGGREGATED: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "emulationMajor": "1",
        "emulationMinor": "33",
        "gitVersion": "v1.33.0-kubesim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

pub(crate) fn api_versions(addr: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}]
    })
}

fn gv(group: &str, v: &str) -> Value {
    json!({"groupVersion": format!("{group}/{v}"), "version": v})
}

fn group_doc(group: &str, versions: &[String]) -> Value {
    json!({
        "name": group,
        "versions": versions.iter().map(|v| gv(group, v)).collect::<Vec<_>>(),
        "preferredVersion": gv(group, &versions[0]),
    })
}

pub(crate) fn api_group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = reg.groups().map(|(g, vs)| group_doc(g, vs)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub(crate) fn api_group(reg: &Registry, group: &str) -> Option<Value> {
    let vs = reg.versions(group).filter(|_| !group.is_empty())?;
    let mut d = group_doc(group, vs);
    d["kind"] = json!("APIGroup");
    d["apiVersion"] = json!("v1");
    Some(d)
}

fn sub_verbs(sub: &str) -> Vec<&'static str> {
    match sub {
        "binding" => vec!["create"],
        "finalize" => vec!["update"],
        _ => vec!["get", "patch", "update"],
    }
}

fn subresources(d: &ResourceDef) -> Vec<&str> {
    let mut subs: Vec<&str> = Vec::new();
    if d.status_subresource {
        subs.push("status");
    }
    subs.extend(d.extra_subresources.iter().copied());
    subs
}

pub(crate) fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    if !reg.has_group_version(group, version) {
        return None;
    }
    let gvs = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut resources = Vec::new();
    for d in reg.resources(group, version) {
        let mut r = json!({
            "name": d.plural,
            "singularName": d.singular,
            "namespaced": d.namespaced,
            "kind": d.kind,
            "verbs": VERBS,
        });
        if !d.short_names.is_empty() {
            r["shortNames"] = json!(d.short_names);
        }
        if !d.categories.is_empty() {
            r["categories"] = json!(d.categories);
        }
        resources.push(r);
        for s in subresources(&d) {
            let kind = if s == "binding" {
                "Binding"
            } else {
                d.kind.as_str()
            };
            resources.push(json!({
                "name": format!("{}/{s}", d.plural),
                "singularName": "",
                "namespaced": d.namespaced,
                "kind": kind,
                "verbs": sub_verbs(s),
            }));
        }
    }
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gvs, "resources": resources}),
    )
}

fn aggregated_group(reg: &Registry, group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| {
            let resources: Vec<Value> = reg
                .resources(group, v)
                .iter()
                .map(|d| {
                    let mut r = json!({
                        "resource": d.plural,
                        "responseKind": {"group": group, "version": v, "kind": d.kind},
                        "scope": if d.namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": d.singular,
                        "verbs": VERBS,
                    });
                    if !d.short_names.is_empty() {
                        r["shortNames"] = json!(d.short_names);
                    }
                    if !d.categories.is_empty() {
                        r["categories"] = json!(d.categories);
                    }
                    let subs: Vec<Value> = subresources(d)
                        .into_iter()
                        .map(|s| {
                            let kind = if s == "binding" { "Binding" } else { d.kind.as_str() };
                            json!({"subresource": s, "responseKind": {"group": group, "version": v, "kind": kind}, "verbs": sub_verbs(s)})
                        })
                        .collect();
                    if !subs.is_empty() {
                        r["subresources"] = json!(subs);
                    }
                    r
                })
                .collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({"metadata": {"name": group}, "versions": vs})
}

/// Aggregated discovery for `/api` (core=true) or `/apis`.
pub(crate) fn aggregated(reg: &Registry, core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_group(reg, "", &["v1".to_string()])]
    } else {
        reg.groups()
            .map(|(g, vs)| aggregated_group(reg, g, vs))
            .collect()
    };
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}
