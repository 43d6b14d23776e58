//! The scale-to-zero lifecycle on the node, end to end on kubesim (or a real API server with
//! `KUBECONFIG`): buffering a burst, throttling by containerConcurrency, scaling out within
//! maxScale shares, going back to zero, a full node, draining under load, Host lookups.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use activator::ops::metrics::{PodReason, ReasonLabel};
use crds::contract::REVISION_LABEL;
use futures::StreamExt;
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use kubesim::node::Delay;
use loadtest::activator_metrics::samples;
use loadtest::demo::{echo_revision, host_of, member_nodes, wait_subsets};
use loadtest::driver::{Driver, Sample};
use loadtest::{ClusterOptions, SimCluster};

/// Upper bound on any wait for the cluster to reach a state (a hang detector, not a timing).
const LIMIT: Duration = Duration::from_secs(60);

async fn cluster_with(opts: ClusterOptions) -> (SimCluster, String) {
    let ns = format!("lifecycle-{:08x}", rand::random::<u32>());
    let c = SimCluster::start(ClusterOptions {
        revision_namespace: Some(ns.clone()),
        ..opts
    })
    .await
    .expect("cluster starts");
    c.ensure_own_namespace(&ns).await.unwrap();
    (c, ns)
}

fn options() -> ClusterOptions {
    ClusterOptions {
        nodes: 5,
        start_delay: Delay::fixed_ms(150),
        default_activators: 2,
        configure_activator: Some(Arc::new(|cfg| {
            cfg.pool.scale_in_window = Duration::from_millis(500);
            cfg.host_ttl = Duration::from_millis(200);
        })),
        ..ClusterOptions::default()
    }
}

/// Creates a revision shaped by `f` and returns its subset's member nodes.
async fn revision(
    c: &SimCluster,
    ns: &str,
    name: &str,
    f: impl FnOnce(&mut crds::Revision),
) -> Vec<String> {
    let mut rev = echo_revision(name, ns, vec![host_of(name, ns)]);
    f(&mut rev);
    let api: Api<crds::Revision> = Api::namespaced(c.client.clone(), ns);
    api.create(&PostParams::default(), &rev).await.unwrap();
    wait_subsets(&c.client, ns, &[name.to_string()], LIMIT)
        .await
        .unwrap();
    member_nodes(&c.client, ns, name).await.unwrap()
}

/// Sets the sim app's env (`SIM_CONCURRENCY`, `SIM_DELAY_MS`) in the revision's template.
fn app_env(rev: &mut crds::Revision, env: &[(&str, &str)]) {
    let env: Vec<serde_json::Value> = env
        .iter()
        .map(|(k, v)| serde_json::json!({"name": k, "value": v}))
        .collect();
    let mut t = rev.spec.template.value();
    t["spec"]["containers"][0]["env"] = serde_json::Value::Array(env);
    rev.spec.template = t.into();
}

fn entry(c: &SimCluster, node: &str) -> (String, std::net::SocketAddr) {
    c.entries()
        .into_iter()
        .find(|(n, _)| n == node)
        .expect("an activator on every node")
}

/// Live (not terminating, not failed) pods of the revision, by name → node.
fn live(pods: &[Pod]) -> BTreeMap<String, String> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Failed" | "Succeeded")
            )
        })
        .map(|p| {
            (
                p.name_any(),
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
            )
        })
        .collect()
}

async fn pods_of(c: &SimCluster, ns: &str, rev: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    api.list(&ListParams::default().labels(&format!("{REVISION_LABEL}={rev}")))
        .await
        .unwrap()
        .items
}

/// Watches the revision's pods and records the most that were ever live at once.
fn track_max_live(
    c: &SimCluster,
    ns: &str,
    rev: &str,
) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let cfg = watcher::Config::default().labels(&format!("{REVISION_LABEL}={rev}"));
    let max = Arc::new(AtomicUsize::new(0));
    let m = max.clone();
    let (reader, writer) = kube::runtime::reflector::store::<Pod>();
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, cfg).reflect(writer).applied_objects());
        while let Some(ev) = events.next().await {
            if ev.is_ok() {
                let pods: Vec<Pod> = reader.state().iter().map(|p| (**p).clone()).collect();
                m.fetch_max(live(&pods).len(), Ordering::SeqCst);
            }
        }
    });
    (max, task)
}

/// Waits (on the pod watch) until the revision's live pods satisfy `pred`.
async fn wait_live(c: &SimCluster, ns: &str, rev: &str, pred: impl Fn(usize) -> bool) {
    wait_pods(c, ns, rev, |pods| pred(live(pods).len())).await
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits (on the pod watch) until the revision's pods satisfy `pred`.
async fn wait_pods(c: &SimCluster, ns: &str, rev: &str, pred: impl Fn(&[Pod]) -> bool) {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let cfg = watcher::Config::default().labels(&format!("{REVISION_LABEL}={rev}"));
    let (reader, writer) = kube::runtime::reflector::store::<Pod>();
    let mut events = std::pin::pin!(watcher(api, cfg).reflect(writer));
    let wait = async {
        while let Some(ev) = events.next().await {
            if matches!(
                ev,
                Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_))
            ) {
                let pods: Vec<Pod> = reader.state().iter().map(|p| (**p).clone()).collect();
                if pred(&pods) {
                    return;
                }
            }
        }
    };
    tokio::time::timeout(LIMIT, wait)
        .await
        .expect("the revision's pods reach the expected count");
}

