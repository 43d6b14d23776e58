//! The optional EndpointSlice per revision (`--endpoint-slices`, off by default) for an
//! ingress that wants one: `{revision}-activationendpoints`, listing the subset's activators.
//! It carries `service.kubernetes.io/service-proxy-name`, so kube-proxy (which programs only
//! slices without that label) ignores it and no node pays for it. Pure: built from the plan.

use std::collections::BTreeMap;

use crds::{ActivatorMember, Revision};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

/// kube-proxy skips slices with this label (a different proxy owns them).
pub const SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
pub const PROXY_NAME: &str = "local-activator";
pub const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
pub const MANAGER: &str = "local-activator-subsetter";

/// The slice's name for `revision`.
pub fn name(revision: &str) -> String {
    format!("{revision}-activationendpoints")
}

/// The slice for `rev` listing `members` (an `ip:port` address each; IPv6 as `[ip]:port`).
/// Members whose address does not parse are left out. The address type follows the first
/// member (a slice holds one family).
pub fn build(rev: &Revision, members: &[ActivatorMember]) -> EndpointSlice {
    let parsed: Vec<(&ActivatorMember, std::net::SocketAddr)> = members
        .iter()
        .filter_map(|m| m.address.parse().ok().map(|a| (m, a)))
        .collect();
    let v6 = parsed.first().is_some_and(|(_, a)| a.is_ipv6());
    let port = parsed.first().map(|(_, a)| i32::from(a.port()));
    let labels = BTreeMap::from([
        (SERVICE_PROXY_NAME.to_owned(), PROXY_NAME.to_owned()),
        (MANAGED_BY.to_owned(), MANAGER.to_owned()),
        (
            crds::contract::REVISION_LABEL.to_owned(),
            rev.metadata.name.clone().unwrap_or_default(),
        ),
    ]);
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name(rev.metadata.name.as_deref().unwrap_or_default())),
            namespace: rev.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: rev.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        address_type: if v6 { "IPv6" } else { "IPv4" }.into(),
        endpoints: Some(
            parsed
                .iter()
                .filter(|(_, a)| a.is_ipv6() == v6)
                .map(|(m, a)| Endpoint {
                    addresses: vec![a.ip().to_string()],
                    node_name: Some(m.node.clone()),
                    conditions: Some(EndpointConditions {
                        ready: Some(true),
                        serving: Some(true),
                        terminating: Some(false),
                    }),
                    ..Default::default()
                })
                .collect(),
        ),
        ports: port.map(|p| {
            vec![EndpointPort {
                name: Some("http".into()),
                port: Some(p),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(node: &str, address: &str) -> ActivatorMember {
        ActivatorMember {
            node: node.into(),
            address: address.into(),
            pod: format!("act-{node}"),
            max_pods: 0,
            min_pods: 0,
        }
    }

    #[test]
    fn lists_the_members_and_is_hidden_from_kube_proxy() {
        let mut rev: Revision = serde_json::from_value(serde_json::json!({
            "apiVersion": "local-activator.dev/v1alpha1", "kind": "Revision",
            "metadata": {"name": "shop", "namespace": "apps", "uid": "u-1"},
            "spec": {"template": {"spec": {"containers": [{"name": "app"}]}}},
        }))
        .unwrap();
        rev.metadata.uid = Some("u-1".into());
        let s = build(
            &rev,
            &[
                member("n1", "10.0.0.1:8080"),
                member("n2", "10.0.0.2:8080"),
                member("n3", "bad"),
            ],
        );
        assert_eq!(s.metadata.name.as_deref(), Some("shop-activationendpoints"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("apps"));
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[SERVICE_PROXY_NAME], PROXY_NAME);
        assert_eq!(labels[crds::contract::REVISION_LABEL], "shop");
        assert_eq!(s.address_type, "IPv4");
        let eps = s.endpoints.as_ref().unwrap();
        let ips: Vec<&str> = eps.iter().map(|e| e.addresses[0].as_str()).collect();
        assert_eq!(ips, ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(eps[0].node_name.as_deref(), Some("n1"));
        assert_eq!(s.ports.as_ref().unwrap()[0].port, Some(8080));
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Revision", "u-1")
        );
        assert_eq!(owner.controller, Some(true));
    }

    #[test]
    fn an_ipv6_subset_is_an_ipv6_slice() {
        let rev: Revision = serde_json::from_value(serde_json::json!({
            "apiVersion": "local-activator.dev/v1alpha1", "kind": "Revision",
            "metadata": {"name": "r", "namespace": "apps"},
            "spec": {"template": {"spec": {"containers": [{"name": "app"}]}}},
        }))
        .unwrap();
        let s = build(&rev, &[member("n1", "[fd00::1]:8080")]);
        assert_eq!(s.address_type, "IPv6");
        assert_eq!(s.endpoints.as_ref().unwrap()[0].addresses[0], "fd00::1");
        let empty = build(&rev, &[]);
        assert!(empty.endpoints.as_ref().unwrap().is_empty() && empty.ports.is_none());
    }
}
