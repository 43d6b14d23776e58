//! Deploys without a cold start, from the activators' side, against kubesim with real sockets
//! and simulated nodes running the apps: an entry activator (a member of nothing: it forwards)
//! and a member activator serving every revision here.
//!
//! - A host split 10/90 between two revisions by `status.routes` sends each its share of the
//!   requests, through either activator; the member serves the revision the entry picked (it
//!   makes no host lookup of its own).
//! - A host moved to another revision (a Route's split changed, or a newer revision took the
//!   host over) is followed by the entry as soon as the member has seen the subsetter's write
//!   (its answer says the entry's host answer is stale), not at the host TTL: every TTL here
//!   is an hour. The member, as an entry itself, follows from its own watched copy.
//! - The hints cannot be forged: a client's `x-activator-*` headers are neither honoured nor
//!   passed to the app, and an app answering `x-activator-host-stale` makes no entry read the
//!   host again, nor does any client see it.

use std::net::SocketAddr;
use std::time::Duration;

use activator::ops::metrics::HostRefresh;
use activator::pipeline::hop::HopAuth;
use activator::{Activator, ActivatorConfig};
use anyhow::Context as _;
use bytes::Bytes;
use crds::contract::{host_label, member_label, pod_name};
use crds::{ActivationEndpoints, ActivationEndpointsStatus, ActivatorMember, HostShare, Revision};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kubesim::api::{ApiServer, ApiServerConfig};
use kubesim::node::reserve::{NodeBlock, reserve_nodes};
use kubesim::node::{Fleet, NodeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Far longer than anything here takes: reaching it means the test hung.
const HANG: Duration = Duration::from_secs(60);
const NS: &str = "shop";
const HOST: &str = "shop.example.test";
/// Every host answer lives this long: only a hint can move a host within a test.
const TTL_NEVER: Duration = Duration::from_secs(3600);
/// The most requests a client sends waiting for an entry to follow a move. A move is
/// followed within a few of them (the member's watch event, then one LIST in the background);
/// this bounds a hang by requests, not by a clock.
const FOLLOW_WITHIN: usize = 5_000;

/// kubesim, two simulated nodes and an activator on each: `entry` is a member of nothing,
/// `member` of every subset the test writes.
struct Rig {
    api: ApiServer,
    fleet: Fleet,
    _block: NodeBlock,
    entry: Activator,
    member: Activator,
    member_node: String,
}

impl Rig {
    async fn start() -> anyhow::Result<Self> {
        let api = ApiServer::start(ApiServerConfig::default()).await?;
        let client = api.client();
        install_crds(&client).await?;
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(NS.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        // Loopback addresses no concurrently running test binds.
        let block = reserve_nodes(2)?;
        let configs: Vec<NodeConfig> = block.indices().map(NodeConfig::numbered).collect();
        let names: Vec<String> = configs.iter().map(|c| c.name.clone()).collect();
        let fleet = Fleet::start(client, configs).await?;
        let hop = HopAuth::new("host-split-test-secret")?;
        let entry = start(&api, &names[0], &hop).await?;
        let member = start(&api, &names[1], &hop).await?;
        Ok(Self {
            api,
            fleet,
            _block: block,
            entry,
            member,
            member_node: names[1].clone(),
        })
    }

    fn revisions(&self) -> Api<Revision> {
        Api::namespaced(self.api.client(), NS)
    }

    fn subsets(&self) -> Api<ActivationEndpoints> {
        Api::namespaced(self.api.client(), NS)
    }

    /// A Revision of kubesim's echo app claiming `hosts`.
    async fn revision(&self, name: &str, hosts: &[&str]) -> anyhow::Result<Revision> {
        let spec = serde_json::from_value(serde_json::json!({
            "hosts": hosts,
            "template": {"spec": {"containers": [{"name": "app", "image": "kubesim/echo:latest"}]}},
        }))?;
        let mut rev = Revision::new(name, spec);
        rev.metadata.namespace = Some(NS.into());
        Ok(self
            .revisions()
            .create(&PostParams::default(), &rev)
            .await?)
    }

    /// `rev`'s ActivationEndpoints as the subsetter writes it: the member alone, with
    /// `routes`, and the host's label when `labelled`.
    async fn subset(
        &self,
        rev: &Revision,
        routes: &[(&str, i32)],
        labelled: bool,
    ) -> anyhow::Result<()> {
        let name = rev
            .metadata
            .name
            .clone()
            .context("a Revision without a name")?;
        let mut labels =
            std::collections::BTreeMap::from([(member_label(&self.member_node), String::new())]);
        if labelled {
            labels.insert(host_label(HOST), String::new());
        }
        let mut aep = ActivationEndpoints::new(&name, Default::default());
        aep.metadata.namespace = Some(NS.into());
        aep.metadata.labels = Some(labels);
        aep.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "local-activator.dev/v1alpha1".into(),
            kind: "Revision".into(),
            name: name.clone(),
            uid: rev.metadata.uid.clone().context("a Revision without uid")?,
            controller: Some(true),
            ..Default::default()
        }]);
        self.subsets().create(&PostParams::default(), &aep).await?;
        let status = ActivationEndpointsStatus {
            activators: vec![ActivatorMember {
                node: self.member_node.clone(),
                address: self.member.data_addr().to_string(),
                pod: self.member.pod_name().into(),
                max_pods: 0,
                min_pods: 0,
            }],
            routes: shares(routes),
            ..Default::default()
        };
        self.patch_status(&name, serde_json::to_value(status)?)
            .await
    }

    async fn patch_status(&self, name: &str, status: serde_json::Value) -> anyhow::Result<()> {
        self.subsets()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "status": status })),
            )
            .await?;
        Ok(())
    }

    /// The subsetter's first write of a move: the gaining revision's subset carries the
    /// host's label (and its route, if any).
    async fn label_host(&self, name: &str) -> anyhow::Result<()> {
        let labels = serde_json::json!({"metadata": {"labels": {(host_label(HOST)): ""}}});
        self.subsets()
            .patch(name, &PatchParams::default(), &Patch::Merge(labels))
            .await?;
        Ok(())
    }
}

