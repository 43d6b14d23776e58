//! One pod per wake-up: every entry sends a revision's requests to the same member first (its
//! primary, `activator::pipeline::primary`), so a trickle through many entries wakes one pod; the other
//! members take requests only when the primary refuses them (here: a burst past its share of
//! maxScale). Real HTTP through kubesim's simulated nodes; with `KUBECONFIG` set, against that
//! API server.

use std::collections::BTreeSet;
use std::time::Duration;

use crds::contract::REVISION_LABEL;
use crds::{ActivationEndpoints, ActivatorMember, Revision};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use kubesim::node::Delay;
use loadtest::demo::{echo_revision, host_of, wait_subsets};
use loadtest::driver::Driver;
use loadtest::{ClusterOptions, SimCluster};

async fn cluster() -> (SimCluster, String) {
    cluster_with(None).await
}

/// [`cluster`], each activator's configuration changed by `configure`.
async fn cluster_with(
    configure: Option<loadtest::cluster::ConfigureActivator>,
) -> (SimCluster, String) {
    let ns = format!("primary-test-{:08x}", rand::random::<u32>());
    let c = SimCluster::start(ClusterOptions {
        nodes: 5,
        start_delay: Delay::fixed_ms(150),
        // 3 of 5: entries that are members but not the primary, and entries that are not
        // members at all.
        default_activators: 3,
        revision_namespace: Some(ns.clone()),
        configure_activator: configure,
        ..ClusterOptions::default()
    })
    .await
    .expect("cluster starts");
    c.ensure_own_namespace(&ns).await.unwrap();
    (c, ns)
}

/// Creates `rev` and returns its subset's members.
async fn create(c: &SimCluster, ns: &str, rev: &Revision) -> Vec<ActivatorMember> {
    let name = rev.name_any();
    Api::<Revision>::namespaced(c.client.clone(), ns)
        .create(&PostParams::default(), rev)
        .await
        .unwrap();
    wait_subsets(
        &c.client,
        ns,
        std::slice::from_ref(&name),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    Api::<ActivationEndpoints>::namespaced(c.client.clone(), ns)
        .get(&name)
        .await
        .unwrap()
        .status
        .unwrap()
        .activators
}

async fn pods_of(c: &SimCluster, ns: &str, rev: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default().labels(&format!("{REVISION_LABEL}={rev}")))
        .await
        .unwrap()
        .items
}

