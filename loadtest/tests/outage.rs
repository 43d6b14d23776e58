//! An API server outage on kubesim: the embedded API server stopped (its port closed, every
//! connection cut) and started again on the same address, its watch history compacted
//! meanwhile so that every resumed watch gets `410 Gone`, as from a restarted kube-apiserver's
//! fresh watch cache. While it is down, warm traffic is served and a cold start is refused at
//! once (503 with `Retry-After`); once it answers again, the activators' and the subsetter's
//! watches resume, a new Revision gets its subset and is served, and a pod change reaches the
//! activator of its node.
//!
//! Figures (printed, not asserted): how long after the restart each watch resumed, and the
//! requests the activators sent while the API server was down. `OUTAGE_SECS` sets the
//! outage's length (default 8; docs/operations.md quotes 60).

// The figures are this test's report (run it with --nocapture to read them).
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crds::contract::{ACTIVATOR_SELECTOR, REVISION_LABEL, member_selector};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use kubesim::api::{ApiServer, WatchInfo};
use kubesim::node::Delay;
use loadtest::demo::{echo_revision, member_nodes, wait_subsets};
use loadtest::{ClusterOptions, SimCluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Upper bound on any wait for the cluster to reach a state (a hang detector, not a timing).
/// The simulated kubelets back off as real ones do (up to 30 s, twice with the 410 after a
/// compaction): what waits for them is given that too.
const LIMIT: Duration = Duration::from_secs(150);

fn outage() -> Duration {
    let secs = std::env::var("OUTAGE_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(8);
    Duration::from_secs(secs)
}

/// An answer: status, headers (lower-case names), body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

/// One `GET /` naming `ns/name` by headers, on its own connection (the answer is read to the
/// end: `Connection: close`).
async fn get(entry: SocketAddr, ns: &str, name: &str) -> Answer {
    let req = format!(
        "GET / HTTP/1.1\r\nhost: outage.test\r\nx-revision-namespace: {ns}\r\n\
         x-revision-name: {name}\r\nconnection: close\r\n\r\n"
    );
    exchange(entry, req).await
}

/// One `GET /` naming its revision by Host only.
async fn get_host(entry: SocketAddr, host: &str) -> Answer {
    exchange(
        entry,
        format!("GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"),
    )
    .await
}

async fn exchange(entry: SocketAddr, req: String) -> Answer {
    let mut s = tokio::net::TcpStream::connect(entry)
        .await
        .expect("the activator accepts");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(LIMIT, s.read_to_end(&mut raw))
        .await
        .expect("an answer")
        .unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

/// Asks until the answer is a 200, honouring `Retry-After` as a client would; returns the
/// answers refused on the way.
async fn until_ok(entry: SocketAddr, ns: &str, name: &str) -> Vec<Answer> {
    let mut refused = Vec::new();
    tokio::time::timeout(LIMIT, async {
        loop {
            let a = get(entry, ns, name).await;
            if a.status == 200 {
                return;
            }
            let after = a
                .headers
                .get("retry-after")
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(1);
            refused.push(a);
            tokio::time::sleep(Duration::from_secs(after)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{ns}/{name} is never served: {refused:?}"));
    refused
}

fn entry_of(c: &SimCluster, node: &str) -> SocketAddr {
    c.entries()
        .into_iter()
        .find(|(n, _)| n == node)
        .expect("an activator on every node")
        .1
}

/// A Revision served by one member (so which activator starts its pods is known).
async fn revision(c: &SimCluster, ns: &str, name: &str) -> String {
    let mut rev = echo_revision(name, ns, vec![format!("{name}.{ns}.outage.test")]);
    rev.spec.activators = Some(1);
    let api: Api<crds::Revision> = Api::namespaced(c.client.clone(), ns);
    api.create(&PostParams::default(), &rev).await.unwrap();
    wait_subsets(&c.client, ns, &[name.to_string()], LIMIT)
        .await
        .unwrap();
    member_nodes(&c.client, ns, name).await.unwrap()[0].clone()
}

fn total(requests: &BTreeMap<String, u64>) -> u64 {
    requests.values().sum()
}

fn minus(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The watches that must come back, by a name for the report, and how to recognise one of
/// them in kubesim's accounting.
/// Recognises one watch in kubesim's accounting.
type IsWatch = Box<dyn Fn(&WatchInfo) -> bool + Send + Sync>;

fn wanted_watches(c: &SimCluster) -> Vec<(String, IsWatch)> {
    let mut out: Vec<(String, IsWatch)> = Vec::new();
    for (node, _) in c.entries() {
        let field = format!("spec.nodeName={node}");
        out.push((
            format!("activator {node}: pods"),
            Box::new(move |w| {
                w.resource == "pods"
                    && w.field_selector == field
                    && w.label_selector == REVISION_LABEL
            }),
        ));
        // The simulated kubelet's (kube-rs's default back-off, up to 30 s, as client-go's
        // reflector in a real kubelet): not the activator's, but what a pod created after
        // the outage waits for.
        let kubelet_field = format!("spec.nodeName={node}");
        out.push((
            format!("kubelet {node}: pods"),
            Box::new(move |w| {
                w.resource == "pods"
                    && w.field_selector == kubelet_field
                    && w.label_selector.is_empty()
            }),
        ));
        let label = member_selector(&node);
        out.push((
            format!("activator {node}: activationendpoints"),
            Box::new(move |w| w.resource == "activationendpoints" && w.label_selector == label),
        ));
    }
    let unselected = |resource: &'static str| {
        move |w: &WatchInfo| {
            w.resource == resource && w.label_selector.is_empty() && w.field_selector.is_empty()
        }
    };
    out.push((
        "subsetter: revisions".into(),
        Box::new(unselected("revisions")),
    ));
    out.push((
        "subsetter: activationendpoints".into(),
        Box::new(unselected("activationendpoints")),
    ));
    out.push((
        "subsetter: activator pods".into(),
        Box::new(|w| w.resource == "pods" && w.label_selector == ACTIVATOR_SELECTOR),
    ));
    out
}

/// How long after `since` each wanted watch was open again (a watch newer than `after_id`).
/// kubesim's accounting has no event to wait on: it is read every few milliseconds, which
/// bounds the figures' resolution, not what is asserted.
async fn watches_back(
    api: ApiServer,
    wanted: Vec<(String, IsWatch)>,
    after_id: u64,
    since: Instant,
) -> BTreeMap<String, Duration> {
    let mut back = BTreeMap::new();
    tokio::time::timeout(LIMIT, async {
        while back.len() < wanted.len() {
            let stats = api.stats();
            for (name, is) in &wanted {
                if !back.contains_key(name)
                    && stats
                        .watches
                        .iter()
                        .any(|w| w.open && w.id > after_id && is(w))
                {
                    back.insert(name.clone(), since.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("watches never resumed; resumed so far: {back:?}"));
    back
}

/// Waits until `f` holds of the activator on `node` (its caches have no event a test can
/// wait on: read every few milliseconds).
async fn until_activator(
    c: &SimCluster,
    node: &str,
    what: &str,
    f: impl Fn(&activator::cache::CachedObjects) -> bool,
) {
    let a = &c
        .activators
        .iter()
        .find(|a| a.node == node)
        .expect("an activator on the node")
        .activator;
    tokio::time::timeout(LIMIT, async {
        while !f(&a.cached_objects()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("activator {node}: {what}; caches {:?}", a.cached_objects()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_refuses_cold_starts_at_once_and_every_watch_resumes() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let outage = outage();
    let ns = format!("outage-{:08x}", rand::random::<u32>());
    let c = SimCluster::start(ClusterOptions {
        nodes: 3,
        start_delay: Delay::fixed_ms(100),
        node_agent: true,
        default_activators: 1,
        // The outage needs the embedded API server, whatever KUBECONFIG says.
        use_kubeconfig: false,
        revision_namespace: Some(ns.clone()),
        // No node is to be found NotReady for the leases it could not renew meanwhile.
        node_grace: outage + Duration::from_secs(120),
        ..ClusterOptions::default()
    })
    .await
    .expect("cluster starts");
    c.ensure_own_namespace(&ns).await.unwrap();
    let api = c.api.clone().expect("an embedded API server");

    // A warm revision (a pod running), one never requested, and one never requested whose
    // request goes to an activator that has read neither it nor its subset.
    let warm_node = revision(&c, &ns, "warm").await;
    let cold_node = revision(&c, &ns, "cold").await;
    let unread_node = revision(&c, &ns, "unread").await;
    let warm_entry = entry_of(&c, &warm_node);
    until_ok(warm_entry, &ns, "warm").await;
    let other = c
        .entries()
        .into_iter()
        .find(|(n, _)| *n != unread_node)
        .expect("three nodes")
        .1;

    let before = c.activator_api_requests();
    let last_watch = api.stats().watches.iter().map(|w| w.id).max().unwrap_or(0);
    api.stop().await;
    let stopped = Instant::now();
    api.compact();

    let warm = get(warm_entry, &ns, "warm").await;
    assert_eq!(
        warm.status, 200,
        "a warm request during the outage: {warm:?}"
    );
    // Through the activators that never looked it up, by headers and by Host: they ask the
    // directory (the subsetter's caches) what the API server cannot answer.
    let warm_host = format!("warm.{ns}.outage.test");
    for (node, entry) in c.entries() {
        if node == warm_node {
            continue;
        }
        let by_headers = get(entry, &ns, "warm").await;
        assert_eq!(
            by_headers.status, 200,
            "a warm request by headers through {node}, which never read the revision: {by_headers:?}"
        );
        let by_host = get_host(entry, &warm_host).await;
        assert_eq!(
            by_host.status, 200,
            "a warm request by Host through {node}, which never looked the host up: {by_host:?}"
        );
    }

    let asked = Instant::now();
    let cold = get(entry_of(&c, &cold_node), &ns, "cold").await;
    let cold_took = asked.elapsed();
    assert_eq!(cold.status, 503, "a cold start during the outage: {cold:?}");
    assert!(
        cold.headers.contains_key("retry-after"),
        "a 503 without Retry-After: {cold:?}"
    );
    assert!(
        cold.body.contains("API server"),
        "the reason says why: {:?}",
        cold.body
    );

    let asked = Instant::now();
    let unread = get(other, &ns, "unread").await;
    let unread_took = asked.elapsed();
    assert_eq!(
        unread.status, 503,
        "an unread revision during the outage: {unread:?}"
    );
    assert!(unread.headers.contains_key("retry-after"), "{unread:?}");

    // The outage itself: the time is the scenario, not a wait for something to happen.
    tokio::time::sleep(outage.saturating_sub(stopped.elapsed())).await;
    let down = stopped.elapsed();
    let sent = minus(&c.activator_api_requests(), &before);
    api.resume().await.expect("the API server starts again");
    let resumed = Instant::now();

    // Measured meanwhile: the kubelets may take far longer than the rest.
    let measuring = tokio::spawn(watches_back(
        api.clone(),
        wanted_watches(&c),
        last_watch,
        resumed,
    ));

    // The subsetter's Revision watch sees a new Revision and the member's subset watch its
    // subset (the member's cache counts it: a lookup would not), and it is served.
    let subsets_before: BTreeMap<String, usize> = c
        .activators
        .iter()
        .map(|a| (a.node.clone(), a.activator.cached_objects().subsets))
        .collect();
    let created = Instant::now();
    let mut rev = echo_revision("after", &ns, Vec::new());
    rev.spec.activators = Some(1);
    Api::<crds::Revision>::namespaced(c.client.clone(), &ns)
        .create(&PostParams::default(), &rev)
        .await
        .unwrap();
    wait_subsets(&c.client, &ns, &["after".to_string()], LIMIT)
        .await
        .unwrap();
    let subset_after = created.elapsed();
    let after_node = member_nodes(&c.client, &ns, "after").await.unwrap()[0].clone();
    let had = subsets_before[&after_node];
    until_activator(
        &c,
        &after_node,
        "its subset watch never saw the new subset",
        |o| o.subsets > had,
    )
    .await;
    let watched_after = created.elapsed();
    let refused_after = until_ok(entry_of(&c, &after_node), &ns, "after").await;
    let served_after = created.elapsed();

    // A cold start of a revision refused during the outage works again.
    let asked = Instant::now();
    let refused_cold = until_ok(entry_of(&c, &cold_node), &ns, "cold").await;
    let cold_again = asked.elapsed();

    // The pod watch of the warm revision's node sees its pod deleted.
    let had_pods = c
        .activators
        .iter()
        .find(|a| a.node == warm_node)
        .map(|a| a.activator.cached_objects().pods)
        .unwrap_or(0);
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let warm_pods = pods
        .list(&ListParams::default().labels(&format!("{REVISION_LABEL}=warm")))
        .await
        .unwrap();
    for p in &warm_pods.items {
        pods.delete(&p.name_any(), &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    let deleted = Instant::now();
    until_activator(&c, &warm_node, "its pod watch never saw the pod go", |o| {
        o.pods < had_pods
    })
    .await;
    let pod_gone_seen = deleted.elapsed();

    let back = measuring.await.expect("the measurement ends");

    // While it was down: what the activators sent, and at what rate. Bounded: every watch
    // waits at least half the back-off's cap between attempts, so no more than one attempt
    // per 0.5 s per watch after the first few (this catches a retry loop, not a slow one).
    let activators = c.activators.len() as f64;
    let attempts = total(&sent) as f64;
    let secs = down.as_secs_f64();
    let per_watch_bound = 5.0 + secs / (crds::backoff::CAP.as_secs_f64() / 2.0);
    assert!(
        attempts <= activators * (2.0 * per_watch_bound + 10.0),
        "the activators retried {attempts} times in {secs:.1} s: {sent:?}"
    );

    println!("outage: {secs:.1} s, watch history compacted (every resumed watch got 410)");
    println!(
        "during it: warm request 200; cold request 503 + Retry-After in {:.1} ms; unread revision 503 in {:.1} ms",
        cold_took.as_secs_f64() * 1e3,
        unread_took.as_secs_f64() * 1e3
    );
    println!(
        "activators' API requests while down: {attempts} from {activators} activators = {:.2}/s per activator ({sent:?})",
        attempts / secs / activators
    );
    for (name, t) in &back {
        println!(
            "resumed {:>7.1} ms after the restart: {name}",
            t.as_secs_f64() * 1e3
        );
    }
    println!(
        "new revision after the restart: subset in {:.0} ms, in its member's watched cache in {:.0} ms, served in {:.0} ms ({} refused first)",
        subset_after.as_secs_f64() * 1e3,
        watched_after.as_secs_f64() * 1e3,
        served_after.as_secs_f64() * 1e3,
        refused_after.len()
    );
    println!(
        "cold start of the revision refused during the outage: served {:.0} ms after the first try ({} refused first)",
        cold_again.as_secs_f64() * 1e3,
        refused_cold.len()
    );
    println!(
        "pod deleted after the restart: seen by its node's activator in {:.1} ms",
        pod_gone_seen.as_secs_f64() * 1e3
    );
    c.shutdown().await;
}
