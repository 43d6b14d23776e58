//! Leader election on a coordination.k8s.io Lease (kube-lease-manager): two replicas can
//! run, and only the holder of the Lease reconciles. A replica that loses the Lease stops its
//! controller (finishing in-flight reconciles) and waits to win it again.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use crds::backoff::{WatchBackoff, resilient};
use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::cluster::error::Result;

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
    let (mut leader, mut task) = tokio::select! {
        m = start_manager(&client, &config) => m?,
        _ = &mut shutdown => return Ok(()),
    };
    // kube-lease-manager's standby sleeps until the holder's Lease would expire, even when
    // the holder released it on a clean shutdown. This watch of the one Lease wakes the
    // standby when it is released, so the hand-over takes one API write, not the duration.
    let mut released = pin!(released(&client, &config));
    let outcome = loop {
        let woke = tokio::select! {
            _ = &mut shutdown => break Ok(()),
            r = leader.wait_for(|l| *l) => if r.is_err() { break Ok(()) } else { Woke::Leader },
            Some(()) = released.next() => Woke::Released,
        };
        if matches!(woke, Woke::Released) {
            if !*leader.borrow() {
                // The manager is asleep and holds nothing: a new one reads the Lease at
                // once and takes it (an aborted write, at worst, is redone by the new one
                // under the same identity).
                task.abort();
                let _ = (&mut task).await;
                (leader, task) = tokio::select! {
                    m = start_manager(&client, &config) => m?,
                    _ = &mut shutdown => return Ok(()),
                };
                info!(identity = %config.identity, "the Lease was released; trying to take it");
            }
            continue;
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

enum Woke {
    Leader,
    Released,
}

type Manager = (
    watch::Receiver<bool>,
    JoinHandle<kube_lease_manager::Result<LeaseManager>>,
);

async fn start_manager(client: &Client, config: &LeaseConfig) -> Result<Manager> {
    let manager = LeaseManagerBuilder::new(client.clone(), &config.name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(config.duration_seconds)
        .with_grace(config.grace_seconds)
        .build()
        .await?;
    let (tx, rx) = watch::channel(false);
    Ok((rx, tokio::spawn(hold(manager, tx))))
}

/// kube-lease-manager's `LeaseManager::watch` loop, with the watches' bounded back-off
/// (crds::backoff) after an API error instead of its own, which grows to 30 s: a leader
/// whose renewals failed through an API server outage renews within a second or so of its
/// return, not up to 30 s later (by when a standby may have taken the expired Lease). Sends
/// each change of leadership on `tx`; releases the Lease and returns once every receiver
/// is gone.
async fn hold(
    manager: LeaseManager,
    tx: watch::Sender<bool>,
) -> kube_lease_manager::Result<LeaseManager> {
    let mut backoff = WatchBackoff::default();
    let mut failing = false;
    loop {
        let changed = tokio::select! {
            biased;
            () = tx.closed() => break,
            r = manager.changed() => r,
        };
        match changed {
            Ok(leading) => {
                backoff.reset_wait();
                failing = false;
                if tx.send(leading).is_err() {
                    break;
                }
            }
            Err(e) => {
                // Once per outage at warn: it retries every second or so meanwhile.
                if failing {
                    debug!(error = %e, "the Lease: retrying");
                } else {
                    warn!(error = %e, "the Lease: the API server did not take a renewal or read; retrying");
                    failing = true;
                }
                tokio::select! {
                    biased;
                    () = tx.closed() => break,
                    () = tokio::time::sleep(backoff.next_wait()) => {}
                }
            }
        }
    }
    manager.release().await?;
    Ok(manager)
}

/// Yields each time the Lease is seen with no holder (released by a holder that stopped).
fn released(client: &Client, config: &LeaseConfig) -> impl Stream<Item = ()> + use<> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", config.name));
    resilient(watcher(api, cfg))
        .applied_objects()
        .filter_map(|l| async move {
            let l = l.ok()?;
            let holder = l.spec.as_ref().and_then(|s| s.holder_identity.as_deref());
            holder.is_none_or(str::is_empty).then_some(())
        })
}
