//! The walking skeleton end to end: subsetter + one activator per node + kubesim's simulated
//! nodes in this process, real HTTP over loopback addresses. With `KUBECONFIG` set the same
//! tests run against that cluster's API server (the simulated nodes register there).

use std::collections::BTreeSet;
use std::time::Duration;

use crds::ActivationEndpoints;
use crds::contract::REVISION_LABEL;
use futures::StreamExt;
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::{Api, ResourceExt};
use kubesim::node::Delay;
use loadtest::activator_metrics::samples;
use loadtest::demo::{echo_revision, host_of, wait_subsets};
use loadtest::driver::Driver;
use loadtest::{ClusterOptions, SimCluster};

/// Each test's cluster gets its own namespace, so tests sharing one API server (`KUBECONFIG`)
/// never see each other's revisions.
async fn cluster() -> (SimCluster, String) {
    let ns = format!("system-test-{:08x}", rand::random::<u32>());
    let c = SimCluster::start(ClusterOptions {
        nodes: 5,
        start_delay: Delay::fixed_ms(150),
        // 2 of 5: every revision has non-members to forward from.
        default_activators: 2,
        revision_namespace: Some(ns.clone()),
        ..ClusterOptions::default()
    })
    .await
    .expect("cluster starts");
    c.ensure_own_namespace(&ns).await.unwrap();
    (c, ns)
}

/// Creates a revision and returns its subset's member nodes.
async fn revision(c: &SimCluster, ns: &str, name: &str) -> Vec<String> {
    let api: Api<crds::Revision> = Api::namespaced(c.client.clone(), ns);
    api.create(
        &PostParams::default(),
        &echo_revision(name, ns, vec![host_of(name, ns)]),
    )
    .await
    .unwrap();
    wait_subsets_of(c, ns, name).await
}

/// The member nodes of `name`'s subset, once it has some.
async fn wait_subsets_of(c: &SimCluster, ns: &str, name: &str) -> Vec<String> {
    wait_subsets(&c.client, ns, &[name.to_string()], Duration::from_secs(30))
        .await
        .unwrap();
    // The primary first: `[0]` is the member a trickle wakes.
    loadtest::demo::member_nodes(&c.client, ns, name)
        .await
        .unwrap()
}

async fn pods_of(c: &SimCluster, ns: &str, rev: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    api.list(&ListParams::default().labels(&format!("{REVISION_LABEL}={rev}")))
        .await
        .unwrap()
        .items
}