/// The pods an in-process activator created so far, every reason.
fn pods_created(a: &loadtest::cluster::NodeActivator) -> u64 {
    samples(a.activator.metrics(), "activator_pods_created_total")
        .into_iter()
        .map(|(_, n)| n)
        .sum()
}

fn all_ok(samples: &[Sample]) {
    let bad: Vec<&Sample> = samples.iter().filter(|s| !s.ok()).collect();
    assert!(
        bad.is_empty(),
        "{} of {} failed, e.g. {:?}",
        bad.len(),
        samples.len(),
        bad.first()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_first_requests_start_one_pod_per_member() {
    let (c, ns) = cluster_with(options()).await;
    let members = revision(&c, &ns, "burst", |_| {}).await;
    let driver = Driver::new();
    let entries = c.entries();
    let samples = join_all((0..1000).map(|i| {
        let (driver, ns) = (driver.clone(), ns.clone());
        let (n, addr) = entries[i % entries.len()].clone();
        async move { driver.get_named((&n, addr), &ns, "burst", "/").await }
    }))
    .await;
    all_ok(&samples);
    let pods = live(&pods_of(&c, &ns, "burst").await);
    let nodes: BTreeSet<&String> = pods.values().collect();
    assert!(
        !pods.is_empty() && pods.len() <= members.len() && nodes.len() == pods.len(),
        "one pod per member at most: {pods:?} for members {members:?}"
    );
    assert!(nodes.iter().all(|n| members.contains(n)), "{pods:?}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_concurrency_one_never_gives_a_pod_two_requests() {
    let (c, ns) = cluster_with(options()).await;
    let members = revision(&c, &ns, "single", |r| {
        r.spec.container_concurrency = 1;
        r.spec.max_scale = 2;
        // The app answers 503 to a second concurrent request instead of queueing it.
        app_env(r, &[("SIM_CONCURRENCY", "1"), ("SIM_DELAY_MS", "20")]);
    })
    .await;
    let driver = Driver::new();
    let entries = c.entries();
    let samples = join_all((0..40).map(|i| {
        let (driver, ns) = (driver.clone(), ns.clone());
        let (n, addr) = entries[i % entries.len()].clone();
        async move { driver.get_named((&n, addr), &ns, "single", "/").await }
    }))
    .await;
    all_ok(&samples);
    let pods = live(&pods_of(&c, &ns, "single").await);
    assert!(pods.len() <= 2, "maxScale 2: {pods:?}");
    for pod in pods.keys() {
        if let Some(stats) = c.fleet.app_stats(&ns, pod) {
            assert_eq!(stats.rejected(), 0, "pod {pod} saw two requests at once");
        }
    }
    assert_eq!(members.len(), 2);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_scale_five_with_three_members_never_exceeds_five_pods() {
    let (c, ns) = cluster_with(options()).await;
    let members = revision(&c, &ns, "capped", |r| {
        r.spec.container_concurrency = 1;
        r.spec.max_scale = 5;
        r.spec.activators = Some(3);
        app_env(r, &[("SIM_CONCURRENCY", "1"), ("SIM_DELAY_MS", "100")]);
    })
    .await;
    assert_eq!(members.len(), 3);
    let (max_live, watch) = track_max_live(&c, &ns, "capped");
    let driver = Driver::new();
    let samples = join_all((0..90).map(|i| {
        let (driver, ns) = (driver.clone(), ns.clone());
        let (n, addr) = entry(&c, &members[i % members.len()]);
        async move { driver.get_named((&n, addr), &ns, "capped", "/").await }
    }))
    .await;
    all_ok(&samples);
    let most = max_live.load(Ordering::SeqCst);
    watch.abort();
    assert!(most <= 5, "{most} pods at once under maxScale 5");
    assert!(
        most > members.len(),
        "members scaled out past one pod each: {most}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_revision_goes_to_zero_and_its_next_request_is_cold_again() {
    let (c, ns) = cluster_with(options()).await;
    let members = revision(&c, &ns, "sleepy", |r| {
        r.spec.idle_timeout_seconds = 1;
        r.spec.activators = Some(1);
    })
    .await;
    let driver = Driver::new();
    let (m, addr) = entry(&c, &members[0]);
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    // Pod names are deterministic (a new pod may take the old one's name): tell pods apart
    // by UID.
    let uid_of = |name: Option<String>| {
        let pods = pods.clone();
        async move { pods.get(&name.expect("x-pod-name")).await.unwrap().uid() }
    };
    let first = driver.get_named((&m, addr), &ns, "sleepy", "/").await;
    assert!(first.ok() && first.cold, "{first:?}");
    let first_uid = uid_of(first.pod.clone()).await;
    let warm = driver.get_named((&m, addr), &ns, "sleepy", "/").await;
    assert!(warm.ok() && !warm.cold, "{warm:?}");
    // No request for idleTimeoutSeconds: the member deletes its pod.
    wait_live(&c, &ns, "sleepy", |n| n == 0).await;
    let again = driver.get_named((&m, addr), &ns, "sleepy", "/").await;
    assert!(again.ok() && again.cold, "asleep, so cold again: {again:?}");
    assert_ne!(
        uid_of(again.pod.clone()).await,
        first_uid,
        "a new pod served"
    );
    c.shutdown().await;
}

/// The activator's own readiness check follows the template's probe. An `exec` probe runs
/// inside the container, which only the kubelet can do: the first request waits for the
/// kubelet's Ready. Without a probe, a connection accepted is enough, and the first request
/// is answered while the kubelet has not reported Ready yet (kubesim's kubelet reports it
/// seconds after the app listens, as a real one does after its probe period).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_probe_waits_for_the_kubelets_ready_and_no_probe_does_not() {
    let (c, ns) = cluster_with(ClusterOptions {
        ready_delay: Delay::fixed_ms(4000),
        ..options()
    })
    .await;
    let exec = revision(&c, &ns, "exec-probe", |r| {
        r.spec.activators = Some(1);
        let mut t = r.spec.template.value();
        t["spec"]["containers"][0]["readinessProbe"] =
            serde_json::json!({"exec": {"command": ["cat", "/tmp/ready"]}});
        r.spec.template = t.into();
    })
    .await;
    let plain = revision(&c, &ns, "no-probe", |r| r.spec.activators = Some(1)).await;
    let driver = Driver::new();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    for (name, members, ready_when_answered) in
        [("exec-probe", &exec, true), ("no-probe", &plain, false)]
    {
        let (m, addr) = entry(&c, &members[0]);
        let first = driver.get_named((&m, addr), &ns, name, "/").await;
        assert!(first.ok() && first.cold, "{name}: {first:?}");
        // Read after the answer: the API server's state, ahead of any watch.
        let pod = pods
            .get(first.pod.as_deref().expect("x-pod-name"))
            .await
            .unwrap();
        assert_eq!(
            ready(&pod),
            ready_when_answered,
            "{name}: was the pod Ready when its first request was answered?"
        );
        // When the kubelet's Ready comes, the member counts what found the pod usable first.
        let a = c.activators.iter().find(|a| a.node == m).unwrap();
        let metrics = a.activator.metrics().clone();
        let by = if ready_when_answered {
            activator::ops::metrics::FirstBy::Watch
        } else {
            activator::ops::metrics::FirstBy::Probe
        };
        let label = activator::ops::metrics::UsableFirst { by };
        tokio::time::timeout(LIMIT, async {
            while metrics.usable_first.get_or_create(&label).get() == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{name}: usable first by {by:?}"));
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_scale_starts_pods_without_a_request_and_keeps_them_when_idle() {
    let (c, ns) = cluster_with(options()).await;
    let members = revision(&c, &ns, "eager", |r| {
        r.spec.min_scale = 2;
        r.spec.idle_timeout_seconds = 1;
    })
    .await;
    assert_eq!(members.len(), 2);
    // One pod per member (each has a minPods share of 1), Ready with no request sent.
    wait_pods(&c, &ns, "eager", |pods| {
        pods.iter().filter(|p| ready(p)).count() == 2
    })
    .await;
    let pods = live(&pods_of(&c, &ns, "eager").await);
    let nodes: BTreeSet<&String> = pods.values().collect();
    assert_eq!(nodes.len(), 2, "{pods:?}");
    // Served warm, and still there after the idle timeout.
    let driver = Driver::new();
    let (m, addr) = entry(&c, &members[0]);
    let s = driver.get_named((&m, addr), &ns, "eager", "/").await;
    assert!(s.ok() && !s.cold, "{s:?}");
    // Past idleTimeoutSeconds (1), each member's scaler decides with the revision idle: await
    // that decision (not a sleep that hopes it happened), then see that it removed nothing.
    let metrics: Vec<_> = members
        .iter()
        .map(|node| {
            let a = c.activators.iter().find(|a| &a.node == node).unwrap();
            a.activator.metrics().clone()
        })
        .collect();
    let decided = tokio::time::timeout(LIMIT, async {
        while metrics.iter().any(|m| m.idle_kept_min_scale.get() == 0) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    decided
        .await
        .expect("each member's scaler saw the revision idle past its timeout");
    // A pod removed is counted as the decision is taken, before the count awaited above.
    for m in &metrics {
        let idle = ReasonLabel {
            reason: PodReason::Idle,
        };
        assert_eq!(
            m.pods_deleted.get_or_create(&idle).get(),
            0,
            "minScale holds"
        );
    }
    assert_eq!(
        live(&pods_of(&c, &ns, "eager").await).len(),
        2,
        "minScale holds"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_nodes_requests_are_served_by_another_member() {
    let (c, ns) = cluster_with(ClusterOptions {
        max_pods: 3,
        ..options()
    })
    .await;
    let members = revision(&c, &ns, "roomy", |_| {}).await;
    assert_eq!(members.len(), 2);
    let full = &members[0];
    // Fill the first member's node: its activator pod and two fillers take its three slots.
    let api: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    for i in 0..2 {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("filler-{i}")},
            "spec": {"nodeName": full, "containers": [{"name": "x", "image": "filler"}]},
        }))
        .unwrap();
        api.create(&PostParams::default(), &pod).await.unwrap();
    }
    let driver = Driver::new();
    let (m, addr) = entry(&c, full);
    let s = driver.get_named((&m, addr), &ns, "roomy", "/").await;
    assert!(s.ok(), "{s:?}");
    let pods = live(&pods_of(&c, &ns, "roomy").await);
    let served_on = s.pod.as_ref().and_then(|p| pods.get(p));
    assert_eq!(
        served_on,
        Some(&members[1]),
        "the other member's pod served: {s:?} {pods:?}"
    );
    // Later requests entering at the full node go straight to the other member.
    let s = driver.get_named((&m, addr), &ns, "roomy", "/").await;
    assert!(s.ok(), "{s:?}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_under_load_loses_nothing() {
    // Pods that start slowly, so that the requests wait on the member while its scaler adds
    // them. No maxScale: a member that runs its whole share with every slot taken sends
    // what it cannot serve at once to the other member instead of queueing it (spilling),
    // and here the queue itself must be drained.
    let (mut c, ns) = cluster_with(ClusterOptions {
        start_delay: Delay::fixed_ms(1000),
        ..options()
    })
    .await;
    let members = revision(&c, &ns, "busy", |r| {
        r.spec.container_concurrency = 2;
    })
    .await;
    let driver = Driver::new();
    let (m, addr) = entry(&c, &members[0]);
    assert!(driver.get_named((&m, addr), &ns, "busy", "/").await.ok());
    // 30 slow requests on a member with 2 slots on its one pod: some in flight, the rest
    // waiting while more pods start.
    let load = tokio::spawn({
        let (driver, ns, m) = (driver.clone(), ns.clone(), m.clone());
        async move {
            join_all((0..30).map(|_| {
                let (driver, ns, m) = (driver.clone(), ns.clone(), m.clone());
                async move {
                    driver
                        .get_named_with((&m, addr), &ns, "busy", "/", &[("x-sim-delay-ms", "200")])
                        .await
                }
            }))
            .await
        }
    });
    let a = &c
        .activators
        .iter()
        .find(|a| a.node == members[0])
        .unwrap()
        .activator;
    // All 30 have arrived (2 in flight on the member's one pod, 28 waiting) before the stop:
    // a request still connecting when the listener closes would be refused, not drained.
    let queued = tokio::time::timeout(LIMIT, async {
        while a.metrics().queued.get() < 28 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    queued.await.expect("requests queue on the member");
    assert!(c.stop_activator(&members[0]).await);
    let samples = load.await.unwrap();
    all_ok(&samples);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_is_resolved_by_label_and_follows_a_newer_revision() {
    let (c, ns) = cluster_with(options()).await;
    let host = host_of("site", &ns);
    let members = revision(&c, &ns, "site-v1", |r| r.spec.hosts = vec![host.clone()]).await;
    let driver = Driver::new();
    // Through a node that is not a member: it looks the host up and forwards.
    let outsider = c
        .entries()
        .into_iter()
        .find(|(n, _)| !members.contains(n))
        .unwrap();
    let e = (outsider.0.as_str(), outsider.1);
    let s = driver
        .get(e, "site", &format!("{}:8080", host.to_uppercase()), "/")
        .await;
    assert!(s.ok(), "{s:?}");
    assert!(
        s.pod.as_deref().unwrap_or("").starts_with("site-v1-"),
        "{s:?}"
    );
    // A newer revision claims the host: once the cached answer expires, it serves.
    revision(&c, &ns, "site-v2", |r| r.spec.hosts = vec![host.clone()]).await;
    let moved = tokio::time::timeout(LIMIT, async {
        loop {
            let s = driver.get(e, "site", &host, "/").await;
            if s.ok() && s.pod.as_deref().unwrap_or("").starts_with("site-v2-") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    moved.await.expect("the newer revision takes the host");
    c.shutdown().await;
}

/// `activator_cold_start_phase_seconds_count{phase=...}` of `m`, per phase.
fn phase_counts(m: &std::sync::Arc<activator::ops::metrics::Metrics>) -> BTreeMap<String, u64> {
    samples(m, "activator_cold_start_phase_seconds_count")
        .into_iter()
        .map(|(l, n)| (l["phase"].clone(), n))
        .collect()
}

/// After a restart (a DaemonSet upgrade, a crash) the activator adopts the app pods the
/// previous process left on its node: an idle one goes after its idleTimeoutSeconds with no
/// request, and a request to a running one is warm (no cold-start header, no phases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_activator_adopts_its_nodes_pods() {
    let (mut c, ns) = cluster_with(options()).await;
    let one = |r: &mut crds::Revision| r.spec.activators = Some(1);
    let members = revision(&c, &ns, "left", |r| {
        one(r);
        r.spec.idle_timeout_seconds = 2;
    })
    .await;
    // Its pod must outlive the restart: nothing idles it out during the test.
    let kept = revision(&c, &ns, "kept", |r| {
        one(r);
        r.spec.idle_timeout_seconds = 3600;
    })
    .await;
    let driver = Driver::new();
    for (name, m) in [("left", &members[0]), ("kept", &kept[0])] {
        let (m, addr) = entry(&c, m);
        let s = driver.get_named((&m, addr), &ns, name, "/").await;
        assert!(s.ok() && s.cold, "{s:?}");
    }
    let kept_pod = live(&pods_of(&c, &ns, "kept").await);
    assert_eq!(kept_pod.len(), 1, "{kept_pod:?}");
    // Restart both members: the previous process stops (as on SIGTERM), its pods stay.
    let mut restarted: Vec<String> = vec![members[0].clone(), kept[0].clone()];
    restarted.dedup();
    for node in &restarted {
        assert!(c.stop_activator(node).await);
        c.add_activator(node, None).await.unwrap();
    }
    // A request to the running pod: served by it, warm.
    let (m, addr) = entry(&c, &kept[0]);
    let s = driver.get_named((&m, addr), &ns, "kept", "/").await;
    assert!(s.ok(), "{s:?}");
    assert!(
        !s.cold && s.phases.is_none(),
        "no pod started, yet the answer says cold: {s:?}"
    );
    assert_eq!(
        s.pod.as_ref(),
        kept_pod.keys().next(),
        "served by the pod already running"
    );
    // No request to "left": its pod goes after idleTimeoutSeconds all the same.
    tokio::time::timeout(LIMIT, wait_live(&c, &ns, "left", |n| n == 0))
        .await
        .expect("the pod left by the previous activator idled out");
    let a = c.activators.iter().find(|a| a.node == members[0]).unwrap();
    assert!(a.activator.metrics().adopted_revisions.get() >= 1);
    c.shutdown().await;
}

/// A Revision deleted and created again under the same name is another Revision (a new uid,
/// generation 1 again). Its members make pods of the new one, not of the copy of the old one
/// they still held: those pods named an owner that is gone, the garbage collector deleted each
/// as it was created and the member made the next at once, a loop (seen on the repo's real
/// cluster: 9,092 pods created in 15 minutes by one activator).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_deleted_and_created_again_gets_pods_of_the_new_one() {
    use kube::api::DeleteParams;
    use kube::runtime::wait::{await_condition, conditions};
    let (c, ns) = cluster_with(options()).await;
    // Every node a member both times: the same activator serves the old and the new one.
    let every = |r: &mut crds::Revision| r.spec.activators = Some(5);
    let members = revision(&c, &ns, "again", every).await;
    let driver = Driver::new();
    let (m, addr) = entry(&c, &members[0]);
    let first = driver.get_named((&m, addr), &ns, "again", "/").await;
    assert!(first.ok() && first.cold, "{first:?}");
    let revs: Api<crds::Revision> = Api::namespaced(c.client.clone(), &ns);
    let subsets: Api<crds::ActivationEndpoints> = Api::namespaced(c.client.clone(), &ns);
    let old = revs.get("again").await.unwrap().uid().unwrap();
    let old_subset = subsets.get("again").await.unwrap().uid().unwrap();
    revs.delete("again", &DeleteParams::default())
        .await
        .unwrap();
    // Its subset and its pod go with it (ownerReferences).
    tokio::time::timeout(
        LIMIT,
        await_condition(
            subsets.clone(),
            "again",
            conditions::is_deleted(&old_subset),
        ),
    )
    .await
    .expect("the old subset is deleted")
    .unwrap();
    wait_pods(&c, &ns, "again", |pods| pods.is_empty()).await;
    let a = c.activators.iter().find(|a| a.node == m).unwrap();
    let created = || pods_created(a);
    let before = created();

    let again = revision(&c, &ns, "again", every).await;
    assert!(again.contains(&m), "{m} a member again: {again:?}");
    let new = revs.get("again").await.unwrap().uid().unwrap();
    assert_ne!(old, new, "another Revision");
    let second = driver.get_named((&m, addr), &ns, "again", "/").await;
    assert!(second.ok() && second.cold, "{second:?}");
    let owners: Vec<(String, String)> = pods_of(&c, &ns, "again")
        .await
        .iter()
        .map(|p| {
            let o = p.owner_references().first().map(|o| o.uid.clone());
            (p.name_any(), o.unwrap_or_default())
        })
        .collect();
    assert!(
        !owners.is_empty() && owners.iter().all(|(_, o)| *o == new),
        "every pod names the new Revision {new} (the old was {old}): {owners:?}"
    );
    assert_eq!(
        created() - before,
        1,
        "one pod created for the new Revision"
    );
    c.shutdown().await;
}

/// Pods deleted by someone else before they serve (here a deleter that takes every pod of the
/// revision as it appears) are replaced after a back-off, 200 ms doubling, not at once: within
/// the request's timeoutSeconds of 3, at most five creates fit (at 0, 0.2, 0.6, 1.4 and 3.0 s),
/// where replacing at once made one per API round trip (hundreds on kubesim). A slower
/// machine makes fewer, never more. The request gets its 504, and the Revision a
/// `ColdStartFailed` Event with the cause `PodDeleted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_deleted_by_others_before_serving_are_replaced_after_a_back_off() {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::DeleteParams;
    let (c, ns) = cluster_with(options()).await;
    let members = revision(&c, &ns, "taken", |r| {
        r.spec.activators = Some(1);
        r.spec.timeout_seconds = 3;
    })
    .await;
    // The deleter: every pod of the revision, as soon as the watch shows it.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let cfg = watcher::Config::default().labels(&format!("{REVISION_LABEL}=taken"));
    let deleted = Arc::new(AtomicUsize::new(0));
    let deleter = {
        let (pods, deleted) = (pods.clone(), deleted.clone());
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(pods.clone(), cfg).applied_objects());
            while let Some(ev) = events.next().await {
                if let Ok(p) = ev
                    && p.metadata.deletion_timestamp.is_none()
                    && pods
                        .delete(&p.name_any(), &DeleteParams::default())
                        .await
                        .is_ok()
                {
                    deleted.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };
    let (m, addr) = entry(&c, &members[0]);
    let a = c.activators.iter().find(|a| a.node == m).unwrap();
    let created = || pods_created(a);
    let before = created();
    let s = Driver::new().get_named((&m, addr), &ns, "taken", "/").await;
    let made = created() - before;
    deleter.abort();
    assert_eq!(s.status, 504, "no pod lived to serve it: {s:?}");
    assert!(deleted.load(Ordering::SeqCst) >= 2, "the deleter took pods");
    assert!(
        (2..=5).contains(&made),
        "{made} pods created in 3 s of deletions: replaced at once, not after a back-off"
    );
    // The Event (written in the background: awaited on a watch).
    let events: Api<Event> = Api::namespaced(c.client.clone(), &ns);
    let ecfg = watcher::Config::default().fields("regarding.name=taken");
    let found = async {
        let mut evs = std::pin::pin!(watcher(events, ecfg).applied_objects());
        while let Some(e) = evs.next().await {
            if let Ok(e) = e
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.starts_with("PodDeleted"))
            {
                return e;
            }
        }
        unreachable!("the watch ended")
    };
    let e = tokio::time::timeout(LIMIT, found)
        .await
        .expect("a PodDeleted event on the Revision");
    assert_eq!(e.reason.as_deref(), Some("ColdStartFailed"), "{e:?}");
    c.shutdown().await;
}

/// Every cold start records all four phases once, so each phase's histogram counts the same
/// cold starts: a burst that waits through one start (containerConcurrency 1, so most get
/// their slot after the first), then a pod deleted and replaced while requests come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cold_start_records_each_phase_once() {
    let (c, ns) = cluster_with(options()).await;
    let members = revision(&c, &ns, "phases", |r| {
        r.spec.container_concurrency = 1;
        r.spec.activators = Some(1);
        r.spec.max_scale = 1;
    })
    .await;
    let driver = Driver::new();
    let (m, addr) = entry(&c, &members[0]);
    let burst = join_all((0..5).map(|_| driver.get_named((&m, addr), &ns, "phases", "/"))).await;
    all_ok(&burst);
    assert!(burst.iter().all(|s| s.cold), "all waited for the start");
    let metrics = c
        .activators
        .iter()
        .find(|a| a.node == members[0])
        .unwrap()
        .activator
        .metrics()
        .clone();
    let all_phases = |n: u64| {
        [
            "pod_post_sent",
            "pod_bound_seen",
            "pod_ready_seen",
            "first_byte",
        ]
        .into_iter()
        .map(|p| (p.to_string(), n))
        .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(phase_counts(&metrics), all_phases(1));
    // The pod goes; requests sent meanwhile wait for its replacement.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let name = live(&pods_of(&c, &ns, "phases").await)
        .into_keys()
        .next()
        .unwrap();
    pods.delete(&name, &Default::default()).await.unwrap();
    let after = join_all((0..5).map(|_| driver.get_named((&m, addr), &ns, "phases", "/"))).await;
    all_ok(&after);
    let counts = phase_counts(&metrics);
    let n = counts["pod_ready_seen"];
    assert_eq!(
        counts,
        all_phases(n),
        "every phase counts the same cold starts"
    );
    c.shutdown().await;
}

/// `activator_api_requests_total` of `m`, by (verb, resource), whether etcd or the API
/// server's cache answered.
fn api_requests(
    m: &std::sync::Arc<activator::ops::metrics::Metrics>,
) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for (l, n) in samples(m, "activator_api_requests_total") {
        *out.entry((l["verb"].clone(), l["resource"].clone()))
            .or_default() += n;
    }
    out
}

/// `activator_api_requests_total` of `m`, by (verb, resource, from).
fn api_requests_from(
    m: &std::sync::Arc<activator::ops::metrics::Metrics>,
) -> BTreeMap<(String, String, String), u64> {
    samples(m, "activator_api_requests_total")
        .into_iter()
        .map(|(l, n)| {
            (
                (l["verb"].clone(), l["resource"].clone(), l["from"].clone()),
                n,
            )
        })
        .collect()
}

/// A member knows its subsets' Revisions before their first request (it reads each one as
/// its subset lists it), so a cold start makes exactly one request to the API server: the
/// pod create. Counted by the activator itself (`activator_api_requests_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_cold_start_makes_one_api_request_the_pod_create() {
    let (c, ns) = cluster_with(options()).await;
    let members = revision(&c, &ns, "lean", |r| r.spec.activators = Some(1)).await;
    let a = c.activators.iter().find(|a| a.node == members[0]).unwrap();
    let metrics = a.activator.metrics().clone();
    // The member reads the revision as its subset lists it, before any request (from a
    // directory replica, or the API server).
    tokio::time::timeout(LIMIT, async {
        while revision_reads(&metrics) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the member read its revision ahead");
    let before = api_requests(&metrics);
    let (m, addr) = entry(&c, &members[0]);
    let s = Driver::new().get_named((&m, addr), &ns, "lean", "/").await;
    assert!(s.ok() && s.cold, "{s:?}");
    let after = api_requests(&metrics);
    let made: BTreeMap<_, _> = after
        .iter()
        .filter_map(|(k, n)| {
            let d = n - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect();
    assert_eq!(
        made,
        BTreeMap::from([(("create".to_string(), "pods".to_string()), 1)]),
        "the API requests of one cold start"
    );
    c.shutdown().await;
}

/// Revisions read: `get revisions` on the API server (`activator_api_requests_total`) and
/// those a directory replica answered (`activator_directory_revisions_read_total`).
fn revision_reads(m: &std::sync::Arc<activator::ops::metrics::Metrics>) -> u64 {
    let get_revisions = ("get".to_string(), "revisions".to_string());
    api_requests(m).get(&get_revisions).copied().unwrap_or(0)
        + m.from_directory.revisions_read.get()
}

/// The memberships an activator finds when it starts (a restart that keeps its node in its
/// subsets: every subset listing the node at once) are read ahead at its pace
/// (`--read-ahead-per-second`), not all at once; and a request never waits for that pace: at a pace of 0 nothing is read ahead,
/// and a request for a member revision reads it itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_activators_memberships_are_read_ahead_at_its_pace_and_requests_never_wait() {
    let (mut c, ns) = cluster_with(options()).await;
    // Three subsets that list every node.
    let names = ["ra", "rb", "rc"];
    for name in names {
        revision(&c, &ns, name, |r| r.spec.activators = Some(5)).await;
    }
    let node = c.activators[0].node.clone();
    // The process restarts; its pod stays Ready (as a container restart leaves it), so the
    // subsets keep listing the node and the new process finds them in its first list.
    let restart = async |c: &mut SimCluster, per_second: f64| {
        assert!(c.stop_activator(&node).await);
        let pace: loadtest::cluster::ConfigureActivator = Arc::new(move |cfg| {
            cfg.pool.scale_in_window = Duration::from_millis(500);
            cfg.read_ahead.per_second = per_second;
        });
        c.add_activator(&node, Some(&pace)).await.unwrap();
        let a = c.activators.iter().find(|a| a.node == node).unwrap();
        a.activator.metrics().clone()
    };

    // Pace 0: the three memberships are known, none is read ahead; the first request for one
    // reads it (it does not wait for a read that will never come).
    let metrics = restart(&mut c, 0.0).await;
    let held = |c: &SimCluster| {
        let a = c.activators.iter().find(|a| a.node == node).unwrap();
        a.activator.cached_objects()
    };
    tokio::time::timeout(LIMIT, async {
        while held(&c).subsets < names.len() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the new process listed the node's subsets");
    assert_eq!(
        revision_reads(&metrics),
        0,
        "nothing read ahead at a pace of 0"
    );
    assert_eq!(held(&c).revisions, 0);
    let (m, addr) = entry(&c, &node);
    let s = Driver::new()
        .get_named((&m, addr), &ns, names[0], "/")
        .await;
    assert!(s.ok(), "{s:?}");
    assert_eq!(
        revision_reads(&metrics),
        1,
        "the request read its member revision itself"
    );

    // A pace above 0: every membership found at the start is read, each once.
    let metrics = restart(&mut c, 50.0).await;
    tokio::time::timeout(LIMIT, async {
        while revision_reads(&metrics) < names.len() as u64 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the listed memberships were read ahead");
    let (m, addr) = entry(&c, &node);
    let reads = revision_reads(&metrics);
    let (s, made) = api_made(
        &metrics,
        Driver::new().get_named((&m, addr), &ns, names[1], "/"),
    )
    .await;
    assert!(s.ok(), "{s:?}");
    assert_eq!(
        revision_reads(&metrics),
        reads,
        "a member revision read ahead is not read again, from anywhere"
    );
    assert!(
        !made
            .keys()
            .any(|(verb, resource, _)| verb == "get" && resource == "revisions"),
        "a member revision read ahead is not read again by its request: {made:?}"
    );
    c.shutdown().await;
}

/// A request's deltas of `activator_api_requests_total` around `f`.
async fn api_made<F: std::future::Future>(
    m: &std::sync::Arc<activator::ops::metrics::Metrics>,
    f: F,
) -> (F::Output, BTreeMap<(String, String, String), u64>) {
    let before = api_requests_from(m);
    let out = f.await;
    let made = api_requests_from(m)
        .into_iter()
        .filter_map(|(k, n)| {
            let d = n - before.get(&k).copied().unwrap_or(0);
            (d > 0).then_some((k, d))
        })
        .collect();
    (out, made)
}

/// An entry that is not a member looks the subset up from the API server's watch cache
/// (`resourceVersion=0`), and the Revision from a directory replica first, not from etcd, where a burst of cold starts' writes would
/// queue its reads; only what the cache cannot show — a revision it does not have — is read
/// again from etcd before the client is told 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entrys_lookups_read_the_api_servers_cache_and_confirm_a_miss_from_etcd() {
    let (c, ns) = cluster_with(options()).await;
    let members = revision(&c, &ns, "fwd", |r| r.spec.activators = Some(1)).await;
    let outsider = c.activators.iter().find(|a| a.node != members[0]).unwrap();
    let metrics = outsider.activator.metrics().clone();
    // Its watches listed from the cache too (a rollout of thousands of activators).
    let lists: Vec<_> = api_requests_from(&metrics)
        .into_keys()
        .filter(|(v, _, _)| v == "list")
        .collect();
    assert!(
        !lists.is_empty() && lists.iter().all(|(_, _, f)| f == "cache"),
        "{lists:?}"
    );
    let (o, addr) = entry(&c, &outsider.node);
    let driver = Driver::new();
    let from_directory = || metrics.from_directory.revisions_read.get();
    let directory_before = from_directory();
    let (s, made) = api_made(&metrics, driver.get_named((&o, addr), &ns, "fwd", "/")).await;
    assert!(s.ok() && s.cold, "{s:?}");
    // The entry's share of the time is in the answer, beside the member's phases.
    let p = s.phases.expect("a cold answer's Server-Timing");
    let (sent_on, answered) = (p.entry.expect("entry"), p.forwarded.expect("forwarded"));
    assert!(
        sent_on <= answered && answered >= p.wait && p.hop().is_some(),
        "{p:?}"
    );
    let reads = |from: &str| -> Vec<_> {
        made.keys()
            .filter(|(v, _, f)| (v == "get" || v == "list") && f == from)
            .cloned()
            .collect()
    };
    assert!(
        reads("etcd").is_empty(),
        "quorum reads on the forward: {made:?}"
    );
    // Each looked up once: the subset from the cache, the Revision from a directory replica
    // (or, with none answering, from the cache).
    let once = |r: &str| {
        made.get(&("get".to_string(), r.to_string(), "cache".to_string()))
            .copied()
    };
    assert_eq!(
        (
            once("revisions").unwrap_or(0) + from_directory() - directory_before,
            once("activationendpoints")
        ),
        (1, Some(1)),
        "{made:?}"
    );
    // A revision that does not exist: the cache's "not found" is confirmed once from etcd.
    let (s, made) = api_made(&metrics, driver.get_named((&o, addr), &ns, "ghost", "/")).await;
    assert_eq!(s.status, 404, "{s:?}");
    let get = |from: &str| {
        made.get(&("get".to_string(), "revisions".to_string(), from.to_string()))
            .copied()
    };
    assert_eq!((get("cache"), get("etcd")), (Some(1), Some(1)), "{made:?}");
    c.shutdown().await;
}

/// A member keeps its subsets' Revisions without re-reading them by age, so a change must
/// reach it another way: the subsetter reconciles the new generation into the subset, and
/// the member reads the Revision again. Here a shorter idleTimeoutSeconds takes effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_revision_follows_a_spec_change() {
    let (c, ns) = cluster_with(options()).await;
    let members = revision(&c, &ns, "changing", |r| {
        r.spec.activators = Some(1);
        r.spec.idle_timeout_seconds = 3600;
    })
    .await;
    let driver = Driver::new();
    let (m, addr) = entry(&c, &members[0]);
    let s = driver.get_named((&m, addr), &ns, "changing", "/").await;
    assert!(s.ok() && s.cold, "{s:?}");
    let api: Api<crds::Revision> = Api::namespaced(c.client.clone(), &ns);
    let changed = api
        .patch(
            "changing",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"idleTimeoutSeconds": 1}})),
        )
        .await
        .unwrap();
    let want = changed.metadata.generation;
    // The subsetter has reconciled the new generation into the subset.
    let aes: Api<crds::ActivationEndpoints> = Api::namespaced(c.client.clone(), &ns);
    tokio::time::timeout(
        LIMIT,
        kube::runtime::wait::await_condition(
            aes,
            "changing",
            move |a: Option<&crds::ActivationEndpoints>| {
                a.and_then(|a| a.status.as_ref())
                    .is_some_and(|s| s.observed_generation >= want)
            },
        ),
    )
    .await
    .expect("the subset follows the new generation")
    .unwrap();
    // Requests keep arriving until the member has the new spec: then, idle for a second, the
    // pod goes. With the old spec (an hour) it would stay.
    tokio::time::timeout(LIMIT, async {
        loop {
            let s = driver.get_named((&m, addr), &ns, "changing", "/").await;
            assert!(s.ok(), "{s:?}");
            if tokio::time::timeout(
                Duration::from_secs(5),
                wait_live(&c, &ns, "changing", |n| n == 0),
            )
            .await
            .is_ok()
            {
                return;
            }
        }
    })
    .await
    .expect("the member took the new idleTimeoutSeconds");
    c.shutdown().await;
}

/// A peer forwards to the member its copy of the subset names; when the subset has just moved
/// off that node (cordoned here; a node back from a fault, a rebalance), the node still
/// serves the request from the pod it has, rather than refusing it as "not a member".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_left_the_subset_serves_a_forwarded_request_from_its_pod() {
    let (c, ns) = cluster_with(ClusterOptions {
        nodes: 3,
        default_activators: 1,
        configure_activator: Some(Arc::new(|cfg| {
            // The pod outlives the test: only the subset moves.
            cfg.pool.scale_in_window = Duration::from_secs(600);
        })),
        ..options()
    })
    .await;
    let members = revision(&c, &ns, "moved", |_| {}).await;
    assert_eq!(members.len(), 1);
    let former = members[0].clone();
    let driver = Driver::new();
    let (m, addr) = entry(&c, &former);
    let s = driver.get_named((&m, addr), &ns, "moved", "/").await;
    assert!(s.ok(), "warm on its member first: {s:?}");

    // Cordon the member's node: the subsetter moves the subset to another node.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.client.clone());
    nodes
        .patch(
            &former,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    tokio::time::timeout(LIMIT, async {
        loop {
            let now = member_nodes(&c.client, &ns, "moved")
                .await
                .unwrap_or_default();
            if !now.is_empty() && !now.contains(&former) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the subset moves off the cordoned node");
    // The former member's own watch has seen it leave.
    let a = &c
        .activators
        .iter()
        .find(|a| a.node == former)
        .expect("its activator")
        .activator;
    tokio::time::timeout(LIMIT, async {
        while a.cached_objects().subsets > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the former member's watch drops the subset");

    // What a peer with the old subset forwards: proven hop headers.
    let hop = c.hop().forward_headers("some-peer", false);
    let hop: Vec<(&str, &str)> = hop.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let s = driver
        .get_named_with((&m, addr), &ns, "moved", "/", &hop)
        .await;
    assert!(s.ok(), "served from the pod the node still has: {s:?}");
    assert!(!s.cold, "no new pod for it: {s:?}");
    let pods = live(&pods_of(&c, &ns, "moved").await);
    assert_eq!(
        s.pod.as_ref().and_then(|p| pods.get(p)),
        Some(&former),
        "its own pod served: {s:?} {pods:?}"
    );
    let served = samples(a.metrics(), "activator_served_as_former_member_total");
    assert_eq!(served.iter().map(|(_, v)| *v).sum::<u64>(), 1, "{served:?}");
    c.shutdown().await;
}
