//! The leader's rebalancing: every interval, a few members moved from the most to the least
//! loaded activators (`rebalance.rs` decides which).

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::runtime::reflector::ObjectRef;
use tracing::info;

use crate::cluster::context::Context;
use crate::cluster::triggers::Triggers;
use crate::pure::rebalance;
use keep_serving::Locked;

/// Every `every`, moves at most `limits.max_moves` members from the most to the least loaded
/// activators while the load is uneven (`rebalance.rs`): each move is a reconcile of one
/// revision with that member left out, so the policy picks the replacement and the write
/// goes through the write limit like any other.
pub(crate) async fn rebalance_loop(
    ctx: Arc<Context>,
    triggers: Triggers,
    every: std::time::Duration,
    limits: rebalance::Limits,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once; the caches are not even synced then.
    tick.tick().await;
    loop {
        tick.tick().await;
        if !*ctx.caches.synced.borrow() {
            continue;
        }
        // Not while an outage's aftermath lasts: each move is a cold start on the new
        // member, and the kubelets may not see a new pod for a minute after an outage.
        if ctx.caches.aftermath.ends().is_some() {
            info!("no rebalancing: a control-plane outage's aftermath lasts until its hold ends");
            continue;
        }
        let moves = {
            let ix = ctx.caches.index.locked();
            let loads: BTreeMap<String, usize> = ix
                .loads()
                .nodes()
                .iter()
                .map(|n| (n.to_string(), ix.load(n)))
                .collect();
            rebalance::moves(&loads, |n| ix.revisions_on(n), limits)
        };
        let mut evictions = ctx.evictions.locked();
        // Moves not made since the last interval (a revision deleted meanwhile) are dropped.
        evictions.clear();
        if moves.is_empty() {
            continue;
        }
        info!(moves = moves.len(), "rebalancing");
        for (key, node) in moves {
            // Recorded before the trigger: the reconcile it starts must find it.
            let target = ObjectRef::new(&key.name).within(&key.namespace);
            evictions.insert(key, node);
            triggers.send(target);
        }
    }
}