fn shares(routes: &[(&str, i32)]) -> Vec<HostShare> {
    routes
        .iter()
        .map(|(host, percent)| HostShare {
            host: host.to_string(),
            percent: *percent,
        })
        .collect()
}

/// The CRDs of Revisions and ActivationEndpoints as the types generate them (deploy/crds/
/// holds the same, checked by the crds crate's test), each once it is Established: kubesim
/// prunes what a schema does not name, and `status.routes` must be named.
async fn install_crds(client: &kube::Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (file, crd) in crds::crdgen::all() {
        if !matches!(file, "revisions.yaml" | "activationendpoints.yaml") {
            continue;
        }
        let name = crd.metadata.name.clone().context("CRD without a name")?;
        crds.create(&PostParams::default(), &crd).await?;
        tokio::time::timeout(
            HANG,
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await??;
    }
    Ok(())
}

/// An activator on `node` sharing the cluster's hop secret, every host answer kept an hour,
/// once its caches have synced.
async fn start(api: &ApiServer, node: &str, hop: &HopAuth) -> anyhow::Result<Activator> {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut cfg = ActivatorConfig::new(node, any, any);
    cfg.drain_timeout = Duration::from_millis(300);
    cfg.hop = hop.clone();
    cfg.host_ttl = TTL_NEVER;
    let a = Activator::start(cfg, api.client()).await?;
    tokio::time::timeout(HANG, async {
        while !a.is_ready() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .context("the activator never became ready")?;
    Ok(a)
}

/// A keep-alive HTTP/1.1 client of one activator, connecting again when the activator closed
/// the connection.
struct Client {
    to: SocketAddr,
    send: Option<hyper::client::conn::http1::SendRequest<Empty<Bytes>>>,
}

/// An answer: its status, the revision whose pod served it (from the echo app's
/// `x-pod-name`, which starts with the revision's name), its headers and body.
struct Answer {
    status: u16,
    pod: String,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Answer {
    fn served_by(&self, revision: &str) -> bool {
        self.pod.starts_with(&format!("{revision}-"))
    }
}

impl Client {
    fn new(to: SocketAddr) -> Self {
        Self { to, send: None }
    }

    async fn get(&mut self, headers: &[(&str, &str)]) -> anyhow::Result<Answer> {
        let reused = match self.send.take() {
            Some(mut s) => s.ready().await.is_ok().then_some(s),
            None => None,
        };
        let mut send = match reused {
            Some(s) => s,
            None => {
                let io = TokioIo::new(TcpStream::connect(self.to).await?);
                let (mut send, conn) = hyper::client::conn::http1::handshake(io).await?;
                tokio::spawn(conn);
                send.ready().await?;
                send
            }
        };
        let mut req = http::Request::get("/");
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let resp = tokio::time::timeout(HANG, send.send_request(req.body(Empty::new())?))
            .await
            .context("no answer")??;
        let (parts, body) = resp.into_parts();
        let body = tokio::time::timeout(HANG, body.collect())
            .await
            .context("no body")??
            .to_bytes();
        self.send = Some(send);
        let pod = parts
            .headers
            .get("x-pod-name")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        Ok(Answer {
            status: parts.status.as_u16(),
            pod,
            headers: parts.headers,
            body,
        })
    }

    /// A request for the shared host.
    async fn host(&mut self) -> anyhow::Result<Answer> {
        self.get(&[("host", HOST)]).await
    }

    /// Requests for the host until one is served by `revision`: how many were served by
    /// another before it. Every answer must be a 200: a move drops no request.
    async fn follow(&mut self, revision: &str) -> anyhow::Result<usize> {
        for sent in 0..FOLLOW_WITHIN {
            let a = self.host().await?;
            anyhow::ensure!(
                a.status == 200,
                "answer {sent}: {} from {}",
                a.status,
                a.pod
            );
            if a.served_by(revision) {
                return Ok(sent);
            }
        }
        anyhow::bail!("not served by {revision} after {FOLLOW_WITHIN} requests")
    }
}

/// Starts `revision`'s pod on the member, asking for it by name: the gaining revision of a
/// deploy is running before the host moves to it.
async fn warm(member: &Activator, revision: &str) -> anyhow::Result<()> {
    let a = Client::new(member.data_addr())
        .get(&[
            ("host", "anything"),
            ("x-revision-namespace", NS),
            ("x-revision-name", revision),
        ])
        .await?;
    anyhow::ensure!(
        a.status == 200 && a.served_by(revision),
        "{} {}",
        a.status,
        a.pod
    );
    Ok(())
}

/// The value of `series` (name and labels, as exposed) on the admin port's `/metrics`.
async fn exposed(a: &Activator, series: &str) -> anyhow::Result<f64> {
    let mut s = TcpStream::connect(a.admin_addr()).await?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await?;
    let mut text = String::new();
    tokio::time::timeout(HANG, s.read_to_string(&mut text))
        .await
        .context("no answer from /metrics")??;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")))
        .with_context(|| format!("{series} is not exported"))?
        .trim()
        .parse()
        .context("not a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_split_10_90_sends_each_revision_its_share() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    let blue = rig.revision("blue", &[HOST]).await?;
    // A Route's revision need not claim the host: green takes its share without.
    let green = rig.revision("green", &[]).await?;
    rig.subset(&blue, &[(HOST, 90)], true).await?;
    rig.subset(&green, &[(HOST, 10)], true).await?;
    warm(&rig.member, "blue").await?;
    warm(&rig.member, "green").await?;

    let lists = || rig.api.stats().count("list", "activationendpoints");
    let forwards = rig.entry.metrics().forwards.get();
    let before = lists();
    const EACH: usize = 1_000;
    let mut green_count = 0usize;
    // Through the entry first: forwarded to the member with the revision the entry picked.
    let mut via_entry = Client::new(rig.entry.data_addr());
    for _ in 0..EACH {
        let a = via_entry.host().await?;
        anyhow::ensure!(a.status == 200, "{} from {:?}", a.status, a.pod);
        green_count += usize::from(a.served_by("green"));
    }
    assert_eq!(
        rig.entry.metrics().forwards.get() - forwards,
        EACH as u64,
        "the entry forwards every request"
    );
    // One host lookup, the entry's: the member served what the entry picked, with no pick
    // (and no lookup) of its own.
    assert_eq!(lists() - before, 1, "host lookups");
    // Then through the member, which picks for itself (its fast lane).
    let mut via_member = Client::new(rig.member.data_addr());
    for _ in 0..EACH {
        let a = via_member.host().await?;
        anyhow::ensure!(a.status == 200, "{} from {:?}", a.status, a.pod);
        green_count += usize::from(a.served_by("green"));
    }
    // 2,000 picks at p = 0.1: σ = 0.67 points. ±5 points is 7.5 σ; by the Chernoff bound the
    // count leaves [100, 300] with probability below 3e-11 (e^-24.5 above, e^-33.4 below).
    // A split ignored (all blue: 0), inverted (1,800) or halved (1,000) is far outside.
    let share = green_count as f64 / (2 * EACH) as f64;
    assert!(
        (0.05..=0.15).contains(&share),
        "green served {green_count} of {} requests ({share:.3}), not 10 % ± 5 points",
        2 * EACH
    );
    rig.entry.shutdown().await;
    rig.member.shutdown().await;
    Ok(())
}

/// How the subsetter moves the host from blue to green.
#[derive(Clone, Copy, Debug)]
enum Move {
    /// A Route: blue 100 → green 100, blue 0.
    Route,
    /// No Route: green, newer, takes the host once it can serve; blue gets `HostConflict`.
    HandOver,
}

async fn a_move_is_followed_at_the_members_hint(how: Move) -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    let blue = rig.revision("blue", &[HOST]).await?;
    let green = rig.revision("green", &[HOST]).await?;
    match how {
        Move::Route => rig.subset(&blue, &[(HOST, 100)], true).await?,
        Move::HandOver => rig.subset(&blue, &[], true).await?,
    }
    // Green's subset without the host's label: it cannot serve yet.
    rig.subset(&green, &[], false).await?;
    warm(&rig.member, "blue").await?;
    let mut via_entry = Client::new(rig.entry.data_addr());
    let mut via_member = Client::new(rig.member.data_addr());
    // Both have the host cached, pointing at blue.
    for c in [&mut via_entry, &mut via_member] {
        let a = c.host().await?;
        assert!(
            a.status == 200 && a.served_by("blue"),
            "{} {}",
            a.status,
            a.pod
        );
    }
    // Green's pods run before the host moves to it (no cold start in the move).
    warm(&rig.member, "green").await?;

    // The subsetter's writes, in its order: green gains the host, then blue's status changes.
    rig.label_host("green").await?;
    match how {
        Move::Route => {
            let routes = serde_json::to_value(shares(&[(HOST, 100)]))?;
            rig.patch_status("green", serde_json::json!({ "routes": routes }))
                .await?;
            let routes = serde_json::to_value(shares(&[(HOST, 0)]))?;
            rig.patch_status("blue", serde_json::json!({ "routes": routes }))
                .await?;
        }
        Move::HandOver => {
            let conflict = serde_json::json!({"conditions": [{
                "type": "HostConflict", "status": "True", "reason": "HostClaimedByNewerRevision",
                "message": "green serves the host", "lastTransitionTime": "2026-12-01T00:00:00Z",
            }]});
            rig.patch_status("blue", conflict).await?;
        }
    }

    // The entry keeps answering from blue until the member has seen blue's new subset and
    // says so on an answer; then it reads the host again and follows.
    let stale_before = rig.entry.metrics().hosts.refreshes(HostRefresh::StaleHint);
    let old = via_entry.follow("green").await?;
    let e = rig.entry.metrics();
    assert!(
        e.hosts.refreshes(HostRefresh::StaleHint) > stale_before,
        "{how:?}: followed after {old} requests, but not on a stale hint"
    );
    assert!(e.hosts.moves.get() >= 1, "{how:?}: no move counted");
    assert_eq!(
        e.hosts.refreshes(HostRefresh::LocalNewer),
        0,
        "{how:?}: the entry is a member of nothing"
    );
    assert!(rig.member.metrics().hosts.stale_answers.get() >= 1);
    // It stays moved: the very next requests are green's.
    for _ in 0..20 {
        let a = via_entry.host().await?;
        assert!(
            a.status == 200 && a.served_by("green"),
            "{} {}",
            a.status,
            a.pod
        );
    }
    // The series as exported.
    let hints = exposed(
        &rig.entry,
        "activator_host_refreshes_total{reason=\"stale_hint\"}",
    )
    .await?;
    assert!(hints >= 1.0, "{hints}");
    assert!(exposed(&rig.entry, "activator_host_moves_total").await? >= 1.0);

    // The member, an entry itself, follows from its own copy of blue's subset.
    via_member.follow("green").await?;
    let m = rig.member.metrics();
    assert!(
        m.hosts.refreshes(HostRefresh::LocalNewer) >= 1,
        "{how:?}: the member followed, but not from its own copy"
    );
    assert!(m.hosts.moves.get() >= 1);
    rig.entry.shutdown().await;
    rig.member.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_move_is_followed_at_the_members_hint() -> anyhow::Result<()> {
    a_move_is_followed_at_the_members_hint(Move::Route).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_handed_over_is_followed_at_the_members_hint() -> anyhow::Result<()> {
    a_move_is_followed_at_the_members_hint(Move::HandOver).await
}

/// Header lines (`name: value`) the echo app saw, from its answer to `x-sim-echo-headers`:
/// after the first line, up to the empty line.
fn echoed(body: &Bytes) -> Vec<String> {
    String::from_utf8_lossy(body)
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(str::to_ascii_lowercase)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hints_from_clients_and_apps_are_neither_honoured_nor_passed_on() -> anyhow::Result<()> {
    let rig = Rig::start().await?;
    let blue = rig.revision("blue", &[HOST]).await?;
    let green = rig.revision("green", &[]).await?;
    rig.subset(&blue, &[], true).await?;
    rig.subset(&green, &[], false).await?;
    warm(&rig.member, "blue").await?;
    warm(&rig.member, "green").await?;

    // A client forging the hints and the picked revision, through the entry (forwarded) and
    // through the member (its fast lane hands such a request to hyper's path).
    let forged = [
        ("host", HOST),
        ("x-activator-host-stale", "1"),
        ("x-activator-subset-version", "1"),
        ("x-activator-hop-revision", "shop/green"),
        ("x-sim-echo-headers", "1"),
    ];
    for a in [&rig.entry, &rig.member] {
        let answer = Client::new(a.data_addr()).get(&forged).await?;
        assert_eq!(answer.status, 200);
        // The Host decided, not the forged revision.
        assert!(answer.served_by("blue"), "{}", answer.pod);
        let seen = echoed(&answer.body);
        assert!(seen.iter().any(|l| l.starts_with("host:")), "{seen:?}");
        assert!(
            !seen.iter().any(|l| l.starts_with("x-activator-")),
            "the app saw {seen:?}"
        );
        // Subset version 1 is older than any copy: honoured, the member would have said so.
        assert!(!answer.headers.contains_key("x-activator-host-stale"));
    }
    assert_eq!(rig.member.metrics().hosts.stale_answers.get(), 0);

    // Blue's app now answers with a hint of its own.
    let pod = pod_name("blue", &rig.member_node, 0);
    let sim = rig.fleet.node(&rig.member_node).context("no member node")?;
    let addr = sim
        .take_over_app(NS, &pod)
        .await
        .context("blue's app is not running")?;
    let app = tokio::spawn(hinting_app(tokio::net::TcpListener::bind(addr).await?));
    for a in [&rig.entry, &rig.member] {
        let mut c = Client::new(a.data_addr());
        for _ in 0..3 {
            let answer = c.host().await?;
            assert_eq!(answer.status, 200);
            assert_eq!(answer.body, "hinting app", "served by the app taken over");
            assert!(
                !answer.headers.contains_key("x-activator-host-stale"),
                "{:?}",
                answer.headers
            );
        }
    }
    for a in [&rig.entry, &rig.member] {
        let hosts = &a.metrics().hosts;
        assert_eq!(hosts.refreshes(HostRefresh::StaleHint), 0);
        assert_eq!(hosts.refreshes(HostRefresh::LocalNewer), 0);
        assert_eq!(hosts.stale_answers.get(), 0);
    }
    app.abort();
    rig.entry.shutdown().await;
    rig.member.shutdown().await;
    Ok(())
}

/// An app that answers every request with `x-activator-host-stale: 1`, keeping connections
/// alive (its requests have no body: a head ends at the empty line).
async fn hinting_app(listener: tokio::net::TcpListener) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    buf.drain(..end + 4);
                    let answer = "HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\
                                  x-activator-host-stale: 1\r\nx-pod-name: blue-taken-over\r\n\r\n\
                                  hinting app";
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        });
    }
}
