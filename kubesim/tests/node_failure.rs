//! Failure injection: a killed node stops renewing its lease, the lifecycle controller marks
//! it Unknown and taints it, its apps stop answering; a revived node comes back Ready.
//! Node indices 20..=39 are this file's.

#[path = "node_support/mod.rs"]
mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::wait::conditions::is_deleted;
use kubesim::api::{ApiServer, ApiServerConfig};
use kubesim::node::lifecycle::{UNKNOWN_MESSAGE, UNREACHABLE_TAINT};
use kubesim::node::{Fleet, KillMode, NodeConfig, NodeLifecycleController, PodStage};
use support::*;

const NS: &str = "failure-tests";
/// Short lease settings so a dead node is noticed within a second or so.
const GRACE: Duration = Duration::from_millis(800);

fn fast_node(index: usize) -> NodeConfig {
    NodeConfig::numbered(index).with_lease(Duration::from_secs(1), Duration::from_millis(100))
}

async fn cluster(nodes: Vec<NodeConfig>) -> (ApiServer, Fleet, NodeLifecycleController) {
    init_tracing();
    let server = ApiServer::start(ApiServerConfig::default())
        .await
        .expect("api server");
    let client = server.client();
    ensure_namespace(&client, NS).await;
    let fleet = Fleet::start(client.clone(), nodes).await.unwrap();
    let controller = NodeLifecycleController::start(client, GRACE);
    (server, fleet, controller)
}

fn pod_addr(pod: &Pod) -> SocketAddr {
    let ip: Ipv4Addr = pod
        .status
        .as_ref()
        .unwrap()
        .pod_ip
        .as_ref()
        .unwrap()
        .parse()
        .unwrap();
    SocketAddr::from((ip, 8080))
}

fn ready_is(status: &'static str) -> impl Fn(Option<&Node>) -> bool {
    move |n: Option<&Node>| {
        n.and_then(|n| node_condition(n, "Ready"))
            .is_some_and(|(s, _)| s == status)
    }
}

#[tokio::test]
async fn killed_node_turns_unknown_and_revive_brings_it_back() {
    let (server, fleet, _controller) = cluster(vec![fast_node(20), fast_node(21)]).await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let nodes: Api<Node> = Api::all(client.clone());
    pods.create(
        &PostParams::default(),
        &pod("victim", "node-0020", None, &[]),
    )
    .await
    .unwrap();
    let ready = wait_for(&pods, "victim", is_pod_ready()).await.unwrap();
    let addr = pod_addr(&ready);
    let http = http_client();
    assert_eq!(get(&http, addr, "/").await.unwrap().status, 200);

    fleet.kill("node-0020").await.unwrap();
    assert!(
        refused(addr).await,
        "a killed node's app refuses connections"
    );
    assert!(!fleet.node("node-0020").unwrap().is_alive());

    let unknown = wait_for(&nodes, "node-0020", ready_is("Unknown"))
        .await
        .unwrap();
    let ready_cond = unknown
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready_cond.reason.as_deref(), Some("NodeStatusUnknown"));
    assert_eq!(ready_cond.message.as_deref(), Some(UNKNOWN_MESSAGE));
    for other in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert_eq!(
            node_condition(&unknown, other).unwrap().0,
            "Unknown",
            "{other}"
        );
    }
    let tainted = wait_for(&nodes, "node-0020", |n: Option<&Node>| {
        n.is_some_and(|n| has_taint(n, UNREACHABLE_TAINT, "NoExecute"))
    })
    .await
    .unwrap();
    assert!(has_taint(&tainted, UNREACHABLE_TAINT, "NoSchedule"));
    // Its pods are marked NotReady, so routing by readiness stops using them.
    wait_for(&pods, "victim", |p: Option<&Pod>| {
        p.is_some_and(|p| pod_condition(p, "Ready").as_deref() == Some("False"))
    })
    .await;
    // The other node keeps renewing and stays Ready.
    let healthy = nodes.get("node-0021").await.unwrap();
    assert_eq!(node_condition(&healthy, "Ready").unwrap().0, "True");

    fleet.revive("node-0020").await.unwrap();
    wait_for(&nodes, "node-0020", |n: Option<&Node>| {
        n.is_some_and(|n| {
            node_condition(n, "Ready").is_some_and(|(s, _)| s == "True")
                && !has_taint(n, UNREACHABLE_TAINT, "NoExecute")
        })
    })
    .await;
    let back = wait_for(&pods, "victim", is_pod_ready()).await.unwrap();
    assert_eq!(pod_addr(&back), addr, "the pod keeps its address");
    let answer = get(&http_client(), addr, "/again").await.unwrap();
    assert_eq!((answer.status, answer.body.as_str()), (200, "GET /again\n"));
}

