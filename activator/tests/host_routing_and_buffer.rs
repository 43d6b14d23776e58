//! Two switches of the request path against kubesim, with real HTTP:
//! - `--host-routing=false`: a request that names its revision only by Host is answered 404
//!   saying Host routing is off, and no Host lookup (a LIST of ActivationEndpoints) reaches the
//!   API server; the same request to an activator with Host routing on makes one, so the
//!   count can tell;
//! - a full buffer (`--queue-limit`, `--queue-limit-total`): 503 + Retry-After, counted in
//!   `activator_buffer_full_total` and nothing else refused counts there.

#[path = "support/kubesim_cluster.rs"]
mod kubesim_cluster;

use std::net::SocketAddr;
use std::time::Duration;

use activator::{Activator, ActivatorConfig};
use anyhow::Context as _;
use crds::{ActivationEndpoints, ActivationEndpointsStatus, ActivatorMember, Revision};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kubesim::api::{ApiServer, ApiServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Far longer than anything here takes: reaching it means the test hung.
const HANG: Duration = Duration::from_secs(60);
const NS: &str = "apps";

fn config(node: &str) -> ActivatorConfig {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut cfg = ActivatorConfig::new(node, any, any);
    cfg.drain_timeout = Duration::from_millis(300);
    cfg
}

/// kubesim with the project's CRDs and the apps namespace.
async fn cluster() -> anyhow::Result<ApiServer> {
    kubesim_cluster::cluster(ApiServerConfig::default(), NS).await
}

/// Starts an activator and waits until its caches have synced (their first lists are done,
/// so what the API server counts afterwards is what requests caused).
async fn start(api: &ApiServer, cfg: ActivatorConfig) -> anyhow::Result<Activator> {
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

/// A revision (its pods can be created but no kubelet runs them here: a request for it waits
/// in the buffer) and its ActivationEndpoints naming `a` as the only member.
async fn revision_served_by(api: &ApiServer, name: &str, a: &Activator) -> anyhow::Result<()> {
    let client = api.client();
    let spec = serde_json::from_value(serde_json::json!({
        "hosts": [format!("{name}.example.test")],
        "template": {"spec": {"containers": [{"name": "app", "image": "kubesim/echo:latest"}]}},
    }))?;
    let mut rev = Revision::new(name, spec);
    rev.metadata.namespace = Some(NS.into());
    let rev = Api::<Revision>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &rev)
        .await?;
    let node = "node-buffer";
    let mut aep = ActivationEndpoints::new(name, Default::default());
    aep.metadata.namespace = Some(NS.into());
    aep.metadata.labels = Some([(crds::contract::member_label(node), String::new())].into());
    aep.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "local-activator.dev/v1alpha1".into(),
            kind: "Revision".into(),
            name: name.into(),
            uid: rev.metadata.uid.clone().context("a Revision without uid")?,
            controller: Some(true),
            ..Default::default()
        },
    ]);
    let aeps: Api<ActivationEndpoints> = Api::namespaced(client, NS);
    aeps.create(&PostParams::default(), &aep).await?;
    let status = ActivationEndpointsStatus {
        activators: vec![ActivatorMember {
            node: node.into(),
            address: a.data_addr().to_string(),
            pod: a.pod_name().into(),
            max_pods: 1,
            min_pods: 0,
        }],
        ..Default::default()
    };
    aeps.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await?;
    Ok(())
}

/// Sends one HTTP/1.1 request with `headers` and returns the whole response as text.
async fn send(to: SocketAddr, headers: &str) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(to).await?;
    s.write_all(format!("GET / HTTP/1.1\r\n{headers}connection: close\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(HANG, s.read_to_end(&mut buf))
        .await
        .context("no answer")??;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn by_name(name: &str) -> String {
    format!("host: x\r\nx-revision-namespace: {NS}\r\nx-revision-name: {name}\r\n")
}

/// The value of the unlabelled series `name` on the admin port's `/metrics`.
async fn metric(a: &Activator, name: &str) -> anyhow::Result<f64> {
    let mut s = tokio::net::TcpStream::connect(a.admin_addr()).await?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await?;
    let mut text = String::new();
    tokio::time::timeout(HANG, s.read_to_string(&mut text))
        .await
        .context("no answer from /metrics")??;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .with_context(|| format!("{name} is not exported:\n{text}"))?
        .trim()
        .parse()
        .context("not a number")
}

#[tokio::test]
async fn with_host_routing_off_a_host_only_request_is_404_and_no_host_is_looked_up()
-> anyhow::Result<()> {
    let api = cluster().await?;
    let host_only = "host: app.example.test\r\n";
    let lists = || api.stats().count("list", "activationendpoints");

    let mut cfg = config("node-off");
    cfg.host_routing = false;
    let off = start(&api, cfg).await?;
    let before = lists();
    let resp = send(off.data_addr(), host_only).await?;
    assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
    assert!(resp.contains("Host routing is off"), "{resp}");
    assert_eq!(lists(), before, "a Host lookup reached the API server");
    // Headers still route: an unknown revision named by them is a 404 of its own.
    let resp = send(off.data_addr(), &by_name("nope")).await?;
    assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
    assert!(!resp.contains("Host routing is off"), "{resp}");

    // The same request with Host routing on asks the API server (so the count above can
    // see a lookup when there is one).
    let on = start(&api, config("node-on")).await?;
    let before = lists();
    let resp = send(on.data_addr(), host_only).await?;
    assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
    assert!(!resp.contains("Host routing is off"), "{resp}");
    assert_eq!(lists(), before + 1, "no Host lookup with Host routing on");
    off.shutdown().await;
    on.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_full_buffer_is_refused_with_retry_after_and_counted() -> anyhow::Result<()> {
    let api = cluster().await?;
    let mut cfg = config("node-buffer");
    cfg.pool.queue_limit = 1;
    cfg.pool.queue_limit_total = 2;
    let a = start(&api, cfg).await?;
    for name in ["one", "two", "three"] {
        revision_served_by(&api, name, &a).await?;
    }
    // Something refused that is not a full buffer does not count.
    let resp = send(a.data_addr(), &by_name("nope")).await?;
    assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");

    // Requests that wait: no kubelet ever starts their pods.
    let data = a.data_addr();
    let wait = |name: &'static str| tokio::spawn(async move { send(data, &by_name(name)).await });
    let queued = |n: i64| {
        let a = &a;
        async move {
            tokio::time::timeout(HANG, async {
                while a.metrics().queued.get() != n {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .with_context(|| format!("never {n} requests waiting"))
        }
    };
    let first = wait("one");
    queued(1).await?;
    // Revision one's buffer (--queue-limit 1) is full.
    let resp = send(data, &by_name("one")).await?;
    assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
    assert!(
        resp.to_ascii_lowercase().contains("retry-after: 1"),
        "{resp}"
    );
    assert!(resp.contains("requests waiting"), "{resp}");
    assert_eq!(a.metrics().buffer_full.get(), 1);

    let second = wait("two");
    queued(2).await?;
    // The node's buffer (--queue-limit-total 2) is full, revision three's own is empty.
    let resp = send(data, &by_name("three")).await?;
    assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
    assert!(
        resp.contains("this activator has 2 requests waiting"),
        "{resp}"
    );
    assert_eq!(a.metrics().buffer_full.get(), 2);
    assert_eq!(metric(&a, "activator_buffer_full_total").await?, 2.0);

    assert!(!first.is_finished() && !second.is_finished());
    first.abort();
    second.abort();
    a.shutdown().await;
    Ok(())
}
