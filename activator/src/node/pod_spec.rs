//! The app pod an activator creates for a revision on its own node. Pure logic, no IO.

use crds::Revision;
use crds::contract::{NODE_LABEL, REVISION_LABEL, REVISION_UID_LABEL, pod_name};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

/// Builds the `ordinal`-th pod of `rev` on `node`: the revision's template with
/// `spec.nodeName` set (no scheduler involved), the contract's labels and a controller
/// ownerReference to the Revision (deleting the Revision deletes its pods). Two defaults
/// differ from a plain pod's, where the template leaves them unset, because each costs
/// every cold start and few apps need them (docs/activator.md, "The pod it creates"):
/// - `automountServiceAccountToken: false`: the kubelet mints and mounts a projected token
///   before it starts the sandbox (about 300 ms on a real kubelet, measured);
/// - `enableServiceLinks: false`: no `<SERVICE>_SERVICE_HOST` variables, which the kubelet
///   computes from every Service in the namespace for every container it starts.
///
/// A template that sets either keeps its own value.
pub fn build_pod(rev: &Revision, node: &str, ordinal: u32) -> Result<Pod, String> {
    let name = rev.name_any();
    let namespace = rev
        .namespace()
        .ok_or_else(|| format!("revision {name} has no namespace"))?;
    let uid = rev
        .uid()
        .ok_or_else(|| format!("revision {namespace}/{name} has no uid"))?;
    let owner = rev
        .controller_owner_ref(&())
        .ok_or_else(|| format!("revision {namespace}/{name} has no owner reference data"))?;
    let template = rev
        .spec
        .template
        .parse()
        .map_err(|e| format!("revision {namespace}/{name}: {e}"))?;
    let mut spec = template
        .spec
        .ok_or_else(|| format!("revision {namespace}/{name} has no spec.template.spec"))?;
    if spec.containers.is_empty() {
        return Err(format!(
            "revision {namespace}/{name} has no containers in spec.template.spec"
        ));
    }
    spec.node_name = Some(node.to_string());
    spec.automount_service_account_token.get_or_insert(false);
    spec.enable_service_links.get_or_insert(false);

    let tmeta = template.metadata.unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    labels.insert(REVISION_LABEL.into(), name.clone());
    labels.insert(REVISION_UID_LABEL.into(), uid);
    labels.insert(NODE_LABEL.into(), node_label_value(node));

    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&name, node, ordinal)),
            namespace: Some(namespace),
            labels: Some(labels),
            annotations: tmeta.annotations,
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// The `local-activator.dev/node` label value: the node's name, or its hash when the name is
/// longer than a label value may be (node names go up to 253 characters, label values 63).
pub fn node_label_value(node: &str) -> String {
    if node.len() <= 63 {
        node.to_string()
    } else {
        crds::contract::node_hash(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::{PodTemplate, RevisionSpec};
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};

    fn revision() -> Revision {
        let mut rev = Revision::new(
            "hello",
            serde_json::from_value::<RevisionSpec>(serde_json::json!({"template": {}})).unwrap(),
        );
        rev.metadata.namespace = Some("apps".into());
        rev.metadata.uid = Some("uid-1".into());
        rev.spec.template = PodTemplate::from(PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some([("app".to_string(), "hello".to_string())].into()),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("hello:1".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        });
        rev
    }

    #[test]
    fn pod_is_bound_labelled_and_owned() {
        let pod = build_pod(&revision(), "node-3", 0).unwrap();
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-3"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("apps"));
        assert_eq!(
            pod.metadata.name.as_deref(),
            Some(pod_name("hello", "node-3", 0).as_str())
        );
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[REVISION_LABEL], "hello");
        assert_eq!(labels[REVISION_UID_LABEL], "uid-1");
        assert_eq!(labels[NODE_LABEL], "node-3");
        assert_eq!(labels["app"], "hello", "template labels are kept");
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "Revision");
        assert_eq!(owner.uid, "uid-1");
        assert_eq!(owner.controller, Some(true));
    }

    #[test]
    fn no_token_and_no_service_links_unless_the_template_asks() {
        let pod = build_pod(&revision(), "node-3", 0).unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.enable_service_links, Some(false));

        let mut rev = revision();
        let mut t: serde_json::Value = serde_json::to_value(&rev.spec.template).unwrap();
        t["spec"]["automountServiceAccountToken"] = true.into();
        t["spec"]["enableServiceLinks"] = true.into();
        rev.spec.template = serde_json::from_value(t).unwrap();
        let spec = build_pod(&rev, "node-3", 0).unwrap().spec.unwrap();
        assert_eq!(spec.automount_service_account_token, Some(true));
        assert_eq!(spec.enable_service_links, Some(true));
    }

    #[test]
    fn template_without_containers_is_refused() {
        let mut rev = revision();
        let mut t = rev.spec.template.parse().unwrap();
        t.spec.as_mut().unwrap().containers.clear();
        rev.spec.template = t.clone().into();
        assert!(
            build_pod(&rev, "n", 0)
                .unwrap_err()
                .contains("no containers")
        );
        t.spec = None;
        rev.spec.template = t.into();
        assert!(build_pod(&rev, "n", 0).is_err());
        // Not a PodTemplateSpec at all: refused with the reason, nothing panics.
        rev.spec.template = PodTemplate::from(serde_json::json!({"spec": {"containers": "x"}}));
        assert!(
            build_pod(&rev, "n", 0)
                .unwrap_err()
                .contains("spec.template")
        );
    }

    #[test]
    fn long_node_names_get_a_hash_as_label_value() {
        assert_eq!(node_label_value("node-1"), "node-1");
        let long = "n".repeat(100);
        assert_eq!(node_label_value(&long).len(), 16);
    }
}
