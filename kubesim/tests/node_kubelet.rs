//! Simulated kubelets against kubesim's API server: pods bound to a node start as real HTTP
//! servers, over-capacity pods are rejected, deleted pods are stopped and removed.
//! Node indices 1..=19 are this file's (each test its own, as tests share the process).

#[path = "node_support/mod.rs"]
mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::wait::conditions::is_deleted;
use kube::runtime::watcher::{self, Event};
use kubesim::api::{ApiServer, ApiServerConfig};
use kubesim::node::{
    Delay, Fleet, FleetOptions, NodeConfig, PodStage, StartDelays, WatchMode,
    objects::EXTERNAL_ANNOTATION,
};
use node_agent::client::AgentClient;
use node_agent::protocol::PodUid;
use support::*;

const NS: &str = "node-tests";

async fn server() -> ApiServer {
    init_tracing();
    let server = ApiServer::start(ApiServerConfig::default())
        .await
        .expect("api server");
    ensure_namespace(&server.client(), NS).await;
    server
}

fn pod_addr(pod: &Pod, port: u16) -> SocketAddr {
    let ip: Ipv4Addr = pod
        .status
        .as_ref()
        .unwrap()
        .pod_ip
        .as_ref()
        .expect("podIP")
        .parse()
        .unwrap();
    SocketAddr::from((ip, port))
}

#[tokio::test]
async fn bound_pod_becomes_ready_and_serves_http() {
    let server = server().await;
    let client = server.client();
    let fleet = Fleet::start(
        client.clone(),
        vec![NodeConfig::numbered(1).with_label("zone", "z1")],
    )
    .await
    .unwrap();

    // The Node and its Lease are registered as a kubelet registers them.
    let node = Api::<Node>::all(client.clone())
        .get("node-0001")
        .await
        .unwrap();
    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], "node-0001");
    assert_eq!(labels["node.kubernetes.io/instance-type"], "kubesim");
    assert_eq!(labels["zone"], "z1");
    assert_eq!(
        node_condition(&node, "Ready"),
        Some(("True".into(), Some("KubeletReady".into())))
    );
    let status = node.status.unwrap();
    assert_eq!(status.capacity.unwrap()["pods"].0, "110");
    assert_eq!(status.addresses.unwrap()[0].address, "127.10.1.1");
    let lease = Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .get("node-0001")
        .await
        .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("node-0001")
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &pod("web", "node-0001", Some(9000), &[]),
    )
    .await
    .unwrap();
    let ready = wait_for(&pods, "web", is_pod_ready()).await.unwrap();
    let st = ready.status.clone().unwrap();
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(st.host_ip.as_deref(), Some("127.10.1.1"));
    let addr = pod_addr(&ready, 9000);
    assert_eq!(
        addr.ip().to_string().rsplit_once('.').unwrap().0,
        "127.10.1",
        "pod IP in the node's block"
    );
    assert_ne!(addr.ip(), Ipv4Addr::new(127, 10, 1, 1));
    for c in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        assert_eq!(pod_condition(&ready, c).as_deref(), Some("True"), "{c}");
    }
    let cs = &st.container_statuses.unwrap()[0];
    assert!(cs.ready && cs.started == Some(true));
    assert!(
        cs.state
            .as_ref()
            .unwrap()
            .running
            .as_ref()
            .unwrap()
            .started_at
            .is_some()
    );

    let http = http_client();
    let answer = get(&http, addr, "/hello?x=1").await.unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, "GET /hello?x=1\n");
    assert_eq!(answer.headers["x-node-name"], "node-0001");
    assert_eq!(answer.headers["x-pod-name"], "web");
    assert_eq!(answer.headers["x-pod-namespace"], NS);
    assert_eq!(fleet.app_stats(NS, "web").unwrap().requests(), 1);
    fleet.shutdown();
}

#[tokio::test]
async fn pods_bound_before_the_node_starts_are_started_by_the_first_list() {
    let server = server().await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &pod("early", "node-0002", None, &[]),
    )
    .await
    .unwrap();
    let _fleet = Fleet::start(client.clone(), vec![NodeConfig::numbered(2)])
        .await
        .unwrap();
    let ready = wait_for(&pods, "early", is_pod_ready()).await.unwrap();
    let answer = get(&http_client(), pod_addr(&ready, 8080), "/")
        .await
        .unwrap();
    assert_eq!(answer.headers["x-pod-name"], "early");
}