fn entry(c: &SimCluster, node: &str) -> (String, std::net::SocketAddr) {
    c.entries()
        .into_iter()
        .find(|(n, _)| n == node)
        .expect("an activator on every node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_start_then_warm_then_forwarded() {
    let (c, ns) = cluster().await;
    let members = revision(&c, &ns, "hello").await;
    assert_eq!(members.len(), 2, "{members:?}");
    let driver = Driver::new();
    let host = host_of("hello", &ns);

    // Cold: through a member, the app's own 200.
    let (m, addr) = entry(&c, &members[0]);
    let s = driver.get((&m, addr), "hello", &host, "/first").await;
    assert!(s.ok(), "{s:?}");
    assert!(s.cold, "the first request waits for a pod start");
    let pods = pods_of(&c, &ns, "hello").await;
    assert_eq!(pods.len(), 1);
    let node = pods[0].spec.as_ref().unwrap().node_name.clone().unwrap();
    assert!(
        members.contains(&node),
        "pod on {node}, members {members:?}"
    );
    assert_eq!(s.pod.as_deref(), Some(pods[0].name_any().as_str()));

    // Warm: same member, no new pod.
    let s = driver.get((&m, addr), "hello", &host, "/second").await;
    assert!(s.ok() && !s.cold, "{s:?}");
    assert_eq!(pods_of(&c, &ns, "hello").await.len(), 1);

    // A non-member forwards to a member and the answer comes back.
    let outsider = c
        .entries()
        .into_iter()
        .find(|(n, _)| !members.contains(n))
        .expect("5 nodes, 2 members");
    let s = driver
        .get((&outsider.0, outsider.1), "hello", &host, "/via-peer")
        .await;
    assert!(s.ok(), "{s:?}");
    let pods = pods_of(&c, &ns, "hello").await;
    assert!(
        pods.iter()
            .all(|p| members.contains(p.spec.as_ref().unwrap().node_name.as_ref().unwrap())),
        "pods only on members"
    );
    assert!(
        pods.iter()
            .all(|p| p.spec.as_ref().unwrap().node_name.as_deref() != Some(&outsider.0)),
        "the non-member created no pod"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_revision_is_404_by_host_and_by_headers() {
    let (c, ns) = cluster().await;
    let (n, addr) = c.entries()[0].clone();
    let driver = Driver::new();
    let s = driver
        .get((&n, addr), "none", "nobody.example.test", "/")
        .await;
    assert_eq!(s.status, 404, "{s:?}");
    assert!(
        s.error
            .as_deref()
            .unwrap_or("")
            .contains("unknown revision"),
        "{s:?}"
    );

    // Named by the ingress headers, through a raw request.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let req = http::Request::get(format!("http://{addr}/"))
        .header("x-revision-namespace", &ns)
        .header("x-revision-name", "missing")
        .body(http_body_util::Empty::new())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 404);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_requests_on_one_member_create_one_pod() {
    let (c, ns) = cluster().await;
    let members = revision(&c, &ns, "burst").await;
    let (m, addr) = entry(&c, &members[0]);
    let driver = Driver::new();
    let host = host_of("burst", &ns);
    let samples = join_all((0..8).map(|i| {
        let (driver, host, m) = (driver.clone(), host.clone(), m.clone());
        async move {
            driver
                .get((&m, addr), "burst", &host, &format!("/{i}"))
                .await
        }
    }))
    .await;
    for s in &samples {
        assert!(s.ok(), "{s:?}");
    }
    let pods = pods_of(&c, &ns, "burst").await;
    assert_eq!(
        pods.len(),
        1,
        "{:?}",
        pods.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    );
    let answered: BTreeSet<_> = samples.iter().filter_map(|s| s.pod.clone()).collect();
    assert_eq!(answered.len(), 1, "all answered by the one pod");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_request_right_after_the_revision_is_created_succeeds() {
    let (c, ns) = cluster().await;
    let api: Api<crds::Revision> = Api::namespaced(c.client.clone(), &ns);
    api.create(&PostParams::default(), &echo_revision("eager", &ns, vec![]))
        .await
        .unwrap();
    // No waiting for the subset or for any activator's watch: named by the ingress headers.
    let (_, addr) = c.entries()[0].clone();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let req = http::Request::get(format!("http://{addr}/now"))
        .header("x-revision-namespace", &ns)
        .header("x-revision-name", "eager")
        .body(http_body_util::Empty::new())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().contains_key("x-pod-name"));

    // Bad header values are a 400, not a lookup.
    let req = http::Request::get(format!("http://{addr}/"))
        .header("x-revision-namespace", "../etc")
        .header("x-revision-name", "eager")
        .body(http_body_util::Empty::new())
        .unwrap();
    assert_eq!(client.request(req).await.unwrap().status(), 400);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_without_a_max_scale_share_forwards_the_cold_start() {
    let (c, ns) = cluster().await;
    let api: Api<crds::Revision> = Api::namespaced(c.client.clone(), &ns);
    let mut rev = echo_revision("capped", &ns, vec![host_of("capped", &ns)]);
    rev.spec.max_scale = 1;
    // A computed N is capped at maxScale; asked for explicitly, a second member without a
    // share of pods is an entry point that forwards.
    rev.spec.activators = Some(2);
    api.create(&PostParams::default(), &rev).await.unwrap();
    wait_subsets(
        &c.client,
        &ns,
        &["capped".to_string()],
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let aep: Api<ActivationEndpoints> = Api::namespaced(c.client.clone(), &ns);
    let members = aep.get("capped").await.unwrap().status.unwrap().activators;
    assert_eq!(members.len(), 2);
    let shares: u32 = members.iter().map(|m| m.max_pods as u32).sum();
    assert_eq!(shares, 1, "shares sum to maxScale: {members:?}");
    let without = members.iter().find(|m| m.max_pods == 0).unwrap();
    let with = members.iter().find(|m| m.max_pods == 1).unwrap();

    let driver = Driver::new();
    let (n, addr) = entry(&c, &without.node);
    for path in ["/a", "/b"] {
        let s = driver
            .get((&n, addr), "capped", &host_of("capped", &ns), path)
            .await;
        assert!(s.ok(), "{s:?}");
    }
    // Non-members forward only to the member with the share, whichever entry they are.
    for (n, addr) in c.entries() {
        let s = driver
            .get((&n, addr), "capped", &host_of("capped", &ns), "/c")
            .await;
        assert!(s.ok(), "via {n}: {s:?}");
    }
    let pods = pods_of(&c, &ns, "capped").await;
    assert_eq!(pods.len(), 1, "maxScale 1");
    assert_eq!(
        pods[0].spec.as_ref().unwrap().node_name.as_deref(),
        Some(with.node.as_str()),
        "the pod is on the member with the share"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_member_hands_a_waiting_request_to_a_peer() {
    let ns = format!("system-test-{:08x}", rand::random::<u32>());
    let mut c = SimCluster::start(ClusterOptions {
        nodes: 3,
        // Long enough that the activator is told to stop while its pod is still starting.
        start_delay: Delay::fixed_ms(1500),
        default_activators: 2,
        revision_namespace: Some(ns.clone()),
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    c.ensure_own_namespace(&ns).await.unwrap();
    let members = revision(&c, &ns, "drain").await;
    let (first, addr) = entry(&c, &members[0]);
    let driver = Driver::new();
    let host = host_of("drain", &ns);
    let request = tokio::spawn({
        let (driver, first, host) = (driver.clone(), first.clone(), host.clone());
        async move { driver.get((&first, addr), "drain", &host, "/slow").await }
    });

    // Once the member has created its pod (the request is waiting on it), stop the member.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let cfg = kube::runtime::watcher::Config::default()
        .labels(&format!("{REVISION_LABEL}=drain"))
        .fields(&format!("spec.nodeName={first}"));
    let created = kube::runtime::watcher(pods, cfg).applied_objects();
    tokio::time::timeout(Duration::from_secs(30), std::pin::pin!(created).next())
        .await
        .expect("the member creates a pod")
        .unwrap()
        .unwrap();
    assert!(c.stop_activator(&first).await);

    let s = request.await.unwrap();
    assert!(s.ok(), "{s:?}");
    let answered_by = pods_of(&c, &ns, "drain")
        .await
        .into_iter()
        .find(|p| Some(p.name_any()) == s.pod)
        .expect("the answering pod exists");
    assert_eq!(
        answered_by.spec.unwrap().node_name.as_deref(),
        Some(members[1].as_str()),
        "the peer member served the drained request"
    );
    c.shutdown().await;
}

/// A pod the API server refuses (its validation, or an admission policy) fails the request
/// with 502 and a short reason that names no field or policy of the cluster: the API server's
/// words go to the Revision's events and the activator's log, not to an internet client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_api_server_refuses_is_a_502_that_leaks_nothing() {
    let (c, ns) = cluster().await;
    let api: Api<crds::Revision> = Api::namespaced(c.client.clone(), &ns);
    let mut bad = echo_revision("refused", &ns, vec![host_of("refused", &ns)]);
    let mut t = bad.spec.template.value();
    t["spec"]["containers"][0]["name"] = "Not_A_Label".into();
    bad.spec.template = t.into();
    api.create(&PostParams::default(), &bad).await.unwrap();
    let members = wait_subsets_of(&c, &ns, "refused").await;
    let entry = c
        .entries()
        .into_iter()
        .find(|(n, _)| *n == members[0])
        .expect("a member");
    let s = Driver::new()
        .get_named((&entry.0, entry.1), &ns, "refused", "/")
        .await;
    assert_eq!(s.status, 502, "{s:?}");
    let body = s.error.as_deref().unwrap_or("");
    assert!(body.contains("the API server refused its pod"), "{body}");
    assert!(
        !body.contains("Not_A_Label") && !body.contains("spec.containers"),
        "the API server's message reached the client: {body}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_revision_fails_alone() {
    let (c, ns) = cluster().await;
    // The template is schemaless in the CRD, so the API server takes this.
    let api: Api<crds::Revision> = Api::namespaced(c.client.clone(), &ns);
    let mut bad = echo_revision("broken", &ns, vec![host_of("broken", &ns)]);
    bad.spec.template = serde_json::json!({"spec": {"containers": "x"}}).into();
    api.create(&PostParams::default(), &bad).await.unwrap();
    // Revisions created after it still route, cold-start and answer on every activator.
    let members = revision(&c, &ns, "fine").await;
    let driver = Driver::new();
    for (n, addr) in c.entries() {
        let s = driver
            .get((&n, addr), "fine", &host_of("fine", &ns), "/")
            .await;
        assert!(s.ok(), "via {n}: {s:?}");
    }
    assert!(!members.is_empty());
    // The broken one is refused with its reason, wherever it enters. Named by headers: an
    // invalid revision gets no ActivationEndpoints, so no host label, and by Host it is a 404.
    let (n, addr) = c.entries()[0].clone();
    let s = driver.get_named((&n, addr), &ns, "broken", "/").await;
    assert_eq!(s.status, 502, "{s:?}");
    assert!(
        s.error.as_deref().unwrap_or("").contains("spec.template"),
        "{s:?}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_while_requests_wait_is_replaced() {
    let ns = format!("system-test-{:08x}", rand::random::<u32>());
    let c = SimCluster::start(ClusterOptions {
        nodes: 2,
        start_delay: Delay::fixed_ms(1500),
        default_activators: 1,
        revision_namespace: Some(ns.clone()),
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    c.ensure_own_namespace(&ns).await.unwrap();
    let members = revision(&c, &ns, "phoenix").await;
    let (first, addr) = entry(&c, &members[0]);
    let driver = Driver::new();
    let host = host_of("phoenix", &ns);
    let request = tokio::spawn({
        let (driver, first, host) = (driver.clone(), first.clone(), host.clone());
        async move { driver.get((&first, addr), "phoenix", &host, "/").await }
    });

    // Delete the pod as soon as it exists, while the request waits for it to start.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let cfg =
        kube::runtime::watcher::Config::default().labels(&format!("{REVISION_LABEL}=phoenix"));
    let created = kube::runtime::watcher(pods.clone(), cfg).applied_objects();
    let doomed = tokio::time::timeout(Duration::from_secs(30), std::pin::pin!(created).next())
        .await
        .expect("the member creates a pod")
        .unwrap()
        .unwrap();
    pods.delete(&doomed.name_any(), &Default::default())
        .await
        .unwrap();

    let s = request.await.unwrap();
    assert!(s.ok(), "{s:?}");
    // Pod names are deterministic (a replacement made once the deleted pod is gone takes its
    // name): tell them apart by UID.
    let served = pods
        .get(s.pod.as_deref().expect("x-pod-name"))
        .await
        .unwrap();
    assert_ne!(served.uid(), doomed.uid(), "served by a replacement");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_named_by_headers_are_served_from_every_entry() {
    let (c, ns) = cluster().await;
    let members = revision(&c, &ns, "named").await;
    let driver = Driver::new();
    // Every entry, member or not, serves the revision named by the headers.
    for (n, addr) in c.entries() {
        let s = driver.get_named((&n, addr), &ns, "named", "/").await;
        assert!(s.ok(), "via {n}: {s:?}");
    }
    let pods = pods_of(&c, &ns, "named").await;
    assert!(
        !pods.is_empty() && pods.len() <= members.len(),
        "{}",
        pods.len()
    );
    // Unknown revisions are a 404, and so is a Host no revision claims.
    let (n, addr) = c.entries()[0].clone();
    let s = driver.get_named((&n, addr), &ns, "nope", "/").await;
    assert_eq!(s.status, 404, "{s:?}");
    let s = driver
        .get((&n, addr), "nope", "nobody.example.test", "/")
        .await;
    assert_eq!(s.status, 404, "{s:?}");
    c.shutdown().await;
}

/// A real kubelet reports a started pod's IP, Running and Ready together at its next relist,
/// up to a second after the app listens. With the node agent the member learns the IP at the
/// pod's sandbox and its own probe finds the app answering before that report; without it,
/// the kubelet's report gives both. Counted by the activators, not timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_agent_makes_a_cold_start_beat_the_kubelets_report() {
    for node_agent in [true, false] {
        let ns = format!("system-test-{:08x}", rand::random::<u32>());
        let c = SimCluster::start(ClusterOptions {
            nodes: 3,
            start_delay: Delay::fixed_ms(50),
            relist: Delay::fixed_ms(1_000),
            node_agent,
            default_activators: 2,
            revision_namespace: Some(ns.clone()),
            ..ClusterOptions::default()
        })
        .await
        .expect("cluster starts");
        c.ensure_own_namespace(&ns).await.unwrap();
        let members = revision(&c, &ns, "relisted").await;
        let (m, addr) = entry(&c, &members[0]);
        let s = Driver::new()
            .get((&m, addr), "relisted", &host_of("relisted", &ns), "/")
            .await;
        assert!(s.ok() && s.cold, "agent {node_agent}: {s:?}");

        // Summed over the activators: whichever member served, its counters moved.
        let count = |name: &str, label: &str, value: &str| -> u64 {
            c.activators
                .iter()
                .flat_map(|a| samples(a.activator.metrics(), name))
                .filter(|(l, _)| l.get(label).map(String::as_str) == Some(value))
                .map(|(_, n)| n)
                .sum()
        };
        const FIRST: &str = "activator_pod_usable_first_total";
        // What found the pod usable first is counted when the kubelet's Ready arrives, at the
        // node's relist: after the answer when the probe found it first.
        tokio::time::timeout(Duration::from_secs(30), async {
            while count(FIRST, "by", "probe") + count(FIRST, "by", "watch") == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the kubelet's Ready reached the activator");
        const ADDRESS: &str = "activator_pod_address_total";
        let (agent, watch) = (
            count(ADDRESS, "source", "agent"),
            count(ADDRESS, "source", "watch"),
        );
        let (probe, ready) = (count(FIRST, "by", "probe"), count(FIRST, "by", "watch"));
        if node_agent {
            assert!(
                agent >= 1,
                "the agent gave the address: agent {agent}, watch {watch}"
            );
            assert!(
                probe >= 1,
                "the probe came first: probe {probe}, watch {ready}"
            );
        } else {
            assert_eq!(agent, 0, "no agent, no address from it");
            assert!(watch >= 1, "the watch gave the address: {watch}");
            assert_eq!(probe, 0, "nothing to probe before the kubelet's report");
            assert!(ready >= 1, "the kubelet's Ready came first: {ready}");
        }
        c.shutdown().await;
    }
}