fn node_of(p: &Pod) -> String {
    p.spec.as_ref().unwrap().node_name.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_through_every_entry_wakes_one_pod_on_the_primary() {
    let (c, ns) = cluster().await;
    let members = create(
        &c,
        &ns,
        &echo_revision("trickle", &ns, vec![host_of("trickle", &ns)]),
    )
    .await;
    assert_eq!(members.len(), 3, "{members:?}");
    let key = activator::pipeline::routing::RevisionKey::new(&ns, "trickle");
    let primary = activator::pipeline::primary::ranked(&key, members.clone())[0]
        .node
        .clone();
    let driver = Driver::new();
    let host = host_of("trickle", &ns);
    let entries = c.entries();
    assert_eq!(entries.len(), 5);

    // The first requests of a sleeping revision, one through every entry at once: members
    // and non-members alike send them to the primary.
    let burst = join_all(entries.iter().map(|(n, a)| {
        let (driver, host) = (driver.clone(), host.clone());
        async move { driver.get((n, *a), "trickle", &host, "/wake").await }
    }))
    .await;
    // Then a trickle, one at a time, through each entry again.
    let mut trickle = Vec::new();
    for (n, a) in &entries {
        trickle.push(driver.get((n, *a), "trickle", &host, "/again").await);
    }
    for s in burst.iter().chain(&trickle) {
        assert!(s.ok(), "{s:?}");
    }
    let pods = pods_of(&c, &ns, "trickle").await;
    assert_eq!(
        pods.iter()
            .map(|p| (p.name_any(), node_of(p)))
            .collect::<Vec<_>>()
            .len(),
        1,
        "one pod for one wake-up: {:?}",
        pods.iter()
            .map(|p| (p.name_any(), node_of(p)))
            .collect::<Vec<_>>()
    );
    assert_eq!(node_of(&pods[0]), primary, "on the primary");
    let answered: BTreeSet<_> = burst
        .iter()
        .chain(&trickle)
        .filter_map(|s| s.pod.clone())
        .collect();
    assert_eq!(answered.len(), 1, "every request answered by the one pod");
    // After the first pod answered, nothing waited for a cold start.
    assert!(trickle.iter().all(|s| !s.cold), "{trickle:?}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_past_the_primarys_share_spills_to_the_other_members() {
    let (c, ns) = cluster().await;
    // One request at a time per pod, at most 3 pods: a share of 1 pod per member. Each
    // request holds its pod for a while, so the burst needs all three.
    let mut rev = echo_revision("spill", &ns, vec![host_of("spill", &ns)]);
    rev.spec.container_concurrency = 1;
    rev.spec.max_scale = 3;
    let mut t = rev.spec.template.value();
    t["spec"]["containers"][0]["env"] =
        serde_json::json!([{"name": "SIM_DELAY_MS", "value": "1500"}]);
    rev.spec.template = t.into();
    let members = create(&c, &ns, &rev).await;
    assert_eq!(members.len(), 3, "{members:?}");
    assert!(members.iter().all(|m| m.max_pods == 1), "{members:?}");
    let key = activator::pipeline::routing::RevisionKey::new(&ns, "spill");
    let ranked = activator::pipeline::primary::ranked(&key, members.clone());
    let outsider = outsider(&c, &members);
    let driver = Driver::new();
    let host = host_of("spill", &ns);
    let samples = join_all((0..3).map(|i| {
        let (driver, host, (n, a)) = (driver.clone(), host.clone(), outsider.clone());
        async move { driver.get((&n, a), "spill", &host, &format!("/{i}")).await }
    }))
    .await;
    for s in &samples {
        assert!(s.ok(), "{s:?}");
    }
    let pods = pods_of(&c, &ns, "spill").await;
    let nodes: BTreeSet<String> = pods.iter().map(node_of).collect();
    assert_eq!(pods.len(), 3, "one pod per member: {nodes:?}");
    assert_eq!(
        nodes,
        ranked
            .iter()
            .map(|m| m.node.clone())
            .collect::<BTreeSet<_>>(),
        "the burst spilled over all three members"
    );
    let answered: BTreeSet<_> = samples.iter().filter_map(|s| s.pod.clone()).collect();
    assert_eq!(
        answered.len(),
        3,
        "each request on its own pod: {samples:?}"
    );
    c.shutdown().await;
}

/// A primary whose pods refuse connections while its activator still answers (a node dying:
/// its apps gone first; a crashed app container) sends a forwarded request back with a 503,
/// so the entry tries the next member: the request never reached an app. With a 502 it ended
/// there, failed, though another member could serve it (the node-failure scenario's
/// "failed, not in flight on the killed node"). No connect retry here, so the first refused
/// connection is the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_whose_pods_refuse_hands_a_forwarded_request_to_the_next_member() {
    let (c, ns) = cluster_with(Some(std::sync::Arc::new(|cfg| cfg.connect_retries = 0))).await;
    let rev = echo_revision("refused", &ns, vec![host_of("refused", &ns)]);
    let members = create(&c, &ns, &rev).await;
    let key = activator::pipeline::routing::RevisionKey::new(&ns, "refused");
    let primary = activator::pipeline::primary::ranked(&key, members.clone())[0]
        .node
        .clone();
    let outsider = outsider(&c, &members);
    let driver = Driver::new();
    let host = host_of("refused", &ns);
    let (n, a) = (&outsider.0, outsider.1);
    let warm = driver.get((n, a), "refused", &host, "/warm").await;
    assert!(warm.ok(), "{warm:?}");
    let pods = pods_of(&c, &ns, "refused").await;
    assert_eq!(
        pods.iter().map(node_of).collect::<Vec<_>>(),
        vec![primary.clone()],
        "warm on its primary"
    );
    // The primary's apps refuse from now on; its activator still answers.
    c.fleet.kill(&primary).await.unwrap();
    let s = driver.get((n, a), "refused", &host, "/after").await;
    assert!(s.ok(), "served by another member: {s:?}");
    let on: Vec<String> = pods_of(&c, &ns, "refused")
        .await
        .iter()
        .map(node_of)
        .filter(|node| *node != primary)
        .collect();
    assert!(!on.is_empty(), "a pod started on another member");
    c.shutdown().await;
}

/// An entry on a node that is none of `members` (the clusters here have 5 nodes, 3 members).
fn outsider(c: &SimCluster, members: &[ActivatorMember]) -> (String, std::net::SocketAddr) {
    c.entries()
        .into_iter()
        .find(|(n, _)| !members.iter().any(|m| &m.node == n))
        .expect("5 nodes, 3 members")
}