#[tokio::test]
async fn status_goes_through_container_creating_then_running_then_ready() {
    let server = server().await;
    let client = server.client();
    let delays = StartDelays {
        image_pull: Delay::fixed_ms(150),
        container_start: Delay::Uniform {
            min: Duration::from_millis(10),
            max: Duration::from_millis(50),
        },
        readiness: Delay::fixed_ms(150),
        relist: Delay::ZERO,
    };
    let _fleet = Fleet::start(
        client.clone(),
        vec![NodeConfig::numbered(3).with_delays(delays)],
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let events = watcher::watcher(
        pods.clone(),
        watcher::Config::default().fields("metadata.name=slow"),
    );
    let mut events = std::pin::pin!(events);
    pods.create(&PostParams::default(), &pod("slow", "node-0003", None, &[]))
        .await
        .unwrap();
    let mut seen: Vec<&'static str> = Vec::new();
    tokio::time::timeout(LIMIT, async {
        while let Some(event) = events.next().await {
            let (Event::Apply(p) | Event::InitApply(p)) = event.unwrap() else {
                continue;
            };
            let Some(st) = p.status.as_ref() else {
                continue;
            };
            let waiting = st
                .container_statuses
                .as_ref()
                .and_then(|c| c.first())
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.clone());
            let stage = match (st.phase.as_deref(), pod_condition(&p, "Ready").as_deref()) {
                (Some("Pending"), _) if waiting.as_deref() == Some("ContainerCreating") => {
                    "creating"
                }
                (Some("Running"), Some("False")) => "running",
                (Some("Running"), Some("True")) => "ready",
                _ => continue,
            };
            if seen.last() != Some(&stage) {
                seen.push(stage);
            }
            if stage == "ready" {
                break;
            }
        }
    })
    .await
    .expect("pod became ready");
    assert_eq!(seen, ["creating", "running", "ready"]);
}

#[tokio::test]
async fn pod_over_capacity_fails_with_out_of_pods() {
    let server = server().await;
    let client = server.client();
    let fleet = Fleet::start(
        client.clone(),
        vec![NodeConfig::numbered(4).with_max_pods(2)],
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for name in ["cap-a", "cap-b"] {
        pods.create(&PostParams::default(), &pod(name, "node-0004", None, &[]))
            .await
            .unwrap();
        wait_for(&pods, name, is_pod_ready()).await;
    }
    pods.create(
        &PostParams::default(),
        &pod("cap-c", "node-0004", None, &[]),
    )
    .await
    .unwrap();
    let failed = wait_for(&pods, "cap-c", |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Failed")
    })
    .await
    .unwrap();
    let st = failed.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("OutOfpods"));
    assert_eq!(
        st.message.as_deref(),
        Some(
            "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2"
        )
    );
    assert!(st.pod_ip.is_none());
    assert_eq!(
        fleet
            .node("node-0004")
            .unwrap()
            .pod(NS, "cap-c")
            .unwrap()
            .stage,
        PodStage::Rejected
    );

    // A slot freed by a deletion is usable again.
    pods.delete("cap-a", &DeleteParams::default())
        .await
        .unwrap();
    let uid = pods.get("cap-a").await.ok().and_then(|p| p.metadata.uid);
    if let Some(uid) = uid {
        tokio::time::timeout(
            LIMIT,
            kube::runtime::wait::await_condition(pods.clone(), "cap-a", is_deleted(&uid)),
        )
        .await
        .unwrap()
        .unwrap();
    }
    pods.create(
        &PostParams::default(),
        &pod("cap-d", "node-0004", None, &[]),
    )
    .await
    .unwrap();
    wait_for(&pods, "cap-d", is_pod_ready()).await;
}

