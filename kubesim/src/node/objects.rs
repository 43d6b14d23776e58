//! The Kubernetes objects a kubelet writes (Node, Lease, pod status), built as the real
//! kubelet builds them. Pure functions, so the shapes are unit-tested without a server.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, DaemonEndpoint, HostIP, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints,
    NodeSpec, NodeStatus, NodeSystemInfo, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::config::NodeConfig;

pub const LEASE_NAMESPACE: &str = "kube-node-lease";
pub const KUBELET_VERSION: &str = "v1.33.0-kubesim";
pub const KUBELET_PORT: i32 = 10250;
/// Pods the test harness runs itself (activators): admitted and reported Running with the
/// node's address, but no app is started for them.
pub const EXTERNAL_ANNOTATION: &str = "kubesim.local-activator.dev/external";

pub fn now() -> Time {
    Time(Timestamp::now())
}

/// Kubernetes `Time` has whole seconds on the wire; the kubelet's own clock does not, and
/// comparing the two is easier when both are truncated.
fn truncate(t: &Time) -> Time {
    Time(Timestamp::from_second(t.0.as_second()).unwrap_or(t.0))
}

fn quantity(s: &str) -> Quantity {
    Quantity(s.to_owned())
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

pub fn node_labels(config: &NodeConfig) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", config.name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", arch()),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", arch()),
        ("node.kubernetes.io/instance-type", "kubesim"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    labels.extend(config.labels.clone());
    labels
}

/// The Node as registered (create); status is posted separately, as the kubelet does.
pub fn node(config: &NodeConfig) -> Node {
    let ip = config.ip().octets();
    let cidr = format!("{}.{}.{}.0/24", ip[0], ip[1], ip[2]);
    Node {
        metadata: ObjectMeta {
            name: Some(config.name.clone()),
            labels: Some(node_labels(config)),
            annotations: Some(BTreeMap::from([(
                "node.alpha.kubernetes.io/ttl".to_owned(),
                "0".to_owned(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some(cidr.clone()),
            pod_cidrs: Some(vec![cidr]),
            taints: (!config.taints.is_empty()).then(|| config.taints.clone()),
            ..Default::default()
        }),
        status: None,
    }
}

/// Full node status with every condition healthy; `ready_since` is the Ready condition's
/// lastTransitionTime, `heartbeat` its lastHeartbeatTime.
pub fn node_status(
    config: &NodeConfig,
    boot_id: &str,
    ready_since: &Time,
    heartbeat: &Time,
) -> NodeStatus {
    let resources = BTreeMap::from([
        ("cpu".to_owned(), quantity(&config.cpu)),
        ("memory".to_owned(), quantity(&config.memory)),
        ("ephemeral-storage".to_owned(), quantity("100Gi")),
        ("pods".to_owned(), quantity(&config.max_pods.to_string())),
    ]);
    let cond = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_heartbeat_time: Some(truncate(heartbeat)),
        last_transition_time: Some(truncate(ready_since)),
    };
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: config.ip().to_string(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: config.name.clone(),
            },
        ]),
        conditions: Some(vec![
            cond(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            cond(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
            ),
            cond(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            cond(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
            ),
        ]),
        images: (!config.images.is_empty()).then(|| config.images.clone()),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: KUBELET_PORT }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: arch().into(),
            boot_id: boot_id.to_owned(),
            container_runtime_version: "kubesim://0.1.0".into(),
            kernel_version: "kubesim".into(),
            kube_proxy_version: String::new(),
            kubelet_version: KUBELET_VERSION.into(),
            machine_id: format!("kubesim-{}", config.name),
            operating_system: "linux".into(),
            os_image: "kubesim simulated node".into(),
            system_uuid: format!("kubesim-{}", config.name),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn status_patch<T: serde::Serialize>(status: &T) -> Value {
    json!({ "status": status })
}

pub fn lease(config: &NodeConfig, node_uid: Option<&str>, renew: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(config.name.clone()),
            namespace: Some(LEASE_NAMESPACE.to_owned()),
            owner_references: node_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: config.name.clone(),
                    uid: uid.to_owned(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(config.name.clone()),
            lease_duration_seconds: Some(config.lease_duration.as_secs().max(1) as i32),
            renew_time: Some(MicroTime(renew)),
            ..Default::default()
        }),
    }
}

pub fn is_external(pod: &Pod) -> bool {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXTERNAL_ANNOTATION))
        .is_some_and(|v| v == "true");
    host_network && annotated
}

pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The kubelet's admission rejection (`lifecycle/predicate.go`) for a full node.
pub fn out_of_pods_status(used: usize, capacity: u32) -> PodStatus {
    PodStatus {
        phase: Some("Failed".into()),
        reason: Some("OutOfpods".into()),
        message: Some(format!(
            "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: {used}, capacity: {capacity}"
        )),
        ..Default::default()
    }
}

