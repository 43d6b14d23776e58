//! Stopping the subsetter never waits on the API server: a real server may take long to
//! answer a list, and a quiet watch sends nothing for minutes. kubesim's latency model holds
//! the answers back here; each test fails by hanging (caught by `HANG`), not by a timing.

mod support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use kubesim::delay::Delay;
use subsetter::{Config, Random};
use support::*;

/// Far longer than any bounded stop takes: reaching it means the stop hung.
const HANG: Duration = Duration::from_secs(60);
/// A latency no test outlives: the answer never comes.
const NEVER: Duration = Duration::from_secs(3600);

/// The hang seen against a real kube-apiserver: stopped before its first Revision list had
/// been answered, the controller's graceful shutdown waited for that list for ever (it had
/// stopped reading the watch that would deliver it).
#[tokio::test]
async fn stop_before_the_first_list_is_answered_returns() -> Result<()> {
    let c = Cluster::start().await?;
    c.add_activator("node-1", "127.0.1.1").await?;
    c.server.set_read_latency(Delay::Fixed(NEVER));
    let running = c.run_subsetter(Arc::new(Random::seeded(1)));
    tokio::time::timeout(HANG, running.stop())
        .await
        .context("the subsetter's stop hung")??;
    Ok(())
}

/// A reconcile stuck on a write the server never answers is dropped after the grace.
#[tokio::test]
async fn stop_with_a_reconcile_stuck_on_a_write_returns_after_the_grace() -> Result<()> {
    let c = Cluster::start().await?;
    c.add_activator("node-1", "127.0.1.1").await?;
    c.create_revision("stuck", spec(0, 0, Some(1))).await?;
    c.server.set_write_latency(Delay::Fixed(NEVER));
    let config = Config {
        shutdown_grace: Duration::from_millis(200),
        ..Config::default()
    };
    let running = c.run_subsetter_with(Arc::new(Random::seeded(1)), config);
    // In flight: the reconcile has begun, and its writes cannot complete.
    c.wait_metrics(&running, |m| counter(m, "subsetter_reconciles_total") >= 1)
        .await?;
    tokio::time::timeout(HANG, running.stop())
        .await
        .context("the subsetter's stop hung")??;
    Ok(())
}
