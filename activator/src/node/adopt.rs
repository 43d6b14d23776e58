//! Adoption of the app pods a previous activator process left on this node. Pools (and so
//! scalers) are made by requests; after a restart (a DaemonSet upgrade, a crash) the pods
//! already running here would have no scaler until their next request — and a mostly idle
//! app's next request may never come, so its pod would run for ever. Once the pod watch has
//! listed this node's pods, every revision with a live pod gets its pool at once; its scaler
//! then idles the pods out, or keeps them for minScale, exactly as if this process had made
//! them.

use std::sync::Arc;

use crds::ActivatorMember;

use crate::cache::endpoints::{EndpointsCache, Membership};
use crate::cache::pods::PodCache;
use crate::cache::revisions::RevisionCache;
use crate::node::pool::Spec;
use crate::node::pools::Pools;

/// Marks `admin` ready once the node's subsets and pods are listed, then adopts the pods a
/// previous process left here; both end when `stop` is cancelled.
pub(crate) async fn ready_then_adopt(
    admin: std::sync::Arc<crate::ops::admin::Admin>,
    node: String,
    pods: PodCache,
    endpoints: EndpointsCache,
    revisions: RevisionCache,
    pools: Pools,
    stop: tokio_util::sync::CancellationToken,
) {
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = async { tokio::join!(endpoints.synced(), pods.synced()) } => {
            admin.ready.store(true, std::sync::atomic::Ordering::Release);
            tracing::info!("caches synced; ready");
            // Pods a previous process left get their scalers (idle-out, minScale).
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = adopt_pods(&node, &pods, &endpoints, &revisions, &pools) => {}
            }
        }
    }
}

/// Gives each revision with a live pod on this node a pool. Called once the pod and subset
/// caches have synced; returns how many revisions were adopted.
pub async fn adopt_pods(
    node: &str,
    pods: &PodCache,
    endpoints: &EndpointsCache,
    revisions: &RevisionCache,
    pools: &Pools,
) -> usize {
    let mut adopted = 0;
    for key in pods.revisions_with_live_pods() {
        let rev = match revisions.get_or_fetch(&key).await {
            Ok(Some(rev)) => rev,
            // Deleted: its pods go with it (owner references).
            Ok(None) => continue,
            Err(e) => {
                // The pool is made on the next request instead; the pod waits until then.
                tracing::warn!(revision = %key, error = %e, "reading a revision to adopt its pods");
                continue;
            }
        };
        // A node that left the subset while the activator was down still owns its pods
        // here: with no share of minScale they idle out like any other.
        let me = match endpoints.member_entry(&key) {
            Some(Membership::Member { me, .. }) => me,
            _ => Arc::new(ActivatorMember {
                node: node.to_string(),
                ..Default::default()
            }),
        };
        let spec = Spec {
            rev: rev.clone(),
            me: me.clone(),
        };
        pools.get(&key, &rev, &me).set_spec(&spec);
        pools.shared().metrics.adopted_revisions.inc();
        tracing::info!(revision = %key, "adopted the pods a previous activator left on this node");
        adopted += 1;
    }
    adopted
}
