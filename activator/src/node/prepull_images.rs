//! What a revision's pod needs pulled before its first start: the images of its containers
//! and init containers whose pull policy lets the kubelet pull them, and where the kubelet
//! would find credentials for them. Pure: no IO.

use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use node_agent::ImageRef;

/// The service account a pod runs as when its template names none.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// What to pre-pull for one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// Images to pull, each once, in the order the template names them.
    pub images: Vec<ImageRef>,
    /// Image names the node agent's grammar refuses (the kubelet would fail the pod with
    /// `InvalidImageName`): told to the revision, never sent.
    pub invalid: Vec<String>,
    /// The template's `imagePullSecrets`.
    pub pull_secrets: Vec<String>,
    /// The pod's service account (its `imagePullSecrets` apply too).
    pub service_account: String,
}

/// The images of `template` to pre-pull. `imagePullPolicy: Never` is skipped (the kubelet
/// never pulls those: the node must already hold them); `Always` and `IfNotPresent` (and an
/// unset policy, which the API server defaults to one of them) are pulled.
pub fn wanted(template: &PodTemplateSpec) -> Wanted {
    let Some(spec) = &template.spec else {
        return Wanted {
            service_account: DEFAULT_SERVICE_ACCOUNT.into(),
            ..Wanted::default()
        };
    };
    let mut w = Wanted {
        pull_secrets: spec
            .image_pull_secrets
            .iter()
            .flatten()
            .filter(|r| !r.name.is_empty())
            .map(|r| r.name.clone())
            .collect(),
        service_account: spec
            .service_account_name
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEFAULT_SERVICE_ACCOUNT.into()),
        ..Wanted::default()
    };
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    for c in containers.filter(|c| pulls(c)) {
        let Some(name) = c.image.as_deref().filter(|n| !n.is_empty()) else {
            continue;
        };
        match ImageRef::new(name) {
            Ok(image) if !w.images.contains(&image) => w.images.push(image),
            Ok(_) => {}
            Err(_) if !w.invalid.iter().any(|i| i == name) => w.invalid.push(name.to_owned()),
            Err(_) => {}
        }
    }
    w
}

/// Whether the revision turns its pre-pull off (`local-activator.dev/prepull: "false"`).
pub fn opted_out(rev: &crds::Revision) -> bool {
    rev.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crds::contract::PREPULL_ANNOTATION))
        .is_some_and(|v| v == "false")
}

fn pulls(c: &Container) -> bool {
    c.image_pull_policy.as_deref() != Some("Never")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_false_turns_the_pre_pull_off() {
        let rev = |annotations: serde_json::Value| -> crds::Revision {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "local-activator.dev/v1alpha1", "kind": "Revision",
                "metadata": {"name": "r", "namespace": "n", "annotations": annotations},
                "spec": {"template": {"spec": {"containers": [{"name": "a", "image": "x"}]}}},
            }))
            .unwrap()
        };
        assert!(opted_out(&rev(
            serde_json::json!({"local-activator.dev/prepull": "false"})
        )));
        assert!(!opted_out(&rev(
            serde_json::json!({"local-activator.dev/prepull": "true"})
        )));
        assert!(!opted_out(&rev(
            serde_json::json!({"local-activator.dev/prepull": "False"})
        )));
        assert!(!opted_out(&rev(serde_json::json!({}))));
    }

    fn template(json: serde_json::Value) -> PodTemplateSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn containers_and_init_containers_once_each_never_skipped() {
        let w = wanted(&template(serde_json::json!({
            "spec": {
                "serviceAccountName": "app-sa",
                "imagePullSecrets": [{"name": "regcred"}, {"name": ""}],
                "initContainers": [
                    {"name": "init", "image": "r.io/init:v1"},
                    {"name": "local", "image": "r.io/local:v1", "imagePullPolicy": "Never"},
                ],
                "containers": [
                    {"name": "app", "image": "r.io/app:v1", "imagePullPolicy": "Always"},
                    {"name": "side", "image": "r.io/init:v1", "imagePullPolicy": "IfNotPresent"},
                    {"name": "bad", "image": "R.io/Upper:v1"},
                    {"name": "none"},
                ],
            }
        })));
        let names: Vec<&str> = w.images.iter().map(ImageRef::as_str).collect();
        assert_eq!(names, ["r.io/init:v1", "r.io/app:v1"]);
        assert_eq!(w.invalid, ["R.io/Upper:v1"]);
        assert_eq!(w.pull_secrets, ["regcred"]);
        assert_eq!(w.service_account, "app-sa");
    }

    #[test]
    fn no_spec_or_no_service_account_means_the_default_one() {
        assert_eq!(
            wanted(&template(serde_json::json!({}))).service_account,
            "default"
        );
        let w = wanted(&template(serde_json::json!({
            "spec": {"serviceAccountName": "", "containers": [{"name": "a", "image": "nginx"}]}
        })));
        assert_eq!(w.service_account, "default");
        assert_eq!(w.images, [ImageRef::new("nginx").unwrap()]);
        assert!(w.pull_secrets.is_empty());
    }
}
