//! Whether a pod is ready as its kubelet last said, which is what the activator (proxying to
//! its node's app pods, and to the replicas in its directory) and the subsetter (choosing
//! members among the activator pods) both need; kubesim's simulated kubelet reads the node
//! lifecycle controller's mark the same way to write its own status back, as a real one does.
//!
//! When a node's lease goes stale — its kubelet, or the API server, out of reach for longer
//! than the node-monitor grace period — the controller-manager flips the Ready condition of
//! every pod on it to False and changes nothing else (`MarkPodsNotReady`), while a kubelet
//! whose container fails its readiness probe also marks the container not ready
//! (`containerStatuses[].ready`). After an API server outage longer than that grace period
//! every pod in the cluster gets this mark, and it stays until the pod's kubelet notices it:
//! the kubelet corrects a pod's status only when its own pod watch shows the difference, and
//! that watch comes back on client-go's back-off (measured 47–87 s after a 60 s outage,
//! docs/real-cluster.md). Taking the mark at its word held warm requests that long in the
//! activator, and made the subsetter move every subset off activators that were serving.
//! A node that really failed is still seen: its Node is NotReady (the subsetter checks it)
//! and its pods stop answering (the activator's connects fail).

use k8s_openapi::api::core::v1::Pod;

/// Ready as its kubelet last reported: the Ready condition is True, or its False is only the
/// node lifecycle controller's mark ([`marked_by_the_node_controller`]).
pub fn ready(pod: &Pod) -> bool {
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    ready || marked_by_the_node_controller(pod)
}

/// Whether the pod's Ready=False is the node lifecycle controller's, not the kubelet's: the
/// condition False while every container the kubelet reported is ready and running.
pub fn marked_by_the_node_controller(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let ready_false = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "False");
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    ready_false
        && !containers.is_empty()
        && containers
            .iter()
            .all(|c| c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod with the Ready condition `ready` and containers ready as `containers` says
    /// (each running), or none reported.
    fn pod(ready: &str, containers: &[bool]) -> Pod {
        let containers: Vec<_> = containers
            .iter()
            .enumerate()
            .map(|(i, r)| {
                serde_json::json!({
                    "name": format!("c{i}"), "image": "x", "imageID": "", "restartCount": 0,
                    "ready": r, "state": {"running": {"startedAt": "2026-11-27T00:00:00Z"}}
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": ready}],
                "containerStatuses": containers,
            }
        }))
        .expect("a pod")
    }

    #[test]
    fn the_node_controllers_mark_is_not_the_kubelets_verdict() {
        assert!(ready(&pod("True", &[true])));
        // MarkPodsNotReady: the Ready condition only; the containers still ready.
        assert!(marked_by_the_node_controller(&pod("False", &[true, true])));
        assert!(ready(&pod("False", &[true, true])));
        // The kubelet: one container failed its readiness probe.
        assert!(!ready(&pod("False", &[true, false])));
        assert!(!marked_by_the_node_controller(&pod("False", &[false])));
        // Nothing known of the containers: the condition stands.
        assert!(!ready(&pod("False", &[])));
        // Unknown is not the controller's mark on pods (it sets False).
        assert!(!ready(&pod("Unknown", &[true])));
    }

    #[test]
    fn a_container_not_running_keeps_the_condition() {
        let mut p = pod("False", &[true]);
        let status = p.status.as_mut().unwrap();
        status.container_statuses.as_mut().unwrap()[0].state = Some(
            serde_json::from_value(serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}}))
                .unwrap(),
        );
        assert!(!ready(&p));
        // No status at all: not ready.
        assert!(!ready(&Pod::default()));
    }
}
