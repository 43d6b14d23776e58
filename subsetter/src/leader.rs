//! Leader election on a coordination.k8s.io Lease (kube-lease-manager): two replicas can
//! run, and only the holder of the Lease reconciles. A replica that loses the Lease stops its
//! controller (finishing in-flight reconciles) and waits to win it again.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::error::Result;

/// Where and how long the Lease is held.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// Unique per replica (the pod name).
    pub identity: String,
    /// Seconds a holder may go without renewing before another replica takes over.
    pub duration_seconds: u64,
    /// Seconds before expiry at which the holder renews.
    pub grace_seconds: u64,
    /// How long a stop waits for the Lease to be released. Past it the replica exits
    /// anyway: the Lease then expires after `duration_seconds`, as if the process had died.
    pub release_timeout: Duration,
}

/// A default for [`LeaseConfig::release_timeout`]: a release is one API write.
pub const DEFAULT_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `work` whenever this replica holds the Lease, until `shutdown` resolves. `work` gets
/// a future that resolves when it must stop (leadership lost or shutdown).
pub async fn run_as_leader<W, F>(
    client: Client,
    config: LeaseConfig,
    shutdown: impl Future<Output = ()>,
    mut work: W,
) -> Result<()>
where
    W: FnMut(Box<dyn Future<Output = ()> + Send + Sync + Unpin + 'static>) -> F,
    F: Future<Output = Result<()>>,
{
    let mut shutdown = pin!(shutdown);
    // Building the manager reads (and may create) the Lease: a stop must not wait for that.
    let build = LeaseManagerBuilder::new(client, &config.name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(config.duration_seconds)
        .with_grace(config.grace_seconds)
        .build();
    let manager = tokio::select! {
        m = build => m?,
        _ = &mut shutdown => return Ok(()),
    };
    let (mut leader, mut task) = manager.watch().await;
    let outcome = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            r = leader.wait_for(|l| *l) => if r.is_err() { break Ok(()) },
        }
        info!(identity = %config.identity, "became leader");
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let stop = Box::new(Box::pin(async move {
            let _ = stop_rx.await;
        }));
        let mut running = pin!(work(stop));
        let lost = tokio::select! {
            r = &mut running => break r,
            _ = &mut shutdown => false,
            _ = leader.wait_for(|l| !*l) => true,
        };
        let _ = stop_tx.send(());
        let r = running.await;
        if !lost {
            break r;
        }
        info!(identity = %config.identity, "lost leadership");
        r?;
    };
    // Dropping the receiver makes the manager release the Lease so a standby takes over at
    // once instead of after the lease duration.
    drop(leader);
    if tokio::time::timeout(config.release_timeout, &mut task)
        .await
        .is_err()
    {
        task.abort();
        warn!(timeout = ?config.release_timeout, "the Lease was not released in time; it will expire");
    }
    outcome
}