#[tokio::test]
async fn deleted_pod_finishes_in_flight_requests_then_disappears() {
    let server = server().await;
    let client = server.client();
    let fleet = Fleet::start(client.clone(), vec![NodeConfig::numbered(5)])
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &pod(
            "doomed",
            "node-0005",
            Some(8081),
            &[("SIM_DELAY_MS", "400")],
        ),
    )
    .await
    .unwrap();
    let ready = wait_for(&pods, "doomed", is_pod_ready()).await.unwrap();
    let uid = ready.metadata.uid.clone().unwrap();
    let addr = pod_addr(&ready, 8081);

    let http = http_client();
    let in_flight = tokio::spawn({
        let http = http.clone();
        async move { get(&http, addr, "/slow").await.map(|a| (a.status, a.body)) }
    });
    let stats = fleet.app_stats(NS, "doomed").unwrap();
    tokio::time::timeout(LIMIT, async {
        while stats.in_flight() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();

    // A plain delete: the server keeps the bound pod (deletionTimestamp, 30 s grace) until
    // the kubelet has stopped it and removes it itself.
    pods.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let (status, body) = in_flight
        .await
        .unwrap()
        .expect("in-flight request finished during the grace period");
    assert_eq!((status, body.as_str()), (200, "GET /slow\n"));
    tokio::time::timeout(
        LIMIT,
        kube::runtime::wait::await_condition(pods.clone(), "doomed", is_deleted(&uid)),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(refused(addr).await, "the app's listener is closed");
    assert!(fleet.node("node-0005").unwrap().pod(NS, "doomed").is_none());
}

#[tokio::test]
async fn external_pods_run_on_the_node_address_without_an_app() {
    let server = server().await;
    let client = server.client();
    let fleet = Fleet::start(client.clone(), vec![NodeConfig::numbered(6)])
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut p = pod("activator-x", "node-0006", Some(8080), &[]);
    p.metadata.annotations = Some([(EXTERNAL_ANNOTATION.to_owned(), "true".to_owned())].into());
    p.spec.as_mut().unwrap().host_network = Some(true);
    pods.create(&PostParams::default(), &p).await.unwrap();
    let ready = wait_for(&pods, "activator-x", is_pod_ready())
        .await
        .unwrap();
    assert_eq!(ready.status.unwrap().pod_ip.as_deref(), Some("127.10.6.1"));
    let info = fleet
        .node("node-0006")
        .unwrap()
        .pod(NS, "activator-x")
        .unwrap();
    assert!(info.external);
    assert!(
        info.app_addr.is_none(),
        "no app is started for an external pod"
    );
}

#[tokio::test]
async fn shared_watch_mode_starts_pods_on_every_node() {
    let server = server().await;
    let client = server.client();
    let configs = (7..10).map(NodeConfig::numbered).collect();
    let options = FleetOptions {
        watch_mode: WatchMode::Shared,
        ..Default::default()
    };
    let fleet = Fleet::start_with(client.clone(), configs, options)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for i in 7..10 {
        pods.create(
            &PostParams::default(),
            &pod(&format!("shared-{i}"), &format!("node-{i:04}"), None, &[]),
        )
        .await
        .unwrap();
    }
    let http = http_client();
    for i in 7..10 {
        let ready = wait_for(&pods, &format!("shared-{i}"), is_pod_ready())
            .await
            .unwrap();
        let answer = get(&http, pod_addr(&ready, 8080), "/").await.unwrap();
        assert_eq!(
            answer.headers["x-node-name"].to_str().unwrap(),
            format!("node-{i:04}")
        );
    }
    assert_eq!(fleet.requests(), 3);
}

/// With a relist period, the kubelet reports a started container only at its node's next
/// relist: no status carries the pod's IP before the one that reports it Running, as on a
/// real node (the IP exists at the sandbox, but reaches the API server with Running).
#[tokio::test]
async fn with_a_relist_period_the_pod_ip_is_reported_only_with_running() {
    let server = server().await;
    let client = server.client();
    let start = Duration::from_millis(50);
    let delays = StartDelays {
        container_start: Delay::Fixed(start),
        relist: Delay::fixed_ms(200),
        ..StartDelays::default()
    };
    let _fleet = Fleet::start(
        client.clone(),
        vec![NodeConfig::numbered(10).with_delays(delays)],
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let events = watcher::watcher(
        pods.clone(),
        watcher::Config::default().fields("metadata.name=relisted"),
    );
    let mut events = std::pin::pin!(events);
    // The kubelet admits the pod after this, so the delay from here is an upper bound on
    // the delay from the admission.
    let created = std::time::Instant::now();
    pods.create(
        &PostParams::default(),
        &pod("relisted", "node-0010", None, &[]),
    )
    .await
    .unwrap();
    // (phase, podIP, Ready) of every status the watch delivered, in order.
    let mut statuses: Vec<(Option<String>, Option<String>, Option<String>)> = Vec::new();
    let first_ip = tokio::time::timeout(LIMIT, async {
        while let Some(event) = events.next().await {
            let (Event::Apply(p) | Event::InitApply(p)) = event.unwrap() else {
                continue;
            };
            let Some(st) = p.status.as_ref() else {
                continue;
            };
            statuses.push((
                st.phase.clone(),
                st.pod_ip.clone(),
                pod_condition(&p, "Ready"),
            ));
            if st.pod_ip.is_some() {
                return created.elapsed();
            }
        }
        panic!("the watch ended");
    })
    .await
    .expect("the pod's IP was reported");
    let (phase, _, _) = statuses.last().unwrap();
    assert_eq!(
        phase.as_deref(),
        Some("Running"),
        "the first status with an IP reports Running: {statuses:?}"
    );
    assert!(
        statuses
            .iter()
            .any(|(phase, ip, _)| phase.as_deref() == Some("Pending") && ip.is_none()),
        "Pending was reported first, without an IP: {statuses:?}"
    );
    assert!(
        first_ip >= start,
        "the IP came {first_ip:?} after the create, before the container could start ({start:?})"
    );
    // No readiness delay: the relist's report is Ready as well.
    assert_eq!(statuses.last().unwrap().2.as_deref(), Some("True"));
}

/// The simulated node agent answers a pod's IP from its admission (its sandbox), long before
/// the kubelet reports it; `none` for a UID it does not run; nothing while its node is dead.
#[tokio::test]
async fn the_node_agent_answers_a_pods_ip_before_the_kubelet_reports_it() {
    let server = server().await;
    let client = server.client();
    // Neither the container start nor the first relist after it can come within the test's
    // few milliseconds: the status cannot have an IP yet when it is read.
    let delays = StartDelays {
        container_start: Delay::fixed_ms(5_000),
        relist: Delay::fixed_ms(5_000),
        ..StartDelays::default()
    };
    let fleet = Fleet::start_with(
        client.clone(),
        vec![NodeConfig::numbered(11).with_delays(delays)],
        FleetOptions {
            node_agents: true,
            ..FleetOptions::default()
        },
    )
    .await
    .unwrap();
    let node = fleet.node("node-0011").unwrap();
    let socket = node
        .agent_socket()
        .expect("the fleet gave the node an agent")
        .to_owned();
    assert!(socket.starts_with(fleet.agent_dir().unwrap()));
    let agent = AgentClient::new(&socket);
    agent
        .ping()
        .await
        .expect("the agent listens once the fleet has started");

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let created = pods
        .create(
            &PostParams::default(),
            &pod("sandboxed", "node-0011", None, &[]),
        )
        .await
        .unwrap();
    let uid = PodUid::new(created.metadata.uid.as_deref().unwrap()).unwrap();
    // What the activator does: ask until the sandbox has an address.
    let ip = tokio::time::timeout(LIMIT, async {
        loop {
            if let Some(ip) = agent.pod_addr(&uid).await.unwrap() {
                return ip;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the agent answered the pod's address");
    let status = pods.get("sandboxed").await.unwrap().status.unwrap();
    assert_eq!(
        (status.phase.as_deref(), status.pod_ip.as_deref()),
        (Some("Pending"), None),
        "the agent answered before the kubelet reported the IP"
    );
    let local = node.pod(NS, "sandboxed").unwrap();
    assert_eq!(
        (local.ip.map(IpAddr::V4), local.stage),
        (Some(ip), PodStage::Starting)
    );
    assert!(local.app_addr.is_none(), "the app is not bound yet");

    let unknown = PodUid::new("00000000-0000-4000-8000-000000000000").unwrap();
    assert_eq!(agent.pod_addr(&unknown).await.unwrap(), None);

    // A dead node's agent answers nothing; a revived one answers again.
    fleet.kill("node-0011").await.unwrap();
    assert!(agent.pod_addr(&uid).await.is_err());
    fleet.revive("node-0011").await.unwrap();
    // Synced: the relist has given the kubelet its pod back.
    node.wait_synced().await;
    assert_eq!(agent.pod_addr(&uid).await.unwrap(), Some(ip));

    // A deleted pod is no longer running: none, as for a UID never seen.
    pods.delete("sandboxed", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::timeout(
        LIMIT,
        node.wait_pod(NS, "sandboxed", |p| {
            p.is_none_or(|p| p.stage == PodStage::Terminating)
        }),
    )
    .await
    .unwrap();
    assert_eq!(agent.pod_addr(&uid).await.unwrap(), None);

    fleet.shutdown();
    assert!(!socket.exists(), "the socket is removed with the fleet");
    assert!(!socket.parent().unwrap().exists(), "and its directory");
}

/// Between the app listening and the node's next relist, the app answers but the API has
/// neither its IP nor Running: what the node agent is for.
#[tokio::test]
async fn the_app_answers_before_the_relist_reports_it() {
    let server = server().await;
    let client = server.client();
    let relist = Delay::fixed_ms(1_000);
    let fleet = Fleet::start(
        client.clone(),
        vec![NodeConfig::numbered(12).with_delays(StartDelays {
            relist,
            ..StartDelays::default()
        })],
    )
    .await
    .unwrap();
    let node = fleet.node("node-0012").unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // Right after a relist, the next one is a whole period away: far longer than this pod
    // takes to be admitted and bound (no start delays).
    node.next_relist().await;
    pods.create(
        &PostParams::default(),
        &pod("unseen", "node-0012", None, &[]),
    )
    .await
    .unwrap();
    tokio::time::timeout(
        LIMIT,
        node.wait_pod(NS, "unseen", |p| p.is_some_and(|p| p.app_addr.is_some())),
    )
    .await
    .unwrap();
    let app = node.pod(NS, "unseen").unwrap().app_addr.unwrap();
    let answer = get(&http_client(), app, "/").await.unwrap();
    assert_eq!(answer.status, 200);
    let status = pods.get("unseen").await.unwrap().status.unwrap();
    assert_eq!(
        (status.phase.as_deref(), status.pod_ip.as_deref()),
        (Some("Pending"), None),
        "the app answers, unreported"
    );

    // The next relist reports it, Ready at once (no readiness delay).
    let ready = wait_for(&pods, "unseen", is_pod_ready()).await.unwrap();
    assert_eq!(
        ready.status.unwrap().pod_ip.as_deref(),
        Some(app.ip().to_string().as_str())
    );
}

/// The node lifecycle controller's unready mark (Ready=False, containers still ready) on a
/// running pod of a live node is written back by its kubelet, as a real kubelet's status
/// manager does; a pod whose containers are not ready (a failing probe) is left as it is.
#[tokio::test]
async fn a_live_kubelet_corrects_the_node_controllers_unready_mark() {
    let server = server().await;
    let client = server.client();
    let fleet = Fleet::start(client.clone(), vec![NodeConfig::numbered(13)])
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for name in ["probed", "marked"] {
        pods.create(&PostParams::default(), &pod(name, "node-0013", None, &[]))
            .await
            .unwrap();
        wait_for(&pods, name, is_pod_ready()).await.unwrap();
    }
    // What a failing readiness probe reports: the container and the pod not ready.
    let mut probed = pods.get("probed").await.unwrap();
    let st = probed.status.as_mut().unwrap();
    for c in st.conditions.iter_mut().flatten() {
        if c.type_ == "Ready" || c.type_ == "ContainersReady" {
            c.status = "False".into();
        }
    }
    for c in st.container_statuses.iter_mut().flatten() {
        c.ready = false;
    }
    pods.replace_status("probed", &PostParams::default(), &probed)
        .await
        .unwrap();
    // What the node lifecycle controller's MarkPodsNotReady writes: Ready alone.
    let mut marked = pods.get("marked").await.unwrap();
    for c in marked
        .status
        .as_mut()
        .unwrap()
        .conditions
        .iter_mut()
        .flatten()
    {
        if c.type_ == "Ready" {
            c.status = "False".into();
        }
    }
    let marked_at = pods
        .replace_status("marked", &PostParams::default(), &marked)
        .await
        .unwrap();
    assert_eq!(pod_condition(&marked_at, "Ready").as_deref(), Some("False"));
    let corrected = wait_for(&pods, "marked", is_pod_ready()).await;
    assert!(corrected.is_some(), "the mark stayed");
    // The kubelet saw the probe's report before the mark (one watch, in order) and left it.
    let probed = pods.get("probed").await.unwrap();
    assert_eq!(pod_condition(&probed, "Ready").as_deref(), Some("False"));
    fleet.shutdown();
}
