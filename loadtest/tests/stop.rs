//! Stopping a whole cluster never waits on something the API server may not send. These run
//! on an embedded kubesim the test controls (as a shared server, so clean-up runs too), whose
//! latency model holds answers back; each fails by hanging (caught by `HANG`).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use kubesim::api::{ApiServer, ApiServerConfig};
use kubesim::delay::Delay;
use loadtest::{ClusterOptions, SimCluster};

/// Far longer than any bounded stop takes: reaching it means the stop hung.
const HANG: Duration = Duration::from_secs(120);
/// A latency no test outlives: the answer never comes.
const NEVER: Duration = Duration::from_secs(3600);

fn options(api: &ApiServer) -> ClusterOptions {
    ClusterOptions {
        nodes: 2,
        start_delay: Delay::ZERO,
        default_activators: 2,
        use_kubeconfig: false,
        shared_client: Some(api.client()),
        revision_namespace: Some("apps".into()),
        ..ClusterOptions::default()
    }
}

/// The hang a real kube-apiserver showed in `unknown_revision_is_404_by_host_and_by_headers`:
/// a cluster shut down before the subsetter's first Revision list was answered never stopped.
/// Here the Revision list is never answered at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_the_first_revision_list_is_pending_returns() -> anyhow::Result<()> {
    let api = ApiServer::start(ApiServerConfig::default()).await?;
    api.set_resource_read_latency("revisions", Delay::Fixed(NEVER));
    let c = SimCluster::start(options(&api)).await?;
    tokio::time::timeout(HANG, c.shutdown())
        .await
        .map_err(|_| anyhow::anyhow!("the cluster's shutdown hung"))?;
    api.shutdown().await;
    Ok(())
}

/// A namespace the cluster created that cannot finish terminating (an object with a
/// finalizer nobody removes) is left to the namespace controller after `cleanup_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_up_is_bounded_when_a_namespace_cannot_terminate() -> anyhow::Result<()> {
    let api = ApiServer::start(ApiServerConfig::default()).await?;
    let c = SimCluster::start(ClusterOptions {
        cleanup_timeout: Duration::from_millis(500),
        ..options(&api)
    })
    .await?;
    let ns = c.activator_namespace().to_string();
    let held: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "held", "finalizers": ["test.local-activator.dev/hold"]},
        "spec": {"holderIdentity": "nobody"},
    }))?;
    Api::<Lease>::namespaced(api.client(), &ns)
        .create(&PostParams::default(), &held)
        .await?;
    tokio::time::timeout(HANG, c.shutdown())
        .await
        .map_err(|_| anyhow::anyhow!("the cluster's clean-up hung"))?;
    let left = Api::<Namespace>::all(api.client()).get(&ns).await?;
    assert_eq!(
        left.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating"),
        "the namespace was deleted and is waiting for its finalizer"
    );
    api.shutdown().await;
    Ok(())
}
