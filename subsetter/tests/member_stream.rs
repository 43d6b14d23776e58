//! Memberships streamed (`crds::member_stream`): an activator's watches follow its node's
//! subsets from two directory replicas with no ActivationEndpoints list or watch of its own,
//! resume on the other replica when one goes, and only with none left fall back to the API
//! server. Against kubesim, with the subsetter's caches and directory as they run.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use activator::WatchOnly;
use activator::cache::directory::DirectorySource;
use activator::config::ActivatorConfig;
use anyhow::{Context as _, Result};
use crds::{ActivationEndpoints, ActivationEndpointsStatus, ActivatorMember};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use subsetter::member_stream::StreamAccess;
use subsetter::{Caches, Config, Random, Subsetter};
use support::{Cluster, WAIT};

const NODE: &str = "n1";
const SECRET: &str = "s3cret";

/// One replica: the caches and the directory port, as `subsetter` runs them (no lead).
struct Replica {
    caches: Arc<Caches>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Replica {
    async fn start(c: &Cluster) -> Result<Self> {
        let s = Subsetter::new(
            c.client.clone(),
            Config::default(),
            Arc::new(Random::seeded(1)),
        );
        let caches = Arc::new(s.start_caches());
        tokio::time::timeout(WAIT, caches.wait_synced()).await?;
        let access = StreamAccess {
            secret: Some(Arc::from(SECRET.as_bytes())),
            bookmark: Duration::from_millis(200),
            ..StreamAccess::default()
        };
        let (addr, task) = subsetter::directory::serve_streams(
            "127.0.0.1:0".parse()?,
            Arc::clone(&caches),
            access,
        )
        .await?;
        Ok(Self { caches, addr, task })
    }

    /// Gone: its port closed and its streams ended.
    fn kill(&self) {
        self.task.abort();
        self.caches.hub.close_all();
    }
}

async fn subset(api: &Api<ActivationEndpoints>, name: &str, nodes: &[&str]) -> Result<()> {
    let mut ae = ActivationEndpoints::new(name, Default::default());
    ae.metadata.labels = Some(
        nodes
            .iter()
            .map(|n| (crds::contract::member_label(n), String::new()))
            .collect(),
    );
    let created = api.create(&PostParams::default(), &ae).await?;
    let status = ActivationEndpointsStatus {
        activators: nodes
            .iter()
            .map(|n| ActivatorMember {
                node: (*n).into(),
                address: "127.0.0.1:8080".into(),
                pod: format!("activator-{n}"),
                max_pods: 1,
                min_pods: 0,
            })
            .collect(),
        ..Default::default()
    };
    api.patch_status(
        &created.name_any(),
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await?;
    Ok(())
}

/// Waits until the activator holds `want` subsets (it converges on each change).
async fn holds(w: &WatchOnly, want: usize) -> Result<()> {
    tokio::time::timeout(WAIT, async {
        while w.counts().0 != want {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .with_context(|| format!("held {} subsets, not {want}", w.counts().0))
}

fn activator(replicas: Vec<SocketAddr>) -> Result<ActivatorConfig> {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut cfg = ActivatorConfig::new(NODE, any, any);
    cfg.directory = DirectorySource::Static(replicas);
    cfg.hop = activator::pipeline::hop::HopAuth::new(SECRET)?;
    cfg.member_stream.idle = Duration::from_secs(2);
    cfg.member_stream.retry_cap = Duration::from_millis(200);
    cfg.member_stream.fallback_after = Duration::from_secs(1);
    cfg.member_stream.fallback_spread = Duration::ZERO;
    cfg.member_stream.start_fallback_spread = Duration::ZERO;
    Ok(cfg)
}

#[tokio::test]
async fn memberships_stream_from_replicas_and_resume_on_another() -> Result<()> {
    let c = Cluster::start().await?;
    let aes = c.endpoints();
    let (r1, r2) = (Replica::start(&c).await?, Replica::start(&c).await?);
    subset(&aes, "a", &[NODE, "n2"]).await?;
    subset(&aes, "b", &["n2"]).await?;
    subset(&aes, "c", &[NODE]).await?;
    let count = |verb| c.server.stats().count(verb, "activationendpoints");
    let (lists, watches) = (count("list"), count("watch"));

    let w = WatchOnly::start(&activator(vec![r1.addr, r2.addr])?, c.client.clone());
    tokio::time::timeout(WAIT, w.synced()).await?;
    holds(&w, 2).await?;
    subset(&aes, "d", &[NODE]).await?;
    holds(&w, 3).await?;
    // Leaving: the member label goes.
    let label = crds::contract::member_label(NODE).replace('/', "~1");
    aes.patch(
        "a",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(serde_json::json!([
            {"op": "remove", "path": format!("/metadata/labels/{label}")}
        ]))?),
    )
    .await?;
    holds(&w, 2).await?;
    aes.delete("c", &DeleteParams::default()).await?;
    holds(&w, 1).await?;

    // One replica goes: the stream resumes on the other.
    r1.kill();
    subset(&aes, "e", &[NODE]).await?;
    holds(&w, 2).await?;
    r2.kill();
    // Neither answers: what is held keeps serving.
    assert_eq!(w.counts().0, 2);
    assert_eq!(
        (count("list"), count("watch")),
        (lists, watches),
        "the activator neither listed nor watched ActivationEndpoints while a replica answered"
    );

    // Past the bound with no replica: the API server's watch takes over.
    subset(&aes, "f", &[NODE]).await?;
    holds(&w, 3).await?;
    assert!(count("list") > lists, "the fallback listed");
    Ok(())
}

/// A fresh install has no subsets, so no object gives the replica a version: the empty state
/// is still a first state, and the activator starts from it with no list.
#[tokio::test]
async fn an_empty_cluster_is_a_first_state_too() -> Result<()> {
    let c = Cluster::start().await?;
    let aes = c.endpoints();
    let r = Replica::start(&c).await?;
    let lists = c.server.stats().count("list", "activationendpoints");
    let w = WatchOnly::start(&activator(vec![r.addr])?, c.client.clone());
    tokio::time::timeout(WAIT, w.synced()).await?;
    assert_eq!(w.counts().0, 0);
    subset(&aes, "a", &[NODE]).await?;
    holds(&w, 1).await?;
    assert_eq!(
        c.server.stats().count("list", "activationendpoints"),
        lists,
        "started from the stream, not a list"
    );
    Ok(())
}