#[tokio::test]
async fn black_holed_node_accepts_but_never_answers() {
    let (server, fleet, _controller) = cluster(vec![fast_node(22)]).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    pods.create(&PostParams::default(), &pod("hole", "node-0022", None, &[]))
        .await
        .unwrap();
    let addr = pod_addr(&wait_for(&pods, "hole", is_pod_ready()).await.unwrap());

    fleet
        .kill_with("node-0022", KillMode::BlackHole)
        .await
        .unwrap();
    assert!(!refused(addr).await, "connections are still accepted");
    let silent =
        tokio::time::timeout(Duration::from_millis(500), get(&http_client(), addr, "/")).await;
    assert!(silent.is_err(), "a black-holed app answered");

    fleet.revive("node-0022").await.unwrap();
    wait_for(&pods, "hole", is_pod_ready()).await;
    // Ready may still show from before the kill; wait for the kubelet to have restarted the app.
    let node = fleet.node("node-0022").unwrap();
    let running = node.wait_pod(NS, "hole", |p| {
        p.is_some_and(|p| p.stage == PodStage::Running)
    });
    tokio::time::timeout(LIMIT, running).await.unwrap();
    assert_eq!(get(&http_client(), addr, "/").await.unwrap().status, 200);
}

#[tokio::test]
async fn pod_deleted_while_its_node_is_down_is_removed_after_revive() {
    let (server, fleet, _controller) = cluster(vec![fast_node(23)]).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), NS);
    pods.create(
        &PostParams::default(),
        &pod("orphan", "node-0023", None, &[]),
    )
    .await
    .unwrap();
    let uid = wait_for(&pods, "orphan", is_pod_ready())
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();

    fleet.kill("node-0023").await.unwrap();
    pods.delete("orphan", &DeleteParams::default())
        .await
        .unwrap();
    // Nobody removes it while its kubelet is down: it stays, marked for deletion.
    let marked = pods.get("orphan").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());

    fleet.revive("node-0023").await.unwrap();
    tokio::time::timeout(
        LIMIT,
        kube::runtime::wait::await_condition(pods.clone(), "orphan", is_deleted(&uid)),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(fleet.node("node-0023").unwrap().pod(NS, "orphan").is_none());
}

/// A new Node is admitted with `not-ready:NoSchedule` (TaintNodesByCondition), which the
/// lifecycle controller takes off once the node reports Ready; a Node nobody reports for
/// keeps it; taints the creator set stay.
#[tokio::test]
async fn new_nodes_are_tainted_not_ready_until_they_report_ready() {
    use kubesim::node::lifecycle::NOT_READY_TAINT;
    let (server, _fleet, _controller) = cluster(vec![fast_node(30)]).await;
    let nodes: Api<Node> = Api::all(server.client());

    // Created by hand, with a taint of its own, and never reported Ready.
    let bare: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "bare"},
        "spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]},
    }))
    .unwrap();
    let created = nodes.create(&PostParams::default(), &bare).await.unwrap();
    assert!(has_taint(&created, NOT_READY_TAINT, "NoSchedule"));
    assert!(has_taint(&created, "dedicated", "NoSchedule"));

    // The simulated kubelet's node reports Ready: the taint comes off.
    let ready = wait_for(&nodes, "node-0030", |n: Option<&Node>| {
        n.is_some_and(|n| {
            node_condition(n, "Ready").is_some_and(|(s, _)| s == "True")
                && !has_taint(n, NOT_READY_TAINT, "NoSchedule")
        })
    })
    .await
    .unwrap();
    assert!(!has_taint(&ready, UNREACHABLE_TAINT, "NoSchedule"));

    // The bare node never reports: once it is stale the controller marks it Unknown and
    // swaps not-ready for the unreachable taints, keeping its own.
    let unknown = wait_for(&nodes, "bare", |n: Option<&Node>| {
        n.is_some_and(|n| has_taint(n, UNREACHABLE_TAINT, "NoSchedule"))
    })
    .await
    .unwrap();
    assert!(!has_taint(&unknown, NOT_READY_TAINT, "NoSchedule"));
    assert!(has_taint(&unknown, "dedicated", "NoSchedule"));
    assert_eq!(node_condition(&unknown, "Ready").unwrap().0, "Unknown");
}
