//! An activator's stop never waits on the API server: its caches' first lists may never be
//! answered (a slow or unreachable server) and a quiet watch sends nothing for minutes. kubesim's
//! latency model holds answers back; each test fails by hanging (caught by `HANG`).

// Only its CRDs here (each test starts its own API server).
#[allow(dead_code)]
#[path = "support/kubesim_cluster.rs"]
mod kubesim_cluster;

use std::net::SocketAddr;
use std::time::Duration;

use activator::{Activator, ActivatorConfig};
use anyhow::Context as _;
use kubesim::api::{ApiServer, ApiServerConfig};
use kubesim::delay::Delay;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Far longer than any bounded stop takes: reaching it means the stop hung.
const HANG: Duration = Duration::from_secs(60);
/// A latency no test outlives: the answer never comes.
const NEVER: Duration = Duration::from_secs(3600);

fn config() -> ActivatorConfig {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut cfg = ActivatorConfig::new("node-stop", any, any);
    cfg.drain_timeout = Duration::from_millis(300);
    cfg
}

/// The project's CRDs, so requests for revisions reach the API server.
async fn apply_crds(client: &kube::Client) -> anyhow::Result<()> {
    kubesim_cluster::apply_crds(client).await
}

#[tokio::test]
async fn shutdown_returns_when_no_list_was_ever_answered() -> anyhow::Result<()> {
    let api = ApiServer::start(ApiServerConfig {
        read_latency: Delay::Fixed(NEVER),
        ..ApiServerConfig::default()
    })
    .await?;
    let a = Activator::start(config(), api.client()).await?;
    assert!(!a.is_ready(), "ready without any list answered");
    tokio::time::timeout(HANG, a.shutdown())
        .await
        .context("the activator's shutdown hung")?;
    Ok(())
}

/// A request in flight whose revision read is never answered: the drain ends at
/// `drain_timeout`, not when the read would.
#[tokio::test]
async fn drain_is_bounded_with_a_request_stuck_on_the_api() -> anyhow::Result<()> {
    let api = ApiServer::start(ApiServerConfig::default()).await?;
    apply_crds(&api.client()).await?;
    api.set_read_latency(Delay::Fixed(NEVER));
    let a = Activator::start(config(), api.client()).await?;
    let data = a.data_addr();
    let request = tokio::spawn(async move {
        let mut s = tokio::net::TcpStream::connect(data).await?;
        s.write_all(
            b"GET / HTTP/1.1\r\nhost: x\r\nx-revision-namespace: apps\r\nx-revision-name: slow\r\n\r\n",
        )
        .await?;
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf).await;
        anyhow::Ok(buf)
    });
    // Wait until the request is waiting on the API server (its revision read arrived there).
    tokio::time::timeout(HANG, async {
        while api.stats().count("get", "revisions") == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .context("the request never read its revision")?;
    tokio::time::timeout(HANG, a.shutdown())
        .await
        .context("the activator's drain hung")?;
    request.abort();
    Ok(())
}