/// Where a pod's containers are, as the status reports them.
#[derive(Clone, Debug)]
pub enum ContainersPhase {
    Creating,
    Running { started_at: Time, ready: bool },
    Terminated { started_at: Time, finished_at: Time },
}

/// Times and addresses a pod's status is built from.
#[derive(Clone, Debug)]
pub struct PodTimes {
    /// When the kubelet admitted the pod: startTime, PodScheduled and Initialized.
    pub admitted: Time,
    /// Last change of the Ready condition.
    pub ready_changed: Time,
}

pub fn pod_status(
    pod: &Pod,
    host_ip: Ipv4Addr,
    pod_ip: Option<Ipv4Addr>,
    times: &PodTimes,
    containers: &ContainersPhase,
) -> PodStatus {
    let names: Vec<(String, String)> = pod
        .spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let ready = matches!(containers, ContainersPhase::Running { ready: true, .. });
    let (phase, not_ready_reason) = match containers {
        ContainersPhase::Creating => ("Pending", "ContainersNotReady"),
        ContainersPhase::Running { .. } => ("Running", "ContainersNotReady"),
        ContainersPhase::Terminated { .. } => ("Succeeded", "PodCompleted"),
    };
    let unready_names = names
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let cond = |type_: &str, ok: bool, at: &Time, reason: Option<&str>| PodCondition {
        type_: type_.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        last_transition_time: Some(truncate(at)),
        reason: reason.map(str::to_owned),
        message: (!ok && reason == Some("ContainersNotReady"))
            .then(|| format!("containers with unready status: [{unready_names}]")),
        ..Default::default()
    };
    let ready_reason = (!ready).then_some(not_ready_reason);
    let conditions = vec![
        cond("PodReadyToStartContainers", true, &times.admitted, None),
        cond("Initialized", true, &times.admitted, None),
        cond("Ready", ready, &times.ready_changed, ready_reason),
        cond("ContainersReady", ready, &times.ready_changed, ready_reason),
        cond("PodScheduled", true, &times.admitted, None),
    ];
    let container_statuses = names
        .iter()
        .map(|(name, image)| {
            let (state, started) = match containers {
                ContainersPhase::Creating => (
                    ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some("ContainerCreating".into()),
                            message: None,
                        }),
                        ..Default::default()
                    },
                    false,
                ),
                ContainersPhase::Running { started_at, .. } => (
                    ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: Some(truncate(started_at)),
                        }),
                        ..Default::default()
                    },
                    true,
                ),
                ContainersPhase::Terminated {
                    started_at,
                    finished_at,
                } => (
                    ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: 0,
                            reason: Some("Completed".into()),
                            started_at: Some(truncate(started_at)),
                            finished_at: Some(truncate(finished_at)),
                            container_id: Some(format!("kubesim://{uid}/{name}")),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    false,
                ),
            };
            let running = !matches!(containers, ContainersPhase::Creating);
            ContainerStatus {
                name: name.clone(),
                image: image.clone(),
                image_id: if running {
                    format!("kubesim://{image}")
                } else {
                    String::new()
                },
                container_id: running.then(|| format!("kubesim://{uid}/{name}")),
                ready,
                started: Some(started),
                restart_count: 0,
                state: Some(state),
                ..Default::default()
            }
        })
        .collect();
    let host = host_ip.to_string();
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        container_statuses: Some(container_statuses),
        host_ip: Some(host.clone()),
        host_ips: Some(vec![HostIP { ip: host }]),
        pod_ip: pod_ip.map(|ip| ip.to_string()),
        pod_ips: pod_ip.map(|ip| vec![PodIP { ip: ip.to_string() }]),
        start_time: Some(truncate(&times.admitted)),
        qos_class: Some("BestEffort".into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("img:1".into()),
                    ..Default::default()
                }],
                node_name: Some("node-0000".into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn node_and_status_shape() {
        let config = NodeConfig::numbered(3)
            .with_label("zone", "a")
            .with_max_pods(50)
            .with_image(["registry:5000/app:v1"], 1000);
        let n = serde_json::to_value(node(&config)).unwrap();
        assert_eq!(
            n["metadata"]["labels"]["kubernetes.io/hostname"],
            "node-0003"
        );
        assert_eq!(
            n["metadata"]["labels"]["node.kubernetes.io/instance-type"],
            "kubesim"
        );
        assert_eq!(n["metadata"]["labels"]["zone"], "a");
        assert_eq!(n["spec"]["podCIDR"], "127.10.3.0/24");
        assert!(n["spec"].get("taints").is_none());
        let t = now();
        let s = serde_json::to_value(node_status(&config, "boot", &t, &t)).unwrap();
        assert_eq!(s["capacity"]["pods"], "50");
        assert_eq!(s["allocatable"]["pods"], "50");
        assert_eq!(
            s["images"],
            json!([{"names": ["registry:5000/app:v1"], "sizeBytes": 1000}])
        );
        let bare = NodeConfig::numbered(4);
        let bare_status = serde_json::to_value(node_status(&bare, "boot", &t, &t)).unwrap();
        assert!(
            bare_status.get("images").is_none(),
            "no images configured: none reported"
        );
        assert_eq!(
            s["addresses"][0],
            json!({"type": "InternalIP", "address": "127.10.3.1"})
        );
        let ready = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], "True");
        assert_eq!(ready["reason"], "KubeletReady");
        assert_eq!(s["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
        assert_eq!(s["nodeInfo"]["kubeletVersion"], KUBELET_VERSION);
    }

    #[test]
    fn lease_renew_time_is_micro_time() {
        let config = NodeConfig::numbered(0);
        let ts: Timestamp = "2026-01-02T03:04:05.123Z".parse().unwrap();
        let l = serde_json::to_value(lease(&config, Some("uid-1"), ts)).unwrap();
        assert_eq!(l["spec"]["renewTime"], "2026-01-02T03:04:05.123000Z");
        assert_eq!(l["spec"]["holderIdentity"], "node-0000");
        assert_eq!(l["spec"]["leaseDurationSeconds"], 40);
        assert_eq!(l["metadata"]["namespace"], LEASE_NAMESPACE);
        assert_eq!(l["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(l["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    }

    #[test]
    fn running_ready_status() {
        let t = now();
        let times = PodTimes {
            admitted: t.clone(),
            ready_changed: t.clone(),
        };
        let phase = ContainersPhase::Running {
            started_at: t,
            ready: true,
        };
        let ip = Ipv4Addr::new(127, 10, 0, 2);
        let s = serde_json::to_value(pod_status(
            &pod(),
            Ipv4Addr::new(127, 10, 0, 1),
            Some(ip),
            &times,
            &phase,
        ))
        .unwrap();
        assert_eq!(s["phase"], "Running");
        assert_eq!(s["podIP"], "127.10.0.2");
        assert_eq!(s["podIPs"], json!([{"ip": "127.10.0.2"}]));
        assert_eq!(s["hostIP"], "127.10.0.1");
        for c in s["conditions"].as_array().unwrap() {
            assert_eq!(c["status"], "True", "{c}");
            assert!(c["lastTransitionTime"].as_str().unwrap().ends_with('Z'));
        }
        let cs = &s["containerStatuses"][0];
        assert_eq!(cs["name"], "app");
        assert_eq!(cs["image"], "img:1");
        assert_eq!(cs["ready"], true);
        assert_eq!(cs["started"], true);
        assert_eq!(cs["restartCount"], 0);
        assert!(cs["state"]["running"]["startedAt"].is_string());
    }

    #[test]
    fn creating_status_is_pending_and_not_ready() {
        let t = now();
        let times = PodTimes {
            admitted: t.clone(),
            ready_changed: t,
        };
        let s = serde_json::to_value(pod_status(
            &pod(),
            Ipv4Addr::new(127, 10, 0, 1),
            None,
            &times,
            &ContainersPhase::Creating,
        ))
        .unwrap();
        assert_eq!(s["phase"], "Pending");
        assert!(s.get("podIP").is_none());
        let ready = s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(ready["status"], "False");
        assert_eq!(ready["reason"], "ContainersNotReady");
        assert_eq!(ready["message"], "containers with unready status: [app]");
        assert_eq!(
            s["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ContainerCreating"
        );
        assert_eq!(s["containerStatuses"][0]["ready"], false);
    }

    #[test]
    fn out_of_pods_message_matches_kubelet() {
        let s = serde_json::to_value(out_of_pods_status(110, 110)).unwrap();
        assert_eq!(s["phase"], "Failed");
        assert_eq!(s["reason"], "OutOfpods");
        assert_eq!(
            s["message"],
            "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 110, capacity: 110"
        );
    }

    #[test]
    fn external_needs_host_network_and_annotation() {
        let mut p = pod();
        assert!(!is_external(&p));
        p.metadata.annotations = Some(BTreeMap::from([(
            EXTERNAL_ANNOTATION.to_owned(),
            "true".to_owned(),
        )]));
        assert!(!is_external(&p));
        p.spec.as_mut().unwrap().host_network = Some(true);
        assert!(is_external(&p));
    }
}
