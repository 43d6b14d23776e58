//! Server-side apply on a kind with a status subresource: the main resource ignores status and
//! /status ignores everything else, so a manager never owns fields the server reset.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kubesim::api::{ApiServer, ApiServerConfig};
use serde_json::json;

fn owned_by(pod: &Pod, manager: &str) -> serde_json::Value {
    pod.metadata
        .managed_fields
        .as_ref()
        .and_then(|m| m.iter().find(|e| e.manager.as_deref() == Some(manager)))
        .and_then(|e| e.fields_v1.as_ref())
        .map(|f| f.0.clone())
        .unwrap_or(serde_json::Value::Null)
}

#[tokio::test]
async fn apply_owns_only_its_endpoints_part() {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let applied = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"a": "1"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running"},
    });
    let pod = pods
        .patch("p", &PatchParams::apply("main"), &Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(
        pod.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    let main = owned_by(&pod, "main");
    assert!(main.get("f:spec").is_some(), "{main}");
    assert!(
        main.get("f:status").is_none(),
        "main resource apply owns no status: {main}"
    );

    let status = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"b": "2"}},
        "status": {"phase": "Running"},
    });
    let pod = pods
        .patch_status("p", &PatchParams::apply("kubelet"), &Patch::Apply(&status))
        .await
        .unwrap();
    assert_eq!(
        pod.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    assert!(!pod.metadata.labels.as_ref().unwrap().contains_key("b"));
    let kubelet = owned_by(&pod, "kubelet");
    assert!(kubelet.get("f:status").is_some(), "{kubelet}");
    assert!(
        kubelet.get("f:metadata").is_none(),
        "status apply owns no labels: {kubelet}"
    );

    // A body without metadata.name takes the name from the URL (kube-lease-manager sends these).
    let nameless = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {"c": "3"}}});
    let pod = pods
        .patch(
            "p",
            &PatchParams::apply("nameless"),
            &Patch::Apply(&nameless),
        )
        .await
        .unwrap();
    assert_eq!(pod.metadata.labels.as_ref().unwrap()["c"], "3");
    // A different name is still refused.
    let other = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q"}});
    let err = pods
        .patch("p", &PatchParams::apply("other"), &Patch::Apply(&other))
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 400));
    server.shutdown().await;
}
