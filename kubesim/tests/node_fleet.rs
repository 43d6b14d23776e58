//! Fleet-level behaviour: many nodes registering at once, lease renewal, configuration
//! checks, and revive in shared-watch mode. Node indices 40..=99 are this file's.

#[path = "node_support/mod.rs"]
mod support;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kubesim::api::{ApiServer, ApiServerConfig};
use kubesim::node::{Fleet, FleetOptions, NodeConfig, NodeError, PodStage, WatchMode};
use support::*;

const NS: &str = "fleet-tests";

async fn server() -> ApiServer {
    init_tracing();
    let server = ApiServer::start(ApiServerConfig::default())
        .await
        .expect("api server");
    ensure_namespace(&server.client(), NS).await;
    server
}

#[tokio::test]
async fn many_nodes_register_ready_with_leases() {
    let server = server().await;
    let client = server.client();
    let fleet = Fleet::start(client.clone(), (40..80).map(NodeConfig::numbered).collect())
        .await
        .unwrap();
    assert_eq!(fleet.len(), 40);
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let ready = nodes
        .items
        .iter()
        .filter(|n| node_condition(n, "Ready").is_some_and(|(s, _)| s == "True"))
        .count();
    assert_eq!(ready, 40);
    let leases = Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(leases.items.len(), 40);
    assert!(fleet.nodes().all(|n| n.is_alive()));
}

#[tokio::test]
async fn leases_are_renewed() {
    let server = server().await;
    let client = server.client();
    let config =
        NodeConfig::numbered(80).with_lease(Duration::from_secs(1), Duration::from_millis(50));
    let _fleet = Fleet::start(client.clone(), vec![config]).await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let first = leases
        .get("node-0080")
        .await
        .unwrap()
        .spec
        .unwrap()
        .renew_time
        .unwrap()
        .0;
    let renewed = wait_for(&leases, "node-0080", move |l: Option<&Lease>| {
        l.and_then(|l| l.spec.as_ref())
            .and_then(|s| s.renew_time.as_ref())
            .is_some_and(|t| t.0 > first)
    })
    .await
    .unwrap();
    assert_eq!(renewed.spec.unwrap().lease_duration_seconds, Some(1));
}

#[tokio::test]
async fn invalid_fleets_are_refused() {
    let server = server().await;
    let client = server.client();
    let dup_name = vec![NodeConfig::new("same", 81), NodeConfig::new("same", 82)];
    assert!(matches!(
        Fleet::start(client.clone(), dup_name).await,
        Err(NodeError::InvalidConfig(_))
    ));
    let dup_index = vec![NodeConfig::new("a", 83), NodeConfig::new("b", 83)];
    assert!(matches!(
        Fleet::start(client.clone(), dup_index).await,
        Err(NodeError::InvalidConfig(_))
    ));
    let too_many_pods = vec![NodeConfig::numbered(84).with_max_pods(254)];
    assert!(matches!(
        Fleet::start(client.clone(), too_many_pods).await,
        Err(NodeError::InvalidConfig(_))
    ));
    let fleet = Fleet::start(client, vec![NodeConfig::numbered(85)])
        .await
        .unwrap();
    assert!(matches!(
        fleet.kill("node-9999").await,
        Err(NodeError::UnknownNode(_))
    ));
}

#[tokio::test]
async fn shared_mode_revive_resyncs_pods_by_list() {
    let server = server().await;
    let client = server.client();
    let options = FleetOptions {
        watch_mode: WatchMode::Shared,
        ..Default::default()
    };
    let fleet = Fleet::start_with(
        client.clone(),
        vec![NodeConfig::numbered(86), NodeConfig::numbered(87)],
        options,
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &pod("resync", "node-0086", None, &[]),
    )
    .await
    .unwrap();
    wait_for(&pods, "resync", is_pod_ready()).await;

    fleet.kill("node-0086").await.unwrap();
    // Created while the node is down: the shared watch delivers it, the dead kubelet ignores it.
    pods.create(
        &PostParams::default(),
        &pod("while-down", "node-0086", None, &[]),
    )
    .await
    .unwrap();
    fleet.revive("node-0086").await.unwrap();

    let node = fleet.node("node-0086").unwrap();
    for name in ["resync", "while-down"] {
        let running = node.wait_pod(NS, name, |p| {
            p.is_some_and(|p| p.stage == PodStage::Running)
        });
        tokio::time::timeout(LIMIT, running).await.unwrap();
        let info = node.pod(NS, name).unwrap();
        let answer = get(&http_client(), info.app_addr.unwrap(), "/")
            .await
            .unwrap();
        assert_eq!(answer.headers["x-pod-name"].to_str().unwrap(), name);
    }
}
